"""Forgetting a memory of a revision chain keeps the chain whole (see :func:`mend_chain_of_forgotten`):
the revisions and merges of :mod:`clawvm.teams.shared` name what they replaced, and a forgotten link
between them left the memories before it obsolete for good."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clawvm.core.errors import ConflictError
from clawvm.core.model import CHAIN_LINKS, REPLACED_BY, Link, LinkType, Memory, Status
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.teams.shared import TeamHost, successor

#: tries of :func:`mend_chain_of_forgotten` when its memories keep changing under it
MEND_RETRIES = 5


def mend_chain_of_forgotten(h: TeamHost, gone: Memory) -> list[Memory]:
    """Keep the chain of ``gone`` (as it was before it was forgotten) whole; returns what it rewrote.
    The memories ``gone`` replaced (its previous revision, a merge's sources) named it as their successor:
    left so, they were obsolete for good, out of every recall, and each change of theirs was refused with
    "change the head of its chain", a head that no longer was. Forgotten as the head, they are the head
    again, with its status (:func:`_status_as_head`). Forgotten inside the chain, they name its
    successor instead, which names them in its place, so that :func:`history` walks through. A memory
    that changes meanwhile is read again (:class:`ConflictError` after :data:`MEND_RETRIES` tries)."""
    for attempt in range(MEND_RETRIES):
        mends = _mended_chain(h, gone)
        if not mends:
            return []
        at = h.now()
        events = [
            Event(
                kind=EventKind.UPDATE,
                memory_id=m.after.id,
                data={"fields": m.fields(), "version": m.after.version},
                tenant=m.after.tenant,
                at=at,
            )
            for m in mends
        ]
        try:
            return h.writer.write([m.after for m in mends], None, events)
        except ConflictError:
            if attempt == MEND_RETRIES - 1:
                raise
    return []


@dataclass(frozen=True)
class _Mend:
    """One memory of a forgotten memory's chain, as read and as the mending rewrites it."""

    before: Memory
    after: Memory

    def fields(self) -> list[str]:
        return [
            f for f in ("links", "metadata", "status") if getattr(self.before, f) != getattr(self.after, f)
        ]


def _mended_chain(h: TeamHost, gone: Memory) -> list[_Mend]:
    """The rewrites :func:`mend_chain_of_forgotten` makes, read now (none when nothing names ``gone``)."""
    targets = [link.target for link in gone.links if link.type in CHAIN_LINKS]
    found = h.store.get_many(targets)
    # in the order gone names them (its revised memory first)
    replaced = [found[t] for t in dict.fromkeys(targets) if t in found and _named_key(found[t], gone.id)]
    if not replaced:
        return []
    heir_id = successor(gone)
    heir = None if heir_id is None else h.store.get_many([heir_id]).get(heir_id)
    out = []
    for m in replaced:
        key = _named_key(m, gone.id)
        assert key is not None
        metadata = {k: v for k, v in m.metadata.items() if k != key}
        update: dict[str, Any] = {"version": m.version + 1, "metadata": metadata}
        if heir is None:  # the head again, as the revision or merge had never been
            update["status"] = _status_as_head(gone)
        else:
            metadata[key] = heir.id
        out.append(_Mend(m, m.model_copy(update=update)))
    if heir is not None:
        out.append(_Mend(heir, _in_place_of(heir, gone, replaced)))
    return out


def _status_as_head(gone: Memory) -> Status:
    """The status a memory takes when ``gone``, the head that replaced it, is forgotten: the head's, as a
    revision took its memory's, when the chain was active or archived; active otherwise (a head rejected
    or expired said so of its own text, not of the one before it; and a head whose successor was
    forgotten at the same time, by another caller, is read as obsolete)."""
    return gone.status if gone.status in (Status.ACTIVE, Status.ARCHIVED) else Status.ACTIVE


def _named_key(m: Memory, successor_id: str) -> str | None:
    """The :data:`REPLACED_BY` key by which obsolete ``m`` names ``successor_id``, if it does."""
    if m.status is not Status.OBSOLETE:
        return None
    return next((k for k in REPLACED_BY if m.metadata.get(k) == successor_id), None)


def _in_place_of(heir: Memory, gone: Memory, replaced: list[Memory]) -> Memory:
    """``heir`` (the successor of forgotten ``gone``) naming ``replaced`` (what ``gone`` replaced) where it
    named ``gone``, each link in the place of the one to ``gone``: a revision of ``gone`` revises what
    ``gone`` revised and derives from the sources ``gone`` merged; a merge that took ``gone`` in derives
    from them all. The heir's other links (a merge's sources, links a caller gave) stay as they were."""
    links: list[Link] = []
    for link in heir.links:
        if link.type not in CHAIN_LINKS or link.target != gone.id:
            links.append(link)
            continue
        for m in replaced:
            revised = _named_key(m, gone.id) == "superseded_by" and link.type is LinkType.REVISES
            links.append(Link(type=LinkType.REVISES if revised else LinkType.DERIVED_FROM, target=m.id))
    metadata = dict(heir.metadata)
    info = metadata.get("revision")
    if isinstance(info, dict) and info.get("previous") == gone.id:
        metadata["revision"] = {**info, "previous": gone.metadata.get("revision", {}).get("previous")}
    unique = list({(link.type, link.target): link for link in links}.values())
    return heir.model_copy(update={"links": unique, "metadata": metadata, "version": heir.version + 1})
