"""Hybrid recall configured as data: named presets, a pure fusion function, and the recall pipeline.

Fusion is a weighted sum of per-query, per-channel normalised scores. Equal-weight reciprocal-rank fusion
of BM25 with MiniLM is *worse* than BM25 alone on LoCoMo (R@5 45.3 vs 49.9), because the small dense
model is much weaker than BM25 there; weighting the channels by how much each can be trusted fixes that.
Weights were chosen on LoCoMo dev with ``bench/locomo.py`` (see the preset comments).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError
from .model import Filters, Memory
from .store import Query, Store


@dataclass(frozen=True)
class RecallConfig:
    """How one recall runs. ``weights`` maps channel name ("lexical", "dense") to its fusion weight."""

    name: str
    weights: dict[str, float] = field(default_factory=dict)
    candidates: int = 100  # per channel, before fusion

    def uses(self, channel: str) -> bool:
        return self.weights.get(channel, 0.0) > 0.0


PRESETS: dict[str, RecallConfig] = {
    # Chosen on LoCoMo dev (bench/locomo.py): lexical carries most of the signal, dense adds paraphrases.
    "hybrid": RecallConfig("hybrid", {"lexical": 0.7, "dense": 0.3}),
    "bm25": RecallConfig("bm25", {"lexical": 1.0}),
    "dense": RecallConfig("dense", {"dense": 1.0}),
}
DEFAULT_PRESET = "hybrid"


def preset(name: str | RecallConfig | None) -> RecallConfig:
    if isinstance(name, RecallConfig):
        return name
    key = name or DEFAULT_PRESET
    if key not in PRESETS:
        raise ConfigError(f"unknown recall preset {key!r}: use one of {sorted(PRESETS)}")
    return PRESETS[key]


@dataclass(frozen=True, slots=True)
class ChannelScore:
    raw: float
    normalized: float
    rank: int  # 1-based rank inside the channel
    weight: float


@dataclass(frozen=True, slots=True)
class Fused:
    id: str
    score: float
    channels: dict[str, ChannelScore]


def fuse(
    channels: dict[str, list[tuple[str, float]]], weights: dict[str, float], k: int | None = None
) -> list[Fused]:
    """Weighted sum of min-max normalised channel scores; the best ``k`` (all if None), best first.

    For each channel c with hits (id, s): n(s) = (s - min_c) / (max_c - min_c), or 1.0 when all its
    scores are equal. score(id) = sum_c weight_c * n_c(id); a channel that missed id adds 0. Ties go to
    the larger id (ids sort by creation time, so the newer memory wins).
    """
    normalized: dict[str, dict[str, tuple[float, float, int]]] = {}
    totals: dict[str, float] = {}
    for name, hits in channels.items():
        w = weights.get(name, 0.0)
        if w <= 0.0 or not hits:
            continue
        hi, lo = max(s for _, s in hits), min(s for _, s in hits)
        span = hi - lo
        part = normalized[name] = {}
        for rank, (ident, s) in enumerate(hits, start=1):
            n = (s - lo) / span if span > 0 else 1.0
            part[ident] = (s, n, rank)
            totals[ident] = totals.get(ident, 0.0) + w * n
    ranked = sorted(totals.items(), key=lambda kv: kv[0], reverse=True)
    ranked.sort(key=lambda kv: kv[1], reverse=True)  # stable: equal scores keep the newer id first
    return [
        Fused(
            ident,
            score,
            {c: ChannelScore(*part[ident], weights[c]) for c, part in normalized.items() if ident in part},
        )
        for ident, score in ranked[:k]
    ]


@dataclass(frozen=True)
class Recalled:
    """One recall hit: the memory, its fused score, and the per-channel breakdown (``explain``)."""

    memory: Memory
    score: float
    explain: dict[str, ChannelScore]

    @property
    def id(self) -> str:
        return self.memory.id


def run_recall(
    store: Store, query: str, vector: np.ndarray | None, k: int, cfg: RecallConfig, filters: Filters
) -> list[Recalled]:
    """The recall pipeline: per-channel candidates from the store, fusion, then the memories."""
    hits = store.query(
        Query(
            filters=filters,
            text=query if cfg.uses("lexical") else None,
            vector=vector if cfg.uses("dense") else None,
            limit=max(cfg.candidates, k),
        )
    )
    fused = fuse({"lexical": hits.lexical, "dense": hits.dense}, cfg.weights, k)
    found = store.get_many([f.id for f in fused])
    return [Recalled(found[f.id], f.score, f.channels) for f in fused if f.id in found]
