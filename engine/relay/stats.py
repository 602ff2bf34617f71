"""The relay's live numbers for its status page and information document, per minute over a day.

    live = LiveStats(redis_url="", swarm="default")   # or a redis:// URL shared by the swarm's relays
    live = LiveStats(url, swarm, client=broker.client)  # the relay: its broker's Redis client (one pool)
    live.record_publish(batch); live.record_join(peer)
    await live.flush()                                # the relay calls this every few seconds
    snapshot = await live.snapshot(peers_online=12)   # the `live` numbers and the day's series

A relay counts, per UTC minute, the batches it accepted, the rollouts in them
(one per completion) and the rewards their senders claimed for them (clamped
to [0, 1], the range Sapling's tasks score in: a claim is the sender's word,
never checked), and the distinct peers that completed a handshake per UTC day.
Counts wait in the process until `flush`; with Redis they go to a hash of
per-minute fields and a HyperLogLog per day, so every process of one swarm
reads the same numbers, through the relay process's one Redis client
(engine/relay/brokers.py, `redis_client`: a bounded pool, commands retried
on a fresh connection after a Redis restart). Nothing here is trusted by
nodes: it is for people.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.relay.brokers import redis_client
from engine.swarm import protocol

log = logging.getLogger("sapling.relay")

MINUTE_S = 60
DAY_MINUTES = 24 * 60
RATE_WINDOW_MINUTES = 5  # publishes_per_minute averages over this many minutes (fewer just after a start)
SNAPSHOT_TTL_S = 2.0  # a snapshot is reused this long, so many open status pages cost one read
MAX_JOINED_TRACKED = 200_000  # distinct peers per day the in-memory counter remembers (then it stops counting)
MAX_PENDING_MINUTES = 60  # unflushed minutes kept while Redis is unreachable
DAY_KEY_TTL_S = 2 * 24 * 3600


@dataclass
class MinuteCounts:
    publishes: int = 0
    rollouts: int = 0
    reward_sum: float = 0.0
    reward_n: int = 0

    def add(self, other: MinuteCounts) -> None:
        self.publishes += other.publishes
        self.rollouts += other.rollouts
        self.reward_sum += other.reward_sum
        self.reward_n += other.reward_n


def _day(minute: int) -> str:
    return time.strftime("%Y%m%d", time.gmtime(minute * MINUTE_S))


class _MemoryStore:
    def __init__(self) -> None:
        self.minutes: dict[int, MinuteCounts] = {}
        self.joined: dict[str, set[str]] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def write(self, minutes: dict[int, MinuteCounts], joins: dict[str, set[str]], now_minute: int) -> None:
        for minute, counts in minutes.items():
            self.minutes.setdefault(minute, MinuteCounts()).add(counts)
        for day, peers in joins.items():
            seen = self.joined.setdefault(day, set())
            seen.update(list(peers)[: max(0, MAX_JOINED_TRACKED - len(seen))])
        for minute in [m for m in self.minutes if m <= now_minute - DAY_MINUTES]:
            del self.minutes[minute]
        today = _day(now_minute)
        for day in [d for d in self.joined if d != today]:
            del self.joined[day]

    async def read(self, now_minute: int) -> tuple[dict[int, MinuteCounts], int]:
        recent = {m: c for m, c in self.minutes.items() if m > now_minute - DAY_MINUTES}
        return recent, len(self.joined.get(_day(now_minute), ()))


class _RedisStore:
    """Per-minute fields `<minute>:<p|r|s|n>` in one hash; a HyperLogLog of peer ids per day."""

    def __init__(self, url: str, swarm: str, client: Any = None) -> None:
        self.url = url
        self.minutes_key = f"sapling:{swarm}:stats:minutes"
        self.joined_prefix = f"sapling:{swarm}:stats:joined:"
        self._redis: Any = client
        self._own = client is None  # a client of its own is closed here; a shared one by its owner
        self._trimmed = -1

    async def start(self) -> None:
        if self._redis is None:
            self._redis = redis_client(self.url)

    async def close(self) -> None:
        if self._own and self._redis is not None:
            await self._redis.aclose()

    async def write(self, minutes: dict[int, MinuteCounts], joins: dict[str, set[str]], now_minute: int) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for minute, c in minutes.items():
            if c.publishes:
                pipe.hincrby(self.minutes_key, f"{minute}:p", c.publishes)
            if c.rollouts:
                pipe.hincrby(self.minutes_key, f"{minute}:r", c.rollouts)
            if c.reward_n:
                pipe.hincrbyfloat(self.minutes_key, f"{minute}:s", c.reward_sum)
                pipe.hincrby(self.minutes_key, f"{minute}:n", c.reward_n)
        for day, peers in joins.items():
            if peers:
                pipe.pfadd(self.joined_prefix + day, *peers)
                pipe.expire(self.joined_prefix + day, DAY_KEY_TTL_S)
        await pipe.execute()
        if self._trimmed != now_minute:  # once a minute: drop fields older than a day
            self._trimmed = now_minute
            old = [f for f in await self._redis.hkeys(self.minutes_key)
                   if not f.partition(":")[0].isdigit() or int(f.partition(":")[0]) <= now_minute - DAY_MINUTES]
            if old:
                await self._redis.hdel(self.minutes_key, *old)

    async def read(self, now_minute: int) -> tuple[dict[int, MinuteCounts], int]:
        fields: dict[str, str] = await self._redis.hgetall(self.minutes_key)
        out: dict[int, MinuteCounts] = {}
        for name, value in fields.items():
            minute_text, _, kind = name.partition(":")
            try:
                minute, number = int(minute_text), float(value)
            except ValueError:
                continue
            if minute <= now_minute - DAY_MINUTES or minute > now_minute + 1:
                continue
            counts = out.setdefault(minute, MinuteCounts())
            if kind == "p":
                counts.publishes = int(number)
            elif kind == "r":
                counts.rollouts = int(number)
            elif kind == "s":
                counts.reward_sum = number
            elif kind == "n":
                counts.reward_n = int(number)
        joined = int(await self._redis.pfcount(self.joined_prefix + _day(now_minute)))
        return out, joined


class LiveStats:
    """`client`: a Redis client to share (the relay's broker's); without one a Redis URL gets its own."""

    def __init__(self, redis_url: str = "", swarm: str = "default", clock: Callable[[], float] = time.time,
                 client: Any = None) -> None:
        self.clock = clock
        self.started = clock()
        self._store: _MemoryStore | _RedisStore = (
            _RedisStore(redis_url, swarm, client) if redis_url or client is not None else _MemoryStore())
        self._pending: dict[int, MinuteCounts] = {}
        self._joins: dict[str, set[str]] = {}
        self._snapshot: dict[str, Any] | None = None
        self._snapshot_at = 0.0

    def _minute(self) -> int:
        return int(self.clock() // MINUTE_S)

    def record_publish(self, batch: protocol.Batch) -> None:
        counts = self._pending.setdefault(self._minute(), MinuteCounts())
        counts.publishes += 1
        for item in batch.items:
            counts.rollouts += len(item.completions)
            for reward in item.rewards:
                if reward is not None:
                    counts.reward_sum += min(1.0, max(0.0, reward))
                    counts.reward_n += 1

    def record_join(self, peer: str) -> None:
        seen = self._joins.setdefault(_day(self._minute()), set())
        if len(seen) < MAX_JOINED_TRACKED:
            seen.add(peer)

    async def start(self) -> None:
        await self._store.start()

    async def close(self) -> None:
        await self.flush()
        await self._store.close()

    async def flush(self) -> None:
        """Hand the counts gathered since the last flush to the store; on a Redis error keep them for next time."""
        if not self._pending and not self._joins:
            return
        minutes, joins = self._pending, self._joins
        self._pending, self._joins = {}, {}
        try:
            await self._store.write(minutes, joins, self._minute())
        except Exception as exc:  # noqa: BLE001 - Redis down: the status numbers wait, the relay serves on
            log.warning("live stats not saved: %s", exc)
            for minute, counts in minutes.items():
                self._pending.setdefault(minute, MinuteCounts()).add(counts)
            for minute in sorted(self._pending)[:-MAX_PENDING_MINUTES]:
                del self._pending[minute]
            today = _day(self._minute())
            if today in joins:
                self._joins.setdefault(today, set()).update(joins[today])

    async def snapshot(self, peers_online: int) -> dict[str, Any]:
        """{"live": the information document's live numbers, "series": the last day per minute}."""
        now = self.clock()
        if self._snapshot is not None and now - self._snapshot_at < SNAPSHOT_TTL_S:
            return {**self._snapshot, "live": {**self._snapshot["live"], "peers_online": peers_online}}
        await self.flush()
        minute = int(now // MINUTE_S)
        try:
            minutes, joined = await self._store.read(minute)
        except Exception as exc:  # noqa: BLE001 - Redis down: show what this process last saw
            log.warning("live stats not read: %s", exc)
            if self._snapshot is not None:
                return {**self._snapshot, "live": {**self._snapshot["live"], "peers_online": peers_online}}
            minutes, joined = {}, 0
        last_hour = sum(c.publishes for m, c in minutes.items() if m > minute - 60)
        window_start = max((minute - RATE_WINDOW_MINUTES + 1) * MINUTE_S, self.started)
        recent = sum(c.publishes for m, c in minutes.items() if m > minute - RATE_WINDOW_MINUTES)
        rate = recent / max(1.0, (now - window_start) / MINUTE_S)
        ordered = sorted(minutes)
        snapshot: dict[str, Any] = {
            "live": {
                "peers_online": peers_online,
                "batches_last_hour": last_hour,
                "publishes_per_minute": round(rate, 2),
                "joined_today": joined,
            },
            "series": {
                "minute": [m * MINUTE_S for m in ordered],
                "rollouts": [minutes[m].rollouts for m in ordered],
                "reward": [round(minutes[m].reward_sum / minutes[m].reward_n, 4) if minutes[m].reward_n else None
                           for m in ordered],
            },
            "now": round(now, 3),
        }
        self._snapshot, self._snapshot_at = snapshot, now
        return snapshot
