"""The paper's trainer's metric beside ours: the training batch's mean reward, under each definition it allows.

The public trainer the paper's swarm ran on (gensyn-ai/genrl,
`GRPOLanguageTrainerModule.step`) logs `train/rewards` as the mean reward of
the whole training batch: the node's own I groups and the J groups taken from
the swarm. That is not the node's own-rollout reward, which Sapling reports: a
swarm's groups raise it whether or not the node's own answers get better. The
paper's text says external rollouts with zero advantage were dropped before
sampling; the public code does not show that filter. So the batch mean is
computed under each definition the two allow (`DEFINITIONS`):

- own groups: "all" the I own groups of the batch, or only the "informative"
  ones among them (rewards that differ: a GRPO gradient);
- swarm groups: "all" the first J groups drawn and re-scored, whether their
  rewards differ or not (as the code reads), or only "informative" ones (as
  the text reads, and as Sapling trains: the groups it admitted).

A node-round's batch mean is the mean of its groups' mean rewards (every group
has the same G completions); a node-round whose batch is empty under a
definition counts 0 (the trainer logs nothing and learns nothing). A mix's
metric is the sum over its node-rounds; it is compared with 8/0 under the same
definition (8/0 has no swarm group) as the ratio of sums, with the
experiment's two-way bootstrap, seeds as strata.

The records come from the experiment (`batch_own`, `batch_external` and
`swarm_scored` in rounds.jsonl, written since the paper-metric runs of
2026-12-05); older records lack them, and are refused with a sentence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.experiment.plan import ROUNDS_FILE, parse_mixes, plan_with_mix, read_rounds, rounds_done

DEFINITIONS: tuple[tuple[str, str], ...] = (("all", "all"), ("all", "informative"), ("informative", "all"),
                                            ("informative", "informative"))
"""(own groups, swarm groups) kept in the batch: every combination the paper's text and its code allow."""

Bootstrap = Callable[[Sequence[tuple[list[list[float]], list[list[float]]]]], dict[str, Any]]


def batch_mean(record: dict[str, Any], node: int, external: int, own: str, peers: str) -> float:
    """Node `node`'s training-batch mean reward in one round record of a mix with J = `external`."""
    try:
        own_groups = record["batch_own"][node]
        drawn = record["swarm_scored"][node]
        admitted = record["batch_external"][node]
    except (KeyError, IndexError):
        raise ValueError(f"round {record.get('round')} was recorded without the training batch's groups "
                         "(batch_own, swarm_scored, batch_external): run the mix again with today's code.") from None
    groups = [mean for mean, informative in own_groups if own == "all" or informative]
    if peers == "all":
        groups += [mean for mean, _ in drawn[:external]]
    else:
        groups += [mean for mean, _ in admitted]
    return sum(groups) / len(groups) if groups else 0.0


def batch_table(records: Sequence[dict[str, Any]], nodes: Sequence[int], external: int, own: str,
                peers: str) -> list[list[float]]:
    """[node][round] of the training-batch mean under one definition."""
    return [[batch_mean(rec, k, external, own, peers) for rec in records] for k in nodes]


def _records(folder: Path, label: str) -> tuple[int, int, list[dict[str, Any]]]:
    """(nodes, J, the round records finished so far) of mix `label` in experiment folder `folder`."""
    mix = parse_mixes(label)[0]
    plan = plan_with_mix(folder, label)
    return plan.nodes, mix.external, read_rounds(folder / mix.slug / ROUNDS_FILE, rounds_done(folder / mix.slug))


def paper_metric(pairs: Sequence[tuple[Path, Path]], label: str, label_b: str, bootstrap: Bootstrap,
                 nodes: Sequence[int] | None = None) -> dict[str, Any]:
    """MIX in each A against MIX_B in its B (same seeds), under every definition: the ratio of the batch means'
    sums with its 95% interval, and each mix's mean batch reward a node-round."""
    result: dict[str, Any] = {"mix": label, "mix_b": label_b, "definitions": {}}
    tables: dict[tuple[str, str], list[tuple[list[list[float]], list[list[float]]]]] = {d: [] for d in DEFINITIONS}
    rounds = []
    for a_dir, b_dir in pairs:
        (count, j_a, recs_a), (count_b, j_b, recs_b) = _records(Path(a_dir), label), _records(Path(b_dir), label_b)
        if count != count_b:
            raise ValueError(f"{a_dir} and {b_dir} have {count} and {count_b} nodes; they do not pair.")
        common = min(len(recs_a), len(recs_b))
        if common == 0:
            raise ValueError(f"{a_dir} ({label}) and {b_dir} ({label_b}) have no finished round in common.")
        rows = list(range(count)) if nodes is None else list(nodes)
        rounds.append(common)
        for own, peers in DEFINITIONS:
            tables[(own, peers)].append((batch_table(recs_a[:common], rows, j_a, own, peers),
                                         batch_table(recs_b[:common], rows, j_b, own, peers)))
    for (own, peers), strata in tables.items():
        cells = sum(len(a) * len(a[0]) for a, _ in strata)
        result["definitions"][f"own {own}, swarm {peers}"] = {
            "mean_a": sum(sum(map(sum, a)) for a, _ in strata) / cells,
            "mean_b": sum(sum(map(sum, b)) for _, b in strata) / cells,
            **{k: v for k, v in bootstrap(strata).items() if k in ("ratio", "ratio_ci95")},
        }
    result["rounds"] = rounds
    return result
