"""Held-out accuracy at equal time: values worked out by hand, and the evaluations a tiny experiment writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.experiment.compare import compare, held_out_curve
from engine.experiment.heldout import at_time, held_out_at_equal_time, read_evaluations
from engine.experiment.plan import make_plan
from engine.experiment.report import stratified_bootstrap
from tests.engine.test_experiment import fast, run
from tests.engine.test_experiment_hours import _timed_folder


def _evaluated(root: Path, mix: str, seconds: list[list[float]], start: str, evals: dict[int, list[str]]) -> Path:
    """A timed experiment folder whose mix was evaluated before training (`start`, the base model) and after
    the rounds in `evals` (node by node, one character a question); the last round's goes to eval.json."""
    folder = _timed_folder(root, mix, [[0.1] * len(seconds[0])] * len(seconds), seconds)
    slug = next(folder.glob("mix-*"))
    record = {"round": 0, "nodes": [{"accuracy": start.count("1") / len(start), "passes": start}]}
    (folder / "eval-start.json").write_text(json.dumps(record))
    last = len(seconds)
    for r, passes in evals.items():
        line = {"round": r, "nodes": [{"accuracy": p.count("1") / len(p), "passes": p} for p in passes]}
        if r == last:
            (slug / "eval.json").write_text(json.dumps(line))
        else:
            with (slug / "evals.jsonl").open("a") as f:
                f.write(json.dumps(line) + "\n")
    return slug


def test_a_question_is_linear_between_the_evaluations_around_the_time() -> None:
    assert at_time([0.0, 10.0, 30.0], ["00", "10", "11"], 10.0) == [1.0, 0.0]
    assert at_time([0.0, 10.0, 30.0], ["00", "10", "11"], 25.0) == pytest.approx([1.0, 0.75])
    assert at_time([0.0, 10.0, 30.0], ["00", "10", "11"], 30.0) == [1.0, 1.0]
    with pytest.raises(ValueError, match="outside"):
        at_time([0.0, 10.0], ["0", "1"], 11.0)


def test_two_mixes_are_compared_at_the_time_both_cover(tmp_path: Path) -> None:
    # A: 10 s rounds; B: node 0 20 s rounds, node 1 15 s then 10 s. Each node's horizon is A's 20 s.
    a = _evaluated(tmp_path / "a", "8/0", [[10.0, 10.0], [10.0, 10.0]], "0000",
                   {1: ["1000", "1000"], 2: ["1100", "1100"]})
    b = _evaluated(tmp_path / "b", "8/0", [[20.0, 15.0], [20.0, 10.0]], "0000",
                   {1: ["1110", "1110"], 2: ["1111", "1111"]})
    evaluations = read_evaluations(b)
    assert evaluations is not None and evaluations.rounds == [0, 1, 2]
    assert evaluations.seconds == [[0.0, 20.0, 40.0], [0.0, 15.0, 25.0]]
    result = held_out_at_equal_time([(a, b)], None, stratified_bootstrap)
    assert result is not None
    # A at 20 s: 0.5 for both nodes. B: node 0 at its round 1 (0.75), node 1 halfway to round 2 (0.875).
    assert result["pairs"][0]["hours"] == pytest.approx([20 / 3600] * 2)
    assert result["accuracy_a"] == pytest.approx(0.5) and result["accuracy_b"] == pytest.approx(0.8125)
    assert result["difference"] == pytest.approx(0.5 - 0.8125)
    assert result["gain_ratio"] == pytest.approx(0.5 / 0.8125)  # the base model scored 0
    lo, hi = result["difference_ci95"]
    assert lo <= result["difference"] <= hi
    # at the same round (2) both are compared without regard to time: 0.5 against 1.0
    assert result["same_round"]["difference"] == pytest.approx(-0.5)
    assert result["pairs"][0]["same_round"] == 2
    assert result["by_specialty"] == {}  # the folders' plans name no specialties
    # Two specialties enabled: questions 0 and 2 are base_conversion, 1 and 3 basic_arithmetic. A: 0.5 and 0.5;
    # B: node 0 "1110" gives 1.0 and 0.5, node 1 halfway to "1111" gives 1.0 and 0.75.
    for folder in (a, b):
        plan = json.loads((folder.parent / "experiment.json").read_text())
        plan["settings"] = {"tasks": {"specialties": {"base_conversion": 1.0, "basic_arithmetic": 2.0, "bf": 0}}}
        (folder.parent / "experiment.json").write_text(json.dumps(plan))
    kinds = held_out_at_equal_time([(a, b)], None, stratified_bootstrap)["by_specialty"]  # type: ignore[index]
    assert list(kinds) == ["base_conversion", "basic_arithmetic"]
    assert kinds["base_conversion"]["accuracy_b"] == pytest.approx(1.0)
    assert kinds["base_conversion"]["difference"] == pytest.approx(-0.5)
    assert kinds["basic_arithmetic"]["accuracy_b"] == pytest.approx(0.625)
    assert kinds["basic_arithmetic"]["difference"] == pytest.approx(-0.125)
    (b.parent / "experiment.json").write_text(json.dumps({"settings": {"tasks": ["not", "a", "table"]}}))
    result = held_out_at_equal_time([(a, b)], None, stratified_bootstrap)  # plans that disagree: no breakdown
    assert result is not None and result["by_specialty"] == {} and result["difference"] == pytest.approx(-0.3125)


def test_the_held_out_plot_puts_each_evaluation_at_its_nodes_mean_hours(tmp_path: Path) -> None:
    from bench.experiment_report import main

    b = _evaluated(tmp_path / "b", "8/0", [[20.0, 15.0], [20.0, 10.0]], "0000",
                   {1: ["1110", "1110"], 2: ["1111", "1011"]})
    hours, accuracy, rounds = held_out_curve(b, "wall")
    assert rounds == [0, 1, 2]
    assert hours == pytest.approx([0.0, 17.5 / 3600, 32.5 / 3600])  # node 0: 0, 20, 40 s; node 1: 0, 15, 25 s
    assert accuracy == pytest.approx([0.0, 0.75, 0.875])
    out = tmp_path / "held-out.png"
    assert main(["--plot-held-out", str(out), f"b={b.parent}:8/0"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = _timed_folder(tmp_path / "c", "8/0", [[0.1]], [[10.0]])  # never evaluated
    assert main(["--plot-held-out", str(tmp_path / "x.png"), f"c={plain}:8/0"]) == 2
    assert not (tmp_path / "x.png").exists()


def test_the_held_out_plot_gives_an_arm_one_colour_and_a_seed_one_style() -> None:
    from engine.experiment.compare import curve_styles

    styles = curve_styles(["passed s0", "fixed s0", "passed s1", "fixed s1", "alone"])
    assert styles["passed s0"][0] == styles["passed s1"][0] != styles["fixed s0"][0] == styles["fixed s1"][0]
    assert styles["passed s0"][1:] == styles["fixed s0"][1:] != styles["passed s1"][1:] == styles["fixed s1"][1:]
    assert styles["alone"][0] not in {styles["passed s0"][0], styles["fixed s0"][0]}


def test_folders_without_question_by_question_answers_give_no_comparison(tmp_path: Path) -> None:
    a = _evaluated(tmp_path / "a", "8/0", [[10.0]], "0", {1: ["1"]})
    b = _timed_folder(tmp_path / "b", "8/0", [[0.1]], [[10.0]]) / "mix-8-0"
    (b / "eval.json").write_text(json.dumps({"round": 1, "nodes": [{"accuracy": 1.0}]}))  # an older folder
    assert held_out_at_equal_time([(a, b)], None, stratified_bootstrap) is None


@pytest.mark.integration  # a real loopback relay
def test_a_tiny_experiment_evaluates_on_the_way_and_compares_at_equal_time(tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    plan = make_plan("default", 2, "2/0", 3, [*fast(tiny_model_dir), "tasks.eval_every=2"])
    run(plan, tmp_path / "fixed", tmp_path / "home")
    adaptive = make_plan("default", 2, "2/0", 3, [*fast(tiny_model_dir), "tasks.eval_every=2",
                                                  "tasks.difficulty='adaptive'", "tasks.eval_harder=true"])
    run(adaptive, tmp_path / "adaptive", tmp_path / "home")
    lines = (tmp_path / "fixed" / "mix-2-0" / "evals.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [2]  # round 3, the last, is eval.json's
    passes = json.loads(lines[0])["nodes"][0]["passes"]
    assert len(passes) == 9 and set(passes) <= {"0", "1"}
    assert "harder" not in json.loads(lines[0])
    # With tasks.eval_harder, every evaluation also has the set one level up, answer by answer, beside the default.
    records = [json.loads((tmp_path / "adaptive" / "eval-start.json").read_text()),
               json.loads((tmp_path / "adaptive" / "mix-2-0" / "evals.jsonl").read_text().splitlines()[0]),
               json.loads((tmp_path / "adaptive" / "mix-2-0" / "eval.json").read_text())]
    for record in records:
        harder = record["harder"]
        assert harder["questions"] == record["questions"] == 9
        assert [len(n["passes"]) for n in harder["nodes"]] == [9] * len(record["nodes"])
    assert "Held-out one level harder" in (tmp_path / "adaptive" / "report.md").read_text()
    assert "Held-out one level harder" not in (tmp_path / "fixed" / "report.md").read_text()
    result = compare(tmp_path / "adaptive", tmp_path / "fixed", "2/0")["held_out_per_hour"]
    assert result is not None and len(result["pairs"][0]["hours"]) == 2
    assert result["pairs"][0]["same_round"] == 3
