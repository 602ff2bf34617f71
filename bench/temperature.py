"""How many of a node's own groups teach at each sampling temperature, on the same questions (issue 37).

    .venv/bin/python -m bench.temperature                                  # bundled model, 48 questions
    .venv/bin/python -m bench.temperature --temperatures 0.7,1.0 --questions 96 --threads 2
    .venv/bin/python -m bench.temperature --checkpoint RUN/mix-8-0/node-0/checkpoints/node-0/round-000020

GRPO learns only from a group whose answers scored differently. With the
default 0.7 a 135M model often writes the same answer eight times, so the
group teaches nothing whether that answer is right or wrong. A hotter
sampler spreads the answers; it may also spoil them. This bench draws the
default round's questions (rounds 1, 2, ... of seed 0, as a default node
draws them), samples G answers of each at every temperature with the same
seed, and scores them with the node's own reward. Per temperature it
prints: the share of groups whose answers scored differently ("teach"),
the mean reward, the share of answers that scored above 0, the mean answer
length in tokens, the surprisal (the mean -log-prob of a sampled token under
the sampling distribution: the sampler's entropy) and the seconds taken. Against the first temperature it
prints the paired difference of the teaching share with a 95% bootstrap
interval over questions. --checkpoint loads a node's trained adapters
first (a checkpoint folder holding adapter.safetensors), to see the same
on a model that has trained.

--judge first|same: would a peer refuse this text, and would it still catch
poison? The questions split in two: the even ones are the receiver's own
round, the odd ones a peer's. The peer's groups at each temperature are
judged as a receiver running the same model judges an item
(engine.swarm.defence.Plausibility with the default swarm settings: the lowest
mean log-prob over plausibility_window tokens, under the receiver's policy
at its own temperature, against a floor set by its own answers), the
receiver sampling at the first temperature (`first`: today's nodes) or at
the peer's (`same`: a swarm whose nodes all reached that temperature). It
prints the share of the peer's groups refused as implausible (honest text:
every refusal is a false one, and a strike against the peer) and the share
of poisoned answers caught, with the floor as a node sets it (the fixed
swarm.implausible_logprob, lowered below the receiver's own most improbable
window) and with the fixed floor alone (each odd question's right answer with each of
bench.poisoning's triggers appended, prefixed or inside, as
bench.poisoning_peers writes them).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.args import comma_numbers


def paired_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """mean(b - a) over paired questions with its 95% interval: the experiment report's paired bootstrap
    (`engine.experiment.report.two_way_bootstrap`) with one row of questions."""
    from engine.experiment.report import two_way_bootstrap

    out = two_way_bootstrap([list(b)], [list(a)])
    lo, hi = out["difference_ci95"]
    return out["difference"], lo, hi


def judged(cfg: Any, backend: Any, questions: Sequence[Any], prompts: Sequence[list[int]], out: Sequence[Any],
           own: Sequence[Any], at: float) -> dict[str, float]:
    """The odd questions' groups of `out` and poisoned answers to them, judged by a receiver at temperature `at`
    whose own round is the even questions' answers in `own` (see the module's --judge)."""
    from bench.poisoning import TRIGGERS
    from bench.poisoning_peers import PLACES, poisoned_completion
    from engine.swarm.defence import Plausibility

    G = cfg.tasks.completions_per_question
    test = Plausibility(window=cfg.swarm.plausibility_window, absolute=cfg.swarm.implausible_logprob)
    mine = [c for i in range(0, len(questions), 2) for c in own[i * G : (i + 1) * G]]
    floor = test.floor([c.logprobs for c in mine])  # as a node: its own answers' log-probs as it sampled them

    def bare(ids: list[int]) -> list[int]:  # the EOS the receiver's encoder appends is not the sender's text
        return ids[:-1] if len(ids) > 1 and ids[-1] == backend.eos_token_id else ids

    peer = list(range(1, len(questions), 2))
    pairs = [(prompts[i], bare(c.token_ids)) for i in peer for c in out[i * G : (i + 1) * G]]
    lps = backend.behaviour_logprobs(pairs, at)
    poison = [(prompts[i], bare(backend.encode_completion(poisoned_completion(questions[i], trigger, place))))
              for i in peer for trigger in TRIGGERS.values() for place in PLACES]
    poison_lps = backend.behaviour_logprobs(poison, at)
    out_row: dict[str, float] = {"judge_floor": floor, "judge_temperature": at}
    for name, limit in (("", floor), ("_absolute", test.absolute)):  # the floor as a node sets it; the fixed one
        out_row["refused" + name] = sum(not test.judge(lps[k * G : (k + 1) * G], limit)
                                        for k in range(len(peer))) / len(peer)
        out_row["poison_caught" + name] = sum(not test.judge([lp], limit) for lp in poison_lps) / len(poison)
    return out_row


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | str:
    """The arguments, or why they are refused (one sentence)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperatures", default="0.7,1.0,1.3",
                        help="comma-separated; the first is the peer the others are compared with "
                             "(default 0.7,1.0,1.3)")
    parser.add_argument("--questions", type=int, default=48, help="questions, drawn as rounds of the default size")
    parser.add_argument("--first-round", type=int, default=1,
                        help="draw the questions of rounds N, N+1, ... (default 1; a trained node has seen its early "
                             "rounds)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder whose adapters to load first")
    parser.add_argument("--judge", choices=["first", "same"],
                        help="also judge each temperature's groups as a receiver sampling at the first temperature "
                             "(first) or at theirs (same) would, and poisoned answers the same way")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    args.temps = comma_numbers(args.temperatures, float, "--temperatures")
    if isinstance(args.temps, str):
        return args.temps
    if any(not 0 < t <= 5 for t in args.temps):
        return "--temperatures must each be above 0 and at most 5"
    if args.first_round < 1:
        return "--first-round must be at least 1"
    if args.questions < 2:
        return "--questions must be at least 2"
    if args.threads < 0:
        return "--threads must be 0 (torch's default) or more"
    if args.checkpoint is not None and not (args.checkpoint / "adapter.safetensors").is_file():
        return f"--checkpoint {args.checkpoint} holds no adapter.safetensors"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, str):
        print(f"temperature: {args}", file=sys.stderr)
        return 2
    import torch

    from bench.bundled import bundled_cpu
    from engine.node.loop import derive_seed

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, backend, taskset = bundled_cpu()
    if args.checkpoint is not None:
        backend.load(args.checkpoint)
    t = cfg.tasks
    B, G = t.questions_per_round, t.completions_per_question
    questions: list[Any] = []
    r = args.first_round - 1
    while len(questions) < args.questions:
        r += 1
        questions += taskset.draw(r, B)
    questions = questions[: args.questions]
    prompts = [backend.encode_prompt(taskset.messages(q)) for q in questions]
    print(f"temperature: {'trained ' + str(args.checkpoint) if args.checkpoint else 'bundled SmolLM2-135M'}, "
          f"{len(questions)} questions x {G} answers, up to {t.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads")
    results: dict[str, Any] = {}
    first_out: list[Any] = []
    teach: dict[float, list[float]] = {}
    for temp in args.temps:
        backend.reseed(derive_seed(cfg.run.seed, 1))
        start = time.perf_counter()
        out = backend.generate(prompts, G, t.max_new_tokens, temp)
        took = time.perf_counter() - start
        scores = [[taskset.reward(q, c.text) for c in out[i * G : (i + 1) * G]] for i, q in enumerate(questions)]
        teach[temp] = [1.0 if len(set(s)) > 1 else 0.0 for s in scores]
        flat = [x for s in scores for x in s]
        row = {"teach": sum(teach[temp]) / len(questions), "mean_reward": sum(flat) / len(flat),
               "scored": sum(x > 0 for x in flat) / len(flat),
               "tokens": sum(len(c.token_ids) for c in out) / len(out), "seconds": took,
               "surprisal": -sum(x for c in out for x in c.logprobs) / max(1, sum(len(c.logprobs) for c in out)),
               "all_fail": sum(max(s) == 0 for s in scores) / len(questions),
               "all_pass": sum(len(set(s)) == 1 and max(s) > 0 for s in scores) / len(questions)}
        by_kind: dict[str, list[float]] = {}
        for q, x in zip(questions, teach[temp], strict=True):
            by_kind.setdefault(q.ref.dataset, []).append(x)
        row["teach_by_specialty"] = {k: round(sum(v) / len(v), 2) for k, v in sorted(by_kind.items())}
        if temp != args.temps[0]:
            row["teach_vs_first"] = paired_interval(teach[args.temps[0]], teach[temp])
        first_out = first_out or out
        extra = ""
        if args.judge:
            at = args.temps[0] if args.judge == "first" else temp
            row.update(judged(cfg, backend, questions, prompts, out, first_out if args.judge == "first" else out, at))
            extra = (f"   judged at T{at} (floor {row['judge_floor']:.2f}): peer's groups refused "
                     f"{row['refused']:.2f}, poison caught {row['poison_caught']:.2f}; at the fixed floor "
                     f"{cfg.swarm.implausible_logprob}: {row['refused_absolute']:.2f}, "
                     f"{row['poison_caught_absolute']:.2f}")
        results[str(temp)] = row
        if "teach_vs_first" in row:
            d, lo, hi = row["teach_vs_first"]
            extra += f"   teach - T{args.temps[0]}: {d:+.2f} [{lo:+.2f}, {hi:+.2f}]"
        print(f"  T {temp:4.2f}: teach {row['teach']:.2f} (all fail {row['all_fail']:.2f}, "
              f"all same >0 {row['all_pass']:.2f})  mean reward {row['mean_reward']:.3f}  "
              f"answers scoring >0 {row['scored']:.2f}  {row['tokens']:.1f} tokens/answer  "
              f"surprisal {row['surprisal']:.3f} nats/token  {took:.1f} s{extra}", flush=True)
    if args.json:
        from engine.common.atomicio import atomic_write_json

        atomic_write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
