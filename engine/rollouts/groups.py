"""A group: one question with its G answers, their rewards and advantages, and what a round trains on.

Plain data, no torch: the round loop builds a `Group` from its own completions
or from a peer's verified text, `group_advantages` gives GRPO's advantages,
`trained_groups` keeps the groups a round trains on (grpo.train_on) and
`train_items` flattens them into the sequences a backend trains on
(engine/backends/base.py: `Completion` in, `TrainItem` out). The swarm publishes
groups as text (engine/swarm/exchange.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.backends.base import TrainItem
from engine.common.presets import TRAIN_ON
from engine.questions.scores import PASS_REWARD, rewards_differ, teaches

if TYPE_CHECKING:
    from engine.backends.base import Completion
    from engine.questions.tasks import Question


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
    if not rewards_differ(rewards):
        return [0.0] * n
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def trained_groups(groups: Sequence[Group], train_on: str = "informative") -> list[Group]:
    """The groups a round trains on (grpo.train_on): every informative one, or with 'passed' only those in which
    an answer passed; a group whose scores differ by partial credit alone (a well-formed wrong answer beside a
    malformed one) gets advantages as large as one with the right answer in it, and is left out."""
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
    return [g for g in groups if teaches(g.informative, max(g.rewards) >= PASS_REWARD, train_on)]


def train_items(groups: Sequence[Group]) -> list[TrainItem]:
    """Flatten informative groups into sequences; zero-advantage completions add nothing."""
    items: list[TrainItem] = []
    for group in groups:
        for completion, adv in zip(group.completions, group.advantages, strict=True):
            if adv == 0.0 or not completion.token_ids:
                continue
            items.append(TrainItem(group.prompt_ids, completion.token_ids, completion.logprobs, adv,
                                   completion.weights))
    return items
