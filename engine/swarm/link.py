"""What the node's relay link shows and keeps beside the connection itself (engine/swarm/client.py).

- `LinkState`: what the node shows about its link (connected, peers online,
  the relay in use, publishes, credit, resends, stalls);
- `RelayMemory`: when each relay of a swarm last let this node in, so the
  client tries the ones that worked first (a small JSON file, written
  atomically; a missing or unreadable one is an empty memory);
- `Unacked`: a batch sent and not yet answered, kept to send again;
- `LinkSilent`: the error that gives a silent link up;
- `pace`: the client's own token bucket under the relay's announced limits;
- `duration_text`: a length of time in words for the log and the swarm line.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from engine import __version__
from engine.common.atomicio import atomic_write_json
from engine.swarm import protocol
from engine.swarm.rate import TokenBucket

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_CAP_S = 30.0
CONNECT_TIMEOUT_S = 10.0  # opening a link, from the TCP connect to the welcome; also one publish's send
CLOSE_TIMEOUT_S = 2.0  # the closing handshake; on a dead link it never ends, and giving up drops the connection
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
# The client paces its requests below the relay's announced rate limit, with half its burst,
# so that a fast node (tiny rounds, a big GPU) waits a moment instead of being refused.
PACE_SHARE = 0.9


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
    evaluation: dict[str, Any] | None = None  # the stats' `eval`: the evaluation seed the relay asks now
    scored: dict[str, Any] | None = None  # the relay's last `scored` answer to this node's results, and when it came
    scored_at: float = 0.0
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
