"""The node's side of receipts and credit (engine/swarm/contribution.py): pure rules, the kept file, the event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.common.events import Event, encode, parse_event
from engine.questions.tasks import Question, TaskRef
from engine.rollouts.offers import REASONS, ExternalItem, Offer
from engine.swarm import receipts
from engine.swarm.contribution import (
    Contribution,
    positive_completions,
    read_kept,
    receipt_verdicts,
    rejection_warning,
    summary,
    swarm_key,
)


def external(peer: str, rewards: tuple[float, ...]) -> ExternalItem:
    question = Question(TaskRef("basic_arithmetic", (), 0, 1), "What is 1 + 1?", "2", {})
    return ExternalItem(peer, question, tuple(f"c{i}" for i in range(len(rewards))), rewards)


def period(used: int = 0, peers: int = 0, sampled: int = 0, **rejected: int) -> dict[str, Any]:
    return {"shared": 0, "sampled": sampled, "used": used, "positive": 0, "not_picked": 0, "peers": peers,
            "rejected": rejected}


def credit(peer: str = "p" * 20, **day: Any) -> dict[str, Any]:
    return {"peer": peer, "name": "amber-otter-3f2a", "hour": period(), "day": period(**day), "all": period(**day)}


def test_every_item_an_offer_names_gets_one_receipt_with_its_verdict() -> None:
    offer = Offer(items=[external("a" * 20, (1.0, 0.0, 0.0)), external("b" * 20, (1.0, 0.0))],
                  item_ids=[("a" * 20, 7, 0), ("b" * 20, 9, 2)],
                  settled=[(("a" * 20, 7, 1), "not_picked"), (("b" * 20, 9, 0), "question_mismatch")])
    got = receipt_verdicts(offer, {1: "implausible"})
    assert got == [
        receipts.Verdict("a" * 20, 7, 1, "not_picked"),
        receipts.Verdict("b" * 20, 9, 0, "question_mismatch"),
        receipts.Verdict("a" * 20, 7, 0, "used", 1),  # one completion above the mean of 1/3
        receipts.Verdict("b" * 20, 9, 2, "implausible"),
    ]
    payload = receipts.receipts_payload(b"k" * 32, 1.0, got)
    decoded = receipts.decode_receipts(payload)
    assert list(decoded.verdicts) == sorted(got, key=lambda v: v.sender)  # grouped by sender, order kept


def test_positive_completions_are_those_above_the_groups_mean() -> None:
    assert positive_completions((1.0, 0.0, 0.0, 0.0)) == 1
    assert positive_completions((1.0, 1.0, 1.0, 0.0)) == 3
    assert positive_completions((0.5, 0.5)) == 0


def test_the_receipt_reasons_are_the_nodes_reasons_that_can_name_their_sender() -> None:
    assert set(receipts.REASONS) == set(REASONS) - {"malformed", "bad_signature"}


def test_the_summary_says_the_last_day_in_words() -> None:
    assert summary(credit(used=312, peers=7)) == "Your rollouts were used by 7 peers today (312 rollouts)."
    assert summary(credit(used=1, peers=1)) == "Your rollouts were used by 1 peer today (1 rollout)."
    assert summary(credit(sampled=5)) == "Peers sampled 5 of your rollouts today; none was used yet."
    assert summary(credit()) == "No peer has used your rollouts today yet."


def test_a_warning_only_when_peers_reject_more_than_a_quarter_of_what_they_judged() -> None:
    assert rejection_warning(credit(used=6, implausible=2)) is None  # exactly a quarter
    assert rejection_warning(credit(used=2, implausible=3)) is None  # too few judged to say
    warning = rejection_warning(credit(used=5, implausible=2, too_long=1))
    assert warning is not None
    assert warning.startswith("Peers rejected 38% of the rollouts of yours they judged today, mostly as implausible:")
    assert "start a fresh run" in warning
    other = rejection_warning(credit(used=0, new_reason=9))
    assert other is not None and "update Sapling" in other


def test_new_numbers_are_kept_in_the_data_dir_and_emitted_once(tmp_path: Path) -> None:
    events: list[Event] = []
    path = tmp_path / "swarm" / "credit.json"
    book = Contribution(path, "p" * 20, swarm_key(["wss://b/ws", "wss://a/ws"]), events.append)
    assert book.update(credit(used=3, peers=1), at=1000.0)
    assert not book.update(credit(used=3, peers=1), at=1000.0)  # nothing new
    assert not book.update(None, at=2000.0)
    assert not book.update(credit(peer="q" * 20, used=9), at=2000.0)  # another identity's
    assert book.update(credit(used=4, peers=2), at=1300.0)  # the next 10-minute step: a second point
    assert book.update(credit(used=5, peers=2), at=1700.0)  # the same step: replaces it
    assert [e["type"] for e in events] == ["contribution"] * 3
    event = parse_event(encode(events[-1]))
    assert event is not None and event["message"] == "Your rollouts were used by 2 peers today (5 rollouts)."
    assert event["history"] == [[1000.0, 3.0, 0.0, 1.0], [1700.0, 5.0, 0.0, 2.0]]
    assert event["swarm"] == "wss://a/ws wss://b/ws" and event["warning"] is None
    kept = read_kept(path, "p" * 20, "wss://a/ws wss://b/ws")
    assert kept is not None and kept["at"] == 1700.0 and kept["credit"]["day"]["used"] == 5
    assert read_kept(path, "p" * 20, "embedded") is None
    assert json.loads(path.read_text())["v"] == 1
    again = Contribution(path, "p" * 20, "wss://a/ws wss://b/ws", events.append)
    assert again.history == kept["history"]  # the chart goes on after a restart


def test_an_unreadable_kept_file_is_no_numbers(tmp_path: Path) -> None:
    path = tmp_path / "credit.json"
    path.write_text("{not json")
    assert read_kept(path, "p" * 20, "embedded") is None
    book = Contribution(path, "p" * 20, "embedded", lambda event: None)
    assert book.update(credit(used=1, peers=1), at=5.0)  # and the next update writes a good one
    assert read_kept(path, "p" * 20, "embedded") is not None
