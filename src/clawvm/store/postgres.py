"""The scale-out engine: PostgreSQL with pgvector behind the same storage contract.

``postgresql://user@host/db?schema=NAME`` (default schema ``clawvm``; every other URL parameter goes to
libpq). Many processes may share one database: PostgreSQL is the only state, so nothing is rebuilt on open
and nothing has to be kept in step between processes.

Tables (created by :data:`MIGRATIONS`, an append-only list; ``meta`` records how many ran, the vector
dimension and the claim of a job that holds the schema, see :meth:`Store.claim`):

- ``memories``: one row per memory: its exact JSON (``body``, the source of truth for ``get``), the
  filterable fields as columns (``expires_at`` among them, indexed for the pager's expiry), ``tags
  text[]`` and ``metadata jsonb`` with GIN indexes, ``embedded`` (whether it has a vector); keyset pages
  (``Store.page``) read the ``(created_at, id)`` order from an index;
- ``vectors(tenant, seq, embedding vector(dim))``: each embedded memory's unit vector, keyed like its row,
  with an HNSW index (inner product on unit vectors, i.e. cosine). Apart from the row so that access
  bookkeeping and promotions, which rewrite the row, never re-insert it into the graph;
- ``postings(tenant, term, seq, tf, dl)``: the inverted index of the project's own analyzer
  (``clawvm.core.lexical``), so BM25 here scores like the in-process engines; its primary key covers the
  term frequency and document length, so a query's BM25 is ranked from the index alone;
  ``tenant_lexstats``: each tenant's document count, total length and sessioned count as 16 sharded
  counters (each connection adds to its own, so writers from many processes do not queue on one row; a
  query confined to one tenant scores with its own statistics, one over several with their sums);
- ``entities(tenant, entity, seq)``: the write-time entity graph; ``links`` (with the source's tenant);
  ``agents(tenant, agent_id)``: the names recall may strip from a query; ``events`` (``json`` data; besides
  the log's ``seq``, ``tenant_seq``: the event's number in its tenant's own sequence (the sequence
  ``tenant_events_<md5 of the tenant>``, made on its first append), indexed with the tenant).

Every table but ``meta`` carries the tenant and every unique key includes it (see ``docs/postgres.md``,
"Distributing with Citus"). Ids are unique per tenant in the schema (key ``(id, tenant)``, which also
serves lookups by id alone); across tenants they are random UUIDs, and a write finds an id another tenant
holds (see :meth:`PostgresStore.put_many`).

Optimistic locking holds across processes: ``put_many`` locks the stored rows through their tenants
(``SELECT ... FOR UPDATE``, in id order, so concurrent batches cannot deadlock on them), checks
versions, and inserts new ids with their own sequence numbers; a concurrent insert of the same new id
surfaces as :class:`ConflictError`.
Every statement and transaction is written for READ COMMITTED, so the engine sets that level itself on
every connection it opens (:data:`ISOLATION_OPTION`, after the URL's ``options=`` or ``PGOPTIONS``): a
DBA's stricter ``default_transaction_isolation`` does not change its semantics.
The store URL (libpq's parameters and the engine's own) is taken apart in :mod:`clawvm.store.postgres_url`.
The event log (numbers per tenant with no lock shared between writers, reads that never skip an event
still in flight, ``NOTIFY`` to every process) lives in :mod:`clawvm.store.postgres_events`.

psycopg errors are translated into :mod:`clawvm.core.errors` in :func:`_translated`, the one place that knows
about the driver. The query side lives in :mod:`clawvm.store.postgres_search`; how a memory becomes rows,
and the statements that write them, in :mod:`clawvm.store.postgres_rows`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import weakref
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import numpy as np
import psycopg
import psycopg_pool
from pgvector.psycopg.vector import register_vector_info
from psycopg.types import TypeInfo

from clawvm.core.entities import entities
from clawvm.core.errors import (
    ConfigError,
    ConflictError,
    DimensionError,
    SchemaError,
    StoreError,
    ValidationError,
)
from clawvm.core.ids import is_valid_id
from clawvm.core.lexical import Analyzer, BM25Params
from clawvm.core.model import MAX_COUNT, Filters, LinkType, Memory, Status
from clawvm.core.vectors import normalize
from clawvm.store import postgres_rows as pgrows
from clawvm.store.base import (
    Claim,
    Credential,
    Edge,
    Event,
    GroupKey,
    PageKey,
    PinBudget,
    Query,
    QueryResult,
    Requirement,
    Store,
    Unembedded,
    check_credential_version,
    check_removable,
    check_requirements,
    check_stored,
    check_stored_vectors,
    check_versions,
    claimed,
    credential_json,
    credentials_page_sql,
    leading_vectors,
)
from clawvm.store.memory import from_stored
from clawvm.store.postgres_events import Listener, PgEventLog
from clawvm.store.postgres_schema import DATA_MIGRATIONS, MIGRATIONS, PUT_CREDENTIAL
from clawvm.store.postgres_search import Searcher, compile_filters, esc, term_key, unesc, valid_ids
from clawvm.store.postgres_url import (
    DEFAULT_POOL_SIZE,
    SCHEMA_NAME,
    HnswParams,
    parse_url,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_MIGRATION_LOCK = 0x636C6177  # advisory lock key for migrations ("claw"), database-wide
_PIN_LOCK = 0x636C617A  # advisory lock class: the writes of one session's pins (see PostgresStore._require)
#: Seconds a pooled connection may sit unused before it is checked as it is handed out (a restart of the
#: database, or a connection killed on the server, leaves idle ones dead)
IDLE_CHECK_S = 2.0
#: How long a search with read_your_writes waits for the replica before the primary answers it
READ_YOUR_WRITES_WAIT_S = 5.0

#: libpq's option that every connection of the engine starts with: its statements and transactions are
#: written for READ COMMITTED (a statement after an advisory lock sees what the lock's holder committed;
#: a row locked or updated after a concurrent update is re-read, not refused), so a stricter
#: ``default_transaction_isolation`` of the server, database or role (or the URL's own options=) is
#: overridden for its sessions. Under REPEATABLE READ the snapshot taken at the lock missed those commits:
#: concurrent opens failed, pins overflowed their budget and event readers skipped late commits.
ISOLATION_OPTION = r"-c default_transaction_isolation=read\ committed"

_REPLICA_POLL_S = 0.002  # how often a read-your-writes search checks the replica's replay
_AGENTS_TTL_S = 2.0  # how soon recall sees an agent another process added (Store.agents)
_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


@contextmanager
def _translated(action: str) -> Iterator[None]:
    try:
        yield
    except psycopg.errors.UndefinedTable as exc:
        raise SchemaError(
            f"postgres {action} failed: {exc} (was the schema dropped under a running store?)"
        ) from exc
    except psycopg_pool.PoolTimeout as exc:  # before psycopg.Error, which it is (it was never reached)
        raise StoreError(
            f"postgres {action} failed: no connection available ({exc}): every pooled connection is busy "
            "or the database does not answer; raise pool_size in the URL, or check the database"
        ) from exc
    except psycopg.Error as exc:
        raise StoreError(f"postgres {action} failed: {exc}") from exc


class PostgresStore(Store):
    schemes = ("postgresql", "postgres")

    def __init__(
        self,
        url: str,
        dim: int = 384,
        *,
        schema: str | None = None,
        pool_size: int | None = None,
        statement_timeout_ms: int | None = None,
        hnsw_m: int | None = None,
        hnsw_ef_construction: int | None = None,
        analyzer: Analyzer | None = None,
        params: BM25Params | None = None,
    ) -> None:
        super().__init__()
        parsed = parse_url(url)
        self.conninfo = parsed.conninfo
        self.schema = schema or parsed.schema
        if not SCHEMA_NAME.match(self.schema):
            raise ConfigError(f"schema {self.schema!r} is not a plain lower-case SQL name")
        self.dim = dim
        # keyword arguments (the CLI's options) win over the URL's parameters, which win over defaults
        self.pool_size = pool_size or parsed.pool_size or DEFAULT_POOL_SIZE
        self.statement_timeout_ms = statement_timeout_ms or parsed.statement_timeout_ms
        self.hnsw = HnswParams(
            m=hnsw_m or parsed.hnsw_m or HnswParams.m,
            ef_construction=hnsw_ef_construction or parsed.hnsw_ef_construction or HnswParams.ef_construction,
        )
        # libpq's own settings for every connection: the URL's options=, else PGOPTIONS (ours are added to
        # them, not put in their place)
        self._libpq_options = parsed.libpq_options or os.environ.get("PGOPTIONS", "")
        # read scale-out: searches (Store.query) on a hot standby, everything else on the primary
        self.replica = parse_url(parsed.replica).conninfo if parsed.replica else None
        self.read_your_writes = parsed.read_your_writes
        self.prepared = parsed.prepared
        self._replica_pool: psycopg_pool.ConnectionPool | None = None
        self._written_lsn: str | None = None  # WAL position after this process's last write (replica only)
        self._lagged_at: str | None = None  # the last write the replica failed to replay in time
        self._said_not_a_standby = False
        self.analyzer = analyzer or Analyzer()
        self.params = params or BM25Params()
        self._search = Searcher(self.analyzer, self.params, dim)
        self._pool: psycopg_pool.ConnectionPool | None = None
        # connection -> when it last went back to its pool (weak: a closed connection drops out)
        self._last_used: weakref.WeakKeyDictionary[psycopg.Connection[Any], float]
        self._last_used = weakref.WeakKeyDictionary()
        self._vector_info: TypeInfo | None = None
        self._listener: Listener | None = None
        # Store.agents per tenant set: (monotonic expiry, names); dropped on our own writes, so only other
        # processes' new agents wait for the expiry
        self._agents: dict[frozenset[str] | None, tuple[float, frozenset[str]]] = {}
        self.event_log = PgEventLog(self.schema)

    # ---- lifecycle ----------------------------------------------------------------------------------
    def setup(self) -> None:
        with self._lock:
            if self._pool is not None:
                return
            with _translated("open"):
                pinned = " ".join(o for o in (self._libpq_options, ISOLATION_OPTION) if o)
                with psycopg.connect(self.conninfo, autocommit=True, options=pinned) as conn:
                    ext_schema = self._migrate(conn)
                    conn.execute(f"SET search_path TO {self.schema}, {ext_schema}")
                    self._vector_info = TypeInfo.fetch(conn, "vector")
                options = " ".join(
                    o
                    for o in (
                        pinned,
                        f"-c search_path={self.schema},{ext_schema} -c TimeZone=UTC",
                        f"-c statement_timeout={self.statement_timeout_ms}"
                        if self.statement_timeout_ms
                        else "",
                    )
                    if o
                )
                pool, replica = self._open_pool(self.conninfo, options), None
                if self.replica is not None:
                    replica = self._open_pool(self.replica, options)
            self._pool, self._replica_pool = pool, replica

    def _open_pool(self, conninfo: str, options: str) -> psycopg_pool.ConnectionPool:
        pool = psycopg_pool.ConnectionPool(
            conninfo,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            num_workers=1,
            # prepare_threshold None: never prepare server-side (PgBouncer transaction pooling before 1.21)
            kwargs={
                "autocommit": True,
                "options": options,
                "prepare_threshold": 5 if self.prepared else None,
            },
            configure=self._configure,
            check=self._check_idle,
            name=f"clawvm-{self.schema}",
        )
        pool.open(wait=True, timeout=30)
        return pool

    @contextmanager
    def _pooled(self, pool: psycopg_pool.ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
        """A connection of ``pool``, its last use noted as it goes back (see :meth:`_check_idle`). Noted
        here, in the caller's thread: a pool ``reset`` callback would hand every return to the pool's one
        worker thread (a single caller's calls fell from ~30k to ~13k a second)."""
        with pool.connection() as conn:
            try:
                yield conn
            finally:
                self._last_used[conn] = time.monotonic()

    def _check_idle(self, conn: psycopg.Connection[Any]) -> None:
        """Pool callback as a connection is handed out: one idle for ``IDLE_CHECK_S`` is asked a no-op
        first (a broken one raises, and the pool hands out a new one). After a database restart every
        pooled connection was dead, and each failed one call (8 of 12 calls after a restart); a ping on
        every call would cost a round trip each, so a connection in steady use goes unchecked."""
        if time.monotonic() - self._last_used.get(conn, 0.0) > IDLE_CHECK_S:
            psycopg_pool.ConnectionPool.check_connection(conn)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        assert self._vector_info is not None
        register_vector_info(conn, self._vector_info)

    def _migrate(self, conn: psycopg.Connection[Any]) -> str:
        """Create the extension and schema, apply pending migrations; returns pgvector's schema."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
            if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
                try:
                    with conn.transaction():
                        conn.execute("CREATE EXTENSION vector")
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise SchemaError(
                        "the pgvector extension is not installed in this database and this role may not "
                        f"install it ({exc}): run CREATE EXTENSION vector as a superuser once"
                    ) from exc
            row = conn.execute(
                "SELECT extnamespace::regnamespace::text, extversion FROM pg_extension"
                " WHERE extname = 'vector'"
            ).fetchone()
            assert row is not None
            ext_schema, version = str(row[0]), str(row[1])
            if tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < (0, 8):
                raise SchemaError(
                    f"pgvector {version} is too old: ClawVM needs 0.8 or newer (iterative scans)"
                )
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            conn.execute(f"SET LOCAL search_path TO {self.schema}, {ext_schema}")
            applied, dim = 0, self.dim
            # this schema's meta, not one found further along the search path: with pgvector's schema
            # there (public, often), a store in public made every new schema read and write its tables
            if self._store_in(conn, self.schema):
                stored = dict(conn.execute("SELECT key, value FROM meta").fetchall())
                applied, dim = int(stored.get("version", 0)), int(stored.get("dim", self.dim))
            elif self._store_in(conn, ext_schema):
                log.warning(
                    "%s is new, and a store is in pgvector's schema %s: earlier versions opened a new schema"
                    " on that store's tables, so an application that used %s before holds its data in %s"
                    " (copy it with clawvm migrate --from '...&schema=%s' --to '...&schema=%s')",
                    self._named, ext_schema, self.schema, ext_schema, ext_schema, self.schema,
                )  # fmt: skip
            if applied > len(MIGRATIONS):
                raise SchemaError(
                    f"database schema version {applied} is newer than this ClawVM knows ({len(MIGRATIONS)}): "
                    "upgrade clawvm"
                )
            if dim != self.dim:
                raise DimensionError(f"schema {self.schema!r}", dim, self.dim)
            if applied and "claim" in stored:  # a job holds it (a migration into it unfinished): a part only
                raise claimed(Claim.from_json(stored["claim"]), self._named, self._drop_hint)
            for number in range(applied, len(MIGRATIONS)):
                conn.execute(MIGRATIONS[number].replace("{dim}", str(self.dim)))
                if number in DATA_MIGRATIONS:
                    DATA_MIGRATIONS[number](conn, self.analyzer)
            if applied == 0 and self.hnsw != HnswParams():  # a new schema: its graph as asked for
                conn.execute("DROP INDEX vectors_embedding")
                conn.execute(self.hnsw.sql())
            if applied < len(MIGRATIONS):  # an open of a schema up to date writes nothing
                conn.execute(
                    "INSERT INTO meta VALUES ('version', %s), ('dim', %s) ON CONFLICT (key) DO UPDATE"
                    " SET value = excluded.value",
                    [str(len(MIGRATIONS)), str(self.dim)],
                )
        return ext_schema

    def exists(self) -> bool:
        """Whether this URL's schema holds a store, asked on a connection of its own (the pool is opened
        by :meth:`setup`, which makes the schema): a mistyped schema name is not made by asking."""
        with _translated("exists"), psycopg.connect(self.conninfo, autocommit=True) as conn:
            return self._store_in(conn, self.schema)

    @staticmethod
    def _store_in(conn: psycopg.Connection[Any], schema: str) -> bool:
        """Whether ``schema`` holds a store (its own ``meta``, not one further along the search path)."""
        found = conn.execute("SELECT to_regclass(format('%%I.meta', %s::text))", [schema]).fetchone()
        return found is not None and found[0] is not None

    @property
    def _named(self) -> str:
        return f"the PostgreSQL schema {self.schema}"

    @property
    def _drop_hint(self) -> str:
        return f"drop it (DROP SCHEMA {self.schema} CASCADE)"

    def close(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            pool, self._pool = self._pool, None
            replica, self._replica_pool = self._replica_pool, None
        if listener is not None:
            listener.stop()
        for p in (pool, replica):
            if p is not None:
                p.close()

    @contextmanager
    def _conn(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit; wrap several statements in ``conn.transaction()``)."""
        if self._pool is None:
            self.setup()
        pool = self._pool
        if pool is None:
            raise StoreError(f"postgres {action} failed: the store is closed")
        with _translated(action), self._pooled(pool) as conn:
            yield conn

    @contextmanager
    def _replica_conn(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        """A connection to the replica when there is one (after waiting for our last write when the URL
        asks for read-your-writes), else to the primary."""
        if self._pool is None:
            self.setup()
        pool = self._replica_pool
        if pool is None:
            with self._conn(action) as conn:
                yield conn
            return
        if self.read_your_writes and not self._replica_has_our_writes():
            # the replica has not replayed our last write in time: the primary answers (the reader asked
            # to see its writes, and a replica behind answered without them, silently)
            with self._conn(action) as conn:
                yield conn
            return
        with _translated(action), self._pooled(pool) as conn:
            yield conn

    def _replica_has_our_writes(self) -> bool:
        """Whether the replica has replayed this process's last write: waited for up to
        ``READ_YOUR_WRITES_WAIT_S``, unless it already failed to reach that same write in time, in which
        case it is asked once, without waiting (under a lasting lag every search waited the full time
        before the primary answered it)."""
        lagged = self._written_lsn is not None and self._written_lsn == self._lagged_at
        if self.wait_for_replica(0.0 if lagged else READ_YOUR_WRITES_WAIT_S):
            return True
        self._lagged_at = self._written_lsn
        return False

    def wait_for_replica(self, timeout_s: float = 5.0) -> bool:
        """Wait until the replica has replayed this process's last write (read-your-writes on request);
        False when ``timeout_s`` passed first (reads may then miss it), or at once when the replica replays
        no WAL (not a streaming standby). True at once without a replica."""
        lsn, pool = self._written_lsn, self._replica_pool
        if lsn is None or pool is None:
            return True
        deadline = time.monotonic() + timeout_s
        with _translated("wait_for_replica"), self._pooled(pool) as conn:
            while True:
                row = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]).fetchone()
                if row is not None and row[0]:
                    return True
                if row is None or row[0] is None:  # it replays no WAL (not a standby): no wait will do
                    self._warn_not_a_standby()
                    return False
                if time.monotonic() >= deadline:
                    return False
                time.sleep(_REPLICA_POLL_S)

    def _warn_not_a_standby(self) -> None:
        if not self._said_not_a_standby:
            self._said_not_a_standby = True
            log.warning(
                "the replica of %s replays no WAL (not a streaming standby): read_your_writes cannot tell"
                " when it has a write, so the primary answers the searches after one",
                self._named,
            )

    def _write(self, action: str, body: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``body`` in one transaction, retrying it when PostgreSQL aborted it for a deadlock."""
        for attempt in range(5):
            try:
                with self._conn(action) as conn:
                    with conn.transaction():
                        out = body(conn)
                    if self._replica_pool is not None:  # where a replica must have got to for us to read it
                        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
                        self._written_lsn = str(row[0]) if row else None
                    return out
            except StoreError as exc:
                if not isinstance(exc.__cause__, _RETRYABLE) or attempt == 4:
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    # ---- writes -------------------------------------------------------------------------------------
    def put_many(self, memories: Sequence[Memory], *, imported: Collection[str] = ()) -> None:
        if not memories:
            return
        check_versions(memories, {})  # duplicate ids, before touching the database
        rows = [pgrows.prepare(m) for m in memories]
        self._write("put", lambda conn: self._put(conn, rows, imported=imported))

    def _put(
        self,
        conn: psycopg.Connection[Any],
        rows: list[pgrows.MemoryRow],
        events: Sequence[Event] = (),
        imported: Collection[str] = (),
    ) -> list[tuple[int, int]]:
        """Write ``rows`` (and append ``events``, in the same round trip as the rows' statements); returns
        the events' numbers as :meth:`PgEventLog.append` does (``imported``: see :func:`check_stored`)."""
        ids = [r.memory.id for r in rows]
        tenants = sorted({esc(r.memory.tenant) or "" for r in rows})
        self.event_log.number_tenants(conn, events)  # before the pipeline: it waits
        # the stored rows are locked through their tenants (a lock on one shard when the table is
        # distributed by tenant); an id stored under another tenant (a memory moving, which the harness
        # never does) is looked up in the same round trip and locked after
        with conn.pipeline():
            own = conn.execute(
                pgrows.STORED + " WHERE tenant = ANY(%s::text[]) AND id = ANY(%s::uuid[])" + pgrows.LOCKED,
                [tenants, ids],
            )
            other = conn.execute(
                "SELECT tenant, id FROM memories WHERE id = ANY(%s::uuid[]) AND tenant <> ALL(%s::text[])",
                [ids, tenants],
            )
        found = own.fetchall()
        moving = other.fetchall()
        if moving:
            found += conn.execute(
                pgrows.STORED
                + " WHERE (tenant, id) IN (SELECT * FROM unnest(%s::text[], %s::uuid[]))"
                + pgrows.LOCKED,
                [list(col) for col in zip(*moving, strict=True)],
            ).fetchall()
        stored = {
            str(i): pgrows.StoredRow(
                int(seq), int(v), int(th), bytes(ch), int(dl), bool(sess), str(tenant), bool(emb), a
            )
            for i, seq, v, th, ch, dl, sess, tenant, emb, a in found
        }
        written, versions = [r.memory for r in rows], {i: s.version for i, s in stored.items()}
        check_versions(written, versions)
        check_stored(written, versions, imported)
        fresh = [r for r in rows if r.memory.id not in stored]
        updated = [r for r in rows if r.memory.id in stored]
        # the author names recall strips (Store.agents) change only with a new or re-assigned author: a
        # bookkeeping write keeps the cached names
        if any(r.memory.agent_id is not None for r in fresh) or any(
            (esc(r.memory.tenant), esc(r.memory.agent_id))
            != (stored[r.memory.id].tenant, stored[r.memory.id].agent)
            for r in updated
        ):
            self._agents.clear()
        # a new text, or a memory moved to another tenant (its postings and entities carry the tenant)
        reindex = [
            r
            for r in rows
            if r.memory.id not in stored
            or stored[r.memory.id].text_hash != r.text_hash
            or stored[r.memory.id].tenant != esc(r.memory.tenant)
        ]
        for r in reindex:
            r.terms = Counter(term_key(t) for t in self.analyzer.terms(r.text))
            r.entities = sorted({term_key(e) for e in entities(r.text)})
        per_tenant = pgrows.TenantStats()
        for r in rows:
            old = stored.get(r.memory.id)
            # unchanged text keeps its stored postings and length
            r.doc_len = sum(r.terms.values()) if r.terms is not None else (old.doc_len if old else 0)
            if old is not None:
                per_tenant.add(old.tenant, -1, -old.doc_len, -int(old.sessioned))
            per_tenant.add(esc(r.memory.tenant) or "", 1, r.doc_len, int(r.memory.session_id is not None))
        # the stored (tenant, seq) of re-indexed memories: their old postings and entities go
        changed = [
            (stored[r.memory.id].tenant, stored[r.memory.id].seq) for r in reindex if r.memory.id in stored
        ]
        vectors = pgrows.VectorChanges.of(updated, stored)
        links = dict.fromkeys(
            (esc(r.memory.tenant) or "", r.memory.id, k.type.value, k.target)
            for r in rows
            for k in r.memory.links
        )
        agents = sorted(
            {(esc(r.memory.tenant) or "", esc(r.memory.agent_id)) for r in rows if r.memory.agent_id}
        )
        # everything below goes to the server in one round trip; errors surface when the pipeline syncs
        try:
            with conn.pipeline(), conn.cursor() as cur:
                if fresh:
                    cur.executemany(
                        pgrows.INSERT_ROW,
                        [
                            (*pgrows.columns_of(r), r.vector is not None, r.vector, r.vector is not None)
                            for r in fresh
                        ],
                    )
                if updated:
                    cur.executemany(
                        pgrows.UPDATE_ROW,
                        [
                            (*pgrows.columns_of(r)[1:], vectors.embedded[r.memory.id], r.memory.id)
                            for r in updated
                        ],
                    )
                vectors.send(cur)
                if changed:
                    for table in ("postings", "entities"):
                        cur.execute(
                            f"DELETE FROM {table} WHERE (tenant, seq) IN"
                            " (SELECT * FROM unnest(%s::text[], %s::bigint[]))",
                            [list(col) for col in zip(*changed, strict=True)],
                        )
                if reindex:
                    cur.execute(pgrows.INSERT_POSTINGS, pgrows.postings_of(reindex))
                    names = [
                        (esc(r.memory.tenant) or "", e, r.memory.id)
                        for r in reindex
                        for e in r.entities or ()
                    ]
                    if names:
                        cur.execute(pgrows.INSERT_ENTITIES, [list(col) for col in zip(*names, strict=True)])
                if updated:
                    cur.execute(
                        "DELETE FROM links WHERE source = ANY(%s::uuid[])", [[r.memory.id for r in updated]]
                    )
                if links:
                    cur.execute(
                        "INSERT INTO links (tenant, source, type, target)"
                        " SELECT * FROM unnest(%s::text[], %s::uuid[], %s::text[], %s::uuid[])",
                        [list(col) for col in zip(*links, strict=True)],
                    )
                if agents:
                    cur.execute(pgrows.ADD_AGENTS, [list(col) for col in zip(*agents, strict=True)])
                if per_tenant.changed():
                    cur.execute(pgrows.ADD_TENANT_STATS, per_tenant.arrays())
                numbered = self.event_log.send(conn, events) if events else None
            return self.event_log.numbers(numbered) if numbered is not None else []
        except psycopg.errors.UniqueViolation as exc:
            # another transaction inserted one of these new ids since we looked: this batch lost the race
            taken = re.search(r"\(id, tenant\)=\(([0-9a-f-]{36}), ", exc.diag.message_detail or "")
            raise ConflictError(taken.group(1) if taken else fresh[0].memory.id, None, None) from None

    def delete_many(self, ids: Sequence[str]) -> int:
        unique = valid_ids(ids)
        if not unique:
            return 0
        return self._write("delete", lambda conn: self._delete_rows(conn, unique))

    def remove(self, memories: Sequence[Memory], events: Sequence[Event] = ()) -> int:
        """The versions checked (the rows locked), the rows deleted and the events logged in one
        transaction."""
        ids = valid_ids([m.id for m in memories])
        if not ids:
            if events:
                self.append_events(events)
            return 0

        def remove(conn: psycopg.Connection[Any]) -> int:
            # in the order write() takes its locks (tenant sequences, then rows by id): no deadlock with it
            self.event_log.number_tenants(conn, events)
            stored = conn.execute(
                "SELECT id::text, version FROM memories WHERE id = ANY(%s::uuid[]) ORDER BY id FOR UPDATE",
                [ids],
            ).fetchall()
            check_removable(memories, {str(i): int(v) for i, v in stored})
            deleted = self._delete_rows(conn, ids)
            if events:
                # numbered above; numbering again would take a sequence this transaction made (and may
                # still roll back) for one made for good
                with conn.pipeline():
                    self.event_log.send(conn, events)
            return deleted

        return self._write("delete", remove)

    @staticmethod
    def _delete_rows(conn: psycopg.Connection[Any], unique: list[str]) -> int:
        """Delete the rows of ``unique`` and what indexes them (in the caller's transaction); returns how
        many were stored."""
        gone = conn.execute(
            "DELETE FROM memories WHERE id = ANY(%s::uuid[])"
            " RETURNING seq, doc_len, session_id IS NOT NULL, tenant",
            [unique],
        ).fetchall()
        if not gone:
            return 0
        keys = [[str(t) for _, _, _, t in gone], [int(s) for s, _, _, _ in gone]]
        for table in ("postings", "entities", "vectors"):
            conn.execute(
                f"DELETE FROM {table} WHERE (tenant, seq) IN"
                " (SELECT * FROM unnest(%s::text[], %s::bigint[]))",
                keys,
            )
        conn.execute("DELETE FROM links WHERE source = ANY(%s::uuid[])", [unique])
        per_tenant = pgrows.TenantStats()
        for _, d, x, tenant in gone:
            per_tenant.add(str(tenant), -1, -int(d), -int(bool(x)))
        conn.execute(pgrows.ADD_TENANT_STATS, per_tenant.arrays())
        return len(gone)

    def set_vectors(
        self, ids: Sequence[str], vectors: np.ndarray, contents: Sequence[str] | None = None
    ) -> None:
        vecs = normalize(check_stored_vectors(len(ids), vectors, self.dim))
        if any(is_valid_id(i) for i in ids):
            self._write("set_vectors", lambda conn: self._set_vectors(conn, ids, vecs, contents))

    @staticmethod
    def _set_vectors(
        conn: psycopg.Connection[Any], ids: Sequence[str], vecs: np.ndarray, contents: Sequence[str] | None
    ) -> None:
        keep = [n for n, i in enumerate(ids) if is_valid_id(i)]
        args: list[tuple[Any, ...]]
        if contents is None:
            sql = pgrows.SET_VECTOR.format(only="", conflict=pgrows.REPLACE_VECTOR)
            args = [(ids[n], vecs[n]) for n in keep]
        else:  # only a row still without a vector and with the text the vector was computed from
            sql = pgrows.SET_VECTOR.format(only=" AND NOT embedded AND content_hash = %s", conflict="NOTHING")
            args = [(ids[n], pgrows.content_hash(contents[n]), vecs[n]) for n in keep]
        with conn.cursor() as cur:
            cur.executemany(sql, args)

    def write(
        self,
        memories: Sequence[Memory],
        vectors: np.ndarray | None = None,
        events: Sequence[Event] = (),
        *,
        imported: Collection[str] = (),
        requires: Sequence[Requirement] = (),
        tenant_numbers: bool = False,
    ) -> list[int]:
        """Memories, their vectors and their events in one transaction (one commit per record), written only
        if the preconditions of ``requires`` hold: they are evaluated first in that transaction (see
        :meth:`_require`)."""
        if not memories:
            return self.append_events(events, tenant_numbers=tenant_numbers) if events else []
        check_versions(memories, {})
        rows = [pgrows.prepare(m) for m in memories]
        if vectors is not None:
            _, vecs = leading_vectors(memories, vectors, self.dim)
            for r, v in zip(rows, normalize(vecs), strict=False):
                r.vector = v

        def body(conn: psycopg.Connection[Any]) -> list[tuple[int, int]]:
            self._require(conn, requires, memories)
            return self._put(conn, rows, events, imported)

        return [n if tenant_numbers else s for s, n in self._write("write", body)]

    def _require(
        self, conn: psycopg.Connection[Any], requires: Sequence[Requirement], memories: Sequence[Memory]
    ) -> None:
        """Evaluate ``requires`` in ``conn``'s transaction, before the write. Each budget's session is locked
        first (a transaction-scoped advisory lock on its schema, tenant and session, taken in one order so
        that two writers never wait on each other's): the writers of one session's pins follow one another,
        and each statement after the lock (read committed) sees every pin committed before it was granted."""
        for key in sorted({_pin_lock_key(self.schema, budget) for budget in requires}):
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_PIN_LOCK, key])
        check_requirements(requires, memories, lambda budget: _pins_in(conn, budget))

    # ---- reads --------------------------------------------------------------------------------------
    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        valid = valid_ids(ids)
        if not valid:
            return {}
        with self._conn("get") as conn:
            rows = conn.execute("SELECT body FROM memories WHERE id = ANY(%s::uuid[])", [valid]).fetchall()
        out = {}
        for (body,) in rows:
            m = from_stored(body)
            out[m.id] = m
        return out

    def tenants_of(self, ids: Sequence[str]) -> dict[str, str]:
        valid = valid_ids(ids)
        if not valid:
            return {}
        with self._conn("get") as conn:
            rows = conn.execute(
                "SELECT id::text, tenant FROM memories WHERE id = ANY(%s::uuid[])", [valid]
            ).fetchall()
        return {str(i): str(t) for i, t in rows}

    def query(self, query: Query) -> QueryResult:
        """On the replica when the URL names one: searches are untracked reads (a tracked recall's
        bookkeeping is written through put_many, to the primary)."""
        with self._replica_conn("query") as conn:
            return self._search.run(conn, query)

    def agents(self, filters: Filters) -> frozenset[str]:
        key = filters.tenant
        cached = self._agents.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        tenants = "TRUE" if key is None else "a.tenant = ANY(%s::text[])"
        args = [] if key is None else [sorted(esc(t) or "" for t in key)]
        with self._conn("agents") as conn:  # the known names that still have a memory: one probe each
            rows = conn.execute(
                f"""SELECT DISTINCT a.agent_id FROM agents a WHERE {tenants} AND EXISTS (
                        SELECT 1 FROM memories m WHERE m.tenant = a.tenant AND m.agent_id = a.agent_id)""",
                args,
            ).fetchall()
        names = frozenset(str(unesc(r[0])) for r in rows)
        self._agents[key] = (time.monotonic() + _AGENTS_TTL_S, names)
        return names

    def count(self, filters: Filters | None = None) -> int:
        f = filters or Filters()
        with self._conn("count") as conn:
            if f == Filters():  # every memory: the counters, not a scan
                row = conn.execute("SELECT coalesce(sum(docs), 0) FROM tenant_lexstats").fetchone()
            else:
                where, args = compile_filters(f)
                row = conn.execute(f"SELECT count(*) FROM memories m WHERE {where}", args).fetchone()
        return int(row[0]) if row else 0

    def group_counts(
        self, filters: Filters | None = None, expired_at: datetime | None = None
    ) -> dict[GroupKey, int]:
        """One grouped count: one statement reads one snapshot, so the groups agree with each other."""
        where, args = compile_filters(filters or Filters())
        status = "m.status"
        if expired_at is not None:  # due counts as expired, as reads show it
            status = "CASE WHEN m.status = %s AND m.expires_at <= %s THEN %s ELSE m.status END"
            args = [Status.ACTIVE.value, expired_at, Status.EXPIRED.value, *args]
        sql = f"SELECT m.kind, {status}, m.tier, count(*) FROM memories m WHERE {where} GROUP BY 1, 2, 3"
        with self._conn("count") as conn:
            rows = conn.execute(sql, args).fetchall()
        return {GroupKey(unesc(k) or "", unesc(s) or "", unesc(t) or ""): int(n) for k, s, t, n in rows}

    def page(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> list[Memory]:
        """A keyset page in (created_at, id) order: an index range scan from ``after``, never an OFFSET."""
        return [from_stored(body) for body in self._page_bodies(filters, after, limit, newest_first)]

    def page_json(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> list[dict[str, Any]]:
        return [json.loads(body) for body in self._page_bodies(filters, after, limit, newest_first)]

    def _page_bodies(
        self, filters: Filters, after: PageKey | None, limit: int, newest_first: bool
    ) -> list[str]:
        if limit <= 0:
            return []
        where, args = compile_filters(filters)
        op, direction = ("<", "DESC") if newest_first else (">", "ASC")
        cond, extra = "TRUE", []
        if after is not None:
            if not is_valid_id(after.id):
                raise ValidationError("after", "names a malformed id", "pass PageKey.of(a stored memory)")
            # the first clause bounds the index range; the row comparison breaks ties at that instant
            cond = f"m.created_at {op}= %s AND (m.created_at, m.id) {op} (%s, %s::uuid)"
            extra = [after.created_at, after.created_at, after.id]
        with self._conn("page") as conn:
            rows = conn.execute(
                f"""SELECT m.body FROM memories m WHERE {where} AND {cond}
                    ORDER BY m.created_at {direction}, m.id {direction} LIMIT %s""",
                [*args, *extra, min(limit, MAX_COUNT)],
            ).fetchall()
        return [str(body) for (body,) in rows]

    def session_ids(self, filters: Filters, after: str | None = None, limit: int = 500) -> list[str]:
        where, args = compile_filters(filters)
        cond, extra = ("TRUE", []) if after is None else ('m.session_id COLLATE "C" > %s', [esc(after)])
        with self._conn("session_ids") as conn:
            rows = conn.execute(
                f"""SELECT DISTINCT m.session_id COLLATE "C" AS s FROM memories m
                    WHERE {where} AND m.session_id IS NOT NULL AND {cond} ORDER BY s LIMIT %s""",
                [*args, *extra, min(max(0, limit), MAX_COUNT)],
            ).fetchall()
        return [str(unesc(r[0])) for r in rows]

    def tag_names(
        self, filters: Filters, prefix: str = "", after: str | None = None, limit: int = 500
    ) -> list[str]:
        """Reads the tag arrays of the matching rows in SQL (a GIN index cannot list its keys): only the
        page reaches Python, but the cost grows with the rows ``filters`` selects."""
        where, args = compile_filters(filters)
        cond, extra = ("TRUE", []) if after is None else ('t COLLATE "C" > %s', [esc(after)])
        with self._conn("tag_names") as conn:
            rows = conn.execute(
                f"""SELECT DISTINCT t COLLATE "C" AS name
                    FROM memories m CROSS JOIN LATERAL unnest(m.tags) AS t
                    WHERE {where} AND starts_with(t, %s) AND {cond} ORDER BY name LIMIT %s""",
                [*args, esc(prefix) or "", *extra, min(max(0, limit), MAX_COUNT)],
            ).fetchall()
        return [str(unesc(r[0])) for r in rows]

    def unembedded(self, limit: int) -> list[Unembedded]:
        with self._conn("unembedded") as conn:
            rows = conn.execute(
                "SELECT id, body FROM memories WHERE NOT embedded ORDER BY seq LIMIT %s", [limit]
            ).fetchall()
        return [Unembedded(str(i), json.loads(body)["content"]) for i, body in rows]

    def vectors_of(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        valid = valid_ids(ids)
        if not valid:
            return {}
        with self._conn("vectors") as conn:
            rows = conn.execute(
                "SELECT m.id, v.embedding FROM memories m"
                " JOIN vectors v ON v.tenant = m.tenant AND v.seq = m.seq WHERE m.id = ANY(%s::uuid[])",
                [valid],
            ).fetchall()
        return {str(i): v.to_numpy().astype(np.float32) for i, v in rows}

    def edges(self, ids: Sequence[str]) -> list[Edge]:
        valid = valid_ids(ids)
        if not valid:
            return []
        with self._conn("edges") as conn:
            rows = conn.execute(
                "SELECT source, type, target FROM links"
                " WHERE source = ANY(%s::uuid[]) OR target = ANY(%s::uuid[])"
                " ORDER BY source, type, target",
                [valid, valid],
            ).fetchall()
        return [Edge(str(s), LinkType(t), str(d)) for s, t, d in rows]

    # ---- events (clawvm.store.postgres_events) -------------------------------------------------------
    def append_events(self, events: Sequence[Event], *, tenant_numbers: bool = False) -> list[int]:
        if not events:
            return []
        numbered = self._write("append_events", lambda conn: self.event_log.append(conn, events))
        return [n if tenant_numbers else s for s, n in numbered]

    def import_events(self, events: Sequence[Event], tenant_numbers: Sequence[int] | None = None) -> None:
        def insert(conn: psycopg.Connection[Any]) -> None:
            self.event_log.insert_imported(conn, events, tenant_numbers)

        if events:
            self._write("import_events", insert)

    def delete_events_upto(self, seq: int) -> int:
        return self._write("delete_events", lambda conn: self.event_log.delete_upto(conn, seq))

    def read_events(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        memory_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Event]:
        with self._conn("read_events") as conn:
            return self.event_log.read(conn, after_seq, limit, memory_id, tenant)

    # ---- credentials: a table of their own, which event retention never touches ---------------------
    def put_credential(self, credential: Credential) -> None:
        c = credential
        row = [c.tenant, c.kind, c.name, c.version, credential_json(c)]
        with self._conn("put_credential") as conn:
            if conn.execute(PUT_CREDENTIAL, row).fetchall():  # one statement: atomic on its own
                return
            stored = conn.execute(
                "SELECT version FROM credentials WHERE tenant = %s AND kind = %s AND name = %s", row[:3]
            ).fetchone()
        check_credential_version(credential, None if stored is None else int(stored[0]))
        raise AssertionError("the upsert refused a credential the version rule accepts")  # pragma: no cover

    # ---- the claim: one row of meta, taken by one statement (atomic across sessions) -----------------
    def claim(self, claim: Claim) -> None:
        while True:
            with self._conn("claim") as conn:
                taken = conn.execute(
                    "INSERT INTO meta VALUES ('claim', %s) ON CONFLICT (key) DO NOTHING RETURNING key",
                    [claim.to_json()],
                ).fetchone()
            if taken is not None:
                return
            held = self.held_claim()
            if held is not None:  # else released in between: try again
                raise claimed(held, self._named, self._drop_hint)

    def held_claim(self) -> Claim | None:
        with self._conn("held_claim") as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'claim'").fetchone()
        return None if row is None else Claim.from_json(row[0])

    def release(self, claim: Claim) -> None:
        with self._conn("release") as conn:
            conn.execute("DELETE FROM meta WHERE key = 'claim' AND value = %s", [claim.to_json()])

    def find_credentials(self, kind: str, name: str) -> list[Credential]:
        if "\x00" in kind + name:  # no stored key holds NUL (credential_json refuses it); libpq would fail
            return []
        with self._conn("find_credentials") as conn:
            rows = conn.execute(
                "SELECT tenant, kind, name, version, data FROM credentials WHERE kind = %s AND name = %s"
                " ORDER BY tenant",
                [kind, name],
            ).fetchall()
        return [Credential(t, k, n, d, int(v)) for t, k, n, v, d in rows]

    def list_credentials(
        self,
        kind: str | None = None,
        tenant: str | None = None,
        after: Credential | None = None,
        limit: int = 1000,
    ) -> list[Credential]:
        if "\x00" in (kind or "") + (tenant or ""):  # as in find_credentials
            return []
        sql, args = credentials_page_sql(kind, tenant, after, limit, "%s")
        with self._conn("list_credentials") as conn:
            rows = conn.execute(sql, args).fetchall()
        return [Credential(t, k, n, d, int(v)) for t, k, n, v, d in rows]

    def subscribe(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(seq)`` whenever any process appends events to this store's schema (``seq``: the
        newest of the batch; read them with :meth:`read_events`). Runs on a listener thread with its own
        connection (``LISTEN``). Returns a function that unsubscribes."""
        with self._lock:
            if self._listener is None:
                self._listener = Listener(self.conninfo, self.schema)
            listener = self._listener
        return listener.add(callback)

    # ---- bulk loads ---------------------------------------------------------------------------------
    def drop_vector_index(self) -> None:
        """Drop the HNSW index before loading many vectors: one build afterwards (:meth:`build_vector_index`)
        is far cheaper than maintaining the graph row by row. Dense search stays exact meanwhile."""
        with self._conn("drop_vector_index") as conn:
            conn.execute("DROP INDEX IF EXISTS vectors_embedding")

    def build_vector_index(self, memory_mb: int = 1024, workers: int = 2) -> float:
        """(Re)build the HNSW index with this store's :class:`HnswParams`; returns the seconds it took.
        ``memory_mb``: maintenance memory (the build is much slower once the graph outgrows it);
        ``workers``: parallel build workers. No statement timeout applies to the build."""
        with self._conn("build_vector_index") as conn, conn.transaction():
            conn.execute(
                "SELECT set_config('maintenance_work_mem', %s, true),"
                " set_config('max_parallel_maintenance_workers', %s, true),"
                " set_config('statement_timeout', '0', true)",
                [f"{int(memory_mb)}MB", str(int(workers))],
            )
            started = time.perf_counter()
            conn.execute("DROP INDEX IF EXISTS vectors_embedding")
            conn.execute(self.hnsw.sql())
            took = time.perf_counter() - started
        with self._conn("analyze") as conn:
            conn.execute("ANALYZE memories")
            conn.execute("ANALYZE vectors")
            conn.execute("ANALYZE postings")
        return took

    def vector_index_params(self) -> HnswParams | None:
        """The parameters the stored HNSW index was built with (None when there is none)."""
        with self._conn("vector_index_params") as conn:
            row = conn.execute(
                "SELECT c.reloptions FROM pg_class c WHERE c.oid = to_regclass('vectors_embedding')"
            ).fetchone()
        if row is None:
            return None
        opts = dict(o.split("=", 1) for o in row[0] or [])
        return HnswParams(
            m=int(opts.get("m", HnswParams.m)),
            ef_construction=int(opts.get("ef_construction", HnswParams.ef_construction)),
        )

    # ---- for tests and inspection -------------------------------------------------------------------
    @property
    def index(self) -> EntityGraphView:
        """The write-time entity graph, read from the tables (``SearchIndex`` offers the same methods)."""
        return EntityGraphView(self)


class EntityGraphView:
    """Read-only view of the ``entities`` table with the lookups :class:`SearchIndex` offers."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def entities_of(self, memory_id: str) -> tuple[str, ...]:
        if not is_valid_id(memory_id):
            return ()
        with self._store._conn("entities") as conn:
            rows = conn.execute(
                "SELECT e.entity FROM entities e JOIN memories m ON m.tenant = e.tenant AND m.seq = e.seq"
                " WHERE m.id = %s ORDER BY 1",
                [memory_id],
            ).fetchall()
        return tuple(str(r[0]) for r in rows)

    def linked(self, entity: str) -> set[str]:
        with self._store._conn("entities") as conn:
            rows = conn.execute(
                "SELECT m.id FROM entities e JOIN memories m ON m.tenant = e.tenant AND m.seq = e.seq"
                " WHERE e.entity = %s",
                [term_key(entity)],
            ).fetchall()
        return {str(r[0]) for r in rows}

    def _all(self) -> list[tuple[str, str]]:
        with self._store._conn("entities") as conn:
            rows = conn.execute(
                "SELECT e.entity, m.id FROM entities e"
                " JOIN memories m ON m.tenant = e.tenant AND m.seq = e.seq"
            ).fetchall()
        return [(str(e), str(i)) for e, i in rows]

    @property
    def _entities(self) -> dict[str, set[str]]:
        """Entity -> memory ids (named as in SearchIndex, so graph tests read both engines alike)."""
        out: dict[str, set[str]] = {}
        for e, i in self._all():
            out.setdefault(e, set()).add(i)
        return out

    @property
    def _row_entities(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for e, i in self._all():
            out.setdefault(i, []).append(e)
        return {i: tuple(sorted(es)) for i, es in out.items()}


def _pin_lock_key(schema: str, budget: PinBudget) -> str:
    """The text an advisory lock on ``budget``'s session hashes: schema, tenant and session (as JSON, which
    keeps them apart whatever they hold, a NUL included)."""
    return json.dumps([schema, budget.tenant, budget.session_id])


def _pins_in(conn: psycopg.Connection[Any], budget: PinBudget) -> dict[str, int]:
    """The token count of each stored member of ``budget``, read in ``conn``'s transaction."""
    where, args = compile_filters(budget.members(), "m")
    rows = conn.execute(
        f"SELECT m.id::text, (m.body::json ->> 'token_count')::bigint FROM memories m WHERE {where}", args
    ).fetchall()
    return {str(i): int(n or 0) for i, n in rows}
