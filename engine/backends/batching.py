"""What the training backends share (no torch, no mlx here).

- `micro_batches` cuts a training batch into length-sorted chunks under a row
  and a token budget (gradients are accumulated over the chunks), keeping
  the completions of one question together.
- `MicroBatchBudget` says what that budget is: the config's `micro_batch` and
  `micro_batch_tokens`, scaled up on an accelerator with memory to spare
  when both are left at their defaults (which are sized for a CPU laptop),
  and halved each time the device runs out of memory. A halving lasts for
  the rest of the session, so a node that ran out once does not run out
  every round.
- `HFTokenizerText` turns chat messages and completions into token ids and
  back, with the model's Hugging Face tokenizer.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from engine.backends.base import TrainItem
from engine.common.config import GRPOConfig
from engine.common.device import DeviceInfo
from engine.common.errors import DeviceError, ModelError

log = logging.getLogger(__name__)

# Scale the default budget by one step per this much accelerator memory.
GIB_PER_SCALE_STEP = 8
MAX_SCALE = 32


def micro_batches(
    items: Sequence[TrainItem], max_rows: int, max_tokens: int, *, shared_prompts: bool = False, packed: bool = False
) -> list[list[TrainItem]]:
    """Chunks of at most `max_rows` sequences and `max_tokens` tokens.

    Items are ordered by prompt length, then prompt, then completion length,
    so the completions of one question sit together and little is padded.
    Activation memory grows with the tokens a pass computes, so the token
    budget (not the row count) is what keeps long prompts from blowing the
    memory target. A chunk costs rows x (prompt + completion width), padded;
    with `shared_prompts` (a backend that runs each distinct prompt once,
    then every completion on a copy of its cache), distinct prompts x prompt
    width + rows x completion width; `packed` (prompts once, no padding,
    `engine.backends.train_forward`), the distinct prompts' lengths plus the
    completions' lengths. A single sequence longer than the budget still
    gets a chunk of its own.
    """
    ordered = sorted(items, key=lambda it: (len(it.prompt_ids), it.prompt_ids, len(it.completion_ids)))
    chunks: list[list[TrainItem]] = []
    current: list[TrainItem] = []
    prompts: set[tuple[int, ...]] = set()
    prompt_w = comp_w = used = 0

    def cost(rows: int, distinct: int, p: int, c: int, tokens: int) -> int:
        if packed:
            return tokens
        return distinct * p + rows * c if shared_prompts else rows * (p + c)

    for item in ordered:
        key = tuple(item.prompt_ids)
        p, c = max(prompt_w, len(item.prompt_ids)), max(comp_w, len(item.completion_ids))
        tokens = used + len(item.completion_ids) + (len(key) if key not in prompts else 0)
        distinct = len(prompts) + (key not in prompts)
        if current and (len(current) >= max_rows or cost(len(current) + 1, distinct, p, c, tokens) > max_tokens):
            chunks.append(current)
            current, prompts = [], set()
            p, c = len(item.prompt_ids), len(item.completion_ids)
            tokens = p + c
        current.append(item)
        prompts.add(key)
        prompt_w, comp_w, used = p, c, tokens
    if current:
        chunks.append(current)
    return chunks


def memory_scale(device: DeviceInfo) -> int:
    """How many times the CPU-sized default budget this device can hold.

    CUDA memory is the GPU's own; Apple unified memory is shared with the
    system, so only half of it counts. CPUs keep the default.
    """
    if device.kind == "cuda":
        usable = device.memory_bytes
    elif device.kind == "mlx":
        usable = device.memory_bytes // 2
    else:
        return 1
    return max(1, min(MAX_SCALE, usable // (GIB_PER_SCALE_STEP << 30)))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}


class MicroBatchBudget:
    """Rows and padded tokens per forward/backward pass on one device."""

    def __init__(self, device: DeviceInfo) -> None:
        self.scale = memory_scale(device)
        self.halvings = 0

    def limits(self, grpo: GRPOConfig) -> tuple[int, int]:
        """(rows, tokens) for this config, after scaling and any halvings."""
        rows, tokens = grpo.micro_batch, grpo.micro_batch_tokens
        if rows == _DEFAULTS["micro_batch"] and tokens == _DEFAULTS["micro_batch_tokens"]:
            rows, tokens = rows * self.scale, tokens * self.scale
        return max(1, rows >> self.halvings), max(1, tokens >> self.halvings)

    def halve(self, grpo: GRPOConfig) -> bool:
        """Halve the budget after running out of memory; False when it is one sequence already."""
        if self.limits(grpo)[0] <= 1:
            return False
        self.halvings += 1
        return True

    def shrink_after_oom(self, grpo: GRPOConfig, device_name: str, phase: str) -> None:
        """Halve after an out-of-memory error and say so, or give up with advice (DeviceError)."""
        if not self.halve(grpo):
            raise DeviceError(
                f"{device_name} ran out of memory while {phase}, even one sequence at a time. "
                "Use a smaller model, lower tasks.max_new_tokens, or grpo.finetune='lora'."
            )
        rows, tokens = self.limits(grpo)
        log.warning(
            "%s ran out of memory while %s: micro-batch halved to %d sequences / %d tokens; retrying.",
            device_name, phase, rows, tokens,
        )


class HFTokenizerText:
    """Text <-> token ids through a Hugging Face tokenizer, the same for every backend."""

    tokenizer: Any
    eos_token_id: int
    pad_token_id: int

    def _set_special_tokens(self, model_dir: object) -> None:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ModelError(f"The tokenizer in {model_dir} has no end-of-sequence token.")
        self.eos_token_id = int(eos)
        self.pad_token_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos)

    def encode_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        enc: Any = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = enc if isinstance(enc, list) else enc["input_ids"]
        return [int(t) for t in ids]

    def encode_completion(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        return [int(t) for t in ids] + [self.eos_token_id]

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))
