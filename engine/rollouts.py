"""Rollouts as plain data, shared by the round loop, the backends and the swarm.

No torch here: a `Group` is one question with its G completions, their
rewards (always computed locally) and their group advantages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.tasks import Question


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each token under the sampling policy
    finished: bool  # ended with EOS; False when cut off at the length cap


@dataclass
class Group:
    question: Question
    prompt_ids: list[int]
    completions: list[Completion]
    rewards: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    source: str = "local"  # "local", or the peer id an external group came from

    @property
    def informative(self) -> bool:
        """False when every advantage is zero: such a group carries no gradient."""
        return any(a != 0.0 for a in self.advantages)


@dataclass
class TrainItem:
    """One sequence for the policy-gradient step."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float


EQUAL_REWARD_TOLERANCE = 1e-9
"""Rewards (in [0, 1]) closer than this count as equal: the group carries no signal."""


def group_advantages(rewards: Sequence[float], eps: float) -> list[float]:
    """(r - mean) / (std + eps), with the population std of the group.

    A group whose rewards are all equal gets all-zero advantages. "Equal" allows
    for float rounding: eight rewards of 0.1 have a float mean of
    0.09999999999999999, and without the tolerance their 1e-17 spread became
    advantages of 1e-13, so such a group was counted informative and trained on
    for nothing (docs/results.md, run D).
    """
    if not rewards:
        return []
    n = len(rewards)
    if max(rewards) - min(rewards) <= EQUAL_REWARD_TOLERANCE:
        return [0.0] * n
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def train_items(groups: Sequence[Group]) -> list[TrainItem]:
    """Flatten informative groups into sequences; zero-advantage completions add nothing."""
    items: list[TrainItem] = []
    for group in groups:
        for completion, adv in zip(group.completions, group.advantages, strict=True):
            if adv == 0.0 or not completion.token_ids:
                continue
            items.append(TrainItem(group.prompt_ids, completion.token_ids, completion.logprobs, adv))
    return items
