"""The whole window around a fake engine: live updates, buttons -> commands, crash and restart, history."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication, QPushButton, QScrollArea

from app.dialogs import FirstRunDialog
from app.settings import SettingsStore
from engine.common.paths import Paths
from tests.app.conftest import HISTORY, MakeGui, fake_command, read_commands


@pytest.mark.integration
def test_recorded_stream_updates_charts_peers_and_status(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    w = gui.window
    w.show()
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "finished", timeout=20_000)
    w.charts.refresh()
    assert w.charts.reward.series[1].count() == 4  # your 10-round average, one point per round
    assert w.charts.reward.series[3].count() == 3  # the swarm's: rounds 2-4 had external rollouts
    assert w.charts.accuracy.series[0].count() == 3  # evaluations at rounds 0, 2, 4
    assert w.charts.speed.series[0].count() == 4
    assert (w.peers.online.text(), w.peers.accepted.text(), w.peers.rejected.text()) == ("3", "17", "7")
    assert w.peers.reasons.rowCount() == 4 and w.peers.peer_table.rowCount() == 3
    assert "quiet-fern" in w.identity_label.text() and "3f9a2c7e" in w.identity_label.text()
    assert "Local swarm on this computer (connects when training runs)" in w.relay_label.text()
    assert "Fake CPU" not in w.device_label.text() and "Intel" in w.device_label.text()
    assert w.tile_rounds.value.text() == "4"
    assert w.pill.text() == "Finished" and w.start_button.isEnabled() and not w.stop_button.isEnabled()
    log = "\n".join(w.log_view.lines())
    assert "Ignored a malformed line" in log and "fake engine: replaying" in log
    assert gui.tray.tooltip().startswith("Sapling · Finished · round 4 · reward 0.00")


@pytest.mark.integration
def test_start_pause_resume_stop_send_the_right_commands(qtbot, make_gui: MakeGui, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "commands.jsonl"
    gui = make_gui(fake_command("--hold", "--rate", "200", "--commands", str(log)))
    w = gui.window
    w.show()
    assert w.start_button.isEnabled() and not w.pause_button.isEnabled()
    w.start_button.click()
    qtbot.waitUntil(lambda: gui.controller.phase == "training", timeout=20_000)
    assert not w.start_button.isEnabled() and w.pause_button.text() == "Pause"
    assert "Connected: local swarm on this computer" in w.relay_label.text()
    w.pause_button.click()
    qtbot.waitUntil(lambda: gui.session.state == "paused", timeout=10_000)
    assert gui.controller.phase == "paused" and w.pause_button.text() == "Resume"
    w.pause_button.click()
    qtbot.waitUntil(lambda: gui.session.state == "training" and gui.session.message == "Resumed.", timeout=10_000)
    with qtbot.waitSignal(gui.engine.exited, timeout=10_000):
        w.stop_button.click()
    assert read_commands(log) == ["pause", "resume", "stop"]
    assert gui.controller.phase == "idle" and not gui.controller.restart_timer.isActive()


@pytest.mark.integration
def test_killed_engine_is_reported_and_restarted(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(fake_command("--hold"), restart_delays=(0.3, 5.0))
    gui.window.show()
    starts: list[bool] = []
    gui.engine.started.connect(lambda: starts.append(True))
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "training", timeout=20_000)
    with qtbot.waitSignal(gui.controller.problem, timeout=10_000) as problem:
        assert gui.engine.proc is not None
        gui.engine.proc.kill()
    p = problem.args[0]
    assert p.title == "The training engine crashed" and p.restart_in == 0.3 and not p.needs_settings
    assert "engine exited with code -1" in p.details and "fake engine: replaying" in p.details
    assert gui.controller.phase == "restarting"
    assert gui.window.problem_banner is not None and gui.window.problem_dialog.isVisible()
    assert "fake engine" in gui.window.problem_dialog.details.toPlainText()
    assert gui.controller.crashes == 1
    qtbot.waitUntil(lambda: len(starts) == 2 and gui.controller.phase == "training", timeout=20_000)
    qtbot.waitUntil(lambda: gui.controller.crashes == 0, timeout=20_000)  # a finished round resets the backoff


@pytest.mark.integration
def test_traceback_of_a_crash_reaches_the_dialog_and_backoff_grows(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(fake_command("--crash-after", "4"), restart_delays=(0.2, 0.4, 30.0))
    gui.window.show()
    delays: list[float | None] = []
    gui.controller.problem.connect(lambda p: delays.append(p.restart_in))
    gui.controller.start()
    qtbot.waitUntil(lambda: len(delays) == 3, timeout=30_000)
    assert delays == [0.2, 0.4, 30.0]
    assert "RuntimeError: boom" in gui.window.problem_dialog.details.toPlainText()


@pytest.mark.integration
@pytest.mark.parametrize(("kind", "code", "message", "title", "needs_settings"), [
    ("ModelError", 3, "Model folder /nowhere does not exist.", "Sapling cannot train with these settings", True),
    # another node holds the data folder: nothing in Settings can change that
    ("NodeBusyError", 2, "Another Sapling node is already training with /x/data.",
     "Sapling is already training on this computer", False),
])
def test_a_problem_the_user_must_fix_is_not_restarted(  # type: ignore[no-untyped-def]
        qtbot, make_gui: MakeGui, tmp_path: Path, kind: str, code: int, message: str, title: str,
        needs_settings: bool) -> None:
    fixture = tmp_path / "fatal.jsonl"
    fixture.write_text(json.dumps({"type": "error", "v": 1, "ts": 0, "kind": kind, "fatal": True,
                                   "message": message}) + "\n")
    gui = make_gui(fake_command("--exit-code", str(code), fixture=fixture))
    gui.window.show()
    with qtbot.waitSignal(gui.controller.problem, timeout=10_000) as problem:
        gui.controller.start()
    p = problem.args[0]
    assert p.title == title and p.text == message
    assert p.needs_settings == needs_settings and p.restart_in is None
    assert gui.controller.phase == "failed" and not gui.controller.restart_timer.isActive()
    assert gui.window.problem_dialog.settings_button.isVisibleTo(gui.window.problem_dialog) == needs_settings


def test_reopening_shows_the_earlier_history(qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    paths.data_dir.mkdir(parents=True)
    shutil.copy(HISTORY, paths.metrics_file)
    gui = make_gui(first_run_done=False)
    gui.window.show()
    gui.after_show()
    gui.window.charts.refresh()
    assert gui.window.charts.reward.series[0].count() == 40
    assert gui.window.charts.accuracy.series[0].count() == 5
    assert gui.window.tile_rounds.value.text() == "40"
    assert gui.window.tile_accuracy.value.text().endswith("%")
    assert isinstance(gui.window.dialog, FirstRunDialog) and gui.window.dialog.isVisible()


@pytest.mark.integration
def test_without_a_tray_closing_asks_then_quits(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(fake_command("--hold"))
    w = gui.window
    w.show()
    gui.controller.start()
    qtbot.waitUntil(gui.engine.is_running, timeout=10_000)
    w.confirm = lambda title, text: False
    w.close()
    assert w.isVisible()
    quits: list[bool] = []
    w.quitRequested.connect(lambda: quits.append(True))
    w.confirm = lambda title, text: True
    w.close()
    qtbot.waitUntil(lambda: bool(quits), timeout=5_000)
    with qtbot.waitSignal(gui.engine.exited, timeout=10_000):
        gui.quit()
    assert gui.controller.phase == "idle"


@pytest.mark.integration
def test_with_a_tray_closing_hides_and_keeps_training(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(fake_command("--hold"), tray=True)
    w = gui.window
    w.show()
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "training", timeout=20_000)
    w.close()
    assert not w.isVisible() and gui.engine.is_running()
    gui.tray.show_action.trigger()
    assert w.isVisible()


@pytest.mark.integration
def test_quit_says_stopping_at_once_and_shows_the_saving_dialog_within_a_second(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(fake_command("--hold", "--ignore-stop"))
    w = gui.window
    w.show()
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "training", timeout=20_000)
    quits: list[bool] = []
    gui.on_quit = lambda: quits.append(True)
    started = time.monotonic()
    gui.quit()
    assert gui.controller.phase == "stopping" and w.pill.text() == "Stopping…"
    assert not w.pause_button.isEnabled() and not w.stop_button.isEnabled()
    qtbot.waitUntil(lambda: gui.quit_dialog is not None and gui.quit_dialog.isVisible(), timeout=1_000)
    assert time.monotonic() - started < 1.0
    (quit_now,) = [b for b in gui.quit_dialog.findChildren(QPushButton) if b.text() == "Quit now"]
    with qtbot.waitSignal(gui.engine.exited, timeout=10_000):
        quit_now.click()  # the engine ignores stop, so it is killed
    assert quits == [True] and not gui.quit_dialog.isVisible()


@pytest.mark.integration
def test_relaunching_after_quitting_mid_run_carries_on(qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    first = make_gui(fake_command("--hold"))
    first.window.show()
    first.after_show()
    assert not first.engine.is_running()  # a first launch waits for Start
    first.controller.start()
    qtbot.waitUntil(lambda: first.controller.phase == "training", timeout=20_000)
    with qtbot.waitSignal(first.engine.exited, timeout=10_000):
        first.quit()
    assert SettingsStore(paths).load_app().resume_training
    again = make_gui(fake_command("--hold"))
    again.window.show()
    again.after_show()
    assert again.engine.is_running()
    qtbot.waitUntil(lambda: again.controller.phase == "training", timeout=20_000)
    assert "carrying on" in "\n".join(again.window.log_view.lines())


@pytest.mark.integration
def test_a_run_paused_before_quitting_is_not_started_on_relaunch(qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    first = make_gui(fake_command("--hold"))
    first.window.show()
    first.controller.start()
    qtbot.waitUntil(lambda: first.controller.phase == "training", timeout=20_000)
    first.window.pause_button.click()
    qtbot.waitUntil(lambda: first.session.state == "paused", timeout=10_000)
    with qtbot.waitSignal(first.engine.exited, timeout=10_000):
        first.quit()
    assert not SettingsStore(paths).load_app().resume_training
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(HISTORY, paths.metrics_file)  # the rounds it had trained (the fake engine writes none)
    again = make_gui(fake_command("--hold"))
    again.window.show()
    again.after_show()
    assert not again.engine.is_running() and again.window.pill.text() == "Not training"
    assert again.window.state_message.text() == "Stopped. Start training to continue from the last round."


def test_a_lone_first_round_is_drawn_as_a_dot(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    charts = gui.window.charts
    metrics = {"reward_mean": 0.25, "accuracy": 0.125, "tokens_per_second": 40.0, "seconds": 20.0}
    gui.session.handle({"type": "round", "round": 1, "metrics": {**metrics, "round": 1}})
    charts.refresh()
    for chart in (charts.reward, charts.speed):
        assert chart.series[0].count() == 1 and chart.series[0].pointsVisible()
    gui.session.handle({"type": "round", "round": 2, "metrics": {**metrics, "round": 2}})
    charts.refresh()
    assert charts.reward.series[0].count() == 2 and not charts.reward.series[0].pointsVisible()


def test_the_swarm_panel_counts_computers_online_before_the_first_round(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    panel = gui.window.peers
    swarm = {"type": "swarm", "peer_id": "3f9a2c7e", "name": "quiet-fern", "relay": "embedded", "message": "Connected."}
    assert panel.online.text() == "–"
    gui.session.handle({**swarm, "connected": True, "online": 3})
    assert panel.online.text() == "3"
    gui.session.handle({"type": "peers", "online": 2, "received": 0, "accepted": 0, "rejected": 0})
    assert panel.online.text() == "2"
    gui.session.handle({**swarm, "connected": False, "online": 2})
    assert panel.online.text() == "–"


def test_the_swarm_panel_says_when_the_node_is_cut_off_and_when_it_is_back(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    panel = gui.window.peers
    swarm = {"type": "swarm", "peer_id": "3f9a2c7e", "name": "quiet-fern", "relay": "ws://relay.test/ws"}
    counts = {"type": "peers", "received": 8, "accepted": 5, "rejected": 3}
    gui.session.handle({**swarm, "connected": True, "online": 2, "message": "Connected.", "lost_at": None})
    assert panel.link.isHidden()
    lost = time.time() - 30
    gui.session.handle({**swarm, "connected": False, "online": 0, "message": "Cut off.", "since": lost,
                        "lost_at": lost})
    gui.session.handle({**counts, "online": 2, "connected": False})  # a round's count, while cut off
    at = time.strftime("%H:%M", time.localtime(lost))
    assert not panel.link.isHidden() and panel.link.text().startswith(f"Cut off from the relay since {at}.")
    assert "trying to reconnect" in panel.link.text() and panel.online.text() == "–"
    back = time.time()
    gui.session.handle({**swarm, "connected": True, "online": 2, "message": "Back.", "since": back, "lost_at": lost})
    assert panel.link.text() == (f"Back in touch with the relay since {time.strftime('%H:%M', time.localtime(back))} "
                                 f"(cut off at {at}).")
    assert panel.online.text() == "2"


@pytest.mark.integration
def test_a_long_status_message_wraps_instead_of_being_cut_off(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(fake_command("--hold"))
    w = gui.window
    w.resize(w.minimumSize())
    w.show()
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "training", timeout=20_000)
    long = "Loading bundled on Intel(R) Xeon(R) Processor (2 threads), 24 GiB, bf16 yes (no CUDA device: CPU)"
    gui.session.handle({"type": "status", "state": "training", "message": long})
    label = w.state_message
    # The label's new height reaches the window through one posted layout request per level of nesting, and
    # how many of those one pass of the event loop delivers depends on the platform's event dispatcher (glib or
    # not): wait for the layouts to settle, as a user's next frame does, rather than count passes.
    qtbot.waitUntil(lambda: label.height() >= label.heightForWidth(label.width()), timeout=5_000)
    assert label.text() == long and label.fontMetrics().horizontalAdvance(long) > label.width()
    needed = label.heightForWidth(label.width())
    assert needed > label.fontMetrics().height() and label.height() >= needed


def test_a_banned_peer_shows_in_the_panel_and_lifting_the_ban_sends_unban(  # type: ignore[no-untyped-def]
        qtbot, make_gui: MakeGui, monkeypatch) -> None:
    from PySide6.QtWidgets import QMessageBox

    gui = make_gui()
    w = gui.window
    ban = {"reason": "implausible", "since": 1.0, "until": None, "source": "strikes", "name": "sly-fox-1a2b"}
    listed = {"reason": "config", "since": 1.0, "until": None, "source": "config", "name": "bad-actor-9f9f"}
    gui.session.handle({"type": "peers", "v": 1, "ts": 1.0, "online": 3, "received": 9, "accepted": 2, "rejected": 7,
                        "rejected_by_reason": {"implausible": 7},
                        "by_peer": {"1a2b3c4d5e6f7a8b9c0d": {"name": "sly-fox-1a2b", "accepted": 0, "rejected": 7,
                                                             "banned": ban},
                                    "9f9f9f9f9f9f9f9f9f9f": {"name": "bad-actor-9f9f", "accepted": 0, "rejected": 0,
                                                             "banned": listed},
                                    "0a0a0a0a0a0a0a0a0a0a": {"name": "kind-owl-0a0a", "accepted": 2, "rejected": 0,
                                                             "banned": None},
                                    "0b0b0b0b0b0b0b0b0b0b": {"name": "calm-heron-0b0b", "accepted": 5, "rejected": 0,
                                                             "probation": 3, "banned": None}}})
    table = w.peers.peer_table
    statuses = {table.item(r, 0).text(): table.item(r, 3).text() for r in range(table.rowCount())}
    assert statuses["sly-fox-1a2b · 1a2b3c4d"].startswith("banned: Improbable text")
    assert "(in Settings)" in statuses["bad-actor-9f9f · 9f9f9f9f"]
    assert statuses["kind-owl-0a0a · 0a0a0a0a"] == "ok"
    assert statuses["calm-heron-0b0b · 0b0b0b0b"] == "ok · another model, 3 taken on probation"  # issue 29
    reasons = {w.peers.reasons.item(r, 0).text() for r in range(w.peers.reasons.rowCount())}
    assert any("Improbable" in text for text in reasons)

    asked: list[str] = []
    gui.controller.unban = asked.append  # type: ignore[method-assign]
    w.peers.unbanRequested.disconnect()
    w.peers.unbanRequested.connect(gui.controller.unban)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    rows = {table.item(r, 0).text(): r for r in range(table.rowCount())}
    w.peers._on_peer_clicked(rows["bad-actor-9f9f · 9f9f9f9f"], 0)  # a ban from the settings: not lifted here
    w.peers._on_peer_clicked(rows["sly-fox-1a2b · 1a2b3c4d"], 0)
    assert asked == ["1a2b3c4d5e6f7a8b9c0d"]


def test_the_reward_tile_tooltip_shows_each_specialtys_reward_level_and_pass_rate() -> None:
    from app.window import specialty_tooltip

    assert specialty_tooltip({}) == ""
    fixed = specialty_tooltip({"round": 3, "reward_by_specialty": {"bf": 0.25}})
    assert "Round 3" in fixed and "<td>bf</td><td>0.25</td>" in fixed and "Level" not in fixed
    adaptive = specialty_tooltip({
        "round": 4, "reward_by_specialty": {"base_conversion": 0.0},
        "curriculum": {"base_conversion": {"level": -1, "pass_rate": 0.125, "weight": 0.1},
                       "arc_1d": {"level": 0, "pass_rate": None, "weight": 0.03},
                       "bf": {"level": 0, "pass_rate": 0.0, "weight": 0.001, "excluded": True}},
    })
    assert "<td>base conversion</td><td>0.00</td><td>-1</td><td>12%</td>" in adaptive
    assert "<td>arc 1d</td><td>–</td><td>0</td><td>–</td>" in adaptive
    assert "<td>bf</td><td>–</td><td>0 (resting)</td><td>0%</td>" in adaptive
    assert "temperature" not in adaptive
    heat = specialty_tooltip({"round": 5, "reward_by_specialty": {"bf": 1.0}, "temperature": 0.8,
                              "temperature_next": 0.85})
    assert heat.endswith("<p>Sampling temperature 0.85: it rises when your model keeps giving a question the same "
                         "answer (nothing to learn from), and falls when answers vary again.</p>")


def test_banners_shrink_the_charts_instead_of_scrolling_them(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    """At the window's size on a 1280x800 screen (92% of it), a banner or two leave the three charts whole: no
    scroll bar; a short chart drops its legend and axis titles and keeps its labels."""
    gui = make_gui()
    w = gui.window
    w.resize(1177, 736)
    w.show()
    scroll = w.tabs.widget(0)
    assert isinstance(scroll, QScrollArea)

    def settle() -> None:
        for _ in range(10):
            QApplication.processEvents()

    settle()
    assert not scroll.verticalScrollBar().isVisible()
    w.add_banner("info", "<b>Joined Riverside Maths Club swarm.</b> Training continues in this swarm.")
    settle()
    assert not scroll.verticalScrollBar().isVisible()
    w.add_banner("warning", "<b>Another banner.</b> Something else to say.")
    settle()
    assert not scroll.verticalScrollBar().isVisible()
    assert w.charts.accuracy.compact and not w.charts.accuracy.chart().legend().isVisible()


@pytest.mark.parametrize(("width", "whole"), [(1280, True), (1093, False)])
def test_the_tiles_never_cut_a_value_and_shorten_names_and_notes_with_an_ellipsis(  # type: ignore[no-untyped-def]
        qtbot, make_gui: MakeGui, width: int, whole: bool) -> None:
    """A 1280-wide window shows every tile whole; at 1366x768 scaled 125% (1093 wide) the longest names and notes
    end in "…" with the whole text as a tooltip, the short ones stay whole, and no value is cut."""
    from app.theme import ElidedLabel

    gui = make_gui()
    w = gui.window
    w.setMinimumSize(0, 0)
    w.resize(width, 740)
    w.show()
    notes = {w.tile_rounds: "run “default”", w.tile_reward: "+0.07 vs first 10 rounds",
             w.tile_swarm: "last 10 rounds", w.tile_accuracy: "round 40, +3.7 pts since 0",
             w.tile_speed: "tokens generated / s", w.tile_time: "last 10 rounds"}
    for tile, note in notes.items():
        tile.set("1,234 tok/s" if tile is w.tile_speed else "0.22", note)  # refresh_tiles' widest values
    w.tile_row.refit()
    for _ in range(10):
        QApplication.processEvents()
    cut = []
    for tile in w.tile_row.tiles:
        assert tile.value.width() >= tile.value.minimumSizeHint().width()  # a number is never cut
        for label in (tile.name, tile.note):
            assert isinstance(label, ElidedLabel)
            if label.is_elided():
                assert label.shown().endswith("…") and label.toolTip() == label.text()
                cut.append(label.text())
    if whole:
        assert cut == []
    else:
        assert "+0.07 vs first 10 rounds" in cut and "run “default”" not in cut and "Speed" not in cut
