"""One training node per data folder: a second one is refused in one sentence.

Two nodes on one folder (the app's engine and a `sapling-node run` in a terminal, or two terminals) would share
one identity, so the relay would take each one's connection for the other's, and they would write the same
checkpoints and metrics over each other. `node_lock` holds an operating-system lock on `node.lock` in the data
folder for as long as a node trains: flock on POSIX, a byte-range lock on Windows. The system drops it when the
process ends, however it ends, so a crash or a kill leaves nothing to clean up. The file holds the holder's
process id, for the message.

Tests: .venv/bin/python -m pytest tests/engine/test_node_lock.py -q
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from engine.common.errors import NodeBusyError

LOCK_FILE = "node.lock"
PID_OFFSET = 16  # Windows locks byte 0 only, so another process can still read the holder's id from here


def _try_lock(handle: IO[str]) -> bool:
    if sys.platform == "win32":
        import msvcrt

        handle.seek(0)
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError, ValueError), open(path, "rb") as handle:
        handle.seek(PID_OFFSET)  # past the locked byte, which Windows refuses to read
        text = handle.read(32).decode("ascii").strip()
        if text.isdigit():
            return f", process {text}"
    return ""


@contextlib.contextmanager
def node_lock(data_dir: Path, second: str = "A second node on this computer needs a folder of its own (--home)."
              ) -> Iterator[None]:
    """Hold the data folder's node lock while the block runs; NodeBusyError, ending with `second`, when another
    process holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    handle = open(path, "a+", encoding="ascii")  # held open for the whole block: closing it releases the lock
    try:
        if not _try_lock(handle):
            raise NodeBusyError(
                f"Another Sapling node is already training with {data_dir}{_holder(path)}: stop it first (Stop in "
                f"its window, or Ctrl-C in its terminal). {second}")
        handle.seek(PID_OFFSET)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the lock
