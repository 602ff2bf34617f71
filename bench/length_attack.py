"""HTTT's length attack (arXiv 2511.09780, its denial-of-service variant) against real Sapling nodes.

    .venv/bin/python -m bench.length_attack --out DIR                       # 40 rounds, 2 victims, every run
    .venv/bin/python -m bench.length_attack --out DIR --rounds 12 --only clean,attack-plausibility
    .venv/bin/python -m bench.length_attack --out DIR --summary             # the table of what is there

The attacker (`LengthAttacker`, bench/poisoning_peers.py) publishes correct
answers that pass every check (the verifier, the re-scoring, the
plausibility test: it sends only filler that the first victim's policy finds
plausible with a margin of 1 nat) padded with ordinary sentences to just under the
receivers' length cap, and short wrong ones beside them, so the long ones
get the positive advantage. Victims that train on them learn to write long:
longer rounds, and answers cut off at the length cap before the answer.

Runs, with the same seeds (paired round by round), all on bench/poisoning.py's
setting (an `EmbeddedRelay` on loopback, victims that are real `Node`s of the
bundled model):

- `clean`: no attacker, the defence as shipped (the reference);
- `clean-nolength`: no attacker, `swarm.length_ratio=0` (the length check's cost to honest nodes);
- `attack-off`: the attacker, no defence at all (plausibility and length checks off);
- `attack-plausibility`: the attacker, the defence before the length check (`swarm.length_ratio=0`);
- `attack-on`: the attacker, the defence as shipped.

Each run's `rounds.jsonl` keeps per victim round: mean completion tokens,
seconds (generation, training), reward, and the items accepted and rejected
from the attacker and from the other victim (an honest peer). `--summary`
prints each run's means and its ratio to `clean` over the same (victim,
round) pairs, with a 95% bootstrap interval: only the victim rounds that
every run in the folder reached.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.poisoning_peers import LengthAttacker, each_victim_round, node_settings, victims_on_a_relay
from bench.poisoning_report import read_rows
from engine.common.atomicio import append_line

RUNS = ("clean", "clean-nolength", "attack-off", "attack-plausibility", "attack-on")
SETTINGS = {
    "clean": [],
    "clean-nolength": ["swarm.length_ratio=0"],
    "attack-off": ["swarm.plausibility_check=false", "swarm.length_ratio=0"],
    "attack-plausibility": ["swarm.length_ratio=0"],
    "attack-on": [],
}


def passes(node: Any, question: Any, text: str) -> bool:
    """Whether `text` passes the plausibility test under `node`'s policy now, with a margin: the attacker has the
    public model, and here it even follows a victim's training (the strongest attacker of this kind)."""
    from engine.swarm.defence import window_floor

    backend, sw = node.backend, node.config.swarm
    prompt = backend.encode_prompt(node.taskset.messages(question))
    lps = backend.behaviour_logprobs([(prompt, backend.encode_completion(text))], node.config.tasks.temperature)[0]
    return window_floor(lps[:-1], sw.plausibility_window) >= sw.implausible_logprob + 1.0


def _counts(by_peer: dict[str, Any], peer: str | None) -> dict[str, Any] | None:
    c = by_peer.get(peer) if peer else None
    return {"accepted": c["accepted"], "reasons": dict(c["reasons"])} if c else None


def run_one(run: str, out: Path, rounds: int, victims: int, batches: int, extra: Sequence[str]) -> None:
    """One run of `RUNS`, resumable: each victim in turn a round at a time; a line per victim round."""
    folder = out / run
    log_file = folder / "rounds.jsonl"
    done = {(r["victim"], r["round"]) for r in read_rows(log_file)}
    configs = [lambda url, i=i: node_settings(url, i + 1, [*SETTINGS[run], *extra]) for i in range(victims)]
    with victims_on_a_relay(folder, configs) as on:
        nodes = on.nodes
        ids = [session.exchange.identity.peer_id for _, session in on.opened]
        attacker = None
        if run.startswith("attack"):
            first = nodes[0]
            tasks = first.config.tasks
            attacker = on.attacker = LengthAttacker(
                on.url, folder / "attacker.key", first.taskset, tasks.questions_per_round,
                tasks.completions_per_question, first.backend.encode_completion, 2 * tasks.max_new_tokens - 2,
                start=1000 * first.round, plausible=lambda q, t: passes(first, q, t))
            attacker.client.wait_connected(10)
        attacker_id = attacker.identity.peer_id if attacker else None

        def logged(i: int, m: dict[str, Any], seconds: float) -> None:
            by_peer = m.get("swarm", {}).get("by_peer", {})
            record = {
                "run": run, "victim": i, "round": m["round"], "seconds": seconds,
                "tokens": m["completion_tokens_mean"], "truncated": m["truncated_fraction"],
                "generate_seconds": m["generate_seconds"], "train_seconds": m["train_seconds"],
                "reward_mean": m["reward_mean"], "external_groups": m["external_groups"],
                "attacker": _counts(by_peer, attacker_id),
                "honest": [_counts(by_peer, p) for j, p in enumerate(ids) if j != i],
            }
            if (i, m["round"]) not in done:
                append_line(log_file, json.dumps(record))
            print(f"{run} victim {i} round {m['round']:3d} tokens {record['tokens']:5.1f} "
                  f"reward {m['reward_mean']:.3f} external {m['external_groups']} "
                  f"rejected {m.get('swarm', {}).get('rejected', {})} ({record['seconds']:.0f} s)", flush=True)

        each_victim_round(nodes, rounds, attacker, batches, logged)


def paired_ratio(pairs: Sequence[tuple[float, float]], draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The ratio of sums of a run to the reference over paired values, and its 95% bootstrap interval."""
    def ratio(sample: Sequence[tuple[float, float]]) -> float:
        ref = sum(b for _, b in sample)
        return sum(a for a, _ in sample) / ref if ref else float("nan")

    rng = random.Random(seed)
    values = sorted(ratio([rng.choice(pairs) for _ in pairs]) for _ in range(draws))
    return ratio(pairs), values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def _total(rows: list[dict[str, Any]], who: str) -> tuple[int, int, int]:
    """Items from `who` (attacker or honest) up to the last of `rows`: accepted, rejected too_long, rejected in all.

    A round's counts are the session's totals so far, so each victim's last row holds them all (a resumed run
    counts from its restart)."""
    last: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r["victim"] not in last or r["round"] > last[r["victim"]]["round"]:
            last[r["victim"]] = r
    acc = long = rej = 0
    for r in last.values():
        counts = [r[who]] if who == "attacker" else r[who]
        for c in counts:
            if c:
                acc += c["accepted"]
                long += c["reasons"].get("too_long", 0)
                rej += sum(c["reasons"].values())
    return acc, long, rej


def summary(out: Path) -> str:
    """Per run: means, their ratios to `clean` over the same (victim, round) pairs (95% interval), items."""
    every = {run: read_rows(out / run / "rounds.jsonl") for run in RUNS}
    keys = [{(r["victim"], r["round"]) for r in rows} for rows in every.values() if rows]
    common = set.intersection(*keys) if keys else set()  # every column over the same victim rounds
    ref = {(r["victim"], r["round"]): r for r in every["clean"]}
    lines = ["| run | victim rounds | tokens per completion | round seconds | reward | tokens vs clean | "
             "seconds vs clean | reward vs clean | attacker items accepted / too_long / rejected | "
             "honest items accepted / too_long / rejected |", "|---" * 10 + "|"]
    for run in RUNS:
        rows = [r for r in every[run] if (r["victim"], r["round"]) in common]
        if not rows:
            continue
        n = len(rows)
        cells = [f"{sum(r[k] for r in rows) / n:.2f}" for k in ("tokens", "seconds", "reward_mean")]
        paired = [(r, ref[(r["victim"], r["round"])]) for r in rows if (r["victim"], r["round"]) in ref]
        for k in ("tokens", "seconds", "reward_mean"):
            if paired and run != "clean":
                value, low, high = paired_ratio([(a[k], b[k]) for a, b in paired])
                cells.append(f"{value:.2f} ({low:.2f}-{high:.2f})")
            else:
                cells.append("")
        att = _total(rows, "attacker") if run.startswith("attack") else None
        hon = _total(rows, "honest")
        lines.append(f"| {run} | {n} | " + " | ".join(cells) + f" | {'/'.join(map(str, att)) if att else ''} | "
                     f"{'/'.join(map(str, hon))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="length_attack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the runs (resumed when it exists)")
    ap.add_argument("--rounds", type=int, default=40, help="rounds per victim (default 40)")
    ap.add_argument("--victims", type=int, default=2, help="honest victim nodes (default 2)")
    ap.add_argument("--only", default=",".join(RUNS), help=f"comma-separated runs of {', '.join(RUNS)}")
    ap.add_argument("--attack-batches", type=int, default=2, help="attacker batches published before each victim round")
    ap.add_argument("--set", action="append", default=[], metavar="section.key=value", help="extra node settings")
    ap.add_argument("--summary", action="store_true", help="only print the table of the runs in --out")
    args = ap.parse_args(argv)
    runs = [r for r in args.only.split(",") if r]
    problem = ""
    if any(r not in RUNS for r in runs):
        problem = f"--only takes runs from {', '.join(RUNS)}."
    elif args.rounds < 1 or args.victims < 1 or args.attack_batches < 1:
        problem = "--rounds, --victims and --attack-batches must be at least 1."
    if problem:
        print(f"length_attack: {problem}", file=sys.stderr)
        return 2
    if not args.summary:
        for run in runs:
            run_one(run, args.out, args.rounds, args.victims, args.attack_batches, args.set)
    print(summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
