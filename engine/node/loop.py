"""The SAPO round loop: sample, score, (share), train, checkpoint, report.

One `Node` owns a policy backend, a task set and a run folder, and keeps the state and the steps of a
round; their order, read top to bottom, lives in engine/node/round.py (`run_round`). Each round:

1. draw B questions, deterministic from (node seed, round);
2. sample G completions each with the current policy (behaviour log-probs kept);
3. score every completion locally with the task's verifier;
4. group advantages (r - mean) / (std + eps);
5. publish the groups to the swarm and take J external groups, re-verified
   and re-scored here (`RolloutExchange`; solo when there is no swarm);
6. one GRPO update on local + external groups;
7. checkpoint atomically, append to metrics.jsonl, emit the round event, and
   every `eval_every` rounds run the held-out evaluation.

Everything the node does is reported through `emit(event)` (see
engine/common/events.py); `Control` carries pause/resume/stop/reload requests in.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backends import PolicyBackend, load_backend
from engine.backends.base import Completion
from engine.common.config import NodeConfig
from engine.common.device import DeviceInfo, pick_device
from engine.common.errors import ConfigError
from engine.common.events import Event, make_event
from engine.common.model_policy import model_label
from engine.common.paths import Paths
from engine.common.schema import restart_changes
from engine.models.sources import resolve_model_dir
from engine.node.admission import admit
from engine.node.checkpoint import latest_good, save_checkpoint
from engine.node.clock import Clock, Control, Pacing, RoundAborted
from engine.node.metrics import MetricsLog, held_out_summary, round_summary, rss_bytes
from engine.node.priority import ThreadPolicy
from engine.node.results import report_results
from engine.node.round import run_round
from engine.node.seeds import derive_seed, node_seed, run_seed
from engine.questions.curriculum import curriculum_for, harder_configs
from engine.questions.frontier import frontier_for
from engine.questions.heat import heat_for
from engine.questions.peers import peer_questions_for, wanted
from engine.questions.probe import choose
from engine.questions.tasks import Question, TaskSet
from engine.rollouts.groups import Group, group_advantages, train_items, trained_groups
from engine.rollouts.offers import Offer

if TYPE_CHECKING:  # the loop never opens the swarm: its exchange comes from the caller (engine/node/launch.py)
    from engine.swarm.exchange import RolloutExchange

log = logging.getLogger(__name__)

Emit = Callable[[Event], None]


def _with_seed(config: NodeConfig, seed: int) -> NodeConfig:
    return config if config.run.seed == seed else replace(config, run=replace(config.run, seed=seed))


class Node:
    def __init__(
        self,
        config: NodeConfig,
        paths: Paths,
        emit: Emit,
        control: Control | None = None,
        exchange: RolloutExchange | None = None,
        reload_config: Callable[[], NodeConfig] | None = None,
        clock: Clock | None = None,
    ) -> None:
        # The install's own seed unless one is set (engine/node/seeds.py); resume() may put back the run's.
        self.config = _with_seed(config, node_seed(config.run.seed, paths.data_dir))
        self.paths = paths
        self.emit = emit
        self.control = control or Control()
        self.exchange = exchange
        self.reload_config = reload_config
        self.pacing = Pacing(self.config.run.schedule, self.config.run.duty_cycle, clock)  # engine/node/clock.py
        self.metrics = MetricsLog(paths.metrics_file, self.config.run.metrics_max_kb * 1024)
        self.taskset = self._taskset(self.config)
        self.curriculum = curriculum_for(self.config, self.taskset.specialties)  # None: fixed difficulty
        self.frontier = frontier_for(self.config, self.taskset.seed)  # None: no re-asks
        self.heat = heat_for(self.config.tasks)  # None: a fixed sampling temperature
        self.peers = peer_questions_for(self.config)  # None: no peers' questions asked (questions/peers.py)
        self.peer_asked: set[str] = set()  # the keys of this round's peers' questions
        self.held_out_texts: set[str] | None = None  # the held-out questions' texts (an experiment sets its own)
        self.device: DeviceInfo | None = None
        self.backend: PolicyBackend | None = None
        self.threads: ThreadPolicy | None = None  # CPU threads for torch (cpu and cuda devices)
        self.round = 0  # last completed round
        self.offpolicy_dropped = 0  # external completions the F-TIS filter left out this round
        self.probe_report: dict[str, int] = {}  # this round's probing (tasks.probe_answers): see choose_probed
        self._state = "starting"

    # -- set-up ------------------------------------------------------------------------
    @staticmethod
    def _taskset(config: NodeConfig) -> TaskSet:
        t = config.tasks
        return TaskSet(t.specialties, t.dataset_configs, seed=config.run.seed)

    @property
    def checkpoint_root(self) -> Path:
        return self.paths.checkpoints(self.config.run.run_name)

    def status(self, state: str, message: str, **extra: Any) -> None:
        self._state = state
        device = self.device.to_json() if self.device else None
        self.emit(make_event(
            "status", state=state, message=message, device=device,
            model=self.config.model.source, run=self.config.run.run_name, round=self.round, **extra,
        ))

    def progress(self, phase: str, done: int, total: int) -> None:
        # Evaluation scores the model as of the last completed round; the rest works on the next.
        shown = self.round if phase == "evaluating" else self.round + 1
        self.emit(make_event("progress", phase=phase, done=done, total=total, round=shown))

    def setup(self) -> None:
        """Pick the device, load the model, resume from the newest good checkpoint."""
        run = self.config.run
        self.device = pick_device(run.device)
        log.info("Device: %s", self.device.describe())
        if self.device.kind in ("cpu", "cuda"):
            import torch

            # run.threads 0: as many threads as other programs leave free, measured as the round goes,
            # never more than torch's own default (the physical cores, or what the caller set).
            self.threads = ThreadPolicy(run.threads, torch.set_num_threads, max_threads=torch.get_num_threads(),
                                        current=torch.get_num_threads)
        source = "the bundled model" if self.config.model.source == "bundled" else self.config.model.source
        self.status("loading", f"Loading {source} on {self.device.plain()}")
        model_dir = resolve_model_dir(self.config.model.source, self.paths.models_cache,
                                      self.config.model.revision or None)
        self.backend = load_backend(model_dir, self.device, self.config.grpo, run.seed, self.config.tasks.temperature)
        if self.exchange is not None:  # what this node's batches say it runs: NAME@sha256 of the weights (cached)
            self.exchange.set_model_label(model_label(self.config.model.source, model_dir, self.paths.cache_dir))
        self.resume()

    def resume(self) -> None:
        """Carry on from the newest good checkpoint of this run, or start at round 0 when there is none."""
        if self.backend is None:
            raise RuntimeError("a backend must be set before resume()")
        run = self.config.run
        found = latest_good(self.checkpoint_root, self.config.structure_hash(), self.backend.load)
        if self.exchange is not None:  # what a round after the checkpoint trained on was never learned
            self.exchange.rewind(found.round if found is not None else 0)
        if found is None:
            self.round = 0
            self.status("loading", "No checkpoint yet: starting a new run.")
            return
        self.round = found.round
        seed = run_seed(self.config.run.seed, found.state.get("seed"))
        if seed != self.config.run.seed:
            self.config = _with_seed(self.config, seed)
            self.taskset = self._taskset(self.config)
        self.curriculum = curriculum_for(self.config, self.taskset.specialties, found.state.get("curriculum"))
        self.frontier = frontier_for(self.config, self.taskset.seed, found.state.get("frontier"))
        self.heat = heat_for(self.config.tasks, found.state.get("heat"))
        self.peers = peer_questions_for(self.config, found.state.get("peer_questions"))
        if found.state.get("config_hash") != self.config.config_hash():
            log.warning("Settings changed since round %d; continuing with the new ones.", found.round)
        metrics = found.state.get("metrics")
        if isinstance(metrics, dict) and not self.metrics.has(run.run_name, "round", found.round):
            self.metrics.append(metrics)  # the line lost to a crash between checkpoint and append
        self.emit(make_event("checkpoint", round=found.round, path=str(found.path)))
        self.status("loading", f"Resumed from round {found.round}.")

    # -- control -----------------------------------------------------------------------
    def _step(self, phase: str) -> Callable[[int, int], None]:
        """Progress callback for an abortable phase: reports, honours pause and stop."""
        last = [0.0]

        def on_step(done: int, total: int) -> None:
            if self.threads is not None:
                self.threads.update()  # cheap: measures the load at most every 2 s
            self.pacing.between_steps(self.control.stop_event)  # run.duty_cycle: rest between steps
            if self.control.paused:
                self.status("paused", "Paused.")
                self.control.wait_while_paused()
                self.pacing.duty.begin()  # a pause is not training time
                self.status("training", "Resumed.")
            if self.control.stopping:
                raise RoundAborted(phase)
            now = time.monotonic()
            if done >= total or now - last[0] > 0.2:
                last[0] = now
                self.progress(phase, done, total)

        return on_step

    def apply_reload(self) -> None:
        if self.reload_config is None:
            return
        try:
            new = _with_seed(self.reload_config(), self.config.run.seed)  # a run keeps its seed
        except ConfigError as exc:
            self.emit(make_event("error", kind="ConfigError", message=f"Settings not applied: {exc}", fatal=False))
            return
        fixed = restart_changes(self.config, new, ("new_run",))  # one rule with the app's (engine/common/schema.py)
        if fixed:
            self.emit(make_event(
                "error", kind="ConfigError", fatal=False,
                message=f"Settings saved, not applied: {', '.join(s.dotted for s in fixed)} change on the next start.",
            ))
            return
        later = restart_changes(self.config, new, ("restart",))
        if later:
            self.emit(make_event(
                "error", kind="ConfigError", fatal=False,
                message=f"Settings saved; {', '.join(s.dotted for s in later)} apply when the engine restarts, "
                        "the others now.",
            ))
        if self.exchange is not None:
            self.exchange.apply_settings(new.swarm)  # the daily caps and the ban rule
        if self.threads is not None:
            self.threads.reconfigure(new.run.threads)
        self.pacing.reconfigure(new.run.schedule, new.run.duty_cycle)
        self.config = new
        self.taskset = self._taskset(new)
        self.curriculum = curriculum_for(new, self.taskset.specialties,
                                         self.curriculum and self.curriculum.to_state())
        self.frontier = frontier_for(new, self.taskset.seed, self.frontier and self.frontier.to_state())
        self.heat = heat_for(new.tasks, self.heat and self.heat.to_state())
        self.peers = peer_questions_for(new, self.peers and self.peers.to_state())
        if self.backend is not None:
            self.backend.apply_settings(new.grpo, self.temperature)
        self.status(self._state, "Settings reloaded.")

    def _wait_for_schedule(self, start: datetime, message: str) -> None:
        """Outside run.schedule's hours, after a finished round: say so (the log, the app); the node sleeps."""
        log.info("%s The checkpoint of round %d holds the run.", message, self.round)
        self.status("waiting", message, next_start=start.isoformat(timespec="minutes"))

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        """Train until max_rounds or a stop request; returns the last completed round."""
        if self.backend is None:
            self.setup()
        max_rounds = self.config.run.max_rounds
        first_eval = self.round == 0 and self.config.tasks.eval_every > 0
        try:
            self.status("training", f"Training from round {self.round + 1}.")
            while not self.control.stopping and (max_rounds == 0 or self.round < max_rounds):
                if self.control.take_reload():
                    self.apply_reload()
                if self.control.paused:
                    self.status("paused", "Paused.")
                    self.control.wait_while_paused()
                    if self.control.stopping:
                        break
                    self.pacing.duty.begin()
                    self.status("training", "Resumed.")
                if not self.pacing.wait_for_hours(self.control.wake, self._wait_for_schedule):
                    continue  # a stop or a reload ended the wait: the loop looks again
                if self._state == "waiting":
                    self.status("training", f"The schedule's hours began: training from round {self.round + 1}.")
                if first_eval:
                    first_eval = False
                    self.evaluate()
                self.run_round()
                every = self.config.tasks.eval_every
                if every and self.round % every == 0:
                    self.evaluate()
        except RoundAborted as exc:
            log.info("Stop requested while %s: round %d abandoned; the checkpoint of round %d holds the run.",
                     exc, self.round + 1, self.round)
        self.status("stopped", f"Stopped after round {self.round}; the last checkpoint holds it.")
        return self.round

    def run_round(self) -> dict[str, Any]:
        """One round, read top to bottom in engine/node/round.py (engine/experiment/batched_round.py runs
        its steps across several nodes)."""
        return run_round(self)

    def _backend(self) -> PolicyBackend:
        if self.backend is None:
            raise RuntimeError("setup() must run before a round")
        return self.backend

    def start_round(self) -> tuple[int, list[Question], list[list[int]]]:
        """Reseed sampling and draw the next round's questions: (round index, questions, prompt ids)."""
        backend = self._backend()
        cfg = self.config
        round_index = self.round + 1
        backend.reseed(derive_seed(cfg.run.seed, round_index))
        plan = self.curriculum.plan(cfg.tasks.specialties) if self.curriculum else {}  # its levels and weights
        B = cfg.tasks.questions_per_round  # up to reask_share of them asked again (questions/frontier.py), oldest first
        asked_again = int(round(cfg.tasks.reask_share * B, 6))
        refs = self.frontier.pick(asked_again, self.taskset.specialties) if self.frontier else []
        # then up to swarm.peer_questions of them the swarm's teaching questions, newest first (questions/peers.py)
        peer_refs = self.peers.take(min(wanted(cfg), B - len(refs)), self.taskset.specialties) if self.peers else []
        self.peer_asked = {r.key() for r in peer_refs}
        refs += peer_refs
        drawn = cfg.tasks.probe_questions if cfg.tasks.probe_answers else B  # probing draws more, completes B
        questions = [self.taskset.rebuild(r) for r in refs] + self.taskset.draw(round_index, drawn - len(refs),
                                                                               **plan)
        self.probe_report = {"reasked_first": len(refs)}
        prompt_ids = [backend.encode_prompt(self.taskset.messages(q)) for q in questions]
        return round_index, questions, prompt_ids

    def choose_probed(self, questions: Sequence[Question], probes: Sequence[Completion]) -> list[int]:
        """With tasks.probe_answers: which questions_per_round of the drawn questions to complete (probe.py)."""
        tasks = self.config.tasks
        chosen, self.probe_report = choose(questions, probes, self.taskset.reward, tasks.questions_per_round,
                                           tasks.completions_per_question, self.probe_report.get("reasked_first", 0))
        return chosen

    def score(self, questions: Sequence[Question], prompt_ids: Sequence[list[int]],
              completions: Sequence[Completion]) -> list[Group]:
        """Score each question's G completions (in order) locally: one group per question."""
        cfg = self.config
        G = cfg.tasks.completions_per_question
        scoring = self._step("scoring")
        groups: list[Group] = []
        for i, (question, prompt) in enumerate(zip(questions, prompt_ids, strict=True)):
            own = list(completions[i * G : (i + 1) * G])
            rewards = [self.taskset.reward(question, c.text) for c in own]
            groups.append(Group(question, prompt, own, rewards, group_advantages(rewards, cfg.grpo.adv_eps)))
            scoring(i + 1, len(questions))
        return groups

    def own_groups(self, round_index: int, groups: list[Group]) -> list[Group]:
        """SAPO's I: the own groups that go into the training batch (all of them when local_groups is 0)."""
        cfg = self.config
        if 0 < cfg.swarm.local_groups < len(groups):
            rng = random.Random(derive_seed(cfg.run.seed, round_index, 1))
            if cfg.swarm.local_informative_first:  # a stable sort: those trained on first, each kind in a random order
                kept = {id(g) for g in trained_groups(groups, cfg.grpo.train_on)}
                pick = sorted(rng.sample(range(len(groups)), len(groups)), key=lambda i: id(groups[i]) not in kept)
            else:
                pick = rng.sample(range(len(groups)), cfg.swarm.local_groups)
            return [groups[i] for i in sorted(pick[: cfg.swarm.local_groups])]
        return groups

    @property
    def temperature(self) -> float:
        """This round's sampling temperature: tasks.temperature, or where tasks.adaptive_temperature has moved it."""
        return self.heat.temperature if self.heat is not None else self.config.tasks.temperature

    def learn(self, groups: Sequence[Group]) -> dict[str, float]:
        """One GRPO update on the informative groups (local and external), of the policy at the round's temperature."""
        backend = self._backend()
        if self.heat is not None:
            backend.apply_settings(self.config.grpo, self.temperature)
        kept = trained_groups(groups, self.config.grpo.train_on)
        return {**backend.train(train_items(kept), self._step("training")), "trained_groups": len(kept)}

    def finish_round(
        self, round_index: int, groups: list[Group], external: list[Group], stats: dict[str, float],
        swarm_report: dict[str, Any] | None, gen_seconds: float, train_seconds: float, seconds: float,
    ) -> dict[str, Any]:
        """Checkpoint the round atomically, append its metrics, emit checkpoint and round events."""
        backend = self._backend()
        cfg = self.config
        self.progress("checkpointing", 0, 1)
        self.round = round_index
        metrics = self._round_metrics(groups, external, stats, gen_seconds, train_seconds, seconds)
        if swarm_report is not None:
            metrics["swarm"] = swarm_report
        # chosen for teaching (re-asks, peers' questions): no evidence for a level or the temperature
        asked_again = (self.frontier.keys() if self.frontier else set()) | self.peer_asked
        if self.curriculum is not None:  # levels move on this round's fresh own groups; its report joins the metrics
            metrics.update(self.curriculum.follow([(g.question.ref.dataset, g.rewards) for g in groups
                                                   if g.question.ref.key() not in asked_again], cfg.tasks.specialties))
        if self.heat is not None:  # the sampling temperature follows how many own groups collapsed (questions/heat.py)
            metrics.update(self.heat.follow([g.rewards for g in groups if g.question.ref.key() not in asked_again]))
        if self.frontier is not None:  # re-asks that came back all-same or used up leave, fresh mixed ones join
            metrics.update(self.frontier.follow(round_index, groups))
        if self.peers is not None:  # how often a peer's teaching question taught this node too
            asked = [g for g in groups if g.question.ref.key() in self.peer_asked]
            metrics.update(peer_asked=len(asked), peer_asked_informative=sum(g.informative for g in asked),
                           peer_questions_waiting=len(self.peers))
        state = {
            "config_hash": cfg.config_hash(),
            "structure_hash": cfg.structure_hash(),
            "seed": cfg.run.seed,
            "metrics": metrics,
            "device": self.device.to_json() if self.device else None,
            **({"curriculum": self.curriculum.to_state()} if self.curriculum else {}),
            **({"frontier": self.frontier.to_state()} if self.frontier else {}),
            **({"heat": self.heat.to_state()} if self.heat else {}),
            **({"peer_questions": self.peers.to_state()} if self.peers else {}),
        }
        path = save_checkpoint(self.checkpoint_root, round_index, backend.save, state, cfg.run.keep_checkpoints)
        self.metrics.append(metrics)
        self.emit(make_event("checkpoint", round=round_index, path=str(path)))
        self.emit(make_event("round", round=round_index, metrics=metrics))
        return metrics

    def share_and_sample(self, round_index: int, groups: Sequence[Group]) -> tuple[list[Group], dict[str, Any] | None]:
        """Publish this round's groups, take up to J verified external ones: (groups, swarm report)."""
        if self.exchange is None:
            return [], None
        cfg = self.config
        self._lift_bans()
        if self.publishes():
            self.exchange.publish(round_index, groups)
        J = self.external_wanted(round_index, groups)
        asking = wanted(cfg) if self.peers is not None else 0  # and some only for their questions (questions/peers.py)
        offer = self.exchange.sample(
            round_index, J + asking, self.taskset,
            exclude={g.question.ref.key() for g in groups}, seed=derive_seed(cfg.run.seed, round_index, 2),
        )
        aside = offer.set_aside(J)  # verified, informative by this node's verifier; never trained on
        if self.peers is not None:
            self.peers.offer(round_index, [item.question for item in aside], self.held_out())
        own = [(g.question.ref.dataset, len(c.token_ids), r)
               for g in groups for c, r in zip(g.completions, g.rewards, strict=True)]
        external, verdicts = self._admit(offer, [c.logprobs for g in groups for c in g.completions], own)
        return external, self.exchange.settle(offer, verdicts)

    def held_out(self) -> set[str]:
        """The texts of this node's held-out questions (drawn once): a peer's question among them is never asked."""
        if self.held_out_texts is None:
            t = self.config.tasks
            self.held_out_texts = {q.text for q in self.taskset.eval_set(t.eval_questions)}
            if t.eval_harder:
                harder = harder_configs(t, self.taskset.specialties)
                self.held_out_texts |= {q.text for q in self.taskset.eval_set(t.eval_questions, harder)}
        return self.held_out_texts

    def publishes(self) -> bool:
        """Whether this round's own groups go to the swarm: not while the adaptive temperature is high (heat.py)."""
        return self.heat is None or self.heat.shares()

    def external_wanted(self, round_index: int, groups: Sequence[Group]) -> int:
        """How many swarm groups this round takes: J, or with swarm.train_groups what fills the batch
        up to that cap after this round's own groups that it trains on (grpo.train_on)."""
        sw = self.config.swarm
        if not sw.train_groups:
            return sw.external_groups
        own = len(trained_groups(self.own_groups(round_index, list(groups)), self.config.grpo.train_on))
        return max(0, min(sw.external_groups, sw.train_groups - own))

    def _lift_bans(self) -> None:
        """Apply `unban` commands received since the last round (the exchange emits `peers` after each)."""
        for peer in self.control.take_unbans():
            if self.exchange is not None:
                self.exchange.unban(peer)

    def _admit(self, offer: Offer, own_logprobs: Sequence[Sequence[float]] = (),
               own_lengths: Sequence[tuple[str, int, float]] = ()) -> tuple[list[Group], dict[int, str]]:
        """The offer's items this node lets in, judged with its own model (engine/node/admission.py): the groups
        to train on and the rejections, by offer index."""
        if self.backend is None:
            raise RuntimeError("setup() must run before _admit()")
        groups, verdicts, self.offpolicy_dropped = admit(self.backend, self.config, self.taskset, self.temperature,
                                                         offer, own_logprobs, own_lengths)
        return groups, verdicts

    def _round_metrics(
        self, groups: list[Group], external: list[Group], stats: dict[str, float],
        gen_seconds: float, train_seconds: float, seconds: float,
    ) -> dict[str, Any]:
        return {
            "kind": "round",
            "run": self.config.run.run_name,
            "round": self.round,
            "ts": time.time(),
            **round_summary(groups, external, gen_seconds),
            "generate_seconds": gen_seconds,
            "train_seconds": train_seconds,
            "seconds": seconds,
            "rss_bytes": rss_bytes(),
            **({"offpolicy_dropped": self.offpolicy_dropped} if self.config.swarm.offpolicy_negative_kl > 0 else {}),
            # tasks.probe_answers: questions drawn and probed, how many of them had answers that scored differently,
            # and the answers generated in all (probes of every drawn question, the rest of the chosen ones)
            **({k: v for k, v in self.probe_report.items() if k != "reasked_first"}
               if self.config.tasks.probe_answers else {}),
            **{k: v for k, v in stats.items()},
        }

    def evaluate(self) -> dict[str, Any]:
        """Greedy pass@1 on the fixed held-out set (and with tasks.eval_harder, on the one a level up)."""
        t0, t = time.perf_counter(), self.config.tasks
        record = {"kind": "eval", "run": self.config.run.run_name, "round": self.round, "ts": time.time(),
                  **self._held_out(self.taskset.eval_set(t.eval_questions))}
        if t.eval_harder:  # the same seeds and indices, each specialty one level up (engine/questions/curriculum.py)
            harder = harder_configs(t, self.taskset.specialties)
            record["harder"] = self._held_out(self.taskset.eval_set(t.eval_questions, harder))
        record["seconds"] = time.perf_counter() - t0
        if not self.metrics.has(self.config.run.run_name, "eval", self.round):
            self.metrics.append(record)
        self.emit(make_event(
            "eval", round=self.round, accuracy=record["accuracy"], reward_mean=record["reward_mean"],
            questions=record["questions"], by_specialty=record["by_specialty"], harder=record.get("harder"),
        ))
        report_results(self)  # the relay's evaluation questions of the hour, re-scored by the relay (node/results.py)
        return record

    def _held_out(self, questions: Sequence[Question]) -> dict[str, Any]:
        """Greedy pass@1 on `questions`: accuracy, mean reward, how many, and accuracy per specialty."""
        backend = self._backend()
        prompts = [backend.encode_prompt(self.taskset.eval_messages(q)) for q in questions]
        answers = backend.greedy(prompts, self.config.tasks.max_new_tokens, self._step("evaluating"))
        return held_out_summary([q.ref.dataset for q in questions],
                                [self.taskset.reward(q, a) for q, a in zip(questions, answers, strict=True)])
