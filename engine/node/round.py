"""One round of a node, read top to bottom: the order lives here, the work in the rooms it calls.

`Node.run_round` (engine/node/loop.py) runs `run_round(node)`; the node keeps the state and the pieces
(the policy, the task set, the curriculum, the exchange, the metrics log). A round:

1. draw the questions: reseed sampling from (seed, round), re-asks first, the rest at the curriculum's
   levels (questions/frontier, questions/curriculum; `Node.start_round`);
2. generate G completions for each with the policy, behaviour log-probs kept; with tasks.probe_answers,
   k answers for every drawn question first, then the rest for the chosen ones only (backends/,
   questions/probe);
3. score every completion with its task's verifier and group the advantages (questions/tasks,
   rollouts/groups; `Node.score`);
4. pick SAPO's I: the own groups that go into the batch (`Node.own_groups`);
5. publish the groups, sample J of the swarm's and verify them here (swarm/exchange, swarm/defence;
   `Node.share_and_sample`);
6. train one GRPO step on the mix, I own + J swarm (the backend's loss, backends/loss; `Node.learn`);
7. checkpoint, let the curriculum, the temperature and the re-asks follow the round, append its metrics
   and emit its events (node/checkpoint, node/metrics; `Node.finish_round`).

engine/experiment/batched_round.py runs the same steps for several nodes at once, through the same methods.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from engine.backends import PolicyBackend, PromptCache
from engine.backends.base import Completion
from engine.common.config import NodeConfig
from engine.node.seeds import derive_seed
from engine.questions.probe import PROBE_SEED_SLOT, interleave, kept
from engine.questions.tasks import Question
from engine.rollouts.groups import Group


class RoundNode(Protocol):
    """What a round needs of its node (engine/node/loop.py's `Node`): its settings and its steps."""

    config: NodeConfig

    @property
    def temperature(self) -> float: ...
    def _backend(self) -> PolicyBackend: ...
    def _step(self, phase: str) -> Callable[[int, int], None]: ...
    def start_round(self) -> tuple[int, list[Question], list[list[int]]]: ...
    def choose_probed(self, questions: Sequence[Question], probes: Sequence[Completion]) -> list[int]: ...
    def score(self, questions: Sequence[Question], prompt_ids: Sequence[list[int]],
              completions: Sequence[Completion]) -> list[Group]: ...
    def own_groups(self, round_index: int, groups: list[Group]) -> list[Group]: ...
    def share_and_sample(self, round_index: int,
                         groups: Sequence[Group]) -> tuple[list[Group], dict[str, Any] | None]: ...
    def learn(self, groups: Sequence[Group]) -> dict[str, float]: ...
    def finish_round(self, round_index: int, groups: list[Group], external: list[Group], stats: dict[str, float],
                     swarm_report: dict[str, Any] | None, gen_seconds: float, train_seconds: float,
                     seconds: float) -> dict[str, Any]: ...


def run_round(node: RoundNode) -> dict[str, Any]:
    """One round, steps 1 to 7 above; returns the round's metrics (the line metrics.jsonl gets)."""
    t0 = time.perf_counter()
    # 1. draw: which questions this round asks, deterministic from (seed, round)
    round_index, questions, prompt_ids = node.start_round()
    # 2. generate: the policy answers them, keeping the log-probs the loss needs
    questions, prompt_ids, completions = generate(node, round_index, questions, prompt_ids)
    gen_seconds = time.perf_counter() - t0
    # 3. score: each answer's reward from its verifier, the advantages within each question's group
    groups = node.score(questions, prompt_ids, completions)
    # 4. I: the own groups this node trains on
    mine = node.own_groups(round_index, groups)
    # 5. J: ours out to the swarm, the swarm's in, each re-verified and re-scored here
    external, swarm_report = node.share_and_sample(round_index, groups)
    # 6. train: one GRPO step on I + J
    t1 = time.perf_counter()
    stats = node.learn(mine + external)
    train_seconds = time.perf_counter() - t1
    # 7. keep and tell: checkpoint, follow the round, metrics.jsonl, the checkpoint and round events
    return node.finish_round(round_index, groups, external, stats, swarm_report,
                             gen_seconds, train_seconds, time.perf_counter() - t0)


def generate(node: RoundNode, round_index: int, questions: list[Question],
             prompt_ids: list[list[int]]) -> tuple[list[Question], list[list[int]], list[Completion]]:
    """G completions per question, in order: (the questions kept, their prompts, the completions)."""
    tasks = node.config.tasks
    backend = node._backend()
    if tasks.probe_answers:  # probing keeps only questions_per_round of the drawn ones
        return _probe_then_complete(node, backend, round_index, questions, prompt_ids)
    completions = backend.generate(prompt_ids, tasks.completions_per_question, tasks.max_new_tokens,
                                   node.temperature, node._step("generating"))
    return questions, prompt_ids, completions


def _probe_then_complete(node: RoundNode, backend: PolicyBackend, round_index: int, questions: list[Question],
                         prompt_ids: list[list[int]]) -> tuple[list[Question], list[list[int]], list[Completion]]:
    """tasks.probe_answers: k answers for every drawn question, then the other G - k for the chosen ones."""
    cfg = node.config
    G, k = cfg.tasks.completions_per_question, cfg.tasks.probe_answers
    read = PromptCache()  # the chosen prompts are not read again for the rest of their answers
    probes = backend.generate(prompt_ids, k, cfg.tasks.max_new_tokens, node.temperature,
                              node._step("probing"), read)
    chosen = node.choose_probed(questions, probes)  # those whose answers scored differently first (probe.py)
    questions, prompt_ids = [questions[i] for i in chosen], [prompt_ids[i] for i in chosen]
    backend.reseed(derive_seed(cfg.run.seed, round_index, PROBE_SEED_SLOT))  # the rest replays exactly
    rest = backend.generate(prompt_ids, G - k, cfg.tasks.max_new_tokens, node.temperature,
                            node._step("generating"), read)
    del read  # the prompts' keys and values (on the model's device) are not kept through training
    return questions, prompt_ids, interleave(kept(probes, chosen, k), rest, len(chosen))
