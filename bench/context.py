"""Context building on LoCoMo: how much of the evidence reaches the prompt under a token budget.

Each conversation is replayed session by session through a fresh harness as an agent would live it:
every turn recorded with its session date (plus one second per turn, to keep their order), ``tick()``
between sessions with the clock at the next session's date. Then, with the clock one day after the last
session and the agent in that session, every question gets a context at each budget
(``Harness.context(question, budget_tokens=B, session_id=<last session>)``).

Reported per budget: ``evidence_in_context`` (share of evidence turns whose memory is in the context),
``tokens_used`` (mean), ``build_p95_ms`` (query embedding excluded: vectors come from the on-disk cache;
``embed_query_p50_ms`` is reported apart), ``working_hit_rate`` (evidence already in the working tier
before the build) and ``eviction_regret`` (evidence archived or compressed when asked). Baselines computed
here on the same replay: ``sliding_window`` (the most recent turns that fit), ``bm25_packed`` (BM25 top
hits packed in rank order until the budget is full) and ``full_context`` (every turn; its token cost is
the conversation's). All lines are rendered the same way and counted with the same tokenizer.

    python bench/context.py --data ../shared/data/locomo/locomo_dev.json --budgets 500,1000,2000,4000 \
        --json bench/results/context.json [--preset hybrid-v3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _locomo
import clawvm
from clawvm.core.embed import count_tokens
from clawvm.core.model import Tier
from clawvm.recall.retrieval import dense_text
from clawvm.vm.context import render


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95)) if xs else 0.0


class Replay:
    """One conversation lived through a harness, with its memories mapped to dialogue ids."""

    def __init__(
        self, conv: _locomo.Conversation, vectors: np.ndarray, embedder: clawvm.Embedder,
        preset: str | None = None,
    ) -> None:
        self.conv = conv
        self.now = [next(iter(conv.dates.values()))]
        self.harness = clawvm.Harness.open(
            "memory://", embedder=embedder, clock=lambda: self.now[0], preset=preset
        )
        self.dia_of: dict[str, str] = {}
        self.id_of: dict[str, str] = {}
        self.order: list[clawvm.Memory] = []
        vec_iter = iter(vectors)
        for session, turns in conv.sessions.items():
            self.now[0] = turns[0].date
            self.harness.tick()
            for turn in turns:
                m = self.harness.record(
                    turn.content,
                    embedding=next(vec_iter),
                    kind="user_input",
                    session_id=session,
                    agent_id=turn.speaker,
                    created_at=turn.date + timedelta(seconds=turn.index),
                    metadata={"dia_id": turn.dia_id},
                )
                self.dia_of[m.id] = turn.dia_id
                self.id_of[turn.dia_id] = m.id
                self.order.append(m)
        self.last_session = list(conv.sessions)[-1]
        self.now[0] = self.now[0] + timedelta(days=1)
        self.harness.tick()
        self.lines = {m.id: render(m) for m in self.order}
        self.tokens = {i: count_tokens(line) for i, line in self.lines.items()}

    def sliding_window(self, budget: int) -> set[str]:
        chosen, used = set(), 0
        for m in reversed(self.order):
            if used + self.tokens[m.id] > budget:
                break
            chosen.add(m.id)
            used += self.tokens[m.id]
        return chosen

    def bm25_packed(self, question: str, budget: int) -> set[str]:
        cfg = clawvm.recall.retrieval.preset("bm25")
        hits = self.harness.recall_with(question, None, 300, cfg, self.harness.filters({}))
        chosen, used = set(), 0
        for h in hits:
            t = self.tokens.get(h.id)
            if t is None or used + t > budget:
                continue
            chosen.add(h.id)
            used += t
        return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="LoCoMo JSON (evaluation data, read in place)")
    ap.add_argument("--budgets", default="500,1000,2000,4000", help="comma-separated token budgets")
    ap.add_argument("--json", dest="json_path", help="write results here")
    ap.add_argument("--limit", type=int, default=0, help="only the first N questions per conversation")
    ap.add_argument("--preset", choices=sorted(clawvm.PRESETS), default=None,
                    help="recall preset of the harness (default: the default preset)")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]

    convs, report = _locomo.load(args.data)
    print(f"loaded {len(convs)} conversations; evidence: {report.summary()}")
    embedder = clawvm.Harness.open("memory://").embedder
    assert embedder is not None
    doc_cache = _locomo.VectorCache(embedder.name, embedder.dim)
    doc_vecs = [doc_cache.get_or_compute([t.content for t in c.turns], embedder.embed, "doc") for c in convs]
    doc_cache.save()
    q_cache = _locomo.VectorCache(embedder.name, embedder.dim)

    def query_vectors(h: clawvm.Harness, conv: _locomo.Conversation) -> np.ndarray:
        """As Harness.recall embeds them: retrieval.dense_text under the harness's preset, one at a time."""
        texts = [dense_text(h.store, q.question, h.config, h.filters({})) for q in conv.qa]
        vecs = q_cache.get_or_compute(
            texts, lambda ts: np.stack([embedder.embed_query(t) for t in ts]), "query"
        )
        q_cache.save()
        return vecs

    print(f"vectors: {doc_cache.describe()}")
    embed_ms = []
    for q in [q.question for q in convs[0].qa[:30]]:
        t0 = time.perf_counter()
        embedder.embed_query(q)
        embed_ms.append(1000 * (time.perf_counter() - t0))

    ours: dict[int, dict[str, list[float]]] = {
        b: {k: [] for k in ("ev", "tok", "ms", "hit", "regret")} for b in budgets
    }
    base: dict[str, dict[int, list[float]]] = {
        n: {b: [] for b in budgets} for n in ("sliding_window", "bm25_packed")
    }
    full_tokens: list[float] = []
    t_start = time.time()
    for conv, dv in zip(convs, doc_vecs, strict=True):
        replay = Replay(conv, dv, embedder, args.preset)
        h = replay.harness
        qv = query_vectors(h, conv)
        full_tokens.append(sum(replay.tokens.values()))
        qas = [(q, v) for q, v in zip(conv.qa, qv, strict=True) if q.evidence]
        if args.limit:
            qas = qas[: args.limit]
        for qa, vec in qas:
            ev_ids = [replay.id_of[d] for d in qa.evidence if d in replay.id_of]
            if not ev_ids:
                continue
            for b in budgets:
                before = h.store.get_many(ev_ids)
                in_working = sum(1 for m in before.values() if m.tier is Tier.WORKING)
                regret = sum(
                    1 for m in before.values() if m.tier is Tier.ARCHIVE or "compression" in m.metadata
                )
                t0 = time.perf_counter()
                ctx = h.context(qa.question, budget_tokens=b, session_id=replay.last_session, vector=vec)
                ours[b]["ms"].append(1000 * (time.perf_counter() - t0))
                got = set(ctx.ids)
                ours[b]["ev"].append(sum(1 for i in ev_ids if i in got) / len(ev_ids))
                ours[b]["tok"].append(ctx.tokens)
                ours[b]["hit"].append(in_working / len(ev_ids))
                ours[b]["regret"].append(regret / len(ev_ids))
                window = replay.sliding_window(b)
                base["sliding_window"][b].append(sum(1 for i in ev_ids if i in window) / len(ev_ids))
                packed = replay.bm25_packed(qa.question, b)
                base["bm25_packed"][b].append(sum(1 for i in ev_ids if i in packed) / len(ev_ids))
        h.close(wait=False)
        elapsed = time.time() - t_start
        print(f"  {conv.sample_id}: {len(qas)} questions x {len(budgets)} budgets ({elapsed:.0f}s)")

    result: dict[str, Any] = {
        "preset": clawvm.recall.retrieval.preset(args.preset).name,
        "by_budget": {},
        "baselines": {"sliding_window": {}, "bm25_packed": {}, "full_context": {}},
        "embed_query_p50_ms": round(statistics.median(embed_ms), 2),
        "questions": len(ours[budgets[0]]["ev"]),
        "source": _locomo.source_state(),
    }
    heads = ("budget", "ours", "bm25pk", "window", "tokens", "p95 ms", "w.hit", "regret")
    print("\n" + " ".join(f"{h:>7}" for h in heads))
    for b in budgets:
        o = ours[b]
        row = {
            "evidence_in_context": round(100 * statistics.mean(o["ev"]), 2),
            "tokens_used": round(statistics.mean(o["tok"]), 1),
            "build_p50_ms": round(statistics.median(o["ms"]), 2),
            "build_p95_ms": round(p95(o["ms"]), 2),
            "working_hit_rate": round(100 * statistics.mean(o["hit"]), 2),
            "eviction_regret": round(100 * statistics.mean(o["regret"]), 2),
        }
        result["by_budget"][str(b)] = row
        for name in ("sliding_window", "bm25_packed"):
            result["baselines"][name][str(b)] = {
                "evidence_in_context": round(100 * statistics.mean(base[name][b]), 2)
            }
        result["baselines"]["full_context"][str(b)] = {
            "evidence_in_context": 100.0,
            "tokens_used": round(statistics.mean(full_tokens), 1),
        }
        cells = (
            row["evidence_in_context"],
            result["baselines"]["bm25_packed"][str(b)]["evidence_in_context"],
            result["baselines"]["sliding_window"][str(b)]["evidence_in_context"],
            row["tokens_used"],
            row["build_p95_ms"],
            row["working_hit_rate"],
            row["eviction_regret"],
        )
        print(f"{b:>7} " + " ".join(f"{c:>7.1f}" for c in cells))
    print(
        f"full context: evidence 100% at {statistics.mean(full_tokens):.0f} tokens per conversation; "
        f"query embedding p50 {result['embed_query_p50_ms']} ms (excluded from build times)"
    )
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
