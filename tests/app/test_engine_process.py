"""EngineProcess against the fake engine: events parsed, bad lines survived, commands sent, crashes seen."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from app.engine_process import EngineProcess
from tests.app.conftest import fake_command, read_commands


class Recorder:
    def __init__(self, engine: EngineProcess) -> None:
        self.events: list[dict[str, Any]] = []
        self.bad: list[str] = []
        self.stderr: list[str] = []
        self.exits: list[tuple[int, bool]] = []
        engine.eventReceived.connect(self.events.append)
        engine.badLine.connect(self.bad.append)
        engine.stderrLine.connect(self.stderr.append)
        engine.exited.connect(lambda code, asked: self.exits.append((code, asked)))


@pytest.mark.integration
def test_recorded_stream_is_parsed_and_malformed_lines_are_skipped(qtbot) -> None:  # type: ignore[no-untyped-def]
    engine = EngineProcess(lambda: fake_command())
    seen = Recorder(engine)
    with qtbot.waitSignal(engine.exited, timeout=20_000):
        engine.start()
    types = [e["type"] for e in seen.events]
    assert types[0] == "status" and types[-1] == "status"
    assert types.count("round") == 5 and types.count("eval") == 3 and types.count("peers") == 4
    assert "swarm" in types
    assert len(seen.bad) == 3 and engine.unknown_types == 1
    assert any("not JSON" in b for b in seen.bad)
    assert any("fake engine: replaying" in line for line in seen.stderr)
    assert seen.exits == [(0, False)]


@pytest.mark.integration
def test_commands_go_to_stdin_as_json_lines(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "commands.jsonl"
    engine = EngineProcess(lambda: fake_command("--hold", "--commands", str(log)))
    seen = Recorder(engine)
    engine.start()
    qtbot.waitUntil(lambda: any(e["type"] == "round" for e in seen.events), timeout=20_000)
    assert engine.send("pause") and engine.send("resume") and engine.send("reload")
    qtbot.waitUntil(lambda: len(read_commands(log)) == 3, timeout=10_000)
    with qtbot.waitSignal(engine.exited, timeout=10_000):
        engine.stop()
    assert read_commands(log) == ["pause", "resume", "reload", "stop"]
    assert seen.exits == [(0, True)]
    assert not engine.send("pause")  # nothing running: refused, not an error


@pytest.mark.integration
def test_a_crash_is_reported_with_the_last_lines(qtbot) -> None:  # type: ignore[no-untyped-def]
    engine = EngineProcess(lambda: fake_command("--crash-after", "6"))
    seen = Recorder(engine)
    with qtbot.waitSignal(engine.exited, timeout=20_000):
        engine.start()
    assert seen.exits == [(1, False)]
    tail = "\n".join(engine.tail)
    assert "RuntimeError: boom" in tail and "exited with code 1" in tail


@pytest.mark.integration
def test_a_hung_engine_is_killed_after_the_grace_period(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "deaf.py"
    script.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    engine = EngineProcess(lambda: [sys.executable, str(script)], stop_grace_ms=300)
    seen = Recorder(engine)
    engine.start()
    qtbot.waitUntil(engine.is_running, timeout=10_000)
    with qtbot.waitSignal(engine.exited, timeout=10_000):
        engine.stop()
    assert seen.exits == [(-1, True)]


@pytest.mark.integration
def test_a_missing_executable_is_an_exit_not_an_exception(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = EngineProcess(lambda: [str(tmp_path / "no-such-engine")])
    seen = Recorder(engine)
    with qtbot.waitSignal(engine.exited, timeout=10_000):
        engine.start()
    assert seen.exits == [(-1, False)]
    assert any("could not start" in line for line in seen.stderr)

