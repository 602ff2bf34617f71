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
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_bytes


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


def moving_average(values: list[float], k: int) -> list[float]:
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1]) for i in range(len(values))]


def print_ends(name: str, x: list[int], reward: list[float], evals: list[dict[str, Any]], window: int) -> None:
    """The first and last `window` rounds' mean reward, their difference with its interval, and each evaluation."""
    first, last = reward[:window], reward[-window:]
    lo, hi = bootstrap_diff(first, last)
    print(f"rounds {x[0]}..{x[-1]} of run {name!r}")
    print(f"mean reward, first {window} rounds: {sum(first) / len(first):.4f}")
    print(f"mean reward, last {window} rounds:  {sum(last) / len(last):.4f}")
    print(f"difference {sum(last) / len(last) - sum(first) / len(first):+.4f} "
          f"(bootstrap 95% interval {lo:+.4f} .. {hi:+.4f})")
    for e in evals:
        print(f"held-out accuracy at round {e['round']}: {100 * e['accuracy']:.1f}% (reward {e['reward_mean']:.3f})")


def paired_control(control_file: Path, run: str, x: list[int], reward: list[float], window: int
                   ) -> dict[int, float] | str:
    """The control's reward per round, after printing the trained run against it; or why it cannot be used."""
    if not control_file.is_file():
        return f"{control_file} does not exist"
    control = {r["round"]: r["reward_mean"] for r in load(control_file, run)[0]}
    paired = [(r, v - control[r]) for r, v in zip(x, reward, strict=True) if r in control]
    if len(paired) < 2 * window:
        return f"the control shares only {len(paired)} rounds with the run"
    diffs = [d for _, d in paired]
    print(f"paired with the control over rounds {paired[0][0]}..{paired[-1][0]} (same questions, same sampling seeds):")
    for name, part in (("all", diffs), (f"first {window}", diffs[:window]), (f"last {window}", diffs[-window:])):
        lo_p, hi_p = bootstrap_diff([0.0], part)
        print(f"  trained - control, {name} rounds: {sum(part) / len(part):+.4f} "
              f"(bootstrap 95% interval {lo_p:+.4f} .. {hi_p:+.4f})")
    return control


def plot(out: Path, rounds: list[dict[str, Any]], evals: list[dict[str, Any]], control: dict[int, float]) -> None:
    """The reward curve (and the control's) above accuracy and truncation, as a PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, reward, k = [r["round"] for r in rounds], [r["reward_mean"] for r in rounds], 5
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=[3, 2])
    ax1.plot(x, reward, "o-", ms=3, lw=1, color="#7aa874", label="mean reward per round")
    ax1.plot(x, moving_average(reward, k), lw=2.5, color="#2f6f3e", label=f"{k}-round moving average")
    if control:
        cx = [r for r in x if r in control]
        ax1.plot(cx, moving_average([control[r] for r in cx], k), lw=2, ls="--", color="#888888",
                 label=f"untrained control, same questions ({k}-round avg)")
    ax1.set_ylabel("reward (0-1)")
    ax1.set_title("Sapling: SmolLM2-135M-Instruct, GRPO on ReasoningGYM, CPU")
    ax1.legend(loc="upper left")
    ax1.grid(alpha=0.3)
    fmt = [r.get("truncated_fraction", 0.0) for r in rounds]
    ax2.plot(x, [r["accuracy"] * 100 for r in rounds], lw=1, color="#d08c2f", label="own completions fully correct (%)")
    if evals:
        ax2.plot([e["round"] for e in evals], [e["accuracy"] * 100 for e in evals], "s--", color="#3d5a98",
                 label="held-out greedy pass@1 (%)")
    ax2.plot(x, [f * 100 for f in fmt], lw=1, color="#999999", label="completions cut at the length cap (%)")
    ax2.set_xlabel("round")
    ax2.set_ylabel("percent")
    ax2.legend(loc="upper left", fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    atomic_write_bytes(out, png.getvalue())
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("metrics", type=Path, help="metrics.jsonl of the run")
    parser.add_argument("--run", default="default", help="run name inside the file")
    parser.add_argument("--window", type=int, default=10, help="rounds at each end to compare")
    parser.add_argument("--out", type=Path, help="PNG to write")
    parser.add_argument("--control", type=Path,
                        help="metrics.jsonl of the same seed with learning off (paired comparison)")
    args = parser.parse_args(argv)
    if not args.metrics.is_file():
        print(f"plot_learning: {args.metrics} does not exist", file=sys.stderr)
        return 2
    rounds, evals = load(args.metrics, args.run)
    if len(rounds) < 2 * args.window:
        print(f"plot_learning: need at least {2 * args.window} rounds, found {len(rounds)}", file=sys.stderr)
        return 2
    x, reward = [r["round"] for r in rounds], [r["reward_mean"] for r in rounds]
    print_ends(args.run, x, reward, evals, args.window)
    control: dict[int, float] = {}
    if args.control is not None:
        paired = paired_control(args.control, args.run, x, reward, args.window)
        if isinstance(paired, str):
            print(f"plot_learning: {paired}", file=sys.stderr)
            return 2
        control = paired
    if args.out:
        plot(args.out, rounds, evals, control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
