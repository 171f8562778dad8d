"""bench/peers.py end to end on a tiny LoCoMo-shaped file, with the two systems the dev extra installs.

mem0 is left out on purpose: it lives in the ``bench`` extra only. The run uses the real embedding model,
subprocess workers and the JSON contract of issue 8; vectors are cached under the test's own directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

FACTS = [
    "I adopted a grey kitten called Pepper from the shelter",
    "my sister is getting married in Lisbon next spring",
    "I finally fixed the leaking kitchen tap with a new washer",
    "the pottery class taught me how to centre clay on the wheel",
    "we drove to the coast and watched the surfers at dawn",
    "my manager approved the budget for the solar panels project",
    "I am reading a novel about a lighthouse keeper in Norway",
    "the marathon training plan says forty kilometres this week",
    "our band is rehearsing a cover of an old jazz standard",
    "I planted tomatoes, basil and chillies on the balcony",
    "the dentist said my wisdom tooth has to come out",
    "I switched my laptop to a keyboard with brown switches",
]
QUESTIONS = [  # (question, index of the fact that answers it, LoCoMo category)
    ("What is the name of the kitten that was adopted?", 0, 4),
    ("Where is the sister's wedding?", 1, 4),
    ("How was the kitchen tap repaired?", 2, 1),
    ("What vegetables and herbs are growing on the balcony?", 9, 4),
    ("Which tooth does the dentist want to remove?", 10, 2),
]


def conversation(n: int) -> dict[str, Any]:
    speakers = (f"Ana{n}", f"Ben{n}")
    turns = [{"speaker": speakers[i % 2], "dia_id": f"D{1 + i // 6}:{1 + i % 6}", "text": f"{fact} ({n})"}
             for i, fact in enumerate(FACTS)]
    qa = [{"question": q, "answer": FACTS[i], "evidence": [turns[i]["dia_id"]], "category": c}
          for q, i, c in QUESTIONS]
    qa.append({"question": "Is anything unanswerable?", "adversarial_answer": "no", "evidence": [],
               "category": 5})  # no usable evidence: excluded from recall
    return {
        "sample_id": f"conv-{n}",
        "conversation": {
            "speaker_a": speakers[0], "speaker_b": speakers[1],
            "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns[:6],
            "session_2_date_time": "10:04 am on 12 June, 2023", "session_2": turns[6:],
        },
        "qa": qa,
    }


def test_peers_bench_writes_the_issue_keys_with_sane_recall(tmp_path: Path) -> None:
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps([conversation(1), conversation(2)]))
    out = tmp_path / "peers.json"
    env = {**os.environ, "CLAWVM_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--data", str(data), "--json", str(out),
         "--systems", "clawvm", "langgraph"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())

    assert result["network_refused"] == []
    assert set(result["systems"]) == {"clawvm", "langgraph"}
    for name, system in result["systems"].items():
        for key in ("R@5", "R@10", "search_p50_ms", "search_p95_ms", "ingest_s", "mem_peak_delta_mb"):
            assert isinstance(system[key], float | int), (name, key)
        assert system["questions"] == 2 * len(QUESTIONS)  # the evidence-less item is left out
        assert system["turns"] == 2 * len(FACTS)
        assert 0 <= system["R@5"] <= system["R@10"] <= 100
        # each question names its fact's words: a broken dia_id mapping would score 0 here
        assert system["R@10"] >= 80, (name, system["R@10"])
        assert set(system["by_category"]) == {"1", "2", "4"}
        assert system["search_p50_ms"] <= system["search_p95_ms"]
        assert system["search_excl_embed_p50_ms"] <= system["search_p50_ms"]
    assert "track" in result["systems"]["clawvm"]["variants"]
    ratio = result["ratios"]["clawvm/langgraph"]
    assert ratio["R@10"] == round(
        result["systems"]["clawvm"]["R@10"] / result["systems"]["langgraph"]["R@10"], 4)
    assert result["goal"] is None  # mem0 did not run, so the mem0 goal is not judged
    assert "clawvm" in proc.stdout and "langgraph" in proc.stdout
