"""Compute the .deb's Depends line from what a PyInstaller one-folder build really needs.

    python3 installers/linux/debdeps.py build/pyinstaller/cpu/dist/sapling

PyInstaller bundles most shared libraries it finds on the build machine, but
never glibc, and not the GL/EGL/DRM/Wayland libraries that must match the
user's graphics driver; and a library missing on the build machine (an X11
helper the offscreen build never loads) is simply not bundled. This reads the
NEEDED entries of every ELF file in the build (objdump -p), drops the sonames
the bundle itself provides, and maps the rest to Debian packages with the
table below. The glibc floor is the newest GLIBC_x.y symbol version any file
uses (objdump -T), so a .deb built on a newer distro says so instead of
failing at start-up on an older one.

A soname missing from the table is an error naming the file that needs it:
add the package here rather than ship a .deb that might not start.

The NVIDIA driver's own libraries (libcuda.so.1, libnvidia-ml.so.1, ...) are the
exception: a CUDA build of torch links them, but they come with the driver the
user installed (its package name differs between distros and driver series), are
never bundled, and are loaded only when a GPU is there. They are left out of
Depends and named on stderr.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GLIBC_SONAMES = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libresolv.so.2",
                 "libutil.so.1", "libnsl.so.1", "libanl.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
# Debian 12 / Ubuntu 22.04 names; `a | b` where Ubuntu 24.04's 64-bit time_t rename differs.
GLIB = "libglib2.0-0t64 | libglib2.0-0"
PACKAGES = {
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libOpenGL.so.0": "libopengl0",
    "libGLX.so.0": "libglx0",
    "libdrm.so.2": "libdrm2",
    "libgbm.so.1": "libgbm1",
    "libwayland-client.so.0": "libwayland-client0",
    "libwayland-cursor.so.0": "libwayland-cursor0",
    "libwayland-egl.so.1": "libwayland-egl1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libXext.so.6": "libxext6",
    "libXrender.so.1": "libxrender1",
    "libxcb.so.1": "libxcb1",
    "libglib-2.0.so.0": GLIB,
    "libgobject-2.0.so.0": GLIB,
    "libgio-2.0.so.0": GLIB,
    "libgthread-2.0.so.0": GLIB,
    "libgmodule-2.0.so.0": GLIB,
    "libz.so.1": "zlib1g",
    "libgomp.so.1": "libgomp1",
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
}
# The NVIDIA driver's user-space libraries: libcuda.so.1, libnvidia-ml.so.1, libnvidia-ptxjitcompiler.so.1,
# libnvcuvid.so.1, libcudadebugger.so.1 ... (not libcudart, libcublas etc.: those are CUDA toolkit
# libraries, which a CUDA build of torch bundles).
DRIVER_LIBRARY = re.compile(r"^lib(cuda|cudadebugger|nvcuvid|nvidia-[a-z0-9-]+|nvoptix)\.so(\.\d+)*$")
XCB = re.compile(r"^libxcb-([a-z-]+)\.so\.(\d+)$")  # libxcb-render-util.so.0 -> libxcb-render-util0


def package_for(soname: str) -> str | None:
    if soname in PACKAGES:
        return PACKAGES[soname]
    match = XCB.match(soname)
    if match:
        return f"libxcb-{match.group(1)}{match.group(2)}"
    return None


def is_driver_library(soname: str) -> bool:
    return DRIVER_LIBRARY.match(soname) is not None


def elf_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    files.append(path)
    return files


def objdump(flag: str, path: Path) -> str:
    result = subprocess.run(["objdump", flag, str(path)], capture_output=True, text=True, check=False)
    return result.stdout


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def needed_sonames(root: Path) -> tuple[dict[str, Path], str]:
    """Every NEEDED soname in the build (with the first file that needs it) and the newest GLIBC_x.y in use."""
    needed: dict[str, Path] = {}
    glibc = "2.17"
    for path in elf_files(root):
        for line in objdump("-p", path).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "NEEDED":
                needed.setdefault(parts[1], path)
        for version in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", objdump("-T", path)):
            if version_key(version) > version_key(glibc):
                glibc = version
    return needed, glibc


def resolve(needed: dict[str, str], bundled: set[str], glibc: str) -> tuple[list[str], list[str], list[str]]:
    """(Depends entries, driver libraries left to the user's NVIDIA driver, unknown sonames with their users)."""
    packages = {f"libc6 (>= {glibc})"}
    driver: list[str] = []
    unknown: list[str] = []
    for soname, user in sorted(needed.items()):
        if soname in bundled or soname in GLIBC_SONAMES:
            continue
        if is_driver_library(soname):
            driver.append(soname)
            continue
        package = package_for(soname)
        if package is None:
            unknown.append(f"{soname} (needed by {user})")
        else:
            packages.add(package)
    return sorted(packages), driver, unknown


def depends(root: Path) -> str:
    bundled = {p.name for p in root.rglob("*")}
    needed, glibc = needed_sonames(root)
    packages, driver, unknown = resolve({name: str(path.relative_to(root)) for name, path in needed.items()},
                                        bundled, glibc)
    if unknown:
        raise SystemExit("debdeps: no Debian package known for: " + ", ".join(unknown)
                         + "\nAdd it to PACKAGES in installers/linux/debdeps.py, or leave the file out of the build.")
    if driver:
        print("debdeps: left to the NVIDIA driver (not in Depends): " + ", ".join(driver), file=sys.stderr)
    return ", ".join(packages)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        raise SystemExit(__doc__)
    print(depends(Path(sys.argv[1])))
