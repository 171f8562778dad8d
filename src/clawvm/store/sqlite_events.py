"""The SQLite engine's event log: appends numbered in the log and in each tenant's own sequence, imports
that keep their numbers, retention, reads.

Every function runs on the caller's connection inside its transaction (the engine holds the write lock), so
events commit with the memories they describe. ``seq`` is ``AUTOINCREMENT``: a number is never handed out
twice, even after retention deleted it. Each tenant's last number lives in the ``counters`` table (row
``EVENTS_COUNTER + tenant``), taken in the same statement as the engine's revision counter on a record.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from clawvm.store.base import Event, check_import

#: The counters row holding the last event number a tenant was given: this prefix + the tenant.
EVENTS_COUNTER = "events:"
#: One page of a tenant's events (the tenant's own numbers as ``seq``); add ``AND memory_id = ?`` for one
#: memory's.
TENANT_EVENTS_SQL = (
    "SELECT tenant_seq, at, tenant, kind, memory_id, data FROM events WHERE tenant = ? AND tenant_seq > ?"
)
_UPSERT_COUNTER = (
    "INSERT INTO counters VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = value + excluded.value"
)


def take_counters(db: sqlite3.Connection, events: Sequence[Event]) -> tuple[int, dict[str, int]]:
    """The transaction's new ``rev`` and, for ``events``, each tenant's event counter after their numbers
    are taken: one statement for all of them (a record's write took two, ~20 us each)."""
    counts = Counter(e.tenant for e in events)
    names = [("rev", 1), *((EVENTS_COUNTER + tenant, n) for tenant, n in sorted(counts.items()))]
    rows = db.execute(
        f"INSERT INTO counters VALUES {','.join(['(?, ?)'] * len(names))}"
        " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value RETURNING name, value",
        [x for pair in names for x in pair],
    ).fetchall()
    after = {str(name): int(value) for name, value in rows}  # RETURNING's row order is unspecified
    return after.pop("rev"), {name.removeprefix(EVENTS_COUNTER): value for name, value in after.items()}


def insert_events(
    db: sqlite3.Connection, events: Sequence[Event], counted: Mapping[str, int] | None = None
) -> tuple[list[int], list[int]]:
    """Insert ``events`` in one statement; returns their seqs and their numbers in their tenants' own
    sequences. The write lock is held and ``seq`` is AUTOINCREMENT, so one batch's seqs are consecutive
    and end at the connection's last rowid. ``counted``: the tenants' counters as :func:`take_counters`
    left them after taking these events' numbers (else they are taken here)."""
    if not events:
        return [], []
    numbers = _tenant_numbers(db, events) if counted is None else _numbers_from(events, counted)
    rows = [(*_columns(e)[1:], n) for e, n in zip(events, numbers, strict=True)]
    insert = "INSERT INTO events (at, tenant, kind, memory_id, data, tenant_seq) VALUES (?,?,?,?,?,?)"
    if len(rows) == 1:  # a record's one event: the cursor knows its rowid, no statement asks for it
        last = db.execute(insert, rows[0]).lastrowid
    else:  # executemany leaves lastrowid unset
        db.executemany(insert, rows)
        last = db.execute("SELECT last_insert_rowid()").fetchone()[0]
    assert last is not None
    return list(range(last - len(events) + 1, last + 1)), numbers


def insert_imported(
    db: sqlite3.Connection, events: Sequence[Event], tenant_numbers: Sequence[int] | None
) -> None:
    """Insert ``events`` with their own ``seq`` (and ``tenant_numbers``, else each tenant's next), above
    every stored one; each tenant's counter moves past its imported numbers, never back."""
    newest = db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
    check_import(events, int(newest))
    numbers = list(tenant_numbers) if tenant_numbers is not None else _tenant_numbers(db, events)
    db.executemany(  # AUTOINCREMENT keeps the largest number given: later appends follow it
        "INSERT INTO events (seq, at, tenant, kind, memory_id, data, tenant_seq) VALUES (?,?,?,?,?,?,?)",
        [(*_columns(e), n) for e, n in zip(events, numbers, strict=True)],
    )
    last: dict[str, int] = {}
    for e, n in zip(events, numbers, strict=True):
        last[e.tenant] = max(last.get(e.tenant, 0), n)
    db.executemany(
        "INSERT INTO counters VALUES (?, ?)"
        " ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
        [(EVENTS_COUNTER + t, n) for t, n in sorted(last.items())],
    )


def delete_upto(db: sqlite3.Connection, seq: int) -> int:
    """Delete the events numbered up to ``seq`` (AUTOINCREMENT: their numbers are never reused)."""
    return int(db.execute("DELETE FROM events WHERE seq <= ?", (seq,)).rowcount)


def read(
    db: sqlite3.Connection, after_seq: int, limit: int, memory_id: str | None, tenant: str | None
) -> list[Event]:
    """Up to ``limit`` events after ``after_seq``: the log's numbers, or with ``tenant`` that tenant's own
    (returned as ``seq``); one memory's with ``memory_id``."""
    if tenant is None:
        sql = "SELECT seq, at, tenant, kind, memory_id, data FROM events WHERE seq > ?"
        args: list[object] = [after_seq]
    else:
        sql, args = TENANT_EVENTS_SQL, [tenant, after_seq]
    if memory_id is not None:
        sql += " AND memory_id = ?"
        args.append(memory_id)
    sql += " ORDER BY seq LIMIT ?" if tenant is None else " ORDER BY tenant_seq LIMIT ?"
    args.append(limit)
    return [
        Event(kind=k, memory_id=mid, data=json.loads(d), tenant=t, at=datetime.fromisoformat(at), seq=s)
        for s, at, t, k, mid, d in db.execute(sql, args)
    ]


def number_events_per_tenant(conn: sqlite3.Connection) -> None:
    """Number the events of an older file in each tenant's own sequence, in log order (a migration step)."""
    last: dict[str, int] = {}
    numbered = []
    for seq, tenant in conn.execute("SELECT seq, tenant FROM events ORDER BY seq"):
        last[tenant] = last.get(tenant, 0) + 1
        numbered.append((last[tenant], seq))
    conn.executemany("UPDATE events SET tenant_seq = ? WHERE seq = ?", numbered)
    conn.executemany(
        "INSERT INTO counters VALUES (?, ?)", [(EVENTS_COUNTER + t, n) for t, n in sorted(last.items())]
    )


def _columns(e: Event) -> tuple[Any, ...]:
    """An event's stored columns: seq, at, tenant, kind, memory_id, data."""
    return (e.seq, e.at.isoformat(), e.tenant, e.kind, e.memory_id, json.dumps(e.data, default=str))


def _numbers_from(events: Sequence[Event], counted: Mapping[str, int]) -> list[int]:
    """Each event's number in its tenant's sequence, given the counters after the batch took them."""
    following = {tenant: counted[tenant] - n + 1 for tenant, n in Counter(e.tenant for e in events).items()}
    out = []
    for e in events:
        out.append(following[e.tenant])
        following[e.tenant] += 1
    return out


def _tenant_numbers(db: sqlite3.Connection, events: Sequence[Event]) -> list[int]:
    """The next numbers of each event's tenant (under the write lock), taken from its counter."""
    counted: dict[str, int] = {}
    for tenant, n in sorted(Counter(e.tenant for e in events).items()):
        counted[tenant] = int(
            db.execute(_UPSERT_COUNTER + " RETURNING value", (EVENTS_COUNTER + tenant, n)).fetchone()[0]
        )
    return _numbers_from(events, counted)
