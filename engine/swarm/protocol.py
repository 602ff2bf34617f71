"""The swarm wire protocol, version 1: message shapes, limits and validation.

Pure code: no I/O, no crypto, no training. Every message is one JSON object
in one websocket text frame, with ``type`` and ``v``. Signed content travels
as a JSON *string* (``payload``) next to its Ed25519 signature (``sig``), so
every receiver verifies the exact bytes that were signed and never
re-serialises them. The full description, written so that a compatible
client can be built from it alone, is docs/protocol.md.

"Characters" are Unicode code points (Python's ``len`` of a ``str``), never
bytes or UTF-16 units; only ``MAX_FRAME_BYTES`` counts bytes (UTF-8).

Decoding never raises anything but `ProtocolError`, whose ``code`` is one of
the ``E_*`` constants; the relay sends that code back in an ``error`` message.
Both, and how each value of a message is read (strict JSON, a string within
its limit, a whole number within bounds, base64 or hex of a size), live in
engine/swarm/wire.py, which the other signed payloads (receipts, evaluation
results) read with too; `payload_object` is the head they all share.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from engine.common.rules import MAX_COMPLETION_CHARS
from engine.common.rules import PROTOCOL_VERSION as VERSION
from engine.swarm import wire

# What breaks the protocol is named in engine/swarm/wire.py, beside how a value is read; the modules that speak
# the protocol name the codes through this one.
from engine.swarm.wire import (  # noqa: F401
    E_AUTH,
    E_BAD_JSON,
    E_BAD_SCHEMA,
    E_BAD_SIGNATURE,
    E_BANNED,
    E_CONN_LIMIT,
    E_FORBIDDEN,
    E_HEARTBEAT,
    E_INTERNAL,
    E_RATE,
    E_REPLAY,
    E_SHUTDOWN,
    E_SLOW,
    E_STALE,
    E_TOO_LARGE,
    E_TOO_LONG,
    E_TOO_MANY_ITEMS,
    E_VERSION,
    E_WRONG_MODEL,
    E_WRONG_QUESTIONS,
    E_WRONG_SEED,
    ERROR_CODES,
    FATAL_CODES,
    ProtocolError,
)

# VERSION and MAX_COMPLETION_CHARS are written in engine/common/rules.py, where the app's join check and a
# question's scorer read them too; they are this protocol's as much as the limits below.

# -- limits (every one is part of the protocol; docs/protocol.md lists them) ----------------
MAX_FRAME_BYTES = 256 * 1024  # one client->relay websocket message
MAX_PAYLOAD_CHARS = 240 * 1024  # the signed payload string inside a publish, in characters
MAX_ITEMS_PER_BATCH = 16  # question groups in one publish
MAX_COMPLETIONS_PER_ITEM = 16  # completions per question group
MAX_QUESTION_CHARS = 8192  # characters in one question text
MAX_TASK_KEYS = 8  # keys in an item's task reference object
MAX_TASK_CHARS = 4096  # the task reference, as compact JSON (no spaces, non-ASCII kept), in characters
MAX_MODEL_CHARS = 128  # the sender's model label
MAX_SOFTWARE_CHARS = 64  # the client's software label in the handshake
MAX_TOKEN_CHARS = 256  # a private swarm's join token
MAX_SAMPLE_BATCHES = 16  # batches one sample request may ask for
MAX_CURSOR_CHARS = 64  # the opaque sampling cursor a relay hands out and a client echoes in `after`
MAX_REQUEST_ID = 2**53 - 1  # request ids and sequence numbers fit a JSON double exactly
MAX_SEQ = 2**53 - 1
NONCE_BYTES = 32  # handshake challenge
PUBLIC_KEY_BYTES = 32  # raw Ed25519 public key
SIGNATURE_BYTES = 64  # raw Ed25519 signature
TIMESTAMP_WINDOW_S = 300.0  # a publish or hello more than this far from the receiver's clock is stale
HANDSHAKE_TIMEOUT_S = 10.0  # the relay closes a connection that has not said hello by then
HEARTBEAT_S = 20.0  # websocket ping interval; a peer that answers neither of two pings in a row is dropped
MAX_RESPONSE_BYTES = MAX_SAMPLE_BATCHES * (MAX_FRAME_BYTES + 512) + 4096  # one relay->client message
PEER_ID_HEX = 20  # characters of sha256(public key) that name a peer
# Defaults of relay-side limits (the relay's flags can change them).
DEFAULT_RATE_PER_S = 2.0  # requests (publish + sample) per peer per second, token-bucket refill
DEFAULT_BURST = 10.0  # token-bucket capacity
DEFAULT_MAX_CONN_PER_IP = 16
DEFAULT_WINDOW_BATCHES = 1024  # recent batches the relay keeps for sampling
DEFAULT_SEND_QUEUE = 32  # messages queued to one connection before it counts as a slow consumer
DEFAULT_CREDIT_PER_ROUND = 8  # `used` items of one sender that one receiver's receipts credit per sample answer
DEFAULT_RECEIPT_WINDOW_S = 3600.0  # how long after a sample the relay takes receipts for what it handed


CLIENT_TYPES = ("hello", "publish", "sample", "stats", "receipts", "results")
RELAY_TYPES = ("challenge", "welcome", "published", "batches", "stats", "error", "receipted", "scored")




def b64encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def peer_id(public_key: bytes) -> str:
    """A peer's id: the first PEER_ID_HEX hex characters of sha256(raw public key)."""
    return hashlib.sha256(public_key).hexdigest()[:PEER_ID_HEX]


def encode(message: dict[str, Any]) -> str:
    """Compact JSON for one frame (no NaN, no infinities)."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)




def _frame_text(frame: str | bytes) -> str:
    """A websocket message as text, at most MAX_FRAME_BYTES of UTF-8 (binary frames are read as UTF-8 too)."""
    if isinstance(frame, (bytes, bytearray)):
        if len(frame) > MAX_FRAME_BYTES:
            raise wire.fail(E_TOO_LARGE, f"message is larger than {MAX_FRAME_BYTES} bytes")
        try:
            return bytes(frame).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise wire.fail(E_BAD_JSON, "message is not UTF-8") from exc
    if not isinstance(frame, str):
        raise wire.fail(E_BAD_JSON, "message is not text")
    if len(frame) > MAX_FRAME_BYTES or len(frame.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        raise wire.fail(E_TOO_LARGE, f"message is larger than {MAX_FRAME_BYTES} bytes")
    return frame




def _request_id(obj: dict[str, Any]) -> int | None:
    value = obj.get("id")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REQUEST_ID:
        return None
    return value


def _envelope(obj: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise wire.fail(E_BAD_SCHEMA, "message must be a JSON object")
    v = obj.get("v")
    if isinstance(v, bool) or not isinstance(v, int):
        raise wire.fail(E_BAD_SCHEMA, "message has no integer 'v'")
    if v != VERSION:
        raise wire.fail(E_VERSION, f"protocol version {v} is not supported; this side speaks {VERSION}")
    type_ = obj.get("type")
    if type_ not in allowed:
        raise wire.fail(E_BAD_SCHEMA, f"unknown message type {str(type_)[:40]!r}; expected one of {', '.join(allowed)}")
    return obj


# -- signed payloads --------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One question group as shared: the task reference, its text and the sender's completions."""

    task: dict[str, Any]
    question: str
    completions: tuple[str, ...]
    rewards: tuple[float | None, ...]  # the sender's own scores: information only, never trusted


@dataclass(frozen=True)
class Batch:
    """A verified-shape publish payload (the signature is checked separately)."""

    key: bytes  # raw Ed25519 public key of the sender
    seq: int
    ts: float
    model: str
    items: tuple[Item, ...]

    @property
    def peer(self) -> str:
        return peer_id(self.key)


@dataclass(frozen=True)
class Hello:
    key: bytes
    nonce: str
    ts: float
    token: str
    software: str

    @property
    def peer(self) -> str:
        return peer_id(self.key)


def payload_object(payload: str, kind: str) -> dict[str, Any]:
    """A signed payload string as its JSON object: within MAX_PAYLOAD_CHARS, an object, of `kind`."""
    if len(payload) > MAX_PAYLOAD_CHARS:
        raise wire.fail(E_TOO_LARGE, f"the payload is longer than {MAX_PAYLOAD_CHARS} characters")
    obj = wire.load_json(payload)
    if not isinstance(obj, dict):
        raise wire.fail(E_BAD_SCHEMA, "payload must be a JSON object")
    if obj.get("kind") != kind:
        raise wire.fail(E_BAD_SCHEMA, f"payload kind must be {kind!r}")
    return obj


def _item(raw: object, index: int) -> Item:
    if not isinstance(raw, dict):
        raise wire.fail(E_BAD_SCHEMA, f"item {index} must be an object")
    task = raw.get("task")
    if not isinstance(task, dict) or len(task) > MAX_TASK_KEYS:
        raise wire.fail(E_BAD_SCHEMA, f"item {index}: 'task' must be an object of at most {MAX_TASK_KEYS} keys")
    try:
        task_text = encode(task)
        task_text.encode("utf-8")
    except (UnicodeEncodeError, ValueError) as exc:
        raise wire.fail(E_BAD_SCHEMA, f"item {index}: 'task' is not valid text") from exc
    task_chars = len(task_text)
    if task_chars > MAX_TASK_CHARS:
        raise wire.fail(E_TOO_LARGE, f"item {index}: 'task' is longer than {MAX_TASK_CHARS} characters")
    question = wire.string(raw, "question", MAX_QUESTION_CHARS, code=E_TOO_LARGE)
    completions = raw.get("completions")
    if not isinstance(completions, list) or not completions:
        raise wire.fail(E_BAD_SCHEMA, f"item {index}: 'completions' must be a non-empty list")
    if len(completions) > MAX_COMPLETIONS_PER_ITEM:
        raise wire.fail(E_TOO_MANY_ITEMS, f"item {index} has more than {MAX_COMPLETIONS_PER_ITEM} completions")
    for text in completions:
        if not isinstance(text, str):
            raise wire.fail(E_BAD_SCHEMA, f"item {index}: every completion must be a string")
        if len(text) > MAX_COMPLETION_CHARS:
            raise wire.fail(E_TOO_LONG, f"item {index}: a completion is longer than {MAX_COMPLETION_CHARS} characters")
        wire.check_unicode(text, f"item {index} completion")
    rewards = raw.get("rewards")
    if not isinstance(rewards, list) or len(rewards) != len(completions):
        raise wire.fail(E_BAD_SCHEMA, f"item {index}: 'rewards' must list one number or null per completion")
    for r in rewards:
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)):
            raise wire.fail(E_BAD_SCHEMA, f"item {index}: rewards must be finite numbers or null")
    return Item(dict(task), question, tuple(completions), tuple(None if r is None else float(r) for r in rewards))


def decode_batch(payload: str) -> Batch:
    """Parse and check a publish payload string (signature not checked here)."""
    obj = payload_object(payload, "batch")
    key = wire.b64(obj, "key", PUBLIC_KEY_BYTES)
    seq = wire.whole(obj, "seq", 1, MAX_SEQ)
    ts = wire.number(obj, "ts")
    model = wire.string(obj, "model", MAX_MODEL_CHARS, code=E_TOO_LARGE)
    items = obj.get("items")
    if not isinstance(items, list) or not items:
        raise wire.fail(E_BAD_SCHEMA, "'items' must be a non-empty list")
    if len(items) > MAX_ITEMS_PER_BATCH:
        raise wire.fail(E_TOO_MANY_ITEMS, f"a batch holds at most {MAX_ITEMS_PER_BATCH} items, got {len(items)}")
    return Batch(key, seq, ts, model, tuple(_item(raw, i) for i, raw in enumerate(items)))


def batch_payload(key: bytes, seq: int, ts: float, model: str, items: list[Item]) -> str:
    """The payload string a node signs and publishes; checked against the limits before it leaves."""
    payload = encode({
        "kind": "batch",
        "key": b64encode(key),
        "seq": seq,
        "ts": ts,
        "model": model[:MAX_MODEL_CHARS],
        "items": [
            {"task": it.task, "question": it.question, "completions": list(it.completions), "rewards": list(it.rewards)}
            for it in items
        ],
    })
    decode_batch(payload)
    return payload


def decode_hello_payload(payload: str) -> Hello:
    obj = payload_object(payload, "hello")
    return Hello(
        key=wire.b64(obj, "key", PUBLIC_KEY_BYTES),
        nonce=wire.hex_text(obj, "nonce", NONCE_BYTES),
        ts=wire.number(obj, "ts"),
        token=wire.string(obj, "token", MAX_TOKEN_CHARS, code=E_TOO_LARGE),
        software=wire.string(obj, "software", MAX_SOFTWARE_CHARS, code=E_TOO_LARGE),
    )


def hello_payload(key: bytes, nonce: str, ts: float, token: str, software: str) -> str:
    return encode({"kind": "hello", "key": b64encode(key), "nonce": nonce, "ts": ts, "token": token,
                   "software": software})


def check_timestamp(ts: float, now: float) -> None:
    if abs(ts - now) > TIMESTAMP_WINDOW_S:
        raise wire.fail(E_STALE,
                    f"timestamp is {ts - now:+.0f} s from this side's clock (window ±{TIMESTAMP_WINDOW_S:.0f} s)")


# -- messages -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Signed:
    """A payload string and the signature over its UTF-8 bytes."""

    payload: str
    sig: bytes

    def to_json(self) -> dict[str, str]:
        return {"payload": self.payload, "sig": b64encode(self.sig)}


def _signed(obj: dict[str, Any]) -> Signed:
    payload = wire.string(obj, "payload", MAX_PAYLOAD_CHARS, code=E_TOO_LARGE)
    return Signed(payload, wire.b64(obj, "sig", SIGNATURE_BYTES))


def decode_client(frame: str | bytes) -> dict[str, Any]:
    """A client->relay message, its shape checked. Signed parts come back as `Signed` under 'signed'.

    A `sample` comes back as ``{"type", "id", "n", "after"}``, ``after`` being the
    cursor string or None; other types carry ``id`` too, None unless the message had a
    valid one. Every error carries the message's ``id`` when it had a valid one.
    """
    obj = wire.load_json(_frame_text(frame))
    request_id = _request_id(obj) if isinstance(obj, dict) else None
    try:
        obj = _envelope(obj, CLIENT_TYPES)
        type_ = obj["type"]
        if type_ in ("hello", "publish", "receipts", "results"):  # receipts.py and results.py read theirs
            return {"type": type_, "signed": _signed(obj), "id": request_id}
        if type_ == "sample":
            return {"type": type_, "id": wire.whole(obj, "id", 0, MAX_REQUEST_ID),
                    "n": wire.whole(obj, "n", 1, MAX_SAMPLE_BATCHES), "after": _cursor(obj, "after")}
        return {"type": type_, "id": request_id}
    except ProtocolError as exc:
        exc.request_id = request_id
        raise


def _cursor(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    return wire.string(obj, key, MAX_CURSOR_CHARS, code=E_TOO_LARGE)


def decode_relay(text: str | bytes) -> dict[str, Any]:
    """A relay->client message, its shape checked."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise wire.fail(E_BAD_JSON, "message is not UTF-8") from exc
    if not isinstance(text, str):
        raise wire.fail(E_BAD_JSON, "message is not text")
    if len(text) > MAX_RESPONSE_BYTES:
        raise wire.fail(E_TOO_LARGE, f"message is larger than {MAX_RESPONSE_BYTES} bytes")
    obj = _envelope(wire.load_json(text), RELAY_TYPES)
    type_ = obj["type"]
    if type_ == "challenge":
        return {"type": type_, "nonce": wire.hex_text(obj, "nonce", NONCE_BYTES),
                "relay": wire.string(obj, "relay", 128), "time": wire.number(obj, "time")}
    if type_ == "welcome":
        # `models`: the swarm's model policy (engine/common/model_policy.py reads it); absent or not an object: not
        # declared
        return {"type": type_, "peer": wire.string(obj, "peer", PEER_ID_HEX),
                "online": wire.whole(obj, "online", 0, 10**9),
                "limits": obj.get("limits") if isinstance(obj.get("limits"), dict) else {},
                "models": obj.get("models") if isinstance(obj.get("models"), dict) else None}
    if type_ == "published":
        return {"type": type_, "seq": wire.whole(obj, "seq", 1, MAX_SEQ)}
    if type_ == "batches":
        raw = obj.get("batches")
        if not isinstance(raw, list) or len(raw) > MAX_SAMPLE_BATCHES:
            raise wire.fail(E_BAD_SCHEMA, f"'batches' must be a list of at most {MAX_SAMPLE_BATCHES}")
        batches = []
        for entry in raw:
            if not isinstance(entry, dict):
                raise wire.fail(E_BAD_SCHEMA, "each batch must be an object")
            batches.append(_signed(entry))
        return {"type": type_, "id": wire.whole(obj, "id", 0, MAX_REQUEST_ID), "batches": batches,
                "cursor": _cursor(obj, "cursor")}
    if type_ == "stats":  # `credit`: this peer's own numbers (engine/relay/credit.py), absent in most pushes;
        # `eval`: the evaluation seed the relay asks now (engine/swarm/results.py reads it)
        return {"type": type_, "online": wire.whole(obj, "online", 0, 10**9),
                "window": wire.whole(obj, "window", 0, 10**9),
                **{k: obj.get(k) if isinstance(obj.get(k), dict) else None for k in ("credit", "eval")}}
    if type_ == "scored":  # the relay's own score of this node's evaluation answers (engine/swarm/results.py)
        return {**obj, "id": _request_id(obj)}
    if type_ == "receipted":
        refused = obj.get("refused")
        return {"type": type_, "id": _request_id(obj), "counted": wire.whole(obj, "counted", 0, 10**9),
                "refused": {str(k): v for k, v in refused.items() if isinstance(v, int)} if isinstance(refused, dict)
                else {}}
    code = obj.get("code")
    return {
        "type": "error",
        "code": code if code in ERROR_CODES else E_INTERNAL,
        "message": wire.string(obj, "message", 1024),
        "id": obj.get("id") if isinstance(obj.get("id"), int) else None,
    }


# -- builders (the relay's and the client's outgoing messages) ----------------------------------
def msg_challenge(nonce: str, relay: str, now: float) -> dict[str, Any]:
    return {"type": "challenge", "v": VERSION, "nonce": nonce, "relay": relay, "time": now}


def msg_hello(signed: Signed) -> dict[str, Any]:
    return {"type": "hello", "v": VERSION, **signed.to_json()}


def msg_welcome(peer: str, online: int, limits: dict[str, Any], models: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "welcome", "v": VERSION, "peer": peer, "online": online, "limits": limits, "models": models}


def msg_publish(signed: Signed) -> dict[str, Any]:
    return {"type": "publish", "v": VERSION, **signed.to_json()}


def msg_published(seq: int) -> dict[str, Any]:
    return {"type": "published", "v": VERSION, "seq": seq}


def msg_sample(request_id: int, n: int, after: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "sample", "v": VERSION, "id": request_id, "n": n}
    if after is not None:
        out["after"] = after
    return out


def msg_batches(request_id: int, batches: list[dict[str, str]], cursor: str) -> dict[str, Any]:
    return {"type": "batches", "v": VERSION, "id": request_id, "batches": batches, "cursor": cursor}


def msg_stats(online: int, window: int, credit: dict[str, Any] | None = None,
              evaluation: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "stats", "v": VERSION, "online": online, "window": window}
    if credit is not None:
        out["credit"] = credit
    if evaluation is not None:
        out["eval"] = evaluation
    return out


def msg_stats_request() -> dict[str, Any]:
    return {"type": "stats", "v": VERSION}


def msg_receipts(signed: Signed, request_id: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "receipts", "v": VERSION, **signed.to_json()}
    if request_id is not None:
        out["id"] = request_id
    return out


def msg_receipted(request_id: int | None, counted: int, refused: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "receipted", "v": VERSION, "counted": counted, "refused": refused}
    if request_id is not None:
        out["id"] = request_id
    return out


def msg_error(code: str, message: str, request_id: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "error", "v": VERSION, "code": code, "message": message[:1024]}
    if request_id is not None:
        out["id"] = request_id
    return out


def limits(*, rate_per_s: float, burst: float, max_conn_per_ip: int, send_queue: int, window_batches: int,
           heartbeat_s: float, credit_per_round: int = DEFAULT_CREDIT_PER_ROUND,
           receipt_window_s: float = DEFAULT_RECEIPT_WINDOW_S) -> dict[str, Any]:
    """What a relay announces in its welcome: every limit of docs/protocol.md, under the names listed there."""
    return {
        "max_frame_bytes": MAX_FRAME_BYTES,
        "max_payload_chars": MAX_PAYLOAD_CHARS,
        "max_items_per_batch": MAX_ITEMS_PER_BATCH,
        "max_completions_per_item": MAX_COMPLETIONS_PER_ITEM,
        "max_completion_chars": MAX_COMPLETION_CHARS,
        "max_question_chars": MAX_QUESTION_CHARS,
        "max_task_keys": MAX_TASK_KEYS,
        "max_task_chars": MAX_TASK_CHARS,
        "max_model_chars": MAX_MODEL_CHARS,
        "max_sample_batches": MAX_SAMPLE_BATCHES,
        "max_cursor_chars": MAX_CURSOR_CHARS,
        "timestamp_window_s": TIMESTAMP_WINDOW_S,
        "handshake_timeout_s": HANDSHAKE_TIMEOUT_S,
        "heartbeat_s": heartbeat_s,
        "rate_per_s": rate_per_s,
        "burst": burst,
        "max_conn_per_ip": max_conn_per_ip,
        "send_queue": send_queue,
        "window_batches": window_batches,
        "max_receipt_items": MAX_SAMPLE_BATCHES * MAX_ITEMS_PER_BATCH,
        "credit_per_round": credit_per_round,
        "receipt_window_s": receipt_window_s,
    }

