"""What a forget leaves of the parent tree: the forgotten memory's children take its parent.

``parent_id`` names a stored memory of the same tenant (record, update and import check it). Left naming a
memory that was forgotten, a child broke that promise: an export of the tenant could not be imported again
(the import refused the child's parent), and the run trace lost a link. The forgotten memory's own parent
takes its place (a tool result whose call was forgotten hangs from the turn that made the call), or none
for a root.
"""

from __future__ import annotations

from datetime import datetime

from clawvm.core.errors import ConflictError
from clawvm.core.model import Filters, Memory
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.write.commit import Host

#: Children read and re-parented per write.
PAGE = 500
#: Tries of one page whose children change meanwhile (each try reads them again).
RETRIES = 3


def adopt_children_of_forgotten(h: Host, gone: Memory, doomed: frozenset[str] = frozenset()) -> int:
    """Give each stored child of ``gone`` (just forgotten, with ``doomed``) ``gone``'s parent, through the
    write path with an update event each; returns how many it re-parented. A child that changes while
    this runs is read again (:class:`ConflictError` after :data:`RETRIES` tries of one page)."""
    heir = gone.parent_id if gone.parent_id not in doomed else None
    moved = 0
    while True:
        for attempt in range(RETRIES):
            children = [
                c
                for c in h.store.page(Filters(parent_id=gone.id), None, PAGE)
                if c.tenant == gone.tenant and c.id not in doomed
            ]
            if not children:
                return moved
            try:
                h.writer.write([_adopted(c, heir) for c in children], None, _events(children, h.now()))
                break
            except ConflictError:
                if attempt == RETRIES - 1:
                    raise
        moved += len(children)


def _adopted(child: Memory, heir: str | None) -> Memory:
    return child.model_copy(update={"parent_id": heir, "version": child.version + 1})


def _events(children: list[Memory], at: datetime) -> list[Event]:
    return [
        Event(
            kind=EventKind.UPDATE,
            memory_id=c.id,
            data={"fields": ["parent_id"], "version": c.version + 1},
            tenant=c.tenant,
            at=at,
        )
        for c in children
    ]
