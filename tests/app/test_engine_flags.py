"""EngineFlags (app/engine_flags.py): the engine's home and settings flags, and the command of each subcommand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.engine_flags import EngineFlags
from app.identity import IdentityPanel
from engine.common.paths import HOME_ENV, Paths
from tests.app.conftest import MakeGui

NODE = [sys.executable, "-m", "engine.cli"]


def test_each_subcommand_gets_the_flags_it_takes() -> None:
    flags = EngineFlags(Path("/h"), ("--model", "/m", "--set", "run.threads=2"))
    assert flags.command("serve") == [*NODE, "serve", "--home", "/h", "--model", "/m", "--set", "run.threads=2"]
    assert flags.command("chat") == [*NODE, "chat", "--home", "/h", "--model", "/m", "--set", "run.threads=2"]
    # the caller's flags after the app's: a --threads of its own wins (argparse keeps the last)
    assert flags.command("export", "--out", "x.gguf", "--threads", "1") == [
        *NODE, "export", "--home", "/h", "--model", "/m", "--set", "run.threads=2", "--out", "x.gguf", "--threads", "1"]
    assert flags.command("doctor", "--json") == [*NODE, "doctor", "--json", "--home", "/h"]
    assert flags.command("identity", "show", "--json") == [*NODE, "identity", "show", "--json", "--home", "/h"]
    assert flags.home_flags() == ["--home", "/h"]


def test_without_a_home_the_engine_uses_the_users_folders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))  # what Paths.default() reads first, as the engine child does
    flags = EngineFlags()
    assert flags.command("serve") == [*NODE, "serve"] and flags.home_flags() == []
    assert flags.paths() == Paths.default() == Paths.under(tmp_path)
    assert EngineFlags(Path("~/sapling")).paths() == Paths.under(Path("~/sapling").expanduser())


def test_a_frozen_build_runs_itself_with_the_node_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert EngineFlags(settings=("--rounds", "1")).command("serve") == [sys.executable, "node", "serve", "--rounds",
                                                                        "1"]


def test_what_the_app_never_starts_or_a_second_home_is_refused() -> None:
    with pytest.raises(ValueError, match="experiment"):
        EngineFlags().command("experiment")
    with pytest.raises(ValueError, match="home"):
        EngineFlags(settings=("--home", "/elsewhere"))


def test_the_window_starts_try_it_export_and_identity_with_the_apps_flags(make_gui: MakeGui, paths: Paths) -> None:
    gui = make_gui(settings=["--model", "/m"])
    flags = gui.window.engine_flags
    assert flags == EngineFlags(paths.config_dir.parent, ("--model", "/m"))
    assert gui.engine.command() == flags.command("serve")
    assert gui.window.tryit.chat.command()[:-2] == flags.command("chat")  # then its thread budget, --budget N
    export = gui.window.open_export()
    assert export.command(["--format", "gguf"]) == flags.command("export", "--format", "gguf")
    export.close()
    gui.window.open_settings()
    dialog = gui.window.dialog
    assert dialog is not None
    identity = next(dialog.tabs.widget(i) for i in range(dialog.tabs.count())
                    if isinstance(dialog.tabs.widget(i), IdentityPanel))
    assert identity.command(["show", "--json"]) == flags.command("identity", "show", "--json")
    dialog.close()
