"""The engine as a child process: `sapling-node serve` under QProcess, JSON lines both ways.

`EngineProcess` starts the engine, splits its stdout into lines, parses each
with `engine.common.events.parse_event` and emits the events; a malformed line is
reported on `badLine` and skipped, never fatal. stderr goes out line by line
on `stderrLine` (the log view shows it). Commands go in on stdin.

The command line comes from `EngineFlags.command("serve")` (app/engine_flags.py,
through `engine.common.events.node_command`): ``python -m engine.cli serve`` in a
dev checkout; in a frozen build the same executable with the ``node``
subcommand (``sapling node serve``), which `app.main` hands to `engine.cli.main`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

import engine
from engine.common.errors import EventError
from engine.common.events import MAX_LINE_CHARS, encode, make_command, parse_event

log = logging.getLogger(__name__)

TAIL_LINES = 60


def engine_environment() -> QProcessEnvironment:
    """This process's environment, plus what the child needs to find `engine` and speak UTF-8."""
    env = QProcessEnvironment.systemEnvironment()
    if not getattr(sys, "frozen", False):
        root = str(Path(engine.__file__).resolve().parent.parent)
        current = env.value("PYTHONPATH", "")
        env.insert("PYTHONPATH", root + (os.pathsep + current if current else ""))
    env.insert("PYTHONIOENCODING", "utf-8")
    env.insert("PYTHONUNBUFFERED", "1")
    env.remove("QT_QPA_PLATFORM")  # the engine never loads Qt
    return env


class EngineProcess(QObject):
    """One engine child at a time; `start()` again after it exited starts a fresh one."""

    eventReceived = Signal(dict)
    stderrLine = Signal(str)
    badLine = Signal(str)  # what was wrong with a stdout line that is not an event
    started = Signal()
    exited = Signal(int, bool)  # exit code (-1: failed to start or killed), asked to stop

    def __init__(
        self,
        command: Callable[[], list[str]],
        stop_grace_ms: int = 90_000,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.command = command
        self.stop_grace_ms = stop_grace_ms
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.proc: QProcess | None = None
        self.stop_requested = False
        self.started_at = 0.0
        self.unknown_types = 0
        self._out = bytearray()
        self._err = bytearray()
        self._generation = 0

    # -- life cycle ---------------------------------------------------------------------
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.state() != QProcess.ProcessState.NotRunning

    def start(self) -> None:
        if self.is_running():
            return
        argv = self.command()
        self._generation += 1
        self.stop_requested = False
        self._out.clear()
        self._err.clear()
        if self.proc is not None:
            self.proc.deleteLater()
        proc = QProcess(self)
        proc.setProcessEnvironment(engine_environment())
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(self._read_stderr)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        proc.started.connect(self.started)
        self.proc = proc
        self.started_at = time.monotonic()
        self._remember(f"starting engine: {' '.join(argv)}")
        log.info("starting engine: %s", argv)
        proc.start(argv[0], argv[1:])

    def send(self, cmd: str, **fields: Any) -> bool:
        """Write one command line (with its fields, e.g. unban's `peer`); False when no engine is running."""
        if not self.is_running() or self.proc is None:
            return False
        self.proc.write((encode(make_command(cmd, **fields)) + "\n").encode("utf-8"))
        return True

    def stop(self) -> None:
        """Ask for a stop at the next safe point; kill after `stop_grace_ms` if it hangs."""
        if not self.is_running():
            return
        self.stop_requested = True
        self.send("stop")
        generation = self._generation
        QTimer.singleShot(self.stop_grace_ms, self, lambda: self._kill_if(generation))

    def kill(self) -> None:
        if self.proc is not None and self.is_running():
            self.proc.kill()

    def wait_for_exit(self, msecs: int) -> bool:
        """Block up to `msecs` for the child to exit (used only when the app quits)."""
        if self.proc is None or not self.is_running():
            return True
        return self.proc.waitForFinished(msecs)

    def _kill_if(self, generation: int) -> None:
        if generation == self._generation and self.is_running():
            log.warning("engine did not stop within %d ms: killing it", self.stop_grace_ms)
            self._remember("engine did not stop in time: killed")
            self.kill()

    # -- reading ------------------------------------------------------------------------
    def _remember(self, line: str) -> None:
        self.tail.append(f"{time.strftime('%H:%M:%S')} {line}")

    def _read_stdout(self) -> None:
        if self.proc is None:
            return
        self._out += bytes(self.proc.readAllStandardOutput().data())
        if b"\n" not in self._out:
            if len(self._out) > 4 * MAX_LINE_CHARS:
                self._out.clear()
                self._bad("a line longer than the event limit")
            return
        *lines, rest = bytes(self._out).split(b"\n")
        self._out[:] = rest
        for line in lines:
            self._handle_line(line)

    def _handle_line(self, raw: bytes) -> None:
        line = raw.rstrip(b"\r")
        if not line.strip():
            return
        try:
            event = parse_event(line)
        except EventError as exc:
            preview = line[:160].decode("utf-8", errors="replace")
            self._bad(f"{exc} ({preview!r})")
            return
        if event is None:
            self.unknown_types += 1
            return
        if event["type"] in ("log", "error"):
            level = event.get("level", "error")
            self._remember(f"{level} {event.get('logger', event.get('kind', ''))}: {event.get('message', '')}")
        self.eventReceived.emit(event)

    def _bad(self, what: str) -> None:
        self._remember(f"malformed event line ignored: {what}")
        self.badLine.emit(what)

    def _read_stderr(self) -> None:
        if self.proc is None:
            return
        self._err += bytes(self.proc.readAllStandardError().data())
        if b"\n" not in self._err and len(self._err) < 64_000:
            return
        *lines, rest = bytes(self._err).split(b"\n")
        self._err[:] = rest
        for raw in lines:
            self._stderr_line(raw)

    def _stderr_line(self, raw: bytes) -> None:
        # Progress bars redraw with carriage returns; keep the last state of the line.
        text = raw.decode("utf-8", errors="replace").rstrip("\r").split("\r")[-1].rstrip()
        if text:
            self._remember(text)
            self.stderrLine.emit(text)

    # -- exit ---------------------------------------------------------------------------
    def _flush(self) -> None:
        self._read_stdout()
        self._read_stderr()
        if self._out.strip():
            self._handle_line(bytes(self._out))
        if self._err.strip():
            self._stderr_line(bytes(self._err))
        self._out.clear()
        self._err.clear()

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._flush()
        if status == QProcess.ExitStatus.CrashExit:
            code = -1
        self._remember(f"engine exited with code {code}")
        log.info("engine exited with code %s (stop requested: %s)", code, self.stop_requested)
        self.exited.emit(code, self.stop_requested)

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error != QProcess.ProcessError.FailedToStart or self.proc is None:
            return
        message = f"could not start the engine: {self.proc.errorString()}"
        self._remember(message)
        self.stderrLine.emit(message)
        self.exited.emit(-1, self.stop_requested)
