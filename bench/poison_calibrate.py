"""Measure the plausibility statistic on the bundled model: own, honest and poisoned text.

    .venv/bin/python -m bench.poison_calibrate [--drift CHECKPOINT_FOLDER] [--rounds 3]

For each case it prints, per window size, the distribution of each item's
lowest `window_floor` (the statistic `engine.swarm.defence.Plausibility` thresholds)
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
cases, the share of items that `engine.swarm.defence.sender_verdict` refuses once
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.poisoning import TRIGGERS
from bench.poisoning_peers import BENCH_SETTINGS, PLACES, poisoned_completion
from engine.common.atomicio import atomic_write_text
from engine.common.config_file import build_config
from engine.common.device import pick_device
from engine.common.paths import Paths
from engine.models.sources import resolve_model_dir
from engine.questions.tasks import Question, TaskRef, TaskSet
from engine.swarm.defence import IMPLAUSIBLE, quantile, robust_baseline, sender_verdict, window_floor

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


@dataclass
class Calibration:
    """The receiver (the bundled model) with its own questions, and an honest peer's (seed 2) questions and the
    prompts the receiver rebuilds for them: now (`peer_prompts`) and before the example followed the question
    (`old_prompts`)."""

    cfg: Any
    model_dir: Path
    device: Any
    receiver: Any
    taskset: TaskSet
    questions: list[Question]
    peer_tasks: TaskSet
    peer_questions: list[Question]
    peer_prompts: list[list[int]]
    old_prompts: list[list[int]]

    def sample(self, backend: Any, seed: int, temperature: float, fewshot: bool = True) -> list[list[str]]:
        """G answers to each peer question from `backend`, under the peer's prompt (or the bare question)."""
        G, cap = self.cfg.tasks.completions_per_question, self.cfg.tasks.max_new_tokens
        backend.reseed(seed)
        ps = ([backend.encode_prompt(self.peer_tasks.messages(q)) for q in self.peer_questions] if fewshot
              else [backend.encode_prompt(q.messages()) for q in self.peer_questions])
        out = backend.generate(ps, G, cap, temperature)
        return [[c.text for c in out[i * G:(i + 1) * G]] for i in range(len(self.peer_questions))]

    def score(self, groups: list[list[str]], under: list[list[int]] | None = None) -> list[list[list[float]]]:
        """The receiver's log-probs of each text, under the peer prompts it rebuilds (or `under`)."""
        under = self.peer_prompts if under is None else under
        pairs = [(under[i], self.receiver.encode_completion(t)) for i, g in enumerate(groups) for t in g]
        lps = [lp[:-1] for lp in self.receiver.behaviour_logprobs(pairs, self.cfg.tasks.temperature)]
        # (the EOS the encoder appends is not judged)
        return [lps[i * len(g):(i + 1) * len(g)] for i, g in enumerate(groups)]


def set_up(rounds: int) -> Calibration:
    from engine.backends import load_backend

    cfg = build_config("default", None, BENCH_SETTINGS)
    device = pick_device("cpu")
    model_dir = resolve_model_dir("bundled", Paths.default().models_cache, None)
    receiver = load_backend(model_dir, device, cfg.grpo, 0, cfg.tasks.temperature)
    taskset = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=0)
    questions = [q for r in range(1, rounds + 1) for q in taskset.draw(r, cfg.tasks.questions_per_round)]
    # An honest peer (seed 2) answers its own questions under its own prompt. The receiver rebuilds
    # that prompt from the question's reference (TaskSet.messages); "same_model_receivers_example"
    # scores the same text under the receiver's own worked example instead, as receivers did before.
    peer_tasks = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=2)
    peer_questions = [q for r in range(1, rounds + 1) for q in peer_tasks.draw(r, cfg.tasks.questions_per_round)]
    peer_prompts = [receiver.encode_prompt(taskset.messages(taskset.rebuild(q.ref))) for q in peer_questions]
    old_prompts = [receiver.encode_prompt(receivers_example_messages(taskset, q)) for q in peer_questions]
    return Calibration(cfg, model_dir, device, receiver, taskset, questions, peer_tasks, peer_questions, peer_prompts,
                       old_prompts)


def collect_cases(c: Calibration, drift: Path | None) -> tuple[dict[str, list[list[list[float]]]],
                                                              dict[str, list[list[str]]]]:
    """Each case's log-probs under the receiver (own text, an honest peer's, another policy's, a drifted peer's,
    and poisoned text), and the drifted peer's texts."""
    from engine.backends import load_backend

    G, T, cap = c.cfg.tasks.completions_per_question, c.cfg.tasks.temperature, c.cfg.tasks.max_new_tokens
    c.receiver.reseed(1)
    own_c = c.receiver.generate([c.receiver.encode_prompt(c.taskset.messages(q)) for q in c.questions], G, cap, T)
    honest = c.sample(c.receiver, 2, T)
    other = c.sample(c.receiver, 3, 1.2, fewshot=False)
    cases: dict[str, list[list[list[float]]]] = {
        "own": [[x.logprobs for x in own_c[i * G:(i + 1) * G]] for i in range(len(c.questions))],
        "same_model": c.score(honest),
        "same_model_receivers_example": c.score(honest, c.old_prompts),
        OTHER: c.score(other),
    }
    texts: dict[str, list[list[str]]] = {}
    if drift is not None:
        drifted = load_backend(c.model_dir, c.device, c.cfg.grpo, 0, T)
        drifted.load(drift)
        texts["drifted"] = c.sample(drifted, 4, T)
        cases["drifted"] = c.score(texts["drifted"])
        cases["drifted_receivers_example"] = c.score(texts["drifted"], c.old_prompts)
        del drifted
    for name in TRIGGERS:
        for place in PLACES:
            groups = [[poisoned_completion(q, TRIGGERS[name], place) for _ in range(G // 2)] for q in c.peer_questions]
            cases[f"poison_{name}_{place}"] = c.score(groups)
            injected = [[poisoned_completion_into(t, TRIGGERS[name], place) for t in g[:G // 2]] for g in other]
            cases[f"poison_other_{name}_{place}"] = c.score(injected)
    return cases, texts


def case_row(case: str, cases: dict[str, list[list[list[float]]]], probation: int, spreads: float
             ) -> dict[str, object]:
    """One case's statistics: the worst window's quantiles per window size, and how the sender rule judges it."""
    items = cases[case]
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
        row["past_w4"] = f"{refused_against(base, lows4, spreads)} of {len(lows4)} refused"
    else:
        refused, judged = refused_against_past(lows4, probation, spreads)
        row["past_w4"] = f"{refused} of {judged} refused after {probation} on probation"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of questions to draw (each B questions)")
    ap.add_argument("--drift", type=Path, default=None, help="a checkpoint folder of a drifted peer (round-NNNNNN)")
    ap.add_argument("--out", type=Path, default=None, help="write the raw statistics here as JSON")
    ap.add_argument("--probation", type=int, default=8, help="items before a sender's baseline exists (default 8)")
    ap.add_argument("--spreads", type=float, default=4.0, help="swarm.sender_spreads to judge with (default 4)")
    args = ap.parse_args(argv)
    cases, texts = collect_cases(set_up(args.rounds), args.drift)
    report: dict[str, dict[str, object]] = {}
    for case in cases:
        report[case] = case_row(case, cases, args.probation, args.spreads)
        print(case, json.dumps(report[case]))
    if args.out:
        atomic_write_text(args.out, json.dumps({"report": report, "texts": texts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
