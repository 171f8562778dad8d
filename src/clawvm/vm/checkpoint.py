"""Checkpoints of a session's memory state, and rollback to them.

A checkpoint is a snapshot of every memory of the session (read in keyset pages of the session, never the
rest of the tenant), stored as an archived ``agent_state`` memory (tag ``checkpoint``), so it lives in the
same store, survives restarts and is exported with everything else; the context builder never puts it in a
prompt.

What a rollback restores, exactly, for every memory the checkpoint saw: its tier, value (the number the
checkpoint recorded, not a recomputation), pin, status, usage counters, access count and time, its ``state``
and tool-call outcome (a call PENDING at the checkpoint is PENDING again, no longer pointing at the result it
got later) and its links (a link to a memory made later goes). A memory compressed after the checkpoint gets
its raw text back. A pin comes back only if the session's pinned memories then fit the working budget: a
memory that grew since, or whose raw text comes back, may not keep it (it is restored unpinned, and the
``rollback`` event's ``unpinned`` lists it). Memories created after the checkpoint become ``obsolete`` (not
deleted: analytics can still show what was undone). What it does not restore: content edited after the
checkpoint other than by compression (revisions are new memories, and those are obsoleted: the memory revised,
or merged, since names no successor any more; a memory decompressed since stays whole), memories forgotten for
good, memories expired since (their TTL passed: they stay expired), memories moved to another session since
(they are that session's now), and the event log, which records the rollback (a ``rollback`` event lists all
of it). The changes and that event are one write: a rollback is whole or not at all, whenever its process
dies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as ShapeError

from clawvm.core.errors import ConflictError, NotFoundError, ValidationError
from clawvm.core.model import (
    CHAIN_LINKS,
    CHECKPOINT_TAG,
    REPLACED_BY,
    Filters,
    Kind,
    Link,
    LinkType,
    Memory,
    State,
    Status,
    Tier,
    Usage,
    build_memory,
    canonical_json,
    describe_pattern,
    is_snapshot,
    revalidate,
)
from clawvm.store import Event
from clawvm.store.base import PinBudget, PinBudgetError, StoreReader
from clawvm.store.kinds import CREATING_KINDS, EventKind
from clawvm.vm.compress import decompress_memory, raw_text_back
from clawvm.vm.tiers import Pager
from clawvm.write.commit import Writer

TAG = CHECKPOINT_TAG  # one name: the context builder keeps snapshots out of every prompt


class SnapshotLine(BaseModel):
    """One memory's line of a snapshot, as :func:`take` writes it. ``state``, ``links``, ``compressed``
    and ``tool_call`` are absent from snapshots taken before they were recorded (``model_fields_set``
    tells absent from null)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tier: Tier
    value: float = Field(allow_inf_nan=False)
    pinned: bool
    status: Status
    usage: Usage
    access_count: int = Field(ge=0)
    last_accessed_at: datetime | None
    state: State | None = None
    links: list[Link] = Field(default_factory=list)
    compressed: bool | None = None
    tool_call: Any = None
    replaced_by: str | None = None  # what replaced it then, when obsolete (a revision, a merge)


class Snapshot(BaseModel):
    """The content of a checkpoint memory: read back from the store, so checked like any input (a memory
    that only looks like a checkpoint is refused before anything is changed)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    session_id: str = Field(min_length=1)
    memories: dict[str, SnapshotLine]


_NOT_A_SNAPSHOT_FIX = "pass an id returned by checkpoint() for a session of this tenant"


@dataclass(frozen=True)
class RollbackReport:
    checkpoint_id: str
    restored: list[str]  # memories whose tier/value/pin/status changed back
    obsoleted: list[str]  # memories created after the checkpoint


def session_memories(store: StoreReader, tenant: str, session_id: str) -> Iterator[Memory]:
    """The session's memories (checkpoints excluded), oldest first, read in keyset pages: a snapshot
    holds one line per memory of the session, never the tenant's other memories, and a rollback changes
    them page by page (a keyset walk neither skips nor repeats a memory it changes)."""
    for m in store.iter_all(Filters.of(tenant=tenant, session_id=session_id)):
        if not is_snapshot(m):
            yield m


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint as :func:`listed` tells it: what to roll back to, without its snapshot's lines."""

    id: str
    name: str
    session_id: str
    taken_at: datetime
    memories: int  # how many of the session's memories its snapshot holds


def listed(store: StoreReader, tenant: str, session_id: str) -> list[CheckpointInfo]:
    """``session_id``'s checkpoints, newest first (names may repeat: the id tells them apart)."""
    found = Filters.of(
        tenant=tenant, session_id=session_id, kind=Kind.AGENT_STATE, tags_all=frozenset([TAG]), status=None
    )
    infos = [
        CheckpointInfo(
            id=m.id,
            name=str(m.metadata.get("checkpoint", "")),
            session_id=session_id,
            taken_at=m.created_at,
            memories=int(m.metadata.get("memories", 0)),
        )
        for m in store.iter_all(found)
        if is_snapshot(m)
    ]
    return sorted(infos, key=lambda c: (c.taken_at, c.id), reverse=True)


#: the longest checkpoint name, in characters (the SDK took 5,000, the REST API 200)
CHECKPOINT_NAME_MAX = 200
#: a checkpoint name: text besides spaces, on one line, with no control character (a NUL, which
#: PostgreSQL cannot store; a newline, which broke the CLI's listing of checkpoints)
CHECKPOINT_NAME_PATTERN = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
_NAME_FIX = "name the checkpoint in text on one line, without control characters"
describe_pattern(CHECKPOINT_NAME_PATTERN, "is blank or holds a control character", _NAME_FIX)


def checked_name(name: object) -> str:
    """``name`` as a checkpoint's name, or a ValidationError naming ``name``: the same rule as the REST
    API's (:data:`CHECKPOINT_NAME_MAX`, :data:`CHECKPOINT_NAME_PATTERN`)."""
    if not isinstance(name, str):
        raise ValidationError("name", f"is {name!r}", "name the checkpoint (a non-empty string)")
    if len(name) > CHECKPOINT_NAME_MAX:
        raise ValidationError(
            "name", f"is {len(name):,} characters", f"use at most {CHECKPOINT_NAME_MAX} characters"
        )
    if not re.fullmatch(CHECKPOINT_NAME_PATTERN, name):
        raise ValidationError("name", f"is {name!r}: blank, or it holds a control character", _NAME_FIX)
    return name


def _replaced_by(m: Memory) -> str | None:
    """The memory that replaced obsolete ``m`` (:data:`REPLACED_BY`), if any."""
    if m.status is not Status.OBSOLETE:
        return None
    return next((str(m.metadata[k]) for k in REPLACED_BY if m.metadata.get(k)), None)


def take(
    store: StoreReader, writer: Writer, tenant: str, session_id: str, name: str, now: datetime
) -> Memory:
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
            "state": None if m.state is None else m.state.value,
            "links": [link.model_dump(mode="json") for link in m.links],
            "compressed": "compression" in m.metadata,
            "tool_call": m.metadata.get("tool_call"),  # a call's outcome and the result it points to
            "replaced_by": _replaced_by(m),
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
    event = Event(
        kind=EventKind.CHECKPOINT,
        memory_id=snapshot.id,
        tenant=tenant,
        at=now,
        data={"name": name, "session_id": session_id, "memories": len(state)},
    )
    return writer.write([snapshot], None, [event])[0]


#: How often a rollback is planned and written again when a memory it writes changed meanwhile (a pager
#: pass, another process): its write is one compare-and-set of every memory it changes
ROLLBACK_RETRIES = 20


def rollback(
    store: StoreReader,
    pager: Pager,
    checkpoint_id: str,
    now: datetime,
    tenant: str | None = None,
    *,
    guard: Callable[[Sequence[Memory]], None] | None = None,
) -> RollbackReport:
    """Restore the checkpoint ``checkpoint_id`` (of ``tenant``, when given); :class:`ValidationError` naming
    ``checkpoint_id``, and nothing changed, when it is not a checkpoint snapshot of its own session.
    ``guard`` is shown the memories (as read) whose change is more than the harness's bookkeeping
    (:data:`BOOKKEEPING`) or that the rollback obsoletes, each time it decides what to write: first before
    anything is written, again once the raw text of memories compressed since is back and after a conflict
    (a check made before the call could miss a memory another writer made meanwhile). Raising there stops
    the rollback: nothing of it is written but, from the second time on, that raw text.

    Every change and the ``rollback`` event are one write: a process killed during a rollback leaves the
    session as it was or rolled back, never half (each memory written on its own left 755 of 3,000 undone,
    and no event said so). Only the raw text of a memory compressed since comes back first, each in a
    write of its own: a decompressed memory is the same memory, whole. But a memory pinned now or at the
    checkpoint gets its raw text back in the rollback's write, where the pins it undoes are counted: its
    pin stays (or comes back) only if the session's pinned memories then fit the working budget, and no
    write of the rollback ever leaves them past it."""
    snap = _checkpoint(store, checkpoint_id)
    data = read_snapshot(snap, tenant)
    taken = _first_seq(store, snap)
    decompressed: set[str] = set()
    for _ in range(ROLLBACK_RETRIES):
        plan = _plan(store, pager, snap, data, taken, now, decompressed)
        if guard is not None:  # before anything is written, decompressions included
            guard(plan.touched)
        if plan.compressed_since:  # their raw text comes back first, then the plan is made again
            for m in plan.compressed_since:
                try:
                    decompress_memory(store, pager.writer, m, now)
                except ConflictError:  # it changed since the plan read it: the next plan reads it again
                    break
                decompressed.add(m.id)
            continue
        event = Event(
            kind=EventKind.ROLLBACK,
            memory_id=snap.id,
            tenant=snap.tenant,
            at=now,
            data={
                "name": data.name,
                "restored": plan.restored,
                "obsoleted": plan.obsoleted,
                "tiers": plan.tiers,
                **({"unpinned": plan.unpinned} if plan.unpinned else {}),
            },
        )
        try:
            pager.writer.write(plan.written, None, [*plan.notes, event], requires=plan.pins)
        except ConflictError:  # one of them changed since it was read: read and decide again
            continue
        except PinBudgetError:  # another writer's pins took the room a restored pin was to take: again,
            continue  # and the plan, seeing them, restores that memory unpinned
        return RollbackReport(snap.id, plan.restored, plan.obsoleted)
    raise ConflictError(
        snap.id,
        None,
        None,
        f"the session of checkpoint {snap.id} kept changing while the rollback was written",
        field="checkpoint_id",
        fix="roll back again",
    )


@dataclass(frozen=True)
class _Plan:
    """What a rollback writes (each memory at its next version) and reports."""

    written: list[Memory]
    restored: list[str]
    obsoleted: list[str]
    tiers: dict[str, str]  # restored id -> the tier it is back in (MemLens's timeline replays it)
    touched: list[Memory]  # as read: those it obsoletes or changes beyond BOOKKEEPING (a rollback's guard)
    compressed_since: list[Memory]  # to restore, compressed since, never pinned: decompressed first
    pins: tuple[PinBudget, ...]  # the pinned budgets of the pins it restores, checked in its write
    notes: list[Event]  # the decompress events of the raw text it brings back itself (of pinned ones)
    unpinned: list[str]  # pinned at the checkpoint, restored unpinned: their pins no longer fit


def _plan(
    store: StoreReader,
    pager: Pager,
    snap: Memory,
    data: Snapshot,
    taken: int | None,
    now: datetime,
    decompressed: set[str],
) -> _Plan:
    """The rollback's changes as the store holds the session now (``decompressed``: restored already)."""
    written: dict[str, Memory] = {}
    restored, obsoleted = [], []
    tiers: dict[str, str] = {}
    touched: dict[str, Memory] = {}
    compressed_since: list[Memory] = []
    notes: list[Event] = []  # the decompress events of the raw text this write brings back
    repins: list[tuple[Memory, Memory, dict[str, Any]]] = []  # pins restored once every unpin is counted
    unpinned: list[str] = []  # pinned at the checkpoint, and left unpinned: the pin no longer fits

    def change(m: Memory, fields: dict[str, Any], keep_value: bool) -> Memory:
        changed = revalidate(m, {**fields, "version": m.version + 1})
        return changed if keep_value else revalidate(changed, {"value": pager.value_now(changed, now)})

    steps = _steps(store, snap, data, taken, now)
    for m, step in steps.members:
        if step == "obsolete":
            fields = {"status": Status.OBSOLETE, "tier": Tier.ARCHIVE, "pinned": False}
            written[m.id] = change(m, fields, keep_value=False)
            obsoleted.append(m.id)
            touched[m.id] = m
            continue
        if step == "keep":
            continue
        since = "compression" in m.metadata and data.memories[m.id].compressed is False
        whole = m  # m with the raw text this write brings back, at its stored version
        if since and (m.pinned or data.memories[m.id].pinned):
            # pinned, its raw text may not fit beside the session's pins: it comes back in this write,
            # where the pins it undoes are counted, pinned only if the pinned memories then fit
            whole, note = raw_text_back(store, m, now)
            notes.append(note)
        elif since:
            compressed_since.append(m)
        target = _restored_fields(whole, data.memories[m.id], steps)
        repin = target["pinned"] and (not m.pinned or whole is not m) and m.session_id is not None
        if repin:  # after the unpins: whether a pin fits does not depend on the order of the rows
            repins.append((m, whole, target))
            target = {**target, "pinned": False}  # its pin is decided below
        if any(getattr(whole, k) != v for k, v in target.items()) or whole is not m:
            written[m.id] = change(whole, target, keep_value=True)
        seen = _without_raw_pointer(m) if since and whole is m else whole  # the pointer is bookkeeping
        kept = (k for k in target if k not in BOOKKEEPING and not (repin and k == "pinned"))
        if any(getattr(seen, k) != target[k] for k in kept):
            touched[m.id] = m
        if m.id in written or m.id in decompressed:
            restored.append(m.id)
            tiers[m.id] = Tier(target["tier"]).value
    repinned: list[Memory] = []
    for m, whole, target in repins:
        pinned = [w for w in written.values() if w.pinned and w.session_id == m.session_id]
        target = _pin_if_it_fits(pager, whole, target, now, pinned, written.keys())
        if not target["pinned"]:
            unpinned.append(m.id)
        # (one whose raw text comes back is written whatever its pin, and is counted restored already)
        if whole is not m or any(getattr(m, k) != v for k, v in target.items()):
            written[m.id] = change(whole, target, keep_value=True)
            if target["pinned"] != m.pinned:
                touched[m.id] = m  # its pin comes back, or goes (one that does not fit: bookkeeping alone)
            if m.id not in tiers:
                restored.append(m.id)
            tiers[m.id] = Tier(target["tier"]).value
        if target["pinned"]:
            repinned.append(written[m.id])
    return _Plan(
        list(written.values()),
        restored,
        obsoleted,
        tiers,
        list(touched.values()),
        compressed_since,
        pager.pin_budgets(repinned, now),
        notes,
        unpinned,
    )


#: What a rollback restores that the harness itself keeps moving (tiers, values, usage and access
#: counts, the pager's compression on the way to the archive): :func:`would_change` can leave them out,
#: to ask what a rollback changes that a writer wrote.
BOOKKEEPING = frozenset({"tier", "value", "usage", "access_count", "last_accessed_at", "compressed"})


def would_change(
    store: StoreReader,
    checkpoint_id: str,
    now: datetime,
    tenant: str | None = None,
    *,
    ignore: frozenset[str] = frozenset(),
    pager: Pager | None = None,
) -> list[Memory]:
    """The memories a rollback to ``checkpoint_id`` would change if run at ``now``: the ones it would
    obsolete, and the ones it would restore whose fields (but ``ignore``'s) differ from the snapshot's, or
    that it would decompress; decided as :func:`rollback` decides them. Nothing is written. (What the
    store holds: recalls' access bookkeeping that a harness still holds is written by its rollback first.)
    ``pager``: the rollback's, whose working budget decides which of the snapshot's pins still fit (a pin
    that no longer does is restored unpinned: a pinned memory that grew since, or whose raw text comes
    back, loses its pin); without it every pin of the snapshot counts as restored."""
    snap = _checkpoint(store, checkpoint_id)
    data = read_snapshot(snap, tenant)
    taken = _first_seq(store, snap)
    dropped = set() if pager is None else set(_plan(store, pager, snap, data, taken, now, set()).unpinned)
    out = []
    steps = _steps(store, snap, data, taken, now)
    for m, step in steps.members:
        if step == "obsolete":
            out.append(m)
        elif step == "restore":
            old = data.memories[m.id]
            decompressed = "compression" in m.metadata and old.compressed is False
            target = _restored_fields(m, old, steps)
            if m.id in dropped:
                target["pinned"] = False
            seen = m
            if decompressed and "compressed" in ignore:  # its pointer to the raw copy is the pager's too
                seen = _without_raw_pointer(m)
            changed = any(getattr(seen, k) != v for k, v in target.items() if k not in ignore)
            if changed or (decompressed and "compressed" not in ignore):
                out.append(m)
    return out


def _without_raw_pointer(m: Memory) -> Memory:
    """Compressed ``m`` without its link to its raw copy (the compression's, which a decompression drops)."""
    raw = m.metadata["compression"].get("raw_id")
    links = [k for k in m.links if not (k.type is LinkType.DERIVED_FROM and k.target == raw)]
    return m.model_copy(update={"links": links})


def _checkpoint(store: StoreReader, checkpoint_id: Any) -> Memory:
    """The stored memory ``checkpoint_id`` names (a snapshot or not: :func:`read_snapshot` checks)."""
    if not isinstance(checkpoint_id, str):
        raise ValidationError(
            "checkpoint_id", f"is a {type(checkpoint_id).__name__}", "pass the id checkpoint() returned"
        )
    try:
        return store.get(checkpoint_id)
    except NotFoundError:
        raise NotFoundError("checkpoint", checkpoint_id) from None  # the id the caller passed


Step = Literal["obsolete", "restore", "keep"]


def _step(
    store: StoreReader, m: Memory, snap: Memory, data: Snapshot, taken: int | None, now: datetime
) -> Step:
    """What a rollback does to ``m``, a memory of the snapshot's session: obsolete it (made since the
    checkpoint), restore it to its snapshot line, or keep it as it is."""
    if m.id == snap.id:
        return "keep"
    old = data.memories.get(m.id)
    if old is None and _made_since(store, m, snap, taken):  # undone
        # already undone (an earlier rollback): nothing to do
        return "obsolete" if m.status is not Status.OBSOLETE else "keep"
    if old is None:  # older than the checkpoint, moved into the session since: not the session's then
        return "keep"
    if m.status is Status.EXPIRED or (m.expires_at is not None and m.expires_at <= now):
        # a TTL is a promise to forget: restored, an expired memory went back to working active, and
        # the next tick() expired it a second time
        return "keep"
    return "restore"


def _first_seq(store: StoreReader, m: Memory) -> int | None:
    """The sequence number of the event that made ``m`` (its ``add``, ``import``, ``checkpoint`` ...: one
    of :data:`CREATING_KINDS`); None when the log no longer holds it (retention). Its first event left is
    not that one when retention pruned it: a later change's (a move into the session) would date an old
    memory after a checkpoint it is older than."""
    first = store.read_events(0, 1, memory_id=m.id)
    return first[0].seq if first and first[0].kind in CREATING_KINDS else None


def _made_since(store: StoreReader, m: Memory, snap: Memory, taken: int | None) -> bool:
    """Whether ``m``, absent from the snapshot, was made after it: by the event log, which orders writes
    whatever times they carry (a ``created_at`` given by the caller, or a skewed clock, made a memory
    recorded since look older); by creation time when the log no longer says."""
    made = _first_seq(store, m) if taken is not None else None
    if taken is not None and made is not None:
        return made > taken
    return m.created_at >= snap.created_at


def _pin_if_it_fits(
    pager: Pager,
    m: Memory,
    target: dict[str, Any],
    now: datetime,
    pinned: Sequence[Memory],
    written: Collection[str],
) -> dict[str, Any]:
    """``target`` with the pin it restores only if the pinned memories then fit the working budget (those
    stored, but the rollback's ``written`` ones, and its ``pinned`` ones): a memory that grew since the
    checkpoint came back pinned past it (pin() refuses the same), where no pager pass can page it out.
    Unpinned, it is restored to its tier like any other."""
    try:
        pinned_then = [w for w in pinned if w.tier is Tier.WORKING]
        wanted = m.model_copy(update={"pinned": True, "tier": target["tier"]})
        pager.check_pin(wanted, now, alongside=pinned_then, written=written)
    except ValidationError:  # over the budget (pinned)
        return {**target, "pinned": False}
    return target


def read_snapshot(snap: Memory, tenant: str | None = None) -> Snapshot:
    """The snapshot ``snap`` holds, checked: a checkpoint memory (kind and tag) of ``tenant`` whose
    content is a snapshot of its own session. Another tenant's is :class:`NotFoundError`; anything else a
    :class:`ValidationError` naming ``checkpoint_id`` (content written by hand, or imported, can look like a
    checkpoint without being one)."""
    if not is_snapshot(snap):
        raise ValidationError("checkpoint_id", f"{snap.id} is not a checkpoint", _NOT_A_SNAPSHOT_FIX)
    if tenant is not None and snap.tenant != tenant:  # as if it did not exist: no tenant learns another's ids
        raise NotFoundError("checkpoint", snap.id)
    try:
        data = Snapshot.model_validate_json(snap.content)
    except ShapeError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "its content"
        raise ValidationError(
            "checkpoint_id",
            f"{snap.id} is tagged as a checkpoint but is not a snapshot ({where}: {first['msg']})",
            _NOT_A_SNAPSHOT_FIX,
        ) from None
    if data.session_id != snap.session_id:
        raise ValidationError(
            "checkpoint_id",
            f"{snap.id} belongs to session {snap.session_id!r} but its snapshot names session "
            f"{data.session_id!r}",
            _NOT_A_SNAPSHOT_FIX,
        )
    return data


def _restored_fields(m: Memory, old: SnapshotLine, steps: _Steps) -> dict[str, Any]:
    """The fields a rollback writes back to ``m`` from its line of the snapshot (snapshots taken before
    ``state``, ``links`` and tool-call outcomes were recorded restore the rest).

    A memory forgotten since is not brought back, so neither is what named it: a memory obsolete then
    because a revision replaced it that has been forgotten since keeps the status the forget left it
    (the head again: restored obsolete, its chain had no head), and a chain link to a forgotten memory
    gives way to the memory's own links of that kind now (the forget linked it past the gap)."""
    replaced_then = old.status is Status.OBSOLETE and old.replaced_by in steps.forgotten
    fields: dict[str, Any] = {
        "tier": old.tier,
        "value": old.value,
        "pinned": old.pinned,
        "status": m.status if replaced_then else old.status,
        "usage": old.usage,
        "access_count": old.access_count,
        "last_accessed_at": old.last_accessed_at,
    }
    given = old.model_fields_set
    if "state" in given:
        fields["state"] = old.state
    if "links" in given:
        # a memory decompressed since stays whole (its summary is not kept): the pointer to its raw copy
        # that came with the compression does not come back without it
        raw = (
            m.metadata.get("decompressed_from", {}).get("raw_id") if "compression" not in m.metadata else None
        )
        links = [
            link for link in old.links if not (link.type is LinkType.DERIVED_FROM and link.target == raw)
        ]
        fields["links"] = _past_the_forgotten(links, m, steps.forgotten)
    metadata = _restored_metadata(m, old, steps.surviving)
    if metadata != m.metadata:
        fields["metadata"] = metadata
    return fields


def _past_the_forgotten(links: list[Link], m: Memory, forgotten: Collection[str]) -> list[Link]:
    """``links`` (a snapshot's) without the chain links to ``forgotten`` memories, each kind of which
    that it lost taking ``m``'s own chain links of that kind now."""
    lost = {link.type for link in links if link.type in CHAIN_LINKS and link.target in forgotten}
    if not lost:
        return links
    kept = [link for link in links if not (link.type in CHAIN_LINKS and link.target in forgotten)]
    now = [
        link for link in m.links if link.type in lost and link.target not in forgotten and link not in kept
    ]
    return [*kept, *now]


def _restored_metadata(m: Memory, old: SnapshotLine, surviving: Collection[str]) -> dict[str, Any]:
    """``m``'s metadata as the rollback leaves it: its tool-call outcome as the snapshot saw it, and no
    successor (:data:`REPLACED_BY`) unless it was obsolete then: one named since is a revision or a merge
    made after the checkpoint, which the rollback obsoletes, and ``m`` is the head of its chain again;
    but a successor in ``surviving`` (in another session, which this rollback leaves as it is) is kept."""
    metadata = dict(m.metadata)
    if "tool_call" in old.model_fields_set and metadata.get("tool_call") != old.tool_call:
        metadata.pop("tool_call", None)
        if old.tool_call is not None:
            metadata["tool_call"] = old.tool_call
    if old.status is not Status.OBSOLETE:
        for key in REPLACED_BY:
            if metadata.get(key) not in surviving:
                metadata.pop(key, None)
    return metadata


@dataclass(frozen=True)
class _Steps:
    """What a rollback does to each memory of the snapshot's session, and the successors it leaves named."""

    members: list[tuple[Memory, Step]]
    surviving: set[str]  # see _surviving_successors
    forgotten: set[str]  # what the restored lines name (a successor, a chain link) that is no longer stored


def _steps(store: StoreReader, snap: Memory, data: Snapshot, taken: int | None, now: datetime) -> _Steps:
    members = [
        (m, _step(store, m, snap, data, taken, now))
        for m in session_memories(store, snap.tenant, data.session_id)
    ]
    obsoleting = {m.id for m, step in members if step == "obsolete"}
    restoring = [m for m, step in members if step == "restore"]
    surviving = _surviving_successors(store, restoring, obsoleting)
    return _Steps(members, surviving, _forgotten_names(store, [data.memories[m.id] for m in restoring]))


def _forgotten_names(store: StoreReader, lines: Iterable[SnapshotLine]) -> set[str]:
    """The memories that ``lines`` name as a successor or by a chain link which are no longer stored."""
    named = {link.target for line in lines for link in line.links if link.type in CHAIN_LINKS}
    named |= {line.replaced_by for line in lines if line.replaced_by is not None}
    return named - set(store.get_many(sorted(named)))


def _surviving_successors(
    store: StoreReader, named_by: Iterable[Memory], obsoleting: Collection[str]
) -> set[str]:
    """The successors (:data:`REPLACED_BY`) that ``named_by`` name which the rollback does not obsolete
    and which are still active: a revision or a merge output in another session. A rollback restores one
    session; a merge takes members of several, and dropping the name of an output that stays active lost
    where the memory went."""
    named = {str(m.metadata[k]) for m in named_by for k in REPLACED_BY if isinstance(m.metadata.get(k), str)}
    outside = [i for i in named if i not in obsoleting]
    return {i for i, found in store.get_many(outside).items() if found.status is Status.ACTIVE}
