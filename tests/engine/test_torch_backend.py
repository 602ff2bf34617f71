"""The torch backend on a tiny model: sampling records the policy's own log-probs."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.torch_backend import TorchBackend
from engine.config import GRPOConfig
from engine.device import pick_device


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_behaviour_logprobs_match_the_trainers_recomputation(
    tiny_model_dir: Path, temperature: float, finetune: str
) -> None:
    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(precision="fp32", finetune=finetune), 0, temperature)
    prompts = [
        backend.encode_prompt([{"role": "user", "content": "What is 2 + 2?"}]),
        backend.encode_prompt([{"role": "user", "content": "Hi"}]),  # shorter: left padding in play
    ]
    completions = backend.generate(prompts, 3, max_new_tokens=12, temperature=temperature)
    assert len(completions) == 6
    pairs = [(prompts[i // 3], c.token_ids) for i, c in enumerate(completions)]
    recomputed = backend.behaviour_logprobs(pairs, temperature)
    for completion, again in zip(completions, recomputed, strict=True):
        assert len(completion.logprobs) == len(completion.token_ids) == len(again)
        assert completion.logprobs == pytest.approx(again, abs=1e-4)


def test_sampling_leaves_the_training_weights_untouched(tiny_model_dir: Path) -> None:
    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(), 0, 1.0)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    backend.generate([backend.encode_prompt([{"role": "user", "content": "x"}])], 2, 6, 1.0)
    backend.greedy([backend.encode_prompt([{"role": "user", "content": "y"}])], 6)
    after = backend.model.state_dict()
    assert all(v.dtype == after[k].dtype and bool((v == after[k]).all()) for k, v in before.items())
