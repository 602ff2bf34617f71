"""Where a relay keeps the swarm's recent batches: in memory, or shared through Redis Streams.

A broker answers four questions for the relay: is this (peer, seq) new
(replay protection), store this batch, give me n batches from peers other
than this one (uniformly from the window, or from the part of it newer than
a cursor), and how many peers are online across the swarm. The in-memory
broker is the default and the embedded relay; `RedisBroker` lets several
relay processes serve one swarm: batches go into one stream with
``XADD ... MAXLEN ~ window``, each relay tails it with ``XREAD`` from the last
stream ID it saw (its resume cursor), and sequence numbers are claimed
atomically with a Lua script. `redis_client` makes the one Redis client a
relay process uses for everything (the broker, live stats, credit): a pool of
at most REDIS_MAX_CONNECTIONS connections, and each command retried on a fresh
connection when a pooled one went stale (Redis restarted).

Sampling cursors. Every stored batch has a *mark* that rises with arrival:
a counter in memory, the stream ID with Redis (so every relay of one swarm
agrees on it). A `sample` answer carries a cursor, ``<epoch>.<mark>``: the
newest mark in the window when the request was served. A request that sends
it back as ``after`` is drawn only from batches newer than that, so a node
stops being handed what it already has. The epoch names the mark space (one
relay process, or one Redis swarm), so a cursor from a relay that restarted
or from another swarm is ignored, never misread.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import random
import secrets
import time
import uuid
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

from engine.common.errors import RelayStartError
from engine.swarm import protocol

log = logging.getLogger(__name__)

# How long a relay's reported peer count stays valid in Redis without a refresh.
ONLINE_TTL_S = 15.0
# Most peers whose last sequence number the in-memory broker remembers.
MAX_TRACKED_PEERS = 1_000_000
# Redis: retries of one command on a fresh connection (a stale one after a restart fails once),
# with jittered exponential backoff from 50 ms to at most 500 ms, about 1 s in all.
REDIS_RETRIES = 3
REDIS_BACKOFF_S = (0.05, 0.5)
REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_SOCKET_TIMEOUT_S = 10.0  # above the tail's 1 s XREAD block
# One relay process holds at most this many connections to Redis (the tail's blocking XREAD takes one);
# a command that finds them all busy waits up to REDIS_POOL_WAIT_S for one, then fails like an outage.
REDIS_MAX_CONNECTIONS = 16
REDIS_POOL_WAIT_S = 5.0
TAIL_RETRY_S = 1.0  # the tail loop's wait between attempts while Redis is away

Mark = tuple[int, int]  # (counter, 0) in memory; (milliseconds, sequence) of a Redis stream ID


class BrokerUnavailable(protocol.ProtocolError):
    """The shared store did not answer: this one request fails with `internal`, the connection stays."""

    def __init__(self, what: str, exc: BaseException) -> None:
        super().__init__(protocol.E_INTERNAL, f"the relay cannot reach its store to {what} ({exc}); try again shortly")


class Entry(NamedTuple):
    """One stored batch, as the relay forwards it."""

    peer: str
    payload: str
    sig: str  # base64
    seq: int = 0  # the batch's sequence number and item count, for receipts (engine/relay/credit.py);
    items: int = 0  # 0 for a stream entry written by a relay from before receipts

    def to_json(self) -> dict[str, str]:
        return {"payload": self.payload, "sig": self.sig}


class Broker(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def claim_seq(self, peer: str, seq: int) -> bool:
        """True, and remembered, when seq is above every seq seen from peer."""
        ...

    async def add(self, entry: Entry) -> None: ...

    def holds(self, peer: str, seq: int, payload: str) -> bool:
        """True when the window (this process's copy) holds exactly this batch of peer's."""
        ...

    async def sample(self, n: int, exclude_peer: str, after: str | None = None) -> tuple[list[Entry], str]:
        """Up to n entries not from exclude_peer, newer than the cursor `after` if it is this broker's; and the new
        cursor."""
        ...

    async def report_online(self, count: int) -> int:
        """Record this relay's connected peers; return the swarm-wide count (this relay's included)."""
        ...

    def window_size(self) -> int: ...


class Window:
    """A fixed-size ring of recent entries, oldest to newest, each with a rising mark."""

    def __init__(self, size: int, epoch: str) -> None:
        if size < 1:
            raise ValueError("window size must be at least 1")
        self.size = size
        self.epoch = epoch
        self._ring: list[Entry | None] = [None] * size
        self._marks: list[Mark] = [(0, 0)] * size
        self._next = 0
        self._count = 0
        self._rng = random.Random()
        self._held: dict[tuple[str, int], Entry] = {}  # (peer, seq) of each entry in the ring, for `holds`

    def __len__(self) -> int:
        return self._count

    def add(self, entry: Entry, mark: Mark) -> None:
        """Store entry; marks must rise (arrival order), older ones are ignored."""
        if self._count and mark <= self._marks[(self._next - 1) % self.size]:
            log.warning("ignoring an entry whose mark %s is not above the newest", mark)
            return
        old = self._ring[self._next]
        if old is not None and self._held.get((old.peer, old.seq)) is old:
            del self._held[(old.peer, old.seq)]
        self._ring[self._next] = entry
        self._held[(entry.peer, entry.seq)] = entry
        self._marks[self._next] = mark
        self._next = (self._next + 1) % self.size
        self._count = min(self._count + 1, self.size)

    def holds(self, peer: str, seq: int, payload: str) -> bool:
        """True when an entry of peer's with this seq and this very payload is in the window."""
        entry = self._held.get((peer, seq))
        return entry is not None and entry.payload == payload

    def _slot(self, i: int) -> int:
        """Ring index of the i-th oldest entry."""
        return (self._next - self._count + i) % self.size

    def cursor(self, mark: Mark) -> str:
        return f"{self.epoch}.{mark[0]}-{mark[1]}"

    def parse_cursor(self, cursor: str | None) -> Mark | None:
        """The mark in a cursor of this window's epoch; None for no cursor or someone else's."""
        if not cursor:
            return None
        epoch, _, mark = cursor.rpartition(".")
        high, _, low = mark.partition("-")
        if epoch != self.epoch or not high.isdigit() or not low.isdigit():
            return None
        return int(high), int(low)

    def sample(self, n: int, exclude_peer: str, after: str | None = None) -> tuple[list[Entry], str]:
        """Up to n distinct entries from peers other than exclude_peer, uniformly at random
        among those newer than `after`; and the cursor for the next request."""
        since = self.parse_cursor(after)
        newest = self._marks[self._slot(self._count - 1)] if self._count else (0, 0)
        cursor = self.cursor(max(newest, since) if since is not None else newest)
        start = 0
        if since is not None:
            start = bisect.bisect_right(range(self._count), since, key=lambda i: self._marks[self._slot(i)])
        pool = self._count - start
        if n <= 0 or pool <= 0:
            return [], cursor
        # Probe a few random slots first (cheap for a big, mixed window), then scan.
        probes = self._rng.sample(range(start, self._count), min(pool, 2 * n + 8))
        picked = [e for i in probes if (e := self._ring[self._slot(i)]) is not None and e.peer != exclude_peer][:n]
        if len(picked) < n and len(probes) < pool:
            others = [e for i in range(start, self._count)
                      if (e := self._ring[self._slot(i)]) is not None and e.peer != exclude_peer]
            picked = self._rng.sample(others, min(n, len(others)))
        return picked, cursor


class MemoryBroker:
    """One relay process: the window and the sequence numbers live here."""

    def __init__(self, window: int) -> None:
        # A fresh epoch per process: a cursor from before a restart names marks this window never had.
        self.window = Window(window, epoch="m" + secrets.token_hex(4))
        self._marks = 0
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
        self._marks += 1
        self.window.add(entry, (self._marks, 0))

    async def sample(self, n: int, exclude_peer: str, after: str | None = None) -> tuple[list[Entry], str]:
        return self.window.sample(n, exclude_peer, after)

    def holds(self, peer: str, seq: int, payload: str) -> bool:
        return self.window.holds(peer, seq, payload)

    async def report_online(self, count: int) -> int:
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


def redis_address(url: str) -> str:
    """Where a redis:// URL points, without its password: host:port/db, or the socket's path."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path or url.split("?", 1)[0]
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    return f"{parts.hostname or 'localhost'}:{port}{parts.path or ''}"


def redis_client(url: str) -> Any:
    """A `redis.asyncio.Redis` for one relay process: a bounded pool, commands retried on a fresh connection.

    `redis.asyncio.from_url` alone gives an unbounded pool (a connection per concurrent command: dozens
    a second under load) whose connections have no retry at all (after a Redis restart the first command
    on every stale connection failed with "Connection closed by server"). The relay makes one of these
    (RedisBroker) and hands it to its live stats and credit; closing it closes the pool.
    """
    import redis.asyncio as aioredis
    import redis.exceptions
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff

    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=REDIS_MAX_CONNECTIONS, timeout=REDIS_POOL_WAIT_S, decode_responses=True,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S, socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        retry=Retry(ExponentialWithJitterBackoff(base=REDIS_BACKOFF_S[0], cap=REDIS_BACKOFF_S[1]), REDIS_RETRIES),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )
    return aioredis.Redis.from_pool(pool)


class RedisBroker:
    """Several relay processes, one swarm: Redis Streams hold the shared window."""

    def __init__(self, url: str, window: int, swarm: str = "default") -> None:
        import redis.exceptions

        self.url = url
        self._errors = (redis.exceptions.RedisError, OSError)
        self._redis: Any = redis_client(url)
        self.window = Window(window, epoch="")  # the swarm's epoch is read from Redis in start()
        self._window_len = window
        prefix = f"sapling:{swarm}"
        self.stream = f"{prefix}:batches"
        self.seq_key = f"{prefix}:seqs"
        self.online_key = f"{prefix}:online"
        self.epoch_key = f"{prefix}:epoch"
        self.relay_id = uuid.uuid4().hex[:12]
        self._cursor = "0-0"
        self._tail: asyncio.Task[None] | None = None
        self._claim = self._redis.register_script(_CLAIM_SEQ)

    async def start(self) -> None:
        try:
            await self._redis.ping()
        except self._errors as exc:
            reason = str(exc).split(". ")[0].rstrip(".") or type(exc).__name__  # redis-py adds a second sentence
            raise RelayStartError(f"Redis at {redis_address(self.url)} does not answer ({reason}); start it, or "
                                  "correct --redis") from None
        # One epoch per swarm in this Redis, shared by all its relays, so a node's cursor
        # works on any of them; a flushed or different Redis gets a new one.
        await self._redis.set(self.epoch_key, "r" + secrets.token_hex(4), nx=True)
        self.window.epoch = await self._redis.get(self.epoch_key)
        # Prime the local window with the stream's most recent entries, then tail from there.
        recent = await self._redis.xrevrange(self.stream, count=self._window_len)
        for stream_id, fields in reversed(recent):
            self._take(stream_id, fields)
        self._tail = asyncio.create_task(self._tail_loop(), name="redis-tail")

    def _take(self, stream_id: str, fields: dict[str, str]) -> None:
        self._cursor = stream_id
        high, _, low = stream_id.partition("-")
        try:
            self.window.add(Entry(fields["peer"], fields["payload"], fields["sig"], int(fields.get("seq", 0)),
                                  int(fields.get("items", 0))), (int(high), int(low or 0)))
        except (KeyError, ValueError):
            log.warning("skipping malformed stream entry %s", stream_id)

    async def _tail_loop(self) -> None:
        lost_at: float | None = None  # when the current outage began; None while Redis answers
        while True:
            try:
                reply = await self._redis.xread({self.stream: self._cursor}, block=1000, count=500)
                if lost_at is not None:
                    await self._restore_epoch()
            except asyncio.CancelledError:
                raise
            except self._errors as exc:
                if lost_at is None:
                    lost_at = time.monotonic()
                    log.warning("redis connection lost (%s); serving the window held here and retrying every "
                                "%g s", exc, TAIL_RETRY_S, extra={"relay_id": self.relay_id})
                else:
                    log.debug("redis still unreachable: %s", exc)
                await asyncio.sleep(TAIL_RETRY_S)
                continue
            if lost_at is not None:
                log.info("redis connection restored after %.1f s", time.monotonic() - lost_at,
                         extra={"relay_id": self.relay_id, "down_s": round(time.monotonic() - lost_at, 1)})
                lost_at = None
            for _stream, entries in reply or []:
                for stream_id, fields in entries:
                    self._take(stream_id, fields)

    async def _restore_epoch(self) -> None:
        """After an outage: a Redis that came back empty gets this swarm's epoch again (cursors stay valid)."""
        if await self._redis.set(self.epoch_key, self.window.epoch, nx=True):
            log.warning("redis came back empty (restarted without persistence): the stream and the peers' "
                        "sequence numbers start again; the windows held by the relays are kept",
                        extra={"relay_id": self.relay_id})

    async def close(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._tail
        with contextlib.suppress(Exception):
            await self._redis.hdel(self.online_key, self.relay_id)
        await self._redis.aclose()

    async def claim_seq(self, peer: str, seq: int) -> bool:
        try:
            return bool(await self._claim(keys=[self.seq_key], args=[peer, seq]))
        except self._errors as exc:
            raise BrokerUnavailable("check the sequence number", exc) from exc

    async def add(self, entry: Entry) -> None:
        try:
            await self._redis.xadd(
                self.stream,
                {"peer": entry.peer, "payload": entry.payload, "sig": entry.sig, "seq": entry.seq,
                 "items": entry.items},
                maxlen=self._window_len,
                approximate=True,
            )
        except self._errors as exc:
            raise BrokerUnavailable("store the batch", exc) from exc

    async def sample(self, n: int, exclude_peer: str, after: str | None = None) -> tuple[list[Entry], str]:
        return self.window.sample(n, exclude_peer, after)

    def holds(self, peer: str, seq: int, payload: str) -> bool:
        # the tail's copy of the stream: a batch another relay stored and this one has not read yet is not found,
        # and its resend is refused as a replay, which the client also takes as "already stored"
        return self.window.holds(peer, seq, payload)

    async def report_online(self, count: int) -> int:
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

    @property
    def client(self) -> Any:
        """This process's Redis client (redis_client), for the relay's live stats and credit; closed by `close`."""
        return self._redis

    def window_size(self) -> int:
        return len(self.window)
