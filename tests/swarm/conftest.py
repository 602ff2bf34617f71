"""Relays for the swarm tests: in-process on a free loopback port, stopped afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from engine.swarm.relay import EmbeddedRelay, RelaySettings

StartRelay = Callable[..., EmbeddedRelay]


@pytest.fixture
def start_relay() -> Iterator[StartRelay]:
    started: list[EmbeddedRelay] = []

    def start(**settings: object) -> EmbeddedRelay:
        relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, **settings))  # type: ignore[arg-type]
        relay.start()
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()
