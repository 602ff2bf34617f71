"""Try it and Export model…: the panel against a recorded chat stream and the real chat child, the export dialog.

The recorded stream (fixtures/tryit-stream.jsonl) is what `engine.gguf.chat` sent
for one generated question on the bundled SmolLM2-135M with a round-1
checkpoint; each line says after which command it was sent. A stand-in child
replays it and logs the commands it received.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QProcess
from PySide6.QtWidgets import QMenu

from app.tryit import (
    FLUSH_MS,
    TRAINING_THREADS,
    ExportDialog,
    TryItPanel,
    exit_sentence,
    export_folder_in,
    parse_chat_line,
)
from engine.common.events import node_command
from engine.common.paths import EXPORT_MARKER
from tests.app.conftest import MakeGui

HERE = Path(__file__).resolve().parent
STREAM = HERE / "fixtures" / "tryit-stream.jsonl"
ROOT = HERE.parents[1]

REPLAY = """
import json, sys
stream = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
log = open(sys.argv[2], "a", encoding="utf-8")

def emit(after, ask_id=None):
    for row in stream:
        if row["after"] == after:
            message = dict(row["message"])
            if ask_id is not None and "id" in message:
                message["id"] = ask_id
            print(json.dumps(message), flush=True)

emit("start")
for line in sys.stdin:
    command = json.loads(line)
    log.write(line)
    log.flush()
    if command["cmd"] in ("question", "ask"):
        emit(command["cmd"], command.get("id") if command["cmd"] == "ask" else None)
"""


def _replaying_panel(qtbot, tmp_path: Path) -> tuple[TryItPanel, Path]:  # type: ignore[no-untyped-def]
    script = tmp_path / "replay_chat.py"
    script.write_text(REPLAY)
    commands = tmp_path / "commands.jsonl"
    panel = TryItPanel(lambda: [sys.executable, str(script), str(STREAM), str(commands)])
    qtbot.addWidget(panel)
    return panel, commands


def _commands(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_the_app_keeps_chat_lines_with_their_fields_and_drops_the_rest() -> None:
    assert parse_chat_line(b'{"type": "token", "id": 1, "side": "base", "text": "4"}') is not None
    assert parse_chat_line(b'{"type": "token", "id": 1}') is None
    assert parse_chat_line(b"not json") is None
    assert parse_chat_line(b'{"type": "mystery"}') is None


@pytest.mark.integration
def test_recorded_stream_fills_the_question_both_answers_and_their_scores(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    panel, commands = _replaying_panel(qtbot, tmp_path)
    panel.specialty.setCurrentIndex(panel.specialty.findData("basic_arithmetic"))
    panel.new_question()
    qtbot.waitUntil(lambda: panel.question_id is not None, timeout=15_000)
    recorded = [json.loads(line)["message"] for line in STREAM.read_text().splitlines()]
    question = next(m for m in recorded if m["type"] == "question")
    assert panel.question.toPlainText() == question["text"]
    assert "Expected: " + str(question["answer"]) in panel.reference.text()
    panel.ask()
    assert not panel.ask_button.isEnabled() and panel.stop_button.isEnabled()
    qtbot.waitUntil(lambda: panel.ask_button.isEnabled(), timeout=15_000)
    answers = {m["side"]: m for m in recorded if m["type"] == "answer"}
    for side, column in (("trained", panel.trained), ("base", panel.base)):
        tokens = "".join(m["text"] for m in recorded if m["type"] == "token" and m["side"] == side)
        assert column.text.toPlainText() == tokens == answers[side]["text"]
        assert f"Score {answers[side]['score']:.2f}" in column.score.text()
    assert f"round {answers['trained']['round']}" in panel.trained.title.text()
    sent = _commands(commands)
    assert [c["cmd"] for c in sent] == ["question", "threads", "ask"]
    assert sent[0]["specialty"] == "basic_arithmetic" and sent[2]["question"] == question["id"]


@pytest.mark.integration
def test_streamed_tokens_reach_the_text_together_within_a_frame_and_the_answer_flushes_them(qtbot) -> None:  # type: ignore[no-untyped-def]
    panel = TryItPanel(lambda: [sys.executable, "-c", "pass"])
    qtbot.addWidget(panel)
    panel.ask_id = 1
    layouts = [0]
    panel.trained.text.document().contentsChanged.connect(lambda: layouts.__setitem__(0, layouts[0] + 1))
    pieces = [f" t{k}" for k in range(300)]
    for piece in pieces:
        panel.handle({"type": "token", "id": 1, "side": "trained", "text": piece})
    assert panel.trained.text.toPlainText() == ""  # nothing laid out per token
    qtbot.waitUntil(lambda: panel.trained.text.toPlainText() == "".join(pieces), timeout=2_000)
    assert layouts[0] == 1  # 300 tokens, one insert
    panel.handle({"type": "token", "id": 1, "side": "trained", "text": " last"})
    panel.handle({"type": "answer", "id": 1, "side": "trained", "text": "", "score": None, "round": 1, "tokens": 301,
                  "first_token_s": 0.1, "seconds": 1.0})
    assert panel.trained.text.toPlainText().endswith(" t299 last")  # at once, not a frame later
    panel.trained.clear()
    panel.handle({"type": "token", "id": 1, "side": "trained", "text": " stale"})
    panel.trained.clear()  # a new question: pieces still waiting are dropped, not written into the next answer
    qtbot.wait(2 * FLUSH_MS)
    assert panel.trained.text.toPlainText() == ""


@pytest.mark.integration
def test_a_typed_question_is_sent_as_text_and_training_gets_one_thread(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    panel, commands = _replaying_panel(qtbot, tmp_path)
    panel.set_training(True)
    panel.question.setPlainText("What is 2 + 2?")
    assert "not scored" in panel.reference.text()
    panel.ask()
    qtbot.waitUntil(lambda: panel.ask_button.isEnabled(), timeout=15_000)
    panel.set_training(False)
    qtbot.waitUntil(lambda: len(_commands(commands)) == 3, timeout=10_000)
    threads, ask, after = _commands(commands)
    assert threads == {"cmd": "threads", "n": TRAINING_THREADS}
    assert ask["text"] == "What is 2 + 2?" and "question" not in ask
    assert after["cmd"] == "threads" and after["n"] == panel.budget() >= 1


@pytest.mark.integration
def test_a_chat_child_that_dies_is_one_sentence_and_asking_restarts_it(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    panel = TryItPanel(lambda: [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    qtbot.addWidget(panel)
    panel.question.setPlainText("Hello?")
    panel.ask()
    qtbot.waitUntil(lambda: panel.ask_button.isEnabled(), timeout=15_000)
    assert "illegal instruction" in panel.status.text() and "Training is not affected" in panel.status.text()
    assert exit_sentence(int(signal.SIGSEGV), True).startswith("llama.cpp stopped unexpectedly (SIGSEGV)")


@pytest.mark.integration
def test_missing_llama_cpp_is_said_in_one_sentence_and_questions_still_work(qtbot, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The real chat child, with `import llama_cpp` made to fail the way a missing package fails."""
    _block_llama_cpp(tmp_path, monkeypatch)
    home = tmp_path / "home"
    panel = TryItPanel(lambda: node_command("chat", ["--home", str(home)]))
    qtbot.addWidget(panel)
    panel.specialty.setCurrentIndex(panel.specialty.findData("basic_arithmetic"))
    panel.new_question()
    qtbot.waitUntil(lambda: panel.question_id is not None, timeout=120_000)
    sentence = panel.status.text()
    assert sentence.startswith("Try it needs llama-cpp-python, which is not installed") and "make run" in sentence
    assert sentence.count(". ") == 0, "one sentence"
    assert " + " in panel.question.toPlainText() or " - " in panel.question.toPlainText()
    panel.ask()
    assert panel.status.text() == sentence and panel.ask_button.isEnabled()
    panel.shut_down()
    assert panel.chat.state() == QProcess.ProcessState.NotRunning


def _block_llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Children started from here fail `import llama_cpp` the way a missing package fails."""
    blocker = tmp_path / "block" / "llama_cpp"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'llama_cpp'\", "
                                         "name='llama_cpp')\n")
    monkeypatch.setenv("PYTHONPATH", str(blocker.parent))


@pytest.mark.integration
def test_window_has_the_try_it_tab_and_the_export_menu(qtbot, make_gui: MakeGui, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the tab starts the chat child at once (it prepares the models before the first question)."""
    _block_llama_cpp(tmp_path, monkeypatch)  # the child then has nothing to prepare: it only says so
    monkeypatch.setenv("SAPLING_HOME", str(tmp_path / "home"))
    gui = make_gui()
    w = gui.window
    assert [w.tabs.tabText(i) for i in range(w.tabs.count())] == ["Training", "Try it", "Your contribution"]
    actions = {a.text(): a for menu in w.menuBar().findChildren(QMenu) for a in menu.actions()}
    w.show()
    assert w.tryit.chat.state() == QProcess.ProcessState.NotRunning  # not before the tab is shown
    actions["Try it"].trigger()
    assert w.tabs.currentWidget() is w.tryit
    qtbot.waitUntil(lambda: w.tryit.llama_problem != "", timeout=120_000)  # its `ready` line came back
    assert w.tryit.llama_problem.startswith("Try it needs llama-cpp-python")
    w.tryit.shut_down()
    assert "Export model…" in actions


@pytest.mark.integration
def test_export_dialog_runs_the_command_shows_its_steps_and_where_the_file_went(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "model.gguf"
    seen: list[list[str]] = []
    ok = ("import sys, time; print('Converting to GGUF (f16)…', flush=True); time.sleep(0.3); "
          "open(sys.argv[sys.argv.index('--out') + 1], 'w').write('gguf')")

    def command(flags: list[str]) -> list[str]:
        seen.append(flags)
        return [sys.executable, "-c", ok, *flags]

    dialog = ExportDialog(command, training=True)
    qtbot.addWidget(dialog)
    dialog.path.setText(str(out))
    with qtbot.waitSignal(dialog.exported, timeout=15_000) as signal_:
        dialog.start()
        assert not dialog.export_button.isEnabled() and dialog.close_button.text() == "Cancel"
    assert signal_.args == [str(out)] and out.read_text() == "gguf"
    assert seen == [["--format", "gguf", "--out", str(out), "--quant", "f16", "--threads", "1"]]
    assert dialog.step.text() == "Converting to GGUF (f16)…" and dialog.export_button.isEnabled()
    dialog.format.setCurrentIndex(3)
    assert dialog.path.text() == str(tmp_path / "model")


def test_choosing_a_folder_for_a_hugging_face_export_never_means_replacing_it(qtbot, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An export replaces its folder whole, so a picked folder that holds the user's files gets a new one inside."""
    documents = tmp_path / "Documents"
    documents.mkdir()
    (documents / "thesis.odt").write_text("years of work")
    empty = tmp_path / "empty"
    empty.mkdir()
    earlier = tmp_path / "earlier-export"
    earlier.mkdir()
    (earlier / EXPORT_MARKER).write_text("{}")
    dialog = ExportDialog(lambda flags: [], training=False)
    qtbot.addWidget(dialog)
    dialog.format.setCurrentIndex(3)  # Hugging Face folder
    assert dialog.path.text().endswith("sapling-model")
    for picked, expected in ((documents, documents / "sapling-model"), (empty, empty), (earlier, earlier)):
        monkeypatch.setattr("app.tryit.QFileDialog.getExistingDirectory", lambda *a, p=picked: str(p))
        dialog.path.setText(str(tmp_path / "sapling-model"))
        dialog.choose()
        assert dialog.path.text() == str(expected)
    assert export_folder_in(documents, "") == documents / "sapling-model"
    monkeypatch.setattr("app.tryit.QFileDialog.getExistingDirectory", lambda *a: "")  # cancelled: unchanged
    dialog.choose()
    assert dialog.path.text() == str(earlier)


@pytest.mark.integration
def test_export_dialog_shows_the_engines_sentence_when_it_fails(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fail = ("import sys; print('sapling-node: error: Run \\'default\\' has no checkpoint yet.', file=sys.stderr); "
            "sys.exit(4)")
    dialog = ExportDialog(lambda flags: [sys.executable, "-c", fail], training=False)
    qtbot.addWidget(dialog)
    dialog.start()
    qtbot.waitUntil(lambda: dialog.proc is None, timeout=15_000)
    assert dialog.step.text() == "Run 'default' has no checkpoint yet."
