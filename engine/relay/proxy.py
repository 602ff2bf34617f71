"""Which address a relay connection comes from, when a reverse proxy (Caddy) stands in front of the relay.

    proxies = TrustedProxies(["127.0.0.1", "172.29.86.0/24"])   # --trusted-proxy ADDR (settings.py)
    ip = proxies.client_ip(request.remote, request.headers.getall("X-Forwarded-For", []))

Behind a proxy every connection reaches the relay from the proxy's address,
so the per-address connection cap and the `ip` of the relay's logs would
all name the proxy. A proxy says whom it forwards for in `X-Forwarded-For`
(a comma-separated list; each proxy on the way appends the address it was
reached from). Anyone can send that header, so it is read only when the
connection itself comes from a trusted proxy, and then from the right: the
client is the rightmost address that is not itself a trusted proxy
(everything left of it was written by parties nobody vouches for). A
header that cannot be read (an entry that is not an IP address) falls back
to the connection's own address, logged once per process at info level.
With no trusted proxies (the default) the header is never read.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

log = logging.getLogger("sapling.relay")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_FORWARDED_ENTRIES = 64  # entries of X-Forwarded-For read at most (from the right); more is malformed


def parse_network(text: str) -> Network:
    """An IP address or a CIDR network ("127.0.0.1", "172.16.0.0/12", "::1"); ValueError with one sentence."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"trusted-proxy: {text.strip()[:80]!r} is not an IP address or a CIDR network "
                         "(such as 127.0.0.1 or 172.16.0.0/12)") from None


def _address(text: str) -> Address | None:
    """An address as a proxy writes it (IPv6 possibly in brackets), IPv4-mapped IPv6 as IPv4; None if not one."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class TrustedProxies:
    """The relay's trusted proxies (`--trusted-proxy`) and the client address of a connection."""

    def __init__(self, networks: Iterable[str] = ()) -> None:
        self.networks = [parse_network(n) for n in networks]
        self.malformed = 0  # headers from a trusted proxy that could not be read (the first is logged)

    def trusts(self, address: Address) -> bool:
        return any(address.version == net.version and address in net for net in self.networks)

    def client_ip(self, peer: str | None, forwarded_for: Iterable[str] = ()) -> str:
        """The client's address: `peer` (the connection's own, "?" if unknown), or, when `peer` is a trusted
        proxy, the rightmost address in the X-Forwarded-For header(s) that is not itself a trusted proxy."""
        if not peer:
            return "?"
        own = _address(peer)
        if own is None or not self.networks or not self.trusts(own):
            return str(own) if own is not None else peer
        headers = list(forwarded_for)
        if not headers:
            return str(own)  # the proxy itself asking (a health check), or a proxy that sets no header
        entries = [e for header in headers for e in header.split(",")]
        client: Address | None = None
        for entry in reversed(entries[-MAX_FORWARDED_ENTRIES:]):
            address = _address(entry)
            if address is None:
                return self._malformed(peer, headers)
            client = address
            if not self.trusts(address):
                return str(address)
        if len(entries) > MAX_FORWARDED_ENTRIES or client is None:
            return self._malformed(peer, headers)
        return str(client)  # every address was a trusted proxy: the leftmost is the client

    def _malformed(self, peer: str, headers: list[str]) -> str:
        self.malformed += 1
        if self.malformed == 1:
            log.info("ignoring an X-Forwarded-For header that is not a list of IP addresses; the connection counts "
                     "as the proxy's own address (logged once)",
                     extra={"ip": peer, "header": ", ".join(headers)[:200]})
        return str(_address(peer) or peer)
