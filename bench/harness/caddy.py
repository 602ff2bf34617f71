"""Debian's caddy serving the deployment kit's Caddyfile on loopback, for the tests and the benches.

    from bench.harness.caddy import start_caddy
    proc, https_port, ca = start_caddy(tmp_path, logs, [relay_port_1, relay_port_2])

installers/relay/Caddyfile has no global options block of its own: this puts
one in front of it (certificates from Caddy's own local CA, kept out of the
system trust store, no admin endpoint, storage under the given folder, free
ports) and serves it, with SAPLING_DOMAIN=localhost:PORT and
SAPLING_UPSTREAMS naming the relay ports, exactly as the kit's systemd and
compose setups fill them in. Used by tests/swarm/test_relay_stack.py,
tests/swarm/test_restarts.py and bench/relay_failover.py.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.harness.servers import free_port, wait_listening

ROOT = Path(__file__).resolve().parents[2]
KIT_CADDYFILE = ROOT / "installers" / "relay" / "Caddyfile"
CADDY = shutil.which("caddy")
START_TIMEOUT_S = 30.0
TEST_GLOBALS = """{
	admin off
	local_certs
	skip_install_trust
	storage file_system %(storage)s
	http_port %(http_port)d
	https_port %(https_port)d
}

"""


def https_get(port: int, path: str, ca: Path, timeout: float = 10.0) -> tuple[int, str]:
    """GET https://localhost:PORT/path trusting `ca` only: (status, body), error statuses included."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(f"https://localhost:{port}{path}", context=context, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def start_caddy(tmp_path: Path, logs: Path, relay_ports: Sequence[int],
                caddyfile_text: str | None = None) -> tuple[subprocess.Popen[bytes], int, Path]:
    """Caddy serving the kit's Caddyfile (or `caddyfile_text`) on free ports in front of `relay_ports`, once it
    serves https://localhost:PORT/healthz with its own CA: (the process, the HTTPS port, the CA's root certificate).
    Its log is logs/caddy.log; its storage and home are under `tmp_path`. RuntimeError when it does not start."""
    if CADDY is None:
        raise RuntimeError("caddy is not installed (apt-get install caddy)")
    https_port, http_port = free_port(), free_port()
    storage = tmp_path / "caddy"
    caddyfile = tmp_path / "Caddyfile"
    body = KIT_CADDYFILE.read_text() if caddyfile_text is None else caddyfile_text
    caddyfile.write_text(TEST_GLOBALS % {"storage": storage, "http_port": http_port, "https_port": https_port}
                         + body)
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
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the certificate is issued just after Caddy starts listening
            try:
                if ca.exists() and https_get(https_port, "/healthz", ca)[0] == 200:
                    return proc, https_port, ca
            except (OSError, ssl.SSLError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"caddy did not serve https: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    except BaseException:
        proc.terminate()
        proc.wait(timeout=20)
        raise
