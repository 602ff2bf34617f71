"""The decoder's model: a llama/qwen2 forward over an HF model's weights, for batched decoding.

`DecodeModel` copies an HF model's weights (q/k/v and gate/up fused, one
LoRA adapter merged or none, cast to the decoding dtype) and runs two
forwards over them: `prefill` (prompts packed into one sequence, their K/V
written into a `KVCache`) and `step` (one token for each row still
writing). RMSNorm, rotary embedding, grouped-query attention, SwiGLU MLP,
tied or separate LM head and q/k/v biases follow HF's modules and are
tested against HF's forward on tiny llama and qwen2 models
(tests/engine/test_decode.py). On the CPU in fp32 the step's weights are
reordered once for oneDNN (`can_pack`, `pack_weight`, `matmul`).
`engine.backends.decode` drives it; docs/backends.md explains the choices.

Tests: .venv/bin/python -m pytest tests/engine/test_decode.py -q
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.backends.decode_shapes import FUSED

if TYPE_CHECKING:
    from engine.backends.kv_cache import KVCache
    from engine.backends.lora import LoraAdapter, LoraStep

log = logging.getLogger(__name__)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options: Any) -> torch.Tensor:
    """`F.scaled_dot_product_attention`, through its math kernel where torch's fused CPU kernel cannot take bf16.

    The fused kernel packs bf16 for VNNI, which torch does only with its AVX512 kernels: on a CPU without them,
    or with ATEN_CPU_CAPABILITY capping them (default, avx2), it raised "pack_vnni2 is only supported when avx512
    is supported" while `grpo.precision` auto still picked bf16 (oneDNN's matmuls choose their own kernels)."""
    if query.device.type == "cpu" and _bf16(query) and not _avx512_kernels():
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(query, key, value, **options)
    return F.scaled_dot_product_attention(query, key, value, **options)


def _bf16(query: torch.Tensor) -> bool:
    """The attention runs in bf16: its inputs are, or CPU autocast turns them to bf16 (the training step)."""
    return query.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                             and torch.get_autocast_dtype("cpu") == torch.bfloat16)


def _avx512_kernels() -> bool:
    return torch.backends.cpu.get_cpu_capability() == "AVX512"

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
# Rope types whose frequencies do not depend on the sequence length, so one table serves every step.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def unsupported_reason(config: Any) -> str | None:
    """Why this decoder cannot run a model with this HF config, or None when it can."""
    kind = getattr(config, "model_type", "?")
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model type {kind!r} (the fast decoder covers {', '.join(SUPPORTED_MODEL_TYPES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") not in STATIC_ROPE_TYPES:
        return f"rope type {rope.get('rope_type')!r}"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window attention"
    return None


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `DecodeModel` reorders its matmul weights for oneDNN here (CPU, fp32, oneDNN built in).

    bf16 and CUDA keep `F.linear` (docs/backends.md, "The torch decoder", says what was measured).
    """
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and bool(torch.backends.mkldnn.enabled))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] reordered into oneDNN's blocked layout (a new tensor, usable by `matmul` only)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias, for a plain weight or one from `pack_weight` (x 2-D)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm: normalise in fp32, cast back, then scale.

    In fp32 torch's fused kernel gives the same numbers in one op instead of
    five (tested against HF's forward). Other dtypes follow HF op for op (it
    scales after the cast back).
    """
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rope_rolled(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`_rope` with the sign folded into the sine table (`_signed`): the same products, fewer ops.

    For a decode step's few rows; the prompt pass keeps `_rope` (docs/backends.md).
    """
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def _signed(sin: torch.Tensor) -> torch.Tensor:
    """The sine table with its first half negated: rotate_half(x) * sin == x.roll(half) * _signed(sin)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


@dataclass
class _Block:
    norm1: torch.Tensor
    norm2: torch.Tensor
    mats: dict[str, tuple[torch.Tensor, torch.Tensor | None]]  # FUSED kind -> (weight [out, in], bias)


class DecodeModel:
    """Inference weights of a llama/qwen2 HF model (a PeftModel too), in `dtype`, with one adapter merged or none.

    Built per call of generate/greedy (the weights change every round) and
    dropped afterwards: it holds the merged, cast weights; the model's own
    parameters are never touched.
    """

    def __init__(self, model: Any, dtype: torch.dtype, merge: LoraAdapter | None = None,
                 packed: bool | None = None) -> None:
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = lm.config
        reason = unsupported_reason(config)
        if reason is not None:
            raise ValueError(f"The fast decoder does not support {reason}.")
        self.dtype = dtype
        self.eps = float(config.rms_norm_eps)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.rotary = lm.model.rotary_emb
        self.device = lm.model.embed_tokens.weight.device
        with torch.no_grad():
            embed, head = lm.model.embed_tokens.weight.detach(), _base(lm.lm_head).weight.detach()
            self.embed = embed.to(dtype)
            self.lm_head = self.embed if head.data_ptr() == embed.data_ptr() else head.to(dtype)  # tied: one copy
            self.norm = lm.model.norm.weight.detach().to(dtype)
            self.blocks = [self._block(index, layer, dtype, merge) for index, layer in enumerate(lm.model.layers)]
            # None: where `can_pack` says so. A tied head then gets its own packed copy (the embedding
            # lookup needs the plain one).
            self.packed = can_pack(self.device, dtype) if packed is None else packed
        self._explicit = packed is not None
        # The reorder waits for the first decode step: the prompt pass, thousands of rows a matmul, runs on
        # the plain weights, the steps with a few rows on the reordered ones (docs/backends.md).
        self.pending = self.packed
        self._cos = self._sin = torch.empty(0)

    def reorder(self) -> None:
        """Reorders the weights for oneDNN (once; `step` calls it), block by block, each plain copy freed as its
        reordered one is made.

        When oneDNN cannot reorder them, decoding goes on with plain matmuls
        (a warning), unless `packed=True` was asked for: then the error stands.
        """
        if not self.pending:
            return
        self.pending = False
        with torch.no_grad():
            try:
                self.lm_head = pack_weight(self.lm_head)
                for block in self.blocks:
                    block.mats = {kind: (pack_weight(weight), bias) for kind, (weight, bias) in block.mats.items()}
            except RuntimeError as exc:  # a oneDNN build that cannot reorder these shapes
                if self._explicit:
                    raise
                # Weights reordered before the failure stay so: `matmul` takes either kind.
                log.warning("Decoding with plain matmuls: oneDNN could not reorder the weights (%s).", exc)
                self.packed = False

    @staticmethod
    def _block(index: int, layer: Any, dtype: torch.dtype, merge: LoraAdapter | None) -> _Block:
        mats = {}
        for kind, names in FUSED.items():
            bases = []
            for name in names:
                module = getattr(layer.self_attn if name in FUSED["qkv"] + FUSED["o"] else layer.mlp, name)
                if getattr(module, "merged", False):
                    raise RuntimeError(f"layers.{index}.{name} has an adapter merged in; unmerge it first.")
                bases.append(_base(module))
            deltas = [merge.weights.get(f"layers.{index}.{name}") if merge is not None else None for name in names]
            weights = [b.weight.detach() for b in bases]
            if any(d is not None for d in deltas):
                # W + scaling * B @ A, in the training dtype (then cast), written straight into the fused copy.
                fused = weights[0].new_empty(sum(w.shape[0] for w in weights), weights[0].shape[1])
                row = 0
                for weight, delta in zip(weights, deltas, strict=True):
                    part = fused[row : row + weight.shape[0]]
                    if delta is None:
                        part.copy_(weight)
                    else:
                        lora_a, lora_b, scaling = delta
                        torch.addmm(weight, lora_b.to(fused.dtype), lora_a.to(fused.dtype), alpha=scaling, out=part)
                    row += weight.shape[0]
            else:
                fused = weights[0] if len(weights) == 1 else torch.cat(weights)
            bias = None
            if any(b.bias is not None for b in bases):
                bias = torch.cat([b.bias.detach() if b.bias is not None else w.new_zeros(w.shape[0]) for b,
                                  w in zip(bases, weights, strict=True)])
            mats[kind] = (fused.to(dtype), None if bias is None else bias.to(dtype))
        return _Block(layer.input_layernorm.weight.detach().to(dtype),
                      layer.post_attention_layernorm.weight.detach().to(dtype), mats)

    @property
    def slot_bytes(self) -> int:
        """KV cache bytes per token position (all layers, keys and values)."""
        return len(self.blocks) * 2 * self.kv_heads * self.head_dim * self.embed.element_size()

    def rope_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [positions, head_dim] from the model's own rotary module (its rope type and scaling)."""
        if self._cos.shape[0] < length:
            positions = torch.arange(max(length, 2 * self._cos.shape[0]), device=self.device)[None]
            cos, sin = self.rotary(torch.zeros(1, device=self.device), positions)
            self._cos, self._sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        return self._cos, self._sin

    def _linear(self, block: _Block, kind: str, x: torch.Tensor, lora: LoraStep | None, index: int) -> torch.Tensor:
        weight, bias = block.mats[kind]
        y = matmul(x, weight, bias)
        return y if lora is None else lora.add(index, kind, x, y)

    def prefill(self, prompts: list[list[int]], groups: list[int], shared: list[tuple[int, int]], cache: KVCache,
                lora: LoraStep | None) -> torch.Tensor:
        """Runs prompts packed into one sequence (no padding), writes their K/V into cache groups `groups`.

        The matmuls see all the prompts' tokens at once (a tall GEMM runs
        faster than one per prompt); attention stays within each prompt.
        shared[i] = (group, k): prompt i's first k tokens are those of an
        earlier group (the same adapter), already written in this layer or
        an earlier prefill; their K/V are copied, not recomputed. Returns
        each prompt's last-position logits [prompts, vocab].
        """
        lengths = [len(p) - k for p, (_, k) in zip(prompts, shared, strict=True)]
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        cos, sin = self.rope_table(max(len(p) for p in prompts))
        positions = torch.cat([torch.arange(k, len(p), device=self.device) for p,
                               (_, k) in zip(prompts, shared, strict=True)])
        cos, sin = cos[positions][:, None], sin[positions][:, None]
        x = F.embedding(torch.tensor([t for p, (_, k) in zip(prompts, shared, strict=True) for t in p[k:]],
                                     device=self.device), self.embed)
        tokens = x.shape[0]
        # A prompt with a known prefix attends to it and causally to its own tokens; the mask is additive
        # (0 or -inf) and made once for all layers.
        causal = [
            None if known == 0
            else torch.zeros(length, known + length, dtype=self.dtype, device=self.device).masked_fill_(
                torch.arange(known + length, device=self.device)[None, :] > torch.arange(known, known + length,
                                                                                         device=self.device)[:, None],
                float("-inf"))
            for length, (_, known) in zip(lengths, shared, strict=True)
        ]
        for index, block in enumerate(self.blocks):
            h = _rms(x, block.norm1, self.eps)
            q, k, v = self._linear(block, "qkv", h, lora, index).split(
                [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
            )
            q = _rope(q.view(tokens, self.heads, self.head_dim), cos, sin).transpose(0, 1)
            k = _rope(k.view(tokens, self.kv_heads, self.head_dim), cos, sin).transpose(0, 1)
            v = v.view(tokens, self.kv_heads, self.head_dim).transpose(0, 1)
            # Heads side by side per token, as the output projection reads them: no copy after attention.
            out = q.new_empty(tokens, self.heads, self.head_dim)
            attn = out.transpose(0, 1)
            keys, values = cache.keys[index], cache.values[index]
            for group, start, length, (parent, known), mask in zip(groups, starts, lengths, shared, causal,
                                                                   strict=True):
                # A prompt's columns start at its group's offset, its run's first column (see KVCache).
                end, full, at = start + length, known + length, cache.offset_list[group]
                keys[group, :, at + known : at + full] = k[:, start:end]
                values[group, :, at + known : at + full] = v[:, start:end]
                if known == 0:
                    attn[:, start:end] = attention(
                        q[None, :, start:end], k[None, :, start:end], v[None, :, start:end], is_causal=True,
                        enable_gqa=True
                    )[0]
                    continue
                source = cache.offset_list[parent]
                keys[group, :, at : at + known] = keys[parent, :, source : source + known]
                values[group, :, at : at + known] = values[parent, :, source : source + known]
                attn[:, start:end] = attention(
                    q[None, :, start:end], keys[None, group, :, at : at + full], values[None, group, :, at : at + full],
                    attn_mask=mask, enable_gqa=True,
                )[0]
            x += self._linear(block, "o", out.view(tokens, -1), lora, index)
            h = _rms(x, block.norm2, self.eps)
            gate, up = self._linear(block, "gate_up", h, lora, index).chunk(2, dim=-1)
            x += self._linear(block, "down", F.silu(gate, inplace=True).mul_(up), lora, index)
        last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths, strict=True)], device=self.device)
        return matmul(_rms(x.index_select(0, last), self.norm, self.eps), self.lm_head, None)

    def step(self, tokens: torch.Tensor, cache: KVCache, lora: LoraStep | None) -> torch.Tensor:
        """One token for each computed row (cache.rows); returns logits [rows, vocab]."""
        self.reorder()
        rows = tokens.shape[0]
        cos, sin = self.rope_table(int(cache.max_position) + 1)
        cos, sin = cos[cache.positions][:, None], _signed(sin[cache.positions][:, None])
        groups, n, g = cache.keys[0].shape[0], cache.n, self.heads // self.kv_heads
        buckets = cache.buckets()
        mask = cache.mask()
        # Additive masks (0 or -inf), made once a step: given a boolean mask, attention converts it in every layer.
        masks = [torch.zeros(part.shape, dtype=self.dtype, device=self.device).masked_fill_(~part, float("-inf"))
                 for part in (mask[first:last, :, :, start:] for first, last, start in buckets)]
        x = F.embedding(tokens, self.embed)
        qk_width = (self.heads + self.kv_heads) * self.head_dim
        for index, block in enumerate(self.blocks):
            h = _rms(x, block.norm1, self.eps)
            qkv = self._linear(block, "qkv", h, lora, index)
            # Queries and keys rotated in one go: [rows, heads + kv_heads, dim].
            qk = _rope_rolled(qkv[:, :qk_width].view(rows, self.heads + self.kv_heads, self.head_dim), cos, sin)
            q, k, v = qk[:, : self.heads], qk[:, self.heads :], qkv[:, qk_width:]
            cache.keys[index].view(-1, self.head_dim).index_copy_(0, cache.slot_index, k.reshape(-1, self.head_dim))
            cache.values[index].view(-1, self.head_dim).index_copy_(0, cache.slot_index, v.reshape(-1, self.head_dim))
            # Queries of a group side by side: [groups, kv_heads, n * g, dim], one attention call for all.
            q = q.view(rows, self.kv_heads, g, self.head_dim)
            if cache.slots is not None:
                q = q.new_zeros(groups * n, self.kv_heads, g, self.head_dim).index_copy_(0, cache.slots, q)
            q = q.view(groups, n, self.kv_heads, g, self.head_dim).transpose(1, 2).reshape(groups, self.kv_heads, n * g,
                                                                                           self.head_dim)
            width, keys, values = cache.width, cache.keys[index], cache.values[index]
            # By bucket of groups with prompts of similar length, each from its longest prompt's first column.
            parts = [
                attention(
                    q[first:last], keys[first:last, :, start:width], values[first:last, :, start:width],
                    attn_mask=part_mask
                )
                for (first, last, start), part_mask in zip(buckets, masks, strict=True)
            ]
            attn = parts[0] if len(parts) == 1 else torch.cat(parts)
            attn = attn.view(groups, self.kv_heads, n, g, self.head_dim).transpose(1, 2).reshape(groups * n, -1)
            if cache.slots is not None:
                attn = attn.index_select(0, cache.slots)
            x += self._linear(block, "o", attn, lora, index)
            h = _rms(x, block.norm2, self.eps)
            gate, up = self._linear(block, "gate_up", h, lora, index).chunk(2, dim=-1)
            x += self._linear(block, "down", F.silu(gate, inplace=True).mul_(up), lora, index)
        return matmul(_rms(x, self.norm, self.eps), self.lm_head, None)


def _base(module: Any) -> Any:
    """The frozen linear under a peft LoRA layer, or the module itself."""
    return getattr(module, "base_layer", module)
