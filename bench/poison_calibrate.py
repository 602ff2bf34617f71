"""Measure the plausibility statistic on the bundled model: own, honest and poisoned text.

    .venv/bin/python -m bench.poison_calibrate [--drift CHECKPOINT_FOLDER] [--rounds 3]

For each case it prints, per window size, the distribution of each item's
lowest `window_floor` (the statistic `engine.defence.Plausibility` thresholds)
and the share of items a floor would reject. Cases: this node's own samples
(T = 0.7, few-shot prompt, as a round makes them); honest text from the same
model (a peer of seed 2 answering its own questions under its own prompt,
scored under that prompt as receivers rebuild it, and under the receiver's own
worked example as receivers did before); from a different policy (the same weights at
T = 1.2 without the worked example); from a drifted adapter (--drift, a
checkpoint trained ~30 rounds longer); and poisoned text (the right answer
with a trigger appended, prefixed or inside the reasoning).

A swarm of different models (issue 29) judges another model's text against
its sender's own past, not against a floor: `past_w4` is, for the honest
cases, the share of items that `engine.defence.sender_verdict` refuses once
the sender's baseline exists (the items taken in order, the first
`--probation` on probation, each accepted one added to the baseline), and for
the poisoned ones the share refused against the honest baseline of the text
they were injected into: the bundled model's own answers (`poison_*`), or
the other policy's text with the trigger appended, prefixed or inside
(`poison_other_*`), the case that shows what a baseline cannot see.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.poisoning import TRIGGERS
from bench.poisoning_peers import BENCH_SETTINGS, PLACES, poisoned_completion
from engine.common.config import build_config
from engine.common.device import pick_device
from engine.common.paths import Paths
from engine.defence import IMPLAUSIBLE, quantile, robust_baseline, sender_verdict, window_floor
from engine.models import resolve_model_dir
from engine.tasks import Question, TaskRef, TaskSet

WINDOWS = (1, 2, 4, 8)
FLOORS = (-4.0, -5.0, -6.0, -7.0, -8.0)
OTHER = "other_policy_T1.2_no_example"


def refused_against_past(lows: list[float], probation: int, spreads: float) -> tuple[int, int]:
    """(refused, judged) of a sender's items in order once its baseline exists (`sender_verdict`)."""
    history: list[float] = []
    refused = judged = 0
    for low in lows:
        verdict = sender_verdict(low, history, probation, spreads)
        if len(history) >= probation:
            judged += 1
            refused += verdict == IMPLAUSIBLE
        if verdict != IMPLAUSIBLE:
            history.append(low)
    return refused, judged


def refused_against(baseline: list[float], lows: list[float], spreads: float) -> int:
    """How many of `lows` fall more than `spreads` spreads (at least 1 nat each) below the baseline's median."""
    base = robust_baseline(baseline)
    return sum(low < base.median - spreads * max(base.spread, 1.0) for low in lows)


def receivers_example_messages(taskset: TaskSet, question: Question) -> list[dict[str, str]]:
    """The prompt receivers built for a peer's question before the example followed the question: their own."""
    own_seed_question = taskset.rebuild(TaskRef(question.ref.dataset, question.ref.config, taskset.seed,
                                                question.ref.index))
    messages = taskset.messages(own_seed_question)
    if len(messages) == 4:
        messages = [*messages[:3], question.messages()[1]]
    return messages


def poisoned_completion_into(text: str, trigger: str, place: str) -> str:
    """Another policy's own answer with `trigger` appended, prefixed, or put in the middle of it."""
    if place == "append":
        return f"{text} {trigger}"
    if place == "prefix":
        return f"{trigger} {text}"
    middle = len(text) // 2
    return f"{text[:middle]} {trigger} {text[middle:]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of questions to draw (each B questions)")
    ap.add_argument("--drift", type=Path, default=None, help="a checkpoint folder of a drifted peer (round-NNNNNN)")
    ap.add_argument("--out", type=Path, default=None, help="write the raw statistics here as JSON")
    ap.add_argument("--probation", type=int, default=8, help="items before a sender's baseline exists (default 8)")
    ap.add_argument("--spreads", type=float, default=4.0, help="swarm.sender_spreads to judge with (default 4)")
    args = ap.parse_args(argv)
    from engine.backends import load_backend

    cfg = build_config("default", None, BENCH_SETTINGS)
    paths = Paths.default()
    device = pick_device("cpu")
    model_dir = resolve_model_dir("bundled", paths.models_cache, None)
    receiver = load_backend(model_dir, device, cfg.grpo, 0, cfg.tasks.temperature)
    taskset = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=0)
    G, T, cap = cfg.tasks.completions_per_question, cfg.tasks.temperature, cfg.tasks.max_new_tokens
    questions = [q for r in range(1, args.rounds + 1) for q in taskset.draw(r, cfg.tasks.questions_per_round)]
    prompts = [receiver.encode_prompt(taskset.messages(q)) for q in questions]

    # An honest peer (seed 2) answers its own questions under its own prompt. The receiver rebuilds
    # that prompt from the question's reference (TaskSet.messages); "same_model_receivers_example"
    # scores the same text under the receiver's own worked example instead, as receivers did before.
    peer_tasks = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=2)
    peer_questions = [q for r in range(1, args.rounds + 1) for q in peer_tasks.draw(r, cfg.tasks.questions_per_round)]
    peer_prompts = [receiver.encode_prompt(taskset.messages(taskset.rebuild(q.ref))) for q in peer_questions]
    old_prompts = [receiver.encode_prompt(receivers_example_messages(taskset, q)) for q in peer_questions]

    def sample(backend: object, seed: int, temperature: float, fewshot: bool = True) -> list[list[str]]:
        backend.reseed(seed)  # type: ignore[attr-defined]
        ps = ([backend.encode_prompt(peer_tasks.messages(q)) for q in peer_questions] if fewshot  # type: ignore[attr-defined]
              else [backend.encode_prompt(q.messages()) for q in peer_questions])  # type: ignore[attr-defined]
        out = backend.generate(ps, G, cap, temperature)  # type: ignore[attr-defined]
        return [[c.text for c in out[i * G:(i + 1) * G]] for i in range(len(peer_questions))]

    def score(groups: list[list[str]], under: list[list[int]] | None = None) -> list[list[list[float]]]:
        under = peer_prompts if under is None else under
        pairs = [(under[i], receiver.encode_completion(t)) for i, g in enumerate(groups) for t in g]
        lps = [lp[:-1] for lp in receiver.behaviour_logprobs(pairs, T)]  # the EOS the encoder appends is not judged
        return [lps[i * len(g):(i + 1) * len(g)] for i, g in enumerate(groups)]

    receiver.reseed(1)
    own_c = receiver.generate(prompts, G, cap, T)
    honest = sample(receiver, 2, T)
    other = sample(receiver, 3, 1.2, fewshot=False)
    cases: dict[str, list[list[list[float]]]] = {
        "own": [[c.logprobs for c in own_c[i * G:(i + 1) * G]] for i in range(len(questions))],
        "same_model": score(honest),
        "same_model_receivers_example": score(honest, old_prompts),
        OTHER: score(other),
    }
    texts: dict[str, list[list[str]]] = {}
    if args.drift is not None:
        drifted = load_backend(model_dir, device, cfg.grpo, 0, T)
        drifted.load(args.drift)
        texts["drifted"] = sample(drifted, 4, T)
        cases["drifted"] = score(texts["drifted"])
        cases["drifted_receivers_example"] = score(texts["drifted"], old_prompts)
        del drifted
    for name in TRIGGERS:
        for place in PLACES:
            groups = [[poisoned_completion(q, TRIGGERS[name], place) for _ in range(G // 2)] for q in peer_questions]
            cases[f"poison_{name}_{place}"] = score(groups)
            injected = [[poisoned_completion_into(t, TRIGGERS[name], place) for t in g[:G // 2]] for g in other]
            cases[f"poison_other_{name}_{place}"] = score(injected)

    report: dict[str, dict[str, object]] = {}
    for case, items in cases.items():
        row: dict[str, object] = {"items": len(items)}
        for w in WINDOWS:
            lows = [min(window_floor(lp, w) for lp in item) for item in items]
            row[f"w{w}"] = {"p01": round(quantile(lows, 0.01), 2), "p10": round(quantile(lows, 0.10), 2),
                            "median": round(quantile(lows, 0.5), 2), "max": round(max(lows), 2),
                            "rejected_at": {str(f): round(sum(lo < f for lo in lows) / len(lows), 3) for f in FLOORS}}
        lows4 = [min(window_floor(lp, 4) for lp in item) for item in items]
        if case.startswith("poison_"):
            honest_case = OTHER if case.startswith("poison_other_") else "same_model"
            base = [min(window_floor(lp, 4) for lp in item) for item in cases[honest_case]]
            row["past_w4"] = f"{refused_against(base, lows4, args.spreads)} of {len(lows4)} refused"
        else:
            refused, judged = refused_against_past(lows4, args.probation, args.spreads)
            row["past_w4"] = f"{refused} of {judged} refused after {args.probation} on probation"
        report[case] = row
        print(case, json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps({"report": report, "texts": texts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
