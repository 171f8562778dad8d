"""Event logs written in bulk for the dashboard's scale tests: tier moves and context builds whose lines
are given, without running the pager or the context builder 10k times."""

from __future__ import annotations

from datetime import datetime, timedelta

from clawvm import Memory
from clawvm.store import Event

MOVED = {"from": "working", "to": "short_term", "value_before": 0.5, "value_after": 0.4, "reason": "b"}


def demotions(memories: list[Memory], t0: datetime) -> list[Event]:
    """One demotion per memory, a minute apart, from ``t0`` + 30 min."""
    return [Event("demote", m.id, MOVED, at=t0 + timedelta(minutes=i + 30)) for i, m in enumerate(memories)]


def context_build(lines: list[Memory], query: str, session: str, at: datetime) -> Event:
    """A recorded context build of ``lines`` (each retrieved from long-term, 24 tokens)."""
    manifest = [
        {
            "id": m.id,
            "short_id": m.id[-8:],
            "section": "retrieved",
            "tier": "long_term",
            "value": 0.5,
            "score": 0.5,
            "tokens": 24,
            "reason": "recall",
            "created_at": m.created_at.isoformat(),
        }
        for m in lines
    ]
    data = {
        "query": query,
        "budget": 500,
        "tokens": 480,
        "scope": {"session_id": session},
        "ms": 5.0,
        "manifest": manifest,
    }
    return Event("context", None, data, at=at)
