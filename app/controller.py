"""The app's one controller: starts and steers the engine, decides what the user must hear.

`Controller` owns the `EngineProcess` and the `Session` (the signal hub the
widgets read). It turns the user's Start / Pause / Resume / Stop into engine
commands, restarts a crashed engine with backoff, keeps training inside the
idle / AC-power limits, and emits `notify(title, text, level)` when the user
is needed: the engine crashed, the relay has been unreachable for long, the
disk is (nearly) full. The window and the tray only listen.

Phases (`Controller.phase`): idle, starting, training, paused, waiting (held by
the idle/AC limits), stopping, finished, restarting (after a crash), failed
(a problem only the user can fix, e.g. a model folder that does not exist).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from app.engine_process import EngineProcess
from app.power import PowerPolicy
from app.session import Session
from engine.common.errors import user_error_kinds, user_exit_codes
from engine.common.paths import Paths, nearest_existing

log = logging.getLogger(__name__)

RESTART_DELAYS = (2.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0)
USER_ERRORS = user_error_kinds()  # from engine/common/errors.py: the one list of what a person must fix
USER_EXIT_CODES = user_exit_codes()
RELAY_ALERT_SECONDS = 300.0
DISK_LOW_BYTES = 1 << 30
DISK_FULL_MARKERS = ("No space left on device", "[Errno 28]", "ENOSPC", "Disk quota exceeded")


@dataclass
class Problem:
    """Something went wrong in a way the user should see: a crash or a setting to fix."""

    title: str
    text: str
    details: str  # the last log lines
    needs_settings: bool  # True: restarting will not help, the user must change something
    restart_in: float | None  # seconds until the automatic restart, None when there is none


class Controller(QObject):
    phaseChanged = Signal(str)
    notify = Signal(str, str, str)  # title, text, level: info | warning | error
    problem = Signal(object)  # a Problem (the tray shows it as a notification too)
    problemCleared = Signal()
    wantsTraining = Signal(bool)  # the user's intent changed: Start/Resume (True), Pause/Stop/finished (False)

    def __init__(
        self,
        paths: Paths,
        session: Session,
        engine_process: EngineProcess,
        policy: PowerPolicy | None = None,
        restart_delays: Sequence[float] = RESTART_DELAYS,
        relay_alert_seconds: float = RELAY_ALERT_SECONDS,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.paths = paths
        self.session = session
        self.engine = engine_process
        self.policy = policy or PowerPolicy(parent=self)
        self.restart_delays = tuple(restart_delays)
        self.relay_alert_seconds = relay_alert_seconds
        self.crashes = 0  # consecutive crashes since the last completed round
        self.user_paused = False
        self.policy_paused = False
        self.failed = False
        self.finished = False
        self.last_fatal: tuple[str, str] | None = None
        self.relay_down_since: float | None = None
        self.relay_alerted = False
        self.disk_alerted = False
        self._phase = "idle"

        self.restart_timer = QTimer(self)
        self.restart_timer.setSingleShot(True)
        self.restart_timer.timeout.connect(self._restart)
        self.watch_timer = QTimer(self)
        self.watch_timer.setInterval(15_000)
        self.watch_timer.timeout.connect(self.watch)
        self.watch_timer.start()

        engine_process.eventReceived.connect(session.handle)
        engine_process.started.connect(self._refresh)
        engine_process.exited.connect(self._on_exit)
        engine_process.stderrLine.connect(self._on_stderr)
        engine_process.badLine.connect(lambda what: session.logMessage.emit("warning", "app",
                                                                            "Ignored a malformed line from the "
                                                                            f"engine: {what}"))
        session.statusChanged.connect(self._refresh)
        session.roundAdded.connect(self._on_round)
        session.engineError.connect(self._on_engine_error)
        session.swarmChanged.connect(self._on_swarm)
        self.policy.allowedChanged.connect(self._on_policy)

    # -- what the UI shows --------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    def _compute_phase(self) -> str:
        if self.restart_timer.isActive():
            return "restarting"
        if not self.engine.is_running():
            if self.failed:
                return "failed"
            return "finished" if self.finished else "idle"
        if self.engine.stop_requested or self.session.state == "stopping":
            return "stopping"
        state = self.session.state
        if state == "paused" or self.user_paused or self.policy_paused:
            return "paused" if self.user_paused or not self.policy_paused else "waiting"
        if state == "waiting":  # outside run.schedule's hours: the engine sleeps until they begin
            return "scheduled"
        if state == "training":
            return "training"
        return "starting"

    def _refresh(self) -> None:
        phase = self._compute_phase()
        if phase != self._phase:
            self._phase = phase
            self.phaseChanged.emit(phase)

    def summary(self, swarm: str = "") -> str:
        """One line for the tray tooltip: state, round, reward and the swarm's name."""
        words = {"idle": "Not training", "starting": "Starting", "training": "Training", "paused": "Paused",
                 "waiting": "Waiting", "scheduled": "Scheduled",
                 "stopping": "Stopping", "finished": "Finished", "restarting": "Restarting",
                 "failed": "Needs your attention"}
        parts = [f"Sapling · {words.get(self._phase, self._phase)}"]
        if self._phase == "scheduled" and self.next_training():
            parts.append(f"next training {self.next_training()}")
        history = self.session.history
        if history.rounds:
            parts.append(f"round {history.rounds[-1]}")
            reward = history.reward[-1]
            if reward is not None:
                parts.append(f"reward {reward:.2f}")
        if swarm:
            parts.append(swarm)
        return " · ".join(parts)

    def next_training(self) -> str:
        """When training starts again by the schedule, in words ('22:00', 'Monday 22:00'); '' if not waiting."""
        if self._phase != "scheduled" or not self.session.next_start:
            return ""
        try:
            start = datetime.fromisoformat(self.session.next_start)
        except ValueError:
            return ""
        soon = start.date() == datetime.now().date() or start - datetime.now() < timedelta(hours=12)
        return start.strftime("%H:%M") if soon else start.strftime("%A %H:%M")

    # -- user actions -------------------------------------------------------------------
    def start(self) -> None:
        self.restart_timer.stop()
        self.failed = self.finished = False
        self.user_paused = False
        self.last_fatal = None
        self.problemCleared.emit()
        self.wantsTraining.emit(True)
        self.engine.start()
        self.policy.check()
        if not self.policy.allowed:
            self._on_policy(False, self.policy.reason)
        self._refresh()

    def pause(self) -> None:
        self.user_paused = True
        self.wantsTraining.emit(False)
        self.engine.send("pause")
        self._refresh()

    def unban(self, peer_id: str) -> None:
        """Lift this node's own ban on a peer (a ban from the settings' list stays)."""
        self.engine.send("unban", peer=peer_id)

    def resume(self) -> None:
        self.user_paused = False
        self.wantsTraining.emit(True)
        if self.policy_paused:
            self._refresh()  # stays "waiting" until the limits allow
            return
        self.engine.send("resume")
        self._refresh()

    def toggle_pause(self) -> None:
        if self._phase in ("paused", "waiting"):
            self.resume()
        else:
            self.pause()

    def stop(self) -> None:
        self.wantsTraining.emit(False)
        self._stop_engine()

    def _stop_engine(self) -> None:
        self.restart_timer.stop()
        self.user_paused = self.policy_paused = False
        self.engine.stop()
        self._refresh()

    def stop_for_quit(self) -> None:
        """Stop at the next safe point because the app quits; the user's intent stays as it was."""
        self.restart_timer.stop()
        self.engine.stop()
        self._refresh()

    def reload(self) -> None:
        """Tell a running engine to re-read config.toml at the next round boundary."""
        self.engine.send("reload")

    def restart(self) -> None:
        """Stop the engine and start it again once it has exited (new model, swarm or threads)."""
        if not self.engine.is_running():
            self.start()
            return
        self._restart_after_exit = True
        self._stop_engine()

    # -- engine life --------------------------------------------------------------------
    _restart_after_exit = False

    def _on_round(self, metrics: dict) -> None:
        self.crashes = 0
        self.problemCleared.emit()

    def _on_engine_error(self, kind: str, message: str, fatal: bool) -> None:
        if fatal:
            self.last_fatal = (kind, message)
        if any(marker in message for marker in DISK_FULL_MARKERS):
            self._disk_full(nearly=False)
        elif not fatal:
            self.notify.emit("Sapling", message, "warning")

    def _on_stderr(self, line: str) -> None:
        self.session.logMessage.emit("stderr", "engine", line)
        if any(marker in line for marker in DISK_FULL_MARKERS):
            self._disk_full(nearly=False)

    def _on_exit(self, code: int, asked_to_stop: bool) -> None:
        self.policy_paused = False
        tail = "\n".join(self.engine.tail)
        if self._restart_after_exit:
            self._restart_after_exit = False
            self.start()
            return
        if code == 0:
            self.finished = not asked_to_stop
            if self.finished:
                self.wantsTraining.emit(False)
            self.session.state = "stopped"
            self._refresh()
            return
        kind, message = self.last_fatal or ("", "")
        if asked_to_stop:  # no automatic restart after the user's own stop
            self.session.state = "stopped"
            if code != -1 or message:
                text = message or f"The engine exited with code {code} while stopping; the last checkpoint is kept."
                self.problem.emit(Problem("The training engine stopped with an error", text, tail, False, None))
            self._refresh()
            return
        if kind == "NodeBusyError":  # another node trains with this data folder: nothing in Settings changes that
            self.failed = True
            self.session.state = "stopped"
            self.problem.emit(Problem("Sapling is already training on this computer", message, tail, False, None))
            self._refresh()
            return
        if kind in USER_ERRORS or code in USER_EXIT_CODES:
            self.failed = True
            self.session.state = "stopped"
            text = message or f"The engine refused to start (exit code {code})."
            self.problem.emit(Problem("Sapling cannot train with these settings", text, tail, True, None))
            self._refresh()
            return
        delay = self.restart_delays[min(self.crashes, len(self.restart_delays) - 1)]
        self.crashes += 1
        self.session.state = "stopped"
        what = f"The training engine stopped unexpectedly (exit code {code})."
        if message:
            what += f" {message}"
        self.problem.emit(Problem("The training engine crashed", what, tail, False, delay))
        self.restart_timer.start(int(delay * 1000))
        self._refresh()

    def _restart(self) -> None:
        log.info("restarting the engine after a crash (attempt %d)", self.crashes)
        self.last_fatal = None
        self.engine.start()
        if self.user_paused:
            self.engine.send("pause")
        self._refresh()

    # -- limits and watchdogs -----------------------------------------------------------
    def _on_policy(self, allowed: bool, reason: str) -> None:
        running = self.engine.is_running() and not self.engine.stop_requested
        if not allowed and running and not self.policy_paused:
            self.policy_paused = True
            self.engine.send("pause")
            self.session.logMessage.emit("info", "app", reason)
        elif allowed and self.policy_paused:
            self.policy_paused = False
            if running and not self.user_paused:
                self.engine.send("resume")
                self.session.logMessage.emit("info", "app", "Limits allow training again: resuming.")
        self._refresh()

    def _on_swarm(self) -> None:
        swarm = self.session.swarm
        if swarm.get("connected") or swarm.get("relay") in (None, ""):
            self.relay_down_since = None
            self.relay_alerted = False
        elif self.relay_down_since is None:
            self.relay_down_since = time.monotonic()

    def _disk_full(self, nearly: bool) -> None:
        if not self.disk_alerted:
            self.disk_alerted = True
            title = "Sapling: the disk is almost full" if nearly else "Sapling: the disk is full"
            self.notify.emit(title, f"Free some space on the disk holding {self.paths.data_dir}: "
                             "training needs room to save its progress.", "error")

    def watch(self) -> None:
        """Periodic checks: relay unreachable for long, disk nearly full."""
        if self.relay_down_since is not None and not self.relay_alerted and self.engine.is_running():
            down = time.monotonic() - self.relay_down_since
            if down >= self.relay_alert_seconds:
                self.relay_alerted = True
                relay = self.session.swarm.get("relay") or "the relay"
                self.notify.emit("Sapling: cannot reach the swarm",
                                 f"{relay} has been unreachable for {down / 60:.0f} minutes. Training continues alone; "
                                 "check your network or the relay address in Settings.", "warning")
        free = free_bytes(self.paths.data_dir)
        if free is not None:
            if free < DISK_LOW_BYTES:
                self._disk_full(nearly=True)
            elif free > 2 * DISK_LOW_BYTES:
                self.disk_alerted = False


def free_bytes(folder: Path) -> int | None:
    """Free space on the disk holding `folder` (its nearest existing parent)."""
    try:
        return shutil.disk_usage(nearest_existing(Path(folder))).free
    except OSError:
        return None
