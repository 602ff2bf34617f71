"""The main window: who and where you are, Start/Pause/Stop, charts, the swarm, the log.

Layout, top to bottom: a header card (device, model, swarm identity, relay,
state, buttons, round progress), banners for warnings and problems, a row of
headline numbers, the charts beside the swarm panel, and the log view.
Everything shown comes from the `Controller` and its `Session`. Each part is
made by a small builder method (`_header`, `_tiles`, `_body`, `_side`, ...).

Joining a swarm: `open_invite(text)` (an invite from the command line, the
single-instance channel or the macOS open-URL event) shows the "Join this
swarm?" dialog (app/join.py); Join saves the invite as `[swarm] relay_url`
and (re)starts training in it. Help ▸ Check connection runs the connection
doctor (app/doctor.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from html import escape

from PySide6.QtCore import QByteArray, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.autostart import Autostart, launch_command
from app.charts import ChartsPanel
from app.contribution import ContributionCard
from app.controller import Controller, Problem
from app.dialogs import FirstRunDialog, ProblemDialog, SettingsDialog
from app.doctor import DoctorDialog
from app.engine_flags import EngineFlags
from app.header import HeaderCard
from app.identity import IdentityPanel
from app.join import JoinDialog
from app.panels import Banner, LogView, PeersPanel, Tile, TileRow
from app.settings import AppSettings, EngineSettings, SettingsError, SettingsStore, settings_place, swarm_invite
from app.tryit import TRAINING_PHASES, ExportDialog, TryItPanel
from engine.common.joining import Preview
from engine.common.schema import restart_changes

CONTRIBUTION_TAB = "Your contribution"

def specialty_tooltip(metrics: dict[str, object]) -> str:
    """The "Your reward" tile's tooltip: the last round's reward per specialty and, with adaptive difficulty
    (tasks.difficulty), each specialty's level (0: the default; "resting" when it fails even at its easiest and
    is only retried now and then) and its pass rate over its last answers; with an adaptive temperature
    (tasks.adaptive_temperature), the one the next round samples at."""
    rewards = metrics.get("reward_by_specialty")
    levels = metrics.get("curriculum")
    heat = metrics.get("temperature_next")
    rewards = rewards if isinstance(rewards, dict) else {}
    levels = levels if isinstance(levels, dict) else {}
    if not rewards and not levels:
        return ""
    note = ("" if not isinstance(heat, float | int) or isinstance(heat, bool) else
            f"<p>Sampling temperature {heat:.2f}: it rises when your model keeps giving a question the same answer "
            "(nothing to learn from), and falls when answers vary again.</p>")
    head = "<tr><th align=left>Specialty</th><th>Reward</th>" + ("<th>Level</th><th>Pass rate</th>" if levels else "")
    rows = []
    for name in sorted(set(rewards) | set(levels)):
        reward, state = rewards.get(name), levels.get(name)
        cells = [escape(str(name).replace("_", " ")), f"{reward:.2f}" if isinstance(reward, float | int) else "–"]
        if levels:
            state = state if isinstance(state, dict) else {}
            level, rate = state.get("level"), state.get("pass_rate")
            rests = " (resting)" if state.get("excluded") is True else ""  # fails at its easiest: retried now and then
            cells += [(f"{level:+d}" if isinstance(level, int) and level else "0") + rests,
                      f"{100 * rate:.0f}%" if isinstance(rate, float | int) else "–"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<b>Round {metrics.get('round', '?')}, by specialty</b><table>{head}</tr>{''.join(rows)}</table>{note}"


def short_path(path: object) -> str:
    """A path with the home folder written as ~."""
    text, home = str(path), os.path.expanduser("~")
    return "~" + text[len(home):] if home not in ("", "/") and text.startswith(home + os.sep) else text


# Height the window needs besides the swarm panel: title bar, menu, header card, tiles, the log's least, status bar.
SIDE_LEAVE = 560
# Height the window needs besides its central widget: title bar, menu and status bar.
WINDOW_LEAVE = 80


class MainWindow(QMainWindow):
    quitRequested = Signal()

    def __init__(self, controller: Controller, store: SettingsStore, app_settings: AppSettings,
                 engine_settings: EngineSettings, engine_flags: EngineFlags, tray_available: bool,
                 autostart: Autostart | None = None, autostart_argv: list[str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.engine_flags = engine_flags  # the command of each subcommand the window starts (chat, export, ...)
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
        self.confirm: Callable[[str, str], bool] = self._ask
        self.problem_banner: Banner | None = None
        self.dialog: FirstRunDialog | SettingsDialog | None = None
        self.join_dialog: JoinDialog | None = None
        self.doctor_dialog: DoctorDialog | None = None
        self.problem_dialog = ProblemDialog(self)
        self.problem_dialog.restartRequested.connect(controller.start)
        self.problem_dialog.settingsRequested.connect(self.open_settings)
        self._frame()
        self.setCentralWidget(self._central())
        self._status_bar()
        self._actions()
        self._connect()
        self.refresh_tiles()
        self._restore_geometry()

    # -- building -----------------------------------------------------------------------
    def _frame(self) -> None:
        self.setWindowTitle("Sapling")
        self.setWindowIcon(theme.icon())
        theme.fit_screen(self, 980, 660)  # a 1366x768 laptop at 125% has 1093x614 to give
        screen = self.screen().availableGeometry()
        self.resize(min(1280, int(screen.width() * 0.92)) or 1280, min(860, int(screen.height() * 0.92)) or 860)

    def _central(self) -> QWidget:
        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(14, 12, 14, 8)
        outer.setSpacing(10)
        outer.addWidget(self._header())
        self.banners = QVBoxLayout()
        self.banners.setSpacing(6)
        outer.addLayout(self.banners)
        outer.addWidget(self._body(), 1)
        return theme.FitScroll(central, leave=WINDOW_LEAVE)  # a screen shorter than the window: it scrolls

    def _header(self) -> HeaderCard:
        self.header = HeaderCard(self.controller, lambda: self.engine_settings, lambda: self.app_settings)
        self.header.settingsRequested.connect(self.open_settings)
        h = self.header  # the widgets the window's callers and tests reach directly
        self.pill, self.state_message, self.progress_text, self.progress_bar = (h.pill, h.state_message,
                                                                                h.progress_text, h.progress_bar)
        self.start_button, self.pause_button, self.stop_button = h.start_button, h.pause_button, h.stop_button
        self.device_label, self.model_label, self.identity_label, self.relay_label = (h.device_label, h.model_label,
                                                                                      h.identity_label, h.relay_label)
        return self.header

    def refresh_identity(self) -> None:
        """Who and where this node is, after the settings changed: the header and the swarm panel."""
        self.header.refresh_identity()
        self.peers.refresh_place()

    def _body(self) -> QSplitter:
        """The charts and Try it (left) beside the swarm panel and the log (right)."""
        body = QSplitter(Qt.Orientation.Horizontal)
        body.addWidget(self._main_column())
        body.addWidget(self._side())
        body.setStretchFactor(0, 3)
        body.setStretchFactor(1, 1)
        body.setChildrenCollapsible(False)
        return body

    def _main_column(self) -> QWidget:
        self.charts = ChartsPanel(self.session)
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
        self.tryit = TryItPanel(lambda: self.engine_flags.command("chat"))
        self.contribution = ContributionCard()  # what peers did with this node's rollouts (`contribution` events)
        self.controller.engine.eventReceived.connect(self.contribution.handle)
        self.contribution.changed.connect(self._contribution_tab)
        self.tabs = QTabWidget()
        self.tabs.addTab(scroll, "Training")
        self.tabs.addTab(self.tryit, "Try it")
        self.tabs.addTab(self.contribution, CONTRIBUTION_TAB)
        column = QWidget()
        layout = QVBoxLayout(column)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(10)
        layout.addWidget(self._tiles())
        layout.addWidget(self.tabs, 1)
        return column

    def _contribution_tab(self) -> None:
        """The tab's title carries the headline (used today), and a warning sign when peers reject much."""
        index = self.tabs.indexOf(self.contribution)
        used = self.contribution.used_today()
        title = CONTRIBUTION_TAB if used is None else f"{CONTRIBUTION_TAB} · {used:,} used today"
        if self.contribution.place is not None:  # where this node's model stands on the relay's results table
            title += f" · place {self.contribution.place[0]} of {self.contribution.place[1]}"
        warned = not self.contribution.warning.isHidden()
        self.tabs.setTabText(index, f"⚠ {title}" if warned else title)
        self.tabs.setTabToolTip(index, self.contribution.warning.text() if warned else self.contribution.message.text())

    def _side(self) -> QSplitter:
        self.peers = PeersPanel(self.session)
        self.peers.settings_place = lambda: settings_place(self.engine_settings)
        self.peers.refresh_place()
        self.peers.unbanRequested.connect(self.controller.unban)
        self.peers.switchRequested.connect(lambda: self.open_settings(focus_swarm=True))
        self.log_view = LogView(str(self.controller.paths.log_dir))
        log_card = QFrame()
        log_card.setObjectName("card")
        log_layout = QVBoxLayout(log_card)
        log_layout.setContentsMargins(12, 8, 12, 10)
        log_layout.addWidget(self.log_view)
        side = QSplitter(Qt.Orientation.Vertical)
        side.addWidget(theme.FitScroll(self.peers, leave=SIDE_LEAVE))  # a short screen: it scrolls, never overlaps
        side.addWidget(log_card)
        side.setStretchFactor(0, 1)
        side.setStretchFactor(1, 1)
        side.setSizes([470, 230])
        side.setChildrenCollapsible(False)
        side.setMinimumWidth(320)
        side.setMaximumWidth(440)
        return side

    def _status_bar(self) -> None:
        self.status_left = QLabel(f"Data: {short_path(self.controller.paths.data_dir)}")
        self.status_left.setObjectName("muted")
        self.status_right = QLabel("")
        self.status_right.setObjectName("muted")
        self.statusBar().addWidget(self.status_left, 1)
        self.statusBar().addPermanentWidget(self.status_right)

    def _connect(self) -> None:
        """The signals the window itself shows (the header card and the panels listen for theirs)."""
        controller, session = self.controller, self.session
        controller.phaseChanged.connect(lambda phase: self.tryit.set_training(phase in TRAINING_PHASES))
        controller.problem.connect(self.show_problem)
        controller.problemCleared.connect(self._clear_problem)
        session.historyChanged.connect(self.refresh_tiles)
        session.logMessage.connect(self.log_view.add)
        session.checkpointSaved.connect(lambda r: self.status_right.setText(f"Last checkpoint: round {r} at "
                                                                            f"{time.strftime('%H:%M')}"))

    def _tiles(self) -> TileRow:
        self.tile_rounds = Tile("Rounds trained")
        self.tile_reward = Tile("Your reward")
        self.tile_swarm = Tile("Swarm's reward")
        self.tile_accuracy = Tile("Held-out accuracy")
        self.tile_speed = Tile("Speed")
        self.tile_time = Tile("Time per round")
        self.tile_row = TileRow([self.tile_rounds, self.tile_reward, self.tile_swarm, self.tile_accuracy,
                                 self.tile_speed, self.tile_time])
        return self.tile_row

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
        swarm = self.menuBar().addMenu("&Swarm")
        swarm.addAction("Switch swarm…", lambda: self.open_settings(focus_swarm=True))
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction("Check connection…", self.open_doctor)

    def open_doctor(self) -> DoctorDialog:
        """Help ▸ Check connection: `sapling-node doctor --json` on the swarm in the settings, in a dialog."""
        if self.doctor_dialog is not None:
            self.doctor_dialog.stop()
            self.doctor_dialog.deleteLater()
        invite = swarm_invite(self.engine_settings)
        relay = ["--relay", invite.link()] if invite is not None else []
        dialog = DoctorDialog(lambda: self.engine_flags.command("doctor", "--json", *relay), self)
        self.doctor_dialog = dialog
        dialog.open()
        dialog.start()
        return dialog

    def open_export(self) -> ExportDialog:
        training = self.controller.phase in TRAINING_PHASES
        dialog = ExportDialog(lambda flags: self.engine_flags.command("export", *flags), training, self)
        dialog.exported.connect(lambda path: dialog.step.setText(f"Saved to {short_path(path)}."))
        dialog.open()
        return dialog

    # -- refreshing ---------------------------------------------------------------------
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
        self.tile_reward.setToolTip(specialty_tooltip(self.session.last_metrics))
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
        self.tile_row.refit()

    # -- banners and problems -----------------------------------------------------------
    def add_banner(self, level: str, text: str, actions: list[tuple[str, Callable[[], None]]] | None = None) -> Banner:
        banner = Banner(level, text, actions or [])
        banner.style().unpolish(banner)
        banner.style().polish(banner)
        self.banners.addWidget(banner)
        return banner

    def show_problem(self, problem: Problem) -> None:
        self._clear_problem()
        actions: list[tuple[str, Callable[[], None]]] = [("Details…",
                                                          lambda: self.problem_dialog.show_problem(problem))]
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

    def open_settings(self, focus_swarm: bool = False) -> None:
        from app.power import has_battery

        dialog = SettingsDialog(self.engine_settings, self.app_settings, self.controller.policy.idle_supported(),
                                has_battery(), str(self.store.config_file), self)
        dialog.finished.connect(lambda result: self._settings_chosen(dialog, result, first_run=False))
        identity = IdentityPanel(lambda args: self.engine_flags.command("identity", *args))
        identity.restored.connect(self._identity_restored)
        dialog.tabs.addTab(identity, "Identity")  # Settings ▸ Identity: back up and restore the key (app/identity.py)
        self.dialog = dialog
        dialog.open()
        if focus_swarm:
            dialog.focus_swarm()

    def _identity_restored(self, name: str, peer_id: str) -> None:
        """A backup was restored: the engine restarts with that key."""
        self.add_banner("info", f"<b>This node is now {escape(name)}</b> (peer id {escape(peer_id)}).")
        if self.controller.engine.is_running():
            self.controller.restart()

    # -- joining a swarm from an invite -----------------------------------------------------
    def open_invite(self, text: str) -> JoinDialog:
        """An invite arrived (command line, a second launch, the macOS open-URL event): "Join this swarm?"."""
        self.bring_to_front()
        if self.join_dialog is not None:
            self.join_dialog.reject()
        dialog = JoinDialog(text, self, refuse_datasets=bool(self.engine_settings.refuse_dataset_swarms))
        dialog.finished.connect(lambda result: self._invite_answered(dialog, result))
        self.join_dialog = dialog
        dialog.open()
        return dialog

    def _invite_answered(self, dialog: JoinDialog, result: int) -> None:
        if self.join_dialog is dialog:
            self.join_dialog = None
        if result == 1 and dialog.preview is not None:
            self.join(dialog.preview)
        elif not self.app_settings.first_run_done and self.dialog is None:
            self.open_first_run()  # a first start that began with an invite, declined: the usual welcome

    def join(self, preview: Preview) -> bool:
        """Save the previewed swarm as [swarm] relay_url (atomically) and (re)start training in it."""
        new = self.engine_settings.replace(swarm_mode="relay", relay_url=preview.link(), join_token="")
        try:
            self.store.save_engine(new)
        except (SettingsError, OSError) as exc:
            QMessageBox.warning(self, "Sapling: swarm not saved", f"The swarm could not be saved: {exc}")
            return False
        self.engine_settings = new
        self.app_settings.first_run_done = True
        self.save_app_settings()
        self.session.swarm = {}  # the old swarm's line no longer applies
        self.session.swarmChanged.emit()
        self.add_banner("info", f"<b>Joined {escape(preview.name)}.</b> Training continues in this swarm.")
        if self.controller.engine.is_running():
            self.controller.restart()
        else:
            self.controller.start()
        return True

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
            later = ", ".join(s.label.lower() for s in restart_changes(old.config(), new_engine.config()))
            self.add_banner("info", f"Settings saved. They apply when training restarts ({later} need a restart).",
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
                QMessageBox.warning(self, "Sapling",
                                    f"Could not change the start-at-login entry ({self.autostart.location}): {exc}")

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
