"""What the installers promise, read from their source files (fast; runs in `make test`).

The builds themselves are checked by the `installer`-marked tests and the CI workflows;
these catch a promise dropped from a file: the macOS bundle keys, the Linux menu entry,
the Windows per-user install with its shortcuts and uninstaller, the workflows' steps.
"""

from __future__ import annotations

import configparser
import plistlib
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
INSTALLERS = ROOT / "installers"
WORKFLOWS = ROOT / ".github" / "workflows"


def _workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(data, dict) and data.get("jobs"), f"{name} has no jobs"
    return data


def _run_text(data: dict) -> str:
    return "\n".join(str(step.get("run", "")) + str(step.get("uses", "")) + str(step.get("if", ""))
                     for job in data["jobs"].values() for step in job["steps"])


def test_info_plist_has_bundle_id_icon_minimum_macos_and_high_dpi() -> None:
    info = plistlib.loads((INSTALLERS / "macos" / "Info.plist").read_bytes())
    assert re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+", info["CFBundleIdentifier"])
    assert info["CFBundleIconFile"] == "sapling.icns"
    assert tuple(int(x) for x in info["LSMinimumSystemVersion"].split(".")) >= (11, 0)
    assert info["NSHighResolutionCapable"] is True
    plistlib.loads((INSTALLERS / "macos" / "entitlements.plist").read_bytes())


def test_info_plist_registers_the_sapling_url_scheme() -> None:
    info = plistlib.loads((INSTALLERS / "macos" / "Info.plist").read_bytes())
    schemes = [scheme for url_type in info["CFBundleURLTypes"] for scheme in url_type["CFBundleURLSchemes"]]
    assert schemes == ["sapling"]
    assert info["CFBundleURLTypes"][0]["CFBundleURLName"].startswith(info["CFBundleIdentifier"])


def test_macos_bundle_id_matches_the_apps_launch_agent_label() -> None:
    from app.autostart import LABEL

    assert plistlib.loads((INSTALLERS / "macos" / "Info.plist").read_bytes())["CFBundleIdentifier"] == LABEL


def test_desktop_entry_starts_sapling_with_its_icon() -> None:
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # type: ignore[assignment,method-assign]
    entry.read(INSTALLERS / "linux" / "sapling.desktop")
    section = entry["Desktop Entry"]
    assert section["Type"] == "Application" and section["Exec"].split()[0] == "sapling"
    assert section["Icon"] == "sapling" and section["Terminal"] == "false"
    assert section["Categories"].endswith(";")


def test_desktop_entry_opens_sapling_links_with_the_url_as_argument() -> None:
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # type: ignore[assignment,method-assign]
    entry.read(INSTALLERS / "linux" / "sapling.desktop")
    section = entry["Desktop Entry"]
    assert "x-scheme-handler/sapling" in section["MimeType"].split(";")
    assert section["Exec"].split() == ["sapling", "%u"]  # %u: the one URL the link was opened with
    assert section["TryExec"] == "sapling"


def test_nsis_script_is_per_user_with_shortcuts_login_option_and_uninstaller() -> None:
    nsi = (INSTALLERS / "windows" / "sapling.nsi").read_text()
    assert "RequestExecutionLevel user" in nsi and "$LOCALAPPDATA\\Programs\\Sapling" in nsi
    assert "$SMPROGRAMS\\Sapling.lnk" in nsi and "$DESKTOP\\Sapling.lnk" in nsi
    assert re.search(r'Section /o "Start Sapling when I sign in"', nsi)  # optional, off by default
    assert "WriteUninstaller" in nsi and 'Section "un.Sapling"' in nsi
    # Everything the installer writes, the uninstaller takes away.
    for written in re.findall(r'CreateShortcut "([^"]+)"', nsi):
        assert f'Delete "{written}"' in nsi
    assert 'DeleteRegValue HKCU "${RUN_KEY}" "Sapling"' in nsi and 'DeleteRegKey HKCU "${UNINST_KEY}"' in nsi


def test_nsis_script_registers_the_sapling_url_scheme_and_the_uninstaller_removes_it() -> None:
    nsi = (INSTALLERS / "windows" / "sapling.nsi").read_text()
    assert '!define URL_KEY "Software\\Classes\\sapling"' in nsi
    assert 'WriteRegStr HKCU "${URL_KEY}" "URL Protocol" ""' in nsi
    assert 'WriteRegStr HKCU "${URL_KEY}\\DefaultIcon" "" \'"$INSTDIR\\${APP_EXE}",0\'' in nsi
    assert 'WriteRegStr HKCU "${URL_KEY}\\shell\\open\\command" "" \'"$INSTDIR\\${APP_EXE}" "%1"\'' in nsi
    uninstall = nsi[nsi.index('Section "un.Sapling"'):]
    assert 'DeleteRegKey HKCU "${URL_KEY}"' in uninstall[:uninstall.index("SectionEnd")]


def _steps_for(job: dict, variant: str) -> str:
    """The run/uses text of the steps a matrix leg runs (steps gated on another variant left out)."""
    return "\n".join(str(step.get("run", "")) + str(step.get("uses", "")) for step in job["steps"]
                     if "matrix.variant ==" not in str(step.get("if", "")) or f"'{variant}'" in str(step.get("if")))


def test_windows_workflow_installs_the_cpu_setup_and_zips_the_cuda_build() -> None:
    data = _workflow("build-windows.yml")
    job = next(iter(data["jobs"].values()))
    assert str(job["runs-on"]).startswith("windows")
    cpu, cuda = _steps_for(job, "cpu"), _steps_for(job, "cuda")
    # CPU: PyInstaller, NSIS, then the silent install / installed self-test / uninstall, then upload.
    order = [cpu.index(s) for s in ("pyinstaller", "makensis", "smoke-install.ps1")] + [cpu.rindex("upload-artifact")]
    assert order == sorted(order)
    # CUDA: past NSIS's 2 GB limit, so no makensis; the folder's self-test, then a zip.
    assert "makensis" not in cuda
    order = [cuda.index(s) for s in ("pyinstaller", "self-test.ps1", "7z a -tzip")] + [cuda.rindex("upload-artifact")]
    assert order == sorted(order)


def test_macos_workflow_is_arm64_with_mlx_and_signs_only_with_secrets() -> None:
    data = _workflow("build-macos.yml")
    job = next(iter(data["jobs"].values()))
    assert job["runs-on"] in {"macos-14", "macos-15", "macos-latest"}  # Apple-silicon runners
    text = _run_text(data)
    assert '".[mlx,build]"' in text and "hdiutil" in (INSTALLERS / "macos" / "make-dmg.sh").read_text()
    steps = {step.get("name", ""): step for step in job["steps"]}
    gated = [s for s in steps.values()
             if re.search(r"installers/macos/(import-certificate|notarize)\.sh", str(s.get("run")))]
    assert len(gated) == 2 and all("steps.signing.outputs.sign == 'true'" in str(s.get("if")) for s in gated)
    assert "skipping codesign and notarization" in text
    # What users get is tested: the mounted .dmg's app, after the image is made (and notarized).
    order = [text.index(s) for s in ("make-dmg.sh", "notarize.sh", "smoke-dmg.sh")]
    assert order == sorted(order)
    assert "min_macos.py check" in text and "--platform" in text  # mlx wheels for the minimum macOS


def test_test_workflow_runs_make_test_on_linux_and_the_mlx_tests_on_apple_silicon() -> None:
    data = _workflow("test.yml")
    triggers = data.get("on") or data.get(True)  # YAML 1.1 reads a bare `on` as true
    assert "push" in triggers and "pull_request" in triggers
    linux, mac = data["jobs"]["linux"], data["jobs"]["macos-mlx"]
    assert "make test" in "\n".join(str(s.get("run", "")) for s in linux["steps"])
    assert "whl/cpu" in "\n".join(str(s.get("run", "")) for s in linux["steps"])  # never the CUDA wheel
    mac_run = "\n".join(str(s.get("run", "")) for s in mac["steps"])
    assert mac["runs-on"].startswith("macos-") and ".[dev,mlx]" in mac_run and "test_mlx_backend.py" in mac_run
