"""`make system-deps` installs only what is missing: a program already on PATH counts as installed.

Ubuntu 24.04, GitHub's runner, has no chromium deb (only a snap stub that apt
cannot install) but ships Google Chrome; before this, `make test` there ran
`apt-get install chromium` and stopped before pytest. Here `dpkg` and
`apt-get` are stand-ins on PATH that answer "not installed" and record calls.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fake_bin(folder: Path, *programs: str) -> Path:
    """A folder with `dpkg` (knows no package), `apt-get` (records its arguments) and empty `programs`."""
    folder.mkdir()
    (folder / "dpkg").write_text("#!/bin/sh\nexit 1\n")
    (folder / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> "{folder / "apt-calls"}"\n')
    for name in ("dpkg", "apt-get", *programs):
        path = folder / name
        if not path.exists():
            path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    return folder


def system_deps(folder: Path, packages: str) -> list[str]:
    """Run `make system-deps` with only `folder` and the basic tools on PATH; the apt-get calls it made."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    tools = folder / "tools"
    tools.mkdir()
    for name in ("sh", "id", "sed", "head", "getconf", "cat"):
        found = shutil.which(name)
        if found:
            (tools / name).symlink_to(found)
    env = {**os.environ, "PATH": f"{folder}:{tools}"}
    subprocess.run([make, "-s", "--no-print-directory", "system-deps", f"APT_PACKAGES={packages}"],
                   cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=60)
    calls = folder / "apt-calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_chrome_on_path_means_no_chromium_is_installed(tmp_path: Path) -> None:
    folder = fake_bin(tmp_path / "bin", "google-chrome", "caddy", "redis-server")
    assert system_deps(folder, "chromium caddy redis-server") == []


def test_a_missing_program_is_installed_and_only_that(tmp_path: Path) -> None:
    folder = fake_bin(tmp_path / "bin", "chromium")
    calls = system_deps(folder, "chromium caddy")
    assert any(call.split()[-1:] == ["caddy"] and "install" in call and "chromium" not in call for call in calls), calls
