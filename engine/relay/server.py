"""`sapling-relay`: the websocket relay that nodes share rollouts through.

    relay = Relay(RelaySettings(port=8765))           # its aiohttp app: relay.app(); `serve` in engine/relay/cli.py
    EmbeddedRelay(RelaySettings(port=0)).start()      # on a background thread: engine/relay/embedded.py

The relay is not trusted by anyone, but it still refuses what it can see is
wrong, so a bad peer costs the swarm as little as possible:

- a signed handshake (the challenge nonce, signed with the node's key);
- every publish: size, schema, limits, signature, a per-peer monotonic
  sequence number (replay) and a timestamp window;
- per-peer token-bucket rate limits, a cap on connections per IP address
  (behind a reverse proxy, the client's: --trusted-proxy, proxy.py),
  its own websocket pings (a peer that answers neither of two in a row gets
  `heartbeat_timeout`), and a bounded send queue per connection: a slow
  consumer gets `slow_consumer` and is closed, and nobody else waits for it;
- optional private swarms (join token, allow-list of public keys) and a ban list.

Every connection it ends gets an `error` naming why, then a close frame
(1008 for a policy close, 1001 when the relay stops); a client that does
not read them within `DROP_GRACE_S` is cut off. Nodes *pull*: a `sample`
request returns n batches drawn uniformly, without replacement, from the
recent window (only those newer than the request's cursor, if it sent one),
never the requester's own. Over plain HTTP the relay serves its status
page, its information document, invite pages, `/healthz` and `/metrics`
(engine/relay/web.py, with live numbers from stats.py and the
document from info.py); refusals are summed per peer and logged at
info level once a minute (limits.py); SIGTERM (once or several times)
closes connections and exits 0. The wire format is engine/swarm/protocol.py
and docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WebSocketError, WSCloseCode, WSMsgType, web

from engine.relay.brokers import Broker, Entry, MemoryBroker, RedisBroker
from engine.relay.credit import CREDIT_PUSH_S, CreditBook
from engine.relay.dataset import DatasetKeeper
from engine.relay.info import dataset_policy, relay_identity
from engine.relay.limits import RejectionLog
from engine.relay.results import ResultsBook
from engine.relay.settings import RelaySettings
from engine.relay.stats import LiveStats
from engine.relay.web import RelayPages
from engine.swarm import protocol
from engine.swarm.identity import readable_name, verify
from engine.swarm.rate import TokenBucket
from engine.swarm.receipts import DUPLICATE, NOT_SAMPLED, SAME_ADDRESS, USED, decode_receipts

__all__ = ["Relay", "RelaySettings"]

log = logging.getLogger("sapling.relay")

STATS_PERIOD_S = 5.0  # how often connected peers get the small stats push
CLOSE_POLICY = 1008  # websocket close code for a protocol or policy violation
CLOSE_GOING_AWAY = 1001  # websocket close code when the relay stops
# aiohttp drops frames above this outright (close 1009); frames between MAX_FRAME_BYTES
# and this get a `too_large` error and the connection stays up.
HARD_FRAME_BYTES = 4 * protocol.MAX_FRAME_BYTES
# Rate-limit buckets remembered for peers that left (a reconnect must not refill a bucket).
MAX_BUCKETS = 100_000
# A connection being closed gets this long to take its last messages and the close frame;
# then its socket is cut, so a client that never reads cannot hold the relay (or its shutdown).
DROP_GRACE_S = 5.0
CLOSE_STORES_S = 5.0  # the most a stop waits for the last counts to reach Redis and its connections to close
# Handshake failures reported under their own code; every other problem with a hello is `not_authenticated`.
HANDSHAKE_CODES = frozenset({protocol.E_VERSION, protocol.E_BAD_SIGNATURE, protocol.E_STALE})
SHUTDOWN_MESSAGE = "the relay is restarting; reconnect shortly"


class Connection:
    """One websocket: its peer (after the handshake), its outgoing queue, and its liveness.

    Everything the relay sends goes through the queue, in order, written by one
    task. `drop` queues a last `error` and makes the writer close the socket
    after it; nothing is queued after that.
    """

    def __init__(self, relay: Relay, ws: web.WebSocketResponse, ip: str, transport: asyncio.Transport | None) -> None:
        self.relay = relay
        self.ws = ws
        self.ip = ip
        self.transport = transport
        self.peer: str | None = None
        self.key: bytes | None = None
        self.outbox: deque[str] = deque()
        self.wake = asyncio.Event()
        self.closing = False  # set by `drop`: the writer closes the socket after the queued messages
        self.close_code = CLOSE_POLICY
        self.close_reason = ""
        self.last_heard = time.monotonic()  # any frame from the client counts as an answer to a ping
        self.ping_sent: float | None = None
        self.ping_due = False
        self.missed_pings = 0
        self.writer: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[None] | None = None  # the handshake, then serving requests
        self.credit_due = 0.0  # when the next stats push carries this peer's credit (engine/relay/credit.py)

    def send(self, message: dict[str, Any]) -> None:
        if self.closing:
            return
        if len(self.outbox) >= self.relay.settings.send_queue:
            self.outbox.clear()  # what it has not read by now is dropped; it gets the error instead
            log.warning("dropping slow consumer", extra={"peer": self.peer, "ip": self.ip})
            self.drop(protocol.E_SLOW, f"more than {self.relay.settings.send_queue} messages waited for this "
                                       "connection to read them")
            return
        self.outbox.append(protocol.encode(message))
        self.wake.set()

    def drop(self, code: str, message: str, close_code: int = CLOSE_POLICY) -> None:
        """End the connection: `error` `code` after what is queued, then a close frame, within DROP_GRACE_S."""
        if self.closing:
            return
        if code != protocol.E_SHUTDOWN:
            self.relay.reject(self, code)
        self.closing = True
        self.outbox.append(protocol.encode(protocol.msg_error(code, message)))
        self.close_code, self.close_reason = close_code, code
        self.wake.set()
        if self.transport is not None:
            asyncio.get_running_loop().call_later(DROP_GRACE_S, self.transport.abort)

    def ping(self) -> None:
        """Called every heartbeat: drop the peer if it answered neither of the last two pings, else ping."""
        if self.closing:
            return
        if self.ping_sent is not None and self.last_heard < self.ping_sent:
            self.missed_pings += 1
        else:
            self.missed_pings = 0
        if self.missed_pings >= 2:
            self.drop(protocol.E_HEARTBEAT, f"no answer to two pings {self.relay.settings.heartbeat:g} s apart")
            return
        self.ping_due = True
        self.wake.set()

    async def write_loop(self) -> None:
        ws = self.ws
        try:
            while True:
                if self.ping_due:
                    self.ping_due = False
                    self.ping_sent = time.monotonic()
                    await ws.ping()
                if self.outbox:
                    text = self.outbox.popleft()
                    await ws.send_str(text)
                    self.relay.metrics["bytes_out"] += len(text)
                    continue
                if self.closing:
                    reader = self.reader
                    if reader is not None and not reader.done():
                        reader.cancel()  # close() must not meet a pending receive() (see Relay.handle_ws)
                        await asyncio.wait([reader])
                    await ws.close(code=self.close_code, message=self.close_reason.encode())
                    return
                self.wake.clear()
                await self.wake.wait()
        except (ConnectionError, RuntimeError):
            return  # the socket is gone; the reader notices too

    async def finish(self) -> None:
        """After the reader stopped: deliver a pending `drop`, or stop writing to a client that left."""
        assert self.writer is not None
        if not self.closing:
            self.closing = True
            self.writer.cancel()
        await asyncio.wait([self.writer], timeout=2 * DROP_GRACE_S)  # the abort in `drop` bounds it sooner
        self.writer.cancel()
        if not self.ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(), DROP_GRACE_S)


class Relay:
    def __init__(self, settings: RelaySettings, broker: Broker | None = None,
                 shutdown_message: str = SHUTDOWN_MESSAGE) -> None:
        settings.check()
        self.settings = settings
        self.shutdown_message = shutdown_message
        self.broker: Broker = broker or (
            RedisBroker(settings.redis, settings.window, settings.swarm) if settings.redis
            else MemoryBroker(settings.window)
        )
        self.connections: set[Connection] = set()
        self.per_ip: Counter[str] = Counter()
        self.buckets: dict[str, TokenBucket] = {}
        self.metrics: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        self.rejection_log = RejectionLog()
        self.peers_here = 0  # authenticated connections to this process, counted as they come and go
        self.peers_elsewhere = 0  # on other relay processes of the swarm (Redis), as of the last stats tick
        self.allow = {k.strip() for k in settings.allow_keys if k.strip()}
        self.ban = {k.strip() for k in settings.ban_keys if k.strip()}
        self._tasks: list[asyncio.Task[None]] = []
        self.started = time.time()
        self.bound = False  # set once its port listens (cli.serve, EmbeddedRelay)
        self.identity = relay_identity(settings.data_dir)  # the relay's key: information document, receipts
        shared = self.broker.client if isinstance(self.broker, RedisBroker) else None  # one Redis pool per process
        self.live = LiveStats(settings.redis, settings.swarm, client=shared)  # the status page's numbers
        self.models = settings.model_policy()  # one model, mixed or not declared: welcome and publish
        self.proxies = settings.trusted_proxies()  # whose X-Forwarded-For names the client (proxy.py)
        self.credit = CreditBook(settings.redis, settings.swarm, settings.credit_per_round, settings.receipt_window,
                                 client=shared)
        # How far each model got (engine/relay/results.py): the hour's evaluation seed and re-scored answers.
        self.results = ResultsBook(settings.redis, settings.swarm, settings.results_questions, client=shared)
        # The swarm's dataset (engine/relay/dataset.py): every stored batch and the counted `used` receipts.
        self.dataset = (DatasetKeeper(settings.dataset_dir, settings.dataset_max_mb,
                                      {**(dataset_policy(settings) or {}), "name": settings.name})
                        if settings.dataset_dir else None)

    def window_size(self) -> int:
        return self.broker.window_size()

    @property
    def online(self) -> int:
        return self.peers_here + self.peers_elsewhere

    # -- app --------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ws", self.handle_ws)
        RelayPages(self).add_routes(app)  # /, /.well-known/sapling-relay, /join, /healthz, /metrics, ...
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.broker.start()
        await self.live.start()
        await self.credit.start()
        await self.results.start()
        self._tasks = [
            asyncio.create_task(self._every(STATS_PERIOD_S, self._push_stats), name="relay-stats"),
            asyncio.create_task(self._every(self.settings.heartbeat, self._heartbeat), name="relay-heartbeat"),
            asyncio.create_task(self._every(self.settings.reject_log_every, self._log_rejections), name="relay-log"),
        ]
        log.debug("relay started", extra={"broker": type(self.broker).__name__})  # "listening" follows, once bound

    async def _on_shutdown(self, _app: web.Application) -> None:
        if self.bound:  # a relay that never listened (its port was taken) has nothing to shut down
            log.info("relay shutting down", extra={"connections": len(self.connections)})
        for conn in list(self.connections):
            conn.drop(protocol.E_SHUTDOWN, self.shutdown_message, CLOSE_GOING_AWAY)
        writers = [c.writer for c in self.connections if c.writer is not None]
        if writers:
            await asyncio.wait(writers, timeout=2 * DROP_GRACE_S)

    async def _on_cleanup(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._log_rejections()

        async def close_stores() -> None:
            with contextlib.suppress(Exception):  # Redis gone at shutdown: the last seconds of counts are lost
                await self.live.close()
                await self.credit.close()
                await self.results.close()
            await self.broker.close()

        # A stop request is answered within seconds, whatever Redis does (gone, or not answering: a connection
        # to it may wait out its timeouts and retries); what was not written by then is lost, as above.
        try:
            await asyncio.wait_for(close_stores(), CLOSE_STORES_S)
        except TimeoutError:
            log.warning("redis did not answer within %.0f s of the stop; the last counts were not saved",
                        CLOSE_STORES_S)

    @staticmethod
    async def _every(period: float, tick: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(period)
            await tick()

    async def _push_stats(self) -> None:
        await self.live.flush()  # never raises: counts wait for the next tick when Redis is away
        here = self.peers_here
        try:
            total = await self.broker.report_online(here)
        except Exception as exc:  # noqa: BLE001 - a broker hiccup (Redis down) must not end the stats loop
            log.warning("stats update failed: %s", exc)
            return
        self.peers_elsewhere = max(0, total - here)
        await self.credit.flush()
        now = time.monotonic()  # each peer's own credit goes with every CREDIT_PUSH_S-th second's push
        due = {c for c in self.connections if c.peer and c.credit_due <= now}
        credits = await self.credit.credits([c.peer for c in due if c.peer])
        asking = await self.results.asking()  # the hour's evaluation seed
        for conn in list(self.connections):
            if conn.peer:
                conn.credit_due = now + CREDIT_PUSH_S if conn in due else conn.credit_due
                conn.send(protocol.msg_stats(self.online, self.broker.window_size(), credits.get(conn.peer), asking))

    async def _heartbeat(self) -> None:
        for conn in list(self.connections):
            if conn.peer:  # the handshake has its own timeout
                conn.ping()

    async def _log_rejections(self) -> None:
        self.rejection_log.flush()

    def reject(self, conn: Connection, code: str) -> None:
        self.rejections[code] += 1
        self.rejection_log.add(conn.peer, conn.ip, code)

    # -- websocket --------------------------------------------------------------------
    async def handle_ws(self, request: web.Request) -> web.StreamResponse:
        # Our own pings (Connection.ping) instead of aiohttp's heartbeat, which cuts the socket
        # without a word half an interval after one missed pong.
        ws = web.WebSocketResponse(max_msg_size=HARD_FRAME_BYTES, autoping=False, timeout=DROP_GRACE_S)
        await ws.prepare(request)
        ip = self.proxies.client_ip(request.remote, request.headers.getall("X-Forwarded-For", []))  # the cap, the logs
        conn = Connection(self, ws, ip, request.transport)
        conn.writer = asyncio.create_task(conn.write_loop())
        self.connections.add(conn)
        try:
            if self.per_ip[ip] >= self.settings.max_conn_per_ip:
                conn.drop(protocol.E_CONN_LIMIT, f"at most {self.settings.max_conn_per_ip} connections per address")
                return ws
            self.per_ip[ip] += 1
            # The read side runs as its own task so that the writer can stop it before closing:
            # aiohttp cuts the socket at once when close() meets a pending receive(), and the
            # client would never see the close frame's code.
            conn.reader = asyncio.create_task(self._read_side(conn))
            try:
                await asyncio.wait([conn.reader])
            finally:
                conn.reader.cancel()
                self.per_ip[ip] -= 1
                if self.per_ip[ip] <= 0:
                    del self.per_ip[ip]
            if not conn.reader.cancelled() and (exc := conn.reader.exception()) is not None:
                log.error("connection handler failed", exc_info=exc, extra={"peer": conn.peer, "ip": ip})
        finally:
            self.connections.discard(conn)
            if conn.peer:
                self.peers_here -= 1
                log.debug("peer left", extra={"peer": conn.peer})
            await conn.finish()
        return ws

    async def _read_side(self, conn: Connection) -> None:
        if await self._handshake(conn):
            await self._serve(conn)

    async def _receive(self, conn: Connection, timeout: float | None = None) -> tuple[WSMsgType, Any]:
        """The next text or binary frame, answering pings on the way; (CLOSED, None) when the socket ends."""
        ws = conn.ws
        while True:
            msg = await ws.receive(timeout)
            conn.last_heard = time.monotonic()
            if msg.type == WSMsgType.PING:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.pong(msg.data)
                continue
            if msg.type == WSMsgType.PONG:
                continue
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                self.metrics["bytes_in"] += len(msg.data)
                return msg.type, msg.data
            if msg.type == WSMsgType.ERROR and isinstance(msg.data, WebSocketError):
                # The websocket layer closed it: 1009 for a frame over HARD_FRAME_BYTES,
                # 1007 for a text frame that is not UTF-8, 1002 for a broken frame.
                too_big = msg.data.code == WSCloseCode.MESSAGE_TOO_BIG
                self.reject(conn, protocol.E_TOO_LARGE if too_big else protocol.E_BAD_JSON)
            return WSMsgType.CLOSED, None

    async def _handshake(self, conn: Connection) -> bool:
        nonce = secrets.token_hex(protocol.NONCE_BYTES)
        conn.send(protocol.msg_challenge(nonce, self.settings.name, time.time()))
        try:
            kind, data = await self._receive(conn, protocol.HANDSHAKE_TIMEOUT_S)
        except TimeoutError:
            conn.drop(protocol.E_AUTH, "no hello within the handshake timeout")
            return False
        if kind == WSMsgType.CLOSED:
            return False
        try:
            decoded = protocol.decode_client(data)
            if decoded["type"] != "hello":
                raise protocol.ProtocolError(protocol.E_AUTH, "the first message must be hello")
            signed: protocol.Signed = decoded["signed"]
            hello = protocol.decode_hello_payload(signed.payload)
            if not hmac.compare_digest(hello.nonce, nonce):
                raise protocol.ProtocolError(protocol.E_AUTH, "hello does not answer this connection's challenge")
            protocol.check_timestamp(hello.ts, time.time())
            if not verify(hello.key, signed.payload.encode("utf-8"), signed.sig):
                raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE, "hello signature does not verify")
        except protocol.ProtocolError as exc:
            code = exc.code if exc.code in HANDSHAKE_CODES else protocol.E_AUTH
            conn.drop(code, exc.message if code == exc.code else f"not a valid hello: {exc}")
            return False
        key_b64 = protocol.b64encode(hello.key)
        if key_b64 in self.ban or hello.peer in self.ban:
            conn.drop(protocol.E_BANNED, "this key is banned from the swarm")
            return False
        if self.allow and key_b64 not in self.allow and hello.peer not in self.allow:
            conn.drop(protocol.E_FORBIDDEN, "this swarm is private and the key is not on its allow-list")
            return False
        if (self.settings.join_token
            and not hmac.compare_digest(hello.token.encode(), self.settings.join_token.encode())):
            conn.drop(protocol.E_FORBIDDEN, "this swarm is private: a valid join token is needed")
            return False
        conn.peer = hello.peer
        conn.key = hello.key
        self.peers_here += 1
        self.metrics["handshakes"] += 1
        self.live.record_join(hello.peer)
        conn.send(protocol.msg_welcome(hello.peer, self.online, self.settings.limits(), self.models.to_document()))
        log.debug("peer joined", extra={"peer": hello.peer, "ip": conn.ip, "software": hello.software})
        return True

    async def _serve(self, conn: Connection) -> None:
        assert conn.peer is not None
        bucket = self.buckets.get(conn.peer)
        if bucket is None:
            if len(self.buckets) >= MAX_BUCKETS:
                self.buckets.pop(next(iter(self.buckets)))
            bucket = self.buckets[conn.peer] = TokenBucket(self.settings.rate, self.settings.burst)
        while not conn.closing:
            kind, data = await self._receive(conn)
            if kind == WSMsgType.CLOSED:
                return
            try:
                await self._handle(conn, bucket, data)
            except protocol.ProtocolError as exc:  # carries the message's id when it had one
                log.debug("rejected message", extra={"peer": conn.peer, "code": exc.code, "detail": exc.message})
                if exc.code in protocol.FATAL_CODES:
                    conn.drop(exc.code, exc.message)
                    return
                self.reject(conn, exc.code)
                conn.send(protocol.msg_error(exc.code, exc.message, exc.request_id))
            if conn.outbox:
                # Frames that arrived together are read without a pause; let the writer take
                # this answer first, so the queue measures a peer that does not read, not a
                # burst of requests the socket would have taken at once.
                await asyncio.sleep(0)

    async def _handle(self, conn: Connection, bucket: TokenBucket, data: str | bytes) -> None:
        decoded = protocol.decode_client(data)
        try:
            await self._answer(conn, bucket, decoded)
        except protocol.ProtocolError as exc:
            exc.request_id = decoded.get("id")
            raise

    async def _answer(self, conn: Connection, bucket: TokenBucket, decoded: dict[str, Any]) -> None:
        if not bucket.take():
            raise protocol.ProtocolError(protocol.E_RATE, f"more than {self.settings.rate:g} requests/s; slow down")
        if decoded["type"] == "publish":
            await self._publish(conn, decoded["signed"])
        elif decoded["type"] == "sample":
            assert conn.peer is not None
            entries, cursor = await self.broker.sample(decoded["n"], conn.peer, decoded["after"])
            self.metrics["samples"] += 1
            self.metrics["batches_served"] += len(entries)
            conn.send(protocol.msg_batches(decoded["id"], [e.to_json() for e in entries], cursor))
            await self.credit.handed(conn.peer, [(e.peer, e.seq, e.items) for e in entries])
        elif decoded["type"] == "stats":  # with this peer's credit, read now
            credit = (await self.credit.credits([conn.peer] if conn.peer else [])).get(conn.peer or "")
            conn.send(protocol.msg_stats(self.online, self.broker.window_size(), credit, await self.results.asking()))
        elif decoded["type"] == "receipts":
            assert conn.peer is not None and conn.key is not None
            answer = await self.credit.receive(conn.peer, conn.key, decoded["signed"], decoded["id"], conn.ip)
            self.rejection_log.add_counts(conn.peer, conn.ip, answer["refused"], "receipt_")  # items refused
            self._keep_used(conn.peer, decoded["signed"], answer["refused"])
            conn.send(answer)
        elif decoded["type"] == "results":  # evaluation answers, re-scored here (engine/relay/results.py)
            assert conn.peer is not None and conn.key is not None
            conn.send(await self.results.receive(conn.peer, conn.key, decoded["signed"], decoded["id"]))
        else:
            raise protocol.ProtocolError(protocol.E_BAD_SCHEMA, "hello is only valid as the first message")

    def _keep_used(self, receiver: str, signed: protocol.Signed, refused: dict[str, int]) -> None:
        """For the dataset: the `used` items of a counted receipts message, each another peer's. A message with
        an item the relay did not hand this receiver, one it had receipted, or one from its sender's own address
        keeps nothing: the answer does not say which item it was."""
        if self.dataset is None or any(refused.get(k) for k in (NOT_SAMPLED, DUPLICATE, SAME_ADDRESS)):
            return
        verdicts = decode_receipts(signed.payload).verdicts  # checked by credit.receive just before
        self.dataset.keep_used(receiver, [(v.sender, v.seq, v.index) for v in verdicts
                                          if v.verdict == USED and v.sender != receiver])

    async def _publish(self, conn: Connection, signed: protocol.Signed) -> None:
        batch = protocol.decode_batch(signed.payload)
        if batch.key != conn.key:
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE,
                                         "the batch is signed for a different key than this connection's")
        if not verify(batch.key, signed.payload.encode("utf-8"), signed.sig):
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE, "batch signature does not verify")
        protocol.check_timestamp(batch.ts, time.time())
        if not self.models.admits(batch.model):
            raise protocol.ProtocolError(protocol.E_WRONG_MODEL, f"this swarm trains only {self.models.label}; "
                                         f"the batch is labelled {batch.model[:80]!r}")
        assert conn.peer is not None
        if not await self.broker.claim_seq(conn.peer, batch.seq):
            if self.broker.holds(conn.peer, batch.seq, signed.payload):  # sent again after a lost acknowledgement
                self.metrics["resends_acknowledged"] += 1
                conn.send(protocol.msg_published(batch.seq))
                return
            raise protocol.ProtocolError(protocol.E_REPLAY, f"sequence {batch.seq} is not above this peer's last one")
        sig = protocol.b64encode(signed.sig)
        await self.broker.add(Entry(conn.peer, signed.payload, sig, batch.seq, len(batch.items)))
        if self.dataset is not None:
            self.dataset.keep_batch(conn.peer, signed.payload, sig, batch.seq)
        self.metrics["publishes"] += 1
        self.credit.shared(conn.peer, readable_name(batch.key), len(batch.items), conn.ip)
        self.live.record_publish(batch)
        conn.send(protocol.msg_published(batch.seq))
