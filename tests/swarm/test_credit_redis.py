"""Credit across two `sapling-relay` processes on one real redis-server: one count, whichever process a peer uses."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.servers import RedisServer, free_port, wait_listening
from tests.swarm.doc_client import DocPeer, item

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("redis-server") is None,
                       reason="redis-server is not installed (make test installs it)"),
]


@pytest.fixture
def relay_process(tmp_path: Path) -> Iterator[Callable[..., str]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(redis: str, *extra: str) -> str:
        port = free_port()
        log = tmp_path / f"relay-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "engine.relay", "--port", str(port), "--redis", redis,
                                     "--data-dir", str(tmp_path / "relay"), "--rate", "1000", "--burst", "1000",
                                     *extra], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        started.append(proc)
        wait_listening(port, proc, "the relay", log)
        return f"ws://127.0.0.1:{port}/ws"

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=15)


def board(url: str) -> dict[str, Any]:
    text = urllib.request.urlopen(url.replace("ws://", "http://").replace("/ws", "/stats/peers.json")).read()
    return {p["peer"]: p["all"] for p in json.loads(text)["peers"]}


async def joined(url: str, **kw: Any) -> DocPeer:
    peer = DocPeer(url, **kw)
    assert (await peer.connect())["type"] == "welcome"
    return peer


def test_a_sender_sees_the_same_credit_on_either_relay_process(relay_process: Callable[[str], str],
                                                               redis_server: RedisServer) -> None:
    one, two = relay_process(redis_server.url), relay_process(redis_server.url)

    async def run() -> None:
        a, b = await joined(one), await joined(two)
        assert (await a.publish([item(), item(question="What is 2 + 2?")]))["type"] == "published"
        batches: list[dict[str, str]] = []
        deadline = time.monotonic() + 10
        while not batches and time.monotonic() < deadline:  # relay two tails the stream
            batches = (await b.sample(4))["batches"]
        seq = json.loads(batches[0]["payload"])["seq"]
        answer = await b.receipts({a.peer_id: [{"seq": seq, "i": 0, "verdict": "used", "positive": 1},
                                               {"seq": seq, "i": 1, "verdict": "implausible"}]})
        assert answer["counted"] == 2
        a_on_two = await joined(two, key=a.key)
        on_one, on_two = await a.credit(), await a_on_two.credit()
        assert on_one == on_two
        assert on_one["all"] == {"shared": 2, "sampled": 2, "used": 1, "positive": 1, "not_picked": 0,
                                 "same_address": 0, "peers": 1, "rejected": {"implausible": 1}}
        # the receiver moves to the other process: what it already receipted stays receipted
        b_on_one = await joined(one, key=b.key)
        again = await b_on_one.receipts({a.peer_id: [{"seq": seq, "i": 0, "verdict": "used", "positive": 1}]})
        assert again["counted"] == 0 and again["refused"] == {"duplicate": 1}
        # and a peer that sampled nothing, on either process, counts nothing
        c = await joined(one)
        never = await c.receipts({a.peer_id: [{"seq": seq, "i": 0, "verdict": "used", "positive": 1}]})
        assert never["refused"] == {"not_sampled": 1}
        assert await a.credit() == on_one
        for peer in (a, b, a_on_two, b_on_one, c):
            await peer.close()

    asyncio.run(run())
    both = [board(one), board(two)]
    assert both[0] == both[1] and [entry["used"] for entry in both[0].values()] == [1]


def test_a_used_receipt_from_the_senders_address_is_refused_on_the_other_relay_process_too(
        relay_process: Callable[..., str], redis_server: RedisServer) -> None:
    """The sender's address (its hash) travels through Redis: a key on its address gains nothing on either process."""
    one, two = (relay_process(redis_server.url, "--trusted-proxy", "127.0.0.1") for _ in range(2))

    async def run() -> None:
        farm = {"X-Forwarded-For": "203.0.113.66"}
        a = await joined(one, headers=farm)
        assert (await a.publish([item(), item(question="What is 2 + 2?")]))["type"] == "published"
        board(one)  # the relay writes what it counted (the address with it) before answering
        answers = []
        for address in ("203.0.113.66", "198.51.100.7"):
            b = await joined(two, headers={"X-Forwarded-For": address})
            batches: list[dict[str, str]] = []
            deadline = time.monotonic() + 10
            while not batches and time.monotonic() < deadline:  # relay two tails the stream
                batches = (await b.sample(4))["batches"]
            seq = json.loads(batches[0]["payload"])["seq"]
            answers.append(await b.receipts({a.peer_id: [{"seq": seq, "i": 0, "verdict": "used", "positive": 1}]}))
            await b.close()
        assert [(x["counted"], x["refused"]) for x in answers] == [(0, {"same_address": 1}), (1, {})]
        assert (board(two)[a.peer_id]["used"], board(two)[a.peer_id]["same_address"]) == (1, 1)
        await a.close()

    asyncio.run(run())



def test_a_relay_whose_redis_stopped_answering_still_stops_when_asked(redis_server: RedisServer,
                                                                      tmp_path: Path) -> None:
    """Redis frozen (SIGSTOP: connections open, no answers) with counts waiting to be written: SIGTERM still ends
    the relay, within the bound on closing its stores (engine/relay/server.py CLOSE_STORES_S) and the
    connections' grace; before that bound a stop waited out every Redis timeout and retry."""
    import signal

    from engine.relay.server import CLOSE_STORES_S, DROP_GRACE_S

    port = free_port()
    log = tmp_path / "relay.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "engine.relay", "--port", str(port), "--redis",
                                 redis_server.url, "--data-dir", str(tmp_path / "relay")],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    assert redis_server.proc is not None
    try:
        wait_listening(port, proc, "the relay", log)

        async def publish() -> None:
            peer = await joined(f"ws://127.0.0.1:{port}/ws")
            assert (await peer.publish([item()]))["type"] == "published"  # a count for the stats tick to write
            await peer.close()

        asyncio.run(publish())
        redis_server.proc.send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        proc.terminate()
        try:
            proc.wait(timeout=CLOSE_STORES_S + DROP_GRACE_S + 15)
        except subprocess.TimeoutExpired:
            pytest.fail("the relay did not stop while Redis was not answering:\n" + log.read_text())
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
