"""What a question's scores say: an answer passed, a group's answers differ, a group teaches.

Rewards are in [0, 1], computed by a question's own verifier (engine/questions/tasks.py).
These rules read them the same way everywhere: the round's choice of what it trains on
(engine/rollouts/groups.py `trained_groups`), the curriculum's windows, the re-ask
frontier and a peer's offered item. Plain functions of numbers: no torch, no reasoning-gym.
"""

from __future__ import annotations

from collections.abc import Sequence

EQUAL_REWARD_TOLERANCE = 1e-9
"""Rewards (in [0, 1]) closer than this count as equal: the group carries no signal."""


def rewards_differ(rewards: Sequence[float]) -> bool:
    """Whether a group carries any learning signal: all-equal rewards give all-zero advantages
    (engine/rollouts/groups.py, `group_advantages`)."""
    return bool(rewards) and max(rewards) - min(rewards) > EQUAL_REWARD_TOLERANCE


PASS_REWARD = 1.0  # an answer scored at least this passed: full marks (held-out accuracy counts the same)


def teaches(informative: bool, passed: bool, train_on: str) -> bool:
    """Whether a group is trained on under grpo.train_on: its answers differ, and with 'passed' one of them passed.
    The one rule for the round, the curriculum's windows and the re-ask frontier."""
    return informative and (train_on == "informative" or passed)
