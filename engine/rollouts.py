"""Rollouts as plain data, shared by the round loop, the backends and the swarm.

No torch here: a `Group` is one question with its G completions, their
rewards (always computed locally) and their group advantages.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.common.config import TRAIN_ON

if TYPE_CHECKING:
    from engine.tasks import Question


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each token under the sampling policy
    finished: bool  # ended with EOS; False when cut off at the length cap
    weights: list[float] | None = None  # per-token loss weight (external text: truncated importance weights)


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


# Why an external item is not trained on: the keys of `rejected_by_reason` in metrics and events.
R_MALFORMED = "malformed"
R_SIGNATURE = "bad_signature"
R_STALE = "stale"
R_UNKNOWN_TASK = "unknown_task"
R_QUESTION = "question_mismatch"
R_FORGED_REWARD = "forged_reward"
R_TOO_LONG = "too_long"
R_DUPLICATE = "duplicate"
R_ZERO_ADVANTAGE = "zero_advantage"
R_BANNED = "banned"
R_IMPLAUSIBLE = "implausible"  # correct text this node's own model finds improbable: injected (engine/defence.py)
REASONS = (R_MALFORMED, R_SIGNATURE, R_STALE, R_UNKNOWN_TASK, R_QUESTION, R_FORGED_REWARD, R_TOO_LONG,
           R_DUPLICATE, R_ZERO_ADVANTAGE, R_BANNED, R_IMPLAUSIBLE)


ItemId = tuple[str, int, int]
"""An item as the swarm names it: (sender's peer id, its batch's seq, its position in the batch)."""


@dataclass(frozen=True)
class ExternalItem:
    """A question group from a peer that passed every text check: the signature, the
    question rebuilt from its task reference, and every reward re-scored here.

    Tokens and log-probs are not here: they are the receiving node's business.
    """

    peer: str
    question: Question
    completions: tuple[str, ...]
    rewards: tuple[float, ...]  # scored by this node, never the sender's claim
    model: str = ""  # the model label of the sender's batch: its claim, used only to pick the plausibility test

    def content_key(self) -> str:
        """The same text under any sequence number: the question's reference and the completions."""
        blob = json.dumps([self.question.ref.key(), list(self.completions)], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass
class Offer:
    """What `sample` found this round: verified items, and how every other item was counted."""

    items: list[ExternalItem] = field(default_factory=list)
    received: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (peer, reason), one per item
    not_picked: list[str] = field(default_factory=list)  # peer of each item left unverified past n
    connected: bool = False
    # In a swarm of different models, the items (index into `items`) judged against their sender's own
    # past rather than this node's model, each with that sender's baseline values so far
    # (engine/defence.py, `sender_verdict`); the loop fills in the statistic and who is on probation.
    baselines: dict[int, tuple[float, ...]] = field(default_factory=dict)
    worst: dict[int, float] = field(default_factory=dict)  # the worst window of each of those items
    probation: set[int] = field(default_factory=set)  # of those, accepted while their sender is on probation
    # For the receipts (engine/swarm/contribution.py): where each of `items` came from, and the verdicts already
    # known for the other items a receipt can name (a rejection reason, or "not_picked").
    item_ids: list[ItemId] = field(default_factory=list)
    settled: list[tuple[ItemId, str]] = field(default_factory=list)
    # Every item this node re-scored, in the order it was drawn: its mean reward, and whether its rewards differ
    # (informative). The first J are what a trainer that keeps uniform peer groups unfiltered would train on, as
    # the paper's public trainer does; its logged batch mean averages them (engine/experiment/batch_mean.py).
    scored: list[tuple[float, bool]] = field(default_factory=list)


@dataclass
class TrainItem:
    """One sequence for the policy-gradient step."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    weights: list[float] | None = None  # per-token loss weight; None: every token weighs 1


EQUAL_REWARD_TOLERANCE = 1e-9
"""Rewards (in [0, 1]) closer than this count as equal: the group carries no signal."""


def rewards_differ(rewards: Sequence[float]) -> bool:
    """Whether a group carries any learning signal (see `group_advantages`)."""
    return bool(rewards) and max(rewards) - min(rewards) > EQUAL_REWARD_TOLERANCE


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


PASS_REWARD = 1.0  # an answer scored at least this passed: full marks (held-out accuracy counts the same)


def teaches(informative: bool, passed: bool, train_on: str) -> bool:
    """Whether a group is trained on under grpo.train_on: its answers differ, and with 'passed' one of them passed.
    The one rule for the round, the curriculum's windows and the re-ask frontier."""
    return informative and (train_on == "informative" or passed)


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
