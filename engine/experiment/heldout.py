"""Held-out accuracy of two mixes at equal time: what an hour of a volunteer's computer teaches.

An experiment measures each node's greedy pass@1 on one fixed held-out set
before training (eval-start.json, the base model), every tasks.eval_every
rounds of a mix (evals.jsonl) and when the mix ends (eval.json), each
question by question ("passes", one character a question). Paired here:

1. A node's points are (seconds charged to it up to that evaluation, its
   answers). For node k in A and the same node (same seed) in B, the horizon
   is T_k = the shorter of the two runs' last evaluated time: both cover it.
2. At T_k a question's value is linear between the two evaluations around it
   (exactly an evaluation when one falls there; the shorter run's is its last).
3. The [node][question] tables of A and B take the experiment's two-way
   bootstrap (nodes and questions resampled independently, seeds as strata):
   the difference in accuracy points, and the ratio of gains over the base
   model (accuracy at T minus accuracy before training).

"At the same round" compares the last round both mixes evaluated, ignoring time.
"By specialty" repeats the comparison at equal time on each specialty's
questions alone (question i is the i % k-th enabled specialty), to show which
kinds a setting helps and which it hurts.
Folders measured before answers were kept question by question have no such
comparison (None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.common.presets import SAPO_SPECIALTIES
from engine.experiment.hours import clock_for, read_mix
from engine.experiment.plan import EVAL_FILE, PLAN_FILE, START_EVAL_FILE, read_evals, read_json, rounds_done

Bootstrap = Callable[[Sequence[tuple[list[list[float]], list[list[float]]]]], dict[str, Any]]


@dataclass(frozen=True)
class Evaluations:
    """A mix's held-out evaluations: the rounds, each node's seconds by then, and its answers question by question."""

    folder: Path
    rounds: list[int]  # 0 first: the base model
    seconds: list[list[float]]  # [node][point]
    passes: list[list[str]]  # [node][point]

    @property
    def nodes(self) -> int:
        return len(self.seconds)


def _node_passes(record: dict[str, Any] | None, nodes: int) -> list[str] | None:
    """Each node's answers in an evaluation record (the base model's one row serves every node)."""
    if not record or not isinstance(record.get("nodes"), list):
        return None
    rows = [n.get("passes") if isinstance(n, dict) else None for n in record["nodes"]]
    if len(rows) == 1:
        rows = rows * nodes
    if len(rows) != nodes or not all(isinstance(p, str) and p for p in rows):
        return None
    return [str(p) for p in rows]


def read_evaluations(folder: Path, clock: str = "wall") -> Evaluations | None:
    """The evaluations of the mix in `folder` (the experiment folder is its parent), times on `clock`; None when
    the mix has no timed round or an evaluation lacks question-by-question answers."""
    folder = Path(folder)
    mix = read_mix(folder, clock)
    if mix is None:
        return None
    done = rounds_done(folder)
    records: dict[int, dict[str, Any] | None] = {0: read_json(folder.parent / START_EVAL_FILE), **read_evals(folder)}
    final = read_json(folder / EVAL_FILE)
    if final is not None and final.get("round") == done:
        records[done] = final
    rounds = sorted(r for r in records if r <= len(mix.seconds[0]))
    answers = [_node_passes(records[r], mix.nodes) for r in rounds]
    if len(rounds) < 2 or any(a is None for a in answers) or len({len(a[0]) for a in answers if a}) != 1:
        return None
    return Evaluations(folder, rounds, [[sum(mix.seconds[k][:r]) for r in rounds] for k in range(mix.nodes)],
                       [[a[k] for a in answers if a] for k in range(mix.nodes)])


def at_time(seconds: Sequence[float], passes: Sequence[str], horizon: float) -> list[float]:
    """Each question's value at `horizon` seconds: linear between the evaluations around it."""
    if not seconds or horizon < seconds[0] or horizon > seconds[-1]:
        raise ValueError(f"{horizon:.1f} s is outside the evaluated time [{seconds[0]:.1f}, {seconds[-1]:.1f}] s")
    i = max(j for j, t in enumerate(seconds) if t <= horizon)
    if i == len(seconds) - 1 or seconds[i] == horizon:
        return [float(c == "1") for c in passes[i]]
    w = (horizon - seconds[i]) / (seconds[i + 1] - seconds[i])
    return [(1 - w) * (a == "1") + w * (b == "1") for a, b in zip(passes[i], passes[i + 1], strict=True)]


def kinds(folder: Path) -> tuple[str, ...]:
    """The enabled specialties of the experiment that holds mix `folder`, in the held-out set's order (none when
    its plan is unreadable)."""
    weights: Any = read_json(Path(folder).parent / PLAN_FILE) or {}
    for key in ("settings", "tasks", "specialties"):
        weights = weights.get(key) if isinstance(weights, dict) else None
    if not isinstance(weights, dict):
        return ()
    return tuple(n for n in SAPO_SPECIALTIES if isinstance(w := weights.get(n), int | float) and w > 0)


def _columns(table: Sequence[Sequence[float]], keep: Sequence[int]) -> list[list[float]]:
    return [[row[i] for i in keep] for row in table]


def _accuracy(table: Sequence[Sequence[float]]) -> float:
    return sum(map(sum, table)) / (len(table) * len(table[0]))


def held_out_at_equal_time(strata: Sequence[tuple[Path, Path]], nodes: Sequence[int] | None,
                           bootstrap: Bootstrap) -> dict[str, Any] | None:
    """Mix folder A against mix folder B on held-out accuracy at equal time, pooled over (A, B) pairs run on the
    same seeds; None when a folder lacks question-by-question evaluations. `bootstrap` is
    engine/experiment/report.py's `stratified_bootstrap`."""
    acc, gains, last, pairs = [], [], [], []
    clock = clock_for([f for pair in strata for f in pair])
    for a_dir, b_dir in strata:
        a, b = read_evaluations(a_dir, clock), read_evaluations(b_dir, clock)
        if a is None or b is None:
            return None
        if a.nodes != b.nodes or len(a.passes[0][0]) != len(b.passes[0][0]):
            raise ValueError(f"{a.folder} and {b.folder} were not evaluated alike; they do not pair.")
        rows = list(range(a.nodes)) if nodes is None else list(nodes)
        horizons = [min(a.seconds[k][-1], b.seconds[k][-1]) for k in rows]
        ta = [at_time(a.seconds[k], a.passes[k], h) for k, h in zip(rows, horizons, strict=True)]
        tb = [at_time(b.seconds[k], b.passes[k], h) for k, h in zip(rows, horizons, strict=True)]
        base = [[float(c == "1") for c in a.passes[k][0]] for k in rows]
        acc.append((ta, tb))
        gains.append(([[x - s for x, s in zip(r, s0, strict=True)] for r, s0 in zip(ta, base, strict=True)],
                      [[x - s for x, s in zip(r, s0, strict=True)] for r, s0 in zip(tb, base, strict=True)]))
        shared = max(set(a.rounds) & set(b.rounds))
        la = [[float(c == "1") for c in a.passes[k][a.rounds.index(shared)]] for k in rows]
        lb = [[float(c == "1") for c in b.passes[k][b.rounds.index(shared)]] for k in rows]
        last.append((la, lb))
        pairs.append({"a": str(a.folder), "b": str(b.folder), "hours": [h / 3600 for h in horizons],
                      "accuracy_a": _accuracy(ta), "accuracy_b": _accuracy(tb), "base": _accuracy(base),
                      "same_round": shared})
    at_t, gain = bootstrap(acc), bootstrap(gains)
    at_round = bootstrap(last)
    by_kind = {}
    names = {kinds(f) for pair in strata for f in pair}
    if len(names) == 1 and (k := len(order := names.pop())):
        for j, name in enumerate(order):
            keep = [i for i in range(len(acc[0][0][0])) if i % k == j]
            tables = [(_columns(ta, keep), _columns(tb, keep)) for ta, tb in acc]
            d = bootstrap(tables)
            by_kind[name] = {"accuracy_a": sum(_accuracy(ta) for ta, _ in tables) / len(tables),
                             "accuracy_b": sum(_accuracy(tb) for _, tb in tables) / len(tables),
                             "difference": d["difference"], "difference_ci95": d["difference_ci95"]}
    return {
        "pairs": pairs,
        "clock": clock,
        "accuracy_a": sum(_accuracy(ta) for ta, _ in acc) / len(acc),
        "accuracy_b": sum(_accuracy(tb) for _, tb in acc) / len(acc),
        "difference": at_t["difference"], "difference_ci95": at_t["difference_ci95"],
        "gain_a": sum(_accuracy(ga) for ga, _ in gains) / len(gains),
        "gain_b": sum(_accuracy(gb) for _, gb in gains) / len(gains),
        "gain_ratio": gain["ratio"], "gain_ratio_ci95": gain["ratio_ci95"],
        "same_round": {"difference": at_round["difference"], "difference_ci95": at_round["difference_ci95"]},
        "by_specialty": by_kind,
    }
