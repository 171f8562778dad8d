"""PostgreSQL's event log: appends numbered per tenant with no lock shared between writers, reads that wait
out numbers still in flight, imports that keep their numbers, and the ``LISTEN`` thread that tells every
process of new events.

The engine (:class:`clawvm.store.postgres.PostgresStore`) owns the connections and transactions; this
module gets a connection inside the caller's transaction, so an append commits with the memories it
describes.

Numbers. Each event gets the log's ``seq`` (a serial column) and ``tenant_seq``, its number in its tenant's
own sequence (``tenant_events_<md5 of the tenant>``, :func:`~clawvm.store.postgres_schema.tenant_sequence`,
made on the tenant's first append). Appenders take only a *shared* advisory lock of the store's schema,
held from the insert to the commit, so numbers may commit out of order. A reader returns the run of numbers
that follows ``after_seq`` without a hole; at a hole (a number still in flight, or one a rolled-back
transaction used) it takes the same lock exclusively, which waits for the appenders in flight, after which
every number handed out is final, and reads again. A reader following ``after_seq`` thus never skips an
event that commits late, and writers never queue behind each other.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from clawvm.core.errors import StoreError
from clawvm.core.model import MAX_COUNT
from clawvm.store.base import Event, check_import
from clawvm.store.postgres_schema import tenant_sequence
from clawvm.store.postgres_search import esc, unesc

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "clawvm_events"
_EVENTS_LOCK = 0x636C6178  # advisory lock class: event appends (shared), reads at a hole (exclusive)

#: One page of a tenant's events (the tenant's own numbers as ``seq``); add ``AND memory_id = %s`` for one
#: memory's.
TENANT_EVENTS_SQL = (
    "SELECT tenant_seq, at, tenant, kind, memory_id, data FROM events WHERE tenant = %s AND tenant_seq > %s"
)
# a tenant's new event sequence starts past the highest number it ever had: in its events, or counted in
# event_numbers before sequences numbered them (events retention deleted included); scalar subqueries, so
# that setval runs where the sequence lives (a distributed events table's coordinator)
_START_SEQUENCE = """SELECT setval(%s::regclass, greatest(
        (SELECT coalesce(max(tenant_seq), 0) FROM events WHERE tenant = %s),
        (SELECT coalesce(max(last), 0) FROM event_numbers WHERE tenant = %s)) + 1, false)"""
# rows are numbered in the order given, in the log and in each tenant's sequence (nextval is volatile, so
# PostgreSQL evaluates it after the sort, row by row); one notification per batch (equal payloads are
# delivered once)
_INSERT_EVENTS = """WITH ins AS (
        INSERT INTO events (at, tenant, kind, memory_id, data, tenant_seq)
        SELECT e.at, e.tenant, e.kind, e.memory_id, e.data::json, nextval(e.numbers::regclass)
        FROM unnest(%s::timestamptz[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[])
             WITH ORDINALITY AS e(at, tenant, kind, memory_id, data, numbers, n)
        ORDER BY e.n
        RETURNING seq, tenant_seq)
    SELECT seq, tenant_seq, pg_notify(%s, %s || (SELECT max(seq) FROM ins)) FROM ins"""
_IMPORT_EVENT = """INSERT INTO events (seq, at, tenant, kind, memory_id, data, tenant_seq)
    VALUES (%s, %s, %s, %s, %s, %s, %s)"""


class PgEventLog:
    """The event log of one schema. Every method runs on the caller's connection, in its transaction."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._numbered: set[str] = set()  # tenants (stored form) whose event sequence is known to exist

    # ---- appends ------------------------------------------------------------------------------------
    def append(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> list[tuple[int, int]]:
        """Insert ``events``; returns (seq, number in its tenant's sequence) of each, in order."""
        self.number_tenants(conn, events)  # before the pipeline: it waits
        with conn.pipeline():
            cur = self.send(conn, events)
        return self.numbers(cur)

    def send(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> psycopg.Cursor[Any]:
        """Queue the insert of ``events`` (in the caller's pipeline, after :meth:`number_tenants`); its
        cursor returns their numbers (:meth:`numbers`)."""
        cols: list[list[Any]] = [[], [], [], [], []]
        for e in events:
            for col, v in zip(cols, _columns(e)[1:], strict=True):
                col.append(v)
        # shared with every other appender (no queue); a reader at a hole waits for it (read)
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s, hashtext(%s))", [_EVENTS_LOCK, self.schema])
        sequences = [self.sequence(t) for t in cols[1]]
        return conn.execute(_INSERT_EVENTS, [*cols, sequences, EVENTS_CHANNEL, f"{self.schema}:"])

    @staticmethod
    def numbers(cur: psycopg.Cursor[Any]) -> list[tuple[int, int]]:
        """(seq, tenant number) of each event :meth:`send` inserted, in order."""
        return sorted((int(r[0]), int(r[1])) for r in cur.fetchall())

    def sequence(self, tenant: str) -> str:
        """The schema-qualified name of the sequence numbering ``tenant``'s events (stored form)."""
        return f"{self.schema}.{tenant_sequence(tenant)}"

    def number_tenants(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> None:
        """Make the event sequence of each tenant of ``events`` that has none, starting past the tenant's
        highest number, in the caller's transaction (a savepoint each: a writer that made it first is no
        error; one that is making it holds this one back until it commits). Called before the events'
        statements, outside any pipeline. Nothing is sent once this process has seen each sequence."""
        for tenant in sorted({esc(e.tenant) or "" for e in events} - self._numbered):
            name = self.sequence(tenant)
            row = conn.execute("SELECT to_regclass(%s)", [name]).fetchone()
            if row is not None and row[0] is not None:
                # committed by another transaction (this one asks once per tenant, before it makes any): it
                # stays, where one made here could still roll back
                self._numbered.add(tenant)
                continue
            try:
                with conn.transaction():
                    conn.execute(f"CREATE SEQUENCE {name}")  # a checked schema and a digest: nothing to quote
                    conn.execute(_START_SEQUENCE, [name, tenant, tenant])
            except (psycopg.errors.DuplicateTable, psycopg.errors.UniqueViolation):
                pass  # another writer made it first, started as this one would have been

    # ---- imports and retention ----------------------------------------------------------------------
    def insert_imported(
        self, conn: psycopg.Connection[Any], events: Sequence[Event], tenant_numbers: Sequence[int] | None
    ) -> None:
        """Insert ``events`` with their own ``seq`` (and ``tenant_numbers``, else the next of each tenant's
        sequence), then move the sequences past them: later appends follow, and none ever moves back."""
        self.number_tenants(conn, events)
        conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # no append between the check and setval
        newest = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
        check_import(events, int(newest[0]) if newest else 0)
        numbers = list(tenant_numbers) if tenant_numbers is not None else self._next_numbers(conn, events)
        last: dict[str, int] = {}
        for e, n in zip(events, numbers, strict=True):
            last[esc(e.tenant) or ""] = max(last.get(esc(e.tenant) or "", 0), n)
        with conn.cursor() as cur:
            cur.executemany(
                _IMPORT_EVENT,
                [(*_columns(e), n) for e, n in zip(events, numbers, strict=True)],
            )
        for tenant, n in sorted(last.items()):  # its sequence moves past the imported numbers, never back
            name = self.sequence(tenant)  # the highest number handed out: last_value once it is called
            conn.execute(
                f"SELECT setval(%s::regclass, greatest(%s, (SELECT last_value - (NOT is_called)::int"
                f" FROM {name})))",
                [name, n],
            )
        conn.execute(
            "SELECT setval(pg_get_serial_sequence('events', 'seq'), %s)", [max(e.seq or 0 for e in events)]
        )

    def _next_numbers(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> list[int]:
        """Each event's next number in its tenant's sequence, in order (the sequences exist)."""
        rows = conn.execute(
            "SELECT nextval(s::regclass) FROM unnest(%s::text[]) WITH ORDINALITY AS t(s, n) ORDER BY n",
            [[self.sequence(esc(e.tenant) or "") for e in events]],
        ).fetchall()
        return [int(r[0]) for r in rows]

    @staticmethod
    def delete_upto(conn: psycopg.Connection[Any], seq: int) -> int:
        """Delete the events numbered up to ``seq`` (a sequence never hands out a number twice)."""
        return conn.execute("DELETE FROM events WHERE seq <= %s", [seq]).rowcount

    # ---- reads --------------------------------------------------------------------------------------
    def read(
        self,
        conn: psycopg.Connection[Any],
        after_seq: int,
        limit: int,
        memory_id: str | None,
        tenant: str | None,
    ) -> list[Event]:
        """Up to ``limit`` events after ``after_seq`` (the log's numbers, or ``tenant``'s own), never
        skipping one still in flight (see the module docstring)."""
        if tenant is None:
            sql = "SELECT seq, at, tenant, kind, memory_id, data FROM events WHERE seq > %s"
            args: list[Any] = [after_seq]
        else:
            sql, args = TENANT_EVENTS_SQL, [esc(tenant), after_seq]
        if memory_id is not None:
            sql += " AND memory_id = %s"
            args.append(esc(memory_id))
        sql += " ORDER BY seq LIMIT %s" if tenant is None else " ORDER BY tenant_seq LIMIT %s"
        args.append(min(limit, MAX_COUNT))
        rows = conn.execute(sql, args).fetchall()
        if memory_id is None and not _without_holes(after_seq, [int(r[0]) for r in rows]):
            # a lower number may still be in flight: wait for the appenders holding the shared lock; then
            # every number handed out is committed or gone for good
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_EVENTS_LOCK, self.schema])
                rows = conn.execute(sql, args).fetchall()
        return [
            Event(kind=unesc(k) or "", memory_id=unesc(mid), data=d, tenant=unesc(t) or "", at=at, seq=int(s))
            for s, at, t, k, mid, d in rows
        ]


def _columns(e: Event) -> tuple[Any, ...]:
    """An event's stored columns: seq, at, tenant, kind, memory_id, data (escaped and encoded)."""
    return (e.seq, e.at, esc(e.tenant), esc(e.kind), esc(e.memory_id), json.dumps(e.data, default=str))


def _without_holes(after: int, seqs: list[int]) -> bool:
    """Whether ``seqs`` (ascending) run on from ``after`` one by one."""
    return all(seq == after + 1 + n for n, seq in enumerate(seqs))


class Listener:
    """One ``LISTEN`` connection on a thread, fanning notifications for one schema out to callbacks."""

    def __init__(self, conninfo: str, schema: str) -> None:
        self._conninfo = conninfo
        self._prefix = f"{schema}:"
        self._callbacks: dict[int, Callable[[int], None]] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="clawvm-pg-listen", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            self._stopped.set()
            raise StoreError(f"postgres listen failed: {self._error or 'timed out'}")

    def add(self, callback: Callable[[int], None]) -> Callable[[], None]:
        with self._lock:
            key = self._next
            self._next += 1
            self._callbacks[key] = callback

        def remove() -> None:
            with self._lock:
                self._callbacks.pop(key, None)

        return remove

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    self._ready.set()
                    while not self._stopped.is_set():
                        for note in conn.notifies(timeout=0.2):
                            self._deliver(note.payload)
            except psycopg.Error as exc:  # connection lost: report once at start, else reconnect
                if not self._ready.is_set():
                    self._error = exc
                    self._ready.set()
                    return
                log.warning("clawvm listener lost its connection (%s); reconnecting", exc)
                self._stopped.wait(0.5)

    def _deliver(self, payload: str) -> None:
        if not payload.startswith(self._prefix):
            return
        seq = int(payload[len(self._prefix) :])
        with self._lock:
            callbacks = list(self._callbacks.values())
        for cb in callbacks:
            try:
                cb(seq)
            except Exception:  # a subscriber's bug must not stop delivery to the others
                log.exception("event subscriber failed")

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
