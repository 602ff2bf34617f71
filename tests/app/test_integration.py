"""The real engine with a tiny model, through the whole app: `sapling --self-test` offscreen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--device", "cpu", "--threads", "1", "--set", "tasks.questions_per_round=2",
        "--set", "tasks.completions_per_question=2", "--set", "tasks.max_new_tokens=8"]


def self_test(*engine_flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "app.main", "--self-test", "--self-test-timeout", "240", "--",
                           *engine_flags], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_self_test_runs_one_real_round_through_the_app(tiny_model_dir: Path) -> None:
    out = self_test("--model", str(tiny_model_dir), *FAST)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sapling self-test: PASSED" in out.stdout and "round 1 on cpu" in out.stdout
    assert "training: Training from round 1." in out.stdout


def test_self_test_fails_with_a_clear_message(tmp_path: Path) -> None:
    out = self_test("--model", str(tmp_path / "no-such-model"), *FAST)
    assert out.returncode == 1
    assert "sapling self-test: FAILED: Sapling cannot train with these settings" in out.stderr
    assert "does not exist" in out.stderr
