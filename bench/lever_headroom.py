"""How often each swarm-only lever of issue 51 would apply, counted in the experiment records (its headroom).

    python -m bench.lever_headroom                     # the swarm runs under docs/dev-log/runs (DEFAULT_RUNS)
    python -m bench.lever_headroom DIR ... [--json]    # these experiment folders (packed or not)

Only the mixes with external groups (J > 0) are read. The levers:

- (a) answering a peer's teaching questions: how often a peer's published group was informative (its rewards
  differ) against how often the receiving node's own groups were, and how many informative peer groups a node had
  on offer per round. Every node publishes all B of its groups, so a node's offer is the other nodes' own groups of
  that round (rounds.jsonl: own informative = informative_groups - external_groups, since every external group
  taken is informative); "drawn" is what the relay handed it (taken against refused as zero_advantage).
- (b) guidance where a node fails: the share of own groups with no full-credit answer (reward >= 1.0) and, of
  those, how often a peer had a full-credit answer to the same question (the same text) in the same round, in any
  round, or (the proxy) a full-credit group of the same specialty that round; on held-out, how often node j passes
  a question node i fails.
- (c) a newcomer warm-started from the swarm's solved questions: full-credit answers per node-round and per node
  hour (the run's clock: CPU where recorded), by specialty, and where the run has veterans, how far ahead they were
  of a newcomer when it joined.

Question identity: the records hold each own group's specialty and rewards (node-K/metrics.jsonl,
`own_group_rewards`), not its text, but a node's questions are `TaskSet(seed = run.seed + k x 10^7).draw(round, B)`
(docs/swarm.md, "What is real"), so they are drawn again here and kept only where the redrawn specialties match
the recorded ones in order. Runs without node metrics give the round-level counts only.

Intervals: 95% percentile bootstrap (2000 resamples) of a ratio of sums over node-rounds, resampled within each run
(runs as strata when pooled); held-out ones resample questions; the rare same-question pairs get Wilson intervals.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.experiment.hours import has_cpu_clock, node_seconds
from engine.experiment.plan import (
    EVAL_FILE,
    NODE_SEED_SPACING,
    ROUNDS_FILE,
    START_EVAL_FILE,
    VETERANS_FOLDER,
    plan_config,
    read_evals,
    read_json,
    read_rounds,
    rounds_done,
    saved_plan,
)
from engine.experiment.records import experiment_folder
from engine.experiment.report import REACH_WINDOW, veterans_start
from engine.questions.scores import PASS_REWARD, rewards_differ
from engine.questions.tasks import TaskSet

RUNS_DIR = Path("docs/dev-log/runs")
DEFAULT_RUNS = ("join-s0", "join-s1", "join-s0-ftis", "join-s1-ftis", "hour-s0-cap", "hour-s1-cap", "hour-s0-half",
                "hour-s1-half", "hour2-s0", "hour2-s1", "newcomer-s0", "newcomer-cap-s0", "newcomer-cap-s1",
                "mixes-s0", "mixes-s1", "h200-joined-s0")
SAMPLES = 2000
USAGE = "usage: python -m bench.lever_headroom [DIR ...] [--json]"

Unit = tuple[float, float]  # (numerator, denominator) of one node-round, or of one held-out question


@dataclass
class Run:
    """One experiment folder's counts, unit by unit."""

    name: str
    mixes: list[str] = field(default_factory=list)
    clock: str = "wall"
    node_rounds: int = 0
    units: dict[str, list[Unit]] = field(default_factory=lambda: defaultdict(list))
    same_question: Counter[str] = field(default_factory=Counter)  # pairs of groups of one text on two nodes
    by_specialty: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    newcomer: dict[str, Any] | None = None


def _full(rewards: list[float]) -> bool:
    return max(rewards, default=0.0) >= PASS_REWARD


def _round_units(run: Run, records: list[dict[str, Any]], seconds: list[list[float]], B: int, G: int) -> None:
    """Lever (a)'s offer and (c)'s full-credit answers from rounds.jsonl, one unit per node-round."""
    for i, rec in enumerate(records):
        nodes = len(rec["rewards"])
        own = [rec["informative_groups"][k] - rec["external_groups"][k] for k in range(nodes)]
        for k in range(nodes):
            peers = sum(own) - own[k]
            run.units["own_informative"].append((own[k], B))
            run.units["peer_informative"].append((peers, (nodes - 1) * B))
            run.units["peer_informative_on_offer"].append((peers, 1))
            rejected = (rec.get("rejected") or [{}] * nodes)[k]
            taken, refused = rec["external_groups"][k], rejected.get("zero_advantage", 0)
            run.units["drawn_informative"].append((taken, taken + refused))
            full = round(rec["accuracy"][k] * B * G)
            run.units["full_credit_per_node_round"].append((full, 1))
            run.units["full_credit_per_node_hour"].append((full, seconds[k][i] / 3600))
            run.node_rounds += 1


Group = tuple[str, list[float], str | None]  # specialty, rewards, question text (None: not redrawn)


def _node_groups(mix_folder: Path, node: int, done: int, taskset: TaskSet, B: int) -> dict[int, list[Group]]:
    """Node `node`'s own groups by round: (specialty, rewards, question text or None when the redraw differs)."""
    path = mix_folder / f"node-{node}" / "metrics.jsonl"
    rows: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("kind") == "round" and "own_group_rewards" in row and row["round"] <= done:
                rows[row["round"]] = row
    out = {}
    for r, row in sorted(rows.items()):
        groups = [(str(s), [float(x) for x in rw]) for s, rw in row["own_group_rewards"]]
        drawn = taskset.draw(r, B) if len(groups) == B else []
        texts: list[str | None] = [q.text for q in drawn]
        if [q.ref.dataset for q in drawn] != [s for s, _ in groups]:
            texts = [None] * len(groups)
        out[r] = [(s, rw, t) for (s, rw), t in zip(groups, texts, strict=True)]
    return out


def _group_units(run: Run, groups: dict[int, dict[int, list[Group]]]) -> None:
    """Levers (a) and (b) question by question, where node metrics hold each own group's rewards."""
    solved_first: dict[str, dict[int, int]] = defaultdict(dict)  # text -> node -> first round it solved the text
    seen: dict[str, list[tuple[int, bool, bool]]] = defaultdict(list)  # text -> (node, informative, solved)
    for node, rounds in groups.items():
        for r, row in sorted(rounds.items()):
            for _, rewards, text in row:
                if text is not None:
                    seen[text].append((node, rewards_differ(rewards), _full(rewards)))
                    if _full(rewards):
                        solved_first[text].setdefault(node, r)
    for node, rounds in groups.items():
        for r, row in rounds.items():
            peers = [g for other, rs in groups.items() if other != node for g in rs.get(r, [])]
            failed = [g for g in row if not _full(g[1])]
            run.units["no_full_credit"].append((len(failed), len(row)))
            run.units["solved_per_node_round"].append((len(row) - len(failed), 1))
            for specialty, rewards, _ in row:
                counts = run.by_specialty[specialty]
                counts["groups"] += 1
                counts["solved"] += _full(rewards)
                counts["full_credit"] += sum(x >= PASS_REWARD for x in rewards)
            known = [g for g in failed if g[2] is not None]
            same_round = {t for _, rw, t in peers if t is not None and _full(rw)}
            run.units["peer_same_text_same_round"].append((sum(g[2] in same_round for g in known), len(known)))
            by_then = sum(any(n != node and first <= r for n, first in solved_first[str(g[2])].items())
                          for g in known)
            run.units["peer_same_text_by_then"].append((by_then, len(known)))
            spec = [(s, _full(rw)) for s, rw, _ in peers]
            run.units["peer_same_specialty_solved"].append(
                (sum(any(ok for s, ok in spec if s == g[0]) for g in failed), len(failed)))
            run.units["peer_group_same_specialty_solved"].append(
                (sum(ok for g in failed for s, ok in spec if s == g[0]),
                 sum(1 for g in failed for s, _ in spec if s == g[0])))
    for groups_of in seen.values():
        for i, (a, inf_a, ok_a) in enumerate(groups_of):
            for b, inf_b, ok_b in groups_of[i + 1:]:
                if a != b:  # one text on two nodes: counted both ways round
                    pair = run.same_question
                    pair["pairs"] += 1
                    pair["one_informative"] += inf_a + inf_b
                    pair["both_informative"] += 2 * (inf_a and inf_b)
                    pair["one_solved"] += ok_a + ok_b
                    pair["solved_other_failed"] += (ok_a and not ok_b) + (ok_b and not ok_a)
    run.same_question["texts_on_two_nodes"] += sum(len({n for n, *_ in g}) > 1 for g in seen.values())
    run.same_question["texts"] += len(seen)


def _held_out_units(run: Run, mix_folder: Path) -> None:
    """Per held-out question: node j passes where node i fails, over ordered pairs and evaluations after round 0."""
    done = rounds_done(mix_folder)
    records = dict(read_evals(mix_folder))
    final = read_json(mix_folder / EVAL_FILE)
    if final is not None and final.get("round") == done:
        records[done] = final
    tables: list[list[str]] = []
    for r, rec in sorted(records.items()):
        rows = [n.get("passes") for n in rec.get("nodes", []) if isinstance(n, dict)]
        texts = [p for p in rows if isinstance(p, str)]
        if r > 0 and len(rows) > 1 and len(texts) == len(rows) and len(set(map(len, texts))) == 1:
            tables.append(texts)
    if not tables:
        return
    for q in range(len(tables[0][0])):
        pair = fails = anyone = 0
        for table in tables:
            bits = [row[q] == "1" for row in table]
            for i, passed in enumerate(bits):
                if not passed:
                    others = [b for j, b in enumerate(bits) if j != i]
                    pair, fails, anyone = pair + sum(others), fails + 1, anyone + any(others)
        run.units["held_out_other_passes"].append((pair, fails * (len(tables[0]) - 1)))
        run.units["held_out_any_other_passes"].append((anyone, fails))


def _newcomer(folder: Path, plan: Any, B: int) -> dict[str, Any] | None:
    """How far ahead the veterans were when the newcomers joined: held-out points and reward."""
    start = veterans_start(folder, plan) if plan.veterans else None
    if start is None:
        return None
    base = read_json(folder / START_EVAL_FILE) or {}
    out: dict[str, Any] = {"veterans": plan.veterans, "veteran_rounds": plan.veteran_rounds,
                           "veterans_reward": start["reward"], "veterans_held_out": start["accuracy"],
                           "newcomer_held_out": base.get("accuracy")}
    vet = read_json(folder / VETERANS_FOLDER / EVAL_FILE) or {}
    vet_rows = [n.get("passes") for n in vet.get("nodes", [])]
    base_rows = [n.get("passes") for n in base.get("nodes", [])]
    if vet_rows and base_rows and all(isinstance(p, str) for p in [*vet_rows, *base_rows]):
        units = [(sum(row[q] == "1" for row in vet_rows) / len(vet_rows) - (base_rows[0][q] == "1"), 1.0)
                 for q in range(len(base_rows[0]))]
        out["held_out_gap_points"] = [100 * v for v in ratio_ci([units])]
    alone = folder / f"mix-{B}-0"
    records = read_rounds(alone / ROUNDS_FILE, rounds_done(alone))[:REACH_WINDOW]
    fresh = range(plan.veterans, plan.nodes)
    if records:
        out["newcomer_reward_first_rounds_alone"] = sum(rec["rewards"][k] for rec in records for k in fresh) / (
            len(records) * len(fresh))
    return out


def read_run(given: Path) -> Run:
    """Every count of one experiment folder (packed or not), from its mixes with external groups."""
    folder = experiment_folder(given)
    plan = saved_plan(folder)
    if plan is None:
        raise ValueError(f"{given} holds no experiment (experiment.json is missing).")
    config = plan_config(plan)
    B, G = config.tasks.questions_per_round, config.tasks.completions_per_question
    run = Run(given.name)
    for mix in plan.mixes:
        mix_folder = folder / mix.slug
        done = rounds_done(mix_folder)
        records = read_rounds(mix_folder / ROUNDS_FILE, done)
        if mix.external == 0 or not records:
            continue
        run.mixes.append(mix.label)
        run.clock = "cpu" if has_cpu_clock(mix_folder) else "wall"
        _round_units(run, records, node_seconds(records, plan.nodes, run.clock), B, G)
        tasksets = {k: TaskSet(config.tasks.specialties, config.tasks.dataset_configs,
                               seed=config.run.seed + k * NODE_SEED_SPACING) for k in range(plan.nodes)}
        groups = {k: _node_groups(mix_folder, k, done, tasksets[k], B) for k in range(plan.nodes)}
        if any(groups.values()):
            _group_units(run, {k: g for k, g in groups.items() if g})
        _held_out_units(run, mix_folder)
    if not run.mixes:
        raise ValueError(f"{given} has no finished round of a mix with external groups (J > 0).")
    run.newcomer = _newcomer(folder, plan, B)
    return run


def ratio_ci(strata: list[list[Unit]], samples: int = SAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """sum(num) / sum(den) over every unit, with a 95% percentile bootstrap that resamples units within each
    stratum; NaNs when there is nothing to divide by."""
    strata = [s for s in strata if s]
    den = sum(d for s in strata for _, d in s)
    if not strata or den <= 0:
        return (math.nan, math.nan, math.nan)
    value = sum(n for s in strata for n, _ in s) / den
    rng = np.random.default_rng(seed)
    nums, dens = np.zeros(samples), np.zeros(samples)
    for s in strata:
        arr = np.asarray(s, dtype=float)
        pick = rng.integers(0, len(arr), size=(samples, len(arr)))
        nums += arr[pick, 0].sum(axis=1)
        dens += arr[pick, 1].sum(axis=1)
    ratios = nums[dens > 0] / dens[dens > 0]
    return (value, float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5)))


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float, float]:
    """k of n with its Wilson 95% interval; NaNs for n = 0."""
    if n <= 0:
        return (math.nan, math.nan, math.nan)
    p = k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (
        1 + z * z / n)
    return (p, centre - half, centre + half)


MEASURES = (  # key, lever, what it counts, scale (100: a percentage)
    ("own_informative", "a", "own groups informative", 100),
    ("peer_informative", "a", "peers' published groups informative", 100),
    ("drawn_informative", "a", "peer groups drawn by the relay informative", 100),
    ("peer_informative_on_offer", "a", "informative peer groups on offer per node-round", 1),
    ("no_full_credit", "b", "own groups with no full-credit answer", 100),
    ("peer_same_text_same_round", "b", "of those: a peer solved the same question that round", 100),
    ("peer_same_text_by_then", "b", "of those: a peer had solved the same question by then", 100),
    ("peer_same_specialty_solved", "b", "of those: a peer solved a question of its specialty that round", 100),
    ("peer_group_same_specialty_solved", "b", "of those: a peer group of its specialty that round solved", 100),
    ("held_out_other_passes", "b", "held-out: node j passes a question node i fails", 100),
    ("held_out_any_other_passes", "b", "held-out: another node passes a question node i fails", 100),
    ("full_credit_per_node_round", "c", "full-credit answers per node-round", 1),
    ("full_credit_per_node_hour", "c", "full-credit answers per node hour (the run's clock)", 1),
    ("solved_per_node_round", "c", "questions solved (a full-credit answer) per node-round", 1),
)


def _wilson_cell(k: float, n: float) -> list[float] | None:
    return None if n <= 0 else [round(100 * v, 1) for v in wilson(k, n)]


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Each measure per run and pooled (runs as strata), the same-question pairs, specialties and newcomers."""
    def cell(strata: list[list[Unit]], scale: float, key: str) -> list[float] | None:
        value = ratio_ci(strata)
        digits = 1 if scale == 100 else 0 if key.endswith("_hour") else 2
        return None if math.isnan(value[0]) else [round(scale * v, digits) for v in value]

    measures = {}
    for key, lever, what, scale in MEASURES:
        per_run = {r.name: cell([r.units[key]], scale, key) for r in runs}
        pooled_runs = [r for r in runs if r.clock == "cpu"] if key.endswith("_hour") else runs  # one clock's hours
        measures[key] = {"lever": lever, "what": what, "per_run": per_run,
                         "pooled": cell([r.units[key] for r in pooled_runs], scale, key)}
    pairs: Counter[str] = sum((r.same_question for r in runs), Counter())
    specialty: dict[str, Counter[str]] = defaultdict(Counter)
    for r in runs:
        for name, counts in r.by_specialty.items():
            specialty[name].update(counts)
    node_rounds_with_groups = sum(len(r.units["no_full_credit"]) for r in runs)
    return {
        "runs": {r.name: {"mixes": r.mixes, "node_rounds": r.node_rounds, "clock": r.clock,
                          "node_rounds_with_groups": len(r.units["no_full_credit"])} for r in runs},
        "measures": measures,
        "same_question": dict(pairs) | {  # one text on two nodes, the pair counted both ways round (Wilson)
            "informative_share": _wilson_cell(pairs["one_informative"], 2 * pairs["pairs"]),
            "informative_given_peer_informative": _wilson_cell(pairs["both_informative"], pairs["one_informative"]),
            "failed_given_peer_solved": _wilson_cell(pairs["solved_other_failed"], pairs["one_solved"])},
        "by_specialty": {name: {"solved_share": round(100 * c["solved"] / c["groups"], 1),
                                "full_credit_per_node_round": round(c["full_credit"] / node_rounds_with_groups, 3),
                                "solved_per_node_round": round(c["solved"] / node_rounds_with_groups, 3)}
                         for name, c in sorted(specialty.items(), key=lambda kv: -kv[1]["full_credit"])},
        "newcomers": {r.name: r.newcomer for r in runs if r.newcomer},
    }


def _fmt(cell: list[float] | None) -> str:
    return "-" if cell is None else f"{cell[0]:g} [{cell[1]:g}, {cell[2]:g}]"


def markdown(summary: dict[str, Any]) -> str:
    names = list(summary["runs"])
    lines = ["runs: " + "; ".join(f"{n} ({', '.join(v['mixes'])}, {v['node_rounds']} node-rounds, "
                                   f"{v['node_rounds_with_groups']} with groups, {v['clock']} clock)"
                                   for n, v in summary["runs"].items()), "",
             "| lever | measure (% where a share) | pooled [95%] | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for m in summary["measures"].values():
        lines.append(f"| {m['lever']} | {m['what']} | {_fmt(m['pooled'])} | "
                     + " | ".join(_fmt(m["per_run"][n]) for n in names) + " |")
    sq = summary["same_question"]
    lines += ["", f"one question on two nodes (any rounds): {sq.get('texts_on_two_nodes', 0)} of {sq.get('texts', 0)} "
              f"texts, {sq.get('pairs', 0)} pairs of groups (each counted both ways, Wilson 95%): informative "
              f"{_fmt(sq['informative_share'])}%; informative where the peer's was "
              f"{_fmt(sq['informative_given_peer_informative'])}%; no full-credit answer where the peer had one "
              f"{_fmt(sq['failed_given_peer_solved'])}%", "",
              "| specialty | own groups solved % | full-credit answers / node-round | solved / node-round |",
              "|---|---|---|---|"]
    lines += [f"| {k} | {v['solved_share']} | {v['full_credit_per_node_round']} | {v['solved_per_node_round']} |"
              for k, v in summary["by_specialty"].items()]
    if summary["newcomers"]:
        lines += ["", "| newcomer run | veterans (rounds) | held-out: veterans vs newcomer | gap, points [95%] | "
                  "reward: veterans' last 5 vs newcomers' first 5 alone |", "|---|---|---|---|---|"]
        for name, n in summary["newcomers"].items():
            held = f"{100 * n['veterans_held_out']:.1f}% vs {100 * (n['newcomer_held_out'] or 0):.1f}%"
            gap = _fmt([round(v, 1) for v in n["held_out_gap_points"]]) if "held_out_gap_points" in n else "-"
            reward = n.get("newcomer_reward_first_rounds_alone")
            lines.append(f"| {name} | {n['veterans']} ({n['veteran_rounds']}) | {held} | {gap} | "
                         f"{n['veterans_reward']:.3f} vs {'-' if reward is None else f'{reward:.3f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    args = [a for a in args if a != "--json"]
    if any(a.startswith("-") for a in args):
        print(f"lever_headroom: {USAGE}", file=sys.stderr)
        return 2
    folders = [Path(a) for a in args] or [RUNS_DIR / name for name in DEFAULT_RUNS]
    try:
        summary = summarize([read_run(f) for f in folders])
    except (ValueError, OSError, KeyError) as exc:  # ConfigError is a ValueError
        print(f"lever_headroom: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1) if as_json else markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
