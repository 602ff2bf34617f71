"""Typed, validated configuration for a Sapling node.

A `NodeConfig` has five sections, the same as the TOML file
(``config.toml`` in the platformdirs config dir)::

    [model]  source = "bundled"
    [tasks]  questions_per_round = 8   specialties = { basic_arithmetic = 3.0, ... }
    [grpo]   learning_rate = 3e-4      eps_low = 0.2   eps_high = 0.28   kl_beta = 0.0
    [run]    device = "auto"           seed = -1       run_name = "default"
    [swarm]  mode = "embedded"         external_groups = 4

Each setting is declared once, as a dataclass field (`declare`) whose metadata
holds its help text; for one a person picks in the app, its label; where it
takes effect (live with a reload, at the next start, or only in a new run);
and a number's bounds. Every value is checked in ``__post_init__``; a bad one
raises `ConfigError` with one sentence naming the key and what is allowed (the
CLI exits 2). The settings as the app and `sapling-node config` present them
are engine/common/schema.py; the named bundles of values (the presets,
``run.power``) engine/common/presets.py; the file itself, read (defaults <
preset < TOML file < ``--set`` flags) and written, engine/common/config_file.py.

    python -m engine.common.config_file     # print the default config as TOML, with the help texts
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from engine.common.errors import ConfigError
from engine.common.fields import check_bounds, choice, declare, number, peer_reference, positive_int
from engine.common.presets import DEFAULT_WEIGHTS, POWER_PRESETS, PRIORITIES, SAPO_SPECIALTIES, TRAIN_ON
from engine.common.rules import INVITE_MAX_CHARS, parse_invite
from engine.common.schedule import Schedule


@dataclass
class ModelConfig:
    source: str = declare("'bundled' (SmolLM2-135M-Instruct), a local HF folder, or a HF hub id.", "bundled",
                          label="Model to train", name="model_source", applies="new_run")
    revision: str = declare("Hub revision (branch, tag or commit) for a hub id; empty for the default.", "",
                            applies="new_run")

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConfigError("model.source must be 'bundled', a folder path or a hub id like org/name.")
        if not isinstance(self.revision, str):
            raise ConfigError("model.revision must be a string (a branch, tag or commit).")


@dataclass
class TaskConfig:
    specialties: dict[str, float] = declare(
        "ReasoningGYM specialties and their relative weights (0 disables one).",
        factory=lambda: dict(DEFAULT_WEIGHTS),
    )
    dataset_configs: dict[str, dict[str, Any]] = declare(
        "Per-specialty ReasoningGYM config overrides, e.g. {basic_arithmetic = {max_terms = 3}}.",
        factory=dict,
    )
    questions_per_round: int = declare("Questions drawn per round (B).", 8)
    completions_per_question: int = declare("Completions sampled per question (G).", 8)
    max_new_tokens: int = declare("Cap on completion length, in tokens.", 48)
    temperature: float = declare(
        "Sampling temperature for rollouts; with adaptive_temperature, where a node starts and the lowest it goes.",
        0.7,
    )
    adaptive_temperature: bool = declare(
        "Let the sampling temperature follow the model: up a step when, of the last 24 own groups, more than 1 in 8 "
        "gave every answer the same score above 0 (the policy has sharpened: such a group teaches nothing), down "
        "a step when almost none did, between temperature and temperature_max (engine/questions/heat.py).", False,
    )
    temperature_max: float = declare("With adaptive_temperature: the highest sampling temperature.", 1.4)
    eval_every: int = declare("Run the held-out evaluation every N rounds (0: never).", 10)
    eval_questions: int = declare(
        "Size of the fixed held-out evaluation set (greedy pass@1), drawn evenly over the specialties; what an "
        "evaluation costs: docs/results.md 'Rollout speed'.", 108,
    )
    difficulty: str = declare(
        "'fixed': every specialty at its default config, drawn by the weights above. 'adaptive': each specialty "
        "moves down a level of its curriculum when most of its recent groups had every answer fail, up when most "
        "had every answer pass; the weights follow where groups are informative (never below a floor), kinds "
        "whose answers all scored the same lately are drawn less, and a specialty that fails even at its easiest "
        "level is drawn only now and then, never not at all (engine/questions/curriculum.py). A specialty with its own "
        "dataset_configs entry keeps that config. The held-out set stays at the default level.",
        "fixed",
    )
    eval_harder: bool = declare(
        "Also measure a second fixed held-out set one level harder than the default (as many questions, about as "
        "much time again), so progress beyond the default level shows.", False,
    )
    reask_share: float = declare(
        "Share (0 to 1) of each round's questions that ask again the node's own recent questions whose answers "
        "scored differently, each up to reask_max times; the rest are drawn fresh. 0: off "
        "(engine/questions/frontier.py).", 0.0,
    )
    reask_max: int = declare("Most times one question is asked again (see reask_share).", 3)
    probe_answers: int = declare(
        "Answers sampled first for each of probe_questions questions (0: off). The round then completes to G "
        "answers only questions_per_round of them: re-asked ones first, then those whose first answers scored "
        "differently (their group will teach), then the others in the order drawn. A question whose answers all "
        "agree costs this many answers instead of G (docs/architecture.md, 'Probing').", 0,
    )
    probe_questions: int = declare(
        "With probe_answers above 0: questions drawn and probed each round, re-asked ones included; at least "
        "questions_per_round.", 24,
    )

    def __post_init__(self) -> None:
        s = "tasks"
        if not isinstance(self.specialties, dict) or not self.specialties:
            raise ConfigError(f"{s}.specialties must be a table of specialty = weight, e.g. "
                              "{basic_arithmetic = 1.0}.")
        for name, weight in self.specialties.items():
            if name not in SAPO_SPECIALTIES:
                raise ConfigError(
                    f"{s}.specialties has unknown specialty {name!r}; allowed: {', '.join(SAPO_SPECIALTIES)}."
                )
            number(s, f"specialties.{name}", weight, 0.0, 1e6)
        if not any(w > 0 for w in self.specialties.values()):
            raise ConfigError(f"{s}.specialties must give at least one specialty a weight above 0.")
        if not isinstance(self.dataset_configs, dict):
            raise ConfigError(f"{s}.dataset_configs must be a table of specialty = {{option = value}}.")
        for name, cfg in self.dataset_configs.items():
            if name not in SAPO_SPECIALTIES or not isinstance(cfg, dict):
                raise ConfigError(
                    f"{s}.dataset_configs.{name} must be a table for one of: {', '.join(SAPO_SPECIALTIES)}."
                )
        positive_int(s, "questions_per_round", self.questions_per_round, 1024)
        positive_int(s, "completions_per_question", self.completions_per_question, 256)
        if self.completions_per_question < 2:
            raise ConfigError(f"{s}.completions_per_question must be at least 2: GRPO compares completions.")
        positive_int(s, "max_new_tokens", self.max_new_tokens, 2048)
        number(s, "temperature", self.temperature, 0.0, 5.0, open_low=True)
        if not isinstance(self.adaptive_temperature, bool):
            raise ConfigError(f"{s}.adaptive_temperature must be true or false, got {self.adaptive_temperature!r}.")
        number(s, "temperature_max", self.temperature_max, 0.0, 5.0, open_low=True)
        if self.adaptive_temperature and self.temperature_max < self.temperature:
            raise ConfigError(f"{s}.temperature_max ({self.temperature_max}) must be at least temperature "
                              f"({self.temperature}): the adaptive temperature moves between them.")
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise ConfigError(f"{s}.eval_every must be a whole number of rounds, 0 to turn evaluation off.")
        positive_int(s, "eval_questions", self.eval_questions, 10_000)
        choice(s, "difficulty", self.difficulty, ("fixed", "adaptive"))
        if not isinstance(self.eval_harder, bool):
            raise ConfigError(f"{s}.eval_harder must be true or false, got {self.eval_harder!r}.")
        number(s, "reask_share", self.reask_share, 0.0, 1.0)
        positive_int(s, "reask_max", self.reask_max, 1000)
        if (isinstance(self.probe_answers, bool) or not isinstance(self.probe_answers, int)
                or not 0 <= self.probe_answers < self.completions_per_question):
            raise ConfigError(f"{s}.probe_answers must be a whole number from 0 (off) to completions_per_question - 1 "
                              f"({self.completions_per_question - 1}), got {self.probe_answers!r}.")
        positive_int(s, "probe_questions", self.probe_questions, 1024)
        if self.probe_answers and self.probe_questions < self.questions_per_round:
            raise ConfigError(f"{s}.probe_questions ({self.probe_questions}) must be at least questions_per_round "
                              f"({self.questions_per_round}): the round completes that many of them.")


@dataclass
class GRPOConfig:
    learning_rate: float = declare(
        "AdamW learning rate of the trained weights (the LoRA adapters, or every weight with finetune = 'full'); "
        "how the default was chosen: docs/results.md 'Learning'.", 3e-4,
    )
    eps_low: float = declare("Lower clip range of the importance ratio (1 - eps_low).", 0.2)
    eps_high: float = declare("Upper clip range of the importance ratio (1 + eps_high).", 0.28)
    kl_beta: float = declare("Weight of the KL penalty to the reference model (0: none, no reference kept).", 0.0,
                             applies="new_run")
    adv_eps: float = declare("Added to the group std in (r - mean) / (std + eps).", 1e-4)
    train_on: str = declare(
        "Which groups a round trains on: 'passed' (those in which an answer scored full marks) or 'informative' "
        "(every group whose answers scored differently, as in the SAPO paper). Normalised by the group's spread, "
        "a difference of partial credit alone weighs like a right answer: trained on, the model learned to repeat "
        "the question's fraction, which scores 0.1 (docs/results.md 'Learning').", "passed")
    pg_steps: int = declare("Policy-gradient steps per round on the same rollouts.", 1)
    micro_batch: int = declare("Most sequences per forward/backward pass (gradient accumulation).", 8)
    micro_batch_tokens: int = declare("Most padded tokens per forward/backward pass; bounds activation memory.", 1024)
    max_grad_norm: float = declare("Gradient clipping norm (0: off).", 1.0)
    weight_decay: float = declare("AdamW weight decay.", 0.0)
    finetune: str = declare("'lora' (adapters via peft) or 'full' (all weights).", "lora", applies="new_run")
    lora_rank: int = declare("LoRA rank.", 16, applies="new_run")
    lora_alpha: int = declare("LoRA alpha (scale = alpha / rank).", 32, applies="new_run")
    lora_dropout: float = declare("LoRA dropout.", 0.0, applies="new_run")
    precision: str = declare("'auto' (bf16 autocast where the hardware has bf16), 'bf16' or 'fp32'.", "auto")

    def __post_init__(self) -> None:
        s = "grpo"
        number(s, "learning_rate", self.learning_rate, 0.0, 1.0, open_low=True)
        number(s, "eps_low", self.eps_low, 0.0, 1.0)
        number(s, "eps_high", self.eps_high, 0.0, 10.0)
        number(s, "kl_beta", self.kl_beta, 0.0, 100.0)
        number(s, "adv_eps", self.adv_eps, 0.0, 1.0, open_low=True)
        positive_int(s, "pg_steps", self.pg_steps, 64)
        positive_int(s, "micro_batch", self.micro_batch, 4096)
        positive_int(s, "micro_batch_tokens", self.micro_batch_tokens, 1 << 24)
        number(s, "max_grad_norm", self.max_grad_norm, 0.0, 1e6)
        number(s, "weight_decay", self.weight_decay, 0.0, 1.0)
        choice(s, "finetune", self.finetune, ("lora", "full"))
        positive_int(s, "lora_rank", self.lora_rank, 1024)
        positive_int(s, "lora_alpha", self.lora_alpha, 10_000)
        number(s, "lora_dropout", self.lora_dropout, 0.0, 0.9)
        choice(s, "precision", self.precision, ("auto", "bf16", "fp32"))
        choice(s, "train_on", self.train_on, TRAIN_ON)


@dataclass
class RunConfig:
    run_name: str = declare("Name of this training run; checkpoints live under checkpoints/<run_name>.", "default",
                            applies="new_run")
    seed: int = declare(
        "Node seed: fixes which questions each round draws and the sampling. -1: this install's own seed, drawn at "
        "random once and kept in the data dir (node-seed), so that no two computers draw the same questions and "
        "samples; 0 or more: that seed, which reproduces a run exactly. A run keeps the seed it began with.",
        -1, applies="new_run",
    )
    device: str = declare("'auto' (CUDA > MLX > CPU), 'cuda', 'mlx' or 'cpu'.", "auto", applies="new_run")
    threads: int = declare(
        "CPU threads for PyTorch (0: automatic, the cores other programs leave free, re-measured every few seconds).",
        0, label="CPU threads for training", low=0, high=1024,
    )
    priority: str = declare(
        "'background': the lowest OS priority (nice 19; Windows idle class; macOS background QoS), so your own "
        "programs always come first and training uses what they leave; 'normal': compete equally with them "
        "(training is faster while the computer is busy, and your programs slower).",
        "background", label="Priority", applies="restart",  # a process cannot raise its own priority again
    )
    power: str = declare(
        "'low', 'standard' or 'maximum': a bundle of threads, priority and duty_cycle (and in the app, the idle and "
        "AC-power pauses). low: 1 thread, background priority, training at most half of each minute, only when "
        "idle and plugged in; standard: automatic threads at background priority; maximum: automatic threads at "
        "normal priority. A key you set yourself wins over the bundle.", "standard", label="Power",
    )
    duty_cycle: float = declare(
        "Share of the time training may use (0.5: at most half of each minute, resting between steps); 1: all.", 1.0,
        label="Share of each minute for training", low=0.0, high=1.0, open_low=True,
    )
    schedule: str = declare(
        "Hours when training runs, local time: '22:00-07:00', 'weekdays 22:00-07:00' or 'weekends 09:00-18:00'; "
        "empty: at any hour. Outside them the node finishes its round, keeps its checkpoint and sleeps.", "",
        label="Hours for training",
    )
    max_rounds: int = declare("Stop after this round number (0: train until stopped).", 0)
    keep_checkpoints: int = declare("How many recent good checkpoints to keep.", 3)
    metrics_max_kb: int = declare(
        "Most kilobytes metrics.jsonl may hold; past it the oldest half of its lines is dropped (a round's line is "
        "1.5 kB, up to some 8 kB with many peers listed: the default keeps days to weeks of rounds).", 32768,
        applies="restart")

    def __post_init__(self) -> None:
        s = "run"
        check_bounds(s, self)
        name = self.run_name
        if (not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name)
            or name.startswith(".")):
            raise ConfigError(f"{s}.run_name must be 1-64 letters, digits, '-', '_' or '.', got {name!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not -1 <= self.seed < 2**31:
            raise ConfigError(f"{s}.seed must be -1 (this install's own) or a whole number from 0 to 2147483647, "
                              f"got {self.seed!r}.")
        choice(s, "device", self.device, ("auto", "cuda", "mlx", "cpu"))
        choice(s, "priority", self.priority, PRIORITIES)
        choice(s, "power", self.power, tuple(POWER_PRESETS))
        Schedule.parse(self.schedule)  # ConfigError naming run.schedule and what to write
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 0:
            raise ConfigError(f"{s}.max_rounds must be 0 (no limit) or a positive round number.")
        positive_int(s, "keep_checkpoints", self.keep_checkpoints, 1000)
        positive_int(s, "metrics_max_kb", self.metrics_max_kb, 1 << 22)


@dataclass
class SwarmConfig:
    mode: str = declare(
        "'embedded' (start a relay in this process that local nodes can join), 'relay' (join relay_url) or 'solo'.",
        "embedded", label="Swarm", name="swarm_mode", applies="restart",
    )
    relay_url: str = declare(
        "For mode 'relay': an invite link (sapling://join?relay=...&relay=...&token=...&name=..., or the "
        "https://HOST/join?... page) or a bare relay address (wss://relay.example.org/ws). With several relays "
        "the node uses the one that last worked and moves to the next when it fails.",
        "", label="Invite", applies="restart",
    )
    join_token: str = declare("Join token of a private swarm, when relay_url does not carry one (an invite does).", "",
                              label="Join token", applies="restart")
    embedded_host: str = declare("Address the embedded relay listens on ('127.0.0.1': this computer only).",
                                 "127.0.0.1", applies="restart")
    embedded_port: int = declare("Port of the embedded relay (0: pick a free one).", 8765, applies="restart")
    embedded_lan: bool = declare("Let other computers on this network join the embedded relay: it listens on every "
                                 "interface and announces itself (mDNS, `sapling-node discover`). Off: nothing is "
                                 "announced.", False, label="Let this network's computers join", applies="restart")
    refuse_dataset_swarms: bool = declare(
        "Never join a swarm whose relay says it keeps a dataset of the answers shared in it (its information "
        "document's dataset field; docs/relay-operators.md): the app's Join refuses it, and a node in relay mode "
        "asks the relay first and does not connect when it does, or when it cannot tell.", False,
        label="Refuse swarms that publish a dataset", applies="restart",
    )
    report_results: bool = declare(
        "At each held-out evaluation (tasks.eval_every), also answer the relay's evaluation questions of the hour "
        "greedily and send the answers, signed with the model's label and a hash of the checkpoint; the relay "
        "re-scores them and lists this node's latest and best on its results table (GET /stats/results.json, its "
        "status page). Off: nothing is sent and the node is not on the table.", True,
        label="Put my model on the swarm's results table",
    )
    local_groups: int = declare(
        "I: own rollouts (a question with its G completions) in each round's training batch; 0 means all of them.",
        0,
    )
    external_groups: int = declare(
        "J: rollouts sampled from the swarm for each round's training batch (0: solo). docs/results.md 'Swarm' "
        "measures what joining does, per round and per hour.",
        4,
    )
    train_groups: int = declare(
        "A cap on each round's training batch, in groups trained on (0: none, all yours that grpo.train_on keeps "
        "plus J from the swarm). Swarm rollouts only fill the batch up to it after your own, so a "
        "round in which your own questions taught enough takes none and trains no more than a round alone "
        "(docs/results.md 'Swarm' compares the settings per hour). Your own groups are never left out for it.",
        4,
    )
    peer_questions: float = declare(
        "Share (0 to 1) of each round's B questions taken from the swarm's teaching questions: questions whose "
        "answers scored differently for a peer, verified here, which this node then answers itself (its own G "
        "answers, trained on as its own group; the peer's text is not trained on). 0: off "
        "(engine/questions/peers.py; what it does per hour: docs/results.md 'Swarm').", 0.0, low=0.0, high=1.0,
    )
    local_informative_first: bool = declare(
        "With local_groups below the round's questions: fill the I own slots first with rollouts that are trained "
        "on (rewards that differ; with grpo.train_on 'passed', one answer passed), not I at random (docs/swarm.md).",
        False,
    )
    plausibility_check: bool = declare(
        "Refuse answers your model finds implausible (injected text, docs/swarm.md 'Poisoning'); they are counted "
        "as 'implausible'. The node applies the swarm's model policy, which its relay declares: in a swarm of one "
        "model (also any relay that declares nothing, and the local one) every answer is tested against this "
        "node's model; in a swarm of different models an answer labelled with another model is tested against "
        "its sender's usual answers instead, so honest peers of other models are not refused.",
        True, label="Refuse implausible answers",
    )
    implausible_logprob: float = declare(
        "The plausibility floor: an external item is 'implausible' when one of its completions has "
        "plausibility_window consecutive tokens whose mean log-prob under this node's policy is below it "
        "(lowered below this round's own least likely text; thresholds measured in docs/results.md).",
        -7.0,
    )
    plausibility_window: int = declare("Tokens in the window of the plausibility test (1: single tokens).", 4)
    length_ratio: float = declare(
        "Refuse as 'too_long' an external answer that would be reinforced and is longer than this many times this "
        "node's own rewarded answers of the round (90th percentile, at least 4 tokens more; docs/swarm.md "
        "'Poisoning': correct answers padded to be long). 0: off.", 1.5)
    probation_items: int = declare(
        "In a swarm of different models: how many accepted answers of a sender of another model (per sender and "
        "model label) make its baseline. Until then its answers are trained on with truncated token weights only, "
        "never refused as implausible, and counted as 'probation' in the peers panel.",
        8,
    )
    sender_spreads: float = declare(
        "In a swarm of different models: an answer labelled with another model is 'implausible' when its least "
        "likely plausibility_window tokens lie more than this many spreads (median absolute deviation x 1.4826, "
        "at least 1 nat) below the median of its sender's accepted answers. Never a ban strike.",
        4.0,
    )
    token_weight_logprob: float = declare(
        "Tokens of accepted external text below this log-prob under this node's policy get a truncated "
        "importance weight p / exp(floor) < 1 in the loss, so one odd token cannot dominate a step "
        "(-100: weigh every token fully).",
        -6.0,
    )
    offpolicy_negative_kl: float = declare(
        "F-TIS filter (off at 0): leave out of training an external completion with negative advantage when its "
        "mean per-token log-loss under this node's policy exceeds that of this round's own completions by more "
        "than this many nats (an estimate of how far off-policy it is; docs/swarm.md). Where it was measured to "
        "help, and where not: docs/results.md 'Swarm'. A value to try: 0.5.",
        0.0,
    )
    ban_strikes: int = declare(
        "Ban a peer here when this many of its last ban_window judged items were rejected as forged_reward or "
        "implausible (0: never ban automatically).",
        6, label="Strikes before a ban", low=0, high=10_000,
    )
    ban_window: int = declare("How many of a peer's most recent judged items the ban rule looks at.", 12,
                              label="Judged answers the ban rule looks at", low=1, high=10_000)
    ban_hours: float = declare("How long an automatic ban lasts, in hours (0: until lifted by hand).", 24.0,
                               label="Ban length (hours)", low=0.0, high=24.0 * 365 * 100)
    persist_bans: bool = declare(
        "Keep automatic bans in the data dir (swarm/bans.json) across restarts; false: for this session only.", True,
        label="Remember bans", applies="restart",
    )
    banned_peers: list[str] = declare(
        "Peers this node never trains on: peer ids (20 hex characters, as shown in the peers panel) or public "
        "keys (base64). Bans listed here can only be lifted here.",
        factory=list, label="Banned peers", applies="restart",
    )
    daily_upload_mb: float = declare("Most megabytes sent to the swarm a day, local time (0: no cap); at the cap "
                                     "the node stops sharing until midnight and trains on its own rollouts.", 0.0,
                                     label="Swarm data sent a day (MB)", low=0.0, high=1e9)
    daily_download_mb: float = declare("Most megabytes received from the swarm a day (0: no cap); at the cap the "
                                       "node takes no more rollouts until midnight.", 0.0,
                                       label="Swarm data received a day (MB)", low=0.0, high=1e9)
    replay_memory: int = declare(
        "External items already trained on that are remembered (by content, across restarts, in the data dir) "
        "and dropped as 'duplicate' when sent again under any sequence number (0: off).",
        20000, applies="restart",
    )

    def __post_init__(self) -> None:
        s = "swarm"
        check_bounds(s, self)
        for key in ("plausibility_check", "persist_bans", "local_informative_first", "embedded_lan",
                    "refuse_dataset_swarms", "report_results"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{s}.{key} must be true or false, got {getattr(self, key)!r}.")
        number(s, "implausible_logprob", self.implausible_logprob, -100.0, 0.0)
        positive_int(s, "plausibility_window", self.plausibility_window, 256)
        number(s, "length_ratio", self.length_ratio, 0.0, 100.0)
        if (isinstance(self.probation_items, bool) or not isinstance(self.probation_items, int)
            or not 1 <= self.probation_items <= 10_000):
            raise ConfigError(f"{s}.probation_items must be a whole number from 1 to 10000, got "
                              f"{self.probation_items!r}.")
        number(s, "sender_spreads", self.sender_spreads, 0.0, 100.0, open_low=True)
        number(s, "token_weight_logprob", self.token_weight_logprob, -100.0, 0.0)
        number(s, "offpolicy_negative_kl", self.offpolicy_negative_kl, 0.0, 100.0)
        if self.ban_strikes > self.ban_window:
            raise ConfigError(f"{s}.ban_strikes ({self.ban_strikes}) must be at most swarm.ban_window "
                              f"({self.ban_window}).")
        if not isinstance(self.banned_peers, list) or not all(isinstance(p, str) for p in self.banned_peers):
            raise ConfigError(f"{s}.banned_peers must be a list of peer ids or public keys, e.g. "
                              "[\"3750d8d5a1b2c3d4e5f6\"].")
        for peer in self.banned_peers:
            if not peer_reference(peer):
                raise ConfigError(
                    f"{s}.banned_peers has {peer!r}: use a peer id (20 hex characters) or a public key (base64 of 32 "
                    "bytes)."
                )
        if (isinstance(self.replay_memory, bool) or not isinstance(self.replay_memory, int)
            or not 0 <= self.replay_memory <= 10_000_000):
            raise ConfigError(f"{s}.replay_memory must be a whole number from 0 (off) to 10000000, got "
                              f"{self.replay_memory!r}.")
        choice(s, "mode", self.mode, ("embedded", "relay", "solo"))
        if not isinstance(self.relay_url, str) or len(self.relay_url) > INVITE_MAX_CHARS:
            raise ConfigError(f"{s}.relay_url must be an invite link or a ws:// or wss:// URL of at most "
                              f"{INVITE_MAX_CHARS} characters.")
        if self.mode == "relay" and not self.relay_url.strip():
            raise ConfigError(f"{s}.relay_url must be set when swarm.mode is 'relay'.")
        if self.mode == "relay":
            try:
                parse_invite(self.relay_url)
            except ConfigError as exc:
                raise ConfigError(f"{s}.relay_url: {exc}") from None
        if not isinstance(self.join_token, str) or len(self.join_token) > 256:
            raise ConfigError(f"{s}.join_token must be a string of at most 256 characters.")
        if not isinstance(self.embedded_host, str) or not self.embedded_host:
            raise ConfigError(f"{s}.embedded_host must be an address such as 127.0.0.1.")
        if (isinstance(self.embedded_port, bool) or not isinstance(self.embedded_port, int)
            or not 0 <= self.embedded_port <= 65535):
            raise ConfigError(f"{s}.embedded_port must be a port number from 0 to 65535, got {self.embedded_port!r}.")
        if (isinstance(self.local_groups, bool) or not isinstance(self.local_groups, int)
            or not 0 <= self.local_groups <= 256):
            raise ConfigError(f"{s}.local_groups must be a whole number from 0 (all of the round's questions) to 256, "
                              f"got {self.local_groups!r}.")
        if (isinstance(self.external_groups, bool) or not isinstance(self.external_groups, int)
            or not 0 <= self.external_groups <= 256):
            raise ConfigError(f"{s}.external_groups must be a whole number from 0 (solo) to 256, got "
                              f"{self.external_groups!r}.")
        if (isinstance(self.train_groups, bool) or not isinstance(self.train_groups, int)
            or not 0 <= self.train_groups <= 512):
            raise ConfigError(f"{s}.train_groups must be a whole number from 0 (no cap) to 512, got "
                              f"{self.train_groups!r}.")


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "tasks": TaskConfig,
    "grpo": GRPOConfig,
    "run": RunConfig,
    "swarm": SwarmConfig,
}

@dataclass
class NodeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    tasks: TaskConfig = field(default_factory=TaskConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    run: RunConfig = field(default_factory=RunConfig)
    swarm: SwarmConfig = field(default_factory=SwarmConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def structure_hash(self) -> str:
        """What a checkpoint's tensors depend on: model and adapter shape."""
        g = self.grpo
        key: dict[str, Any] = {"model": asdict(self.model), "finetune": g.finetune}
        if g.finetune == "lora":
            key.update(rank=g.lora_rank, alpha=g.lora_alpha)
        return _digest(key)

    def config_hash(self) -> str:
        return _digest(self.to_dict())


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def with_changes(config: NodeConfig, **sections: dict[str, Any]) -> NodeConfig:
    """A copy with some fields of some sections changed, validated again."""
    updated = {name: replace(getattr(config, name), **sections.get(name, {})) for name in SECTIONS}
    return NodeConfig(**updated)

