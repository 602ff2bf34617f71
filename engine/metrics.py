"""metrics.jsonl: one JSON line per round (and per evaluation), kept across restarts.

Lines are appended with one O_APPEND write each (`engine.common.atomicio.append_line`);
readers skip anything that does not parse, so a torn last line after a crash
costs at most that line, which the checkpoint restores on resume.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.common.atomicio import append_line

log = logging.getLogger(__name__)


class MetricsLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(record, separators=(",", ":"), allow_nan=False))

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
