"""The record path's view of each session's working tier: admit a new memory and shed what no longer fits,
in one write, without reading the tier back on every record.

:class:`WorkingTiers` keeps each session's working members as it last saw them. The commit path tells it
of every write (:meth:`WorkingTiers.forget`, a commit listener), and a session whose memories changed is
read back from the store on its next record, so the view is never trusted past a change it was told of. A
member changed by another process makes the record's write conflict (optimistic versions); then the memory
is written alone and the budgets are enforced from the store.

Members *added* by another process (several servers on one store) are not seen until this process reads
the session again (after any change it is told of, or when the session falls out of the view): until then
the session's working tier can hold more than its budget by what the others added; the next enforce (any
move in the session, a context build with the session, ``tick()`` paging out) brings it back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

import numpy as np

from clawvm.core.errors import ConflictError
from clawvm.core.model import Memory, Tier
from clawvm.store import Event
from clawvm.store.base import StoreReader
from clawvm.vm.tiers import Pager

#: Sessions whose working tier is remembered between records (each costs ~25 memories); a session beyond
#: it is read back from the store on its next record (~0.3 ms at 100k memories).
WORKING_SESSIONS = 8192


class WorkingTiers:
    """Each session's working members, as this process last wrote or read them (see the module docstring)."""

    def __init__(self, store: StoreReader, pager: Pager, capacity: int = WORKING_SESSIONS) -> None:
        self.store = store
        self.pager = pager
        self.capacity = capacity
        # (tenant, session) -> its working-tier members; the dict keeps recently used sessions last
        self._members: dict[tuple[str, str], list[Memory]] = {}
        self._lock = threading.RLock()  # held by admit while it writes, and so while it is told of it

    def __len__(self) -> int:
        return len(self._members)

    def forget(self, written: Sequence[Memory], deleted: Sequence[str]) -> None:
        """Commit listener: a session's members are dropped when one of its memories changed (read back on
        its next record); a delete drops them all (the deleted ids name no session)."""
        with self._lock:
            if deleted:
                self._members.clear()
            for m in written:
                if m.session_id is not None:
                    self._members.pop((m.tenant, m.session_id), None)

    def admit(self, memory: Memory, vectors: np.ndarray | None, added: Event, now: datetime) -> Memory:
        """Write the new ``memory`` (its vector, its event) with what its session's working tier sheds to
        make room for it: one write, one commit on engines with transactions. Returns it as stored."""
        writer = self.pager.writer
        if memory.session_id is None or memory.tier is not Tier.WORKING:
            return writer.write([memory], vectors, [added])[0]
        key = (memory.tenant, memory.session_id)
        with self._lock:
            known = self._members.pop(key, None)  # re-inserted below, as the most recent
            if known is None:
                known = self.pager.tier_members(memory.tenant, memory.session_id, Tier.WORKING)
                if len(self._members) >= self.capacity:  # a long-lived server meets endless sessions
                    del self._members[next(iter(self._members))]
            members = [*known, memory]
            demoted, moves = self.pager.shed_plan(members, now)
            # the new memory may be shed at once (the lowest value per token): then it is stored demoted
            # (version 2) and its history says so (add, then demote)
            others = [m for m in demoted if m.id != memory.id]
            shed = next((m for m in demoted if m.id == memory.id), memory)
            try:
                stored = writer.write([shed, *others], vectors, [added, *moves])[0]
            except ConflictError:
                if not others:
                    raise  # the new memory itself conflicts (its id is taken)
                writer.write([memory], vectors, [added])
                self.pager.enforce(memory.tenant, memory.session_id, now)
                self._members[key] = self.pager.tier_members(memory.tenant, memory.session_id, Tier.WORKING)
                return self.store.get(memory.id)
            members = [stored if m.id == stored.id else m for m in members]
            if demoted:  # short-term grew: its budget, and the ones below
                self.pager.enforce(memory.tenant, memory.session_id, now, lower_only=True)
                gone = {m.id for m in demoted}
                members = [m for m in members if m.id not in gone]
            self._members[key] = members
            return stored
