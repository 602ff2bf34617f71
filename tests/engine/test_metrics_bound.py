"""metrics.jsonl's size bound (engine/node/metrics.py): past it the oldest lines go, atomically, whole lines only."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.common.config import ConfigError
from engine.common.config_file import build_config
from engine.node.metrics import MetricsLog


def test_the_file_stays_under_its_bound_and_keeps_the_newest_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, max_bytes=4096)
    for n in range(1, 501):
        log.append({"run": "a", "kind": "round", "round": n, "pad": "x" * 40})
        assert path.stat().st_size <= 4096
    rounds = [r["round"] for r in log.read("a")]
    assert rounds == list(range(rounds[0], 501))  # the newest, in order, none torn
    assert 2048 - 80 <= path.stat().st_size <= 4096 and rounds[0] > 400
    assert log.trimmed == rounds[0] - 1
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left behind


def test_a_line_longer_than_half_the_bound_is_still_kept(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl", max_bytes=200)
    log.append({"run": "a", "round": 1})
    log.append({"run": "a", "round": 2, "pad": "y" * 300})
    assert [r["round"] for r in log.read()] == [2]


def test_the_bound_is_a_setting() -> None:
    assert build_config("default", None, ["run.metrics_max_kb=64"]).run.metrics_max_kb == 64
    with pytest.raises(ConfigError, match="metrics_max_kb"):
        build_config("default", None, ["run.metrics_max_kb=0"])
