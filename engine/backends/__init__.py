"""Training backends: the policy that samples and learns, the protocol in `base`, `load_backend` to pick one.

- `base`: what a backend is (`PolicyBackend`) and what it takes and returns (`Completion`, `TrainItem`);
- `torch_backend` (CPU, CUDA) and `mlx_backend` (Apple MLX); `loss`: the GRPO loss in torch;
- `adapter_slots`: several LoRA adapters over one frozen torch model (the experiment's nodes);
- `steps`, `batching`, `train_forward`, `train_lanes`, `memory`: the training step's parts;
- `decode`, `decode_model`, `decode_shapes`, `kv_cache`, `lora`, `hf_generate`: sampling;
- `mlx_decode` and `mlx_loss`: the MLX backend's decoder and its GRPO loss.

The backends import engine.common and each other: nothing of the round loop, the questions or the
swarm (tests/test_boundaries.py).

Heavy imports (torch, peft, mlx) live inside the backend modules, so
`import engine.backends` stays cheap. `load_backend` picks the module from the
chosen device: `mlx_backend` (mlx-lm) for Apple MLX, `torch_backend`
(transformers + peft) for CUDA and the CPU. docs/backends.md compares them.
"""

from __future__ import annotations

from pathlib import Path

from engine.backends.base import PolicyBackend, PromptCache, StepCallback
from engine.common.config import GRPOConfig
from engine.common.device import MLX_INSTALL_HINT, DeviceInfo
from engine.common.errors import DeviceError

__all__ = ["PolicyBackend", "PromptCache", "StepCallback", "load_backend"]


def load_backend(model_dir: Path, device: DeviceInfo, grpo: GRPOConfig, seed: int, temperature: float) -> PolicyBackend:
    """The backend for the chosen device: MLX for "mlx", torch for "cuda" and "cpu"."""
    if device.kind == "mlx":
        try:
            from engine.backends.mlx_backend import MLXBackend
        except ImportError as exc:
            raise DeviceError(f"The MLX backend could not start ({exc}); use --device cpu, or "
                              f"{MLX_INSTALL_HINT}.") from exc

        return MLXBackend(model_dir, device, grpo, seed=seed, temperature=temperature)
    if device.kind in ("cpu", "cuda"):
        from engine.backends.torch_backend import TorchBackend

        return TorchBackend(model_dir, device, grpo, seed=seed, temperature=temperature)
    raise DeviceError(f"No training backend for device {device.kind!r}; use --device cpu.")
