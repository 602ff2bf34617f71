"""The Resources box of the first-run and Settings dialogs: how hard and when this computer trains.

One choice for people who will not read the rest: Power, Low / Standard /
Maximum (``run.power``, `engine.common.presets.expand_power`). Picking one sets
the rows below it to its bundle (threads, priority, the idle and AC-power
pauses); a row changed by hand afterwards is the user's own setting and wins
(the engine's rule for config.toml, too). Below them: "Train only between
[22:00] and [07:00] [every day]" (``run.schedule``), the daily swarm data
limits (``swarm.daily_upload_mb``, ``swarm.daily_download_mb``) and start at
login.
"""

from __future__ import annotations

import os
from dataclasses import replace

from PySide6.QtCore import QTime, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QTimeEdit,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.settings import AppSettings, EngineSettings
from engine.common.presets import POWER_PRESETS, PRIORITIES, expand_power
from engine.common.schedule import DAYS, Schedule
from engine.common.schema import person_defaults, setting

PRIORITY_TEXT = {"background": "Background: your programs always come first (recommended)",
                 "normal": "Normal: share the computer equally with your programs"}


def power_text(power: str) -> str:
    """How the Power list says a bundle: its name, then what engine/common/presets.py gives (Low: "1 thread,
    half of each minute, when idle and plugged in")."""
    bundle = expand_power(power)
    threads = int(bundle["threads"])
    parts = [f"{threads} thread{'s' if threads != 1 else ''}" if threads else
             ("every free core" if bundle["priority"] == "normal" else "free cores")]
    if bundle["duty_cycle"] < 1:
        share = float(bundle["duty_cycle"])
        parts.append("half of each minute" if share == 0.5 else f"{share:.0%} of each minute")
    parts.append("equal priority with your programs" if bundle["priority"] == "normal" else
                 "when idle and plugged in" if bundle["idle_only"] and bundle["ac_only"] else "at background priority")
    recommended = " (recommended)" if power == person_defaults()["power"] else ""
    return f"{power.capitalize()}: {', '.join(parts)}{recommended}"


DAY_CHOICES = (("daily", "every day"), ("weekdays", "on weekdays"), ("weekends", "at weekends"))


def _row(*widgets: QWidget) -> QHBoxLayout:
    row = QHBoxLayout()
    for widget in widgets:
        row.addWidget(widget)
    row.addStretch(1)
    return row


def schedule_text(enabled: bool, start: QTime, end: QTime, days: str) -> str:
    """The run.schedule value of the row: "" when unticked, else e.g. "weekdays 22:00-07:00"."""
    if not enabled:
        return ""
    hours = f"{start.toString('HH:mm')}-{end.toString('HH:mm')}"
    return hours if days == "daily" else f"{days} {hours}"


class ResourcesBox(QGroupBox):
    """Power, threads, priority, the schedule row, the idle / AC pauses and start at login."""

    changed = Signal()

    def __init__(self, idle_supported: bool, ac_supported: bool, parent: QWidget | None = None) -> None:
        super().__init__("Resources", parent)
        limits = QVBoxLayout(self)
        # each row's label is its setting's, as the engine declares it (engine/common/config.py)
        power_label = QLabel(f"{setting('power').label}:")
        threads_label = QLabel(f"{setting('threads').label}:")
        priority_label = QLabel(f"{setting('priority').label}:")
        for label in (power_label, priority_label):
            label.setMinimumWidth(threads_label.sizeHint().width())
        self.power = QComboBox()
        for value in POWER_PRESETS:
            self.power.addItem(power_text(value), value)
        self.power.setToolTip("One choice for how hard this computer works; each sets the rows below, and a row "
                              "you change yourself wins.")
        limits.addLayout(_row(power_label, self.power))
        self.threads = QSpinBox()
        cores = os.cpu_count() or 1
        self.threads.setRange(int(setting("threads").low or 0), max(cores, 1))  # what this computer has
        self.threads.setSpecialValueText(f"Automatic (up to {cores})")
        self.threads.setToolTip("Automatic uses the cores your other programs leave free, measured every few seconds. "
                                "A fixed number of threads leaves more of the computer to you, but training is slower.")
        limits.addLayout(_row(threads_label, self.threads))
        self.priority = QComboBox()
        for value in PRIORITIES:
            self.priority.addItem(PRIORITY_TEXT.get(value, value), value)
        self.priority.setToolTip("Background runs training at the lowest priority your system has, as BOINC and "
                                 "Folding@home do. Normal trains faster while you use the computer, and slows your "
                                 "programs down.")
        limits.addLayout(_row(priority_label, self.priority))
        self.scheduled = QCheckBox("Train only between")
        self.start_time, self.end_time = QTimeEdit(QTime(22, 0)), QTimeEdit(QTime(7, 0))
        for edit in (self.start_time, self.end_time):
            edit.setDisplayFormat("HH:mm")
        self.days = QComboBox()
        for value, text in DAY_CHOICES:
            self.days.addItem(text, value)
        limits.addLayout(_row(self.scheduled, self.start_time, QLabel("and"), self.end_time, self.days))
        self.upload_mb, self.download_mb = QSpinBox(), QSpinBox()
        for spin, name in ((self.upload_mb, "daily_upload_mb"), (self.download_mb, "daily_download_mb")):
            spin.setRange(int(setting(name).low or 0), int(setting(name).high or 0))
            spin.setSuffix(" MB")
            spin.setSpecialValueText("no limit")
            spin.setToolTip("Counted from what this computer sends to and receives from the swarm, from local "
                            "midnight. At the limit it trains on its own answers until midnight.")
        limits.addLayout(_row(QLabel("Swarm data a day: send at most"), self.upload_mb, QLabel("receive at most"),
                              self.download_mb))
        self.only_idle = QCheckBox("Train only when the computer is idle (no keyboard or mouse for 5 minutes)")
        self.only_ac = QCheckBox("Train only when plugged in (on AC power)")
        self.autostart = QCheckBox("Start Sapling when I log in, training in the background")
        for check, supported, why in ((self.only_idle, idle_supported,
                                       "Not available: this system does not report idle time."),
                                      (self.only_ac, ac_supported, "Not available: this computer reports no battery.")):
            limits.addWidget(check)
            if not supported:
                check.setEnabled(False)
                check.setToolTip(why)
                limits.addWidget(theme.hint(why))
        limits.addWidget(self.autostart)
        self.duty_cycle = float(person_defaults()["duty_cycle"])  # no row of its own: what power (or the file) says
        self.loaded_caps = (0.0, 0.0)
        self.power.activated.connect(lambda _index: self.apply_power(str(self.power.currentData())))
        self.scheduled.toggled.connect(self._sync)
        self._sync()

    def apply_power(self, power: str) -> None:
        """Set the rows to what `power` bundles (the user picked it just now)."""
        bundle = expand_power(power)
        self.power.setCurrentIndex(max(0, self.power.findData(power)))
        self.threads.setValue(min(int(bundle["threads"]), self.threads.maximum()))
        self.priority.setCurrentIndex(max(0, self.priority.findData(bundle["priority"])))
        self.duty_cycle = float(bundle["duty_cycle"])
        self.only_idle.setChecked(bool(bundle["idle_only"]) and self.only_idle.isEnabled())
        self.only_ac.setChecked(bool(bundle["ac_only"]) and self.only_ac.isEnabled())
        self.changed.emit()

    def _sync(self) -> None:
        on = self.scheduled.isChecked()
        for widget in (self.start_time, self.end_time, self.days):
            widget.setEnabled(on)

    def set_values(self, engine: EngineSettings, app: AppSettings) -> None:
        self.power.setCurrentIndex(max(0, self.power.findData(engine.power)))
        self.threads.setValue(min(engine.threads, self.threads.maximum()))
        self.priority.setCurrentIndex(max(0, self.priority.findData(engine.priority)))
        self.duty_cycle = engine.duty_cycle
        rule = Schedule.parse(engine.schedule)  # the store validated it
        self.scheduled.setChecked(not rule.always)
        if not rule.always:
            self.start_time.setTime(QTime(rule.start // 60, rule.start % 60))
            self.end_time.setTime(QTime(rule.end // 60, rule.end % 60))
            days = next(name for name, value in DAYS.items() if value == rule.days)
            self.days.setCurrentIndex(max(0, self.days.findData(days)))
        self.loaded_caps = (engine.daily_upload_mb, engine.daily_download_mb)  # config.toml may hold 0.5 MB
        self.upload_mb.setValue(round(engine.daily_upload_mb))
        self.download_mb.setValue(round(engine.daily_download_mb))
        self.only_idle.setChecked(app.only_when_idle and self.only_idle.isEnabled())
        self.only_ac.setChecked(app.only_on_ac_power and self.only_ac.isEnabled())
        self.autostart.setChecked(app.start_at_login)
        self._sync()

    def engine_values(self, engine: EngineSettings) -> EngineSettings:
        """A copy of `engine` with this box's choices."""
        schedule = schedule_text(self.scheduled.isChecked(), self.start_time.time(), self.end_time.time(),
                                 str(self.days.currentData()))
        return engine.replace(power=str(self.power.currentData()), threads=self.threads.value(),
                       priority=str(self.priority.currentData()), duty_cycle=self.duty_cycle, schedule=schedule,
                       daily_upload_mb=self._cap(self.upload_mb, self.loaded_caps[0]),
                       daily_download_mb=self._cap(self.download_mb, self.loaded_caps[1]))

    @staticmethod
    def _cap(spin: QSpinBox, loaded: float) -> float:
        """The row's megabytes; a fraction from the file stays as it was unless the row was changed."""
        return loaded if spin.value() == round(loaded) else float(spin.value())

    def app_values(self, app: AppSettings) -> AppSettings:
        """A copy of `app` with this box's choices."""
        return replace(app, only_when_idle=self.only_idle.isChecked(), only_on_ac_power=self.only_ac.isChecked(),
                       start_at_login=self.autostart.isChecked())
