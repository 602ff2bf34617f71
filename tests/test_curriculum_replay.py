"""bench/curriculum_replay.py: the round-by-round outcomes it rebuilds from a run's metrics are the ones the
node saw, and its replays count moves and reversals as they happened.

Run: .venv/bin/python -m pytest tests/test_curriculum_replay.py -q
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import curriculum_replay as replay
from engine.common.config import NodeConfig
from engine.questions.curriculum import WINDOW_GROUPS, Curriculum
from engine.questions.tasks import TaskSet

PRIORS = dict(NodeConfig().tasks.specialties)


def passes_of(dataset: str, level: int, index: int) -> int:
    """A model that solves a question with every answer or none, and a few in between; easier lower down."""
    pattern = (8, 0, 0, 5, 0, 8) if level < 0 else (8, 0, 0, 0, 3, 0)
    return pattern[(index + len(dataset)) % len(pattern)]


def round_of(questions: list[Any], levels: dict[str, int]) -> list[tuple[str, list[float]]]:
    """A round's groups, as the replay assumes them: at most one mixed group per specialty (the others all pass
    or all fail), most passes first. The order of a specialty's groups within a round is not recorded; it
    decides which of them leave a full window first."""
    results, mixed = [], set()
    for q in questions:
        name = q.ref.dataset
        p = passes_of(name, levels[name], q.ref.index)
        p = 0 if 0 < p < 8 and name in mixed else p
        mixed |= {name} if 0 < p < 8 else set()
        results.append((name, [1.0] * p + [0.0] * (8 - p)))
    return sorted(results, key=lambda result: -sum(result[1]))


def simulated_run(rounds: int, seed: int) -> tuple[list[dict[str, Any]], list[Counter[str]]]:
    """A node's metrics rows with the second pass's curriculum, and each round's passes per specialty."""
    curriculum, taskset = Curriculum(list(PRIORS)), TaskSet(PRIORS, seed=seed)
    rows, truth = [], []
    for r in range(1, rounds + 1):
        results = round_of(taskset.draw(r, 8, **curriculum.plan(PRIORS)), curriculum.levels)
        truth.append(Counter({name: 0 for name, _ in results}))
        for name, rewards in results:
            truth[-1][name] += int(sum(rewards))
        by = {name: [sum(rw) / 8 for n, rw in results if n == name] for name, _ in results}
        rows.append({"round": r, "reward_by_specialty": {n: sum(v) / len(v) for n, v in by.items()},
                     **curriculum.follow(results, PRIORS)})
    return rows, truth


def test_the_rebuilt_outcomes_are_the_ones_the_node_saw() -> None:
    rows, truth = simulated_run(30, seed=3)
    assert any(row["level_changes"] for row in rows)
    rounds, plans = replay.reconstruct(rows, TaskSet(PRIORS, seed=3), PRIORS, 0, 8, 8, WINDOW_GROUPS)
    assert [p.round for p in plans] == list(range(1, 31))
    for outcomes, passes in zip(rounds, truth, strict=True):
        assert {o.specialty: sum(o.passes) for o in outcomes} == dict(passes)
        assert sum(len(o.passes) for o in outcomes) == 8
    # read with the wrong window (a first-pass run's 4 groups), the same rows give other totals
    wrong, _ = replay.reconstruct(rows, TaskSet(PRIORS, seed=3), PRIORS, 0, 8, 8, replay.OLD_WINDOW)
    assert [{o.specialty: sum(o.passes) for o in r} for r in wrong] != [dict(p) for p in truth]


def test_a_draw_that_is_not_the_recorded_one_is_refused() -> None:
    rows, _ = simulated_run(3, seed=3)
    with pytest.raises(replay.ConfigError, match="redrawn specialties differ"):
        replay.reconstruct(rows, TaskSet(PRIORS, seed=4), PRIORS, 0, 8, 8, WINDOW_GROUPS)


def test_the_second_pass_replayed_on_its_own_outcomes_makes_the_moves_it_made() -> None:
    rows, _ = simulated_run(30, seed=5)
    rounds, _ = replay.reconstruct(rows, TaskSet(PRIORS, seed=5), PRIORS, 0, 8, 8, WINDOW_GROUPS)
    result = replay.new_rule({0: rounds}, PRIORS)
    recorded = [(0, row["round"], c["specialty"], c["old"], c["new"]) for row in rows for c in row["level_changes"]]
    assert sorted(result.moves) == sorted(recorded) and "unknown" not in result.counts
    assert result.summary()["groups"] == 240


def test_reversals_count_a_move_against_the_previous_one() -> None:
    result = replay.RuleResult(moves=[(0, 1, "bf", 0, 1), (0, 2, "bf", 1, 0), (0, 3, "bf", 0, 1),
                                      (0, 4, "arc_1d", 0, 1), (1, 4, "bf", 0, -1)])
    assert result.reversals() == 2
    assert replay.split(19, 4, 8) == [8, 8, 3, 0] and replay.split(0, 2, 8) == [0, 0]


def test_a_folder_without_a_run_is_one_sentence_and_a_bad_command_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert replay.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("curriculum_replay: ") and "holds no experiment plan" in err and err.count("\n") == 1
    assert replay.main([]) == 2
    assert capsys.readouterr().err.startswith("curriculum_replay: usage:")
