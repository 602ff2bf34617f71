"""One real round on the bundled SmolLM2-135M-Instruct (slow: about a minute; runs in CI)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.common.config_file import build_config
from engine.common.events import Event
from engine.common.paths import Paths
from engine.models.sources import CONVERTED_MARKER, bundled_model_dir
from engine.node.loop import Node


@pytest.mark.integration
@pytest.mark.slow
def test_real_round_on_the_bundled_model(tmp_path: Path) -> None:
    paths = Paths.under(tmp_path)
    folder = bundled_model_dir(paths.models_cache)
    assert (folder / CONVERTED_MARKER).is_file() and (folder / "model.safetensors").is_file()
    t0 = time.perf_counter()
    assert bundled_model_dir(paths.models_cache) == folder  # cached: no second conversion
    assert time.perf_counter() - t0 < 2.0

    cfg = build_config("default", None, [
        "tasks.questions_per_round=2", "tasks.completions_per_question=4", "tasks.max_new_tokens=32",
        "tasks.eval_every=0", "tasks.specialties={basic_arithmetic=1.0, calendar_arithmetic=1.0}", "run.device='cpu'",
        "run.seed=0",  # the greedy check below reads one known question
    ])
    events: list[Event] = []
    node = Node(cfg, paths, events.append)
    node.setup()
    assert node.round == 0
    metrics = node.run_round()
    assert metrics["completions"] == 8
    assert 0.0 <= metrics["reward_mean"] <= 1.0
    assert metrics["completion_tokens_mean"] > 0 and metrics["tokens_per_second"] > 0
    assert (node.checkpoint_root / "round-000001" / "adapter.safetensors").is_file()
    status = [e for e in events if e["type"] == "status"]
    assert status[0]["device"]["kind"] == "cpu" and "CPU" in status[0]["device"]["reason"]

    # The texts are real language, and the prompt elicits the answer format.
    assert node.backend is not None
    q = node.taskset.draw(1, 1)[0]
    answer = node.backend.greedy([node.backend.encode_prompt(node.taskset.messages(q))], 32)[0]
    assert "<answer>" in answer
