"""Credit's store: where the relay keeps its counts of receipts, in memory or in Redis, the two agreeing.

Two stores hold the same things: in memory (one relay process, the
embedded relay), and Redis (`--redis`), where two Lua scripts make the
"handed, not yet receipted, under the cap" checks atomic, so every relay
process of a swarm agrees; the Redis store uses the relay process's one
client (engine/relay/brokers.py, `redis_client`: a bounded pool, commands
retried on a fresh connection after a Redis restart). Distinct peers are
exact in memory and a HyperLogLog in Redis (exact for small counts, about
1% off for large ones). The Redis layout assumes one Redis server, not a
cluster.

This is its own room because a store only keeps and settles: what it is asked, and when, is the rule of
engine/relay/credit.py (`CreditBook`: which receipt is checked and counted, the same-address mark, the board).
The two stores sit side by side here so that each can be read against the other, method by method
(`CreditStore` is what both do); tests/swarm/test_credit_store.py counts in memory and
tests/swarm/test_credit_redis.py through a real Redis.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from engine.relay.brokers import redis_client
from engine.swarm.receipts import (
    COUNTED,
    DUPLICATE,
    NOT_SAMPLED,
    OVER_CAP,
    SAME_ADDRESS,
    USED,
    Verdict,
)

SLOT_S = 600  # counts are kept per 10-minute slot
HOUR_SLOTS = 6  # "the last hour": the current slot and the 6 before it (60 to 70 minutes)
DAY_SLOTS = 144  # "the last day": the current slot and the 144 before it
PERIODS = ("hour", "day", "all")
METRICS = ("shared", "sampled", "used", "positive", "not_picked", SAME_ADDRESS)
SAME_ADDRESS_MARK = "same-address"  # a refused same-address `used`: no receipt can carry it (no "-" allowed)
REJECTED_PREFIX = "rejected:"
MAX_HANDED = 500_000  # (receiver, sender, seq) records the in-memory store remembers, oldest dropped first
MAX_PEERS = 100_000  # peers whose credit the in-memory store keeps, least recently counted dropped first

Handed = tuple[str, int, int]  # (sender, seq, items in the batch)


def slot_of(now: float) -> int:
    return int(now // SLOT_S)


def _period(counts: Counter[str], peers: int) -> dict[str, Any]:
    out: dict[str, Any] = {name: int(counts[name]) for name in METRICS}
    out["peers"] = peers
    out["rejected"] = {k[len(REJECTED_PREFIX):]: int(v) for k, v in sorted(counts.items())
                       if k.startswith(REJECTED_PREFIX) and v}
    return out


def _counts_of(verdict: Verdict) -> Counter[str]:
    """What one counted receipt adds to its sender's numbers."""
    if verdict.verdict == SAME_ADDRESS_MARK:
        return Counter({SAME_ADDRESS: 1})
    name = verdict.counted_as()
    if name == USED:
        return Counter({"used": 1, "positive": verdict.positive})
    if name == "not_picked":
        return Counter({"not_picked": 1})
    return Counter({REJECTED_PREFIX + name: 1})


class CreditStore(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def handed(self, receiver: str, hand: str, batches: Sequence[Handed], ttl: float, now: float) -> None: ...

    async def settle(self, receiver: str, verdicts: Sequence[Verdict], cap: int, ttl: float, now: float) -> list[str]:
        """For each verdict, in order: COUNTED, NOT_SAMPLED, DUPLICATE or OVER_CAP (and remembered as receipted)."""
        ...

    async def count(self, receiver: str, verdicts: Sequence[Verdict], now: float) -> None: ...

    async def add_shared(self, shared: dict[str, int], names: dict[str, str], now: float,
                         addresses: dict[str, str]) -> None: ...

    async def addresses(self, peers: Sequence[str]) -> dict[str, str]: ...  # sender -> tag of its last address

    async def credit(self, peers: Sequence[str], now: float) -> dict[str, dict[str, Any]]: ...

    async def leaders(self, limit: int, now: float) -> list[str]: ...


class _PeerBook:
    """One peer's counts in memory: per slot and all time, and who used its items."""

    def __init__(self) -> None:
        self.slots: dict[int, Counter[str]] = {}
        self.users: dict[int, set[str]] = {}
        self.all: Counter[str] = Counter()
        self.all_users: set[str] = set()
        self.name = ""

    def add(self, counts: Counter[str], user: str | None, slot: int) -> None:
        self.slots.setdefault(slot, Counter()).update(counts)
        self.all.update(counts)
        if user is not None:
            self.users.setdefault(slot, set()).add(user)
            self.all_users.add(user)
        for old in [s for s in self.slots if s < slot - DAY_SLOTS]:
            del self.slots[old]
        for old in [s for s in self.users if s < slot - DAY_SLOTS]:
            del self.users[old]

    def report(self, slot: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for period, first in (("hour", slot - HOUR_SLOTS), ("day", slot - DAY_SLOTS)):
            counts: Counter[str] = Counter()
            users: set[str] = set()
            for s, c in self.slots.items():
                if s >= first:
                    counts.update(c)
            for s, u in self.users.items():
                if s >= first:
                    users |= u
            out[period] = _period(counts, len(users))
        out["all"] = _period(self.all, len(self.all_users))
        return out


class MemoryCreditStore:
    errors: tuple[type[BaseException], ...] = ()  # nothing here fails but a bug, which must raise

    def __init__(self) -> None:
        self._handed: OrderedDict[tuple[str, str, int], list[Any]] = OrderedDict()  # -> [items, hand, mask, expires]
        self._caps: OrderedDict[tuple[str, str, str], list[float]] = OrderedDict()  # -> [used counted, expires]
        self._peers: OrderedDict[str, _PeerBook] = OrderedDict()
        self._addresses: OrderedDict[str, str] = OrderedDict()

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _book(self, peer: str) -> _PeerBook:
        book = self._peers.get(peer)
        if book is None:
            book = self._peers[peer] = _PeerBook()
            while len(self._peers) > MAX_PEERS:
                self._peers.popitem(last=False)
        self._peers.move_to_end(peer)
        return book

    async def handed(self, receiver: str, hand: str, batches: Sequence[Handed], ttl: float, now: float) -> None:
        for sender, seq, items in batches:
            key = (receiver, sender, seq)
            record = self._handed.get(key)
            if record is not None and record[3] > now:  # handed again: same items, a new round
                record[1], record[3] = hand, now + ttl
                self._handed.move_to_end(key)
                continue
            self._handed[key] = [items, hand, 0, now + ttl]
            self._book(sender).add(Counter({"sampled": items}), None, slot_of(now))
        while len(self._handed) > MAX_HANDED:
            self._handed.popitem(last=False)

    async def settle(self, receiver: str, verdicts: Sequence[Verdict], cap: int, ttl: float, now: float) -> list[str]:
        out = []
        for v in verdicts:
            record = self._handed.get((receiver, v.sender, v.seq))
            if record is None or record[3] <= now or v.index >= record[0]:
                out.append(NOT_SAMPLED)
                continue
            bit = 1 << v.index
            if record[2] & bit:
                out.append(DUPLICATE)
                continue
            record[2] |= bit
            if v.verdict != USED:
                out.append(COUNTED)
                continue
            key = (receiver, record[1], v.sender)
            used = self._caps.get(key)
            if used is None or used[1] <= now:
                used = self._caps[key] = [0, now + ttl]
                while len(self._caps) > MAX_HANDED:
                    self._caps.popitem(last=False)
            used[0] += 1
            out.append(OVER_CAP if used[0] > cap else COUNTED)
        return out

    async def count(self, receiver: str, verdicts: Sequence[Verdict], now: float) -> None:
        slot = slot_of(now)
        for v in verdicts:
            self._book(v.sender).add(_counts_of(v), receiver if v.verdict == USED else None, slot)

    async def add_shared(self, shared: dict[str, int], names: dict[str, str], now: float,
                         addresses: dict[str, str]) -> None:
        for peer, items in shared.items():
            self._book(peer).add(Counter({"shared": items}), None, slot_of(now))
        for peer, name in names.items():
            self._book(peer).name = name
        for peer, tag in addresses.items():
            self._addresses[peer] = tag
            self._addresses.move_to_end(peer)
        while len(self._addresses) > MAX_PEERS:
            self._addresses.popitem(last=False)

    async def addresses(self, peers: Sequence[str]) -> dict[str, str]:
        return {p: self._addresses[p] for p in peers if p in self._addresses}

    async def credit(self, peers: Sequence[str], now: float) -> dict[str, dict[str, Any]]:
        slot = slot_of(now)
        out = {}
        for peer in peers:
            book = self._peers.get(peer) or _PeerBook()
            out[peer] = {"peer": peer, "name": book.name, **book.report(slot)}
        return out

    async def leaders(self, limit: int, now: float) -> list[str]:
        first = slot_of(now) - DAY_SLOTS
        used = {peer: sum(c["used"] for s, c in book.slots.items() if s >= first) for peer, book in self._peers.items()}
        ranked = sorted((peer for peer, n in used.items() if n > 0), key=lambda p: (-used[p], p))
        return ranked[:limit]


# Redis: KEYS = [handed key, sender's credit hash] per batch; ARGV = ttl, hand, slot, then items per batch.
# A record is "items|hand|mask", mask holding one bit per item already receipted.
_HANDED = """
local ttl, hand, slot = tonumber(ARGV[1]), ARGV[2], ARGV[3]
for i = 1, #KEYS / 2 do
  local key, items = KEYS[2 * i - 1], ARGV[3 + i]
  local record = redis.call('GET', key)
  if record then
    local n, _, mask = string.match(record, '^(%d+)|([^|]*)|(%d+)$')
    redis.call('SET', key, n .. '|' .. hand .. '|' .. mask, 'EX', ttl)
  else
    redis.call('SET', key, items .. '|' .. hand .. '|0', 'EX', ttl)
    redis.call('HINCRBY', KEYS[2 * i], slot .. ':sampled', items)
    redis.call('HINCRBY', KEYS[2 * i], 'all:sampled', items)
  end
end
return 1
"""
# KEYS = [handed key, cap key prefix] per verdict; ARGV = cap, ttl, then (index, used 0/1) per verdict.
# The cap key is the prefix and the record's hand: one Redis server, not a cluster.
_SETTLE = """
local cap, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS / 2 do
  local key = KEYS[2 * i - 1]
  local index, used = tonumber(ARGV[1 + 2 * i]), ARGV[2 + 2 * i] == '1'
  local record = redis.call('GET', key)
  local n, hand, mask
  if record then n, hand, mask = string.match(record, '^(%d+)|([^|]*)|(%d+)$') end
  if not n or index >= tonumber(n) then
    out[i] = 'not_sampled'
  else
    local bit = 2 ^ index
    mask = tonumber(mask)
    if math.floor(mask / bit) % 2 == 1 then
      out[i] = 'duplicate'
    else
      redis.call('SET', key, n .. '|' .. hand .. '|' .. string.format('%d', mask + bit), 'KEEPTTL')
      out[i] = 'counted'
      if used then
        local ck = KEYS[2 * i] .. hand
        local c = redis.call('INCR', ck)
        if c == 1 then redis.call('EXPIRE', ck, ttl) end
        if c > cap then out[i] = 'over_cap' end
      end
    end
  end
end
return out
"""


class RedisCreditStore:
    """The same counts in Redis, under `sapling:<swarm>:credit:` (docs/protocol.md lists the keys)."""

    def __init__(self, url: str, swarm: str, client: Any = None) -> None:
        self.url = url
        self.prefix = f"sapling:{swarm}:credit"
        self._redis: Any = client
        self._own = client is None  # a client of its own is closed here; a shared one by its owner
        self._handed_script: Any = None
        self._settle_script: Any = None
        self._trimmed: dict[str, int] = {}  # peer -> the slot its hash was last trimmed in (by this process)
        self.errors: tuple[type[BaseException], ...] = (OSError,)  # and Redis's own, from start()

    async def start(self) -> None:
        import redis.exceptions

        self.errors = (redis.exceptions.RedisError, OSError)
        if self._redis is None:
            self._redis = redis_client(self.url)
        self._handed_script = self._redis.register_script(_HANDED)
        self._settle_script = self._redis.register_script(_SETTLE)

    async def close(self) -> None:
        if self._own and self._redis is not None:
            await self._redis.aclose()

    def _hash(self, peer: str) -> str:
        return f"{self.prefix}:c:{peer}"

    def _users(self, peer: str, slot: int | str) -> str:
        return f"{self.prefix}:u:{peer}:{slot}"

    def _board(self, slot: int) -> str:
        return f"{self.prefix}:board:{slot}"

    def _handed_key(self, receiver: str, sender: str, seq: int) -> str:
        return f"{self.prefix}:h:{receiver}:{sender}:{seq}"

    async def handed(self, receiver: str, hand: str, batches: Sequence[Handed], ttl: float, now: float) -> None:
        if not batches:
            return
        keys = [k for sender, seq, _ in batches for k in (self._handed_key(receiver, sender, seq), self._hash(sender))]
        await self._handed_script(keys=keys, args=[int(ttl), hand, slot_of(now), *[items for _, _, items in batches]])

    async def settle(self, receiver: str, verdicts: Sequence[Verdict], cap: int, ttl: float, now: float) -> list[str]:
        if not verdicts:
            return []
        keys = [k for v in verdicts for k in (self._handed_key(receiver, v.sender, v.seq),
                                              f"{self.prefix}:cap:{receiver}:{v.sender}:")]
        args: list[Any] = [cap, int(ttl)]
        for v in verdicts:
            args += [v.index, 1 if v.verdict == USED else 0]
        return [str(r) for r in await self._settle_script(keys=keys, args=args)]

    async def _trim(self, peers: Sequence[str], slot: int) -> None:
        """Drop a peer's slot fields older than a day, once per slot per peer in this process."""
        due = [p for p in dict.fromkeys(peers) if self._trimmed.get(p) != slot]
        if len(self._trimmed) > MAX_PEERS:
            self._trimmed.clear()
        for peer in due:
            self._trimmed[peer] = slot
            old = [f for f in await self._redis.hkeys(self._hash(peer))
                   if f.partition(":")[0].isdigit() and int(f.partition(":")[0]) < slot - DAY_SLOTS]
            if old:
                await self._redis.hdel(self._hash(peer), *old)

    async def count(self, receiver: str, verdicts: Sequence[Verdict], now: float) -> None:
        if not verdicts:
            return
        slot = slot_of(now)
        keep = (DAY_SLOTS + 2) * SLOT_S
        pipe = self._redis.pipeline(transaction=False)
        for v in verdicts:
            for metric, n in _counts_of(v).items():
                if n:
                    pipe.hincrby(self._hash(v.sender), f"{slot}:{metric}", n)
                    pipe.hincrby(self._hash(v.sender), f"all:{metric}", n)
            if v.verdict == USED:
                pipe.pfadd(self._users(v.sender, slot), receiver)
                pipe.expire(self._users(v.sender, slot), keep)
                pipe.pfadd(self._users(v.sender, "all"), receiver)
                pipe.zincrby(self._board(slot), 1, v.sender)
                pipe.expire(self._board(slot), keep)
        await pipe.execute()
        await self._trim([v.sender for v in verdicts], slot)

    async def add_shared(self, shared: dict[str, int], names: dict[str, str], now: float,
                         addresses: dict[str, str]) -> None:
        slot = slot_of(now)
        pipe = self._redis.pipeline(transaction=False)
        for peer, items in shared.items():
            pipe.hincrby(self._hash(peer), f"{slot}:shared", items)
            pipe.hincrby(self._hash(peer), "all:shared", items)
        for peer, name in names.items():
            pipe.hset(self._hash(peer), "name", name)
        for peer, tag in addresses.items():
            pipe.hset(self._hash(peer), "addr", tag)
        await pipe.execute()
        await self._trim(list(shared), slot)

    async def addresses(self, peers: Sequence[str]) -> dict[str, str]:
        pipe = self._redis.pipeline(transaction=False)
        for peer in peers:
            pipe.hget(self._hash(peer), "addr")
        return {p: str(t) for p, t in zip(peers, await pipe.execute(), strict=True) if t}

    async def credit(self, peers: Sequence[str], now: float) -> dict[str, dict[str, Any]]:
        slot = slot_of(now)
        pipe = self._redis.pipeline(transaction=False)
        for peer in peers:
            pipe.hgetall(self._hash(peer))
            pipe.pfcount(*[self._users(peer, s) for s in range(slot - HOUR_SLOTS, slot + 1)])
            pipe.pfcount(*[self._users(peer, s) for s in range(slot - DAY_SLOTS, slot + 1)])
            pipe.pfcount(self._users(peer, "all"))
        replies = await pipe.execute()
        out = {}
        for n, peer in enumerate(peers):
            fields, hour_users, day_users, all_users = replies[4 * n: 4 * n + 4]
            counts: dict[str, Counter[str]] = {"hour": Counter(), "day": Counter(), "all": Counter()}
            for name, value in fields.items():
                where, _, metric = name.partition(":")
                if not metric:
                    continue
                try:
                    number = int(value)
                except ValueError:
                    continue
                if where == "all":
                    counts["all"][metric] += number
                elif where.isdigit() and slot - DAY_SLOTS <= int(where) <= slot:
                    counts["day"][metric] += number
                    if int(where) >= slot - HOUR_SLOTS:
                        counts["hour"][metric] += number
            users = {"hour": int(hour_users), "day": int(day_users), "all": int(all_users)}
            out[peer] = {"peer": peer, "name": fields.get("name", ""),
                         **{period: _period(counts[period], users[period]) for period in PERIODS}}
        return out

    async def leaders(self, limit: int, now: float) -> list[str]:
        slot = slot_of(now)
        ranked = await self._redis.zunion([self._board(s) for s in range(slot - DAY_SLOTS, slot + 1)], withscores=True)
        ranked = sorted(((str(m), float(s)) for m, s in ranked if float(s) > 0), key=lambda ms: (-ms[1], ms[0]))
        return [member for member, _ in ranked[:limit]]
