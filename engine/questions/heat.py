"""A sampling temperature that follows the model (tasks.adaptive_temperature).

GRPO learns only from a group whose answers score differently. As a node
trains, its policy sharpens: the bundled model at round 20 gives the same
answer to a question eight times over far more often than it did at round 1
(docs/results.md "Learning": groups whose answers all scored the same and
above 0 rose from 7% of own groups in rounds 1-10 to 35% in rounds 31-40).
Such a group teaches nothing, right or wrong. A hotter sampler spreads the
answers again; on the untrained model it only spoils them (bench/temperature.py
measured both). So the temperature cannot be one number: it has to follow
the model, as POLARIS raises its sampling temperature between training
stages to keep the rollouts diverse.

The rule. A node keeps its last `WINDOW_GROUPS` own fresh groups, each marked
collapsed when every answer scored the same and above 0 (the same answer,
or equally good ones). After each round, when more than `HIGH` of the window
collapsed, the temperature rises by `STEP`, up to tasks.temperature_max; when
fewer than `LOW` did, it falls by `STEP`, down to tasks.temperature (where a
node starts). Groups where every answer scored 0 do not move it: a question
too hard for the model fails at any temperature, and heat that spoils
answers shows as fewer collapsed groups, which brings it down again. At
most one step a round; the window needs `MIN_GROUPS` groups first.

A node samples and trains at its current temperature (the GRPO ratio is of
the tempered policy, as in sampling). It judges peers' text at
tasks.temperature against the fixed floor, never at its own: judged at 1.3
with the floor under its own hot text, no poisoned answer was caught
(bench/temperature.py --judge same). Above `SHARE_MAX` it keeps its own
groups out of the swarm, where peers would refuse them. The state (temperature and window) is plain JSON, saved in each
checkpoint and restored on resume. Imports no torch.

Tests: .venv/bin/python -m pytest tests/engine/test_heat.py -q
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from engine.common.config import TaskConfig
from engine.common.errors import CheckpointError

log = logging.getLogger(__name__)

STATE_VERSION = 1
WINDOW_GROUPS = 24
"""Own groups the rule looks back on: three default rounds."""
MIN_GROUPS = 8
HIGH = 0.125
"""Above this share of collapsed groups the temperature rises (3 of 24)."""
LOW = 0.05
"""Below this share it falls (1 of 24 at most)."""
STEP = 0.05
SHARE_MAX = 1.0
"""Above this a node publishes nothing. Peers judge swarm text at tasks.temperature (0.7 by default), and a
trained node's honest groups sampled at 1.3 read as implausible there 67% of the time, 4% at 1.0 (0% at 0.7;
bench/temperature.py --judge first): a node sampling hotter would be struck and banned for honest text."""


def collapsed(rewards: Sequence[float]) -> bool:
    """Every answer scored the same, and above 0."""
    return bool(rewards) and len(set(rewards)) == 1 and rewards[0] > 0


class Heat:
    """One node's sampling temperature, between `low` (tasks.temperature) and `high` (tasks.temperature_max)."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high
        self.temperature = low
        self.window: deque[bool] = deque(maxlen=WINDOW_GROUPS)
        self.held_back = False  # own groups kept out of the swarm (above SHARE_MAX)

    def collapsed_share(self) -> float | None:
        return sum(self.window) / len(self.window) if len(self.window) >= MIN_GROUPS else None

    def follow(self, group_rewards: Iterable[Sequence[float]]) -> dict[str, Any]:
        """Take a round's own fresh groups; move the temperature at most one step. Returns the round's metrics."""
        self.window.extend(collapsed(r) for r in group_rewards)
        share, old = self.collapsed_share(), self.temperature
        if share is not None and share > HIGH:
            self.temperature = min(self.high, round(old + STEP, 4))
        elif share is not None and share < LOW:
            self.temperature = max(self.low, round(old - STEP, 4))
        if self.temperature != old:
            log.info("Sampling temperature %.2f -> %.2f: %d of the last %d own groups gave every answer the same "
                     "score above 0.", old, self.temperature, sum(self.window), len(self.window))
        return {"temperature": old, "temperature_next": self.temperature,
                **({"collapsed_share": round(share, 4)} if share is not None else {})}

    def shares(self) -> bool:
        """Whether the node's own groups go to the swarm: not when heat took the temperature above SHARE_MAX
        (logged when that changes). A node configured to start hotter shares at its start, as without heat."""
        held = self.temperature > max(SHARE_MAX, self.low)
        if held != self.held_back:
            self.held_back = held
            log.info("Sampling at %.2f: %s.", self.temperature,
                     f"this node's answers stay out of the swarm above {SHARE_MAX:.2f} (peers would refuse them)"
                     if held else "this node's answers go to the swarm again")
        return not held

    def to_state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "temperature": self.temperature, "window": [int(x) for x in self.window]}

    @classmethod
    def from_state(cls, state: object, low: float, high: float) -> Heat:
        """A node's heat from its checkpoint's state (None: a fresh start), held within the current bounds."""
        heat = cls(low, high)
        if state is None:
            return heat
        if (not isinstance(state, dict) or state.get("version") != STATE_VERSION
                or isinstance(state.get("temperature"), bool)
                or not isinstance(state.get("temperature"), (int, float))
                or not isinstance(state.get("window"), list)
                or any(x not in (0, 1) or isinstance(x, float) for x in state["window"])):
            raise CheckpointError("The checkpoint's sampling temperature state is damaged; start the run again or "
                                  "resume from an earlier checkpoint.")
        heat.temperature = min(high, max(low, float(state["temperature"])))
        heat.window.extend(bool(x) for x in state["window"][-WINDOW_GROUPS:])
        return heat


def heat_for(tasks: TaskConfig, state: object = None) -> Heat | None:
    """The node's Heat with tasks.adaptive_temperature on (resumed from a checkpoint's `state` when it has one),
    else None: a fixed temperature. A state that cannot be read is a warning, and the temperature starts again
    at tasks.temperature."""
    if not tasks.adaptive_temperature:
        return None
    try:
        return Heat.from_state(state, tasks.temperature, tasks.temperature_max)
    except CheckpointError as exc:
        log.warning("%s The sampling temperature starts again at %.2f.", exc, tasks.temperature)
        return Heat(tasks.temperature, tasks.temperature_max)
