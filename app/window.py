"""The main window: who and where you are, Start/Pause/Stop, charts, the swarm, the log.

Layout, top to bottom: a header card (device, model, swarm identity, relay,
state, buttons, round progress), banners for warnings and problems, a row of
headline numbers, the charts beside the swarm panel, and the log view.
Everything shown comes from the `Controller` and its `Session`.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QByteArray, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.autostart import Autostart, launch_command
from app.charts import ChartsPanel
from app.controller import Controller, Problem
from app.dialogs import FirstRunDialog, ProblemDialog, SettingsDialog
from app.panels import LogView, PeersPanel
from app.session import describe_device, describe_model, number
from app.settings import AppSettings, EngineSettings, SettingsError, SettingsStore
from app.tryit import TRAINING_PHASES, ExportDialog, TryItPanel, node_command, settings_flags
from engine.device import cpu_name

PHASE_WORDS = {
    "idle": "Not training", "starting": "Starting…", "training": "Training", "paused": "Paused",
    "waiting": "Waiting", "stopping": "Stopping…", "finished": "Finished", "restarting": "Crashed, restarting",
    "failed": "Needs your attention",
}
STEP_WORDS = {
    "loading": "Loading the model", "generating": "Writing answers", "scoring": "Checking answers",
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


def short_path(path: object) -> str:
    """A path with the home folder written as ~."""
    text, home = str(path), os.path.expanduser("~")
    return "~" + text[len(home):] if home not in ("", "/") and text.startswith(home + os.sep) else text


class Banner(QFrame):
    """A coloured strip with a message and optional buttons; closes itself on ✕."""

    def __init__(self, level: str, text: str, actions: list[tuple[str, Callable[[], None]]] = (),  # type: ignore[assignment]
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.setProperty("level", level)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 6, 6, 6)
        self.label = QLabel(text)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row.addWidget(self.label, 1)
        for title, callback in actions:
            button = QPushButton(title)
            button.clicked.connect(callback)
            row.addWidget(button)
        close = QPushButton("×")
        close.setToolTip("Dismiss")
        close.setFlat(True)
        close.setFixedSize(30, 30)
        close.setStyleSheet("QPushButton { padding: 0px; border: none; font-size: 18px; color: #5f6b76; }")
        close.clicked.connect(self.deleteLater)
        row.addWidget(close)


class Tile(QFrame):
    """A headline number with its name and a small note under it."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(0)
        self.name = QLabel(name)
        self.name.setObjectName("kpiName")
        self.value = QLabel("–")
        self.value.setObjectName("kpiValue")
        self.note = QLabel(" ")
        self.note.setObjectName("muted")
        for label in (self.name, self.value, self.note):
            layout.addWidget(label)

    def set(self, value: str, note: str = " ") -> None:
        self.value.setText(value)
        self.note.setText(note or " ")


class MainWindow(QMainWindow):
    quitRequested = Signal()

    def __init__(self, controller: Controller, store: SettingsStore, app_settings: AppSettings,
                 engine_settings: EngineSettings, tray_available: bool, autostart: Autostart | None = None,
                 autostart_argv: list[str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.autostart = autostart or Autostart()
        self.autostart_argv = autostart_argv or launch_command()
        self.controller = controller
        self.session = controller.session
        self.store = store
        self.app_settings = app_settings
        self.engine_settings = engine_settings
        self.tray_available = tray_available
        self.told_about_tray = False
        self.quitting = False
        self.guessed_device = guess_device()
        self.confirm: Callable[[str, str], bool] = self._ask
        self.problem_dialog = ProblemDialog(self)
        self.problem_dialog.restartRequested.connect(controller.start)
        self.problem_dialog.settingsRequested.connect(self.open_settings)
        self.setWindowTitle("Sapling")
        self.setWindowIcon(theme.icon())
        self.setMinimumSize(980, 660)
        screen = self.screen().availableGeometry()
        self.resize(min(1280, int(screen.width() * 0.92)) or 1280, min(860, int(screen.height() * 0.92)) or 860)

        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(14, 12, 14, 8)
        outer.setSpacing(10)
        outer.addWidget(self._header())
        self.banners = QVBoxLayout()
        self.banners.setSpacing(6)
        outer.addLayout(self.banners)

        self.charts = ChartsPanel(self.session)
        self.peers = PeersPanel(self.session)
        self.peers.unbanRequested.connect(controller.unban)
        charts_card = QFrame()
        charts_card.setObjectName("card")
        charts_layout = QVBoxLayout(charts_card)
        charts_layout.setContentsMargins(8, 8, 8, 8)
        charts_layout.addWidget(self.charts)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(charts_card)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.setSpacing(10)
        left_layout.addLayout(self._tiles())
        self.tryit = TryItPanel(lambda: node_command("chat", self._engine_flags()))
        self.tabs = QTabWidget()
        self.tabs.addTab(scroll, "Training")
        self.tabs.addTab(self.tryit, "Try it")
        left_layout.addWidget(self.tabs, 1)
        self.log_view = LogView(str(controller.paths.log_dir))
        log_card = QFrame()
        log_card.setObjectName("card")
        log_layout = QVBoxLayout(log_card)
        log_layout.setContentsMargins(12, 8, 12, 10)
        log_layout.addWidget(self.log_view)
        side = QSplitter(Qt.Orientation.Vertical)
        side.addWidget(self.peers)
        side.addWidget(log_card)
        side.setStretchFactor(0, 1)
        side.setStretchFactor(1, 1)
        side.setSizes([440, 260])
        side.setChildrenCollapsible(False)
        side.setMinimumWidth(320)
        side.setMaximumWidth(440)
        body = QSplitter(Qt.Orientation.Horizontal)
        body.addWidget(left)
        body.addWidget(side)
        body.setStretchFactor(0, 3)
        body.setStretchFactor(1, 1)
        body.setChildrenCollapsible(False)
        outer.addWidget(body, 1)
        self.setCentralWidget(central)
        self.status_left = QLabel(f"Data: {short_path(controller.paths.data_dir)}")
        self.status_left.setObjectName("muted")
        self.status_right = QLabel("")
        self.status_right.setObjectName("muted")
        self.statusBar().addWidget(self.status_left, 1)
        self.statusBar().addPermanentWidget(self.status_right)
        self._actions()

        session = self.session
        controller.phaseChanged.connect(self.refresh_state)
        controller.phaseChanged.connect(self.refresh_identity)
        controller.phaseChanged.connect(lambda phase: self.tryit.set_training(phase in TRAINING_PHASES))
        controller.problem.connect(self.show_problem)
        controller.problemCleared.connect(self._clear_problem)
        session.statusChanged.connect(self.refresh_identity)
        session.statusChanged.connect(self.refresh_state)
        session.swarmChanged.connect(self.refresh_identity)
        session.progressChanged.connect(self.refresh_progress)
        session.historyChanged.connect(self.refresh_tiles)
        session.historyChanged.connect(self.refresh_state)  # "Press Start to begin" only while no round is done
        session.logMessage.connect(self.log_view.add)
        session.checkpointSaved.connect(lambda r: self.status_right.setText(f"Last checkpoint: round {r} at {time.strftime('%H:%M')}"))
        self.problem_banner: Banner | None = None
        self.dialog: FirstRunDialog | SettingsDialog | None = None
        self.refresh_identity()
        self.refresh_state()
        self.refresh_progress()
        self.refresh_tiles()
        self._restore_geometry()

    # -- building -----------------------------------------------------------------------
    def _header(self) -> QFrame:
        card = QFrame()
        card.setObjectName("card")
        layout = QVBoxLayout(card)
        layout.setContentsMargins(16, 12, 16, 12)
        layout.setSpacing(10)
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
        self.settings_button.clicked.connect(self.open_settings)
        for button in (self.start_button, self.pause_button, self.stop_button, self.settings_button):
            top.addWidget(button)
        layout.addLayout(top)

        grid = QGridLayout()
        grid.setHorizontalSpacing(18)
        grid.setVerticalSpacing(2)
        self.device_label, self.model_label, self.identity_label, self.relay_label = (QLabel() for _ in range(4))
        for column, (name, label) in enumerate((("Device", self.device_label), ("Model", self.model_label),
                                                 ("You in the swarm", self.identity_label), ("Relay", self.relay_label))):
            caption = QLabel(name)
            caption.setObjectName("fieldName")
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            grid.addWidget(caption, 0, column)
            grid.addWidget(label, 1, column)
            grid.setColumnStretch(column, 1)
        layout.addLayout(grid)

        row = QHBoxLayout()
        self.progress_text = QLabel()
        self.progress_text.setObjectName("muted")
        self.progress_bar = QProgressBar()
        self.progress_bar.setTextVisible(False)
        self.progress_bar.setRange(0, 1000)
        row.addWidget(self.progress_text, 0)
        row.addWidget(self.progress_bar, 1)
        layout.addLayout(row)
        return card

    def _tiles(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.setSpacing(8)
        self.tile_rounds = Tile("Rounds trained")
        self.tile_reward = Tile("Your reward")
        self.tile_swarm = Tile("Swarm's reward")
        self.tile_accuracy = Tile("Held-out accuracy")
        self.tile_speed = Tile("Speed")
        self.tile_time = Tile("Time per round")
        for tile in (self.tile_rounds, self.tile_reward, self.tile_swarm, self.tile_accuracy, self.tile_speed, self.tile_time):
            row.addWidget(tile, 1)
        return row

    def _actions(self) -> None:
        quit_action = QAction("Quit", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.quitRequested)
        settings = QAction("Settings", self)
        settings.setShortcut(QKeySequence.StandardKey.Preferences)
        settings.triggered.connect(self.open_settings)
        for action in (quit_action, settings):
            self.addAction(action)
        menu = self.menuBar().addMenu("&Model")
        menu.addAction("Try it", lambda: self.tabs.setCurrentWidget(self.tryit))
        menu.addAction("Export model…", self.open_export)

    def _engine_flags(self) -> list[str]:
        """The settings flags this window's engine runs with (--home ...), for export and Try it."""
        return settings_flags(self.controller.engine.command())

    def open_export(self) -> ExportDialog:
        training = self.controller.phase in TRAINING_PHASES
        dialog = ExportDialog(lambda flags: node_command("export", [*self._engine_flags(), *flags]), training, self)
        dialog.exported.connect(lambda path: dialog.step.setText(f"Saved to {short_path(path)}."))
        dialog.open()
        return dialog

    # -- refreshing ---------------------------------------------------------------------
    def refresh_state(self) -> None:
        phase = self.controller.phase
        colour = theme.PHASE_COLOURS.get(phase, theme.MUTED)
        words = PHASE_WORDS.get(phase, phase)
        if phase == "waiting" and self.controller.policy.reason:
            words = "Waiting"
        self.pill.setText(words)
        self.pill.setStyleSheet(f"background: {colour};")
        message = self.session.message if phase in ("starting", "training", "paused", "stopping") else ""
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
        self.pause_button.setEnabled(phase in ("starting", "training", "paused", "waiting"))
        self.pause_button.setText("Resume" if phase in ("paused", "waiting") else "Pause")
        self.stop_button.setEnabled(phase in ("starting", "training", "paused", "waiting", "restarting"))
        if phase not in ("starting", "training", "paused", "waiting"):
            self.progress_bar.setValue(0)
            self.progress_text.setText("")

    def refresh_identity(self) -> None:
        s = self.session
        device = s.device or self.app_settings.last_device or None
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
        self.model_label.setText(describe_model(s.model or self.engine_settings.model_source))
        self.model_label.setToolTip(s.model or self.engine_settings.model_source)
        identity = s.swarm or self.app_settings.last_identity
        if identity.get("name") or identity.get("peer_id"):
            peer = str(identity.get("peer_id") or "")
            self.identity_label.setText(f"{identity.get('name') or 'unnamed'} · {peer[:8]}")
            self.identity_label.setToolTip(f"Peer id {peer}")
        else:
            self.identity_label.setText("Made when training first starts")
        self.relay_label.setText(self._relay_text())
        if s.swarm and s.device is not None:
            self.app_settings.last_identity = {"name": s.swarm.get("name"), "peer_id": s.swarm.get("peer_id")}
        if s.device:
            self.app_settings.last_device = dict(s.device)

    def _relay_text(self) -> str:
        swarm, mode = self.session.swarm, self.engine_settings.swarm_mode
        green, red, grey = (f"<span style='color:{c}'>●</span>" for c in ("#38a169", theme.ERROR, "#a0aab2"))
        if swarm:
            relay = swarm.get("relay")
            if not relay:
                return f"{grey} Solo: sharing nothing"
            where = "local swarm on this computer" if relay == "embedded" else str(relay)
            if not self.controller.engine.is_running():
                return f"{grey} {where[0].upper()}{where[1:]} (connects when training runs)"
            if swarm.get("connected"):
                return f"{green} Connected: {where}"
            why = f" ({swarm.get('message')})" if swarm.get("message") else ""
            return f"{red} Not connected: {where}{why}"
        if mode == "solo":
            return f"{grey} Solo: sharing nothing"
        if mode == "relay":
            return f"{grey} {self.engine_settings.relay_url} (connects when training starts)"
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

    def refresh_tiles(self) -> None:
        h = self.session.history
        self.tile_rounds.set(f"{h.rounds[-1]:,}" if h.rounds else "0", f"run “{self.session.run}”")
        reward = h.recent_mean(h.reward)
        first = [v for v in h.reward[:10] if v is not None]
        note = ""
        if reward is not None and len(h.rounds) >= 20 and first:
            delta = reward - sum(first) / len(first)
            note = f"{delta:+.2f} vs first 10 rounds"
        self.tile_reward.set("–" if reward is None else f"{reward:.2f}", note or "last 10 rounds")
        swarm = h.recent_mean(h.swarm_reward)
        self.tile_swarm.set("–" if swarm is None else f"{swarm:.2f}",
                            "last 10 rounds" if swarm is not None else "none from peers yet")
        accuracy = [v for v in h.eval_accuracy if v is not None]
        if accuracy:
            note = f"round {h.eval_rounds[-1]}"
            if len(accuracy) > 1:
                note += f", {100 * (accuracy[-1] - accuracy[0]):+.1f} pts since {h.eval_rounds[0]}"
            self.tile_accuracy.set(f"{100 * accuracy[-1]:.1f}%", note)
        else:
            self.tile_accuracy.set("–", "measured every 10 rounds")
        speed = h.recent_mean(h.tokens_per_second)
        self.tile_speed.set("–" if speed is None else f"{speed:.0f} tok/s", "tokens generated / s")
        seconds = h.recent_mean(h.seconds)
        self.tile_time.set("–" if seconds is None else f"{seconds:.0f} s", "last 10 rounds")

    # -- banners and problems -----------------------------------------------------------
    def add_banner(self, level: str, text: str, actions: list[tuple[str, Callable[[], None]]] | None = None) -> Banner:
        banner = Banner(level, text, actions or [])
        banner.style().unpolish(banner)
        banner.style().polish(banner)
        self.banners.addWidget(banner)
        return banner

    def show_problem(self, problem: Problem) -> None:
        self._clear_problem()
        actions: list[tuple[str, Callable[[], None]]] = [("Details…", lambda: self.problem_dialog.show_problem(problem))]
        if problem.needs_settings:
            actions.append(("Open Settings", self.open_settings))
        text = problem.text
        if problem.restart_in is not None:
            text += f" Restarting in {problem.restart_in:.0f} s."
        self.problem_banner = self.add_banner("error", f"<b>{problem.title}.</b> {text}", actions)
        if self.isVisible() and not self.problem_dialog.isVisible():
            self.problem_dialog.show_problem(problem)

    def _clear_problem(self) -> None:
        if self.problem_banner is not None:
            self.problem_banner.deleteLater()
            self.problem_banner = None

    def notify(self, title: str, text: str, level: str) -> None:
        """Where there is no tray: the notification becomes a banner (and a taskbar alert)."""
        self.add_banner(level, f"<b>{title}.</b> {text}")
        from PySide6.QtWidgets import QApplication

        QApplication.alert(self)

    # -- settings -----------------------------------------------------------------------
    def open_first_run(self) -> None:
        policy = self.controller.policy
        from app.power import has_battery

        dialog = FirstRunDialog(self.engine_settings, self.app_settings, policy.idle_supported(), has_battery(), self)
        dialog.finished.connect(lambda result: self._settings_chosen(dialog, result, first_run=True))
        self.dialog = dialog
        dialog.open()

    def open_settings(self) -> None:
        from app.power import has_battery

        dialog = SettingsDialog(self.engine_settings, self.app_settings, self.controller.policy.idle_supported(),
                                has_battery(), str(self.store.config_file), self)
        dialog.finished.connect(lambda result: self._settings_chosen(dialog, result, first_run=False))
        self.dialog = dialog
        dialog.open()

    def _settings_chosen(self, dialog: FirstRunDialog | SettingsDialog, result: int, first_run: bool) -> None:
        if result != 1:
            return
        old = self.engine_settings
        new_engine, new_app = dialog.engine_settings, dialog.app_settings
        try:
            self.store.save_engine(new_engine)
        except (SettingsError, OSError) as exc:
            QMessageBox.warning(self, "Sapling: settings not saved", f"The settings could not be saved: {exc}")
            return
        if first_run:
            new_app.first_run_done = True
        self.engine_settings = new_engine
        autostart_changed = new_app.start_at_login != self.app_settings.start_at_login
        self.app_settings.__dict__.update(new_app.__dict__)
        self.save_app_settings()
        self.apply_app_settings(autostart_changed)
        self.refresh_identity()
        if dialog.start_training:
            self.controller.start()
        elif self.controller.engine.is_running() and new_engine.needs_restart(old):
            self.add_banner("info", "Settings saved. The new model, swarm, threads or priority apply when training restarts.",
                            [("Restart now", self.controller.restart)])
        elif self.controller.engine.is_running():
            self.controller.reload()

    def apply_app_settings(self, autostart_changed: bool) -> None:
        """Apply app-only settings now: idle / AC limits and the login entry."""
        self.controller.policy.set_rules(self.app_settings.only_when_idle, self.app_settings.only_on_ac_power)
        if autostart_changed:
            try:
                self.autostart.apply(self.app_settings.start_at_login, self.autostart_argv)
            except OSError as exc:
                QMessageBox.warning(self, "Sapling", f"Could not change the start-at-login entry ({self.autostart.location}): {exc}")

    def save_app_settings(self) -> None:
        self.app_settings.window_geometry = bytes(self.saveGeometry().toBase64().data()).decode("ascii")
        try:
            self.store.save_app(self.app_settings)
        except OSError as exc:
            self.log_view.add("warning", "app", f"Could not save the app settings: {exc}")

    def _restore_geometry(self) -> None:
        if self.app_settings.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(self.app_settings.window_geometry.encode("ascii")))

    # -- closing ------------------------------------------------------------------------
    def _ask(self, title: str, text: str) -> bool:
        answer = QMessageBox.question(self, title, text, QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                      QMessageBox.StandardButton.No)
        return answer == QMessageBox.StandardButton.Yes

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.quitting:
            event.accept()
            return
        self.save_app_settings()
        running = self.controller.engine.is_running()
        if self.tray_available:
            event.ignore()
            self.hide()
            if running and not self.told_about_tray:
                self.told_about_tray = True
                self.controller.notify.emit("Sapling keeps training",
                                            "It is in the tray. Choose Quit there to stop.", "info")
            return
        if running and not self.confirm("Quit Sapling?", "Training stops when Sapling quits; your progress up to "
                                        "the last round is kept. Quit now?"):
            event.ignore()
            return
        event.ignore()
        QTimer.singleShot(0, self, self.quitRequested.emit)

    def bring_to_front(self) -> None:
        self.show()
        self.setWindowState(self.windowState() & ~Qt.WindowState.WindowMinimized)
        self.raise_()
        self.activateWindow()
