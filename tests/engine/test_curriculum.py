"""Adaptive difficulty (engine/curriculum.py): levels follow the pass rate, weights keep a floor, skipping
keeps exploring, the state survives a resume, and fixed mode draws exactly what it drew before.

Run: .venv/bin/python -m pytest tests/engine/test_curriculum.py -q
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from engine.common.config import SAPO_SPECIALTIES, NodeConfig, build_config
from engine.common.errors import CheckpointError, ConfigError, TaskError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.curriculum import (
    FLOOR,
    KEEP_MIN,
    LADDERS,
    MIN_GROUPS,
    WINDOW_GROUPS,
    Curriculum,
    curriculum_for,
    harder_configs,
    keep_probability,
    level_config,
)
from engine.sapo import Node
from engine.task_configs import DEFAULT_DATASET_CONFIGS
from engine.tasks import TaskRef, TaskSet

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


def test_a_level_needs_a_window_and_stays_inside_the_band_and_the_ladder() -> None:
    curriculum = Curriculum(["base_conversion", "arc_1d", "bf"])
    curriculum.observe([("base_conversion", FAIL)])
    assert curriculum.levels["base_conversion"] == 0  # one group is not yet a window
    rounds(curriculum, "base_conversion", MIXED, 10)
    assert curriculum.levels["base_conversion"] == 0  # 50% is inside the band
    rounds(curriculum, "arc_1d", FAIL, 10)
    rounds(curriculum, "bf", PASS, 10)
    assert curriculum.levels["arc_1d"] == LADDERS["arc_1d"].lowest == 0
    assert curriculum.levels["bf"] == LADDERS["bf"].highest


def test_a_level_change_empties_the_window_and_is_reported() -> None:
    curriculum = Curriculum(["binary_matrix"])
    curriculum.observe([("binary_matrix", FAIL)])
    [change] = curriculum.observe([("binary_matrix", FAIL)])
    assert (change.specialty, change.old, change.new, change.pass_rate, change.answers) == ("binary_matrix", 0, -1, 0.0,
                                                                                            16)
    assert curriculum.pass_rate("binary_matrix") is None
    report = curriculum.report({"binary_matrix": 1.0})
    assert report == {"binary_matrix": {"level": -1, "pass_rate": None, "weight": 1.0}}


def test_a_pinned_specialty_keeps_its_config_and_level() -> None:
    tasks = build_config(overrides=["tasks.difficulty='adaptive'", "tasks.dataset_configs={bf={difficulty=2}}"]).tasks
    curriculum = curriculum_for(tasks, ["bf", "arc_1d"])
    assert curriculum is not None
    rounds(curriculum, "bf", FAIL, 5)
    assert curriculum.levels["bf"] == 0 and "bf" not in curriculum.configs()
    assert set(harder_configs(tasks, ["bf", "arc_1d"])) == {"arc_1d"}


# -- weights and skipping ----------------------------------------------------------------


def test_weights_follow_the_signal_and_keep_their_floor() -> None:
    curriculum = Curriculum(SAPO_SPECIALTIES)
    rounds(curriculum, "basic_arithmetic", MIXED, WINDOW_GROUPS)
    rounds(curriculum, "arc_1d", FAIL, 20)  # at its lowest level: it stays, all-same
    shares = curriculum.weights(EVEN)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert min(shares.values()) >= FLOOR / len(SAPO_SPECIALTIES) - 1e-12
    assert shares["arc_1d"] == pytest.approx(FLOOR / len(SAPO_SPECIALTIES))
    assert shares["basic_arithmetic"] == max(shares.values())
    assert shares["bf"] < shares["basic_arithmetic"]  # untried: a signal of one half


def test_the_configured_weights_are_the_prior() -> None:
    curriculum = Curriculum(["bf", "arc_1d"])
    shares = curriculum.weights({"bf": 3.0, "arc_1d": 1.0})
    assert shares == pytest.approx({"bf": 0.75, "arc_1d": 0.25})


def test_the_keep_probability_decays_with_all_same_rounds_but_never_reaches_zero() -> None:
    values = [keep_probability(streak) for streak in range(50)]
    assert values[0] == 1.0 and values == sorted(values, reverse=True)
    assert min(values) == KEEP_MIN > 0


def test_skipping_is_per_kind_reset_by_an_informative_group_and_keeps_exploring() -> None:
    curriculum = Curriculum(["arc_1d", "basic_arithmetic"])
    rounds(curriculum, "arc_1d", FAIL, 3)
    assert curriculum.streaks == {("arc_1d", 0): 3}
    curriculum.observe([("arc_1d", MIXED)])
    assert curriculum.streaks == {}
    rounds(curriculum, "arc_1d", FAIL, 30)
    rounds(curriculum, "basic_arithmetic", MIXED, 30)
    taskset = TaskSet({"arc_1d": 1.0, "basic_arithmetic": 1.0}, seed=1)
    plan = curriculum.plan({"arc_1d": 1.0, "basic_arithmetic": 1.0})
    drawn = [q.ref.dataset for r in range(1, 17) for q in taskset.draw(r, 4, **plan)]
    assert 0 < drawn.count("arc_1d") < drawn.count("basic_arithmetic")


# -- state -------------------------------------------------------------------------------


def test_the_state_round_trips_through_json() -> None:
    curriculum = Curriculum(SAPO_SPECIALTIES)
    rounds(curriculum, "base_conversion", FAIL, 3)
    rounds(curriculum, "propositional_logic", PASS, 2)
    rounds(curriculum, "basic_arithmetic", MIXED, 6)
    state = json.loads(json.dumps(curriculum.to_state()))
    again = Curriculum.from_state(state, SAPO_SPECIALTIES)
    assert again.to_state() == curriculum.to_state()
    assert again.plan(EVEN) == curriculum.plan(EVEN)


@pytest.mark.parametrize(
    "state",
    [None, [], {"version": 99}, {"version": 1, "levels": {"bf": 7}, "windows": {}, "streaks": []},
     {"version": 1, "levels": {}, "windows": {"bf": [[9, 8, 1]]}, "streaks": []},
     {"version": 1, "levels": {"bf": "1"}, "windows": {}, "streaks": []}],
)
def test_a_malformed_state_is_a_checkpoint_error(state: Any) -> None:
    with pytest.raises(CheckpointError):
        Curriculum.from_state(state, SAPO_SPECIALTIES)


def test_a_malformed_state_in_a_checkpoint_starts_the_levels_afresh_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = build_config(overrides=["tasks.difficulty='adaptive'"]).tasks
    curriculum = curriculum_for(tasks, SAPO_SPECIALTIES, {"version": 1})
    assert curriculum is not None and set(curriculum.levels.values()) == {0}
    assert "starts again at level 0" in caplog.text
    assert curriculum_for(NodeConfig().tasks, SAPO_SPECIALTIES, curriculum.to_state()) is None


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
    """base_conversion always fails (its level must go down); the other scores the completion's parity."""
    return 0.0 if question.ref.dataset == "base_conversion" else float(len(completion) % 2)


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
    caplog.set_level(logging.INFO, logger="engine.curriculum")
    events: list[Event] = []
    straight = make_node(tiny_model_dir, home, "tasks.difficulty='adaptive'", events=events)
    straight.run_round()
    metrics = straight.run_round()
    assert straight.curriculum is not None and straight.curriculum.levels["base_conversion"] < 0
    assert "Curriculum: base_conversion level +0 -> -1 (pass rate 0%" in caplog.text
    assert set(metrics["curriculum"]) == {"base_conversion", "basic_arithmetic"}
    assert {"level", "pass_rate", "weight"} == set(metrics["curriculum"]["base_conversion"])
    rounds_seen = [e["metrics"] for e in events if e["type"] == "round"]
    assert any(m["level_changes"] for m in rounds_seen)

    resumed = make_node(tiny_model_dir, home, "tasks.difficulty='adaptive'")
    assert resumed.round == 2 and resumed.curriculum is not None
    assert resumed.curriculum.to_state() == straight.curriculum.to_state()
    assert [q.ref for q in resumed.start_round()[1]] == [q.ref for q in straight.start_round()[1]]
