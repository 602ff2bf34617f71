"""A swarm in the same room: relays announce themselves on the local network, nodes find them (mDNS/DNS-SD).

A relay that is told to (`sapling-relay --advertise`, or the app's local relay
with "let other computers on this network join", ``swarm.embedded_lan``)
registers a ``_sapling._tcp`` service with the `zeroconf` package: its port,
its addresses on this network, and in the TXT record its name (``name``), the
websocket path (``path``) and the URL of its information document (``info``).
`discover(seconds)` browses for such services for a few seconds and returns
what answered (`FoundSwarm`), each with the ws:// address a node joins.

Nothing is announced unless turned on. A relay found this way is trusted no
more than any other: batches stay signed and every answer is re-scored here.
zeroconf is imported inside the functions, so importing this module costs
nothing (the app imports engine.common at start).

    python -m engine.common.lan            # the swarms on this network (as `sapling-node discover`)
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SERVICE_TYPE = "_sapling._tcp.local."
INFO_PATH = "/.well-known/sapling-relay"  # engine/relay/info.py's WELL_KNOWN_PATH, which this module may not import
DISCOVER_SECONDS = 3.0


@dataclass(frozen=True)
class FoundSwarm:
    """A relay that announced itself on this network."""

    name: str  # the relay's own name (its --name; "local relay of NAME" for an app's local swarm)
    url: str  # ws://ADDRESS:PORT/ws: what a node joins (an invite may be just this)
    info_url: str  # its information document (http://ADDRESS:PORT/.well-known/sapling-relay)
    service: str  # the DNS-SD instance name

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "url": self.url, "info_url": self.info_url, "service": self.service}


def lan_addresses() -> list[str]:
    """This computer's IPv4 addresses on its networks: every interface's but loopback and link-local."""
    import ifaddr  # zeroconf's own dependency

    found: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                address = ipaddress.ip_address(ip.ip)
                if not (address.is_loopback or address.is_link_local) and ip.ip not in found:
                    found.append(ip.ip)
    return found


def _instance_name(name: str, port: int) -> str:
    """A DNS-SD instance label: the relay's name, cut to fit, plus the port so two relays of one name differ."""
    clean = "".join(c if c.isalnum() or c in " -_" else "-" for c in name).strip() or "sapling-relay"
    return f"{clean[:50]} ({socket.gethostname()[:8]}:{port})"


class Announcement:
    """A relay's ``_sapling._tcp`` service on this network, from `start()` until `stop()`."""

    def __init__(self, name: str, port: int, addresses: list[str] | None = None, path: str = "/ws") -> None:
        self.name = name
        self.port = port
        self.addresses = list(addresses) if addresses else lan_addresses()
        self.path = path
        self._zeroconf: Any = None
        self._info: Any = None

    @property
    def info_url(self) -> str:
        return f"http://{self.addresses[0]}:{self.port}{INFO_PATH}" if self.addresses else ""

    def start(self) -> None:
        """Register the service (blocking for a second or two while zeroconf probes the name); OSError when this
        computer has no network to announce on."""
        from zeroconf import Error, IPVersion, ServiceInfo, Zeroconf

        if not self.addresses:
            raise OSError("no network address to announce the relay on (only loopback)")
        info = ServiceInfo(
            SERVICE_TYPE, f"{_instance_name(self.name, self.port)}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(a) for a in self.addresses], port=self.port,
            properties={"name": self.name[:200], "path": self.path, "info": self.info_url, "v": "1"},
            server=f"sapling-{socket.gethostname()[:40]}-{self.port}.local.",
        )
        zc = Zeroconf(interfaces=self.addresses, ip_version=IPVersion.V4Only)
        try:
            zc.register_service(info, allow_name_change=True)
        except Error as exc:  # zeroconf's own (a name it could not claim): the caller handles OSError
            zc.close()
            raise OSError(f"zeroconf refused the announcement: {exc}") from exc
        except BaseException:
            zc.close()
            raise
        self._zeroconf, self._info = zc, info
        log.info("Announcing the relay %r on this network (%s, port %d).", self.name, ", ".join(self.addresses),
                 self.port)

    def stop(self) -> None:
        """Withdraw the service (nodes browsing see it go) and close zeroconf's sockets."""
        zc, info, self._zeroconf, self._info = self._zeroconf, self._info, None, None
        if zc is None:
            return
        try:
            zc.unregister_service(info)
        finally:
            zc.close()


def _found(info: Any) -> FoundSwarm | None:
    """A FoundSwarm from a resolved ServiceInfo; None when it lacks an IPv4 address or a port."""
    addresses = info.parsed_addresses()
    v4 = [a for a in addresses if ":" not in a]
    if not v4 or not info.port:
        return None
    props = {(k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)):
             (v.decode("utf-8", "replace") if isinstance(v, bytes) else "") for k, v in (info.properties or {}).items()}
    path = props.get("path", "/ws")
    path = path if path.startswith("/") else "/ws"
    name = props.get("name") or info.name.split("._sapling")[0]
    return FoundSwarm(name=name[:200], url=f"ws://{v4[0]}:{info.port}{path}",
                      info_url=f"http://{v4[0]}:{info.port}{INFO_PATH}", service=info.name)


def discover(seconds: float = DISCOVER_SECONDS) -> list[FoundSwarm]:
    """The swarms that answer on this network within `seconds`, by name."""
    from zeroconf import IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf

    names: set[str] = set()
    lock = threading.Lock()

    def on_change(zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            with lock:
                names.add(name)

    zc = Zeroconf(ip_version=IPVersion.V4Only)
    try:
        browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[on_change])
        time.sleep(seconds)
        browser.cancel()
        with lock:
            seen = sorted(names)
        found: dict[str, FoundSwarm] = {}
        for name in seen:
            info = zc.get_service_info(SERVICE_TYPE, name, timeout=1500)
            swarm = _found(info) if info is not None else None
            if swarm is not None:
                found.setdefault(swarm.url, swarm)
    finally:
        zc.close()
    return sorted(found.values(), key=lambda s: (s.name.lower(), s.url))


if __name__ == "__main__":
    swarms = discover()
    for swarm in swarms:
        print(f"{swarm.name}\t{swarm.url}")
    if not swarms:
        print(f"No swarm announced itself on this network within {DISCOVER_SECONDS:g} s.", file=sys.stderr)
