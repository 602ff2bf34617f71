"""The bf16 training step on the bundled model's shapes: each path against fp32 on the same weights, never against
each other (bench/harness/gradients.py says why: a GRPO gradient nearly cancels within each question)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.harness.gradients import against, flat_gradient, parts_in_bf16
from bench.harness.tiny import make_bundled_shapes_model
from engine.backends.base import TrainItem
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device
from engine.rollouts.groups import group_advantages


def items_for(backend: TorchBackend) -> list[TrainItem]:
    """Two questions of four completions each, with group-normalised advantages (they sum to zero per question)."""
    gen = torch.Generator().manual_seed(11)
    items = []
    for text in ("What is 12 + 30?", "Spell 'tree' backwards."):
        prompt = backend.encode_prompt([{"role": "user", "content": text}])
        rewards = [1.0, 0.0, 0.0, 1.0]
        for length, advantage in zip((7, 12, 5, 9), group_advantages(rewards, 1e-4), strict=True):
            completion = torch.randint(3, 250, (length,), generator=gen).tolist()
            old = (torch.randn(length, generator=gen) * 0.2 - 6.0).tolist()
            items.append(TrainItem(prompt, completion, old, advantage))
    return items


@pytest.mark.slow
def test_each_bf16_step_lies_within_what_its_completions_rounding_allows(tmp_path: Path) -> None:
    backend = TorchBackend(make_bundled_shapes_model(tmp_path / "model"), pick_device("cpu"),
                           GRPOConfig(precision="bf16", micro_batch=4), 0, 0.7)
    items = items_for(backend)
    backend.train(items)  # one step, so B is no longer zero and every adapter matrix has a gradient
    reference = flat_gradient(backend, items, bf16=False, packed=True)[0]
    old32 = flat_gradient(backend, items, bf16=False, packed=False)[0]
    tokens = sum(len(it.prompt_ids) + len(it.completion_ids) for it in items)
    # fp32: the two paths are the same sums in another order, within (tokens + hidden) units of roundoff.
    assert against(reference, old32)["distance"] <= (tokens + 576) * torch.finfo(torch.float32).eps / 2
    completions = [[it] for it in items]
    result = {}
    for side, packed in (("new", True), ("old", False)):
        grad = flat_gradient(backend, items, bf16=True, packed=packed)[0]
        result[side] = (against(reference, grad)["distance"], parts_in_bf16(backend, completions, packed).bound)
    (new, new_bound), (old, old_bound) = result["new"], result["old"]
    assert new > 2**-8 and old > 2**-8  # bf16 moved both: the comparison means something
    assert new <= new_bound and old <= old_bound  # no error beyond the completions' own rounding
    assert new <= old_bound  # the packed step is no further from fp32 than the HF step's rounding allows
