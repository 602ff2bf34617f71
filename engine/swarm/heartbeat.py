"""The relay link's heartbeat: how the client tells a dead link from a quiet one, with a deadline on every wait.

A silent link. A Wi-Fi blink or a middlebox can keep a dead TCP connection
open for minutes, so every wait has a deadline: after half a `heartbeat` of
quiet the client pings, after a whole one it gives the link up ("no answer
from the relay for 20 s") and reconnects. Silence counts only while the
client's own loop runs: time the process was suspended (a laptop asleep,
SIGSTOP) or starved (a wait overrun by more than `STALL_SLACK_S`) is not the
relay's. Opening a link must end within `CONNECT_TIMEOUT_S`, closing one
within `CLOSE_TIMEOUT_S` (engine/swarm/link.py).

This is its own room because it is the one place that decides when a link is dead: the client
(engine/swarm/client.py) hands `listen` an open websocket and what to do with each text frame and each stall,
and keeps the link's state and its messages' meaning; here are only the clock, the pings and the deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import aiohttp

from engine.swarm import link
from engine.swarm.link import LinkSilent


async def listen(ws: aiohttp.ClientWebSocketResponse, heartbeat: float, on_text: Callable[[str], None],
                 on_stall: Callable[[float], None]) -> None:
    """Hand the relay's text frames to `on_text` until the link ends; LinkSilent when it falls silent.

    Every frame is a sign of life: the relay's stats come every few seconds, and its pings. After half a
    heartbeat of quiet the relay gets a ping; after a whole one of silence the link is dead. (aiohttp's
    own heartbeat would end the link as an anonymous close, code 1006, and no later than 1.5 heartbeats.)
    Quiet is counted in short steps, each at most its length plus link.STALL_SLACK_S: a step that took longer
    is this process not running (`on_stall` gets the seconds it did not run), and a frame that waited in the
    socket meanwhile is read, not missed."""
    loop = asyncio.get_running_loop()
    step = max(0.05, min(1.0, heartbeat / 8))
    slack = min(link.STALL_SLACK_S, step)  # a short heartbeat (tests) has a short slack
    receiving: asyncio.Task[aiohttp.WSMessage] = asyncio.ensure_future(ws.receive())
    quiet, pinged = 0.0, False
    try:
        while True:
            limit = heartbeat if pinged else heartbeat / 2
            wait = min(step, max(0.0, limit - quiet))
            began = loop.time()
            done, _ = await asyncio.wait({receiving}, timeout=wait)
            took = loop.time() - began
            counted = min(took, wait + slack)
            on_stall(took - counted)
            if not done:
                quiet += counted
                if quiet < limit:
                    continue
                if pinged:
                    raise LinkSilent(quiet)
                pinged = True
                await send_control(ws.ping(), loop.time() + heartbeat - quiet)
                continue
            msg = receiving.result()
            quiet, pinged = 0.0, False
            if msg.type == aiohttp.WSMsgType.PING:
                await send_control(ws.pong(msg.data), loop.time() + heartbeat)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                on_text(msg.data)
            elif msg.type != aiohttp.WSMsgType.PONG:
                return
            receiving = asyncio.ensure_future(ws.receive())
    finally:
        if not receiving.done():
            receiving.cancel()
        await asyncio.gather(receiving, return_exceptions=True)


async def send_control(send: Awaitable[None], deadline: float) -> None:
    """Send a ping or pong, giving up at `deadline`: a dead link's full buffer would hold the write forever,
    and a frame that cannot go out shows up as silence."""
    with contextlib.suppress(TimeoutError, ConnectionError, aiohttp.ClientError):
        async with asyncio.timeout_at(deadline):
            await send


async def close_socket(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Close the websocket within link.CLOSE_TIMEOUT_S: on a dead link the closing handshake never ends, and an
    abandoned close drops the connection."""
    with contextlib.suppress(TimeoutError, ConnectionError, aiohttp.ClientError):
        async with asyncio.timeout(link.CLOSE_TIMEOUT_S):
            await ws.close()
