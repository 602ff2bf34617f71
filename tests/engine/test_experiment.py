"""`sapling-node experiment` on tiny models: three nodes through a real loopback relay, resume, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engine.cli import main
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.paths import Paths
from engine.experiment.compare import compare, pooled_compare
from engine.experiment.nodes import NodeBackend
from engine.experiment.plan import Mix, lengthen, make_plan, parse_mixes
from engine.experiment.report import baseline_of, report_markdown, stratified_bootstrap, two_way_bootstrap
from engine.experiment.runner import Experiment, Hooks
from engine.node.clock import Control


def parity_reward(question: Any, completion: str) -> float:
    """A verifier a random model satisfies about half the time, so groups carry a gradient."""
    return float(len(completion) % 2)


def fast(model_dir: Path) -> list[str]:
    return [
        "tasks.questions_per_round=2", "tasks.completions_per_question=4", "tasks.max_new_tokens=12",
        "tasks.eval_every=1", "tasks.eval_questions=9", "grpo.micro_batch=8", "grpo.learning_rate=0.02",
        "run.device='cpu'", f"model.source='{model_dir}'",
        "swarm.length_ratio=0",  # a tiny random model's text, re-tokenized, has no length worth judging
    ]


def run(plan: Any, out: Path, home: Path, control: Control | None = None, **hooks: Any) -> tuple[Experiment,
                                                                                                 dict[str, Any]]:
    experiment = Experiment(plan, out, Paths.under(home), Hooks(**{"reward": parity_reward, **hooks}), control)
    return experiment, experiment.run()


def adapters(out: Path, mix: Mix, nodes: int, round_index: int) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(out / mix.slug / f"node-{k}" / "checkpoints" / f"node-{k}" / f"round-{round_index:06d}"
                          / "adapter.safetensors"))
            for k in range(nodes)]


@pytest.mark.integration  # a real loopback relay
def test_three_nodes_share_through_a_real_relay_and_the_report_compares_the_mixes(tiny_model_dir: Path,
                                                                                  tmp_path: Path) -> None:
    plan = make_plan("default", 3, "2/0,1/1", 2, fast(tiny_model_dir))
    experiment, report = run(plan, tmp_path / "out", tmp_path / "home")

    assert set(report["mixes"]) == {"2/0", "1/1"} and report["complete"]
    for label in ("2/0", "1/1"):
        mix = report["mixes"][label]
        assert mix["rounds_done"] == 2 and len(mix["reward_by_round"]) == 2
        assert mix["cumulative_reward"] == pytest.approx(sum(mix["reward_by_node"]))
        assert mix["mean_reward"] == pytest.approx(mix["cumulative_reward"] / (3 * 2))
        assert mix["eval_start"]["questions"] == 9 and len(mix["eval_end"]["nodes"]) == 3
    assert report["mixes"]["2/0"]["external_groups_per_node_round"] == 0
    assert report["mixes"]["1/1"]["external_groups_per_node_round"] > 0
    assert report["mixes"]["1/1"]["against_baseline"]["baseline"] == "2/0"
    # Round 1 starts from the same base with the same seeds and questions: the mixes differ only later.
    assert report["mixes"]["2/0"]["reward_by_round"][0] == report["mixes"]["1/1"]["reward_by_round"][0]
    for name in ("report.json", "report.md", "reward.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0

    # Each round records its training batch group by group, and every swarm group re-scored (batch_mean.py).
    for line in (tmp_path / "out" / "mix-1-1" / "rounds.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert [len(own) for own in record["batch_own"]] == [1, 1, 1]  # I = 1 own group each
        assert [len(ext) for ext in record["batch_external"]] == record["external_groups"]
        assert all(len(drawn) >= len(ext) and all(informative for _, informative in ext)
                   for drawn, ext in zip(record["swarm_scored"], record["batch_external"], strict=True))

    # Each node signed with its own identity and took verified groups only from the two others.
    sharing = tmp_path / "out" / "mix-1-1"
    ids = [json.loads(line)["swarm"]["by_peer"] for k in range(3)
           for line in (sharing / f"node-{k}" / "metrics.jsonl").read_text().splitlines()[-1:]]
    peer_keys = [(sharing / f"node-{k}" / "identity.key").read_bytes() for k in range(3)]
    assert len(set(peer_keys)) == 3
    assert all(by_peer for by_peer in ids)
    assert sum(v["accepted"] for by_peer in ids for v in by_peer.values()) > 0
    # One frozen base, one adapter per node: the nodes' adapters trained apart.
    trained = adapters(tmp_path / "out", Mix(1, 1), 3, 2)
    assert any(not torch.equal(trained[0][k], trained[1][k]) for k in trained[0])
    assert isinstance(experiment.shared, object) and experiment.shared.grpo.finetune == "lora"


def straight_then_stopped(plan: Any, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan run straight into tmp_path/straight, and again into tmp_path/stopped, stopped after round 1:
    the two reports."""
    _, straight = run(plan, tmp_path / "straight", tmp_path / "home")
    control = Control()

    def stop_after_round_1(mix: Mix, record: dict[str, Any]) -> None:
        if record["round"] == 1:
            control.stop()

    _, partial = run(plan, tmp_path / "stopped", tmp_path / "home", control, round_done=stop_after_round_1)
    return straight, partial


@pytest.mark.integration  # a real loopback relay
@pytest.mark.parametrize("difficulty", ["fixed", "adaptive"])  # adaptive: levels, windows and re-asks resume too
def test_a_resumed_experiment_ends_with_the_same_numbers_and_weights(tiny_model_dir: Path, tmp_path: Path,
                                                                       difficulty: str) -> None:
    reask = ["tasks.reask_share=0.5"] if difficulty == "adaptive" else []  # one of the two questions re-asked
    plan = make_plan("default", 3, "1/2", 3, [*fast(tiny_model_dir), f"tasks.difficulty='{difficulty}'", *reask])
    straight, partial = straight_then_stopped(plan, tmp_path)
    assert partial["mixes"]["1/2"]["rounds_done"] == 1 and not partial["complete"]
    _, resumed = run(plan, tmp_path / "stopped", tmp_path / "home")  # a new process would do the same

    a, b = straight["mixes"]["1/2"], resumed["mixes"]["1/2"]
    assert b["rounds_done"] == 3
    assert a["external_groups_per_node_round"] > 0
    for key in ("cumulative_reward", "reward_by_round", "reward_by_node", "informative_groups_per_node_round",
                "external_groups_per_node_round", "rejected_external_items"):
        assert a[key] == b[key], key
    assert a["eval_end"]["nodes"] == b["eval_end"]["nodes"]
    for x, y in zip(adapters(tmp_path / "straight", Mix(1, 2), 3, 3), adapters(tmp_path / "stopped", Mix(1, 2), 3, 3),
                    strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)
    straight_rounds, resumed_rounds = ([json.loads(line) for line in (out / "mix-1-2" / "rounds.jsonl").read_text()
                                        .splitlines()] for out in (tmp_path / "straight", tmp_path / "stopped"))
    for key in ("loss", "reasked", "reasked_informative"):
        assert [r[key] for r in straight_rounds] == [r[key] for r in resumed_rounds], key
    assert (sum(sum(r["reasked"]) for r in straight_rounds) > 0) == bool(reask)
    assert a["reasked_per_node_round"] == b["reasked_per_node_round"]
    assert (a["reasked_per_node_round"] > 0) == bool(reask)
    assert (a["reasked_informative_share"] is None) != bool(reask)
    if difficulty == "adaptive":  # each round's levels, pass rates and draw shares, as an uninterrupted run had them
        def reports(out: Path, k: int) -> list[Any]:
            lines = (out / "mix-1-2" / f"node-{k}" / "metrics.jsonl").read_text().splitlines()
            return [json.loads(line)["curriculum"] for line in lines]
        for k in range(3):
            assert reports(tmp_path / "straight", k) == reports(tmp_path / "stopped", k)
        assert any(r["pass_rate"] is not None for r in reports(tmp_path / "straight", 0)[-1].values())


@pytest.mark.integration  # a real loopback relay
def test_a_round_cut_short_after_it_trained_on_peers_items_resumes_as_if_it_never_ran(tiny_model_dir: Path,
                                                                                     tmp_path: Path) -> None:
    """A round stopped between training on peers' items and its checkpoint left them in the replay memory (written
    at once, engine/swarm/defence.py); its update was lost, so the round run again must not refuse them as replays.
    The replay files of the uninterrupted run's later rounds, put beside the checkpoint of round 1, are that state."""
    plan = make_plan("default", 3, "1/2", 3, fast(tiny_model_dir))
    straight, _ = straight_then_stopped(plan, tmp_path)
    ahead = sorted((tmp_path / "straight" / "mix-1-2").glob("node-*/swarm/trained-*.json"))
    assert ahead and any(json.loads(p.read_text())["rounds"].count(3) for p in ahead)  # keys of rounds after 1
    for path in ahead:
        shutil.copyfile(path, tmp_path / "stopped" / path.relative_to(tmp_path / "straight"))
    _, resumed = run(plan, tmp_path / "stopped", tmp_path / "home")
    a, b = straight["mixes"]["1/2"], resumed["mixes"]["1/2"]
    assert a["external_groups_per_node_round"] > 0
    for key in ("cumulative_reward", "reward_by_round", "external_groups_per_node_round", "rejected_external_items"):
        assert a[key] == b[key], key
    for x, y in zip(adapters(tmp_path / "straight", Mix(1, 2), 3, 3), adapters(tmp_path / "stopped", Mix(1, 2), 3, 3),
                    strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_each_node_trains_only_its_own_adapter_over_the_one_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan("default", 2, "2/0", 1, fast(tiny_model_dir))
    experiment = Experiment(plan, tmp_path / "out", Paths.under(tmp_path / "home"), Hooks(reward=parity_reward))
    experiment.load_model()
    shared = experiment.shared
    one, two = (NodeBackend(shared, shared.new_adapter_slot(seed)) for seed in (1, 2))
    base = {n: p.detach().clone() for n, p in shared.model.named_parameters() if not p.requires_grad}
    before_two = [t.clone() for t in two.slot.tensors]
    prompts = [[5, 6, 7, 8]]
    items = shared.generate(prompts, 4, 6, 1.0)
    from engine.backends.base import TrainItem

    one.train([TrainItem(prompts[0], c.token_ids, c.logprobs, 1.0 if i % 2 else -1.0) for i, c in enumerate(items)])
    assert all(torch.equal(a, b) for a, b in zip(before_two, two.slot.tensors, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before_two, one.slot.tensors, strict=True))
    assert all(torch.equal(base[n], p) for n, p in shared.model.named_parameters() if not p.requires_grad)
    # The per-row decoder sees each node's own adapter: node one's rows match a call with its adapter alone.
    together = shared.generate_with_adapters(prompts * 2, 3, 6, 1.0, [one.lora(), two.lora()], [0, 1], seeds=[11, 12])
    alone = shared.generate_with_adapters(prompts, 3, 6, 1.0, [one.lora()], [0], seeds=[11])
    assert [c.token_ids for c in together[:3]] == [c.token_ids for c in alone]


@pytest.mark.parametrize(("text", "message"), [
    ("8-0", "whole numbers"), ("8/0,x/4", "whole numbers"), ("4/4,4/4", "twice"), ("", "whole numbers"),
])
def test_a_mix_that_is_not_two_whole_numbers_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_mixes(text)


@pytest.mark.parametrize(("argv", "message"), [
    (["--mixes", "8-0"], "whole numbers"),
    (["--nodes", "1"], "at least 2"),
    (["--nodes", "2", "--mixes", "8/0,1/9"], "the 8 groups the other 1 node"),
    (["--preset", "huge"], "--preset must be one of default, paper"),
    (["--mixes", "0/8"], "I must be at least 1"),
    (["--mixes", "9/0"], "more than the 8 questions"),
])
def test_bad_input_gets_one_sentence_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "--out", str(tmp_path / "x"), "--home", str(tmp_path / "h"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_an_out_folder_holding_other_settings_is_not_reused(tiny_model_dir: Path, tmp_path: Path) -> None:
    first = make_plan("default", 2, "2/0", 1, fast(tiny_model_dir))
    run(first, tmp_path / "out", tmp_path / "home")
    other = make_plan("default", 3, "2/0", 1, fast(tiny_model_dir))
    with pytest.raises(ConfigError, match="--resume or choose another --out"):
        Experiment(other, tmp_path / "out", Paths.under(tmp_path / "home")).run()
    assert Experiment.saved_plan(tmp_path / "out") == first


def test_a_finished_experiment_run_to_more_rounds_ends_as_one_planned_that_long(tiny_model_dir: Path,
                                                                                tmp_path: Path) -> None:
    """--resume --rounds N (or the same settings with more rounds): the rounds run carry on from the last checkpoint,
    the old end evaluation becomes one on the way, and the numbers are those of a run planned that long."""
    options = [*fast(tiny_model_dir), "tasks.eval_every=2"]
    _, straight = run(make_plan("default", 2, "2/0", 3, options), tmp_path / "straight", tmp_path / "home")
    run(make_plan("default", 2, "2/0", 1, options), tmp_path / "grown", tmp_path / "home")
    assert json.loads((tmp_path / "grown" / "mix-2-0" / "eval.json").read_text())["round"] == 1
    started: list[str] = []
    grown_plan = lengthen(Experiment.saved_plan(tmp_path / "grown"), 3, tmp_path / "grown")  # type: ignore[arg-type]
    _, grown = run(grown_plan, tmp_path / "grown", tmp_path / "home",
                   mix_started=lambda mix, number, done, rounds: started.append(f"{done}/{rounds}"))
    assert started == ["1/3"] and Experiment.saved_plan(tmp_path / "grown").rounds == 3  # type: ignore[union-attr]
    a, b = straight["mixes"]["2/0"], grown["mixes"]["2/0"]
    for key in ("cumulative_reward", "reward_by_round", "reward_by_node", "informative_groups_per_node_round"):
        assert a[key] == b[key], key
    assert a["eval_end"]["nodes"] == b["eval_end"]["nodes"]
    evals = [json.loads(line)["round"] for line in (tmp_path / "grown" / "mix-2-0" / "evals.jsonl").read_text()
             .splitlines()]
    assert evals == [1, 2]  # round 1's end evaluation, kept; round 2's on the way
    assert json.loads((tmp_path / "grown" / "mix-2-0" / "eval.json").read_text())["round"] == 3
    # The same settings with more rounds grow it too; fewer are refused, as a sentence naming the rounds.
    assert Experiment.widened_plan(tmp_path / "grown", make_plan("default", 2, "2/0", 5, options)).rounds == 5
    with pytest.raises(ConfigError, match="planned 3 rounds; an experiment can grow"):
        lengthen(grown_plan, 2, tmp_path / "grown")
    assert main(["experiment", "--out", str(tmp_path / "grown"), "--home", str(tmp_path / "home"), "--resume",
                 "--rounds", "2"]) == 2


@pytest.mark.integration  # a real loopback relay
def test_a_mix_added_to_a_finished_experiment_runs_alone_and_pairs_with_the_others(tiny_model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    _, straight = run(make_plan("default", 2, "2/0,1/1", 1, fast(tiny_model_dir)), tmp_path / "straight",
                      tmp_path / "home")
    run(make_plan("default", 2, "2/0", 1, fast(tiny_model_dir)), tmp_path / "grown", tmp_path / "home")
    first_rounds = (tmp_path / "grown" / "mix-2-0" / "rounds.jsonl").read_text()
    started: list[str] = []
    _, grown = run(make_plan("default", 2, "1/1", 1, fast(tiny_model_dir)), tmp_path / "grown", tmp_path / "home",
                   mix_started=lambda mix, number, done, rounds: started.append(f"{mix.label}:{done}"))

    assert [m.label for m in Experiment.saved_plan(tmp_path / "grown").mixes] == ["2/0", "1/1"]  # type: ignore[union-attr]
    assert (tmp_path / "grown" / "mix-2-0" / "rounds.jsonl").read_text() == first_rounds  # not run again
    assert started == ["1/1:0"]
    for label in ("2/0", "1/1"):
        for key in ("cumulative_reward", "reward_by_round", "reward_by_node"):
            assert grown["mixes"][label][key] == straight["mixes"][label][key], (label, key)
    assert grown["mixes"]["1/1"]["against_baseline"]["baseline"] == "2/0"
    assert grown["mixes"]["1/1"]["eval_end"]["examples"] == "per_specialty"


def test_a_folder_measured_with_an_example_per_question_keeps_its_held_out_prompts(tiny_model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    run(make_plan("default", 2, "2/0", 1, fast(tiny_model_dir)), tmp_path / "out", tmp_path / "home")
    start = json.loads((tmp_path / "out" / "eval-start.json").read_text())
    assert start["examples"] == "per_specialty"
    del start["examples"]  # as written before the held-out set shared one example per specialty
    (tmp_path / "out" / "eval-start.json").write_text(json.dumps(start))
    _, report = run(make_plan("default", 2, "1/1", 1, fast(tiny_model_dir)), tmp_path / "out", tmp_path / "home")
    assert report["mixes"]["1/1"]["eval_end"]["examples"] == "per_question"
    assert report["mixes"]["2/0"]["eval_end"]["examples"] == "per_specialty"  # measured before the edit


def test_the_paper_preset_is_the_papers_eight_nodes_and_four_mixes() -> None:
    plan = make_plan("paper", None, None, None, [])
    assert plan.nodes == 8 and [m.label for m in plan.mixes] == ["8/0", "6/2", "4/4", "2/6"]
    cfg = build_config("paper", None, ["tasks.questions_per_round=9"])
    assert cfg.tasks.completions_per_question == 8 and cfg.grpo.kl_beta == 0.0


def test_the_bootstrap_ratio_of_a_table_to_its_half_is_exactly_two() -> None:
    b = [[0.1, 0.2, 0.3], [0.4, 0.0, 0.2]]
    a = [[2 * x for x in row] for row in b]
    result = two_way_bootstrap(a, b, samples=200)
    assert result["ratio"] == pytest.approx(2.0)
    assert result["ratio_ci95"] == pytest.approx([2.0, 2.0])
    # mean of b is 1.2 / 6 = 0.2, so a - b is 0.2 per node-round
    assert result["difference"] == pytest.approx(0.2)
    lo, hi = result["difference_ci95"]
    assert lo <= 0.2 <= hi and lo > 0


def test_the_baseline_of_a_mix_is_the_all_local_mix_of_the_same_size() -> None:
    assert baseline_of("4/4", ["8/0", "4/4"]) == "8/0"
    assert baseline_of("1/1", ["2/0", "1/1"]) == "2/0"
    assert baseline_of("8/0", ["8/0", "4/4"]) is None
    assert baseline_of("1/2", ["2/0", "1/2"]) is None


def _fake_experiment(folder: Path, rewards: list[list[float]], mix: str = "4/4",
                     overrides: tuple[str, ...] = ()) -> None:
    """An experiment folder with one mix whose rounds carry these [round][node] rewards."""
    slug = folder / ("mix-" + mix.replace("/", "-"))
    slug.mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(
        {"nodes": 2, "mixes": [mix], "rounds": len(rewards), "preset": "default", "overrides": list(overrides)}))
    (slug / "progress.json").write_text(json.dumps({"round": len(rewards)}))
    (slug / "rounds.jsonl").write_text(
        "".join(json.dumps({"round": r + 1, "rewards": row}) + "\n" for r, row in enumerate(rewards)))


def test_compare_pairs_the_same_mix_of_two_experiments_round_by_round(tmp_path: Path) -> None:
    _fake_experiment(tmp_path / "a", [[0.1, 0.2], [0.3, 0.3], [0.4, 0.2]])
    _fake_experiment(tmp_path / "b", [[0.1, 0.2], [0.3, 0.1]])  # one round fewer, parted in round 2
    result = compare(tmp_path / "a", tmp_path / "b", "4/4")
    assert result["rounds"] == 2 and result["first_round_that_differs"] == 2
    assert result["cumulative_a"] == pytest.approx(0.9) and result["cumulative_b"] == pytest.approx(0.7)
    assert result["ratio"] == pytest.approx(0.9 / 0.7)
    with pytest.raises(ValueError, match="no experiment with mix 8/0"):
        compare(tmp_path / "a", tmp_path / "b", "8/0")


def test_the_variants_plot_draws_mixes_of_several_folders_and_refuses_bad_specs(tmp_path: Path) -> None:
    from bench.experiment_report import main

    _fake_experiment(tmp_path / "a", [[0.2, 0.4], [0.3, 0.3]])
    _fake_experiment(tmp_path / "b", [[0.1, 0.2], [0.3, 0.2]], mix="8/0")
    out = tmp_path / "both.png"
    assert main(["--plot", str(out), f"4/4, a={tmp_path / 'a'}:4/4", f"8/0={tmp_path / 'b'}:8/0"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["--plot", str(tmp_path / "x.png"), f"{tmp_path / 'a'}:4/4"]) == 2  # no LABEL=
    assert main(["--plot", str(tmp_path / "x.png"), f"a={tmp_path / 'a'}:8/0"]) == 2  # no such mix there
    assert not (tmp_path / "x.png").exists()


def test_compare_can_pair_a_mix_with_another_folders_baseline(tmp_path: Path) -> None:
    _fake_experiment(tmp_path / "a", [[0.2, 0.4], [0.3, 0.3]])
    _fake_experiment(tmp_path / "b", [[0.1, 0.2], [0.3, 0.2]], mix="8/0")
    result = compare(tmp_path / "a", tmp_path / "b", "4/4", "8/0")
    assert result["mix_b"] == "8/0" and result["ratio"] == pytest.approx(1.2 / 0.8)
    with pytest.raises(ValueError, match="not a mix"):
        compare(tmp_path / "a", tmp_path / "b", "4/4", "eight")


def test_a_comparison_says_what_each_arm_measures_and_will_not_pool_different_arms(tmp_path: Path) -> None:
    # The experiment's preset lifts the node's cap on the training batch (a mix I/J is exactly J swarm groups), so
    # an 8/4 is the app's default joined node only when swarm.train_groups was set: the 200-round pair of
    # 2026-12-05 was called the default for two days while it ran without the cap.
    rounds = [[0.2, 0.4], [0.3, 0.3]]
    _fake_experiment(tmp_path / "alone", rounds, mix="8/0")
    _fake_experiment(tmp_path / "capped", rounds, mix="8/4", overrides=("swarm.train_groups=4",))
    _fake_experiment(tmp_path / "uncapped", rounds, mix="8/4")
    _fake_experiment(tmp_path / "capped-lever", rounds, mix="8/4",
                     overrides=("swarm.train_groups=4", "swarm.peer_questions=0.25"))
    capped = compare(tmp_path / "capped", tmp_path / "alone", "8/4", "8/0")
    assert "the app's default joined node" in capped["measures"]["a"] and "alone" in capped["measures"]["b"]
    assert capped["settings_that_differ"] == {"swarm.train_groups": [4, 0]}
    uncapped = compare(tmp_path / "uncapped", tmp_path / "alone", "8/4", "8/0")["measures"]["a"]
    assert "exactly 4 swarm groups" in uncapped and "no cap" in uncapped and "default joined node" not in uncapped
    lever = compare(tmp_path / "capped-lever", tmp_path / "capped", "8/4")
    assert lever["settings_that_differ"] == {"swarm.peer_questions": [0.25, 0.0]}
    with pytest.raises(ValueError, match="do not measure the same arms"):
        pooled_compare([(tmp_path / "capped", tmp_path / "alone"), (tmp_path / "uncapped", tmp_path / "alone")],
                       "8/4", "8/0")
    # and each folder's own report says it in its head
    plan = {"nodes": 2, "mixes": ["8/0", "8/4"], "rounds": 2, "preset": "default", "overrides": []}
    settings = {"model": "bundled", "questions_per_round": 8, "completions_per_question": 8, "seed": 0}
    for cap, says in ((0, "exactly J swarm groups"), (4, "only to fill the batch up to 4")):
        head = report_markdown({"plan": plan, "settings": {**settings, "train_groups": cap}, "complete": True,
                                "mixes": {}})
        assert says in head
    alone = report_markdown({"plan": {**plan, "mixes": ["8/0"]}, "settings": {**settings, "train_groups": 0},
                             "complete": True, "mixes": {}})
    assert "swarm groups" not in alone


def test_the_stratified_bootstrap_of_one_stratum_is_the_two_way_bootstrap() -> None:
    a = [[0.3, 0.1, 0.5], [0.2, 0.4, 0.0]]
    b = [[0.1, 0.2, 0.3], [0.4, 0.0, 0.2]]
    assert stratified_bootstrap([(a, b)], samples=300, seed=4) == two_way_bootstrap(a, b, samples=300, seed=4)


def test_pooling_two_seeds_adds_their_sums_and_keeps_each_seeds_own_comparison(tmp_path: Path) -> None:
    from bench.experiment_report import main

    _fake_experiment(tmp_path / "s0a", [[0.2, 0.4], [0.3, 0.3]])
    _fake_experiment(tmp_path / "s0b", [[0.1, 0.2], [0.3, 0.2]], mix="8/0")
    _fake_experiment(tmp_path / "s1a", [[0.5, 0.1], [0.1, 0.1], [0.9, 0.9]])  # a round its baseline has not finished
    _fake_experiment(tmp_path / "s1b", [[0.2, 0.2], [0.2, 0.2]], mix="8/0")
    result = pooled_compare([(tmp_path / "s0a", tmp_path / "s0b"), (tmp_path / "s1a", tmp_path / "s1b")], "4/4", "8/0")
    assert [p["rounds"] for p in result["pairs"]] == [2, 2]
    assert [p["ratio"] for p in result["pairs"]] == pytest.approx([1.2 / 0.8, 0.8 / 0.8])
    assert result["cumulative_a"] == pytest.approx(2.0) and result["cumulative_b"] == pytest.approx(1.6)
    assert result["ratio"] == pytest.approx(2.0 / 1.6)
    assert result["difference"] == pytest.approx(0.4 / 8)  # 2 seeds x 2 nodes x 2 rounds
    lo, hi = result["ratio_ci95"]
    assert lo <= 2.0 / 1.6 <= hi
    pair = f"{tmp_path / 's0a'},{tmp_path / 's0b'}"
    assert main(["--pool", "4/4", "8/0", pair]) == 0
    assert main(["--pool", "4/4", "8/0", str(tmp_path / "s0a")]) == 2  # not DIR_A,DIR_B
    assert main(["--pool", "8/0", "8/0", pair]) == 2  # no 8/0 in s0a
    _fake_experiment(tmp_path / "s2a", [[0.2, 0.4]])
    (tmp_path / "s2a" / "mix-4-4" / "progress.json").write_text(json.dumps({"round": 0}))  # nothing finished yet
    with pytest.raises(ValueError, match="no finished round in common"):
        pooled_compare([(tmp_path / "s2a", tmp_path / "s0b")], "4/4", "8/0")


@pytest.mark.integration  # a real loopback relay
def test_veterans_start_from_their_own_training_and_the_newcomer_starts_fresh(tiny_model_dir: Path,
                                                                              tmp_path: Path) -> None:
    plan = make_plan("default", 3, "2/0,2/2", 2, fast(tiny_model_dir), veterans=2, veteran_rounds=2)
    out = tmp_path / "out"
    _, report = run(plan, out, tmp_path / "home")

    # The veterans trained alone, once, in the folder's veterans/ (2 nodes, 2 rounds, mix B/0).
    veteran_rounds = [json.loads(line) for line in (out / "veterans" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in veteran_rounds] == [1, 2] and all(len(r["rewards"]) == 2 for r in veteran_rounds)
    assert all(r["external_groups"] == [0, 0] for r in veteran_rounds)
    veteran_adapters = [load_file(str(out / "veterans" / f"node-{k}" / "checkpoints" / f"node-{k}" / "round-000002" /
                                      "adapter.safetensors")) for k in range(2)]
    # In each mix every node's round counter runs on from the veterans' rounds (3 and 4 here), and the
    # newcomer (node 2) is the same fresh node in both mixes: its first round is identical.
    for label in ("2/0", "2/2"):
        records = [json.loads(line)
                   for line in (out / Mix(2, int(label[-1])).slug / "rounds.jsonl").read_text().splitlines()]
        assert [(r["round"], r["node_round"]) for r in records] == [(1, 3), (2, 4)]
        assert (out / Mix(2, int(label[-1])).slug / "node-0" / "checkpoints" / "node-0" / "round-000004").is_dir()
        assert not (out / Mix(2, int(label[-1])).slug / "node-2" / "checkpoints" / "node-2" / "round-000002").exists()
    first = {label: report["mixes"][label] for label in ("2/0", "2/2")}
    assert first["2/0"]["newcomers"]["nodes"] == [2]
    a, b = (json.loads((out / slug / "rounds.jsonl").read_text().splitlines()[0]) for slug in ("mix-2-0", "mix-2-2"))
    assert a["rewards"] == b["rewards"]  # round 1 is trained on after it is scored: same start in both mixes
    # A veteran carries on its own training (adapter and AdamW state): after the mix's 2 rounds its optimizer
    # has taken more steps than the 2 rounds allow, while the newcomer's started from nothing.
    for label in ("mix-2-0", "mix-2-2"):
        steps = [float(torch.load(out / label / f"node-{k}" / "checkpoints" / f"node-{k}" / "round-000004"
                                  / "optimizer.pt", weights_only=False)["state"][0]["step"]) for k in range(3)]
        assert steps[0] > 2 and steps[1] > 2 and steps[2] <= 2, (label, steps)
    assert veteran_adapters[0].keys() and not all(torch.equal(veteran_adapters[0][k], veteran_adapters[1][k])
                                                  for k in veteran_adapters[0])
    newcomer = report["mixes"]["2/2"]["newcomers"]
    assert newcomer["against_baseline"]["baseline"] == "2/0"
    assert newcomer["cumulative_reward"] == pytest.approx(sum(r["rewards"][2] for r in
        (json.loads(line) for line in (out / "mix-2-2" / "rounds.jsonl").read_text().splitlines())))
    assert len(newcomer["held_out_accuracy"]) == 1 and len(newcomer["reached_veterans_round"]) == 1
    assert report["mixes"]["2/2"]["veterans_start"]["rounds"] == 2
    assert "Newcomers (nodes 2)" in (out / "report.md").read_text()


@pytest.mark.integration  # a real loopback relay
def test_veterans_resume_mid_mix_from_the_mix_checkpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan("default", 3, "2/2", 2, fast(tiny_model_dir), veterans=2, veteran_rounds=1)
    straight, _ = straight_then_stopped(plan, tmp_path)
    _, resumed = run(plan, tmp_path / "stopped", tmp_path / "home")
    assert straight["mixes"]["2/2"]["reward_by_round"] == resumed["mixes"]["2/2"]["reward_by_round"]
    newcomers = [report["mixes"]["2/2"]["newcomers"]["cumulative_reward"] for report in (straight, resumed)]
    assert newcomers[0] == newcomers[1]


def test_a_folder_keeps_the_settings_it_began_with_when_a_default_changes(tiny_model_dir: Path, tmp_path: Path) -> None:
    from engine.experiment.plan import plan_config, saved_plan

    out = tmp_path / "out"
    run(make_plan("default", 2, "2/0", 1, fast(tiny_model_dir)), out, tmp_path / "home")
    began = saved_plan(out)
    assert began is not None and began.version and began.settings["swarm"]["offpolicy_negative_kl"] == 0.0
    # As if an older version had begun the folder with another value: the folder's value wins over today's.
    data = json.loads((out / "experiment.json").read_text())
    data["settings"]["swarm"]["offpolicy_negative_kl"] = 0.25
    (out / "experiment.json").write_text(json.dumps(data))
    assert plan_config(make_plan("default", 2, "1/1", 1, fast(tiny_model_dir))).swarm.offpolicy_negative_kl == 0.0
    grown = Experiment.widened_plan(out, make_plan("default", 2, "1/1", 1, fast(tiny_model_dir)))
    assert plan_config(grown).swarm.offpolicy_negative_kl == 0.25
    assert [m.label for m in grown.mixes] == ["2/0", "1/1"]
    # A folder begun before grpo.train_on existed trained on every informative group, whatever today's default.
    del data["settings"]["grpo"]["train_on"]
    (out / "experiment.json").write_text(json.dumps(data))
    assert plan_config(Experiment.widened_plan(out, make_plan("default", 2, "2/0", 1, fast(tiny_model_dir)))
                       ).grpo.train_on == "informative"


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes", "3", "--veterans", "3", "--veteran-rounds", "2"], "at least one node must start fresh"),
    (["--nodes", "3", "--veterans", "1"], "--veteran-rounds must be from 1"),
    (["--veteran-rounds", "4"], "--veteran-rounds needs --veterans"),
])
def test_a_bad_veterans_plan_gets_one_sentence_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "--out", str(tmp_path / "x"), "--home", str(tmp_path / "h"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_compare_and_pool_can_take_only_some_nodes_such_as_the_newcomers(tmp_path: Path) -> None:
    from bench.experiment_report import main

    _fake_experiment(tmp_path / "a", [[0.2, 0.6], [0.3, 0.5]], mix="8/4")
    _fake_experiment(tmp_path / "b", [[0.2, 0.2], [0.3, 0.3]], mix="8/0")
    newcomer = compare(tmp_path / "a", tmp_path / "b", "8/4", "8/0", nodes=[1])
    assert newcomer["nodes"] == 1 and newcomer["ratio"] == pytest.approx(1.1 / 0.5)
    assert compare(tmp_path / "a", tmp_path / "b", "8/4", "8/0", nodes=[0])["ratio"] == pytest.approx(1.0)
    pooled = pooled_compare([(tmp_path / "a", tmp_path / "b")], "8/4", "8/0", nodes=[1])
    assert pooled["ratio"] == pytest.approx(1.1 / 0.5)
    with pytest.raises(ValueError, match="--nodes must name nodes from 0 to 1"):
        compare(tmp_path / "a", tmp_path / "b", "8/4", "8/0", nodes=[2])
    pair = f"{tmp_path / 'a'},{tmp_path / 'b'}"
    assert main(["--pool", "8/4", "8/0", pair, "--nodes", "1"]) == 0
    assert main(["--pool", "8/4", "8/0", pair, "--nodes", "x"]) == 2
    assert main(["--pool", "8/4", "8/0", pair, "--nodes"]) == 2
    assert main([str(tmp_path / "nothing")]) == 2
