"""What scores one specialty's own answers got, ten rounds at a time: does training move them toward a right
answer, or toward a partial credit?

    python -m bench.score_shares MIX_FOLDER ... [--kind fraction_simplification] [--every 10]

Each node's metrics.jsonl records every own group's specialty and rewards (`own_group_rewards`; an experiment
keeps one per node under MIX/node-K/). For each folder, and each block of `--every` rounds, this prints the
share of the specialty's answers at each score (1.0 is a pass; reasoning-gym gives some wrong answers a
partial credit). A share at a partial credit that grows while passes shrink is what grpo.train_on='passed'
exists for: fraction_simplification gives 0.1 to an answer that repeats the question's numerator or
denominator, and normalised by the group's spread that 0.1 weighs like a right answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from engine.experiment.records import record_path


def shares(paths: Sequence[Path], kind: str, every: int) -> list[tuple[int, int, dict[float, float]]]:
    """(first round, answers, {score: share}) for each block of `every` rounds that holds answers of `kind`."""
    blocks: dict[int, Counter[float]] = {}
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else {}
            if record.get("kind") != "round" or not isinstance(record.get("round"), int):
                continue
            block = blocks.setdefault((record["round"] - 1) // every, Counter())
            for name, rewards in record.get("own_group_rewards", []):
                if name == kind:
                    block.update(round(float(r), 4) for r in rewards)
    out = []
    for b in sorted(blocks):
        total = sum(blocks[b].values())
        if total:
            out.append((b * every + 1, total, {s: n / total for s, n in sorted(blocks[b].items(), reverse=True)}))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.score_shares", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="experiment mix folders (each holding node-K/)")
    parser.add_argument("--kind", default="fraction_simplification", help="the specialty")
    parser.add_argument("--every", type=int, default=10, help="rounds a block")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error(f"--every must be at least 1, got {args.every}")
    for folder in args.folders:
        try:
            paths = sorted(record_path(folder).glob("node-*/metrics.jsonl"))  # a packed DIR's mix, unpacked once
            table = shares(paths, args.kind, args.every)
        except (OSError, ValueError, TypeError) as exc:
            print(f"score_shares: {folder}: unreadable metrics ({exc})", file=sys.stderr)
            return 2
        if not table:
            print(f"score_shares: {folder} holds no answers of {args.kind} (node-K/metrics.jsonl with "
                  "own_group_rewards, recorded since 2026-12-03)", file=sys.stderr)
            return 2
        print(f"{folder} ({args.kind}):")
        for first, answers, by_score in table:
            cells = ", ".join(f"{score:g}: {share:.2f}" for score, share in by_score.items())
            print(f"  rounds {first}-{first + args.every - 1} ({answers} answers): {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
