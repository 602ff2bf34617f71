"""The sampling temperature that follows the model (tasks.adaptive_temperature, engine/questions/heat.py).

The rule on made-up groups, its state, its settings, and a tiny random model's node and experiment whose reward
is fixed so the outcome is known: every answer scores 1.0 (every group collapsed: the temperature must rise).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.backends.base import Completion
from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import CheckpointError, ConfigError
from engine.common.paths import Paths
from engine.experiment.plan import Mix, make_plan
from engine.node.clock import Control
from engine.node.loop import Node
from engine.questions.heat import HIGH, LOW, MIN_GROUPS, SHARE_MAX, STEP, WINDOW_GROUPS, Heat, collapsed, heat_for
from tests.engine.test_experiment import adapters, fast, run

SAME, ZERO, MIXED = [1.0] * 8, [0.0] * 8, [0.0, 1.0] * 4


def test_a_group_collapsed_when_every_answer_scored_the_same_above_zero() -> None:
    assert collapsed(SAME) and collapsed([0.1] * 8)
    assert not collapsed(ZERO) and not collapsed(MIXED) and not collapsed([])


def test_the_temperature_rises_on_collapsed_groups_falls_without_them_and_keeps_its_bounds() -> None:
    heat = Heat(0.7, 0.8)
    report = heat.follow([SAME] * (MIN_GROUPS - 1))
    assert heat.temperature == 0.7 and "collapsed_share" not in report  # too few groups to say
    report = heat.follow([SAME])
    assert heat.temperature == pytest.approx(0.7 + STEP) and report == {
        "temperature": 0.7, "temperature_next": heat.temperature, "collapsed_share": 1.0}
    heat.follow([SAME] * 8)
    heat.follow([SAME] * 8)
    assert heat.temperature == 0.8  # at most one step a round, never past the top
    heat.follow([MIXED] * WINDOW_GROUPS)
    assert heat.temperature == pytest.approx(0.8 - STEP)
    heat.follow([MIXED] * 8)
    heat.follow([MIXED] * 8)
    assert heat.temperature == 0.7  # never below tasks.temperature


def test_groups_that_all_fail_do_not_move_it_and_a_band_between_low_and_high_holds_it() -> None:
    heat = Heat(0.7, 1.4)
    heat.temperature = 1.0
    heat.follow([ZERO] * WINDOW_GROUPS)
    assert heat.temperature == 0.95  # no collapsed group: it comes down, heat that only spoils answers is undone
    heat.temperature = 1.0
    between = int(WINDOW_GROUPS * (LOW + HIGH) / 2)
    heat.follow([SAME] * between + [ZERO] * (WINDOW_GROUPS - between))
    assert heat.temperature == 1.0


def test_the_state_round_trips_and_a_damaged_one_starts_again_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    heat = Heat(0.7, 1.4)
    for _ in range(3):
        heat.follow([SAME] * 5 + [MIXED] * 3)
    again = Heat.from_state(json.loads(json.dumps(heat.to_state())), 0.7, 1.4)
    assert again.to_state() == heat.to_state() and again.temperature == heat.temperature > 0.7
    assert Heat.from_state(heat.to_state(), 0.7, 0.72).temperature == 0.72  # held within today's bounds
    for bad in ({"version": 2}, {"version": 1, "temperature": "hot", "window": []},
                {"version": 1, "temperature": 1.0, "window": [2]}, {"version": 1, "temperature": True, "window": []},
                [1.0]):
        with pytest.raises(CheckpointError, match="sampling temperature state is damaged"):
            Heat.from_state(bad, 0.7, 1.4)
    tasks = build_config(overrides=["tasks.adaptive_temperature=true"]).tasks
    with caplog.at_level(logging.WARNING, logger="engine.questions.heat"):
        fresh = heat_for(tasks, {"version": 9})
    assert fresh is not None and fresh.temperature == 0.7 and "starts again at 0.70" in caplog.text


def test_a_node_shares_up_to_share_max_or_its_configured_start() -> None:
    heat = Heat(0.7, 1.4)
    assert heat.shares()
    heat.temperature = SHARE_MAX + STEP
    assert not heat.shares()
    hot_start = Heat(1.2, 1.4)  # configured hotter than SHARE_MAX: shares where it starts, not once heat adds to it
    assert hot_start.shares()
    hot_start.temperature = 1.25
    assert not hot_start.shares()


def test_it_is_off_by_default_and_bad_values_are_one_sentence_naming_the_key() -> None:
    assert NodeConfig().tasks.adaptive_temperature is False and heat_for(NodeConfig().tasks) is None
    assert build_config("paper").tasks.adaptive_temperature is False
    with pytest.raises(ConfigError, match=r"tasks\.adaptive_temperature must be true or false"):
        build_config(overrides=["tasks.adaptive_temperature=1"])
    with pytest.raises(ConfigError, match=r"tasks\.temperature_max \(0\.5\) must be at least temperature \(0\.7\)"):
        build_config(overrides=["tasks.adaptive_temperature=true", "tasks.temperature_max=0.5"])
    build_config(overrides=["tasks.temperature_max=0.5"])  # off: the top does not matter


FAST = ["tasks.questions_per_round=4", "tasks.completions_per_question=3", "tasks.max_new_tokens=8",
        "tasks.eval_every=0", "tasks.eval_questions=3", "grpo.micro_batch=4", "run.device='cpu'", "run.seed=5",
        "tasks.adaptive_temperature=true"]


def make_node(model_dir: Path, home: Path, calls: list[float]) -> Node:
    node = Node(build_config("default", None, [*FAST, f"model.source='{model_dir}'"]), Paths.under(home),
                lambda _: None)
    node.setup()
    node.taskset.reward = lambda question, completion: 1.0  # type: ignore[method-assign]
    assert node.backend is not None
    generate = node.backend.generate

    def recorded(prompts: Sequence[list[int]], n: int, new: int, temperature: float, *args: Any) -> list[Completion]:
        calls.append(temperature)
        return generate(prompts, n, new, temperature, *args)

    node.backend.generate = recorded  # type: ignore[method-assign, assignment]
    return node


def test_a_node_samples_and_trains_at_its_temperature_logs_it_and_resumes_it(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[float] = []
    node = make_node(tiny_model_dir, tmp_path, calls)
    with caplog.at_level(logging.INFO, logger="engine.questions.heat"):
        rounds = [node.run_round() for _ in range(3)]
    assert calls == [0.7, 0.7, 0.75]  # 8 groups after round 2, all collapsed: a step up each round from then on
    assert [m["temperature"] for m in rounds] == [0.7, 0.7, 0.75]
    assert [m["temperature_next"] for m in rounds] == [0.7, 0.75, 0.8]
    assert "Sampling temperature 0.70 -> 0.75: 8 of the last 8 own groups" in caplog.text
    assert getattr(node.backend, "temperature", None) == 0.75  # round 3 trained at its own
    state = json.loads((node.checkpoint_root / "round-000003" / "state.json").read_text())
    assert state["heat"]["temperature"] == 0.8

    resumed = make_node(tiny_model_dir, tmp_path, calls := [])
    assert resumed.round == 3 and resumed.heat is not None
    assert node.heat is not None and resumed.heat.to_state() == node.heat.to_state()
    resumed.run_round()
    assert calls == [0.8]


@pytest.mark.integration  # a real loopback relay
def test_an_experiment_samples_each_node_at_its_own_temperature_and_resumes_exactly(tiny_model_dir: Path,
                                                                                    tmp_path: Path) -> None:
    settings = [*fast(tiny_model_dir), "tasks.eval_every=0", "tasks.adaptive_temperature=true"]
    plan = make_plan("default", 2, "2/0", 5, settings)

    def same(question: Any, completion: str) -> float:
        return 1.0

    _, report = run(plan, tmp_path / "straight", tmp_path / "home", reward=same)
    assert report["complete"]
    mix = plan.mixes[0]
    for k in range(2):
        lines = (tmp_path / "straight" / mix.slug / f"node-{k}" / "metrics.jsonl").read_text().splitlines()
        heats = [json.loads(line)["temperature"] for line in lines if json.loads(line)["kind"] == "round"]
        assert heats == [0.7, 0.7, 0.7, 0.7, 0.75]  # 2 questions a round: 8 groups after round 4

    control = Control()

    def stop_after_round_4(mix: Mix, record: dict[str, Any]) -> None:
        if record["round"] == 4:
            control.stop()

    _, partial = run(plan, tmp_path / "resumed", tmp_path / "home", control, reward=same,
                     round_done=stop_after_round_4)
    assert not partial["complete"]
    _, rest = run(plan, tmp_path / "resumed", tmp_path / "home", reward=same)  # round 5 at the resumed 0.75
    assert rest["complete"]
    straight, resumed = adapters(tmp_path / "straight", mix, 2, 5), adapters(tmp_path / "resumed", mix, 2, 5)
    assert all(a.keys() == b.keys() and all((a[n] == b[n]).all() for n in a) for a, b in zip(straight, resumed,
                                                                                          strict=True))
