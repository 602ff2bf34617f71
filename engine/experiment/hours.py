"""Mixes compared per hour: what a simulated node's round costs its computer, and reward at equal time.

A volunteer gives Sapling hours, not rounds. The experiment (engine/experiment/runner.py)
charges every node the seconds it would spend on its own computer in each round
(`node_seconds` in a mix's rounds.jsonl, `NodeClock`); older folders without it
split the round's seconds equally between the nodes. Comparisons here:

1. For node k in mix A and the same node (same seed) in mix B, the horizon is
   T_k = the shorter of its two runs' total seconds: both runs cover [0, T_k].
2. A node's reward is a step function of its elapsed time: round i's reward
   (the mean reward of the rollouts it wrote that round) holds over the
   seconds that round took. [0, T_k] is cut into SLICES equal slices, and a
   slice's value is the time-weighted mean reward over it.
3. The [node][slice] tables of A and B pair slice by slice, so the ratio of
   their sums (the ratio of time-averaged reward, the per-hour analogue of the
   paper's cumulative reward) takes the same two-way bootstrap as rounds do
   (engine/experiment/report.py), pooled over seeds as strata. "At the end"
   is the same over the last quarter of the slices: where each node stands
   after T_k, not on the way there.

Two clocks. The wall clock (`node_seconds`) is what a node alone on an idle
computer would wait. It also counts whatever else the machine did: another
job's load, or the experiment being paused (SIGSTOP) while a benchmark is
timed, charged to whichever round was running. The CPU clock
(`node_cpu_seconds`: the process's CPU seconds over the same stretches, all its
threads) does not advance while the process is stopped and changes little under
another job's load, so a comparison uses it when every folder in it has it, and
says which clock it used. CPU seconds are not hours on a wall clock: with two
busy threads a minute of wall time is about two CPU minutes, the same for every
setting compared.

Below, the held-out accuracy when each mix ended, with the hours it took;
held-out accuracy at equal time is engine/experiment/heldout.py's. Last,
`round_cost`: what one mix's rounds cost a node against another's, in
seconds and in the tokens behind them (a setting that makes rounds cheaper
by making answers shorter shows as fewer tokens, not as a faster node).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.common.paths import Paths
from engine.experiment.plan import EVAL_FILE, ROUNDS_FILE, read_json, read_rounds, rounds_done
from engine.node.metrics import MetricsLog

SLICES = 20
END_SLICES = SLICES // 4  # "at the end": the last quarter of the common time


CLOCKS = ("wall", "cpu")
_CLOCK_KEYS = {"wall": "node_seconds", "cpu": "node_cpu_seconds"}


class NodeClock:
    """Seconds charged to each node of a round, on the wall clock and the process's CPU clock: a stretch timed
    alone, or a shared stretch split by weights."""

    def __init__(self, nodes: int) -> None:
        self.seconds = [0.0] * nodes
        self.cpu = [0.0] * nodes
        self.parts: dict[str, list[float]] = {"generate": [0.0] * nodes, "train": [0.0] * nodes}

    @contextmanager
    def timing(self, node: int, part: str = "") -> Iterator[None]:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.charge(node, time.perf_counter() - start, part, time.process_time() - cpu)

    def charge(self, node: int, seconds: float, part: str = "", cpu: float = 0.0) -> None:
        self.seconds[node] += seconds
        self.cpu[node] += cpu
        if part:
            self.parts[part][node] += seconds

    def share(self, seconds: float, weights: Sequence[float], part: str = "", cpu: float = 0.0) -> None:
        """Split `seconds` (and `cpu` CPU seconds) between the nodes in proportion to `weights` (equally when
        they sum to 0)."""
        total = sum(weights)
        for k, weight in enumerate(weights):
            share = weight / total if total > 0 else 1 / len(weights)
            self.charge(k, seconds * share, part, cpu * share)

    def total(self, node: int) -> float:
        return self.seconds[node]


def machine_tag(device: str, bf16: bool, threads: int) -> str:
    """What the seconds were measured on, e.g. 'AMD EPYC, fp32, 2 threads': per-hour numbers compare on one machine."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    where = name if device == "cpu" else device
    return f"{where}, {'bf16' if bf16 else 'fp32'}, {threads} threads"


def node_seconds(records: Sequence[dict[str, Any]], nodes: int, clock: str = "wall") -> list[list[float]]:
    """[node][round] seconds charged to each node on `clock` (older records, wall clock: the round's seconds
    split equally)."""
    key = _CLOCK_KEYS[clock]
    if clock == "cpu":
        return [[float(rec[key][k]) for rec in records] for k in range(nodes)]
    return [[float(rec[key][k]) if key in rec else float(rec["seconds"]) / nodes
             for rec in records] for k in range(nodes)]


def time_slices(rewards: Sequence[float], seconds: Sequence[float], horizon: float,
                slices: int = SLICES) -> list[float]:
    """Time-weighted mean reward over each of `slices` equal slices of [0, horizon] (reward i holds for seconds i)."""
    if horizon <= 0:
        raise ValueError("the horizon must be positive")
    edges = [horizon * s / slices for s in range(slices + 1)]
    out = []
    i, start = 0, 0.0
    for s in range(slices):
        lo, hi = edges[s], edges[s + 1]
        area = 0.0
        while i < len(seconds) and start < hi:
            end = start + seconds[i]
            area += rewards[i] * max(0.0, min(end, hi) - max(start, lo))
            if end > hi:
                break
            start, i = end, i + 1
        out.append(area / (hi - lo))
    return out


def hour_tables(a: tuple[list[list[float]], list[list[float]]], b: tuple[list[list[float]], list[list[float]]],
                slices: int = SLICES) -> tuple[list[list[float]], list[list[float]], list[float]]:
    """Paired [node][slice] tables of A and B from their (rewards, seconds) [node][round] tables, and each node's
    horizon in seconds (the shorter of its two runs)."""
    (ra, sa), (rb, sb) = a, b
    horizons = [min(sum(x), sum(y)) for x, y in zip(sa, sb, strict=True)]
    ta = [time_slices(r, s, h, slices) for r, s, h in zip(ra, sa, horizons, strict=True)]
    tb = [time_slices(r, s, h, slices) for r, s, h in zip(rb, sb, horizons, strict=True)]
    return ta, tb, horizons


@dataclass(frozen=True)
class MixTimes:
    """A mix's finished rounds, read once: [node][round] rewards and seconds, and the machines they ran on."""

    folder: Path
    rewards: list[list[float]]
    seconds: list[list[float]]
    machines: frozenset[str]

    @property
    def nodes(self) -> int:
        return len(self.rewards)


def _records(folder: Path) -> list[dict[str, Any]]:
    return read_rounds(Path(folder) / ROUNDS_FILE, rounds_done(Path(folder)))


def has_cpu_clock(folder: Path) -> bool:
    """Whether every finished round of the mix in `folder` carries CPU seconds (`node_cpu_seconds`)."""
    records = _records(folder)
    return bool(records) and all(_CLOCK_KEYS["cpu"] in rec for rec in records)


def clock_for(folders: Sequence[Path]) -> str:
    """The clock a comparison of `folders` uses: CPU when every one has it, else the wall clock."""
    return "cpu" if folders and all(has_cpu_clock(f) for f in folders) else "wall"


def read_mix(folder: Path, clock: str = "wall") -> MixTimes | None:
    """The mix whose records are in `folder`, its seconds on `clock`; None when it has no finished round or one
    is not timed on that clock."""
    records = _records(folder)
    if not records:
        return None
    if clock == "cpu" and not all(_CLOCK_KEYS["cpu"] in rec for rec in records):
        return None
    if clock == "wall" and not all("node_seconds" in rec or "seconds" in rec for rec in records):
        return None
    nodes = len(records[0]["rewards"])
    return MixTimes(Path(folder), [[float(rec["rewards"][k]) for rec in records] for k in range(nodes)],
                    node_seconds(records, nodes, clock),
                    frozenset(str(rec["machine"]) for rec in records if rec.get("machine")))


def timed(folder: Path) -> bool:
    """Whether the mix in `folder` has finished rounds and every one says how long it took."""
    return read_mix(folder) is not None


def per_hour(strata: Sequence[tuple[Path, Path]], nodes: Sequence[int] | None, bootstrap: Any) -> dict[str, Any] | None:
    """Mix folder A against mix folder B at equal time, over (A, B) pairs of folders run on the same seeds;
    None when a folder's rounds are not timed.

    `bootstrap` is `stratified_bootstrap` (engine/experiment/report.py), passed in so the two modules
    share one bootstrap without importing each other.
    """
    clock = clock_for([f for pair in strata for f in pair])
    pairs = [(read_mix(a, clock), read_mix(b, clock)) for a, b in strata]
    tables, ends, each = [], [], []
    for a, b in pairs:
        if a is None or b is None:
            return None
        if a.nodes != b.nodes:
            raise ValueError(f"{a.folder} and {b.folder} have different node counts; they do not pair.")
        rows = list(range(a.nodes)) if nodes is None else list(nodes)
        ta, tb, horizons = hour_tables((a.rewards, a.seconds), (b.rewards, b.seconds))
        ta, tb, horizons = [ta[k] for k in rows], [tb[k] for k in rows], [horizons[k] for k in rows]
        tables.append((ta, tb))
        ends.append(([row[-END_SLICES:] for row in ta], [row[-END_SLICES:] for row in tb]))
        one = bootstrap([(ta, tb)])
        each.append({"a": str(a.folder), "b": str(b.folder), "hours": [h / 3600 for h in horizons],
                     "ratio": one["ratio"], "ratio_ci95": one["ratio_ci95"],
                     "machines": sorted(a.machines | b.machines), "held_out": _held_out(a, b, rows)})
    overall = bootstrap(tables)
    at_end = bootstrap(ends)
    return {"slices": SLICES, "clock": clock, "pairs": each, **overall,
            "at_end": {"ratio": at_end["ratio"], "ratio_ci95": at_end["ratio_ci95"],
                       "difference": at_end["difference"], "difference_ci95": at_end["difference_ci95"]}}


def _held_out(a: MixTimes, b: MixTimes, rows: Sequence[int]) -> dict[str, Any] | None:
    """Each side's held-out accuracy when its mix ended (mean of `rows`), with the hours that took."""
    out: dict[str, Any] = {}
    for side, mix in (("a", a), ("b", b)):
        evaluation = read_json(mix.folder / EVAL_FILE)
        if not evaluation or "nodes" not in evaluation:
            return None
        out[side] = {"accuracy": sum(evaluation["nodes"][k]["accuracy"] for k in rows) / len(rows),
                     "hours": sum(sum(mix.seconds[k]) for k in rows) / len(rows) / 3600}
    return out


def reward_by_hour(folder: Path, points: int = 60, clock: str = "wall") -> tuple[list[float], list[float]]:
    """(hours on `clock`, mean reward over nodes) at `points` times up to the shortest node's total: for a plot."""
    mix = read_mix(folder, clock)
    if mix is None:
        raise ValueError(f"{folder} has no finished, timed round to plot.")
    horizon = min(sum(row) for row in mix.seconds)
    table = [time_slices(r, s, horizon, points) for r, s in zip(mix.rewards, mix.seconds, strict=True)]
    hours = [horizon * (i + 0.5) / points / 3600 for i in range(points)]
    return hours, [sum(table[k][i] for k in range(mix.nodes)) / mix.nodes for i in range(points)]


# What a round costs a node: its seconds from the mix's records (engine/experiment/runner.py), its tokens from
# the node's own metrics: the work behind the seconds, so that a cheaper round is not just a shorter answer.
COST_SECONDS = {"cpu_seconds": "node_cpu_seconds", "generate_seconds": "node_generate_seconds",
                "train_seconds": "node_train_seconds"}


def node_tokens(folder: Path, node: int, upto: int) -> dict[int, tuple[float, float]]:
    """Tokens generated and tokens trained on by node `node` of the mix in `folder`, per round (its metrics)."""
    path = Paths(config_dir=folder, data_dir=folder / f"node-{node}", cache_dir=folder, log_dir=folder).metrics_file
    out: dict[int, tuple[float, float]] = {}
    for record in MetricsLog(path).read():  # its evaluations share the rounds' numbers: rounds only
        if record.get("kind") == "round" and isinstance(record.get("round"), int) and 1 <= record["round"] <= upto:
            made = float(record.get("completions") or 0) * float(record.get("completion_tokens_mean") or 0)
            out[record["round"]] = (made, float(record.get("train_tokens") or 0))
    return out


def round_cost(strata: Sequence[tuple[Path, Path]], nodes: Sequence[int] | None, bootstrap: Any) -> dict[str, Any]:
    """What mix folder A's rounds cost a node against B's, over (A, B) pairs run on the same seeds: CPU,
    generation and training seconds, and the tokens generated and trained on, each the ratio of A's sum to B's
    over the node-rounds both finished, with a 95% interval (`bootstrap`, as in `per_hour`). An entry is None
    where a pair's records lack it (rounds from before that was recorded)."""
    names = (*COST_SECONDS, "generated_tokens", "trained_tokens")
    tables: dict[str, list[tuple[list[list[float]], list[list[float]]]]] = {name: [] for name in names}
    for a_dir, b_dir in strata:
        recs_a, recs_b = _records(a_dir), _records(b_dir)
        common = min(len(recs_a), len(recs_b))
        if not common:
            continue
        rows = list(range(len(recs_a[0]["rewards"]))) if nodes is None else list(nodes)
        for name, key in COST_SECONDS.items():
            if all(isinstance(rec.get(key), list) for rec in recs_a[:common] + recs_b[:common]):
                tables[name].append(([[float(rec[key][k]) for rec in recs_a[:common]] for k in rows],
                                     [[float(rec[key][k]) for rec in recs_b[:common]] for k in rows]))
        tokens_a = [node_tokens(Path(a_dir), k, common) for k in rows]
        tokens_b = [node_tokens(Path(b_dir), k, common) for k in rows]
        if all(len(node) == common for node in tokens_a + tokens_b):
            for index, name in enumerate(("generated_tokens", "trained_tokens")):
                tables[name].append(([[node[r][index] for r in range(1, common + 1)] for node in tokens_a],
                                     [[node[r][index] for r in range(1, common + 1)] for node in tokens_b]))
    out: dict[str, Any] = {}
    for name in names:
        result = bootstrap(tables[name]) if len(tables[name]) == len(strata) else {}
        out[name] = {"ratio": result["ratio"], "ratio_ci95": result["ratio_ci95"]} if result.get("ratio") else None
    return out
