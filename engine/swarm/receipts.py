"""Receipts: what a receiving node tells the relay about the items it was handed. Pure code.

    payload = receipts_payload(identity.public_key, time.time(), verdicts)   # the node signs and sends it
    receipts = decode_receipts(payload)                                     # the relay checks its shape

After a round, a node sends one signed `receipts` message: for every item of
another peer that the relay handed it and that it settled (trained on,
rejected with a reason, or not picked), the item's id and the verdict. An
item is named by its sender's peer id, its batch's `seq` and its position
`i` in the batch, so the relay can check that it handed exactly that item
to exactly this receiver (engine/relay/credit.py keeps that memory and
counts the credit). For a used item the receipt also says how many of its
completions had a positive advantage under the receiver's own scores.

The full description, with the limits and errors, is docs/protocol.md
("Receipts" and "Credit"). Decoding raises only `protocol.ProtocolError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.rollouts.offers import NOT_PICKED
from engine.swarm import protocol, wire

USED = "used"
OTHER = "other"  # what the relay counts a rejection reason it does not know as
# The rejection reasons a receipt may name and the relay counts under their own name; any other
# well-formed reason is counted as `other`, so a receiver cannot grow the relay's counters at will.
# (Sapling's reasons, engine/rollouts/offers.py, less `malformed` and `bad_signature`: such an item cannot be
# tied to its sender, or the fault may be the relay's, so a node sends no receipt for it.)
REASONS = ("stale", "unknown_task", "question_mismatch", "forged_reward", "too_long", "duplicate",
           "zero_advantage", "banned", "implausible")
VERDICT_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# One receipts message covers at most what one sample can hand out.
MAX_RECEIPT_SENDERS = protocol.MAX_SAMPLE_BATCHES
MAX_RECEIPT_ITEMS = protocol.MAX_SAMPLE_BATCHES * protocol.MAX_ITEMS_PER_BATCH
# What the relay answers for each item: counted, or why it was refused.
COUNTED = "counted"
NOT_SAMPLED = "not_sampled"  # the relay did not hand this item to this receiver (or forgot: receipt_window_s)
DUPLICATE = "duplicate"  # this receiver already sent a receipt for this item
OVER_CAP = "over_cap"  # `used` beyond credit_per_round items of one sender from one sample: not credited
SAME_ADDRESS = "same_address"  # `used` from the address the sender publishes from: not credited
REFUSALS = (NOT_SAMPLED, DUPLICATE, OVER_CAP, SAME_ADDRESS)
OUTCOMES = (COUNTED, *REFUSALS)


@dataclass(frozen=True)
class Verdict:
    """One item's receipt: whose it is, which one, and what the receiver did with it."""

    sender: str  # peer id of the item's sender
    seq: int  # its batch's sequence number
    index: int  # its position in the batch
    verdict: str  # USED, NOT_PICKED or a rejection reason
    positive: int = 0  # for USED: completions with a positive advantage under the receiver's scores

    def counted_as(self) -> str:
        """The name the relay counts this verdict under (an unknown reason is `other`)."""
        if self.verdict in (USED, NOT_PICKED) or self.verdict in REASONS:
            return self.verdict
        return OTHER


@dataclass(frozen=True)
class Receipts:
    """A verified-shape receipts payload (the signature is checked separately)."""

    key: bytes
    ts: float
    verdicts: tuple[Verdict, ...]

    @property
    def peer(self) -> str:
        return protocol.peer_id(self.key)


def _verdicts(sender: str, raw: object, where: str) -> list[Verdict]:
    if not isinstance(raw, list) or not raw:
        raise wire.fail(protocol.E_BAD_SCHEMA, f"{where}: 'items' must be a non-empty list")
    out = []
    for n, entry in enumerate(raw):
        at = f"{where} item {n}"
        if not isinstance(entry, dict):
            raise wire.fail(protocol.E_BAD_SCHEMA, f"{at} must be an object")
        seq = wire.whole(entry, "seq", 1, protocol.MAX_SEQ, at)
        index = wire.whole(entry, "i", 0, protocol.MAX_ITEMS_PER_BATCH - 1, at)
        verdict = entry.get("verdict")
        if not isinstance(verdict, str) or not VERDICT_PATTERN.match(verdict):
            raise wire.fail(protocol.E_BAD_SCHEMA, f"{at}: 'verdict' must be 'used', 'not_picked' or a reason "
                                                   "(a-z, 0-9 and _, at most 32 characters)")
        positive = 0
        if verdict == USED:
            positive = wire.whole(entry, "positive", 0, protocol.MAX_COMPLETIONS_PER_ITEM, at)
        out.append(Verdict(sender, seq, index, verdict, positive))
    return out


def decode_receipts(payload: str) -> Receipts:
    """Parse and check a receipts payload string (the signature is not checked here)."""
    obj = protocol.payload_object(payload, "receipts")
    key, ts = wire.b64(obj, "key", protocol.PUBLIC_KEY_BYTES), wire.number(obj, "ts")
    senders = obj.get("senders")
    if not isinstance(senders, list):
        raise wire.fail(protocol.E_BAD_SCHEMA, "'senders' must be a list")
    if len(senders) > MAX_RECEIPT_SENDERS:
        raise wire.fail(protocol.E_TOO_MANY_ITEMS, f"receipts name at most {MAX_RECEIPT_SENDERS} senders")
    verdicts: list[Verdict] = []
    seen: set[str] = set()
    for n, entry in enumerate(senders):
        if not isinstance(entry, dict):
            raise wire.fail(protocol.E_BAD_SCHEMA, f"sender {n} must be an object")
        peer = wire.hex_text(entry, "peer", protocol.PEER_ID_HEX // 2)
        if peer in seen:
            raise wire.fail(protocol.E_BAD_SCHEMA, f"sender {peer} is listed twice")
        seen.add(peer)
        items = entry.get("items")
        if isinstance(items, list) and len(verdicts) + len(items) > MAX_RECEIPT_ITEMS:
            raise wire.fail(protocol.E_TOO_MANY_ITEMS, f"receipts cover at most {MAX_RECEIPT_ITEMS} items")
        verdicts.extend(_verdicts(peer, items, f"sender {n}"))
    return Receipts(key, ts, tuple(verdicts))


def receipts_payload(key: bytes, ts: float, verdicts: list[Verdict]) -> str:
    """The payload string a node signs and sends: the verdicts grouped by sender, in the order given."""
    by_sender: dict[str, list[dict[str, Any]]] = {}
    for v in verdicts:
        entry: dict[str, Any] = {"seq": v.seq, "i": v.index, "verdict": v.verdict}
        if v.verdict == USED:
            entry["positive"] = v.positive
        by_sender.setdefault(v.sender, []).append(entry)
    payload = protocol.encode({
        "kind": "receipts",
        "key": protocol.b64encode(key),
        "ts": ts,
        "senders": [{"peer": peer, "items": items} for peer, items in by_sender.items()],
    })
    decode_receipts(payload)
    return payload
