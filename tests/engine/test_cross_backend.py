"""Torch and MLX agree: the same weights give the same log-probs, loss and gradients.

Both backends load one tiny model folder, fp32 on the CPU (MLX through
mlx[cpu] on Linux). The tiny model here is built "sharp" (large initial
weights, a non-default rope_theta) so that its log-probs depend strongly on
every weight and position: a uniform-ish random model would agree with
almost anything.

Tolerances (fp32), each derived from the sums it covers by the helpers of
tests/engine/test_train_forward.py:
- per-token log-probs: max |torch - mlx| within `fp32_logprob_tolerance`;
- loss on a fixed batch: within `loss_tolerances` of those log-probs;
- gradient: every tensor, and all of them together, within
  `fp32_gradient_tolerance` of its norm. (This test found that HF's embedding
  layer, built with `padding_idx = pad`, never gives the pad token's input row
  a gradient; pad is EOS, `<|im_end|>`, which every prompt holds. The MLX
  backend now does the same.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx.core as mx
import torch
from mlx.utils import tree_flatten

from bench.harness.tiny import make_sharp_model
from engine.backends.base import TrainItem
from engine.backends.loss import clipped_pg_loss
from engine.backends.mlx_backend import MLXBackend
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device
from tests.engine.test_train_forward import U, fp32_gradient_tolerance, fp32_logprob_tolerance, loss_tolerances

ROPE_THETA = 50_000.0
TEMPERATURE = 0.7


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def sharp_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sharp_model(tmp_path_factory.mktemp(f"sharp-{request.param}"), request.param, ROPE_THETA)


def backends(model_dir: Path, **grpo: object) -> tuple[TorchBackend, MLXBackend]:
    cfg = GRPOConfig(precision="fp32", **grpo)  # type: ignore[arg-type]
    return (
        TorchBackend(model_dir, pick_device("cpu"), cfg, 0, TEMPERATURE),
        MLXBackend(model_dir, pick_device("mlx"), cfg, 0, TEMPERATURE),
    )


def fixed_pairs(backend: TorchBackend, rows: int = 5) -> list[tuple[list[int], list[int]]]:
    """Prompts of different lengths with random byte completions, some ending in EOS."""
    rng = random.Random(7)
    pairs = []
    for i in range(rows):
        prompt = backend.encode_prompt([{"role": "user", "content": "What is 12 + 30?" + " and more" * i}])
        comp = [rng.randrange(3, len(backend.tokenizer)) for _ in range(rng.randrange(3, 14))]
        if i % 2:
            comp.append(backend.eos_token_id)
        pairs.append((prompt, comp))
    return pairs


def logprob_tolerance(backend: TorchBackend, pairs: list[tuple[list[int], list[int]]]) -> float:
    """`fp32_logprob_tolerance` of `pairs` under `backend`'s weights (LoRA: its rank's sums on each projection)."""
    rank = backend.grpo.lora_rank if backend.grpo.finetune == "lora" else 0
    return fp32_logprob_tolerance(backend.model, max(len(p) + len(c) for p, c in pairs), TEMPERATURE, rank)


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_per_token_logprobs_agree(sharp_dir: Path) -> None:
    torch_b, mlx_b = backends(sharp_dir)
    pairs = fixed_pairs(torch_b)
    t = torch_b.behaviour_logprobs(pairs, TEMPERATURE)
    m = mlx_b.behaviour_logprobs(pairs, TEMPERATURE)
    eps = logprob_tolerance(torch_b, pairs)
    assert max_diff(t, m) <= eps
    # The model is sharp enough for the tolerance to mean something.
    assert float(np.std([x for row in t for x in row])) > max(0.5, 100 * eps)


def test_the_rope_theta_pitfall_would_be_caught(sharp_dir: Path) -> None:
    """mlx-lm reading only top-level rope_theta (docs/platform-notes.md) would break agreement by far more than the
    tolerance."""
    torch_b, mlx_b = backends(sharp_dir)
    assert mlx_b.model.args.rope_theta == ROPE_THETA
    pairs = fixed_pairs(torch_b)
    good = mlx_b.behaviour_logprobs(pairs, TEMPERATURE)
    for layer in mlx_b.model.model.layers:  # what mlx-lm does without the override
        layer.self_attn.rope.base = 10_000.0 if mlx_b.model.model_type == "llama" else 1_000_000.0
    wrong = mlx_b.behaviour_logprobs(pairs, TEMPERATURE)
    assert max_diff(good, wrong) > 100 * logprob_tolerance(torch_b, pairs)


def fixed_batch(torch_b: TorchBackend) -> list[TrainItem]:
    """Old log-probs shifted off-policy so that both clip sides are in play."""
    pairs = fixed_pairs(torch_b, rows=6)
    current = torch_b.behaviour_logprobs(pairs, TEMPERATURE)
    rng = random.Random(11)
    items = []
    for (prompt, comp), lps, adv in zip(pairs, current, [1.2, -0.8, 0.5, -1.5, 0.9, -0.3], strict=True):
        old = [lp + rng.choice([-0.5, 0.0, 0.4]) for lp in lps]
        items.append(TrainItem(prompt, comp, old, adv))
    return items


def torch_loss_and_grads(backend: TorchBackend, items: list[TrainItem], total: float) -> tuple[float, float,
                                                                                               dict[str, np.ndarray],
                                                                                               list[list[float]]]:
    g = backend.grpo
    backend.model.zero_grad(set_to_none=True)
    pairs = [(it.prompt_ids, it.completion_ids) for it in items]
    logp, mask = backend.batch_logprobs(pairs, backend.temperature)
    old = torch.zeros_like(logp)
    for row, it in enumerate(items):
        old[row, : len(it.old_logprobs)] = torch.tensor(it.old_logprobs)
    adv = torch.tensor([it.advantage for it in items])
    loss, stats = clipped_pg_loss(logp, old, adv, mask, g.eps_low, g.eps_high, total)
    loss.backward()
    grads = {name: p.grad.numpy().copy() for name, p in backend.model.named_parameters() if p.grad is not None}
    logps = [row[: len(it.completion_ids)] for row, it in zip(logp.detach().tolist(), items, strict=True)]
    return float(loss.detach()), stats.clip_fraction * stats.tokens, grads, logps


def test_loss_and_gradient_agree_on_a_fixed_batch(sharp_dir: Path) -> None:
    torch_b, mlx_b = backends(sharp_dir, finetune="full")
    items = fixed_batch(torch_b)
    total = float(sum(len(it.completion_ids) for it in items))
    t_loss, t_clipped, t_grads, t_logps = torch_loss_and_grads(torch_b, items, total)
    loss, clipped, _, grads = mlx_b.chunk_loss_and_grads(items, total)
    m_grads = {k: np.array(v) for k, v in tree_flatten(grads)}
    if "lm_head.weight" in t_grads and "lm_head.weight" not in m_grads:  # tied: one tensor, one gradient
        t_grads["model.embed_tokens.weight"] = t_grads.pop("lm_head.weight")
    pairs = [(it.prompt_ids, it.completion_ids) for it in items]
    loss_tolerance = loss_tolerances(items, t_logps, torch_b.grpo, logprob_tolerance(torch_b, pairs))[0]
    tolerance = fp32_gradient_tolerance(torch_b.model, pairs)

    assert loss.item() == pytest.approx(t_loss, rel=0, abs=loss_tolerance)
    assert abs(t_loss) > 10 * loss_tolerance  # far from 0: the comparison means something
    # clipping is exercised, on the same tokens: the same count (torch's comes back as a float32 fraction)
    assert clipped.item() > 0 and clipped.item() == pytest.approx(t_clipped, rel=0, abs=0.5)
    assert set(m_grads) == set(t_grads)
    flat_t = np.concatenate([t_grads[k].ravel() for k in sorted(t_grads)])
    flat_m = np.concatenate([m_grads[k].ravel() for k in sorted(t_grads)])
    assert np.linalg.norm(flat_m - flat_t) <= tolerance * np.linalg.norm(flat_t)
    for name, tg in t_grads.items():
        assert np.linalg.norm(m_grads[name] - tg) <= tolerance * np.linalg.norm(tg), name


@dataclass
class Step:
    """One optimiser step of a backend's `train`: the weights it started from, its stats, the gradient norm it
    measured and the gradients it applied (after clipping), under torch's parameter names."""

    weights: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    grad_norm: float = 0.0
    applied: dict[str, np.ndarray] = field(default_factory=dict)


def record_steps(backend: TorchBackend | MLXBackend) -> list[Step]:
    """The `Step`s `backend.train` takes from now on."""
    steps: list[Step] = []
    accumulate, apply = backend._accumulate_step, backend._apply_step

    def weights() -> dict[str, np.ndarray]:
        if isinstance(backend, TorchBackend):
            return {n: p.detach().numpy().copy() for n, p in backend.model.named_parameters()}
        return {k: np.array(v) for k, v in tree_flatten(backend.model.trainable_parameters())}

    def accumulating(chunks: list[list[TrainItem]], total: float, step: int, on_step: Any) -> Any:
        steps.append(Step(weights()))
        result = accumulate(chunks, total, step, on_step)
        steps[-1].stats = dict(result[1])
        return result

    def applying(grads: Any) -> float | None:
        norm = apply(grads)
        steps[-1].grad_norm = float(norm or 0.0)
        return norm

    backend._accumulate_step = accumulating  # type: ignore[method-assign]
    backend._apply_step = applying  # type: ignore[method-assign]
    if isinstance(backend, TorchBackend):
        step, model = backend.optimizer.step, backend.model

        def stepping(*args: Any, **kwargs: Any) -> Any:
            steps[-1].applied = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
            return step(*args, **kwargs)

        backend.optimizer.step = stepping  # type: ignore[method-assign]
    else:
        update = backend.optimizer.update

        def updating(model: Any, grads: Any) -> Any:
            steps[-1].applied = {k: np.array(v) for k, v in tree_flatten(grads)}
            return update(model, grads)

        backend.optimizer.update = updating  # type: ignore[method-assign]
    return steps


def test_one_training_step_reports_the_same_stats(sharp_dir: Path) -> None:
    """Two AdamW steps, the second against the untouched KL reference, on each backend, step by step.

    Step 1 starts from the same weights: its loss and KL (0: the policy is the reference) within
    `loss_tolerances`, the same clipped tokens, the gradients and their norm within `fp32_gradient_tolerance`.
    AdamW's first step moves a weight by lr * g / (|g| + eps), so the weights step 2 starts from differ by up to
    lr * min(2, |g_torch - g_mlx| / eps) plus the update's own rounding (as in tests/engine/test_train_forward.py)
    and the rounding of Adam's constants, which each implementation computes its own way. Step 2 starts from
    those: MLX's stats are compared, within the same rounding, with torch's from MLX's weights; torch's own
    differ from those by what that difference in the weights moves them, which no rounding bound covers."""
    torch_b, mlx_b = backends(sharp_dir, finetune="full", micro_batch=4, kl_beta=0.1, pg_steps=2)
    items = fixed_batch(torch_b)
    pairs = [(it.prompt_ids, it.completion_ids) for it in items]
    eps_logp, tolerance = logprob_tolerance(torch_b, pairs), fp32_gradient_tolerance(torch_b.model, pairs)
    tokens = sum(len(it.completion_ids) for it in items)
    reference = torch_b.behaviour_logprobs(pairs, TEMPERATURE)  # step 1's policy is the reference
    t_steps, m_steps = record_steps(torch_b), record_steps(mlx_b)
    t = torch_b.train(items)
    m = mlx_b.train(items)
    assert len(t_steps) == len(m_steps) == 2 and m["train_tokens"] == t["train_tokens"]
    for reported, steps in ((t, t_steps), (m, m_steps)):  # what train() reports: the mean of the two steps
        for key in ("loss", "clip_fraction", "kl"):
            assert reported[key] == steps[0].stats[key] / 2 + steps[1].stats[key] / 2, key
        assert reported["grad_norm"] == steps[0].grad_norm / 2 + steps[1].grad_norm / 2

    def same_step(a: Step, b: Step, logps: list[list[float]]) -> float:
        """Asserts the two steps' stats agree; returns the KL's tolerance."""
        loss, kl = loss_tolerances(items, logps, torch_b.grpo, eps_logp, reference)
        assert a.stats["loss"] == pytest.approx(b.stats["loss"], rel=0, abs=loss)
        assert a.stats["kl"] == pytest.approx(b.stats["kl"], rel=0, abs=kl)
        assert a.stats["clip_fraction"] == pytest.approx(b.stats["clip_fraction"], rel=0, abs=0.5 / tokens)  # a count
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=tolerance)
        return kl

    first_t, first_m = t_steps[0], m_steps[0]
    assert all(np.array_equal(first_m.weights[name], w) for name, w in first_t.weights.items())  # one file, read
    kl = same_step(first_m, first_t, reference)
    assert abs(first_t.stats["kl"]) <= kl and abs(first_m.stats["kl"]) <= kl  # at the reference

    applied_t, applied_m = first_t.applied, first_m.applied
    if "lm_head.weight" in applied_t and "lm_head.weight" not in applied_m:  # tied: one tensor, one gradient
        applied_t["model.embed_tokens.weight"] = applied_t.pop("lm_head.weight")
    assert set(applied_t) == set(applied_m)
    lr, adam_eps = torch_b.grpo.learning_rate, torch_b.optimizer.defaults["eps"]
    b1, b2 = torch_b.optimizer.defaults["betas"]
    assert (b1, b2) == tuple(mlx_b.optimizer.betas) and adam_eps == mlx_b.optimizer.eps
    rounding = 2 * 2 * U  # the update's own rounding, of the weight and of the step, in each backend
    # Each implementation rounds Adam's constants its own way: 1 - b and 1 - b**t in float32 lose b / (1 - b) units
    # of roundoff (MLX's bias correction 1 - 0.999 is 1.3e-5 off), m-hat's two of b1 and v-hat's two of b2 (half
    # that through the square root): up to (2 b1 / (1 - b1) + b2 / (1 - b2)) units of the step, lr, in each.
    constants = 2 * (2 * b1 / (1 - b1) + b2 / (1 - b2)) * U * lr
    second_t, second_m = t_steps[1].weights, m_steps[1].weights
    for name, g_t in applied_t.items():
        g_m, w_t, w_m = applied_m[name], second_t[name], second_m[name]
        assert np.linalg.norm(g_m - g_t) <= tolerance * np.linalg.norm(g_t), name
        moved = np.minimum(np.abs(g_m - g_t) / adam_eps, 2.0) * lr
        assert (np.abs(w_m - w_t) <= moved + constants + rounding * (np.abs(w_t) + lr)).all(), name
    assert max(float(np.abs(second_t[name] - w).max()) for name, w in first_t.weights.items()) > 0.5 * lr  # moved

    # Torch's second step from MLX's weights: the same reference (the folder's), the same items.
    again = TorchBackend(sharp_dir, pick_device("cpu"), torch_b.grpo, 0, TEMPERATURE)
    with torch.no_grad():
        for name, param in again.model.named_parameters():
            param.copy_(torch.from_numpy(second_m[name]))
    stats = again.accumulate_gradients(items)
    norm = float(torch.cat([p.grad.flatten() for p in again.params]).norm())
    kl = same_step(m_steps[1], Step(stats=stats, grad_norm=norm), again.behaviour_logprobs(pairs, TEMPERATURE))
    assert m_steps[1].stats["kl"] > 10 * kl  # the second step moved off the reference, far beyond the rounding


def test_checkpoint_weights_cross_between_backends(sharp_dir: Path, tmp_path: Path) -> None:
    """A run may move between machines: each backend reads the other's adapter file."""
    torch_b, mlx_b = backends(sharp_dir, learning_rate=0.05)
    items = fixed_batch(torch_b)
    pairs = fixed_pairs(torch_b)
    before = mlx_b.behaviour_logprobs(pairs, TEMPERATURE)
    torch_b.train(items)
    torch_b.save(tmp_path)  # adapter.safetensors, optimizer.pt, rng.pt
    mlx_b.load(tmp_path)  # keeps the weights, restarts AdamW moments
    eps = logprob_tolerance(torch_b, pairs)
    assert max_diff(before, mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) > 100 * eps  # the adapters matter
    assert max_diff(torch_b.behaviour_logprobs(pairs, TEMPERATURE),
                    mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) <= eps

    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    mlx_b.train(items)
    out = tmp_path / "mlx"
    out.mkdir()
    mlx_b.save(out)
    set_peft_model_state_dict(torch_b.model, load_file(str(out / "adapter.safetensors")))
    assert max_diff(torch_b.behaviour_logprobs(pairs, TEMPERATURE),
                    mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) <= eps


def test_full_weights_saved_by_torch_load_in_mlx(sharp_dir: Path, tmp_path: Path) -> None:
    torch_b, mlx_b = backends(sharp_dir, finetune="full")
    torch_b.train(fixed_batch(torch_b))
    torch_b.save(tmp_path)  # a tied embedding is stored as lm_head.weight
    mlx_b.load(tmp_path)
    pairs = fixed_pairs(torch_b)
    assert max_diff(torch_b.behaviour_logprobs(pairs, TEMPERATURE),
                    mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) <= logprob_tolerance(torch_b, pairs)
    assert mx.array_equal(mlx_b.model.model.embed_tokens.weight,
                          mx.array(torch_b.model.get_input_embeddings().weight.detach().numpy()))
