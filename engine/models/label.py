"""This computer's model label, printed for a relay operator: ``NAME@SHA256`` of the weights a node starts from.

    python -m engine.models.label                      # the bundled model's label
    python -m engine.models.label --model ~/my-model   # the label of a model folder (or a hub id)
    sapling-relay --models "$(python -m engine.models.label)"   # a swarm of that one model

The label itself is engine/common/model_policy.py's `model_label` (stdlib only,
what a node's batches carry); this command finds the weights first, through
the model loader (engine/models/sources.py), which may download a hub model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.common.errors import SaplingError
from engine.common.model_policy import model_label
from engine.common.paths import Paths
from engine.common.rules import BUNDLED
from engine.models.sources import resolve_model_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED, help="'bundled' (default), a model folder or a hub id")
    args = ap.parse_args(argv)
    paths = Paths.default()
    try:
        # The bundled model is hashed as the GGUF it ships as: no need to convert it first.
        model_dir = Path(".") if args.model == BUNDLED else resolve_model_dir(args.model, paths.models_cache)
        print(model_label(args.model, model_dir, paths.cache_dir))
    except SaplingError as exc:
        print(f"model label: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
