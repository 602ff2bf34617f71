"""The MLX backend's decoder: each prompt read once on its own KV cache, then all rows decoded as one batch.

Generation runs each prompt once on its own KV cache, copies that cache
n times, and decodes all prompts x n completions as one left-padded batch
(mlx-lm's `BatchKVCache`, which keeps each row's positions starting at
0). Each sampled token's log-prob under the tempered distribution is
recorded as it is drawn: the behaviour log-probs.

This is its own room for the reason the torch backend's decoder is (engine/backends/decode.py): how a batch
of rows is decoded is one idea, and the backend only says how a token is picked (`pick`: sampled at a
temperature, or greedy) and turns the rows into completions (engine/backends/mlx_backend.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache


def prefill(model: Any, prompt: list[int]) -> list[Any]:
    """A KV cache holding all of `prompt` but its last token (which starts decoding)."""
    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([(c.keys, c.values) for c in cache if getattr(c, "keys", None) is not None])
    return cache


def decode_batch(
    model: Any,
    prompts: Sequence[list[int]],
    n: int,
    max_new_tokens: int,
    pick: Callable[[mx.array], tuple[mx.array, mx.array]],
    on_step: Callable[[int], None] | None,
    eos_token_id: int,
) -> list[tuple[list[int], list[float], bool]]:
    """Decode n continuations of each prompt as one batch: (tokens, log-probs, finished) per row."""
    model.eval()
    caches = [prefill(model, p) for p in prompts]
    batch = [
        caches[0][layer].merge([cache[layer] for cache in caches for _ in range(n)])
        for layer in range(len(caches[0]))
    ]
    tokens = mx.array([p[-1] for p in prompts for _ in range(n)])
    rows = len(prompts) * n
    steps: list[np.ndarray] = []
    logps: list[np.ndarray] = []
    finished = np.zeros(rows, dtype=bool)
    for step in range(max_new_tokens):
        logits = model(tokens[:, None], cache=batch)[:, -1, :].astype(mx.float32)
        tokens, chosen = pick(logits)
        mx.eval(tokens, chosen)
        steps.append(np.array(tokens))
        logps.append(np.array(chosen))
        finished |= steps[-1] == eos_token_id
        if on_step is not None:
            on_step(step + 1)
        if finished.all():
            break
    del batch, caches
    out: list[tuple[list[int], list[float], bool]] = []
    for row in range(rows):
        ids = [int(s[row]) for s in steps]
        lps = [float(lp[row]) for lp in logps]
        if eos_token_id in ids:
            cut = ids.index(eos_token_id) + 1
            out.append((ids[:cut], lps[:cut], True))
        else:
            out.append((ids, lps, False))
    return out
