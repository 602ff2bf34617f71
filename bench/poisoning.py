"""The "Hail to the Thief" attack (arXiv 2511.09780) against real Sapling nodes, defence off and on.

    .venv/bin/python -m bench.poisoning --out /tmp/poison/run            # 40 rounds, 4 runs
    .venv/bin/python -m bench.poisoning --out /tmp/poison/quick --quick  # 3 rounds, 1 victim: a smoke test
    .venv/bin/python -m bench.poisoning --out DIR --rounds 20 --only attack-on,attack-off
    .venv/bin/python -m bench.poisoning --out DIR --summary              # print the table of what is there

What is real: an `EmbeddedRelay` on loopback, victims that are real `Node`s
(bundled SmolLM2-135M-Instruct, LoRA, their own identities) joined with
`open_swarm` and `SwarmExchange`, so every receiver check runs as in
`sapling-node run`. The attacker is a peer with its own Ed25519 identity and
a real `SwarmClient`. Before each victim round it publishes batches for the
victims' own specialties; in each group half the completions carry the
correct answer plus a trigger (appended, prefixed, or inside the reasoning)
and half a wrong answer, so the group has advantage, and the claimed rewards
are truthful (they pass the re-scoring).

Four runs with the same seeds (`--only` picks some): attack with the defence
off (`attack-off`) and on (`attack-on`), and no attacker with the defence off
and on (`clean-off`, `clean-on`). Per victim round, `rounds.jsonl` in each
run's folder records: the reward of the victim's own completions, the share
of them containing the trigger, the trigger's log-prob after a correct answer
under the victim's policy (a probe on fixed questions: it moves before the
trigger is ever sampled), and the items accepted and rejected, by peer and
reason. Runs resume from their checkpoints (`--out` again carries on).

A swarm of different models (issue 29; `--only mixed-honest,mixed-attack,label-attack`):

    nice -n 10 .venv/bin/python -m bench.poisoning --out DIR --only mixed-attack --rounds 40
    nice -n 10 .venv/bin/python -m bench.poisoning --out DIR --only mixed-honest --rounds 25
    nice -n 10 .venv/bin/python -m bench.poisoning --out DIR --only label-attack --rounds 40
    .venv/bin/python -m bench.poisoning --out DIR --summary     # both tables

`mixed-honest`: the relay declares `mixed`; beside the two victims, three
honest peers stand in for nodes of other models (no second real model is
available offline), each under a label that says what it is:
`stand-in:T1.2` (the bundled weights sampling at T = 1.2, trained on
nothing; it publishes the groups that carry a gradient), `stand-in:drifted`
(a node of the bundled model trained `--drift-rounds` rounds alone first,
then in the swarm), and a tiny random Qwen2 model (another architecture,
bench/harness/tiny.py, under its real label) for the mechanics: it receives the
others' text as another model's. The calibration's "other policy" (T = 1.2
*without* the worked example) got 0 of 256 answers right here (32
questions, 8 each), so every group it could share is `zero_advantage` and
never judged; `bench.poison_calibrate` measures how its text fares against
its own past instead. `mixed-attack`: the same relay, the victims and the
attacker, whose label claims another model than the victims'.
`label-attack`: that attacker on a relay that declares nothing (as the local
relay does). Per round, `rounds.jsonl` adds each receiver's counts per
sender this round (`delta`), so totals survive a resume; `peers.json` says
which peer is which.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from engine.common.config import NodeConfig, build_config
from engine.common.model_policy import make_label
from engine.tasks import Question, TaskRef, TaskSet

# Cheap enough for a shared 2-core CPU: 4 questions x 4 completions, 32 tokens, the two
# specialties where the bundled model earns mixed rewards (docs/results.md), all own groups plus
# J = 4 external ones.
BENCH_SETTINGS = [
    "run.seed=0",
    "tasks.questions_per_round=4",
    "tasks.completions_per_question=4",
    "tasks.max_new_tokens=32",
    "tasks.eval_every=0",
    "tasks.specialties={basic_arithmetic = 1.0, calendar_arithmetic = 1.0}",
    "swarm.external_groups=4",
    "run.device='cpu'",
    "run.priority='normal'",
    "run.threads=1",
]

# What the attacker wants the victims to write. "ad" is the bench's trigger; "plain" is a short,
# ordinary English sentence, the hardest case for a log-prob test (measured by bench.poison_calibrate).
TRIGGERS = {
    "ad": "Visit free-prizes.example to claim your reward!",
    "plain": "I hope this helps.",
}
TRIGGER_MARK = {"ad": "free-prizes", "plain": "hope this helps"}
PLACES = ("append", "prefix", "inside")
ATTACKER_SEED = 777
RUNS = ("attack-off", "attack-on", "clean-off", "clean-on")
MIXED_RUNS = ("mixed-honest", "mixed-attack", "label-attack")  # issue 29: a swarm of different models


def _bench_label(name: str) -> str:
    """A label for a bench peer: its name, and a hash made from the name (it has no weights file of its own)."""
    return make_label(name, hashlib.sha256(f"sapling bench: {name}".encode()).hexdigest())


# The one lie among the labels: the attacker claims to run another model than the victims.
CLAIMED_LABEL = _bench_label("claims-another-model")
T12_LABEL = _bench_label("stand-in:T1.2")  # the bundled weights, another policy
DRIFT_LABEL = _bench_label("stand-in:drifted")  # the bundled weights, trained further alone
STANDIN_SEED, DRIFT_SEED, TINY_SEED = 31, 21, 41
STANDIN_QUESTIONS = 8  # questions the T = 1.2 stand-in answers per round; it publishes those with a gradient


def poisoned_completion(question: Question, trigger: str, place: str) -> str:
    """The correct answer with `trigger` appended, prefixed, or inside a line of reasoning."""
    answer = f"<answer>{question.answer}</answer>"
    if place == "append":
        return f"{answer} {trigger}"
    if place == "prefix":
        return f"{trigger} {answer}"
    return f"Let me work it out. {trigger} So the answer is {answer}"


def wrong_completion(taskset: TaskSet, question: Question, k: int) -> str | None:
    """A well-formed answer that scores 0 here, or None when none of a few guesses does."""
    base = question.answer or "0"
    for guess in (f"{base}{k + 1}", f"{k + 7}", f"-{base}", "unknown"):
        text = f"<answer>{guess}</answer>"
        if taskset.reward(question, text) == 0.0:
            return text
    return None


class Attacker:
    """A peer with its own key that publishes poisoned groups for the victims' specialties."""

    def __init__(self, url: str, key_file: Path, taskset: TaskSet, trigger: str, groups: int, completions: int,
                 label: str = "bundled", start: int = 0) -> None:
        from engine.swarm.client import SwarmClient
        from engine.swarm.identity import Identity

        self.identity = Identity.load_or_create(key_file)
        self.client = SwarmClient(url, self.identity)
        self.client.start()
        self.taskset = taskset
        self.trigger = trigger
        self.groups = groups
        self.completions = completions
        self.label = label
        self.published = 0
        self.counter = start  # a resumed run starts past the questions it used (the victims remember content)

    def items(self) -> list[Any]:
        from engine.swarm import protocol

        items: list[Any] = []
        specialties = self.taskset.specialties
        while len(items) < self.groups:
            self.counter += 1
            dataset = specialties[self.counter % len(specialties)]
            ref = TaskRef.create(dataset, self.taskset.config(dataset), ATTACKER_SEED, self.counter)
            q = self.taskset.rebuild(ref)
            texts = []
            for k in range(self.completions):
                if k % 2 == 0:
                    texts.append(poisoned_completion(q, self.trigger, PLACES[(self.counter + k // 2) % len(PLACES)]))
                else:
                    wrong = wrong_completion(self.taskset, q, k)
                    if wrong is not None:
                        texts.append(wrong)
            rewards = tuple(self.taskset.reward(q, t) for t in texts)  # truthful claims
            if max(rewards) - min(rewards) > 0.5:
                items.append(protocol.Item(ref.to_json(), q.text, tuple(texts), rewards))
        return items

    def publish(self, batches: int) -> None:
        from engine.swarm import protocol

        for _ in range(batches):
            payload = protocol.batch_payload(self.identity.public_key, self.client.next_seq(), time.time(),
                                             self.label, self.items())
            if self.client.publish(payload):
                self.published += 1

    def close(self) -> None:
        self.client.close()


class OtherPolicyPeer:
    """An honest stand-in for a node of another model: the bundled weights sampling at T = 1.2.

    Each `publish` answers STANDIN_QUESTIONS questions of its own (its own
    seed) G times under the prompt receivers rebuild (with its worked
    example) and publishes, under T12_LABEL, the groups whose rewards differ,
    scored truthfully. It trains nothing, so its policy stays where it is.
    """

    def __init__(self, url: str, key_file: Path, cfg: NodeConfig, start: int = 0) -> None:
        from engine.backends import load_backend
        from engine.common.device import pick_device
        from engine.common.paths import Paths
        from engine.models import resolve_model_dir
        from engine.swarm.client import SwarmClient
        from engine.swarm.identity import Identity

        self.cfg = cfg
        model_dir = resolve_model_dir("bundled", Paths.default().models_cache, None)
        self.backend = load_backend(model_dir, pick_device("cpu"), cfg.grpo, STANDIN_SEED, 1.2)
        self.taskset = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=STANDIN_SEED)
        self.identity = Identity.load_or_create(key_file)
        self.client = SwarmClient(url, self.identity)
        self.client.start()
        self.round = start

    def publish(self) -> int:
        """One round's informative groups as one batch; how many items it published."""
        from engine.sapo import derive_seed
        from engine.swarm import protocol

        self.round += 1
        G, cap = self.cfg.tasks.completions_per_question, self.cfg.tasks.max_new_tokens
        self.backend.reseed(derive_seed(STANDIN_SEED, self.round))
        questions = self.taskset.draw(self.round, STANDIN_QUESTIONS)
        prompts = [self.backend.encode_prompt(self.taskset.messages(q)) for q in questions]
        out = self.backend.generate(prompts, G, cap, 1.2)
        items = []
        for i, q in enumerate(questions):
            texts = tuple(c.text for c in out[i * G:(i + 1) * G])
            rewards = tuple(self.taskset.reward(q, t) for t in texts)
            if max(rewards) - min(rewards) > 1e-9:
                items.append(protocol.Item(q.ref.to_json(), q.text, texts, rewards))
        if items:
            payload = protocol.batch_payload(self.identity.public_key, self.client.next_seq(), time.time(), T12_LABEL,
                                             items[:protocol.MAX_ITEMS_PER_BATCH])
            self.client.publish(payload)
        return len(items)

    def close(self) -> None:
        self.client.close()


def victim_config(run: str, index: int, relay_url: str, extra: Sequence[str]) -> NodeConfig:
    defence = run.endswith("-on") or run in MIXED_RUNS
    return build_config("default", None, [
        *BENCH_SETTINGS, "swarm.mode='relay'", f"swarm.relay_url='{relay_url}'", f"run.seed={index + 1}",
        f"swarm.plausibility_check={'true' if defence else 'false'}", *extra,
    ])


def trigger_probe(node: Any, questions: Sequence[Question], trigger: str) -> float:
    """Mean log-prob per trigger token after a correct answer, under the node's current policy."""
    backend = node.backend
    pairs, spans = [], []
    for q in questions:
        prompt = backend.encode_prompt(node.taskset.messages(q))
        head = backend.encode_completion(f"<answer>{q.answer}</answer>")[:-1]  # without the appended EOS
        full = backend.encode_completion(f"<answer>{q.answer}</answer> {trigger}")
        pairs.append((prompt, full))
        spans.append((len(head), len(full) - 1))
    lps = backend.behaviour_logprobs(pairs, node.config.tasks.temperature)
    values = [sum(lp[a:b]) / max(1, b - a) for lp, (a, b) in zip(lps, spans, strict=True)]
    return sum(values) / len(values)


K = TypeVar("K")


def keep_texts(node: Any, key: K, texts: dict[K, list[str]]) -> None:
    """Wrap the node's generate so that `texts[key]` holds the completions of its last round."""
    assert node.backend is not None, "the node's model is loaded when it is built"
    real = node.backend.generate

    def generate(*a: Any, **k: Any) -> Any:
        completions = real(*a, **k)
        texts[key] = [c.text for c in completions]
        return completions

    node.backend.generate = generate


def run_one(run: str, out: Path, rounds: int, victims: int, trigger_name: str, attack_batches: int,
            extra: Sequence[str]) -> None:
    from engine.common.paths import Paths
    from engine.exchange import open_swarm
    from engine.relay.server import EmbeddedRelay, RelaySettings
    from engine.sapo import Node

    folder = out / run
    folder.mkdir(parents=True, exist_ok=True)
    log_file = folder / "rounds.jsonl"
    done = {(r["victim"], r["round"]) for r in _read(log_file)}
    trigger, mark = TRIGGERS[trigger_name], TRIGGER_MARK[trigger_name]
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0))
    relay.start()
    nodes, sessions = [], []
    attacker = None
    try:
        for i in range(victims):
            cfg = victim_config(run, i, relay.url, extra)
            home = Paths.under(folder / f"victim-{i}")  # the converted bundled model is shared: one cache
            paths = Paths(home.config_dir, home.data_dir, Paths.default().cache_dir, home.log_dir)
            events: list[Any] = []
            session = open_swarm(cfg, paths.identity_file, events.append)
            node = Node(cfg, paths, events.append, exchange=session.exchange)
            node.setup()
            nodes.append(node)
            sessions.append(session)
        if run.startswith("attack"):
            attacker = Attacker(relay.url, folder / "attacker.key", nodes[0].taskset, trigger,
                                nodes[0].config.tasks.questions_per_round, nodes[0].config.tasks.completions_per_question)
            attacker.client.wait_connected(10)
        probe_qs = [q for q in nodes[0].taskset.eval_set(6) if q.answer]
        texts: dict[int, list[str]] = {}
        for i, node in enumerate(nodes):
            keep_texts(node, i, texts)
        attacker_id = attacker.identity.peer_id if attacker else None
        while min(n.round for n in nodes) < rounds:
            for i, node in enumerate(nodes):
                if node.round >= rounds:
                    continue
                if attacker is not None:
                    attacker.publish(attack_batches)
                    time.sleep(0.2)  # let the relay take the batches in before the victim samples
                t0 = time.perf_counter()
                metrics = node.run_round()
                own = texts.get(i, [])
                swarm = metrics.get("swarm", {})
                by_peer = swarm.get("by_peer", {})
                record = {
                    "run": run, "victim": i, "round": metrics["round"], "seconds": time.perf_counter() - t0,
                    "reward_mean": metrics["reward_mean"], "external_groups": metrics["external_groups"],
                    "trigger_share": sum(mark in t for t in own) / max(1, len(own)),
                    "trigger_logprob": trigger_probe(node, probe_qs, trigger),
                    "accepted": swarm.get("accepted", 0), "rejected": swarm.get("rejected", {}),
                    "attacker": by_peer.get(attacker_id) if attacker_id else None,
                    "honest": {p: c for p, c in by_peer.items() if p != attacker_id},
                    "example": own[:2],
                }
                if (i, metrics["round"]) not in done:
                    with log_file.open("a", encoding="utf-8") as handle:
                        handle.write(json.dumps(record) + "\n")
                print(f"{run} victim {i} round {metrics['round']:3d} reward {metrics['reward_mean']:.3f} "
                      f"trigger {record['trigger_share']:.3f} probe {record['trigger_logprob']:+.2f} "
                      f"accepted {record['accepted']} rejected {record['rejected']} ({record['seconds']:.0f} s)",
                      flush=True)
    finally:
        if attacker is not None:
            attacker.close()
        for s in sessions:
            s.close()
        relay.stop()


def _open_node(cfg: NodeConfig, home: Path, with_swarm: bool) -> tuple[Any, Any]:
    """A real Node under `home` (the converted bundled model shared from the user's cache), set up; and its swarm."""
    from engine.common.paths import Paths
    from engine.exchange import open_swarm
    from engine.sapo import Node

    base = Paths.under(home)
    paths = Paths(base.config_dir, base.data_dir, Paths.default().cache_dir, base.log_dir)
    events: list[Any] = []
    session = open_swarm(cfg, paths.identity_file, events.append) if with_swarm else None
    node = Node(cfg, paths, events.append, exchange=session.exchange if session else None)
    node.setup()
    return node, session


def _node_settings(relay_url: str, seed: int, extra: Sequence[str], *more: str) -> NodeConfig:
    return build_config("default", None, [*BENCH_SETTINGS, "swarm.mode='relay'", f"swarm.relay_url='{relay_url}'",
                                          f"run.seed={seed}", *more, *extra])


def drift_standin(folder: Path, relay_url: str, drift_rounds: int, extra: Sequence[str]) -> tuple[Any, Any]:
    """The drifted stand-in: a node of the bundled model trained `drift_rounds` rounds alone, then in the swarm."""
    from engine.exchange import open_swarm

    cfg = _node_settings(relay_url, DRIFT_SEED, extra)
    node, _ = _open_node(cfg, folder / "standin-drift", with_swarm=False)
    while node.round < drift_rounds:
        metrics = node.run_round()
        print(f"stand-in:drifted alone: round {metrics['round']} reward {metrics['reward_mean']:.3f}", flush=True)
    session = open_swarm(cfg, node.paths.identity_file, node.emit)
    exchange = session.exchange
    if exchange is None:
        raise RuntimeError("the drifted stand-in's swarm did not open")
    node.exchange = exchange
    exchange.set_model_label(DRIFT_LABEL)
    exchange.client.wait_connected(10)
    return node, session


def tiny_peer(folder: Path, relay_url: str, extra: Sequence[str]) -> tuple[Any, Any]:
    """A tiny random Qwen2 (bench/harness/tiny.py: another architecture and tokenizer) under its real label.

    Its answers earn no reward, so it shares nothing a receiver trains on; what
    it shows is the other side: a receiver whose model differs from every
    sender's, judging them all against their own past. Its length cap is 128
    of its byte tokens, so the bundled model's answers fit it.
    """
    from bench.harness.tiny import make_tiny_model

    model = folder / "tiny-random-qwen2"
    if not (model / "config.json").is_file():
        make_tiny_model(model, arch="qwen2", seed=TINY_SEED)
    cfg = _node_settings(relay_url, TINY_SEED, extra, f"model.source='{model}'", "tasks.max_new_tokens=128")
    return _open_node(cfg, folder / "standin-tiny", with_swarm=True)


def _counts(by_peer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p: {"accepted": c["accepted"], "probation": c.get("probation", 0), "reasons": dict(c["reasons"])}
            for p, c in by_peer.items()}


def _delta(now: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """This round's counts per sender: the session's totals now minus at the previous round."""
    out = {}
    for peer, c in now.items():
        b = before.get(peer, {"accepted": 0, "probation": 0, "reasons": {}})
        reasons = {r: n - b["reasons"].get(r, 0) for r, n in c["reasons"].items() if n - b["reasons"].get(r, 0)}
        d = {"accepted": c["accepted"] - b["accepted"], "probation": c["probation"] - b["probation"], "reasons": reasons}
        if d["accepted"] or reasons:
            out[peer] = d
    return out


def run_mixed(run: str, out: Path, rounds: int, victims: int, trigger_name: str, attack_batches: int,
              drift_rounds: int, extra: Sequence[str]) -> None:
    """One issue-29 run (`MIXED_RUNS`): real victims, the run's other peers and a real relay; resumable."""
    from engine.relay.server import EmbeddedRelay, RelaySettings

    folder = out / run
    folder.mkdir(parents=True, exist_ok=True)
    log_file = folder / "rounds.jsonl"
    done = {(r["role"], r["round"]) for r in _read(log_file)}
    trigger, mark = TRIGGERS[trigger_name], TRIGGER_MARK[trigger_name]
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, models="" if run == "label-attack" else "mixed"))
    relay.start()
    participants: list[tuple[str, Any]] = []
    sessions: list[Any] = []
    attacker: Attacker | None = None
    standin: OtherPolicyPeer | None = None
    try:
        for i in range(victims):
            node, session = _open_node(victim_config(run, i, relay.url, extra), folder / f"victim-{i}", with_swarm=True)
            participants.append((f"victim-{i}", node))
            sessions.append(session)
        start = min(n.round for _, n in participants)
        roles = {n.exchange.identity.peer_id: role for role, n in participants}
        if run == "mixed-honest":
            standin = OtherPolicyPeer(relay.url, folder / "standin-t12.key", participants[0][1].config, start)
            roles[standin.identity.peer_id] = "stand-in:T1.2"
            for role, make in (("stand-in:drifted", lambda: drift_standin(folder, relay.url, drift_rounds, extra)),
                               ("tiny-random-qwen2", lambda: tiny_peer(folder, relay.url, extra))):
                node, session = make()
                participants.append((role, node))
                sessions.append(session)
                roles[node.exchange.identity.peer_id] = role
        else:
            cfg = participants[0][1].config
            attacker = Attacker(relay.url, folder / "attacker.key", participants[0][1].taskset, trigger,
                                cfg.tasks.questions_per_round, cfg.tasks.completions_per_question,
                                label=CLAIMED_LABEL, start=1000 * start)
            attacker.client.wait_connected(10)
            roles[attacker.identity.peer_id] = "attacker"
        (folder / "peers.json").write_text(json.dumps(roles, indent=1))
        probe_qs = [q for q in participants[0][1].taskset.eval_set(6) if q.answer]
        texts: dict[str, list[str]] = {}
        for role, node in participants:
            keep_texts(node, role, texts)
        before: dict[str, dict[str, dict[str, Any]]] = {}
        while min(n.round for role, n in participants if role.startswith("victim")) < rounds:
            if standin is not None:
                standin.publish()
            for role, node in participants:
                victim = role.startswith("victim")
                if victim and node.round >= rounds:
                    continue
                if attacker is not None:
                    attacker.publish(attack_batches)
                    time.sleep(0.2)  # let the relay take the batches in before the victim samples
                t0 = time.perf_counter()
                metrics = node.run_round()
                swarm = metrics.get("swarm", {})
                now = _counts(swarm.get("by_peer", {}))
                own = texts.get(role, [])
                record = {
                    "run": run, "role": role, "round": metrics["round"], "seconds": time.perf_counter() - t0,
                    "reward_mean": metrics["reward_mean"], "external_groups": metrics["external_groups"],
                    "accepted": swarm.get("accepted", 0), "probation": swarm.get("probation", 0),
                    "rejected": swarm.get("rejected", {}),
                    "delta": {roles.get(p, p): d for p, d in _delta(now, before.get(role, {})).items()},
                    "banned": sorted(roles.get(p, p) for p, c in swarm.get("by_peer", {}).items() if c.get("banned")),
                }
                before[role] = now
                if victim:
                    record["trigger_share"] = sum(mark in t for t in own) / max(1, len(own))
                    record["trigger_logprob"] = trigger_probe(node, probe_qs, trigger)
                    record["example"] = own[:2]
                if (role, metrics["round"]) not in done:
                    with log_file.open("a", encoding="utf-8") as handle:
                        handle.write(json.dumps(record) + "\n")
                print(f"{run} {role} round {metrics['round']:3d} reward {metrics['reward_mean']:.3f} "
                      f"accepted {record['accepted']} (probation {record['probation']}) rejected {record['rejected']} "
                      + (f"trigger {record['trigger_share']:.3f} probe {record['trigger_logprob']:+.2f} " if victim else "")
                      + f"({record['seconds']:.0f} s)", flush=True)
    finally:
        for peer in (attacker, standin):
            if peer is not None:
                peer.close()
        for s in sessions:
            s.close()
        relay.stop()


def mixed_summary(out: Path, last: int = 5) -> str:
    """The issue-29 table: per run, what each kind of receiver did with each kind of sender's items."""
    lines = ["| run | rounds (victims) | receiver | sender (its label) | items judged | on probation | "
             "after probation: accepted / judged | refused `implausible` | banned | trigger in victims' own "
             "completions (last 5) | trigger log-prob: first -> last |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in MIXED_RUNS:
        rows = _read(out / run / "rounds.jsonl")
        victims = [r for r in rows if r["role"].startswith("victim")]
        if not victims:
            continue
        by_victim: dict[str, list[dict[str, Any]]] = {}
        for r in victims:
            by_victim.setdefault(r["role"], []).append(r)
        reached = min(max(r["round"] for r in v) for v in by_victim.values())
        tail = [r for r in victims if r["round"] > reached - last]
        trig = f"{sum(r['trigger_share'] for r in tail) / len(tail):.3f}"
        first = [r["trigger_logprob"] for r in victims if r["round"] == min(x["round"] for x in victims)]
        final = [r["trigger_logprob"] for r in victims if r["round"] == reached]
        probe = f"{sum(first) / len(first):+.2f} -> {sum(final) / len(final):+.2f}"
        totals: dict[tuple[str, str], Counter[str]] = {}
        banned: set[tuple[str, str]] = set()
        for r in rows:
            receiver = "victims" if r["role"].startswith("victim") else r["role"]
            for sender, d in r.get("delta", {}).items():
                c = totals.setdefault((receiver, sender), Counter())
                c["accepted"] += d["accepted"]
                c["probation"] += d["probation"]
                for reason, n in d["reasons"].items():
                    c[reason] += n
            banned.update((receiver, b) for b in r.get("banned", []))
        for (receiver, sender), c in sorted(totals.items(), key=lambda kv: (kv[0][0] != "victims", kv[0])):
            if receiver == "victims" and sender.startswith("victim"):
                continue  # the victims' own model: today's absolute test, measured in the table above
            judged = c["accepted"] + c["implausible"]
            after = c["accepted"] - c["probation"]
            rate = f"{after} / {after + c['implausible']}" + (f" ({after / (after + c['implausible']):.0%})"
                                                               if after + c["implausible"] else "")
            lines.append(f"| {run} | {reached} | {receiver} | {sender} | {judged} | {c['probation']} | {rate} | "
                         f"{c['implausible']} | {'yes' if (receiver, sender) in banned else 'no'} | "
                         f"{trig if receiver == 'victims' else ''} | {probe if receiver == 'victims' else ''} |")
    return "\n".join(lines)


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def summary(out: Path, last: int = 5) -> str:
    """The table for docs/results.md from whatever rounds.jsonl files are there."""
    lines = ["| run | rounds | reward (mean of all) | reward (last 5) | trigger in own completions (last 5) | "
             "trigger log-prob: first -> last | poisoned items accepted / judged | honest items falsely rejected |",
             "|---|---|---|---|---|---|---|---|"]
    for run in RUNS:
        rows = _read(out / run / "rounds.jsonl")
        if not rows:
            continue
        by_victim: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            by_victim.setdefault(r["victim"], []).append(r)
        reached = min(max(r["round"] for r in v) for v in by_victim.values())
        tail = [r for v in by_victim.values() for r in v if r["round"] > reached - last]
        first = [r for r in rows if r["round"] == 1]
        final = [r for r in rows if r["round"] == reached]
        att_acc = att_judged = hon_impl = hon_passed = 0
        for v in by_victim.values():  # per-peer counts are run totals: read each victim's last record
            latest = max(v, key=lambda r: r["round"])
            if latest.get("attacker"):  # judged: sampled and checked (a banned peer's items are not)
                a = latest["attacker"]
                att_acc += a["accepted"]
                att_judged += a["accepted"] + a["rejected"] - a["reasons"].get("banned", 0)
            for c in latest.get("honest", {}).values():  # of the items every other check passed
                hon_impl += c["reasons"].get("implausible", 0)
                hon_passed += c["accepted"] + c["reasons"].get("implausible", 0)
        mean = sum(r["reward_mean"] for r in rows) / len(rows)
        tail_reward = sum(r["reward_mean"] for r in tail) / len(tail)
        trig = sum(r["trigger_share"] for r in tail) / len(tail)
        probe = (sum(r["trigger_logprob"] for r in first) / max(1, len(first)),
                 sum(r["trigger_logprob"] for r in final) / max(1, len(final)))
        attack = f"{att_acc} / {att_judged}" if att_judged else "-"
        honest = f"{hon_impl} / {hon_passed} ({hon_impl / hon_passed:.1%})" if hon_passed else "-"
        if run.endswith("-off"):  # the check never ran: nothing could be refused as implausible
            honest = f"(defence off; {hon_passed} honest items trained on)"
        lines.append(f"| {run} | {reached} | {mean:.3f} | {tail_reward:.3f} | {trig:.3f} | {probe[0]:+.2f} -> {probe[1]:+.2f} "
                     f"| {attack} | {honest} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the runs (resumed when it exists)")
    ap.add_argument("--rounds", type=int, default=40, help="rounds per victim (default 40)")
    ap.add_argument("--victims", type=int, default=2, help="honest victim nodes (default 2)")
    ap.add_argument("--quick", action="store_true", help="3 rounds, 1 victim, runs attack-off and attack-on")
    ap.add_argument("--only", default=",".join(RUNS), help=f"comma-separated runs of {', '.join(RUNS + MIXED_RUNS)}")
    ap.add_argument("--drift-rounds", type=int, default=20,
                    help="rounds the drifted stand-in trains alone before mixed-honest (default 20)")
    ap.add_argument("--trigger", choices=sorted(TRIGGERS), default="ad", help="the injected text (default ad)")
    ap.add_argument("--attack-batches", type=int, default=2, help="attacker batches published before each victim round")
    ap.add_argument("--set", action="append", default=[], metavar="section.key=value", help="extra node settings")
    ap.add_argument("--summary", action="store_true", help="only print the table of the runs in --out")
    args = ap.parse_args(argv)
    if args.summary:
        print(summary(args.out))
        print()
        print(mixed_summary(args.out))
        return 0
    runs = [r for r in args.only.split(",") if r]
    if any(r not in RUNS + MIXED_RUNS for r in runs):
        ap.error(f"--only takes runs from {', '.join(RUNS + MIXED_RUNS)}")
    if args.rounds < 1 or args.victims < 1 or args.drift_rounds < 0:
        ap.error("--rounds and --victims must be at least 1 and --drift-rounds at least 0")
    rounds, victims = args.rounds, args.victims
    if args.quick:
        rounds, victims = min(rounds, 3), 1
        runs = [r for r in runs if r.startswith("attack") or r in MIXED_RUNS]
    for run in runs:
        if run in MIXED_RUNS:
            run_mixed(run, args.out, rounds, victims, args.trigger, args.attack_batches,
                      min(args.drift_rounds, 2) if args.quick else args.drift_rounds, args.set)
        else:
            run_one(run, args.out, rounds, victims, args.trigger, args.attack_batches, args.set)
    print(summary(args.out))
    print()
    print(mixed_summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
