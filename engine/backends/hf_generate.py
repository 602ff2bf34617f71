"""HF transformers' `generate` as sampler and greedy decoder, HF's training pass, and the left padding they take.

The torch backend samples and evaluates with its own decoder
(`engine.backends.decode`); these run instead for architectures that
decoder does not cover, and are the peer bench/rollout_speed.py measures it
against (`TorchBackend.generate_hf`, `greedy_hf`). Each takes the model
already in inference mode (the backend's `inference()` copy).

- `hf_sample`: each prompt runs through the model once, its KV cache is
  copied n times, and `generate` samples every row until the longest
  completion stops, recording each sampled token's log-prob under the
  tempered distribution.
- `hf_greedy`: greedy answers of a chunk of prompts.
- `hf_logprobs`: the completions' log-probs for training, each prompt once
  and its completions on copies of its KV cache (the training fallback).
- `left_pad`, `split_rows`: token lists to padded tensors and back.

Tests: .venv/bin/python -m pytest tests/engine/test_decode.py -q -k falls_back
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from engine.backends.base import StepCallback


def left_pad(prompts: Sequence[list[int]], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """Token ids [rows, longest] left-padded with `pad_token_id`, and the attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def split_rows(sequences: torch.Tensor, prompt_len: int, eos_token_id: int) -> list[tuple[list[int], bool]]:
    """Each row's generated tokens (cut after its first EOS) and whether it finished."""
    out = []
    for row in sequences[:, prompt_len:].tolist():
        if eos_token_id in row:
            cut = row.index(eos_token_id) + 1
            out.append((row[:cut], True))
        else:
            out.append((row, False))
    return out


class _RecordLogprobs(LogitsProcessor):
    """Applies 1/temperature and records log p(sampled token) for every step."""

    def __init__(self, temperature: float, prompt_len: int, on_step: StepCallback | None, total: int) -> None:
        self.temperature = temperature
        self.prompt_len = prompt_len
        self.on_step = on_step
        self.total = total
        self.previous: torch.Tensor | None = None
        self.recorded: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.recorded.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        scores = scores.float() / self.temperature  # type: ignore[assignment]
        self.previous = torch.log_softmax(scores, dim=-1)
        if self.on_step is not None:
            self.on_step(input_ids.shape[1] - self.prompt_len, self.total)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[batch, generated] log-probs, the last step included."""
        if self.previous is not None:
            self.recorded.append(self.previous.gather(1, sequences[:, -1:]).squeeze(1))
            self.previous = None
        if not self.recorded:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.recorded, dim=1)


class _StepHook(StoppingCriteria):
    """Reports greedy decoding progress (pause blocks here, stop raises here)."""

    def __init__(self, prompt_len: int, on_step: StepCallback, total: int, offset: int = 0) -> None:
        self.prompt_len, self.on_step, self.total, self.offset = prompt_len, on_step, total, offset

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        self.on_step(self.offset + input_ids.shape[1] - self.prompt_len, self.total)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


def hf_sample(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, n: int, max_new_tokens: int, temperature: float,
    pad_token_id: int, eos_token_id: int, on_step: StepCallback | None = None,
) -> tuple[torch.Tensor, list[list[float]]]:
    """`n` sampled rows per prompt (prompt-major): the sequences [rows, prompt + new] and each row's log-probs."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    recorder = _RecordLogprobs(temperature, ids.shape[1], on_step, max_new_tokens)
    config = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id,
    )
    extra: dict[str, Any] = {}
    if ids.shape[1] > 1:
        prefix = model(
            input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
            use_cache=True, logits_to_keep=1,  # only the cache is wanted, not prompt logits
        )
        prefix.cache.batch_repeat_interleave(n)
        extra["cache"] = prefix.cache
    sequences = model.generate(
        input_ids=ids.repeat_interleave(n, dim=0), attention_mask=mask.repeat_interleave(n, dim=0),
        generation_config=config, logits_processor=LogitsProcessorList([recorder]), **extra,
    )
    return sequences, recorder.finish(sequences).tolist()


def hf_greedy(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, pad_token_id: int, eos_token_id: int,
    on_step: StepCallback | None = None, total: int = 0, offset: int = 0,
) -> torch.Tensor:
    """Greedy sequences of one chunk of prompts; `on_step` hears (offset + step, total)."""
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                              eos_token_id=eos_token_id)
    hooks: list[StoppingCriteria] = []
    if on_step is not None:
        hooks.append(_StepHook(ids.shape[1], on_step, total, offset))
    return model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                          stopping_criteria=StoppingCriteriaList(hooks))


def hf_logprobs(
    model: Any, pairs: Sequence[tuple[list[int], list[int]]], temperature: float, pad_token_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [n, T] of each completion token through HF's forward, and the completion mask (the training pass).

    The G completions of a question share its prompt, so each distinct
    prompt runs through the model once (left-padded, with its KV cache
    kept) and every completion then runs on a copy of its prompt's cache.
    Attention is causal, so this is the same computation, and the same
    gradient, as running each prompt + completion on its own. The torch
    backend trains through `engine.backends.train_forward` where it covers
    the model; this is the fallback, and the peer bench/train_speed.py measures.
    """
    prompts: list[list[int]] = []
    where: dict[tuple[int, ...], int] = {}
    rows = []
    for prompt, _ in pairs:
        key = tuple(prompt)
        if key not in where:
            where[key] = len(prompts)
            prompts.append(list(prompt))
        rows.append(where[key])
    n, comp_w = len(pairs), max(len(c) for _, c in pairs)
    p_ids, p_mask = left_pad(prompts, pad_token_id, device)
    prompt_w = p_ids.shape[1]
    c_ids = torch.full((n, comp_w), pad_token_id, dtype=torch.long)
    comp_mask = torch.zeros((n, comp_w), dtype=torch.float32)
    for row, (_, comp) in enumerate(pairs):
        c_ids[row, : len(comp)] = torch.tensor(comp)
        comp_mask[row, : len(comp)] = 1.0
    index = torch.tensor(rows, dtype=torch.long)
    p_ids, p_mask, c_ids, comp_mask, index = (
        t.to(device) for t in (p_ids, p_mask, c_ids, comp_mask, index)
    )
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    head = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True, logits_to_keep=1)
    cache = head.cache
    cache.reorder_cache(index)  # one copy of its prompt's cache per completion (autograd-safe index_select)
    attn = torch.cat([p_mask.index_select(0, index), torch.ones_like(c_ids)], dim=1)
    c_pos = p_mask.sum(-1, keepdim=True).index_select(0, index) + torch.arange(comp_w, device=device)
    logits = head.logits.index_select(0, index)  # predicts each completion's first token
    if comp_w > 1:
        tail = model(
            input_ids=c_ids[:, :-1], attention_mask=attn[:, : prompt_w + comp_w - 1],
            position_ids=c_pos[:, :-1], cache=cache, use_cache=True,
        )
        logits = torch.cat([logits, tail.logits], dim=1)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1).gather(2, c_ids.unsqueeze(2)).squeeze(2)
    return logp, comp_mask
