"""Benchmarks refuse bad arguments with one sentence and exit code 2, before any measuring."""

from __future__ import annotations

from typing import Any

import pytest

from bench import (
    credit_farming,
    decode_profile,
    draft_lookup,
    length_attack,
    matmul_layout,
    probe_cost,
    relay_load,
    temperature,
    train_speed,
)


@pytest.mark.parametrize("rows", ["x", "1,,2", "0", "5,-1"])
def test_matmul_layout_refuses_row_counts_that_are_not_whole_numbers_from_1(rows: str,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert matmul_layout.main(["--rows", rows]) == 2
    err = capsys.readouterr().err
    assert err.startswith("matmul_layout: ") and err.count("\n") == 1


@pytest.mark.parametrize("args", [["--ops", "-1"], ["--eval", "0"]])
def test_decode_profile_refuses_negative_counts(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert decode_profile.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode_profile: ") and err.count("\n") == 1


@pytest.mark.parametrize("args", [["--eval", "0"], ["--drafts", "4,x"], ["--drafts", "0"], ["--drafts", ""]])
def test_draft_lookup_refuses_bad_counts(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert draft_lookup.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("draft_lookup: ") and err.count("\n") == 1


def test_looked_up_drafts_shorten_a_repeated_answer_and_not_a_new_one() -> None:
    # "7 8 9" is in the prompt: after its first token, drafts of 2 take it two tokens a step.
    assert draft_lookup.steps_with_drafts([1, 7, 8, 9, 2], [7, 8, 9, 7, 8, 9], k=2) == 3
    assert draft_lookup.steps_with_drafts([1, 2], [5, 6, 7, 8], k=4) == 4  # nothing to look up: a step a token
    assert draft_lookup.draft([3, 4, 5, 3, 4], k=2) == [5, 3]


@pytest.mark.parametrize("args", [
    ["--processes", "3"],  # several processes share batches only through Redis
    ["--redis"],  # one process cannot lose one of its processes
    ["--processes", "9", "--redis"],
    ["--peers", "0"],
    ["--seconds", "0"],
    ["--processes", "3", "--redis", "--max-peers-per-process", "50"],
    ["--processes", "3", "--redis", "--budget", "10"],
])
def test_relay_load_refuses_bad_scale_out_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert relay_load.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("relay_load: ") and err.count("\n") == 1


@pytest.mark.parametrize(("bench", "args"), [
    (length_attack, ["--out", "unused", "--only", "clean,nonsense"]),
    (length_attack, ["--out", "unused", "--rounds", "0"]),
    (credit_farming, ["--farm", "1"]),
    (credit_farming, ["--seconds", "0"]),
])
def test_the_abuse_benches_refuse_bad_arguments(bench: Any, args: list[str], capsys: pytest.CaptureFixture[str]
                                                ) -> None:
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{bench.__name__.rsplit('.', 1)[1]}: ") and err.count("\n") == 1


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--round", "0"], ["--threads", "-1"], ["--items", "/"]])
def test_train_speed_refuses_bad_counts(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert train_speed.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_speed: ") and err.count("\n") == 1


def test_train_speed_counts_each_prompt_once_and_no_padding() -> None:
    from engine.backends.base import TrainItem

    # One prompt of 4 tokens with completions of 1 and 3 tokens: 4 + 0 + 2 tokens through the layers,
    # 4 LM-head rows; attention pairs 10 (the prompt, causal) + 0 + (4 + 1) + (4 + 2).
    items = [TrainItem([1, 2, 3, 4], [5], [], 1.0), TrainItem([1, 2, 3, 4], [6, 7, 8], [], -1.0)]
    need = train_speed.layout([items], [items])
    assert (need["tokens"], need["head_rows"], need["pairs"]) == (6, 4, 21)
    # The last layer past its keys and values: the prompt's last token and the 2 completion inputs, (4 + 5 + 6) pairs.
    assert (need["kept"], need["kept_pairs"]) == (3, 15)
    assert (need["old_tokens"], need["old_head_rows"]) == (4 + 2 * 2, 1 + 2 * 2)  # padded to the longer completion
    assert train_speed.first_questions([*items, TrainItem([9], [5], [], 1.0)], 1) == items


@pytest.mark.parametrize("args", [["--temperatures", "0.7,hot"], ["--temperatures", "0.7,0"], ["--questions", "1"],
                                  ["--first-round", "0"], ["--threads", "-1"], ["--checkpoint", "/nonexistent"]])
def test_temperature_refuses_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert temperature.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("temperature: ") and err.count("\n") == 1


def test_temperatures_paired_interval_is_the_mean_difference_inside_its_interval() -> None:
    mean, lo, hi = temperature.paired_interval([0.0, 1.0, 0.0, 1.0] * 10, [1.0, 1.0, 0.0, 1.0] * 10)
    assert mean == pytest.approx(0.25) and lo <= mean <= hi and 0.0 < lo and hi < 0.5
    assert temperature.paired_interval([1.0] * 8, [1.0] * 8) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("args", [["--pools", "16,x"], ["--pools", "4"], ["--answers", "8"], ["--repeats", "0"]])
def test_probe_cost_refuses_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_cost.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("probe_cost: ") and err.count("\n") == 1


def test_selection_bound_is_the_oracles_teaching_groups_per_second_against_todays(tmp_path: Any,
                                                                                  capsys: pytest.CaptureFixture[str]
                                                                                  ) -> None:
    """One node, B = 8, 2 of 8 groups teach: 6 s generating, 3 s training, 1 s the rest. The oracle pays 6/8 + 1/8
    of generation and the rest per teaching group and 3/2 of training: 10 / (0.25 * 7 + 3) = 2.105x."""
    import json

    from bench import selection_bound

    record = {"node_generate_seconds": [6.0], "node_train_seconds": [3.0], "node_seconds": [10.0],
              "informative_groups": [2], "node_cpu_seconds": [20.0]}
    result = selection_bound.bound([record, record], 8)
    assert result["oracle_per_hour"] == pytest.approx(10 / (0.25 * 7 + 3))
    assert result["teaching_per_cpu_hour"] == pytest.approx(4 / 40 * 3600)
    mix = tmp_path / "exp" / "mix-8-0"
    mix.mkdir(parents=True)
    (tmp_path / "exp" / "experiment.json").write_text(json.dumps({"settings": {"tasks": {"questions_per_round": 8}}}))
    (mix / "rounds.jsonl").write_text(json.dumps(record) + "\n")
    assert selection_bound.main([str(mix)]) == 0
    out = capsys.readouterr().out
    assert "at most 2.11x the teaching groups per hour" in out and "passed" not in out
    (mix / "node-0").mkdir()  # 2 groups teach, 1 of them with a pass: half of the 360 teaching groups a CPU hour
    groups = [["x", [1.0, 0.0]], ["y", [0.5, 0.0]], ["z", [1.0, 1.0]], ["w", [0.0, 0.0]]]
    (mix / "node-0" / "metrics.jsonl").write_text(json.dumps({"kind": "round", "own_group_rewards": groups}) + "\n")
    assert selection_bound.main([str(mix)]) == 0
    out = capsys.readouterr().out
    assert "50% of them hold an answer that passed (180 a CPU hour)" in out
    assert "x alone would teach 100% of its groups" in out  # x and y 1.0, z and w 0.0: (1 + 1) / 2
    assert "weights in proportion to each specialty's share, 100%" in out
    assert "answers a question (G)" in out and "2 25% (recorded)" in out  # only x has a pass and a miss
    ceiling = selection_bound.specialty_ceiling([("a", [1.0, 0.0]), ("a", [0.0, 0.0]), ("b", [1.0, 0.0])])
    assert ceiling is not None and ceiling["shares"] == {"a": 0.5, "b": 1.0} and ceiling["best"] == "b"
    assert ceiling["proportional_share"] == pytest.approx((0.25 + 1.0) / 1.5)
    assert selection_bound.specialty_ceiling([]) is None
    for args in ([], ["--help"], [str(tmp_path)]):
        assert selection_bound.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("selection_bound: ") and err.count("\n") == 1


def test_answers_projection_draws_fewer_answers_exactly_and_fits_more() -> None:
    """Fewer answers: from [1, 0, 0, 0], two drawn hold the pass with odds 3 / 6. More: groups whose pass counts are
    a beta-binomial's expectation (a = 0.2, b = 0.3, 8 answers) give back that law's share at 16 and 32 answers. A
    specialty with no pass projects to 0."""
    import math

    from bench import selection_bound

    assert selection_bound.answers_projection([("x", [1.0, 0.0, 0.0, 0.0])], [2, 4]) == {2: 0.5, 4: 1.0}
    assert selection_bound.answers_projection([], [4]) is None

    def law(k: int, n: int, a: float = 0.2, b: float = 0.3) -> float:
        return math.exp(selection_bound._beta_binomial_log(k, n, a, b))

    groups = [("x", [1.0] * k + [0.0] * (8 - k)) for k in range(9) for _ in range(round(20000 * law(k, 8)))]
    groups += [("dead", [0.0] * 8)] * 5000
    n = len(groups)
    projection = selection_bound.answers_projection(groups, [8, 16, 32])
    assert projection is not None
    for size in (8, 16, 32):
        expected = (n - 5000) / n * (1 - law(0, size) - law(size, size))
        assert projection[size] == pytest.approx(expected, abs=0.005)
    assert projection[8] < projection[16] < projection[32]
    a, b = selection_bound.fit_beta_binomial([(k, 8) for _, g in groups[:-5000] for k in [int(sum(g))]])
    assert a == pytest.approx(0.2, rel=0.1) and b == pytest.approx(0.3, rel=0.1)


def test_score_shares_counts_a_kinds_answers_by_score_in_blocks_of_rounds(tmp_path: Any,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from bench import score_shares

    node = tmp_path / "mix-8-0" / "node-0"
    node.mkdir(parents=True)
    rounds = [{"kind": "round", "round": r, "own_group_rewards": [["fraction_simplification", rewards],
                                                                   ["bf", [1.0, 1.0]]]}
              for r, rewards in ((1, [0.1, 0.05]), (2, [1.0, 0.1]), (3, [0.1, 0.1]))]
    (node / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rounds, {"kind": "eval"}]))
    assert score_shares.shares([node / "metrics.jsonl"], "fraction_simplification", 2) == [
        (1, 4, {1.0: 0.25, 0.1: 0.5, 0.05: 0.25}), (3, 2, {0.1: 1.0})]
    assert score_shares.main([str(tmp_path / "mix-8-0"), "--every", "2"]) == 0
    assert "rounds 1-2 (4 answers): 1: 0.25, 0.1: 0.50, 0.05: 0.25" in capsys.readouterr().out
    assert score_shares.main([str(tmp_path / "mix-8-0"), "--kind", "arc_1d"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("score_shares: ") and err.count("\n") == 1
