"""Per-peer rate limits and the summary log of refusals, for the relay (engine/relay/server.py).

The relay takes one token of a peer's `rate.TokenBucket` per request;
`RejectionLog` counts refused messages per (peer, address) and
code and logs them as one info-level summary per period, so a flood of bad
frames costs one log line, not one per frame. `QuietBadRequests` does
the same for malformed HTTP requests, which aiohttp logs with a traceback.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("sapling.relay")

# The info-level summary of refusals names at most this many (peer, address) sources,
# and counts at most this many between two summaries before lumping the rest together.
LOG_TOP_SOURCES = 20
MAX_LOGGED_SOURCES = 10_000


class RejectionLog:
    """Refusals counted per (peer, address) and code, logged as a summary at info level."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], Counter[str]] = {}
        self.others: Counter[str] = Counter()  # sources beyond MAX_LOGGED_SOURCES in one period
        self.since = time.monotonic()

    def add(self, peer: str | None, ip: str, code: str) -> None:
        source = (peer or "-", ip)
        counts = self.counts.get(source)
        if counts is None:
            if len(self.counts) >= MAX_LOGGED_SOURCES:
                self.others[code] += 1
                return
            counts = self.counts[source] = Counter()
        counts[code] += 1

    def add_counts(self, peer: str | None, ip: str, counts: dict[str, int], prefix: str = "") -> None:
        """Several refusals at once, e.g. the receipt items a receipts message named in vain."""
        for code, n in counts.items():
            for _ in range(n):
                self.add(peer, ip, prefix + code)

    def flush(self) -> None:
        period = round(time.monotonic() - self.since, 1)
        ranked = sorted(self.counts.items(), key=lambda kv: -sum(kv[1].values()))
        for (peer, ip), codes in ranked[:LOG_TOP_SOURCES]:
            log.info("refused messages", extra={"peer": peer, "ip": ip, "codes": dict(codes),
                                                "total": sum(codes.values()), "period_s": period})
        rest: Counter[str] = Counter(self.others)
        for _source, codes in ranked[LOG_TOP_SOURCES:]:
            rest.update(codes)
        if rest:
            log.info("refused messages from other sources", extra={
                "sources": len(ranked) - LOG_TOP_SOURCES + (1 if self.others else 0), "codes": dict(rest),
                "total": sum(rest.values()), "period_s": period,
            })
        self.counts.clear()
        self.others.clear()
        self.since = time.monotonic()


class QuietBadRequests(logging.Filter):
    """For the `aiohttp.server` logger: a request aiohttp could not parse (a 64 kB header, a broken
    request line) is logged as an error with a traceback, and anyone can send one; it becomes one
    info line naming the problem instead. Errors inside the relay's own handlers keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg, record.args = "bad HTTP request from %s: %s", (remote, str(exc.message)[:120])
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return logging.getLogger().isEnabledFor(logging.INFO)
