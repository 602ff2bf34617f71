"""What the decoder's KV cache and LoRA steps need to know of a `DecodeModel`, and the fused matmuls' names.

engine/backends/decode_model.py builds the model; kv_cache.py and lora.py take
any object of this shape, so neither imports decode_model and the three
modules form no import cycle, type-only imports included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

# The fused matmuls of a block and the projections each one concatenates (in output order).
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}


class DecodeBlock(Protocol):
    @property
    def mats(self) -> Mapping[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """FUSED kind -> (weight [out, in], bias)."""
        ...


class DecodeShape(Protocol):
    """A decoder model's shape and placement: its blocks, heads, dtype and device."""

    @property
    def blocks(self) -> Sequence[DecodeBlock]: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def device(self) -> torch.device: ...
