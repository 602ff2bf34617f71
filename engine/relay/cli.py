"""`sapling-relay`'s command line: its flags, its JSON logs, and serving until SIGTERM or SIGINT.

    sapling-relay --port 8765                        # one process, in-memory window
    sapling-relay --redis redis://host:6379/0        # several processes, one swarm
    sapling-relay invite --url wss://HOST/ws         # invite links and a QR code (invite.py)
    python -m engine.relay --help                    # every setting (engine/relay/settings.py)

The relay itself is engine/relay/server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from aiohttp import web

from engine.relay import invite as relay_invite
from engine.relay.limits import QuietBadRequests
from engine.relay.server import DROP_GRACE_S, Relay
from engine.relay.settings import JsonLogFormatter, settings_from_args

log = logging.getLogger("sapling.relay")


# -- command line ----------------------------------------------------------------------------
async def serve(relay: Relay) -> int:
    """Serve until SIGTERM or SIGINT, then close every connection; 0, or 1 if the port cannot be bound.

    Further signals during the shutdown are logged and ignored, so a second
    SIGTERM (systemd, Docker and impatient people send one) cannot cut it short.
    """
    settings = relay.settings
    runner = web.AppRunner(relay.app(), handle_signals=False, shutdown_timeout=DROP_GRACE_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        await runner.cleanup()
        return 1
    log.info("listening", extra={"host": settings.host, "port": settings.port, "redis": bool(settings.redis)})
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.info("already shutting down; ignoring %s", name)
            return
        log.info("received %s", name)
        stop.set()

    handled: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows; a loop outside the main thread
            loop.add_signal_handler(sig, on_signal, sig)
            handled.append(sig)
    try:
        await stop.wait()
        await runner.cleanup()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`sapling-relay [flags]` serves; `sapling-relay invite ...` prints invite links (invite.py)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["invite"]:
        return relay_invite.main(args[1:])
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"sapling-relay: {exc}", file=sys.stderr)
        return 2
    if not settings.data_dir:
        settings.data_dir = str(settings.key_path().parent)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.server").addFilter(QuietBadRequests())
    try:
        relay = Relay(settings)
    except OSError as exc:
        print(f"sapling-relay: cannot keep the relay's key in {settings.data_dir} ({exc.strerror or exc}); "
              "choose another folder with --data-dir.", file=sys.stderr)
        return 1
    try:
        return asyncio.run(serve(relay))
    except KeyboardInterrupt:  # Ctrl-C where the loop cannot take signals (Windows)
        return 0


if __name__ == "__main__":
    sys.exit(main())
