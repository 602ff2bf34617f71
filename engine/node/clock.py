"""When the node works: the requests that pause, stop or reload it, and the clock's rules.

The round loop (engine/node/loop.py) reads both at every step and round boundary.

- `Control` carries requests into a running node from other threads: pause,
  resume, stop, reload and unban, from `sapling-node serve` (commands on
  stdin), Ctrl-C and the experiment runner. Its `wake` event ends the clock's
  waits below early, so a stop or a reload during a schedule's wait is
  answered at once. `RoundAborted` is how a stop leaves a round half done.
- `Schedule` (engine/common/schedule.py, which the app reads too) says
  whether now is within ``run.schedule``'s hours and when they next begin.
- `DutyCycle` keeps training to at most a share of the time (run.power =
  "low" trains half of each minute): after each step it owes rest in
  proportion to the time the step took, and rests once that debt reaches a
  second, so over any minute the share holds to within one step.
- `Pacing` is what the node loop holds: both rules and the clock they read.
  Its waits are `Event.wait` with a timeout (the stop/reload event), never a
  busy loop: a node outside its hours uses no CPU.

A volunteer says when and how hard the computer works, as BOINC lets them;
the clock is injectable (`Clock`: local wall time and a monotonic counter),
so tests move time by hand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from engine.common.schedule import Schedule, waiting_message

MIN_REST = 1.0  # seconds: rest owed below this is carried to the next step
RECHECK = 300.0  # seconds: the longest wait between looks at the clock (it may jump: suspend, a time zone)


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
        self.wake = threading.Event()  # set by stop and reload: ends the clock's waits (engine/node/clock.py)
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


@dataclass(frozen=True)
class Clock:
    """Local wall time (for the schedule) and a monotonic counter (for the duty cycle)."""

    now: Callable[[], datetime] = datetime.now
    monotonic: Callable[[], float] = time.monotonic


class DutyCycle:
    """At most `share` of the time busy: rest (share⁻¹ - 1) seconds for each busy second."""

    def __init__(self, share: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"duty cycle share must be in (0, 1], got {share}")
        self.share = share
        self.monotonic = monotonic
        self.mark: float | None = None  # when the current busy stretch began
        self.owed = 0.0

    def begin(self) -> None:
        """Training (re)starts now: time before this (waits, pauses) is not counted as busy."""
        self.mark = self.monotonic()

    def rest_due(self) -> float:
        """Seconds to rest now (0: carry on); counts the busy time since the last call."""
        now = self.monotonic()
        if self.share >= 1.0:
            self.mark = now
            return 0.0
        if self.mark is not None:
            self.owed += (now - self.mark) * (1.0 / self.share - 1.0)
        self.mark = now
        if self.owed < MIN_REST:
            return 0.0
        due, self.owed = self.owed, 0.0
        self.mark = now + due  # the rest is not training time
        return due


class Pacing:
    """The node loop's clock rules: the schedule (between rounds) and the duty cycle (between steps)."""

    def __init__(self, schedule: str, duty_cycle: float, clock: Clock | None = None,
                 recheck: float = RECHECK) -> None:
        self.clock = clock or Clock()
        self.schedule = Schedule.parse(schedule)
        self.duty = DutyCycle(duty_cycle, self.clock.monotonic)
        self.recheck = recheck
        self.rested = 0.0  # seconds rested by the duty cycle, for tests and the log

    def reconfigure(self, schedule: str, duty_cycle: float) -> None:
        self.schedule = Schedule.parse(schedule)
        self.duty = DutyCycle(duty_cycle, self.clock.monotonic)

    def waiting_for(self) -> datetime | None:
        """The next start when outside the schedule now, else None."""
        now = self.clock.now()
        start = self.schedule.next_start(now)
        return None if start == now else start

    def wait_for_hours(self, wake: threading.Event, on_wait: Callable[[datetime, str], None]) -> bool:
        """Sleep on `wake` until the schedule's hours begin; False when woken (stop or reload) first.

        `on_wait(next_start, message)` is called once as the wait begins.
        """
        start = self.waiting_for()
        if start is None:
            return True
        on_wait(start, waiting_message(start, self.clock.now()))
        while start is not None:
            seconds = (start - self.clock.now()).total_seconds()
            if wake.wait(min(self.recheck, max(seconds, 0.05))):
                return False
            start = self.waiting_for()
        self.duty.begin()
        return True

    def between_steps(self, wake: threading.Event) -> None:
        """Rest what the duty cycle asks (woken early by `wake`)."""
        due = self.duty.rest_due()
        if due > 0:
            wake.wait(due)
            self.rested += due
            self.duty.begin()

