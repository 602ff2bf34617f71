"""The node's side of the relay link, on a background thread with its own event loop.

The training loop is synchronous; it calls `publish` after each round and
`sample` before training. Both return promptly: when the relay is down,
`publish` drops the batch and `sample` returns nothing, so the node trains
solo and says so. The connection is kept up in the background, reconnecting
with exponential backoff and full jitter, and resumes by itself. Sequence
numbers are at least the current time in milliseconds, so they keep rising
across reconnects and restarts without being stored. Each publish carries
its sequence number as its `id`, so the relay's answer names the batch: a
`published` acknowledges it; an `internal` error (the relay could not reach
its store, "try again shortly") means it was not stored, and the batch is
published again a moment later, under a new sequence number, up to
MAX_RETRIES times; any other refusal is final. A batch still unanswered when
the link dies is sent again, once, first thing on the next link, with its own
sequence number: the relay stores it if it never arrived and refuses it as a
replay if it did. So nothing sent into a dead link or refused for a missing
store is lost, and nothing is stored twice. One older than the timestamp
window allows (`RESEND_WITHIN_S`) is dropped instead, and counted.

A link can die without a word: a Wi-Fi blink or a middlebox that forwards
nothing keeps the TCP connection open for many minutes, and a connection
attempt across it may be accepted and never answered. So every wait has a
deadline. The link counts as alive while frames come from the relay (its
stats every 5 s, its pings, the pongs to ours): after half a `heartbeat` of
quiet the client pings, and after a whole one of silence it gives the link
up ("no answer from the relay for 20 s"), marks itself disconnected and
reconnects. Silence is counted only while the client's own event loop runs:
time the process was suspended (a laptop asleep, SIGSTOP) or starved of CPU
(a wait that overran by more than `STALL_SLACK_S`) is not the relay's
silence, so a node that wakes up reads what the relay sent meanwhile (often
its `heartbeat_timeout` and close, and then it reconnects) instead of
declaring the link dead for the time it did not run. Opening a link (TCP,
TLS, the websocket upgrade, the relay's challenge and welcome) must end
within `CONNECT_TIMEOUT_S`, and closing one within `CLOSE_TIMEOUT_S`. The log says once when the link is lost and once
when it is back, with how long it was down.

`sample` keeps the relay's sampling cursor between calls, so each call draws
only from batches published since the previous one (docs/protocol.md,
"Sampling cursors"): a node is not handed what it already has.

A swarm may have several relays (an invite lists them; they share one Redis).
The client tries them in order of last success (`RelayMemory`, a small JSON
file in the data dir, written atomically), moves on to the next one when a
connection fails or drops, with the same backoff, and keeps its sampling
cursor across the move, since relays on one Redis read each other's cursors.

    client = SwarmClient(["wss://a.example/ws", "wss://b.example/ws"], identity,
                         memory=RelayMemory(data_dir / "swarm" / "relays.json"))
    client.start(); client.wait_connected(3.0); client.state.url   # the relay in use

At some 720 lines this module is over the 600-line mark on purpose: the link,
its watch and its delivery (acknowledgements, resends, retries) are one state
machine on one socket and one event loop, and split apart they would hand
that state back and forth.
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
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from engine import __version__
from engine.common.atomicio import atomic_write_json
from engine.swarm import protocol
from engine.swarm.identity import Identity
from engine.swarm.rate import TokenBucket

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_CAP_S = 30.0
CONNECT_TIMEOUT_S = 10.0  # opening a link, from the TCP connect to the welcome; also one publish's send
CLOSE_TIMEOUT_S = 2.0  # the closing handshake; on a dead link it never ends, and giving up drops the connection
# The client paces its requests below the relay's announced rate limit, with half its burst,
# so that a fast node (tiny rounds, a big GPU) waits a moment instead of being refused.
PACE_SHARE = 0.9
SOFTWARE = f"sapling/{__version__}"
# A wait for the relay that overran by more than this was this process not running (suspended, or starved of CPU):
# the overrun does not count as the relay's silence.
STALL_SLACK_S = 1.0
# Unacknowledged batches kept to send again on the next link, and how old one may be to be sent again (the relay
# refuses a timestamp more than protocol.TIMESTAMP_WINDOW_S from its clock; a minute's margin for clock skew).
MAX_UNACKED = 16
RESEND_WITHIN_S = protocol.TIMESTAMP_WINDOW_S - 60.0
MAX_RETRIES = 8  # publishes again of a batch the relay could not store (`internal`), RETRY_S apart and more
RETRY_S = 1.0
# How a link fails, expectedly: anything else is a bug, logged with its traceback (and the link retried all the same).
LINK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, protocol.ProtocolError, ConnectionError)


@dataclass
class LinkState:
    """What the node shows about its relay link."""

    connected: bool = False
    online: int = 0
    window: int = 0
    last_error: str = ""
    relay: str = ""  # the name the relay gave in its challenge
    url: str = ""  # the relay address in use (or being tried)
    since: float = field(default_factory=time.time)  # when `connected` last changed
    # when the link was last lost (None: not this run); once back, since - lost_at is the outage
    lost_at: float | None = None
    published: int = 0
    publish_errors: Counter[str] = field(default_factory=Counter)
    models: Any = None  # the welcome's `models`: the swarm's model policy (engine/common/model_policy.py reads it)
    credit: dict[str, Any] | None = None  # this node's credit as the relay last sent it (engine/relay/credit.py)
    credit_at: float = 0.0  # when it came
    receipts_counted: int = 0  # receipt items the relay counted, and those it refused, by why
    receipts_refused: Counter[str] = field(default_factory=Counter)
    resent: int = 0  # batches sent again on a new link because the old one died before the relay acknowledged them
    resend_expired: int = 0  # unacknowledged batches too old to send again when the link came back
    stalled_s: float = 0.0  # seconds the link's event loop did not run (suspended or starved), not counted as silence


class RelayMemory:
    """When each relay of a swarm last let this node in: a JSON file in the data dir, written atomically.

    `order(urls)` puts the relays that worked first, the most recent first, and
    the others after them in the order given. A missing or unreadable file is
    an empty memory (it is only a preference)."""

    MAX_RELAYS = 64

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.last_good: dict[str, float] = {}
        if path is not None:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                relays = data.get("relays", {}) if isinstance(data, dict) else {}
                self.last_good = {str(k): float(v) for k, v in relays.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
            except (OSError, ValueError, AttributeError):
                self.last_good = {}

    def order(self, urls: Sequence[str]) -> list[str]:
        position = {url: i for i, url in enumerate(urls)}
        return sorted(dict.fromkeys(urls), key=lambda u: (-self.last_good.get(u, float("-inf")), position[u]))

    def remember(self, url: str) -> None:
        self.last_good[url] = time.time()
        newest = sorted(self.last_good.items(), key=lambda kv: -kv[1])[: self.MAX_RELAYS]
        self.last_good = dict(newest)
        if self.path is not None:
            try:
                atomic_write_json(self.path, {"v": 1, "relays": self.last_good})
            except OSError as exc:  # a preference only: the link works without it
                log.warning("could not remember the relay in %s: %s", self.path, exc)


@dataclass
class Unacked:
    """A batch sent and not yet answered: its payload, the publish message as sent, and what was tried."""

    payload: str
    text: str
    ts: float
    resent: bool = False  # sent again on a new link already
    retries: int = 0  # published again after the relay could not store it


class LinkSilent(ConnectionError):
    """The relay sent nothing for a whole heartbeat: the link is dead, whatever TCP says."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer from the relay for {seconds:.0f} s")
        self.seconds = seconds  # the link has been dead this long already


def duration_text(seconds: float) -> str:
    """A length of time in words for the log and the swarm line: '45 s', '5 min 12 s', '2 h 3 min'."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


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
                    if not isinstance(exc, LINK_ERRORS):
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
                        await self._close(ws)
                if self._stop.is_set():
                    break
                delay = self._rng.uniform(0, min(BACKOFF_CAP_S, BACKOFF_START_S * 2**attempt))
                if self._fatal_code in (protocol.E_BANNED, protocol.E_FORBIDDEN):
                    delay = max(delay, BACKOFF_CAP_S)  # refused on purpose: retry rarely
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
            if time.monotonic() - ended < max(self.heartbeat / 2, 2 * STALL_SLACK_S):  # it went with a long stall
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
        """Connect and pass the relay's handshake within CONNECT_TIMEOUT_S: (the websocket, challenge, welcome).

        Without this deadline an attempt across a link that accepts and forwards nothing waits out aiohttp's
        five minutes, and the node stays cut off that long after the link is back."""
        ws: aiohttp.ClientWebSocketResponse | None = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                ws = await session.ws_connect(
                    self.url, max_msg_size=protocol.MAX_RESPONSE_BYTES, autoping=False,
                    timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT_S),
                )
                challenge = protocol.decode_relay(await self._text(ws, "relay closed before its challenge"))
                if challenge["type"] != "challenge":
                    raise protocol.ProtocolError(protocol.E_AUTH, f"expected a challenge, got {challenge['type']}")
                payload = protocol.hello_payload(self.identity.public_key, challenge["nonce"], time.time(), self.token,
                                                 SOFTWARE)
                await ws.send_str(protocol.encode(protocol.msg_hello(self.identity.signed(payload))))
                welcome = protocol.decode_relay(await self._text(ws, "relay closed before its welcome"))
                if welcome["type"] == "error":
                    self._fatal_code = welcome["code"]
                    raise ConnectionError(f"relay refused the handshake: {welcome['code']}: {welcome['message']}")
                if welcome["type"] != "welcome":
                    raise protocol.ProtocolError(protocol.E_AUTH, f"expected a welcome, got {welcome['type']}")
                return ws, challenge, welcome
        except BaseException as exc:
            if ws is not None:
                await self._close(ws)
            if isinstance(exc, TimeoutError):
                raise ConnectionError(f"no answer from the relay within {CONNECT_TIMEOUT_S:g} s of connecting") from exc
            raise

    @staticmethod
    async def _text(ws: aiohttp.ClientWebSocketResponse, closed: str) -> str:
        """The next text frame of the handshake, answering pings on the way; ConnectionError(`closed`) when none
        comes."""
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.PING:
                await ws.pong(msg.data)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                return str(msg.data)
            elif msg.type != aiohttp.WSMsgType.PONG:
                raise ConnectionError(closed)

    async def _listen(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Hand the relay's messages to `_dispatch` until the link ends; LinkSilent when it falls silent.

        Every frame is a sign of life: the relay's stats come every few seconds, and its pings. After half a
        heartbeat of quiet the relay gets a ping; after a whole one of silence the link is dead. (aiohttp's
        own heartbeat would end the link as an anonymous close, code 1006, and no later than 1.5 heartbeats.)
        Quiet is counted in short steps, each at most its length plus STALL_SLACK_S: a step that took longer
        is this process not running, and a frame that waited in the socket meanwhile is read, not missed."""
        loop = asyncio.get_running_loop()
        step = max(0.05, min(1.0, self.heartbeat / 8))
        slack = min(STALL_SLACK_S, step)  # a short heartbeat (tests) has a short slack
        receiving: asyncio.Task[aiohttp.WSMessage] = asyncio.ensure_future(ws.receive())
        quiet, pinged = 0.0, False
        try:
            while True:
                limit = self.heartbeat if pinged else self.heartbeat / 2
                wait = min(step, max(0.0, limit - quiet))
                began = loop.time()
                done, _ = await asyncio.wait({receiving}, timeout=wait)
                took = loop.time() - began
                counted = min(took, wait + slack)
                self._stalled(took - counted)
                if not done:
                    quiet += counted
                    if quiet < limit:
                        continue
                    if pinged:
                        raise LinkSilent(quiet)
                    pinged = True
                    await self._control(ws.ping(), loop.time() + self.heartbeat - quiet)
                    continue
                msg = receiving.result()
                quiet, pinged = 0.0, False
                if msg.type == aiohttp.WSMsgType.PING:
                    await self._control(ws.pong(msg.data), loop.time() + self.heartbeat)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        self._dispatch(protocol.decode_relay(msg.data))
                    except protocol.ProtocolError as exc:
                        log.warning("ignored a bad message from the relay: %s", exc)
                elif msg.type != aiohttp.WSMsgType.PONG:
                    return
                receiving = asyncio.ensure_future(ws.receive())
        finally:
            if not receiving.done():
                receiving.cancel()
            await asyncio.gather(receiving, return_exceptions=True)

    def _stalled(self, seconds: float) -> None:
        """This process did not run for `seconds` while waiting for the relay: not the relay's silence."""
        if seconds <= 0:
            return
        self.state.stalled_s += seconds
        if seconds >= self.heartbeat / 4:
            self._stall = (time.monotonic(), seconds)
            log.info("this process did not run for %s (asleep, stopped or starved of CPU); not counted as the "
                     "relay's silence", duration_text(seconds))

    @staticmethod
    async def _control(send: Awaitable[None], deadline: float) -> None:
        """Send a ping or pong, giving up at `deadline`: a dead link's full buffer would hold the write forever,
        and a frame that cannot go out shows up as silence."""
        with contextlib.suppress(TimeoutError, ConnectionError, aiohttp.ClientError):
            async with asyncio.timeout_at(deadline):
                await send

    @staticmethod
    async def _close(ws: aiohttp.ClientWebSocketResponse) -> None:
        """Close the websocket within CLOSE_TIMEOUT_S: on a dead link the closing handshake never ends, and an
        abandoned close drops the connection."""
        with contextlib.suppress(TimeoutError, ConnectionError, aiohttp.ClientError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await ws.close()

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
        if code == protocol.E_INTERNAL and unacked.retries < MAX_RETRIES:
            delay = RETRY_S * 2 ** unacked.retries
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
        if time.time() - unacked.ts > RESEND_WITHIN_S or self._stop.is_set():
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
                await ws.send_str(text)
        self.state.resent += 1

    def _keep(self, seq: int, unacked: Unacked) -> None:
        self._unacked[seq] = unacked
        while len(self._unacked) > MAX_UNACKED:
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
                await ws.send_str(text)

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
                if unacked.resent or time.time() - unacked.ts > RESEND_WITHIN_S:
                    del self._unacked[seq]
                    expired += not unacked.resent
                    continue
                unacked.resent = True
                await self._paced()
                await ws.send_str(unacked.text)
                sent += 1
                self.state.resent += 1
        self.state.resend_expired += expired
        if sent or expired:
            log.info("sent %d batches the last link took unanswered again (%d too old to send)", sent, expired)

    def send_receipts(self, payload: str) -> bool:
        """Sign and send a receipts payload (engine/swarm/receipts.py); False when the relay is not connected."""
        return self._send(protocol.msg_receipts(self.identity.signed(payload)), "receipts")

    def ask_stats(self) -> bool:
        """Ask for a stats message now: it carries this node's credit, kept in `state.credit` when it comes."""
        return self._send(protocol.msg_stats_request(), "stats")

    def _send(self, message: dict[str, Any], what: str) -> bool:
        ws = self._ws
        if ws is None or not self.state.connected:
            return False

        async def send() -> None:
            await self._paced()
            await ws.send_str(protocol.encode(message))

        return self._send_now(send(), what)

    def _send_now(self, send: Coroutine[Any, Any, None], what: str) -> bool:
        """Run a send in the link's loop and wait for it (CONNECT_TIMEOUT_S at most); False when it failed."""
        future = asyncio.run_coroutine_threadsafe(send, self._loop)
        try:
            future.result(timeout=CONNECT_TIMEOUT_S)
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
                    await ws.send_str(protocol.encode(protocol.msg_sample(request_id, n, self._cursor)))
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


def pace(limits: Any) -> TokenBucket:
    """The client's own bucket for a relay's announced limits: a little slower than `rate_per_s`,
    half the `burst`, and empty at first (a relay keeps a peer's bucket across its reconnects)."""
    def positive(key: str, default: float) -> float:
        value = limits.get(key) if isinstance(limits, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
            return float(value)
        return default

    bucket = TokenBucket(PACE_SHARE * positive("rate_per_s", protocol.DEFAULT_RATE_PER_S),
                                  max(1.0, positive("burst", protocol.DEFAULT_BURST) / 2))
    bucket.tokens = 0.0
    return bucket
