""":class:`KeyUsage`: what this server process knows of each API key's use (requests, last use), kept in
memory and bounded. It is the audit of reads: a read-only key's requests write nothing to the store (no
event, no row), so a read leaves this counter and its access-log line, and nothing that grows the database.
``GET /v1/keys`` shows it; it starts from zero when the process starts."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from clawvm.core.model import utcnow


@dataclass(frozen=True)
class Use:
    """One key's requests seen by this process, and when the last one came."""

    requests: int
    last_used_at: datetime


class KeyUsage:
    """Per key id: requests and last use, for at most ``max_keys`` keys (least recently used go first)."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max(1, max_keys)
        self._uses: OrderedDict[str, Use] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, key_id: str) -> None:
        """One more authenticated request of ``key_id``, now."""
        with self._lock:
            before = self._uses.pop(key_id, None)
            self._uses[key_id] = Use((before.requests if before else 0) + 1, utcnow())
            while len(self._uses) > self.max_keys:
                self._uses.popitem(last=False)

    def of(self, key_id: str) -> Use | None:
        """``key_id``'s use seen by this process, or None (unused since start, or forgotten)."""
        with self._lock:
            return self._uses.get(key_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._uses)
