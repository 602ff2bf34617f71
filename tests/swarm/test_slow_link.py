"""A slow, lossy link (issue 38): 300 ms each way, 64 kB/s, and every connection reset every few seconds.

The node is tests/swarm/link_node.py (the real `SwarmClient` in a child process, a round a second, each
batch about 16 kB) reaching a real `EmbeddedRelay` in this process through tests/swarm/faultproxy.py, which
delays, caps and resets (RST both ways, timed to cut a batch in two while it crosses). A second peer here
publishes as big a batch every second straight to the relay, so the node's samples cross the slow link
too. For 35 s (SAPLING_LONG_FAULTS=1: 5 minutes) the rounds must keep coming, every batch the relay stored
must be whole and stored once, the batches cut in two must be sent again on the next link, and the node's
memory and the proxy's buffers must stay bounded.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from bench.harness.servers import stop_process
from engine.relay.brokers import MemoryBroker
from engine.relay.embedded import EmbeddedRelay
from engine.relay.settings import RelaySettings
from engine.swarm import protocol
from engine.swarm.client import SwarmClient
from engine.swarm.identity import Identity, verify
from engine.swarm.link import CONNECT_TIMEOUT_S
from tests.swarm.faultproxy import CHUNK, QUEUE_CHUNKS, FaultProxy
from tests.swarm.link_node import batch
from tests.swarm.test_link_loss import NodeLines, peer_sees

ROOT = Path(__file__).resolve().parents[2]
PAD = 16_000  # two answers of 8,000 characters: a batch of about 16 kB, a quarter of a second at 64 kB/s
PERIOD_S, SAMPLE_TIMEOUT_S = 1.0, 5.0
# A round is at most a publish that gives up (CONNECT_TIMEOUT_S), a sample that does, and the pause.
ROUND_BOUND_S = PERIOD_S + CONNECT_TIMEOUT_S + SAMPLE_TIMEOUT_S + 2.0
RSS_GROWTH_MB = 30.0


def run_slow_link(tmp_path: Path, seconds: float, reset_every_s: float) -> dict[str, float]:
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, data_dir=str(tmp_path / "relay"), window=4096,
                                        rate=50.0, burst=50.0))
    relay.start()
    assert relay.port is not None
    proxy = FaultProxy(relay.port, delay_s=0.3, rate=64_000, reset_every_s=reset_every_s)
    node_key = tmp_path / "node.key"
    node_id = Identity.load_or_create(node_key).peer_id
    other = Identity.generate()
    peer = SwarmClient(relay.url, other)
    log = tmp_path / "node.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.swarm.link_node", f"ws://127.0.0.1:{proxy.port}/ws",
                                 str(node_key), "--heartbeat", "8", "--period", str(PERIOD_S), "--sample-timeout",
                                 str(SAMPLE_TIMEOUT_S), "--pad", str(PAD)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    stop = threading.Event()
    rss: list[tuple[float, int]] = []

    def feed() -> None:  # the other peer's batches, for the node to sample across the slow link
        n = 0
        while not stop.wait(PERIOD_S):
            n += 1
            peer.publish(batch(peer, other, f"peer {n}", PAD))
            try:
                rss.append((time.monotonic(), psutil.Process(proc.pid).memory_info().rss))
            except psutil.Error:
                pass

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        peer.start()
        assert peer.wait_connected(10)
        feeder.start()
        node = NodeLines(proc, log)
        start = time.monotonic()
        node.wait("connection", lambda line: line["connected"], "link", start, start + 30)
        node.wait("shared round", lambda line: line["published"], "round", start, start + 30)
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        end = time.monotonic()
        _t, shared = node.wait("round shared after the run", lambda line: line["published"], "round", end, end + 60)
        assert peer_sees(peer, lambda q: q.startswith("round ") and int(q.split()[1]) >= shared["round"], end + 60)
        last_t, _ = node.wait("two more rounds", lambda line: line["round"] >= shared["round"] + 2, "round", end,
                              end + 60)
        stop.set()
        proc_rss = [(t, r) for t, r in rss if t >= start + 10]

        rounds = [(t, r) for t, r in node.after(start, "round")]
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(rounds)]
        assert max(gaps) <= ROUND_BOUND_S, f"a round took {max(gaps):.1f} s"  # rounds go on
        assert proxy.resets >= 3 and proxy.resets_mid_transfer >= 1, (proxy.resets, proxy.resets_mid_transfer)

        broker = relay.relay.broker
        assert isinstance(broker, MemoryBroker)
        entries, _cursor = broker.window.sample(len(broker.window), exclude_peer="")
        mine = [e for e in entries if e.peer == node_id]
        for entry in mine:  # whole: signed as sent, every answer at its full length
            decoded = protocol.decode_batch(entry.payload)
            assert verify(decoded.key, entry.payload.encode(), base64.b64decode(entry.sig))
            assert all(len(c) >= PAD // 2 for c in decoded.items[0].completions)
        stored = [protocol.decode_batch(e.payload).items[0].question for e in mine]
        published = [r["round"] for t, r in rounds if r["published"] and t < last_t - ROUND_BOUND_S]
        lost = [n for n in published if f"round {n}" not in stored]
        copies = max(stored.count(q) for q in set(stored))
        assert copies == 1, "a batch was stored twice"
        for code in (protocol.E_BAD_JSON, protocol.E_BAD_SCHEMA, protocol.E_BAD_SIGNATURE, protocol.E_REPLAY,
                     protocol.E_STALE):
            assert relay.relay.rejections[code] == 0, relay.relay.rejections
        assert len(lost) <= proxy.resets, f"published and never stored: {lost}"  # at most one a reset

        downs = [(t, line) for t, line in node.after(start, "link")]
        outages = [b - a for (a, x), (b, y) in itertools.pairwise(downs)
                   if not x["connected"] and y["connected"]]
        growth = (max(r for _t, r in proc_rss) - proc_rss[0][1]) / 2**20
        assert growth <= RSS_GROWTH_MB, f"the node's RSS grew {growth:.1f} MB"
        assert proxy.max_buffered <= 2 * QUEUE_CHUNKS * CHUNK * max(1, proxy.connections)
        cut_words = {line["error"] for _t, line in downs if not line["connected"]}
        measured = {"seconds": seconds, "resets": proxy.resets, "resets_mid_transfer": proxy.resets_mid_transfer,
                    "back_median_s": statistics.median(outages) if outages else 0.0,
                    "back_max_s": max(outages, default=0.0), "rounds": len(rounds),
                    "rounds_published": len(published), "rounds_lost": len(lost), "most_copies": copies,
                    "longest_round_s": max(gaps), "rss_growth_mb": growth,
                    "proxy_max_buffered_kb": proxy.max_buffered / 1024}
        print("slow link:", json.dumps({k: round(v, 2) for k, v in measured.items()}), "| the app said:",
              sorted(cut_words))
        return measured
    finally:
        stop.set()
        stop_process(proc, grace=5)
        peer.close()
        proxy.close()
        relay.stop()


@pytest.mark.integration
def test_rounds_go_on_through_a_slow_lossy_link_and_no_batch_is_half_sent(tmp_path: Path) -> None:
    run_slow_link(tmp_path, seconds=35.0, reset_every_s=8.0)


@pytest.mark.integration
@pytest.mark.skipif(os.environ.get("SAPLING_LONG_FAULTS") != "1", reason="set SAPLING_LONG_FAULTS=1 for 5 minutes")
def test_five_minutes_of_a_slow_lossy_link(tmp_path: Path) -> None:
    run_slow_link(tmp_path, seconds=300.0, reset_every_s=20.0)
