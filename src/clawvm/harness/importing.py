"""Importing exported memories (``Harness.import_renamed``): checked as writes are, stored as they were
(ids, versions, timestamps) in one batch through the write path, ids already present skipped and compared.

A host gives what an import needs of the harness: the write path, the redactor, and what team checks
read (:class:`clawvm.teams.shared.TeamHost`); its engine, whose ``import_ids`` name the renames, comes
beside.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from clawvm.core.embed import count_tokens
from clawvm.core.errors import ConflictError, StateConflictError, ValidationError
from clawvm.core.model import Link, Memory, Status, Tier, canonical_json, is_snapshot
from clawvm.harness.fields import AHEAD_OF_CLOCK_FIX, ahead_of_clock
from clawvm.store import Event, PinBudgetError, Store
from clawvm.store.kinds import EventKind
from clawvm.store.tenant import TenantStore
from clawvm.teams import shared as teams
from clawvm.write.redaction import Redactor

#: How often an import reads which of its ids are stored and writes the rest, when another writer stored
#: some of them in between (two imports of one file, side by side)
IMPORT_RETRIES = 5
#: How many ids of a parent loop an import's refusal shows (a loop of a whole run trace is long)
LOOP_SHOWN = 6


class ImportHost(teams.TeamHost, Protocol):
    """The harness, as an import sees it."""

    @property
    def redactor(self) -> Redactor: ...


@dataclass(frozen=True)
class Imported:
    """What an import did: how many memories it wrote, and each imported id that is stored under another
    id (another tenant holds it) -> that id."""

    imported: int
    renamed: dict[str, str] = field(default_factory=dict)
    # ids already present (as stored, renamed ones under their new id) whose stored content differs from
    # the imported one's as the write path would store it: skipped, kept as stored
    differing: list[str] = field(default_factory=list)
    # the (tenant, session) of each memory written, as stored: the pager's next pass checks their budgets
    sessions: frozenset[tuple[str, str]] = frozenset()


def import_memories(h: ImportHost, engine: Store, given: Iterable[Memory], restore: bool) -> Imported:
    """Store ``given`` (see ``Harness.import_renamed``); ``restore`` skips the write checks. ``engine`` is
    the harness's store (a tenant's view or the owner's engine): it names the ids an import must rename;
    the memories are written through ``h.writer``."""
    if isinstance(given, str | bytes | Mapping) or not isinstance(given, Iterable):
        raise ValidationError(
            "memories",
            f"is a {type(given).__name__}",
            "pass a list of Memory objects (Memory.model_validate)",
        )
    given = list(given)  # a generator was used up by the checks below: nothing was imported
    for i, m in enumerate(given):
        if not isinstance(m, Memory):
            raise ValidationError(
                f"memories.{i}", f"is a {type(m).__name__}", "pass Memory objects (Memory.model_validate)"
            )
    now = h.now()  # one instant: the memories of one import given no created_at are made together
    given = [_dated(m, now) for m in given]
    memories = given
    if isinstance(engine, TenantStore):  # a tenant imports into its own tenant, whoever exported
        memories = [
            m if m.tenant == h.tenant else m.model_copy(update={"tenant": h.tenant}) for m in memories
        ]
        renamed = _renames(engine, memories)
    else:  # the owner restores each tenant's memories as that tenant's view would
        renamed = {}
        for tenant in dict.fromkeys(m.tenant for m in memories):
            renamed.update(_renames(TenantStore(engine, tenant), [m for m in memories if m.tenant == tenant]))
    if renamed:
        memories = [_renamed(m, renamed) for m in memories]
    # checked as they will be stored: a sealed original is sealed to its tenant and id, so one moved to
    # this tenant or renamed would never open again
    written_as_new: set[int] = set()  # a restore keeps what did not move as it was; what moved is a write
    for i, (m, was) in enumerate(zip(memories, given, strict=True)):
        _check_created(h, i, m)  # a restore too: a backup's 2099 topped every listing all the same
        moved = (m.tenant, m.id) != (was.tenant, was.id)
        if not restore or moved:
            check(h, i, m, moved)
            written_as_new.add(i)
    _check_parents(h, memories, written_as_new)
    _check_loops(h, memories)
    memories = _expired_as_recorded(memories, written_as_new, now)
    # what a restore gives back unmoved is this store's own, as it was (the version of its last change,
    # which a caller's expected_version is checked against; the token counts of the harness's records);
    # anything else is a write
    as_exported = {m.id for i, m in enumerate(memories) if i not in written_as_new}
    counted = [_counted(m, m.id in as_exported) for m in memories]
    for _ in range(IMPORT_RETRIES - 1):
        try:
            return _write_new(h, counted, as_exported, renamed)
        except ConflictError:
            # another import (or writer) stored some of these ids since they were read: read which, and
            # import the rest (it failed with "memory ... is at version 2, not 1", of no update made)
            continue
    return _write_new(h, counted, as_exported, renamed)


def _write_new(
    h: ImportHost, memories: list[Memory], as_exported: set[str], renamed: dict[str, str]
) -> Imported:
    """Write those of ``memories`` not stored yet, in one write (the import's one try at it)."""
    existing = h.store.get_many([m.id for m in memories])
    fresh = [m for m in memories if m.id not in existing]
    # restored or not: a pin from a file (a hand-edited backup) must hold to what pin() does, at the
    # harness's count of its text
    _check_pins(h, [(i, m) for i, m in enumerate(memories) if m.pinned and m.id not in existing])
    sessions: frozenset[tuple[str, str]] = frozenset()
    if fresh:
        events = [Event(kind=EventKind.IMPORT, memory_id=m.id, tenant=m.tenant, at=h.now()) for m in fresh]
        # redacted like every write; new at the versions they carry; the pinned budgets checked above hold
        # in the write too (another process's pins may have landed since)
        imported = {m.id for m in fresh}
        try:
            stored = h.writer.write(
                fresh,
                None,
                events,
                restored=as_exported,
                imported=imported,
                requires=h.pager.pin_budgets(fresh, h.now()),
            )
        except PinBudgetError as exc:
            raise _refused_pin(memories, exc) from None
        sessions = frozenset((m.tenant, m.session_id) for m in stored if m.session_id is not None)
        h.notify_embedder()
    differing = [m.id for m in memories if m.id in existing and _differs(h, existing[m.id], m)]
    return Imported(len(fresh), renamed, differing, sessions)


def _counted(memory: Memory, restored: bool) -> Memory:
    """``memory`` with the harness's own token count of its text: a count taken from a file (a hand-edited
    backup) put a context over its budget. A restore keeps those of the harness's own records (a grant's,
    a checkpoint's snapshot: 0, as they never enter a prompt)."""
    if restored and (memory.status is Status.INTERNAL or is_snapshot(memory)):
        return memory
    n = count_tokens(memory.content)
    return memory if memory.token_count == n else memory.model_copy(update={"token_count": n})


def _renames(view: TenantStore, memories: list[Memory]) -> dict[str, str]:
    """Each id ``memories`` hold or name that ``view``'s tenant stores under another id: one another tenant
    holds (an owner's restore of a default-tenant backup into a file where a tenant had imported it said
    "1 already present" and restored nothing)."""
    referenced = [r for m in memories for r in (m.id, m.parent_id, *(k.target for k in m.links)) if r]
    return {i: to for i, to in view.import_ids(referenced).items() if i != to}


def check(h: ImportHost, index: int, memory: Memory, moved: bool = False) -> None:
    """What a write checks, for the ``index``-th memory of an import (field ``memories.<index>.*``): its
    status and scope (the import is the application's write) and that its sealed original opens here
    (``moved``: the import gave it this tenant or a new id, to which no original was sealed)."""
    try:
        teams.check_write(h, memory, teams.APPLICATION)
    except ValidationError as exc:
        raise ValidationError(f"memories.{index}.{exc.field}", exc.problem, exc.fix) from None
    _check_sealed(h, index, memory, moved)


def _dated(memory: Memory, now: datetime) -> Memory:
    """``memory``, made ``now`` (the harness's clock) where the caller gave no ``created_at``, as record()
    dates a new memory: the model's default, the machine's clock, was taken for a date ahead of the
    harness's clock (one set to the past: a replay, a test) and refused."""
    return (
        memory if "created_at" in memory.model_fields_set else memory.model_copy(update={"created_at": now})
    )


def _check_created(h: ImportHost, index: int, memory: Memory) -> None:
    """``memory``'s ``created_at`` is not after the harness's clock (by more than the skew record() takes):
    imported, 2099-01-01 stayed the newest memory of every listing and context for good. Refused as the
    clock's state (a 409 over REST): the same import is taken once the clock has passed that time, and a
    request the spec describes is not malformed for a date no schema can bound."""
    problem = ahead_of_clock(memory.created_at, h.now())
    if problem is not None:
        raise StateConflictError(f"memories.{index}.created_at", problem, AHEAD_OF_CLOCK_FIX)


def _expired_as_recorded(memories: list[Memory], writes: set[int], now: datetime) -> list[Memory]:
    """``memories`` with each active one of ``writes`` (indices) past its ``expires_at`` (one that expired
    before it was made among them) stored expired, in the archive tier and unpinned, as record() stores
    such a memory: imported active and pinned, it held its session's pinned budget until a sweep. The
    archived raw copies of its earlier texts among ``writes`` expire with it, as tick() expires them (a
    memory stored expired is never swept: they stayed in reads of archived memories for good). A restore
    keeps what did not move as it was: the backup's round trip is exact, and tick() sweeps it."""
    due = {
        (m.tenant, m.id)
        for i, m in enumerate(memories)
        if i in writes and m.status is Status.ACTIVE and m.expires_at is not None and m.expires_at <= now
    }
    if not due:
        return memories
    return [_expired(m, due) if i in writes else m for i, m in enumerate(memories)]


def _expired(memory: Memory, due: set[tuple[str, str]]) -> Memory:
    """``memory`` as stored when the memories ``due`` (tenant, id) expire: expired itself, or a raw copy
    of one of them."""
    if (memory.tenant, memory.id) in due:
        return memory.model_copy(update={"status": Status.EXPIRED, "tier": Tier.ARCHIVE, "pinned": False})
    raw_of = memory.metadata.get("raw_of")
    if memory.status is Status.ARCHIVED and isinstance(raw_of, str) and (memory.tenant, raw_of) in due:
        return memory.model_copy(update={"status": Status.EXPIRED})
    return memory


def _check_parents(h: ImportHost, memories: list[Memory], checked: set[int]) -> None:
    """Each ``checked`` memory's parent is in the import or stored in its tenant, as record() requires (an
    import stored dangling parents that a write refuses, and the run trace lost their children)."""
    batch = {(m.tenant, m.id) for m in memories}
    wanted = {
        i: m
        for i, m in enumerate(memories)
        if i in checked and m.parent_id and (m.tenant, m.parent_id) not in batch
    }
    stored = h.store.get_many(list({m.parent_id for m in wanted.values() if m.parent_id}))
    for i, m in wanted.items():
        parent = stored.get(m.parent_id or "")
        if parent is None or parent.tenant != m.tenant:
            raise StateConflictError(
                f"memories.{i}.parent_id",
                f"names no memory of the import or of tenant {m.tenant!r} ({m.parent_id})",
                "import the parent with it, or leave parent_id out",
            )


def _check_loops(h: ImportHost, memories: list[Memory]) -> None:
    """No parent chain of the import comes back to a memory it writes: none is its own parent, and none
    descends from itself through others of the import or stored ones (record() and update() refuse both;
    an import stored them, and a run trace walking up from such a memory never reached its root). A loop
    of the file alone is a bad file (a 422); one through stored memories, the store's state (a 409).

    A memory already stored is skipped by the import: its stored parent is the one that holds. Each chain
    is walked once: one that reached a root, or a loop of stored memories only, is not walked again."""
    stored = h.store.get_many([m.id for m in memories])
    written = {(m.tenant, m.id): i for i, m in enumerate(memories) if m.id not in stored}
    parents: dict[tuple[str, str], str | None] = {
        (m.tenant, m.id): m.parent_id for m in memories if (m.tenant, m.id) in written
    }
    parents.update({(m.tenant, m.id): m.parent_id for m in stored.values()})
    settled: set[tuple[str, str]] = set()
    for start in written:
        path: list[tuple[str, str]] = []
        step: tuple[str, str] | None = start
        while step is not None and step not in settled and step not in path:
            path.append(step)
            step = _parent_of(h, step, parents)
        if step is not None and step in path:
            _refuse_loop(memories, written, path[path.index(step) :])
        settled.update(path)


def _parent_of(
    h: ImportHost, key: tuple[str, str], parents: dict[tuple[str, str], str | None]
) -> tuple[str, str] | None:
    """The (tenant, id) of the parent of memory ``key`` (tenant, id), of the import or stored (read once
    into ``parents``); None for a root, or a parent neither holds (:func:`_check_parents` judges those)."""
    if key not in parents:
        found = h.store.get_many([key[1]]).get(key[1])
        parents[key] = found.parent_id if found is not None and found.tenant == key[0] else None
    parent = parents[key]
    return None if parent is None else (key[0], parent)


def _refuse_loop(
    memories: list[Memory], written: dict[tuple[str, str], int], loop: list[tuple[str, str]]
) -> None:
    """Refuse the import for ``loop`` (each memory's parent is the next, the last's the first), naming its
    first memory in the import's order; a loop of stored memories alone is the store's (the import writes
    none of it), left as it is."""
    mine = sorted(written[key] for key in loop if key in written)
    if not mine:
        return
    index = mine[0]
    fix = "name the memory it follows from (not itself or one of its descendants), or leave parent_id out"
    if len(loop) == 1:
        raise ValidationError(f"memories.{index}.parent_id", "is the memory's own id (a cycle)", fix)
    memory = memories[index]
    first = loop.index((memory.tenant, memory.id))
    chain = [key[1] for key in loop[first:] + loop[:first]]
    shown = " -> ".join([*chain, chain[0]] if len(chain) <= LOOP_SHOWN else [*chain[:LOOP_SHOWN], "..."])
    problem = f"{memory.parent_id} descends from this memory (a cycle: {shown})"
    if len(mine) < len(loop):  # through stored memories: the store's state, as update() refuses it
        raise StateConflictError(f"memories.{index}.parent_id", problem, fix)
    raise ValidationError(f"memories.{index}.parent_id", problem, fix)


def _check_pins(h: ImportHost, pinned: list[tuple[int, Memory]]) -> None:
    """The pinned memories of an import hold to what pin() does: working and active, and within each
    session's pinned budget, counting those already pinned there and the import's own."""
    seen: dict[tuple[str, str | None], list[Memory]] = {}
    for index, memory in pinned:
        if memory.tier is not Tier.WORKING or memory.status is not Status.ACTIVE:
            raise ValidationError(
                f"memories.{index}.pinned",
                f"is true for a memory in tier {memory.tier.value}, status {memory.status.value}",
                "a pinned memory is working and active: set pinned to false, or the tier and status",
            )
        before = seen.setdefault((memory.tenant, memory.session_id), [])
        try:
            h.pager.check_pin(memory, h.now(), alongside=before)
        except ValidationError as exc:  # the session's state, not the memory's: a conflict (409 on the API)
            raise StateConflictError(f"memories.{index}.pinned", exc.problem, exc.fix) from None
        before.append(memory)


def _refused_pin(memories: list[Memory], exc: PinBudgetError) -> StateConflictError:
    """The error :func:`_check_pins` gives, for a pinned budget the write itself found exceeded: it names
    the first pinned memory of the import in that session (else the first pinned one: the session as the
    write names it is its stored, redacted, form)."""
    pinned = [(i, m) for i, m in enumerate(memories) if m.pinned]
    budget = exc.budget
    in_session = [i for i, m in pinned if budget is not None and budget.counts(m)]
    index = (in_session or [i for i, _ in pinned] or [0])[0]
    return StateConflictError(f"memories.{index}.pinned", exc.problem, exc.fix)


def _check_sealed(h: ImportHost, index: int, memory: Memory, moved: bool) -> None:
    """``memory``'s sealed original opens here; ``moved``: the import gave it this tenant or a new id."""
    try:
        h.redactor.check_sealed(memory)
    except ValidationError as exc:
        fix = (
            "export it with a key that is not an admin's (no sealed originals), or drop metadata.redaction"
            if moved
            else exc.fix
        )
        raise ValidationError(f"memories.{index}.{exc.field}", exc.problem, fix) from None


def _differs(h: ImportHost, stored: Memory, imported: Memory) -> bool:
    """Whether ``imported`` holds other content than ``stored``, as the write path would have stored it
    (a redacting store keeps the scrubbed text: the file's original is the same memory)."""
    if stored.content == imported.content:
        return False
    return stored.content != h.writer.scrub(imported.content, imported.tenant)


def _renamed(memory: Memory, renamed: dict[str, str]) -> Memory:
    """``memory`` with every reference to an id of ``renamed`` following it: its id, parent and link
    targets, the ids its metadata names (a compressed memory's raw copy, a tool call's result, a revision's
    predecessor) and, in a checkpoint's snapshot, the memories it holds. Left behind, a copy's decompress
    looked for the other tenant's raw copy and its rollback matched none of its memories."""
    changes: dict[str, Any] = {}
    if memory.id in renamed:
        changes["id"] = renamed[memory.id]
    if memory.parent_id in renamed:
        changes["parent_id"] = renamed[memory.parent_id]
    if any(k.target in renamed for k in memory.links):
        changes["links"] = [Link(type=k.type, target=renamed.get(k.target, k.target)) for k in memory.links]
    if (metadata := _swapped(memory.metadata, renamed)) != memory.metadata:
        changes["metadata"] = metadata
    if is_snapshot(memory):
        content = canonical_json(_swapped(json.loads(memory.content), renamed))
        if content != memory.content:
            changes["content"] = content
    return memory.model_copy(update=changes) if changes else memory


def _swapped(value: Any, renamed: dict[str, str]) -> Any:
    """``value`` (JSON) with each string and key that is an id of ``renamed`` replaced by its new id."""
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, dict):
        return {renamed.get(k, k): _swapped(v, renamed) for k, v in value.items()}
    if isinstance(value, list):
        return [_swapped(v, renamed) for v in value]
    return value
