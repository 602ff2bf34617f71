"""The engine <-> app channel: JSON lines, one schema, stdlib only.

`sapling-node serve` writes one JSON object per line on stdout (events) and
reads one per line on stdin (commands); the app reads and writes them with
this module. Full reference with examples: docs/engine-events.md.

Every event has ``type`` (str), ``v`` (schema version, int) and ``ts`` (unix
seconds, float), plus the fields below. Readers ignore unknown types (with a
log line) and extra fields; a malformed line is reported, never fatal.

Event types and their required fields:

    status      state, message, device, model, run, round
                (state: starting, loading, training, paused, waiting, stopped; waiting: outside
                run.schedule's hours, with next_start, local ISO time such as "2026-12-03T22:00")
    progress    phase, done, total, round
                (phase: probing, generating, scoring, training, evaluating, checkpointing)
    round       round, metrics
    eval        round, accuracy, reward_mean, questions, by_specialty
    peers       online, received, accepted, rejected  (+ connected, not_picked, probation, rejected_by_reason,
                by_peer, banned, this_round, data_today); counts are items (a question with its completions),
                totals for this run; by_peer[id]["banned"] and banned[id] are {reason, since, until, source} or
                absent/null (until null: until lifted; source "strikes" or "config"); data_today: today's swarm
                traffic and daily caps in bytes (engine/swarm/datacap.py)
    swarm       peer_id, name, relay, connected, message
    log         level, logger, message
    error       kind, message, fatal
    checkpoint  round, path
    contribution peer_id, credit, message  (+ warning, at, swarm, history): what the relay counted from
                other peers' receipts about this node's rollouts (engine/swarm/contribution.py)
    standing    peer_id, message, result: where this node's model stands on the relay's results table, from
                the relay's own score of its evaluation answers (engine/swarm/results.py); result holds checked,
                and when checked place, of, correct, questions, round, seed, model

Commands: ``{"cmd": "pause" | "resume" | "stop" | "reload", "v": 1}`` and
``{"cmd": "unban", "v": 1, "peer": "<peer id>"}``.
``stop`` finishes at the next safe point with a checkpoint; ``reload`` re-reads
config.toml and applies it at the next round boundary; ``unban`` lifts a local
ban before the next swarm sample and is answered by a `peers` event.

Two more rules cross the same boundary and live here too: the messages of
Try it's child, `sapling-node chat` (`CHAT_MESSAGE_FIELDS`, `CHAT_COMMANDS`;
engine/gguf/chat.py explains each), and how any process starts a `sapling-node`
subcommand as a child (`node_command`).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from engine.common.errors import EventError

log = logging.getLogger(__name__)

EVENT_VERSION = 1
MAX_LINE_CHARS = 1 << 20

EVENT_FIELDS: Mapping[str, tuple[str, ...]] = {
    "status": ("state", "message", "device", "model", "run", "round"),
    "progress": ("phase", "done", "total", "round"),
    "round": ("round", "metrics"),
    "eval": ("round", "accuracy", "reward_mean", "questions", "by_specialty"),
    "peers": ("online", "received", "accepted", "rejected"),
    "swarm": ("peer_id", "name", "relay", "connected", "message"),
    "log": ("level", "logger", "message"),
    "error": ("kind", "message", "fatal"),
    "checkpoint": ("round", "path"),
    "contribution": ("peer_id", "credit", "message"),
    "standing": ("peer_id", "message", "result"),
}
COMMANDS = ("pause", "resume", "stop", "reload", "unban")
# Fields a command must carry, with their type.
COMMAND_FIELDS: Mapping[str, tuple[tuple[str, type], ...]] = {"unban": (("peer", str),)}

Event = dict[str, Any]

# `sapling-node chat` (engine/gguf/chat.py, the app's Try it tab): the messages it writes and their required
# fields, and the commands it reads.
CHAT_MESSAGE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "ready": ("llama_cpp", "message", "specialties"),
    "question": ("id", "specialty", "text", "answer"),
    "status": ("id", "message"),
    "token": ("id", "side", "text"),
    "answer": ("id", "side", "text", "score", "round", "tokens", "first_token_s", "seconds"),
    "error": ("id", "message"),
}
CHAT_COMMANDS = ("question", "ask", "threads", "cancel")


def node_command(subcommand: str, flags: Sequence[str] = ()) -> list[str]:
    """The command line that starts `sapling-node SUBCOMMAND FLAGS...` as a child of this process.

    From a checkout or a pip install: this Python with ``-m engine.cli``. In a frozen build there is
    no Python to run modules with: the same executable with its ``node`` subcommand (app.main).
    """
    if getattr(sys, "frozen", False):
        return [sys.executable, "node", subcommand, *flags]
    return [sys.executable, "-m", "engine.cli", subcommand, *flags]


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: send them as null so every reader can parse the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def make_event(type_: str, **fields: Any) -> Event:
    """Build an event, checking its required fields (a missing one is a bug)."""
    required = EVENT_FIELDS.get(type_)
    if required is None:
        raise ValueError(f"unknown event type {type_!r}")
    missing = [name for name in required if name not in fields]
    if missing:
        raise ValueError(f"event {type_!r} is missing {missing}")
    return {"type": type_, "v": EVENT_VERSION, "ts": time.time(), **_clean(fields)}


def encode(message: Mapping[str, Any]) -> str:
    """One line of compact JSON, without a trailing newline."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _load_object(line: str | bytes) -> dict[str, Any]:
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EventError("line is not UTF-8") from exc
    if len(line) > MAX_LINE_CHARS:
        raise EventError(f"line is longer than {MAX_LINE_CHARS} characters")
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise EventError(f"line is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise EventError("line is not a JSON object")
    return obj


def parse_event(line: str | bytes) -> Event | None:
    """A validated event; None for a well-formed event of a type we don't know."""
    obj = _load_object(line)
    type_ = obj.get("type")
    if not isinstance(type_, str):
        raise EventError("event has no 'type'")
    if not isinstance(obj.get("v"), int) or isinstance(obj.get("v"), bool):
        raise EventError(f"{type_} event has no integer 'v'")
    if type_ not in EVENT_FIELDS:
        log.info("ignoring unknown event type %r (v%s)", type_, obj.get("v"))
        return None
    missing = [name for name in EVENT_FIELDS[type_] if name not in obj]
    if missing:
        raise EventError(f"{type_} event is missing {', '.join(missing)}")
    return obj


def make_command(cmd: str, **fields: Any) -> dict[str, Any]:
    if cmd not in COMMANDS:
        raise ValueError(f"unknown command {cmd!r}")
    return {"cmd": cmd, "v": EVENT_VERSION, **fields}


def parse_command(line: str | bytes) -> dict[str, Any]:
    obj = _load_object(line)
    cmd = obj.get("cmd")
    if cmd not in COMMANDS:
        raise EventError(f"unknown command {cmd!r}; expected one of {', '.join(COMMANDS)}")
    for name, kind in COMMAND_FIELDS.get(cmd, ()):
        value = obj.get(name)
        if not isinstance(value, kind) or not value:
            raise EventError(f"{cmd} command needs a non-empty {kind.__name__} {name!r}")
    return obj
