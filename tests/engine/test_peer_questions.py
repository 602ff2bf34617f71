"""swarm.peer_questions: a node asks the swarm's teaching questions itself (engine/questions/peers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.common.config import NodeConfig, SwarmConfig, with_changes
from engine.common.errors import CheckpointError, ConfigError
from engine.experiment.plan import make_plan
from engine.questions.peers import POOL_SIZE, PeerQuestions, peer_questions_for, wanted
from engine.questions.tasks import Question, TaskRef
from tests.engine.test_experiment import fast, run


def question(index: int, text: str | None = None, dataset: str = "basic_arithmetic") -> Question:
    ref = TaskRef.create(dataset, {}, 7, index)
    return Question(ref, text or f"what is {index}?", str(index), {})


def test_the_pool_keeps_new_questions_newest_first_never_a_held_out_one_and_asks_each_once() -> None:
    pool = PeerQuestions()
    assert pool.offer(1, [question(1), question(2, "held out"), question(1)], held_out={"held out"}) == 1
    assert pool.offer(2, [question(3), question(4, dataset="bf")], held_out=set()) == 2
    assert [r.index for r in pool.take(2, enabled={"basic_arithmetic"})] == [3, 1]  # newest first, bf not enabled
    assert pool.offer(3, [question(1), question(3)], held_out=set()) == 0  # asked already: never kept again
    assert [r.index for r in pool.take(5)] == [4] and len(pool) == 0
    pool.offer(4, [question(i) for i in range(100, 100 + 2 * POOL_SIZE)], held_out=set())
    assert len(pool) == POOL_SIZE and pool.waiting[0].ref.index == 100 + POOL_SIZE  # the oldest left first


def test_the_pool_survives_a_checkpoint_and_a_damaged_one_is_refused() -> None:
    pool = PeerQuestions()
    pool.offer(5, [question(1), question(2)], held_out=set())
    pool.take(1)
    again = PeerQuestions.from_state(json.loads(json.dumps(pool.to_state())))
    assert again.to_state() == pool.to_state()
    for bad in (None, {"version": 9}, {"version": 1, "asked": [], "waiting": [{"ref": {}, "arrived": 1}]},
                {"version": 1, "asked": [], "waiting": [{"ref": question(1).ref.to_json(), "arrived": -1}]}):
        with pytest.raises(CheckpointError):
            PeerQuestions.from_state(bad)


def test_the_setting_is_a_share_of_the_rounds_questions_and_off_alone() -> None:
    config = with_changes(NodeConfig(), swarm={"peer_questions": 0.25})
    assert wanted(config) == 2 and peer_questions_for(config) is not None
    assert peer_questions_for(NodeConfig()) is None
    assert peer_questions_for(with_changes(config, swarm={"mode": "solo"})) is None
    with pytest.raises(ConfigError, match=r"swarm\.peer_questions"):
        SwarmConfig(peer_questions=1.5)


@pytest.mark.integration  # a real loopback relay
def test_nodes_ask_their_peers_teaching_questions_answer_them_themselves_and_never_receipt_them_as_used(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan("default", 3, "2/1", 3, [*fast(tiny_model_dir), "swarm.peer_questions=0.5"])
    experiment, report = run(plan, tmp_path / "out", tmp_path / "home")
    assert report["complete"]
    rounds = [json.loads(line) for line in (tmp_path / "out" / "mix-2-1" / "rounds.jsonl").read_text().splitlines()]
    assert rounds[0]["peer_asked"] == [0, 0, 0]  # the first round has nothing from the swarm yet
    assert sum(sum(r["peer_asked"]) for r in rounds[1:]) > 0
    assert all(a <= 1 for r in rounds for a in r["peer_asked"])  # 0.5 of B = 2 questions
    asked = informative = aside = 0
    for k in range(3):
        for line in (tmp_path / "out" / "mix-2-1" / f"node-{k}" / "metrics.jsonl").read_text().splitlines():
            metrics = json.loads(line)
            asked += metrics["peer_asked"]
            informative += metrics["peer_asked_informative"]
            aside += metrics["swarm"]["not_picked"]
            assert metrics["external_groups"] <= 1  # J = 1 trained on; the questions' items are not
    assert informative <= asked <= aside  # each asked question's item was counted (and receipted) as not picked
    assert experiment._held_out_texts()  # the experiment hands its held-out set to every node (never asked)
