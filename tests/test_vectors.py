"""Dense vector index: exact search, the projected screen above ``exact_below``, masks and removal."""

from __future__ import annotations

import numpy as np
import pytest

from clawvm.core.vectors import VectorIndex, normalize

DIM = 384


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    return normalize(rng.standard_normal((n, dim)).astype(np.float32))


def structured(rng: np.random.Generator, bases: np.ndarray, n: int, noise: float = 0.15) -> np.ndarray:
    """Random combinations of a few base directions plus noise: the low-rank shape of text embeddings."""
    coef = rng.standard_normal((n, len(bases))).astype(np.float32)
    return normalize(coef @ bases + noise * rng.standard_normal((n, bases.shape[1])).astype(np.float32))


def exact_top(x: np.ndarray, q: np.ndarray, k: int, rows: np.ndarray | None = None) -> list[int]:
    scores = x @ normalize(q)
    order = np.argsort(-scores, kind="stable")
    if rows is not None:
        order = np.array([r for r in order if r in set(rows.tolist())])
    return [int(r) for r in order[:k]]


def test_exact_search_returns_true_top_k_with_cosine_scores() -> None:
    rng = np.random.default_rng(0)
    x = unit(rng, 300)
    idx = VectorIndex(DIM)
    idx.add(np.arange(300), x * rng.uniform(0.5, 3.0, (300, 1)).astype(np.float32))  # scale is irrelevant
    assert len(idx) == 300
    for q in unit(rng, 5):
        hits = idx.search(q * 7.0, 10)
        assert [r for r, _ in hits] == exact_top(x, q, 10)
        for r, s in hits:
            assert s == pytest.approx(float(x[r] @ q), abs=1e-5)
    assert idx.search(x[42], 1)[0] == (42, pytest.approx(1.0, abs=1e-5))


def test_remove_get_and_re_add() -> None:
    rng = np.random.default_rng(1)
    x = unit(rng, 10)
    idx = VectorIndex(DIM)
    idx.add(np.arange(10), x)
    idx.remove(3)
    idx.remove(3)
    idx.remove(999)
    assert len(idx) == 9
    assert idx.get(3) is None
    assert 3 not in {r for r, _ in idx.search(x[3], 10)}
    got = idx.get(4)
    assert got is not None and np.allclose(got, x[4], atol=1e-6)
    idx.add([4], x[5:6])  # replacing a vector does not count twice
    assert len(idx) == 9
    assert idx.search(x[5], 2)[0][1] == pytest.approx(1.0, abs=1e-5)
    assert {r for r, _ in idx.search(x[5], 2)} == {4, 5}
    idx.add([3], x[3:4])
    assert idx.search(x[3], 1)[0][0] == 3 and len(idx) == 10


def test_allowed_mask_in_exact_mode() -> None:
    rng = np.random.default_rng(2)
    x = unit(rng, 50)
    idx = VectorIndex(DIM)
    idx.add(np.arange(50), x)
    allowed = np.zeros(50, dtype=bool)
    allowed[[1, 5, 9]] = True
    hits = idx.search(x[0], 10, allowed)
    assert [r for r, _ in hits] == exact_top(x, x[0], 10, np.array([1, 5, 9]))
    assert idx.search(x[0], 10, np.zeros(50, dtype=bool)) == []
    assert {r for r, _ in idx.search(x[0], 100, np.ones(4, dtype=bool))} == {0, 1, 2, 3}  # short mask


def test_empty_and_sparse_rows() -> None:
    idx = VectorIndex(8)
    assert idx.search(np.ones(8), 5) == []
    v = np.eye(8, dtype=np.float32)
    idx.add([5000], v[:1])  # far beyond the initial capacity
    idx.add([2], v[1:2])
    assert [r for r, _ in idx.search(v[0], 5)] == [5000, 2]
    assert idx.search(v[0], 0) == []


@pytest.fixture(scope="module")
def projected() -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    bases = unit(rng, 20)
    x = structured(rng, bases, 2000)
    idx = VectorIndex(DIM, exact_below=50)
    idx.add(np.arange(2000), x)
    return idx, x, bases


def test_projected_search_agrees_with_exact_search(
    projected: tuple[VectorIndex, np.ndarray, np.ndarray],
) -> None:
    idx, x, bases = projected
    rng = np.random.default_rng(4)
    queries = structured(rng, bases, 20)
    overlaps = []
    for q in queries:
        hits = idx.search(q, 10)
        assert len(hits) == 10
        truth = exact_top(x, q, 10)
        overlaps.append(len({r for r, _ in hits} & set(truth)))
        for r, s in hits:  # candidates are re-scored exactly
            assert s == pytest.approx(float(x[r] @ q), abs=1e-5)
        assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert idx._proj is not None, "the projected screen was never fitted"
    assert idx._proj.shape == (DIM, idx.proj_dim) and idx.proj_dim < DIM
    assert float(np.mean(overlaps)) >= 8.0, overlaps


def test_projected_mode_respects_masks_removal_and_new_rows(
    projected: tuple[VectorIndex, np.ndarray, np.ndarray],
) -> None:
    idx, x, bases = projected
    rng = np.random.default_rng(5)
    q = structured(rng, bases, 1)[0]
    assert idx.search(q, 10)  # fitted
    allowed = np.zeros(2000, dtype=bool)
    allowed[::3] = True  # 667 rows: still above exact_below, so the screen is used
    hits = idx.search(q, 10, allowed)
    assert len(hits) == 10 and all(r % 3 == 0 for r, _ in hits)
    few = np.zeros(2000, dtype=bool)
    few[[10, 20, 30]] = True  # below exact_below: exact over the three
    assert {r for r, _ in idx.search(q, 10, few)} == {10, 20, 30}

    best = idx.search(q, 1)[0][0]
    idx.remove(best)
    try:
        assert best not in {r for r, _ in idx.search(q, 50)}
        idx.add([2500], q[None, :])  # a new row after the fit is projected too
        assert idx.search(q, 1)[0] == (2500, pytest.approx(1.0, abs=1e-5))
    finally:
        idx.remove(2500)
        idx.add([best], x[best : best + 1])
