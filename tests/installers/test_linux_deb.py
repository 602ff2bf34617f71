"""The Linux .deb: install it on this machine, run `sapling --self-test` and Try it, remove it, check nothing is left.

    make test-installers     # builds dist/sapling_*.deb first (make installer-linux), then runs this

Marked `installer`: it needs the .deb (minutes to build), root and apt/dpkg, and it
changes this machine's package set while it runs (it purges the package at the end,
also on failure). Not part of `make test`: see docs/packaging.md for the timings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.installer

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "sapling"
MAX_DEB_BYTES = 600 * 1000 * 1000  # the budget: 600 MB with the CPU build of torch
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def _deb() -> Path:
    debs = sorted((ROOT / "dist").glob(f"{PACKAGE}_*.deb"), key=lambda p: p.stat().st_mtime)
    if not debs:
        pytest.fail("no dist/sapling_*.deb: run `make installer-linux` (or `make test-installers`, which does)")
    return debs[-1]


def _installed(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return result.returncode == 0 and "installed" in result.stdout.split()


def _clean_env(home: Path) -> dict[str, str]:
    """What a user's session would give the app: no venv, no PYTHONPATH, a private HOME."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "QT_QPA_PLATFORM": "offscreen",
        "LANG": "C.UTF-8",
    }


@pytest.fixture
def deb() -> Path:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("installs a system package: needs root")
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        pytest.skip("needs a Debian/Ubuntu system (apt-get, dpkg)")
    return _deb()


@pytest.fixture
def installed(deb: Path) -> Iterator[list[str]]:
    """Install the .deb with apt (which also pulls its Depends); yield dpkg's file list; purge after."""
    if _installed(PACKAGE):
        subprocess.run(["dpkg", "--purge", PACKAGE], check=True)
    t0 = time.monotonic()
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", str(deb)], env=APT_ENV, check=True)
    print(f"installed {deb.name} in {time.monotonic() - t0:.0f} s")
    files = subprocess.run(["dpkg", "-L", PACKAGE], capture_output=True, text=True, check=True).stdout.split("\n")
    try:
        yield [f for f in files if f]
    finally:
        if _installed(PACKAGE):
            subprocess.run(["dpkg", "--purge", PACKAGE], check=False)


def _chat(argv: list[str], command: dict[str, Any], env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    """Run the Try it child, send one command, read its JSON lines until both answers (or an error) arrive."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(command) + "\n")
    proc.stdin.flush()
    messages: list[dict[str, Any]] = []
    try:
        for line in proc.stdout:
            message = json.loads(line)
            messages.append(message)
            if message["type"] == "error" or sum(m["type"] == "answer" for m in messages) == 2:
                break
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not messages:
        pytest.fail(f"`sapling node chat` wrote nothing; stderr: {(proc.stderr.read() if proc.stderr else '')[-2000:]}")
    return messages


def test_deb_is_within_the_size_budget_and_holds_what_it_should(deb: Path) -> None:
    assert deb.stat().st_size <= MAX_DEB_BYTES, f"{deb.name} is {deb.stat().st_size / 1e6:.0f} MB (budget 600 MB)"
    fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Package", "Depends"], capture_output=True, text=True,
                            check=True).stdout
    assert f"Package: {PACKAGE}" in fields and "libc6 (>=" in fields
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    for wanted in ("./opt/sapling/sapling", "./usr/bin/sapling -> /opt/sapling/sapling",
                   "./usr/share/applications/sapling.desktop", "SmolLM2-135M-Instruct.Q4_1.gguf",
                   "./usr/share/icons/hicolor/"):
        assert wanted in listing, f"{wanted} is missing from {deb.name}"
    for unwanted in ("libcudart", "libcudnn", "QtWebEngine", "Qt6Quick", "/torch/test/", "/torch/include/",
                     "__pycache__", "qtvirtualkeyboard", "/translations/"):
        assert unwanted not in listing, f"{unwanted} should have been left out of {deb.name}"


def test_install_self_test_and_remove_leave_nothing_behind(installed: list[str], tmp_path: Path) -> None:
    files = installed
    assert os.path.realpath("/usr/bin/sapling") == "/opt/sapling/sapling"
    assert Path("/usr/share/applications/sapling.desktop").is_file()
    if shutil.which("desktop-file-validate"):
        subprocess.run(["desktop-file-validate", "/usr/share/applications/sapling.desktop"], check=True)
    assert any(f.startswith("/usr/share/icons/hicolor/") and f.endswith(("sapling.png", "sapling.svg")) for f in files)

    home = tmp_path / "home"
    home.mkdir()
    t0 = time.monotonic()
    result = subprocess.run(["sapling", "--self-test"], env=_clean_env(home), capture_output=True, text=True,
                            timeout=900, cwd=tmp_path)
    print(f"self-test took {time.monotonic() - t0:.0f} s\n{result.stdout}\n{result.stderr[-4000:]}")
    assert result.returncode == 0, f"sapling --self-test exited {result.returncode}:\n{result.stderr[-4000:]}"
    assert "PASSED" in result.stdout

    # Try it in the installed app: the bundled llama.cpp loads, the frozen export converts the
    # base model to GGUF (llama.cpp's converters from the bundle) and both sides answer.
    t0 = time.monotonic()
    messages = _chat(["sapling", "node", "chat", "--home", str(home / "chat"), "--budget", "2"],
                     {"cmd": "ask", "id": 1, "text": "What is 17 + 25?"}, _clean_env(home), tmp_path)
    print(f"Try it answered in {time.monotonic() - t0:.0f} s")
    ready = messages[0]
    assert ready["type"] == "ready" and ready["llama_cpp"] is True, ready
    errors = [m for m in messages if m["type"] == "error"]
    assert not errors, errors
    answers = {m["side"]: m for m in messages if m["type"] == "answer"}
    assert set(answers) == {"trained", "base"} and all(a["tokens"] > 0 for a in answers.values()), answers
    assert answers["trained"]["text"] == answers["base"]["text"]  # no checkpoint yet: both are the base model

    # Running the app wrote nothing into the installed tree (dpkg could not remove it).
    owned = set(files)
    strays = [str(p) for p in Path("/opt/sapling").rglob("*") if str(p) not in owned]
    assert not strays, f"files under /opt/sapling that dpkg does not own: {strays[:10]}"

    subprocess.run(["apt-get", "remove", "-y", "-qq", PACKAGE], env=APT_ENV, check=True)
    assert not _installed(PACKAGE)
    # Every file and link is gone, and every folder of ours; shared folders (/usr/share/icons/...) may stay.
    left = [f for f in files if os.path.lexists(f)
            and (os.path.islink(f) or not os.path.isdir(f) or f.startswith("/opt/sapling"))]
    assert not left, f"still on disk after apt-get remove: {left[:10]}"
    assert not os.path.lexists("/opt/sapling") and not os.path.lexists("/usr/bin/sapling")
    # A local .deb is unknown to apt once removed; dpkg purges what is left of its record.
    subprocess.run(["dpkg", "--purge", PACKAGE], check=True)
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", PACKAGE], capture_output=True, text=True)
    assert status.returncode != 0 or "not-installed" in status.stdout
