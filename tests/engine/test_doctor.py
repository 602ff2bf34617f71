"""`sapling-node doctor` and the relay information fetcher, against real servers on loopback.

The doctor runs as a real `sapling-node` process against a real relay, a closed
port, a private relay without a token, a plain HTTP server, a server that never
answers, and (where caddy is installed) a relay behind Caddy's TLS. The
information document is fetched from a real relay, and from small loopback
servers that answer with HTML, 10 MB, or nothing.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.harness.servers import free_port
from engine.common.errors import ConfigError, RelayError
from engine.common.joining import MAX_INFO_BYTES, fetch_relay_info, parse_relay_info, preview_invite
from engine.common.rules import Invite
from engine.relay.embedded import EmbeddedRelay
from engine.relay.settings import RelaySettings
from engine.swarm.doctor import STEPS, run_doctor
from tests.conftest import StartRelay

ROOT = Path(__file__).resolve().parents[2]
CADDY = shutil.which("caddy")


def doctor(*args: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", "doctor", "--home", str(home), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def json_lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]






# -- servers that are not relays -----------------------------------------------------------------
def serve(handler: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on a free loopback port that hands each connection to `handler` on a thread."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    stop = threading.Event()
    held: list[socket.socket] = []

    def loop() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts connections and never says a word."""
    yield from serve(lambda conn: None)


@pytest.fixture
def html_port() -> Iterator[int]:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><html><body>Welcome to nginx!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _huge(conn: socket.socket, declare: bool) -> None:
    try:
        conn.recv(4096)
        head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
        if declare:
            head += f"Content-Length: {10 * 1024 * 1024}\r\n".encode()
        conn.sendall(head + b"\r\n" + b'{"software": "sapling-relay", "pad": "')
        chunk = b"x" * 65536
        for _ in range(160):  # 10 MB, unless the reader hangs up first
            conn.sendall(chunk)
    except OSError:
        pass


# -- the doctor, a real process ------------------------------------------------------------------
@pytest.mark.integration
def test_the_doctor_passes_against_a_running_relay(start_relay: StartRelay, tmp_path: Path) -> None:
    relay = start_relay(name="doctor test")
    out = doctor("--relay", relay.url, home=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All checks passed" in out.stdout and "Traceback" not in out.stderr
    for _step, title in STEPS:
        assert title in out.stdout
    assert "'doctor test'" in out.stdout and " ms " in out.stdout
    assert not (tmp_path / "data" / "identity.key").exists()  # no key yet: checked with a throwaway, none written
    lines = json_lines(doctor("--relay", relay.url, "--json", home=tmp_path).stdout)
    assert lines[0] == {"checking": relay.url, "source": "--relay"}
    steps = [line for line in lines if "step" in line]
    assert [s["step"] for s in steps] == [step for step, _title in STEPS]
    assert {s["status"] for s in steps} == {"ok", "skipped"} and steps[3]["status"] == "skipped"  # ws://: no TLS
    assert lines[-1]["done"] is True and lines[-1]["ok"] is True


@pytest.mark.integration
def test_the_doctor_uses_the_swarm_in_the_settings_and_this_nodes_key(start_relay: StartRelay, tmp_path: Path) -> None:
    from engine.swarm.identity import Identity

    relay = start_relay(join_token="s3cret")
    me = Identity.load_or_create(tmp_path / "data" / "identity.key")
    (tmp_path / "config").mkdir()
    link = Invite((relay.url,), "s3cret", "Lab").link()
    (tmp_path / "config" / "config.toml").write_text(f'[swarm]\nmode = "relay"\nrelay_url = "{link}"\n')
    out = doctor(home=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(from config.toml)" in out.stdout and "join token accepted" in out.stdout
    assert f"peer id {me.peer_id}" in out.stdout and "swarm 'Lab'" in out.stdout


@pytest.mark.integration
def test_the_doctor_names_the_failing_step_in_one_sentence(start_relay: StartRelay, tmp_path: Path,
                                                           html_port: int) -> None:
    closed = free_port()
    private = start_relay(join_token="s3cret")
    cases = [
        (f"ws://127.0.0.1:{closed}/ws", "tcp", "Nothing accepts connections at"),
        (private.url, "hello", "The relay needs a join token"),
        (Invite((private.url,), "wrong", "").link(), "hello", "refused this join token"),
        (f"ws://127.0.0.1:{html_port}/ws", "websocket", "not a Sapling relay"),
    ]
    for relay, step, words in cases:
        out = doctor("--relay", relay, home=tmp_path)
        assert out.returncode == 1, out.stdout
        verdict = out.stdout.strip().splitlines()[-1]
        assert verdict.startswith(f'Failed at "{dict(STEPS)[step]}": ') and words in verdict, out.stdout
        assert verdict.count(". ") == 0 and "Traceback" not in out.stdout + out.stderr  # one sentence, no traceback
        last = json_lines(doctor("--relay", relay, "--json", home=tmp_path).stdout)[-1]
        assert last["ok"] is False and last["failed_step"] == step


@pytest.mark.integration
def test_a_relay_that_never_answers_costs_one_step_timeout(silent_port: int, tmp_path: Path) -> None:
    started = time.monotonic()
    out = doctor("--relay", f"ws://127.0.0.1:{silent_port}/ws", "--timeout", "2", home=tmp_path)
    took = time.monotonic() - started
    assert out.returncode == 1
    assert 'Failed at "Websocket"' in out.stdout and "did not answer within 2 s" in out.stdout
    assert took < 2 + 10  # the step's timeout, plus starting Python (generous on a loaded 2-core machine)


@pytest.mark.parametrize(("text", "words"), [
    ("javascript:alert(1)", "not javascript:"),
    ("file:///etc/passwd", "not file:"),
    ("gopher://relay.example.org/ws", "not gopher:"),
    ("wss://relay.example.org/ws" + "a" * 10_000, "more than the 4096"),
    ("sapling://join?relay=wss%3A%2F%2Fr.example.org%2Fws&token=a%07b", "control characters"),
])
def test_an_address_that_is_not_one_stops_at_the_first_step_with_exit_2(tmp_path: Path, text: str, words: str) -> None:
    out = io.StringIO()
    assert run_doctor(text, None, None, out=out) == 2
    lines = out.getvalue().strip().splitlines()
    assert "Address" in lines[0] and words in lines[-1] and len(lines) == 2
    out = io.StringIO()
    assert run_doctor(text, None, None, as_json=True, out=out) == 2
    assert json_lines(out.getvalue())[-1]["failed_step"] == "address"


def test_a_solo_node_has_no_relay_to_check(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[swarm]\nmode = "solo"\n')
    out = io.StringIO()
    assert run_doctor(None, None, config, out=out) == 0
    assert "trains alone" in out.getvalue()


# -- the information document -------------------------------------------------------------------
@pytest.mark.integration
def test_the_information_document_of_a_real_relay_is_read_and_checked(start_relay: StartRelay) -> None:
    relay = start_relay(name="Lab swarm", contact="ops@example.org", description="Arithmetic, evenings.")
    info = fetch_relay_info(relay.url)
    assert (info.name, info.contact, info.description, info.protocol) == ("Lab swarm", "ops@example.org",
                                                                         "Arithmetic, evenings.", 1)
    assert info.software == "sapling-relay" and info.policy_words() == "Open: anyone may join"
    assert info.live.peers_online == 0
    preview = preview_invite(Invite((relay.url,), "", "").link())
    assert preview.name == "Lab swarm" and "name=Lab%20swarm" in preview.link()  # the relay's name kept in the link
    private = start_relay(join_token="t0k")
    with pytest.raises(ConfigError, match="private and this invite has no join token"):
        preview_invite(private.url)
    assert preview_invite(f"{private.url}?token=t0k").info.private


@pytest.mark.integration
def test_a_bad_information_document_is_one_sentence_and_quick(html_port: int, silent_port: int) -> None:
    with pytest.raises(RelayError, match="answered with a web page"):
        fetch_relay_info(f"ws://127.0.0.1:{html_port}/ws")
    started = time.monotonic()
    with pytest.raises(RelayError, match="did not answer within 1 s"):
        fetch_relay_info(f"ws://127.0.0.1:{silent_port}/ws", timeout=1.0)
    assert time.monotonic() - started < 3
    with pytest.raises(RelayError, match="Nothing accepts connections"):
        fetch_relay_info(f"ws://127.0.0.1:{free_port()}/ws")
    for declare in (True, False):
        for port in serve(lambda conn, d=declare: _huge(conn, d)):  # type: ignore[misc]
            with pytest.raises(RelayError, match=f"more than the {MAX_INFO_BYTES // 1024} kB"):
                fetch_relay_info(f"ws://127.0.0.1:{port}/ws")


@pytest.mark.parametrize(("change", "words"), [
    ({"protocol": 2}, "speaks swarm protocol 2 and this Sapling speaks 1: update Sapling"),
    ({"protocol": "1"}, "protocol must be a whole number"),
    ({"software": "nginx"}, "is not a Sapling relay"),
    ({"name": 7}, "name must be text"),
    ({"name": "x" * 500}, "name is longer than"),
    ({"contact": "a\x1b[31mb"}, "contact contains control characters"),
    ({"policy": {"join": "maybe"}}, "policy.join must be"),
    ({"live": {"peers_online": -1}}, "live.peers_online must be a whole number"),
    ({"live": {"peers_online": True}}, "live.peers_online must be a whole number"),
    ({"live": {"publishes_per_minute": float("nan")}}, "publishes_per_minute must be a number"),
    ({"urls": "wss://x"}, "urls must be a list"),
])
def test_every_field_of_the_information_document_is_checked(change: dict[str, object], words: str) -> None:
    doc: dict[str, object] = {"software": "sapling-relay", "version": "0.1.0", "protocol": 1, "name": "Lab",
                              "description": "", "contact": "", "policy": {"join": "open", "allow_list": False},
                              "models": None, "limits": {}, "public_key": None, "urls": [],
                              "live": {"peers_online": 3, "batches_last_hour": 0, "publishes_per_minute": 0.0,
                                       "joined_today": 1}}
    assert parse_relay_info(doc, "relay.example.org").live.peers_online == 3
    doc.update(change)
    with pytest.raises(RelayError, match=words.replace("(", r"\(")) as caught:
        parse_relay_info(doc, "relay.example.org")
    assert str(caught.value).count(". ") == 0  # one sentence


# -- TLS, through a real Caddy ------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.skipif(CADDY is None, reason="caddy is not installed (make test installs it: apt-get install caddy)")
def test_the_doctor_checks_tls_through_caddy(tmp_path: Path) -> None:
    relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, name="behind caddy"))
    relay.start()
    https_port, http_port = free_port(), free_port()
    storage = tmp_path / "caddy"
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(
        f"{{\n\tadmin off\n\tlocal_certs\n\tskip_install_trust\n\tstorage file_system {storage}\n"
        f"\thttp_port {http_port}\n\thttps_port {https_port}\n}}\n\n"
        f"localhost:{https_port} {{\n\treverse_proxy 127.0.0.1:{relay.port}\n}}\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"), "XDG_DATA_HOME": str(tmp_path / "xdg-data")}
    assert CADDY is not None
    caddy = subprocess.Popen([CADDY, "run", "--config", str(caddyfile), "--adapter", "caddyfile"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    ca = storage / "pki" / "authorities" / "local" / "root.crt"
    url = f"wss://localhost:{https_port}/ws"
    try:
        deadline = time.monotonic() + 30
        while True:  # the certificate is issued just after Caddy starts listening
            try:
                if ca.exists():
                    fetch_relay_info(url, context=ssl.create_default_context(cafile=str(ca)))
                    break
            except RelayError:
                pass
            assert time.monotonic() < deadline and caddy.poll() is None, "caddy did not serve https"
            time.sleep(0.2)
        trusted = subprocess.run([sys.executable, "-m", "engine.cli", "doctor", "--home", str(tmp_path / "home"),
                                  "--relay", url], cwd=ROOT, capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "SSL_CERT_FILE": str(ca)})
        assert trusted.returncode == 0, trusted.stdout + trusted.stderr
        assert "certificate for localhost, valid until" in trusted.stdout
        untrusted = doctor("--relay", url, home=tmp_path / "home")
        assert untrusted.returncode == 1
        assert 'Failed at "TLS": The certificate of localhost is not from an authority this computer trusts' \
            in untrusted.stdout
        preview = preview_invite(url, context=ssl.create_default_context(cafile=str(ca)))
        assert preview.info.name == "behind caddy"
    finally:
        caddy.terminate()
        caddy.wait(timeout=20)
        relay.stop()
