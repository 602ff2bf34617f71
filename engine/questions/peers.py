"""Asking the questions that taught a peer: a lever only a swarm has (`swarm.peer_questions`).

SAPO gives a node other nodes' answers to other questions. A swarm can also
give it their questions: a peer's group whose answers scored differently sat
at the edge of what that peer's model can do, and nodes of one swarm train the
same base model, so the question is likely to sit at this node's edge too. In
the swarm runs' records a question that was informative for one node was
informative for another that drew it 58.9% [53.6, 64.0] of the time, against
42.5% for a node's own fresh questions (docs/swarm.md, "Headroom of the
swarm-only levers"; `python -m bench.lever_headroom`).

With `swarm.peer_questions` above 0, each round the node asks for that many
of the swarm's groups as questions only (`RolloutExchange.questions`): each is
verified as any swarm item is (signature, the question rebuilt from its
reference, every answer re-scored here, a group whose answers all scored the
same refused), and only its question is kept. In a later round up to
`swarm.peer_questions` of the round's B questions are these, newest first;
the node writes its own G answers to them, so they are on-policy own groups
(nothing of the peer's text is trained on, and the exchange counts them as not
picked, never as used).

- A question whose text is one of this node's held-out questions is never
  kept (`held_out`), whichever seed it came from.
- A question this node asked in the last rounds is not kept twice (by its
  reference's key).
- At most `POOL_SIZE` are kept; the oldest leave first, and each is asked
  once.

The pool (each question's reference and the round it arrived) is plain JSON,
saved in each checkpoint and restored on resume. Imports no torch and no
reasoning-gym.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from engine.common.config import NodeConfig
from engine.common.errors import CheckpointError, TaskError
from engine.questions.tasks import Question, TaskRef

log = logging.getLogger(__name__)

STATE_VERSION = 1
POOL_SIZE = 32
"""Most peers' questions kept; a round adds at most B and asks at most B of them."""


@dataclass
class Waiting:
    ref: TaskRef
    arrived: int  # the round in which it was taken from the swarm


class PeerQuestions:
    """The peers' teaching questions this node has not asked yet, newest last."""

    def __init__(self) -> None:
        self.waiting: list[Waiting] = []
        self.asked: list[str] = []  # keys of the questions asked lately (the newest POOL_SIZE): never kept again

    def __len__(self) -> int:
        return len(self.waiting)

    def offer(self, round_index: int, questions: Iterable[Question], held_out: Collection[str]) -> int:
        """Keep the swarm's questions of this round that are not held-out questions and not kept or asked
        already; returns how many were kept."""
        known = {w.ref.key() for w in self.waiting} | set(self.asked)
        kept = 0
        for question in questions:
            key = question.ref.key()
            if question.text in held_out or key in known:
                continue
            known.add(key)
            self.waiting.append(Waiting(question.ref, round_index))
            kept += 1
        self.waiting = self.waiting[-POOL_SIZE:]
        return kept

    def take(self, n: int, enabled: Collection[str] | None = None) -> list[TaskRef]:
        """Up to n questions to ask this round, newest first, of the `enabled` specialties (None: any); each
        leaves the pool."""
        picked = [w for w in reversed(self.waiting) if enabled is None or w.ref.dataset in enabled][: max(0, n)]
        keys = {w.ref.key() for w in picked}
        self.waiting = [w for w in self.waiting if w.ref.key() not in keys]
        self.asked = (self.asked + [w.ref.key() for w in picked])[-POOL_SIZE:]
        return [w.ref for w in picked]

    def to_state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "asked": list(self.asked),
                "waiting": [{"ref": w.ref.to_json(), "arrived": w.arrived} for w in self.waiting]}

    @classmethod
    def from_state(cls, state: object) -> PeerQuestions:
        """The pool a checkpoint saved; anything malformed raises CheckpointError."""
        pool = cls()
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise CheckpointError("The checkpoint's peers' questions are missing or of another version.")
        try:
            pool.asked = [str(key) for key in state["asked"]]
            for item in state["waiting"]:
                arrived = item["arrived"]
                if isinstance(arrived, bool) or not isinstance(arrived, int) or arrived < 0:
                    raise ValueError(f"{arrived!r} is not a round")
                pool.waiting.append(Waiting(TaskRef.from_json(item["ref"]), arrived))
        except (TypeError, ValueError, KeyError, TaskError) as exc:
            raise CheckpointError(f"The checkpoint's peers' questions are malformed ({exc}).") from exc
        return pool


def peer_questions_for(config: NodeConfig, state: object = None) -> PeerQuestions | None:
    """The node's pool when swarm.peer_questions is above 0 and it is in a swarm (None: off), from a
    checkpoint's `state` when it has one; a state that cannot be read is a warning, and the pool starts empty."""
    sw = config.swarm
    if sw.peer_questions <= 0 or sw.mode == "solo" or sw.external_groups == 0:
        return None
    if state is not None:
        try:
            return PeerQuestions.from_state(state)
        except CheckpointError as exc:
            log.warning("%s Peers' questions start again from an empty pool.", exc)
    return PeerQuestions()


def wanted(config: NodeConfig) -> int:
    """How many of a round's B questions may be peers' (swarm.peer_questions of B, rounded)."""
    return int(round(config.swarm.peer_questions * config.tasks.questions_per_round, 6))
