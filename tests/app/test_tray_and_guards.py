"""Tray menu actions (with and without a tray), single instance, the excepthook, start at login."""

from __future__ import annotations

import logging
import plistlib
import sys
from pathlib import Path
from typing import Any

import pytest

from app.autostart import Autostart, desktop_exec, launch_command
from app.guards import QuitSignals, SingleInstance, install_excepthook, setup_app_logging
from tests.app.conftest import MakeGui, fake_command, read_commands


@pytest.mark.integration
def test_tray_menu_actions_work_without_a_tray(qtbot, make_gui: MakeGui, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "commands.jsonl"
    gui = make_gui(fake_command("--hold", "--commands", str(log)))
    tray = gui.tray
    assert tray.icon is None and not tray.show_message("t", "x", "info")
    assert [a.text() for a in tray.menu.actions() if not a.isSeparator() and a.isVisible()] == [
        "Show Sapling", "Start training", "Quit Sapling"]
    tray.show_action.trigger()
    assert gui.window.isVisible()
    tray.pause_action.trigger()  # "Start training" while idle
    qtbot.waitUntil(lambda: gui.controller.phase == "training", timeout=20_000)
    assert tray.pause_action.text() == "Pause training"
    tray.pause_action.trigger()
    qtbot.waitUntil(lambda: tray.pause_action.text() == "Resume training", timeout=10_000)
    tray.pause_action.trigger()
    qtbot.waitUntil(lambda: read_commands(log) == ["pause", "resume"], timeout=10_000)
    assert "round 4" in tray.tooltip()
    quits: list[bool] = []
    gui.on_quit = lambda: quits.append(True)
    with qtbot.waitSignal(gui.engine.exited, timeout=10_000):
        tray.quit_action.trigger()
    assert quits == [True] and read_commands(log)[-1] == "stop"


@pytest.mark.integration
def test_where_a_tray_exists_it_has_the_menu_tooltip_and_notifications(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(tray=True)
    tray = gui.tray
    assert tray.icon is not None and tray.icon.contextMenu() is tray.menu
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "finished", timeout=20_000)
    assert tray.icon.toolTip() == tray.tooltip() and "reward" in tray.icon.toolTip()
    assert tray.show_message("Sapling", "hello", "warning")
    banners_before = gui.window.banners.count()
    gui.controller.notify.emit("Sapling", "goes to the tray, not the window", "info")
    assert gui.window.banners.count() == banners_before


def test_without_a_tray_notifications_become_banners(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    gui.controller.notify.emit("Sapling: the disk is full", "Free some space.", "error")
    assert gui.window.banners.count() == 1


@pytest.mark.integration
def test_relay_unreachable_for_long_notifies_once(qtbot, make_gui: MakeGui, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fixture = tmp_path / "down.jsonl"
    fixture.write_text('{"type":"swarm","v":1,"ts":0,"peer_id":"ab","name":"n","relay":"wss://r.example/ws",'
                       '"connected":false,"message":"connection refused"}\n')
    gui = make_gui(fake_command("--hold", fixture=fixture))
    gui.controller.relay_alert_seconds = 0.0
    notes: list[tuple[str, str, str]] = []
    gui.controller.notify.connect(lambda *a: notes.append(a))
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.relay_down_since is not None, timeout=10_000)
    gui.controller.watch()
    gui.controller.watch()
    relay_notes = [n for n in notes if "cannot reach" in n[0]]
    assert len(relay_notes) == 1 and "wss://r.example/ws" in relay_notes[0][1]
    assert "Not connected" in gui.window.relay_label.text()


def test_disk_full_in_the_engine_output_notifies(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    notes: list[tuple[str, str, str]] = []
    gui.controller.notify.connect(lambda *a: notes.append(a))
    gui.controller._on_stderr("OSError: [Errno 28] No space left on device")
    assert notes and notes[0][0] == "Sapling: the disk is full"


def test_second_launch_raises_the_first(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name = f"sapling-test-{tmp_path.name}"
    first = SingleInstance(name)
    assert not first.notify_running(200)
    assert first.listen()
    second = SingleInstance(name)
    with qtbot.waitSignal(first.raiseRequested, timeout=5_000):
        assert second.notify_running()
    first.close()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_quit_signals_count_each_signal_and_put_back_the_handlers(qtbot) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signals = QuitSignals()
    seen: list[int] = []
    signals.received.connect(seen.append)
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the event loop hears of it
        qtbot.waitUntil(lambda: seen == [1], timeout=5_000)
        os.kill(os.getpid(), signal.SIGTERM)  # and the process is not ended
        qtbot.waitUntil(lambda: seen == [1, 2], timeout=5_000)
    finally:
        signals.uninstall()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.integration
def test_a_quit_signal_stops_at_a_safe_point_and_a_second_stops_now(qtbot, make_gui: MakeGui,  # type: ignore[no-untyped-def]
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    gui = make_gui(fake_command("--hold", "--ignore-stop"))
    gui.window.show()
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "training", timeout=20_000)
    quits: list[bool] = []
    gui.on_quit = lambda: quits.append(True)
    gui.quit_on_signal(1)
    assert gui.controller.phase == "stopping" and gui.engine.is_running() and not quits
    assert "Press Ctrl+C again to stop now" in capsys.readouterr().err
    with qtbot.waitSignal(gui.engine.exited, timeout=10_000):
        gui.quit_on_signal(2)  # the engine ignores stop: killed
    assert quits == [True]


def test_excepthook_logs_and_shows_a_dialog(tmp_path: Path) -> None:
    shown: list[tuple[str, str]] = []
    root = logging.getLogger()
    before = list(root.handlers)
    log_file = setup_app_logging(tmp_path / "logs")
    old = sys.excepthook
    try:
        hook = install_excepthook(lambda summary, details: shown.append((summary, details)), log_file)
        try:
            raise ValueError("the chart had no axes")
        except ValueError as exc:
            hook(type(exc), exc, exc.__traceback__)
    finally:
        sys.excepthook = old
        for handler in root.handlers[len(before):]:
            handler.close()
            root.removeHandler(handler)
    (summary, details), = shown
    assert "ValueError: the chart had no axes" in summary and str(log_file) in summary
    assert "Traceback" in details
    assert log_file is not None and "the chart had no axes" in log_file.read_text()


def test_start_at_login_on_linux(tmp_path: Path) -> None:
    entry = Autostart("linux", home=tmp_path)
    entry.enable(["/opt/Sapling App/sapling", "--background"])
    text = entry.entry_path().read_text()
    assert entry.entry_path() == tmp_path / ".config" / "autostart" / "sapling.desktop"
    assert 'Exec="/opt/Sapling App/sapling" --background' in text and entry.is_enabled()
    entry.disable()
    assert not entry.is_enabled()
    assert desktop_exec(["a$b", "100%"]) == '"a\\$b" 100%%'
    assert launch_command()[-1] == "--background"


def test_start_at_login_on_macos(tmp_path: Path) -> None:
    entry = Autostart("darwin", home=tmp_path)
    entry.enable(["/Applications/Sapling.app/Contents/MacOS/Sapling", "--background"])
    plist = plistlib.loads(entry.entry_path().read_bytes())
    assert entry.entry_path().parent == tmp_path / "Library" / "LaunchAgents"
    assert plist["RunAtLoad"] is True and plist["ProgramArguments"][-1] == "--background"
    entry.disable()
    assert not entry.entry_path().exists()


class FakeRegistry:
    HKEY_CURRENT_USER, REG_SZ, KEY_SET_VALUE = "HKCU", 1, 2

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    class Key:
        def __enter__(self) -> FakeRegistry.Key:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def CreateKey(self, root: str, path: str) -> Key:
        return self.Key()

    def OpenKey(self, root: str, path: str, *rest: int) -> Key:
        return self.Key()

    def SetValueEx(self, key: Key, name: str, reserved: int, kind: int, value: str) -> None:
        self.values[name] = value

    def QueryValueEx(self, key: Key, name: str) -> Any:
        if name not in self.values:
            raise FileNotFoundError(name)
        return self.values[name], self.REG_SZ

    def DeleteValue(self, key: Key, name: str) -> None:
        if name not in self.values:
            raise FileNotFoundError(name)
        del self.values[name]


def test_start_at_login_on_windows() -> None:
    registry = FakeRegistry()
    entry = Autostart("win32", registry=registry)
    entry.enable([r"C:\Program Files\Sapling\sapling.exe", "--background"])
    assert registry.values["Sapling"] == r'"C:\Program Files\Sapling\sapling.exe" --background'
    assert entry.is_enabled()
    entry.disable()
    entry.disable()  # twice is fine
    assert not entry.is_enabled()


@pytest.mark.integration
@pytest.mark.parametrize("enabled", [True, False])
def test_settings_dialog_writes_the_login_entry(qtbot, make_gui: MakeGui, tmp_path: Path, enabled: bool) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    gui.window.autostart = Autostart("linux", home=tmp_path)
    gui.window.app_settings.start_at_login = not enabled
    gui.window.open_settings()
    assert gui.window.dialog is not None
    gui.window.dialog.form.autostart.setChecked(enabled)
    assert gui.window.dialog.try_accept()
    assert gui.window.autostart.is_enabled() is enabled
