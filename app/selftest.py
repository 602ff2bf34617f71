"""`sapling --self-test`: the whole app, offscreen, for one real round; exit 0 when it worked.

It starts the window offscreen (QT_QPA_PLATFORM=offscreen) with a temporary
home folder, so the user's settings and data are never touched, runs the real
engine with ``--rounds 1`` (held-out evaluation off, to keep it short) on the
bundled model, and checks that a round event arrived, reached the reward
chart, and that the engine then exited cleanly. Flags after ``--`` go to the
engine (``-- --model DIR`` tests another model). Installers run this. It also
says whether llama.cpp (Try it, GGUF export) loads; that line is informational
and never fails the test.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def tryit_line() -> str:
    """Whether Try it can run in this build: informational, never a failure (a build may lack llama.cpp).

    It looks for the package without importing it: the app's own process never
    loads llama.cpp (tests/test_boundaries.py); the Try it tab runs it in a child.
    """
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return "Try it: unavailable (llama-cpp-python is not installed)"
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    return f"Try it: llama.cpp {version} installed"


def run_self_test(engine_flags: Sequence[str] = (), timeout_s: float = 900.0) -> int:
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    started = time.monotonic()
    try:
        from PySide6.QtCore import QTimer
        from PySide6.QtWidgets import QApplication

        from app import theme
        from app.engine_flags import EngineFlags
        from app.guards import route_qt_messages
        from app.gui import build_gui
    except ImportError as exc:
        print(f"sapling self-test: FAILED: the app cannot load Qt ({exc}).", file=sys.stderr)
        return 1

    app = QApplication.instance() or QApplication(sys.argv[:1])
    if not isinstance(app, QApplication):
        print("sapling self-test: FAILED: a non-GUI Qt application already exists.", file=sys.stderr)
        return 1
    theme.apply(app)
    route_qt_messages()
    with tempfile.TemporaryDirectory(prefix="sapling-self-test-") as tmp:
        # The embedded relay on a free port: the self-test exercises it without joining
        # (and publishing test rollouts into) a Sapling already running on this computer.
        flags = EngineFlags(Path(tmp), ("--rounds", "1", "--set", "tasks.eval_every=0", "--set",
                                        "swarm.embedded_port=0", *engine_flags))
        gui = build_gui(flags, tray_available=False, restart_delays=[3600.0])
        gui.window.app_settings.first_run_done = True
        seen: dict[str, Any] = {"round": None, "problem": None, "exit": None}

        def say(text: str) -> None:
            print(f"sapling self-test [{time.monotonic() - started:5.1f} s]: {text}", flush=True)

        def on_exit(code: int, asked: bool) -> None:
            seen["exit"] = code
            QTimer.singleShot(0, lambda: app.exit(0))

        def on_problem(problem: Any) -> None:
            seen["problem"] = problem
            QTimer.singleShot(0, lambda: app.exit(0))

        gui.session.statusChanged.connect(lambda: say(f"{gui.session.state}: {gui.session.message}"))
        gui.session.roundAdded.connect(lambda m: seen.__setitem__("round", m))
        gui.engine.exited.connect(on_exit)
        gui.controller.problem.connect(on_problem)
        gui.window.show()
        QTimer.singleShot(int(timeout_s * 1000), lambda: app.exit(0))
        say(tryit_line())
        say(f"starting the engine: {' '.join(gui.engine.command())}")
        gui.controller.start()
        app.exec()
        gui.window.charts.refresh()
        chart_points = gui.window.charts.reward.series[0].count()
        if gui.engine.is_running():
            gui.engine.kill()
            gui.engine.wait_for_exit(5000)
        gui.tray.hide()
        problem, metrics = seen["problem"], seen["round"]
        if problem is not None:
            print(f"sapling self-test: FAILED: {problem.title}: {problem.text}\n--- last engine lines ---\n"
                  f"{problem.details}", file=sys.stderr)
            return 1
        if metrics is None:
            why = f"the engine exited with code {seen['exit']}" if seen["exit"] is not None else \
                f"no round finished within {timeout_s:.0f} s"
            print(f"sapling self-test: FAILED: {why}.\n--- last engine lines ---\n" + "\n".join(gui.engine.tail),
                  file=sys.stderr)
            return 1
        if seen["exit"] != 0:
            print(f"sapling self-test: FAILED: a round finished but the engine exited with code {seen['exit']}.",
                  file=sys.stderr)
            return 1
        if chart_points < 1:
            print("sapling self-test: FAILED: the round did not reach the reward chart.", file=sys.stderr)
            return 1
    device = gui.session.device or {}
    print(f"sapling self-test: PASSED in {time.monotonic() - started:.0f} s: round {metrics.get('round')} on "
          f"{device.get('kind', '?')} ({device.get('name', '?')}), reward {metrics.get('reward_mean', 0):.3f}, "
          f"{metrics.get('tokens_per_second', 0):.1f} tok/s.")
    return 0
