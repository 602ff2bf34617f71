"""The parts the relay benches share: relay subprocesses, peers that speak the real protocol.

    from bench.relay_peers import Peer, RelayProcess, connect_all, drive    # bench/relay_{load,scaleout,faults}.py

A `RelayProcess` is `python -m engine.relay` on a free loopback port with
its JSON log in a file and its CPU and memory read by psutil; redis-server is
bench/harness/servers.py's `RedisServer` (free ports and waiting for a listener come
from there too). A `Peer` does what a node does on the wire (Ed25519 handshake,
signed ~20 KB batches, `sample`), and can move to the next relay process when
its connection drops, with the node client's backoff. `drive` makes peers
publish and sample once per round period, spread evenly over it.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.harness.servers import free_port, stop_process, wait_listening
from engine.swarm import protocol
from engine.swarm.identity import Identity
from engine.swarm.link import BACKOFF_CAP_S, BACKOFF_START_S

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_N = 4  # batches a peer asks for each round, as a node asks for J = 4
WINDOW = 4096  # relays' window: holds every batch of the fault phase a checker may still ask for
CONNECT_CONCURRENCY = 64
TARGET_P99_MS = 250.0  # the sample round trip both benches hold peers to


def batch_items(rng: random.Random, size: int) -> list[protocol.Item]:
    """About `size` bytes of plausible rollouts: 4 questions x 6 completions."""
    per = max(16, size // 24 - 40)
    items = []
    for q in range(4):
        completions = tuple("".join(rng.choice("abcdefghij <>/0123456789") for _ in range(per)) for _ in range(6))
        task = {"dataset": "basic_arithmetic", "config": {}, "seed": rng.randrange(1000), "index": q}
        items.append(protocol.Item(task, f"Question {q}: what is {rng.randrange(100)} + {rng.randrange(100)}?",
                            completions, tuple(0.0 for _ in completions)))
    return items


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- processes --------------------------------------------------------------------------------
class RelayProcess:
    """One relay subprocess on a free port; its JSON log in a file, its CPU and memory read by psutil."""

    def __init__(self, workdir: Path, name: str, *, redis_url: str = "", max_conn: int = 100, window: int = WINDOW,
                 log_level: str = "info", extra: list[str] | None = None, port: int = 0) -> None:
        self.name = name
        self.port = port or free_port()  # a given port: the same process started again where a proxy expects it
        self.url = f"ws://127.0.0.1:{self.port}/ws"
        self.log_path = workdir / f"{name}.log"
        argv = [sys.executable, "-m", "engine.relay", "--port", str(self.port), "--max-conn-per-ip",
                str(max_conn), "--rate", "50", "--burst", "50", "--window", str(window),
                "--data-dir", str(workdir / f"{name}-data"), "--log-level", log_level]
        if redis_url:
            argv += ["--redis", redis_url]
        argv += extra or []
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        self.ps = psutil.Process(self.proc.pid)

    async def ready(self) -> None:
        await asyncio.to_thread(wait_listening, self.port, self.proc, f"relay {self.name} (log: {self.log_path})",
                                self.log_path)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        stop_process(self.proc)

    def log(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines

    async def metrics(self, session: aiohttp.ClientSession) -> dict[str, float]:
        async with session.get(f"http://127.0.0.1:{self.port}/metrics") as response:
            text = await response.text()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, _, value = line.partition(" ")
                values[name] = float(value)
        return values


# -- peers ------------------------------------------------------------------------------------
class Peer:
    """One node's connection: the real handshake, signed publishes, samples and their round trip.

    `urls` are the relay processes it may use, its home first. With `failover`, a peer
    whose connection drops joins the next one after the node client's backoff (0.5 s
    doubling, full jitter). A `watch` peer is a checker: it remembers every (key, seq)
    it is handed and keeps the relay's sampling cursor.
    """

    def __init__(self, urls: list[str], identity: Identity, *, failover: bool = False, watch: bool = False) -> None:
        self.urls = urls
        self.at = 0  # index in urls of the relay in use
        self.identity = identity
        self.key_b64 = protocol.b64encode(identity.public_key)
        self.failover = failover
        self.watch = watch
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.pending: dict[int, tuple[asyncio.Future[float], float, int]] = {}
        self.next_id = 0
        self.seq = 0
        self.reader: asyncio.Task[None] | None = None
        self.rejoiner: asyncio.Task[None] | None = None
        self.connected = False
        self.closing = False
        self.published = 0
        self.acked: list[tuple[int, float]] = []  # (seq, when) for every `published` answer
        self.delivered = 0  # batches received in sample answers
        self.errors: Counter[str] = Counter()
        self.seen: set[tuple[str, int]] = set()
        self.cursor: str | None = None
        self.full_answers = 0  # checker answers holding as many batches as asked: some new ones may be skipped
        self.moves: list[tuple[float, float]] = []  # (dropped at, joined the next relay at), perf_counter
        self.rng = random.Random()

    @property
    def url(self) -> str:
        return self.urls[self.at]

    async def connect(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        ws = await session.ws_connect(self.url, max_msg_size=protocol.MAX_RESPONSE_BYTES,
                                      heartbeat=protocol.HEARTBEAT_S)
        try:
            challenge = json.loads((await asyncio.wait_for(ws.receive(), 30)).data)
            payload = protocol.hello_payload(self.identity.public_key, challenge["nonce"], time.time(), "",
                                             "relay-load/2")
            await ws.send_str(protocol.encode(protocol.msg_hello(self.identity.signed(payload))))
            welcome = json.loads((await asyncio.wait_for(ws.receive(), 30)).data)
        except BaseException:
            await ws.close()
            raise
        if welcome.get("type") != "welcome":
            await ws.close()
            raise ConnectionError(f"refused: {welcome}")
        self.ws = ws
        self.connected = True
        self.reader = asyncio.create_task(self.read(ws))

    async def read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            kind = data.get("type")
            if kind == "batches":
                self.on_batches(data)
            elif kind == "published":
                self.published += 1
                self.acked.append((int(data["seq"]), time.perf_counter()))
            elif kind == "error":
                self.errors[data["code"]] += 1
                entry = self.pending.pop(data.get("id"), None) if data.get("id") is not None else None
                if entry is not None and not entry[0].done():
                    entry[0].set_exception(RuntimeError(data["code"]))
        self.connected = False
        for future, _, _ in self.pending.values():
            if not future.done():
                future.set_exception(ConnectionError("connection lost"))
        self.pending.clear()
        if self.failover and not self.closing:
            self.rejoiner = asyncio.create_task(self.rejoin())

    def on_batches(self, data: dict[str, Any]) -> None:
        entry = self.pending.pop(data["id"], None)
        batches = data["batches"]
        self.delivered += len(batches)
        if self.watch:
            for batch in batches:
                payload = json.loads(batch["payload"])
                self.seen.add((payload["key"], int(payload["seq"])))
            if data.get("cursor") is not None:
                self.cursor = data["cursor"]
            if entry is not None and len(batches) >= entry[2]:
                self.full_answers += 1
        if entry is not None and not entry[0].done():
            entry[0].set_result(time.perf_counter() - entry[1])

    async def rejoin(self) -> None:
        dropped = time.perf_counter()
        attempt = 0
        assert self.session is not None
        while not self.closing:
            await asyncio.sleep(self.rng.uniform(0, min(BACKOFF_CAP_S, BACKOFF_START_S * 2**attempt)))
            self.at = (self.at + 1) % len(self.urls)
            try:
                await self.connect(self.session)
            except (TimeoutError, aiohttp.ClientError, OSError, ConnectionError, ValueError):
                attempt = min(attempt + 1, 16)
                continue
            self.moves.append((dropped, time.perf_counter()))
            return

    async def publish(self, items: list[protocol.Item]) -> None:
        ws = self.ws
        if ws is None or not self.connected:
            raise ConnectionError("not connected")
        self.seq = max(self.seq + 1, int(time.time() * 1000))
        payload = protocol.batch_payload(self.identity.public_key, self.seq, time.time(), "bench", items)
        await ws.send_str(protocol.encode(protocol.msg_publish(self.identity.signed(payload))))

    async def sample(self, n: int, after: str | None = None) -> float:
        """The round trip of one `sample` of n batches, in seconds."""
        ws = self.ws
        if ws is None or not self.connected:
            raise ConnectionError("not connected")
        self.next_id += 1
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        request_id = self.next_id
        self.pending[request_id] = (future, time.perf_counter(), n)
        try:
            await ws.send_str(protocol.encode(protocol.msg_sample(request_id, n, after)))
        except BaseException:
            self.pending.pop(request_id, None)
            future.cancel()
            raise
        return await asyncio.wait_for(future, 30)

    async def close(self) -> None:
        self.closing = True
        if self.rejoiner is not None:
            self.rejoiner.cancel()
        if self.ws is not None and not self.ws.closed:
            await self.ws.close()


async def connect_all(session: aiohttp.ClientSession, peers: list[Peer]) -> list[Peer]:
    """Connect the peers, CONNECT_CONCURRENCY at a time; the ones that made it."""
    sem = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def join(peer: Peer) -> bool:
        async with sem:
            try:
                await peer.connect(session)
                return True
            except (TimeoutError, aiohttp.ClientError, OSError, ConnectionError) as exc:
                peer.errors[type(exc).__name__] += 1
                return False

    ok = await asyncio.gather(*(join(peer) for peer in peers))
    return [peer for peer, good in zip(peers, ok, strict=True) if good]


@dataclass
class Load:
    rtts: list[float] = field(default_factory=list)
    failures: int = 0  # round trips that failed (connection lost, error answer, timeout)
    skipped: int = 0  # rounds a peer spent without a connection (moving to another relay)
    seconds: float = 0.0


async def drive(peers: list[Peer], period: float, seconds: float, payloads: list[list[protocol.Item]]) -> Load:
    """Each peer publishes a batch and samples SAMPLE_N once per `period`, the peers spread evenly over it."""
    load = Load()
    start = time.perf_counter()
    stop_at = start + seconds

    async def one(i: int, peer: Peer) -> None:
        await asyncio.sleep(min((i / max(1, len(peers))) * period, seconds))
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            if peer.connected:
                try:
                    await peer.publish(payloads[i % len(payloads)])
                    load.rtts.append(await peer.sample(SAMPLE_N))
                except (TimeoutError, RuntimeError, ConnectionError, aiohttp.ClientError):
                    load.failures += 1
            else:
                load.skipped += 1
            await asyncio.sleep(max(0.0, min(began + period, stop_at) - time.perf_counter()))

    await asyncio.wait_for(asyncio.gather(*(one(i, peer) for i, peer in enumerate(peers))), seconds + 60)
    load.seconds = min(time.perf_counter(), stop_at) - start
    return load


async def idle_round_trips(session: aiohttp.ClientSession, url: str, rng: random.Random,
                           batch_bytes: int) -> list[float]:
    """The reference: 50 sample round trips on a relay with nothing else to do."""
    probe, other = Peer([url], Identity.generate()), Peer([url], Identity.generate())
    await probe.connect(session)
    await other.connect(session)
    for _ in range(4):
        await other.publish(batch_items(rng, batch_bytes))
        await asyncio.sleep(0.05)
    idle = []
    for _ in range(50):
        idle.append(await probe.sample(SAMPLE_N))
        await asyncio.sleep(0.02)
    await probe.close()
    await other.close()
    return idle


async def close_all(peers: list[Peer]) -> None:
    await asyncio.gather(*(peer.close() for peer in peers), return_exceptions=True)
