"""The model card every export writes (engine/gguf/card.py), read back with huggingface_hub's own parser.

The card's numbers are worked out by hand from metrics lines written here: 3 of 8
held-out questions solved is an accuracy of 0.375, and the rounds' rewards are
tenths. The end-to-end tests train a tiny random model for two rounds (as
tests/engine/test_sapo.py does), evaluate it and export it.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import ModelCard, metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results

from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.paths import EXPORT_MARKER, Paths
from engine.gguf.card import (
    BUNDLED_HUB_ID,
    CARD_MARK,
    Card,
    Exported,
    card_files,
    check_card_files,
    model_card,
    published_card,
    written_by_sapling,
)
from engine.gguf.export import export_model
from tests.engine.test_sapo import make_node

PNG = b"\x89PNG\r\n\x1a\n"
SECRET = "s3cret-join-token"


def _line(**record: Any) -> str:
    return json.dumps({"run": "default", **record}) + "\n"


def _metrics(path: Path) -> Path:
    """Rounds 1-6 with rewards 0.1-0.6 and 2 swarm groups each; held-out 2 of 8 at round 0, 3 of 8 at round 5,
    and a round-7 evaluation after the exported round; another run's line and a torn line are skipped."""
    rounds = [_line(kind="round", round=r, reward_mean=r / 10, external_groups=2) for r in range(1, 7)]
    evals = [_line(kind="eval", round=0, accuracy=0.25, questions=8,
                   by_specialty={"basic_arithmetic": 0.5, "base_conversion": 0.0}),
             _line(kind="eval", round=5, accuracy=0.375, questions=8,
                   by_specialty={"basic_arithmetic": 0.75, "base_conversion": 0.0}),
             _line(kind="eval", round=7, accuracy=0.875, questions=8, by_specialty={})]
    other = json.dumps({"run": "other", "kind": "eval", "round": 6, "accuracy": 1.0, "questions": 8}) + "\n"
    path.write_text("".join([*rounds, *evals, other, '{"run": "default", "kind": "ro']))
    return path


def _card(tmp_path: Path, config: NodeConfig, fmt: str = "hf", out: str = "my-model", round_index: int = 6,
          metrics: Path | None = None) -> Card:
    exported = Exported(tmp_path / out, fmt, None if fmt == "hf" else "f16", round_index, tmp_path / "SmolLM2", 1234)
    return model_card(config, metrics or _metrics(tmp_path / "metrics.jsonl"), exported)


def test_the_card_parses_with_the_hubs_parser_and_reports_the_last_held_out_result_up_to_the_export(
        tmp_path: Path) -> None:
    card = _card(tmp_path, build_config("default", None, ["swarm.mode='solo'"]))
    parsed = ModelCard(card.text)
    assert parsed.data.base_model == BUNDLED_HUB_ID == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert parsed.data.library_name == "transformers" and parsed.data.license == "apache-2.0"
    assert parsed.data.tags == ["sapling", "grpo", "sapo", "reinforcement-learning", "reasoning-gym", "lora"]
    assert parsed.data.pipeline_tag == "text-generation" and parsed.data["base_model_relation"] == "finetune"
    name, results = model_index_to_eval_results(parsed.data.to_dict()["model-index"])
    assert name == "my-model" and len(results) == 1
    result = results[0]  # round 5's 3 of 8, not round 7's (after the export) nor the other run's
    assert (result.metric_type, result.metric_value, result.dataset_type) == ("accuracy", 0.375, "reasoning-gym")
    assert result.dataset_args == {"questions": 8, "round": 5} and "8 reasoning-gym questions" in result.dataset_name
    text = parsed.text
    assert "**37.5% (3 of 8 questions)**" in text and "this export is 1 round later" in text
    assert "The base model, at round 0: 25.0% (2 of 8 questions)." in text
    assert "| basic_arithmetic | 75.0% |" in text and "rounds 1 to 6" in text
    assert "alone (swarm.mode = solo)" in text and "not a general assistant" in text
    assert "sapling-node run --run-name default --seed 1234 --rounds 6 --solo\n" in text  # the defaults: no --set
    assert "sapling-node export --run-name default --round 6 --format hf --out my-model" in text
    assert [path.name for path, _ in card.contents] == ["reward.png", "held-out.png", "README.md"]
    assert all(data.startswith(PNG) for _, data in card.contents[:2])
    assert "![Reward per round](reward.png)" in text and "![Held-out accuracy](held-out.png)" in text
    assert text.rstrip().endswith(CARD_MARK)


def test_a_run_that_never_evaluated_gets_no_model_index_and_its_card_says_so(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_line(kind="round", round=1, reward_mean=0.5))
    card = _card(tmp_path, build_config("default"), round_index=1, metrics=metrics)
    parsed = ModelCard(card.text)
    assert "model-index" not in parsed.data.to_dict() and not parsed.data.eval_results
    assert "never ran its held-out evaluation up to round 1" in parsed.text
    assert [path.name for path, _ in card.contents] == ["reward.png", "README.md"]  # no held-out curve
    empty = _card(tmp_path, build_config("default"), round_index=0, metrics=tmp_path / "none.jsonl")
    assert [path.name for path, _ in empty.contents] == ["README.md"]
    assert "before any training" in empty.text and "sapling-node run" not in empty.text  # nothing to train


def test_the_swarm_is_named_by_its_relay_without_the_join_token_or_a_password(tmp_path: Path) -> None:
    invite = (f"sapling://join?relay=wss%3A%2F%2Fana%3Apw%40relay.example.org%3A8443%2Fws&token={SECRET}"
              "&name=Puzzlers")
    config = build_config("default", None, ["swarm.mode='relay'", f"swarm.relay_url='{invite}'",
                                             f"swarm.join_token='{SECRET}-2'"])
    text = _card(tmp_path, config, "gguf", "my-model.gguf").text
    assert "the swarm \"Puzzlers\" at wss://relay.example.org:8443/ws" in text
    assert "12 rollout groups from other nodes" in text  # 2 a round, rounds 1-6
    assert SECRET not in text and "ana:" not in text and "pw@" not in text
    assert "--relay 'INVITE'" in text
    embedded = _card(tmp_path, build_config("default", None, ["swarm.embedded_lan=true"])).text
    assert "its own relay, open to nodes on this computer and its network" in embedded


def test_a_gguf_card_is_named_for_the_file_with_the_hubs_gguf_library(tmp_path: Path) -> None:
    files = card_files(tmp_path / "my-model.Q8.GGUF", "gguf")
    assert [p.name for p in files] == ["my-model.Q8.README.md", "my-model.Q8-reward.png", "my-model.Q8-held-out.png"]
    assert card_files(tmp_path / "plain", "gguf").readme.name == "plain.README.md"
    card = _card(tmp_path, build_config("default"), "gguf-lora", "adapter.gguf")
    data = ModelCard(card.text).data
    assert data.library_name == "gguf" and {"gguf", "lora"} <= set(data.tags)
    assert data["base_model_relation"] == "adapter" and "(this file is the adapter)" in card.text
    assert "![Reward per round](adapter-reward.png)" in card.text
    assert "--format gguf-lora --quant f16 --out adapter.gguf" in card.text


def test_the_license_comes_from_the_source_folders_readme_or_is_other_and_the_card_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "my-base"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    config = build_config("default", None, [f"model.source='{folder}'", "grpo.finetune='full'"])

    def data(source_dir: Path) -> Any:
        exported = Exported(tmp_path / "out", "hf", None, 6, source_dir, None)
        card = model_card(config, _metrics(tmp_path / "metrics.jsonl"), exported)
        return ModelCard(card.text)

    other = data(folder)
    assert other.data.license == "other" and other.data.base_model is None  # a local folder: no Hub id invented
    assert "check its license before you publish" in other.text and "lora" not in other.data.tags
    assert "every weight (full fine-tuning)" in other.text and "--model path/to/my-base" in other.text
    assert "not recorded (this install's own)" in other.text
    (folder / "README.md").write_text("---\nlicense: mit\nbase_model: someone/else\n---\n# mine\n")
    mit = data(folder)
    assert mit.data.license == "mit" and mit.data.base_model is None
    (folder / "README.md").write_text("---\nlicense: [unclosed\n---\n")
    assert data(folder).data.license == "other"  # front matter that does not parse names no license
    hub = build_config("default", None, ["model.source='Qwen/Qwen2.5-0.5B-Instruct'"])
    exported = Exported(tmp_path / "out", "hf", None, 6, folder / "missing", None)
    card = ModelCard(model_card(hub, tmp_path / "none.jsonl", exported).text)
    assert card.data.base_model == "Qwen/Qwen2.5-0.5B-Instruct" and card.data.license == "other"
    assert "--model Qwen/Qwen2.5-0.5B-Instruct" in card.text


def test_card_names_held_by_a_users_file_refuse_the_export_and_earlier_cards_are_replaced(tmp_path: Path) -> None:
    out = tmp_path / "my-model.gguf"
    card = _card(tmp_path, build_config("default"), "gguf", out.name)
    with published_card(card):
        out.write_bytes(b"GGUF one")
    assert all(written_by_sapling(path) for path in card.files)
    check_card_files(out, "gguf")  # an earlier export's card: it may be replaced
    never = tmp_path / "none.jsonl"
    smaller = _card(tmp_path, build_config("default"), "gguf", out.name, round_index=0, metrics=never)
    with published_card(smaller):
        out.write_bytes(b"GGUF two")
    assert sorted(p.name for p in tmp_path.iterdir() if "my-model" in p.name) == ["my-model.README.md",
                                                                                   "my-model.gguf"]
    assert "before any training" in card.files.readme.read_text()  # its old curves, which it lacks, are gone
    card.files.reward.write_bytes(PNG + b"a user's own picture")
    with pytest.raises(ConfigError, match=r"my-model-reward\.png exists and Sapling did not write it.*nothing was"):
        check_card_files(out, "gguf")
    card.files.reward.unlink()
    card.files.readme.write_text("# my notes\n")
    with pytest.raises(ConfigError, match=r"my-model\.README\.md exists and Sapling did not write it"):
        check_card_files(out, "gguf")
    check_card_files(tmp_path / "model", "hf")  # a folder's card lives inside it: check_target guards the folder


def test_a_full_disk_while_the_card_is_staged_replaces_nothing_and_leaves_no_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "my-model.gguf"
    out.write_bytes(b"GGUF old")
    card = _card(tmp_path, build_config("default"), "gguf", out.name)
    written: list[Path] = []

    def full_on_the_second(path: Path, data: bytes, mode: int | None = None) -> None:
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(path)
        path.write_bytes(data)

    monkeypatch.setattr("engine.gguf.card.atomic_write_bytes", full_on_the_second)
    ran: list[bool] = []
    with pytest.raises(OSError, match="No space left"), published_card(card):
        ran.append(True)
    assert not ran and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "my-model.gguf"]
    assert out.read_bytes() == b"GGUF old"


# -- end to end: a tiny run, trained, evaluated and exported ---------------------------------------
@pytest.fixture
def tiny_run(tiny_model_dir: Path, tmp_path: Path) -> tuple[NodeConfig, Paths, list[dict[str, Any]]]:
    """Two rounds of a tiny random model and its held-out evaluation at round 2, alone; (settings, paths, lines)."""
    home = tmp_path / "home"
    node = make_node(tiny_model_dir, home, "swarm.mode='solo'", "run.seed=7")
    node.run_round()
    node.run_round()
    node.evaluate()
    return node.config, Paths.under(home), node.metrics.read()


def test_a_tiny_runs_exports_carry_a_card_with_its_held_out_result(
        tiny_run: tuple[NodeConfig, Paths, list[dict[str, Any]]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config, paths, lines = tiny_run
    held_out = next(line for line in lines if line["kind"] == "eval")
    folder = export_model(config, paths, tmp_path / "tiny-model", "hf")
    assert folder.card == tmp_path / "tiny-model" / "README.md"
    assert (tmp_path / "tiny-model" / EXPORT_MARKER).is_file()
    assert {p.name for p in folder.path.iterdir()} >= {"README.md", "reward.png", "held-out.png", "config.json"}
    meta = metadata_load(folder.card)
    assert meta is not None and meta["library_name"] == "transformers" and "base_model" not in meta  # a folder
    _, results = model_index_to_eval_results(meta["model-index"])
    assert results[0].metric_value == round(held_out["accuracy"], 4)
    assert results[0].dataset_args == {"questions": held_out["questions"], "round": 2}
    assert "--seed 7 --rounds 2 --solo" in folder.card.read_text()
    # GGUF: llama.cpp's converter refuses the tiny model's byte tokenizer, so a stand-in writes the file.
    monkeypatch.setattr("engine.gguf.export.converter_dir", lambda: tmp_path)
    monkeypatch.setattr("engine.gguf.export.hf_to_gguf", lambda folder, out, quant, name: out.write_bytes(b"GGUF"))
    gguf = export_model(config, paths, tmp_path / "tiny.gguf", "gguf")
    assert gguf.card == tmp_path / "tiny.README.md" and (tmp_path / "tiny-held-out.png").is_file()
    assert metadata_load(gguf.card)["library_name"] == "gguf"  # type: ignore[index]
    cached = export_model(config, paths, paths.cache_dir / "gguf" / "round.gguf", "gguf")  # Try it's: no card
    assert cached.card is None and [p.name for p in cached.path.parent.iterdir()] == ["round.gguf"]


def test_a_full_disk_while_writing_the_card_is_one_sentence_and_leaves_the_old_export_whole(
        tiny_run: tuple[NodeConfig, Paths, list[dict[str, Any]]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli import main

    config, paths, _ = tiny_run
    flags = ["export", "--home", str(paths.data_dir.parent), "--model", config.model.source, "--device", "cpu",
             "--set", "run.seed=7", "--set", "swarm.mode='solo'"]
    monkeypatch.setattr("engine.gguf.export.converter_dir", lambda: tmp_path)
    monkeypatch.setattr("engine.gguf.export.hf_to_gguf", lambda folder, out, quant, name: out.write_bytes(b"GGUF"))
    exports = tmp_path / "exports"
    assert main([*flags, "--out", str(exports / "model.gguf")]) == 0
    assert f"Model card: {exports / 'model.README.md'}" in capsys.readouterr().out
    before = {p.name: p.read_bytes() for p in exports.iterdir()}
    assert sorted(before) == ["model-held-out.png", "model-reward.png", "model.README.md", "model.gguf"]

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("engine.gguf.card.atomic_write_bytes", full)
    for out in (exports / "model.gguf", exports / "folder"):
        assert main([*flags, "--out", str(out)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"sapling-node: error: {out} cannot be written (the disk is full); nothing was left half-written.")
    assert {p.name: p.read_bytes() for p in exports.iterdir()} == before
    (exports / "model.README.md").write_text("# my own notes\n")
    assert main([*flags, "--out", str(exports / "model.gguf")]) == 2
    assert "model.README.md exists and Sapling did not write it" in capsys.readouterr().err
    assert (exports / "model.gguf").read_bytes() == before["model.gguf"]
