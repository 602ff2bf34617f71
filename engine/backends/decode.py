"""Batched decoding for llama-family models that wastes nothing (CPU and CUDA).

`TorchBackend.generate` and `greedy` run on `decode_batch`; HF `generate`
stays as the fallback for architectures it does not cover
(`unsupported_reason`). What it does differently from HF `generate`
(docs/backends.md, "The torch decoder", says why, with the measurements):

- Finished rows leave the batch: a step's matmuls run only on the rows
  still writing.
- Each prompt's KV cache is stored once, however many completions it has,
  preallocated, with prompts of similar length attending together
  (`engine.backends.kv_cache`).
- Prompts are packed into one sequence per prefill forward, and a prefix
  two prompts share (with the same adapter) is computed once.
- One uniform per row per step, from a generator per row whose seed is
  drawn from torch's global RNG (or from the caller's seed per adapter),
  and inverse-CDF sampling (`choose_tokens`): a row's completion depends on
  the seed and its place in the call only, not on which other rows are
  still running nor on the batch's split into cache-sized chunks.
- Rows may use different LoRA adapters over one frozen base
  (`engine.backends.lora`).
- With a `PromptCache`, a prompt read in one call is not read again in the
  next (probing's second call): its keys and values are copied back.

The forward itself is `engine.backends.decode_model.DecodeModel`.
Behaviour log-probs are log p(token) of the tempered distribution.

Tests: .venv/bin/python -m pytest tests/engine/test_decode.py -q; speed: .venv/bin/python -m bench.rollout_speed --quick
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.backends.base import PromptCache, StepCallback
from engine.backends.decode_model import DecodeModel, can_pack, unsupported_reason
from engine.backends.kv_cache import KVCache
from engine.backends.lora import AdapterStack, LoraAdapter, LoraStep

__all__ = ["DecodeModel", "DecodedRow", "LoraAdapter", "PromptState", "can_pack", "choose_tokens", "decode_batch",
           "unsupported_reason"]

# KV cache per chunk of prompts: a default round (8 prompts x 8 completions, 48 tokens) is one chunk in
# fp32, the 108 held-out prompts two. Every chunk decodes until its longest answer ends and each step
# reads all the weights, so fewer chunks mean fewer steps (docs/backends.md; bench/eval_cache.py).
CACHE_BYTES = 1024 * 2**20
MAX_ROWS = 256
PREFILL_TOKENS = 2048  # prompt tokens per packed prefill forward (activations stay in the tens of MB)
SAMPLING_BLOCK = 256  # inverse-CDF sampling picks a block of the vocabulary, then a token in it


@dataclass(frozen=True)
class PromptState:
    """A prompt as the model read it: each layer's keys and values [kv_heads, length, head_dim], and the logits of
    its last position (what a `PromptCache` holds for this decoder)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor


@dataclass(frozen=True)
class DecodedRow:
    """One completion: its tokens (the EOS included when it finished), their log-probs, finished or cut."""

    tokens: list[int]
    logprobs: list[float]  # empty for greedy decoding
    finished: bool


def choose_tokens(logits: torch.Tensor, temperature: float | torch.Tensor | None,
                  uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy argmax, or a sample of softmax(logits / T) by inverse CDF with its log-prob (T: one number, or a
    [rows, 1] tensor of each row's)."""
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
    temperatures: Sequence[float] | None = None,
    prompt_cache: PromptCache | None = None,
) -> list[DecodedRow]:
    """`n` completions of each prompt (prompt-major order), sampled at `temperature` or greedy (None).

    adapters / adapter_index: prompt i runs with adapters[adapter_index[i]]
    (LoRA over `model`'s weights, which then should be the base's);
    without them every row uses `model` as it is. seeds: one per adapter;
    rows of adapter a then sample from a generator seeded by seeds[a], so
    they get the same tokens as a call with adapter a alone and the same
    seed. Without seeds, rows draw their generators' seeds from torch's
    global RNG. temperatures: one per prompt, in place of `temperature` (each
    row then samples as a call with its prompt's temperature alone would).
    prompt_cache: prompts found there (under the same adapter index) are not
    read again, and those read are added to it; it must come from calls
    with the same weights and adapters.
    compact=False keeps finished rows computing (to test that leaving does
    not change anything).
    """
    if not prompts:
        return []
    if adapters and (adapter_index is None or len(adapter_index) != len(prompts)):
        raise ValueError("adapter_index must give one adapter per prompt.")
    if adapter_index is not None and any(not 0 <= a < max(1, len(adapters)) for a in adapter_index):
        raise ValueError(f"adapter_index must be in 0..{len(adapters) - 1}.")
    if seeds is not None and len(seeds) != max(1, len(adapters)):
        raise ValueError("seeds must give one seed per adapter.")
    if temperatures is not None and (temperature is None or len(temperatures) != len(prompts)
                                     or any(not t > 0 for t in temperatures)):
        raise ValueError("temperatures must give one temperature above 0 per prompt, and only when sampling.")
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
        stack = AdapterStack(model, adapters,
                             {"qkv": [q_out, kv_out, kv_out], "o": [hidden], "gate_up": [inter, inter],
                              "down": [hidden]})

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
                model, [prompts[i] for i in chunk], n, max_new_tokens, eos_token_id,
                temperature if temperatures is None else [temperatures[i] for i in chunk],
                [row_adapter[i * n] for i in chunk], [generators[i * n + j] for i in chunk for j in range(n)],
                stack, compact, on_step, number * max_new_tokens, total, prompt_cache,
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
    model: DecodeModel, prompts: list[list[int]], n: int, max_new: int, eos: int,
    temperature: float | list[float] | None, group_adapter: list[int], generators: list[torch.Generator | None],
    stack: AdapterStack | None, compact: bool, on_step: StepCallback | None, offset: int, total: int,
    prompt_cache: PromptCache | None = None,
) -> list[DecodedRow]:
    device = model.device
    # Cache slots in order of prompt length (see KVCache); prompts keep their order for prefix sharing.
    by_length = sorted(range(len(prompts)), key=lambda b: (len(prompts[b]), b))
    slot_of = [0] * len(prompts)
    for slot, b in enumerate(by_length):
        slot_of[b] = slot
    cache = KVCache(model, [len(prompts[b]) for b in by_length], n, max_new)
    start_logits: list[torch.Tensor | None] = [None] * len(prompts)
    if prompt_cache is not None:  # prompts read by an earlier call: their keys and values go back in place
        for b, prompt in enumerate(prompts):
            state: PromptState | None = prompt_cache.get(group_adapter[b], prompt)
            if state is not None:
                group, length = slot_of[b], len(prompt)
                at = cache.offset_list[group]
                for layer, (keys, values) in enumerate(zip(state.keys, state.values, strict=True)):
                    cache.keys[layer][group, :, at : at + length] = keys
                    cache.values[layer][group, :, at : at + length] = values
                start_logits[b] = state.logits
    read = [b for b in range(len(prompts)) if start_logits[b] is None]
    # Prompts come sorted by (adapter, tokens): the earlier prompt sharing the longest prefix is the one before.
    shared = [(0, 0)]
    for b in range(1, len(prompts)):
        common = common_prefix(prompts[b - 1], prompts[b]) if group_adapter[b] == group_adapter[b - 1] else 0
        shared.append((b - 1, min(common, len(prompts[b]) - 1)))  # the last token is always run: its logits are needed
    packs: list[list[int]] = []  # prompts packed up to PREFILL_TOKENS computed tokens a forward
    for b in read:
        if (packs and sum(len(prompts[i]) - shared[i][1] for i in packs[-1])
            + len(prompts[b]) - shared[b][1] <= PREFILL_TOKENS):
            packs[-1].append(b)
        else:
            packs.append([b])
    for pack in packs:
        if on_step is not None:
            on_step(offset, total)  # pause blocks and stop raises here too: a long prompt set takes a while
        lora = None
        if stack is not None:
            lora = LoraStep(stack, [group_adapter[b] for b in pack for _ in prompts[b][shared[b][1] :]])
        last = model.prefill([prompts[b] for b in pack], [slot_of[b] for b in pack],
                             [(slot_of[shared[b][0]], shared[b][1]) for b in pack], cache, lora)
        for row, b in enumerate(pack):
            start_logits[b] = last[row]
    if prompt_cache is not None:
        for b in read:
            group, length, last_logits = slot_of[b], len(prompts[b]), start_logits[b]
            assert last_logits is not None
            at = cache.offset_list[group]
            prompt_cache.put(group_adapter[b], prompts[b], PromptState(
                [k[group, :, at : at + length].clone() for k in cache.keys],
                [v[group, :, at : at + length].clone() for v in cache.values], last_logits.clone()))
    rows = len(prompts) * n
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logprobs: list[list[float]] = [[] for _ in range(rows)]
    finished = [False] * rows
    # Row ids (group * n + j in the original layout) that run this step, in the cache's order.
    computed = [b * n + j for b in by_length for j in range(n)]
    group_slot = list(slot_of)  # original group -> its index in the cache, -1 once dropped
    logits = torch.stack([x for x in start_logits if x is not None]).repeat_interleave(n, dim=0)
    if by_length != sorted(by_length):
        logits = logits.index_select(0, torch.tensor(computed, device=device))
    for step in range(max_new):
        if on_step is not None:
            on_step(offset + step, total)
        uniforms = None
        if temperature is not None:
            draws = [torch.rand(1, generator=generators[r]) for r in computed]
            uniforms = torch.cat(draws).to(device)
        heat: float | torch.Tensor | None = temperature if not isinstance(temperature, list) else torch.tensor(
            [temperature[r // n] for r in computed], dtype=torch.float32, device=device)[:, None]
        chosen, lps = choose_tokens(logits, heat, uniforms)
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
            feed = (chosen if len(keep) == len(chosen_list)
                    else chosen.index_select(0, torch.tensor(keep, device=device)))
        else:
            feed = chosen
        cache.place([group_slot[r // n] * n + r % n for r in computed], step + 1)
        lora = LoraStep(stack, [group_adapter[r // n] for r in computed]) if stack is not None else None
        logits = model.step(feed, cache, lora)
    return [DecodedRow(tokens[r], logprobs[r], finished[r]) for r in range(rows)]
