"""LoRA adapters for the decoder: one merged into its weights, or a different one per row of a batch.

`LoraAdapter` holds an adapter's tensors (from a peft model or a saved
state dict). `AdapterStack` pads every adapter of a call to one rank per
fused matmul, and `LoraStep` adds each row's low-rank delta to the base
matmul's output: the base runs once for all rows, each adapter's delta on
its own rows (one batched matmul). docs/backends.md, "Rows with different
LoRA adapters in one batch", documents the interface.

Tests: .venv/bin/python -m pytest tests/engine/test_decode.py -q -k adapter
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.backends.decode_shapes import FUSED, DecodeShape

_LAYER_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)$")


@dataclass(frozen=True)
class LoraAdapter:
    """One LoRA adapter: per projection, delta W = scaling * B @ A.

    `weights` maps "layers.{i}.{q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj}" to
    (A [rank, in], B [out, rank], scaling). Projections it does not cover add nothing.
    """

    weights: dict[str, tuple[torch.Tensor, torch.Tensor, float]]

    @classmethod
    def from_peft(cls, model: Any, adapter_name: str = "default") -> LoraAdapter:
        """The named adapter of a peft model (its current values; the tensors are shared, not copied)."""
        weights = {}
        for name, module in model.named_modules():
            lora_a = getattr(module, "lora_A", None)
            if lora_a is None or adapter_name not in lora_a:
                continue
            if getattr(module, "use_dora", {}).get(adapter_name) or getattr(module, "lora_bias", {}).get(adapter_name):
                raise ValueError(f"{name}: DoRA and LoRA biases are not supported by the decoder.")
            weights[_layer_key(name)] = (
                lora_a[adapter_name].weight.detach(),
                module.lora_B[adapter_name].weight.detach(),
                float(module.scaling[adapter_name]),
            )
        if not weights:
            raise ValueError(f"The model has no LoRA adapter named {adapter_name!r}.")
        return cls(weights)

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], scaling: float) -> LoraAdapter:
        """From peft's saved names (`...layers.0.self_attn.q_proj.lora_A.weight`), e.g. a checkpoint's
        adapter.safetensors."""
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in state.items():
            match = re.search(r"(.*)\.lora_([AB])(?:\.[^.]+)?\.weight$", name)
            if match is None:
                raise ValueError(f"{name!r} is not a LoRA A or B weight.")
            parts.setdefault(_layer_key(match.group(1)), {})[match.group(2)] = tensor
        if any(set(ab) != {"A", "B"} for ab in parts.values()):
            raise ValueError("Every projection needs both its lora_A and lora_B weight.")
        return cls({key: (ab["A"], ab["B"], float(scaling)) for key, ab in parts.items()})


def _layer_key(module_name: str) -> str:
    match = _LAYER_KEY.search(module_name)
    if match is None:
        raise ValueError(f"LoRA on {module_name!r}: the decoder supports adapters on the blocks' linear layers only.")
    return f"layers.{match.group(1)}.{match.group(2)}"


class AdapterStack:
    """Per (layer, fused kind): every adapter's A [N, in, r] and scaled B [N, r, out], zero-padded to one rank."""

    def __init__(self, model: DecodeShape, adapters: Sequence[LoraAdapter], out_sizes: dict[str, list[int]]) -> None:
        self.count = len(adapters)
        self.mats: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for index in range(len(model.blocks)):
            for kind, names in FUSED.items():
                keys = [f"layers.{index}.{name}" for name in names]
                ranks = [max((a.weights[k][0].shape[0] for a in adapters if k in a.weights), default=0) for k in keys]
                if sum(ranks) == 0:
                    continue
                fan_in = model.blocks[index].mats[kind][0].shape[1]
                lora_a = torch.zeros(self.count, fan_in, sum(ranks), dtype=model.dtype, device=model.device)
                lora_b = torch.zeros(self.count, sum(ranks), sum(out_sizes[kind]), dtype=model.dtype,
                                     device=model.device)
                for number, adapter in enumerate(adapters):
                    r0 = o0 = 0
                    for key, rank, out in zip(keys, ranks, out_sizes[kind], strict=True):
                        if key in adapter.weights:
                            a, b, scaling = adapter.weights[key]
                            lora_a[number, :, r0 : r0 + a.shape[0]] = a.detach().t().to(model.dtype)
                            lora_b[number, r0 : r0 + a.shape[0],
                                   o0 : o0 + out] = (b.detach().float() * scaling).t().to(model.dtype)
                        r0, o0 = r0 + rank, o0 + out
                self.mats[(index, kind)] = (lora_a, lora_b)


class LoraStep:
    """Which adapter each computed row uses, for one forward: rows padded into one bmm per adapter."""

    def __init__(self, stack: AdapterStack, row_adapter: list[int]) -> None:
        self.stack = stack
        present = sorted(set(row_adapter))
        self.single = present[0] if len(present) == 1 else None
        if self.single is None:
            members = [[r for r, a in enumerate(row_adapter) if a == p] for p in present]
            width = max(len(m) for m in members)
            # The stack's device and dtype (fp32 on the CPU when there are no matrices at all: unused then).
            like = next(iter(stack.mats.values()))[0] if stack.mats else torch.empty(0)
            self.index = torch.tensor([m[i] if i < len(m) else 0 for m in members for i in range(width)],
                                      device=like.device)
            self.valid = torch.tensor([[float(i < len(m))] for m in members for i in range(width)], dtype=like.dtype,
                                      device=like.device)
            self.adapters = None if len(present) == stack.count else torch.tensor(present, device=like.device)
            self.groups, self.width = len(present), width

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mats = self.stack.mats.get((layer, kind))
        if mats is None:
            return y
        lora_a, lora_b = mats
        # y is the base matmul's fresh output: the deltas are added in place.
        if self.single is not None:
            return y.add_((x @ lora_a[self.single]) @ lora_b[self.single])
        if self.adapters is not None:
            lora_a, lora_b = lora_a.index_select(0, self.adapters), lora_b.index_select(0, self.adapters)
        xs = x.index_select(0, self.index).view(self.groups, self.width, -1)
        delta = torch.bmm(torch.bmm(xs, lora_a), lora_b).view(self.groups * self.width, -1).mul_(self.valid)
        return y.index_add_(0, self.index, delta)
