"""Where a relay keeps the swarm's recent batches: in memory, or shared through Redis Streams.

A broker answers four questions for the relay: is this (peer, seq) new
(replay protection), store this batch, give me n batches from peers other
than this one (uniformly from the window), and how many peers are online
across the swarm. The in-memory broker is the default and the embedded
relay; `RedisBroker` lets several relay processes serve one swarm: batches go
into one stream with ``XADD ... MAXLEN ~ window``, each relay tails it with
``XREAD`` from the last stream ID it saw (its resume cursor), and sequence
numbers are claimed atomically with a Lua script.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from typing import Any, NamedTuple, Protocol

log = logging.getLogger(__name__)

# How long a relay's reported peer count stays valid in Redis without a refresh.
ONLINE_TTL_S = 15.0
# Most peers whose last sequence number the in-memory broker remembers.
MAX_TRACKED_PEERS = 1_000_000


class Entry(NamedTuple):
    """One stored batch, as the relay forwards it."""

    peer: str
    payload: str
    sig: str  # base64

    def to_json(self) -> dict[str, str]:
        return {"payload": self.payload, "sig": self.sig}


class Broker(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def claim_seq(self, peer: str, seq: int) -> bool:
        """True, and remembered, when seq is above every seq seen from peer."""
        ...

    async def add(self, entry: Entry) -> None: ...

    async def sample(self, n: int, exclude_peer: str) -> list[Entry]: ...

    async def report_online(self, relay_id: str, count: int) -> int:
        """Record this relay's connected peers; return the swarm-wide count."""
        ...

    def window_size(self) -> int: ...


class Window:
    """A fixed-size ring of recent entries with O(1) random access."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("window size must be at least 1")
        self.size = size
        self._ring: list[Entry | None] = [None] * size
        self._next = 0
        self._count = 0
        self._rng = random.Random()

    def __len__(self) -> int:
        return self._count

    def add(self, entry: Entry) -> None:
        self._ring[self._next] = entry
        self._next = (self._next + 1) % self.size
        self._count = min(self._count + 1, self.size)

    def sample(self, n: int, exclude_peer: str) -> list[Entry]:
        """Up to n distinct entries from peers other than exclude_peer, uniformly at random."""
        if n <= 0 or self._count == 0:
            return []
        # Probe a few random slots first (cheap for a big, mixed window), then scan.
        probes = self._rng.sample(range(self._count), min(self._count, 2 * n + 8))
        picked = [e for i in probes if (e := self._ring[i]) is not None and e.peer != exclude_peer][:n]
        if len(picked) == n:
            return picked
        others = [e for e in self._ring[: self._count] if e is not None and e.peer != exclude_peer]
        return self._rng.sample(others, min(n, len(others)))


class MemoryBroker:
    """One relay process: the window and the sequence numbers live here."""

    def __init__(self, window: int) -> None:
        self.window = Window(window)
        self._seqs: dict[str, int] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def claim_seq(self, peer: str, seq: int) -> bool:
        if seq <= self._seqs.get(peer, 0):
            return False
        if peer not in self._seqs and len(self._seqs) >= MAX_TRACKED_PEERS:
            self._seqs.pop(next(iter(self._seqs)))  # forget the oldest peer
        self._seqs[peer] = seq
        return True

    async def add(self, entry: Entry) -> None:
        self.window.add(entry)

    async def sample(self, n: int, exclude_peer: str) -> list[Entry]:
        return self.window.sample(n, exclude_peer)

    async def report_online(self, relay_id: str, count: int) -> int:
        return count

    def window_size(self) -> int:
        return len(self.window)


_CLAIM_SEQ = """
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local seq = tonumber(ARGV[2])
if seq <= last then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class RedisBroker:
    """Several relay processes, one swarm: Redis Streams hold the shared window."""

    def __init__(self, url: str, window: int, swarm: str = "default") -> None:
        import redis.asyncio as aioredis

        self.url = url
        self._redis: Any = aioredis.from_url(url, decode_responses=True)
        self.window = Window(window)
        self._window_len = window
        prefix = f"sapling:{swarm}"
        self.stream = f"{prefix}:batches"
        self.seq_key = f"{prefix}:seqs"
        self.online_key = f"{prefix}:online"
        self.relay_id = uuid.uuid4().hex[:12]
        self._cursor = "0-0"
        self._tail: asyncio.Task[None] | None = None
        self._claim = self._redis.register_script(_CLAIM_SEQ)

    async def start(self) -> None:
        await self._redis.ping()
        # Prime the local window with the stream's most recent entries, then tail from there.
        recent = await self._redis.xrevrange(self.stream, count=self._window_len)
        for stream_id, fields in reversed(recent):
            self._take(stream_id, fields)
        self._tail = asyncio.create_task(self._tail_loop(), name="redis-tail")

    def _take(self, stream_id: str, fields: dict[str, str]) -> None:
        self._cursor = stream_id
        try:
            self.window.add(Entry(fields["peer"], fields["payload"], fields["sig"]))
        except KeyError:
            log.warning("skipping malformed stream entry %s", stream_id)

    async def _tail_loop(self) -> None:
        import redis.exceptions

        while True:
            try:
                reply = await self._redis.xread({self.stream: self._cursor}, block=1000, count=500)
            except asyncio.CancelledError:
                raise
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("redis tail failed (%s); retrying in 1 s", exc)
                await asyncio.sleep(1.0)
                continue
            for _stream, entries in reply or []:
                for stream_id, fields in entries:
                    self._take(stream_id, fields)

    async def close(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._tail
        with contextlib.suppress(Exception):
            await self._redis.hdel(self.online_key, self.relay_id)
        await self._redis.aclose()

    async def claim_seq(self, peer: str, seq: int) -> bool:
        return bool(await self._claim(keys=[self.seq_key], args=[peer, seq]))

    async def add(self, entry: Entry) -> None:
        await self._redis.xadd(
            self.stream,
            {"peer": entry.peer, "payload": entry.payload, "sig": entry.sig},
            maxlen=self._window_len,
            approximate=True,
        )

    async def sample(self, n: int, exclude_peer: str) -> list[Entry]:
        return self.window.sample(n, exclude_peer)

    async def report_online(self, relay_id: str, count: int) -> int:
        now = time.time()
        await self._redis.hset(self.online_key, self.relay_id, f"{count}:{now}")
        total = 0
        for key, value in (await self._redis.hgetall(self.online_key)).items():
            try:
                n, ts = value.split(":", 1)
                if now - float(ts) <= ONLINE_TTL_S:
                    total += int(n)
                else:
                    await self._redis.hdel(self.online_key, key)
            except ValueError:
                await self._redis.hdel(self.online_key, key)
        return total

    def window_size(self) -> int:
        return len(self.window)
