"""Help ▸ Check connection: the connection doctor's steps in a dialog, ticked as they pass.

The dialog runs `sapling-node doctor --json` as a child process (QProcess), so
the window never waits on the network, and shows each step as its line
arrives: parse the address, DNS, TCP connect, TLS, websocket upgrade,
hello/welcome, a sample round trip, this node's key. A step that fails is
highlighted with the doctor's one sentence saying what to do. Every step has
its own deadline in the doctor (5 s); the dialog also stops a child that
outlives all of them.

    QT_QPA_PLATFORM=offscreen python -m app.doctor [--relay INVITE]   # the dialog alone
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable

from PySide6.QtCore import QProcess, Qt, QTimer
from PySide6.QtGui import QBrush, QCloseEvent, QColor, QFont
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.engine_process import engine_environment
from engine.common.joining import DOCTOR_STEPS

log = logging.getLogger(__name__)

STEPS = DOCTOR_STEPS  # engine/common/joining.py: the one list the doctor runs and this dialog shows
STEP_TIMEOUT_S = 5.0
MARKS = {"ok": "✓", "failed": "✗", "skipped": "–", "pending": "·", "running": "…"}


class DoctorDialog(QDialog):
    """Runs the doctor and shows its steps; `command()` gives the child's command line."""

    def __init__(self, command: Callable[[], list[str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.command = command
        self.proc: QProcess | None = None
        self.buffer = b""
        self.verdict: dict[str, object] | None = None
        self.setWindowTitle("Check connection")
        self.setWindowIcon(theme.icon())
        self.setMinimumSize(940, 400)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(18, 16, 18, 14)
        title = QLabel("Check connection")
        title.setObjectName("title")
        layout.addWidget(title)
        self.relay = QLabel("Asking the doctor which relay to check…")
        self.relay.setObjectName("muted")
        self.relay.setWordWrap(True)
        self.relay.setTextFormat(Qt.TextFormat.PlainText)
        layout.addWidget(self.relay)
        layout.addWidget(self._table(), 1)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.summary)
        layout.addLayout(self._buttons())
        self.watchdog = QTimer(self)
        self.watchdog.setSingleShot(True)
        self.watchdog.timeout.connect(self._too_long)

    def _table(self) -> QTreeWidget:
        self.table = QTreeWidget()
        self.table.setColumnCount(4)
        self.table.setHeaderLabels(["", "Step", "Time", "What was found"])
        self.table.setRootIsDecorated(False)
        self.table.setSelectionMode(QTreeWidget.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a long path keeps its start and its end
        self.table.setWordWrap(True)
        self.table.setUniformRowHeights(False)
        header = self.table.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.rows: dict[str, QTreeWidgetItem] = {}
        for step, title in STEPS:
            item = QTreeWidgetItem(["", title, "", ""])
            item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.addTopLevelItem(item)
            self.rows[step] = item
        return self.table

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addStretch(1)
        self.again = QPushButton("Check again")
        self.again.clicked.connect(self.start)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        row.addWidget(self.again)
        row.addWidget(close)
        return row

    # -- running ----------------------------------------------------------------------
    def start(self) -> None:
        self.stop()
        self.verdict = None
        self.buffer = b""
        self._reset_rows()
        self.summary.setText("Checking…")
        self.summary.setStyleSheet(f"color: {theme.MUTED};")
        self.again.setEnabled(False)
        argv = self.command()
        proc = QProcess(self)
        proc.setProcessEnvironment(engine_environment())
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.SeparateChannels)
        proc.readyReadStandardOutput.connect(self._read)
        proc.finished.connect(self._finished)
        proc.errorOccurred.connect(self._error)
        self.proc = proc
        proc.start(argv[0], argv[1:])
        self.watchdog.start(int((len(STEPS) * STEP_TIMEOUT_S + 20) * 1000))

    def stop(self) -> None:
        self.watchdog.stop()
        if self.proc is not None:
            proc, self.proc = self.proc, None
            proc.finished.disconnect(self._finished)
            proc.errorOccurred.disconnect(self._error)
            if proc.state() != QProcess.ProcessState.NotRunning:
                proc.kill()
                proc.waitForFinished(2000)
            proc.deleteLater()

    def _reset_rows(self) -> None:
        for step, item in self.rows.items():
            self._paint(item, "pending", "", "")
            item.setText(1, dict(STEPS)[step])

    def _paint(self, item: QTreeWidgetItem, status: str, ms: str, detail: str) -> None:
        colour = {"ok": theme.ACCENT, "failed": theme.ERROR}.get(status, theme.MUTED)
        item.setText(0, MARKS.get(status, "?"))
        item.setForeground(0, QBrush(QColor(colour)))
        item.setText(2, ms)
        item.setText(3, detail)
        item.setToolTip(3, detail)
        background = QBrush(QColor(theme.ERROR_SOFT)) if status == "failed" else QBrush()
        font = QFont()
        font.setBold(status == "failed")
        for column in range(4):
            item.setBackground(column, background)
            item.setFont(column, font)

    def _read(self) -> None:
        if self.proc is None:
            return
        self.buffer += bytes(self.proc.readAllStandardOutput().data())
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self._line(line)

    def _line(self, line: bytes) -> None:
        try:
            msg = json.loads(line.decode("utf-8", errors="replace"))
        except ValueError:
            log.warning("doctor: ignored a line that is not JSON: %.120r", line)
            return
        if not isinstance(msg, dict):
            return
        if "checking" in msg:
            self._reset_rows()
            self.relay.setText(f"Relay: {msg['checking']}"
                               + (" (from your settings)" if msg.get("source") == "config.toml" else ""))
        elif msg.get("step") in self.rows:
            ms = msg.get("ms")
            when = f"{ms:.0f} ms" if isinstance(ms, (int, float)) and not isinstance(ms, bool) else ""
            self._paint(self.rows[str(msg["step"])], str(msg.get("status")), when, str(msg.get("detail", "")))
            following = [s for s, _t in STEPS][[s for s, _t in STEPS].index(str(msg["step"])) + 1:]
            if msg.get("status") != "failed" and following:
                self.rows[following[0]].setText(0, MARKS["running"])
        elif msg.get("done"):
            self.verdict = msg
            ok = bool(msg.get("ok"))
            self.summary.setText(str(msg.get("message", "")))
            self.summary.setStyleSheet(f"color: {theme.ACCENT_DARK if ok else theme.ERROR}; font-weight: 600;")

    def _finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        self._read()
        if self.buffer.strip():
            self._line(self.buffer)
            self.buffer = b""
        self.watchdog.stop()
        self.again.setEnabled(True)
        if self.verdict is None:
            err = bytes(self.proc.readAllStandardError().data()).decode("utf-8", "replace").strip() if self.proc else ""
            last = err.splitlines()[-1] if err else f"exit code {code}"
            self._fail(f"The check stopped before its end ({last}).")

    def _error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.watchdog.stop()
            self.again.setEnabled(True)
            self._fail("The check could not start: the Sapling engine is missing from this installation.")

    def _too_long(self) -> None:
        self.stop()
        self.again.setEnabled(True)
        self._fail("The check took too long and was stopped.")

    def _fail(self, sentence: str) -> None:
        self.summary.setText(sentence)
        self.summary.setStyleSheet(f"color: {theme.ERROR}; font-weight: 600;")

    def closeEvent(self, event: QCloseEvent) -> None:
        self.stop()
        super().closeEvent(event)


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    from engine.common.events import node_command

    app = QApplication.instance() or QApplication(sys.argv[:1])
    if not isinstance(app, QApplication):
        return 1
    theme.apply(app)
    dialog = DoctorDialog(lambda: node_command("doctor", ["--json", *argv]))
    dialog.start()
    dialog.exec()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
