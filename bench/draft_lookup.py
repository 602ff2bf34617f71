"""Would speculative decoding with looked-up drafts shorten the greedy evaluation? A simulation on its real answers.

    .venv/bin/python -m bench.draft_lookup                 # the 27 held-out questions, drafts of 2, 4 and 8 tokens
    .venv/bin/python -m bench.draft_lookup --eval 108 --drafts 4

Runs the greedy evaluation once (`TorchBackend.greedy`'s decoder), then
replays each answer as prompt-lookup speculative decoding would: at each
step a draft is the k tokens that followed the latest earlier occurrence
of the last 3 (else 2, else 1) tokens in the prompt and the answer so far,
and the draft is kept up to its first token that differs from the greedy
answer (exact for greedy decoding), plus the one token the step computes
anyway. A chunk decodes until its slowest row ends, so what counts is the
most steps any row needs, against the longest answer's length now. It
counts steps only: each speculative step would also cost more, since it
runs k + 1 tokens per row.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def draft(context: list[int], k: int, ngram: int = 3) -> list[int]:
    """The k tokens after the latest earlier occurrence of the context's last n tokens (n = ngram .. 1)."""
    for n in range(min(ngram, len(context) - 1), 0, -1):
        key = context[-n:]
        for i in range(len(context) - n - 1, -1, -1):
            if context[i : i + n] == key:
                return context[i + n : i + n + k]
    return []


def steps_with_drafts(prompt: list[int], answer: list[int], k: int) -> int:
    """Decode steps greedy decoding of `answer` would take with looked-up drafts of k tokens."""
    position = steps = 0
    while position < len(answer):
        proposal = draft(prompt + answer[:position], k)
        kept = 0
        while kept < len(proposal) and position + kept < len(answer) and proposal[kept] == answer[position + kept]:
            kept += 1
        position += kept + 1
        steps += 1
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval", type=int, default=27, help="held-out questions (default 27)")
    parser.add_argument("--drafts", default="2,4,8", help="draft lengths, comma-separated (default 2,4,8)")
    args = parser.parse_args(argv)
    try:
        lengths = [int(x) for x in args.drafts.split(",")]
    except ValueError:
        lengths = []
    if args.eval < 1 or not lengths or min(lengths) < 1:
        print("draft_lookup: --eval and every --drafts length must be whole numbers from 1.", file=sys.stderr)
        return 2

    from bench.bundled import bundled_cpu

    cfg, backend, taskset = bundled_cpu()
    t = cfg.tasks
    prompts = [backend.encode_prompt(taskset.eval_messages(q)) for q in taskset.eval_set(args.eval)]
    answers = [row.tokens for row in backend.decode_rows(prompts, 1, t.max_new_tokens, None, None)]
    longest = max(len(a) for a in answers)
    print(f"draft_lookup: {len(prompts)} held-out questions, greedy, up to {t.max_new_tokens} tokens; "
          f"answer lengths {sorted(len(a) for a in answers)}")
    for k in lengths:
        steps = [steps_with_drafts(p, a, k) for p, a in zip(prompts, answers, strict=True)]
        slowest = sorted(zip((len(a) for a in answers), steps, strict=True), key=lambda pair: -pair[0])[:6]
        print(f"drafts of {k}: the longest answers (tokens, steps) {slowest}; the chunk's steps {max(steps)} against "
              f"{longest} now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
