"""Tiers and the pager: the policy engine that decides which memories sit where.

Tiers, nearest to the prompt first: ``working`` (what the context builder puts in the prompt),
``short_term``, ``long_term``, ``archive``. Budgets apply per session (every memory with a session id
belongs to its session's tiers); ``working`` has a token and an item budget, the others item budgets,
``archive`` is unbounded. The pager runs periodically, like an operating system's, not inside each
allocation: ``record()`` never demotes, it writes the new memory alone (see :mod:`clawvm.vm.working`).

- new memories enter ``working``; a session whose working tier passes the high watermark
  (``working_high`` of its budget) comes due, and the next pager pass (in the background, and at every
  lifecycle boundary: ``context()``, ``flush()``, ``tick()``, ``close()``) pages it out to the low watermark
  (``working_low``): its unpinned memories with the lowest value per token move one tier down, in one
  batch. When a lower tier is over budget, its lowest-valued memories move one tier down likewise (with 10%
  slack below short/long-term budgets, so demotions come in batches);
- recalled memories are "warmed": access stats grow and, if their value reaches ``promote_value`` (and
  they fit the working token budget on their own), they move back to ``working``; a session that this
  puts past the high watermark comes due like a record's, and the pass pages the memories just warmed out
  last;
- memories whose ``expires_at`` passed become ``expired`` and go to ``archive``;
- on ``tick()``, a session idle for ``session_idle_hours`` pages its (unpinned) working tier out;
- memories entering ``archive`` are compressed reversibly when long (see :mod:`clawvm.vm.compress`); an LLM
  summarizer that gives no usable summary is replaced by the extractive one (a ``summarizer_fallback``
  event says why); a summarizer of your own that fails leaves them uncompressed (``compress_error``).
  One pass of the pager (``tick()``, one ``enforce``/``expire``/``move``) waits at most
  ``PagerConfig.endpoint_budget_s`` (default 10 s) on LLM endpoints in total; then the rest of that pass
  summarizes extractively without calling them.

Invariants (property-tested): a built context never exceeds its budget; after a pager pass no tier of a
session it covered is over budget, and every session over its working budget is due for the next pass;
the tiers below working are within budget after any operation but a record made straight into one of
them, which makes its session due; a pinned memory stays in
``working`` until unpinned (pinning refuses when pinned memories alone would exceed the working budget,
across processes too: :meth:`Pager.pin`);
moves never change content except through reversible compression; ids and links stay valid.
Every move is an :class:`~clawvm.store.Event` with kind, memory, from/to tier, value before/after, reason.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from clawvm.core.errors import ConflictError, NotFoundError, StateConflictError, StoreError, ValidationError
from clawvm.core.model import Filters, Memory, Status, Tier, as_utc, moved_on, revalidate
from clawvm.core.openai_http import EndpointBudget, endpoint_budget
from clawvm.store import Event
from clawvm.store.base import PinBudget, PinBudgetError, StoreReader
from clawvm.store.kinds import EventKind
from clawvm.vm.compress import SummarizerError, raw_copies
from clawvm.vm.scoring import DEFAULT_SCORING, ScoringConfig, value
from clawvm.write.commit import Writer

ORDER = (Tier.WORKING, Tier.SHORT_TERM, Tier.LONG_TERM, Tier.ARCHIVE)
#: How often a move re-reads its memory and writes again when another writer changed it in between.
WRITE_RETRIES = 20


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True)
class TierBudgets:
    """Per-session budgets. ``None`` means unbounded."""

    working_tokens: int | None = 1200
    working_items: int | None = 24
    short_term_items: int | None = 400
    long_term_items: int | None = 4000
    short_term_tokens: int | None = None
    long_term_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "working_tokens",
            "working_items",
            "short_term_items",
            "long_term_items",
            "short_term_tokens",
            "long_term_tokens",
        ):
            budget = getattr(self, name)
            if budget is not None and (not _whole(budget) or budget < 1):
                raise ValidationError(
                    f"budgets.{name}",
                    f"is {budget!r}",
                    "pass a whole number of at least 1, or None: unbounded",
                )

    def limits(self, tier: Tier) -> tuple[int | None, int | None]:
        """(items, tokens) for ``tier``."""
        return {
            Tier.WORKING: (self.working_items, self.working_tokens),
            Tier.SHORT_TERM: (self.short_term_items, self.short_term_tokens),
            Tier.LONG_TERM: (self.long_term_items, self.long_term_tokens),
            Tier.ARCHIVE: (None, None),
        }[tier]


@dataclass(frozen=True)
class PagerConfig:
    budgets: TierBudgets = TierBudgets()
    scoring: ScoringConfig = DEFAULT_SCORING
    promote_value: float = 0.3  # a recalled memory at or above this value is promoted to working
    compress_over_tokens: int = 96  # archive-bound text memories longer than this are compressed
    slack: float = 0.1  # demote below this fraction under budget (short/long term), in one batch
    # The periodic pager's watermarks, as fractions of the working tier's budget (items and tokens alike).
    # record() never demotes: it writes the new memory alone. When a session's working tier passes
    # ``working_high`` of its budget the session comes due and the pager is woken; its pass pages the tier
    # out to ``working_low`` of the budget (the lowest value per token first), in one batch, and enforces
    # the tiers below. Passes run in the background (``background``) and at every lifecycle boundary of the
    # harness (context(), flush(), tick(), close()), so a working tier is back within its budget after the
    # next pass, and a built context never exceeds its own budget whatever the tiers hold. ``working_high``
    # at most 1.0: the pager is woken no later than the budget is passed; a lower ``working_low`` makes
    # passes rarer but larger and leaves the prompt emptier after each.
    working_high: float = 1.0
    working_low: float = 0.75
    background: bool = True  # a pager thread per harness runs a pass as soon as a session comes due
    # a tracked recall's bookkeeping (its hits' access counts and promotions, its event) is written by the
    # next pager pass, like an operating system's pager harvesting accessed bits: one write for every
    # recall since the last pass, off the recall's path. False writes it in the recall, before it returns.
    defer_access: bool = True
    # records come first: a background pass gives way (waits, GIL released) at its steps while a record()
    # is in flight or one ended less than ``give_way_quiet_ms`` ago, at most ``give_way_ms`` in all per
    # pass, then goes on regardless (so endless records from several threads cannot starve it; the working
    # tier may stay over its budget that long, a built context never does); 0 never gives way. At 1 s, a
    # pass (~10 ms of work at 100k memories) meets about 1% of the records of an endless burst.
    give_way_ms: float = 1000.0
    give_way_quiet_ms: float = 5.0
    session_idle_hours: float = 2.0  # on tick, a session untouched this long pages its working tier out
    # seconds one pass (a tick, an enforce, an expire, a move) may wait on LLM endpoints in all (a hung
    # summarizer endpoint would otherwise cost its timeout once per memory archived); once spent, the rest
    # of the pass summarizes extractively without calling
    endpoint_budget_s: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.budgets, TierBudgets):
            raise ValidationError(
                "budgets", f"is a {type(self.budgets).__name__}", "pass clawvm.TierBudgets(...)"
            )
        if not isinstance(self.scoring, ScoringConfig):
            raise ValidationError(
                "scoring", f"is a {type(self.scoring).__name__}", "pass clawvm.vm.scoring.ScoringConfig(...)"
            )
        for flag in ("background", "defer_access"):
            if not isinstance(getattr(self, flag), bool):
                raise ValidationError(flag, f"is {getattr(self, flag)!r}", "pass True or False")
        if not _whole(self.compress_over_tokens) or self.compress_over_tokens < 0:
            raise ValidationError(
                "compress_over_tokens", f"is {self.compress_over_tokens!r}", "pass a whole number, 0 or more"
            )
        for name, low, high in (("promote_value", 0.0, 1.0), ("slack", 0.0, 0.99)):
            if not _number(getattr(self, name)) or not low <= getattr(self, name) <= high:
                raise ValidationError(
                    name, f"is {getattr(self, name)!r}", f"pass a number from {low} to {high}"
                )
        for name in ("give_way_ms", "give_way_quiet_ms", "session_idle_hours", "endpoint_budget_s"):
            if not _number(getattr(self, name)) or getattr(self, name) < 0:
                raise ValidationError(name, f"is {getattr(self, name)!r}", "pass a number, 0 or more")
        for name in ("working_low", "working_high"):
            if not _number(getattr(self, name)) or not math.isfinite(getattr(self, name)):  # NaN: its name
                raise ValidationError(
                    name, f"is {getattr(self, name)!r}", "pass a fraction of the working budget"
                )
        if not 0.0 < self.working_low <= self.working_high <= 1.0:
            raise ValidationError(
                "working_low",
                f"watermarks are low {self.working_low}, high {self.working_high}",
                "pass 0 < working_low <= working_high <= 1.0 (fractions of the working budget)",
            )


def value_per_token(m: Memory, now: datetime, cfg: ScoringConfig) -> float:
    return value(m, now, cfg) / max(1, m.token_count)


def over(ms: Sequence[Memory], items: float | None, tokens: float | None) -> bool:
    return (items is not None and len(ms) > items) or (
        tokens is not None and sum(m.token_count for m in ms) > tokens
    )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_pass(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a pager method as one pass: its endpoint calls share one budget (or its caller's pass's)."""

    @functools.wraps(method)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        pager = cast(Pager, args[0])  # a method of Pager: args[0] is self
        with pager.endpoint_pass():
            return method(*args, **kwargs)

    return run


@dataclass(frozen=True)
class Moved:
    """What :meth:`Pager.moved` did: the memory as stored after, and whether this move put it there."""

    memory: Memory
    moved: bool


def _chosen_as(memory: Memory) -> tuple[Tier, Status, bool, str | None]:
    """What a pager pass chose a memory by (its tier, status, pin and session): changed by another caller
    since, the pass's reason to move it no longer holds."""
    return memory.tier, memory.status, memory.pinned, memory.session_id


@dataclass(frozen=True)
class Access:
    """How often a memory was accessed since its bookkeeping was last written, when last, and the latest
    version those accesses read (None: the memory as given): what a pager pass writes for the recalls it
    harvests (:meth:`clawvm.vm.working.WorkingTiers.harvest`)."""

    times: int
    last_at: datetime
    read_version: int | None = None

    def then(self, later: Access) -> Access:
        """These accesses and ``later`` ones, as one."""
        return Access(
            self.times + later.times,
            max(self.last_at, later.last_at),
            max(self.read_version or 0, later.read_version or 0) or None,
        )

    def touch(self, current: Memory) -> dict[str, Any]:
        """The change that counts these accesses on ``current``: its last access never goes back in time
        (another process may have written a later one first)."""
        last = as_utc(self.last_at)
        if current.last_accessed_at is not None and current.last_accessed_at > last:
            last = current.last_accessed_at
        return {"access_count": current.access_count + self.times, "last_accessed_at": last}

    def may_promote(self, current: Memory) -> bool:
        """Whether the accesses may still promote ``current``: not when someone changed it since they read it
        (archived it, moved it by hand), which a recall made before that change must not undo."""
        return self.read_version is None or not moved_on(current, self.read_version)


def _access_of(memory: Memory, now: datetime, accesses: Mapping[str, Access] | None) -> Access:
    """The accesses to count on ``memory``: as ``accesses`` gives them, else one at ``now`` by a reader that
    read it as given (so that a change made since, a manual move, is not undone by a promotion)."""
    seen = None if accesses is None else accesses.get(memory.id)
    return Access(1, now, memory.version) if seen is None else seen


class WarmPartlyWritten(StoreError):
    """A recall's bookkeeping failed after part of it was written (its events, some of the memories): the
    rest is not retried, so that nothing is counted twice."""


@dataclass(frozen=True)
class Warmed:
    """What :meth:`Pager.warm` wrote: the memories as stored, and for each session (tenant, session id)
    that promotions grew, the ids warmed in it (a pager pass pages those out last)."""

    memories: list[Memory]
    grown: dict[tuple[str, str], frozenset[str]]


def _sessions_of(warmed: Sequence[Memory], promoted: set[str]) -> dict[tuple[str, str], frozenset[str]]:
    """Each session with a promoted memory among ``warmed``, with the ids of every warmed memory in it."""
    grown = {(m.tenant, m.session_id) for m in warmed if m.id in promoted and m.session_id is not None}
    ids: dict[tuple[str, str], set[str]] = {key: set() for key in grown}
    for m in warmed:
        if m.session_id is not None and (m.tenant, m.session_id) in ids:
            ids[(m.tenant, m.session_id)].add(m.id)
    return {key: frozenset(v) for key, v in ids.items()}


class PagerOwner(Protocol):
    """What owns a pager (the harness): its passes are the pager's."""

    pager: Pager


_O = TypeVar("_O", bound=PagerOwner)


def one_pager_pass(method: Callable[Concatenate[_O, _P], _R]) -> Callable[Concatenate[_O, _P], _R]:
    """Run a method of the pager's owner (the harness's ``tick``) as one pass of its pager."""

    @functools.wraps(method)
    def run(owner: _O, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with owner.pager.endpoint_pass():
            return method(owner, *args, **kwargs)

    return run


def _no_wait() -> None:
    return None


class Unchanged(Exception):
    """Raised by a change given to :meth:`Pager.mutate` when the memory, as read, needs no write (a pin
    that another caller's pin already made, read again after the conflict)."""


class Pager:
    """Applies :class:`PagerConfig` to a store. Stateless between calls: the store is the truth."""

    def __init__(
        self,
        store: StoreReader,
        writer: Writer,
        config: PagerConfig | None = None,
        compress: Callable[[Memory, str], Memory] | None = None,
    ) -> None:
        self.store = store
        self.writer = writer  # every move is a write of the one commit path
        if config is not None and not isinstance(config, PagerConfig):
            raise ValidationError("pager", f"is a {type(config).__name__}", "pass clawvm.PagerConfig(...)")
        self.config = config or PagerConfig()
        self._compress = compress  # set by the harness: compresses a memory on its way to archive
        # called between the steps of a pass (before each tier it checks, before each write): a background
        # pass waits there while a record is in flight (see WorkingTiers.recording); else it returns at once
        self.give_way: Callable[[], None] = _no_wait

    def value_now(self, memory: Memory, now: datetime) -> float:
        return value(memory, now, self.config.scoring)

    def endpoint_pass(self) -> AbstractContextManager[EndpointBudget]:
        """A pass's budget of time on LLM endpoints (``endpoint_budget_s``); inside another pass, that one."""
        return endpoint_budget(self.config.endpoint_budget_s)

    # ---- moving one memory -----------------------------------------------------------------------------
    def mutate(
        self,
        memory: Memory,
        change: Callable[[Memory], dict[str, Any]],
        now: datetime,
        *,
        keep_value: bool = False,
        event: Callable[[Memory, Memory], Event] | None = None,
        bookkeeping: bool = False,
        within_pin_budget: bool = False,
    ) -> Memory:
        """Apply ``change(current)`` as a new version, re-reading and retrying when someone else wrote.

        The value is recomputed as of ``now``, unless ``keep_value`` (a rollback restores the value the
        checkpoint saw, exactly: ``change`` then sets it). ``event(before, after)`` is written with the
        change, in the same step; ``change`` raises :class:`Unchanged` when the memory as read needs no
        write (then nothing is written, no event either, and the memory is returned as read).
        ``bookkeeping``: the harness's own (see :meth:`CommitPath.write`).
        ``within_pin_budget``: the change pins; the write holds the session's pinned budget
        (:meth:`pin_budget`, of the memory as changed) or raises its error, nothing written."""
        for _ in range(WRITE_RETRIES):
            try:
                changes = change(memory)
            except Unchanged:  # as read (again, after another writer's change) there is nothing to do
                return memory
            changed = revalidate(memory, {**changes, "version": memory.version + 1})
            if not keep_value:
                changed = revalidate(changed, {"value": value(changed, now, self.config.scoring)})
            requires = self.pin_budget(changed, now) if within_pin_budget else ()
            try:
                events = [] if event is None else [event(memory, changed)]
                written = self.writer.write(
                    [changed], None, events, bookkeeping=bookkeeping, requires=requires
                )
                return written[0]
            except ConflictError:
                memory = self.store.get(memory.id)
        # it kept changing, each try: no version of the caller's (its actual None: unless_forgotten skips it)
        raise ConflictError(memory.id, None, None)

    def archive_together(self, memories: Sequence[Memory], now: datetime, event: Event) -> list[Memory]:
        """Archive ``memories`` (those still active, as read again: pinned ones unpinned, since archived
        means out of the prompt) and log ``event``, in one write: never some of them archived and the
        rest not (a collapsed task's steps). When one moved on meanwhile, all are read again and the write
        retried; a forgotten one has nothing left to archive. Returns the archived memories."""
        for _ in range(WRITE_RETRIES):
            archived = []
            for m in self.store.get_many([m.id for m in memories]).values():
                if m.status is not Status.ACTIVE:  # archived or settled by another writer meanwhile
                    continue
                changed = revalidate(
                    m,
                    {
                        "status": Status.ARCHIVED,
                        "tier": Tier.ARCHIVE,
                        "pinned": False,
                        "version": m.version + 1,
                    },
                )
                archived.append(
                    changed.model_copy(update={"value": value(changed, now, self.config.scoring)})
                )
            try:
                return self.writer.write(archived, None, [event])
            except ConflictError:
                continue
        raise ConflictError(memories[0].id, None, None)  # they kept changing, each try

    def move_events(self, before: Memory, after: Memory, reason: str, now: datetime) -> list[Event]:
        """The tier move of a change that sets the tier itself (``update(tier=...)``), as the pager logs its
        own moves, to be written with the change: MemLens counts evictions, their regret and the tier
        timeline from these, and an update's move was missing from all three. None when the tier stays."""
        if after.tier is before.tier:
            return []
        was = value(before, now, self.config.scoring)
        return [
            _move_event(
                _move_kind(before.tier, after.tier), before, after.tier, was, after.value, reason, now
            )
        ]

    def move(self, memory: Memory, to: Tier, reason: str, now: datetime, **options: Any) -> Memory:
        """Store ``memory`` in tier ``to`` and log the move (kind promote/demote/archive); ``options`` as
        :meth:`moved` takes them (``bookkeeping``, and fields to change with the move). ``bookkeeping``:
        the pager's own move (paging, a recall's promotion), not a caller's (see ``CommitPath.write``).
        The pager chose ``memory`` as read: a memory that another caller moved, pinned, unpinned, gave
        another status or took to another session since is left as that caller left it (the pager's
        reason no longer holds; :meth:`moved` says which), where a caller's own move is retried on the
        newer version."""
        return self.moved(memory, to, reason, now, **options).memory

    @_one_pass
    def moved(
        self,
        memory: Memory,
        to: Tier,
        reason: str,
        now: datetime,
        *,
        bookkeeping: bool = False,
        **changes: Any,
    ) -> Moved:
        """:meth:`move`, saying whether it moved the memory (not when it left one another caller changed)."""
        chosen = _chosen_as(memory)
        left = False

        def tier_to(current: Memory) -> dict[str, Any]:
            nonlocal left
            if bookkeeping and _chosen_as(current) != chosen:
                left = True
                raise Unchanged
            return {**changes, "tier": to}

        def moved_event(current: Memory, after: Memory) -> Event:
            before = value(current, now, self.config.scoring)
            return _move_event(_move_kind(current.tier, to), current, to, before, after.value, reason, now)

        self.give_way()
        stored = self.mutate(memory, tier_to, now, event=moved_event, bookkeeping=bookkeeping)
        if left:  # as another caller left it: not this move's to compress either
            return Moved(stored, False)
        if to is Tier.ARCHIVE and self._compress is not None:
            try:
                stored = self._compress(stored, reason)
            except SummarizerError as exc:  # a policy move must not fail the caller: stay uncompressed
                self.writer.log(
                    [
                        Event(
                            kind=EventKind.COMPRESS_ERROR,
                            memory_id=memory.id,
                            tenant=memory.tenant,
                            at=now,
                            data={"error": str(exc), "reason": reason},
                        )
                    ]
                )
        return Moved(stored, True)

    # ---- policies ----------------------------------------------------------------------------------------
    def tier_members(self, tenant: str, session_id: str, tier: Tier) -> list[Memory]:
        """The active members of one session's tier, newest first: a tier's budget bounds them, and they
        are read in keyset pages (the budget check ranks every member, so all of them are returned)."""
        f = Filters.of(tenant=tenant, session_id=session_id, tier=tier, status="active")
        return list(self.store.iter_all(f, newest_first=True))

    @_one_pass
    def enforce(
        self,
        tenant: str,
        session_id: str,
        now: datetime,
        protect: frozenset[str] = frozenset(),
        lower_only: bool = False,
        to_low: bool = False,
        working: Sequence[Memory] | None = None,
        working_grew: bool = False,
    ) -> list[Memory]:
        """Demote until every tier of the session fits its budget; returns the memories moved.

        Memories in ``protect`` (just warmed) go last, so a warm-up is not undone by the pass that follows it.
        ``lower_only``: the working tier has just shed into short-term; check short-term, and long-term
        only if short-term gave it anything. ``to_low``: a pager pass, which pages an over-budget working
        tier out to its low watermark (``working_low``) rather than to the budget itself. ``working``: the
        working tier's members as the caller holds them (the record path's view, kept current by every
        commit), so the pass need not read and parse the tier back; a member another process changed
        meanwhile fails the version check, and the members are then moved one by one as the pass chose them
        (one whose tier, status, pin or session changed is left where it is: :meth:`move`).
        ``working_grew``: only the working tier grew (records, and promotions, which take from the tiers
        below): a lower tier is checked only if the tiers above it shed something into it.
        """
        moved: list[Memory] = []
        cfg = self.config
        for tier, below in pairwise(ORDER[1:] if lower_only else ORDER):
            self.give_way()
            items, tokens = cfg.budgets.limits(tier)
            if lower_only and tier is not Tier.SHORT_TERM and not moved:
                break  # only short-term grew (the working tier shed into it), and it gave nothing down
            if working_grew and tier is not Tier.WORKING and not moved:
                break  # nothing came down from above: the lower tiers only shrank
            if items is None and tokens is None:
                continue
            if (
                tier is not Tier.WORKING
                and items is not None
                and self.store.count(
                    Filters.of(tenant=tenant, session_id=session_id, tier=tier, status="active")
                )
                <= items
                and tokens is None
            ):
                continue  # cheap check: within the item budget and no token budget
            if tier is Tier.WORKING and working is not None:
                members = [m for m in working if m.expires_at is None or m.expires_at > now]
            else:
                members = self.tier_members(tenant, session_id, tier)
            paging = tier is Tier.WORKING and to_low  # a pager pass: past the high mark, down to the low one
            if not over(members, items, tokens) and not (paging and self.due(members)):
                continue
            working_slack = 1.0 - cfg.working_low if to_low else 0.0  # a pass pages to the low mark
            slack = working_slack if tier is Tier.WORKING else cfg.slack
            chosen = self._victims(members, items, tokens, slack, now, protect)
            if below is Tier.ARCHIVE:  # archive-bound moves may compress: one by one
                moved.extend(self._move_each(chosen, below, f"{tier.value} over budget", now))
            else:
                moved.extend(self.move_many(chosen, below, f"{tier.value} over budget", now))
        return moved

    def _victims(
        self,
        members: Sequence[Memory],
        items: int | None,
        tokens: int | None,
        slack: float,
        now: datetime,
        protect: frozenset[str] = frozenset(),
    ) -> list[Memory]:
        """The members to demote, lowest value per token first (pins never, ``protect`` last), until the
        rest fits ``(1 - slack)`` of the budget."""
        target_items = None if items is None else int(items * (1 - slack))
        target_tokens = None if tokens is None else int(tokens * (1 - slack))
        victims = sorted(
            (m for m in members if not m.pinned),
            key=lambda m: (m.id in protect, value_per_token(m, now, self.config.scoring)),
        )
        n, size = len(members), sum(m.token_count for m in members)
        chosen = []
        for victim in victims:
            fits = (target_items is None or n <= target_items) and (
                target_tokens is None or size <= target_tokens
            )
            if fits:
                break
            n, size = n - 1, size - victim.token_count
            chosen.append(victim)
        return chosen

    def due(self, members: Sequence[Memory]) -> bool:
        """Whether a session whose working tier holds ``members`` is due for a pager pass: past the high
        watermark (``working_high`` of the working budget)."""
        items, tokens = self.config.budgets.limits(Tier.WORKING)
        high = self.config.working_high
        return over(
            members, None if items is None else items * high, None if tokens is None else tokens * high
        )

    def _demotions(
        self, memories: Sequence[Memory], to: Tier, reason: str, now: datetime
    ) -> tuple[list[Memory], list[Event]]:
        """The new versions of ``memories`` in tier ``to`` and their events: one ``Store.write``."""
        changed = [
            m.model_copy(
                update={"tier": to, "version": m.version + 1, "value": value(m, now, self.config.scoring)}
            )
            for m in memories
        ]
        events = [
            _move_event(EventKind.DEMOTE, m, to, m.value, c.value, reason, now)
            for m, c in zip(memories, changed, strict=True)
        ]
        return changed, events

    def move_many(self, memories: Sequence[Memory], to: Tier, reason: str, now: datetime) -> list[Memory]:
        """Demote several memories in one write and one event batch (the record path's hot case); falls
        back to one by one when a concurrent writer got there first."""
        if not memories:
            return []
        changed, events = self._demotions(memories, to, reason, now)
        self.give_way()
        try:
            return self.writer.write(changed, None, events, bookkeeping=True)
        except ConflictError:  # one by one, each as chosen: move() leaves one another caller changed since
            stored = self.store.get_many([m.id for m in memories])
            return self._move_each([m for m in memories if m.id in stored], to, reason, now)

    def page_out_idle(self, tenant: str, session_id: str, now: datetime) -> list[Memory]:
        """A session nobody touched for ``session_idle_hours`` gives its working tier back (pins stay)."""
        members = self.tier_members(tenant, session_id, Tier.WORKING)
        if not members:
            return []
        last = max(max(m.created_at, m.last_accessed_at or m.created_at) for m in members)
        if (now - last).total_seconds() < self.config.session_idle_hours * 3600:
            return []
        idle = [m for m in members if not m.pinned]
        return self._move_each(idle, Tier.SHORT_TERM, "session idle", now)

    def _move_each(self, memories: Sequence[Memory], to: Tier, reason: str, now: datetime) -> list[Memory]:
        """The pager's own moves of ``memories`` one by one, as stored after; one forgotten meanwhile is
        skipped (:func:`unless_forgotten`)."""
        steps = [functools.partial(self.moved, m, to, reason, now, bookkeeping=True) for m in memories]
        # (one another caller changed meanwhile is left where it is: not among those moved)
        return [done.memory for step in steps if (done := unless_forgotten(step)) is not None and done.moved]

    def warm(
        self,
        memories: Sequence[Memory],
        now: datetime,
        events: Sequence[Event] = (),
        accesses: Mapping[str, Access] | None = None,
    ) -> Warmed:
        """Access bookkeeping for recalled memories (each accessed once, at ``now``, unless ``accesses``
        says otherwise); promotes the valuable ones back to working. Never demotes: a working tier the
        promotions grew past its budget is the pager pass's to page out
        (:meth:`clawvm.vm.working.WorkingTiers.warm` makes its session due).

        One write for all of them (with ``events``, e.g. the recall's own); when one changed since it was
        read, the whole batch is redone one by one, each re-read and retried.
        """
        if not memories:
            if events:
                self.writer.log(events)
            return Warmed([], {})
        out: list[Memory] = []
        moves: list[Event] = []
        promoted: set[str] = set()
        for m in memories:
            seen = _access_of(m, now, accesses)
            # counts that grow and a UTC time: valid by construction, so a copy, not a re-validation
            # (which cost ~150 µs a hit, 1.5 ms of a tracked recall); value() is within [0, 1] likewise
            touched = m.model_copy(update={**seen.touch(m), "version": m.version + 1})
            touched = touched.model_copy(update={"value": value(touched, now, self.config.scoring)})
            if self._promotable(touched, now) and seen.may_promote(m):
                moves.append(
                    _move_event(
                        EventKind.PROMOTE,
                        touched,
                        Tier.WORKING,
                        touched.value,
                        touched.value,
                        "warmed by retrieval",
                        now,
                    )
                )
                touched = touched.model_copy(update={"tier": Tier.WORKING})
                promoted.add(touched.id)
            out.append(touched)
        if len({m.id for m in out}) == len(out):  # a write names each memory once
            try:
                written = self.writer.write(out, None, [*events, *moves], bookkeeping=True)
                return Warmed(written, _sessions_of(written, promoted))
            except ConflictError:
                pass
        if events:
            self.writer.log(events)
        try:
            return self._warm_each(memories, now, accesses)
        except Exception as exc:
            raise WarmPartlyWritten(f"the recalls' bookkeeping was written in part: {exc}") from exc

    def _promotable(self, m: Memory, now: datetime) -> bool:
        _, max_tokens = self.config.budgets.limits(Tier.WORKING)
        return (
            m.tier is not Tier.WORKING
            and m.status is Status.ACTIVE
            # due to expire: expired, swept or not (a recall of expired memories brought one back to working)
            and (m.expires_at is None or m.expires_at > now)
            and m.value >= self.config.promote_value
            and (max_tokens is None or m.session_id is None or m.token_count <= max_tokens)
        )

    def _warm_each(
        self, memories: Sequence[Memory], now: datetime, accesses: Mapping[str, Access] | None
    ) -> Warmed:
        out = []
        promoted: set[str] = set()
        for m in memories:
            seen = _access_of(m, now, accesses)
            try:
                touched = self.mutate(m, seen.touch, now, bookkeeping=True)
            except NotFoundError:  # deleted since it was read: no access left to count
                continue
            # judged on the stored version: it may have moved since the read
            if self._promotable(touched, now) and seen.may_promote(touched):
                warmed = self.moved(touched, Tier.WORKING, "warmed by retrieval", now, bookkeeping=True)
                touched = warmed.memory
                if warmed.moved:  # (not when another caller changed it meanwhile)
                    promoted.add(touched.id)
            out.append(touched)
        return Warmed(out, _sessions_of(out, promoted))

    def working_of(self, tenant: str, sessions: Sequence[str]) -> dict[str, list[Memory]]:
        """The active working members of several sessions of one tenant, newest first, in one read (a
        pager pass's sessions, several made due at once by one recall's promotions: one query, not one per
        session)."""
        out: dict[str, list[Memory]] = {s: [] for s in sessions}
        f = Filters.of(tenant=tenant, session_id=list(sessions), tier=Tier.WORKING, status="active")
        for m in self.store.iter_all(f, newest_first=True):
            if m.session_id in out:
                out[m.session_id].append(m)
        return out

    @_one_pass
    def expire(self, tenant: str, now: datetime, limit: int = 500) -> list[Memory]:
        """Memories past ``expires_at`` become ``expired`` and move to archive: at most ``limit`` per call
        (the rest on the next), found by an indexed query of the due ones (:meth:`due_to_expire`).

        Expiry wins over a pin: a TTL is a promise to forget (a temporary credential, a one-time code), so
        the pin ends with it, and the move's reason says so. Reads leave such a memory out from the moment
        it is due, before this sweep marks it (``Harness.filters``)."""
        expired = []
        for m in self.due_to_expire(tenant, now, limit):
            if m.expires_at is not None and m.expires_at <= now:
                reason = "ttl expired (its pin ends with it)" if m.pinned else "ttl expired"
                step = functools.partial(
                    self.move, m, Tier.ARCHIVE, reason, now, status=Status.EXPIRED, pinned=False
                )
                if (gone := unless_forgotten(step)) is None:
                    continue
                self._expire_raw_copies(gone, now)
                expired.append(gone)
        return expired

    def _expire_raw_copies(self, memory: Memory, now: datetime) -> None:
        """The archived raw copies of an expired memory compressed before (its earlier texts) expire with it:
        left archived, a read of archived memories still returned the text the TTL promised to forget."""
        if not {"compression", "decompressed_from"} & memory.metadata.keys():
            return  # never compressed: no copy (and no read of its events)
        for raw in raw_copies(self.store, memory):
            if raw.status is Status.ARCHIVED:
                unless_forgotten(
                    functools.partial(self.mutate, raw, lambda _m: {"status": Status.EXPIRED}, now)
                )

    def due_to_expire(self, tenant: str, now: datetime, limit: int) -> list[Memory]:
        """Up to ``limit`` active memories of ``tenant`` whose ``expires_at`` is at or before ``now``, oldest
        (by creation) first: one page of the ``expires_by`` filter, which engines answer from an index,
        so the cost follows what is due, not the tenant's size."""
        return self.store.page(Filters.of(tenant=tenant, status="active", expires_by=now), None, limit)

    def pin(
        self, memory: Memory, now: datetime, event: Callable[[Memory, Memory], Event] | None = None
    ) -> Memory:
        """Pin ``memory`` (into the working tier) within its session's pinned budget, across processes.

        :meth:`check_pin` before the write refuses what is visibly over budget, cheaply and with nothing
        written. Two processes (or harnesses) may both pass it on the same read, so the write carries the
        budget as its precondition (:meth:`pin_budget`), which the engine evaluates atomically with it: of
        pins racing past the budget the later ones are refused with the error a sequential pin over the
        budget gets, and nothing of them is written. A pin that returned stays pinned: nothing undoes it.
        ``event(read, pinned)``: the pin's event, written in the same write. A memory found pinned already
        (another caller's pin landed first) is returned as it is, with no new version and no event."""
        self.check_pin(memory, now)

        def pinning(current: Memory) -> dict[str, Any]:
            # read again after another writer's change: archived or expired meanwhile, it is not pinnable
            # (the budget would not stop it: such a memory counts for none of it)
            if current.status is not Status.ACTIVE:
                raise StateConflictError(
                    "memory_id", f"is {current.status.value}", "only active memories can be pinned"
                )
            if current.expires_at is not None and current.expires_at <= now:
                raise StateConflictError("memory_id", "has expired", "only active memories can be pinned")
            if current.pinned and current.tier is Tier.WORKING:
                raise Unchanged
            return {"pinned": True, "tier": Tier.WORKING}

        return self.mutate(memory, pinning, now, event=event, within_pin_budget=True)

    def pin_budget(self, memory: Memory, now: datetime) -> tuple[PinBudget, ...]:
        """The precondition of a write that leaves ``memory`` pinned (a pin, a record, an update, a
        revision): the pinned memories of its session, the batch's as written, within the working tier's
        budget as :meth:`check_pin` counts them. Empty for a memory of no session, or an unbounded tier."""
        items, tokens = self.config.budgets.limits(Tier.WORKING)
        if memory.session_id is None or (items is None and tokens is None):
            return ()
        return (PinBudget(memory.tenant, memory.session_id, now, items, tokens),)

    def pin_budgets(self, memories: Sequence[Memory], now: datetime) -> tuple[PinBudget, ...]:
        """:meth:`pin_budget` for each session that pinned memories among ``memories`` belong to (an
        import's, a rollback's), once each."""
        budgets: dict[tuple[str, str], PinBudget] = {}
        for m in memories:
            for budget in self.pin_budget(m, now) if m.pinned else ():
                budgets.setdefault((budget.tenant, budget.session_id), budget)
        return tuple(budgets.values())

    def check_pin(
        self,
        memory: Memory,
        now: datetime,
        replacing: str | None = None,
        alongside: Sequence[Memory] = (),
        written: Collection[str] = (),
    ) -> None:
        """Refuse a pin that would make the pinned memories alone exceed the working budget. ``replacing``:
        the id of a pinned memory that ``memory`` takes the place of (a revision's predecessor);
        ``alongside``: pinned memories of its session written in the same batch (an import's);
        ``written``: ids the batch writes (a rollback's), whose stored pins do not count. A pinned
        memory whose TTL ran out by ``now`` counts for nothing: every read treats it as expired already,
        and the next sweep unpins it."""
        if memory.session_id is None:
            return
        items, tokens = self.config.budgets.limits(Tier.WORKING)
        pinned = [
            m
            for m in self.tier_members(memory.tenant, memory.session_id, Tier.WORKING)
            if m.pinned and (m.expires_at is None or m.expires_at > now)
        ]
        batch = {memory.id, replacing, *(m.id for m in alongside), *written}
        pinned = [m for m in pinned if m.id not in batch] + [*alongside, memory]
        if over(pinned, items, tokens):
            raise PinBudgetError()


def unless_forgotten(step: Callable[[], _R]) -> _R | None:
    """``step()``, a maintenance step's change of one memory, or None when the memory was forgotten
    meanwhile (by another caller or process): the step skips it, the rest of the pass goes on (the write
    of a memory no longer stored is refused, as :func:`clawvm.store.base.check_stored` says)."""
    try:
        return step()
    except NotFoundError:
        return None
    except ConflictError as exc:
        if exc.actual is None:  # no longer stored
            return None
        raise


def _move_kind(from_tier: Tier, to: Tier) -> EventKind:
    if to is Tier.ARCHIVE:
        return EventKind.ARCHIVE
    return EventKind.PROMOTE if ORDER.index(to) < ORDER.index(from_tier) else EventKind.DEMOTE


def _move_event(
    kind: str,
    memory: Memory,
    to: Tier,
    value_before: float,
    value_after: float,
    reason: str,
    now: datetime,
    from_tier: Tier | None = None,
) -> Event:
    """The event of one tier move (promote, demote or archive)."""
    return Event(
        kind=kind,
        memory_id=memory.id,
        tenant=memory.tenant,
        at=now,
        data={
            "from": (from_tier or memory.tier).value,
            "to": to.value,
            "value_before": round(value_before, 4),
            "value_after": round(value_after, 4),
            "reason": reason,
        },
    )
