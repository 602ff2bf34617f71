"""Relay load test on loopback: N peers held at once, publishing and sampling on a round period.

    .venv/bin/python -m bench.relay_load                 # 2000 peers, 100 publishes/s, 30 s
    .venv/bin/python -m bench.relay_load --peers 200 --seconds 10

The relay runs as its own process (`python -m engine.swarm.relay`), so its
CPU and RSS are measured alone. Every peer does the real protocol: Ed25519
handshake, signed ~20 KB batches, `sample` of 4 batches. Peers are spread
evenly over the round period, which is peers / rate seconds, so the relay
sees `--rate` publishes/s and as many sample requests/s.

It prints connections held, publishes/s achieved, the sample round trip
p50/p99 under load, and the same round trip measured on the idle relay
before the load starts (the peer this run is compared with, since the
machine is noisy), plus the relay's CPU and peak RSS, against the targets:
2,000 peers held, p99 under 250 ms at 100 publishes/s, RSS under 1 GB.
Everything is bounded: peer count, duration, and a hard deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil

from engine.swarm import protocol as p
from engine.swarm.identity import Identity

ROOT = Path(__file__).resolve().parents[1]
TARGET_PEERS = 2000
TARGET_P99_MS = 250.0
TARGET_RSS_BYTES = 1 << 30
HARD_DEADLINE_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch_items(rng: random.Random, size: int) -> list[p.Item]:
    """About `size` bytes of plausible rollouts: 4 questions x 6 completions."""
    per = max(16, size // 24 - 40)
    items = []
    for q in range(4):
        completions = tuple("".join(rng.choice("abcdefghij <>/0123456789") for _ in range(per)) for _ in range(6))
        task = {"dataset": "basic_arithmetic", "config": {}, "seed": rng.randrange(1000), "index": q}
        items.append(p.Item(task, f"Question {q}: what is {rng.randrange(100)} + {rng.randrange(100)}?",
                            completions, tuple(0.0 for _ in completions)))
    return items


class Peer:
    def __init__(self, url: str, identity: Identity) -> None:
        self.url = url
        self.identity = identity
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.pending: dict[int, tuple[asyncio.Future[float], float]] = {}
        self.next_id = 0
        self.seq = 0
        self.reader: asyncio.Task[None] | None = None
        self.published = 0
        self.errors: dict[str, int] = {}

    async def connect(self, session: aiohttp.ClientSession) -> None:
        self.ws = await session.ws_connect(self.url, max_msg_size=p.MAX_RESPONSE_BYTES, heartbeat=p.HEARTBEAT_S)
        challenge = json.loads((await self.ws.receive()).data)
        payload = p.hello_payload(self.identity.public_key, challenge["nonce"], time.time(), "", "relay-load/1")
        await self.ws.send_str(p.encode(p.msg_hello(self.identity.signed(payload))))
        welcome = json.loads((await self.ws.receive()).data)
        if welcome.get("type") != "welcome":
            raise ConnectionError(f"refused: {welcome}")
        self.reader = asyncio.create_task(self.read())

    async def read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            kind = data.get("type")
            if kind == "batches":
                entry = self.pending.pop(data["id"], None)
                if entry is not None and not entry[0].done():
                    entry[0].set_result(time.perf_counter() - entry[1])
            elif kind == "published":
                self.published += 1
            elif kind == "error":
                self.errors[data["code"]] = self.errors.get(data["code"], 0) + 1
                entry = self.pending.pop(data.get("id"), None) if data.get("id") is not None else None
                if entry is not None and not entry[0].done():
                    entry[0].set_exception(RuntimeError(data["code"]))

    async def publish(self, items: list[p.Item]) -> None:
        assert self.ws is not None
        self.seq = max(self.seq + 1, int(time.time() * 1000))
        payload = p.batch_payload(self.identity.public_key, self.seq, time.time(), "bench", items)
        await self.ws.send_str(p.encode(p.msg_publish(self.identity.signed(payload))))

    async def sample(self, n: int) -> float:
        assert self.ws is not None
        self.next_id += 1
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = (future, time.perf_counter())
        await self.ws.send_str(p.encode(p.msg_sample(self.next_id, n)))
        return await asyncio.wait_for(future, 30)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> int:
    port = free_port()
    relay = subprocess.Popen(
        [sys.executable, "-m", "engine.swarm.relay", "--port", str(port), "--max-conn-per-ip", str(args.peers + 100),
         "--rate", "50", "--burst", "50", "--window", "1024", "--log-level", "warning"],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )
    proc = psutil.Process(relay.pid)
    url = f"ws://127.0.0.1:{port}/ws"
    rng = random.Random(0)
    peak_rss = 0
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            # The peer measured in the same run: round trips on the idle relay.
            probe, other = Peer(url, Identity.generate()), Peer(url, Identity.generate())
            await probe.connect(session)
            await other.connect(session)
            for _ in range(4):
                await other.publish(batch_items(rng, args.batch_bytes))
                await asyncio.sleep(0.05)
            idle = []
            for _ in range(50):
                idle.append(await probe.sample(4))
                await asyncio.sleep(0.02)

            print(f"connecting {args.peers} peers ...", flush=True)
            identities = [Identity.generate() for _ in range(args.peers)]
            peers = [Peer(url, ident) for ident in identities]
            t0 = time.perf_counter()
            sem = asyncio.Semaphore(64)

            async def join(peer: Peer) -> bool:
                async with sem:
                    try:
                        await peer.connect(session)
                        return True
                    except (TimeoutError, aiohttp.ClientError, OSError, ConnectionError) as exc:
                        peer.errors[type(exc).__name__] = 1
                        return False

            ok = await asyncio.gather(*(join(peer) for peer in peers))
            held = [peer for peer, good in zip(peers, ok, strict=True) if good]
            connect_s = time.perf_counter() - t0
            print(f"held {len(held)}/{args.peers} connections after {connect_s:.1f} s", flush=True)
            proc.cpu_percent(None)

            period = len(held) / args.rate
            rtts: list[float] = []
            failures = 0
            payloads = [batch_items(rng, args.batch_bytes) for _ in range(16)]
            start = time.perf_counter()
            stop_at = start + args.seconds

            async def one_peer(i: int, peer: Peer) -> None:
                nonlocal failures
                await asyncio.sleep(min((i / len(held)) * period, args.seconds))
                while time.perf_counter() < stop_at:
                    began = time.perf_counter()
                    try:
                        await peer.publish(payloads[i % len(payloads)])
                        rtts.append(await peer.sample(4))
                    except (TimeoutError, RuntimeError, ConnectionError, aiohttp.ClientError):
                        failures += 1
                    wake = min(began + period, stop_at)
                    await asyncio.sleep(max(0.0, wake - time.perf_counter()))

            async def watch() -> None:
                nonlocal peak_rss
                while time.perf_counter() < stop_at:
                    peak_rss = max(peak_rss, proc.memory_info().rss)
                    await asyncio.sleep(0.5)

            await asyncio.wait_for(
                asyncio.gather(watch(), *(one_peer(i, peer) for i, peer in enumerate(held))), HARD_DEADLINE_S
            )
            elapsed = min(time.perf_counter(), stop_at) - start
            cpu = proc.cpu_percent(None)
            published = sum(peer.published for peer in held)
            still_open = sum(1 for peer in held if peer.ws is not None and not peer.ws.closed)
            errors: dict[str, int] = {}
            for peer in held:
                for code, n in peer.errors.items():
                    errors[code] = errors.get(code, 0) + n
            for peer in [*held, probe, other]:
                if peer.ws is not None:
                    await peer.ws.close()
    finally:
        relay.terminate()
        try:
            relay.wait(timeout=20)
        except subprocess.TimeoutExpired:
            relay.kill()

    p50, p99 = pct(rtts, 0.50) * 1000, pct(rtts, 0.99) * 1000
    idle50, idle99 = pct(idle, 0.50) * 1000, pct(idle, 0.99) * 1000
    print()
    print(f"peers held at the end     {still_open} of {args.peers} (target {TARGET_PEERS})")
    print(f"publishes/s               {published / elapsed:.1f} (asked {args.rate:g}; batch ~{args.batch_bytes // 1024} KB)")
    print(f"sample round trip, load   p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(rtts)} samples (target p99 < {TARGET_P99_MS:g} ms)")
    print(f"sample round trip, idle   p50 {idle50:.1f} ms, p99 {idle99:.1f} ms (same relay, before the load)")
    print(f"p99 ratio load/idle       {p99 / idle99:.1f}x")
    print(f"relay CPU                 {cpu:.0f}% of one core (2-core machine; the load generator shares it)")
    print(f"relay peak RSS            {peak_rss / 2**20:.0f} MB (target < {TARGET_RSS_BYTES // 2**20} MB)")
    print(f"failed round trips        {failures}; errors {errors or 'none'}")
    met = still_open >= min(args.peers, TARGET_PEERS) and p99 < TARGET_P99_MS and peak_rss < TARGET_RSS_BYTES
    print(f"targets                   {'met' if met else 'NOT met'}")
    print(f"(median {statistics.median(rtts) * 1000:.1f} ms)" if rtts else "")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=TARGET_PEERS)
    parser.add_argument("--rate", type=float, default=100.0, help="publishes per second across all peers")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured load duration (bounded by 300)")
    parser.add_argument("--batch-bytes", type=int, default=20_000)
    args = parser.parse_args()
    if not 1 <= args.peers <= 5000 or not 0 < args.seconds <= 300 or args.rate <= 0:
        parser.error("peers must be 1-5000, seconds 0-300, rate positive")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
