"""Several LoRA adapters over one frozen base: the torch backend's adapter slots, one per simulated node.

A slot (`AdapterSlot`) is one node's LoRA tensors and its own AdamW state.
`new_adapter_slot` makes one as peft initialises an adapter; `use_adapter_slot`
points the backend's trainable parameters and optimizer at it, after which
everything else (generate, behaviour_logprobs, train, save, load) works on that
slot unchanged; `slot_lora` gives the slot as the decoder's `LoraAdapter`, and
`generate_with_adapters` samples prompts under different adapters in one batch.
The frozen base weights are shared.

This is its own room because a backend normally holds one model and one adapter: only the experiment
(engine/experiment/, `sapling-node experiment`) and the benches that measure a fresh adapter run several
nodes over one copy of the base. `TorchBackend` gains these methods from `AdapterSlots`; what they need of the
backend is `SlotHost`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.backends.base import Completion, PromptCache, StepCallback
from engine.backends.decode import DecodedRow, LoraAdapter, unsupported_reason
from engine.common.config import GRPOConfig
from engine.common.device import DeviceInfo
from engine.common.errors import ModelError


@dataclass
class AdapterSlot:
    """One node's LoRA tensors (in the order of `TorchBackend.params`) and its optimizer."""

    tensors: list[torch.Tensor]
    optimizer: torch.optim.AdamW


class SlotHost(Protocol):
    """What the adapter slots use of the backend they sit in (engine/backends/torch_backend.py)."""

    grpo: GRPOConfig
    device: DeviceInfo
    model: Any
    params: list[Any]
    optimizer: torch.optim.AdamW

    def fast_decoder(self) -> bool: ...

    def decode_rows(self, prompts: Sequence[list[int]], n: int, max_new_tokens: int, temperature: float | None,
                    on_step: StepCallback | None, adapters: Sequence[LoraAdapter] = (),
                    **options: Any) -> list[DecodedRow]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class AdapterSlots:
    """Several adapters over one frozen base (engine/experiment/): the torch backend's methods for them."""

    def new_adapter_slot(self: SlotHost, seed: int) -> AdapterSlot:
        """A LoRA adapter of this model's shape with its own AdamW state, initialised as peft
        initialises one (A Kaiming-uniform, drawn here from `seed`; B zero, so it starts as the base).

        `use_adapter_slot` points the trainable parameters and the optimizer at a
        slot; everything else (generate, behaviour_logprobs, train, save, load)
        then works on that slot unchanged. The frozen base weights are shared.
        """
        if self.grpo.finetune != "lora":
            raise ModelError("Several adapters over one base need grpo.finetune = 'lora'.")
        generator = torch.Generator().manual_seed(seed)
        tensors = []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            tensor = torch.zeros(param.shape, dtype=param.dtype)
            if ".lora_A." in name:  # kaiming_uniform_(a=sqrt(5)) as in peft: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
                bound = 1.0 / float(param.shape[1]) ** 0.5
                tensor.uniform_(-bound, bound, generator=generator)
            tensors.append(tensor.to(torch.device(self.device.torch_device)))
        if len(tensors) != len(self.params):
            raise RuntimeError("the trainable parameters changed since the backend was built")
        # The optimizer holds the same Parameter objects as every other slot's; its state is its own.
        optimizer = torch.optim.AdamW(self.params, lr=self.grpo.learning_rate, weight_decay=self.grpo.weight_decay)
        return AdapterSlot(tensors, optimizer)

    def use_adapter_slot(self: SlotHost, slot: AdapterSlot) -> None:
        """Train, sample, save and load with `slot` from now on (no copy: the parameters alias its tensors)."""
        for param, tensor in zip(self.params, slot.tensors, strict=True):
            param.data = tensor
            param.grad = None
        self.optimizer = slot.optimizer

    def slot_lora(self: SlotHost, slot: AdapterSlot) -> LoraAdapter:
        """The slot as a decoder `LoraAdapter` for `generate_with_adapters`; it aliases the
        slot's tensors, so it follows the slot's training without being rebuilt."""
        active = [param.data for param in self.params]
        try:
            for param, tensor in zip(self.params, slot.tensors, strict=True):
                param.data = tensor
            return LoraAdapter.from_peft(self.model)
        finally:
            for param, tensor in zip(self.params, active, strict=True):
                param.data = tensor

    def generate_with_adapters(
        self: SlotHost,
        prompts: Sequence[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float | None,
        adapters: Sequence[LoraAdapter | str],
        adapter_index: Sequence[int],
        seeds: Sequence[int] | None = None,
        on_step: StepCallback | None = None,
        temperatures: Sequence[float] | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> list[Completion]:
        """Completions of prompt i under adapters[adapter_index[i]], all in one batch over the frozen base.

        An adapter is a `LoraAdapter` (e.g. `LoraAdapter.from_state_dict` of a checkpoint's adapter.safetensors)
        or the name of one of this peft model's adapters. temperature None decodes greedily (no log-probs).
        With seeds (one per adapter), each adapter's rows sample exactly as a call with that adapter alone and its
        seed would; `temperatures` (one per prompt) stand in for `temperature`; `prompt_cache`: `generate`'s.
        """
        if not self.fast_decoder():
            raise ModelError("Per-row adapters need the fast decoder, which does not support "
                             f"{unsupported_reason(self.model.config)}.")
        resolved = [LoraAdapter.from_peft(self.model, a) if isinstance(a, str) else a for a in adapters]
        rows = self.decode_rows(
            prompts, n, max_new_tokens, temperature, on_step, adapters=resolved, adapter_index=adapter_index,
            seeds=seeds, temperatures=temperatures, prompt_cache=prompt_cache,
        )
        return [Completion(self.decode(r.tokens), r.tokens, r.logprobs, r.finished) for r in rows]
