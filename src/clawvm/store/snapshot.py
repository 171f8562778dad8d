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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from clawvm.core.lexical import Analyzer, _Postings
from clawvm.core.vectors import VectorIndex
from clawvm.store.index import SearchIndex

MAGIC = b"CLAWVM-INDEX\n"
FORMAT = 1
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
        if type(obj) is _Postings:  # rows and tfs only: the impact caches are rebuilt on use
            return _postings, (obj.rows, obj.tfs)
        if type(obj) is VectorIndex:
            state = {k: v for k, v in vars(obj).items() if k != "_lock"}
            return _vector_index, (state,)
        if type(obj) is SearchIndex:
            state = dict(vars(obj))
            state.update(_last_mask=None, _ctx_df={}, _ctx_sum=(-1, 0.0))  # caches keyed by the version
            return _search_index, (state,)
        return NotImplemented


def _postings(rows: Any, tfs: Any) -> _Postings:
    p = _Postings()
    p.rows, p.tfs = rows, tfs
    return p


def _vector_index(state: dict[str, Any]) -> VectorIndex:
    v = VectorIndex.__new__(VectorIndex)
    vars(v).update(state)
    v._lock = threading.Lock()
    return v


def _search_index(state: dict[str, Any]) -> SearchIndex:
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
    "clawvm.store.snapshot": {"_postings", "_vector_index", "_search_index"},
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
    return Loaded(index, int(header["rev"]))
