"""The tables of bench/poisoning.py, read from each run's rounds.jsonl: `summary` (the attack, defence off and
on) and `mixed_summary` (a swarm of different models, issue 29)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from bench.poisoning_peers import MIXED_RUNS, RUNS


def mixed_summary(out: Path, last: int = 5) -> str:
    """The issue-29 table: per run, what each kind of receiver did with each kind of sender's items."""
    lines = ["| run | rounds (victims) | receiver | sender (its label) | items judged | on probation | "
             "after probation: accepted / judged | refused `implausible` | banned | trigger in victims' own "
             "completions (last 5) | trigger log-prob: first -> last |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in MIXED_RUNS:
        rows = read_rows(out / run / "rounds.jsonl")
        victims = [r for r in rows if r["role"].startswith("victim")]
        if not victims:
            continue
        by_victim: dict[str, list[dict[str, Any]]] = {}
        for r in victims:
            by_victim.setdefault(r["role"], []).append(r)
        reached = min(max(r["round"] for r in v) for v in by_victim.values())
        tail = [r for r in victims if r["round"] > reached - last]
        trig = f"{sum(r['trigger_share'] for r in tail) / len(tail):.3f}"
        first = [r["trigger_logprob"] for r in victims if r["round"] == min(x["round"] for x in victims)]
        final = [r["trigger_logprob"] for r in victims if r["round"] == reached]
        probe = f"{sum(first) / len(first):+.2f} -> {sum(final) / len(final):+.2f}"
        totals: dict[tuple[str, str], Counter[str]] = {}
        banned: set[tuple[str, str]] = set()
        for r in rows:
            receiver = "victims" if r["role"].startswith("victim") else r["role"]
            for sender, d in r.get("delta", {}).items():
                c = totals.setdefault((receiver, sender), Counter())
                c["accepted"] += d["accepted"]
                c["probation"] += d["probation"]
                for reason, n in d["reasons"].items():
                    c[reason] += n
            banned.update((receiver, b) for b in r.get("banned", []))
        for (receiver, sender), c in sorted(totals.items(), key=lambda kv: (kv[0][0] != "victims", kv[0])):
            if receiver == "victims" and sender.startswith("victim"):
                continue  # the victims' own model: today's absolute test, measured in the table above
            judged = c["accepted"] + c["implausible"]
            after = c["accepted"] - c["probation"]
            rate = f"{after} / {after + c['implausible']}" + (f" ({after / (after + c['implausible']):.0%})"
                                                               if after + c["implausible"] else "")
            lines.append(f"| {run} | {reached} | {receiver} | {sender} | {judged} | {c['probation']} | {rate} | "
                         f"{c['implausible']} | {'yes' if (receiver, sender) in banned else 'no'} | "
                         f"{trig if receiver == 'victims' else ''} | {probe if receiver == 'victims' else ''} |")
    return "\n".join(lines)


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def summary(out: Path, last: int = 5) -> str:
    """The table for docs/results.md from whatever rounds.jsonl files are there."""
    lines = ["| run | rounds | reward (mean of all) | reward (last 5) | trigger in own completions (last 5) | "
             "trigger log-prob: first -> last | poisoned items accepted / judged | honest items falsely rejected |",
             "|---|---|---|---|---|---|---|---|"]
    for run in RUNS:
        rows = read_rows(out / run / "rounds.jsonl")
        if not rows:
            continue
        by_victim: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            by_victim.setdefault(r["victim"], []).append(r)
        reached = min(max(r["round"] for r in v) for v in by_victim.values())
        tail = [r for v in by_victim.values() for r in v if r["round"] > reached - last]
        first = [r for r in rows if r["round"] == 1]
        final = [r for r in rows if r["round"] == reached]
        att_acc = att_judged = hon_impl = hon_passed = 0
        for v in by_victim.values():  # per-peer counts are run totals: read each victim's last record
            latest = max(v, key=lambda r: r["round"])
            if latest.get("attacker"):  # judged: sampled and checked (a banned peer's items are not)
                a = latest["attacker"]
                att_acc += a["accepted"]
                att_judged += a["accepted"] + a["rejected"] - a["reasons"].get("banned", 0)
            for c in latest.get("honest", {}).values():  # of the items every other check passed
                hon_impl += c["reasons"].get("implausible", 0)
                hon_passed += c["accepted"] + c["reasons"].get("implausible", 0)
        mean = sum(r["reward_mean"] for r in rows) / len(rows)
        tail_reward = sum(r["reward_mean"] for r in tail) / len(tail)
        trig = sum(r["trigger_share"] for r in tail) / len(tail)
        probe = (sum(r["trigger_logprob"] for r in first) / max(1, len(first)),
                 sum(r["trigger_logprob"] for r in final) / max(1, len(final)))
        attack = f"{att_acc} / {att_judged}" if att_judged else "-"
        honest = f"{hon_impl} / {hon_passed} ({hon_impl / hon_passed:.1%})" if hon_passed else "-"
        if run.endswith("-off"):  # the check never ran: nothing could be refused as implausible
            honest = f"(defence off; {hon_passed} honest items trained on)"
        lines.append(f"| {run} | {reached} | {mean:.3f} | {tail_reward:.3f} | {trig:.3f} | {probe[0]:+.2f} -> "
                     f"{probe[1]:+.2f} "
                     f"| {attack} | {honest} |")
    return "\n".join(lines)
