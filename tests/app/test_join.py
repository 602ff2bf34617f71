"""Joining from an invite in the real app (offscreen): the dialog filled from a real relay, Join, the swarm line.

Relays are real (in this process, on loopback); the engine that joins is the
real `sapling-node serve` on a tiny model; the second launch that hands over
the invite is a real `sapling` process; the doctor is a real `sapling-node
doctor` child of the dialog.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QCoreApplication, Qt, QUrl
from PySide6.QtGui import QColor, QFileOpenEvent

from app import doctor as app_doctor
from app import theme
from app.guards import InviteEvents, SingleInstance, instance_name
from app.join import JoinDialog
from app.settings import SettingsStore
from bench.harness.servers import free_port
from engine.common.config_file import build_config
from engine.common.paths import Paths
from engine.common.rules import Invite, parse_invite
from tests.app.conftest import MakeGui, StartRelay

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--device", "cpu", "--threads", "1", "--set", "tasks.questions_per_round=2",
        "--set", "tasks.completions_per_question=2", "--set", "tasks.max_new_tokens=8", "--set", "tasks.eval_every=0",
        "--set", "run.priority='normal'"]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.integration
def test_an_invite_opened_while_the_app_runs_joins_that_swarm(qtbot, make_gui: MakeGui, paths: Paths,  # type: ignore[no-untyped-def]
                                                              start_relay: StartRelay, tiny_model_dir: Path) -> None:
    relay = start_relay(name="Maple Street Lab", contact="ops@example.org", description="Arithmetic on weeknights.")
    gui = make_gui(settings=["--model", str(tiny_model_dir), *FAST])
    w = gui.window
    w.show()
    assert w.peers.swarm_name.text() == "Local swarm on this computer"
    guard = SingleInstance(f"sapling-test-{os.getpid()}-{time.monotonic_ns()}")
    assert guard.listen()
    guard.inviteReceived.connect(w.open_invite)
    link = Invite((relay.url,), "", "").link()
    try:
        # the second launch's side of the channel: `sapling 'sapling://join?...'` while this one runs
        assert SingleInstance(guard.name).notify_running(invite=link)
        qtbot.waitUntil(lambda: w.join_dialog is not None, timeout=5_000)
        dialog = w.join_dialog
        # Join waits for the relay's answer (on loopback it may already be in when the dialog is first seen)
        assert isinstance(dialog, JoinDialog) and (dialog.preview is not None or not dialog.join_button.isEnabled())
        qtbot.waitUntil(lambda: dialog.preview is not None, timeout=10_000)  # filled from the relay's document
        values = {key: label.text() for key, label in dialog.card.values.items()}
        assert values["swarm"] == "Maple Street Lab" and values["operator"] == "ops@example.org"
        assert values["policy"] == "Open: anyone may join" and values["online"] == "0"
        assert values["models"].startswith("The relay does not say which models")  # no --models: the strict rule
        assert values["software"].startswith("sapling-relay ") and values["software"].endswith("swarm protocol 1")
        assert dialog.card.description.text() == "Arithmetic on weeknights."
        assert "never shared" in dialog.card.sharing.text().lower() and "weights" in dialog.card.sharing.text()
        assert dialog.join_button.isEnabled()
        dialog.join_button.click()
        saved = SettingsStore(paths).load_engine()
        assert saved.swarm_mode == "relay"
        assert parse_invite(saved.relay_url) == Invite((relay.url,), "", "Maple Street Lab")
        assert build_config("default", paths.config_file).swarm.relay_url == saved.relay_url
        assert gui.engine.is_running()  # Join (re)starts training in the new swarm
        # the real engine reads what the app wrote, joins the relay, and the window says where it is
        qtbot.waitUntil(lambda: gui.session.swarm.get("connected") is True, timeout=180_000)
        assert gui.session.swarm["relay"] == relay.url and gui.session.swarm["swarm_name"] == "Maple Street Lab"
        assert "Connected: Maple Street Lab · " + relay.url in w.relay_label.text()
        assert w.peers.swarm_name.text() == "Maple Street Lab" and w.peers.relay.text() == f"Relay: {relay.url}"
        assert gui.tray.tooltip().endswith("· Maple Street Lab")
        assert relay.relay.online == 1
    finally:
        guard.close()


@pytest.mark.integration
def test_the_join_dialog_names_the_relay_that_answered_not_the_name_in_the_link(  # type: ignore[no-untyped-def]
        qtbot, start_relay: StartRelay) -> None:
    relay = start_relay(name="Someone else's relay", operator="Other people", contact="other@example.org")
    spoof = Invite((relay.url,), "", "Riverside Maths Club").link()
    dialog = JoinDialog(spoof)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.preview is not None, timeout=10_000)
    assert dialog.card.values["swarm"].text() == "Someone else's relay"
    assert dialog.card.values["operator"].text() == "Other people · other@example.org"  # as the relay says
    assert dialog.card.status.text() == f"The relay at {relay.url} answered."
    shown = " ".join(label.text() for label in dialog.card.values.values()) + dialog.card.status.text()
    assert "Riverside" not in shown
    assert dialog.preview is not None
    # what Join would save names the swarm as the relay does, so the swarm panel shows that name too
    assert parse_invite(dialog.preview.link()) == Invite((relay.url,), "", "Someone else's relay")
    dialog.cancel_button.click()


@pytest.mark.integration
def test_a_relay_that_cannot_be_joined_is_one_sentence_and_nothing_is_saved(  # type: ignore[no-untyped-def]
        qtbot, make_gui: MakeGui, paths: Paths, start_relay: StartRelay, silent_port: int) -> None:
    gui = make_gui()
    w = gui.window
    w.show()
    private = start_relay(join_token="s3cret", name="Private lab")
    cases = [
        (f"ws://127.0.0.1:{free_port()}/ws", "Nothing accepts connections at"),
        (private.url, "Private lab is private and this invite has no join token"),
        (f"ws://127.0.0.1:{silent_port}/ws", "did not answer within 5 s"),
        ("javascript:alert(1)", "not javascript:"),
        ("file:///etc/passwd", "not file:"),
        ("wss://relay.example.org/ws" + "a" * 10_000, "more than the 4096"),
        ("sapling://join?relay=wss%3A%2F%2Fr.example.org%2Fws&token=%1B%5B31m", "control characters"),
    ]
    for text, words in cases:
        started = time.monotonic()
        dialog = w.open_invite(text)
        qtbot.waitUntil(lambda d=dialog: d.retry_button.isVisible(), timeout=10_000)
        assert time.monotonic() - started < 5 + 3  # at most the fetch's deadline
        assert words in dialog.card.status.text() and dialog.card.status.text().count(". ") == 0
        assert not dialog.join_button.isEnabled()
        dialog.accept()  # Join is refused until the relay has answered
        assert dialog.isVisible()
        dialog.cancel_button.click()
        assert not dialog.isVisible()
    assert not paths.config_file.exists() and not gui.engine.is_running()


def test_a_clicked_link_on_macos_reaches_the_window(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    app = QCoreApplication.instance()
    assert app is not None
    events = InviteEvents()
    app.installEventFilter(events)
    try:
        opened: list[str] = []
        events.inviteOpened.connect(opened.append)
        events.inviteOpened.connect(gui.window.open_invite)
        link = "sapling://join?relay=wss%3A%2F%2Frelay.example.org%2Fws&name=Lab%20one"
        QCoreApplication.sendEvent(app, QFileOpenEvent(QUrl(link)))
        assert opened == [link]  # exactly as clicked: parse_invite reads the same relays
        assert parse_invite(opened[0]).relays == ("wss://relay.example.org/ws",)
        assert gui.window.join_dialog is not None
        QCoreApplication.sendEvent(app, QFileOpenEvent("/tmp/some-file.txt"))  # not an invite: ignored
        assert len(opened) == 1
        gui.window.join_dialog.reject()
    finally:
        app.removeEventFilter(events)


@pytest.mark.integration
def test_sapling_with_an_invite_hands_it_to_the_running_app(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    guard = SingleInstance(instance_name(Paths.under(home).config_dir))
    assert guard.listen()
    link = "sapling://join?relay=wss%3A%2F%2Frelay.example.org%2Fws"
    try:
        with qtbot.waitSignal(guard.inviteReceived, timeout=60_000) as received:
            proc = subprocess.Popen([sys.executable, "-m", "app.main", "--home", str(home), link], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
        out, err = proc.communicate(timeout=60)
        assert received.args == [link]
        assert proc.returncode == 0 and "the invite was sent to its window" in out, err
    finally:
        guard.close()


def test_the_app_lists_the_doctors_steps_from_the_one_list_the_engine_runs() -> None:
    from engine.common import joining
    from engine.swarm import doctor

    assert app_doctor.STEPS is joining.DOCTOR_STEPS and doctor.STEPS is joining.DOCTOR_STEPS


@pytest.mark.integration
def test_check_connection_ticks_each_step_and_highlights_the_failing_one(qtbot, make_gui: MakeGui, paths: Paths,  # type: ignore[no-untyped-def]
                                                                         start_relay: StartRelay) -> None:
    relay = start_relay(name="Doctor's relay")
    gui = make_gui()
    w = gui.window
    store = SettingsStore(paths)
    for relay_url, ok in ((Invite((relay.url,), "", "Lab").link(), True), (f"ws://127.0.0.1:{free_port()}/ws", False)):
        w.engine_settings.swarm_mode, w.engine_settings.relay_url = "relay", relay_url
        store.save_engine(w.engine_settings)
        dialog = w.open_doctor()
        qtbot.waitUntil(lambda d=dialog: d.verdict is not None, timeout=60_000)
        marks = {step: dialog.rows[step].text(0) for step, _title in app_doctor.STEPS}
        if ok:
            assert dialog.summary.text().startswith("All checks passed")
            assert marks == {**dict.fromkeys(marks, "✓"), "tls": "–"}
            assert "Doctor's relay" in dialog.rows["hello"].text(3)
        else:
            assert dialog.summary.text().startswith('Failed at "TCP connect": Nothing accepts connections')
            assert (marks["address"], marks["dns"], marks["tcp"]) == ("✓", "✓", "✗")
            failing = dialog.rows["tcp"]
            assert failing.background(3).color() == QColor(theme.ERROR_SOFT) and failing.font(3).bold()
            assert all(marks[step] == "·" for step in ("tls", "websocket", "hello", "round_trip", "key"))
        dialog.close()


def test_names_from_a_relay_or_an_invite_are_shown_as_text(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui()
    w = gui.window
    name = "<img src=x><b>Lab</b>"
    gui.session.handle({"type": "swarm", "v": 1, "ts": 0.0, "peer_id": "3f9a2c7e51b04d8e9a6c",
                        "name": "quiet-fern-3f9a",
                        "relay": "wss://relay.example.org/ws", "connected": False, "message": "<i>down</i>",
                        "swarm_name": name})
    assert "&lt;img src=x&gt;&lt;b&gt;Lab&lt;/b&gt;" in w.relay_label.text() and "<img" not in w.relay_label.text()
    assert w.peers.swarm_name.text() == name and w.peers.swarm_name.textFormat() == Qt.TextFormat.PlainText
    dialog = JoinDialog("javascript:<b>alert(1)</b>", w)
    dialog.open()
    qtbot.waitUntil(dialog.retry_button.isVisible, timeout=5_000)
    assert "not javascript:" in dialog.card.status.text()
    assert dialog.card.status.textFormat() == Qt.TextFormat.PlainText
    assert all(label.textFormat() == Qt.TextFormat.PlainText for label in dialog.card.values.values())
    dialog.reject()
