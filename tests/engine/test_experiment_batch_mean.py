"""engine/experiment/batch_mean.py: the training batch's mean reward as the paper's trainer logs it, worked by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.experiment.batch_mean import DEFINITIONS, batch_mean, paper_metric
from engine.experiment.report import stratified_bootstrap

# One node's round of a mix with J = 2: three own groups (one informative), three swarm groups drawn and
# re-scored in this order (the second all equal: refused), the two informative ones admitted.
ROUND = {"round": 1,
         "batch_own": [[[0.5, True], [0.0, False], [1.0, False]]],
         "swarm_scored": [[[0.25, True], [0.0, False], [0.75, True]]],
         "batch_external": [[[0.25, True], [0.75, True]]]}


@pytest.mark.parametrize(("own", "peers", "expected"), [
    ("all", "all", (0.5 + 0.0 + 1.0 + 0.25 + 0.0) / 5),  # the first J drawn, refused or not
    ("all", "informative", (0.5 + 0.0 + 1.0 + 0.25 + 0.75) / 5),  # the admitted ones
    ("informative", "all", (0.5 + 0.25 + 0.0) / 3),
    ("informative", "informative", (0.5 + 0.25 + 0.75) / 3),
])
def test_each_definition_averages_the_groups_it_keeps(own: str, peers: str, expected: float) -> None:
    assert batch_mean(ROUND, 0, 2, own, peers) == pytest.approx(expected)


def test_an_empty_batch_counts_zero_and_old_records_are_refused_with_a_sentence() -> None:
    alone = {"round": 3, "batch_own": [[[0.0, False], [1.0, False]]], "swarm_scored": [[]], "batch_external": [[]]}
    assert batch_mean(alone, 0, 0, "informative", "informative") == 0.0
    assert batch_mean(alone, 0, 0, "all", "all") == 0.5
    with pytest.raises(ValueError, match="round 4 was recorded without the training batch's groups"):
        batch_mean({"round": 4, "rewards": [0.5]}, 0, 2, "all", "all")


def fake(folder: Path, mix: str, rounds: list[dict[str, Any]]) -> None:
    slug = folder / ("mix-" + mix.replace("/", "-"))
    slug.mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(
        {"nodes": 1, "mixes": [mix], "rounds": len(rounds), "preset": "default", "overrides": []}))
    (slug / "progress.json").write_text(json.dumps({"round": len(rounds)}))
    (slug / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))


def test_a_mix_against_alone_is_the_ratio_of_the_batch_means_under_each_definition(tmp_path: Path) -> None:
    alone = {"round": 1, "batch_own": [[[0.5, True], [0.0, False], [1.0, False]]], "swarm_scored": [[]],
             "batch_external": [[]]}
    fake(tmp_path / "joined", "3/2", [ROUND])
    fake(tmp_path / "alone", "3/0", [alone])
    result = paper_metric([(tmp_path / "joined", tmp_path / "alone")], "3/2", "3/0", stratified_bootstrap)
    assert set(result["definitions"]) == {f"own {o}, swarm {p}" for o, p in DEFINITIONS}
    both = result["definitions"]["own informative, swarm informative"]
    assert both["mean_a"] == pytest.approx(0.5) and both["mean_b"] == pytest.approx(0.5)
    assert both["ratio"] == pytest.approx(1.0)
    unfiltered = result["definitions"]["own all, swarm all"]
    assert unfiltered["ratio"] == pytest.approx(0.35 / 0.5)
    assert result["rounds"] == [1]
