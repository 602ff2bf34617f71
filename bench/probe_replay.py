"""What probing (tasks.probe_answers) would have done to recorded runs, offline (issue 37).

    python -m bench.probe_replay METRICS.jsonl ... [--k 2,3,4] [--pool 16,24,32] [--json]

Each node's metrics.jsonl records every own group's rewards in the order sampled (`own_group_rewards`; an
experiment keeps one per node under MIX/node-K/). A group's answers are drawn independently from one policy,
so its first k answers are what k probe answers would have been. From all recorded groups this estimates:

- p_differ: the share of questions whose first k answers score differently: completed first, sure to teach;
- p_teach_if_agree: how often a question whose k answers agreed still teaches with all G;
- for a round that probes P questions and completes B: the expected share of own groups that teach,
  min(B, P p_differ) sure ones plus the rest at p_teach_if_agree (questions assumed independent);
- the answers generated (P k + B (G - k) against B G today) and the answers per group that teaches.

Not modelled: the prompts' prefill (P prompts instead of B), the cost of a second generation call, and what
training on more groups that teach does to the model (only a run measures that).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.experiment.records import record_path


def recorded_kinds(paths: Sequence[Path]) -> list[tuple[str, list[float]]]:
    """Every own group as (specialty, rewards), from node metrics files."""
    groups = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("kind") == "round":
                groups += [(str(kind), list(rewards)) for kind, rewards in record.get("own_group_rewards", [])]
    return groups


def recorded_groups(paths: Sequence[Path]) -> list[list[float]]:
    """Every own group's rewards, from node metrics files."""
    return [rewards for _, rewards in recorded_kinds(paths)]


def estimate(groups: Sequence[Sequence[float]], k: int, pool: int, questions: int) -> dict[str, Any]:
    size = len(groups[0])
    if not 0 < k < size:
        raise ValueError(f"k must be from 1 to {size - 1} (the recorded groups have {size} answers), got {k}.")
    if pool < questions:
        raise ValueError(f"a pool of {pool} cannot fill {questions} questions.")
    differ = [len(set(g[:k])) > 1 for g in groups]
    agree = [g for g, d in zip(groups, differ, strict=True) if not d]
    p_differ = sum(differ) / len(groups)
    p_teach_if_agree = sum(1 for g in agree if len(set(g)) > 1) / len(agree) if agree else 0.0
    sure = min(questions, pool * p_differ)
    teach = (sure + (questions - sure) * p_teach_if_agree) / questions
    answers = pool * k + questions * (size - k)
    today = sum(1 for g in groups if len(set(g)) > 1) / len(groups)
    return {
        "k": k, "pool": pool, "p_differ": p_differ, "p_teach_if_agree": p_teach_if_agree,
        "own_groups_teaching": teach, "answers": answers, "answers_ratio": answers / (questions * size),
        "answers_per_teaching_group": answers / (teach * questions),
        "today": {"own_groups_teaching": today, "answers_per_teaching_group": size / today},
    }


def _numbers(text: str, name: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--{name} takes whole numbers separated by commas, got {text!r}.") from None
    if not values or min(values) < 1:
        raise ValueError(f"--{name} takes whole numbers of at least 1, got {text!r}.")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probe_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", nargs="+", type=Path, help="node metrics.jsonl files")
    parser.add_argument("--k", default="2,3,4", help="probe answers per question (default 2,3,4)")
    parser.add_argument("--pool", default="16,24,32", help="questions probed per round (default 16,24,32)")
    parser.add_argument("--questions", type=int, default=8, help="questions completed per round, B (default 8)")
    parser.add_argument("--json", action="store_true", help="one JSON object per estimate")
    args = parser.parse_args(argv)
    try:
        ks, pools = _numbers(args.k, "k"), _numbers(args.pool, "pool")
        groups = recorded_groups([record_path(path) for path in args.metrics])  # packed runs too
        if not groups:
            raise ValueError("the files hold no round with own_group_rewards (recorded since 2026-12-03).")
        if len({len(g) for g in groups}) != 1:
            raise ValueError("the files mix groups of different sizes (G); give the runs of one setting.")
        rows = [estimate(groups, k, pool, args.questions) for k in ks for pool in pools]
    except (OSError, ValueError) as exc:
        print(f"probe_replay: {exc}", file=sys.stderr)
        return 2
    today = rows[0]["today"]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{len(groups)} recorded groups of {len(groups[0])}: today {today['own_groups_teaching']:.3f} of own "
          f"groups teach, {today['answers_per_teaching_group']:.1f} answers per group that teaches")
    for r in rows:
        print(f"k={r['k']} P={r['pool']}: p_differ {r['p_differ']:.3f}, teaches if agreed {r['p_teach_if_agree']:.3f}"
              f" -> own groups teaching {r['own_groups_teaching']:.2f}, answers {r['answers']} "
              f"({r['answers_ratio']:.2f}x), {r['answers_per_teaching_group']:.1f} per group that teaches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
