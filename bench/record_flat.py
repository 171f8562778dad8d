"""Does ``record()`` stay flat as the store grows? Its p50 / p95 on stores of several sizes (10k, 100k, 1M
synthetic memories by default), side by side in one process: the records go round robin, one to each store
in turn (the first store of each round rotates), so the machine's load falls on every size alike and the
ratio of their tails is stable where their absolute figures are not.

Each store is ``bench/limits.py``'s cached build of that size (built first if missing: ~3 minutes at 1M),
copied for the run; the records are the same texts and precomputed vectors for every size, in the loaded
sessions (so their working tiers overflow and the background pager runs, as in ``limits.py``).

    .venv/bin/python bench/record_flat.py --json /tmp/record_flat.json

JSON: ``sizes``; ``record_p50_ms``, ``record_p95_ms``, ``record_p99_ms`` (each keyed by size);
``flat_ratio``: the largest store's p95 over the smallest's (1 is flat).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import clawvm
from _synthetic import Corpus
from limits import build, ms_of, pct


def measure(stores: dict[int, clawvm.Harness], records: int, seed: int) -> dict[int, list[float]]:
    """ms of each record, per store size, the sizes taking turns."""
    took: dict[int, list[float]] = {n: [] for n in stores}
    sizes = list(stores)
    batches = list(Corpus(seed=seed).batches(records))  # (a batch holds 1,000 at most)
    rows = [row for b in batches for row in zip(b.texts, b.sessions, b.vectors, strict=True)]
    for i, (text, session, v) in enumerate(rows):
        for n in sizes[i % len(sizes) :] + sizes[: i % len(sizes)]:
            took[n].append(
                ms_of(
                    lambda h=stores[n], t=text, s=session, v=v: h.record(
                        t, embedding=v, session_id=s, kind="observation"
                    )
                )[0]
            )
    return took


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="store sizes, comma-separated")
    ap.add_argument("--records", type=int, default=1000, help="records per store")
    ap.add_argument("--warmup", type=int, default=50, help="records per store before the timed ones")
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument(
        "--cache",
        default=os.environ.get("CLAWVM_BENCH_CACHE", "/tmp/clawvm-bench-cache"),
        help="where built stores are kept between runs (outside the repository)",
    )
    args = ap.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if len(sizes) < 2:
        ap.error("--sizes needs at least two sizes to compare")
    stores: dict[int, clawvm.Harness] = {}
    with tempfile.TemporaryDirectory(prefix="clawvm-record-flat-") as tmp:
        try:
            for n in sizes:
                built = build(n, Path(args.cache), print)
                work = Path(tmp) / str(n)
                work.mkdir()
                for name in ("store.db", "store.db.index"):  # not the bare FTS5 file: no use here
                    shutil.copy(built / name, work / name)
                stores[n] = clawvm.Harness.open(work / "store.db", embedder=None)
            measure(stores, args.warmup, seed=98)  # first reads of each store's pages, the first passes
            took = measure(stores, args.records, seed=99)
        finally:
            for h in stores.values():
                h.close()
    res: dict[str, Any] = {
        "sizes": sizes,
        "records": args.records,
        "timed": len(took[sizes[0]]),
        "record_p50_ms": {n: pct(took[n], 50) for n in sizes},
        "record_p95_ms": {n: pct(took[n], 95) for n in sizes},
        "record_p99_ms": {n: pct(took[n], 99) for n in sizes},
    }
    smallest, largest = sizes[0], sizes[-1]
    res["flat_ratio"] = round(res["record_p95_ms"][largest] / res["record_p95_ms"][smallest], 2)
    res["flat_ratio_p50"] = round(res["record_p50_ms"][largest] / res["record_p50_ms"][smallest], 2)
    print(f"\nrecord() by store size ({args.records} records each, round robin, precomputed vectors)")
    print(f"  {'memories':>10} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  p95 / p95 at {smallest}")
    for n in sizes:
        ratio = res["record_p95_ms"][n] / res["record_p95_ms"][smallest]
        print(
            f"  {n:>10} {res['record_p50_ms'][n]:>8} {res['record_p95_ms'][n]:>8} "
            f"{res['record_p99_ms'][n]:>8}  {ratio:.2f}"
        )
    Path(args.json).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
