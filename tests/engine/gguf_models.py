"""What the export and Try it tests make for a run: its settings on a given model folder, and a LoRA checkpoint
whose adapters are not zero."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.paths import Paths
from engine.node.checkpoint import save_checkpoint


def gguf_config(model: Path, *extra: str) -> NodeConfig:
    """The default settings on the model folder `model`, on the CPU in fp32 (what the exports are compared in)."""
    return build_config("default", None,
                        [f"model.source='{model}'", "run.device='cpu'", "grpo.precision='fp32'", *extra])


def lora_checkpoint(config: NodeConfig, paths: Paths, round_index: int, seed: int = 1) -> Any:
    """A LoRA checkpoint whose adapters are not zero (peft starts B at zero), as training leaves them."""
    import torch

    from engine.backends.torch_backend import TorchBackend
    from engine.common.device import pick_device
    from engine.models.sources import resolve_model_dir

    backend = TorchBackend(resolve_model_dir(config.model.source, paths.models_cache), pick_device("cpu"),
                           config.grpo, seed=0, temperature=1.0)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    state = {"structure_hash": config.structure_hash(), "config_hash": config.config_hash(), "metrics": {}}
    save_checkpoint(paths.checkpoints(config.run.run_name), round_index, backend.save, state, keep=3)
    return backend
