"""What probing's generation costs against a plain round's, with and without the prompt cache, measured in one run.

Probing (tasks.probe_answers = k, tasks.probe_questions = P) samples k
answers of P drawn questions, keeps B of them, and samples G - k more for
those. Its second call used to read the B kept prompts again; with a
`PromptCache` (engine/backends/base.py) it copies their keys and values
from the first call instead. Sides, on one backend in this process,
alternating repeat by repeat so that load from other processes falls on all:

- `plain`: the default round, B questions x G answers;
- `probe P`: P x k, then B x (G - k), each prompt read twice;
- `probe P cached`: the same two calls with the prompt cache.

Each repeat draws the questions of one more round (rounds 1, 2, ... as a
node would) and resamples with that round's seed; both probing sides complete
the same B questions, chosen from the first probe's answers as a node chooses
them (engine/questions/probe.py), so they do the same work but the prompts read. The
headline is the median wall time and CPU time of each side, and its ratio
to `plain` measured in the same run.

    .venv/bin/python -m bench.probe_cost                         # P = 16 and 24, 5 repeats, 2 threads
    .venv/bin/python -m bench.probe_cost --pools 24 --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.args import comma_numbers


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | str:
    """The arguments, or why they are refused (one sentence)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pools", default="16,24", help="probe_questions values, comma-separated (default 16,24)")
    parser.add_argument("--answers", type=int, default=3, help="probe_answers k (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats, one round's questions each (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    args.pool_sizes = comma_numbers(args.pools, int, "--pools")
    if isinstance(args.pool_sizes, str):
        return args.pool_sizes
    if any(p < 8 for p in args.pool_sizes):
        return "--pools must each be at least questions_per_round (8)"
    if not 1 <= args.answers < 8:
        return "--answers must be from 1 to completions_per_question - 1 (7)"
    if args.repeats < 1 or args.threads < 1:
        return "--repeats and --threads must be at least 1"
    return args


def timed(work: Any) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def run_side(side: str, backend: Any, taskset: Any, t: Any, pool: list[Any], prompts: list[list[int]],
             chosen: dict[int, list[int]], k: int) -> None:
    """One side's generation for one round's questions (t: the tasks config); `chosen` keeps each pool size's choice
    for its other side."""
    from engine.backends import PromptCache
    from engine.questions.probe import choose

    B, G, new = t.questions_per_round, t.completions_per_question, t.max_new_tokens
    if side == "plain":
        backend.generate(prompts[:B], G, new, t.temperature)
        return
    P = int(side.split()[1])
    read = PromptCache() if side.endswith("cached") else None
    probes = backend.generate(prompts[:P], k, new, t.temperature, None, read)
    if P not in chosen:
        chosen[P] = choose(pool[:P], probes, taskset.reward, B, G, 0)[0]
    backend.generate([prompts[i] for i in chosen[P]], G - k, new, t.temperature, None, read)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, str):
        print(f"probe_cost: {args}", file=sys.stderr)
        return 2
    import torch

    from bench.bundled import bundled_cpu
    from engine.node.loop import derive_seed

    torch.set_num_threads(args.threads)
    cfg, backend, taskset = bundled_cpu()
    t = cfg.tasks
    B, G, k, new = t.questions_per_round, t.completions_per_question, args.answers, t.max_new_tokens
    sides = ["plain", *(f"probe {p}{c}" for p in args.pool_sizes for c in ("", " cached"))]
    times: dict[str, list[tuple[float, float]]] = {s: [] for s in sides}
    print(f"probe_cost: bundled SmolLM2-135M, B={B} G={G} k={k}, up to {new} new tokens, {args.threads} threads, "
          f"{args.repeats} repeats")
    for repeat in range(args.repeats):
        r = repeat + 1
        pool = taskset.draw(r, max(args.pool_sizes))
        prompts = [backend.encode_prompt(taskset.messages(q)) for q in pool]
        seed = derive_seed(cfg.run.seed, r)
        order = sides if repeat % 2 == 0 else sides[::-1]
        chosen: dict[int, list[int]] = {}
        for side in order:
            backend.reseed(seed)
            times[side].append(timed(functools.partial(run_side, side, backend, taskset, t, pool, prompts, chosen, k)))
        print(f"  repeat {r}: " + ", ".join(f"{s} {times[s][-1][0]:.2f} s" for s in sides), flush=True)
    results: dict[str, Any] = {}
    plain_wall = statistics.median(w for w, _ in times["plain"])
    plain_cpu = statistics.median(c for _, c in times["plain"])
    for side in sides:
        wall, cpu = statistics.median(w for w, _ in times[side]), statistics.median(c for _, c in times[side])
        results[side] = {"wall_s": wall, "cpu_s": cpu, "wall_vs_plain": wall / plain_wall,
                         "cpu_vs_plain": cpu / plain_cpu}
        print(f"{side:>16}: {wall:6.2f} s wall ({wall / plain_wall:.2f}x plain), {cpu:6.2f} s CPU "
              f"({cpu / plain_cpu:.2f}x plain)")
    for P in args.pool_sizes:
        saved = 1 - results[f"probe {P} cached"]["wall_s"] / results[f"probe {P}"]["wall_s"]
        results[f"probe {P} cache saves"] = saved
        print(f"probe {P}: the prompt cache saves {saved:.0%} of probing's generation time")
    if args.json is not None:
        from engine.common.atomicio import atomic_write_json

        atomic_write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
