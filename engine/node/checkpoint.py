"""Atomic checkpoints with resume from the newest good one.

Layout: ``checkpoints/<run>/round-000012/`` holding the backend's files
(adapter or weights, optimizer, RNG states) and ``state.json``::

    {"version": 1, "round": 12, "config_hash": ..., "structure_hash": ...,
     "files": {"adapter.safetensors": "<sha256>", ...}, "metrics": {...}}

A checkpoint folder is written under a temporary name and renamed into place
(`engine.common.atomicio.atomic_dir`), so a crash leaves no half-written round. On
load, every file's sha256 is checked; a checkpoint that fails is moved to
``checkpoints/<run>/corrupt/`` with a warning and the previous one is tried.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_dir
from engine.common.errors import CheckpointError
from engine.common.model_policy import file_sha256

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
STATE_VERSION = 1
_NAME = re.compile(r"^round-(\d{6,})$")


@dataclass
class Checkpoint:
    path: Path
    round: int
    state: dict[str, Any]



def checkpoint_name(round_index: int) -> str:
    return f"round-{round_index:06d}"


def save_checkpoint(
    root: Path,
    round_index: int,
    write_files: Callable[[Path], list[str]],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write one checkpoint atomically, then prune all but the newest `keep`."""
    target = Path(root) / checkpoint_name(round_index)
    with atomic_dir(target) as tmp:
        names = write_files(tmp)
        full = dict(state, version=STATE_VERSION, round=round_index, saved_at=time.time())
        full["files"] = {name: file_sha256(tmp / name) for name in names}
        (tmp / STATE_FILE).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    _prune(Path(root), keep)
    return target


def listed_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(round, folder) of every checkpoint folder under `root`, newest first, verified or not."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def _prune(root: Path, keep: int) -> None:
    for _round, path in listed_checkpoints(root)[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def verify(path: Path) -> dict[str, Any]:
    """The checkpoint's state if every file is present and intact, else CheckpointError."""
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path.name}: state.json is missing or unreadable ({exc}).") from exc
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not isinstance(state.get("files"), dict):
        raise CheckpointError(f"{path.name}: state.json is not a Sapling checkpoint of version {STATE_VERSION}.")
    for name, expected in state["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path.name}: {name} is missing.")
        if file_sha256(file) != expected:
            raise CheckpointError(f"{path.name}: {name} is damaged (checksum mismatch).")
    return state


def quarantine(path: Path, reason: str) -> Path:
    """Move a bad checkpoint aside (never delete it) and say so."""
    corrupt = path.parent / "corrupt"
    corrupt.mkdir(parents=True, exist_ok=True)
    dest = corrupt / f"{path.name}-{int(time.time())}-{os.getpid()}"
    os.replace(path, dest)
    log.warning("Checkpoint %s is unusable (%s); moved to %s, trying the previous one.", path.name, reason, dest)
    return dest


def latest_good(root: Path, structure_hash: str, load: Callable[[Path], None] | None = None) -> Checkpoint | None:
    """Newest checkpoint that verifies (and, if given, that `load` accepts).

    Checkpoints of a different model or adapter shape are a `CheckpointError`:
    they are not damaged, they belong to another configuration, and the user
    must choose (new run name, or the old settings).
    """
    for round_index, path in listed_checkpoints(Path(root)):
        try:
            state = verify(path)
        except CheckpointError as exc:
            quarantine(path, str(exc))
            continue
        if state.get("structure_hash") != structure_hash:
            raise CheckpointError(
                f"The checkpoints of this run ({path.parent}) were made with a different model or "
                "fine-tuning setting. Use another run name (--set run.run_name=NEW) or the old settings."
            )
        if load is not None:
            try:
                load(path)
            except CheckpointError as exc:
                quarantine(path, str(exc))
                continue
        return Checkpoint(path, round_index, state)
    return None
