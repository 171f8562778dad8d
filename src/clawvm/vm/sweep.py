"""The pager's periodic pass (``Harness.tick``): expiry, idle sessions, value drift, with bounded work.

One :meth:`Sweep.run` does, for one tenant:

- **expire**: active memories past ``expires_at`` become ``expired`` and go to archive; they come from an
  indexed query of the due ones, at most ``expire_limit`` a pass (the rest on the next);
- **page out**: the sessions that still have unpinned working-tier memories recorded before the idle horizon
  (``session_idle_hours`` ago; a store aggregate) are checked, ``session_limit`` a pass from a cursor over
  their ids that wraps; an idle one pages its working tier out and has its budgets enforced (every write
  path keeps the other sessions within theirs);
- **catch up**: the first passes of a harness enforce the budgets of every session with working-tier
  memories, ``session_limit`` sessions a pass, once round (one a process that ended left over its budget
  is due to no one else);
- **refresh**: one keyset page of ``refresh_limit`` active memories, after a cursor in creation order, has its
  values recomputed (a drift over 0.01 is written, with a ``refresh`` event). The cursor moves on every pass
  and wraps after the newest memory, so every active memory is refreshed once every
  ceil(active / ``refresh_limit``) passes.

So a pass costs what is due, not the tenant's size. The cursors live in the :class:`Sweep` (one per
harness): a new one starts from the beginning.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from clawvm.core.model import Filters, Memory, Tier
from clawvm.store import Event
from clawvm.store.base import PageKey, StoreReader
from clawvm.store.kinds import EventKind
from clawvm.vm.tiers import Pager, unless_forgotten


@dataclass(frozen=True)
class SweepReport:
    expired: int  # memories expired
    refreshed: int  # values rewritten
    moved: int  # tier moves

    def as_dict(self) -> dict[str, int]:
        return {"expired": self.expired, "refreshed": self.refreshed, "moved": self.moved}


class Sweep:
    """The bounded periodic pass over one tenant (see the module docstring)."""

    def __init__(
        self,
        store: StoreReader,
        pager: Pager,
        tenant: str,
        *,
        expire_limit: int = 500,
        refresh_limit: int = 256,
        session_limit: int = 256,
    ) -> None:
        self.store = store
        self.pager = pager
        self.tenant = tenant
        self.expire_limit = expire_limit
        self.refresh_limit = refresh_limit
        self.session_limit = session_limit
        # where the next pass's refresh page and idle-session page start (None: from the beginning)
        self._refresh_after: PageKey | None = None
        self._idle_after: str | None = None
        # catching up after a start: where the next page of sessions to check starts, and whether any is
        # left (see _catch_up)
        self._catch_up_after: str | None = None
        self._caught_up = False

    def run(self, now: datetime) -> SweepReport:
        expired = self.pager.expire(self.tenant, now, self.expire_limit)
        refreshed = self._refresh_page(now)
        moved = 0
        for session_id in self._idle_candidates(now):
            paged_out = self.pager.page_out_idle(self.tenant, session_id, now)
            if paged_out:
                moved += len(paged_out) + len(self.pager.enforce(self.tenant, session_id, now))
        moved += self._catch_up(now)
        return SweepReport(len(expired), refreshed, moved)

    def _catch_up(self, now: datetime) -> int:
        """The first passes of a harness enforce the budgets of every session with working memories, a page
        of ``session_limit`` a pass, once round: a process knows which sessions are due from what it saw,
        so one left over its budget by a process that ended (a crash, records and no pass) stayed so until
        something touched it. Returns the tier moves."""
        if self._caught_up:
            return 0
        working = Filters.of(tenant=self.tenant, tier=Tier.WORKING, status="active")
        sessions = self.store.session_ids(working, self._catch_up_after, self.session_limit)
        self._catch_up_after = sessions[-1] if len(sessions) == self.session_limit else None
        self._caught_up = self._catch_up_after is None
        # as a pass would have: a session past its high mark is paged out to the low one (others are left)
        return sum(len(self.pager.enforce(self.tenant, s, now, to_low=True)) for s in sessions)

    def _refresh_page(self, now: datetime) -> int:
        """Recompute the values of the next page of active memories; returns how many drifted and were
        written."""
        active = Filters.of(tenant=self.tenant, status="active")
        page = self.store.page(active, self._refresh_after, self.refresh_limit)
        self._refresh_after = PageKey.of(page[-1]) if len(page) == self.refresh_limit else None
        # each refresh with its event, in one write (value drift over time is what MemLens's heatmap shows):
        # logged as a batch after the page's writes, a pass that failed half way left values moved unlogged
        return sum(self._refreshed(m, now) for m in page)

    def _refreshed(self, m: Memory, now: datetime) -> bool:
        """Whether ``m``'s value had drifted and was written again, with its ``refresh`` event."""
        if abs(self.pager.value_now(m, now) - m.value) <= 0.01:
            return False

        def refresh(before: Memory, after: Memory) -> Event:
            data = {"value_before": round(before.value, 4), "value_after": round(after.value, 4)}
            return Event(kind=EventKind.REFRESH, memory_id=m.id, data=data, tenant=m.tenant, at=now)

        written = unless_forgotten(
            lambda: self.pager.mutate(m, lambda _m: {}, now, event=refresh, bookkeeping=True)
        )
        return written is not None

    def _idle_candidates(self, now: datetime) -> list[str]:
        """The next page of sessions that may be idle: only a session with an unpinned working-tier memory
        recorded before the idle horizon can be."""
        horizon = now - timedelta(hours=self.pager.config.session_idle_hours)
        stale = Filters.of(
            tenant=self.tenant, tier=Tier.WORKING, pinned=False, status="active", created_before=horizon
        )
        sessions = self.store.session_ids(stale, self._idle_after, self.session_limit)
        self._idle_after = sessions[-1] if len(sessions) == self.session_limit else None
        return sessions
