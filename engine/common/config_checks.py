"""The checks behind engine/common/config.py: each setting's help text as a dataclass field, and the
one-sentence errors a bad value gets (`ConfigError`, naming the section and key)."""

from __future__ import annotations

import math
from dataclasses import MISSING, field
from typing import Any

from engine.common.errors import ConfigError


def help_field(text: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


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
