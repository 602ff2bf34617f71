"""Restarts under running nodes (issue 38): a relay restarted behind Caddy, and the Redis under two relays.

Everything is a real process on loopback: redis-server (no persistence, as the deployment kit runs it),
relay processes (`python -m engine.relay`), Debian's caddy with its own local CA in front (the kit's
Caddyfile, started as tests/swarm/test_relay_stack.py starts it), and nodes that are
tests/swarm/link_node.py (the real `SwarmClient` in a child process, a round every half second, each
round's batch asking "<tag>round N"). What was stored is read straight from Redis's stream, so a round
stored twice or never shows up whichever relay took it.

- The relay behind Caddy is stopped (SIGTERM: it tells its nodes it is restarting) and started again on
  its port 3 s later. The node must say it is cut off because the relay is restarting, get back within a
  backoff of the relay's return, and have every round it published stored exactly once: the batches it
  sent while the relay was going down are sent again on the new link.
- Redis under two relays is stopped and started again, empty, 3 s later. The nodes' links to their relays
  stay up; a node on one relay must sample the other's rounds again soon after Redis is back. A publish
  while Redis is away is refused (`internal`, "try again shortly"), and the client publishes it again
  (1 s, 2 s, 4 s later ...). Redis comes back empty, so what was stored is what a watching peer on each
  relay was handed: every round published must be there, once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.servers import RedisServer, free_port, stop_process, wait_listening
from engine.swarm import protocol
from engine.swarm.client import SwarmClient
from engine.swarm.identity import Identity
from tests.swarm.test_link_loss import NodeLines
from tests.swarm.test_relay_stack import start_caddy

ROOT = Path(__file__).resolve().parents[2]
REDIS = shutil.which("redis-server")
CADDY = shutil.which("caddy")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (make test installs it)")]
DOWN_S = 3.0


class Processes:
    """Relay and node processes of one test, all stopped at its end; logs under `logs`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.procs: list[subprocess.Popen[Any]] = []

    def relay(self, name: str, port: int, redis_url: str, *extra: str) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "engine.relay", "--host", "127.0.0.1", "--port",
                                     str(port), "--name", name, "--redis", redis_url, "--heartbeat", "2",
                                     "--data-dir", str(self.tmp_path / "relay-data"), "--log-level", "info", *extra],
                                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        wait_listening(port, proc, name, log)
        return proc

    def node(self, name: str, url: str, tag: str, env: dict[str, str] | None = None) -> NodeLines:
        log = self.logs / f"{name}.log"
        with log.open("w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "tests.swarm.link_node", url,
                                     str(self.tmp_path / f"{name}.key"), "--heartbeat", "4", "--tag", tag],
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                                    env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return NodeLines(proc, log)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, grace=10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop()


class Watcher:
    """A peer on each relay sampling all the time: every batch the swarm hands out, by question and sequence
    number (a batch handed out again, as after Redis came back empty, is one batch; two sequence numbers for one
    question are two stored copies)."""

    def __init__(self, urls: list[str]) -> None:
        self.seen: set[tuple[str, int]] = set()
        self.clients = [SwarmClient(url, Identity.generate()) for url in urls]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(c,), daemon=True) for c in self.clients]
        for client in self.clients:
            client.start()
        for thread in self._threads:
            thread.start()

    def _watch(self, client: SwarmClient) -> None:
        while not self._stop.is_set():
            for signed in client.sample(protocol.MAX_SAMPLE_BATCHES, 2.0):
                batch = protocol.decode_batch(signed.payload)
                self.seen.add((batch.items[0].question, batch.seq))
            self._stop.wait(0.1)

    def copies(self) -> Counter[str]:
        return Counter(question for question, _seq in set(self.seen))

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        for client in self.clients:
            client.close()


def stored(redis_url: str) -> Counter[str]:
    """How many times each question is in the swarm's Redis stream."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.xrange("sapling:default:batches")
    finally:
        client.close()
    return Counter(protocol.decode_batch(fields[b"payload"].decode()).items[0].question for _id, fields in entries)


def published(node: NodeLines, tag: str, since: float, until: float) -> list[str]:
    return [f"{tag}round {r['round']}" for t, r in node.after(since, "round") if r["published"] and t <= until]


@pytest.mark.skipif(CADDY is None, reason="caddy is not installed (make test installs it: apt-get install caddy)")
def test_a_relay_restarted_behind_caddy(processes: Processes, redis_server: RedisServer) -> None:
    port = free_port()
    relay = processes.relay("relay", port, redis_server.url, "--trusted-proxy", "127.0.0.1")
    caddy, https_port, ca = start_caddy(processes.tmp_path, processes.logs, [port])
    processes.procs.append(caddy)
    node = processes.node("node", f"wss://localhost:{https_port}/ws", "", {"SSL_CERT_FILE": str(ca)})
    start = time.monotonic()
    node.wait("connection through Caddy", lambda line: line["connected"], "link", start, start + 30)
    _t, first = node.wait("shared round", lambda line: line["published"], "round", start, start + 30)
    node.wait("third shared round", lambda line: line["published"] and line["round"] >= first["round"] + 2, "round",
              start, start + 30)

    stopping = time.monotonic()
    relay.send_signal(signal.SIGTERM)
    noticed, lost = node.wait("notice of the restart", lambda line: not line["connected"], "link", stopping,
                              stopping + 15)
    relay.wait(timeout=30)
    time.sleep(DOWN_S)
    processes.relay("relay", port, redis_server.url, "--trusted-proxy", "127.0.0.1")
    up = time.monotonic()
    back, _ = node.wait("reconnection", lambda line: line["connected"], "link", up - 1, up + 35)
    assert "restarting" in lost["error"], lost  # the app says why: "the relay is restarting; reconnect shortly"
    _t, again = node.wait("round shared again", lambda line: line["published"], "round", back, back + 20)
    last_t, _ = node.wait("five more rounds", lambda line: line["round"] >= again["round"] + 5, "round", back,
                          back + 30)
    time.sleep(1.0)  # the last acknowledgements

    counts = stored(redis_server.url)
    sent = published(node, "", start, last_t - 1.0)
    lost_rounds = [q for q in sent if counts[q] == 0]
    assert max(counts.values()) == 1, counts.most_common(3)  # nothing twice
    assert not lost_rounds, f"published and never stored: {lost_rounds}"
    measured = {"noticed_s": noticed - stopping, "relay_down_s": up - stopping, "back_after_relay_up_s": back - up,
                "rounds_published": len(sent), "rounds_lost": len(lost_rounds), "most_copies": max(counts.values())}
    print("relay restart behind caddy:", json.dumps({k: round(v, 2) for k, v in measured.items()}),
          "| the app said:", lost["error"])


def test_the_redis_under_two_relays_restarted(processes: Processes, redis_server: RedisServer) -> None:
    ports = free_port(), free_port()
    for name, port in zip(("relay-a", "relay-b"), ports, strict=True):
        processes.relay(name, port, redis_server.url)
    urls = [f"ws://127.0.0.1:{port}/ws" for port in ports]
    watcher = Watcher(urls)
    try:
        a = processes.node("node-a", urls[0], "a: ")
        b = processes.node("node-b", urls[1], "b: ")
        start = time.monotonic()
        for node in (a, b):
            node.wait("connection", lambda line: line["connected"], "link", start, start + 30)
        b.wait("a round of a's, sampled on the other relay",
               lambda line: any(q.startswith("a: ") for q in line["sampled"]), "round", start, start + 30)
        time.sleep(2.0)

        stopping = time.monotonic()
        redis_server.stop()
        time.sleep(DOWN_S)
        redis_server.start()
        up = time.monotonic()
        n_at_up = max(r["round"] for _t, r in a.after(start, "round"))
        shared_again, _ = b.wait(
            "a round of a's published after Redis came back, sampled through the other relay",
            lambda line: any(q.startswith("a: ") and int(q.split()[-1]) > n_at_up for q in line["sampled"]),
            "round", up, up + 30)
        time.sleep(10.0)  # the retries of what was refused while Redis was away (1 s, 2 s, 4 s ...)
        last_t = time.monotonic() - 3.0
        time.sleep(2.0)  # the watcher's last samples
    finally:
        watcher.close()

    counts = watcher.copies()
    sent = published(a, "a: ", start, last_t) + published(b, "b: ", start, last_t)
    lost_rounds = [q for q in sent if counts[q] == 0]
    assert max(counts.values()) == 1, counts.most_common(3)  # nothing twice
    assert not lost_rounds, f"published and never handed out: {lost_rounds}"
    for node in (a, b):  # the nodes' own links never went down
        assert not [line for _t, line in node.after(start, "link") if not line["connected"]]
    measured = {"redis_down_s": up - stopping, "sharing_again_after_redis_up_s": shared_again - up,
                "rounds_published": len(sent), "rounds_lost": len(lost_rounds), "most_copies": max(counts.values())}
    print("redis restart:", json.dumps({k: round(v, 2) for k, v in measured.items()}))
