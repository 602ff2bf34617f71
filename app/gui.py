"""Wiring: settings, session, engine process, controller, window and tray, built in one place.

`build_gui(flags)` returns a `Gui` holding every piece, so
`app.main`, the self-test, the screenshots script, the benchmark and the
tests all assemble the app the same way.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QProgressDialog

from app.autostart import Autostart, launch_command
from app.controller import Controller
from app.engine_flags import EngineFlags
from app.engine_process import EngineProcess
from app.panels import swarm_place
from app.power import PowerPolicy
from app.session import Session
from app.settings import SettingsStore, settings_place
from app.tray import Tray
from app.window import MainWindow
from engine.common.paths import Paths

log = logging.getLogger(__name__)

QUIT_GRACE_MS = 60_000
QUIT_DIALOG_MS = 500  # "Saving your progress" appears when stopping takes longer than this


@dataclass
class Gui:
    paths: Paths
    store: SettingsStore
    session: Session
    engine: EngineProcess
    controller: Controller
    window: MainWindow
    tray: Tray
    warnings: list[str] = field(default_factory=list)
    quitting: bool = False
    on_quit: Callable[[], None] | None = None
    quit_dialog: QProgressDialog | None = None

    def after_show(self, invite: str = "") -> None:
        """Work that can wait until the window is on screen: history, warnings, an invite to open (instead of
        the first-run dialog, which follows if it is declined), first run, carrying on."""
        self.session.load_history(self.paths.metrics_file)
        for warning in self.warnings:
            self.window.add_banner("warning", warning)
        self.warnings.clear()
        if invite:
            self.window.open_invite(invite)
        if not self.window.app_settings.first_run_done:
            if not invite:
                self.window.open_first_run()
        elif self.window.app_settings.resume_training and not self.engine.is_running():
            self.session.logMessage.emit("info", "app", "Training was running when Sapling quit: carrying on.")
            self.controller.start()

    def remember_intent(self, wanted: bool) -> None:
        """Keep whether the user wants training (atomically, at once), for the next launch."""
        if wanted != self.window.app_settings.resume_training:
            self.window.app_settings.resume_training = wanted
            self.window.save_app_settings()

    def quit_on_signal(self, count: int) -> None:
        """SIGINT or SIGTERM: the first quits as the tray's Quit does (training stops at its next safe point, the
        last checkpoint is kept); another stops the engine now."""
        if count == 1:
            log.info("quit signal: stopping at the next safe point")
            print("Sapling: quitting; training stops at its next safe point (the last checkpoint is kept). "
                  "Press Ctrl+C again to stop now." if self.engine.is_running() else "Sapling: quitting.",
                  file=sys.stderr, flush=True)
            self.quit()
        elif self.engine.is_running():
            log.info("second quit signal: stopping the engine now")
            self.engine.kill()

    def quit(self, grace_ms: int = QUIT_GRACE_MS) -> None:
        """Stop the engine at a safe point (at most `grace_ms`, then kill), then leave the event loop."""
        if self.quitting:
            return
        self.quitting = True
        self.window.save_app_settings()
        self.window.quitting = True
        # exit(), not quit(): Qt 6's quit() first asks every window to close, and a hidden window may refuse.
        done = self.on_quit or (lambda: QApplication.exit(0))
        if not self.engine.is_running():
            self.controller.restart_timer.stop()
            self.tray.hide()
            done()
            return
        self.controller.stop_for_quit()  # the header says Stopping… and Pause/Stop grey out now
        progress = QProgressDialog("Saving your progress: training stops at the next safe point…", "Quit now", 0, 0,
                                   self.window if self.window.isVisible() else None)
        progress.setWindowTitle("Sapling")
        progress.setMinimumDuration(QUIT_DIALOG_MS)
        # The minimum-duration timer starts at the first value; without one Qt shows the dialog after its 4 s default.
        progress.setValue(0)
        self.quit_dialog = progress

        def finish(*_args: object) -> None:
            progress.reset()
            progress.hide()
            self.tray.hide()
            done()

        self.engine.exited.connect(finish)
        progress.canceled.connect(self.engine.kill)
        QTimer.singleShot(grace_ms, self.engine, self.engine.kill)


def build_gui(
    flags: EngineFlags | None = None,
    tray_available: bool | None = None,
    command: Callable[[], list[str]] | None = None,
    policy: PowerPolicy | None = None,
    autostart: Autostart | None = None,
    restart_delays: Sequence[float] | None = None,
) -> Gui:
    """The app around the engine `flags` start (its home and settings flags; none: the user's own folders).
    `command` replaces the engine's command line (a stand-in engine in the tests and screenshots)."""
    flags = flags or EngineFlags()
    paths = flags.paths()
    store = SettingsStore(paths)
    engine_settings = store.load_engine()
    app_settings = store.load_app()
    session = Session(run=store.run_name())
    engine = EngineProcess(command or (lambda: flags.command("serve")))
    extra = {"restart_delays": restart_delays} if restart_delays is not None else {}
    controller = Controller(paths, session, engine, policy=policy, **extra)  # type: ignore[arg-type]
    controller.policy.set_rules(app_settings.only_when_idle, app_settings.only_on_ac_power)
    tray = Tray(controller, available=tray_available)
    window = MainWindow(controller, store, app_settings, engine_settings, flags, tray_available=tray.available,
                        autostart=autostart, autostart_argv=launch_command(flags.home_flags()))
    gui = Gui(paths, store, session, engine, controller, window, tray, warnings=store.take_warnings())

    tray.swarm_name = lambda: swarm_place(session.swarm, *settings_place(window.engine_settings))[0]
    tray.refresh()
    tray.showRequested.connect(window.bring_to_front)
    tray.quitRequested.connect(gui.quit)
    window.quitRequested.connect(gui.quit)

    def notify(title: str, text: str, level: str) -> None:
        if not tray.show_message(title, text, level):
            window.notify(title, text, level)

    controller.notify.connect(notify)
    controller.wantsTraining.connect(gui.remember_intent)
    return gui
