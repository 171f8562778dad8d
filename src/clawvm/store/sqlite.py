"""The embedded default engine: one SQLite file (WAL) plus the in-process :class:`SearchIndex`.

The file is the source of truth; the search index is kept current by every write, and on open it is
loaded from the snapshot beside the file (:mod:`clawvm.store.snapshot`, written every ``snapshot_every``
changes and on close past a small delta) with the rows changed since replayed, or rebuilt from every row
when there is no usable snapshot. Several processes may open the same file: each write transaction bumps
a change counter (``rev``), and before every operation an engine that sees another connection committed
(``PRAGMA data_version``) replays the rows and tombstones with a newer ``rev`` into its index.

The snapshot's lifecycle (when it is read, written, checked and owed) is :mod:`.sqlite_snapshots`; sqlite3
errors are translated into :mod:`clawvm.core.errors` in :func:`.sqlite_support.translated`, the one place
that knows about the driver.
"""

from __future__ import annotations

import builtins
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from clawvm.core.errors import ConfigError, DimensionError, SchemaError
from clawvm.core.model import Filters, LinkType, Memory
from clawvm.core.vectors import normalize
from clawvm.store import forked, snapshot, sqlite_events
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
from clawvm.store.index import IndexDoc, SearchIndex, micros
from clawvm.store.keys import AUTH_TENANT, KEYS_STREAM, credentials_from_key_events
from clawvm.store.memory import from_stored
from clawvm.store.sqlite_snapshots import (
    CLOSE_DELTA_SHARE,
    SNAPSHOT_EVERY,
    SNAPSHOT_MODES,
    IndexSnapshots,
    heals,
)
from clawvm.store.sqlite_support import Checkpointer, holds_no_table, is_locked, translated

# Append-only: never edit a shipped entry, add a new one. PRAGMA user_version = number applied.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE memories (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        rev INTEGER NOT NULL,
        tenant TEXT NOT NULL,
        session_id TEXT, task_id TEXT, agent_id TEXT, tool_name TEXT,
        kind TEXT NOT NULL, state TEXT, status TEXT NOT NULL, tier TEXT NOT NULL,
        created_at TEXT NOT NULL,
        version INTEGER NOT NULL,
        body TEXT NOT NULL,
        embedding BLOB
    );
    CREATE INDEX memories_rev ON memories(rev);
    CREATE INDEX memories_scope ON memories(tenant, session_id, task_id);
    CREATE INDEX memories_unembedded ON memories(seq) WHERE embedding IS NULL;
    CREATE TABLE tombstones (id TEXT NOT NULL, rev INTEGER NOT NULL);
    CREATE INDEX tombstones_rev ON tombstones(rev);
    CREATE TABLE links (
        source TEXT NOT NULL, type TEXT NOT NULL, target TEXT NOT NULL,
        PRIMARY KEY (source, type, target)
    ) WITHOUT ROWID;
    CREATE INDEX links_target ON links(target);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL, tenant TEXT NOT NULL, kind TEXT NOT NULL, memory_id TEXT, data TEXT NOT NULL
    );
    CREATE INDEX events_memory ON events(memory_id, seq);
    CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT INTO counters VALUES ('rev', 0);
    """,
    # credentials apart from the event log (retention never reaches them); the API keys older files kept
    # as events are copied in by _DATA_MIGRATIONS[1]
    """
    CREATE TABLE credentials (
        tenant TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
        version INTEGER NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (tenant, kind, name)
    ) WITHOUT ROWID;
    CREATE INDEX credentials_name ON credentials(kind, name);
    """,
    # events numbered per tenant as well (tenant_seq; the last number of each tenant in counters, under
    # 'events:' + tenant): a tenant reads its events through this index, at a cost that follows its own
    # events, and its numbers tell nothing of other tenants' activity; _DATA_MIGRATIONS[2] numbers the
    # events already logged
    """
    ALTER TABLE events ADD COLUMN tenant_seq INTEGER;
    CREATE UNIQUE INDEX events_tenant ON events(tenant, tenant_seq);
    """,
    # facts about the file as a whole, by key: 'claim' is the job that holds it (Store.claim); IF NOT
    # EXISTS: a file set back to an earlier version, keeping its data, runs it again
    """
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
    """,
)

#: The schema version from which a file has a place for a claim (``meta``).
_CLAIMS_SINCE = 1 + next(n for n, sql in enumerate(MIGRATIONS) if "EXISTS meta" in sql)

#: The last schema version that changed what the search index is built from (the memories' rows and
#: tombstones): an index snapshot names this, not the file's version, so a migration that adds a table
#: of its own (``meta``) leaves the snapshots of a file valid (a 100k-memory file rebuilt its index for
#: ~15 s on its first open after such an upgrade). A migration that touches those rows raises it to its
#: own number; tests/test_snapshot.py fails on every new migration until its entry below says which.
INDEXED_SCHEMA = 3
#: For each migration after INDEXED_SCHEMA: why the index snapshot does not depend on it.
INDEX_NEUTRAL_MIGRATIONS = {4: "adds the meta table (claims), which the index never reads"}

# Insert a credential, or replace the stored one only when it is the next version (the compare-and-set of
# Store.put_credential, in one statement); no row comes back when the check fails.
_PUT_CREDENTIAL = """INSERT INTO credentials (tenant, kind, name, version, data) VALUES (?,?,?,?,?)
    ON CONFLICT (tenant, kind, name) DO UPDATE SET version = excluded.version, data = excluded.data
    WHERE credentials.version = excluded.version - 1
    RETURNING version"""


def _copy_key_events(conn: sqlite3.Connection) -> None:
    """Copy the API keys an older file kept only as events into the new credentials table (once: in the
    migration that creates it, in its transaction)."""
    rows = conn.execute(
        "SELECT seq, at, tenant, kind, memory_id, data FROM events WHERE memory_id = ? AND tenant = ?"
        " ORDER BY seq",
        (KEYS_STREAM, AUTH_TENANT),
    )
    events = (
        Event(kind=k, memory_id=mid, data=json.loads(d), tenant=t, at=datetime.fromisoformat(at), seq=s)
        for s, at, t, k, mid, d in rows
    )
    for c in credentials_from_key_events(events):
        conn.execute(_PUT_CREDENTIAL, (c.tenant, c.kind, c.name, c.version, credential_json(c)))


#: Python steps of a migration, run after its SQL, in the same transaction (migration number -> step).
_DATA_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _copy_key_events,
    2: sqlite_events.number_events_per_tenant,
}


def _held_claim(conn: sqlite3.Connection) -> Claim | None:
    row = conn.execute("SELECT value FROM meta WHERE key = 'claim'").fetchone()
    return None if row is None else Claim.from_json(row[0])


def _blob(v: np.ndarray) -> bytes:
    return np.asarray(v, dtype="<f4").tobytes()


#: How a stored body's JSON spells U+0000.
_ESCAPED_NUL = "\\u0000"
#: A stored content, read in SQL: SQLite's JSON functions end a text at U+0000, so a body escaping one
#: is also returned whole, to be read in Python (:func:`_content_of`; one ``?``: :data:`_ESCAPED_NUL`).
#: Compared as its prefix, such a content never matched the text the embed worker had embedded (it took
#: the row again forever), and a rewrite that cut the text at its NUL kept the old vector.
_CONTENT_COLUMNS = "json_extract(body, '$.content'), CASE WHEN instr(body, ?) > 0 THEN body END"
_MISSING = object()


def _content_of(extracted: str, with_nul: str | None) -> str:
    """The content of a row read through :data:`_CONTENT_COLUMNS`."""
    return extracted if with_nul is None else str(json.loads(with_nul)["content"])


def _link_pairs(links_json: str | None) -> set[tuple[str, str]]:
    """A stored body's links as the (type, target) pairs of its rows in ``links``."""
    return {(link["type"], link["target"]) for link in json.loads(links_json or "[]")}


_ROW_COLUMNS = (
    "id, rev, tenant, session_id, task_id, agent_id, tool_name, kind, state, status, tier, created_at,"
    " version, body, embedding"
)
_ROW_MARKS = ",".join("?" * 15)


def _row(rev: int, m: Memory, vector: np.ndarray | None) -> tuple[Any, ...]:
    """``m``'s values for :data:`_ROW_COLUMNS` (its unit ``vector``, when given, as the embedding)."""
    return (
        m.id,
        rev,
        m.tenant,
        m.session_id,
        m.task_id,
        m.agent_id,
        m.tool_name,
        m.kind.value,
        m.state.value if m.state else None,
        m.status.value,
        m.tier.value,
        m.created_at.isoformat(),
        m.version,
        m.model_dump_json(),
        None if vector is None else _blob(vector),
    )


def _refuse_foreign_file(conn: sqlite3.Connection) -> None:
    """Refuse a file that holds another application's tables (no ClawVM schema yet, but not empty): the
    first migration would add ClawVM's tables to it, even for a read-only command aimed at the wrong file.
    The schema version and the tables are read in one transaction: another process migrating the new file
    meanwhile shows both or neither (read apart, its tables at version 0 looked foreign)."""
    conn.execute("BEGIN")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] != 0:
            return
        names = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master"
                " WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
    finally:
        conn.execute("COMMIT")
    if names:
        shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
        raise SchemaError(
            f"this SQLite file is not a ClawVM store (it holds other tables: {shown}) and is left as it "
            "is: point --db at a ClawVM store or at a new file"
        )


@dataclass(frozen=True, slots=True)
class _StoredState:
    """What a write reads of a stored row: its version (the optimistic check), content and links (what
    changed)."""

    version: int
    content: str | None
    links: set[tuple[str, str]]


log = logging.getLogger("clawvm.store.sqlite")

_CHUNK = 500  # ids a statement reads rows of (SQLite's bound parameters are limited)


def _end_read(db: sqlite3.Connection) -> None:
    """End a read transaction (nothing to undo). SQLite rolls a transaction back itself on some errors (I/O,
    out of memory): a COMMIT then fails, and its error would take the place of the one that happened."""
    if db.in_transaction:
        db.execute("COMMIT")


#: ``durability`` -> SQLite's ``synchronous`` setting. ``normal`` (the default, WAL + synchronous=NORMAL): a
#: crash of the process loses nothing acknowledged; a power loss or OS crash may lose the last transactions
#: (never corrupts the file). ``full`` (synchronous=FULL): every acknowledged write survives a power loss,
#: at the cost of an fsync per commit.
DURABILITY = {"normal": "NORMAL", "full": "FULL"}


class SQLiteStore(IndexSnapshots, Store):
    schemes = ("sqlite", "file")
    indexed_schema = INDEXED_SCHEMA

    def __init__(
        self,
        path: str | Path,
        dim: int = 384,
        timeout_s: float = 30.0,
        max_wal_bytes: int = 64 * 2**20,
        durability: str = "normal",
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_mode: str = "background",
        close_delta_share: float = CLOSE_DELTA_SHARE,
    ) -> None:
        super().__init__()
        if durability not in DURABILITY:
            raise ConfigError(
                f"durability {durability!r} is unknown: use {' or '.join(DURABILITY)} "
                "(sqlite:///path?durability=full)",
                "durability",
            )
        if snapshot_mode not in SNAPSHOT_MODES:
            raise ConfigError(
                f"snapshot mode {snapshot_mode!r} is unknown: use {' or '.join(SNAPSHOT_MODES)} "
                "(sqlite:///path?snapshot=inline)",
                "snapshot",
            )
        # in the background only where the platform can fork
        self.snapshot_mode = snapshot_mode if forked.available() else "inline"
        self.durability = durability
        self.path = str(path)
        if not self.path.strip():  # SQLite's name for a temporary file, deleted on close
            raise ConfigError("the SQLite file name is empty: name a file (memories.db)", "path")
        self._snapshots = forked.BackgroundSnapshots(self.path)  # the periodic snapshot's writers
        self.dim = dim
        self.timeout_s = timeout_s
        self.max_wal_bytes = max_wal_bytes  # the log is emptied past this (see Checkpointer)
        self._conn: sqlite3.Connection | None = None
        self._index: SearchIndex | None = None
        self._rev = 0
        self._data_version = -1
        self._index_dirty = False  # set while a write transaction is changing the in-process index
        self._checkpointer: Checkpointer | None = None
        self.snapshot_every = snapshot_every  # changes (revs) between two snapshots of the index
        self.close_delta_share = close_delta_share  # see CLOSE_DELTA_SHARE
        self._snapshot_rev = 0  # the rev the newest snapshot this engine wrote or loaded is current to
        self._snapshot_owed = False  # close writes one whatever the delta (one failed, or lacks a fit)
        self.index_source = ""  # how open got its index: "snapshot", or "rows" and why (diagnostics)
        self._verifier: snapshot.Verifier | None = None  # the mapped snapshot's checksums, checked after open
        self._own_runs: list[tuple[int, int]] = []  # the revs of this engine's own writes
        self._in_call = False  # a call of the engine is running (see sqlite_snapshots.heals)
        self._failed_on_damage = False  # the running call failed on a damaged snapshot (see _run_healed)
        self._replace_snapshot = False  # a damaged snapshot was found: a sound one is written after the call

    # ---- lifecycle ----------------------------------------------------------------------------------
    def exists(self) -> bool:
        """A file at the path with at least one table (an empty file is what an open of a missing one
        made). ``:memory:`` is always there."""
        if self.path == ":memory:":
            return True
        path = Path(self.path)
        return path.exists() and not holds_no_table(path)

    def setup(self) -> None:
        with self._lock:
            if self._conn is not None:
                return
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            with translated(f"open of {self.path}", "point it at a ClawVM store, or at a new file"):
                conn = self._connect()
            self._conn = conn
            if self.path != ":memory:":
                self._checkpointer = Checkpointer(self.path, max_wal_bytes=self.max_wal_bytes)
                self._checkpointer.start()
            try:
                self._index, self._rev = self._open_index()
                self._snapshot_rev = self._rev
                # the rows changed since the snapshot (all of them without one); replayed into a damaged one,
                # they fail on it before its background check: the rows' index then, not a failed open
                self._run_healed(self._catch_up)
            except (
                BaseException
            ):  # vectors of another dimension: closed, with no snapshot of a part-built index
                self._index = None
                self.close()
                raise
            # fit the search projection now, not on the first query; one a mapped snapshot lacked is owed
            # to the next snapshot, so that later opens map it instead of fitting it again
            if self._index.vectors.prepare() and self.index_source == "snapshot":
                self._snapshot_owed = True
            if self._verifier is not None:
                self._verifier.start()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        applied = conn.execute("PRAGMA user_version").fetchone()[0]
        if applied > len(MIGRATIONS):
            raise SchemaError(
                f"database schema version {applied} is newer than this ClawVM knows ({len(MIGRATIONS)}): "
                "upgrade clawvm"
            )
        for number in range(applied, len(MIGRATIONS)):
            conn.execute("BEGIN IMMEDIATE")
            try:
                # re-check under the write lock: another process may have migrated meanwhile
                if conn.execute("PRAGMA user_version").fetchone()[0] == number:
                    for statement in MIGRATIONS[number].split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    if number in _DATA_MIGRATIONS:
                        _DATA_MIGRATIONS[number](conn)
                    conn.execute(f"PRAGMA user_version = {number + 1}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _connect(self) -> sqlite3.Connection:
        """A connection to the file, in WAL mode and migrated. A brand-new file opened by several processes
        at once can answer "database is locked" while one of them switches it to WAL (SQLite does not wait
        on that): tried again, with a growing pause, for up to ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        pause = 0.01
        while True:
            conn = sqlite3.connect(
                self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
            )
            try:
                _refuse_foreign_file(conn)  # before WAL mode, which the file's header would keep
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={DURABILITY[self.durability]}")
                conn.execute("PRAGMA foreign_keys=ON")
                self._migrate(conn)
                self._refuse_claimed(conn)
                if self.path != ":memory:":
                    conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's thread does it
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                if not is_locked(exc) or time.monotonic() + pause > deadline:
                    raise
            except BaseException:
                conn.close()
                raise
            time.sleep(pause)
            pause = min(2 * pause, 0.5)

    def _refuse_claimed(self, conn: sqlite3.Connection) -> None:
        """Refuse to open a file a job holds (a migration into it unfinished): it may hold a part only."""
        if conn.execute("PRAGMA user_version").fetchone()[0] < _CLAIMS_SINCE:
            return  # a schema from before claims (as older versions' tests build) holds none
        held = _held_claim(conn)
        if held is not None:
            raise claimed(held, f"the SQLite file {self.path}", self._drop_hint)

    @property
    def _drop_hint(self) -> str:
        return f"delete {self.path} and the files beside it named after it (-wal, -shm, .index)"

    def pragma(self, name: str) -> Any:
        """A PRAGMA's value on this store's connection (diagnostics: e.g. ``synchronous`` is 2 with
        ``durability=full``, 1 with ``normal``). Only names of letters and underscores are asked."""
        if not name.replace("_", "").isalpha():
            raise ConfigError(f"{name!r} is not a PRAGMA name")
        with self._lock, translated("pragma"):
            return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._close_snapshots(connected=self._conn is not None)
            if self._checkpointer is not None:
                self._checkpointer.stop()
                self._checkpointer = None
            if self._conn is not None:
                with translated("close"):
                    self._conn.close()
                self._conn = None
                self._index = None

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.setup()
        assert self._conn is not None
        return self._conn

    @property
    def index(self) -> SearchIndex:
        self._db  # noqa: B018 - opens on first use
        assert self._index is not None
        return self._index

    # ---- keeping the in-process index in step with the file -----------------------------------------
    def _catch_up(self) -> None:
        """Replay rows and tombstones newer than our ``rev`` (written by us before open, or by others).

        All reads happen in one transaction, so they see one snapshot: read one by one, another
        connection's put and delete committed in between would leave the put unseen, for good.
        """
        db = self._db
        self._drop_damaged_snapshot()
        if db.in_transaction:
            self._replay(db)
            return
        if db.execute("PRAGMA data_version").fetchone()[0] == self._data_version:
            return  # nobody committed since we last looked: skip the snapshot transaction
        db.execute("BEGIN")
        try:
            self._replay(db)
        finally:
            _end_read(db)

    def _replay(self, db: sqlite3.Connection) -> None:
        index = self.index
        # data_version first: a commit landing after it is replayed now or, at worst, again next time
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version:
            return
        newest = self._rev
        pending_ids: list[str] = []
        pending_vecs: list[np.ndarray] = []
        # a delta (another process's writes, or those since the snapshot) is found through the rev index and
        # sorted (``+seq``): SQLite would otherwise walk every row in seq order, ~0.5 s at 100k memories for
        # each catch-up; a full rebuild (rev 0) walks the table in order instead of sorting all of it
        order = "seq" if self._rev == 0 else "+seq"
        for rev, body, emb in db.execute(
            f"SELECT rev, body, embedding FROM memories WHERE rev > ? ORDER BY {order}", (self._rev,)
        ):
            m = IndexDoc.from_json(body)
            index.upsert(m)
            if emb is not None:
                if len(emb) != 4 * self.dim:  # another embedder's (a wrong --dim): not a reshape's ValueError
                    raise DimensionError(self.path, len(emb) // 4, self.dim)
                pending_ids.append(m.id)
                pending_vecs.append(np.frombuffer(emb, dtype="<f4"))
            else:
                index.drop_vector(m.id)
            newest = max(newest, rev)
        if pending_ids:  # one batched add: ~35x cheaper than row by row when reopening a big file
            index.set_vectors(pending_ids, np.vstack(pending_vecs))
        for memory_id, rev in db.execute("SELECT id, rev FROM tombstones WHERE rev > ?", (self._rev,)):
            revived = db.execute("SELECT 1 FROM memories WHERE id = ? AND rev > ?", (memory_id, rev))
            if revived.fetchone() is None:
                index.remove(memory_id)
            newest = max(newest, rev)
        # taken as replayed only now: a replay that failed half way (on a damaged snapshot) was skipped by the
        # next catch-up, which found data_version unchanged, and the index lacked those rows for good
        self._rev, self._data_version = newest, version

    @contextmanager
    def _write(
        self, action: str, events: Sequence[Event] = ()
    ) -> Iterator[tuple[sqlite3.Connection, int, dict[str, int]]]:
        """A write transaction holding SQLite's write lock, caught up first, with its new ``rev`` and, for
        ``events`` (the ones it will insert), each tenant's event counter after taking their numbers."""
        with self._lock, translated(action):
            db = self._db
            if self._rev == 0 or self._snapshot_found_damaged_after_open():
                # an index to build from the rows (dropped for a damaged snapshot) is built first, in a read
                # transaction: under the write lock every other process's writer would wait out the rebuild
                self._catch_up()
            db.execute("BEGIN IMMEDIATE")
            try:
                self._catch_up()
                rev, counted = sqlite_events.take_counters(db, events)
                yield db, rev, counted
                db.execute("COMMIT")
                if self._checkpointer is not None:
                    self._checkpointer.committed()
            except BaseException:
                db.execute("ROLLBACK")
                if self._index_dirty:  # the index may hold half of this batch: rebuild it from the file
                    if not self._healed():  # a damaged snapshot first: its rebuild is the one due, and why
                        self._drop_index("rows (rebuilt: a write failed half way through the index)", False)
                    self._catch_up()
                raise
            finally:
                self._index_dirty = False
            # _data_version stays as read under the write lock: our own commit does not change it, and
            # re-reading it now would hide another connection's commit that landed since ours.
            self._rev = rev
            self._note_own_write(rev)
            if self._rev - self._snapshot_rev >= self.snapshot_every:
                try:
                    self._periodic_snapshot()
                except Exception as exc:  # the write itself is committed; the next snapshot tries again
                    log.warning("index snapshot of %s not written: %s", self.path, exc)
                    # not retried on every write, but owed: close writes it whatever the delta
                    self._snapshot_rev, self._snapshot_owed = self._rev, True

    @contextmanager
    def _read(self, action: str) -> Iterator[sqlite3.Connection]:
        """The engine's connection, the index caught up with the file (a call that fails on a damaged
        snapshot is run again by :func:`heals`, which every public call of the engine wears)."""
        with self._lock, translated(action):
            self._catch_up()
            yield self._db

    @contextmanager
    def _snapshot(self, action: str) -> Iterator[sqlite3.Connection]:
        """:meth:`_read` in one read transaction, for a call that reads rows: the index is caught up to the
        snapshot of the file that the rows are then read from, so the memories it matched are read as they
        were when it matched them. Read apart, another process's write committed in between came back: a
        memory matched as a working member read as it is now, in short-term, and one deleted in between
        shortened a keyset page (which ended :meth:`iter_all`'s walk early)."""
        with self._lock, translated(action):
            db = self._db
            if db.in_transaction:  # called inside a write: its transaction is the snapshot
                self._catch_up()
                yield db
                return
            # the catch-up's first read (PRAGMA data_version) takes the snapshot the statements after see
            db.execute("BEGIN")
            try:
                self._catch_up()
                yield db
            finally:
                _end_read(db)

    @staticmethod
    def _bodies(db: sqlite3.Connection, ids: Sequence[str]) -> dict[str, str]:
        """The stored JSON of each of ``ids`` that is stored (read a chunk a query, in the caller's
        transaction)."""
        out: dict[str, str] = {}
        for start in range(0, len(ids), _CHUNK):
            chunk = list(ids[start : start + _CHUNK])
            marks = ",".join("?" * len(chunk))
            out.update(db.execute(f"SELECT id, body FROM memories WHERE id IN ({marks})", chunk))
        return out

    # ---- contract -----------------------------------------------------------------------------------
    @heals
    def put_many(self, memories: Sequence[Memory], *, imported: Collection[str] = ()) -> None:
        if not memories:
            return
        with self._write("put") as (db, rev, _counted):
            self._put_rows(db, rev, memories, imported=imported)

    @heals
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
        """One transaction for the memories, their vectors and their events (one commit per record). The
        preconditions of ``requires`` are evaluated in it, before anything is written: ``BEGIN IMMEDIATE``
        holds the file's write lock, and the catch-up under it brought the index up to every commit, so no
        other process's write lands between the check and this one."""
        if not memories:
            return self.append_events(events, tenant_numbers=tenant_numbers) if events else []
        vectors_of = {}
        if vectors is not None:
            ids, rows = leading_vectors(memories, vectors, self.dim)
            vectors_of = dict(zip(ids, normalize(rows), strict=True))
        with self._write("write", events) as (db, rev, counted):
            check_requirements(requires, memories, lambda budget: self._pins_in(db, budget))
            self._put_rows(db, rev, memories, vectors_of, imported)
            seqs, numbers = sqlite_events.insert_events(db, events, counted)
            return numbers if tenant_numbers else seqs

    def _pins_in(self, db: sqlite3.Connection, budget: PinBudget) -> dict[str, int]:
        """The token count of each stored member of ``budget``: found in the (caught up) index, which keeps
        pins and expiry, and counted from their rows (a session holds few pins)."""
        members = budget.members()
        ids = self.index.page(members, None, max(1, self.index.count(members)), False)
        counted: dict[str, int] = {}
        for start in range(0, len(ids), 500):  # within SQLite's limit of bound parameters
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT id, json_extract(body, '$.token_count') FROM memories WHERE id IN ({marks})"
            counted.update((str(i), int(n or 0)) for i, n in db.execute(sql, chunk))
        return counted

    def _put_rows(
        self,
        db: sqlite3.Connection,
        rev: int,
        memories: Sequence[Memory],
        vectors: dict[str, np.ndarray] | None = None,
        imported: Collection[str] = (),
    ) -> None:
        """Upsert ``memories`` and their (unit) ``vectors`` (``imported``: see :func:`check_stored`): a new
        memory's vector goes into its insert (one row write, not an insert and then an update), an existing
        one's is set after. A memory's link rows
        are rewritten only when its links changed (a tier move, the record path's common rewrite, keeps
        them).

        A memory at version 1 (a record's) is tried as a new row first, with no read before: only one
        already stored (a conflict, then) goes the way of the others, which read the stored versions,
        contents and links to check the version and tell what changed."""
        check_versions(memories, {})  # the same id twice in one batch: refused before anything is written
        vectors = vectors or {}
        fresh = {m.id for m in memories if m.version == 1 and self._insert_new(db, rev, m, vectors.get(m.id))}
        rest = [m for m in memories if m.id not in fresh]
        found = self._stored_states(db, [m.id for m in rest])
        versions = {i: state.version for i, state in found.items()}
        check_versions(rest, versions)
        check_stored(rest, versions, imported)
        rewritten = {m.id for m in rest if m.id in found and found[m.id].content != m.content}
        with_vector = {i: v for i, v in vectors.items() if i not in found}
        for m in memories:
            if m.id not in fresh:
                self._upsert_row(db, rev, m, with_vector.get(m.id))
                if m.id in rewritten:  # new text: the old vector no longer describes it
                    db.execute("UPDATE memories SET embedding = NULL WHERE id = ?", (m.id,))
            links = {(link.type.value, link.target) for link in m.links}
            old_links = found[m.id].links if m.id in found else set()
            if links == old_links:
                continue
            if m.id in found:
                db.execute("DELETE FROM links WHERE source = ?", (m.id,))
            db.executemany(
                "INSERT OR IGNORE INTO links VALUES (?,?,?)", [(m.id, t, target) for t, target in links]
            )
        self._index_dirty = True
        for m in memories:
            self.index.upsert(m)
            if m.id in rewritten:
                self.index.drop_vector(m.id)
        for memory_id, v in with_vector.items():
            self.index.set_vector(memory_id, v)
        later = [i for i in vectors if i not in with_vector]
        if later:
            self._set_vector_rows(db, rev, later, np.stack([vectors[i] for i in later]), None)

    def _insert_new(self, db: sqlite3.Connection, rev: int, m: Memory, vector: np.ndarray | None) -> bool:
        """Insert ``m`` as a new row; False (nothing written) when its id is stored already."""
        cur = db.execute(
            f"INSERT INTO memories ({_ROW_COLUMNS}) VALUES ({_ROW_MARKS}) ON CONFLICT(id) DO NOTHING",
            _row(rev, m, vector),
        )
        return cur.rowcount == 1

    def _upsert_row(self, db: sqlite3.Connection, rev: int, m: Memory, vector: np.ndarray | None) -> None:
        """Write ``m``'s row, new or not (an existing row keeps its vector: the caller sets or clears it)."""
        db.execute(
            f"""INSERT INTO memories ({_ROW_COLUMNS}) VALUES ({_ROW_MARKS})
               ON CONFLICT(id) DO UPDATE SET rev=excluded.rev, tenant=excluded.tenant,
                   session_id=excluded.session_id, task_id=excluded.task_id,
                   agent_id=excluded.agent_id,
                   tool_name=excluded.tool_name, kind=excluded.kind, state=excluded.state,
                   status=excluded.status, tier=excluded.tier, created_at=excluded.created_at,
                   version=excluded.version, body=excluded.body""",
            _row(rev, m, vector),
        )

    @staticmethod
    def _stored_states(db: sqlite3.Connection, ids: list[str]) -> dict[str, _StoredState]:
        """The stored version, content and link pairs of each of ``ids`` that is stored."""
        if not ids:
            return {}
        rows = db.execute(
            f"SELECT id, version, json_extract(body, '$.links'), {_CONTENT_COLUMNS}"
            f" FROM memories WHERE id IN ({','.join('?' * len(ids))})",
            [_ESCAPED_NUL, *ids],
        ).fetchall()
        return {
            i: _StoredState(version, _content_of(extracted, with_nul), _link_pairs(links))
            for i, version, links, extracted, with_nul in rows
        }

    @heals
    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        if not ids:
            return {}
        # one chunk is one statement, one state of the file already: no transaction around it (~5 us a
        # recall); the chunks of more ids are read in one
        with (self._read if len(ids) <= _CHUNK else self._snapshot)("get") as db:
            bodies = self._bodies(db, ids)
        return {i: from_stored(body) for i, body in bodies.items()}

    @heals
    def tenants_of(self, ids: Sequence[str]) -> dict[str, str]:
        with self._read("get"):  # caught up: the index holds every stored row
            return self.index.tenants_of(ids)

    @heals
    def delete_many(self, ids: Sequence[str]) -> int:
        unique = list(dict.fromkeys(ids))
        if not unique:
            return 0
        with self._write("delete") as (db, rev, _counted):
            return self._delete_rows(db, rev, unique)

    @heals
    def remove(self, memories: Sequence[Memory], events: Sequence[Event] = ()) -> int:
        """The versions checked, the rows deleted and the events logged in one transaction."""
        if not memories:
            if events:
                self.append_events(events)
            return 0
        ids = [m.id for m in memories]
        with self._write("delete", events) as (db, rev, counted):
            stored: dict[str, int] = {}
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                stored.update(db.execute(f"SELECT id, version FROM memories WHERE id IN ({marks})", chunk))
            check_removable(memories, stored)
            deleted = self._delete_rows(db, rev, ids)
            sqlite_events.insert_events(db, events, counted)
            return deleted

    def _delete_rows(self, db: sqlite3.Connection, rev: int, ids: Sequence[str]) -> int:
        """Delete ``ids``' rows, links and index entries, leaving a tombstone of each (in the caller's
        transaction); returns how many were stored."""
        n = 0
        for memory_id in ids:
            cur = db.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
            if cur.rowcount:
                n += 1
                db.execute("DELETE FROM links WHERE source = ?", (memory_id,))
                db.execute("INSERT INTO tombstones VALUES (?, ?)", (memory_id, rev))
        self._index_dirty = True
        for memory_id in ids:
            self.index.remove(memory_id)
        return n

    @heals
    def count(self, filters: Filters | None = None) -> int:
        with self._read("count"):
            return self.index.count(filters or Filters())

    @heals
    def group_counts(
        self, filters: Filters | None = None, expired_at: datetime | None = None
    ) -> dict[GroupKey, int]:
        with self._read("count"):  # the index caught up once: every group from the same state of the file
            return self.index.group_counts(filters or Filters(), expired_at)

    @heals
    def query(self, query: Query) -> QueryResult:
        with self._read("query"):
            return self.index.query(query)

    @heals
    def agents(self, filters: Filters) -> frozenset[str]:
        with self._read("agents"):
            return self.index.agents(filters)

    @heals
    def page(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> list[Memory]:
        key = None if after is None else (micros(after.created_at), after.id)
        with self._snapshot("page") as db:  # the ids and their rows from one state of the file
            ids = self.index.page(filters, key, limit, newest_first)
            bodies = self._bodies(db, ids)
        return [from_stored(bodies[i]) for i in ids if i in bodies]

    @heals
    def page_json(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> list[dict[str, Any]]:
        key = None if after is None else (micros(after.created_at), after.id)
        with self._snapshot("page") as db:  # the ids and their rows from one state of the file
            ids = self.index.page(filters, key, limit, newest_first)
            bodies = self._bodies(db, ids)
        return [json.loads(bodies[i]) for i in ids if i in bodies]

    @heals
    def session_ids(self, filters: Filters, after: str | None = None, limit: int = 500) -> list[str]:
        with self._read("session_ids"):
            return self.index.session_ids(filters, after, limit)

    @heals
    def tag_names(
        self, filters: Filters, prefix: str = "", after: str | None = None, limit: int = 500
    ) -> list[str]:
        with self._read("tag_names"):
            return self.index.tag_names(filters, prefix, after, limit)

    @heals
    def set_vectors(
        self, ids: Sequence[str], vectors: np.ndarray, contents: Sequence[str] | None = None
    ) -> None:
        vecs = normalize(check_stored_vectors(len(ids), vectors, self.dim))
        with self._write("set_vectors") as (db, rev, _counted):
            self._set_vector_rows(db, rev, ids, vecs, contents)

    def _set_vector_rows(
        self,
        db: sqlite3.Connection,
        rev: int,
        ids: Sequence[str],
        vecs: np.ndarray,
        contents: Sequence[str] | None,
    ) -> None:
        written = []
        waiting = {} if contents is None else self._unembedded_contents(db, ids)
        for n, (memory_id, v) in enumerate(zip(ids, vecs, strict=True)):
            if contents is None:
                cur = db.execute(
                    "UPDATE memories SET embedding = ?, rev = ? WHERE id = ?", (_blob(v), rev, memory_id)
                )
            else:
                if waiting.get(memory_id, _MISSING) != contents[n]:  # embedded since, or its text changed
                    continue
                cur = db.execute(
                    "UPDATE memories SET embedding = ?, rev = ? WHERE id = ?", (_blob(v), rev, memory_id)
                )
            if cur.rowcount:
                written.append((memory_id, v))
        self._index_dirty = True
        for memory_id, v in written:
            self.index.set_vector(memory_id, v)

    @staticmethod
    def _unembedded_contents(db: sqlite3.Connection, ids: Sequence[str]) -> dict[str, str]:
        """The stored content of each of ``ids`` that still lacks a vector (read in one query a chunk)."""
        out: dict[str, str] = {}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            for i, extracted, with_nul in db.execute(
                f"SELECT id, {_CONTENT_COLUMNS} FROM memories WHERE embedding IS NULL"
                f" AND id IN ({','.join('?' * len(chunk))})",
                [_ESCAPED_NUL, *chunk],
            ):
                out[i] = _content_of(extracted, with_nul)
        return out

    @heals
    def vectors_of(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        with self._read("vectors") as db:
            for start in range(0, len(ids), 500):
                chunk = list(ids[start : start + 500])
                for i, emb in db.execute(
                    f"SELECT id, embedding FROM memories WHERE embedding IS NOT NULL"
                    f" AND id IN ({','.join('?' * len(chunk))})",
                    chunk,
                ):
                    out[i] = np.frombuffer(emb, dtype="<f4").copy()
        return out

    @heals
    def unembedded(self, limit: int) -> list[Unembedded]:
        with self._read("unembedded") as db:
            return [
                Unembedded(i, json.loads(body)["content"])
                for i, body in db.execute(
                    "SELECT id, body FROM memories WHERE embedding IS NULL ORDER BY seq LIMIT ?", (limit,)
                )
            ]

    @heals
    def edges(self, ids: Sequence[str]) -> list[Edge]:
        out: list[Edge] = []
        with self._read("edges") as db:
            for start in range(0, len(ids), 400):
                chunk = list(ids[start : start + 400])
                marks = ",".join("?" * len(chunk))
                for s, t, d in db.execute(
                    "SELECT source, type, target FROM links "
                    f"WHERE source IN ({marks}) OR target IN ({marks})",
                    chunk + chunk,
                ):
                    out.append(Edge(s, LinkType(t), d))
        return list(dict.fromkeys(out))

    @heals
    def append_events(self, events: Sequence[Event], *, tenant_numbers: bool = False) -> list[int]:
        with self._write("append_events", events) as (db, _rev, counted):
            seqs, numbers = sqlite_events.insert_events(db, events, counted)
            return numbers if tenant_numbers else seqs

    @heals
    def import_events(self, events: Sequence[Event], tenant_numbers: Sequence[int] | None = None) -> None:
        if not events:
            return
        with self._write("import_events") as (db, _rev, _counted):
            sqlite_events.insert_imported(db, events, tenant_numbers)

    @heals
    def delete_events_upto(self, seq: int) -> int:
        with self._write("delete_events") as (db, _rev, _counted):
            return sqlite_events.delete_upto(db, seq)

    @heals
    def read_events(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        memory_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Event]:
        with self._read("read_events") as db:
            return sqlite_events.read(db, after_seq, limit, memory_id, tenant)

    # ---- credentials: a table of their own, which event retention never touches ---------------------
    def put_credential(self, credential: Credential) -> None:
        c = credential
        row = (c.tenant, c.kind, c.name, c.version, credential_json(c))
        with self._lock, translated("put_credential"):
            written = self._db.execute(_PUT_CREDENTIAL, row).fetchall()  # one statement: atomic on its own
            if written:
                return
            stored = self._db.execute(
                "SELECT version FROM credentials WHERE tenant = ? AND kind = ? AND name = ?", row[:3]
            ).fetchone()
        check_credential_version(credential, None if stored is None else int(stored[0]))
        raise AssertionError("the upsert refused a credential the version rule accepts")  # pragma: no cover

    # ---- the claim: one row of meta, taken by one statement (atomic across processes on the file) -----
    def claim(self, claim: Claim) -> None:
        with self._lock, translated("claim"):
            while True:
                taken = self._db.execute(
                    "INSERT INTO meta (key, value) VALUES ('claim', ?) ON CONFLICT (key) DO NOTHING",
                    (claim.to_json(),),
                ).rowcount
                if taken:
                    return
                held = _held_claim(self._db)
                if held is not None:  # else released in between: try again
                    raise claimed(held, f"the SQLite file {self.path}", self._drop_hint)

    def held_claim(self) -> Claim | None:
        with self._lock, translated("held_claim"):
            return _held_claim(self._db)

    def release(self, claim: Claim) -> None:
        with self._lock, translated("release"):
            self._db.execute("DELETE FROM meta WHERE key = 'claim' AND value = ?", (claim.to_json(),))

    def find_credentials(self, kind: str, name: str) -> list[Credential]:
        with self._lock, translated("find_credentials"):  # no _read: the search index is not involved
            rows = self._db.execute(
                "SELECT tenant, kind, name, version, data FROM credentials WHERE kind = ? AND name = ?"
                " ORDER BY tenant",
                (kind, name),
            ).fetchall()
        return [Credential(t, k, n, json.loads(d), int(v)) for t, k, n, v, d in rows]

    def list_credentials(
        self,
        kind: str | None = None,
        tenant: str | None = None,
        after: Credential | None = None,
        limit: int = 1000,
    ) -> list[Credential]:
        sql, args = credentials_page_sql(kind, tenant, after, limit, "?")
        with self._lock, translated("list_credentials"):
            rows = self._db.execute(sql, args).fetchall()
        return [Credential(t, k, n, json.loads(d), int(v)) for t, k, n, v, d in rows]

    # ---- last in the class: its name would shadow the builtin in the annotations of the methods after it
    @heals
    def list(self, filters: Filters | None = None, limit: int = 100) -> builtins.list[Memory]:
        with self._snapshot("list") as db:  # the ids and their rows from one state of the file
            ids = self.index.query(Query(filters=filters or Filters(), limit=limit)).filtered
            bodies = self._bodies(db, ids)
        return [from_stored(bodies[i]) for i in ids if i in bodies]
