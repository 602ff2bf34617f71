"""The relay's credit counting in memory (engine/relay/credit.py), on a clock the test moves."""

from __future__ import annotations

import asyncio

from engine.relay.credit import CreditBook
from engine.relay.credit_store import SLOT_S
from engine.swarm.identity import Identity
from engine.swarm.receipts import Verdict, receipts_payload

A, B, C = "a" * 20, "b" * 20, "c" * 20


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0 - 1_800_000_000.0 % SLOT_S  # the start of a 10-minute slot

    def __call__(self) -> float:
        return self.now


def test_counts_move_from_the_hour_to_the_day_to_all_time_as_slots_pass() -> None:
    async def run() -> None:
        clock = Clock()
        book = CreditBook(clock=clock, receipt_window_s=10 * 86400)
        receiver = Identity.generate()
        await book.handed(receiver.peer_id, [(A, 5, 2)])
        payload = receipts_payload(receiver.public_key, clock.now, [Verdict(A, 5, 0, "used", 2),
                                                                     Verdict(A, 5, 1, "too_long")])
        answer = await book.receive(receiver.peer_id, receiver.public_key, receiver.signed(payload), None)
        assert answer["counted"] == 2

        def used(credit: dict[str, dict[str, int]]) -> tuple[int, int, int]:
            return credit["hour"]["used"], credit["day"]["used"], credit["all"]["used"]

        assert used((await book.credits([A]))[A]) == (1, 1, 1)
        clock.now += 6 * SLOT_S + SLOT_S - 1  # still the sixth slot before the current one
        assert used((await book.credits([A]))[A]) == (1, 1, 1)
        clock.now += 1  # the seventh: out of the hour
        assert used((await book.credits([A]))[A]) == (0, 1, 1)
        clock.now += (144 - 7) * SLOT_S + SLOT_S  # out of the day
        credit = (await book.credits([A]))[A]
        assert used(credit) == (0, 0, 1)
        assert credit["all"] == {"shared": 0, "sampled": 2, "used": 1, "positive": 2, "not_picked": 0,
                                 "same_address": 0, "peers": 1, "rejected": {"too_long": 1}}
        assert credit["day"]["peers"] == 0 and credit["day"]["rejected"] == {}

    asyncio.run(run())


def test_what_was_handed_is_forgotten_after_the_receipt_window() -> None:
    async def run() -> None:
        clock = Clock()
        book = CreditBook(clock=clock, receipt_window_s=60.0)
        await book.handed(B, [(A, 5, 1)])
        clock.now += 59.0
        assert await book.store.settle(B, [Verdict(A, 5, 0, "not_picked")], 8, 60.0, clock.now) == ["counted"]
        await book.handed(B, [(A, 6, 1)])
        clock.now += 61.0
        assert await book.store.settle(B, [Verdict(A, 6, 0, "not_picked")], 8, 60.0, clock.now) == ["not_sampled"]

    asyncio.run(run())


def test_the_board_ranks_senders_by_items_used_in_the_last_day() -> None:
    async def run() -> None:
        clock = Clock()
        book = CreditBook(clock=clock)
        for receiver, batches in ((B, [(A, 1, 3), (C, 1, 1)]), (C, [(A, 1, 3)])):
            await book.handed(receiver, batches)
            verdicts = [Verdict(s, q, i, "used", 1) for s, q, n in batches for i in range(n)]
            outcomes = await book.store.settle(receiver, verdicts, 8, 3600.0, clock.now)
            await book.store.count(receiver, [v for v, o in zip(verdicts, outcomes, strict=True) if o == "counted"],
                                   clock.now)
        board = await book.board()
        assert [(p["peer"], p["day"]["used"], p["day"]["peers"]) for p in board["peers"]] == [(A, 6, 2), (C, 1, 1)]
        clock.now += 145 * SLOT_S
        assert (await book.board())["peers"] == []  # nothing used in the last day

    asyncio.run(run())


def test_a_used_receipt_from_the_senders_own_address_credits_nothing_but_on_loopback_it_does() -> None:
    async def run() -> None:
        clock = Clock()
        book = CreditBook(clock=clock)
        sender = "d" * 20
        book.shared(sender, "farm", 3, "203.0.113.66")
        outcomes = []
        for n, ip in enumerate(("203.0.113.66", "198.51.100.1", "127.0.0.1")):
            receiver = Identity.generate()
            await book.handed(receiver.peer_id, [(sender, 5, 3)])
            payload = receipts_payload(receiver.public_key, clock.now, [Verdict(sender, 5, n, "used", 1)])
            answer = await book.receive(receiver.peer_id, receiver.public_key, receiver.signed(payload), None, ip)
            outcomes.append((answer["counted"], answer["refused"]))
        assert outcomes == [(0, {"same_address": 1}), (1, {}), (1, {})]
        credit = (await book.credits([sender]))[sender]["all"]
        assert (credit["used"], credit["same_address"], credit["peers"]) == (2, 1, 2)
        # a receiver cannot mark a sender with a verdict of that name: it is an unknown reason, counted as other
        receiver = Identity.generate()
        await book.handed(receiver.peer_id, [(sender, 6, 1)])
        payload = receipts_payload(receiver.public_key, clock.now, [Verdict(sender, 6, 0, "same_address")])
        await book.receive(receiver.peer_id, receiver.public_key, receiver.signed(payload), None, "198.51.100.2")
        credit = (await book.credits([sender]))[sender]["all"]
        assert credit["same_address"] == 1 and credit["rejected"] == {"other": 1}

    asyncio.run(run())
