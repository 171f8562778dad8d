"""Checkpoints of a session's memory state, and rollback to them.

A checkpoint is a snapshot of every memory of the session — tier, value, pinned, status, version — read
in keyset pages of the session (never the rest of the tenant; a write landing between two pages shows in
the later one) and stored as an archived ``agent_state`` memory (tag ``checkpoint``), so it lives in the
same store, survives restarts and is exported with everything else. Rolling back restores each
memory's tier, value, pin and status, and marks memories created after the checkpoint ``obsolete`` (not
deleted: analytics can still show what was undone); a ``rollback`` event lists all of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from clawvm.core.errors import ValidationError
from clawvm.core.model import Filters, Kind, Memory, Status, Tier, Usage, build_memory, canonical_json
from clawvm.store import Event, Store
from clawvm.vm.tiers import Pager

TAG = "checkpoint"


@dataclass(frozen=True)
class RollbackReport:
    checkpoint_id: str
    restored: list[str]  # memories whose tier/value/pin/status changed back
    obsoleted: list[str]  # memories created after the checkpoint


def session_memories(store: Store, tenant: str, session_id: str) -> Iterator[Memory]:
    """The session's memories (checkpoints excluded), oldest first, read in keyset pages: a snapshot
    holds one line per memory of the session, never the tenant's other memories, and a rollback changes
    them page by page (a keyset walk neither skips nor repeats a memory it changes)."""
    for m in store.iter_all(Filters.of(tenant=tenant, session_id=session_id)):
        if TAG not in m.tags or m.kind is not Kind.AGENT_STATE:
            yield m


def take(store: Store, tenant: str, session_id: str, name: str, now: datetime) -> Memory:
    state = {
        m.id: {
            "tier": m.tier.value,
            "value": m.value,
            "pinned": m.pinned,
            "status": m.status.value,
            "usage": m.usage.model_dump(),
            "access_count": m.access_count,
            "last_accessed_at": m.last_accessed_at.isoformat() if m.last_accessed_at else None,
            "version": m.version,
        }
        for m in session_memories(store, tenant, session_id)
    }
    snapshot = build_memory(
        {
            "content": canonical_json(
                {"name": name, "session_id": session_id, "taken_at": now.isoformat(), "memories": state}
            ),
            "content_type": "application/json",
            "kind": Kind.AGENT_STATE,
            "status": Status.ARCHIVED,
            "tier": Tier.ARCHIVE,
            "tenant": tenant,
            "session_id": session_id,
            "tags": [TAG],
            "created_at": now,
            "metadata": {"checkpoint": name, "memories": len(state)},
        }
    )
    store.put(snapshot)
    store.append_event(
        Event(
            kind="checkpoint",
            memory_id=snapshot.id,
            tenant=tenant,
            at=now,
            data={"name": name, "session_id": session_id, "memories": len(state)},
        )
    )
    return snapshot


def rollback(store: Store, pager: Pager, checkpoint_id: str, now: datetime) -> RollbackReport:
    snap = store.get(checkpoint_id)
    if TAG not in snap.tags or snap.kind is not Kind.AGENT_STATE:
        raise ValidationError(
            "checkpoint_id", f"{checkpoint_id} is not a checkpoint", "pass an id from checkpoint()"
        )
    data = json.loads(snap.content)
    state: dict[str, dict[str, object]] = data["memories"]
    restored, obsoleted = [], []
    for m in session_memories(store, snap.tenant, data["session_id"]):
        if m.id == snap.id:
            continue
        old = state.get(m.id)
        if old is None:
            if m.status is not Status.OBSOLETE:  # already undone (an earlier rollback): nothing to do
                pager.mutate(
                    m, lambda _m: {"status": Status.OBSOLETE, "tier": Tier.ARCHIVE, "pinned": False}, now
                )
                obsoleted.append(m.id)
            continue
        target = {
            "tier": Tier(str(old["tier"])),
            "pinned": bool(old["pinned"]),
            "status": Status(str(old["status"])),
            "usage": Usage.model_validate(old["usage"]),
            "access_count": old["access_count"],
            "last_accessed_at": _when(old["last_accessed_at"]),
        }
        if any(getattr(m, k) != v for k, v in target.items()):
            pager.mutate(m, lambda _m, t=target: dict(t), now)  # type: ignore[misc]
            restored.append(m.id)
    store.append_event(
        Event(
            kind="rollback",
            memory_id=snap.id,
            tenant=snap.tenant,
            at=now,
            data={"name": data["name"], "restored": restored, "obsoleted": obsoleted},
        )
    )
    return RollbackReport(snap.id, restored, obsoleted)


def _when(text: object) -> datetime | None:
    return datetime.fromisoformat(str(text)) if text else None
