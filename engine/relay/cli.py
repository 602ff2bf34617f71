"""`sapling-relay`'s command line: its flags, its JSON logs, and serving until SIGTERM or SIGINT.

    sapling-relay --port 8765                        # one process, in-memory window
    sapling-relay --redis redis://host:6379/0        # several processes, one swarm
    sapling-relay --advertise --name "Maths club"    # found by the computers on this network (engine/common/lan.py)
    sapling-relay invite --url wss://HOST/ws         # invite links and a QR code (invite.py)
    sapling-relay --dataset-dir DIR                  # keep the swarm's dataset (dataset.py)
    sapling-relay dataset export --dataset-dir DIR --out OUT   # write it (dataset_export.py)
    python -m engine.relay --help                    # every setting (engine/relay/settings.py)

The relay itself is engine/relay/server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from aiohttp import web

from engine.common.errors import RelayStartError
from engine.relay import invite as relay_invite
from engine.relay.limits import QuietBadRequests
from engine.relay.server import DROP_GRACE_S, Relay
from engine.relay.settings import JsonLogFormatter, settings_from_args

log = logging.getLogger("sapling.relay")


# -- command line ----------------------------------------------------------------------------
async def serve(relay: Relay) -> int:
    """Serve until SIGTERM or SIGINT, then close every connection; 0 when it stopped that way.

    RelayStartError (one sentence) when it cannot start: Redis does not answer, the port is taken.
    Further signals during the shutdown are logged and ignored, so a second
    SIGTERM (systemd, Docker and impatient people send one) cannot cut it short.
    """
    settings = relay.settings
    runner = web.AppRunner(relay.app(), handle_signals=False, shutdown_timeout=DROP_GRACE_S)
    try:
        await runner.setup()  # the relay's on_startup: Redis is asked here (RelayStartError)
        try:
            await web.TCPSite(runner, settings.host, settings.port).start()
        except socket.gaierror:
            raise RelayStartError(f"cannot listen on {settings.host}: no such address; correct --host (0.0.0.0 "
                                  "listens on all of this computer's addresses)") from None
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            if exc.errno == errno.EADDRNOTAVAIL:
                raise RelayStartError(f"cannot listen on {settings.host}:{settings.port} ({reason}); correct "
                                      "--host (0.0.0.0 listens on all of this computer's addresses)") from None
            raise RelayStartError(f"cannot listen on {settings.host}:{settings.port} ({reason}); stop what uses "
                                  "that port, or choose another with --port") from None
    except RelayStartError:
        with contextlib.suppress(Exception):  # what started is stopped; a second failure adds nothing to say
            await runner.cleanup()
        raise
    relay.bound = True
    log.info("listening", extra={"host": settings.host, "port": settings.port, "redis": bool(settings.redis)})
    loop = asyncio.get_running_loop()
    announcement = None
    if settings.advertise:  # zeroconf's registration blocks while it probes the name: off the loop
        from engine.common.lan import Announcement

        wildcard = settings.host in ("0.0.0.0", "")
        port = settings.port or int(runner.addresses[0][1])  # port 0: the one the system picked
        announcement = Announcement(settings.name, port, None if wildcard else [settings.host])
        try:
            await loop.run_in_executor(None, announcement.start)
        except OSError as exc:
            log.error("cannot announce the relay on this network: %s", exc)
            announcement = None
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
        if announcement is not None:
            await loop.run_in_executor(None, announcement.stop)
        await runner.cleanup()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
    return 0


def start_failed(sentence: str) -> int:
    """Log why the relay cannot start, one sentence at level error (a JSON line like every other), and return 2."""
    log.error("sapling-relay cannot start: %s.", sentence.rstrip(". "), extra={"event": "start_failed"})
    return 2


def main(argv: list[str] | None = None) -> int:
    """`sapling-relay [flags]` serves; `sapling-relay invite ...` prints invite links (invite.py).

    Every reason it cannot start (a bad setting, Redis down, the port taken, a key folder it cannot
    write) is one JSON log line at level error and exit code 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["invite"]:
        return relay_invite.main(args[1:])
    if args[:1] == ["dataset"]:  # imports reasoning-gym and pyarrow only when an export starts
        from engine.relay import dataset_export

        return dataset_export.main(args[1:])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)  # before the settings: their errors too
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        return start_failed(str(exc))
    if not settings.data_dir:
        settings.data_dir = str(settings.key_path().parent)
    if settings.advertise and settings.host == "127.0.0.1" and "--host" not in args:
        settings.host = "0.0.0.0"  # announced on the network: reachable from it
    logging.getLogger().setLevel(settings.log_level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.server").addFilter(QuietBadRequests())
    try:
        relay = Relay(settings)
    except OSError as exc:
        if settings.dataset_dir and exc.filename and str(exc.filename).startswith(
                str(Path(settings.dataset_dir).expanduser())):
            return start_failed(f"cannot keep the swarm's dataset in {settings.dataset_dir} ({exc.strerror or exc}); "
                                "choose another folder with --dataset-dir")
        return start_failed(f"cannot keep the relay's key in {settings.data_dir} ({exc.strerror or exc}); choose "
                            "another folder with --data-dir")
    try:
        return asyncio.run(serve(relay))
    except RelayStartError as exc:
        return start_failed(str(exc))
    except KeyboardInterrupt:  # Ctrl-C where the loop cannot take signals (Windows)
        return 0


if __name__ == "__main__":
    sys.exit(main())
