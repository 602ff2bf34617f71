"""Re-asking the questions that taught: a node's frontier of its own recent informative questions.

GRPO learns only from a group whose answers score differently, and the
bundled model answers most questions all right or all wrong: a fresh
question is seldom mixed, whatever its difficulty level (engine/questions/curriculum.py).
A question whose group *was* mixed sits at the edge of what the model can
do, so it is worth asking again. With `tasks.reask_share` above 0 a node
keeps a frontier of such questions and fills up to that share of each
round's B questions by asking them again, oldest first; the rest of the
round is drawn fresh as before. GRESO (arXiv 2506.02177) skips questions
whose history says they will not teach; this keeps the ones whose history
says they did.

- A fresh own group whose rewards differ joins the frontier (the newest
  `FRONTIER_SIZE` at most; the oldest leaves first when it is full).
- A re-asked question leaves it when its group comes back all-same, or once
  it has been re-asked `tasks.reask_max` times.
- Only refs are kept: a re-ask is rebuilt from its `TaskRef` exactly as a
  peer's question is (`TaskSet.rebuild`), so it is the same text and answer.
- Only this node's own training questions are admitted: a ref must carry the
  training seed, and the held-out set uses another (`EVAL_SEED_OFFSET`), so
  a held-out question can never be re-asked; a restored state with any other
  seed is refused.
- A re-ask is sampled with the round's seeds (`derive_seed(seed, round)` in
  engine/node/loop.py), so never with those of its first ask, which was an
  earlier round.

The state (each ref, how often it was re-asked, the round it was first
asked) is plain JSON, saved in each checkpoint and restored on resume: a
resumed node re-asks what a node that never stopped re-asks. Imports no
torch and no reasoning-gym.

Tests: .venv/bin/python -m pytest tests/engine/test_frontier.py -q
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.common.config import NodeConfig
from engine.common.errors import CheckpointError, TaskError
from engine.questions.scores import PASS_REWARD, teaches
from engine.questions.tasks import EVAL_SEED_OFFSET, Question, TaskRef

log = logging.getLogger(__name__)

STATE_VERSION = 1
FRONTIER_SIZE = 64
"""Most questions kept; a round adds at most B of them, and the oldest leave first."""


class Answered(Protocol):
    """What `Frontier.follow` reads of a round's group (engine/rollouts/groups.py's `Group`)."""

    @property
    def question(self) -> Question: ...

    @property
    def rewards(self) -> Sequence[float]: ...

    @property
    def informative(self) -> bool: ...


@dataclass
class Entry:
    ref: TaskRef
    first_round: int  # the round it was first asked
    asks: int = 0  # times re-asked so far


class Frontier:
    """A node's recent own questions whose groups were informative, oldest first."""

    def __init__(self, seed: int, reask_max: int, train_on: str = "informative") -> None:
        self.seed = seed  # the training seed: the only one a kept ref may carry
        self.reask_max = reask_max
        self.train_on = train_on  # grpo.train_on: a group that is not trained on did not teach
        self.entries: list[Entry] = []

    def __len__(self) -> int:
        return len(self.entries)

    def keys(self) -> set[str]:
        return {e.ref.key() for e in self.entries}

    def pick(self, n: int, enabled: Collection[str] | None = None) -> list[TaskRef]:
        """The refs to re-ask this round: up to n, oldest first, of the `enabled` specialties (None: any)."""
        return [e.ref for e in self.entries
                if e.asks < self.reask_max and (enabled is None or e.ref.dataset in enabled)][: max(0, n)]

    def follow(self, round_index: int, groups: Sequence[Answered]) -> dict[str, int]:
        """Take a round's own groups: re-asks (refs in the frontier) stay while they teach and have asks left,
        fresh informative ones join. Returns the round's metrics: `reasked`, `reasked_informative`, `frontier`."""
        kept = {e.ref.key(): e for e in self.entries}
        reasked = informative = 0
        for group in groups:
            ref, taught = group.question.ref, teaches(group.informative, max(group.rewards) >= PASS_REWARD,
                                                      self.train_on)
            entry = kept.get(ref.key())
            if entry is not None:
                reasked += 1
                entry.asks += 1
                if taught:
                    informative += 1
                if not taught or entry.asks >= self.reask_max:
                    del kept[ref.key()]
            elif taught and self.admissible(ref):
                kept[ref.key()] = Entry(ref, round_index)
        self.entries = sorted(kept.values(), key=lambda e: e.first_round)[-FRONTIER_SIZE:]
        return {"reasked": reasked, "reasked_informative": informative, "frontier": len(self.entries)}

    def admissible(self, ref: TaskRef) -> bool:
        """A training question of this node: its seed, which is never the held-out set's."""
        return ref.seed == self.seed and ref.seed != self.seed + EVAL_SEED_OFFSET

    def to_state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION,
                "entries": [{"ref": e.ref.to_json(), "first_round": e.first_round, "asks": e.asks}
                            for e in self.entries]}

    @classmethod
    def from_state(cls, state: object, seed: int, reask_max: int, train_on: str = "informative") -> Frontier:
        """The frontier a checkpoint saved; anything malformed, or a ref of another seed, raises CheckpointError."""
        frontier = cls(seed, reask_max, train_on)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise CheckpointError("The checkpoint's re-ask frontier is missing or of another version.")
        try:
            for item in state["entries"]:
                entry = Entry(TaskRef.from_json(item["ref"]), _whole(item["first_round"]), _whole(item["asks"]))
                if not frontier.admissible(entry.ref):
                    raise ValueError(f"a question of seed {entry.ref.seed}, not this node's training seed")
                frontier.entries.append(entry)
        except (TypeError, ValueError, KeyError, TaskError) as exc:
            raise CheckpointError(f"The checkpoint's re-ask frontier is malformed ({exc}).") from exc
        return frontier


def frontier_for(config: NodeConfig, seed: int, state: object = None) -> Frontier | None:
    """The node's frontier when tasks.reask_share is above 0 (None: off), keeping the groups grpo.train_on
    trains on, from a checkpoint's `state` when it has one. A state that cannot be read is a warning, and the
    frontier starts empty."""
    tasks, train_on = config.tasks, config.grpo.train_on
    if tasks.reask_share <= 0:
        return None
    if state is not None:
        try:
            return Frontier.from_state(state, seed, tasks.reask_max, train_on)
        except CheckpointError as exc:
            log.warning("%s Re-asks start again from an empty frontier.", exc)
    return Frontier(seed, tasks.reask_max, train_on)


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a whole number")
    return value
