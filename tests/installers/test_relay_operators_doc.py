"""docs/relay-operators.md followed literally: its systemd path's commands that can run here, and its tables.

    .venv/bin/python -m pytest -q tests/installers/test_relay_operators_doc.py

The commands are read out of the page itself, so a step that is edited
there is the step that is tested: the relay unit's own ExecStart with the
example relay.toml (two instances on one redis-server), the upgrade step's
wait loop right after a restart, the invite command, the Prometheus scrape
targets, `make relay-venv`'s non-editable install (as `make -n`), and
Caddy's message when SAPLING_DOMAIN is missing, which the troubleshooting
section quotes. What needs root, apt or the internet (apt-get, systemctl,
Caddy's certificate, the firewall) is not run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.harness.servers import RedisServer, free_port, stop_process, wait_listening
from engine.relay.settings import RelaySettings

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "relay-operators.md").read_text(encoding="utf-8")
KIT = ROOT / "installers" / "relay"
VENV_BIN = Path(sys.executable).parent


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end > 0 else len(DOC)]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


# -- tables and files ---------------------------------------------------------------------------
def test_every_relay_setting_has_a_row_in_the_settings_table() -> None:
    table = section("Settings")
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[2])}
    missing = {f.name for f in dataclasses.fields(RelaySettings)} - named
    assert not missing, f"docs/relay-operators.md's settings table lacks {sorted(missing)}"
    assert "per process" in table  # the caps are each process's own


def test_every_file_the_systemd_steps_copy_is_in_the_kit() -> None:
    steps = code_blocks(section("From a fresh server to a running relay: systemd"), "sh")[0]
    paths = set(re.findall(r"installers/relay/[\w./@-]+", steps))
    assert len(paths) >= 5, paths
    for path in paths:
        assert (ROOT / path).is_file(), path


def test_make_relay_venv_for_a_server_installs_a_wheel_not_the_checkout() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    steps = code_blocks(section("From a fresh server to a running relay: systemd"), "sh")[0]
    command = next(line for line in steps.splitlines() if "make relay-venv" in line).split("&&")[-1]
    argv = [word for word in shlex.split(command) if word != "sudo"]
    assert argv[:2] == ["make", "relay-venv"] and "RELAY_EDITABLE=" in argv
    dry = subprocess.run([*argv, "-n"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    install = next(line for line in dry.stdout.splitlines() if "--no-deps" in line and "install" in line)
    assert " -e " not in install and install.rstrip().endswith(" .") and "--force-reinstall" in install


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("caddy") is None, reason="caddy is not installed (make test installs it)")
def test_caddy_without_its_domain_fails_as_the_troubleshooting_section_says(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no SAPLING_DOMAIN
    done = subprocess.run(["caddy", "adapt", "--config", str(KIT / "Caddyfile"), "--adapter", "caddyfile"],
                          capture_output=True, text=True, timeout=60, env=env)
    said = re.search(r"unrecognized global option: \S+", done.stderr)
    assert done.returncode != 0 and said, done.stderr
    assert f"`{said.group(0)}`" in section("Troubleshooting")


# -- the systemd path on loopback ------------------------------------------------------------------
class Instances:
    """sapling-relay@PORT as the unit starts it: its ExecStart, with the unit's folders under a temporary root."""

    def __init__(self, root: Path, redis_url: str) -> None:
        self.root = root
        etc = root / "etc" / "sapling-relay"
        etc.mkdir(parents=True)
        # step 3: the example settings, as the operator edits them (here: the test's Redis)
        config = (KIT / "relay.toml.example").read_text(encoding="utf-8")
        config = re.sub(r'^redis = ".*"$', f'redis = "{redis_url}"', config, flags=re.M)
        (etc / "relay.toml").write_text(config, encoding="utf-8")
        unit = (KIT / "systemd" / "sapling-relay@.service").read_text(encoding="utf-8")
        self.exec_start = re.search(r"^ExecStart=(.+)$", unit, re.M).group(1)  # type: ignore[union-attr]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def argv(self, port: int) -> list[str]:
        line = (self.exec_start.replace("/opt/sapling-relay/bin/", f"{VENV_BIN}/").replace("%i", str(port))
                .replace("/etc/sapling-relay", str(self.root / "etc" / "sapling-relay"))
                .replace("/var/lib/sapling-relay", str(self.root / "var" / "lib" / "sapling-relay")))
        return shlex.split(line)

    def start(self, port: int) -> None:
        log = self.root / f"relay-{port}.log"
        with log.open("ab") as out:
            self.procs[port] = subprocess.Popen(self.argv(port), stdout=out, stderr=subprocess.STDOUT,
                                                env={**os.environ, "PYTHONPATH": str(ROOT)})

    def restart(self, port: int) -> None:
        stop_process(self.procs[port])
        self.start(port)

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_process(proc)


@pytest.fixture
def instances(tmp_path: Path) -> Iterator[Instances]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    redis = RedisServer(log=tmp_path / "redis.log")
    redis.start()
    running = Instances(tmp_path, redis.url)
    try:
        yield running
    finally:
        running.stop()
        redis.stop()


@pytest.mark.integration
def test_the_systemd_path_runs_as_written(instances: Instances) -> None:
    ports = [free_port(), free_port()]
    for port in ports:  # step 4: two instances of the unit
        instances.start(port)
        wait_listening(port, instances.procs[port], f"sapling-relay@{port}", instances.root / f"relay-{port}.log")

    # Upgrades: the wait loop after each restart, as the page writes it (curl is what the page runs)
    upgrade = code_blocks(section("Upgrades"), "sh")[0]
    wait = next(line.strip() for line in upgrade.splitlines() if "healthz" in line).removesuffix(" || break")
    assert wait.startswith("timeout ")  # it gives up, non-zero, if the relay does not come back
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    for port in ports:
        instances.restart(port)  # `systemctl restart sapling-relay@$port`: the process is not listening yet
        done = subprocess.run(["bash", "-c", wait], env={**os.environ, "port": str(port)}, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and json.loads(done.stdout)["status"] == "ok", done.stdout + done.stderr
    instances.procs[ports[0]].kill()  # a relay that does not come back: the loop ends non-zero, after its timeout
    instances.procs[ports[0]].wait(timeout=10)
    short = re.sub(r"^timeout \d+", "timeout 2", wait)
    assert subprocess.run(["bash", "-c", short], env={**os.environ, "port": str(ports[0])}, capture_output=True,
                          timeout=60).returncode != 0
    instances.start(ports[0])
    wait_listening(ports[0], instances.procs[ports[0]], "sapling-relay again")

    # step 6: the invite, from the same settings file
    steps = code_blocks(section("From a fresh server to a running relay: systemd"), "sh")[0]
    invite = next(line for line in steps.splitlines() if "sapling-relay invite" in line)
    argv = shlex.split(invite.replace("/opt/sapling-relay/bin/", f"{VENV_BIN}/")
                       .replace("/etc/sapling-relay", str(instances.root / "etc" / "sapling-relay")))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "sapling://join?relay=wss%3A%2F%2Frelay.example.org%2Fws" in done.stdout, done

    # Monitoring: the scrape targets are the instances' ports, and each serves Prometheus text there
    scrape = yaml.safe_load(code_blocks(section("Monitoring"), "yaml")[0])
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["127.0.0.1:8701", "127.0.0.1:8702"]  # the ports the systemd steps use
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert b"sapling_relay_connections" in response.read()
