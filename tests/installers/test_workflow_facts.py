"""Facts about .github/workflows that GitHub would only reveal on their first real run.

    .venv/bin/python -m pytest -q tests/installers/test_workflow_facts.py

Each test reads the workflow files (YAML) and checks one thing that broke, or would have
broken, a run on GitHub: a version read from pyproject.toml (which has none since the
version moved to engine/__init__.py), a runner image GitHub has retired, a self-test step
that can hang until the job's timeout, a PowerShell native command whose failure goes
unnoticed, an action on a Node 20 version, a release whose tag disagrees with the version.
`make lint-workflows` adds GitHub's workflow schema and zizmor's audits.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
RUNNER_LABELS = Path(__file__).with_name("runner_labels.toml")
SHA = re.compile(r"^[0-9a-f]{40}$")
# The first major version of each action that runs on Node 24 (read from each version's action.yml
# `runs.using`). An action missing here fails the test: look its version up and add it.
NODE24_SINCE = {
    "actions/checkout": 5,
    "actions/setup-python": 6,
    "actions/cache": 5,
    "actions/upload-artifact": 6,
    "actions/download-artifact": 7,
}
# A PowerShell line that runs a native program: `& ...`, `$x = & ...`, or one of these by name.
NATIVE = re.compile(r"^\s*(\$[\w:]+\s*=\s*)?(&\s|(python|pip|pwsh|7z|choco|makensis|signtool|tar)(\.exe)?\s)")


def workflows() -> dict[str, dict[Any, Any]]:
    found = {path.name: yaml.safe_load(path.read_text(encoding="utf-8")) for path in sorted(WORKFLOWS.glob("*.y*ml"))}
    assert found, f"no workflows in {WORKFLOWS}"
    return found


def steps(workflow: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, job, step


def step_shell(workflow: dict[str, Any], job: dict[str, Any], step: dict[str, Any]) -> str:
    return str(step.get("shell") or job.get("defaults", {}).get("run", {}).get("shell")
               or workflow.get("defaults", {}).get("run", {}).get("shell") or "")


def test_no_workflow_reads_the_version_from_pyproject_toml() -> None:
    offenders = [f"{name}:{number}: {line.strip()}"
                 for name in workflows()
                 for number, line in enumerate((WORKFLOWS / name).read_text(encoding="utf-8").splitlines(), 1)
                 if "pyproject.toml" in line and re.search(r"version", line, re.IGNORECASE)]
    assert not offenders, "pyproject.toml has no version (dynamic); read engine.__version__:\n" + "\n".join(offenders)


def test_the_workflows_that_name_files_by_version_read_engine_version() -> None:
    for name in ("build-macos.yml", "build-windows.yml", "release.yml"):
        text = (WORKFLOWS / name).read_text(encoding="utf-8")
        assert "import engine; print(engine.__version__)" in text, f"{name} does not read engine.__version__"


def test_every_runs_on_label_is_a_current_github_runner() -> None:
    listed = tomllib.loads(RUNNER_LABELS.read_text(encoding="utf-8"))
    assert isinstance(listed["checked"], datetime.date) and listed["checked"] <= datetime.date.today()
    labels = listed["labels"]
    used = []
    for name, workflow in workflows().items():
        for job_id, job in workflow["jobs"].items():
            if "uses" in job:  # a reusable workflow: its own jobs are checked in its file
                continue
            runs_on = job["runs-on"]
            for label in [runs_on] if isinstance(runs_on, str) else runs_on:
                assert "${{" not in label, f"{name} {job_id}: runs-on {label!r} is an expression; list its values"
                used.append((name, job_id, label))
    assert used
    for name, job_id, label in used:
        assert label in labels, f"{name} {job_id}: {label!r} is not in {RUNNER_LABELS.name}; check it and add it"
        entry = labels[label]
        assert entry["status"] == "ga", (f"{name} {job_id}: {label!r} is {entry['status']} "
                                         f"({entry.get('note', '')}; checked {listed['checked']})")


def _is_self_test(step: dict[str, Any]) -> bool:
    text = f"{step.get('name', '')}\n{step.get('run', '')}"
    return bool(re.search(r"self-test|smoke-", text, re.IGNORECASE))


def test_every_self_test_step_has_a_timeout() -> None:
    self_tests = [(name, job_id, step) for name, workflow in workflows().items()
                  for job_id, _, step in steps(workflow) if _is_self_test(step)]
    assert len(self_tests) >= 4  # the .deb, the .dmg, the installed setup.exe, the CUDA zip's folder
    for name, job_id, step in self_tests:
        minutes = step.get("timeout-minutes")
        assert isinstance(minutes, int) and 0 < minutes <= 60, f"{name} {job_id} {step.get('name')!r}: no timeout"


def test_windows_self_tests_capture_the_windowed_exes_output() -> None:
    """sapling.exe is a GUI program: run directly its output is lost, so it goes through self-test.ps1."""
    for _, _, step in steps(workflows()["build-windows.yml"]):
        run = str(step.get("run", ""))
        if "--self-test" in run or "self-test.ps1" in run or "smoke-install.ps1" in run:
            assert "--self-test" not in run, f"{step.get('name')!r} runs sapling.exe itself; use self-test.ps1"
    script = (ROOT / "installers" / "windows" / "self-test.ps1").read_text(encoding="utf-8")
    assert "-RedirectStandardOutput" in script and "-RedirectStandardError" in script and "Kill($true)" in script
    assert "self-test.ps1" in (ROOT / "installers" / "windows" / "smoke-install.ps1").read_text(encoding="utf-8")
    spec = (ROOT / "installers" / "pyinstaller" / "sapling.spec").read_text(encoding="utf-8")
    assert re.search(r"^\s*disable_windowed_traceback=True,", spec, re.MULTILINE)


def _joined_lines(script: str) -> list[str]:
    """PowerShell lines with backtick continuations joined, blank lines and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in script.splitlines():
        line = pending + raw
        if line.rstrip().endswith("`"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.strip().startswith("#"):
            lines.append(line)
    return lines


def test_every_native_command_in_powershell_is_followed_by_a_lastexitcode_check() -> None:
    checked = 0
    for name, workflow in workflows().items():
        for job_id, job, step in steps(workflow):
            if "pwsh" not in step_shell(workflow, job, step) and "powershell" not in step_shell(workflow, job, step):
                continue
            lines = _joined_lines(str(step.get("run", "")))
            for index, line in enumerate(lines):
                if NATIVE.match(line):
                    checked += 1
                    following = lines[index + 1] if index + 1 < len(lines) else ""
                    assert "$LASTEXITCODE" in following, (
                        f"{name} {job_id} {step.get('name')!r}: no $LASTEXITCODE check after: {line.strip()}")
    assert checked >= 10


def test_every_action_is_pinned_by_sha_to_a_node24_version() -> None:
    pinned = 0
    for name in workflows():
        for line in (WORKFLOWS / name).read_text(encoding="utf-8").splitlines():
            match = re.match(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", line)
            if not match or match.group(1).startswith("./"):
                continue
            action, _, ref = match.group(1).partition("@")
            assert SHA.match(ref), f"{name}: {match.group(1)} is not pinned to a commit SHA"
            version = re.search(r"#\s*v(\d+)(\.\d+)*\b", match.group(2))
            assert version, f"{name}: {action}@{ref[:7]} has no `# vX.Y.Z` comment saying which version the SHA is"
            assert action in NODE24_SINCE, f"{name}: {action}: add its first Node 24 major version to NODE24_SINCE"
            assert int(version.group(1)) >= NODE24_SINCE[action], \
                f"{name}: {action} v{version.group(1)} runs on Node 20"
            pinned += 1
    assert pinned >= 10


def _release() -> dict[Any, Any]:
    return workflows()["release.yml"]


def _version_check_step() -> dict[str, Any]:
    for _, _, step in steps(_release()):
        run = str(step.get("run", ""))
        if "engine.__version__" in run and "$TAG" in run:
            return step
    raise AssertionError("release.yml has no step that compares the tag with engine.__version__")


def test_release_runs_on_v_tags_checks_the_tag_first_and_drafts_a_release_with_checksums() -> None:
    release = _release()
    triggers = release["on"] if "on" in release else release[True]  # YAML 1.1 reads a bare `on` as true
    assert triggers["push"]["tags"] == ["v*"]
    check = _version_check_step()
    assert check["env"]["TAG"] == "${{ github.ref_name }}"
    assert '"$TAG" != "v$version"' in check["run"] and "exit 1" in check["run"]
    jobs = release["jobs"]
    version_job = next(job_id for job_id, job in jobs.items() if check in job.get("steps", []))
    builds = {job_id: job for job_id, job in jobs.items() if "uses" in job}
    assert {job["uses"] for job in builds.values()} == {f"./.github/workflows/build-{os_}.yml"
                                                        for os_ in ("linux", "macos", "windows")}
    for job_id, job in builds.items():
        assert version_job in job["needs"], f"{job_id} builds before the tag is checked"
    publish = next(job for job in jobs.values() if "gh release create" in str(job.get("steps")))
    assert set(builds) <= set(publish["needs"])
    publish_run = "\n".join(str(step.get("run", "")) for step in publish["steps"])
    assert "--draft" in publish_run and "sha256sum" in publish_run and "CHANGELOG.md" in publish_run
    assert "2 * 1024 * 1024 * 1024" in publish_run  # GitHub's release asset limit
    assert publish["permissions"] == {"contents": "write"} and release["permissions"] == {}


@pytest.mark.integration
@pytest.mark.parametrize(("tag", "heading", "passes"), [
    ("v{v}", "## [{v}] - 2026-12-24", True),
    ("v0.0.0-not-it", "## [{v}] - 2026-12-24", False),
    ("{v}", "## [{v}] - 2026-12-24", False),  # the tag needs its v
    ("v{v}", "## [{v}] - unreleased", False),  # no release date yet
    ("v{v}", "## [9.9.9] - 2026-12-24", False),  # no section for this version
])
def test_release_version_check_script(tmp_path: Path, tag: str, heading: str, passes: bool) -> None:
    """The check step's own script, run with bash in a copy of engine/__init__.py and a CHANGELOG."""
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    version = re.search(r'^__version__ = "([^"]+)"', (ROOT / "engine" / "__init__.py").read_text(), re.MULTILINE)
    assert version is not None
    (tmp_path / "engine").mkdir()
    shutil.copy(ROOT / "engine" / "__init__.py", tmp_path / "engine" / "__init__.py")
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n" + heading.format(v=version.group(1)) + "\n\n- x\n")
    output = tmp_path / "github_output"
    env = {"PATH": os.environ["PATH"], "TAG": tag.format(v=version.group(1)), "GITHUB_OUTPUT": str(output)}
    result = subprocess.run(["bash", "-e", "-c", _version_check_step()["run"]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode == 0) == passes, result.stdout + result.stderr
    if passes:
        assert output.read_text() == f"version={version.group(1)}\n"
