"""The node's side of the relay link, on a background thread with its own event loop.

The training loop is synchronous; it calls `publish` after each round and
`sample` before training. Both return promptly: when the relay is down,
`publish` drops the batch and `sample` returns nothing, so the node trains
solo and says so. The link reconnects in the background with exponential
backoff and full jitter.

Delivery. Sequence numbers are at least the time in milliseconds, so they
rise across reconnects and restarts without being stored. A publish carries
its sequence number as its `id`: `published` acknowledges it; `internal` (the
relay could not reach its store) publishes it again a moment later under a new
number, up to MAX_RETRIES times; any other refusal is final. A batch still
unanswered when the link dies is sent again, once, first on the next link: the
relay stores it if it never arrived and refuses it as a replay if it did, so
nothing is lost or stored twice. One older than `RESEND_WITHIN_S` is dropped
and counted.

A silent link. A dead TCP connection can stay open for minutes, so every
wait has a deadline: engine/swarm/heartbeat.py pings after half a `heartbeat`
of quiet and gives the link up after a whole one, counting silence only
while this process runs; the log says once when the link is lost and once
when it is back, with how long it was down.

`sample` keeps the relay's sampling cursor, so each call draws only from
batches published since the previous one (docs/protocol.md). A swarm may
have several relays on one Redis: the client tries them in order of last
success (`RelayMemory`), moves to the next when a connection fails or drops,
and keeps its cursor across the move.

    client = SwarmClient(["wss://a.example/ws", "wss://b.example/ws"], identity,
                         memory=RelayMemory(data_dir / "swarm" / "relays.json"))
    client.start(); client.wait_connected(3.0); client.state.url   # the relay in use

Every text frame sent and received is counted by `meter` when one is set
(engine/swarm/datacap.py). What the client shows and keeps beside the link
(`LinkState`, `RelayMemory`, unacknowledged batches, pacing) is in link.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import aiohttp

from engine.swarm import link, protocol
from engine.swarm.datacap import DataMeter
from engine.swarm.heartbeat import close_socket, listen
from engine.swarm.identity import Identity
from engine.swarm.link import LinkSilent, LinkState, RelayMemory, Unacked, duration_text, pace
from engine.swarm.rate import TokenBucket
from engine.swarm.results import msg_results

log = logging.getLogger(__name__)



class SwarmClient:
    def __init__(
        self,
        url: str | Sequence[str],
        identity: Identity,
        token: str = "",
        on_change: Callable[[LinkState], None] | None = None,
        rng: random.Random | None = None,
        memory: RelayMemory | None = None,
        heartbeat: float = protocol.HEARTBEAT_S,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("SwarmClient needs at least one relay address")
        if heartbeat <= 0:
            raise ValueError("the heartbeat must be a positive number of seconds")
        self.heartbeat = heartbeat  # a link silent this long is given up (pinged after half of it)
        self.memory = memory
        self.urls = memory.order(urls) if memory is not None else list(dict.fromkeys(urls))
        self._index = 0  # the relay in use, or tried next
        self.identity = identity
        self.token = token
        self.on_change = on_change
        self.state = LinkState(url=self.urls[0])
        self._rng = rng or random.Random()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="swarm-client", daemon=True)
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._cursor: str | None = None  # the relay's sampling cursor from the last `batches`
        self._wake: asyncio.Event | None = None  # set to end a reconnect wait early
        self._ids = itertools.count(1)
        self._seq = 0
        self._stop = threading.Event()
        self._task: Future[None] | None = None
        self._main: asyncio.Task[None] | None = None
        self._fatal_code = ""
        self._fatal_message = ""
        self._bucket: TokenBucket | None = None  # this link's pace, from the relay's welcome
        self._pace_lock: asyncio.Lock | None = None
        self._down_since: float | None = None  # monotonic time the link was lost, until it is back
        self._unacked: dict[int, Unacked] = {}  # batches sent and not yet answered, by sequence number
        self._retries: set[asyncio.Task[None]] = set()  # publishes again after `internal`, held until done
        self._publish_lock: asyncio.Lock | None = None  # publishes (and the resends before them) go out in order
        self._stall: tuple[float, float] = (float("-inf"), 0.0)  # the last long stall: (monotonic end, seconds)
        self.meter: DataMeter | None = None  # counts the bytes of every text frame, for the daily caps

    @property
    def url(self) -> str:
        """The relay in use (or the one the next attempt goes to)."""
        return self.urls[self._index]

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._main_task(), self._loop)

    async def _main_task(self) -> None:
        self._main = asyncio.current_task()
        await self._connect_forever()

    async def _shutdown(self) -> None:
        if self._main is not None:
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._main

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def close(self) -> None:
        """Stop the link for good; safe to call more than once."""
        self._stop.set()
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def wake(self) -> None:
        """Reconnect now instead of at the end of the backoff wait (the relay is known to be back)."""
        if self._loop.is_running() and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def wait_connected(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state.connected:
                return True
            time.sleep(0.05)
        return self.state.connected

    def _set(self, **changes: Any) -> None:
        was = self.state.connected
        for key, value in changes.items():
            setattr(self.state, key, value)
        if "connected" in changes and changes["connected"] != was:
            self.state.since = time.time()
            if self.on_change is not None:
                try:
                    self.on_change(self.state)
                except Exception:  # a listener's bug must not kill the link
                    log.exception("swarm state listener failed")

    async def _connect_forever(self) -> None:
        attempt = 0
        self._wake = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            while not self._stop.is_set():
                try:
                    await self._session(session)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # whatever ended this attempt, the next one comes
                    if not isinstance(exc, link.LINK_ERRORS):
                        log.exception("the relay link failed unexpectedly")
                    if self.state.connected:
                        attempt = 0  # it had been up: start the backoff again
                    failed = self.url
                    if len(self.urls) > 1:  # the next relay of the swarm gets the next attempt
                        self._index = (self._index + 1) % len(self.urls)
                        log.info("relay %s failed (%s); trying %s next", failed, exc, self.url)
                    self._link_down(failed, str(exc) or type(exc).__name__,
                                    exc.seconds if isinstance(exc, LinkSilent) else 0.0)
                finally:
                    ws, self._ws = self._ws, None
                    for future in self._pending.values():
                        if not future.done():
                            future.set_result({"batches": [], "cursor": None})
                    self._pending.clear()
                    if ws is not None:  # closed only now: the node already knows the link is down
                        await close_socket(ws)
                if self._stop.is_set():
                    break
                delay = self._rng.uniform(0, min(link.BACKOFF_CAP_S, link.BACKOFF_START_S * 2**attempt))
                if self._fatal_code in (protocol.E_BANNED, protocol.E_FORBIDDEN):
                    delay = max(delay, link.BACKOFF_CAP_S)  # refused on purpose: retry rarely
                attempt = min(attempt + 1, 16)
                log.debug("relay link down (%s); retrying in %.1f s", self.state.last_error, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                self._wake.clear()  # cleared after the wait: a wake() during the last attempt still counts

    def _link_down(self, url: str, reason: str, dead_for: float) -> None:
        """The link to `url` is down (dead for `dead_for` s already when it fell silent), or an attempt at it
        failed: say why. A link that was up is lost, and the log says so once."""
        if self.state.connected:
            ended, stalled = self._stall
            if time.monotonic() - ended < max(self.heartbeat / 2, 2 * link.STALL_SLACK_S):  # it went with a long stall
                reason = (f"this computer did not run for {duration_text(stalled)}, asleep or stopped, and the link "
                          f"did not survive it: {reason}")
                dead_for = max(dead_for, time.monotonic() - ended + stalled)
            self._down_since = time.monotonic() - dead_for
            log.info("lost the link to the relay %s (%s); training alone until it is back", url, reason)
            self._set(connected=False, online=0, lost_at=time.time() - dead_for, last_error=reason, url=self.url)
        else:
            self._set(last_error=reason, url=self.url)

    def _link_up(self, challenge: dict[str, Any], welcome: dict[str, Any]) -> None:
        """The relay let this node in: connected (after a loss, the log says how long the link was down)."""
        if self._down_since is not None:
            log.info("the link to the relay %s is back after %s down (%d online)", self.url,
                     duration_text(time.monotonic() - self._down_since), welcome["online"])
            self._down_since = None
        else:
            log.info("joined the swarm at %s as %s (%d online)", self.url, self.identity.name, welcome["online"])
        self._set(connected=True, online=welcome["online"], last_error="", relay=challenge["relay"], url=self.url,
                  models=welcome["models"])

    async def _session(self, session: aiohttp.ClientSession) -> None:
        """One link, from opening it to its end (always an exception; `_connect_forever` closes `_ws`)."""
        ws, challenge, welcome = await self._open(session)
        self._ws = ws
        self._fatal_code = self._fatal_message = ""
        self._bucket = pace(welcome.get("limits"))
        if self.memory is not None:
            self.memory.remember(self.url)
        resend = asyncio.create_task(self._resend(ws))  # first on the lock: ahead of any new publish
        self._link_up(challenge, welcome)
        try:
            await self._listen(ws)
        finally:
            if not resend.done():
                resend.cancel()
            await asyncio.gather(resend, return_exceptions=True)
        if self._fatal_message:  # the relay said why before closing
            raise ConnectionError(self._fatal_message)
        raise ConnectionError(f"relay closed the connection (code {ws.close_code})")

    async def _open(self, session: aiohttp.ClientSession) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any],
                                                                   dict[str, Any]]:
        """Connect and pass the relay's handshake within link.CONNECT_TIMEOUT_S: (the websocket, challenge, welcome).

        Without this deadline an attempt across a link that accepts and forwards nothing waits out aiohttp's
        five minutes, and the node stays cut off that long after the link is back."""
        ws: aiohttp.ClientWebSocketResponse | None = None
        try:
            async with asyncio.timeout(link.CONNECT_TIMEOUT_S):
                ws = await session.ws_connect(
                    self.url, max_msg_size=protocol.MAX_RESPONSE_BYTES, autoping=False,
                    timeout=aiohttp.ClientWSTimeout(ws_close=link.CLOSE_TIMEOUT_S),
                )
                challenge = protocol.decode_relay(await self._text(ws, "relay closed before its challenge"))
                if challenge["type"] != "challenge":
                    raise protocol.ProtocolError(protocol.E_AUTH, f"expected a challenge, got {challenge['type']}")
                payload = protocol.hello_payload(self.identity.public_key, challenge["nonce"], time.time(), self.token,
                                                 link.SOFTWARE)
                await self._send_text(ws, protocol.encode(protocol.msg_hello(self.identity.signed(payload))))
                welcome = protocol.decode_relay(await self._text(ws, "relay closed before its welcome"))
                if welcome["type"] == "error":
                    self._fatal_code = welcome["code"]
                    raise ConnectionError(f"relay refused the handshake: {welcome['code']}: {welcome['message']}")
                if welcome["type"] != "welcome":
                    raise protocol.ProtocolError(protocol.E_AUTH, f"expected a welcome, got {welcome['type']}")
                return ws, challenge, welcome
        except BaseException as exc:
            if ws is not None:
                await close_socket(ws)
            if isinstance(exc, TimeoutError):
                raise ConnectionError(f"no answer from the relay within {link.CONNECT_TIMEOUT_S:g} s of "
                                      "connecting") from exc
            raise

    async def _text(self, ws: aiohttp.ClientWebSocketResponse, closed: str) -> str:
        """The next text frame of the handshake, answering pings on the way; ConnectionError(`closed`) when none
        comes."""
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.PING:
                await ws.pong(msg.data)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                self._count(received=msg.data)
                return str(msg.data)
            elif msg.type != aiohttp.WSMsgType.PONG:
                raise ConnectionError(closed)

    async def _listen(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Hand the relay's messages to `_dispatch` until the link ends; LinkSilent when it falls silent (after a
        heartbeat of silence, counted only while this process runs: engine/swarm/heartbeat.py)."""
        await listen(ws, self.heartbeat, self._received, self._stalled)

    def _received(self, text: str) -> None:
        """One text frame from the relay: counted, then handed to `_dispatch` (a bad one is logged and ignored)."""
        self._count(received=text)
        try:
            self._dispatch(protocol.decode_relay(text))
        except protocol.ProtocolError as exc:
            log.warning("ignored a bad message from the relay: %s", exc)

    def _stalled(self, seconds: float) -> None:
        """This process did not run for `seconds` while waiting for the relay: not the relay's silence."""
        if seconds <= 0:
            return
        self.state.stalled_s += seconds
        if seconds >= self.heartbeat / 4:
            self._stall = (time.monotonic(), seconds)
            log.info("this process did not run for %s (asleep, stopped or starved of CPU); not counted as the "
                     "relay's silence", duration_text(seconds))

    def _dispatch(self, msg: dict[str, Any]) -> None:
        type_ = msg["type"]
        if type_ == "batches":
            future = self._pending.pop(msg["id"], None)
            if future is not None and not future.done():
                future.set_result(msg)
        elif type_ == "stats":
            self._set(online=msg["online"], window=msg["window"])
            if msg["credit"] is not None:
                self._set(credit=msg["credit"], credit_at=time.time())
            self.state.evaluation = msg["eval"]  # the hour's evaluation seed (engine/swarm/results.py)
        elif type_ == "scored":
            self.state.scored, self.state.scored_at = msg, time.time()
        elif type_ == "receipted":
            self.state.receipts_counted += msg["counted"]
            self.state.receipts_refused.update(msg["refused"])
        elif type_ == "published":
            self.state.published += 1
            self._unacked.pop(msg["seq"], None)
        elif type_ == "error":
            unacked = self._unacked.pop(msg["id"], None) if msg.get("id") is not None else None
            if unacked is not None and self._refused(msg["id"], unacked, msg["code"], msg["message"]):
                return
            self.state.publish_errors[msg["code"]] += 1
            if msg["code"] == protocol.E_RATE and self._bucket is not None:
                self._bucket.drain()  # the relay's bucket for this peer is empty: start again from there
            log.warning("relay error %s: %s", msg["code"], msg["message"])
            future = self._pending.pop(msg["id"], None) if msg.get("id") is not None else None
            if future is not None and not future.done():
                future.set_result({"batches": [], "cursor": None})
            if msg["code"] in protocol.FATAL_CODES:
                self._fatal_code = msg["code"]
                self._fatal_message = f"{msg['code']}: {msg['message']}"

    # -- what the node calls (any thread) ------------------------------------------------
    def next_seq(self) -> int:
        self._seq = max(self._seq + 1, int(time.time() * 1000))
        return self._seq

    def _refused(self, seq: int, unacked: Unacked, code: str, message: str) -> bool:
        """The relay refused the batch `seq` (in the link's loop): True when that is no news for the node (a batch
        sent again that the relay already had), after arranging a retry when it could not store it."""
        if code == protocol.E_REPLAY and unacked.resent:
            log.info("the relay already had batch %d, sent again after the link came back", seq)
            return True
        if code == protocol.E_INTERNAL and unacked.retries < link.MAX_RETRIES:
            delay = link.RETRY_S * 2 ** unacked.retries
            log.info("the relay could not store batch %d (%s); publishing it again in %g s", seq, message, delay)
            self._loop.call_later(delay, self._start_retry, unacked)
            return True
        return False

    def _start_retry(self, unacked: Unacked) -> None:
        task = asyncio.ensure_future(self._retry(unacked))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _retry(self, unacked: Unacked) -> None:
        """Publish a batch the relay could not store again, under a new sequence number (it was not stored, so
        it cannot be stored twice); on a dead link it waits for the next one's resend like any other."""
        ws = self._ws
        if time.time() - unacked.ts > link.RESEND_WITHIN_S or self._stop.is_set():
            self.state.resend_expired += 1
            return
        batch = protocol.decode_batch(unacked.payload)
        seq = self.next_seq()
        payload = protocol.batch_payload(batch.key, seq, batch.ts, batch.model, list(batch.items))
        text = protocol.encode({**protocol.msg_publish(self.identity.signed(payload)), "id": seq})
        retried = Unacked(payload, text, unacked.ts, False, unacked.retries + 1)
        async with self._ordered():
            self._keep(seq, retried)
            if ws is None or ws is not self._ws or not self.state.connected:
                return  # the next link sends it first thing
            await self._paced()
            with contextlib.suppress(ConnectionError, RuntimeError, aiohttp.ClientError):
                await self._send_text(ws, text)
        self.state.resent += 1

    def _keep(self, seq: int, unacked: Unacked) -> None:
        self._unacked[seq] = unacked
        while len(self._unacked) > link.MAX_UNACKED:
            del self._unacked[min(self._unacked)]

    def publish(self, payload: str) -> bool:
        """Sign and send a batch payload; False when the relay is not connected. Until the relay acknowledges it,
        the batch is kept, and sent again first thing on the next link if this one dies (see the module's doc)."""
        ws = self._ws
        if ws is None or not self.state.connected:
            return False
        fields = json.loads(payload)
        seq, ts = int(fields["seq"]), float(fields["ts"])
        text = protocol.encode({**protocol.msg_publish(self.identity.signed(payload)), "id": seq})  # answers name it

        async def send() -> None:
            async with self._ordered():
                self._keep(seq, Unacked(payload, text, ts))
                await self._paced()
                await self._send_text(ws, text)

        return self._send_now(send(), "publish")

    def _ordered(self) -> asyncio.Lock:
        if self._publish_lock is None:
            self._publish_lock = asyncio.Lock()
        return self._publish_lock

    async def _resend(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """On a new link, before any new publish: the batches the last link took and the relay never acknowledged,
        oldest first, each at most twice in all; too old ones dropped and counted."""
        sent = expired = 0
        async with self._ordered():
            for seq in sorted(self._unacked):
                unacked = self._unacked[seq]
                if unacked.resent or time.time() - unacked.ts > link.RESEND_WITHIN_S:
                    del self._unacked[seq]
                    expired += not unacked.resent
                    continue
                unacked.resent = True
                await self._paced()
                await self._send_text(ws, unacked.text)
                sent += 1
                self.state.resent += 1
        self.state.resend_expired += expired
        if sent or expired:
            log.info("sent %d batches the last link took unanswered again (%d too old to send)", sent, expired)

    def send_receipts(self, payload: str) -> bool:
        """Sign and send a receipts payload (engine/swarm/receipts.py); False when the relay is not connected."""
        return self._send(protocol.msg_receipts(self.identity.signed(payload)), "receipts")

    def send_results(self, payload: str) -> bool:
        """Sign and send evaluation answers (engine/swarm/results.py); the relay's `scored` lands in `state.scored`."""
        return self._send(msg_results(self.identity.signed(payload)), "results")

    def ask_stats(self) -> bool:
        """Ask for a stats message now: it carries this node's credit, kept in `state.credit` when it comes."""
        return self._send(protocol.msg_stats_request(), "stats")

    def _send(self, message: dict[str, Any], what: str) -> bool:
        ws = self._ws
        if ws is None or not self.state.connected:
            return False

        async def send() -> None:
            await self._paced()
            await self._send_text(ws, protocol.encode(message))

        return self._send_now(send(), what)

    async def _send_text(self, ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
        """Send one text frame, counted (as sent) by the daily data meter."""
        await ws.send_str(text)
        self._count(sent=text)

    def _count(self, sent: str = "", received: str = "") -> None:
        if self.meter is not None:
            if sent:
                self.meter.sent(len(sent.encode("utf-8")))
            if received:
                self.meter.received(len(received.encode("utf-8")))

    def _send_now(self, send: Coroutine[Any, Any, None], what: str) -> bool:
        """Run a send in the link's loop and wait for it (link.CONNECT_TIMEOUT_S at most); False when it failed."""
        future = asyncio.run_coroutine_threadsafe(send, self._loop)
        try:
            future.result(timeout=link.CONNECT_TIMEOUT_S)
        except (FutureTimeout, ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            future.cancel()
            self._set(last_error=f"{what} failed: {exc or type(exc).__name__}")
            return False
        return True

    async def _paced(self) -> None:
        """Wait (in the link's loop) until this request fits the relay's rate limit, then spend it."""
        if self._pace_lock is None:
            self._pace_lock = asyncio.Lock()
        async with self._pace_lock:
            bucket = self._bucket
            if bucket is None:
                return
            while (wait := bucket.wait_s()) > 0:
                await asyncio.sleep(wait)
            bucket.take()

    def sample(self, n: int, timeout: float = 10.0) -> list[protocol.Signed]:
        """Up to n batches from other peers published since the last call, unverified; [] when the
        relay is down or slow, or nothing new arrived."""
        ws = self._ws
        if ws is None or not self.state.connected or n <= 0:
            return []
        n = min(n, protocol.MAX_SAMPLE_BATCHES)

        async def ask() -> list[protocol.Signed]:
            request_id = next(self._ids)
            future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
            self._pending[request_id] = future
            try:
                async with asyncio.timeout(timeout):  # the pace and the send too: a dead link's send never ends
                    await self._paced()
                    await self._send_text(ws, protocol.encode(protocol.msg_sample(request_id, n, self._cursor)))
                    answer = await future
            finally:
                self._pending.pop(request_id, None)
            if answer["cursor"] is not None:  # a relay from before cursors sends none: keep ours
                self._cursor = answer["cursor"]
            batches: list[protocol.Signed] = answer["batches"]
            return batches

        future = asyncio.run_coroutine_threadsafe(ask(), self._loop)
        try:
            return future.result(timeout=timeout + 1)
        except (FutureTimeout, TimeoutError):
            future.cancel()
            self._set(last_error=f"no answer to a sample within {timeout:g} s")
            return []
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            self._set(last_error=f"sample failed: {exc or type(exc).__name__}")
            return []
