"""The relay against a client written from docs/protocol.md: every check, every limit, on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bench.harness.servers import free_port
from engine.swarm import protocol as p
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, b64, http_text, item, joined

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration  # every test here starts a relay


async def test_publish_then_another_peer_samples_it(start_relay: StartRelay) -> None:
    relay = start_relay()
    a, b = await joined(relay.url), await joined(relay.url)
    ack = await a.publish([item()])
    assert ack == {"type": "published", "v": 1, "seq": a.seq}
    got = await b.sample(4, request_id=7)
    assert got["type"] == "batches" and got["id"] == 7 and len(got["batches"]) == 1
    assert json.loads(got["batches"][0]["payload"])["key"] == b64(a.public)
    own = await a.sample(4, request_id=8)
    assert own["batches"] == []  # never your own batches
    await a.close()
    await b.close()


async def test_a_batch_sent_again_after_a_lost_acknowledgement_is_acknowledged_and_stored_once(
    start_relay: StartRelay,
) -> None:
    relay = start_relay()
    a, b = await joined(relay.url), await joined(relay.url)
    payload = a.batch_payload([item()])
    message = {"type": "publish", "v": 1, "payload": payload, "sig": a.sign(payload)}
    await a.send(message)
    assert (await a.recv())["type"] == "published"
    await a.close()  # the acknowledgement is "lost": the link goes, and the client sends the batch again
    again = await joined(relay.url, key=a.key)
    await again.send(message)
    assert await again.recv() == {"type": "published", "v": 1, "seq": a.seq}
    changed = again.batch_payload([item()], seq=a.seq)  # the same number on other content is still a replay
    await again.send({"type": "publish", "v": 1, "payload": changed, "sig": again.sign(changed)})
    assert (await again.recv())["code"] == p.E_REPLAY
    got = await b.sample(16)
    assert [json.loads(x["payload"])["seq"] for x in got["batches"]] == [a.seq]  # stored once
    metrics = http_text(relay.url, "/metrics")
    assert "sapling_relay_resends_acknowledged_total 1" in metrics and "sapling_relay_publishes_total 1" in metrics
    assert f'sapling_relay_rejections_total{{code="{p.E_REPLAY}"}} 1' in metrics
    await again.close()
    await b.close()


def test_the_window_knows_a_batch_it_holds_until_the_batch_leaves_it() -> None:
    from engine.relay.brokers import Entry, Window

    window = Window(2, epoch="t")
    window.add(Entry("a", "one", "s", 1), (1, 0))
    window.add(Entry("b", "two", "s", 1), (2, 0))
    assert window.holds("a", 1, "one") and window.holds("b", 1, "two")
    assert not window.holds("a", 1, "other") and not window.holds("a", 2, "one") and not window.holds("c", 1, "one")
    window.add(Entry("a", "three", "s", 2), (3, 0))  # the first batch leaves the ring of two
    assert not window.holds("a", 1, "one") and window.holds("b", 1, "two") and window.holds("a", 2, "three")
    window.add(Entry("a", "three", "s", 2), (4, 0))  # the same batch twice in the ring (a stream read again)
    window.add(Entry("c", "four", "s", 1), (5, 0))  # the older copy leaves; the newer one is still held
    assert window.holds("a", 2, "three") and not window.holds("b", 1, "two") and len(window) == 2


async def test_handshake_refuses_bad_signature_wrong_nonce_and_stale_time(start_relay: StartRelay) -> None:
    relay = start_relay()
    for kw, code in (({"bad_sig": True}, p.E_BAD_SIGNATURE), ({"nonce": "ab" * 32}, p.E_AUTH),
                     ({"ts": time.time() - 3600}, p.E_STALE)):
        peer = DocPeer(relay.url)
        answer = await peer.connect(**kw)  # type: ignore[arg-type]
        assert answer["type"] == "error" and answer["code"] == code, (kw, answer)
        assert (await peer.recv())["type"] == "closed"
        await peer.close()
    honest = await joined(relay.url)
    assert (await honest.publish([item()]))["type"] == "published"
    await honest.close()


async def test_first_message_must_be_hello(start_relay: StartRelay) -> None:
    relay = start_relay()
    peer = DocPeer(relay.url)
    await peer.connect(hello=False)
    await peer.send({"type": "sample", "v": 1, "id": 1, "n": 1})
    answer = await peer.recv()
    assert answer["code"] == p.E_AUTH
    await peer.close()


async def test_every_bad_publish_gets_its_named_error_and_the_relay_keeps_serving(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    bad, good = await joined(relay.url), await joined(relay.url)
    other = DocPeer(relay.url)

    # a signature that does not verify
    payload = bad.batch_payload([item()])
    await bad.send({"type": "publish", "v": 1, "payload": payload, "sig": b64(b"\0" * 64)})
    assert (await bad.recv())["code"] == p.E_BAD_SIGNATURE
    # a batch signed by (and naming) another key than the connection's
    payload = bad.batch_payload([item()], key=other.public)
    await bad.send({"type": "publish", "v": 1, "payload": payload, "sig": other.sign(payload)})
    assert (await bad.recv())["code"] == p.E_BAD_SIGNATURE
    # replay: the same sequence number again, then a lower one
    assert (await bad.publish([item()], seq=10))["type"] == "published"
    assert (await bad.publish([item()], seq=10))["code"] == p.E_REPLAY
    assert (await bad.publish([item()], seq=9))["code"] == p.E_REPLAY
    # stale timestamp
    assert (await bad.publish([item()], ts=time.time() - 10_000))["code"] == p.E_STALE
    # too many items, too many completions, an over-long completion
    assert (await bad.publish([item()] * (p.MAX_ITEMS_PER_BATCH + 1)))["code"] == p.E_TOO_MANY_ITEMS
    many = item(completions=tuple(f"<answer>{i}</answer>" for i in range(p.MAX_COMPLETIONS_PER_ITEM + 1)))
    assert (await bad.publish([many]))["code"] == p.E_TOO_MANY_ITEMS
    long = item(completions=("x" * (p.MAX_COMPLETION_CHARS + 1),))
    assert (await bad.publish([long]))["code"] == p.E_TOO_LONG
    # an oversize frame (under the hard cut-off): rejected, connection kept
    await bad.send_raw(json.dumps({"type": "publish", "v": 1, "payload": "x" * (p.MAX_FRAME_BYTES + 10), "sig": ""}))
    assert (await bad.recv())["code"] == p.E_TOO_LARGE
    # garbage and schema errors
    await bad.send_raw("{not json")
    assert (await bad.recv())["code"] == p.E_BAD_JSON
    await bad.send({"type": "sample", "v": 1, "id": 3, "n": 999})
    assert (await bad.recv())["code"] == p.E_BAD_SCHEMA
    await bad.send({"type": "sample", "v": 2, "id": 3, "n": 1})
    assert (await bad.recv())["code"] == p.E_VERSION  # and the relay closes: wrong protocol
    assert (await bad.recv())["type"] == "closed"

    # the honest peer saw none of it and still gets exactly the one good batch
    assert (await good.publish([item()]))["type"] == "published"
    got = await good.sample(16)
    assert len(got["batches"]) == 1 and json.loads(got["batches"][0]["payload"])["seq"] == 10
    metrics = urllib.request.urlopen(relay.url.replace("ws://", "http://").replace("/ws", "/metrics")).read().decode()
    assert f'sapling_relay_rejections_total{{code="{p.E_REPLAY}"}} 2' in metrics
    assert "sapling_relay_publishes_total 2" in metrics
    await good.close()
    await bad.close()


async def test_a_flood_is_rate_limited_without_slowing_honest_peers(start_relay: StartRelay) -> None:
    relay = start_relay(rate=2.0, burst=5.0)
    flood, honest = await joined(relay.url), await joined(relay.url)
    # Hold the relay's loop while the flood is written, so all 40 frames arrive in one read,
    # as they do on a loaded machine: answering them must not count the flood as a slow consumer.
    relay._loop.call_soon_threadsafe(time.sleep, 0.5)
    for i in range(40):
        await flood.send({"type": "sample", "v": 1, "id": i, "n": 1})
    answers = [await flood.recv() for _ in range(40)]
    limited = [a for a in answers if a["type"] == "error" and a["code"] == p.E_RATE]
    assert len(limited) >= 30
    assert all(a["id"] is not None for a in limited)
    started = time.monotonic()
    assert (await honest.publish([item()]))["type"] == "published"
    assert (await honest.sample(1))["type"] == "batches"
    assert time.monotonic() - started < 5.0
    await flood.close()
    await honest.close()


async def test_a_slow_consumer_is_dropped_and_others_are_unaffected(start_relay: StartRelay) -> None:
    relay = start_relay(send_queue=4, rate=10_000.0, burst=10_000.0)
    publisher, slow, fast = await joined(relay.url), await joined(relay.url), await joined(relay.url)
    big = item(completions=tuple("y" * 8000 for _ in range(12)))
    assert (await publisher.publish([big] * 2))["type"] == "published"
    # `slow` asks for far more than it reads: its socket buffers fill, then its queue.
    assert slow.ws is not None
    for i in range(400):
        try:
            await slow.send({"type": "sample", "v": 1, "id": i, "n": 16})
        except (ConnectionError, RuntimeError):
            break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(c.peer == slow.peer_id for c in relay.relay.connections):
        await asyncio.sleep(0.1)
    assert not any(c.peer == slow.peer_id for c in relay.relay.connections)
    assert relay.relay.rejections[p.E_SLOW] >= 1
    got = await fast.sample(1)
    assert got["type"] == "batches" and len(got["batches"]) == 1
    await slow.close()
    await fast.close()
    await publisher.close()


async def test_connections_per_ip_are_capped(start_relay: StartRelay) -> None:
    relay = start_relay(max_conn_per_ip=2)
    a, b = await joined(relay.url), await joined(relay.url)
    c = DocPeer(relay.url)
    assert c.session is None
    import aiohttp

    c.session = aiohttp.ClientSession()
    c.ws = await c.session.ws_connect(relay.url)
    answer = await c.recv()
    assert answer["type"] == "error" and answer["code"] == p.E_CONN_LIMIT
    await c.close()
    await a.close()
    d = await joined(relay.url)  # a slot freed up
    await b.close()
    await d.close()


async def test_private_swarm_token_allow_list_and_ban_list(start_relay: StartRelay) -> None:
    relay = start_relay(join_token="s3cret")
    assert (await DocPeer(relay.url).connect())["code"] == p.E_FORBIDDEN
    ok = await joined(relay.url, token="s3cret")
    await ok.close()

    allowed = DocPeer("")
    relay2 = start_relay(allow_keys=[b64(allowed.public)])
    allowed.url = relay2.url
    assert (await allowed.connect())["type"] == "welcome"
    assert (await DocPeer(relay2.url).connect())["code"] == p.E_FORBIDDEN
    await allowed.close()

    banned = DocPeer("")
    relay3 = start_relay(ban_keys=[banned.peer_id])
    banned.url = relay3.url
    assert (await banned.connect())["code"] == p.E_BANNED
    await (await joined(relay3.url)).close()


async def test_healthz_and_stats(start_relay: StartRelay) -> None:
    relay = start_relay()
    peer = await joined(relay.url)
    await peer.send({"type": "stats", "v": 1})
    stats = await peer.recv(skip_stats=False)
    assert stats["type"] == "stats" and stats["window"] == 0
    health = json.loads(urllib.request.urlopen(relay.url.replace("ws://", "http://").replace("/ws", "/healthz")).read())
    assert health["status"] == "ok" and health["connections"] == 1
    await peer.close()


async def test_sigterm_closes_connections_cleanly_and_exits_zero(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "relay.toml"
    config.write_text('name = "toml-relay"\nwindow = 8\n')
    proc = subprocess.Popen([sys.executable, "-m", "engine.relay", "--port", str(port), "--config", str(config),
                             "--data-dir", str(tmp_path / "relay")], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        url = f"ws://127.0.0.1:{port}/ws"
        deadline = time.monotonic() + 30
        while True:
            try:
                peer = DocPeer(url)
                challenge = await peer.connect(hello=False)
                break
            except OSError:
                await peer.close()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        assert challenge["relay"] == "toml-relay"
        await peer.close()
        peer = await joined(url)
        proc.send_signal(signal.SIGTERM)
        answer = await peer.recv()
        assert answer["type"] == "error" and answer["code"] == p.E_SHUTDOWN
        assert proc.wait(timeout=20) == 0
        await peer.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        logs = proc.stderr.read() if proc.stderr else ""
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert any(rec["msg"] == "relay shutting down" for rec in lines)


def test_bad_flags_and_config_exit_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("port = 'x'\n")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("colour = 1\n")
    for args in (["--config", str(bad)], ["--config", str(unknown)], ["--rate", "-1"],
                 ["--ban-keys-file", str(tmp_path / "missing")], ["--redis", "http://x"]):
        out = subprocess.run([sys.executable, "-m", "engine.relay", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env={**os.environ})
        assert out.returncode == 2, (args, out.stderr)
        record = json.loads(out.stderr)  # one JSON line, as every log line of the relay
        assert record["level"] == "error" and record["msg"].startswith("sapling-relay cannot start: "), out.stderr
    help_text = subprocess.run([sys.executable, "-m", "engine.relay", "--help"], cwd=ROOT, capture_output=True,
                               text=True, timeout=60).stdout
    for flag in ("--redis", "--join-token", "--allow-keys-file", "--ban-keys-file", "--max-conn-per-ip", "--rate",
                 "--send-queue", "--window", "--name", "--description", "--contact", "--public-url", "--data-dir"):
        assert flag in help_text


@pytest.mark.parametrize("bad", ["x", "not-a-key", "AAAA", "0123456789abcdef012"])
def test_key_lists_reject_garbage(bad: str, tmp_path: Path) -> None:
    from engine.relay.settings import settings_from_args

    keys = tmp_path / "keys"
    keys.write_text(f"# comment\n\n{bad}\n")
    with pytest.raises(ValueError):
        settings_from_args(["--ban-keys-file", str(keys)])


async def test_online_counts_peers_the_moment_they_join_and_leave(start_relay: StartRelay) -> None:
    relay = start_relay()
    a, b = await joined(relay.url), await joined(relay.url)
    await b.send({"type": "stats", "v": 1})
    stats = await b.recv(skip_stats=False)
    assert stats["online"] == 2
    assert json.loads(http_text(relay.url, "/healthz"))["online"] == 2
    await a.close()
    await b.close()
    deadline = time.monotonic() + 10
    while json.loads(http_text(relay.url, "/healthz"))["connections"] and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    health = json.loads(http_text(relay.url, "/healthz"))
    assert health["connections"] == 0 and health["online"] == 0
    assert "sapling_relay_peers_online 0" in http_text(relay.url, "/metrics")


async def test_a_client_silent_for_two_pings_gets_heartbeat_timeout_and_close_1008(start_relay: StartRelay) -> None:
    beat = 0.25
    relay = start_relay(heartbeat=beat)
    silent = DocPeer(relay.url)
    assert (await silent.connect(answer_pings=False))["type"] == "welcome"
    joined_at = time.monotonic()
    honest = await joined(relay.url)
    assert honest.ws is not None
    reader = asyncio.create_task(honest.recv(timeout=60))  # reading is what answers pings

    deadline = time.monotonic() + 20
    while not relay.relay.rejections[p.E_HEARTBEAT] and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    dropped_after = time.monotonic() - joined_at
    assert relay.relay.rejections[p.E_HEARTBEAT] == 1  # the silent one only
    assert dropped_after >= 2 * beat  # not after the first missed ping
    answer = await silent.recv()
    assert answer["type"] == "error" and answer["code"] == p.E_HEARTBEAT
    assert await silent.recv() == {"type": "closed", "code": 1008}
    assert not reader.done()  # the honest peer is still connected, with nothing to read
    reader.cancel()
    await asyncio.wait([reader])
    await honest.send({"type": "stats", "v": 1})
    assert (await honest.recv(skip_stats=False))["type"] == "stats"
    await silent.close()
    await honest.close()


async def test_a_slow_consumer_that_reads_again_finds_slow_consumer_and_close_1008(start_relay: StartRelay) -> None:
    relay = start_relay(send_queue=4, rate=10_000.0, burst=10_000.0)
    publisher, slow = await joined(relay.url), await joined(relay.url)
    big = item(completions=tuple("y" * 8000 for _ in range(12)))
    assert (await publisher.publish([big] * 2))["type"] == "published"
    for i in range(400):
        await slow.send({"type": "sample", "v": 1, "id": i, "n": 16})
        if relay.relay.rejections[p.E_SLOW]:
            break
    deadline = time.monotonic() + 20
    while not relay.relay.rejections[p.E_SLOW] and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert relay.relay.rejections[p.E_SLOW] == 1
    answers = []
    while (answer := await slow.recv())["type"] != "closed":
        answers.append(answer)
    assert answers[-1]["type"] == "error" and answers[-1]["code"] == p.E_SLOW
    assert all(a["type"] == "batches" for a in answers[:-1])
    assert answer["code"] == 1008
    await slow.close()
    await publisher.close()


async def test_a_join_token_and_an_allow_list_together_need_both(start_relay: StartRelay) -> None:
    allowed = DocPeer("", token="s3cret")
    relay = start_relay(join_token="s3cret", allow_keys=[b64(allowed.public)])
    allowed.url = relay.url
    no_token = DocPeer(relay.url, key=allowed.key)
    assert (await no_token.connect())["code"] == p.E_FORBIDDEN
    stranger = DocPeer(relay.url, token="s3cret")
    assert (await stranger.connect())["code"] == p.E_FORBIDDEN
    assert (await allowed.connect())["type"] == "welcome"
    for peer in (no_token, stranger, allowed):
        await peer.close()


async def test_refusals_are_summed_per_peer_at_info_level(start_relay: StartRelay,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sapling.relay")
    relay = start_relay(reject_log_every=0.2)
    peer = await joined(relay.url)
    for _ in range(3):
        await peer.send_raw("{not json")
        assert (await peer.recv())["code"] == p.E_BAD_JSON
    await peer.send({"type": "sample", "v": 1, "id": 1, "n": 99})
    assert (await peer.recv())["code"] == p.E_BAD_SCHEMA

    def summaries() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "refused messages"
                and getattr(r, "peer", "") == peer.peer_id]

    deadline = time.monotonic() + 10
    while not summaries() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    record = summaries()[0]
    assert record.levelno == logging.INFO
    assert record.codes == {p.E_BAD_JSON: 3, p.E_BAD_SCHEMA: 1} and record.total == 4  # type: ignore[attr-defined]
    assert record.ip == "127.0.0.1"  # type: ignore[attr-defined]
    await peer.close()


async def test_a_second_sigterm_during_shutdown_is_ignored_and_the_relay_exits_zero(
        caplog: pytest.LogCaptureFixture) -> None:
    from engine.relay.brokers import MemoryBroker
    from engine.relay.cli import serve
    from engine.relay.server import Relay, RelaySettings

    class HeldBroker(MemoryBroker):
        """Holds the shutdown open until the test lets go, so the second signal lands inside it."""

        def __init__(self) -> None:
            super().__init__(8)
            self.closing = asyncio.Event()
            self.release = asyncio.Event()

        async def close(self) -> None:
            self.closing.set()
            await self.release.wait()

    caplog.set_level(logging.INFO, logger="sapling.relay")
    broker = HeldBroker()
    port = free_port()
    running = asyncio.create_task(serve(Relay(RelaySettings(port=port), broker=broker)))
    url = f"ws://127.0.0.1:{port}/ws"
    deadline = time.monotonic() + 20
    while not any(r.getMessage() == "listening" for r in caplog.records) and not running.done():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    peer = await joined(url)
    previous = signal.getsignal(signal.SIGTERM)
    assert previous not in (signal.SIG_DFL, signal.SIG_IGN)  # serve() took SIGTERM: sending one is safe
    os.kill(os.getpid(), signal.SIGTERM)
    answer = await peer.recv()
    assert answer["type"] == "error" and answer["code"] == p.E_SHUTDOWN
    assert await peer.recv() == {"type": "closed", "code": 1001}
    await asyncio.wait_for(broker.closing.wait(), 20)
    os.kill(os.getpid(), signal.SIGTERM)  # the second one, while the shutdown is still going
    deadline = time.monotonic() + 20
    while not any(r.getMessage() == "already shutting down; ignoring SIGTERM" for r in caplog.records):
        assert time.monotonic() < deadline and not running.done()
        await asyncio.sleep(0.02)
    broker.release.set()
    assert await asyncio.wait_for(running, 20) == 0
    await peer.close()
