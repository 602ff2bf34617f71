"""The decoder's KV cache: one buffer per layer, each prompt's keys and values stored once for its n completions.

A prompt and its n completions are one group: per layer
`[groups, kv_heads, prompt_max + n * max_new_tokens, head_dim]`, the prompt
before column prompt_max and the completions' tokens interleaved after it
(column `prompt_max + step * n + row`), so a step attends to one contiguous
range and nothing is copied per step. Groups sit in order of prompt length,
in runs of similar length (`partition`), each attended from its own first
column. `engine.backends.decode` fills it; docs/backends.md explains the
choices and the constants.

Tests: .venv/bin/python -m pytest tests/engine/test_decode.py -q
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.backends.decode_shapes import DecodeShape

# A decode step's extra attention call for another run of prompt lengths costs about what reading this
# many more cache columns of one group does (docs/backends.md).
BUCKET_CALL_COLUMNS = 300
COLUMN_ALIGN = 16  # a run's first cache column is a multiple of this (see KVCache)


class KVCache:
    """The KV cache of one chunk: per layer [groups, kv_heads, prompt_max + n * max_new, head_dim].

    The completions' tokens begin at column prompt_max. Groups are ordered by
    prompt length (the caller's job) and split into buckets of similar
    length (`partition`); each prompt starts at its bucket's first column,
    so a decode step attends bucket by bucket from that column on and skips
    most of the padding a short prompt beside a long one would cost. Those
    first columns are multiples of COLUMN_ALIGN, as column 0 is: a prompt's
    columns then fall on the same vector lanes as in one unpadded forward,
    and the sums round as they did when every prompt started at column 0.
    """

    def __init__(self, model: DecodeShape, prompt_lengths: list[int], n: int, max_new: int) -> None:
        if any(a > b for a, b in itertools.pairwise(prompt_lengths)):
            raise ValueError("the cache's groups must be ordered by prompt length")
        self.n, self.prompt_max, self.tail = n, max(prompt_lengths), n * max_new // 2
        self.offset_list = [0] * len(prompt_lengths)
        for first, last in partition(prompt_lengths, self.tail):
            start = (self.prompt_max - prompt_lengths[last - 1]) // COLUMN_ALIGN * COLUMN_ALIGN
            self.offset_list[first:last] = [start] * (last - first)
        self._buckets: list[tuple[int, int, int]] | None = None
        shape = (len(prompt_lengths), model.kv_heads, self.prompt_max + n * max_new, model.head_dim)
        # Zeros, not empty: masked columns still enter the attention product, and 0 * NaN is NaN.
        self.keys = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in model.blocks]
        self.values = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in model.blocks]
        self.lengths = torch.tensor(prompt_lengths, device=model.device)
        self.query_row = torch.arange(n * (model.heads // model.kv_heads),
                                      device=model.device) // (model.heads // model.kv_heads)
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
        """(first group, end group, first column) of each bucket, as `partition` splits the live groups."""
        if self._buckets is None:
            widths = [self.prompt_max - offset for offset in self.offset_list]
            # Offsets fall as prompts lengthen: a bucket's first column is its last group's.
            self._buckets = [(first, last, self.offset_list[last - 1]) for first, last in partition(widths, self.tail)]
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
            [prompt[:, None, None, :].expand(groups, 1, queries, self.prompt_max),
             own[None, None].expand(groups, 1, queries, own.shape[1])],
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


def partition(widths: list[int], tail: int) -> list[tuple[int, int]]:
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
