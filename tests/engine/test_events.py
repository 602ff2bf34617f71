from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.common.errors import EventError
from engine.common.events import (
    CHAT_MESSAGE_FIELDS,
    EVENT_FIELDS,
    encode,
    make_command,
    make_event,
    node_command,
    parse_command,
    parse_event,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_event_type_round_trips() -> None:
    for type_, fields in EVENT_FIELDS.items():
        event = make_event(type_, **dict.fromkeys(fields, 1))
        parsed = parse_event(encode(event))
        assert parsed == event
        assert parsed is not None and parsed["v"] == 1 and isinstance(parsed["ts"], float)


def test_make_event_checks_required_fields() -> None:
    with pytest.raises(ValueError, match="missing"):
        make_event("round", round=1)
    with pytest.raises(ValueError, match="unknown"):
        make_event("weather", sky="blue")


def test_nan_becomes_null_so_the_line_is_json() -> None:
    line = encode(make_event("round", round=1, metrics={"loss": float("nan")}))
    assert json.loads(line)["metrics"]["loss"] is None


def test_unknown_type_is_ignored_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="engine.common.events"):
        assert parse_event('{"type": "future", "v": 2, "ts": 0}') is None
    assert "future" in caplog.text


@pytest.mark.parametrize(
    "line",
    ["", "not json", "[1,2]", '{"v": 1}', '{"type": "round", "v": 1}',
     '{"type": "round", "v": "1", "round": 1, "metrics": {}}', b"\xff\xfe"],
)
def test_malformed_event_lines_raise_event_error(line: str | bytes) -> None:
    with pytest.raises(EventError):
        parse_event(line)


def test_commands() -> None:
    for cmd in ("pause", "resume", "stop", "reload"):
        assert parse_command(encode(make_command(cmd)))["cmd"] == cmd
    with pytest.raises(EventError, match="unknown command"):
        parse_command('{"cmd": "format_disk"}')
    with pytest.raises(ValueError):
        make_command("format_disk")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_parsers_never_raise_anything_but_event_error(line: str | bytes) -> None:
    for parser in (parse_event, parse_command):
        try:
            parser(line)
        except EventError:
            pass


def test_node_command_runs_the_cli_here_and_the_node_subcommand_when_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    assert node_command("chat", ["--home", "/h"]) == [sys.executable, "-m", "engine.cli", "chat", "--home", "/h"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert node_command("export", ["--out", "x"]) == [sys.executable, "node", "export", "--out", "x"]


@pytest.mark.integration
def test_the_chat_child_starts_from_node_command_and_says_ready(tmp_path: Path) -> None:
    """`sapling-node chat` as every caller starts it: its first line is a `ready` message with its fields."""
    argv = node_command("chat", ["--home", str(tmp_path / "home"), "--budget", "1"])
    out = subprocess.run(argv, input="", capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout.splitlines()[0])
    assert first["type"] == "ready" and set(CHAT_MESSAGE_FIELDS["ready"]) <= set(first)
