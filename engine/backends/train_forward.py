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

from engine.backends.decode_model import attention, unsupported_reason

# Rows of the LM head per chunk on the CPU ([128, 49152] fp32 is 25 MB). Forward + backward of a round's 329
# completion tokens on the bundled model's head, one thread, CPU s: chunks of 16 rows 1.56, 32 1.11, 64 0.95,
# 128 0.76, all 329 at once 0.79; the HF pass's log-softmax 1.08. A GPU takes bigger chunks (fewer launches).
HEAD_CHUNK = 128
HEAD_CHUNK_GPU = 1024

Pairs = Sequence[tuple[list[int], list[int]]]
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


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

    @property
    def fusable(self) -> bool:
        """A frozen weight (and bias) with one adapter and no dropout: what `_LoraGroup` computes."""
        frozen = not self.weight.requires_grad and (self.bias is None or not self.bias.requires_grad)
        return frozen and len(self.loras) == 1 and self.loras[0].dropout == 0.0


FUSE_LORA = True  # False: every projection through `Projection.__call__` (autograd op by op), for comparisons


def project(group: Sequence[Projection], x: torch.Tensor) -> list[torch.Tensor]:
    """Each projection of `group` applied to the same input x [N, in].

    With a frozen weight and one adapter each (LoRA training), one
    `_LoraGroup` call: the adapters' A products fused into one matmul, B's
    added into the frozen product in place (addmm), and a backward written
    out (no [N, out] temporaries for the scaling and the sum). Anything else
    (full fine-tuning, dropout, several adapters, the KL reference with the
    adapters off) runs op by op.
    """
    if not (FUSE_LORA and all(p.fusable for p in group)):
        return [p(x) for p in group]
    tensors: list[torch.Tensor | None] = []
    for p in group:
        tensors.extend((p.weight, p.bias, p.loras[0].a, p.loras[0].b))
    scalings = tuple(p.loras[0].scaling for p in group)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        # As autocast runs F.linear: every operand in its dtype (the casts recorded, so gradients reach fp32 adapters).
        dtype = torch.get_autocast_dtype(device)
        x = x.to(dtype)
        tensors = [t.to(dtype) if t is not None else None for t in tensors]
        with torch.autocast(device, enabled=False):
            return list(_LoraGroup.apply(scalings, x, *tensors))
    return list(_LoraGroup.apply(scalings, x, *tensors))


class _LoraGroup(torch.autograd.Function):
    """y_i = x W_i^T + b_i + s_i (x A_i^T) B_i^T for projections sharing x, their A products in one matmul.

    Inputs after the scalings: x, then (W, bias or None, A, B) per projection.
    The backward: dz_i = g_i B_i s_i, dx = sum_i g_i W_i + [dz_i] [A_i],
    dA = [dz_i]^T x, dB_i = s_i g_i^T z_i; W and the bias get none (frozen).
    """

    @staticmethod
    def forward(
        ctx: Any, scalings: tuple[float, ...], x: torch.Tensor, *tensors: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...]:
        weights, biases = tensors[0::4], tensors[1::4]
        lora_a = [t for t in tensors[2::4] if t is not None]
        lora_b = [t for t in tensors[3::4] if t is not None]
        a_all = lora_a[0] if len(lora_a) == 1 else torch.cat(lora_a)
        z = x @ a_all.t()  # [N, sum of ranks]
        ranks = [a.shape[0] for a in lora_a]
        zs = z.split(ranks, dim=1)
        outputs = []
        for weight, bias, b, part, scaling in zip(weights, biases, lora_b, zs, scalings, strict=True):
            assert weight is not None
            y = torch.addmm(bias, x, weight.t()) if bias is not None else x @ weight.t()
            outputs.append(y.addmm_(part, b.t(), alpha=scaling))
        ctx.save_for_backward(x, z, a_all, *weights, *lora_b)
        ctx.scalings, ctx.ranks = scalings, ranks
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, z, a_all, *rest = ctx.saved_tensors
        count = len(ctx.scalings)
        weights, lora_b = rest[:count], rest[count:]
        needs = ctx.needs_input_grad
        # dz_i = s_i g_i B_i, side by side as [N, sum of ranks]
        dz = torch.cat([(g @ b).mul_(s) for g, b, s in zip(grads, lora_b, ctx.scalings, strict=True)], dim=1) \
            if count > 1 else (grads[0] @ lora_b[0]).mul_(ctx.scalings[0])
        dx = None
        if needs[1]:
            dx = dz @ a_all
            for g, weight in zip(grads, weights, strict=True):
                dx.addmm_(g, weight)
        da = dz.t() @ x
        out: list[torch.Tensor | None] = [None, dx]
        for i, (g, part) in enumerate(zip(grads, z.split(ctx.ranks, dim=1), strict=True)):
            da_i = da.narrow(0, sum(ctx.ranks[:i]), ctx.ranks[i]) if needs[4 + 4 * i] else None
            db_i = (g.t() @ part).mul_(ctx.scalings[i]) if needs[5 + 4 * i] else None
            out.extend((None, None, da_i, db_i))
        return tuple(out)


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
    i is predicted by the hidden state at position `kept[picks[k]]` (the
    prompt's last token for j = 0), and its log-prob lands at `slots[k]` of
    the flattened [completions, longest completion] result.
    """

    ids: torch.Tensor  # [N] the packed input tokens
    positions: torch.Tensor  # [N] each token's position in its own prompt + completion
    segments: list[tuple[int, int]]  # (start, length) per prompt segment
    allowed: list[torch.Tensor]  # [length, length] bool: which columns each token of a segment attends to
    kept: torch.Tensor  # [K] the positions whose hidden state predicts a completion token, ascending
    picks: torch.Tensor  # [M] for each completion token, the index into kept of the state that predicts it
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
        for key, members in groups.items():
            start = len(ids)
            ids.extend(key)
            positions.extend(range(len(key)))
            segment_owners = [-1] * len(key)
            last = len(ids) - 1
            for member in members:
                completion = pairs[member][1]
                first = len(ids)
                ids.extend(completion[:-1])
                positions.extend(range(len(key), len(key) + len(completion) - 1))
                segment_owners.extend([member] * (len(completion) - 1))
                rows.extend([last, *range(first, first + len(completion) - 1)])
                targets.extend(completion)
                slots.extend(range(member * width, member * width + len(completion)))
            segments.append((start, len(ids) - start))
            owners.append(segment_owners)
        allowed = []
        for owner_list in owners:
            owner = torch.tensor(owner_list, device=device)
            column = torch.arange(len(owner_list), device=device)
            # Causal, and a completion's columns only to itself: the prompt's (owner -1) to everyone after them.
            same = (owner[None, :] == -1) | (owner[None, :] == owner[:, None])
            allowed.append((column[None, :] <= column[:, None]) & same)

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        kept = sorted(set(rows))
        where = {row: index for index, row in enumerate(kept)}
        return cls(tensor(ids), tensor(positions), segments, allowed, tensor(kept),
                   tensor([where[row] for row in rows]), tensor(targets), tensor(slots), (len(pairs), width))


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
                name: Projection.of(getattr(layer.self_attn if name in ATTENTION else layer.mlp, name), training)
                for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
            })
            for layer in lm.model.layers
        ]

    def hidden(self, packing: Packing, before_layer: Callable[[], None] | None = None) -> torch.Tensor:
        """The final-norm hidden states [K, hidden] of the packed sequence's positions `packing.kept`."""
        x = F.embedding(packing.ids, self.embed, self.padding_idx)
        cos, sin = self.rotary(x, packing.positions[None])
        cos, sin = cos[0][:, None], signed_sin(sin[0][:, None])  # [N, 1, head_dim], in x's dtype as HF has them
        masks: dict[torch.dtype, list[torch.Tensor]] = {}
        tokens = x.shape[0]
        for layer in self.layers:
            if before_layer is not None:
                before_layer()
            h = rms_norm(x, layer.norm1, self.eps)
            q, k, v = project([layer.proj["q_proj"], layer.proj["k_proj"], layer.proj["v_proj"]], h)
            q = rope(q.view(tokens, self.heads, self.head_dim), cos, sin)
            k = rope(k.view(tokens, self.kv_heads, self.head_dim), cos, sin)
            v = v.view(tokens, self.kv_heads, self.head_dim)
            if q.dtype not in masks:  # additive (0 or -inf), made once per dtype for all layers
                masks[q.dtype] = [torch.zeros(a.shape, dtype=q.dtype, device=a.device).masked_fill_(~a, float("-inf"))
                                  for a in packing.allowed]
            # Per prompt segment (split, not sliced: a slice's backward writes into zeros the size of the whole).
            lengths = [length for _, length in packing.segments]
            out = []
            parts = zip(q.split(lengths), k.split(lengths), v.split(lengths), masks[q.dtype], strict=True)
            for qs, ks, vs, mask in parts:
                qs, ks, vs = (t.transpose(0, 1)[None] for t in (qs, ks, vs))
                attended = attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
                out.append(attended[0].transpose(0, 1))
            attn = (out[0] if len(out) == 1 else torch.cat(out)).reshape(tokens, self.heads * self.head_dim)
            if layer is self.layers[-1]:
                # Past the last layer's keys and values only the states that predict a completion token matter.
                attn, x = attn.index_select(0, packing.kept), x.index_select(0, packing.kept)
            x = x + project([layer.proj["o_proj"]], attn)[0]
            h = rms_norm(x, layer.norm2, self.eps)
            gate, up = project([layer.proj["gate_proj"], layer.proj["up_proj"]], h)
            x = x + project([layer.proj["down_proj"]], F.silu(gate) * up)[0]
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
    hidden = train.hidden(packing, before_layer).index_select(0, packing.picks)
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
    """The LM head and log-softmax of `token_logprobs`, by chunks of rows, with d logp / d hidden made in the
    forward."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, temperature: float
    ) -> torch.Tensor:
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


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: HF's rotate_half(x) * sin is then x.roll(half) * signed_sin(sin)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's apply_rotary_pos_emb for one of q or k, x * cos + rotate_half(x) * sin, with `sin` from `signed_sin`."""
    result: torch.Tensor = _Rope.apply(x, cos, sin)
    return result


class _Rope(torch.autograd.Function):
    """x * cos + x.roll(half) * sin: rotate_half without slices, a backward that keeps no activations.

    Rolling by half the head dimension swaps its halves (it is its own inverse), so the backward
    is g * cos + (g * sin).roll(half). The dtypes promote as HF's ops do (bf16 q with fp32 cos is fp32).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.dtype = x.dtype
        return x * cos + x.roll(x.shape[-1] // 2, -1) * sin

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        cos, sin = ctx.saved_tensors
        return (grad * cos + (grad * sin).roll(grad.shape[-1] // 2, -1)).to(ctx.dtype), None, None
