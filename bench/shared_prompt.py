"""The training pass with shared prompts against one forward per sequence, measured in one run.

A GRPO round trains on G completions of each question, and all G share the
question's prompt. `TorchBackend.batch_logprobs` runs each distinct prompt
through the model once (packed with its completions since issue 36,
engine/backends/train_forward.py; bench/train_speed.py measures that against
the KV-cache-copy pass before it). The peer here is the plain pass both
replaced: each prompt + completion as one left-padded row, so every prompt
is recomputed G times.

    .venv/bin/python -m bench.shared_prompt              # bundled model, default round shape
    .venv/bin/python -m bench.shared_prompt --questions 4 --completions 8 --repeats 3

Both sides run on the same backend, in the same process, on the same batch:
the default round's real prompts (one solved example, then the question)
with completions sampled from the model, micro-batched by the engine's own
`micro_batches`, forward and backward under the engine's autocast. The sides
alternate, and each repeat's time is printed; the headline is the median.
It also checks that both sides give the same loss.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def plain_logprobs(backend: Any, pairs: Sequence[tuple[list[int], list[int]]], temperature: float) -> tuple[Any, Any]:
    """The pass before prompt sharing: one left-padded row per prompt + completion."""
    import torch

    prompt_w = max(len(p) for p, _ in pairs)
    comp_w = max(len(c) for _, c in pairs)
    n = len(pairs)
    ids = torch.full((n, prompt_w + comp_w), backend.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros((n, comp_w), dtype=torch.float32)
    for row, (prompt, comp) in enumerate(pairs):
        ids[row, prompt_w - len(prompt) : prompt_w] = torch.tensor(prompt)
        ids[row, prompt_w : prompt_w + len(comp)] = torch.tensor(comp)
        attn[row, prompt_w - len(prompt) : prompt_w + len(comp)] = 1
        mask[row, : len(comp)] = 1.0
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    out = backend.model(input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=comp_w + 1)
    logits = out.logits[:, :-1, :].float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(2, ids[:, prompt_w:].unsqueeze(2)).squeeze(2)
    return logp, mask


@dataclass
class Round:
    """One round's training input on the bundled model: its prompts, (prompt, completion) pairs, micro-batches."""

    cfg: Any
    backend: Any
    B: int
    G: int
    prompts: list[list[int]]
    pairs: list[tuple[list[int], list[int]]]
    chunks: list[list[tuple[list[int], list[int]]]]
    total: float  # completion tokens: the loss is a sum over them, divided by this


def sample_round(questions: int | None, completions: int | None) -> Round:
    """Round 1's questions, sampled by the bundled model, cut into the trainer's micro-batches."""
    from engine.backends.base import TrainItem
    from engine.backends.batching import micro_batches
    from engine.backends.torch_backend import TorchBackend
    from engine.common.config import NodeConfig
    from engine.common.device import pick_device
    from engine.common.paths import Paths
    from engine.models.sources import resolve_model_dir
    from engine.questions.tasks import TaskSet

    cfg = NodeConfig()
    B = questions or cfg.tasks.questions_per_round
    G = completions or cfg.tasks.completions_per_question
    model_dir = resolve_model_dir("bundled", Paths.default().models_cache)
    backend = TorchBackend(model_dir, pick_device("cpu"), cfg.grpo, 0, cfg.tasks.temperature)
    taskset = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=0)
    prompts = [backend.encode_prompt(taskset.messages(q)) for q in taskset.draw(1, B)]
    backend.reseed(1)
    sampled = backend.generate(prompts, G, cfg.tasks.max_new_tokens, cfg.tasks.temperature)
    pairs = [(prompts[i // G], c.token_ids) for i, c in enumerate(sampled) if c.token_ids]
    rows, tokens = backend.budget.limits(cfg.grpo)
    items = [TrainItem(prompt, comp, [], 0.0) for prompt, comp in pairs]  # only their lengths matter here
    chunks = [[(it.prompt_ids, it.completion_ids) for it in chunk] for chunk in micro_batches(items, rows, tokens)]
    return Round(cfg, backend, B, G, prompts, pairs, chunks, float(sum(len(c) for _, c in pairs)))


def time_sides(r: Round, repeats: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Forward + backward over every micro-batch, shared prompts against plain rows, alternating: seconds per
    pass and the last pass's loss, per side."""
    backend = r.backend

    def one_pass(fn: Any) -> tuple[float, float]:
        backend.model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss_sum = 0.0
        for chunk in r.chunks:
            with backend.autocast_context():
                logp, mask = fn(chunk)
                loss = -(logp * mask).sum() / r.total
            loss.backward()
            loss_sum += float(loss.detach())
        return time.perf_counter() - start, loss_sum

    backend.model.train()
    sides = {
        "shared": lambda chunk: backend.batch_logprobs(chunk, backend.temperature),
        "plain": lambda chunk: plain_logprobs(backend, chunk, backend.temperature),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    losses: dict[str, float] = {}
    one_pass(sides["shared"])  # warm-up, not timed
    for _ in range(repeats):
        for name, fn in sides.items():
            seconds, losses[name] = one_pass(fn)
            times[name].append(seconds)
    backend.model.zero_grad(set_to_none=True)
    return times, losses


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=None, help="questions (default: the engine's B)")
    parser.add_argument("--completions", type=int, default=None, help="completions per question (default: G)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per side (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    r = sample_round(args.questions, args.completions)
    times, losses = time_sides(r, args.repeats)
    print(f"shared_prompt: bundled SmolLM2-135M, {r.B} questions x {r.G} completions, {len(r.pairs)} sequences in "
          f"{len(r.chunks)} micro-batches, {torch.get_num_threads()} threads, bf16 autocast "
          f"{'yes' if r.backend.device.bf16 else 'no'}, LoRA r{r.cfg.grpo.lora_rank}")
    print(f"tokens: prompts {sum(len(p) for p in r.prompts)} (each once), completions {int(r.total)}; "
          f"the plain pass reads {sum(len(p) for p, _ in r.pairs)} prompt tokens")
    for name in times:
        print(f"{name:7s} forward+backward s: median {statistics.median(times[name]):.2f}  raw "
              f"{[round(t, 2) for t in times[name]]}")
    ratio = statistics.median(times["shared"]) / statistics.median(times["plain"])
    print(f"ratio shared/plain = {ratio:.2f}; loss shared {losses['shared']:.6f}, plain {losses['plain']:.6f}")
    if abs(losses["shared"] - losses["plain"]) > 1e-3 * max(1e-6, abs(losses["plain"])) + 1e-4:
        print("the two passes disagree on the loss", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
