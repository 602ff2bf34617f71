"""engine/experiment/evaluation.py: each node's best checkpoint by held-out accuracy survives the run."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from engine.experiment.evaluation import BEST_FILE, BEST_FOLDER, best_so_far, keep_best
from engine.experiment.plan import EVAL_FILE, Mix, make_plan, read_evals
from engine.node.checkpoint import checkpoint_name
from tests.engine.test_experiment import fast, run


def fake_checkpoint(root: Path, round_index: int) -> None:
    folder = root / checkpoint_name(round_index)
    folder.mkdir(parents=True)
    (folder / "adapter.safetensors").write_text(f"round {round_index}")


def result(*accuracies: float) -> dict[str, object]:
    return {"questions": 4, "nodes": [{"accuracy": a} for a in accuracies]}


def test_a_node_keeps_the_checkpoint_of_its_best_evaluation_and_a_tie_keeps_the_earlier(tmp_path: Path) -> None:
    homes = [tmp_path / "node-0", tmp_path / "node-1"]
    roots = [home / "checkpoints" for home in homes]
    for round_index in (1, 2, 3):
        for root in roots:
            fake_checkpoint(root, round_index)

    assert keep_best(homes, roots, 1, result(0.25, 0.5)) == [0, 1]  # a first evaluation is always the best
    assert keep_best(homes, roots, 2, result(0.5, 0.25)) == [0]  # node 1 fell: its round 1 stays
    assert keep_best(homes, roots, 3, result(0.5, 0.5)) == []  # ties: the earlier round stays

    assert best_so_far(homes[0]) == {"round": 2, "accuracy": 0.5, "questions": 4, "checkpoint": "round-000002"}
    assert best_so_far(homes[1])["round"] == 1  # type: ignore[index]
    kept = homes[1] / BEST_FOLDER / "round-000001" / "adapter.safetensors"
    assert kept.read_text() == "round 1"
    # The copy is apart from the checkpoints: pruning the node's rounds leaves it.
    for root in roots:
        for path in sorted(root.iterdir()):
            for file in path.iterdir():
                file.unlink()
            path.rmdir()
    assert kept.read_text() == "round 1"
    assert not list(homes[0].glob(f".{BEST_FOLDER}*"))  # no temporary folder left behind


def test_a_damaged_best_record_counts_as_none_and_is_replaced(tmp_path: Path) -> None:
    home, root = tmp_path / "node-0", tmp_path / "node-0" / "checkpoints"
    fake_checkpoint(root, 4)
    (home / BEST_FOLDER).mkdir(parents=True)
    (home / BEST_FOLDER / BEST_FILE).write_text("{not json")
    assert best_so_far(home) is None
    assert keep_best([home], [root], 4, result(0.0)) == [0]
    assert best_so_far(home)["round"] == 4  # type: ignore[index]


def test_an_experiment_keeps_each_nodes_best_held_out_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan("default", 2, "2/0", 3, [*fast(tiny_model_dir), "run.keep_checkpoints=1"])
    run(plan, tmp_path / "out", tmp_path / "home")

    folder = tmp_path / "out" / Mix(2, 0).slug
    evals = read_evals(folder)
    evals[3] = json.loads((folder / EVAL_FILE).read_text())
    assert sorted(evals) == [1, 2, 3]
    for k in range(2):
        accuracies = {r: evals[r]["nodes"][k]["accuracy"] for r in sorted(evals)}
        best_round = max(accuracies, key=lambda r: (accuracies[r], -r))  # the earliest of the best
        best = best_so_far(folder / f"node-{k}")
        assert best is not None and best["round"] == best_round and best["accuracy"] == accuracies[best_round]
        kept = folder / f"node-{k}" / BEST_FOLDER / checkpoint_name(best_round) / "adapter.safetensors"
        assert load_file(str(kept))  # a whole checkpoint, though keep_checkpoints=1 pruned the node's own copy
        if best_round < 3:
            assert not (folder / f"node-{k}" / "checkpoints" / f"node-{k}" / checkpoint_name(best_round)).exists()
