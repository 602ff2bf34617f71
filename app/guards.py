"""Safety nets: one running app per user, and a bug becomes a dialog plus a log entry.

`SingleInstance` listens on a local socket (QLocalServer) named after the
user and the config dir. A second launch finds it, asks the first to raise
its window (and hands it the invite link it was started with, `sapling
sapling://join?...`), and exits. A socket left behind by a crashed app is
removed. `InviteEvents` catches the open-URL event macOS sends when a
`sapling://` link is clicked (QFileOpenEvent, on the application object).

`install_excepthook` routes uncaught exceptions to the app log (rotating,
in the platformdirs log dir) and to an error dialog with the traceback.

`QuitSignals` turns SIGINT (Ctrl+C in the terminal that ran `make run`) and
SIGTERM (a logout, `kill`) into a Qt signal: Python runs its signal
handlers only between bytecodes, and Qt's event loop runs none while it
waits, so the C handler writes the signal's number to a socket
(`signal.set_wakeup_fd`) that a QSocketNotifier watches. Without it, Ctrl+C
raised KeyboardInterrupt inside whatever Qt callback ran next, printed a
traceback and left the app running.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import logging.handlers
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from PySide6.QtCore import QEvent, QObject, QSocketNotifier, Signal
from PySide6.QtGui import QFileOpenEvent
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

APP_LOG = "sapling-app.log"
MAX_MESSAGE_BYTES = 64 * 1024  # one line from a second launch: "raise" or "open <invite>"
INVITE_SCHEME = "sapling"


def instance_name(config_dir: Path) -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    digest = hashlib.sha256(f"{user}:{Path(config_dir).resolve()}".encode()).hexdigest()[:12]
    return f"sapling-{digest}"


class SingleInstance(QObject):
    raiseRequested = Signal()
    inviteReceived = Signal(str)  # a second launch was given an invite link to open

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self.server: QLocalServer | None = None

    def notify_running(self, timeout_ms: int = 500, invite: str = "") -> bool:
        """True when another instance answered (it was asked to raise its window, and to open `invite`)."""
        socket = QLocalSocket()
        socket.connectToServer(self.name)
        if not socket.waitForConnected(timeout_ms):
            return False
        line = "open " + " ".join(invite.split()) if invite else "raise"  # one line: no newline inside
        socket.write(line.encode("utf-8")[: MAX_MESSAGE_BYTES - 1] + b"\n")
        socket.waitForBytesWritten(timeout_ms)
        socket.disconnectFromServer()
        return True

    def listen(self) -> bool:
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(self.name):
            QLocalServer.removeServer(self.name)  # stale, from an app that crashed
            if not server.listen(self.name):
                log.warning("single-instance guard unavailable: %s", server.errorString())
                return False
        server.newConnection.connect(self._on_connection)
        self.server = server
        return True

    def _on_connection(self) -> None:
        if self.server is None:
            return
        while self.server.hasPendingConnections():
            socket = self.server.nextPendingConnection()
            # The second instance writes one line at once after connecting; wait for it briefly.
            data = b""
            while b"\n" not in data and len(data) < MAX_MESSAGE_BYTES:
                if not socket.bytesAvailable() and not socket.waitForReadyRead(500):
                    break
                data += bytes(socket.readAll().data())
            socket.abort()
            socket.deleteLater()
            line = data.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
            self.raiseRequested.emit()  # someone launched Sapling again, whatever it said
            if line.startswith("open "):
                self.inviteReceived.emit(line[5:].strip())

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


class InviteEvents(QObject):
    """The macOS open-URL event: a clicked `sapling://` link reaches the app as a QFileOpenEvent.

    Installed on the QApplication before its event loop starts, so a link that
    launched the app is not lost; other file-open events pass through."""

    inviteOpened = Signal(str)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.FileOpen and isinstance(event, QFileOpenEvent):
            url = event.url()
            if url.scheme().lower() == INVITE_SCHEME:
                self.inviteOpened.emit(bytes(url.toEncoded().data()).decode("ascii", errors="replace"))
                return True
        return super().eventFilter(watched, event)


class QuitSignals(QObject):
    """SIGINT and SIGTERM as `received(count)`: how many have arrived so far (the first asks to quit at a safe point,
    another to quit now). `install()` from the main thread; `uninstall()` puts back what was there before."""

    received = Signal(int)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.count = 0
        self._read, self._write = socket.socketpair()
        for end in (self._read, self._write):
            end.setblocking(False)
        self._notifier = QSocketNotifier(self._read.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._drain)
        self._before: dict[int, object] = {}
        self._wakeup_before: int | None = None
        self.signals = [s for s in (signal.SIGINT, getattr(signal, "SIGTERM", None)) if s is not None]

    def install(self) -> None:
        self._wakeup_before = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        for number in self.signals:
            # A Python handler must be set for the C handler to write the wakeup byte; the work happens in _drain.
            self._before[number] = signal.signal(number, lambda *_: None)

    def uninstall(self) -> None:
        for number, handler in self._before.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
        self._before.clear()
        if self._wakeup_before is not None:
            signal.set_wakeup_fd(self._wakeup_before)
            self._wakeup_before = None
        self._notifier.setEnabled(False)
        self._read.close()
        self._write.close()

    def _drain(self) -> None:
        try:
            data = self._read.recv(256)
        except OSError:  # nothing left to read (BlockingIOError) or the socket closed
            return
        for number in data:
            if number in self.signals:
                self.count += 1
                self.received.emit(self.count)


def setup_app_logging(log_dir: Path) -> Path | None:
    """Rotating app log next to the engine's; returns its path (None when not writable)."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(log_dir / APP_LOG, maxBytes=2 << 20, backupCount=2,
                                                       encoding="utf-8")
    except OSError as exc:
        print(f"sapling: warning: cannot write logs in {log_dir}: {exc}", file=sys.stderr)
        return None
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    return log_dir / APP_LOG


def route_qt_messages() -> None:
    """Qt's own warnings go to the app log instead of the terminal."""
    from PySide6.QtCore import QMessageLogContext, QtMsgType, qInstallMessageHandler

    qt_log = logging.getLogger("qt")
    levels = {QtMsgType.QtDebugMsg: logging.DEBUG, QtMsgType.QtInfoMsg: logging.INFO,
              QtMsgType.QtWarningMsg: logging.WARNING, QtMsgType.QtCriticalMsg: logging.ERROR,
              QtMsgType.QtFatalMsg: logging.CRITICAL}

    def handler(kind: QtMsgType, context: QMessageLogContext, message: str) -> None:
        # The offscreen and minimal platforms say this about every window; it means nothing here.
        level = logging.DEBUG if "does not support" in message else levels.get(kind, logging.WARNING)
        qt_log.log(level, "%s", message)

    qInstallMessageHandler(handler)


ShowError = Callable[[str, str], None]


def install_excepthook(show: ShowError, log_file: Path | None) -> Callable[..., None]:
    """Uncaught exceptions: logged with the traceback, then `show(summary, details)`."""
    busy = [False]

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        details = "".join(traceback.format_exception(kind, value, tb))
        log.critical("uncaught exception:\n%s", details)
        if busy[0]:  # an error while showing the error: the log has it
            return
        busy[0] = True
        try:
            where = f"\n\nThe details are in {log_file}." if log_file else ""
            show(f"Sapling hit a bug: {kind.__name__}: {value}{where}\n\nTraining in the engine is not affected.",
                 details)
        finally:
            busy[0] = False

    sys.excepthook = hook
    return hook


def error_dialog(summary: str, details: str) -> None:
    from PySide6.QtWidgets import QApplication, QMessageBox

    if QApplication.instance() is None:
        print(summary, details, sep="\n", file=sys.stderr)
        return
    box = QMessageBox(QMessageBox.Icon.Critical, "Sapling: unexpected error", summary)
    box.setDetailedText(details)
    box.exec()
