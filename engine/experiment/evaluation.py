"""The experiment's held-out evaluation while it runs, and the best checkpoint each node has reached.

Every node answers the same fixed held-out set greedily (pass@1), all nodes in
one batch, each row with its own adapter (`evaluate_set`). The answers are kept
question by question ("passes", one character a question) so that two mixes can
be compared paired (engine/experiment/heldout.py).

A long run can collapse late: reward and held-out accuracy fall after a peak.
So after each evaluation a node whose accuracy beats its own best so far copies
the checkpoint of that round to ``node-K/best-held-out/`` (`keep_best`), beside
``best.json`` naming the round and the accuracy. The copy is written under a
temporary name and renamed into place, and the checkpoint pruning never
touches it: whatever happens later, each node's best model is on disk.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.common.atomicio import atomic_dir
from engine.node.checkpoint import checkpoint_name

if TYPE_CHECKING:
    from engine.experiment.nodes import NodeBackend
    from engine.questions.tasks import Question, TaskSet

BEST_FOLDER = "best-held-out"
BEST_FILE = "best.json"


def evaluate_set(shared: Any, taskset: TaskSet, examples: str, views: Sequence[NodeBackend],
                 questions: Sequence[Question], max_new_tokens: int,
                 on_step: Callable[[int, int], None]) -> dict[str, Any]:
    """Greedy pass@1 of each node (`views`) on `questions`, in one batch; the mean and each node's answers.

    examples: "per_specialty" gives the prompts one worked example per specialty (TaskSet.eval_messages),
    "per_question" the training prompts (folders measured before the shared examples keep theirs)."""
    messages = taskset.eval_messages if examples == "per_specialty" else taskset.messages
    prompts = [shared.encode_prompt(messages(q)) for q in questions]
    adapters = [v.lora() for v in views]
    index = [k for k in range(len(views)) for _ in prompts]
    rows = shared.generate_with_adapters(prompts * len(views), 1, max_new_tokens, None, adapters, index,
                                         on_step=on_step)
    per_node: list[dict[str, Any]] = []
    for k in range(len(views)):
        answers = rows[k * len(prompts) : (k + 1) * len(prompts)]
        rewards = [taskset.reward(q, c.text) for q, c in zip(questions, answers, strict=True)]
        passes = "".join("1" if r >= 1.0 else "0" for r in rewards)  # question by question, for a paired bootstrap
        per_node.append({"accuracy": passes.count("1") / len(rewards),
                         "reward_mean": sum(rewards) / len(rewards), "passes": passes})
    return {
        "questions": len(questions),
        "examples": examples,
        "accuracy": sum(n["accuracy"] for n in per_node) / len(per_node),
        "reward_mean": sum(n["reward_mean"] for n in per_node) / len(per_node),
        "nodes": per_node,
    }


def best_so_far(node_home: Path) -> dict[str, Any] | None:
    """What ``node-K/best-held-out/best.json`` says (round, accuracy), or None when the node has none yet."""
    try:
        saved = json.loads((node_home / BEST_FOLDER / BEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and isinstance(saved.get("accuracy"), int | float) else None


def keep_best(node_homes: Sequence[Path], checkpoint_roots: Sequence[Path], round_index: int,
              result: dict[str, Any]) -> list[int]:
    """Copy round `round_index`'s checkpoint of every node whose held-out accuracy in `result` beats its own best
    (strictly: a tie keeps the earlier, cheaper one) to its best-held-out folder; the nodes that improved."""
    improved = []
    for k, (home, root, node) in enumerate(zip(node_homes, checkpoint_roots, result["nodes"], strict=True)):
        best = best_so_far(home)
        source = root / checkpoint_name(round_index)
        if (best is not None and node["accuracy"] <= best["accuracy"]) or not source.is_dir():
            continue
        with atomic_dir(home / BEST_FOLDER) as tmp:
            shutil.copytree(source, tmp / checkpoint_name(round_index))
            record = {"round": round_index, "accuracy": node["accuracy"], "questions": result["questions"],
                      "checkpoint": checkpoint_name(round_index)}
            (tmp / BEST_FILE).write_text(json.dumps(record, sort_keys=True) + "\n")
        improved.append(k)
    return improved
