"""The most that choosing questions could buy a recorded run: teaching groups per hour with a free, perfect oracle.

    python -m bench.selection_bound MIX_FOLDER ...      # e.g. ~/sapling-experiments/fixed-s0/mix-8-0

GRPO learns only from groups whose answers score differently, and a node
trains only on those, so the groups that do not teach cost their
generation and nothing else. Every question-selection lever (levels,
skipping, re-asks, probing, temperature) tries to spend less of a round on
them. Their ceiling is an oracle that knows, for free, which questions will
teach and generates only those. From each finished round of an experiment
(`rounds.jsonl`: every node's generation, training and total seconds, and
its groups that teach), for B questions a round of which T teach:

- today: T teaching groups for g + t + o seconds (generate, train, the rest);
- the oracle: each teaching group costs its generation, g / B, its
  training, t / T, and its share of the rest, o / B;
- the bound is the ratio of teaching groups per second, summed over all
  node-rounds: (g + t + o) / (s (g + o) + t), with s = T / B.

It also prints the teaching groups a node-hour gave (`node_seconds`, the
node's share of the experiment's wall time) and a CPU hour (`node_cpu_seconds`;
on a GPU that is the host's), to set runs of different levers side by side.
Where the nodes' metrics.jsonl record each own group's rewards, it prints
what share of the teaching groups held an answer that passed (scored 1.0,
as held-out accuracy counts), and how many such groups a CPU hour gave: the
others differ by partial credit alone (`grpo.train_on`). And it prints the
most that choosing specialties alone could give the share of own groups
that teach, at the levels the run used: every question of the specialty
whose groups taught most often, and weights in proportion to each
specialty's teaching share (sum of t^2 over sum of t, each specialty's
share t counted over its recorded groups). Last, the share of own groups
that more or fewer answers a question would have trained on
(`grpo.train_on='passed'`: an answer passed and one did not): fewer by
drawing answers from each recorded group without replacement, exactly;
more by fitting, per specialty, a beta-binomial to the groups' pass counts
(maximum likelihood; a question's pass rate varies from question to
question, and a group's passes are that rate's binomial draw). A specialty
with no recorded pass projects to 0 at any size: there is nothing to fit.

That bound holds only if the time to generate a group does not depend on
whether it teaches, and it counts teaching groups, not what they teach: a
lever that adds groups which teach little (heat's all-same-above-0 groups)
buys less held-out accuracy than this says.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.probe_replay import recorded_kinds
from engine.experiment.records import record_path
from engine.questions.scores import PASS_REWARD, rewards_differ


def passing_share(groups: Sequence[Sequence[float]]) -> float | None:
    """Of the groups whose rewards differ, the share with an answer that passed (None: no such group)."""
    teaching = [g for g in groups if rewards_differ(g)]
    return sum(1 for g in teaching if max(g) >= PASS_REWARD) / len(teaching) if teaching else None


def specialty_ceiling(groups: Sequence[tuple[str, Sequence[float]]]) -> dict[str, Any] | None:
    """From (specialty, rewards) own groups: each specialty's teaching share, the best one's, and the share that
    weights in proportion to those shares would give (None: no groups)."""
    counts: dict[str, list[int]] = {}
    for kind, rewards in groups:
        seen = counts.setdefault(kind, [0, 0])
        seen[0] += 1
        seen[1] += rewards_differ(rewards)
    if not counts:
        return None
    shares = {kind: taught / n for kind, (n, taught) in counts.items()}
    best = max(shares, key=lambda kind: shares[kind])
    total = sum(shares.values())
    return {"shares": shares, "best": best, "best_share": shares[best],
            "proportional_share": sum(t * t for t in shares.values()) / total if total else 0.0}


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_binomial_log(k: int, n: int, a: float, b: float) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + _log_beta(k + a, n - k + b) - _log_beta(a, b))


def fit_beta_binomial(counts: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """The maximum-likelihood (a, b) of a beta-binomial for (passes, answers) groups: a grid over log a and log b
    from 0.005 to 200, then a grid ten times finer around the best point."""
    tally: dict[tuple[int, int], int] = {}
    for pair in counts:
        tally[pair] = tally.get(pair, 0) + 1

    def loglik(la: float, lb: float) -> float:
        a, b = math.exp(la), math.exp(lb)
        return sum(m * _beta_binomial_log(k, n, a, b) for (k, n), m in tally.items())

    step = math.log(1.25)
    grid = [math.log(0.005) + i * step for i in range(int(math.log(200 / 0.005) / step) + 1)]
    best = max(((la, lb) for la in grid for lb in grid), key=lambda p: loglik(*p))
    fine = [i * step / 10 for i in range(-10, 11)]
    best = max(((best[0] + da, best[1] + db) for da in fine for db in fine), key=lambda p: loglik(*p))
    return math.exp(best[0]), math.exp(best[1])


def answers_projection(groups: Sequence[tuple[str, Sequence[float]]],
                       sizes: Sequence[int]) -> dict[int, float] | None:
    """The share of own groups with a pass and a non-pass (trained on under grpo.train_on='passed') had each
    question got `size` answers, for each size: exact below the recorded size, a beta-binomial fit per specialty
    above it (None: no groups)."""
    by_kind: dict[str, list[tuple[int, int]]] = {}
    for kind, rewards in groups:
        if rewards:
            by_kind.setdefault(kind, []).append((sum(1 for r in rewards if r >= PASS_REWARD), len(rewards)))
    total = sum(len(c) for c in by_kind.values())
    if not total:
        return None
    shares = {size: 0.0 for size in sizes}
    for counts in by_kind.values():
        fitted = (fit_beta_binomial(counts) if any(0 < k for k, _ in counts) and any(k < n for k, n in counts)
                  else None)
        for size in sizes:
            for k, n in counts:
                if size <= n:  # drawing `size` of the n answers: neither all passes nor all misses
                    none = math.comb(n - k, size) + math.comb(k, size)
                    shares[size] += 1 - none / math.comb(n, size)
                elif fitted is not None:
                    a, b = fitted
                    shares[size] += (1 - math.exp(_beta_binomial_log(0, size, a, b))
                                     - math.exp(_beta_binomial_log(size, size, a, b)))
    return {size: share / total for size, share in shares.items()}


def bound(records: Sequence[dict[str, Any]], questions: int) -> dict[str, float]:
    """The shares of node time and the oracle's teaching groups per hour against today's, over all node-rounds."""
    g = sum(sum(r["node_generate_seconds"]) for r in records)
    t = sum(sum(r["node_train_seconds"]) for r in records)
    total = sum(sum(r["node_seconds"]) for r in records)
    other = max(0.0, total - g - t)
    groups = sum(len(r["informative_groups"]) for r in records) * questions
    teach = sum(sum(r["informative_groups"]) for r in records) / groups
    cpu = sum(sum(r.get("node_cpu_seconds", [0.0])) for r in records)
    return {"generate_share": g / total, "train_share": t / total, "other_share": other / total,
            "teach_share": teach, "oracle_per_hour": total / (teach * (g + other) + t),
            "teaching_per_node_hour": teach * groups / total * 3600,
            "teaching_per_cpu_hour": teach * groups / cpu * 3600 if cpu > 0 else 0.0}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or any(a.startswith("-") for a in args):
        print("selection_bound: give one or more experiment mix folders (each holding rounds.jsonl), like "
              "~/sapling-experiments/fixed-s0/mix-8-0", file=sys.stderr)
        return 2
    for folder in map(Path, args):
        try:
            readable = record_path(folder)  # DIR/mix-8-0 of a packed DIR: its records, unpacked once
            path = readable / "rounds.jsonl"
            records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            mix = json.loads((readable.parent / "experiment.json").read_text(encoding="utf-8"))
            questions = int(mix["settings"]["tasks"]["questions_per_round"])
            result = bound(records, questions) if records else None
            metrics = sorted(readable.glob("node-*/metrics.jsonl"))
            kinds = recorded_kinds(metrics)  # the files are read once
            passing = passing_share([rewards for _, rewards in kinds])
            ceiling = specialty_ceiling(kinds)
            recorded = max((len(rewards) for _, rewards in kinds), default=0)
            sizes = sorted({max(2, recorded // 2), recorded, recorded * 2, recorded * 4} - {0})
            projection = answers_projection(kinds, sizes)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"selection_bound: {folder} is not a finished experiment mix ({exc})", file=sys.stderr)
            return 2
        if result is None:
            print(f"selection_bound: {path} holds no finished round", file=sys.stderr)
            return 2
        print(f"{folder}: {len(records)} rounds; node time {result['generate_share']:.0%} generating, "
              f"{result['train_share']:.0%} training, {result['other_share']:.0%} the rest; "
              f"{result['teach_share']:.0%} of own groups teach; a free, perfect oracle: at most "
              f"{result['oracle_per_hour']:.2f}x the teaching groups per hour"
              + f"; today {result['teaching_per_node_hour']:.0f} a node-hour"
              + (f" ({result['teaching_per_cpu_hour']:.0f} a CPU hour)" if result["teaching_per_cpu_hour"] else "")
              + ("" if passing is None else f"; {passing:.0%} of them hold an answer that passed"
                 + (f" ({passing * result['teaching_per_cpu_hour']:.0f} a CPU hour)"
                    if result["teaching_per_cpu_hour"] else "")))
        if ceiling is not None:
            print(f"  by specialty: {ceiling['best']} alone would teach {ceiling['best_share']:.0%} of its groups; "
                  f"weights in proportion to each specialty's share, {ceiling['proportional_share']:.0%} ("
                  + ", ".join(f"{kind} {share:.0%}" for kind, share in sorted(ceiling["shares"].items(),
                                                                              key=lambda kv: -kv[1])) + ")")
        if projection is not None:
            print("  answers a question (G), the share of own groups with a pass and a miss (trained on under "
                  "grpo.train_on='passed'): " + ", ".join(
                      f"{size} {share:.0%}" + (" (recorded)" if size == recorded else "")
                      for size, share in projection.items())
                  + " (above the recorded G: a beta-binomial fit per specialty)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
