"""The SAPO mix: what the round loop shares with the swarm and what it takes back.

`RolloutExchange` is the round loop's interface to the swarm; `SwarmExchange`
is the one the node uses when a relay is configured. The round loop sees it
through these calls (and `set_model_label` once its model is loaded):

- `publish(round, groups)` signs this round's groups as a batch of text;
- `sample(round, n, taskset, exclude=, seed=)` returns an `Offer`: up to n
  `ExternalItem`s, verified text, never tokens;
- `settle(offer, verdicts)` takes the loop's own verdict on each offered
  item (accepted, or rejected with a reason, e.g. too many tokens for this
  node's tokenizer) and returns the round's swarm report.

Sampling trusts nothing it receives. Per batch: the signature over the exact
payload bytes, the sender's ban, replays of a (peer, seq) pair seen before,
and the signed timestamp. The surviving items are shuffled and checked one by
one with `verify_item` (a pure function: the task reference is rebuilt here
and the question text must match; every completion is re-scored with this
node's verifier and a sender whose claimed rewards differ is a forger; a
question this node already has this round is a duplicate), and a group whose
rewards are all equal carries no gradient (`zero_advantage`; its mean reward
is still kept, in `Offer.scored`), until n are accepted. The rest are
counted as `not_picked`: every item a peer sends is counted once, in items
(a question with its completions) in metrics, events and the terminal alike.

Against correct but malicious text (docs/swarm.md, "Poisoning"; the test
itself runs in the loop, which has the log-probs, and comes back here as the
verdict `implausible`): an item whose content this node already trained on
is a `duplicate` whatever its sequence number (`ReplayMemory`, kept in the
data dir), and a peer whose judged items are too often `forged_reward` or
`implausible` is banned here (`BanBook`); `unban(peer)` lifts an earned ban.

Past a daily data cap (engine/swarm/datacap.py) the exchange publishes (upload)
or samples (download) nothing until midnight, says so once in the log and the
swarm line, and the loop trains on its own groups; each `peers` event carries
today's traffic as `data_today`. engine/swarm/session.py opens all of this.

The test follows the model policy the relay declares in its welcome
(engine/common/model_policy.py). Under `mixed`, an item labelled with another
model is put in `offer.baselines` with its sender's past (`SenderBaselines`,
in the data dir): the loop judges it against that, such an `implausible` is
no strike, and items taken from a sender on probation count as `probation`.
Otherwise every item gets the absolute test against this node's model.
"""

from __future__ import annotations

import base64
import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.common.errors import TaskError
from engine.common.events import Event, make_event
from engine.common.model_policy import ModelPolicy, policy_from_document, same_model
from engine.rollouts.groups import Group
from engine.rollouts.offers import (
    R_BANNED,
    R_DUPLICATE,
    R_FORGED_REWARD,
    R_IMPLAUSIBLE,
    R_MALFORMED,
    R_QUESTION,
    R_SIGNATURE,
    R_STALE,
    R_TOO_LONG,
    R_UNKNOWN_TASK,
    R_ZERO_ADVANTAGE,
    ExternalItem,
    ItemId,
    Offer,
)
from engine.swarm import protocol
from engine.swarm.client import LinkState, SwarmClient, duration_text
from engine.swarm.contribution import Contribution, receipt_verdicts
from engine.swarm.datacap import MB, DataMeter
from engine.swarm.defence import Ban, BanBook, ReplayMemory, SenderBaselines
from engine.swarm.identity import Identity, readable_name, verify_signed
from engine.swarm.receipts import NOT_PICKED, receipts_payload
from engine.swarm.results import ResultsLink

if TYPE_CHECKING:  # names in annotations only: the exchange never loads reasoning-gym; the taskset is the caller's
    from engine.questions.tasks import TaskSet

log = logging.getLogger(__name__)

# A batch older than this (by its signed timestamp) is not trained on.
MAX_BATCH_AGE_S = 3600.0
# (peer, seq) pairs remembered to drop batches seen before.
SEEN_BATCHES = 4096
# Reward claims within this of the local score count as honest (float formatting).
REWARD_TOLERANCE = 1e-6
# The peer named when a batch cannot even be decoded.
UNKNOWN_PEER = "unknown"
# Rejections that count towards a local ban: what a peer cannot send by accident. (A bad
# signature may be a lying relay's doing; a question mismatch, another reasoning-gym version.)
STRIKE_REASONS = (R_FORGED_REWARD, R_IMPLAUSIBLE)
# Batch-wide rejections a receipt names (a bad signature may be the relay's doing; a batch seen before was
# receipted the first time).
RECEIPTED_BATCH_REASONS = (R_BANNED, R_STALE)
# Where, in the data dir, the swarm's defence keeps its state.
BANS_FILE = "bans.json"
# Where, in the same folder, the node remembers which relay of its swarm last let it in.
RELAYS_FILE = "relays.json"


def peer_of(reference: str) -> str:
    """The peer id named by a `swarm.banned_peers` entry: a peer id as it is, a base64 key hashed."""
    if len(reference) == protocol.PEER_ID_HEX and all(c in "0123456789abcdef" for c in reference):
        return reference
    return protocol.peer_id(base64.b64decode(reference, validate=True))


def replay_file(state_dir: Path, run_name: str) -> Path:
    """The replay memory of one run: content keys of the external items it trained on."""
    return state_dir / f"trained-{run_name}.json"


def senders_file(state_dir: Path, run_name: str) -> Path:
    """The baselines of one run's senders of other models (their worst windows under its policy)."""
    return state_dir / f"senders-{run_name}.json"


MAX_PEERS_LISTED = 50  # peers listed one by one, the latest heard from (all: 64 kB a metrics line in the soak)


@dataclass
class PeerCounts:
    """Everything one peer sent this run, each item counted once."""

    name: str = ""
    accepted: int = 0
    rejected: int = 0
    not_picked: int = 0
    probation: int = 0  # of the accepted, those taken while the sender was on probation (another model's)
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, other: PeerCounts) -> None:
        self.accepted, self.rejected = self.accepted + other.accepted, self.rejected + other.rejected
        self.not_picked, self.probation = self.not_picked + other.not_picked, self.probation + other.probation
        self.reasons.update(other.reasons)

    def to_json(self, ban: Ban | None = None) -> dict[str, Any]:
        return {"name": self.name, "accepted": self.accepted, "rejected": self.rejected,
                "not_picked": self.not_picked, "probation": self.probation, "reasons": dict(self.reasons),
                "banned": ban.to_json() if ban is not None else None}


def verify_item(peer: str, item: protocol.Item, taskset: TaskSet, exclude: Set[str],
                model: str = "") -> ExternalItem | str:
    """Check one received item against this node's own tasks: the item, or the rejection reason.

    Pure: nothing is counted or remembered here. `exclude` holds the task keys
    this node already trains on this round; `model` is its batch's label.
    """
    try:
        question = taskset.rebuild_sent(item.task)
    except TaskError as exc:
        log.debug("peer %s sent an unusable task: %s", peer, exc)
        return R_UNKNOWN_TASK
    if question.text != item.question:
        return R_QUESTION
    if question.ref.key() in exclude:
        return R_DUPLICATE
    if any(len(text) > protocol.MAX_COMPLETION_CHARS for text in item.completions):
        return R_TOO_LONG
    rewards = tuple(taskset.reward(question, text) for text in item.completions)
    for claimed, local in zip(item.rewards, rewards, strict=True):
        if claimed is not None and abs(claimed - local) > REWARD_TOLERANCE:
            return R_FORGED_REWARD
    return ExternalItem(peer, question, tuple(item.completions), rewards, model)


class RolloutExchange(Protocol):
    """The training loop's whole view of the swarm: text out, verified text in (`SwarmExchange` below, and the
    experiment's `PublishFirst`). engine/node/loop.py imports it for its annotations only."""

    def set_model_label(self, label: str) -> None:
        """What this node's batches say it runs (NAME@sha256 of the weights), once the loop has loaded its model."""
        ...

    def publish(self, round_index: int, groups: Sequence[Group]) -> None: ...

    def sample(self, round_index: int, n: int, taskset: TaskSet, *, exclude: Set[str], seed: int) -> Offer:
        """Up to n external items, verified and re-scored by this node, none of them a question in `exclude`."""
        ...

    def settle(self, offer: Offer, verdicts: Mapping[int, str | None]) -> dict[str, Any]:
        """Count the offer with the loop's verdicts (index -> rejection reason); the round's swarm report."""
        ...

    def unban(self, peer: str) -> str:
        """Lift a local ban on `peer` (serve's `unban` command): "lifted", "not_banned" or "configured"."""
        ...

    def rewind(self, round_index: int) -> None:
        """The node carries on from its checkpoint of `round_index`: forget what rounds after it trained on."""
        ...

    def apply_settings(self, swarm: Any) -> None:
        """A settings reload: the swarm settings declared to apply live (a `SwarmConfig`, engine/common/config.py)."""
        ...


class SwarmExchange:
    def __init__(
        self,
        client: SwarmClient,
        identity: Identity,
        model_label: str,
        emit: Callable[[Event], None],
        relay_label: str,
        banned: Sequence[str] = (),
        bans: BanBook | None = None,
        replay: ReplayMemory | None = None,
        senders: SenderBaselines | None = None,
        swarm_name: str = "",
    ) -> None:
        self.client = client
        self.identity = identity
        self.model_label = model_label
        self.emit = emit
        self.relay_label = relay_label  # "embedded", or the relay address in use (it follows a failover)
        self.swarm_name = swarm_name  # the name its invite gives the swarm ("" when none)
        # Without a BanBook (tests, tools): config bans only, never an automatic one.
        self.bans = bans or BanBook(strikes=0, window=1, hours=0.0, strike_reasons=())
        self.bans.configured.update(banned)
        self.banned = self.bans.configured  # peer ids banned by configuration; add to ban one
        self.replay = replay
        self.senders = senders if senders is not None else SenderBaselines(None)  # of other models, when mixed
        self._warned_policy = ""
        self.peers: dict[str, PeerCounts] = {}  # MAX_PEERS_LISTED at most, the least recently heard from first
        self.others = PeerCounts(name="others")  # the counts of the peers no longer listed
        self.received = 0
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.contribution: Contribution | None = None  # this node's credit, from the relay (open_swarm sets it)
        self.results = ResultsLink(client, identity, emit)  # evaluation answers for the relay's table (results.py)
        self._announced: bool | None = None
        self.meter: DataMeter | None = None  # today's traffic and the daily caps (open_swarm sets it)
        self._capped = ""  # the sentence said when a daily cap was reached ("" while under the caps)

    # -- link state -------------------------------------------------------------------
    def announce(self, state: LinkState | None = None, message: str | None = None) -> None:
        """Emit a `swarm` event with this node's identity and link state (and `message`, when given)."""
        state = state or self.client.state
        if self.relay_label != "embedded" and state.url:
            self.relay_label = state.url  # the relay in use: with several, it changes on a failover
        if message is None:
            message = self._link_sentence(state)
        self._announced = state.connected
        self.emit(make_event(
            "swarm", peer_id=self.identity.peer_id, name=self.identity.name, relay=self.relay_label,
            connected=state.connected, message=message, online=state.online, since=state.since,
            lost_at=state.lost_at, swarm_name=self.swarm_name, relays=list(self.client.urls), relay_name=state.relay,
        ))

    def _link_sentence(self, state: LinkState) -> str:
        several = len(self.client.urls) > 1
        where = f" through {state.url}" if several and state.url else ""
        if state.connected:
            online = "1 peer" if state.online == 1 else f"{state.online} peers"
            if state.lost_at is not None:
                cut_off = duration_text(state.since - state.lost_at)
                return f"Back in the swarm{where} after {cut_off} cut off ({online} online, this node included)."
            return f"Connected to the swarm{where} ({online} online, this node included)."
        if state.lost_at is not None:
            then = f"; trying {state.url} next" if several and state.url else ""
            return (f"Cut off from the relay ({state.last_error}){then}; reconnecting by itself, and training on "
                    "local rollouts meanwhile.")
        if state.last_error:
            then = f"; trying {state.url} next" if several and state.url else ""
            return f"Relay unreachable ({state.last_error}){then}; training on local rollouts."
        return "Connecting to the relay; training on local rollouts until it answers."

    def _check_link(self) -> None:
        if self._announced != self.client.state.connected:
            self.announce()
        reason = self.meter.blocked_reason() if self.meter is not None else ""
        if reason != self._capped:  # a daily cap reached, or a new day: say so once, in the log and the swarm line
            self._capped = reason
            if reason:
                log.warning("%s", reason)
            else:
                log.info("Under today's data caps again: sharing resumes.")
            self.announce(message=reason or None)

    # -- the swarm's model policy -----------------------------------------------------
    def set_model_label(self, label: str) -> None:
        """What this node's batches say it runs (`engine.common.model_policy.model_label`), once its model is loaded."""
        self.model_label = label

    @property
    def models(self) -> ModelPolicy:
        """The swarm's model policy, as the relay's welcome declared it (not declared: this node's model)."""
        policy = policy_from_document(getattr(self.client.state, "models", None))
        if policy.kind == "single" and not same_model(policy.label, self.model_label) \
                and self._warned_policy != policy.label:
            self._warned_policy = policy.label
            log.warning("This swarm trains only %s and this node runs %s: the relay refuses its rollouts "
                        "(wrong_model); it still learns from the swarm's.", policy.label, self.model_label)
        return policy

    def foreign(self, model: str, policy: ModelPolicy) -> bool:
        """Whether an item labelled `model` is judged against its sender's past: only in a mixed swarm,
        and only when the label names another model than this node's (claiming ours gains nothing)."""
        return policy.mixed and not same_model(model, self.model_label)

    # -- publish ----------------------------------------------------------------------
    def publish(self, round_index: int, groups: Sequence[Group]) -> None:
        self._check_link()
        items: list[protocol.Item] = []
        for g in groups[: protocol.MAX_ITEMS_PER_BATCH]:
            pairs = [(c.text, r) for c, r in zip(g.completions, g.rewards, strict=True)
                     if len(c.text) <= protocol.MAX_COMPLETION_CHARS][: protocol.MAX_COMPLETIONS_PER_ITEM]
            if pairs and len(g.question.text) <= protocol.MAX_QUESTION_CHARS:
                items.append(protocol.Item(g.question.ref.to_json(), g.question.text,
                                           tuple(t for t, _ in pairs), tuple(r for _, r in pairs)))
        while items:
            try:
                payload = protocol.batch_payload(
                    self.identity.public_key, self.client.next_seq(), time.time(), self.model_label, items
                )
                break
            except protocol.ProtocolError as exc:
                if exc.code != protocol.E_TOO_LARGE:
                    log.warning("not publishing round %d: %s", round_index, exc)
                    return
                items.pop()  # too big for one frame: share fewer groups
        else:
            return
        if self.meter is not None and self.meter.upload_blocked():
            log.info("Round %d not shared: today's upload cap is reached.", round_index)
        elif not self.client.publish(payload):
            log.info("Round %d not shared: the relay is not connected.", round_index)

    # -- sample -----------------------------------------------------------------------
    def _peer(self, peer: str) -> PeerCounts:
        counts = self.peers.pop(peer, None)  # put back last: the most recently heard from
        if counts is None:
            counts = PeerCounts(name=peer[:8])
        self.peers[peer] = counts
        while len(self.peers) > MAX_PEERS_LISTED:  # the least recently heard from join `others`
            old = self.peers.pop(next(iter(self.peers)))
            self.others.add(old)
        return counts

    def sample(self, round_index: int, n: int, taskset: TaskSet, *, exclude: Set[str] = frozenset(),
               seed: int = 0) -> Offer:
        """Up to n verified external items, drawn uniformly (by `seed`) from what the relay sent."""
        self._check_link()
        offer = Offer(connected=self.client.state.connected, round_index=round_index)
        if n <= 0 or (self.meter is not None and self.meter.download_blocked()):
            return offer
        signed_batches = self.client.sample(min(protocol.MAX_SAMPLE_BATCHES, n))
        self._check_link()
        offer.connected = self.client.state.connected
        now = time.time()
        policy = self.models
        pending: list[tuple[str, str, protocol.Item, ItemId]] = []
        for signed in signed_batches:
            try:
                batch = protocol.decode_batch(signed.payload)
            except protocol.ProtocolError as exc:
                log.debug("malformed batch from the relay: %s", exc)
                offer.received += 1
                offer.rejected.append((UNKNOWN_PEER, R_MALFORMED))
                continue
            peer = batch.peer
            if peer == self.identity.peer_id:
                continue  # our own batch: the relay should not send it; not a peer's fault, not counted
            offer.received += len(batch.items)
            self._peer(peer).name = readable_name(batch.key)
            reason = self._batch_problem(signed, batch, now)
            if reason:
                offer.rejected.extend((peer, reason) for _ in batch.items)
                if reason in RECEIPTED_BATCH_REASONS:
                    offer.settled.extend(((peer, batch.seq, i), reason) for i in range(len(batch.items)))
                continue
            pending.extend((peer, batch.model, item, (peer, batch.seq, i)) for i, item in enumerate(batch.items))
        random.Random(seed).shuffle(pending)
        taken = set(exclude)
        for index, (peer, model, item, item_id) in enumerate(pending):
            if len(offer.items) >= n:
                offer.not_picked.extend(p for p, _, _, _ in pending[index:])
                offer.settled.extend((i, NOT_PICKED) for _, _, _, i in pending[index:])
                break
            verdict = verify_item(peer, item, taskset, taken, model)
            if not isinstance(verdict, str):
                offer.scored.append((sum(verdict.rewards) / len(verdict.rewards), verdict.informative))
                if not verdict.informative:
                    verdict = R_ZERO_ADVANTAGE
            if isinstance(verdict, str):
                offer.rejected.append((peer, verdict))
                offer.settled.append((item_id, verdict))
            elif self.replay is not None and verdict.content_key() in self.replay:
                offer.rejected.append((peer, R_DUPLICATE))  # trained on before, under another seq
                offer.settled.append((item_id, R_DUPLICATE))
            else:
                taken.add(verdict.question.ref.key())
                if self.foreign(model, policy):
                    offer.baselines[len(offer.items)] = self.senders.history(peer, model)
                offer.items.append(verdict)
                offer.item_ids.append(item_id)
        return offer

    def _batch_problem(self, signed: protocol.Signed, batch: protocol.Batch, now: float) -> str:
        """Why a whole batch is refused ("" when it is not): ban, signature, replay, age."""
        if self.bans.is_banned(batch.peer):
            return R_BANNED
        if not verify_signed(signed, batch.key):
            return R_SIGNATURE
        if (batch.peer, batch.seq) in self._seen:
            return R_DUPLICATE
        self._seen[(batch.peer, batch.seq)] = None
        if len(self._seen) > SEEN_BATCHES:
            self._seen.popitem(last=False)
        if now - batch.ts > MAX_BATCH_AGE_S or batch.ts - now > protocol.TIMESTAMP_WINDOW_S:
            return R_STALE
        return ""

    def settle(self, offer: Offer, verdicts: Mapping[int, str | None] | None = None) -> dict[str, Any]:
        """Count the round: `verdicts` maps an index into `offer.items` to the loop's rejection
        reason (None or absent: accepted). Returns the round's swarm report and emits `peers`."""
        verdicts = verdicts or {}
        rejected: Counter[str] = Counter()
        accepted = 0
        for peer, reason in offer.rejected:
            self._count_rejection(peer, reason, rejected)
            if reason != R_BANNED:
                self._judge(peer, reason)
        trained: list[str] = []
        learned: list[tuple[str, str, float]] = []  # accepted items of senders of other models: their baselines
        probation = 0
        for index, item in enumerate(offer.items):
            verdict = verdicts.get(index)
            if verdict:
                self._count_rejection(item.peer, verdict, rejected)
            else:
                self._peer(item.peer).accepted += 1
                accepted += 1
                trained.append(item.content_key())
                if index in offer.worst:
                    learned.append((item.peer, item.model, offer.worst[index]))
                if index in offer.probation:
                    self._peer(item.peer).probation += 1
                    probation += 1
            if index in offer.baselines and verdict == R_IMPLAUSIBLE:
                verdict = None  # another model's text, judged against its sender's past: never a strike
            self._judge(item.peer, verdict or None)
        if self.replay is not None and trained:
            self.replay.remember(trained, offer.round_index)
        if learned:
            self.senders.record(learned)
        for peer in offer.not_picked:
            self._peer(peer).not_picked += 1
        self.received += offer.received
        this_round = {
            "received": offer.received,
            "accepted": accepted,
            "rejected": dict(rejected),
            "not_picked": len(offer.not_picked),
            "probation": probation,
        }
        self._emit_peers(this_round)
        this_round["scored"] = [[round(mean, 4), informative] for mean, informative in offer.scored]
        self._receipts(offer, verdicts)
        return {
            **this_round,
            "connected": offer.connected,
            "online": self.client.state.online,
            "by_peer": self._by_peer(),
        }

    def _receipts(self, offer: Offer, verdicts: Mapping[int, str | None]) -> None:
        """Tell the relay what became of each item it handed this node, then ask for this node's own credit."""
        if self.contribution is not None:  # the numbers the relay sent since the last round
            self.contribution.update(self.client.state.credit, self.client.state.credit_at)
        self.results.check()  # the relay's score of the last evaluation answers: a `standing` event when new
        receipts = receipt_verdicts(offer, verdicts)
        if self.meter is not None and self.meter.upload_blocked():
            return  # past today's upload cap: nothing more goes out
        if (receipts
            and not self.client.send_receipts(receipts_payload(self.identity.public_key, time.time(), receipts))):
            log.info("Receipts for %d items not sent: the relay is not connected.", len(receipts))
        self.client.ask_stats()

    def _judge(self, peer: str, reason: str | None) -> None:
        ban = self.bans.judge(peer, reason)
        if ban is not None:
            until = "until lifted" if ban.until is None else f"for {(ban.until - ban.since) / 3600:g} h"
            log.warning("Banned peer %s (%s) %s: %d of its last %d items were rejected (mostly %s).",
                        self._peer(peer).name, peer, until, self.bans.strikes, self.bans.window, ban.reason)

    def apply_settings(self, swarm: Any) -> None:
        """A settings reload (`swarm`: a SwarmConfig): the ban rule (strikes, window, hours) and the daily caps
        change now; the plausibility settings are read each round. The link, banned_peers and persist_bans wait
        for a restart."""
        self.bans.strikes, self.bans.window, self.bans.hours = swarm.ban_strikes, swarm.ban_window, swarm.ban_hours
        if self.meter is not None:
            self.meter.set_caps(int(swarm.daily_upload_mb * MB), int(swarm.daily_download_mb * MB))

    def rewind(self, round_index: int) -> None:
        """The node carries on from its checkpoint of `round_index`: the items that rounds after it trained on (a
        round cut short, or one whose checkpoint was lost) were never learned, so they are not replays."""
        if self.replay is not None:
            self.replay.forget_after(round_index)

    def unban(self, peer: str) -> str:
        """Lift an earned ban on `peer`: "lifted", "not_banned" or "configured"; a `peers` event follows."""
        result = self.bans.lift(peer)
        if result == "lifted":
            log.info("Lifted the ban on peer %s.", peer)
        elif result == "configured":
            log.warning("Peer %s is banned by swarm.banned_peers; remove it there to lift the ban.", peer)
        else:
            log.info("Peer %s is not banned here; nothing to lift.", peer)
        self._emit_peers({"received": 0, "accepted": 0, "rejected": {}, "not_picked": 0, "probation": 0})
        return result

    def _by_peer(self) -> dict[str, Any]:
        return {pid: c.to_json(self.bans.ban_of(pid)) for pid, c in self.peers.items()}

    def _count_rejection(self, peer: str, reason: str, round_counts: Counter[str]) -> None:
        counts = self._peer(peer)
        counts.rejected += 1
        counts.reasons[reason] += 1
        round_counts[reason] += 1

    def _emit_peers(self, this_round: dict[str, Any]) -> None:
        every = [*self.peers.values(), self.others]  # totals for the run, listed or not
        rejected_by_reason: Counter[str] = Counter()
        for counts in every:
            rejected_by_reason.update(counts.reasons)
        self.emit(make_event(
            "peers",
            online=self.client.state.online,
            received=self.received,
            accepted=sum(c.accepted for c in every),
            rejected=sum(c.rejected for c in every),
            connected=self.client.state.connected,
            not_picked=sum(c.not_picked for c in every),
            probation=sum(c.probation for c in every),
            rejected_by_reason=dict(rejected_by_reason),
            by_peer=self._by_peer(),
            banned={pid: {**ban.to_json(), "name": self.peers[pid].name if pid in self.peers else pid[:8]}
                    for pid, ban in self.bans.banned().items()},
            this_round=this_round,
            **({"data_today": self.meter.to_json()} if self.meter is not None else {}),
        ))

    def close(self) -> None:
        self.client.close()
        if self.meter is not None:
            self.meter.flush()
