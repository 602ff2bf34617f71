"""Check that the macOS build runs on the oldest macOS it promises (Info.plist's LSMinimumSystemVersion).

    python installers/macos/min_macos.py minimum                       # print it: 14.0
    python installers/macos/min_macos.py check --venv build/installer-venv --app build/.../Sapling.app

pip picks, for each package, the wheel tagged for the newest macOS the build machine
runs: on a macOS 15 runner, mlx 0.32.4 comes as `macosx_15_0_arm64`, and an app made
from it would not start on macOS 14 although its Info.plist says it would. `check`
reads two things and fails (exit 1, one line per offender) if either needs a newer
macOS than the minimum:

- the platform tags of every wheel installed in the venv (`Tag:` lines of each
  `*.dist-info/WHEEL`); a wheel's need is its oldest arm64 or universal2 tag;
- the minimum OS written into every Mach-O file in the .app (load commands
  LC_BUILD_VERSION and LC_VERSION_MIN_MACOSX, read here with the standard library,
  fat files arch by arch), which also covers what was compiled on the runner
  (llama.cpp, with MACOSX_DEPLOYMENT_TARGET set to the minimum).

Runs on any OS (the tests run it on Linux against files they write); the macOS
workflow runs it after PyInstaller.
"""

from __future__ import annotations

import argparse
import plistlib
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

INFO_PLIST = Path(__file__).resolve().parent / "Info.plist"
TAG_PLATFORM = re.compile(r"^macosx_(\d+)_(\d+)_(arm64|universal2|x86_64|intel|fat\w*|universal)$")
LC_VERSION_MIN_MACOSX = 0x24
LC_BUILD_VERSION = 0x32
PLATFORM_MACOS = 1
MH_MAGIC_64 = 0xFEEDFACF
MH_MAGIC = 0xFEEDFACE
FAT_MAGIC = 0xCAFEBABE
FAT_MAGIC_64 = 0xCAFEBABF

Version = tuple[int, ...]


def parse_version(text: str) -> Version:
    return tuple(int(part) for part in text.split("."))


def show(version: Version) -> str:
    return ".".join(str(part) for part in version)


def minimum_macos(info_plist: Path = INFO_PLIST) -> Version:
    with open(info_plist, "rb") as handle:
        return parse_version(plistlib.load(handle)["LSMinimumSystemVersion"])


# --- wheels -------------------------------------------------------------------------------------

def wheel_need(tags: list[str]) -> Version | None:
    """The oldest macOS an Apple-silicon Mac needs for a wheel with these tags; None for a pure or non-Mac wheel."""
    needs = []
    for tag in tags:
        for platform in tag.split("-")[-1].split("."):
            match = TAG_PLATFORM.match(platform)
            if match and match.group(3) in ("arm64", "universal2"):
                needs.append((int(match.group(1)), int(match.group(2))))
    return min(needs) if needs else None


def wheel_tags(dist_info: Path) -> list[str]:
    wheel = dist_info / "WHEEL"
    if not wheel.is_file():
        return []
    return [line.split(":", 1)[1].strip() for line in wheel.read_text(encoding="utf-8").splitlines()
            if line.startswith("Tag:")]


def site_packages(venv: Path) -> list[Path]:
    return sorted(venv.glob("lib/python3*/site-packages")) + sorted(venv.glob("Lib/site-packages"))


def check_wheels(venv: Path, minimum: Version) -> list[str]:
    problems = []
    for packages in site_packages(venv):
        for dist_info in sorted(packages.glob("*.dist-info")):
            need = wheel_need(wheel_tags(dist_info))
            if need is not None and need > minimum:
                problems.append(f"{dist_info.name}: wheel tagged for macOS {show(need)} ({', '.join(wheel_tags(dist_info))})")
    return problems


# --- Mach-O -------------------------------------------------------------------------------------

def _decode(packed: int) -> Version:
    """Mach-O's xxxx.yy.zz nibble encoding, with a zero patch level dropped (14.0.0 -> (14, 0))."""
    version = (packed >> 16, (packed >> 8) & 0xFF, packed & 0xFF)
    return version[:2] if version[2] == 0 else version


def _thin_min_os(data: bytes, offset: int) -> Version | None:
    magic_le = struct.unpack_from("<I", data, offset)[0]
    if magic_le not in (MH_MAGIC_64, MH_MAGIC):
        return None
    header = 32 if magic_le == MH_MAGIC_64 else 28
    ncmds = struct.unpack_from("<I", data, offset + 16)[0]
    cursor = offset + header
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, cursor)
        if cmd == LC_BUILD_VERSION:
            platform, minos = struct.unpack_from("<II", data, cursor + 8)
            if platform == PLATFORM_MACOS:
                return _decode(minos)
        elif cmd == LC_VERSION_MIN_MACOSX:
            return _decode(struct.unpack_from("<I", data, cursor + 8)[0])
        if size <= 0:
            break
        cursor += size
    return None


def macho_min_os(data: bytes) -> list[Version]:
    """The minimum macOS of each architecture in a Mach-O file (thin or fat); [] for anything else."""
    if len(data) < 32:
        return []
    magic_be = struct.unpack_from(">I", data, 0)[0]
    if magic_be in (FAT_MAGIC, FAT_MAGIC_64):
        count = struct.unpack_from(">I", data, 4)[0]
        if count > 32:  # 0xCAFEBABE is also a Java class file; no fat Mach-O has that many slices
            return []
        entry = 32 if magic_be == FAT_MAGIC_64 else 20
        offsets = [struct.unpack_from(">Q" if magic_be == FAT_MAGIC_64 else ">I", data, 8 + i * entry + 8)[0]
                   for i in range(count)]
        return [v for v in (_thin_min_os(data, off) for off in offsets if off + 32 <= len(data)) if v is not None]
    thin = _thin_min_os(data, 0)
    return [thin] if thin is not None else []


def macho_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                head = handle.read(4)
            if len(head) == 4 and (struct.unpack("<I", head)[0] in (MH_MAGIC_64, MH_MAGIC)
                                   or struct.unpack(">I", head)[0] in (FAT_MAGIC, FAT_MAGIC_64)):
                yield path


def check_app(app: Path, minimum: Version) -> list[str]:
    problems = []
    for path in macho_files(app):
        needs = macho_min_os(path.read_bytes())
        if needs and max(needs) > minimum:
            problems.append(f"{path.relative_to(app)}: built for macOS {show(max(needs))}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("minimum", help="print LSMinimumSystemVersion")
    check = commands.add_parser("check", help="fail if a wheel or Mach-O file needs a newer macOS")
    check.add_argument("--venv", type=Path, help="the build venv whose wheels go into the app")
    check.add_argument("--app", type=Path, help="the built Sapling.app")
    check.add_argument("--info-plist", type=Path, default=INFO_PLIST)
    options = parser.parse_args(argv)
    if options.command == "minimum":
        print(show(minimum_macos()))
        return 0
    minimum = minimum_macos(options.info_plist)
    problems = (check_wheels(options.venv, minimum) if options.venv else []) + (
        check_app(options.app, minimum) if options.app else [])
    for problem in problems:
        print(f"min_macos: needs more than LSMinimumSystemVersion {show(minimum)}: {problem}", file=sys.stderr)
    if not problems:
        print(f"min_macos: everything checked runs on macOS {show(minimum)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
