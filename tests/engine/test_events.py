from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EventError
from engine.events import EVENT_FIELDS, encode, make_command, make_event, parse_command, parse_event


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
    with caplog.at_level(logging.INFO, logger="engine.events"):
        assert parse_event('{"type": "future", "v": 2, "ts": 0}') is None
    assert "future" in caplog.text


@pytest.mark.parametrize(
    "line",
    ["", "not json", "[1,2]", '{"v": 1}', '{"type": "round", "v": 1}', '{"type": "round", "v": "1", "round": 1, "metrics": {}}', b"\xff\xfe"],
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
