"""Requests into a running node from other threads: pause, resume, stop, reload, unban.

`Control` is what `sapling-node serve` (commands on stdin), Ctrl-C and the
experiment runner hold; the node loop (engine/sapo.py) reads it at every step
and round boundary. Its `wake` event ends the waits of the clock rules
(engine/clock.py) early, so a stop or a reload during a schedule's wait is
answered at once. `RoundAborted` is how a stop leaves a round half done.
"""

from __future__ import annotations

import threading


class RoundAborted(Exception):
    """A stop request arrived before the round's checkpoint: the round is abandoned.

    The newest checkpoint holds the run; weights changed in memory by a step
    that was cut short are never saved, and a resumed run redoes the round
    from the checkpoint with the same questions and sampling seeds.
    """


class Control:
    """Pause/resume/stop/reload requests from another thread (serve mode, Ctrl-C)."""

    def __init__(self) -> None:
        self._running = threading.Event()
        self._running.set()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self.wake = threading.Event()  # set by stop and reload: ends the clock's waits (engine/clock.py)
        self._unbans: list[str] = []
        self._unbans_lock = threading.Lock()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        self.wake.set()

    def request_reload(self) -> None:
        self._reload.set()
        self.wake.set()

    @property
    def stop_event(self) -> threading.Event:
        """Set once a stop is requested: the duty cycle's rests wait on it."""
        return self._stop

    def request_unban(self, peer: str) -> None:
        """Lift a local ban on `peer` before the next swarm sample (serve's `unban` command)."""
        with self._unbans_lock:
            self._unbans.append(peer)

    def take_unbans(self) -> list[str]:
        with self._unbans_lock:
            taken, self._unbans = self._unbans, []
        return taken

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def take_reload(self) -> bool:
        if self._reload.is_set():
            self._reload.clear()
            if not self._stop.is_set():
                self.wake.clear()
            return True
        return False

    def wait_while_paused(self) -> None:
        self._running.wait()
