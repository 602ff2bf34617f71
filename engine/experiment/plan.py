"""What an experiment runs and where it keeps it: the plan, its frozen settings, the file names and readers.

The one module that both `engine.experiment.runner` (which runs a plan) and
`engine.experiment.report` (which reads what a run left) import, so neither
imports the other's internals. Torch-free: a report can be built without it.

An experiment folder holds `experiment.json`: the plan (nodes, mixes, rounds,
the presets and `--set` it began with) and the complete settings that plan
resolved to on the day it began, with the Sapling version. A resumed run, or a
mix added to the folder later, uses those saved settings, so a default changed
in a later version never changes an experiment that is half done.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine import __version__
from engine.common.atomicio import append_line
from engine.common.config import SECTIONS, NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.presets import PRESETS
from engine.node.seeds import AUTO_SEED

# Node k's seed is seed + k * NODE_SEED_SPACING. reasoning-gym builds item (seed, index) from
# Random(seed + index), and a round's questions take indices round * 1024 + slot, so seeds one apart
# would hand node 1 node 0's questions one slot later; 10^7 apart, streams never meet before round 9765.
NODE_SEED_SPACING = 10_000_000
MAX_NODES = 64
# At least this many held-out questions: 27 move by one question for a 3.7-point change.
MIN_EVAL_QUESTIONS = 200
MAX_VETERAN_ROUNDS = 10_000

PLAN_FILE = "experiment.json"
PROGRESS_FILE = "progress.json"
ROUNDS_FILE = "rounds.jsonl"
EVAL_FILE = "eval.json"
EVALS_FILE = "evals.jsonl"  # held-out accuracy on the way, every tasks.eval_every rounds of a mix
START_EVAL_FILE = "eval-start.json"
VETERANS_FOLDER = "veterans"  # the veterans' own training, kept in the experiment folder


@dataclass(frozen=True)
class Mix:
    """SAPO's I/J: I own groups and J external groups in each round's training batch."""

    local: int
    external: int

    @property
    def label(self) -> str:
        return f"{self.local}/{self.external}"

    @property
    def slug(self) -> str:
        return f"mix-{self.local}-{self.external}"


def parse_mixes(text: str) -> tuple[Mix, ...]:
    """'8/0,4/4' -> mixes; anything else is a ConfigError (one sentence, exit 2)."""
    mixes: list[Mix] = []
    for part in str(text).split(","):
        left, slash, right = part.strip().partition("/")
        if not slash or not left.isdigit() or not right.isdigit():
            raise ConfigError("--mixes takes I/J pairs of whole numbers separated by commas, like 8/0,4/4; got "
                              f"{part.strip()!r}.")
        mix = Mix(int(left), int(right))
        if mix in mixes:
            raise ConfigError(f"--mixes lists {mix.label} twice.")
        mixes.append(mix)
    return tuple(mixes)


@dataclass(frozen=True)
class Plan:
    """What an experiment runs; saved in --out so that a resumed run uses the same.

    veterans > 0: nodes 0..veterans-1 first train veteran_rounds rounds alone
    (mix B/0, in the folder's `veterans/`), then every mix starts them from
    that checkpoint, still training, beside nodes that start fresh (the
    newcomers). Every node's round counter starts at veteran_rounds, so a
    newcomer draws the same questions in every mix.
    """

    nodes: int
    mixes: tuple[Mix, ...]
    rounds: int
    preset: str  # the experiment preset
    overrides: tuple[str, ...]  # --set, after the preset's own
    veterans: int = 0
    veteran_rounds: int = 0
    # The complete settings the plan resolved to when the folder began (NodeConfig.to_dict), and the
    # version that resolved them; empty in folders begun before they were saved.
    settings: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    version: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"nodes": self.nodes, "mixes": [m.label for m in self.mixes], "rounds": self.rounds,
                                "preset": self.preset, "overrides": list(self.overrides)}
        if self.veterans:
            data.update(veterans=self.veterans, veteran_rounds=self.veteran_rounds)
        if self.settings:
            data.update(settings=self.settings, version=self.version)
        return data

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Plan:
        settings = obj.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("settings is not a table")
        return cls(int(obj["nodes"]), parse_mixes(",".join(obj["mixes"])), int(obj["rounds"]), str(obj["preset"]),
                   tuple(obj["overrides"]), int(obj.get("veterans", 0)), int(obj.get("veteran_rounds", 0)),
                   settings, str(obj.get("version", "")))

    def frozen(self) -> Plan:
        """This plan with the settings it resolves to today written into it (kept from then on)."""
        if self.settings:
            return self
        return replace(self, settings=_resolve(self).to_dict(), version=__version__)


@dataclass(frozen=True)
class ExperimentPreset:
    nodes: int
    mixes: str
    rounds: int
    config_preset: str
    settings: tuple[str, ...]  # applied before the user's --set


# default: about two hours on a 2-core CPU (docs/results.md, "Swarm"). paper: the SAPO paper's
# controlled experiment (8 nodes, one question per specialty per round, 8 completions, all four mixes), for a GPU.
# A mix I/J means I own and J external groups exactly, so the experiment turns off the node's default cap on
# the training batch (swarm.train_groups); --set swarm.train_groups=4 measures the app's default node.
EXPERIMENT_PRESETS = {
    "default": ExperimentPreset(4, "8/0,4/4", 25, "default",
                                (f"tasks.eval_questions={MIN_EVAL_QUESTIONS}", "swarm.train_groups=0")),
    "paper": ExperimentPreset(8, "8/0,6/2,4/4,2/6", 500, "paper",
                              ("tasks.questions_per_round=9", f"tasks.eval_questions={MIN_EVAL_QUESTIONS}")),
}


def make_plan(preset: str, nodes: int | None, mixes: str | None, rounds: int | None, overrides: Sequence[str],
              veterans: int = 0, veteran_rounds: int = 0) -> Plan:
    if preset not in EXPERIMENT_PRESETS:
        raise ConfigError(f"--preset must be one of {', '.join(EXPERIMENT_PRESETS)}, got {preset!r}.")
    base = EXPERIMENT_PRESETS[preset]
    plan = Plan(base.nodes if nodes is None else nodes, parse_mixes(base.mixes if mixes is None else mixes),
                base.rounds if rounds is None else rounds, preset, tuple(overrides), veterans, veteran_rounds)
    check_plan(plan, plan_config(plan))
    return plan.frozen()


def _resolve(plan: Plan) -> NodeConfig:
    base = EXPERIMENT_PRESETS[plan.preset]
    if base.config_preset not in PRESETS:
        raise ConfigError(f"unknown config preset {base.config_preset!r}")
    config = build_config(base.config_preset, None, [*base.settings, *plan.overrides])
    # An experiment reproduces: its nodes take explicit seeds (seed + k * NODE_SEED_SPACING), from 0 unless --seed says.
    return config if config.run.seed != AUTO_SEED else replace(config, run=replace(config.run, seed=0))


def plan_config(plan: Plan) -> NodeConfig:
    """The settings every node shares: the ones saved in the plan, else defaults < config preset <
    experiment preset < --set as they resolve today. A key a later version added takes its default;
    a key it removed is dropped."""
    if not plan.settings:
        return _resolve(plan)
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        saved = plan.settings.get(name, {})
        known = {f.name for f in fields(cls)}
        values = {**BEFORE_THE_KEY.get(name, {}), **(saved if isinstance(saved, dict) else {})}
        sections[name] = cls(**{k: v for k, v in values.items() if k in known})
    return NodeConfig(**sections)


# Keys added with a default that changes what a folder begun before them measured: such a folder keeps
# the value the key stands for there (no cap on the training batch; fixed difficulty; training on every group
# whose answers scored differently).
BEFORE_THE_KEY: dict[str, dict[str, Any]] = {"swarm": {"train_groups": 0}, "tasks": {"difficulty": "fixed"},
                                             "grpo": {"train_on": "informative"}}


def check_plan(plan: Plan, config: NodeConfig) -> None:
    """Refuse, in one sentence, a plan that cannot run as asked."""
    if plan.nodes < 2:
        raise ConfigError("--nodes must be at least 2 (an experiment compares sharing between nodes), got "
                          f"{plan.nodes}.")
    if plan.nodes > MAX_NODES:
        raise ConfigError(f"--nodes must be at most {MAX_NODES}, got {plan.nodes}.")
    if plan.rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {plan.rounds}.")
    if not plan.mixes:
        raise ConfigError("--mixes must name at least one I/J mix, like 8/0,4/4.")
    if plan.veterans < 0 or plan.veterans >= plan.nodes:
        raise ConfigError(f"--veterans must be from 1 to {plan.nodes - 1} (at least one node must start fresh), "
                          f"got {plan.veterans}.")
    if plan.veterans and not 1 <= plan.veteran_rounds <= MAX_VETERAN_ROUNDS:
        raise ConfigError(f"--veteran-rounds must be from 1 to {MAX_VETERAN_ROUNDS}, got {plan.veteran_rounds}.")
    if not plan.veterans and plan.veteran_rounds:
        raise ConfigError("--veteran-rounds needs --veterans N (how many nodes start trained).")
    B = config.tasks.questions_per_round
    for mix in plan.mixes:
        if mix.local < 1:
            raise ConfigError(f"Mix {mix.label}: I must be at least 1 (a node trains on some of its own groups).")
        if mix.local > B:
            raise ConfigError(f"Mix {mix.label}: I is more than the {B} questions a node writes each round "
                              f"(raise tasks.questions_per_round).")
        offered = (plan.nodes - 1) * B
        if mix.external > offered:
            raise ConfigError(f"Mix {mix.label}: J is more than the {offered} groups the other {plan.nodes - 1} "
                              f"node(s) offer each round ({B} questions each).")
    if config.grpo.finetune != "lora":
        raise ConfigError("The experiment needs grpo.finetune = 'lora': the nodes share one frozen base model.")
    if config.run.seed + (plan.nodes - 1) * NODE_SEED_SPACING >= 2**31:
        raise ConfigError(f"run.seed is too large for {plan.nodes} nodes; use a seed below 2000000000 - "
                          f"{(plan.nodes - 1) * NODE_SEED_SPACING}.")


def same_experiment(saved: Plan, plan: Plan) -> bool:
    """Whether `plan` is the experiment `saved` began: other mixes allowed (they pair exactly), and more rounds (a
    longer plan runs the same rounds first, so the rounds already run are its own)."""
    return plan.rounds >= saved.rounds and replace(saved, mixes=plan.mixes, rounds=plan.rounds) == plan


def widen(saved: Plan | None, plan: Plan) -> Plan:
    """`plan`, or the saved plan (settings included) with its mixes and then `plan`'s new ones, and `plan`'s rounds,
    when only the mixes differ or the rounds grew."""
    if saved is None or not same_experiment(saved, plan):
        return plan
    mixes = saved.mixes + tuple(m for m in plan.mixes if m not in saved.mixes)
    return replace(saved, mixes=mixes, rounds=plan.rounds).frozen()


def lengthen(saved: Plan, rounds: int, out: Path) -> Plan:
    """The saved plan run to `rounds` rounds (--resume --rounds N); fewer than it planned is refused."""
    if rounds < saved.rounds:
        raise ConfigError(f"{out} planned {saved.rounds} rounds; an experiment can grow (--rounds {saved.rounds} or "
                          f"more), not shrink, got --rounds {rounds}.")
    return replace(saved, rounds=rounds)


def reopen_end_evaluation(folder: Path, rounds: int) -> None:
    """When a mix's plan grew past the round its end evaluation (EVAL_FILE) was taken at, that evaluation becomes
    one on the way (EVALS_FILE), and the end one is taken again at the new last round."""
    ended = read_json(Path(folder) / EVAL_FILE)
    if ended is None or not isinstance(ended.get("round"), int) or ended["round"] >= rounds:
        return
    if ended["round"] not in read_evals(folder):
        append_line(Path(folder) / EVALS_FILE, json.dumps(ended, sort_keys=True))
    (Path(folder) / EVAL_FILE).unlink()


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def saved_plan(out: Path) -> Plan | None:
    """The plan saved in an experiment folder, None when there is none; a ConfigError when it is damaged."""
    data = read_json(Path(out) / PLAN_FILE)
    if data is None:
        return None
    try:
        return Plan.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{Path(out) / PLAN_FILE} is not an experiment plan ({exc}); use another --out.") from exc



def plan_with_mix(folder: Path, label: str) -> Plan:
    """The plan saved in `folder`, which must hold mix `label`; a ValueError in one sentence when it does not."""
    plan = saved_plan(folder)
    if plan is None or label not in [m.label for m in plan.mixes]:
        raise ValueError(f"{folder} holds no experiment with mix {label}.")
    return plan

def rounds_done(folder: Path) -> int:
    """The last round that every node of a mix finished (its progress.json)."""
    return int((read_json(Path(folder) / PROGRESS_FILE) or {}).get("round", 0))


def read_evals(folder: Path) -> dict[int, dict[str, Any]]:
    """A mix's held-out evaluations on the way (EVALS_FILE) by round; a repeated round's last line wins."""
    return {record["round"]: record for record in read_rounds(Path(folder) / EVALS_FILE, rounds_done(folder))}


def read_rounds(path: Path, upto: int) -> list[dict[str, Any]]:
    """The round records of a mix, one per round up to `upto` (a redone round's last record wins)."""
    records: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(record, dict) and isinstance(record.get("round"), int) and 1 <= record["round"] <= upto:
            records[record["round"]] = record
    return [records[r] for r in sorted(records)]
