"""Sortable identifiers: UUIDv7 (RFC 9562) as canonical hyphenated strings.

The 48-bit millisecond timestamp comes first so ids sort by creation time; within one millisecond the
12-bit ``rand_a`` field is used as a counter (RFC 9562 "method 3"), so ids made by one process are
strictly increasing even when many are made in the same millisecond.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id() -> str:
    """Return a new UUIDv7 string, strictly greater than the previous one from this process."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                ms += 1
                _counter = 0
        else:
            _counter = 0
        _last_ms = ms
        counter = _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))


#: What :func:`is_valid_id` accepts, as a JSON Schema pattern (the OpenAPI spec states it for every id).
ID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def is_valid_id(text: str) -> bool:
    """True if ``text`` is a canonical UUID string (any version: imported ids are kept as they are)."""
    try:
        return str(uuid.UUID(text)) == text
    except (ValueError, TypeError, AttributeError):
        return False
