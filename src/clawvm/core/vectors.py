"""In-process dense vector index over unit-normalised float32 rows (cosine = dot product).

Chosen by measurement on this 2-core machine (see ``bench/recall_scale.py``):
- exact ``X @ q`` over 100k×384 float32 takes 10 ms median / 13.5 ms p95 — memory-bound, over budget;
- HNSW libraries answer in ~0.3 ms but take 50–120 s to build 100k on 2 cores and must be rebuilt or
  maintained on every write, which fights ``record()`` at 2 ms;
- a PCA-projected copy (96 dims) screened exactly, then an exact float32 re-score of the best
  candidates: 1.6 ms median / 3.3 ms p95 at 100k, no build step beyond a small SVD, and writes stay O(1).
So small indexes are searched exactly, and above ``exact_below`` rows the projected screen is used. The
projection is refitted when the index has doubled since the last fit.

Before the screen, a sign code cuts the rows it reads (``code_share``): each row keeps one bit per dimension
(above or below the fitted mean), and the rows whose code is nearest the query's in Hamming distance, a
share of the valid ones, are the only ones screened. Reading 48 bytes a row instead of the screen's 384 is
what makes it pay: at 100k rows the full screen reads 38 MB in ~5 ms on one core, the codes 4.8 MB in ~1 ms.
The codes keep 2% of the rows (at least 4x the re-scored 1,600), fewer than the screen once read: on
near-uniform vectors the 96 projected dimensions hold a quarter of the variance and rank worse than the
codes' 384 bits, so a tighter cut with more rows re-scored exactly finds more and reads less (see
:data:`CODE_SHARE`). On 100k MiniLM vectors (of the synthetic corpus's texts), 99.5% of each question's
exact top 10 are among the codes' nearest 4% of rows, 98.6% among 2%. ``code_share=0`` turns the cut off.

The scans are single-threaded (:func:`matvec`, NumPy's own SIMD loop) rather than BLAS ``@``: a BLAS
matrix-vector product splits over its thread pool, whose threads spin and wait on a machine whose cores are
busy. On this 2-core machine under load, 100k x 96 took 13.5 ms with ``@`` and 3.1 ms single-threaded;
20k x 384 (the exact scan), 15.4 vs 1.9 ms. The one exception is the code pass of a large index (from
:data:`SPLIT_ROWS`), split in two halves, the second on one thread kept for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

_K = TypeVar("_K")


def normalize(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    if v.ndim == 1:  # one query: a dot product is ~5x cheaper than linalg.norm's general path
        n1 = float(np.sqrt(v @ v))
        return v / n1 if n1 > 0 else v.copy()
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.where(n == 0, 1.0, n)


#: Squared lengths between which a float32 row normalises to unit length for certain: far from the
#: squares' underflow (1e-38) and overflow (3e38), whatever the spread of the row's values.
_SAFE_SQUARED = (1e-30, 1e30)


def undirected_rows(v: np.ndarray) -> np.ndarray:
    """The indices of the rows of ``v`` (2-D, finite) that :func:`normalize` cannot make unit length: zero
    rows, and rows whose length under- or overflows float32. Such a row has no direction: its cosine with
    every query is 0, so a search never finds it, and a fusion that normalises scores counts it as a
    real score.

    Every record with a vector asks (twice: the write path and the engine), so rows whose squared length
    lies well inside float32's range, where normalising cannot fail, are settled by one dot product per
    row (~5 us for one row, against ~30 us for normalising and measuring it)."""
    v = np.asarray(v, dtype=np.float32)
    # summed in float64, a float32 row's squares neither over- nor underflow: no warning to silence (an
    # errstate block cost as much as the sum); a NaN length passes neither comparison, and is looked at below
    squared = np.einsum("ij,ij->i", v, v, dtype=np.float64)
    if len(squared) == 1:  # a record's one vector: compared as a Python float, cheaper than min and max
        directed = _SAFE_SQUARED[0] < float(squared[0]) < _SAFE_SQUARED[1]
    else:
        directed = not len(squared) or (_SAFE_SQUARED[0] < squared.min() and squared.max() < _SAFE_SQUARED[1])
    if directed:
        return np.empty(0, dtype=np.intp)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # what is being looked for
        lengths = np.linalg.norm(normalize(v), axis=-1).reshape(-1)
    # a unit row is within float32 rounding of 1; NaN (from an overflowed length) compares false too
    return np.flatnonzero(~(np.abs(lengths - 1.0) < 1e-3))


def split_directed(ids: Sequence[_K], vectors: np.ndarray) -> tuple[list[_K], np.ndarray, list[_K]]:
    """``ids`` (one per row of the 2-D ``vectors``) split by :func:`undirected_rows`: the ids whose row has
    a direction, those rows (in order), and the ids whose row has none (a zero, NaN or out-of-range row).

    A store refuses a whole write for one such row (:func:`clawvm.store.base.check_stored_vectors`), so a
    writer that takes vectors it did not make (a model's answer, an older store's rows) stores the first
    part and leaves the rest without a vector: lexical search finds those memories, cosine never would."""
    v = np.asarray(vectors, dtype=np.float32)
    bad = undirected_rows(v) if len(ids) else np.empty(0, dtype=np.intp)
    if not len(bad):  # the usual case: nothing copied
        return list(ids), v, []
    keep = np.ones(len(ids), dtype=bool)
    keep[bad] = False
    return [i for i, k in zip(ids, keep, strict=True) if k], v[keep], [ids[int(n)] for n in bad]


def directed_only(found: Mapping[_K, np.ndarray]) -> dict[_K, np.ndarray]:
    """The vectors of ``found`` (rows of one length, by id) that have a direction (:func:`split_directed`)."""
    if not found:
        return {}
    kept, vectors, _ = split_directed(list(found), np.stack(list(found.values())))
    return dict(zip(kept, vectors, strict=True))


def matvec(m: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``m @ v`` for a (rows, dim) float32 matrix, on the calling thread (see the module docstring)."""
    out: np.ndarray = np.einsum("ij,j->i", m, v)
    return out


#: How many candidates the projected screen passes on to be scored exactly (at least 4x the hits asked).
RESCORE = 1600
#: The share of the valid rows whose sign codes are nearest the query's, the only rows the screen reads
#: (at least 4x ``RESCORE``). Measured on both kinds of vectors (exact top 10 found among 100 hits): at 100k
#: MiniLM vectors 99.8% (8% and 400 before: 99.4%), synthetic near-uniform ones 93.5% (72.9%), for ~7% more
#: time; at 1M synthetic 84.6% (54.7%) in 0.64x the time (14.7 ms p50 against 23.1, order rotated).
CODE_SHARE = 0.02
#: From this many rows a search's code pass is split over two threads (at 1M rows it reads 48 MB).
SPLIT_ROWS = 262_144
#: From this many rows the code cut is found from a sample first (see :func:`highest_rows`).
SAMPLED_CUT_ROWS = 65_536


class VectorIndex:
    """Rows are the engine's dense row numbers; a row without a vector never matches.

    ``rescore`` and ``code_share`` are search settings, not part of what is indexed: an index read back
    from a snapshot searches with the running code's (:data:`RESCORE`, :data:`CODE_SHARE`), so that a file
    answers alike whether its index was mapped or rebuilt."""

    def __init__(
        self,
        dim: int,
        exact_below: int = 20_000,
        proj_dim: int = 96,
        rescore: int = RESCORE,
        code_share: float = CODE_SHARE,
    ) -> None:
        self.dim = dim
        self.exact_below = exact_below
        self.proj_dim = min(proj_dim, dim)
        self.rescore = rescore
        self.code_share = code_share
        self._x = np.zeros((1024, dim), dtype=np.float32)
        self._has = np.zeros(1024, dtype=bool)
        self._n = 0  # number of rows with a vector
        self._hi = 0  # one past the highest row ever given a vector
        self._proj: np.ndarray | None = None  # (dim, proj_dim)
        self._xp: np.ndarray | None = None  # projected rows
        self._mean: np.ndarray | None = None  # (dim,): the sign codes' threshold, fitted with the projection
        # (words, rows) uint64, a row's code down a column: bit d set when x[d] > mean[d]. Word-major, so
        # that the Hamming pass reads each word of every row contiguously (~3x faster than row-major)
        self._codes: np.ndarray | None = None
        self._fitted_at = 0
        self._lock = threading.Lock()  # guards the projection refit only

    def __len__(self) -> int:
        return self._n

    def _grow(self, row: int) -> None:
        if row >= len(self._has):
            size = max(row + 1, 2 * len(self._has))
            x = np.zeros((size, self.dim), dtype=np.float32)
            x[: len(self._x)] = self._x
            has = np.zeros(size, dtype=bool)
            has[: len(self._has)] = self._has
            self._x, self._has = x, has
            if self._xp is not None:
                xp = np.zeros((size, self.proj_dim), dtype=np.float32)
                xp[: len(self._xp)] = self._xp
                self._xp = xp
            if self._codes is not None:
                codes = np.zeros((len(self._codes), size), dtype=np.uint64)
                codes[:, : self._codes.shape[1]] = self._codes
                self._codes = codes

    def add(self, rows: np.ndarray | list[int], vectors: np.ndarray) -> None:
        if len(rows) == 1:  # a record's one vector: scalar indexing (~18 us against ~28 us batched)
            self._add_one(int(rows[0]), np.asarray(vectors, dtype=np.float32).reshape(self.dim))
            return
        rows = np.asarray(rows, dtype=np.int64)
        vecs = normalize(np.asarray(vectors, dtype=np.float32).reshape(len(rows), self.dim))
        if len(rows) == 0:
            return
        self._grow(int(rows.max()))
        self._hi = max(self._hi, int(rows.max()) + 1)
        self._n += int((~self._has[rows]).sum())
        self._x[rows] = vecs
        self._has[rows] = True
        if self._proj is not None and self._xp is not None:
            self._xp[rows] = vecs @ self._proj
        if self._mean is not None and self._codes is not None:
            self._codes[:, rows] = sign_codes(vecs, self._mean).T

    def _add_one(self, row: int, vector: np.ndarray) -> None:
        # the batched path's arithmetic exactly (its 2-D normalize, a one-row matmul): an index rebuilt
        # from the rows in batches must score as the one that took them one by one
        vecs = normalize(vector.reshape(1, self.dim))
        self._grow(row)
        self._hi = max(self._hi, row + 1)
        if not self._has[row]:
            self._n += 1
        self._x[row] = vecs[0]
        self._has[row] = True
        if self._proj is not None and self._xp is not None:
            self._xp[row] = (vecs @ self._proj)[0]
        if self._mean is not None and self._codes is not None:
            self._codes[:, row] = sign_codes(vecs, self._mean)[0]

    def remove(self, row: int) -> None:
        if row < len(self._has) and self._has[row]:
            self._has[row] = False
            self._x[row] = 0
            if self._xp is not None:
                self._xp[row] = 0
            if self._codes is not None:
                self._codes[:, row] = 0
            self._n -= 1

    def get(self, row: int) -> np.ndarray | None:
        if row < len(self._has) and self._has[row]:
            vector: np.ndarray = self._x[row].copy()
            return vector
        return None

    def prepare(self) -> bool:
        """Fit the search projection now if the index is big enough (else the first search does); True when
        it was fitted now."""
        fitted_at = self._fitted_at
        self._maybe_fit()
        return self._fitted_at != fitted_at

    def _maybe_fit(self) -> None:
        if self._n < self.exact_below or (self._proj is not None and self._n < 2 * self._fitted_at):
            return
        with self._lock:
            rows = np.flatnonzero(self._has)
            sample = self._x[rows[:: max(1, len(rows) // 8000)]]
            mean = sample.mean(axis=0)
            centered = sample - mean
            # top principal directions from the covariance's eigenvectors: 25x faster than an SVD here
            _, eigvecs = np.linalg.eigh(centered.T @ centered)
            proj = np.ascontiguousarray(eigvecs[:, ::-1][:, : self.proj_dim])
            xp = np.ascontiguousarray(self._x @ proj)
            codes = np.zeros((code_words(self.dim), len(self._x)), dtype=np.uint64)
            for start in range(0, len(self._x), _CODE_CHUNK):  # a bool matrix of every row at once is big
                chunk = self._x[start : start + _CODE_CHUNK]
                codes[:, start : start + len(chunk)] = sign_codes(chunk, mean).T
            codes[:, ~self._has] = 0
            # set together, once whole (the engines never search while they write, so no search sees
            # them half set; this keeps a future one that does from reading half-filled codes)
            self._xp, self._proj, self._codes, self._mean = xp, proj, codes, mean
            self._fitted_at = self._n

    def search(
        self, query: np.ndarray, limit: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """Top ``limit`` (row, cosine) pairs; ``allowed`` is an optional boolean row mask."""
        if self._n == 0 or limit <= 0:
            return []
        q = normalize(np.asarray(query, dtype=np.float32).reshape(self.dim))
        hi = self._hi  # no row at or past it has a vector: masks are cut there, not copied to capacity
        valid = self._has[:hi] if allowed is None else self._has[:hi] & _fit(allowed, hi)
        n_valid = int(np.count_nonzero(valid)) if allowed is not None else self._n
        if n_valid == 0:
            return []
        self._maybe_fit()
        if n_valid < self.exact_below or self._proj is None or self._xp is None:
            rows = np.flatnonzero(valid)
            # most rows qualify: one contiguous matmul beats gathering them
            scores = matvec(self._x[:hi], q)[rows] if 3 * n_valid >= hi else matvec(self._x[rows], q)
        else:
            n_cand = min(max(self.rescore, 4 * limit), n_valid)
            near = self._nearest_codes(q, valid, n_valid, n_cand)
            if near is None:
                screen = matvec(self._xp[:hi], q @ self._proj)
                np.putmask(screen, ~valid, -np.inf)
                rows = top_indices(screen, n_cand)
            else:
                rows = near[top_indices(self._screen_of(near, q @ self._proj), n_cand)]
            scores = matvec(self._x[rows], q)
        rows, scores = best_rows(rows, scores, limit)
        return list(zip(rows.tolist(), scores.tolist(), strict=True))

    def _nearest_codes(
        self, q: np.ndarray, valid: np.ndarray, n_valid: int, n_cand: int
    ) -> np.ndarray | None:
        """The valid rows, in order, whose sign codes are nearest the query's: at least ``code_share`` of
        the valid rows and ``4 * n_cand`` (rows tied at the cut all come in); None when that would not
        halve the rows the screen reads (so a ``code_share`` of 0.5 or more is the same as 0), or the codes
        are not fitted."""
        keep = max(int(self.code_share * n_valid), 4 * n_cand)
        if self._codes is None or self._mean is None or self.code_share <= 0 or 2 * keep > n_valid:
            return None
        hi = len(valid)
        code = sign_codes(q.reshape(1, self.dim), self._mean)[0]
        words = len(code)
        same = np.full(hi, 64 * words, dtype=np.uint16)  # bits the row's code shares with the query's
        other = None
        if hi >= SPLIT_ROWS:  # the second half on the other core: NumPy's loops let go of the GIL
            half = (hi // 2 // _BLOCK) * _BLOCK
            other = _on_second_core(_agreement, self._codes, code, same, half, hi)
        _agreement(self._codes, code, same, 0, hi if other is None else half)
        if other is not None:
            other.result()
        if n_valid < hi:
            same[~valid] = 0
        near = highest_rows(same, keep, 64 * words)
        return near if len(near) >= n_cand else None  # (only codes opposite the query's in every bit)

    def _screen_of(self, rows: np.ndarray, qp: np.ndarray) -> np.ndarray:
        """The projected screen's scores of ``rows``, gathered a block at a time into a reused buffer."""
        assert self._xp is not None
        out = np.empty(len(rows), dtype=np.float32)
        block = _scratch("gather", (_GATHER, self.proj_dim), np.float32)
        for start in range(0, len(rows), _GATHER):
            part = rows[start : start + _GATHER]
            # mode="clip": the rows are in range, and the default mode buffers the gather to check them
            got = np.take(self._xp, part, axis=0, out=block[: len(part)], mode="clip")
            out[start : start + len(part)] = matvec(got, qp)
        return out


def highest_rows(values: np.ndarray, keep: int, top: int) -> np.ndarray:
    """The rows, in order, of the ``keep`` highest of ``values`` (integers in 0..``top``) and of every row
    tied with the last of those; never a row at 0. The cut comes from the counts of each value, not a
    partition (the values are few and tied). From :data:`SAMPLED_CUT_ROWS` rows the counts of a 1-in-16
    sample first give a cut safely below the true one, and only the rows above it are counted: the same
    rows, for a count over a fraction of them."""
    if len(values) >= SAMPLED_CUT_ROWS:
        sample = values[::16]
        low = _cut(sample, min(len(sample), keep // 8 + 64), top)  # ~2x the rows wanted, and some
        above = np.flatnonzero(values >= low)
        if len(above) >= keep:  # the true cut is at or above ``low``: every row it keeps is here
            return above[values[above] >= _cut(values[above], keep, top)]
    return np.flatnonzero(values >= _cut(values, keep, top))


def _cut(values: np.ndarray, keep: int, top: int) -> int:
    """The highest value that at least ``keep`` of ``values`` reach (1 at the least)."""
    at_least = np.cumsum(np.bincount(values, minlength=top + 1)[::-1])
    return max(top - int(np.searchsorted(at_least, keep)), 1)


def _agreement(codes: np.ndarray, code: np.ndarray, same: np.ndarray, start: int, stop: int) -> None:
    """Subtract from ``same[start:stop]`` the bits in which each row's code differs from ``code``, a block
    at a time through this thread's buffers."""
    differ, count = _scratch("differ", (_BLOCK,), np.uint64), _scratch("count", (_BLOCK,), np.uint8)
    for first in range(start, stop, _BLOCK):
        last = min(stop, first + _BLOCK)
        d, c = differ[: last - first], count[: last - first]
        for word in range(len(code)):
            np.bitwise_xor(codes[word, first:last], code[word], out=d)
            np.bitwise_count(d, out=c)
            np.subtract(same[first:last], c, out=same[first:last])


_SECOND_CORE: ThreadPoolExecutor | None = None
_SECOND_CORE_LOCK = threading.Lock()


def _on_second_core(fn: Callable[..., None], *args: Any) -> Future[None] | None:
    """``fn(*args)`` begun on the one thread that takes half of a large code pass (made on first use;
    concurrent searches queue for it), or None when it cannot take work (the interpreter is exiting):
    the caller then does it all."""
    global _SECOND_CORE
    with _SECOND_CORE_LOCK:
        if _SECOND_CORE is None:
            _SECOND_CORE = ThreadPoolExecutor(1, thread_name_prefix="clawvm-code-pass")
        try:
            return _SECOND_CORE.submit(fn, *args)
        except RuntimeError:  # shut down at exit: a search from a thread still running does its pass alone
            return None


def _forget_second_core() -> None:
    """In a forked child: the parent's thread is not there, and a pool that lists it would never run the
    half handed to it (the search would wait for ever); the child makes its own on first use."""
    global _SECOND_CORE, _SECOND_CORE_LOCK
    _SECOND_CORE, _SECOND_CORE_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_second_core)


def best_rows(rows: np.ndarray, scores: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``limit`` best of ``rows`` by ``scores``, best first; of equal scores the highest rows (the later
    stored) are kept and come first: the tie rule of every search channel and engine (see
    :class:`clawvm.store.base.Query`). Only the candidates are touched, never the index, and ties (rare)
    cost only when there are some: one count at the cut, one look at the sorted scores."""
    if len(rows) > limit:
        top = np.argpartition(-scores, limit - 1)[:limit]
        floor = scores[top].min()
        if np.count_nonzero(scores == floor) > np.count_nonzero(scores[top] == floor):
            # the cut falls inside a run of equal scores: of that run, the highest rows stay
            sure, tied = top[scores[top] > floor], np.flatnonzero(scores == floor)
            tied = tied[np.argsort(rows[tied])[len(tied) - (limit - len(sure)) :]]
            top = np.concatenate([sure, tied])
        rows, scores = rows[top], scores[top]
    order = np.argsort(-scores, kind="stable")
    rows, scores = rows[order], scores[order]
    if len(scores) > 1 and (scores[1:] == scores[:-1]).any():  # equal scores: the highest row first
        order = np.lexsort((-rows, -scores))
        rows, scores = rows[order], scores[order]
    return rows, scores


def code_words(dim: int) -> int:
    """64-bit words in a sign code of ``dim`` bits."""
    return -(-dim // 64)


def sign_codes(rows: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """(len(rows), words) uint64: bit d of a row's code is set when its value d is above ``mean[d]``."""
    packed = np.packbits(rows > mean, axis=1)
    words = code_words(rows.shape[1])
    if packed.shape[1] != 8 * words:
        packed = np.pad(packed, ((0, 0), (0, 8 * words - packed.shape[1])))
    codes: np.ndarray = np.ascontiguousarray(packed).view(np.uint64)
    return codes


_CODE_CHUNK = 16_384
# Block sizes of the searches' passes, through per-thread buffers reused from search to search: a fresh
# temporary of a few MB is mapped and page-faulted in on every call, which cost more than the pass itself
# (a 9k-row gather of the screen: 2.5 ms fresh, 0.3 ms into a warm buffer)
_BLOCK = 16_384
_GATHER = 1_024
_SCRATCH = threading.local()


def _scratch(name: str, shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
    """This thread's buffer ``name`` of ``shape`` (contents undefined)."""
    key = (name, shape)
    buffers: dict[tuple[str, tuple[int, ...]], np.ndarray] | None = getattr(_SCRATCH, "buffers", None)
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    got = buffers.get(key)
    if got is None:
        got = buffers[key] = np.empty(shape, dtype=dtype)
    return got


def top_indices(x: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest values of ``x`` (any order): ``argpartition``, but on large arrays first
    cut to the values above a threshold estimated from a 1-in-64 sample, about 3x the wanted count (a
    compare is much cheaper than a partition). If fewer than ``n`` pass, the full partition runs, so the
    result is exactly the top ``n`` either way."""
    if len(x) >= 64 * 1024 and 0 < n < len(x) // 64:
        sample = x[::64]
        want = min(len(sample) - 1, 3 * (n // 64) + 8)
        cut = np.partition(sample, len(sample) - 1 - want)[len(sample) - 1 - want]
        above = np.flatnonzero(x >= cut)
        if len(above) >= n:
            return above[np.argpartition(x[above], len(above) - n)[len(above) - n :]]
    return np.argpartition(x, len(x) - n)[len(x) - n :]


def _fit(mask: np.ndarray, size: int) -> np.ndarray:
    """``mask`` cut or padded (False) to ``size``: a view when it is long enough."""
    if len(mask) >= size:
        return mask[:size]
    out = np.zeros(size, dtype=bool)
    n = min(size, len(mask))
    out[:n] = mask[:n]
    return out
