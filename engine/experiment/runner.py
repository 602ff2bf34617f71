"""`sapling-node experiment`: several simulated nodes on one computer, one run per local/external mix.

    sapling-node experiment                                   # the default plan (4 nodes, 8/0 and 4/4)
    sapling-node experiment --nodes 2 --mixes 2/0,1/1 --rounds 2 --out /tmp/exp
    sapling-node experiment --out /tmp/exp --resume           # carry on where it stopped

What is real (docs/swarm.md, "The experiment"): every node has its own Ed25519 identity, its own LoRA
adapter, its own AdamW state and its own seeds; they all sit over one copy of the frozen base model
(`TorchBackend.new_adapter_slot`). Nodes exchange through a real relay on loopback (`EmbeddedRelay` on a
free port) with `SwarmExchange`, signatures and every receiver-side check, and admit external groups with
the loop's own `Node.share_and_sample`. Each round's generation for all nodes is one batch in which each
row uses its own node's adapter (`TorchBackend.generate_with_adapters`): one such round of every node is
engine/experiment/batched_round.py.

A round of mix I/J, for every node: draw B questions (the same stream in
every mix), write G completions each, score them, publish all B groups,
then train on I of its own groups and J verified groups from the other
nodes (SAPO's Algorithm 1). All nodes publish round r before any samples, as
nodes running side by side would. Every node checkpoints every round; the
experiment's own `progress.json` names the last round that every node
finished, and a resumed experiment reloads all nodes at that round, so it
ends with the same numbers as one that never stopped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.common.atomicio import append_line, atomic_write_json
from engine.common.config import NodeConfig
from engine.common.errors import CheckpointError, ConfigError, DeviceError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.experiment.batched_round import batched_round
from engine.experiment.evaluation import evaluate_set, keep_best
from engine.experiment.hours import machine_tag
from engine.experiment.nodes import NodeBackend, PublishFirst
from engine.experiment.plan import (
    EVAL_FILE,
    EVALS_FILE,
    NODE_SEED_SPACING,
    PLAN_FILE,
    PROGRESS_FILE,
    ROUNDS_FILE,
    START_EVAL_FILE,
    VETERANS_FOLDER,
    Mix,
    Plan,
    check_plan,
    plan_config,
    read_evals,
    read_json,
    reopen_end_evaluation,
    same_experiment,
    saved_plan,
    widen,
)
from engine.node.checkpoint import checkpoint_name, verify
from engine.node.clock import Control, RoundAborted
from engine.node.loop import Node, derive_seed
from engine.questions.curriculum import curriculum_for, harder_configs
from engine.questions.frontier import frontier_for
from engine.questions.heat import heat_for
from engine.questions.peers import peer_questions_for

if TYPE_CHECKING:
    from engine.questions.tasks import Question

log = logging.getLogger(__name__)


def node_seed(config: NodeConfig, index: int) -> int:
    return config.run.seed + index * NODE_SEED_SPACING


def node_config(config: NodeConfig, mix: Mix, index: int, relay_url: str) -> NodeConfig:
    """Node `index` of a mix: its seed and run name, I and J, and the loopback relay (solo when J is 0)."""
    return NodeConfig(
        model=config.model, tasks=config.tasks, grpo=config.grpo,
        run=replace(config.run, seed=node_seed(config, index), run_name=f"node-{index}"),
        swarm=replace(config.swarm, local_groups=mix.local, external_groups=mix.external,
                      mode="relay" if mix.external else "solo", relay_url=relay_url if mix.external else ""),
    )


Reward = Callable[[Any, str], float]
Say = Callable[[str], None]
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Stage:
    """A run of rounds in one folder: a mix of the plan, or the veterans' training before them."""

    mix: Mix
    folder: Path
    nodes: int
    rounds: int
    offset: int  # the nodes' round counters start here (the veterans' rounds)
    starts: dict[int, Path]  # node index -> the checkpoint it begins from (the veterans)


class MixRun:
    """The nodes of one mix, ready to run rounds one by one (`Experiment.open_mix`)."""

    def __init__(self, experiment: Experiment, mix: Mix) -> None:
        self.experiment = experiment
        self.mix = mix
        self.relay: Any = None
        self.sessions: list[Any] = []
        self.nodes: list[Node] = []
        self.views: list[NodeBackend] = []

    def round(self, round_index: int) -> dict[str, Any]:
        """Round `round_index` of every node: generate in one batch, score, share, train, checkpoint; its record
        (engine/experiment/batched_round.py)."""
        experiment = self.experiment
        return batched_round(experiment.shared, experiment.config, self.mix, round_index, self.nodes, self.views,
                             self.relay, experiment._progress, experiment.machine)

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        if self.relay is not None:
            self.relay.stop()
            self.relay = None

    def __enter__(self) -> MixRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Hooks:
    """How the experiment talks to a person (the CLI's terminal view), and test doubles."""

    say: Say = lambda text: None
    progress: Progress = lambda phase, done, total: None
    round_done: Callable[[Mix, dict[str, Any]], None] = lambda mix, record: None
    mix_started: Callable[[Mix, int, int, int], None] = lambda mix, number, start, rounds: None
    reward: Reward | None = None  # tests: a verifier a random model can satisfy


class Experiment:
    """Runs a plan into `out`: one folder per mix, then report.json, report.md and reward.png."""

    def __init__(self, plan: Plan, out: Path, paths: Paths, hooks: Hooks | None = None,
                 control: Control | None = None) -> None:
        self.plan = plan
        self.out = Path(out)
        self.paths = paths
        self.hooks = hooks or Hooks()
        self.control = control or Control()
        self.config = plan_config(plan)
        check_plan(plan, self.config)
        self.shared: Any = None
        self.taskset: Any = None
        self.threads: Any = None  # engine.node.priority.ThreadPolicy, once the model is loaded
        self.eval_examples = "per_specialty"  # the held-out prompts' worked examples (TaskSet.eval_messages)
        self.machine = ""  # what the rounds are timed on (engine.experiment.hours.machine_tag), once loaded

    # -- the plan on disk ---------------------------------------------------------------------
    @staticmethod
    def saved_plan(out: Path) -> Plan | None:
        return saved_plan(out)

    @classmethod
    def widened_plan(cls, out: Path, plan: Plan) -> Plan:
        """`plan`, or, where `out` holds the same experiment with other mixes or fewer rounds, its mixes, then `plan`'s
        new ones, run to `plan`'s rounds: the same nodes, seeds and settings, so all pair exactly (`widen`)."""
        return widen(saved_plan(out), plan)

    def _claim_out(self) -> None:
        saved = saved_plan(self.out)
        if saved is not None and not same_experiment(saved, self.plan):
            raise ConfigError(f"{self.out} holds an experiment with other settings "
                              f"({json.dumps(saved.to_json()['mixes'])} "
                              f"over {saved.nodes} nodes, {saved.rounds} rounds, --set "
                              f"{' '.join(saved.overrides) or 'none'}); "
                              "run it with --resume or choose another --out.")
        self.plan = widen(saved, self.plan).frozen()
        self.config = plan_config(self.plan)
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.out / PLAN_FILE, self.plan.to_json())

    # -- the shared model -----------------------------------------------------------------------
    def load_model(self) -> None:
        """Load the shared base model and the task set once (the first mix or evaluation does it)."""
        if self.shared is not None:
            return
        import torch

        from engine.backends.torch_backend import TorchBackend
        from engine.common.device import pick_device
        from engine.models.sources import resolve_model_dir
        from engine.node.priority import ThreadPolicy
        from engine.questions.tasks import TaskSet

        cfg = self.config
        device = pick_device(cfg.run.device)
        # As `sapling-node run`: run.threads, or (0) the CPUs other programs leave free, re-measured as it goes.
        self.threads = ThreadPolicy(cfg.run.threads, torch.set_num_threads, max_threads=torch.get_num_threads(),
                                    current=torch.get_num_threads)
        if device.kind not in ("cpu", "cuda"):
            raise DeviceError(f"The experiment runs on the torch backend; {device.kind} is not supported (use --device "
                              "cpu or cuda).")
        self.hooks.say(f"Loading {cfg.model.source} on {device.describe()}")
        model_dir = resolve_model_dir(cfg.model.source, self.paths.models_cache, cfg.model.revision or None)
        self.shared = TorchBackend(model_dir, device, cfg.grpo, cfg.run.seed, cfg.tasks.temperature)
        self.machine = machine_tag(device.kind if device.kind != "cuda" else device.name, self.shared.autocast,
                                   torch.get_num_threads())
        self.taskset = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=cfg.run.seed)
        if self.hooks.reward is not None:
            self.taskset.reward = self.hooks.reward

    # -- running ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run (or carry on) every mix, then write and return the report."""
        from engine.experiment.report import build_report, write_report

        self._claim_out()
        start_eval = None
        try:
            start_eval = self._start_eval()
            if self.plan.veterans:
                self._run_stage(self._veteran_stage(), 0)
            for number, mix in enumerate(self.plan.mixes, 1):
                self._run_stage(self._mix_stage(mix), number)
        except RoundAborted as exc:  # a stop request: the report says how far every mix got
            log.info("Experiment stopped while %s; the last finished round of every mix is kept.", exc)
        report = build_report(self.plan, self.config, self.out, start_eval)
        write_report(report, self.out)
        return report

    def _eval_enabled(self) -> bool:
        return self.config.tasks.eval_every > 0

    def _start_eval(self) -> dict[str, Any] | None:
        """Held-out accuracy of the base model: every node's adapter starts at zero, so one measurement
        serves every node of every mix."""
        if not self._eval_enabled():
            return None
        path = self.out / START_EVAL_FILE
        saved = read_json(path)
        if saved is not None:
            # A folder measured before the held-out set shared one worked example per specialty
            # keeps its prompts, so that all its mixes are measured on the same test.
            self.eval_examples = str(saved.get("examples", "per_question"))
            return saved
        self.load_model()
        slot = self.shared.new_adapter_slot(derive_seed(self.config.run.seed, 0, 7))
        result = self._evaluate([NodeBackend(self.shared, slot)])
        record = {"round": 0, **result}
        atomic_write_json(path, record)
        self.hooks.say(f"held-out accuracy before training: {100 * result['accuracy']:.1f}% "
                       f"({result['questions']} questions, greedy pass@1)")
        return record

    def _evaluate(self, views: Sequence[NodeBackend]) -> dict[str, Any]:
        """Greedy pass@1 of each node on the same held-out set, all nodes in one batch; with tasks.eval_harder, also
        on the set one level up ("harder": the same questions' seeds, each specialty a level harder)."""
        tasks = self.config.tasks
        result = self._evaluate_set(views, self.taskset.eval_set(tasks.eval_questions))
        if tasks.eval_harder:
            harder = harder_configs(tasks, self.taskset.specialties)
            result["harder"] = self._evaluate_set(views, self.taskset.eval_set(tasks.eval_questions, harder))
        return result

    def _held_out_texts(self) -> set[str]:
        """The texts of the experiment's held-out questions (both sets with tasks.eval_harder)."""
        tasks = self.config.tasks
        texts = {q.text for q in self.taskset.eval_set(tasks.eval_questions)}
        if tasks.eval_harder:
            harder = harder_configs(tasks, self.taskset.specialties)
            texts |= {q.text for q in self.taskset.eval_set(tasks.eval_questions, harder)}
        return texts

    def _evaluate_set(self, views: Sequence[NodeBackend], questions: Sequence[Question]) -> dict[str, Any]:
        return evaluate_set(self.shared, self.taskset, self.eval_examples, views, questions,
                            self.config.tasks.max_new_tokens, lambda done, total: self._progress("evaluating", done,
                                                                                                total))

    def _progress(self, phase: str, done: int, total: int) -> None:
        if self.control.stopping:
            raise RoundAborted(phase)
        if self.threads is not None:
            self.threads.update()
        self.hooks.progress(phase, done, total)

    def _mix_stage(self, mix: Mix) -> Stage:
        plan = self.plan
        starts = {k: self._veteran_checkpoint(k) for k in range(plan.veterans)}
        return Stage(mix, self.out / mix.slug, plan.nodes, plan.rounds, plan.veteran_rounds, starts)

    def _veteran_stage(self) -> Stage:
        """The veterans' own training before the experiment: alone (B/0), in the folder's veterans/."""
        B = self.config.tasks.questions_per_round
        return Stage(Mix(B, 0), self.out / VETERANS_FOLDER, self.plan.veterans, self.plan.veteran_rounds, 0, {})

    def _veteran_checkpoint(self, index: int) -> Path:
        paths = self._node_paths(self.out / VETERANS_FOLDER, index)
        return paths.checkpoints(f"node-{index}") / checkpoint_name(self.plan.veteran_rounds)

    def _node_paths(self, folder: Path, index: int) -> Paths:
        """Node `index`'s data in a stage's folder (identity, checkpoints, metrics); the model cache is shared."""
        home = folder / f"node-{index}"
        return Paths(config_dir=home / "config", data_dir=home, cache_dir=self.paths.cache_dir,
                     log_dir=self.paths.log_dir)

    def _run_stage(self, stage: Stage, number: int) -> None:
        """Run a mix (number >= 1) or the veterans' training (number 0) from its last finished round."""
        mix, folder = stage.mix, stage.folder
        reopen_end_evaluation(folder, stage.rounds)  # the plan grew: its last end evaluation is one on the way
        done = int((read_json(folder / PROGRESS_FILE) or {}).get("round", 0))
        if done >= stage.rounds and (not self._eval_enabled() or (folder / EVAL_FILE).is_file()):
            return
        if number:
            self.hooks.mix_started(mix, number, done, stage.rounds)
        else:
            self.hooks.say(f"veterans: {stage.nodes} node(s) train {stage.rounds} rounds alone first "
                           f"({done} done), in {folder}")
        with self.open_mix(mix, folder, stage.nodes) as run:
            for k, node in enumerate(run.nodes):
                self._load_round(node, stage.offset + done, done == 0, stage.starts.get(k) if done == 0 else None)
            if number:
                self._evaluate_on_the_way(run, folder, done, stage.rounds)  # one a stop cut short
            for round_index in range(done + 1, stage.rounds + 1):
                record = run.round(stage.offset + round_index)
                record["round"] = round_index
                if stage.offset:
                    record["node_round"] = stage.offset + round_index
                append_line(folder / ROUNDS_FILE, json.dumps(record, sort_keys=True))
                atomic_write_json(folder / PROGRESS_FILE, {"round": round_index})
                if number:
                    self.hooks.round_done(mix, record)
                    self._evaluate_on_the_way(run, folder, round_index, stage.rounds)
                else:
                    self.hooks.say(f"veterans round {round_index:>4} | reward by node "
                                   + " ".join(f"{r:.3f}" for r in record["rewards"]))
            if self._eval_enabled() and not (folder / EVAL_FILE).is_file():
                result = self._evaluate(run.views)
                atomic_write_json(folder / EVAL_FILE, {"round": stage.rounds, **result})
                self._keep_best(run, folder, stage.rounds, result)
                self.hooks.say(f"{f'mix {mix.label}' if number else 'veterans'}: held-out accuracy after round "
                               f"{stage.rounds}: {100 * result['accuracy']:.1f}% (mean of {len(run.views)} nodes)")

    def _evaluate_on_the_way(self, run: MixRun, folder: Path, round_index: int, rounds: int) -> None:
        """Held-out accuracy after round `round_index` when it is a multiple of tasks.eval_every (the last
        round's goes to EVAL_FILE), so that mixes whose rounds cost different time compare at equal time."""
        every = self.config.tasks.eval_every
        if every <= 0 or round_index <= 0 or round_index >= rounds or round_index % every:
            return
        if round_index in read_evals(folder):
            return
        result = self._evaluate(run.views)
        append_line(folder / EVALS_FILE, json.dumps({"round": round_index, **result}, sort_keys=True))
        self._keep_best(run, folder, round_index, result)
        self.hooks.say(f"mix {run.mix.label}: held-out accuracy after round {round_index}: "
                       f"{100 * result['accuracy']:.1f}% (mean of {len(run.views)} nodes)")

    def _keep_best(self, run: MixRun, folder: Path, round_index: int, result: dict[str, Any]) -> None:
        homes = [folder / f"node-{k}" for k in range(len(run.nodes))]
        keep_best(homes, [node.checkpoint_root for node in run.nodes], round_index, result)

    def open_mix(self, mix: Mix, folder: Path, nodes: int | None = None) -> MixRun:
        """`nodes` nodes (the plan's by default) of `mix` with their data in `folder`, joined to a loopback relay
        when J > 0, at round 0: `MixRun.round(r)` runs round r of all of them. Close it (a `with` block)."""
        self.load_model()
        run = MixRun(self, mix)
        try:
            url = ""
            if mix.external:
                run.relay, url = self._start_relay()
            run.nodes, run.views = self._nodes(mix, folder, url, run.sessions,
                                               self.plan.nodes if nodes is None else nodes)
        except BaseException:
            run.close()
            raise
        return run

    def _start_relay(self) -> tuple[Any, str]:
        from engine.relay.embedded import EmbeddedRelay
        from engine.relay.settings import RelaySettings

        # A real relay on a free loopback port. Simulated nodes publish and sample back to back, so the
        # per-peer request rate is raised above the default for people's nodes (2/s, burst 10).
        relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, rate=100.0, burst=200.0,
                                            name="sapling-experiment"))
        return relay, relay.start()

    def _nodes(self, mix: Mix, folder: Path, url: str, sessions: list[Any], count: int) -> tuple[list[Node],
                                                                                                 list[NodeBackend]]:
        from engine.swarm.session import open_swarm

        nodes: list[Node] = []
        views: list[NodeBackend] = []
        for k in range(count):
            cfg = node_config(self.config, mix, k, url)
            paths = self._node_paths(folder, k)
            session = open_swarm(cfg, paths.identity_file, self._node_event)
            sessions.append(session)
            exchange = None
            if session.exchange is not None:
                exchange = PublishFirst(session.exchange)
                if not session.exchange.client.wait_connected(30.0):
                    raise DeviceError(f"Node {k} could not connect to the experiment's relay at {url}.")
            node = Node(cfg, paths, self._node_event, self.control, exchange=exchange)
            if node.peers is not None:  # a peer's question that is one of the experiment's held-out ones is never asked
                node.held_out_texts = self._held_out_texts()
            if self.hooks.reward is not None:
                node.taskset.reward = self.hooks.reward  # type: ignore[method-assign,assignment]
            view = NodeBackend(self.shared, self.shared.new_adapter_slot(derive_seed(cfg.run.seed, 0, 7)))
            node.backend = view
            node.device = self.shared.device
            node.threads = self.threads
            nodes.append(node)
            views.append(view)
        return nodes, views

    def _node_event(self, event: Event) -> None:
        kind = event["type"]
        if kind == "progress" and event["phase"] in ("training", "scoring"):
            self.hooks.progress(event["phase"], event["done"], event["total"])
        elif kind == "error":
            self.hooks.say(f"error: {event['message']}")

    def _load_round(self, node: Node, round_index: int, fresh: bool, start: Path | None = None) -> None:
        """Every node at its stage's last finished round (a node a round ahead from a crash is reloaded too).

        fresh: the stage has not begun; the node starts from `start` (a veteran's checkpoint: its
        adapter and optimizer, still training) or from a new adapter, its round counter at `round_index`.
        """
        node.round = round_index
        if node.exchange is not None:  # what a round after this one trained on was never learned (defence.py)
            node.exchange.rewind(round_index)
        if fresh and start is None:
            return
        path = start if start is not None else node.checkpoint_root / checkpoint_name(round_index)
        if not path.is_dir():
            what = "the veterans' training finished" if start is not None else f"round {round_index} finished"
            raise CheckpointError(f"{path} is missing, but {PROGRESS_FILE} says {what}; "
                                  "the experiment cannot resume from this folder.")
        state = verify(path)
        assert node.backend is not None
        node.backend.load(path)
        # the adaptive levels and streaks this checkpoint ended with, its re-asks and its sampling temperature
        node.curriculum = curriculum_for(node.config, node.taskset.specialties, state.get("curriculum"))
        node.frontier = frontier_for(node.config, node.taskset.seed, state.get("frontier"))
        node.heat = heat_for(node.config.tasks, state.get("heat"))
        node.peers = peer_questions_for(node.config, state.get("peer_questions"))
