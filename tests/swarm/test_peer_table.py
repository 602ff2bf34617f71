"""The peers a node lists one by one stay bounded while identities come and go (found by bench/soak.py)."""

from __future__ import annotations

import json
from typing import Any

from engine.swarm.client import LinkState
from engine.swarm.exchange import MAX_PEERS_LISTED, SwarmExchange
from engine.swarm.identity import Identity


class LinkDouble:
    """Stands in for the client: only its link state and relays."""

    def __init__(self) -> None:
        self.state = LinkState(connected=True, online=2, url="ws://relay.test/ws")
        self.urls = ["ws://relay.test/ws"]


def test_a_thousand_peers_come_and_go_and_the_list_and_the_totals_stay_right() -> None:
    events: list[dict[str, Any]] = []
    exchange = SwarmExchange(LinkDouble(), Identity.generate(), "tiny", events.append, "ws://relay.test/ws")  # type: ignore[arg-type]
    for n in range(1000):
        counts = exchange._peer(f"{n:020x}")
        counts.accepted += 1
        counts.rejected += n % 2
        if n % 2:
            counts.reasons["implausible"] += 1
    exchange._peer(f"{0:020x}").accepted += 1  # the first one is heard from again: listed again, counted once more
    exchange._emit_peers({})
    event = events[-1]
    assert len(event["by_peer"]) == MAX_PEERS_LISTED and f"{0:020x}" in event["by_peer"]
    assert f"{1:020x}" not in event["by_peer"] and f"{999:020x}" in event["by_peer"]
    assert event["accepted"] == 1001 and event["rejected"] == 500
    assert event["rejected_by_reason"] == {"implausible": 500}
    assert len(json.dumps(event["by_peer"])) < 20_000  # a round's metrics line stays small
