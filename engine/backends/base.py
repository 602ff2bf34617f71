"""What a training backend is: the `PolicyBackend` protocol the round loop calls, what it takes and returns.

`generate` returns `Completion`s (tokens with their behaviour log-probs);
`train` takes `TrainItem`s (one sequence each, with its advantage). The
round's own data (engine/rollouts/) is built on these; the backends import
nothing of the round loop.

Its own module so that the backends import it without importing
`engine.backends`, whose `load_backend` imports them (no import cycle).
Imports nothing heavy.

Tests (every backend against it): .venv/bin/python -m pytest tests/engine/test_backends_shared.py -q
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engine.common.config import GRPOConfig
from engine.common.device import DeviceInfo


@dataclass
class Completion:
    """One sampled answer: its text, its tokens and the sampling policy's log-prob of each."""

    text: str
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each token under the sampling policy
    finished: bool  # ended with EOS; False when cut off at the length cap
    weights: list[float] | None = None  # per-token loss weight (external text: truncated importance weights)


@dataclass
class TrainItem:
    """One sequence for the policy-gradient step."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    weights: list[float] | None = None  # per-token loss weight; None: every token weighs 1


# Called with (steps done, steps total); may block (pause) or raise (stop).
StepCallback = Callable[[int, int], None]


class PromptCache:
    """Prompts already read by the model, kept from one `generate` call for the next under the same weights.

    Probing (engine/questions/probe.py) answers a question k times, then G - k times
    more: with one of these passed to both calls, the second one does not
    read the prompt again. Keys are (adapter index, prompt tokens); a value
    is whatever the backend keeps (the torch decoder: each layer's keys and
    values and the last position's logits). A backend that cannot reuse a
    prompt's state ignores it. Drop it once the weights change.
    """

    def __init__(self) -> None:
        self._states: dict[tuple[int, tuple[int, ...]], Any] = {}
        self.hits = 0  # prompts a call found here instead of reading them

    def get(self, adapter: int, prompt: Sequence[int]) -> Any:
        state = self._states.get((adapter, tuple(prompt)))
        self.hits += state is not None
        return state

    def put(self, adapter: int, prompt: Sequence[int], state: Any) -> None:
        self._states[(adapter, tuple(prompt))] = state

    def __len__(self) -> int:
        return len(self._states)


class PolicyBackend(Protocol):
    """What the round loop needs from a model: sample, score text, learn, persist."""

    device: DeviceInfo
    eos_token_id: int

    def encode_prompt(self, messages: list[dict[str, str]]) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def encode_completion(self, text: str) -> list[int]: ...

    def generate(
        self,
        prompts: Sequence[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        on_step: StepCallback | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> list[Completion]: ...

    def greedy(self, prompts: Sequence[list[int]], max_new_tokens: int,
               on_step: StepCallback | None = None) -> list[str]: ...

    def behaviour_logprobs(self, items: Sequence[tuple[list[int], list[int]]],
                           temperature: float) -> list[list[float]]: ...

    def train(self, items: Sequence[TrainItem], on_step: StepCallback | None = None) -> dict[str, float]: ...

    def reseed(self, seed: int) -> None: ...

    def apply_settings(self, grpo: GRPOConfig, temperature: float) -> None:
        """Take reloaded settings (learning rate, clipping, temperature...); the model's shape is unchanged."""
        ...

    def save(self, folder: Path) -> list[str]: ...

    def load(self, folder: Path) -> None: ...

    def export(self, folder: Path) -> None: ...

    def rng_state(self) -> dict[str, Any]: ...
