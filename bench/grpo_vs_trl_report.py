"""The report of bench/grpo_vs_trl.py: what each side measured (`SideResult`), the targets, report.json's
fields and the printed table. Split out of bench/grpo_vs_trl.py whole (issue 35); the bench says how to run it."""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

SPEED_TARGET = 0.6
RSS_TARGET_BYTES = 4 * 10**9
LENGTH_MISMATCH = 0.25
FOREIGN_LOAD_LIMIT = 0.25
"""Cores' worth of other processes' CPU use during a side above which the report warns."""
LORA_RANK = 16


@dataclass
class SideResult:
    """What one child measured; printed as one JSON line."""

    side: str
    round_seconds: list[float]
    completion_tokens: list[float]
    informative_groups: list[int]
    peak_rss_bytes: int
    threads: int
    bf16: bool
    details: dict[str, Any] = field(default_factory=dict)

    def headline(self) -> float:
        """Median seconds per round, the warm-up round left out when there is more than one."""
        steady = self.round_seconds[1:] or self.round_seconds
        return statistics.median(steady)


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def build_report(args: argparse.Namespace, prep: dict[str, Any], ours: SideResult, trl: SideResult) -> dict[str, Any]:
    ratio = ours.headline() / trl.headline()
    return {
        "model": prep["model_name"],
        "questions": args.questions,
        "completions": args.completions,
        "max_new_tokens": args.max_new_tokens,
        "finetune": "full" if args.full else f"lora r{LORA_RANK}",
        "bf16_autocast": {"ours": ours.bf16, "trl": trl.bf16},
        "threads": args.threads,
        "rounds": args.rounds,
        "ratio": ratio,
        "speed_target": SPEED_TARGET,
        "speed_target_met": ratio <= SPEED_TARGET,
        "rss_target_bytes": None if args.full else RSS_TARGET_BYTES,
        "rss_target_met": None if args.full else ours.peak_rss_bytes <= RSS_TARGET_BYTES,
        "sides": {r.side: {**asdict(r), "headline_seconds": r.headline()} for r in (ours, trl)},
        "command": _reproduce(args),
    }


def _reproduce(args: argparse.Namespace) -> str:
    parts = [".venv/bin/python -m bench.grpo_vs_trl", f"--rounds {args.rounds}"]
    if args.full:
        parts.append("--full")
    defaults = {"questions": 8, "completions": 4, "max_new_tokens": 64, "trl_micro_batch": 0}
    for name, default in defaults.items():
        if getattr(args, name) != default:
            parts.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    if args.threads != os.cpu_count():
        parts.append(f"--threads {args.threads}")
    return " ".join(parts)


def format_report(report: dict[str, Any], ours: SideResult, trl: SideResult) -> str:
    n = report["rounds"]
    span = f"rounds 2..{n}" if n > 2 else ("round 2" if n == 2 else "round 1")
    bf16 = (
        "yes"
        if ours.bf16 and trl.bf16
        else ("no" if not (ours.bf16 or trl.bf16) else f"ours {ours.bf16}, trl {trl.bf16}")
    )
    finetune = "full fine-tuning" if report["finetune"] == "full" else f"LoRA r{LORA_RANK}"
    head = f"s/round (median of {span})"
    threads = f"{report['threads']} thread" + ("s" if report["threads"] != 1 else "")
    lines = [
        f"grpo_vs_trl: {report['model']}, {report['questions']} questions x {report['completions']} completions, "
        f"{report['max_new_tokens']} new tokens, {finetune}, bf16 autocast {bf16}, {threads}",
        f"{'side':<6} {head:<34} {'raw':<24} {'completion tokens':<18} peak RSS",
    ]
    for r in (ours, trl):
        raw = "[" + ", ".join(f"{s:.1f}" for s in r.round_seconds) + "]"
        tokens = statistics.mean(r.completion_tokens)
        lines.append(f"{r.side:<6} {r.headline():<34.1f} {raw:<24} {tokens:<18.1f} {_gb(r.peak_rss_bytes)}")
    speed = "met" if report["speed_target_met"] else "MISSED"
    line = f"ratio ours/trl = {report['ratio']:.2f} (target <= {SPEED_TARGET:.2f}, {speed})"
    if report["rss_target_bytes"] is None:
        line += f"   ours peak RSS {_gb(ours.peak_rss_bytes)} (no target for full fine-tuning)"
    else:
        rss = "met" if report["rss_target_met"] else "MISSED"
        line += f"   ours peak RSS {_gb(ours.peak_rss_bytes)} (target <= {_gb(RSS_TARGET_BYTES)}, {rss})"
    lines.append(line)
    gen = ours.details.get("generate_seconds", [])
    train = ours.details.get("train_seconds", [])
    if gen and train:
        lines.append(
            "ours per round: generate ["
            + ", ".join(f"{s:.1f}" for s in gen)
            + "] s, train ["
            + ", ".join(f"{s:.1f}" for s in train)
            + "] s, the rest is scoring and the checkpoint"
        )
    micro, accumulation = trl.details.get("micro_batch"), trl.details.get("gradient_accumulation_steps")
    if micro is not None:
        lines.append(
            f"trl: micro-batches of {micro} sequences, {accumulation} accumulated into each optimizer step, "
            "no gradient checkpointing"
        )
    rss_rounds = {r.side: r.details.get("peak_rss_after_round") for r in (ours, trl)}
    if all(rss_rounds.values()):
        shown = "; ".join(f"{k} [{', '.join(f'{v / 1e9:.1f}' for v in vs)}]" for k, vs in rss_rounds.items() if vs)
        lines.append(f"peak RSS so far after each round, GB: {shown}")
    lines.append(
        f"informative groups per round (of {report['questions']}; tied groups train nothing in ours): "
        f"ours {ours.informative_groups}, trl {trl.informative_groups}"
    )
    ours_tokens, trl_tokens = statistics.mean(ours.completion_tokens), statistics.mean(trl.completion_tokens)
    if abs(ours_tokens - trl_tokens) > LENGTH_MISMATCH * max(ours_tokens, trl_tokens):
        lines.append(
            f"WARNING: mean completion lengths differ by more than {LENGTH_MISMATCH:.0%} "
            f"({ours_tokens:.1f} vs {trl_tokens:.1f} tokens): the sides did unequal work; rerun or add rounds."
        )
    busy = {r.side: r.details.get("foreign_cores") for r in (ours, trl)}
    if any(v is not None and v > FOREIGN_LOAD_LIMIT for v in busy.values()):
        shown = ", ".join(f"{k} {v:.1f}" if v is not None else f"{k} ?" for k, v in busy.items())
        lines.append(
            f"WARNING: other processes kept cores busy during the run ({shown} cores on average): "
            "the times are inflated and not comparable; rerun on an idle machine."
        )
    if ours.threads != trl.threads or ours.threads != report["threads"]:
        lines.append(
            f"WARNING: thread counts differ: ours {ours.threads}, trl {trl.threads}, asked {report['threads']}."
        )
    lines.append(f"reproduce: {report['command']}")
    return "\n".join(lines)
