"""The GRPO policy-gradient loss in torch: what the torch backend minimises (the MLX backend has its twin).

Token-level (every completion token weighs the same across the batch),
asymmetric clipping of the importance ratio (DAPO-style eps_low/eps_high), and
an optional k3 KL estimate to a reference policy:

    ratio  = exp(logp - old_logp)
    pg     = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    kl     = exp(ref - logp) - (ref - logp) - 1
    loss   = sum((w * pg + beta * kl) * mask) / normaliser

w is a per-token weight, 1 for this node's own tokens; external text gets
truncated importance weights in [0, 1] (`engine.swarm.defence.token_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossStats:
    loss: float
    clip_fraction: float
    kl: float
    ratio_mean: float
    tokens: int


def clipped_pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    normaliser: float,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Loss summed over masked tokens and divided by `normaliser`.

    Shapes: logp, old_logp, mask, ref_logp, weights are [batch, tokens];
    advantages is [batch]. Pass the token count of the *whole* batch as `normaliser` when
    accumulating gradients over micro-batches, so the sum equals the loss of
    the full batch.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    if weights is not None:
        per_token = per_token * weights.to(logp.dtype)
    kl_value = torch.zeros((), dtype=logp.dtype)
    if ref_logp is not None and kl_beta > 0.0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_beta * kl
        kl_value = (kl * mask).sum().detach()
    loss = (per_token * mask).sum() / normaliser
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        was_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        stats = LossStats(
            loss=float(loss.detach()),
            clip_fraction=float((was_clipped.to(mask.dtype) * mask).sum() / n),
            kl=float(kl_value / n),
            ratio_mean=float((ratio * mask).sum() / n),
            tokens=int(mask.sum()),
        )
    return loss, stats
