"""Context assembly (``Harness.context``): what one prompt holds for a query, and what building it records.

A build packs, under its token budget (the packing and its invariants: :func:`clawvm.vm.context.pack`):

1. the pinned memories of the scope, then its working tier, then what ``start_session`` preloaded for the
   session (at most what the budget could hold: one page each, newest first);
2. the memories a recall retrieves for the query, each of the best ``neighbours`` with the memories
   recorded just before and after it in its session;
3. a warning line for each unreliable tool the task is about to use (:mod:`clawvm.agents.reliability`).

Unless it is read-only, a build first runs the due pager pass (a lifecycle boundary), then counts each
packed memory as injected (and each retrieved one as accessed) in one bookkeeping write, and logs a
``context`` event with the manifest and the exact text, by whose ``seq`` MemLens traces influence.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from clawvm.agents import reliability
from clawvm.core.embed import count_tokens
from clawvm.core.model import Filters, Memory, Status
from clawvm.recall.retrieval import RecallConfig, Recalled
from clawvm.store import Event, PageKey
from clawvm.store.kinds import EventKind
from clawvm.vm.context import Candidate, Context, Quotas, pack
from clawvm.vm.tiers import Pager
from clawvm.write.commit import Host, logged_with_counts

#: No context line costs fewer tokens than this (its label alone, ``[<short id> <date>] <kind>:``, is
#: 14-19): how many pinned or working memories one context could hold at most (see :func:`_packable`).
MIN_LINE_TOKENS = 8
#: How often the usage bookkeeping of a build is tried again when a memory moved on meanwhile.
USAGE_RETRIES = 5


class AssemblyHost(Host, reliability.CallLister, Protocol):
    """The harness, as a context build sees it."""

    @property
    def pager(self) -> Pager: ...

    @property
    def config(self) -> RecallConfig: ...

    def filters(self, given: Mapping[str, Any]) -> Filters: ...

    def page(self, now: datetime | None = None) -> list[Memory]: ...

    def recall(
        self,
        query: str,
        k: int = 5,
        *,
        track: bool = True,
        preset: str | RecallConfig | None = None,
        **filters: Any,
    ) -> list[Recalled]: ...

    def recall_with(
        self, query: str, vector: np.ndarray | None, k: int, cfg: RecallConfig, filters: Filters
    ) -> list[Recalled]: ...


@dataclass(frozen=True)
class Request:
    """One build, its arguments checked by ``Harness.context`` (scope ids as stored)."""

    query: str
    budget_tokens: int
    scope: dict[str, Any]  # the session, task and agent given (toolcalls.scope_fields)
    k: int  # hits to retrieve
    neighbours: int  # how many of the best hits bring their session neighbours
    quotas: Quotas
    record_usage: bool
    read_only: bool
    vector: np.ndarray | None = None  # a precomputed query vector (benchmarks time it apart)
    tools: Sequence[str] | None = None
    preloaded: Sequence[str] = ()  # what start_session preloaded for the session


def build(h: AssemblyHost, req: Request) -> Context:
    """The context of ``req`` (see the module docstring); its ``event_seq`` is None when read-only."""
    now = h.now()
    started = time.perf_counter()
    session_id = req.scope.get("session_id")
    if not req.read_only:
        h.page(now)  # a lifecycle boundary: the due sessions' pager pass
        if session_id:
            h.pager.enforce(h.tenant, session_id, now)
    candidates: list[Candidate] = []
    if req.scope:
        for m in _packable(h, req.scope, req.budget_tokens, pinned=True):
            candidates.append(Candidate(m, "pinned", 1.0, "pinned"))
        for m in _packable(h, req.scope, req.budget_tokens, tier="working", pinned=False):
            candidates.append(Candidate(m, "working", m.value, "working tier"))
        for m in h.store.get_many(req.preloaded).values():
            if m.status is Status.ACTIVE:
                candidates.append(Candidate(m, "working", m.value, "preloaded for this session"))
    hits = _retrieved(h, req)
    for rank, hit in enumerate(hits):
        near = _neighbours(h, hit.memory) if rank < req.neighbours else ()
        candidates.append(
            Candidate(hit.memory, "retrieved", hit.score, f"recall #{rank + 1} ({hit.score:.2f})", near)
        )
    warned = reliability.context_warnings(h, req.tools, req.scope, req.budget_tokens)
    ctx = pack(
        [_valued(h, c, now) for c in candidates],
        req.budget_tokens - warned.tokens,
        count_tokens,
        req.quotas,
        now=now,
    )
    warned.apply(ctx, req.budget_tokens)
    if req.read_only:
        return ctx
    ms = round((time.perf_counter() - started) * 1000, 3)
    event = _context_event(h, req, ctx, now, ms)
    if req.record_usage and ctx.manifest:
        ctx.event_seq = _logged_with_usage(h, ctx, {hit.id for hit in hits}, now, event)
    else:
        [ctx.event_seq] = h.writer.log([event])
    return ctx


def _retrieved(h: AssemblyHost, req: Request) -> list[Recalled]:
    if not req.query.strip():
        return []
    agent_scope = {"agent_id": req.scope["agent_id"]} if req.scope.get("agent_id") else {}
    if req.vector is not None:
        return h.recall_with(req.query, req.vector, req.k, h.config, h.filters(agent_scope))
    return h.recall(req.query, k=req.k, track=False, **agent_scope)


def _context_event(h: AssemblyHost, req: Request, ctx: Context, now: datetime, ms: float) -> Event:
    """The build's event: MemLens shows its manifest and diffs its exact text (the query and the text
    are scrubbed with the tenant's policy, as every event's strings are)."""
    return Event(
        kind=EventKind.CONTEXT,
        tenant=h.tenant,
        at=now,
        data={
            "query": h.writer.scrub(req.query, h.tenant),
            "budget": req.budget_tokens,
            "tokens": ctx.tokens,
            "scope": req.scope,
            "ms": ms,
            "manifest": [e.as_dict() for e in ctx.manifest],
            "text": ctx.text,
        },
    )


def _valued(h: AssemblyHost, c: Candidate, now: datetime) -> Candidate:
    """The candidate with values as of ``now`` (stored values date from the memory's last write)."""

    def fresh(m: Memory) -> Memory:
        return m.model_copy(update={"value": h.pager.value_now(m, now)})

    return replace(c, memory=fresh(c.memory), neighbours=tuple(fresh(n) for n in c.neighbours))


def _packable(h: AssemblyHost, scope: Mapping[str, Any], budget_tokens: int, **wanted: Any) -> list[Memory]:
    """The newest memories of ``scope`` matching ``wanted`` that a context of ``budget_tokens`` could
    hold: no line costs fewer than ``MIN_LINE_TOKENS``, so more than that many could never be packed
    (one page, whatever the scope's size)."""
    most = budget_tokens // MIN_LINE_TOKENS + 1
    return h.store.page(h.filters({**scope, **wanted}), None, most, newest_first=True)


def _neighbours(h: AssemblyHost, memory: Memory) -> tuple[Memory, ...]:
    """The memory recorded just before and just after ``memory`` in its session: one single-row keyset
    page each way, in (created_at, id) order."""
    if memory.session_id is None:
        return ()
    session = h.filters({"session_id": memory.session_id, "status": "any"})
    at = PageKey.of(memory)
    before = h.store.page(session, at, 1, newest_first=True)
    after = h.store.page(session, at, 1)
    return (*before, *after)


def _logged_with_usage(
    h: AssemblyHost, ctx: Context, retrieved: set[str], now: datetime, event: Event
) -> int:
    """The build's ``event`` logged with its usage bookkeeping in one write (injected+1 and used now,
    retrieved ones accessed: a build never counted without its event, or the reverse); returns the event's
    number. The harness's own bookkeeping: no caller's update conflicts with it, and a memory that moved
    on meanwhile is read again (after ``USAGE_RETRIES`` tries the event is logged alone and the counts
    left as they are)."""
    seq = logged_with_counts(h.writer, lambda: _usage_counted(h, ctx, retrieved, now), event, USAGE_RETRIES)
    if seq is None:
        [seq] = h.writer.log([event])
    return seq


def _usage_counted(h: AssemblyHost, ctx: Context, retrieved: set[str], now: datetime) -> list[Memory]:
    batch = []
    for m in h.store.get_many(ctx.ids).values():
        # plain copies, no re-validation: the changed values are counters and a timestamp we built
        change: dict[str, Any] = {
            "usage": m.usage.model_copy(update={"injected": m.usage.injected + 1}),
            "version": m.version + 1,
            # in the prompt is in use (an OS pager's referenced bit): a session whose contexts are built
            # every half hour was paged out as idle, its working lines never "accessed" otherwise
            "last_accessed_at": now if m.last_accessed_at is None else max(m.last_accessed_at, now),
        }
        if m.id in retrieved:
            change.update(access_count=m.access_count + 1)
        changed = m.model_copy(update=change)
        batch.append(changed.model_copy(update={"value": h.pager.value_now(changed, now)}))
    return batch
