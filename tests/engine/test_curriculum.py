"""Adaptive difficulty (engine/questions/curriculum.py): levels follow the window's all-pass and all-fail groups and
do not flap, weights keep a floor, a specialty that cannot go easier is excluded but retried, skipping keeps exploring,
the state survives a resume (and version 1 is still read), and fixed mode draws exactly what it drew before.

Run: .venv/bin/python -m pytest tests/engine/test_curriculum.py -q
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import CheckpointError, ConfigError, TaskError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.common.presets import SAPO_SPECIALTIES
from engine.node.loop import Node
from engine.questions.configs import DEFAULT_DATASET_CONFIGS
from engine.questions.curriculum import (
    EXCLUDE_AFTER,
    EXCLUDED_SHARE,
    FLOOR,
    KEEP_MIN,
    LADDERS,
    MIN_GROUPS,
    RETURN_GROUPS,
    WINDOW_GROUPS,
    Curriculum,
    curriculum_for,
    harder_configs,
    keep_probability,
    level_config,
)
from engine.questions.tasks import TaskRef, TaskSet

FAIL, PASS, MIXED = [0.0] * 8, [1.0] * 8, [1.0, 0.0] * 4
EVEN = dict.fromkeys(SAPO_SPECIALTIES, 1.0)


def rounds(curriculum: Curriculum, specialty: str, rewards: list[float], n: int) -> None:
    for _ in range(n):
        curriculum.observe([(specialty, rewards)])


# -- the ladders -------------------------------------------------------------------------


def test_level_0_is_the_default_config_and_every_level_differs_from_its_neighbours() -> None:
    for name in SAPO_SPECIALTIES:
        ladder = LADDERS[name]
        assert level_config(name, 0) == dict(DEFAULT_DATASET_CONFIGS[name])
        configs = [level_config(name, level) for level in range(ladder.lowest, ladder.highest + 1)]
        assert all(a != b for a, b in itertools.pairwise(configs)), name
        assert ladder.highest >= 1, f"{name} needs a level 1 for the harder held-out set"


@pytest.mark.parametrize("specialty", SAPO_SPECIALTIES)
def test_every_level_passes_the_ref_rules_and_reasoning_gym_and_builds(specialty: str) -> None:
    ladder = LADDERS[specialty]
    for level in range(ladder.lowest, ladder.highest + 1):
        config = level_config(specialty, level)
        taskset = TaskSet({specialty: 1.0}, {specialty: config})  # runs reasoning-gym's own checks
        question = taskset.rebuild(TaskRef.create(specialty, config, seed=3, index=level + 10))
        assert question.text


def test_a_base_conversion_range_of_one_base_is_refused_before_it_can_hang_a_rebuild() -> None:
    for config in ({"min_base": 5, "max_base": 5}, {"max_base": 2}):
        with pytest.raises(TaskError, match="min_base must be below"):
            TaskRef.create("base_conversion", config, seed=0, index=0)


# -- levels ------------------------------------------------------------------------------


def test_a_level_goes_down_when_every_answer_fails_and_up_when_every_answer_passes() -> None:
    curriculum = Curriculum(["base_conversion", "bf"])
    rounds(curriculum, "base_conversion", FAIL, MIN_GROUPS)
    rounds(curriculum, "bf", PASS, MIN_GROUPS)
    assert curriculum.levels == {"base_conversion": -1, "bf": 1}
    assert curriculum.configs()["base_conversion"] == level_config("base_conversion", -1)
    assert curriculum.configs()["bf"] == {"difficulty": 2}


def test_a_level_needs_a_window_and_holds_while_groups_teach_or_split_evenly() -> None:
    curriculum = Curriculum(["base_conversion", "binary_matrix", "arc_1d", "bf"])
    curriculum.observe([("base_conversion", FAIL)])
    assert curriculum.levels["base_conversion"] == 0  # one group is not yet a window
    rounds(curriculum, "base_conversion", MIXED, 10)
    assert curriculum.levels["base_conversion"] == 0  # informative groups: the level is right
    for _ in range(10):  # half the questions solved by every answer, half by none: a pass rate of 50%
        curriculum.observe([("binary_matrix", PASS), ("binary_matrix", FAIL)])
    assert curriculum.levels["binary_matrix"] == 0
    rounds(curriculum, "arc_1d", FAIL, 10)
    rounds(curriculum, "bf", PASS, 10)
    assert curriculum.levels["arc_1d"] == LADDERS["arc_1d"].lowest == 0
    assert curriculum.levels["bf"] == LADDERS["bf"].highest


def test_a_level_moves_on_a_majority_of_all_same_groups_not_on_the_pass_rate() -> None:
    curriculum = Curriculum(["base_conversion", "binary_matrix"])
    # a pass rate of 30% at the end, inside the first pass's 20-80% band, but 3 of 5 groups all failed
    curriculum.observe([("base_conversion", [1.0] * 6 + [0.0] * 2), ("base_conversion", FAIL)])
    curriculum.observe([("base_conversion", [1.0] * 6 + [0.0] * 2), ("base_conversion", FAIL)])
    assert curriculum.levels["base_conversion"] == 0  # 2 of 4 all failed: not more than half
    curriculum.observe([("base_conversion", FAIL)])
    assert curriculum.levels["base_conversion"] == -1
    # answers that all score 0.0 for the answer but vary in partial credit still teach: not all-fail
    rounds(curriculum, "binary_matrix", [0.0, 0.05] * 4, 6)
    assert curriculum.levels["binary_matrix"] == 0


def test_with_train_on_passed_partial_credit_alone_is_failing_and_no_signal() -> None:
    config = build_config(overrides=["tasks.difficulty='adaptive'", "grpo.train_on='passed'"])
    curriculum = curriculum_for(config, ["fraction_simplification", "basic_arithmetic", "bf"])
    assert curriculum is not None and curriculum.train_on == "passed"
    echo = [0.1, 0.05, 0.1, 0.05, 0.1, 0.1, 0.05, 0.1]  # a fraction that repeats the question's numbers
    rounds(curriculum, "fraction_simplification", echo, MIN_GROUPS)
    assert curriculum.levels["fraction_simplification"] == -1  # no pass: the level goes down
    assert curriculum.streaks == {("fraction_simplification", 0): MIN_GROUPS}  # and it was all-same for skipping
    rounds(curriculum, "basic_arithmetic", [1.0, 0.0] * 4, MIN_GROUPS)
    assert curriculum.signal("basic_arithmetic") > 0.5 and curriculum.levels["basic_arithmetic"] == 0
    rounds(curriculum, "bf", echo, 1)
    assert curriculum.signal("bf") < 0.5  # a group the node does not train on is no signal
    back = Curriculum.from_state(json.loads(json.dumps(curriculum.to_state())), curriculum.specialties,
                                 train_on="passed")
    assert back.to_state() == curriculum.to_state() and back.signal("bf") == curriculum.signal("bf")
    old = Curriculum(["fraction_simplification"])  # 'informative': the same groups teach, as before the setting
    rounds(old, "fraction_simplification", echo, MIN_GROUPS)
    assert old.levels["fraction_simplification"] == 0 and old.streaks == {}


def test_a_level_does_not_flap_on_an_alternating_signal() -> None:
    curriculum = Curriculum(["propositional_logic"])
    for outcome in itertools.islice(itertools.cycle([PASS, FAIL]), 40):  # one group a round, all-pass then all-fail
        curriculum.observe([("propositional_logic", outcome)])
    assert curriculum.levels["propositional_logic"] == 0

    curriculum = Curriculum(["propositional_logic"])
    moves = []
    for outcome in itertools.islice(itertools.cycle([PASS, PASS, FAIL, FAIL]), 80):  # two of each in a row
        moves += curriculum.observe([("propositional_logic", outcome)])
    ups = [m for m in moves if m.new > m.old]
    assert len(ups) == len(RETURN_GROUPS)  # once, once more after a longer window, then never again
    assert len(moves) == 2 * len(ups)  # each up came down again once
    assert curriculum.up_needs("propositional_logic") == WINDOW_GROUPS == RETURN_GROUPS[-1]
    assert [m.groups for m in ups] == [MIN_GROUPS, RETURN_GROUPS[0] + MIN_GROUPS]


def test_going_back_up_to_a_level_left_downward_needs_a_longer_window() -> None:
    curriculum = Curriculum(["bf"])
    rounds(curriculum, "bf", PASS, MIN_GROUPS)
    rounds(curriculum, "bf", FAIL, MIN_GROUPS)
    assert curriculum.levels["bf"] == 0 and curriculum.left_down == {("bf", 1): 1}
    assert curriculum.up_needs("bf") == RETURN_GROUPS[0]
    rounds(curriculum, "bf", PASS, RETURN_GROUPS[0] - 1)
    assert curriculum.levels["bf"] == 0
    rounds(curriculum, "bf", PASS, 1)
    assert curriculum.levels["bf"] == 1


def test_a_pinned_specialty_keeps_its_config_and_level() -> None:
    config = build_config(overrides=["tasks.difficulty='adaptive'", "tasks.dataset_configs={bf={difficulty=2}}"])
    tasks = config.tasks
    curriculum = curriculum_for(config, ["bf", "arc_1d"])
    assert curriculum is not None
    rounds(curriculum, "bf", FAIL, 5)
    assert curriculum.levels["bf"] == 0 and "bf" not in curriculum.configs()
    assert set(harder_configs(tasks, ["bf", "arc_1d"])) == {"arc_1d"}


# -- weights and skipping ----------------------------------------------------------------


def test_weights_follow_the_signal_and_keep_their_floor() -> None:
    curriculum = Curriculum(SAPO_SPECIALTIES)
    rounds(curriculum, "basic_arithmetic", MIXED, WINDOW_GROUPS)
    rounds(curriculum, "bf", PASS, 20)  # at its highest level: it stays, all-same
    shares = curriculum.weights(EVEN)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert min(shares.values()) >= FLOOR / len(SAPO_SPECIALTIES) - 1e-12
    assert shares["bf"] == pytest.approx(FLOOR / len(SAPO_SPECIALTIES))
    assert shares["basic_arithmetic"] == max(shares.values())
    assert shares["arc_1d"] < shares["basic_arithmetic"]  # untried: a signal of one half


def test_a_specialty_that_fails_at_its_lowest_level_is_excluded_and_retried() -> None:
    curriculum = Curriculum(SAPO_SPECIALTIES)
    rounds(curriculum, "arc_1d", FAIL, EXCLUDE_AFTER - 1)  # no level below 0
    rounds(curriculum, "base_conversion", FAIL, EXCLUDE_AFTER)  # goes down to -2 first: 4 of its groups count
    assert curriculum.levels["base_conversion"] == LADDERS["base_conversion"].lowest == -2
    assert not curriculum.excluded("arc_1d") and not curriculum.excluded("base_conversion")
    rounds(curriculum, "arc_1d", FAIL, 1)
    assert curriculum.excluded("arc_1d")
    shares = curriculum.weights(EVEN)
    assert shares["arc_1d"] == pytest.approx(EXCLUDED_SHARE / len(SAPO_SPECIALTIES)) and sum(shares.values()) == 1.0
    assert min(s for name, s in shares.items() if name != "arc_1d") >= FLOOR / len(SAPO_SPECIALTIES) - 1e-12
    assert curriculum.report(EVEN)["arc_1d"]["excluded"] is True
    curriculum.observe([("arc_1d", [0.0, 0.05] * 4)])  # a retry whose partial credit differs: it teaches again
    assert not curriculum.excluded("arc_1d") and curriculum.failing == {"base_conversion": 4}


def test_an_excluded_specialty_is_drawn_now_and_then_and_every_one_excluded_is_no_one() -> None:
    pair = {"arc_1d": 1.0, "basic_arithmetic": 1.0}
    curriculum = Curriculum(list(pair))
    rounds(curriculum, "arc_1d", FAIL, EXCLUDE_AFTER)
    taskset = TaskSet(pair, seed=2)
    drawn = [q.ref.dataset for r in range(1, 201) for q in taskset.draw(r, 8, **curriculum.plan(pair))]
    assert 0 < drawn.count("arc_1d") / 200 < 2 * 8 * EXCLUDED_SHARE / len(pair)  # about 0.4 a round
    rounds(curriculum, "basic_arithmetic", FAIL, EXCLUDE_AFTER)
    assert curriculum.weights(pair) == pytest.approx({"arc_1d": 0.5, "basic_arithmetic": 0.5})


def test_the_configured_weights_are_the_prior() -> None:
    curriculum = Curriculum(["bf", "arc_1d"])
    shares = curriculum.weights({"bf": 3.0, "arc_1d": 1.0})
    assert shares == pytest.approx({"bf": 0.75, "arc_1d": 0.25})


def test_the_keep_probability_decays_with_all_same_rounds_but_never_reaches_zero() -> None:
    values = [keep_probability(streak) for streak in range(50)]
    assert values[0] == 1.0 and values == sorted(values, reverse=True)
    assert min(values) == KEEP_MIN > 0


def test_skipping_is_per_kind_reset_by_an_informative_group_and_keeps_exploring() -> None:
    curriculum = Curriculum(["bf", "basic_arithmetic"])
    rounds(curriculum, "bf", FAIL, 3)
    assert curriculum.streaks == {("bf", 0): 3}
    curriculum.observe([("bf", MIXED)])
    assert curriculum.streaks == {}
    rounds(curriculum, "bf", PASS, 30)  # up once 5 of 9 groups all passed, then all-pass at its highest level
    assert curriculum.streaks == {("bf", 0): 5, ("bf", 1): 25}
    rounds(curriculum, "basic_arithmetic", MIXED, 30)
    taskset = TaskSet({"bf": 1.0, "basic_arithmetic": 1.0}, seed=1)
    plan = curriculum.plan({"bf": 1.0, "basic_arithmetic": 1.0})
    drawn = [q.ref.dataset for r in range(1, 17) for q in taskset.draw(r, 4, **plan)]
    assert 0 < drawn.count("bf") < drawn.count("basic_arithmetic")


# -- state -------------------------------------------------------------------------------


def test_the_state_round_trips_through_json() -> None:
    curriculum = Curriculum(SAPO_SPECIALTIES)
    rounds(curriculum, "base_conversion", FAIL, 3)
    rounds(curriculum, "propositional_logic", PASS, 2)
    rounds(curriculum, "propositional_logic", FAIL, 2)  # level 1 left downward
    rounds(curriculum, "basic_arithmetic", MIXED, 6)
    rounds(curriculum, "arc_1d", FAIL, EXCLUDE_AFTER)  # excluded
    state = json.loads(json.dumps(curriculum.to_state()))
    assert state["version"] == 2 and state["left_down"] == [["base_conversion", 0, 1], ["propositional_logic", 1, 1]]
    assert state["failing"] == {"arc_1d": EXCLUDE_AFTER}
    again = Curriculum.from_state(state, SAPO_SPECIALTIES)
    assert again.to_state() == curriculum.to_state()
    assert again.plan(EVEN) == curriculum.plan(EVEN)
    for it in (curriculum, again):  # and they go on alike
        rounds(it, "propositional_logic", PASS, RETURN_GROUPS[0])
        rounds(it, "arc_1d", MIXED, 1)
    assert again.to_state() == curriculum.to_state() and again.levels["propositional_logic"] == 1


# A first-pass checkpoint's state (diff-s0-adaptive, node 0, round 40), shortened.
VERSION_1 = {"version": 1, "levels": {"arc_1d": 0, "base_conversion": -2, "propositional_logic": 2},
             "streaks": [["arc_1d", 0, 11], ["base_conversion", -1, 1], ["propositional_logic", 2, 3]],
             "windows": {"arc_1d": [[0, 8, 0]] * 4, "propositional_logic": [[1, 8, 1], [8, 8, 0], [8, 8, 0]]}}


def test_a_version_1_state_is_read_with_no_levels_left_downward_and_nothing_excluded() -> None:
    curriculum = Curriculum.from_state(json.loads(json.dumps(VERSION_1)), SAPO_SPECIALTIES)
    state = curriculum.to_state()
    assert state["version"] == 2 and state["left_down"] == [] and state["failing"] == {}
    assert {name: state["levels"][name] for name in VERSION_1["levels"]} == VERSION_1["levels"]
    assert state["streaks"] == VERSION_1["streaks"]
    assert state["windows"]["propositional_logic"] == VERSION_1["windows"]["propositional_logic"]
    curriculum.observe([("propositional_logic", PASS)])  # 3 of its 4 groups all passed, 2 more than all failed
    assert curriculum.levels["propositional_logic"] == 3


@pytest.mark.parametrize(
    "state",
    [None, [], {"version": 99}, {"version": 1, "levels": {"bf": 7}, "windows": {}, "streaks": []},
     {"version": 1, "levels": {}, "windows": {"bf": [[9, 8, 1]]}, "streaks": []},
     {"version": 1, "levels": {"bf": "1"}, "windows": {}, "streaks": []},
     {"version": 2, "levels": {}, "windows": {}, "streaks": []},
     {"version": 2, "levels": {}, "windows": {}, "streaks": [], "left_down": [["bf", 5, 1]], "failing": {}},
     {"version": 2, "levels": {}, "windows": {}, "streaks": [], "left_down": [["bf", 1, 0]], "failing": {}},
     {"version": 2, "levels": {}, "windows": {}, "streaks": [], "left_down": [], "failing": {"bf": -1}}],
)
def test_a_malformed_state_is_a_checkpoint_error(state: Any) -> None:
    with pytest.raises(CheckpointError):
        Curriculum.from_state(state, SAPO_SPECIALTIES)


def test_a_malformed_state_in_a_checkpoint_starts_the_levels_afresh_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = build_config(overrides=["tasks.difficulty='adaptive'"])
    curriculum = curriculum_for(config, SAPO_SPECIALTIES, {"version": 1})
    assert curriculum is not None and set(curriculum.levels.values()) == {0}
    assert "starts again at level 0" in caplog.text
    assert curriculum_for(NodeConfig(), SAPO_SPECIALTIES, curriculum.to_state()) is None


# -- configuration -----------------------------------------------------------------------


def test_difficulty_is_fixed_by_default_and_in_the_paper_preset() -> None:
    assert NodeConfig().tasks.difficulty == "fixed" and NodeConfig().tasks.eval_harder is False
    assert build_config("paper").tasks.difficulty == "fixed"
    assert build_config(overrides=["tasks.difficulty='adaptive'"]).tasks.difficulty == "adaptive"


@pytest.mark.parametrize(("override", "needle"),
                         [("tasks.difficulty='hard'", "tasks.difficulty must be one of fixed, adaptive"),
                                                  ("tasks.eval_harder=1", "tasks.eval_harder must be true or false")])
def test_bad_values_are_one_sentence_naming_the_key(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_config(overrides=[override])


# -- fixed mode is today's draw ------------------------------------------------------------

# TaskSet.draw of the default weights and configs, seed 0, as drawn before adaptive difficulty existed.
TODAYS_DRAW = {
    1: ["fraction_simplification", "base_conversion", "calendar_arithmetic", "basic_arithmetic",
        "calendar_arithmetic", "calendar_arithmetic", "basic_arithmetic", "basic_arithmetic"],
    2: ["base_conversion", "binary_matrix", "calendar_arithmetic", "calendar_arithmetic", "basic_arithmetic",
        "basic_arithmetic", "fraction_simplification", "arc_1d"],
    3: ["calendar_arithmetic", "fraction_simplification", "propositional_logic", "basic_arithmetic",
        "basic_arithmetic", "binary_matrix", "base_conversion", "calendar_arithmetic"],
}


def test_the_fixed_draw_is_todays() -> None:
    tasks = NodeConfig().tasks
    taskset = TaskSet(tasks.specialties, tasks.dataset_configs, seed=0)
    for round_index, names in TODAYS_DRAW.items():
        refs = [q.ref for q in taskset.draw(round_index, 8)]
        assert [r.dataset for r in refs] == names
        assert [r.index for r in refs] == list(range(round_index * 1024, round_index * 1024 + 8))
        assert all(dict(r.config) == dict(DEFAULT_DATASET_CONFIGS[r.dataset]) and r.seed == 0 for r in refs)


def test_the_harder_held_out_set_is_the_same_items_one_level_up() -> None:
    taskset = TaskSet(EVEN, seed=4)
    plain, harder = taskset.eval_set(18), taskset.eval_set(18, harder_configs(NodeConfig().tasks, taskset.specialties))
    assert [(q.ref.dataset, q.ref.seed, q.ref.index) for q in plain] == [(q.ref.dataset, q.ref.seed, q.ref.index)
                                                                         for q in harder]
    assert all(dict(q.ref.config) == level_config(q.ref.dataset, 1) for q in harder)


# -- the round loop (a tiny random model) --------------------------------------------------

FAST = ["tasks.questions_per_round=4", "tasks.completions_per_question=3", "tasks.max_new_tokens=8",
        "tasks.eval_every=0", "tasks.eval_questions=3", "grpo.micro_batch=4", "run.device='cpu'", "run.seed=5",
        "tasks.specialties={base_conversion=1.0, basic_arithmetic=1.0}"]


def reward(question: Any, completion: str) -> float:
    """base_conversion always fails (its level must go down), bf always passes (up); the other scores the
    completion's parity."""
    name = question.ref.dataset
    return 0.0 if name == "base_conversion" else 1.0 if name == "bf" else float(len(completion) % 2)


def make_node(model_dir: Path, home: Path, *extra: str, events: list[Event] | None = None) -> Node:
    config = build_config("default", None, [*FAST, f"model.source='{model_dir}'", *extra])
    node = Node(config, Paths.under(home), (events if events is not None else []).append)
    node.taskset.reward = reward  # type: ignore[method-assign]
    node.setup()
    node.taskset.reward = reward  # type: ignore[method-assign]
    return node


def test_fixed_mode_keeps_no_curriculum_and_measures_the_harder_set_when_asked(tiny_model_dir: Path,
                                                                               home: Path) -> None:
    node = make_node(tiny_model_dir, home, "tasks.eval_harder=true")
    assert node.curriculum is None
    _, questions, _ = node.start_round()
    assert [q.ref for q in questions] == [q.ref for q in node.taskset.draw(1, 4)]
    metrics = node.run_round()
    assert "curriculum" not in metrics and "level_changes" not in metrics
    state = json.loads((node.checkpoint_root / "round-000001" / "state.json").read_text())
    assert "curriculum" not in state
    record = node.evaluate()
    assert record["questions"] == record["harder"]["questions"] == 3


def test_adaptive_levels_move_are_logged_and_survive_a_resume(
    tiny_model_dir: Path, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="engine.questions.curriculum")
    events: list[Event] = []
    three = ["tasks.difficulty='adaptive'", "tasks.specialties={base_conversion=1.0, basic_arithmetic=1.0, bf=1.0}"]
    straight = make_node(tiny_model_dir, home, *three, events=events)
    for _ in range(3):
        metrics = straight.run_round()
    assert straight.curriculum is not None
    assert straight.curriculum.levels["base_conversion"] < 0 and straight.curriculum.levels["bf"] == 1
    assert "Curriculum: base_conversion level +0 -> -1 (2 of its last 2 groups all failed; pass rate 0%)" in caplog.text
    assert "Curriculum: bf level +0 -> +1 (" in caplog.text
    assert set(metrics["curriculum"]) == {"base_conversion", "basic_arithmetic", "bf"}
    assert {"level", "pass_rate", "weight", "excluded"} == set(metrics["curriculum"]["base_conversion"])
    rounds_seen = [e["metrics"] for e in events if e["type"] == "round"]
    assert any(m["level_changes"] for m in rounds_seen)

    resumed = make_node(tiny_model_dir, home, *three)
    assert resumed.round == 3 and resumed.curriculum is not None
    assert resumed.curriculum.to_state() == straight.curriculum.to_state()
    assert resumed.curriculum.left_down == straight.curriculum.left_down != {}
    assert [q.ref for q in resumed.start_round()[1]] == [q.ref for q in straight.start_round()[1]]
