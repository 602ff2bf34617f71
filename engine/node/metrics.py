"""metrics.jsonl: one JSON line per round (and per evaluation), kept across restarts.

Lines are appended with one O_APPEND write each (`engine.common.atomicio.append_line`);
readers skip anything that does not parse, so a torn last line after a crash
costs at most that line, which the checkpoint restores on resume.

The file has a size bound (`run.metrics_max_kb`): an append that takes it past
the bound rewrites it atomically with only its newest lines, half the bound's
worth, so a node that runs for months keeps weeks of rounds and no more. Only
the node writes the file; a reader sees the old file or the new one, whole.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.common.atomicio import append_line, atomic_write_bytes

if TYPE_CHECKING:
    from engine.rollouts.groups import Group

log = logging.getLogger(__name__)


DEFAULT_MAX_BYTES = 32 << 20  # run.metrics_max_kb's default


class MetricsLog:
    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.trimmed = 0  # lines dropped by this process's trims

    def append(self, record: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(record, separators=(",", ":"), allow_nan=False))
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size > self.max_bytes:
            self._trim()

    def _trim(self) -> None:
        """Keep the newest whole lines that fit in half the bound, written atomically."""
        data = self.path.read_bytes()
        keep = self.max_bytes // 2
        start = len(data) - keep
        if start > 0:
            newline = data.find(b"\n", start - 1)
            start = len(data) if newline < 0 else newline + 1
        kept = data[max(0, start):] or data[data.rfind(b"\n", 0, len(data) - 1) + 1:]  # at least the newest line
        start = len(data) - len(kept)
        atomic_write_bytes(self.path, kept)
        dropped = data[:start].count(b"\n")
        self.trimmed += dropped
        log.info("%s passed %d kB: dropped its oldest %d lines, kept %d bytes", self.path, self.max_bytes // 1024,
                 dropped, len(kept))

    def read(self, run: str | None = None) -> list[dict[str, Any]]:
        """All records (of one run if given), oldest first; bad lines skipped."""
        if not self.path.is_file():
            return []
        records = []
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    record = json.loads(line)
                except ValueError:
                    log.warning("%s line %d is not JSON; skipped", self.path, number)
                    continue
                if isinstance(record, dict) and (run is None or record.get("run") == run):
                    records.append(record)
        return records

    def has(self, run: str, kind: str, round_index: int) -> bool:
        return any(r.get("kind") == kind and r.get("round") == round_index for r in self.read(run))


def held_out_summary(specialties: Sequence[str], rewards: Sequence[float]) -> dict[str, Any]:
    """A held-out set's greedy pass@1 from each question's specialty and reward: the eval record's numbers."""
    solved: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    for specialty, reward in zip(specialties, rewards, strict=True):
        asked[specialty] += 1
        solved[specialty] += reward >= 1.0
    return {
        "accuracy": sum(solved.values()) / len(rewards),
        "reward_mean": sum(rewards) / len(rewards),
        "questions": len(rewards),
        "by_specialty": {k: solved[k] / asked[k] for k in sorted(asked)},
    }


def round_summary(groups: Sequence[Group], external: Sequence[Group], gen_seconds: float) -> dict[str, Any]:
    """A round's numbers from its own groups and the swarm's it took: rewards, accuracy, groups, answer lengths."""
    rewards = [r for g in groups for r in g.rewards]
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    by_specialty: dict[str, list[float]] = {}
    for g in groups:
        by_specialty.setdefault(g.question.ref.dataset, []).extend(g.rewards)
    ext_rewards = [r for g in external for r in g.rewards]
    return {
        "reward_mean": sum(rewards) / len(rewards),
        "accuracy": sum(1 for r in rewards if r >= 1.0) / len(rewards),
        "swarm_reward_mean": sum(ext_rewards) / len(ext_rewards) if ext_rewards else None,
        "reward_by_specialty": {k: sum(v) / len(v) for k, v in sorted(by_specialty.items())},
        "completions": len(rewards),
        "local_groups": len(groups),
        "external_groups": len(external),
        "informative_groups": sum(1 for g in [*groups, *external] if g.informative),
        # each own group's specialty and rewards: what a policy that skips or stops groups early would have
        # seen (bench/curriculum_replay.py replays rounds offline)
        "own_group_rewards": [[g.question.ref.dataset, [round(r, 4) for r in g.rewards]] for g in groups],
        "completion_tokens_mean": sum(lengths) / len(lengths),
        "truncated_fraction": sum(1 for g in groups for c in g.completions if not c.finished) / len(lengths),
        "tokens_per_second": sum(lengths) / gen_seconds if gen_seconds > 0 else 0.0,
    }


def rss_bytes() -> int:
    """This process's resident memory, reported every round so creeping growth is visible."""
    import psutil

    return int(psutil.Process().memory_info().rss)
