"""A laptop that sleeps mid-round (issue 38), and a node starved of CPU: neither is a silent link.

The sleep is real: tests/swarm/link_node.py (the real `SwarmClient` in a child process, a round every half
second) is stopped with SIGSTOP between two rounds for 20 s (ten minutes with SAPLING_LONG_FAULTS=1) and
continued with SIGCONT. Its relay, a real `EmbeddedRelay` in this process with a 1 s heartbeat, drops it
meanwhile (`heartbeat_timeout`). Once continued the node must read that the relay let it go, reconnect at
once, not be refused for its timestamps, sequence numbers or rate, and have stored every round it said
it published exactly once: among them the one published in the moment after it woke, into a connection
the relay had already closed, which the client sends again on the new link.

The starved loop is the client's own event loop blocked (a callback that sleeps in it) for longer than
its heartbeat, as a CPU-starved or suspended process sees it: the link must stay up, since the relay did
answer; the time the loop did not run is not the relay's silence.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.harness.servers import stop_process
from engine.relay.embedded import EmbeddedRelay
from engine.relay.settings import RelaySettings
from engine.swarm import protocol
from engine.swarm.client import SwarmClient
from engine.swarm.identity import Identity
from tests.conftest import StartRelay
from tests.swarm.link_node import batch
from tests.swarm.test_link_loss import NodeLines, peer_sees, stored_questions

ROOT = Path(__file__).resolve().parents[2]
BACK_WITHIN_S = 10.0  # after SIGCONT: the close waiting in the socket is read at once, the first retry within 0.5 s


def sleep_and_wake(tmp_path: Path, stop_s: float) -> dict[str, float]:
    """Stop a running node for `stop_s` and continue it; check everything issue 38 asks; the measured numbers."""
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, heartbeat=1.0, data_dir=str(tmp_path / "relay")))
    url = relay.start()
    node_key = tmp_path / "node.key"
    node_id = Identity.load_or_create(node_key).peer_id
    other = Identity.generate()
    peer = SwarmClient(url, other)
    log = tmp_path / "node.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.swarm.link_node", url, str(node_key), "--heartbeat",
                                 "4"], cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        peer.start()
        assert peer.wait_connected(10)
        node = NodeLines(proc, log)
        start = time.monotonic()
        node.wait("connection", lambda line: line["connected"], "link", start, start + 30)
        _t, first = node.wait("shared round", lambda line: line["published"], "round", start, start + 30)
        seen, _ = node.wait("third shared round",
                            lambda line: line["published"] and line["round"] >= first["round"] + 2,
                            "round", start, start + 30)
        time.sleep(max(0.0, seen + 0.2 - time.monotonic()))  # mid-round: between its publish and the next one
        proc.send_signal(signal.SIGSTOP)
        stopped, stopped_wall = time.monotonic(), time.time()
        dropped = False
        while time.monotonic() < stopped + stop_s:
            dropped = dropped or relay.relay.rejections[protocol.E_HEARTBEAT] >= 1
            time.sleep(0.2)
        assert dropped, "the relay kept a node that answered no ping for the whole sleep"
        assert relay.relay.peers_here == 1  # only the other peer
        proc.send_signal(signal.SIGCONT)
        woke = time.monotonic()

        noticed, lost = node.wait("notice that the link is gone", lambda line: not line["connected"], "link", woke,
                                  woke + BACK_WITHIN_S)
        assert "did not run for" in lost["error"] and "asleep or stopped" in lost["error"], lost  # what the app says
        assert abs(lost["lost_at"] - stopped_wall) < 2.0, (lost, stopped_wall)  # cut off since it fell asleep
        back, _ = node.wait("reconnection", lambda line: line["connected"], "link", woke, woke + BACK_WITHIN_S)
        peer.publish(batch(peer, other, "after the sleep"))
        node.wait("sample of the peer's batch", lambda line: "after the sleep" in line["sampled"], "round", back,
                  back + 30)
        _t, shared = node.wait("round shared again", lambda line: line["published"], "round", back, back + 30)
        assert peer_sees(peer, lambda q: q.startswith("round ") and int(q.split()[1]) >= shared["round"], back + 30)
        last_t, _ = node.wait("five more rounds", lambda line: line["round"] >= shared["round"] + 5, "round", back,
                              back + 30)
        time.sleep(1.0)  # the acknowledgements of the last rounds

        stored = stored_questions(relay, node_id)
        published = [r["round"] for t, r in node.after(start, "round") if r["published"] and t < last_t]
        assert max(stored.values()) == 1, stored.most_common(3)  # nothing twice
        lost_rounds = [n for n in published if stored[f"round {n}"] != 1]
        assert not lost_rounds, f"published but never stored: {lost_rounds}"  # nothing lost
        for code in (protocol.E_STALE, protocol.E_REPLAY, protocol.E_RATE):
            assert relay.relay.rejections[code] == 0, relay.relay.rejections  # not locked out
        first_after = min(r["round"] for _t, r in node.after(woke, "round"))
        measured = {"stopped_s": stop_s, "noticed_after_wake_s": noticed - woke, "back_after_wake_s": back - woke,
                    "rounds_published": len(published), "rounds_lost": len(lost_rounds),
                    "most_copies_of_a_round": max(stored.values()), "first_round_after_wake": first_after}
        print("laptop sleep:", json.dumps({k: round(v, 2) for k, v in measured.items()}))
        return measured
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        stop_process(proc, grace=5)
        peer.close()
        relay.stop()


@pytest.mark.integration
def test_a_node_stopped_mid_round_is_dropped_readmitted_and_loses_nothing(tmp_path: Path) -> None:
    sleep_and_wake(tmp_path, stop_s=20.0)


@pytest.mark.integration
@pytest.mark.skipif(os.environ.get("SAPLING_LONG_FAULTS") != "1",
                    reason="set SAPLING_LONG_FAULTS=1 for a 10-minute sleep")
def test_a_ten_minute_sleep(tmp_path: Path) -> None:
    sleep_and_wake(tmp_path, stop_s=600.0)  # past the relay's 300 s timestamp window


@pytest.mark.integration
def test_a_stalled_event_loop_is_not_taken_for_a_silent_link(start_relay: StartRelay) -> None:
    relay = start_relay(heartbeat=60.0)  # the relay's own pings stay out of it
    identity = Identity.generate()
    changes: list[bool] = []
    heartbeat, stall, stalls = 0.8, 2.0, 5
    client = SwarmClient(relay.url, identity, on_change=lambda state: changes.append(state.connected),
                         heartbeat=heartbeat)
    client.start()
    try:
        assert client.wait_connected(10)
        for _ in range(stalls):  # the loop does not run for 2.5 heartbeats, as in a starved or suspended process
            client._loop.call_soon_threadsafe(time.sleep, stall)
            time.sleep(stall + 1.0)
        assert changes == [True], client.state.last_error  # never cut off: the relay answered all along
        assert client.state.stalled_s >= stalls * (stall - 2 * heartbeat / 8) - 0.5
        assert client.publish(batch(client, identity, "after the stalls"))
        deadline = time.monotonic() + 10
        while client.state.published < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.state.published == 1
    finally:
        client.close()
