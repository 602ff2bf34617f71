"""Batched decoding for llama-family models that wastes nothing (CPU and CUDA).

`TorchBackend.generate` and `greedy` run on this; HF `generate` stays as the
fallback for architectures it does not cover (`unsupported_reason`). What it
does differently from HF `generate`, each for a measured reason
(docs/results.md, "Rollout speed"):

- **Finished rows leave the batch.** A step's matmuls run only on the rows
  still writing, so a step costs what is still being written.
- **Each prompt's KV cache is stored once**, however many completions it
  has. A prompt and its n completions are one group:
  `[groups, kv_heads, prompt_max + n * max_new_tokens, head_dim]`, the
  prompt before column prompt_max and the completions' tokens interleaved
  after it (column `prompt_max + step * n + row`), so every step attends to
  one contiguous range of the buffer. The buffer is preallocated: nothing
  is copied per step. Groups whose rows have all finished are dropped when
  half of them are.
- **Prompts of similar length attend together.** Groups sit in the cache
  by prompt length, in runs of similar length (`_partition`); a step
  attends run by run, each from its own first column, so short prompts do
  not read a long one's padding (`_Cache`).
- **One uniform per row per step**, from a generator per row whose seed is
  drawn from torch's global RNG (or from the caller's seed per adapter),
  and inverse-CDF sampling. A row's completion therefore depends on the
  seed and its place in the call only: not on which other rows are still
  running, nor on the batch's split into cache-sized chunks.
  `torch.multinomial` over the whole vocabulary drew 64 x 49152 random
  numbers a step, and cost more than the model's matmuls here.
- **On the CPU in fp32 the decode steps run on weights reordered once for
  oneDNN** (`packed`), whose linear on them skips the per-call work the
  default BLAS path repeats on every call, most of the time when few rows
  are left. On a 2-core EPYC with the model's own shapes
  (bench/matmul_layout.py, four runs): 1.8-2.5x at 5 rows, 1.0-1.8x at 27
  and 64; end to end 1.3x for sampling and for greedy evaluation
  (docs/results.md, "Rollout speed"). The prompt pass runs before the
  reorder, on the plain weights: at 2,048 rows the reordered ones were
  0.91-1.07x as fast, and the 27-question evaluation took 0.96x the time
  with its prompt pass on the plain ones. Results agree with `F.linear` to
  float rounding (tested).
- **Rows may use different LoRA adapters** over one frozen base: the base
  matmul runs once for all rows, each adapter's low-rank delta on its own
  rows (`LoraAdapter`, a per-prompt adapter index). docs/backends.md
  documents the interface.

The forward (RMSNorm, rotary embedding, grouped-query attention, SwiGLU MLP,
tied or separate LM head, q/k/v biases) reads the HF module weights and is
tested against the HF forward on tiny llama and qwen2 models
(tests/engine/test_decode.py). Behaviour log-probs are log p(token) of the
tempered distribution, as before.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

__all__ = ["DecodeModel", "DecodedRow", "LoraAdapter", "can_pack", "decode_batch", "unsupported_reason"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
# Rope types whose frequencies do not depend on the sequence length, so one table serves every step.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The fused matmuls of a block and the projections each one concatenates (in output order).
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}
# KV cache per chunk of prompts. The default round (8 prompts x 8 completions, 48 tokens) fits in one
# chunk in fp32. Greedy evaluation is most of the reason for the size: every chunk decodes until its
# longest answer ends, and each step reads all the weights, so fewer chunks mean fewer steps. The 108
# held-out prompts take 2 chunks here (4 at 512 MiB: 0.84-0.97x the time in four runs, bench/eval_cache.py),
# and the evaluation's peak RSS, 2.67-2.80 GB, is near a training round's 2.61-2.69 GB (docs/results.md).
# HF generate held 64 copies of each prompt.
CACHE_BYTES = 1024 * 2**20
MAX_ROWS = 256
PREFILL_TOKENS = 2048  # prompt tokens per packed prefill forward (activations stay in the tens of MB)
# A decode step's extra attention call for another bucket of prompt lengths costs about what reading
# this many more cache columns of one group does (about 25 us against 93 ns on the dev machine).
BUCKET_CALL_COLUMNS = 300
COLUMN_ALIGN = 16  # a bucket's first cache column is a multiple of this (see _Cache)
SAMPLING_BLOCK = 256  # inverse-CDF sampling picks a block of the vocabulary, then a token in it
_LAYER_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)$")

StepCallback = Callable[[int, int], None]


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


@dataclass(frozen=True)
class DecodedRow:
    """One completion: its tokens (the EOS included when it finished), their log-probs, finished or cut."""

    tokens: list[int]
    logprobs: list[float]  # empty for greedy decoding
    finished: bool


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
        """From peft's saved names (`...layers.0.self_attn.q_proj.lora_A.weight`), e.g. a checkpoint's adapter.safetensors."""
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


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `DecodeModel` reorders its matmul weights for oneDNN here (CPU, fp32, oneDNN built in).

    bf16 keeps `F.linear`: on an EPYC with native bf16, the reordered weights ran the model's decode-step
    matmuls 1.1-1.9x as fast in isolation, but whole rounds and evaluations took the same time within
    this machine's noise (0.99x and 0.96x, alternated, identical tokens), so the extra copy of the LM head
    was not worth it (docs/results.md, "Rollout speed").
    """
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] reordered into oneDNN's blocked layout (a new tensor, usable by `_matmul` only)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def _matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias, for a plain weight or one from `_pack` (x 2-D)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm: normalise in fp32, cast back, then scale.

    In fp32 torch's fused kernel gives the same numbers (bit for bit on the
    dev machine) in one op instead of five; a decode step runs 61 of them.
    Other dtypes follow HF op for op (it scales after the cast back).
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

    Faster for a decode step's few rows; slower than `_rope` for a prompt
    pass's thousands (measured on the dev machine), so the prompt pass keeps `_rope`.
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
    dropped afterwards: like the old `_inference` copy, it holds the merged,
    cast weights; the model's own parameters are never touched.
    """

    def __init__(self, model: Any, dtype: torch.dtype, merge: LoraAdapter | None = None, packed: bool | None = None) -> None:
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
            # None: wherever it is measured to help. A tied head then gets its own packed copy (+113 MB for
            # the 135M model, about 4% of a round's peak); the embedding lookup needs the plain one.
            self.packed = can_pack(self.device, dtype) if packed is None else packed
        self._explicit = packed is not None
        # The reorder waits for the first decode step: the prompt pass, thousands of rows a matmul, runs
        # faster on the plain weights (MKL's sgemm: 184 against 164 GFLOP/s on the dev machine at 2,048
        # rows), a step with a few rows faster on the reordered ones (docs/results.md, "Rollout speed").
        self.pending = self.packed
        self._cos = self._sin = torch.empty(0)

    def reorder(self) -> None:
        """Reorders the weights for oneDNN (once; `step` calls it), block by block, each plain copy freed as its reordered one is made.

        When oneDNN cannot reorder them, decoding goes on with plain matmuls
        (a warning), unless `packed=True` was asked for: then the error stands.
        """
        if not self.pending:
            return
        self.pending = False
        with torch.no_grad():
            try:
                self.lm_head = _pack(self.lm_head)
                for block in self.blocks:
                    block.mats = {kind: (_pack(weight), bias) for kind, (weight, bias) in block.mats.items()}
            except RuntimeError as exc:  # a oneDNN build that cannot reorder these shapes
                if self._explicit:
                    raise
                # Weights reordered before the failure stay so: `_matmul` takes either kind.
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
                bias = torch.cat([b.bias.detach() if b.bias is not None else w.new_zeros(w.shape[0]) for b, w in zip(bases, weights, strict=True)])
            mats[kind] = (fused.to(dtype), None if bias is None else bias.to(dtype))
        return _Block(layer.input_layernorm.weight.detach().to(dtype), layer.post_attention_layernorm.weight.detach().to(dtype), mats)

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

    def _linear(self, block: _Block, kind: str, x: torch.Tensor, lora: _LoraStep | None, index: int) -> torch.Tensor:
        weight, bias = block.mats[kind]
        y = _matmul(x, weight, bias)
        return y if lora is None else lora.add(index, kind, x, y)

    def prefill(self, prompts: list[list[int]], groups: list[int], shared: list[tuple[int, int]], cache: _Cache,
                lora: _LoraStep | None) -> torch.Tensor:
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
        positions = torch.cat([torch.arange(k, len(p), device=self.device) for p, (_, k) in zip(prompts, shared, strict=True)])
        cos, sin = cos[positions][:, None], sin[positions][:, None]
        x = F.embedding(torch.tensor([t for p, (_, k) in zip(prompts, shared, strict=True) for t in p[k:]], device=self.device), self.embed)
        tokens = x.shape[0]
        # A prompt with a known prefix attends to it and causally to its own tokens; the mask is additive
        # (0 or -inf) and made once for all layers.
        causal = [
            None if known == 0 else torch.zeros(length, known + length, dtype=self.dtype, device=self.device).masked_fill_(
                torch.arange(known + length, device=self.device)[None, :] > torch.arange(known, known + length, device=self.device)[:, None],
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
            for group, start, length, (parent, known), mask in zip(groups, starts, lengths, shared, causal, strict=True):
                # A prompt's columns start at its group's offset, its run's first column (see _Cache).
                end, full, at = start + length, known + length, cache.offset_list[group]
                keys[group, :, at + known : at + full] = k[:, start:end]
                values[group, :, at + known : at + full] = v[:, start:end]
                if known == 0:
                    attn[:, start:end] = F.scaled_dot_product_attention(
                        q[None, :, start:end], k[None, :, start:end], v[None, :, start:end], is_causal=True, enable_gqa=True
                    )[0]
                    continue
                source = cache.offset_list[parent]
                keys[group, :, at : at + known] = keys[parent, :, source : source + known]
                values[group, :, at : at + known] = values[parent, :, source : source + known]
                attn[:, start:end] = F.scaled_dot_product_attention(
                    q[None, :, start:end], keys[None, group, :, at : at + full], values[None, group, :, at : at + full],
                    attn_mask=mask, enable_gqa=True,
                )[0]
            x += self._linear(block, "o", out.view(tokens, -1), lora, index)
            h = _rms(x, block.norm2, self.eps)
            gate, up = self._linear(block, "gate_up", h, lora, index).chunk(2, dim=-1)
            x += self._linear(block, "down", F.silu(gate, inplace=True).mul_(up), lora, index)
        last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths, strict=True)], device=self.device)
        return _matmul(_rms(x.index_select(0, last), self.norm, self.eps), self.lm_head, None)

    def step(self, tokens: torch.Tensor, cache: _Cache, lora: _LoraStep | None) -> torch.Tensor:
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
            q = q.view(groups, n, self.kv_heads, g, self.head_dim).transpose(1, 2).reshape(groups, self.kv_heads, n * g, self.head_dim)
            width, keys, values = cache.width, cache.keys[index], cache.values[index]
            # By bucket of groups with prompts of similar length, each from its longest prompt's first column.
            parts = [
                F.scaled_dot_product_attention(
                    q[first:last], keys[first:last, :, start:width], values[first:last, :, start:width], attn_mask=part_mask
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
        return _matmul(_rms(x, self.norm, self.eps), self.lm_head, None)


def _base(module: Any) -> Any:
    """The frozen linear under a peft LoRA layer, or the module itself."""
    return getattr(module, "base_layer", module)


class _Cache:
    """The KV cache of one chunk: per layer [groups, kv_heads, prompt_max + n * max_new, head_dim].

    The completions' tokens begin at column prompt_max. Groups are ordered by
    prompt length (the caller's job) and split into buckets of similar
    length (`_partition`); each prompt starts at its bucket's first column,
    so a decode step attends bucket by bucket from that column on and skips
    most of the padding a short prompt beside a long one would cost. Those
    first columns are multiples of COLUMN_ALIGN, as column 0 is: a prompt's
    columns then fall on the same vector lanes as in one unpadded forward,
    and the sums round as they did when every prompt started at column 0.
    """

    def __init__(self, model: DecodeModel, prompt_lengths: list[int], n: int, max_new: int) -> None:
        if any(a > b for a, b in itertools.pairwise(prompt_lengths)):
            raise ValueError("the cache's groups must be ordered by prompt length")
        self.n, self.prompt_max, self.tail = n, max(prompt_lengths), n * max_new // 2
        self.offset_list = [0] * len(prompt_lengths)
        for first, last in _partition(prompt_lengths, self.tail):
            start = (self.prompt_max - prompt_lengths[last - 1]) // COLUMN_ALIGN * COLUMN_ALIGN
            self.offset_list[first:last] = [start] * (last - first)
        self._buckets: list[tuple[int, int, int]] | None = None
        shape = (len(prompt_lengths), model.kv_heads, self.prompt_max + n * max_new, model.head_dim)
        # Zeros, not empty: masked columns still enter the attention product, and 0 * NaN is NaN.
        self.keys = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in model.blocks]
        self.values = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in model.blocks]
        self.lengths = torch.tensor(prompt_lengths, device=model.device)
        self.query_row = torch.arange(n * (model.heads // model.kv_heads), device=model.device) // (model.heads // model.kv_heads)
        self.step = 0
        self.slots: torch.Tensor | None = None
        self.positions = self.slot_index = torch.empty(0, dtype=torch.long)
        self.max_position = 0

    def place(self, slots: list[int], step: int) -> None:
        """The computed rows' slots (group * n + row) for the token fed at `step` (>= 1)."""
        self.step = step
        device = self.lengths.device
        all_slots = slots == list(range(self.keys[0].shape[0] * self.n))
        index = torch.tensor(slots, device=device)
        self.slots = None if all_slots else index
        group_of_row = index // self.n
        column = self.prompt_max + (step - 1) * self.n + index % self.n
        self.positions = self.lengths[group_of_row] + (step - 1)
        # Where each row's key (and value) of each kv head goes, as a row of the cache viewed as [-1, head_dim].
        heads, columns = self.keys[0].shape[1:3]
        head = torch.arange(heads, device=device)
        self.slot_index = ((group_of_row[:, None] * heads + head) * columns + column[:, None]).view(-1)
        self.max_position = self.prompt_max + step

    @property
    def width(self) -> int:
        return self.prompt_max + self.step * self.n

    def buckets(self) -> list[tuple[int, int, int]]:
        """(first group, end group, first column) of each bucket, as `_partition` splits the live groups."""
        if self._buckets is None:
            widths = [self.prompt_max - offset for offset in self.offset_list]
            # Offsets fall as prompts lengthen: a bucket's first column is its last group's.
            self._buckets = [(first, last, self.offset_list[last - 1]) for first, last in _partition(widths, self.tail)]
        return self._buckets

    def mask(self) -> torch.Tensor:
        """[groups, 1, n * g, width]: each query sees its prompt and its own row's tokens so far."""
        device = self.lengths.device
        columns = torch.arange(self.prompt_max, device=device)[None, :]
        offsets = torch.tensor(self.offset_list, device=device)[:, None]
        prompt = (columns >= offsets) & (columns < offsets + self.lengths[:, None])
        own = (torch.arange(self.step * self.n, device=device) % self.n)[None, :] == self.query_row[:, None]
        groups, queries = prompt.shape[0], own.shape[0]
        return torch.cat(
            [prompt[:, None, None, :].expand(groups, 1, queries, self.prompt_max), own[None, None].expand(groups, 1, queries, own.shape[1])],
            dim=-1,
        )

    def keep_groups(self, keep: list[int]) -> None:
        """Keeps these groups (in this order: keep them ordered by prompt length) and drops the others."""
        index = torch.tensor(keep, device=self.lengths.device)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.lengths = self.lengths.index_select(0, index)
        self.offset_list = [self.offset_list[i] for i in keep]
        self._buckets = None


def _partition(widths: list[int], tail: int) -> list[tuple[int, int]]:
    """Splits groups ordered by width into runs (first, end) that attention reads in the fewest columns.

    A run costs its groups times (its widest prompt + tail, the
    completions' columns at half their final width) plus BUCKET_CALL_COLUMNS
    for its attention call. Dynamic programming over the points where the
    width changes.
    """
    cuts = [i for i in range(1, len(widths)) if widths[i] != widths[i - 1]] + [len(widths)]
    best: dict[int, tuple[float, int]] = {0: (0.0, 0)}  # end -> (cost, first group of its last run)
    for end in cuts:
        best[end] = min(
            (best[first][0] + (end - first) * (widths[end - 1] + tail) + BUCKET_CALL_COLUMNS, first)
            for first in (0, *cuts) if first < end
        )
    runs = []
    end = len(widths)
    while end > 0:
        first = best[end][1]
        runs.append((first, end))
        end = first
    return runs[::-1]


class _AdapterStack:
    """Per (layer, fused kind): every adapter's A [N, in, r] and scaled B [N, r, out], zero-padded to one rank."""

    def __init__(self, model: DecodeModel, adapters: Sequence[LoraAdapter], out_sizes: dict[str, list[int]]) -> None:
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
                lora_b = torch.zeros(self.count, sum(ranks), sum(out_sizes[kind]), dtype=model.dtype, device=model.device)
                for number, adapter in enumerate(adapters):
                    r0 = o0 = 0
                    for key, rank, out in zip(keys, ranks, out_sizes[kind], strict=True):
                        if key in adapter.weights:
                            a, b, scaling = adapter.weights[key]
                            lora_a[number, :, r0 : r0 + a.shape[0]] = a.detach().t().to(model.dtype)
                            lora_b[number, r0 : r0 + a.shape[0], o0 : o0 + out] = (b.detach().float() * scaling).t().to(model.dtype)
                        r0, o0 = r0 + rank, o0 + out
                self.mats[(index, kind)] = (lora_a, lora_b)


class _LoraStep:
    """Which adapter each computed row uses, for one forward: rows padded into one bmm per adapter."""

    def __init__(self, stack: _AdapterStack, row_adapter: list[int]) -> None:
        self.stack = stack
        present = sorted(set(row_adapter))
        self.single = present[0] if len(present) == 1 else None
        if self.single is None:
            members = [[r for r, a in enumerate(row_adapter) if a == p] for p in present]
            width = max(len(m) for m in members)
            # The stack's device and dtype (fp32 on the CPU when there are no matrices at all: unused then).
            like = next(iter(stack.mats.values()))[0] if stack.mats else torch.empty(0)
            self.index = torch.tensor([m[i] if i < len(m) else 0 for m in members for i in range(width)], device=like.device)
            self.valid = torch.tensor([[float(i < len(m))] for m in members for i in range(width)], dtype=like.dtype, device=like.device)
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


def _choose(logits: torch.Tensor, temperature: float | None, uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy argmax, or a sample of softmax(logits / T) by inverse CDF with its log-prob."""
    if temperature is None or uniforms is None:
        return logits.argmax(-1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    rows, vocab = probs.shape
    if vocab % SAMPLING_BLOCK:
        probs = F.pad(probs, (0, SAMPLING_BLOCK - vocab % SAMPLING_BLOCK))
    blocks = probs.view(rows, -1, SAMPLING_BLOCK)
    cum = blocks.sum(-1).cumsum(-1)
    target = uniforms * cum[:, -1]
    block = torch.searchsorted(cum, target[:, None], right=True).clamp_(max=cum.shape[1] - 1)
    before = torch.where(block > 0, cum.gather(1, (block - 1).clamp_(min=0)), torch.zeros_like(target[:, None]))
    inside = blocks[torch.arange(rows, device=probs.device), block[:, 0]].cumsum(-1)
    # Float rounding can put the target at or past the block's total; stay on a token with mass.
    rest = torch.minimum(target[:, None] - before, torch.nextafter(inside[:, -1:], torch.zeros_like(inside[:, -1:])))
    token = (block * SAMPLING_BLOCK + torch.searchsorted(inside, rest, right=True).clamp_(max=SAMPLING_BLOCK - 1))[:, 0]
    # log of the softmax, not log_softmax: equal to ~1e-7 for any token that can be drawn, one pass fewer.
    return token, probs.gather(1, token[:, None])[:, 0].log()


def decode_batch(
    model: DecodeModel,
    prompts: Sequence[list[int]],
    n: int,
    max_new_tokens: int,
    eos_token_id: int,
    temperature: float | None,
    on_step: StepCallback | None = None,
    adapters: Sequence[LoraAdapter] = (),
    adapter_index: Sequence[int] | None = None,
    seeds: Sequence[int] | None = None,
    compact: bool = True,
    cache_bytes: int = CACHE_BYTES,
) -> list[DecodedRow]:
    """`n` completions of each prompt (prompt-major order), sampled at `temperature` or greedy (None).

    adapters / adapter_index: prompt i runs with adapters[adapter_index[i]]
    (LoRA over `model`'s weights, which then should be the base's);
    without them every row uses `model` as it is. seeds: one per adapter;
    rows of adapter a then sample from a generator seeded by seeds[a], so
    they get the same tokens as a call with adapter a alone and the same
    seed. Without seeds, rows draw their generators' seeds from torch's
    global RNG. compact=False keeps finished rows computing (to test that
    leaving does not change anything).
    """
    if not prompts:
        return []
    if adapters and (adapter_index is None or len(adapter_index) != len(prompts)):
        raise ValueError("adapter_index must give one adapter per prompt.")
    if adapter_index is not None and any(not 0 <= a < max(1, len(adapters)) for a in adapter_index):
        raise ValueError(f"adapter_index must be in 0..{len(adapters) - 1}.")
    if seeds is not None and len(seeds) != max(1, len(adapters)):
        raise ValueError("seeds must give one seed per adapter.")
    row_adapter = [adapter_index[i] if adapter_index is not None else 0 for i in range(len(prompts)) for _ in range(n)]
    generators: list[torch.Generator | None] = [None] * len(row_adapter)
    if temperature is not None:
        if seeds is None:
            row_seeds = torch.randint(0, 2**62, (len(row_adapter),)).tolist()
        else:
            per = [torch.Generator().manual_seed(int(s)) for s in seeds]
            # The k-th row of adapter a gets its k-th seed, wherever it sits in the call.
            row_seeds = [int(torch.randint(0, 2**62, (1,), generator=per[a])) for a in row_adapter]
        generators = [torch.Generator().manual_seed(int(s)) for s in row_seeds]
    stack = None
    if adapters:
        q_out = model.heads * model.head_dim
        kv_out = model.kv_heads * model.head_dim
        hidden, inter = model.embed.shape[1], model.blocks[0].mats["down"][0].shape[1]
        stack = _AdapterStack(model, adapters, {"qkv": [q_out, kv_out, kv_out], "o": [hidden], "gate_up": [inter, inter], "down": [hidden]})

    # Chunks of prompts whose cache fits the budget, in (adapter, token) order: prompts that share
    # a prefix (the system prompt, a specialty's instructions) sit together and share its prefill.
    order = sorted(range(len(prompts)), key=lambda i: (row_adapter[i * n], prompts[i]))
    chunks: list[list[int]] = []
    for i in order:
        if chunks:
            trial = chunks[-1] + [i]
            width = max(len(prompts[j]) for j in trial) + n * max_new_tokens
            if len(trial) * width * model.slot_bytes <= cache_bytes and len(trial) * n <= MAX_ROWS:
                chunks[-1] = trial
                continue
        chunks.append([i])
    results: list[DecodedRow | None] = [None] * len(row_adapter)
    total = max_new_tokens * len(chunks)
    with torch.inference_mode():
        for number, chunk in enumerate(chunks):
            out = _decode_chunk(
                model, [prompts[i] for i in chunk], n, max_new_tokens, eos_token_id, temperature,
                [row_adapter[i * n] for i in chunk], [generators[i * n + j] for i in chunk for j in range(n)],
                stack, compact, on_step, number * max_new_tokens, total,
            )
            for k, i in enumerate(chunk):
                for j in range(n):
                    results[i * n + j] = out[k * n + j]
    return [r for r in results if r is not None]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two prompts share (the part `decode_batch` computes once)."""
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return common


def _decode_chunk(
    model: DecodeModel, prompts: list[list[int]], n: int, max_new: int, eos: int, temperature: float | None,
    group_adapter: list[int], generators: list[torch.Generator | None], stack: _AdapterStack | None,
    compact: bool, on_step: StepCallback | None, offset: int, total: int,
) -> list[DecodedRow]:
    device = model.device
    # Cache slots in order of prompt length (see _Cache); prompts keep their order for prefix sharing.
    by_length = sorted(range(len(prompts)), key=lambda b: (len(prompts[b]), b))
    slot_of = [0] * len(prompts)
    for slot, b in enumerate(by_length):
        slot_of[b] = slot
    cache = _Cache(model, [len(prompts[b]) for b in by_length], n, max_new)
    # Prompts come sorted by (adapter, tokens): the earlier prompt sharing the longest prefix is the one before.
    shared = [(0, 0)]
    for b in range(1, len(prompts)):
        common = common_prefix(prompts[b - 1], prompts[b]) if group_adapter[b] == group_adapter[b - 1] else 0
        shared.append((b - 1, min(common, len(prompts[b]) - 1)))  # the last token is always run: its logits are needed
    first = []
    packs: list[list[int]] = []  # prompts packed up to PREFILL_TOKENS computed tokens a forward
    for b, prompt in enumerate(prompts):
        if packs and sum(len(prompts[i]) - shared[i][1] for i in packs[-1]) + len(prompt) - shared[b][1] <= PREFILL_TOKENS:
            packs[-1].append(b)
        else:
            packs.append([b])
    for pack in packs:
        if on_step is not None:
            on_step(offset, total)  # pause blocks and stop raises here too: a long prompt set takes a while
        lora = None
        if stack is not None:
            lora = _LoraStep(stack, [group_adapter[b] for b in pack for _ in prompts[b][shared[b][1] :]])
        first.append(model.prefill([prompts[b] for b in pack], [slot_of[b] for b in pack],
                                   [(slot_of[shared[b][0]], shared[b][1]) for b in pack], cache, lora))
    rows = len(prompts) * n
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logprobs: list[list[float]] = [[] for _ in range(rows)]
    finished = [False] * rows
    # Row ids (group * n + j in the original layout) that run this step, in the cache's order.
    computed = [b * n + j for b in by_length for j in range(n)]
    group_slot = list(slot_of)  # original group -> its index in the cache, -1 once dropped
    logits = torch.cat(first).repeat_interleave(n, dim=0)
    if by_length != sorted(by_length):
        logits = logits.index_select(0, torch.tensor(computed, device=device))
    for step in range(max_new):
        if on_step is not None:
            on_step(offset + step, total)
        uniforms = None
        if temperature is not None:
            draws = [torch.rand(1, generator=generators[r]) for r in computed]
            uniforms = torch.cat(draws).to(device)
        chosen, lps = _choose(logits, temperature, uniforms)
        chosen_list = chosen.tolist()
        lps_list = lps.tolist() if lps is not None else None
        for k, r in enumerate(computed):
            if finished[r]:
                continue
            tokens[r].append(chosen_list[k])
            if lps_list is not None:
                logprobs[r].append(lps_list[k])
            finished[r] = chosen_list[k] == eos
        live = [r for r in computed if not finished[r]]
        if not live or step == max_new - 1:
            break
        if compact:
            keep = [k for k, r in enumerate(computed) if not finished[r]]
            computed = live
            live_groups = sorted({r // n for r in live})
            allocated = cache.keys[0].shape[0]
            if len(live_groups) <= allocated // 2:
                live_groups.sort(key=lambda b: group_slot[b])  # the cache's order: by prompt length
                cache.keep_groups([group_slot[b] for b in live_groups])
                group_slot = [-1] * len(group_slot)
                for new, b in enumerate(live_groups):
                    group_slot[b] = new
            feed = chosen if len(keep) == len(chosen_list) else chosen.index_select(0, torch.tensor(keep, device=device))
        else:
            feed = chosen
        cache.place([group_slot[r // n] * n + r % n for r in computed], step + 1)
        lora = _LoraStep(stack, [group_adapter[r // n] for r in computed]) if stack is not None else None
        logits = model.step(feed, cache, lora)
    return [DecodedRow(tokens[r], logprobs[r], finished[r]) for r in range(rows)]
