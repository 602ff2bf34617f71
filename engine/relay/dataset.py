"""The swarm's dataset, kept by the relay: every stored batch, and the receipts that mark items used.

    keeper = DatasetKeeper("/var/lib/sapling-relay/dataset", max_mb=1024)   # --dataset-dir, --dataset-max-mb
    keeper.keep_batch(peer, payload, sig_b64, seq)        # a publish the relay accepted
    keeper.keep_used(receiver, [(sender, seq, i), ...])   # a receipt's `used` items that the relay counted
    for record in read_kept(folder, damaged): ...         # the export (engine/relay/dataset_export.py)

The relay writes what it stores, as it stored it (the signed payload and its
signature), to `DIR/kept/`, one JSON object a line, in segment files that
each relay process names for itself (`<start ns>-<pid>-<random>.jsonl`), so
the processes of one swarm can share the folder without a lock. A line is
written with one `write` in append mode: a reader sees whole lines, and at
most the last line of a segment being written is incomplete (it is left for
the next read). Past `dataset_max_mb` megabytes, the oldest segments are
deleted (the bound on disk). A write that fails (a full disk) is logged once
a minute and counted; the relay goes on serving.

Nothing here checks an item: `sapling-relay dataset export` re-checks every
one (engine/relay/dataset_export.py). Nothing here imports reasoning-gym.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_json

log = logging.getLogger("sapling.relay")

KEPT_DIR = "kept"
POLICY_FILE = "policy.json"  # the license, name and address the relay announces, for the export's card
SEGMENT_SUFFIX = ".jsonl"
SEGMENT_BYTES = 16 * 1024 * 1024  # a segment is closed past this size (or an eighth of the bound, if smaller)
MIN_SEGMENT_BYTES = 64 * 1024
WARN_EVERY_S = 60.0
BATCH, USED = "batch", "used"  # the two kinds of kept line

ItemRef = tuple[str, int, int]  # (sender's peer id, seq, position in the batch)


def segments(folder: Path) -> list[Path]:
    """The kept segments under `folder` (the dataset dir), oldest first."""
    kept = Path(folder) / KEPT_DIR
    try:
        names = sorted(p.name for p in kept.iterdir() if p.name.endswith(SEGMENT_SUFFIX) and p.name[0] != ".")
    except FileNotFoundError:
        return []
    return [kept / name for name in names]


class DatasetKeeper:
    """One relay process's writer of kept batches and used receipts under `folder`/kept."""

    def __init__(self, folder: str | Path, max_mb: float, policy: dict[str, Any] | None = None) -> None:
        """`policy`: what the information document says of the dataset (its license), with the swarm's name;
        written to POLICY_FILE for the export. OSError when the folder cannot be made or written."""
        self.folder = Path(folder).expanduser()
        self.kept = self.folder / KEPT_DIR
        self.kept.mkdir(parents=True, exist_ok=True)
        if policy is not None:
            atomic_write_json(self.folder / POLICY_FILE, policy)
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.segment_bytes = max(MIN_SEGMENT_BYTES, min(SEGMENT_BYTES, self.max_bytes // 8))
        self.metrics: Counter[str] = Counter()  # batches, used items, write errors, segments pruned
        self._tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._path: Path | None = None
        self._size = 0
        self._warned = 0.0
        self.prune()

    def keep_batch(self, peer: str, payload: str, sig: str, seq: int) -> None:
        if self._write({"k": BATCH, "peer": peer, "seq": seq, "payload": payload, "sig": sig,
                        "at": round(time.time(), 3)}):
            self.metrics["batches"] += 1

    def keep_used(self, receiver: str, items: Sequence[ItemRef]) -> None:
        """Items a receiver marked `used` in a receipt the relay counted (never its own)."""
        if not items:
            return
        if self._write({"k": USED, "receiver": receiver, "items": [list(i) for i in items],
                        "at": round(time.time(), 3)}):
            self.metrics["used"] += len(items)

    def _write(self, record: dict[str, Any]) -> bool:
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8",
                                                                                          "surrogatepass")
        try:
            if self._path is None or self._size + len(line) > self.segment_bytes:
                self._path = self.kept / f"{time.time_ns():020d}-{self._tag}{SEGMENT_SUFFIX}"
                self._size = 0
                self.prune()
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)
            finally:
                os.close(fd)
            self._size += written
            if written != len(line):  # a full disk mid-line: the line is damaged; the next goes to a new segment
                raise OSError(f"only {written} of {len(line)} bytes were written")
            return True
        except OSError as exc:
            self.metrics["write_errors"] += 1
            self._path = None
            now = time.monotonic()
            if now - self._warned >= WARN_EVERY_S:
                self._warned = now
                log.warning("cannot keep a batch for the dataset in %s: %s (the relay goes on serving)",
                            self.kept, exc)
            return False

    def prune(self) -> None:
        """Delete the oldest segments (never the one this process writes) until the rest fit the bound."""
        sized = []
        for path in segments(self.folder):
            try:
                sized.append((path, path.stat().st_size))
            except FileNotFoundError:  # another process pruned it
                continue
        total = sum(size for _, size in sized)
        for path, size in sized:
            if total <= self.max_bytes:
                break
            if path == self._path:
                continue
            try:
                path.unlink()
                self.metrics["pruned"] += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot delete the old dataset segment %s: %s", path, exc)
                continue
            total -= size


def read_kept(folder: Path, damaged: Counter[str]) -> Iterator[dict[str, Any]]:
    """Every whole kept line under `folder`, oldest segment first; a line that is not a kept record is
    counted in `damaged` (by segment file name) and skipped. A segment's unfinished last line is left."""
    for path in segments(folder):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # pruned meanwhile
            continue
        end = data.rfind(b"\n")
        for raw in data[:end + 1].splitlines():
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                record = None
            if not _well_formed(record):
                damaged[path.name] += 1
                continue
            yield record


def _well_formed(record: object) -> bool:
    if not isinstance(record, dict):
        return False
    if record.get("k") == BATCH:
        return (isinstance(record.get("peer"), str) and isinstance(record.get("payload"), str)
                and isinstance(record.get("sig"), str) and _whole(record.get("seq")))
    if record.get("k") == USED:
        items = record.get("items")
        return isinstance(record.get("receiver"), str) and isinstance(items, list) and all(
            isinstance(i, list) and len(i) == 3 and isinstance(i[0], str) and _whole(i[1]) and _whole(i[2])
            for i in items)
    return False


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
