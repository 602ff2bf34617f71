"""Two relay processes on one real redis-server share one swarm (Redis Streams)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from engine.swarm import protocol as p
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, item

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (make test installs it)")


@pytest.fixture
def redis_url() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert REDIS is not None
    proc = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _joined(url: str) -> DocPeer:
    peer = DocPeer(url)
    assert (await peer.connect())["type"] == "welcome"
    return peer


async def test_two_relays_share_batches_sequences_and_peer_counts(start_relay: StartRelay, redis_url: str) -> None:
    one = start_relay(redis=redis_url)
    two = start_relay(redis=redis_url)
    a, b = await _joined(one.url), await _joined(two.url)
    assert (await a.publish([item()], seq=100))["type"] == "published"
    deadline = time.monotonic() + 10
    got: list[dict[str, str]] = []
    while not got and time.monotonic() < deadline:
        got = (await b.sample(4))["batches"]
        await asyncio.sleep(0.1)
    assert len(got) == 1  # published through relay one, sampled through relay two
    # sequence numbers are shared: a replay through the other relay is refused too
    a2 = DocPeer(two.url, key=a.key)
    assert (await a2.connect())["type"] == "welcome"
    assert (await a2.publish([item()], seq=100))["code"] == p.E_REPLAY
    assert (await a2.publish([item()], seq=101))["type"] == "published"
    # a third relay started later primes its window from the stream
    three = start_relay(redis=redis_url)
    c = await _joined(three.url)
    assert len((await c.sample(16))["batches"]) == 2
    for peer in (a, a2, b, c):
        await peer.close()
