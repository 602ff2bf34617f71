"""SAPO's mix on loopback: three nodes (two architectures) and a relay; every forgery is caught."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.harness.servers import free_port
from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.events import Event
from engine.common.paths import Paths
from engine.node.loop import Node
from engine.relay.embedded import EmbeddedRelay, start_embedded_relay
from engine.relay.settings import RelaySettings
from engine.swarm import protocol as p
from engine.swarm.client import LinkState
from engine.swarm.defence import ReplayMemory
from engine.swarm.exchange import (
    R_DUPLICATE,
    R_FORGED_REWARD,
    R_QUESTION,
    R_SIGNATURE,
    R_TOO_LONG,
    R_UNKNOWN_TASK,
    SwarmExchange,
)
from engine.swarm.identity import Identity
from engine.swarm.session import open_swarm
from tests.swarm.conftest import StartRelay

FAST = [
    "tasks.questions_per_round=2",
    "tasks.completions_per_question=4",
    "tasks.max_new_tokens=10",
    "tasks.eval_every=0",
    "grpo.micro_batch=8",
    "run.device='cpu'",
    "swarm.local_groups=2",
    "swarm.external_groups=2",
    # Off: a tiny random model's text, re-read by another node's tokenizer, has no length worth judging; the
    # length check's own tests set it (tests/swarm/test_length_check.py, test_length_defence.py).
    "swarm.length_ratio=0",
]


def parity_reward(question: Any, completion: str) -> float:
    """A verifier a random model can satisfy half the time, so groups carry a gradient."""
    return float(len(completion) % 2)


def config(model_dir: Path, *extra: str) -> NodeConfig:
    return build_config("default", None, [*FAST, f"model.source='{model_dir}'", *extra])


def relay_node(model_dir: Path, home: Path, url: str, *extra: str,
               events: list[Event] | None = None) -> tuple[Node, Any]:
    """A tiny node on the relay at `url` with its own data dir under `home` (and `extra` settings), set up; its
    swarm session. The parity reward gives mixed groups."""
    cfg = config(model_dir, "swarm.mode='relay'", f"swarm.relay_url='{url}'", *extra)
    paths = Paths.under(home)
    said: list[Event] = [] if events is None else events
    session = open_swarm(cfg, paths.identity_file, said.append)
    node = Node(cfg, paths, said.append, exchange=session.exchange)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    return node, session


def swarm_node(model_dir: Path, home: Path, url: str, seed: int, events: list[Event]) -> tuple[Node, Any]:
    return relay_node(model_dir, home, url, f"run.seed={seed}", events=events)


def trainable(node: Node) -> dict[str, torch.Tensor]:
    assert node.backend is not None
    return {k: v.clone() for k, v in node.backend._trainable_state().items()}  # type: ignore[attr-defined]


@pytest.mark.integration
def test_three_nodes_two_architectures_share_and_train_on_external_items(
    tiny_model_dir: Path, tiny_qwen_dir: Path, tmp_path: Path, start_relay: StartRelay
) -> None:
    relay = start_relay()
    events: dict[str, list[Event]] = {"a": [], "b": [], "c": []}
    nodes = {
        "a": swarm_node(tiny_model_dir, tmp_path / "a", relay.url, 1, events["a"]),
        "b": swarm_node(tiny_qwen_dir, tmp_path / "b", relay.url, 2, events["b"]),
        "c": swarm_node(tiny_model_dir, tmp_path / "c", relay.url, 3, events["c"]),
    }
    try:
        for _name, (_node, session) in nodes.items():
            assert session.exchange.client.wait_connected(10)
        before = trainable(nodes["b"][0])
        metrics: dict[str, list[dict[str, Any]]] = {k: [] for k in nodes}
        for _ in range(3):
            for name, (node, _session) in nodes.items():
                metrics[name].append(node.run_round())
        assert any(not torch.equal(before[k], v) for k, v in trainable(nodes["b"][0]).items())
        for name in nodes:
            external = sum(m["external_groups"] for m in metrics[name])
            assert external > 0, (name, [m["swarm"] for m in metrics[name]])
            assert all(m["swarm"]["connected"] for m in metrics[name])
        # the qwen node learned from llama nodes' text, and knows who sent what
        by_peer = metrics["b"][-1]["swarm"]["by_peer"]
        ids = {n: s.exchange.identity.peer_id for n, (_node, s) in nodes.items()}
        assert set(by_peer) <= {ids["a"], ids["c"]} and sum(v["accepted"] for v in by_peer.values()) > 0
        assert any(m["swarm_reward_mean"] is not None for m in metrics["b"])
        peers_events = [e for e in events["b"] if e["type"] == "peers"]
        assert peers_events and peers_events[-1]["accepted"] > 0
        swarm_events = [e for e in events["b"] if e["type"] == "swarm"]
        assert swarm_events[-1]["connected"] is True
        assert swarm_events[-1]["name"] == nodes["b"][1].exchange.identity.name
    finally:
        for _node, session in nodes.values():
            session.close()


# -- the receiver's checks, fed directly -------------------------------------------------------
class RelayDouble:
    """Stands in for the transport only: hands the exchange whatever batches a test (or a bad relay) sends."""

    def __init__(self) -> None:
        self.state = LinkState(connected=True, online=3)
        self.urls = ["ws://relay.test/ws"]  # a SwarmClient's swarm: its relays, in the order it tries them
        self.batches: list[p.Signed] = []
        self.published: list[str] = []
        self.receipts: list[str] = []  # receipts payloads, one per settled round (engine/swarm/contribution.py)

    def sample(self, n: int, timeout: float = 10.0) -> list[p.Signed]:
        return self.batches[:n]

    def publish(self, payload: str) -> bool:
        self.published.append(payload)
        return True

    def next_seq(self) -> int:
        return int(time.time() * 1000)

    def send_receipts(self, payload: str) -> bool:
        self.receipts.append(payload)
        return True

    def ask_stats(self) -> bool:
        return True

    def close(self) -> None:
        return None


@pytest.fixture
def receiver(tiny_model_dir: Path, tmp_path: Path) -> tuple[Node, SwarmExchange, RelayDouble, list[Event]]:
    events: list[Event] = []
    relay = RelayDouble()
    exchange = SwarmExchange(relay, Identity.generate(), "tiny", events.append, "test")  # type: ignore[arg-type]
    node = Node(config(tiny_model_dir), Paths.under(tmp_path / "r"), events.append, exchange=exchange)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    return node, exchange, relay, events


def honest_batch(node: Node, sender: Identity, *, seq: int = 1, completions: tuple[str, ...] = ("ab", "abc"),
                 question: str | None = None, rewards: tuple[float | None, ...] | None = None,
                 task: dict[str, Any] | None = None, index: int = 7) -> p.Signed:
    q = node.taskset.draw(50 + index, 1)[0]
    item = p.Item(task or q.ref.to_json(), question if question is not None else q.text, completions,
                  rewards if rewards is not None else tuple(parity_reward(q, c) for c in completions))
    return sender.signed(p.batch_payload(sender.public_key, seq, time.time(), "peer-model", [item]))


def sample(node: Node, exchange: SwarmExchange) -> list[Any]:
    assert node.backend is not None and node.exchange is exchange
    return node.share_and_sample(1, [])[0]


def test_an_honest_item_is_rescored_retokenised_and_given_local_logprobs(receiver: Any) -> None:
    node, exchange, relay, _events = receiver
    sender = Identity.generate()
    relay.batches = [honest_batch(node, sender)]
    groups = sample(node, exchange)
    assert len(groups) == 1
    g = groups[0]
    assert g.source == sender.peer_id and g.rewards == [0.0, 1.0] and g.informative
    assert [c.token_ids for c in g.completions] == [node.backend.encode_completion(t) for t in ("ab", "abc")]
    assert all(len(c.logprobs) == len(c.token_ids) for c in g.completions)
    assert exchange.peers[sender.peer_id].accepted == 1


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        ({"rewards": (1.0, 1.0)}, R_FORGED_REWARD),
        ({"question": "What is 2 + 2? Answer: 5"}, R_QUESTION),
        ({"task": {"dataset": "no_such_dataset", "config": {}, "seed": 0, "index": 0}}, R_UNKNOWN_TASK),
        ({"completions": ("x" * 200, "y" * 201)}, R_TOO_LONG),
    ],
)
def test_forged_items_are_rejected_with_their_reason(receiver: Any, forge: dict[str, Any], reason: str) -> None:
    node, exchange, relay, events = receiver
    sender = Identity.generate()
    relay.batches = [honest_batch(node, sender, **forge)]
    assert sample(node, exchange) == []
    counts = exchange.peers[sender.peer_id]
    assert counts.rejected == 1 and counts.reasons[reason] == 1
    peers = [e for e in events if e["type"] == "peers"][-1]
    assert peers["rejected_by_reason"] == {reason: 1}
    assert peers["by_peer"][sender.peer_id]["reasons"] == {reason: 1}


def test_a_bad_signature_from_a_lying_relay_is_rejected(receiver: Any) -> None:
    node, exchange, relay, _events = receiver
    sender, impostor = Identity.generate(), Identity.generate()
    good = honest_batch(node, sender)
    tampered = p.Signed(good.payload.replace('"peer-model"', '"peer-modem"'), good.sig)
    forged_by_other = p.Signed(good.payload, impostor.sign(good.payload.encode()))
    relay.batches = [tampered, forged_by_other]
    assert sample(node, exchange) == []
    assert exchange.peers[sender.peer_id].reasons[R_SIGNATURE] == 2


def test_replayed_batches_and_repeated_questions_are_dropped(receiver: Any) -> None:
    node, exchange, relay, _events = receiver
    sender = Identity.generate()
    batch = honest_batch(node, sender, seq=5)
    relay.batches = [batch]
    assert len(sample(node, exchange)) == 1
    assert sample(node, exchange) == []  # the same (peer, seq) again
    assert exchange.peers[sender.peer_id].reasons[R_DUPLICATE] == 1
    other = Identity.generate()
    relay.batches = [honest_batch(node, sender, seq=6), honest_batch(node, other, seq=1)]  # same question twice
    assert len(sample(node, exchange)) == 1
    total_dupes = sum(exchange.peers[peer.peer_id].reasons[R_DUPLICATE] for peer in (sender, other))
    assert total_dupes == 2


def test_re_asked_questions_are_shared_and_taken_again_but_not_the_same_text(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    """tasks.reask_share: a node publishes its re-asks like any group (its own never pass its peer checks), and a
    peer that trained on the first ask takes the re-ask (new completions); the first ask's text again is refused."""
    relay = RelayDouble()
    events: list[Event] = []
    exchange = SwarmExchange(relay, Identity.generate(), "tiny", events.append, "test",  # type: ignore[arg-type]
                             replay=ReplayMemory(None, 100))
    node = Node(config(tiny_model_dir, "tasks.reask_share=0.5"), Paths.under(tmp_path / "r"), events.append,
                exchange=exchange)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    node.run_round()
    first = json.loads(relay.published[-1])["items"]
    taught = [item["task"] for item in first if len(set(item["rewards"])) > 1]
    metrics = node.run_round()
    assert taught and metrics["reasked"] == 1 and metrics["swarm"]["rejected"] == {}
    again = json.loads(relay.published[-1])["items"]
    assert again[0]["task"] == taught[0] and again[0]["completions"] != first[[i["task"] for i in first].index(
        taught[0])]["completions"]

    sender = Identity.generate()
    relay.batches = [honest_batch(node, sender, seq=1)]
    assert len(sample(node, exchange)) == 1  # trained on: remembered
    relay.batches = [honest_batch(node, sender, seq=2, completions=("abcd", "abc"))]  # the peer re-asked it
    assert len(sample(node, exchange)) == 1
    relay.batches = [honest_batch(node, sender, seq=3)]  # the first ask's text under a new sequence number
    assert sample(node, exchange) == [] and exchange.peers[sender.peer_id].reasons[R_DUPLICATE] == 1


def test_publish_shares_text_only_and_respects_limits(receiver: Any) -> None:
    node, _exchange, relay, _events = receiver
    node.run_round()
    payload = json.loads(relay.published[-1])
    assert payload["kind"] == "batch" and len(payload["items"]) == 2
    first = payload["items"][0]
    assert set(first) == {"task", "question", "completions", "rewards"}
    assert all(isinstance(c, str) for c in first["completions"])


@pytest.mark.integration
def test_relay_restart_mid_run_solo_fallback_then_rejoin(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = RelaySettings(host="127.0.0.1", port=0)
    relay = EmbeddedRelay(settings)
    relay.start()
    port = relay.port
    events: list[Event] = []
    node, session = swarm_node(tiny_model_dir, tmp_path / "n", relay.url, 1, events)
    try:
        assert session.exchange.client.wait_connected(10)
        assert node.run_round()["swarm"]["connected"]
        relay.stop()
        deadline = time.monotonic() + 10
        while session.exchange.client.state.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        solo = node.run_round()  # the relay is gone: the node keeps training on its own rollouts
        assert solo["swarm"]["connected"] is False and solo["external_groups"] == 0 and solo["round"] == 2
        down = [e for e in events if e["type"] == "swarm" and not e["connected"]]
        assert down and "local rollouts" in down[-1]["message"]
        again = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=port))
        again.start()
        try:
            assert session.exchange.client.wait_connected(40)
            back = node.run_round()
            assert back["swarm"]["connected"] is True
            assert again.relay.metrics["publishes"] == 1
        finally:
            again.stop()
    finally:
        session.close()


@pytest.mark.integration
def test_a_second_local_node_joins_the_first_ones_embedded_relay(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    sessions = []
    try:
        for name in ("first", "second"):
            cfg = config(tiny_model_dir, f"swarm.embedded_port={port}")
            sessions.append(open_swarm(cfg, Paths.under(tmp_path / name).identity_file, lambda e: None,
                                       host_relay=start_embedded_relay))
        assert sessions[0].relay.hosting and not sessions[1].relay.hosting
        assert all(s.exchange.client.wait_connected(10) for s in sessions)
        assert sessions[1].exchange.relay_label == f"ws://127.0.0.1:{port}/ws"
    finally:
        for s in reversed(sessions):
            s.close()


def test_every_item_is_counted_once_accepted_rejected_or_not_picked(receiver: Any) -> None:
    node, exchange, relay, events = receiver
    sender = Identity.generate()
    # four usable items (different questions) and one forgery, in one batch; J = 2
    items = []
    for index in range(4):
        q = node.taskset.draw(90 + index, 1)[0]
        items.append(p.Item(q.ref.to_json(), q.text, ("ab", "abc"), (0.0, 1.0)))
    q = node.taskset.draw(99, 1)[0]
    items.append(p.Item(q.ref.to_json(), q.text, ("ab", "abc"), (1.0, 1.0)))
    relay.batches = [sender.signed(p.batch_payload(sender.public_key, 1, time.time(), "m", items))]
    external, report = node.share_and_sample(1, [])
    assert len(external) == 2
    assert report["received"] == 5
    assert report["accepted"] + sum(report["rejected"].values()) + report["not_picked"] == 5
    counts = exchange.peers[sender.peer_id]
    assert counts.accepted + counts.rejected + counts.not_picked == 5
    peers = [e for e in events if e["type"] == "peers"][-1]
    assert peers["received"] == 5 and peers["this_round"]["received"] == 5


@pytest.mark.parametrize("why", ["zero_advantage", "stale", "malformed", "banned"])
def test_the_other_rejection_reasons(receiver: Any, why: str) -> None:
    node, exchange, relay, _events = receiver
    sender = Identity.generate()
    if why == "zero_advantage":
        relay.batches = [honest_batch(node, sender, completions=("ab", "cd"))]  # both even: equal rewards
    elif why == "stale":
        q = node.taskset.draw(57, 1)[0]
        item = p.Item(q.ref.to_json(), q.text, ("ab", "abc"), (0.0, 1.0))
        old = time.time() - 2 * 3600  # signed two hours ago: older than MAX_BATCH_AGE_S
        relay.batches = [sender.signed(p.batch_payload(sender.public_key, 1, old, "m", [item]))]
    elif why == "malformed":
        relay.batches = [p.Signed('{"not": "a batch"}', sender.sign(b'{"not": "a batch"}'))]
    else:
        exchange.banned.add(sender.peer_id)
        relay.batches = [honest_batch(node, sender)]
    external, report = node.share_and_sample(1, [])
    assert external == [] and report["rejected"] == {why: 1} and report["accepted"] == 0


def test_a_node_trains_on_i_of_its_own_groups_and_j_external(tiny_model_dir: Path, tmp_path: Path) -> None:
    relay = RelayDouble()
    events: list[Event] = []
    exchange = SwarmExchange(relay, Identity.generate(), "tiny", events.append, "test")  # type: ignore[arg-type]
    cfg = config(tiny_model_dir, "tasks.questions_per_round=4", "swarm.local_groups=1", "swarm.external_groups=1")
    node = Node(cfg, Paths.under(tmp_path / "i"), events.append, exchange=exchange)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    sender = Identity.generate()
    relay.batches = [honest_batch(node, sender)]
    trained_prompts: set[tuple[int, ...]] = set()
    assert node.backend is not None
    real_train = node.backend.train

    def counting_train(items: Any, on_step: Any = None) -> dict[str, float]:
        trained_prompts.update(tuple(it.prompt_ids) for it in items)
        return real_train(items, on_step)

    node.backend.train = counting_train  # type: ignore[method-assign]
    metrics = node.run_round()
    assert metrics["local_groups"] == 4 and metrics["external_groups"] == 1
    published = json.loads(relay.published[-1])
    assert len(published["items"]) == 4  # all four are shared ...
    # ... but only I = 1 of them plus the external group is trained on
    external_prompt = tuple(node.backend.encode_prompt(node.taskset.messages(node.taskset.draw(57, 1)[0])))
    assert external_prompt in trained_prompts
    assert len(trained_prompts - {external_prompt}) == 1


@pytest.mark.integration
def test_when_the_hosting_node_stops_another_local_node_takes_the_relay_over(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    import threading

    port = free_port()
    took_over = threading.Event()
    said: list[str] = []

    def second_events(event: Event) -> None:
        if event["type"] == "swarm":
            said.append(event["message"])
            if "now hosts it" in event["message"]:
                took_over.set()

    cfg = config(tiny_model_dir, f"swarm.embedded_port={port}")
    first = open_swarm(cfg, Paths.under(tmp_path / "first").identity_file, lambda e: None,
                       host_relay=start_embedded_relay)
    second = open_swarm(cfg, Paths.under(tmp_path / "second").identity_file, second_events,
                        host_relay=start_embedded_relay)
    try:
        assert first.relay.hosting and not second.relay.hosting
        assert second.exchange.client.wait_connected(10)
        first.close()
        assert took_over.wait(20), said
        assert second.relay.hosting and second.exchange.relay_label == "embedded"
        assert second.exchange.client.wait_connected(10)
    finally:
        second.close()


@pytest.mark.parametrize("informative_first", [False, True])
def test_the_i_own_groups_are_random_or_informative_first(tiny_model_dir: Path, tmp_path: Path,
                                                          informative_first: bool) -> None:
    from engine.rollouts.groups import Group

    cfg = config(tiny_model_dir, "tasks.questions_per_round=8", "swarm.local_groups=3",
                 f"swarm.local_informative_first={'true' if informative_first else 'false'}")
    node = Node(cfg, Paths.under(tmp_path / "n"), lambda event: None)
    questions = node.taskset.draw(1, 8)
    # Groups 2 and 6 are the round's only ones trained on (grpo.train_on: an answer passed); 0, 1 and 3 differ by
    # partial credit alone, so they teach nothing that is trained and come after them.
    groups = [Group(q, [i], [], [0.0, 1.0] if i in (2, 6) else [0.0, 0.1] if i in (0, 1, 3) else [0.0, 0.0],
                    [-1.0, 1.0] if i in (0, 1, 2, 3, 6) else [0.0, 0.0]) for i, q in enumerate(questions)]
    picks = [[groups.index(g) for g in node.own_groups(r, groups)] for r in range(1, 41)]
    assert all(len(p) == 3 and p == sorted(p) for p in picks)
    assert node.own_groups(7, groups) == node.own_groups(7, groups)  # a function of the seed and round
    with_both = sum(1 for p in picks if {2, 6} <= set(p))
    if informative_first:
        assert with_both == 40  # and the third slot is random among the rest
        assert len({p[0] if p[0] not in (2, 6) else p[1] if p[1] not in (2, 6) else p[2] for p in picks}) > 3
    else:
        assert with_both < 20  # by chance in 3 of 28 draws of 3 from 8
