"""Training speed: the packed training step against HF's forward (the step before it), measured in one run.

How far is one GRPO training step from what this CPU's matmuls can do, and how much faster than before?

    .venv/bin/python -m bench.train_speed             # the default round's items, 3 alternating repeats per side
    .venv/bin/python -m bench.train_speed --quick     # two of its questions' items, 1 repeat
    .venv/bin/python -m bench.train_speed --threads 1 --repeats 5 --round 2 --items FILE

**Items.** Round R (default 1) of a default node (seed 0, the bundled model,
B questions x G completions of up to T tokens, temperature 0.7), sampled once
with the real backend (`TorchBackend.generate`), scored, and cut into the
round's `train_items` as the round loop does; saved as JSON (default
<cache dir>/bench/train_speed-round1.json) so that every run trains the same
items. `--quick` trains the items of the first two questions among them.

**Sides.** One backend: new is `packed_training = True`
(engine/backends/train_forward.py, and with 2+ threads the micro-batches
side by side in single-threaded lanes, engine/backends/train_lanes.py), old
is False (HF's forward, `TorchBackend.batch_logprobs_hf`, one micro-batch
after the other, every op on all threads). A timed step is `TorchBackend.train(items)`
whole (micro-batches, forward, backward, clipping, AdamW), each from the same
fresh adapter slot (`new_adapter_slot(1)`: A random, B zero, new AdamW), old
and new alternating repeat by repeat so load from other processes falls on both.

**FLOPs** are those the step needs, counted on the packed layout (each prompt
once, no padding), 2 per multiply-add. Forward: every token through each
layer's q, k, v, o, gate, up and down matmuls and LoRA's A and B products on
all seven; attention's QK^T and PV over the (query, key) pairs the mask
allows; the LM head for every completion token. Backward: the frozen weights
give input gradients only, one matmul the size of the forward's (none for the
first layer's q/k/v, whose input is the embedding, nor for the LM head's
weight); LoRA's A and B get input and weight gradients (2x their forward);
attention 2x its forward. RMSNorm, rotary, SiLU, softmax and AdamW are left
out (well under 1%). The old path computes more (padding, the prompt's
cache copied per completion); its GFLOP/s count the same needed FLOPs.

**Roofline.** The model's own matmuls as plain GEMMs at the step's largest
micro-batch (`bench.roofline`, as bench/rollout_speed.py measures decoding),
in the step's dtype, plain or reordered for oneDNN, the faster: this
machine's GEMM peak on these shapes.

**Where the time goes.** Per side: the forward alone (`batch_logprobs`), the
forward and backward (`accumulate_gradients`), the whole step; then one step
under torch.profiler, its op time sorted into matmuls, attention, the LM
head's softmax work, copies, the optimizer, other element-wise ops, and the
rest (autograd, Python, the profiler). Then tokens per second and peak RSS (one child
process per side trains the items twice).

**Right answer.** Once on the bundled model, after one step (so B is not
zero): in fp32 the two sides' loss and LoRA gradient must agree within
(tokens + hidden size) units of fp32's roundoff, the worst case of the sums
they are. Where the step runs in bf16, each side is compared with the fp32
step on the same weights, never with the other bf16 side: a GRPO gradient
nearly cancels within each question (its advantages sum to zero), so bf16
rounding moves it far (cosine about 0.5 on an Intel Xeon with AMX and with
oneDNN kept off AMX alike, `bench.bf16_gradient`). Each side must lie within
what its own completions' bf16 errors allow by the triangle inequality, and
the new side within the old one's bound (bench/harness/gradients.py). Exit
code 1 when a check fails.

The last line is the headline: `train step: new/old = X.XXx, Y% of the fp32 roofline`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.harness.gradients import against, flat_gradient, parts_in_bf16
from bench.roofline import ForeignLoad, gemm_flops, gemm_step, measured, peak_rss_bytes, timed

REPO_ROOT = Path(__file__).resolve().parents[1]
SIDES = ("old", "new")
QUICK_QUESTIONS = 2

# Profiler op names -> what they are (self time). Matmuls are told apart by their shapes (`matmul_kind`).
MATMULS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::linear", "aten::matmul")
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("attention", ("scaled_dot_product", "flash_attention")),
    ("LM head softmax", ("softmax", "aten::exp", "aten::amax", "aten::gather", "aten::log")),
    ("copies", ("aten::cat", "aten::copy_", "aten::index", "aten::fill_", "aten::zero_", "aten::scatter",
                "aten::clone", "aten::_to_copy", "aten::masked_fill", "aten::contiguous", "aten::new_zeros",
                "aten::split")),
    ("optimizer", ("_foreach", "adam", "linalg_vector_norm", "Optimizer")),
    ("other element-wise", ("aten::",)),
]
SPLIT = ("matmuls: frozen weights", "matmuls: LoRA", "matmuls: LM head", *(name for name, _ in CATEGORIES),
         "autograd, Python, profiler")


def items_path(args: argparse.Namespace) -> Path:
    from engine.common.paths import Paths

    return args.items or Paths.default().cache_dir / "bench" / f"train_speed-round{args.round}.json"


def round_items(backend: Any, cfg: Any, taskset: Any, round_index: int) -> list[Any]:
    """One round's training items as the round loop makes them: sample, score, group advantages, `train_items`."""
    from engine.node.loop import derive_seed
    from engine.rollouts.groups import Group, group_advantages, train_items

    t = cfg.tasks
    questions = taskset.draw(round_index, t.questions_per_round)
    prompts = [backend.encode_prompt(taskset.messages(q)) for q in questions]
    backend.reseed(derive_seed(cfg.run.seed, round_index))
    completions = backend.generate(prompts, t.completions_per_question, t.max_new_tokens, t.temperature)
    G = t.completions_per_question
    groups = []
    for i, (question, prompt) in enumerate(zip(questions, prompts, strict=True)):
        own = completions[i * G : (i + 1) * G]
        rewards = [taskset.reward(question, c.text) for c in own]
        groups.append(Group(question, prompt, list(own), rewards, group_advantages(rewards, cfg.grpo.adv_eps)))
    return train_items(groups)


def load_items(path: Path, meta: dict[str, Any], make: Callable[[], list[Any]]) -> tuple[list[Any], bool]:
    """The saved items when they were made for `meta`, else new ones from `make`, saved. (items, made now)."""
    from engine.backends.base import TrainItem
    from engine.common.atomicio import atomic_write_text

    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("meta") == meta:
            return [TrainItem(**item) for item in saved["items"]], False
    items = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"meta": meta, "items": [vars(it) for it in items]}))
    return items, True


def first_questions(items: Sequence[Any], count: int) -> list[Any]:
    """The items of the first `count` distinct prompts."""
    prompts: list[list[int]] = []
    for item in items:
        if item.prompt_ids not in prompts:
            prompts.append(item.prompt_ids)
    return [it for it in items if it.prompt_ids in prompts[:count]]


def layout(new_chunks: Sequence[Sequence[Any]], old_chunks: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Token counts of the packed layout (what the step needs) and of the old path's padded one, per its micro-batches.

    tokens: through every layer (each prompt once, each completion but its last token); kept: the positions
    whose state predicts a completion token, all the last layer needs past its keys and values; pairs and
    kept_pairs: the (query, key) pairs attention needs, in every layer and for the kept queries.
    """
    need = dict.fromkeys(("tokens", "kept", "pairs", "kept_pairs", "head_rows", "old_tokens", "old_head_rows"), 0.0)
    for chunk in new_chunks:
        groups: dict[tuple[int, ...], list[int]] = {}
        for it in chunk:
            groups.setdefault(tuple(it.prompt_ids), []).append(len(it.completion_ids))
        for prompt, lengths in groups.items():
            p = len(prompt)
            completions = sum((n - 1) * p + (n - 1) * n / 2 for n in lengths)
            need["tokens"] += p + sum(n - 1 for n in lengths)
            need["kept"] += 1 + sum(n - 1 for n in lengths)
            need["pairs"] += p * (p + 1) / 2 + completions
            need["kept_pairs"] += p + completions
            need["head_rows"] += sum(lengths)
    for chunk in old_chunks:
        distinct = {tuple(it.prompt_ids) for it in chunk}
        prompt_w, comp_w = max(len(p) for p in distinct), max(len(it.completion_ids) for it in chunk)
        need["old_tokens"] += len(distinct) * prompt_w + len(chunk) * (comp_w - 1)
        need["old_head_rows"] += len(distinct) + len(chunk) * (comp_w - 1)
    return need


def step_flops(config: Any, rank: int, need: dict[str, float]) -> dict[str, float]:
    """The FLOPs one step needs (the module docstring says how they are counted)."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    qkv, rest = [(h, q), (h, kv), (h, kv)], [(q, h), (h, inter), (h, inter), (inter, h)]
    tokens, kept = need["tokens"], need["kept"]
    # q, k and v for every token in every layer; the rest (o, gate, up, down) for the kept ones in the last layer.
    rows = {"qkv": tokens * layers, "rest": tokens * (layers - 1) + kept}
    frozen = 2 * (rows["qkv"] * sum(i * o for i, o in qkv) + rows["rest"] * sum(i * o for i, o in rest))
    lora = 2 * rank * (rows["qkv"] * sum(i + o for i, o in qkv) + rows["rest"] * sum(i + o for i, o in rest))
    attention = 2 * 2 * q * (need["pairs"] * (layers - 1) + need["kept_pairs"])
    head = 2 * need["head_rows"] * h * config.vocab_size
    forward = frozen + lora + attention + head
    first_qkv = 2 * tokens * h * (q + 2 * kv)
    backward = (frozen - first_qkv) + 2 * lora + 2 * attention + head
    return {"forward": forward, "backward": backward, "total": forward + backward}


def fresh_step(backend: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn on a fresh adapter slot (A from seed 1, B zero, new AdamW): every repeat does the same work."""
    def run() -> Any:
        backend.use_adapter_slot(backend.new_adapter_slot(1))
        return fn()
    return run


def on_side(backend: Any, side: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        backend.packed_training = side == "new"
        return fn()
    return run


def matmul_kind(shapes: Sequence[Sequence[int]], vocab: int, rank: int) -> str:
    """Which matmuls a profiled mm/addmm is, from its operands' shapes: the LM head's (a vocabulary-wide
    dimension), LoRA's (a dimension of at most 3 x the rank: A, B and the fused A products), or the frozen weights'."""
    dims = {d for shape in shapes for d in shape[-2:]}
    if vocab in dims:
        return "matmuls: LM head"
    if min(dims, default=vocab) <= 3 * rank:
        return "matmuls: LoRA"
    return "matmuls: frozen weights"


def profile_split(fn: Callable[[], Any], vocab: int, rank: int) -> dict[str, float]:
    """Seconds of one call of fn per entry of `SPLIT` (profiler self time; the rest is autograd's engine,
    Python and the profiler's own bookkeeping), and its wall time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        wall, _ = timed(fn)
    split = dict.fromkeys(SPLIT, 0.0)
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key.startswith("autograd::") or not event.key.startswith(("aten::", "mkldnn", "Optimizer")):
            continue
        seconds = event.self_cpu_time_total / 1e6
        if event.key in MATMULS:
            split[matmul_kind([s for s in event.input_shapes if s], vocab, rank)] += seconds
            continue
        name = next(name for name, keys in CATEGORIES if any(k.lower() in event.key.lower() for k in keys))
        split[name] += seconds
    split["autograd, Python, profiler"] = max(0.0, wall - sum(split.values()))
    split["wall"] = wall
    return split


def fp32_tolerance(backend: Any, items: Sequence[Any]) -> float:
    """How far two fp32 orders of the same sums may be apart, relative to their size: each LoRA gradient element is a
    sum over the step's tokens of products that are sums over the hidden size, so the worst case is about
    (tokens + hidden) units of fp32's roundoff (2**-24). The loss, a sum of per-token terms, is held to the same."""
    import torch

    tokens = sum(len(it.prompt_ids) + len(it.completion_ids) for it in items)
    return (tokens + backend.model.config.hidden_size) * torch.finfo(torch.float32).eps / 2


def compare_steps(backend: Any, items: Sequence[Any], bf16: bool) -> dict[str, Any]:
    """After one step (so B is no longer zero): both paths in fp32, against each other; and where the step runs in
    bf16, each path's bf16 gradient against the fp32 one on the same weights, with the bound its own completions
    give it (bench/harness/gradients.py). Two bf16 paths round differently, so they are compared with fp32, each."""
    backend.use_adapter_slot(backend.new_adapter_slot(1))
    backend.packed_training = True
    backend.train(items)  # one AdamW step in the step's own precision
    fp32 = {side: flat_gradient(backend, items, bf16=False, packed=side == "new") for side in SIDES}
    (new32, new_stats), (old32, old_stats) = fp32["new"], fp32["old"]
    out: dict[str, Any] = {
        "fp32_distance": against(old32, new32)["distance"],
        "fp32_loss": abs(new_stats["loss"] - old_stats["loss"]) / max(abs(old_stats["loss"]), 1e-12),
        "fp32_tolerance": fp32_tolerance(backend, items),
    }
    if bf16:
        completions = [[it] for it in items]
        for side in SIDES:
            grad = flat_gradient(backend, items, bf16=True, packed=side == "new")[0]
            out[f"{side}_bf16"] = {**against(fp32["new"][0], grad),
                                   "bound": parts_in_bf16(backend, completions, packed=side == "new").bound}
    backend.autocast, backend.packed_training = bf16, True
    return out


def agreement(check: dict[str, Any]) -> tuple[bool, str]:
    """Whether the packed step is right, and the sentence that says why."""
    tol = check["fp32_tolerance"]
    ok = check["fp32_distance"] <= tol and check["fp32_loss"] <= tol
    text = (f"in fp32 the two steps agree within {check['fp32_distance']:.1e} of the LoRA gradient's norm and "
            f"{check['fp32_loss']:.1e} of the loss (tolerance {tol:.1e}: (tokens + hidden) x fp32's roundoff)")
    if "new_bf16" in check:
        new, old = check["new_bf16"], check["old_bf16"]
        ok = ok and new["distance"] <= new["bound"] and old["distance"] <= old["bound"] and \
            new["distance"] <= old["bound"]
        text += (f"; in bf16 each against fp32 on the same weights: new {new['distance']:.2f} of its norm (cosine "
                 f"{new['cosine']:.2f}), old {old['distance']:.2f} (cosine {old['cosine']:.2f}), each within what its "
                 f"completions' own bf16 rounding allows ({new['bound']:.2f} and {old['bound']:.2f}: the sum of "
                 f"e_i |g_i| over |sum g_i|), the new within the old's")
    return ok, text


def phased_step(backend: Any, items: Sequence[Any]) -> dict[str, float]:
    """One whole `train` call, with where its wall time went: the forwards (`batch_logprobs`, which in the new
    path includes the LM head's input gradient), clipping and AdamW (`_apply_step`), and the rest (the loss,
    the backward, micro-batching), all from the same call."""
    spent = {"forward": 0.0, "optimizer": 0.0}

    def timing(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            seconds, out = timed(lambda: fn(*args))
            spent[name] += seconds
            return out
        return run

    backend.batch_logprobs = timing("forward", type(backend).batch_logprobs.__get__(backend))
    backend._apply_step = timing("optimizer", type(backend)._apply_step.__get__(backend))
    try:
        wall, cpu, _ = measured(lambda: backend.train(items))
    finally:
        del backend.batch_logprobs, backend._apply_step
    return {"step": wall, "cpu": cpu, **spent, "backward and the rest": wall - spent["forward"] - spent["optimizer"]}


def time_sides(backend: Any, items: Sequence[Any], repeats: int, roofline: Roofline) -> dict[str, dict[str, Any]]:
    """Per side, alternating repeat by repeat: whole steps, each from a fresh adapter slot, their phases
    (`phased_step`), the roofline's GEMMs sampled after each pair; then one profiled step per side.
    Medians under "step", "forward", ...; raw steps in "wall"; other processes' load under "foreign"."""
    # No warm-up here: `compare_steps` ran both sides' forward and backward first.
    calls = {side: on_side(backend, side, fresh_step(backend, lambda: phased_step(backend, items))) for side in SIDES}
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    load = ForeignLoad()
    for rep in range(repeats):
        for side in SIDES if rep % 2 == 0 else tuple(reversed(SIDES)):
            runs[side].append(calls[side]())
        roofline.sample()
    foreign = load.cores()
    config, rank = backend.model.config, backend.grpo.lora_rank
    out: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        out[side] = {name: statistics.median(run[name] for run in runs[side]) for name in runs[side][0]}
        out[side]["wall"] = [run["step"] for run in runs[side]]
        out[side]["cpus"] = [run["cpu"] for run in runs[side]]
        # The profiler sees this thread's ops only: the new side's profiled step runs its micro-batches here.
        lanes, backend.train_lanes = backend.train_lanes, False
        try:
            step = on_side(backend, side, fresh_step(backend, lambda: backend.train(items)))
            out[side]["profile"] = profile_split(step, config.vocab_size, rank)
        finally:
            backend.train_lanes = lanes
    out["foreign"] = {"cores": foreign}
    return out


class Roofline:
    """This machine's GEMM GFLOP/s on the model's shapes at `rows` rows (`bench.roofline.gemm_step`), plain and,
    where the decoder would use it, reordered for oneDNN; sampled between the timed steps, so that it sees
    the same machine they do. The peak is the faster variant's median."""

    def __init__(self, config: Any, rows: int, dtype: Any) -> None:
        import torch

        from engine.backends.decode import can_pack

        self.flops, self.rows = gemm_flops(config, rows), rows
        self.steps = {"plain": gemm_step(config, rows, dtype)}
        if can_pack(torch.device("cpu"), dtype):
            self.steps["oneDNN-reordered"] = gemm_step(config, rows, dtype, packed=True)
        self.seconds: dict[str, list[float]] = {name: [] for name in self.steps}

    def sample(self) -> None:
        for name, step in self.steps.items():
            self.seconds[name].append(timed(step)[0])

    def rates(self) -> dict[str, float]:
        return {name: self.flops / statistics.median(s) / 1e9 for name, s in self.seconds.items()}

    def peak(self) -> float:
        return max(self.rates().values())

    def detail(self) -> str:
        return ", ".join(f"{name} {rate:.1f}" for name, rate in self.rates().items())


def rss_child(side: str, args: argparse.Namespace) -> dict[str, float]:
    """Child: the backend, then one step on the items on one side; RSS after loading, and its peak while
    training (sampled every 10 ms: the process's own peak is often the model's loading)."""
    import threading

    import psutil
    import torch

    from bench.bundled import bundled_cpu
    from engine.backends.base import TrainItem

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = bundled_cpu()[1]
    items = [TrainItem(**item) for item in json.loads(items_path(args).read_text())["items"]]
    if args.quick:
        items = first_questions(items, QUICK_QUESTIONS)
    process, done = psutil.Process(), threading.Event()
    loaded = peak = process.memory_info().rss

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.01):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    backend.packed_training = side == "new"
    backend.train(items)
    done.set()
    sampler.join()
    return {"loaded": loaded, "peak": peak, "process_peak": peak_rss_bytes()}


def rss_sides(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    flags = ["--items", str(items_path(args)), "--threads", str(args.threads), *(["--quick"] if args.quick else [])]
    out = {}
    for side in SIDES:
        done = subprocess.run([sys.executable, "-m", "bench.train_speed", "--rss-child", side, *flags],
                              cwd=REPO_ROOT, capture_output=True, text=True, check=True)
        out[side] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def bad_arguments(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot run, in one sentence, or None."""
    if args.repeats is not None and args.repeats < 1:
        return f"--repeats must be at least 1, got {args.repeats}."
    if args.round < 1:
        return f"--round must be at least 1, got {args.round}."
    if args.threads < 0:
        return f"--threads must be 0 (torch's default) or more, got {args.threads}."
    if args.items is not None and args.items.exists() and not args.items.is_file():
        return f"--items must name a file, and {args.items} is not one."
    return None


def report_split(timing: dict[str, dict[str, Any]]) -> None:
    """Where each side's step went: its phases timed in the same steps, then one profiled step's op time."""
    print("where the time goes (s, medians; forward = batch_logprobs, which in the new path also makes the LM head's "
          "input gradient, summed over its lanes, which overlap; backward and the rest = the step minus both):")
    for side in SIDES:
        t = timing[side]
        if t.get("lanes", 1) > 1:  # forwards and backwards overlap
            print(f"  {side}: forward and backward in lanes {t['step'] - t['optimizer']:.2f} (forwards summed over "
                  f"the lanes {t['forward']:.2f}), clipping + AdamW {t['optimizer']:.2f}, step {t['step']:.2f}")
            continue
        print(f"  {side}: forward {t['forward']:.2f}, backward and the rest {t['backward and the rest']:.2f}, "
              f"clipping + AdamW {t['optimizer']:.2f}, step {t['step']:.2f}")
    print("  one step under the profiler, op self time (s; the new side's micro-batches one after the other, as the "
          "profiler sees one thread):")
    print(f"    {'':28s}" + "".join(f"{side:>16s}" for side in SIDES))
    for name in (*SPLIT, "wall"):
        cells = []
        for side in SIDES:
            split = timing[side]["profile"]
            cells.append(f"{split[name]:8.2f} ({split[name] / split['wall']:4.0%})")
        print(f"    {name:28s}" + "".join(f"{c:>16s}" for c in cells))


def report(items: Sequence[Any], timing: dict[str, dict[str, Any]], flops: dict[str, float], need: dict[str, float],
           roofline: Roofline) -> float:
    """Prints the sides' numbers; returns the new path's share of the roofline."""
    completion_tokens = sum(len(it.completion_ids) for it in items)
    print(f"work: {need['tokens']:.0f} tokens through the layers (each prompt once, no padding; old path "
          f"{need['old_tokens']:.0f}), {need['head_rows']:.0f} LM-head rows (old {need['old_head_rows']:.0f}), "
          f"{completion_tokens} completion tokens trained")
    print(f"FLOPs the step needs: forward {flops['forward'] / 1e9:.1f} G, backward {flops['backward'] / 1e9:.1f} G "
          f"(frozen weights: input gradients only; LoRA: input and weight), total {flops['total'] / 1e9:.1f} G")
    gflops = roofline.peak()
    print(f"roofline: the model's matmuls as GEMMs at {roofline.rows} rows (the largest micro-batch), between the "
          f"timed steps: {roofline.detail()} GFLOP/s; peak {gflops:.1f} GFLOP/s")
    for side in SIDES:
        t = timing[side]
        rate = flops["total"] / t["step"] / 1e9
        print(f"  {side}: step {t['step']:.2f} s {[round(s, 2) for s in t['wall']]}, CPU "
              f"{t['cpu']:.2f} s; {rate:.1f} GFLOP/s = {rate / gflops:.1%} of the roofline; "
              f"{completion_tokens / t['step']:.0f} completion tok/s, "
              f"{need['tokens'] / t['step']:.0f} tok/s through the layers")
    report_split(timing)
    foreign = timing["foreign"]["cores"]
    print(f"other processes kept {foreign:.2f} cores busy on average while the steps were timed"
          + (" (more than a quarter of a core: the seconds are inflated; compare the ratios)"
             if foreign > 0.25 else ""))
    return flops["total"] / timing["new"]["step"] / 1e9 / gflops


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"the items of {QUICK_QUESTIONS} questions, 1 repeat")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default 0: torch's default, as the engine)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed steps per side, alternating (default 3, quick 1)")
    parser.add_argument("--round", type=int, default=1, help="which round's items to train (default 1)")
    parser.add_argument("--items", type=Path, default=None,
                        help="the items file (default: <cache dir>/bench/train_speed-roundR.json)")
    parser.add_argument("--rss-child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    why = bad_arguments(args)
    if why is not None:
        print(f"train_speed: {why}", file=sys.stderr)
        return 2
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_child, args)))
        return 0
    return run(args)


def run(args: argparse.Namespace) -> int:
    import torch

    from bench.bundled import bundled_cpu
    from engine.backends.batching import micro_batches
    from engine.backends.train_lanes import lane_count, largest_lane

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, backend, taskset = bundled_cpu()
    t, g = cfg.tasks, cfg.grpo
    meta = {"model": backend.model_dir.name, "round": args.round, "seed": cfg.run.seed,
            "questions": t.questions_per_round,
            "completions": t.completions_per_question, "max_new_tokens": t.max_new_tokens, "temperature": t.temperature}
    items, made = load_items(items_path(args), meta, lambda: round_items(backend, cfg, taskset, args.round))
    if args.quick:
        items = first_questions(items, QUICK_QUESTIONS)
    if not items:
        print(f"train_speed: round {args.round} has no question whose rewards differ, so nothing to train; "
              "pick another --round.",
              file=sys.stderr)
        return 2
    repeats = args.repeats or (1 if args.quick else 3)
    dtype = torch.bfloat16 if backend.autocast else torch.float32
    precision = str(dtype).replace("torch.", "").replace("float32", "fp32").replace("bfloat16", "bf16")
    print(f"train_speed: bundled SmolLM2-135M, round {args.round}'s items ({'sampled now' if made else 'saved'}: "
          f"{items_path(args)}), {len({tuple(it.prompt_ids) for it in items})} questions, {len(items)} completions, "
          f"{torch.get_num_threads()} threads, {precision}, LoRA r{g.lora_rank}, {repeats} repeat(s) per side"
          f"{', quick' if args.quick else ''}")
    limits = backend.budget.limits(g)
    new_chunks = micro_batches(items, *limits, shared_prompts=True, packed=True)
    need = layout(new_chunks, micro_batches(items, *limits, shared_prompts=True))
    flops = step_flops(backend.model.config, g.lora_rank, need)
    rows = max(sum(map(len, {tuple(it.prompt_ids) for it in c})) + sum(len(it.completion_ids) - 1 for it in c)
               for c in new_chunks)
    check = compare_steps(backend, items, bf16=backend.autocast)
    peak = Roofline(backend.model.config, rows, dtype)
    timing = time_sides(backend, items, repeats, peak)
    per_lane = largest_lane(backend.model.config, new_chunks)
    timing["new"]["lanes"] = lane_count(torch.device("cpu"), len(new_chunks), g.finetune == "lora", per_lane)
    share = report(items, timing, flops, need, peak)
    rss = rss_sides(args)
    print("RSS, one child per side, one step: " + "; ".join(
        f"{side} peak while training {rss[side]['peak'] / 2**30:.2f} GB "
        f"({(rss[side]['peak'] - rss[side]['loaded']) / 2**20:+.0f} MB "
        f"over the loaded model), the child's peak {rss[side]['process_peak'] / 2**30:.2f} GB" for side in SIDES))
    print(f"lanes: {timing['new']['lanes']}, each estimated to hold {per_lane / 2**20:.0f} MB for its largest "
          f"micro-batch (engine/backends/train_lanes.py: lanes take at most half the free memory; compare the "
          f"peaks of a --threads 1 run, one lane, and this one)")
    same, why = agreement(check)
    print(f"the right answer on the bundled model, after one step: {why}: {'yes' if same else 'NO'}")
    print(f"reproduce: .venv/bin/python -m bench.train_speed{' --quick' if args.quick else ''}"
          f"{f' --threads {args.threads}' if args.threads else ''}"
          f"{f' --round {args.round}' if args.round != 1 else ''}")
    ratio = timing['old']['step'] / timing['new']['step']
    print(f"train step: new/old = {ratio:.2f}x, {share:.0%} of the {precision} roofline")
    if not same:
        print("train_speed: the two steps disagree beyond the tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
