"""Two relay processes on one real redis-server share one swarm (Redis Streams)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest

from bench.harness.servers import RedisServer
from engine.swarm import protocol as p
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, item

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (make test installs it)")


async def _joined(url: str) -> DocPeer:
    peer = DocPeer(url)
    assert (await peer.connect())["type"] == "welcome"
    return peer


@pytest.mark.integration
async def test_two_relays_share_batches_sequences_and_peer_counts(start_relay: StartRelay,
                                                                 redis_server: RedisServer) -> None:
    one = start_relay(redis=redis_server.url)
    two = start_relay(redis=redis_server.url)
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
    three = start_relay(redis=redis_server.url)
    c = await _joined(three.url)
    assert len((await c.sample(16))["batches"]) == 2
    for peer in (a, a2, b, c):
        await peer.close()


@pytest.mark.integration
async def test_cursors_work_across_relays_that_share_one_redis(start_relay: StartRelay,
                                                              redis_server: RedisServer) -> None:
    one = start_relay(redis=redis_server.url, rate=1000.0, burst=1000.0)
    two = start_relay(redis=redis_server.url, rate=1000.0, burst=1000.0)
    sender = await _joined(one.url)
    for seq in (1, 2):
        assert (await sender.publish([item()], seq=seq))["type"] == "published"
    reader = await _joined(two.url)

    async def seqs_until(peer: DocPeer, want: int) -> list[int]:
        """sample_new until `want` batches came (relay two tails the stream), or 10 s."""
        got: list[int] = []
        deadline = time.monotonic() + 10
        while len(got) < want and time.monotonic() < deadline:
            answer = await peer.sample_new(16)
            got += [json.loads(b["payload"])["seq"] for b in answer["batches"]]
            if len(got) < want:
                await asyncio.sleep(0.05)
        return sorted(got)

    assert await seqs_until(reader, 2) == [1, 2]
    cursor = reader.cursor
    assert cursor is not None
    await reader.close()
    # the same node on the other relay, with its cursor: nothing old, then only the new one
    again = DocPeer(one.url, key=reader.key)
    assert (await again.connect())["type"] == "welcome"
    again.cursor = cursor
    assert (await again.sample_new(16))["batches"] == []
    assert (await sender.publish([item()], seq=3))["type"] == "published"
    assert await seqs_until(again, 1) == [3]
    # a relay started later reads the swarm's cursors too
    three = start_relay(redis=redis_server.url)
    late = await _joined(three.url)
    assert [json.loads(b["payload"])["seq"] for b in (await late.sample(16, after=cursor))["batches"]] == [3]
    for peer in (sender, again, late):
        await peer.close()
