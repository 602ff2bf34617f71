"""`sapling` entry point: the node subcommand, flags, and what the join dialog loads.

Which engine modules app/ may import is one test: tests/test_boundaries.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import app.main as app_main

ROOT = Path(__file__).resolve().parents[2]


def test_node_subcommand_is_the_headless_node(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.cli

    calls: list[list[str]] = []
    monkeypatch.setattr(engine.cli, "main", lambda argv: calls.append(list(argv)) or 7)
    assert app_main.main(["node", "serve", "--rounds", "1"]) == 7
    assert calls == [["serve", "--rounds", "1"]]


def test_flags_after_double_dash_go_to_the_self_test_engine() -> None:
    options, engine_flags = app_main.parse_args(["--self-test", "--", "--model", "/m", "--rounds", "2"])
    assert options.self_test and engine_flags == ["--model", "/m", "--rounds", "2"]
    assert app_main.main(["--", "--model", "x"]) == 2


def test_self_test_says_whether_try_it_can_run_without_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata
    import importlib.util

    from app.selftest import tryit_line

    loaded = "llama_cpp" in sys.modules
    if importlib.util.find_spec("llama_cpp") is not None:
        assert tryit_line() == f"Try it: llama.cpp {importlib.metadata.version('llama_cpp_python')} installed"
    assert ("llama_cpp" in sys.modules) == loaded  # looked for, never imported into the app's process
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert tryit_line() == "Try it: unavailable (llama-cpp-python is not installed)"


@pytest.mark.integration
def test_node_subcommand_runs_without_qt(tmp_path: Path) -> None:
    code = ("import sys, app.main; rc = app.main.main(['node', 'config', '--home', sys.argv[1]]); "
            "assert 'PySide6' not in sys.modules, 'node must not load Qt'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[swarm]" in out.stdout and 'mode = "embedded"' in out.stdout


@pytest.mark.integration
def test_a_home_that_is_a_file_is_one_sentence_for_the_app_and_the_node(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    for argv in (["--home", str(afile)], ["node", "identity", "show", "--home", str(afile / "sub")],
                 ["node", "run", "--home", str(afile)]):
        out = subprocess.run([sys.executable, "-c", "import sys, app.main; sys.exit(app.main.main(sys.argv[1:]))",
                              *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        assert out.returncode == 2, out.stderr
        assert f"{afile} is a file, so the folder" in out.stderr and "Traceback" not in out.stderr
    assert afile.read_text() == "mine"


@pytest.mark.integration
def test_the_join_dialog_loads_no_network_or_crypto_library() -> None:
    """engine.common.joining (the relay information fetcher the app imports) is standard library only."""
    code = ("import sys, app.join, app.doctor, engine.common.joining, engine.common.model_policy; "
            "print(','.join(m for m in ('aiohttp', 'cryptography', 'redis', 'torch') if m in sys.modules))")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


@pytest.mark.integration
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("number", [2, 15])  # SIGINT (Ctrl+C in the terminal of `make run`), SIGTERM (a logout)
def test_a_quit_signal_closes_the_app_without_a_traceback(tmp_path: Path, number: int) -> None:
    """Before, Ctrl+C raised KeyboardInterrupt inside the next Qt callback: a traceback, and the app kept running."""
    import signal
    import time

    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.Popen([sys.executable, "-m", "app.main", "--home", str(tmp_path)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        logs = tmp_path / "logs" / "sapling-app.log"
        while not (logs.exists() and "started (pid" in logs.read_text(encoding="utf-8")):
            assert proc.poll() is None and time.monotonic() < deadline, "the app did not start"
            time.sleep(0.2)
        proc.send_signal(signal.Signals(number))
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "Sapling: quitting." in err  # a first launch waits for Start: no training to stop
    assert "quit signal" in logs.read_text(encoding="utf-8")
