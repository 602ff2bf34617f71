"""A step's micro-batches trained side by side on the CPU: one lane per torch thread, each lane single-threaded.

With torch's default of one intra-op thread per core, every matmul, norm
and element-wise op of the training step forks and joins its threads. A
LoRA step is thousands of small ops (the adapters' rank-16 products, the
norms, RoPE, the per-prompt attention), so the cores spend much of the step
waiting at those joins, and on a machine where other processes hold a core
the waiting thread spins until the scheduler brings its partner back
(docs/backends.md, "The training step", has the measurements). A step's
micro-batches are independent until their gradients are summed, so here
each of `lanes` threads runs whole micro-batches (forward and backward) with
one intra-op thread, and the main thread sums their gradients into the
parameters in micro-batch order: the same sum as one micro-batch after the
other, run to run identical.

Used for LoRA training on the CPU (no dropout, no KL reference) when
torch has 2 or more threads and the step has 2 or more micro-batches
(`lane_count`); the rest, the HF path and every GPU run one micro-batch
after the other as before.

Memory: every lane holds one micro-batch's activations, so a step holds up to
`lanes` micro-batches at once, while `grpo.micro_batch_tokens` bounds only
one. `lane_count` therefore takes only as many lanes as half of the memory
the system has free can hold, by an estimate of what a micro-batch keeps for
its backward (`lane_bytes`): an 8-core laptop with little memory free gets
fewer lanes, never an out-of-memory error from them. Checked on the bundled
model (bench/train_speed.py, the default round's micro-batches of about 200
tokens): the step's peak was +0.91 GB over the loaded model in one lane and
+1.18 GB in two, so a lane adds about 0.27 GB; the estimate says 0.29 GB.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch

T = TypeVar("T")


# What a packed forward keeps for its backward, in fp32 values per token and decoder layer: about ten of the
# hidden width (the norms' inputs, q/k/v/o, the adapters' inputs, the residual) and three of the MLP's width
# (gate, up, their product); and per completion token, its logits and their log-softmax over the vocabulary.
HIDDEN_VALUES, MLP_VALUES, LOGIT_VALUES = 10, 3, 2
FREE_SHARE = 0.5  # lanes may take up to this share of the memory the system has free


def lane_bytes(config: Any, tokens: int, completion_tokens: int) -> int:
    """Estimated bytes one lane holds for a micro-batch of `tokens` tokens (`completion_tokens` of them
    scored) of a model with this (Hugging Face) config; 0 when the config does not say its sizes."""
    try:
        layers, hidden = int(config.num_hidden_layers), int(config.hidden_size)
        mlp, vocab = int(getattr(config, "intermediate_size", 4 * hidden)), int(config.vocab_size)
    except (AttributeError, TypeError, ValueError):
        return 0
    per_token = layers * (HIDDEN_VALUES * hidden + MLP_VALUES * mlp)
    return 4 * (tokens * per_token + completion_tokens * LOGIT_VALUES * vocab)


def largest_lane(config: Any, chunks: Sequence[Sequence[Any]]) -> int:
    """`lane_bytes` of the largest of `chunks` (micro-batches of TrainItems, packed: each distinct prompt once)."""
    sizes = [0]
    for chunk in chunks:
        prompts = {tuple(it.prompt_ids) for it in chunk}
        completions = sum(len(it.completion_ids) for it in chunk)
        sizes.append(lane_bytes(config, sum(map(len, prompts)) + completions, completions))
    return max(sizes)


def free_memory() -> int:
    """Bytes of memory the system has available now (0 when unknown)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):  # pragma: no cover - psutil is a dependency
        return 0


def lane_count(device: torch.device, chunks: int, independent: bool, per_lane: int = 0,
               available: int | None = None) -> int:
    """How many micro-batches run at once: torch's threads on the CPU, else 1 (one after the other).

    independent: the micro-batches share nothing but the frozen weights and the adapters they read (LoRA,
    no dropout, no KL reference switching the adapters off); otherwise one after the other.
    per_lane: the bytes one lane holds (`lane_bytes` of the largest micro-batch); the lanes then take at most
    FREE_SHARE of `available` (the system's free memory when None), and at least one.
    """
    if device.type != "cpu" or not independent or chunks < 2:
        return 1
    lanes = max(1, min(torch.get_num_threads(), chunks))
    if per_lane > 0:
        free = free_memory() if available is None else available
        if free > 0:
            lanes = max(1, min(lanes, int(FREE_SHARE * free) // per_lane))
    return lanes


def run_lanes(
    chunks: Sequence[T],
    lanes: int,
    work: Callable[[T], tuple[torch.Tensor, Any]],
    params: Sequence[torch.Tensor],
    done: Callable[[int, Any], None],
) -> None:
    """For each chunk, `work(chunk)` gives its loss (and its stats) in a lane of its own thread; the
    loss's gradients are added to each parameter's `.grad` in chunk order, then `done(index, stats)` is
    called on this thread. An exception in a lane (a stop request) is raised here once the lanes ended.
    """
    started = threading.local()

    def one(chunk: T) -> tuple[tuple[torch.Tensor | None, ...], Any]:
        if not getattr(started, "single", False):
            torch.set_num_threads(1)  # this lane's own pool, and torch's default for new threads (restored below)
            started.single = True
        loss, stats = work(chunk)
        grads = torch.autograd.grad(loss, list(params), allow_unused=True)
        return grads, stats

    pool = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="train-lane")
    try:
        futures: list[Future[tuple[tuple[torch.Tensor | None, ...], Any]]] = [pool.submit(one, c) for c in chunks]
        for index, future in enumerate(futures):
            grads, stats = future.result()
            with torch.no_grad():
                for param, grad in zip(params, grads, strict=True):
                    if grad is None:
                        continue
                    if param.grad is None:
                        param.grad = grad
                    else:
                        param.grad.add_(grad)
            done(index, stats)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        # A lane's set_num_threads(1) changed only its own pool and the default for threads started later; this
        # thread's own count is untouched and may have been changed meanwhile (engine.node.priority.ThreadPolicy, from
        # `done`), so it is the one to restore, never the count read before the lanes.
        torch.set_num_threads(torch.get_num_threads())
