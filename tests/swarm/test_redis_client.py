"""The relay process's one Redis client (engine/relay/brokers.py, `redis_client`), shared by its broker, live
stats and credit.

    .venv/bin/python -m pytest -q tests/swarm/test_redis_client.py

Against a real redis-server on a free loopback port: a Redis restart under a
relay must not cost the status page's numbers or a receipt's credit (stale
pooled connections are retried on fresh ones), and many peers publishing,
sampling and sending receipts at once must not make the relay open more
than REDIS_MAX_CONNECTIONS connections (counted by the server: CLIENT LIST
and INFO's total_connections_received).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from bench.harness.servers import RedisServer
from engine.relay.brokers import REDIS_MAX_CONNECTIONS
from engine.relay.embedded import EmbeddedRelay
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, b64, item

REDIS = shutil.which("redis-server")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (make test installs it)")]

# What the relay logs when live stats or credit could not reach Redis.
STORE_WARNINGS = ("live stats not saved", "live stats not read", "credit counts not saved",
                  "could not remember a sample", "credit not read")
PEERS = 120  # peers publishing, sampling and sending receipts at once in the load test


async def _until(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _get_json(relay: EmbeddedRelay, path: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{relay.port}{path}") as response:
        assert response.status == 200, await response.text()
        data: dict[str, Any] = await response.json()
        return data


async def _publish_and_receipt(sender: DocPeer, receiver: DocPeer, question: str) -> dict[str, Any]:
    """sender publishes one item, receiver samples it and says it used it: the relay's `receipted` answer."""
    assert (await sender.publish([item(question)]))["type"] == "published"
    answer = await receiver.sample_new(8)
    assert answer["type"] == "batches", answer
    seqs = [json.loads(b["payload"])["seq"] for b in answer["batches"]
            if json.loads(b["payload"])["items"][0]["question"] == question]
    assert len(seqs) == 1, answer
    return await receiver.receipts({sender.peer_id: [{"seq": seqs[0], "i": 0, "verdict": "used", "positive": 1}]})


async def test_live_stats_and_credit_count_on_through_a_redis_restart(
        start_relay: StartRelay, redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    relay = start_relay(redis=redis_server.url, rate=1000.0, burst=1000.0)
    sender, receiver = DocPeer(relay.url), DocPeer(relay.url)
    assert (await sender.connect())["type"] == "welcome"
    assert (await receiver.connect())["type"] == "welcome"
    # Before the restart: every store has used its connections.
    first = await _publish_and_receipt(sender, receiver, "before")
    assert first["type"] == "receipted" and first["counted"] == 1, first
    before = await _get_json(relay, "/stats.json")
    assert before["live"]["batches_last_hour"] == 1, before

    redis_server.stop()
    await _until("the relay to notice", lambda: any("redis connection lost" in r.getMessage() for r in caplog.records))
    redis_server.start()  # empty: the kit runs Redis without persistence
    back = len(caplog.records)
    await _until("the relay to reconnect", lambda: any("redis connection restored" in r.getMessage()
                                                       for r in caplog.records))

    # Afterwards the first try works: the sample is remembered for its receipt, the receipt counts ...
    after = await _publish_and_receipt(sender, receiver, "after")
    assert after["type"] == "receipted" and after["counted"] == 1 and not after.get("refused"), after
    assert (await sender.credit())["all"]["used"] == 1  # counted in the Redis that came back
    # ... and the status page's next fresh numbers hold the publish made since (its first flush worked).
    fresh = before
    while fresh["now"] == before["now"]:  # a snapshot is reused for 2 s; wait for one built anew
        fresh = await _get_json(relay, "/stats.json")
        await asyncio.sleep(0.1)
    assert fresh["live"]["batches_last_hour"] == 1, fresh
    failures = [r.getMessage() for r in caplog.records[back:] if r.getMessage().startswith(STORE_WARNINGS)]
    assert failures == []  # no stale connection failed a write or a read once Redis was back
    for peer in (sender, receiver):
        await peer.close()


async def test_a_relay_process_holds_a_bounded_number_of_redis_connections_under_load(
        start_relay: StartRelay, redis_server: RedisServer) -> None:
    relay = start_relay(redis=redis_server.url, rate=1000.0, burst=1000.0, max_conn_per_ip=1000)
    observer: Any = aioredis.Redis.from_url(redis_server.url, decode_responses=True, client_name="observer")
    peers = [DocPeer(relay.url) for _ in range(PEERS)]
    ids = {b64(peer.public): peer.peer_id for peer in peers}
    welcomes = await asyncio.gather(*(peer.connect() for peer in peers))
    assert all(a["type"] == "welcome" for a in welcomes)
    opened_before = int((await observer.info("stats"))["total_connections_received"])
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:  # CLIENT LIST while the load runs: the relay's connections, the observer's left out
        nonlocal peak
        while not done.is_set():
            clients = await observer.client_list()
            peak = max(peak, sum(1 for c in clients if c.get("name") != "observer"))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    answers: list[dict[str, Any]] = []
    try:
        for question in ("one", "two", "three"):
            answers += await asyncio.gather(*(peer.publish([item(question)]) for peer in peers))
            samples = await asyncio.gather(*(peer.sample_new(4) for peer in peers))
            answers += samples
            receipts = []
            for peer, answer in zip(peers, samples, strict=True):
                by_sender: dict[str, list[dict[str, Any]]] = {}
                for batch in answer.get("batches", []):
                    payload = json.loads(batch["payload"])
                    by_sender.setdefault(ids[payload["key"]], []).append(
                        {"seq": payload["seq"], "i": 0, "verdict": "used", "positive": 1})
                receipts.append(peer.receipts(by_sender))
            answers += await asyncio.gather(*receipts)
        await _get_json(relay, "/stats.json")
        await _get_json(relay, "/stats/peers.json")
    finally:
        done.set()
        await watcher
    opened = int((await observer.info("stats"))["total_connections_received"]) - opened_before
    assert 1 <= peak <= REDIS_MAX_CONNECTIONS, f"{peak} connections at once"
    assert opened <= REDIS_MAX_CONNECTIONS, f"{opened} connections opened"  # and none opened and thrown away
    refused = [a for a in answers if a["type"] not in ("published", "batches", "receipted")]
    assert refused == [] and len(answers) == 3 * 3 * PEERS
    await asyncio.gather(*(peer.close() for peer in peers))
    await observer.aclose()
