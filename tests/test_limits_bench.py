"""bench/limits.py at a small N: the interface the checks rely on (its flags, the five ratios in its JSON)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from clawvm.store import snapshot

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_limits_writes_every_ratio_beside_its_absolute_figures(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import limits
    finally:  # the bench puts its folder on the path too: every entry goes
        sys.path[:] = [p for p in sys.path if p != str(BENCH)]
    out = tmp_path / "limits.json"
    argv = [
        "--n",
        "2000",
        "--json",
        str(out),
        "--cache",
        str(tmp_path / "cache"),
        "--queries",
        "20",
        "--warmup",
        "2",
        "--records",
        "40",
        "--ingest-n",
        "16",
        "--open-repeats",
        "1",
    ]
    assert limits.main(argv) == 0
    res = json.loads(out.read_text())
    for key in ("record_ratio_idle_bare", "record_floor_ratio"):
        assert isinstance(res[key], float) and res[key] > 0, key
    assert 0 < res["record_floor_p50_ms"] <= res["record_floor_p95_ms"]
    # the floor's records went to its journal (40 memories' JSON at least), none to the store
    assert res["record_floor_journal_bytes"] > 40 * 100 and res["record_floor_store_unchanged"] is True
    for key in ("open_ratio", "record_ratio", "recall_ratio", "e2e_ratio", "ingest_ratio"):
        assert isinstance(res[key], float) and res[key] > 0, key
        assert key in res["met"]
    assert res["n"] == 2000 and res["postings"] > 0 and res["vectors_mb"] > 0
    assert res["open_s"] > 0 and res["rss_open_mb"] > res["rss_store_mb"] > 0
    assert (
        res["record_p95_ms"] >= res["record_p50_ms"] > 0 and res["recall_p95_ms"] >= res["recall_p50_ms"] > 0
    )
    built = tmp_path / "cache" / f"limits-n2000-f{limits.FORMAT}-s{snapshot.FORMAT}"
    assert (built / "complete").exists()  # cached for the next run
