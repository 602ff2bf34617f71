"""A request budget, the same on both sides of the swarm's websocket: the relay's rate limit and the client's pace.

docs/protocol.md ("Limits") defines it: `rate_per_s` tokens a second refill a
bucket of `burst`; every request (publish, sample, stats, receipts) costs one.
"""

from __future__ import annotations

import time


class TokenBucket:
    """A request budget: `rate` tokens a second refill it up to `burst`.

    The relay takes one token of a peer's bucket per request and refuses the
    request with `rate_limited` when there is none; a client keeps a bucket of
    its own, a little slower than the limits the welcome announced, and waits
    `wait_s()` before each request, so a fast node is paced, never refused.
    """

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self) -> bool:
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        """Seconds until a token is there (0.0 when one is there now)."""
        self._refill()
        return max(0.0, (1.0 - self.tokens) / self.rate)

    def drain(self) -> None:
        """Empty the bucket: the relay refused a request, so its bucket for this peer is empty too."""
        self._refill()
        self.tokens = 0.0
