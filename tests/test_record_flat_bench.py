"""bench/record_flat.py at small sizes: every size timed, the flatness ratio from the figures it prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_record_flat_times_every_size_and_compares_the_largest_with_the_smallest(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import record_flat
    finally:  # the bench puts its folder on the path too: every entry goes
        sys.path[:] = [p for p in sys.path if p != str(BENCH)]
    out = tmp_path / "flat.json"
    # past one batch of the synthetic corpus (1,000): every record asked for is timed
    argv = ["--sizes", "1500,600", "--records", "1010", "--warmup", "3", "--json", str(out)]
    assert record_flat.main([*argv, "--cache", str(tmp_path / "cache")]) == 0
    res = json.loads(out.read_text())
    assert res["sizes"] == [600, 1500] and res["records"] == res["timed"] == 1010
    for n in ("600", "1500"):
        assert 0 < res["record_p50_ms"][n] <= res["record_p95_ms"][n] <= res["record_p99_ms"][n]
    expected = res["record_p95_ms"]["1500"] / res["record_p95_ms"]["600"]
    assert abs(res["flat_ratio"] - expected) < 0.01
