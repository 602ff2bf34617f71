"""Probing (tasks.probe_answers): k answers of every drawn question first, the rest only for the chosen ones.

A tiny random model and a reward that makes the outcome known: base_conversion always scores 0 (its probes
agree), basic_arithmetic's answers alternate 1, 0, 1, ... (any two answers in a row differ).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.backends.base import Completion
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.experiment.plan import make_plan
from engine.node.loop import Node
from engine.rollouts.groups import Group
from tests.engine.test_experiment import fast, run
from tests.engine.test_frontier import alternating

PROBE = ["tasks.questions_per_round=2", "tasks.completions_per_question=4", "tasks.max_new_tokens=8",
         "tasks.eval_every=0", "tasks.eval_questions=3", "grpo.micro_batch=4", "run.device='cpu'", "run.seed=5",
         "tasks.specialties={base_conversion=1.0, basic_arithmetic=1.0}", "tasks.probe_answers=2",
         "tasks.probe_questions=6"]


def probing_node(model_dir: Path, home: Path) -> tuple[Node, list[tuple[int, list[Completion]]], list[list[Group]]]:
    """A node whose generate calls (n, answers) and scored groups are recorded."""
    events: list[Event] = []
    node = Node(build_config("default", None, [*PROBE, f"model.source='{model_dir}'"]), Paths.under(home),
                events.append)
    node.setup()
    node.taskset.reward = alternating()  # type: ignore[assignment]
    assert node.backend is not None
    calls: list[tuple[int, list[Completion]]] = []
    seen: list[list[Group]] = []
    generate, score = node.backend.generate, node.score
    caches = node.prompt_caches = []  # type: ignore[attr-defined]  # (its id, hits after the call, a weak reference)

    def recorded(prompts: Sequence[list[int]], n: int, *args: Any, **kwargs: Any) -> list[Completion]:
        calls.append((n, generate(prompts, n, *args, **kwargs)))
        cache: Any = args[3] if len(args) > 3 else kwargs.get("prompt_cache")
        caches.append((id(cache), cache.hits, weakref.ref(cache)))
        return calls[-1][1]

    def scored(*args: Any) -> list[Group]:
        seen.append(score(*args))
        return seen[-1]

    learn = node.learn
    gone = node.caches_gone_in_training = []  # type: ignore[attr-defined]

    def learned(*args: Any) -> Any:
        gone.append([ref() is None for _, _, ref in caches])
        return learn(*args)

    node.backend.generate = recorded  # type: ignore[method-assign]
    node.score = scored  # type: ignore[method-assign, assignment]
    node.learn = learned  # type: ignore[method-assign, assignment]
    return node, calls, seen


def test_a_probing_round_completes_the_questions_whose_first_answers_differ(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    node, calls, seen = probing_node(tiny_model_dir, tmp_path / "a")
    _, drawn, _ = node.start_round()  # only looks: the round draws the same questions
    metrics = node.run_round()
    (k, probes), (rest_n, rest) = calls
    assert (k, len(probes), rest_n, len(rest)) == (2, 6 * 2, 2, 2 * 2)
    differ = [i for i, q in enumerate(drawn) if q.ref.dataset == "basic_arithmetic"]
    agree = [i for i, q in enumerate(drawn) if q.ref.dataset != "basic_arithmetic"]
    chosen = sorted((differ + agree)[:2])
    groups = seen[0]
    assert [g.question.ref for g in groups] == [drawn[i].ref for i in chosen]
    for j, (g, i) in enumerate(zip(groups, chosen, strict=True)):
        assert len(g.completions) == 4
        assert g.completions[:2] == probes[i * 2 : i * 2 + 2]  # the probes are the group's first answers
        assert g.completions[2:] == rest[j * 2 : j * 2 + 2]
    assert (metrics["probed"], metrics["probe_differ"], metrics["answers"]) == (6, len(differ), 6 * 2 + 2 * 2)
    assert metrics["local_groups"] == 2 and metrics["completions"] == 8
    assert metrics["informative_groups"] == min(2, len(differ))
    first, second = node.prompt_caches  # type: ignore[attr-defined]
    assert first[0] == second[0] and second[1] == 2  # one cache; the chosen prompts were not read again
    assert node.caches_gone_in_training == [[True, True]]  # type: ignore[attr-defined]  # not kept through training

    # The same seed draws, probes, chooses and completes the same again.
    again, again_calls, again_seen = probing_node(tiny_model_dir, tmp_path / "b")
    again.run_round()
    assert [[c.token_ids for c in g.completions] for g in again_seen[0]] == \
        [[c.token_ids for c in g.completions] for g in groups]
    assert [c.token_ids for c in again_calls[1][1]] == [c.token_ids for c in rest]


def test_probing_is_off_by_default_and_bad_values_are_one_sentence_naming_the_key() -> None:
    tasks = build_config("default", None, []).tasks
    assert tasks.probe_answers == 0
    with pytest.raises(ConfigError, match=r"probe_answers must be .* from 0 \(off\) to .* \(7\)"):
        build_config("default", None, ["tasks.probe_answers=8"])  # G is 8: nothing would be left to complete
    with pytest.raises(ConfigError, match=r"tasks.probe_questions \(4\) must be at least questions_per_round \(8\)"):
        build_config("default", None, ["tasks.probe_answers=2", "tasks.probe_questions=4"])
    build_config("default", None, ["tasks.probe_questions=4"])  # not probing: the pool size does not matter


@pytest.mark.integration  # a real loopback relay
def test_an_experiment_probes_each_nodes_questions_in_one_batch(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan("default", 2, "2/0", 2, [*fast(tiny_model_dir), "tasks.probe_answers=2",
                                              "tasks.probe_questions=5"])
    _, report = run(plan, tmp_path / "out", tmp_path / "home")
    assert report["complete"]
    for k in range(2):
        lines = (tmp_path / "out" / "mix-2-0" / f"node-{k}" / "metrics.jsonl").read_text().splitlines()
        rounds = [json.loads(line) for line in lines if json.loads(line)["kind"] == "round"]
        assert [r["probed"] for r in rounds] == [5, 5]
        assert all(r["answers"] == 5 * 2 + 2 * 2 and r["completions"] == 2 * 4 for r in rounds)
        assert all(len(rewards) == 4 for r in rounds for _, rewards in r["own_group_rewards"])


def test_the_probe_replay_counts_what_the_first_answers_would_have_said(tmp_path: Path) -> None:
    from bench.probe_replay import estimate, main

    groups = [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    row = estimate(groups, k=2, pool=4, questions=2)
    assert row["p_differ"] == 0.25 and row["p_teach_if_agree"] == pytest.approx(1 / 3)
    # 4 probed x 0.25 = 1 sure group of 2, the other teaches a third of the time
    assert row["own_groups_teaching"] == pytest.approx((1 + 1 / 3) / 2)
    assert row["answers"] == 4 * 2 + 2 * 2 and row["today"]["own_groups_teaching"] == 0.5
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"kind": "round", "own_group_rewards": [["x", g] for g in groups]}) + "\n"
                               for _ in range(2)))
    assert main([str(metrics), "--k", "2", "--pool", "4", "--questions", "2", "--json"]) == 0
    assert main([str(metrics), "--k", "4"]) == 2  # no answer would be left to complete
    assert main([str(metrics), "--pool", "two"]) == 2
