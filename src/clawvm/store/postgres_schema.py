"""The PostgreSQL engine's schema: its migrations, an append-only list (the table layout is described in
:mod:`clawvm.store.postgres`), the Python steps some of them run, and the credential upsert those steps
share with the engine."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from clawvm.core.lexical import Analyzer
from clawvm.store.base import Event, credential_json
from clawvm.store.index import index_text
from clawvm.store.keys import AUTH_TENANT, KEYS_STREAM, credentials_from_key_events
from clawvm.store.memory import from_stored
from clawvm.store.postgres_rows import ADD_TENANT_STATS, TenantStats
from clawvm.store.postgres_search import term_key, unesc

log = logging.getLogger(__name__)

# Append-only: never edit a shipped entry, add a new one. ``{dim}`` is the store's vector dimension.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
    CREATE SEQUENCE memory_seq;
    CREATE TABLE memories (
        seq bigint PRIMARY KEY DEFAULT nextval('memory_seq'),
        id uuid NOT NULL UNIQUE,
        tenant text NOT NULL,
        session_id text, task_id text, agent_id text, tool_name text, scope text, team_id text,
        kind text NOT NULL, state text, status text NOT NULL, tier text NOT NULL,
        parent_id uuid,
        pinned boolean NOT NULL,
        tags text[] NOT NULL,
        created_at timestamptz NOT NULL,
        version bigint NOT NULL,
        doc_len integer NOT NULL,
        text_hash bigint NOT NULL,
        content_hash bytea NOT NULL,
        metadata jsonb,
        body text NOT NULL,
        embedding vector({dim})
    );
    ALTER SEQUENCE memory_seq OWNED BY memories.seq;
    -- vectors stay in the row (a TOASTed vector is fetched and decompressed at every exact distance)
    ALTER TABLE memories ALTER COLUMN embedding SET STORAGE PLAIN;
    CREATE INDEX memories_session ON memories (tenant, session_id, created_at, seq);
    CREATE INDEX memories_created ON memories (tenant, created_at, seq);
    CREATE INDEX memories_parent ON memories (parent_id);
    CREATE INDEX memories_tags ON memories USING gin (tags);
    CREATE INDEX memories_metadata ON memories USING gin (metadata jsonb_path_ops);
    CREATE INDEX memories_unembedded ON memories (seq) WHERE embedding IS NULL;
    CREATE INDEX memories_embedding ON memories USING hnsw (embedding vector_ip_ops);
    CREATE TABLE postings (term text NOT NULL, seq bigint NOT NULL, tf integer NOT NULL, dl integer NOT NULL,
                           PRIMARY KEY (term, seq));
    CREATE INDEX postings_seq ON postings (seq);
    CREATE TABLE entities (entity text NOT NULL, seq bigint NOT NULL, PRIMARY KEY (entity, seq));
    CREATE INDEX entities_seq ON entities (seq);
    CREATE TABLE lexstats (slot integer PRIMARY KEY, docs bigint NOT NULL, total_len bigint NOT NULL,
                           sessioned bigint NOT NULL);
    INSERT INTO lexstats SELECT s, 0, 0, 0 FROM generate_series(0, 15) AS s;
    CREATE TABLE links (source uuid NOT NULL, type text NOT NULL, target uuid NOT NULL,
                        PRIMARY KEY (source, type, target));
    CREATE INDEX links_target ON links (target);
    CREATE TABLE events (
        seq bigserial PRIMARY KEY,
        at timestamptz NOT NULL, tenant text NOT NULL, kind text NOT NULL, memory_id text, data json NOT NULL
    );
    CREATE INDEX events_memory ON events (memory_id, seq);
    """,
    # recall's author names (Store.agents): a skip scan over this index reads one entry per agent
    """
    CREATE INDEX memories_agent ON memories (tenant, agent_id) WHERE agent_id IS NOT NULL;
    """,
    # credentials apart from the event log (retention never reaches them); "C": (tenant, kind, name) order
    # is code point order, as in the other engines. The API keys older schemas kept as events are copied
    # in by DATA_MIGRATIONS[2].
    """
    CREATE TABLE credentials (
        tenant text COLLATE "C" NOT NULL, kind text COLLATE "C" NOT NULL, name text COLLATE "C" NOT NULL,
        version bigint NOT NULL, data json NOT NULL,
        PRIMARY KEY (tenant, kind, name)
    );
    CREATE INDEX credentials_name ON credentials (kind, name);
    """,
    # bounded reads: expiry finds what is due through (tenant, status, expires_at); keyset pages
    # (Store.page) of a whole store walk (created_at, id); the pager's sessions with working-tier members
    # come from (tenant, tier, session_id), in code-point order like every engine's session_ids
    """
    ALTER TABLE memories ADD COLUMN expires_at timestamptz;
    UPDATE memories SET expires_at = (body::json ->> 'expires_at')::timestamptz
        WHERE body LIKE '%"expires_at":"%';
    CREATE INDEX memories_expiry ON memories (tenant, status, expires_at) WHERE expires_at IS NOT NULL;
    CREATE INDEX memories_keyset ON memories (created_at, id);
    CREATE INDEX memories_tier ON memories (tenant, tier, session_id COLLATE "C");
    """,
    # BM25's corpus counters per tenant (a query confined to one tenant scores with its own statistics:
    # another tenant's documents show in none of its scores), sharded by connection like lexstats
    """
    CREATE TABLE tenant_lexstats (tenant text NOT NULL, slot integer NOT NULL, docs bigint NOT NULL,
                                  total_len bigint NOT NULL, sessioned bigint NOT NULL,
                                  PRIMARY KEY (tenant, slot));
    INSERT INTO tenant_lexstats
        SELECT tenant, 0, count(*), coalesce(sum(doc_len), 0), count(session_id)
        FROM memories GROUP BY tenant;
    """,
    # events numbered per tenant as well (tenant_seq; each tenant's last number in event_numbers): a
    # tenant reads its events through events_tenant, at a cost that follows its own events, and its
    # numbers tell nothing of other tenants' activity. Events already logged are numbered in log order.
    """
    ALTER TABLE events ADD COLUMN tenant_seq bigint;
    UPDATE events e SET tenant_seq = r.n
        FROM (SELECT seq, row_number() OVER (PARTITION BY tenant ORDER BY seq) AS n FROM events) AS r
        WHERE e.seq = r.seq;
    CREATE UNIQUE INDEX events_tenant ON events (tenant, tenant_seq);
    CREATE TABLE event_numbers (tenant text PRIMARY KEY, last bigint NOT NULL);
    INSERT INTO event_numbers SELECT tenant, max(tenant_seq) FROM events GROUP BY tenant;
    """,
    # counts by status (GET /v1/stats, the pager's bookkeeping) from an index-only scan, not the heap
    """
    CREATE INDEX IF NOT EXISTS memories_status ON memories (tenant, status);
    """,
    # room on every page for a row's next version: access bookkeeping (usage in the body) changes no
    # indexed column, so with free space on the page its update is HOT (no new HNSW or btree entries)
    """
    ALTER TABLE memories SET (fillfactor = 70);
    """,
    # every table but meta carries the tenant and every unique key includes it, so a distributed
    # PostgreSQL (Citus) can shard each table by tenant with its keys checked on one shard: postings and
    # entities take their memory's tenant (postings' key covers tf and dl: BM25 ranks from the index
    # alone), links their source's; memories are keyed (tenant, seq) and (id, tenant), the latter
    # serving lookups by id alone. The store-wide counters (lexstats) give way to the sums of the
    # per-tenant ones, and recall's author names come from a table of (tenant, agent) instead of a
    # recursive skip scan.
    """
    DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = 'postings' AND column_name = 'tenant') THEN
        CREATE TABLE postings_by_tenant (tenant text NOT NULL, term text NOT NULL, seq bigint NOT NULL,
                                         tf integer NOT NULL, dl integer NOT NULL);
        INSERT INTO postings_by_tenant
            SELECT m.tenant, p.term, p.seq, p.tf, p.dl FROM postings p JOIN memories m ON m.seq = p.seq;
        DROP TABLE postings;
        ALTER TABLE postings_by_tenant RENAME TO postings;
        ALTER TABLE postings ADD CONSTRAINT postings_pkey PRIMARY KEY (tenant, term, seq) INCLUDE (tf, dl);
        CREATE INDEX postings_seq ON postings (tenant, seq);
        CREATE TABLE entities_by_tenant (tenant text NOT NULL, entity text NOT NULL, seq bigint NOT NULL);
        INSERT INTO entities_by_tenant
            SELECT m.tenant, e.entity, e.seq FROM entities e JOIN memories m ON m.seq = e.seq;
        DROP TABLE entities;
        ALTER TABLE entities_by_tenant RENAME TO entities;
        ALTER TABLE entities ADD CONSTRAINT entities_pkey PRIMARY KEY (tenant, entity, seq);
        CREATE INDEX entities_seq ON entities (tenant, seq);
        ALTER TABLE links ADD COLUMN tenant text;
        UPDATE links l SET tenant = m.tenant FROM memories m WHERE m.id = l.source;
        UPDATE links SET tenant = '' WHERE tenant IS NULL;
        ALTER TABLE links ALTER COLUMN tenant SET NOT NULL, DROP CONSTRAINT links_pkey,
            ADD CONSTRAINT links_pkey PRIMARY KEY (tenant, source, type, target);
        CREATE INDEX links_source ON links (source);
        ALTER TABLE memories DROP CONSTRAINT memories_pkey, DROP CONSTRAINT memories_id_key,
            ADD CONSTRAINT memories_pkey PRIMARY KEY (tenant, seq),
            ADD CONSTRAINT memories_id_key UNIQUE (id, tenant);
        ALTER TABLE events DROP CONSTRAINT events_pkey, ADD CONSTRAINT events_pkey PRIMARY KEY (tenant, seq);
        CREATE INDEX events_seq ON events (seq);
        DROP TABLE lexstats;
    END IF; END $$;
    CREATE TABLE IF NOT EXISTS agents (tenant text NOT NULL, agent_id text NOT NULL,
                                       PRIMARY KEY (tenant, agent_id));
    INSERT INTO agents SELECT DISTINCT tenant, agent_id FROM memories WHERE agent_id IS NOT NULL
        ON CONFLICT DO NOTHING;
    """,
    # vectors out of the memories row: a promotion changes the (indexed) tier, so its update is not HOT
    # and re-inserts the row into every index; with the vector in the row that meant a new HNSW node per
    # promoted hit (~3 ms each, 97% of a tracked recall's write) and a graph full of dead entries. Vectors
    # live in their own table (keyed like memories, by tenant and seq) that bookkeeping never touches;
    # ``embedded`` says which rows have one (the embed worker's backlog comes from its partial index)
    """
    DO $$ BEGIN
    IF to_regclass(format('%I.vectors', current_schema())) IS NULL THEN
        CREATE TABLE vectors (tenant text NOT NULL, seq bigint NOT NULL, embedding vector({dim}) NOT NULL,
                              PRIMARY KEY (tenant, seq));
        ALTER TABLE vectors ALTER COLUMN embedding SET STORAGE PLAIN;
        INSERT INTO vectors SELECT tenant, seq, embedding FROM memories WHERE embedding IS NOT NULL;
        ALTER TABLE memories ADD COLUMN embedded boolean NOT NULL DEFAULT false;
        UPDATE memories SET embedded = true WHERE embedding IS NOT NULL;
        ALTER TABLE memories DROP COLUMN embedding;
        CREATE INDEX memories_unembedded ON memories (seq) WHERE NOT embedded;
        CREATE INDEX vectors_embedding ON vectors USING hnsw (embedding vector_ip_ops);
    END IF; END $$;
    ANALYZE vectors;
    """,
    # a session's tier members (the pager's budget checks, a tracked recall's promotions) by index: the
    # filter compares session ids in the column's own collation, which memories_tier's "C" column cannot
    # serve, so each read walked every working-tier row of the tenant (3,400 rows, 4 ms at 20k memories).
    # The pager's session_ids (code-point order) now sort the tier's ids from an index-only scan of this one
    """
    DROP INDEX IF EXISTS memories_tier;
    CREATE INDEX IF NOT EXISTS memories_tier_members ON memories (tenant, tier, session_id);
    """,
    # each tenant's event numbers from a sequence of its own (see tenant_sequence), made on the tenant's
    # first append and started past its highest number (event_numbers keeps, read-only now, how far each
    # tenant had gone, retention's deletes included), instead of that counter row, which every appender of
    # the tenant locked from its insert to its commit (one writer's commit at a time per tenant). A number
    # may now commit after a higher one, or be lost to a rollback: readers wait such holes out as they do
    # in the log's own numbers (PostgresStore.read_events). Sequences left from an earlier numbering go
    """
    DO $$ DECLARE s record; BEGIN
        FOR s IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.relkind = 'S' AND n.nspname = current_schema() AND c.relname LIKE 'tenant_events_%'
        LOOP EXECUTE format('DROP SEQUENCE %I', s.relname); END LOOP;
    END $$;
    """,
    # the analyzer's version 2 (CJK bigrams, combining marks inside words, NFKC, ...: see ANALYZER_VERSION)
    # reads only non-ASCII text differently; DATA_MIGRATIONS re-analyzes the memories that have any
    """
    SELECT 1;
    """,
)


def tenant_sequence(tenant: str) -> str:
    """The name of the sequence that numbers ``tenant``'s events (the tenant as stored, escaped): a digest,
    so any tenant name makes a valid, fixed-length identifier that quotes nothing."""
    return "tenant_events_" + hashlib.md5(tenant.encode(), usedforsecurity=False).hexdigest()


# Insert a credential, or replace the stored one only when it is the next version (the compare-and-set of
# Store.put_credential, in one statement: concurrent writers cannot both pass); no row when it fails.
PUT_CREDENTIAL = """INSERT INTO credentials (tenant, kind, name, version, data)
    VALUES (%s, %s, %s, %s, %s::json)
    ON CONFLICT (tenant, kind, name) DO UPDATE SET version = excluded.version, data = excluded.data
    WHERE credentials.version = excluded.version - 1
    RETURNING version"""


def copy_key_events(conn: psycopg.Connection[Any]) -> None:
    """Copy the API keys an older schema kept only as events into the new credentials table (once: in the
    migration that creates it, in its transaction)."""
    rows = conn.execute(
        "SELECT seq, at, tenant, kind, memory_id, data FROM events WHERE memory_id = %s AND tenant = %s"
        " ORDER BY seq",
        [KEYS_STREAM, AUTH_TENANT],
    ).fetchall()
    events = (
        Event(kind=unesc(k) or "", memory_id=unesc(mid), data=d, tenant=unesc(t) or "", at=at, seq=int(s))
        for s, at, t, k, mid, d in rows
    )
    for c in credentials_from_key_events(events):
        conn.execute(PUT_CREDENTIAL, [c.tenant, c.kind, c.name, c.version, credential_json(c)])


def reanalyze_non_ascii(conn: psycopg.Connection[Any], analyzer: Analyzer) -> None:
    """Recompute the postings of the memories whose stored JSON has a non-ASCII character, with their
    lengths (each posting's, the row's and its tenant's total): the analyzer's versions differ only on such
    text. Page by page in the migration's transaction, so a failure leaves the schema as it was; each page
    locked (a process of the older version writing meanwhile waits, its write then re-indexed by itself).
    A row whose body this version cannot read keeps its postings, logged."""
    after: tuple[str, int] = ("", -1)
    while True:
        rows = conn.execute(
            "SELECT tenant, seq, body, doc_len FROM memories WHERE (tenant, seq) > (%s, %s) AND body ~ %s"
            " ORDER BY tenant, seq LIMIT %s FOR UPDATE",
            [*after, r"[^\x01-\x7f]", _REANALYZED_PAGE],
        ).fetchall()
        if not rows:
            return
        after = (rows[-1][0], rows[-1][1])
        redone = [r for r in (_reanalyzed(analyzer, *row) for row in rows) if r is not None]
        if not redone:
            continue
        keys = [[r.tenant for r in redone], [r.seq for r in redone]]
        conn.execute(
            "DELETE FROM postings WHERE (tenant, seq) IN (SELECT * FROM unnest(%s::text[], %s::bigint[]))",
            keys,
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO postings (tenant, term, seq, tf, dl) VALUES (%s, %s, %s, %s, %s)",
                [(r.tenant, term, r.seq, tf, r.length) for r in redone for term, tf in r.terms.items()],
            )
        conn.execute(
            "UPDATE memories m SET doc_len = t.length FROM unnest(%s::text[], %s::bigint[], %s::int[])"
            " AS t(tenant, seq, length) WHERE m.tenant = t.tenant AND m.seq = t.seq",
            [*keys, [r.length for r in redone]],
        )
        stats = TenantStats()
        for r in redone:
            stats.add(r.tenant, 0, r.length - r.old_length, 0)
        if stats.changed():
            conn.execute(ADD_TENANT_STATS, stats.arrays())


@dataclass(frozen=True)
class _Reanalyzed:
    tenant: str
    seq: int
    terms: Counter[str]
    length: int
    old_length: int


def _reanalyzed(analyzer: Analyzer, tenant: str, seq: int, body: str, old_length: int) -> _Reanalyzed | None:
    try:
        memory = from_stored(body)
    except ValueError as exc:  # a body edited by hand, say: its old postings are better than no open
        log.warning(
            "memory %s of tenant %r keeps its postings: its body does not read (%s)", seq, tenant, exc
        )
        return None
    terms = Counter(term_key(t) for t in analyzer.terms(index_text(memory)))
    return _Reanalyzed(tenant, seq, terms, sum(terms.values()), old_length)


_REANALYZED_PAGE = 500

#: Python steps of a migration, run after its SQL, in the same transaction (migration number -> step); each
#: gets the store's analyzer.
DATA_MIGRATIONS: dict[int, Callable[[psycopg.Connection[Any], Analyzer], None]] = {
    2: lambda conn, _analyzer: copy_key_events(conn),
    12: reanalyze_non_ascii,  # a literal: the list grows, this step stays with the migration it belongs to
}
