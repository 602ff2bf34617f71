"""A simulated node's two seams in the experiment: its view of the shared model, and its exchange.

- `NodeBackend`: one node's view of the shared `TorchBackend` (one frozen
  base, an adapter slot per node), so a `Node` trains, scores, saves and
  loads exactly as it would with a backend of its own.
- `PublishFirst`: every node publishes round r before any node samples, as
  nodes running side by side would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.backends.base import Completion
from engine.rollouts.groups import Group
from engine.rollouts.offers import Offer


# -- one frozen base, one adapter per node -------------------------------------------------------
class NodeBackend:
    """One node's view of the shared `TorchBackend`: every call runs on this node's adapter slot.

    The round loop's `PolicyBackend`: a `Node` holds one of these and trains,
    scores, saves and loads exactly as it would with a backend of its own.
    """

    def __init__(self, shared: Any, slot: Any) -> None:
        self.shared = shared
        self.slot = slot
        self.device = shared.device
        self.eos_token_id = shared.eos_token_id

    def _on(self) -> Any:
        self.shared.use_adapter_slot(self.slot)
        return self.shared

    def encode_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self.shared.encode_prompt(messages))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.shared.decode(token_ids))

    def encode_completion(self, text: str) -> list[int]:
        return list(self.shared.encode_completion(text))

    def generate(self, prompts: Sequence[list[int]], n: int, max_new_tokens: int, temperature: float,
                 on_step: Callable[[int, int], None] | None = None, prompt_cache: Any = None) -> list[Completion]:
        return list(self._on().generate(prompts, n, max_new_tokens, temperature, on_step, prompt_cache))

    def greedy(self, prompts: Sequence[list[int]], max_new_tokens: int,
               on_step: Callable[[int, int], None] | None = None) -> list[str]:
        return list(self._on().greedy(prompts, max_new_tokens, on_step))

    def behaviour_logprobs(self, items: Sequence[tuple[list[int], list[int]]], temperature: float) -> list[list[float]]:
        return list(self._on().behaviour_logprobs(items, temperature))

    def train(self, items: Sequence[Any], on_step: Callable[[int, int], None] | None = None) -> dict[str, float]:
        return dict(self._on().train(items, on_step))

    def reseed(self, seed: int) -> None:
        self.shared.reseed(seed)

    def apply_settings(self, grpo: Any, temperature: float) -> None:
        self._on().apply_settings(grpo, temperature)

    def save(self, folder: Path) -> list[str]:
        return list(self._on().save(folder))

    def load(self, folder: Path) -> None:
        self._on().load(folder)

    def export(self, folder: Path) -> None:
        raise NotImplementedError("export a node of an experiment with its checkpoint and sapling-node export")

    def rng_state(self) -> dict[str, Any]:
        return dict(self.shared.rng_state())

    def lora(self) -> Any:
        return self.shared.slot_lora(self.slot)


class PublishFirst:
    """A node's `RolloutExchange` whose round is published by the experiment before any node samples.

    `Node.share_and_sample` publishes and then samples; with nodes taking turns
    on one thread, the first node would sample before the others had
    published. The experiment calls `publish` for every node first; the
    publish inside `share_and_sample` is then the same round's and is skipped.
    """

    def __init__(self, exchange: Any) -> None:
        self.exchange = exchange
        self.published_round = 0

    def set_model_label(self, label: str) -> None:
        self.exchange.set_model_label(label)

    def publish(self, round_index: int, groups: Sequence[Group]) -> None:
        if round_index == self.published_round:
            return
        self.exchange.publish(round_index, groups)
        self.published_round = round_index

    def rewind(self, round_index: int) -> None:
        self.exchange.rewind(round_index)

    def sample(self, round_index: int, n: int, taskset: Any, *, exclude: Any, seed: int) -> Offer:
        offer: Offer = self.exchange.sample(round_index, n, taskset, exclude=exclude, seed=seed)
        return offer

    def settle(self, offer: Offer, verdicts: Any) -> dict[str, Any]:
        return dict(self.exchange.settle(offer, verdicts))

    def unban(self, peer: str) -> str:
        return str(self.exchange.unban(peer))

    def apply_settings(self, swarm: Any) -> None:
        self.exchange.apply_settings(swarm)
