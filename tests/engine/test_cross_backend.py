"""Torch and MLX agree: the same weights give the same log-probs, loss and gradients.

Both backends load one tiny model folder, fp32 on the CPU (MLX through
mlx[cpu] on Linux). The tiny model here is built "sharp" (large initial
weights, a non-default rope_theta) so that its log-probs depend strongly on
every weight and position: a uniform-ish random model would agree with
almost anything.

Tolerances (fp32; measured differences are about 10x smaller):
- per-token log-probs: max |torch - mlx| <= 1e-4 nats (LOGP_ATOL);
- loss on a fixed batch: relative 1e-4 (LOSS_RTOL);
- gradient: cosine >= 0.9999 over all weights and >= 0.999 per tensor,
  norms within 1e-3 relative. (This test found that HF's embedding layer,
  built with `padding_idx = pad`, never gives the pad token's input row a
  gradient; pad is EOS, `<|im_end|>`, which every prompt holds. The MLX
  backend now does the same.)
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx.core as mx
import torch
from mlx.utils import tree_flatten

from bench.harness.tiny import make_sharp_model
from engine.backends.mlx_backend import MLXBackend
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device
from engine.grpo import clipped_pg_loss
from engine.rollouts import TrainItem

LOGP_ATOL = 1e-4
LOSS_RTOL = 1e-4
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


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_per_token_logprobs_agree(sharp_dir: Path) -> None:
    torch_b, mlx_b = backends(sharp_dir)
    pairs = fixed_pairs(torch_b)
    t = torch_b.behaviour_logprobs(pairs, TEMPERATURE)
    m = mlx_b.behaviour_logprobs(pairs, TEMPERATURE)
    assert max_diff(t, m) <= LOGP_ATOL
    # The model is sharp enough for the tolerance to mean something.
    assert float(np.std([x for row in t for x in row])) > 0.5


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
    assert max_diff(good, wrong) > 100 * LOGP_ATOL


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
                                                                                               dict[str, np.ndarray]]:
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
    return float(loss.detach()), stats.clip_fraction * stats.tokens, grads


def test_loss_and_gradient_agree_on_a_fixed_batch(sharp_dir: Path) -> None:
    torch_b, mlx_b = backends(sharp_dir, finetune="full")
    items = fixed_batch(torch_b)
    total = float(sum(len(it.completion_ids) for it in items))
    t_loss, t_clipped, t_grads = torch_loss_and_grads(torch_b, items, total)
    loss, clipped, _, grads = mlx_b.chunk_loss_and_grads(items, total)
    m_grads = {k: np.array(v) for k, v in tree_flatten(grads)}
    if "lm_head.weight" in t_grads and "lm_head.weight" not in m_grads:  # tied: one tensor, one gradient
        t_grads["model.embed_tokens.weight"] = t_grads.pop("lm_head.weight")

    assert loss.item() == pytest.approx(t_loss, rel=LOSS_RTOL)
    # clipping is exercised, on the same tokens
    assert clipped.item() > 0 and clipped.item() == pytest.approx(t_clipped)
    assert set(m_grads) == set(t_grads)
    flat_t = np.concatenate([t_grads[k].ravel() for k in sorted(t_grads)])
    flat_m = np.concatenate([m_grads[k].ravel() for k in sorted(t_grads)])
    assert np.dot(flat_t, flat_m) / (np.linalg.norm(flat_t) * np.linalg.norm(flat_m)) >= 0.9999
    assert np.linalg.norm(flat_m) == pytest.approx(np.linalg.norm(flat_t), rel=1e-3)
    for name, tg in t_grads.items():
        mg = m_grads[name]
        cos = np.dot(tg.ravel(), mg.ravel()) / (np.linalg.norm(tg) * np.linalg.norm(mg) + 1e-30)
        assert cos >= 0.999, name


def test_one_training_step_reports_the_same_stats(sharp_dir: Path) -> None:
    torch_b, mlx_b = backends(sharp_dir, finetune="full", micro_batch=4, kl_beta=0.1, pg_steps=2)
    items = fixed_batch(torch_b)
    t = torch_b.train(items)
    m = mlx_b.train(items)
    assert m["loss"] == pytest.approx(t["loss"], rel=1e-3)
    assert m["grad_norm"] == pytest.approx(t["grad_norm"], rel=1e-3)
    assert m["clip_fraction"] == pytest.approx(t["clip_fraction"], abs=1e-6)
    assert m["kl"] == pytest.approx(t["kl"], rel=1e-2, abs=1e-7) and m["kl"] > 0  # second step moved off the reference
    assert m["train_tokens"] == t["train_tokens"]


def test_checkpoint_weights_cross_between_backends(sharp_dir: Path, tmp_path: Path) -> None:
    """A run may move between machines: each backend reads the other's adapter file."""
    torch_b, mlx_b = backends(sharp_dir, learning_rate=0.05)
    items = fixed_batch(torch_b)
    pairs = fixed_pairs(torch_b)
    before = mlx_b.behaviour_logprobs(pairs, TEMPERATURE)
    torch_b.train(items)
    torch_b.save(tmp_path)  # adapter.safetensors, optimizer.pt, rng.pt
    mlx_b.load(tmp_path)  # keeps the weights, restarts AdamW moments
    assert max_diff(before, mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) > 100 * LOGP_ATOL  # the adapters matter
    assert max_diff(torch_b.behaviour_logprobs(pairs, TEMPERATURE),
                    mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) <= LOGP_ATOL

    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    mlx_b.train(items)
    out = tmp_path / "mlx"
    out.mkdir()
    mlx_b.save(out)
    set_peft_model_state_dict(torch_b.model, load_file(str(out / "adapter.safetensors")))
    assert max_diff(torch_b.behaviour_logprobs(pairs, TEMPERATURE),
                    mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) <= LOGP_ATOL


def test_full_weights_saved_by_torch_load_in_mlx(sharp_dir: Path, tmp_path: Path) -> None:
    torch_b, mlx_b = backends(sharp_dir, finetune="full")
    torch_b.train(fixed_batch(torch_b))
    torch_b.save(tmp_path)  # a tied embedding is stored as lm_head.weight
    mlx_b.load(tmp_path)
    pairs = fixed_pairs(torch_b)
    assert max_diff(torch_b.behaviour_logprobs(pairs, TEMPERATURE),
                    mlx_b.behaviour_logprobs(pairs, TEMPERATURE)) <= LOGP_ATOL
    assert mx.array_equal(mlx_b.model.model.embed_tokens.weight,
                          mx.array(torch_b.model.get_input_embeddings().weight.detach().numpy()))
