"""Export a run's model for other tools: a merged Hugging Face folder, a GGUF file, or a GGUF LoRA.

    sapling-node export --out ./my-model                          # merged HF folder of the newest checkpoint
    sapling-node export --format gguf --out my-model.gguf         # merged, f16, tokenizer and chat template inside
    sapling-node export --format gguf --quant q8_0 --out my-model-q8_0.gguf
    sapling-node export --format gguf --round 0 --out base.gguf   # the base model, before any training
    sapling-node export --format gguf-lora --out adapter.gguf     # the LoRA alone, for llama.cpp's --lora

Every export also writes a model card: README.md with the Hub's front matter and
the run's reward and held-out curves, inside the folder or beside the GGUF file
(engine/gguf/card.py). Try it's own exports, into Sapling's cache, write none.

GGUF files are written by llama.cpp's own converters, `convert_hf_to_gguf.py`
and `convert_lora_to_gguf.py` (engine/models/convert.py: where they are and
how they run). The base model of the bundled source is converted once, when
the bundled model is (engine/models/sources.py); `--round 0 --format gguf` copies it.

Tests: .venv/bin/python -m pytest tests/engine/test_export.py -q
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine import __version__
from engine.common.atomicio import atomic_dir, atomic_write_json
from engine.common.errors import CheckpointError, ConfigError
from engine.common.paths import EXPORT_MARKER, nearest_existing
from engine.gguf.card import Card, Exported, check_card_files, model_card, published_card, write_card
from engine.models.convert import CONVERT_LORA, atomic_file, converter_dir, hf_to_gguf, run_converter
from engine.node.checkpoint import Checkpoint, checkpoint_name, listed_checkpoints, verify
from engine.node.seeds import MAX_SEED, fixed_seed

if TYPE_CHECKING:
    from engine.common.config import NodeConfig
    from engine.common.paths import Paths

log = logging.getLogger(__name__)

FORMATS = ("hf", "gguf", "gguf-lora")
QUANTS = ("f16", "bf16", "q8_0", "f32")  # f32: the exact weights, twice f16's size
# f16 by default: bf16's size with 3 more mantissa bits. With llama.cpp's KV cache in f32 (as Try it runs
# it) its greedy answers equalled torch fp32's on 10 of 10 prompts, bf16's on 9 (docs/exporting.md).
DEFAULT_QUANT = "f16"
GGUF_MAGIC = b"GGUF"
ADAPTER_FILE = "adapter.safetensors"  # what both backends write into a LoRA checkpoint, in peft's names

Report = Callable[[str], None]


@dataclass(frozen=True)
class ExportResult:
    round: int
    path: Path
    format: str
    quant: str | None
    bytes: int
    card: Path | None = None  # the model card's README, where one was written


def find_checkpoint(config: NodeConfig, paths: Paths, round_index: int | None) -> Checkpoint:
    """The newest intact checkpoint of the run, or the one of `round_index`.

    Read-only: unlike `latest_good` this never moves a checkpoint aside, since a
    training process may be pruning old rounds while an export reads them.
    """
    root = paths.checkpoints(config.run.run_name)
    listed = listed_checkpoints(root)
    if round_index is not None:
        listed = [(r, p) for r, p in listed if r == round_index]
        if not listed:
            have = ", ".join(str(r) for r, _ in listed_checkpoints(root)[:8]) or "none"
            raise CheckpointError(
                f"Run {config.run.run_name!r} has no checkpoint for round {round_index} "
                f"(kept: {have}); pick one of those, or leave out --round for the newest."
            )
    problems = []
    for found_round, path in listed:
        try:
            state = verify(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        if state.get("structure_hash") != config.structure_hash():
            raise CheckpointError(
                f"The checkpoints of run {config.run.run_name!r} were made with a different model or "
                "fine-tuning setting than the current settings; export with those settings."
            )
        return Checkpoint(path, found_round, state)
    if problems:
        raise CheckpointError(f"No intact checkpoint to export: {problems[0]}")
    raise CheckpointError(
        f"Run {config.run.run_name!r} has no checkpoint yet under {root}: train first "
        "(sapling-node run), or pick the run with --run-name."
    )


def export_model(
    config: NodeConfig,
    paths: Paths,
    out: Path,
    fmt: str = "hf",
    quant: str = DEFAULT_QUANT,
    round_index: int | None = None,
    report: Report = lambda message: None,
) -> ExportResult:
    """Write the model of one checkpoint (round 0: the base model) in `fmt` to `out`, atomically."""
    if fmt not in FORMATS:
        raise ConfigError(f"Export format {fmt!r} is not one of {', '.join(FORMATS)}.")
    if quant not in QUANTS:
        raise ConfigError(f"Quantisation {quant!r} is not one of {', '.join(QUANTS)}.")
    if fmt == "hf" and quant != DEFAULT_QUANT:
        raise ConfigError("--quant applies to GGUF exports only; the Hugging Face folder is written in fp32.")
    if round_index is not None and round_index < 0:
        raise ConfigError("--round must be 0 (the base model) or a checkpoint's round number.")
    out = Path(out).expanduser()
    check_target(out, fmt)  # before minutes of loading, and before anything is written
    with_card = not out.resolve().is_relative_to(paths.cache_dir.resolve())  # Try it's own files need no card
    if with_card:
        check_card_files(out, fmt)
    if fmt != "hf":
        converter_dir()  # fail before minutes of loading when it is missing
    from engine.models.sources import resolve_model_dir

    # The checkpoint first: a run without one fails in a second, not after the model's first conversion.
    checkpoint = None if round_index == 0 else find_checkpoint(config, paths, round_index)
    model_dir = resolve_model_dir(config.model.source, paths.models_cache, config.model.revision or None)
    found_round = 0 if checkpoint is None else checkpoint.round
    if fmt == "gguf-lora" and checkpoint is None:
        raise ConfigError("Round 0 is the base model: it has no adapter. Export it with --format gguf.")
    if fmt == "gguf-lora" and config.grpo.finetune != "lora":
        raise ConfigError("This run trains every weight (grpo.finetune = \"full\"), so there is no adapter; "
                          "use --format gguf.")
    card = _card(config, paths, out, fmt, quant, checkpoint, model_dir) if with_card else None
    if fmt == "hf":
        with atomic_dir(out) as folder:
            _merged_hf(config, model_dir, checkpoint, folder, report)
            atomic_write_json(folder / EXPORT_MARKER, {
                "sapling": __version__, "run": config.run.run_name, "round": found_round, "base_model": model_dir.name,
            })
            if card is not None:
                write_card(card, folder)
            folder.chmod(0o755)  # a folder for other tools, not a private temporary one
    else:
        with published_card(card):  # staged first: a full disk stops the export before anything is replaced
            _write_gguf(config, model_dir, checkpoint, out, fmt, quant, report)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.is_dir() else out.stat().st_size
    return ExportResult(found_round, out, fmt, None if fmt == "hf" else quant, size,
                        None if card is None else card.files.readme)


def _write_gguf(config: NodeConfig, model_dir: Path, checkpoint: Checkpoint | None, out: Path, fmt: str, quant: str,
                report: Report) -> None:
    """The GGUF of a checkpoint's adapter, of the base model (round 0) or of the merged model, atomically."""
    from engine.models.sources import BASE_GGUF_QUANT, base_gguf

    found_round = 0 if checkpoint is None else checkpoint.round
    name = f"{model_dir.name} (Sapling run {config.run.run_name}, round {found_round})"
    if fmt == "gguf-lora" and checkpoint is not None:
        report(f"Converting the LoRA of round {found_round} to GGUF ({quant})…")
        _adapter_to_gguf(checkpoint.path, model_dir, config, out, quant)
    elif checkpoint is None:
        prepared = base_gguf(model_dir) if quant == BASE_GGUF_QUANT else None
        if prepared is not None:
            report("Copying the base model's GGUF, made when the model was converted…")
            if prepared.resolve() != out.resolve():
                with atomic_file(out) as tmp:
                    shutil.copyfile(prepared, tmp)
        else:
            report(f"Converting the base model to GGUF ({quant})…")
            hf_to_gguf(model_dir, out, quant, name)
    else:
        with tempfile.TemporaryDirectory(prefix="sapling-export-", dir=_scratch_dir(out)) as scratch:
            target = Path(scratch) / "merged"
            _merged_hf(config, model_dir, checkpoint, target, report)
            report(f"Converting to GGUF ({quant})…")
            hf_to_gguf(target, out, quant, name)


def _card(config: NodeConfig, paths: Paths, out: Path, fmt: str, quant: str, checkpoint: Checkpoint | None,
          model_dir: Path) -> Card:
    """The export's model card, from the run's metrics and the checkpoint's state (engine/gguf/card.py)."""
    state = {} if checkpoint is None else checkpoint.state
    recorded = state.get("seed")
    seed = (recorded if isinstance(recorded, int) and not isinstance(recorded, bool) and 0 <= recorded <= MAX_SEED
            else config.run.seed if config.run.seed >= 0 else None)
    metrics = state.get("metrics")
    exported = Exported(out, fmt, None if fmt == "hf" else quant, 0 if checkpoint is None else checkpoint.round,
                        model_dir, seed, metrics if isinstance(metrics, dict) else {})
    return model_card(config, paths.metrics_file, exported)


def check_target(out: Path, fmt: str) -> None:
    """Refuse an output that would replace something that is not an earlier export: a user's folder or file.

    An export replaces its target whole (atomically), so `--out ~/Documents` must not be taken as "inside
    ~/Documents". A Hugging Face export may replace an empty folder or one that an export wrote (it holds
    `EXPORT_MARKER`); a GGUF export may replace a GGUF file.
    """
    above = nearest_existing(out.parent)
    if not above.is_dir():
        raise ConfigError(f"{above} is a file, so {out} cannot be made there; give another place.")
    if fmt == "hf":
        if out.suffix.lower() == ".gguf":
            raise ConfigError(f"{out.name} is a GGUF file name, but the Hugging Face format writes a folder: "
                              "use --format gguf, or a folder name without .gguf.")
        if out.is_dir():
            if any(out.iterdir()) and not (out / EXPORT_MARKER).is_file():
                raise ConfigError(f"{out} already holds files that an export did not write; nothing was changed. "
                                  "Give a new folder name (the export creates it) or an empty folder.")
        elif out.exists():
            raise ConfigError(f"{out} is a file, and the Hugging Face format writes a folder: give a folder name "
                              "that does not exist yet.")
        return
    if out.is_dir():
        raise ConfigError(f"{out} is a folder, and a GGUF export is one file: give a file name, for example "
                          f"{out / 'sapling-model.gguf'}.")
    if out.exists():
        with open(out, "rb") as handle:
            if handle.read(4) != GGUF_MAGIC:
                raise ConfigError(f"{out} exists and is not a GGUF file; nothing was changed. Give another name, "
                                  "or delete it first.")


def format_for(out: Path) -> str:
    """The format `--out` implies when --format is not given: a .gguf name is a GGUF file."""
    return "gguf" if Path(out).suffix.lower() == ".gguf" else "hf"


def _scratch_dir(out: Path) -> Path:
    """Scratch space beside the output, so the final rename never crosses file systems."""
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def _merged_hf(config: NodeConfig, model_dir: Path, checkpoint: Checkpoint | None, target: Path,
               report: Report) -> None:
    """Load the model and the checkpoint with the training backend and write the merged HF folder."""
    from engine.backends import load_backend
    from engine.common.device import pick_device

    if config.run.threads:
        import torch

        torch.set_num_threads(config.run.threads)
    device = pick_device(config.run.device)
    where = f"round {checkpoint.round}" if checkpoint else "the base model"
    report(f"Loading {where} on {device.describe()}…")
    backend = load_backend(model_dir, device, config.grpo, fixed_seed(config.run.seed), config.tasks.temperature)
    if checkpoint is not None:
        backend.load(checkpoint.path)
    report("Merging the adapters into the weights…")
    backend.export(target)


def _adapter_to_gguf(checkpoint: Path, model_dir: Path, config: NodeConfig, out: Path, quant: str) -> None:
    """A peft adapter folder from the checkpoint's adapter tensors, then llama.cpp's LoRA converter."""
    with tempfile.TemporaryDirectory(prefix="sapling-lora-", dir=_scratch_dir(out)) as scratch:
        folder = Path(scratch)
        shutil.copyfile(checkpoint / ADAPTER_FILE, folder / "adapter_model.safetensors")
        g = config.grpo
        adapter_config = {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": g.lora_rank, "lora_alpha": g.lora_alpha,
            "target_modules": "all-linear", "base_model_name_or_path": str(model_dir),
        }
        (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
        with atomic_file(out) as tmp:
            run_converter(CONVERT_LORA,
                          [str(folder), "--base", str(model_dir), "--outtype", quant, "--outfile", str(tmp)])


def gguf_cache_path(paths: Paths, run_name: str, round_index: int, quant: str = DEFAULT_QUANT, *,
                    lora: bool = False) -> Path:
    """Where Try it keeps the GGUF of one round: round 0 is the base model; a checkpoint's is its merged
    model, or with `lora` its adapter alone (`--format gguf-lora`), from which the merged one is made."""
    name = "base" if round_index == 0 else checkpoint_name(round_index)
    return paths.cache_dir / "gguf" / run_name / f"{name}.{'lora-' if lora else ''}{quant}.gguf"
