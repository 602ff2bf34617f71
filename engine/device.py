"""Pick the compute device: CUDA, then Apple MLX, then CPU (or what --device says).

`pick_device("auto")` returns a `DeviceInfo` that says what was chosen and
why; the reason travels in every status event. Asking explicitly for a device
that is not there is a `DeviceError`, never a silent fallback.

    python -m engine.device          # print what this machine would use
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

from engine.errors import DeviceError

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cuda", "mlx", "cpu")
# The MLX training backend is its own piece of work (issue 5). Until it lands,
# MLX is detected and reported but cannot be selected.
MLX_BACKEND_AVAILABLE = False


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cuda" | "mlx" | "cpu"
    name: str  # "NVIDIA H200", "Intel Xeon (8 threads)", ...
    memory_bytes: int  # device memory for CUDA, system RAM otherwise (0 if unknown)
    bf16: bool  # native bf16 matmuls
    reason: str  # one line: why this device

    @property
    def torch_device(self) -> str:
        return "cuda" if self.kind == "cuda" else "cpu"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        gib = self.memory_bytes / 2**30
        mem = f", {gib:.0f} GiB" if self.memory_bytes else ""
        return f"{self.name}{mem}, bf16 {'yes' if self.bf16 else 'no'} ({self.reason})"


def _system_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:  # pragma: no cover - psutil is a dependency
        return 0


def _cpu_name() -> str:
    name = platform.processor() or ""
    if not name and os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    return name or platform.machine() or "CPU"


def cpu_bf16_supported() -> bool:
    """True when this CPU has native bf16 dot products (AVX512-BF16 / AMX)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _cpu(reason: str) -> DeviceInfo:
    import torch

    return DeviceInfo(
        kind="cpu",
        name=f"{_cpu_name()} ({torch.get_num_threads()} threads)",
        memory_bytes=_system_memory(),
        bf16=cpu_bf16_supported(),
        reason=reason,
    )


def _cuda() -> DeviceInfo | None:
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        kind="cuda",
        name=props.name,
        memory_bytes=int(props.total_memory),
        bf16=bool(torch.cuda.is_bf16_supported()),
        reason=f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)",
    )


def mlx_present() -> bool:
    """Apple silicon with mlx installed (checked without importing mlx)."""
    return (
        platform.system() == "Darwin"
        and platform.machine() == "arm64"
        and importlib.util.find_spec("mlx") is not None
    )


def pick_device(requested: str = "auto") -> DeviceInfo:
    """Choose the device; see the module docstring."""
    if requested not in DEVICE_CHOICES:
        raise DeviceError(f"--device must be one of {', '.join(DEVICE_CHOICES)}, got {requested!r}.")
    if requested == "mlx":
        raise DeviceError(
            "The Apple MLX backend is not available in this version of Sapling yet; "
            "use --device cpu (or auto)."
        )
    if requested == "cpu":
        return _cpu("CPU requested")
    cuda = _cuda()
    if requested == "cuda":
        if cuda is None:
            raise DeviceError("--device cuda was asked for, but PyTorch sees no CUDA GPU on this machine.")
        return cuda
    if cuda is not None:
        return cuda
    if mlx_present() and not MLX_BACKEND_AVAILABLE:
        return _cpu("Apple MLX found, but its backend is not in this version: CPU")
    return _cpu("no CUDA device: CPU")


if __name__ == "__main__":
    print(pick_device("auto").describe())
