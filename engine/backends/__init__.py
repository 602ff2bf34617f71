"""Training backends: one Protocol here, one module per backend.

Heavy imports (torch, peft, mlx) live inside the backend modules, so
`import engine.backends` stays cheap. `load_backend` picks the module from the
chosen device: `mlx_backend` (mlx-lm) for Apple MLX, `torch_backend`
(transformers + peft) for CUDA and the CPU. docs/backends.md compares them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from engine.config import GRPOConfig
from engine.device import MLX_INSTALL_HINT, DeviceInfo
from engine.errors import DeviceError
from engine.rollouts import Completion, TrainItem

# Called with (steps done, steps total); may block (pause) or raise (stop).
StepCallback = Callable[[int, int], None]


class PolicyBackend(Protocol):
    """What the round loop needs from a model: sample, score text, learn, persist."""

    device: DeviceInfo
    eos_token_id: int

    def encode_prompt(self, messages: list[dict[str, str]]) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def encode_completion(self, text: str) -> list[int]: ...

    def generate(
        self,
        prompts: Sequence[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        on_step: StepCallback | None = None,
    ) -> list[Completion]: ...

    def greedy(self, prompts: Sequence[list[int]], max_new_tokens: int, on_step: StepCallback | None = None) -> list[str]: ...

    def behaviour_logprobs(self, items: Sequence[tuple[list[int], list[int]]], temperature: float) -> list[list[float]]: ...

    def train(self, items: Sequence[TrainItem], on_step: StepCallback | None = None) -> dict[str, float]: ...

    def reseed(self, seed: int) -> None: ...

    def apply_settings(self, grpo: GRPOConfig, temperature: float) -> None:
        """Take reloaded settings (learning rate, clipping, temperature...); the model's shape is unchanged."""
        ...

    def save(self, folder: Path) -> list[str]: ...

    def load(self, folder: Path) -> None: ...

    def export(self, folder: Path) -> None: ...

    def rng_state(self) -> dict[str, Any]: ...


def load_backend(model_dir: Path, device: DeviceInfo, grpo: GRPOConfig, seed: int, temperature: float) -> PolicyBackend:
    """The backend for the chosen device: MLX for "mlx", torch for "cuda" and "cpu"."""
    if device.kind == "mlx":
        try:
            from engine.backends.mlx_backend import MLXBackend
        except ImportError as exc:
            raise DeviceError(f"The MLX backend could not start ({exc}); use --device cpu, or {MLX_INSTALL_HINT}.") from exc

        return MLXBackend(model_dir, device, grpo, seed=seed, temperature=temperature)
    if device.kind in ("cpu", "cuda"):
        from engine.backends.torch_backend import TorchBackend

        return TorchBackend(model_dir, device, grpo, seed=seed, temperature=temperature)
    raise DeviceError(f"No training backend for device {device.kind!r}; use --device cpu.")
