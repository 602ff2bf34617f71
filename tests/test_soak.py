"""bench/soak.py's verdict (its goals on samples written by hand) and its refusals of bad arguments."""

from __future__ import annotations

from typing import Any

import pytest

from bench import soak

MB = 1 << 20
WATCHED = [{"name": "relay-a", "folder": True, "home": False}, {"name": "node-0", "folder": True, "home": True}]


def samples(rss: list[float], fds: list[int], checkpoints: int = 2, node_disk: float = 5.0) -> list[dict[str, Any]]:
    """One sample a minute: the relay flat, the node's RSS (MB) and open files as given."""
    rows = []
    for i, (r, f) in enumerate(zip(rss, fds, strict=True)):
        rows.append({"t": 60.0 * i, "churn": {}, "procs": {
            "relay-a": {"alive": True, "rss": 50 * MB, "fds": 10, "threads": 1, "disk": 400},
            "node-0": {"alive": True, "rss": int(r * MB), "fds": f, "threads": 4, "disk": int(node_disk * MB),
                       "checkpoints": checkpoints, "checkpoint_max": MB, "metrics": 1000, "logs": 5000,
                       "rounds": 10 * (i + 1), "received": 8, "connected": True, "held": 60}}})
    return rows


def test_a_flat_run_meets_every_goal() -> None:
    lines, failed = soak.judge(samples([400, 420, 440, 441, 439, 440, 442, 440], [7, 9, 8, 9, 8, 8, 9, 8]), 120,
                               WATCHED)
    assert failed == []
    assert lines[2].startswith("| relay-a | 50.0 → 50.0 | +0.0 |") and lines[3].startswith("| node-0 | 440.")


def test_memory_growth_open_files_and_disk_fail_the_run() -> None:
    _lines, failed = soak.judge(samples([400, 420, 430, 440, 450, 460, 470, 480], [8, 8, 8, 9, 10, 11, 12, 13],
                                        checkpoints=4, node_disk=60.0), 120, WATCHED)
    assert any("node-0: RSS grew" in f for f in failed)
    assert any("node-0: open files grew" in f for f in failed)
    assert any("4 checkpoints on disk" in f for f in failed) and any("over its bound" in f for f in failed)


def test_metrics_trimmed_to_a_few_rounds_fail_the_run() -> None:
    rows = samples([440] * 6, [8] * 6)
    rows[4]["procs"]["node-0"]["held"] = 2  # lines that grew until the bound kept two rounds
    _lines, failed = soak.judge(rows, 60, WATCHED)
    assert failed == ["node-0: metrics.jsonl held fewer than 50 rounds after the warm-up"]


def test_a_node_that_stopped_or_stopped_sharing_fails_the_run() -> None:
    rows = samples([440] * 6, [8] * 6)
    rows[-1]["procs"]["node-0"].update(alive=False, connected=False)
    _lines, failed = soak.judge(rows, 60, WATCHED)
    assert "node-0 is not running at the end" in failed and any("not sharing at the end" in f for f in failed)


@pytest.mark.parametrize("args", [["--minutes", "0"], ["--sample-s", "-1"], ["--churn", "-5"], ["--nodes", "0"],
                                  ["--minutes", "10", "--warmup-minutes", "10"], ["--receipt-window", "0"],
                                  ["--minutes", "30"]])  # the default warm-up, a receipt window and 5 min, is longer
def test_bad_arguments_are_one_sentence_and_exit_2(args: list[str], tmp_path: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main(["--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("soak: ") and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
