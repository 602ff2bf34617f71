"""`--trusted-proxy`: behind Caddy the relay counts and logs each node by its own address (engine/relay/proxy.py).

    .venv/bin/python -m pytest -q tests/swarm/test_relay_proxy.py

The rule on its own (which address X-Forwarded-For yields, and when it is
ignored), the setting's command line and TOML key, then real relays on
loopback: a header sent by a direct client changes nothing, through a
trusted proxy the per-address cap tells clients apart and the refusal log
names the client, and a malformed header neither crashes nor helps.
tests/swarm/test_relay_stack.py checks the same through the real Caddy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from engine.relay.cli import main as relay_main
from engine.relay.proxy import TrustedProxies, parse_network
from engine.relay.settings import settings_from_args
from engine.swarm import protocol as p
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer

XFF = "X-Forwarded-For"
MALFORMED = "ignoring an X-Forwarded-For header"


# -- the rule -------------------------------------------------------------------------------------
def test_without_trusted_proxies_the_header_is_never_read() -> None:
    assert TrustedProxies().client_ip("127.0.0.1", ["198.51.100.7"]) == "127.0.0.1"


def test_a_connection_that_is_not_a_trusted_proxy_keeps_its_own_address() -> None:
    proxies = TrustedProxies(["10.86.86.10"])
    assert proxies.client_ip("203.0.113.5", ["198.51.100.7"]) == "203.0.113.5"


def test_through_a_trusted_proxy_the_rightmost_untrusted_address_is_the_client() -> None:
    proxies = TrustedProxies(["127.0.0.1", "10.0.0.0/8"])
    assert proxies.client_ip("127.0.0.1", ["198.51.100.7"]) == "198.51.100.7"
    # what the client wrote itself (left of what the proxy appended) is not believed
    assert proxies.client_ip("127.0.0.1", ["6.6.6.6, 198.51.100.7"]) == "198.51.100.7"
    assert proxies.client_ip("127.0.0.1", ["garbage, 198.51.100.7"]) == "198.51.100.7"
    # a chain of trusted proxies is walked through; several header lines read as one list
    assert proxies.client_ip("127.0.0.1", ["198.51.100.7, 10.1.2.3"]) == "198.51.100.7"
    assert proxies.client_ip("127.0.0.1", ["6.6.6.6", "198.51.100.7", "10.1.2.3"]) == "198.51.100.7"
    # only trusted addresses: the leftmost is the client; no header: the proxy itself
    assert proxies.client_ip("127.0.0.1", ["10.0.0.5, 10.1.2.3"]) == "10.0.0.5"
    assert proxies.client_ip("127.0.0.1", []) == "127.0.0.1"
    assert proxies.client_ip(None, ["198.51.100.7"]) == "?"


def test_ipv6_and_ipv4_mapped_addresses() -> None:
    proxies = TrustedProxies(["127.0.0.1", "::1"])
    assert proxies.client_ip("::ffff:127.0.0.1", ["2001:db8::1"]) == "2001:db8::1"
    assert proxies.client_ip("::1", ["[2001:db8::2]"]) == "2001:db8::2"
    assert proxies.client_ip("::1", ["::ffff:198.51.100.7"]) == "198.51.100.7"
    assert TrustedProxies(["::1"]).client_ip("127.0.0.1", ["198.51.100.7"]) == "127.0.0.1"


def test_a_malformed_header_falls_back_to_the_proxy_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sapling.relay")
    proxies = TrustedProxies(["127.0.0.1"])
    for header in (["not-an-ip"], ["198.51.100.7, "], [""], ["198.51.100.7:4000"], [", ".join(["127.0.0.1"] * 100)]):
        assert proxies.client_ip("127.0.0.1", header) == "127.0.0.1", header
    assert proxies.malformed == 5
    logged = [r for r in caplog.records if MALFORMED in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.INFO


def test_the_setting_takes_addresses_and_networks_repeated_or_comma_separated(tmp_path: Path) -> None:
    settings = settings_from_args(["--trusted-proxy", "127.0.0.1, 10.0.0.0/8", "--trusted-proxy", "::1"])
    assert settings.trusted_proxy == ["127.0.0.1", "10.0.0.0/8", "::1"]
    assert [str(n) for n in settings.trusted_proxies().networks] == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    config = tmp_path / "relay.toml"
    config.write_text('trusted_proxy = ["10.86.86.10"]\n')
    assert settings_from_args(["--config", str(config)]).trusted_proxy == ["10.86.86.10"]
    config.write_text('trusted_proxy = "127.0.0.1"\n')
    assert settings_from_args(["--config", str(config)]).trusted_proxy == ["127.0.0.1"]
    assert settings_from_args([]).trusted_proxy == []
    assert parse_network("172.16.0.0/12").num_addresses == 2**20


@pytest.mark.parametrize("value", ["relay.example.org", "10.0.0.0/33", "1.2.3"])
def test_a_bad_trusted_proxy_is_one_sentence_and_exit_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="is not an IP address or a CIDR network"):
        settings_from_args(["--trusted-proxy", value])
    assert relay_main(["--trusted-proxy", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trusted-proxy" in err and "Traceback" not in err


def test_a_bad_trusted_proxy_in_the_config_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text("trusted_proxy = [1]\n")
    with pytest.raises(ValueError, match="trusted-proxy"):
        settings_from_args(["--config", str(config)])


# -- real relays ----------------------------------------------------------------------------------
async def _refused(url: str, headers: dict[str, str]) -> str:
    """Open a websocket with these headers; the code of the relay's first message if it is an error, else ''."""
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
        first = await ws.receive_json(timeout=10)
        return str(first["code"]) if first["type"] == "error" else ""


async def _logged(caplog: pytest.LogCaptureFixture, check: Callable[[logging.LogRecord], bool]) -> logging.LogRecord:
    deadline = time.monotonic() + 10
    while True:
        found = [r for r in caplog.records if check(r)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, "the relay did not log it in time"
        await asyncio.sleep(0.05)


def _refusal_from(ip: str) -> Callable[[logging.LogRecord], bool]:
    return lambda r: r.getMessage() == "refused messages" and getattr(r, "ip", None) == ip


@pytest.mark.integration
async def test_a_header_from_a_direct_client_is_ignored(start_relay: StartRelay,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sapling.relay")
    relay = start_relay(max_conn_per_ip=1, trusted_proxy=["10.86.86.10"], reject_log_every=0.2)
    a = DocPeer(relay.url, headers={XFF: "198.51.100.1"})
    assert (await a.connect())["type"] == "welcome"
    # another made-up address does not get this client a second connection ...
    assert await _refused(relay.url, {XFF: "198.51.100.2"}) == p.E_CONN_LIMIT
    # ... and the refusal is logged against the address it really came from
    await _logged(caplog, _refusal_from("127.0.0.1"))
    assert not [r for r in caplog.records if getattr(r, "ip", "").startswith("198.51.100.")]
    await a.close()


@pytest.mark.integration
async def test_through_a_trusted_proxy_the_cap_counts_each_client_and_the_log_names_it(
        start_relay: StartRelay, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sapling.relay")
    relay = start_relay(max_conn_per_ip=1, trusted_proxy=["127.0.0.1"], reject_log_every=0.2)
    one = DocPeer(relay.url, headers={XFF: "198.51.100.1"})
    two = DocPeer(relay.url, headers={XFF: "6.6.6.6, 198.51.100.2"})
    assert (await one.connect())["type"] == "welcome"
    assert (await two.connect())["type"] == "welcome"  # a second client behind the same proxy
    assert await _refused(relay.url, {XFF: "198.51.100.1"}) == p.E_CONN_LIMIT  # the first one again: over its cap
    await _logged(caplog, _refusal_from("198.51.100.1"))
    await one.close()
    deadline = time.monotonic() + 10  # its slot is freed (under its own address) once the relay sees it gone
    while await _refused(relay.url, {XFF: "198.51.100.1"}) == p.E_CONN_LIMIT:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await two.close()


@pytest.mark.integration
async def test_a_malformed_header_from_a_trusted_proxy_counts_as_the_proxy(
        start_relay: StartRelay, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sapling.relay")
    relay = start_relay(max_conn_per_ip=1, trusted_proxy=["127.0.0.1"], reject_log_every=0.2)
    a = DocPeer(relay.url, headers={XFF: "not-an-address"})
    assert (await a.connect())["type"] == "welcome"  # no crash: the connection is served
    assert await _refused(relay.url, {XFF: "198.51.100.9, also bad"}) == p.E_CONN_LIMIT
    await _logged(caplog, _refusal_from("127.0.0.1"))
    assert len([r for r in caplog.records if MALFORMED in r.getMessage()]) == 1
    assert (await a.sample(1))["type"] == "batches"  # still served
    await a.close()
