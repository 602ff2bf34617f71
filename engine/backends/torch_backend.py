"""PyTorch backend (CPU and CUDA): HF transformers for the model, peft for LoRA.

- Generation and greedy evaluation run on `engine.backends.decode`: finished
  rows leave the batch, each prompt's KV cache is preallocated and stored
  once for all its completions, and each sampled token's log-prob under the
  tempered distribution is recorded as it is drawn (the behaviour log-probs,
  at no extra forward pass). Architectures it does not cover fall back to
  HF `generate` (`generate_hf`, `greedy_hf`, engine/backends/hf_generate.py),
  with a log line.
- Training recomputes log-probs per micro-batch with
  `engine.backends.train_forward`: each distinct prompt once and its
  completions after it, packed into one sequence with no padding, attending
  to one copy of the prompt, the LM head in chunks. Then the loss in
  `engine.backends.loss`. bf16 autocast where the device has native bf16. Models
  that forward does not cover train through HF's forward
  (`batch_logprobs_hf`: prompts left-padded, completions on copies of their
  prompt's KV cache), which `packed_training = False` also selects.
- LoRA (default) trains adapters on all linear layers; `full` trains every
  weight. With kl_beta > 0 the reference is the base model: the adapters
  switched off for LoRA, a frozen copy for full fine-tuning.
- On CUDA: bf16 autocast on GPUs with native bf16 (Ampere and newer, see
  `engine.common.device`), TF32 matmuls for what stays fp32, and a micro-batch
  budget sized to the GPU's memory (`engine.backends.batching`). When the
  GPU runs out of memory, the budget is halved and the step retried from
  its start; a warning says so (a `log` event under `sapling-node serve`)
  and the round's metrics count it in `oom_retries`.
- Several LoRA adapters over one frozen base (the experiment's nodes):
  `new_adapter_slot`, `use_adapter_slot`, `slot_lora` and
  `generate_with_adapters` come from engine/backends/adapter_slots.py.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.backends.adapter_slots import AdapterSlots
from engine.backends.base import Completion, PromptCache, StepCallback, TrainItem
from engine.backends.batching import HFTokenizerText, MicroBatchBudget, micro_batches
from engine.backends.decode import DecodedRow, DecodeModel, LoraAdapter, decode_batch, unsupported_reason
from engine.backends.hf_generate import hf_greedy, hf_logprobs, hf_sample, left_pad, split_rows
from engine.backends.loss import clipped_pg_loss
from engine.backends.memory import freeze_long_lived, release_memory
from engine.backends.steps import train_steps
from engine.backends.train_forward import packed_logprobs, train_unsupported_reason
from engine.backends.train_lanes import lane_count, largest_lane, run_lanes
from engine.common.atomicio import atomic_dir
from engine.common.config import GRPOConfig
from engine.common.device import DeviceInfo
from engine.common.errors import CheckpointError, ModelError

__all__ = ["TorchBackend", "freeze_long_lived", "micro_batches", "release_memory"]

log = logging.getLogger(__name__)

ADAPTER_FILE = "adapter.safetensors"
WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
GREEDY_CHUNK = 8  # prompts per HF greedy call (greedy_hf)


class TorchBackend(AdapterSlots, HFTokenizerText):
    def __init__(self, model_dir: Path, device: DeviceInfo, grpo: GRPOConfig, seed: int, temperature: float) -> None:
        self.device = device
        self.grpo = grpo
        self.temperature = temperature
        self.model_dir = Path(model_dir)
        self._dev = torch.device(device.torch_device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ModelError(f"Could not load the model in {model_dir}: {exc}") from exc
        self._set_special_tokens(model_dir)
        if grpo.precision == "bf16" and not device.bf16:
            log.warning("bf16 was asked for but %s has no native bf16; it will be slow.", device.name)
        self.autocast = grpo.precision == "bf16" or (grpo.precision == "auto" and device.bf16)
        self.budget = MicroBatchBudget(device)
        # The decoder's matmul weights reordered for oneDNN: None lets it decide (yes on the CPU in fp32,
        # engine.backends.decode.can_pack); bench/rollout_speed.py sets False to measure the plain path.
        self.pack_weights: bool | None = None
        # Training through `engine.backends.train_forward` where it covers the model; False: through HF's forward
        # (`batch_logprobs_hf`), the path before issue 36, which bench/train_speed.py measures as the peer.
        self.packed_training = True
        self.train_lanes = True  # False: a step's micro-batches one after the other on the CPU too (for comparisons)
        self._before_layer: Callable[[], None] | None = None  # the stop and pause check, while `train` runs
        if self._dev.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 where the GPU has it; fp32 elsewhere
        torch.manual_seed(seed)
        model.to(self._dev)
        self.reference: torch.nn.Module | None = None
        if grpo.finetune == "lora":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(
                r=grpo.lora_rank,
                lora_alpha=grpo.lora_alpha,
                lora_dropout=grpo.lora_dropout,
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            )
            with warnings.catch_warnings():
                # peft 0.21 asks the model for `is_gradient_checkpointing`, which transformers 5 deprecates with a
                # FutureWarning on every call (in every node's log); the answer is right, only the name is old.
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                model = get_peft_model(model, lora)
        elif grpo.kl_beta > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.model: Any = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=grpo.learning_rate, weight_decay=grpo.weight_decay)
        freeze_long_lived()
        log.info(
            "model %s: %.1fM params, %.2fM trainable (%s), autocast bf16 %s",
            self.model_dir.name, sum(p.numel() for p in model.parameters()) / 1e6,
            sum(p.numel() for p in self.params) / 1e6, grpo.finetune, self.autocast,
        )

    # -- sampling ----------------------------------------------------------------------
    def autocast_context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self._dev.type, dtype=torch.bfloat16, enabled=self.autocast)

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """No-grad inference on a temporary copy of the weights: LoRA merged, bf16 where native.

        peft's per-layer adapter path costs about 3x in token-by-token decoding
        on a CPU, and autocast re-casts every frozen fp32 weight at every
        step. So sampling runs on weights that are merged and, where the
        device has bf16, already cast. The training weights are put back
        untouched afterwards: the fp32 tensors are kept aside, not
        round-tripped through arithmetic.
        """
        self.model.eval()
        originals = [(param, param.data) for param in self.model.parameters()]
        lora = self.grpo.finetune == "lora"
        try:
            with torch.no_grad():
                for param, data in originals:
                    if self.autocast:
                        param.data = data.to(torch.bfloat16)
                    elif lora:
                        param.data = data.clone()  # merge_adapter writes in place
                if lora:
                    self.model.merge_adapter()
                yield
        finally:
            if lora:
                self.model.unmerge_adapter()  # resets peft's merged flags; the data is discarded next
            for param, data in originals:
                param.data = data

    def fast_decoder(self) -> bool:
        """Whether `engine.backends.decode` covers this model (logged once when it does not)."""
        reason = unsupported_reason(self.model.config)
        if reason is not None and not getattr(self, "_fallback_logged", False):
            self._fallback_logged = True
            log.info("Sampling with HF generate: the fast decoder does not support %s.", reason)
        return reason is None

    def decode_rows(
        self, prompts: Sequence[list[int]], n: int, max_new_tokens: int, temperature: float | None,
        on_step: StepCallback | None, adapters: Sequence[LoraAdapter] = (), **options: Any,
    ) -> list[DecodedRow]:
        """Runs `decode_batch` on a fresh inference copy of the weights, dropped afterwards.

        The `inference` idea without touching the model: the weights are
        merged with this node's LoRA (or, with per-row adapters, left as the
        frozen base) and cast to bf16 where native, in new tensors (q/k/v
        and gate/up fused); the training weights stay as they are.
        """
        dtype = torch.bfloat16 if self.autocast else torch.float32
        merge = LoraAdapter.from_peft(self.model) if not adapters and self.grpo.finetune == "lora" else None
        rows = decode_batch(
            DecodeModel(self.model, dtype, merge=merge, packed=self.pack_weights), prompts, n, max_new_tokens,
            self.eos_token_id, temperature,
            on_step, adapters=adapters, **options,
        )
        release_memory()
        return rows

    def generate(
        self,
        prompts: Sequence[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        on_step: StepCallback | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> list[Completion]:
        """`n` sampled completions of each prompt, grouped by prompt, with behaviour log-probs.

        Each prompt runs through the model once (not at all when in `prompt_cache`), its KV cache serving all
        n completions; rows that reach EOS leave the batch (engine.backends.decode).
        """
        if not self.fast_decoder():
            return self.generate_hf(prompts, n, max_new_tokens, temperature, on_step)
        rows = self.decode_rows(prompts, n, max_new_tokens, temperature, on_step, prompt_cache=prompt_cache)
        return [Completion(self.decode(r.tokens), r.tokens, r.logprobs, r.finished) for r in rows]

    def generate_hf(self, prompts: Sequence[list[int]], n: int, max_new_tokens: int, temperature: float,
                    on_step: StepCallback | None = None) -> list[Completion]:
        """The HF `generate` path: the fallback, and the peer that bench/rollout_speed.py measures against.

        Each prompt is run through the model once (its KV cache is then
        copied n times); every row runs until the longest completion stops.
        """
        ids, mask = left_pad(prompts, self.pad_token_id, self._dev)
        with self.inference():
            sequences, logprobs = hf_sample(self.model, ids, mask, n, max_new_tokens, temperature,
                                            self.pad_token_id, self.eos_token_id, on_step)
        release_memory()
        completions = []
        for (tokens, finished), lps in zip(split_rows(sequences, ids.shape[1], self.eos_token_id), logprobs,
                                           strict=True):
            completions.append(Completion(self.decode(tokens), tokens, lps[: len(tokens)], finished))
        return completions

    def greedy(self, prompts: Sequence[list[int]], max_new_tokens: int,
               on_step: StepCallback | None = None) -> list[str]:
        """Greedy answers: all prompts in cache-sized chunks, finished rows leaving (engine.backends.decode)."""
        if not self.fast_decoder():
            return self.greedy_hf(prompts, max_new_tokens, on_step)
        rows = self.decode_rows(prompts, 1, max_new_tokens, None, on_step)
        return [self.decode(r.tokens) for r in rows]

    def greedy_hf(self, prompts: Sequence[list[int]], max_new_tokens: int,
                  on_step: StepCallback | None = None) -> list[str]:
        """HF greedy answers, in chunks of similar prompt length so padding costs little (fallback and bench peer)."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        chunks = [order[i : i + GREEDY_CHUNK] for i in range(0, len(order), GREEDY_CHUNK)]
        answers: dict[int, str] = {}
        for number, chunk in enumerate(chunks):
            ids, mask = left_pad([prompts[i] for i in chunk], self.pad_token_id, self._dev)
            with self.inference():
                sequences = hf_greedy(self.model, ids, mask, max_new_tokens, self.pad_token_id, self.eos_token_id,
                                      on_step, max_new_tokens * len(chunks), number * max_new_tokens)
            for i, (tokens, _) in zip(chunk, split_rows(sequences, ids.shape[1], self.eos_token_id), strict=True):
                answers[i] = self.decode(tokens)
        return [answers[i] for i in range(len(prompts))]

    # -- log-probs and training --------------------------------------------------------
    def packs_training(self) -> bool:
        """Whether `batch_logprobs` runs the packed forward (`engine.backends.train_forward`); logged once when
        it cannot."""
        if not self.packed_training:
            return False
        reason = train_unsupported_reason(self.model)
        if reason is not None and not getattr(self, "_hf_training_logged", False):
            self._hf_training_logged = True
            log.info("Training through HF's forward: the packed forward does not support %s.", reason)
        return reason is None

    def batch_logprobs(self, pairs: Sequence[tuple[list[int], list[int]]], temperature: float) -> tuple[torch.Tensor,
                                                                                                        torch.Tensor]:
        """Log-probs [n, T] of each completion token, and the completion mask.

        Each distinct prompt runs once, its completions packed after it in
        one sequence with no padding (`engine.backends.train_forward`); the
        same result and gradients as one forward per sequence, within float
        rounding (tested). Models it does not cover go through `batch_logprobs_hf`.
        """
        if not self.packs_training():
            return self.batch_logprobs_hf(pairs, temperature)
        return packed_logprobs(self.model, pairs, temperature, self._before_layer)

    def batch_logprobs_hf(
        self, pairs: Sequence[tuple[list[int], list[int]]], temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`batch_logprobs` through HF's forward (`hf_logprobs`): the fallback, and the peer bench/train_speed.py
        measures."""
        return hf_logprobs(self.model, pairs, temperature, self.pad_token_id, self._dev)

    def behaviour_logprobs(self, items: Sequence[tuple[list[int], list[int]]], temperature: float) -> list[list[float]]:
        """Log-probs under the current policy for text that this node did not sample (swarm items)."""
        while True:
            rows = self.budget.limits(self.grpo)[0]
            try:
                out: list[list[float]] = []
                with self.inference():
                    for start in range(0, len(items), rows):
                        chunk = items[start : start + rows]
                        logp, _ = self.batch_logprobs(chunk, temperature)
                        out.extend(row[: len(c)] for row, (_, c) in zip(logp.tolist(), chunk, strict=True))
                return out
            except torch.OutOfMemoryError:
                pass  # handled outside the except block, so the failed pass's tensors are freed first
            self._shrink_after_oom("scoring swarm rollouts")

    def _shrink_after_oom(self, phase: str) -> None:
        """Free the device's caches, then halve the micro-batch (or give up with advice)."""
        release_memory()
        if self._dev.type == "cuda":
            torch.cuda.empty_cache()
        self.budget.shrink_after_oom(self.grpo, self.device.name, phase)

    @contextlib.contextmanager
    def _reference_mode(self) -> Iterator[torch.nn.Module]:
        if self.reference is not None:
            yield self.reference
        else:
            with self.model.disable_adapter():
                yield self.model

    def train(self, items: Sequence[TrainItem], on_step: StepCallback | None = None) -> dict[str, float]:
        """`pg_steps` optimiser steps over `items`, micro-batched; returns averaged stats.

        A step that runs out of memory is thrown away (its partial gradients
        too) and redone with half the micro-batch. `on_step` is also called
        before every decoder layer's forward, so a stop or pause takes effect
        within one layer rather than one whole step; a stop raised there
        leaves no gradient behind and no optimiser step half-done.
        """
        self.model.train()
        try:
            with self._layer_checks(on_step) as tracked:
                return train_steps(
                    items, self.grpo, self.budget, shared_prompts=True, packed=self.packs_training(),
                    accumulate=self._accumulate_step,
                    apply=self._apply_step, is_oom=lambda exc: isinstance(exc, torch.OutOfMemoryError),
                    after_oom=self._after_oom, on_step=tracked,
                )
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            release_memory()

    def accumulate_gradients(self, items: Sequence[TrainItem]) -> dict[str, float]:
        """One step's forward and backward over `items`, micro-batched as `train` cuts them, without the
        optimizer step: the gradients are left in `params`, the step's stats returned.

        What the tests and bench/train_speed.py compare between the packed forward and HF's.
        """
        self.model.train()
        chunks = micro_batches(items, *self.budget.limits(self.grpo), shared_prompts=True, packed=self.packs_training())
        return self._accumulate_step(chunks, float(sum(len(it.completion_ids) for it in items)), 0, None)[1]

    @contextlib.contextmanager
    def _layer_checks(self, on_step: StepCallback | None) -> Iterator[StepCallback | None]:
        """Yields `on_step`, wrapped so that it is also called, with the last progress it was
        given, before each decoder layer runs (forward and recomputation alike)."""
        if on_step is None:
            yield None
            return
        callback = on_step
        progress = [0, 1]
        lock = threading.Lock()

        def tracked(done: int, total: int) -> None:
            with lock:
                progress[:] = [done, total]
                callback(done, total)

        def check() -> None:
            with lock:  # the lanes of `engine.backends.train_lanes` call it from their threads
                callback(progress[0], progress[1])

        # The HF forward calls its decoder layers' hooks, the packed forward `_before_layer`.
        hooks = [module.register_forward_pre_hook(lambda _module, _args: check())
                 for module in self.model.modules() if type(module).__name__.endswith("DecoderLayer")]
        self._before_layer = check
        try:
            yield tracked
        finally:
            self._before_layer = None
            for hook in hooks:
                hook.remove()

    def _apply_step(self, _grads: object) -> float | None:
        norm = None
        if self.grpo.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grpo.max_grad_norm))
        self.optimizer.step()
        return norm

    def _after_oom(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._shrink_after_oom("training")

    def _accumulate_step(
        self, chunks: list[list[TrainItem]], total_tokens: float, step: int, on_step: StepCallback | None
    ) -> tuple[None, dict[str, float]]:
        """Forward and backward over every chunk (side by side in lanes where `lane_count` allows,
        `engine.backends.train_lanes`), gradients summed in the parameters; the step's stats."""
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "grad_norm": 0.0}

        def done(index: int, stats: Any) -> None:
            weight = stats.tokens / total_tokens
            sums["loss"] += stats.loss
            sums["clip_fraction"] += stats.clip_fraction * weight
            sums["kl"] += stats.kl * weight
            if on_step is not None:
                on_step(step * len(chunks) + index + 1, g.pg_steps * len(chunks))

        g = self.grpo
        # Lanes share the model: not with the KL reference (it switches the adapters off) or dropout (its draws).
        alone = g.finetune == "lora" and g.kl_beta == 0 and g.lora_dropout == 0 and self.train_lanes
        lanes = lane_count(self._dev, len(chunks), alone, largest_lane(self.model.config, chunks))
        if lanes > 1 and self.packs_training():
            run_lanes(chunks, lanes, lambda chunk: self._chunk_loss(chunk, total_tokens), self.params, done)
            return None, sums
        for index, chunk in enumerate(chunks):
            loss, stats = self._chunk_loss(chunk, total_tokens)
            loss.backward()
            done(index, stats)
        return None, sums

    def _chunk_loss(self, chunk: list[TrainItem], total_tokens: float) -> tuple[torch.Tensor, Any]:
        """One micro-batch's share of the step's loss, and its stats."""
        g = self.grpo
        pairs = [(it.prompt_ids, it.completion_ids) for it in chunk]
        old = torch.zeros((len(chunk), max(len(it.completion_ids) for it in chunk)))
        for row, it in enumerate(chunk):
            old[row, : len(it.old_logprobs)] = torch.tensor(it.old_logprobs)
        adv = torch.tensor([it.advantage for it in chunk], dtype=torch.float32, device=self._dev)
        weights = None
        if any(it.weights is not None for it in chunk):
            weights = torch.ones_like(old)
            for row, it in enumerate(chunk):
                if it.weights is not None:
                    weights[row, : len(it.weights)] = torch.tensor(it.weights)
            weights = weights.to(self._dev)
        ref_logp = None
        with self.autocast_context():
            if g.kl_beta > 0:
                with torch.no_grad(), self._reference_mode() as ref_model:
                    saved, self.model = self.model, ref_model
                    try:
                        ref_logp, _ = self.batch_logprobs(pairs, self.temperature)
                    finally:
                        self.model = saved
            logp, mask = self.batch_logprobs(pairs, self.temperature)
            return clipped_pg_loss(
                logp, old.to(self._dev), adv, mask, g.eps_low, g.eps_high, total_tokens,
                ref_logp=ref_logp, kl_beta=g.kl_beta, weights=weights,
            )

    def reseed(self, seed: int) -> None:
        """Make this round's sampling reproducible (same seed, same round -> same rollouts)."""
        torch.manual_seed(seed)
        random.seed(seed)

    def apply_settings(self, grpo: GRPOConfig, temperature: float) -> None:
        """New GRPO settings and sampling temperature, from a settings reload; the shape is unchanged."""
        self.grpo = grpo
        self.temperature = temperature
        for group in self.optimizer.param_groups:
            group["lr"] = grpo.learning_rate

    # -- persistence -------------------------------------------------------------------
    def _trainable_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(self.model).items()}

    def save(self, folder: Path) -> list[str]:
        folder = Path(folder)
        if self.grpo.finetune == "lora":
            save_file(self._trainable_state(), str(folder / ADAPTER_FILE))
            weights = ADAPTER_FILE
        else:
            save_model(self.model, str(folder / WEIGHTS_FILE))
            weights = WEIGHTS_FILE
        torch.save(self.optimizer.state_dict(), folder / OPTIMIZER_FILE)
        torch.save(self.rng_state(), folder / RNG_FILE)
        return [weights, OPTIMIZER_FILE, RNG_FILE]

    def load(self, folder: Path) -> None:
        folder = Path(folder)
        try:
            if self.grpo.finetune == "lora":
                from peft import set_peft_model_state_dict

                result = set_peft_model_state_dict(self.model, load_file(str(folder / ADAPTER_FILE)))
                unexpected = getattr(result, "unexpected_keys", [])
                if unexpected:
                    raise CheckpointError(f"Checkpoint {folder} holds adapters for a different model.")
            else:
                load_model(self.model, str(folder / WEIGHTS_FILE))
            self.optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE, weights_only=True))
            rng = torch.load(folder / RNG_FILE, weights_only=True)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"Checkpoint {folder} could not be loaded: {exc}") from exc
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    def rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def export(self, folder: Path) -> None:
        """Write a merged HF folder (safetensors, tokenizer, chat template). Ends training use."""
        model: Any = self.model.merge_and_unload() if self.grpo.finetune == "lora" else self.model
        model = model.to("cpu").to(torch.float32)
        with atomic_dir(Path(folder)) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
