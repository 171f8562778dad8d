"""What only the PostgreSQL engine has: many processes on one database (optimistic locking across
processes, events pushed to every process with LISTEN/NOTIFY, concurrent migrations), its URL and schema
handling, the loud failure on a filter it cannot compile, and driver errors translated.

The contract itself runs on PostgreSQL through the ``engine``/``harness`` fixtures (tests/engines.py).
"""

from __future__ import annotations

import multiprocessing
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

import pg_server
from clawvm import ConflictError, Filters, Harness, Memory, StoreError, Tier
from clawvm.core import lexical
from clawvm.core.errors import ConfigError, SchemaError
from clawvm.core.lexical import Analyzer
from clawvm.store import Event, EventFeed, MemoryStore, Query, SQLiteStore, store_from_url
from clawvm.store import postgres as postgres_engine
from clawvm.store.postgres import PostgresStore
from clawvm.store.postgres_schema import MIGRATIONS
from clawvm.store.postgres_search import compile_filters, esc, unesc, untranslated_filter_fields
from clawvm.store.postgres_url import parse_url, split_url


@pytest.fixture
def url(tmp_path: Path) -> str:
    return pg_server.store_url(tmp_path, "pg")


@pytest.fixture
def opened() -> Iterator[list[PostgresStore]]:
    stores: list[PostgresStore] = []
    yield stores
    for s in stores:
        s.close()


def open_store(stores: list[PostgresStore], url: str, **kw: Any) -> PostgresStore:
    s = store_from_url(url, **kw)
    assert isinstance(s, PostgresStore)
    s.setup()
    stores.append(s)
    return s


def test_pooled_connections_killed_on_the_server_are_replaced_not_failed(
    url: str, opened: list[PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a database restart (or connections killed on the server) each idle pooled connection failed
    one call: 8 of 12 calls after a restart."""
    monkeypatch.setattr(postgres_engine, "IDLE_CHECK_S", 0.0, raising=False)  # every handout checks
    store = open_store(opened, f"{url}&pool_size=4")
    store.put_many([Memory(content=f"note {i}") for i in range(3)])
    threads = [threading.Thread(target=lambda: [store.count(Filters()) for _ in range(20)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with psycopg.connect(pg_server.module_database_url(), autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert killed is not None and killed[0] >= 1
    assert [store.count(Filters()) for _ in range(12)] == [3] * 12


# ---- filters --------------------------------------------------------------------------------------------
def test_every_filter_field_compiles_to_sql() -> None:
    # a field added to Filters must be taught to postgres_search._FILTER_SQL, or this fails
    assert untranslated_filter_fields() == set()


def test_a_filter_field_without_sql_fails_loudly_instead_of_widening_the_query() -> None:
    @dataclass(frozen=True)
    class WithColour(Filters):
        colour: frozenset[str] | None = None

    assert compile_filters(WithColour())[0] == "TRUE"  # left at "any": nothing to compile
    with pytest.raises(StoreError, match="colour"):
        compile_filters(WithColour(colour=frozenset({"red"})))


def test_text_values_with_nul_and_backslashes_are_stored_injectively() -> None:
    values = ["plain", "a\\b", "a\x00b", "a\\0b", "\\", "\x00", "", "\\\\0"]
    stored = [esc(v) for v in values]
    assert len(set(stored)) == len(values)
    assert all("\x00" not in (s or "") for s in stored)
    assert [unesc(s) for s in stored] == values
    assert esc("plain") == "plain" and esc(None) is None


# ---- URL, schema, lifecycle ---------------------------------------------------------------------------
def test_url_schema_parameter_is_ours_and_the_rest_goes_to_libpq() -> None:
    conninfo, schema = split_url("postgresql://u@/db?host=/tmp/x&schema=team_a&sslmode=disable")
    assert schema == "team_a"
    assert conninfo == "postgresql://u@/db?host=/tmp/x&sslmode=disable"  # as given: libpq decodes it
    # libpq's options= reaches libpq verbatim: "%20" stays a space to libpq, never a literal "+"
    parsed = parse_url("postgres://u@h/db?options=-c%20work_mem%3D7MB&pool_size=3&statement_timeout_ms=250")
    assert parsed.conninfo == "postgresql://u@h/db?options=-c%20work_mem%3D7MB"
    assert (parsed.pool_size, parsed.statement_timeout_ms, parsed.libpq_options) == (
        3,
        250,
        "-c work_mem=7MB",
    )
    with pytest.raises(ConfigError, match="pool_size") as exc:
        parse_url("postgresql://u@h/db?pool_size=0")
    assert exc.value.field == "pool_size"
    assert split_url("postgres://u@h/db")[1] == "clawvm"
    # an empty host (the local socket, or $PGHOST) keeps its "//": "postgresql:/db" is refused by libpq
    assert split_url("postgresql:///db?host=/tmp/x&schema=s")[0] == "postgresql:///db?host=/tmp/x"
    assert split_url("postgresql:///db")[0] == "postgresql:///db"
    with pytest.raises(ConfigError, match="schema is given twice") as exc:  # which store was meant?
        split_url("postgresql://u@h/db?schema=a&schema=b")
    assert exc.value.field == "db"
    with pytest.raises(ConfigError):
        split_url("postgresql://u@h/db?schema=Robert');DROP")


def test_url_switches_take_on_or_off_and_nothing_else() -> None:
    """``prepared`` is the pooler's safety switch: a value that is neither on nor off must not silently
    leave prepared statements on."""
    assert parse_url("postgresql://u@h/db?prepared=off").prepared is False
    assert parse_url("postgresql://u@h/db?prepared=ON").prepared is True
    assert parse_url("postgresql://u@h/db").prepared is True
    for bad in ("prepared=maybe", "prepared=disable", "read_your_writes=enabled"):
        with pytest.raises(ConfigError, match=bad.split("=")[0] + ".*on or off") as exc:
            parse_url(f"postgresql://u@h/db?{bad}")
        assert exc.value.field == bad.split("=")[0]
    with pytest.raises(ConfigError, match="replica"):  # read-your-writes waits for a replica
        parse_url("postgresql://u@h/db?read_your_writes=on")
    replica = "postgresql%3A%2F%2Fu%40r%2Fdb"
    with pytest.raises(ConfigError, match="did you mean pool_size"):  # a typo: before any connection
        parse_url("postgresql://u@h/db?poolsize=4")
    with pytest.raises(ConfigError, match="did you mean sslmode"):
        parse_url("postgresql://u@h/db?ssl_mode=require")
    assert parse_url(f"postgresql://u@h/db?replica={replica}&read_your_writes=1").read_your_writes


def test_constructor_does_no_io_and_an_unreachable_server_is_a_store_error(tmp_path: Path) -> None:
    s = store_from_url(f"postgresql://nobody@/db?host={tmp_path}&connect_timeout=2")  # no server there
    with pytest.raises(StoreError) as exc:
        s.setup()
    assert not isinstance(exc.value, psycopg.Error)
    assert isinstance(exc.value.__cause__, psycopg.Error)
    s.close()


def test_schemas_isolate_stores_in_one_database(tmp_path: Path, opened: list[PostgresStore]) -> None:
    a = open_store(opened, pg_server.store_url(tmp_path, "a"))
    b = open_store(opened, pg_server.store_url(tmp_path, "b"))
    m = Memory(content="only in a")
    a.put(m)
    assert b.get_many([m.id]) == {} and b.count() == 0
    assert a.get(m.id) == m


def test_a_store_in_pgvectors_own_schema_does_not_take_over_a_new_schema(
    tmp_path: Path, opened: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    """The search path is the store's schema, then pgvector's (public, often): a new schema's open found
    public's meta table, created nothing, and read and wrote the public store's tables. An application
    that did so is told where its data is (the new schema opens empty)."""
    database = pg_server.database_with({})
    in_public = open_store(opened, database + ("&" if "?" in database else "?") + "schema=public")
    in_public.put(Memory(content="the public store's secret"))
    with caplog.at_level("WARNING"):
        fresh = open_store(opened, pg_server.schema_url(database, tmp_path, "fresh"))
    assert "holds its data in public" in caplog.text and "clawvm migrate" in caplog.text
    assert fresh.count() == 0
    mine = Memory(content="only in the fresh schema")
    fresh.put(mine)
    assert in_public.get_many([mine.id]) == {} and in_public.count() == 1
    with fresh._conn("test") as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", [fresh.schema]
        ).fetchone()
    assert tables is not None and tables[0] > 5


def test_newer_schema_or_other_dimension_is_a_schema_error(url: str, opened: list[PostgresStore]) -> None:
    s = open_store(opened, url)
    s.put(Memory(content="from the current version"))
    with pytest.raises(SchemaError, match="768"):
        store_from_url(url, dim=768).setup()
    with s._conn("test") as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'version'")
    with pytest.raises(SchemaError, match="99"):
        store_from_url(url).setup()


def test_upgrading_a_schema_fills_the_expiry_column_from_the_stored_memories(
    url: str, opened: list[PostgresStore]
) -> None:
    due = datetime(2026, 1, 1, tzinfo=UTC)
    s = open_store(opened, url)
    timed, plain = Memory(content="expires", expires_at=due), Memory(content="stays")
    s.put_many([timed, plain])
    with s._conn("test") as conn:  # back to the schema before the column existed
        pg_server.vectors_back_in_rows(conn, s.dim)
        conn.execute(
            "DROP INDEX memories_expiry; DROP INDEX memories_keyset; DROP INDEX memories_tier_members"
        )
        conn.execute("ALTER TABLE memories DROP COLUMN expires_at")
        # and what the migrations after it added (per-tenant statistics and event numbers)
        conn.execute("DROP TABLE tenant_lexstats; DROP TABLE IF EXISTS event_numbers")
        conn.execute("DROP INDEX events_tenant")
        conn.execute("ALTER TABLE events DROP COLUMN tenant_seq")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'version'")  # before the expiry migration
    s.close()
    again = open_store(opened, url)
    assert [m.id for m in again.list(Filters.of(expires_by=due))] == [timed.id]
    assert again.count(Filters.of(expires_by=due - timedelta(microseconds=1))) == 0


def _unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_upgrading_moves_the_vectors_out_of_the_rows_and_searches_alike(
    url: str, opened: list[PostgresStore]
) -> None:
    s = open_store(opened, url)
    ms = [Memory(content=f"note {i}", session_id=f"s{i % 3}") for i in range(12)]
    vecs = _unit_vectors(12, s.dim, 3)
    s.write(ms[:9], vecs[:9])
    s.put_many(ms[9:])  # three without a vector yet
    query = Query(vector=vecs[4], dense_limit=5)
    before = s.query(query).dense
    with s._conn("test") as conn:
        pg_server.vectors_back_in_rows(conn, s.dim)
        moved_at = next(n for n, sql in enumerate(MIGRATIONS) if "CREATE TABLE vectors" in sql)
        conn.execute("UPDATE meta SET value = %s WHERE key = 'version'", [str(moved_at)])
    s.close()
    again = open_store(opened, url)
    assert again.query(query).dense == before and before[0][0] == ms[4].id
    assert sorted(i for i, _ in again.unembedded(10)) == sorted(m.id for m in ms[9:])
    assert sorted(again.vectors_of([m.id for m in ms])) == sorted(m.id for m in ms[:9])


class WholeRuns(Analyzer):
    """The analyzer before CJK bigrams: a run of CJK letters was one term."""

    def terms(self, text: str) -> list[str]:
        return self._stemmed([w for w in lexical._TOKEN.findall(text.lower()) if w not in lexical.STOP_WORDS])


@contextmanager
def _as_analyzer_1_wrote(
    url: str, memories: list[Memory], monkeypatch: pytest.MonkeyPatch
) -> Iterator[PostgresStore]:
    """A schema of the version before the re-analysis, holding ``memories`` with the terms its analyzer
    made; closed on leaving."""
    with monkeypatch.context() as older:
        older.setattr(postgres_engine, "MIGRATIONS", MIGRATIONS[:-1])
        before = store_from_url(url)
        assert isinstance(before, PostgresStore)
        before.analyzer = WholeRuns()
        before.setup()
        try:
            before.write(memories)
            yield before
        finally:
            before.close()


def test_upgrading_re_analyzes_non_ascii_texts_as_a_new_schema_indexes_them(
    url: str, tmp_path: Path, opened: list[PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    ms = [
        Memory(content="我喜欢吃苹果和香蕉"),
        Memory(content="東京タワーに行きました with Alice"),
        Memory(content="apples and bananas, no CJK here"),
        Memory(content="苹果派 recipe", tenant="acme"),
        Memory(content="Ahmed: مُحَمَّد سيصل غدًا"),  # Arabic short vowels: the name unmarked matches
        Memory(content="ＡＰＩ ｓｅｒｖｅｒ returned ５０３"),  # full-width forms
    ]
    with _as_analyzer_1_wrote(url, ms, monkeypatch) as before:
        assert before.query(Query(text="苹果", limit=5)).lexical == []  # a word inside a sentence: missed
    upgraded, new = open_store(opened, url), open_store(opened, pg_server.store_url(tmp_path, "new"))
    new.write(ms)
    for text, tenant in [
        ("苹果", None),
        ("タワー alice", None),
        ("apples", None),
        ("苹果", "acme"),
        ("محمد", None),
        ("api 503", None),
    ]:
        query = Query(text=text, limit=5, filters=Filters.of(tenant=tenant) if tenant else Filters())
        found = upgraded.query(query).lexical
        assert found == new.query(query).lexical and found, text  # same scores: lengths and totals too


def test_a_row_whose_body_does_not_read_keeps_its_postings_and_the_upgrade_goes_on(
    url: str, opened: list[PostgresStore], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One body edited by hand must not keep the whole store from opening: its old postings stay."""
    ms = [Memory(content="我喜欢吃苹果"), Memory(content="東京タワーに行きました")]
    with _as_analyzer_1_wrote(url, ms, monkeypatch) as before, before._conn("test") as conn:
        conn.execute("UPDATE memories SET body = 'édité à la main' WHERE id = %s", [ms[1].id])
    with caplog.at_level("WARNING"):
        upgraded = open_store(opened, url)
    assert [i for i, _ in upgraded.query(Query(text="苹果", limit=5)).lexical] == [ms[0].id]
    with upgraded._conn("test") as conn:
        kept = conn.execute(
            "SELECT p.term FROM postings p JOIN memories m ON m.tenant = p.tenant AND m.seq = p.seq"
            " WHERE m.id = %s",
            [ms[1].id],
        ).fetchall()
    assert kept == [("東京タワーに行きました",)]  # the term its version made, as it was
    assert "keeps its postings" in caplog.text


def test_bookkeeping_and_promotions_leave_the_vector_alone_and_a_new_text_drops_it(
    url: str, opened: list[PostgresStore]
) -> None:
    s = open_store(opened, url)
    m = Memory(content="a note with a vector")
    s.write([m], _unit_vectors(1, s.dim, 5))

    def vector_row() -> Any:
        with s._conn("test") as conn:
            return conn.execute("SELECT xmin::text, ctid::text FROM vectors").fetchall()

    written = vector_row()
    promoted = m.model_copy(update={"tier": Tier.WORKING, "access_count": 1, "version": 2})
    s.put_many([promoted])  # an indexed column changes: the row's update is not HOT, the vector's row stays
    assert vector_row() == written and sorted(s.vectors_of([m.id])) == [m.id]
    s.put_many([promoted.model_copy(update={"content": "another text", "version": 3})])
    assert vector_row() == [] and [i for i, _ in s.unembedded(5)] == [m.id]
    s.set_vectors([m.id], _unit_vectors(1, s.dim, 6), ["another text"])
    assert s.unembedded(5) == [] and sorted(s.vectors_of([m.id])) == [m.id]


def test_processes_migrating_at_once_all_succeed(url: str, opened: list[PostgresStore]) -> None:
    script = "import sys; from clawvm.store import store_from_url; s = store_from_url(sys.argv[1]); s.setup()"
    procs = [subprocess.Popen([sys.executable, "-c", script, url]) for _ in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    assert open_store(opened, url).count() == 0


def test_opening_a_schema_up_to_date_writes_nothing(url: str, opened: list[PostgresStore]) -> None:
    """Every open rewrote the schema's version and dimension (an upsert): a write per CLI call or worker
    start, and under a stricter default isolation, a serialization failure between processes opening at
    once. A schema already at this version is only read."""
    s = open_store(opened, url)

    def meta_versions() -> list[tuple[str, str]]:  # each row's xmin: the transaction that last wrote it
        with s._conn("test") as conn:
            rows = conn.execute("SELECT key, xmin::text FROM meta ORDER BY key").fetchall()
        return [(str(k), str(x)) for k, x in rows]

    written = meta_versions()
    assert {k for k, _ in written} >= {"version", "dim"}
    open_store(opened, url)
    assert meta_versions() == written


def test_a_killed_connection_is_a_store_error_and_the_store_recovers(
    url: str, opened: list[PostgresStore]
) -> None:
    s = open_store(opened, url)
    m = Memory(content="before the connection dies")
    s.put(m)
    with psycopg.connect(split_url(url)[0], autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    try:
        s.get(m.id)  # the pooled connection may be dead: our error, never the driver's
    except StoreError as exc:
        assert not isinstance(exc, psycopg.Error)
    assert s.get(m.id) == m  # the broken connection was discarded


# ---- many processes, one database -----------------------------------------------------------------
def test_events_from_another_process_reach_every_subscriber(url: str, opened: list[PostgresStore]) -> None:
    one, two = open_store(opened, url), open_store(opened, url)
    assert isinstance(one, EventFeed) and not isinstance(MemoryStore(), EventFeed)
    got: list[tuple[str, int]] = []
    arrived = threading.Condition()

    def listener(name: str) -> Any:
        def hear(seq: int) -> None:
            with arrived:
                got.append((name, seq))
                arrived.notify_all()

        return hear

    stop_one = one.subscribe(listener("one"))
    two.subscribe(listener("two"))
    other = open_store(opened, url.replace("schema=", "schema=x"))  # another schema: not heard
    other.append_event(Event("elsewhere"))

    script = (
        "import sys; from clawvm.store import store_from_url, Event; s = store_from_url(sys.argv[1]); "
        "s.setup(); print(s.append_events([Event('a'), Event('b')])[-1]); s.close()"
    )
    out = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    last = int(out.stdout.split()[-1])

    def wait_for(n: int) -> None:
        with arrived:
            assert arrived.wait_for(lambda: len(got) >= n, timeout=30), got

    wait_for(2)
    assert sorted(got) == [("one", last), ("two", last)]  # one notification per batch, per subscriber
    assert [e.kind for e in one.read_events()] == ["a", "b"]
    stop_one()
    seq = one.append_event(Event("c"))  # our own writes are heard too, by the remaining subscriber
    wait_for(3)
    time.sleep(0.3)
    assert got[2:] == [("two", seq)]


@pytest.mark.parametrize("isolation", [None, "repeatable read"], ids=["default", "repeatable-read-db"])
@pytest.mark.parametrize("tenant", [None, "t1"], ids=["log", "tenant"])
def test_event_readers_following_seq_never_skip_a_late_commit(
    url: str, opened: list[PostgresStore], tenant: str | None, isolation: str | None, tmp_path: Path
) -> None:
    """The log's numbers and each tenant's own are taken with no lock between writers, so they may commit
    out of order; a reader following either never skips one that commits late. Also in a database whose
    default isolation is repeatable read, where the read after waiting at a hole saw the snapshot taken
    before the wait, the late commit missing, and the reader went on past it."""
    if isolation is not None:
        database = pg_server.database_with({"default_transaction_isolation": isolation})
        url = pg_server.schema_url(database, tmp_path, "events")
    s = open_store(opened, url)
    writers, per_writer = 4, 40
    seen: list[int] = []
    done = threading.Event()

    def write(w: int) -> None:
        for i in range(per_writer):
            s.append_event(Event("tick", data={"w": w, "i": i}, tenant=tenant or "default"))

    def follow() -> None:
        after = 0
        while True:
            # "done" is read before the read: an empty read after every writer returned means the end
            # (read after it, a commit landing between the read and the check would be missed)
            finished = done.is_set()
            batch = s.read_events(after_seq=after, tenant=tenant)
            seen.extend(e.seq for e in batch if e.seq is not None)
            after = seen[-1] if seen else 0
            if finished and not batch:
                break

    reader = threading.Thread(target=follow)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join(60)
    assert len(seen) == len(set(seen)) == writers * per_writer  # every event once: none skipped


def test_appenders_of_one_tenant_do_not_wait_for_each_other(url: str, opened: list[PostgresStore]) -> None:
    """An append still in flight (its transaction open) holds back no other append of its tenant, whose
    number comes after it; a reader of the tenant's events waits for the one in flight instead of skipping
    its number, then reads both in order."""
    s = open_store(opened, url)
    s.append_event(Event("first", tenant="t1"))  # the tenant's sequence exists
    in_flight, release = threading.Event(), threading.Event()

    def slow_append() -> None:
        with s._conn("test") as conn, conn.transaction():
            s.event_log.append(conn, [Event("slow", tenant="t1")])
            in_flight.set()
            release.wait(30)

    slow = threading.Thread(target=slow_append)
    slow.start()
    assert in_flight.wait(30)
    fast = s.append_events([Event("fast", tenant="t1")], tenant_numbers=True)  # returns while slow is open
    assert fast == [3]
    read: list[list[str]] = []
    reader = threading.Thread(target=lambda: read.append([e.kind for e in s.read_events(1, tenant="t1")]))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and not read  # number 2 is in flight: the reader waits for it
    release.set()
    slow.join(30)
    reader.join(30)
    assert read == [["slow", "fast"]]
    assert [e.seq for e in s.read_events(0, tenant="t1")] == [1, 2, 3]


def test_a_tenants_numbers_go_on_past_its_old_counter_after_the_upgrade(
    url: str, opened: list[PostgresStore]
) -> None:
    """Before each tenant had a sequence its numbers came from a counter row, which retention never
    lowered: a tenant whose events were all deleted must not start over at 1 (a reader holding number 3
    would skip the new events up to it)."""
    s = open_store(opened, url)
    assert s.append_events([Event("old", tenant="t")] * 3, tenant_numbers=True) == [1, 2, 3]
    newest = s.read_events(0)[-1].seq
    assert newest is not None
    s.delete_events_upto(newest)  # retention: every event of the tenant is gone
    with s._conn("test") as conn:  # as the schema before sequences: the counter row, no sequence
        conn.execute("INSERT INTO event_numbers VALUES ('t', 3) ON CONFLICT (tenant) DO UPDATE SET last = 3")
        conn.execute(f"DROP SEQUENCE {s.event_log.sequence('t')}")
        conn.execute("UPDATE meta SET value = %s WHERE key = 'version'", [str(len(MIGRATIONS) - 1)])
    s.close()
    again = open_store(opened, url)
    assert again.append_events([Event("new", tenant="t")], tenant_numbers=True) == [4]
    assert [e.kind for e in again.read_events(3, tenant="t")] == ["new"]


def test_a_new_id_written_twice_at_once_is_one_write_and_one_conflict(
    url: str, opened: list[PostgresStore]
) -> None:
    one, two = open_store(opened, url), open_store(opened, url)
    results: list[str] = []
    for _ in range(5):
        m = Memory(content="created by two writers at once")
        barrier = threading.Barrier(2)

        def put(store: PostgresStore, m: Memory = m, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                store.put(m)
                results.append("ok")
            except ConflictError:
                results.append("conflict")

        threads = [threading.Thread(target=put, args=(s,)) for s in (one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert one.get(m.id) == m
    assert results.count("ok") == 5 and results.count("conflict") == 5


PROCESSES, INCREMENTS = 4, 40


def _increment(url: str, ids: list[str], worker: int, conflicts: Any) -> None:
    """Read-modify-write ``INCREMENTS`` times, retrying on conflicts (the merge counts on from the head)."""
    s = store_from_url(url)
    s.setup()
    try:
        for i in range(INCREMENTS):
            target = ids[(worker + i) % len(ids)]
            while True:
                cur = s.get(target)
                n = int(cur.metadata["n"]) + 1
                try:
                    s.put(
                        cur.model_copy(
                            update={
                                "version": cur.version + 1,
                                "metadata": {"n": n},
                                "content": f"counter at {n}",
                            }
                        )
                    )
                    break
                except ConflictError:
                    with conflicts.get_lock():
                        conflicts.value += 1
    finally:
        s.close()


def test_optimistic_locking_holds_across_processes(url: str, opened: list[PostgresStore]) -> None:
    s = open_store(opened, url)
    counters = [Memory(content="counter at 0", metadata={"n": 0}) for _ in range(2)]
    s.put_many(counters)
    ids = [m.id for m in counters]
    ctx = multiprocessing.get_context("spawn")
    conflicts = ctx.Value("i", 0)
    procs = [ctx.Process(target=_increment, args=(url, ids, w, conflicts)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    assert conflicts.value > 0, "the processes never raced; the test proves nothing"
    final = s.get_many(ids)
    assert sum(int(m.metadata["n"]) for m in final.values()) == PROCESSES * INCREMENTS  # no update lost
    for m in final.values():
        assert m.version == int(m.metadata["n"]) + 1
        hits = s.query(Query(text=f"counter at {m.metadata['n']}")).lexical
        assert m.id in {i for i, _ in hits}  # the lexical index follows the last write


def test_a_harness_in_each_process_shares_memories_and_recall(url: str, opened: list[PostgresStore]) -> None:
    script = (
        "import sys; from clawvm import Harness\n"
        "with Harness.open(sys.argv[1], embedder=None) as h:\n"
        "    print(h.record('the canary deploy failed in zone b', session_id='s').id)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    child = out.stdout.split()[-1]
    with Harness.open(url, embedder=None) as h:
        assert [hit.id for hit in h.recall("canary deploy", k=3, preset="bm25")] == [child]
        assert [e.memory_id for e in h.events() if e.kind == "add"] == [child]


def test_bm25_scores_match_the_in_process_engine(
    url: str, opened: list[PostgresStore], tmp_path: Path
) -> None:
    pg = open_store(opened, url)
    lite = SQLiteStore(tmp_path / "same.db")
    lite.setup()
    try:
        docs = [
            Memory(content=t, session_id="s" if i % 3 else None)
            for i, t in enumerate(
                [
                    "the deploy failed because the disk was full",
                    "disk usage alert on the database host",
                    "we rolled back the deploy and cleared old logs",
                    "lunch at noon, deploy after lunch",
                    "postgres vacuum freed disk space on the host",
                ]
            )
        ]
        for s in (pg, lite):
            s.put_many(docs)
        q = Query(text="why did the deploy fail on a full disk", limit=10)
        want, got = lite.query(q).lexical, pg.query(q).lexical
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5)
    finally:
        lite.close()


# ---- a DBA's default isolation level --------------------------------------------------------------------
# The engine's transactions are written for READ COMMITTED: each statement sees what committed before it
# began, so a statement after an advisory lock sees what its holder wrote. A database (or role) whose
# default_transaction_isolation is stricter takes a transaction's snapshot at its first statement, the lock.
STRICTER = ["repeatable read", "serializable"]


@pytest.fixture(params=STRICTER)
def strict_database(request: pytest.FixtureRequest) -> str:
    """A database whose DBA made every transaction ``request.param`` unless the session says otherwise."""
    return pg_server.database_with({"default_transaction_isolation": request.param})


def _in_threads(n: int, step: Callable[[int], Any]) -> list[str]:
    """``step(i)`` on ``n`` threads let go at once; the errors they raised (type and message)."""
    start, errors = threading.Barrier(n), []

    def run(i: int) -> None:
        start.wait(30)
        try:
            step(i)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_stores_opening_a_new_schema_at_once_all_succeed_whatever_the_default_isolation(
    strict_database: str, tmp_path: Path
) -> None:
    """Under repeatable read the migration's snapshot was taken at its lock, before the first opener's
    tables committed: the others found no meta table, ran every migration again and failed ("relation
    already exists"), or were aborted for serialization."""
    errors = []
    for round_ in range(4):
        url = pg_server.schema_url(strict_database, tmp_path, f"open{round_}")

        def open_and_close(_: int, url: str = url) -> None:
            s = store_from_url(url)
            s.setup()
            s.close()

        errors += _in_threads(4, open_and_close)
    assert errors == []


def test_the_engines_transactions_are_read_committed_whatever_the_default_isolation(
    strict_database: str, tmp_path: Path, opened: list[PostgresStore]
) -> None:
    s = open_store(opened, pg_server.schema_url(strict_database, tmp_path, "levels"))
    with s._conn("test") as conn, conn.transaction():
        assert conn.execute("SHOW transaction_isolation").fetchone() == ("read committed",)


def test_a_default_isolation_in_the_urls_options_or_pgoptions_gives_way_to_the_engines(
    url: str, opened: list[PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own isolation level comes after the URL's options= (or PGOPTIONS), whose other settings
    still apply."""
    strict = "-c%20default_transaction_isolation%3Drepeatable%5C%20read%20-c%20work_mem%3D7MB"
    s = open_store(opened, f"{url}&options={strict}")
    with s._conn("test") as conn, conn.transaction():
        assert conn.execute("SHOW transaction_isolation").fetchone() == ("read committed",)
        assert conn.execute("SHOW work_mem").fetchone() == ("7MB",)
    monkeypatch.setenv("PGOPTIONS", r"-c default_transaction_isolation=serializable")
    s = open_store(opened, url)
    with s._conn("test") as conn, conn.transaction():
        assert conn.execute("SHOW transaction_isolation").fetchone() == ("read committed",)


def test_pins_at_once_keep_the_budget_whatever_the_default_isolation(
    strict_database: str, tmp_path: Path
) -> None:
    """Each pin reads the session's pins after the session's lock; under repeatable read that read saw the
    snapshot taken at the lock, before the pins committed while it waited, and the budget overflowed."""
    import pin_race

    url = pg_server.schema_url(strict_database, tmp_path, "pins")
    with Harness.open(url, embedder=None, pager=pin_race.pager_config()) as h:
        ids = [h.record(f"pin candidate {i}", session_id="p", tier="long_term").id for i in range(4)]
    start, results = threading.Barrier(len(ids)), queue.Queue[tuple[Any, ...]]()
    threads = [threading.Thread(target=pin_race.pin_when_told, args=(url, i, start, results)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    said = [results.get_nowait() for _ in threads]
    assert [s for s in said if s[0] == "error"] == []
    with Harness.open(url, embedder=None, pager=pin_race.pager_config()) as h:
        pinned = {m.id for m in h.list(limit=100, session_id="p", pinned=True)}
    assert pinned == {s[1] for s in said if s[0] == "ok"}
    assert len(pinned) == pin_race.PIN_ITEMS


def test_writers_of_one_memory_at_once_conflict_not_fail_whatever_the_default_isolation(
    strict_database: str, tmp_path: Path, opened: list[PostgresStore]
) -> None:
    """Read-modify-write from several stores at once: each lost race is a ConflictError (the caller merges
    and writes again), never a serialization failure surfacing as a StoreError once the retries ran out."""
    url = pg_server.schema_url(strict_database, tmp_path, "counters")
    stores = [open_store(opened, url) for _ in range(4)]
    counter = Memory(content="counter at 0", metadata={"n": 0})
    stores[0].put(counter)
    conflicts = [0]

    def increment(w: int) -> None:
        s = stores[w]
        for _ in range(INCREMENTS):
            while True:
                cur = s.get(counter.id)
                n = int(cur.metadata["n"]) + 1
                try:
                    s.put(cur.model_copy(update={"version": cur.version + 1, "metadata": {"n": n}}))
                    break
                except ConflictError:
                    conflicts[0] += 1

    assert _in_threads(len(stores), increment) == []
    assert conflicts[0] > 0, "the writers never raced; the test proves nothing"
    assert int(stores[0].get(counter.id).metadata["n"]) == len(stores) * INCREMENTS  # no update lost
