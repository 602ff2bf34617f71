"""The main window's header card: the state, Start / Pause / Stop / Settings, who and where you are, progress.

`HeaderCard` shows the state pill and message, the four facts (device, model,
you in the swarm, the relay and swarm in use) and the round's progress, all
from the `Controller` and its `Session`; the settings it reads come through
callables, since the window replaces them when they are saved.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import sys
from collections.abc import Callable
from html import escape
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
)

from app import theme
from app.controller import Controller
from app.session import describe_device, describe_model, number
from app.settings import AppSettings, EngineSettings, settings_place
from engine.common.device import cpu_name

PHASE_WORDS = {
    "idle": "Not training", "starting": "Starting…", "training": "Training", "paused": "Paused",
    "waiting": "Waiting", "scheduled": "Scheduled",
    "stopping": "Stopping…", "finished": "Finished", "restarting": "Crashed, restarting",
    "failed": "Needs your attention",
}
STEP_WORDS = {
    "loading": "Loading the model", "probing": "Trying each question", "generating": "Writing answers",
    "scoring": "Checking answers",
    "training": "Learning from them", "evaluating": "Measuring held-out accuracy", "checkpointing": "Saving progress",
}


def guess_device() -> dict[str, Any]:
    """A cheap guess before the engine reports (no torch here): NVIDIA GPU, Apple silicon, or the CPU."""
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Model:"):
                        return {"kind": "cuda", "name": line.split(":", 1)[1].strip()}
        except OSError:
            continue
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return {"kind": "mlx", "name": "Apple silicon"}
    if shutil.which("nvidia-smi"):
        return {"kind": "cuda", "name": "NVIDIA GPU"}
    return {"kind": "cpu", "name": f"{cpu_name()} ({os.cpu_count() or 1} threads)"}


class HeaderCard(QFrame):
    settingsRequested = Signal()

    def __init__(self, controller: Controller, engine_settings: Callable[[], EngineSettings],
                 app_settings: Callable[[], AppSettings]) -> None:
        super().__init__()
        self.setObjectName("card")
        self.controller = controller
        self.session = controller.session
        self.engine_settings = engine_settings
        self.app_settings = app_settings
        self.guessed_device = guess_device()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 12, 16, 12)
        layout.setSpacing(10)
        layout.addLayout(self._title_row())
        layout.addLayout(self._facts())
        layout.addLayout(self._progress_row())
        for signal in (controller.phaseChanged, self.session.statusChanged):
            signal.connect(self.refresh_state)
            signal.connect(self.refresh_identity)
        self.session.swarmChanged.connect(self.refresh_identity)
        self.session.progressChanged.connect(self.refresh_progress)
        self.session.historyChanged.connect(self.refresh_state)  # "Press Start to begin" only while no round is done
        self.refresh_identity()
        self.refresh_state()
        self.refresh_progress()

    def _title_row(self) -> QHBoxLayout:
        """The logo, the state pill and message, and Start / Pause / Stop / Settings."""
        top = QHBoxLayout()
        logo = QLabel()
        logo.setPixmap(theme.icon().pixmap(40, 40))
        title = QLabel("Sapling")
        title.setObjectName("title")
        self.pill = QLabel()
        self.pill.setObjectName("pill")
        self.state_message = QLabel()
        self.state_message.setObjectName("muted")
        self.state_message.setWordWrap(True)  # a long engine message wraps onto a second line, never cut off
        self.state_message.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        top.addWidget(logo)
        top.addWidget(title)
        top.addSpacing(8)
        top.addWidget(self.pill)
        top.addWidget(self.state_message, 1)
        self.start_button = QPushButton("Start training")
        self.start_button.setObjectName("primary")
        self.start_button.setMinimumWidth(140)
        self.start_button.clicked.connect(self.controller.start)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setMinimumWidth(90)
        self.pause_button.clicked.connect(self.controller.toggle_pause)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setMinimumWidth(80)
        self.stop_button.clicked.connect(self.controller.stop)
        self.settings_button = QPushButton("Settings…")
        self.settings_button.clicked.connect(self.settingsRequested)
        for button in (self.start_button, self.pause_button, self.stop_button, self.settings_button):
            top.addWidget(button)
        return top

    def _facts(self) -> QGridLayout:
        """Device, model, who you are in the swarm, and the relay."""
        grid = QGridLayout()
        grid.setHorizontalSpacing(18)
        grid.setVerticalSpacing(2)
        self.device_label, self.model_label, self.identity_label, self.relay_label = (QLabel() for _ in range(4))
        for column, (name, label) in enumerate((("Device", self.device_label), ("Model", self.model_label),
                                                 ("You in the swarm", self.identity_label),
                                                ("Relay", self.relay_label))):
            caption = QLabel(name)
            caption.setObjectName("fieldName")
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            grid.addWidget(caption, 0, column)
            grid.addWidget(label, 1, column)
            grid.setColumnStretch(column, 1)
        return grid

    def _progress_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.progress_text = QLabel()
        self.progress_text.setObjectName("muted")
        self.progress_bar = QProgressBar()
        self.progress_bar.setTextVisible(False)
        self.progress_bar.setRange(0, 1000)
        row.addWidget(self.progress_text, 0)
        row.addWidget(self.progress_bar, 1)
        return row

    def refresh_state(self) -> None:
        phase = self.controller.phase
        colour = theme.PHASE_COLOURS.get(phase, theme.MUTED)
        words = PHASE_WORDS.get(phase, phase)
        if phase == "waiting" and self.controller.policy.reason:
            words = "Waiting"
        self.pill.setText(words)
        self.pill.setStyleSheet(f"background: {colour};")
        message = self.session.message if phase in ("starting", "training", "paused", "stopping", "scheduled") else ""
        if phase == "waiting":
            message = self.controller.policy.reason
        elif phase == "idle" and not self.session.history.rounds:
            message = "Press Start training to begin. You can pause at any time."
        elif phase == "idle":
            message = "Stopped. Start training to continue from the last round."
        elif phase == "finished":
            message = f"Finished at round {self.session.round}."
        elif phase == "stopping":
            message = "Stopping at the next safe point; everything up to the last round is kept."
        self.state_message.setText(message)
        self.state_message.setToolTip(message)
        idle = phase in ("idle", "finished", "failed", "restarting")
        self.start_button.setEnabled(idle)
        self.start_button.setText("Restart now" if phase == "restarting" else "Start training")
        self.pause_button.setEnabled(phase in ("starting", "training", "paused", "waiting", "scheduled"))
        self.pause_button.setText("Resume" if phase in ("paused", "waiting") else "Pause")
        self.stop_button.setEnabled(phase in ("starting", "training", "paused", "waiting", "scheduled", "restarting"))
        if phase not in ("starting", "training", "paused", "waiting", "scheduled"):
            self.progress_bar.setValue(0)
            self.progress_text.setText("")

    def refresh_identity(self) -> None:
        s = self.session
        device = s.device or self.app_settings().last_device or None
        if s.device:
            reason = str(s.device.get("reason", ""))
            text = describe_device(s.device)
            if reason.startswith("NVIDIA GPU found"):
                text += "\nNVIDIA GPU found: the CUDA download of Sapling would use it"
            self.device_label.setText(text)
            self.device_label.setToolTip(reason)
        elif device:
            self.device_label.setText(describe_device(device))
            self.device_label.setToolTip("As reported the last time training ran")
        else:
            self.device_label.setText(describe_device(self.guessed_device) + " (expected)")
            self.device_label.setToolTip("Confirmed by the engine when training starts")
        self.model_label.setText(describe_model(s.model or self.engine_settings().model_source))
        self.model_label.setToolTip(s.model or self.engine_settings().model_source)
        identity = s.swarm or self.app_settings().last_identity
        if identity.get("name") or identity.get("peer_id"):
            peer = str(identity.get("peer_id") or "")
            self.identity_label.setText(f"{identity.get('name') or 'unnamed'} · {peer[:8]}")
            self.identity_label.setToolTip(f"Peer id {peer}")
        else:
            self.identity_label.setText("Made when training first starts")
        self.relay_label.setText(self._relay_text())
        if s.swarm and s.device is not None:
            self.app_settings().last_identity = {"name": s.swarm.get("name"), "peer_id": s.swarm.get("peer_id")}
        if s.device:
            self.app_settings().last_device = dict(s.device)

    def _relay_text(self) -> str:
        """The header's relay line (rich text: everything from the engine or an invite is escaped)."""
        swarm, mode = self.session.swarm, self.engine_settings().swarm_mode
        green, red, grey = (f"<span style='color:{c}'>●</span>" for c in ("#38a169", theme.ERROR, "#a0aab2"))
        if swarm:
            relay = swarm.get("relay")
            if not relay:
                return f"{grey} Solo: sharing nothing"
            name = str(swarm.get("swarm_name") or "")
            where = ("local swarm on this computer" if relay == "embedded" else f"{name} · {relay}" if name
                     else str(relay))
            where = escape(where[0].upper() + where[1:]) if not self.controller.engine.is_running() else escape(where)
            if not self.controller.engine.is_running():
                return f"{grey} {where} (connects when training runs)"
            if swarm.get("connected"):
                return f"{green} Connected: {where}"
            why = f" ({escape(str(swarm.get('message')))})" if swarm.get("message") else ""
            return f"{red} Not connected: {where}{why}"
        if mode == "solo":
            return f"{grey} Solo: sharing nothing"
        if mode == "relay":
            _mode, name, relay = settings_place(self.engine_settings())
            return f"{grey} {escape(f'{name} · {relay}' if name else relay)} (connects when training starts)"
        return f"{grey} Local swarm (starts with training)"

    def refresh_progress(self) -> None:
        p = self.session.progress
        if not p or self.controller.phase not in ("starting", "training", "paused", "waiting"):
            if self.session.state == "loading" and self.controller.phase == "starting":
                self.progress_text.setText("Loading the model…")
                self.progress_bar.setRange(0, 0)
            return
        total = number(p.get("total")) or 0.0
        done = number(p.get("done")) or 0.0
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(int(1000 * done / total) if total > 0 else 0)
        step = STEP_WORDS.get(str(p.get("phase")), str(p.get("phase")))
        where = "Evaluating" if p.get("phase") == "evaluating" else f"Round {p.get('round')}"
        self.progress_text.setText(f"{where} · {step} · {int(done)}/{int(total)}")
