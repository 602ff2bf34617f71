"""Memory housekeeping for a process that keeps one model loaded for hours (the torch backend).

- `freeze_long_lived`: the objects alive after loading (the model, its
  tokenizer, the libraries) are moved out of the garbage collector's sight.
- `release_memory`: a collection, then freed heap pages handed back to the
  OS (glibc's malloc_trim on Linux), after every generate, greedy and train
  call, so a long CPU run's RSS does not creep up round after round.

Tests: .venv/bin/python -m pytest tests/engine/test_torch_backend.py -q
"""

from __future__ import annotations

import ctypes
import gc
import sys


def freeze_long_lived() -> None:
    """Moves every object alive now out of the garbage collector's sight (`gc.freeze`).

    A loaded model with its tokenizer and libraries is some 420,000 Python
    objects that live as long as the process. A full collection walks them
    all, and `release_memory` runs one after every generate, greedy and
    train call (docs/backends.md gives the cost). Frozen, they are skipped; they are still freed by reference
    counting, so only a reference cycle among them that becomes garbage
    later would be kept, which a backend that lives as long as its process
    never makes.
    """
    gc.collect()
    gc.freeze()


def release_memory() -> None:
    """Hand freed heap pages back to the OS.

    glibc keeps freed blocks in per-thread arenas; with PyTorch's varied
    tensor sizes a long CPU run's RSS then creeps up round after round
    although nothing is live. malloc_trim(0) returns them (Linux only).
    """
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
