"""Today's swarm traffic and its daily caps: `swarm.daily_upload_mb` and `swarm.daily_download_mb`.

`DataMeter` counts the bytes of every websocket text frame the swarm client
sends to its relay and receives from it (engine/swarm/client.py calls `sent`
and `received`), per local day: the counts start again at local midnight.
They are kept in the data dir (``swarm/data-today.json``, written atomically
at most every `save_every` seconds and at `flush`), so a restart does not
forget what today already used. A file that cannot be read counts from 0.

At a cap (0 means no cap) the exchange stops what would cross it and the node
trains on its own rollouts until midnight: at the upload cap it publishes no
batches and sends no receipts; at the download cap it asks for no batches.
The relay's own small messages (its stats every few seconds) still arrive and
are counted. `blocked_reason` says why, in one sentence, for the log and the
swarm panel.

    python -m engine.swarm.datacap ~/.local/share/sapling/swarm/data-today.json   # what today used
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_json

log = logging.getLogger(__name__)

DATA_FILE = "data-today.json"
MB = 1_000_000


def megabytes(n: int) -> str:
    return f"{n / MB:.1f} MB" if n < 100 * MB else f"{n / MB:,.0f} MB"


class DataMeter:
    """Bytes sent and received today (local date), with daily caps in bytes (0: none); thread-safe."""

    def __init__(self, path: Path | None, upload_cap: int = 0, download_cap: int = 0,
                 today: Callable[[], date] = date.today, clock: Callable[[], float] = time.monotonic,
                 save_every: float = 10.0) -> None:
        self.path = path
        self.upload_cap = upload_cap
        self.download_cap = download_cap
        self.today = today
        self.clock = clock
        self.save_every = save_every
        self._lock = threading.Lock()
        self.day = today().isoformat()
        self.sent_bytes = self.received_bytes = 0
        self._saved_at = clock()
        self._dirty = False
        self._load()

    def set_caps(self, upload_cap: int, download_cap: int) -> None:
        """New daily caps in bytes (a settings reload); today's counts stay."""
        with self._lock:
            self.upload_cap, self.download_cap = upload_cap, download_cap

    def _load(self) -> None:
        if self.path is None or not self.path.is_file():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            day, sent, received = data["day"], data["sent_bytes"], data["received_bytes"]
            if not (isinstance(day, str) and all(isinstance(v, int) and v >= 0 for v in (sent, received))):
                raise ValueError("unexpected values")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s could not be read (%s); today's swarm traffic is counted from 0.", self.path, exc)
            return
        if day == self.day:  # a file from an earlier day is yesterday's: today starts at 0
            self.sent_bytes, self.received_bytes = sent, received

    def _roll(self) -> None:
        """A new local day: the counts start again (the caller holds the lock)."""
        day = self.today().isoformat()
        if day != self.day:
            log.info("A new day: swarm traffic counted from 0 again (%s sent, %s received on %s).",
                     megabytes(self.sent_bytes), megabytes(self.received_bytes), self.day)
            self.day, self.sent_bytes, self.received_bytes, self._dirty = day, 0, 0, True

    def _add(self, sent: int, received: int) -> None:
        with self._lock:
            self._roll()
            self.sent_bytes += sent
            self.received_bytes += received
            self._dirty = True
            due = self.clock() - self._saved_at >= self.save_every
        if due:
            self.flush()

    def sent(self, n: int) -> None:
        self._add(n, 0)

    def received(self, n: int) -> None:
        self._add(0, n)

    def flush(self) -> None:
        """Write today's counts now (atomically), when they changed."""
        with self._lock:
            self._roll()
            if self.path is None or not self._dirty:
                return
            record = self.to_json()
            self._dirty, self._saved_at = False, self.clock()
        try:
            atomic_write_json(self.path, record)
        except OSError as exc:
            log.warning("Could not save today's swarm traffic to %s: %s", self.path, exc)

    def upload_blocked(self) -> bool:
        with self._lock:
            self._roll()
            return bool(self.upload_cap) and self.sent_bytes >= self.upload_cap

    def download_blocked(self) -> bool:
        with self._lock:
            self._roll()
            return bool(self.download_cap) and self.received_bytes >= self.download_cap

    def blocked_reason(self) -> str:
        """One sentence when a cap is reached, else ''."""
        up, down = self.upload_blocked(), self.download_blocked()
        if not (up or down):
            return ""
        caps = []
        if up:
            caps.append(f"upload cap ({megabytes(self.upload_cap)} a day, swarm.daily_upload_mb)")
        if down:
            caps.append(f"download cap ({megabytes(self.download_cap)} a day, swarm.daily_download_mb)")
        doing = ("not sharing or taking rollouts" if up and down else
                 "not sharing its rollouts" if up else "not taking rollouts from the swarm")
        return (f"Today's {' and '.join(caps)} reached: {doing} until midnight, and training on this computer's "
                "own rollouts.")

    def to_json(self) -> dict[str, Any]:
        """What the `peers` event carries as `data_today` (and the file holds)."""
        return {"day": self.day, "sent_bytes": self.sent_bytes, "received_bytes": self.received_bytes,
                "upload_cap_bytes": self.upload_cap, "download_cap_bytes": self.download_cap}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m engine.swarm.datacap PATH-TO-data-today.json")
    meter = DataMeter(Path(sys.argv[1]))
    print(f"{meter.day}: {megabytes(meter.sent_bytes)} sent, {megabytes(meter.received_bytes)} received")
