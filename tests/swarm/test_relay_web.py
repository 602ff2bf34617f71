"""The relay's web face on a real relay: information document, status page, /join, bad input, chromium.

    .venv/bin/python -m pytest -q tests/swarm/test_relay_web.py
    SAPLING_SCREENSHOT_DIR=docs/screenshots .venv/bin/python -m pytest -q tests/swarm/test_relay_web.py -k browser

The browser tests drive Debian's chromium (`apt-get install chromium`) with
Playwright from PyPI; Playwright's own browser downloads are never used. With
SAPLING_SCREENSHOT_DIR set, the status page test saves relay-status.png there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.servers import RedisServer, free_port, wait_listening
from engine import __version__
from engine.common.rules import Invite
from engine.relay.info import INFO_FIELDS, LIVE_FIELDS, relay_identity
from engine.relay.web import DOWNLOAD_URL, SECURITY_HEADERS, wants_json
from engine.swarm import protocol
from engine.swarm.identity import Identity
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, item

ROOT = Path(__file__).resolve().parents[2]
# Debian's chromium (make test-deps installs it); GitHub's Ubuntu runners carry Google Chrome instead.
CHROMIUM = Path(next((found for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
                      if (found := shutil.which(name))), "/usr/bin/chromium"))
XSS = "<script>alert(1)</script>"
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"

pytestmark = pytest.mark.integration  # every test here starts a relay


def _base(relay: Any) -> str:
    return f"http://127.0.0.1:{relay.port}"


def _get(url: str, accept: str | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept is not None else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode("utf-8", "replace")


def _json(url: str) -> dict[str, Any]:
    status, headers, body = _get(url, "application/json")
    assert status == 200 and headers["Content-Type"].startswith("application/json"), (status, body[:200])
    return dict(json.loads(body))


async def _poll(url: str, ready: Any, timeout: float = 20.0) -> dict[str, Any]:
    """GET url (JSON) until ready(doc) holds; the last document if it never does (the assert shows it)."""
    deadline = time.monotonic() + timeout
    while True:
        doc = await asyncio.to_thread(_json, url)
        if ready(doc) or time.monotonic() > deadline:
            return doc
        await asyncio.sleep(0.2)


def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side URL clean-up); the status code and the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(request)
        except OSError:
            pass  # the relay may answer and close before it has read a huge request
        chunks: list[bytes] = []
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    answer = b"".join(chunks)
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
    assert match, answer[:200]
    return int(match.group(1)), answer


def _raw_get(port: int, target: str, *headers: str) -> tuple[int, bytes]:
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", *headers, "", ""]
    return _raw(port, "\r\n".join(lines).encode("latin-1"))


# -- the information document -------------------------------------------------------------------
async def test_the_information_document_has_every_field(start_relay: StartRelay, tmp_path: Path) -> None:
    relay = start_relay(name="Maths club", description="We train on arithmetic.", contact="ops@example.org",
                        operator="Hill School IT", public_url=["wss://relay.example.org/ws", "wss://backup.example.org/ws"],
                        join_token="tok", data_dir=str(tmp_path))
    peer = DocPeer(relay.url, token="tok")
    welcome = await peer.connect()
    assert welcome["type"] == "welcome"
    doc = await _poll(_base(relay) + "/.well-known/sapling-relay", lambda d: d["live"]["joined_today"] == 1)
    assert tuple(doc) == INFO_FIELDS and tuple(doc["live"]) == LIVE_FIELDS
    key = Identity.load_or_create(tmp_path / "relay.key").public_key
    assert doc == {
        "software": "sapling-relay", "version": __version__, "protocol": protocol.VERSION,
        "name": "Maths club", "description": "We train on arithmetic.", "operator": "Hill School IT",
        "contact": "ops@example.org", "policy": {"join": "token", "allow_list": False}, "models": None,
        "dataset": None, "limits": welcome["limits"],
        "public_key": protocol.b64encode(key),
        "urls": ["wss://relay.example.org/ws", "wss://backup.example.org/ws"],
        "live": {"peers_online": 1, "batches_last_hour": 0, "publishes_per_minute": 0.0, "joined_today": 1},
    }
    await peer.close()
    # The same document at / for a client that asks for JSON, whatever the well-known path was asked with.
    status, headers, body = _get(_base(relay) + "/.well-known/sapling-relay", BROWSER_ACCEPT)
    assert status == 200 and json.loads(body)["name"] == "Maths club"
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert _json(_base(relay) + "/")["public_key"] == doc["public_key"]


def test_docs_protocol_describes_every_field() -> None:
    doc = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = doc[doc.index("## The relay's information document"):]
    section = section[:section.index("\n## ", 4)]
    for name in (*INFO_FIELDS, *LIVE_FIELDS, "join", "allow_list"):
        assert f"`{name}`" in section, name


@pytest.mark.parametrize(("accept", "json_wanted"), [
    ("", False),
    ("*/*", False),
    (BROWSER_ACCEPT, False),
    ("application/json", True),
    ("application/json, text/plain, */*", True),
    ("application/*", True),
    ("text/html;q=0.1, application/json", True),
    ("application/json;q=0.5, text/html", False),
    ("application/json;q=0", False),
    ("text/plain", False),
])
def test_root_answers_json_only_to_a_client_that_prefers_it(accept: str, json_wanted: bool) -> None:
    assert wants_json(accept) is json_wanted


@pytest.mark.parametrize("accept", ["text", "application/json;q=abc", "application/json;q=2", "a/b/c",
                                    "x" * 2000, "text/html, <script>"])
def test_a_malformed_accept_header_is_refused(accept: str) -> None:
    with pytest.raises(ValueError):
        wants_json(accept)


async def test_live_numbers_and_the_days_series_follow_publishes(start_relay: StartRelay) -> None:
    relay = start_relay(rate=100.0, burst=100.0)
    a, b = DocPeer(relay.url), DocPeer(relay.url)
    await a.connect()
    await b.connect()
    claims: list[float | None] = [1.0, 0.0, None, 5.0]  # 5.0 is a sender's exaggeration: counted as 1
    for _ in range(3):
        assert (await a.publish([item(completions=("a", "b", "c", "d"), rewards=claims)]))["type"] == "published"
    stats = await _poll(_base(relay) + "/stats.json", lambda d: d["live"]["batches_last_hour"] == 3)
    assert stats["live"]["batches_last_hour"] == 3 and stats["live"]["joined_today"] == 2
    assert stats["live"]["peers_online"] == 2 and stats["live"]["publishes_per_minute"] > 0
    series = stats["series"]
    assert sum(series["rollouts"]) == 12 and len(series["minute"]) == len(series["reward"]) >= 1
    assert [r for r in series["reward"] if r is not None] in ([0.6667], [0.6667, 0.6667])
    assert all(m % 60 == 0 and stats["now"] - 86400 < m <= stats["now"] for m in series["minute"])
    await a.close()
    await b.close()


async def test_relays_sharing_redis_show_the_same_live_numbers(start_relay: StartRelay,
                                                               redis_server: RedisServer) -> None:
    one, two = start_relay(redis=redis_server.url), start_relay(redis=redis_server.url)
    a, b = DocPeer(one.url), DocPeer(two.url)
    await a.connect()
    await b.connect()
    assert (await a.publish([item()]))["type"] == "published"
    assert (await a.publish([item()]))["type"] == "published"
    assert (await b.publish([item()]))["type"] == "published"
    want = {"peers_online": 2, "batches_last_hour": 3, "joined_today": 2}

    def agreed(doc: dict[str, Any]) -> bool:
        return all(doc["live"][k] == v for k, v in want.items())

    for relay in (one, two):  # the other process's counts arrive with its next stats tick (5 s)
        doc = await _poll(_base(relay) + "/.well-known/sapling-relay", agreed, timeout=30)
        assert {k: doc["live"][k] for k in want} == want
        assert sum((await asyncio.to_thread(_json, _base(relay) + "/stats.json"))["series"]["rollouts"]) == 6
    await a.close()
    await b.close()


async def test_the_pages_keep_answering_while_redis_is_down(start_relay: StartRelay, redis_server: RedisServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sapling.relay")
    relay = start_relay(redis=redis_server.url)
    peer = DocPeer(relay.url)
    await peer.connect()
    assert (await peer.publish([item()]))["type"] == "published"
    await _poll(_base(relay) + "/stats.json", lambda d: d["live"]["batches_last_hour"] == 1)
    port = redis_server.port
    subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=10)
    deadline = time.monotonic() + 10
    while True:  # wait until redis-server is really gone
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    deadline = time.monotonic() + 20
    while not any(r.getMessage().startswith("live stats not read") for r in caplog.records):
        assert time.monotonic() < deadline, "the relay never tried to read its numbers from the stopped Redis"
        for path in ("/.well-known/sapling-relay", "/stats.json"):
            doc = await asyncio.to_thread(_json, _base(relay) + path)
            assert doc["live"]["batches_last_hour"] == 1  # the last numbers read, not an error
        await asyncio.sleep(0.2)
    status, _, body = await asyncio.to_thread(_get, _base(relay) + "/", BROWSER_ACCEPT)
    assert status == 200 and "peers online" in body
    await peer.close()


def test_the_relays_key_is_made_once_and_kept(tmp_path: Path) -> None:
    first = relay_identity(str(tmp_path)).public_key
    assert relay_identity(str(tmp_path)).public_key == first
    if os.name == "posix":
        assert (tmp_path / "relay.key").stat().st_mode & 0o777 == 0o600
    # Several relay processes starting at once on one folder end up with one key.
    folder = tmp_path / "shared"
    keys: list[bytes] = []
    start = threading.Barrier(8)

    def make() -> None:
        start.wait()
        keys.append(relay_identity(str(folder)).public_key)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["relay.key"]  # no temporary file left behind


# -- pages --------------------------------------------------------------------------------------
def test_every_page_sends_the_security_headers(start_relay: StartRelay) -> None:
    relay = start_relay()
    invite = Invite(("wss://relay.example.org/ws",), "", "Club")
    for path, status in (("/", 200), ("/.well-known/sapling-relay", 200), ("/stats.json", 200),
                         ("/join?" + invite.link().split("?", 1)[1], 200), ("/join", 400),
                         ("/static/status.js", 200), ("/static/uPlot.min.css", 200), ("/nothing-here", 404)):
        got, headers, _ = _get(_base(relay) + path, BROWSER_ACCEPT)
        assert got == status, path
        for name, value in SECURITY_HEADERS.items():
            assert headers.get(name) == value, (path, name)
    assert "default-src 'self'" in SECURITY_HEADERS["Content-Security-Policy"]
    assert "unsafe" not in SECURITY_HEADERS["Content-Security-Policy"]


def test_the_status_page_escapes_what_it_shows(start_relay: StartRelay) -> None:
    relay = start_relay(name=XSS, description='<img src=x onerror="alert(2)">', contact="javascript:alert(3)")
    status, headers, body = _get(_base(relay) + "/", BROWSER_ACCEPT)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert XSS not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<img" not in body and 'href="javascript:' not in body
    scripts = re.findall(r"<script[^>]*>", body)
    assert scripts == ['<script defer src="/static/uPlot.iife.min.js">', '<script defer src="/static/status.js">']
    assert "style=" not in body and "<style" not in body
    assert DOWNLOAD_URL in body and __version__ in body


def test_the_status_page_invites_to_the_public_urls_and_never_shows_a_token(start_relay: StartRelay) -> None:
    relay = start_relay(name="Club", public_url=["wss://relay.example.org/ws"])
    body = _get(_base(relay) + "/", BROWSER_ACCEPT)[2]
    link = Invite(("wss://relay.example.org/ws",), "", "Club").link()
    assert f'href="{link.replace("&", "&amp;")}"' in body
    private = start_relay(name="Club", public_url=["wss://relay.example.org/ws"], join_token="s3cret-token")
    body = _get(_base(private) + "/", BROWSER_ACCEPT)[2]
    assert "s3cret-token" not in body and "sapling://" not in body and "private" in body


def test_the_join_page_offers_the_link_and_the_download(start_relay: StartRelay) -> None:
    urls = ("wss://relay.example.org/ws", "wss://b.example.org/ws")
    relay = start_relay(name=XSS, public_url=list(urls))
    invite = Invite(urls, "tok", "Some other name")
    status, _, body = _get(invite.page_url(_base(relay)), BROWSER_ACCEPT)
    assert status == 200
    vouched = Invite(urls, "tok", XSS)  # the relay's own name replaces the link's
    assert f'href="{vouched.link().replace("&", "&amp;")}"' in body and "Open in Sapling" in body
    assert "Some other name" not in body
    assert XSS not in body and "&lt;script&gt;" in body and DOWNLOAD_URL in body
    assert "<script" not in body and "join token" in body


@pytest.mark.parametrize(("query", "words"), [
    ("", "names no relay"),
    ("relay=javascript%3Aalert(1)", "ws:// or wss://"),
    ("relay=file%3A%2F%2F%2Fetc%2Fpasswd", "ws:// or wss://"),
    ("relay=wss%3A%2F%2Fa%2Fws&name=a%00b", "control characters"),
    ("relay=wss%3A%2F%2Fa%2Fws&token=" + "t" * 300, "longer than 256"),
    ("relay=wss%3A%2F%2F" + "h" * 5000 + "%2Fws", "characters long"),
    ("relay=wss%3A%2F%2F%5B%2Fws", "not a valid URL"),
])
def test_a_bad_invite_gets_a_400_page_with_one_sentence(start_relay: StartRelay, query: str, words: str) -> None:
    relay = start_relay()
    status, headers, body = _get(_base(relay) + "/join?" + query, BROWSER_ACCEPT)
    assert status == 400 and headers["Content-Type"].startswith("text/html")
    message = re.search(r'<p class="error" id="error-message">(.*?)</p>', body)
    assert message and words in message.group(1), body[-600:]
    assert "<script" not in body


def test_bad_requests_get_a_4xx_and_the_relay_keeps_serving(start_relay: StartRelay) -> None:
    relay = start_relay()
    port = relay.port
    big = "x" * 65536
    for target, headers in (
        ("/", (f"X-Big: {big}",)),
        ("/", (f"Accept: {big}",)),
        ("/join?relay=wss%3A%2F%2Fa%2Fws", (f"Cookie: {big}",)),
        ("/", ("Accept: text/html, <script>",)),
        ("/.well-known/sapling-relay", ("Accept: application/json;q=abc",)),
        ("/stats.json", ("Accept: " + "a/b;" * 400,)),
        ("/join?relay=wss%3A%2F%2Fa%2Fws", ("Accept: \x01\x02",)),
        ("/join/../../etc/passwd", ()),
        ("/join/%2e%2e/%2e%2e/etc/passwd", ()),
        ("/join/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", ()),
        ("/static/../relay.py", ()),
        ("/static/%2e%2e%2frelay.py", ()),
        ("/static/..%5c..%5cengine%5c__init__.py", ()),
        ("/static/status.html", ()),
        ("/join?relay=" + "a" * 100_000, ()),
        ("/?" + "q" * 100_000, ()),
        ("/join?relay=wss%3A%2F%2F" + "h" * 10_000 + "%2Fws", ()),
    ):
        status, answer = _raw_get(port, target, *headers)
        assert 400 <= status < 500, (target[:60], headers[:1], answer[:300])
        assert b"root:" not in answer and b"__version__" not in answer and b"import " not in answer
    status, _ = _raw(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert status == 405
    status, _ = _raw_get(port, "/", "Accept: */*".replace("Host", ""))
    assert status == 200
    status, _ = _raw(port, b"GET / HTTP/1.1\r\nHost: [\r\nConnection: close\r\n\r\n")
    assert status < 500
    assert _get(_base(relay) + "/healthz")[0] == 200

    async def still_serving() -> None:
        peer, other = DocPeer(relay.url), DocPeer(relay.url)
        await peer.connect()
        await other.connect()
        assert (await peer.publish([item()]))["type"] == "published"
        assert len((await other.sample(1))["batches"]) == 1
        await peer.close()
        await other.close()

    asyncio.run(still_serving())


@given(accept=st.text(max_size=300))
def test_fuzz_accept_headers_give_a_bool_or_one_valueerror(accept: str) -> None:
    try:
        assert wants_json(accept) in (True, False)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)


QUERY_PARTS = st.lists(st.tuples(st.sampled_from(["relay", "token", "name", "x", ""]),
                                 st.text(max_size=60) | st.sampled_from(["wss://a.example/ws", "ws://[", "sapling://join"])),
                       max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=QUERY_PARTS, raw_tail=st.text(alphabet="%&=?/.+#;x0", max_size=20))
def test_fuzz_join_queries_get_a_page_or_a_400(start_relay: StartRelay, pairs: list[tuple[str, str]],
                                               raw_tail: str) -> None:
    # One relay for all the examples: the fixture (and so this attribute) lives as long as the test.
    relay = getattr(start_relay, "fuzz_relay", None) or start_relay()
    start_relay.fuzz_relay = relay  # type: ignore[attr-defined]
    query = urllib.parse.urlencode(pairs) + raw_tail.replace("#", "%23")
    status, headers, body = _get(_base(relay) + "/join?" + query, BROWSER_ACCEPT)
    assert status in (200, 400), (query, status, body[:200])
    assert headers["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    assert "<script" not in body


def test_the_relay_process_logs_a_malformed_request_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine.relay", "--port", str(port), "--data-dir",
                             str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, proc, "the relay")
        assert _raw_get(port, "/", "X-Big: " + "x" * 65536)[0] == 400
        assert _raw_get(port, "/?" + "q" * 100_000)[0] == 400
        assert _raw_get(port, "/healthz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in logs
    records = [json.loads(line) for line in logs.splitlines()]
    bad = [r for r in records if r["msg"].startswith("bad HTTP request from 127.0.0.1")]
    assert len(bad) == 2 and all(r["level"] == "info" and "8190 bytes" in r["msg"] for r in bad), bad
    assert (tmp_path / "relay.key").exists()


# -- in chromium --------------------------------------------------------------------------------
@pytest.fixture
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); Playwright never downloads one")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


class PageWatch:
    """Console errors, page errors and dialogs of one page: each one is a failure."""

    def __init__(self, page: Any) -> None:
        self.problems: list[str] = []
        page.on("console", lambda msg: self.problems.append(f"console {msg.type}: {msg.text}")
                if msg.type in ("error", "warning") else None)
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        page.on("dialog", self._dialog)

    def _dialog(self, dialog: Any) -> None:
        self.problems.append(f"dialog: {dialog.message}")
        dialog.dismiss()


def _batch(client: Any, identity: Identity, reward: float) -> str:
    items = [protocol.Item({"dataset": "basic_arithmetic", "seed": 0, "index": i}, f"What is {i} + {i}?",
                           ("<answer>2</answer>", "<answer>3</answer>", "<answer>4</answer>", "<answer>5</answer>"),
                           (reward, 0.0, reward, 1.0)) for i in range(4)]
    return protocol.batch_payload(identity.public_key, client.next_seq(), time.time(), "SmolLM2-135M-Instruct", items)


def test_browser_status_page_updates_live_from_real_peers(chromium: Any, start_relay: StartRelay,
                                                          tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from engine.swarm.client import SwarmClient

    relay = start_relay(name="Maths club swarm", description="SmolLM2 learning arithmetic, one rollout at a time.",
                        contact="ops@example.org", public_url=["wss://relay.example.org/ws"], rate=50.0, burst=50.0)
    page = chromium.new_page(viewport={"width": 1000, "height": 1200})
    watch = PageWatch(page)
    page.goto(_base(relay) + "/")
    assert page.text_content("#peers-online") == "0" and page.text_content("#batches-last-hour") == "0"
    identities = [Identity.generate() for _ in range(3)]
    clients = [SwarmClient(relay.url, identity) for identity in identities]
    try:
        for client in clients:
            client.start()
        assert all(client.wait_connected(20) for client in clients)
        sent = 0
        for round_ in range(3):
            for client, identity in zip(clients, identities, strict=True):
                assert client.publish(_batch(client, identity, reward=0.25 * (round_ + 1)))
                sent += 1
        # expect() polls from Playwright's own isolated world: the page's CSP forbids the eval of wait_for_function.
        expect(page.locator("#peers-online")).to_have_text("3", timeout=20_000)
        expect(page.locator("#batches-last-hour")).to_have_text(str(sent), timeout=20_000)
        expect(page.locator("#joined-today")).to_have_text("3", timeout=20_000)
        assert float(page.text_content("#rollouts-per-minute") or "0") > 0
        assert page.locator("#chart-rollouts canvas").count() == 1
        assert page.locator("#chart-reward canvas").count() == 1
        assert page.text_content("#open-link") == "Open in Sapling"
        assert page.get_attribute("#open-link", "href") == Invite(("wss://relay.example.org/ws",), "",
                                                                  "Maths club swarm").link()
        page.wait_for_timeout(500)  # let the charts finish drawing before the picture
        shot = Path(os.environ.get("SAPLING_SCREENSHOT_DIR") or tmp_path) / "relay-status.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
    finally:
        for client in clients:
            client.close()
    assert watch.problems == []


def test_browser_hostile_names_render_as_text(chromium: Any, start_relay: StartRelay) -> None:
    from playwright.sync_api import expect

    relay = start_relay(name=XSS, description='<img src=x onerror="alert(2)">',
                        public_url=["wss://relay.example.org/ws"])
    page = chromium.new_page()
    watch = PageWatch(page)
    page.goto(_base(relay) + "/")
    expect(page.locator("#status-line")).to_have_text(re.compile(r"^Updated "), timeout=20_000)
    assert page.text_content("#name") == XSS
    assert page.text_content("#description") == '<img src=x onerror="alert(2)">'
    assert page.locator("img").count() == 0
    assert page.eval_on_selector_all("script", "els => els.map(e => new URL(e.src).pathname)") == [
        "/static/uPlot.iife.min.js", "/static/status.js"]
    invite = Invite(("wss://relay.example.org/ws",), "", XSS)
    page.goto(invite.page_url(_base(relay)))
    assert page.text_content("#invite-name") == XSS
    assert page.get_attribute("#open-link", "href") == invite.link()
    assert page.locator("script").count() == 0
    assert watch.problems == []
    page.goto(_base(relay) + "/join?relay=javascript%3Aalert(1)&name=" + "%3Cscript%3Ealert(4)%3C%2Fscript%3E")
    assert "ws:// or wss://" in (page.text_content("#error-message") or "")
    # Chromium logs a document answered with 400 as a console error; nothing else may appear.
    assert watch.problems == ["console error: Failed to load resource: the server responded with a status of 400 "
                              "(Bad Request)"]
