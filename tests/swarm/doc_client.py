"""A relay client written from docs/protocol.md alone, used to test the relay.

It imports nothing from engine.swarm on purpose: if the relay and the
document drift apart, these tests notice. It is deliberately low level, so
tests can also send what an honest client never would. `sample_new` is the
page's "Sampling cursors": it keeps the last answer's cursor and sends it
as `after`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import urllib.request
from typing import Any

import aiohttp
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


class DocPeer:
    def __init__(self, url: str, token: str = "", key: Ed25519PrivateKey | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.headers = headers or {}  # sent with the websocket's opening request (X-Forwarded-For, say)
        self.token = token
        self.key = key or Ed25519PrivateKey.generate()
        self.public = self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.peer_id = hashlib.sha256(self.public).hexdigest()[:20]
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.seq = 0
        self.cursor: str | None = None  # the `cursor` of the last `batches` that sample_new got

    def sign(self, payload: str) -> str:
        return b64(self.key.sign(payload.encode("utf-8")))

    async def connect(self, *, hello: bool = True, nonce: str | None = None, ts: float | None = None,
                      bad_sig: bool = False, answer_pings: bool = True) -> dict[str, Any]:
        """Open the socket and (optionally) do the handshake; returns the relay's answer to hello.

        With answer_pings=False the socket never answers the relay's pings (a silent client).
        """
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(self.url, max_msg_size=0, autoping=answer_pings, headers=self.headers)
        challenge = await self.recv()
        assert challenge["type"] == "challenge", challenge
        if not hello:
            return challenge
        payload = json.dumps({
            "kind": "hello", "key": b64(self.public), "nonce": nonce or challenge["nonce"],
            "ts": time.time() if ts is None else ts, "token": self.token, "software": "doc-client/1",
        })
        sig = self.sign(payload if not bad_sig else payload + " ")
        await self.send({"type": "hello", "v": 1, "payload": payload, "sig": sig})
        return await self.recv()

    async def send(self, message: dict[str, Any]) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps(message))

    async def send_raw(self, text: str) -> None:
        assert self.ws is not None
        await self.ws.send_str(text)

    async def send_binary(self, data: bytes) -> None:
        assert self.ws is not None
        await self.ws.send_bytes(data)

    async def recv(self, timeout: float = 10.0, skip_stats: bool = True) -> dict[str, Any]:
        """The next message (stats pushes and pings skipped); {'type': 'closed', 'code': ...} once closed."""
        assert self.ws is not None
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), timeout)
            if msg.type in (aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG):
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                return {"type": "closed", "code": self.ws.close_code}
            data = json.loads(msg.data)
            if skip_stats and data.get("type") == "stats":
                continue
            return data

    def batch_payload(self, items: list[dict[str, Any]], *, seq: int | None = None, ts: float | None = None,
                      key: bytes | None = None) -> str:
        if seq is None:
            self.seq = max(self.seq + 1, int(time.time() * 1000))
            seq = self.seq
        return json.dumps({
            "kind": "batch", "key": b64(key or self.public), "seq": seq, "ts": time.time() if ts is None else ts,
            "model": "doc-client", "items": items,
        })

    async def publish(self, items: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
        payload = self.batch_payload(items, **kw)
        await self.send({"type": "publish", "v": 1, "payload": payload, "sig": self.sign(payload)})
        return await self.recv()

    async def sample(self, n: int, request_id: int = 1, after: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "sample", "v": 1, "id": request_id, "n": n}
        if after is not None:
            message["after"] = after
        await self.send(message)
        return await self.recv()

    async def sample_new(self, n: int, request_id: int = 1) -> dict[str, Any]:
        """A sample of what was published since the last sample_new (the whole window the first time)."""
        answer = await self.sample(n, request_id, after=self.cursor)
        if answer.get("type") == "batches" and answer.get("cursor") is not None:
            self.cursor = answer["cursor"]
        return answer

    def receipts_payload(self, senders: dict[str, list[dict[str, Any]]], *, ts: float | None = None,
                         key: bytes | None = None) -> str:
        """The page's "Receipts": {sender peer id: [{"seq", "i", "verdict", "positive"?}, ...]}."""
        return json.dumps({
            "kind": "receipts", "key": b64(key or self.public), "ts": time.time() if ts is None else ts,
            "senders": [{"peer": peer, "items": items} for peer, items in senders.items()],
        })

    async def receipts(self, senders: dict[str, list[dict[str, Any]]], request_id: int | None = None,
                       signer: Ed25519PrivateKey | None = None, **kw: Any) -> dict[str, Any]:
        """Send one receipts message (signed by `signer`, by default this peer's key); the relay's answer."""
        payload = self.receipts_payload(senders, **kw)
        sig = b64((signer or self.key).sign(payload.encode("utf-8")))
        message: dict[str, Any] = {"type": "receipts", "v": 1, "payload": payload, "sig": sig}
        if request_id is not None:
            message["id"] = request_id
        await self.send(message)
        return await self.recv()

    async def credit(self, timeout: float = 10.0) -> dict[str, Any]:
        """Ask for `stats` and return the `credit` of the first stats message that carries one."""
        await self.send({"type": "stats", "v": 1})
        while True:
            answer = await self.recv(timeout, skip_stats=False)
            if answer.get("type") == "stats" and isinstance(answer.get("credit"), dict):
                return answer["credit"]
            assert answer.get("type") == "stats", answer

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()


def item(question: str = "What is 1 + 1?", completions: tuple[str, ...] = ("<answer>2</answer>", "<answer>3</answer>"),
         task: dict[str, Any] | None = None, rewards: list[float | None] | None = None) -> dict[str, Any]:
    return {
        "task": task or {"dataset": "basic_arithmetic", "config": {}, "seed": 0, "index": 0},
        "question": question,
        "completions": list(completions),
        "rewards": rewards if rewards is not None else [None] * len(completions),
    }


async def joined(url: str, **kw: object) -> DocPeer:
    """A peer through the handshake, welcomed under its own id."""
    peer = DocPeer(url, **kw)  # type: ignore[arg-type]
    welcome = await peer.connect()
    assert welcome["type"] == "welcome", welcome
    assert welcome["peer"] == peer.peer_id
    return peer


def http_text(relay_url: str, path: str) -> str:
    """The body of the relay's plain HTTP page `path` (its websocket URL's host and port)."""
    return urllib.request.urlopen(relay_url.replace("ws://", "http://").replace("/ws", path)).read().decode()
