"""installers/macos/min_macos.py: the macOS build may need no newer macOS than Info.plist promises.

    .venv/bin/python -m pytest -q tests/installers/test_min_macos.py

The Mach-O files here are written byte by byte from the layout in Apple's <mach-o/loader.h>
and <mach-o/fat.h> (a header, then load commands); the wheels are dist-info folders with
the WHEEL file pip writes.
"""

from __future__ import annotations

import importlib.util
import plistlib
import struct
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("min_macos", ROOT / "installers" / "macos" / "min_macos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


min_macos = _load()
CPU_ARM64 = 0x0100000C


def _packed(major: int, minor: int, patch: int = 0) -> int:
    return (major << 16) | (minor << 8) | patch


def thin(minos: tuple[int, int], *, old_style: bool = False) -> bytes:
    """A 64-bit Mach-O dylib with one LC_SEGMENT_64-sized filler command and one OS-version command."""
    filler = struct.pack("<II", 0x19, 72) + bytes(64)  # LC_SEGMENT_64, skipped by the reader
    if old_style:
        version = struct.pack("<IIII", 0x24, 16, _packed(*minos), _packed(26, 0))  # LC_VERSION_MIN_MACOSX
    else:
        version = struct.pack("<IIIIII", 0x32, 24, 1, _packed(*minos), _packed(26, 0), 0)  # LC_BUILD_VERSION, macOS
    commands = filler + version
    header = struct.pack("<IiiIIIII", 0xFEEDFACF, CPU_ARM64, 0, 6, 2, len(commands), 0, 0)
    return header + commands


def fat(*slices: bytes) -> bytes:
    header = struct.pack(">II", 0xCAFEBABE, len(slices))
    offset = 4096
    arches, body = b"", b""
    for data in slices:
        arches += struct.pack(">iiIII", CPU_ARM64, 0, offset + len(body), len(data), 12)
        body += data
    return (header + arches).ljust(offset, b"\0") + body


def test_the_minimum_is_read_from_info_plist() -> None:
    info = plistlib.loads((ROOT / "installers" / "macos" / "Info.plist").read_bytes())
    assert min_macos.minimum_macos() == tuple(int(p) for p in info["LSMinimumSystemVersion"].split("."))


def test_mach_o_minimum_os_from_build_version_old_style_and_fat_files() -> None:
    assert min_macos.macho_min_os(thin((15, 0))) == [(15, 0)]
    assert min_macos.macho_min_os(thin((10, 13), old_style=True)) == [(10, 13)]
    assert min_macos.macho_min_os(fat(thin((11, 0)), thin((14, 0)))) == [(11, 0), (14, 0)]
    java_class = struct.pack(">IHH", 0xCAFEBABE, 0, 65) + bytes(40)  # same magic, 65 "slices": not Mach-O
    assert min_macos.macho_min_os(java_class) == []
    assert min_macos.macho_min_os(b"\x7fELF" + bytes(60)) == []


def test_check_app_names_each_file_built_for_a_newer_macos(tmp_path: Path) -> None:
    app = tmp_path / "Sapling.app"
    libs = app / "Contents" / "Frameworks"
    libs.mkdir(parents=True)
    (libs / "libllama.dylib").write_bytes(thin((14, 0)))
    (libs / "libmlx.dylib").write_bytes(thin((15, 0)))
    (libs / "universal.so").write_bytes(fat(thin((11, 0)), thin((26, 0))))
    (libs / "readme.txt").write_text("not a binary")
    problems = min_macos.check_app(app, (14, 0))
    assert problems == ["Contents/Frameworks/libmlx.dylib: built for macOS 15.0",
                        "Contents/Frameworks/universal.so: built for macOS 26.0"]
    assert min_macos.check_app(app, (26, 0)) == []


def _dist(site: Path, name: str, *tags: str) -> None:
    dist_info = site / f"{name}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                                     + "".join(f"Tag: {tag}\n" for tag in tags))


def test_check_wheels_flags_a_wheel_tagged_for_a_newer_macos(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    _dist(site, "mlx-0.32.4", "cp311-cp311-macosx_15_0_arm64")
    _dist(site, "mlx_metal-0.32.4", "py3-none-macosx_14_0_arm64")
    _dist(site, "torch-2.13.0", "cp311-cp311-macosx_14_0_arm64")
    _dist(site, "PySide6_Essentials-6.11.3", "cp310-abi3-macosx_13_0_universal2")
    _dist(site, "numpy-2.3.0", "cp311-cp311-macosx_11_0_arm64", "cp311-cp311-macosx_15_0_x86_64")
    _dist(site, "tqdm-4.67.1", "py3-none-any")
    problems = min_macos.check_wheels(tmp_path / "venv", (14, 0))
    assert len(problems) == 1 and problems[0].startswith("mlx-0.32.4.dist-info: wheel tagged for macOS 15.0")


def test_main_exits_1_and_names_the_offender(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    _dist(site, "mlx-0.32.4", "cp311-cp311-macosx_15_0_arm64")
    assert min_macos.main(["check", "--venv", str(tmp_path / "venv")]) == 1
    assert "mlx-0.32.4.dist-info" in capsys.readouterr().err
    (site / "mlx-0.32.4.dist-info" / "WHEEL").write_text("Tag: cp311-cp311-macosx_14_0_arm64\n")
    assert min_macos.main(["check", "--venv", str(tmp_path / "venv")]) == 0
