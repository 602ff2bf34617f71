"""The hours of `run.schedule`: when a node may train, and when it next may.

``run.schedule`` reads ``"22:00-07:00"`` (every day), ``"weekdays 22:00-07:00"``
or ``"weekends 09:00-18:00"``, in local time; empty means at any hour. A
window whose end is before its start runs past midnight and belongs to the
day it starts on (``"weekdays 22:00-07:00"`` trains Friday night into
Saturday morning, not Sunday night). The engine waits outside the hours
(engine/node/clock.py); the app shows when training next starts.

    python -m engine.common.schedule "weekdays 22:00-07:00"    # when that schedule next starts
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.common.errors import ConfigError

DAYS = {"daily": frozenset(range(7)), "weekdays": frozenset(range(5)), "weekends": frozenset({5, 6})}


def _minutes(text: str, schedule: str) -> int:
    hours, _, minutes = text.partition(":")
    if not (hours.isdigit() and minutes.isdigit() and len(minutes) == 2 and 1 <= len(hours) <= 2):
        raise ConfigError(f"run.schedule {schedule!r}: {text!r} is not a time such as 22:00.")
    h, m = int(hours), int(minutes)
    if h > 24 or m > 59 or (h == 24 and m):
        raise ConfigError(f"run.schedule {schedule!r}: {text!r} is not a time of day (00:00 to 24:00).")
    return h * 60 + m


@dataclass(frozen=True)
class Schedule:
    """Hours when training may run: `start`-`end` minutes after midnight on `days` (0 = Monday)."""

    start: int = 0
    end: int = 0
    days: frozenset[int] = DAYS["daily"]
    always: bool = True

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """``""`` (always), ``"22:00-07:00"``, ``"weekdays 22:00-07:00"`` or ``"weekends ..."``."""
        if not isinstance(text, str):
            raise ConfigError(f"run.schedule must be text such as \"22:00-07:00\", got {text!r}.")
        words = text.split()
        if not words:
            return cls()
        days = DAYS["daily"]
        if len(words) == 2 and words[0].lower() in DAYS:
            days = DAYS[words.pop(0).lower()]
        if len(words) != 1 or words[0].count("-") != 1:
            raise ConfigError(f"run.schedule {text!r} must read like \"22:00-07:00\" or \"weekdays 22:00-07:00\" "
                              "(empty: always).")
        first, last = words[0].split("-")
        start, end = _minutes(first, text), _minutes(last, text)
        if start == end:
            raise ConfigError(f"run.schedule {text!r} starts and ends at the same time; leave it empty to train "
                              "at any hour.")
        return cls(start, end % (24 * 60), days, always=False)

    def _window_of(self, day: datetime) -> tuple[datetime, datetime]:
        """The window that starts on `day`'s date."""
        midnight = day.replace(hour=0, minute=0, second=0, microsecond=0)
        begin = midnight + timedelta(minutes=self.start)
        finish = midnight + timedelta(minutes=self.end)
        if self.end <= self.start:
            finish += timedelta(days=1)
        return begin, finish

    def contains(self, now: datetime) -> bool:
        if self.always:
            return True
        for back in (0, 1):  # a window that started yesterday may run past midnight
            day = now - timedelta(days=back)
            if day.weekday() in self.days:
                begin, finish = self._window_of(day)
                if begin <= now < finish:
                    return True
        return False

    def next_start(self, now: datetime) -> datetime:
        """`now` when inside the hours, else the start of the next window."""
        if self.contains(now):
            return now
        for ahead in range(8):
            day = now + timedelta(days=ahead)
            if day.weekday() in self.days:
                begin, _ = self._window_of(day)
                if begin > now:
                    return begin
        raise RuntimeError("a schedule with days always starts within a week")  # unreachable: days is never empty

    def describe(self) -> str:
        if self.always:
            return "at any hour"
        days = next(name for name, value in DAYS.items() if value == self.days)
        hours = f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"
        return hours if days == "daily" else f"{days} {hours}"


def waiting_message(start: datetime, now: datetime) -> str:
    """'Waiting for 22:00 (schedule).', with the weekday when it is not within the next day."""
    when = start.strftime("%H:%M")
    if start - now >= timedelta(hours=24) or (start.date() != now.date() and start - now > timedelta(hours=12)):
        when = start.strftime("%A %H:%M")
    return f"Waiting for {when} (schedule)."


if __name__ == "__main__":
    try:
        rule = Schedule.parse(" ".join(sys.argv[1:]))
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    moment = datetime.now()
    print(f"{rule.describe()}: " + ("inside the hours now" if rule.contains(moment)
                                    else waiting_message(rule.next_start(moment), moment)))
