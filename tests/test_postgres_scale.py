"""The PostgreSQL engine without cliffs: dense search walks the HNSW index past archived rows and narrow
filters (never an exact scan of every row), pages read an index in order, connection settings come from
the URL and the environment, the HNSW graph's parameters are the store's, and many writer processes
write more than one.

One shared store of a few thousand small vectors (module fixture): plans are read with EXPLAIN.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner

import pg_server
from clawvm import Filters, Memory, Status
from clawvm.cli import main
from clawvm.store import Event, PageKey, Query, store_from_url
from clawvm.store.postgres import PostgresStore
from clawvm.store.postgres_search import Searcher, compile_filters, set_dense_scan
from clawvm.store.postgres_url import HnswParams

N, DIM, AGENTS, SESSIONS, K = 2000, 32, 10, 40, 10


@pytest.fixture(scope="module")
def loaded(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PostgresStore, list[Memory], np.ndarray]]:
    """N memories, every fifth archived (20%), ten agents, sixty sessions, random unit vectors."""
    store = store_from_url(pg_server.store_url(tmp_path_factory.mktemp("pgscale"), "s"), dim=DIM)
    assert isinstance(store, PostgresStore)
    store.setup()
    rng = np.random.default_rng(7)
    vecs = rng.standard_normal((N, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ms = [
        Memory(
            content=f"note {i} on topic {i % 37}",
            agent_id=f"a{i % AGENTS}",
            session_id=f"s{i % SESSIONS}",
            status=Status.ARCHIVED if i % 5 == 0 else Status.ACTIVE,
        )
        for i in range(N)
    ]
    for at in range(0, N, 500):
        store.write(ms[at : at + 500], vecs[at : at + 500])
    with store._conn("test") as conn:
        conn.execute("VACUUM ANALYZE memories")
        conn.execute("VACUUM ANALYZE vectors")
    yield store, ms, vecs
    store.close()


# filter -> the index the dense statement reads: the HNSW graph, walked on past what the filters drop; a
# filter that passes a few dozen rows reads them from their own index and sorts them (exact and cheaper)
FILTERS = {
    "active": (Filters(status=frozenset({"active"})), "vectors_embedding"),
    "one agent": (Filters(status=frozenset({"active"}), agent_id=frozenset({"a3"})), "vectors_embedding"),
    "one session": (
        Filters(status=frozenset({"active"}), session_id=frozenset({"s7"})),
        "memories_session|memories_tier_members",  # either index that leads to one session's rows
    ),
}


@pytest.mark.parametrize("name", list(FILTERS))
def test_dense_walks_the_index_past_archived_rows_and_narrow_filters(
    loaded: tuple[PostgresStore, list[Memory], np.ndarray], name: str
) -> None:
    store, ms, vecs = loaded
    f, index = FILTERS[name]
    passing = np.array([f.matches(m) for m in ms])
    assert 0 < passing.sum() < N and (~np.array([m.status is Status.ACTIVE for m in ms])).mean() >= 0.1
    queries = np.random.default_rng(11).standard_normal((8, DIM)).astype(np.float32)
    where, args = compile_filters(f)
    found = 0
    for q in queries:
        q /= np.linalg.norm(q)
        scores = np.where(passing, vecs @ q, -np.inf)
        want = {ms[i].id for i in np.argsort(-scores)[:K]}
        got = store.query(Query(vector=q, dense_limit=K, filters=f)).dense
        assert len(got) == K and [s for _, s in got] == sorted((s for _, s in got), reverse=True)
        found += len(want & {i for i, _ in got})
        with store._conn("test") as conn, conn.transaction():
            set_dense_scan(conn, K)
            sql, sargs = Searcher.dense_sql(q, K, where, args, exact=False)
            plan = "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql, sargs))
            # the index statement alone fills the limit: the exact fallback never runs
            assert len(conn.execute(sql, sargs).fetchall()) == K
        # (a small vectors table may be hashed whole instead of probed: only memories must not be scanned)
        assert any(i in plan for i in index.split("|")) and "Seq Scan on memories" not in plan, plan
    assert found / (K * len(queries)) >= 0.9  # recall against the exact answer


def test_pages_read_the_keyset_index_without_sorting(
    loaded: tuple[PostgresStore, list[Memory], np.ndarray],
) -> None:
    store, ms, _ = loaded
    first = store.page(Filters(), None, 100)
    second = store.page(Filters(), PageKey.of(first[-1]), 100)
    assert len(second) == 100 and second[0].created_at >= first[-1].created_at
    assert {m.id for m in first}.isdisjoint({m.id for m in second})
    after = PageKey.of(first[-1])
    with store._conn("test") as conn:
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                """EXPLAIN SELECT m.body FROM memories m WHERE TRUE AND m.created_at >= %s
                   AND (m.created_at, m.id) > (%s, %s::uuid) ORDER BY m.created_at, m.id LIMIT 500""",
                [after.created_at, after.created_at, after.id],
            )
        )
    assert "memories_keyset" in plan and "Sort" not in plan, plan
    assert sum(1 for _ in store.iter_all(batch=700)) == len(ms)


def test_connection_settings_come_from_the_url_and_pgoptions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = pg_server.store_url(tmp_path, "conn")
    url = f"{base}&options=-c%20work_mem%3D7MB&pool_size=3&statement_timeout_ms=1500&prepared=off"
    store = store_from_url(url, dim=DIM)
    assert isinstance(store, PostgresStore)
    store.setup()
    try:
        assert store._pool is not None and store._pool.max_size == 3
        with store._conn("test") as conn:
            assert conn.prepare_threshold is None  # behind a transaction pooler: nothing prepared
        with store._conn("test") as conn:
            got = conn.execute(
                "SELECT current_setting('work_mem'), current_setting('statement_timeout')"
            ).fetchone()
            assert got == ("7MB", "1500ms")
            assert conn.execute("SHOW search_path").fetchone() is not None  # ours still set
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(3)")
        store.put(Memory(content="the store still works under its own search path"))
        assert store.count() == 1
    finally:
        store.close()
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=4321")
    env = store_from_url(base, dim=DIM)
    env.setup()
    try:
        assert isinstance(env, PostgresStore)
        with env._conn("test") as conn:
            assert conn.execute("SELECT current_setting('lock_timeout')").fetchone() == ("4321ms",)
    finally:
        env.close()


def test_hnsw_parameters_from_the_url_and_the_reindex_command(tmp_path: Path) -> None:
    url = pg_server.store_url(tmp_path, "hnsw") + "&hnsw_m=8&hnsw_ef_construction=40"
    store = store_from_url(url, dim=DIM)
    assert isinstance(store, PostgresStore)
    store.setup()
    try:
        assert store.vector_index_params() == HnswParams(m=8, ef_construction=40)
        store.write([Memory(content="x")], np.ones((1, DIM), dtype=np.float32))
    finally:
        store.close()
    out = CliRunner().invoke(
        main, ["--db", url, "--pool-size", "2", "reindex", "--dim", str(DIM), "--m", "12"]
    )
    assert out.exit_code == 0, out.output
    assert "m=12, ef_construction=40" in out.output
    again = store_from_url(url, dim=DIM)
    assert isinstance(again, PostgresStore)
    again.setup()
    try:
        assert again.vector_index_params() == HnswParams(m=12, ef_construction=40)
        assert again.query(Query(vector=np.ones(DIM, dtype=np.float32), dense_limit=1)).dense
    finally:
        again.close()


WRITES = 25


def _writer(url: str, worker: int, start: Any, took: Any) -> None:
    store = store_from_url(url, dim=DIM)
    store.setup()
    rng = np.random.default_rng(worker)
    try:
        start.wait()
        began = time.perf_counter()
        for i in range(WRITES):
            m = Memory(content=f"writer {worker} record {i}", session_id=f"w{worker}", agent_id=f"w{worker}")
            # a record as the harness writes it: the memory, its vector and its event in one transaction
            store.write([m], rng.standard_normal((1, DIM)).astype(np.float32), [Event("add", m.id)])
        took[worker] = time.perf_counter() - began
    finally:
        store.close()


def _throughput(url: str, writers: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    took = ctx.Array("d", writers)
    procs = [ctx.Process(target=_writer, args=(url, w, start, took)) for w in range(writers)]
    for p in procs:
        p.start()
    time.sleep(1.5)  # let every process import and connect before the clock starts
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
    return writers * WRITES / max(took)


def test_four_writer_processes_write_everything(tmp_path: Path) -> None:
    one, four = pg_server.store_url(tmp_path, "w1"), pg_server.store_url(tmp_path, "w4")
    rate_one, rate_four = _throughput(one, 1), _throughput(four, 4)
    print(f"\nrecords/s: 1 writer {rate_one:.0f}, 4 writers {rate_four:.0f} ({rate_four / rate_one:.2f}x)")
    store = store_from_url(four, dim=DIM)
    store.setup()
    try:
        assert store.count() == 4 * WRITES
        events = store.read_events(limit=4 * WRITES + 1)
        assert len(events) == 4 * WRITES and len({e.seq for e in events}) == 4 * WRITES
        assert {len(store.list(Filters.of(agent_id=f"w{w}"), limit=WRITES + 1)) for w in range(4)} == {WRITES}
        assert len(store.vectors_of([m.id for m in store.list(limit=4 * WRITES)])) == 4 * WRITES
    finally:
        store.close()


def test_a_replica_serves_searches_and_reads_our_writes_on_request(tmp_path: Path) -> None:
    primary = pg_server.store_url(tmp_path, "replicated")
    url = f"{primary}&replica={quote(pg_server.replica_of(primary), safe='')}"
    store = store_from_url(url, dim=DIM)
    assert isinstance(store, PostgresStore)
    store.setup()
    fresh = store_from_url(url + "&read_your_writes=1", dim=DIM)
    assert isinstance(fresh, PostgresStore)
    fresh.setup()
    try:
        m = Memory(content="the canary deploy failed in zone b")
        store.put(m)  # to the primary
        assert store.wait_for_replica(timeout_s=30)
        assert [i for i, _ in store.query(Query(text="canary deploy")).lexical] == [m.id]
        with store._replica_conn("test") as conn:  # the searches' connection is the standby's
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute("DELETE FROM memories")
        for i in range(10):  # each search waits until the standby has replayed the write before it
            note = Memory(content=f"note about zebra{i}")
            fresh.put(note)
            assert [h for h, _ in fresh.query(Query(text=f"zebra{i}")).lexical] == [note.id]
        assert store.get(m.id) == m and fresh.count() == 11  # reads outside search: the primary
    finally:
        fresh.close()
        store.close()


def test_a_replica_serves_searches_when_the_database_defaults_to_serializable(tmp_path: Path) -> None:
    """A hot standby refuses serializable transactions ("cannot use serializable mode in a hot standby"):
    with the database's default_transaction_isolation so set by its DBA, every search failed."""
    database = pg_server.database_with({"default_transaction_isolation": "serializable"})
    primary = pg_server.schema_url(database, tmp_path, "strict")
    store = store_from_url(f"{primary}&replica={quote(pg_server.replica_of(primary), safe='')}", dim=DIM)
    store.setup()
    try:
        m = Memory(content="the canary deploy failed in zone b")
        store.put(m)
        assert store.wait_for_replica(timeout_s=30)
        assert [i for i, _ in store.query(Query(text="canary deploy")).lexical] == [m.id]
    finally:
        store.close()


def test_read_your_writes_falls_back_to_the_primary_when_the_replica_lags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It waited for the replica, then searched it anyway: the fresh write was silently missing."""
    from clawvm.store import postgres as postgres_engine

    monkeypatch.setattr(postgres_engine, "READ_YOUR_WRITES_WAIT_S", 0.3, raising=False)
    primary = pg_server.store_url(tmp_path, "lagging")
    replicated = f"{primary}&replica={quote(pg_server.replica_of(primary), safe='')}"
    control = store_from_url(replicated, dim=DIM)  # its replica connection is the standby's, always
    store = store_from_url(replicated + "&read_your_writes=1", dim=DIM)
    assert isinstance(control, PostgresStore) and isinstance(store, PostgresStore)
    control.setup()
    store.setup()
    with control._replica_conn("test") as standby:
        standby.execute("SELECT pg_wal_replay_pause()")
    waits: list[float] = []
    wait = store.wait_for_replica
    store.wait_for_replica = lambda timeout_s=5.0: waits.append(timeout_s) or wait(timeout_s)  # type: ignore[method-assign]
    try:
        note = Memory(content="the kiwi shipment is late")
        store.put(note)
        for _ in range(3):
            assert [i for i, _ in store.query(Query(text="kiwi shipment")).lexical] == [note.id]
        # waited once for that write; the searches after it asked the replica without waiting again
        assert waits[0] == 0.3 and set(waits[1:]) == {0.0}
    finally:
        with control._replica_conn("test") as standby:
            standby.execute("SELECT pg_wal_replay_resume()")
        store.close()
        control.close()


def test_read_your_writes_with_a_replica_that_is_no_standby_does_not_wait_at_each_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica= naming a server that replays no WAL (the primary itself, a logical subscriber) has no
    replay position: every search after a write waited the full READ_YOUR_WRITES_WAIT_S for it."""
    from clawvm.store import postgres as postgres_engine

    def no_waiting(seconds: float) -> None:
        raise AssertionError(f"waited {seconds} s for a replay that a server replaying no WAL never makes")

    monkeypatch.setattr(postgres_engine, "time", SimpleNamespace(monotonic=time.monotonic, sleep=no_waiting))
    primary = pg_server.store_url(tmp_path, "no_standby")
    store = store_from_url(f"{primary}&replica={quote(primary, safe='')}&read_your_writes=1", dim=DIM)
    assert isinstance(store, PostgresStore)
    store.setup()
    try:
        for i in range(3):
            note = Memory(content=f"note about walrus{i}")
            store.put(note)
            assert [h for h, _ in store.query(Query(text=f"walrus{i}")).lexical] == [note.id]
        assert store.wait_for_replica(timeout_s=30) is False
    finally:
        store.close()


def test_a_reader_waits_at_a_number_still_in_flight_instead_of_skipping_it(tmp_path: Path) -> None:
    """Appenders of different tenants share no lock: a later number may commit first. The reader of the
    log stops at the hole, waits for the appender that holds it, and then returns both, in order."""
    store = store_from_url(pg_server.store_url(tmp_path, "holes"), dim=DIM)
    assert isinstance(store, PostgresStore)
    store.setup()
    try:
        first = store.append_event(Event("before"))
        appended, release = threading.Event(), threading.Event()

        def slow(conn: psycopg.Connection[Any]) -> list[int]:
            seqs = store.event_log.append(conn, [Event("slow")])
            appended.set()
            assert release.wait(30)
            return seqs

        slow_writer = threading.Thread(target=lambda: store._write("append_events", slow))
        slow_writer.start()
        assert appended.wait(30)
        # another tenant's event commits while the lower number is in flight
        fast = store.append_event(Event("fast", tenant="other"))
        got: list[list[Event]] = []
        reader = threading.Thread(target=lambda: got.append(store.read_events(after_seq=first)))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not got  # waiting at the hole, not returning "fast" alone
        release.set()
        slow_writer.join(30)
        reader.join(30)
        assert [e.kind for e in got[0]] == ["slow", "fast"] and got[0][-1].seq == fast
    finally:
        store.close()


def test_a_sessions_tier_members_are_read_through_the_session(
    loaded: tuple[PostgresStore, list[Memory], np.ndarray],
) -> None:
    """The pager's budget checks and a tracked recall's promotions read some sessions' tier members: the
    sessions bound the index range (a filter on the tier alone walked the tenant's whole tier)."""
    store, ms, _ = loaded
    f = Filters.of(tenant="default", session_id=["s3", "s7"], tier="short_term", status="active")
    where, args = compile_filters(f)
    with store._conn("test") as conn:
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                f"EXPLAIN SELECT m.body FROM memories m WHERE {where} ORDER BY m.created_at DESC, m.id DESC"
                " LIMIT 500",
                args,
            )
        )
    assert any("Index Cond" in line and "session_id" in line for line in plan.splitlines()), plan
    assert "Seq Scan" not in plan, plan
    want = {m.id for m in ms if f.matches(m)}
    assert want and {m.id for m in store.iter_all(f, newest_first=True)} == want
