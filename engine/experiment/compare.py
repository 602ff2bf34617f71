"""Mixes of several experiment folders side by side: paired, pooled over seeds, and drawn in one plot.

`compare` pairs a mix in two folders run on the same seeds (a setting
changed) round by round; `pooled_compare` pools such pairs, one per seed, as
the strata of a stratified bootstrap; `hours_plot`, `held_out_plot` and
`variants_plot` draw mixes from several folders (each named LABEL=DIR:MIX)
on one set of axes. bench/experiment_report.py's --compare, --pool and --plot
call them.

This is its own room because it reads across folders: engine/experiment/report.py
is one folder's report (its numbers, their table and its plots), and this module
takes that report's bootstrap, reward table and plots and applies them to folders
that were run apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.common.config import SwarmConfig
from engine.experiment.heldout import held_out_at_equal_time, read_evaluations
from engine.experiment.hours import clock_for, per_hour, reward_by_hour, round_cost
from engine.experiment.plan import (
    ROUNDS_FILE,
    parse_mixes,
    plan_config,
    plan_with_mix,
    read_rounds,
    rounds_done,
    saved_plan,
)
from engine.experiment.report import (
    mix_slug,
    plot_hours,
    plot_rewards,
    reward_table,
    stratified_bootstrap,
    two_way_bootstrap,
)


def _mix_rounds(folder: Path, label: str) -> tuple[Any, list[dict[str, Any]]]:
    """The plan of the experiment in `folder` and the round records of its mix `label` finished so far."""
    try:
        mix = parse_mixes(label)[0]
    except ValueError:
        raise ValueError(f"{label!r} is not a mix of two whole numbers like 4/4.") from None
    plan = plan_with_mix(folder, label)
    return plan, read_rounds(folder / mix.slug / ROUNDS_FILE, rounds_done(folder / mix.slug))


def what_it_measures(folder: Path, label: str) -> str:
    """What a mix of an experiment stands for, in words: alone, the app's default joined node, or a mix with
    exactly J swarm groups a round. The experiment's preset turns the node's cap on the training batch off
    (swarm.train_groups=0, so that I/J means exactly J), so an 8/4 is the app's default only when the cap was
    set; a comparison says which it is, so that a table cannot call one the other."""
    plan = plan_with_mix(folder, label)  # the plan only: the round records are read where they are paired
    mix = parse_mixes(label)[0]
    if mix.external == 0:
        return f"{label}: alone (own groups only)"
    cap, default = plan_config(plan).swarm.train_groups, SwarmConfig().train_groups
    if cap == 0:
        return (f"{label}: all own groups and exactly {mix.external} swarm groups a round (swarm.train_groups=0, "
                f"no cap; the app's default node caps the batch at {default})")
    who = "the app's default joined node" if cap == default else "a joined node"
    return (f"{label}: {who}, swarm groups only to fill the batch up to {cap} groups trained on "
            f"(swarm.train_groups={cap})")


def settings_that_differ(a_dir: Path, b_dir: Path) -> dict[str, list[Any]]:
    """The settings of two experiments that differ (section.key: [A's, B's]); the mixes are named apart."""
    plan_a, plan_b = saved_plan(Path(a_dir)), saved_plan(Path(b_dir))
    if plan_a is None or plan_b is None:
        return {}
    a, b = asdict(plan_config(plan_a)), asdict(plan_config(plan_b))
    return {f"{section}.{key}": [a[section][key], b[section].get(key)]
            for section in a for key in a[section] if a[section][key] != b[section].get(key)}


def compare(a_dir: Path, b_dir: Path, label: str, label_b: str | None = None,
            nodes: Sequence[int] | None = None) -> dict[str, Any]:
    """A mix in two experiment folders run on the same seeds (a setting changed): A against B.

    label_b: B's mix when it is another one (e.g. 4/4 with a setting changed against 8/0).

    Rounds are paired by number over the rounds both have finished; the ratio of
    cumulative rewards and the difference per node-round get the same two-way
    bootstrap as a mix against 8/0, and the first round where any node's reward
    differs says when the runs parted.
    """
    a, b = paired_tables(Path(a_dir), Path(b_dir), label, label_b or label, nodes)
    folders = [(Path(a_dir) / mix_slug(label), Path(b_dir) / mix_slug(label_b or label))]
    common, count = len(a[0]) if a else 0, len(a)
    parted = next((r + 1 for r in range(common) if any(a[k][r] != b[k][r] for k in range(count))), None)
    return {"mix": label, **({"mix_b": label_b} if label_b else {}), "a": str(a_dir), "b": str(b_dir), "rounds": common,
            "nodes": count, **({"only_nodes": list(nodes)} if nodes is not None else {}),
            "measures": {"a": what_it_measures(Path(a_dir), label),
                         "b": what_it_measures(Path(b_dir), label_b or label)},
            "settings_that_differ": settings_that_differ(Path(a_dir), Path(b_dir)),
            "cumulative_a": sum(map(sum, a)), "cumulative_b": sum(map(sum, b)), "first_round_that_differs": parted,
            **two_way_bootstrap(a, b),
            "per_hour": per_hour(folders, nodes, stratified_bootstrap),
            "held_out_per_hour": held_out_at_equal_time(folders, nodes, stratified_bootstrap),
            "round_cost": round_cost(folders, nodes, stratified_bootstrap)}


def paired_tables(a_dir: Path, b_dir: Path, label: str, label_b: str,
                   nodes: Sequence[int] | None = None) -> tuple[list[list[float]], list[list[float]]]:
    """The [node][round] rewards of A's mix and B's over the rounds both have finished.

    nodes: only these nodes' rows (e.g. the newcomers of a veterans experiment); all by default."""
    (plan_a, recs_a), (plan_b, recs_b) = _mix_rounds(a_dir, label), _mix_rounds(b_dir, label_b)
    if plan_a.nodes != plan_b.nodes:
        raise ValueError(f"the two experiments have {plan_a.nodes} and {plan_b.nodes} nodes; they do not pair.")
    rows = list(range(plan_a.nodes)) if nodes is None else list(nodes)
    if not rows or any(not 0 <= k < plan_a.nodes for k in rows):
        raise ValueError(f"--nodes must name nodes from 0 to {plan_a.nodes - 1}, got {rows}.")
    common = min(len(recs_a), len(recs_b))
    a, b = reward_table(recs_a[:common], plan_a.nodes)[0], reward_table(recs_b[:common], plan_a.nodes)[0]
    return [a[k] for k in rows], [b[k] for k in rows]


def pooled_compare(pairs: Sequence[tuple[Path, Path]], label: str, label_b: str,
                   nodes: Sequence[int] | None = None) -> dict[str, Any]:
    """MIX in A against MIX_B in B, pooled over several (A, B) pairs, each pair run on its own seed.

    Within a pair, rounds are paired as in `compare`; the pairs are the
    strata of `stratified_bootstrap`. Each pair's own comparison is
    reported beside the pooled one.
    """
    if not pairs:
        raise ValueError("give at least one DIR_A,DIR_B pair.")
    strata = []
    each = []
    for a_dir, b_dir in pairs:
        a, b = paired_tables(Path(a_dir), Path(b_dir), label, label_b, nodes)
        if not a or not a[0]:
            raise ValueError(f"{a_dir} ({label}) and {b_dir} ({label_b}) have no finished round in common.")
        strata.append((a, b))
        one = two_way_bootstrap(a, b)
        each.append({"a": str(a_dir), "b": str(b_dir), "rounds": len(a[0]), "cumulative_a": sum(map(sum, a)),
                     "cumulative_b": sum(map(sum, b)), "ratio": one["ratio"], "ratio_ci95": one["ratio_ci95"],
                     "measures": {"a": what_it_measures(Path(a_dir), label),
                                  "b": what_it_measures(Path(b_dir), label_b)},
                     "settings_that_differ": settings_that_differ(Path(a_dir), Path(b_dir))})
    measured = {(p["measures"]["a"], p["measures"]["b"]) for p in each}
    if len(measured) > 1:
        raise ValueError("the pairs do not measure the same arms, so they do not pool: "
                         + "; ".join(f"{p['a']}: {p['measures']['a']}; {p['b']}: {p['measures']['b']}" for p in each))
    folders = [(Path(a) / mix_slug(label), Path(b) / mix_slug(label_b)) for a, b in pairs]
    return {"mix": label, "mix_b": label_b, "measures": each[0]["measures"], "pairs": each,
            "cumulative_a": sum(p["cumulative_a"] for p in each),
            "cumulative_b": sum(p["cumulative_b"] for p in each), **stratified_bootstrap(strata),
            "per_hour": per_hour(folders, nodes, stratified_bootstrap),
            "held_out_per_hour": held_out_at_equal_time(folders, nodes, stratified_bootstrap),
            "round_cost": round_cost(folders, nodes, stratified_bootstrap)}


def _variant(spec: str) -> tuple[str, Path, str]:
    """LABEL=DIR:MIX -> (label, folder, mix)."""
    label, equals, rest = spec.partition("=")
    folder, colon, side = rest.rpartition(":")
    if not equals or not colon or not label or not folder:
        raise ValueError(f"{spec!r} is not LABEL=DIR:MIX, like '4/4, filter=runs/swarm-d2-ftis:4/4'.")
    return label, Path(folder), side


def _variant_folders(variants: Sequence[str]) -> tuple[dict[str, Path], str]:
    """The mix folder of each variant (LABEL=DIR:MIX), and the clock they all have."""
    folders = {}
    for spec in variants:
        label, folder, side = _variant(spec)
        _mix_rounds(folder, side)  # a clear error for a folder without that mix
        folders[label] = folder / mix_slug(side)
    return folders, clock_for(list(folders.values()))


def hours_plot(variants: Sequence[str]) -> bytes:
    """Reward against hours of mixes from several folders: each variant is LABEL=DIR:MIX."""
    folders, clock = _variant_folders(variants)
    curves = {label: reward_by_hour(folder, clock=clock) for label, folder in folders.items()}
    return plot_hours(curves, "Reward against time on the node's own computer, mean of its nodes", clock)


def held_out_curve(folder: Path, clock: str) -> tuple[list[float], list[float], list[int]]:
    """A mix's held-out accuracy at each evaluation (mean of its nodes) against its nodes' mean hours by then,
    with the rounds evaluated."""
    evaluations = read_evaluations(folder, clock)
    if evaluations is None:
        raise ValueError(f"{folder} has no held-out evaluations answer by answer (tasks.eval_every was 0, or the "
                         "folder is older than the per-question records).")
    hours = [sum(node[i] for node in evaluations.seconds) / evaluations.nodes / 3600
             for i in range(len(evaluations.rounds))]
    accuracy = [sum(node[i].count("1") / len(node[i]) for node in evaluations.passes) / evaluations.nodes
                for i in range(len(evaluations.rounds))]
    return hours, accuracy, evaluations.rounds


def curve_styles(labels: Sequence[str]) -> dict[str, tuple[int, str, str]]:
    """(colour index, line style, marker) per label: labels that differ only in their last word ("passed s0",
    "passed s1") are one arm and share a colour, and the last word (the seed) picks the style, so arms read apart;
    labels of one word each get a colour of their own."""
    arms = [label.rsplit(" ", 1)[0] if " " in label else label for label in labels]
    tails = [label.rsplit(" ", 1)[1] if " " in label else "" for label in labels]
    arm_index = {a: i for i, a in enumerate(dict.fromkeys(arms))}
    tail_index = {t: i for i, t in enumerate(dict.fromkeys(tails))}
    dashes, markers = ("-", "--", ":", "-."), ("o", "s", "^", "D", "v", "P")
    return {label: (arm_index[arm] % 10, dashes[tail_index[tail] % 4], markers[tail_index[tail] % 6])
            for label, arm, tail in zip(labels, arms, tails, strict=True)}


def held_out_plot(variants: Sequence[str]) -> bytes:
    """Held-out accuracy against hours of mixes from several folders (each variant is LABEL=DIR:MIX): a marker at
    each evaluation, labelled with its round."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folders, clock = _variant_folders(variants)
    curves = {label: held_out_curve(folder, clock) for label, folder in folders.items()}
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    styles = curve_styles(list(curves))
    for label, (hours, accuracy, rounds) in curves.items():
        colour, dashes, marker = styles[label]
        line = ax.plot(hours, [100 * a for a in accuracy], marker=marker, linewidth=1.8, label=label,
                       color=f"C{colour}", linestyle=dashes)[0]
        for h, a, r in zip(hours, accuracy, rounds, strict=True):
            if r:
                ax.annotate(str(r), (h, 100 * a), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=7, color=line.get_color())
    ax.set_title("Held-out accuracy (greedy pass@1) against time, mean of the nodes; numbers: rounds")
    ax.set_xlabel("hours on the node's own computer" if clock == "wall"
                  else "CPU hours on the node's own computer (all its threads)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.grid(alpha=0.3)
    if len(curves) > 4:  # beside the axes: inside, a dozen entries cover the curves' last evaluations
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    else:
        ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def variants_plot(variants: Sequence[str]) -> bytes:
    """One reward plot of mixes from several folders run on the same seeds: each variant is LABEL=DIR:MIX."""
    mixes: dict[str, dict[str, Any]] = {}
    nodes = set()
    for spec in variants:
        label, folder, side = _variant(spec)
        plan, records = _mix_rounds(folder, side)
        table, per_round = reward_table(records, plan.nodes)
        mixes[label] = {"reward_by_round": per_round, "cumulative_reward": sum(map(sum, table))}
        nodes.add(plan.nodes)
    if len(nodes) != 1:
        raise ValueError(f"the variants have different node counts ({sorted(nodes)}); they do not pair.")
    return plot_rewards({"mixes": mixes, "plan": {"nodes": nodes.pop()}, "settings": {"model": "same seeds"},
                         "legend_title": "run (5-round running mean)"})
