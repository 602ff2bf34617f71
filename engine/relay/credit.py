"""Credit: the relay counts, from receipts, how useful each peer's rollouts were to the others.

    book = CreditBook(redis_url="", swarm="default", credit_per_round=8, receipt_window_s=3600)
    # the relay: CreditBook(url, swarm, ..., client=broker.client), its broker's Redis client (one pool)
    await book.start()
    book.shared(peer, name, items)                  # a publish the relay accepted
    await book.handed(receiver, entries)            # a sample answer: which items went to whom
    answer = await book.receive(receiver, key, signed, request_id)   # a receipts message -> `receipted`
    await book.credits([peer])                      # peers' numbers: the `credit` of their stats message
    await book.board()                              # GET /stats/peers.json

The rule (docs/protocol.md, "Credit"): a receipt counts only for an item
the relay handed to that receiver in a sample within `receipt_window_s`,
only once per (receiver, item), and one receiver's `used` verdicts credit
at most `credit_per_round` items of one sender per sample answer (a
"round"). Per sender the relay keeps: items shared, sampled by others,
used (and their completions with a positive advantage), not picked,
rejected by reason, and the distinct peers that used them; over the last
hour and day (10-minute slots: the current one and the 6 or 144 before it)
and all time.

Two stores hold the same things: in memory (one relay process, the
embedded relay), and Redis (`--redis`), where two Lua scripts make the
"handed, not yet receipted, under the cap" checks atomic, so every relay
process of a swarm agrees; the Redis store uses the relay process's one
client (engine/relay/brokers.py, `redis_client`: a bounded pool, commands
retried on a fresh connection after a Redis restart). Distinct peers are
exact in memory and a HyperLogLog in Redis (exact for small counts, about
1% off for large ones). The Redis layout assumes one Redis server, not a
cluster.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from engine.relay.brokers import redis_client
from engine.swarm import protocol
from engine.swarm.identity import verify
from engine.swarm.receipts import COUNTED, DUPLICATE, NOT_SAMPLED, OVER_CAP, USED, Verdict, decode_receipts

log = logging.getLogger("sapling.relay")

SLOT_S = 600  # counts are kept per 10-minute slot
HOUR_SLOTS = 6  # "the last hour": the current slot and the 6 before it (60 to 70 minutes)
DAY_SLOTS = 144  # "the last day": the current slot and the 144 before it
PERIODS = ("hour", "day", "all")
METRICS = ("shared", "sampled", "used", "positive", "not_picked")
REJECTED_PREFIX = "rejected:"
MAX_HANDED = 500_000  # (receiver, sender, seq) records the in-memory store remembers, oldest dropped first
MAX_PEERS = 100_000  # peers whose credit the in-memory store keeps, least recently counted dropped first
BOARD_SIZE = 100  # peers listed by GET /stats/peers.json
BOARD_TTL_S = 10.0  # the board is reused this long, unless this process counted something since
CREDIT_PUSH_S = 30.0  # a connected peer's stats push carries its credit this often (and on request)

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

    async def add_shared(self, shared: dict[str, int], names: dict[str, str], now: float) -> None: ...

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

    async def add_shared(self, shared: dict[str, int], names: dict[str, str], now: float) -> None:
        for peer, items in shared.items():
            self._book(peer).add(Counter({"shared": items}), None, slot_of(now))
        for peer, name in names.items():
            self._book(peer).name = name

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

    async def add_shared(self, shared: dict[str, int], names: dict[str, str], now: float) -> None:
        slot = slot_of(now)
        pipe = self._redis.pipeline(transaction=False)
        for peer, items in shared.items():
            pipe.hincrby(self._hash(peer), f"{slot}:shared", items)
            pipe.hincrby(self._hash(peer), "all:shared", items)
        for peer, name in names.items():
            pipe.hset(self._hash(peer), "name", name)
        await pipe.execute()
        await self._trim(list(shared), slot)

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


class CreditBook:
    """The relay's side of receipts and credit (engine/relay/server.py calls it)."""

    def __init__(self, redis_url: str = "", swarm: str = "default",
                 credit_per_round: int = protocol.DEFAULT_CREDIT_PER_ROUND,
                 receipt_window_s: float = protocol.DEFAULT_RECEIPT_WINDOW_S,
                 clock: Callable[[], float] = time.time, client: Any = None) -> None:
        """`client`: a Redis client to share (the relay's broker's); without one a Redis URL gets its own."""
        self.store: MemoryCreditStore | RedisCreditStore = (
            RedisCreditStore(redis_url, swarm, client) if redis_url or client is not None else MemoryCreditStore())
        self.credit_per_round = credit_per_round
        self.receipt_window_s = receipt_window_s
        self.clock = clock
        self.metrics: Counter[str] = Counter()  # receipts, and receipt items by outcome
        self._hands = itertools.count(1)
        self._hand_prefix = secrets.token_hex(4) + "."  # hand ids are unique across the swarm's relay processes
        self._shared: dict[str, int] = {}
        self._names: dict[str, str] = {}
        self._board: tuple[float, int, dict[str, Any]] | None = None  # (when, self.changes then, the board)
        self.changes = 0  # counts changed by this process: a board built before a change is not reused

    async def start(self) -> None:
        await self.store.start()

    async def close(self) -> None:
        await self.flush()
        await self.store.close()

    def shared(self, peer: str, name: str, items: int) -> None:
        """Count a publish; written to the store at the next `flush` (the relay's stats tick)."""
        self._shared[peer] = self._shared.get(peer, 0) + items
        self._names[peer] = name

    async def flush(self) -> None:
        if not self._shared and not self._names:
            return
        shared, names = self._shared, self._names
        self._shared, self._names = {}, {}
        self.changes += 1
        try:
            await self.store.add_shared(shared, names, self.clock())
        except self.store.errors as exc:  # Redis away: the counts wait for the next tick
            log.warning("credit counts not saved: %s", exc)
            for peer, items in shared.items():
                self._shared[peer] = self._shared.get(peer, 0) + items
            self._names.update(names)

    async def handed(self, receiver: str, batches: Sequence[Handed]) -> None:
        """Remember what one sample answer handed `receiver` (a new round for the per-round cap)."""
        batches = [b for b in batches if b[1] > 0 and b[2] > 0]  # stream entries from before receipts: no record
        if not batches:
            return
        self.changes += 1
        try:
            await self.store.handed(receiver, f"{self._hand_prefix}{next(self._hands)}", batches,
                                    self.receipt_window_s, self.clock())
        except self.store.errors as exc:  # the sample was answered; its receipts will be refused
            log.warning("could not remember a sample for its receipts: %s", exc)

    async def receive(self, receiver: str, key: bytes, signed: protocol.Signed,
                      request_id: int | None) -> dict[str, Any]:
        """Check and count one receipts message; the `receipted` answer. ProtocolError for a bad message."""
        receipts = decode_receipts(signed.payload)
        if receipts.key != key:
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE,
                                         "the receipts are signed for a different key than this connection's")
        if not verify(receipts.key, signed.payload.encode("utf-8"), signed.sig):
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE, "receipts signature does not verify")
        now = self.clock()
        protocol.check_timestamp(receipts.ts, now)
        try:
            outcomes = await self.store.settle(receiver, receipts.verdicts, self.credit_per_round,
                                               self.receipt_window_s, now)
            counted = [v for v, outcome in zip(receipts.verdicts, outcomes, strict=True) if outcome == COUNTED]
            await self.store.count(receiver, counted, now)
        except self.store.errors as exc:  # Redis away: this message fails, the connection stays
            raise protocol.ProtocolError(
                protocol.E_INTERNAL, f"the relay cannot reach its store to count receipts ({exc}); try again") from exc
        refused = Counter(o for o in outcomes if o != COUNTED)
        self.changes += bool(counted)
        self.metrics["receipts"] += 1
        self.metrics[COUNTED] += len(counted)
        self.metrics.update(refused)
        return protocol.msg_receipted(request_id, len(counted),
                                      {k: refused[k] for k in (NOT_SAMPLED, DUPLICATE, OVER_CAP)
                                                                 if refused[k]})

    async def credits(self, peers: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each peer's numbers for its stats message, in one read; {} when the store cannot be read now."""
        if not peers:
            return {}
        await self.flush()  # the publishes counted since the last tick
        try:
            return await self.store.credit(list(dict.fromkeys(peers)), self.clock())
        except self.store.errors as exc:  # Redis away: the stats go out without credit
            log.warning("credit not read: %s", exc)
            return {}

    async def board(self) -> dict[str, Any]:
        """GET /stats/peers.json: the peers whose items were used most in the last day, with their credit."""
        await self.flush()
        now = self.clock()
        if self._board is not None and now - self._board[0] < BOARD_TTL_S and self._board[1] == self.changes:
            return self._board[2]
        leaders = await self.store.leaders(BOARD_SIZE, now)
        credit = await self.store.credit(leaders, now) if leaders else {}
        board = {"generated": round(now, 3), "period_s": {"hour": (HOUR_SLOTS + 1) * SLOT_S,
                                                          "day": (DAY_SLOTS + 1) * SLOT_S},
                 "peers": [credit[p] for p in leaders]}
        self._board = (now, self.changes, board)
        return board

