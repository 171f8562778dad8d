"""The storage contract, written once and run on every engine (``engine`` fixture, see conftest).

SQLite-only behaviour (persistence, several connections/processes on one file, driver errors) is at
the end, marked ``@pytest.mark.engines("sqlite")``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawvm import (
    AccessDeniedError,
    ClaimedError,
    ConfigError,
    ConflictError,
    DimensionError,
    Filters,
    Kind,
    Link,
    LinkType,
    Memory,
    NotFoundError,
    SchemaError,
    State,
    Status,
    StoreError,
    Tier,
    ValidationError,
)
from clawvm.core.model import revalidate
from clawvm.store import (
    Claim,
    Edge,
    Event,
    GroupKey,
    PageKey,
    PinBudget,
    PinBudgetError,
    Query,
    SQLiteStore,
    Store,
    store_from_url,
)
from clawvm.store.tenant import TenantStore
from engines import make_store
from strategies import at, memories

DIM = 384
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def mem(content: str = "some content", **fields: Any) -> Memory:
    return Memory(content=content, **fields)


def bump(m: Memory, **changes: Any) -> Memory:
    """The next version of ``m`` with ``changes`` (what an updater writes)."""
    return m.model_copy(update={**changes, "version": m.version + 1})


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def all_ids(store: Store) -> list[str]:
    return store.query(Query(limit=store.count() + 1)).filtered


# ---- put / get / delete -------------------------------------------------------------------------------
def test_exists_says_whether_a_store_is_set_up_there_and_asking_makes_none(
    engine_name: str, tmp_path: Path
) -> None:
    """A command that only reads asks first: a mistyped file or schema name was made into an empty store
    by the open, and answered from as if the store were empty."""
    fresh = make_store(engine_name, tmp_path, "exists.db")
    if engine_name == "memory":  # no location: a store in memory is there from the start
        assert fresh.exists()
        return
    assert not fresh.exists() and not fresh.exists()  # asking twice: the first made nothing
    again = make_store(engine_name, tmp_path, "exists.db")
    again.setup()
    try:
        assert fresh.exists() and again.exists()
    finally:
        again.close()
        fresh.close()


def test_put_then_get_returns_an_equal_memory(engine: Store) -> None:
    m = mem(
        "the build broke on step three",
        session_id="s1",
        tags=["ci", "build"],
        links=[Link(type=LinkType.REFERS_TO, target=mem().id)],
        metadata={"n": 1, "nested": {"a": [1, 2.5]}},
    )
    engine.put(m)
    got = engine.get(m.id)
    assert got == m
    assert got.tags == ["ci", "build"]


def test_get_many_returns_only_existing_ids(engine: Store) -> None:
    a, b = mem("alpha"), mem("beta")
    engine.put_many([a, b])
    missing = mem().id
    found = engine.get_many([a.id, missing, b.id])
    assert found == {a.id: a, b.id: b}
    assert engine.get_many([]) == {}
    assert engine.get_many([missing]) == {}


def test_tenants_of_names_each_stored_ids_tenant_as_get_many_would(engine: Store) -> None:
    ours, theirs = mem("ours", tenant="acme"), mem("theirs", tenant="globex")
    engine.put_many([ours, theirs])
    asked = [ours.id, theirs.id, "01a00000-0000-7000-8000-000000000000", "not-an-id"]
    assert engine.tenants_of(asked) == {ours.id: "acme", theirs.id: "globex"}
    assert engine.tenants_of([]) == {}
    assert TenantStore(engine, "acme").tenants_of(asked) == {ours.id: "acme"}


def test_group_counts_count_each_kind_status_and_tier_in_one_read(engine: Store) -> None:
    """What ``clawvm stats`` and ``GET /v1/stats`` derive every total from; the contract's default (one pass
    of iter_all) answers the same as each engine's own."""
    now = datetime.now(UTC)
    engine.put_many(
        [
            mem("a", kind="error", tier="working"),
            mem("b", kind="error", tier="working"),
            mem("c", kind="decision", status="archived", tier="archive"),
            mem("due", expires_at=now - timedelta(minutes=1), tier="short_term"),
            mem("later", expires_at=now + timedelta(hours=1), tier="short_term"),
            mem("theirs", tenant="globex", kind="error", tier="working"),
        ]
    )
    ours = Filters.of(tenant="default")
    stored = {
        GroupKey("error", "active", "working"): 2,
        GroupKey("decision", "archived", "archive"): 1,
        GroupKey("note", "active", "short_term"): 2,
    }
    due = {GroupKey("note", "active", "short_term"): 1, GroupKey("note", "expired", "short_term"): 1}
    archived = {GroupKey("decision", "archived", "archive"): 1}
    for counts in (engine.group_counts, partial(Store.group_counts, engine)):
        assert counts(ours) == stored
        assert counts(ours, now) == {**stored, **due}  # one due to expire counts as expired, as reads show it
        assert counts(Filters.of(tenant="default", status="archived")) == archived
        assert counts(Filters.of(tenant="nobody")) == {}
    assert sum(engine.group_counts().values()) == engine.count() == 6
    assert TenantStore(engine, "globex").group_counts() == {GroupKey("error", "active", "working"): 1}
    assert TenantStore(engine, "globex").group_counts(ours) == {}


def test_a_naive_time_in_a_filter_reads_as_utc_on_every_engine(engine: Store) -> None:
    """Memory and SQLite raised TypeError (naive minus aware); PostgreSQL read it as UTC."""
    m = mem("dated")
    engine.put_many([m])
    naive = m.created_at.astimezone(UTC).replace(tzinfo=None)
    assert engine.count(Filters(created_after=naive - timedelta(seconds=1))) == 1
    assert engine.count(Filters(created_before=naive)) == 0


def test_get_and_delete_of_missing_id_raise_not_found(engine: Store) -> None:
    ghost = mem().id
    with pytest.raises(NotFoundError) as exc:
        engine.get(ghost)
    assert exc.value.ident == ghost
    with pytest.raises(NotFoundError):
        engine.delete(ghost)
    assert isinstance(exc.value, LookupError)


def test_delete_removes_memory_from_get_and_every_query(engine: Store) -> None:
    a, b = mem("zebra crossing"), mem("zebra stripes")
    engine.put_many([a, b])
    engine.set_vectors([a.id, b.id], unit_vectors(2))
    engine.delete(a.id)
    with pytest.raises(NotFoundError):
        engine.get(a.id)
    assert all_ids(engine) == [b.id]
    res = engine.query(Query(text="zebra", vector=unit_vectors(2)[0]))
    assert [i for i, _ in res.lexical] == [b.id]
    assert [i for i, _ in res.dense] == [b.id]
    with pytest.raises(NotFoundError):
        engine.delete(a.id)


def test_delete_many_counts_existing_ids_once(engine: Store) -> None:
    a, b, c = mem("a"), mem("b"), mem("c")
    engine.put_many([a, b, c])
    assert engine.delete_many([a.id, a.id, mem().id, b.id]) == 2
    assert all_ids(engine) == [c.id]
    assert engine.delete_many([]) == 0


def test_remove_checks_versions_and_logs_its_events_in_one_step(engine: Store) -> None:
    """A delete and its event were two steps (a crash between them lost the event), with no version check
    (a change that landed after the read was deleted unseen)."""
    a, b, c = mem("a"), mem("b"), mem("c")
    engine.put_many([a, b, c])
    engine.put(bump(b, content="b changed"))  # since the caller read b
    seen = len(engine.read_events(0, 100))

    def forgot(m: Memory) -> Event:
        return Event(kind="forget", memory_id=m.id, at=at(2026))

    with pytest.raises(ConflictError) as exc:
        engine.remove([a, b], [forgot(a), forgot(b)])
    assert exc.value.ident == b.id and exc.value.expected == 1 and exc.value.actual == 2
    assert sorted(all_ids(engine)) == sorted([a.id, b.id, c.id]) and len(engine.read_events(0, 100)) == seen
    gone = mem("never stored")  # deleted already: skipped, not a conflict
    assert engine.remove([a, gone], [forgot(a)]) == 1
    assert sorted(all_ids(engine)) == sorted([b.id, c.id])
    assert [e.memory_id for e in engine.read_events(0, 100)][-1:] == [a.id]
    assert engine.remove([], []) == 0


def test_a_text_holding_nul_gets_its_vector(engine: Store) -> None:
    """SQLite's JSON functions end a text at U+0000: the vector's update compared the stored content that
    way, matched nothing, and the embed worker took the same row again forever."""
    binary = mem("ELF\x00\x01 header, then x\x00y")
    engine.put(binary)
    assert [p.id for p in engine.unembedded(10)] == [binary.id]
    engine.set_vectors([binary.id], np.ones((1, engine.dim), dtype=np.float32), contents=[binary.content])
    assert engine.unembedded(10) == [] and binary.id in engine.vectors_of([binary.id])
    assert engine.get(binary.id).content == binary.content
    moved = bump(binary, tier=Tier.ARCHIVE)  # the same text: the vector stays
    engine.put(moved)
    assert binary.id in engine.vectors_of([binary.id])
    engine.put(bump(moved, content="ELF"))  # cut at the NUL: new text, the old vector goes
    assert binary.id not in engine.vectors_of([binary.id])


def test_put_many_of_nothing_is_a_no_op(engine: Store) -> None:
    engine.put_many([])
    assert engine.count() == 0


def test_memory_can_be_re_created_after_delete(engine: Store) -> None:
    a = mem("phoenix rises")
    engine.put(a)
    engine.delete(a.id)
    engine.put(a)  # version 1 again: the id no longer exists
    assert engine.get(a.id) == a
    assert [i for i, _ in engine.query(Query(text="phoenix")).lexical] == [a.id]


def test_stored_memory_is_isolated_from_the_callers_objects(engine: Store) -> None:
    a = mem("original text", tags=["x"], metadata={"k": [1]})
    engine.put(a)
    with pytest.raises(pydantic.ValidationError):
        a.content = "mutated after put"  # type: ignore[misc]  # Memory is frozen
    a.tags.append("y")
    a.metadata["k"].append(2)
    got = engine.get(a.id)
    assert got.content == "original text" and got.tags == ["x"] and got.metadata == {"k": [1]}
    got.tags.append("z")
    assert engine.get(a.id).tags == ["x"]


# ---- optimistic locking -------------------------------------------------------------------------------
def test_a_new_id_keeps_the_version_it_carries_only_when_imported(engine: Store) -> None:
    # imports keep their versions: any version is accepted for an id that is not stored yet, if the writer
    # says it imports it; else a later version changes a memory that must be stored (one forgotten since
    # its writer read it came back whole: a recall's bookkeeping racing a forget in another process)
    m = mem("imported at version five", version=5)
    with pytest.raises(ConflictError) as gone:
        engine.put(m)
    assert gone.value.actual is None and engine.get_many([m.id]) == {}
    with pytest.raises(ConflictError):
        engine.write([m], None, [])
    engine.put_many([m], imported={m.id})
    assert engine.get(m.id).version == 5
    with pytest.raises(ConflictError) as exc:
        engine.put(m.model_copy(update={"content": "stale"}))
    assert exc.value.actual == 5
    engine.put(bump(m, content="six"))
    assert engine.get(m.id).version == 6


def test_version_must_be_stored_plus_one(engine: Store) -> None:
    a = mem("v1")
    engine.put(a)
    with pytest.raises(ConflictError) as exc:
        engine.put(a.model_copy(update={"content": "v1 again"}))  # same version: stale
    assert exc.value.actual == 1 and exc.value.ident == a.id
    with pytest.raises(ConflictError):
        engine.put(a.model_copy(update={"version": 3}))  # skips a version
    a2 = bump(a, content="v2")
    engine.put(a2)
    assert engine.get(a.id) == a2
    with pytest.raises(ConflictError):
        engine.put(bump(a, content="lost update"))  # also version 2, but 2 is now stored
    assert engine.get(a.id).content == "v2"


def race_to_create(stores: list[Store], shared: str) -> tuple[list[int], list[int]]:
    """Writer ``n`` puts a new memory ``writer n`` with id ``shared`` through ``stores[n]``, all at once;
    returns who succeeded and who got ConflictError."""
    start = threading.Barrier(len(stores))
    won: list[int] = []
    lost: list[int] = []

    def create(n: int, store: Store) -> None:
        start.wait()
        try:
            store.put(mem(f"writer {n}", id=shared))
            won.append(n)
        except ConflictError:
            lost.append(n)

    threads = [threading.Thread(target=create, args=(n, s)) for n, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_racing_creates_of_one_id_store_it_once(engine: Store, engine_name: str, tmp_path: Path) -> None:
    """An id is a unique key: of several writers creating one id at once (a derived id, such as the one
    the LangGraph adapter gives an item), exactly one succeeds and the others get ConflictError, whether
    they share a connection or each have their own on one file or database; a deleted id can be created
    again, and every connection then sees the new memory."""
    others = [] if engine_name == "memory" else [make_store(engine_name, tmp_path, "t.db") for _ in range(3)]
    for other in others:
        other.setup()
    stores = [engine, *others] if others else [engine] * 4
    try:
        for round_ in range(5):
            shared = mem().id
            won, lost = race_to_create(stores, shared)
            assert len(won) == 1 and sorted(won + lost) == [0, 1, 2, 3], (round_, won, lost)
            assert {s.get(shared).content for s in stores} == {f"writer {won[0]}"}
            assert all_ids(engine).count(shared) == 1
            stores[1].delete(shared)
            stores[2].put(mem("created again", id=shared))
            assert {s.get(shared).content for s in stores} == {"created again"}
            assert engine.count() == round_ + 1
    finally:
        for other in others:
            other.close()


def race_to_claim(stores: list[Store], claims: list[Claim]) -> tuple[list[int], list[ClaimedError]]:
    """Claimant ``n`` claims the store through ``stores[n]`` with ``claims[n]``, all at once; returns who
    took it and the errors of the others."""
    start = threading.Barrier(len(stores))
    won: list[int] = []
    refused: list[ClaimedError] = []

    def take(n: int) -> None:
        start.wait()
        try:
            stores[n].claim(claims[n])
            won.append(n)
        except ClaimedError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def test_a_claim_holds_the_whole_store_once_until_released(
    engine: Store, engine_name: str, tmp_path: Path
) -> None:
    """Store.claim (``clawvm migrate`` holds its target by it): of several claimants at once, on one store
    object or each with a connection of its own, exactly one takes it and the others get ClaimedError
    naming the holder; a release of another claim is ignored; a store still claimed refuses to open (what
    its job wrote may be a part only); once released it opens, and can be claimed again."""
    others = [] if engine_name == "memory" else [make_store(engine_name, tmp_path, "t.db") for _ in range(3)]
    for other in others:
        other.setup()
    stores = [engine, *others] if others else [engine] * 4
    claims = [Claim("migration", f"claimant {n}", T0 + timedelta(seconds=n)) for n in range(4)]
    try:
        won, refused = race_to_claim(stores, claims)
        assert len(won) == 1 and len(refused) == 3, (won, refused)
        holder = claims[won[0]]
        assert all("claimant" in exc.problem and "interrupted" in exc.problem for exc in refused)
        assert {s.held_claim() for s in stores} == {holder}
        other = claims[(won[0] + 1) % 4]
        stores[1].release(other)  # not the one held: ignored
        assert engine.held_claim() == holder
        if engine_name != "memory":  # the in-memory engine has nothing to reopen
            reopened = make_store(engine_name, tmp_path, "t.db")
            with pytest.raises(ClaimedError, match="held by a migration that has not finished"):
                reopened.setup()
        stores[2].release(holder)  # any connection may release the claim it names
        stores[2].release(holder)  # twice: a no-op
        assert all(s.held_claim() is None for s in stores)
        if engine_name != "memory":
            with make_store(engine_name, tmp_path, "t.db") as reopened:
                assert reopened.held_claim() is None
        engine.claim(other)
        assert engine.held_claim() == other
        view = TenantStore(engine, "a")
        assert view.held_claim() == other  # a claim holds every tenant ...
        with pytest.raises(ValidationError, match="cannot be claimed") as refused:  # ... nor one tenant's
            view.claim(holder)
        assert refused.value.field == "store" and "engine itself" in refused.value.fix
    finally:
        for o in others:
            o.close()


@pytest.mark.parametrize("stale_first", [True, False])
@pytest.mark.parametrize("stale_version", [1, 2])
def test_stale_put_writes_nothing_of_the_batch(engine: Store, stale_first: bool, stale_version: int) -> None:
    """Version 2 again, or version 1 (as a new memory carries: the write tries it as a new row first and
    meets the stored one), beside new memories: none of the batch is written."""
    a = mem("apple original")
    engine.put(a)
    engine.put(bump(a, content="apple second"))
    fresh1, fresh2 = mem("banana fresh"), mem("cherry fresh")
    stale = a.model_copy(update={"content": "apple stale durian", "version": stale_version})
    batch = [stale, fresh1, fresh2] if stale_first else [fresh1, fresh2, stale]
    with pytest.raises(ConflictError):
        engine.put_many(batch)
    assert engine.get_many([fresh1.id, fresh2.id]) == {}
    assert engine.get(a.id).content == "apple second"
    assert all_ids(engine) == [a.id]
    for word in ("banana", "cherry", "durian"):
        assert engine.query(Query(text=word)).lexical == []
    assert [i for i, _ in engine.query(Query(text="apple second")).lexical] == [a.id]


def test_write_stores_memories_vectors_and_events_together(engine: Store) -> None:
    a, b = mem("alpha lake"), mem("beta hill")
    vecs = unit_vectors(2, seed=3)
    engine.write([a, b], vecs, [Event("add", a.id, {"n": 1}), Event("add", b.id, {"n": 2})])
    assert set(engine.get_many([a.id, b.id])) == {a.id, b.id}
    assert engine.query(Query(vector=vecs[1], limit=1)).dense[0][0] == b.id
    assert [e.memory_id for e in engine.read_events()] == [a.id, b.id]
    assert engine.unembedded(10) == []


def test_write_returns_its_events_numbers_as_the_log_and_a_tenants_view_number_them(engine: Store) -> None:
    """A writer that hands an event's number out (a context build) writes the event with its memories and
    must still know the number: the write returns them, as the log reads them, or behind a tenant's view
    as that view reads them (the tenant's own sequence)."""
    engine.append_events([Event("note", None, {}, tenant="other")] * 3)  # the log runs ahead of acme's
    a = mem("alpha lake", tenant="acme")
    seqs = engine.write([a], None, [Event("add", a.id, {}, tenant="acme"), Event("note", a.id, {}, "acme")])
    assert seqs == [e.seq for e in engine.read_events()][-2:] == [4, 5]
    view = TenantStore(engine, "acme")
    b = mem("beta hill", tenant="acme")
    numbers = view.write([b], None, [Event("add", b.id, {}, tenant="acme")])
    assert numbers == [e.seq for e in view.read_events() if e.memory_id == b.id] == [3]
    assert view.write([], None, [Event("note", None, {}, tenant="acme")]) == [4]  # an event alone
    assert engine.write([mem("gamma")], None, []) == []


def test_write_takes_vectors_for_the_leading_memories_only(engine: Store) -> None:
    a, b = mem("alpha lake"), mem("beta hill")  # a record with a vector, and a memory it demotes
    vec = unit_vectors(1, seed=4)
    engine.write([a, b], vec, [Event("add", a.id, {})])
    assert engine.query(Query(vector=vec[0], limit=2)).dense == [(a.id, pytest.approx(1.0, abs=1e-5))]
    assert engine.unembedded(10) == [(b.id, "beta hill")]
    c = mem("gamma")
    with pytest.raises(ValidationError) as exc:  # more rows than memories
        engine.write([c], unit_vectors(2, seed=5), [Event("add", c.id, {})])
    assert exc.value.field == "vectors"
    assert engine.get_many([c.id]) == {} and len(engine.read_events()) == 1


def test_stale_write_stores_no_memory_vector_or_event(engine: Store) -> None:
    a = mem("alpha original")
    engine.write([a], unit_vectors(1, seed=1), [Event("add", a.id, {})])
    engine.put(bump(a, content="alpha second"))  # drops the vector: the text changed
    fresh, stale = mem("gamma fresh"), bump(a, content="alpha stale")  # version 2 again
    with pytest.raises(ConflictError):
        engine.write([fresh, stale], unit_vectors(2, seed=2), [Event("update", a.id, {})])
    assert engine.get_many([fresh.id]) == {} and engine.get(a.id).content == "alpha second"
    assert [e.kind for e in engine.read_events()] == ["add"]
    assert engine.unembedded(10) == [(a.id, "alpha second")]


# ---- preconditions ------------------------------------------------------------------------------------
OVER_PIN_BUDGET = "would put the pinned memories of this session over the working-tier budget"


def pin_budget(items: int | None = None, tokens: int | None = None, tenant: str = "default") -> PinBudget:
    """Session "s"'s pinned budget, as of T0."""
    return PinBudget(tenant, "s", T0, items, tokens)


def pin(content: str, tokens: int, **fields: Any) -> Memory:
    """A memory pinned in session "s" (its working tier), of ``tokens`` tokens."""
    pinned = {"session_id": "s", "tier": Tier.WORKING, "pinned": True, "created_at": T0 - timedelta(hours=2)}
    return mem(content, token_count=tokens, **{**pinned, **fields})


def test_a_write_past_its_pin_budget_writes_no_memory_vector_or_event(engine: Store) -> None:
    held, budget = pin("held pin", 30), [pin_budget(tokens=50)]
    engine.write([held], None, [Event("pin", held.id, {})], requires=budget)
    over = pin("one pin too many", 30)
    with pytest.raises(PinBudgetError) as exc:
        engine.write([over], unit_vectors(1, seed=6), [Event("add", over.id, {})], requires=budget)
    assert isinstance(exc.value, ValidationError)  # what a sequential pin over the budget raises
    assert (exc.value.field, exc.value.problem) == ("pinned", OVER_PIN_BUDGET)
    assert engine.get_many([over.id]) == {} and engine.vectors_of([over.id]) == {}
    assert [e.memory_id for e in engine.read_events()] == [held.id]
    fits = pin("fits beside it", 20)
    engine.write([fits], unit_vectors(1, seed=7), [Event("add", fits.id, {})], requires=budget)
    assert engine.get(fits.id).pinned and set(engine.vectors_of([fits.id])) == {fits.id}
    with pytest.raises(PinBudgetError):  # by items too
        engine.write([pin("third", 0)], requires=[pin_budget(items=2)])
    assert engine.count(Filters.of(session_id="s")) == 2


def test_a_pin_budget_counts_the_batch_as_written_and_only_live_pins_of_its_session(engine: Store) -> None:
    held = pin("held pin", 40)
    others = [
        pin("expired by the budget's instant", 40, expires_at=T0 - timedelta(minutes=1)),
        pin("another session's", 40, session_id="t"),
        pin("another tenant's", 40, tenant="globex"),
        pin("archived", 40, status=Status.ARCHIVED),
        mem("working, not pinned", session_id="s", tier=Tier.WORKING, token_count=40),
    ]
    engine.put_many([held, *others])
    budget = [pin_budget(items=2, tokens=50)]
    grown = bump(held, token_count=50)
    engine.write([grown], requires=budget)  # counted once, as written
    with pytest.raises(PinBudgetError):
        engine.write([bump(grown, token_count=51)], requires=budget)
    swapped = pin("takes its place", 45)
    engine.write([bump(grown, pinned=False), swapped], requires=budget)  # the unpin frees the room
    live = Filters.of(tenant="default", session_id="s", pinned=True, status="active", live_at=T0)
    assert [m.id for m in engine.list(live)] == [swapped.id]


def test_a_tenant_view_passes_on_its_own_pin_budget_only(engine: Store) -> None:
    view = TenantStore(engine, "acme")
    a = pin("acme's pin", 30, tenant="acme")
    with pytest.raises(AccessDeniedError):
        view.write([a], requires=[pin_budget(tokens=100)])  # the default tenant's session
    assert engine.get_many([a.id]) == {}
    engine.put(pin("acme's held pin", 30, tenant="acme"))
    with pytest.raises(PinBudgetError):
        view.write([a], requires=[pin_budget(tokens=50, tenant="acme")])
    view.write([a], requires=[pin_budget(tokens=60, tenant="acme")])
    assert engine.get(a.id).pinned


def test_duplicate_ids_in_one_batch_are_rejected(engine: Store) -> None:
    a, other = mem("one"), mem("other")
    with pytest.raises(ValidationError) as exc:
        engine.put_many([a, other, a.model_copy(update={"content": "two"})])
    assert exc.value.field == "memories"
    assert engine.count() == 0


# ---- queries ------------------------------------------------------------------------------------------
def test_lexical_query_ranks_the_matching_memory_first(engine: Store) -> None:
    docs = [
        mem("the weather today is sunny and warm"),
        mem("kubernetes pod stuck in crashloop backoff after deploy"),
        mem("lunch order: two pizzas and a salad"),
        mem("deploy finished without errors"),
    ]
    engine.put_many(docs)
    hits = engine.query(Query(text="why is the kubernetes pod crashlooping?")).lexical
    assert hits[0][0] == docs[1].id
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert docs[2].id not in {i for i, _ in hits}
    assert engine.query(Query(text="the and of")).lexical == []  # stop words only


def test_lexical_index_covers_tags_and_tool_name(engine: Store) -> None:
    a = mem("plain text", tags=["postgres"], tool_name="psql_runner")
    b = mem("other text")
    engine.put_many([a, b])
    assert [i for i, _ in engine.query(Query(text="postgres")).lexical] == [a.id]
    assert [i for i, _ in engine.query(Query(text="psql_runner")).lexical] == [a.id]


def test_a_cjk_word_inside_a_sentence_is_found_lexically(engine: Store) -> None:
    """Chinese, Japanese and Korean put no spaces between words: a stored sentence must still match a
    query of one of its words, and not a sentence that only shares a letter with it."""
    apples = mem("我喜欢吃苹果，不喜欢香蕉")
    tower = mem("昨日は東京タワーに行きました")
    korean = mem("나는 사과를 좋아한다")
    other = mem("我喜欢喝茶")  # shares 我喜欢 with the first, not 苹果
    engine.put_many([apples, tower, korean, other])
    assert [i for i, _ in engine.query(Query(text="苹果")).lexical] == [apples.id]
    assert [i for i, _ in engine.query(Query(text="東京タワー")).lexical] == [tower.id]
    assert [i for i, _ in engine.query(Query(text="사과")).lexical] == [korean.id]


def test_dense_query_returns_nearest_first(engine: Store) -> None:
    docs = [mem(f"doc {i}") for i in range(6)]
    engine.put_many(docs)
    vecs = unit_vectors(6, seed=1)
    engine.set_vectors([d.id for d in docs], vecs * 3.0)  # stored unit-normalised
    q = vecs[4] + 0.05 * unit_vectors(1, seed=2)[0]
    hits = engine.query(Query(vector=q, limit=3)).dense
    assert len(hits) == 3
    assert hits[0][0] == docs[4].id
    assert hits[0][1] == pytest.approx(float(vecs[4] @ (q / np.linalg.norm(q))), abs=1e-4)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    expected = np.argsort(-(vecs @ q))[:3]
    assert [i for i, _ in hits] == [docs[j].id for j in expected]


def test_dense_limit_sets_the_dense_channels_own_depth(engine: Store) -> None:
    docs = [mem(f"doc {i} shared") for i in range(6)]
    engine.put_many(docs)
    vecs = unit_vectors(6, seed=3)
    engine.set_vectors([d.id for d in docs], vecs)
    res = engine.query(Query(text="shared", vector=vecs[0], limit=2, dense_limit=5))
    assert len(res.lexical) == 2 and len(res.dense) == 5  # the lexical channel keeps ``limit``
    assert [i for i, _ in res.dense] == [docs[j].id for j in np.argsort(-(vecs @ vecs[0]))[:5]]
    assert len(engine.query(Query(vector=vecs[0], limit=2)).dense) == 2  # no dense_limit: ``limit``


def test_equal_scores_rank_the_later_stored_memory_first_on_every_channel(engine: Store) -> None:
    """Identical vectors, an equal cosine, the same text: each channel ranks the later stored memory
    first, and a limit that cuts a run of equal scores keeps the later stored ones (the contract's tie
    rule, :class:`Query`), on every engine alike."""
    best, *same = [mem("the backup job failed again") for _ in range(5)]
    engine.put_many([best, *same[:2]])
    engine.put_many(same[2:])  # a later write: its memories are the later stored
    e = np.eye(DIM, dtype=np.float32)
    tied = e[0] + e[1]
    rows = [e[0] + 0.01 * e[3], tied, tied, e[0] + e[2], tied]  # row 3: an equal cosine, another vector
    engine.set_vectors([m.id for m in [best, *same]], np.stack(rows))
    newest_first = [m.id for m in reversed(same)]
    hits = engine.query(Query(vector=e[0], lexical=False, limit=10)).dense
    assert [i for i, _ in hits] == [best.id, *newest_first]
    assert len({s for _, s in hits[1:]}) == 1  # the four tie exactly
    for limit in (2, 3, 4):  # the cut falls inside the run: the later stored stay
        cut = engine.query(Query(vector=e[0], lexical=False, limit=limit)).dense
        assert [i for i, _ in cut] == [best.id, *newest_first][:limit]
    words = engine.query(Query(text="backup job failed", limit=3)).lexical
    assert [i for i, _ in words] == [m.id for m in reversed([best, *same])][:3]
    engine.put(bump(same[0], tags=["moved"]))  # a change is not a new memory: the order stays
    hits = engine.query(Query(vector=e[0], lexical=False, limit=10, filters=Filters.of(tags_any=None))).dense
    assert [i for i, _ in hits] == [best.id, *newest_first]


def test_set_vectors_ignores_unknown_ids(engine: Store) -> None:
    a = mem("a")
    engine.put(a)
    engine.set_vectors([mem().id, a.id], unit_vectors(2))
    assert engine.unembedded(10) == []
    assert [i for i, _ in engine.query(Query(vector=unit_vectors(2)[1])).dense] == [a.id]


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((1, 3)),
        np.zeros((2, DIM)),
        np.full((1, DIM), np.nan),
        np.full((1, DIM), np.inf),
        [["x"] * DIM],
    ],
    ids=["wrong-dim", "wrong-count", "nan", "inf", "not-numbers"],
)
def test_bad_vectors_are_rejected_and_change_nothing(engine: Store, bad: Any) -> None:
    a = mem("a")
    engine.put(a)
    with pytest.raises(ValidationError) as exc:
        engine.set_vectors([a.id], bad)
    assert exc.value.field == "vectors"
    assert engine.unembedded(10) == [(a.id, "a")]
    with pytest.raises(ValidationError) as exc:
        engine.query(Query(vector=np.zeros(DIM // 2)))
    assert exc.value.field == "vector"


@pytest.mark.parametrize(
    "bad",
    [np.zeros(DIM), np.full(DIM, 1e-30), np.full(DIM, 1e30)],
    ids=["zero", "underflowing", "overflowing"],
)
def test_a_vector_without_a_direction_is_refused_before_anything_is_written(engine: Store, bad: Any) -> None:
    """A zero vector (or one whose length float32 cannot hold) scores 0 against every query: stored, it
    was never found and counted as a real score wherever it was a candidate."""
    a, b = mem("a"), mem("b")
    engine.put_many([a, b])
    with pytest.raises(ValidationError) as exc:
        engine.set_vectors([a.id, b.id], np.stack([unit_vectors(1)[0], bad]))
    assert exc.value.field == "vectors" and "row 1" in exc.value.problem and exc.value.fix
    assert [u.id for u in engine.unembedded(10)] == [a.id, b.id]  # the good row was not written either
    c = mem("c")
    with pytest.raises(ValidationError) as exc:
        engine.write([c], bad.reshape(1, DIM), [Event("add", c.id)])
    assert exc.value.field == "vectors"
    assert engine.get_many([c.id]) == {} and engine.read_events(0, 10, c.id) == []
    with pytest.raises(ValidationError):
        TenantStore(engine, "default").set_vectors([a.id], bad.reshape(1, DIM))
    assert engine.vectors_of([a.id, b.id]) == {}
    # a query vector is not held to it: a zero query finds nothing better than anything else
    engine.query(Query(vector=np.zeros(DIM)))


def test_filter_only_query_lists_newest_first_with_limit(engine: Store) -> None:
    docs = [mem(f"m{i}", created_at=T0 + timedelta(minutes=i)) for i in (3, 0, 4, 1, 2)]
    engine.put_many(docs)
    by_time = sorted(docs, key=lambda m: m.created_at, reverse=True)
    assert engine.query(Query(limit=10)).filtered == [m.id for m in by_time]
    assert engine.query(Query(limit=2)).filtered == [m.id for m in by_time[:2]]
    assert [m.id for m in engine.list(limit=3)] == [m.id for m in by_time[:3]]
    assert [m.id for m in engine.iter_all(batch=2)] == [m.id for m in reversed(by_time)]
    assert engine.count() == 5


def test_pages_follow_a_keyset_of_creation_time_then_id(engine: Store) -> None:
    # three memories share one instant: the id orders them, in both directions
    tied = sorted((mem(f"tie {i}", created_at=T0) for i in range(3)), key=lambda m: m.id)
    early = mem("early", created_at=T0 - timedelta(seconds=1))
    late = mem("late", created_at=T0 + timedelta(microseconds=1))
    engine.put_many([late, *tied, early])
    oldest_first = [early.id, *(m.id for m in tied), late.id]
    pages = []
    after = None
    while True:
        page = engine.page(Filters(), after, limit=2)
        pages.append([m.id for m in page])
        if len(page) < 2:
            break
        after = PageKey.of(page[-1])
    assert pages == [oldest_first[0:2], oldest_first[2:4], oldest_first[4:]]
    assert [m.id for m in engine.iter_all(batch=1, newest_first=True)] == oldest_first[::-1]
    assert [m.id for m in engine.page(Filters(), PageKey.of(tied[1]), limit=10)] == [tied[2].id, late.id]
    assert [m.id for m in engine.page(Filters(), PageKey.of(tied[1]), 10, newest_first=True)] == [
        tied[0].id,
        early.id,
    ]
    assert engine.page(Filters(), None, limit=0) == []


def test_pages_as_stored_json_are_the_pages_of_memories(engine: Store) -> None:
    """``page_json``/``iter_json`` (what MemLens reads its table with) give each memory of ``page`` as its
    JSON, in the same keyset order, through every page."""
    docs = [
        mem(f"m{i}", created_at=T0 + timedelta(minutes=i % 3), tier=Tier.WORKING, tags=[f"t{i}"])
        for i in range(7)
    ]
    engine.put_many(docs)
    expected = [m.model_dump(mode="json") for m in engine.iter_all(Filters(), batch=3)]
    assert len(expected) == 7
    assert list(engine.iter_json(Filters(), batch=2)) == expected
    assert engine.page_json(Filters(), PageKey.of(docs[0]), limit=3) == [
        m.model_dump(mode="json") for m in engine.page(Filters(), PageKey.of(docs[0]), limit=3)
    ]
    assert [d["id"] for d in engine.iter_json(Filters.of(tags=["t3"]))] == [docs[3].id]


def test_a_page_goes_on_after_its_key_even_when_that_memory_changed_or_left(engine: Store) -> None:
    docs = [mem(f"m{i}", created_at=T0 + timedelta(minutes=i), tier=Tier.WORKING) for i in range(6)]
    engine.put_many(docs)
    active = Filters.of(tier="working")
    first = engine.page(active, None, limit=2)
    # between pages: the page's last memory leaves the filter, a later one is deleted, one is added
    engine.put(bump(first[-1], tier=Tier.SHORT_TERM))
    engine.delete(docs[3].id)
    extra = mem("late", created_at=T0 + timedelta(hours=1), tier=Tier.WORKING)
    engine.put(extra)
    rest = engine.page(active, PageKey.of(first[-1]), limit=10)
    assert [m.id for m in rest] == [docs[2].id, docs[4].id, docs[5].id, extra.id]


def _corpus() -> dict[str, Memory]:
    a = mem(
        "shared alpha",
        tenant="t1",
        session_id="s1",
        task_id="k1",
        agent_id="g1",
        tool_name="grep",
        kind=Kind.TOOL_CALL,
        state=State.PENDING,
        status=Status.ACTIVE,
        tier=Tier.WORKING,
        tags=["x", "y"],
        pinned=True,
        created_at=T0,
        expires_at=T0 + timedelta(hours=1),
    )
    b = mem(
        "shared beta",
        tenant="t1",
        session_id="s2",
        task_id="k2",
        agent_id="g2",
        tool_name="curl",
        kind=Kind.TOOL_RESULT,
        state=State.ERROR,
        status=Status.ARCHIVED,
        tier=Tier.LONG_TERM,
        tags=["y"],
        parent_id=a.id,
        created_at=T0 + timedelta(hours=1),
    )
    c = mem(
        "shared gamma",
        tenant="t2",
        session_id="s1",
        kind=Kind.NOTE,
        status=Status.ACTIVE,
        tier=Tier.SHORT_TERM,
        parent_id=a.id,
        created_at=T0 + timedelta(hours=2),
    )
    d = mem(
        "shared delta",
        tenant="t1",
        kind=Kind.ERROR,
        state=State.SUCCESS,
        status=Status.OBSOLETE,
        tier=Tier.ARCHIVE,
        tags=["z", "x"],
        parent_id=b.id,
        created_at=T0 + timedelta(hours=3),
        expires_at=T0 + timedelta(hours=5),
    )
    return {"a": a, "b": b, "c": c, "d": d}


T1 = T0 + timedelta(hours=1)
FILTER_CASES: list[tuple[dict[str, Any], str]] = [
    ({"tenant": "t2"}, "c"),
    ({"tenant": ["t1", "t2"]}, "abcd"),
    ({"tenant": []}, ""),
    ({"session_id": "s1"}, "ac"),
    ({"session_id": "nope"}, ""),
    ({"task_id": "k2"}, "b"),
    ({"agent_id": ["g1", "g2"]}, "ab"),
    ({"tool_name": "curl"}, "b"),
    ({"kind": "note"}, "c"),
    ({"kind": [Kind.TOOL_CALL, "error"]}, "ad"),
    ({"state": "error"}, "b"),
    ({"state": [State.PENDING, "success"]}, "ad"),
    ({"status": "active"}, "ac"),
    ({"status": ["archived", "obsolete"]}, "bd"),
    ({"tier": Tier.ARCHIVE}, "d"),
    ({"tier": ["working", "short_term"]}, "ac"),
    ({"tags_all": ["x"]}, "ad"),
    ({"tags": ["x", "y"]}, "a"),
    ({"tags_all": ["x", "nope"]}, ""),
    ({"tags_any": ["y", "z"]}, "abd"),
    ({"tags_any": ["nope"]}, ""),
    ({"parent_id": "@a"}, "bc"),
    ({"parent_id": "@b"}, "d"),
    ({"pinned": True}, "a"),
    ({"pinned": False}, "bcd"),
    ({"created_after": T1}, "bcd"),  # inclusive
    ({"created_before": T1}, "a"),  # exclusive
    ({"created_after": T1, "created_before": T1 + timedelta(hours=2)}, "bc"),
    ({"expires_by": T1}, "a"),  # inclusive; no expiry never matches
    ({"expires_by": T0}, ""),
    ({"expires_by": T0 + timedelta(hours=9), "status": "obsolete"}, "d"),
    ({"live_at": T1}, "bcd"),  # exclusive: expiring at T1 is expired at T1; no expiry is always live
    ({"live_at": T0}, "abcd"),
    ({"live_at": T1, "status": "active"}, "c"),
    # an active memory only when due by then (a read of expired memories that no sweep marked yet)
    ({"active_due_by": T1}, "abd"),
    ({"active_due_by": T0}, "bd"),
    ({"active_due_by": T1, "status": ["active", "obsolete"]}, "ad"),
    ({"tenant": "t1", "status": "active"}, "a"),
    ({"session_id": "s1", "tags_any": ["y"], "kind": "tool_call"}, "a"),
]


@pytest.mark.parametrize(("spec", "expected"), FILTER_CASES, ids=[str(c[0]) for c in FILTER_CASES])
def test_every_filter_field_on_every_channel(engine: Store, spec: dict[str, Any], expected: str) -> None:
    corpus = _corpus()
    engine.put_many(list(corpus.values()))
    engine.set_vectors([m.id for m in corpus.values()], unit_vectors(4))
    spec = {k: corpus[v[1:]].id if isinstance(v, str) and v.startswith("@") else v for k, v in spec.items()}
    f = Filters.of(**spec)
    want = {corpus[name].id for name in expected}
    assert want == {m.id for m in corpus.values() if f.matches(m)}  # reference semantics agree
    listed = engine.query(Query(filters=f, limit=100)).filtered
    assert listed == [
        m.id for m in sorted(corpus.values(), key=lambda m: m.created_at, reverse=True) if m.id in want
    ]
    res = engine.query(Query(filters=f, text="shared", vector=unit_vectors(1, seed=9)[0], limit=100))
    assert {i for i, _ in res.lexical} == want
    assert {i for i, _ in res.dense} == want
    assert engine.count(f) == len(want)


@pytest.mark.parametrize("year", [1, 1969, 2026, 2300, 9999])
def test_time_filters_are_exact_to_the_microsecond(engine: Store, year: int) -> None:
    before, exact, after = (mem(f"t{d}", created_at=at(year, us=d)) for d in (-1, 0, 1))
    engine.put_many([before, exact, after])
    assert engine.query(Query(filters=Filters.of(created_before=at(year)))).filtered == [before.id]
    assert engine.query(Query(filters=Filters.of(created_after=at(year)))).filtered == [after.id, exact.id]
    f = Filters.of(created_after=at(year), created_before=at(year, us=1))
    assert engine.query(Query(filters=f, text="t0")).lexical[0][0] == exact.id
    assert engine.query(Query(filters=f)).filtered == [exact.id]


def test_filtered_queries_honour_limit_per_channel(engine: Store) -> None:
    docs = [mem(f"shared item {i}", session_id="s" + str(i % 2)) for i in range(10)]
    engine.put_many(docs)
    engine.set_vectors([d.id for d in docs], unit_vectors(10))
    f = Filters.of(session_id="s1")
    res = engine.query(Query(filters=f, text="shared item", vector=unit_vectors(1, seed=5)[0], limit=3))
    odd = {d.id for d in docs[1::2]}
    assert len(res.lexical) == 3 and {i for i, _ in res.lexical} <= odd
    assert len(res.dense) == 3 and {i for i, _ in res.dense} <= odd


# ---- vectors and the embedding queue ------------------------------------------------------------------
def test_updating_content_drops_the_vector(engine: Store) -> None:
    a, b = mem("first text"), mem("second text")
    engine.put_many([a, b])
    vecs = unit_vectors(2)
    engine.set_vectors([a.id, b.id], vecs)
    assert engine.unembedded(10) == []
    a2 = bump(a, tags=["only", "tags"])  # same content: the vector stays
    engine.put(a2)
    assert engine.unembedded(10) == []
    assert engine.query(Query(vector=vecs[0], limit=1)).dense[0][0] == a.id
    a3 = bump(a2, content="rewritten text")
    engine.put(a3)
    assert engine.unembedded(10) == [(a.id, "rewritten text")]
    assert [i for i, _ in engine.query(Query(vector=vecs[0])).dense] == [b.id]
    engine.set_vectors([a.id], vecs[:1])
    assert engine.unembedded(10) == []
    assert engine.query(Query(vector=vecs[0], limit=1)).dense[0][0] == a.id


def test_unembedded_lists_memories_without_vectors_oldest_first(engine: Store) -> None:
    docs = [mem(f"text {i}", created_at=T0 + timedelta(seconds=i)) for i in range(5)]
    for d in docs:
        engine.put(d)
    assert engine.unembedded(10) == [(d.id, d.content) for d in docs]
    assert engine.unembedded(2) == [(d.id, d.content) for d in docs[:2]]
    engine.set_vectors([docs[0].id, docs[3].id], unit_vectors(2))
    assert engine.unembedded(10) == [(docs[i].id, docs[i].content) for i in (1, 2, 4)]
    engine.delete(docs[1].id)
    assert [i for i, _ in engine.unembedded(10)] == [docs[2].id, docs[4].id]


# ---- edges --------------------------------------------------------------------------------------------
def test_edges_in_both_directions_replaced_and_removed(engine: Store) -> None:
    b, c, d = mem("b"), mem("c"), mem("d")
    a = mem(
        "a", links=[Link(type=LinkType.CAUSED_BY, target=b.id), Link(type=LinkType.REFERS_TO, target=c.id)]
    )
    engine.put_many([a, b, c, d])
    ab, ac = Edge(a.id, LinkType.CAUSED_BY, b.id), Edge(a.id, LinkType.REFERS_TO, c.id)
    assert set(engine.edges([a.id])) == {ab, ac}
    assert engine.edges([b.id]) == [ab]  # incoming
    assert set(engine.edges([b.id, c.id])) == {ab, ac}
    assert engine.edges([d.id]) == []
    assert engine.edges([]) == []

    a2 = bump(a, links=[Link(type=LinkType.DERIVED_FROM, target=d.id)])
    engine.put(a2)
    ad = Edge(a.id, LinkType.DERIVED_FROM, d.id)
    assert engine.edges([a.id]) == [ad]
    assert engine.edges([b.id, c.id]) == []
    assert engine.edges([d.id]) == [ad]

    a3 = bump(a2, content="a, moved and reworded")  # same links: kept as they are
    engine.put(a3)
    assert engine.edges([a.id, d.id]) == [ad]
    engine.put(bump(a3, links=[]))
    assert engine.edges([a.id, d.id]) == []
    engine.put(bump(engine.get(a.id), links=[Link(type=LinkType.DERIVED_FROM, target=d.id)]))
    assert engine.edges([a.id]) == [ad]

    engine.delete(a.id)
    assert engine.edges([a.id, b.id, c.id, d.id]) == []


def test_edges_are_listed_once(engine: Store) -> None:
    b = mem("b")
    link = Link(type=LinkType.REVISES, target=b.id)
    a = mem("a", links=[link, link])
    c = mem("c", links=[Link(type=LinkType.REVISES, target=a.id)])
    engine.put_many([a, b, c])
    edges = engine.edges([a.id, b.id, c.id])
    assert len(edges) == len(set(edges)) == 2


def test_links_to_a_deleted_target_stay(engine: Store) -> None:
    b = mem("b")
    a = mem("a", links=[Link(type=LinkType.SUMMARIZES, target=b.id)])
    engine.put_many([a, b])
    engine.delete(b.id)
    assert engine.edges([a.id]) == [Edge(a.id, LinkType.SUMMARIZES, b.id)]


# ---- events -------------------------------------------------------------------------------------------
def test_events_append_and_read(engine: Store) -> None:
    m1, m2 = mem().id, mem().id
    first = [
        Event(
            "add",
            m1,
            {"kind": "note", "n": [1, 2.5, None, True], "deep": {"x": {"y": "ü"}}},
            tenant="t1",
            at=T0,
        ),
        Event("add", m2, {}, at=T0 + timedelta(seconds=1)),
    ]
    s1 = engine.append_events(first)
    s2 = engine.append_events([Event("update", m1, {"fields": ["tags"]}), Event("note", None, {"msg": "hi"})])
    seqs = s1 + s2
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert engine.append_event(Event("forget", m2, {})) > seqs[-1]

    read = engine.read_events()
    assert [e.seq for e in read] == [*seqs, read[-1].seq]
    assert [e.kind for e in read] == ["add", "add", "update", "note", "forget"]
    assert read[0].data == first[0].data
    assert read[0].tenant == "t1" and read[0].at == T0 and read[0].memory_id == m1
    assert read[3].memory_id is None
    assert [e.kind for e in engine.read_events(after_seq=seqs[1])] == ["update", "note", "forget"]
    assert [e.kind for e in engine.read_events(memory_id=m1)] == ["add", "update"]
    assert [e.seq for e in engine.read_events(after_seq=seqs[0], memory_id=m1)] == [seqs[2]]
    assert [e.kind for e in engine.read_events(limit=2)] == ["add", "add"]
    assert [e.kind for e in engine.read_events(after_seq=seqs[0], limit=1, memory_id=m2)] == ["add"]
    assert engine.read_events(after_seq=read[-1].seq) == []


# ---- properties ---------------------------------------------------------------------------------------
POOL_TIMES = [at(2026), at(2026, us=1), at(2026, us=-1), at(2030), at(1969), at(9999), at(9999, us=-1), at(1)]
SMALL = ["a", "b"]
PARENTS = ["00000000-0000-7000-8000-00000000aaaa", "00000000-0000-7000-8000-00000000bbbb"]


def _opt(values: list[str]) -> st.SearchStrategy[str | None]:
    return st.none() | st.sampled_from(values)


@st.composite
def scoped_memories(draw: st.DrawFn) -> list[Memory]:
    n = draw(st.integers(min_value=0, max_value=12))
    out = []
    for i in range(n):
        out.append(
            Memory(
                id=f"00000000-0000-7000-8000-{i:012x}",
                content=f"shared word{i % 3}",
                tenant=draw(st.sampled_from(SMALL)),
                session_id=draw(_opt(SMALL)),
                task_id=draw(_opt(SMALL)),
                agent_id=draw(_opt(SMALL)),
                tool_name=draw(_opt(SMALL)),
                kind=draw(st.sampled_from([Kind.NOTE, Kind.ERROR, Kind.TOOL_CALL])),
                state=draw(st.none() | st.sampled_from([State.PENDING, State.ERROR])),
                status=draw(st.sampled_from([Status.ACTIVE, Status.ARCHIVED])),
                tier=draw(st.sampled_from([Tier.WORKING, Tier.LONG_TERM])),
                tags=draw(st.lists(st.sampled_from(["x", "y", "z"]), max_size=3)),
                parent_id=draw(st.none() | st.sampled_from(PARENTS)),
                pinned=draw(st.booleans()),
                created_at=draw(st.sampled_from(POOL_TIMES)),
                expires_at=draw(st.none() | st.sampled_from(POOL_TIMES)),
            )
        )
    return out


def _set_of(values: list[str]) -> st.SearchStrategy[frozenset[str] | None]:
    return st.none() | st.frozensets(st.sampled_from([*values, "other"]), max_size=3)


FILTER_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "tenant": _set_of(SMALL),
    "session_id": _set_of(SMALL),
    "task_id": _set_of(SMALL),
    "agent_id": _set_of(SMALL),
    "tool_name": _set_of(SMALL),
    "kind": _set_of(["note", "error", "tool_call"]),
    "state": _set_of(["pending", "error"]),
    "status": _set_of(["active", "archived"]),
    "tier": _set_of(["working", "long_term"]),
    "tags_all": st.frozensets(st.sampled_from(["x", "y", "z"]), max_size=2),
    "tags_any": _set_of(["x", "y", "z"]),
    "parent_id": st.none() | st.sampled_from(PARENTS),
    "pinned": st.none() | st.booleans(),
    "created_after": st.none() | st.sampled_from(POOL_TIMES),
    "created_before": st.none() | st.sampled_from(POOL_TIMES),
    "expires_by": st.none() | st.sampled_from(POOL_TIMES),
    "live_at": st.none() | st.sampled_from(POOL_TIMES),
    "active_due_by": st.none() | st.sampled_from(POOL_TIMES),
}


@st.composite
def random_filters(draw: st.DrawFn) -> Filters:
    """Filters on a few random fields (filters on every field would almost always match nothing)."""
    names = draw(st.lists(st.sampled_from(sorted(FILTER_VALUES)), max_size=4, unique=True))
    fields = {name: draw(FILTER_VALUES[name]) for name in names}
    if draw(st.booleans()):  # one tenant and one session: the in-process index tests only that session's rows
        fields.update(
            tenant=frozenset([draw(st.sampled_from(SMALL))]),
            session_id=frozenset([draw(st.sampled_from(SMALL))]),
        )
    return Filters(**fields)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ms=scoped_memories(), filters=st.lists(random_filters(), min_size=1, max_size=4))
def test_queries_agree_with_filters_matches(
    engine_name: str, tmp_path: Path, ms: list[Memory], filters: list[Filters]
) -> None:
    store = make_store(engine_name, tmp_path)
    store.setup()
    try:
        store.put_many(ms)
        store.set_vectors([m.id for m in ms], unit_vectors(len(ms)))
        _assert_queries_match(store, ms, filters)
        # then every third memory moves to another tenant and session, and every fifth is deleted
        moved = [
            revalidate(m, {"tenant": "b" if m.tenant == "a" else "a", "session_id": "a", "version": 2})
            for m in ms[::3]
        ]
        store.put_many(moved)
        gone = {m.id for m in ms[::5]}
        store.delete_many(sorted(gone))
        now = {m.id: m for m in [*ms, *moved] if m.id not in gone}
        _assert_queries_match(store, list(now.values()), filters)
    finally:
        store.close()


def _assert_queries_match(store: Store, ms: list[Memory], filters: list[Filters]) -> None:
    by_id = {m.id: m for m in ms}
    for f in filters:
        want = {m.id for m in ms if f.matches(m)}
        res = store.query(Query(filters=f, limit=len(ms) + 1))
        assert len(res.filtered) == len(set(res.filtered))
        assert set(res.filtered) == want
        times = [by_id[i].created_at for i in res.filtered]
        assert times == sorted(times, reverse=True)
        vector = unit_vectors(1, seed=3)[0]
        res = store.query(Query(filters=f, text="shared", vector=vector, limit=len(ms) + 1))
        assert {i for i, _ in res.lexical} == want
        assert {i for i, _ in res.dense} == want
        in_order = sorted((m for m in ms if f.matches(m)), key=lambda m: (m.created_at, m.id))
        assert [m.id for m in store.iter_all(f, batch=2)] == [m.id for m in in_order]
        assert [m.id for m in store.iter_all(f, batch=3, newest_first=True)] == [m.id for m in in_order][::-1]
        sessions = sorted({m.session_id for m in in_order if m.session_id is not None})
        assert store.session_ids(f) == sessions
        if sessions:
            assert store.session_ids(f, after=sessions[0], limit=1) == sessions[1:2]
        tags = sorted({t for m in in_order for t in m.tags})
        assert store.tag_names(f) == tags
        assert store.tag_names(f, prefix="y") == [t for t in tags if t.startswith("y")]
        assert store.tag_names(f, after="x", limit=1) == [t for t in tags if t > "x"][:1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=memories(version=1))
def test_any_valid_memory_round_trips_through_the_store(engine_name: str, tmp_path: Path, m: Memory) -> None:
    store = make_store(engine_name, tmp_path)
    store.setup()
    try:
        store.put(m)
        got = store.get(m.id)
        assert got == m
        assert got.to_json() == m.to_json()
        assert store.get_many([m.id]) == {m.id: m}
    finally:
        store.close()


# ---- SQLite only ---------------------------------------------------------------------------------------
sqlite_only = pytest.mark.engines("sqlite")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "shared.db"


@pytest.fixture
def opened(db_path: Path) -> Iterator[list[SQLiteStore]]:
    """Stores opened with :func:`open_store` during the test; all closed afterwards."""
    stores: list[SQLiteStore] = []
    yield stores
    for s in stores:
        s.close()


def open_store(stores: list[SQLiteStore], path: Path, **kw: Any) -> SQLiteStore:
    s = SQLiteStore(path, **kw)
    s.setup()
    stores.append(s)
    return s


Pair = tuple[SQLiteStore, SQLiteStore]


@pytest.fixture
def two_connections(db_path: Path, opened: list[SQLiteStore]) -> Pair:
    """Two stores on one file: two connections, each with its own in-process index."""
    return open_store(opened, db_path), open_store(opened, db_path)


@sqlite_only
def test_reopen_brings_everything_back(engine_name: str, db_path: Path, opened: list[SQLiteStore]) -> None:
    s = open_store(opened, db_path)
    b = mem("the database migration finished", tags=["db"])
    a = mem("the cache warmup timed out", links=[Link(type=LinkType.CAUSED_BY, target=b.id)], session_id="s9")
    c = mem("never embedded")
    s.put_many([a, b, c])
    vecs = unit_vectors(2)
    s.set_vectors([a.id, b.id], vecs)
    s.put(bump(b, status=Status.ARCHIVED))
    s.delete(c.id)
    d = mem("still waiting for a vector")
    s.put(d)
    seqs = s.append_events([Event("add", a.id, {"x": [1, {"y": None}]}, at=T0)])
    s.close()

    r = open_store(opened, db_path)
    assert r.get(a.id) == a
    assert r.get(b.id).status == Status.ARCHIVED and r.get(b.id).version == 2
    with pytest.raises(NotFoundError):
        r.get(c.id)
    assert set(all_ids(r)) == {a.id, b.id, d.id}
    assert next(i for i, _ in r.query(Query(text="cache timed out")).lexical) == a.id
    dense = r.query(Query(vector=vecs[1], limit=1)).dense
    assert dense[0][0] == b.id and dense[0][1] == pytest.approx(1.0, abs=1e-5)
    assert r.unembedded(10) == [(d.id, d.content)]
    assert r.edges([b.id]) == [Edge(a.id, LinkType.CAUSED_BY, b.id)]
    assert r.read_events() == [Event("add", a.id, {"x": [1, {"y": None}]}, at=T0, seq=seqs[0])]
    assert r.query(Query(filters=Filters.of(session_id="s9"))).filtered == [a.id]
    r.put(bump(r.get(b.id), content="a new version after reopen"))  # version checks continue from the file
    assert r.get(b.id).version == 3


@sqlite_only
def test_a_vector_written_with_its_new_memory_is_in_the_file(
    engine_name: str, db_path: Path, opened: list[SQLiteStore], two_connections: Pair
) -> None:
    one, two = two_connections
    a, b = mem("otter den by the river"), mem("heron nest")
    one.put(b)  # b exists: its vector goes in by an update, a's with its insert
    vecs = unit_vectors(2, seed=9)
    one.write([a, bump(b)], vecs, [Event("add", a.id, {})])
    for store in (one, two, open_store(opened, db_path)):  # the writer, a second connection, a reopen
        assert [store.query(Query(vector=v, limit=1)).dense[0][0] for v in vecs] == [a.id, b.id]
        assert store.unembedded(10) == []


@sqlite_only
def test_two_stores_on_one_file_see_each_others_writes(engine_name: str, two_connections: Pair) -> None:
    one, two = two_connections
    a, b = mem("quokka sighting on the island"), mem("wombat burrow")
    one.put_many([a, b])
    assert two.get(a.id) == a
    assert [i for i, _ in two.query(Query(text="quokka")).lexical] == [a.id]
    vecs = unit_vectors(2)
    one.set_vectors([a.id, b.id], vecs)
    assert two.query(Query(vector=vecs[1], limit=1)).dense[0][0] == b.id
    assert two.unembedded(10) == []

    # writes through `two` are seen by `one`, including a content change that drops the vector
    two.put(bump(a, content="quokka left the island"))
    assert one.get(a.id).content == "quokka left the island"
    assert [i for i, _ in one.query(Query(vector=vecs[0])).dense] == [b.id]
    assert one.unembedded(10) == [(a.id, "quokka left the island")]

    # a stale put through `one` (it last wrote version 1) conflicts
    with pytest.raises(ConflictError):
        one.put(bump(a, content="quokka overwritten"))
    assert two.get(a.id).content == "quokka left the island"
    one.put(bump(one.get(a.id), content="quokka came back"))  # version 3, through `one`
    with pytest.raises(ConflictError):  # `two` last wrote version 2
        two.put(bump(a, content="quokka stale again"))
    assert two.get(a.id).content == "quokka came back"

    one.delete(b.id)
    with pytest.raises(NotFoundError):
        two.get(b.id)
    assert all_ids(two) == [a.id]
    assert two.query(Query(text="wombat")).lexical == []
    assert two.query(Query(vector=vecs[1])).dense == []
    e = two.append_event(Event("note", a.id, {"from": "two"}))
    assert [x.seq for x in one.read_events()] == [e]


@sqlite_only
def test_concurrent_writers_on_two_connections_converge(
    engine_name: str, db_path: Path, opened: list[SQLiteStore], two_connections: Pair
) -> None:
    one, two = two_connections
    errors: list[BaseException] = []

    def writer(store: Store, tag: str) -> None:
        try:
            prev: Memory | None = None
            for i in range(60):
                m = mem(f"{tag} item {i}")
                store.put(m)
                if prev is not None and i % 3 == 0:
                    store.delete(prev.id)
                store.count()
                prev = m
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s, t)) for s, t in ((one, "left"), (two, "right"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    fresh = open_store(opened, db_path)
    truth = set(all_ids(fresh))
    assert set(all_ids(one)) == truth
    assert set(all_ids(two)) == truth
    for s in (one, two):
        assert {i for i, _ in s.query(Query(text="item", limit=10**6)).lexical} == truth


@sqlite_only
def test_reader_catching_up_while_another_connection_writes(engine_name: str, two_connections: Pair) -> None:
    reader, writer = two_connections
    stop = threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            reader.count()

    t = threading.Thread(target=read_loop)
    t.start()
    try:
        prev = None
        for i in range(150):
            m = mem(f"catch up {i}")
            writer.put(m)
            if prev is not None and i % 2 == 0:
                writer.delete(prev.id)
            prev = m
    finally:
        stop.set()
        t.join()
    assert set(all_ids(reader)) == set(all_ids(writer))


WRITER_SCRIPT = """
import sys, numpy as np
from clawvm import Memory
from clawvm.store import SQLiteStore, Event
path, keep_id, gone_id = sys.argv[1:4]
s = SQLiteStore(path)
s.setup()
old = s.get(keep_id)
s.put(old.model_copy(update={"content": "written by another process", "version": old.version + 1}))
new = Memory(content="platypus from the child process", session_id="child")
s.put(new)
v = np.zeros(384, dtype=np.float32); v[7] = 1.0
s.set_vectors([new.id], v[None, :])
s.delete(gone_id)
s.append_event(Event("child", new.id, {"pid": 1}))
s.close()
print(new.id)
"""


@sqlite_only
def test_a_second_process_writing_is_seen(engine_name: str, db_path: Path, opened: list[SQLiteStore]) -> None:
    s = open_store(opened, db_path)
    keep, gone = mem("kept original"), mem("about to vanish")
    s.put_many([keep, gone])
    assert s.count() == 2
    out = subprocess.run(
        [sys.executable, "-c", WRITER_SCRIPT, str(db_path), keep.id, gone.id],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    child_id = out.stdout.strip().splitlines()[-1]
    assert s.get(keep.id).content == "written by another process"
    assert s.get(keep.id).version == 2
    with pytest.raises(NotFoundError):
        s.get(gone.id)
    assert set(all_ids(s)) == {keep.id, child_id}
    assert [i for i, _ in s.query(Query(text="platypus")).lexical] == [child_id]
    v = np.zeros(DIM, dtype=np.float32)
    v[7] = 1.0
    assert s.query(Query(vector=v, limit=1)).dense[0] == (child_id, pytest.approx(1.0))
    assert s.query(Query(filters=Filters.of(session_id="child"))).filtered == [child_id]
    assert [e.kind for e in s.read_events()] == ["child"]
    with pytest.raises(ConflictError):
        s.put(bump(keep, content="stale write from the parent"))


def _between_match_and_rows(store: SQLiteStore, method: str, step: Callable[[list[str]], None]) -> None:
    """Run ``step(ids)`` once, right after ``store``'s in-process index has matched ``ids`` (its ``method``:
    ``page``, or ``query`` for ``list``) and before the rows are read: where another process's write lands
    when it commits in between."""
    index = store.index
    matched = getattr(index, method)
    done = False

    def hooked(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        found = matched(*args, **kwargs)
        if not done:
            done = True
            step(found.filtered if method == "query" else found)
        return found

    setattr(index, method, hooked)


@sqlite_only
@pytest.mark.parametrize("read", ["page", "page_json", "list", "iter_all"])
def test_a_filtered_read_answers_from_one_state_while_another_process_writes(
    engine_name: str, two_connections: Pair, read: str
) -> None:
    """The engine matches a filter in its index and reads the rows after: another process moving a matched
    memory out of the filter in between came back as it is now (a working member read in short-term), and
    one deleting a matched memory shortened the page (which ended ``iter_all``'s walk early). Both come
    from one read snapshot of the file now: the memories as they were when matched."""
    reader, writer = two_connections
    docs = [
        mem(f"working {i}", session_id="s", created_at=T0 + timedelta(minutes=i), tier=Tier.WORKING)
        for i in range(3)
    ]
    reader.put_many(docs)
    working = Filters.of(session_id="s", tier="working")

    def another_process(ids: list[str]) -> None:
        writer.put(bump(writer.get(ids[0]), tier=Tier.SHORT_TERM))
        writer.delete(ids[1])

    _between_match_and_rows(reader, "query" if read == "list" else "page", another_process)
    if read == "page":
        got = [(m.id, m.tier.value) for m in reader.page(working, None, 2, newest_first=True)]
    elif read == "page_json":
        got = [(d["id"], d["tier"]) for d in reader.page_json(working, None, 2, newest_first=True)]
    elif read == "list":
        got = [(m.id, m.tier.value) for m in reader.list(working, limit=2)]
    else:
        got = [(m.id, m.tier.value) for m in reader.iter_all(working, batch=2, newest_first=True)]
    newest = [docs[2].id, docs[1].id] if read != "iter_all" else [m.id for m in reversed(docs)]
    assert got == [(i, "working") for i in newest]
    assert [m.id for m in reader.page(working)] == [docs[0].id]  # the next read: the writes are seen


@sqlite_only
def test_a_read_whose_transaction_sqlite_rolled_back_raises_its_own_error(engine: Store) -> None:
    """SQLite rolls a transaction back itself on some errors (I/O, out of memory, a busy read): the read's
    COMMIT after it then raised "cannot commit - no transaction is active", which took the place of the
    error that happened. The read's own error comes out."""
    assert isinstance(engine, SQLiteStore)
    engine.put(mem("a memory"))
    with pytest.raises(StoreError, match="disk I/O error"), engine._snapshot("page") as db:
        db.execute("ROLLBACK")  # as SQLite does on such an error
        raise sqlite3.OperationalError("disk I/O error")
    assert [m.content for m in engine.page(Filters())] == ["a memory"]  # and the engine reads on


@pytest.mark.engines("memory", "postgres")
def test_list_returns_no_memory_that_left_its_filter_between_match_and_fetch(engine: Store) -> None:
    """``list`` matches ids, then fetches their rows (on an engine without one read state across both):
    a memory moved out of the filter in between came back as it now is, a short-term memory listed as a
    working one. A fetched memory is checked against the filter again."""
    docs = [
        mem(f"working {i}", session_id="s", created_at=T0 + timedelta(minutes=i), tier=Tier.WORKING)
        for i in range(3)
    ]
    engine.put_many(docs)
    fetch, moved = engine.get_many, []

    def moved_first(ids: Sequence[str]) -> dict[str, Memory]:  # another caller's write, then the fetch
        if not moved:
            moved.append(ids[0])
            engine.put(bump(engine.get(ids[0]), tier=Tier.SHORT_TERM))
        return fetch(ids)

    engine.get_many = moved_first  # type: ignore[method-assign]
    got = engine.list(Filters.of(session_id="s", tier="working"), limit=3)
    assert moved == [docs[2].id] and [m.id for m in got] == [docs[1].id, docs[0].id]


@sqlite_only
def test_get_many_of_more_ids_than_a_statement_reads_them_from_one_state(
    engine_name: str, two_connections: Pair
) -> None:
    """Past 500 ids the rows are read a chunk a statement: another process's write of two memories at once,
    committed between two chunks, came back half applied (the first chunk's memory as it was, the second
    one's as written)."""
    reader, writer = two_connections
    docs = [mem(f"memory {i}") for i in range(501)]
    reader.put_many(docs)
    first, last = docs[0], docs[-1]
    chunks = 0

    def between_chunks(statement: str) -> None:
        nonlocal chunks
        if "FROM memories WHERE id IN" in statement:  # a chunk of ids read
            chunks += 1
            if chunks == 2:
                writer.put_many([bump(first, content="both changed"), bump(last, content="both changed")])

    reader._db.set_trace_callback(between_chunks)
    found = reader.get_many([m.id for m in docs])
    reader._db.set_trace_callback(None)
    assert chunks == 2
    assert (found[first.id].content, found[last.id].content) == (first.content, last.content)
    assert reader.get(last.id).content == "both changed"


@sqlite_only
def test_corrupt_file_raises_store_error(engine_name: str, db_path: Path) -> None:
    db_path.write_bytes(b"this is not a database, just some bytes " * 200)
    s = SQLiteStore(db_path)
    with pytest.raises(StoreError) as exc:
        s.setup()
    assert not isinstance(exc.value, sqlite3.Error)
    assert type(exc.value) is StoreError
    with pytest.raises(StoreError):  # still unusable, still our error
        s.count()
    s.close()


@sqlite_only
def test_newer_schema_raises_schema_error(engine_name: str, db_path: Path, opened: list[SQLiteStore]) -> None:
    s = open_store(opened, db_path)
    s.put(mem("from the current version"))
    s.close()
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SchemaError) as exc:
        SQLiteStore(db_path).setup()
    assert isinstance(exc.value, StoreError)
    assert "99" in str(exc.value)


@sqlite_only
def test_another_application_s_file_is_refused_and_left_as_it_was(engine_name: str, db_path: Path) -> None:
    """``--db`` aimed at another program's SQLite file used to add ClawVM's tables to it (and switch it to
    WAL), even for a read-only command."""
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError) as exc:
        SQLiteStore(db_path).setup()
    assert "not a ClawVM store" in str(exc.value) and "users" in str(exc.value)
    conn = sqlite3.connect(db_path)
    assert [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["users"]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert conn.execute("SELECT * FROM users").fetchall() == [(1, "ada")]
    conn.close()
    empty = db_path.with_name("empty.db")
    sqlite3.connect(empty).close()  # an empty file (no tables) becomes a store
    store = SQLiteStore(empty)
    store.setup()
    store.close()


def test_processes_opening_a_new_file_at_once_all_get_the_store(tmp_path: Path) -> None:
    """Four processes opening one new file at once: one in ~15 read the others' fresh tables at schema
    version 0 and refused the file as another application's, and ~1 in 20 got "database is locked" from
    the switch to WAL mode (which SQLite does not wait on)."""
    import multiprocessing

    import open_race

    # Children come from a fork server: a plain fork of this multithreaded test process can copy a lock
    # another thread holds, and the child then waits forever. The server imports the engine once, so each
    # child starts in milliseconds, close enough together to race.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["clawvm.store.sqlite"])  # this module is not on its path
    failures = []
    for round_ in range(12):
        start, results = ctx.Barrier(4), ctx.Queue()
        procs = [
            ctx.Process(
                target=open_race.open_when_told,
                args=(str(tmp_path / f"{round_}.db"), start, results),
                daemon=True,
            )
            for _ in range(4)
        ]
        try:
            for p in procs:
                p.start()
            said = [results.get(timeout=60) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        failures += [x for x in said if x != "ok"]
    assert failures == []


@pytest.mark.parametrize("target", ["", "   ", None, 123])
def test_a_store_target_that_names_no_file_is_refused(target: object) -> None:
    """An empty name is SQLite's temporary file, deleted on close: every write was silently lost."""
    with pytest.raises(ConfigError) as exc:
        store_from_url(target)  # type: ignore[arg-type]
    assert exc.value.field == "db"
    with pytest.raises(ConfigError):
        SQLiteStore("")


@pytest.mark.parametrize(
    ("target", "wanted"),
    [
        ("memory:/", "memory://"),
        ("memory:", "memory://"),
        ("Memory:", "memory://"),
        ("sqlite:/var/x.db", "sqlite:///var/x.db"),
        ("sqlite:x.db", "sqlite://x.db"),
        ("sqlite:", "sqlite:///path/to/memories.db"),  # not sqlite://, which names no file either
        ("postgresql:/db", "postgresql://"),
    ],
)
def test_a_url_with_too_few_slashes_is_refused_not_made_a_file(
    target: str, wanted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memory:/`` read as a path made a file called ``memory:`` in the working folder: the caller who
    meant a store that vanishes on close got one that persists."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as exc:
        store_from_url(target)
    assert exc.value.field == "db" and wanted in str(exc.value.fix)
    assert list(tmp_path.iterdir()) == []
    assert isinstance(store_from_url("memory_notes.db"), SQLiteStore)  # a name that only starts like one


@pytest.mark.parametrize(
    ("target", "wanted"),
    [
        ("agent.db?durability=full", "sqlite://agent.db?durability=full"),
        ("sub/agent.db?snapshot=inline", "sqlite://sub/agent.db?snapshot=inline"),
    ],
)
def test_a_path_with_a_urls_options_is_refused_not_made_a_file_of_that_name(
    target: str, wanted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agent.db?durability=full`` made a file of that very name and applied nothing."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as exc:
        store_from_url(target)
    assert exc.value.field == "db" and wanted in str(exc.value.fix)
    assert list(tmp_path.iterdir()) == []
    absolute = store_from_url(f"{tmp_path}/odd?name.db")  # a "?" that names no option is a file name
    assert isinstance(absolute, SQLiteStore)
    with pytest.raises(ConfigError) as exc:
        store_from_url(f"{tmp_path}/x.db?durability=full")
    assert f"sqlite://{tmp_path}/x.db?durability=full" in str(exc.value.fix)  # sqlite:///abs/...


@sqlite_only
def test_locked_database_is_a_store_error_and_the_store_recovers(
    engine_name: str, db_path: Path, opened: list[SQLiteStore]
) -> None:
    s = open_store(opened, db_path, timeout_s=0.05)
    a = mem("before the lock")
    s.put(a)
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError) as exc:
            s.put(mem("while locked"))
        assert not isinstance(exc.value, sqlite3.Error)
        assert isinstance(exc.value.__cause__, sqlite3.OperationalError)
        assert s.get(a.id) == a  # reads still work under WAL
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    b = mem("after the lock")
    s.put(b)
    assert set(all_ids(s)) == {a.id, b.id}


@sqlite_only
def test_driver_error_on_a_dead_connection_is_a_store_error(
    engine_name: str, db_path: Path, opened: list[SQLiteStore]
) -> None:
    s = open_store(opened, db_path)
    s.put(mem("x"))
    assert s._conn is not None
    s._conn.close()  # the connection dies underneath the engine
    for call in (
        lambda: s.count(),
        lambda: s.put(mem("y")),
        lambda: s.read_events(),
        lambda: s.unembedded(1),
        lambda: s.edges(["00000000-0000-7000-8000-000000000001"]),
    ):
        with pytest.raises(StoreError) as exc:
            call()
        assert not isinstance(exc.value, sqlite3.Error)


@sqlite_only
def test_sqlite_url_and_plain_path_open_the_same_file(engine_name: str, tmp_path: Path) -> None:
    from clawvm.store import store_from_url

    p = tmp_path / "sub" / "dir" / "x.db"
    s1 = store_from_url(f"sqlite:///{p}")
    s1.setup()
    m = mem("via url")
    s1.put(m)
    s1.close()
    s2 = store_from_url(str(p))
    s2.setup()
    assert s2.get(m.id) == m
    s2.close()
    assert os.path.exists(p)


def test_sqlite_checkpoints_off_the_write_path_and_keeps_its_log_bounded(tmp_path: Path) -> None:
    path, limit = tmp_path / "wal.db", 256 * 1024
    wal = tmp_path / "wal.db-wal"
    store = SQLiteStore(path, dim=4, max_wal_bytes=limit)
    store.setup()
    try:
        for i in range(400):  # ~1 MB of rows, one commit each: the log would hold them all
            store.put(Memory(content=f"{i} " + "x" * 2000, tenant="t"))
        deadline = time.monotonic() + 30  # the checkpointer's thread wakes every 64 commits and each second
        while wal.stat().st_size > limit and time.monotonic() < deadline:
            time.sleep(0.05)
        assert wal.stat().st_size <= limit
    finally:
        store.close()
    assert not wal.exists()  # the last connection to close checkpoints everything and removes the log
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM memories").fetchone()[0] == 400


# ---- SQLite durability ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url_option", "synchronous"), [("", 1), ("?durability=normal", 1), ("?durability=full", 2)]
)
def test_sqlite_durability_is_selectable_from_the_url(
    tmp_path: Path, url_option: str, synchronous: int
) -> None:
    """normal (the default) is crash-safe; full fsyncs every commit and survives a power loss."""
    from clawvm.store import store_from_url

    store = store_from_url(f"sqlite:///{tmp_path}/d.db{url_option}")
    store.setup()
    try:
        assert store.pragma("journal_mode") == "wal"
        assert isinstance(store, SQLiteStore)
        assert store.durability == ("full" if synchronous == 2 else "normal")
        assert store.pragma("synchronous") == synchronous
    finally:
        store.close()


def test_an_unknown_sqlite_option_names_the_fix(tmp_path: Path) -> None:
    from clawvm import ConfigError
    from clawvm.store import store_from_url

    with pytest.raises(ConfigError, match="durability=full"):
        store_from_url(f"sqlite:///{tmp_path}/d.db?durability=paranoid")
    with pytest.raises(ConfigError, match="unknown option 'sync'") as exc:
        store_from_url(f"sqlite:///{tmp_path}/d.db?sync=full")
    assert exc.value.field == "db" and "durability=full" in str(exc.value.fix)
    with pytest.raises(ConfigError, match=r"snapshot mode 'later'.*\?snapshot=inline"):
        store_from_url(f"sqlite:///{tmp_path}/d.db?snapshot=later")


@pytest.mark.parametrize("mode", ["background", "inline"])
def test_the_sqlite_snapshot_mode_is_selectable_from_the_url(tmp_path: Path, mode: str) -> None:
    from clawvm.store import store_from_url

    store = store_from_url(f"sqlite:///{tmp_path}/d.db?snapshot={mode}")
    assert isinstance(store, SQLiteStore) and store.snapshot_mode == mode


@pytest.mark.parametrize("snapshot", [True, False])
def test_a_sqlite_file_of_other_vectors_opened_at_another_dim_is_refused_naming_both(
    tmp_path: Path, snapshot: bool
) -> None:
    """Opened for 10-dimensional vectors, a file of 384-dimensional ones failed with a reshape's ValueError
    (its index rebuilt from the rows); PostgreSQL already refused so. The file is left as it was."""
    path = tmp_path / "v.db"
    store = SQLiteStore(str(path), dim=DIM)
    store.setup()
    m = mem()
    store.write([m], unit_vectors(1))
    store.close()
    if not snapshot:
        (tmp_path / "v.db.index").unlink(missing_ok=True)
    before = path.read_bytes()
    other = SQLiteStore(str(path), dim=10)
    with pytest.raises(DimensionError) as exc:
        other.setup()
    assert (exc.value.stored, exc.value.dim) == (DIM, 10) and isinstance(exc.value, SchemaError)
    assert "384-dimensional vectors, not 10" in str(exc.value)
    assert path.read_bytes() == before
    again = SQLiteStore(str(path), dim=DIM)
    again.setup()
    assert list(again.vectors_of([m.id])) == [m.id]
    again.close()
