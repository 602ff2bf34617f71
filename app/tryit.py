"""Try it (ask the trained model a question, beside the base model) and Export model….

`TryItPanel` runs `sapling-node chat` (engine/gguf/chat.py) as a child process,
started when the tab is first shown so that it prepares the models before
the first question, and shows its JSON lines: a fresh question of the chosen
specialty, then both answers streaming token by token, then the verifier's
score of each. The child does the llama.cpp work and the GGUF exports, so
nothing here blocks the window or imports torch or llama_cpp. While training
runs the child gets a budget of 1 thread (`TRAINING_THREADS`), else every core.

`ExportDialog` runs `sapling-node export` as a child process with the chosen
format and shows its progress lines, then where the file went.

The messages `engine/gguf/chat.py` sends come from `engine.common.events`
(`CHAT_MESSAGE_FIELDS`), the one engine module both sides of the process
boundary import; the command lines that start `chat` and `export` come from the
window's `EngineFlags` (app/engine_flags.py).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, QProcess, Qt, QTimer, Signal
from PySide6.QtGui import QShowEvent, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.engine_process import engine_environment
from engine.common.events import CHAT_MESSAGE_FIELDS, encode
from engine.common.paths import EXPORT_MARKER
from engine.common.presets import SAPO_SPECIALTIES

log = logging.getLogger(__name__)

TRAINING_PHASES = ("starting", "training", "stopping")  # paused or waiting: training computes nothing
TRAINING_THREADS = 1
FLUSH_MS = 40  # streamed tokens reach an answer's text at most this late (25 updates a second)
EXPORT_CHOICES = (
    ("GGUF, f16 (llama.cpp, Ollama, LM Studio)", "gguf", "f16", ".gguf"),
    ("GGUF, q8_0 (half the size)", "gguf", "q8_0", ".gguf"),
    ("GGUF LoRA adapter (llama.cpp --lora)", "gguf-lora", "f16", ".gguf"),
    ("Hugging Face folder (safetensors)", "hf", "f16", ""),
)


def parse_chat_line(line: bytes) -> dict[str, Any] | None:
    """A chat message with its required fields, or None for anything else (logged)."""
    try:
        message = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError:
        log.warning("Try it: ignored a line that is not JSON: %.120r", line)
        return None
    if not isinstance(message, dict) or message.get("type") not in CHAT_MESSAGE_FIELDS:
        log.warning("Try it: ignored an unknown message: %.120r", line)
        return None
    missing = [name for name in CHAT_MESSAGE_FIELDS[message["type"]] if name not in message]
    if missing:
        log.warning("Try it: a %s message lacks %s", message["type"], ", ".join(missing))
        return None
    return message


def exit_sentence(code: int, crashed: bool) -> str:
    """Why the chat child ended, in one sentence."""
    if crashed and sys.platform != "win32":
        try:
            name = signal.Signals(code).name if code > 0 else "a signal"
        except ValueError:
            name = f"signal {code}"
        if code == signal.SIGILL:
            return ("llama.cpp stopped with an illegal instruction: this llama-cpp-python build does not suit "
                    "this processor; rebuild it portable (docs/packaging.md). Training is not affected.")
        return f"llama.cpp stopped unexpectedly ({name}). Training is not affected; ask again to restart it."
    return f"Try it stopped unexpectedly (exit code {code}). Training is not affected; ask again to restart it."


class ChatProcess(QProcess):
    """The chat child: JSON lines out as `message`, commands in with `send`."""

    message = Signal(dict)
    ended = Signal(str)  # a sentence, when it ended without being asked to

    def __init__(self, command: Callable[[], list[str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.command = command
        self._buffer = bytearray()
        self.stopping = False
        self.setProcessEnvironment(engine_environment())
        self.readyReadStandardOutput.connect(self._read)
        self.readyReadStandardError.connect(lambda: log.info("Try it: %s",
                                                             bytes(self.readAllStandardError().data()).decode("utf-8",
                                                                                                              "replace").rstrip()))
        self.finished.connect(self._finished)

    def ensure_started(self) -> None:
        if self.state() == QProcess.ProcessState.NotRunning:
            argv = self.command()
            self.stopping = False
            self._buffer.clear()
            log.info("starting Try it: %s", argv)
            self.start(argv[0], argv[1:])

    def send(self, cmd: str, **fields: Any) -> None:
        self.ensure_started()
        self.write((encode({"cmd": cmd, **fields}) + "\n").encode("utf-8"))

    def _read(self) -> None:
        self._buffer += bytes(self.readAllStandardOutput().data())
        *lines, rest = bytes(self._buffer).split(b"\n")
        self._buffer[:] = rest
        for line in lines:
            if line.strip():
                message = parse_chat_line(line)
                if message is not None:
                    self.message.emit(message)

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if not self.stopping:
            self.ended.emit(exit_sentence(code, status == QProcess.ExitStatus.CrashExit))

    def shut_down(self) -> None:
        """Close stdin (the child exits at EOF), then kill it if it lingers."""
        if self.state() == QProcess.ProcessState.NotRunning:
            return
        self.stopping = True
        self.closeWriteChannel()
        if not self.waitForFinished(3000):
            self.kill()
            self.waitForFinished(2000)


class AnswerColumn(QFrame):
    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        self.title = QLabel(title)
        self.title.setObjectName("sectionTitle")
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setObjectName("answer")
        self.score = QLabel(" ")
        self.score.setObjectName("muted")
        self.score.setWordWrap(True)
        for widget in (self.title, self.text, self.score):
            layout.addWidget(widget)
        # Tokens arrive hundreds a second; the text is laid out again on every insert, so
        # pieces wait here and go in together at most FLUSH_MS after the first of them.
        self.pending: list[str] = []
        self.flush_timer = QTimer(self)
        self.flush_timer.setSingleShot(True)
        self.flush_timer.setInterval(FLUSH_MS)
        self.flush_timer.timeout.connect(self.flush)

    def clear(self) -> None:
        self.pending.clear()
        self.flush_timer.stop()
        self.text.clear()
        self.score.setText(" ")

    def append(self, piece: str) -> None:
        self.pending.append(piece)
        if not self.flush_timer.isActive():
            self.flush_timer.start()

    def flush(self) -> None:
        self.flush_timer.stop()
        if not self.pending:
            return
        text = "".join(self.pending)
        self.pending.clear()
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        self.text.setTextCursor(cursor)


class TryItPanel(QWidget):
    """Pick a specialty or type a question; the newest checkpoint and the base model answer side by side."""

    def __init__(self, command: Callable[[], list[str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # The child gets its thread budget on its command line too: it starts exporting at once (`showEvent`).
        self.chat = ChatProcess(lambda: [*command(), "--budget", str(self.budget())], self)
        self.chat.message.connect(self.handle)
        self.chat.ended.connect(self._ended)
        app = QCoreApplication.instance()
        if app is not None:  # the child, and the export it may be running, end with the app
            app.aboutToQuit.connect(self.chat.shut_down)
        self.question_id: int | None = None
        self.question_text = ""
        self.ask_id = 0
        self.answering = False
        self.training = False
        self.llama_problem = ""
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)

        card = QFrame()
        card.setObjectName("card")
        top = QGridLayout(card)
        top.setContentsMargins(12, 10, 12, 10)
        self.specialty = QComboBox()
        for name in SAPO_SPECIALTIES:
            self.specialty.addItem(name.replace("_", " ").capitalize(), name)
        self.new_button = QPushButton("New question")
        self.new_button.clicked.connect(self.new_question)
        self.question = QPlainTextEdit()
        self.question.setPlaceholderText("Type a question, or pick a specialty and press New question.")
        self.question.setMaximumHeight(96)
        self.question.textChanged.connect(self._edited)
        self.ask_button = QPushButton("Ask")
        self.ask_button.setObjectName("primary")
        self.ask_button.clicked.connect(self.ask)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(lambda: self.chat.send("cancel"))
        self.reference = QLabel(" ")
        self.reference.setObjectName("muted")
        self.reference.setWordWrap(True)
        top.addWidget(QLabel("Specialty"), 0, 0)
        top.addWidget(self.specialty, 0, 1)
        top.addWidget(self.new_button, 0, 2)
        top.addWidget(self.question, 1, 0, 1, 3)
        buttons = QVBoxLayout()
        buttons.addWidget(self.ask_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        top.addLayout(buttons, 1, 3)
        top.addWidget(self.reference, 2, 0, 1, 4)
        top.setColumnStretch(1, 1)
        layout.addWidget(card)

        self.status = QLabel(" ")
        self.status.setObjectName("muted")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        row = QHBoxLayout()
        self.trained = AnswerColumn("Trained model (newest checkpoint)")
        self.base = AnswerColumn("Base model (before training)")
        row.addWidget(self.trained, 1)
        row.addWidget(self.base, 1)
        layout.addLayout(row, 1)

    # -- commands -------------------------------------------------------------------------
    def showEvent(self, event: QShowEvent) -> None:
        """The tab opened: start the child now, so that it prepares the models before the first question."""
        super().showEvent(event)
        self.chat.ensure_started()

    def set_training(self, training: bool) -> None:
        """While training runs, llama.cpp and exports get one thread; else every core."""
        self.training = training
        if self.chat.state() != QProcess.ProcessState.NotRunning:
            self.chat.send("threads", n=self.budget())

    def budget(self) -> int:
        return TRAINING_THREADS if self.training else max(1, os.cpu_count() or 1)

    def new_question(self) -> None:
        self.chat.send("question", specialty=self.specialty.currentData())
        self.new_button.setEnabled(False)
        self.status.setText("Drawing a question…")

    def ask(self) -> None:
        text = self.question.toPlainText().strip()
        if not text or self.answering:
            return
        if self.llama_problem:
            self.status.setText(self.llama_problem)
            return
        self.ask_id += 1
        self.answering = True
        for column in (self.trained, self.base):
            column.clear()
        self.ask_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.status.setText("Asking…")
        self.chat.send("threads", n=self.budget())
        if self.question_id is not None:
            self.chat.send("ask", id=self.ask_id, question=self.question_id)
        else:
            self.chat.send("ask", id=self.ask_id, text=text)

    def shut_down(self) -> None:
        self.chat.shut_down()

    # -- messages -------------------------------------------------------------------------
    def _edited(self) -> None:
        if self.question.toPlainText() != self.question_text:
            self.question_id = None
            self.reference.setText("Your own question: the answers are not scored.")

    def _column(self, side: object) -> AnswerColumn:
        return self.trained if side == "trained" else self.base

    def handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "ready":
            self.llama_problem = str(message["message"] or "")
            self.status.setText(self.llama_problem or " ")
        elif kind == "question":
            self.question_text = str(message["text"])
            self.question.setPlainText(self.question_text)
            self.question_id = int(message["id"])
            answer = message.get("answer")
            self.reference.setText(f"A generated {str(message['specialty']).replace('_', ' ')} question; "
                                   f"the verifier scores both answers." + (f" Expected: {answer}" if answer else ""))
            self.new_button.setEnabled(True)
            self.status.setText(self.llama_problem or " ")
        elif message.get("id") != self.ask_id and kind != "error":
            return  # a stale answer to an earlier question
        elif kind == "status":
            self.status.setText(str(message["message"]))
        elif kind == "token":
            self._column(message["side"]).append(str(message["text"]))
            if self.status.text() != "Answering…":
                self.status.setText("Answering…")
        elif kind == "answer":
            self._finish_answer(message)
        elif kind == "error":
            self.status.setText(str(message["message"]))
            self.new_button.setEnabled(True)
            self._done()

    def _finish_answer(self, message: dict[str, Any]) -> None:
        column = self._column(message["side"])
        column.flush()
        if message["side"] == "trained":
            rounds = int(message["round"] or 0)
            column.title.setText(f"Trained model (round {rounds})" if rounds
                                 else "Trained model (no checkpoint yet: the base)")
        score = message["score"]
        words = ("not scored (your own question)" if score is None else f"score {float(score):.2f}"
                 + (" ✓" if float(score) >= 1.0 else ""))
        first = message["first_token_s"]
        timing = f" · {message['tokens']} tokens" + (f", first token {float(first):.1f} s after asking"
                                                     if first is not None else "")
        column.score.setText(words.capitalize() + timing)
        if message["side"] == "base":
            self.status.setText(" ")
            self._done()

    def _done(self) -> None:
        self.answering = False
        self.ask_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    def _ended(self, sentence: str) -> None:
        self.status.setText(sentence)
        self.new_button.setEnabled(True)
        self._done()


def export_folder_in(where: Path, name: str) -> Path:
    """The folder a Hugging Face export writes when the user picks `where`: `where` itself when it is empty or an
    earlier export, else a new `name` folder inside it (an export replaces its folder whole)."""
    if where.is_dir() and (not any(where.iterdir()) or (where / EXPORT_MARKER).is_file()):
        return where
    return where / (name or "sapling-model")


class ExportDialog(QDialog):
    """Choose a format and a place; `sapling-node export` runs as a child and reports its steps."""

    exported = Signal(str)

    def __init__(self, command: Callable[[list[str]], list[str]], training: bool,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Export model")
        self.setMinimumWidth(560)
        self.command = command
        self.training = training
        self.proc: QProcess | None = None
        self.errors: list[str] = []
        layout = QVBoxLayout(self)
        intro = QLabel("Writes the newest checkpoint, merged with the base model. A GGUF file loads in llama.cpp, "
                       "Ollama and LM Studio (docs/exporting.md).")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        grid = QGridLayout()
        self.format = QComboBox()
        for label, *_rest in EXPORT_CHOICES:
            self.format.addItem(label)
        self.path = QLineEdit(str(Path.home() / "sapling-model.gguf"))
        browse = QPushButton("Choose…")
        browse.clicked.connect(self.choose)
        self.format.currentIndexChanged.connect(self._format_changed)
        grid.addWidget(QLabel("Format"), 0, 0)
        grid.addWidget(self.format, 0, 1, 1, 2)
        grid.addWidget(QLabel("Save to"), 1, 0)
        grid.addWidget(self.path, 1, 1)
        grid.addWidget(browse, 1, 2)
        layout.addLayout(grid)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1)
        self.bar.setTextVisible(False)
        self.step = QLabel(" ")
        self.step.setObjectName("muted")
        self.step.setWordWrap(True)
        self.step.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.bar)
        layout.addWidget(self.step)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        self.export_button = QPushButton("Export")
        self.export_button.setObjectName("primary")
        self.export_button.clicked.connect(self.start)
        self.close_button = QPushButton("Close")
        self.close_button.clicked.connect(self.reject)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.close_button)
        layout.addLayout(buttons)

    def choice(self) -> tuple[str, str, str, str]:
        return EXPORT_CHOICES[self.format.currentIndex()]

    def _format_changed(self) -> None:
        suffix = self.choice()[3]
        path = Path(self.path.text() or "sapling-model")
        stem = path.with_suffix("") if path.suffix == ".gguf" else path
        self.path.setText(str(stem.with_suffix(suffix)) if suffix else str(stem))

    def choose(self) -> None:
        label, fmt, _quant, suffix = self.choice()
        if fmt == "hf":
            where = QFileDialog.getExistingDirectory(self, "Choose where to put the model's folder",
                                                     str(Path(self.path.text()).parent))
            chosen = str(export_folder_in(Path(where), Path(self.path.text()).name)) if where else ""
        else:
            chosen, _ = QFileDialog.getSaveFileName(self, "Export model", self.path.text(), f"{label} (*{suffix})")
        if chosen:
            self.path.setText(chosen)

    def flags(self) -> list[str]:
        _label, fmt, quant, _suffix = self.choice()
        flags = ["--format", fmt, "--out", self.path.text().strip()]
        if fmt == "gguf":
            flags += ["--quant", quant]
        if self.training:
            flags += ["--threads", str(TRAINING_THREADS)]
        return flags

    def start(self) -> None:
        if not self.path.text().strip() or self.proc is not None:
            return
        argv = self.command(self.flags())
        self.errors = []
        proc = QProcess(self)
        proc.setProcessEnvironment(engine_environment())
        proc.readyReadStandardOutput.connect(self._stdout)
        proc.readyReadStandardError.connect(self._stderr)
        proc.finished.connect(self._finished)
        self.proc = proc
        self.bar.setRange(0, 0)
        self.export_button.setEnabled(False)
        self.close_button.setText("Cancel")
        self.step.setText("Starting the export…")
        log.info("exporting: %s", argv)
        proc.start(argv[0], argv[1:])

    def _stdout(self) -> None:
        if self.proc is None:
            return
        lines = [line.strip()
                 for line in bytes(self.proc.readAllStandardOutput().data()).decode("utf-8", "replace").splitlines()]
        lines = [line for line in lines if line]
        if lines:
            self.step.setText(lines[-1])

    def _stderr(self) -> None:
        if self.proc is None:
            return
        text = bytes(self.proc.readAllStandardError().data()).decode("utf-8", "replace")
        self.errors += [line.strip().split("\r")[-1] for line in text.splitlines() if line.strip()]
        self.errors = self.errors[-20:]

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._stdout()
        self._stderr()
        self.proc = None
        self.bar.setRange(0, 1)
        self.bar.setValue(1 if code == 0 else 0)
        self.export_button.setEnabled(True)
        self.close_button.setText("Close")
        if code == 0 and status == QProcess.ExitStatus.NormalExit:
            self.exported.emit(self.path.text().strip())
            return
        said = [line for line in self.errors if line.startswith("sapling-node: error:")]
        self.step.setText(said[-1].removeprefix("sapling-node: error: ") if said
                          else f"The export stopped (exit code {code}). The log folder has the details.")

    def reject(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.waitForFinished(3000)
            self.proc = None
        super().reject()
