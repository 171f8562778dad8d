"""Teams (ConMem): shared memory for several agents — scopes and permissions, append-only revisions,
retention, adoption feedback and the review queue.

Scopes (``Memory.scope``): PRIVATE (only its ``agent_id`` reads it), TEAM (agents allowed to read its
``team_id``), TASK (agents working on its ``task_id``; with a ``team_id``, only those also allowed to read
that team). A memory without a scope is tenant-wide, as before teams existed.

Permissions are per agent and team: :func:`grant` stores ``read``/``write`` for one (team, agent) as a
small memory of its own (kind AGENT_STATE, tag ``clawvm:grant``, status INTERNAL). INTERNAL is the
harness's own bookkeeping: ``Harness.recall``/``list``/``count``/``context`` never return it (not even
with ``status="any"``), only :func:`grants` reads it, and no caller can record, update or revise a memory
into or out of it (a grant changes only through :func:`grant`), so a permission cannot be forged by
writing a look-alike memory. Reads are enforced by the store: :func:`visibility` resolves an agent's
grants into a :class:`~clawvm.core.model.Visibility`, and every engine applies it inside its query
(``Filters.visible_to``), never by filtering results afterwards.

Writes are checked by :func:`check_write`, with one rule everywhere: a scoped memory is written by an
agent, which must be allowed to write it — its own PRIVATE memories, TEAM/TASK memories of a team it has
a write grant on. Who the writer is: the acting agent when the call names one (``revise(agent_id=...)``,
``Harness.update(as_agent=...)``), else the memory's own ``agent_id``; a memory without an agent is the
application's (seeds, fusion) and always writable. ``record`` checks the new memory. ``Harness.update``
(:func:`check_update`) checks the memory as it was and as it will be, so a change can neither touch a
team the writer may not write nor move a memory into one; without ``as_agent``, each version is checked
as written by its own agent, as ``record`` would check it. Moderation by the application itself
(approve/reject, annotations) passes ``as_agent=APPLICATION``: a reviewer must be able to reject the
memory of an agent whose grant was revoked.

Revisions: :func:`revise` never edits a memory's content in place. It appends a new memory linked to the
old one by ``revises`` and marks the old one OBSOLETE (``metadata.superseded_by``), both in one atomic
write that is compare-and-set on the old one's version, so of two writers revising the same head one gets
:class:`ConflictError`. :func:`revise_with_retry` is the caller-side helper: it re-reads the latest head
and re-applies the caller's change function (which merges) until it lands. Recall (status ACTIVE) sees
only the latest revision; :func:`history` returns the whole chain.

Quality: memories with ``confidence`` below ``REVIEW_BELOW`` (or flagged by a conflict) wait in the review
queue (:func:`review_queue`, :func:`approve`, :func:`reject`) and are down-weighted by guidance
(:func:`trust`) until approved. :func:`feedback` counts adoptions and updates usage and value.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from clawvm.core.embed import count_tokens
from clawvm.core.errors import (
    AccessDeniedError,
    ConflictError,
    NotFoundError,
    StateConflictError,
    ValidationError,
)
from clawvm.core.ids import new_id
from clawvm.core.model import (
    MAX_SCOPE_ID_CHARS,
    REPLACED_BY,
    Filters,
    Kind,
    Link,
    LinkType,
    Memory,
    Scope,
    Status,
    Tier,
    Visibility,
    blank_scopes_as_none,
    build_memory,
    counted,
    derived,
    flag,
    is_snapshot,
    moved_on,
    normalize_content,
    refuse_internal,
    refuse_set_by_harness,
    revalidate,
    within,
)
from clawvm.store import Event
from clawvm.store.base import PinBudget, StoreReader
from clawvm.store.crypto import REDACTION_FIELD
from clawvm.store.kinds import EventKind
from clawvm.vm.compress import referenced_raw
from clawvm.vm.context import short_id
from clawvm.vm.tiers import Pager, Unchanged
from clawvm.write.commit import Recorder, past_bookkeeping


class TeamHost(Recorder, Protocol):
    """What team operations need of the harness besides reading and the write path: the pager's value
    formula, the content limit, and its own record/update (which apply the grant checks)."""

    @property
    def pager(self) -> Pager: ...

    @property
    def max_content_bytes(self) -> int: ...

    def notify_embedder(self) -> None: ...


#: Confidence under which a memory enters the review queue (and is down-weighted until approved).
REVIEW_BELOW = 0.5
#: The metadata key of a memory's review (approve() and reject() set it; no caller may).
REVIEW_FIELD = "review"
#: The memory kinds a team shares and fuses.
TEAM_KINDS = (Kind.OBSERVATION, Kind.DECISION, Kind.ERROR, Kind.KNOWLEDGE)
GRANT_TAG = "clawvm:grant"
#: The acting "agent" of the application's own writes (moderation): checked like a write without agent.
APPLICATION = "clawvm:application"
#: The tag of a conflict note (a NOTE): merge_team() sets it, as APPLICATION; no caller may.
CONFLICT_TAG = "conflict"
#: The metadata key of a conflict's sides: merge_team() sets it, as APPLICATION; no caller may.
CONFLICT_FIELD = "conflict"
PITFALL_TAG = "pitfall"
RULE_TAG = "rule"
_GRANT_OWNER = "clawvm:acl"  # the agent grant memories are private to: no real agent reads them
_NAMESPACE = uuid.UUID("3c2b6a52-5d0e-4f7e-9a51-7c1f0e7c2b11")
_IMMUTABLE_IN_REVISION = frozenset(
    {"id", "version", "created_at", "tenant", "scope", "team_id", "status", "content_type", "token_count"}
)


def task_type_tag(task_type: str) -> str:
    """The tag that marks memories learned on tasks of ``task_type`` (guidance matches on it)."""
    if not isinstance(task_type, str) or not task_type.strip():
        raise ValidationError("task_type", f"is {task_type!r}", "name the kind of task (non-blank text)")
    return f"task-type:{task_type.strip().lower()}"


# ---- permissions ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    team_id: str
    agent_id: str
    read: bool
    write: bool


def stored_id(h: TeamHost, value: str) -> str:
    """A team or agent id as the write path stores it (a secret-looking id is redacted, one stored form per
    original): grants are kept, looked up and compared in that form, like the memories they govern."""
    return h.writer.identifier(value, h.tenant)


def _grant_id(tenant: str, team_id: str, agent_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"grant\x00{tenant}\x00{team_id}\x00{agent_id}"))


def grant(h: TeamHost, team_id: str, agent_id: str, *, read: bool = True, write: bool = False) -> Grant:
    """Set ``agent_id``'s permissions on ``team_id`` (replacing earlier ones; both False revokes)."""
    for name, v in (("team_id", team_id), ("agent_id", agent_id)):
        if not isinstance(v, str) or not v.strip():
            raise ValidationError(name, f"is {v!r}", "pass a non-empty string")
        if "\x00" in v:  # the grant's id joins the two with NUL: ("t", "x\0y") would be ("t\0x", "y")'s
            raise ValidationError(name, "holds a NUL character", "name teams and agents without one")
        if len(v) > MAX_SCOPE_ID_CHARS:  # granted, no memory could name that agent or team: unusable
            raise ValidationError(
                name, f"is {len(v)} characters long", f"use at most {MAX_SCOPE_ID_CHARS}, as memories do"
            )
    read, write = flag("read", read), flag("write", write)  # "no" is truthy: it granted write access
    if write and not read:
        raise ValidationError("read", "is False while write is True", "writers must be able to read")
    team_id, agent_id = stored_id(h, team_id), stored_id(h, agent_id)
    g = Grant(team_id, agent_id, bool(read), bool(write))
    gid = _grant_id(h.tenant, team_id, agent_id)
    body = {"team_id": team_id, "agent_id": agent_id, "read": g.read, "write": g.write}
    for _ in range(20):
        current = h.store.get_many([gid]).get(gid)
        fields: dict[str, Any] = {
            "id": gid,
            "content": f"grant {agent_id} on team {team_id}: read={g.read} write={g.write}",
            "kind": Kind.AGENT_STATE,
            "status": Status.INTERNAL,
            "tenant": h.tenant,
            "scope": Scope.PRIVATE,
            "agent_id": _GRANT_OWNER,
            "team_id": team_id,
            "tags": [GRANT_TAG],
            "tier": Tier.ARCHIVE,
            "metadata": {"grant": body},
            "created_at": h.now() if current is None else current.created_at,
            "version": 1 if current is None else current.version + 1,
        }
        try:
            h.writer.write(
                [build_memory(fields)],
                None,
                [Event(kind=EventKind.GRANT, memory_id=gid, tenant=h.tenant, at=h.now(), data=body)],
            )
            return g
        except ConflictError:
            continue
    raise ConflictError(gid, None, None)


def grants(h: TeamHost, team_id: str | None = None) -> list[Grant]:
    """Every grant of this tenant (of one team, if given)."""
    team = None if team_id is None else stored_id(h, team_id)
    f = Filters.of(
        tenant=h.tenant, tags=[GRANT_TAG], kind=Kind.AGENT_STATE, status=Status.INTERNAL, team_id=team
    )
    out = []
    for m in h.store.iter_all(f):
        body = m.metadata.get("grant", {})
        out.append(Grant(body["team_id"], body["agent_id"], bool(body["read"]), bool(body["write"])))
    return sorted(out, key=lambda g: (g.team_id, g.agent_id))


def _agent_grants(h: TeamHost, agent_id: str) -> list[Grant]:
    agent = stored_id(h, agent_id)
    return [g for g in grants(h) if g.agent_id == agent]


def visibility(h: TeamHost, agent_id: str, tasks: Iterable[str] = ()) -> Visibility:
    """What ``agent_id`` may read, working on ``tasks``: pass it as ``visible_to=`` to any query."""
    if not isinstance(agent_id, str) or not agent_id.strip():
        raise ValidationError("agent_id", f"is {agent_id!r}", "name the agent whose reads these are")
    # a string is iterable: "ab" read as the tasks "a" and "b", and showed their memories
    if isinstance(tasks, str | bytes) or not isinstance(tasks, Iterable):
        raise ValidationError("tasks", f"is {tasks!r}", "pass a list of task ids, e.g. tasks=[task_id]")
    tasks = list(tasks)
    if not all(isinstance(t, str) for t in tasks):
        raise ValidationError("tasks", f"holds {tasks!r}", "pass task ids as strings")
    readable = frozenset(g.team_id for g in _agent_grants(h, agent_id) if g.read)
    return Visibility(stored_id(h, agent_id), readable, frozenset(stored_id(h, t) for t in tasks if t))


def can_write(h: TeamHost, agent_id: str, team_id: str) -> bool:
    # every team write asks this: read the one grant record by its id instead of listing them all
    team, agent = stored_id(h, team_id), stored_id(h, agent_id)
    gid = _grant_id(h.tenant, team, agent)
    stored = h.store.get_many([gid]).get(gid)
    if stored is None or stored.status is not Status.INTERNAL or GRANT_TAG not in stored.tags:
        return False
    body = stored.metadata.get("grant", {})
    # the record must be this pair's, not one whose names join to the same id
    return body.get("team_id") == team and body.get("agent_id") == agent and bool(body.get("write"))


def check_scope(memory: Memory) -> None:
    """A scoped memory names what its scope needs (its agent, team or task)."""
    needs = {Scope.PRIVATE: "agent_id", Scope.TEAM: "team_id", Scope.TASK: "task_id"}
    if memory.scope is not None and getattr(memory, needs[memory.scope]) is None:
        name = needs[memory.scope]
        raise ValidationError(name, f"is missing for a {memory.scope.value} memory", f"pass {name}=...")


def check_write(
    h: TeamHost, memory: Memory, agent_id: str | None = None, *, was: Memory | None = None
) -> None:
    """Raise :class:`AccessDeniedError` unless ``agent_id`` (default: the memory's own agent) may write
    ``memory``, as it will be stored (``was``: the stored memory it replaces or revises; None for a new
    one): :func:`check_access`, and a conflict mark only the harness sets (:func:`refuse_forged_conflict`)."""
    check_access(h, memory, agent_id)
    refuse_forged_conflict(memory, agent_id, was)


def check_access(h: TeamHost, memory: Memory, agent_id: str | None = None) -> None:
    """Raise :class:`AccessDeniedError` unless ``agent_id`` (default: the memory's own agent) may write
    ``memory``. Writes without an agent, or by :data:`APPLICATION`, are the application's own (seeds,
    fusion, moderation) and allowed. INTERNAL memories are written by this module only."""
    check_scope(memory)
    if memory.status is Status.INTERNAL:
        raise ValidationError(
            "status",
            "internal is reserved for the harness's own records (team grants)",
            "use active, archived, obsolete or expired; change grants with harness.grant()",
        )
    writer = agent_id or memory.agent_id
    # APPLICATION counts only as the acting agent a caller names, never as a memory's own agent_id
    # a memory that names a team joins that team's fusion and guidance whatever its scope: writing one
    # takes the team's write grant (a read-only agent left the scope out and got its decision in)
    if writer is None or agent_id == APPLICATION or (memory.scope is None and memory.team_id is None):
        return
    if memory.scope is Scope.PRIVATE:
        owner = None if memory.agent_id is None else stored_id(h, memory.agent_id)
        if owner != stored_id(h, writer):
            raise AccessDeniedError(
                "agent_id", f"{writer!r} may not write {memory.agent_id!r}'s private memory", "share it first"
            )
        # a private memory that names a team still takes the grant (it went into the team's review queue)
    if memory.team_id is not None and not can_write(h, writer, memory.team_id):
        raise AccessDeniedError(
            "team_id",
            f"agent {writer!r} may not write to team {memory.team_id!r}",
            f"grant it: harness.grant({memory.team_id!r}, {writer!r}, write=True)",
        )


def check_update(h: TeamHost, before: Memory, after: Memory, agent_id: str | None = None) -> None:
    """An update may go ahead: its writer may write ``before`` and ``after`` (see the module's rule)."""
    refuse_internal(before)
    check_access(h, before, agent_id)
    check_write(h, after, agent_id, was=before)


def _flagged(m: Memory) -> bool:
    """Whether ``m`` is a conflict note (as open_conflicts(), review queue, resolve_conflict() read it)."""
    return m.kind is Kind.NOTE and CONFLICT_TAG in m.tags


def refuse_forged_conflict(memory: Memory, agent_id: str | None, was: Memory | None = None) -> None:
    """A conflict mark (the ``conflict`` tag on a note, ``metadata.conflict``) set or changed by any writer
    but the harness (merge_team() flags as :data:`APPLICATION`) is a :class:`ValidationError`: a note an
    agent forged naming another team's memory as a side was queued for review, and a lead who resolved it
    rejected that memory. ``was``: the stored memory ``memory`` replaces or revises, whose mark it may
    keep as it is (or drop: that closes nothing of another team's, as archiving the note would not)."""
    if agent_id == APPLICATION:
        return
    given = memory.metadata.get(CONFLICT_FIELD, _ABSENT)
    if given is not _ABSENT and (was is None or given != was.metadata.get(CONFLICT_FIELD, _ABSENT)):
        raise ValidationError(
            f"metadata.{CONFLICT_FIELD}",
            "is set by merge_team() when it flags a conflict",
            "leave it out: the harness sets it",
        )
    if _flagged(memory) and (was is None or not _flagged(was)):
        raise ValidationError(
            "tags",
            f"hold {CONFLICT_TAG!r} on a note: merge_team() flags conflicts",
            f"leave the {CONFLICT_TAG!r} tag out, or record another kind of memory",
        )


def record(
    h: TeamHost,
    content: Any,
    *,
    agent_id: str,
    kind: Kind | str = Kind.OBSERVATION,
    team_id: str | None = None,
    task_id: str | None = None,
    scope: Scope | str | None = None,
    task_type: str | None = None,
    subject: str | None = None,
    **fields: Any,
) -> Memory:
    """Record a team memory as ``agent_id``: TEAM scope when a team is given, else PRIVATE (or ``scope``).

    ``task_type`` tags it so guidance for later tasks of that type finds it; ``subject`` names what a
    DECISION/KNOWLEDGE is about (fusion flags two different ones on the same subject as a conflict).
    """
    # a scope given is checked by record() with every other field (Scope(...) here raised a bare ValueError)
    scope = scope if scope is not None else (Scope.TEAM if team_id else Scope.PRIVATE)
    tags = fields.pop("tags", None) or []
    if not isinstance(tags, list | tuple):  # list("urgent") stored one tag a letter
        raise ValidationError("tags", f"is a {type(tags).__name__}", "pass a list of tags, e.g. ['urgent']")
    tags = list(tags)
    metadata = fields.pop("metadata", None) or {}
    if not isinstance(metadata, Mapping):
        raise ValidationError("metadata", f"is a {type(metadata).__name__}", "pass a JSON object (a dict)")
    metadata = dict(metadata)
    if task_type is not None:
        tags.append(task_type_tag(task_type))
        metadata["task_type"] = task_type
    if subject is not None:
        if not isinstance(subject, str) or not subject.strip():
            raise ValidationError(
                "subject", f"is {subject!r}", "name what the memory is about (non-blank text)"
            )
        metadata["subject"] = subject
    return h.record(
        content,
        kind=kind,
        agent_id=agent_id,
        team_id=team_id,
        task_id=task_id,
        scope=scope,
        tags=tags,
        metadata=metadata,
        **fields,
    )


# ---- revisions --------------------------------------------------------------------------------------------
def successor(m: Memory) -> str | None:
    """The memory that replaced ``m`` (a newer revision, or the merge it went into), if any."""
    nxt = next((m.metadata[k] for k in REPLACED_BY if m.metadata.get(k)), None)
    return str(nxt) if nxt and m.status is Status.OBSOLETE else None


# Per store: memory id -> the newest revision of its chain seen so far. Only a shortcut: the walk always
# goes on forward from there, so a stale entry costs a few hops, never a wrong answer.
_HEADS: weakref.WeakKeyDictionary[StoreReader, dict[str, str]] = weakref.WeakKeyDictionary()
_HEADS_LOCK = threading.Lock()
_HEADS_SIZE = 100_000


def latest(h: TeamHost, memory_id: str) -> Memory:
    """The current head of ``memory_id``'s revision chain (itself if it was never revised)."""
    with _HEADS_LOCK:
        heads = _HEADS.setdefault(h.store, {})
        hint = heads.get(memory_id)
    m = h.store.get_many([hint]).get(hint) if hint is not None else None  # hints are never deleted rows...
    if m is None:  # ...but a forgotten one is possible: start from the id itself
        m = h.store.get(memory_id)
    m = (_walk(h, m, successor) or [m])[-1]
    if hint is not None and m.id != memory_id and m.status is Status.OBSOLETE:
        # the hint may be past the head: a rollback obsoletes the revisions made since its checkpoint and
        # makes an older one the head again, so a chain can shrink; the walk from the id itself is exact
        start = h.store.get_many([memory_id]).get(memory_id)
        if start is not None:
            m = (_walk(h, start, successor) or [start])[-1]
    if m.id != memory_id:
        with _HEADS_LOCK:
            if len(heads) > _HEADS_SIZE:
                heads.clear()
            heads[memory_id] = m.id
    return m


def latest_if_kept(h: TeamHost, memory_id: str) -> Memory | None:
    """:func:`latest`, or None when the memory was forgotten (a conflict note keeps naming its sides)."""
    try:
        return latest(h, memory_id)
    except NotFoundError:
        return None


def close_conflicts_of_forgotten(h: TeamHost, memory: Memory) -> list[Memory]:
    """Close the open conflicts ``memory`` (as it was before it was forgotten) was a side of, once a side
    has no head left to keep or reject (left open, each was offered for review and named a side no read
    could find). A live head stands for its chain and its merge's sources (:func:`lineage`). Called after
    the chain is mended: a side whose newest revision was forgotten has its earlier one as head again, and
    its conflict stays open (closed, both contradicting decisions were active and never flagged again)."""
    sides = lineage(memory) if memory.status is Status.ACTIVE else {memory.id}
    return [
        _close_conflict(h, note, "resolved", APPLICATION, f"{memory.id} forgotten")
        for note in open_conflicts(h, involving=sides)
        if None in side_heads(h, note).values()
    ]


def root_id(m: Memory) -> str:
    """The first revision of ``m``'s chain (stable across revisions)."""
    return str(m.metadata.get("revision", {}).get("root", m.id))


def lineage(m: Memory) -> set[str]:
    """Every id ``m`` stands for: itself, its chain's root and, for a merge of duplicates, each source (and
    its root): a conflict flagged between two memories is about whatever merge or revision replaced them."""
    out = {m.id, root_id(m)}
    for source in m.metadata.get("provenance", []):
        out.update(str(source[k]) for k in ("id", "root") if isinstance(source, dict) and source.get(k))
    return out


def conflict_sides(note: Memory) -> set[str]:
    """Ids and chain roots of the memories a conflict note is about."""
    info = note.metadata.get("conflict", {})
    return {str(i) for i in [*info.get("ids", []), *info.get("roots", [])]}


def conflict_choices(note: Memory) -> list[str]:
    """The sides a person can keep: the memories the conflict was flagged on (not their chains' roots,
    which are older revisions of those same sides)."""
    return [str(i) for i in note.metadata.get("conflict", {}).get("ids", [])]


def previous(m: Memory) -> str | None:
    return next((link.target for link in m.links if link.type is LinkType.REVISES), None)


def history(h: TeamHost, memory_id: str) -> list[Memory]:
    """Every revision of ``memory_id``'s chain, oldest first (the last one is the head): the revisions it
    replaced, itself, and what replaced it since. A merge joins several chains into one head; the history
    of one of its sources is that source's own chain up to the merge, not another source's."""
    start = h.store.get(memory_id)
    refuse_internal(start)
    earlier = _walk(h, start, previous)
    later = _walk(h, start, successor)
    return [*reversed(earlier), start, *later]


def _walk(h: TeamHost, start: Memory, step: Callable[[Memory], str | None]) -> list[Memory]:
    """The memories reached from ``start`` by ``step`` (not ``start`` itself), until it leads nowhere,
    to a forgotten memory, or back to one already reached."""
    reached: list[Memory] = []
    seen = {start.id}
    m = start
    while (nxt := step(m)) is not None and nxt not in seen:
        found = h.store.get_many([nxt]).get(nxt)
        if found is None:
            break
        seen.add(nxt)
        reached.append(found)
        m = found
    return reached


def build_revision(
    h: TeamHost, current: Memory, changes: Mapping[str, Any], extra_links: Iterable[Link] = ()
) -> tuple[Memory, Memory]:
    """(``current`` marked OBSOLETE at its next version, the new revision) — nothing written yet."""
    bad = _IMMUTABLE_IN_REVISION.intersection(changes)
    if bad:
        name = sorted(bad)[0]
        raise ValidationError(name, "cannot change in a revision", "record a new memory instead")
    changes = dict(changes)
    given = changes.get("metadata")
    if (
        isinstance(given, Mapping)
        and REVIEW_FIELD in given
        and given[REVIEW_FIELD] != current.metadata.get(REVIEW_FIELD)
    ):  # a writer approved its own low-confidence memory past the review queue
        raise ValidationError(
            f"metadata.{REVIEW_FIELD}",
            "is set by approve() or reject()",
            "leave it out: the harness keeps it",
        )
    metadata = changes.pop("metadata", current.metadata)
    if not isinstance(metadata, Mapping):
        raise ValidationError("metadata", f"is a {type(metadata).__name__}", "pass a JSON object (a dict)")
    metadata = dict(metadata)
    # the old revision's redaction mark describes its text and is sealed to its id: the write path marks
    # the new revision's text itself
    metadata.pop(REDACTION_FIELD, None)
    if "content" in changes:
        text, ctype = normalize_content(changes["content"], h.max_content_bytes)
        changes.update(content=text, content_type=ctype, token_count=count_tokens(text))
        metadata.pop("compression", None)  # the new text is not a summary of the old raw copy
        if text != current.content:  # a review approved the old text, not this one: it waits for its own
            metadata.pop(REVIEW_FIELD, None)
    for key in REPLACED_BY:
        metadata.pop(key, None)
    info = current.metadata.get("revision", {})
    metadata["revision"] = {
        "root": info.get("root", current.id),
        "number": int(info.get("number", 1)) + 1,
        "previous": current.id,
    }
    given_links = changes.pop("links", current.links)
    if not isinstance(given_links, list | tuple):
        raise ValidationError("links", f"is a {type(given_links).__name__}", "pass a list of links")
    # a link given as {"type", "target"} (as record() takes it) is validated with the revision below
    links = [link for link in given_links if _link_type(link) != LinkType.REVISES]
    links = [*links, Link(type=LinkType.REVISES, target=current.id), *extra_links]
    # the status goes on as it was (revise refuses obsolete and expired ones): a revision of an archived
    # memory (a closed conflict note, an error folded into a pitfall) is archived too; made active, it
    # reopened the conflict, or counted the error again
    own = {"id": new_id(), "version": 1, "created_at": h.now(), "status": current.status}
    new = derived(current, {**changes, **own, "links": links, "metadata": metadata})
    if new.pinned and new.tier is not Tier.WORKING:  # a pin lives in the prompt (as record() refuses it)
        raise ValidationError(
            "tier",
            f"is {new.tier.value!r} on a pinned memory",
            "leave tier out, or unpin the memory first: a pinned memory is working",
        )
    if takes_pin_room(current, new):  # as update() checks a pinned memory growing or moving
        h.pager.check_pin(new, h.now(), replacing=current.id)
    new = new.model_copy(update={"value": h.pager.value_now(new, h.now())})
    old = current.model_copy(
        update={
            "status": Status.OBSOLETE,
            "pinned": False,  # obsolete leaves the prompt; its pin passes to the new revision
            "version": current.version + 1,
            "metadata": {**current.metadata, "superseded_by": new.id},
        }
    )
    return old, new


def takes_pin_room(current: Memory, new: Memory) -> bool:
    """Whether revision ``new`` of ``current`` is a pinned memory grown or moved to another session: it must
    fit its session's pinned budget, as update() holds a pinned memory that grows or moves to it."""
    moved = new.session_id != current.session_id
    return new.pinned and (moved or new.token_count > current.token_count)


def revision_pins(h: TeamHost, old: Memory, new: Memory) -> tuple[PinBudget, ...]:
    """The precondition of writing revision ``new`` with ``old`` (from :func:`build_revision`) obsoleted:
    a pinned memory grown or moved stays within its session's pinned budget, checked in the write itself,
    where two processes cannot both pass it (the check in :func:`build_revision` reads before the write)."""
    return h.pager.pin_budget(new, h.now()) if takes_pin_room(old, new) else ()


def _link_type(link: object) -> object:
    """The type of a link given as a :class:`Link` or as the mapping record() also takes."""
    return link.type if isinstance(link, Link) else link.get("type") if isinstance(link, Mapping) else None


def revise(
    h: TeamHost,
    memory_id: str,
    *,
    agent_id: str | None = None,
    expected_version: int | None = None,
    **changes: Any,
) -> Memory:
    """Append a revision of ``memory_id`` with ``changes``; returns the new head (the head as it is when
    ``changes`` change nothing: no revision is appended).

    Raises :class:`ConflictError` when ``memory_id`` is no longer the head or (with ``expected_version``)
    has moved on; :class:`AccessDeniedError` when ``agent_id`` may not write it.
    """
    current = h.store.get(memory_id)
    if current.status is Status.OBSOLETE:
        head = latest(h, memory_id).id
        raise ConflictError(
            memory_id,
            expected_version,
            current.version,
            f"memory {memory_id!r} is not the head of its revision chain any more (the head is {head!r}):"
            " revise the head, or use revise_with_retry"
            if head != memory_id
            else f"memory {memory_id!r} is obsolete (rejected, or rolled back): make it active first",
            field="memory_id",
            fix=f"revise the head, {head!r}, or use revise_with_retry"
            if head != memory_id
            else "make it active first (update its status), or revise another memory",
        )
    if expected_version is not None and moved_on(current, expected_version):
        raise ConflictError(memory_id, expected_version, current.version)
    changes = _revision_changes(h, current, changes)
    check_access(h, current, agent_id or current.agent_id)
    # a revision is kept for good: one that changes nothing would be noise in the chain, so the head is
    # answered as it is (as a PATCH that changes nothing is); after the access checks, so that the answer
    # tells one who may not write nothing of the content
    if all(getattr(current, name, _ABSENT) == value for name, value in changes.items()):
        return current
    return past_bookkeeping(
        current, lambda: h.store.get(memory_id), lambda read: _append_revision(h, read, agent_id, changes)
    )


_ABSENT = object()  # no such field: differs from any value


def _revision_changes(h: TeamHost, current: Memory, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` as a revision of ``current`` takes them (revise and revise_with_retry alike): what the
    harness sets is refused, a blank scope id is none, and a memory only the harness may change refuses."""
    refuse_internal(current)
    refuse_set_by_harness(changes)
    refuse_frozen(h, current)
    return blank_scopes_as_none(dict(changes))


def refuse_frozen(h: TeamHost, memory: Memory) -> None:
    """:class:`StateConflictError` for a memory only the harness may change or revise: a checkpoint's
    snapshot (a rollback reads it as it was taken) or the raw copy a compressed memory decompresses to
    (decompress would return the change as the original text)."""
    if is_snapshot(memory):
        raise StateConflictError(
            "memory_id",
            f"{memory.id} is the snapshot of checkpoint {memory.metadata.get('checkpoint')!r}",
            "roll back to it, or forget it to drop the checkpoint",
        )
    owners = referenced_raw(h.store, memory)
    if owners:
        raise StateConflictError(
            "memory_id",
            f"{memory.id} is the raw content of compressed memory {owners[0]}",
            f"change {owners[0]} instead, or decompress it first",
        )


def _append_revision(
    h: TeamHost, current: Memory, agent_id: str | None, changes: Mapping[str, Any]
) -> Memory:
    """Write a revision of ``current`` as read (the write is compare-and-set on its version)."""
    if current.status is Status.OBSOLETE:
        raise ConflictError(current.id, current.version, current.version)
    if current.status is Status.EXPIRED or (current.expires_at is not None and current.expires_at <= h.now()):
        # a revision would bring text back that its TTL promised to forget
        raise StateConflictError("memory_id", f"{current.id} has expired", "record a new memory instead")
    old, new = build_revision(h, current, changes)
    # the writer must be able to write the revision too: a change of its agent made another agent's
    # private memory (revise_with_retry's change returned agent_id)
    check_access(h, new, agent_id or current.agent_id)
    # the harness is only the acting agent a caller names, never a memory's own agent_id (as check_access)
    refuse_forged_conflict(new, agent_id, current)
    event = Event(
        kind=EventKind.REVISE,
        memory_id=new.id,
        tenant=new.tenant,
        at=h.now(),
        data={"revises": old.id, "number": new.metadata["revision"]["number"], "agent_id": agent_id},
    )
    # compare-and-set on old: one revision per head
    written = h.writer.write([old, new], None, [event], requires=revision_pins(h, old, new))
    h.notify_embedder()
    return written[1]


def revise_with_retry(
    h: TeamHost,
    memory_id: str,
    change: Callable[[Memory], Mapping[str, Any]],
    *,
    agent_id: str | None = None,
    attempts: int = 500,
) -> Memory:
    """Revise the latest head of ``memory_id`` with ``change(head)``, retrying on conflicts.

    ``change`` receives the current head and returns the fields to change: on a conflict it is called
    again with the newer head, so it must merge (append to, count from) what it sees rather than
    overwrite with a value computed earlier. That is what keeps concurrent updates from being lost.
    """
    if not callable(change):
        fix = "pass a function of the head that returns the fields to change"
        raise ValidationError("change", f"is {type(change).__name__}", fix)
    attempts = counted("attempts", attempts)
    head = latest(h, memory_id)
    for attempt in range(attempts):
        # each try: a revision never changes scope or team, but a grant revoked while the tries go on
        # must stop the next one (checked once, a revoked writer's retry landed seconds later)
        check_access(h, head, agent_id or head.agent_id)
        # what revise() refuses, this refuses too (it pinned past the budget, revised a checkpoint's
        # snapshot, and retried a rejected head for seconds before a bare conflict)
        if head.status is Status.OBSOLETE:  # the newest of its chain: rejected or rolled back
            raise ConflictError(
                head.id,
                None,
                head.version,
                f"memory {head.id!r} is obsolete (rejected, or rolled back): make it active first",
                field="memory_id",
                fix="make it active first (update its status), or revise another memory",
            )
        asked = change(head)
        if not isinstance(asked, Mapping):
            fix = "return a dict of the fields to change, e.g. {'content': ...}"
            raise ValidationError("change", f"returned {type(asked).__name__}", fix)
        changes = _revision_changes(h, head, asked)
        try:
            return _append_revision(h, head, agent_id, changes)
        except ConflictError:
            time.sleep(random.uniform(0, min(0.02, 0.0005 * 2 ** min(attempt, 8))))  # jitter breaks lockstep
            head = latest(h, head.id)
    raise ConflictError(head.id, None, head.version)  # it kept changing: the caller passed no version


# ---- retention --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetentionPolicy:
    """When active team memories are archived (never deleted): older than ``max_age[kind]``, or worth
    less than ``min_value`` right now. Pinned memories are kept."""

    max_age: Mapping[str, timedelta] = field(default_factory=dict)
    min_value: float | None = None
    kinds: tuple[Kind, ...] = TEAM_KINDS

    def __post_init__(self) -> None:
        # checked here: a number of days given as 30 failed apply_retention with a raw TypeError
        if not isinstance(self.max_age, Mapping):
            raise ValidationError("max_age", f"is {self.max_age!r}", "pass {kind: timedelta(days=N)}")
        # kinds by name or Kind (a name read as a Kind raised AttributeError)
        if isinstance(self.kinds, str) or not isinstance(self.kinds, Iterable):
            fix = "pass a tuple of kinds, e.g. (Kind.DECISION,)"
            raise ValidationError("kinds", f"is {self.kinds!r}", fix)
        try:
            object.__setattr__(self, "kinds", tuple(Kind(k) for k in self.kinds))
        except ValueError as exc:
            raise ValidationError("kinds", str(exc), f"use kinds among {[k.value for k in Kind]}") from None
        kept = {k.value for k in self.kinds}
        for kind, limit in self.max_age.items():
            if kind not in kept:  # another kind's entry would do nothing: apply_retention reads only these
                fix = f"use one of {sorted(kept)}"
                raise ValidationError(f"max_age.{kind}", "is not among the kinds this policy keeps", fix)
            if not isinstance(limit, timedelta) or limit <= timedelta(0):
                raise ValidationError(
                    f"max_age.{kind}", f"is {limit!r}", "pass a positive timedelta, e.g. timedelta(days=30)"
                )
        if self.min_value is not None:
            within("min_value", self.min_value, 0.0, 1.0, "pass a value between 0 and 1, or None")


def apply_retention(h: TeamHost, policy: RetentionPolicy, *, team_id: str | None = None) -> list[Memory]:
    """Archive what ``policy`` says is past keeping; returns the archived memories."""
    now = h.now()
    team = None if team_id is None else stored_id(h, team_id)
    f = Filters.of(tenant=h.tenant, status=Status.ACTIVE, kind=list(policy.kinds), team_id=team)
    archived = []
    for m in list(h.store.iter_all(f)):
        if m.pinned:
            continue
        limit = policy.max_age.get(m.kind.value)
        reason = None
        if limit is not None and now - m.created_at > limit:
            reason = f"older than {limit}"
        elif policy.min_value is not None and (v := h.pager.value_now(m, now)) < policy.min_value:
            reason = f"value {v:.3f} under {policy.min_value}"
        if reason is None:
            continue
        event = Event(EventKind.RETENTION, m.id, {"reason": reason}, tenant=m.tenant, at=now)
        # the archive and its event in one write; re-read after another writer's change, a memory pinned or
        # settled meanwhile is left as it is
        moved = h.pager.mutate(m, _archived_by_retention, now, event=_logging(event))
        if moved.status is Status.ARCHIVED:
            archived.append(moved)
    return archived


def _logging(event: Event) -> Callable[[Memory, Memory], Event]:
    """A :meth:`Pager.mutate` event that is ``event`` whatever the change."""
    return lambda _before, _after: event


def _archived_by_retention(current: Memory) -> dict[str, Any]:
    if current.pinned or current.status is not Status.ACTIVE:
        raise Unchanged
    return {"status": Status.ARCHIVED, "tier": Tier.ARCHIVE}


# ---- adoption feedback ------------------------------------------------------------------------------------
def adoption(m: Memory) -> tuple[int, int]:
    """(adopted, not adopted) counts from :func:`feedback`."""
    a = m.metadata.get("adoption", {})
    return int(a.get("adopted", 0)), int(a.get("rejected", 0))


def adoption_rate(m: Memory) -> float | None:
    adopted, rejected = adoption(m)
    return None if adopted + rejected == 0 else adopted / (adopted + rejected)


def feedback(h: TeamHost, memory_id: str, adopted: bool) -> Memory:
    """An agent adopted (or ignored) a piece of guidance: count it and update usage and value.

    Adopted: usage ``injected`` +1, ``cited`` +1, ``feedback`` +1; not adopted: ``injected`` +1,
    ``feedback`` -1 — so the value's cite term follows the adoption rate. Applies to the latest revision.
    """
    for _ in range(50):
        head = latest(h, memory_id)
        refuse_internal(head)
        a, r = adoption(head)
        u = head.usage
        usage = u.model_copy(
            update={
                "injected": u.injected + 1,
                "cited": u.cited + int(adopted),
                "feedback": u.feedback + (1 if adopted else -1),
            }
        )
        counts = {"adopted": a + int(adopted), "rejected": r + int(not adopted)}
        metadata = {**head.metadata, "adoption": counts}
        changed = revalidate(head, {"usage": usage, "metadata": metadata, "version": head.version + 1})
        changed = changed.model_copy(update={"value": h.pager.value_now(changed, h.now())})
        event = Event(
            kind=EventKind.FEEDBACK,
            memory_id=head.id,
            tenant=head.tenant,
            at=h.now(),
            data={"adopted": adopted},
        )
        try:
            return h.writer.write([changed], None, [event])[0]
        except ConflictError:
            continue
    raise ConflictError(memory_id, None, None)


# ---- review queue -----------------------------------------------------------------------------------------
def review_state(m: Memory) -> str | None:
    """``approved``, ``rejected``, ``pending`` (flagged), or None (never reviewed)."""
    state = m.metadata.get(REVIEW_FIELD, {}).get("status")
    return str(state) if state else None


def needs_review(m: Memory, below: float = REVIEW_BELOW) -> bool:
    if m.status is not Status.ACTIVE:
        return False
    state = review_state(m)
    if state in ("approved", "rejected"):
        return False
    return state == "pending" or m.confidence < below or CONFLICT_TAG in m.tags


def trust(m: Memory, below: float = REVIEW_BELOW) -> float:
    """How much guidance believes ``m``: 1 once approved; its confidence, halved while it awaits review."""
    if review_state(m) == "approved":
        return 1.0
    return m.confidence * (0.5 if needs_review(m, below) else 1.0)


def review_queue(
    h: TeamHost, *, below: float = REVIEW_BELOW, team_id: str | None = None, agent_id: str | None = None
) -> list[Memory]:
    """Active memories awaiting review (low confidence, flagged, or open conflicts), least trusted first.
    With ``agent_id``, only what that agent may read."""
    vis = visibility(h, agent_id) if agent_id else None
    kinds = [*TEAM_KINDS, Kind.NOTE]
    team = None if team_id is None else stored_id(h, team_id)
    f = Filters.of(tenant=h.tenant, status=Status.ACTIVE, kind=kinds, team_id=team, visible_to=vis)
    queue = [m for m in h.store.iter_all(f) if needs_review(m, below)]
    return sorted(queue, key=lambda m: (m.confidence, m.created_at))


def _set_review(
    h: TeamHost, m: Memory, state: str, by: str | None, reason: str | None, **changes: Any
) -> Memory:
    """Record a review on ``m`` (the head of its chain, as read: the update is compare-and-set)."""
    review = {"status": state, "by": by, "at": h.now().isoformat(), "reason": reason}
    updated = h.update(
        m.id,
        expected_version=m.version,
        as_agent=APPLICATION,
        metadata={**m.metadata, REVIEW_FIELD: review},
        **changes,
    )
    return updated  # its review's event was written with it (review_events)


def review_events(before: Memory, after: Memory, at: datetime) -> list[Event]:
    """The ``review.*`` event of a write that gives ``after`` a new review (:func:`approve`,
    :func:`reject`, a conflict's resolution), to be written with it: a review stored without its event, or
    logged for a change that never landed, is what writing them apart could leave."""
    review = after.metadata.get(REVIEW_FIELD)
    if not isinstance(review, dict) or review == before.metadata.get(REVIEW_FIELD):
        return []
    kind = _REVIEW_KINDS.get(str(review.get("status")))
    if kind is None:  # a review the application set itself in another state ("pending"): no such event
        return []
    return [Event(kind=kind, memory_id=after.id, tenant=after.tenant, at=at, data=dict(review))]


#: The review states that have their own event (approve(), reject(), a conflict's resolution).
_REVIEW_KINDS = {
    "approved": EventKind.REVIEW_APPROVED,
    "rejected": EventKind.REVIEW_REJECTED,
    "resolved": EventKind.REVIEW_RESOLVED,
}


def approve(h: TeamHost, memory_id: str, *, by: str | None = None, reason: str | None = None) -> Memory:
    """Approve a memory (guidance stops down-weighting it). Approving an open conflict note closes it as
    "not a conflict": both sides are kept. Approving an approved memory again changes nothing: the first
    approval, its reviewer and reason, stand (a second replaced them, its reviewer None when unnamed)."""
    _check_reviewer(by, reason)
    m = latest(h, memory_id)
    if CONFLICT_TAG in m.tags and m.kind is Kind.NOTE:
        _refuse_closed(m)
        _refuse_foreign_sides(m, side_heads(h, m).values())
        return _close_conflict(h, m, "approved", by, reason or "both sides kept")
    if m.status is Status.OBSOLETE and review_state(m) == "rejected":  # the rejection overturned
        return _set_review(h, m, "approved", by, reason, status=Status.ACTIVE)
    if m.status is Status.ACTIVE and review_state(m) == "approved":
        return m
    _refuse_unreviewable(m)
    return _set_review(h, m, "approved", by, reason)


def reject(h: TeamHost, memory_id: str, *, by: str | None = None, reason: str | None = None) -> Memory:
    """Reject a memory: it becomes OBSOLETE (kept for history, never recalled) and any open conflict it
    is a side of is closed."""
    _check_reviewer(by, reason)
    m = latest(h, memory_id)
    if CONFLICT_TAG in m.tags and m.kind is Kind.NOTE:
        _refuse_closed(m)
        _refuse_foreign_sides(m, side_heads(h, m).values())
        return _close_conflict(h, m, "rejected", by, reason or "not a conflict")
    if m.status is Status.OBSOLETE and review_state(m) == "rejected":
        return m  # a double click: the first rejection, its reviewer and reason, stand
    _refuse_unreviewable(m)
    rejected = _set_review(h, m, "rejected", by, reason, status=Status.OBSOLETE)
    for note in open_conflicts(h, involving=lineage(m)):  # a side's revision or merge stands for it
        _close_conflict(h, note, "resolved", by, f"{m.id} rejected")
    return rejected


def _check_reviewer(by: str | None, reason: str | None) -> None:
    """A review's reviewer is None (unnamed) or a name; ``by=""`` stored a reviewer no view could show."""
    if by is not None and (not isinstance(by, str) or not by.strip() or len(by) > MAX_SCOPE_ID_CHARS):
        raise ValidationError("by", f"is {by!r:.80}", "name the reviewer (a non-blank name), or leave it out")
    if reason is not None and not isinstance(reason, str):
        raise ValidationError("reason", f"has type {type(reason).__name__}", "give the reason as text")


def _refuse_closed(note: Memory, field: str = "memory_id") -> None:
    """A closed conflict note is not reviewed or resolved again: approving one resolved for a side rewrote
    it as "both sides kept" while the other side stayed rejected; resolving it the other way left both
    sides obsolete."""
    if note.status is not Status.ACTIVE:
        review = note.metadata.get(REVIEW_FIELD, {})
        raise StateConflictError(
            field,
            f"conflict {note.id} is closed ({review.get('status', note.status.value)})",
            "revise the kept decision instead, or record a new one",
        )


def _refuse_unreviewable(m: Memory) -> None:
    """Only an active memory is approved or rejected (a rejected one may be approved: that overturns the
    rejection): reviewing another replaced who had rejected it and why, or approved what stayed obsolete."""
    if m.status is not Status.ACTIVE:
        was = review_state(m)
        raise StateConflictError(
            "memory_id",
            f"{m.id} is {m.status.value}" + (f" ({was})" if was else ""),
            "only active memories are reviewed"
            + ("; approve it to overturn the rejection" if was == "rejected" else ""),
        )


def resolve_conflict(h: TeamHost, conflict_id: str, *, keep: str, by: str | None = None) -> Memory:
    """Keep one side of a conflict (approved) and reject the others; returns the kept memory."""
    _check_reviewer(by, None)
    # the errors name conflict_id, the argument the caller got wrong (they named memory_id)
    if not isinstance(conflict_id, str):
        raise ValidationError(
            "conflict_id", f"is a {type(conflict_id).__name__}", "pass a conflict note's id"
        )
    note = h.store.get_many([conflict_id]).get(conflict_id)
    if note is None:
        raise NotFoundError("conflict note", conflict_id, field="conflict_id")
    if CONFLICT_TAG not in note.tags or note.kind is not Kind.NOTE:  # it said "keep ... is not a side"
        raise ValidationError(
            "conflict_id",
            f"{conflict_id} is not a conflict note",
            "pass the id of a note open_conflicts() lists",
        )
    _refuse_closed(note, "conflict_id")
    if not isinstance(keep, str):
        raise ValidationError("keep", f"is a {type(keep).__name__}", "pass the id of the side to keep")
    # a side revised since the conflict was flagged is named by its head too (what the views show now); a
    # forgotten one is no choice
    kept_heads = side_heads(h, note)
    _refuse_foreign_sides(note, kept_heads.values(), "conflict_id")
    sides = [side for side, head in kept_heads.items() if head is not None]
    heads = {head.id: side for side, head in kept_heads.items() if head is not None}
    keep = heads.get(keep, keep)
    if keep not in sides:  # the short id the note's text shows (``[1a2b3c4d]``), of a side or its head
        keep = _side_of_short_id(keep, heads) or keep
    if keep not in sides:
        raise ValidationError(
            "keep", f"{keep!r} is not a side of conflict {conflict_id}", f"pass one of {sorted(heads)}"
        )
    # the kept side first: when it cannot be approved (expired since), nothing is written; rejected first,
    # the other side was gone and the note closed before that refusal
    kept = approve(h, keep, by=by, reason=f"kept in conflict {conflict_id}")
    for side in sides:
        # a side that expired or left since is out already (and refuses changes): nothing to reject
        if side != keep and (other := kept_heads[side]) is not None and _live(h, other):
            reject(h, other.id, by=by, reason=f"conflict {conflict_id} resolved for {keep}")
    if (still := h.store.get(conflict_id)).status is Status.ACTIVE:  # no rejection closed it
        _close_conflict(h, still, "resolved", by, f"{keep} kept")
    return kept


def side_heads(h: TeamHost, note: Memory) -> dict[str, Memory | None]:
    """Each side a person can keep of conflict ``note`` -> its chain's head (None: forgotten), which a
    resolution approves or rejects."""
    return {side: latest_if_kept(h, side) for side in conflict_choices(note)}


def _refuse_foreign_sides(note: Memory, heads: Iterable[Memory | None], field: str = "memory_id") -> None:
    """:class:`StateConflictError` for a conflict note with a side (``heads``) not shared with the note's
    readers (:func:`partition_key`): merge_team() flags only memories fused together, in their partition,
    so such a note was written past the write path (an agent forged one naming another team's memory, and
    the lead who resolved it rejected that memory). Checked before anything is written. The note's state
    is what is wrong, not the reviewer's rights: no review of it is sound."""
    readers = partition_key(note)
    foreign = next((m for m in heads if m is not None and partition_key(m) != readers), None)
    if foreign is not None:
        raise StateConflictError(
            field,
            f"conflict {note.id} names {foreign.id}, which its readers do not share (not merge_team()'s)",
            f"forget the note (harness.forget({note.id!r})); review {foreign.id} on its own if needed",
        )


def _side_of_short_id(given: str, heads: Mapping[str, str]) -> str | None:
    """The one conflict side (``heads``: head id -> side) whose id or head's id has the short id
    ``given``; None when none or several have it."""
    wanted = given.strip().strip("[]").lower()
    found = {side for head, side in heads.items() if wanted in (short_id(head), short_id(side))}
    return found.pop() if len(found) == 1 else None


def _live(h: TeamHost, m: Memory) -> bool:
    """Active and not past its expiry (which a tick may not have marked yet)."""
    return m.status is Status.ACTIVE and (m.expires_at is None or m.expires_at > h.now())


def open_conflicts(
    h: TeamHost, *, involving: Collection[str] | None = None, visible_to: Visibility | None = None
) -> list[Memory]:
    """The open conflict notes (newest first), those with a side among the ids ``involving`` only."""
    if isinstance(involving, str | bytes):  # one id, read as its characters, matched nothing
        raise ValidationError("involving", f"is {involving!r}", "pass a collection of ids, e.g. [memory_id]")
    f = Filters.of(
        tenant=h.tenant, status=Status.ACTIVE, kind=Kind.NOTE, tags=[CONFLICT_TAG], visible_to=visible_to
    )
    notes = h.store.iter_all(f, newest_first=True)
    return [n for n in notes if involving is None or not conflict_sides(n).isdisjoint(involving)]


def _close_conflict(h: TeamHost, note: Memory, state: str, by: str | None, reason: str) -> Memory:
    return _set_review(h, note, state, by, reason, status=Status.ARCHIVED)


def partition_key(m: Memory) -> tuple[str | None, ...]:
    """Memories that may be fused together share this: the same readers (scope, team, task, owner)."""
    owner = m.agent_id if m.scope is Scope.PRIVATE else None
    task = m.task_id if m.scope is Scope.TASK else None
    return (m.tenant, m.scope.value if m.scope else None, m.team_id, task, owner)
