"""The relay's evaluation questions: the same set for every node, named by the seed the relay announces.

    refs = seed_refs(seed, 36)                        # item i: specialty i % 9 at index i // 9, default config
    questions = seed_questions(taskset, seed, 36)     # rebuilt (the node answers them, the relay re-scores)

Every hour the relay names a fresh seed (engine/relay/results.py); a node
that takes part answers these questions greedily at its own held-out
evaluation and signs the answers (engine/node/results.py). The set spans
the nine SAPO specialties at their default configs, so that every node
answers the same questions whatever it trains on.
"""

from __future__ import annotations

from typing import Any

from engine.common.presets import SAPO_SPECIALTIES
from engine.questions.configs import DEFAULT_DATASET_CONFIGS
from engine.questions.tasks import MAX_SEED, Question, TaskRef, TaskSet


def seed_refs(seed: int, n: int) -> list[TaskRef]:
    """The n questions of an evaluation seed: specialty i % 9 at index i // 9, each at its default config."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"an evaluation seed must be a whole number from 0 to {MAX_SEED}")
    k = len(SAPO_SPECIALTIES)
    return [TaskRef.create(SAPO_SPECIALTIES[i % k], DEFAULT_DATASET_CONFIGS[SAPO_SPECIALTIES[i % k]], seed, i // k)
            for i in range(n)]


def every_specialty() -> TaskSet:
    """A task set of all nine specialties at their default configs: the one these questions are built with."""
    return TaskSet(dict.fromkeys(SAPO_SPECIALTIES, 1.0))


def seed_questions(taskset: Any, seed: int, n: int) -> list[Question]:
    """The questions of `seed_refs`, rebuilt with `taskset` (any TaskSet: a ref carries its own config)."""
    return [taskset.rebuild(ref) for ref in seed_refs(seed, n)]
