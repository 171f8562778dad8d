"""Memories as reads show them: a memory is expired from the moment its ``expires_at`` passes, whether or
not ``tick()`` has swept it (the stored status changes then). Reads write nothing; they show the view."""

from __future__ import annotations

from datetime import datetime

from clawvm.core.model import Filters, Memory, Status
from clawvm.recall.retrieval import Recalled


def as_seen(memories: list[Memory], now: datetime) -> list[Memory]:
    """``memories`` as reads show them at ``now``: a memory is expired from the moment its ``expires_at``
    passes, so an active one past it shows status ``expired`` (stored active until tick() sweeps it; the
    stored object, h.get() and h.store give it as stored)."""
    return [
        m.model_copy(update={"status": Status.EXPIRED})
        if m.status is Status.ACTIVE and m.expires_at is not None and m.expires_at <= now
        else m
        for m in memories
    ]


def instant_of(f: Filters) -> datetime | None:
    """The instant ``f`` judges expiry at (what :meth:`Harness.filters` read of the clock), if any."""
    return f.live_at or f.active_due_by


def seen_hits(hits: list[Recalled], now: datetime) -> list[Recalled]:
    """Recall hits with their memories as reads show them (see :func:`as_seen`)."""
    shown = as_seen([h.memory for h in hits], now)
    return [h if m is h.memory else Recalled(m, h.score, h.explain) for h, m in zip(hits, shown, strict=True)]
