"""Latency and throughput of the Harness at N memories (10k, 100k) built from LoCoMo dev turns.

Texts are recombined from LoCoMo turns (whole turns, sentence mixes from one conversation, dated notes,
session digests) with varied speakers, sessions, tasks, kinds and tags, from a fixed seed: the first N of
a 100k corpus are the N of a smaller run, so their vectors are shared. Corpus and query vectors are
computed once with the real embedder and cached outside the repository (``_locomo.VectorCache``).

Measured (milliseconds unless noted), in a SQLite store in a temporary directory:
- ``record_p50_ms`` / ``record_p95_ms``: ``Harness.record(..., embedding=vector)`` per call, all N calls;
- ``recall_p50_ms`` / ``recall_p95_ms``: top-10 default-preset ``recall_with`` with precomputed query vectors,
  warm (warm-up queries first), over ~300 LoCoMo questions; ``lexical_*`` / ``context_*`` / ``dense_*``: the
  channel searches timed directly (same filter mask, same candidate count), plus mask / fuse / get_many
  parts (``fuse`` over the lexical and dense lists only);
- ``embed_query_p50_ms``: ``embedder.embed_query`` alone; ``embedder_raw_per_s``: ``embedder.embed`` on
  1000 corpus texts;
- ``ingest_per_s``: a fresh store, M records with real background embedding, then ``flush``: M / elapsed;
- ``open_s``: reopening the N-memory file (rebuilds the in-process index); ``first_recall_after_open_ms``;
  ``recall_after_open_p50_ms`` / ``_p95_ms``: the same timed recalls against the reopened file.

    .venv/bin/python bench/recall_scale.py --n 10000 --json /tmp/scale10k.json [--ingest-n 2000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _locomo
import clawvm
from clawvm.core.lexical import top_rows
from clawvm.recall.retrieval import fuse

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo_dev.json"
_SENT = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[A-Za-z]{5,}")
KINDS = (
    "user_input", "user_input", "user_input", "observation", "note", "summary", "llm_thought", "knowledge",
)
AGENTS = ("planner", "chat", "researcher", "scribe")


def build_corpus(convs: list[_locomo.Conversation], n: int, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` memory specs (content + fields), deterministic; a prefix of a larger run with the same seed."""
    rng = random.Random(seed)
    people = sorted({s for c in convs for s in c.speakers})
    per_conv = []
    for c in convs:
        sents = [(t, s) for t in c.turns for s in _SENT.split(t.text) if len(s.split()) >= 3]
        words = sorted({w.lower() for t in c.turns for w in _WORD.findall(t.text)})
        per_conv.append((c, c.turns, sents, words))
    tags_vocab = sorted({w for _, _, _, ws in per_conv for w in ws[:: max(1, len(ws) // 40)]})[:120]
    out: list[dict[str, Any]] = []
    for i in range(n):
        c, turns, sents, _ = per_conv[rng.randrange(len(per_conv))]
        style = rng.random()
        base = rng.choice(turns)
        speaker = base.speaker if rng.random() < 0.85 else rng.choice(people)
        if style < 0.15:  # a turn as it was said
            text = base.content
        elif style < 0.65:  # one speaker's sentences from across the conversation
            picks = [s for _, s in rng.sample(sents, rng.randint(1, 3))]
            text = f"{speaker}: {' '.join(picks)}"
        elif style < 0.85:  # a dated observation
            t, s = rng.choice(sents)
            text = f"On {t.date:%d %B %Y} {t.speaker} said: {s}"
        else:  # a short session digest
            sess = rng.choice(list(c.sessions.values()))
            picks = [t.text.split(". ")[0] for t in rng.sample(sess, min(len(sess), rng.randint(2, 4)))]
            head = f"Session {sess[0].session_no} with {c.speakers[0]} and {c.speakers[1]}"
            text = f"{head}: {' / '.join(picks)}"
        text = text[:600]
        if any(text == o["content"] for o in out[-50:]) or not text.strip():
            text = f"{text} ({i})"
        out.append({
            "content": text,
            "kind": rng.choice(KINDS),
            "session_id": f"{c.sample_id}-{base.session}-{rng.randrange(20)}",
            "task_id": f"task-{rng.randrange(300)}",
            "agent_id": rng.choice(AGENTS),
            "tags": rng.sample(tags_vocab, rng.randint(0, 3)),
            "created_at": base.date + timedelta(seconds=rng.randrange(86_400)),
            "metadata": {"src": base.dia_id, "conv": c.sample_id},
        })
    return out


def pct(xs: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(xs, dtype=np.float64), q)), 3) if xs else float("nan")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    r = fn()
    return (time.perf_counter() - t0) * 1000.0, r


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, required=True, help="memories in the store (10000, 100000 ...)")
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--ingest-n", type=int, default=2000,
                    help="records for the background-embedding ingest test")
    ap.add_argument("--engine", choices=("sqlite", "memory", "postgres"), default="sqlite",
                    help="postgres: synthetic corpus, PostgreSQL at --n beside SQLite at --sqlite-n "
                         "(see bench/_scale_engines.py); needs no LoCoMo data")
    ap.add_argument("--sqlite-n", type=int, default=100_000, help="with --engine postgres: SQLite's size")
    ap.add_argument("--pg-url", default=None,
                    help="with --engine postgres: a server to use (default: a throwaway local one)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo dev JSON (read in place)")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--preset", default=None, help="recall preset to time (default: the default preset)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    if args.engine == "postgres":
        import _scale_engines

        out = _scale_engines.run(args)
        out["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json} ({out['elapsed_s']}s)")
        return 0

    convs, _ = _locomo.load(args.data)
    specs = build_corpus(convs, args.n)
    texts = [s["content"] for s in specs]
    rng = random.Random(11)
    questions = [q.question for c in convs for q in c.qa]
    rng.shuffle(questions)
    questions = questions[: args.queries + args.warmup]
    print(f"corpus: {args.n} memories from {len(convs)} LoCoMo conversations, "
          f"{len(set(texts))} distinct texts, mean {np.mean([len(t) for t in texts]):.0f} chars")

    embedder = clawvm.Harness.open("memory://").embedder
    assert embedder is not None
    embedder.embed_query("warm up")
    cache = _locomo.VectorCache(embedder.name, embedder.dim)
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        el = time.perf_counter() - t0
        print(f"  embedded {done}/{total} missing corpus texts ({done / max(el, 1e-9):.0f}/s)", flush=True)

    vecs = cache.get_or_compute(texts, embedder.embed, "doc", progress=progress)
    corpus_note = cache.describe()
    cache.hits = cache.misses = 0
    qvecs = cache.get_or_compute(
        questions, lambda ts: np.stack([embedder.embed_query(t) for t in ts]), "query"
    )
    query_note = cache.describe()
    cache.save()
    del cache
    print(f"corpus vectors: {corpus_note} [{time.perf_counter() - t0:.1f}s]")
    print(f"query vectors:  {query_note}")

    res: dict[str, Any] = {"n": args.n, "engine": args.engine, "embedder": embedder.name,
                           "cache": {"corpus": corpus_note, "queries": query_note},
                           "source": _locomo.source_state()}
    tmp = tempfile.TemporaryDirectory(prefix="clawvm-scale-")
    path = Path(tmp.name) / "scale.db"
    target = str(path) if args.engine == "sqlite" else "memory://"

    # ---- record with precomputed vectors, every call timed --------------------------------------------
    h = clawvm.Harness.open(target, preset=args.preset)
    rec_ms: list[float] = []
    t_build = time.perf_counter()
    for i, (spec, v) in enumerate(zip(specs, vecs, strict=True)):
        t = time.perf_counter()
        h.record(spec["content"], embedding=v, **{k: x for k, x in spec.items() if k != "content"})
        rec_ms.append((time.perf_counter() - t) * 1000.0)
        if (i + 1) % 20000 == 0:
            print(f"  recorded {i + 1}/{args.n} ({(i + 1) / (time.perf_counter() - t_build):.0f}/s, "
                  f"p50 so far {pct(rec_ms, 50)} ms)", flush=True)
    h.flush()
    build_s = time.perf_counter() - t_build
    del vecs
    res.update(record_p50_ms=pct(rec_ms, 50), record_p95_ms=pct(rec_ms, 95), record_p99_ms=pct(rec_ms, 99),
               record_max_ms=round(max(rec_ms), 3), build_s=round(build_s, 1))
    tenth = max(1, len(rec_ms) // 10)
    res["record_p50_first_tenth_ms"] = pct(rec_ms[:tenth], 50)
    res["record_p50_last_tenth_ms"] = pct(rec_ms[-tenth:], 50)

    # ---- recall (warm) and its parts -------------------------------------------------------------------
    cfg = h.config
    filters = h.filters({})
    k = 10
    first_ms, _ = timed(lambda: h.recall_with(questions[0], qvecs[0], k, cfg, filters))
    res["first_recall_ms"] = round(first_ms, 3)
    for q, v in zip(questions[: args.warmup], qvecs[: args.warmup], strict=True):
        h.recall_with(q, v, k, cfg, filters)
    timed_q = list(zip(questions[args.warmup :], qvecs[args.warmup :], strict=True))
    recall_ms = [timed(lambda q=q, v=v: h.recall_with(q, v, k, cfg, filters))[0] for q, v in timed_q]
    index = h._store.index  # type: ignore[attr-defined]  # the engine itself
    parts: dict[str, list[float]] = {
        "mask": [], "lexical": [], "context": [], "dense": [], "fuse": [], "get_many": []
    }
    for q, v in timed_q:
        ms, allowed = timed(lambda: index.mask(filters))
        parts["mask"].append(ms)
        ms, lex = timed(lambda q=q, a=allowed: index.lexical.search(q, cfg.candidates, a))
        parts["lexical"].append(ms)
        if cfg.uses("context"):  # own BM25 of every row, then neighbourhood BM25 around the best
            def context(q: str = q, a: Any = allowed) -> Any:
                terms = index.lexical.analyzer.terms(q)
                own = index.lexical.scores(terms)
                best = [] if own is None else top_rows(own, 2 * cfg.candidates, a)
                return index.context_search(terms, np.asarray([r for r, _ in best]), cfg.candidates, a)

            ms, _ = timed(context)
            parts["context"].append(ms)
        ms, den = timed(lambda v=v, a=allowed: index.vectors.search(v, cfg.candidates, a))
        parts["dense"].append(ms)
        lex_ids = [(index.ids[r], s) for r, s in lex]
        den_ids = [(index.ids[r], s) for r, s in den]
        ms, fused = timed(lambda a=lex_ids, b=den_ids: fuse({"lexical": a, "dense": b}, cfg.weights, k))
        parts["fuse"].append(ms)
        ms, _ = timed(lambda f=fused: h.store.get_many([x.id for x in f]))
        parts["get_many"].append(ms)
    res.update(recall_p50_ms=pct(recall_ms, 50), recall_p95_ms=pct(recall_ms, 95),
               recall_p99_ms=pct(recall_ms, 99), recall_queries=len(recall_ms), recall_warmup=args.warmup)
    for name, xs in parts.items():
        res[f"{name}_p50_ms"], res[f"{name}_p95_ms"] = pct(xs, 50), pct(xs, 95)
    # How much of the exact dense top-`candidates` the (possibly projected) vector search returns.
    allowed = index.mask(filters)
    valid = np.flatnonzero(index.vectors._has[: len(index.ids)] & (allowed if allowed is not None else True))
    overlap = []
    for _, v in timed_q[:100]:
        exact = valid[np.argsort(-(index.vectors._x[valid] @ v), kind="stable")[: cfg.candidates]]
        got = {r for r, _ in index.vectors.search(v, cfg.candidates, allowed)}
        overlap.append(len(got.intersection(exact.tolist())) / len(exact))
    res["dense_recall_vs_exact"] = round(float(np.mean(overlap)), 4)
    res["count_ms"] = round(float(np.median([timed(h.count)[0] for _ in range(5)])), 3)
    lex_only = [timed(lambda q=q: index.lexical.search(q, cfg.candidates, None))[0] for q, _ in timed_q]
    den_only = [timed(lambda v=v: index.vectors.search(v, cfg.candidates, None))[0] for _, v in timed_q]
    res.update(lexical_nomask_p95_ms=pct(lex_only, 95), dense_nomask_p95_ms=pct(den_only, 95))

    # ---- query embedding alone and raw embedder throughput -------------------------------------------
    eq = [timed(lambda q=q: embedder.embed_query(q))[0] for q in questions[:100]]
    res.update(embed_query_p50_ms=pct(eq, 50), embed_query_p95_ms=pct(eq, 95))
    raw = texts[:: max(1, len(texts) // 1000)][:1000]
    ms, _ = timed(lambda: embedder.embed(raw))
    res["embedder_raw_per_s"] = round(len(raw) / (ms / 1000.0), 1)

    # ---- reopen (index rebuild) -----------------------------------------------------------------------
    h.close()
    h = index = None  # let the first index go: the reopened store below is then the only one in memory
    gc.collect()
    if args.engine == "sqlite":
        ms, h2 = timed(lambda: clawvm.Harness.open(target))
        res["open_s"] = round(ms / 1000.0, 3)
        res["first_recall_after_open_ms"] = round(
            timed(lambda: h2.recall_with(questions[0], qvecs[0], k, cfg, filters))[0], 3
        )
        # the same timed recalls in the reopened store: what a process serving this file sees (the process
        # above also holds the benchmark's own corpus, and its heap grew record by record)
        for q, v in zip(questions[: args.warmup], qvecs[: args.warmup], strict=True):
            h2.recall_with(q, v, k, cfg, filters)
        reopened = [timed(lambda q=q, v=v: h2.recall_with(q, v, k, cfg, filters))[0] for q, v in timed_q]
        res.update(recall_after_open_p50_ms=pct(reopened, 50), recall_after_open_p95_ms=pct(reopened, 95))
        res["count_after_open"] = h2.count()
        h2.close()
        res["db_mb"] = round(sum(p.stat().st_size for p in Path(tmp.name).glob("scale.db*")) / 2**20, 1)
    else:
        res["open_s"] = None

    # ---- ingest with real background embedding --------------------------------------------------------
    m = min(args.ingest_n, len(specs))
    ingest_target = str(Path(tmp.name) / "ingest.db") if args.engine == "sqlite" else "memory://"
    hi = clawvm.Harness.open(ingest_target)
    ing_ms: list[float] = []
    t0 = time.perf_counter()
    for spec in specs[-m:]:
        t = time.perf_counter()
        hi.record(spec["content"], **{k2: x for k2, x in spec.items() if k2 != "content"})
        ing_ms.append((time.perf_counter() - t) * 1000.0)
    t_recorded = time.perf_counter() - t0
    hi.flush()
    elapsed = time.perf_counter() - t0
    assert hi.store.unembedded(1) == [], "flush left memories unembedded"
    hi.close()
    res.update(ingest_n=m, ingest_per_s=round(m / elapsed, 1), ingest_record_loop_s=round(t_recorded, 2),
               ingest_total_s=round(elapsed, 2), ingest_record_p50_ms=pct(ing_ms, 50),
               ingest_record_p95_ms=pct(ing_ms, 95))
    tmp.cleanup()
    res["peak_rss_mb"] = round(rss_mb(), 0)
    res["elapsed_s"] = round(time.perf_counter() - t_start, 1)

    rows = [
        ("record p50 / p95 (ms)", f"{res['record_p50_ms']} / {res['record_p95_ms']}"),
        ("record p50 first / last tenth (ms)",
         f"{res['record_p50_first_tenth_ms']} / {res['record_p50_last_tenth_ms']}"),
        ("recall top-10 p50 / p95 (ms)", f"{res['recall_p50_ms']} / {res['recall_p95_ms']}"),
        ("  mask p50 / p95", f"{res['mask_p50_ms']} / {res['mask_p95_ms']}"),
        ("  lexical p50 / p95", f"{res['lexical_p50_ms']} / {res['lexical_p95_ms']}"),
        ("  context p50 / p95", f"{res['context_p50_ms']} / {res['context_p95_ms']}"),
        ("  dense p50 / p95", f"{res['dense_p50_ms']} / {res['dense_p95_ms']}"),
        ("  fuse p50 / p95", f"{res['fuse_p50_ms']} / {res['fuse_p95_ms']}"),
        ("  get_many p50 / p95", f"{res['get_many_p50_ms']} / {res['get_many_p95_ms']}"),
        ("first recall (ms, cold)", res["first_recall_ms"]),
        ("dense top-100 overlap with exact", res["dense_recall_vs_exact"]),
        ("count() (ms)", res["count_ms"]),
        ("embed_query p50 / p95 (ms)", f"{res['embed_query_p50_ms']} / {res['embed_query_p95_ms']}"),
        ("embedder raw (texts/s)", res["embedder_raw_per_s"]),
        (f"ingest {m} w/ background embed (/s)", res["ingest_per_s"]),
        ("  record loop / total (s)", f"{res['ingest_record_loop_s']} / {res['ingest_total_s']}"),
        ("open_s (reopen + index rebuild)", res["open_s"]),
        ("first recall after open (ms)", res.get("first_recall_after_open_ms")),
        ("recall p50 / p95 after open (ms)",
         f"{res.get('recall_after_open_p50_ms')} / {res.get('recall_after_open_p95_ms')}"),
        ("build (s), db (MB), peak RSS (MB)", f"{res['build_s']}, {res.get('db_mb')}, {res['peak_rss_mb']}"),
    ]
    print(f"\nrecall_scale n={args.n} engine={args.engine} preset={cfg.name} {cfg.weights} "
          f"candidates={cfg.candidates}")
    for label, value in rows:
        print(f"  {label:<40} {value}")
    Path(args.json).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.json} ({res['elapsed_s']}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
