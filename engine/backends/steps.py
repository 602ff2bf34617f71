"""The policy-gradient step loop both training backends share.

`train_steps` runs `pg_steps` optimiser steps over a round's items: it cuts
them into token-budget micro-batches, lets the backend accumulate gradients
over them, and applies the step. A step that runs out of memory is thrown
away, the micro-batch budget halved, and the step redone from its start
(`MicroBatchBudget.shrink_after_oom` gives up with advice at the floor).
What differs per backend is passed in: how to accumulate, how to apply, and
what an out-of-memory error looks like.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.backends.base import StepCallback, TrainItem
from engine.backends.batching import MicroBatchBudget, micro_batches
from engine.common.config import GRPOConfig

# (micro-batches, total completion tokens, step index, on_step) -> (gradients or None, the step's stat sums)
Accumulate = Callable[[list[list[TrainItem]], float, int, StepCallback | None], tuple[Any, dict[str, float]]]

STAT_KEYS = ("loss", "clip_fraction", "kl", "grad_norm")


def empty_stats() -> dict[str, float]:
    """The stats of a round with nothing to train on."""
    return {**dict.fromkeys(STAT_KEYS, 0.0), "train_tokens": 0.0, "oom_retries": 0.0}


def train_steps(
    items: Sequence[TrainItem],
    grpo: GRPOConfig,
    budget: MicroBatchBudget,
    *,
    shared_prompts: bool,
    packed: bool = False,
    accumulate: Accumulate,
    apply: Callable[[Any], float | None],
    is_oom: Callable[[BaseException], bool],
    after_oom: Callable[[], None],
    on_step: StepCallback | None = None,
) -> dict[str, float]:
    """`grpo.pg_steps` optimiser steps over `items`; the stats averaged over the steps.

    `apply(gradients)` clips and steps the optimiser and returns the gradient
    norm before clipping (None when it was not measured). `shared_prompts`
    and `packed` say how a micro-batch's tokens are counted (`micro_batches`).
    """
    if not items:
        return empty_stats()
    total_tokens = float(sum(len(it.completion_ids) for it in items))
    sums = dict.fromkeys(STAT_KEYS, 0.0)
    retries = 0
    for step in range(grpo.pg_steps):
        while True:
            chunks = micro_batches(items, *budget.limits(grpo), shared_prompts=shared_prompts, packed=packed)
            try:
                grads, step_sums = accumulate(chunks, total_tokens, step, on_step)
                break
            except BaseException as exc:
                if not is_oom(exc):
                    raise
            # Outside the except block, so the failed step's tensors are already freed.
            retries += 1
            after_oom()
        norm = apply(grads)
        if norm is not None:
            step_sums["grad_norm"] = norm
        for key, value in step_sums.items():
            sums[key] += value / grpo.pg_steps
    return {**sums, "train_tokens": total_tokens, "oom_retries": float(retries)}
