"""Mixes compared per hour: time slices worked out by hand, the per-node charge, and the report on a tiny model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from engine.common.device import cpu_bf16_supported
from engine.experiment.compare import compare, pooled_compare
from engine.experiment.hours import NodeClock, hour_tables, per_hour, round_cost, time_slices
from engine.experiment.plan import make_plan
from engine.experiment.report import stratified_bootstrap
from tests.engine.test_experiment import fast, run


def test_a_slice_is_the_time_weighted_mean_of_the_rounds_it_covers() -> None:
    assert time_slices([1.0, 0.0], [1.0, 3.0], 2.0, 2) == pytest.approx([1.0, 0.0])
    assert time_slices([1.0, 0.0], [1.0, 3.0], 4.0, 2) == pytest.approx([0.5, 0.0])
    # a round that straddles a slice's edge counts for the part it covers: (0.2 * 0.5 + 0.6 * 0.5) / 1
    assert time_slices([0.2, 0.6], [1.5, 1.5], 3.0, 3) == pytest.approx([0.2, 0.4, 0.6])
    with pytest.raises(ValueError, match="positive"):
        time_slices([0.5], [1.0], 0.0)


def test_each_node_is_compared_over_the_time_both_of_its_runs_cover() -> None:
    # node 0: A takes 4 s a round at reward 0.5, B 2 s a round at 0.25 -> over B's 4 s: 0.5 against 0.25
    a = ([[0.5, 0.5]], [[4.0, 4.0]])
    b = ([[0.25, 0.25]], [[2.0, 2.0]])
    ta, tb, horizons = hour_tables(a, b, slices=4)
    assert horizons == [4.0]
    assert ta == [pytest.approx([0.5] * 4)] and tb == [pytest.approx([0.25] * 4)]


def test_a_shared_stretch_is_charged_by_weight_and_a_timed_one_to_its_node() -> None:
    clock = NodeClock(2)
    clock.share(9.0, [1, 2], "generate")
    clock.charge(1, 1.5, "train")
    clock.share(2.0, [0, 0])  # no weights: split equally
    assert clock.parts["generate"] == pytest.approx([3.0, 6.0]) and clock.parts["train"] == [0.0, 1.5]
    assert [clock.total(0), clock.total(1)] == pytest.approx([4.0, 8.5])


def _timed_folder(root: Path, mix: str, rewards: list[list[float]], seconds: list[list[float]],
                  cpu: list[list[float]] | None = None) -> Path:
    """An experiment folder holding one mix whose rounds carry `node_seconds` (and `node_cpu_seconds` when given),
    as the experiment writes them."""
    from engine.experiment.plan import parse_mixes

    slug = root / parse_mixes(mix)[0].slug
    slug.mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps(
        {"nodes": len(rewards[0]), "mixes": [mix], "rounds": len(rewards), "preset": "default", "overrides": []}))
    (slug / "progress.json").write_text(json.dumps({"round": len(rewards)}))
    (slug / "rounds.jsonl").write_text("".join(
        json.dumps({"round": r + 1, "rewards": row, "node_seconds": secs, "seconds": sum(secs), "machine": "test",
                    **({"node_cpu_seconds": cpu[r]} if cpu else {})}) + "\n"
        for r, (row, secs) in enumerate(zip(rewards, seconds, strict=True))))
    return root


def test_pooling_per_hour_pairs_each_seeds_nodes_over_their_common_time(tmp_path: Path) -> None:
    # Joined rounds take twice as long and earn 0.3 against alone's 0.2: per round 1.5x, per hour the same
    # per time slice (0.3 against 0.2 over the joined run's length), but over half as many rounds.
    joined = _timed_folder(tmp_path / "j", "8/4", [[0.3, 0.3]] * 2, [[20.0, 20.0]] * 2)
    alone = _timed_folder(tmp_path / "a", "8/0", [[0.2, 0.2]] * 4, [[10.0, 10.0]] * 4)
    result = pooled_compare([(joined, alone)], "8/4", "8/0")
    assert result["ratio"] == pytest.approx(0.6 / 0.4)  # the two rounds both have
    hourly = result["per_hour"]
    assert hourly["ratio"] == pytest.approx(1.5) and hourly["at_end"]["ratio"] == pytest.approx(1.5)
    assert hourly["pairs"][0]["hours"] == pytest.approx([40 / 3600] * 2)
    # joined earning only 0.15 per slice would lose per hour, whatever it earns per round
    slow = _timed_folder(tmp_path / "s", "8/4", [[0.15, 0.15]] * 2, [[40.0, 40.0]] * 2)
    assert per_hour([(slow / "mix-8-4", alone / "mix-8-0")], None, stratified_bootstrap)["ratio"] == pytest.approx(0.75)


def test_a_pause_counts_on_the_wall_clock_but_not_on_the_cpu_clock(tmp_path: Path) -> None:
    # The joined run was stopped (SIGSTOP) for 60 s during its first round: its wall clock says that round took
    # 80 s, its CPU clock the 20 s of work it did. It earns 0.1, then 0.5; alone earns 0.3 a round. Per CPU second
    # the two are equal; on the wall clock the common 40 s cover only the joined run's paused first round.
    paused = _timed_folder(tmp_path / "j", "8/4", [[0.1, 0.1], [0.5, 0.5]], [[80.0, 80.0], [20.0, 20.0]],
                           [[20.0, 20.0]] * 2)
    alone = _timed_folder(tmp_path / "a", "8/0", [[0.3, 0.3]] * 4, [[10.0, 10.0]] * 4, [[10.0, 10.0]] * 4)
    hourly = per_hour([(paused / "mix-8-4", alone / "mix-8-0")], None, stratified_bootstrap)
    assert hourly["clock"] == "cpu" and hourly["ratio"] == pytest.approx(1.0)
    # without CPU seconds on one side, both sides fall back to the wall clock, where the pause costs the joined run
    wall_only = _timed_folder(tmp_path / "w", "8/0", [[0.3, 0.3]] * 4, [[10.0, 10.0]] * 4)
    hourly = per_hour([(paused / "mix-8-4", wall_only / "mix-8-0")], None, stratified_bootstrap)
    assert hourly["clock"] == "wall" and hourly["ratio"] == pytest.approx(0.1 / 0.3)


def test_the_clock_charges_cpu_seconds_of_a_timed_stretch_and_splits_a_shared_one() -> None:
    clock = NodeClock(2)
    with clock.timing(0, "train"):
        deadline = time.process_time() + 0.05
        while time.process_time() < deadline:  # busy: CPU time passes
            pass
    with clock.timing(1):
        time.sleep(0.05)  # asleep: wall time passes, CPU time hardly
    assert clock.cpu[0] >= 0.05 and clock.cpu[1] < 0.02 < clock.seconds[1]
    clock.share(1.0, [1, 3], cpu=2.0)
    assert clock.cpu[1] == pytest.approx(1.5, abs=0.02)


def test_untimed_rounds_give_no_per_hour_comparison(tmp_path: Path) -> None:
    from tests.engine.test_experiment import _fake_experiment

    _fake_experiment(tmp_path / "a", [[0.1, 0.2]])
    _fake_experiment(tmp_path / "b", [[0.1, 0.3]], mix="8/0")
    assert pooled_compare([(tmp_path / "a", tmp_path / "b")], "4/4", "8/0")["per_hour"] is None
    from bench.experiment_report import main

    assert main(["--plot-hours", str(tmp_path / "h.png"), f"a={tmp_path / 'a'}:4/4"]) == 2  # nothing timed to plot
    assert not (tmp_path / "h.png").exists()


@pytest.mark.integration  # a real loopback relay
def test_a_tiny_experiment_charges_every_node_and_reports_per_hour(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan("default", 2, "2/0,1/1", 2, [*fast(tiny_model_dir), "tasks.eval_every=0"])
    _, report = run(plan, tmp_path / "out", tmp_path / "home")
    precision = "bf16" if cpu_bf16_supported() else "fp32"  # `auto`: bf16 on a CPU with AVX512-BF16 or AMX
    for slug in ("mix-2-0", "mix-1-1"):
        for line in (tmp_path / "out" / slug / "rounds.jsonl").read_text().splitlines():
            record: dict[str, Any] = json.loads(line)
            charged = sum(record["node_seconds"])
            assert 0 < charged <= record["seconds"] * 1.001  # no second is charged twice
            assert all(c > 0 for c in record["node_cpu_seconds"])
            assert all(t > 0 for t in record["node_train_seconds"]) and f", {precision}, " in record["machine"]
    hourly = report["mixes"]["1/1"]["per_hour"]
    assert hourly["ratio"] > 0 and len(hourly["pairs"][0]["hours"]) == 2 and hourly["clock"] == "cpu"
    assert "Per hour" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "reward-hours.png").read_bytes()[:4] == b"\x89PNG"


def _with_costs(folder: Path, cpu: float, tokens: float, rounds: int = 2) -> None:
    """Give a fake experiment's mix (8/0, 2 nodes) seconds in its records and tokens in each node's metrics."""
    slug = folder / "mix-8-0"
    records = [json.loads(line) for line in (slug / "rounds.jsonl").read_text().splitlines()]
    for record in records:
        record.update(node_cpu_seconds=[cpu, 2 * cpu], node_generate_seconds=[cpu / 2, cpu],
                      node_train_seconds=[cpu / 2, cpu])
    (slug / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for node in (0, 1):
        (slug / f"node-{node}").mkdir()
        lines = [{"kind": "round", "round": r, "completions": 4, "completion_tokens_mean": tokens, "train_tokens": 10}
                 for r in range(1, rounds + 1)]
        lines.append({"kind": "eval", "round": rounds, "accuracy": 0.5})  # an evaluation of the same round
        (slug / f"node-{node}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn')


def test_round_cost_pairs_seconds_and_tokens_node_round_by_node_round(tmp_path: Path) -> None:
    from tests.engine.test_experiment import _fake_experiment

    for name, cpu, tokens in (("a", 2.0, 30.0), ("b", 3.0, 30.0)):
        _fake_experiment(tmp_path / name, [[0.1, 0.2], [0.3, 0.1]], mix="8/0")
        _with_costs(tmp_path / name, cpu, tokens)
    cost = round_cost([(tmp_path / "a" / "mix-8-0", tmp_path / "b" / "mix-8-0")], None, stratified_bootstrap)
    assert cost["cpu_seconds"]["ratio"] == pytest.approx(2 / 3)  # A's rounds take two thirds of B's CPU
    assert cost["train_seconds"]["ratio"] == pytest.approx(2 / 3)
    assert cost["generated_tokens"]["ratio"] == pytest.approx(1.0)  # for the same work
    assert cost["trained_tokens"]["ratio_ci95"] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert compare(tmp_path / "a", tmp_path / "b", "8/0")["round_cost"] == cost
    assert pooled_compare([(tmp_path / "a", tmp_path / "b")], "8/0", "8/0")["round_cost"] == cost
    _fake_experiment(tmp_path / "old", [[0.1, 0.2], [0.3, 0.1]], mix="8/0")  # records from before the clocks
    old = round_cost([(tmp_path / "a" / "mix-8-0", tmp_path / "old" / "mix-8-0")], None, stratified_bootstrap)
    assert old["cpu_seconds"] is None and old["generated_tokens"] is None
