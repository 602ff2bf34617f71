"""Apple MLX backend (mlx-lm): the torch backend's Protocol, in MLX, for Apple-silicon GPUs.

The round loop cannot tell it from the torch backend: same tokenizer calls,
same behaviour log-probs, same loss, same checkpoint files for the weights.

- Models load through mlx-lm from the same HF folders as the torch backend
  (the converted bundled model, a local folder, a hub snapshot).
  transformers v5 writes `rope_theta` inside `rope_parameters`, which mlx-lm
  ignores (it would silently use its default); it is passed to mlx-lm
  explicitly, and every export writes it at the top level of config.json.
- Generation runs on engine/backends/mlx_decode.py: each prompt read once
  on its own KV cache, all prompts x n completions decoded as one batch,
  each sampled token's log-prob recorded as it is drawn (the behaviour
  log-probs).
- Training log-probs use prompt + completion right-padded: causal attention
  never looks right, so no mask or position ids are needed and the result
  equals the torch backend's left-padded layout. Only completion positions
  go through the LM head. As in transformers, the pad token's input
  embedding gets no gradient (HF's `padding_idx`). The loss is `engine.backends.loss`'s token-level clipped
  objective, written again in MLX in engine/backends/mlx_loss.py
  (tests/engine/test_cross_backend.py holds the two to each other).
- LoRA (default) puts mlx-lm's `LoRALinear` on every linear layer of the
  transformer blocks (peft's "all-linear"), scale alpha / rank. With bf16
  (Apple M2 and later, precision auto) the frozen base runs in bf16 and the
  adapters stay fp32; MLX has no autocast, so full fine-tuning trains fp32
  weights. AdamW with bias correction, as in torch.
- Checkpoints write the adapters in peft's names and layout
  (adapter.safetensors) and full weights in HF names (model.safetensors), so
  either backend reads the other's weights. The optimizer and RNG state are
  MLX's own (optimizer.safetensors, rng.json); resuming a torch checkpoint
  here keeps its weights and restarts the AdamW moments, with a warning.
- Export fuses the adapters into fp32 weights and writes an HF folder that
  transformers, mlx-lm and this backend load.

Supported architectures are those whose mlx-lm weight names equal the HF
names (llama, mistral, qwen2, qwen3: SmolLM2 and Qwen2.5 among them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.tuner.lora import LoRALinear
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load_model
from transformers import AutoTokenizer

from engine.backends.base import Completion, PromptCache, StepCallback, TrainItem
from engine.backends.batching import HFTokenizerText, MicroBatchBudget
from engine.backends.mlx_decode import decode_batch
from engine.backends.mlx_loss import clipped_pg_loss
from engine.backends.steps import train_steps
from engine.common.atomicio import atomic_dir
from engine.common.config import GRPOConfig
from engine.common.device import DeviceInfo
from engine.common.errors import CheckpointError, ModelError

log = logging.getLogger(__name__)

ADAPTER_FILE = "adapter.safetensors"
WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.json"
TORCH_OPTIMIZER_FILE = "optimizer.pt"
GREEDY_CHUNK = 8
PEFT_PREFIX = "base_model.model."
# Architectures whose logits are exactly lm_head (or the tied embedding) applied to
# `model.model(ids)`: for them only completion positions go through the head.
HEAD_ON_COMPLETIONS_ONLY = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def flat(tree: Any) -> list[tuple[str, Any]]:
    """`mlx.utils.tree_flatten` of a parameter tree: [("model.layers.0.mlp.up_proj.weight", array), ...]."""
    return cast(list[tuple[str, Any]], tree_flatten(tree))


def load_tensors(path: Path) -> dict[str, mx.array]:
    """All tensors of one safetensors file."""
    return dict(cast(dict[str, mx.array], mx.load(str(path))))


def scalar(value: mx.array) -> float:
    return float(cast(float, value.item()))


def mlx_config_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """Settings mlx-lm would miss in a transformers-v5 config.json (docs/platform-notes.md).

    v5 moved `rope_theta` (and rope scaling) into `rope_parameters`; mlx-lm
    reads only the top-level keys and otherwise falls back to its default
    theta without a word, which garbles every position past the first.
    """
    rope = config.get("rope_parameters")
    overrides: dict[str, Any] = {}
    if isinstance(rope, dict):
        if "rope_theta" not in config and "rope_theta" in rope:
            overrides["rope_theta"] = float(rope["rope_theta"])
        if config.get("rope_scaling") is None and rope.get("rope_type", "default") != "default":
            overrides["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return overrides


def is_out_of_memory(exc: BaseException) -> bool:
    """MLX reports a failed Metal allocation as a RuntimeError with one of these phrases."""
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and any(
        phrase in text for phrase in ("out of memory", "metal::malloc", "resource limit", "unable to allocate")
    )


class MLXBackend(HFTokenizerText):
    def __init__(self, model_dir: Path, device: DeviceInfo, grpo: GRPOConfig, seed: int, temperature: float) -> None:
        self.device = device
        self.grpo = grpo
        self.temperature = temperature
        self.model_dir = Path(model_dir)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
            self.hf_config: dict[str, Any] = json.loads((self.model_dir / "config.json").read_text())
            self.overrides = mlx_config_overrides(self.hf_config)
            model, _ = load_model(self.model_dir, model_config=self.overrides)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"Could not load the model in {model_dir} with MLX: {exc}") from exc
        self._set_special_tokens(model_dir)
        if grpo.precision == "bf16" and not device.bf16:
            log.warning("bf16 was asked for but %s has no native bf16; it will be slow.", device.name)
        self.bf16 = grpo.precision == "bf16" or (grpo.precision == "auto" and device.bf16)
        mx.random.seed(seed)
        self._key = mx.random.key(seed)
        self.reference: dict[str, Any] | None = None
        # transformers builds nn.Embedding(padding_idx=config.pad_token_id): that token's input
        # row never gets a gradient there (it is EOS, <|im_end|>, in SmolLM2). Full fine-tuning
        # here does the same, so both backends train the same weights.
        pad_row = self.hf_config.get("pad_token_id")
        self.frozen_input_row: int | None = pad_row if grpo.finetune == "full" and isinstance(pad_row, int) else None
        if grpo.finetune == "lora":
            # Frozen base (bf16 where native), then fp32 adapters on every block's linear layers.
            model.set_dtype(mx.bfloat16 if self.bf16 else mx.float32)
            model.freeze()
            scale = grpo.lora_alpha / grpo.lora_rank
            config = {"rank": grpo.lora_rank, "scale": scale, "dropout": grpo.lora_dropout}
            linear_to_lora_layers(model, len(model.layers), config)
        else:
            model.set_dtype(mx.float32)
            if grpo.kl_beta > 0:
                self.reference = model.parameters()  # MLX arrays are immutable: this is a frozen copy
        model.eval()
        mx.eval(model.parameters())
        self.model: Any = model
        self.optimizer = optim.AdamW(
            learning_rate=grpo.learning_rate, weight_decay=grpo.weight_decay, bias_correction=True
        )
        self.budget = MicroBatchBudget(device)
        self._loss_and_grad = nn.value_and_grad(self.model, self._loss)
        total = sum(v.size for _, v in flat(model.parameters()))
        trainable = sum(v.size for _, v in flat(model.trainable_parameters()))
        log.info(
            "model %s on MLX (%s): %.1fM params, %.2fM trainable (%s), bf16 %s",
            self.model_dir.name, device.name, total / 1e6, trainable / 1e6, grpo.finetune, self.bf16,
        )

    # -- sampling ----------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        on_step: StepCallback | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> list[Completion]:
        """`n` sampled completions of each prompt, grouped by prompt, with behaviour log-probs (reads every prompt:
        `prompt_cache` is not used here)."""

        def sample(logits: mx.array) -> tuple[mx.array, mx.array]:
            logp = logits / temperature
            logp = logp - mx.logsumexp(logp, axis=-1, keepdims=True)
            self._key, key = mx.random.split(self._key)
            token = mx.random.categorical(logp, key=key)
            return token, mx.take_along_axis(logp, token[:, None], axis=-1)[:, 0]

        report = None if on_step is None else (lambda step: on_step(step, max_new_tokens))
        rows = decode_batch(self.model, prompts, n, max_new_tokens, sample, report, self.eos_token_id)
        return [Completion(self.decode(ids), ids, lps, done) for ids, lps, done in rows]

    def greedy(self, prompts: Sequence[list[int]], max_new_tokens: int,
               on_step: StepCallback | None = None) -> list[str]:
        """Greedy answers, in chunks of similar prompt length."""

        def argmax(logits: mx.array) -> tuple[mx.array, mx.array]:
            return mx.argmax(logits, axis=-1), mx.zeros((logits.shape[0],))

        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        chunks = [order[i : i + GREEDY_CHUNK] for i in range(0, len(order), GREEDY_CHUNK)]
        answers: dict[int, str] = {}
        total = max_new_tokens * len(chunks)
        for number, chunk in enumerate(chunks):
            report = None
            if on_step is not None:
                report = (lambda offset: lambda step: on_step(offset + step, total))(number * max_new_tokens)
            rows = decode_batch(self.model, [prompts[i] for i in chunk], 1, max_new_tokens, argmax, report,
                                self.eos_token_id)
            for i, (ids, _, _) in zip(chunk, rows, strict=True):
                answers[i] = self.decode(ids)
        return [answers[i] for i in range(len(prompts))]

    # -- log-probs and training --------------------------------------------------------
    def _layout(self, pairs: Sequence[tuple[list[int], list[int]]]) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        """Right-padded ids, and per completion token: its position, its id, and a 0/1 mask."""
        n = len(pairs)
        width = max(len(p) + len(c) for p, c in pairs)
        comp_w = max(len(c) for _, c in pairs)
        ids = np.full((n, width), self.pad_token_id, dtype=np.int32)
        positions = np.zeros((n, comp_w), dtype=np.int32)
        targets = np.full((n, comp_w), self.pad_token_id, dtype=np.int32)
        mask = np.zeros((n, comp_w), dtype=np.float32)
        for row, (prompt, comp) in enumerate(pairs):
            ids[row, : len(prompt)] = prompt
            ids[row, len(prompt) : len(prompt) + len(comp)] = comp
            # The logits at position i predict token i + 1; padding rows point at a real position.
            positions[row] = len(prompt) - 1
            positions[row, : len(comp)] = np.arange(len(prompt) - 1, len(prompt) - 1 + len(comp))
            targets[row, : len(comp)] = comp
            mask[row, : len(comp)] = 1.0
        return mx.array(ids), mx.array(positions), mx.array(targets), mx.array(mask)

    def _head(self) -> Callable[[mx.array], mx.array] | None:
        model = self.model
        if getattr(model, "model_type", None) not in HEAD_ON_COMPLETIONS_ONLY:
            return None
        if "lm_head" in model:
            return model.lm_head  # type: ignore[no-any-return]
        if getattr(model.args, "tie_word_embeddings", False):
            return model.model.embed_tokens.as_linear  # type: ignore[no-any-return]
        return None

    def _logprobs(self, ids: mx.array, positions: mx.array, targets: mx.array, temperature: float) -> mx.array:
        """[n, T] log-probs of each completion token under the current weights."""
        head = self._head()
        if head is not None:
            inner = self.model.model
            embedded = inner.embed_tokens(ids)
            if self.frozen_input_row is not None:
                frozen = (ids == self.frozen_input_row)[..., None]
                embedded = mx.where(frozen, mx.stop_gradient(embedded), embedded)
            hidden = inner(ids, input_embeddings=embedded)
            logits = head(mx.take_along_axis(hidden, positions[..., None], axis=1))
        else:
            logits = mx.take_along_axis(self.model(ids), positions[..., None], axis=1)
        logits = logits.astype(mx.float32) / temperature
        chosen = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return chosen - mx.logsumexp(logits, axis=-1)

    def behaviour_logprobs(self, items: Sequence[tuple[list[int], list[int]]], temperature: float) -> list[list[float]]:
        """Log-probs under the current policy for text that this node did not sample (swarm items)."""
        self.model.eval()
        while True:
            rows = self.budget.limits(self.grpo)[0]
            try:
                out: list[list[float]] = []
                for start in range(0, len(items), rows):
                    chunk = items[start : start + rows]
                    if max(len(c) for _, c in chunk) == 0:
                        out.extend([] for _ in chunk)
                        continue
                    ids, positions, targets, _ = self._layout(chunk)
                    logp = np.array(self._logprobs(ids, positions, targets, temperature))
                    out.extend(logp[row, : len(c)].tolist() for row, (_, c) in enumerate(chunk))
                return out
            except (RuntimeError, MemoryError) as exc:
                if not is_out_of_memory(exc):
                    raise
            self._shrink_after_oom("scoring swarm rollouts")

    def _shrink_after_oom(self, phase: str) -> None:
        """Free the device's caches, then halve the micro-batch (or give up with advice)."""
        mx.clear_cache()
        self.budget.shrink_after_oom(self.grpo, self.device.name, phase)

    def _loss(
        self, ids: mx.array, positions: mx.array, targets: mx.array, mask: mx.array,
        old: mx.array, adv: mx.array, ref: mx.array | None, normaliser: float, weights: mx.array | None = None,
    ) -> tuple[mx.array, mx.array, mx.array]:
        g = self.grpo
        logp = self._logprobs(ids, positions, targets, self.temperature)
        return clipped_pg_loss(logp, old, adv, mask, g.eps_low, g.eps_high, normaliser, ref_logp=ref, kl_beta=g.kl_beta,
                               weights=weights)

    @contextlib.contextmanager
    def _reference_weights(self) -> Iterator[None]:
        """The base model for the KL term: adapters scaled to 0 (LoRA), or the initial weights (full)."""
        if self.grpo.finetune == "lora":
            layers = self._lora_modules()
            scales = [module.scale for _, module in layers]
            for _, module in layers:
                module.scale = 0.0
            try:
                yield
            finally:
                for (_, module), scale in zip(layers, scales, strict=True):
                    module.scale = scale
            return
        if self.reference is None:
            raise RuntimeError("kl_beta > 0 needs the reference weights kept at start-up")
        current = self.model.parameters()
        self.model.update(self.reference)
        try:
            yield
        finally:
            self.model.update(current)

    def chunk_loss_and_grads(
        self, chunk: Sequence[TrainItem], normaliser: float
    ) -> tuple[mx.array, mx.array, mx.array, dict[str, Any]]:
        """Loss, clipped-token count, summed KL and gradients of one micro-batch."""
        pairs = [(it.prompt_ids, it.completion_ids) for it in chunk]
        ids, positions, targets, mask = self._layout(pairs)
        old_np = np.zeros(mask.shape, dtype=np.float32)
        for row, it in enumerate(chunk):
            old_np[row, : len(it.old_logprobs)] = it.old_logprobs
        adv = mx.array([it.advantage for it in chunk], dtype=mx.float32)
        weights = None
        if any(it.weights is not None for it in chunk):
            weights_np = np.ones(mask.shape, dtype=np.float32)
            for row, it in enumerate(chunk):
                if it.weights is not None:
                    weights_np[row, : len(it.weights)] = it.weights
            weights = mx.array(weights_np)
        ref = None
        if self.grpo.kl_beta > 0:
            with self._reference_weights():
                ref = mx.stop_gradient(self._logprobs(ids, positions, targets, self.temperature))
                mx.eval(ref)
        (loss, clipped, kl), grads = self._loss_and_grad(
            ids, positions, targets, mask, mx.array(old_np), adv, ref, normaliser, weights
        )
        return loss, clipped, kl, grads

    def train(self, items: Sequence[TrainItem], on_step: StepCallback | None = None) -> dict[str, float]:
        """`pg_steps` optimiser steps over `items`, micro-batched; returns averaged stats.

        A step that runs out of memory is thrown away and redone with half the micro-batch.
        """
        self.model.train()
        try:
            return train_steps(
                items, self.grpo, self.budget, shared_prompts=False, accumulate=self._accumulate_step,
                apply=self._apply_step, is_oom=is_out_of_memory,
                after_oom=lambda: self._shrink_after_oom("training"), on_step=on_step,
            )
        finally:
            self.model.eval()

    def _apply_step(self, grads: Any) -> float | None:
        norm = None
        if self.grpo.max_grad_norm > 0:
            grads, total = optim.clip_grad_norm(grads, self.grpo.max_grad_norm)
            norm = float(total)
        self.optimizer.update(self.model, grads)
        mx.eval(self.model.parameters(), self.optimizer.state)
        return norm

    def _accumulate_step(
        self, chunks: list[list[TrainItem]], total_tokens: float, step: int, on_step: StepCallback | None
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """Gradients summed over every chunk, and the step's stats."""
        grads: dict[str, Any] | None = None
        sums = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "grad_norm": 0.0}
        total = self.grpo.pg_steps * len(chunks)
        for index, chunk in enumerate(chunks):
            if on_step is not None:  # before each chunk too: a stop or pause need not wait for the whole step
                on_step(step * len(chunks) + index, total)
            loss, clipped, kl, chunk_grads = self.chunk_loss_and_grads(chunk, total_tokens)
            grads = chunk_grads if grads is None else tree_map(mx.add, grads, chunk_grads)
            mx.eval(grads, loss, clipped, kl)
            sums["loss"] += scalar(loss)
            sums["clip_fraction"] += scalar(clipped) / total_tokens
            sums["kl"] += scalar(kl) / total_tokens
            if on_step is not None:
                on_step(step * len(chunks) + index + 1, total)
        if grads is None:
            raise RuntimeError("train() needs at least one chunk")
        return grads, sums

    def reseed(self, seed: int) -> None:
        """Make this round's sampling reproducible (same seed, same round -> same rollouts)."""
        mx.random.seed(seed)
        self._key = mx.random.key(seed)
        random.seed(seed)

    def apply_settings(self, grpo: GRPOConfig, temperature: float) -> None:
        """New GRPO settings and sampling temperature, from a settings reload; the shape is unchanged."""
        self.grpo = grpo
        self.temperature = temperature
        self.optimizer.learning_rate = grpo.learning_rate

    # -- persistence -------------------------------------------------------------------
    def _lora_modules(self) -> list[tuple[str, LoRALinear]]:
        return [(name, m) for name, m in self.model.named_modules() if isinstance(m, LoRALinear)]

    def adapter_tensors(self) -> dict[str, mx.array]:
        """The adapters under peft's names and [r, in] / [out, r] layout."""
        out: dict[str, mx.array] = {}
        for name, module in self._lora_modules():
            out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = mx.contiguous(module.lora_a.T)
            out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = mx.contiguous(module.lora_b.T)
        return out

    def _trainable_state(self) -> dict[str, mx.array]:
        if self.grpo.finetune == "lora":
            return self.adapter_tensors()
        return dict(flat(self.model.parameters()))

    def save(self, folder: Path) -> list[str]:
        folder = Path(folder)
        weights = ADAPTER_FILE if self.grpo.finetune == "lora" else WEIGHTS_FILE
        mx.save_safetensors(str(folder / weights), self._trainable_state(), metadata={"format": "pt"})
        mx.save_safetensors(str(folder / OPTIMIZER_FILE), dict(flat(self.optimizer.state)))
        (folder / RNG_FILE).write_text(json.dumps(self.rng_state()))
        return [weights, OPTIMIZER_FILE, RNG_FILE]

    def _load_adapters(self, tensors: dict[str, mx.array], folder: Path) -> None:
        modules = self._lora_modules()
        expected = {f"{PEFT_PREFIX}{name}.lora_{part}.weight" for name, _ in modules for part in "AB"}
        if set(tensors) != expected:
            raise CheckpointError(f"Checkpoint {folder} holds adapters for a different model.")
        for name, module in modules:
            a = tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"].T.astype(mx.float32)
            b = tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"].T.astype(mx.float32)
            if a.shape != module.lora_a.shape or b.shape != module.lora_b.shape:
                raise CheckpointError(f"Checkpoint {folder} holds adapters of another rank or model.")
            module.lora_a, module.lora_b = a, b

    def _load_weights(self, tensors: dict[str, mx.array]) -> None:
        # The torch backend keeps a tied embedding under lm_head.weight (safetensors drops the twin).
        if "lm_head" not in self.model and "model.embed_tokens.weight" not in tensors and "lm_head.weight" in tensors:
            tensors["model.embed_tokens.weight"] = tensors.pop("lm_head.weight")
        self.model.load_weights([(k, v.astype(mx.float32)) for k, v in tensors.items()], strict=True)

    def load(self, folder: Path) -> None:
        folder = Path(folder)
        try:
            if self.grpo.finetune == "lora":
                self._load_adapters(load_tensors(folder / ADAPTER_FILE), folder)
            else:
                self._load_weights(load_tensors(folder / WEIGHTS_FILE))
            if (folder / OPTIMIZER_FILE).is_file():
                state = tree_unflatten(list(load_tensors(folder / OPTIMIZER_FILE).items()))
                self._check_optimizer_state(state, folder)
                self.optimizer.state = state
            elif (folder / TORCH_OPTIMIZER_FILE).is_file():
                log.warning("Checkpoint %s was written by the torch backend: weights kept, AdamW moments restart.",
                            folder.name)
                self.optimizer = optim.AdamW(
                    learning_rate=self.grpo.learning_rate, weight_decay=self.grpo.weight_decay, bias_correction=True
                )
            else:
                raise CheckpointError(f"Checkpoint {folder} has no optimizer state.")
            rng = json.loads((folder / RNG_FILE).read_text()) if (folder / RNG_FILE).is_file() else None
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"Checkpoint {folder} could not be loaded: {exc}") from exc
        mx.eval(self.model.parameters(), self.optimizer.state)
        if rng is not None:
            self._key = mx.array(rng["mlx_key"], dtype=mx.uint32)
            version, internal, gauss = rng["python"]
            random.setstate((version, tuple(internal), gauss))

    def _check_optimizer_state(self, state: dict[str, Any], folder: Path) -> None:
        params = {k for k, _ in flat(self.model.trainable_parameters())}
        moments = {k.rsplit(".", 1)[0] for k, _ in flat(state) if k not in ("step", "learning_rate")}
        if moments and moments != params:
            raise CheckpointError(f"Checkpoint {folder} holds optimizer state for a different model.")

    def rng_state(self) -> dict[str, Any]:
        return {"mlx_key": np.array(self._key).tolist(), "python": random.getstate()}

    def merged_weights(self) -> dict[str, mx.array]:
        """fp32 weights with the adapters fused in, under HF names."""
        if self.grpo.finetune != "lora":
            return {k: v.astype(mx.float32) for k, v in flat(self.model.parameters())}
        # Fuse into freshly loaded fp32 base weights: the training copy may be bf16.
        base, _ = load_model(self.model_dir, model_config=self.overrides)
        base.set_dtype(mx.float32)
        weights: dict[str, mx.array] = dict(flat(base.parameters()))
        for name, module in self._lora_modules():
            delta = module.scale * (module.lora_b.T @ module.lora_a.T)
            weights[f"{name}.weight"] = weights[f"{name}.weight"] + delta.astype(mx.float32)
        return weights

    def export(self, folder: Path) -> None:
        """Write a merged HF folder (fp32 safetensors, config with top-level rope_theta, tokenizer)."""
        weights = self.merged_weights()
        mx.eval(weights)
        config = {k: v for k,
                  v in self.hf_config.items() if k not in ("quantization", "quantization_config", "torch_dtype")}
        config.update(self.overrides)
        config["dtype"] = "float32"
        with atomic_dir(Path(folder)) as tmp:
            mx.save_safetensors(str(tmp / WEIGHTS_FILE), weights, metadata={"format": "pt"})
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            if (self.model_dir / "generation_config.json").is_file():
                shutil.copyfile(self.model_dir / "generation_config.json", tmp / "generation_config.json")
            self.tokenizer.save_pretrained(tmp)
