"""Tiers and the pager: a rule-based state machine over the invariants, and the policies one by one."""

from __future__ import annotations

import itertools
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import pin_race
from clawvm import (
    ConflictError,
    Filters,
    Harness,
    Kind,
    Memory,
    StateConflictError,
    Status,
    StoreError,
    Tier,
    ValidationError,
)
from clawvm.core.embed import count_tokens
from clawvm.core.model import build_memory
from clawvm.observe.learning import intervene
from clawvm.store import MemoryStore, SQLiteStore, Store
from clawvm.vm import working as working_module
from clawvm.vm.tiers import ORDER, Pager, PagerConfig, TierBudgets, value_per_token
from clawvm.write.commit import CommitPath
from clawvm.write.redaction import Redactor
from engines import engine_of, harness_target, make_store

BUDGETS = TierBudgets(working_tokens=120, working_items=5, short_term_items=6, long_term_items=8)
CFG = PagerConfig(budgets=BUDGETS, background=False)
SESSIONS = ("s1", "s2")
_files = itertools.count()

WORDS = ["payment", "api", "refund", "deploy", "disk", "lunch", "Alice", "Bob", "Paris", "invoice", "retry",
         "cache", "user", "asked", "about", "the", "failed", "timeout", "coffee", "meeting"]
SENTENCES = [
    "The payment service retried the refund three times before giving up.",
    "Alice asked whether the invoice could be split across two months.",
    "We talked about the weather and the long queue at the coffee shop.",
    "The deploy on build-07 stopped because the disk was full.",
    "Bob thinks the cache should be warmed before the meeting starts.",
    "Nobody remembered where the old dashboards were kept.",
    "The invoice total came to 1240 euros including taxes.",
    "Everyone agreed that the retry policy needs a maximum delay.",
    "It rained all afternoon so the team stayed inside and planned.",
    "The user prefers short answers with bullet lists and no jargon.",
]

short_texts = st.lists(st.sampled_from(WORDS), min_size=2, max_size=8).map(" ".join) | st.builds(
    lambda ws, n: f"{' '.join(ws)} {n}", st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
    st.integers(0, 10**5),
)
long_texts = st.lists(st.sampled_from(SENTENCES), min_size=9, max_size=14).map(" ".join)
texts = st.one_of(short_texts, short_texts, long_texts)
kinds = st.sampled_from([Kind.USER_INPUT, Kind.LLM_THOUGHT, Kind.TOOL_RESULT, Kind.NOTE, Kind.DECISION])


def everything(h: Harness) -> list[Memory]:
    return h.store.list(Filters(), limit=10**9)


def snapshot(h: Harness) -> dict[str, str]:
    return {m.id: m.to_json() for m in everything(h)}


def within_budgets(h: Harness, tiers: tuple[Tier, ...] = ORDER) -> None:
    """Every session's ``tiers`` fit their budgets (active members only)."""
    for session in SESSIONS:
        for tier in tiers:
            items, tokens = BUDGETS.limits(tier)
            members = h.list(limit=10**6, session_id=session, tier=tier)  # active only
            if items is not None:
                assert len(members) <= items, (session, tier, len(members))
            if tokens is not None:
                assert sum(m.token_count for m in members) <= tokens, (session, tier)


def demotions(h: Harness) -> int:
    return sum(e.kind in ("demote", "archive") for e in h.events(limit=10**6))


class TierMachine(RuleBasedStateMachine):
    """Random record / recall / pin / unpin / tick / context / update sequences on small budgets, with the
    periodic pager's invariants: record and recall never demote; a built context never exceeds its budget;
    a session over its working budget is due for the next pager pass, and after a pass (or any lifecycle
    boundary: context, flush, tick) every tier fits; the tiers below working fit after any operation.

    The background pager is off here, so that what a rule did is what the invariants see; its passes are
    the same :meth:`Harness.page` (``test_the_background_pager_pages_a_due_session_out``)."""

    engine = "memory"
    directory: Path | None = None

    def __init__(self) -> None:
        super().__init__()
        self.now = [datetime.now(UTC).replace(microsecond=0)]
        assert self.directory is not None or self.engine == "memory"
        target = harness_target(self.engine, self.directory or Path("."), f"tiers{next(_files)}.db")
        self.h = Harness.open(target, embedder=None, pager=CFG, clock=lambda: self.now[0])
        self.originals: dict[str, str] = {}  # every id we recorded -> the text we last gave it

    def teardown(self) -> None:
        self.h.close()

    def pick(self, i: int) -> str:
        ids = sorted(self.originals)
        return ids[i % len(ids)]

    # ---- rules ----------------------------------------------------------------------------------------
    @rule(
        text=texts,
        session=st.sampled_from(SESSIONS),
        kind=kinds,
        stamp=st.booleans(),
        ttl_h=st.none() | st.integers(1, 72),
        link=st.none() | st.integers(0, 10**6),
    )
    def record(
        self, text: str, session: str, kind: Kind, stamp: bool, ttl_h: int | None, link: int | None
    ) -> None:
        fields: dict[str, Any] = {"session_id": session, "kind": kind}
        if stamp:
            fields["created_at"] = self.now[0]
        if ttl_h is not None:
            fields["expires_at"] = self.now[0] + timedelta(hours=ttl_h)
        if link is not None and self.originals:
            fields["links"] = [{"type": "refers_to", "target": self.pick(link)}]
        before = demotions(self.h)
        m = self.h.record(text, **fields)
        assert demotions(self.h) == before, "record demoted: that is the pager's work"
        self.originals[m.id] = text

    @initialize(batch=st.lists(st.tuples(texts, st.sampled_from(SESSIONS), kinds), min_size=4, max_size=25))
    def seed(self, batch: list[tuple[str, str, Kind]]) -> None:
        self.record_many(batch)

    @rule(batch=st.lists(st.tuples(texts, st.sampled_from(SESSIONS), kinds), min_size=1, max_size=10))
    def record_many(self, batch: list[tuple[str, str, Kind]]) -> None:
        for text, session, kind in batch:
            m = self.h.record(text, session_id=session, kind=kind)
            self.originals[m.id] = text

    @rule(query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
          k=st.integers(1, 8), session=st.none() | st.sampled_from(SESSIONS))
    def recall(self, query: str, k: int, session: str | None) -> None:
        scope = {"session_id": session} if session else {}
        before = demotions(self.h)
        for hit in self.h.recall(query, k=k, track=True, **scope):
            assert hit.memory.status is Status.ACTIVE
        assert demotions(self.h) == before, "a recall demoted: its promotions are paged out by the pager"

    @precondition(lambda self: bool(self.originals))
    @rule(i=st.integers(0, 10**6))
    def pin(self, i: int) -> None:
        mid = self.pick(i)
        before = snapshot(self.h)
        events = len(self.h.events(limit=10**6))
        try:
            pinned = self.h.pin(mid)
        except ValidationError:
            assert snapshot(self.h) == before, "a refused pin changed something"
            assert len(self.h.events(limit=10**6)) == events
            return
        assert pinned.pinned and pinned.tier is Tier.WORKING

    @precondition(lambda self: bool(self.originals))
    @rule(i=st.integers(0, 10**6))
    def unpin(self, i: int) -> None:
        assert not self.h.unpin(self.pick(i)).pinned

    @rule(hours=st.sampled_from([0, 1, 3, 12, 24, 24 * 3, 24 * 30]))
    def tick(self, hours: int) -> None:
        self.now[0] += timedelta(hours=hours)
        self.h.tick()
        within_budgets(self.h)

    @rule()
    def flush(self) -> None:
        self.h.flush()
        assert not self.h.working.due()
        within_budgets(self.h)

    @rule(query=st.lists(st.sampled_from(WORDS), min_size=0, max_size=4).map(" ".join),
          budget=st.integers(1, 600), session=st.none() | st.sampled_from(SESSIONS))
    def context(self, query: str, budget: int, session: str | None) -> None:
        ctx = self.h.context(query, budget_tokens=budget, session_id=session)
        assert ctx.tokens <= budget and count_tokens(ctx.text) == ctx.tokens
        within_budgets(self.h)  # a context build is a lifecycle boundary: the pager passed

    @precondition(lambda self: bool(self.originals))
    @rule(i=st.integers(0, 10**6), text=short_texts)
    def update(self, i: int, text: str) -> None:
        mid = self.pick(i)
        before = self.h.get(mid)
        try:
            self.h.update(mid, content=text)
        except ValidationError:  # a pinned memory may not grow past the working budget; nothing changed
            assert self.h.get(mid) == before
            return
        self.originals[mid] = text

    @precondition(lambda self: bool(self.originals))
    @rule(i=st.integers(0, 10**6))
    def compress(self, i: int) -> None:
        mid = self.pick(i)
        before = self.h.get(mid)
        try:
            self.h.compress(mid)
        except StateConflictError:  # expired: its text is due to be forgotten, not reshaped; nothing changes
            assert before.expires_at is not None and before.expires_at <= self.h.now()
            assert self.h.get(mid) == before

    @precondition(lambda self: bool(self.originals))
    @rule(i=st.integers(0, 10**6))
    def decompress(self, i: int) -> None:
        mid = self.pick(i)
        before = self.h.get(mid)
        try:
            restored = self.h.decompress(mid)
        except ValidationError:  # pinned and too big for the working budget once restored, or expired
            assert self.h.get(mid) == before
            return
        assert restored.content == self.originals[mid]

    # ---- invariants -------------------------------------------------------------------------------------
    @invariant()
    def lower_tiers_within_budget(self) -> None:
        within_budgets(self.h, ORDER[1:])

    @invariant()
    def an_over_budget_working_tier_is_due(self) -> None:
        items, tokens = BUDGETS.limits(Tier.WORKING)
        due = set(self.h.working.due())
        for session in SESSIONS:
            members = self.h.list(limit=10**6, session_id=session, tier=Tier.WORKING)
            if (items is not None and len(members) > items) or (
                tokens is not None and sum(m.token_count for m in members) > tokens
            ):
                assert ("default", session) in due, (session, len(members))

    @invariant()
    def pinned_stay_in_working(self) -> None:
        for m in self.h.list(limit=10**6, pinned=True):
            assert m.tier is Tier.WORKING, m.id

    @invariant()
    def nothing_is_lost(self) -> None:
        stored = {m.id: m for m in everything(self.h)}
        raws = {i for i, m in stored.items() if "raw_of" in m.metadata}
        assert set(stored) - raws == set(self.originals)
        for rid in raws:
            assert stored[rid].metadata["raw_of"] in self.originals
        for mid, text in self.originals.items():
            m = stored[mid]
            info = m.metadata.get("compression")
            if info is None:
                assert m.content == text
            else:
                raw = stored[info["raw_id"]]
                assert raw.content == text and raw.metadata["raw_of"] == mid
                assert any(link.target == raw.id for link in m.links)
                assert m.token_count < raw.token_count

    @invariant()
    def links_are_valid(self) -> None:
        stored = {m.id: m for m in everything(self.h)}
        for m in stored.values():
            for link in m.links:
                assert link.target in stored, (m.id, link)


def test_the_pager_invariants_hold_on_every_engine(engine_name: str, tmp_path: Path) -> None:
    fields = {"engine": engine_name, "directory": tmp_path}
    machine = type(f"Tiers{engine_name.title()}", (TierMachine,), fields)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples={"memory": 25, "sqlite": 15}.get(engine_name, 6),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


# ---- the policies, one by one -----------------------------------------------------------------------------
T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def clocked(
    budgets: TierBudgets = BUDGETS, target: str = "memory://", defer_access: bool = True, **kw: Any
) -> tuple[Harness, list[datetime]]:
    """A lexical-only harness on a fresh memory store whose clock the test moves (``now[0]``).

    BM25 recall keeps these pager tests independent of how the default preset fuses its channels.
    ``defer_access=False``: a tracked recall writes its bookkeeping itself, before it returns.
    """
    now = [T0]
    kw.setdefault("preset", "bm25")
    # the tests run the pager's passes (h.page())
    pager = PagerConfig(budgets=budgets, background=False, defer_access=defer_access)
    h = Harness.open(target, embedder=None, pager=pager, clock=lambda: now[0], **kw)
    return h, now


mem_specs = st.lists(
    st.tuples(
        kinds,
        st.integers(1, 30),  # words
        st.integers(0, 24 * 20),  # age in hours
        st.integers(0, 5),  # accesses
        st.booleans(),  # pinned
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(mem_specs, st.integers(1, 6), st.integers(20, 300))
def test_demotion_takes_the_lowest_value_per_token_first(
    specs: list[tuple[Kind, int, int, int, bool]], max_items: int, max_tokens: int
) -> None:
    store = MemoryStore()
    store.setup()
    budgets = TierBudgets(working_items=max_items, working_tokens=max_tokens)
    pager = Pager(store, CommitPath(store, Redactor()), PagerConfig(budgets=budgets))
    pinned_tokens = 0
    ms: list[Memory] = []
    for kind, words, age, accesses, pinned in specs:
        text = " ".join(["word"] * words)
        room = pinned_tokens + words <= max_tokens and len([m for m in ms if m.pinned]) < max_items
        pinned = pinned and room
        pinned_tokens += words if pinned else 0
        ms.append(build_memory({
            "content": text, "kind": kind, "session_id": "s", "tier": Tier.WORKING, "pinned": pinned,
            "created_at": T0 - timedelta(hours=age), "access_count": accesses, "token_count": words,
        }))
    store.put_many(ms)
    moved = pager.enforce("default", "s", T0)
    cfg = pager.config.scoring
    vpt = {m.id: value_per_token(m, T0, cfg) for m in ms}
    moved_ids = [m.id for m in moved]
    assert all(m.tier is Tier.SHORT_TERM for m in moved)
    assert not any(m.pinned for m in moved)
    # moved in increasing value per token ...
    assert [vpt[i] for i in moved_ids] == sorted(vpt[i] for i in moved_ids)
    # ... and every kept unpinned memory is worth at least as much per token as every moved one
    kept = [m for m in ms if m.id not in moved_ids]
    kept_unpinned = [vpt[m.id] for m in kept if not m.pinned]
    if moved_ids and kept_unpinned:
        assert min(kept_unpinned) >= max(vpt[i] for i in moved_ids)
    # the working tier now fits, and no more was moved than needed
    assert len(kept) <= max_items and sum(m.token_count for m in kept) <= max_tokens
    if moved_ids:
        last = next(m for m in ms if m.id == moved_ids[-1])
        back = [*kept, last]
        assert len(back) > max_items or sum(m.token_count for m in back) > max_tokens


def test_recall_promotes_a_demoted_memory_back_to_working() -> None:
    h, now = clocked()
    with h:
        target = h.record("the refund for the Payment API failed with a timeout", kind="tool_result",
                          session_id="s1", created_at=now[0])
        for i in range(6):
            h.record(f"coffee chat {i}", kind="user_input", session_id="s1", created_at=now[0])
        h.page()
        assert h.get(target.id).tier is not Tier.WORKING
        assert h.explain(target.id).value >= h.pager.config.promote_value
        hits = h.recall("refund payment timeout", k=1)
        assert hits[0].id == target.id
        # the recall's bookkeeping waits for the next pass: the hit is as the recall read it
        assert h.get(target.id) == hits[0].memory and h.working.accesses_pending()
        assert not [e for e in h.events() if e.kind == "retrieve"]
        h.page()
        after = h.get(target.id)
        assert after.tier is Tier.WORKING and after.access_count == 1 and after.last_accessed_at == now[0]
        assert not h.working.accesses_pending()
        assert [e.data["query"] for e in h.events() if e.kind == "retrieve"] == ["refund payment timeout"]
        promote = [e for e in h.events(memory_id=target.id) if e.kind == "promote"]
        assert promote and promote[-1].data["to"] == "working"
        assert promote[-1].data["reason"] == "warmed by retrieval"
        # and the working tier fits its budget again after the next pager pass
        h.page()
        working = h.list(session_id="s1", tier="working")
        assert len(working) <= (BUDGETS.working_items or 0)


def test_recall_that_warms_many_leaves_the_paging_out_to_the_next_pass() -> None:
    """Promotions grow the working tier as records do: the session comes due, and the next pager pass (not
    the recall) brings it back within budget; the context built meanwhile stays within its own."""
    h, now = clocked(defer_access=False)
    with h:
        for i in range(12):
            h.record(f"note {i} about the Payment API", kind="user_input", session_id="s1", created_at=now[0])
        h.page()
        assert h.working.due() == [] and not h.working.any_due()
        hits = h.recall("payment api note", k=12)
        assert sum(hit.memory.tier is Tier.WORKING for hit in hits) > (BUDGETS.working_items or 0)
        assert h.working.due() == [("default", "s1")] and h.working.any_due()
        h.page()
        assert len(h.list(session_id="s1", tier="working")) <= (BUDGETS.working_items or 0)
        assert h.working.due() == [] and not h.working.any_due()


def test_low_value_recalled_memories_are_not_promoted() -> None:
    h, now = clocked()
    with h:
        thought = h.record("maybe the refund timeout is due to caching", kind="llm_thought", session_id="s1",
                           created_at=now[0])
        for i in range(6):
            h.record(f"coffee chat {i}", kind="user_input", session_id="s1", created_at=now[0])
        h.page()
        assert h.get(thought.id).tier is not Tier.WORKING
        now[0] += timedelta(days=10)  # a thought is stale after a few hours
        assert h.explain(thought.id).value < h.pager.config.promote_value
        tier = h.get(thought.id).tier
        h.recall("refund timeout caching", k=1)
        h.page()
        assert h.get(thought.id).tier is tier and h.get(thought.id).access_count == 1


def test_ttl_expiry_archives_on_tick() -> None:
    h, now = clocked()
    with h:
        m = h.record("temporary token abc", session_id="s1", expires_at=T0 + timedelta(hours=1),
                     created_at=T0)
        keep = h.record("permanent note", session_id="s1", created_at=T0)
        assert h.tick()["expired"] == 0
        now[0] = T0 + timedelta(hours=2)
        assert h.tick()["expired"] == 1
        gone = h.get(m.id)
        assert gone.status is Status.EXPIRED and gone.tier is Tier.ARCHIVE and not gone.pinned
        assert h.get(keep.id).status is Status.ACTIVE
        ev = [e for e in h.events(memory_id=m.id) if e.kind == "archive"][-1]
        assert ev.data["reason"] == "ttl expired" and ev.data["to"] == "archive"
        assert m.id not in {r.id for r in h.recall("temporary token", k=5)}  # expired is not recalled


def test_tick_expires_at_most_its_batch_and_leaves_the_rest_to_the_next_tick() -> None:
    h, now = clocked()
    with h:
        h.sweep.expire_limit = 2
        due = [T0 + timedelta(minutes=i + 1) for i in range(5)]  # all in the future when recorded
        ids = {h.record(f"token {i}", expires_at=at, created_at=T0).id for i, at in enumerate(due)}
        keep = h.record("no expiry", created_at=T0)
        now[0] = T0 + timedelta(hours=1)
        assert [h.tick()["expired"] for _ in range(4)] == [2, 2, 1, 0]
        assert {m.id for m in h.list(limit=10, status="expired")} == ids
        assert h.get(keep.id).status is Status.ACTIVE


def test_tick_refreshes_one_page_of_values_and_its_cursor_walks_the_tenant_over_ticks() -> None:
    h, now = clocked()
    with h:
        h.sweep.refresh_limit = 3
        ids = {h.record(f"fact {i}", created_at=T0 + timedelta(seconds=i)).id for i in range(7)}
        now[0] = T0 + timedelta(days=30)  # every value has drifted
        pages = []
        for _ in range(3):
            seen = {e.seq for e in h.events(limit=1000)}
            counts = h.tick()
            new = [e for e in h.events(limit=1000) if e.seq not in seen]
            refreshed = {e.memory_id for e in new if e.kind == "refresh"}
            assert counts["refreshed"] == len(refreshed) <= 3
            pages.append(refreshed)
        # 3 + 3 + 1: each memory once, in creation order, and the short page wrapped the cursor
        assert [len(p) for p in pages] == [3, 3, 1] and set().union(*pages) == ids
        assert h.tick()["refreshed"] == 0  # from the start again: nothing drifted since
        now[0] += timedelta(days=30)
        assert h.tick()["refreshed"] == 3


class _FailsOnWrite:
    """The pager's commit path, failing its ``fail_at``-th write (a full disk)."""

    def __init__(self, real: Any, fail_at: int) -> None:
        self.real, self.fail_at, self.writes = real, fail_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def write(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        if self.writes == self.fail_at:
            raise StoreError("disk full")
        return self.real.write(*args, **kwargs)


def test_a_refresh_that_fails_half_way_leaves_no_value_moved_without_its_event() -> None:
    """The page's refresh events were logged after all its writes: the write that failed took the events
    of the values written before it."""
    h, now = clocked()
    with h:
        ids = [h.record(f"fact {i}", created_at=T0 + timedelta(seconds=i)).id for i in range(3)]
        values = {i: h.get(i).value for i in ids}
        now[0] = T0 + timedelta(days=30)
        h.pager.writer = _FailsOnWrite(h.pager.writer, fail_at=2)
        with pytest.raises(StoreError):
            h.tick()
        moved = {i for i in ids if h.get(i).value != values[i]}
        logged = {e.memory_id for e in h.events(limit=1000) if e.kind == "refresh"}
        assert moved and moved == logged


def test_tick_pages_out_idle_sessions_a_page_at_a_time_and_leaves_pins_and_busy_sessions() -> None:
    h, now = clocked()
    with h:
        h.sweep.session_limit = 1
        idle = {s: h.record(f"note of {s}", session_id=s, created_at=T0) for s in ("s1", "s2")}
        pinned = h.record("pinned note", session_id="s3", created_at=T0)
        h.pin(pinned.id)
        now[0] = T0 + timedelta(days=1)
        busy = h.record("just now", session_id="s4", created_at=now[0])
        first, second = h.tick()["moved"], h.tick()["moved"]
        assert (first, second) == (1, 1)  # one session per tick, the cursor goes on to the other
        for m in idle.values():
            assert h.get(m.id).tier is Tier.SHORT_TERM
        assert h.get(pinned.id).tier is Tier.WORKING and h.get(busy.id).tier is Tier.WORKING
        assert h.tick()["moved"] == 0


def test_a_pinned_memory_that_expires_is_unpinned_and_archived() -> None:
    h, now = clocked()
    with h:
        m = h.record("short lived pin", session_id="s1", expires_at=T0 + timedelta(hours=1), created_at=T0)
        h.pin(m.id)
        now[0] = T0 + timedelta(days=1)
        h.tick()
        assert h.get(m.id).tier is Tier.ARCHIVE and not h.get(m.id).pinned


MOVE_KEYS = {"from", "to", "value_before", "value_after", "reason"}


def test_every_pager_move_is_an_event() -> None:
    h, now = clocked(TierBudgets(working_tokens=120, working_items=2, short_term_items=2, long_term_items=2))
    with h:
        ids = []
        for i in range(9):
            ids.append(h.record(f"entry {i} about deploys and refunds " + "filler " * 20 * (i % 2),
                                kind="user_input", session_id="s1", created_at=now[0]).id)
            now[0] += timedelta(minutes=1)
        h.record("short lived", session_id="s1", expires_at=now[0], created_at=now[0])
        h.tick()
        h.recall("entry 0 deploys refunds", k=3)
        h.page()
        moves = [e for e in h.events(limit=10**6) if e.kind in ("promote", "demote", "archive")]
        assert {e.kind for e in moves} == {"promote", "demote", "archive"}
        for e in moves:
            assert set(e.data) >= MOVE_KEYS and e.memory_id is not None
            assert e.data["from"] in {t.value for t in Tier} and e.data["to"] in {t.value for t in Tier}
            assert 0.0 <= e.data["value_before"] <= 1.0 and 0.0 <= e.data["value_after"] <= 1.0
            assert e.data["from"] != e.data["to"] and e.data["reason"]
            direction = ORDER.index(Tier(e.data["to"])) - ORDER.index(Tier(e.data["from"]))
            assert (e.kind == "promote") == (direction < 0)
        # replaying the moves from the "add" tier gives every memory's current tier
        tiers: dict[str, str] = {}
        for e in h.events(limit=10**6):
            if e.kind == "add":
                tiers[e.memory_id or ""] = e.data["tier"]
            elif e.kind in ("promote", "demote", "archive"):
                assert tiers[e.memory_id or ""] == e.data["from"]
                tiers[e.memory_id or ""] = e.data["to"]
        for mid, tier in tiers.items():
            assert h.get(mid).tier.value == tier


def test_pin_is_logged_like_every_move() -> None:
    h, now = clocked()
    with h:
        m = h.record("pin me", session_id="s1", created_at=now[0])
        for i in range(6):
            h.record(f"filler {i}", session_id="s1", kind="user_input", created_at=now[0])
        h.page()
        assert h.get(m.id).tier is not Tier.WORKING
        h.pin(m.id)
        ev = [e for e in h.events(memory_id=m.id) if e.kind in ("pin", "promote")][-1]
        assert set(ev.data) >= MOVE_KEYS and ev.data["to"] == "working"


def test_pin_refused_over_the_working_budget_changes_nothing() -> None:
    h, now = clocked()
    with h:
        ids = [h.record(f"pinned fact number {i}", session_id="s1", created_at=now[0]).id for i in range(6)]
        for i in ids[:5]:
            h.pin(i)
        before = snapshot(h)
        with pytest.raises(ValidationError) as err:
            h.pin(ids[5])
        assert err.value.field == "pinned"
        assert snapshot(h) == before
        big = h.record("word " * 130, session_id="s2", created_at=now[0])
        with pytest.raises(ValidationError):
            h.pin(big.id)
        h.unpin(ids[0])
        assert h.pin(ids[5]).tier is Tier.WORKING


def test_a_pin_whose_ttl_ran_out_leaves_room_for_a_new_pin_before_any_sweep() -> None:
    h, now = clocked(TierBudgets(working_items=2, short_term_items=4, long_term_items=4))
    with h:
        short = h.record("short lived pin", session_id="s1", expires_at=T0 + timedelta(minutes=5))
        h.pin(short.id)
        h.pin(h.record("lasting pin", session_id="s1").id)
        third = h.record("third pin", session_id="s1")
        with pytest.raises(ValidationError):  # the first one is live yet: two pins fill the budget
            h.pin(third.id)
        now[0] = T0 + timedelta(minutes=10)  # no tick: its stored status is still active, and pinned
        assert h.pin(third.id).pinned


def test_start_session_preloads_relevant_memories_into_working() -> None:
    h, now = clocked()
    with h:
        refund = h.record("refund for the Payment API failed with a timeout", session_id="s0",
                          kind="tool_result", created_at=now[0])
        key = h.record("payment API refunds need an idempotency key", session_id="s0", kind="knowledge",
                       created_at=now[0])
        other = h.record("the team lunch is on friday", session_id="s0", kind="note", created_at=now[0])
        now[0] += timedelta(days=1)
        h.tick()  # the idle session pages its working tier out
        assert h.get(refund.id).tier is not Tier.WORKING
        loaded = h.start_session("s1", task="payment API refund", k=2)
        assert {m.id for m in loaded} == {refund.id, key.id}
        for mid in (refund.id, key.id):
            assert h.get(mid).tier is Tier.WORKING
            assert [e for e in h.events(memory_id=mid) if e.kind == "promote"][-1].data["reason"] == (
                "preloaded for session s1"
            )
        assert h.get(other.id).tier is not Tier.WORKING
        pre = [e for e in h.events(limit=10**6) if e.kind == "preload"][-1]
        assert pre.data["session_id"] == "s1" and set(pre.data["ids"]) == {refund.id, key.id}
        assert h.start_session("s2") == []  # no task: nothing to preload
        for bad in ("", "   ", 123, None):  # refused with or without a task (they answered [] unrefused)
            for task in (None, "payment API refund"):
                with pytest.raises(ValidationError) as err:
                    h.start_session(bad, task=task)  # type: ignore[arg-type]
                assert err.value.field == "session_id"


def _archived_before_its_move(h: Harness, memory_id: str) -> None:
    """Another caller archives ``memory_id`` just before the pager's next move writes (``give_way`` is
    called by each move right before its write)."""
    moving = h.pager.give_way

    def archived_meanwhile() -> None:
        if h.get(memory_id).status is Status.ACTIVE:
            h.update(memory_id, status=Status.ARCHIVED)
        moving()

    h.pager.give_way = archived_meanwhile  # type: ignore[method-assign]


def test_a_memory_archived_while_it_is_preloaded_is_not_reported_preloaded() -> None:
    """Another caller archives a memory after ``start_session`` found it, before its move: the move leaves
    it as that caller left it, and the session's answer and its ``preload`` event listed it anyway, as if
    it were in the new session's working tier."""
    h, _ = clocked()
    with h:
        kept = h.record("payment API refunds need an idempotency key", session_id="s0", tier="long_term")
        gone = h.record("refund for the Payment API failed with a timeout", session_id="s0", tier="long_term")
        _archived_before_its_move(h, gone.id)
        loaded = h.start_session("s1", task="payment API refund", k=2)
        assert [m.id for m in loaded] == [kept.id] and h.get(kept.id).tier is Tier.WORKING
        assert (h.get(gone.id).tier, h.get(gone.id).status) == (Tier.LONG_TERM, Status.ARCHIVED)
        pre = [e for e in h.events(limit=100) if e.kind == "preload"][-1]
        assert pre.data["ids"] == [kept.id]


def test_preloaded_memories_are_in_the_new_sessions_working_set() -> None:
    h, now = clocked()
    with h:
        refund = h.record("refund for the Payment API failed with a timeout", session_id="s0",
                          kind="tool_result", created_at=now[0])
        for i in range(6):
            h.record(f"coffee chat {i}", session_id="s0", kind="user_input", created_at=now[0])
        h.page()
        loaded = h.start_session("s1", task="payment API refund", k=1)
        assert [m.id for m in loaded] == [refund.id]
        assert h.get(refund.id).tier is Tier.WORKING
        ctx = h.context("what next?", session_id="s1", budget_tokens=500)
        assert refund.id in ctx.ids


def test_prefetch_warms_related_memories_without_blocking_record(tmp_path: Path) -> None:
    target = f"sqlite:///{tmp_path}/prefetch.db"
    h, now = clocked(target=target, prefetch=True)
    related = h.record("the Payment API refund endpoint returns 409 on duplicates", session_id="s1",
                       kind="tool_result", created_at=now[0])
    for i in range(6):
        h.record(f"coffee chat {i}", session_id="s1", kind="user_input", created_at=now[0])
    assert h._prefetcher is not None
    h._prefetcher.submit(lambda: None).result(timeout=30)  # the prefetches so far are done
    h.page()
    assert h.get(related.id).tier is not Tier.WORKING
    accesses = h.get(related.id).access_count
    gate = threading.Event()
    h._prefetcher.submit(gate.wait, 30)  # hold the prefetch thread: record must not wait for it
    done = threading.Event()

    def record() -> None:
        h.record("retry the payment API refund after the 409", session_id="s1", kind="decision",
                 created_at=now[0])
        done.set()

    t = threading.Thread(target=record)
    t.start()
    assert done.wait(10), "record() blocked on the prefetch thread"
    assert h.get(related.id).access_count == accesses  # not prefetched yet: the worker is held
    gate.set()
    t.join()
    h.close()  # waits for the pending prefetch
    h, _ = clocked(target=target)
    after = h.get(related.id)
    assert after.access_count == accesses + 1 and after.tier is Tier.WORKING
    ev = [e for e in h.events(memory_id=related.id) if e.kind == "promote"][-1]
    assert ev.data["reason"] == "warmed by retrieval"
    assert not [e for e in h.events(limit=10**6) if e.kind == "prefetch_error"]
    h.close()


def test_update_that_grows_a_working_memory_keeps_the_budget() -> None:
    h, now = clocked()
    with h:
        m = h.record("small note", session_id="s1", created_at=now[0])
        h.record("another small note", session_id="s1", created_at=now[0])
        h.update(m.id, content="grown " * 150)
        working = h.list(session_id="s1", tier="working")
        assert sum(x.token_count for x in working) <= (BUDGETS.working_tokens or 0)


def test_update_of_a_compressed_memory_is_not_undone() -> None:
    h, now = clocked()
    with h:
        m = h.record(" ".join(SENTENCES * 2), session_id="s1", created_at=now[0])
        assert "compression" in h.compress(m.id).metadata
        h.update(m.id, content="the corrected text")
        assert h.decompress(m.id).content == "the corrected text"


def test_the_pager_reads_the_harness_clock() -> None:
    h, now = clocked()
    with h:
        m = h.record("a thought", kind="llm_thought", session_id="s1", created_at=now[0])
        v0 = h.explain(m.id).value
        now[0] += timedelta(hours=6)
        assert h.explain(m.id).recency == pytest.approx(0.5)
        assert h.explain(m.id).value < v0


def test_a_recall_stamps_its_hits_accessed_in_utc_from_a_clock_in_another_zone() -> None:
    local = [datetime(2030, 1, 1, 11, 0, tzinfo=timezone(timedelta(hours=2)))]  # 09:00 UTC
    with Harness.open("memory://", embedder=None, preset="bm25", clock=lambda: local[0]) as h:
        m = h.record("the nightly backup finished", session_id="s1")
        local[0] += timedelta(hours=1)
        assert h.recall("nightly backup", k=1)[0].id == m.id
        h.flush()  # the pager's pass writes the recall's bookkeeping
        hit = h.get(m.id)
        assert hit.access_count == 1 and hit.version == m.version + 1
        assert hit.last_accessed_at == datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
        assert hit.last_accessed_at.tzinfo is UTC  # stored in the one zone every memory uses


def test_record_stamps_created_at_with_the_harness_clock() -> None:
    h, _now = clocked()
    with h:
        m = h.record("what time is it", session_id="s1")
        assert m.created_at == T0
        assert next(e for e in h.events(memory_id=m.id) if e.kind == "add").at == T0


def test_decompress_keeps_the_working_budget() -> None:
    h, now = clocked()
    with h:
        text = " ".join(SENTENCES[:8])
        assert 96 < count_tokens(text) <= 120
        m = h.record(text, session_id="s1", created_at=now[0])
        assert h.compress(m.id).token_count < 60
        for i in range(3):
            h.record(f"the queue at the coffee shop was long again on day {i}", session_id="s1",
                     kind="user_input", created_at=now[0])
        assert h.get(m.id).tier is Tier.WORKING
        h.decompress(m.id)
        working = h.list(session_id="s1", tier="working")
        assert sum(x.token_count for x in working) <= (BUDGETS.working_tokens or 0)


@pytest.mark.parametrize("target", ["memory://", "sqlite"])
def test_record_never_demotes_and_a_pass_pages_out_to_the_low_watermark(target: str, tmp_path: Path) -> None:
    budgets = TierBudgets(working_items=8, working_tokens=None)
    h, now = clocked(budgets, target if target == "memory://" else f"sqlite:///{tmp_path}/b.db")
    with h:
        for i in range(12):
            h.record(f"step {i} of the long task", session_id="s1", created_at=now[0])
            assert h.working.due() == ([("default", "s1")] if i >= 8 else [])  # past the high mark: due
        assert not [e for e in h.events(limit=10**6) if e.kind == "demote"]
        assert len(h.list(session_id="s1", tier="working")) == 12  # over budget until the next pass
        moved = h.page()
        assert len(moved) == 6 and len(h.list(session_id="s1", tier="working")) == 6  # 8 * 0.75
        assert not h.working.due() and h.page() == []


def test_a_pager_pass_demotes_a_sessions_batch_in_one_transaction(tmp_path: Path) -> None:
    budgets = TierBudgets(working_items=4, working_tokens=None)
    h, now = clocked(budgets, f"sqlite:///{tmp_path}/one.db")
    db = sqlite3.connect(tmp_path / "one.db")

    def commits() -> int:  # every write transaction of the engine takes the next 'rev'
        return int(db.execute("SELECT value FROM counters WHERE name = 'rev'").fetchone()[0])

    with h:
        for i in range(4):
            h.record(f"step {i} of the long task", session_id="s1", created_at=now[0])
        before = commits()
        h.record("step 4 of the long task", session_id="s1", created_at=now[0])  # over budget: due
        assert commits() == before + 1  # the memory and its event, nothing else
        h.page()
        assert sum(e.kind == "demote" for e in h.events(limit=10**6)) == 2  # 5 -> 4 * 0.75
        assert commits() == before + 2
    db.close()


def test_a_new_memory_paged_out_at_once_keeps_its_history() -> None:
    budgets = TierBudgets(working_items=2, working_tokens=None)
    h, now = clocked(budgets)
    with h:
        for i in range(2):  # short errors carry far more value per token than the long thought below
            h.record(f"TimeoutError {i}", session_id="s1", kind="error", created_at=now[0])
        thought = "maybe look at this later, or maybe not, hard to say " * 8
        note = h.record(thought, session_id="s1", kind="llm_thought", created_at=now[0])
        assert note == h.get(note.id) and note.tier is Tier.WORKING  # record returns the memory as stored
        h.page()
        stored = h.get(note.id)
        assert stored.tier is Tier.SHORT_TERM and stored.version == 2
        assert [e.kind for e in h.events(memory_id=note.id)] == ["add", "demote"]
        assert len(h.list(session_id="s1", tier="working")) == 1  # paged down to int(2 * 0.75)


def two_writers(tmp_path: Path) -> tuple[Harness, Harness, list[datetime]]:
    """Two harnesses on one SQLite file (a working tier of 4 items) and the first one's clock."""
    budgets = TierBudgets(working_items=4, working_tokens=None)
    target = f"sqlite:///{tmp_path}/shared.db"
    a, now = clocked(budgets, target)
    b, _ = clocked(budgets, target)
    return a, b, now


def test_a_stale_view_of_the_working_tier_falls_back_to_the_store(tmp_path: Path) -> None:
    a, b, now = two_writers(tmp_path)
    with a, b:
        for i in range(4):
            a.record(f"first writer note {i}", session_id="s1", created_at=now[0])
        first = a.list(session_id="s1", tier="working")[-1]
        b.update(first.id, tags=["touched elsewhere"])  # a's cached view of this member is now stale
        a.record("first writer note 4", session_id="s1", created_at=now[0])  # over budget: due
        a.page()
        assert len(a.list(session_id="s1", tier="working")) <= 3
        assert a.get(first.id).tags == ["touched elsewhere"]  # the other writer's change survived


def test_a_pass_leaves_a_member_another_writer_moved_out_of_the_tier(tmp_path: Path) -> None:
    a, b, now = two_writers(tmp_path)
    with a, b:
        notes = [a.record(f"first writer note {i}", session_id="s1", created_at=now[0]) for i in range(5)]
        assert a.working.due() == [("default", "s1")]
        for m in notes:  # the other writer files every member away: a's view of the tier is now stale
            b.update(m.id, tier="long_term")
        a.page()  # the pass works from a's view; each move conflicts and finds its memory gone from the tier
        assert {a.get(m.id).tier for m in notes} == {Tier.LONG_TERM}
        demotes = [e for e in a.events(limit=100) if e.kind == "demote"]
        assert [e.data["reason"] for e in demotes] == ["update"] * 5  # b's own moves, none of the pass


@pytest.mark.parametrize("boundary", ["context", "flush", "tick", "close"])
def test_every_lifecycle_boundary_runs_the_pager(boundary: str, tmp_path: Path) -> None:
    budgets = TierBudgets(working_items=3, working_tokens=None)
    h, now = clocked(budgets, f"sqlite:///{tmp_path}/b.db")
    for i in range(5):
        h.record(f"note {i} of the long task", session_id="s1", created_at=now[0])
    {"context": lambda: h.context("the long task", budget_tokens=50),
     "flush": h.flush, "tick": h.tick, "close": h.close}[boundary]()
    h.close()
    h, _ = clocked(budgets, f"sqlite:///{tmp_path}/b.db")
    with h:
        assert h.count(session_id="s1", tier="working") == 2  # int(3 * 0.75)


def test_the_background_pager_pages_a_due_session_out(tmp_path: Path) -> None:
    budgets = TierBudgets(working_items=4, working_tokens=None)
    pager = PagerConfig(budgets=budgets)  # background on, as by default
    with Harness.open(f"sqlite:///{tmp_path}/bg.db", embedder=None, pager=pager) as h:
        for i in range(5):
            h.record(f"note {i} of the long task", session_id="s1")
        deadline = time.monotonic() + 20
        while h.count(session_id="s1", tier="working") > 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert h.count(session_id="s1", tier="working") == 3  # int(4 * 0.75), with no boundary crossed
        assert not [e for e in h.events(limit=10**6) if e.kind == "pager_error"]


@contextmanager
def _one_session_due(**pager_options: Any) -> Iterator[Harness]:
    """A harness whose session s1 is past its working budget of 4 (5 notes); the test runs the passes,
    on threads of its own."""
    budgets = TierBudgets(working_items=4, working_tokens=None)
    pager = PagerConfig(budgets=budgets, background=False, **pager_options)
    with Harness.open(embedder=None, pager=pager) as h:
        for i in range(5):
            h.record(f"note {i} of the long task", session_id="s1")
        yield h


def test_a_background_pass_gives_way_to_a_record_in_flight_within_its_bound() -> None:
    """While a record is in flight a background pass waits at its step boundaries (records come first);
    it goes on once the record is done, or once its give-way time is spent, and pages out all the same."""
    with _one_session_due() as h:
        assert h.working.due() == [(h.tenant, "s1")]
        done = threading.Event()
        with h.working.recording():  # a record in flight on another thread
            background = threading.Thread(
                target=lambda: (h.working.run_pass(h.now(), give_way_s=30.0), done.set())
            )
            background.start()
            assert not done.wait(0.2)  # it waits for the record
            assert h.count(session_id="s1", tier="working") == 5
        assert done.wait(20)  # the record is done: the pass goes on
        background.join()
        assert h.count(session_id="s1", tier="working") == 3  # int(4 * 0.75)
        for i in range(2):
            h.record(f"another note {i}", session_id="s1")
        with h.working.recording():  # a record that never ends: the bound lets the pass go on anyway
            started = time.monotonic()
            h.working.run_pass(h.now(), give_way_s=0.05)
            assert time.monotonic() - started < 10
        assert h.count(session_id="s1", tier="working") == 3
        for i in range(2):
            h.record(f"a last note {i}", session_id="s1")
        with h.working.recording():  # a lifecycle boundary's pass (no give-way time) never waits
            boundary = threading.Thread(target=h.page)
            boundary.start()
            boundary.join(timeout=10)
            assert not boundary.is_alive()
        assert h.count(session_id="s1", tier="working") == 3
    with pytest.raises(ValidationError):
        PagerConfig(give_way_ms=-1)
    with pytest.raises(ValidationError, match="give_way_quiet_ms"):
        PagerConfig(give_way_quiet_ms=-1)


def test_a_foreground_call_does_not_wait_while_a_pass_gives_way() -> None:
    """A background pass holds the harness's turn while it gives way to records; a foreground call that
    needs the turn (a lifecycle boundary, an update) makes it stop giving way and finish, instead of
    waiting out the records too."""
    with _one_session_due(give_way_ms=30_000) as h:  # giving way for up to 30 s if nothing stopped it
        done = threading.Event()
        with h.working.recording():  # a record that never ends
            background = threading.Thread(target=lambda: (h._background_pass(), done.set()))
            background.start()
            assert not done.wait(0.3)  # giving way to the record, the turn held
            started = time.monotonic()
            h.page()  # waits for the turn: the pass stops giving way
            assert done.wait(10) and time.monotonic() - started < 10
        background.join()
        assert h.count(session_id="s1", tier="working") == 3


def test_a_background_pass_waits_out_a_burst_of_records() -> None:
    """Records one after another (an import, a tool loop) keep a background pass waiting, not only the
    record in flight: between two of them the pass would take a step that the next one then waits on. It
    goes on once the records pause for the quiet time, and pages out all the same."""
    # a quiet time far above any pause between two records of the loop below, even on a loaded machine
    with _one_session_due(give_way_quiet_ms=300) as h:
        done = threading.Event()
        background = threading.Thread(
            target=lambda: (h.working.run_pass(h.now(), give_way_s=30.0), done.set())
        )
        background.start()
        burst_ends = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < burst_ends:  # no record in flight between two of them, only a gap
            h.record(f"burst note {n}", session_id="s2")
            n += 1
        assert not done.is_set() and h.count(session_id="s1", tier="working") == 5
        assert done.wait(20)  # the records paused: the pass goes on
        background.join()
        assert h.count(session_id="s1", tier="working") == 3


def test_watermarks_are_fractions_of_the_budget_low_at_most_high() -> None:
    for low, high in ((0.0, 1.0), (0.8, 0.7), (0.5, 1.2)):
        with pytest.raises(ValidationError):
            PagerConfig(working_low=low, working_high=high)


def test_the_harness_remembers_a_bounded_number_of_sessions() -> None:
    budgets = TierBudgets(working_items=2, working_tokens=None)
    h, now = clocked(budgets)
    with h:
        h.working.capacity = 3
        for round_ in range(3):  # each session is forgotten and read back from the store in every round
            for s in range(6):
                h.record(f"note {round_} in session {s}", session_id=f"s{s}", created_at=now[0])
                assert len(h.working) <= 3
        h.page()
        for s in range(6):
            assert len(h.list(session_id=f"s{s}", tier="working")) <= 2  # budgets hold all the same
            assert h.count(session_id=f"s{s}") == 3


def test_the_working_view_follows_every_write_as_the_store_holds_it(tmp_path: Path) -> None:
    """The record path's view of a session's working tier is kept by the commit listener, not read back:
    after a pager pass, an update that moves a memory to another session and a pin, it holds exactly what
    the store's tier holds; a delete drops the whole view."""
    budgets = TierBudgets(working_items=4, working_tokens=None)
    pager = PagerConfig(budgets=budgets, background=False)
    with Harness.open(f"sqlite:///{tmp_path}/view.db", embedder=None, pager=pager) as h:

        def stored(session: str) -> set[str]:
            return {m.id for m in h.pager.tier_members(h.tenant, session, Tier.WORKING)}

        def held(session: str) -> set[str] | None:
            members = h.working.members(h.tenant, session)
            return None if members is None else {m.id for m in members}

        ids = [h.record(f"note {i} of the first task", session_id="s1").id for i in range(6)]
        assert held("s1") == stored("s1") and len(stored("s1")) == 6  # past the budget until the pass
        h.page()
        assert held("s1") == stored("s1") and len(stored("s1")) == 3  # int(4 * 0.75)
        h.record("the second task starts", session_id="s2")
        h.update(ids[-1], session_id="s2")  # leaves one session's tier, joins the other's
        assert held("s1") == stored("s1") and ids[-1] not in stored("s1")
        assert held("s2") == stored("s2") and ids[-1] in stored("s2")
        h.pin(ids[-2])
        assert held("s1") == stored("s1")
        h.forget(ids[0])
        assert held("s1") is None and held("s2") is None  # read back on each session's next record
        h.record("after the delete", session_id="s1")
        assert held("s1") == stored("s1")


def test_a_promotion_that_raced_a_pass_leaves_its_session_due() -> None:
    """A recall reads its hits in working; a pass demotes them before the recall's bookkeeping write, which
    then conflicts and promotes them back one by one: the session is over its budget again, so it is due
    (what counts is what the write promoted, not the tiers the recall read)."""
    h, now = clocked()
    with h:
        for i in range(12):
            h.record(f"note {i} about the Payment API", kind="user_input", session_id="s1", created_at=now[0])
        seen = h.list(limit=100, session_id="s1", tier="working")  # the recall's read
        assert len(seen) == 12
        h.page()  # the pass runs between the read and the bookkeeping write
        assert len(h.list(limit=100, session_id="s1", tier="working")) <= (BUDGETS.working_items or 0)
        h.working.warm(seen, now[0])
        assert len(h.list(limit=100, session_id="s1", tier="working")) > (BUDGETS.working_items or 0)
        assert h.working.due() == [("default", "s1")]


@pytest.mark.parametrize("defer_access", [True, False], ids=["deferred", "in the recall"])
def test_the_pass_after_a_recall_pages_the_memories_it_warmed_out_last(defer_access: bool) -> None:
    """A long memory that a recall promotes has a low value per token, but the pass that pages its session
    out moves the memories the recall did not touch first: a warm-up is not undone by the next pass (nor
    by the pass that writes the recall's bookkeeping, when it waited for one)."""
    budgets = TierBudgets(working_tokens=1000, working_items=4, short_term_items=50, long_term_items=50)
    h, now = clocked(budgets, defer_access=defer_access)
    with h:
        long = h.record("the refund for the Payment API failed with a timeout. " * 8, kind="tool_result",
                        session_id="s1", created_at=now[0])
        h.pager.move(h.get(long.id), Tier.SHORT_TERM, "test", now[0])
        for i in range(4):
            h.record(f"coffee chat {i}", kind="user_input", session_id="s1", created_at=now[0])
        h.page()
        assert h.get(long.id).tier is Tier.SHORT_TERM
        assert h.recall("refund payment timeout", k=1)[0].id == long.id
        if not defer_access:
            assert h.get(long.id).tier is Tier.WORKING
            assert h.working.due() == [("default", "s1")]
        h.page()
        assert h.get(long.id).tier is Tier.WORKING
        assert len(h.list(limit=100, session_id="s1", tier="working")) <= 4


# ---- a tracked recall's bookkeeping, written by the next pass (PagerConfig.defer_access) -----------------
def test_recalls_of_one_memory_before_a_pass_count_each_in_one_write() -> None:
    h, now = clocked()
    with h:
        m = h.record("the nightly backup finished at 03:10", session_id="s1", created_at=now[0])
        now[0] += timedelta(minutes=5)
        h.recall("nightly backup", k=1)
        now[0] += timedelta(minutes=5)
        h.recall("backup finished", k=1)
        assert h.get(m.id).access_count == 0
        h.page()
        after = h.get(m.id)
        assert after.access_count == 2 and after.last_accessed_at == now[0]
        assert after.version == m.version + 1  # both recalls' bookkeeping in one write
        assert [e.kind for e in h.events() if e.kind == "retrieve"] == ["retrieve", "retrieve"]
        h.page()  # nothing left to write
        assert h.get(m.id).version == after.version


def test_a_memory_changed_or_deleted_after_its_recall_keeps_what_happened_since() -> None:
    """The pass counts an access on the memory as stored now, not as the recall read it: an update made
    in between stays, and a memory deleted in between counts nothing (and fails nothing)."""
    h, now = clocked()
    with h:
        a = h.record("the deploy window is friday", session_id="s1", created_at=now[0])
        b = h.record("the deploy freeze starts monday", session_id="s1", created_at=now[0])
        assert {x.id for x in h.recall("deploy", k=2)} == {a.id, b.id}
        h.update(a.id, content="the deploy window moved to thursday")
        h.forget(b.id)
        h.page()
        after = h.get(a.id)
        assert after.content == "the deploy window moved to thursday" and after.access_count == 1
        assert [e.kind for e in h.events() if e.kind == "retrieve"] == ["retrieve"]


def test_a_failed_write_of_the_bookkeeping_leaves_it_for_the_next_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, now = clocked()
    with h:
        m = h.record("the nightly backup finished", session_id="s1", created_at=now[0])
        h.recall("nightly backup", k=1)

        def unavailable(ids: Sequence[str]) -> dict[str, Memory]:
            raise StoreError("the store is unavailable")

        monkeypatch.setattr(engine_of(h), "get_many", unavailable)  # what the working tiers read through
        with pytest.raises(StoreError):
            h.page()
        assert h.working.accesses_pending()
        monkeypatch.undo()
        h.recall("backup finished", k=1)  # added to what the failed pass put back
        h.page()
        assert h.get(m.id).access_count == 2  # neither lost nor counted twice
        assert len([e for e in h.events() if e.kind == "retrieve"]) == 2


def test_a_recall_writes_the_bookkeeping_itself_when_too_much_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no background pager and no lifecycle boundary, the pending bookkeeping is bounded."""
    monkeypatch.setattr(working_module, "ACCESS_BUFFER", 3)
    h, _now = clocked()
    with h:
        ids = [h.record(f"note {i} about the backup", session_id="s1").id for i in range(3)]
        h.recall("backup note", k=2)
        assert h.working.accesses_pending()
        h.recall("backup note", k=3)  # the third memory pending: this recall writes them all
        assert not h.working.accesses_pending()
        assert sorted(h.get(i).access_count for i in ids) == [1, 2, 2]


def test_the_background_pager_writes_a_recalls_bookkeeping_without_a_boundary() -> None:
    with Harness.open("memory://", embedder=None, preset="bm25") as h:
        m = h.record("the nightly backup finished", session_id="s1")
        h.recall("nightly backup", k=1)
        deadline = time.monotonic() + 10
        while h.get(m.id).access_count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert h.get(m.id).access_count == 1 and not h.working.accesses_pending()


def test_close_and_checkpoint_write_the_pending_bookkeeping(tmp_path: Path) -> None:
    target = harness_target("sqlite", tmp_path)
    h, now = clocked(target=target)
    with h:
        m = h.record("the nightly backup finished", session_id="s1", created_at=now[0])
        h.recall("nightly backup", k=1)
        h.checkpoint("s1", "after the recall")  # the snapshot sees the access
        assert h.get(m.id).access_count == 1
        h.recall("nightly backup", k=1)
    with Harness.open(target, embedder=None) as again:
        assert again.get(m.id).access_count == 2


def test_a_recall_made_before_a_manual_archive_counts_but_does_not_undo_it() -> None:
    h, now = clocked()
    with h:
        m = h.record("the nightly backup finished at 03:10", kind="tool_result", session_id="s1",
                     created_at=now[0])
        h.pager.move(h.get(m.id), Tier.LONG_TERM, "test", now[0], bookkeeping=True)
        assert h.explain(m.id).value >= h.pager.config.promote_value  # a recall would promote it
        h.recall("nightly backup", k=1)
        intervene(h, "archive", m.id)  # a person archives it before the pass writes the recall's access
        h.page()
        after = h.get(m.id)
        assert after.tier is Tier.ARCHIVE and after.access_count == 1


def test_a_bookkeeping_write_that_fails_part_way_counts_nothing_twice() -> None:
    """The batch write conflicts, the one-by-one fallback logs the events and writes the first memory, then
    fails: the next pass does not write any of it again."""
    h, now = clocked()
    with h:
        a = h.record("backup one finished", session_id="s1", created_at=now[0])
        b = h.record("backup two finished", session_id="s1", created_at=now[0])
        assert len(h.recall("backup finished", k=2)) == 2
        real_write, real_mutate = h.writer.write, h.pager.mutate
        calls = itertools.count()

        def write(
            ms: Any, v: Any = None, ev: Any = (), *, bookkeeping: bool = False, **options: Any
        ) -> list[Memory]:
            if bookkeeping and len(ms) > 1:
                raise ConflictError(ms[0].id, 0, 0)  # someone else wrote one of them meanwhile
            return real_write(ms, v, ev, bookkeeping=bookkeeping, **options)

        def mutate(*args: Any, **kwargs: Any) -> Memory:
            if next(calls) == 1:
                raise StoreError("the store is unavailable")
            return real_mutate(*args, **kwargs)

        h.writer.write, h.pager.mutate = write, mutate  # type: ignore[method-assign]
        with pytest.raises(StoreError):
            h.page()
        h.writer.write, h.pager.mutate = real_write, real_mutate  # type: ignore[method-assign]
        assert not h.working.accesses_pending()
        h.page()
        assert sorted(h.get(i).access_count for i in (a.id, b.id)) == [0, 1]
        assert len([e for e in h.events() if e.kind == "retrieve"]) == 1


def test_recalls_with_no_hit_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(working_module, "ACCESS_BUFFER", 3)
    h, _now = clocked()
    with h:
        for _ in range(2):
            h.recall("nothing matches zyxwv", k=3)
        assert h.working.accesses_pending()
        h.recall("nothing matches zyxwv", k=3)  # the third event pending: this recall writes them
        assert not h.working.accesses_pending()
        assert len([e for e in h.events() if e.kind == "retrieve"]) == 3


def test_the_last_access_never_goes_back_in_time(tmp_path: Path) -> None:
    """Two harnesses on one file: the one whose pass writes last recalled first."""
    target = harness_target("sqlite", tmp_path)
    h1, now = clocked(target=target)
    h2, _ = clocked(target=target)
    h2.clock = lambda: now[0]
    with h1, h2:
        m = h1.record("the nightly backup finished at 03:10", session_id="s1", created_at=now[0])
        h1.recall("nightly backup", k=1)
        now[0] += timedelta(hours=3)
        h2.recall("nightly backup", k=1)
        h2.flush()
        h1.flush()
        got = h1.get(m.id)
        assert got.access_count == 2 and got.last_accessed_at == now[0]


def test_a_failed_pass_keeps_the_sessions_it_did_not_finish_due() -> None:
    h, now = clocked()
    with h:
        for i in range(12):
            h.record(f"note {i} about the Payment API", kind="user_input", session_id="s1", created_at=now[0])
        h.page()
        h.forget(h.list(limit=1, session_id="s1", tier="short_term")[0].id)  # a delete drops the whole view
        h.recall("payment api note", k=12)  # promotions into a session the view no longer holds
        assert h.working.accesses_pending() and h.working.due() == []
        real = h.pager.working_of

        def unavailable(tenant: str, sessions: Sequence[str]) -> dict[str, list[Memory]]:
            raise StoreError("the store is unavailable")

        h.pager.working_of = unavailable  # type: ignore[method-assign]
        with pytest.raises(StoreError):
            h.page()
        h.pager.working_of = real  # type: ignore[method-assign]
        # the pass wrote the recall's promotions before it failed: the session they grew stays due
        assert h.working.due() == [("default", "s1")] and not h.working.accesses_pending()
        h.page()
        assert len(h.list(limit=100, session_id="s1", tier="working")) <= (BUDGETS.working_items or 0)


def test_records_made_straight_into_a_lower_tier_are_paged_by_the_next_pass() -> None:
    """A record never demotes, into whichever tier it goes; one straight into long term makes the session
    due, and the next pass brings that tier back within its budget."""
    h, now = clocked()
    with h:
        for i in range(12):
            h.record(f"imported fact {i}", kind="observation", session_id="s1", tier="long_term",
                     created_at=now[0])
        assert len(h.list(limit=100, session_id="s1", tier="long_term")) == 12
        assert h.working.due() == [("default", "s1")]
        h.page()
        assert len(h.list(limit=100, session_id="s1", tier="long_term")) <= (BUDGETS.long_term_items or 0)
        assert h.working.due() == []


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: TierBudgets(working_tokens="100"), "budgets.working_tokens"),  # type: ignore[arg-type]
        (lambda: TierBudgets(working_items=-1), "budgets.working_items"),
        (lambda: TierBudgets(long_term_items=0), "budgets.long_term_items"),
        (lambda: TierBudgets(working_items=True), "budgets.working_items"),
        (lambda: PagerConfig(budgets={"working_tokens": 10}), "budgets"),  # type: ignore[arg-type]
        (lambda: PagerConfig(slack=2), "slack"),
        (lambda: PagerConfig(slack=-1), "slack"),
        (lambda: PagerConfig(promote_value=5), "promote_value"),
        (lambda: PagerConfig(session_idle_hours=-1), "session_idle_hours"),
        (lambda: PagerConfig(compress_over_tokens=-5), "compress_over_tokens"),
        (lambda: PagerConfig(working_high="1"), "working_high"),  # type: ignore[arg-type]
        (lambda: PagerConfig(background="no"), "background"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_pager_setting_is_refused_where_it_is_made_naming_the_field(make: Any, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        make()
    assert err.value.field == field


def test_a_pager_that_is_not_a_pager_config_is_refused_before_the_store_opens(tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    with pytest.raises(ValidationError) as err:
        Harness.open(path, embedder=None, pager={"working_high": 1})  # type: ignore[arg-type]
    assert err.value.field == "pager" and "PagerConfig" in err.value.fix
    assert not path.exists()


def test_the_first_ticks_of_a_harness_bring_every_session_within_its_budgets(tmp_path: Path) -> None:
    """A process that recorded and ended without a pass (a crash) left the session over its working
    budget, and the next process knew no session was due: flush, page and tick left it so."""
    db = tmp_path / "crash.db"
    pager = PagerConfig(budgets=TierBudgets(working_items=4), background=False)
    crashed = Harness.open(db, embedder=None, pager=pager)
    for i in range(10):
        crashed.record(f"step {i} of the deploy", session_id="s")  # never demotes: the pass would
    with Harness.open(db, embedder=None, pager=pager) as after:
        assert after.count(session_id="s", tier="working") == 10
        after.flush()
        after.page()
        after.tick()
        assert after.count(session_id="s", tier="working") <= 4
    crashed.close()


def test_a_memory_forgotten_during_a_maintenance_pass_is_skipped_not_fatal() -> None:
    """A forgotten memory's next version is refused (it no longer brings one back), and the pager's
    steps raised NotFoundError: one forget between a pass's read and its write ended the whole tick()."""
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    pager = PagerConfig(background=False)
    with Harness.open("memory://", embedder=None, pager=pager, clock=lambda: now[0]) as h:
        first, second = (h.record(f"note {i} about the build farm", session_id="s") for i in range(2))
        forgotten: list[str] = []

        pair = {first.id: second.id, second.id: first.id}

        def forget_the_other(written: Any, deleted: Any) -> None:  # another process, between two steps
            moved_first = [m.id for m in written if m.id in pair]
            if not forgotten and moved_first:
                forgotten.append(pair[moved_first[0]])
                h.forget(forgotten[0])

        h.writer.on_commit(forget_the_other)
        now[0] += timedelta(hours=3)  # the session is idle: its working tier is paged out
        moved = h.pager.page_out_idle(h.tenant, "s", now[0])
        assert len(moved) == 1 and forgotten == [pair[moved[0].id]]
        assert h.get(moved[0].id).tier is Tier.SHORT_TERM and h.store.get_many(forgotten) == {}


def test_a_member_pinned_or_archived_during_an_idle_page_out_stays_where_its_caller_left_it() -> None:
    """The pass reads an idle session's working members, then moves them one by one: a member another
    caller pinned (or archived) in between met the pass's write as a newer version, and the retry moved
    it to short-term from wherever it was then: a pinned memory out of the working tier, an archived one
    in short-term. The pager's own move now leaves a memory that changed tier, status or pin since."""
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    pager = PagerConfig(background=False)
    with Harness.open("memory://", embedder=None, pager=pager, clock=lambda: now[0]) as h:
        a, b, c = (h.record(f"note {i} about the build farm", session_id="s") for i in range(3))
        changed: list[str] = []

        def meanwhile(written: Any, deleted: Any) -> None:  # another caller, after the pass's first move
            if not changed and any(m.tier is Tier.SHORT_TERM for m in written):
                moved = next(m.id for m in written)
                pin, archive = (m.id for m in (a, b, c) if m.id != moved)
                changed.extend([pin, archive])
                h.pin(pin)
                h.update(archive, status=Status.ARCHIVED)

        h.writer.on_commit(meanwhile)
        now[0] += timedelta(hours=3)  # the session is idle: its working tier is paged out
        moved = h.pager.page_out_idle(h.tenant, "s", now[0])
        pinned, archived = h.get(changed[0]), h.get(changed[1])
        assert (pinned.tier, pinned.pinned) == (Tier.WORKING, True)
        assert (archived.tier, archived.status) == (Tier.WORKING, Status.ARCHIVED)
        assert [m.id for m in moved] == [m.id for m in (a, b, c) if m.id not in changed]


def test_a_batch_demotion_that_meets_a_pin_or_an_archive_leaves_that_memory_where_it_was_left() -> None:
    """The pass's batch demotion (``move_many``) meets a newer version of one of its members and falls back
    to one by one: it passed the members as re-read, so a memory pinned or archived meanwhile, still in the
    working tier, was demoted anyway (pinned, out of the working tier; archived, into short-term)."""
    with Harness.open("memory://", embedder=None, pager=PagerConfig(background=False)) as h:
        chosen = [h.record(f"note {i} about the build farm", session_id="s") for i in range(3)]
        pinned, archived, plain = (m.id for m in chosen)
        h.pin(pinned)  # after the pass read them: its versions are older now
        h.update(archived, status=Status.ARCHIVED)
        moved = h.pager.move_many(chosen, Tier.SHORT_TERM, "over budget", h.now())
        assert [m.id for m in moved] == [plain] and h.get(plain).tier is Tier.SHORT_TERM
        assert (h.get(pinned).tier, h.get(pinned).pinned) == (Tier.WORKING, True)
        assert (h.get(archived).tier, h.get(archived).status) == (Tier.WORKING, Status.ARCHIVED)


def test_a_pass_leaves_a_memory_another_caller_archived_or_took_to_another_session_uncompressed() -> None:
    """Two more ways another caller changes a memory after a pass chose it: moved to the archive tier
    itself (the pass, bound there too, compressed it, a rewrite of content it did not move, and counted the
    move as its own), or taken to another session (the first session's budget demoted it out of the second
    one's working tier)."""
    with Harness.open("memory://", embedder=None, pager=PagerConfig(background=False)) as h:
        text = "Drain the node, migrate its shards, then verify the checksums of every copy. " * 8
        archived = h.record(text, session_id="s1", tier="long_term")
        elsewhere = h.record("the runbook for the s1 deploy", session_id="s1")
        h.update(archived.id, tier=Tier.ARCHIVE)  # by hand: no compression
        h.update(elsewhere.id, session_id="s2")
        assert h.pager.move_many([archived], Tier.ARCHIVE, "over budget", h.now()) == []
        assert h.pager.move_many([elsewhere], Tier.SHORT_TERM, "over budget", h.now()) == []
        kept = h.get(archived.id)
        assert kept.content == text and "compression" not in kept.metadata
        assert (h.get(elsewhere.id).session_id, h.get(elsewhere.id).tier) == ("s2", Tier.WORKING)


def test_a_promotion_another_caller_beat_makes_no_session_due() -> None:
    """A recall's promotion (one by one) that finds the memory archived meanwhile leaves it: its session
    was still reported grown (and made due for a pass) by a promotion that never happened."""
    pager = PagerConfig(background=False, promote_value=0.0)  # any recalled memory is promoted
    with Harness.open("memory://", embedder=None, pager=pager) as h:
        m = h.record("the ledger export plan", session_id="s0", tier="long_term")
        _archived_before_its_move(h, m.id)
        # the one-by-one path (warm() takes it when its batch write meets a newer version)
        warmed = h.pager._warm_each([m], h.now(), None)
        assert warmed.grown == {} and h.get(m.id).tier is Tier.LONG_TERM


def _race_in_threads(
    worker: Callable[..., None], target: str | Store, args: list[str]
) -> list[tuple[Any, ...]]:
    """``worker(target, arg, start, results)`` on a thread per arg, let go at once; what each said."""
    start, results = threading.Barrier(len(args)), queue.Queue[tuple[Any, ...]]()
    threads = [threading.Thread(target=worker, args=(target, a, start, results)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [results.get_nowait() for _ in threads]


def _race_in_processes(worker: Callable[..., None], target: str, args: list[str]) -> list[tuple[Any, ...]]:
    """The same on a process per arg, each with its own connection to the store."""
    import multiprocessing

    # a fork server, as in test_store.py: a plain fork of this multithreaded process can copy a held lock
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["clawvm.harness"])
    start, results = ctx.Barrier(len(args)), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(target, a, start, results), daemon=True) for a in args]
    try:
        for p in procs:
            p.start()
        return [results.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _pin_race_setup(target: str | Path | Store, workers: int) -> list[str]:
    """A session with ``workers`` unpinned long-term memories (one for each racing worker to pin)."""
    with Harness.open(target, embedder=None, pager=pin_race.pager_config()) as h:
        return [h.record(f"pin candidate {i}", session_id="p", tier="long_term").id for i in range(workers)]


def _check_pin_race(target: str | Path | Store, ids: list[str], said: list[tuple[Any, ...]]) -> None:
    """The pinned budget held however the race went: the pins kept are the ones that said ok (none of them
    undone after its caller was told), as many as the budget holds (every worker read the pins before any
    wrote, so the budget fills and the rest are refused); each refused pin got the error a pin over the
    budget always gets, and wrote nothing: its memory unpinned in its tier, at its version, no pin or unpin
    logged."""
    assert sorted(s[1] for s in said) == sorted(ids)
    assert [s for s in said if s[0] == "error"] == []
    with Harness.open(target, embedder=None, pager=pin_race.pager_config()) as h:
        kept = {m.id for m in h.list(limit=100, session_id="p", pinned=True)}
        assert kept == {s[1] for s in said if s[0] == "ok"}
        assert len(kept) == pin_race.PIN_ITEMS
        for _, mid, field, problem in (s for s in said if s[0] == "refused"):
            assert (field, problem) == ("pinned", OVER_PIN_BUDGET)
            refused = h.get(mid)
            assert not refused.pinned and refused.tier is Tier.LONG_TERM and refused.version == 1
            assert [e.kind for e in h.store.read_events(memory_id=mid) if e.kind in ("pin", "unpin")] == []
        h.page()
        assert h.count(session_id="p", tier="working") <= pin_race.PIN_ITEMS


OVER_PIN_BUDGET = "would put the pinned memories of this session over the working-tier budget"


@pytest.mark.engines("sqlite", "postgres")
def test_processes_pinning_at_once_keep_the_pinned_budget(engine_name: str, tmp_path: Path) -> None:
    """Four processes pin a memory each, every one reading the session's pins before any writes: each used
    to see room and write, leaving twice the budget pinned, which the pager cannot page out."""
    target = harness_target(engine_name, tmp_path, "pins.db")
    ids = _pin_race_setup(target, 4)
    _check_pin_race(target, ids, _race_in_processes(pin_race.pin_when_told, target, ids))


def test_threads_pinning_at_once_keep_the_pinned_budget(engine_name: str, tmp_path: Path) -> None:
    """The same race between harnesses of one process (threads), on every engine, a few rounds over."""
    for round_ in range(3):
        # memory:// is a new store at each open: the harnesses share one engine instead
        target: str | Store = (
            make_store("memory", tmp_path)
            if engine_name == "memory"
            else harness_target(engine_name, tmp_path, f"threads{round_}.db")
        )
        ids = _pin_race_setup(target, 4)
        _check_pin_race(target, ids, _race_in_threads(pin_race.pin_when_told, target, ids))


def test_a_pin_told_made_is_never_undone_by_a_racing_pin_of_the_same_memory(
    engine_name: str, tmp_path: Path
) -> None:
    """Two harnesses pin one memory while two others pin one each, past the budget: a pin found over it after
    its write used to be undone, and the undo of the second pin of that memory (a version on, the same pin
    to look at) unpinned the pin its first caller had been told was made."""
    for round_ in range(3):
        target: str | Store = (
            make_store("memory", tmp_path)
            if engine_name == "memory"
            else harness_target(engine_name, tmp_path, f"same{round_}.db")
        )
        first, *rest = _pin_race_setup(target, 3)
        ids = [first, first, *rest]
        said = _race_in_threads(pin_race.pin_when_told, target, ids)
        assert len({s[0] for s in said if s[1] == first}) == 1  # both of its callers told the same
        _check_pin_race(target, ids, said)


def _check_record_race(target: str | Path | Store, said: list[tuple[Any, ...]]) -> None:
    """Pinned records racing past the budget: as many recorded as it holds, each still pinned; the rest got
    the error of a record over the budget and stored nothing (the session holds the recorded ones only)."""
    assert [s for s in said if s[0] == "error"] == []
    recorded = {s[2] for s in said if s[0] == "ok"}
    assert [(s[2], s[3]) for s in said if s[0] == "refused"] == [("pinned", OVER_PIN_BUDGET)] * (
        len(said) - len(recorded)
    )
    with Harness.open(target, embedder=None, pager=pin_race.pager_config()) as h:
        assert {m.id for m in h.list(limit=100, session_id="p", pinned=True)} == recorded
        assert len(recorded) == pin_race.PIN_ITEMS
        assert h.count(session_id="p", status="any") == len(recorded)


def test_threads_recording_pinned_at_once_keep_the_pinned_budget(engine_name: str, tmp_path: Path) -> None:
    """record(pinned=True) from four harnesses at once, each past the budget check before any writes: the
    check before the write let all four through, twice the budget pinned, which no pass can page out."""
    target: str | Store = (
        make_store("memory", tmp_path) if engine_name == "memory" else harness_target(engine_name, tmp_path)
    )
    texts = [f"pinned note {i}" for i in range(4)]
    _check_record_race(target, _race_in_threads(pin_race.record_when_told, target, texts))


@pytest.mark.engines("sqlite", "postgres")
def test_processes_recording_pinned_at_once_keep_the_pinned_budget(engine_name: str, tmp_path: Path) -> None:
    """The same race between processes, each with its own connection to the one store."""
    target = harness_target(engine_name, tmp_path, "records.db")
    with Harness.open(target, embedder=None, pager=pin_race.pager_config()):
        pass  # the store made once, before the race
    texts = [f"pinned note {i}" for i in range(4)]
    _check_record_race(target, _race_in_processes(pin_race.record_when_told, target, texts))


def test_a_member_that_left_its_tier_while_the_pager_read_it_is_not_paged(tmp_path: Path) -> None:
    """Another process moves a working member back to long-term (a refused pin undone) while a pass reads
    the tier: SQLite matched the filter in its index and read the rows after, so the member came back as it
    was by then, in long-term, and the pass demoted it from there. The tier is read from one state of the
    file: the member comes back as it was when matched, and the pass's write of it meets the newer version
    and leaves it where it went."""
    path = tmp_path / "pager.db"
    store, other = SQLiteStore(path), SQLiteStore(path)
    store.setup()
    other.setup()
    try:
        pager = Pager(store, CommitPath(store, Redactor()), CFG)
        for i in range(6):  # one past the working budget: the pass demotes its least valuable member
            store.put(build_memory({"content": f"working {i}", "session_id": "s", "tier": Tier.WORKING}))
        matched, left = store.index.page, []

        def undone_meanwhile(*args: Any, **kwargs: Any) -> list[str]:
            ids: list[str] = matched(*args, **kwargs)
            if not left:  # the member the pass will choose leaves, once the index has matched it
                members = other.get_many(ids)
                victim = min((members[i] for i in ids), key=lambda m: value_per_token(m, T0, CFG.scoring))
                other.put(victim.model_copy(update={"tier": Tier.LONG_TERM, "version": victim.version + 1}))
                left.append(victim.id)
            return ids

        store.index.page = undone_meanwhile  # type: ignore[method-assign]
        pager.enforce("default", "s", T0)
        assert left and other.get(left[0]).tier is Tier.LONG_TERM
        assert other.count(Filters.of(session_id="s", tier="working")) == 5
    finally:
        store.close()
        other.close()


def test_a_pin_outrun_by_an_archive_leaves_the_memory_archived_and_unpinned(
    engine_name: str, tmp_path: Path
) -> None:
    """Another harness archives the memory after the pin's check, before its write: the pin's retry read it
    again and pinned it whatever its status (an archived memory counts for none of the budget), leaving it
    pinned, archived and in the working tier. The retry now refuses a memory no longer active."""
    target: str | Store = (
        make_store("memory", tmp_path)
        if engine_name == "memory"
        else harness_target(engine_name, tmp_path, "archive.db")
    )
    with (
        Harness.open(target, embedder=None) as h,
        Harness.open(target, embedder=None) as other,
    ):
        m = h.record("the deploy key rotates on fridays", session_id="s", tier="long_term")
        check = h.pager.check_pin

        def outrun(memory: Any, now: Any, *args: Any, **kwargs: Any) -> None:
            check(memory, now, *args, **kwargs)
            if other.get(m.id).status is Status.ACTIVE:
                other.update(m.id, status="archived")  # between the pin's check and its write

        h.pager.check_pin = outrun  # type: ignore[method-assign]
        with pytest.raises(StateConflictError) as err:
            h.pin(m.id)
        assert err.value.field == "memory_id"
        stored = other.get(m.id)
        assert stored.status is Status.ARCHIVED and not stored.pinned and stored.tier is not Tier.WORKING


def test_harnesses_pinning_one_memory_at_once_write_one_pin(engine_name: str, tmp_path: Path) -> None:
    """Four harnesses pin the same memory at once: each conflict's retry read the memory pinned by another
    and pinned it again, a version and a pin event each (events add, pin, pin, pin, pin). A pin that finds
    the memory pinned already writes nothing, as pinning a pinned memory one call after another does."""
    target: str | Store = (
        make_store("memory", tmp_path) if engine_name == "memory" else harness_target(engine_name, tmp_path)
    )
    (mid,) = _pin_race_setup(target, 1)
    said = _race_in_threads(pin_race.pin_when_told, target, [mid] * 4)
    assert said == [("ok", mid, mid)] * 4
    with Harness.open(target, embedder=None, pager=pin_race.pager_config()) as h:
        assert [e.kind for e in h.store.read_events(memory_id=mid)] == ["add", "pin"]
        assert h.get(mid).pinned and h.get(mid).version == 2


def test_a_pin_and_an_unpin_are_written_with_their_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The move was written, then its event on its own: a process killed in between left the memory
    pinned with no pin event. Each is now one write with its event (no separate event write happens)."""
    with Harness.open("memory://", embedder=None) as h:
        m = h.record("rotate the deploy key on fridays", session_id="s", tier="long_term")

        def no_separate_event(events: Any) -> list[int]:
            raise AssertionError(f"an event written apart from its move: {events}")

        monkeypatch.setattr(h.writer, "log", no_separate_event)
        pinned = h.pin(m.id)
        unpinned = h.unpin(m.id)
        monkeypatch.undo()
        kinds = [(e.kind, e.data["tier"]) for e in h.store.read_events(memory_id=m.id)]
        assert kinds == [("add", "long_term"), ("pin", "working"), ("unpin", "working")]
        assert (pinned.version, unpinned.version) == (2, 3) and not h.get(m.id).pinned
