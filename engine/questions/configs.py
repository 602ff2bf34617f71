"""What a task's config may hold: the specialties' default settings and the rules a peer's ref must pass.

A `TaskRef` (engine.questions.tasks) carries its dataset's config, so a peer chooses
it. Before anything is built from one, `check_config` holds it to these
rules: only known keys, in canonical order; every string value from a
whitelist; every size-driving value capped, so that one rebuild stays well
under a second and no value reaches code that reasoning-gym evaluates.
`canonical_config` turns a config table (config.toml's) into that form.
`DEFAULT_DATASET_CONFIGS` are the easiest sensible settings of each of the
nine SAPO specialties. Imports no reasoning-gym.

Tests: .venv/bin/python -m pytest tests/engine/test_tasks.py -q
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from engine.common.errors import TaskError

MAX_CONFIG_KEYS = 32
MAX_CONFIG_STRING = 64
# reasoning-gym's own defaults for base_conversion's bases, which apply where a ref leaves them out.
_RG_MIN_BASE = 2
_RG_MAX_BASE = 16

# The easiest sensible settings of each specialty: the default model (SmolLM2-135M) is
# weak, and GRPO learns nothing from a group whose rewards are all zero. Every key is
# explicit so that refs do not depend on reasoning-gym's own defaults.
DEFAULT_DATASET_CONFIGS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "base_conversion": MappingProxyType(
            # min_value 1: reasoning-gym renders 0 in bases other than 2/16 as "" (unanswerable).
            {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 32}
        ),
        "basic_arithmetic": MappingProxyType(
            {
                "min_terms": 2,
                "max_terms": 2,
                "min_digits": 1,
                "max_digits": 1,
                "operators": ("+", "-"),
                "allow_parentheses": False,
                "allow_negation": False,
                "format_style": "simple",
                "whitespace": "single",
            }
        ),
        "arc_1d": MappingProxyType({"min_size": 8, "max_size": 10, "num_train": 3}),
        "bf": MappingProxyType({"difficulty": 1}),
        "propositional_logic": MappingProxyType(
            {
                "min_vars": 2,
                "max_vars": 2,
                "min_statements": 2,
                "max_statements": 2,
                "min_complexity": 1,
                "max_complexity": 2,
            }
        ),
        "fraction_simplification": MappingProxyType(
            {"min_value": 1, "max_value": 10, "min_factor": 2, "max_factor": 5, "styles": ("plain",)}
        ),
        "decimal_arithmetic": MappingProxyType(
            {
                "min_num_decimal_places": 1,
                "max_num_decimal_places": 1,
                "min_terms": 2,
                "max_terms": 2,
                "precision": 6,
            }
        ),
        "calendar_arithmetic": MappingProxyType(
            {
                "year": 2022,
                "tasks": ("is_leap_year", "weekday_offset", "weekday_of_date"),
                "offset_upper_bound": 30,
                "leap_year_range": 200,
            }
        ),
        "binary_matrix": MappingProxyType({"min_n": 2, "max_n": 3, "p_zero": 0.5}),
    }
)


@dataclass(frozen=True)
class _Int:
    lo: int
    hi: int

    def problem(self, value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be a whole number"
        if not self.lo <= value <= self.hi:
            return f"must be between {self.lo} and {self.hi}"
        return None


@dataclass(frozen=True)
class _Fraction:
    """A number in (0, 1]."""

    def problem(self, value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        if not 0.0 < value <= 1.0:
            return "must be above 0 and at most 1"
        return None


@dataclass(frozen=True)
class _Bool:
    def problem(self, value: object) -> str | None:
        return None if isinstance(value, bool) else "must be true or false"


@dataclass(frozen=True)
class _Choice:
    options: tuple[str, ...]

    def problem(self, value: object) -> str | None:
        return None if value in self.options else f"must be one of {', '.join(self.options)}"


@dataclass(frozen=True)
class _Subset:
    options: tuple[str, ...]

    def problem(self, value: object) -> str | None:
        if not isinstance(value, tuple) or not value or any(v not in self.options for v in value):
            return f"must be a non-empty list drawn from {', '.join(self.options)}"
        return None


_Rule = _Int | _Fraction | _Bool | _Choice | _Subset

_CALENDAR_TASKS = (
    "weekday_offset",
    "weekday_of_date",
    "weekday_of_date_from_first_date",
    "recurring_event_day",
    "count_days",
    "count_business_days",
    "is_leap_year",
)

# Caps are measured, not guessed: at these limits the slowest of thousands of items
# builds in under ~0.3 s. Beyond them reasoning-gym can take minutes (basic_arithmetic
# at 6 terms x 4 digits: 118 s for one item; bf difficulty 3: ~2 s per item).
# String options are whitelisted because basic_arithmetic eval()s its operators and
# its own check is an `assert`, which `python -O` removes.
CONFIG_RULES: Mapping[str, Mapping[str, _Rule]] = MappingProxyType(
    {
        "base_conversion": {
            "min_base": _Int(2, 36),
            "max_base": _Int(2, 36),
            "min_value": _Int(0, 10**6),
            "max_value": _Int(1, 10**6),
        },
        "basic_arithmetic": {
            "min_terms": _Int(1, 5),
            "max_terms": _Int(1, 5),
            "min_digits": _Int(1, 3),
            "max_digits": _Int(1, 3),
            "operators": _Subset(("+", "-", "*", "/")),
            "allow_parentheses": _Bool(),
            "allow_negation": _Bool(),
            "format_style": _Choice(("simple", "natural")),
            "whitespace": _Choice(("no_space", "single", "random")),
        },
        "arc_1d": {"min_size": _Int(8, 100), "max_size": _Int(8, 100), "num_train": _Int(1, 10)},
        "bf": {"difficulty": _Int(1, 2)},
        "propositional_logic": {
            "min_vars": _Int(1, 8),
            "max_vars": _Int(1, 8),
            "min_statements": _Int(1, 8),
            "max_statements": _Int(1, 8),
            "min_complexity": _Int(1, 4),
            "max_complexity": _Int(1, 4),
        },
        "fraction_simplification": {
            "min_value": _Int(1, 10_000),
            "max_value": _Int(1, 10_000),
            "min_factor": _Int(1, 1000),
            "max_factor": _Int(1, 1000),
            "styles": _Subset(("plain", "latex_inline", "latex_frac", "latex_dfrac")),
        },
        "decimal_arithmetic": {
            "min_num_decimal_places": _Int(1, 8),
            "max_num_decimal_places": _Int(1, 8),
            "min_terms": _Int(2, 10),
            "max_terms": _Int(2, 10),
            "precision": _Int(3, 28),
        },
        "calendar_arithmetic": {
            "year": _Int(1, 9000),
            "tasks": _Subset(_CALENDAR_TASKS),
            "offset_upper_bound": _Int(1, 365),
            "leap_year_range": _Int(0, 2000),
        },
        "binary_matrix": {"min_n": _Int(1, 100), "max_n": _Int(1, 100), "p_zero": _Fraction()},
    }
)


def check_config(dataset: str, config: tuple[tuple[str, Any], ...]) -> None:
    """Raise TaskError unless `config` is a canonical, allowed config for `dataset`."""
    rules = CONFIG_RULES[dataset]
    if not isinstance(config, tuple):
        raise TaskError(f"The config of a {dataset} task must be a tuple of (key, value) pairs.")
    if len(config) > MAX_CONFIG_KEYS:
        raise TaskError(
            f"The config of a {dataset} task has {len(config)} keys; at most {MAX_CONFIG_KEYS} are allowed."
        )
    keys: list[str] = []
    for pair in config:
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str):
            raise TaskError(f"The config of a {dataset} task must be a tuple of (key, value) pairs.")
        key, value = pair
        if key not in rules:
            allowed = ", ".join(rules)
            raise TaskError(f"Config key {key[:MAX_CONFIG_STRING]!r} is not allowed for {dataset}; allowed: {allowed}.")
        problem = rules[key].problem(value)
        if problem is not None:
            raise TaskError(f"Config value {dataset}.{key} = {value!r:.{MAX_CONFIG_STRING}} {problem}.")
        keys.append(key)
    if keys != sorted(set(keys)):
        raise TaskError(f"The config keys of a {dataset} task must be unique and sorted.")
    values = dict(config)
    for key in keys:
        upper = "max_" + key[4:]
        if key.startswith("min_") and upper in values and values[key] > values[upper]:
            raise TaskError(f"Config value {dataset}.{key} must not exceed {dataset}.{upper}.")
    # base_conversion draws a second base until it differs from the first: one base in the range never returns.
    if dataset == "base_conversion" and values.get("min_base", _RG_MIN_BASE) >= values.get("max_base", _RG_MAX_BASE):
        raise TaskError("Config value base_conversion.min_base must be below base_conversion.max_base.")


def canonical_config(dataset: str, config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Sorted (key, value) pairs with lists turned into tuples, then validated."""
    if not isinstance(config, Mapping):
        raise TaskError(f"The config of a {dataset} task must be a table of option = value.")
    if len(config) > MAX_CONFIG_KEYS:
        raise TaskError(
            f"The config of a {dataset} task has {len(config)} keys; at most {MAX_CONFIG_KEYS} are allowed."
        )
    if not all(isinstance(key, str) for key in config):
        raise TaskError(f"The config keys of a {dataset} task must be strings.")
    pairs = tuple(sorted((key, tuple(v) if isinstance(v, list) else v) for key, v in config.items()))
    check_config(dataset, pairs)
    return pairs
