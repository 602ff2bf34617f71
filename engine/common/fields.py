"""How an engine setting is declared and checked: one field with its facts, and the sentence a bad value gets.

`declare(text, default, ...)` is a dataclass field whose metadata holds the
setting's help, its label where a person picks it in the app, where it takes
effect (`APPLIES`), and a number's bounds; engine/common/config.py declares
every setting with it, and engine/common/schema.py reads the metadata back.
The checks (`check_bounds`, `positive_int`, `number`, `choice`) raise
`ConfigError` with one sentence naming the key and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, field, fields
from typing import Any

from engine.common.errors import ConfigError

# Where a setting takes effect (engine/common/schema.py, `restart_changes`): "live" with a reload between rounds;
# "restart" when the node starts again (the rest of a reload still applies); "new_run": what the run's weights
# and their checkpoint depend on, so a reload that changes it is not applied at all.
APPLIES = ("live", "restart", "new_run")


def declare(text: str, default: Any = MISSING, factory: Any = MISSING, *, label: str = "", name: str = "",
          applies: str = "live", low: float | None = None, high: float | None = None, open_low: bool = False) -> Any:
    """A setting: its help; for one a person picks in the app, its `label` (and the `name` the app's settings
    call it, where the key alone would not say); where it takes effect; for a number, its bounds, which
    `check_bounds` enforces and the app's fields take as their range."""
    assert applies in APPLIES, applies
    metadata = {"help": text, "label": label, "name": name, "applies": applies, "low": low, "high": high,
                "open_low": open_low}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def check_bounds(section: str, settings: Any) -> None:
    """Every field of `settings` declared with bounds: a whole number for an int field, a finite number for a
    float one, from low (excluded with open_low) to high."""
    for f in fields(settings):
        low, high = f.metadata.get("low"), f.metadata.get("high")
        if low is None or high is None:
            continue
        value = getattr(settings, f.name)
        if f.type in ("int", int):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{section}.{f.name} must be a whole number from {int(low)} to {int(high)}, "
                                  f"got {value!r}.")
        else:
            number(section, f.name, value, low, high, open_low=f.metadata.get("open_low", False))


def positive_int(section: str, key: str, value: object, upper: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{section}.{key} must be a whole number of at least 1, got {value!r}.")
    if upper is not None and value > upper:
        raise ConfigError(f"{section}.{key} must be at most {upper}, got {value}.")


def number(section: str, key: str, value: object, low: float, high: float, *, open_low: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value < low or value > high or (open_low and value == low)):  # type: ignore[operator]
        ok = False
    if not ok:
        bound = f"greater than {low}" if open_low else f"at least {low}"
        raise ConfigError(f"{section}.{key} must be a number {bound} and at most {high}, got {value!r}.")


def peer_reference(text: str) -> bool:
    """A peer id (20 lowercase hex characters) or a base64 Ed25519 public key (32 bytes)."""
    import base64
    import binascii

    if len(text) == 20 and all(c in "0123456789abcdef" for c in text):
        return True
    try:
        return len(base64.b64decode(text, validate=True)) == 32
    except (binascii.Error, ValueError):
        return False


def choice(section: str, key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{key} must be one of {', '.join(allowed)}; got {value!r}.")
