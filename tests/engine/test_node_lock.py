"""One node per data folder (engine/common/node_lock.py): a second is one sentence; a killed holder frees it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.common.errors import NodeBusyError
from engine.common.node_lock import LOCK_FILE, node_lock

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time; from pathlib import Path; from engine.common.node_lock import node_lock\n"
        "with node_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)")


def hold(data_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(data_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.integration
def test_a_second_node_is_refused_while_the_first_lives_and_let_in_once_it_is_killed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = hold(data)
    try:
        with pytest.raises(NodeBusyError, match=rf"already training with {data}, process {holder.pid}: stop it"):
            with node_lock(data):
                pytest.fail("two holders")
    finally:
        holder.send_signal(signal.SIGKILL if os.name == "posix" else signal.SIGTERM)
        holder.wait(timeout=30)
    with node_lock(data):  # the system dropped the dead holder's lock: nothing to clean up
        assert (data / LOCK_FILE).read_bytes().strip(b"\0").decode().strip() == str(os.getpid())
    with node_lock(data):  # and it is free again after a normal end
        pass


@pytest.mark.integration
def test_sapling_node_run_on_a_busy_folder_is_one_sentence_and_exit_code_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    holder = hold(home / "data")
    try:
        out = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--home", str(home), "--solo", "--rounds",
                              "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert out.returncode == 2, out.stderr
    assert f"sapling-node: error: Another Sapling node is already training with {home / 'data'}" in out.stderr
    assert "Traceback" not in out.stderr and "Engine started" not in out.stdout


@pytest.mark.integration
def test_an_experiment_on_a_busy_folder_is_one_sentence_naming_out(tmp_path: Path) -> None:
    out_dir = tmp_path / "exp"
    holder = hold(out_dir)
    try:
        out = subprocess.run([sys.executable, "-m", "engine.cli", "experiment", "--out", str(out_dir), "--home",
                              str(tmp_path / "home"), "--nodes", "2", "--mixes", "8/0", "--rounds", "1"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert out.returncode == 2, out.stderr
    assert f"already training with {out_dir}, process {holder.pid}" in out.stderr
    assert "A second experiment needs a folder of its own (--out)." in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["node.lock"]
