"""A `sapling-relay` that cannot start says why in one sentence, as one JSON log line, and exits 2.

    .venv/bin/python -m pytest -q tests/swarm/test_relay_start.py

Each case runs the real `sapling-relay` command (the venv's script, so the
checkout's engine through PYTHONPATH) against a real obstacle: a Redis port
nothing listens on, a port another process holds, a setting out of range, a
key folder that cannot be made.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.harness.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
RELAY = Path(sys.executable).with_name("sapling-relay")
pytestmark = pytest.mark.integration  # each test starts the relay's command


def start_failure(*args: str) -> dict[str, Any]:
    """Run `sapling-relay ARGS`; it must exit 2 with exactly one log line, a JSON object at level error."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([str(RELAY), *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and done.stdout == "", done.stderr
    record: dict[str, Any] = json.loads(lines[0])
    assert record["level"] == "error" and record["event"] == "start_failed", record
    assert record["msg"].startswith("sapling-relay cannot start: ") and record["msg"].endswith(".")
    assert record["msg"].count(". ") == 0, record["msg"]  # one sentence
    return record


def test_redis_that_does_not_answer_is_one_sentence_without_its_password(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    record = start_failure("--port", "0", "--redis", f"redis://:hunter2@127.0.0.1:{port}/3", "--data-dir",
                           str(tmp_path))
    assert f"Redis at 127.0.0.1:{port}/3 does not answer" in record["msg"] and "--redis" in record["msg"]
    assert "hunter2" not in record["msg"]


def test_a_port_in_use_is_one_sentence(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        record = start_failure("--port", str(port), "--data-dir", str(tmp_path))
    assert f"cannot listen on 127.0.0.1:{port} (address already in use)" in record["msg"]
    assert "--port" in record["msg"]


@pytest.mark.parametrize(("host", "words"), [
    ("999.1.1.1", "cannot listen on 999.1.1.1: no such address; correct --host"),
    ("192.0.2.7", "(cannot assign requested address); correct --host"),  # TEST-NET-1: on no computer
])
def test_a_host_that_is_not_this_computers_is_said_so_not_blamed_on_the_port(host: str, words: str,
                                                                              tmp_path: Path) -> None:
    record = start_failure("--host", host, "--port", "0", "--data-dir", str(tmp_path))
    assert words in record["msg"] and "--port" not in record["msg"]


@pytest.mark.parametrize(("args", "words"), [
    (["--port", "70000"], "port must be 0-65535"),
    (["--redis", "http://127.0.0.1:6379"], "redis must be a redis://"),
    (["--public-url", "https://relay.example.org/ws"], "ws:// or wss://"),
])
def test_a_bad_setting_is_one_sentence(args: list[str], words: str) -> None:
    assert words in start_failure(*args)["msg"]


def test_a_bad_config_file_is_one_sentence(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text("colour = 'green'\n")
    assert "unknown setting 'colour'" in start_failure("--config", str(config))["msg"]
    config.write_text("port = 'abc'\n")
    assert "port must be a whole number, got 'abc'" in start_failure("--config", str(config))["msg"]


def test_a_key_folder_that_cannot_be_made_is_one_sentence(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    record = start_failure("--port", "0", "--data-dir", str(blocker / "keys"))
    assert "cannot keep the relay's key in" in record["msg"] and "--data-dir" in record["msg"]
