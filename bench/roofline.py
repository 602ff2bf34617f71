"""What the speed benches share: timers, peak RSS, other processes' load, and the roofline (the model's own
matmuls timed as plain GEMMs).

bench/rollout_speed.py (decoding) and bench/train_speed.py (the training
step) both measure this machine's GEMM speed on the model's weight shapes
(q/k/v fused, o, gate/up fused, down per layer, then the LM head), in the
dtype they run in, and report their own throughput as a share of it. Not
a bench itself: nothing here runs on its own.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def measured(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall seconds, this process's CPU seconds, and the result.

    On a shared machine the wall time of each side depends on what the
    others run meanwhile; CPU seconds count this process's own work.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


class ForeignLoad:
    """How many cores other processes kept busy from its creation to `cores()`: the machine's busy CPU time
    minus this process's, over the wall time. On a shared machine it says how far the seconds are inflated."""

    def __init__(self) -> None:
        self.start, self.busy, self.own = time.perf_counter(), self._busy(), time.process_time()

    @staticmethod
    def _busy() -> float:
        import psutil

        t = psutil.cpu_times()
        return float(sum(t)) - float(t.idle) - float(getattr(t, "iowait", 0.0))

    def cores(self) -> float:
        wall = time.perf_counter() - self.start
        return max(0.0, (self._busy() - self.busy) - (time.process_time() - self.own)) / max(wall, 1e-9)


def weight_shapes(config: Any) -> list[tuple[int, int]]:
    """(fan_in, out) of one layer's matmuls as the decoder fuses them: q/k/v, o, gate/up, down."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    return [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * inter), (inter, hidden)]


def gemm_flops(config: Any, rows: int) -> float:
    """Floating-point operations of the matmuls `gemm_seconds` times (2 per multiply-add)."""
    per_row = sum(fan_in * out for fan_in, out in weight_shapes(config)) * config.num_hidden_layers
    return 2.0 * rows * (per_row + config.hidden_size * config.vocab_size)


def gemm_step(config: Any, rows: int, dtype: Any, packed: bool = False) -> Callable[[], None]:
    """The model's matmuls for `rows` rows (one decode step, or one packed micro-batch) as plain GEMMs, ready to time.

    packed: with the weights reordered for oneDNN, as the decoder runs them on the CPU in fp32.
    """
    import torch

    from engine.backends.decode_model import matmul, pack_weight

    shapes = weight_shapes(config)
    prepare = pack_weight if packed else (lambda w: w)
    # One weight set per layer, as the model has: one set reused would stay in cache.
    layers = [[prepare(torch.randn(out, fan_in).to(dtype)) for fan_in, out in shapes]
              for _ in range(config.num_hidden_layers)]
    inputs = [torch.randn(rows, fan_in).to(dtype) for fan_in, _ in shapes]
    head = prepare(torch.randn(config.vocab_size, config.hidden_size).to(dtype))
    head_in = torch.randn(rows, config.hidden_size).to(dtype)

    def step() -> None:
        for weights in layers:
            for x, w in zip(inputs, weights, strict=True):
                matmul(x, w, None)
        matmul(head_in, head, None)

    step()
    return step


def gemm_seconds(config: Any, rows: int, dtype: Any, repeats: int = 3, packed: bool = False) -> float:
    """Median time of `gemm_step`'s matmuls over `repeats` calls."""
    step = gemm_step(config, rows, dtype, packed)
    return statistics.median(timed(step)[0] for _ in range(repeats))
