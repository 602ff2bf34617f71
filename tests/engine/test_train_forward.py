"""The packed training step (engine/backends/train_forward.py) against HF's forward, the path it replaced.

Same items, same backend, the two forwards switched with `packed_training`:
the loss, the statistics and every LoRA gradient must agree. Tolerance: in
fp32 the two sum in different orders (no padding, no cache copies, the LM
head by chunks), so each quantity is compared within the rounding its sums
can carry, derived from their sizes and the model's shapes
(`fp32_gradient_tolerance` for gradients, `fp32_logprob_tolerance` for
log-probs, `loss_tolerances` for the loss and the KL statistic built on
them); the numerics tests in the other files use the same helpers. bf16
autocast rounds every matmul: there the packed step must be no further from
the fp32 gradients than the HF step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.backends import torch_backend, train_forward
from engine.backends.base import TrainItem
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device

LENGTHS = (1, 2, 5, 9, 14)  # length 1: a completion predicted by its prompt's last token only
U = torch.finfo(torch.float32).eps / 2  # fp32's unit roundoff: one rounding moves a value by at most U of itself


def logit_bound(model: Any, temperature: float) -> float:
    """A bound on the magnitude of the LM head's terms, sum over i of |h_i W_vi| / temperature, for any token v:
    |h| |W_v| (Cauchy-Schwarz) with |h| <= sqrt(hidden) * max |final norm weight| (the normed hidden state has
    norm sqrt(hidden) before its weight). It bounds every logit too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    lm_head = base.get_output_embeddings().weight.detach().float()
    norm = base.model.norm.weight.detach().float()
    return math.sqrt(base.config.hidden_size) * float(norm.abs().max()) * float(lm_head.norm(dim=1).max()) / temperature


def forward_roundings(model: Any, longest: int, rank: int = 0) -> int:
    """How many units of fp32's roundoff a logit can carry, relative to its terms' magnitude, from the chain of
    sums it ends: per layer the two norms, the q/k/v, o, gate/up projections (5 sums over the hidden size), the
    down projection (intermediate size), the attention scores (head size), the softmax and weighted mean over up
    to `longest` positions, a LoRA adapter's rank on the 4 projections of the chain, and about 10 elementwise
    roundings (rope, residuals, activation, softmax's exp and division); then the final norm and the LM head
    (hidden size each). A sum of n terms rounds by up to n units of its terms' magnitude. This counts every
    rounding once and lets none grow through the layers: a first-order worst case."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    hidden = config.hidden_size
    head = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    per_layer = 5 * hidden + config.intermediate_size + head + 2 * longest + 4 * rank + 10
    return int(config.num_hidden_layers * per_layer + 2 * hidden)


def fp32_logprob_tolerance(model: Any, longest: int, temperature: float, rank: int = 0) -> float:
    """How far two fp32 computations of one token's log-prob can differ (nats), from the sums it is made of.

    Each computation's logits carry `forward_roundings` units of `logit_bound`; a log-softmax moves by at most
    twice its inputs' largest change, and it rounds on its own: its sum over the vocabulary (vocab units) and its
    log and subtraction (a unit of |log Z| and |log p|, each below log(vocab) + twice the logits' bound). On the
    tests' tiny models the measured differences are 250 to 900 times smaller than this worst case: it catches a
    log-prob off by a few thousandths of a nat, not a rounding."""
    vocab = (model.get_base_model() if hasattr(model, "get_base_model") else model).config.vocab_size
    count = forward_roundings(model, longest, rank)
    return U * (4 * (count + 2) * logit_bound(model, temperature) + 2 * vocab + 4 * math.log(vocab))


def fp32_gradient_tolerance(model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], rank: int = 0) -> float:
    """The relative rounding two fp32 computations of a gradient can differ by, from the sums it is made of.

    A weight's gradient is a sum over the step's tokens of products of an activation, which the forward's chain of
    sums rounds (`forward_roundings`), and of the loss's gradient carried back through the same chain reversed
    (as many again) and through the LM head's sum over the vocabulary. Summed in a different order (packed rows
    against padded ones, one lane against another, another kernel), each computation is off by up to that many
    units of fp32's roundoff, relative to the terms' magnitude (here the gradient's norm), and two differ by up
    to twice that. Measured differences are 35 to 800 times smaller."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    tokens = sum(len(prompt) + len(completion) for prompt, completion in pairs)
    longest = max(len(prompt) + len(completion) for prompt, completion in pairs)
    count = tokens + base.config.vocab_size + 2 * forward_roundings(model, longest, rank)
    return 2 * count * U


def fp32_sum_tolerance(backend: TorchBackend, items: Sequence[TrainItem]) -> float:
    """`fp32_gradient_tolerance` of a step of `backend` over `items`."""
    pairs = [(item.prompt_ids, item.completion_ids) for item in items]
    rank = backend.grpo.lora_rank if backend.grpo.finetune == "lora" else 0
    return fp32_gradient_tolerance(backend.model, pairs, rank)


def loss_tolerances(
    items: Sequence[TrainItem], logps: Sequence[Sequence[float]], grpo: GRPOConfig, eps_logp: float,
    refs: Sequence[Sequence[float]] | None = None,
) -> tuple[float, float]:
    """How far two fp32 computations of a step's loss and of its KL statistic can differ, given the items, their
    log-probs under the policy (`logps`) and the reference (`refs`, with a KL term), and how far two computations
    of a log-prob can differ (`eps_logp`).

    The loss is a mean over the step's N tokens of -min(r A, clip(r) A) + beta kl, r = exp(logp - old): a change e
    of logp moves the policy term by at most |A| r (exp(e) - 1) (the clip and the min are 1-Lipschitz in r), and
    |A| max(r, 1 + eps_high) bounds both r |A| and the term; r itself rounds in the subtraction (|logp - old|
    units) and in exp and the product (a unit each). The KL term kl = e^d - d - 1 of d = ref - logp moves by
    |e^d - 1| times d's change (both log-probs: 2 eps_logp), plus e^d times its second order, and rounds by 3 units
    of max(1, e^d) (e^d near 1 cancels). The sum over the tokens rounds by N units of its terms' magnitude; each
    bound counts both computations. Built on `fp32_logprob_tolerance`, these are thousands of times what is
    measured: they catch a loss off by a fraction of a percent of its terms, not a rounding."""
    pg_terms = pg_moves = kl_terms = kl_moves = 0.0
    tokens = sum(len(it.completion_ids) for it in items)
    for row, (item, logp) in enumerate(zip(items, logps, strict=True)):
        for t, (new, old) in enumerate(zip(logp, item.old_logprobs, strict=True)):
            size = abs(item.advantage) * max(math.exp(new - old), 1 + grpo.eps_high)
            pg_terms += size
            pg_moves += size * (math.expm1(eps_logp) + 2 * U * (abs(new - old) + 3))
            if refs is not None and grpo.kl_beta > 0:
                d = refs[row][t] - new
                kl_terms += math.expm1(d) - d
                kl_moves += (abs(math.expm1(d)) * 2 * eps_logp + math.exp(d) * (math.expm1(2 * eps_logp) - 2 * eps_logp)
                             + 2 * 3 * U * max(1.0, math.exp(d)))
    summing = 2 * (tokens + 1) * U  # the sum over the tokens and the division by N, in each computation
    loss = pg_moves + grpo.kl_beta * kl_moves + summing * (pg_terms + grpo.kl_beta * kl_terms)
    kl = kl_moves + summing * kl_terms
    return loss / tokens, kl / tokens


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


def step_tolerances(backend: TorchBackend, items: list[TrainItem]) -> tuple[float, float]:
    """`loss_tolerances` for a step of `backend` over `items`: its log-probs, and the reference's with a KL term."""
    pairs = [(item.prompt_ids, item.completion_ids) for item in items]
    longest = max(len(prompt) + len(completion) for prompt, completion in pairs)
    eps_logp = fp32_logprob_tolerance(backend.model, longest, backend.temperature, backend.grpo.lora_rank)
    refs = None
    if backend.grpo.kl_beta > 0:
        with backend.model.disable_adapter():  # the reference: the base, as the step computes it
            refs = backend.behaviour_logprobs(pairs, backend.temperature)
    return loss_tolerances(items, backend.behaviour_logprobs(pairs, backend.temperature), backend.grpo, eps_logp,
                           refs)


def assert_same_stats(new: dict[str, float], old: dict[str, float], items: list[TrainItem],
                      tolerances: tuple[float, float]) -> None:
    """The statistics of two computations of one step: the loss and the KL within `tolerances`, the same count of
    clipped tokens (the clip fraction is a count over the step's completion tokens: half a token apart at most)."""
    loss, kl = tolerances
    assert new["loss"] == pytest.approx(old["loss"], rel=0, abs=loss)
    assert new["kl"] == pytest.approx(old["kl"], rel=0, abs=kl)
    tokens = sum(len(item.completion_ids) for item in items)
    assert new["clip_fraction"] == pytest.approx(old["clip_fraction"], rel=0, abs=0.5 / tokens)


def assert_same_step(backend: TorchBackend, items: list[TrainItem]) -> None:
    tolerance = fp32_sum_tolerance(backend, items)
    tolerances = step_tolerances(backend, items)
    new_stats, new = step(backend, items, packed=True)
    old_stats, old = step(backend, items, packed=False)
    assert_same_stats(new_stats, old_stats, items, tolerances)
    assert abs(old_stats["loss"]) > 100 * tolerances[0]  # far from 0: the loss's comparison means something
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
    assert_same_step(backend, items)


def test_the_kl_reference_switches_the_adapters_off_in_the_packed_step_too(tiny_model_dir: Path) -> None:
    backend = backend_with_live_adapters(tiny_model_dir, kl_beta=0.2)
    items = items_for(backend)
    kl = step(backend, items, packed=True)[0]["kl"]
    assert kl > 100 * step_tolerances(backend, items)[1]  # the adapters moved the policy away from the base
    assert_same_step(backend, items)


def test_the_packed_step_is_as_close_to_fp32_as_the_hf_step_under_bf16_autocast(tiny_model_dir: Path) -> None:
    """bf16 keeps 8 bits of mantissa: one rounding moves a value by up to 2**-8 of itself. A LoRA gradient comes
    out of a chain of matmuls, 6 a layer and the LM head forward (6L + 1), as many back and 2 for the weight's
    own gradient, each rounding about twice (its operand cast to bf16, its output): K = 2 (2 (6L + 1) + 2)
    roundings. Their worst case, K * 2**-8 (22% here), bounds nothing, so the test uses their random walk: K
    independent roundings, each uniform within 2**-8, add up to sigma = 2**-8 sqrt(K / 3) relative (1.7% here;
    each path is measured 2-3% off the fp32 gradients). What must hold: each path within 3 sigma of fp32, the
    packed step no further from fp32 than the HF step by more than one sigma, and the two paths, independent
    walks, within 3 sqrt(2) sigma of each other, matrix by matrix. The loss is compared as in fp32
    (`loss_tolerances`) with log-probs within 3 sqrt(2) sigma_forward of the logits' bound, twice (the
    log-softmax), sigma_forward from the forward's 2 (6L + 1) roundings: an estimate 2,000 times the measured
    difference, which catches only a loss off by a tenth of its terms."""
    reference = backend_with_live_adapters(tiny_model_dir)
    items = items_for(reference)
    truth = step(reference, items, packed=False)[1]
    backend = backend_with_live_adapters(tiny_model_dir, precision="bf16")
    assert backend.autocast
    new_stats, new = step(backend, items, packed=True)
    old_stats, old = step(backend, items, packed=False)
    layers = backend.model.get_base_model().config.num_hidden_layers
    forward = 2 * (6 * layers + 1)
    sigma, sigma_forward = 2**-8 * math.sqrt((2 * forward + 4) / 3), 2**-8 * math.sqrt(forward / 3)
    eps_logp = 2 * 3 * math.sqrt(2) * sigma_forward * logit_bound(backend.model, backend.temperature)
    pairs = [(item.prompt_ids, item.completion_ids) for item in items]
    loss = loss_tolerances(items, reference.behaviour_logprobs(pairs, reference.temperature), backend.grpo,
                           eps_logp)[0]
    assert new_stats["loss"] == pytest.approx(old_stats["loss"], rel=0, abs=loss)

    def off(grads: dict[str, torch.Tensor]) -> float:
        return float(torch.cat([(grads[n] - truth[n]).flatten() for n in truth]).norm()
                     / torch.cat([t.flatten() for t in truth.values()]).norm())

    assert 0 < off(old) <= 3 * sigma  # bf16 did round: the comparisons mean something
    assert off(new) <= off(old) + sigma
    for name, grad in old.items():
        assert float((new[name] - grad).norm()) <= 3 * math.sqrt(2) * sigma * float(grad.norm()), name


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
    """`_LoraGroup`'s written-out backward against numerical gradients (float64), a bias on one projection.

    gradcheck's own tolerances (atol 1e-5, rtol 1e-3 against central differences of step 1e-6) hold with room:
    the function is linear in each tensor, so a central difference is exact but for float64's rounding of the
    two values, about 2**-53 / 1e-6 (1e-10) of their size."""
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
    """The fused projections sum the base and adapter products in other orders than peft's op-by-op modules:
    the step's statistics and gradients agree within what those sums can round (`fp32_sum_tolerance`,
    `step_tolerances`)."""
    backend = backend_with_live_adapters(tiny_model_dir if arch == "llama" else tiny_qwen_dir)
    items = items_for(backend)
    tolerance, tolerances = fp32_sum_tolerance(backend, items), step_tolerances(backend, items)
    fused_stats, fused = step(backend, items, packed=True)
    monkeypatch.setattr(train_forward, "FUSE_LORA", False)
    plain_stats, plain = step(backend, items, packed=True)
    assert_same_stats(fused_stats, plain_stats, items, tolerances)
    for name, grad in plain.items():
        assert float(grad.norm()) > 0, name
        assert float((fused[name] - grad).norm()) <= tolerance * float(grad.norm()), name


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
    one thread per lane rounds differently from two per matmul, and the lanes add their micro-batches' gradients
    in another grouping: the statistics and gradients agree within what those sums can round
    (`fp32_sum_tolerance`, `step_tolerances`). The lanes sum in micro-batch order, so two runs with lanes are
    identical."""
    backend = backend_with_live_adapters(tiny_model_dir, micro_batch=4)
    items = items_for(backend)
    tolerance, tolerances = fp32_sum_tolerance(backend, items), step_tolerances(backend, items)
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
    assert lanes_stats.keys() == plain_stats.keys()
    assert_same_stats(lanes_stats, plain_stats, items, tolerances)
    assert lanes_stats["grad_norm"] == plain_stats["grad_norm"] == 0.0  # no optimiser step: no norm measured
    for name, grad in plain.items():
        assert float(grad.norm()) > 0, name
        assert float((lanes[name] - grad).norm()) <= tolerance * float(grad.norm()), name


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
    from engine.node.priority import LoadSampler, ThreadPolicy

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
