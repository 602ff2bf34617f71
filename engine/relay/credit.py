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
"round"). A `used` verdict from the address its sender last published from
credits nothing (`same_address`: keys on one computer cannot farm credit
from each other; not on loopback); the relay keeps a hash of each address. Per sender
the relay keeps: items shared, sampled by others, used (and their
completions with a positive advantage), not picked, rejected by reason,
`used` receipts refused as same-address, and the distinct peers that used
them; over the last hour and day (10-minute slots: the current one and the
6 or 144 before it) and all time.

The counts live in a store (engine/relay/credit_store.py): in memory (one
relay process, the embedded relay) or in Redis (`--redis`), the two agreeing.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from engine.relay.credit_store import (
    DAY_SLOTS,
    HOUR_SLOTS,
    MAX_PEERS,
    SAME_ADDRESS_MARK,
    SLOT_S,
    Handed,
    MemoryCreditStore,
    RedisCreditStore,
)
from engine.relay.proxy import address_tag, on_loopback
from engine.swarm import protocol
from engine.swarm.identity import verify
from engine.swarm.receipts import (
    COUNTED,
    DUPLICATE,
    NOT_SAMPLED,
    OVER_CAP,
    SAME_ADDRESS,
    USED,
    Verdict,
    decode_receipts,
)

log = logging.getLogger("sapling.relay")

BOARD_SIZE = 100  # peers listed by GET /stats/peers.json
BOARD_TTL_S = 10.0  # the board is reused this long, unless this process counted something since
CREDIT_PUSH_S = 30.0  # a connected peer's stats push carries its credit this often (and on request)


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
        self._addresses: dict[str, str] = {}  # sender -> address tag, to write at the next flush
        self._recent: OrderedDict[str, str] = OrderedDict()  # sender -> address tag, as this process saw last
        self._board: tuple[float, int, dict[str, Any]] | None = None  # (when, self.changes then, the board)
        self.changes = 0  # counts changed by this process: a board built before a change is not reused

    async def start(self) -> None:
        await self.store.start()

    async def close(self) -> None:
        await self.flush()
        await self.store.close()

    def shared(self, peer: str, name: str, items: int, ip: str = "") -> None:
        """Count a publish from address `ip`; written to the store at the next `flush` (the relay's stats tick)."""
        self._shared[peer] = self._shared.get(peer, 0) + items
        self._names[peer] = name
        if ip:
            self._addresses[peer] = self._recent[peer] = address_tag(ip)
            self._recent.move_to_end(peer)
            if len(self._recent) > MAX_PEERS:
                self._recent.popitem(last=False)

    async def flush(self) -> None:
        if not self._shared and not self._names:
            return
        shared, names, addresses = self._shared, self._names, self._addresses
        self._shared, self._names, self._addresses = {}, {}, {}
        self.changes += 1
        try:
            await self.store.add_shared(shared, names, self.clock(), addresses)
        except self.store.errors as exc:  # Redis away: the counts wait for the next tick
            log.warning("credit counts not saved: %s", exc)
            for peer, items in shared.items():
                self._shared[peer] = self._shared.get(peer, 0) + items
            self._names.update(names)
            self._addresses = {**addresses, **self._addresses}

    async def _same_address(self, verdicts: Sequence[Verdict], ip: str) -> tuple[Verdict, ...]:
        """`verdicts`, each `used` one whose sender last published from `ip` marked SAME_ADDRESS_MARK."""
        senders = list(dict.fromkeys(v.sender for v in verdicts if v.verdict == USED))
        if not senders or on_loopback(ip):  # on loopback (tests, experiments) the relay cannot tell computers apart
            return tuple(verdicts)
        tags = {p: self._recent[p] for p in senders if p in self._recent}
        unknown = [p for p in senders if p not in tags]
        if unknown:
            tags.update(await self.store.addresses(unknown))
        mine = address_tag(ip)
        return tuple(Verdict(v.sender, v.seq, v.index, SAME_ADDRESS_MARK)
                     if v.verdict == USED and tags.get(v.sender) == mine else v for v in verdicts)

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
                      request_id: int | None, ip: str = "") -> dict[str, Any]:
        """Check and count one receipts message from `ip`; the `receipted` answer. ProtocolError for a bad one."""
        receipts = decode_receipts(signed.payload)
        if receipts.key != key:
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE,
                                         "the receipts are signed for a different key than this connection's")
        if not verify(receipts.key, signed.payload.encode("utf-8"), signed.sig):
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE, "receipts signature does not verify")
        now = self.clock()
        protocol.check_timestamp(receipts.ts, now)
        try:
            verdicts = await self._same_address(receipts.verdicts, ip)
            outcomes = await self.store.settle(receiver, verdicts, self.credit_per_round, self.receipt_window_s, now)
            await self.store.count(receiver, [v for v, o in zip(verdicts, outcomes, strict=True) if o == COUNTED], now)
            outcomes = [SAME_ADDRESS if o == COUNTED and v.verdict == SAME_ADDRESS_MARK else o
                        for v, o in zip(verdicts, outcomes, strict=True)]
            counted = [v for v, outcome in zip(verdicts, outcomes, strict=True) if outcome == COUNTED]
        except self.store.errors as exc:  # Redis away: this message fails, the connection stays
            raise protocol.ProtocolError(
                protocol.E_INTERNAL, f"the relay cannot reach its store to count receipts ({exc}); try again") from exc
        refused = Counter(o for o in outcomes if o != COUNTED)
        self.changes += bool(counted)
        self.metrics["receipts"] += 1
        self.metrics[COUNTED] += len(counted)
        self.metrics.update(refused)
        return protocol.msg_receipted(request_id, len(counted),
                                      {k: refused[k] for k in (NOT_SAMPLED, DUPLICATE, OVER_CAP, SAME_ADDRESS)
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
