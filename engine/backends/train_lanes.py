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
after the other as before. Memory: one micro-batch's
activations per lane instead of one in all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def lane_count(device: torch.device, chunks: int, independent: bool) -> int:
    """How many micro-batches run at once: torch's threads on the CPU, else 1 (one after the other).

    independent: the micro-batches share nothing but the frozen weights and the adapters they read (LoRA,
    no dropout, no KL reference switching the adapters off); otherwise one after the other.
    """
    if device.type != "cpu" or not independent or chunks < 2:
        return 1
    return max(1, min(torch.get_num_threads(), chunks))


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
    threads = torch.get_num_threads()
    started = threading.local()

    def one(chunk: T) -> tuple[tuple[torch.Tensor | None, ...], Any]:
        if not getattr(started, "single", False):
            torch.set_num_threads(1)  # this thread's intra-op pool (and torch's global setting: restored below)
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
        torch.set_num_threads(threads)
