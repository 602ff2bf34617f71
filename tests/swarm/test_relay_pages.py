"""The relay's pages, second pass: one Server header, a branded 404, /join that vouches only for its own relays,
and a status page that fits a phone (in Debian's chromium).

    .venv/bin/python -m pytest -q tests/swarm/test_relay_pages.py
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.swarm.conftest import StartRelay
from tests.swarm.test_relay_web import BROWSER_ACCEPT, XSS, PageWatch, _base, chromium  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration  # every test here starts a relay


def fetch(url: str, method: str = "GET") -> tuple[int, Any, str]:
    """(status, headers, body) of one request, error statuses included."""
    request = urllib.request.Request(url, method=method, headers={"Accept": BROWSER_ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def text_of(body: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', body, re.S)
    assert found, f"no #{element_id} in the page"
    return found.group(1)


# -- headers and errors -------------------------------------------------------------------------
def test_every_answer_names_the_relay_once_without_versions(start_relay: StartRelay) -> None:
    relay = start_relay()
    for path, method in (("/", "GET"), ("/healthz", "GET"), ("/nothing-here", "GET"), ("/static/x.js", "GET"),
                         ("/healthz", "POST"), ("/metrics", "GET")):
        _status, headers, _body = fetch(_base(relay) + path, method)
        assert headers.get_all("Server") == ["sapling-relay"], (path, headers.get_all("Server"))


@pytest.mark.parametrize("path", ["/nothing-here", "/static/missing.js", "/join/", "/.well-known/other"])
def test_an_unknown_path_gets_the_relays_own_404_page(start_relay: StartRelay, path: str) -> None:
    relay = start_relay()
    status, headers, body = fetch(_base(relay) + path)
    assert status == 404 and headers["Content-Type"].startswith("text/html")
    assert "Page not found" in body and "404: Not Found" not in body
    assert 'href="/"' in body and 'href="/static/relay.css"' in body  # the relay's style and a way back


def test_a_wrong_method_gets_a_405_page_naming_the_allowed_ones(start_relay: StartRelay) -> None:
    relay = start_relay()
    status, headers, body = fetch(_base(relay) + "/healthz", "POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert "answers GET, HEAD only, not POST" in text_of(body, "error-message")
