"""Command-line helpers the benches share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", int, float)


def comma_numbers(text: str, cast: Callable[[str], T], flag: str) -> list[T] | str:
    """The comma-separated numbers of `flag`'s value, or the sentence that refuses them."""
    kind = "whole numbers" if cast is int else "numbers"
    try:
        return [cast(part) for part in text.split(",")]
    except ValueError:
        return f"{flag} must be {kind} separated by commas, got {text!r}"
