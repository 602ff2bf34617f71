"""Where does bf16 lose the GRPO gradient on this CPU? Each op kept in fp32 in turn, against fp32 on the same weights.

    .venv/bin/python -m bench.bf16_gradient            # the default round's items (bench.train_speed's file)
    .venv/bin/python -m bench.bf16_gradient --quick    # the items of its first two questions
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 .venv/bin/python -m bench.bf16_gradient   # oneDNN without AMX

**What.** The bundled model with a trained adapter (one AdamW step, so B is
not zero), the same items `bench.train_speed` trains on. The reference is the
packed step in fp32 (autocast off) on the same weights. Each variant's LoRA
gradient is compared with it: cosine, norm ratio and relative distance, as
one vector. Variants: the old (HF) step in fp32 (how far two fp32 paths are),
both steps under bf16 autocast, and the packed step under bf16 with one part
kept in fp32 ("islands"): the LM head and its log-softmax, attention, every
projection (frozen matmuls and LoRA), and all three. Last, both precisions
on-policy: each with the behaviour log-probs its own sampler would have
written, so that the ratio is 1 and the clip takes nothing; what is left
is the gradient's arithmetic.

**Why a sum can lose its direction.** A GRPO gradient is a sum over groups
of advantage-weighted gradients of log-probs whose advantages have both
signs. When the groups' gradients nearly cancel, a small relative error in
each becomes a large one in the sum: the bench prints the cancellation
factor (the sum of the groups' gradient norms over the norm of their sum,
in fp32) and each group's own cosine between bf16 and fp32. A group's
cosine near 1 with the sum's far from it says the loss is in the sum, not
in one op; an island that brings the sum back says which op's rounding
matters.

**Derived tolerance.** bf16 keeps 8 significant bits, so an input rounds by
up to u = 2**-8 of itself. A group's gradient then carries a relative error
e_group (measured here, per group); the sum of n groups, each of norm |g_i|,
is off by up to e_group * sum |g_i| = e_group * C * |sum g_i| with C the
cancellation factor. The bench reports that bound beside the measured
distance; the bf16 paths must each lie within it of fp32 (`bench.train_speed`
compares each path with fp32 the same way).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.gradients import ISLANDS, against, flat_gradient, groups_of, parts_in_bf16
from bench.train_speed import QUICK_QUESTIONS, first_questions, items_path, load_items, round_items


def on_policy(backend: Any, items: Sequence[Any], bf16: bool) -> list[Any]:
    """The items with their behaviour log-probs recomputed by this policy in one precision (as the round loop's
    sampler would have written them, on merged weights): the step's ratio is then 1 up to rounding, and nothing
    is clipped because the sampler and the trainer ran at another precision."""
    from dataclasses import replace

    backend.autocast = bf16
    logps = backend.behaviour_logprobs([(it.prompt_ids, it.completion_ids) for it in items], backend.temperature)
    return [replace(it, old_logprobs=logp) for it, logp in zip(items, logps, strict=True)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the items of the first two questions only")
    parser.add_argument("--round", type=int, default=1, help="the round whose items train (bench.train_speed's)")
    parser.add_argument("--items", type=Path, default=None, help="a saved items file (bench.train_speed --items)")
    args = parser.parse_args(argv)
    import torch

    from bench.bundled import bundled_cpu

    cfg, backend, taskset = bundled_cpu()
    if not backend.autocast:
        print("bf16_gradient: this CPU has no native bf16, so `auto` trains in fp32 here; nothing to compare.",
              file=sys.stderr)
        return 2
    t = cfg.tasks
    meta = {"model": backend.model_dir.name, "round": args.round, "seed": cfg.run.seed,
            "questions": t.questions_per_round, "completions": t.completions_per_question,
            "max_new_tokens": t.max_new_tokens, "temperature": t.temperature}
    items = load_items(items_path(args), meta, lambda: round_items(backend, cfg, taskset, args.round))[0]
    if args.quick:
        items = first_questions(items, QUICK_QUESTIONS)
    backend.use_adapter_slot(backend.new_adapter_slot(1))
    backend.packed_training = True
    backend.train(items)  # one AdamW step (bf16, as `auto` trains here): B is no longer zero
    isa = ", ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ)
    print(f"bf16_gradient: bundled SmolLM2-135M, {len(groups_of(items))} questions, {len(items)} completions, "
          f"torch kernels {torch.backends.cpu.get_cpu_capability()}{f' ({isa})' if isa else ''}")
    reference, ref_stats = flat_gradient(backend, items, bf16=False, packed=True)
    rows: list[tuple[str, dict[str, float], dict[str, Any]]] = []
    old32, old32_stats = flat_gradient(backend, items, bf16=False, packed=False)
    rows.append(("old step, fp32", against(reference, old32), old32_stats))
    for packed in (True, False):
        grad, stats = flat_gradient(backend, items, bf16=True, packed=packed)
        rows.append((f"{'new' if packed else 'old'} step, bf16", against(reference, grad), stats))
    for islands in ([name] for name in ISLANDS):
        grad, stats = flat_gradient(backend, items, bf16=True, packed=True, islands=islands)
        rows.append((f"new step, bf16, {' + '.join(islands)} in fp32", against(reference, grad), stats))
    grad, stats = flat_gradient(backend, items, bf16=True, packed=True, islands=ISLANDS)
    rows.append(("new step, bf16, all three in fp32", against(reference, grad), stats))
    # The saved items' behaviour log-probs come from one precision's sampler; recomputed in each precision, the
    # comparison is of the gradient arithmetic alone, with the ratio and the clip out of it.
    own32 = flat_gradient(backend, on_policy(backend, items, bf16=False), bf16=False, packed=True)
    own16 = flat_gradient(backend, on_policy(backend, items, bf16=True), bf16=True, packed=True)
    rows.append(("on-policy in each precision: new, bf16 vs fp32", against(own32[0], own16[0]), own16[1]))
    print(f"reference: new step, fp32: loss {ref_stats['loss']:.4f}, clipped {ref_stats['clip_fraction']:.3f}; "
          f"on-policy in fp32: clipped {own32[1]['clip_fraction']:.3f}")
    print(f"{'variant':<44} {'cosine':>7} {'norm':>6} {'distance':>9} {'loss':>8} {'clipped':>8}")
    for name, cmp, stats in rows:
        print(f"{name:<44} {cmp['cosine']:>7.3f} {cmp['norm_ratio']:>6.2f} {cmp['distance']:>9.2e} "
              f"{stats['loss']:>8.4f} {stats['clip_fraction']:>8.3f}")
    for name, cut in (("questions", groups_of(items)), ("completions", [[it] for it in items])):
        parts = parts_in_bf16(backend, cut, packed=True)
        errors = sorted(parts.errors)
        print(f"{name}: cancellation factor {parts.cancellation:.1f} (sum of their gradient norms / norm of the "
              f"sum, fp32); each one's bf16 distance from fp32 {errors[0]:.2e} .. {errors[-1]:.2e} (median "
              f"{errors[len(errors) // 2]:.2e}); the bound they give the step's distance (sum of e_i * |g_i| / "
              f"|sum|): {parts.bound:.2e}")
    print(f"reproduce: .venv/bin/python -m bench.bf16_gradient{' --quick' if args.quick else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
