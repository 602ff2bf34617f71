"""The report of `sapling-node experiment`: report.json, report.md and reward.png in --out.

Definitions (docs/swarm.md, "The experiment"): a node's reward in a round
is the mean reward of its own rollouts that round (all B questions it wrote);
the cumulative reward of a mix is the sum of that over nodes and rounds, as in
the SAPO paper. The ratio to the all-local mix (J = 0, same I + J) is taken
over the rounds both have, with a bootstrap 95% interval that resamples
nodes and rounds independently (two-way), since every mix runs the same node
seeds and question streams.

Comparisons across experiment folders (a mix against itself with a setting
changed, pooled over seeds, several folders in one plot) are
engine/experiment/compare.py. The command line that rebuilds a report, pairs
folders run on the same seeds (--compare), pools seeds (--pool) and plots
several folders together (--plot) is bench/experiment_report.py.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_bytes, atomic_write_json, atomic_write_text
from engine.common.config import NodeConfig, SwarmConfig
from engine.experiment.hours import clock_for, per_hour, reward_by_hour, timed
from engine.experiment.plan import (
    EVAL_FILE,
    ROUNDS_FILE,
    VETERANS_FOLDER,
    parse_mixes,
    read_json,
    read_rounds,
    rounds_done,
)

# The SAPO paper's cumulative rewards (8 Qwen2.5-0.5B nodes, I + J = 8), arXiv 2509.08721.
PAPER_CUMULATIVE = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}
BOOTSTRAP_SAMPLES = 2000
WINDOW = 10  # first-10 against last-10 rounds


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def two_way_bootstrap(a: list[list[float]], b: list[list[float]], samples: int = BOOTSTRAP_SAMPLES,
                      seed: int = 0) -> dict[str, Any]:
    """Ratio sum(a)/sum(b) and difference mean(a)-mean(b) of paired [node][round] tables, with
    95% intervals from resampling nodes and rounds independently (percentile bootstrap)."""
    return stratified_bootstrap([(a, b)], samples, seed)


def stratified_bootstrap(strata: Sequence[tuple[list[list[float]], list[list[float]]]],
                         samples: int = BOOTSTRAP_SAMPLES,
                         seed: int = 0) -> dict[str, Any]:
    """`two_way_bootstrap` over several independent pairs of tables (e.g. one per experiment seed).

    Each stratum's nodes and rounds are resampled within it, as in the
    two-way bootstrap, and the strata's sums are added: seeds are not
    mixed, since a round of one seed has nothing to do with the same round
    of another. With one stratum it is exactly `two_way_bootstrap`.
    """
    strata = [(a, b) for a, b in strata if a and a[0]]
    if not strata:
        return {"ratio": None, "ratio_ci95": None, "difference": None, "difference_ci95": None}
    rng = random.Random(seed)
    cells = sum(len(a) * len(a[0]) for a, _ in strata)
    total_a = sum(sum(map(sum, a)) for a, _ in strata)
    total_b = sum(sum(map(sum, b)) for _, b in strata)
    ratios: list[float] = []
    diffs: list[float] = []
    for _ in range(samples):
        sa = sb = 0.0
        for a, b in strata:
            nodes, rounds = len(a), len(a[0])
            ks = [rng.randrange(nodes) for _ in range(nodes)]
            rs = [rng.randrange(rounds) for _ in range(rounds)]
            sa += sum(a[k][r] for k in ks for r in rs)
            sb += sum(b[k][r] for k in ks for r in rs)
        diffs.append((sa - sb) / cells)
        if sb > 0:
            ratios.append(sa / sb)
    ratios.sort()
    diffs.sort()

    def interval(values: list[float]) -> list[float] | None:
        if not values:
            return None
        return [values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]]

    return {
        "ratio": total_a / total_b if total_b > 0 else None,
        "ratio_ci95": interval(ratios),
        "difference": (total_a - total_b) / cells,
        "difference_ci95": interval(diffs),
    }


def reward_table(records: list[dict[str, Any]], nodes: int) -> tuple[list[list[float]], list[float]]:
    """Each node's reward by round [node][round], and the nodes' mean reward by round."""
    return [[rec["rewards"][k] for rec in records] for k in range(nodes)], [sum(rec["rewards"]) / nodes
                                                                            for rec in records]


def _mix_summary(records: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    table, per_round = reward_table(records, nodes)
    rejected: dict[str, int] = {}
    for rec in records:
        for counts in rec.get("rejected", []):
            for reason, count in counts.items():
                rejected[reason] = rejected.get(reason, 0) + int(count)
    return {
        "rounds_done": len(records),
        "cumulative_reward": sum(map(sum, table)),
        "mean_reward": _mean(per_round),
        "reward_by_round": per_round,
        "reward_by_node": [sum(row) for row in table],
        "first10_mean_reward": _mean(per_round[:WINDOW]),
        "last10_mean_reward": _mean(per_round[-WINDOW:]),
        "external_groups_per_node_round": _mean([sum(rec["external_groups"]) / nodes for rec in records]),
        "informative_groups_per_node_round": _mean([sum(rec["informative_groups"]) / nodes for rec in records]),
        "trained_own_informative_per_node_round": _mean([sum(rec["trained_own_informative"]) / nodes
                                                         for rec in records]),
        # tasks.reask_share: own questions asked again per node and round, and the share of them that taught again
        "reasked_per_node_round": _mean([sum(rec.get("reasked", [0])) / nodes for rec in records]),
        "reasked_informative_share": _share(sum(sum(rec.get("reasked_informative", [0])) for rec in records),
                                            sum(sum(rec.get("reasked", [0])) for rec in records)),
        "rejected_external_items": rejected,
        "seconds_per_round": _mean([rec["seconds"] for rec in records]),
        "generate_seconds_per_round": _mean([rec["generate_seconds"] for rec in records]),
        "train_seconds_per_round": _mean([rec["train_seconds"] for rec in records]),
    }


def baseline_of(label: str, labels: list[str]) -> str | None:
    """The all-local mix a mix is measured against, when the experiment ran it: the one with the same
    I + J (8/0 for 4/4, the paper's comparison), else the node alone with its same I own groups
    (8/0 for 8/4: a default node, which trains on all its own groups plus J from the swarm)."""
    i, j = (int(x) for x in label.split("/"))
    if j == 0:
        return None
    for base in (f"{i + j}/0", f"{i}/0"):
        if base in labels:
            return base
    return None


# A newcomer "reaches" the veterans when its mean reward over this many rounds first equals their starting reward.
REACH_WINDOW = 5


def veterans_start(out: Path, plan: Any) -> dict[str, Any] | None:
    """The veterans' reward when the newcomers joined: their mean over the last REACH_WINDOW rounds of their
    own training, and their held-out accuracy then."""
    folder = Path(out) / VETERANS_FOLDER
    records = read_rounds(folder / ROUNDS_FILE, rounds_done(folder))
    if len(records) < plan.veteran_rounds:
        return None
    tail = records[-REACH_WINDOW:]
    reward = sum(sum(rec["rewards"]) / len(rec["rewards"]) for rec in tail) / len(tail)
    evaluation = read_json(folder / EVAL_FILE)
    return {"rounds": plan.veteran_rounds, "reward": reward,
            "accuracy": evaluation["accuracy"] if evaluation else None}


def first_reach(rewards: list[float], target: float, window: int = REACH_WINDOW) -> int | None:
    """The first round (1-based, the window's last) at which the mean of the last `window` rewards is >= target."""
    for end in range(window, len(rewards) + 1):
        if sum(rewards[end - window : end]) / window >= target:
            return end
    return None


def newcomer_summary(records: list[dict[str, Any]], plan: Any, start: dict[str, Any] | None,
                     evaluation: dict[str, Any] | None) -> dict[str, Any]:
    """The fresh nodes' own numbers in a mix of a veterans experiment."""
    fresh = list(range(plan.veterans, plan.nodes))
    table = [[rec["rewards"][k] for rec in records] for k in fresh]
    result: dict[str, Any] = {"nodes": fresh, "cumulative_reward": sum(map(sum, table)),
                              "reward_by_node": [sum(row) for row in table]}
    if start is not None:
        result["reached_veterans_round"] = [first_reach(row, start["reward"]) for row in table]
    if evaluation and "nodes" in evaluation:
        result["held_out_accuracy"] = [evaluation["nodes"][k]["accuracy"] for k in fresh]
    return result


def build_report(plan: Any, config: NodeConfig, out: Path, start_eval: dict[str, Any] | None) -> dict[str, Any]:
    out = Path(out)
    labels = [m.label for m in plan.mixes]
    records: dict[str, list[dict[str, Any]]] = {}
    mixes: dict[str, Any] = {}
    for mix in plan.mixes:
        records[mix.label] = read_rounds(out / mix.slug / ROUNDS_FILE, rounds_done(out / mix.slug))
        summary = _mix_summary(records[mix.label], plan.nodes)
        summary["complete"] = summary["rounds_done"] >= plan.rounds
        summary["eval_start"] = start_eval
        summary["eval_end"] = read_json(out / mix.slug / EVAL_FILE)
        summary["paper_cumulative_reward"] = PAPER_CUMULATIVE.get(mix.label)
        if plan.veterans:
            summary["veterans_start"] = veterans = veterans_start(out, plan)
            summary["newcomers"] = newcomer_summary(records[mix.label], plan, veterans, summary["eval_end"])
        mixes[mix.label] = summary
    for label in labels:
        base = baseline_of(label, labels)
        if base is None:
            continue
        common = min(len(records[label]), len(records[base]))
        a = [[rec["rewards"][k] for rec in records[label][:common]] for k in range(plan.nodes)]
        b = [[rec["rewards"][k] for rec in records[base][:common]] for k in range(plan.nodes)]
        mixes[label]["against_baseline"] = {"baseline": base, "rounds": common, **two_way_bootstrap(a, b)}
        if plan.veterans:
            fresh = slice(plan.veterans, plan.nodes)
            mixes[label]["newcomers"]["against_baseline"] = {"baseline": base, "rounds": common,
                                                             **two_way_bootstrap(a[fresh], b[fresh])}
        if common:  # None when the rounds were not timed
            mixes[label]["per_hour"] = per_hour([(out / mix_slug(label), out / mix_slug(base))], None,
                                                  stratified_bootstrap)
        if base in PAPER_CUMULATIVE and label in PAPER_CUMULATIVE:
            mixes[label]["against_baseline"]["paper_ratio"] = PAPER_CUMULATIVE[label] / PAPER_CUMULATIVE[base]
    t = config.tasks
    return {
        "plan": plan.to_json(),
        "settings": {
            "model": config.model.source, "questions_per_round": t.questions_per_round,
            "completions_per_question": t.completions_per_question, "max_new_tokens": t.max_new_tokens,
            "temperature": t.temperature, "eval_questions": t.eval_questions if t.eval_every > 0 else 0,
            "learning_rate": config.grpo.learning_rate, "lora_rank": config.grpo.lora_rank, "seed": config.run.seed,
            "train_groups": config.swarm.train_groups,
        },
        "complete": all(m["complete"] for m in mixes.values()),
        "mixes": mixes,
    }


def mix_slug(label: str) -> str:
    """The folder of mix `label` in an experiment's folder (4/4 -> its `Mix.slug`)."""
    return parse_mixes(label)[0].slug


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio_ci(result: dict[str, Any]) -> str:
    ci = result.get("ratio_ci95") or [None, None]
    return "-" if result.get("ratio") is None else f"{result['ratio']:.3f} [{_fmt(ci[0])}, {_fmt(ci[1])}]"


def _pct(evaluation: dict[str, Any] | None) -> str:
    return "-" if not evaluation else f"{100 * evaluation['accuracy']:.1f}%"


def _swarm_groups_line(report: dict[str, Any]) -> list[str]:
    """What a joined mix's J means here: exactly J swarm groups (no cap, the experiment's own setting) or swarm
    groups only up to the node's cap on its batch (the app's default node); none for a report without a joined
    mix, or one written before the cap was recorded."""
    cap = report["settings"].get("train_groups")
    if cap is None or all(label.endswith("/0") for label in report["plan"]["mixes"]):
        return []
    if cap == 0:
        default = SwarmConfig().train_groups
        return ["A mix I/J trains on all its own groups and exactly J swarm groups a round (swarm.train_groups=0, "
                f"no cap): not the app's default node, which is `--set swarm.train_groups={default}`."]
    return [f"A mix I/J trains on its own groups and takes swarm groups only to fill the batch up to {cap} groups "
            f"trained on (swarm.train_groups={cap})."]


def report_markdown(report: dict[str, Any]) -> str:
    plan, s = report["plan"], report["settings"]
    lines = [
        f"# Experiment: {plan['nodes']} nodes, mixes {', '.join(plan['mixes'])}, {plan['rounds']} rounds",
        "",
        f"Model {s['model']}; B = {s['questions_per_round']} questions x G = {s['completions_per_question']} "
        f"completions per node per round; seed {s['seed']}; preset {plan['preset']}"
        + (f"; --set {' '.join(plan['overrides'])}" if plan["overrides"] else "") + ".",
        *_swarm_groups_line(report),
        "" if report["complete"] else "**Partial: not every mix has run all its rounds.**",
        "",
        "| mix | rounds | cumulative reward | mean reward / round | first 10 | last 10 | held-out start -> end | "
        "ratio to baseline [95% CI] | difference / node-round [95% CI] | paper cumulative (ratio) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, m in report["mixes"].items():
        against = m.get("against_baseline")
        ratio = diff = "-"
        if against and against["ratio"] is not None:
            ci = against["ratio_ci95"] or [None, None]
            ratio = f"{against['ratio']:.3f} [{_fmt(ci[0])}, {_fmt(ci[1])}] vs {against['baseline']}"
            dci = against["difference_ci95"] or [None, None]
            diff = f"{against['difference']:+.4f} [{_fmt(dci[0], 4)}, {_fmt(dci[1], 4)}]"
        paper = m["paper_cumulative_reward"]
        paper_text = "-" if paper is None else f"{paper:.2f}" + (
            f" ({against['paper_ratio']:.2f})" if against and "paper_ratio" in against else " (1.00)"
            if label.endswith("/0") else "")
        lines.append(
            f"| {label} | {m['rounds_done']} | {m['cumulative_reward']:.2f} | {_fmt(m['mean_reward'])} | "
            f"{_fmt(m['first10_mean_reward'])} | {_fmt(m['last10_mean_reward'])} | "
            f"{_pct(m['eval_start'])} -> {_pct(m['eval_end'])} | {ratio} | {diff} | {paper_text} |"
        )
    harder = {label: (m["eval_start"]["harder"], (m["eval_end"] or {}).get("harder"))
              for label, m in report["mixes"].items() if m.get("eval_start") and "harder" in m["eval_start"]}
    if harder:
        lines += ["", "Held-out one level harder (tasks.eval_harder; the same questions' seeds, each specialty a level "
                  "up): " + "; ".join(f"{label} {_pct(start)} -> {_pct(end)}" for label, (start, end) in harder.items())
                  + "."]
    hourly = {label: m["per_hour"] for label, m in report["mixes"].items() if m.get("per_hour")}
    if hourly:
        clocks = sorted({h.get("clock", "wall") for h in hourly.values()})
        lines += ["", "Per hour: each node's reward against the seconds it spent (engine/experiment/hours.py), "
                  f"over the time both runs of that node cover; {' and '.join(clocks)} clock.", "",
                  "| mix | hours per node (common) | ratio of time-averaged reward [95% CI] | at the end (last "
                  "quarter) [95% CI] |",
                  "|---|---|---|---|"]
        for label, h in hourly.items():
            hours = h["pairs"][0]["hours"]
            lines.append(f"| {label} vs {report['mixes'][label]['against_baseline']['baseline']} | "
                         f"{sum(hours) / len(hours):.2f} | {_ratio_ci(h)} | {_ratio_ci(h['at_end'])} |")
    lines += ["", "Per node and round: groups trained on (own informative + external, all informative), "
              "rejected external items by reason, and seconds per round (all nodes).", "",
              "| mix | own informative trained | external | rejected external items | s / round |",
              "|---|---|---|---|---|"]
    for label, m in report["mixes"].items():
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(m["rejected_external_items"].items())) or "-"
        lines.append(f"| {label} | {_fmt(m['trained_own_informative_per_node_round'], 2)} | "
                     f"{_fmt(m['external_groups_per_node_round'], 2)} | {rejected} | "
                     f"{_fmt(m['seconds_per_round'], 1)} |")
    newcomers = {label: m for label, m in report["mixes"].items() if "newcomers" in m}
    if newcomers:
        start = next(iter(newcomers.values())).get("veterans_start") or {}
        lines += ["", f"Newcomers (nodes {', '.join(map(str, next(iter(newcomers.values()))['newcomers']['nodes']))}) "
                  f"beside {plan.get('veterans', 0)} veterans trained {plan.get('veteran_rounds', 0)} rounds alone "
                  f"(their reward then: {_fmt(start.get('reward'))}, held-out "
                  f"{_pct(start if start.get('accuracy') is not None else None)}).", "",
                  "| mix | newcomers' cumulative reward | ratio to baseline [95% CI] | round its 5-round mean reached "
                  "the veterans' | held-out at the end |",
                  "|---|---|---|---|---|"]
        for label, m in newcomers.items():
            n = m["newcomers"]
            against = n.get("against_baseline")
            ratio = "-"
            if against and against["ratio"] is not None:
                ci = against["ratio_ci95"] or [None, None]
                ratio = f"{against['ratio']:.3f} [{_fmt(ci[0])}, {_fmt(ci[1])}] vs {against['baseline']}"
            reached = ", ".join("not yet" if r is None else str(r) for r in n.get("reached_veterans_round", [])) or "-"
            held = ", ".join(f"{100 * a:.1f}%" for a in n.get("held_out_accuracy", [])) or "-"
            lines.append(f"| {label} | {n['cumulative_reward']:.2f} | {ratio} | {reached} | {held} |")
    lines += ["", "![reward per round](reward.png)", "", "![reward against hours](reward-hours.png)", ""]
    return "\n".join(lines)


def plot_rewards(report: dict[str, Any]) -> bytes:
    """Reward per round for each mix, averaged over nodes (thin), with a 5-round running mean (thick)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for label, m in report["mixes"].items():
        ys = m["reward_by_round"]
        if not ys:  # not started yet: no line, and no "cumulative 0.0" in the legend
            continue
        xs = list(range(1, len(ys) + 1))
        line = ax.plot(xs, ys, linewidth=0.8, alpha=0.45)[0]
        smooth = [sum(ys[max(0, i - 4) : i + 1]) / len(ys[max(0, i - 4) : i + 1]) for i in range(len(ys))]
        ax.plot(xs, smooth, color=line.get_color(), linewidth=2.2,
                label=f"{label} (cumulative {m['cumulative_reward']:.1f})")
    plan = report["plan"]
    ax.set_title(f"Reward per round, mean of {plan['nodes']} nodes ({report['settings']['model']})")
    ax.set_xlabel("round")
    ax.set_ylabel("mean reward of own rollouts")
    ax.grid(alpha=0.3)
    ax.legend(title=report.get("legend_title", "I/J (5-round running mean)"))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def plot_hours(curves: dict[str, tuple[list[float], list[float]]], title: str, clock: str = "wall") -> bytes:
    """Reward against hours on the node's own computer, one line per label (engine.experiment.hours.reward_by_hour)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for label, (hours, rewards) in curves.items():
        smooth = [sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1])
                  for i in range(len(rewards))]
        line = ax.plot(hours, rewards, linewidth=0.8, alpha=0.4)[0]
        ax.plot(hours, smooth, color=line.get_color(), linewidth=2.2, label=label)
    ax.set_title(title)
    ax.set_xlabel("hours on the node's own computer" if clock == "wall"
                  else "CPU hours on the node's own computer (all its threads)")
    ax.set_ylabel("mean reward of own rollouts")
    ax.grid(alpha=0.3)
    ax.legend(title="time-weighted, running mean")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def write_report(report: dict[str, Any], out: Path) -> None:
    out = Path(out)
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", report_markdown(report))
    atomic_write_bytes(out / "reward.png", plot_rewards(report))
    folders = {label: out / mix_slug(label) for label, m in report["mixes"].items()
               if m["rounds_done"] and timed(out / mix_slug(label))}
    clock = clock_for(list(folders.values()))
    curves = {label: reward_by_hour(folder, clock=clock) for label, folder in folders.items()}
    if curves:
        atomic_write_bytes(out / "reward-hours.png", plot_hours(
            curves, f"Reward against time, mean of {report['plan']['nodes']} nodes ({report['settings']['model']})",
            clock))
