"""One round of every simulated node of a mix, batched over the shared model, each node timed as if alone.

The experiment's nodes share one frozen base (engine/experiment/nodes.py), so a round's generation for all of
them is one batch in which each row uses its own node's adapter, seed and temperature
(`TorchBackend.generate_with_adapters`). Then every node takes its own steps in turn, the loop's own (`Node`:
score, publish, sample and admit, learn, finish), and the round's record says what each node got and what its
own computer would have paid (engine/experiment/hours.py's `NodeClock`).

This is its own room because it is the one place where the nodes' rounds are interleaved and charged: the runner
(engine/experiment/runner.py) decides which rounds run, where and from which checkpoint; this module runs one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from engine.backends import PromptCache
from engine.common.config import NodeConfig
from engine.experiment.hours import NodeClock
from engine.experiment.nodes import NodeBackend
from engine.experiment.plan import Mix
from engine.node.loop import Node, derive_seed
from engine.questions.probe import PROBE_SEED_SLOT, interleave, kept
from engine.rollouts.groups import Group, trained_groups

if TYPE_CHECKING:
    from engine.backends.base import Completion
    from engine.questions.tasks import Question

log = logging.getLogger(__name__)

PUBLISH_WAIT_S = 30.0

Progress = Callable[[str, int, int], None]


def batched_round(shared: Any, config: NodeConfig, mix: Mix, round_index: int, nodes: list[Node],
                  views: list[NodeBackend], relay: Any, progress: Progress, machine: str) -> dict[str, Any]:
    """Round r of every node of the mix: one batched generation, then each node's own steps in turn.

    Each node is charged the seconds it would spend on its own computer
    (`node_seconds`): its share of the batched generation, in proportion to
    the tokens of its rows (prompts once, completions), plus its own scoring,
    publishing, sampling and admission, training and checkpoint, each timed
    alone. The wait for the relay to store everyone's batches is shared
    equally. One batch for all nodes is cheaper per row than a node's own
    smaller batch, so generation is charged a little less than a node alone
    pays; that favours the mixes that train more, never the node alone.

    shared: the experiment's `TorchBackend`; config: the experiment's settings; progress: called with
    (phase, done, total) while the batch generates; machine: what the round is timed on (hours.machine_tag).
    """
    cfg = config
    G = cfg.tasks.completions_per_question
    t0, c0 = time.perf_counter(), time.process_time()
    drawn = [node.start_round() for node in nodes]
    if any(r != round_index for r, _, _ in drawn):
        raise RuntimeError("nodes out of step")
    tokens = [sum(map(len, ps)) for _, _, ps in drawn]  # each node's prompts once, then every answer's tokens
    probe = cfg.tasks.probe_answers
    heat = [node.temperature for node in nodes] if any(node.heat for node in nodes) else None  # questions/heat.py
    read = PromptCache() if probe else None  # probing: a kept prompt is not read again for its other answers
    if probe:  # tasks.probe_answers: k answers of every drawn question, then each node completes its chosen ones
        probes = generate_batched(shared, cfg, drawn, views, probe,
                                  [derive_seed(n.config.run.seed, round_index) for n in nodes], "probing", heat, read,
                                  progress)
        for k, (node, (r, questions, node_prompts), rows) in enumerate(zip(nodes, drawn, probes, strict=True)):
            tokens[k] += sum(len(c.token_ids) for c in rows)
            chosen = node.choose_probed(questions, rows)
            drawn[k] = (r, [questions[i] for i in chosen], [node_prompts[i] for i in chosen])
            probes[k] = kept(rows, chosen, probe)
    rest = generate_batched(shared, cfg, drawn, views, G - probe,
                            [derive_seed(n.config.run.seed, round_index, *((PROBE_SEED_SLOT,) if probe else ()))
                             for n in nodes], "generating", heat, read, progress)
    del read  # the prompts' keys and values (on the model's device) are not kept through training
    gen_seconds, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
    clock = NodeClock(len(nodes))
    groups: list[list[Group]] = []
    for k, (node, (_, questions, node_prompts), rows) in enumerate(zip(nodes, drawn, rest, strict=True)):
        tokens[k] += sum(len(c.token_ids) for c in rows)
        if probe:  # each question's G answers: its probes, then the rest
            rows = interleave(probes[k], rows, len(questions))
        with clock.timing(k):
            groups.append(node.score(questions, node_prompts, rows))
    clock.share(gen_seconds, tokens, "generate", gen_cpu)

    # Share: everyone publishes round r, the relay has stored it all, then each samples in turn.
    t_share = time.perf_counter()
    if mix.external:
        before = relay.relay.metrics["publishes"]
        publishing = [node.publishes() for node in nodes]  # none held back by its temperature (questions/heat.py)
        for k, (node, own) in enumerate(zip(nodes, groups, strict=True)):
            with clock.timing(k):
                if publishing[k] and node.exchange is not None:
                    node.exchange.publish(round_index, own)
        t_wait, c_wait = time.perf_counter(), time.process_time()
        wait_published(relay, before + sum(publishing), len(nodes))
        clock.share(time.perf_counter() - t_wait, [1] * len(nodes), cpu=time.process_time() - c_wait)
        _seed_relay_sampling(relay, derive_seed(cfg.run.seed, round_index, 3))
    shared_groups = []
    for k, (node, own) in enumerate(zip(nodes, groups, strict=True)):
        with clock.timing(k):
            shared_groups.append(node.share_and_sample(round_index, own))
    share_seconds = time.perf_counter() - t_share

    t_train = time.perf_counter()
    stats = []
    for k, (node, own, (external, _report)) in enumerate(zip(nodes, groups, shared_groups, strict=True)):
        with clock.timing(k, "train"):
            stats.append(node.learn(node.own_groups(round_index, own) + external))
    train_seconds = time.perf_counter() - t_train
    metrics = []
    for k, (node, own, (external, report), st) in enumerate(zip(nodes, groups, shared_groups, stats, strict=True)):
        with clock.timing(k):
            metrics.append(node.finish_round(round_index, own, external, st, report, clock.parts["generate"][k],
                                             clock.parts["train"][k], clock.total(k)))
    seconds = time.perf_counter() - t0
    return {
        "round": round_index,
        "mix": mix.label,
        "rewards": [m["reward_mean"] for m in metrics],
        "accuracy": [m["accuracy"] for m in metrics],
        "external_groups": [m["external_groups"] for m in metrics],
        "informative_groups": [m["informative_groups"] for m in metrics],
        "trained_own_informative": [len(trained_groups(node.own_groups(round_index, own), cfg.grpo.train_on))
                                    for node, own in zip(nodes, groups, strict=True)],
        "reasked": [m.get("reasked", 0) for m in metrics],  # own questions asked again (tasks.reask_share)
        "reasked_informative": [m.get("reasked_informative", 0) for m in metrics],
        "peer_asked": [m.get("peer_asked", 0) for m in metrics],  # peers' teaching questions (swarm.peer_questions)
        "peer_asked_informative": [m.get("peer_asked_informative", 0) for m in metrics],
        "swarm_reward_mean": [m["swarm_reward_mean"] for m in metrics],
        # The training batch group by group, [mean reward, informative], own then the swarm's, and every swarm
        # group re-scored in draw order: the batch means the paper's trainer logs (batch_mean.py)
        "batch_own": [_group_means(node.own_groups(round_index, own)) for node, own in zip(nodes, groups,
                                                                                           strict=True)],
        "batch_external": [_group_means(external) for external, _ in shared_groups],
        "swarm_scored": [(report or {}).get("scored", []) for _, report in shared_groups],
        "rejected": [m.get("swarm", {}).get("rejected", {}) for m in metrics],
        "loss": [m.get("loss", 0.0) for m in metrics],
        "clip_fraction": [m.get("clip_fraction", 0.0) for m in metrics],
        "generate_seconds": gen_seconds,
        "share_seconds": share_seconds,
        "train_seconds": train_seconds,
        "seconds": seconds,
        "node_seconds": [clock.total(k) for k in range(len(nodes))],
        "node_cpu_seconds": [clock.cpu[k] for k in range(len(nodes))],  # the CPU clock (hours.py)
        "node_generate_seconds": clock.parts["generate"],
        "node_train_seconds": clock.parts["train"],
        "machine": machine,
    }


def generate_batched(shared: Any, config: NodeConfig, drawn: Sequence[tuple[int, list[Question], list[list[int]]]],
                     views: Sequence[NodeBackend], n: int, seeds: Sequence[int], phase: str,
                     heats: Sequence[float] | None, read: PromptCache | None,
                     progress: Progress) -> list[list[Completion]]:
    """n answers of each node's prompts, in one batch with each node's adapter, seed and temperature (heats; None:
    tasks.temperature), prompts in `read` not read again; each node's answers, grouped by prompt."""
    cfg = config
    prompts = [p for _, _, ps in drawn for p in ps]
    index = [k for k, (_, _, ps) in enumerate(drawn) for _ in ps]
    rows = shared.generate_with_adapters(
        prompts, n, cfg.tasks.max_new_tokens, cfg.tasks.temperature, [v.lora() for v in views], index,
        seeds=seeds, on_step=lambda done, total: progress(phase, done, total),
        temperatures=[heats[k] for k in index] if heats is not None else None, prompt_cache=read,
    )
    per_node, start = [], 0
    for _, _, ps in drawn:
        per_node.append(rows[start : start + len(ps) * n])
        start += len(ps) * n
    return per_node


def wait_published(relay: Any, expected: int, nodes: int) -> None:
    """Until the relay has stored every node's batch of this round (publishing does not wait for the ack)."""
    deadline = time.monotonic() + PUBLISH_WAIT_S
    while relay.relay.metrics["publishes"] < expected:
        if time.monotonic() > deadline:
            log.warning("The relay stored %d of %d batches this round; sampling what is there.",
                        relay.relay.metrics["publishes"] - expected + nodes, nodes)
            return
        time.sleep(0.01)


def _group_means(groups: Sequence[Group]) -> list[list[Any]]:
    return [[round(sum(g.rewards) / len(g.rewards), 4), g.informative] for g in groups]


def _seed_relay_sampling(relay: Any, seed: int) -> None:
    """Make the relay's random pick of batches reproducible for this round.

    The in-memory window draws batches with its own `random.Random`; nodes
    sample one after another from this thread, so one seed per round makes
    every node's draw the same in a resumed run as in an uninterrupted one.
    """
    window = getattr(getattr(relay.relay, "broker", None), "window", None)
    rng = getattr(window, "_rng", None)
    if rng is None:
        log.warning("The relay's sampler could not be seeded; external draws will not repeat exactly.")
        return
    rng.seed(seed)
