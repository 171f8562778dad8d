"""Dense vector index: exact search, the projected screen above ``exact_below``, its sign codes, masks."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm.core.vectors import (
    SAMPLED_CUT_ROWS,
    SPLIT_ROWS,
    VectorIndex,
    directed_only,
    highest_rows,
    normalize,
    sign_codes,
    split_directed,
    undirected_rows,
)

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


# ---- the sign codes that cut the rows the screen reads --------------------------------------------------
@pytest.fixture(scope="module")
def coded() -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    """3,000 rows with a screen that re-scores 20: the codes keep 10% (300) of them for the screen."""
    rng = np.random.default_rng(6)
    bases = unit(rng, 20)
    x = structured(rng, bases, 3000)
    idx = VectorIndex(DIM, exact_below=50, rescore=20, code_share=0.1)
    idx.add(np.arange(3000), x)
    idx.prepare()
    return idx, x, bases


def test_codes_cut_the_screened_rows_to_their_share_and_keep_the_nearest(
    coded: tuple[VectorIndex, np.ndarray, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    idx, x, bases = coded
    assert idx._codes is not None and idx._codes.shape[0] == DIM // 64
    valid = idx._has[: idx._hi]
    rng = np.random.default_rng(7)
    overlaps = []
    cut: list[int] = []  # rows each search's screen read
    nearest = idx._nearest_codes

    def spy(*args: object) -> np.ndarray | None:
        near = nearest(*args)  # type: ignore[arg-type]
        cut.append(-1 if near is None else len(near))
        return near

    monkeypatch.setattr(idx, "_nearest_codes", spy)
    for q in structured(rng, bases, 20):
        near = idx._nearest_codes(normalize(q), valid, len(idx), 20)
        assert near is not None
        assert 300 <= len(near) < 600, len(near)  # the share, plus the rows tied at the cut
        assert list(near) == sorted(set(near.tolist()))
        assert exact_top(x, q, 1)[0] in set(near.tolist())
        hits = idx.search(q, 10)
        overlaps.append(len({r for r, _ in hits} & set(exact_top(x, q, 10))))
        for r, s in hits:
            assert s == pytest.approx(float(x[r] @ normalize(q)), abs=1e-5)
    assert float(np.mean(overlaps)) >= 8.0, overlaps
    assert len(cut) == 40 and all(0 < c < 600 for c in cut), cut  # every search screened the cut rows


def test_codes_follow_masks_removal_growth_and_can_be_turned_off(
    coded: tuple[VectorIndex, np.ndarray, np.ndarray],
) -> None:
    idx, x, bases = coded
    q = structured(np.random.default_rng(8), bases, 1)[0]
    allowed = np.zeros(3000, dtype=bool)
    allowed[::2] = True  # 1,500 rows: the codes still cut them
    assert idx._nearest_codes(normalize(q), idx._has[:3000] & allowed, 1500, 20) is not None
    hits = idx.search(q, 10, allowed)
    assert len(hits) == 10 and all(r % 2 == 0 for r, _ in hits)

    best = idx.search(q, 1)[0][0]
    far = 40_000  # past the capacity: the codes grow with the matrices
    idx.remove(best)
    try:
        assert best not in {r for r, _ in idx.search(q, 50)}
        idx.add([far], q[None, :])  # a row added after the fit gets its code
        assert idx.search(q, 1)[0] == (far, pytest.approx(1.0, abs=1e-5))
        assert idx._codes is not None and idx._codes.shape[1] == len(idx._x) > far
        share = idx.code_share
        idx.code_share = 0  # off: the screen reads every row, and finds the same best row
        try:
            assert idx.search(q, 1)[0][0] == far
        finally:
            idx.code_share = share
    finally:
        idx.remove(far)
        idx.add([best], x[best : best + 1])
    assert idx.search(x[best], 1)[0][0] == best


def test_sign_codes_set_a_bit_per_dimension_above_the_mean() -> None:
    mean = np.zeros(70, dtype=np.float32)
    rows = -np.ones((2, 70), dtype=np.float32)
    rows[0, [0, 9, 69]] = 1.0  # bits 0, 9 and 69; 70 dims take two words
    codes = sign_codes(rows, mean)
    assert codes.shape == (2, 2) and codes.dtype == np.uint64
    assert [int(np.bitwise_count(c).sum()) for c in codes] == [3, 0]
    bits = np.unpackbits(codes[0].view(np.uint8))[:70]
    assert np.flatnonzero(bits).tolist() == [0, 9, 69]


def assert_codes_current(idx: VectorIndex) -> None:
    """Every row's stored code is its vector's code under the fitted mean; rows without a vector hold 0."""
    assert idx._codes is not None and idx._mean is not None
    assert idx._codes.shape == (-(-idx.dim // 64), len(idx._x))
    expected = sign_codes(idx._x, idx._mean).T
    expected[:, ~idx._has] = 0
    assert np.array_equal(idx._codes, expected)


def test_codes_stay_current_through_adds_removals_growth_and_a_refit() -> None:
    """At 100 dims (codes of two words, the second part-filled): each change keeps the codes equal to the
    vectors' own, including rows added between fits and the refit once the index has doubled."""
    rng = np.random.default_rng(9)
    idx = VectorIndex(100, exact_below=40, rescore=10, code_share=0.1)
    idx.add(np.arange(60), unit(rng, 60, 100))
    idx.prepare()
    assert_codes_current(idx)
    mean = idx._mean
    idx.add([60], unit(rng, 1, 100))  # one row
    idx.add(np.arange(61, 100), unit(rng, 39, 100))  # a batch
    idx.remove(5)
    idx.add([5], unit(rng, 1, 100))  # re-added
    idx.add([3000], unit(rng, 1, 100))  # past the capacity
    assert_codes_current(idx)
    assert idx._mean is mean  # no refit yet (101 rows, fitted at 60)
    idx.add(np.arange(100, 130), unit(rng, 30, 100))  # doubled: the next search refits
    idx.search(unit(rng, 1, 100)[0], 5)
    assert idx._mean is not mean and idx._fitted_at == 131
    assert_codes_current(idx)
    valid = idx._has[: idx._hi]
    q = unit(rng, 1, 100)[0]
    near = idx._nearest_codes(q, valid, len(idx), 10)
    assert near is not None
    differ = sign_codes(idx._x[: idx._hi], idx._mean) ^ sign_codes(q[None, :], idx._mean)
    same = 100 - np.array([int(np.unpackbits(row.view(np.uint8)).sum()) for row in differ])
    same[~valid] = -1
    keep = max(int(0.1 * len(idx)), 4 * 10)  # 4 x n_cand (40) is more than the share (13)
    cut = np.sort(same)[::-1][keep - 1]  # brute force: every valid row as good as the keep-th best
    assert set(near.tolist()) == set(np.flatnonzero(same >= cut).tolist())


@pytest.mark.parametrize("exact_below", [20_000, 500], ids=["exact", "projected"])
def test_equal_scores_keep_and_rank_the_highest_rows_first(exact_below: int) -> None:
    """Copies of one vector scattered among others: the exact scan and the projected screen both rank the
    highest rows (the later stored) first, and a limit that cuts the copies keeps the highest ones."""
    rng = np.random.default_rng(11)
    x = unit(rng, 3000)
    copies = np.sort(rng.choice(3000, 12, replace=False))
    x[copies] = x[copies[0]]
    idx = VectorIndex(DIM, exact_below=exact_below)
    idx.add(np.arange(3000), x)
    allowed = np.ones(3000, dtype=bool)
    allowed[copies[-1]] = False  # a masked copy is not a candidate at all
    for limit, mask in ((5, None), (12, None), (20, None), (5, allowed)):
        hits = idx.search(x[copies[0]], limit, mask)
        kept = copies if mask is None else copies[:-1]
        want = [int(r) for r in kept[::-1][:limit]]
        assert [r for r, _ in hits[: len(want)]] == want
        assert len({s for _, s in hits[: len(want)]}) == 1
    assert exact_below > 3000 or idx._proj is not None  # the projected screen did the search


@settings(max_examples=300, deadline=None)
@given(
    scales=st.lists(st.floats(min_value=-48, max_value=37), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
    zero_row=st.booleans(),
)
def test_the_quick_direction_check_agrees_with_normalising(
    scales: list[float], seed: int, zero_row: bool
) -> None:
    """undirected_rows settles most rows by their squared length alone: it finds exactly the rows that
    normalising leaves short of unit length, at every scale float32 holds (zero rows included)."""
    rng = np.random.default_rng(seed)
    v = np.stack([rng.normal(size=8) * 10.0**e for e in scales]).astype(np.float32)
    if zero_row:
        v[0] = 0.0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        lengths = np.linalg.norm(normalize(v), axis=-1)
    expected = np.flatnonzero(~(np.abs(lengths - 1.0) < 1e-3))
    assert undirected_rows(v).tolist() == expected.tolist()


def test_split_directed_keeps_the_rows_with_a_direction_in_order() -> None:
    """The one split the writers of vectors they did not make share (LangGraph puts, replay, migrate, the
    embed worker): zero, NaN and overflowing rows apart, the rest in order with their ids."""
    v = np.ones((5, 4), dtype=np.float32)
    v[1], v[3, 0], v[4] = 0.0, np.nan, 1e30
    kept, rows, without = split_directed(["a", "b", "c", "d", "e"], v)
    assert kept == ["a", "c"] and rows.tolist() == [[1.0] * 4] * 2 and without == ["b", "d", "e"]
    assert directed_only({"a": v[0], "b": v[1]}).keys() == {"a"} and directed_only({}) == {}
    nothing, empty, none = split_directed([], np.zeros((0, 4), dtype=np.float32))
    assert nothing == [] and empty.shape == (0, 4) and none == []


def _highest_by_counting_all(values: np.ndarray, keep: int) -> np.ndarray:
    """The rule :func:`highest_rows` keeps, by brute force: the value of the keep-th highest (1 at least),
    then every row at or above it."""
    ordered = np.sort(values)[::-1]
    cut = max(int(ordered[min(keep, len(values)) - 1]), 1)
    return np.flatnonzero(values >= cut)


@pytest.mark.parametrize("n", [1_000, SAMPLED_CUT_ROWS, 3 * SAMPLED_CUT_ROWS + 7])
@pytest.mark.parametrize("shape", ["binomial", "few values", "mostly zero", "one spike"])
def test_highest_rows_keeps_the_same_rows_whether_it_samples_or_counts_all(n: int, shape: str) -> None:
    """From ``SAMPLED_CUT_ROWS`` rows the cut is found from a sample first: the rows kept are exactly the
    ones a count of every value keeps, ties at the cut included, for any spread of the values."""
    rng = np.random.default_rng(n)
    top = 384
    if shape == "binomial":  # agreements of sign codes with a query: clustered around half the bits
        values = rng.binomial(top, 0.5, n)
    elif shape == "few values":  # long runs of ties
        values = rng.integers(190, 194, n)
    elif shape == "mostly zero":  # rows masked out are 0 and never kept
        values = np.where(rng.random(n) < 0.97, 0, rng.integers(1, top, n))
    else:  # a few rows far above the rest: a sample may miss them all
        values = rng.binomial(top, 0.5, n)
        values[rng.choice(n, 5, replace=False)] = top
    values = values.astype(np.uint16)
    for keep in (1, 5, 400, n // 12, n):
        assert np.array_equal(highest_rows(values, keep, top), _highest_by_counting_all(values, keep)), keep


@pytest.fixture(scope="module")
def large() -> VectorIndex:
    """An index past ``SPLIT_ROWS``, its code pass split over two threads."""
    rng = np.random.default_rng(5)
    n = SPLIT_ROWS + 1_000
    idx = VectorIndex(64, exact_below=1_000, rescore=40, code_share=0.01)
    idx.add(np.arange(n), rng.standard_normal((n, 64)).astype(np.float32))
    idx.prepare()
    return idx


def _queries(count: int = 5) -> np.ndarray:
    return np.random.default_rng(6).standard_normal((count, 64)).astype(np.float32)


def test_a_large_code_pass_split_over_two_threads_agrees_with_one(
    large: VectorIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From ``SPLIT_ROWS`` rows a search's code pass runs half on another thread: the rows it keeps and the
    hits are those of the pass on one thread."""
    n = large._n
    split = [large.search(q, 10) for q in _queries()]
    valid = large._has[: large._hi]
    kept_split = [large._nearest_codes(normalize(q), valid, n, 40) for q in _queries()]
    monkeypatch.setattr("clawvm.core.vectors.SPLIT_ROWS", n + 1)  # the same index, one thread
    assert [large.search(q, 10) for q in _queries()] == split
    for q, kept in zip(_queries(), kept_split, strict=True):
        one = large._nearest_codes(normalize(q), valid, n, 40)
        assert kept is not None and one is not None and np.array_equal(kept, one)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_searches_a_large_index_the_parent_searched(large: VectorIndex) -> None:
    """The parent's second thread is not in a forked child: the child's search makes its own instead of
    handing half its pass to a thread that is not there (it waited for ever)."""
    expected = [large.search(q, 10) for q in _queries(2)]  # the parent's thread exists now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer within 60 s or die by the alarm
        signal.alarm(60)
        ok = [large.search(q, 10) for q in _queries(2)] == expected
        os.write(write, b"same" if ok else b"differ")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    answer = os.read(read, 16)
    os.close(read)
    assert os.WIFEXITED(status), "the child's search never finished"
    assert answer == b"same"


def test_a_large_search_after_the_second_thread_shut_down_does_its_pass_alone(
    large: VectorIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At interpreter exit the thread pools take no more work (a search from a thread still running, or
    from an exit handler): the search does the whole pass itself and answers the same."""
    expected = [large.search(q, 10) for q in _queries(2)]
    closed = ThreadPoolExecutor(1)
    closed.shutdown()
    monkeypatch.setattr("clawvm.core.vectors._SECOND_CORE", closed)
    assert [large.search(q, 10) for q in _queries(2)] == expected


def test_large_searches_from_several_threads_at_once_answer_as_one_at_a_time(large: VectorIndex) -> None:
    """Searches that split their code pass queue for the one second thread; each keeps its own buffers
    (per thread) and its own agreement counts, so searches at once answer as they do alone."""
    queries = _queries(8)
    alone = [large.search(q, 10) for q in queries]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda q: large.search(q, 10), queries))
    assert together == alone
