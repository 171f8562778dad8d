"""Where the slowest records spend their time: ``record()`` timed phase by phase, with the cyclic GC's
collections and the background pager's passes that overlapped each call.

A diagnostic for ``bench/limits.py``'s ``record_ratio`` (its record step: precomputed vectors, sessions that
overflow their working tier, the background pager running). Each phase is a wrapped method of the record
path, timed with ``perf_counter_ns``; the table shows each phase's median over all records and its mean over
the slowest 5%, then how many of those overlapped a pager pass or a GC collection of over 0.5 ms. Run on a
store that ``bench/limits.py`` built (it copies it first):

    python bench/record_tail.py --store /tmp/clawvm-bench-cache/limits-n100000-f1 --records 1000
"""

from __future__ import annotations

import argparse
import functools
import gc
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import clawvm
import clawvm.harness.facade
from _synthetic import Corpus
from clawvm.store.index import SearchIndex
from clawvm.store.sqlite import SQLiteStore
from clawvm.vm.tiers import Pager
from clawvm.vm.working import WorkingTiers
from clawvm.write.commit import CommitPath

# (owner, attribute, phase): the record path's steps, outermost first
PHASES: list[tuple[Any, str, str]] = [
    (clawvm.harness.facade, "build_memory", "build and validate"),
    (Pager, "value_now", "value"),
    (WorkingTiers, "admit", "admit (write + view)"),
    (CommitPath, "_redacted", "redaction"),
    (SQLiteStore, "write", "store write"),
    (SQLiteStore, "_catch_up", "catch up"),
    (SQLiteStore, "_put_rows", "rows + index"),
    (SearchIndex, "upsert", "index upsert"),
    (SearchIndex, "set_vector", "index vector"),
    (CommitPath, "_notify", "listeners"),
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a directory bench/limits.py built (holds store.db)")
    ap.add_argument("--records", type=int, default=1000)
    args = ap.parse_args(argv)
    spent: dict[str, int] = {}
    caller = threading.get_ident()  # the pager thread runs some of the same steps: not counted

    def timed(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                if threading.get_ident() == caller:
                    spent[phase] = spent.get(phase, 0) + time.perf_counter_ns() - t

        return run

    for owner, name, phase in PHASES:
        setattr(owner, name, timed(getattr(owner, name), phase))
    passes: list[tuple[int, int]] = []
    run_pass = WorkingTiers.run_pass

    def pass_timed(self: WorkingTiers, now: Any, *rest: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return run_pass(self, now, *rest)
        finally:
            passes.append((t, time.perf_counter_ns()))

    WorkingTiers.run_pass = pass_timed  # type: ignore[method-assign]
    gc_started = [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != caller:
            return
        if phase == "start":
            gc_started[0] = time.perf_counter_ns()
        else:
            spent["gc"] = spent.get("gc", 0) + time.perf_counter_ns() - gc_started[0]

    with tempfile.TemporaryDirectory(prefix="clawvm-record-tail-") as tmp:
        shutil.copytree(args.store, Path(tmp) / "run")
        h = clawvm.Harness.open(Path(tmp) / "run" / "store.db", embedder=None)
        gc.callbacks.append(on_gc)
        rows: list[dict[str, int]] = []
        try:
            for batch in Corpus(seed=99).batches(args.records):
                for text, session, v in zip(batch.texts, batch.sessions, batch.vectors, strict=True):
                    spent.clear()
                    t = time.perf_counter_ns()
                    h.record(text, embedding=v, session_id=session, kind="observation")
                    rows.append({**spent, "total": time.perf_counter_ns() - t, "start": t})
        finally:
            gc.callbacks.remove(on_gc)
            h.close()
    total = np.array([r["total"] for r in rows]) / 1e6
    p50, p95 = np.percentile(total, 50), np.percentile(total, 95)
    slow = [r for r, ms in zip(rows, total, strict=True) if ms >= p95]
    print(f"{len(rows)} records: p50 {p50:.3f} ms, p95 {p95:.3f} ms")
    print(f"{'phase':<22}{'median ms':>10}{'slowest 5% mean ms':>20}")
    for phase in ["total", *(p for _, _, p in PHASES), "gc"]:
        every = np.array([r.get(phase, 0) for r in rows]) / 1e6
        worst = np.array([r.get(phase, 0) for r in slow]) / 1e6
        print(f"{phase:<22}{np.median(every):>10.3f}{worst.mean():>20.3f}")

    def overlaps(r: dict[str, int]) -> bool:
        return any(a < r["start"] + r["total"] and b > r["start"] for a, b in passes)

    print(
        f"pager passes {len(passes)}, {sum(b - a for a, b in passes) / 1e6:.0f} ms in all; records during"
        f" one: {sum(map(overlaps, rows))} of {len(rows)}, of the slowest 5% {sum(map(overlaps, slow))}"
        f" of {len(slow)}; slowest with a GC pause over 0.5 ms: {sum(r.get('gc', 0) > 5e5 for r in slow)}"
    )


if __name__ == "__main__":
    main()
