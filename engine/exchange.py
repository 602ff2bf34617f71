"""The SAPO mix: what the round loop shares with the swarm and what it takes back.

`SwarmExchange` is the `RolloutExchange` the node uses when a relay is
configured. Publishing turns this round's groups into a signed batch of
text. Sampling pulls batches from other peers and trusts nothing in them:

1. the signature is checked over the exact payload bytes;
2. the task reference is rebuilt here and the question text must match;
3. every completion is re-scored with this node's verifier (a sender whose
   claimed rewards differ is rejected as a forger);
4. completions over this node's length cap, duplicates, stale batches and
   zero-advantage groups are dropped;
5. the survivors are sampled uniformly, re-tokenised with this node's
   tokenizer, and given behaviour log-probs under this node's policy.

Every rejection is counted per peer, with its reason, for the round event
and the app's peers panel.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.backends import PolicyBackend
from engine.config import NodeConfig
from engine.errors import TaskError
from engine.events import Event, make_event
from engine.rollouts import Completion, Group, group_advantages
from engine.swarm import protocol
from engine.swarm.client import LinkState, SwarmClient
from engine.swarm.identity import Identity, readable_name, verify_signed
from engine.tasks import Question, TaskRef, TaskSet

log = logging.getLogger(__name__)

# A batch older than this (by its signed timestamp) is not trained on.
MAX_BATCH_AGE_S = 3600.0
# (peer, seq) pairs remembered to drop batches seen before.
SEEN_BATCHES = 4096
# Reasons an external group is not used (also the keys of `rejected_by_reason`).
R_MALFORMED = "malformed"
R_SIGNATURE = "bad_signature"
R_STALE = "stale"
R_UNKNOWN_TASK = "unknown_task"
R_QUESTION = "question_mismatch"
R_FORGED_REWARD = "forged_reward"
R_TOO_LONG = "too_long"
R_DUPLICATE = "duplicate"
R_ZERO_ADVANTAGE = "zero_advantage"
R_BANNED = "banned"
R_OWN = "own_batch"
REASONS = (R_MALFORMED, R_SIGNATURE, R_STALE, R_UNKNOWN_TASK, R_QUESTION, R_FORGED_REWARD, R_TOO_LONG,
           R_DUPLICATE, R_ZERO_ADVANTAGE, R_BANNED, R_OWN)
# Another model's tokenizer splits the same text differently: an external completion may
# take up to this many times this node's own length cap, in this node's tokens.
EXTERNAL_LENGTH_SLACK = 2
# Reward claims within this of the local score count as honest (float formatting).
REWARD_TOLERANCE = 1e-6


@dataclass
class PeerCounts:
    name: str = ""
    accepted: int = 0
    rejected: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass
class _Candidate:
    peer: str
    question: Question
    texts: list[str]
    token_ids: list[list[int]]
    rewards: list[float]
    advantages: list[float]


class SwarmExchange:
    def __init__(
        self,
        client: SwarmClient,
        identity: Identity,
        model_label: str,
        emit: Callable[[Event], None],
        relay_label: str,
        banned: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.identity = identity
        self.model_label = model_label
        self.emit = emit
        self.relay_label = relay_label
        self.banned = set(banned)
        self.peers: dict[str, PeerCounts] = {}
        self.received = 0
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.last_report: dict[str, Any] = {}
        self._announced: bool | None = None

    # -- link state -------------------------------------------------------------------
    def announce(self, state: LinkState | None = None) -> None:
        """Emit a `swarm` event with this node's identity and link state."""
        state = state or self.client.state
        if state.connected:
            online = "1 peer" if state.online == 1 else f"{state.online} peers"
            message = f"Connected to the swarm ({online} online, this node included)."
        elif state.last_error:
            message = f"Relay unreachable ({state.last_error}); training on local rollouts."
        else:
            message = "Connecting to the relay; training on local rollouts until it answers."
        self._announced = state.connected
        self.emit(make_event(
            "swarm", peer_id=self.identity.peer_id, name=self.identity.name, relay=self.relay_label,
            connected=state.connected, message=message, online=state.online, since=state.since,
        ))

    def _check_link(self) -> None:
        if self._announced != self.client.state.connected:
            self.announce()

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
        if not self.client.publish(payload):
            log.info("Round %d not shared: the relay is not connected.", round_index)

    # -- sample -----------------------------------------------------------------------
    def _peer(self, peer: str) -> PeerCounts:
        counts = self.peers.get(peer)
        if counts is None:
            counts = self.peers[peer] = PeerCounts(name=peer[:8])
        return counts

    def _reject(self, peer: str, reason: str, round_counts: Counter[str], n: int = 1) -> None:
        counts = self._peer(peer)
        counts.rejected += n
        counts.reasons[reason] += n
        round_counts[reason] += n

    def sample(self, round_index: int, n: int, taskset: TaskSet, backend: PolicyBackend, config: NodeConfig,
               local: Sequence[Group] = ()) -> list[Group]:
        """Up to n external groups, every one verified and re-scored here."""
        self._check_link()
        self.last_report = {"received": 0, "accepted": 0, "rejected": {}, "connected": self.client.state.connected}
        if n <= 0:
            return []
        signed_batches = self.client.sample(min(protocol.MAX_SAMPLE_BATCHES, n))
        self._check_link()
        round_rejects: Counter[str] = Counter()
        seen_keys = {g.question.ref.key() for g in local}
        candidates: list[_Candidate] = []
        received = 0
        now = time.time()
        for signed in signed_batches:
            try:
                batch = protocol.decode_batch(signed.payload)
            except protocol.ProtocolError as exc:
                log.debug("malformed batch from the relay: %s", exc)
                self._reject("unknown", R_MALFORMED, round_rejects)
                continue
            peer = batch.peer
            received += len(batch.items)
            if peer == self.identity.peer_id:
                continue  # our own batch: the relay should not send it; not a peer's fault
            self._peer(peer).name = readable_name(batch.key)
            if peer in self.banned:
                self._reject(peer, R_BANNED, round_rejects, len(batch.items))
                continue
            if not verify_signed(signed, batch.key):
                self._reject(peer, R_SIGNATURE, round_rejects, len(batch.items))
                continue
            if (peer, batch.seq) in self._seen:
                self._reject(peer, R_DUPLICATE, round_rejects, len(batch.items))
                continue
            self._seen[(peer, batch.seq)] = None
            if len(self._seen) > SEEN_BATCHES:
                self._seen.popitem(last=False)
            if now - batch.ts > MAX_BATCH_AGE_S or batch.ts - now > protocol.TIMESTAMP_WINDOW_S:
                self._reject(peer, R_STALE, round_rejects, len(batch.items))
                continue
            for item in batch.items:
                candidate, reason = self._verify_item(peer, item, taskset, backend, config, seen_keys)
                if candidate is None:
                    self._reject(peer, reason, round_rejects)
                else:
                    candidates.append(candidate)
        rng = random.Random(f"{config.run.seed}:{round_index}:external")
        chosen = rng.sample(candidates, min(n, len(candidates)))
        groups = [self._to_group(c, taskset, backend, config) for c in chosen]
        for g in groups:
            self._peer(g.source).accepted += 1
        self.received += received
        self.last_report = {
            "received": received,
            "accepted": len(groups),
            "rejected": dict(round_rejects),
            "connected": self.client.state.connected,
        }
        self._emit_peers()
        return groups

    def _verify_item(
        self, peer: str, item: protocol.Item, taskset: TaskSet, backend: PolicyBackend, config: NodeConfig,
        seen_keys: set[str],
    ) -> tuple[_Candidate | None, str]:
        try:
            ref = TaskRef.from_json(item.task)
            question = taskset.rebuild(ref)
        except TaskError as exc:
            log.debug("peer %s sent an unusable task: %s", peer, exc)
            return None, R_UNKNOWN_TASK
        if question.text != item.question:
            return None, R_QUESTION
        key = ref.key()
        if key in seen_keys:
            return None, R_DUPLICATE
        cap = EXTERNAL_LENGTH_SLACK * config.tasks.max_new_tokens
        token_ids: list[list[int]] = []
        for text in item.completions:
            if len(text) > protocol.MAX_COMPLETION_CHARS:
                return None, R_TOO_LONG
            ids = backend.encode_completion(text)
            if len(ids) > cap + 1:  # + the EOS the encoder appends
                return None, R_TOO_LONG
            token_ids.append(ids)
        rewards = [taskset.reward(question, text) for text in item.completions]
        for claimed, local in zip(item.rewards, rewards, strict=True):
            if claimed is not None and abs(claimed - local) > REWARD_TOLERANCE:
                return None, R_FORGED_REWARD
        advantages = group_advantages(rewards, config.grpo.adv_eps)
        if not any(advantages):
            return None, R_ZERO_ADVANTAGE
        seen_keys.add(key)
        return _Candidate(peer, question, list(item.completions), token_ids, rewards, advantages), ""

    def _to_group(self, c: _Candidate, taskset: TaskSet, backend: PolicyBackend, config: NodeConfig) -> Group:
        prompt = backend.encode_prompt(taskset.messages(c.question))
        logprobs = backend.behaviour_logprobs([(prompt, ids) for ids in c.token_ids], config.tasks.temperature)
        completions = [Completion(text, ids, lp, finished=True)
                       for text, ids, lp in zip(c.texts, c.token_ids, logprobs, strict=True)]
        return Group(c.question, prompt, completions, c.rewards, c.advantages, source=c.peer)

    def _emit_peers(self) -> None:
        rejected_by_reason: Counter[str] = Counter()
        for counts in self.peers.values():
            rejected_by_reason.update(counts.reasons)
        self.emit(make_event(
            "peers",
            online=self.client.state.online,
            received=self.received,
            accepted=sum(c.accepted for c in self.peers.values()),
            rejected=sum(c.rejected for c in self.peers.values()),
            rejected_by_reason=dict(rejected_by_reason),
            by_peer={pid: {"name": c.name, "accepted": c.accepted, "rejected": c.rejected, "reasons": dict(c.reasons)}
                     for pid, c in self.peers.items()},
        ))

    def report(self) -> dict[str, Any]:
        """This round's swarm figures for the round metrics."""
        by_peer = {pid: {"name": c.name, "accepted": c.accepted, "rejected": c.rejected, "reasons": dict(c.reasons)}
                   for pid, c in self.peers.items()}
        return {**self.last_report, "online": self.client.state.online, "by_peer": by_peer}

    def close(self) -> None:
        self.client.close()


# -- opening the swarm link ---------------------------------------------------------------------
def split_invite(url: str) -> tuple[str, str]:
    """An invite is the relay URL with ``?token=...``: returns (URL without it, token)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url.strip())
    query = parse_qsl(parts.query, keep_blank_values=True)
    token = next((v for k, v in query if k == "token"), "")
    rest = urlencode([(k, v) for k, v in query if k != "token"])
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/ws", rest, "")), token


def check_relay_url(url: str) -> str:
    from urllib.parse import urlsplit

    from engine.errors import ConfigError

    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ConfigError(
            f"swarm.relay_url must look like ws://host:port/ws or wss://host/ws (or an invite with ?token=), got {url!r}."
        )
    return url


class SwarmSession:
    """Identity, optional embedded relay, client and exchange for one node run."""

    def __init__(self, exchange: SwarmExchange | None, relay: Any = None) -> None:
        self.exchange = exchange
        self.relay = relay

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()
        if self.relay is not None:
            self.relay.stop()


def open_swarm(config: NodeConfig, identity_file: Any, emit: Callable[[Event], None]) -> SwarmSession:
    """Start what `swarm.mode` asks for. Solo (or J = 0) gives a session without exchange."""
    from engine.swarm.relay import EmbeddedRelay, RelaySettings

    sw = config.swarm
    identity = Identity.load_or_create(identity_file)
    if sw.mode == "solo" or sw.external_groups == 0:
        emit(make_event("swarm", peer_id=identity.peer_id, name=identity.name, relay=None, connected=False,
                        message="Solo: not sharing rollouts (swarm.mode = solo or external_groups = 0)."))
        return SwarmSession(None)
    relay = None
    token = sw.join_token
    if sw.mode == "relay":
        url, invite_token = split_invite(sw.relay_url)
        url = check_relay_url(url)
        token = token or invite_token
        label = url
    else:
        embedded = EmbeddedRelay(RelaySettings(host=sw.embedded_host, port=sw.embedded_port))
        try:
            url = embedded.start()
            relay = embedded
            label = "embedded"
            log.info("Embedded relay listening on %s; other nodes on this computer can join it.", url)
        except OSError:
            # Another local node already runs the embedded relay on this port: join it.
            url = f"ws://{sw.embedded_host}:{sw.embedded_port}/ws"
            label = url
            log.info("Port %d is taken: joining the relay there as a client.", sw.embedded_port)
    exchange_ref: list[SwarmExchange] = []

    def on_change(state: LinkState) -> None:
        if exchange_ref:
            exchange_ref[0].announce(state)

    client = SwarmClient(url, identity, token=token, on_change=on_change)
    exchange = SwarmExchange(client, identity, config.model.source, emit, label)
    exchange_ref.append(exchange)
    exchange.announce()
    client.start()
    client.wait_connected(3.0)
    return SwarmSession(exchange, relay)
