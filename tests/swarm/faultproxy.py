"""A fault-injecting TCP proxy for the link tests (issue 38): delay, a bandwidth cap and resets.

    proxy = FaultProxy(relay_port, delay_s=0.3, rate=64_000, reset_every_s=12.0)
    url = f"ws://127.0.0.1:{proxy.port}/ws"      # a client through a slow, lossy link
    ...; proxy.close(); proxy.resets, proxy.resets_mid_transfer, proxy.max_buffered

It listens on a free loopback port, in a thread with its own event loop, and
forwards every accepted connection to 127.0.0.1:`target`. Each direction
delivers each chunk `delay_s` after it was read (in order) and no faster than
`rate` bytes a second. Its buffers are bounded (QUEUE_CHUNKS chunks of at most
CHUNK bytes a direction): when one is full the proxy stops reading, so a fast
sender meets TCP's own back-pressure, as behind a real slow link, and the
proxy's memory stays bounded. Every `reset_every_s` seconds it resets every
connection (RST on both sides: SO_LINGER 0, then abort); with `mid_transfer`
it waits for the first moment after that when bytes from a client are on
their way (a frame half through the link), so the reset cuts a message in two.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

CHUNK = 4096
QUEUE_CHUNKS = 64


@dataclass
class Pipe:
    """One direction of one connection: what was read and waits to be written."""

    queue: asyncio.Queue[tuple[float, bytes]] = field(default_factory=lambda: asyncio.Queue(QUEUE_CHUNKS))
    buffered: int = 0  # bytes read and not yet written


@dataclass(eq=False)
class Link:
    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]
    upstream: Pipe  # client -> target
    downstream: Pipe
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    def __init__(self, target: int, *, delay_s: float = 0.0, rate: float = 0.0, reset_every_s: float = 0.0,
                 mid_transfer: bool = True) -> None:
        self.target = target
        self.delay_s = delay_s
        self.rate = rate  # bytes a second each way; 0: no cap
        self.reset_every_s = reset_every_s
        self.mid_transfer = mid_transfer
        self.links: set[Link] = set()
        self.connections = 0
        self.resets = 0  # connections reset
        self.resets_mid_transfer = 0  # of them, with a client's bytes on their way
        self.max_buffered = 0  # the most bytes the proxy held at once, all connections together
        self.bytes_up = self.bytes_down = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        if self.reset_every_s > 0:
            self._resetter: asyncio.Task[None] | None = asyncio.create_task(self._reset_forever())
        return int(self._server.sockets[0].getsockname()[1])

    def _held(self) -> int:
        return sum(link.upstream.buffered + link.downstream.buffered for link in self.links)

    async def _read(self, reader: asyncio.StreamReader, pipe: Pipe, up: bool) -> None:
        while data := await reader.read(CHUNK):
            await pipe.queue.put((time.monotonic() + self.delay_s, data))  # waits while the pipe is full
            pipe.buffered += len(data)
            self.max_buffered = max(self.max_buffered, self._held())
            if up:
                self.bytes_up += len(data)
            else:
                self.bytes_down += len(data)
        await pipe.queue.put((time.monotonic() + self.delay_s, b""))  # the end, after what is queued

    async def _write(self, writer: asyncio.StreamWriter, pipe: Pipe) -> None:
        free_at = time.monotonic()  # when the capped link can take the next byte
        while True:
            due, data = await pipe.queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            if self.rate > 0:
                free_at = max(free_at, time.monotonic()) + len(data) / self.rate
                await asyncio.sleep(max(0.0, free_at - time.monotonic()))
            writer.write(data)
            await writer.drain()
            pipe.buffered -= len(data)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            self._rst(writer)
            return
        self.connections += 1
        link = Link((writer, far_writer), Pipe(), Pipe())
        self.links.add(link)
        link.tasks = [asyncio.create_task(self._read(reader, link.upstream, True)),
                      asyncio.create_task(self._write(far_writer, link.upstream)),
                      asyncio.create_task(self._read(far_reader, link.downstream, False)),
                      asyncio.create_task(self._write(writer, link.downstream))]
        try:
            await asyncio.gather(*link.tasks)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            for task in link.tasks:
                task.cancel()
            self.links.discard(link)
            for w in link.writers:
                w.close()

    @staticmethod
    def _rst(writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def _reset_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reset_every_s)
            deadline = time.monotonic() + self.reset_every_s
            while self.mid_transfer and time.monotonic() < deadline and not any(
                    link.upstream.buffered for link in self.links):
                await asyncio.sleep(0.005)
            for link in list(self.links):
                self.resets += 1
                self.resets_mid_transfer += link.upstream.buffered > 0
                for w in link.writers:
                    self._rst(w)
                for task in link.tasks:
                    task.cancel()

    async def _stop(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
