"""The MLX backend on a tiny model (mlx[cpu] on Linux): rounds, resume, export, OOM halving.

The round loop drives it exactly as it drives the torch backend
(tests/engine/test_sapo.py); only `run.device='mlx'` differs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.backends import load_backend
from engine.backends.base import TrainItem
from engine.backends.mlx_backend import MLXBackend, mlx_config_overrides
from engine.common.config import GRPOConfig, NodeConfig
from engine.common.config_file import build_config
from engine.common.device import pick_device
from engine.common.errors import CheckpointError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.node.loop import Node
from tests.engine.test_train_forward import U, fp32_gradient_tolerance, fp32_logprob_tolerance, loss_tolerances

FAST = [
    "tasks.questions_per_round=2",
    "tasks.completions_per_question=3",
    "tasks.max_new_tokens=12",
    "tasks.eval_every=0",
    "tasks.eval_questions=3",
    "grpo.micro_batch=4",
    "run.device='mlx'",
    "run.seed=0",  # the rounds these tests expect; the default seed is each install's own
]
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def parity_reward(question: Any, completion: str) -> float:
    """A deterministic reward a random model can earn, so groups carry a gradient."""
    return float(len(completion) % 2)


def fast_config(model_dir: Path, *extra: str) -> NodeConfig:
    return build_config("default", None, [*FAST, f"model.source='{model_dir}'", *extra])


def make_node(model_dir: Path, home: Path, *extra: str, events: list[Event] | None = None) -> Node:
    sink = events if events is not None else []
    node = Node(fast_config(model_dir, *extra), Paths.under(home), sink.append)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    return node


def backend_of(node: Node) -> MLXBackend:
    assert isinstance(node.backend, MLXBackend)
    return node.backend


def trainable(node: Node) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in backend_of(node)._trainable_state().items()}


def make_backend(model_dir: Path, temperature: float = 1.0, **grpo: Any) -> MLXBackend:
    return MLXBackend(model_dir, pick_device("mlx"), GRPOConfig(**grpo), 0, temperature)


def hf_model(model_dir: Path) -> Any:
    """The folder's model in transformers, fp32: what the tolerances of `tests/engine/test_train_forward.py` read
    their sizes and weights from."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def test_other_architectures_score_through_the_full_model(tiny_model_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The LM head runs on completion positions only for known layouts; the generic path agrees."""
    from engine.backends import mlx_backend

    backend = make_backend(tiny_model_dir)
    prompt = backend.encode_prompt(MESSAGES)
    pairs = [(prompt, backend.encode_completion("four")), (prompt[:-3], backend.encode_completion("4, of course"))]
    fast = backend.behaviour_logprobs(pairs, 0.7)
    monkeypatch.setattr(mlx_backend, "HEAD_ON_COMPLETIONS_ONLY", frozenset())
    assert backend._head() is None
    generic = backend.behaviour_logprobs(pairs, 0.7)
    # The LM head on fewer rows sums in other orders: within `fp32_logprob_tolerance` (the adapters start at 0).
    eps = fp32_logprob_tolerance(hf_model(tiny_model_dir), max(len(p) + len(c) for p, c in pairs), 0.7)
    for a, b in zip(fast, generic, strict=True):
        assert a == pytest.approx(b, rel=0, abs=eps)


def test_sampling_is_reproducible_from_the_round_seed(tiny_model_dir: Path) -> None:
    backend = make_backend(tiny_model_dir)
    prompt = backend.encode_prompt(MESSAGES)
    backend.reseed(42)
    first = [c.token_ids for c in backend.generate([prompt], 4, 10, 1.0)]
    backend.reseed(42)
    again = [c.token_ids for c in backend.generate([prompt], 4, 10, 1.0)]
    backend.reseed(43)
    other = [c.token_ids for c in backend.generate([prompt], 4, 10, 1.0)]
    assert first == again != other


def test_load_backend_picks_mlx_for_an_mlx_device(tiny_model_dir: Path) -> None:
    backend = load_backend(tiny_model_dir, pick_device("mlx"), GRPOConfig(), 0, 1.0)
    assert isinstance(backend, MLXBackend)


def test_rope_theta_comes_from_rope_parameters(tiny_qwen_dir: Path) -> None:
    """transformers v5 nests rope_theta; mlx-lm alone would use qwen2's default of 1e6 (docs/platform-notes.md)."""
    config = json.loads((tiny_qwen_dir / "config.json").read_text())
    theta = config["rope_parameters"]["rope_theta"]
    assert "rope_theta" not in config and theta != 1_000_000
    backend = make_backend(tiny_qwen_dir)
    assert backend.model.args.rope_theta == theta
    assert mlx_config_overrides({"rope_parameters": {"rope_theta": 5.0, "rope_type": "default"}}) == {"rope_theta": 5.0}
    assert mlx_config_overrides({"rope_theta": 7.0, "rope_parameters": {"rope_theta": 7.0}}) == {}
    scaled = mlx_config_overrides({"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}})
    assert scaled == {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}


def test_a_round_through_the_node_changes_the_weights(tiny_model_dir: Path, home: Path) -> None:
    events: list[Event] = []
    node = make_node(tiny_model_dir, home, events=events)
    before = trainable(node)
    metrics = node.run_round()
    after = trainable(node)
    assert metrics["round"] == 1 and metrics["informative_groups"] > 0 and metrics["oom_retries"] == 0
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    status = [e for e in events if e["type"] == "status"]
    assert status[0]["device"]["kind"] == "mlx" and "MLX 0." in status[0]["device"]["reason"]
    phases = {e["phase"] for e in events if e["type"] == "progress"}
    assert {"generating", "scoring", "training"} <= phases
    assert (node.checkpoint_root / "round-000001" / "adapter.safetensors").is_file()


def test_full_finetuning_with_kl_changes_base_weights(tiny_model_dir: Path, home: Path) -> None:
    node = make_node(tiny_model_dir, home, "grpo.finetune='full'", "grpo.kl_beta=0.05", "grpo.pg_steps=2")
    backend = backend_of(node)
    before = np.array(backend.model.model.embed_tokens.weight)
    metrics = node.run_round()
    assert not np.array_equal(before, np.array(backend.model.model.embed_tokens.weight))
    assert metrics["kl"] > 0.0  # the second step is measured against the untouched reference


def test_bf16_lora_keeps_fp32_adapters(tiny_model_dir: Path, home: Path) -> None:
    node = make_node(tiny_model_dir, home, "grpo.precision='bf16'")
    backend = backend_of(node)
    assert backend.model.model.embed_tokens.weight.dtype == mx.bfloat16
    adapters = backend._lora_modules()
    assert adapters and all(m.lora_a.dtype == mx.float32 for _, m in adapters)
    metrics = node.run_round()
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0


def test_checkpoint_of_another_shape_is_rejected(tiny_model_dir: Path, tmp_path: Path) -> None:
    make_backend(tiny_model_dir, lora_rank=8).save(tmp_path)
    with pytest.raises(CheckpointError, match="another rank"):
        make_backend(tiny_model_dir).load(tmp_path)
    full = tmp_path / "full"
    full.mkdir()
    trained = make_backend(tiny_model_dir, finetune="full")
    prompt = trained.encode_prompt(MESSAGES)
    trained.train([TrainItem(prompt, [5, 6], [-1.0, -1.0], 1.0)])
    trained.save(full)
    (full / "adapter.safetensors").write_bytes((tmp_path / "adapter.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="different model"):  # right adapters, full-model AdamW moments
        make_backend(tiny_model_dir, lora_rank=8).load(full)


def test_export_is_a_merged_model_that_transformers_and_mlx_load(tiny_model_dir: Path, home: Path,
                                                                 tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    node = make_node(tiny_model_dir, home, "grpo.learning_rate=0.05")
    node.run_round()
    backend = backend_of(node)
    prompt = backend.encode_prompt(MESSAGES)
    completion = backend.encode_completion("4, of course")
    expected = backend.behaviour_logprobs([(prompt, completion)], 1.0)[0]
    base = make_backend(tiny_model_dir).behaviour_logprobs([(prompt, completion)], 1.0)[0]

    out = tmp_path / "export"
    backend.export(out)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert (out / "model.safetensors").is_file() and (out / "chat_template.jinja").is_file()

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    # The merged weights (W + s * B @ A) round over the rank and in the addition on each projection, beside the
    # adapters' own sums: `fp32_logprob_tolerance` with 2 r + 1 sums a projection.
    eps = fp32_logprob_tolerance(model, len(prompt) + len(completion), 1.0, 2 * backend.grpo.lora_rank + 1)
    assert max(abs(a - b) for a, b in zip(expected, base, strict=True)) > max(1e-3, 10 * eps)  # training moved them
    again = make_backend(out, finetune="full").behaviour_logprobs([(prompt, completion)], 1.0)[0]
    assert again == pytest.approx(expected, rel=0, abs=eps)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    hf = logp.gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()
    assert hf == pytest.approx(expected, rel=0, abs=eps)


def test_out_of_memory_halves_the_micro_batch_and_retries(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Metal allocation failure on a big chunk: same step, same result, smaller chunks.

    Smaller chunks sum the gradients in another grouping: the loss agrees within `loss_tolerances`, the gradients
    the step applied within `fp32_gradient_tolerance` of their norm, and each weight within what that difference
    can move it through AdamW's first step, lr * g / (|g| + eps): lr * min(2, |g_a - g_b| / eps), plus the
    update's own rounding (as in test_a_whole_training_step_reaches_the_same_weights_on_both_paths)."""
    reference = make_backend(tiny_model_dir, micro_batch=8)
    backend = make_backend(tiny_model_dir, micro_batch=8)
    prompt = backend.encode_prompt(MESSAGES)
    items = [TrainItem(prompt, backend.encode_completion("x" * (i + 1)), [-5.0] * (i + 2), (-1) ** i * 0.5)
             for i in range(6)]
    pairs = [(item.prompt_ids, item.completion_ids) for item in items]
    model = hf_model(tiny_model_dir)
    rank = backend.grpo.lora_rank
    eps_logp = fp32_logprob_tolerance(model, max(len(p) + len(c) for p, c in pairs), backend.temperature, rank)
    loss = loss_tolerances(items, reference.behaviour_logprobs(pairs, reference.temperature), reference.grpo,
                           eps_logp)[0]
    tolerance = fp32_gradient_tolerance(model, pairs, rank)
    applied: dict[str, dict[str, np.ndarray]] = {}
    for name, trainer in (("reference", reference), ("halved", backend)):
        update = trainer.optimizer.update

        def recording(target: Any, grads: Any, _update: Any = update, _name: str = name) -> Any:
            applied[_name] = {key: np.array(value) for key, value in tree_flatten(grads)}  # after clipping
            return _update(target, grads)

        trainer.optimizer.update = recording  # type: ignore[method-assign]
    before = {key: np.array(value) for key, value in tree_flatten(reference.model.trainable_parameters())}
    real = backend.chunk_loss_and_grads

    def fragile(chunk: Any, normaliser: float) -> Any:
        if len(chunk) > 2:
            raise RuntimeError("[metal::malloc] Attempting to allocate 1073741824 bytes which is greater than "
                               "the maximum")
        return real(chunk, normaliser)

    monkeypatch.setattr(backend, "chunk_loss_and_grads", fragile)
    with caplog.at_level(logging.WARNING):
        stats = backend.train(items)
    want = reference.train(items)
    assert stats["oom_retries"] == 2 and backend.budget.limits(backend.grpo)[0] == 2
    assert "micro-batch halved to 4 sequences" in caplog.text and "halved to 2 sequences" in caplog.text
    assert stats["loss"] == pytest.approx(want["loss"], rel=0, abs=loss)
    assert abs(want["loss"]) > 100 * loss  # far from 0: the comparison means something
    lr, adam_eps = backend.grpo.learning_rate, backend.optimizer.eps
    rounding = 2 * 2 * U  # the update's own rounding, of the weight and of the step, in each backend
    trained = [{key: np.array(value) for key, value in tree_flatten(b.model.trainable_parameters())}
               for b in (reference, backend)]
    assert applied["reference"].keys() == applied["halved"].keys() == before.keys() == trained[0].keys()
    for key, g_ref in applied["reference"].items():
        g_half, w_ref, w_half = applied["halved"][key], trained[0][key], trained[1][key]
        assert np.linalg.norm(g_half - g_ref) <= tolerance * np.linalg.norm(g_ref), key
        moved = np.minimum(np.abs(g_half - g_ref) / adam_eps, 2.0) * lr
        assert (np.abs(w_half - w_ref) <= moved + rounding * (np.abs(w_ref) + lr)).all(), key
    assert max(float(np.abs(trained[0][key] - before[key]).max()) for key in before) > 0.5 * lr  # the step moved


def test_other_runtime_errors_are_not_mistaken_for_out_of_memory(tiny_model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    backend = make_backend(tiny_model_dir)
    prompt = backend.encode_prompt(MESSAGES)

    def broken(chunk: Any, normaliser: float) -> Any:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(backend, "chunk_loss_and_grads", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        backend.train([TrainItem(prompt, [5, 6], [-1.0, -1.0], 1.0)])
    assert backend.budget.halvings == 0
