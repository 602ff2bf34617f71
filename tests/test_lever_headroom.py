"""bench.lever_headroom counts issue 51's swarm-only levers as a hand count of a small experiment folder does."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import lever_headroom

B, G = 2, 4
OVERRIDES = [f"tasks.questions_per_round={B}", f"tasks.completions_per_question={G}"]
# node -> round -> [(specialty, text, rewards)]: Q2 is on both nodes in round 1, Q1 on node 0 in round 1 and node 1
# in round 2.
GROUPS: dict[int, dict[int, list[tuple[str, str, list[float]]]]] = {
    0: {1: [("basic_arithmetic", "Q1", [1, 0, 0, 0]), ("calendar_arithmetic", "Q2", [0, 0, 0, 0])],
        2: [("basic_arithmetic", "Q3", [0.5, 0, 0, 0]), ("calendar_arithmetic", "Q4", [1, 1, 1, 1])]},
    1: {1: [("basic_arithmetic", "Q5", [0, 0, 0, 0]), ("calendar_arithmetic", "Q2", [1, 1, 0, 0])],
        2: [("basic_arithmetic", "Q1", [0, 0, 0, 0]), ("calendar_arithmetic", "Q6", [0, 0, 0, 0])]},
}


class FakeTaskSet:
    """Each node's questions as GROUPS lists them (the real draw is reasoning-gym's)."""

    def __init__(self, weights: Any, configs: Any, seed: int = 0) -> None:
        self.node = seed // 10_000_000

    def draw(self, round_index: int, n: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(text=text, ref=SimpleNamespace(dataset=name))
                for name, text, _ in GROUPS[self.node][round_index]][:n]


def _lines(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _experiment(folder: Path) -> None:
    (folder / "mix-2-1").mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(
        {"nodes": 2, "mixes": ["2/1"], "rounds": 2, "preset": "default", "overrides": OVERRIDES}))
    (folder / "mix-2-1" / "progress.json").write_text(json.dumps({"round": 2}))
    rounds = []
    for r, refused in ((1, [{"zero_advantage": 1}, {}]), (2, [{}, {"zero_advantage": 2}])):
        groups = [GROUPS[k][r] for k in (0, 1)]
        rounds.append({"round": r, "rewards": [0.1, 0.1], "external_groups": [1, 1], "rejected": refused,
                       "informative_groups": [1 + sum(max(g[2]) > min(g[2]) for g in row) for row in groups],
                       "accuracy": [sum(x >= 1 for g in row for x in g[2]) / (B * G) for row in groups],
                       "node_cpu_seconds": [36.0, 36.0]})
    _lines(folder / "mix-2-1" / "rounds.jsonl", rounds)
    for k in (0, 1):
        _lines(folder / "mix-2-1" / f"node-{k}" / "metrics.jsonl",
               [{"kind": "round", "round": r, "own_group_rewards": [[name, rewards] for name, _, rewards in row]}
                for r, row in GROUPS[k].items()])
    _lines(folder / "mix-2-1" / "evals.jsonl", [{"round": 2, "nodes": [{"passes": "1100"}, {"passes": "1010"}]}])


def test_the_counts_match_a_hand_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lever_headroom, "TaskSet", FakeTaskSet)
    _experiment(tmp_path / "run")
    summary = lever_headroom.summarize([lever_headroom.read_run(tmp_path / "run")])
    pooled = {key: m["pooled"][0] for key, m in summary["measures"].items()}
    assert pooled == pytest.approx({
        "own_informative": 100 * 3 / 8,  # Q1, Q2 on node 1, Q3
        "peer_informative": 100 * 3 / 8,
        "drawn_informative": 100 * 4 / 7,  # 4 taken, 3 refused as zero_advantage
        "peer_informative_on_offer": 3 / 4,
        "no_full_credit": 100 * 5 / 8,  # Q2 and Q5 in round 1, Q3, Q1 and Q6 in round 2
        "peer_same_text_same_round": 100 * 1 / 5,  # node 1 solved Q2 when node 0 failed it
        "peer_same_text_by_then": 100 * 2 / 5,  # and node 0 had solved Q1 a round before node 1 failed it
        "peer_same_specialty_solved": 100 * 3 / 5,  # all but Q3 and node 1's Q1 (the peer's basic one failed too)
        "peer_group_same_specialty_solved": 100 * 3 / 5,
        "held_out_other_passes": 100 * 2 / 4,  # node 0 fails 3rd and 4th (node 1 passes 3rd), node 1 2nd and 4th
        "held_out_any_other_passes": 100 * 2 / 4,
        "full_credit_per_node_round": 7 / 4,
        "full_credit_per_node_hour": 7 / (4 * 36 / 3600),  # 175
        "solved_per_node_round": 3 / 4,
    }, abs=0.5)  # printed to 0.1 point, 0.01 or (per hour) whole answers
    same = summary["same_question"]
    assert (same["texts"], same["texts_on_two_nodes"], same["pairs"]) == (6, 2, 2)
    assert same["informative_share"][0] == 50.0 and same["informative_given_peer_informative"][0] == 0.0
    assert same["failed_given_peer_solved"][0] == 100.0
    assert summary["by_specialty"]["calendar_arithmetic"] == {"solved_share": 50.0, "full_credit_per_node_round": 1.5,
                                                              "solved_per_node_round": 0.5}
    for key, m in summary["measures"].items():
        low, high = m["pooled"][1], m["pooled"][2]
        assert low <= m["pooled"][0] <= high, key
    assert "| a | own groups informative | 37.5 [" in lever_headroom.markdown(summary)


def test_a_newcomer_run_gives_how_far_ahead_the_veterans_were(tmp_path: Path) -> None:
    folder = tmp_path / "newcomer"
    (folder / "experiment.json").parent.mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(
        {"nodes": 2, "mixes": ["2/0", "2/1"], "rounds": 2, "preset": "default", "overrides": OVERRIDES,
         "veterans": 1, "veteran_rounds": 5}))
    (folder / "veterans").mkdir()
    (folder / "veterans" / "progress.json").write_text(json.dumps({"round": 5}))
    _lines(folder / "veterans" / "rounds.jsonl", [{"round": r, "rewards": [0.4]} for r in range(1, 6)])
    (folder / "veterans" / "eval.json").write_text(json.dumps({"accuracy": 0.5, "nodes": [{"passes": "1100"}]}))
    (folder / "eval-start.json").write_text(json.dumps({"accuracy": 0.25, "nodes": [{"passes": "1000"}]}))
    (folder / "mix-2-0").mkdir()
    (folder / "mix-2-0" / "progress.json").write_text(json.dumps({"round": 7}))
    _lines(folder / "mix-2-0" / "rounds.jsonl", [{"round": r, "rewards": [0.5, 0.1]} for r in (6, 7)])
    plan = lever_headroom.saved_plan(folder)
    newcomer = lever_headroom._newcomer(folder, plan, B)
    assert newcomer is not None
    assert newcomer["veterans_reward"] == pytest.approx(0.4) and newcomer["veterans_held_out"] == 0.5
    assert newcomer["newcomer_held_out"] == 0.25 and newcomer["held_out_gap_points"][0] == pytest.approx(25.0)
    assert newcomer["newcomer_reward_first_rounds_alone"] == pytest.approx(0.1)


def test_bad_arguments_and_folders_get_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--help"], [str(tmp_path)]):
        assert lever_headroom.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("lever_headroom: ") and err.count("\n") == 1
