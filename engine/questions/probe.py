"""Probing (tasks.probe_answers = k): a round samples k answers of every drawn question first, then completes
to G answers only the questions_per_round it keeps, so a question whose answers agree costs k answers, not G.

Which it keeps: re-asked questions first (engine/questions/frontier.py: they taught before), then those whose k answers
scored differently (their group is sure to teach), then the rest in the order drawn. The rest of the answers
are sampled with the round's own seed slot (`PROBE_SEED_SLOT`), so a run replays exactly. The node
(engine/node/loop.py) and the experiment (engine/experiment/runner.py, every node in one batch) share these steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from engine.questions.tasks import Question


class Answer(Protocol):
    """What probing reads of an answer (engine/backends/base.py's `Completion`): its text."""

    text: str


A = TypeVar("A", bound=Answer)

# derive_seed slots of a round: 1 own-group pick, 2 swarm sampling, 3 the experiment relay's sampling, 4 the
# answers after the probes
PROBE_SEED_SLOT = 4


def choose(questions: Sequence[Question], probes: Sequence[Answer], reward: Callable[[Any, str], float],
           keep: int, group_size: int, reasked_first: int = 0) -> tuple[list[int], dict[str, int]]:
    """The indices of the questions to complete (in the order drawn) from k probe answers of each (grouped by
    question), and the round's report: questions probed, how many had answers that scored differently, and the
    answers generated in all."""
    k = len(probes) // len(questions)
    scores = [[reward(q, c.text) for c in probes[i * k : (i + 1) * k]] for i, q in enumerate(questions)]
    differ = [i for i in range(reasked_first, len(questions)) if len(set(scores[i])) > 1]
    agree = [i for i in range(reasked_first, len(questions)) if len(set(scores[i])) <= 1]
    chosen = sorted([*range(reasked_first), *differ, *agree][:keep])
    report = {"probed": len(questions), "probe_differ": len(differ),
              "answers": len(questions) * k + len(chosen) * (group_size - k)}
    return chosen, report


def kept(probes: Sequence[A], chosen: Sequence[int], k: int) -> list[A]:
    """The k probe answers of each chosen question (probes grouped by question, in the order drawn)."""
    return [c for i in chosen for c in probes[i * k : (i + 1) * k]]


def interleave(probes: Sequence[A], rest: Sequence[A], groups: int) -> list[A]:
    """Each group's answers, its probes then the rest: both lists hold the same groups in the same order."""
    k, m = len(probes) // groups, len(rest) // groups
    return [c for j in range(groups) for c in [*probes[j * k : (j + 1) * k], *rest[j * m : (j + 1) * m]]]
