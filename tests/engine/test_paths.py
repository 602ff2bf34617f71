"""`Paths.problem`: a home that cannot be used is one sentence before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.common.paths import Paths


def test_a_new_home_is_fine_and_nothing_is_made_by_asking(tmp_path: Path) -> None:
    assert Paths.under(tmp_path / "a" / "b").problem() is None
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("mine")
    problem = Paths.under(tmp_path / "afile" / "deeper").problem()
    assert problem is not None and problem.startswith(f"{tmp_path / 'afile'} is a file, so the folder ")
    home = tmp_path / "home"
    home.mkdir()
    (home / "logs").write_text("not a folder")
    assert Paths.under(home).problem() == (f"{home / 'logs'} is a file, so the folder {home / 'logs'} cannot be "
                                           "made there; give another folder.")


def test_a_folder_nobody_may_write_in_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    assert Paths.under(locked / "home").problem() == (f"Sapling cannot write in {locked} (no permission); give a "
                                                      "folder that you can write in.")
    assert Paths.under(tmp_path / "elsewhere").problem() is None
