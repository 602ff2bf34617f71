"""The computer's local relay changes hands: real relays and real clients on loopback.

Three nodes share the embedded relay on one port; its host stops; one of the
others binds the port and hosts, the rest reconnect to it, and each node is
told what happened in words. Nothing here sleeps to prove that nothing
happened: every wait is on an event, with a timeout.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.harness.servers import free_port
from engine.relay.embedded import start_embedded_relay
from engine.swarm import protocol as p
from engine.swarm.client import LinkState
from engine.swarm.identity import Identity
from engine.swarm.local import LOCAL_RELAY_CLOSING, LocalSwarm

HANDOVER_TIMEOUT_S = 20.0
ROOT = Path(__file__).resolve().parents[2]
HOST_SCRIPT = """
import sys, threading
from engine.relay.embedded import start_embedded_relay
from engine.swarm.identity import Identity
from engine.swarm.local import LocalSwarm
local = LocalSwarm("127.0.0.1", int(sys.argv[1]), Identity.generate(), host_relay=start_embedded_relay)
local.start()
print("hosting" if local.hosting else "joined", flush=True)
threading.Event().wait()
"""


class ZeroJitter(random.Random):
    """Every survivor knocks at the same instant: the worst case for a race on the port."""

    def uniform(self, a: float, b: float) -> float:
        return a


class Node:
    """A LocalSwarm as a node holds it, recording what it would show a person."""

    def __init__(self, port: int, took_over: threading.Event, rng: random.Random | None = None) -> None:
        self.identity = Identity.generate()
        self.messages: list[str] = []
        self.errors: list[str] = []
        self.took_over = took_over
        self.rejoined = threading.Event()
        self.local = LocalSwarm("127.0.0.1", port, self.identity, host_relay=start_embedded_relay,
                                on_change=self._on_change, on_message=self._on_message, rng=rng)

    def _on_message(self, text: str) -> None:
        self.messages.append(text)
        if "this node now hosts it" in text:
            self.took_over.set()
        if "rejoined" in text:
            self.rejoined.set()

    def _on_change(self, state: LinkState) -> None:
        if not state.connected:
            self.errors.append(state.last_error)

    def publish(self) -> None:
        client = self.local.client
        before = client.state.published
        item = p.Item({"dataset": "d", "index": 0}, "q", ("a", "b"), (None, None))
        assert client.publish(p.batch_payload(self.identity.public_key, client.next_seq(), time.time(), "m", [item]))
        deadline = time.monotonic() + 10
        while client.state.published == before:
            assert time.monotonic() < deadline, "the relay did not acknowledge the publish"
            time.sleep(0.01)

    def sample_from(self, other: Node) -> None:
        got = self.local.client.sample(4)
        assert [p.decode_batch(s.payload).peer for s in got] == [other.identity.peer_id]


def _start(nodes: list[Node]) -> None:
    for node in nodes:
        node.local.start()
    for node in nodes:
        assert node.local.client.wait_connected(10)


@pytest.mark.integration
def test_a_remaining_node_takes_over_the_local_relay_and_the_others_rejoin() -> None:
    port = free_port()
    took_over = threading.Event()
    host, b, c = (Node(port, took_over) for _ in range(3))
    try:
        _start([host, b, c])
        assert host.local.hosting and not b.local.hosting and not c.local.hosting
        assert host.messages[0].startswith("This node hosts the computer's local relay")
        b.publish()
        c.sample_from(b)

        stopped = time.monotonic()
        host.local.stop()
        assert took_over.wait(HANDOVER_TIMEOUT_S), "nobody took the port over"
        winner, loser = (b, c) if b.local.hosting else (c, b)
        assert not loser.local.hosting
        assert winner.local.client.wait_connected(HANDOVER_TIMEOUT_S)
        assert loser.local.client.wait_connected(HANDOVER_TIMEOUT_S)
        handover_s = time.monotonic() - stopped
        assert loser.rejoined.wait(HANDOVER_TIMEOUT_S)
        print(f"\nhandover: both survivors connected to the new host {handover_s:.2f} s after the old host stopped")

        url = f"ws://127.0.0.1:{port}/ws"
        assert winner.local.url == url and winner.local.label == "embedded" and loser.local.label == url
        assert winner.messages[-1] == f"The computer's local relay closed; this node now hosts it at {url}."
        assert loser.messages[-1] == (f"The computer's local relay closed; {winner.identity.name} now hosts it, "
                                      "and this node rejoined it.")
        for survivor in (winner, loser):  # what the link said while it was down
            assert any(LOCAL_RELAY_CLOSING in error for error in survivor.errors), survivor.errors
        loser.publish()  # the swarm goes on through the new host
        winner.sample_from(loser)
    finally:
        for node in (host, b, c):
            node.local.stop()


@pytest.mark.integration
def test_two_survivors_knocking_at_once_end_with_one_host() -> None:
    port = free_port()
    took_over = threading.Event()
    host = Node(port, took_over)
    b, c = Node(port, took_over, ZeroJitter()), Node(port, took_over, ZeroJitter())
    try:
        _start([host, b, c])
        host.local.stop()
        assert took_over.wait(HANDOVER_TIMEOUT_S)
        assert b.local.client.wait_connected(HANDOVER_TIMEOUT_S) and c.local.client.wait_connected(HANDOVER_TIMEOUT_S)
        assert [b.local.hosting, c.local.hosting].count(True) == 1
        winner, loser = (b, c) if b.local.hosting else (c, b)
        assert loser.rejoined.wait(HANDOVER_TIMEOUT_S)
        # a node that is only a client leaving changes nothing for the host
        loser.local.stop()
        assert winner.local.hosting and winner.local.client.state.connected
    finally:
        for node in (host, b, c):
            node.local.stop()


@pytest.mark.integration
def test_port_zero_hosts_alone_on_a_free_port() -> None:
    node = Node(0, threading.Event())
    try:
        node.local.start()
        assert node.local.hosting and node.local.url != "ws://127.0.0.1:0/ws"
        assert node.local.client.wait_connected(10)
    finally:
        node.local.stop()


@pytest.mark.integration
def test_a_host_killed_without_a_word_is_replaced_too() -> None:
    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", HOST_SCRIPT, str(port)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    took_over = threading.Event()
    b, c = Node(port, took_over), Node(port, took_over)
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "hosting"
        _start([b, c])
        assert not b.local.hosting and not c.local.hosting
        host.kill()  # SIGKILL: no shutting_down, the sockets just close
        host.wait(timeout=10)
        assert took_over.wait(HANDOVER_TIMEOUT_S)
        assert b.local.client.wait_connected(HANDOVER_TIMEOUT_S) and c.local.client.wait_connected(HANDOVER_TIMEOUT_S)
        assert [b.local.hosting, c.local.hosting].count(True) == 1
        winner, loser = (b, c) if b.local.hosting else (c, b)
        assert loser.rejoined.wait(HANDOVER_TIMEOUT_S)
        loser.publish()
        winner.sample_from(loser)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(timeout=10)
        for node in (b, c):
            node.local.stop()


@pytest.mark.integration
def test_a_port_held_by_another_program_is_named_once_and_taken_when_it_is_freed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from http.server import HTTPServer, SimpleHTTPRequestHandler

    monkeypatch.setattr("engine.swarm.local.TAKEOVER_RETRY_S", 0.2)
    foreign = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)  # answers /ws with a plain 404 page
    port = foreign.server_address[1]
    serving = threading.Thread(target=foreign.serve_forever, daemon=True)
    serving.start()
    took_over = threading.Event()
    node = Node(port, took_over)
    try:
        node.local.start()
        assert not node.local.hosting
        deadline = time.monotonic() + HANDOVER_TIMEOUT_S
        while not any("not a Sapling relay" in m for m in node.messages):
            assert time.monotonic() < deadline, node.messages
            time.sleep(0.05)
        said = [m for m in node.messages if "not a Sapling relay" in m]
        assert said[0].startswith(f"Port {port} on this computer is held by a program that is not a Sapling relay (")
        assert "swarm.embedded_port" in said[0]
        foreign.shutdown()
        foreign.server_close()
        assert took_over.wait(HANDOVER_TIMEOUT_S) and node.local.client.wait_connected(HANDOVER_TIMEOUT_S)
        assert node.local.hosting and len([m for m in node.messages if "not a Sapling relay" in m]) == 1
    finally:
        node.local.stop()
        foreign.server_close()
