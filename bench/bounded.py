"""Bounded reads: the LangGraph adapter's search and list_namespaces, and ``Harness.tick()``, at two store
sizes side by side, with the large/small ratio of each (the goal: within 2x, i.e. flat in the size).

Each store holds N synthetic memories (``_synthetic.py``: texts, sessions and times from a fixed seed, so
the small store's memories are the first of the large one's), bulk-loaded with ``Store.put_many`` in
batches of 1000 exactly as the harness would have written them, with no embedder (recall is lexical:
this measures the read paths, not a model):

- 60% are LangGraph items (what ``ClawVMStore.put`` records): JSON content, in namespaces
  ``("users", "user<u>", "memories")`` of ~38 items, so the number of namespaces grows with N;
- 40% are conversation memories in sessions of ~10; the last 50 sessions' memories sit in the working
  tier (idle when the ticks start: the first tick pages them out); 100 of the last 2000 memories have a
  TTL that falls due during the ticks (a few per tick, the same number at both sizes); stored values
  are those of the ticks' start, as a regularly ticked store keeps them. The process's value and parse
  caches are emptied after the load (it scored every memory: the small store's would all stay cached).

Timed (milliseconds), warm, in one process, each round on the small then the large store (so a busy
machine slows both alike):

- ``search_p50_ms`` / ``search_p95_ms``: ``ClawVMStore.search(("users", "user<u>"), query=..., limit=5)``
  with 3 words of one of that user's items;
- ``list_namespaces_p50_ms``: ``ClawVMStore.list_namespaces()`` (LangGraph's default page: 100);
- ``tick_p50_ms`` / ``tick_p95_ms``: ``Harness.tick()`` with the clock 5 minutes later each time (expiry,
  idle page-out, one page of value refresh);
- ``ratio``: large / small for each.

    python bench/bounded.py --json bench/results/bounded.json [--n-small 10000 --n-large 100000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import Corpus
from clawvm import Harness, Kind, Memory, Tier
from clawvm.core.embed import count_tokens
from clawvm.integrations import langgraph as lg
from clawvm.store import Store, store_from_url
from clawvm.store import memory as memory_engine
from clawvm.vm import scoring
from clawvm.vm.scoring import DEFAULT_SCORING, value

ITEMS_PER_USER = 64  # memory indices per user block; 60% of them are items (~38 per namespace)
WORKING_SESSIONS = 50  # the newest sessions, whose conversation memories are in the working tier
TTL_TAIL = 2000  # the memories among which some have a TTL falling due during the ticks
TICK_STEP = timedelta(minutes=5)


def pct(xs: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(xs, dtype=np.float64), q)), 3) if xs else float("nan")


def is_item(i: int) -> bool:
    return i % 5 < 3


def build(corpus: Corpus, n: int) -> tuple[list[Memory], datetime, list[tuple[int, str]]]:
    """The ``n`` memories (values left for :func:`with_values`), the instant after the newest, and
    (user, text) of every item (the search targets)."""
    out: list[Memory] = []
    items: list[tuple[int, str]] = []
    first_working = (n - 1) // 25 - WORKING_SESSIONS
    end = corpus.t0 + timedelta(seconds=37 * (n - 1)) + timedelta(hours=3)
    for batch in corpus.batches(n):
        for j, text in enumerate(batch.texts):
            i = batch.start + j
            created = batch.created[j]
            if is_item(i):
                user = i // ITEMS_PER_USER
                ns = ("users", f"user{user}", "memories")
                key = f"k{i}"
                content = json.dumps({"text": text})
                info = {"namespace": list(ns), "key": key, "updated_at": created.isoformat()}
                tags = [
                    lg.TAG,
                    *(lg._ns_tag(ns[:d]) for d in range(1, len(ns) + 1)),
                    lg._item_tag(ns, key),
                    lg._path_tag(ns),
                ]
                out.append(
                    Memory(
                        content=content, content_type="application/json", kind=Kind.KNOWLEDGE, tags=tags,
                        metadata={lg.TAG: info}, created_at=created, tier=Tier.WORKING,
                        token_count=count_tokens(content),
                    )
                )
                items.append((user, text))
                continue
            session = batch.sessions[j]
            number = int(session[1:])
            ttl = None
            if i >= n - TTL_TAIL and i % 20 == 3:  # ~100 of them, due one every couple of minutes
                ttl = end + timedelta(minutes=i % 200)
            out.append(
                Memory(
                    content=text, kind=Kind.USER_INPUT, session_id=session, agent_id=batch.agents[j],
                    created_at=created, expires_at=ttl,
                    tier=Tier.WORKING if number > first_working else Tier.SHORT_TERM,
                    token_count=count_tokens(text),
                )
            )
    return out, end, items


def with_values(memories: list[Memory], now: datetime) -> list[Memory]:
    return [m.model_copy(update={"value": value(m, now, DEFAULT_SCORING)}) for m in memories]


@contextmanager
def opened_store(engine: str, directory: Path, name: str, pg_url: str | None) -> Iterator[Store]:
    if engine == "memory":
        yield store_from_url("memory://")
    elif engine == "sqlite":
        yield store_from_url(f"sqlite:///{directory}/{name}.db")
    else:
        import _scale_engines

        with _scale_engines.postgres_url(pg_url) as url:
            yield store_from_url(url.replace("schema=bench", f"schema={name}") if "schema=" in url else url)


@dataclass
class Setup:
    """One loaded store and what is timed on it."""

    n: int
    store: Store
    harness: Harness
    adapter: lg.ClawVMStore
    now: list[datetime]
    searches: list[tuple[tuple[str, ...], str]]
    namespaces: int
    load_s: float
    ms: dict[str, list[float]] = field(default_factory=dict)
    ticked: list[dict[str, int]] = field(default_factory=list)

    def time(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.ms.setdefault(name, []).append((time.perf_counter() - t0) * 1000.0)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "load_s": round(self.load_s, 1),
            "search_p50_ms": pct(self.ms["search"], 50),
            "search_p95_ms": pct(self.ms["search"], 95),
            "list_namespaces_p50_ms": pct(self.ms["list_namespaces"], 50),
            "tick_p50_ms": pct(self.ms["tick"], 50),
            "tick_p95_ms": pct(self.ms["tick"], 95),
            "tick_work": {k: sum(t[k] for t in self.ticked) for k in ("expired", "refreshed", "moved")},
            "namespaces": self.namespaces,
        }


def load(store: Store, corpus: Corpus, n: int, args: argparse.Namespace) -> Setup:
    rng = random.Random(n)
    memories, end, items = build(corpus, n)
    memories = with_values(memories, end)
    store.setup()
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        store.put_many(memories[start : start + 1000])
    load_s = time.perf_counter() - t0
    now = [end]
    h = Harness(store, None, clock=lambda: now[0])
    searches = []
    for _ in range(args.searches + args.warmup):
        user, text = items[rng.randrange(len(items))]
        words = text.split()
        searches.append((("users", f"user{user}"), " ".join(rng.sample(words, min(3, len(words))))))
    namespaces = len({u for u, _ in items})
    return Setup(n, store, h, lg.ClawVMStore(h), now, searches, namespaces, load_s)


def measure(setups: list[Setup], args: argparse.Namespace) -> None:
    """Every timing round runs on each store in turn, so a busy machine slows both sizes alike."""
    # the loads scored every memory, which leaves all of the small store's texts in the process's value
    # and parse caches and few of the large one's: start both cold, as a long-running process is
    scoring._signals_present.cache_clear()
    memory_engine._parse.cache_clear()
    for at in range(args.warmup + args.searches):
        for s in setups:
            ns, query = s.searches[at]
            if at < args.warmup:
                s.adapter.search(ns, query=query, limit=5)
            else:
                s.time("search", lambda s=s, ns=ns, query=query: s.adapter.search(ns, query=query, limit=5))
    for s in setups:
        ns, query = s.searches[0]
        assert s.adapter.search(ns, query=query, limit=5), "a search found nothing"
        assert len(s.adapter.list_namespaces()) == min(100, s.namespaces)
    for _ in range(args.list_calls):
        for s in setups:
            s.time("list_namespaces", s.adapter.list_namespaces)
    for _ in range(args.ticks):
        for s in setups:
            s.now[0] += TICK_STEP
            s.ticked.append(s.time("tick", s.harness.tick))


ROWS = ("search_p50_ms", "search_p95_ms", "list_namespaces_p50_ms", "tick_p50_ms", "tick_p95_ms")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-small", type=int, default=10_000, help="memories in the small store")
    ap.add_argument("--n-large", type=int, default=100_000, help="memories in the large store")
    ap.add_argument("--engine", choices=("sqlite", "memory", "postgres"), default="sqlite")
    ap.add_argument("--pg-url", default=None,
                    help="with --engine postgres: a server to use (default: a throwaway local one)")
    ap.add_argument("--searches", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--list-calls", type=int, default=50)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--json", dest="json_path", default=None, help="where to write the results")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    corpus = Corpus()
    sizes = (args.n_small, args.n_large)
    with tempfile.TemporaryDirectory(prefix="clawvm-bounded-") as tmp, ExitStack() as stack:
        setups = []
        for n in sizes:
            print(f"loading n={n} ({args.engine}) ...", flush=True)
            store = stack.enter_context(opened_store(args.engine, Path(tmp), f"bounded{n}", args.pg_url))
            stack.callback(store.close)
            setups.append(load(store, corpus, n, args))
            print(f"  {setups[-1].load_s:.1f}s", flush=True)
        print("timing, the two stores in turn ...", flush=True)
        measure(setups, args)
        runs = {s.n: s.summary() for s in setups}
    for n in sizes:
        print(f"  n={n}: work of the {args.ticks} ticks {runs[n]['tick_work']}")
    small, large = runs[args.n_small], runs[args.n_large]
    ratios = {k: round(large[k] / small[k], 2) if small[k] else float("nan") for k in ROWS}
    head = f"{'':<24}{args.n_small:>12}{args.n_large:>12}{'ratio':>10}"
    print(f"\nbounded reads, engine={args.engine}, milliseconds\n{head}")
    for k in ROWS:
        print(f"{k:<24}{small[k]:>12.3f}{large[k]:>12.3f}{ratios[k]:>10.2f}")
    print(f"{'namespaces':<24}{small['namespaces']:>12}{large['namespaces']:>12}")
    result = {
        "engine": args.engine,
        "sizes": [args.n_small, args.n_large],
        "runs": {str(n): r for n, r in runs.items()},
        "ratios": ratios,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json_path} ({result['elapsed_s']}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
