"""Difficulty that follows the model: a level per specialty, weights where the signal is, and kinds that do not
teach skipped.

GRPO learns only from a group whose answers score differently. With
`tasks.difficulty = "adaptive"` a node keeps, per specialty, a level on a
ladder of configs (`LADDERS`) and moves it to hold the specialty's pass rate
(answers that score 1.0) inside `PASS_BAND`, measured over the last
`WINDOW_GROUPS` of its own groups at that level: below the band it goes down
a level, above it up. The draw's weights follow where the signal is: the
configured weight times the share of the window's groups that were
informative (a Beta(1, 1) posterior mean, so an untried level starts at
one half), times a skip factor, with a floor that keeps every specialty in
the mix. The skip factor is GRESO's idea (arXiv 2506.02177: predict
zero-advantage prompts from their reward history and skip them before
generation) applied to kinds, a specialty at a level, because a node draws
fresh questions every round and has no history per question: a kind whose
groups were all-same for `streak` consecutive rounds keeps
`keep_probability(streak)` of its weight, which halves with each such round
and never reaches zero, and one informative group resets it.

Level 0 of every ladder is today's default config (`DEFAULT_DATASET_CONFIGS`),
so the held-out set (`TaskSet.eval_set`) stays at level 0 and `harder_configs`
gives the fixed set one level up. The levels above 0 follow reasoning-gym's
own curriculum for the specialty (the attributes it moves, its level values,
ranges widened upward as its default INCLUSIVE context does), capped at the
build-time limits of `engine.task_configs`. Most defaults already lie below
reasoning-gym's level 0 (base_conversion asks for values of 1000 or more
there), so the levels below 0 are this module's own, smaller steps of the
same attributes, where a step below the default exists.

A level changes the config a `TaskRef` carries, so a peer rebuilds exactly
the question, whatever its own level. The state (levels, windows, streaks)
is plain JSON, saved in each checkpoint and restored on resume: a resumed
node draws what a node that never stopped draws. Imports no torch and no
reasoning-gym.

Tests: .venv/bin/python -m pytest tests/engine/test_curriculum.py -q
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from engine.common.config import TaskConfig
from engine.common.errors import CheckpointError
from engine.rollouts import rewards_differ
from engine.task_configs import DEFAULT_DATASET_CONFIGS

log = logging.getLogger(__name__)

STATE_VERSION = 1

PASS_BAND = (0.2, 0.8)
"""A level moves when the window's pass rate leaves this band (strictly). With G = 8 answers
a question all of whose answers pass with probability p gives an all-same group with
probability p^8 + (1-p)^8: 17% at p = 0.2 or 0.8, 43% at 0.1, 66% at 0.05."""
WINDOW_GROUPS = 4
"""The window: the specialty's last 4 own groups at its level (32 answers at G = 8)."""
MIN_GROUPS = 2
"""A level moves only on a window of at least 2 groups; a level change empties the window."""
FLOOR = 0.25
"""Every enabled specialty keeps at least this fraction of a uniform share of the draw: 2.8%
of nine, a little above the 2.2% that the hand-tuned DEFAULT_WEIGHTS give their smallest."""
KEEP_DECAY = 0.5
KEEP_MIN = 0.125
"""A kind all-same for `streak` rounds keeps max(KEEP_MIN, KEEP_DECAY ** streak) of its weight."""
PASS_REWARD = 1.0


def _rungs(*rungs: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    return tuple(MappingProxyType(dict(rung)) for rung in rungs)


@dataclass(frozen=True)
class Ladder:
    """A specialty's levels: config overrides on its default, easiest first; level 0 is the default."""

    below: tuple[Mapping[str, Any], ...]  # levels -len(below) .. -1
    above: tuple[Mapping[str, Any], ...]  # levels 1 .. len(above)

    @property
    def lowest(self) -> int:
        return -len(self.below)

    @property
    def highest(self) -> int:
        return len(self.above)

    def overrides(self, level: int) -> Mapping[str, Any]:
        if not self.lowest <= level <= self.highest:
            raise ValueError(f"level {level} is outside {self.lowest}..{self.highest}")
        if level < 0:
            return self.below[len(self.below) + level]
        return self.above[level - 1] if level > 0 else MappingProxyType({})


_CALENDAR_DEFAULT = ("is_leap_year", "weekday_offset", "weekday_of_date")

# One rung per line: what it sets, and (in words) where reasoning-gym's curriculum has it.
LADDERS: Mapping[str, Ladder] = MappingProxyType({
    "base_conversion": Ladder(
        below=_rungs({"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 8},
                     {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 16}),
        above=_rungs({"min_base": 2, "max_base": 16, "min_value": 1, "max_value": 255},
                     {"min_base": 2, "max_base": 16, "min_value": 1, "max_value": 1000},
                     {"min_base": 2, "max_base": 18, "min_value": 1, "max_value": 10_000},  # rg level 1's bases
                     {"min_base": 2, "max_base": 27, "min_value": 1, "max_value": 100_000},  # rg level 2's bases
                     {"min_base": 2, "max_base": 36, "min_value": 1, "max_value": 1_000_000}),  # rg's top
    ),
    # The default is rg's level 0; its level 4 (6 terms, 4 digits) is beyond the build-time caps.
    "basic_arithmetic": Ladder(
        below=(),
        above=_rungs({"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
                     {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 3},
                     {"min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 3}),
    ),
    # rg requires min_size >= 8: no smaller grid exists.
    "arc_1d": Ladder(
        below=(),
        above=_rungs({"min_size": 8, "max_size": 25}, {"min_size": 8, "max_size": 50},
                     {"min_size": 8, "max_size": 100}),
    ),
    # Difficulty 3 takes about 2 s per item to build, beyond the caps.
    "bf": Ladder(below=(), above=_rungs({"difficulty": 2})),
    "propositional_logic": Ladder(
        below=_rungs({"min_complexity": 1, "max_complexity": 1}),  # rg level 0
        above=_rungs(
            {"min_vars": 2, "max_vars": 4, "min_statements": 2, "max_statements": 4},  # rg level 1
            {"min_vars": 2, "max_vars": 6, "min_statements": 2, "max_statements": 6, "max_complexity": 3},  # rg level 2
            {"min_vars": 2, "max_vars": 8, "min_statements": 2, "max_statements": 8, "max_complexity": 4},  # rg level 3
        ),
    ),
    "fraction_simplification": Ladder(
        below=_rungs({"min_value": 1, "max_value": 5, "min_factor": 2, "max_factor": 3}),
        above=_rungs({"min_value": 1, "max_value": 100, "min_factor": 2, "max_factor": 10},  # rg level 0
                     {"min_value": 1, "max_value": 1000, "min_factor": 2, "max_factor": 100},
                     {"min_value": 1, "max_value": 10_000, "min_factor": 2, "max_factor": 1000}),
    ),
    # One decimal place and two terms are the smallest the rules allow.
    "decimal_arithmetic": Ladder(
        below=(),
        above=_rungs(
            {"min_num_decimal_places": 1, "max_num_decimal_places": 2},
            {"min_num_decimal_places": 2, "max_num_decimal_places": 4},  # rg level 0
            {"min_num_decimal_places": 2, "max_num_decimal_places": 6, "max_terms": 5, "precision": 8},
            {"min_num_decimal_places": 2, "max_num_decimal_places": 8, "max_terms": 8, "precision": 10},
        ),
    ),
    # rg's level 0 asks only weekday_of_date, a seven-way answer, instead of adding the yes/no of
    # is_leap_year: not an easier level for a small model, so none is below the default.
    "calendar_arithmetic": Ladder(
        below=(),
        above=_rungs(
            {"offset_upper_bound": 100},
            {"tasks": (*_CALENDAR_DEFAULT, "count_days", "count_business_days"), "offset_upper_bound": 250},
            {"tasks": (*_CALENDAR_DEFAULT, "count_days", "count_business_days", "weekday_of_date_from_first_date",
                       "recurring_event_day"), "offset_upper_bound": 365},
        ),
    ),
    "binary_matrix": Ladder(
        below=_rungs({"min_n": 1, "max_n": 2}, {"min_n": 2, "max_n": 2}),
        above=_rungs({"min_n": 2, "max_n": 5},
                     {"min_n": 2, "max_n": 10},  # rg level 0's size
                     {"min_n": 2, "max_n": 25, "p_zero": 0.25}),  # rg level 1
    ),
})


def level_config(specialty: str, level: int) -> dict[str, Any]:
    """The full reasoning-gym config of `specialty` at `level` (level 0: DEFAULT_DATASET_CONFIGS)."""
    return {**DEFAULT_DATASET_CONFIGS[specialty], **LADDERS[specialty].overrides(level)}


def pinned_specialties(tasks: TaskConfig) -> set[str]:
    """Specialties with a config of the user's own (tasks.dataset_configs): their difficulty is left alone."""
    return {name for name, options in tasks.dataset_configs.items() if options}


def harder_configs(tasks: TaskConfig, specialties: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Level-1 configs for the second held-out set; a pinned specialty keeps its own config."""
    pinned = pinned_specialties(tasks)
    return {name: level_config(name, 1) for name in specialties if name not in pinned}


def curriculum_for(tasks: TaskConfig, specialties: Sequence[str], state: object = None) -> Curriculum | None:
    """The node's curriculum with tasks.difficulty = 'adaptive' (None: 'fixed'), from a checkpoint's `state`
    when it has one. A state that cannot be read is a warning, and every level starts again at 0."""
    if tasks.difficulty != "adaptive":
        return None
    pinned = pinned_specialties(tasks)
    if state is not None:
        try:
            return Curriculum.from_state(state, specialties, pinned)
        except CheckpointError as exc:
            log.warning("%s Every specialty starts again at level 0.", exc)
    return Curriculum(specialties, pinned)


def keep_probability(streak: int) -> float:
    """The share of its weight a kind keeps after `streak` consecutive all-same rounds: never zero."""
    return max(KEEP_MIN, KEEP_DECAY ** streak)


def floored_shares(raw: Mapping[str, float], floor: float) -> dict[str, float]:
    """Positive `raw` weights as shares summing to 1, none below `floor` / len(raw) (taken pro rata from the rest)."""
    least = floor / len(raw)
    fixed: set[str] = set()
    while True:
        free = {name: w for name, w in raw.items() if name not in fixed}
        mass = 1.0 - least * len(fixed)
        total = sum(free.values())
        shares = {name: mass * w / total for name, w in free.items()}
        low = {name for name, share in shares.items() if share < least}
        if not low:
            return {name: shares.get(name, least) for name in raw}
        fixed |= low


@dataclass
class GroupStats:
    """One own group, as the window keeps it."""

    passes: int
    answers: int
    informative: bool

    @classmethod
    def of(cls, rewards: Sequence[float]) -> GroupStats:
        return cls(sum(1 for r in rewards if r >= PASS_REWARD), len(rewards), rewards_differ(rewards))

    def to_json(self) -> list[int]:
        return [self.passes, self.answers, int(self.informative)]


@dataclass(frozen=True)
class LevelChange:
    specialty: str
    old: int
    new: int
    pass_rate: float
    answers: int


class Curriculum:
    """A node's levels, windows and skip streaks; `plan` gives the next draw, `observe` takes a round's groups.

    `pinned` specialties (a config of the user's own in tasks.dataset_configs)
    keep level 0, which is that config; their weight still follows the signal.
    """

    def __init__(self, specialties: Sequence[str], pinned: Set[str] = frozenset()) -> None:
        self.specialties = tuple(specialties)
        self.pinned = frozenset(pinned) & set(self.specialties)
        self.levels = dict.fromkeys(self.specialties, 0)
        self.windows: dict[str, deque[GroupStats]] = {name: deque(maxlen=WINDOW_GROUPS) for name in self.specialties}
        self.streaks: dict[tuple[str, int], int] = {}

    # -- the next draw ------------------------------------------------------------------
    def plan(self, priors: Mapping[str, float]) -> dict[str, Any]:
        """`TaskSet.draw`'s keyword arguments for the next round: weights and configs."""
        return {"weights": self.weights(priors), "configs": self.configs()}

    def configs(self) -> dict[str, dict[str, Any]]:
        """Each unpinned specialty's config at its level (pinned ones draw with the task set's own)."""
        return {name: level_config(name, self.levels[name]) for name in self.specialties if name not in self.pinned}

    def signal(self, specialty: str) -> float:
        """The posterior mean share of informative groups at the current level (Beta(1, 1) prior)."""
        window = self.windows[specialty]
        return (sum(1 for g in window if g.informative) + 1) / (len(window) + 2)

    def weights(self, priors: Mapping[str, float]) -> dict[str, float]:
        """Draw shares: prior x signal x keep probability, floored at FLOOR of a uniform share."""
        raw = {
            name: priors[name] * self.signal(name) * keep_probability(self.streaks.get((name, self.levels[name]), 0))
            for name in self.specialties
        }
        return floored_shares(raw, FLOOR)

    def pass_rate(self, specialty: str) -> float | None:
        answers = sum(g.answers for g in self.windows[specialty])
        return sum(g.passes for g in self.windows[specialty]) / answers if answers else None

    # -- learning from a round ----------------------------------------------------------
    def follow(self, results: Iterable[tuple[str, Sequence[float]]], priors: Mapping[str, float]) -> dict[str, Any]:
        """`observe`, log each level change (one line), and return the round's metrics of it:
        `curriculum` (per specialty: level, pass rate, draw share) and `level_changes`."""
        changes = self.observe(results)
        for c in changes:
            log.info("Curriculum: %s level %+d -> %+d (pass rate %.0f%% over its last %d answers).",
                     c.specialty, c.old, c.new, 100 * c.pass_rate, c.answers)
        return {
            "curriculum": self.report(priors),
            "level_changes": [{"specialty": c.specialty, "old": c.old, "new": c.new, "pass_rate": c.pass_rate}
                              for c in changes],
        }

    def observe(self, results: Iterable[tuple[str, Sequence[float]]]) -> list[LevelChange]:
        """Take a round's own groups as (specialty, rewards); move levels that left the band."""
        seen: dict[str, list[GroupStats]] = {}
        for specialty, rewards in results:
            if specialty in self.windows and rewards:
                seen.setdefault(specialty, []).append(GroupStats.of(rewards))
        changes = []
        for specialty, stats in seen.items():
            self._count_streak(specialty, stats)
            self.windows[specialty].extend(stats)
            change = self._move(specialty)
            if change is not None:
                changes.append(change)
        return changes

    def _count_streak(self, specialty: str, stats: Sequence[GroupStats]) -> None:
        kind = (specialty, self.levels[specialty])
        if any(g.informative for g in stats):
            self.streaks.pop(kind, None)
        else:
            self.streaks[kind] = self.streaks.get(kind, 0) + 1

    def _move(self, specialty: str) -> LevelChange | None:
        window = self.windows[specialty]
        rate = self.pass_rate(specialty)
        if specialty in self.pinned or len(window) < MIN_GROUPS or rate is None:
            return None
        ladder, old = LADDERS[specialty], self.levels[specialty]
        new = old - 1 if rate < PASS_BAND[0] else old + 1 if rate > PASS_BAND[1] else old
        if new == old or not ladder.lowest <= new <= ladder.highest:
            return None
        self.levels[specialty] = new
        answers = sum(g.answers for g in window)
        window.clear()
        return LevelChange(specialty, old, new, rate, answers)

    # -- reports and state --------------------------------------------------------------
    def report(self, priors: Mapping[str, float]) -> dict[str, dict[str, Any]]:
        """Per specialty, for the round's metrics: level, pass rate over the window (None when empty), draw share."""
        shares = self.weights(priors)
        return {
            name: {"level": self.levels[name], "pass_rate": self.pass_rate(name), "weight": shares[name]}
            for name in self.specialties
        }

    def to_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "levels": dict(self.levels),
            "windows": {name: [g.to_json() for g in window] for name, window in self.windows.items()},
            "streaks": [[name, level, streak] for (name, level), streak in sorted(self.streaks.items())],
        }

    @classmethod
    def from_state(cls, state: object, specialties: Sequence[str], pinned: Set[str] = frozenset()) -> Curriculum:
        """The curriculum a checkpoint saved; specialties it does not know start fresh, ones it knows and
        that are no longer enabled are dropped. Anything malformed raises CheckpointError."""
        curriculum = cls(specialties, pinned)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise CheckpointError("The checkpoint's curriculum state is missing or of another version.")
        try:
            curriculum._restore(state)
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"The checkpoint's curriculum state is malformed ({exc}).") from exc
        return curriculum

    def _restore(self, state: dict[str, Any]) -> None:
        for name, level in dict(state["levels"]).items():
            if name in self.levels and name not in self.pinned:
                LADDERS[name].overrides(_whole(level))  # raises ValueError outside the ladder
                self.levels[name] = level
        for name, groups in dict(state["windows"]).items():
            if name in self.windows:
                self.windows[name].extend(_group_stats(g) for g in groups)
        for name, level, streak in state["streaks"]:
            if name in self.levels:
                self.streaks[(str(name), _whole(level))] = _whole(streak)


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {value!r}")
    return value


def _group_stats(data: object) -> GroupStats:
    if not isinstance(data, list) or len(data) != 3:
        raise ValueError(f"a window entry must be [passes, answers, informative], got {data!r}")
    passes, answers, informative = (_whole(v) for v in data)
    if not 0 <= passes <= answers or informative not in (0, 1):
        raise ValueError(f"a window entry is out of range: {data!r}")
    return GroupStats(passes, answers, bool(informative))
