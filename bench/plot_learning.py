"""Plot a run's reward curve from metrics.jsonl and compare its first and last rounds.

    .venv/bin/sapling-node run --home /tmp/learn --rounds 40
    .venv/bin/python -m bench.plot_learning /tmp/learn/data/metrics.jsonl --out docs/learning-curve.png

Prints the mean reward of the first and last N rounds (default 10) and their
difference with a bootstrap 95% interval, so "clearly above" is a number.

With `--control`, the metrics of a run with the same seed and learning switched
off (`--set grpo.learning_rate=1e-12`): it answers the same questions with the
same sampling seeds, round by round, with the untrained model. The per-round
difference (trained - control) then measures what training changed, free of
the question draw, which otherwise dominates a 4-question round's mean.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any


def load(path: Path, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rounds: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("run") != run:
            continue
        (rounds if record.get("kind") == "round" else evals).append(record)
    return rounds, evals


def bootstrap_diff(first: list[float], last: list[float], samples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    diffs = sorted(
        sum(rng.choice(last) for _ in last) / len(last) - sum(rng.choice(first) for _ in first) / len(first)
        for _ in range(samples)
    )
    return diffs[int(0.025 * samples)], diffs[int(0.975 * samples)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("metrics", type=Path, help="metrics.jsonl of the run")
    parser.add_argument("--run", default="default", help="run name inside the file")
    parser.add_argument("--window", type=int, default=10, help="rounds at each end to compare")
    parser.add_argument("--out", type=Path, help="PNG to write")
    parser.add_argument("--control", type=Path, help="metrics.jsonl of the same seed with learning off (paired comparison)")
    args = parser.parse_args(argv)
    if not args.metrics.is_file():
        print(f"plot_learning: {args.metrics} does not exist", file=sys.stderr)
        return 2
    rounds, evals = load(args.metrics, args.run)
    if len(rounds) < 2 * args.window:
        print(f"plot_learning: need at least {2 * args.window} rounds, found {len(rounds)}", file=sys.stderr)
        return 2
    x = [r["round"] for r in rounds]
    reward = [r["reward_mean"] for r in rounds]
    first, last = reward[: args.window], reward[-args.window :]
    lo, hi = bootstrap_diff(first, last)
    print(f"rounds {x[0]}..{x[-1]} of run {args.run!r}")
    print(f"mean reward, first {args.window} rounds: {sum(first) / len(first):.4f}")
    print(f"mean reward, last {args.window} rounds:  {sum(last) / len(last):.4f}")
    print(f"difference {sum(last) / len(last) - sum(first) / len(first):+.4f} (bootstrap 95% interval {lo:+.4f} .. {hi:+.4f})")
    for e in evals:
        print(f"held-out accuracy at round {e['round']}: {100 * e['accuracy']:.1f}% (reward {e['reward_mean']:.3f})")
    control: dict[int, float] = {}
    if args.control is not None:
        if not args.control.is_file():
            print(f"plot_learning: {args.control} does not exist", file=sys.stderr)
            return 2
        control = {r["round"]: r["reward_mean"] for r in load(args.control, args.run)[0]}
        paired = [(r, v - control[r]) for r, v in zip(x, reward, strict=True) if r in control]
        if len(paired) < 2 * args.window:
            print(f"plot_learning: the control shares only {len(paired)} rounds with the run", file=sys.stderr)
            return 2
        diffs = [d for _, d in paired]
        print(f"paired with the control over rounds {paired[0][0]}..{paired[-1][0]} (same questions, same sampling seeds):")
        for name, part in (("all", diffs), (f"first {args.window}", diffs[: args.window]), (f"last {args.window}", diffs[-args.window :])):
            lo_p, hi_p = bootstrap_diff([0.0], part)
            print(f"  trained - control, {name} rounds: {sum(part) / len(part):+.4f} (bootstrap 95% interval {lo_p:+.4f} .. {hi_p:+.4f})")
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=[3, 2])
        ax1.plot(x, reward, "o-", ms=3, lw=1, color="#7aa874", label="mean reward per round")
        k = 5
        smooth = [sum(reward[max(0, i - k + 1) : i + 1]) / len(reward[max(0, i - k + 1) : i + 1]) for i in range(len(reward))]
        ax1.plot(x, smooth, lw=2.5, color="#2f6f3e", label=f"{k}-round moving average")
        if control:
            cx = [r for r in x if r in control]
            cy = [control[r] for r in cx]
            csmooth = [sum(cy[max(0, i - k + 1) : i + 1]) / len(cy[max(0, i - k + 1) : i + 1]) for i in range(len(cy))]
            ax1.plot(cx, csmooth, lw=2, ls="--", color="#888888", label=f"untrained control, same questions ({k}-round avg)")
        ax1.set_ylabel("reward (0-1)")
        ax1.set_title("Sapling: SmolLM2-135M-Instruct, GRPO on ReasoningGYM, CPU")
        ax1.legend(loc="upper left")
        ax1.grid(alpha=0.3)
        fmt = [r.get("truncated_fraction", 0.0) for r in rounds]
        ax2.plot(x, [r["accuracy"] * 100 for r in rounds], lw=1, color="#d08c2f", label="own completions fully correct (%)")
        if evals:
            ax2.plot([e["round"] for e in evals], [e["accuracy"] * 100 for e in evals], "s--", color="#3d5a98", label="held-out greedy pass@1 (%)")
        ax2.plot(x, [f * 100 for f in fmt], lw=1, color="#999999", label="completions cut at the length cap (%)")
        ax2.set_xlabel("round")
        ax2.set_ylabel("percent")
        ax2.legend(loc="upper left", fontsize=8)
        ax2.grid(alpha=0.3)
        fig.tight_layout()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=110)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
