"""`sapling-relay`: the websocket relay that nodes share rollouts through.

The relay is not trusted by anyone, but it still refuses what it can see is
wrong, so a bad peer costs the swarm as little as possible:

- a signed handshake (the challenge nonce, signed with the node's key);
- every publish: size, schema, limits, signature, a per-peer monotonic
  sequence number (replay) and a timestamp window;
- per-peer token-bucket rate limits, a cap on connections per IP address,
  websocket heartbeats, and a bounded send queue per connection: a slow
  consumer is disconnected and nobody else waits for it;
- optional private swarms (join token, allow-list of public keys) and a ban list.

Nodes *pull*: a `sample` request returns n batches drawn uniformly from the
recent window, never the requester's own. `/healthz` and `/metrics`
(Prometheus text) serve operations; SIGTERM closes connections cleanly.
The wire format is engine/swarm/protocol.py and docs/protocol.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
import secrets
import sys
import threading
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from engine.swarm import protocol as p
from engine.swarm.brokers import Broker, Entry, MemoryBroker, RedisBroker
from engine.swarm.identity import verify

log = logging.getLogger("sapling.relay")

STATS_PERIOD_S = 5.0  # how often connected peers get the small stats push
CLOSE_POLICY = 1008  # websocket close code for a protocol or policy violation
# aiohttp drops frames above this outright (close 1009); frames between MAX_FRAME_BYTES
# and this get a `too_large` error and the connection stays up.
HARD_FRAME_BYTES = 4 * p.MAX_FRAME_BYTES
# Rate-limit buckets remembered for peers that left (a reconnect must not refill a bucket).
MAX_BUCKETS = 100_000


@dataclass
class RelaySettings:
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on (0.0.0.0 for every interface)"})
    port: int = field(default=8765, metadata={"help": "TCP port (0 picks a free one)"})
    redis: str = field(default="", metadata={"help": "redis://host:port/db to share one swarm between relay processes"})
    swarm: str = field(default="default", metadata={"help": "swarm name: the Redis key prefix, so one Redis can hold several swarms"})
    join_token: str = field(default="", metadata={"help": "private swarm: nodes must present this token"})
    allow_keys: list[str] = field(default_factory=list, metadata={"help": "private swarm: only these public keys (base64) or peer ids may join"})
    ban_keys: list[str] = field(default_factory=list, metadata={"help": "public keys (base64) or peer ids that may not join"})
    max_conn_per_ip: int = field(default=p.DEFAULT_MAX_CONN_PER_IP, metadata={"help": "open connections allowed from one IP address"})
    rate: float = field(default=p.DEFAULT_RATE_PER_S, metadata={"help": "requests per second per peer (token-bucket refill)"})
    burst: float = field(default=p.DEFAULT_BURST, metadata={"help": "token-bucket capacity per peer"})
    window: int = field(default=p.DEFAULT_WINDOW_BATCHES, metadata={"help": "recent batches kept for sampling"})
    send_queue: int = field(default=p.DEFAULT_SEND_QUEUE, metadata={"help": "messages queued to one connection before it is dropped as a slow consumer"})
    heartbeat: float = field(default=p.HEARTBEAT_S, metadata={"help": "websocket ping interval in seconds"})
    name: str = field(default="sapling-relay", metadata={"help": "relay name shown to nodes"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})

    def check(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        for key in ("max_conn_per_ip", "window", "send_queue"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key.replace('_', '-')} must be at least 1")
        if self.rate <= 0 or self.burst < 1 or self.heartbeat <= 0:
            raise ValueError("rate and heartbeat must be positive and burst at least 1")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError("log-level must be debug, info, warning or error")
        if self.redis and not self.redis.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis must be a redis://, rediss:// or unix:// URL")


class TokenBucket:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class Connection:
    """One websocket: its peer (after the handshake) and a bounded queue of outgoing frames."""

    def __init__(self, relay: Relay, ws: web.WebSocketResponse, ip: str) -> None:
        self.relay = relay
        self.ws = ws
        self.ip = ip
        self.peer: str | None = None
        self.key: bytes | None = None
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=relay.settings.send_queue)
        self.closing = False
        self.writer: asyncio.Task[None] | None = None

    def send(self, message: dict[str, Any]) -> None:
        if self.closing:
            return
        try:
            self.queue.put_nowait(p.encode(message))
        except asyncio.QueueFull:
            self.relay.count_rejection(p.E_SLOW)
            log.warning("dropping slow consumer", extra={"peer": self.peer, "ip": self.ip})
            self.close_soon(p.E_SLOW)

    def close_soon(self, reason: str) -> None:
        if self.closing:
            return
        self.closing = True
        asyncio.get_running_loop().create_task(self.ws.close(code=CLOSE_POLICY, message=reason.encode()))

    async def write_loop(self) -> None:
        while True:
            text = await self.queue.get()
            if text is None or self.ws.closed:
                return
            try:
                await self.ws.send_str(text)
            except (ConnectionError, RuntimeError):
                return
            self.relay.metrics["bytes_out"] += len(text)


class Relay:
    def __init__(self, settings: RelaySettings, broker: Broker | None = None) -> None:
        settings.check()
        self.settings = settings
        self.broker: Broker = broker or (
            RedisBroker(settings.redis, settings.window, settings.swarm) if settings.redis else MemoryBroker(settings.window)
        )
        self.connections: set[Connection] = set()
        self.per_ip: Counter[str] = Counter()
        self.buckets: dict[str, TokenBucket] = {}
        self.metrics: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        self.online = 0
        self.allow = {k.strip() for k in settings.allow_keys if k.strip()}
        self.ban = {k.strip() for k in settings.ban_keys if k.strip()}
        self._stats_task: asyncio.Task[None] | None = None
        self.started = time.time()

    # -- app --------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ws", self.handle_ws)
        app.router.add_get("/healthz", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.broker.start()
        self._stats_task = asyncio.create_task(self._stats_loop(), name="relay-stats")
        log.info("relay started", extra={"broker": type(self.broker).__name__})

    async def _on_shutdown(self, _app: web.Application) -> None:
        log.info("relay shutting down", extra={"connections": len(self.connections)})
        for conn in list(self.connections):
            conn.closing = True
            with contextlib.suppress(Exception):
                await conn.ws.send_str(p.encode(p.msg_error(p.E_SHUTDOWN, "the relay is restarting; reconnect shortly")))
                await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"shutting_down")

    async def _on_cleanup(self, _app: web.Application) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stats_task
        await self.broker.close()

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(STATS_PERIOD_S)
            try:
                peers = sum(1 for c in self.connections if c.peer)
                self.online = await self.broker.report_online("", peers)
            except Exception as exc:  # noqa: BLE001 - a broker hiccup (Redis down) must not end the stats loop
                log.warning("stats update failed: %s", exc)
                continue
            message = p.msg_stats(self.online, self.broker.window_size())
            for conn in list(self.connections):
                if conn.peer:
                    conn.send(message)

    def count_rejection(self, code: str) -> None:
        self.rejections[code] += 1

    # -- http -------------------------------------------------------------------------
    async def handle_health(self, _request: web.Request) -> web.Response:
        return web.json_response({
            "status": "ok",
            "connections": len(self.connections),
            "online": self.online,
            "window": self.broker.window_size(),
            "uptime_s": round(time.time() - self.started, 1),
        })

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        lines = [
            "# HELP sapling_relay_connections Open websocket connections.",
            "# TYPE sapling_relay_connections gauge",
            f"sapling_relay_connections {len(self.connections)}",
            "# HELP sapling_relay_peers_online Authenticated peers across the swarm.",
            "# TYPE sapling_relay_peers_online gauge",
            f"sapling_relay_peers_online {self.online}",
            "# HELP sapling_relay_window_batches Batches held for sampling.",
            "# TYPE sapling_relay_window_batches gauge",
            f"sapling_relay_window_batches {self.broker.window_size()}",
        ]
        for name, help_text in (
            ("publishes", "Batches accepted."),
            ("samples", "Sample requests answered."),
            ("batches_served", "Batches sent in sample replies."),
            ("handshakes", "Completed handshakes."),
            ("bytes_in", "Websocket bytes received."),
            ("bytes_out", "Websocket bytes sent."),
        ):
            lines += [
                f"# HELP sapling_relay_{name}_total {help_text}",
                f"# TYPE sapling_relay_{name}_total counter",
                f"sapling_relay_{name}_total {self.metrics[name]}",
            ]
        lines += [
            "# HELP sapling_relay_rejections_total Messages or connections refused, by error code.",
            "# TYPE sapling_relay_rejections_total counter",
        ]
        lines += [f'sapling_relay_rejections_total{{code="{code}"}} {self.rejections[code]}' for code in p.ERROR_CODES]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")

    # -- websocket --------------------------------------------------------------------
    async def handle_ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=self.settings.heartbeat, max_msg_size=HARD_FRAME_BYTES)
        await ws.prepare(request)
        ip = request.remote or "?"
        conn = Connection(self, ws, ip)
        if self.per_ip[ip] >= self.settings.max_conn_per_ip:
            self.count_rejection(p.E_CONN_LIMIT)
            await ws.send_str(p.encode(p.msg_error(p.E_CONN_LIMIT, f"at most {self.settings.max_conn_per_ip} connections per address")))
            await ws.close(code=CLOSE_POLICY, message=p.E_CONN_LIMIT.encode())
            return ws
        self.per_ip[ip] += 1
        self.connections.add(conn)
        conn.writer = asyncio.create_task(conn.write_loop())
        try:
            if await self._handshake(conn):
                await self._serve(conn)
        finally:
            self.connections.discard(conn)
            self.per_ip[ip] -= 1
            if self.per_ip[ip] <= 0:
                del self.per_ip[ip]
            with contextlib.suppress(asyncio.QueueFull):
                conn.queue.put_nowait(None)
            conn.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await conn.writer
            if not ws.closed:
                await ws.close()
            if conn.peer:
                log.debug("peer left", extra={"peer": conn.peer})
        return ws

    async def _fatal(self, conn: Connection, code: str, message: str) -> None:
        self.count_rejection(code)
        conn.closing = True
        with contextlib.suppress(Exception):
            await conn.ws.send_str(p.encode(p.msg_error(code, message)))
            await conn.ws.close(code=CLOSE_POLICY, message=code.encode())

    async def _handshake(self, conn: Connection) -> bool:
        nonce = secrets.token_hex(p.NONCE_BYTES)
        conn.send(p.msg_challenge(nonce, self.settings.name, time.time()))
        try:
            msg = await asyncio.wait_for(conn.ws.receive(), timeout=p.HANDSHAKE_TIMEOUT_S)
        except TimeoutError:
            await self._fatal(conn, p.E_AUTH, "no hello within the handshake timeout")
            return False
        if msg.type != WSMsgType.TEXT:
            if msg.type not in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                await self._fatal(conn, p.E_AUTH, "expected a hello text frame")
            return False
        self.metrics["bytes_in"] += len(msg.data)
        try:
            decoded = p.decode_client(msg.data)
            if decoded["type"] != "hello":
                raise p.ProtocolError(p.E_AUTH, "the first message must be hello")
            signed: p.Signed = decoded["signed"]
            hello = p.decode_hello_payload(signed.payload)
            if not hmac.compare_digest(hello.nonce, nonce):
                raise p.ProtocolError(p.E_AUTH, "hello does not answer this connection's challenge")
            p.check_timestamp(hello.ts, time.time())
            if not verify(hello.key, signed.payload.encode("utf-8"), signed.sig):
                raise p.ProtocolError(p.E_BAD_SIGNATURE, "hello signature does not verify")
        except p.ProtocolError as exc:
            code = exc.code if exc.code in p.FATAL_CODES or exc.code in (p.E_BAD_SIGNATURE, p.E_STALE) else p.E_AUTH
            await self._fatal(conn, code, exc.message)
            return False
        key_b64 = p.b64encode(hello.key)
        if key_b64 in self.ban or hello.peer in self.ban:
            await self._fatal(conn, p.E_BANNED, "this key is banned from the swarm")
            return False
        if self.allow and key_b64 not in self.allow and hello.peer not in self.allow:
            await self._fatal(conn, p.E_FORBIDDEN, "this swarm is private and the key is not on its allow-list")
            return False
        if self.settings.join_token and not hmac.compare_digest(hello.token.encode(), self.settings.join_token.encode()):
            await self._fatal(conn, p.E_FORBIDDEN, "this swarm is private: a valid join token is needed")
            return False
        conn.peer = hello.peer
        conn.key = hello.key
        self.metrics["handshakes"] += 1
        online = max(self.online, sum(1 for c in self.connections if c.peer))
        conn.send(p.msg_welcome(hello.peer, online, p.limits()))
        log.debug("peer joined", extra={"peer": hello.peer, "ip": conn.ip, "software": hello.software})
        return True

    async def _serve(self, conn: Connection) -> None:
        assert conn.peer is not None
        bucket = self.buckets.get(conn.peer)
        if bucket is None:
            if len(self.buckets) >= MAX_BUCKETS:
                self.buckets.pop(next(iter(self.buckets)))
            bucket = self.buckets[conn.peer] = TokenBucket(self.settings.rate, self.settings.burst)
        async for msg in conn.ws:
            if conn.closing:
                break
            if msg.type == WSMsgType.TEXT:
                data = msg.data
            elif msg.type == WSMsgType.BINARY:
                data = msg.data
            else:
                break
            self.metrics["bytes_in"] += len(data)
            request_id: int | None = None
            try:
                if len(data) > p.MAX_FRAME_BYTES:
                    raise p.ProtocolError(p.E_TOO_LARGE, f"frames are limited to {p.MAX_FRAME_BYTES} bytes")
                decoded = p.decode_client(data)
                request_id = decoded.get("id")
                if not bucket.take():
                    raise p.ProtocolError(p.E_RATE, f"more than {self.settings.rate:g} requests/s; slow down")
                if decoded["type"] == "publish":
                    await self._publish(conn, decoded["signed"])
                elif decoded["type"] == "sample":
                    entries = await self.broker.sample(decoded["n"], conn.peer)
                    self.metrics["samples"] += 1
                    self.metrics["batches_served"] += len(entries)
                    conn.send(p.msg_batches(decoded["id"], [e.to_json() for e in entries]))
                elif decoded["type"] == "stats":
                    conn.send(p.msg_stats(self.online, self.broker.window_size()))
                else:
                    raise p.ProtocolError(p.E_BAD_SCHEMA, "hello is only valid as the first message")
            except p.ProtocolError as exc:
                log.debug("rejected message", extra={"peer": conn.peer, "code": exc.code, "detail": exc.message})
                if exc.code in p.FATAL_CODES:
                    await self._fatal(conn, exc.code, exc.message)
                    break
                self.count_rejection(exc.code)
                conn.send(p.msg_error(exc.code, exc.message, request_id))

    async def _publish(self, conn: Connection, signed: p.Signed) -> None:
        batch = p.decode_batch(signed.payload)
        if batch.key != conn.key:
            raise p.ProtocolError(p.E_BAD_SIGNATURE, "the batch is signed for a different key than this connection's")
        if not verify(batch.key, signed.payload.encode("utf-8"), signed.sig):
            raise p.ProtocolError(p.E_BAD_SIGNATURE, "batch signature does not verify")
        p.check_timestamp(batch.ts, time.time())
        assert conn.peer is not None
        if not await self.broker.claim_seq(conn.peer, batch.seq):
            raise p.ProtocolError(p.E_REPLAY, f"sequence {batch.seq} is not above this peer's last one")
        await self.broker.add(Entry(conn.peer, signed.payload, p.b64encode(signed.sig)))
        self.metrics["publishes"] += 1
        conn.send(p.msg_published(batch.seq))


# -- embedded relay --------------------------------------------------------------------------
class EmbeddedRelay:
    """An in-memory relay on a background thread, for `sapling-node run` with no relay URL."""

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.relay = Relay(settings)
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
        self._runner = web.AppRunner(self.relay.app(), handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, reuse_address=True)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self.settings.port

    def stop(self) -> None:
        if self._runner is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():
            self._thread.join(timeout=10)


# -- command line ----------------------------------------------------------------------------
class JsonLogFormatter(logging.Formatter):
    """One JSON object per log line: ts, level, msg, and any `extra=` fields."""

    _skip = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _read_keys(path: str) -> list[str]:
    text = Path(path).read_text(encoding="utf-8")
    keys = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [k for k in keys if k]


def _valid_key(text: str) -> bool:
    if len(text) == p.PEER_ID_HEX and all(c in "0123456789abcdef" for c in text):
        return True
    try:
        return len(base64.b64decode(text, validate=True)) == p.PUBLIC_KEY_BYTES
    except (binascii.Error, ValueError):
        return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapling-relay",
        description="Relay for a Sapling swarm: nodes publish signed rollout batches and pull uniform samples of "
        "other nodes' batches. Settings come from defaults < --config TOML (keys as below, with underscores) < flags.",
    )
    parser.add_argument("--config", type=Path, help="TOML file with any of the settings below (keys with underscores)")
    defaults = RelaySettings()
    for f in fields(RelaySettings):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if f.name in ("allow_keys", "ban_keys"):
            parser.add_argument(flag + "-file", dest=f.name, metavar="FILE", default=None,
                                help=f"{help_text}; one per line, '#' comments")
            continue
        parser.add_argument(flag, type=type(getattr(defaults, f.name)), default=None, help=f"{help_text} (default: {getattr(defaults, f.name)!r})")
    return parser


def settings_from_args(argv: list[str] | None) -> RelaySettings:
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    if args.config is not None:
        try:
            data = tomllib.loads(args.config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {args.config}: {exc}") from exc
        known = {f.name for f in fields(RelaySettings)}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"{args.config}: unknown setting {key!r}; allowed: {', '.join(sorted(known))}")
            values[key] = value
    for f in fields(RelaySettings):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if f.name in ("allow_keys", "ban_keys"):
            try:
                value = _read_keys(value)
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read {f.name.replace('_', '-')} file: {exc}") from exc
        values[f.name] = value
    defaults = RelaySettings()
    for name, value in values.items():
        want = type(getattr(defaults, name))
        flag = name.replace("_", "-")
        if want is list:
            if not isinstance(value, list) or not all(isinstance(k, str) and _valid_key(k.strip()) for k in value):
                raise ValueError(f"{flag}: every entry must be a base64 Ed25519 public key or a peer id")
        elif want is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{flag} must be a number, got {value!r}")
            values[name] = float(value)
        elif isinstance(value, bool) or not isinstance(value, want):
            raise ValueError(f"{flag} must be a {want.__name__}, got {value!r}")
    settings = RelaySettings(**values)
    settings.check()
    return settings


def main(argv: list[str] | None = None) -> int:
    try:
        settings = settings_from_args(argv)
    except ValueError as exc:
        print(f"sapling-relay: {exc}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    relay = Relay(settings)
    log.info("listening", extra={"host": settings.host, "port": settings.port, "redis": bool(settings.redis)})
    try:
        web.run_app(relay.app(), host=settings.host, port=settings.port, print=None, shutdown_timeout=5.0,
                    reuse_address=True)
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
