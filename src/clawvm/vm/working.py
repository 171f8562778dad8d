"""The record path's view of each session's working tier, and the periodic pager that keeps it in budget.

``record()`` never demotes (the pager runs periodically, like an operating system's, not inside each
allocation): :meth:`WorkingTiers.admit` writes the new memory alone and adds it to its view of the session's
working tier; a session past the high watermark (``PagerConfig.working_high`` of its budget) comes *due*.
:meth:`WorkingTiers.run_pass` (the pager pass) pages every due session out to the low watermark
(``working_low``), and each tier below it sheds into, one tier down likewise (a record made straight into
a tier below working makes its session due too); :class:`PagerThread` runs it in the background when a
session comes due, and the harness runs it at every lifecycle boundary (``context()``, ``flush()``,
``tick()``, ``close()``). A tracked recall's promotions grow the working tier the same way: the recall
leaves its bookkeeping (its hits' access counts and promotions, its event) to the next pass, as an operating
system's pager harvests the accessed bits (:meth:`WorkingTiers.accessed`, then :meth:`WorkingTiers.harvest`
at the start of the pass: one write for all the recalls since the last, each access counted on the memory
as stored by then), or writes it itself with ``PagerConfig(defer_access=False)`` (:meth:`WorkingTiers.warm`).
So a working tier may hold more than its budget between a record or a recall and the next pass, never
after it; a built context never exceeds its own budget whatever the tiers hold. The pass pages the memories
a recall just warmed out last, and a pass that fails leaves the sessions it did not finish due, and the
bookkeeping it did not write pending, for the next one. Pending bookkeeping lives in this process until
that pass: a crash loses access counts (never a memory), and other processes see them after it.

:class:`WorkingTiers` keeps each session's working members as it last saw them, so a record does not read
the tier back. The commit path tells it of every write (:meth:`WorkingTiers.forget`, a commit listener), as
stored: the view takes each written memory in (when it is an active working member of a session it holds) or
out (when it left its tier, its status or its session), so a pager pass does not make the session's next
record read the tier back (~0.7 ms at 100k memories, on one record in five of a busy session); a delete
drops the whole view (the deleted ids name no session).

Members *added* by another process (several servers on one store) are not seen until this process reads
the session again (after any change it is told of, or when the session falls out of the view): until then
the session's working tier can hold more than its budget by what the others added; the next enforce (any
move in the session, a context build with the session, ``tick()`` paging out) brings it back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from clawvm.core.model import Memory, Status, Tier
from clawvm.store import Event
from clawvm.store.base import StoreReader
from clawvm.vm.tiers import Access, Pager, WarmPartlyWritten

#: Memories (or recall events) whose recalls' bookkeeping may wait for a pass (``WorkingTiers.accessed``):
#: past it, a recall writes it itself (a harness with no background pager and no lifecycle boundary).
ACCESS_BUFFER = 1024

#: Sessions whose working tier is remembered between records (each costs ~25 memories); a session beyond
#: it is read back from the store on its next record (~0.3 ms at 100k memories).
WORKING_SESSIONS = 8192


class WorkingTiers:
    """Each session's working members, as this process last wrote or read them, and the sessions due for
    a pager pass (see the module docstring)."""

    def __init__(self, store: StoreReader, pager: Pager, capacity: int = WORKING_SESSIONS) -> None:
        self.store = store
        self.pager = pager
        self.capacity = capacity
        # (tenant, session) -> its working-tier members; the dict keeps recently used sessions last
        self._members: dict[tuple[str, str], list[Memory]] = {}
        # memory id -> the session whose members hold it (a write may move a memory to another session)
        self._session_of: dict[str, tuple[str, str]] = {}
        # sessions due for the next pass (past the high watermark, or a tier below grew), oldest first
        self._due: dict[tuple[str, str], _Due] = {}
        self._lock = threading.RLock()  # held by admit while it writes, and so while it is told of it
        self._pass_lock = threading.Lock()  # one pager pass at a time (background or a lifecycle boundary)
        # records in flight, and the background pass's deadline for giving way to them (see recording())
        self._in_flight = 0
        self._last_record_end = 0.0  # monotonic time the last record in flight ended
        self._quiet = threading.Lock()  # guards the two above
        self._give_way_until: float | None = None  # set while a background pass runs; its thread's alone
        # whether a foreground call waits for the pass to finish (the harness's turns): then it stops giving
        # way, or that call would wait for the records too
        self.foreground_waiting: Callable[[], bool] = lambda: False
        self._pass_thread: int | None = None
        pager.give_way = self._give_way
        # tracked recalls' bookkeeping waiting for the next pass (see accessed()): per memory, and the events
        self._accesses: dict[str, Access] = {}
        self._access_events: list[Event] = []
        self._access_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._members)

    def due(self) -> list[tuple[str, str]]:
        """The (tenant, session) pairs due for the next pager pass."""
        with self._lock:
            return list(self._due)

    def any_due(self) -> bool:
        """Whether any session is due (every record asks: no copy of the due list, which a pager behind
        a busy writer makes thousands long)."""
        with self._lock:
            return bool(self._due)

    def mark_due(self, tenant: str, session_id: str) -> None:
        """Make the session due for the next pager pass: a change this view did not see grow it (a rollback
        brings memories back to the working tier), so no pass knew it was over budget."""
        with self._lock:
            self._members.pop((tenant, session_id), None)  # read back by the pass: the rollback rewrote it
            self._mark((tenant, session_id), lower_grew=True)

    def members(self, tenant: str, session_id: str) -> list[Memory] | None:
        """The session's working members as this view holds them; None when it holds none for it."""
        with self._lock:
            known = self._members.get((tenant, session_id))
            return None if known is None else list(known)

    def forget(self, written: Sequence[Memory], deleted: Sequence[str]) -> None:
        """Commit listener: each written memory (as stored) leaves the members it was in and joins its
        session's, when this view holds that session and the memory is an active working member; a delete
        drops the whole view (the deleted ids name no session)."""
        with self._lock:
            if deleted:
                self._members.clear()
                self._session_of.clear()
            for m in written:
                was = self._session_of.pop(m.id, None)
                if was is not None and was in self._members:
                    self._members[was] = [x for x in self._members[was] if x.id != m.id]
                if m.session_id is None or m.tier is not Tier.WORKING or m.status is not Status.ACTIVE:
                    continue
                key = (m.tenant, m.session_id)
                if key in self._members:
                    self._members[key] = [*self._members[key], m]
                    self._session_of[m.id] = key

    def _hold(self, key: tuple[str, str], members: list[Memory] | None = None) -> list[Memory]:
        """Make the session the most recently used one, with ``members`` when given (read from the store),
        forgetting the oldest session past capacity. Returns its members."""
        held = self._members.pop(key, None)
        if members is None:
            assert held is not None
            members = held
        elif len(self._members) >= self.capacity:  # a long-lived server meets endless sessions
            for m in self._members.pop(next(iter(self._members))):
                self._session_of.pop(m.id, None)
        self._members[key] = members
        if held is None:
            for m in members:
                self._session_of[m.id] = key
        return members

    def admit(self, memory: Memory, vectors: np.ndarray | None, added: Event, now: datetime) -> Memory:
        """Write the new ``memory`` (its vector, its event) alone: one write, never a demotion. Its session
        comes due for the pager when its working tier passes the high watermark. Returns it as stored. A
        pinned one is written within its session's pinned budget (:meth:`Pager.pin_budget`), or refused."""
        writer = self.pager.writer
        requires = self.pager.pin_budget(memory, now) if memory.pinned else ()
        if memory.session_id is None or memory.tier is not Tier.WORKING:
            stored = writer.write([memory], vectors, [added], requires=requires)[0]
            if (
                stored.session_id is not None
                and stored.tier in _BUDGETED_BELOW
                and stored.status is Status.ACTIVE
            ):
                with self._lock:  # recorded straight into a tier below working: the pass checks that tier
                    self._mark((stored.tenant, stored.session_id), lower_grew=True)
            return stored
        with self._lock:
            # the listener adds it to a session held
            stored = writer.write([memory], vectors, [added], requires=requires)[0]
            if stored.session_id is None:
                return stored
            # the stored session id: redaction may have changed a secret-looking one
            key = (stored.tenant, stored.session_id)
            if key in self._members:
                members = self._hold(key)
            else:  # a session not held (first seen, or forgotten): read back, this memory included
                members = self._hold(
                    key, self.pager.tier_members(stored.tenant, stored.session_id, Tier.WORKING)
                )
            if self.pager.due(members):
                self._mark(key)
            return stored

    def warm(
        self,
        memories: Sequence[Memory],
        now: datetime,
        events: Sequence[Event] = (),
        accesses: Mapping[str, Access] | None = None,
    ) -> list[Memory]:
        """A recall's access bookkeeping and promotions (:meth:`Pager.warm`), written now, which never
        demote: as for a record, a session that the promotions put past its high watermark comes due for
        the pager, which pages the memories just warmed out last (a session not held comes due unchecked:
        the pass reads it and leaves it when it is within). Returns the memories as stored."""
        warmed = self.pager.warm(memories, now, events, accesses)
        with self._lock:  # the commit listener has added the promoted members to the sessions held
            for key, ids in warmed.grown.items():
                held = self._members.get(key)
                if held is None or self.pager.due(held):
                    self._mark(key, ids)
        return warmed.memories

    def accessed(self, memories: Sequence[Memory], now: datetime, events: Sequence[Event] = ()) -> bool:
        """A tracked recall's hits (as it read them) and its ``events``, for the next pass to write
        (:meth:`harvest`): ``PagerConfig.defer_access``. True when ``ACCESS_BUFFER`` memories or events are
        pending (no pass ran: no background pager, no lifecycle boundary): the caller should harvest them
        itself."""
        with self._access_lock:
            for m in memories:
                access = Access(1, now, m.version)
                seen = self._accesses.get(m.id)
                self._accesses[m.id] = access if seen is None else seen.then(access)
            self._access_events.extend(events)
            return max(len(self._accesses), len(self._access_events)) >= ACCESS_BUFFER

    def accesses_pending(self) -> bool:
        """Whether recalls' bookkeeping waits for the next pass."""
        with self._access_lock:
            return bool(self._accesses or self._access_events)

    def harvest(self, now: datetime) -> list[Memory]:
        """Write the bookkeeping of the recalls since the last harvest: each memory's access count grows by
        the times it was recalled, from its current stored version (it may have changed since the recall
        read it; one deleted since counts nothing), in one write with the recalls' events; promotions make
        their sessions due as :meth:`warm`'s do; a recall made before someone changed a memory (archived it,
        moved it by hand) counts, but does not promote it. Returns the memories as stored. Runs at the start
        of every pass; a write that failed before writing anything leaves the bookkeeping pending for the
        next one (one that failed part way through is not retried: nothing is counted twice)."""
        with self._access_lock:
            accesses, self._accesses = self._accesses, {}
            events, self._access_events = self._access_events, []
        if not accesses and not events:
            return []
        try:
            current = self.store.get_many(list(accesses))
            memories = [current[i] for i in accesses if i in current]
            return self.warm(memories, now, events, accesses)
        except WarmPartlyWritten:
            raise
        except Exception:
            with self._access_lock:  # back in front of what came meanwhile, counts added up
                for memory_id, seen in accesses.items():
                    later = self._accesses.get(memory_id)
                    self._accesses[memory_id] = seen if later is None else seen.then(later)
                self._access_events[:0] = events
            raise

    def _mark(
        self, key: tuple[str, str], warmed: frozenset[str] = frozenset(), lower_grew: bool = False
    ) -> None:
        """Make the session due (the caller holds the lock), adding to why it already is."""
        why = self._due.setdefault(key, _Due())
        why.warmed |= warmed
        why.lower_grew |= lower_grew

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Around a ``record()``: a background pager pass gives way while one is in flight, or one ended
        less than ``PagerConfig.give_way_quiet_ms`` ago (records come first; a pass overlapping them made
        them wait on the GIL and the store's lock, the record p95's tail)."""
        with self._quiet:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._quiet:  # no notify: the waiting pass polls (woken at each record, it cost ~0.3 ms)
                self._in_flight -= 1
                self._last_record_end = time.monotonic()

    def _give_way(self) -> None:
        """The pager's step boundary: in a background pass, wait (GIL released) until records have been
        quiet for ``give_way_quiet_ms`` (none in flight, none ended since), or until the pass's give-way time
        is spent; anywhere else, return at once. Waiting out the quiet time, not only the record in flight,
        keeps a burst of records (an import, a tool loop) from meeting a step of the pass between each two
        of them."""
        until = self._give_way_until
        if until is None or self._pass_thread != threading.get_ident():
            return
        quiet_s = self.pager.config.give_way_quiet_ms / 1000.0
        while not self.foreground_waiting():
            with self._quiet:
                in_flight, last_end = self._in_flight, self._last_record_end
            now = time.monotonic()
            if now >= until:
                return
            quiet_left = last_end + quiet_s - now
            if not in_flight and quiet_left <= 0:
                return
            # polls: a few times per quiet time at most, every millisecond while a record is in flight
            time.sleep(min(max(quiet_left, 0.001), until - now))

    def run_pass(self, now: datetime, give_way_s: float = 0.0) -> list[Memory]:
        """One pager pass: every due session's working tier is paged out to the low watermark and the tiers
        below are enforced. Returns the memories moved. A pass waits for one already running.
        ``give_way_s``: the most this pass waits, in all, for records in flight (a background pass)."""
        with self._pass_lock:
            if give_way_s > 0:
                self._give_way_until = time.monotonic() + give_way_s
                self._pass_thread = threading.get_ident()
            try:
                self._give_way()
                try:
                    self.harvest(now)  # promotions among them make their sessions due for this pass
                except Exception:  # the due sessions are paged out all the same; then the caller hears of it
                    self._page_due(now)
                    raise
                return self._page_due(now)
            finally:
                self._give_way_until = self._pass_thread = None

    def _page_due(self, now: datetime) -> list[Memory]:
        with self._lock:
            due, self._due = self._due, {}
        moved: list[Memory] = []
        try:
            self._give_way()  # the read back below holds the view's lock, which records need
            with self._lock:
                self._read_back([key for key in due if key not in self._members])
            for key in list(due):
                with self._lock:  # the view's members (None: forgotten past capacity meanwhile, read again)
                    held = self._members.get(key)
                    working = None if held is None else list(held)
                why = due[key]
                tenant, session_id = key
                # due because its working tier grew (records, promotions): the tiers below need a look
                # only when it sheds into them, or when a record went straight into one of them
                moved.extend(
                    self.pager.enforce(
                        tenant,
                        session_id,
                        now,
                        protect=frozenset(why.warmed),
                        to_low=True,
                        working=working,
                        working_grew=not why.lower_grew,
                    )
                )
                del due[key]
        finally:
            if due:  # a failed pass: the sessions it did not finish stay due for the next one
                with self._lock:
                    for key, why in due.items():
                        self._mark(key, frozenset(why.warmed), why.lower_grew)
        return moved

    def _read_back(self, sessions: Sequence[tuple[str, str]]) -> None:
        """Read the working tiers of ``sessions`` (one query per tenant, not one per session: a recall's
        promotions make several due at once) and hold them; the caller holds the lock, so no commit's
        notice reaches the view between the read and the hold."""
        for tenant in sorted({t for t, _ in sessions}):
            mine = sorted(s for t, s in sessions if t == tenant)
            for session_id, members in self.pager.working_of(tenant, mine).items():
                self._hold((tenant, session_id), members)


@dataclass(slots=True)
class _Due:
    """Why a session is due: the ids a recall warmed in it (paged out last), and whether a tier below
    working grew too (a record straight into it), so that the pass checks the tiers below."""

    warmed: set[str] = field(default_factory=set)
    lower_grew: bool = False


_BUDGETED_BELOW = (Tier.SHORT_TERM, Tier.LONG_TERM)  # the tiers below working that have budgets


class Turns:
    """The harness's exclusive turns, taken by its pager passes and by the calls that rewrite a memory they
    read: a re-entrant lock that counts the callers waiting for it, so that a background pass giving way to
    records (:meth:`WorkingTiers._give_way`) stops doing so as soon as a foreground call (``context()``, an
    update, ``close()``) waits behind it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._counting = threading.Lock()
        self.waiting = 0

    def __enter__(self) -> Turns:
        if self._lock.acquire(blocking=False):
            return self
        with self._counting:
            self.waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._counting:
                self.waiting -= 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class PagerThread:
    """Runs ``run`` (a pager pass) in a background thread each time it is woken; passes do not queue up:
    wakes while a pass runs make one more pass after it. Errors go to ``on_error`` (the thread lives on)."""

    def __init__(self, run: Callable[[], object], on_error: Callable[[Exception], None]) -> None:
        self._run = run
        self._on_error = on_error
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def wake(self) -> None:
        with self._start_lock:
            if self._stopping:
                return
            if self._thread is None:  # started on the first wake: a harness that never fills a tier has none
                self._thread = threading.Thread(target=self._loop, name="clawvm-pager", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """Let a running pass finish and end the thread (the caller runs the last pass itself)."""
        with self._start_lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._run()
            except Exception as exc:  # a background pass must never die silently; the next wake retries
                self._on_error(exc)
