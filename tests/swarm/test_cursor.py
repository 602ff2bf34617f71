"""Sampling cursors: a node is handed only what was published since it last asked.

The measurement behind issue 14 (part 1b) is `test_two_nodes_over_rounds_...`:
two real clients, each round both publish one batch of 8 questions, then
both sample J = 4 batches; a batch counts as a duplicate when the node got
the same (key, seq) in an earlier round. The first-version client (no
`after`) and the cursor client run the same rounds on twin relays in the
same run. Numbers, with `-s`:

    .venv/bin/python -m pytest -q -s tests/swarm/test_cursor.py -k rounds
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from engine.swarm import protocol as p
from engine.swarm.client import SwarmClient
from engine.swarm.identity import Identity
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, item

ITEMS_PER_BATCH = 8
J = 4


async def _joined(url: str) -> DocPeer:
    peer = DocPeer(url)
    assert (await peer.connect())["type"] == "welcome"
    return peer


def _seqs(answer: dict[str, object]) -> list[int]:
    return [json.loads(b["payload"])["seq"] for b in answer["batches"]]  # type: ignore[attr-defined]


@pytest.mark.integration
async def test_a_cursor_hands_out_only_what_is_newer(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0)
    sender, reader = await _joined(relay.url), await _joined(relay.url)
    for seq in (1, 2, 3):
        assert (await sender.publish([item()], seq=seq))["type"] == "published"
    first = await reader.sample_new(16)
    assert sorted(_seqs(first)) == [1, 2, 3] and first["cursor"]  # no cursor yet: the whole window
    assert (await reader.sample_new(16))["batches"] == []  # nothing new since
    for seq in (4, 5):
        assert (await sender.publish([item()], seq=seq))["type"] == "published"
    assert sorted(_seqs(await reader.sample_new(16))) == [4, 5]
    # a client that sends no cursor (protocol v1) still gets the whole window
    assert sorted(_seqs(await reader.sample(16))) == [1, 2, 3, 4, 5]
    # a cursor from another relay (or from before a restart) counts as none
    other = start_relay()
    stranger = await _joined(other.url)
    foreign = (await stranger.sample(1))["cursor"]
    assert sorted(_seqs(await reader.sample(16, after=foreign))) == [1, 2, 3, 4, 5]
    assert sorted(_seqs(await reader.sample(16, after="not a cursor"))) == [1, 2, 3, 4, 5]
    # cursors never go back, and bad ones are refused by name
    assert (await reader.sample(16, after=reader.cursor))["cursor"] == reader.cursor
    await reader.send({"type": "sample", "v": 1, "id": 3, "n": 1, "after": 7})
    assert (await reader.recv())["code"] == p.E_BAD_SCHEMA
    await reader.send({"type": "sample", "v": 1, "id": 3, "n": 1, "after": "x" * (p.MAX_CURSOR_CHARS + 1)})
    assert (await reader.recv())["code"] == p.E_TOO_LARGE
    for peer in (sender, reader, stranger):
        await peer.close()


@pytest.mark.integration
async def test_the_draw_is_uniform_over_the_new_batches(start_relay: StartRelay) -> None:
    relay = start_relay(rate=10_000.0, burst=10_000.0)
    sender, reader = await _joined(relay.url), await _joined(relay.url)
    for seq in range(1, 11):
        await sender.publish([item()], seq=seq)
    cursor = (await reader.sample(16))["cursor"]
    for seq in range(11, 15):
        await sender.publish([item()], seq=seq)
    counts: Counter[int] = Counter()
    for i in range(400):
        counts.update(_seqs(await reader.sample(1, request_id=i, after=cursor)))
    assert set(counts) == {11, 12, 13, 14}  # never an old one
    assert min(counts.values()) >= 60  # 100 expected each; below 60 has probability < 1e-5
    two = {tuple(sorted(_seqs(await reader.sample(2, request_id=i, after=cursor)))) for i in range(200)}
    assert all(len(set(pair)) == 2 for pair in two)  # without replacement
    await sender.close()
    await reader.close()


async def _rounds(url: str, rounds: int, use_cursor: bool) -> list[tuple[int, int]]:
    """(items received, items in batches seen before) per round, summed over both nodes."""
    nodes = [await _joined(url), await _joined(url)]
    seen: list[set[tuple[str, int]]] = [set(), set()]
    out = []
    for _ in range(rounds):
        for node in nodes:
            assert (await node.publish([item(task={"dataset": "d", "index": i}) for i in range(ITEMS_PER_BATCH)],
                                       ))["type"] == "published"
        received = duplicates = 0
        for node, mine in zip(nodes, seen, strict=True):
            answer = await (node.sample_new(J) if use_cursor else node.sample(J))
            for batch in answer["batches"]:
                payload = json.loads(batch["payload"])
                n_items = len(payload["items"])
                received += n_items
                if (payload["key"], payload["seq"]) in mine:
                    duplicates += n_items
                mine.add((payload["key"], payload["seq"]))
        out.append((received, duplicates))
    for node in nodes:
        await node.close()
    return out


@pytest.mark.integration
async def test_two_nodes_over_rounds_receive_no_duplicates_with_a_cursor(start_relay: StartRelay) -> None:
    rounds = 10
    plain = await _rounds(start_relay(rate=100.0, burst=100.0).url, rounds, use_cursor=False)
    cursor = await _rounds(start_relay(rate=100.0, burst=100.0).url, rounds, use_cursor=True)
    print(f"\n{'round':>5} | {'v1 received':>11} {'duplicate':>9} | {'cursor received':>15} {'duplicate':>9}")
    for r, ((got, dup), (got_c, dup_c)) in enumerate(zip(plain, cursor, strict=True), start=1):
        print(f"{r:>5} | {got:>11} {dup:>9} | {got_c:>15} {dup_c:>9}")
    total, dups = sum(g for g, _ in plain), sum(d for _, d in plain)
    total_c, dups_c = sum(g for g, _ in cursor), sum(d for _, d in cursor)
    print(f"  all | {total:>11} {dups:>9} | {total_c:>15} {dups_c:>9}   duplicate share "
          f"{dups / total:.0%} without a cursor, {dups_c / total_c:.0%} with one")
    # By hand: in round r each node's window holds r batches of the other node and v1 draws
    # min(J, r) of them. Up to round J that is all of them, every one but the newest seen before;
    # later draws are random. With the cursor each node gets exactly the other's new batch.
    assert [got for got, _ in plain] == [2 * ITEMS_PER_BATCH * min(J, r) for r in range(1, rounds + 1)]
    assert plain[:J] == [(2 * ITEMS_PER_BATCH * r, 2 * ITEMS_PER_BATCH * (r - 1)) for r in range(1, J + 1)]
    assert cursor == [(2 * ITEMS_PER_BATCH, 0)] * rounds


def _batch(identity: Identity, client: SwarmClient, n_items: int) -> str:
    items = [p.Item({"dataset": "d", "index": i}, f"q{i}", ("a", "b"), (None, None)) for i in range(n_items)]
    return p.batch_payload(identity.public_key, client.next_seq(), time.time(), "m", items)


@pytest.mark.integration
def test_the_swarm_client_keeps_its_cursor_between_samples(start_relay: StartRelay) -> None:
    relay = start_relay(rate=100.0, burst=100.0)
    ids = [Identity.generate(), Identity.generate()]
    clients = [SwarmClient(relay.url, ident) for ident in ids]
    try:
        for client in clients:
            client.start()
            assert client.wait_connected(10)
        seen: set[tuple[str, int]] = set()
        for round_index in range(5):
            for ident, client in zip(ids, clients, strict=True):
                before = client.state.published
                assert client.publish(_batch(ident, client, 2))
                deadline = time.monotonic() + 10
                while client.state.published == before and time.monotonic() < deadline:
                    time.sleep(0.01)
            got = clients[1].sample(J)  # the caller's interface is unchanged: sample(n)
            assert len(got) == 1, round_index  # only the batch published since the last call
            batch = p.decode_batch(got[0].payload)
            assert (batch.peer, batch.seq) not in seen
            seen.add((batch.peer, batch.seq))
        assert clients[1].sample(J) == []  # nothing new
    finally:
        for client in clients:
            client.close()
