"""The tray icon: Show, Pause/Resume and Quit; the round, reward and swarm in its tooltip.

Outside run.schedule's hours the tooltip and a greyed menu line say when
training next starts ("Next training at 22:00 (schedule)").

The menu and its actions exist whether or not the desktop has a tray, so
they can be used (and tested) directly; the QSystemTrayIcon itself is only
made where `QSystemTrayIcon.isSystemTrayAvailable()` says there is a tray.
Notifications go to the tray balloon when there is one; `notified` lets the
window show them itself when there is not.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app import theme
from app.controller import Controller, Problem


class Tray(QObject):
    showRequested = Signal()
    quitRequested = Signal()

    def __init__(self, controller: Controller, available: bool | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.available = QSystemTrayIcon.isSystemTrayAvailable() if available is None else available
        self.menu = QMenu()
        self.show_action = QAction("Show Sapling", self.menu)
        self.pause_action = QAction("Pause training", self.menu)
        self.quit_action = QAction("Quit Sapling", self.menu)
        self.next_action = QAction("", self.menu)  # "Next training at 22:00 (schedule)", shown while waiting for it
        self.next_action.setEnabled(False)
        self.show_action.triggered.connect(self.showRequested)
        self.pause_action.triggered.connect(self._pause_or_resume)
        self.quit_action.triggered.connect(self.quitRequested)
        self.menu.addAction(self.show_action)
        self.menu.addAction(self.pause_action)
        self.menu.addAction(self.next_action)
        self.menu.addSeparator()
        self.menu.addAction(self.quit_action)
        self.icon: QSystemTrayIcon | None = None
        if self.available:
            self.icon = QSystemTrayIcon(theme.tray_icon("idle"), self)
            self.icon.setContextMenu(self.menu)
            self.icon.activated.connect(self._activated)
            self.icon.show()
        controller.phaseChanged.connect(self.refresh)
        controller.problem.connect(self._on_problem)
        controller.session.roundAdded.connect(lambda _m: self.refresh())
        controller.session.swarmChanged.connect(self.refresh)
        controller.session.statusChanged.connect(self.refresh)
        self.swarm_name: Callable[[], str] = lambda: ""  # the swarm in words (the window's swarm panel sets it)
        self.refresh()

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.showRequested.emit()

    def _pause_or_resume(self) -> None:
        phase = self.controller.phase
        if phase in ("paused", "waiting"):
            self.controller.resume()
        elif phase in ("idle", "finished", "failed"):
            self.controller.start()
        else:
            self.controller.pause()

    def tooltip(self) -> str:
        return self.controller.summary(self.swarm_name())

    def refresh(self) -> None:
        phase = self.controller.phase
        if phase in ("paused", "waiting"):
            self.pause_action.setText("Resume training")
        elif phase in ("idle", "finished", "failed"):
            self.pause_action.setText("Start training")
        else:
            self.pause_action.setText("Pause training")
        self.pause_action.setEnabled(phase not in ("stopping", "restarting"))
        upcoming = self.controller.next_training()
        self.next_action.setText(f"Next training at {upcoming} (schedule)" if upcoming else "")
        self.next_action.setVisible(bool(upcoming))
        if self.icon is not None:
            self.icon.setToolTip(self.tooltip())
            self.icon.setIcon(theme.tray_icon(phase))

    def show_message(self, title: str, text: str, level: str) -> bool:
        """A balloon notification; False when there is no tray to show it."""
        if self.icon is None:
            return False
        icon = {"error": QSystemTrayIcon.MessageIcon.Critical, "warning": QSystemTrayIcon.MessageIcon.Warning}.get(
            level, QSystemTrayIcon.MessageIcon.Information)
        self.icon.showMessage(title, text, icon, 15_000)
        return True

    def _on_problem(self, problem: Problem) -> None:
        when = f" Restarting in {problem.restart_in:.0f} s." if problem.restart_in is not None else ""
        self.show_message(f"Sapling: {problem.title.lower()}", f"{problem.text}{when}", "error")

    def hide(self) -> None:
        if self.icon is not None:
            self.icon.hide()

