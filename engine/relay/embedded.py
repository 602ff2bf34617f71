"""A relay inside another process, on a background thread: a node's local relay, the experiment's, the tests'.

    relay = start_embedded_relay("127.0.0.1", 8765, "local relay of Ada")   # OSError: the port is taken
    relay.port, relay.url                                                  # ws://127.0.0.1:8765/ws
    relay.stop()

`start_embedded_relay` is the one door a node uses: this computer's relay
(engine/swarm/local.py) is hosted through it, handed in by the node's caller
(engine/node/launch.py), so the swarm package never imports the relay, which
is built on the swarm's wire format. `EmbeddedRelay` takes full
`RelaySettings` for those that need more (the experiment, the tests). Either
is the same `Relay` as `sapling-relay` (engine/relay/server.py), served by
aiohttp on its own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from aiohttp import web

from engine.relay.server import DROP_GRACE_S, SHUTDOWN_MESSAGE, Relay
from engine.relay.settings import RelaySettings


def start_embedded_relay(host: str, port: int, name: str, closing: str = SHUTDOWN_MESSAGE) -> EmbeddedRelay:
    """A relay named `name`, bound to host:port (0: any free port) and serving; its clients are told `closing`
    when it stops. Raises OSError when the port is taken."""
    relay = EmbeddedRelay(RelaySettings(host=host, port=port, name=name), shutdown_message=closing)
    relay.start()
    return relay


class EmbeddedRelay:
    """An in-memory relay on a background thread, for `sapling-node run` with no relay URL."""

    def __init__(self, settings: RelaySettings, shutdown_message: str = SHUTDOWN_MESSAGE) -> None:
        self.settings = settings
        self.relay = Relay(settings, shutdown_message=shutdown_message)
        self.port = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="embedded-relay", daemon=True)

    def start(self) -> str:
        """Bind and serve; returns the ws:// URL. Raises OSError if the port is taken."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            future.result(timeout=30)
        except BaseException:
            self.stop()
            raise
        self.url = f"ws://{self.settings.host}:{self.port}/ws"
        return self.url

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.relay.app(), handle_signals=False, shutdown_timeout=DROP_GRACE_S)
        await self._runner.setup()
        # asyncio's default reuse_address: SO_REUSEADDR on POSIX (a port in TIME_WAIT binds again),
        # never on Windows, where it would let a second relay bind a port that is in use.
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        self.relay.bound = True
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self.settings.port

    def stop(self) -> None:
        if self._runner is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():
            self._thread.join(timeout=10)
