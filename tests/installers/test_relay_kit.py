"""What installers/relay/ promises, read from its files: the compose stack, the image, the systemd units, Caddy.

    .venv/bin/python -m pytest -q tests/installers/test_relay_kit.py

The images themselves are built and run by .github/workflows/relay-image.yml (this machine
cannot pull base images); the same topology without containers runs for real in
tests/swarm/test_relay_stack.py. These tests catch a kit whose files drifted from the relay:
a compose command or a relay.toml the relay's own parser refuses, a setting compose reads that
.env.example does not name, an image that runs as root, a unit systemd would warn about.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.relay.settings import settings_from_args

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "installers" / "relay"
VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


def env_example() -> dict[str, str]:
    values = {}
    for line in (KIT / ".env.example").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, from env."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        value = env.get(name, "")
        if kind == "?" and not value:
            raise AssertionError(f"{name} must be set: {rest}")
        return value or (rest if kind == "-" else "")

    return VARIABLE.sub(one, text)


def compose() -> dict[str, Any]:
    data = yaml.safe_load((KIT / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def relay_argv(service: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The relay's command line in that service, as compose would run it, with /config mapped to keys/."""
    entrypoint = ["--host", "0.0.0.0", "--port", "8765", "--data-dir", "/data"]  # the Dockerfile's
    return entrypoint + [interpolate(arg, env).replace("/config/", f"{KIT / 'keys'}/") for arg in service["command"]]


def test_both_relays_run_the_same_command_on_the_shared_redis_behind_caddy() -> None:
    services = compose()["services"]
    assert services["relay1"]["command"] == services["relay2"]["command"]
    assert "--redis=redis://redis:6379/0" in services["relay1"]["command"]
    assert services["caddy"]["environment"]["SAPLING_UPSTREAMS"].split() == ["relay1:8765", "relay2:8765"]
    assert set(services["caddy"]["depends_on"]) == {"relay1", "relay2"}
    assert all(services[r]["depends_on"]["redis"]["condition"] == "service_healthy" for r in ("relay1", "relay2"))
    assert "./Caddyfile:/etc/caddy/Caddyfile:ro" in services["caddy"]["volumes"]
    assert services["redis"]["command"][-4:] == ["--save", "", "--appendonly", "no"]


@pytest.mark.parametrize("domain", ["relay.example.org", "localhost"])  # localhost: the image workflow's
def test_the_relays_own_parser_accepts_the_compose_command(domain: str) -> None:
    env = {**env_example(), "SAPLING_DOMAIN": domain}
    settings = settings_from_args(relay_argv(compose()["services"]["relay1"], env))
    assert settings.redis == "redis://redis:6379/0" and settings.public_url == [f"wss://{domain}/ws"]
    assert settings.name == env["SAPLING_RELAY_NAME"] and settings.contact == env["SAPLING_CONTACT"]
    assert settings.join_token == "" and settings.allow_keys == [] and settings.ban_keys == []  # open by default
    # Caddy's fixed address is the relays' trusted proxy, so the per-address cap is per node again
    caddy = compose()["services"]["caddy"]["networks"]["default"]["ipv4_address"]
    assert settings.trusted_proxy == [caddy] and settings.max_conn_per_ip == 16
    network = compose()["networks"]["default"]["ipam"]["config"][0]
    assert ipaddress.ip_address(caddy) in ipaddress.ip_network(network["subnet"])
    assert ipaddress.ip_address(caddy) not in ipaddress.ip_network(network["ip_range"])  # no other container gets it


def test_the_compose_command_refuses_to_start_without_a_domain_or_a_name() -> None:
    for missing in ("SAPLING_DOMAIN", "SAPLING_RELAY_NAME"):
        env = {k: v for k, v in env_example().items() if k != missing}
        with pytest.raises(AssertionError, match=missing):
            relay_argv(compose()["services"]["relay1"], env)


def test_every_setting_compose_reads_is_in_env_example_and_every_example_is_read() -> None:
    text = (KIT / "compose.yaml").read_text(encoding="utf-8")
    read = {match.group(1) for match in VARIABLE.finditer(text)}
    assert read == set(env_example())


def test_the_image_is_slim_non_root_with_a_healthz_check_and_only_the_relay_extra() -> None:
    dockerfile = (KIT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.MULTILINE)
    user = re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*http://127\.0\.0\.1:8765/healthz", dockerfile, re.MULTILINE)
    assert "['optional-dependencies']['relay']" in dockerfile and "pip install --no-deps ." in dockerfile
    assert '"--port", "8765"' in dockerfile and '"--data-dir", "/data"' in dockerfile
    ignore = (KIT / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    assert ignore[ignore.index("*") + 1:ignore.index("*") + 5] == ["!pyproject.toml", "!README.md", "!engine/",
                                                                   "!installers/relay/smoke.py"]
    assert "COPY installers/relay/smoke.py /opt/sapling/smoke.py" in dockerfile


@pytest.mark.integration
def test_compose_yaml_passes_the_compose_specification_schema() -> None:
    checker = Path(sys.executable).with_name("check-jsonschema")
    done = subprocess.run([str(checker), "--builtin-schema", "vendor.compose-spec", str(KIT / "compose.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_systemd_relay_toml_is_accepted_by_the_relay() -> None:
    settings = settings_from_args(["--config", str(KIT / "relay.toml.example"), "--port", "8701"])
    assert settings.redis == "redis://127.0.0.1:6379/0" and settings.port == 8701
    # Caddy on the same host reaches the relays from 127.0.0.1: trusted, so the cap is per node
    assert settings.trusted_proxy == ["127.0.0.1"] and settings.max_conn_per_ip == 16


def test_the_relay_unit_listens_on_loopback_and_lets_redis_restart_alone() -> None:
    unit = (KIT / "systemd" / "sapling-relay@.service").read_text(encoding="utf-8")
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.MULTILINE)
    assert exec_start and "--host 127.0.0.1 --port %i" in exec_start.group(1)
    assert "--config /etc/sapling-relay/relay.toml" in exec_start.group(1)
    assert re.search(r"^Wants=.*redis-server\.service", unit, re.MULTILINE)
    assert not re.search(r"^(Requires|BindsTo)=.*redis", unit, re.MULTILINE)  # the relays reconnect by themselves
    for line in ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=",
                 "StateDirectory=sapling-relay", "Restart=always"):
        assert re.search(rf"^{re.escape(line)}$", unit, re.MULTILINE), line
    caddy_env = (KIT / "systemd" / "caddy.env.example").read_text(encoding="utf-8")
    assert 'SAPLING_UPSTREAMS="127.0.0.1:8701 127.0.0.1:8702"' in caddy_env  # the ports the docs enable


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_finds_nothing_to_warn_about_in_the_relay_unit(tmp_path: Path) -> None:
    relay = Path(sys.executable).with_name("sapling-relay")  # ExecStart must name a program that exists
    unit = (KIT / "systemd" / "sapling-relay@.service").read_text(encoding="utf-8")
    (tmp_path / "sapling-relay@.service").write_text(unit.replace("/opt/sapling-relay/bin/sapling-relay", str(relay)))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", "sapling-relay@8701.service"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("caddy") is None, reason="caddy is not installed (make test installs it)")
@pytest.mark.parametrize(("upstreams", "dials"), [
    ("", ["127.0.0.1:8701", "127.0.0.1:8702"]),  # systemd: the default
    ("relay1:8765 relay2:8765", ["relay1:8765", "relay2:8765"]),  # compose
])
def test_caddy_reads_the_caddyfile_for_a_real_domain(tmp_path: Path, upstreams: str, dials: list[str]) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SAPLING_DOMAIN": "relay.example.org"}
    if upstreams:
        env["SAPLING_UPSTREAMS"] = upstreams
    done = subprocess.run(["caddy", "adapt", "--config", str(KIT / "Caddyfile"), "--adapter", "caddyfile"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert '"host":["relay.example.org"]' in text.replace(" ", "")
    assert [f'"dial":"{d}"' for d in dials] == re.findall(r'"dial":"[^"]+"', text.replace(" ", ""))
    assert '"policy":"least_conn"' in text.replace(" ", "") and '"uri":"/healthz"' in text.replace(" ", "")
    assert "internal" not in text  # a real domain gets a public certificate, not Caddy's own CA
