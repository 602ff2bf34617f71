"""A node's seed: the install's own by default, an explicit one reproduces, a run keeps the seed it began with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.node.checkpoint import STATE_FILE, checkpoint_name
from engine.node.seeds import AUTO_SEED, SEED_FILE, install_seed, node_seed, run_seed
from tests.engine.test_sapo import make_node


def test_the_default_seed_is_the_installs_own() -> None:
    assert build_config("default", None, []).run.seed == AUTO_SEED
    with pytest.raises(ConfigError, match=r"run\.seed"):
        build_config("default", None, ["run.seed=-2"])


def test_an_install_draws_its_seed_once_and_keeps_it(tmp_path: Path) -> None:
    first = install_seed(tmp_path / "a")
    assert (tmp_path / "a" / SEED_FILE).read_text().strip() == str(first)
    assert install_seed(tmp_path / "a") == first
    others = {install_seed(tmp_path / f"other-{k}") for k in range(8)}
    assert len(others | {first}) == 9  # 1 in 2**31: two installs never share a seed in practice


def test_a_damaged_seed_file_is_replaced_by_a_seed(tmp_path: Path) -> None:
    (tmp_path / SEED_FILE).write_text("not a number\n")
    seed = install_seed(tmp_path)
    assert 0 <= seed < 2**31 and (tmp_path / SEED_FILE).read_text().strip() == str(seed)


def test_an_explicit_seed_wins_over_the_installs(tmp_path: Path) -> None:
    assert node_seed(7, tmp_path) == 7 and not (tmp_path / SEED_FILE).exists()
    assert node_seed(AUTO_SEED, tmp_path) == install_seed(tmp_path)


def test_a_recorded_seed_wins_and_a_missing_one_keeps_the_choice() -> None:
    assert run_seed(5, 9) == 9
    assert run_seed(5, None) == 5
    assert run_seed(5, True) == 5 and run_seed(5, -3) == 5


def test_two_fresh_nodes_draw_different_questions(tiny_model_dir: Path, tmp_path: Path) -> None:
    a = make_node(tiny_model_dir, tmp_path / "a")
    b = make_node(tiny_model_dir, tmp_path / "b")
    assert a.config.run.seed != b.config.run.seed
    assert [q.ref.key() for q in a.taskset.draw(1, 2)] != [q.ref.key() for q in b.taskset.draw(1, 2)]


def test_a_resumed_run_keeps_the_seed_it_began_with(tiny_model_dir: Path, home: Path) -> None:
    node = make_node(tiny_model_dir, home)
    began = node.config.run.seed
    node.run_round()
    state = json.loads((node.checkpoint_root / checkpoint_name(1) / STATE_FILE).read_text())
    assert state["seed"] == began
    (home / "data" / SEED_FILE).write_text(f"{(began + 1) % 2**31}\n")  # the install's seed changed since
    resumed = make_node(tiny_model_dir, home)
    assert resumed.round == 1 and resumed.config.run.seed == began
    explicit = make_node(tiny_model_dir, home, "run.seed=3")
    assert explicit.config.run.seed == began
    assert make_node(tiny_model_dir, home, "run.seed=3", "run.run_name=other").config.run.seed == 3
