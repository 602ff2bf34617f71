"""What breaks the swarm protocol, and how one JSON value of a message is read strictly.

engine/swarm/protocol.py says what the messages are; this module says how any
of their values is read: a JSON text without NaN or infinities, a string
within its limit and valid Unicode, a whole number within its bounds (never a
bool), a finite number, base64 or hex of an exact size. Every failure is a
`ProtocolError` whose ``code`` is one of the ``E_*`` constants below, the
codes the relay sends back in an ``error`` message (docs/protocol.md lists
them). The other signed payloads (receipts, evaluation results) read their
fields with the same checks, so a value means the same wherever it travels.

Pure code: no I/O, no crypto.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

# -- error codes ---------------------------------------------------------------------------
E_BAD_JSON = "bad_json"
E_BAD_SCHEMA = "bad_schema"
E_VERSION = "unsupported_version"
E_TOO_LARGE = "too_large"
E_TOO_MANY_ITEMS = "too_many_items"
E_TOO_LONG = "completion_too_long"
E_BAD_SIGNATURE = "bad_signature"
E_REPLAY = "replayed_sequence"
E_STALE = "stale_timestamp"
E_RATE = "rate_limited"
E_AUTH = "not_authenticated"
E_FORBIDDEN = "forbidden"
E_BANNED = "banned"
E_CONN_LIMIT = "too_many_connections"
E_SLOW = "slow_consumer"
E_HEARTBEAT = "heartbeat_timeout"
E_SHUTDOWN = "shutting_down"
E_INTERNAL = "internal"
E_WRONG_MODEL = "wrong_model"  # a swarm of one model: a batch labelled with another one
E_WRONG_SEED = "wrong_seed"  # evaluation answers for a seed the relay does not ask now (engine/swarm/results.py)
E_WRONG_QUESTIONS = "wrong_questions"  # evaluation answers to other questions than the seed's
ERROR_CODES = (
    E_BAD_JSON, E_BAD_SCHEMA, E_VERSION, E_TOO_LARGE, E_TOO_MANY_ITEMS, E_TOO_LONG, E_BAD_SIGNATURE,
    E_REPLAY, E_STALE, E_RATE, E_AUTH, E_FORBIDDEN, E_BANNED, E_CONN_LIMIT, E_SLOW, E_HEARTBEAT, E_SHUTDOWN,
    E_INTERNAL, E_WRONG_MODEL, E_WRONG_SEED, E_WRONG_QUESTIONS,
)
# Codes after which the relay closes the connection (the rest only reject one message).
FATAL_CODES = frozenset({E_VERSION, E_AUTH, E_FORBIDDEN, E_BANNED, E_CONN_LIMIT, E_SLOW, E_HEARTBEAT, E_SHUTDOWN})


class ProtocolError(Exception):
    """A message that breaks the protocol; ``code`` is one of ERROR_CODES.

    ``request_id`` is the message's own ``id`` when it carried a valid one, so
    the error about it can name the request.
    """

    def __init__(self, code: str, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# -- reading one field -----------------------------------------------------------------------
def fail(code: str, message: str) -> ProtocolError:
    return ProtocolError(code, message)


def string(obj: dict[str, Any], key: str, limit: int, *, code: str = E_BAD_SCHEMA, allow_empty: bool = True) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise fail(E_BAD_SCHEMA, f"'{key}' must be a string")
    if len(value) > limit:
        raise fail(code, f"'{key}' is longer than {limit} characters")
    if not allow_empty and not value:
        raise fail(E_BAD_SCHEMA, f"'{key}' must not be empty")
    check_unicode(value, key)
    return value


def check_unicode(value: str, what: str) -> None:
    """JSON escapes can smuggle lone surrogates, which no tokenizer or UTF-8 encoder accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise fail(E_BAD_SCHEMA, f"'{what}' is not valid Unicode text") from exc


def whole(obj: dict[str, Any], key: str, low: int, high: int, where: str = "") -> int:
    """An integer (not a bool) from `low` to `high`; `where` names the part of the message in the error."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise fail(E_BAD_SCHEMA, f"{where + ': ' if where else ''}'{key}' must be a whole number from {low} to {high}")
    return value


def number(obj: dict[str, Any], key: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(E_BAD_SCHEMA, f"'{key}' must be a finite number")
    return float(value)


def b64(obj: dict[str, Any], key: str, size: int) -> bytes:
    text = string(obj, key, 4 * size)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise fail(E_BAD_SCHEMA, f"'{key}' is not base64") from exc
    if len(raw) != size:
        raise fail(E_BAD_SCHEMA, f"'{key}' must decode to {size} bytes")
    return raw


def hex_text(obj: dict[str, Any], key: str, size: int) -> str:
    text = string(obj, key, 2 * size)
    if len(text) != 2 * size or any(c not in "0123456789abcdef" for c in text):
        raise fail(E_BAD_SCHEMA, f"'{key}' must be {2 * size} lowercase hex characters")
    return text


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf: no more a number than Infinity is
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def load_json(text: str) -> Any:
    """JSON without NaN, Infinity or numbers that overflow to them (all `bad_json`)."""
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise fail(E_BAD_JSON, f"message is not JSON: {str(exc)[:120]}") from exc
