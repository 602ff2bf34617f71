from __future__ import annotations

from pathlib import Path

import pytest

from engine.common.config import NodeConfig, with_changes
from engine.common.config_file import build_config, config_toml, parse_override
from engine.common.errors import ConfigError


def test_defaults_fit_a_cpu_laptop() -> None:
    cfg = NodeConfig()
    assert cfg.model.source == "bundled"
    assert cfg.grpo.finetune == "lora"
    assert cfg.grpo.kl_beta == 0.0
    # 8 x 8 completions of up to 48 tokens: about 30 s a round and under 2 GB on 2 cores (docs/results.md).
    assert cfg.tasks.questions_per_round * cfg.tasks.completions_per_question <= 64
    assert cfg.tasks.max_new_tokens <= 64
    assert set(cfg.tasks.specialties) == {
        "base_conversion", "basic_arithmetic", "arc_1d", "bf", "propositional_logic",
        "fraction_simplification", "decimal_arithmetic", "calendar_arithmetic", "binary_matrix",
    }


def test_paper_preset() -> None:
    cfg = build_config("paper")
    assert (cfg.tasks.questions_per_round, cfg.tasks.completions_per_question) == (8, 8)
    assert (cfg.grpo.eps_low, cfg.grpo.eps_high, cfg.grpo.kl_beta) == (0.2, 0.28, 0.0)
    assert cfg.grpo.train_on == "informative" and build_config("default").grpo.train_on == "passed"


def test_precedence_defaults_preset_file_flags(tmp_path: Path) -> None:
    toml = tmp_path / "config.toml"
    toml.write_text("[tasks]\nquestions_per_round = 3\ncompletions_per_question = 5\n[grpo]\nlearning_rate = 1e-3\n")
    cfg = build_config("paper", toml, ["tasks.questions_per_round=2"])
    assert cfg.tasks.questions_per_round == 2  # flag beats file
    assert cfg.tasks.completions_per_question == 5  # file beats preset
    assert cfg.grpo.learning_rate == 1e-3
    assert cfg.grpo.eps_high == 0.28  # preset/default kept


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("grpo.learning_rate=-1", "grpo.learning_rate"),
        ("grpo.learning_rate=nan", "grpo.learning_rate"),
        ("grpo.finetune='qlora'", "grpo.finetune"),
        ("tasks.completions_per_question=1", "completions_per_question"),
        ("tasks.questions_per_round=0", "questions_per_round"),
        ("tasks.questions_per_round=true", "questions_per_round"),
        ("tasks.specialties={chess=1.0}", "chess"),
        ("tasks.specialties={bf=0.0}", "at least one"),
        ("tasks.temperature=0", "tasks.temperature"),
        ("run.device='tpu'", "run.device"),
        ("run.run_name='../escape'", "run.run_name"),
        ("run.seed=-3", "run.seed"),
        ("grpo.nonsense=1", "grpo.nonsense"),
        ("gpu.count=1", "[gpu]"),
        ("no_equals_sign", "section.key=value"),
    ],
)
def test_bad_values_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config(overrides=[override])
    assert needle in str(info.value)
    assert info.value.exit_code == 2


def test_bad_toml_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text("[grpo\nlearning_rate = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        build_config(toml_path=bad)


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="--preset"):
        build_config("turbo")


def test_override_values_are_toml() -> None:
    assert parse_override("grpo.learning_rate=1e-4") == ("grpo", "learning_rate", 1e-4)
    assert parse_override("model.source=org/name") == ("model", "source", "org/name")
    assert parse_override("tasks.specialties={bf=2}") == ("tasks", "specialties", {"bf": 2})


def test_toml_round_trip(tmp_path: Path) -> None:
    cfg = build_config("paper", overrides=["grpo.learning_rate=5e-5", "tasks.specialties={bf=1.0, arc_1d=0.5}"])
    path = tmp_path / "config.toml"
    path.write_text(config_toml(cfg))
    assert build_config(toml_path=path) == cfg


def test_structure_hash_tracks_only_tensor_shape() -> None:
    base = NodeConfig()
    assert with_changes(base, grpo={"learning_rate": 1e-5}).structure_hash() == base.structure_hash()
    assert with_changes(base, grpo={"lora_rank": 4}).structure_hash() != base.structure_hash()
    assert with_changes(base, model={"source": "org/other"}).structure_hash() != base.structure_hash()
    assert with_changes(base, grpo={"learning_rate": 1e-5}).config_hash() != base.config_hash()
