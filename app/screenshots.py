"""`make screenshots`: PNGs of the app for docs/screenshots/, taken with QWidget.grab() in a real window.

    .venv/bin/python -m app.screenshots docs/screenshots
    .venv/bin/python -m app.screenshots docs/screenshots join-dialog.png doctor.png
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.screenshots docs/screenshots    # offscreen, as before

Where Xvfb and openbox are installed (`make test-deps` installs them), the
pictures are taken in a real X server of 1600x1000 with a window manager, which
sizes and decorates windows as a desktop does (tests/app/test_clipping.py
found labels clipped there that looked whole offscreen); elsewhere, or with
QT_QPA_PLATFORM set, on that platform (offscreen when unset).

Writes main-idle.png (first start, nothing trained yet), main-training.png (a
run in progress), first-run.png, settings.png, settings-protection.png,
main-crashed.png, join-dialog.png, doctor.png and contribution.png (the
"Your contribution" card; or only the names given after the folder). The window's data
is recorded, not live: the history is tests/app/fixtures/history.jsonl (a real
40-round CPU run of the bundled model) with a second real run's rewards shown
as the swarm's; the swarm identity and peer counts are illustrative. A stand-in
engine prints the recorded events, so no training runs here. The join dialog
and the doctor are live: a real `sapling-relay` process on loopback with three
real nodes connected, and a real `sapling-node doctor` run against it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer
from PySide6.QtWidgets import QApplication, QDialog, QWidget

from app import theme
from app.dialogs import SettingsDialog
from app.engine_flags import EngineFlags
from app.guards import route_qt_messages
from app.gui import Gui, build_gui
from app.power import PowerPolicy
from engine.common.paths import Paths
from engine.common.rules import Invite

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "app" / "fixtures"
SIZE = (1280, 820)
X_SCREEN = "1600x1000"  # the virtual screen: the main window at SIZE and the dialogs fit on it
DEVICE = {"kind": "cpu", "name": "Intel(R) Xeon(R) Processor (2 threads)", "memory_bytes": 25 << 30, "bf16": True,
          "reason": "no CUDA device: CPU"}


def wait(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_until(condition: object, timeout_ms: int = 20_000) -> None:
    deadline = time.monotonic() + timeout_ms / 1000
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.02)


def save(widget: QWidget, out: Path, name: str) -> None:
    # The offscreen screen is 800x600 and squeezes dialogs to it; real screens give them their size.
    if isinstance(widget, QDialog):
        widget.resize(widget.sizeHint().expandedTo(widget.size()))
    wait(400)
    path = out / name
    if not widget.grab().save(str(path)):
        raise SystemExit(f"screenshots: could not write {path}")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({widget.width()}x{widget.height()})")


def history(home: Path) -> None:
    """The real run, with the second real run's rewards as the swarm's."""
    peer = {r["round"]: r["reward_mean"] for r in map(json.loads, (FIXTURES / "history-peer.jsonl").open())
            if r.get("kind") == "round"}
    lines = []
    for line in (FIXTURES / "history.jsonl").open():
        record = json.loads(line)
        if record.get("kind") == "round":
            record["swarm_reward_mean"] = peer.get(record["round"])
        lines.append(json.dumps(record))
    data = home / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def event(type_: str, **fields: object) -> str:
    return json.dumps({"type": type_, "v": 1, "ts": time.time(), **fields})


def training_stream(path: Path) -> list[str]:
    def status(state: str, message: str) -> str:
        return event("status", state=state, message=message, device=DEVICE, model="bundled", run="default", round=40)

    lines = [
        status("starting", "Engine started."),
        event("log", level="info", logger="engine.swarm.client",
              message="joined the swarm at ws://127.0.0.1:8765/ws as quiet-fern-3f9a (4 peers online)"),
        event("swarm", peer_id="3f9a2c7e51b04d8e9a6c", name="quiet-fern-3f9a", relay="embedded", connected=True,
              message="Connected to the swarm (4 peers online)."),
        status("loading", "Resumed from round 40."),
        event("checkpoint", round=40, path="~/.local/share/sapling/checkpoints/default/round-000040"),
        status("training", "Training from round 41."),
        event("peers", online=4, received=312, accepted=229, rejected=83,
              rejected_by_reason={"zero_advantage": 61, "duplicate": 14, "too_long": 6, "question_mismatch": 2},
              by_peer={"a41c9e0b7d2f4e6a8b1c": {"name": "brave-otter-a41c", "accepted": 97, "rejected": 31},
                       "5be07d19c3a84f2e9d6b": {"name": "mossy-oak-5be0", "accepted": 81, "rejected": 29},
                       "c9d2e8f1a0b34c5d6e7f": {"name": "tidy-heron-c9d2", "accepted": 51, "rejected": 23}}),
        event("log", level="info", logger="engine.swarm.exchange",
              message="round 40: 4 external groups from 3 peers, 9 rejected"),
        event("log", level="info", logger="engine.node.loop", message="Training from round 41."),
        event("progress", phase="generating", done=58, total=96, round=41),
        contribution_event(),
    ]
    path.write_text("\n".join(lines) + "\n")
    return [sys.executable, "-c", "import sys, time; sys.stdout.write(open(sys.argv[1]).read()); sys.stdout.flush(); "
            "time.sleep(3600)", str(path)]


def contribution_event() -> str:
    """Illustrative credit: used by 7 peers today, a two-day history that pauses at night."""
    now = time.time()
    points, used = [], 892.0
    for step in range(288):
        at = now - (287 - step) * 600
        hour = time.localtime(at).tm_hour
        used += 0.0 if 1 <= hour < 7 else 1.1 + (step % 5) * 0.2
        points.append([round(at, 1), round(used), 31.0, 7.0])
    day = {"shared": 418, "sampled": 396, "used": 312, "positive": 604, "not_picked": 61, "peers": 7,
           "rejected": {"zero_advantage": 14, "duplicate": 6, "implausible": 3}}
    total = {**day, "shared": 1630, "sampled": 1502, "used": int(used), "positive": 2311, "peers": 9,
             "rejected": {"zero_advantage": 21, "duplicate": 7, "implausible": 3}}
    return event("contribution", peer_id="3f9a2c7e51b04d8e9a6c", message="Your rollouts were used by 7 peers today "
                 "(312 rollouts).", warning=None, at=now, swarm="embedded", history=points,
                 credit={"peer": "3f9a2c7e51b04d8e9a6c", "name": "quiet-fern-3f9a", "hour": day, "day": day,
                         "all": total})


def make(home: Path, command: list[str] | None = None) -> Gui:
    policy = PowerPolicy(idle_probe=lambda: None, ac_probe=lambda: True)
    gui = build_gui(EngineFlags(home), tray_available=False, command=(lambda: list(command)) if command else None,
                    policy=policy)
    gui.window.app_settings.first_run_done = True
    gui.window.resize(*SIZE)
    gui.window.header.guessed_device = {"kind": "cpu", "name": DEVICE["name"]}
    gui.window.refresh_identity()
    gui.window.show()
    gui.after_show()
    return gui


# Run in child processes: the app itself never imports the relay, the swarm client or cryptography.
PEERS = """
import sys, time
from engine.swarm.client import SwarmClient
from engine.swarm.identity import Identity
clients = [SwarmClient(sys.argv[1], Identity.generate()) for _ in range(int(sys.argv[2]))]
for client in clients:
    client.start()
time.sleep(3600)
"""
MAKE_KEY = "import sys; from engine.swarm.identity import Identity; Identity.load_or_create(sys.argv[1])"
RELAY_NAME = "Maple Street Lab"


@contextmanager
def live_relay(peers: int = 3) -> Iterator[str]:
    """A real sapling-relay process on a free loopback port with `peers` real nodes connected: its ws:// URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a swarm of the bundled model, as an organiser would declare it:
    #   sapling-relay --models "$(python -m engine.models.label)"
    label = subprocess.run([sys.executable, "-m", "engine.models.label"], capture_output=True, text=True,
                           cwd=ROOT, check=True).stdout.strip()
    relay = subprocess.Popen([sys.executable, "-m", "engine.relay", "--host", "127.0.0.1", "--port", str(port),
                              "--name", RELAY_NAME, "--contact", "lab-swarm@maplestreet.example", "--models", label,
                              "--description", "Evening arithmetic and calendar puzzles for the Maple Street "
                              "maths club. Be kind to the relay: one node per computer.",
                              "--log-level", "error"], cwd=ROOT)
    url = f"ws://127.0.0.1:{port}/ws"
    nodes = None
    try:
        wait_until(lambda: _listening(port))
        nodes = subprocess.Popen([sys.executable, "-c", PEERS, url, str(peers)], cwd=ROOT)
        wait(2500)  # the nodes' handshakes
        yield url
    finally:
        for proc in (nodes, relay):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=20)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def join_and_doctor(home: Path, out: Path, names: set[str]) -> None:
    """join-dialog.png (an invite to the live relay) and doctor.png (Help ▸ Check connection on it)."""
    with live_relay() as url:
        gui = make(home)
        subprocess.run([sys.executable, "-c", MAKE_KEY, str(Paths.under(home).identity_file)], cwd=ROOT, check=True)
        link = Invite((url,), "", "").link()
        if "join-dialog.png" in names:
            dialog = gui.window.open_invite(link)
            wait_until(lambda: dialog.preview is not None)
            save(dialog, out, "join-dialog.png")
            dialog.reject()
        if "doctor.png" in names:
            gui.window.engine_settings = gui.window.engine_settings.replace(swarm_mode="relay",
                                                 relay_url=Invite((url,), "", RELAY_NAME).link())
            gui.store.save_engine(gui.window.engine_settings)
            doctor = gui.window.open_doctor()
            wait_until(lambda: doctor.verdict is not None, 60_000)
            save(doctor, out, "doctor.png")
            doctor.close()
        close(gui)


def close(gui: Gui) -> None:
    gui.engine.kill()
    gui.engine.wait_for_exit(3000)
    gui.window.quitting = True
    gui.window.close()


@contextmanager
def virtual_display(size: str = X_SCREEN) -> Iterator[str | None]:
    """A real X server (Xvfb) of `size` with a window manager (openbox) running in it: its DISPLAY, or None where
    Xvfb or openbox is not installed or the server did not come up. Both are stopped afterwards."""
    if not (shutil.which("Xvfb") and shutil.which("openbox")):
        yield None
        return
    number = next(n for n in range(90, 190) if not Path(f"/tmp/.X11-unix/X{n}").exists()
                  and not Path(f"/tmp/.X{n}-lock").exists())
    display = f":{number}"
    server = subprocess.Popen(["Xvfb", display, "-screen", "0", f"{size}x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manager = None
    try:
        deadline = time.monotonic() + 20
        while not Path(f"/tmp/.X11-unix/X{number}").exists():
            if server.poll() is not None or time.monotonic() > deadline:
                yield None
                return
            time.sleep(0.1)
        manager = subprocess.Popen(["openbox"], env={**os.environ, "DISPLAY": display},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield display
    finally:
        for process in (manager, server):
            if process is not None:
                process.terminate()
                process.wait(10)


def in_a_real_window(argv: list[str]) -> int | None:
    """Run these screenshots again in a child under Xvfb and openbox, when the platform is not set and both are
    installed: the child's exit code; None to take them in this process."""
    if os.environ.get("QT_QPA_PLATFORM"):
        return None
    with virtual_display() as display:
        if display is not None:
            print(f"screenshots: in a real X server ({X_SCREEN}, openbox) on {display}")
            env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}
            return subprocess.run([sys.executable, "-m", "app.screenshots", *argv], cwd=ROOT, env=env).returncode
    print("screenshots: offscreen (install Xvfb and openbox for a real window)")
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    return None


ALL = ("main-idle.png", "first-run.png", "settings.png", "settings-protection.png", "main-training.png",
       "main-crashed.png", "join-dialog.png", "doctor.png", "contribution.png")


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else ROOT / "docs" / "screenshots").resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = set(argv[1:]) or set(ALL)
    if names - set(ALL):
        print(f"screenshots: unknown names {sorted(names - set(ALL))}; known: {', '.join(ALL)}", file=sys.stderr)
        return 2
    code = in_a_real_window(argv)
    if code is not None:
        return code
    app = QApplication.instance() or QApplication(sys.argv[:1])
    if not isinstance(app, QApplication):
        return 1
    theme.apply(app)
    app.setWindowIcon(theme.icon())
    route_qt_messages()
    with tempfile.TemporaryDirectory(prefix="sapling-shots-") as tmp:
        root = Path(tmp)
        if names & {"join-dialog.png", "doctor.png"}:
            join_and_doctor(root / "join", out, names)
        if not names - {"join-dialog.png", "doctor.png"}:
            return 0

        def shot(widget: QWidget, folder: Path, name: str) -> None:
            if name in names:
                save(widget, folder, name)

        idle = make(root / "idle")
        shot(idle.window, out, "main-idle.png")
        idle.window.app_settings.first_run_done = False
        idle.window.open_first_run()
        assert idle.window.dialog is not None
        shot(idle.window.dialog, out, "first-run.png")
        idle.window.dialog.reject()
        idle.window.open_settings()
        assert isinstance(idle.window.dialog, SettingsDialog)
        idle.window.dialog.form.resources.scheduled.setChecked(True)  # "Train only between 22:00 and 07:00"
        shot(idle.window.dialog, out, "settings.png")
        dialog = idle.window.dialog
        if isinstance(dialog, SettingsDialog):
            dialog.tabs.setCurrentIndex(1)
            shot(dialog, out, "settings-protection.png")
        idle.window.dialog.reject()
        close(idle)

        history(root / "train")
        train = make(root / "train", training_stream(root / "stream.jsonl"))
        train.controller.start()
        wait_until(lambda: train.session.progress.get("done") == 58)
        train.window.charts.refresh()
        shot(train.window, out, "main-training.png")
        wait_until(lambda: bool(train.window.contribution.credit))
        train.window.tabs.setCurrentWidget(train.window.contribution)
        shot(train.window.tabs, out, "contribution.png")
        train.window.tabs.setCurrentIndex(0)
        train.engine.kill()
        wait_until(lambda: train.window.problem_dialog.isVisible())
        train.window.problem_dialog.close()
        shot(train.window, out, "main-crashed.png")
        train.controller.restart_timer.stop()
        close(train)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
