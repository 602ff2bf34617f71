"""Rollout speed: the fast decoder (engine/backends/decode.py) against HF generate, measured in one run.

    .venv/bin/python -m bench.rollout_speed              # full: 2 rounds, evaluation of 27, 54 and 108, adapters, RSS
    .venv/bin/python -m bench.rollout_speed --quick      # smaller (under 5 minutes on the 2-core dev machine)
    .venv/bin/python -m bench.rollout_speed --threads 1  # torch threads (default: torch's, as the engine)
    .venv/bin/python -m bench.rollout_speed --old-path-run /tmp/old30 --rounds 30   # a learning run on HF generate

One backend (bundled SmolLM2-135M-Instruct, the default config: LoRA, bf16
where native, else fp32) runs both sides in this process, alternating old and
new, repeat by repeat, so load from other processes falls on both:

1. **Sampling.** The default round's real questions and seeds (rounds 1..R:
   B questions x G completions, up to 48 new tokens, temperature 0.7,
   `backend.reseed(derive_seed(seed, round))` as the engine does). Old is
   `TorchBackend.generate_hf` (HF generate), new is `generate`. Useful
   tokens are the completions' own tokens (EOS included), as the round's
   `tokens_per_second` counts them.
2. **Roofline and sampler.** The model's own matmuls (q/k/v, o, gate/up, down per layer,
   then the LM head) as plain GEMMs at the batch's row count, in the decoder's
   dtype: B x G rows divided by that GEMM time is the decode throughput with
   no attention, no sampling, no prompt and no overhead. The new path's useful
   tok/s is reported as a share of it. The sampler alone (HF's softmax +
   multinomial + log_softmax against the decoder's inverse CDF) is timed on
   one step's logits.
3. **Greedy evaluation** of the held-out set of 27 (the default before this
   bench), old (`greedy_hf`) against new (`greedy`), with the count of
   identical answers; then the new path on larger sets (54, 108), against
   the old path's time for 27: one evaluation runs every 10 rounds.
4. **Per-row adapters.** Four random LoRA adapters (the engine's rank and
   alpha) over the frozen base, the round's prompts split between them, every
   row forced to the full 48 tokens (no EOS) so all sides do the same work:
   one batch with 4 adapters against the same batch with 1 adapter, against
   the node's merged-weights path, and against 4 separate runs.
5. **Peak RSS of a default round** (full run only): one child process per
   side runs `Node.run_round()` once (solo, no evaluation) and reports its
   peak RSS and the round's `tokens_per_second`.

Each timed side also reports this process's CPU seconds: on a shared
machine a side's wall time depends on what else runs meanwhile, its CPU
seconds (with --threads 1) count its own work.

6. **llama.cpp** (where llama-cpp-python is installed): the same prompts and
   sampling settings (plain tempered sampling: no top-k, top-p or min-p) on
   the bundled GGUF (Q4_1, the very weights the torch model is dequantized
   from), one completion after another through `Llama.generate`, which keeps
   the prompt's KV cache between completions of the same prompt. Its
   log-probs are not torch's, so the trainer recomputes the behaviour
   log-probs with one forward pass; that time is added to its side.

The last line is always `useful tok/s new/old = X.XX`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench.roofline import gemm_seconds, measured, peak_rss_bytes, timed

REPO_ROOT = Path(__file__).resolve().parents[1]


def unique_prompt_tokens(prompts: list[list[int]]) -> int:
    """Prompt tokens the fast decoder computes: each prompt's tokens after its longest common prefix with the one
    before in sorted order."""
    from engine.backends.decode import common_prefix

    ordered = sorted(prompts)
    total = len(ordered[0]) if ordered else 0
    for before, prompt in itertools.pairwise(ordered):
        total += len(prompt) - min(common_prefix(before, prompt), len(prompt) - 1)
    return total

def random_adapters(backend: Any, count: int, seed: int) -> list[Any]:
    """`count` LoRA adapters shaped like the node's own (rank, alpha, target layers), random values."""
    import torch

    from engine.backends.decode import LoraAdapter

    template = LoraAdapter.from_peft(backend.model)
    generator = torch.Generator().manual_seed(seed)
    adapters = []
    for _ in range(count):
        weights = {}
        for key, (a, b, scaling) in template.weights.items():
            new_a = torch.randn(a.shape, generator=generator) / a.shape[1] ** 0.5
            new_b = torch.randn(b.shape, generator=generator) * 0.02
            weights[key] = (new_a, new_b, scaling)
        adapters.append(LoraAdapter(weights))
    return adapters


def llama_sampling(prompts: Sequence[list[int]], completions: int, max_new_tokens: int, temperature: float,
                   threads: int, seed: int) -> tuple[float, float, int, list[tuple[list[int], list[int]]]] | str:
    """llama.cpp on the bundled GGUF: (wall s, CPU s, useful tokens, (prompt, completion) pairs), or why not."""
    try:
        from llama_cpp import Llama
    except Exception as exc:  # noqa: BLE001 - any failure to load means: not measured
        return f"llama-cpp-python is not usable here ({type(exc).__name__}: {exc})"
    from engine.common.model_policy import bundled_gguf_path

    llm = Llama(model_path=str(bundled_gguf_path()), n_ctx=2048, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    eos = llm.token_eos()
    pairs: list[tuple[list[int], list[int]]] = []
    useful = 0

    def sample_all() -> None:
        nonlocal useful
        for p_index, prompt in enumerate(prompts):
            for c_index in range(completions):
                llm.set_seed(seed * 100_003 + p_index * 101 + c_index)
                out: list[int] = []
                for token in llm.generate(prompt, top_k=0, top_p=1.0, min_p=0.0, temp=temperature,
                                          repeat_penalty=1.0):
                    out.append(token)
                    if token == eos or len(out) >= max_new_tokens:
                        break
                useful += len(out)
                pairs.append((list(prompt), out))

    wall, cpu, _ = measured(sample_all)
    return wall, cpu, useful, pairs


def rss_round(side: str, threads: int) -> dict[str, Any]:
    """Child: one default round (solo, no evaluation) with the old or new sampler; its peak RSS and metrics."""
    import torch

    from engine.common.config_file import build_config
    from engine.common.paths import Paths
    from engine.node.loop import Node

    if threads:
        torch.set_num_threads(threads)
    cfg = build_config("default", None,
                       ["tasks.eval_every=0", "run.device='cpu'", "swarm.mode='solo'", "run.seed=0",
                        f"run.threads={threads}"])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = Paths(config_dir=work / "config", data_dir=work / "data", cache_dir=Paths.default().cache_dir,
                      log_dir=work / "logs")
        node = Node(cfg, paths, emit=lambda event: None)
        node.setup()
        backend: Any = node.backend
        if side == "old":
            backend.generate = backend.generate_hf
        metrics = node.run_round()
    return {
        "peak_rss_bytes": peak_rss_bytes(),
        "tokens_per_second": metrics["tokens_per_second"],
        "generate_seconds": metrics["generate_seconds"],
        "train_seconds": metrics["train_seconds"],
    }


def old_path_run(home: Path, rounds: int, threads: int) -> int:
    """`sapling-node run --home HOME --rounds N --solo` with HF generate for sampling and evaluation: the control
    run."""
    import torch

    from engine.common.config_file import build_config
    from engine.common.paths import Paths
    from engine.node.loop import Node

    if threads:
        torch.set_num_threads(threads)
    cfg = build_config("default", None,
                       [f"run.max_rounds={rounds}", "swarm.mode='solo'", "run.seed=0", f"run.threads={threads}"])
    node = Node(cfg, Paths.under(home),
                emit=lambda event: print(json.dumps(event)) if event.get("type") in ("round", "eval") else None)
    node.setup()
    backend: Any = node.backend
    backend.generate, backend.greedy = backend.generate_hf, backend.greedy_hf
    return node.run()


PLAIN = "new, plain matmuls"  # the new path with its weights as plain matmuls (not reordered for oneDNN)


@dataclass
class Bench:
    """What the bench's steps share: its flags, the bundled model's backend and tasks, the round's shape."""

    args: argparse.Namespace
    cfg: Any
    backend: Any
    taskset: Any
    rounds: int
    repeats: int
    questions: int
    dtype: Any
    packs: bool  # the decoder reorders its weights for oneDNN here: the plain-matmul side is measured too
    round_prompts: list[tuple[int, list[list[int]]]] = field(default_factory=list)

    @property
    def tasks(self) -> Any:
        return self.cfg.tasks

    @property
    def rows(self) -> int:
        return self.questions * self.tasks.completions_per_question

    def plain(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn on the new path with plain matmul weights (not reordered for oneDNN)."""
        def run(*args: Any) -> Any:
            self.backend.pack_weights = False
            try:
                return fn(*args)
            finally:
                self.backend.pack_weights = None
        return run


def alternating(names: Sequence[str], repeats: int) -> list[str]:
    """The sides in the order they run: forwards on even repeats, backwards on odd ones, so load falls on all."""
    return [name for rep in range(repeats) for name in (list(names) if rep % 2 == 0 else list(reversed(names)))]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one round of 4 questions, 9 held-out questions, no RSS children")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default 0: torch's default, as the engine)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of questions to sample (default 2, quick 1)")
    parser.add_argument("--repeats", type=int, default=None, help="alternating repeats per side (default 2, quick 1)")
    parser.add_argument("--eval-small", type=int, default=27,
                        help="held-out questions timed old against new (default 27, the set before this bench)")
    parser.add_argument("--eval-large", type=str, default="54,108",
                        help="larger held-out sets timed on the new path (default 54,108)")
    parser.add_argument("--rss-child", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--old-path-run", type=Path, metavar="HOME",
                        help="instead of the bench: train --rounds rounds (default 30) solo under HOME with the old "
                             "HF sampler")
    return parser.parse_args(argv)


def set_up(args: argparse.Namespace) -> Bench:
    """The bundled model on the CPU, the round's shape from the flags, each round's prompts; the header line."""
    import torch

    from bench.bundled import bundled_cpu
    from engine.backends.decode import can_pack

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, backend, taskset = bundled_cpu()
    dtype = torch.bfloat16 if backend.autocast else torch.float32
    b = Bench(args, cfg, backend, taskset, rounds=args.rounds or (1 if args.quick else 2),
              repeats=args.repeats or (1 if args.quick else 2),
              questions=4 if args.quick else cfg.tasks.questions_per_round, dtype=dtype,
              packs=can_pack(torch.device(backend.device.torch_device), dtype))
    t = b.tasks
    print(f"rollout_speed: bundled SmolLM2-135M, {b.questions} questions x {t.completions_per_question} completions, "
          f"up to {t.max_new_tokens} new tokens, temperature {t.temperature}, rounds 1..{b.rounds}, "
          f"{torch.get_num_threads()} threads, decoder dtype {str(dtype).replace('torch.', '')} "
          f"(bf16 native: {'yes' if backend.device.bf16 else 'no'}), "
          f"LoRA r{cfg.grpo.lora_rank}{', quick' if args.quick else ''}")
    for r in range(1, b.rounds + 1):
        drawn = taskset.draw(r, b.questions)
        b.round_prompts.append((r, [backend.encode_prompt(taskset.messages(q)) for q in drawn]))
    return b


def sampling(b: Bench) -> dict[str, float]:
    """1. Sampling, old and new alternating: useful tok/s per side (printed, and returned)."""
    from engine.node.loop import derive_seed

    t, backend = b.tasks, b.backend
    G, T = t.completions_per_question, t.max_new_tokens
    sides = {"old": backend.generate_hf, "new": backend.generate}
    if b.packs:
        sides[PLAIN] = b.plain(backend.generate)
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in sides}
    useful: dict[str, list[int]] = {name: [] for name in sides}
    for name in alternating(list(sides), b.repeats):
        wall = cpu = 0.0
        tokens = 0
        for r, prompts in b.round_prompts:
            backend.reseed(derive_seed(b.cfg.run.seed, r))
            took, used, out = measured(partial(sides[name], prompts, G, T, t.temperature))
            wall, cpu = wall + took, cpu + used
            tokens += sum(len(c.token_ids) for c in out)
        seconds[name].append(wall)
        cpu_seconds[name].append(cpu)
        useful[name].append(tokens)
    rate = {name: sum(useful[name]) / sum(seconds[name]) for name in sides}
    cpu_rate = {name: sum(useful[name]) / sum(cpu_seconds[name]) for name in sides}
    print(f"sampling, {b.rounds} round(s) x {b.repeats} repeat(s) per side (prompt + decode; the weights' merge "
          f"copy included):")
    for name in sides:
        per_round = [round(s / b.rounds, 1) for s in seconds[name]]
        cpu_round = [round(s / b.rounds, 1) for s in cpu_seconds[name]]
        print(f"  {name}: {rate[name]:6.1f} useful tok/s   s/round {per_round}   CPU s/round {cpu_round}   "
              f"{cpu_rate[name]:.1f} useful tokens per CPU s   useful tokens/round "
              f"{sum(useful[name]) / len(useful[name]) / b.rounds:.0f} of {b.rows * T} decoded by HF at most")
    print(f"  useful tokens per CPU second new/old = {cpu_rate['new'] / cpu_rate['old']:.2f}")
    if PLAIN in rate:
        print(f"  weights reordered for oneDNN against plain matmuls: {rate['new'] / rate[PLAIN]:.2f}x useful tok/s")
    return rate


def llama_side(b: Bench, rate: dict[str, float]) -> None:
    """1b. llama.cpp on the same prompts, one completion at a time, plus the trainer's log-prob pass."""
    import torch

    from engine.node.loop import derive_seed

    t = b.tasks
    llama_wall = llama_cpu = 0.0
    llama_tokens = 0
    llama_note = ""
    for r, prompts in b.round_prompts:
        got = llama_sampling(prompts, t.completions_per_question, t.max_new_tokens, t.temperature,
                             torch.get_num_threads(), derive_seed(b.cfg.run.seed, r))
        if isinstance(got, str):
            llama_note = got
            break
        wall, cpu, tokens, pairs = got
        relogprob, relogprob_cpu, _ = measured(partial(b.backend.behaviour_logprobs, pairs, t.temperature))
        llama_wall, llama_cpu = llama_wall + wall + relogprob, llama_cpu + cpu + relogprob_cpu
        llama_tokens += tokens
        print(f"  llama.cpp round {r}: {wall:.1f} s sampling + {relogprob:.1f} s for torch's behaviour log-probs, "
              f"{tokens} useful tokens")
    if llama_note:
        print(f"  llama.cpp: not measured: {llama_note}")
    elif llama_wall:
        llama_rate = llama_tokens / llama_wall
        print(f"  llama.cpp (Q4_1 GGUF, sequential, log-probs recomputed): {llama_rate:6.1f} useful tok/s "
              f"({llama_tokens / llama_cpu:.1f} per CPU s); new torch path / llama.cpp = "
              f"{rate['new'] / llama_rate:.2f}")


def roofline(b: Bench, rate: dict[str, float]) -> None:
    """2. Roofline at the batch's row count, and the sampler alone on one step's logits."""
    import torch

    from engine.backends.decode import choose_tokens

    config, rows, dtype = b.backend.model.config, b.rows, b.dtype
    gemm = gemm_seconds(config, rows, dtype)
    if b.packs:
        packed_gemm = gemm_seconds(config, rows, dtype, packed=True)
        print(f"roofline: the model's matmuls for one {rows}-row step (its {config.num_hidden_layers} layers' own "
              f"weights) take {gemm * 1000:.0f} ms as plain GEMMs, {packed_gemm * 1000:.0f} ms with the weights "
              f"reordered for oneDNN; the faster is the roofline")
        gemm = min(gemm, packed_gemm)
    ceiling = rows / gemm
    print(f"roofline: {rows} rows / {gemm * 1000:.0f} ms of {str(dtype).replace('torch.', '')} GEMMs = "
          f"{ceiling:.0f} tok/s; new path {rate['new'] / ceiling:.1%} of it, old {rate['old'] / ceiling:.1%}")
    # The sampler alone: HF's (softmax, multinomial, and the recorder's log_softmax) against ours.
    temperature = b.tasks.temperature
    logits = torch.randn(rows, config.vocab_size) * 3
    uniforms = torch.rand(rows)
    hf_sampler = statistics.median(timed(lambda: (
        torch.multinomial(torch.softmax(logits / temperature, -1), 1), torch.log_softmax(logits / temperature, -1)
    ))[0] for _ in range(5))
    our_sampler = statistics.median(timed(lambda: choose_tokens(logits, temperature, uniforms))[0] for _ in range(5))
    print(f"sampler for one {rows}-row step: HF softmax + multinomial + log_softmax {hf_sampler * 1000:.0f} ms, "
          f"inverse CDF {our_sampler * 1000:.0f} ms")


def greedy_eval(b: Bench) -> None:
    """3. Greedy evaluation of the small held-out set, old against new (and plain); the new path on larger sets."""
    backend, taskset, T = b.backend, b.taskset, b.tasks.max_new_tokens
    small = 9 if b.args.quick else b.args.eval_small
    eval_prompts = [backend.encode_prompt(taskset.eval_messages(q)) for q in taskset.eval_set(small)]
    varied = [backend.encode_prompt(taskset.messages(q)) for q in taskset.eval_set(small)]
    print(f"held-out prompts: {sum(map(len, eval_prompts))} tokens with one worked example per specialty (the "
          f"evaluation's), {sum(map(len, varied))} with one per question (training's); of these the decoder computes "
          f"about {unique_prompt_tokens(eval_prompts)} and {unique_prompt_tokens(varied)} (the rest are shared "
          f"prefixes)")
    greedy = {"old": backend.greedy_hf, "new": backend.greedy}
    if b.packs:
        greedy[PLAIN] = b.plain(backend.greedy)
    eval_s: dict[str, list[float]] = {name: [] for name in greedy}
    eval_cpu: dict[str, list[float]] = {name: [] for name in greedy}
    answers: dict[str, list[str]] = {}
    for name in alternating(list(greedy), b.repeats):
        took, used, answers[name] = measured(partial(greedy[name], eval_prompts, T))
        eval_s[name].append(took)
        eval_cpu[name].append(used)
    old_eval, new_eval = statistics.median(eval_s["old"]), statistics.median(eval_s["new"])
    old_cpu, new_cpu = statistics.median(eval_cpu["old"]), statistics.median(eval_cpu["new"])
    same = sum(x == y for x, y in zip(answers["old"], answers["new"], strict=True))
    print(f"greedy evaluation, {small} held-out questions: old {old_eval:.1f} s "
          f"{[round(s, 1) for s in eval_s['old']]}, "
          f"new {new_eval:.1f} s {[round(s, 1) for s in eval_s['new']]}: {old_eval / new_eval:.2f}x faster "
          f"(CPU s old {old_cpu:.1f}, new {new_cpu:.1f}: {old_cpu / new_cpu:.2f}x); {same} of {small} answers "
          "identical")
    if PLAIN in eval_s:
        plain_eval = statistics.median(eval_s[PLAIN])
        same_plain = sum(x == y for x, y in zip(answers[PLAIN], answers["new"], strict=True))
        print(f"  new with plain matmuls: {plain_eval:.1f} s {[round(s, 1) for s in eval_s[PLAIN]]} "
              f"({old_eval / plain_eval:.2f}x the old path); oneDNN weights {plain_eval / new_eval:.2f}x faster, "
              f"{same_plain} of {small} answers identical to them")
    for large in [] if b.args.quick else [int(x) for x in b.args.eval_large.split(",") if x]:
        large_prompts = [backend.encode_prompt(taskset.eval_messages(q)) for q in taskset.eval_set(large)]
        large_s, large_cpu, _ = measured(partial(backend.greedy, large_prompts, T))
        print(f"greedy evaluation, {large} held-out questions, new: {large_s:.1f} s = {large_s / old_eval:.2f} x the "
              f"old path's time for {small} (CPU {large_cpu:.1f} s = {large_cpu / old_cpu:.2f} x; one evaluation per "
              f"10 rounds)")


def adapter_cases(b: Bench, new_tokens: int) -> dict[str, Callable[[], Any]]:
    """4. The same rows (the first round's prompts) decoded with 4 random adapters in one batch, 1 adapter in one
    batch, 1 adapter merged (the node's path), and 4 separate runs; every row forced to `new_tokens`."""
    from engine.backends.decode import DecodeModel, decode_batch

    backend, dtype, t = b.backend, b.dtype, b.tasks
    adapters = random_adapters(backend, 4, seed=7)
    prompts = b.round_prompts[0][1]
    index = [i * 4 // len(prompts) for i in range(len(prompts))]
    seeds = [11, 12, 13, 14]
    base = DecodeModel(backend.model, dtype)

    def run(model: Any, chosen: list[int], **lora: Any) -> Any:
        backend.reseed(1)
        return decode_batch(model, [prompts[i] for i in chosen], t.completions_per_question, new_tokens, -1,
                            t.temperature, **lora)

    everything = list(range(len(prompts)))
    return {
        "4 adapters, one batch": lambda: run(base, everything, adapters=adapters, adapter_index=index, seeds=seeds),
        "1 adapter, one batch": lambda: run(base, everything, adapters=adapters[:1],
                                            adapter_index=[0] * len(prompts), seeds=seeds[:1]),
        "1 adapter merged (the node's path)": lambda: run(DecodeModel(backend.model, dtype, merge=adapters[0]),
                                                          everything),
        "4 separate runs": lambda: [
            run(base, [i for i in everything if index[i] == a], adapters=[adapters[a]],
                adapter_index=[0] * index.count(a), seeds=[seeds[a]])
            for a in range(4)
        ],
    }


def per_row_adapters(b: Bench) -> None:
    """4. Per-row adapters: each case of `adapter_cases` timed, and the 4-adapter batch against separate runs."""
    new_tokens = 8 if b.args.quick else b.tasks.max_new_tokens
    cases = adapter_cases(b, new_tokens)
    case_s: dict[str, list[float]] = {name: [] for name in cases}
    case_cpu: dict[str, list[float]] = {name: [] for name in cases}
    outputs: dict[str, Any] = {}
    for name in alternating(list(cases), b.repeats):
        took, used, outputs[name] = measured(cases[name])
        case_s[name].append(took)
        case_cpu[name].append(used)
    separate = [row for part in outputs["4 separate runs"] for row in part]
    same_rows, worst = 0, 0.0
    for a, c in zip(outputs["4 adapters, one batch"], separate, strict=True):
        same_rows += a.tokens == c.tokens
        common = next((k for k, (x, y) in enumerate(zip(a.tokens, c.tokens, strict=True)) if x != y), len(a.tokens))
        # Up to, not at, the first differing token: there the two log-probs are of different tokens.
        worst = max([worst] + [abs(x - y) for x, y in zip(a.logprobs[:common], c.logprobs[:common], strict=True)])
    mixed = statistics.median(case_s["4 adapters, one batch"])
    mixed_cpu = statistics.median(case_cpu["4 adapters, one batch"])
    print(f"per-row adapters, {len(b.round_prompts[0][1])} prompts x {b.tasks.completions_per_question} rows x "
          f"{new_tokens} tokens (no EOS), 4 adapters of rank {b.cfg.grpo.lora_rank}:")
    for name, values in case_s.items():
        median, cpu = statistics.median(values), statistics.median(case_cpu[name])
        print(f"  {name:36s} {median:6.1f} s {[round(v, 1) for v in values]}  CPU {cpu:6.1f} s   "
              f"4-adapter batch / this = {mixed / median:.2f} (CPU {mixed_cpu / cpu:.2f})")
    print(f"  rows of the 4-adapter batch identical to the separate runs': {same_rows} of {len(separate)}; log-probs "
          f"up to the first differing token within {worst:.1e} (attention spans the batch's longest prompt, masked "
          f"columns included, which moves its float rounding; that can carry a draw across a token, in bf16 often)")


def peak_rss(threads: int) -> None:
    """5. Peak RSS of a default round, one child per side."""
    children = {}
    for name in ("old", "new"):
        out = subprocess.run(
            [sys.executable, "-m", "bench.rollout_speed", "--rss-child", name, "--threads", str(threads)],
            cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        )
        children[name] = json.loads(out.stdout.strip().splitlines()[-1])
    o, n = children["old"], children["new"]
    print(f"default round in a child (solo, no evaluation): peak RSS old {o['peak_rss_bytes'] / 2**30:.2f} GB, "
          f"new {n['peak_rss_bytes'] / 2**30:.2f} GB ({n['peak_rss_bytes'] / o['peak_rss_bytes'] - 1:+.1%}); "
          f"metrics tokens_per_second old {o['tokens_per_second']:.1f}, new {n['tokens_per_second']:.1f}; "
          f"generate s old {o['generate_seconds']:.1f}, new {n['generate_seconds']:.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.old_path_run:
        old_path_run(args.old_path_run, args.rounds or 30, args.threads)
        return 0
    if args.rss_child:
        print(json.dumps(rss_round(args.rss_child, args.threads)))
        return 0
    b = set_up(args)
    rate = sampling(b)
    llama_side(b, rate)
    roofline(b, rate)
    greedy_eval(b)
    per_row_adapters(b)
    if not args.quick:
        peak_rss(args.threads)
    print(f"reproduce: .venv/bin/python -m bench.rollout_speed{' --quick' if args.quick else ''}"
          f"{f' --threads {args.threads}' if args.threads else ''}")
    print(f"useful tok/s new/old = {rate['new'] / rate['old']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
