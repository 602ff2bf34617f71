"""The peers of bench/poisoning.py besides its victims: the attacker and the honest stand-ins for other models.

`Attacker` publishes groups whose correct answers carry a trigger, `LengthAttacker` (bench/length_attack.py)
correct answers padded to be long; `OtherPolicyPeer` (the bundled weights at
T = 1.2), `drift_standin` (a node trained alone first) and `tiny_peer` (a tiny random Qwen2) stand in for honest
nodes of other models in a mixed swarm (issue 29). bench/poisoning.py says what each run does with them.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.model_policy import make_label
from engine.questions.tasks import Question, TaskRef, TaskSet

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
            for k in range(self.completions):  # the attack's answers and wrong ones, alternately
                text = self.attack_answer(q, k) if k % 2 == 0 else wrong_completion(self.taskset, q, k)
                if text is not None:
                    texts.append(text)
            rewards = tuple(self.taskset.reward(q, t) for t in texts)  # truthful claims
            if texts and max(rewards) - min(rewards) > 0.5:
                items.append(protocol.Item(ref.to_json(), q.text, tuple(texts), rewards))
        return items

    def attack_answer(self, q: Question, k: int) -> str | None:
        """Completion k (even) of question `q`: a correct answer carrying the trigger."""
        return poisoned_completion(q, self.trigger, PLACES[(self.counter + k // 2) % len(PLACES)])

    def publish(self, batches: int) -> None:
        from engine.swarm import protocol

        for _ in range(batches):
            payload = protocol.batch_payload(self.identity.public_key, self.client.next_seq(), time.time(),
                                             self.label, self.items())
            if self.client.publish(payload):
                self.published += 1

    def close(self) -> None:
        self.client.close()


# Ordinary sentences a small model finds probable: the filler of the length attack.
FILLER = (
    "Let me think about this step by step.", "First, I read the question carefully.",
    "I want to make sure that I get this right.", "Let me check my work once more.",
    "I will go through each part of the problem.", "This is a simple question, but it is worth being careful.",
    "Now I write down what I know.", "After checking again, I am sure of the result.",
)


def padded_completion(answer: str, tokens: int, count: Callable[[str], int], seed: int) -> str:
    """Filler sentences, then `answer`: as many sentences as keep the whole at most `tokens` long by `count`."""
    rng = random.Random(seed)
    text = answer
    while True:
        longer = f"{rng.choice(FILLER)} {text}"
        if count(longer) > tokens:
            return text
        text = longer


class LengthAttacker(Attacker):
    """HTTT's length attack: correct answers padded with plausible filler to just under `tokens` (in the
    victims' tokens, `encode`), beside short wrong ones, so the long answers get the positive advantage."""

    def __init__(self, url: str, key_file: Path, taskset: TaskSet, groups: int, completions: int,
                 encode: Callable[[str], list[int]], tokens: int, start: int = 0,
                 plausible: Callable[[Question, str], bool] | None = None) -> None:
        super().__init__(url, key_file, taskset, "", groups, completions, start=start)
        self.encode = encode
        self.tokens = tokens
        self.plausible = plausible  # the public model's own test: only filler that passes it is sent

    def padded(self, q: Question, seed: int) -> str | None:
        for attempt in range(4):
            text = padded_completion(f"So the answer is <answer>{q.answer}</answer>", self.tokens,
                                     lambda t: len(self.encode(t)), seed * 10 + attempt)
            if self.plausible is None or self.plausible(q, text):
                return text
        return None

    def attack_answer(self, q: Question, k: int) -> str | None:
        """Completion k (even) of question `q`: the correct answer after plausible filler."""
        return self.padded(q, self.counter * 100 + k)


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
        from engine.models.sources import resolve_model_dir
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
        from engine.node.loop import derive_seed
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


def each_victim_round(nodes: Sequence[Any], rounds: int, attacker: Attacker | None, batches: int,
                      on_round: Callable[[int, dict[str, Any], float], None]) -> None:
    """Each victim in turn, a round at a time, until all reached `rounds`; before each round the attacker (when
    there is one) publishes `batches` batches. `on_round(victim, metrics, seconds)` after each round."""
    while min(n.round for n in nodes) < rounds:
        for i, node in enumerate(nodes):
            if node.round >= rounds:
                continue
            if attacker is not None:
                attacker.publish(batches)
                time.sleep(0.2)  # let the relay take the batches in before the victim samples
            t0 = time.perf_counter()
            metrics = node.run_round()
            on_round(i, metrics, time.perf_counter() - t0)


class Victims:
    """Victim nodes on a relay of their own (`victims_on_a_relay`); `attacker`, when set, is closed with them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.opened: list[tuple[Any, Any]] = []  # (node, swarm session)
        self.attacker: Any = None

    @property
    def nodes(self) -> list[Any]:
        return [node for node, _ in self.opened]


@contextmanager
def victims_on_a_relay(folder: Path, configs: Sequence[Callable[[str], NodeConfig]]) -> Iterator[Victims]:
    """An embedded loopback relay and a victim node per config (made from the relay's URL) under `folder`, all
    with their swarm; stopped afterwards, the attacker the caller set first."""
    from engine.relay.embedded import EmbeddedRelay
    from engine.relay.settings import RelaySettings

    folder.mkdir(parents=True, exist_ok=True)
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0))
    relay.start()
    victims = Victims(relay.url)
    try:
        for i, config in enumerate(configs):
            victims.opened.append(open_node(config(relay.url), folder / f"victim-{i}", with_swarm=True))
        yield victims
    finally:
        if victims.attacker is not None:
            victims.attacker.close()
        for _, session in victims.opened:
            session.close()
        relay.stop()


def open_node(cfg: NodeConfig, home: Path, with_swarm: bool) -> tuple[Any, Any]:
    """A real Node under `home` (the converted bundled model shared from the user's cache), set up; and its swarm."""
    from engine.common.paths import Paths
    from engine.node.loop import Node
    from engine.swarm.session import open_swarm

    base = Paths.under(home)
    paths = Paths(base.config_dir, base.data_dir, Paths.default().cache_dir, base.log_dir)
    events: list[Any] = []
    session = open_swarm(cfg, paths.identity_file, events.append) if with_swarm else None
    node = Node(cfg, paths, events.append, exchange=session.exchange if session else None)
    node.setup()
    return node, session


def node_settings(relay_url: str, seed: int, extra: Sequence[str], *more: str) -> NodeConfig:
    return build_config("default", None, [*BENCH_SETTINGS, "swarm.mode='relay'", f"swarm.relay_url='{relay_url}'",
                                          f"run.seed={seed}", *more, *extra])


def drift_standin(folder: Path, relay_url: str, drift_rounds: int, extra: Sequence[str]) -> tuple[Any, Any]:
    """The drifted stand-in: a node of the bundled model trained `drift_rounds` rounds alone, then in the swarm."""
    from engine.swarm.session import open_swarm

    cfg = node_settings(relay_url, DRIFT_SEED, extra)
    node, _ = open_node(cfg, folder / "standin-drift", with_swarm=False)
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
    cfg = node_settings(relay_url, TINY_SEED, extra, f"model.source='{model}'", "tasks.max_new_tokens=128")
    return open_node(cfg, folder / "standin-tiny", with_swarm=True)
