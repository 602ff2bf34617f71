"""Credit from receipts, end to end: two real nodes (tiny models) and a real relay, three rounds.

    .venv/bin/python -m pytest -q tests/swarm/test_credit.py

The relay's credit for each node must equal, item for item, what the other
node's own metrics say it did with that node's items; forged, duplicated and
never-sampled receipts change nothing; `sapling-node stats` and
`GET /stats/peers.json` show the same numbers.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine.common.events import Event
from engine.common.paths import Paths
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer
from tests.swarm.test_mix import swarm_node

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration  # a relay, two nodes and a `sapling-node stats` process


def board(url: str) -> dict[str, dict[str, Any]]:
    text = urllib.request.urlopen(url.replace("ws://", "http://").replace("/ws", "/stats/peers.json")).read().decode()
    assert "127.0.0.1" not in text  # names and peer ids, never addresses
    return {entry["peer"]: entry for entry in json.loads(text)["peers"]}


def key_of(home: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Paths.under(home).identity_file.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def what_receiver_did(metrics: dict[str, Any], sender: str) -> dict[str, Any]:
    """The receiver's own account of one sender's items over the run (its last round's run totals)."""
    peer = metrics["swarm"]["by_peer"].get(sender, {})
    return {"used": peer.get("accepted", 0), "not_picked": peer.get("not_picked", 0),
            "rejected": {k: v for k, v in peer.get("reasons", {}).items() if v}}


def credited(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry["all"][k] for k in ("used", "not_picked", "rejected")}


def test_the_relay_credits_each_node_with_what_the_other_node_used_item_for_item(
        tiny_model_dir: Path, tmp_path: Path, start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    events: dict[str, list[Event]] = {"a": [], "b": []}
    homes = {name: tmp_path / name for name in events}
    nodes = {name: swarm_node(tiny_model_dir, homes[name], relay.url, seed, events[name])
             for name, seed in (("a", 1), ("b", 2))}
    ids = {name: session.exchange.identity.peer_id for name, (_node, session) in nodes.items()}
    last: dict[str, dict[str, Any]] = {}
    try:
        for _node, session in nodes.values():
            assert session.exchange.client.wait_connected(10)
        for _ in range(3):
            for name, (node, _session) in nodes.items():
                last[name] = node.run_round()
        expected = {"a": what_receiver_did(last["b"], ids["a"]), "b": what_receiver_did(last["a"], ids["b"])}
        assert expected["a"]["used"] > 0 and expected["b"]["used"] > 0  # the swarm did share
        deadline = time.monotonic() + 20  # the last round's receipts travel after its metrics were written
        while {n: credited(board(relay.url).get(ids[n], {"all": {"used": 0, "not_picked": 0, "rejected": {}}}))
               for n in ids} != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        entries = board(relay.url)
        assert {n: credited(entries[ids[n]]) for n in ids} == expected
        for name in ids:
            assert entries[ids[name]]["all"]["peers"] == 1  # one other peer used its items
            assert entries[ids[name]]["name"] == nodes[name][1].exchange.identity.name
        # every item the relay handed was settled by a receipt: sampled = used + rejected + not picked
        for name in ids:
            total = entries[ids[name]]["all"]
            assert total["sampled"] == total["used"] + total["not_picked"] + sum(total["rejected"].values())

        # the node's own view: `sapling-node stats` asks the relay with a signed handshake
        out = subprocess.run([sys.executable, "-m", "engine.cli", "stats", "--home", str(homes["a"]), "--relay",
                              relay.url, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["source"] == "relay" and report["peer_id"] == ids["a"]
        assert {k: report["credit"]["all"][k] for k in ("used", "not_picked", "rejected")} == expected["a"]
        assert report["credit"]["day"]["used"] == expected["a"]["used"]
        text = subprocess.run([sys.executable, "-m", "engine.cli", "stats", "--home", str(homes["a"]), "--relay",
                               relay.url], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert text.returncode == 0, text.stderr
        assert f"Your rollouts were used by 1 peer today ({expected['a']['used']} rollout" in text.stdout

        a_items = asyncio.run(_a_items(relay.url, ids["a"]))
        assert len(a_items) == entries[ids["a"]]["all"]["shared"]
        before = {n: asyncio.run(credit_of(relay.url, key_of(homes[n]))) for n in ids}
        asyncio.run(_bad_receipts(relay.url, key_of(homes["b"]), ids["a"], a_items))
        after = {n: asyncio.run(credit_of(relay.url, key_of(homes[n]))) for n in ids}
        assert after == before
        assert before["a"]["all"] == board(relay.url)[ids["a"]]["all"]
    finally:
        for _node, session in nodes.values():
            session.close()


async def credit_of(url: str, key: Ed25519PrivateKey) -> dict[str, Any]:
    """A peer's credit as the relay tells that peer itself (a stats request, read fresh)."""
    peer = DocPeer(url, key=key)
    assert (await peer.connect())["type"] == "welcome"
    credit = await peer.credit()
    await peer.close()
    return credit


async def _bad_receipts(url: str, b_key: Ed25519PrivateKey, a_peer: str, a_items: list[tuple[int, int]]) -> None:
    """A duplicated receipt (B again), one for items never handed (C), and forged ones (another key)."""
    b = DocPeer(url, key=b_key)
    assert (await b.connect())["type"] == "welcome"
    c = DocPeer(url)
    assert (await c.connect())["type"] == "welcome"
    duplicate = await b.receipts({a_peer: [{"seq": s, "i": i, "verdict": "used", "positive": 1} for s, i in a_items]})
    assert duplicate == {"type": "receipted", "v": 1, "counted": 0, "refused": {"duplicate": len(a_items)}}
    never = await c.receipts({a_peer: [{"seq": s, "i": i, "verdict": "used", "positive": 1} for s, i in a_items]})
    assert never == {"type": "receipted", "v": 1, "counted": 0, "refused": {"not_sampled": len(a_items)}}
    # B's receipt signed with C's key, and C's own receipt sent over B's connection: both bad_signature
    forged = await c.receipts({a_peer: [{"seq": a_items[0][0], "i": 0, "verdict": "used", "positive": 1}]},
                              request_id=9, key=b.public)
    assert forged["type"] == "error" and forged["code"] == "bad_signature" and forged["id"] == 9
    payload = c.receipts_payload({a_peer: [{"seq": a_items[0][0], "i": 0, "verdict": "used", "positive": 1}]})
    await b.send({"type": "receipts", "v": 1, "payload": payload, "sig": c.sign(payload), "id": 10})
    assert (await b.recv())["code"] == "bad_signature"
    for peer in (b, c):
        await peer.close()


async def _a_items(url: str, a_peer: str) -> list[tuple[int, int]]:
    """(seq, i) of every item A published, from an observer's sample (which counts as `sampled`: the
    caller reads its "before" after this), for which the observer sends no receipt."""
    observer = DocPeer(url)
    assert (await observer.connect())["type"] == "welcome"
    got = await observer.sample(16)
    await observer.close()
    items = []
    for batch in got["batches"]:
        payload = json.loads(batch["payload"])
        if hashlib.sha256(base64.b64decode(payload["key"])).hexdigest()[:20] == a_peer:
            items += [(payload["seq"], i) for i in range(len(payload["items"]))]
    return items
