"""Re-asking the questions that taught (engine/questions/frontier.py): only informative own training questions join the
frontier, each is re-asked at most reask_max times and leaves when it comes back all-same, the state survives a
resume exactly, held-out questions never get in, and a tiny-model node re-asks its previous round's mixed questions.

Run: .venv/bin/python -m pytest tests/engine/test_frontier.py -q
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import CheckpointError, ConfigError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.node.loop import Node
from engine.questions.frontier import FRONTIER_SIZE, Frontier, frontier_for
from engine.questions.tasks import Question, TaskRef, TaskSet
from engine.rollouts.groups import Group, group_advantages

SEED = 5
FAIL, PASS, MIXED = [0.0] * 4, [1.0] * 4, [1.0, 0.0, 0.0, 1.0]


def ref(index: int, seed: int = SEED) -> TaskRef:
    return TaskRef.create("basic_arithmetic", {}, seed, index)


def group(r: TaskRef, rewards: list[float]) -> Group:
    return Group(Question(r, "q", "a", {}), [], [], rewards, group_advantages(rewards, 1e-4))


def test_only_informative_own_groups_join_oldest_first() -> None:
    frontier = Frontier(SEED, reask_max=3)
    report = frontier.follow(1, [group(ref(1), MIXED), group(ref(2), FAIL), group(ref(3), PASS),
                                 group(ref(4), MIXED)])
    assert report == {"reasked": 0, "reasked_informative": 0, "frontier": 2}
    frontier.follow(2, [group(ref(1025), MIXED)])
    assert frontier.pick(2) == [ref(1), ref(4)] and frontier.pick(8) == [ref(1), ref(4), ref(1025)]
    assert frontier.pick(0) == [] and frontier.pick(8, ["bf"]) == []  # a specialty turned off is not re-asked


def test_a_question_is_re_asked_at_most_reask_max_times_and_leaves_when_it_comes_back_all_same() -> None:
    frontier = Frontier(SEED, reask_max=2)
    frontier.follow(1, [group(ref(1), MIXED), group(ref(2), MIXED)])
    report = frontier.follow(2, [group(ref(1), MIXED), group(ref(2), PASS)])
    assert report == {"reasked": 2, "reasked_informative": 1, "frontier": 1}
    assert frontier.pick(4) == [ref(1)] and frontier.entries[0].asks == 1
    report = frontier.follow(3, [group(ref(1), MIXED)])  # its second re-ask taught, but that was the last
    assert report == {"reasked": 1, "reasked_informative": 1, "frontier": 0}


def test_the_frontier_keeps_the_newest_when_full() -> None:
    frontier = Frontier(SEED, reask_max=3)
    for round_index in range(1, 12):
        frontier.follow(round_index, [group(ref(round_index * 1024 + s), MIXED) for s in range(8)])
    assert len(frontier) == FRONTIER_SIZE
    assert frontier.entries[0].ref == ref(4 * 1024) and frontier.entries[-1].ref == ref(11 * 1024 + 7)


def test_held_out_and_other_seeds_questions_never_join_nor_come_back_from_a_checkpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    held_out = TaskSet({"basic_arithmetic": 1.0}, seed=SEED).eval_set(3)
    assert all(q.ref.seed != SEED for q in held_out)
    frontier = Frontier(SEED, reask_max=3)
    frontier.follow(1, [group(q.ref, MIXED) for q in held_out] + [group(ref(7, seed=SEED + 1), MIXED)])
    assert len(frontier) == 0
    state = {"version": 1, "entries": [{"ref": held_out[0].ref.to_json(), "first_round": 1, "asks": 0}]}
    with pytest.raises(CheckpointError, match="not this node's training seed"):
        Frontier.from_state(state, SEED, 3)
    config = build_config(overrides=["tasks.reask_share=0.5"])
    restored = frontier_for(config, SEED, state)
    assert restored is not None and len(restored) == 0 and "empty frontier" in caplog.text


@pytest.mark.parametrize("state", [None, {"version": 2, "entries": []}, {"version": 1},
                                   {"version": 1, "entries": [{"ref": {}, "first_round": 1, "asks": 0}]},
                                   {"version": 1, "entries": [{"ref": ref(1).to_json(), "first_round": 1,
                                                               "asks": -1}]}])
def test_a_malformed_state_is_a_checkpoint_error(state: Any) -> None:
    with pytest.raises(CheckpointError):
        Frontier.from_state(state, SEED, 3)


def test_with_train_on_passed_a_group_of_partial_credits_alone_does_not_join_or_keep_a_question() -> None:
    partial, passing = [0.0, 0.1, 0.1, 0.0], [1.0, 0.1, 0.0, 0.0]
    frontier = frontier_for(build_config(overrides=["tasks.reask_share=0.5", "grpo.train_on='passed'"]), SEED)
    assert frontier is not None and frontier.train_on == "passed"
    assert frontier.follow(1, [group(ref(1), partial), group(ref(2), passing)])["frontier"] == 1
    assert frontier.pick(4) == [ref(2)]
    report = frontier.follow(2, [group(ref(2), partial)])  # asked again, it differed by partial credit alone
    assert report == {"reasked": 1, "reasked_informative": 0, "frontier": 0}
    old = Frontier(SEED, reask_max=3)  # 'informative' keeps both, as before the setting
    assert old.follow(1, [group(ref(1), partial), group(ref(2), passing)])["frontier"] == 2


def test_the_state_round_trips_through_json() -> None:
    frontier = Frontier(SEED, reask_max=3)
    frontier.follow(1, [group(ref(1), MIXED), group(ref(2), MIXED)])
    frontier.follow(2, [group(ref(1), MIXED), group(ref(1025), MIXED)])
    back = Frontier.from_state(json.loads(json.dumps(frontier.to_state())), SEED, 3)
    assert back.to_state() == frontier.to_state() and back.pick(3) == frontier.pick(3)


def test_re_asks_are_off_by_default_and_bad_values_are_one_sentence_naming_the_key() -> None:
    assert NodeConfig().tasks.reask_share == 0 and frontier_for(NodeConfig(), SEED) is None
    for override, needle in [("tasks.reask_share=1.5", "tasks.reask_share must be a number at least 0.0"),
                             ("tasks.reask_share='half'", "tasks.reask_share must be a number"),
                             ("tasks.reask_max=0", "tasks.reask_max must be a whole number of at least 1")]:
        with pytest.raises(ConfigError, match=needle):
            build_config(overrides=[override])


# -- the round loop (a tiny random model) --------------------------------------------------

FAST = ["tasks.questions_per_round=4", "tasks.completions_per_question=3", "tasks.max_new_tokens=8",
        "tasks.eval_every=0", "tasks.eval_questions=3", "grpo.micro_batch=4", "run.device='cpu'", f"run.seed={SEED}",
        "tasks.specialties={base_conversion=1.0, basic_arithmetic=1.0}", "tasks.reask_share=0.5", "tasks.reask_max=2"]


def alternating() -> Callable[[Any, str], float]:
    """base_conversion always fails (never joins); basic_arithmetic's answers alternate 1, 0 (always mixed)."""
    calls = [0]

    def reward(question: Any, completion: str) -> float:
        if question.ref.dataset == "base_conversion":
            return 0.0
        calls[0] += 1
        return float(calls[0] % 2)

    return reward


def make_node(model_dir: Path, home: Path, seen: list[list[Group]]) -> Node:
    events: list[Event] = []
    node = Node(build_config("default", None, [*FAST, f"model.source='{model_dir}'"]), Paths.under(home), events.append)
    node.setup()
    node.taskset.reward = alternating()  # type: ignore[assignment]
    score = node.score

    def scored(*args: Any) -> list[Group]:  # each round's own groups, as scored
        seen.append(score(*args))
        return seen[-1]

    node.score = scored  # type: ignore[method-assign, assignment]
    return node


def test_a_node_re_asks_the_previous_rounds_mixed_questions_and_resumes_its_frontier(
    tiny_model_dir: Path, home: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[list[Group]] = []
    node = make_node(tiny_model_dir, home, seen)
    first = node.run_round()
    assert first["reasked"] == 0
    taught = [g.question.ref for g in seen[0] if g.informative]
    assert [r.dataset for r in taught] == ["basic_arithmetic"] * 2  # two of each specialty in a round of 4
    second = node.run_round()
    assert [g.question.ref for g in seen[1][:2]] == taught  # re-asked first, rebuilt from the refs
    assert [g.question.text for g in seen[1][:2]] == [g.question.text for g in seen[0] if g.informative]
    assert all(r.index // 1024 == 2 for r in [g.question.ref for g in seen[1][2:]])  # the rest fresh
    assert (second["reasked"], second["reasked_informative"]) == (2, 2)
    # sampled with round 2's seeds, not those of the first ask
    assert [c.text for c in seen[1][0].completions] != [c.text for g in seen[0] if g.question.ref == taught[0]
                                                         for c in g.completions]
    third = node.run_round()
    assert [g.question.ref for g in seen[2][:2]] == taught and third["reasked"] == 2
    assert node.frontier is not None and not set(node.frontier.pick(8)) & set(taught)  # re-asked reask_max times
    state = json.loads((node.checkpoint_root / "round-000003" / "state.json").read_text())
    assert state["frontier"] == node.frontier.to_state() and state["metrics"]["reasked"] == 2

    resumed = make_node(tiny_model_dir, home, [])
    assert resumed.round == 3 and resumed.frontier is not None
    assert resumed.frontier.to_state() == node.frontier.to_state()
    assert [q.ref for q in resumed.start_round()[1]] == [q.ref for q in node.start_round()[1]]
