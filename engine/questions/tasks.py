"""ReasoningGYM behind a small, deterministic interface: refs, questions, rewards.

A question is *named* by a `TaskRef` (dataset, config, seed, index). Any node can
rebuild exactly the same question text and answer from that name and score a
completion itself, so a node never has to trust a peer's reward: it re-scores.

    taskset = TaskSet({"basic_arithmetic": 1.0, "bf": 0.5}, seed=0)
    questions = taskset.draw(round_index=1, n=4)          # training questions
    reward = taskset.reward(questions[0], "<answer>7</answer>")
    same = TaskSet({"bf": 1.0}).rebuild(questions[0].ref)  # identical question

Peers are not trusted, so a ref is validated before anything is built from it:
only the nine SAPO specialties, only known config keys, and every size-driving
value capped (`engine.questions.configs`) so that one rebuild stays well under a second and
no value can reach code that reasoning-gym evaluates. Scoring caps the
completion length and screens answers for datasets whose scorer calls eval().

What is not covered: nodes running different reasoning-gym versions may build
different text from the same ref (the ref names the question, not the version).

Tests: .venv/bin/python -m pytest tests/engine/test_tasks.py -q
"""

from __future__ import annotations

import contextlib
import decimal
import io
import json
import logging
import math
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS as _RG_REGISTRY
from reasoning_gym.utils import extract_answer

from engine.common.errors import TaskError
from engine.common.presets import SAPO_SPECIALTIES
from engine.common.rules import MAX_COMPLETION_CHARS, stable_seed
from engine.questions.configs import DEFAULT_DATASET_CONFIGS, MAX_CONFIG_STRING, canonical_config, check_config

log = logging.getLogger(__name__)


MAX_TASK_INDEX = 10**9
"""Refs name items 0 .. MAX_TASK_INDEX - 1; also the virtual size handed to reasoning-gym."""
MAX_SEED = 2**63 - 1
EVAL_SEED_OFFSET = 1_000_000_007
"""Added to the train seed for the held-out set; >= MAX_TASK_INDEX, see `TaskSet.eval_set`."""
MAX_DRAW_SIZE = 1024
"""Most questions one `draw()` may return; also the index stride between rounds."""
MAX_EVAL_SIZE = 100_000
# MAX_COMPLETION_CHARS (the wire's limit, engine.common.rules): longer completions score
# 0.0 (rejected, not truncated): cutting one could change which <answer> tag is last, and
# answer extraction is quadratic in the worst case.
DATASET_CACHE_SIZE = 64

SYSTEM_PROMPT = "Give only the final answer inside <answer></answer> tags."
# One worked example of the same specialty precedes each question (see TaskSet.messages).
EXAMPLE_SEED_OFFSET = 2 * EVAL_SEED_OFFSET
EXAMPLE_POOL = 64
# Questions longer than this carry their own worked examples (arc_1d) or are long
# enough that a second copy would double the round's cost; they get no extra example.
EXAMPLE_MAX_QUESTION_CHARS = 520

# binary_matrix's scorer eval()s the answer to accept a Python list of lists. Answers
# reach it only if made of digits, whitespace, brackets and commas: nothing callable
# can be spelled with those. Any other answer cannot equal its oracle and scores 0.0.
_ANSWER_GUARDS: Mapping[str, re.Pattern[str]] = MappingProxyType({"binary_matrix": re.compile(r"[0-9\s\[\],]*")})

# What reasoning-gym raises when a config or an answer is one it cannot handle.
_RG_CONFIG_ERRORS = (AssertionError, TypeError, ValueError)
_RG_ITEM_ERRORS = (ArithmeticError, AssertionError, IndexError, KeyError, OverflowError, TypeError, ValueError)
_RG_SCORE_ERRORS = (ArithmeticError, AttributeError, IndexError, KeyError, RecursionError, TypeError, ValueError)

# reasoning-gym keeps process-wide state while it builds items (bf's compiler keeps
# module-level tables and prints to sys.stdout, which we swap for a buffer). This lock
# serialises that across every TaskSet and thread; it guards *their* globals, and holds
# no state of ours.
_RG_PROCESS_LOCK = threading.Lock()


def _check_whole(what: str, value: object, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TaskError(f"The {what} must be a whole number, not {type(value).__name__}.")
    if not 0 <= value <= hi:
        raise TaskError(f"The {what} must be between 0 and {hi}; got {value}.")
    return value


# -- names and questions -----------------------------------------------------------------


@dataclass(frozen=True)
class TaskRef:
    """The name of one question; valid by construction (raises TaskError otherwise)."""

    dataset: str
    config: tuple[tuple[str, Any], ...]
    seed: int
    index: int

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or self.dataset not in SAPO_SPECIALTIES:
            raise TaskError(
                f"Unknown dataset {str(self.dataset)[:MAX_CONFIG_STRING]!r}; allowed: {', '.join(SAPO_SPECIALTIES)}."
            )
        check_config(self.dataset, self.config)
        _check_whole("task seed", self.seed, MAX_SEED)
        _check_whole("task index", self.index, MAX_TASK_INDEX - 1)

    @classmethod
    def create(cls, dataset: str, config: Mapping[str, Any], seed: int, index: int) -> TaskRef:
        """Build a ref from a plain config mapping (lists allowed; sorted here)."""
        if not isinstance(dataset, str) or dataset not in SAPO_SPECIALTIES:
            raise TaskError(
                f"Unknown dataset {str(dataset)[:MAX_CONFIG_STRING]!r}; allowed: {', '.join(SAPO_SPECIALTIES)}."
            )
        return cls(dataset, canonical_config(dataset, config), seed, index)

    def to_json(self) -> dict[str, Any]:
        config = {key: list(value) if isinstance(value, tuple) else value for key, value in self.config}
        return {"dataset": self.dataset, "config": config, "seed": self.seed, "index": self.index}

    @classmethod
    def from_json(cls, data: object) -> TaskRef:
        """Parse a ref received from anywhere; anything malformed raises TaskError."""
        if not isinstance(data, dict):
            raise TaskError(f"A task ref must be a JSON object, not {type(data).__name__}.")
        expected = {"dataset", "config", "seed", "index"}
        if set(data) != expected:
            raise TaskError(f"A task ref must have exactly the fields {', '.join(sorted(expected))}.")
        dataset, config = data["dataset"], data["config"]
        if not isinstance(dataset, str):
            raise TaskError("A task ref's dataset must be a string.")
        if not isinstance(config, dict):
            raise TaskError("A task ref's config must be a JSON object.")
        return cls.create(dataset, config, data["seed"], data["index"])

    def key(self) -> str:
        """Canonical compact id, equal for equal refs: use it for dedup and logs."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class Question:
    """One rebuilt question. `entry` is reasoning-gym's raw item; treat it as read-only."""

    ref: TaskRef
    text: str
    answer: str | None
    entry: Mapping[str, Any] = field(compare=False, repr=False)

    def messages(self) -> list[dict[str, str]]:
        """The bare prompt: instructions and the question (no worked example)."""
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.text}]

    @property
    def reference_answer(self) -> str | None:
        """An answer that scores 1.0: the dataset's, or its stored example (propositional_logic)."""
        if self.answer is not None:
            return self.answer
        example = (self.entry.get("metadata") or {}).get("example_answer")
        return example if isinstance(example, str) else None


# -- the task set ------------------------------------------------------------------------


class TaskSet:
    """The specialties a node trains on, their configs, and local scoring."""

    def __init__(
        self,
        weights: Mapping[str, float],
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        seed: int = 0,
    ) -> None:
        allowed = ", ".join(SAPO_SPECIALTIES)
        if not isinstance(weights, Mapping):
            raise TaskError(f"Specialty weights must be a table of name = weight; allowed names: {allowed}.")
        for name, weight in weights.items():
            if name not in SAPO_SPECIALTIES:
                raise TaskError(f"Unknown specialty {str(name)[:MAX_CONFIG_STRING]!r}; allowed: {allowed}.")
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not math.isfinite(weight)
                or weight < 0
            ):
                raise TaskError(f"The weight of specialty {name} must be a number of 0 or more; got {weight!r}.")
        enabled = tuple(name for name in SAPO_SPECIALTIES if weights.get(name, 0) > 0)
        if not enabled:
            raise TaskError(f"At least one specialty needs a weight above 0; allowed: {allowed}.")
        overrides = configs if configs is not None else {}
        if not isinstance(overrides, Mapping):
            raise TaskError("Dataset configs must be a table of specialty = {option = value}.")
        for name in overrides:
            if name not in SAPO_SPECIALTIES:
                raise TaskError(
                    f"Config given for unknown specialty {str(name)[:MAX_CONFIG_STRING]!r}; allowed: {allowed}."
                )
        self.seed = _check_whole("train seed", seed, MAX_SEED - EVAL_SEED_OFFSET)
        self._specialties = enabled
        self._weights = tuple(float(weights[name]) for name in enabled)
        self._configs: dict[str, tuple[tuple[str, Any], ...]] = {}
        for name in sorted(set(enabled) | set(overrides)):
            merged = {**DEFAULT_DATASET_CONFIGS[name], **overrides.get(name, {})}
            config = canonical_config(name, merged)
            _validate_with_rg(name, config)
            if name in enabled:
                self._configs[name] = config
        self._datasets: OrderedDict[tuple[str, tuple[tuple[str, Any], ...], int], ProceduralDataset] = OrderedDict()
        self._cache_lock = threading.Lock()

    @property
    def specialties(self) -> tuple[str, ...]:
        """Enabled specialties (weight > 0), in SAPO_SPECIALTIES order."""
        return self._specialties

    def config(self, specialty: str) -> Mapping[str, Any]:
        """The merged reasoning-gym config this node uses for an enabled specialty."""
        if specialty not in self._configs:
            raise TaskError(f"Specialty {specialty!r} is not enabled here; enabled: {', '.join(self._specialties)}.")
        return MappingProxyType(dict(self._configs[specialty]))

    def rebuild(self, ref: TaskRef) -> Question:
        """The question a ref names: same text and answer on every node, every time."""
        if not isinstance(ref, TaskRef):
            raise TaskError(f"Expected a TaskRef, got {type(ref).__name__}.")
        dataset = self._dataset(ref)
        captured = io.StringIO()
        with _RG_PROCESS_LOCK, decimal.localcontext(decimal.Context()), contextlib.redirect_stdout(captured):
            try:
                entry = dataset[ref.index]
            except _RG_ITEM_ERRORS as exc:
                raise TaskError(f"reasoning-gym could not build {ref.dataset} item {ref.index}: {exc}") from exc
        if captured.getvalue():
            log.debug("reasoning-gym printed %d characters while building %s", len(captured.getvalue()), ref.key())
        answer = entry["answer"]
        return Question(
            ref=ref, text=str(entry["question"]), answer=None if answer is None else str(answer), entry=entry
        )

    def rebuild_sent(self, ref: object) -> Question:
        """The question a task reference received as JSON names (a peer's item): `TaskRef.from_json`, then
        `rebuild`. Anything malformed raises TaskError. The swarm's exchange calls this, so that it needs no
        TaskRef of its own."""
        return self.rebuild(TaskRef.from_json(ref))

    def draw(
        self,
        round_index: int,
        n: int,
        weights: Mapping[str, float] | None = None,
        configs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[Question]:
        """n training questions for a round; the same (seed, round, n) always gives the same list.

        The specialties are drawn by systematic (stratified) sampling: slot s takes the
        specialty at position (u + s) / n of the cumulative weights, with u drawn from a
        stable hash of (seed, round). Every round then holds each specialty within one
        slot of its weighted share, so round rewards are comparable across rounds
        instead of swinging with the mix (docs/results.md). Slot s takes index
        r * MAX_DRAW_SIZE + s, so no two rounds share an index whatever n is.

        A curriculum (engine/questions/curriculum.py) passes its own `weights` (one per
        enabled specialty) and `configs` (any of them) for this draw; without
        them the draw is this set's own.
        """
        _check_whole("number of questions to draw", n, MAX_DRAW_SIZE)
        last_round = (MAX_TASK_INDEX - 1) // MAX_DRAW_SIZE - 1
        _check_whole("round index", round_index, last_round)
        if n == 0:
            return []
        shares = self._weights if weights is None else self._shares(weights)
        chosen = self._with_configs(configs)
        rng = random.Random(stable_seed("draw", self.seed, round_index))
        total = sum(shares)
        offset = rng.random()
        names = []
        for slot in range(n):
            target = (offset + slot) / n * total
            acc = 0.0
            pick = self._specialties[-1]
            for name, weight in zip(self._specialties, shares, strict=True):
                acc += weight
                if target < acc:
                    pick = name
                    break
            names.append(pick)
        rng.shuffle(names)
        questions = []
        for slot, name in enumerate(names):
            ref = TaskRef(name, chosen[name], self.seed, round_index * MAX_DRAW_SIZE + slot)
            questions.append(self.rebuild(ref))
        return questions

    def _shares(self, weights: Mapping[str, float]) -> tuple[float, ...]:
        """A curriculum's weights in the order of `specialties`; each must be a positive number."""
        shares = tuple(weights.get(name, 0.0) for name in self._specialties)
        if not all(isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w > 0
                   for w in shares):
            raise TaskError(f"A draw's weights must give each of {', '.join(self._specialties)} a positive number.")
        return tuple(float(w) for w in shares)

    def _with_configs(self, configs: Mapping[str, Mapping[str, Any]] | None) -> dict[str, tuple[tuple[str, Any], ...]]:
        """This set's configs, with `configs` in place of those it names (canonical, checked)."""
        if configs is None:
            return self._configs
        return {name: canonical_config(name, configs[name]) if name in configs else own
                for name, own in self._configs.items()}

    def eval_messages(self, question: Question) -> list[dict[str, str]]:
        """The held-out prompt: as `messages`, with one worked example per specialty for the whole set.

        The example is part of the test, like its questions: fixed, it measures
        the checkpoint on the question and nothing else. And every held-out
        prompt of a specialty then begins with the same tokens, which the decoder
        computes once for all of them (`decode_batch` shares common prefixes):
        the example is about half of a held-out prompt's tokens, and the prompt
        pass a third or more of an evaluation's time (docs/results.md, "Rollout speed").
        """
        return self.messages(question, example_index=0)

    def messages(self, question: Question, example_index: int | None = None) -> list[dict[str, str]]:
        """The chat prompt this node uses: one solved example of the same specialty, then the question.

        Small models (the bundled 135M) rarely use the <answer> format from an
        instruction alone; a worked example of the same task raises the share
        of well-formed answers about threefold (docs/results.md). The example
        is drawn from its own seed stream, so it is never a training or
        held-out item.

        The example is a function of the question's reference alone (its seed
        and index), not of this node: a receiver rebuilds exactly the prompt a
        peer wrote its completions under. A peer's text is then judged
        (plausibility) and weighed (behaviour log-probs) in the context it was
        written in; judged under the receiver's own example, honest text that
        echoed the peer's example looked improbable (docs/results.md,
        Poisoning).
        """
        ref = question.ref
        if len(question.text) > EXAMPLE_MAX_QUESTION_CHARS:
            return question.messages()
        example_seed = (ref.seed + EXAMPLE_SEED_OFFSET) % (MAX_SEED + 1)
        index = ref.index % EXAMPLE_POOL if example_index is None else example_index % EXAMPLE_POOL
        example = self.rebuild(TaskRef(ref.dataset, ref.config, example_seed, index))
        answer = example.reference_answer
        if answer is None:
            return question.messages()
        system, user = question.messages()
        return [
            system,
            {"role": "user", "content": example.text},
            {"role": "assistant", "content": f"<answer>{answer}</answer>"},
            user,
        ]

    def eval_set(self, n: int, configs: Mapping[str, Mapping[str, Any]] | None = None) -> list[Question]:
        """A fixed held-out set: item i is specialty i % k at index i // k (k enabled specialties).

        It uses seed `self.seed + EVAL_SEED_OFFSET`. reasoning-gym builds item (seed, index)
        from Random(seed + index); training items use Random(self.seed + index) with
        index < MAX_TASK_INDEX <= EVAL_SEED_OFFSET, so no held-out item can share its
        random stream with a training item of this seed. `configs` replace this set's
        own for the specialties they name (the harder held-out set, engine/questions/curriculum.py).
        """
        _check_whole("number of held-out questions", n, MAX_EVAL_SIZE)
        seed = self.seed + EVAL_SEED_OFFSET
        k = len(self._specialties)
        chosen = self._with_configs(configs)
        refs = [TaskRef(self._specialties[i % k], chosen[self._specialties[i % k]], seed, i // k) for i in range(n)]
        return [self.rebuild(ref) for ref in refs]

    def reward(self, question: Question, completion: str) -> float:
        """The dataset's own score of the last <answer>...</answer>, in [0, 1].

        No tag, or a completion over MAX_COMPLETION_CHARS, scores 0.0. An answer the
        dataset's scorer raises on is the dataset rejecting it: 0.0, logged at debug.
        """
        if len(completion) > MAX_COMPLETION_CHARS:
            log.debug("completion of %d characters scores 0.0 (limit %d)", len(completion), MAX_COMPLETION_CHARS)
            return 0.0
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        ref = question.ref
        guard = _ANSWER_GUARDS.get(ref.dataset)
        if guard is not None and guard.fullmatch(answer) is None:
            return 0.0
        dataset = self._dataset(ref)
        entry = dict(question.entry)
        with decimal.localcontext(decimal.Context()):
            try:
                score = dataset.score_answer(answer, entry)
            except _RG_SCORE_ERRORS as exc:
                log.debug("%s rejected an answer to %s: %r", ref.dataset, ref.key(), exc)
                return 0.0
        value = float(score)
        if not value >= 0.0:  # also catches NaN
            return 0.0
        return min(value, 1.0)

    def _dataset(self, ref: TaskRef) -> ProceduralDataset:
        """The reasoning-gym dataset for (dataset, config, seed), created on first use."""
        key = (ref.dataset, ref.config, ref.seed)
        with self._cache_lock:
            cached = self._datasets.get(key)
            if cached is not None:
                self._datasets.move_to_end(key)
                return cached
        kwargs = _rg_kwargs(ref.config)
        with _RG_PROCESS_LOCK:
            try:
                created = reasoning_gym.create_dataset(ref.dataset, seed=ref.seed, size=MAX_TASK_INDEX, **kwargs)
            except _RG_CONFIG_ERRORS as exc:
                raise TaskError(f"reasoning-gym rejected the config for {ref.dataset}: {exc}") from exc
        with self._cache_lock:
            self._datasets[key] = created
            while len(self._datasets) > DATASET_CACHE_SIZE:
                self._datasets.popitem(last=False)
        return created


def _rg_kwargs(config: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """reasoning-gym expects lists where refs hold tuples."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in config}


def _validate_with_rg(dataset: str, config: tuple[tuple[str, Any], ...]) -> None:
    """Run reasoning-gym's own config checks without building the dataset."""
    _, config_cls = _RG_REGISTRY[dataset]
    try:
        rg_config = config_cls(**_rg_kwargs(config), seed=0, size=MAX_TASK_INDEX)
        if hasattr(rg_config, "validate"):
            rg_config.validate()
    except _RG_CONFIG_ERRORS as exc:
        raise TaskError(f"reasoning-gym rejected the config for {dataset}: {exc or type(exc).__name__}") from exc
