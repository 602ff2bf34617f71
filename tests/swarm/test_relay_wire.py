"""The relay's answers to what docs/protocol.md forbids: its limits table, every error code and close code.

The client is tests/swarm/doc_client.py, written from the protocol page alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import pytest

from engine.swarm import protocol as p
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, b64, item, joined

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration  # every test here starts a relay


# -- issue 14: the relay against docs/protocol.md, one test per difference found ----------------
DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")


def _doc_limits() -> dict[str, float]:
    """The limits table of docs/protocol.md: `limits` key -> value."""
    section = DOC[DOC.index("## Limits"):DOC.index("## Errors")]
    rows = re.findall(r"^\| `([a-z_]+)` \| ([0-9.]+) \|", section, flags=re.MULTILINE)
    return {key: float(value) for key, value in rows}


async def test_welcome_limits_repeat_the_pages_table_with_this_relays_flags(start_relay: StartRelay) -> None:
    documented = _doc_limits()
    assert len(documented) == 22
    relay = start_relay()
    peer = DocPeer(relay.url)
    welcome = await peer.connect()
    assert welcome["limits"] == documented  # every key, every default value, nothing else
    await peer.close()
    tuned = start_relay(rate=5.0, burst=7.0, max_conn_per_ip=3, send_queue=9, window=11, heartbeat=13.0)
    peer = DocPeer(tuned.url)
    limits = (await peer.connect())["limits"]
    assert {k: limits[k] for k in ("rate_per_s", "burst", "max_conn_per_ip", "send_queue", "window_batches",
                                   "heartbeat_s")} == {"rate_per_s": 5, "burst": 7, "max_conn_per_ip": 3,
                                                       "send_queue": 9, "window_batches": 11, "heartbeat_s": 13}
    await peer.close()


@pytest.mark.parametrize("n", [None, "4", 0, 17, 2.5, True])
async def test_a_bad_sample_gets_bad_schema_with_its_id(start_relay: StartRelay, n: object) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    message: dict[str, object] = {"type": "sample", "v": 1, "id": 41}
    if n is not None:
        message["n"] = n
    await peer.send(message)
    assert await peer.recv() == {"type": "error", "v": 1, "code": p.E_BAD_SCHEMA, "message": ANY_TEXT, "id": 41}
    # a request whose id is itself broken cannot be named: bad_schema without an id
    await peer.send({"type": "sample", "v": 1, "id": -1, "n": 1})
    answer = await peer.recv()
    assert answer["code"] == p.E_BAD_SCHEMA and "id" not in answer
    await peer.send({"type": "sample", "v": 1, "n": 1})
    answer = await peer.recv()
    assert answer["code"] == p.E_BAD_SCHEMA and "id" not in answer
    await peer.close()


async def test_an_error_about_any_message_with_an_id_carries_it(start_relay: StartRelay) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    payload = peer.batch_payload([item()])
    await peer.send({"type": "publish", "v": 1, "id": 8, "payload": payload, "sig": b64(b"\0" * 64)})
    answer = await peer.recv()
    assert answer["code"] == p.E_BAD_SIGNATURE and answer["id"] == 8
    await peer.send({"type": "publish", "v": 1, "id": 9, "payload": payload + "x", "sig": peer.sign(payload + "x")})
    answer = await peer.recv()
    assert answer["code"] == p.E_BAD_JSON and answer["id"] == 9
    await peer.close()


class _AnyText(str):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)

    __hash__ = str.__hash__


ANY_TEXT = _AnyText()


async def test_a_model_name_over_128_characters_is_too_large(start_relay: StartRelay) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    payload = json.loads(peer.batch_payload([item()]))
    payload["model"] = "m" * 129
    text = json.dumps(payload)
    await peer.send({"type": "publish", "v": 1, "payload": text, "sig": peer.sign(text)})
    assert (await peer.recv())["code"] == p.E_TOO_LARGE
    payload["model"] = "é" * 128  # 128 characters (256 bytes) is allowed
    payload["seq"] = peer.seq + 1
    text = json.dumps(payload, ensure_ascii=False)
    await peer.send({"type": "publish", "v": 1, "payload": text, "sig": peer.sign(text)})
    assert (await peer.recv())["type"] == "published"
    await peer.close()


async def test_the_payload_limit_counts_characters_not_bytes(start_relay: StartRelay) -> None:
    relay = start_relay()
    peer = await joined(relay.url)

    async def publish(items: list[dict[str, object]]) -> dict[str, object]:
        peer.seq += 1
        text = json.dumps({"kind": "batch", "key": b64(peer.public), "seq": peer.seq, "ts": time.time(),
                           "model": "doc", "items": items}, ensure_ascii=False)
        frame = json.dumps({"type": "publish", "v": 1, "payload": text, "sig": peer.sign(text)}, ensure_ascii=False)
        assert len(frame.encode("utf-8")) <= p.MAX_FRAME_BYTES
        await peer.send_raw(frame)
        return await peer.recv()

    # 128,000+ characters of "é": 256,000+ UTF-8 bytes, more than MAX_PAYLOAD_CHARS bytes, fewer characters
    wide = [item(completions=tuple("é" * 8000 for _ in range(16)))]
    text_len = len(json.dumps(wide, ensure_ascii=False))
    assert text_len < p.MAX_PAYLOAD_CHARS < len(json.dumps(wide, ensure_ascii=False).encode("utf-8"))
    assert (await publish(wide))["type"] == "published"
    # over MAX_PAYLOAD_CHARS characters (ASCII, so the frame still fits): too_large
    long = [item(completions=tuple("x" * 7700 for _ in range(16)))] * 2
    assert len(json.dumps(long)) > p.MAX_PAYLOAD_CHARS
    assert (await publish(long))["code"] == p.E_TOO_LARGE
    await peer.close()


async def test_binary_frames_are_read_as_text_and_invalid_utf8_text_closes_1007(start_relay: StartRelay) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    await peer.send_binary(json.dumps({"type": "sample", "v": 1, "id": 5, "n": 1}).encode())
    answer = await peer.recv()
    assert answer["type"] == "batches" and answer["id"] == 5
    await peer.send_binary(b"\xff\xfe{}")
    assert (await peer.recv())["code"] == p.E_BAD_JSON  # binary that is not UTF-8: refused, still open
    await peer.send({"type": "stats", "v": 1})
    assert (await peer.recv(skip_stats=False))["type"] == "stats"
    await peer.close()
    assert await _raw_invalid_text_frame(relay.url) == 1007


async def _raw_invalid_text_frame(url: str) -> int:
    """Send a text frame whose bytes are not UTF-8 (no websocket library will), return the close code."""
    host, port = url.removeprefix("ws://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    key = b64(os.urandom(16))
    writer.write(f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    assert b" 101 " in await reader.readuntil(b"\r\n\r\n")
    body, mask = b"\xc3\x28", os.urandom(4)
    writer.write(bytes([0x81, 0x80 | len(body)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(body)))
    await writer.drain()
    try:
        while True:  # the challenge first, then the close frame
            head = await asyncio.wait_for(reader.readexactly(2), 10)
            size = head[1] & 0x7F
            if size == 126:
                size = int.from_bytes(await reader.readexactly(2), "big")
            data = await reader.readexactly(size)
            if head[0] & 0x0F == 0x8:
                return int.from_bytes(data[:2], "big")
    finally:
        writer.close()


@pytest.mark.parametrize(("frame", "code"), [
    ('{"type":"stats","v":1,"x":NaN}', p.E_BAD_JSON),
    ('{"type":"stats","v":1,"x":Infinity}', p.E_BAD_JSON),
    ('{"type":"stats","v":1,"x":1e999}', p.E_BAD_JSON),
])
async def test_non_finite_numbers_in_a_message_are_bad_json(start_relay: StartRelay, frame: str, code: str) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    await peer.send_raw(frame)
    assert (await peer.recv())["code"] == code
    await peer.close()


@pytest.mark.parametrize(("payload_text", "code"), [
    (lambda d: json.dumps(d).replace('"ts": ', '"ts": NaN, "x": '), p.E_BAD_JSON),
    (lambda d: json.dumps({**d, "ts": 1e999}).replace("Infinity", "1e999"), p.E_BAD_JSON),
    (lambda d: json.dumps(d).replace("<answer>2</answer>", "\\ud800"), p.E_BAD_SCHEMA),
    (lambda d: json.dumps({**d, "items": [{**d["items"][0], "rewards": [1.0]}]}), p.E_BAD_SCHEMA),
])
async def test_payload_numbers_surrogates_and_reward_lengths_have_their_codes(
        start_relay: StartRelay, payload_text: object, code: str) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    text = payload_text(json.loads(peer.batch_payload([item()])))  # type: ignore[operator]
    await peer.send({"type": "publish", "v": 1, "payload": text, "sig": peer.sign(text)})
    assert (await peer.recv())["code"] == code
    await peer.close()


async def test_a_second_hello_is_bad_schema_and_the_connection_stays(start_relay: StartRelay) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    payload = json.dumps({"kind": "hello", "key": b64(peer.public), "nonce": "ab" * 32, "ts": time.time(),
                          "token": "", "software": "doc"})
    await peer.send({"type": "hello", "v": 1, "payload": payload, "sig": peer.sign(payload)})
    assert (await peer.recv())["code"] == p.E_BAD_SCHEMA
    assert (await peer.publish([item()]))["type"] == "published"
    await peer.close()


@pytest.mark.parametrize("first", [
    "{not json", '{"type":"hello","v":1}', '{"type":"hello","v":1,"payload":"{}","sig":"AAAA"}',
    '{"type":"stats","v":1}', "[1]",
])
async def test_a_malformed_hello_is_not_authenticated_and_closed_1008(start_relay: StartRelay, first: str) -> None:
    relay = start_relay()
    peer = DocPeer(relay.url)
    await peer.connect(hello=False)
    await peer.send_raw(first)
    assert (await peer.recv())["code"] == p.E_AUTH
    assert await peer.recv() == {"type": "closed", "code": 1008}
    await peer.close()
