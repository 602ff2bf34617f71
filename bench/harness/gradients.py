"""One training step's LoRA gradient as one vector, on either path and precision, and how far bf16 rounding moves it.

`bench.train_speed` (is the packed step right?) and `bench.bf16_gradient`
(where does bf16 lose the gradient?) both compare a step's gradient with the
same step in fp32 on the same weights.

**The bound a step's bf16 gradient must meet.** A step's gradient is the sum
of its completions' gradients, g = sum_i g_i. If bf16 moves each g_i by e_i
of its own norm, the triangle inequality bounds the sum's distance from fp32:
|g16 - g32| <= sum_i e_i |g_i|, so relative to |g32| the step may be off by
`bound` = sum_i e_i |g_i| / |sum_i g_i|. GRPO's advantages sum to zero within
each question, so the completions' gradients nearly cancel and that bound is
far above bf16's own 2**-8: a correct bf16 step can point elsewhere than the
fp32 one. A step further from fp32 than its own parts allow has an error of
its own (a wrong cast, a dropped term), which is what the benches check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

ISLANDS = ("head", "attention", "projections")
_TARGETS = {"head": "token_logprobs", "attention": "attention", "projections": "project"}


@contextlib.contextmanager
def fp32_islands(names: Sequence[str]) -> Iterator[None]:
    """The packed step's parts in `names` run in fp32 (autocast off, inputs cast up) while the rest stays bf16:
    "head" the LM head and its log-softmax, "attention", "projections" every linear layer (frozen and LoRA)."""
    import torch

    from engine.backends import train_forward

    saved = {name: getattr(train_forward, target) for name, target in _TARGETS.items()}

    def in_fp32(fn: Callable[..., Any]) -> Callable[..., Any]:
        def up(value: Any) -> Any:
            if isinstance(value, list):
                return [up(v) for v in value]
            return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

        def run(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast("cpu", enabled=False):
                return fn(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
        return run

    try:
        for name in names:
            setattr(train_forward, _TARGETS[name], in_fp32(saved[name]))
        yield
    finally:
        for name, target in _TARGETS.items():
            setattr(train_forward, target, saved[name])


def flat_gradient(backend: Any, items: Sequence[Any], bf16: bool, packed: bool,
                  islands: Sequence[str] = ()) -> tuple[Any, dict[str, float]]:
    """The LoRA gradient of one step's loss over `items` as one fp32 vector, and the step's stats; the backend's
    precision and path are set for it (bf16 autocast or fp32; the packed step or HF's)."""
    import torch

    backend.autocast, backend.packed_training = bf16, packed
    with fp32_islands(islands):
        stats = backend.accumulate_gradients(items)
    grad = torch.cat([p.grad.detach().float().flatten() for p in backend.params])
    backend.optimizer.zero_grad(set_to_none=True)
    return grad, stats


def against(reference: Any, grad: Any) -> dict[str, float]:
    """Cosine, norm ratio and distance (relative to the reference's norm) of `grad` from `reference`."""
    import torch

    return {"cosine": float(torch.nn.functional.cosine_similarity(grad, reference, dim=0)),
            "norm_ratio": float(grad.norm() / reference.norm()),
            "distance": float((grad - reference).norm() / reference.norm())}


def groups_of(items: Sequence[Any]) -> list[list[Any]]:
    """The items by question (prompt), in order."""
    by_prompt: dict[tuple[int, ...], list[Any]] = {}
    for item in items:
        by_prompt.setdefault(tuple(item.prompt_ids), []).append(item)
    return list(by_prompt.values())


@dataclass(frozen=True)
class Parts:
    """A step cut into parts (its questions, or its completions one by one), each in bf16 against fp32."""

    cancellation: float  # sum of the parts' fp32 gradient norms over the norm of their sum
    errors: list[float]  # each part's bf16 distance from its fp32 gradient, relative to that gradient's norm
    bound: float  # sum_i e_i |g_i| / |sum_i g_i|: how far the whole step's bf16 gradient may be from fp32


def parts_in_bf16(backend: Any, parts: Sequence[Sequence[Any]], packed: bool) -> Parts:
    """Each part's gradient in fp32 and in bf16 on one path. A step's loss is normalised by its completion
    tokens, a part alone by its own, so each part's gradient is scaled back by its share of the tokens."""
    total = sum(len(it.completion_ids) for part in parts for it in part)
    fp32, errors = [], []
    for part in parts:
        share = sum(len(it.completion_ids) for it in part) / total
        g32 = flat_gradient(backend, part, bf16=False, packed=packed)[0] * share
        g16 = flat_gradient(backend, part, bf16=True, packed=packed)[0] * share
        fp32.append(g32)
        errors.append(float((g16 - g32).norm() / g32.norm()) if float(g32.norm()) > 0 else 0.0)
    whole = float(sum(fp32[1:], fp32[0]).norm())
    norms = [float(g.norm()) for g in fp32]
    return Parts(sum(norms) / whole, errors, sum(e * n for e, n in zip(errors, norms, strict=True)) / whole)
