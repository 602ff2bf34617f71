"""Session and History: what the window knows, built from the recorded event stream and metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.charts import decimate, nice_step, rolling_mean
from app.session import History, Session, describe_device, describe_model
from engine.common.errors import EventError
from engine.common.events import parse_event
from tests.app.conftest import HISTORY, SESSION


def replay(session: Session, path: Path = SESSION) -> tuple[int, int]:
    """Feed every line of a recorded stream; returns (malformed lines, unknown types)."""
    bad = unknown = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            event = parse_event(line)
        except EventError:
            bad += 1
            continue
        if event is None:
            unknown += 1
            continue
        session.handle(event)
    return bad, unknown


def test_recorded_stream_fills_the_session(qapp) -> None:  # type: ignore[no-untyped-def]
    session = Session()
    logs: list[tuple[str, str, str]] = []
    session.logMessage.connect(lambda *a: logs.append(a))
    bad, unknown = replay(session)
    assert (bad, unknown) == (3, 1)
    assert session.ignored == 1  # the round whose metrics are a string
    h = session.history
    assert h.rounds == [1, 2, 3, 4]
    assert h.swarm_reward == [None, 0.25, 0.375, 0.3125]
    assert h.eval_rounds == [0, 2, 4]
    assert session.state == "stopped" and session.round == 4
    assert session.device is not None and session.device["kind"] == "cpu"
    assert session.swarm["name"] == "quiet-fern" and session.swarm["connected"] is True
    assert session.peers["online"] == 3 and session.peers["accepted"] == 17
    assert sum(session.peers["rejected_by_reason"].values()) == session.peers["rejected"] == 7
    assert any("bad shape" in text for _level, _src, text in logs)


def test_history_reads_metrics_file_and_skips_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    other = json.dumps({"kind": "round", "run": "other", "round": 7, "reward_mean": 1.0})
    path.write_text(HISTORY.read_text() + other + "\nnot json\n" + '{"kind":"round","run":"default","ro')
    h = History.from_metrics_file(path, "default")
    assert h.rounds == list(range(1, 41))
    assert h.eval_rounds == [0, 10, 20, 30, 40]
    assert all(v is not None and 0 <= v <= 1 for v in h.reward)
    assert History.from_metrics_file(tmp_path / "missing.jsonl", "default").rounds == []


def test_a_round_done_again_replaces_the_later_ones() -> None:
    h = History()
    for r in range(1, 6):
        h.add_round({"round": r, "reward_mean": r / 10})
    h.add_round({"round": 3, "reward_mean": 0.9})
    assert h.rounds == [1, 2, 3] and h.reward == [0.1, 0.2, 0.9]
    assert not h.add_round({"round": "3"})
    h.add_round({"round": 4, "reward_mean": float("nan"), "tokens_per_second": True})
    assert h.reward[-1] is None and h.tokens_per_second[-1] is None


def test_a_new_run_reloads_its_own_history(qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "metrics.jsonl"
    path.write_text(HISTORY.read_text() + json.dumps({"kind": "round", "run": "b", "round": 1, "reward_mean": 0.5})
                    + "\n")
    session = Session(run="default")
    session.load_history(path)
    assert len(session.history) == 40
    session.handle({"type": "status", "state": "loading", "message": "", "device": None, "model": "bundled",
                    "run": "b", "round": 0})
    assert session.history.rounds == [1]


def test_rolling_mean_and_decimation_keep_the_shape() -> None:
    assert rolling_mean([None, 1.0, 3.0, None, 5.0], window=2) == [None, 1.0, 2.0, 2.0, 4.0]
    xs = [float(i) for i in range(10_000)]
    ys: list[float | None] = [0.5] * 10_000
    ys[1234], ys[8765] = 0.0, 1.0
    points = decimate(xs, ys, 1000)
    assert len(points) <= 1000
    assert min(p.y() for p in points) == 0.0 and max(p.y() for p in points) == 1.0
    assert [p.x() for p in points] == sorted(p.x() for p in points)
    assert len(decimate(xs[:50], ys[:50], 1000)) == 50


@pytest.mark.parametrize(("span", "step"), [(10, 2), (40, 10), (10_000, 2000), (1, 0.2)])
def test_nice_step(span: float, step: float) -> None:
    assert nice_step(span) == pytest.approx(step)


def test_device_and_model_are_described_in_plain_words() -> None:
    assert describe_device({"kind": "cuda", "name": "NVIDIA H200"}) == "NVIDIA H200 (CUDA GPU)"
    assert describe_device({"kind": "mlx", "name": ""}) == "Apple MLX"
    assert describe_device({"kind": "cpu", "name": "Xeon (2 threads)"}) == "CPU · Xeon (2 threads)"
    assert describe_device(None) == "Not known yet"
    assert describe_model("bundled") == "SmolLM2-135M-Instruct (bundled)"
    assert describe_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B (Hugging Face)"
    assert describe_model("/models/mine") == "mine (folder)"


def test_extending_a_rolling_mean_matches_computing_it_again() -> None:
    from app.charts import extend_rolling_mean

    values: list[float | None] = [None, 0.5, None, 1.0, 0.0, None, 0.25] * 5
    trend = rolling_mean(values[:9], window=3)
    assert extend_rolling_mean(values, trend, window=3) == pytest.approx(rolling_mean(values, window=3))
