"""What peers offer a round: items that passed every text check, and why the others were refused.

Plain data, shared by the swarm's exchange (engine/swarm/exchange.py), which
fills an `Offer`, and the round loop (engine/node/loop.py), which judges it.
An `ExternalItem` is text only, never tokens: those are the receiving node's
business. The `R_*` reasons are the keys of `rejected_by_reason` in metrics
and events.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.questions.scores import rewards_differ

if TYPE_CHECKING:
    from engine.questions.tasks import Question


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
R_IMPLAUSIBLE = "implausible"  # correct text this node's own model finds improbable: injected (engine/swarm/defence.py)
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

    @property
    def informative(self) -> bool:
        """Whether its rewards differ (`rewards_differ`): only then does its group carry a gradient."""
        return rewards_differ(self.rewards)

    def content_key(self) -> str:
        """The same text under any sequence number: the question's reference and the completions."""
        blob = json.dumps([self.question.ref.key(), list(self.completions)], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:32]


NOT_PICKED = "not_picked"  # an item verified or received but not trained on: what its receipt says


@dataclass
class Offer:
    """What `sample` found this round: verified items, and how every other item was counted."""

    items: list[ExternalItem] = field(default_factory=list)
    received: int = 0
    round_index: int = 0  # the round it was drawn in: what the replay memory remembers its items by
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (peer, reason), one per item
    not_picked: list[str] = field(default_factory=list)  # peer of each item left unverified past n
    connected: bool = False
    # In a swarm of different models, the items (index into `items`) judged against their sender's own
    # past rather than this node's model, each with that sender's baseline values so far
    # (engine/swarm/defence.py, `sender_verdict`); the loop fills in the statistic and who is on probation.
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

    def set_aside(self, keep: int) -> list[ExternalItem]:
        """Keep the first `keep` verified items to be judged and trained on; the others leave the offer, counted
        and receipted as not picked (never as used: nothing of their text is learned), and are returned (their
        questions asked again by this node: engine/questions/peers.py)."""
        aside, self.items = self.items[keep:], self.items[:keep]
        ids, self.item_ids = self.item_ids[keep:], self.item_ids[:keep]
        self.not_picked.extend(item.peer for item in aside)
        self.settled.extend((item_id, NOT_PICKED) for item_id in ids)
        for index in [i for i in self.baselines if i >= keep]:
            del self.baselines[index]
        return aside
