"""The decoder's matmuls with plain weights against weights reordered for oneDNN, by row count.

    .venv/bin/python -m bench.matmul_layout                 # rows 1, 5, 27, 64, 135 and a 2048-token prompt pass
    .venv/bin/python -m bench.matmul_layout --rows 1,8,64

One decode step of the bundled model's shapes (each of the 30 layers' own
q/k/v, o, gate/up and down weights, then the LM head) at each row count,
in fp32, timed as `F.linear` on plain weights and as oneDNN's linear on
weights reordered once (`engine.backends.decode_model.pack_weight`, what `DecodeModel`
does on the CPU in fp32). Which side goes first alternates by row count. The last line is the geometric mean speed-up.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from bench.rollout_speed import gemm_seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,5,27,64,135,2048",
                        help="row counts, comma-separated (default 1,5,27,64,135,2048)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per side, median taken (default 3)")
    args = parser.parse_args(argv)
    try:
        rows = [int(x) for x in args.rows.split(",")]
    except ValueError:
        print(f"matmul_layout: --rows takes whole numbers separated by commas, got {args.rows!r}.", file=sys.stderr)
        return 2
    if not rows or min(rows) < 1:
        print("matmul_layout: every row count must be at least 1.", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoConfig

    from engine.backends.decode import can_pack
    from engine.common.paths import Paths
    from engine.models.sources import resolve_model_dir

    if not can_pack(torch.device("cpu"), torch.float32):
        print("matmul_layout: this torch has no oneDNN; nothing to compare.", file=sys.stderr)
        return 2
    config = AutoConfig.from_pretrained(str(resolve_model_dir("bundled", Paths.default().models_cache)))
    print(f"matmul_layout: bundled model's decode-step matmuls ({config.num_hidden_layers} layers + LM head), fp32, "
          f"{torch.get_num_threads()} threads; median of {args.repeats}")
    print(f"{'rows':>6} {'plain F.linear':>15} {'oneDNN reordered':>17} {'speed-up':>9}")
    ratios = []
    for k, n in enumerate(rows):
        times: dict[bool, float] = {}
        for reordered in ((False, True) if k % 2 == 0 else (True, False)):  # alternate which side goes first
            times[reordered] = gemm_seconds(config, n, torch.float32, args.repeats, packed=reordered)
        plain, packed = times[False], times[True]
        ratios.append(plain / packed)
        print(f"{n:6d} {plain * 1000:12.1f} ms {packed * 1000:14.1f} ms {plain / packed:8.2f}x")
    print(f"geometric mean speed-up oneDNN/plain = {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
