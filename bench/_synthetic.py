"""Synthetic memories with precomputed vectors, for engine benchmarks at scales no embedder reaches here.

- texts: 8-30 words from a Zipf-distributed vocabulary of pronounceable pseudo-words, plus two topic words
  per session (sessions of ~25 memories), so the lexical and context channels have structure to find;
- vectors: the unit-normalised sum of fixed random vectors of the text's words (weighted by rarity) plus
  noise, so texts that share words are close, as a real embedding would place them (384 dims, like MiniLM);
- queries: 3-4 distinctive words of one memory (the target) and the vector of those words; a query
  "finds" its target when the target is in the top k.

Everything follows from the seed: the first N memories of a larger run are those of a smaller one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

VOCAB = 20_000
BATCH = 1000  # memories are generated in blocks of this size (part of what the seed determines)
DIM = 384
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def vocabulary(seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < VOCAB:
        words["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))] = None
    return list(words)


@dataclass
class Batch:
    start: int
    texts: list[str]
    sessions: list[str]
    agents: list[str]
    tags: list[list[str]]
    created: list[datetime]
    vectors: np.ndarray  # (n, DIM) unit rows


class Corpus:
    """Deterministic synthetic memories; :meth:`batches` streams them, :meth:`queries` picks targets."""

    def __init__(self, seed: int = 7) -> None:
        self.seed = seed
        self.words = vocabulary(seed)
        ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
        p = 1.0 / ranks**1.05
        self.cdf = np.cumsum(p / p.sum())
        w = np.random.default_rng(seed).standard_normal((VOCAB, DIM)).astype(np.float32)
        # weighted by -log(frequency): rare words dominate, as content words do in a real embedding
        weight = -np.log(p / p.sum()).astype(np.float32)
        self.word_vectors = w / np.linalg.norm(w, axis=1, keepdims=True) * weight[:, None]
        self.t0 = datetime(2025, 1, 1, tzinfo=UTC)

    def _batch_words(self, start: int, n: int) -> list[list[int]]:
        """Word ids of memories ``start`` .. ``start + n - 1`` (``start`` a multiple of BATCH)."""
        rng = np.random.default_rng((self.seed, start))
        lengths = rng.integers(8, 31, n)
        draws = np.minimum(np.searchsorted(self.cdf, rng.random(int(lengths.sum()))), VOCAB - 1).tolist()
        out, at = [], 0
        for i, length in enumerate(lengths.tolist()):
            body = draws[at : at + length]
            at += length
            session = (start + i) // 25
            topic = [200 + (session * 2654435761 + k * 40503) % (VOCAB - 200) for k in (1, 2)]
            out.append([*body[: length // 2], *topic, *body[length // 2 :]])
        return out

    def vector_of(self, word_ids: list[int]) -> np.ndarray:
        v = self.word_vectors[word_ids].sum(axis=0)
        return (v / np.linalg.norm(v)).astype(np.float32)

    def batches(self, n: int) -> Iterator[Batch]:
        for start in range(0, n, BATCH):
            size = min(BATCH, n - start)
            idx = range(start, start + size)
            ids = self._batch_words(start, size)
            sums = np.stack([self.word_vectors[ws].sum(axis=0) for ws in ids])
            sums /= np.linalg.norm(sums, axis=1, keepdims=True)
            noise = np.random.default_rng((self.seed, start, 1)).standard_normal((size, DIM))
            vecs = sums + (0.3 * noise / np.sqrt(DIM)).astype(np.float32)  # noise of norm ~0.3
            yield Batch(
                start,
                [" ".join(self.words[w] for w in ws) for ws in ids],
                [f"s{i // 25}" for i in idx],
                [f"agent{(i // 25) % 7}" for i in idx],
                [[f"tag{(i * 7) % 50}"] if i % 3 == 0 else [] for i in idx],
                [self.t0 + timedelta(seconds=37 * i) for i in idx],
                (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32),
            )

    def queries(self, n_memories: int, count: int, seed: int = 11) -> list[tuple[int, str, np.ndarray]]:
        """``count`` (target index, query text, query vector): 3-4 of the target's rarer words."""
        rng = random.Random(seed)
        out = []
        for _ in range(count):
            target = rng.randrange(n_memories)
            first = target - target % BATCH
            ws = sorted(set(self._batch_words(first, target - first + 1)[-1]), key=lambda w: -w)[:6]
            # (a higher id is a rarer word)
            pick = rng.sample(ws, min(len(ws), rng.randint(3, 4)))
            out.append((target, " ".join(self.words[w] for w in pick), self.vector_of(pick)))
        return out
