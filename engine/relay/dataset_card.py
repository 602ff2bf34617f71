"""The dataset card (README.md) of a swarm's dataset export, with Hugging Face YAML metadata.

    text = write_card(stats, license_id="cc-by-4.0", name="Maths club", report=report, heldout_questions=108)

The metadata gives the license, the size category, the task categories and
the one `train` split (data/train-*.parquet); the body says how an item got
in (engine/relay/dataset_export.py), what was checked and what was not, and
per specialty the answers, items and pass rate, the date range, the models
as their batches were labelled, and the signers by key id (peer id: the
first 20 hex characters of the SHA-256 of the Ed25519 public key), never by
name. engine/relay/dataset_export.py calls it after every shard.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
         (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"))
TASK_CATEGORIES = ("question-answering", "text-generation")
TAGS = ("reasoning", "reinforcement-learning", "reasoning-gym", "sapling", "synthetic")


def size_category(rows: int) -> str:
    return next((label for bound, label in SIZES if rows < bound), "n>100M")


def _day(value: Any) -> str:
    if value is None:
        return "none yet"
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return datetime.datetime.fromtimestamp(float(value), datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_card(stats: dict[str, Any], *, license_id: str, name: str, report: Any, heldout_questions: int) -> str:
    """The card's text: YAML front matter, then Markdown."""
    yaml = ["---", f"license: {license_id}", "language:", "- en", "size_categories:",
            f"- {size_category(stats['rows'])}", "task_categories:", *(f"- {t}" for t in TASK_CATEGORIES),
            "tags:", *(f"- {t}" for t in TAGS), f"pretty_name: {json.dumps(name + ' dataset', ensure_ascii=True)}",
            "configs:", "- config_name: default", "  data_files:", "  - split: train",
            "    path: data/train-*.parquet", "---", ""]
    specialties = stats["specialties"]
    table = ["| specialty | answers | items | pass rate |", "|---|---:|---:|---:|"]
    table += [f"| {_cell(s)} | {e['answers']:,} | {e['items']:,} | {e['pass_rate']:.1%} |"
              for s, e in specialties.items()]
    signers = stats["signers"]
    skipped = report.skipped
    left_out = ", ".join(f"{n:,} {why.replace('_', ' ')}" for why, n in sorted(skipped.items())) or "none"
    body = [
        f"# {name}: answers the swarm shared and used",
        "",
        f"Answers that the nodes of the Sapling swarm {json.dumps(name, ensure_ascii=False)} shared with each other "
        "while training, one row per answer, as its relay kept them.",
        "",
        "## How an answer got in",
        "",
        "- Its item (a question with its sender's answers) came in a batch signed with the sender's Ed25519 key; "
        "the signature over the exact text was checked again here.",
        "- Its question was rebuilt with reasoning-gym from the task reference the sender named, and had to match "
        "the text sent.",
        "- Every answer was scored again with reasoning-gym's verifier; an item whose sender claimed another score "
        "was left out. `score` is the verifier's score here, `correct` is a score of 1.",
        "- A verifier passes a correct answer with anything appended, an advert for instance. So an item is here "
        "only when a receipt from another node marked it used: it passed that node's whole defence, the "
        "plausibility check of its own model included. That is one node's judgement, not a proof.",
        f"- Questions among the held-out questions (the first {heldout_questions} of each specialty, config and "
        "seed) are left out, and answers are deduplicated by their normalised question and answer text.",
        "- Answers are kept wrong or right: filter on `correct` for the right ones.",
        "",
        "## What it holds",
        "",
        f"- {stats['rows']:,} answers to {stats['items']:,} items, published from {_day(stats['first'])} to "
        f"{_day(stats['last'])}.",
        f"- Signed by {len(signers):,} key{'' if len(signers) == 1 else 's'}, named here by key id only: "
        + (", ".join(f"`{s}`" for s in signers) if signers else "none") + ".",
        "- Models, as their senders labelled the batches (a label is the sender's claim): "
        + (", ".join(f"`{_cell(m)}` ({n:,})" for m, n in sorted(stats["models"].items())) or "none") + ".",
        f"- Left out in the last export: {left_out}; damaged kept lines skipped: {report.damaged:,}.",
        "",
        *table,
        "",
        "## Columns",
        "",
        "`id` (signer:seq:position:answer), `item`, `specialty`, `task` (the reasoning-gym reference, JSON), "
        "`question`, `reference_answer`, `answer` (the full completion), `score`, `correct`, `signer` (key id), "
        "`model` (the batch's label), `published` (the batch's signed time, UTC).",
        "",
        "## License",
        "",
        f"{license_id}, as the swarm's relay announced to every node before it joined.",
        "",
    ]
    return "\n".join(yaml + body)
