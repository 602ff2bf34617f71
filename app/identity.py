"""Settings ▸ Identity: this node's name and peer id, "Back up identity…" and "Restore identity…".

    panel = IdentityPanel(lambda args: node_command("identity", [*args, "--home", HOME]))
    panel.restored.connect(window.restart_after_restore)

A node's name, peer id and the credit other peers' receipts earned it belong
to its key (`identity.key` in the data folder). The panel runs `sapling-node
identity show|export|import --json` as a child process (the app never
reads keys itself: that needs the engine's crypto library), shows the
sentence the command prints when it refuses a file, and emits `restored`
after a restore so the window can restart the engine with the new key. The
commands, and what a backup file holds, are engine/swarm/identity_backup.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QProcess, Qt, Signal
from PySide6.QtWidgets import QFileDialog, QGroupBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget
from shiboken6 import isValid

from app import theme

WHAT_IT_IS = ("Your node's name, its peer id and the credit other peers gave its rollouts belong to its key. "
              "Back it up to keep them when this computer is lost or reinstalled.")
WHO_MUST_NOT_SEE_IT = ("The backup is this node's private key: whoever has it can act as this node in the swarm. "
                       "Keep it somewhere private and do not send it to anyone, not even to a swarm's operator.")


class IdentityPanel(QWidget):
    restored = Signal(str, str)  # name, peer id: the engine should restart with the restored key
    finished = Signal()  # a show, backup or restore ended (tests wait for it)

    def __init__(self, command: Callable[[list[str]], list[str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.command = command
        self.proc: QProcess | None = None
        self.name = ""
        self.peer_id = ""
        box = QGroupBox("This node in the swarm")
        form = QVBoxLayout(box)
        self.who = QLabel("Reading this node's identity…")
        self.who.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.who.setWordWrap(True)
        about = QLabel(WHAT_IT_IS)
        about.setWordWrap(True)
        warning = QLabel(WHO_MUST_NOT_SEE_IT)
        warning.setWordWrap(True)
        warning.setObjectName("muted")
        buttons = QHBoxLayout()
        self.backup_button = QPushButton("Back up identity…")
        self.restore_button = QPushButton("Restore identity…")
        self.backup_button.clicked.connect(self.choose_backup)
        self.restore_button.clicked.connect(self.choose_restore)
        buttons.addWidget(self.backup_button)
        buttons.addWidget(self.restore_button)
        buttons.addStretch(1)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        for widget in (self.who, about, warning):
            form.addWidget(widget)
        form.addLayout(buttons)
        form.addWidget(self.status)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(box)
        layout.addStretch(1)
        self._run(["show", "--json"], self._shown)

    # -- the three commands ---------------------------------------------------------------
    def _run(self, args: list[str], done: Callable[[int, dict[str, object], str], None]) -> None:
        if self.proc is not None and self.proc.state() != QProcess.ProcessState.NotRunning:
            return
        argv = self.command(args)
        proc = QProcess(self)
        self.proc = proc
        self.backup_button.setEnabled(False)
        self.restore_button.setEnabled(False)

        def ended(code: int, _status: QProcess.ExitStatus) -> None:
            if not (isValid(proc) and isValid(self)):  # the dialog closed while the child ran: Qt killed it
                return
            out = bytes(proc.readAllStandardOutput().data()).decode("utf-8", "replace").strip()
            err = bytes(proc.readAllStandardError().data()).decode("utf-8", "replace").strip()
            try:
                answer = json.loads(out.splitlines()[-1]) if code == 0 and out else {}
            except ValueError:
                answer = {}
            sentence = err.splitlines()[-1].removeprefix("sapling-node: error: ") if err else ""
            self.backup_button.setEnabled(True)
            self.restore_button.setEnabled(True)
            done(code, answer if isinstance(answer, dict) else {}, sentence)
            self.finished.emit()

        proc.finished.connect(ended)
        proc.start(argv[0], argv[1:])

    def _shown(self, code: int, answer: dict[str, object], sentence: str) -> None:
        if code == 0:
            self._set_who(str(answer.get("name", "")), str(answer.get("peer_id", "")))
        else:
            self.who.setText(sentence or "This node has no identity yet: it is made when training first starts.")

    def _set_who(self, name: str, peer_id: str) -> None:
        self.name, self.peer_id = name, peer_id
        self.who.setText(f"<b>{name}</b><br>Peer id <code>{peer_id}</code>")

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet(f"color: {theme.ERROR};" if error else "")
        self.status.setText(text)

    def back_up_to(self, path: Path) -> None:
        """Write the backup to `path` (the file dialog's choice)."""
        def done(code: int, answer: dict[str, object], sentence: str) -> None:
            if code == 0:
                self._set_who(str(answer.get("name", "")), str(answer.get("peer_id", "")))
                self._say(f"Backed up to {path}. Keep that file private.")
            else:
                self._say(sentence or f"The backup failed (exit code {code}).", error=True)

        self._run(["export", str(path), "--json"], done)

    def restore_from(self, path: Path) -> None:
        """Make the key in `path` this node's (the file dialog's choice); `restored` follows a change."""
        def done(code: int, answer: dict[str, object], sentence: str) -> None:
            if code != 0:
                self._say(sentence or f"The restore failed (exit code {code}); nothing was changed.", error=True)
                return
            name, peer_id = str(answer.get("name", "")), str(answer.get("peer_id", ""))
            self._set_who(name, peer_id)
            if not answer.get("changed"):
                self._say(f"This node already is {name}; nothing changed.")
                return
            kept = answer.get("replaced")
            self._say(f"This node is now {name}." + (f" The previous key is kept as {kept}." if kept else "")
                      + " Training restarts with it.")
            self.restored.emit(name, peer_id)

        self._run(["import", str(path), "--json"], done)

    # -- the buttons ------------------------------------------------------------------------
    def choose_backup(self) -> None:
        suggested = str(Path.home() / f"sapling-identity-{self.name or 'node'}.txt")
        path, _ = QFileDialog.getSaveFileName(self, "Back up identity", suggested,
                                              "Sapling identity (*.txt *.pem *.key)")
        if path:
            self.back_up_to(Path(path))

    def choose_restore(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Restore identity", str(Path.home()),
                                              "Sapling identity (*.txt *.pem *.key);;All files (*)")
        if path:
            self.restore_from(Path(path))
