"""The status page's "Top contributors today", in Debian's chromium, from receipts sent to a real relay."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from engine.swarm.identity import readable_name
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, b64, item
from tests.swarm.test_relay_web import PageWatch, _base, chromium  # noqa: F401  (chromium: the browser fixture)

pytestmark = pytest.mark.integration


async def _used_by_two(url: str) -> bytes:
    """Sender A's two items are used by B and by C; sender B's one item by C. Returns A's public key."""
    a, b, c = DocPeer(url), DocPeer(url), DocPeer(url)
    for peer in (a, b, c):
        assert (await peer.connect())["type"] == "welcome"
    assert (await a.publish([item(), item(question="What is 2 + 2?")]))["type"] == "published"
    assert (await b.publish([item()]))["type"] == "published"
    owners = {b64(a.public): a.peer_id, b64(b.public): b.peer_id}
    for receiver in (b, c):
        for batch in (await receiver.sample(16))["batches"]:
            payload = json.loads(batch["payload"])
            items = [{"seq": payload["seq"], "i": i, "verdict": "used", "positive": 1}
                     for i in range(len(payload["items"]))]
            assert (await receiver.receipts({owners[payload["key"]]: items}))["counted"] == len(items)
    for peer in (a, b, c):
        await peer.close()
    return a.public


def test_browser_lists_the_days_top_contributors_as_text(chromium: Any, start_relay: StartRelay) -> None:  # noqa: F811
    from playwright.sync_api import expect

    relay = start_relay(rate=1000.0, burst=1000.0)
    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's event loop
        a = pool.submit(asyncio.run, _used_by_two(relay.url)).result(timeout=60)
    page = chromium.new_page()
    watch = PageWatch(page)
    page.goto(_base(relay) + "/")
    rows = page.locator("#contributors li")
    expect(rows).to_have_count(2, timeout=20_000)
    assert rows.nth(0).text_content() == f"{readable_name(a)} · 4 rollouts used by 2 peers"
    assert (rows.nth(1).text_content() or "").endswith(" · 1 rollout used by 1 peer")
    assert watch.problems == []
