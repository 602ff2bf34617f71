"""The wire format: round trips, limits, and a fuzzed decoder that only ever raises ProtocolError."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.swarm import protocol as p
from engine.swarm.identity import Identity, verify_signed

ID = Identity.generate()


def _item(**kw: object) -> p.Item:
    base: dict[str, object] = {
        "task": {"dataset": "basic_arithmetic", "config": {}, "seed": 0, "index": 3},
        "question": "What is 2 + 2?",
        "completions": ("<answer>4</answer>", "<answer>5</answer>"),
        "rewards": (1.0, 0.0),
    }
    base.update(kw)
    return p.Item(**base)  # type: ignore[arg-type]


def test_batch_round_trip_and_signature_over_exact_bytes() -> None:
    payload = p.batch_payload(ID.public_key, 5, time.time(), "bundled", [_item()])
    batch = p.decode_batch(payload)
    assert batch.peer == ID.peer_id and batch.seq == 5 and batch.items[0].completions[0] == "<answer>4</answer>"
    signed = ID.signed(payload)
    assert verify_signed(signed, ID.public_key)
    # the same JSON, re-serialised with other spacing, is not what was signed
    respaced = json.dumps(json.loads(payload), indent=1)
    assert not verify_signed(p.Signed(respaced, signed.sig), ID.public_key)
    assert not verify_signed(p.Signed(payload, signed.sig), Identity.generate().public_key)


def test_client_and_relay_messages_decode() -> None:
    signed = ID.signed(p.batch_payload(ID.public_key, 1, time.time(), "m", [_item()]))
    decoded = p.decode_client(p.encode(p.msg_publish(signed)))
    assert decoded["signed"] == signed
    assert p.decode_client(p.encode(p.msg_sample(9, 3))) == {"type": "sample", "id": 9, "n": 3, "after": None}
    assert p.decode_client(p.encode(p.msg_sample(9, 3, "m1.5-0")))["after"] == "m1.5-0"
    batches = p.decode_relay(p.encode(p.msg_batches(9, [signed.to_json()], "m1.5-0")))
    assert batches["batches"] == [signed] and batches["cursor"] == "m1.5-0"
    err = p.decode_relay(p.encode(p.msg_error(p.E_RATE, "slow down", 9)))
    assert err == {"type": "error", "code": p.E_RATE, "message": "slow down", "id": 9}
    assert p.decode_relay(p.encode(p.msg_error("made_up", "x")))["code"] == p.E_INTERNAL


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda d: d.update(items=[]), p.E_BAD_SCHEMA),
        (lambda d: d.update(items=[d["items"][0]] * (p.MAX_ITEMS_PER_BATCH + 1)), p.E_TOO_MANY_ITEMS),
        (lambda d: d["items"][0].update(completions=["a"] * 17, rewards=[0] * 17), p.E_TOO_MANY_ITEMS),
        (lambda d: d["items"][0].update(completions=["a" * (p.MAX_COMPLETION_CHARS + 1)], rewards=[0]), p.E_TOO_LONG),
        (lambda d: d["items"][0].update(question="q" * (p.MAX_QUESTION_CHARS + 1)), p.E_TOO_LARGE),
        (lambda d: d["items"][0].update(rewards=[1.0]), p.E_BAD_SCHEMA),
        (lambda d: d["items"][0].update(rewards=[True, 0]), p.E_BAD_SCHEMA),
        (lambda d: d.update(seq=0), p.E_BAD_SCHEMA),
        (lambda d: d.update(seq=2**60), p.E_BAD_SCHEMA),
        (lambda d: d.update(key="AAAA"), p.E_BAD_SCHEMA),
        (lambda d: d.update(kind="hello"), p.E_BAD_SCHEMA),
        (lambda d: d["items"][0].update(task={str(i): i for i in range(9)}), p.E_BAD_SCHEMA),
        (lambda d: d["items"][0].update(completions=["\ud800"], rewards=[0]), p.E_BAD_SCHEMA),
    ],
)
def test_batch_limits_have_named_errors(mutate: object, code: str) -> None:
    data = json.loads(p.batch_payload(ID.public_key, 1, time.time(), "m", [_item()]))
    mutate(data)  # type: ignore[operator]
    with pytest.raises(p.ProtocolError) as err:
        p.decode_batch(json.dumps(data))
    assert err.value.code == code


def test_nan_and_wrong_versions_are_refused() -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.decode_batch('{"kind":"batch","ts":NaN}')
    assert err.value.code == p.E_BAD_JSON
    with pytest.raises(p.ProtocolError) as err:
        p.decode_client('{"type":"sample","v":2,"id":1,"n":1}')
    assert err.value.code == p.E_VERSION
    with pytest.raises(p.ProtocolError) as err:
        p.decode_client(b"x" * (p.MAX_FRAME_BYTES + 1))
    assert err.value.code == p.E_TOO_LARGE


def test_timestamp_window() -> None:
    p.check_timestamp(1000.0, 1000.0 + p.TIMESTAMP_WINDOW_S)
    with pytest.raises(p.ProtocolError) as err:
        p.check_timestamp(1000.0, 1001.0 + p.TIMESTAMP_WINDOW_S)
    assert err.value.code == p.E_STALE


# -- fuzzing: nothing but ProtocolError escapes any decoder ---------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20,
)
KEYS = st.sampled_from(["type", "v", "payload", "sig", "id", "n", "nonce", "batches", "code", "message", "kind",
                        "key", "seq", "ts", "items", "task", "question", "completions", "rewards", "online", "window"])
MESSAGES = st.fixed_dictionaries(
    {"type": st.sampled_from([*p.CLIENT_TYPES, *p.RELAY_TYPES, "x"]), "v": st.sampled_from([1, 1, 1, 2, "1", True])},
    optional={k: JSON for k in ["payload", "sig", "id", "n", "nonce", "batches", "code", "message", "online", "window",
                                "relay", "time", "peer", "seq", "limits"]},
) | st.dictionaries(KEYS, JSON, max_size=8)
VALID_PAYLOAD = p.batch_payload(ID.public_key, 1, 1.0, "m", [_item()])


def _only_protocol_errors(fn: object, arg: object) -> None:
    try:
        fn(arg)  # type: ignore[operator]
    except p.ProtocolError as exc:
        assert exc.code in p.ERROR_CODES


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=MESSAGES, as_bytes=st.booleans())
def test_fuzz_message_decoders(message: dict[str, object], as_bytes: bool) -> None:
    text = json.dumps(message)
    raw: str | bytes = text.encode() if as_bytes else text
    _only_protocol_errors(p.decode_client, raw)
    _only_protocol_errors(p.decode_relay, raw)


@settings(max_examples=600, deadline=None)
@given(data=st.binary(max_size=200) | st.text(max_size=200))
def test_fuzz_garbage_frames(data: str | bytes) -> None:
    _only_protocol_errors(p.decode_client, data)
    _only_protocol_errors(p.decode_relay, data)
    if isinstance(data, str):
        _only_protocol_errors(p.decode_batch, data)
        _only_protocol_errors(p.decode_hello_payload, data)


@settings(max_examples=600, deadline=None)
@given(data=st.data())
def test_fuzz_mutated_batch_payloads(data: st.DataObject) -> None:
    text = VALID_PAYLOAD
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 8)))
        text = text[:i] + data.draw(st.text(max_size=6)) + text[j:]
    _only_protocol_errors(p.decode_batch, text)
