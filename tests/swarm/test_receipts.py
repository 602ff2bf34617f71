"""Receipts and credit against the client written from docs/protocol.md ("Receipts", "Credit"), on loopback."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest

from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, item

pytestmark = pytest.mark.integration  # every test here starts a relay


async def joined(url: str, **kw: Any) -> DocPeer:
    peer = DocPeer(url, **kw)
    assert (await peer.connect())["type"] == "welcome"
    return peer


async def handed(receiver: DocPeer, n: int = 16) -> list[tuple[str, int, int]]:
    """Sample and return (sender peer id of the payload's key, seq, number of items) per batch handed."""
    import base64
    import hashlib

    got = await receiver.sample_new(n)
    out = []
    for batch in got["batches"]:
        payload = json.loads(batch["payload"])
        out.append((hashlib.sha256(base64.b64decode(payload["key"])).hexdigest()[:20], payload["seq"],
                    len(payload["items"])))
    return out


def used(seq: int, i: int, positive: int = 1) -> dict[str, Any]:
    return {"seq": seq, "i": i, "verdict": "used", "positive": positive}


def verdict(seq: int, i: int, what: str) -> dict[str, Any]:
    return {"seq": seq, "i": i, "verdict": what}


def metric(url: str, name: str) -> str:
    text = urllib.request.urlopen(url.replace("ws://", "http://").replace("/ws", "/metrics")).read().decode()
    return next(line for line in text.splitlines() if line.startswith(name))


async def test_receipts_for_what_was_handed_count_once_and_the_sender_sees_its_credit(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    a, b = await joined(relay.url), await joined(relay.url)
    three = [item(), item(question="What is 2 + 2?"), item(question="What is 3 + 3?")]
    assert (await a.publish(three))["type"] == "published"
    [(sender, seq, items)] = await handed(b)
    assert (sender, items) == (a.peer_id, 3)
    answer = await b.receipts({a.peer_id: [used(seq, 0, positive=2), verdict(seq, 1, "implausible"),
                                           verdict(seq, 2, "not_picked")]}, request_id=12)
    assert answer == {"type": "receipted", "v": 1, "counted": 3, "refused": {}, "id": 12}
    credit = await a.credit()
    expected = {"shared": 3, "sampled": 3, "used": 1, "positive": 2, "not_picked": 1, "same_address": 0, "peers": 1,
                "rejected": {"implausible": 1}}
    assert credit["peer"] == a.peer_id and credit["name"]
    assert credit["hour"] == credit["day"] == credit["all"] == expected
    # the receiver's own credit is untouched: it shared nothing and nobody sent receipts about it
    assert (await b.credit())["all"] == {"shared": 0, "sampled": 0, "used": 0, "positive": 0, "not_picked": 0,
                                         "same_address": 0, "peers": 0, "rejected": {}}
    assert metric(relay.url, 'sapling_relay_receipt_items_total{result="counted"}').endswith(" 3")
    for peer in (a, b):
        await peer.close()


async def test_a_receipt_for_an_item_never_handed_to_its_sender_is_refused_and_counted(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    a, b, c = await joined(relay.url), await joined(relay.url), await joined(relay.url)
    assert (await a.publish([item(), item(question="What is 2 + 2?")]))["type"] == "published"
    [(_, seq, _)] = await handed(b)
    before = await a.credit()
    # C never sampled; B names a position past the batch's end, a batch that does not exist, and itself
    assert (await c.receipts({a.peer_id: [used(seq, 0)]})) == {
        "type": "receipted", "v": 1, "counted": 0, "refused": {"not_sampled": 1}}
    answer = await b.receipts({a.peer_id: [used(seq, 2), used(seq + 1, 0)], b.peer_id: [used(seq, 0)]})
    assert answer["counted"] == 0 and answer["refused"] == {"not_sampled": 3}
    after = await a.credit()
    assert after == before
    assert metric(relay.url, 'sapling_relay_receipt_items_total{result="not_sampled"}').endswith(" 4")
    for peer in (a, b, c):
        await peer.close()


async def test_a_second_receipt_for_the_same_item_is_refused(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    a, b = await joined(relay.url), await joined(relay.url)
    assert (await a.publish([item(), item(question="What is 2 + 2?")]))["type"] == "published"
    [(_, seq, _)] = await handed(b)
    answer = await b.receipts({a.peer_id: [used(seq, 0), verdict(seq, 0, "implausible")]})
    assert answer["counted"] == 1 and answer["refused"] == {"duplicate": 1}  # twice in one message
    credit = await a.credit()
    answer = await b.receipts({a.peer_id: [used(seq, 0), verdict(seq, 1, "too_long")]})
    assert answer["counted"] == 1 and answer["refused"] == {"duplicate": 1}  # and again later
    again = await a.credit()
    assert again["all"]["used"] == credit["all"]["used"] == 1
    assert again["all"]["rejected"] == {"too_long": 1}
    # the same receiver on a second connection is the same receiver
    b2 = await joined(relay.url, key=b.key)
    assert (await b2.receipts({a.peer_id: [used(seq, 1)]}))["refused"] == {"duplicate": 1}
    for peer in (a, b, b2):
        await peer.close()


async def test_receipts_signed_by_another_key_are_refused_as_bad_signature(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    a, b, c = await joined(relay.url), await joined(relay.url), await joined(relay.url)
    assert (await a.publish([item()]))["type"] == "published"
    [(_, seq, _)] = await handed(b)
    before = await a.credit()
    # over B's connection: a payload naming C's key (signed by C), and B's own payload signed by C
    payload = c.receipts_payload({a.peer_id: [used(seq, 0)]})
    await b.send({"type": "receipts", "v": 1, "payload": payload, "sig": c.sign(payload), "id": 3})
    answer = await b.recv()
    assert (answer["type"], answer["code"], answer["id"]) == ("error", "bad_signature", 3)
    answer = await b.receipts({a.peer_id: [used(seq, 0)]}, request_id=4, signer=c.key)
    assert answer["type"] == "error" and answer["code"] == "bad_signature" and answer["id"] == 4
    # over C's connection, claiming to be B
    answer = await c.receipts({a.peer_id: [used(seq, 0)]}, key=b.public, request_id=5)
    assert answer["code"] == "bad_signature"
    assert await a.credit() == before
    # the honest receipt still counts afterwards: nothing was marked by the forgeries
    assert (await b.receipts({a.peer_id: [used(seq, 0)]}))["counted"] == 1
    for peer in (a, b, c):
        await peer.close()


async def test_one_receiver_credits_at_most_credit_per_round_used_items_of_a_sender_per_sample(
        start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0, credit_per_round=2)
    a, b = await joined(relay.url), await joined(relay.url)
    four = [item(question=f"What is {n} + {n}?") for n in range(4)]
    assert (await a.publish(four))["type"] == "published"
    assert (await a.publish(four))["type"] == "published"
    batches = await handed(b)  # one sample answer, two batches of A: one round
    assert len(batches) == 2
    first, second = (seq for _, seq, _ in batches)
    answer = await b.receipts({a.peer_id: [used(first, i) for i in range(4)] + [verdict(second, 0, "implausible")]})
    assert answer["counted"] == 3 and answer["refused"] == {"over_cap": 2}  # rejections are not capped
    answer = await b.receipts({a.peer_id: [used(second, 1)]})  # a second message of the same round
    assert answer["counted"] == 0 and answer["refused"] == {"over_cap": 1}
    assert (await a.publish(four))["type"] == "published"
    [(_, third, _)] = await handed(b)  # the next sample answer: the next round
    assert (await b.receipts({a.peer_id: [used(third, i) for i in range(3)]}))["refused"] == {"over_cap": 1}
    assert (await a.credit())["all"]["used"] == 4
    for peer in (a, b):
        await peer.close()


@pytest.mark.parametrize(("items", "code"), [
    ([{"seq": 1, "i": 0, "verdict": "used"}], "bad_schema"),  # used without `positive`
    ([{"seq": 1, "i": 0, "verdict": "Not-A-Reason"}], "bad_schema"),
    ([{"seq": 1, "i": 0, "verdict": "x" * 33}], "bad_schema"),
    ([{"seq": 1, "i": 16, "verdict": "not_picked"}], "bad_schema"),  # past max_items_per_batch
    ([{"seq": 0, "i": 0, "verdict": "not_picked"}], "bad_schema"),
    ([{"seq": 1, "i": 0, "verdict": "used", "positive": 17}], "bad_schema"),
    ([], "bad_schema"),
    ([{"seq": 1, "i": i % 16, "verdict": "not_picked"} for i in range(257)], "too_many_items"),
])
async def test_a_malformed_receipt_gets_its_named_error_with_the_id(start_relay: StartRelay, items: list[Any],
                                                                     code: str) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    b = await joined(relay.url)
    answer = await b.receipts({"ab" * 10: items}, request_id=77)
    assert (answer["type"], answer["code"], answer["id"]) == ("error", code, 77)
    assert (await b.receipts({"ab" * 10: [verdict(1, 0, "stale")]}))["type"] == "receipted"  # still served
    await b.close()


async def test_senders_stale_times_and_unknown_reasons(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    a, b = await joined(relay.url), await joined(relay.url)
    assert (await a.publish([item(), item(question="What is 2 + 2?")]))["type"] == "published"
    [(_, seq, _)] = await handed(b)
    many = {f"{n:020x}": [verdict(1, 0, "stale")] for n in range(17)}
    assert (await b.receipts(many, request_id=1))["code"] == "too_many_items"
    repeated = json.loads(b.receipts_payload({a.peer_id: [used(seq, 0)]}))
    repeated["senders"] *= 2
    text = json.dumps(repeated)
    await b.send({"type": "receipts", "v": 1, "payload": text, "sig": b.sign(text), "id": 2})
    assert (await b.recv())["code"] == "bad_schema"
    assert (await b.receipts({a.peer_id: [used(seq, 0)]}, ts=time.time() - 3600, request_id=3))["code"] == \
        "stale_timestamp"
    answer = await b.receipts({a.peer_id: [verdict(seq, 0, "my_own_reason"), verdict(seq, 1, "forged_reward")]})
    assert answer["counted"] == 2
    assert (await a.credit())["all"]["rejected"] == {"other": 1, "forged_reward": 1}
    for peer in (a, b):
        await peer.close()


async def test_a_receipt_after_the_receipt_window_is_not_sampled(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0, receipt_window=1.0)
    a, b = await joined(relay.url), await joined(relay.url)
    assert (await a.publish([item()]))["type"] == "published"
    [(_, seq, _)] = await handed(b)
    expired = time.monotonic() + 1.2
    while time.monotonic() < expired:  # the window passes (the relay keeps time with its own clock)
        await asyncio.sleep(0.05)
    assert (await b.receipts({a.peer_id: [used(seq, 0)]}))["refused"] == {"not_sampled": 1}
    for peer in (a, b):
        await peer.close()


async def test_the_stats_push_carries_the_peers_own_credit(start_relay: StartRelay) -> None:
    relay = start_relay()
    a = await joined(relay.url)
    while True:  # the first push after the handshake (within the 5 s stats period)
        message = await a.recv(timeout=10, skip_stats=False)
        if message["type"] == "stats":
            break
    assert message["credit"]["peer"] == a.peer_id and set(message["credit"]) >= {"hour", "day", "all"}
    await a.close()


async def test_the_credit_board_lists_senders_by_use_without_addresses(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    a, b, c = await joined(relay.url), await joined(relay.url), await joined(relay.url)
    assert (await a.publish([item(), item(question="What is 2 + 2?")]))["type"] == "published"
    assert (await b.publish([item()]))["type"] == "published"
    for receiver in (b, c):
        for sender, seq, n in await handed(receiver):
            if sender == a.peer_id:
                await receiver.receipts({sender: [used(seq, i) for i in range(n)]})
    for sender, seq, _ in await handed(a):
        await a.receipts({sender: [used(seq, 0)]})
    text = urllib.request.urlopen(relay.url.replace("ws://", "http://").replace("/ws", "/stats/peers.json")).read()
    board = json.loads(text)
    assert [(p["peer"], p["day"]["used"], p["day"]["peers"]) for p in board["peers"]] == [
        (a.peer_id, 4, 2), (b.peer_id, 1, 1)]
    assert b"127.0.0.1" not in text and board["period_s"] == {"hour": 4200, "day": 87000}
    for peer in (a, b, c):
        await peer.close()
