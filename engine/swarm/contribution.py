"""What this node gave the swarm: receipts for what it took, and the credit that others' receipts earned it.

    verdicts = receipt_verdicts(offer, loop_verdicts)     # after a round: one receipt per item it was handed
    book = Contribution(data_dir / "swarm" / CREDIT_FILE, peer_id, swarm_key(relays), emit)
    book.update(client.state.credit, client.state.credit_at)   # the relay's numbers: saved, `contribution` event
    kept = read_kept(path, peer_id, swarm_key(relays))    # what `sapling-node stats` shows when the relay is away

Receipts are the receiving side: for every item of another peer that the
relay handed this node and that the round settled, the verdict (used, the
rejection reason, or not picked; docs/protocol.md, "Receipts"). Credit is
the sending side: the relay counts other peers' receipts about this node's
items and sends this node its own numbers in its stats messages
(engine/relay/credit.py). The node keeps the latest numbers per (identity,
swarm) in `swarm/credit.json` in the data dir (written atomically), with a
history for the app's chart, and says in words what they mean, including
when peers reject more than a quarter of what they judged of this node's
rollouts, with the main reason and what to do about it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_json
from engine.common.events import Event, make_event
from engine.rollouts.groups import group_advantages
from engine.rollouts.offers import Offer
from engine.swarm.receipts import USED, Verdict

log = logging.getLogger(__name__)

CREDIT_FILE = "credit.json"
HISTORY_STEP_S = 600.0  # one history point per 10-minute step (a newer one in the same step replaces it)
HISTORY_KEEP_S = 2 * 24 * 3600.0  # the chart shows the last two days
REJECTED_WARNING_SHARE = 0.25  # say so when peers reject more than this share of what they judged
MIN_JUDGED = 8  # ... and judged at least this many of this node's rollouts in the last day
# What to do when peers reject this node's rollouts, by the main reason (engine/rollouts/offers.py names them).
ADVICE = {
    "implausible": "their models find its text improbable, which happens when a model drifts or breaks; "
                   "start a fresh run or check the model setting",
    "forged_reward": "the rewards it claims disagree with their own scores; update Sapling, since peers "
                     "score answers with the same rules",
    "question_mismatch": "its questions differ from the ones peers rebuild; update Sapling",
    "unknown_task": "its tasks are unknown to peers; update Sapling",
    "too_long": "its answers are too long for them; lower tasks.max_new_tokens",
    "stale": "its rollouts reach them more than an hour late; check this computer's clock",
    "banned": "some peers banned it after rejecting many of its rollouts; look at the other reasons in "
              "`sapling-node stats`",
    "duplicate": "they had drawn the same question themselves this round, or had already trained on these "
                 "rollouts, so they learned nothing new from them; nothing to fix",
    "zero_advantage": "its questions were all answered equally well, so they teach nothing; nothing to fix",
}
OTHER_ADVICE = "update Sapling; if it goes on, ask the swarm's operator"


def swarm_key(relays: Sequence[str]) -> str:
    """One swarm, however its relays are ordered: the sorted relay addresses ("embedded" for this computer's)."""
    return " ".join(sorted(dict.fromkeys(relays))) or "embedded"


def positive_completions(rewards: Sequence[float]) -> int:
    """Completions with a positive advantage under these rewards (above the group's mean)."""
    return sum(1 for a in group_advantages(rewards, 1e-4) if a > 0)


def receipt_verdicts(offer: Offer, verdicts: Mapping[int, str | None]) -> list[Verdict]:
    """One receipt per item the offer can name: the loop's verdict on each offered item (used, with its
    positive completions, or the reason), and the verdicts `sample` already knew for the others."""
    out = [Verdict(sender, seq, index, verdict) for (sender, seq, index), verdict in offer.settled]
    for n, (item, (sender, seq, index)) in enumerate(zip(offer.items, offer.item_ids, strict=True)):
        verdict = verdicts.get(n)
        if verdict:
            out.append(Verdict(sender, seq, index, verdict))
        else:
            out.append(Verdict(sender, seq, index, USED, positive_completions(item.rewards)))
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary(credit: Mapping[str, Any]) -> str:
    """One sentence on the last day: "Your rollouts were used by 7 peers today (312 rollouts)."."""
    day = credit.get("day") or {}
    used, peers, sampled = int(day.get("used", 0)), int(day.get("peers", 0)), int(day.get("sampled", 0))
    if used:
        return f"Your rollouts were used by {_plural(peers, 'peer')} today ({_plural(used, 'rollout')})."
    if sampled:
        return f"Peers sampled {_plural(sampled, 'of your rollout')} today; none was used yet."
    return "No peer has used your rollouts today yet."


def rejection_warning(credit: Mapping[str, Any]) -> str | None:
    """A sentence when peers rejected more than a quarter of what they judged in the last day, else None."""
    day = credit.get("day") or {}
    rejected: dict[str, int] = {str(k): int(v) for k, v in (day.get("rejected") or {}).items()}
    judged = int(day.get("used", 0)) + sum(rejected.values())
    if judged < MIN_JUDGED or sum(rejected.values()) <= REJECTED_WARNING_SHARE * judged:
        return None
    reason = max(sorted(rejected), key=lambda r: rejected[r])
    share = round(100 * sum(rejected.values()) / judged)
    return (f"Peers rejected {share}% of the rollouts of yours they judged today, mostly as "
            f"{reason.replace('_', ' ')}: {ADVICE.get(reason, OTHER_ADVICE)}.")


def _history(entry: Mapping[str, Any]) -> list[list[float]]:
    raw = entry.get("history")
    if not isinstance(raw, list):
        return []
    return [list(map(float, p)) for p in raw
            if isinstance(p, list) and len(p) == 4 and all(isinstance(x, (int, float)) for x in p)]


def read_kept(path: Path, peer_id: str, swarm: str) -> dict[str, Any] | None:
    """The numbers this node last got from the relay for (identity, swarm): {"credit", "at", "history"}."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = data.get("entries", {}).get(f"{peer_id} {swarm}") if isinstance(data, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("credit"), dict):
        return None
    return {"credit": entry["credit"], "at": float(entry.get("at", 0.0)), "history": _history(entry)}


class Contribution:
    """This node's credit on one swarm, as the relay last sent it: kept in the data dir and emitted."""

    def __init__(self, path: Path | None, peer_id: str, swarm: str, emit: Callable[[Event], None]) -> None:
        self.path = path
        self.peer_id = peer_id
        self.swarm = swarm
        self.emit = emit
        self._at = 0.0
        kept = read_kept(path, peer_id, swarm) if path is not None else None
        self.history: list[list[float]] = kept["history"] if kept else []

    def update(self, credit: Mapping[str, Any] | None, at: float) -> bool:
        """Take the relay's latest numbers (`credit_at` = when they came); False when there is nothing new."""
        if credit is None or at <= self._at or credit.get("peer") not in (None, self.peer_id):
            return False
        self._at = at
        all_time = credit.get("all") or {}
        point = [round(at, 1), float(all_time.get("used", 0)), float(sum((all_time.get("rejected") or {}).values())),
                 float((credit.get("day") or {}).get("peers", 0))]
        if self.history and self.history[-1][0] // HISTORY_STEP_S == at // HISTORY_STEP_S:  # the same 10 minutes
            self.history[-1] = point
        else:
            self.history.append(point)
        self.history = [p for p in self.history if p[0] >= at - HISTORY_KEEP_S]
        self._save(dict(credit), at)
        self.emit(make_event("contribution", peer_id=self.peer_id, credit=dict(credit), message=summary(credit),
                             warning=rejection_warning(credit), at=at, swarm=self.swarm, history=self.history))
        return True

    def _save(self, credit: dict[str, Any], at: float) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = data.get("entries") if isinstance(data, dict) else None
        except (OSError, ValueError):
            entries = None
        entries = entries if isinstance(entries, dict) else {}
        entries[f"{self.peer_id} {self.swarm}"] = {"credit": credit, "at": at, "history": self.history}
        try:
            atomic_write_json(self.path, {"v": 1, "entries": entries})
        except OSError as exc:  # the numbers stay on the relay; only the offline copy is missing
            log.warning("could not keep this node's credit in %s: %s", self.path, exc)

