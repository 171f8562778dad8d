"""bench/locomo.py end to end on a tiny LoCoMo-shaped file: presets, the leave-one-conversation-out
check of the default's priors (``--held-out``) and recording into PostgreSQL (``--engine postgres``, on
the tests' server), with the real embedding model; vectors are cached under the test's own directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

import pg_server
from clawvm.store.postgres_url import split_url
from tiny_locomo import FACTS, QUESTIONS, conversation

ROOT = Path(__file__).resolve().parents[1]


def test_locomo_bench_scores_presets_and_the_held_out_check(tmp_path: Path) -> None:
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps([conversation(n) for n in (1, 2, 3)]))
    out = tmp_path / "locomo.json"
    env = {**os.environ, "CLAWVM_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "locomo.py"), "--data", str(data), "--json", str(out),
         "--preset", "hybrid", "bm25", "--held-out"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())

    assert result["n_questions"] == 3 * len(QUESTIONS)  # the evidence-less item is left out
    for name in ("hybrid", "bm25"):
        overall = result["presets"][name]["overall"]
        assert 0 <= overall["R@5"] <= overall["R@10"] <= 100
        assert overall["R@10"] >= 80, (name, overall)  # each question names its fact's words
    held = result["held_out"]
    assert [f["left_out"] for f in held["folds"]] == ["conv-1", "conv-2", "conv-3"]
    assert held["grid_points"] == 48
    for fold in held["folds"]:
        assert fold["chosen"].startswith("p") and "-g" in fold["chosen"]
        assert all(0 <= x <= 100 for x in fold["held_out"] + fold["default"])
    # the pooled default is the default preset scored on every conversation once
    assert held["pooled_default"][:2] == [result["presets"]["hybrid"]["overall"][k] for k in ("R@5", "R@10")]
    assert "held out: parameters chosen on the other 2 conversations" in proc.stdout


def test_locomo_bench_records_into_postgres_when_asked(tmp_path: Path) -> None:
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps([conversation(n) for n in (1, 2)]))
    out = tmp_path / "locomo.json"
    url = pg_server.store_url(tmp_path, "locomo")  # the test server; the bench names its own schemas
    env = {**os.environ, "CLAWVM_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "locomo.py"), "--data", str(data), "--json", str(out),
         "--preset", "hybrid", "--engine", "postgres", "--pg-url", url],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["engine"] == "postgres"
    assert result["n_questions"] == 2 * len(QUESTIONS)
    assert result["presets"]["hybrid"]["overall"]["R@10"] >= 80
    with psycopg.connect(split_url(url)[0]) as conn:  # each conversation went to a schema of its own
        counts = [conn.execute(f"SELECT count(*) FROM locomo_{i}.memories").fetchone() for i in range(2)]
    assert counts == [(len(FACTS),), (len(FACTS),)]
