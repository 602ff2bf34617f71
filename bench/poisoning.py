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
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.poisoning_peers import (
    BENCH_SETTINGS,
    CLAIMED_LABEL,
    MIXED_RUNS,
    RUNS,
    Attacker,
    OtherPolicyPeer,
    drift_standin,
    each_victim_round,
    open_node,
    tiny_peer,
    victims_on_a_relay,
)
from bench.poisoning_report import mixed_summary, read_rows, summary
from engine.common.atomicio import append_line, atomic_write_text
from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.questions.tasks import Question

# What the attacker wants the victims to write. "ad" is the bench's trigger; "plain" is a short,
# ordinary English sentence, the hardest case for a log-prob test (measured by bench.poison_calibrate).
TRIGGERS = {
    "ad": "Visit free-prizes.example to claim your reward!",
    "plain": "I hope this helps.",
}
TRIGGER_MARK = {"ad": "free-prizes", "plain": "hope this helps"}


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


def append_record(log_file: Path, record: dict[str, Any]) -> None:
    append_line(log_file, json.dumps(record))


def victim_record(run: str, i: int, metrics: dict[str, Any], seconds: float, own: list[str], mark: str,
                  probe: float, attacker_id: str | None) -> dict[str, Any]:
    """What rounds.jsonl keeps of a victim's round in run_one: reward, the trigger in its own text, the items
    it accepted and rejected, from the attacker and from honest peers."""
    swarm = metrics.get("swarm", {})
    by_peer = swarm.get("by_peer", {})
    return {
        "run": run, "victim": i, "round": metrics["round"], "seconds": seconds,
        "reward_mean": metrics["reward_mean"], "external_groups": metrics["external_groups"],
        "trigger_share": sum(mark in t for t in own) / max(1, len(own)),
        "trigger_logprob": probe,
        "accepted": swarm.get("accepted", 0), "rejected": swarm.get("rejected", {}),
        "attacker": by_peer.get(attacker_id) if attacker_id else None,
        "honest": {p: c for p, c in by_peer.items() if p != attacker_id},
        "example": own[:2],
    }


def victim_rounds(run: str, folder: Path, nodes: list[Any], rounds: int, trigger_name: str,
                  attacker: Attacker | None, attack_batches: int) -> None:
    """Each victim in turn, a round at a time, until all reached `rounds`; a line per round (kept once)."""
    log_file = folder / "rounds.jsonl"
    done = {(r["victim"], r["round"]) for r in read_rows(log_file)}
    trigger, mark = TRIGGERS[trigger_name], TRIGGER_MARK[trigger_name]
    probe_qs = [q for q in nodes[0].taskset.eval_set(6) if q.answer]
    texts: dict[int, list[str]] = {}
    for i, node in enumerate(nodes):
        keep_texts(node, i, texts)
    attacker_id = attacker.identity.peer_id if attacker else None

    def logged(i: int, metrics: dict[str, Any], seconds: float) -> None:
        record = victim_record(run, i, metrics, seconds, texts.get(i, []), mark,
                               trigger_probe(nodes[i], probe_qs, trigger), attacker_id)
        if (i, metrics["round"]) not in done:
            append_record(log_file, record)
        print(f"{run} victim {i} round {metrics['round']:3d} reward {metrics['reward_mean']:.3f} "
              f"trigger {record['trigger_share']:.3f} probe {record['trigger_logprob']:+.2f} "
              f"accepted {record['accepted']} rejected {record['rejected']} ({record['seconds']:.0f} s)",
              flush=True)

    each_victim_round(nodes, rounds, attacker, attack_batches, logged)


def run_one(run: str, out: Path, rounds: int, victims: int, trigger_name: str, attack_batches: int,
            extra: Sequence[str]) -> None:
    """One run of `RUNS`: the victims with the defence off or on, with or without the attacker; resumable."""
    folder = out / run
    configs = [lambda url, i=i: victim_config(run, i, url, extra) for i in range(victims)]
    with victims_on_a_relay(folder, configs) as on:
        nodes = on.nodes
        attacker = None
        if run.startswith("attack"):
            attacker = on.attacker = Attacker(on.url, folder / "attacker.key", nodes[0].taskset,
                                              TRIGGERS[trigger_name], nodes[0].config.tasks.questions_per_round,
                                              nodes[0].config.tasks.completions_per_question)
            attacker.client.wait_connected(10)
        victim_rounds(run, folder, nodes, rounds, trigger_name, attacker, attack_batches)


def _counts(by_peer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p: {"accepted": c["accepted"], "probation": c.get("probation", 0), "reasons": dict(c["reasons"])}
            for p, c in by_peer.items()}


def _delta(now: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """This round's counts per sender: the session's totals now minus at the previous round."""
    out = {}
    for peer, c in now.items():
        b = before.get(peer, {"accepted": 0, "probation": 0, "reasons": {}})
        reasons = {r: n - b["reasons"].get(r, 0) for r, n in c["reasons"].items() if n - b["reasons"].get(r, 0)}
        d = {"accepted": c["accepted"] - b["accepted"], "probation": c["probation"] - b["probation"],
             "reasons": reasons}
        if d["accepted"] or reasons:
            out[peer] = d
    return out


@dataclass
class MixedSwarm:
    """Who takes part in a mixed run: the nodes that train (victims first) with their sessions, the peers that
    only publish, and which peer id is which role (peers.json)."""

    participants: list[tuple[str, Any]] = field(default_factory=list)
    sessions: list[Any] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)
    attacker: Attacker | None = None
    standin: OtherPolicyPeer | None = None

    def add(self, role: str, node: Any, session: Any) -> None:
        self.participants.append((role, node))
        self.sessions.append(session)
        self.roles[node.exchange.identity.peer_id] = role

    def close(self) -> None:
        for peer in (self.attacker, self.standin):
            if peer is not None:
                peer.close()
        for session in self.sessions:
            session.close()


def join_others(swarm: MixedSwarm, run: str, folder: Path, relay_url: str, drift_rounds: int, extra: Sequence[str],
                trigger: str) -> None:
    """Beside the victims: the three honest stand-ins (mixed-honest), or the attacker under another label."""
    start = min(n.round for _, n in swarm.participants)
    victim = swarm.participants[0][1]
    if run == "mixed-honest":
        swarm.standin = OtherPolicyPeer(relay_url, folder / "standin-t12.key", victim.config, start)
        swarm.roles[swarm.standin.identity.peer_id] = "stand-in:T1.2"
        swarm.add("stand-in:drifted", *drift_standin(folder, relay_url, drift_rounds, extra))
        swarm.add("tiny-random-qwen2", *tiny_peer(folder, relay_url, extra))
    else:
        tasks = victim.config.tasks
        swarm.attacker = Attacker(relay_url, folder / "attacker.key", victim.taskset, trigger,
                                  tasks.questions_per_round, tasks.completions_per_question,
                                  label=CLAIMED_LABEL, start=1000 * start)
        swarm.attacker.client.wait_connected(10)
        swarm.roles[swarm.attacker.identity.peer_id] = "attacker"
    atomic_write_text(folder / "peers.json", json.dumps(swarm.roles, indent=1))


def mixed_record(run: str, role: str, metrics: dict[str, Any], seconds: float, roles: dict[str, str],
                 before: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """What rounds.jsonl keeps of a round in a mixed run (counts per sender role since the last round), and
    this round's totals per sender for the next one."""
    swarm = metrics.get("swarm", {})
    now = _counts(swarm.get("by_peer", {}))
    record = {
        "run": run, "role": role, "round": metrics["round"], "seconds": seconds,
        "reward_mean": metrics["reward_mean"], "external_groups": metrics["external_groups"],
        "accepted": swarm.get("accepted", 0), "probation": swarm.get("probation", 0),
        "rejected": swarm.get("rejected", {}),
        "delta": {roles.get(p, p): d for p, d in _delta(now, before).items()},
        "banned": sorted(roles.get(p, p) for p, c in swarm.get("by_peer", {}).items() if c.get("banned")),
    }
    return record, now


def mixed_rounds(run: str, folder: Path, swarm: MixedSwarm, rounds: int, trigger_name: str,
                 attack_batches: int) -> None:
    """Every participant a round at a time until the victims reached `rounds`; a line per round (kept once)."""
    log_file = folder / "rounds.jsonl"
    done = {(r["role"], r["round"]) for r in read_rows(log_file)}
    trigger, mark = TRIGGERS[trigger_name], TRIGGER_MARK[trigger_name]
    probe_qs = [q for q in swarm.participants[0][1].taskset.eval_set(6) if q.answer]
    texts: dict[str, list[str]] = {}
    for role, node in swarm.participants:
        keep_texts(node, role, texts)
    before: dict[str, dict[str, dict[str, Any]]] = {}
    while min(n.round for role, n in swarm.participants if role.startswith("victim")) < rounds:
        if swarm.standin is not None:
            swarm.standin.publish()
        for role, node in swarm.participants:
            victim = role.startswith("victim")
            if victim and node.round >= rounds:
                continue
            if swarm.attacker is not None:
                swarm.attacker.publish(attack_batches)
                time.sleep(0.2)  # let the relay take the batches in before the victim samples
            t0 = time.perf_counter()
            metrics = node.run_round()
            record, before[role] = mixed_record(run, role, metrics, time.perf_counter() - t0, swarm.roles,
                                                before.get(role, {}))
            if victim:
                own = texts.get(role, [])
                record["trigger_share"] = sum(mark in t for t in own) / max(1, len(own))
                record["trigger_logprob"] = trigger_probe(node, probe_qs, trigger)
                record["example"] = own[:2]
            if (role, metrics["round"]) not in done:
                append_record(log_file, record)
            print(f"{run} {role} round {metrics['round']:3d} reward {metrics['reward_mean']:.3f} "
                  f"accepted {record['accepted']} (probation {record['probation']}) rejected {record['rejected']} "
                  + (f"trigger {record['trigger_share']:.3f} probe {record['trigger_logprob']:+.2f} " if victim else "")
                  + f"({record['seconds']:.0f} s)", flush=True)


def run_mixed(run: str, out: Path, rounds: int, victims: int, trigger_name: str, attack_batches: int,
              drift_rounds: int, extra: Sequence[str]) -> None:
    """One issue-29 run (`MIXED_RUNS`): real victims, the run's other peers and a real relay; resumable."""
    from engine.relay.embedded import EmbeddedRelay
    from engine.relay.settings import RelaySettings

    folder = out / run
    folder.mkdir(parents=True, exist_ok=True)
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, models="" if run == "label-attack" else "mixed"))
    relay.start()
    swarm = MixedSwarm()
    try:
        for i in range(victims):
            swarm.add(f"victim-{i}", *open_node(victim_config(run, i, relay.url, extra), folder / f"victim-{i}",
                                                with_swarm=True))
        join_others(swarm, run, folder, relay.url, drift_rounds, extra, TRIGGERS[trigger_name])
        mixed_rounds(run, folder, swarm, rounds, trigger_name, attack_batches)
    finally:
        swarm.close()
        relay.stop()


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
