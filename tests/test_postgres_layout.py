"""The PostgreSQL engine's layout and round trips, on the real server: ready to be sharded by tenant (every
table but ``meta`` carries the tenant, every unique key includes it, joins match on it, no recursive
query), the migration that brought existing schemas there, a recall in a bounded number of statements,
and the context channel (computed in SQL) against a direct computation of its definition."""

from __future__ import annotations

import inspect
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pg_server
from clawvm import Filters, Harness, Memory, MiniLMEmbedder
from clawvm.core.lexical import Analyzer, BM25Params, LexicalIndex
from clawvm.core.model import Link, LinkType
from clawvm.store import Query, postgres_search, store_from_url
from clawvm.store import postgres as pg_engine
from clawvm.store.index import CONTEXT_WINDOW, index_text
from clawvm.store.postgres import PostgresStore

#: Tables without a tenant: replicated to every node (Citus reference tables), never joined per tenant.
SHARED_TABLES = {"meta"}
_TABLES = ("memories", "postings", "entities", "links", "events", "agents")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PostgresStore]:
    s = store_from_url(pg_server.store_url(tmp_path, "pg"))
    assert isinstance(s, PostgresStore)
    s.setup()
    yield s
    s.close()


def layout_problems(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """What keeps ``schema`` from being sharded by tenant: a table without a NOT NULL tenant column, a
    unique key (primary keys included) without the tenant, a foreign key."""
    problems = []
    tables = [
        str(r[0])
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY 1",
            [schema],
        )
    ]
    assert {"memories", "postings", "entities", "links", "events", "credentials"} <= set(tables)
    for table in tables:
        if table in SHARED_TABLES:
            continue
        nullable = conn.execute(
            "SELECT is_nullable FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = %s AND column_name = 'tenant'",
            [schema, table],
        ).fetchone()
        if nullable is None or nullable[0] != "NO":
            problems.append(f"{table} has no NOT NULL tenant column")
    for table, index, keys in conn.execute(
        """SELECT t.relname, i.relname,
                  ARRAY(SELECT a.attname::text FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(att, n)
                        JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.att
                        WHERE k.n <= x.indnkeyatts ORDER BY k.n)
           FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
           JOIN pg_namespace n ON n.oid = t.relnamespace
           WHERE n.nspname = %s AND x.indisunique ORDER BY 1, 2""",
        [schema],
    ):
        if table not in SHARED_TABLES and "tenant" not in keys:
            problems.append(f"unique index {index} on {table} {tuple(keys)} lacks the tenant")
    for (name,) in conn.execute(
        "SELECT c.conname FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
        " WHERE n.nspname = %s AND c.contype = 'f'",
        [schema],
    ):
        problems.append(f"foreign key {name}")
    return problems


def sql_problems() -> list[str]:
    """Recursive queries, and joins of two tenant tables that do not match on the tenant, in the engine's
    SQL (both would need data from several shards)."""
    problems = []
    for module in (pg_engine, postgres_search):
        source = inspect.getsource(module)
        for step in pg_engine.MIGRATIONS:  # the schema's own history: it runs once, on every node
            source = source.replace(step, "")
        if "WITH RECURSIVE" in source.upper():
            problems.append(f"{module.__name__} has a recursive query")
        for m in re.finditer(rf"JOIN ({'|'.join(_TABLES)}) (\w+) ON ([^\n]*)", source):
            if "tenant" not in m.group(3):
                problems.append(f"{module.__name__}: JOIN {m.group(1)} ON {m.group(3)}")
    return problems


def test_every_table_shards_by_tenant(store: PostgresStore) -> None:
    with store._conn("test") as conn:
        assert layout_problems(conn, store.schema) == []
    assert sql_problems() == []


# ---- the migration that put the tenant in every key ---------------------------------------------------
def _back_to_seq_keys(store: PostgresStore) -> None:
    """Undo the tenant-keys migration in ``store``'s schema (keeping its data), as a database written
    before it would be, and close the store."""
    with store._conn("test") as conn, conn.transaction():
        pg_server.vectors_back_in_rows(conn, store.dim)
        conn.execute("""
            ALTER TABLE postings DROP COLUMN tenant;
            ALTER TABLE postings ADD PRIMARY KEY (term, seq);
            CREATE INDEX postings_seq ON postings (seq);
            ALTER TABLE entities DROP COLUMN tenant;
            ALTER TABLE entities ADD PRIMARY KEY (entity, seq);
            CREATE INDEX entities_seq ON entities (seq);
            ALTER TABLE links DROP COLUMN tenant;
            ALTER TABLE links ADD PRIMARY KEY (source, type, target);
            DROP INDEX links_source;
            ALTER TABLE memories DROP CONSTRAINT memories_pkey, DROP CONSTRAINT memories_id_key,
                ADD PRIMARY KEY (seq), ADD CONSTRAINT memories_id_key UNIQUE (id);
            ALTER TABLE events DROP CONSTRAINT events_pkey, ADD PRIMARY KEY (seq);
            DROP INDEX events_seq;
            DROP TABLE agents;
            CREATE TABLE lexstats (slot integer PRIMARY KEY, docs bigint NOT NULL, total_len bigint NOT NULL,
                                   sessioned bigint NOT NULL);
            INSERT INTO lexstats SELECT s, 0, 0, 0 FROM generate_series(0, 15) AS s;
            UPDATE lexstats SET docs = t.docs, total_len = t.total_len, sessioned = t.sessioned
                FROM (SELECT sum(docs) AS docs, sum(total_len) AS total_len, sum(sessioned) AS sessioned
                      FROM tenant_lexstats) AS t
                WHERE slot = 0;
        """)
        before = next(n for n, sql in enumerate(pg_engine.MIGRATIONS) if "postings_by_tenant" in sql)
        conn.execute("UPDATE meta SET value = %s WHERE key = 'version'", [str(before)])
        assert layout_problems(conn, store.schema) != []  # the old layout, as the test means it
    store.close()


def test_an_existing_schema_gets_the_tenant_keys_and_searches_alike(tmp_path: Path) -> None:
    url = pg_server.store_url(tmp_path, "old")
    store = store_from_url(url)
    assert isinstance(store, PostgresStore)
    store.setup()
    texts = [
        "Alice deployed the billing service to Berlin",
        "the billing deploy in Berlin failed on a full disk",
        "Bob cleared the disk and Alice deployed again",
        "lunch with Bob in Berlin",
        "Alice wrote the postmortem of the billing outage",
    ]
    first = Memory(content="root note", tenant="t1")
    docs = [first] + [
        Memory(
            content=t,
            tenant=f"t{1 + i % 2}",
            session_id=f"s{i % 2}",
            agent_id=f"agent{i % 3}",
            links=[Link(type=LinkType.REFERS_TO, target=first.id)],
        )
        for i, t in enumerate(texts)
    ]
    store.put_many(docs)
    queries = [
        Query(filters=Filters(tenant=frozenset({"t1"})), text="billing deploy Berlin", context=True),
        Query(filters=Filters(), text="Alice disk", context=True, expand=(docs[1].id,)),
        Query(filters=Filters(tenant=frozenset({"t2"})), expand=tuple(m.id for m in docs)),
    ]

    def observe(s: PostgresStore) -> list[Any]:
        found = [s.query(q) for q in queries]
        return [
            *[(r.lexical, r.context, r.related) for r in found],
            s.count(),
            s.agents(Filters(tenant=frozenset({"t1"}))),
            s.edges([first.id]),
            s.index.entities_of(docs[2].id),
        ]

    before = observe(store)
    assert before[0][0] and before[0][1] and before[1][2]  # the queries find something to compare
    _back_to_seq_keys(store)
    again = store_from_url(url)
    assert isinstance(again, PostgresStore)
    try:
        again.setup()
        with again._conn("test") as conn:
            assert layout_problems(conn, again.schema) == []
        assert observe(again) == before
        more = Memory(content="Alice deployed the billing fix", tenant="t1", agent_id="agent9")
        again.put(more)  # and writing goes on in the new layout
        assert more.id in [i for i, _ in again.query(queries[0]).lexical]
        assert "agent9" in again.agents(Filters(tenant=frozenset({"t1"})))
    finally:
        again.close()


# ---- round trips ------------------------------------------------------------------------------------
#: Statements one default recall sends (search with its BEGIN/settings/COMMIT, neighbours' info, the
#: memories; and, on a store this small, the count of rows with a vector): 10 before the text channels
#: moved into one statement.
MAX_STATEMENTS_PER_RECALL = 6


def test_a_recall_sends_a_bounded_number_of_statements(
    tmp_path: Path, embedder: MiniLMEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = ["deploy", "disk", "lunch", "billing", "vacation", "database"]
    with Harness.open(pg_server.store_url(tmp_path, "count"), embedder=embedder) as h:
        for i in range(60):
            h.record(
                f"note {i} about the {topics[i % 6]} and the {topics[(i * 7) % 6]} of week {i % 9}",
                session_id=f"s{i % 5}",
                agent_id=f"agent{i % 3}",
            )
        h.flush()
        h.recall("what about the deploy disk", track=False)  # warm: the pool's connections, the author cache
        sent: list[str] = []
        execute = psycopg.Cursor.execute

        def counted(cur: psycopg.Cursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
            sent.append(str(query)[:80])
            return execute(cur, query, *args, **kw)

        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        hits = h.recall("what happened to the billing database last week", track=False)
        monkeypatch.undo()
    assert hits
    assert 0 < len(sent) <= MAX_STATEMENTS_PER_RECALL, sent


# ---- the context channel, as defined ------------------------------------------------------------------
def _context_by_definition(docs: list[Memory], query: str, limit: int) -> list[tuple[str, float]]:
    """The context channel computed from its definition (module docstring of postgres_search), in
    Python: neighbourhoods of the rows within ``window`` of the best ``2 * limit`` own-text rows."""
    w, p, analyzer = CONTEXT_WINDOW, BM25Params(), Analyzer()
    terms = {d.id: Counter(analyzer.terms(index_text(d))) for d in docs}
    q = list(dict.fromkeys(analyzer.terms(query)))
    n = len(docs)
    total = sum(sum(t.values()) for t in terms.values())
    df = {t: sum(1 for d in docs if terms[d.id][t]) for t in q}
    q = [t for t in q if df[t]]
    avgdl = max(total / n, 1.0)

    def own(d: Memory) -> float:
        dl = sum(terms[d.id].values())
        norm = p.k1 * (1 - p.b + p.b * dl / avgdl)
        return sum(
            LexicalIndex.idf(df[t], n) * f * (p.k1 + 1) / (f + norm) for t in q if (f := terms[d.id][t])
        )

    ranked = sorted((d for d in docs if own(d) > 0), key=lambda d: -own(d))[: 2 * limit]
    order = {d.id: i for i, d in enumerate(docs)}  # written in this order, one session each: seq order
    session = {d.id: [x for x in docs if x.session_id == d.session_id] if d.session_id else [d] for d in docs}

    def near(d: Memory, radius: int) -> list[Memory]:
        run = session[d.id]
        at = run.index(d)
        return run[max(0, at - radius) : at + radius + 1]

    cands = {c.id: c for b in ranked for c in near(b, w)}
    spread = 1 + 2 * w * sum(1 for d in docs if d.session_id) / n
    avg_ctx = max(avgdl * spread, 1.0)
    idf_ctx = {t: LexicalIndex.idf(min(n, round(df[t] * spread)), n) for t in q}
    out = []
    for c in cands.values():
        hood = near(c, w)
        length = sum(sum(terms[x.id].values()) for x in hood)
        norm = p.k1 * (1 - p.b + p.b * length / avg_ctx)
        score = 0.0
        for t in q:
            if f := sum(terms[x.id][t] for x in hood):
                score += idf_ctx[t] * f * (p.k1 + 1) / (f + norm)
        if score > 0:
            out.append((c.id, score))
    out.sort(key=lambda x: (-x[1], order[x[0]]))
    return out[:limit]


def test_the_context_channel_scores_neighbourhoods_by_its_definition(store: PostgresStore) -> None:
    words = ["disk", "deploy", "lunch", "berlin", "billing", "alert", "vacuum", "host"]
    docs = [
        Memory(
            content=" ".join(words[(i * k) % len(words)] for k in range(1, 2 + i % 4)) + f" note{i}",
            session_id=None if i % 7 == 3 else f"s{i % 3}",
        )
        for i in range(40)
    ]
    for d in docs:  # one at a time: creation order is write order within each session
        store.put(d)
    query = "disk deploy billing"
    got = store.query(Query(text=query, limit=4, context=True, lexical=False)).context
    want = _context_by_definition(docs, query, 4)
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-9)
    assert not math.isclose(want[0][1], want[-1][1])  # scores that rank, not ties


def test_a_memory_moved_to_another_tenant_moves_with_its_postings(store: PostgresStore) -> None:
    """Rows are locked through their tenant; an id stored under another tenant is still found, so the
    write moves the memory (and its postings and entities) instead of adding a second row."""
    m = Memory(content="Alice moved the billing ledger to Berlin", tenant="t1")
    store.put(m)
    store.put(m.model_copy(update={"tenant": "t2", "version": m.version + 1}))
    assert store.get(m.id).tenant == "t2"
    assert store.count() == 1 and store.count(Filters.of(tenant="t1")) == 0

    def found(tenant: str) -> list[str]:
        q = Query(filters=Filters.of(tenant=tenant), text="billing ledger", context=True)
        return [i for i, _ in store.query(q).lexical]

    assert found("t2") == [m.id] and found("t1") == []
    assert store.index.entities_of(m.id)  # re-indexed under its new tenant, not dropped
    with store._conn("test") as conn:
        tenants = {str(r[0]) for r in conn.execute("SELECT DISTINCT tenant FROM postings")}
    assert tenants == {"t2"}
