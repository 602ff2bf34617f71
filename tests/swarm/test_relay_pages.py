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

from engine.common.rules import Invite
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


# -- /join vouches only for the relay's own addresses -------------------------------------------
def test_an_invite_to_another_relay_gets_the_does_not_vouch_page(start_relay: StartRelay) -> None:
    relay = start_relay(name="Our club", operator="Hill School IT", public_url=["wss://relay.example.org/ws"])
    spoof = Invite(("wss://other.example/ws",), "", "Riverside Maths Club")
    status, _headers, body = fetch(spoof.page_url(_base(relay)))
    assert status == 200 and text_of(body, "foreign-title") == "This page does not vouch for that relay"
    assert "<code>wss://other.example/ws</code>" in body
    assert text_of(body, "claimed-name") == "Riverside Maths Club"  # quoted as the link's claim, not as a title
    assert "<h1" not in body.split('id="claimed-name"')[0].split("foreign-title")[1]  # the only heading is the warning
    assert "sapling://" not in body and "Open in Sapling" not in body  # no button to the other relay
    assert "Hill School IT" not in body  # this site's operator does not lend its name to it
    # one own address and one foreign one: still not vouched for
    mixed = Invite(("wss://relay.example.org/ws", "wss://other.example/ws"), "", "Our club")
    assert "does not vouch" in fetch(mixed.page_url(_base(relay)))[2]


def test_an_invite_to_the_relays_own_address_shows_its_name_operator_and_contact(start_relay: StartRelay) -> None:
    relay = start_relay(name="Our club", operator="Hill <School> IT", contact="ops@example.org",
                        description="Arithmetic on Tuesdays.", public_url=["wss://Relay.Example.org:443/ws"])
    invite = Invite(("wss://relay.example.org/ws",), "tok", "A name someone else wrote")
    status, _headers, body = fetch(invite.page_url(_base(relay)))
    assert status == 200 and "does not vouch" not in body
    assert text_of(body, "invite-name") == "Our club" and "A name someone else wrote" not in body
    assert text_of(body, "invite-operator") == "Hill &lt;School&gt; IT"
    assert 'href="mailto:ops@example.org"' in body and text_of(body, "invite-description") == "Arithmetic on Tuesdays."
    link = Invite(("wss://relay.example.org/ws",), "tok", "Our club").link()
    assert f'href="{link.replace("&", "&amp;")}"' in body


def test_without_public_urls_the_relay_vouches_for_the_address_it_was_reached_at(start_relay: StartRelay) -> None:
    relay = start_relay(name="Lab")
    own = Invite((f"ws://127.0.0.1:{relay.port}/ws",), "", "Lab")
    body = fetch(own.page_url(_base(relay)))[2]
    assert text_of(body, "invite-name") == "Lab"
    other_port = Invite((f"ws://127.0.0.1:{relay.port + 1}/ws",), "", "Lab")
    assert "does not vouch" in fetch(other_port.page_url(_base(relay)))[2]


# -- the pages fit a phone ------------------------------------------------------------------------
LONG_NAME = "W" * 80  # the longest name the relay takes, with nowhere to break
LONG_HOST = "a-community-relay-with-a-rather-long-name-for-its-own-subdomain.maths-club.example.org"
SCREENS = [(320, 640), (390, 844), (1280, 800)]
NO_SIDEWAYS_SCROLL = "() => document.documentElement.scrollWidth <= document.documentElement.clientWidth"


def test_browser_every_page_fits_the_screen_without_sideways_scrolling(chromium: Any,  # noqa: F811
                                                                      start_relay: StartRelay) -> None:
    from playwright.sync_api import expect

    public = f"wss://{LONG_HOST}/ws"
    relay = start_relay(name=LONG_NAME, description="D" * 300, operator="O" * 80, contact="x" * 60 + "@example.org",
                        public_url=[public])
    pages = {
        "status": _base(relay) + "/",
        "join": Invite((public,), "t" * 64, LONG_NAME).page_url(_base(relay)),
        "not vouched": Invite((f"wss://{LONG_HOST}.evil.example/ws",), "", "N" * 80).page_url(_base(relay)),
        "404": _base(relay) + "/" + "p" * 200,
    }
    for width, height in SCREENS:
        context = chromium.new_context(viewport={"width": width, "height": height})
        try:
            page = context.new_page()
            watch = PageWatch(page)
            for what, url in pages.items():
                page.goto(url)
                if what == "status":  # the charts are drawn by the script: wait for its first update
                    expect(page.locator("#status-line")).to_have_text(re.compile(r"^Updated "), timeout=20_000)
                    assert page.locator("#chart-rollouts canvas").count() == 1
                widths = page.evaluate("() => [document.documentElement.scrollWidth, "
                                       "document.documentElement.clientWidth]")
                assert page.evaluate(NO_SIDEWAYS_SCROLL), f"{what} at {width} px is {widths[0]} px wide"
            assert [p for p in watch.problems if "status of 404" not in p] == []
        finally:
            context.close()


def test_browser_the_rate_card_counts_what_its_chart_shows(chromium: Any, start_relay: StartRelay) -> None:  # noqa: F811
    relay = start_relay()
    page = chromium.new_page()
    page.goto(_base(relay) + "/")
    label = page.text_content("#rollouts-per-minute + .label") or ""
    heading = page.text_content(".chart h2") or ""
    assert label.startswith("rollouts a minute") and heading.startswith("Rollouts a minute")
    assert "batches a minute" not in (page.text_content("body") or "")
