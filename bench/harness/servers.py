"""Loopback servers for the tests and the benches: free ports, waiting for a listener, redis-server.

    from bench.harness.servers import RedisServer, free_port, wait_listening

`free_port` is a TCP port on 127.0.0.1 that nothing listens on (also what a
test uses as a closed port); `wait_listening` waits until a child process
accepts connections on its port; a `RedisServer` is a redis-server on a free
loopback port without persistence (as the deployment kit runs it) that can be
stopped and started again on that port. The `redis_server` fixture in
tests/conftest.py starts one for a test. The benches (bench/relay_peers.py,
bench/relay_scaleout.py, bench/relay_faults.py) use them too; everything here
is blocking, so async code calls it through `asyncio.to_thread`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

LOG_TAIL_CHARS = 2000  # of a child's log, in the error when it did not start


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and closed again, so nothing listens on it until someone does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[Any], what: str, log: Path | None = None,
                   timeout: float = 30.0) -> None:
    """Return once 127.0.0.1:`port` accepts a connection; RuntimeError "`what` did not start" (with the last
    2000 characters of `log`, when given) if `proc` exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = ""
                if log is not None:
                    text = log.read_text(errors="replace") if log.exists() else "(no log written)"
                    tail = f": {text[-LOG_TAIL_CHARS:]}"
                raise RuntimeError(f"{what} did not start{tail}") from None
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[Any], grace: float = 20.0) -> None:
    """End a child that may still run: SIGTERM, then SIGKILL after `grace` seconds; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class RedisServer:
    """redis-server on one free loopback port, without persistence; it can be stopped and started there again.

    Its output goes to `log` (appended to across restarts) or nowhere. `cpu_s()` counts the CPU seconds of
    every instance started so far, the ones already stopped included (psutil; the relay benches use it).
    """

    def __init__(self, binary: str | None = None, log: Path | None = None) -> None:
        self.binary = binary or shutil.which("redis-server") or "redis-server"
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_before = 0.0  # CPU seconds of the instances that already ended

    def start(self, timeout: float = 20.0) -> None:
        """Start it on its port and wait until it listens (blocking)."""
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.log is None:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            with self.log.open("ab") as out:
                self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        wait_listening(self.port, self.proc, "redis-server", self.log, timeout)

    def cpu_s(self) -> float:
        import psutil

        proc = self.proc
        if proc is None or proc.poll() is not None:
            return self.cpu_before
        try:
            times = psutil.Process(proc.pid).cpu_times()
        except psutil.NoSuchProcess:
            return self.cpu_before
        return self.cpu_before + float(times.user + times.system)

    def stop(self) -> None:
        """Stop it if it runs (SIGTERM; SIGKILL after 20 s); start() brings it back on the same port, empty."""
        if self.proc is not None and self.proc.poll() is None:
            self.cpu_before = self.cpu_s()
            stop_process(self.proc)
