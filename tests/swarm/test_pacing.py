"""A fast node is paced to the relay's announced rate limit, never refused with `rate_limited`.

A node whose rounds take a tenth of a second (a tiny model, a big GPU) sends
publish, sample, receipts and stats requests faster than a relay's default
two a second. The client keeps its own token bucket from the welcome's
`rate_per_s` and `burst` and waits, so every request reaches the relay.
"""

from __future__ import annotations

import time

import pytest

from engine.swarm import protocol as p
from engine.swarm.client import SwarmClient
from engine.swarm.identity import Identity
from engine.swarm.link import PACE_SHARE, pace
from engine.swarm.rate import TokenBucket
from tests.swarm.conftest import StartRelay


def test_the_bucket_says_how_long_to_wait_and_a_refusal_empties_it() -> None:
    bucket = TokenBucket(rate=4.0, burst=2.0)
    assert bucket.wait_s() == 0.0 and bucket.take() and bucket.take()
    assert not bucket.take()
    assert 0.0 < bucket.wait_s() <= 0.25
    time.sleep(0.3)
    assert bucket.take()
    bucket.tokens = 2.0
    bucket.drain()
    assert not bucket.take()


def test_the_pace_is_below_the_announced_limits_and_starts_empty() -> None:
    bucket = pace({"rate_per_s": 5, "burst": 8})
    assert bucket.rate == pytest.approx(PACE_SHARE * 5) and bucket.burst == 4.0 and bucket.tokens == 0.0
    for nonsense in (None, [], {"rate_per_s": -1, "burst": "x"}, {"rate_per_s": float("inf"), "burst": True}):
        default = pace(nonsense)
        assert default.rate == pytest.approx(PACE_SHARE * p.DEFAULT_RATE_PER_S)
        assert default.burst == p.DEFAULT_BURST / 2


@pytest.mark.integration
def test_a_client_faster_than_the_rate_limit_is_paced_and_never_refused(start_relay: StartRelay) -> None:
    relay = start_relay(rate=5.0, burst=3.0)
    identity = Identity.generate()
    client = SwarmClient(relay.url, identity)
    try:
        client.start()
        assert client.wait_connected(10)
        started = time.monotonic()
        for i in range(12):  # as fast as the caller can: 24 requests against 5 a second
            item = p.Item({"dataset": "d", "index": i}, f"q{i}", ("a", "b"), (None, None))
            assert client.publish(p.batch_payload(identity.public_key, client.next_seq(), time.time(), "m", [item]))
            client.sample(1, timeout=5.0)
        deadline = time.monotonic() + 10
        while client.state.published < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        assert client.state.published == 12
        assert client.state.publish_errors[p.E_RATE] == 0
        assert elapsed >= 24 / (PACE_SHARE * 5.0) - 1.0  # it waited: paced, not refused
    finally:
        client.close()
