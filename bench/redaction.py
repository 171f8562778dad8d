"""Redaction quality on the labelled set: span-level, kind-aware recall and precision.

    python bench/redaction.py [--data tests/data/redaction_cases.jsonl] [--json out.json] [--errors]

Each line of the set is ``{"text": ..., "spans": [{"kind", "start", "end"}, ...]}`` (lines without
spans are negatives: nothing may be found there). How the numbers are computed:

- a predicted span is a true positive when an expected span has the same kind and *exactly* the same
  start and end (the headline ``recall``/``precision``); each expected span matches at most once;
- ``recall = TP / expected spans`` and ``precision = TP / predicted spans``, over the whole set;
- ``recall_overlap``/``precision_overlap`` relax the boundaries (same kind, intersection over union of
  the two character ranges >= 0.5), to tell boundary slips from misses;
- per kind, the same exact-match numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clawvm.core.redact import PiiKind, redact

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "redaction_cases.jsonl"

Triple = tuple[str, int, int]


def exact(a: Triple, b: Triple) -> bool:
    return a == b


def overlapping(a: Triple, b: Triple) -> bool:
    if a[0] != b[0]:
        return False
    inter = min(a[2], b[2]) - max(a[1], b[1])
    union = max(a[2], b[2]) - min(a[1], b[1])
    return inter > 0 and inter / union >= 0.5


def match(expected: list[Triple], predicted: list[Triple], same: Callable[[Triple, Triple], bool]) -> int:
    """How many predicted spans pair with a distinct expected span."""
    free = list(expected)
    hits = 0
    for p in predicted:
        for i, e in enumerate(free):
            if same(p, e):
                hits += 1
                del free[i]
                break
    return hits


def evaluate(lines: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    tp = Counter[str]()
    tp_overlap = 0
    n_expected = Counter[str]()
    n_predicted = Counter[str]()
    errors: list[str] = []
    for case in lines:
        text = case["text"]
        expected = [(s["kind"], s["start"], s["end"]) for s in case["spans"]]
        predicted = [(s.kind.value, s.start, s.end) for s in redact(text).spans]
        n_expected.update(k for k, _, _ in expected)
        n_predicted.update(k for k, _, _ in predicted)
        for kind in PiiKind:
            mine = [e for e in expected if e[0] == kind.value]
            tp[kind.value] += match(mine, [p for p in predicted if p[0] == kind.value], exact)
        tp_overlap += match(expected, predicted, overlapping)
        for e in expected:
            if e not in predicted:
                errors.append(f"MISS {e[0]:<11} {text[e[1]:e[2]]!r}  in {text!r}")
        for p in predicted:
            if p not in expected:
                errors.append(f"FP   {p[0]:<11} {text[p[1]:p[2]]!r}  in {text!r}")
    total_tp, total_e, total_p = sum(tp.values()), sum(n_expected.values()), sum(n_predicted.values())
    result: dict[str, Any] = {
        "lines": len(lines),
        "negative_lines": sum(1 for c in lines if not c["spans"]),
        "expected_spans": total_e,
        "predicted_spans": total_p,
        "recall": round(total_tp / total_e, 4) if total_e else 1.0,
        "precision": round(total_tp / total_p, 4) if total_p else 1.0,
        "recall_overlap": round(tp_overlap / total_e, 4) if total_e else 1.0,
        "precision_overlap": round(tp_overlap / total_p, 4) if total_p else 1.0,
        "per_kind": {
            k.value: {
                "expected": n_expected[k.value],
                "predicted": n_predicted[k.value],
                "recall": round(tp[k.value] / n_expected[k.value], 4) if n_expected[k.value] else None,
                "precision": round(tp[k.value] / n_predicted[k.value], 4) if n_predicted[k.value] else None,
            }
            for k in PiiKind
        },
    }
    return result, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--errors", action="store_true", help="print every miss and false positive")
    args = parser.parse_args(argv)
    lines = [json.loads(raw) for raw in args.data.read_text(encoding="utf-8").splitlines() if raw.strip()]
    result, errors = evaluate(lines)
    if args.errors:
        for e in errors:
            print(e)
    print(f"lines {result['lines']} ({result['negative_lines']} negative), spans {result['expected_spans']}")
    print(f"recall {result['recall']:.4f}  precision {result['precision']:.4f}  (exact span + kind)")
    print(f"recall {result['recall_overlap']:.4f}  precision {result['precision_overlap']:.4f}  (IoU >= 0.5)")
    for kind, r in result["per_kind"].items():
        print(f"  {kind:<12} expected {r['expected']:>3}  predicted {r['predicted']:>3}  "
              f"recall {r['recall']}  precision {r['precision']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
