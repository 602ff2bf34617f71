"""The benches' common setup: the default node config, a CPU backend on the bundled model, and its task set."""

from __future__ import annotations

from typing import Any


def bundled_cpu() -> tuple[Any, Any, Any]:
    """(NodeConfig() with seed 0, TorchBackend on the CPU with the bundled model, TaskSet) as a default node builds
    them."""
    from engine.backends.torch_backend import TorchBackend
    from engine.common.config import NodeConfig, RunConfig
    from engine.common.device import pick_device
    from engine.common.paths import Paths
    from engine.models.sources import resolve_model_dir
    from engine.questions.tasks import TaskSet

    cfg = NodeConfig(run=RunConfig(seed=0))  # benches reproduce: seed 0, not the install's own
    t = cfg.tasks
    backend = TorchBackend(resolve_model_dir("bundled", Paths.default().models_cache), pick_device("cpu"), cfg.grpo,
                           cfg.run.seed, t.temperature)
    return cfg, backend, TaskSet(t.specialties, t.dataset_configs, seed=cfg.run.seed)
