"""Where the fast decoder's time goes: a round's sampling and the 27-question greedy pass, by phase and by op.

    .venv/bin/python -m bench.decode_profile                # sampling (round 1) and greedy (27 held-out)
    .venv/bin/python -m bench.decode_profile --only greedy --ops 15

Runs `TorchBackend.generate` / `greedy` as the node does, once to warm up
and once timed, with the decoder's phases timed by wrapping its functions:
building the inference weights (merge, cast, oneDNN reorder), the prompt
pass, the decode steps, and what is left (sampling, bookkeeping). The
steps' time is then split by torch op from one `torch.profiler` run
(matmuls, attention, the rest), which adds its own overhead, so only its
shares are printed. Run it on a quiet machine: it reports fractions of
its own wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::linear", "mkldnn::_linear_pointwise", "aten::bmm", "aten::matmul")
ATTENTION_OPS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_attention_math")


class PhaseTimer:
    """Wall seconds spent inside wrapped callables, by phase name (re-entrant calls counted once)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1
        return timed


def _ranged(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        from torch.profiler import record_function

        with record_function(name):
            return fn(*args, **kwargs)
    return run


def _category(op: str) -> str:
    return "matmul" if op in MATMUL_OPS else "attention" if op in ATTENTION_OPS or "attention" in op else "other"


def op_shares(run: Callable[[], Any], ranges: dict[str, tuple[Any, str]]) -> dict[str, dict[str, float]]:
    """Self CPU time by op inside each named range (and "whole call"), as fractions of that range's total.

    ranges: name -> (owner, attribute): the callable wrapped in a `record_function` range of that name.
    """
    from torch.profiler import ProfilerActivity, profile

    saved = {name: getattr(owner, attr) for name, (owner, attr) in ranges.items()}
    for name, (owner, attr) in ranges.items():
        setattr(owner, attr, _ranged(name, saved[name]))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
    finally:
        for name, (owner, attr) in ranges.items():
            setattr(owner, attr, saved[name])
    by_range: dict[str, dict[str, float]] = {name: defaultdict(float) for name in ["whole call", *ranges]}

    def walk(event: Any, into: dict[str, float]) -> None:
        into[event.name] += event.self_cpu_time_total
        for child in event.cpu_children:
            walk(child, into)

    for event in prof.events():
        by_range["whole call"][event.name] += event.self_cpu_time_total  # self times: nothing counted twice
        if event.name in ranges:
            walk(event, by_range[event.name])
    shares = {}
    for name, ops in by_range.items():
        for own in ranges:
            ops.pop(own, None)
        total = sum(ops.values()) or 1.0
        shares[name] = {op: us / total for op, us in sorted(ops.items(), key=lambda item: -item[1])}
    return shares


def jobs_to_profile(only: str | None, eval_questions: int) -> dict[str, Callable[[], Any]]:
    """The calls profiled, by name: round 1's sampling and a greedy pass over the held-out set (or one of them)."""
    import torch

    from bench.bundled import bundled_cpu
    from engine.backends import decode_model
    from engine.node.loop import derive_seed

    cfg, backend, taskset = bundled_cpu()
    t = cfg.tasks
    prompts = [backend.encode_prompt(taskset.messages(q)) for q in taskset.draw(1, t.questions_per_round)]
    held_out = [backend.encode_prompt(taskset.eval_messages(q)) for q in taskset.eval_set(eval_questions)]
    jobs: dict[str, Callable[[], Any]] = {}
    if only in (None, "sampling"):
        def sample() -> Any:
            backend.reseed(derive_seed(cfg.run.seed, 1))
            return backend.generate(prompts, t.completions_per_question, t.max_new_tokens, t.temperature)
        jobs[f"sampling, round 1 ({len(prompts)} questions x {t.completions_per_question})"] = sample
    if only in (None, "greedy"):
        jobs[f"greedy, {len(held_out)} held-out questions"] = lambda: backend.greedy(held_out, t.max_new_tokens)
    print(f"decode_profile: bundled SmolLM2-135M, {torch.get_num_threads()} threads, decoder packed for oneDNN: "
          f"{decode_model.can_pack(torch.device('cpu'), torch.float32)}")
    return jobs


def decoder_phases() -> dict[str, tuple[Any, str]]:
    """The decoder's phases, as (owner, attribute) of the callable each one is; disjoint: none calls another."""
    from engine.backends import decode, decode_model, kv_cache, torch_backend

    return {
        "weights (merge, oneDNN reorder)": (decode_model.DecodeModel, "__init__"),
        "KV cache allocation": (kv_cache.KVCache, "__init__"),
        "prompt pass": (decode_model.DecodeModel, "prefill"),
        "steps": (decode_model.DecodeModel, "step"),
        "sampler": (decode, "choose_tokens"),
        "dropping finished groups": (kv_cache.KVCache, "keep_groups"),
        "memory release (gc, malloc_trim)": (torch_backend, "release_memory"),
    }


def time_phases(name: str, job: Callable[[], Any], phases: dict[str, tuple[Any, str]]) -> None:
    """One warm call, then one timed with each phase wrapped: wall time and each phase's share, printed."""
    job()  # warm-up: first-call allocations, oneDNN primitive caches
    timer = PhaseTimer()
    saved = {phase: getattr(owner, attr) for phase, (owner, attr) in phases.items()}
    for phase, (owner, attr) in phases.items():
        setattr(owner, attr, timer.wrap(phase, saved[phase]))
    try:
        start = time.perf_counter()
        job()
        wall = time.perf_counter() - start
    finally:
        for phase, (owner, attr) in phases.items():
            setattr(owner, attr, saved[phase])
    print(f"{name}: {wall:.2f} s")
    rest = wall - sum(timer.seconds.values())
    for phase in phases:
        calls = f" in {timer.calls[phase]} calls" if timer.calls[phase] != 1 else ""
        print(f"  {phase:36s} {timer.seconds[phase]:6.2f} s  {timer.seconds[phase] / wall:5.1%}{calls}")
    print(f"  {'the rest (bookkeeping, text)':36s} {rest:6.2f} s  {rest / wall:5.1%}")


def print_op_shares(job: Callable[[], Any], top: int) -> None:
    """Self CPU time by op in the prompt pass, the steps and the whole call, by kind and the `top` ops."""
    from engine.backends import decode_model

    shares = op_shares(job, {"prompt pass": (decode_model.DecodeModel, "prefill"),
                             "steps": (decode_model.DecodeModel, "step")})
    print("  self CPU time by op under torch.profiler (which adds overhead of its own):")
    for part, ops in shares.items():
        kinds: dict[str, float] = defaultdict(float)
        for op, share in ops.items():
            kinds[_category(op)] += share
        print(f"  {part}: " + ", ".join(f"{k} {kinds[k]:.1%}" for k in ("matmul", "attention", "other")))
        for op, share in list(ops.items())[:top]:
            print(f"    {share:6.1%}  {op}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["sampling", "greedy"], help="profile one of the two (default both)")
    parser.add_argument("--ops", type=int, default=10, help="how many ops to list by self time (default 10)")
    parser.add_argument("--eval", type=int, default=27, help="held-out questions for the greedy pass (default 27)")
    args = parser.parse_args(argv)
    if args.ops < 0 or args.eval < 1:
        print("decode_profile: --ops must be 0 or more and --eval at least 1.", file=sys.stderr)
        return 2
    jobs = jobs_to_profile(args.only, args.eval)
    phases = decoder_phases()
    for name, job in jobs.items():
        time_phases(name, job, phases)
        print_op_shares(job, args.ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
