"""Tenant isolation lives in the store layer: nothing done through tenant A's view reads or changes B's data.

The state machine drives tenant A through its :class:`TenantStore` view (raw store calls, including ones
that name B's ids, B's tenant or B's vectors) and through a Harness on that view (record, recall,
context, update, forget, pin, feedback, checkpoint, rollback, compress, tick, import), on every engine.
After every step, B's fingerprint — memories, events, vectors, links — is unchanged, and everything A got
back belongs to A.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from clawvm import (
    ConflictError,
    Filters,
    Harness,
    Memory,
    NotFoundError,
    PagerConfig,
    ValidationError,
)
from clawvm.core.errors import AccessDeniedError
from clawvm.core.model import STORED, TENANT_FIX, Link, LinkType, build_memory
from clawvm.store import Event, MemoryStore, Query, SQLiteStore, Store
from clawvm.store.tenant import TenantStore
from engines import make_store

WORDS = ["deploy", "disk", "payment", "timeout", "invoice", "paris", "retry", "cache", "alice", "build"]
SESSIONS = ["s1", "s2"]
DIM = 384
_files = itertools.count()

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
sessions = st.sampled_from(SESSIONS)


def vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def fingerprint(inner: Store, tenant: str) -> tuple[Any, ...]:
    """Everything of ``tenant`` the engine holds, read around any view."""
    memories = sorted(m.to_json() for m in inner.iter_all(Filters.of(tenant=tenant)))
    ids = sorted(json.loads(m)["id"] for m in memories)
    events = [
        (e.seq, e.kind, e.memory_id, json.dumps(e.data, sort_keys=True, default=str))
        for e in inner.read_events(0, 10**9)
        if e.tenant == tenant
    ]
    pending = sorted(i for i, _ in inner.unembedded(10**9) if i in set(ids))
    probe = inner.query(
        Query(filters=Filters.of(tenant=tenant), vector=vector(999), limit=1000, lexical=False)
    )
    dense = sorted((i, round(s, 4)) for i, s in probe.dense)
    edges = sorted((e.source, e.type.value, e.target) for e in inner.edges(ids) if e.source in set(ids))
    return memories, events, pending, dense, edges


def make_machine(engine_name: str, directory: Path) -> type[RuleBasedStateMachine]:
    class Isolation(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.inner = make_store(engine_name, directory, f"iso{next(_files)}.db")
            self.inner.setup()
            self.view_a = TenantStore(self.inner, "A")
            # no background pager: its passes (a tracked recall's bookkeeping) would make what the rules
            # draw from (A's listing) depend on timing
            self.a = Harness.open(self.view_a, embedder=None, tenant="A", pager=PagerConfig(background=False))
            self.b_ids: list[str] = []
            self.b_checkpoint = ""

        @initialize()
        def tenant_b_has_data(self) -> None:
            b = Harness.open(TenantStore(self.inner, "B"), embedder=None, tenant="B")
            first = None
            for n, text in enumerate(
                ["deploy failed: disk full", "payment timeout at paris", "retry the cache"]
            ):
                for s in SESSIONS:
                    m = b.record(
                        f"{text} ({s})",
                        session_id=s,
                        tags=["ops", s],
                        embedding=vector(n),
                        links=[{"type": "refers_to", "target": first}] if first else [],
                    )
                    first = first or m.id
                    self.b_ids.append(m.id)
            long = " ".join(
                f"We talked about the {w} and the long queue at the coffee shop." for w in WORDS * 2
            )
            self.b_ids.append(b.record(long, session_id="s1").id)  # no vector
            b.pin(self.b_ids[0])
            b.rate(self.b_ids[1], 1)
            self.b_checkpoint = b.checkpoint("s1", "before")
            self.b_ids.append(self.b_checkpoint)
            self.b_ids.append(
                b.compress(self.b_ids[-2]).metadata["compression"]["raw_id"]
            )  # an archived raw copy
            b.close()
            self.b_before = fingerprint(self.inner, "B")

        def teardown(self) -> None:
            self.a.close()
            self.inner.close()

        # ---- helpers ----------------------------------------------------------------------------------
        def assert_a(self, ids: Any) -> None:
            wanted = [i for i in ids if i is not None]
            found = self.inner.get_many(wanted)
            for i in wanted:
                assert i in found and found[i].tenant == "A", f"{i} is not tenant A's"

        # ---- tenant A, through its Harness ------------------------------------------------------------
        @rule(text=texts, session=sessions, seed=st.integers(0, 5), link_b=st.booleans())
        def record(self, text: str, session: str, seed: int, link_b: bool) -> None:
            links = [{"type": "refers_to", "target": self.b_ids[seed]}] if link_b else []
            m = self.a.record(text, session_id=session, tags=["ops"], embedding=vector(seed), links=links)
            self.assert_a([m.id])

        @rule(text=texts, track=st.booleans(), session=st.none() | sessions)
        def recall(self, text: str, track: bool, session: str | None) -> None:
            hits = self.a.recall(text, k=20, track=track, session_id=session)
            self.assert_a(h.id for h in hits)

        @rule(text=texts, session=st.none() | sessions)
        def context(self, text: str, session: str | None) -> None:
            ctx = self.a.context(text, budget_tokens=300, session_id=session)
            self.assert_a(ctx.ids)

        @rule(n=st.integers(0, 8), delta=st.sampled_from([1, -1]))
        def change_b_through_the_harness(self, n: int, delta: int) -> None:
            target = self.b_ids[n % len(self.b_ids)]
            for action in (
                lambda: self.a.get(target),
                lambda: self.a.update(target, state="error"),
                lambda: self.a.forget(target),
                lambda: self.a.pin(target),
                lambda: self.a.unpin(target),
                lambda: self.a.rate(target, delta),
                lambda: self.a.explain(target),
                lambda: self.a.compress(target),
                lambda: self.a.decompress(target),
                lambda: self.a.rollback(self.b_checkpoint),
            ):
                with pytest.raises(NotFoundError):
                    action()

        @rule(data=st.data())
        def change_own(self, data: st.DataObject) -> None:
            own = self.a.list(limit=100, status="any")
            if not own:
                return
            m = data.draw(st.sampled_from(own))
            action = data.draw(st.sampled_from(["update", "pin", "rate", "forget", "compress"]))
            try:
                if action == "update":
                    self.a.update(m.id, content=m.content + " updated")
                elif action == "pin":
                    self.a.pin(m.id)
                elif action == "rate":
                    self.a.rate(m.id, 1)
                elif action == "forget":
                    self.a.forget(m.id)
                else:
                    self.a.compress(m.id)
            except ValidationError:  # e.g. pinning over the working budget: refused, fine
                pass

        @rule(session=sessions)
        def checkpoint_and_rollback(self, session: str) -> None:
            report = self.a.rollback(self.a.checkpoint(session, "cp"))
            self.assert_a(report.restored + report.obsoleted)

        @rule()
        def tick_and_list(self) -> None:
            self.a.tick()
            self.assert_a(m.id for m in self.a.list(limit=1000, status="any"))
            self.assert_a(m.id for m in self.view_a.iter_all())
            assert self.view_a.count(Filters.of(tenant="B")) == 0
            assert all(e.tenant == "A" for e in self.a.events(limit=10**6))

        @rule()
        def import_b(self) -> None:
            stolen = [m.model_copy(update={"tenant": "A"}) for m in self.inner.get_many(self.b_ids).values()]
            # neither refused (a 403 would tell that the id is in use) nor written over B's: A's copy gets
            # an id of A's own (B's fingerprint, checked after every step, stays as it was)
            done = self.a.import_renamed(stolen[:1])
            own = done.renamed[stolen[0].id]
            assert own != stolen[0].id and self.view_a.get(own).tenant == "A"

        # ---- tenant A, raw calls on its view ----------------------------------------------------------
        @rule(n=st.integers(0, 8))
        def raw_reads_of_b(self, n: int) -> None:
            target = self.b_ids[n % len(self.b_ids)]
            assert self.view_a.get_many([target, *self.b_ids]) == {}
            with pytest.raises(NotFoundError):
                self.view_a.get(target)
            assert self.view_a.edges(self.b_ids) == []
            for e in self.view_a.edges([m.id for m in self.a.list(limit=1000, status="any")]):
                self.assert_a([e.source])
            self.assert_a(i for i, _ in self.view_a.unembedded(1000))

        @rule(
            text=texts, seed=st.integers(0, 5), tenant=st.sampled_from([None, "A", "B"]), n=st.integers(0, 8)
        )
        def raw_query(self, text: str, seed: int, tenant: str | None, n: int) -> None:
            seeds = (self.b_ids[n % len(self.b_ids)], *self.b_ids[:2])
            q = Query(
                filters=Filters.of(tenant=tenant),
                text=text,
                vector=vector(seed),
                limit=50,
                context=True,
                info=True,
                around=seeds,
                expand=seeds,
            )
            r = self.view_a.query(q)
            self.assert_a(i for i, _ in r.lexical + r.dense + r.context)
            self.assert_a(r.filtered)
            for i, info in r.info.items():
                self.assert_a([i, info.previous, info.next])
            self.assert_a(i for pair in r.related for i in pair[:2])
            listing = self.view_a.query(Query(filters=Filters.of(tenant=tenant), limit=1000))
            self.assert_a(listing.filtered)
            if tenant == "B":
                assert r.lexical == r.dense == r.filtered == [] and listing.filtered == []

        @rule(n=st.integers(0, 8), seed=st.integers(0, 5))
        def raw_writes_of_b(self, n: int, seed: int) -> None:
            target = self.inner.get(self.b_ids[n % len(self.b_ids)])
            as_a = target.model_copy(update={"tenant": "A", "version": target.version + 1, "content": "mine"})
            as_b = Memory(content="planted by A", tenant="B")
            for batch in ([as_a], [as_b], [Memory(content="ok", tenant="A"), as_b]):
                with pytest.raises(AccessDeniedError):
                    self.view_a.put_many(batch)
                with pytest.raises(AccessDeniedError):
                    self.view_a.write(batch, None, [])
            assert self.view_a.delete_many(self.b_ids) == 0
            self.view_a.set_vectors([target.id], vector(seed)[None, :])
            with pytest.raises(AccessDeniedError):
                self.view_a.append_events([Event(kind="planted", memory_id=target.id, tenant="B")])
            with pytest.raises(AccessDeniedError):
                self.view_a.delete_events_upto(10**9)

        @invariant()
        def b_is_untouched(self) -> None:
            if self.b_ids:
                assert fingerprint(self.inner, "B") == self.b_before

    return Isolation


def test_no_sequence_of_tenant_a_operations_reads_or_changes_tenant_b(
    engine_name: str, tmp_path: Path
) -> None:
    run_state_machine_as_test(
        make_machine(engine_name, tmp_path),
        settings=settings(
            max_examples=20,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_a_memory_of_another_tenant_is_not_found_and_its_id_not_writable(engine: Store) -> None:
    b = TenantStore(engine, "B")
    a = TenantStore(engine, "A")
    theirs = Memory(content="B's secret", tenant="B")
    b.put(theirs)
    with pytest.raises(NotFoundError):
        a.get(theirs.id)
    with pytest.raises(AccessDeniedError) as refused:
        a.put(theirs.model_copy(update={"tenant": "A", "version": 2}))
    assert refused.value.field == "id"
    with pytest.raises(AccessDeniedError) as wrong_tenant:
        a.put(Memory(content="x", tenant="B"))
    assert wrong_tenant.value.field == "tenant"
    assert engine.get(theirs.id) == theirs
    a.close()  # a view never closes the shared engine
    assert engine.get(theirs.id).content == "B's secret"


def test_a_tenant_view_names_only_its_own_agents(engine: Store) -> None:
    engine.put_many(
        [
            Memory(content="x", tenant="A", agent_id="Nate"),
            Memory(content="y", tenant="B", agent_id="Mallory"),
        ]
    )
    a = TenantStore(engine, "A")
    assert a.agents(Filters()) == a.agents(Filters.of(tenant="A")) == {"Nate"}
    assert a.agents(Filters.of(tenant="B")) == frozenset()  # another tenant's agents, not even their names


def test_events_of_a_tenant_are_paged_past_other_tenants(engine: Store) -> None:
    engine.append_events([Event(kind="noise", tenant="B") for _ in range(1200)])
    engine.append_events([Event(kind="mine", tenant="A") for _ in range(3)])
    view = TenantStore(engine, "A")
    found = view.read_events(0, 2)
    assert [e.kind for e in found] == ["mine", "mine"]
    assert len(view.read_events(found[-1].seq or 0, 10)) == 1


# ---- side channels: what another tenant holds shows in none of a tenant's scores ------------------------
_worlds = itertools.count()
# names mid-sentence, so that the entity graph (the recall's "graph" part) links memories too
named = st.lists(st.sampled_from([*WORDS, "Bob", "Paris", "Tokyo"]), min_size=1, max_size=6).map(
    lambda words: "note " + " ".join(words)
)
docs = st.lists(st.tuples(named, sessions, st.sampled_from(["ann", "bob", None])), min_size=1, max_size=8)
_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _put_docs(view: TenantStore, batch: list[tuple[str, str, str | None]], start: int) -> list[str]:
    memories = [
        Memory(
            content=text,
            tenant=view.tenant,
            session_id=s,
            agent_id=agent,
            created_at=_T0 + timedelta(seconds=start + n),
        )
        for n, (text, s, agent) in enumerate(batch)
    ]
    view.put_many(memories)
    return [m.id for m in memories]


def _seen_by(view: TenantStore, ids: list[str], query: str) -> tuple[Any, ...]:
    """Everything tenant ``view`` gets back from the search channels and recall's explain, ids replaced by
    their position in ``ids`` (the same documents have other ids in the other world)."""
    at = {i: n for n, i in enumerate(ids)}
    raw = view.query(
        Query(
            filters=Filters.of(tenant=view.tenant),
            text=query,
            limit=20,
            context=True,
            expand=tuple(ids[:2]),
            expand_max_df=100_000,  # every shared entity links, whatever its count
            info=True,
        )
    )
    channels = (
        [(at[i], s) for i, s in raw.lexical],
        [(at[i], s) for i, s in raw.context],
        [(at[s], at[r], w) for s, r, w in raw.related],
        sorted((at[i], c.length) for i, c in raw.info.items()),
    )
    h = Harness.open(view, embedder=None, tenant=view.tenant)
    explained = [
        (at[r.memory.id], r.score, sorted((name, c.raw, c.rank) for name, c in r.explain.items()))
        for r in h.recall(query, k=10, track=False)
    ]
    return channels, explained


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mine=docs, theirs=docs, later=docs, query=texts)
def test_bm25_statistics_are_per_tenant(
    engine: Store,
    mine: list[tuple[str, str, str | None]],
    theirs: list[tuple[str, str, str | None]],
    later: list[tuple[str, str, str | None]],
    query: str,
) -> None:
    """B's scores, ranking and explain are the same whether or not another tenant A holds documents (A
    writes before, between and after B's writes, with the same words and session names)."""
    world = next(_worlds)
    alone = TenantStore(engine, f"alone{world}")
    beside = TenantStore(engine, f"beside{world}")
    neighbour = TenantStore(engine, f"neighbour{world}")
    ids_alone = _put_docs(alone, mine, 0) + _put_docs(alone, later, 100)
    got_alone = _seen_by(alone, ids_alone, query)  # before the neighbour holds anything
    _put_docs(neighbour, theirs, 0)
    ids_beside = _put_docs(beside, mine, 0)
    _put_docs(neighbour, theirs + later, 50)
    ids_beside += _put_docs(beside, later, 100)
    got_beside = _seen_by(beside, ids_beside, query)
    assert _same(got_beside, got_alone), (got_beside, got_alone)


def _same(x: Any, y: Any) -> bool:
    """Equal, floats up to the last bits of a float8 sum (a margin for rounding only: the in-process
    engines' float32 scores differ by far more than this when they differ at all)."""
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-15)
    if isinstance(x, tuple | list) and isinstance(y, tuple | list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    return bool(x == y)


# ---- events: numbered and read per tenant ----------------------------------------------------------------
batches = st.lists(
    st.tuples(
        st.booleans(), st.lists(st.sampled_from(["add", "retrieve", "context"]), min_size=1, max_size=4)
    ),
    min_size=1,
    max_size=8,
)


def _events_seen(view: TenantStore, memory_id: str) -> tuple[Any, ...]:
    def shown(found: list[Event]) -> list[tuple[Any, ...]]:
        return [
            (e.seq, e.kind, e.memory_id, e.tenant == view.tenant, json.dumps(e.data, sort_keys=True))
            for e in found
        ]

    whole = view.read_events(0, 1000)
    pages, after = [], 0
    while page := view.read_events(after, 2):
        pages.append(shown(page))
        after = page[-1].seq or after
    return shown(whole), pages, shown(view.read_events(0, 1000, memory_id)), shown(view.read_events(1, 3))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logged=batches)
def test_a_tenants_events_are_numbered_and_read_as_if_it_were_alone(
    engine: Store, logged: list[tuple[bool, list[str]]]
) -> None:
    """B's event numbers, pages and per-memory reads are the same whether or not another tenant logs
    between B's writes: B's numbers are 1, 2, 3 ... over its own events, so they say nothing of A."""
    world = next(_worlds)
    alone, beside = TenantStore(engine, f"b{world}alone"), TenantStore(engine, f"b{world}xxxxx")
    neighbour = TenantStore(engine, f"a{world}")
    got: dict[str, list[int]] = {"alone": [], "beside": []}
    for n, (theirs_first, kinds) in enumerate(logged):
        for name, view in (("alone", alone), ("beside", beside)):
            if theirs_first and view is beside:
                neighbour.append_events([Event(kind="noise", tenant=neighbour.tenant) for _ in range(n + 2)])
            mine = [
                Event(kind=k, memory_id=f"m{i % 2}", data={"n": n}, tenant=view.tenant)
                for i, k in enumerate(kinds)
            ]
            got[name] += view.append_events(mine) if len(mine) > 1 else [view.append_event(mine[0])]
    assert got["alone"] == got["beside"] == list(range(1, len(got["alone"]) + 1))
    assert _events_seen(beside, "m1") == _events_seen(alone, "m1")
    # the engine's own log still numbers every event once, in order (the operator's view: retention, copies)
    everything = [e.seq for e in engine.read_events(0, 100_000)]
    assert everything == sorted(set(everything))


@pytest.mark.engines("sqlite", "postgres")
def test_a_tenants_event_read_is_an_index_range_over_its_own_events(engine_name: str, engine: Store) -> None:
    """The statement a tenant's read runs reads only that tenant's rows: the plan is a range of the
    (tenant, number) index, whatever another tenant logged."""
    engine.append_events([Event(kind="noise", tenant="A") for _ in range(3000)])
    engine.append_events([Event(kind="mine", tenant="B") for _ in range(3)])
    if engine_name == "sqlite":
        from clawvm.store.sqlite_events import TENANT_EVENTS_SQL as sql

        assert isinstance(engine, SQLiteStore)
        with engine._read("test") as db:
            plan = " ".join(
                str(r[-1])
                for r in db.execute(f"EXPLAIN QUERY PLAN {sql} ORDER BY tenant_seq LIMIT ?", ["B", 0, 100])
            )
        assert "USING INDEX events_tenant (tenant=? AND tenant_seq>?)" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    else:
        from clawvm.store.postgres import PostgresStore
        from clawvm.store.postgres_events import TENANT_EVENTS_SQL as sql

        assert isinstance(engine, PostgresStore)
        with engine._conn("test") as conn:
            conn.execute("ANALYZE events")
            rows = conn.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {sql} ORDER BY tenant_seq LIMIT %s", ["B", 0, 100]
            ).fetchone()
        plan = json.dumps(rows[0])
        assert "events_tenant" in plan and "Seq Scan" not in plan, plan
        assert '"Rows Removed by Filter"' not in plan or '"Rows Removed by Filter": 0' in plan, plan
    assert [e.seq for e in TenantStore(engine, "B").read_events(0, 10)] == [1, 2, 3]


# ---- files written before per-tenant statistics and numbering still open ---------------------------------
@pytest.mark.engines("sqlite", "postgres")
def test_a_store_from_before_per_tenant_numbers_and_statistics_opens_with_both(
    engine_name: str, tmp_path: Path
) -> None:
    store = make_store(engine_name, tmp_path, "old.db")
    store.setup()
    for n in range(4):
        store.put_many(
            [Memory(content=f"deploy disk {'timeout ' * n}", tenant=t, session_id="s") for t in "AB"]
        )
        store.append_events([Event(kind="add", tenant="A", data={"n": n}) for _ in range(n + 1)])
        store.append_events([Event(kind="add", tenant="B", data={"n": n})])
    b = TenantStore(store, "B")
    query = Query(filters=Filters.of(tenant="B"), text="deploy timeout", limit=10, context=True)
    before = (b.query(query), [(e.seq, e.data) for e in b.read_events()])
    _back_to_the_old_schema(engine_name, store, tmp_path / "old.db")
    store = make_store(engine_name, tmp_path, "old.db")
    store.setup()  # migrates: numbers the logged events per tenant, counts each tenant's statistics
    try:
        b = TenantStore(store, "B")
        after = (b.query(query), [(e.seq, e.data) for e in b.read_events()])
        assert _same((after[0].lexical, after[0].context), (before[0].lexical, before[0].context))
        assert after[1] == before[1] == [(n + 1, {"n": n}) for n in range(4)]
        assert b.append_event(Event(kind="next", tenant="B")) == 5  # the numbering goes on
        assert TenantStore(store, "A").read_events(9, 5)[0].seq == 10
    finally:
        store.close()


def _back_to_the_old_schema(engine_name: str, store: Store, path: Path) -> None:
    """Undo this change's migrations in ``store``'s file or schema, keeping its data, and close it."""
    if engine_name == "sqlite":
        store.close()
        with sqlite3.connect(path) as db:
            db.executescript(
                "DROP INDEX events_tenant; ALTER TABLE events DROP COLUMN tenant_seq;"
                " DELETE FROM counters WHERE name LIKE 'events:%'; PRAGMA user_version = 2;"
            )
        return
    from clawvm.store.postgres import MIGRATIONS, PostgresStore

    assert isinstance(store, PostgresStore)
    with store._conn("test") as conn:
        conn.execute("DROP TABLE tenant_lexstats; DROP TABLE IF EXISTS event_numbers")
        conn.execute("DROP INDEX events_tenant")
        conn.execute("ALTER TABLE events DROP COLUMN tenant_seq")
        # back to the version before the per-tenant migration (later ones are idempotent and run again)
        before = next(n for n, sql in enumerate(MIGRATIONS) if "CREATE TABLE tenant_lexstats" in sql)
        conn.execute("UPDATE meta SET value = %s WHERE key = 'version'", [str(before)])
    store.close()


# ---- imports: an id another tenant holds is neither refused nor shared -------------------------------
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(held=st.sets(st.integers(0, 2)))
def test_importing_ids_another_tenant_holds_keeps_both_memories(engine: Store, held: set[int]) -> None:
    """B imports three linked memories; A already holds those of ``held``'s ids. Nothing is refused, A's
    memories are untouched, B's are stored under its own ids (derived from the taken ones, references
    following), and importing the same batch again writes nothing and maps the same way."""
    world = next(_worlds)
    a, b = TenantStore(engine, f"a{world}"), TenantStore(engine, f"b{world}")
    root = Memory(content="B's root", tenant=b.tenant)
    child = Memory(content="B's child", tenant=b.tenant, parent_id=root.id)
    cited = Memory(
        content="B's citing", tenant=b.tenant, links=[Link(type=LinkType.REFERS_TO, target=child.id)]
    )
    batch = [root, child, cited]
    theirs = [Memory(id=batch[i].id, content=f"A's {i}", tenant=a.tenant) for i in sorted(held)]
    a.put_many(theirs)
    a_before = fingerprint(engine, a.tenant)
    h = Harness.open(b, embedder=None, tenant=b.tenant)
    done = h.import_renamed(batch)
    assert done.imported == 3 and set(done.renamed) == {batch[i].id for i in held}
    stored = [done.renamed.get(m.id, m.id) for m in batch]
    assert [h.get(i).content for i in stored] == ["B's root", "B's child", "B's citing"]
    assert h.get(stored[1]).parent_id == stored[0]
    assert [k.target for k in h.get(stored[2]).links] == [stored[1]]
    for i in held:
        assert stored[i] != batch[i].id and engine.get(stored[i]).tenant == b.tenant
        with pytest.raises(NotFoundError):
            h.get(batch[i].id)
    assert fingerprint(engine, a.tenant) == a_before
    again = h.import_renamed(batch)
    assert again.imported == 0 and again.renamed == done.renamed


@pytest.mark.engines("sqlite", "postgres")  # memory:// is a new store at every open: nothing to share
def test_harnesses_opened_for_two_tenants_on_one_file_are_isolated(engine_name: str, tmp_path: Path) -> None:
    """``Harness.open(path, tenant=...)`` gives the tenant the server's view of the file: B's harness could
    read, pin and forget A's memory by its id, and record into tenant A."""
    from engines import harness_target

    target = harness_target(engine_name, tmp_path)
    with (
        Harness.open(target, tenant="A", embedder=None) as a,
        Harness.open(target, tenant="B", embedder=None) as b,
    ):
        kept = a.record("alice's plan for the launch", session_id="s")
        for reach in (b.get, b.forget, b.pin, b.explain, b.history, lambda i: b.update(i, content="mine")):
            with pytest.raises(NotFoundError):
                reach(kept.id)
        with pytest.raises(AccessDeniedError) as refused:
            b.record("written for A", tenant="A")
        assert refused.value.field == "tenant" and "memories of your own tenant" in (refused.value.fix or "")
        assert b.recall("alice plan launch", preset="bm25") == [] and b.count(status="any") == 0
        assert a.get(kept.id) == kept and a.count() == 1
    with Harness.open(target, tenant="A", embedder=None) as again:  # the engine under a view was closed
        assert again.get(kept.id).content == kept.content


@pytest.mark.engines("sqlite")
def test_a_tenant_imports_another_tenants_export_into_its_own(tmp_path: Path) -> None:
    """The import was refused with "event of tenant 'A'": the memories kept the exporter's tenant."""
    target = str(tmp_path / "shared.db")
    with (
        Harness.open(target, tenant="A", embedder=None) as a,
        Harness.open(target, tenant="B", embedder=None) as b,
    ):
        exported = [a.record(f"acme note {i}", session_id="s") for i in range(2)]
        done = b.import_renamed(exported)
        assert done.imported == 2 and set(done.renamed) == {m.id for m in exported}  # A holds those ids
        mine = b.list(limit=10)
        assert {m.content for m in mine} == {"acme note 0", "acme note 1"} and {m.tenant for m in mine} == {
            "B"
        }
        assert a.count() == 2 and all(a.get(m.id) == m for m in exported)


@pytest.mark.engines("sqlite")
def test_a_backup_restored_in_parts_keeps_its_links_forward_and_back(tmp_path: Path) -> None:
    """An id only named in one part (a link to a memory of a later part, a parent in an earlier one) maps
    as the memory it names does when its part comes: a restore in parts keeps every reference, though
    another tenant holds the original ids (it imported the file first)."""
    with Harness.open("memory://", embedder=None) as source:
        first = source.record("the plan", session_id="s")
        second = source.record("its review", session_id="s", parent_id=first.id)
        first = source.update(first.id, links=[{"type": "refers_to", "target": second.id}])
    target = str(tmp_path / "parts.db")
    with Harness.open(target, tenant="A", embedder=None) as a:
        assert a.import_renamed([first, second]).imported == 2
    with Harness.open(target, tenant="B", embedder=None) as b:
        one = b.import_renamed([first])  # names `second` before it is imported
        two = b.import_renamed([second])
        plan, review = one.renamed[first.id], two.renamed[second.id]
        assert b.get(plan).links[0].target == review  # forward
        assert b.get(review).parent_id == plan  # and back


def test_the_owner_restores_a_backup_whose_ids_a_tenant_imported_first(tmp_path: Path) -> None:
    """The owner's import said "1 already present" and restored nothing: tenant A held the ids."""
    with Harness.open("memory://", embedder=None) as source:
        backup = [source.record("hello backup", session_id="s"), source.record("second", session_id="s")]
        backup.append(source.record("a reply", session_id="s", parent_id=backup[0].id))
    target = str(tmp_path / "b.db")
    with Harness.open(target, tenant="A", embedder=None) as a:
        assert a.import_renamed(backup).imported == 3
    with Harness.open(target, embedder=None) as owner:
        done = owner.import_renamed(backup)
        assert done.imported == 3 and set(done.renamed) == {m.id for m in backup}
        mine = {m.content: m for m in owner.list(tenant="default", limit=10)}
        assert set(mine) == {"hello backup", "second", "a reply"}
        assert mine["a reply"].parent_id == mine["hello backup"].id  # the reference follows the rename
        assert owner.import_renamed(backup).imported == 0  # again: the same ids, already present
    with Harness.open(target, tenant="A", embedder=None) as a:
        assert a.count() == 3


def test_a_tenant_view_removes_its_own_memories_at_their_versions(engine: Store) -> None:
    a, b = TenantStore(engine, "A"), TenantStore(engine, "B")
    mine, theirs = Memory(content="mine", tenant="A"), Memory(content="theirs", tenant="B")
    a.put(mine)
    b.put(theirs)
    a.put(mine.model_copy(update={"content": "mine, changed", "version": 2}))
    forgot = Event(kind="forget", memory_id=mine.id, tenant="A", at=datetime(2026, 6, 1, tzinfo=UTC))
    with pytest.raises(ConflictError):  # changed since it was read at version 1
        a.remove([mine], [forgot])
    with pytest.raises(AccessDeniedError):  # a memory of another tenant is not the view's to name
        a.remove([theirs], [])
    assert a.remove([mine.model_copy(update={"version": 2})], [forgot]) == 1
    assert a.get_many([mine.id]) == {} and b.get(theirs.id).content == "theirs"
    assert [e.memory_id for e in a.read_events(0, 10)] == [mine.id]


def test_a_tenant_view_guards_with_the_engines_write_lock(engine: Store) -> None:
    """The view had a lock of its own that no write took: a check-then-write under it was not atomic."""
    view = TenantStore(engine, "A")
    assert view.write_lock is engine.write_lock


@pytest.mark.parametrize("tenant", ["", "  ", None, "acme corp", "_auth", "x" * 65, "caf\u00e9"])
def test_a_harness_for_a_tenant_no_key_could_name_is_refused_at_open(tenant: object) -> None:
    """A blank tenant opened, and then every write failed; "acme corp" opened and stored memories that no
    API key could ever reach (the keyring refuses the name), so the server could never serve them."""
    with pytest.raises(ValidationError) as exc:
        Harness.open("memory://", embedder=None, tenant=tenant)  # type: ignore[arg-type]
    assert exc.value.field == "tenant" and exc.value.fix == TENANT_FIX


@pytest.mark.parametrize("tenant", ["acme corp", "_auth", ""])
def test_a_memory_of_a_tenant_no_key_could_name_is_refused_and_a_stored_one_still_reads(tenant: str) -> None:
    with pytest.raises(ValidationError) as exc:
        build_memory({"content": "x", "tenant": tenant})
    assert exc.value.field == "tenant"
    legacy = Memory.model_validate({"content": "x", "tenant": tenant}, context=STORED)
    assert legacy.tenant == tenant  # rows written before the rule still load
    with pytest.raises(ValidationError, match="tenant"):
        TenantStore(MemoryStore(), tenant)


@pytest.mark.engines("sqlite")
def test_a_copy_into_another_tenant_keeps_its_own_references(tmp_path: Path) -> None:
    """The ids another tenant holds were renamed, but not where metadata and snapshots name them: the copy's
    decompress looked for the first tenant's raw copy, and its rollback matched none of its memories."""
    target = str(tmp_path / "shared.db")
    prose = [
        "We talked about the weather and the long queue at the coffee shop.",
        "Nobody remembered where the old dashboards were kept.",
        "It rained all afternoon so the team stayed inside and planned.",
        "Everyone agreed that the retry policy needs a maximum delay.",
    ]
    long_text = " ".join(prose * 6)
    with (
        Harness.open(target, tenant="A", embedder=None) as a,
        Harness.open(target, tenant="B", embedder=None) as b,
    ):
        kept = a.record(long_text, session_id="s")
        assert "compression" in a.compress(kept.id).metadata
        with a.tool_call("grep", {"q": "rows"}, session_id="s") as call:
            call.set_result("3 rows")
        cp = a.checkpoint("s", "before")
        exported = list(a.iter_all(status="any"))
        done = b.import_renamed(exported)
        assert done.imported == len(exported) and set(done.renamed) == {m.id for m in exported}
        copy = done.renamed[kept.id]
        assert b.decompress(copy).content == long_text
        tool_call = next(m for m in b.list(kind="tool_call", status="any"))
        assert b.get(tool_call.metadata["tool_call"]["result_id"]).content == "3 rows"
        later = b.record("after the checkpoint", session_id="s")
        b.pin(copy)  # a change the rollback undoes
        report = b.rollback(done.renamed[cp])
        assert report.restored == [copy] and report.obsoleted == [later.id] and not b.get(copy).pinned
        assert a.get(kept.id).metadata["compression"]  # the first tenant's memory is as it was
