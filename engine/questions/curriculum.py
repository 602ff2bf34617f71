"""Difficulty that follows the model: a level per specialty, weights where the signal is, and kinds that do not
teach skipped.

GRPO learns only from a group whose answers score differently. With
`tasks.difficulty = "adaptive"` a node keeps, per specialty, a level on a
ladder of configs (`LADDERS`) and moves it on the last `WINDOW_GROUPS` of its
own groups at that level: down a level when more than half of them all
failed, up when more than half all passed, and only when that kind
outnumbers the other by two. A small model solves a question with every answer or with none, so
the pass rate said little: 50% was half the groups all-pass and half
all-fail, not informative groups. Going back up to a level that was left
downward needs a longer window (`RETURN_GROUPS`), so levels do not flap.
The draw's weights follow where the signal is: the configured weight times
the share of the window's groups that were informative (a Beta(1, 1)
posterior mean, so an untried level starts at one half), times a skip
factor, with a floor that keeps every live specialty in the mix. A
specialty that all failed `EXCLUDE_AFTER` groups in a row at its lowest
level (there is nothing easier to give it) is excluded: it keeps only
`EXCLUDED_SHARE` of a uniform share, enough to be retried now and then, and
any group of it that does not all fail brings it back. The skip factor is
GRESO's idea (arXiv 2506.02177: predict zero-advantage prompts from their
reward history and skip them before generation) applied to kinds, a
specialty at a level, because a node draws fresh questions every round and
has no history per question: a kind whose groups were all-same for `streak`
consecutive rounds keeps `keep_probability(streak)` of its weight, which
halves with each such round and never reaches zero, and one informative
group resets it.

"Informative", "all failed" and "taught" follow `grpo.train_on`: with
`passed` (the default) a group teaches only when its answers differ and one
of them is a pass, so a specialty whose groups differ by partial credit
alone (a fraction that echoes the question) counts as failing: its level
goes down and its weight does not grow on groups the node never trains on.

Level 0 of every ladder is today's default config (`DEFAULT_DATASET_CONFIGS`),
so the held-out set (`TaskSet.eval_set`) stays at level 0 and `harder_configs`
gives the fixed set one level up. The levels above 0 follow reasoning-gym's
own curriculum for the specialty (the attributes it moves, its level values,
ranges widened upward as its default INCLUSIVE context does), capped at the
build-time limits of `engine.questions.configs`. Most defaults already lie below
reasoning-gym's level 0 (base_conversion asks for values of 1000 or more
there), so the levels below 0 are this module's own, smaller steps of the
same attributes, where a step below the default exists.

A level changes the config a `TaskRef` carries, so a peer rebuilds exactly
the question, whatever its own level. The state (levels, windows, streaks,
levels left downward, all-fail runs) is plain JSON, saved in each checkpoint
and restored on resume: a resumed node draws what a node that never stopped
draws. Imports no torch and no
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

from engine.common.config import NodeConfig, TaskConfig
from engine.common.errors import CheckpointError
from engine.questions.configs import DEFAULT_DATASET_CONFIGS
from engine.questions.scores import PASS_REWARD, rewards_differ, teaches

log = logging.getLogger(__name__)

STATE_VERSION = 2
"""Version 2 moves levels on the window's all-pass and all-fail groups; version 1 (pass rate) is still read."""

MOVE_SHARE = 0.5
"""A level goes down when more than half its window's groups all failed, up when more than half all passed.
The bundled model's groups are mostly all-same (130 of 140 in the first pass's final windows): a question is
solved by every answer or by none, so a pass rate inside 20-80% still meant all-same groups."""
WINDOW_GROUPS = 8
"""The window: the specialty's last 8 own groups at its level; a level change empties it."""
MIN_GROUPS = 2
"""A level moves only on a window of at least 2 groups, and only when the all-fail (all-pass) groups outnumber the
all-pass (all-fail) ones by 2: an alternating signal holds the level."""
RETURN_GROUPS = (4, 8)
"""Going back up to a level that was left downward once needs a window of 4 groups, twice or more 8 (the
whole window): a level is not retried on two lucky groups, so levels stop flapping."""
FLOOR = 0.25
"""Every live specialty keeps at least this fraction of a uniform share of the draw: 2.8%
of nine, a little above the 2.2% that the hand-tuned DEFAULT_WEIGHTS give their smallest."""
EXCLUDE_AFTER = 8
"""A specialty whose last 8 own groups at its lowest level all failed (in rounds where every group of it all
failed) is excluded: it cannot go easier."""
EXCLUDED_SHARE = 0.1
"""An excluded specialty keeps this fraction of a uniform share (1.1% of nine): with 8 questions a round it is
retried about once in 11 rounds, and any group of it that does not all fail brings it back."""
KEEP_DECAY = 0.5
KEEP_MIN = 0.125
"""A kind all-same for `streak` rounds keeps max(KEEP_MIN, KEEP_DECAY ** streak) of its weight."""


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


def curriculum_for(config: NodeConfig, specialties: Sequence[str], state: object = None) -> Curriculum | None:
    """The node's curriculum with tasks.difficulty = 'adaptive' (None: 'fixed'), judging groups by
    grpo.train_on, from a checkpoint's `state` when it has one. A state that cannot be read is a warning, and
    every level starts again at 0."""
    if config.tasks.difficulty != "adaptive":
        return None
    pinned, train_on = pinned_specialties(config.tasks), config.grpo.train_on
    if state is not None:
        try:
            return Curriculum.from_state(state, specialties, pinned, train_on)
        except CheckpointError as exc:
            log.warning("%s Every specialty starts again at level 0.", exc)
    return Curriculum(specialties, pinned, train_on)


def keep_probability(streak: int) -> float:
    """The share of its weight a kind keeps after `streak` consecutive all-same rounds: never zero."""
    return max(KEEP_MIN, KEEP_DECAY ** streak)


def floored_shares(raw: Mapping[str, float], least: float, mass: float = 1.0) -> dict[str, float]:
    """Positive `raw` weights as shares summing to `mass`, none below `least` (taken pro rata from the rest)."""
    fixed: set[str] = set()
    while True:
        free = {name: w for name, w in raw.items() if name not in fixed}
        rest = mass - least * len(fixed)
        total = sum(free.values())
        shares = {name: rest * w / total for name, w in free.items()}
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

    @property
    def all_pass(self) -> bool:
        return self.passes == self.answers

    def teaches(self, train_on: str) -> bool:
        """Trained on under grpo.train_on: answers that differ, and with 'passed' one of them a pass."""
        return teaches(self.informative, self.passes > 0, train_on)

    def all_fail(self, train_on: str) -> bool:
        """No answer passed, and none taught: a partial credit that varies teaches only with 'informative'."""
        return self.passes == 0 and not self.teaches(train_on)

    def to_json(self) -> list[int]:
        return [self.passes, self.answers, int(self.informative)]


@dataclass(frozen=True)
class LevelChange:
    specialty: str
    old: int
    new: int
    pass_rate: float
    answers: int
    groups: int
    all_fail: int
    all_pass: int

    def describe(self) -> str:
        same, what = (self.all_fail, "all failed") if self.new < self.old else (self.all_pass, "all passed")
        return (f"{self.specialty} level {self.old:+d} -> {self.new:+d} ({same} of its last {self.groups} groups "
                f"{what}; pass rate {100 * self.pass_rate:.0f}%)")


class Curriculum:
    """A node's levels, windows, skip streaks and exclusions; `plan` gives the next draw, `observe` takes a
    round's groups.

    `pinned` specialties (a config of the user's own in tasks.dataset_configs)
    keep level 0, which is that config; their weight still follows the signal.
    """

    def __init__(self, specialties: Sequence[str], pinned: Set[str] = frozenset(),
                 train_on: str = "informative") -> None:
        self.specialties = tuple(specialties)
        self.train_on = train_on  # grpo.train_on: which groups count as teaching (a window keeps both facts)
        self.pinned = frozenset(pinned) & set(self.specialties)
        self.levels = dict.fromkeys(self.specialties, 0)
        self.windows: dict[str, deque[GroupStats]] = {name: deque(maxlen=WINDOW_GROUPS) for name in self.specialties}
        self.streaks: dict[tuple[str, int], int] = {}
        self.left_down: dict[tuple[str, int], int] = {}  # (specialty, level): times that level was left downward
        self.failing: dict[str, int] = {}  # all-fail groups in a row at the specialty's lowest level

    # -- the next draw ------------------------------------------------------------------
    def plan(self, priors: Mapping[str, float]) -> dict[str, Any]:
        """`TaskSet.draw`'s keyword arguments for the next round: weights and configs."""
        return {"weights": self.weights(priors), "configs": self.configs()}

    def configs(self) -> dict[str, dict[str, Any]]:
        """Each unpinned specialty's config at its level (pinned ones draw with the task set's own)."""
        return {name: level_config(name, self.levels[name]) for name in self.specialties if name not in self.pinned}

    def signal(self, specialty: str) -> float:
        """The posterior mean share of teaching groups at the current level (Beta(1, 1) prior)."""
        window = self.windows[specialty]
        return (sum(1 for g in window if g.teaches(self.train_on)) + 1) / (len(window) + 2)

    def excluded(self, specialty: str) -> bool:
        """All-fail for EXCLUDE_AFTER groups in a row at its lowest level: drawn only to retry it."""
        return self.failing.get(specialty, 0) >= EXCLUDE_AFTER

    def weights(self, priors: Mapping[str, float]) -> dict[str, float]:
        """Draw shares: an excluded specialty EXCLUDED_SHARE of a uniform share; the others prior x signal x
        keep probability, floored at FLOOR of a uniform share."""
        uniform = 1.0 / len(self.specialties)
        live = [name for name in self.specialties if not self.excluded(name)] or list(self.specialties)
        raw = {
            name: priors[name] * self.signal(name) * keep_probability(self.streaks.get((name, self.levels[name]), 0))
            for name in live
        }
        mass = 1.0 - EXCLUDED_SHARE * uniform * (len(self.specialties) - len(live))
        shares = floored_shares(raw, FLOOR * uniform, mass)
        return {name: shares.get(name, EXCLUDED_SHARE * uniform) for name in self.specialties}

    def pass_rate(self, specialty: str) -> float | None:
        answers = sum(g.answers for g in self.windows[specialty])
        return sum(g.passes for g in self.windows[specialty]) / answers if answers else None

    def up_needs(self, specialty: str) -> int:
        """Groups in the window before the next level up: more when that level was left downward before."""
        times = self.left_down.get((specialty, self.levels[specialty] + 1), 0)
        return RETURN_GROUPS[min(times, len(RETURN_GROUPS)) - 1] if times else MIN_GROUPS

    # -- learning from a round ----------------------------------------------------------
    def follow(self, results: Iterable[tuple[str, Sequence[float]]], priors: Mapping[str, float]) -> dict[str, Any]:
        """`observe`, log each level change (one line), and return the round's metrics of it:
        `curriculum` (per specialty: level, pass rate, draw share, excluded) and `level_changes`."""
        changes = self.observe(results)
        for c in changes:
            log.info("Curriculum: %s.", c.describe())
        return {
            "curriculum": self.report(priors),
            "level_changes": [{"specialty": c.specialty, "old": c.old, "new": c.new, "pass_rate": c.pass_rate,
                               "groups": c.groups, "all_fail": c.all_fail, "all_pass": c.all_pass}
                              for c in changes],
        }

    def observe(self, results: Iterable[tuple[str, Sequence[float]]]) -> list[LevelChange]:
        """Take a round's own groups as (specialty, rewards); move the levels whose window calls for it."""
        seen: dict[str, list[GroupStats]] = {}
        for specialty, rewards in results:
            if specialty in self.windows and rewards:
                seen.setdefault(specialty, []).append(GroupStats.of(rewards))
        changes = []
        for specialty, stats in seen.items():
            self._count_streak(specialty, stats)
            self._count_failing(specialty, stats)
            self.windows[specialty].extend(stats)
            change = self._move(specialty)
            if change is not None:
                changes.append(change)
        return changes

    def _count_streak(self, specialty: str, stats: Sequence[GroupStats]) -> None:
        kind = (specialty, self.levels[specialty])
        if any(g.teaches(self.train_on) for g in stats):
            self.streaks.pop(kind, None)
        else:
            self.streaks[kind] = self.streaks.get(kind, 0) + 1

    def _count_failing(self, specialty: str, stats: Sequence[GroupStats]) -> None:
        """Count a round's groups when all of them all failed at the lowest level; any other round resets."""
        lowest = specialty in self.pinned or self.levels[specialty] == LADDERS[specialty].lowest
        if lowest and all(g.all_fail(self.train_on) for g in stats):
            self.failing[specialty] = self.failing.get(specialty, 0) + len(stats)
        else:
            self.failing.pop(specialty, None)

    def _move(self, specialty: str) -> LevelChange | None:
        """Down when more than MOVE_SHARE of the window all failed, up when more than MOVE_SHARE all passed (and
        the window is long enough, `up_needs`); either way that kind must outnumber the other by MIN_GROUPS, so a
        signal that alternates between all-pass and all-fail holds the level. Counts only: the order of a
        round's groups (the draw's) matters only for which of them leave a full window first."""
        window = list(self.windows[specialty])
        if specialty in self.pinned or len(window) < MIN_GROUPS:
            return None
        ladder, old = LADDERS[specialty], self.levels[specialty]
        fails, passes = sum(g.all_fail(self.train_on) for g in window), sum(g.all_pass for g in window)
        if fails > MOVE_SHARE * len(window) and fails - passes >= MIN_GROUPS and old > ladder.lowest:
            new = old - 1
            self.left_down[(specialty, old)] = self.left_down.get((specialty, old), 0) + 1
        elif (passes > MOVE_SHARE * len(window) and passes - fails >= MIN_GROUPS and old < ladder.highest
              and len(window) >= self.up_needs(specialty)):
            new = old + 1
        else:
            return None
        rate = self.pass_rate(specialty) or 0.0
        self.levels[specialty] = new
        self.windows[specialty].clear()
        return LevelChange(specialty, old, new, rate, sum(g.answers for g in window), len(window), fails, passes)

    # -- reports and state --------------------------------------------------------------
    def report(self, priors: Mapping[str, float]) -> dict[str, dict[str, Any]]:
        """Per specialty, for the round's metrics: level, pass rate over the window (None when empty), draw share,
        and whether it is excluded."""
        shares = self.weights(priors)
        return {
            name: {"level": self.levels[name], "pass_rate": self.pass_rate(name), "weight": shares[name],
                   "excluded": self.excluded(name)}
            for name in self.specialties
        }

    def to_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "levels": dict(self.levels),
            "windows": {name: [g.to_json() for g in window] for name, window in self.windows.items()},
            "streaks": [[name, level, streak] for (name, level), streak in sorted(self.streaks.items())],
            "left_down": [[name, level, times] for (name, level), times in sorted(self.left_down.items())],
            "failing": dict(sorted(self.failing.items())),
        }

    @classmethod
    def from_state(cls, state: object, specialties: Sequence[str], pinned: Set[str] = frozenset(),
                   train_on: str = "informative") -> Curriculum:
        """The curriculum a checkpoint saved (version 1 or 2; version 1 has no exclusions and no levels left
        downward); specialties it does not know start fresh, ones it knows and that are no longer enabled are
        dropped. Anything malformed raises CheckpointError."""
        curriculum = cls(specialties, pinned, train_on)
        if not isinstance(state, dict) or state.get("version") not in (1, STATE_VERSION):
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
        if state["version"] == 1:
            return
        for name, level, times in state["left_down"]:
            if name in self.levels:
                LADDERS[name].overrides(_whole(level))
                self.left_down[(str(name), level)] = _positive(times)
        for name, count in dict(state["failing"]).items():
            if name in self.levels:
                self.failing[str(name)] = _positive(count)


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {value!r}")
    return value


def _positive(value: object) -> int:
    if _whole(value) < 1:
        raise ValueError(f"expected a count of at least 1, got {value!r}")
    return _whole(value)


def _group_stats(data: object) -> GroupStats:
    if not isinstance(data, list) or len(data) != 3:
        raise ValueError(f"a window entry must be [passes, answers, informative], got {data!r}")
    passes, answers, informative = (_whole(v) for v in data)
    if not 0 <= passes <= answers or informative not in (0, 1):
        raise ValueError(f"a window entry is out of range: {data!r}")
    return GroupStats(passes, answers, bool(informative))
