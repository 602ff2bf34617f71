"""What every training backend must do, run on each: torch on the CPU, and MLX where mlx imports.

- sampling records the policy's own log-probs (the trainer recomputes the same);
- a crash mid-round resumes to the same weights as a run that never stopped;
- a stop during training takes effect inside the step, changes nothing saved,
  and the resumed run still reaches the same weights;
- a settings reload really changes the learning rate.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.backends import PolicyBackend, load_backend
from engine.common.config import GRPOConfig, NodeConfig, with_changes
from engine.common.config_file import build_config
from engine.common.device import pick_device
from engine.common.events import Event
from engine.common.paths import Paths
from engine.node.clock import Control, RoundAborted
from engine.node.loop import Node
from tests.engine.test_train_forward import fp32_logprob_tolerance

HAVE_MLX = importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None
DEVICES = ["cpu", pytest.param("mlx", marks=pytest.mark.skipif(not HAVE_MLX, reason="mlx is not installed"))]

FAST = [
    "tasks.questions_per_round=2",
    "tasks.completions_per_question=3",
    "tasks.max_new_tokens=12",
    "tasks.eval_every=0",
    "grpo.micro_batch=4",
]


def parity_reward(question: Any, completion: str) -> float:
    """A deterministic reward a random model can earn, so groups carry a gradient."""
    return float(len(completion) % 2)


def fast_config(model_dir: Path, device: str, *extra: str) -> NodeConfig:
    # run.seed=0: a run in one home must repeat in another (the default seed is each install's own)
    return build_config("default", None,
                        [*FAST, "run.seed=0", f"run.device='{device}'", f"model.source='{model_dir}'", *extra])


def make_node(model_dir: Path, home: Path, device: str, *extra: str, events: list[Event] | None = None,
              control: Control | None = None) -> Node:
    sink = events if events is not None else []
    node = Node(fast_config(model_dir, device, *extra), Paths.under(home), sink.append, control)
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.setup()
    return node


def trainable(node: Node) -> dict[str, np.ndarray]:
    assert node.backend is not None
    state = node.backend._trainable_state()  # type: ignore[attr-defined]
    return {k: np.array(v.float() if hasattr(v, "float") else v) for k, v in state.items()}


def same_weights(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """Bit for bit: a resumed run repeats the computations of a run that never stopped (the same weights, read
    back exactly, the same seeds, the same kernels on the suite's one thread), so nothing may differ at all."""
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def largest_change(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def adam_steps_bound(steps: int, lr: float, betas: tuple[float, float] = (0.9, 0.999)) -> float:
    """How far `steps` AdamW steps (weight decay 0, bias corrected) can move a weight, at most.

    Step t moves it by lr |m_t| / (sqrt(v_t) + eps) with m and v bias corrected; by Cauchy-Schwarz over the
    gradients so far, |m_t| / sqrt(v_t) <= (1 - b1) / sqrt(1 - b2) * sqrt(sum_k<t (b1**2 / b2)**k) *
    sqrt(1 - b2**t) / (1 - b1**t) (1 at t = 1, about 1 for the first steps). fp32 then stores the float nearest
    w - d, which is no further from w - d than w itself: the weight moves by at most 2 |d| each step."""
    b1, b2 = betas
    total = 0.0
    for t in range(1, steps + 1):
        ratio = (1 - b1) / (1 - b2) ** 0.5 * sum((b1**2 / b2) ** k for k in range(t)) ** 0.5
        total += 2 * lr * ratio * (1 - b2**t) ** 0.5 / (1 - b1**t)
    return total


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_behaviour_logprobs_match_the_trainers_recomputation(
    tiny_model_dir: Path, device: str, temperature: float, finetune: str
) -> None:
    backend: PolicyBackend = load_backend(
        tiny_model_dir, pick_device(device), GRPOConfig(precision="fp32", finetune=finetune), 0, temperature
    )
    prompts = [
        backend.encode_prompt([{"role": "user", "content": "What is 2 + 2?"}]),
        backend.encode_prompt([{"role": "user", "content": "Hi"}]),  # shorter: left padding in play
    ]
    completions = backend.generate(prompts, 3, max_new_tokens=12, temperature=temperature)
    assert len(completions) == 6
    pairs = [(prompts[i // 3], c.token_ids) for i, c in enumerate(completions)]
    recomputed = backend.behaviour_logprobs(pairs, temperature)
    # Sampling and the trainer sum in other orders (the decoder's cache, the packed forward): within the rounding
    # of their sums (`fp32_logprob_tolerance`), from the model's own weights (the adapters start at B = 0).
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    eps = fp32_logprob_tolerance(model, max(len(p) + len(c) for p, c in pairs), temperature)
    for completion, again in zip(completions, recomputed, strict=True):
        assert len(completion.logprobs) == len(completion.token_ids) == len(again)
        assert completion.logprobs == pytest.approx(again, rel=0, abs=eps)
        assert completion.finished == (completion.token_ids[-1] == backend.eos_token_id)


@pytest.mark.parametrize("device", DEVICES)
def test_crash_resumes_at_the_right_round_with_the_same_rollouts(tiny_model_dir: Path, tmp_path: Path,
                                                                 device: str) -> None:
    straight = make_node(tiny_model_dir, tmp_path / "a", device)
    for _ in range(3):
        straight.run_round()
    expected = straight.metrics.read()[-1]

    # Crashed: round 3 dies in training, after its rollouts, before its checkpoint.
    crashed = make_node(tiny_model_dir, tmp_path / "b", device)
    crashed.run_round()
    crashed.run_round()
    real_step = crashed._step

    def boom(done: int, total: int) -> None:
        raise RuntimeError("simulated crash")

    crashed._step = lambda phase: boom if phase == "training" else real_step(phase)  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.run_round()

    resumed = make_node(tiny_model_dir, tmp_path / "b", device)
    assert resumed.round == 2
    assert [q.ref for q in resumed.taskset.draw(3, 2)] == [q.ref for q in straight.taskset.draw(3, 2)]
    got = resumed.run_round()
    for key in ("round", "reward_mean", "completion_tokens_mean", "informative_groups", "loss", "grad_norm"):
        assert got[key] == expected[key], key  # the same computations (`same_weights`): the same numbers
    assert same_weights(trainable(straight), trainable(resumed))
    assert [r["round"] for r in resumed.metrics.read() if r["kind"] == "round"] == [1, 2, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_a_stop_during_training_ends_inside_the_step_and_resumes_exactly(
    tiny_model_dir: Path, tmp_path: Path, device: str
) -> None:
    straight = make_node(tiny_model_dir, tmp_path / "a", device)
    straight.run_round()
    straight.run_round()

    control = Control()
    stopped_at: list[float] = []

    def on_event(event: Event) -> None:
        # The first sign of training: the stop arrives while the step is under way.
        if event["type"] == "progress" and event["phase"] == "training" and not stopped_at:
            stopped_at.append(time.monotonic())
            control.stop()

    node = make_node(tiny_model_dir, tmp_path / "b", device, control=control)
    node.emit = lambda event: None
    node.run_round()
    saved = trainable(node)
    node.emit = on_event
    steps: list[int] = []
    assert node.backend is not None
    if device == "cpu":  # torch: count optimiser steps (MLX's optimizer.step is a read-only counter)
        optimizer = node.backend.optimizer  # type: ignore[attr-defined]
        real_step = optimizer.step
        optimizer.step = lambda *a, **k: (steps.append(1), real_step(*a, **k))[1]
    with pytest.raises(RoundAborted):
        node.run_round()
    assert stopped_at and time.monotonic() - stopped_at[0] < 2.0
    if device == "cpu":
        assert steps == [], "the stop should land inside the step, before the optimiser"
    assert node.round == 1

    resumed = make_node(tiny_model_dir, tmp_path / "b", device)
    assert resumed.round == 1 and same_weights(trainable(resumed), saved)
    resumed.run_round()
    assert same_weights(trainable(straight), trainable(resumed))


@pytest.mark.parametrize("device", DEVICES)
def test_a_reload_really_changes_the_learning_rate(tiny_model_dir: Path, tmp_path: Path, device: str) -> None:
    """AdamW's first step moves a weight by lr * g / (|g| + eps): about lr for any gradient well above eps, so
    the default rate moves some adapter weight by more than lr / 2; at the reloaded rate, 3 more steps can move
    none by more than `adam_steps_bound`, about 6e-12."""
    node = make_node(tiny_model_dir, tmp_path / "n", device)
    assert node.config.grpo.weight_decay == 0 and node.config.grpo.pg_steps == 1  # as `adam_steps_bound` counts
    before = trainable(node)
    node.run_round()
    rate = node.config.grpo.learning_rate
    assert largest_change(before, trainable(node)) > rate / 2
    new = with_changes(node.config, grpo={"learning_rate": 1e-12})
    node.reload_config = lambda: new
    node.apply_reload()
    assert node.config.grpo.learning_rate == 1e-12
    node.taskset.reward = parity_reward  # type: ignore[method-assign]  # the reload built a new task set
    before = trainable(node)
    rounds = [node.run_round() for _ in range(3)]
    assert sum(r["train_tokens"] for r in rounds) > 0  # it did train ...
    bound = adam_steps_bound(1 + len(rounds), 1e-12) - adam_steps_bound(1, 1e-12)  # steps 2 to 4
    assert largest_change(before, trainable(node)) <= bound  # ... at the reloaded rate


def test_pause_during_training_blocks_inside_the_step_until_resume(tiny_model_dir: Path, tmp_path: Path) -> None:
    control = Control()
    paused = threading.Event()
    events: list[Event] = []

    def on_event(event: Event) -> None:
        events.append(event)
        if event["type"] == "progress" and event["phase"] == "training" and not control.paused and not paused.is_set():
            control.pause()
        if event["type"] == "status" and event["state"] == "paused":
            paused.set()

    node = make_node(tiny_model_dir, tmp_path / "p", "cpu", control=control)
    node.emit = on_event
    worker = threading.Thread(target=node.run_round)
    worker.start()
    assert paused.wait(30), "the node never said it paused"
    assert worker.is_alive() and node.round == 0  # held inside the round, nothing saved
    control.resume()
    worker.join(60)
    assert not worker.is_alive() and node.round == 1
    states = [e["state"] for e in events if e["type"] == "status"]
    assert states[-2:] == ["paused", "training"]
