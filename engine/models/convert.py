"""llama.cpp's GGUF converters, run in this process: where they are, and an HF folder to a GGUF file.

The llama-cpp-python wheel does not contain `convert_hf_to_gguf.py` and
`convert_lora_to_gguf.py` (its build packs only the `llama_cpp` package), so
`make` copies them, with the `gguf-py` they ship with (newer than PyPI's gguf
0.19 under the same version number), out of the same llama-cpp-python source
distribution it compiles, into ``<venv>/share/sapling/llama.cpp-convert/``;
the PyInstaller spec bundles that folder. `converter_dir()` says where it
looked. A converter runs as ``__main__`` in this process (a frozen build has
no Python to run a script with), with its own `gguf` swapped in for the time
of the call. Converting imports torch.

Used by engine/gguf/export.py (`sapling-node export`) and engine/models/sources.py
(the bundled model's base GGUF, prepared when it is converted): it sits here,
below both, because the round loop loads models and Try it and export are
built on the round loop's pieces.

Tests: .venv/bin/python -m pytest tests/engine/test_export.py -q
"""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

from engine.common.errors import ModelError

log = logging.getLogger(__name__)

CONVERTER_ENV = "SAPLING_LLAMA_CONVERT"
CONVERTER_FOLDER = "llama.cpp-convert"
CONVERT_HF = "convert_hf_to_gguf.py"
CONVERT_LORA = "convert_lora_to_gguf.py"
# Module names the converters bring in; they must not mix with PyPI's gguf if that is already loaded.
_CONVERTER_MODULES = ("gguf", "conversion", "convert_hf_to_gguf", "convert_lora_to_gguf")


def converter_dir() -> Path:
    """The folder holding llama.cpp's converters: $SAPLING_LLAMA_CONVERT, the frozen bundle, or the venv."""
    candidates: list[Path] = []
    if os.environ.get(CONVERTER_ENV):
        candidates.append(Path(os.environ[CONVERTER_ENV]))
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        candidates.append(Path(bundle) / CONVERTER_FOLDER)
    candidates.append(Path(sys.prefix) / "share" / "sapling" / CONVERTER_FOLDER)
    for folder in candidates:
        if (folder / CONVERT_HF).is_file() and (folder / "gguf-py" / "gguf").is_dir():
            return folder
    raise ModelError(
        f"llama.cpp's GGUF converter is not installed (looked in {', '.join(str(c) for c in candidates)}): "
        "run `make run` or `make test` once, which copies it from the llama-cpp-python source, "
        "or use --format hf."
    )


def hf_to_gguf(folder: Path, out: Path, quant: str, name: str) -> None:
    """An HF model folder as one GGUF file (`quant`: f16, bf16, q8_0 or f32), written atomically to `out`."""
    with atomic_file(out) as tmp:
        run_converter(CONVERT_HF, [str(folder), "--outtype", quant, "--outfile", str(tmp), "--model-name", name])


@contextlib.contextmanager
def atomic_file(out: Path) -> Iterator[Path]:
    """A temporary path beside `out` that replaces it only when the block succeeds."""
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        yield tmp
        if not tmp.is_file():
            raise ModelError(f"The GGUF converter finished without writing {out}.")
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _owned(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in _CONVERTER_MODULES)


def run_converter(script_name: str, argv: list[str]) -> None:
    """Run one of llama.cpp's converter scripts as __main__, in this process, with its own gguf."""
    folder = converter_dir()
    script = folder / script_name
    saved_modules = {name: module for name, module in sys.modules.items() if _owned(name)}
    for name in saved_modules:
        del sys.modules[name]
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    sys.path[:0] = [str(folder / "gguf-py"), str(folder)]
    sys.argv = [str(script), *argv]
    log.info("running %s %s", script, " ".join(argv))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise ModelError(f"llama.cpp's converter could not convert this model (exit {exc.code}); "
                             "the log file has its messages.") from exc
    except NotImplementedError as exc:
        raise ModelError(f"llama.cpp's converter does not support this model: {exc}. "
                         "The Hugging Face folder export (--format hf) still works.") from exc
    finally:
        for name in [name for name in sys.modules if _owned(name)]:
            del sys.modules[name]
        sys.modules.update(saved_modules)
        sys.path[:], sys.argv = saved_path, saved_argv
