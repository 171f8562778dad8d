"""Rate limits as token buckets (:class:`RateLimiter`), one bucket per key of the limit: an API key, a
tenant, a tenant minting keys, a client address failing to authenticate. :meth:`clawvm.server.service.
Service.admit` charges a request the key's, the tenant's and a minting route's together (the Service holds
one limiter per kind); over a limit, a request is a 429 with ``Retry-After``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from clawvm.core.errors import RateLimitError

#: How many buckets one limiter keeps at most: the least recently used go first (a forgotten bucket
#: starts full again, which only ever favours a caller quiet for longer than every other one).
DEFAULT_MAX_BUCKETS = 100_000


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """Token bucket per key: ``rate_per_s`` sustained, ``burst`` at once. Off when ``rate_per_s <= 0``.
    ``limit`` names it in the 429's message. At most ``max_buckets`` keys are tracked (LRU)."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        limit: str = "API key",
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> None:
        self.rate = rate_per_s
        self.burst = max(1, burst)
        self.limit = limit
        self.max_buckets = max(1, max_buckets)
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        """Take one token from ``key``'s bucket, or raise RateLimitError (taking none)."""
        self._take(key, spend=True)

    def peek(self, key: str) -> None:
        """Raise RateLimitError if ``key``'s bucket is empty; take nothing (see :meth:`spend`)."""
        self._take(key, spend=False)

    def spend(self, key: str) -> None:
        """Take one token from ``key``'s bucket if it has one (a cost noted after the fact)."""
        with contextlib.suppress(RateLimitError):
            self._take(key, spend=True)

    def refund(self, key: str) -> None:
        """Give back the token a request took from ``key``'s bucket (up to its burst): the request was
        refused by a later limit, and a refused request spends nothing."""
        if self.rate <= 0:
            return
        with self._lock:
            bucket = self._bucket(key, self._clock())
            bucket.tokens = min(float(self.burst), bucket.tokens + 1.0)

    def _take(self, key: str, *, spend: bool) -> None:
        if self.rate <= 0:
            return
        now = self._clock()
        with self._lock:
            bucket = self._bucket(key, now)
            self._refuse_if_empty(bucket)
            if spend:
                bucket.tokens -= 1.0

    def _refuse_if_empty(self, bucket: _Bucket) -> None:
        if bucket.tokens < 1.0:
            raise RateLimitError((1.0 - bucket.tokens) / self.rate, self.limit)

    @staticmethod
    def check_all(*buckets: tuple[RateLimiter, str]) -> None:
        """Take one token from each bucket (a limiter and its key), or none from any: raise the refusal of
        the first empty one, in the order given. Why not one :meth:`check` after the other: a request the
        tenant's limit refused had already spent a token of its key's, so a key of a busy tenant ran out
        of its own limit on requests that were never served."""
        on = [(limiter, key) for limiter, key in buckets if limiter.rate > 0]
        # every limiter's lock at once, taken in one order (by id) whatever the order given: no deadlock
        locks = sorted({id(limiter): limiter._lock for limiter, _ in on}.items())
        with contextlib.ExitStack() as held:
            for _, lock in locks:
                held.enter_context(lock)
            found = [(limiter, limiter._bucket(key, limiter._clock())) for limiter, key in on]
            for limiter, bucket in found:
                limiter._refuse_if_empty(bucket)
            for _, bucket in found:
                bucket.tokens -= 1.0

    def _bucket(self, key: str, now: float) -> _Bucket:
        """``key``'s bucket refilled up to ``now`` (a new one starts full), most recently used last."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
        return bucket

    def __len__(self) -> int:
        """How many buckets are tracked now."""
        with self._lock:
            return len(self._buckets)
