"""A long comparison read at every horizon: does a gap between two arms open late?

The paper's swarm beat isolated nodes only after about 175 rounds in its open
demo. A 200-round pair (the default joined node against the same nodes alone)
answers that question only if it is read along the way, not once at the end.
`horizon_table` reads MIX in A against MIX_B in B, pooled over (A, B) pairs run
on the same seeds, after every `every` rounds (25, 50, ... by default, the
rounds held-out accuracy is evaluated at), and gives at each horizon N:

- the pooled comparison up to N as `pooled_compare` makes it (reward per
  round, per hour on each node's own computer, held-out accuracy at equal
  time and after the same round), each with its 95% interval;
- the same reward ratio over the last `window` rounds only (rounds N-window+1
  to N): a gap that opens late shows here first, where the cumulative ratio
  still carries the early rounds;
- which pairs (seeds) had reached N: a seed that has not is left out of that
  horizon, never cut short or padded.

`horizon_plot` draws the three against rounds. bench/experiment_report.py's
--horizon calls them; docs/swarm.md ("The paper's horizon") says how the
numbers are read.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.experiment.compare import paired_tables, pooled_compare
from engine.experiment.plan import parse_mixes, rounds_done
from engine.experiment.report import stratified_bootstrap

EVERY = 25
WINDOW = 25


def rounds_reached(folder: Path, label: str) -> int:
    """The rounds of mix `label` that every node of the experiment in `folder` has finished."""
    return rounds_done(Path(folder) / parse_mixes(label)[0].slug)


def _interval(result: dict[str, Any] | None, value: str, ci: str) -> dict[str, Any] | None:
    if not result or result.get(value) is None:
        return None
    return {"value": result[value], "ci95": result.get(ci)}


def horizon_table(pairs: Sequence[tuple[Path, Path]], label: str, label_b: str,
                  cut: Callable[[Path, int], Path], every: int = EVERY, window: int = WINDOW,
                  nodes: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """One row per horizon N (every `every` rounds) that at least one pair has reached in both its folders.

    cut(folder, N): the folder's records as they stood after round N (engine/experiment/upto.py's
    records_upto, with its cache), so every reader stops at N.
    """
    if every < 1 or window < 1:
        raise ValueError("--every and --window take a whole number of rounds, 1 or more.")
    if not pairs:
        raise ValueError("give at least one DIR_A,DIR_B pair.")
    reached = [min(rounds_reached(a, label), rounds_reached(b, label_b)) for a, b in pairs]
    rows = []
    for horizon in range(every, max(reached) + 1, every):
        here = [(cut(a, horizon), cut(b, horizon)) for (a, b), r in zip(pairs, reached, strict=True) if r >= horizon]
        pooled = pooled_compare(here, label, label_b, nodes)
        strata = []
        for a, b in here:
            ta, tb = paired_tables(a, b, label, label_b, nodes)
            start = max(0, horizon - window)
            strata.append(([row[start:horizon] for row in ta], [row[start:horizon] for row in tb]))
        last = stratified_bootstrap(strata)
        held_out = pooled["held_out_per_hour"] or {}
        rows.append({
            "round": horizon,
            "pairs": [i for i, r in enumerate(reached) if r >= horizon],
            "per_round": {"ratio": pooled["ratio"], "ci95": pooled["ratio_ci95"]},
            "per_round_last": {"window": window, "rounds": [max(1, horizon - window + 1), horizon],
                               "ratio": last["ratio"], "ci95": last["ratio_ci95"]},
            "per_hour": _interval(pooled["per_hour"], "ratio", "ratio_ci95"),
            "held_out_equal_time": None if not held_out else {
                "a": held_out["accuracy_a"], "b": held_out["accuracy_b"], "difference": held_out["difference"],
                "ci95": held_out["difference_ci95"]},
            "held_out_same_round": _interval(held_out.get("same_round"), "difference", "difference_ci95"),
        })
    return rows


def _band(ax: Any, rows: list[dict[str, Any]], key: str, scale: float, colour: str, label: str,
          style: str = "-") -> None:
    points = [(r["round"], r[key]) for r in rows if r[key] is not None]
    if not points:
        return
    xs = [x for x, _ in points]
    value = "ratio" if "ratio" in points[0][1] else "value" if "value" in points[0][1] else "difference"
    ax.plot(xs, [scale * p[value] for _, p in points], style, marker="o", color=colour, label=label)
    spans = [p.get("ci95") for _, p in points]
    if all(spans):
        ax.fill_between(xs, [scale * s[0] for s in spans], [scale * s[1] for s in spans], color=colour, alpha=0.15)


def horizon_plot(rows: list[dict[str, Any]], label: str, label_b: str, names: Sequence[str] = ()) -> bytes:
    """Two panels against rounds: A/B reward (per round, cumulative and over the last rounds; per hour) and the
    held-out difference in points (at equal time and after the same round), 95% intervals shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("no horizon has been reached by both folders of any pair yet.")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), dpi=110, sharex=True)
    window = rows[-1]["per_round_last"]["window"]
    _band(top, rows, "per_round", 1.0, "C0", "reward per round, rounds 1 to N")
    _band(top, rows, "per_round_last", 1.0, "C1",
          f"reward per round, the last {window} rounds to N", "--")
    _band(top, rows, "per_hour", 1.0, "C2", "reward per hour (CPU time), rounds 1 to N")
    top.axhline(1.0, color="grey", linewidth=1)
    top.set_ylabel(f"{label} / {label_b}")
    top.set_title(f"{label} against {label_b}, read after every round N (95% intervals shaded)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    _band(bottom, rows, "held_out_equal_time", 100.0, "C3", "held-out at equal CPU time")
    _band(bottom, rows, "held_out_same_round", 100.0, "C4", "held-out after round N", "--")
    bottom.axhline(0.0, color="grey", linewidth=1)
    bottom.set_ylabel(f"held-out, {label} - {label_b} (points)")
    bottom.set_xlabel("round N" + (f"   (pairs: {', '.join(names)}; a seed counts from the rounds it reached)"
                                   if names else ""))
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=8)
    else:
        bottom.text(0.5, 0.5, "no held-out evaluation answer by answer yet", transform=bottom.transAxes,
                    ha="center", color="grey")
    bottom.grid(alpha=0.3)
    for row in rows:
        if len(row["pairs"]) != len(rows[0]["pairs"]):
            bottom.annotate(f"{len(row['pairs'])} seed(s)", (row["round"], 0), textcoords="offset points",
                            xytext=(0, -14), ha="center", fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def horizon_markdown(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    """The rows as a markdown table, one line per horizon."""
    def ratio(part: dict[str, Any] | None) -> str:
        if not part or part.get("ratio", part.get("value")) is None:
            return "-"
        value = part.get("ratio", part.get("value"))
        ci = part.get("ci95")
        return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{value:.3f}"

    def points(part: dict[str, Any] | None) -> str:
        value = None if not part else part.get("difference", part.get("value"))
        if part is None or value is None:
            return "-"
        ci = part.get("ci95")
        return f"{100 * value:+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else f"{100 * value:+.1f}"

    lines = ["| round | seeds | per round | per round, last rounds | per CPU hour | held-out at equal time (points) "
             "| held-out after the round |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        seeds = ", ".join(names[i] if i < len(names) else str(i) for i in row["pairs"])
        lines.append(f"| {row['round']} | {seeds} | {ratio(row['per_round'])} | {ratio(row['per_round_last'])} | "
                     f"{ratio(row['per_hour'])} | {points(row['held_out_equal_time'])} | "
                     f"{points(row['held_out_same_round'])} |")
    return "\n".join(lines) + "\n"

