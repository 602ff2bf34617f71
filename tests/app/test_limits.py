"""The Resources box (app/limits.py): the power choice, the schedule row, and the window and tray while waiting."""

from __future__ import annotations

import json
import tomllib
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from app.dialogs import FirstRunDialog
from app.limits import ResourcesBox
from app.panels import PeersPanel, data_note
from app.session import Session
from app.settings import AppSettings, EngineSettings, SettingsStore
from engine.common.config_file import build_config
from engine.common.paths import Paths
from tests.app.conftest import MakeGui, fake_command


def test_power_is_stored_alone_and_a_row_changed_by_hand_wins(paths: Paths) -> None:
    store = SettingsStore(paths)
    store.save_engine(EngineSettings(power="low", threads=1, priority="background", duty_cycle=0.5))
    run = tomllib.loads(paths.config_file.read_text())["run"]
    assert run["power"] == "low" and not {"threads", "priority", "duty_cycle"} & set(run)  # left to the bundle
    engine = build_config("default", paths.config_file).run
    assert (engine.threads, engine.priority, engine.duty_cycle) == (1, "background", 0.5)
    assert store.load_engine().threads == 1
    store.save_engine(EngineSettings(power="low", threads=2, priority="background", duty_cycle=0.5))
    assert tomllib.loads(paths.config_file.read_text())["run"]["threads"] == 2  # the user's own value is kept
    assert build_config("default", paths.config_file).run.threads == 2
    store.save_engine(EngineSettings(power="maximum", threads=2, priority="normal", schedule="weekdays 22:00-07:00",
                                     daily_download_mb=500))
    loaded = store.load_engine()
    assert (loaded.power, loaded.threads, loaded.priority, loaded.schedule, loaded.daily_download_mb) == \
        ("maximum", 2, "normal", "weekdays 22:00-07:00", 500.0)
    engine_side = build_config("default", paths.config_file)
    assert (engine_side.run.schedule, engine_side.swarm.daily_download_mb) == ("weekdays 22:00-07:00", 500)


def test_picking_a_power_sets_the_rows_and_the_schedule_row_writes_run_schedule(qtbot) -> None:  # type: ignore[no-untyped-def]
    box = ResourcesBox(idle_supported=True, ac_supported=True)
    qtbot.addWidget(box)
    box.set_values(EngineSettings(), AppSettings())
    assert box.power.currentData() == "standard" and not box.start_time.isEnabled()
    box.power.setCurrentIndex(box.power.findData("low"))
    box.power.activated.emit(box.power.currentIndex())  # as a click does
    assert (box.threads.value(), box.only_idle.isChecked(), box.only_ac.isChecked()) == (1, True, True)
    box.threads.setValue(2)  # the user's own choice after the preset
    box.scheduled.setChecked(True)
    box.days.setCurrentIndex(box.days.findData("weekdays"))
    box.download_mb.setValue(200)
    engine, app = box.engine_values(EngineSettings()), box.app_values(AppSettings())
    assert (engine.power, engine.threads, engine.duty_cycle, engine.schedule) == \
        ("low", 2, 0.5, "weekdays 22:00-07:00")
    assert (engine.daily_upload_mb, engine.daily_download_mb) == (0.0, 200.0)
    assert app.only_when_idle and app.only_on_ac_power
    again = ResourcesBox(idle_supported=True, ac_supported=True)
    qtbot.addWidget(again)
    again.set_values(engine, app)
    assert again.engine_values(EngineSettings()) == engine
    again.scheduled.setChecked(False)
    assert again.engine_values(EngineSettings()).schedule == ""
    again.set_values(EngineSettings(daily_upload_mb=0.25), app)  # a fraction from config.toml is kept
    assert again.engine_values(EngineSettings()).daily_upload_mb == 0.25


def test_the_first_run_dialog_offers_the_power_choice_and_refuses_an_empty_window(qtbot) -> None:  # type: ignore[no-untyped-def]
    dialog = FirstRunDialog(EngineSettings(), AppSettings(), idle_supported=False, ac_supported=False)
    qtbot.addWidget(dialog)
    form = dialog.form
    assert [form.resources.power.itemData(i) for i in range(form.resources.power.count())] == \
        ["low", "standard", "maximum"]
    form.resources.scheduled.setChecked(True)
    form.resources.end_time.setTime(form.resources.start_time.time())
    with pytest.raises(Exception, match="starts and ends at the same time"):
        form.values(EngineSettings(), AppSettings())
    assert "starts and ends at the same time" in form.error.text()


@pytest.mark.integration
def test_outside_its_hours_the_window_and_the_tray_say_when_training_starts(  # type: ignore[no-untyped-def]
        qtbot, make_gui: MakeGui, tmp_path: Path) -> None:
    start = (datetime.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
    fixture = tmp_path / "waiting.jsonl"
    common = {"v": 1, "ts": 0.0, "device": None, "model": "tiny", "run": "default", "round": 3}
    message = f"Waiting for {start:%H:%M} (schedule)."
    fixture.write_text("\n".join(json.dumps({"type": "status", **common, **extra}) for extra in (
        {"state": "starting", "message": "Engine started."},
        {"state": "training", "message": "Training from round 4."},
        {"state": "waiting", "message": message, "next_start": start.isoformat(timespec="minutes")},
    )) + "\n")
    gui = make_gui(fake_command("--hold", fixture=fixture), tray=True)
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.controller.phase == "scheduled", timeout=20_000)
    tray = gui.tray
    assert gui.window.state_message.text() == message and gui.window.pill.text() == "Scheduled"
    assert f"next training {start:%H:%M}" in tray.tooltip()
    assert tray.next_action.isVisible() and tray.next_action.text() == f"Next training at {start:%H:%M} (schedule)"
    assert tray.pause_action.text() == "Pause training"


def test_the_swarm_panel_shows_todays_data_and_a_reached_cap(qtbot) -> None:  # type: ignore[no-untyped-def]
    session = Session()
    panel = PeersPanel(session)
    qtbot.addWidget(panel)
    assert panel.data.isHidden()  # an engine that sends no data_today: no line
    today = {"day": "2026-12-03", "sent_bytes": 1_250_000, "received_bytes": 40_000_000, "upload_cap_bytes": 0,
             "download_cap_bytes": 50_000_000}
    peers = {"type": "peers", "v": 1, "ts": 0.0, "online": 2, "received": 5, "accepted": 4, "rejected": 1}
    session.handle({**peers, "data_today": today})
    assert panel.data.text() == "Data today: 1.2 MB sent · 40.0 MB received of 50.0 MB" and not panel.data.isHidden()
    session.handle({**peers, "data_today": {**today, "received_bytes": 50_000_000}})
    assert panel.data.text().endswith("daily cap reached: training on this computer's own rollouts until midnight")
    assert data_note("not a dict") == ("", False)
