"""A swarm of several relays: the node moves to the next when its relay dies, and remembers the last good one.

The integration tests run two real `sapling-relay` processes on one real
`redis-server` (each on a free loopback port, no persistence), kill the one a
node is on with SIGKILL, and check that the node carries on through the other
within 5 s with its sampling cursor; and a real `sapling-node run --relay
'sapling://join?...'` joins the relay its invite names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.servers import RedisServer, free_port, wait_listening
from engine.common.rules import Invite
from engine.relay.embedded import EmbeddedRelay
from engine.relay.settings import RelaySettings
from engine.swarm import protocol
from engine.swarm.client import RelayMemory, SwarmClient
from engine.swarm.identity import Identity

ROOT = Path(__file__).resolve().parents[2]
RELAY = Path(sys.executable).with_name("sapling-relay")


@pytest.fixture
def two_relays(tmp_path: Path,
               redis_server: RedisServer) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    """Two sapling-relay processes on one redis-server: (their ws:// URLs, their processes)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for name in ("relay-a", "relay-b"):
            port = free_port()
            log = tmp_path / f"{name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen([str(RELAY), "--host", "127.0.0.1", "--port", str(port), "--name", name,
                                         "--redis", redis_server.url, "--log-level", "warning"],
                                        stdout=out, stderr=subprocess.STDOUT)
            procs.append(proc)
            wait_listening(port, proc, name, log)
            urls.append(f"ws://127.0.0.1:{port}/ws")
        yield urls, procs
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def batch(client: SwarmClient, identity: Identity, question: str) -> str:
    item = protocol.Item({"dataset": "basic_arithmetic", "config": {}, "seed": 0, "index": 1}, question,
                         ("<answer>7</answer>", "<answer>8</answer>"), (1.0, 0.0))
    return protocol.batch_payload(identity.public_key, client.next_seq(), time.time(), "m", [item])


def questions(client: SwarmClient, want: int, timeout: float = 10.0) -> list[str]:
    """sample() until `want` batches came (relays tail Redis), or `timeout`: their questions."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        for signed in client.sample(16):
            got.append(protocol.decode_batch(signed.payload).items[0].question)
        if len(got) < want:
            time.sleep(0.1)
    return got


@pytest.mark.integration
def test_the_node_moves_to_the_other_relay_within_5_s_and_keeps_its_cursor(
        two_relays: tuple[list[str], list[subprocess.Popen[bytes]]], tmp_path: Path) -> None:
    urls, procs = two_relays
    memory_file = tmp_path / "swarm" / "relays.json"
    node_id, sender_id = Identity.generate(), Identity.generate()
    node = SwarmClient(urls, node_id, memory=RelayMemory(memory_file))
    sender = SwarmClient([urls[1]], sender_id)  # publishes through the relay that stays up
    node.start()
    sender.start()
    try:
        assert node.wait_connected(10) and sender.wait_connected(10)
        assert node.state.url == urls[0] and node.state.relay == "relay-a"
        assert sender.publish(batch(sender, sender_id, "first"))
        assert questions(node, 1) == ["first"]  # published through b, sampled through a: one swarm
        assert json.loads(memory_file.read_text())["relays"].keys() == {urls[0]}

        procs[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while not (node.state.connected and node.state.url == urls[1]):
            assert time.monotonic() - killed < 5.0, f"still not on the other relay: {node.state}"
            time.sleep(0.02)
        assert node.state.relay == "relay-b"

        assert sender.publish(batch(sender, sender_id, "second"))
        assert questions(node, 1) == ["second"]  # the cursor moved with the node: nothing it already had
        assert questions(node, 1, timeout=1.0) == []
        remembered = json.loads(memory_file.read_text())["relays"]
        assert remembered[urls[1]] > remembered[urls[0]]
    finally:
        node.close()
        sender.close()
    # after a restart the node tries the relay that last worked first
    assert SwarmClient(urls, node_id, memory=RelayMemory(memory_file)).urls == [urls[1], urls[0]]


def test_relays_are_tried_in_order_of_last_success(tmp_path: Path) -> None:
    path = tmp_path / "relays.json"
    urls = ["ws://a/ws", "ws://b/ws", "ws://c/ws"]
    assert RelayMemory(path).order(urls) == urls  # nothing known yet: the invite's order
    path.write_text("{not json")
    memory = RelayMemory(path)  # an unreadable file is an empty memory
    assert memory.order(urls) == urls
    memory.remember("ws://c/ws")
    time.sleep(0.01)
    memory.remember("ws://b/ws")
    assert RelayMemory(path).order(urls) == ["ws://b/ws", "ws://c/ws", "ws://a/ws"]
    assert RelayMemory(path).order(["ws://a/ws", "ws://a/ws"]) == ["ws://a/ws"]
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary file left behind


@pytest.mark.integration
def test_a_dead_first_relay_is_skipped_at_start(tmp_path: Path) -> None:
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, name="the live one"))
    relay.start()
    dead = f"ws://127.0.0.1:{free_port()}/ws"
    client = SwarmClient([dead, relay.url], Identity.generate())
    try:
        client.start()
        assert client.wait_connected(5)
        assert client.state.url == relay.url and client.url == relay.url
    finally:
        client.close()
        relay.stop()


@pytest.mark.integration
def test_sapling_node_run_joins_the_relay_its_invite_names(tiny_model_dir: Path, tmp_path: Path) -> None:
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, name="invite relay"))
    relay.start()
    link = Invite((f"ws://127.0.0.1:{free_port()}/ws", relay.url), "", "Lab swarm").link()
    fast = ["--set", "tasks.questions_per_round=2", "--set", "tasks.completions_per_question=2",
            "--set", "tasks.max_new_tokens=8", "--set", "tasks.eval_every=0", "--device", "cpu", "--threads", "1",
            "--set", "run.priority='normal'"]
    try:
        out = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--home", str(tmp_path / "home"), "--model",
                              str(tiny_model_dir), *fast, "--rounds", "1", "--relay", link], cwd=ROOT,
                             capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        assert relay.relay.metrics["publishes"] == 1  # round 1 was shared through the invite's live relay
        assert f"Connected to the swarm through {relay.url}" in out.stderr
        memory = json.loads((tmp_path / "home" / "data" / "swarm" / "relays.json").read_text())
        assert list(memory["relays"]) == [relay.url]
        bad = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--home", str(tmp_path / "home"),
                              "--relay", "javascript:alert(1)"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
        assert "swarm.relay_url: An invite starts with sapling://, https:// or wss://, not javascript:" in bad.stderr
    finally:
        relay.stop()
