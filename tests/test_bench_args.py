"""Benchmarks refuse bad arguments with one sentence and exit code 2, before any measuring."""

from __future__ import annotations

import pytest

from bench import decode_profile, matmul_layout


@pytest.mark.parametrize("rows", ["x", "1,,2", "0", "5,-1"])
def test_matmul_layout_refuses_row_counts_that_are_not_whole_numbers_from_1(rows: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert matmul_layout.main(["--rows", rows]) == 2
    err = capsys.readouterr().err
    assert err.startswith("matmul_layout: ") and err.count("\n") == 1


@pytest.mark.parametrize("args", [["--ops", "-1"], ["--eval", "0"]])
def test_decode_profile_refuses_negative_counts(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert decode_profile.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode_profile: ") and err.count("\n") == 1
