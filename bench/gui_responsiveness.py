"""Is the window smooth while the engine talks? Start-up time, UI stalls at 100 events/s, GUI memory.

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m bench.gui_responsiveness [--seconds 20]

1. Start to window shown: a fresh Python process builds the app (app.gui.build_gui,
   as `sapling` does) and renders the window once; measured from just before
   the process is spawned to just after that first render. Median of 3.
2. Largest UI-thread stall: a 5 ms timer in the GUI thread records how late each
   tick fires (a timer-lag probe). First with an idle engine (the baseline), then
   while a stand-in engine (tests/app/fake_engine.py --synthetic) streams 100
   events/s: progress, log lines, peers, and a round every 20 events, over a
   history of 10,000 rounds so every chart draws 10,000 points.
3. Try it streaming: with the engine still streaming, the Try it tab is shown
   and asked questions back to back for `--seconds`; a stand-in chat child
   (STREAMING_CHAT below: the real `engine.gguf.chat` message format, no model)
   streams both answers of 256 tokens (the typed-question cap) at
   `--tokens-per-second` tokens per side, faster than llama.cpp writes on a
   laptop. The same probe measures the stalls.
4. GUI RSS: resident memory of this (the GUI) process at the end.

Targets (issues 4 and 15): stall < 50 ms, start to shown < 2 s, RSS < 250 MB.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_text

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

ROOT = Path(__file__).resolve().parent.parent
FAKE_ENGINE = ROOT / "tests" / "app" / "fake_engine.py"
STARTUP_CHILD = """
import sys, time
t_spawn = float(sys.argv[2])
from pathlib import Path
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from app import theme
from app.engine_flags import EngineFlags
from app.gui import build_gui
app = QApplication(sys.argv[:1])
theme.apply(app)
gui = build_gui(EngineFlags(Path(sys.argv[1])), tray_available=False)
gui.window.app_settings.first_run_done = True
gui.window.show()
def shown():
    gui.window.grab()  # the first full render of the window
    shown_at = time.time()
    gui.after_show()   # then the history: 10,000 rounds from metrics.jsonl
    gui.window.charts.refresh()
    gui.window.grab()
    import psutil
    print(shown_at - t_spawn, time.time() - t_spawn, psutil.Process().memory_info().rss)
    sys.stdout.flush()
    app.exit(0)
QTimer.singleShot(0, shown)
app.exec()
"""


# A stand-in for `engine.gguf.chat` (its JSON-lines protocol, see that module): ready at once, then for
# each ask both sides' tokens at a fixed rate for a fixed time, then both answers.
STREAMING_CHAT = """
import json, sys, time
rate, n = float(sys.argv[1]), int(sys.argv[2])
def send(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()
send({"type": "ready", "llama_cpp": True, "message": "", "specialties": ["basic_arithmetic"]})
words = "To add 17 and 25 , add the tens and then the ones : 30 plus 12 is 42 . <answer>42</answer>".split()
for line in sys.stdin:
    command = json.loads(line)
    if command.get("cmd") != "ask":
        continue
    t0 = time.perf_counter()
    for k in range(n):
        for side in ("trained", "base"):
            send({"type": "token", "id": command["id"], "side": side, "text": " " + words[k % len(words)]})
        time.sleep(max(0.0, t0 + (k + 1) / rate - time.perf_counter()))
    for side in ("trained", "base"):
        send({"type": "answer", "id": command["id"], "side": side, "text": "", "score": None, "round": 1,
              "tokens": n, "first_token_s": 0.01, "seconds": round(time.perf_counter() - t0, 3)})
"""


def write_history(home: Path, rounds: int) -> None:
    rng = random.Random(0)
    lines = []
    for r in range(1, rounds + 1):
        reward = 0.15 + 0.2 * (1 - math.exp(-r / 2000)) + rng.gauss(0, 0.07)
        lines.append(json.dumps({"kind": "round", "run": "default", "round": r, "reward_mean": reward,
                                 "swarm_reward_mean": reward + rng.gauss(0.01, 0.05),
                                 "accuracy": max(0.0, reward - 0.1),
                                 "tokens_per_second": 40 + rng.gauss(0, 4), "seconds": 20 + rng.gauss(0, 2)}))
        if r % 10 == 0:
            lines.append(json.dumps({"kind": "eval", "run": "default", "round": r, "accuracy": 0.15 + r / 100_000}))
    atomic_write_text(home / "data" / "metrics.jsonl", "\n".join(lines) + "\n")


def startup(home: Path, runs: int = 3) -> tuple[list[float], list[float], int]:
    shown, with_history, rss = [], [], 0
    for _ in range(runs):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", STARTUP_CHILD, str(home), repr(t0)], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
        if out.returncode != 0:
            raise SystemExit(f"start-up child failed:\n{out.stderr}")
        a, b, r = out.stdout.split()[-3:]
        shown.append(float(a))
        with_history.append(float(b))
        rss = int(r)
    return shown, with_history, rss


class LagProbe:
    def __init__(self, interval_ms: int = 5) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.interval = interval_ms / 1000
        self.lags: list[float] = []
        self.last = time.perf_counter()
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self.tick)

    def tick(self) -> None:
        now = time.perf_counter()
        self.lags.append(max(0.0, now - self.last - self.interval))
        self.last = now

    def run(self, seconds: float) -> list[float]:
        from PySide6.QtCore import QEventLoop, QTimer

        self.lags = []
        self.last = time.perf_counter()
        self.timer.start()
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()
        self.timer.stop()
        return self.lags


def summary(lags: list[float]) -> str:
    ordered = sorted(lags)
    p99 = ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0
    return f"largest {1000 * max(lags, default=0):6.1f} ms | p99 {1000 * p99:5.1f} ms | ticks {len(lags)}"


@dataclass
class Stalls:
    """What the UI-thread probe saw: idle, while the engine streams, and while Try it streams beside it."""

    baseline: list[float]
    streaming: list[float]
    rate: float  # engine events per second while streaming
    redraws: int
    points: list[int]  # points per line of the reward chart
    rounds: int  # rounds in the session's history
    chatting: list[float] = field(default_factory=list)
    questions: int = 0  # Try it questions asked
    answers: int = 0
    rss: int = 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to stream at 100 events/s")
    parser.add_argument("--rounds", type=int, default=10_000, help="rounds of history drawn by the charts")
    parser.add_argument("--tokens-per-second", type=float, default=200.0,
                        help="Try it phase: tokens per second per side from the stand-in chat child")
    return parser.parse_args()


def print_startup(home: Path, rounds: int) -> list[float]:
    """Start-up in child processes: to the window shown, to the history drawn, and the RSS; the shown times."""
    shown, with_history, child_rss = startup(home)
    print(f"\nstart to window shown:      median {statistics.median(shown):.2f} s, max {max(shown):.2f} s "
          f"(target < 2 s)  [{', '.join(f'{s:.2f}' for s in shown)}]")
    print(f"start to {rounds:,}-round history drawn: median {statistics.median(with_history):.2f} s "
          f"(the history loads after the window is shown)")
    print(f"GUI RSS right after start-up: {child_rss / 2**20:.0f} MB")
    return shown


def open_window(home: Path, seconds: float, rounds: int) -> Any:
    """The whole app in this process around the stand-in engine, which streams 100 events/s from round rounds+1."""
    from PySide6.QtWidgets import QApplication

    from app import theme
    from app.engine_flags import EngineFlags
    from app.guards import route_qt_messages
    from app.gui import build_gui
    from app.power import PowerPolicy

    app = QApplication.instance() or QApplication(sys.argv[:1])
    theme.apply(app)  # type: ignore[arg-type]
    route_qt_messages()
    command = [sys.executable, str(FAKE_ENGINE), "--synthetic", str(int(seconds * 100) + 1000),
               "--first-round", str(rounds + 1), "--rate", "100", "--hold"]
    gui = build_gui(EngineFlags(home), tray_available=False, command=lambda: command,
                    policy=PowerPolicy(idle_probe=lambda: None, ac_probe=lambda: True))
    gui.window.app_settings.first_run_done = True
    gui.window.resize(1280, 820)
    gui.window.show()
    gui.after_show()
    return gui


def stream(gui: Any, probe: LagProbe, seconds: float) -> Stalls:
    """The probe idle, then while the engine streams its events into the charts."""
    events = [0]
    gui.engine.eventReceived.connect(lambda _e: events.__setitem__(0, events[0] + 1))
    probe.run(1.0)  # settle: first paint of 10,000-point charts
    baseline = probe.run(5.0)
    gui.controller.start()
    probe.run(1.5)  # the stand-in engine starts
    start_events, t0 = events[0], time.perf_counter()
    streaming = probe.run(seconds)
    rate = (events[0] - start_events) / (time.perf_counter() - t0)
    return Stalls(baseline, streaming, rate, gui.window.charts.redraws,
                  [s.count() for s in gui.window.charts.reward.series], len(gui.session.history))


def chat(gui: Any, probe: LagProbe, stalls: Stalls, seconds: float, tokens_per_second: float) -> None:
    """Try it: the window's own panel, its chat child replaced by the streaming stand-in, asked back to back."""
    from PySide6.QtCore import QTimer

    from engine.gguf.chat import TYPED_MAX_TOKENS

    tryit = gui.window.tryit
    tryit.chat.command = lambda: [sys.executable, "-c", STREAMING_CHAT, str(tokens_per_second),
                                  str(TYPED_MAX_TOKENS)]
    gui.window.tabs.setCurrentWidget(tryit)
    tryit.question.setPlainText("What is 17 + 25?")
    tryit.chat.ensure_started()
    probe.run(1.5)  # the child starts and says ready

    def answered(message: dict[str, Any]) -> None:  # after the panel's own handler: ask again at once
        if message["type"] == "answer":
            stalls.answers += 1
            if message["side"] == "base":
                QTimer.singleShot(0, tryit.ask)

    tryit.chat.message.connect(answered)
    tryit.ask()
    stalls.chatting = probe.run(seconds)
    stalls.questions = tryit.ask_id
    tryit.shut_down()


def report(stalls: Stalls, shown: list[float], seconds: float, tokens_per_second: float) -> bool:
    """The stalls against the targets, printed; whether every target was met."""
    from engine.gguf.chat import TYPED_MAX_TOKENS

    base_max, stream_max = max(stalls.baseline, default=0), max(stalls.streaming, default=0)
    print(f"\nUI-thread stall, 5 ms timer-lag probe, charts over {stalls.rounds:,} rounds "
          f"(drawn as {max(stalls.points)} points per average line, {min(stalls.points)} per raw line):")
    print(f"  idle engine (baseline):  {summary(stalls.baseline)}")
    print(f"  {stalls.rate:5.1f} events/s:        {summary(stalls.streaming)}   (target: largest < 50 ms)")
    print(f"  ratio streaming/baseline, largest stall: {stream_max / base_max if base_max else float('nan'):.1f}x; "
          f"chart redraws during the run: {stalls.redraws}")
    chat_max = max(stalls.chatting, default=0)
    print(f"  Try it shown, {tokens_per_second:g} tokens/s per side streamed beside the engine's events, "
          f"{stalls.questions} questions of {TYPED_MAX_TOKENS} tokens asked back to back in {seconds:g} s "
          f"({stalls.answers} answers in):")
    print(f"                           {summary(stalls.chatting)}   (target: largest < 50 ms)")
    print(f"\nGUI process RSS after streaming: {stalls.rss / 2**20:.0f} MB (target < 250 MB)")
    ok = stream_max < 0.050 and chat_max < 0.050 and statistics.median(shown) < 2.0 and stalls.rss < 250 * 2**20
    print("\nall targets met" if ok else "\nSOME TARGETS MISSED")
    return ok


def main() -> int:
    args = parse_args()
    import psutil

    print(f"$ QT_QPA_PLATFORM=offscreen {Path(sys.executable).name} -m bench.gui_responsiveness "
          f"--seconds {args.seconds:g}")
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, shared with other work "
          "(numbers are noisy)")
    with tempfile.TemporaryDirectory(prefix="sapling-bench-") as tmp:
        home = Path(tmp) / "home"
        write_history(home, args.rounds)
        shown = print_startup(home, args.rounds)
        gui = open_window(home, args.seconds, args.rounds)
        probe = LagProbe()
        stalls = stream(gui, probe, args.seconds)
        chat(gui, probe, stalls, args.seconds, args.tokens_per_second)
        stalls.rss = psutil.Process().memory_info().rss
        gui.engine.kill()
        gui.engine.wait_for_exit(3000)
    return 0 if report(stalls, shown, args.seconds, args.tokens_per_second) else 1


if __name__ == "__main__":
    sys.exit(main())
