"""The torch backend on a tiny model: sampling records the policy's own log-probs."""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path

import pytest

from bench.harness.tiny import make_sharp_model
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device
from tests.engine.test_train_forward import fp32_gradient_tolerance, fp32_logprob_tolerance


def test_sampling_leaves_the_training_weights_untouched(tiny_model_dir: Path) -> None:
    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(), 0, 1.0)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    backend.generate([backend.encode_prompt([{"role": "user", "content": "x"}])], 2, 6, 1.0)
    backend.greedy([backend.encode_prompt([{"role": "user", "content": "y"}])], 6)
    after = backend.model.state_dict()
    assert all(v.dtype == after[k].dtype and bool((v == after[k]).all()) for k, v in before.items())


def test_loading_with_lora_writes_no_is_gradient_checkpointing_warning(tiny_model_dir: Path) -> None:
    """peft asks transformers for a deprecated property; that FutureWarning reached every node's log."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(finetune="lora"), 0, 1.0)
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


def test_the_loaded_model_is_kept_out_of_full_collections_and_later_garbage_is_not(tiny_model_dir: Path) -> None:
    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(), 0, 1.0)
    # The model's objects were frozen at load: a full collection no longer walks them.
    assert gc.get_freeze_count() > 0
    assert not any(obj is backend.model for obj in gc.get_objects())

    class Cycle:
        pass

    later = Cycle()
    later.me = later  # type: ignore[attr-defined]
    dead = weakref.ref(later)
    del later
    gc.collect()
    assert dead() is None  # objects made after the load are still collected


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("lengths", [(1, 5, 12), (1, 1, 1)])
@pytest.mark.parametrize("packed", [True, False])
def test_shared_prompts_give_the_same_logprobs_and_gradients_as_one_forward_per_sequence(
    tmp_path: Path, arch: str, lengths: tuple[int, ...], packed: bool
) -> None:
    """Training runs each distinct prompt once: packed with its completions in one sequence
    (engine/backends/train_forward.py), or through HF with its completions on copies of its cache.

    Checked against the plain computation: every prompt + completion on its
    own, unpadded, with full fine-tuning (the embedding and a separate LM
    head trained too). Prompts of different lengths are interleaved (left
    padding and the cache copies in play on the HF path); (1, 1, 1) is the
    batch where no completion needs a second forward. The two sum in other
    orders: log-probs agree within `fp32_logprob_tolerance`, gradients within
    `fp32_gradient_tolerance` of their norm (tests/engine/test_train_forward.py).
    """
    import torch

    folder = make_sharp_model(tmp_path / arch, arch)
    backend = TorchBackend(folder, pick_device("cpu"), GRPOConfig(precision="fp32", finetune="full"), 0, 0.7)
    backend.packed_training = packed
    assert backend.packs_training() == packed
    short = backend.encode_prompt([{"role": "user", "content": "2+2?"}])
    long = backend.encode_prompt([{"role": "user", "content": "What is 12 + 30, and then 7 more?"}])
    gen = torch.Generator().manual_seed(5)
    pairs = []
    for n in lengths:
        for prompt in (short, long):
            pairs.append((prompt, torch.randint(3, len(backend.tokenizer), (n,), generator=gen).tolist()))
    weights = torch.randn(len(pairs), max(lengths), generator=gen)

    def grads() -> dict[str, torch.Tensor]:
        out = {name: p.grad.clone() for name, p in backend.model.named_parameters() if p.grad is not None}
        backend.model.zero_grad(set_to_none=True)
        return out

    backend.model.zero_grad(set_to_none=True)
    logp, mask = backend.batch_logprobs(pairs, 0.7)
    (logp * mask * weights).sum().backward()
    fast = grads()

    rows = []
    for prompt, comp in pairs:
        ids = torch.tensor([prompt + comp])
        logits = backend.model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) + len(comp) - 1].float() / 0.7
        rows.append(torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(comp)[:, None]).squeeze(1))
    sum((row * weights[i, : len(row)]).sum() for i, row in enumerate(rows)).backward()
    plain = grads()

    eps_logp = fp32_logprob_tolerance(backend.model, max(len(p) + len(c) for p, c in pairs), 0.7)
    tolerance = fp32_gradient_tolerance(backend.model, pairs)
    for i, row in enumerate(rows):
        assert mask[i].sum() == len(row)
        assert logp[i, : len(row)].tolist() == pytest.approx(row.tolist(), rel=0, abs=eps_logp)
    # not near-uniform: spread far beyond the tolerance, so the comparison means something
    spread = float(torch.stack([r.std() for r in rows if len(r) > 1] or [logp.std()]).mean().detach())
    assert spread > max(0.1, 100 * eps_logp)
    assert set(fast) == set(plain)
    for name in plain:
        assert float((fast[name] - plain[name]).norm()) <= tolerance * float(plain[name].norm()), name
