"""Fixtures for the app tests: offscreen Qt, a fake engine replaying a recorded stream, a private home."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.engine_flags import EngineFlags
from app.gui import Gui, build_gui
from app.power import PowerPolicy
from engine.common.paths import Paths
from tests.conftest import (
    StartRelay as StartRelay,  # the fixture is in tests/conftest.py; re-exported for the app tests
)

if TYPE_CHECKING:
    pass

HERE = Path(__file__).resolve().parent
FAKE_ENGINE = HERE / "fake_engine.py"
SESSION = HERE / "fixtures" / "session.jsonl"
HISTORY = HERE / "fixtures" / "history.jsonl"


def fake_command(*flags: str, fixture: Path = SESSION) -> list[str]:
    return [sys.executable, str(FAKE_ENGINE), "--fixture", str(fixture), *flags]


def read_commands(path: Path) -> list[str]:
    import json

    if not path.is_file():
        return []
    return [json.loads(line)["cmd"] for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths.under(tmp_path / "home")


MakeGui = Callable[..., Gui]




@pytest.fixture
def make_gui(qtbot, paths: Paths) -> Iterator[MakeGui]:  # type: ignore[no-untyped-def]
    """Build the whole app around a fake engine command, or the real engine with `settings` flags (its home is
    `paths`'); everything is torn down after the test."""
    made: list[Gui] = []

    def factory(command: list[str] | None = None, tray: bool = False, restart_delays: tuple[float, ...] = (0.2,),
                first_run_done: bool = True, settings: Sequence[str] | None = None) -> Gui:
        cmd = None if settings is not None else command or fake_command()
        policy = PowerPolicy(idle_probe=lambda: None, ac_probe=lambda: True)
        flags = EngineFlags(paths.config_dir.parent, tuple(settings or ()))
        gui = build_gui(flags, tray_available=tray, command=(lambda: list(cmd)) if cmd else None, policy=policy,
                        restart_delays=restart_delays)
        assert gui.paths == paths
        gui.window.app_settings.first_run_done = first_run_done
        gui.window.confirm = lambda title, text: True
        gui.on_quit = lambda: None
        qtbot.addWidget(gui.window)
        made.append(gui)
        return gui

    yield factory
    for gui in made:
        gui.controller.restart_timer.stop()
        gui.engine.kill()
        gui.engine.wait_for_exit(5000)
        gui.controller.restart_timer.stop()  # the kill reads as a crash: no restart into the next test
        gui.tray.hide()
        gui.window.problem_dialog.close()
