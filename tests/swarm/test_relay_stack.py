"""The deployment kit's topology on loopback: Caddy (HTTPS) in front of two sapling-relay processes on one Redis.

    .venv/bin/python -m pytest -q tests/swarm/test_relay_stack.py

Everything is real and started from the checkout: Debian's `caddy` serving
installers/relay/Caddyfile (with a local CA instead of Let's Encrypt, no admin
endpoint, its storage in a temporary folder), two `.venv/bin/sapling-relay`
processes and one `redis-server` without persistence, each on a free port.
Nodes are the real client (engine.swarm.client.SwarmClient, run by
installers/relay/smoke.py) trusting Caddy's CA through SSL_CERT_FILE. The two
relay processes get different names so the test can tell which one a node
reached, and trust Caddy's address (`--trusted-proxy 127.0.0.1`), so they
count and log a node by the address Caddy puts in X-Forwarded-For. Skipped,
naming the program, only when caddy or redis-server is not installed
(`make test` installs both).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.harness.servers import RedisServer, free_port, wait_listening

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "installers" / "relay"
CADDY = shutil.which("caddy")
REDIS = shutil.which("redis-server")
RELAY = Path(sys.executable).with_name("sapling-relay")
NAMES = ("stack one", "stack two")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CADDY is None, reason="caddy is not installed (make test installs it: apt-get install caddy)"),
    pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (make test installs it)"),
]

# Prepended to the kit's Caddyfile, which has no global options of its own: certificates from
# Caddy's own CA, kept out of the system trust store, no admin endpoint, nothing outside tmp.
TEST_GLOBALS = """{
	admin off
	local_certs
	skip_install_trust
	storage file_system %(storage)s
	http_port %(http_port)d
	https_port %(https_port)d
}

"""


@dataclass
class Stack:
    https_port: int
    relay_ports: tuple[int, int]
    ca: Path  # Caddy's root certificate
    logs: Path

    @property
    def url(self) -> str:
        return f"wss://localhost:{self.https_port}/ws"

    def get(self, path: str) -> tuple[int, str]:
        """GET https://localhost:PORT/path through Caddy, trusting its CA: (status, body)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(f"https://localhost:{self.https_port}{path}", context=context, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The whole stack, started once for this module's tests and stopped after them."""
    assert CADDY is not None and REDIS is not None
    tmp_path = tmp_path_factory.mktemp("relay-stack")
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str], port: int, env: dict[str, str] | None = None) -> None:
        log = logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        procs.append(proc)
        wait_listening(port, proc, name, log)

    redis = RedisServer(REDIS, log=logs / "redis.log")
    try:
        redis.start()
        relay_ports = (free_port(), free_port())
        for name, port in zip(NAMES, relay_ports, strict=True):  # one after the other: the first makes the key
            start(name.replace(" ", "-"), [str(RELAY), "--host", "127.0.0.1", "--port", str(port), "--redis",
                                           redis.url, "--name", name,
                                           "--data-dir", str(tmp_path / "relay-data"), "--log-level", "info",
                                           "--trusted-proxy", "127.0.0.1", "--reject-log-every", "0.5"], port)
        caddy, https_port, ca = start_caddy(tmp_path, logs, relay_ports)
        procs.append(caddy)
        stack = Stack(https_port, relay_ports, ca, logs)
        yield stack
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        redis.stop()


def start_caddy(tmp_path: Path, logs: Path, relay_ports: Sequence[int]) -> tuple[subprocess.Popen[bytes], int, Path]:
    """Caddy serving the kit's Caddyfile on free ports in front of `relay_ports`, once it serves
    https://localhost:PORT/healthz with its own CA: (the process, the HTTPS port, the CA's root certificate).
    Its log is logs/caddy.log; its storage and home are under `tmp_path`. Also tests/swarm/test_restarts.py."""
    assert CADDY is not None
    https_port, http_port = free_port(), free_port()
    storage = tmp_path / "caddy"
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(TEST_GLOBALS % {"storage": storage, "http_port": http_port, "https_port": https_port}
                         + (KIT / "Caddyfile").read_text())
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"), "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
           "SAPLING_DOMAIN": f"localhost:{https_port}",
           "SAPLING_UPSTREAMS": " ".join(f"127.0.0.1:{port}" for port in relay_ports)}
    log = logs / "caddy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([CADDY, "run", "--config", str(caddyfile), "--adapter", "caddyfile"], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    ca = storage / "pki" / "authorities" / "local" / "root.crt"
    try:
        wait_listening(https_port, proc, "caddy", log)
        probe = Stack(https_port, (0, 0), ca, logs)
        deadline = time.monotonic() + 30
        while True:  # the certificate is issued just after Caddy starts listening
            try:
                if ca.exists() and probe.get("/healthz")[0] == 200:
                    return proc, https_port, ca
            except (OSError, ssl.SSLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"caddy did not serve https: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    except BaseException:
        proc.terminate()
        proc.wait(timeout=20)
        raise


def smoke(stack: Stack, *args: str) -> tuple[int, dict[str, Any], str]:
    """installers/relay/smoke.py against the stack, trusting Caddy's CA: (exit code, its JSON line, its output)."""
    env = {**os.environ, "SSL_CERT_FILE": str(stack.ca)}
    done = subprocess.run([sys.executable, str(KIT / "smoke.py"), *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return done.returncode, result, done.stdout + done.stderr


def test_a_node_publishes_over_wss_through_caddy_and_a_node_on_the_other_process_samples_it(stack: Stack) -> None:
    code, result, output = smoke(stack, stack.url, "--timeout", "30")
    assert code == 0 and result.get("ok") is True, output
    # Caddy's least_conn sent the second node to the process the first one was not on, so the batch
    # went from one relay process to the other through Redis.
    assert sorted(result["relays"]) == sorted(NAMES), output


def test_caddy_serves_health_and_keeps_metrics_private(stack: Stack) -> None:
    status, body = stack.get("/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    assert stack.get("/metrics")[0] == 404  # the Caddyfile's rule: Prometheus scrapes each process directly
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.relay_ports[0]}/metrics", timeout=10) as direct:
        assert b"sapling_relay_connections" in direct.read()


def test_the_relay_counts_and_logs_the_nodes_own_address_not_caddys(stack: Stack) -> None:
    # The node connects from 127.0.0.2 (Caddy itself reaches the relays from 127.0.0.1, their trusted proxy)
    # with an X-Forwarded-For of its own making, and sends a hello that is not one.
    async def bad_hello() -> dict[str, Any]:
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(stack.ca)),
                                         local_addr=("127.0.0.2", 0), family=socket.AF_INET)
        async with aiohttp.ClientSession(connector=connector) as session, \
                session.ws_connect(stack.url, headers={"X-Forwarded-For": "203.0.113.66"}) as ws:
            assert (await ws.receive_json(timeout=10))["type"] == "challenge"
            await ws.send_str("not a hello")
            answer: dict[str, Any] = await ws.receive_json(timeout=10)
            return answer

    assert asyncio.run(bad_hello())["code"] == "not_authenticated"
    deadline = time.monotonic() + 20
    while not (ips := refusal_ips(stack)):
        assert time.monotonic() < deadline, "no relay logged the refusal"
        time.sleep(0.1)
    assert ips == {"127.0.0.2"}  # the node's address as Caddy saw it: not Caddy's, not the one it made up


def refusal_ips(stack: Stack) -> set[str]:
    """The `ip` of every "refused messages" line the relay processes logged so far."""
    ips = set()
    for name in NAMES:
        for line in (stack.logs / f"{name.replace(' ', '-')}.log").read_text(errors="replace").splitlines():
            record = json.loads(line) if line.startswith("{") else {}
            if record.get("msg") == "refused messages":
                ips.add(record["ip"])
    return ips


def test_without_caddys_ca_the_node_refuses_the_certificate(stack: Stack) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    done = subprocess.run([sys.executable, str(KIT / "smoke.py"), stack.url, "--timeout", "3"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 1
    assert "could not join" in done.stdout and "certificate" in done.stdout.lower(), done.stdout
