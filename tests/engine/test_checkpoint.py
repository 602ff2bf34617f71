from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.common.atomicio import append_line, atomic_dir, atomic_write_text
from engine.common.errors import CheckpointError
from engine.node.checkpoint import latest_good, save_checkpoint, verify
from engine.node.metrics import MetricsLog


def _writer(payload: bytes):  # type: ignore[no-untyped-def]
    def write(folder: Path) -> list[str]:
        (folder / "weights.bin").write_bytes(payload)
        return ["weights.bin"]

    return write


def test_save_and_find_latest(tmp_path: Path) -> None:
    for r in (1, 2, 3):
        save_checkpoint(tmp_path, r, _writer(bytes([r]) * 10), {"structure_hash": "s"}, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["round-000002", "round-000003"]  # pruned to keep=2
    found = latest_good(tmp_path, "s")
    assert found is not None and found.round == 3
    assert (found.path / "weights.bin").read_bytes() == bytes([3]) * 10


def test_corrupt_checkpoint_is_moved_aside_and_previous_used(tmp_path: Path) -> None:
    for r in (1, 2):
        save_checkpoint(tmp_path, r, _writer(bytes([r]) * 10), {"structure_hash": "s"}, keep=5)
    (tmp_path / "round-000002" / "weights.bin").write_bytes(b"garbage")
    found = latest_good(tmp_path, "s")
    assert found is not None and found.round == 1
    moved = list((tmp_path / "corrupt").iterdir())
    assert len(moved) == 1 and moved[0].name.startswith("round-000002")
    assert (moved[0] / "weights.bin").read_bytes() == b"garbage"  # kept, never deleted


@pytest.mark.parametrize("damage", ["missing_state", "bad_json", "missing_file", "wrong_version"])
def test_partial_checkpoints_fail_verification(tmp_path: Path, damage: str) -> None:
    path = save_checkpoint(tmp_path, 7, _writer(b"x"), {"structure_hash": "s"}, keep=3)
    state_file = path / "state.json"
    if damage == "missing_state":
        state_file.unlink()
    elif damage == "bad_json":
        state_file.write_text("{not json")
    elif damage == "missing_file":
        (path / "weights.bin").unlink()
    else:
        state = json.loads(state_file.read_text())
        state["version"] = 99
        state_file.write_text(json.dumps(state))
    with pytest.raises(CheckpointError):
        verify(path)
    assert latest_good(tmp_path, "s") is None


def test_loader_rejection_falls_back(tmp_path: Path) -> None:
    for r in (1, 2):
        save_checkpoint(tmp_path, r, _writer(bytes([r])), {"structure_hash": "s"}, keep=5)

    def load(path: Path) -> None:
        if path.name.endswith("2"):
            raise CheckpointError("cannot load")

    found = latest_good(tmp_path, "s", load)
    assert found is not None and found.round == 1


def test_other_structure_is_an_error_not_corruption(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, _writer(b"x"), {"structure_hash": "lora-r16"}, keep=3)
    with pytest.raises(CheckpointError, match="different model"):
        latest_good(tmp_path, "lora-r4")
    assert (tmp_path / "round-000001").is_dir()  # left alone


def test_interrupted_atomic_dir_leaves_old_version(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a").write_text("new")
        raise RuntimeError("crash mid-write")
    assert (target / "a").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temp litter


def test_atomic_write_text_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "key"
    atomic_write_text(path, "secret", mode=0o600)
    assert path.read_text() == "secret"
    assert path.stat().st_mode & 0o777 == 0o600


def test_metrics_log_survives_a_torn_line(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"run": "a", "kind": "round", "round": 1})
    with open(log.path, "a") as handle:
        handle.write('{"run": "a", "kind": "round", "rou')  # crash mid-append
    assert [r["round"] for r in log.read("a")] == [1]
    log.append({"run": "a", "kind": "round", "round": 2})
    assert [r["round"] for r in log.read("a")] == [1, 2]
    assert log.has("a", "round", 2) and not log.has("b", "round", 2)


def test_append_line_rejects_newlines(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        append_line(tmp_path / "x", "a\nb")
