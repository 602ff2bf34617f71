"""One GRPO round of Sapling's engine against TRL's `GRPOTrainer` doing the same work, measured in one run.

Both sides train the bundled SmolLM2-135M-Instruct on the same ReasoningGYM questions (drawn by an engine
`TaskSet`, scored by its `reward`): B questions x G completions per round, up to T new tokens, temperature
1.0, learning rate 2e-4, no KL, one optimizer step per round, LoRA r16 / alpha 32 on all linear layers
(dropout 0) or full fine-tuning with ``--full``, bf16 autocast where the CPU has native bf16.

    .venv/bin/python -m bench.grpo_vs_trl --rounds 3            # the real comparison (minutes)
    .venv/bin/python -m bench.grpo_vs_trl --questions 2 --completions 2 --max-new-tokens 8 --rounds 2

Each side runs in its own child process, one after the other, with the same thread count, and reports its
seconds per round, its mean completion length and its own peak RSS. The first round includes warm-up, so
the headline is the median of rounds 2..N; every raw value is printed too. Targets: ours <= 0.6 x TRL per
round, and ours <= 4 GB peak RSS on CPU with the default (LoRA) setting.

What one "round" is on each side:

- ours: the wall time of `Node.run_round()`: generate, score, one GRPO update and an atomic checkpoint.
- TRL: the time between `on_step_begin` and `on_step_end` of one optimizer step, which holds its
  generation, scoring and update (it saves nothing: ``save_strategy="no"``).

TRL is set up to match the engine's update: clip range 0.2 / 0.28, token-level ("dapo") loss, gradient
norm clipped at 1.0, plain AdamW at a constant learning rate, prompts in draw order (no shuffling), and
forward/backward on micro-batches of the engine's ``grpo.micro_batch`` (8) sequences, accumulated into the
one optimizer step (``--trl-micro-batch`` changes that; ``--trl-micro-batch 32`` is one batch of 32 with no
accumulation, which measured here peaks near 24 GB and runs several times slower). It runs with
``gradient_checkpointing=False`` (its default is True) so that neither side recomputes activations: the
peer is not slowed down by a memory-saving choice ours does not make. Our engine skips
completions whose group advantage is zero (all rewards in a group tie), TRL computes their (zero) loss anyway;
the report prints how many groups were informative per round on each side so that difference is visible.

Run it on an otherwise idle machine. Two multi-threaded processes sharing too few cores slow each other
down far beyond their share, so the parent measures how many cores other processes kept busy while each side
ran and prints a warning when that is above a quarter of a core.

All outputs go to a temporary folder. The converted bundled model is cached in the per-user Sapling cache
(`Paths.default().cache_dir`), converted once by a preparation child before anything is measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.grpo_vs_trl_report import LORA_RANK, SideResult, build_report, format_report

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
MODULE = "bench.grpo_vs_trl"
SIDES = ("ours", "trl")
RESULT_KEY = "grpo_vs_trl_side"
LEARNING_RATE = 2e-4
LORA_ALPHA = 32
TEMPERATURE = 1.0


class BenchError(Exception):
    """Something the bench needs is missing or broken; carries one sentence for the user."""


# -- shared by the children -----------------------------------------------------------------


def _require(module: str, hint: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise BenchError(hint)


def _require_engine() -> None:
    for module in ("engine.common.config", "engine.common.paths", "engine.models.sources", "engine.questions.tasks",
                   "engine.node.loop"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise BenchError(f"{module} is missing: run the bench from a complete Sapling checkout.")


def peak_rss_bytes() -> int:
    """This process's peak resident set size, in bytes."""
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def bf16_supported() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def engine_overrides(args: argparse.Namespace) -> list[str]:
    """The engine settings for this bench, spelled out so that both sides provably match."""
    return [
        f"tasks.questions_per_round={args.questions}",
        f"tasks.completions_per_question={args.completions}",
        f"tasks.max_new_tokens={args.max_new_tokens}",
        f"tasks.temperature={TEMPERATURE}",
        "tasks.eval_every=0",
        "run.run_name=bench",
        "run.seed=0",
        "run.device='cpu'",
        f"run.threads={args.threads}",
        f"grpo.finetune='{'full' if args.full else 'lora'}'",
        f"grpo.learning_rate={LEARNING_RATE}",
        "grpo.kl_beta=0.0",
        "grpo.pg_steps=1",
        f"grpo.lora_rank={LORA_RANK}",
        f"grpo.lora_alpha={LORA_ALPHA}",
        "grpo.lora_dropout=0.0",
        "grpo.precision='auto'",
    ]


def trl_batching(sequences: int, micro_batch: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) for TRL: one generation of `sequences` makes exactly one optimizer step.

    The micro-batch is the largest divisor of `sequences` that is at most `micro_batch` (the engine's
    `grpo.micro_batch`), so both sides run forward/backward on the same number of sequences at a time.
    """
    micro = max(d for d in range(1, min(micro_batch, sequences) + 1) if sequences % d == 0)
    return micro, sequences // micro


def _informative(rewards: Sequence[float], group_size: int) -> int:
    """Groups of consecutive `group_size` rewards that do not all tie."""
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    return sum(1 for g in groups if max(g) != min(g))


# -- the children ---------------------------------------------------------------------------


def run_prepare() -> dict[str, Any]:
    """Convert the bundled model into the shared cache once, outside any measurement."""
    _require_engine()
    from engine.common.model_policy import BUNDLED_NAME
    from engine.common.paths import Paths
    from engine.common.rules import BUNDLED
    from engine.models.sources import resolve_model_dir

    model_dir = resolve_model_dir(BUNDLED, Paths.default().models_cache)
    return {"model_dir": str(model_dir), "model_name": BUNDLED_NAME, "bf16": bf16_supported()}


def run_ours(args: argparse.Namespace, workdir: Path) -> SideResult:
    _require_engine()
    import torch

    from engine.common.config_file import build_config
    from engine.common.paths import Paths
    from engine.node.loop import Node

    torch.set_num_threads(args.threads)
    cfg = build_config("default", None, engine_overrides(args))
    paths = Paths(
        config_dir=workdir / "config",
        data_dir=workdir / "data",
        cache_dir=Paths.default().cache_dir,
        log_dir=workdir / "logs",
    )
    node = Node(cfg, paths, emit=lambda event: None)
    node.setup()
    if node.round != 0:
        raise BenchError(f"the bench run folder {workdir} already held a checkpoint; it must start empty.")
    seconds: list[float] = []
    metrics: list[dict[str, Any]] = []
    rss: list[int] = []
    for index in range(args.rounds):
        start = time.perf_counter()
        m = node.run_round()
        seconds.append(time.perf_counter() - start)
        metrics.append(m)
        rss.append(peak_rss_bytes())
        log.info("ours round %d: %.1f s (%s)", index + 1, seconds[-1], _phase_text(m))
    backend = node.backend
    return SideResult(
        side="ours",
        round_seconds=seconds,
        completion_tokens=[float(m["completion_tokens_mean"]) for m in metrics],
        informative_groups=[int(m["informative_groups"]) for m in metrics],
        peak_rss_bytes=peak_rss_bytes(),
        threads=torch.get_num_threads(),
        bf16=bool(getattr(backend, "autocast", False)),
        details={
            "peak_rss_after_round": rss,
            "generate_seconds": [float(m["generate_seconds"]) for m in metrics],
            "train_seconds": [float(m["train_seconds"]) for m in metrics],
            "engine_seconds": [float(m["seconds"]) for m in metrics],
            "reward_mean": [float(m["reward_mean"]) for m in metrics],
        },
    )


def _phase_text(m: dict[str, Any]) -> str:
    return (
        f"generate {m['generate_seconds']:.1f} s, train {m['train_seconds']:.1f} s, "
        f"{m['completion_tokens_mean']:.1f} tokens, {m['informative_groups']} informative groups"
    )


def run_trl(args: argparse.Namespace, workdir: Path) -> SideResult:
    _require_engine()
    _require("trl", "install the bench extra: pip install -e .[bench]")
    _require("datasets", "install the bench extra: pip install -e .[bench]")
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from engine.common.config_file import build_config
    from engine.common.paths import Paths
    from engine.common.rules import BUNDLED
    from engine.models.sources import resolve_model_dir
    from engine.questions.tasks import Question, TaskSet

    torch.set_num_threads(args.threads)
    cfg = build_config("default", None, engine_overrides(args))
    taskset = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=cfg.run.seed)
    # Round r of our engine draws taskset.draw(r, B); the TRL rows are those rounds in order (no shuffling).
    by_key: dict[str, Question] = {}
    rows: list[dict[str, Any]] = []
    for round_index in range(1, args.rounds + 1):
        for question in taskset.draw(round_index, args.questions):
            key = question.ref.key()
            by_key[key] = question
            rows.append({"prompt": taskset.messages(question), "ref_key": key})  # the prompt ours uses
    dataset = Dataset.from_list(rows)

    lengths: list[float] = []
    informative: list[int] = []
    rewards_seen: list[float] = []

    def taskset_reward(
        prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], ref_key: list[str], **_: Any
    ) -> list[float | None]:
        texts = [c[0]["content"] if isinstance(c, list) else str(c) for c in completions]
        rewards: list[float | None] = [
            taskset.reward(by_key[key], text) for key, text in zip(ref_key, texts, strict=True)
        ]
        lengths.append(sum(len(ids) for ids in completion_ids) / max(1, len(completion_ids)))
        scores = [r for r in rewards if r is not None]
        informative.append(_informative(scores, args.completions))
        rewards_seen.append(sum(scores) / max(1, len(scores)))
        return rewards

    class StepTimer(TrainerCallback):
        """Seconds per optimizer step: generation, scoring and the update all happen inside one."""

        def __init__(self) -> None:
            self.started = 0.0
            self.seconds: list[float] = []
            self.rss: list[int] = []

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)
            self.rss.append(peak_rss_bytes())
            log.info("trl round %d: %.1f s, %.1f tokens", len(self.seconds), self.seconds[-1], lengths[-1])

    bf16 = bf16_supported()
    micro, accumulation = trl_batching(args.questions * args.completions, args.trl_micro_batch or cfg.grpo.micro_batch)
    log.info("trl: micro-batches of %d sequences, %d accumulated per optimizer step", micro, accumulation)
    config = GRPOConfig(
        output_dir=str(workdir / "trl"),
        use_cpu=True,
        seed=cfg.run.seed,
        max_steps=args.rounds,
        num_generations=args.completions,
        per_device_train_batch_size=micro,
        steps_per_generation=accumulation,
        gradient_accumulation_steps=accumulation,
        shuffle_dataset=False,
        max_completion_length=args.max_new_tokens,
        temperature=TEMPERATURE,
        beta=0.0,
        epsilon=cfg.grpo.eps_low,
        epsilon_high=cfg.grpo.eps_high,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=cfg.grpo.max_grad_norm,
        optim="adamw_torch",
        bf16=bf16,
        gradient_checkpointing=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    model_dir = resolve_model_dir(BUNDLED, Paths.default().models_cache)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    peft_config = None
    if not args.full:
        peft_config = LoraConfig(
            r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"
        )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[taskset_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
    )
    trainer.train()
    if len(timer.seconds) != args.rounds or len(lengths) != args.rounds:
        raise BenchError(
            f"TRL ran {len(timer.seconds)} steps and {len(lengths)} generations, expected {args.rounds} of each."
        )
    return SideResult(
        side="trl",
        round_seconds=timer.seconds,
        completion_tokens=lengths,
        informative_groups=informative,
        peak_rss_bytes=peak_rss_bytes(),
        threads=torch.get_num_threads(),
        bf16=bf16,
        details={
            "peak_rss_after_round": timer.rss,
            "reward_mean": rewards_seen,
            "micro_batch": micro,
            "gradient_accumulation_steps": accumulation,
        },
    )


# -- the parent -----------------------------------------------------------------------------


def _child(side: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run one side in a fresh interpreter and return its JSON result line."""
    command = [sys.executable, "-m", MODULE, "--side", side, "--workdir", str(workdir)]
    for name in ("rounds", "threads", "questions", "completions", "max_new_tokens", "trl_micro_batch"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.full:
        command.append("--full")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(
        OMP_NUM_THREADS=str(args.threads),
        MKL_NUM_THREADS=str(args.threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    workdir.mkdir(parents=True, exist_ok=True)
    stderr_path = workdir / f"{side}.stderr.log"
    log.info("running %s in a child process (its log: %s)", side, stderr_path)
    meter = ForeignLoad()
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        child = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            stdout, _ = child.communicate()
        finally:
            if child.poll() is None:  # interrupted: never leave a side running behind us
                child.terminate()
                child.wait()
    foreign = meter.cores()
    log.info("%s finished in %.0f s", side, meter.elapsed())
    result = None
    for line in reversed(stdout.splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and RESULT_KEY in parsed:
            result = parsed
            break
    if child.returncode != 0 or result is None:
        tail = stderr_path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        sys.stderr.write("\n".join(tail) + "\n")
        raise BenchError(f"the {side} side failed (exit {child.returncode}); the end of its log is above.")
    if "error" in result:
        raise BenchError(str(result["error"]))
    result.pop(RESULT_KEY)
    if side in SIDES:
        result.setdefault("details", {})["foreign_cores"] = foreign
    return result


class ForeignLoad:
    """How many cores other processes kept busy while a child ran (None where it cannot be measured).

    System-wide busy CPU time minus the CPU time of our waited-for children, over the wall time. On a shared
    machine this is what makes a slow run explainable: two multi-threaded processes on too few cores slow
    each other down far more than their share (threads spin at barriers waiting for a descheduled peer).
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.busy = self._system_busy()
        self.ours = self._children_cpu()

    @staticmethod
    def _system_busy() -> float | None:
        try:
            import psutil
        except ImportError:
            return None
        t = psutil.cpu_times()
        return float(sum(t)) - float(t.idle) - float(getattr(t, "iowait", 0.0))

    @staticmethod
    def _children_cpu() -> float | None:
        try:
            import resource
        except ImportError:
            return None
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return float(usage.ru_utime + usage.ru_stime)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def cores(self) -> float | None:
        busy, ours = self._system_busy(), self._children_cpu()
        if busy is None or ours is None or self.busy is None or self.ours is None:
            return None
        other = (busy - self.busy) - (ours - self.ours)
        return max(0.0, other / max(self.elapsed(), 1e-9))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.grpo_vs_trl", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="GRPO rounds (optimizer steps) per side; round 1 is warm-up"
    )
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA r16")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads on both sides")
    parser.add_argument("--questions", type=int, default=8, help="questions per round")
    parser.add_argument("--completions", type=int, default=4, help="completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="completion length cap, in tokens")
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=0,
        metavar="N",
        help="sequences per TRL forward/backward (0: the engine's grpo.micro_batch, as ours); "
        "a whole round in one batch is --trl-micro-batch B*G",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the report as JSON here")
    parser.add_argument("--side", choices=(*SIDES, "prepare"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "threads", "questions", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.trl_micro_batch < 0:
        parser.error("--trl-micro-batch must be 0 (as ours) or a number of sequences")
    if args.completions < 2:
        parser.error("--completions must be at least 2: GRPO compares completions")
    return args


def _run_child(args: argparse.Namespace) -> int:
    """Child mode: measure one side and print one JSON line."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.side == "prepare":
            result: dict[str, Any] = run_prepare()
        else:
            workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"grpo_vs_trl_{args.side}_"))
            side = run_ours(args, workdir) if args.side == "ours" else run_trl(args, workdir)
            result = asdict(side)
    except BenchError as exc:
        result = {"error": str(exc)}
    except Exception as exc:
        # A bug still raises loudly; a typed engine error (bad model, missing package) is the user's to fix.
        from engine.common.errors import SaplingError

        if not isinstance(exc, SaplingError):
            raise
        result = {"error": str(exc)}
    result[RESULT_KEY] = args.side
    print(json.dumps(result), flush=True)
    return 0


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side is not None:
        return _run_child(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # so the running side is stopped and the temp folder removed
    try:
        if importlib.util.find_spec("trl") is None:
            raise BenchError("install the bench extra: pip install -e .[bench]")
        with tempfile.TemporaryDirectory(prefix="grpo_vs_trl_") as tmp:
            root = Path(tmp)
            prep = _child("prepare", args, root / "prepare")
            ours = SideResult(**_child("ours", args, root / "ours"))
            trl = SideResult(**_child("trl", args, root / "trl"))
    except BenchError as exc:
        print(f"grpo_vs_trl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("grpo_vs_trl: interrupted; the running side was stopped and nothing was reported.", file=sys.stderr)
        return 130
    report = build_report(args, prep, ours, trl)
    print(format_report(report, ours, trl))
    if args.json is not None:
        from engine.common.atomicio import atomic_write_json

        atomic_write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
