"""The round loop on a tiny random model: training, resume, corruption, export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.node.clock import RoundAborted
from engine.node.loop import Node

FAST = [
    "tasks.questions_per_round=2",
    "tasks.completions_per_question=3",
    "tasks.max_new_tokens=12",
    "tasks.eval_every=2",
    "tasks.eval_questions=3",
    "grpo.micro_batch=4",
    "run.device='cpu'",
]


def fast_config(model_dir: Path, *extra: str) -> NodeConfig:
    return build_config("default", None, [*FAST, f"model.source='{model_dir}'", *extra])


def parity_reward(question: Any, completion: str) -> float:
    """A deterministic reward a random model can earn, so groups carry a gradient."""
    return float(len(completion) % 2)


def make_node(model_dir: Path, home: Path, *extra: str, events: list[Event] | None = None) -> Node:
    sink = events if events is not None else []
    node = Node(fast_config(model_dir, *extra), Paths.under(home), sink.append)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    return node


def trainable(node: Node) -> dict[str, torch.Tensor]:
    assert node.backend is not None
    return {k: v.clone() for k, v in node.backend._trainable_state().items()}  # type: ignore[attr-defined]


def test_a_round_changes_the_weights(tiny_model_dir: Path, home: Path) -> None:
    events: list[Event] = []
    node = make_node(tiny_model_dir, home, events=events)
    before = trainable(node)
    metrics = node.run_round()
    after = trainable(node)
    assert metrics["round"] == 1 and metrics["informative_groups"] > 0
    own = metrics["own_group_rewards"]  # each own group's specialty and rewards, as drawn
    assert len(own) == metrics["local_groups"] and all(len(rewards) == node.config.tasks.completions_per_question
                                                       for _, rewards in own)
    assert sum(len(set(rewards)) > 1 for _, rewards in own) == metrics["informative_groups"]  # no swarm here
    assert any(not torch.equal(before[k], after[k]) for k in before)
    kinds = [e["type"] for e in events]
    assert {"status", "progress", "checkpoint", "round"} <= set(kinds)
    phases = {e["phase"] for e in events if e["type"] == "progress"}
    assert {"generating", "scoring", "training"} <= phases


def test_train_on_passed_trains_only_on_groups_with_full_marks(tiny_model_dir: Path, home: Path) -> None:
    node = make_node(tiny_model_dir, home, "grpo.train_on='passed'", "tasks.completions_per_question=6")
    node.taskset.reward = lambda q, text: 0.5 * (len(text) % 2)  # type: ignore[method-assign]  # partial only
    before = trainable(node)
    metrics = node.run_round()
    assert metrics["informative_groups"] > 0 and metrics["trained_groups"] == 0
    assert all(torch.equal(before[k], v) for k, v in trainable(node).items())  # nothing trained: no step
    node.taskset.reward = parity_reward  # type: ignore[method-assign]  # now the odd answers pass
    metrics = node.run_round()
    assert metrics["trained_groups"] == metrics["informative_groups"] > 0
    assert any(not torch.equal(before[k], v) for k, v in trainable(node).items())
    with pytest.raises(ConfigError, match="train_on"):
        fast_config(tiny_model_dir, "grpo.train_on='all'")


def test_full_finetuning_changes_base_weights(tiny_model_dir: Path, home: Path) -> None:
    node = make_node(tiny_model_dir, home, "grpo.finetune='full'", "grpo.kl_beta=0.05")
    assert node.backend is not None
    weight = node.backend.model.get_input_embeddings().weight  # type: ignore[attr-defined]
    before = weight.detach().clone()
    metrics = node.run_round()
    assert not torch.equal(before, weight.detach())
    assert metrics["kl"] >= 0.0


def test_lost_metrics_line_is_restored_from_the_checkpoint(tiny_model_dir: Path, home: Path) -> None:
    node = make_node(tiny_model_dir, home)
    node.run_round()
    node.metrics.path.unlink()  # as if the process died between checkpoint and append
    again = make_node(tiny_model_dir, home)
    assert [r["round"] for r in again.metrics.read()] == [1]


def test_corrupt_latest_checkpoint_falls_back_with_a_warning(
    tiny_model_dir: Path, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = make_node(tiny_model_dir, home)
    node.run_round()
    node.run_round()
    latest = node.checkpoint_root / "round-000002" / "adapter.safetensors"
    latest.write_bytes(latest.read_bytes()[:100])  # truncated by a full disk, say
    resumed = make_node(tiny_model_dir, home)
    assert resumed.round == 1
    assert "unusable" in caplog.text
    assert any(p.name.startswith("round-000002") for p in (node.checkpoint_root / "corrupt").iterdir())


def test_stop_before_training_keeps_the_last_checkpoint(tiny_model_dir: Path, home: Path) -> None:
    node = make_node(tiny_model_dir, home)
    node.run_round()
    before = trainable(node)
    node.control.stop()
    with pytest.raises(RoundAborted):
        node.run_round()
    assert node.round == 1
    assert all(torch.equal(v, trainable(node)[k]) for k, v in before.items())


def test_run_loop_evaluates_and_stops_at_max_rounds(tiny_model_dir: Path, home: Path) -> None:
    events: list[Event] = []
    node = make_node(tiny_model_dir, home, "run.max_rounds=2", events=events)
    assert node.run() == 2
    evals = [e["round"] for e in events if e["type"] == "eval"]
    assert evals == [0, 2]  # baseline, then every eval_every rounds
    assert events[-1]["type"] == "status" and events[-1]["state"] == "stopped"
    kinds = [(r["kind"], r["round"]) for r in node.metrics.read()]
    assert kinds == [("eval", 0), ("round", 1), ("round", 2), ("eval", 2)]


def test_export_is_a_loadable_merged_model(tiny_model_dir: Path, home: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    node = make_node(tiny_model_dir, home)
    node.run_round()
    assert node.backend is not None
    prompt = node.backend.encode_prompt([{"role": "user", "content": "What is 2 + 2?"}])
    expected = node.backend.greedy([prompt], 8)[0]
    out = tmp_path / "export"
    node.backend.export(out)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    gen = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    text = tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert (out / "model.safetensors").is_file() and (out / "chat_template.jinja").is_file()
    assert text == expected


@pytest.mark.parametrize(("cap", "informative", "wanted"), [(0, 1, 4), (3, 1, 2), (3, 3, 0), (3, 5, 0), (8, 1, 4)])
def test_train_groups_fills_the_batch_with_swarm_groups_up_to_the_cap(
    tiny_model_dir: Path, home: Path, cap: int, informative: int, wanted: int
) -> None:
    from engine.rollouts.groups import Group

    node = Node(fast_config(tiny_model_dir, "swarm.external_groups=4", f"swarm.train_groups={cap}"),
                Paths.under(home), [].append)
    question = node.taskset.draw(1, 1)[0]
    groups = [Group(question, [], [], [0.0, 1.0], [-1.0, 1.0] if i < informative else [0.0, 0.0]) for i in range(6)]
    assert node.external_wanted(1, groups) == wanted


def test_with_train_on_passed_the_cap_counts_only_own_groups_it_trains_on(tiny_model_dir: Path, home: Path) -> None:
    from engine.rollouts.groups import Group

    node = Node(fast_config(tiny_model_dir, "swarm.external_groups=4", "swarm.train_groups=4",
                            "grpo.train_on='passed'"), Paths.under(home), [].append)
    question = node.taskset.draw(1, 1)[0]
    passed = [Group(question, [], [], [0.0, 1.0], [-1.0, 1.0]) for _ in range(2)]
    partial = [Group(question, [], [], [0.0, 0.1], [-1.0, 1.0]) for _ in range(2)]
    assert node.external_wanted(1, passed + partial) == 2  # the partial-credit pair leaves room for two
