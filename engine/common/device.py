"""Pick the compute device: Apple MLX, CUDA or the CPU (or what --device says).

`pick_device("auto")` returns a `DeviceInfo` that says what was chosen and
why; the reason travels in every status event:

- an Apple-silicon Mac with mlx installed trains with MLX on the Metal GPU
  ("Apple M2, MLX 0.32, Metal");
- a machine where PyTorch sees a CUDA GPU trains with torch on CUDA
  ("CUDA 12.8, 1 device(s)");
- anything else trains with torch on the CPU ("no CUDA device: CPU").

The two accelerated cases never meet (Macs have no CUDA), so the order only
matters for cost: MLX is checked first, which spares a Mac importing torch to
learn that it has no CUDA. Asking explicitly for a device that is not there
is a `DeviceError`, never a silent fallback. `--device mlx` also works on
Linux with `pip install "sapling[mlx-cpu]"` (MLX on the CPU, for testing).

    python -m engine.common.device          # print what this machine would use
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.common.errors import DeviceError

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cuda", "mlx", "cpu")
MLX_ON_CPU = "(MLX on CPU)"
MLX_INSTALL_HINT = "pip install 'sapling[mlx]' on an Apple-silicon Mac ('sapling[mlx-cpu]' on Linux, for testing)"


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cuda" | "mlx" | "cpu"
    name: str  # "NVIDIA H200", "Apple M2", "Intel Xeon (8 threads)", ...
    memory_bytes: int  # device memory for CUDA, unified/system RAM otherwise (0 if unknown)
    bf16: bool  # native bf16 matmuls
    reason: str  # one line: why this device

    @property
    def torch_device(self) -> str:
        return "cuda" if self.kind == "cuda" else "cpu"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """Every detail, for logs and `python -m engine.common.device`."""
        gib = self.memory_bytes / 2**30
        mem = f", {gib:.0f} GiB" if self.memory_bytes else ""
        return f"{self.name}{mem}, bf16 {'yes' if self.bf16 else 'no'} ({self.reason})"

    def plain(self) -> str:
        """Where training runs, in a few plain words for a status line: "the processor", "the NVIDIA H200 graphics
        card"."""
        if self.kind == "cuda":
            return f"the {self.name} graphics card"
        if self.kind == "mlx" and not self.name.endswith(MLX_ON_CPU):
            return f"the {self.name} graphics"
        return "the processor"


def _system_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:  # pragma: no cover - psutil is a dependency
        return 0


def cpu_name() -> str:
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
        name=f"{cpu_name()} ({torch.get_num_threads()} threads)",
        memory_bytes=_system_memory(),
        bf16=cpu_bf16_supported(),
        reason=reason,
    )


def cuda_bf16(capability: tuple[int, int]) -> bool:
    """Native bf16 tensor cores: Ampere (compute capability 8.0) and newer.

    `torch.cuda.is_bf16_supported()` also says yes on older GPUs, where bf16
    is emulated and slower than fp32; those train in fp32.
    """
    return capability >= (8, 0)


def _cuda() -> DeviceInfo | None:
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        kind="cuda",
        name=props.name,
        memory_bytes=int(props.total_memory),
        bf16=cuda_bf16((props.major, props.minor)),
        reason=f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)",
    )


def apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def mlx_installed() -> bool:
    """mlx and mlx-lm importable (checked without importing them)."""
    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def mlx_version() -> str:
    """Major.minor of the installed mlx, e.g. "0.32"."""
    try:
        return ".".join(importlib.metadata.version("mlx").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _apple_chip() -> str:
    """'Apple M2 Pro' from sysctl; 'Apple silicon' when that fails."""
    try:
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5, check=False
        )
        return out.stdout.strip() or "Apple silicon"
    except (OSError, subprocess.SubprocessError):
        return "Apple silicon"


def apple_bf16(chip: str) -> bool:
    """M2 and later GPUs have native bf16; the M1 family emulates it."""
    return not chip.startswith("Apple M1")


# A macOS virtual machine (GitHub's macOS runners among them) shows its GPU as "Apple Paravirtual device":
# Metal answers, but MLX has crashed on it, and it is no GPU to train on. It counts as no Metal.
PARAVIRTUAL_METAL = "Paravirtual"


def metal_usable(metal: bool, info: dict[str, Any]) -> bool:
    """Metal that MLX can train on: available, and not a virtual machine's paravirtual device."""
    return metal and PARAVIRTUAL_METAL not in str(info.get("device_name", ""))


def _mlx_probe() -> tuple[bool, dict[str, Any]]:
    """(Metal available, mx.device_info()) from an actual import of mlx."""
    import mlx.core as mx

    metal = bool(mx.metal.is_available())
    try:
        info = dict(mx.device_info())
    except (AttributeError, RuntimeError):
        info = {}
    return metal, info


def _mlx(require_metal: bool = False) -> DeviceInfo | None:
    """MLX on Metal where there is Metal, else MLX on the CPU (None if `require_metal`); None without mlx."""
    if not mlx_installed():
        return None
    metal, info = _mlx_probe()
    version = mlx_version()
    if metal_usable(metal, info):
        chip = str(info.get("device_name") or _apple_chip())
        return DeviceInfo(
            kind="mlx",
            name=chip,
            memory_bytes=int(info.get("memory_size") or _system_memory()),
            bf16=apple_bf16(chip),
            reason=f"{chip}, MLX {version}, Metal",
        )
    if require_metal:
        return None
    return DeviceInfo(
        kind="mlx",
        name=f"{cpu_name()} {MLX_ON_CPU}",
        memory_bytes=_system_memory(),
        bf16=False,
        reason=f"MLX {version} on CPU, no Metal" if not metal
        else f"MLX {version} on CPU, {info.get('device_name')} is "
        "a virtual machine's GPU, not one to train on",
    )


def pick_device(requested: str = "auto") -> DeviceInfo:
    """Choose the device; see the module docstring."""
    if requested not in DEVICE_CHOICES:
        raise DeviceError(f"--device must be one of {', '.join(DEVICE_CHOICES)}, got {requested!r}.")
    if requested == "cpu":
        return _cpu("CPU requested")
    if requested == "mlx":
        mlx = _mlx()
        if mlx is None:
            raise DeviceError(f"--device mlx was asked for, but mlx and mlx-lm are not installed: {MLX_INSTALL_HINT}.")
        return mlx
    if requested == "cuda":
        cuda = _cuda()
        if cuda is None:
            raise DeviceError("--device cuda was asked for, but PyTorch sees no CUDA GPU on this machine.")
        return cuda
    if apple_silicon():
        if mlx_installed():
            mlx = _mlx(require_metal=True)
            return mlx if mlx is not None else _cpu(f"MLX {mlx_version()} sees no Metal GPU: CPU")
        return _cpu(f"{_apple_chip()} without MLX (pip install 'sapling[mlx]'): CPU")
    cuda = _cuda()
    if cuda is not None:
        return cuda
    if nvidia_gpu_present() and not torch_has_cuda():
        return _cpu(NVIDIA_CPU_BUILD_REASON)
    return _cpu("no CUDA device: CPU")


# Shown by the app under the device line (docs/installing.md, "NVIDIA GPUs").
NVIDIA_CPU_BUILD_REASON = (
    "NVIDIA GPU found, but this is the CPU build of PyTorch (the CUDA download of Sapling would use the GPU): CPU"
)


def nvidia_gpu_present() -> bool:
    """An NVIDIA driver is installed (its nvidia-smi tool is there), whatever PyTorch can see."""
    if shutil.which("nvidia-smi"):
        return True
    if os.name == "nt":
        root = os.environ.get("SystemRoot", r"C:\Windows")
        return Path(root, "System32", "nvidia-smi.exe").is_file()
    return False


def torch_has_cuda() -> bool:
    """This PyTorch was built with CUDA (a GPU may still be missing)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None


if __name__ == "__main__":
    print(pick_device("auto").describe())
