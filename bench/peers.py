"""ClawVM side by side with mem0 and LangGraph on LoCoMo: same turns, same embedding model, one run.

Systems, all scoped per conversation by their own mechanism:
- ``clawvm``: ``Harness.open("memory://")`` with the default preset; each turn is ``record()``-ed (kind
  user_input, session_id = session, created_at = session date, task_id = conversation, metadata dia_id) and
  embedded by the harness's background worker; questions go through ``recall(q, k=10, task_id=conv,
  track=False)`` (read-only, like the peers' searches); row ``clawvm:track`` is ``recall()``'s default
  ``track=True``, which also records each hit as an access.
- ``mem0``: mem0's open-source ``Memory`` (``mem0ai``) with ``add(..., infer=False)`` (raw messages, no LLM
  extraction), its default local vector store (Qdrant's in-process local mode, here ``path=":memory:"``), a
  history DB in memory, and the ``langchain`` embedder provider wrapping our model; questions go through
  ``search(q, top_k=10, filters={"user_id": conv}, threshold=0.0)`` (threshold 0 so it always returns 10).
  Telemetry is off (``MEM0_TELEMETRY=False``, which also stops its remote notice fetch); the LLM it insists
  on building points at a closed loopback port and is never called. Its BM25 channel needs ``fastembed``'s
  ``Qdrant/bm25`` files, which fastembed downloads from a model hub at run time: impossible offline, so
  mem0 ranks by its semantic channel (see docs/benchmarks.md).
- ``langgraph``: ``InMemoryStore(index={"dims": 384, "embed": fn, "fields": ["text"]})``, one ``put`` per
  turn under the namespace ``("locomo", conv)``, ``search(("locomo", conv), query=q, limit=10)``.

All three embed with ClawVM's ``MiniLMEmbedder`` (all-MiniLM-L6-v2 int8 ONNX, 2 threads), wrapped to count
the seconds spent inside the model from any thread. Every system stores the same text per turn (the line
plus its photo caption, as ``bench/locomo.py`` records it) and gets the same fields.

Two kinds of worker process, each fresh:
- timing (one process, all systems, the real model): ingest one system after the other, then every question
  to every system in rotating order, so that the load of a shared machine falls on all alike. Measured:
  turn-level evidence R@5 / R@10 (percent, overall and per category; QA items without usable evidence
  excluded), ``ingest_s`` (wall time of all adds until searchable, embedding included, each system batching
  as it does by itself) and ``ingest_embed_s`` (seconds inside the model meanwhile); search latency over all
  questions after 5 warm-up questions: ``search_p50_ms`` / ``search_p95_ms`` include the query embedding
  (what a caller waits for), ``search_excl_embed_*`` subtract the time spent in the model during that call.
- memory (one process per system): vectors of the same model from the on-disk cache (``_locomo.VectorCache``,
  filled first), so the model is never loaded; ``mem_peak_delta_mb`` is the peak resident set (VmHWM, reset
  through ``/proc/self/clear_refs`` once the data and the empty system are loaded) minus the resident set
  then: what ingest + every search added (with the model loaded, ONNX Runtime's arena would dominate it
  and grow with the batch shapes each system embeds with). ``ingest_cached_vectors_s``: that ingest's wall
  time, i.e. the system's own work without the model.
Ratios are ClawVM / peer (below 1 is less time or memory); ``speedup`` is peer / ClawVM. An audit hook
refuses and records every connection that is not to loopback.

    .venv/bin/python bench/peers.py --data ../shared/data/locomo/locomo_dev.json --json /tmp/peers.json \
        [--systems clawvm mem0 langgraph] [--limit N_CONVERSATIONS]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _locomo
import locomo
from clawvm.core.embed import Embedder, MiniLMEmbedder

SYSTEMS = ("clawvm", "mem0", "langgraph")
K = 10
WARMUP = 5
GOAL_SPEEDUP = 20.0
OFFLINE_ENV = {"MEM0_TELEMETRY": "False", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class TimedEmbedder:
    """The one model every system embeds with, counting the seconds spent inside it (from any thread)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.seconds = 0.0
        self._lock = threading.Lock()

    def _timed(self, fn: Callable[[Any], np.ndarray], arg: Any) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            return fn(arg)
        finally:
            with self._lock:
                self.seconds += time.perf_counter() - t0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._timed(self.inner.embed, texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self._timed(self.inner.embed_query, text)


SearchFn = Callable[[str, str, int], list[str]]  # (conversation, question, k) -> dia_ids, best first


class Peer(Protocol):
    def add(self, conv_id: str, turn: _locomo.Turn, text: str) -> None: ...

    def finish(self) -> None: ...  # all adds done: wait until everything is searchable

    def search(self, conv_id: str, query: str, k: int) -> list[str]: ...  # read-only, like the peers'

    def variants(self) -> dict[str, SearchFn]: ...  # other ways to search, measured after the main one

    def notes(self) -> list[str]: ...


class ClawVMPeer:
    def __init__(self, embedder: TimedEmbedder) -> None:
        import clawvm

        self.h = clawvm.Harness.open("memory://", embedder=embedder)

    def add(self, conv_id: str, turn: _locomo.Turn, text: str) -> None:
        # every system gets the speaker as a field (mem0 and LangGraph keep it in metadata; ClawVM's
        # agent_id is what its author levers read)
        self.h.record(text, kind="user_input", session_id=turn.session, created_at=turn.date,
                      agent_id=turn.speaker, task_id=conv_id, metadata={"dia_id": turn.dia_id})

    def finish(self) -> None:
        self.h.flush()

    def search(self, conv_id: str, query: str, k: int, track: bool = False) -> list[str]:
        hits = self.h.recall(query, k=k, task_id=conv_id, track=track)
        return [hit.memory.metadata["dia_id"] for hit in hits]

    def variants(self) -> dict[str, SearchFn]:
        # recall()'s default, track=True, also counts each hit as an access (stored stats, pager warming):
        # a write the peers' searches do not do, so it is measured apart.
        return {"track": lambda conv_id, query, k: self.search(conv_id, query, k, track=True)}

    def notes(self) -> list[str]:
        return [f"preset {self.h.config.name}, store memory://; main row recall(track=False) (read-only "
                "like the peers), row ':track' recall() with its default track=True"]


def _langchain_embeddings(embedder: TimedEmbedder) -> Any:
    """Our model as a LangChain ``Embeddings``: the supported way to give mem0 a custom embedder."""
    from langchain_core.embeddings import Embeddings

    class MiniLM(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embedder.embed(texts).tolist()  # type: ignore[no-any-return]

        def embed_query(self, text: str) -> list[float]:
            return embedder.embed_query(text).tolist()  # type: ignore[no-any-return]

    return MiniLM()


class Mem0Peer:
    def __init__(self, embedder: TimedEmbedder) -> None:
        from mem0 import Memory
        from mem0.memory import telemetry

        if telemetry.MEM0_TELEMETRY:
            raise RuntimeError("mem0 telemetry is on: run with MEM0_TELEMETRY=False")
        self.m = Memory.from_config({
            "embedder": {"provider": "langchain", "config": {
                "model": _langchain_embeddings(embedder), "embedding_dims": embedder.dim}},
            "vector_store": {"provider": "qdrant", "config": {
                "collection_name": "locomo", "embedding_model_dims": embedder.dim, "path": ":memory:"}},
            # Memory() always builds an LLM client; infer=False never calls it. A closed loopback port makes
            # any call fail at once instead of reaching out.
            "llm": {"provider": "openai",
                    "config": {"api_key": "unused-offline", "openai_base_url": "http://127.0.0.1:9/v1"}},
            "history_db_path": ":memory:",
        })

    def add(self, conv_id: str, turn: _locomo.Turn, text: str) -> None:
        self.m.add([{"role": "user", "content": text}], user_id=conv_id, infer=False,
                   metadata={"dia_id": turn.dia_id, "session": turn.session, "date": turn.date.isoformat(),
                             "speaker": turn.speaker})

    def finish(self) -> None:
        pass  # add() is synchronous

    def variants(self) -> dict[str, SearchFn]:
        return {}

    def search(self, conv_id: str, query: str, k: int) -> list[str]:
        found = self.m.search(query, top_k=k, filters={"user_id": conv_id}, threshold=0.0)
        return [r["metadata"]["dia_id"] for r in found["results"]]

    def notes(self) -> list[str]:
        from mem0.utils import spacy_models

        store = self.m.vector_store
        bm25 = getattr(store, "_bm25_encoder", None)
        out = [f"vector store {type(store).__name__} ({type(store.client._client).__name__})"]
        if not bm25:
            out.append("BM25 keyword channel off: fastembed's Qdrant/bm25 model is fetched from a model hub "
                       "at run time (not installable offline); ranking is mem0's semantic channel alone")
        if spacy_models.get_nlp_full() is None:
            out.append("spaCy not installed (mem0ai[nlp]): no query lemmatisation or entity extraction; with "
                       "infer=False the entity store stays empty, so entity boosts could not apply anyway")
        return out


class LangGraphPeer:
    def __init__(self, embedder: TimedEmbedder) -> None:
        from langgraph.store.memory import InMemoryStore

        def embed(texts: Sequence[str]) -> list[list[float]]:
            return embedder.embed(texts).tolist()  # type: ignore[no-any-return]

        self.store = InMemoryStore(index={"dims": embedder.dim, "embed": embed, "fields": ["text"]})

    def add(self, conv_id: str, turn: _locomo.Turn, text: str) -> None:
        self.store.put(("locomo", conv_id), turn.dia_id,
                       {"text": text, "session": turn.session, "date": turn.date.isoformat(),
                        "speaker": turn.speaker})

    def finish(self) -> None:
        pass  # put() embeds inline

    def variants(self) -> dict[str, SearchFn]:
        return {}

    def search(self, conv_id: str, query: str, k: int) -> list[str]:
        return [item.key for item in self.store.search(("locomo", conv_id), query=query, limit=k)]

    def notes(self) -> list[str]:
        return ["InMemoryStore, exact cosine over the namespace's vectors (numpy)"]


PEERS: dict[str, Callable[[TimedEmbedder], Peer]] = {
    "clawvm": ClawVMPeer, "mem0": Mem0Peer, "langgraph": LangGraphPeer,
}
PACKAGES = {"clawvm": ("clawvm",), "mem0": ("mem0ai", "qdrant-client", "langchain"),
            "langgraph": ("langgraph",)}


# ---- measuring -----------------------------------------------------------------------------------------
class NetworkGuard:
    """Audit hook refusing (and recording) every connection that is not to loopback or a local socket."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "socket.connect":
            return
        address = args[1]
        if not isinstance(address, tuple):
            return  # a Unix socket
        try:
            if ipaddress.ip_address(str(address[0]).split("%")[0]).is_loopback:
                return
        except ValueError:
            pass
        self.refused.append(f"{address[0]}:{address[1]}")
        raise OSError(f"bench/peers.py is offline: refused a connection to {address[0]}:{address[1]}")


class PeakMemory:
    """Growth of the resident set from now to its peak (VmHWM), via the kernel's high-water-mark reset."""

    def __init__(self) -> None:
        self.method = "VmHWM after reset (/proc/self/clear_refs 5) minus VmRSS at the start"
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.method = "ru_maxrss high-water mark minus VmRSS at the start (no reset: may read low)"
        self.start_kb = self._status("VmRSS")

    @staticmethod
    def _status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise RuntimeError(f"{field} missing from /proc/self/status")

    def report(self) -> dict[str, Any]:
        peak = self._status("VmHWM")
        return {"mem_peak_delta_mb": round((peak - self.start_kb) / 1024, 1),
                "rss_peak_mb": round(peak / 1024, 1), "rss_start_mb": round(self.start_kb / 1024, 1),
                "mem_method": self.method}


def recall_summary(rows: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
    def mean(items: list[dict[str, float]]) -> dict[str, Any]:
        return {"R@5": round(100 * float(np.mean([m["R@5"] for m in items])), 2) if items else None,
                "R@10": round(100 * float(np.mean([m["R@10"] for m in items])), 2) if items else None,
                "n": len(items)}

    by_cat = {str(c): {**mean([m for cc, m in rows if cc == c]), "name": _locomo.CATEGORIES.get(c, "?")}
              for c in sorted({c for c, _ in rows})}
    return {**mean([m for _, m in rows]), "by_category": by_cat}


def percentiles(prefix: str, ms: list[float]) -> dict[str, float]:
    return {f"{prefix}_p50_ms": round(float(np.percentile(ms, 50)), 3),
            f"{prefix}_p95_ms": round(float(np.percentile(ms, 95)), 3),
            f"{prefix}_mean_ms": round(float(np.mean(ms)), 3)}


def conversations(path: str, limit: int | None) -> list[_locomo.Conversation]:
    convs, _ = _locomo.load(path)
    return convs[:limit] if limit else convs


def ingest(peer: Peer, convs: list[_locomo.Conversation], embedder: TimedEmbedder, captions: bool
           ) -> dict[str, Any]:
    embed_before = embedder.seconds
    t0 = time.perf_counter()
    for conv in convs:
        for turn in conv.turns:
            peer.add(conv.sample_id, turn, locomo.recorded_text(turn, captions))
    peer.finish()
    seconds = time.perf_counter() - t0
    turns = sum(len(c.turns) for c in convs)
    return {"ingest_s": round(seconds, 3), "ingest_embed_s": round(embedder.seconds - embed_before, 3),
            "ingest_per_s": round(turns / seconds, 1), "turns": turns}


class Searcher:
    """One way to search one system, with what its searches measured."""

    def __init__(self, search: SearchFn, embedder: TimedEmbedder) -> None:
        self.search = search
        self.embedder = embedder
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.total_ms: list[float] = []
        self.embed_ms: list[float] = []

    def ask(self, conv_id: str, qa: _locomo.QA) -> None:
        e0 = self.embedder.seconds
        t0 = time.perf_counter()
        ranked = self.search(conv_id, qa.question, K)
        self.total_ms.append(1000 * (time.perf_counter() - t0))
        self.embed_ms.append(1000 * (self.embedder.seconds - e0))
        self.rows.append((qa.category, locomo.question_metrics(ranked[:K], qa.evidence)))

    def report(self) -> dict[str, Any]:
        excl = [max(t - e, 0.0) for t, e in zip(self.total_ms, self.embed_ms, strict=True)]
        return {**recall_summary(self.rows), "questions": len(self.rows),
                **percentiles("search", self.total_ms), **percentiles("search_excl_embed", excl),
                **percentiles("query_embed", self.embed_ms)}


def corpus_texts(convs: list[_locomo.Conversation], captions: bool) -> list[str]:
    """Every text a run embeds: the turns as stored, the questions with evidence, and those questions as
    ClawVM's default preset embeds them (without the speakers they name: every speaker is an agent of its
    one store)."""
    from clawvm.recall.retrieval import named_authors, strip_authors

    speakers = frozenset(s for c in convs for s in c.speakers)
    questions = [qa.question for c in convs for qa in c.qa if qa.evidence]
    stripped = [strip_authors(q, named_authors(q, speakers)) for q in questions]
    return [locomo.recorded_text(t, captions) for c in convs for t in c.turns] + questions + [
        s for s, q in zip(stripped, questions, strict=True) if s != q]


class CachedEmbedder:
    """Vectors of the same model read from the on-disk cache (``_locomo.VectorCache``), for the memory pass:
    the model is never loaded, so what the process grows by is the system itself."""

    name = MiniLMEmbedder.name
    dim = MiniLMEmbedder.dim

    def __init__(self, texts: list[str]) -> None:
        def missing(batch: list[str]) -> np.ndarray:
            raise RuntimeError(f"{len(batch)} vectors missing from the cache: run bench/peers.py itself")

        vecs = _locomo.VectorCache(self.name, self.dim).get_or_compute(texts, missing, "doc")
        self.vectors = dict(zip(texts, vecs, strict=True))
        for text, vec in zip(texts, vecs, strict=True):  # mem0 strips queries before embedding them
            self.vectors.setdefault(text.strip(), vec)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self.vectors[text]


def fill_cache(convs: list[_locomo.Conversation], captions: bool) -> str:
    model = MiniLMEmbedder()
    cache = _locomo.VectorCache(model.name, model.dim)
    cache.get_or_compute(corpus_texts(convs, captions), model.embed, "doc")
    cache.save()
    return cache.describe()


def run_timing(names: Sequence[str], convs: list[_locomo.Conversation], captions: bool
               ) -> dict[str, dict[str, Any]]:
    """All systems in this one process on the real model (one ONNX session, a timing wrapper each):
    ingested one after the other, then searched question by question in rotating order, so that the load
    of a shared machine falls on every system alike."""
    model = MiniLMEmbedder()
    model.embed(["load the model before anything is timed"])
    results: dict[str, dict[str, Any]] = {}
    searchers: dict[str, Searcher] = {}
    for name in names:
        embedder = TimedEmbedder(model)
        try:
            peer = PEERS[name](embedder)
            results[name] = {**ingest(peer, convs, embedder, captions), "notes": peer.notes(),
                             "versions": {p: metadata.version(p) for p in PACKAGES[name]}}
        except Exception as exc:  # a peer that cannot run here is reported, never estimated
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        searchers[name] = Searcher(peer.search, embedder)
        for label, fn in peer.variants().items():
            searchers[f"{name}:{label}"] = Searcher(fn, embedder)
    questions = [(c.sample_id, qa) for c in convs for qa in c.qa if qa.evidence]
    order = list(searchers.values())
    for conv_id, qa in questions[:WARMUP]:  # warm-up, not measured
        for searcher in order:
            searcher.search(conv_id, qa.question, K)
    for i, (conv_id, qa) in enumerate(questions):
        for searcher in order[i % len(order):] + order[: i % len(order)]:
            searcher.ask(conv_id, qa)
    for key, searcher in searchers.items():
        name, _, label = key.partition(":")
        if label:
            results[name].setdefault("variants", {})[label] = searcher.report()
        else:
            results[name].update(searcher.report())
    return results


def run_memory(name: str, convs: list[_locomo.Conversation], captions: bool) -> dict[str, Any]:
    """One system in this fresh process, vectors from the cache: how much ingest + every search grew it."""
    embedder = TimedEmbedder(CachedEmbedder(corpus_texts(convs, captions)))
    peer = PEERS[name](embedder)
    memory = PeakMemory()
    ingested = ingest(peer, convs, embedder, captions)
    for conv_id, qa in [(c.sample_id, qa) for c in convs for qa in c.qa if qa.evidence]:
        peer.search(conv_id, qa.question, K)
    # the same ingest with the model out of the picture: the system's own work
    return {**memory.report(), "ingest_cached_vectors_s": ingested["ingest_s"]}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    guard = NetworkGuard()
    sys.addaudithook(guard)
    convs = conversations(args.data, args.limit)
    captions = not args.no_captions
    if args.worker == "timing":
        result: dict[str, Any] = {"systems": run_timing(args.systems, convs, captions)}
    else:
        result = {"systems": {args.worker: run_memory(args.worker, convs, captions)}}
    result["network_refused"] = guard.refused
    return result


# ---- orchestration -------------------------------------------------------------------------------------
def spawn(job: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run one worker (``timing`` for all systems, or a system's memory pass) in a fresh process."""
    out = workdir / f"{job}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", job, "--systems", *args.systems,
           "--data", args.data, "--json", str(out)]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if args.no_captions:
        cmd.append("--no-captions")
    env = {**os.environ, **OFFLINE_ENV, "MEM0_DIR": str(workdir / "mem0")}
    print(f"{job} ...", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        print(f"  {job} FAILED (exit {proc.returncode}):\n    " + "\n    ".join(tail))
        return {"error": f"{job}: exit {proc.returncode}", "stderr_tail": tail}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def measure(args: argparse.Namespace, workdir: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The timing worker for all systems, then a memory worker per system that ran; failures are kept."""
    timing = spawn("timing", args, workdir)
    refused: list[str] = list(timing.get("network_refused", []))
    systems = {name: timing.get("systems", {}).get(name, timing) for name in args.systems}
    for name in args.systems:
        if "error" in systems[name]:
            continue
        memory = spawn(name, args, workdir)
        refused += memory.get("network_refused", [])
        systems[name] = {**systems[name], **memory.get("systems", {}).get(name, memory)}
    return systems, refused


RATIO_KEYS = ("R@5", "R@10", "ingest_s", "ingest_cached_vectors_s", "search_p50_ms", "search_p95_ms",
              "search_excl_embed_p50_ms", "search_excl_embed_p95_ms", "mem_peak_delta_mb")


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 4) if a is not None and b else None

    out: dict[str, Any] = {key: div(ours.get(key), peer.get(key)) for key in RATIO_KEYS}
    out["speedup"] = {key: div(peer.get(key), ours.get(key)) for key in RATIO_KEYS if "search" in key}
    return out


def goal(ours: dict[str, Any], mem0: dict[str, Any]) -> dict[str, Any]:
    """Search at least 20x faster than mem0 (p50 and p95) at equal or better R@10, on both latency bases."""
    def met(prefix: str) -> bool:
        keys = (f"{prefix}_p50_ms", f"{prefix}_p95_ms")
        return all(mem0[key] >= GOAL_SPEEDUP * ours[key] for key in keys)

    recall_ok = ours["R@10"] >= mem0["R@10"]
    return {"target": f"search >= {GOAL_SPEEDUP:g}x faster than mem0 (p50 and p95) at equal or better R@10",
            "r10_equal_or_better": recall_ok,
            "met_including_query_embedding": recall_ok and met("search"),
            "met_excluding_query_embedding": recall_ok and met("search_excl_embed")}


COLUMNS = (("R@5", "R@5", "{:.1f}"), ("R@10", "R@10", "{:.1f}"), ("ingest s", "ingest_s", "{:.1f}"),
           ("-emb s", "ingest_cached_vectors_s", "{:.2f}"), ("p50 ms", "search_p50_ms", "{:.2f}"),
           ("p95 ms", "search_p95_ms", "{:.2f}"), ("p50 -emb", "search_excl_embed_p50_ms", "{:.2f}"),
           ("p95 -emb", "search_excl_embed_p95_ms", "{:.2f}"), ("mem MB", "mem_peak_delta_mb", "{:.0f}"))


def table(systems: dict[str, dict[str, Any]]) -> str:
    def row(label: str, r: dict[str, Any]) -> str:
        return f"{label:<14}" + "".join(f"{fmt.format(r[key]):>11}" for _, key, fmt in COLUMNS)

    lines = [f"{'system':<14}" + "".join(f"{head:>11}" for head, _, _ in COLUMNS)]
    for name, r in systems.items():
        if "error" in r:
            lines.append(f"{name:<14}  failed: {r['error']}")
            continue
        lines.append(row(name, r))
        for label, variant in r.get("variants", {}).items():  # the same store searched another way
            lines.append(row(f"{name}:{label}", {**r, **variant}))
    ok = {name: r for name, r in systems.items() if "error" not in r}
    lines.append(f"\n{'R@10 by category':<22}" + "".join(f"{name:>11}" for name in ok))
    for c in sorted({c for r in ok.values() for c in r["by_category"]}):
        cells = [r["by_category"].get(c, {}).get("R@10") for r in ok.values()]
        label = next(r["by_category"][c]["name"] for r in ok.values() if c in r["by_category"])
        lines.append(f"  {c} {label:<18}" + "".join(f"{x:>11.1f}" if x is not None else f"{'-':>11}"
                                                   for x in cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="path to locomo_dev.json (read in place, never copied)")
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    ap.add_argument("--no-captions", action="store_true", help="store turns without their photo captions")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds allowed per system")
    ap.add_argument("--worker", choices=("timing", *SYSTEMS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:  # one system in this (fresh) process
        Path(args.json).write_text(json.dumps(worker(args), indent=2))
        return 0

    t_start = time.perf_counter()
    cache_note = fill_cache(conversations(args.data, args.limit), not args.no_captions)
    print(f"vectors for the memory pass: {cache_note}")
    with tempfile.TemporaryDirectory(prefix="clawvm-peers-") as tmp:
        systems, refused = measure(args, Path(tmp))
    out: dict[str, Any] = {
        "data": str(Path(args.data).resolve()), "limit": args.limit, "k": K, "units": {
            "recall": "percent", "latency": "ms", "ingest": "s", "memory": "MiB"},
        "embedder": MiniLMEmbedder.name, "captions": not args.no_captions,
        "source": _locomo.source_state(), "network_refused": refused, "systems": systems, "ratios": {},
        "goal": None,
    }
    ours = systems.get("clawvm", {})
    for name, r in systems.items():
        if name != "clawvm" and "error" not in r and "error" not in ours and ours:
            out["ratios"][f"clawvm/{name}"] = ratios(ours, r)
    if ours and "error" not in ours and "error" not in systems.get("mem0", {"error": "not run"}):
        out["goal"] = goal(ours, systems["mem0"])
    out["elapsed_s"] = round(time.perf_counter() - t_start, 1)

    print()
    print(table(systems))
    for pair, r in out["ratios"].items():
        sp = r["speedup"]
        print(f"{pair}: R@10 x{r['R@10']}, ingest x{r['ingest_s']} (cached vectors "
              f"x{r['ingest_cached_vectors_s']}), memory x{r['mem_peak_delta_mb']}; "
              f"search speedup p50 {sp['search_p50_ms']}x / p95 {sp['search_p95_ms']}x "
              f"(excluding query embedding: p50 {sp['search_excl_embed_p50_ms']}x / "
              f"p95 {sp['search_excl_embed_p95_ms']}x)")
    if out["goal"]:
        g = out["goal"]
        print(f"goal ({g['target']}): including query embedding "
              f"{'MET' if g['met_including_query_embedding'] else 'NOT met'}; excluding it "
              f"{'MET' if g['met_excluding_query_embedding'] else 'NOT met'}")
    for name, r in systems.items():
        for note in r.get("notes", []):
            print(f"  {name}: {note}")
    print(f"connections refused by the offline guard: {refused or 'none'}")
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.json} ({out['elapsed_s']}s)")
    return 0 if all("error" not in r for r in systems.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
