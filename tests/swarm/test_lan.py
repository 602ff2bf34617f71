"""A swarm in the same room (engine/common/lan.py): a relay announced in one network namespace is found and joined
from another, over a bridge with real multicast; and nothing is announced unless asked.

The two "computers" are Linux network namespaces joined by veth pairs to a bridge in a third one, so the test
touches none of this machine's own interfaces. It needs root and `ip`; elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.common.lan import discover

ROOT = Path(__file__).resolve().parents[2]
PORT = 18765


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def two_rooms() -> Iterator[dict[str, str]]:
    """Namespaces A (10.231.x.1) and B (10.231.x.2) on one bridge: {"a": ns, "b": ns, "a_ip": address}."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("network namespaces need root and iproute2's `ip`")
    tag = f"{os.getpid() % 100000}"
    a, b, bridge = f"sapA{tag}", f"sapB{tag}", f"sapBr{tag}"
    subnet = 1 + os.getpid() % 250
    try:
        _ip("netns", "add", bridge)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces are not available here: {exc.stderr.decode().strip()}")
    made = [bridge]
    try:
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "up")
        for host, ns in ((1, a), (2, b)):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", "v0", "netns", ns, "type", "veth", "peer", "name", f"p{host}", "netns", bridge)
            _ip("-n", bridge, "link", "set", f"p{host}", "master", "br0")
            _ip("-n", bridge, "link", "set", f"p{host}", "up")
            _ip("-n", ns, "addr", "add", f"10.231.{subnet}.{host}/24", "dev", "v0")
            _ip("-n", ns, "link", "set", "v0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "v0")
        yield {"a": a, "b": b, "a_ip": f"10.231.{subnet}.1"}
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _in(ns: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.integration
def test_a_node_in_one_room_finds_and_joins_a_relay_announced_in_the_other(two_rooms: dict[str, str],
                                                                           tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    relay = subprocess.Popen(
        ["ip", "netns", "exec", two_rooms["a"], sys.executable, "-m", "engine.relay", "--advertise", "--name",
         "Maths club", "--port", str(PORT), "--data-dir", str(tmp_path / "relay")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        found: list[dict[str, str]] = []
        deadline = time.monotonic() + 30
        while not found and time.monotonic() < deadline:  # the relay needs a moment to start and announce
            listing = _in(two_rooms["b"], "-m", "engine.cli", "discover", "--json", "--seconds", "3")
            assert listing.returncode == 0, listing.stderr
            found = [json.loads(line) for line in listing.stdout.splitlines() if line.strip()]
        url = f"ws://{two_rooms['a_ip']}:{PORT}/ws"
        assert [(f["name"], f["url"]) for f in found] == [("Maths club", url)]
        assert found[0]["info_url"] == f"http://{two_rooms['a_ip']}:{PORT}/.well-known/sapling-relay"
        # Joining: the node's own handshake (signed hello, welcome) and a sample round trip, from room B.
        joined = _in(two_rooms["b"], "-m", "engine.cli", "doctor", "--home", str(tmp_path / "node"), "--relay",
                     url, "--json")
        assert joined.returncode == 0, joined.stdout + joined.stderr
        steps = [json.loads(line) for line in joined.stdout.splitlines() if line.strip()]
        assert any("sample" in json.dumps(step) for step in steps)
    finally:
        relay.terminate()
        try:
            relay.wait(15)
        except subprocess.TimeoutExpired:
            relay.kill()


def test_nothing_is_announced_unless_asked() -> None:
    from engine.relay.embedded import EmbeddedRelay
    from engine.relay.settings import RelaySettings

    relay = EmbeddedRelay(RelaySettings(host="0.0.0.0", port=0, name="Not announced"))  # on the network, quiet
    relay.start()
    try:
        assert relay.port and not [s for s in discover(1.5) if s.name == "Not announced"]
    finally:
        relay.stop()


def test_the_local_swarm_with_its_switch_on_is_found_on_this_network(tmp_path: Path) -> None:
    from engine.common.lan import lan_addresses
    from engine.relay.embedded import start_embedded_relay
    from engine.swarm.identity import Identity
    from engine.swarm.local import LOCAL_RELAY_PREFIX, LocalSwarm

    if not lan_addresses():
        pytest.skip("this computer has no network address besides loopback to announce on")
    identity = Identity.load_or_create(tmp_path / "identity.json")
    local = LocalSwarm("127.0.0.1", 0, identity, host_relay=start_embedded_relay, lan=True)
    client = local.start()
    try:
        assert local.hosting and client.wait_connected(10)  # this computer's node still dials loopback
        found = [s for s in discover(2.0) if s.name == LOCAL_RELAY_PREFIX + identity.name]
        assert [s.url for s in found] == [f"ws://{lan_addresses()[0]}:{local._relay.port}/ws"]  # type: ignore[union-attr]
    finally:
        local.stop()


def test_the_join_hint_names_the_command_this_install_has(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packaged app has one executable (`sapling node ...`); a pip install has `sapling-node`."""
    from engine.cli import build_parser, program

    assert program() == "sapling-node" and build_parser().prog == "sapling-node"
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert program() == "sapling node" and build_parser().prog == "sapling node"
