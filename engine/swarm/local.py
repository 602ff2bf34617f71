"""This computer's relay: host it, or join the node that does, and take it over when that node stops.

Several Sapling nodes on one computer share one relay on a fixed loopback
port (`swarm.embedded_port`, 8765). The first node binds the port and hosts
a relay, started by the `host_relay` function its caller hands in
(engine/relay/embedded.py's `start_embedded_relay`: this package never imports
the relay, which is built on the swarm's wire); later nodes find it taken and join as clients of
``ws://host:port/ws``. Without more, the swarm would end with its host: when
that node stops, its relay tells every client `shutting_down` and the others
train solo for good. `LocalSwarm` keeps it alive:

1. the hosting node's relay closes its port first, then tells its clients;
2. every remaining node whose link drops waits a random 0 to
   `TAKEOVER_JITTER_S` seconds (so the survivors do not all knock at once)
   and tries to bind the port itself. Binding is atomic: exactly one wins and
   hosts; the others get "address in use";
3. every client reconnects to the same URL at once (`SwarmClient.wake`) and
   finds the new host. Nodes only ever know the URL, never who hosts it.

A node that cannot reach the relay and cannot bind the port (another program
holds it) keeps trying both, every `TAKEOVER_RETRY_S`, and after
`FOREIGN_PORT_WATCHES` such tries says so once, naming the port. With port 0 the relay
gets a free port nobody else knows, so there is nothing to share or take over.

    local = LocalSwarm("127.0.0.1", 8765, identity, host_relay=start_embedded_relay, on_message=print)
    client = local.start()     # hosts or joins; the client is connecting
    client.sample(4)
    local.stop()               # closes the client, and the relay if this node hosts it

`on_message` gets one sentence for a person whenever the role changes
(hosting, joined, took over, moved to another node); it is called from a
background thread.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Protocol

from engine.common.lan import Announcement
from engine.swarm.client import LinkState, SwarmClient
from engine.swarm.identity import Identity

log = logging.getLogger(__name__)

# Survivors wait uniformly up to this long before trying to bind the port.
TAKEOVER_JITTER_S = 1.0
# While the link is down and the port is not ours, look again this often.
TAKEOVER_RETRY_S = 5.0
# Watches in a row (each TAKEOVER_RETRY_S apart) that find the port taken and no relay to join there before the
# node says that another program holds it: more than a handover between Sapling nodes ever takes.
FOREIGN_PORT_WATCHES = 3
# What the clients of a stopping local relay are told.
LOCAL_RELAY_CLOSING = "this computer's local relay is closing: the node that hosted it stopped"
# An embedded relay calls itself this, then the hosting node's readable name, in its challenge.
LOCAL_RELAY_PREFIX = "local relay of "


class HostedRelay(Protocol):
    """What a hosting node keeps of its relay (engine/relay/embedded.py's `EmbeddedRelay`)."""

    @property
    def port(self) -> int: ...

    def stop(self) -> None: ...


# (host, port, name, closing): bind host:port and serve a relay called `name` whose clients are told `closing`
# when it stops; OSError when the port is taken. engine/relay/embedded.py's `start_embedded_relay`.
HostRelay = Callable[[str, int, str, str], HostedRelay]


class LocalSwarm:
    """Hosts or joins the relay on host:port, and takes it over when its host stops."""

    def __init__(
        self,
        host: str,
        port: int,
        identity: Identity,
        *,
        host_relay: HostRelay,
        token: str = "",
        on_change: Callable[[LinkState], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        rng: random.Random | None = None,  # draws the takeover jitter
        lan: bool = False,  # listen on every interface and announce the relay on this network (engine/common/lan.py)
    ) -> None:
        self.lan = lan
        self.bind_host = "0.0.0.0" if lan else host
        self.host = "127.0.0.1" if lan and host in ("0.0.0.0", "") else host  # what this computer's nodes dial
        self._announcement: Announcement | None = None
        self.port = port
        self.identity = identity
        self.host_relay = host_relay
        self.token = token
        self.on_change = on_change
        self.on_message = on_message
        self._rng = rng or random.Random()
        self._relay: HostedRelay | None = None
        self._client: SwarmClient | None = None
        self._stopping = threading.Event()
        self._lost = threading.Event()  # the link dropped: the watcher looks at once
        self._lock = threading.Lock()  # one bind attempt at a time (start vs watcher)
        self._host_name = ""  # the relay name of the host this node was last connected to
        self._blocked = 0  # watches in a row that found the port taken and the link still down
        self._watcher = threading.Thread(target=self._watch, name="local-relay-watch", daemon=True)

    # -- what the node calls --------------------------------------------------------------
    @property
    def url(self) -> str:
        port = self._relay.port if self._relay is not None else self.port
        return f"ws://{self.host}:{port}/ws"

    @property
    def hosting(self) -> bool:
        """True when this node runs the computer's relay."""
        return self._relay is not None

    @property
    def label(self) -> str:
        """How the node names its relay: 'embedded' when it hosts it, else its URL."""
        return "embedded" if self.hosting else self.url

    @property
    def client(self) -> SwarmClient:
        if self._client is None:
            raise RuntimeError("LocalSwarm.start() has not run")
        return self._client

    def start(self) -> SwarmClient:
        """Host the relay if the port is free, else join it; returns the (connecting) client."""
        if self._try_host():
            self._say(f"This node hosts the computer's local relay at {self.url}; other nodes here join it.")
        else:
            self._say(f"Joined the computer's local relay at {self.url}, hosted by another node here.")
        self._client = SwarmClient(self.url, self.identity, token=self.token, on_change=self._link_changed)
        self._client.start()
        if self.port != 0:
            self._watcher.start()
        return self._client

    def stop(self) -> None:
        """Close the client and, if this node hosts it, the relay (its clients then take it over)."""
        self._stopping.set()
        self._lost.set()
        if self._client is not None:
            self._client.close()
        if self._watcher.is_alive():
            self._watcher.join(timeout=30)
        with self._lock:
            if self._announcement is not None:
                self._announcement.stop()
            if self._relay is not None:
                self._relay.stop()

    # -- behind the scenes ----------------------------------------------------------------
    def _say(self, message: str) -> None:
        log.info("%s", message)
        if self.on_message is not None:
            try:
                self.on_message(message)
            except Exception:  # a listener's bug must not stop the handover
                log.exception("local relay message listener failed")

    def _try_host(self) -> bool:
        """Bind the port and serve; False when it is taken."""
        with self._lock:
            if self._relay is not None:
                return True
            if self._stopping.is_set():
                return False
            name = LOCAL_RELAY_PREFIX + self.identity.name
            try:
                relay = self.host_relay(self.bind_host, self.port, name, LOCAL_RELAY_CLOSING)
            except OSError as exc:
                log.debug("port %d is taken (%s)", self.port, exc)
                return False
            self._relay = relay
            if self.lan:
                self._announce(name, relay.port)
            return True

    def _announce(self, name: str, port: int) -> None:
        """Tell this network the relay is here; a failure is logged and the swarm stays this computer's."""
        announcement = Announcement(name, port)
        try:
            announcement.start()
        except OSError as exc:  # never fatal to training
            log.warning("Could not announce the local relay on this network (%s); only this computer can join.",
                        exc)
            return
        self._announcement = announcement

    def _link_changed(self, state: LinkState) -> None:
        """The client's on_change (its event-loop thread): note a drop for the watcher, then pass it on."""
        if state.connected:
            self._lost.clear()
            if self._host_name and state.relay != self._host_name and not self.hosting:
                host = state.relay.removeprefix(LOCAL_RELAY_PREFIX)
                self._say(f"The computer's local relay closed; {host} now hosts it, and this node rejoined it.")
            self._host_name = state.relay
        elif self._host_name:
            self._lost.set()
        if self.on_change is not None:
            self.on_change(state)

    def _watch(self) -> None:
        """While this node is a client: when the link is down, try to become the host."""
        client = self.client
        while not self._stopping.is_set() and self._relay is None:
            self._lost.wait(TAKEOVER_RETRY_S)
            if self._stopping.is_set() or client.closed:
                return
            if client.state.connected:
                self._lost.clear()
                self._blocked = 0
                continue
            if self._stopping.wait(self._rng.uniform(0.0, TAKEOVER_JITTER_S)):
                return
            if client.state.connected or client.closed:
                continue  # back on a relay another survivor started
            self._lost.clear()
            if self._try_host():
                self._say(f"The computer's local relay closed; this node now hosts it at {self.url}.")
                client.wake()
                return
            self._blocked += 1
            if self._blocked == FOREIGN_PORT_WATCHES:  # once: a Sapling relay there would have let this node in
                self._say(f"Port {self.port} on this computer is held by a program that is not a Sapling relay "
                          f"({client.state.last_error or 'no answer'}), so this node trains alone until it is free. "
                          "To use another port, set swarm.embedded_port on every node of this computer.")
            client.wake()  # someone holds the port: reconnect to it now
