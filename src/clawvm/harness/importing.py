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
from typing import Any, Protocol

from clawvm.core.embed import count_tokens
from clawvm.core.errors import ConflictError, StateConflictError, ValidationError
from clawvm.core.model import Link, Memory, Status, Tier, canonical_json
from clawvm.store import Event, PinBudgetError, Store
from clawvm.store.kinds import EventKind
from clawvm.store.tenant import TenantStore
from clawvm.teams import shared as teams
from clawvm.vm.context import is_snapshot
from clawvm.write.redaction import Redactor

#: How often an import reads which of its ids are stored and writes the rest, when another writer stored
#: some of them in between (two imports of one file, side by side)
IMPORT_RETRIES = 5


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
        moved = (m.tenant, m.id) != (was.tenant, was.id)
        if not restore or moved:
            check(h, i, m, moved)
            written_as_new.add(i)
    _check_parents(h, memories, written_as_new)
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
