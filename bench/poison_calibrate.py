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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.poisoning import BENCH_SETTINGS, TRIGGERS, poisoned_completion
from engine.config import build_config
from engine.defence import quantile, window_floor
from engine.device import pick_device
from engine.models import resolve_model_dir
from engine.paths import Paths
from engine.tasks import Question, TaskRef, TaskSet

WINDOWS = (1, 2, 4, 8)
FLOORS = (-4.0, -5.0, -6.0, -7.0, -8.0)


def receivers_example_messages(taskset: TaskSet, question: Question) -> list[dict[str, str]]:
    """The prompt receivers built for a peer's question before the example followed the question: their own."""
    own_seed_question = taskset.rebuild(TaskRef(question.ref.dataset, question.ref.config, taskset.seed,
                                                question.ref.index))
    messages = taskset.messages(own_seed_question)
    if len(messages) == 4:
        messages = [*messages[:3], question.messages()[1]]
    return messages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of questions to draw (each B questions)")
    ap.add_argument("--drift", type=Path, default=None, help="a checkpoint folder of a drifted peer (round-NNNNNN)")
    ap.add_argument("--out", type=Path, default=None, help="write the raw statistics here as JSON")
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
    cases: dict[str, list[list[list[float]]]] = {
        "own": [[c.logprobs for c in own_c[i * G:(i + 1) * G]] for i in range(len(questions))],
        "same_model": score(honest),
        "same_model_receivers_example": score(honest, old_prompts),
        "other_policy_T1.2_no_example": score(sample(receiver, 3, 1.2, fewshot=False)),
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
        for place in ("append", "prefix", "inside"):
            groups = [[poisoned_completion(q, TRIGGERS[name], place) for _ in range(G // 2)] for q in peer_questions]
            cases[f"poison_{name}_{place}"] = score(groups)

    report: dict[str, dict[str, object]] = {}
    for case, items in cases.items():
        row: dict[str, object] = {"items": len(items)}
        for w in WINDOWS:
            lows = [min(window_floor(lp, w) for lp in item) for item in items]
            row[f"w{w}"] = {"p01": round(quantile(lows, 0.01), 2), "p10": round(quantile(lows, 0.10), 2),
                            "median": round(quantile(lows, 0.5), 2), "max": round(max(lows), 2),
                            "rejected_at": {str(f): round(sum(lo < f for lo in lows) / len(lows), 3) for f in FLOORS}}
        report[case] = row
        print(case, json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps({"report": report, "texts": texts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
