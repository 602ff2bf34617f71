"""engine/experiment/upto.py: a long run's records read as they stood after round N."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.experiment.compare import compare
from engine.experiment.upto import cut_lines, records_upto


def fake(folder: Path, rewards: list[list[float]], evals: list[int]) -> None:
    """A 2-node experiment with mix 4/4: the rounds' rewards, an evaluation after each round in `evals` (the last
    round's in eval.json), node metrics, and a checkpoint that must not be copied."""
    mix = folder / "mix-4-4"
    (mix / "node-0" / "checkpoints" / "round-000001").mkdir(parents=True)
    (mix / "node-0" / "checkpoints" / "round-000001" / "adapter.safetensors").write_bytes(b"x" * 64)
    (folder / "experiment.json").write_text(json.dumps(
        {"nodes": 2, "mixes": ["4/4"], "rounds": len(rewards), "preset": "default", "overrides": []}))
    (folder / "eval-start.json").write_text(json.dumps({"round": 0, "accuracy": 0.1}))
    (mix / "progress.json").write_text(json.dumps({"round": len(rewards)}))
    (mix / "rounds.jsonl").write_text("".join(json.dumps({"round": r + 1, "rewards": row}) + "\n"
                                              for r, row in enumerate(rewards)))
    (mix / "node-0" / "metrics.jsonl").write_text(json.dumps({"kind": "start"}) + "\n" + "".join(
        json.dumps({"round": r + 1}) + "\n" for r in range(len(rewards))))
    last = len(rewards)
    (mix / "evals.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in evals if r < last))
    (mix / "eval.json").write_text(json.dumps({"round": last}))


def test_lines_after_the_round_go_and_lines_without_a_round_stay() -> None:
    text = '{"kind": "start"}\n{"round": 1}\n{"round": 2}\n{"round": 3}\n'
    assert cut_lines(text, 2) == '{"kind": "start"}\n{"round": 1}\n{"round": 2}\n'


def test_a_run_cut_after_round_two_compares_as_one_that_ran_two_rounds(tmp_path: Path) -> None:
    fake(tmp_path / "a", [[0.1, 0.2], [0.3, 0.3], [0.9, 0.9], [0.9, 0.9]], [2, 4])
    fake(tmp_path / "b", [[0.1, 0.2], [0.3, 0.1], [0.0, 0.0], [0.0, 0.0]], [2, 4])
    cut_a, cut_b = (records_upto(tmp_path / x, 2, tmp_path / "cache") for x in "ab")
    result = compare(cut_a, cut_b, "4/4")
    assert result["rounds"] == 2 and result["cumulative_a"] == pytest.approx(0.9)
    assert result["cumulative_b"] == pytest.approx(0.7)
    mix = cut_a / "mix-4-4"
    assert json.loads((mix / "progress.json").read_text()) == {"round": 2}
    assert [json.loads(line)["round"] for line in (mix / "evals.jsonl").read_text().splitlines()] == [2]
    assert not (mix / "eval.json").exists()  # the evaluation after round 4 is past the cut
    assert not (mix / "node-0" / "checkpoints").exists()
    assert (mix / "node-0" / "metrics.jsonl").read_text().count("\n") == 3
    whole = records_upto(tmp_path / "a", 4, tmp_path / "cache")
    assert json.loads((whole / "mix-4-4" / "eval.json").read_text()) == {"round": 4}


def test_a_bad_round_or_folder_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--upto takes a round number of 1 or more"):
        records_upto(tmp_path, 0, tmp_path / "cache")
    with pytest.raises(ValueError, match="holds no experiment"):
        records_upto(tmp_path, 3, tmp_path / "cache")
    from bench.experiment_report import main

    assert main(["--pool", "4/4", "4/4", f"{tmp_path},{tmp_path}", "--upto", "x"]) == 2
