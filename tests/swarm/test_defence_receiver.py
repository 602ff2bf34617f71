"""The defence against correct but malicious swarm text, at a receiver (engine/swarm/defence.py, issues 13 and 29).

A receiver built on a tiny model taught the answer format (so that its own
text is probable and injected text is not), fed directly and through a real
relay on loopback. In a swarm of different models (issue 29) a stranger's odd
text is kept, an injection into a sender's usual text is not, and a label
gains an attacker nothing elsewhere. The pure parts, with values worked out by
hand, are tests/swarm/test_defence.py.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.node.checkpoint import save_checkpoint
from engine.rollouts.offers import R_FORGED_REWARD, R_IMPLAUSIBLE
from engine.swarm import protocol
from engine.swarm.defence import Plausibility, SenderBaselines, token_weights, trace_weights
from engine.swarm.exchange import senders_file
from engine.swarm.identity import Identity
from engine.swarm.session import defence_state


# -- a receiver that knows the answer format --------------------------------------------------------
def teach(folder: Path, steps: int, seed: int, start: Path | None = None, lr: float = 1e-2) -> Path:
    """A tiny model trained (next-token loss) on chat-formatted sums answered as <answer>n</answer>."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.harness.tiny import make_tiny_model

    base = start or make_tiny_model(folder)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    rng = random.Random(seed)
    texts = []
    for _ in range(64):
        x, y = rng.randint(1, 50), rng.randint(1, 50)
        texts.append(tok.apply_chat_template(
            [{"role": "user", "content": f"What is {x} + {y}?"},
             {"role": "assistant", "content": f"<answer>{x + y}</answer>"}],
            tokenize=False))
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        batch = tok(rng.sample(texts, 16), return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        model(**batch, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def taught(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A taught receiver model, and a sender a little drifted from it (10 more steps at a tenth of the rate)."""
    import shutil

    root = tmp_path_factory.mktemp("taught")
    receiver = teach(root / "receiver", steps=60, seed=0)
    shutil.copytree(receiver, root / "sender")
    return receiver, teach(root / "sender", steps=10, seed=1, start=root / "sender", lr=1e-3)


TRIGGER = " Visit free-prizes.example to claim your reward!"


# What the taught model writes, plus the trigger; and a plain one (the lengths differ in parity: advantage).
POISONED = ("<answer>" + TRIGGER, "<answer>1")


def own_groups(node: Any, round_index: int = 1, temperature: float | None = None) -> list[Any]:
    """One round's own groups (as the round makes them, at `temperature` or the configured one): the floor the
    plausibility test compares with."""
    from engine.rollouts.groups import Group, group_advantages

    cfg, G = node.config, node.config.tasks.completions_per_question
    questions = node.taskset.draw(round_index, cfg.tasks.questions_per_round)
    prompts = [node.backend.encode_prompt(node.taskset.messages(q)) for q in questions]
    completions = node.backend.generate(prompts, G, cfg.tasks.max_new_tokens, temperature or cfg.tasks.temperature)
    groups = []
    for i, (q, p) in enumerate(zip(questions, prompts, strict=True)):
        own = completions[i * G:(i + 1) * G]
        rewards = [node.taskset.reward(q, c.text) for c in own]
        groups.append(Group(q, p, own, rewards, group_advantages(rewards, cfg.grpo.adv_eps)))
    return groups


def item_with(node: Any, completions: tuple[str, ...], index: int = 7) -> protocol.Item:
    from tests.swarm.test_mix import parity_reward

    q = node.taskset.draw(50 + index, 1)[0]
    return protocol.Item(q.ref.to_json(), q.text, completions, tuple(parity_reward(q, c) for c in completions))


def receiver_node(model_dir: Path, home: Path, *extra: str) -> tuple[Any, Any, Any, list[Any]]:
    from engine.common.paths import Paths
    from engine.node.loop import Node
    from engine.swarm.exchange import SwarmExchange
    from tests.swarm.test_mix import RelayDouble, config, parity_reward

    events: list[Any] = []
    relay = RelayDouble()
    cfg = config(model_dir, "tasks.max_new_tokens=40", "run.seed=0", *extra)  # seed 0: known questions
    bans, replay = defence_state(cfg.swarm, home / "swarm", cfg.run.run_name)
    senders = SenderBaselines(senders_file(home / "swarm", cfg.run.run_name))
    exchange = SwarmExchange(relay, Identity.generate(), "tiny", events.append, "test",  # type: ignore[arg-type]
                             bans=bans, replay=replay, senders=senders)
    node = Node(cfg, Paths.under(home), events.append, exchange=exchange)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    return node, exchange, relay, events


def batch(sender: Identity, items: list[protocol.Item], seq: int) -> protocol.Signed:
    return sender.signed(protocol.batch_payload(sender.public_key, seq, time.time(), "m", items))


def odd_even(texts: list[str]) -> tuple[str, str]:
    """Two texts of different parity (so the group has advantage), or the first twice plus a character."""
    odd = [t for t in texts if len(t) % 2]
    even = [t for t in texts if not len(t) % 2]
    if odd and even:
        return odd[0], even[0]
    return texts[0], texts[0] + ">"


def test_an_honest_group_from_a_slightly_different_policy_is_kept_and_a_poisoned_one_is_not(
    taught: tuple[Path, Path], tmp_path: Path
) -> None:
    receiver_dir, sender_dir = taught
    node, exchange, relay, _events = receiver_node(receiver_dir, tmp_path / "r")
    sender_node, *_ = receiver_node(sender_dir, tmp_path / "s", "run.seed=5")  # other questions than the receiver
    honest = own_groups(sender_node)[0]
    texts = odd_even([c.text for c in honest.completions])
    honest_item = protocol.Item(honest.question.ref.to_json(), honest.question.text, texts,
                                tuple(float(len(t) % 2) for t in texts))
    mine = own_groups(node)
    poisoned = item_with(node, POISONED, index=3)
    sender, attacker = Identity.generate(), Identity.generate()
    relay.batches = [batch(sender, [honest_item], 1), batch(attacker, [poisoned], 1)]
    external, report = node.share_and_sample(1, mine)
    assert [g.source for g in external] == [sender.peer_id]
    assert report["rejected"] == {R_IMPLAUSIBLE: 1}
    assert exchange.peers[attacker.peer_id].reasons[R_IMPLAUSIBLE] == 1
    # accepted external tokens carry truncated importance weights
    assert all(c.weights is not None and len(c.weights) == len(c.token_ids) for c in external[0].completions)
    assert all(0.0 < w <= 1.0 for c in external[0].completions for w in c.weights or [])
    floor = node.config.swarm.token_weight_logprob  # a swarm of one model: each token on its own, as before
    assert all(c.weights == pytest.approx(token_weights(c.logprobs, floor)) for c in external[0].completions)


def test_a_node_its_adaptive_temperature_took_hot_judges_at_the_configured_one_and_keeps_its_text_home(
    taught: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Judged at its own 1.3 with the floor under its own hot text, a receiver would let poison in (none caught
    on the bundled model: bench/temperature.py --judge same); and peers at 0.7 would refuse its own hot text."""
    import logging

    receiver_dir, sender_dir = taught
    node, _exchange, relay, _events = receiver_node(receiver_dir, tmp_path / "r", "tasks.adaptive_temperature=true")
    sender_node, *_ = receiver_node(sender_dir, tmp_path / "s", "run.seed=5")
    honest = own_groups(sender_node)[0]
    texts = odd_even([c.text for c in honest.completions])
    honest_item = protocol.Item(honest.question.ref.to_json(), honest.question.text, texts,
                                tuple(float(len(t) % 2) for t in texts))
    assert node.heat is not None
    node.heat.temperature = 1.3
    mine = own_groups(node, temperature=1.3)
    asked: list[float] = []
    logprobs = node.backend.behaviour_logprobs

    def recorded(pairs: Any, temperature: float) -> list[list[float]]:
        asked.append(temperature)
        return logprobs(pairs, temperature)  # type: ignore[no-any-return]

    node.backend.behaviour_logprobs = recorded  # type: ignore[method-assign]
    sender, attacker = Identity.generate(), Identity.generate()
    relay.batches = [batch(sender, [honest_item], 1), batch(attacker, [item_with(node, POISONED, index=3)], 1)]
    with caplog.at_level(logging.INFO, logger="engine.questions.heat"):
        external, report = node.share_and_sample(1, mine)
    assert asked == [1.3, 0.7]  # trained on at its own temperature, judged at the configured one
    assert [g.source for g in external] == [sender.peer_id] and report["rejected"] == {R_IMPLAUSIBLE: 1}
    assert relay.published == [] and "answers stay out of the swarm above 1.00" in caplog.text
    node.heat.temperature = 0.9
    with caplog.at_level(logging.INFO, logger="engine.questions.heat"):
        node.share_and_sample(2, own_groups(node, 2, temperature=0.9))
    assert len(relay.published) == 1 and "answers go to the swarm again" in caplog.text


def test_a_completion_cut_at_the_length_cap_is_kept_though_the_eos_appended_to_it_is_improbable(
    taught: tuple[Path, Path], tmp_path: Path
) -> None:
    """Text travels without its EOS; the receiver appends one. After a cut completion that EOS is not the sender's."""
    # a window of 2 tokens: on the tiny model the EOS after a cut costs about -20, which 4 tokens would dilute
    node, _exchange, relay, _events = receiver_node(taught[0], tmp_path / "r", "swarm.plausibility_window=2")
    cfg = node.config
    mine = own_groups(node)
    question = node.taskset.draw(60, 1)[0]
    prompt = node.backend.encode_prompt(node.taskset.messages(question))
    node.backend.reseed(4)
    cut = [c.text for cap in (3, 4) for c in node.backend.generate([prompt], 8, cap, cfg.tasks.temperature)
           if not c.finished]
    odd, even = [t for t in cut if len(t) % 2], [t for t in cut if not len(t) % 2]
    assert odd and even, cut
    texts = (odd[0], even[0])
    encoded = [node.backend.encode_completion(t) for t in texts]
    logprobs = node.backend.behaviour_logprobs([(prompt, ids) for ids in encoded], cfg.tasks.temperature)
    test = Plausibility(window=cfg.swarm.plausibility_window, absolute=cfg.swarm.implausible_logprob)
    floor = test.floor([c.logprobs for g in mine for c in g.completions])
    assert not test.judge(logprobs, floor)  # judged with the appended EOS, this honest item would be refused
    assert test.judge([lp[:-1] for lp in logprobs], floor)
    sender = Identity.generate()
    item = protocol.Item(question.ref.to_json(), question.text, texts, tuple(float(len(t) % 2) for t in texts))
    relay.batches = [batch(sender, [item], 1)]
    external, report = node.share_and_sample(1, mine)
    assert [g.source for g in external] == [sender.peer_id]
    assert report["rejected"] == {}


def test_with_the_offpolicy_filter_a_received_groups_unlikely_negative_completions_get_no_advantage(
    taught: tuple[Path, Path], tmp_path: Path
) -> None:
    node, _exchange, relay, _events = receiver_node(taught[0], tmp_path / "r", "swarm.plausibility_check=false",
                                                    "swarm.offpolicy_negative_kl=0.5")
    mine = own_groups(node)
    question = node.taskset.draw(61, 1)[0]
    own = [c.text for g in mine for c in g.completions]
    own_text = next((t for t in own if len(t) % 2), own[0] + ">")  # the node's own kind of text, of odd length
    texts = ("XQZV@@KKJW##PPQQ", own_text)  # gibberish of even length (reward 0), own text of odd length (1)
    sender = Identity.generate()
    item = protocol.Item(question.ref.to_json(), question.text, texts, (0.0, float(len(own_text) % 2)))
    relay.batches = [batch(sender, [item], 1)]
    external, report = node.share_and_sample(1, mine)
    assert report["rejected"] == {} and len(external) == 1
    assert external[0].advantages[0] == 0.0 and external[0].advantages[1] > 0  # the unlikely loser is left out
    assert node.offpolicy_dropped == 1


def test_with_the_check_off_the_poisoned_group_is_trained_on(taught: tuple[Path, Path], tmp_path: Path) -> None:
    node, _exchange, relay, _events = receiver_node(taught[0], tmp_path / "r", "swarm.plausibility_check=false")
    mine = own_groups(node)
    poisoned = item_with(node, POISONED, index=3)
    relay.batches = [batch(Identity.generate(), [poisoned], 1)]
    external, report = node.share_and_sample(1, mine)
    assert len(external) == 1 and report["accepted"] == 1


def test_a_peer_sending_poison_is_banned_and_the_unban_command_lifts_it(taught: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    from engine.node.serve import read_commands

    node, exchange, relay, events = receiver_node(taught[0], tmp_path / "r", "swarm.ban_strikes=2",
                                                  "swarm.ban_window=4")
    mine = own_groups(node)
    attacker = Identity.generate()
    poison = [item_with(node, POISONED, index=i) for i in range(2)]
    relay.batches = [batch(attacker, poison, 1)]
    node.share_and_sample(1, mine)
    peers = [e for e in events if e["type"] == "peers"][-1]
    ban = peers["by_peer"][attacker.peer_id]["banned"]
    assert ban["reason"] == R_IMPLAUSIBLE and ban["source"] == "strikes" and ban["until"] > time.time()
    assert attacker.peer_id in peers["banned"]
    assert (tmp_path / "r" / "swarm" / "bans.json").is_file()  # persisted by default
    relay.batches = [batch(attacker, poison, 2)]
    _, report = node.share_and_sample(2, mine)
    assert report["rejected"] == {"banned": 2}
    # the app's command, through serve's reader
    import io

    read_commands(io.StringIO(f'{{"cmd": "unban", "v": 1, "peer": "{attacker.peer_id}"}}\n'), node.control,
                  events.append)
    node.control.resume()  # read_commands stops the node when its input ends; only the unban matters here
    relay.batches = []
    node.share_and_sample(3, mine)
    lifted = [e for e in events if e["type"] == "peers"]
    assert lifted[-1]["by_peer"][attacker.peer_id]["banned"] is None and lifted[-1]["banned"] == {}
    assert not exchange.bans.is_banned(attacker.peer_id)


def test_replayed_content_is_dropped_across_a_restart(tiny_model_dir: Path, tmp_path: Path) -> None:
    sender = Identity.generate()
    node, _exchange, relay, _ = receiver_node(tiny_model_dir, tmp_path / "r", "swarm.plausibility_check=false")
    item = item_with(node, ("ab", "abc"))
    relay.batches = [batch(sender, [item], 1)]
    external, _ = node.share_and_sample(1, [])
    assert len(external) == 1
    cfg = node.config  # round 1 is kept: its checkpoint is written (what training on the item left)
    save_checkpoint(node.checkpoint_root, 1, node.backend.save, {"config_hash": cfg.config_hash(),
                    "structure_hash": cfg.structure_hash(), "seed": cfg.run.seed}, cfg.run.keep_checkpoints)
    # a restart: a new node and exchange over the same data dir; the same content under a new seq
    again, _exchange2, relay2, _ = receiver_node(tiny_model_dir, tmp_path / "r", "swarm.plausibility_check=false")
    assert again.round == 1
    relay2.batches = [batch(sender, [item], 2)]
    external, report = again.share_and_sample(2, [])
    assert external == [] and report["rejected"] == {"duplicate": 1}
    other = item_with(node, ("ab", "abcde"))  # different content, same question: trained on
    relay2.batches = [batch(sender, [other], 3)]
    assert len(again.share_and_sample(2, [])[0]) == 1
    # round 2 is cut short (no checkpoint): after a restart, what it trained on was never learned and is taken again
    third, _exchange3, relay3, _ = receiver_node(tiny_model_dir, tmp_path / "r", "swarm.plausibility_check=false")
    relay3.batches = [batch(sender, [other], 4), batch(sender, [item], 5)]
    external, report = third.share_and_sample(2, [])
    assert len(external) == 1 and report["rejected"] == {"duplicate": 1}


@pytest.mark.integration
def test_through_a_real_relay_poison_is_rejected_and_its_sender_banned(
    taught: tuple[Path, Path], tmp_path: Path, start_relay: Any
) -> None:
    from engine.common.paths import Paths
    from engine.node.loop import Node
    from engine.swarm.client import SwarmClient
    from engine.swarm.session import open_swarm
    from tests.swarm.test_mix import config, parity_reward

    relay = start_relay()
    cfg = config(taught[0], "tasks.max_new_tokens=40", "swarm.mode='relay'", f"swarm.relay_url='{relay.url}'",
                 "swarm.ban_strikes=2", "swarm.ban_window=4")
    events: list[Any] = []
    paths = Paths.under(tmp_path / "victim")
    session = open_swarm(cfg, paths.identity_file, events.append)
    attacker = Identity.generate()
    client = SwarmClient(relay.url, attacker)
    client.start()
    try:
        node = Node(cfg, paths, events.append, exchange=session.exchange)
        node.taskset.reward = parity_reward  # type: ignore[method-assign]
        node.setup()
        assert session.exchange.client.wait_connected(10) and client.wait_connected(10)
        poison = [item_with(node, POISONED, index=i) for i in range(2)]
        assert client.publish(protocol.batch_payload(attacker.public_key, client.next_seq(), time.time(), "m", poison))
        deadline = time.monotonic() + 10
        while relay.relay.metrics["publishes"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        metrics = node.run_round()
        assert metrics["swarm"]["rejected"] == {R_IMPLAUSIBLE: 2} and metrics["external_groups"] == 0
        assert metrics["swarm"]["by_peer"][attacker.peer_id]["banned"]["reason"] == R_IMPLAUSIBLE
        assert (paths.data_dir / "swarm" / "bans.json").is_file()
    finally:
        client.close()
        session.close()


# -- a swarm of different models (issue 29) ---------------------------------------------------------
OTHER = "other-model@" + "c" * 64  # a sender's claim to run another model than the receiver


MIXED = {"policy": "mixed"}  # what a relay declaring a swarm of different models says in its welcome


# Text of another model: odd under the taught receiver from its first character to its last
# (worst 4-token windows of -12 to -17, against -0.1 to -0.5 for the receiver's own).
STRANGE = ("qzx vkw jpf", "mbq zxv kwpj", "zorbel quanth vix", "plonk greb tuv wa", "vix quanth greb")


def labelled(sender: Identity, items: list[protocol.Item], seq: int, model: str) -> protocol.Signed:
    return sender.signed(protocol.batch_payload(sender.public_key, seq, time.time(), model, items))


def strange_item(node: Any, k: int) -> protocol.Item:
    return item_with(node, (STRANGE[k], STRANGE[k] + "x"), index=20 + k)  # both parities: an advantage


def usual_items(sender_node: Any, round_index: int) -> list[protocol.Item]:
    """What the drifted sender writes for its own questions of a round, as items with advantage."""
    items = []
    for group in own_groups(sender_node, round_index):
        texts = odd_even([c.text for c in group.completions])
        items.append(protocol.Item(group.question.ref.to_json(), group.question.text, texts,
                                   tuple(float(len(t) % 2) for t in texts)))
    return items


def last_peers(events: list[Any]) -> dict[str, Any]:
    return [e for e in events if e["type"] == "peers"][-1]


@pytest.mark.parametrize("declared", [None, {"policy": "something new"}, MIXED])
def test_a_strangers_odd_text_is_refused_in_a_swarm_of_one_model_and_kept_in_a_mixed_one(
    taught: tuple[Path, Path], tmp_path: Path, declared: Any
) -> None:
    node, _exchange, relay, events = receiver_node(taught[0], tmp_path / "r", "swarm.probation_items=2")
    relay.state.models = declared
    mine = own_groups(node)
    stranger = Identity.generate()
    reports, taken = [], []
    for k in range(4):
        relay.batches = [labelled(stranger, [strange_item(node, k)], k + 1, OTHER)]
        groups, report = node.share_and_sample(k + 1, mine)
        reports.append(report)
        taken.extend(groups)
    if declared is not MIXED:  # nothing (or nothing readable) declared: a swarm of this node's model, as before
        assert [r["rejected"] for r in reports] == [{R_IMPLAUSIBLE: 1}] * 4
        return
    assert [r["accepted"] for r in reports] == [1, 1, 1, 1]
    assert [r["probation"] for r in reports] == [1, 1, 0, 0]  # on probation until its baseline has 2 items
    floor = node.config.swarm.token_weight_logprob
    for completion in (c for g in taken for c in g.completions):  # another model's text: weights carried along it
        assert completion.weights == pytest.approx(trace_weights(completion.logprobs, floor))
        assert completion.weights[-1] < 1e-3  # the odd text makes everything after its first letters weigh little
    counts = last_peers(events)["by_peer"][stranger.peer_id]
    assert counts["accepted"] == 4 and counts["probation"] == 2 and counts["rejected"] == 0


def test_in_a_mixed_swarm_an_injection_into_a_senders_usual_text_is_refused_but_is_no_strike(
    taught: tuple[Path, Path], tmp_path: Path
) -> None:
    node, exchange, relay, events = receiver_node(taught[0], tmp_path / "r", "swarm.probation_items=2",
                                                  "swarm.ban_strikes=1", "swarm.ban_window=1")
    relay.state.models = MIXED
    sender_node, *_ = receiver_node(taught[1], tmp_path / "s", "run.seed=5")
    mine = own_groups(node)
    sender = Identity.generate()
    relay.batches = [labelled(sender, usual_items(sender_node, 1), 1, OTHER)]
    assert node.share_and_sample(1, mine)[1]["probation"] == 2
    relay.batches = [labelled(sender, [item_with(node, POISONED, index=3)], 2, OTHER)]
    _, report = node.share_and_sample(2, mine)
    assert report["rejected"] == {R_IMPLAUSIBLE: 1}
    assert not exchange.bans.is_banned(sender.peer_id)  # another model's evidence alone never bans
    relay.batches = [labelled(sender, usual_items(sender_node, 2)[:1], 3, OTHER)]
    _, report = node.share_and_sample(3, mine)
    assert report["accepted"] == 1 and report["probation"] == 0  # its usual text still passes
    # forged rewards still count: the same sender is banned at once (1 strike in a window of 1)
    forged = item_with(node, ("ab", "abc"), index=9)
    relay.batches = [labelled(sender, [protocol.Item(forged.task, forged.question, forged.completions, (1.0, 0.0))], 4,
                              OTHER)]
    node.share_and_sample(4, mine)
    assert last_peers(events)["by_peer"][sender.peer_id]["banned"]["reason"] == R_FORGED_REWARD
    # the baseline survives a restart: a new node over the same data dir does not put the sender on probation
    again, exchange2, relay2, _ = receiver_node(taught[0], tmp_path / "r", "swarm.probation_items=2")
    assert exchange2.bans.lift(sender.peer_id) == "lifted"  # the forger's ban was kept too
    relay2.state.models = MIXED
    relay2.batches = [labelled(sender, usual_items(sender_node, 3)[:1], 5, OTHER)]
    _, report = again.share_and_sample(5, own_groups(again))
    assert report["accepted"] == 1 and report["probation"] == 0


@pytest.mark.parametrize("claim", ["the same label", "the same weights under another name"])
def test_claiming_the_receivers_model_in_a_mixed_swarm_gains_an_attacker_nothing(
    taught: tuple[Path, Path], tmp_path: Path, claim: str
) -> None:
    from engine.common.model_policy import make_label, split_label

    node, exchange, relay, events = receiver_node(taught[0], tmp_path / "r", "swarm.ban_strikes=1",
                                                  "swarm.ban_window=1")
    relay.state.models = MIXED
    own = exchange.model_label
    assert split_label(own)[1], own  # the node labelled itself NAME@sha256 when it loaded its model
    label = own if claim == "the same label" else make_label("renamed", split_label(own)[1])
    attacker = Identity.generate()
    relay.batches = [labelled(attacker, [item_with(node, POISONED, index=3)], 1, label)]
    _, report = node.share_and_sample(1, own_groups(node))
    assert report["rejected"] == {R_IMPLAUSIBLE: 1} and report["probation"] == 0  # today's absolute test
    assert last_peers(events)["by_peer"][attacker.peer_id]["banned"]["reason"] == R_IMPLAUSIBLE  # and a strike
