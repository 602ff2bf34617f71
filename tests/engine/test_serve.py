"""`sapling-node serve` and `run` as real child processes on a tiny model."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.common.events import encode, make_command, parse_event

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "--set", "tasks.questions_per_round=2", "--set", "tasks.completions_per_question=2",
    "--set", "tasks.max_new_tokens=8", "--set", "tasks.eval_every=0", "--device", "cpu", "--threads", "1",
    "--set", "swarm.embedded_port=0",
    # These tests time the engine's answers, not its manners: at nice 19 on a busy machine a round can
    # take minutes. The background priority is read back from the OS in tests/app/test_integration.py.
    "--set", "run.priority='normal'",
]


def node_cmd(sub: str, home: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", sub, "--home", str(home), "--model", str(model), *FAST, *extra]


class Engine:
    """A serve child whose stdout lines are parsed on a thread; every line must be an event."""

    def __init__(self, cmd: list[str], stderr: Path) -> None:
        self.stderr = open(stderr, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.bad_lines: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = parse_event(line)
            except Exception:  # noqa: BLE001 - collected and asserted on
                self.bad_lines.append(line)
                continue
            if event is not None:
                self.events.put(event)

    def send(self, cmd: str | bytes) -> None:
        assert self.proc.stdin is not None
        data = cmd if isinstance(cmd, bytes) else (encode(make_command(cmd)) + "\n").encode()
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait_for(self, pred: Any, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.events.empty():
                    break
                continue
            if pred(event):
                return event
        raise AssertionError(f"event not seen; stderr:\n{Path(self.stderr.name).read_text()[-3000:]}")

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=120)
        finally:
            self.stderr.close()


def status(state: str, text: str = "") -> Any:
    return lambda e: e["type"] == "status" and e["state"] == state and text in e["message"]


@pytest.mark.integration
def test_serve_commands(tiny_model_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    engine = Engine(node_cmd("serve", home, tiny_model_dir), tmp_path / "stderr.txt")
    first = engine.wait_for(lambda e: True)
    assert first["type"] == "status" and first["state"] == "starting"
    engine.wait_for(lambda e: e["type"] == "round")

    engine.send("pause")
    paused = engine.wait_for(status("paused"))
    assert paused["device"]["kind"] == "cpu" and paused["device"]["reason"]
    # A marker that has crossed the engine while it is paused: a bad line, answered by a warning.
    engine.send(b"this is not json\n")
    seen: list[dict[str, Any]] = []
    warning = engine.wait_for(lambda e: seen.append(e) or (e["type"] == "log" and "bad command" in e["message"]))
    assert warning["level"] == "warning"
    engine.send("resume")
    engine.wait_for(lambda e: seen.append(e) or (e["type"] == "status" and e["state"] == "training"))
    assert all(e["type"] != "round" for e in seen), "trained while paused"
    resumed_round = engine.wait_for(lambda e: e["type"] == "round")
    assert resumed_round["round"] == paused["round"] + 1

    config = home / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("[grpo]\nlearning_rate = 1e-5\n")
    engine.send("reload")
    engine.wait_for(lambda e: e["type"] == "status" and "reloaded" in e["message"])

    engine.send("stop")
    stopped = engine.wait_for(status("stopped"))
    assert engine.close() == 0
    assert not engine.bad_lines, engine.bad_lines[:3]
    ckpt = home / "data" / "checkpoints" / "default" / f"round-{stopped['round']:06d}"
    assert (ckpt / "state.json").is_file()


@pytest.mark.integration
def test_serve_stops_when_stdin_closes(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = Engine(node_cmd("serve", tmp_path / "home", tiny_model_dir), tmp_path / "stderr.txt")
    engine.wait_for(lambda e: e["type"] == "round")
    assert engine.proc.stdin is not None
    engine.proc.stdin.close()
    engine.wait_for(status("stopped"))
    assert engine.close() == 0


@pytest.mark.integration
def test_serve_reports_a_fatal_user_error(tmp_path: Path) -> None:
    engine = Engine(node_cmd("serve", tmp_path / "home", tmp_path / "no-such-model"), tmp_path / "stderr.txt")
    error = engine.wait_for(lambda e: e["type"] == "error")
    assert error["fatal"] is True and error["kind"] == "ModelError"
    assert "does not exist" in error["message"]
    assert engine.close() == 3


@pytest.mark.integration
def test_reload_with_a_bad_file_is_not_fatal(tiny_model_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    engine = Engine(node_cmd("serve", home, tiny_model_dir), tmp_path / "stderr.txt")
    engine.wait_for(lambda e: e["type"] == "round")
    config = home / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("[grpo]\nlearning_rate = -5\n")
    engine.send("reload")
    error = engine.wait_for(lambda e: e["type"] == "error")
    assert error["fatal"] is False and "grpo.learning_rate" in error["message"]
    engine.wait_for(lambda e: e["type"] == "round")  # still training
    engine.send("stop")
    assert engine.close() == 0


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--set", "grpo.learning_rate=-1"], 2, "grpo.learning_rate"),
        (["--device", "tpu"], 2, "run.device"),
        (["--device", "cuda"], 2, "CUDA"),
        (["--set", "run.run_name='a/b'"], 2, "run.run_name"),
        (["--config", "/no/such/config.toml"], 2, "does not exist"),
    ],
)
def test_run_rejects_bad_input_with_one_sentence(tiny_model_dir: Path, tmp_path: Path, args: list[str], code: int,
                                                 needle: str) -> None:
    out = subprocess.run(
        node_cmd("run", tmp_path / "home", tiny_model_dir, *args), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == code, out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.integration
def test_run_survives_kill_9_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ckpts = home / "data" / "checkpoints" / "default"
    proc = subprocess.Popen(node_cmd("run", home, tiny_model_dir, "--rounds", "1000"), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (ckpts / "round-000003").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = max(int(p.name.split("-")[1]) for p in ckpts.glob("round-*"))
    assert done >= 3
    out = subprocess.run(node_cmd("run", home, tiny_model_dir, "--rounds", str(done + 2)), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"Resumed from round {done}" in out.stderr
    assert f"round {done + 1:>4} |" in out.stdout and f"round {done + 2:>4} |" in out.stdout
    records = [json.loads(line) for line in (home / "data" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rounds = [r["round"] for r in records if r["kind"] == "round"]
    assert rounds == list(range(1, done + 3))  # each round exactly once, none lost


@pytest.mark.integration
def test_first_ctrl_c_stops_gracefully(tiny_model_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = subprocess.Popen(node_cmd("run", home, tiny_model_dir, "--rounds", "1000"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpts = home / "data" / "checkpoints" / "default"
    deadline = time.monotonic() + 120
    while not (ckpts / "round-000001").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Stopping at the next safe point" in err and "Traceback" not in err
    assert "[stopped]" in err


def _node_after_round_one(home: Path, tiny_model_dir: Path, command: str = "run") -> subprocess.Popen[str]:
    proc = subprocess.Popen(node_cmd(command, home, tiny_model_dir, "--rounds", "1000"), cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpts = home / "data" / "checkpoints" / "default"
    deadline = time.monotonic() + 120
    while not (ckpts / "round-000001").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


@pytest.mark.integration
@pytest.mark.parametrize("command", ["run", "serve"])
def test_sigterm_stops_cleanly_with_exit_0(tiny_model_dir: Path, tmp_path: Path, command: str) -> None:
    proc = _node_after_round_one(tmp_path / "home", tiny_model_dir, command)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    if command == "run":
        assert "[stopped]" in err
    else:
        assert '"state":"stopped"' in out


@pytest.mark.integration
def test_a_second_sigterm_ends_the_node_at_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    proc = _node_after_round_one(tmp_path / "home", tiny_model_dir)
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # signals are not queued: send the second once the first was handled
        seen.append(line)
        if "Stopping at the next safe point" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 143  # 128 + SIGTERM: ended without the clean stop
    assert "[stopped]" not in err and "Traceback" not in err


@pytest.mark.integration
def test_export_without_a_checkpoint_says_what_to_do(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        node_cmd("export", tmp_path / "home", tiny_model_dir, "--out", str(tmp_path / "out")),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 4  # CheckpointError: a person's problem, with what to do
    assert "no checkpoint yet" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()
