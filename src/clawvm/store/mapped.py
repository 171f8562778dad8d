"""The containers a snapshot-opened :class:`~clawvm.store.index.SearchIndex` holds: read-only arrays mapped
from the snapshot file (the base) with the writes made since open kept beside them in memory (an overlay).

Opening maps the file and builds none of the per-row Python objects (dicts of 100k ids, sets, lists): a read
falls through to the base (one binary search, one slice) and what a write changes goes to a small dict, so the
cost of opening does not grow with the store and memory holds only what was touched. The next snapshot folds
the overlay back into a new base.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Generic, TypeVar, overload

import numpy as np

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_NONE: Any = object()  # "no value" where None is a value


def key_of(text: str) -> int:
    """A stable 64-bit hash of ``text`` (``hash()`` changes from one process to the next)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


class Strings(Sequence[str]):
    """Strings packed in two arrays, their UTF-8 bytes end to end and ``n + 1`` offsets; optionally with a
    lookup (their stable hashes sorted, and where each is) so that :meth:`find` is one binary search."""

    def __init__(
        self,
        offsets: np.ndarray,
        blob: np.ndarray,
        hashes: np.ndarray | None = None,
        at: np.ndarray | None = None,
    ) -> None:
        self._offsets, self._blob = offsets, memoryview(blob.data)
        self._hashes, self._at = hashes, at

    @staticmethod
    def pack(items: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, bytes) of ``items`` (None packs as an empty string: the caller marks it)."""
        encoded = [b"" if s is None else s.encode() for s in items]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
        return offsets, np.frombuffer(b"".join(encoded), dtype=np.uint8)

    @staticmethod
    def lookup(items: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray]:
        """(sorted hashes, the item each one is) over the items that are not None."""
        at = np.fromiter((i for i, s in enumerate(items) if s is not None), dtype=np.int64)
        hashes = np.fromiter((key_of(items[i]) for i in at.tolist()), dtype=np.int64, count=len(at))
        order = np.argsort(hashes, kind="stable")
        return hashes[order], at[order]

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        start, end = self._offsets[i : i + 2].tolist()
        return bytes(self._blob[start:end]).decode()

    def take(self, at: Sequence[int]) -> list[str]:
        """``[self[i] for i in at]`` (each ``i`` in range), decoded straight from the mapped bytes: recall
        reads a few hundred ids at a time, and one call per id cost ~12x as much."""
        offsets, blob = self._offsets, self._blob
        index = np.asarray(at, dtype=np.int64)
        starts, ends = offsets[index].tolist(), offsets[index + 1].tolist()
        return [str(blob[a:b], "utf-8") for a, b in zip(starts, ends, strict=True)]

    def __iter__(self) -> Iterator[str]:
        offsets, blob = self._offsets.tolist(), self._blob
        for start, end in itertools.pairwise(offsets):
            yield bytes(blob[start:end]).decode()

    def find_many(self, texts: Sequence[str]) -> list[int]:
        """``[self.find(t) for t in texts]``: one vectorised search of the hashes, one batched decode to
        confirm the hits (a hash shared by two strings falls back to :meth:`find`)."""
        hashes, at = self._hashes, self._at
        assert hashes is not None and at is not None, "a table without a lookup"
        if not len(hashes) or not texts:
            return [-1] * len(texts)
        wanted = np.fromiter(map(key_of, texts), dtype=np.int64, count=len(texts))
        slot = np.minimum(np.searchsorted(hashes, wanted), len(hashes) - 1)
        hit = hashes[slot] == wanted
        where: list[int] = np.where(hit, at[slot], -1).tolist()
        confirm = [i for i, j in enumerate(where) if j >= 0]
        for i, found in zip(confirm, self.take([where[i] for i in confirm]), strict=True):
            if found != texts[i]:
                where[i] = self.find(texts[i])
        return where

    def find(self, text: str) -> int:
        """Where ``text`` is (its index), -1 when it is not there."""
        hashes, at = self._hashes, self._at
        assert hashes is not None and at is not None, "a table without a lookup"
        h = key_of(text)
        i = int(np.searchsorted(hashes, h))
        while i < len(hashes) and hashes[i] == h:
            j = int(at[i])
            if self[j] == text:
                return j
            i += 1
        return -1


class Overlay(MutableMapping[K, V]):
    """A dict over a read-only base: a read the overlay cannot answer asks ``base(key)`` (None: not there)
    and keeps the answer (the index changes sets and lists it reads in place); writes and deletes stay in
    the overlay. ``keys`` lists the base's keys, ``n`` counts them, ``bulk`` (optional) lists the base's
    pairs faster than a lookup per key."""

    def __init__(
        self,
        base: Callable[[K], V | None],
        keys: Callable[[], Iterable[K]],
        n: int | Callable[[], int],
        bulk: Callable[[], Iterable[tuple[K, V]]] | None = None,
        base_many: Callable[[list[K]], list[V | None]] | None = None,
    ) -> None:
        self._base, self._keys, self._bulk, self._base_many = base, keys, bulk, base_many
        # the count, or how to count (a pass over an array: done when first asked, not at open)
        self._n = n if isinstance(n, int) else -1
        self._count: Callable[[], int] | None = None if isinstance(n, int) else n
        self._over: dict[K, V] = {}
        self._gone: set[K] = set()
        # the last key the base did not hold: the index asks for a new key, then sets it (a new memory's id,
        # a term first seen), and the base, read-only, answers the same the second time
        self._missed: object = _NONE

    def _counted(self) -> None:
        if self._count is not None:
            self._n, self._count = self._count(), None

    def _lookup(self, key: K) -> V:
        v = self._over.get(key, _NONE)
        if v is not _NONE or key in self._gone or key == self._missed:
            return v  # type: ignore[no-any-return]
        found = self._base(key)
        if found is None:
            self._missed = key
            return _NONE  # type: ignore[no-any-return]
        self._over[key] = found
        return found

    def __getitem__(self, key: K) -> V:
        v = self._lookup(key)
        if v is _NONE:
            raise KeyError(key)
        return v

    def get(self, key: K, default: Any = None) -> Any:
        v = self._lookup(key)
        return default if v is _NONE else v

    def __contains__(self, key: object) -> bool:
        return self._lookup(key) is not _NONE  # type: ignore[arg-type]

    def get_many(self, keys: list[K]) -> list[V | None]:
        """``[self.get(k) for k in keys]``, the base asked once for all keys the overlay cannot answer
        (when it can answer many at once); what the base answers here is not kept."""
        if self._base_many is None:
            return list(map(self.get, keys))
        over, gone = self._over, self._gone
        out: list[V | None] = self._base_many(keys)
        if over or gone:
            for i, key in enumerate(keys):
                v = over.get(key, _NONE)
                if v is not _NONE:  # set here (a key deleted, then set again, is in both)
                    out[i] = v
                elif key in gone:
                    out[i] = None
        return out

    def __setitem__(self, key: K, value: V) -> None:
        self._counted()
        if self._lookup(key) is _NONE:
            self._n += 1
        self._over[key] = value
        self._gone.discard(key)

    def __delitem__(self, key: K) -> None:
        if self._lookup(key) is _NONE:
            raise KeyError(key)
        self._counted()
        del self._over[key]
        self._gone.add(key)
        self._n -= 1

    def pop(self, key: K, default: Any = _NONE) -> Any:
        v = self._lookup(key)
        if v is _NONE:
            if default is _NONE:
                raise KeyError(key)
            return default
        del self[key]
        return v

    def __len__(self) -> int:
        self._counted()
        return self._n

    def __iter__(self) -> Iterator[K]:
        over, gone = self._over, self._gone
        yield from list(over)
        for key in self._keys():
            if key not in over and key not in gone:
                yield key

    def peek_items(self) -> Iterator[tuple[K, V]]:
        """Every (key, value), without keeping what the base answers (writing a snapshot reads them all)."""
        over, gone = self._over, self._gone
        yield from list(over.items())
        if self._bulk is not None:  # the base's pairs in one pass, not a lookup per key
            for key, v in self._bulk():
                if key not in over and key not in gone:
                    yield key, v
            return
        for key in self._keys():
            if key not in over and key not in gone:
                found = self._base(key)
                assert found is not None
                yield key, found


def take(items: Sequence[T], at: list[int]) -> list[T]:
    """``[items[i] for i in at]`` (each ``i`` in range): one batched read of a mapped :class:`Appended`."""
    if isinstance(items, Appended):
        return items.take(at)
    return list(map(items.__getitem__, at))


def get_many(m: Mapping[K, V], keys: list[K]) -> list[V | None]:
    """``[m.get(k) for k in keys]``: one batched read of a mapped :class:`Overlay`."""
    if isinstance(m, Overlay):
        return m.get_many(keys)
    return list(map(m.get, keys))


def items(m: MutableMapping[K, V]) -> Iterator[tuple[K, V]]:
    """``m.items()``, without filling an :class:`Overlay` with its whole base."""
    return m.peek_items() if isinstance(m, Overlay) else iter(list(m.items()))


class Appended(Generic[T]):
    """A list over a read-only base of ``n`` items (``base(i)``): items set since are kept in a dict,
    items appended in a list."""

    def __init__(
        self,
        base: Callable[[int], T],
        n: int,
        bulk: Callable[[], list[T]] | None = None,
        base_many: Callable[[list[int]], list[T]] | None = None,
    ) -> None:
        self._base, self._n, self._bulk, self._base_many = base, n, bulk, base_many
        self._tail: list[T] = []
        self._over: dict[int, T] = {}

    def __len__(self) -> int:
        return self._n + len(self._tail)

    def __getitem__(self, i: int) -> T:
        if i < 0:
            i += len(self)
        if i >= self._n:
            return self._tail[i - self._n]
        if i < 0:
            raise IndexError(i)
        v = self._over.get(i, _NONE)
        return self._base(i) if v is _NONE else v

    def __setitem__(self, i: int, value: T) -> None:
        if i < 0:
            i += len(self)
        if i >= self._n:
            self._tail[i - self._n] = value
        elif i >= 0:
            self._over[i] = value
        else:
            raise IndexError(i)

    def append(self, value: T) -> None:
        self._tail.append(value)

    def take(self, at: list[int]) -> list[T]:
        """``[self[i] for i in at]`` (each ``i`` in range), the base read once for all of them when it can
        read many at once."""
        n = self._n
        if self._base_many is None or not at:
            return list(map(self.__getitem__, at))
        index = np.asarray(at, dtype=np.int64)
        in_base = index < n
        if in_base.all():
            out = self._base_many(at)
        else:
            out = [self._tail[i - n] if i >= n else None for i in at]  # type: ignore[misc]
            based = np.flatnonzero(in_base).tolist()
            for i, v in zip(based, self._base_many(index[based].tolist()) if based else [], strict=True):
                out[i] = v
        if self._over:
            over = self._over
            for i, row in enumerate(at):
                v = over.get(row, _NONE)
                if v is not _NONE:
                    out[i] = v
        return out

    def __iter__(self) -> Iterator[T]:
        if self._bulk is None:
            for i in range(len(self)):
                yield self[i]
            return
        items = self._bulk()
        for i, v in self._over.items():
            items[i] = v
        yield from items
        yield from self._tail


def csr(offsets: np.ndarray, values: np.ndarray, i: int) -> np.ndarray:
    """The ``i``-th run of a compressed sparse row pair (``values[offsets[i]:offsets[i + 1]]``)."""
    start, end = offsets[i : i + 2].tolist()
    run: np.ndarray = values[start:end]
    return run


def pack_runs(runs: Sequence[np.ndarray | Sequence[int]], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of runs of numbers, end to end."""
    lengths = np.fromiter(map(len, runs), dtype=np.int64, count=len(runs))
    offsets = np.zeros(len(runs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    if not runs:
        return offsets, np.zeros(0, dtype=dtype)
    return offsets, np.concatenate([np.asarray(r, dtype=dtype) for r in runs]).astype(dtype, copy=False)


def transpose(offsets: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The runs per value of a run-per-key pair: for keys 0..k with runs of rows in ``[0, n)``, the runs of
    keys per row (keys ascending within a row)."""
    keys = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    order = np.argsort(values, kind="stable")
    counts = np.bincount(values, minlength=n)[:n] if len(values) else np.zeros(n, dtype=np.int64)
    out = np.zeros(n + 1, dtype=np.int64)
    out[1:] = np.cumsum(counts)
    return out, keys[order]
