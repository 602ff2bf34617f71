"""Redis restarted under two relay processes: they reconnect by themselves, say so, and lose no acknowledged batch.

A real redis-server on a free loopback port is stopped and started again on
the same port (without persistence, as the deployment kit runs it) while two
relays share it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable

import pytest

from bench.harness.servers import RedisServer
from engine.swarm import protocol as p
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, item

REDIS = shutil.which("redis-server")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (make test installs it)")]


async def _until(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_relays_ride_out_a_redis_restart_and_say_so(start_relay: StartRelay, redis_server: RedisServer,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="engine.relay.brokers")
    one = start_relay(redis=redis_server.url)
    two = start_relay(redis=redis_server.url)
    sender, reader = DocPeer(one.url), DocPeer(two.url)
    assert (await sender.connect())["type"] == "welcome"
    assert (await reader.connect())["type"] == "welcome"
    assert (await sender.publish([item("before")]))["type"] == "published"

    def messages(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "engine.relay.brokers" and text in r.getMessage()]

    redis_server.stop()
    # A publish while Redis is away is refused for now, as `internal`, and the connection stays up.
    refused = await sender.publish([item("during")])
    assert refused["type"] == "error" and refused["code"] == p.E_INTERNAL, refused
    assert (await sender.sample(4))["type"] == "batches"  # still connected, and sampling serves the window
    await _until("both relays to log the lost connection", lambda: len(messages("redis connection lost")) >= 2)

    redis_server.start()
    await _until("both relays to log the restored connection", lambda: len(messages("redis connection restored")) >= 2)
    assert messages("redis came back empty")  # the swarm's epoch was put back by one of them
    # The first publish after the restart goes through (no stale pooled connection fails it) ...
    after = await sender.publish([item("after")])
    assert after["type"] == "published", after
    # ... and the other relay serves it, as well as what it held from before the restart.
    seen: set[str] = set()
    deadline = time.monotonic() + 10
    while "after" not in seen and time.monotonic() < deadline:
        answer = await reader.sample(16)
        seen |= {json.loads(b["payload"])["items"][0]["question"] for b in answer["batches"]}
        await asyncio.sleep(0.05)
    assert seen == {"before", "after"}
    for peer in (sender, reader):
        await peer.close()
