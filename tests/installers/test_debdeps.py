"""installers/linux/debdeps.py: the .deb's Depends line, computed from the ELF files of a build.

    .venv/bin/python -m pytest -q tests/installers/test_debdeps.py

The pure part (which soname maps to which package, which ones belong to the NVIDIA
driver) runs everywhere; the integration test links two small shared libraries with
gcc, one of them against a stand-in libcuda.so.1, and reads them back with objdump.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _debdeps() -> ModuleType:
    spec = importlib.util.spec_from_file_location("debdeps", ROOT / "installers" / "linux" / "debdeps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


debdeps = _debdeps()


@pytest.mark.parametrize("soname", ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1",
                                    "libnvcuvid.so.1", "libcudadebugger.so.1"])
def test_nvidia_driver_libraries_are_recognised(soname: str) -> None:
    assert debdeps.is_driver_library(soname)


@pytest.mark.parametrize("soname", ["libcudart.so.13", "libcublas.so.13", "libcudnn.so.9", "libnvrtc.so.13",
                                    "libnvJitLink.so.13", "libGL.so.1", "libcuda_helper.so.1"])
def test_cuda_toolkit_and_other_libraries_are_not_driver_libraries(soname: str) -> None:
    assert not debdeps.is_driver_library(soname)


def test_driver_libraries_are_left_out_of_depends_instead_of_stopping_the_build() -> None:
    needed = {"libcuda.so.1": "_internal/torch/lib/libtorch_cuda.so", "libnvidia-ml.so.1": "_internal/x.so",
              "libGL.so.1": "_internal/PySide6/Qt/lib/libQt6Gui.so.6", "libc.so.6": "sapling",
              "libcudart.so.13": "_internal/torch/lib/libtorch_cuda.so"}
    packages, driver, unknown = debdeps.resolve(needed, {"libcudart.so.13"}, "2.36")
    assert packages == ["libc6 (>= 2.36)", "libgl1"]
    assert driver == ["libcuda.so.1", "libnvidia-ml.so.1"]
    assert unknown == []


def test_an_unknown_library_is_still_reported_with_the_file_that_needs_it() -> None:
    _, _, unknown = debdeps.resolve({"libfoo.so.3": "_internal/bar.so"}, set(), "2.17")
    assert unknown == ["libfoo.so.3 (needed by _internal/bar.so)"]


@pytest.mark.integration
def test_depends_of_a_real_build_that_links_libcuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two real shared objects: one NEEDs libcuda.so.1 (not in the tree, as in a CUDA build), one libGL.so.1."""
    if shutil.which("gcc") is None or shutil.which("objdump") is None:
        pytest.skip("needs gcc and objdump (binutils)")
    stubs, build = tmp_path / "stubs", tmp_path / "build"
    stubs.mkdir()
    build.mkdir()
    (tmp_path / "stub.c").write_text("int stub(void) { return 0; }\n")
    for soname, link in (("libcuda.so.1", "libcuda.so"), ("libGL.so.1", "libGL.so")):
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(stubs / link),
                        str(tmp_path / "stub.c")], check=True)
    (tmp_path / "user.c").write_text("int stub(void);\nint use(void) { return stub(); }\n")
    for name, lib in (("libtorch_cuda.so", "cuda"), ("libQt6Gui.so.6", "GL")):
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(build / name),
                        str(tmp_path / "user.c"), f"-L{stubs}", f"-l{lib}"], check=True)

    line = debdeps.depends(build)

    assert "libgl1" in line and line.startswith("libc6 (>= ")
    assert "cuda" not in line and "nvidia" not in line
    assert "libcuda.so.1" in capsys.readouterr().err
