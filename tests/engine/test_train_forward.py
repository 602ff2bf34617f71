"""The packed training step (engine/backends/train_forward.py) against HF's forward, the path it replaced.

Same items, same backend, the two forwards switched with `packed_training`:
the loss, the statistics and every LoRA gradient must agree. Tolerance: in
fp32 the two sum in different orders (no padding, no cache copies, the LM
head by chunks); measured within 2e-6 of each gradient's norm on these
tiny models, allowed 1e-5. bf16 autocast rounds every matmul: there the
packed step must be no further from the fp32 gradients than the HF step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.backends import torch_backend, train_forward
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device
from engine.rollouts import TrainItem

LENGTHS = (1, 2, 5, 9, 14)  # length 1: a completion predicted by its prompt's last token only


def backend_with_live_adapters(model_dir: Path, **grpo: Any) -> TorchBackend:
    """A LoRA backend whose B matrices are random: with peft's B = 0 every A gradient would be 0 on both paths."""
    backend = TorchBackend(model_dir, pick_device("cpu"), GRPOConfig(**{"precision": "fp32", **grpo}), 0, 0.7)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return backend


def items_for(backend: TorchBackend) -> list[TrainItem]:
    """Three prompts of different lengths, their completions of different lengths, mixed advantages."""
    generator = torch.Generator().manual_seed(5)
    prompts = [backend.encode_prompt([{"role": "user", "content": text}])
               for text in ("2+2?", "What is 12 + 30, and then 7 more?", "Spell 'tree' backwards.")]
    items = []
    for number, prompt in enumerate(prompts):
        for k, length in enumerate(LENGTHS):
            completion = torch.randint(3, len(backend.tokenizer), (length,), generator=generator).tolist()
            old = (torch.randn(length, generator=generator) * 0.3 - 4.0).tolist()
            items.append(TrainItem(prompt, completion, old, (-1.0) ** (number + k) * (0.5 + 0.1 * k)))
    return items


def step(
    backend: TorchBackend, items: list[TrainItem], packed: bool
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    backend.packed_training = packed
    stats = backend.accumulate_gradients(items)
    grads = {name: p.grad.clone() for name, p in backend.model.named_parameters() if p.grad is not None}
    backend.optimizer.zero_grad(set_to_none=True)
    return stats, grads


def assert_same_step(backend: TorchBackend, items: list[TrainItem], tolerance: float) -> None:
    new_stats, new = step(backend, items, packed=True)
    old_stats, old = step(backend, items, packed=False)
    assert new_stats["loss"] == pytest.approx(old_stats["loss"], rel=tolerance, abs=1e-7)
    assert new_stats["kl"] == pytest.approx(old_stats["kl"], rel=tolerance, abs=1e-7)
    assert new_stats["clip_fraction"] == pytest.approx(old_stats["clip_fraction"], abs=1e-6)
    assert set(new) == set(old) and len(old) == len(backend.params)
    for name, grad in old.items():
        assert float(grad.norm()) > 0, name  # every adapter matrix carries a gradient: the comparison means something
        assert float((new[name] - grad).norm()) <= tolerance * float(grad.norm()), name


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_packed_step_gives_the_hf_steps_loss_and_lora_gradients(
    tiny_model_dir: Path, tiny_qwen_dir: Path, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(train_forward, "HEAD_CHUNK", 16)  # the LM head in several chunks, as on the real model
    backend = backend_with_live_adapters(tiny_model_dir if arch == "llama" else tiny_qwen_dir, micro_batch=6)
    items = items_for(backend)
    assert backend.packs_training()
    assert_same_step(backend, items, tolerance=1e-5)


def test_the_kl_reference_switches_the_adapters_off_in_the_packed_step_too(tiny_model_dir: Path) -> None:
    backend = backend_with_live_adapters(tiny_model_dir, kl_beta=0.2)
    items = items_for(backend)
    assert step(backend, items, packed=True)[0]["kl"] > 1e-4  # the adapters moved the policy away from the base
    assert_same_step(backend, items, tolerance=1e-5)


def test_the_packed_step_is_as_close_to_fp32_as_the_hf_step_under_bf16_autocast(tiny_model_dir: Path) -> None:
    """bf16 rounds every matmul's operands to 8 bits of mantissa: on this model each path's LoRA gradients are
    2-4% off the fp32 ones (measured), in different directions, so the two bf16 paths differ by up to about 2%
    from each other. What must hold: the packed step is no further from fp32 than the HF step (25% slack),
    and within 5e-2 of it, matrix by matrix."""
    items = items_for(backend_with_live_adapters(tiny_model_dir))
    truth = step(backend_with_live_adapters(tiny_model_dir), items, packed=False)[1]
    backend = backend_with_live_adapters(tiny_model_dir, precision="bf16")
    assert backend.autocast
    new_stats, new = step(backend, items, packed=True)
    old_stats, old = step(backend, items, packed=False)
    assert new_stats["loss"] == pytest.approx(old_stats["loss"], rel=1e-2)

    def off(grads: dict[str, torch.Tensor]) -> float:
        return float(torch.cat([(grads[n] - truth[n]).flatten() for n in truth]).norm()
                     / torch.cat([t.flatten() for t in truth.values()]).norm())

    assert off(new) <= 1.25 * off(old)
    for name, grad in old.items():
        assert float((new[name] - grad).norm()) <= 5e-2 * float(grad.norm()), name


def fp32_sum_tolerance(backend: TorchBackend, items: list[TrainItem]) -> float:
    """The relative rounding a LoRA gradient can carry in fp32, from the sums it is made of.

    Each element of a LoRA gradient is a sum over the step's tokens of products that are themselves sums over
    the hidden size; summed in a different order (packed rows against padded ones, one lane against another,
    another kernel), each addition can round by half an ulp of the running total, so the worst case is about
    (tokens + hidden) units of fp32's roundoff, relative to the terms' magnitude (here the gradient's norm)."""
    tokens = sum(len(item.prompt_ids) + len(item.completion_ids) for item in items)
    hidden = backend.model.get_base_model().config.hidden_size
    return (tokens + hidden) * torch.finfo(torch.float32).eps / 2


def test_a_whole_training_step_reaches_the_same_weights_on_both_paths(tiny_model_dir: Path) -> None:
    """Both paths take one AdamW step from zero moments, where each weight moves by lr * g / (|g| + eps): about
    lr * sign(g) for any gradient well above eps (1e-8), whatever its size. A weight whose gradient is near eps, or
    changes sign, can therefore move by anything up to 2 * lr when its gradient changes by one rounding: the
    weights cannot be compared with a fixed tolerance (1e-6 held on an AMD EPYC and failed on an Intel Xeon with
    AMX, 2 of 16,384 weights at 1.09e-6). What must hold: the gradients each step applied (clipped) agree as
    sums of their size (`fp32_sum_tolerance`), and every weight differs by no more than that difference can move
    it through Adam's map: lr * min(2, |g_new - g_old| / eps), plus the update's own rounding."""
    trained = []
    for packed in (True, False):
        backend = backend_with_live_adapters(tiny_model_dir, micro_batch=4)
        backend.packed_training = packed
        applied: list[torch.Tensor] = []
        original = backend.optimizer.step

        def step_recording(*args: Any, _original: Any = original, _backend: TorchBackend = backend,
                           _applied: list[torch.Tensor] = applied, **kwargs: Any) -> Any:
            _applied.extend(p.grad.detach().clone() for p in _backend.params)  # after clipping, as the step sees it
            return _original(*args, **kwargs)

        backend.optimizer.step = step_recording  # type: ignore[method-assign]
        items = items_for(backend)
        before = [p.detach().clone() for p in backend.params]
        stats = backend.train(items)
        trained.append((stats, applied, before, [p.detach().clone() for p in backend.params]))
    tolerance = fp32_sum_tolerance(backend, items)
    (new_stats, new_grads, new_before, new), (old_stats, old_grads, old_before, old) = trained
    assert new_stats["train_tokens"] == old_stats["train_tokens"]
    assert new_stats["grad_norm"] == pytest.approx(old_stats["grad_norm"], rel=tolerance)
    assert len(new_grads) == len(old_grads) == len(new) > 0  # one step each
    lr = backend.grpo.learning_rate
    adam_eps = backend.optimizer.defaults["eps"]
    rounding = 2 * torch.finfo(torch.float32).eps
    for g_new, g_old, w0_new, w0_old, w_new, w_old in zip(new_grads, old_grads, new_before, old_before, new, old,
                                                          strict=True):
        assert torch.equal(w0_new, w0_old)
        assert float((g_new - g_old).norm()) <= tolerance * float(g_old.norm())
        moved = torch.clamp((g_new - g_old).abs() / adam_eps, max=2.0) * lr
        assert bool(((w_new - w_old).abs() <= moved + rounding * (w_old.abs() + lr)).all())
        assert float((w_old - w0_old).abs().max()) > 0.5 * lr  # the step moved the weights: the check means something


def test_models_the_packed_forward_does_not_cover_train_through_hf(tiny_model_dir: Path) -> None:
    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(precision="fp32"), 0, 0.7)
    backend.model.get_base_model().config.attention_dropout = 0.1
    assert train_forward.train_unsupported_reason(backend.model) == "attention dropout"
    assert not backend.packs_training()
    stats = backend.train(items_for(backend))
    assert stats["train_tokens"] == 3 * sum(LENGTHS)


def test_the_fused_lora_projections_have_the_gradients_autograd_finds() -> None:
    """`_LoraGroup`'s written-out backward against numerical gradients (float64), a bias on one projection."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int, grad: bool = True) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_(grad)

    x = rand(5, 6)
    tensors = (rand(4, 6, grad=False), rand(4, grad=False), rand(2, 6), rand(4, 2),
               rand(3, 6, grad=False), None, rand(3, 6), rand(3, 3))
    assert torch.autograd.gradcheck(lambda x, *t: train_forward._LoraGroup.apply((2.0, 0.5), x, *t), (x, *tensors))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_fused_lora_projections_give_the_op_by_op_gradients(
    tiny_model_dir: Path, tiny_qwen_dir: Path, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = backend_with_live_adapters(tiny_model_dir if arch == "llama" else tiny_qwen_dir)
    items = items_for(backend)
    fused_stats, fused = step(backend, items, packed=True)
    monkeypatch.setattr(train_forward, "FUSE_LORA", False)
    plain_stats, plain = step(backend, items, packed=True)
    assert fused_stats["loss"] == pytest.approx(plain_stats["loss"], rel=1e-6)
    for name, grad in plain.items():
        assert float((fused[name] - grad).norm()) <= 1e-5 * float(grad.norm()), name


@pytest.fixture
def two_threads() -> Any:
    """torch at 2 intra-op threads (the suite runs at 1), as on a 2-core machine: what turns the lanes on."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_lanes_give_the_one_after_the_other_step_and_the_same_one_each_run(
    tiny_model_dir: Path, two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Micro-batches side by side (engine/backends/train_lanes.py) against one after the other, the same items:
    one thread per lane rounds differently from two per matmul, measured within 1e-7 of each gradient's norm,
    allowed 1e-6. The lanes sum in micro-batch order, so two runs with lanes are identical."""
    backend = backend_with_live_adapters(tiny_model_dir, micro_batch=4)
    items = items_for(backend)
    ran: list[int] = []
    original = torch_backend.run_lanes
    monkeypatch.setattr(torch_backend, "run_lanes", lambda chunks, lanes, *rest: (ran.append(lanes),
                                                                                 original(chunks, lanes, *rest))[1])
    lanes_stats, lanes = step(backend, items, packed=True)
    assert ran == [2] and torch.get_num_threads() == 2  # 4 micro-batches in 2 lanes; the threads restored
    again = step(backend, items, packed=True)[1]
    assert all(torch.equal(again[name], grad) for name, grad in lanes.items())
    backend.train_lanes = False
    plain_stats, plain = step(backend, items, packed=True)
    assert ran == [2, 2]
    assert lanes_stats == pytest.approx(plain_stats, rel=1e-6, abs=1e-9)
    for name, grad in plain.items():
        assert float((lanes[name] - grad).norm()) <= 1e-6 * float(grad.norm()), name


def test_lanes_take_only_what_half_the_free_memory_holds(
    tiny_model_dir: Path, two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every lane holds a micro-batch: with memory for one only, the micro-batches run one after the other."""
    from engine.backends import train_lanes

    cpu = torch.device("cpu")
    assert train_lanes.lane_count(cpu, 4, True) == 2  # no estimate: torch's threads
    assert train_lanes.lane_count(cpu, 4, True, per_lane=100, available=10_000) == 2
    assert train_lanes.lane_count(cpu, 4, True, per_lane=100, available=300) == 1  # half of 300 holds one
    assert train_lanes.lane_count(cpu, 4, True, per_lane=100, available=0) == 2  # free memory unknown
    backend = backend_with_live_adapters(tiny_model_dir, micro_batch=4)
    items = items_for(backend)
    config = backend.model.config
    one = train_lanes.lane_bytes(config, 10, 4)
    assert one > 0 and train_lanes.lane_bytes(config, 20, 4) > one and train_lanes.lane_bytes(object(), 10, 4) == 0
    ran: list[int] = []
    original = torch_backend.run_lanes
    monkeypatch.setattr(torch_backend, "run_lanes", lambda chunks, lanes, *rest: (ran.append(lanes),
                                                                                 original(chunks, lanes, *rest))[1])
    step(backend, items, packed=True)
    assert ran == [2]
    chunks = torch_backend.micro_batches(items, *backend.budget.limits(backend.grpo), shared_prompts=True, packed=True)
    monkeypatch.setattr(train_lanes, "free_memory", lambda: 3 * train_lanes.largest_lane(config, chunks))
    step(backend, items, packed=True)
    assert ran == [2]  # 1.5 lanes' worth: one lane, one micro-batch after the other


def test_a_stop_raised_in_a_lane_ends_the_step_and_restores_the_threads(
    tiny_model_dir: Path, two_threads: None
) -> None:
    backend = backend_with_live_adapters(tiny_model_dir, micro_batch=4)
    checks: list[tuple[int, int]] = []

    def on_step(done: int, total: int) -> None:
        checks.append((done, total))
        if len(checks) == 5:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        backend.train(items_for(backend), on_step)
    assert torch.get_num_threads() == 2
    assert all(p.grad is None for p in backend.params)  # no gradient left behind, no optimiser step
    assert backend.train(items_for(backend))["loss"] != 0.0  # and the next step runs


def test_a_thread_count_picked_while_the_lanes_run_holds_on_the_rounds_thread(
    tiny_model_dir: Path, two_threads: None
) -> None:
    """A busy program appears during training: the policy, asked from a lane's progress callback, picks one
    thread. The lanes used to restore the count they found (2) afterwards, and generation ran on 2 threads
    beside the busy program while the node said 1."""
    from engine.priority import LoadSampler, ThreadPolicy

    class Busy(LoadSampler):
        def __init__(self) -> None:
            self.now = 100.0
            super().__init__(clock=lambda: self.now)

        def others(self) -> float:
            self.last = (self.now, 0.0, 0.0)
            return 1.0

    sampler = Busy()
    policy = ThreadPolicy(0, torch.set_num_threads, max_threads=2, cpus=2, sampler=sampler,
                          current=torch.get_num_threads)

    def on_step(done: int, total: int) -> None:
        sampler.now += 1.0
        policy.update()

    backend = backend_with_live_adapters(tiny_model_dir, micro_batch=4)
    backend.train(items_for(backend), on_step)
    assert policy.threads == 1
    assert policy.update() == 1 and torch.get_num_threads() == 1  # the round's thread now runs on one
