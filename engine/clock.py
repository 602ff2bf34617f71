"""Train by the clock: the hours of `run.schedule` and the duty cycle of `run.duty_cycle`.

A volunteer says when and how hard the computer works, as BOINC lets them:

- `Schedule` (engine/common/schedule.py, which the app reads too) says
  whether now is within ``run.schedule``'s hours and when they next begin.
- `DutyCycle` keeps training to at most a share of the time (run.power =
  "low" trains half of each minute): after each step it owes rest in
  proportion to the time the step took, and rests once that debt reaches a
  second, so over any minute the share holds to within one step.
- `Pacing` is what the node loop holds: both rules and the clock they read.
  Its waits are `Event.wait` with a timeout (the caller's stop/reload event),
  never a busy loop: a node outside its hours uses no CPU.

The clock is injectable (`Clock`: local wall time and a monotonic counter), so
tests move time by hand.
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

