"""Replay an adaptive run's own groups through the first and the second pass of the curriculum rules (issue 37).

    python -m bench.curriculum_replay DIR [MIX]     # DIR: an `experiment` folder run with tasks.difficulty='adaptive'

Would the second pass's rules (engine/questions/curriculum.py: levels move on the
window's all-pass and all-fail groups, a level left downward needs a longer
window to return, a specialty that all fails at its lowest level is
excluded) have moved levels sensibly on what the model actually answered?
This answers it offline, without a model, from what the run recorded.

Reconstruction. A node's metrics.jsonl has, per round, each specialty's
level, draw share and pass rate over its window after the round (the last 4
groups at its level in a first-pass run, 8 in a second-pass one: read from
the checkpoints' state version), and the level changes. The round's
questions are redrawn exactly (`TaskSet.draw` with the node's seed, the
previous round's shares and levels; a draw that does not give the recorded
specialties stops the replay with an error). The window's sums before and
after then give each specialty's passing answers in the round; where the
groups that left a full window are not known (a round's groups were not
recorded one by one), the total closest to the round's mean reward is
taken, and with more groups than the window, the mean reward gives the
rest. The split among a round's groups is taken as the checkpoints show it:
a question is solved by every answer or by none (passes 8, 8, ..., the
rest, 0, 0, ...). A group with no pass counts as all-fail: a partial credit
that varied within it is not recorded, so the mixed share here is a lower
bound on the informative share (0.22 against the 0.37 recorded on
diff-s0-adaptive).

Replays. The first-pass rule (pass rate over the last 4 groups outside
20-80%) must reproduce the recorded level changes: that checks the
reconstruction. The second-pass rules (engine/questions/curriculum.py's Curriculum itself)
see the same questions in the same order; while they hold a specialty at
the level it was recorded at, they see the recorded outcomes; at another
level, the outcomes recorded at that level by any node of the run within 5
rounds (the least used first), else the nearest; at a level no node visited, nothing (counted as unknown,
the level holds). What they cannot know: how the model would have answered
at levels never visited (or visited only in other rounds), how the other
draw shares would have changed what was asked, and how training on other
questions would have changed the model. `expected_mixed_share` weighs each
round's draw shares by the mixed share recorded at each specialty's level
within 5 rounds; `draw_share_without_record` is the share it had to leave
out.

Prints JSON: per rule, level moves, reversals (a move opposite to the
specialty's previous one: flapping), the share of groups all-fail, all-pass
and mixed, the final levels; for the second pass also the groups it could
not know and the groups of specialties it had excluded (drawn at most
EXCLUDED_SHARE of a uniform share instead of their recorded share).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from engine.common.config import NodeConfig
from engine.common.errors import ConfigError
from engine.experiment.plan import NODE_SEED_SPACING, plan_config, saved_plan
from engine.experiment.records import experiment_folder, named_back
from engine.questions.curriculum import LADDERS, WINDOW_GROUPS, Curriculum, level_config
from engine.questions.tasks import TaskSet

USAGE = "usage: python -m bench.curriculum_replay DIR [MIX] (DIR: an experiment run with tasks.difficulty='adaptive')."

OLD_WINDOW, OLD_MIN, OLD_BAND = 4, 2, (0.2, 0.8)  # the first pass's rule, as the recorded runs used it
NEAR = 5  # rounds either side whose outcomes at a level stand for that level's


@dataclass
class Outcome:
    """One specialty's own groups in one round, at the level it was asked at: passes per group."""

    node: int
    round: int
    specialty: str
    level: int
    passes: list[int]
    answers: int  # per group
    exact: bool  # one group, or all pass or none: the split is known


@dataclass(frozen=True)
class Plan:
    """What a round was drawn with: draw shares and levels."""

    round: int
    weights: dict[str, float]
    levels: dict[str, int]


Pools = dict[tuple[str, int], list[Outcome]]


@dataclass
class RuleResult:
    moves: list[tuple[int, int, str, int, int]] = field(default_factory=list)  # node, round, specialty, old, new
    counts: Counter[str] = field(default_factory=Counter)
    final: dict[int, dict[str, int]] = field(default_factory=dict)
    plans: list[Plan] = field(default_factory=list)
    pools: Pools = field(default_factory=dict)

    def reversals(self) -> int:
        last: dict[tuple[int, str], int] = {}
        flips = 0
        for node, _, name, old, new in self.moves:
            step = new - old
            flips += last.get((node, name), step) != step
            last[(node, name)] = step
        return flips

    def summary(self) -> dict[str, Any]:
        seen = sum(self.counts[k] for k in ("all_fail", "all_pass", "mixed"))
        return {
            "moves": len(self.moves), "reversals": self.reversals(), "groups": seen,
            **{f"{k}_share": round(self.counts[k] / seen, 3) if seen else None
               for k in ("all_fail", "all_pass", "mixed")},
            **{k: self.counts[k] for k in ("unknown", "excluded", "recorded_moves_not_reproduced", "moves_not_recorded")
               if k in self.counts},
            **expected_mixed(self.plans, self.pools),
            "final_levels": self.final,
        }


def split(total: int, groups: int, answers: int) -> list[int]:
    """`total` passes over `groups` groups of `answers`, as solved-by-all-or-none as it can be."""
    full, rest = divmod(total, answers)
    passes = [answers] * full + ([rest] if rest else [])
    return passes + [0] * (groups - len(passes))


def kind(passes: int, answers: int) -> str:
    return "all_pass" if passes == answers else "all_fail" if passes == 0 else "mixed"


def dropped_sums(before: list[list[int]], drop: int) -> dict[int, list[int]]:
    """Each possible sum of the window's oldest `drop` groups (entries [passes, block]; a block is one round's
    groups of the specialty, in an order not recorded), with an order of the partly dropped block giving it."""
    if drop == 0:
        return {0: []}
    last = before[drop - 1][1]
    fixed = sum(p for p, b in before[:drop] if b != last)
    block = [p for p, b in before if b == last]
    k = sum(1 for _, b in before[:drop] if b == last)
    options: dict[int, list[int]] = {}
    for chosen in combinations(range(len(block)), k):
        order = [block[i] for i in chosen] + [block[i] for i in range(len(block)) if i not in chosen]
        options.setdefault(fixed + sum(block[i] for i in chosen), order)
    return options


def round_total(before: list[list[int]], n: int, after_sum: int, reward_sum: int, window: int,
                answers: int) -> tuple[list[int], bool]:
    """The passes of a round's `n` groups of one specialty (see the module's docstring), and whether the total is
    the only one the recorded window allows; reorders `before`'s partly dropped block to agree with it."""
    if n > window:  # the window kept only the round's last groups: the others from the round's mean reward
        early = min(max(reward_sum - after_sum, 0), (n - window) * answers)
        return split(early, n - window, answers) + split(after_sum, window, answers), False
    drop = max(0, len(before) + n - window)
    base = after_sum - sum(p for p, _ in before)
    options = {base + d: order for d, order in dropped_sums(before, drop).items() if 0 <= base + d <= n * answers}
    if not options:  # nothing the window allows: the mean reward, clipped
        return split(min(max(reward_sum, 0), n * answers), n, answers), False
    total = min(options, key=lambda t: (abs(t - reward_sum), t))
    if drop:
        last = before[drop - 1][1]
        for entry, value in zip([e for e in before if e[1] == last], options[total], strict=True):
            entry[0] = value
    return split(total, n, answers), len(options) == 1


def reconstruct(rows: list[dict[str, Any]], taskset: TaskSet, priors: dict[str, float], node: int,
                answers: int, per_round: int, window: int = OLD_WINDOW) -> tuple[list[list[Outcome]], list[Plan]]:
    """Each recorded round's outcomes, in the order the node saw them (see the module's docstring), and the
    draw shares and levels the round was drawn with."""
    names = list(taskset.specialties)
    start = Curriculum(names)
    weights, levels = start.weights(priors), dict(start.levels)
    windows: dict[str, list[list[int]]] = {name: [] for name in names}
    rounds, plans = [], []
    for block, row in enumerate(rows):
        plans.append(Plan(row["round"], weights, levels))
        report = row.get("curriculum")
        if not isinstance(report, dict):
            raise ConfigError(f"round {row.get('round')} of node {node} has no curriculum: not an adaptive run.")
        drawn = [q.ref.dataset for q in taskset.draw(row["round"], per_round, weights=weights,
                                                      configs={n: level_config(n, levels[n]) for n in names})]
        if sorted(set(drawn)) != sorted(row["reward_by_specialty"]):
            raise ConfigError(f"node {node} round {row['round']}: the redrawn specialties differ from the recorded "
                              "ones.")
        changed = {c["specialty"]: c for c in row["level_changes"]}
        outcomes = []
        for name in dict.fromkeys(drawn):
            n, before = drawn.count(name), windows[name]
            rate = changed[name]["pass_rate"] if name in changed else report[name]["pass_rate"]
            after_sum = round(rate * answers * min(window, len(before) + n))
            passes, exact = round_total(before, n, after_sum, round(row["reward_by_specialty"][name] * n * answers),
                                        window, answers)
            total = sum(passes)
            outcomes.append(Outcome(node, row["round"], name, levels[name], passes, answers,
                                    exact and (n == 1 or total in (0, n * answers))))
            windows[name] = [] if name in changed else (before + [[p, block] for p in passes])[-window:]
        rounds.append(outcomes)
        weights = {n: v["weight"] for n, v in report.items()}
        levels = {n: v["level"] for n, v in report.items()}
    return rounds, plans


def mixed_near(pools: Pools, name: str, level: int, round_index: int) -> float | None:
    """The share of mixed groups recorded for `name` at `level` within NEAR rounds of `round_index` (any node)."""
    near = [kind(p, o.answers) for o in pools.get((name, level), []) if abs(o.round - round_index) <= NEAR
            for p in o.passes]
    return near.count("mixed") / len(near) if near else None


def expected_mixed(plans: list[Plan], pools: Pools) -> dict[str, float | None]:
    """The mixed share a draw with each round's shares and levels would expect, from the outcomes recorded at
    those levels near that round; and the share of the draw that went to levels with no such record."""
    found = unknown = 0.0
    for plan in plans:
        rates = {name: mixed_near(pools, name, plan.levels[name], plan.round) for name in plan.weights}
        known = sum(w for name, w in plan.weights.items() if rates[name] is not None)
        found += sum(w * (rates[name] or 0.0) for name, w in plan.weights.items()) / known if known else 0.0
        unknown += 1.0 - known
    n = len(plans)
    return {"expected_mixed_share": round(found / n, 3) if n else None,
            "draw_share_without_record": round(unknown / n, 3) if n else None}


def pooled(runs: dict[int, list[list[Outcome]]]) -> Pools:
    pools: Pools = {}
    for rounds in runs.values():
        for outcomes in rounds:
            for o in outcomes:
                pools.setdefault((o.specialty, o.level), []).append(o)
    return pools


def old_rule(runs: dict[int, list[list[Outcome]]], recorded: set[tuple[int, int, str, int, int]],
             plans: list[Plan]) -> RuleResult:
    """The first pass's pass-rate band on the reconstructed outcomes; its moves must be the recorded ones."""
    result = RuleResult(plans=plans, pools=pooled(runs))
    for node, rounds in runs.items():
        levels: dict[str, int] = {}
        windows: dict[str, deque[tuple[int, int]]] = {}
        for outcomes in rounds:
            for o in outcomes:
                window = windows.setdefault(o.specialty, deque(maxlen=OLD_WINDOW))
                if levels.get(o.specialty, 0) != o.level:  # an unreconstructed round hid a move: follow the record
                    levels[o.specialty] = o.level
                    window.clear()
                window.extend((p, o.answers) for p in o.passes)
                result.counts.update(kind(p, o.answers) for p in o.passes)
                rate = sum(p for p, _ in window) / sum(a for _, a in window)
                if len(window) >= OLD_MIN and not OLD_BAND[0] <= rate <= OLD_BAND[1]:
                    old = levels.get(o.specialty, 0)
                    new = old - 1 if rate < OLD_BAND[0] else old + 1
                    if new in range(LADDERS[o.specialty].lowest, LADDERS[o.specialty].highest + 1):
                        levels[o.specialty] = new
                        result.moves.append((node, o.round, o.specialty, old, new))
                        window.clear()
        result.final[node] = {name: level for name, level in levels.items() if level}
    result.counts["recorded_moves_not_reproduced"] = len(recorded - set(result.moves))
    result.counts["moves_not_recorded"] = len(set(result.moves) - recorded)
    return result


def nearest(pool: list[Outcome], round_index: int, used: Counter[int]) -> Outcome | None:
    """An outcome recorded within NEAR rounds of `round_index`, the least used first; failing that, the
    nearest one (earlier first on a tie)."""
    if not pool:
        return None

    def key(o: Outcome) -> tuple[bool, int, int, int]:
        distance = abs(o.round - round_index)
        return distance > NEAR, used[id(o)] if distance <= NEAR else 0, distance, o.round

    return min(pool, key=key)


def new_rule(runs: dict[int, list[list[Outcome]]], priors: dict[str, float]) -> RuleResult:
    """questions/curriculum.py's rules on the same questions, with outcomes from the level they would have held."""
    pools = pooled(runs)
    result = RuleResult(pools=pools)
    for node, rounds in runs.items():
        curriculum = Curriculum(list(priors))
        used: Counter[int] = Counter()
        for index, outcomes in enumerate(rounds, start=1):
            result.plans.append(Plan(index, curriculum.weights(priors), dict(curriculum.levels)))
            results = []
            for o in outcomes:
                level = curriculum.levels[o.specialty]
                if curriculum.excluded(o.specialty):
                    result.counts["excluded"] += len(o.passes)
                source = o if level == o.level else nearest(pools.get((o.specialty, level), []), o.round, used)
                if source is None:
                    result.counts["unknown"] += len(o.passes)
                    continue
                used[id(source)] += 1
                passes = (source.passes * len(o.passes))[: len(o.passes)]
                result.counts.update(kind(p, o.answers) for p in passes)
                results += [(o.specialty, [1.0] * p + [0.0] * (o.answers - p)) for p in passes]
            for change in curriculum.observe(results):
                result.moves.append((node, outcomes[0].round, change.specialty, change.old, change.new))
        result.final[node] = {name: level for name, level in curriculum.levels.items() if level}
    return result


def window_of(node_folder: Path, rows: list[dict[str, Any]]) -> int:
    """The window the run's pass rates were measured over: 4 groups in a first-pass (version 1) run."""
    for state in sorted(node_folder.glob("checkpoints/*/round-*/state.json")):
        version = json.loads(state.read_text(encoding="utf-8")).get("curriculum", {}).get("version")
        return OLD_WINDOW if version == 1 else WINDOW_GROUPS
    return WINDOW_GROUPS if any("groups" in c for r in rows for c in r["level_changes"]) else OLD_WINDOW


def replay(folder: Path, mix_label: str | None = None) -> dict[str, Any]:
    plan = saved_plan(folder)
    if plan is None:
        raise ConfigError(f"{folder} holds no experiment plan (experiment.json).")
    config: NodeConfig = plan_config(plan)
    mix = next((m for m in plan.mixes if mix_label in (None, m.label)), None)
    if mix is None:
        raise ConfigError(f"{folder} has no mix {mix_label}.")
    t = config.tasks
    priors = dict(t.specialties)
    runs, recorded, plans, asked = {}, set(), [], 0
    exact = total = 0
    for node in range(plan.nodes):
        path = folder / mix.slug / f"node-{node}" / "metrics.jsonl"
        if not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        asked += len(rows) * t.questions_per_round
        taskset = TaskSet(priors, t.dataset_configs, seed=config.run.seed + node * NODE_SEED_SPACING)
        runs[node], drawn_with = reconstruct(rows, taskset, priors, node, t.completions_per_question,
                                             t.questions_per_round, window_of(path.parent, rows))
        plans += drawn_with
        recorded |= {(node, r["round"], c["specialty"], c["old"], c["new"]) for r in rows for c in r["level_changes"]}
        groups = [o for outcomes in runs[node] for o in outcomes]
        exact += sum(len(o.passes) for o in groups if o.exact)
        total += sum(len(o.passes) for o in groups)
    if not runs:
        raise ConfigError(f"{folder} has no node metrics for mix {mix.label}.")
    return {
        "folder": str(folder), "mix": mix.label, "nodes": len(runs),
        "groups_reconstructed": total, "groups_asked": asked, "groups_with_exact_split": exact,
        "first_pass": old_rule(runs, recorded, plans).summary(),
        "second_pass": new_rule(runs, priors).summary(),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or args[0].startswith("-"):
        print(f"curriculum_replay: {USAGE}", file=sys.stderr)
        return 2
    given = Path(args[0]).expanduser()
    try:
        folder = experiment_folder(given)  # a packed folder's records, unpacked once
        result = replay(folder, args[1] if len(args) > 1 else None)
        print(json.dumps(named_back(result, {folder: given}), indent=1))
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError
        print(f"curriculum_replay: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
