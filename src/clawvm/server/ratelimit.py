"""The per-key rate limit (a token bucket), checked by :func:`clawvm.server.auth.authenticate` once the
key is known; over it, a request is a 429 with ``Retry-After``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from clawvm.core.errors import RateLimitError


class RateLimiter:
    """Token bucket per key: ``rate_per_s`` sustained, ``burst`` at once. Off when ``rate_per_s <= 0``."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.burst = max(1, burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        if self.rate <= 0:
            return
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                raise RateLimitError((1.0 - tokens) / self.rate)
            self._buckets[key] = (tokens - 1.0, now)
