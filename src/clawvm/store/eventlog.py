"""The event log as data: what each event kind means, retention, export (JSON Lines, Parquet), DuckDB.

Every store keeps one append-only log (:class:`clawvm.store.Event`: ``seq``, ``at``, ``tenant``,
``kind``, ``memory_id``, ``data``). The harness and the pager write it; MemLens (:mod:`clawvm.observe.lens`)
reads it. The kinds and their ``data``:

    add          a memory was recorded                      kind, tier
    update       fields changed (a new version)             fields, version
    revise       a revision, a new memory (``memory_id``)   revises (the predecessor), number, agent_id
    forget       deleted for good                           kind
    import       stored from an export                      -
    promote      moved nearer the prompt                    from, to, value_before, value_after, reason
    demote       moved away from the prompt                 (same)
    archive      moved to the archive tier                  (same)
    compress     summarized reversibly                      raw_id, method, tokens_before/after, reason
    decompress   raw text restored                          raw_id
    retrieve     a tracked recall                           query, k, ms, hits [{id, score, tier, value}]
    context      a context build                            query, budget, tokens, scope, ms, manifest [...]
    output       an agent output after a context            context_seq, cited, uncited, text, success
    feedback     a +1/-1 vote                               delta, value
    refresh      tick() recomputed a drifted value          value_before, value_after
    pin / unpin  pinned state changed                       from, to, value_before, value_after, tier, value
    manual       a person's intervention (dashboard, API)   action, by, before, after, value?, note?
    scoring_weights  the learning rule changed the scorer   weights, delta, action, target
    events_pruned    retention cut the log's head            deleted (how many of the tenant's events)
    collapse, checkpoint, rollback, preload, compress_error, prefetch_error: see their modules.

Retention (:class:`Retention`, :func:`prune`) drops the *head* of the log, like a message broker's log
retention: every event older than ``max_age_days``, or beyond the newest ``max_events``. The latest
``scoring_weights`` event (each tenant's) is carried over (re-appended) so learned weights survive
pruning, and each tenant that lost events gets an ``events_pruned`` note, so its timeline shows where its
history was cut. Analytics of
the pruned period are gone afterwards; export first if you need them. Nothing that authenticates lives in
the log: API keys are credentials (:meth:`clawvm.store.Store.put_credential`), out of retention's reach,
and the data keys' ids travel inside each sealed envelope; the log holds only their audit lines.

Following: :class:`EventTail` waits for the events appended after a seq, for live views (the server's
``GET /v1/events/stream``, the dashboard). An engine that is an :class:`~clawvm.store.EventFeed`
(PostgreSQL: LISTEN/NOTIFY) wakes it when any process writes; other engines are polled.

Export: :func:`export_jsonl` (one event per line) and :func:`export_parquet` (pyarrow, the
``analytics`` extra), of one tenant or of every tenant but the reserved ones (``_auth``: the API keys'
audit lines, and the keys themselves in logs written before the credentials table). The Parquet columns
are ``seq`` (int64), ``at`` (timestamp, UTC), ``tenant``, ``kind``, ``memory_id``, ``session_id`` (the
memory's session, or the scope of a context build) and ``data`` (the JSON text). :data:`DUCKDB_QUERIES`
are ready-made queries over that file (``{events}`` stands for its path; ``at`` is a DuckDB keyword, so
quote it: ``"at"``); e.g. with the DuckDB CLI, after
``clawvm export --events --format parquet -o events.parquet``::

    SELECT kind, count(*) AS n FROM read_parquet('events.parquet') GROUP BY kind ORDER BY n DESC;
    SELECT quantile_cont(CAST(json_extract_string(data, '$.ms') AS DOUBLE), [0.5, 0.9, 0.99])
      FROM read_parquet('events.parquet') WHERE kind = 'retrieve';
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import threading
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

from clawvm.core.errors import ConfigError, StoreError, ValidationError
from clawvm.core.model import counted, within
from clawvm.store.base import Event, EventFeed, Store, StoreReader
from clawvm.store.kinds import EventKind

log = logging.getLogger("clawvm.store.eventlog")

WEIGHTS_KIND = EventKind.SCORING_WEIGHTS
KEEP_LATEST = (WEIGHTS_KIND,)  # kinds whose newest event survives pruning

DUCKDB_QUERIES: dict[str, str] = {
    # how much of each kind of event
    "events_by_kind": (
        "SELECT kind, count(*) AS n FROM read_parquet('{events}') GROUP BY kind ORDER BY n DESC, kind"
    ),
    # tier traffic per day
    "tier_moves_per_day": (
        "SELECT date_trunc('day', \"at\") AS day, kind, count(*) AS n FROM read_parquet('{events}') "
        "WHERE kind IN ('promote', 'demote', 'archive') GROUP BY ALL ORDER BY day, kind"
    ),
    # recall latency percentiles (tracked recalls)
    "retrieval_latency_ms": (
        "SELECT count(*) AS recalls, "
        "quantile_cont(CAST(json_extract_string(data, '$.ms') AS DOUBLE), 0.5) AS p50, "
        "quantile_cont(CAST(json_extract_string(data, '$.ms') AS DOUBLE), 0.95) AS p95 "
        "FROM read_parquet('{events}') WHERE kind = 'retrieve'"
    ),
    # tokens per context build
    "context_tokens": (
        "SELECT count(*) AS builds, "
        "avg(CAST(json_extract_string(data, '$.tokens') AS INTEGER)) AS mean_tokens, "
        "max(CAST(json_extract_string(data, '$.tokens') AS INTEGER)) AS max_tokens "
        "FROM read_parquet('{events}') WHERE kind = 'context'"
    ),
    # the memories that entered the most contexts (one row per manifest line)
    "most_injected": (
        "SELECT json_extract_string(line, '$.id') AS memory_id, count(*) AS contexts "
        "FROM (SELECT unnest(CAST(json_extract(data, '$.manifest') AS JSON[])) AS line "
        "FROM read_parquet('{events}') WHERE kind = 'context') GROUP BY memory_id "
        "ORDER BY contexts DESC, memory_id LIMIT 20"
    ),
    # every manual intervention, in order
    "manual_actions": (
        "SELECT seq, \"at\", memory_id, json_extract_string(data, '$.action') AS action, "
        "json_extract_string(data, '$.by') AS actor "
        "FROM read_parquet('{events}') WHERE kind = 'manual' ORDER BY seq"
    ),
    # activity per session
    "events_per_session": (
        'SELECT session_id, count(*) AS events, min("at") AS first, max("at") AS last '
        "FROM read_parquet('{events}') WHERE session_id IS NOT NULL GROUP BY session_id ORDER BY session_id"
    ),
}


#: The longest ``Retention.max_age_days``: 1,000 years, a cutoff that any date after the year 1000 can be
#: moved back by (a datetime stops at the year 1)
MAX_AGE_DAYS = 365_250


@dataclass(frozen=True)
class Retention:
    """How much of the event log to keep. ``None`` keeps everything on that axis."""

    max_age_days: float | None = None
    max_events: int | None = None

    def __post_init__(self) -> None:
        if self.max_age_days is not None:  # past the calendar's start, prune's cutoff overflowed (1e6 days)
            fix = f"pass days from 0 to {MAX_AGE_DAYS:,} (1,000 years), or None to keep every age"
            within("max_age_days", self.max_age_days, 0, MAX_AGE_DAYS, fix)
        if self.max_events is not None and self.max_events < 0:
            raise ValidationError("max_events", f"is {self.max_events!r}", "pass an integer >= 0 or None")


def event_pages(store: StoreReader, after_seq: int = 0, batch: int = 5000) -> Iterator[list[Event]]:
    """Every event after ``after_seq``, in order, a page of at most ``batch`` at a time."""
    while True:
        page = store.read_events(after_seq, batch)
        if page:
            yield page
        if len(page) < batch:
            return
        last = page[-1].seq
        if last is None:  # an engine bug; reading on from the same place would never end
            raise StoreError(f"{type(store).__name__} returned an event without a sequence number")
        after_seq = last


def iter_events(store: StoreReader, after_seq: int = 0, batch: int = 5000) -> Iterator[Event]:
    """Every event after ``after_seq``, in order, read in batches."""
    for page in event_pages(store, after_seq, batch):
        yield from page


def prune(store: Store, retention: Retention, now: datetime) -> int:
    """Apply ``retention`` to the store's log (all tenants); returns how many events it deleted.

    Each tenant that lost events gets an ``events_pruned`` event saying how many (``deleted``), so its
    own timeline shows where its history was cut. Those notes, and the copies of kept events a prune
    carries over, are not counted (against ``max_events``, nor in what a prune says it deleted): the same
    prune run twice deletes nothing the second time. They go with the rest once a later prune cuts past
    them."""
    cutoff_time = None if retention.max_age_days is None else now - timedelta(days=retention.max_age_days)
    seqs: list[int] = []  # the events retention counts, in order
    aged_out = 0  # how many of ``seqs``, from the oldest, are older than the cutoff
    latest_kept: dict[tuple[str, str], Event] = {}  # (kind, tenant) -> its newest event of a kept kind
    for e in iter_events(store):
        if e.kind in KEEP_LATEST:
            latest_kept[(e.kind, e.tenant)] = e
        if not _counted(e):
            continue
        seqs.append(e.seq or 0)
        if cutoff_time is not None and aged_out == len(seqs) - 1 and e.at < cutoff_time:
            aged_out = len(seqs)
    drop = aged_out
    if retention.max_events is not None:
        drop = max(drop, len(seqs) - retention.max_events)
    if drop <= 0:
        return 0
    upto = seqs[drop - 1]
    carried = [
        replace(e, seq=None, data={**e.data, "carried_from": e.seq})
        for e in latest_kept.values()
        if (e.seq or 0) <= upto
    ]
    # each tenant's share of what goes (a second pass over the head: the first kept no tenants)
    head = itertools.takewhile(lambda e: (e.seq or 0) <= upto, iter_events(store))
    lost = Counter(e.tenant for e in head if _counted(e))
    if carried:  # re-append before deleting: a crash in between leaves a duplicate, never a loss
        store.append_events(carried)
    store.delete_events_upto(upto)
    notes = [Event(EventKind.EVENTS_PRUNED, tenant=t, at=now, data={"deleted": n}) for t, n in lost.items()]
    store.append_events(sorted(notes, key=lambda note: note.tenant))
    return sum(lost.values())


def _counted(e: Event) -> bool:
    """Whether retention counts ``e``: not a prune's own note, nor the copy of a kept event it carried."""
    return e.kind != EventKind.EVENTS_PRUNED and "carried_from" not in e.data


def event_record(e: Event) -> dict[str, Any]:
    """The JSON form of one event (the JSON Lines export line)."""
    return {
        "seq": e.seq,
        "at": e.at.isoformat(),
        "tenant": e.tenant,
        "kind": e.kind,
        "memory_id": e.memory_id,
        "data": e.data,
    }


def _exported(e: Event, tenant: str | None) -> bool:
    """One tenant's events, or (``None``) every tenant's but the reserved ones (``_auth``: key audits)."""
    return e.tenant == tenant if tenant is not None else not e.tenant.startswith("_")


def export_jsonl(store: StoreReader, stream: IO[str], tenant: str | None = None) -> int:
    """Write the log as JSON Lines (oldest first); returns how many events were written."""
    n = 0
    for e in iter_events(store):
        if _exported(e, tenant):
            stream.write(json.dumps(event_record(e), ensure_ascii=False, default=str) + "\n")
            n += 1
    return n


def export_parquet(store: StoreReader, path: Path, tenant: str | None = None, batch: int = 20000) -> int:
    """Write the log as one Parquet file (see the module docstring for the columns); returns the count.
    ``path`` is new or an earlier export (a file of anything else is refused, not overwritten), in a
    folder that exists."""
    batch = counted("batch", batch)
    _check_export_path(Path(path))
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - the analytics extra is part of dev
        raise ConfigError("Parquet export needs pyarrow: pip install 'clawvm[analytics]'") from None
    schema = pa.schema(
        [
            ("seq", pa.int64()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("tenant", pa.string()),
            ("kind", pa.string()),
            ("memory_id", pa.string()),
            ("session_id", pa.string()),
            ("data", pa.string()),
        ]
    )
    n = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        chunk: list[Event] = []
        for e in iter_events(store, batch=batch):
            if _exported(e, tenant):
                chunk.append(e)
            if len(chunk) >= batch:
                writer.write_table(_table(store, chunk, schema, pa))
                n, chunk = n + len(chunk), []
        if chunk or n == 0:
            writer.write_table(_table(store, chunk, schema, pa))
            n += len(chunk)
    return n


#: The first bytes of every Parquet file.
_PARQUET_MAGIC = b"PAR1"


def _check_export_path(path: Path) -> None:
    """:class:`ValidationError` on ``path`` unless a Parquet export can be written there."""
    if path.is_dir():
        raise ValidationError("path", f"{path} is a folder", "name the file to write, e.g. events.parquet")
    if not path.parent.is_dir():
        raise ValidationError("path", f"the folder {path.parent} does not exist", "create it or pick one")
    if path.exists() and path.stat().st_size > 0:  # an empty placeholder (mkstemp's) holds nothing to lose
        with path.open("rb") as existing:
            if existing.read(len(_PARQUET_MAGIC)) != _PARQUET_MAGIC:
                raise ValidationError(
                    "path",
                    f"{path} exists and is not a Parquet file (it would be overwritten)",
                    "pass a new path, or remove that file first",
                )


def _table(store: StoreReader, events: list[Event], schema: Any, pa: Any) -> Any:
    sessions = _sessions_of(store, events)
    columns: dict[str, list[Any]] = {
        "seq": [e.seq for e in events],
        "at": [e.at for e in events],
        "tenant": [e.tenant for e in events],
        "kind": [e.kind for e in events],
        "memory_id": [e.memory_id for e in events],
        "session_id": [sessions.get(e.memory_id or "") or _scope_session(e) for e in events],
        "data": [json.dumps(e.data, ensure_ascii=False, default=str) for e in events],
    }
    return pa.table(columns, schema=schema)


def _sessions_of(store: StoreReader, events: list[Event]) -> dict[str, str | None]:
    ids = list({e.memory_id for e in events if e.memory_id})
    out: dict[str, str | None] = {}
    for start in range(0, len(ids), 500):
        out.update((i, m.session_id) for i, m in store.get_many(ids[start : start + 500]).items())
    return out


def _scope_session(e: Event) -> str | None:
    scope = e.data.get("scope")
    sid = scope.get("session_id") if isinstance(scope, dict) else e.data.get("session_id")
    return sid if isinstance(sid, str) else None


def run_query(parquet: Path, name: str) -> list[tuple[Any, ...]]:
    """Run one of :data:`DUCKDB_QUERIES` over an exported Parquet file (needs duckdb)."""
    if name not in DUCKDB_QUERIES:
        raise ValidationError(
            "name", f"is not a known query ({name!r})", f"use one of {sorted(DUCKDB_QUERIES)}"
        )
    try:
        import duckdb
    except ImportError:  # pragma: no cover
        raise ConfigError("DuckDB queries need duckdb: pip install 'clawvm[analytics]'") from None
    if not Path(parquet).is_file() and not any(c in str(parquet) for c in "*?["):  # a glob: DuckDB's
        raise ValidationError("parquet", f"{parquet} is no file", "export the log first (export_parquet)")
    sql = DUCKDB_QUERIES[name].format(events=str(parquet).replace("'", "''"))
    with duckdb.connect() as con:
        try:
            rows: list[tuple[Any, ...]] = con.execute(sql).fetchall()
        except duckdb.Error as exc:  # not Parquet, or not an export of the log (its columns)
            raise ValidationError(
                "parquet", f"{parquet} is not an event log export DuckDB can read ({exc})", "export it again"
            ) from exc
    return rows


# ---- following the log as it grows ----------------------------------------------------------------------
#: ``read(after_seq, limit)``: the next page of a view of the log (a tenant's: ``Harness.events``).
ReadEvents = Callable[[int, int], list[Event]]


class EventTail:
    """Waits for the events appended after a seq: what live views (the server's event stream) follow.

    One per engine, any number of :meth:`follow` loops at once, each over its own ``read`` (a tenant's view
    of the log, ``Harness.events``: a follower sees only what that view shows). How a loop wakes up: if
    the engine is an :class:`~clawvm.store.EventFeed` (PostgreSQL: LISTEN/NOTIFY), a write by any process
    wakes it at once, and it still reads every ``safety_poll_s`` (``None``: never), because a notification
    sent while the listener reconnects is lost; any other engine is read every ``poll_s``.

    Async because a server keeps many followers open: a waiting one holds no thread, each read borrows one
    briefly. :meth:`stop` (any thread) ends every loop at once, and any started later: a server calls it
    when it begins to shut down, since its HTTP server waits for open responses first.
    """

    def __init__(
        self,
        engine: Store,
        *,
        poll_s: float = 0.5,
        safety_poll_s: float | None = 10.0,
        batch: int = 100,
    ) -> None:
        if not poll_s > 0 or (safety_poll_s is not None and not safety_poll_s > 0) or batch < 1:
            raise ValidationError("poll_s", "must be > 0 (and batch >= 1)", "pass positive intervals")
        self._feed = engine if isinstance(engine, EventFeed) else None
        self.poll_s = poll_s
        self.safety_poll_s = safety_poll_s
        self.batch = batch
        self._stopped = False
        self._wakers: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    @property
    def pushed(self) -> bool:
        """Whether the engine pushes (writes of any process wake the followers) rather than being polled."""
        return self._feed is not None

    @property
    def following(self) -> int:
        """How many :meth:`follow` loops are open now."""
        with self._lock:
            return len(self._wakers)

    def stop(self) -> None:
        """End every :meth:`follow` loop now (they return at once), and any started from now on."""
        self._stopped = True
        with self._lock:
            wakers = list(self._wakers.values())
        for wake in wakers:
            wake()

    async def follow(
        self,
        read: ReadEvents,
        after_seq: int = 0,
        *,
        heartbeat_s: float = 15.0,
        max_s: float | None = None,
    ) -> AsyncGenerator[list[Event], None]:
        """Yield each batch of new events (``seq > after_seq``, in order, at most ``batch``) as it arrives,
        and ``[]`` after ``heartbeat_s`` without any (a cue to show the reader is alive). Ends after
        ``max_s`` seconds (``None``: never), or at :meth:`stop`. Close it (``contextlib.aclosing``) when
        done early: that unsubscribes at once."""
        if not heartbeat_s > 0 or (max_s is not None and not max_s >= 0):
            raise ValidationError("heartbeat_s", "must be > 0 (and max_s >= 0)", "pass positive durations")
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake(_seq: int = 0) -> None:  # from any thread: the feed's listener, stop()
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
                loop.call_soon_threadsafe(woken.set)

        key = next(self._ids)
        with self._lock:
            self._wakers[key] = wake
        unsubscribe = await self._subscribe(wake)
        interval = self.safety_poll_s if unsubscribe is not None else self.poll_s
        now = loop.time()
        end = math.inf if max_s is None else now + max_s
        beat = now + heartbeat_s
        try:
            while not self._stopped:
                woken.clear()  # before the read: a write during the read wakes the next wait at once
                batch = await asyncio.to_thread(read, after_seq, self.batch)
                now = loop.time()
                if batch:
                    after_seq = batch[-1].seq or after_seq
                    beat = now + heartbeat_s
                    yield batch
                elif now >= beat:
                    beat = now + heartbeat_s
                    yield []
                if now >= end or self._stopped:
                    return
                if len(batch) >= self.batch:
                    continue  # more is waiting: read on at once
                wait = min(end, beat, now + (interval if interval is not None else math.inf)) - now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), max(wait, 0.0))
        finally:
            if unsubscribe is not None:
                unsubscribe()
            with self._lock:
                self._wakers.pop(key, None)

    async def _subscribe(self, wake: Callable[[int], None]) -> Callable[[], None] | None:
        """Subscribe to the feed (its first subscription connects: on a thread), or None to poll."""
        if self._feed is None:
            return None
        try:
            return await asyncio.to_thread(self._feed.subscribe, wake)
        except StoreError as exc:  # no listener: polling still delivers every event, a little later
            log.warning("event feed unavailable, polling instead", extra={"fields": {"error": str(exc)}})
            return None
