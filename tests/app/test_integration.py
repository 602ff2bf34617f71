"""The real engine with a tiny model, through the whole app: `sapling --self-test` offscreen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--device", "cpu", "--threads", "1", "--set", "tasks.questions_per_round=2",
        "--set", "tasks.completions_per_question=2", "--set", "tasks.max_new_tokens=8"]


def self_test(*engine_flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "app.main", "--self-test", "--self-test-timeout", "240", "--",
                           *engine_flags], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.integration
def test_self_test_runs_one_real_round_through_the_app(tiny_model_dir: Path) -> None:
    out = self_test("--model", str(tiny_model_dir), *FAST)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sapling self-test: PASSED" in out.stdout and "round 1 on cpu" in out.stdout
    assert "training: Training from round 1." in out.stdout


@pytest.mark.integration
def test_self_test_fails_with_a_clear_message(tmp_path: Path) -> None:
    out = self_test("--model", str(tmp_path / "no-such-model"), *FAST)
    assert out.returncode == 1
    assert "sapling self-test: FAILED: Sapling cannot train with these settings" in out.stderr
    assert "does not exist" in out.stderr


@pytest.mark.integration
def test_the_engine_the_app_starts_runs_at_background_priority_and_the_window_does_not(
        qtbot, tiny_model_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from app.engine_flags import EngineFlags
    from app.gui import build_gui
    from engine.node.priority import niceness

    flags = EngineFlags(tmp_path / "home", ("--model", str(tiny_model_dir), "--set", "swarm.embedded_port=0", *FAST))
    gui = build_gui(flags, tray_available=False)
    gui.window.app_settings.first_run_done = True
    qtbot.addWidget(gui.window)
    window_nice = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        gui.controller.start()
        qtbot.waitUntil(lambda: gui.session.state != "idle", timeout=120_000)  # the engine's first status
        assert gui.engine.proc is not None
        engine_pid = int(gui.engine.proc.processId())
        # the first status comes before the engine lowers itself (launch.run_node), so wait for the OS to say it
        qtbot.waitUntil(lambda: set(niceness(engine_pid).values()) == {19}, timeout=30_000)
        assert set(niceness(os.getpid()).values()) == {window_nice}  # the window keeps its priority
    finally:
        gui.controller.restart_timer.stop()
        with qtbot.waitSignal(gui.engine.exited, timeout=30_000):
            gui.engine.kill()
        gui.controller.restart_timer.stop()  # the kill reads as a crash
