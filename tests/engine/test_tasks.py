"""Tests for engine.questions.tasks: refs rebuild identically anywhere, draws are deterministic,
the held-out set is disjoint from training, and rewards match each dataset's scorer.

Run: .venv/bin/python -m pytest tests/engine/test_tasks.py -q
"""

from __future__ import annotations

import decimal
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.common.errors import TaskError
from engine.questions.configs import DEFAULT_DATASET_CONFIGS
from engine.questions.tasks import (
    EVAL_SEED_OFFSET,
    MAX_COMPLETION_CHARS,
    MAX_TASK_INDEX,
    SAPO_SPECIALTIES,
    SYSTEM_PROMPT,
    Question,
    TaskRef,
    TaskSet,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
ALL = dict.fromkeys(SAPO_SPECIALTIES, 1.0)


@pytest.fixture(scope="module")
def taskset() -> TaskSet:
    return TaskSet(ALL, seed=0)


def _texts(questions: list[Question]) -> list[tuple[str, str | None]]:
    return [(q.text, q.answer) for q in questions]


def _right_answer(question: Question) -> str:
    if question.answer is not None:
        return question.answer
    # propositional_logic has no single answer; rg records a valid conclusion it found.
    return str(question.entry["metadata"]["example_answer"])


def _plus_one(question: Question) -> str:
    return str(decimal.Decimal(question.answer or "0") + 1)


# A wrong answer per specialty and the value the dataset's own scorer documents for it.
WRONG: dict[str, tuple[Callable[[Question], str], float]] = {
    "base_conversion": (lambda q: "?", 0.0),
    "basic_arithmetic": (_plus_one, 0.0),
    "arc_1d": (lambda q: "?", 0.0),
    "bf": (lambda q: "?", 0.0),
    # a well-formed conclusion the premises do not imply scores 0.05
    "propositional_logic": (lambda q: "¬" + _right_answer(q), 0.05),
    # an answer with no fraction in it scores 0.01
    "fraction_simplification": (lambda q: "?", 0.01),
    "decimal_arithmetic": (_plus_one, 0.0),
    "calendar_arithmetic": (lambda q: "?", 0.0),
    "binary_matrix": (lambda q: "?", 0.0),
}


# -- refs ------------------------------------------------------------------------------


def test_same_ref_rebuilds_same_question_on_a_fresh_taskset_with_other_weights_and_seed(taskset: TaskSet) -> None:
    questions = taskset.draw(3, 12)
    other = TaskSet({"bf": 1.0}, configs={"bf": {"difficulty": 2}}, seed=99)
    again = [other.rebuild(q.ref) for q in questions]
    assert _texts(again) == _texts(questions)
    assert [q.ref for q in again] == [q.ref for q in questions]
    assert _texts([taskset.rebuild(q.ref) for q in questions]) == _texts(questions)


@pytest.mark.integration
def test_rebuild_does_not_depend_on_what_was_built_before_even_in_a_fresh_process(taskset: TaskSet) -> None:
    questions = taskset.eval_set(18) + taskset.draw(1, 8)
    payload = json.dumps([q.ref.to_json() for q in reversed(questions)])
    script = (
        "import json, sys\n"
        "from engine.questions.tasks import TaskRef, TaskSet\n"
        "ts = TaskSet({'arc_1d': 1.0}, seed=12345)\n"
        "refs = [TaskRef.from_json(r) for r in json.loads(sys.stdin.read())]\n"
        "print(json.dumps([[q.text, q.answer] for q in map(ts.rebuild, refs)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=payload,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=True,
    )
    # stdout must be exactly the JSON: reasoning-gym's bf compiler prints, rebuild must swallow it
    rebuilt = [tuple(pair) for pair in json.loads(done.stdout)]
    assert rebuilt[::-1] == _texts(questions)


def test_rebuild_writes_nothing_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    TaskSet({"bf": 1.0}, seed=7).draw(1, 3)
    assert capsys.readouterr().out == ""


def test_rebuild_ignores_and_preserves_the_callers_decimal_context(taskset: TaskSet) -> None:
    ref = next(q.ref for q in taskset.eval_set(90) if q.ref.dataset == "decimal_arithmetic")
    expected = TaskSet({"decimal_arithmetic": 1.0}).rebuild(ref)
    with decimal.localcontext() as ctx:
        ctx.prec = 2
        again = TaskSet({"bf": 1.0}).rebuild(ref)
        assert decimal.getcontext().prec == 2
        assert taskset.reward(again, f"<answer>{expected.answer}</answer>") == 1.0
    assert (again.text, again.answer) == (expected.text, expected.answer)


def test_taskref_json_round_trip(taskset: TaskSet) -> None:
    for question in taskset.eval_set(9):
        ref = question.ref
        wire = json.loads(json.dumps(ref.to_json()))
        back = TaskRef.from_json(wire)
        assert back == ref
        assert back.key() == ref.key()
        assert hash(back) == hash(ref)
        assert taskset.rebuild(back).text == question.text


def test_taskref_key_is_canonical_compact_json() -> None:
    a = TaskRef.create("basic_arithmetic", {"max_terms": 3, "min_terms": 2}, 5, 7)
    b = TaskRef.create("basic_arithmetic", {"min_terms": 2, "max_terms": 3}, 5, 7)
    assert a == b
    assert a.key() == '{"config":{"max_terms":3,"min_terms":2},"dataset":"basic_arithmetic","index":7,"seed":5}'
    assert TaskRef.create("basic_arithmetic", {"max_terms": 3, "min_terms": 2}, 5, 8).key() != a.key()


GOOD_REF: dict[str, Any] = {"dataset": "basic_arithmetic", "config": {"max_terms": 3}, "seed": 1, "index": 2}


def _bad(**changes: Any) -> dict[str, Any]:
    return {**GOOD_REF, **changes}


@pytest.mark.parametrize(
    "data",
    [
        pytest.param([], id="not-an-object"),
        pytest.param(None, id="null"),
        pytest.param({k: v for k, v in GOOD_REF.items() if k != "index"}, id="missing-field"),
        pytest.param({**GOOD_REF, "extra": 1}, id="extra-field"),
        pytest.param(_bad(dataset="leg_counting"), id="unknown-dataset"),
        pytest.param(_bad(dataset=3), id="dataset-not-string"),
        pytest.param(_bad(config=[["max_terms", 3]]), id="config-not-object"),
        pytest.param(_bad(config={f"k{i}": 1 for i in range(33)}), id="too-many-config-keys"),
        pytest.param(_bad(config={"seed": 4}), id="config-sets-seed"),
        pytest.param(_bad(config={"no_such_key": 1}), id="unknown-config-key"),
        pytest.param(_bad(config={"max_terms": "3"}), id="config-int-as-string"),
        pytest.param(_bad(config={"max_terms": True}), id="config-bool-as-int"),
        pytest.param(_bad(config={"max_terms": 3.0}), id="config-float-as-int"),
        pytest.param(_bad(config={"max_terms": 6}), id="config-over-cap"),
        pytest.param(_bad(config={"min_terms": 3, "max_terms": 2}), id="config-min-above-max"),
        pytest.param(_bad(config={"operators": ["__import__('os')"]}), id="config-code-as-operator"),
        pytest.param(_bad(config={"operators": [["+"]]}), id="config-nested-list"),
        pytest.param(_bad(config={"operators": []}), id="config-empty-list"),
        pytest.param(
            {"dataset": "binary_matrix", "config": {"p_zero": float("nan")}, "seed": 0, "index": 0}, id="config-nan"
        ),
        pytest.param(_bad(seed=-1), id="negative-seed"),
        pytest.param(_bad(seed=True), id="bool-seed"),
        pytest.param(_bad(seed="1"), id="string-seed"),
        pytest.param(_bad(seed=1.0), id="float-seed"),
        pytest.param(_bad(seed=2**64), id="huge-seed"),
        pytest.param(_bad(index=-1), id="negative-index"),
        pytest.param(_bad(index=False), id="bool-index"),
        pytest.param(_bad(index=None), id="null-index"),
        pytest.param(_bad(index=MAX_TASK_INDEX), id="index-at-max"),
    ],
)
def test_from_json_rejects_malformed_refs(data: object) -> None:
    with pytest.raises(TaskError):
        TaskRef.from_json(data)


def test_from_json_accepts_the_good_ref_used_by_the_rejection_cases() -> None:
    assert TaskRef.from_json(GOOD_REF).index == 2


def test_direct_construction_validates_too() -> None:
    with pytest.raises(TaskError, match="sorted"):
        TaskRef("basic_arithmetic", (("min_terms", 1), ("max_terms", 2)), 0, 0)
    with pytest.raises(TaskError, match="leg_counting"):
        TaskRef("leg_counting", (), 0, 0)
    with pytest.raises(TaskError):
        TaskRef("bf", (), 0, MAX_TASK_INDEX)


# -- draw and eval_set ---------------------------------------------------------------------


def test_draw_is_deterministic_for_the_same_seed_and_round(taskset: TaskSet) -> None:
    first = taskset.draw(5, 16)
    assert [q.ref.key() for q in TaskSet(ALL, seed=0).draw(5, 16)] == [q.ref.key() for q in first]
    assert _texts(taskset.draw(5, 16)) == _texts(first)


def test_draw_differs_across_rounds_and_seeds(taskset: TaskSet) -> None:
    keys = [{q.ref.key() for q in taskset.draw(r, 8)} for r in range(1, 11)]
    assert len(set().union(*keys)) == 80
    picks = {tuple(q.ref.dataset for q in taskset.draw(r, 8)) for r in range(1, 11)}
    assert len(picks) > 1
    assert [q.ref.key() for q in TaskSet(ALL, seed=1).draw(1, 8)] != [q.ref.key() for q in taskset.draw(1, 8)]


def test_draw_uses_the_train_seed(taskset: TaskSet) -> None:
    assert {q.ref.seed for q in taskset.draw(2, 8)} == {0}
    assert {q.ref.seed for q in TaskSet(ALL, seed=42).draw(2, 8)} == {42}


def test_draw_never_picks_a_zero_weight_specialty() -> None:
    ts = TaskSet({**ALL, "bf": 0.0, "arc_1d": 0})
    seen = Counter(q.ref.dataset for r in range(50) for q in ts.draw(r, 8))
    assert "bf" not in seen and "arc_1d" not in seen
    assert set(seen) == set(SAPO_SPECIALTIES) - {"bf", "arc_1d"}
    assert ts.specialties == tuple(s for s in SAPO_SPECIALTIES if s not in ("bf", "arc_1d"))


def test_draw_with_a_single_specialty_gives_only_that_one() -> None:
    ts = TaskSet({"calendar_arithmetic": 2.5})
    assert {q.ref.dataset for r in range(20) for q in ts.draw(r, 8)} == {"calendar_arithmetic"}


def test_draw_follows_the_weights() -> None:
    ts = TaskSet({"bf": 3.0, "basic_arithmetic": 1.0})
    seen = Counter(q.ref.dataset for r in range(50) for q in ts.draw(r, 8))
    assert 0.65 < seen["bf"] / 400 < 0.85


def test_every_round_holds_each_specialty_within_one_of_its_share() -> None:
    weights = {"bf": 3.0, "basic_arithmetic": 1.0, "calendar_arithmetic": 4.0}
    ts = TaskSet(weights)
    for r in range(30):
        seen = Counter(q.ref.dataset for q in ts.draw(r, 8))
        for name, weight in weights.items():
            assert abs(seen[name] - 8 * weight / 8.0) < 1.0 + 1e-9, (r, seen)


def test_draw_uses_the_merged_config() -> None:
    ts = TaskSet({"basic_arithmetic": 1.0}, configs={"basic_arithmetic": {"max_terms": 3}})
    config = dict(ts.draw(1, 1)[0].ref.config)
    assert config["max_terms"] == 3
    assert config["min_digits"] == DEFAULT_DATASET_CONFIGS["basic_arithmetic"]["min_digits"]


def test_draw_rejects_bad_arguments(taskset: TaskSet) -> None:
    with pytest.raises(TaskError):
        taskset.draw(-1, 4)
    with pytest.raises(TaskError):
        taskset.draw(1, 5000)
    with pytest.raises(TaskError):
        taskset.draw(MAX_TASK_INDEX, 4)
    assert taskset.draw(1, 0) == []


def test_eval_set_is_fixed_round_robin_and_prefix_stable(taskset: TaskSet) -> None:
    ev = taskset.eval_set(18)
    assert [q.ref.dataset for q in ev] == list(SAPO_SPECIALTIES) * 2
    assert _texts(TaskSet(ALL, seed=0).eval_set(18)) == _texts(ev)
    assert [q.ref for q in taskset.eval_set(9)] == [q.ref for q in ev[:9]]
    assert {q.ref.seed for q in ev} == {EVAL_SEED_OFFSET}


def test_eval_set_is_disjoint_from_the_first_50_rounds_of_draws(taskset: TaskSet) -> None:
    train = {q.ref.key() for r in range(50) for q in taskset.draw(r, 8)}
    assert not train & {q.ref.key() for q in taskset.eval_set(90)}


def test_eval_set_texts_are_disjoint_from_training_texts() -> None:
    # The default configs are easy enough that distinct items repeat text by chance
    # ("Calculate 4 + 3."), so compare texts where the question space is large.
    ts = TaskSet(
        {"basic_arithmetic": 1.0, "arc_1d": 1.0, "binary_matrix": 1.0},
        configs={
            "basic_arithmetic": {"min_terms": 5, "max_terms": 5, "min_digits": 3, "max_digits": 3},
            "arc_1d": {"min_size": 30, "max_size": 30},
            "binary_matrix": {"min_n": 8, "max_n": 8},
        },
    )
    train = {q.text for r in range(50) for q in ts.draw(r, 8)}
    held_out = {q.text for q in ts.eval_set(90)}
    assert len(held_out) == 90
    assert not train & held_out


# -- rewards -------------------------------------------------------------------------------


@pytest.mark.parametrize("specialty", SAPO_SPECIALTIES)
def test_reward_right_wrong_and_missing_tag(taskset: TaskSet, specialty: str) -> None:
    questions = [q for q in taskset.eval_set(9 * 10) if q.ref.dataset == specialty]
    assert len(questions) == 10
    wrong, wrong_value = WRONG[specialty]
    for q in questions:
        right = _right_answer(q)
        assert taskset.reward(q, f"Let me think.\n<answer>{right}</answer>") == 1.0, q.ref.key()
        assert taskset.reward(q, f"<answer>{wrong(q)}</answer>") == wrong_value, q.ref.key()
        assert taskset.reward(q, right) == 0.0
        assert taskset.reward(q, f"<answer>{right}") == 0.0


def test_reward_scores_the_last_answer_tag(taskset: TaskSet) -> None:
    q = taskset.eval_set(2)[1]  # basic_arithmetic
    right, wrong = q.answer, _plus_one(q)
    assert taskset.reward(q, f"<answer>{wrong}</answer> no, <answer>{right}</answer>") == 1.0
    assert taskset.reward(q, f"<answer>{right}</answer> no, <answer>{wrong}</answer>") == 0.0


def test_reward_rejects_completions_over_the_length_cap(taskset: TaskSet) -> None:
    q = taskset.eval_set(2)[1]
    tail = f"<answer>{q.answer}</answer>"
    assert taskset.reward(q, " " * (MAX_COMPLETION_CHARS - len(tail)) + tail) == 1.0
    assert taskset.reward(q, " " * (MAX_COMPLETION_CHARS - len(tail) + 1) + tail) == 0.0


def test_binary_matrix_answers_are_never_evaluated_as_code(taskset: TaskSet, tmp_path: Path) -> None:
    q = next(q for q in taskset.eval_set(9) if q.ref.dataset == "binary_matrix")
    marker = tmp_path / "pwned"
    attack = f"<answer>[[0]] if open({str(marker)!r}, 'w') else 0</answer>"
    assert taskset.reward(q, attack) == 0.0
    assert not marker.exists()
    # a plain Python list of lists still reaches the dataset's scorer (it gives 0.1)
    rows = [[int(x) for x in line.split()] for line in (q.answer or "").splitlines()]
    assert taskset.reward(q, f"<answer>{rows}</answer>") == 0.1


def test_reward_clamps_and_treats_scorer_rejections_as_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    ts = TaskSet({"bf": 1.0})
    q = ts.draw(1, 1)[0]
    dataset = ts._dataset(q.ref)
    for score, expected in ((7.0, 1.0), (-2.0, 0.0), (float("nan"), 0.0), (0.5, 0.5)):
        monkeypatch.setattr(dataset, "score_answer", lambda answer, entry, s=score: s)
        assert ts.reward(q, "<answer>x</answer>") == expected

    def rejects(answer: str, entry: dict[str, Any]) -> float:
        raise ValueError("malformed")

    monkeypatch.setattr(dataset, "score_answer", rejects)
    assert ts.reward(q, "<answer>x</answer>") == 0.0

    def buggy(answer: str, entry: dict[str, Any]) -> float:
        raise RuntimeError("a bug")

    monkeypatch.setattr(dataset, "score_answer", buggy)
    with pytest.raises(RuntimeError):
        ts.reward(q, "<answer>x</answer>")


def test_messages_put_the_system_prompt_first(taskset: TaskSet) -> None:
    q = taskset.eval_set(1)[0]
    assert q.messages() == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q.text}]
    assert "<answer>" in SYSTEM_PROMPT


# -- configuration errors --------------------------------------------------------------------


def test_unknown_specialty_is_a_task_error_naming_it() -> None:
    with pytest.raises(TaskError, match="leg_counting") as info:
        TaskSet({"leg_counting": 1.0})
    assert "basic_arithmetic" in str(info.value)  # lists the allowed names
    with pytest.raises(TaskError, match="leg_counting"):
        TaskSet({"bf": 1.0}, configs={"leg_counting": {}})


@pytest.mark.parametrize("weights", [{}, {"bf": 0.0}, {"bf": -1.0}, {"bf": float("inf")}, {"bf": True}])
def test_weights_must_enable_something_sensible(weights: dict[str, Any]) -> None:
    with pytest.raises(TaskError):
        TaskSet(weights)


@pytest.mark.parametrize(
    ("configs", "words"),
    [
        ({"basic_arithmetic": {"max_terms": 0}}, ("basic_arithmetic", "max_terms")),
        ({"basic_arithmetic": {"sides": 3}}, ("basic_arithmetic", "sides")),
        ({"calendar_arithmetic": {"tasks": ["moon_phase"]}}, ("calendar_arithmetic", "tasks")),
        # passes our caps but fails reasoning-gym's own check: its message comes through
        (
            {"decimal_arithmetic": {"precision": 3, "min_num_decimal_places": 1, "max_num_decimal_places": 4}},
            ("decimal_arithmetic", "precision must be 2 or more higher"),
        ),
        # a config for a disabled specialty is still checked
        ({"fraction_simplification": {"min_value": 5, "max_value": 5}}, ("fraction_simplification", "max_value")),
    ],
)
def test_bad_config_is_a_task_error_naming_the_dataset(configs: dict[str, Any], words: tuple[str, ...]) -> None:
    with pytest.raises(TaskError) as info:
        TaskSet({"basic_arithmetic": 1.0, "decimal_arithmetic": 1.0, "calendar_arithmetic": 1.0}, configs=configs)
    for word in words:
        assert word in str(info.value)


def test_bad_train_seed_is_a_task_error() -> None:
    with pytest.raises(TaskError):
        TaskSet(ALL, seed=-1)


def test_default_configs_are_read_only() -> None:
    with pytest.raises(TypeError):
        DEFAULT_DATASET_CONFIGS["bf"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        DEFAULT_DATASET_CONFIGS["bf"]["difficulty"] = 3  # type: ignore[index]
    assert set(DEFAULT_DATASET_CONFIGS) == set(SAPO_SPECIALTIES)


@pytest.mark.parametrize("specialty", SAPO_SPECIALTIES)
def test_prompt_has_a_solved_example_of_the_same_specialty(taskset: TaskSet, specialty: str) -> None:
    from engine.questions.tasks import EXAMPLE_MAX_QUESTION_CHARS, EXAMPLE_POOL, EXAMPLE_SEED_OFFSET

    question = TaskSet({specialty: 1.0}, seed=3).draw(2, 1)[0]
    messages = taskset.messages(question)
    if len(question.text) > EXAMPLE_MAX_QUESTION_CHARS:  # arc_1d brings its own examples
        assert messages == question.messages()
        return
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[-1]["content"] == question.text
    ref = question.ref
    example = taskset.rebuild(TaskRef(ref.dataset, ref.config, ref.seed + EXAMPLE_SEED_OFFSET,
                                      ref.index % EXAMPLE_POOL))
    assert messages[1]["content"] == example.text != question.text
    assert taskset.reward(example, messages[2]["content"]) == 1.0  # the worked example is right
    assert taskset.messages(question) == messages  # deterministic


def test_the_held_out_prompts_of_a_specialty_share_one_worked_example(taskset: TaskSet) -> None:
    questions = taskset.eval_set(4 * len(SAPO_SPECIALTIES))
    by_specialty: dict[str, set[tuple[str, str]]] = {}
    for question in questions:
        messages = taskset.eval_messages(question)
        assert messages[-1]["content"] == question.text
        if len(messages) == 4:
            assert messages[1]["content"] != question.text
            by_specialty.setdefault(question.ref.dataset, set()).add((messages[1]["content"], messages[2]["content"]))
    assert len(by_specialty) >= len(SAPO_SPECIALTIES) - 1  # arc_1d brings its own examples
    assert all(len(examples) == 1 for examples in by_specialty.values())
    # Training prompts keep drawing their example from the pool, question by question.
    drawn = TaskSet({"basic_arithmetic": 1.0}, seed=3).draw(1, 4)
    assert len({taskset.messages(q)[1]["content"] for q in drawn}) > 1


def test_a_receiver_rebuilds_the_prompt_the_writer_used() -> None:
    """The worked example follows the question's reference, so any node builds the writer's exact prompt."""
    writer, receiver = TaskSet({"basic_arithmetic": 1.0}, seed=2), TaskSet({"basic_arithmetic": 1.0}, seed=0)
    question = writer.draw(5, 1)[0]
    assert receiver.messages(receiver.rebuild(question.ref)) == writer.messages(question)
    own = receiver.draw(5, 1)[0]
    assert receiver.messages(own)[1] != writer.messages(question)[1]  # another seed, another example
    # the largest seed a question may carry still has an example (the offset wraps)
    from engine.questions.tasks import MAX_SEED

    top = receiver.rebuild(TaskRef(question.ref.dataset, question.ref.config, MAX_SEED, 3))
    assert len(receiver.messages(top)) == 4
