"""The trainer's forward: a micro-batch's prompts and completions packed into one sequence, no padding.

`packed_logprobs` computes what `TorchBackend.batch_logprobs_hf` computes
(log p of each completion token, with gradients into the LoRA adapters or
the weights) with a llama/qwen2 forward of its own over the model's own
parameters, so the optimizer, checkpoints and peft names are unchanged.
What it does differently (docs/backends.md, "The training step", has the
measurements, `bench/train_speed.py` the peer):

- **One sequence, no padding.** Each distinct prompt once, then its
  completions' tokens, all packed into one row: the matmuls run on real
  tokens only. The HF pass left-padded the prompts and padded every
  completion to the longest of its micro-batch (a default round computed
  1.5x the tokens it needed, half of them in the LM head).
- **No copies of the prompt's KV cache.** Attention runs per prompt over
  its own columns with an additive mask: the prompt causal, each
  completion on the whole prompt and causally on itself. Gradients from
  every completion reach the prompt's keys and values in place; the HF
  pass copied the cache once per completion and summed the copies back.
- **The LM head never holds [tokens, vocabulary].** `token_logprobs` runs
  the head in chunks of rows, and with the upstream gradient a scalar per
  token it computes d logp / d hidden in the forward (E[target] - p @ E,
  over the temperature): the backward is one multiply. The HF pass kept
  the fp32 logits, their division by the temperature, their log-softmax
  and a concatenation alive for the backward, each [rows, T, 49152].

Every op follows HF's modules (RMSNorm, rotary embedding, grouped-query
attention, SwiGLU, q/k/v biases, peft's `B(A(dropout(x))) * scaling`), in
the same order and under the caller's autocast, and is tested against the
HF pass (tests/engine/test_train_forward.py). Models it does not cover
(`train_unsupported_reason`) train through the HF pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.backends.decode_model import unsupported_reason

# Rows of the LM head per chunk on the CPU ([128, 49152] fp32 is 25 MB). Forward + backward of a round's 329
# completion tokens on the bundled model's head, one thread, CPU s: chunks of 16 rows 1.56, 32 1.11, 64 0.95,
# 128 0.76, all 329 at once 0.79; the HF pass's log-softmax 1.08. A GPU takes bigger chunks (fewer launches).
HEAD_CHUNK = 128
HEAD_CHUNK_GPU = 1024

Pairs = Sequence[tuple[list[int], list[int]]]


def train_unsupported_reason(model: Any) -> str | None:
    """Why `packed_logprobs` cannot run this (peft or HF) model, or None when it can."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    reason = unsupported_reason(lm.config)
    if reason is not None:
        return reason
    if float(getattr(lm.config, "attention_dropout", 0.0) or 0.0) > 0.0:
        return "attention dropout"
    for name, module in lm.named_modules():
        if getattr(module, "lora_embedding_A", None) or (hasattr(module, "lora_A") and not name.endswith("_proj")):
            return f"a LoRA adapter on {name}"
        for adapter in getattr(module, "lora_A", {}):
            if module.use_dora.get(adapter) or getattr(module, "lora_bias", {}).get(adapter):
                return "DoRA or LoRA biases"
    return None


@dataclass(frozen=True)
class Lora:
    """One active adapter of a projection: delta = B(A(dropout(x))) * scaling, as peft computes it."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float
    dropout: float


@dataclass(frozen=True)
class Projection:
    """A linear layer: its frozen (or trained) weight and bias, and the adapters active on it."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    loras: tuple[Lora, ...]

    @classmethod
    def of(cls, module: Any, training: bool) -> Projection:
        base = getattr(module, "base_layer", module)
        loras: list[Lora] = []
        if hasattr(module, "lora_A") and not module.disable_adapters and not module.merged:
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    dropout = module.lora_dropout[adapter]
                    p = float(dropout.p) if isinstance(dropout, torch.nn.Dropout) and training else 0.0
                    loras.append(Lora(module.lora_A[adapter].weight, module.lora_B[adapter].weight,
                                      float(module.scaling[adapter]), p))
        return cls(base.weight, base.bias, tuple(loras))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        for lora in self.loras:
            z = F.dropout(x, lora.dropout) if lora.dropout > 0 else x
            y = y + F.linear(F.linear(z, lora.a), lora.b) * lora.scaling
        return y


@dataclass(frozen=True)
class Layer:
    norm1: torch.Tensor
    norm2: torch.Tensor
    proj: dict[str, Projection]  # q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj


@dataclass(frozen=True)
class Packing:
    """Where everything sits in the packed sequence of one micro-batch.

    Each distinct prompt is a segment: its tokens, then every completion's
    tokens but the last (the last predicts nothing). Token j of completion
    i is predicted by the hidden state at `rows[k]` (the prompt's last
    token for j = 0), and its log-prob lands at `slots[k]` of the flattened
    [completions, longest completion] result.
    """

    ids: torch.Tensor  # [N] the packed input tokens
    positions: torch.Tensor  # [N] each token's position in its own prompt + completion
    segments: list[tuple[int, int]]  # (start, length) per prompt segment
    allowed: list[torch.Tensor]  # [length, length] bool: which columns each token of a segment attends to
    rows: torch.Tensor  # [M] the hidden state that predicts each completion token
    targets: torch.Tensor  # [M] the completion tokens
    slots: torch.Tensor  # [M] index into the flattened [n, width] result
    shape: tuple[int, int]  # (n completions, longest completion)

    @classmethod
    def of(cls, pairs: Pairs, device: torch.device) -> Packing:
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, (prompt, _) in enumerate(pairs):
            groups.setdefault(tuple(prompt), []).append(index)
        width = max(len(c) for _, c in pairs)
        ids: list[int] = []
        positions: list[int] = []
        owners: list[list[int]] = []
        segments: list[tuple[int, int]] = []
        rows: list[int] = []
        targets: list[int] = []
        slots: list[int] = []
        for prompt, members in groups.items():
            start = len(ids)
            ids.extend(prompt)
            positions.extend(range(len(prompt)))
            owner = [-1] * len(prompt)
            last = len(ids) - 1
            for member in members:
                completion = pairs[member][1]
                first = len(ids)
                ids.extend(completion[:-1])
                positions.extend(range(len(prompt), len(prompt) + len(completion) - 1))
                owner.extend([member] * (len(completion) - 1))
                rows.extend([last, *range(first, first + len(completion) - 1)])
                targets.extend(completion)
                slots.extend(range(member * width, member * width + len(completion)))
            segments.append((start, len(ids) - start))
            owners.append(owner)
        allowed = []
        for owner_list in owners:
            owner = torch.tensor(owner_list, device=device)
            index = torch.arange(len(owner_list), device=device)
            # Causal, and a completion's columns only to itself: the prompt's (owner -1) to everyone after them.
            allowed.append((index[None, :] <= index[:, None]) & ((owner[None, :] == -1) | (owner[None, :] == owner[:, None])))

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return cls(tensor(ids), tensor(positions), segments, allowed, tensor(rows), tensor(targets), tensor(slots),
                   (len(pairs), width))


class TrainModel:
    """A llama/qwen2 model's parameters (a PeftModel's too) seen by the packed forward; no copies.

    Built per call: it reads which adapters are active (peft's
    `disable_adapter()` for the KL reference switches them off) and holds
    the live parameters, so gradients reach them.
    """

    def __init__(self, model: Any) -> None:
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = lm.config
        self.eps = float(config.rms_norm_eps)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.rotary = lm.model.rotary_emb
        self.embed = lm.model.embed_tokens.weight
        # HF's embedding leaves its padding row's gradient at zero (it matters to full fine-tuning only).
        self.padding_idx = lm.model.embed_tokens.padding_idx
        self.norm = lm.model.norm.weight
        self.head = getattr(lm.lm_head, "base_layer", lm.lm_head).weight
        training = bool(model.training)
        self.layers = [
            Layer(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, {
                name: Projection.of(getattr(layer.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp, name), training)
                for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
            })
            for layer in lm.model.layers
        ]

    def hidden(self, packing: Packing, before_layer: Callable[[], None] | None = None) -> torch.Tensor:
        """The final-norm hidden states [N, hidden] of the packed sequence."""
        x = F.embedding(packing.ids, self.embed, self.padding_idx)
        cos, sin = self.rotary(x, packing.positions[None])
        cos, sin = cos[0][:, None], sin[0][:, None]  # [N, 1, head_dim], in x's dtype as HF has them
        masks: dict[torch.dtype, list[torch.Tensor]] = {}
        tokens = x.shape[0]
        for layer in self.layers:
            if before_layer is not None:
                before_layer()
            h = rms_norm(x, layer.norm1, self.eps)
            q = rope(layer.proj["q_proj"](h).view(tokens, self.heads, self.head_dim), cos, sin)
            k = rope(layer.proj["k_proj"](h).view(tokens, self.kv_heads, self.head_dim), cos, sin)
            v = layer.proj["v_proj"](h).view(tokens, self.kv_heads, self.head_dim)
            if q.dtype not in masks:  # additive (0 or -inf), made once per dtype for all layers
                masks[q.dtype] = [torch.zeros(a.shape, dtype=q.dtype, device=a.device).masked_fill_(~a, float("-inf"))
                                  for a in packing.allowed]
            out = []
            for (start, length), mask in zip(packing.segments, masks[q.dtype], strict=True):
                qs, ks, vs = (t[start : start + length].transpose(0, 1)[None] for t in (q, k, v))
                out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1))
            attn = (out[0] if len(out) == 1 else torch.cat(out)).reshape(tokens, self.heads * self.head_dim)
            x = x + layer.proj["o_proj"](attn)
            h = rms_norm(x, layer.norm2, self.eps)
            x = x + layer.proj["down_proj"](F.silu(layer.proj["gate_proj"](h)) * layer.proj["up_proj"](h))
        return rms_norm(x, self.norm, self.eps)


def packed_logprobs(
    model: Any, pairs: Pairs, temperature: float, before_layer: Callable[[], None] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [n, T] of each completion token under the model, and the completion mask [n, T].

    The same result and gradients as the HF pass (`TorchBackend.batch_logprobs_hf`)
    within float rounding; `before_layer` is called before each decoder layer
    (the backend's stop and pause checks).
    """
    train = TrainModel(model)
    device = train.embed.device
    packing = Packing.of(pairs, device)
    hidden = train.hidden(packing, before_layer).index_select(0, packing.rows)
    logp = token_logprobs(hidden, train.head, packing.targets, temperature)
    n, width = packing.shape
    flat = logp.new_zeros(n * width).index_copy(0, packing.slots, logp)
    mask = torch.zeros(n * width, device=device).index_fill_(0, packing.slots, 1.0)
    return flat.view(n, width), mask.view(n, width)


def token_logprobs(hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(hidden @ head.T / temperature)[target], per row, in fp32 ([M, V] never whole).

    A head that is trained (full fine-tuning) takes the plain autograd path:
    its gradient needs every row's probabilities in the backward.
    """
    if head.requires_grad and torch.is_grad_enabled():
        logits = F.linear(hidden, head).float() / temperature
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
    result: torch.Tensor = _TokenLogprobs.apply(hidden, head, targets, temperature)
    return result


class _TokenLogprobs(torch.autograd.Function):
    """The LM head and log-softmax of `token_logprobs`, by chunks of rows, with d logp / d hidden made in the forward."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        need_grad = bool(ctx.needs_input_grad[0])
        logp = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        grad = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if need_grad else None
        chunk = HEAD_CHUNK if hidden.device.type == "cpu" else HEAD_CHUNK_GPU
        for start in range(0, hidden.shape[0], chunk):
            end = min(start + chunk, hidden.shape[0])
            target = targets[start:end, None]
            logits = F.linear(hidden[start:end], head).float().div_(temperature)
            top = logits.amax(dim=-1, keepdim=True)
            picked = logits.gather(1, target)
            total = logits.sub_(top).exp_().sum(dim=-1, keepdim=True)
            logp[start:end] = (picked - top - total.log()).squeeze(1)
            if grad is not None:
                probs = logits.div_(total)  # softmax, in place of the logits
                # d logp / d h = (E[target] - p @ E) / temperature
                expected = torch.mm(probs, head)  # bf16 under autocast, as the HF pass's backward matmul
                grad[start:end] = (head.index_select(0, target[:, 0]) - expected).float().div_(temperature)
        ctx.save_for_backward(grad if grad is not None else logp.new_empty(0))
        ctx.hidden_dtype = hidden.dtype
        return logp

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (grad,) = ctx.saved_tensors
        if grad.numel() == 0:
            return None, None, None, None
        return (grad * upstream[:, None]).to(ctx.hidden_dtype), None, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm: normalise in fp32, cast back, then scale (one fused op when all is fp32)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's apply_rotary_pos_emb for one of q or k: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
