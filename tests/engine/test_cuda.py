"""The torch backend on a CUDA GPU against the same backend on the CPU. Skipped where torch sees no GPU
(this project's CI has none; docs/backends.md says where these ran).

The same tiny "sharp" model (large weights, so that log-probs depend strongly on every weight) is loaded on
both devices, fp32 with TF32 switched off (the backend switches TF32 on for CUDA; tolerances under TF32 are
checked separately, looser). What must agree: per-token log-probs, the loss and every LoRA gradient of the
packed training step, a whole step's weights, greedy answers, a checkpoint read back on the other device, and
a whole experiment round (generation, scoring, sharing through a loopback relay, training) on the GPU.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.harness.tiny import make_sharp_model
from engine.backends.base import TrainItem
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")

TEMPERATURE = 0.7
LOGP_ATOL = 1e-4  # fp32 on both devices: the sums run in different orders, measured about 10x under this
GRAD_RTOL = 1e-4  # each LoRA gradient's difference, relative to its norm
TF32_GRAD_RTOL = 2e-2  # TF32 keeps 10 bits of mantissa in each matmul


@pytest.fixture(scope="module")
def sharp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sharp_model(tmp_path_factory.mktemp("sharp-cuda"), "llama", 50_000.0)


@pytest.fixture
def strict_fp32() -> Iterator[None]:
    """fp32 matmuls as fp32 (the backend asks for TF32 on CUDA), restored after the test."""
    yield
    torch.set_float32_matmul_precision("highest")


def backend_on(device: str, model_dir: Path, strict: bool = True, **grpo: Any) -> TorchBackend:
    backend = TorchBackend(model_dir, pick_device(device), GRPOConfig(**{"precision": "fp32", **grpo}), 0,
                           TEMPERATURE)
    if strict:
        torch.set_float32_matmul_precision("highest")
    generator = torch.Generator().manual_seed(3)  # live adapters: with peft's B = 0 every A gradient is 0
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if ".lora_B." in name:
                param.copy_((torch.randn(param.shape, generator=generator) * 0.2).to(param.device))
    return backend


def pairs_for(backend: TorchBackend, rows: int = 6) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(7)
    pairs = []
    for i in range(rows):
        prompt = backend.encode_prompt([{"role": "user", "content": "What is 12 + 30?" + " and more" * i}])
        completion = [rng.randrange(3, len(backend.tokenizer)) for _ in range(rng.randrange(2, 14))]
        pairs.append((prompt, completion))
    return pairs


def items_for(backend: TorchBackend) -> list[TrainItem]:
    rng = random.Random(5)
    return [TrainItem(prompt, completion, [rng.gauss(-4.0, 0.3) for _ in completion], (-1.0) ** i * (0.5 + 0.1 * i))
            for i, (prompt, completion) in enumerate(pairs_for(backend, 8))]


def gradients(backend: TorchBackend, items: list[TrainItem]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    stats = backend.accumulate_gradients(items)
    grads = {name: p.grad.detach().float().cpu() for name, p in backend.model.named_parameters()
             if p.grad is not None}
    backend.optimizer.zero_grad(set_to_none=True)
    return stats, grads


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_the_gpu_is_picked_and_trains_in_bf16_where_it_can() -> None:
    info = pick_device("auto")
    assert info.kind == "cuda" and info.memory_bytes > 0
    capability = torch.cuda.get_device_capability(0)
    assert info.bf16 == (capability >= (8, 0))


def test_per_token_logprobs_match_the_cpu(sharp_dir: Path, strict_fp32: None) -> None:
    cpu, gpu = backend_on("cpu", sharp_dir), backend_on("cuda", sharp_dir)
    assert next(gpu.model.parameters()).device.type == "cuda"
    pairs = pairs_for(cpu)
    assert max_diff(cpu.behaviour_logprobs(pairs, TEMPERATURE), gpu.behaviour_logprobs(pairs, TEMPERATURE)) <= LOGP_ATOL


def test_the_packed_training_step_gives_the_cpus_loss_and_lora_gradients(sharp_dir: Path, strict_fp32: None) -> None:
    cpu, gpu = backend_on("cpu", sharp_dir), backend_on("cuda", sharp_dir)
    assert gpu.packs_training()
    items = items_for(cpu)
    (cpu_stats, cpu_grads), (gpu_stats, gpu_grads) = gradients(cpu, items), gradients(gpu, items)
    assert gpu_stats["loss"] == pytest.approx(cpu_stats["loss"], rel=1e-4, abs=1e-7)
    assert set(gpu_grads) == set(cpu_grads) and len(cpu_grads) == len(cpu.params)
    for name, grad in cpu_grads.items():
        assert float(grad.norm()) > 0, name
        assert float((gpu_grads[name] - grad).norm()) <= GRAD_RTOL * float(grad.norm()), name
    # The packed step on the GPU against HF's forward on the GPU: the path it replaced.
    gpu.packed_training = False
    _, hf_grads = gradients(gpu, items)
    for name, grad in hf_grads.items():
        assert float((gpu_grads[name] - grad).norm()) <= GRAD_RTOL * float(grad.norm()), name


def test_under_tf32_and_bf16_the_gradients_stay_close_to_fp32(sharp_dir: Path, strict_fp32: None) -> None:
    truth_backend = backend_on("cuda", sharp_dir)
    items = items_for(truth_backend)
    _, truth = gradients(truth_backend, items)

    def off(grads: dict[str, torch.Tensor]) -> float:
        return float(torch.cat([(grads[n] - truth[n]).flatten() for n in truth]).norm()
                     / torch.cat([t.flatten() for t in truth.values()]).norm())

    tf32 = backend_on("cuda", sharp_dir, strict=False)
    assert torch.get_float32_matmul_precision() == "high"
    assert off(gradients(tf32, items)[1]) <= TF32_GRAD_RTOL
    if pick_device("cuda").bf16:  # bf16 keeps 8 bits: on this sharp model the CPU's bf16 step is far off too
        bf16 = backend_on("cuda", sharp_dir, strict=False, precision="bf16")
        cpu_bf16 = backend_on("cpu", sharp_dir, precision="bf16")
        assert bf16.autocast and cpu_bf16.autocast
        assert off(gradients(bf16, items)[1]) <= 1.5 * off(gradients(cpu_bf16, items)[1])


def test_a_whole_step_moves_the_weights_as_on_the_cpu(sharp_dir: Path, strict_fp32: None) -> None:
    """AdamW divides each gradient by its own size: where a gradient is near 0, a difference in the last bits
    flips its step's sign. So the comparison is of the whole update: same direction, same size."""
    updates = []
    for device in ("cpu", "cuda"):
        backend = backend_on(device, sharp_dir, micro_batch=4, kl_beta=0.1, pg_steps=2)
        before = torch.cat([p.detach().float().cpu().flatten() for p in backend.params])
        stats = backend.train(items_for(backend))
        after = torch.cat([p.detach().float().cpu().flatten() for p in backend.params])
        updates.append((stats, after - before))
    (cpu_stats, cpu_update), (gpu_stats, gpu_update) = updates
    for key in ("loss", "grad_norm"):
        assert gpu_stats[key] == pytest.approx(cpu_stats[key], rel=1e-3), key
    assert gpu_stats["train_tokens"] == cpu_stats["train_tokens"]
    assert float(cpu_update.norm()) > 0
    assert float(torch.nn.functional.cosine_similarity(cpu_update, gpu_update, dim=0)) >= 0.99
    assert float(gpu_update.norm()) == pytest.approx(float(cpu_update.norm()), rel=2e-2)


def test_greedy_answers_and_sampled_logprobs_on_the_gpu(sharp_dir: Path, strict_fp32: None) -> None:
    cpu, gpu = backend_on("cpu", sharp_dir), backend_on("cuda", sharp_dir)
    prompts = [p for p, _ in pairs_for(cpu, 4)]
    assert gpu.greedy(prompts, 10) == cpu.greedy(prompts, 10)
    gpu.reseed(11)
    first = gpu.generate(prompts, 3, 10, TEMPERATURE)
    gpu.reseed(11)
    again = gpu.generate(prompts, 3, 10, TEMPERATURE)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]  # a seed replays on the GPU too
    # The log-probs the decoder returned are the ones a forward pass gives for those tokens.
    pairs = [(prompts[i // 3], c.token_ids) for i, c in enumerate(first) if c.token_ids]
    recomputed = gpu.behaviour_logprobs(pairs, TEMPERATURE)
    sampled = [c.logprobs for c in first if c.token_ids]
    assert max_diff(sampled, recomputed) <= 1e-3


def test_a_checkpoint_written_on_the_gpu_resumes_on_either_device(sharp_dir: Path, tmp_path: Path,
                                                                 strict_fp32: None) -> None:
    gpu = backend_on("cuda", sharp_dir, learning_rate=0.05)
    gpu.train(items_for(gpu))
    gpu.save(tmp_path)
    pairs = pairs_for(gpu)
    want = gpu.behaviour_logprobs(pairs, TEMPERATURE)
    for device in ("cuda", "cpu"):  # a run may move from a gaming PC to a laptop
        other = backend_on(device, sharp_dir, learning_rate=0.05)
        before = other.behaviour_logprobs(pairs, TEMPERATURE)
        other.load(tmp_path)
        assert max_diff(before, want) > 100 * LOGP_ATOL  # the adapters matter
        assert max_diff(other.behaviour_logprobs(pairs, TEMPERATURE), want) <= LOGP_ATOL, device


@pytest.mark.integration  # a real loopback relay
def test_an_experiment_round_on_the_gpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    from engine.common.paths import Paths
    from engine.experiment.plan import make_plan
    from engine.experiment.runner import Experiment, Hooks

    settings = [
        "tasks.questions_per_round=2", "tasks.completions_per_question=4", "tasks.max_new_tokens=12",
        "tasks.eval_every=1", "tasks.eval_questions=9", "grpo.learning_rate=0.02", "run.device='cuda'",
        f"model.source='{tiny_model_dir}'", "swarm.length_ratio=0",
    ]
    plan = make_plan("default", 2, "2/0,1/1", 2, settings)
    report = Experiment(plan, tmp_path / "out", Paths.under(tmp_path / "home"),
                        Hooks(reward=lambda question, completion: float(len(completion) % 2))).run()
    assert report["complete"]
    assert report["mixes"]["1/1"]["external_groups_per_node_round"] > 0
    assert report["mixes"]["2/0"]["reward_by_round"][0] == report["mixes"]["1/1"]["reward_by_round"][0]
