"""engine/experiment/horizon.py: a long pair read after every N rounds, each seed from the rounds it reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.experiment.compare import compare
from engine.experiment.horizon import horizon_markdown, horizon_plot, horizon_table
from engine.experiment.upto import records_upto
from tests.engine.test_experiment_upto import fake


def _cut(cache: Path):
    return lambda folder, n: records_upto(folder, n, cache)


def _pairs(tmp_path: Path) -> list[tuple[Path, Path]]:
    """Seed 0 ran 6 rounds; seed 1 only 3. A's reward jumps after round 3 in seed 0."""
    fake(tmp_path / "a0", [[0.2, 0.2]] * 3 + [[0.6, 0.6]] * 3, [3, 6])
    fake(tmp_path / "b0", [[0.2, 0.2]] * 6, [3, 6])
    fake(tmp_path / "a1", [[0.3, 0.1]] * 3, [3])
    fake(tmp_path / "b1", [[0.2, 0.2]] * 3, [3])
    return [(tmp_path / "a0", tmp_path / "b0"), (tmp_path / "a1", tmp_path / "b1")]


def test_each_horizon_pools_the_seeds_that_reached_it_and_the_late_window_sees_the_late_gap(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path)
    rows = horizon_table(pairs, "4/4", "4/4", _cut(tmp_path / "cache"), every=3, window=3)
    assert [r["round"] for r in rows] == [3, 6]
    assert rows[0]["pairs"] == [0, 1] and rows[1]["pairs"] == [0]
    # after round 3 both seeds are even: (1.2 + 1.2) / (1.2 + 1.2)
    assert rows[0]["per_round"]["ratio"] == pytest.approx(1.0)
    # after round 6 only seed 0 counts: cumulative 4.8 / 2.4, the last three rounds 3.6 / 1.2
    assert rows[1]["per_round"]["ratio"] == pytest.approx(compare(tmp_path / "a0", tmp_path / "b0", "4/4")["ratio"])
    assert rows[1]["per_round"]["ratio"] == pytest.approx(2.0)
    assert rows[1]["per_round_last"] == {"window": 3, "rounds": [4, 6], "ratio": pytest.approx(3.0),
                                         "ci95": pytest.approx([3.0, 3.0])}
    assert rows[1]["per_hour"] is None and rows[1]["held_out_equal_time"] is None  # untimed, no answers kept
    table = horizon_markdown(rows, ["s0", "s1"])
    assert "| 3 | s0, s1 | 1.000" in table and "| 6 | s0 | 2.000" in table
    assert horizon_plot(rows, "4/4", "4/4", ["s0", "s1"]).startswith(b"\x89PNG")


def test_the_command_writes_the_plot_and_the_rows_and_refuses_a_bad_count(tmp_path: Path, capsys) -> None:
    from bench.experiment_report import main

    pairs = _pairs(tmp_path)
    specs = [f"{a},{b}" for a, b in pairs]
    out = tmp_path / "horizon.png"
    assert main(["--horizon", str(out), "4/4", "4/4", *specs, "--every", "3"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    saved = json.loads(out.with_suffix(".json").read_text())
    assert [r["round"] for r in saved["rows"]] == [3, 6] and saved["pairs"][1] == [str(p) for p in pairs[1]]
    assert "| 6 | a0 |" in capsys.readouterr().out
    assert main(["--horizon", str(out), "4/4", "4/4", *specs, "--every", "x"]) == 2
    assert main(["--horizon", str(out), "4/4", "4/4", *specs, "--every", "0"]) == 2
    assert main(["--horizon", str(out), "4/4", "4/4", *specs, "--upto", "3"]) == 2
    assert main(["--horizon", str(out), "4/4", "4/4", f"{tmp_path / 'nothing'},{tmp_path / 'b0'}"]) == 2
    assert "experiment_report:" in capsys.readouterr().err
