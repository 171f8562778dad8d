"""A snapshot of the in-process :class:`~clawvm.store.index.SearchIndex` beside a SQLite file, so that opening
the file maps the index instead of rebuilding it from every row.

The file's rows stay the truth. A snapshot records the ``rev`` (the engine's change counter) it is current
to; on open the engine loads it and replays only the rows and tombstones with a newer ``rev`` (the delta:
writes since the snapshot, by this process before a crash or by others), exactly as it catches up with
another process's writes. So a crash between a snapshot and later writes loses nothing, and a snapshot that
is missing, torn, corrupt or stale (another file's, a newer ``rev`` than the file holds, another schema or
dimension, a format this version does not read) is detected and the index is rebuilt from the rows.

Layout of ``<db>.index``, one file written to a temporary name and renamed over the old one (atomic):

| part | bytes |
|---|---|
| header | magic, JSON length, JSON (format, rev, schema, dim, fingerprint, the parts' lengths and CRC32s) |
| state | the index as a pickle, its two vector matrices left out |
| vectors | the vector matrix (float32 rows, capacity x dim), from a page boundary |
| projected | the projected matrix the vector search screens with, when fitted |

The vector matrices are memory-mapped copy-on-write on load (``numpy.memmap`` mode ``c``): pages are read
when a search touches them, shared with the page cache, and a write in this process copies only the page it
changes; a grown index moves to ordinary memory as before. The pickle is read whole: postings, columns,
session order and entities (a second or so at 100k memories, against tens of seconds to rebuild them).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import threading
import zlib
from array import array
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from clawvm.core.lexical import Analyzer, LexicalIndex, _Postings
from clawvm.core.vectors import VectorIndex
from clawvm.store.index import SearchIndex

MAGIC = b"CLAWVM-INDEX\n"
FORMAT = 2  # 2: each term's document frequency per statistics group (per-tenant BM25)
_PAGE = 4096


@dataclass(frozen=True)
class Fingerprint:
    """What ties a snapshot to one file: the file's random id (a new file at the same path has another),
    its schema version, and the id of the row with the highest ``seq`` when the snapshot was taken (a file
    restored from elsewhere, or rebuilt, holds another or none)."""

    file_id: int
    schema: int
    last_seq: int
    last_id: str | None


@dataclass(frozen=True)
class Loaded:
    index: SearchIndex
    rev: int


def path_for(db_path: str) -> Path:
    return Path(f"{db_path}.index")


# ---- writing -------------------------------------------------------------------------------------------
class _Pickler(pickle.Pickler):
    """Pickles a SearchIndex without its vector matrices (written apart, mapped on load), query caches or
    locks."""

    def __init__(self, file: BinaryIO, matrices: dict[int, str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._matrices = matrices  # id(array) -> its part's name

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            name = self._matrices.get(id(obj))
            if name is not None:
                return ("matrix", name)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is Analyzer:  # its stemmers are per thread and its cache refills: the language only
            return Analyzer, (obj._language,)
        if type(obj) is _Postings:  # rows, tfs, per-group frequencies: the impact caches are rebuilt on use
            return _postings, (obj.rows, obj.tfs, obj.df)
        if type(obj) is LexicalIndex:
            state = dict(vars(obj))
            # the bulk of the index as a few flat arrays: ~20k small objects and 100k lists unpickled one
            # by one took seconds at 100k memories
            state["_postings"] = _flat_postings(obj._postings)
            state["_doc_terms"] = _LazyLists.encode(obj._doc_terms)
            return _lexical_index, (state,)
        if type(obj) is _LazyLists:
            return _LazyLists, _LazyLists.encode(obj).parts
        if type(obj) is VectorIndex:
            state = {k: v for k, v in vars(obj).items() if k != "_lock"}
            return _vector_index, (state,)
        if type(obj) is SearchIndex:
            state = dict(vars(obj))
            state.update(_last_mask=None, _ctx_df={}, _ctx_sum=(-1, 0.0))  # caches keyed by the version
            del state["row_of"]  # the inverse of ids: rebuilt in one pass
            state["_row_tags"] = _LazyLists.encode(obj._row_tags)
            return _search_index, (state,)
        return NotImplemented


def _postings(rows: Any, tfs: Any, df: dict[int, int]) -> _Postings:
    p = _Postings.__new__(_Postings)  # not __init__: its empty arrays would be thrown away at once
    p.rows, p.tfs, p.cache, p.by_row, p.df, p.group_cache = rows, tfs, None, None, df, {}
    return p


@dataclass(frozen=True)
class _Flat:
    """A dict of int -> list of strings as flat arrays (rows, offsets into codes, codes into a vocabulary)."""

    parts: tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]


class _LazyLists(MutableMapping[int, list[str]]):
    """A loaded ``dict[int, list[str]]`` (a row's terms, a row's tags) left flat: a row's list is built when
    it is read (a re-index, a delete), so opening does not build 100k lists. Writes go to an overlay."""

    def __init__(self, rows: np.ndarray, offsets: np.ndarray, codes: np.ndarray, vocab: list[str]) -> None:
        self._rows, self._offsets, self._codes, self._vocab = rows, offsets, codes, vocab
        self._over: dict[int, list[str]] = {}
        self._gone: set[int] = set()

    @staticmethod
    def encode(lists: Mapping[int, list[str]]) -> _Flat:
        vocab: dict[str, int] = {}
        rows = np.fromiter(sorted(lists), dtype=np.int64, count=len(lists))
        lengths = np.zeros(len(rows) + 1, dtype=np.int64)
        codes: list[int] = []
        for i, row in enumerate(rows.tolist()):
            items = lists[row]
            lengths[i + 1] = len(items)
            codes.extend(vocab.setdefault(x, len(vocab)) for x in items)
        return _Flat((rows, np.cumsum(lengths), np.asarray(codes, dtype=np.int32), list(vocab)))

    def _base(self, row: int) -> int:
        """The row's place in the flat arrays, -1 when it is not there (or was deleted)."""
        if row in self._gone:
            return -1
        i = int(np.searchsorted(self._rows, row))
        return i if i < len(self._rows) and self._rows[i] == row else -1

    def __getitem__(self, row: int) -> list[str]:
        if row in self._over:
            return self._over[row]
        i = self._base(row)
        if i < 0:
            raise KeyError(row)
        vocab = self._vocab
        return [vocab[c] for c in self._codes[self._offsets[i] : self._offsets[i + 1]].tolist()]

    def __setitem__(self, row: int, value: list[str]) -> None:
        self._over[row] = value

    def __delitem__(self, row: int) -> None:
        found = self._over.pop(row, None) is not None
        if self._base(row) >= 0:
            self._gone.add(row)
            found = True
        if not found:
            raise KeyError(row)

    def __iter__(self) -> Iterator[int]:
        yield from self._over
        for row in self._rows.tolist():
            if row not in self._gone and row not in self._over:
                yield row

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _lists(flat: _Flat | dict[int, list[str]]) -> _LazyLists | dict[int, list[str]]:
    return _LazyLists(*flat.parts) if isinstance(flat, _Flat) else flat


def _flat_postings(
    postings: dict[str, _Postings],
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[dict[int, int]]]:
    terms = list(postings)
    lengths = np.fromiter((len(p.rows) for p in postings.values()), dtype=np.int64, count=len(terms))
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
    rows = np.frombuffer(b"".join(p.rows.tobytes() for p in postings.values()), dtype=np.int64)
    tfs = np.frombuffer(b"".join(p.tfs.tobytes() for p in postings.values()), dtype=np.float32)
    return terms, offsets, rows, tfs, [p.df for p in postings.values()]


def _lexical_index(state: dict[str, Any]) -> LexicalIndex:
    terms, offsets, rows, tfs, dfs = state["_postings"]
    bounds = offsets.tolist()
    state["_postings"] = {
        t: _postings(array("q", rows[a:b].tobytes()), array("f", tfs[a:b].tobytes()), df)
        for t, a, b, df in zip(terms, bounds, bounds[1:], dfs, strict=False)
    }
    state["_doc_terms"] = _lists(state["_doc_terms"])
    lexical = LexicalIndex.__new__(LexicalIndex)
    vars(lexical).update(state)
    return lexical


def _vector_index(state: dict[str, Any]) -> VectorIndex:
    v = VectorIndex.__new__(VectorIndex)
    vars(v).update(state)
    v._lock = threading.Lock()
    return v


def _search_index(state: dict[str, Any]) -> SearchIndex:
    state["row_of"] = {memory_id: row for row, memory_id in enumerate(state["ids"]) if memory_id is not None}
    state["_row_tags"] = _lists(state["_row_tags"])
    s = SearchIndex.__new__(SearchIndex)
    vars(s).update(state)
    return s


def write(db_path: str, index: SearchIndex, rev: int, fingerprint: Fingerprint) -> Path:
    """Write the snapshot of ``index`` (current to ``rev``) atomically; returns its path. The caller holds
    the engine's lock, so the index does not change meanwhile."""
    target = path_for(db_path)
    vectors = index.vectors
    matrices = {"vectors": vectors._x}
    if vectors._xp is not None:
        matrices["projected"] = vectors._xp
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(b"\0" * _PAGE)  # the header's place, filled in last
            state = io.BytesIO()
            _Pickler(state, {id(a): name for name, a in matrices.items()}).dump(index)
            parts: dict[str, dict[str, Any]] = {"state": _put(f, state.getbuffer())}
            del state
            for name, a in matrices.items():
                f.write(b"\0" * (-f.tell() % _PAGE))  # matrices start on a page, for mapping
                data = np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint8).data
                parts[name] = {**_put(f, data), "shape": list(a.shape)}
            header = {
                "format": FORMAT,
                "rev": rev,
                "dim": vectors.dim,
                "file_id": fingerprint.file_id,
                "schema": fingerprint.schema,
                "last_seq": fingerprint.last_seq,
                "last_id": fingerprint.last_id,
                "parts": parts,
            }
            head = json.dumps(header).encode()
            if len(MAGIC) + 8 + len(head) > _PAGE:
                raise ValueError("snapshot header over a page")
            f.seek(0)
            f.write(MAGIC + len(head).to_bytes(8, "little") + head)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


def _put(f: BinaryIO, data: bytes | memoryview) -> dict[str, Any]:
    """Write ``data`` at the file's position; its offset, length and CRC32."""
    start = f.tell()
    f.write(data)
    return {"offset": start, "length": len(data), "crc32": zlib.crc32(data)}


# ---- reading ---------------------------------------------------------------------------------------------
#: What a snapshot's pickle may name: the index's own classes and the plain types it holds. A pickle can call
#: what it names, so a file planted beside a store must not name anything else (``os.system``, ...).
_ALLOWED = {
    "clawvm.store.snapshot": {
        "_postings",
        "_vector_index",
        "_search_index",
        "_lexical_index",
        "_Flat",
        "_LazyLists",
    },
    "clawvm.core.lexical": {"Analyzer", "LexicalIndex", "BM25Params"},
    "clawvm.store.index": {"_Column"},
    "array": {"array", "_array_reconstructor"},
    "datetime": {"datetime", "timezone", "timedelta"},
    "builtins": {"set", "frozenset"},
    "numpy": {"dtype", "ndarray"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.core.numeric": {"_frombuffer"},
    "numpy._core.numeric": {"_frombuffer"},
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name not in _ALLOWED.get(module, ()):
            raise SnapshotError(f"the state names {module}.{name}, which a snapshot never holds")
        return super().find_class(module, name)


class SnapshotError(Exception):
    """Why a snapshot cannot be used (the caller rebuilds from the rows)."""


def read_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        head = f.read(_PAGE)
    if not head.startswith(MAGIC):
        raise SnapshotError("not a snapshot (magic)")
    size = int.from_bytes(head[len(MAGIC) : len(MAGIC) + 8], "little")
    try:
        header: dict[str, Any] = json.loads(head[len(MAGIC) + 8 : len(MAGIC) + 8 + size])
    except ValueError as exc:
        raise SnapshotError(f"unreadable header: {exc}") from exc
    if header.get("format") != FORMAT:
        raise SnapshotError(f"format {header.get('format')}, this version reads {FORMAT}")
    return header


def load(db_path: str, dim: int, fingerprint_of: Any, current_rev: int) -> Loaded:
    """The snapshot beside ``db_path``, checked against the file (``fingerprint_of(last_seq)`` gives the
    file's :class:`Fingerprint` for the snapshot's ``last_seq``; ``current_rev`` the file's ``rev``).
    Raises :class:`SnapshotError` (or ``FileNotFoundError``) when it cannot be used."""
    path = path_for(db_path)
    header = read_header(path)
    if header["dim"] != dim:
        raise SnapshotError(f"dimension {header['dim']}, the store's is {dim}")
    if header["rev"] > current_rev:
        raise SnapshotError(f"stale: current to rev {header['rev']}, the file is at {current_rev}")
    found: Fingerprint = fingerprint_of(header["last_seq"])
    if (found.file_id, found.schema, found.last_id) != (
        header["file_id"],
        header["schema"],
        header["last_id"],
    ):
        raise SnapshotError("another file's snapshot (or the schema changed)")
    parts = header["parts"]
    size = path.stat().st_size
    for name, part in parts.items():
        if part["offset"] + part["length"] > size:
            raise SnapshotError(f"torn: {name} runs past the end of the file")
    with open(path, "rb") as f:
        for name, part in parts.items():
            f.seek(part["offset"])
            crc, left = 0, part["length"]
            while left:
                chunk = f.read(min(left, 1 << 24))
                crc = zlib.crc32(chunk, crc)
                left -= len(chunk)
            if crc != part["crc32"]:
                raise SnapshotError(f"corrupt: {name} fails its checksum")
        matrices = {
            name: np.memmap(
                path, dtype=np.float32, mode="c", offset=part["offset"], shape=tuple(part["shape"])
            )
            for name, part in parts.items()
            if name != "state"
        }
        f.seek(parts["state"]["offset"])
        unpickler = _Unpickler(f)
        unpickler.persistent_load = lambda pid: matrices[pid[1]]  # type: ignore[method-assign]
        try:
            index = unpickler.load()
        except Exception as exc:  # a checksum that matches but a pickle this version cannot read
            raise SnapshotError(f"unreadable state: {exc!r}") from exc
    if not isinstance(index, SearchIndex):
        raise SnapshotError("the state is not a search index")
    _check_layout(index, dim)
    return Loaded(index, int(header["rev"]))


def _check_layout(index: SearchIndex, dim: int) -> None:
    """The loaded objects have the attributes this version's classes set: a snapshot written before a field
    was added (or after one was dropped) is rebuilt, instead of failing at its first query."""
    fresh = SearchIndex(dim)
    pairs = ((index, fresh), (index.lexical, fresh.lexical), (index.vectors, fresh.vectors))
    for loaded, new in pairs:
        if set(vars(loaded)) != set(vars(new)):
            missing, extra = set(vars(new)) - set(vars(loaded)), set(vars(loaded)) - set(vars(new))
            raise SnapshotError(f"{type(new).__name__} changed shape (missing {missing}, unknown {extra})")
