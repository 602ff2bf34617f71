"""Windows and macOS installers, checked on Linux: makensis compiles the NSIS script, and the
CI workflows that build the real installers pass the GitHub workflow schema.

    make test-installers     # or: .venv/bin/python -m pytest -m installer tests/installers

Marked `installer`: they need makensis (apt-get install nsis) and check-jsonschema from
the build venv (build/installer-venv, the `build` extra), which `make test-installers`
sets up. The schema is the one vendored inside check-jsonschema, so this runs offline.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.installer

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _check_jsonschema() -> str:
    for candidate in (ROOT / "build" / "installer-venv" / "bin" / "check-jsonschema", shutil.which("check-jsonschema")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.fail("check-jsonschema not found: run `make test-installers` (it installs the `build` extra)")


def test_nsis_script_compiles_against_a_stand_in_payload(tmp_path: Path) -> None:
    if shutil.which("makensis") is None:
        pytest.fail("makensis not found: `make installer-windows-check` installs it (apt-get install nsis)")
    subprocess.run([str(ROOT / "installers" / "windows" / "check-nsis.sh"), str(tmp_path)], check=True)
    setup = next(tmp_path.glob("Sapling-*-setup.exe"))
    assert setup.read_bytes()[:2] == b"MZ"  # a Windows executable
    log = (tmp_path / "makensis.log").read_text()
    # The payload went in, and both halves (installer, uninstaller) were written.
    assert re.search(r'File: "sapling\.exe"', log) and 'File: "SmolLM2-135M-Instruct.Q4_1.gguf"' in log
    assert 'WriteUninstaller: "$INSTDIR\\Uninstall.exe"' in log
    assert 'CreateShortcut: "$SMPROGRAMS\\Sapling.lnk"' in log
    # The sapling:// scheme as makensis compiled it, and its removal.
    assert 'WriteRegStr: HKCU\\Software\\Classes\\sapling\\shell\\open\\command\\="$INSTDIR\\sapling.exe" "%1"' in log
    assert "DeleteRegKey: HKCU\\Software\\Classes\\sapling" in log


def test_nsis_script_is_rejected_without_a_payload(tmp_path: Path) -> None:
    """The check above can fail: makensis refuses the script when the payload is missing."""
    if shutil.which("makensis") is None:
        pytest.fail("makensis not found: apt-get install nsis")
    result = subprocess.run(["makensis", "-WX", "-V2", f"-DOUTFILE={tmp_path / 'x.exe'}",
                             str(ROOT / "installers" / "windows" / "sapling.nsi")], capture_output=True, text=True)
    assert result.returncode != 0 and "PAYLOAD" in result.stdout + result.stderr


def test_workflows_pass_the_github_workflow_schema() -> None:
    assert {p.name for p in WORKFLOWS} >= {"build-windows.yml", "build-macos.yml", "build-linux.yml", "release.yml"}
    result = subprocess.run([_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_catches_a_broken_workflow(tmp_path: Path) -> None:
    """The schema check is real: a job without runs-on, and a misspelt key, are rejected."""
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\non: push\njobs:\n  a:\n    stepz:\n      - run: echo\n")
    result = subprocess.run([_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(broken)],
                            capture_output=True, text=True)
    assert result.returncode != 0
