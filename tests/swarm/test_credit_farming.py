"""Credit farming (issue 38): keys from one address that sample each other and call everything `used` mint no
credit, while honest nodes from their own addresses keep every receipt (bench/credit_farming.py on a real relay
that trusts loopback as its reverse proxy, so X-Forwarded-For gives each key its address)."""

from __future__ import annotations

import asyncio

import pytest

from bench.credit_farming import measure
from engine.relay.embedded import EmbeddedRelay
from engine.relay.settings import RelaySettings

pytestmark = pytest.mark.integration  # starts a relay


def test_a_ring_of_keys_from_one_address_gains_nothing_and_honest_nodes_keep_their_credit() -> None:
    settings = RelaySettings(host="127.0.0.1", port=0, trusted_proxy=["127.0.0.1"], max_conn_per_ip=32)
    relay = EmbeddedRelay(settings)
    relay.start()
    try:
        result = asyncio.run(measure(relay.url, farm=20, honest=3, seconds=4.0, round_s=1.0, rate=settings.rate))
    finally:
        relay.stop()
    assert result["farm_used_all_keys_hour"] == 0  # the bound: nothing from its own address
    assert result["farm_refused"].get("same_address", 0) > 100  # it tried: every ring receipt was refused as such
    assert result["honest_used_per_node_hour"] > 0
    assert "same_address" not in result["honest_refused"]
    assert result["honest_credit"] == result["honest_receipts"]  # each honest `used` receipt credited once
    assert all(p["same_address"] == 0 for p in result["board"])  # the board lists the honest nodes only
