"""The GRPO policy-gradient loss in MLX: the twin of engine/backends/loss.py, what the MLX backend minimises.

The same token-level clipped objective as the torch backend's, written again
in MLX: asymmetric clipping of the importance ratio (eps_low/eps_high), an
optional k3 KL estimate to a reference policy, per-token weights, summed over
the mask and divided by the step's normaliser. tests/engine/test_cross_backend.py
holds the two to each other.

This is its own room for the reason engine/backends/loss.py is: the objective is one formula, read and
checked apart from how the backend lays out a micro-batch and takes its gradients (engine/backends/mlx_backend.py).
"""

from __future__ import annotations

import mlx.core as mx


def clipped_pg_loss(
    logp: mx.array,
    old_logp: mx.array,
    advantages: mx.array,
    mask: mx.array,
    eps_low: float,
    eps_high: float,
    normaliser: float,
    ref_logp: mx.array | None = None,
    kl_beta: float = 0.0,
    weights: mx.array | None = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """`engine.backends.loss.clipped_pg_loss` in MLX: (loss, clipped token count, summed k3 KL).

    Shapes: logp, old_logp, mask, ref_logp, weights [batch, tokens]; advantages [batch].
    """
    adv = advantages[:, None]
    ratio = mx.exp(logp - old_logp)
    clipped = mx.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = -mx.minimum(ratio * adv, clipped * adv)
    if weights is not None:
        per_token = per_token * weights
    kl_sum = mx.array(0.0)
    if ref_logp is not None and kl_beta > 0.0:
        delta = ref_logp - logp
        kl = mx.exp(delta) - delta - 1.0
        per_token = per_token + kl_beta * kl
        kl_sum = mx.stop_gradient((kl * mask).sum())
    loss = (per_token * mask).sum() / normaliser
    was_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    clipped_count = mx.stop_gradient((was_clipped.astype(mx.float32) * mask).sum())
    return loss, clipped_count, kl_sum
