"""Device choice (MLX on Apple silicon, CUDA, CPU; --device) and the CUDA path, without a GPU.

The machine probes (`apple_silicon`, `mlx_installed`, `_mlx_probe`, `_cuda`,
torch.cuda) are replaced to play a Mac or an NVIDIA PC; the CUDA training
path's out-of-memory handling runs on the CPU with a simulated OOM.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from engine.backends.base import TrainItem
from engine.backends.batching import MicroBatchBudget, memory_scale
from engine.common import device as dev
from engine.common.config import GRPOConfig
from engine.common.device import DeviceInfo, pick_device
from engine.common.errors import DeviceError

GIB = 1 << 30
HAS_MLX = importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def no_cuda_probe() -> None:
    raise AssertionError("a Mac with MLX must not import torch to look for CUDA")


def play_mac(monkeypatch: pytest.MonkeyPatch, chip: str, mlx: bool = True, metal: bool = True) -> None:
    monkeypatch.setattr(dev, "apple_silicon", lambda: True)
    monkeypatch.setattr(dev, "mlx_installed", lambda: mlx)
    monkeypatch.setattr(dev, "mlx_version", lambda: "0.32")
    monkeypatch.setattr(dev, "_apple_chip", lambda: chip)
    monkeypatch.setattr(dev, "_mlx_probe",
                        lambda: (metal, {"device_name": chip, "memory_size": 16 * GIB} if metal else {}))
    monkeypatch.setattr(dev, "_cuda", no_cuda_probe)


def play_linux(monkeypatch: pytest.MonkeyPatch, cuda: DeviceInfo | None) -> None:
    monkeypatch.setattr(dev, "apple_silicon", lambda: False)
    monkeypatch.setattr(dev, "_cuda", lambda: cuda)


H200 = DeviceInfo("cuda", "NVIDIA H200", 139 * GIB, True, "CUDA 12.8, 1 device(s)")


# -- the choice ---------------------------------------------------------------------
def test_apple_silicon_with_mlx_trains_on_metal(monkeypatch: pytest.MonkeyPatch) -> None:
    play_mac(monkeypatch, "Apple M2")
    info = pick_device("auto")
    assert (info.kind, info.name, info.memory_bytes, info.bf16) == ("mlx", "Apple M2", 16 * GIB, True)
    assert info.reason == "Apple M2, MLX 0.32, Metal"


def test_an_m1_has_no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    play_mac(monkeypatch, "Apple M1 Pro")
    assert pick_device("auto").bf16 is False


def test_a_mac_without_mlx_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    play_mac(monkeypatch, "Apple M3", mlx=False)
    info = pick_device("auto")
    assert info.kind == "cpu" and "Apple M3 without MLX" in info.reason and "sapling[mlx]" in info.reason
    with pytest.raises(DeviceError, match=r"sapling\[mlx\]"):
        pick_device("mlx")


def test_mlx_without_metal_is_not_chosen_automatically(monkeypatch: pytest.MonkeyPatch) -> None:
    play_mac(monkeypatch, "Apple M2", metal=False)
    info = pick_device("auto")
    assert info.kind == "cpu" and "no Metal" in info.reason


def test_cuda_is_chosen_where_there_is_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    play_linux(monkeypatch, H200)
    assert pick_device("auto") == H200
    assert pick_device("cuda") == H200
    assert pick_device("cpu").kind == "cpu"  # the override wins


def test_nothing_else_means_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    play_linux(monkeypatch, None)
    monkeypatch.setattr(dev, "nvidia_gpu_present", lambda: False)
    info = pick_device("auto")
    assert info.kind == "cpu" and info.reason == "no CUDA device: CPU"
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        pick_device("cuda")


def test_an_nvidia_gpu_with_the_cpu_build_of_torch_is_pointed_at_the_cuda_download(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    play_linux(monkeypatch, None)
    monkeypatch.setattr(dev, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(dev, "torch_has_cuda", lambda: False)
    info = pick_device("auto")
    assert info.kind == "cpu" and info.reason == dev.NVIDIA_CPU_BUILD_REASON
    assert "CUDA download" in info.reason
    monkeypatch.setattr(dev, "torch_has_cuda", lambda: True)  # a CUDA build that sees no GPU: no hint
    assert pick_device("auto").reason == "no CUDA device: CPU"


def test_an_unknown_device_is_a_user_error() -> None:
    with pytest.raises(DeviceError, match="auto, cuda, mlx, cpu"):
        pick_device("tpu")


@pytest.mark.skipif(not HAS_MLX, reason="needs mlx[cpu] (pip install -e '.[mlx-cpu]')")
def test_device_mlx_on_linux_runs_mlx_on_the_cpu() -> None:
    info = pick_device("mlx")
    assert info.kind == "mlx" and info.bf16 is False
    assert info.reason.startswith(f"MLX {dev.mlx_version()} on CPU")


def test_mlx_asked_for_but_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "mlx_installed", lambda: False)
    with pytest.raises(DeviceError, match="mlx and mlx-lm are not installed"):
        pick_device("mlx")


@pytest.mark.integration
def test_choosing_a_backend_module_imports_no_framework() -> None:
    """engine.common.device and engine.backends stay cheap: torch and mlx load only when a device is picked."""
    code = (
        "import sys, engine.common.device, engine.backends, engine.backends.batching\n"
        "print(','.join(m for m in ('torch', 'mlx', 'mlx_lm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- CUDA details -------------------------------------------------------------------
@pytest.mark.parametrize(("gpu", "major", "minor", "bf16"), [
    ("Tesla T4", 7, 5, False),  # Turing: bf16 only emulated
    ("NVIDIA A100", 8, 0, True),
    ("NVIDIA H200", 9, 0, True),
])
def test_cuda_bf16_needs_ampere_or_newer(monkeypatch: pytest.MonkeyPatch, gpu: str, major: int, minor: int,
                                         bf16: bool) -> None:
    props = SimpleNamespace(name=gpu, total_memory=16 * GIB, major=major, minor=minor)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what torch says even on a T4
    info = dev._cuda()
    assert info is not None and (info.kind, info.name, info.bf16) == ("cuda", gpu, bf16)


def test_the_default_micro_batch_grows_with_gpu_memory() -> None:
    cpu = DeviceInfo("cpu", "cpu", 24 * GIB, True, "")
    small = DeviceInfo("cuda", "RTX 3060", 12 * GIB, True, "")
    mac = DeviceInfo("mlx", "Apple M2", 16 * GIB, True, "")
    assert [memory_scale(d) for d in (cpu, small, mac, H200)] == [1, 1, 1, 17]
    assert MicroBatchBudget(H200).limits(GRPOConfig()) == (8 * 17, 1024 * 17)
    assert MicroBatchBudget(cpu).limits(GRPOConfig()) == (8, 1024)
    # A budget the user chose is left alone.
    assert MicroBatchBudget(H200).limits(GRPOConfig(micro_batch=4, micro_batch_tokens=512)) == (4, 512)


def test_halving_stops_at_one_sequence() -> None:
    budget = MicroBatchBudget(DeviceInfo("cuda", "gpu", 8 * GIB, True, ""))
    grpo = GRPOConfig(micro_batch=4)
    assert budget.halve(grpo) and budget.limits(grpo) == (2, 512)
    assert budget.halve(grpo) and budget.limits(grpo)[0] == 1
    assert not budget.halve(grpo) and budget.limits(grpo)[0] == 1


# -- CUDA out of memory, simulated on the CPU ------------------------------------------------
def oom_on_big_chunks(backend: Any, rows: int) -> None:
    real = backend.batch_logprobs

    def fragile(pairs: Any, temperature: float) -> Any:
        if len(pairs) > rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(pairs, temperature)

    backend.batch_logprobs = fragile


def tiny_items(backend: Any) -> list[TrainItem]:
    prompt = backend.encode_prompt([{"role": "user", "content": "What is 2 + 2?"}])
    return [TrainItem(prompt, backend.encode_completion("x" * (i + 1)), [-5.0] * (i + 2), (-1) ** i * 0.5)
            for i in range(6)]


def test_cuda_oom_halves_the_micro_batch_and_redoes_the_step(tiny_model_dir: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    from engine.backends.torch_backend import TorchBackend

    grpo = GRPOConfig(precision="fp32", micro_batch=8, kl_beta=0.1, pg_steps=2)
    reference = TorchBackend(tiny_model_dir, pick_device("cpu"), grpo, 0, 1.0)
    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), grpo, 0, 1.0)
    items = tiny_items(backend)
    oom_on_big_chunks(backend, rows=2)
    with caplog.at_level(logging.WARNING):
        stats = backend.train(items)
    want = reference.train(items)
    assert stats["oom_retries"] == 2 and backend.budget.limits(grpo)[0] == 2
    assert "ran out of memory while training: micro-batch halved to 4 sequences" in caplog.text
    for key in ("loss", "grad_norm", "clip_fraction", "kl"):
        assert stats[key] == pytest.approx(want[key], rel=1e-5, abs=1e-9), key
    want_state, got_state = reference._trainable_state(), backend._trainable_state()
    assert all(torch.allclose(want_state[k], got_state[k], atol=1e-6) for k in want_state)

    # Swarm items are scored with the smaller budget from now on, with the same values.
    pairs = [(it.prompt_ids, it.completion_ids) for it in items]
    got = [x for row in backend.behaviour_logprobs(pairs, 1.0) for x in row]
    assert got == pytest.approx([x for row in reference.behaviour_logprobs(pairs, 1.0) for x in row], abs=1e-5)
    assert backend.budget.halvings == 2


def test_cuda_oom_while_scoring_swarm_items_halves_too(tiny_model_dir: Path) -> None:
    from engine.backends.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(precision="fp32"), 0, 1.0)
    pairs = [(it.prompt_ids, it.completion_ids) for it in tiny_items(backend)]
    want = [x for row in backend.behaviour_logprobs(pairs, 1.0) for x in row]
    oom_on_big_chunks(backend, rows=3)
    got = [x for row in backend.behaviour_logprobs(pairs, 1.0) for x in row]
    assert got == pytest.approx(want, abs=1e-5) and backend.budget.limits(backend.grpo)[0] == 2


def test_cuda_oom_with_one_sequence_is_a_clear_error(tiny_model_dir: Path) -> None:
    from engine.backends.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(precision="fp32", micro_batch=2), 0, 1.0)
    oom_on_big_chunks(backend, rows=0)
    with pytest.raises(DeviceError, match="even one sequence at a time"):
        backend.train(tiny_items(backend))


def test_a_virtual_macs_paravirtual_metal_counts_as_no_metal(monkeypatch: pytest.MonkeyPatch) -> None:
    play_mac(monkeypatch, "Apple Paravirtual device")  # GitHub's macOS runners: Metal answers, MLX has crashed on it
    info = pick_device("auto")
    assert info.kind == "cpu" and "no Metal" in info.reason
    forced = pick_device("mlx")
    assert forced.kind == "mlx" and forced.name.endswith(dev.MLX_ON_CPU) and "virtual machine" in forced.reason
