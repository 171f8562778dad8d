"""A snapshot of the in-process :class:`~clawvm.store.index.SearchIndex` beside a SQLite file, so that opening
the file maps the index instead of rebuilding it from every row.

The file's rows stay the truth. A snapshot records the ``rev`` (the engine's change counter) it is current
to; on open the engine maps it and replays only the rows and tombstones with a newer ``rev`` (the delta:
writes since the snapshot, by this process before a crash or by others), exactly as it catches up with
another process's writes. So a crash between a snapshot and later writes loses nothing, and a snapshot that
is missing, torn, corrupt or stale (another file's, a newer ``rev`` than the file holds, another schema or
dimension, a format this version does not read) is detected and the index is rebuilt from the rows.

Layout of ``<db>.index``, one file written to a temporary name and renamed over the old one (atomic):

| part | bytes |
|---|---|
| header | magic, JSON length, JSON (format, rev, schema, dim, fingerprint, size; per part: offset, length, |
| | dtype, shape, CRC32) |
| state | the small fields (counters, per-tenant statistics, column vocabularies): a pickle of plain types |
| arrays | each per-row or per-term structure as flat arrays (``docs/scale.md`` lists them): the vector |
| | matrices (float32, from a page boundary), per-row columns, strings as UTF-8 bytes + offsets with a |
| | sorted hash lookup, postings / sessions / entities / tags as compressed sparse rows |

Opening reads the header and the state, maps the whole file copy-on-write (``mmap`` ``ACCESS_COPY``) and
builds views over it (:mod:`clawvm.store.mapped`): no per-row Python object is made, so opening costs the
same at 1k and at 1M memories, and a query reads only the pages it touches. What the index changes after
open goes to small overlays (a dict beside each mapped dict, a tail beside each mapped list; an array write
copies only its page); the next snapshot folds them into a new file.

Checks: the header, the fingerprint (file id, schema, the newest row's id, the newest changes: a copy that
went on apart changed other rows at those revs) and the parts' bounds against the
file's size at open; the state's CRC at open; the arrays' CRCs at open when they total at most
``EAGER_VERIFY_BYTES`` (or when the caller asks, ``verify_now``: a short-lived process), else by a
low-priority background pass right after open (reading through its own descriptor, so it fills no mapping).
A check that fails removes the file (:meth:`Verifier.discard`), so no other process maps it again; the
engine rebuilds from the rows. Reading every byte at open would cost what mapping saves (~300 MB at 100k
memories); the snapshot is written whole and renamed into place, so only damage from outside (a disk, a
hand) can fail a CRC, and a process that lives past the pass (under a second at 100k) notices it. A path
that is not a regular file (a FIFO) is opened without blocking and refused.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import io
import json
import math
import mmap
import os
import pickle
import stat
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from clawvm.core.lexical import ANALYZER_VERSION, Analyzer, BM25Params, LexicalIndex, _Postings
from clawvm.core.vectors import CODE_SHARE, RESCORE, VectorIndex
from clawvm.store.index import _COLUMNS, SearchIndex, _Column
from clawvm.store.mapped import Appended, Overlay, Strings, csr, items, pack_runs, transpose

MAGIC = b"CLAWVM-INDEX\n"
FORMAT = 4  # 4: sign codes beside the projection (3: flat arrays, mapped on open; 2: one pickle)
_PAGE = 4096
_ALIGN = 64
#: Arrays up to this many bytes in all are checked at open; above, by a background pass after open.
EAGER_VERIFY_BYTES = 16 * 2**20
#: Seconds after open before that background pass starts: a short-lived process (a CLI call) is not slowed
#: by it; a process that lives on checks the snapshot it answers from.
VERIFY_DELAY_S = 1.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INDEX_ARRAYS = ("_alive", "_created", "_pinned", "_expires", "_prev", "_next", "_ctx_len")


@dataclass(frozen=True)
class Fingerprint:
    """What ties a snapshot to one file: the file's random id (a new file at the same path has another),
    its schema version, and the id of the row with the highest ``seq`` when the snapshot was taken (a file
    restored from elsewhere, or rebuilt, holds another or none)."""

    file_id: int
    schema: int
    last_seq: int
    last_id: str | None
    #: the newest changes the snapshot holds, (memory id, rev, alive after it): a copy of the file that went
    #: on apart (or a restored backup written to since) has another change at those revs, while the same
    #: file only ever moved them on (see ``load``'s ``same_history``)
    recent: tuple[Change, ...] = ()


@dataclass(frozen=True)
class Change:
    """One change to the file: the memory it wrote (``alive``) or deleted, at ``rev``."""

    memory_id: str
    rev: int
    alive: bool
    #: a written row's stored bytes, digested: a copy that went on apart and changed the same memory at the
    #: same rev holds other bytes there (None: a delete, or a snapshot written before digests were kept)
    digest: str | None = None


@dataclass
class Loaded:
    index: SearchIndex
    rev: int
    #: the arrays' checksums, still to verify (None: verified at open)
    verifier: Verifier | None = None


def path_for(db_path: str) -> Path:
    return Path(f"{db_path}.index")


# ---- writing -------------------------------------------------------------------------------------------
def _table(out: dict[str, np.ndarray], name: str, strings: Sequence[str | None]) -> None:
    """Strings as packed arrays (``name.s.off``, ``name.s.blob``) with their hash lookup."""
    out[f"{name}.s.off"], out[f"{name}.s.blob"] = Strings.pack(strings)
    out[f"{name}.s.hash"], out[f"{name}.s.at"] = Strings.lookup(strings)


def _row_flags(size: int, rows: list[int]) -> np.ndarray:
    flags = np.zeros(size, dtype=bool)
    flags[np.asarray(rows, dtype=np.int64)] = True
    return flags


class _Arrays(dict[str, np.ndarray]):
    """Named arrays; a name is given once."""

    def __setitem__(self, name: str, a: np.ndarray) -> None:
        if name in self:
            raise ValueError(f"two arrays named {name}")
        super().__setitem__(name, a)


def _arrays(ix: SearchIndex) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The index as named flat arrays and a dict of small fields."""
    out = _Arrays()
    n = len(ix.ids)
    ids: list[str | None] = list(ix.ids)
    _table(out, "ids", ids)
    out["ids.null"] = np.fromiter((i is None for i in ids), dtype=bool, count=n)
    for name in _INDEX_ARRAYS:
        out[f"ix{name}"] = getattr(ix, name)
    hashed = dict(items(ix._text_hash))
    out["text.has"] = _row_flags(n, list(hashed))
    out["text.key"] = np.zeros(n, dtype=np.int64)
    out["text.key"][list(hashed)] = list(hashed.values())
    counted = dict(items(ix._entity_group))
    out["ent.group"] = np.full(n, -1, dtype=np.int32)
    out["ent.group"][list(counted)] = list(counted.values())
    for name, col in ix._cols.items():
        out[f"col.{name}"] = col.data
        _table(out, f"col.{name}.v", list(col.values))
    # sessions: their keys ("tenant\0session" with the tenant's length) and rows in session order
    sessions = list(items(ix._sessions))
    keys = [f"{t}\0{s}" for (t, s), _ in sessions]
    _table(out, "sess", keys)
    out["sess.tlen"] = np.fromiter((len(t) for (t, _), _ in sessions), dtype=np.int64, count=len(sessions))
    out["sess.off"], out["sess.rows"] = pack_runs([rows for _, rows in sessions], np.int64)
    out["sess.code"] = np.full(n, -1, dtype=np.int32)
    for code, (_, rows) in enumerate(sessions):
        out["sess.code"][rows] = code
    # entities (sorted by name: a row's entities come out sorted) with their per-tenant counts
    entities = sorted(items(ix._entities))
    _table(out, "ent", [e for e, _ in entities])
    out["ent.off"], out["ent.rows"] = pack_runs([sorted(rows) for _, rows in entities], np.int64)
    out["ent.row.off"], out["ent.row.codes"] = transpose(out["ent.off"], out["ent.rows"], n)
    per_entity: dict[str, list[tuple[int, int]]] = {}
    for (e, group), count in items(ix._entity_df):
        per_entity.setdefault(e, []).append((group, count))
    dfs = [sorted(per_entity.get(e, [])) for e, _ in entities]
    out["ent.df.off"], out["ent.df.group"] = pack_runs([[g for g, _ in d] for d in dfs], np.int64)
    out["ent.df.count"] = pack_runs([[c for _, c in d] for d in dfs], np.int64)[1]
    # tags (empty ones too: their names stay listed) and which rows hold a tag list
    tags = list(items(ix._tags))
    _table(out, "tag", [t for t, _ in tags])
    out["tag.off"], out["tag.rows"] = pack_runs([sorted(rows) for _, rows in tags], np.int64)
    out["tag.row.off"], out["tag.row.codes"] = transpose(out["tag.off"], out["tag.rows"], n)
    out["tag.row.has"] = _row_flags(n, list(ix._row_tags))  # the lists themselves: the tags' inverse
    lex_state = _lexical_arrays(ix.lexical, out)
    vec_state = _vector_arrays(ix.vectors, out)
    state = {
        "n_ids": n,
        "n_live": len(ix.row_of),
        "window": ix.window,
        "version": ix._version,
        "ctx_group_sum": dict(ix._ctx_group_sum),
        "agents": dict(ix._agents),
        "tag_names": list(ix._tag_names),
        "tenant_version": dict(ix._tenant_version),
        "lexical": lex_state,
        "vectors": vec_state,
    }
    return out, state


def _lexical_arrays(lex: LexicalIndex, out: dict[str, np.ndarray]) -> dict[str, Any]:
    postings = list(items(lex._postings))
    _table(out, "term", [t for t, _ in postings])
    rows = [np.frombuffer(p.rows, dtype=np.int64) for _, p in postings]
    out["post.off"], out["post.rows"] = pack_runs(rows, np.int64)
    out["post.tfs"] = pack_runs([np.frombuffer(p.tfs, dtype=np.float32) for _, p in postings], np.float32)[1]
    dfs = [sorted(p.df.items()) for _, p in postings]
    out["post.df.off"], out["post.df.group"] = pack_runs([[g for g, _ in d] for d in dfs], np.int64)
    out["post.df.count"] = pack_runs([[c for _, c in d] for d in dfs], np.int64)[1]
    size = len(lex._alive)
    out["doc.off"], out["doc.codes"] = transpose(out["post.off"], out["post.rows"], size)
    # which rows hold a term list (the lists themselves are the postings' inverse, above)
    out["doc.has"] = _row_flags(size, list(lex._doc_terms))
    out["lex.doc_len"], out["lex.alive"], out["lex.group"] = lex._doc_len, lex._alive, lex._group
    return {
        "language": lex.analyzer._language,
        "k1": lex.params.k1,
        "b": lex.params.b,
        "total_len": lex._total_len,
        "n_alive": lex._n_alive,
        "n_postings": lex._n_postings,
        "group_n": dict(lex._group_n),
        "group_len": dict(lex._group_len),
    }


def _vector_arrays(v: VectorIndex, out: dict[str, np.ndarray]) -> dict[str, Any]:
    out["vectors"] = v._x
    out["vec.has"] = v._has
    if v._xp is not None and v._proj is not None and v._codes is not None and v._mean is not None:
        out["projected"], out["vec.proj"] = v._xp, v._proj
        out["vec.codes"], out["vec.mean"] = v._codes, v._mean
    return {
        "dim": v.dim,
        "exact_below": v.exact_below,
        "proj_dim": v.proj_dim,
        "rescore": v.rescore,
        "code_share": v.code_share,
        "n": v._n,
        "hi": v._hi,
        "fitted_at": v._fitted_at,
    }


_PER_VECTOR_ROW = ("vectors", "projected", "vec.has")  # arrays with a row per vector row, on the first axis


def _spare_rows(v: VectorIndex) -> int:
    """Zero rows written after the vector matrices: the index's next rows land in them (a page copied on
    write each) instead of growing the matrices, which would copy them whole into memory."""
    wanted = v._hi + max(1024, v._hi // 8)
    return max(0, wanted - len(v._x))


def write(db_path: str, index: SearchIndex, rev: int, fingerprint: Fingerprint) -> Path:
    """Write the snapshot of ``index`` (current to ``rev``) atomically; returns its path. The caller holds
    the engine's lock, so the index does not change meanwhile."""
    target = path_for(db_path)
    # the projection, codes and all, go in fitted: a snapshot written after bulk writes and no search
    # would leave every open that maps it to fit them again (1-3 s at 100k), and never keep that fit
    index.vectors.prepare()
    arrays, small = _arrays(index)
    state = io.BytesIO()
    pickle.dump(small, state, protocol=pickle.HIGHEST_PROTOCOL)
    blobs: dict[str, memoryview] = {"state": state.getbuffer()}
    shapes: dict[str, dict[str, Any]] = {"state": {}}
    spare = _spare_rows(index.vectors)
    zeros: dict[str, bytes] = {}  # written after an array: its spare rows
    for name, a in arrays.items():
        if spare and name == "vec.codes":  # word-major: its rows run along the second axis
            a = np.pad(a, ((0, 0), (0, spare)))
        a = np.ascontiguousarray(a)
        blobs[name] = a.reshape(-1).view(np.uint8).data
        shapes[name] = {"dtype": a.dtype.str, "shape": list(a.shape)}
        if spare and name in _PER_VECTOR_ROW:
            zeros[name] = bytes(spare * a.dtype.itemsize * math.prod(a.shape[1:]))
            shapes[name]["shape"][0] += spare
    # the offsets, from the data's start: the matrices on a page (for mapping), the rest on 64 bytes
    rel: dict[str, int] = {}
    at = 0
    for name, data in blobs.items():
        at += -at % (_PAGE if name in ("vectors", "projected") else _ALIGN)
        rel[name] = at
        at += len(data) + len(zeros.get(name, b""))
    parts = {
        name: {"offset": rel[name], "length": len(data) + len(zeros.get(name, b"")), **shapes[name]}
        for name, data in blobs.items()
    }
    fields = {
        "format": FORMAT,
        "analyzer": ANALYZER_VERSION,
        "rev": rev,
        "dim": index.vectors.dim,
        "file_id": fingerprint.file_id,
        "schema": fingerprint.schema,
        "last_seq": fingerprint.last_seq,
        "last_id": fingerprint.last_id,
        "recent": [[c.memory_id, c.rev, c.alive] for c in fingerprint.recent],
        # apart from "recent": a version that reads three fields a change still reads this header
        "recent_digests": [c.digest for c in fingerprint.recent],
    }
    # room for every field, the parts with their checksums and absolute offsets, and the size
    sketch = len(json.dumps(fields)) + len(json.dumps(parts)) + 24 * len(parts) + 1024
    start = -(-(len(MAGIC) + 8 + sketch) // _PAGE) * _PAGE
    for name, part in parts.items():
        part["offset"] += start
        part["crc32"] = zlib.crc32(zeros.get(name, b""), zlib.crc32(blobs[name]))
    header = {
        **fields,
        "size": start + at,
        "parts": parts,
    }
    head = json.dumps(header).encode()
    if len(MAGIC) + 8 + len(head) > start:
        raise ValueError("snapshot header over its room")
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(head).to_bytes(8, "little") + head)
            for name, data in blobs.items():
                f.write(b"\0" * (parts[name]["offset"] - f.tell()))
                f.write(data)
                f.write(zeros.get(name, b""))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


def remove_leftovers(db_path: str) -> list[Path]:
    """Remove the temporary files of snapshot writers that died before renaming theirs into place (a killed
    process, a machine that went down): each is as big as a snapshot, and nothing else removed them. A
    writer still alive (this process's, another's) keeps its own. Returns the files removed."""
    target = path_for(db_path)
    removed = []
    idle_since = time.time() - LEFTOVER_IDLE_S
    for tmp in target.parent.glob(f"{glob.escape(target.name)}.*.*.tmp"):
        pid = tmp.name[len(target.name) + 1 :].split(".", 1)[0]
        with contextlib.suppress(FileNotFoundError):
            # a process id alone is not enough: a writer in another container sharing the volume has one
            # this process cannot see; a writer writes without pause, so a file long untouched is a dead one's
            if pid.isdigit() and not _alive(int(pid)) and tmp.stat().st_mtime < idle_since:
                tmp.unlink()
                removed.append(tmp)
    return removed


#: How long a snapshot writer's temporary file must have been left untouched before an open removes it
#: (a forked writer lives at most ``forked.CHILD_LIFETIME_S``, 900 s; one writing never pauses that long)
LEFTOVER_IDLE_S = 900.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# ---- reading ---------------------------------------------------------------------------------------------
#: What a snapshot's state may name: plain types only. A pickle can call what it names, so a file planted
#: beside a store must not name anything else (``os.system``, ...).
_ALLOWED = {"builtins": {"set", "frozenset"}}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name not in _ALLOWED.get(module, ()):
            raise SnapshotError(f"the state names {module}.{name}, which a snapshot never holds")
        return super().find_class(module, name)


class SnapshotError(Exception):
    """Why a snapshot cannot be used (the caller rebuilds from the rows)."""


class DamagedSnapshotError(SnapshotError):
    """An array fails its checksum (damage from outside: a disk, a hand); the file has been removed, so that
    no other process maps it again (see :meth:`Verifier.check`)."""


class StaleSnapshotError(SnapshotError):
    """The snapshot is current to a newer ``rev`` than the file holds: the file went back in time (restored
    from a backup), so its history from that rev on is another one than the snapshot's."""

    def __init__(self, rev: int, current: int) -> None:
        super().__init__(f"stale: current to rev {rev}, the file is at {current}")
        self.rev = rev


def read_header(path: Path) -> dict[str, Any]:
    with os.fdopen(open_regular(path), "rb") as f:
        return _header(f.read(_PAGE), f)


def open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file at ``path``. Opened without blocking and checked: a FIFO
    put where a snapshot belongs made a plain open wait for a writer forever (every open of the store hung),
    and a device or a directory is no snapshot either; all are refused as one that cannot be used."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError("not a regular file")
        os.set_blocking(fd, True)  # a regular file never blocks; the flag is dropped for what reads it later
    except BaseException:
        os.close(fd)
        raise
    return fd


def _header(head: bytes, f: BinaryIO) -> dict[str, Any]:
    if not head.startswith(MAGIC):
        raise SnapshotError("not a snapshot (magic)")
    size = int.from_bytes(head[len(MAGIC) : len(MAGIC) + 8], "little")
    if size > _MAX_HEADER:  # a damaged length: read as it is, it asked for exabytes (MemoryError)
        raise SnapshotError(f"corrupt: a header of {size} bytes")
    if len(MAGIC) + 8 + size > len(head):
        f.seek(0)
        head = f.read(len(MAGIC) + 8 + size)
    try:
        header: dict[str, Any] = json.loads(head[len(MAGIC) + 8 : len(MAGIC) + 8 + size])
    except ValueError as exc:
        raise SnapshotError(f"unreadable header: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else None
        raise SnapshotError(f"format {got}, this version reads {FORMAT}")
    _check_header(header)
    return header


#: The most header bytes a snapshot has (its parts' names, offsets, shapes and checksums: a few KB)
_MAX_HEADER = 1 << 20
_HEADER_INTS = ("rev", "dim", "file_id", "schema", "last_seq", "size")
_PART_INTS = ("offset", "length", "crc32")


def _check_header(header: dict[str, Any]) -> None:
    """Every field the reader uses, of its type: valid JSON with a field missing or of another type (a hand's
    edit, a damaged digit) raised KeyError or TypeError out of open instead of a rebuild."""

    def whole(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    bad = [name for name in _HEADER_INTS if not whole(header.get(name))]
    if not isinstance(header.get("last_id"), str | None):
        bad.append("last_id")
    recent = header.get("recent", [])  # absent from snapshots written before it was kept
    if not isinstance(recent, list) or not all(
        isinstance(c, list)
        and len(c) == 3
        and isinstance(c[0], str)
        and whole(c[1])
        and isinstance(c[2], bool)
        for c in recent
    ):
        bad.append("recent")
    if not _digests_ok(header.get("recent_digests"), recent):
        bad.append("recent_digests")
    parts = header.get("parts")
    if not isinstance(parts, dict) or not isinstance(parts.get("state"), dict):
        bad.append("parts")
    else:
        bad += [f"parts.{name}" for name, part in parts.items() if not _part_ok(name, part, whole)]
    if bad:
        raise SnapshotError(f"corrupt: header field {bad[0]}")


def _digests_ok(digests: object, recent: object) -> bool:
    """One digest (or None) per named change, or none at all (a snapshot written before they were kept)."""
    if digests is None:
        return True
    return (
        isinstance(digests, list)
        and isinstance(recent, list)
        and len(digests) == len(recent)
        and all(isinstance(d, str | None) for d in digests)
    )


def _part_ok(name: str, part: object, whole: Callable[[object], bool]) -> bool:
    """Whether one part's entry has its offset, length and checksum (and an array's dtype and shape)."""
    if not isinstance(part, dict) or not all(whole(part.get(k)) for k in _PART_INTS):
        return False
    return name == "state" or (isinstance(part.get("dtype"), str) and isinstance(part.get("shape"), list))


@dataclass
class Verifier:
    """Checks the arrays' CRC32s by reading the file through its own descriptor (a mapping would make the
    pages resident in this process). Run at open for small snapshots, else in a low-priority thread."""

    fd: int
    parts: dict[str, dict[str, Any]]
    delay_s: float = VERIFY_DELAY_S
    path: Path | None = None  # the file's name: a damaged one is removed (see discard)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)  # ends the delay: stop() or hurry()
    _stopped: bool = False
    _hurried: bool = False  # someone waits for the check: it runs at the thread's own priority
    _thread: threading.Thread | None = None

    def check(self) -> str | None:
        try:
            for name, part in self.parts.items():
                crc, at, left = 0, part["offset"], part["length"]
                while left and not self._stopped:
                    chunk = os.pread(self.fd, min(left, 1 << 22), at)
                    if not chunk:
                        self.error = f"torn: {name} runs past the end of the file"
                        self.discard()
                        return self.error
                    crc = zlib.crc32(chunk, crc)
                    at, left = at + len(chunk), left - len(chunk)
                if self._stopped:
                    return None
                if crc != part["crc32"]:
                    self.error = f"corrupt: {name} fails its checksum"
                    self.discard()
                    return self.error
            return None
        finally:
            self.done.set()

    def discard(self) -> None:
        """Remove the damaged file from its name, unless another file has been renamed there since (a sound
        snapshot, written by a process that found the damage first): left in place, every other process
        mapped it again, and each short-lived one failed on it or answered from it. The name is compared
        with the descriptor just before the unlink; a snapshot renamed in between is lost, which costs the
        next open a rebuild from the rows, never an answer."""
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            mine, named = os.fstat(self.fd), os.stat(self.path)
            if (mine.st_dev, mine.st_ino) == (named.st_dev, named.st_ino):
                os.unlink(self.path)

    def start(self) -> None:
        def run() -> None:
            try:
                self._wake.wait(self.delay_s)
                if self._stopped:
                    return
                if not self._hurried:  # a call waiting on it holds its engine's lock: at full priority
                    with contextlib.suppress(OSError, AttributeError):  # below the threads that answer
                        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
                self.check()
            finally:
                self.done.set()
                os.close(self.fd)

        self._thread = threading.Thread(target=run, name="clawvm-snapshot-check", daemon=True)
        self._thread.start()

    def hurry(self) -> None:
        """Start the check now (before a snapshot is written from the mapped index: a damaged base must not
        be copied into a new file under a good checksum, or a call that failed waits on it)."""
        self._hurried = True
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        elif not self.done.is_set():  # never started: its descriptor is still ours to close
            self.done.set()
            os.close(self.fd)

    def wait(self, timeout: float = 60.0) -> str | None:
        if self._thread is None and not self.done.is_set():
            self.hurry()
            self.start()
        self.done.wait(timeout)
        return self.error


def load(
    db_path: str,
    dim: int,
    fingerprint_of: Any,
    current_rev: int,
    same_history: Callable[[Sequence[Change], int], bool] | None = None,
    verify_now: bool = False,
) -> Loaded:
    """The snapshot beside ``db_path``, checked against the file (``fingerprint_of(last_seq, last_id, rev)``
    gives the file's :class:`Fingerprint` for the snapshot's ``last_seq``, naming ``last_id`` when that row
    was deleted after the snapshot's ``rev``; ``current_rev`` is the file's ``rev``; ``same_history(recent,
    rev)`` says whether the file holds the snapshot's newest changes, or moved them on after ``rev``).
    ``verify_now``: check the arrays' checksums before mapping, whatever their size (a process that exits
    before the background pass would answer from a damaged file unchecked).
    Raises :class:`SnapshotError` (or ``FileNotFoundError``) when it cannot be used."""
    path = path_for(db_path)
    fd = open_regular(path)
    try:
        loaded = _load(fd, path, dim, fingerprint_of, current_rev, same_history, verify_now)
    except (KeyError, TypeError, IndexError, OverflowError, MemoryError) as exc:
        os.close(fd)  # a damaged field that the header's checks let through: a rebuild, not a crash
        raise SnapshotError(f"corrupt: {exc!r}") from exc
    except BaseException:
        os.close(fd)
        raise
    if loaded.verifier is None:
        os.close(fd)
    return loaded


def _load(
    fd: int,
    path: Path,
    dim: int,
    fingerprint_of: Any,
    current_rev: int,
    same_history: Callable[[Sequence[Change], int], bool] | None,
    verify_now: bool,
) -> Loaded:
    with os.fdopen(os.dup(fd), "rb") as f:
        header = _header(f.read(_PAGE), f)
    if header["dim"] != dim:
        raise SnapshotError(f"dimension {header['dim']}, the store's is {dim}")
    analyzer = header.get("analyzer", 1)  # absent: written before CJK bigrams
    if analyzer != ANALYZER_VERSION:  # its terms are not what this version's queries ask for
        raise SnapshotError(f"terms of analyzer {analyzer}, this version's are of {ANALYZER_VERSION}")
    if header["rev"] > current_rev:
        raise StaleSnapshotError(header["rev"], current_rev)
    found: Fingerprint = fingerprint_of(header["last_seq"], header["last_id"], header["rev"])
    if (found.file_id, found.schema, found.last_id) != (
        header["file_id"],
        header["schema"],
        header["last_id"],
    ):
        raise SnapshotError("another file's snapshot (or the schema changed)")
    named = header.get("recent", [])
    digests = header.get("recent_digests") or [None] * len(named)
    recent = [Change(str(c[0]), int(c[1]), bool(c[2]), d) for c, d in zip(named, digests, strict=True)]
    if recent and same_history is not None and not same_history(recent, header["rev"]):
        raise SnapshotError("another history's snapshot (a copy of the file that went on apart, or a backup)")
    parts: dict[str, dict[str, Any]] = header["parts"]
    size = os.fstat(fd).st_size
    if size != header["size"]:
        raise SnapshotError(f"torn: {size} bytes, the header says {header['size']}")
    for name, part in parts.items():
        if part["offset"] + part["length"] > size:
            raise SnapshotError(f"torn: {name} runs past the end of the file")
    state_part = parts["state"]
    raw = os.pread(fd, state_part["length"], state_part["offset"])
    if zlib.crc32(raw) != state_part["crc32"]:
        raise SnapshotError("corrupt: state fails its checksum")
    try:
        state = _Unpickler(io.BytesIO(raw)).load()
    except SnapshotError:
        raise
    except Exception as exc:  # a checksum that matches but a pickle this version cannot read
        raise SnapshotError(f"unreadable state: {exc!r}") from exc
    arrays = {name: part for name, part in parts.items() if name != "state"}
    verifier = Verifier(fd, arrays, VERIFY_DELAY_S, path)
    eager = verify_now or sum(p["length"] for p in arrays.values()) <= EAGER_VERIFY_BYTES
    if eager:
        error = verifier.check()
        if error:
            raise DamagedSnapshotError(error)
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)  # private: a write in this process copies its page

    def view(name: str) -> np.ndarray:
        part = arrays[name]
        shape, dtype = tuple(part["shape"]), np.dtype(part["dtype"])
        count = math.prod(shape)
        if count == 0:
            return np.zeros(shape, dtype=dtype)
        return np.frombuffer(mm, dtype=dtype, count=count, offset=part["offset"]).reshape(shape)

    try:
        index = _index(view, state, "projected" in arrays)
    except (KeyError, ValueError, TypeError) as exc:
        raise SnapshotError(f"unreadable arrays: {exc!r}") from exc
    _check_layout(index, dim)
    return Loaded(index, int(header["rev"]), None if eager else verifier)


def _strings(view: Callable[[str], np.ndarray], name: str) -> Strings:
    return Strings(
        view(f"{name}.s.off"), view(f"{name}.s.blob"), view(f"{name}.s.hash"), view(f"{name}.s.at")
    )


def _found(i: int) -> int | None:
    return i if i >= 0 else None


def _code(values: Strings, value: str) -> int | None:
    return _found(values.find(value))


def _index(view: Callable[[str], np.ndarray], state: dict[str, Any], projected: bool) -> SearchIndex:
    """A SearchIndex over the mapped arrays (see :mod:`clawvm.store.mapped`)."""
    s = SearchIndex.__new__(SearchIndex)
    n = state["n_ids"]
    ids = _strings(view, "ids")
    null = view("ids.null")
    s.ids = Appended(  # type: ignore[assignment]
        lambda i: None if null[i] else ids[i],
        n,
        lambda: [None if gone else i for i, gone in zip(ids, null.tolist(), strict=True)],
        lambda at: [None if gone else i for i, gone in zip(ids.take(at), null[at].tolist(), strict=True)],
    )
    s.row_of = Overlay(  # type: ignore[assignment]
        lambda k: _found(ids.find(k)),
        lambda: (ids[i] for i in np.flatnonzero(~null).tolist()),
        state["n_live"],
        None,
        lambda keys: list(map(_found, ids.find_many(keys))),
    )
    s.lexical = _lexical(view, state["lexical"])
    s.window = state["window"]
    s.vectors = _vectors(view, state["vectors"], projected)
    for name in _INDEX_ARRAYS:
        setattr(s, name, view(f"ix{name}"))
    created, alive = view("ix_created"), view("ix_alive")

    def created_many(at: list[int]) -> list[datetime | None]:
        return [
            _EPOCH + timedelta(microseconds=us) if live else None
            for us, live in zip(created[at].tolist(), alive[at].tolist(), strict=True)
        ]

    s._created_at = Appended(  # type: ignore[assignment]
        lambda i: _EPOCH + timedelta(microseconds=int(created[i])) if alive[i] else None,
        n,
        None,
        created_many,
    )
    # sessions
    sess = _strings(view, "sess")
    tlen, code = view("sess.tlen"), view("sess.code")
    sess_off, sess_rows = view("sess.off"), view("sess.rows")

    def session(i: int) -> tuple[str, str]:
        key, cut = sess[i], int(tlen[i])
        return key[:cut], key[cut + 1 :]

    def session_rows(key: tuple[str, str]) -> list[int] | None:
        i = sess.find(f"{key[0]}\0{key[1]}")
        return None if i < 0 else csr(sess_off, sess_rows, i).tolist()

    def keys() -> Any:
        return (session(i) for i in range(len(sess)))

    def sessions_bulk() -> Any:
        return ((session(i), csr(sess_off, sess_rows, i).tolist()) for i in range(len(sess)))

    s._sessions = Overlay(session_rows, keys, len(sess), sessions_bulk)  # type: ignore[assignment]
    s._session_keys = Overlay(  # type: ignore[assignment]
        lambda k: k if sess.find(f"{k[0]}\0{k[1]}") >= 0 else None, keys, len(sess)
    )
    s._session_of = _per_row(code, session)  # type: ignore[assignment]
    # entities
    ent = _strings(view, "ent")
    ent_off, ent_rows = view("ent.off"), view("ent.rows")
    row_off, row_codes = view("ent.row.off"), view("ent.row.codes")
    df_off, df_group, df_count = view("ent.df.off"), view("ent.df.group"), view("ent.df.count")

    def entity_rows(e: str) -> set[int] | None:
        i = ent.find(e)
        return None if i < 0 else set(csr(ent_off, ent_rows, i).tolist())

    def row_entities(r: int) -> tuple[str, ...] | None:
        if not 0 <= r < n:
            return None
        found = csr(row_off, row_codes, r).tolist()
        return tuple(ent[c] for c in found) if found else None

    def entity_df(key: tuple[str, int]) -> int | None:
        i = ent.find(key[0])
        if i < 0:
            return None
        groups = csr(df_off, df_group, i).tolist()
        return int(csr(df_off, df_count, i)[groups.index(key[1])]) if key[1] in groups else None

    def entity_df_pairs() -> Any:
        for i, e in enumerate(ent):
            groups, counts = csr(df_off, df_group, i).tolist(), csr(df_off, df_count, i).tolist()
            yield from (((e, g), c) for g, c in zip(groups, counts, strict=True))

    def entity_df_keys() -> Any:
        return (key for key, _ in entity_df_pairs())

    def entities_bulk() -> Any:
        return ((e, set(csr(ent_off, ent_rows, i).tolist())) for i, e in enumerate(ent))

    s._entities = Overlay(entity_rows, lambda: iter(ent), len(ent), entities_bulk)  # type: ignore[assignment]
    s._row_entities = Overlay(  # type: ignore[assignment]
        row_entities,
        lambda: np.flatnonzero(np.diff(row_off) > 0).tolist(),
        lambda: int(np.count_nonzero(np.diff(row_off) > 0)),
    )
    s._entity_df = Overlay(  # type: ignore[assignment]
        entity_df, entity_df_keys, len(df_group), entity_df_pairs
    )
    s._entity_group = _per_row(view("ent.group"), lambda g: g)  # type: ignore[assignment]
    # columns
    s._cols = {}
    for name in _COLUMNS:
        col = _Column.__new__(_Column)
        values = _strings(view, f"col.{name}.v")
        col.values = Appended(  # type: ignore[assignment]
            values.__getitem__, len(values), functools.partial(list, values), values.take
        )
        col.codes = Overlay(  # type: ignore[assignment]
            functools.partial(_code, values), functools.partial(iter, values), len(values)
        )
        col.data = view(f"col.{name}")
        s._cols[name] = col
    # tags
    tag = _strings(view, "tag")
    tag_off, tag_rows = view("tag.off"), view("tag.rows")
    trow_off, trow_codes, trow_has = view("tag.row.off"), view("tag.row.codes"), view("tag.row.has")

    def tag_rows_of(t: str) -> set[int] | None:
        i = tag.find(t)
        return None if i < 0 else set(csr(tag_off, tag_rows, i).tolist())

    def row_tags(r: int) -> list[str] | None:
        if not (0 <= r < n and trow_has[r]):
            return None
        return [tag[c] for c in csr(trow_off, trow_codes, r).tolist()]

    def tags_bulk() -> Any:
        return ((t, set(csr(tag_off, tag_rows, i).tolist())) for i, t in enumerate(tag))

    s._tags = Overlay(tag_rows_of, lambda: iter(tag), len(tag), tags_bulk)  # type: ignore[assignment]
    s._tag_names = state["tag_names"]
    s._row_tags = _flagged(trow_has, row_tags)  # type: ignore[assignment]
    text_has, text_key = view("text.has"), view("text.key")
    s._text_hash = _flagged(text_has, lambda r: int(text_key[r]), text_key)  # type: ignore[assignment]
    s._agents = state["agents"]
    s._tenant_version = state["tenant_version"]
    s._version = state["version"]
    s._ctx_df, s._ctx_sum, s._ctx_group_sum = {}, (-1, 0.0), state["ctx_group_sum"]
    s._last_mask = None
    return s


def _per_row(codes: np.ndarray, decode: Callable[[int], Any]) -> Overlay[int, Any]:
    """A row -> value dict over a per-row array of codes (-1: the row is absent; ``decode`` maps a code to
    the value). Which rows hold one is found when first asked (a pass over the array), not at open."""
    size = len(codes)

    def base(r: int) -> Any:
        if not 0 <= r < size:
            return None
        c = int(codes[r])
        return decode(c) if c >= 0 else None

    def present() -> list[int]:
        return np.flatnonzero(codes >= 0).tolist()

    def bulk() -> Any:
        rows = np.flatnonzero(codes >= 0)
        return zip(rows.tolist(), map(decode, codes[rows].tolist()), strict=True)

    def many(rows: list[int]) -> list[Any]:
        at = np.asarray(rows, dtype=np.int64)
        inside = (at >= 0) & (at < size)
        coded = np.full(len(at), -1, dtype=np.int64)
        coded[inside] = codes[at[inside]]
        found = coded.tolist()
        decoded = {c: decode(c) for c in set(found) if c >= 0}  # a few sessions among ~100 rows
        return [decoded[c] if c >= 0 else None for c in found]

    return Overlay(base, present, lambda: int(np.count_nonzero(codes >= 0)), bulk, many)


def _flagged(
    has: np.ndarray, value: Callable[[int], Any], values: np.ndarray | None = None
) -> Overlay[int, Any]:
    """A row -> value dict holding the rows ``has`` flags (``values``: the values per row, when an array)."""
    size = len(has)

    def base(r: int) -> Any:
        return value(r) if 0 <= r < size and has[r] else None

    def present() -> list[int]:
        return np.flatnonzero(has).tolist()

    def pairs() -> Any:
        assert values is not None
        rows = np.flatnonzero(has)
        return zip(rows.tolist(), values[rows].tolist(), strict=True)

    return Overlay(base, present, lambda: int(np.count_nonzero(has)), None if values is None else pairs)


def _array_of(typecode: str, a: np.ndarray) -> array[Any]:
    """A typed array holding ``a``'s items (same item type), by one copy of its bytes: a term's postings
    are copied out of the mapped file on the first write that touches it (a record's), and
    ``array(typecode, a.tobytes())`` took ~45x as long (~0.6 ms at 60k postings against ~14 us)."""
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(a).data.cast("B"))
    return out


def _lexical(view: Callable[[str], np.ndarray], state: dict[str, Any]) -> LexicalIndex:
    lex = LexicalIndex.__new__(LexicalIndex)
    lex.analyzer = Analyzer(state["language"])
    lex.params = BM25Params(state["k1"], state["b"])
    terms = _strings(view, "term")
    off, rows, tfs = view("post.off"), view("post.rows"), view("post.tfs")
    df_off, df_group, df_count = view("post.df.off"), view("post.df.group"), view("post.df.count")

    def postings(t: str) -> _Postings | None:
        i = terms.find(t)
        return None if i < 0 else postings_at(i)

    def postings_at(i: int) -> _Postings:
        p = _Postings.__new__(_Postings)  # not __init__: its empty arrays would be thrown away at once
        p.rows, p.tfs = _array_of("q", csr(off, rows, i)), _array_of("f", csr(off, tfs, i))
        p.df = dict(zip(csr(df_off, df_group, i).tolist(), csr(df_off, df_count, i).tolist(), strict=True))
        p.cache, p.by_row, p.group_cache = None, None, {}
        return p

    def postings_bulk() -> Any:
        for i, t in enumerate(terms):
            p = postings_at(i)
            yield t, p

    lex._postings = Overlay(postings, lambda: iter(terms), len(terms), postings_bulk)  # type: ignore[assignment]
    doc_off, doc_codes, doc_has = view("doc.off"), view("doc.codes"), view("doc.has")
    lex._doc_terms = _flagged(  # type: ignore[assignment]
        doc_has, lambda r: [terms[c] for c in csr(doc_off, doc_codes, r).tolist()]
    )
    lex._doc_len, lex._alive, lex._group = view("lex.doc_len"), view("lex.alive"), view("lex.group")
    lex._total_len, lex._n_alive, lex._n_postings = state["total_len"], state["n_alive"], state["n_postings"]
    lex._group_n, lex._group_len = state["group_n"], state["group_len"]
    return lex


def _vectors(view: Callable[[str], np.ndarray], state: dict[str, Any], projected: bool) -> VectorIndex:
    v = VectorIndex.__new__(VectorIndex)
    v.dim, v.exact_below = state["dim"], state["exact_below"]
    # the search settings are the running code's, not the writer's (the state keeps them for older readers)
    v.proj_dim, v.rescore, v.code_share = state["proj_dim"], RESCORE, CODE_SHARE
    v._x, v._has = view("vectors"), view("vec.has")
    v._n, v._hi, v._fitted_at = state["n"], state["hi"], state["fitted_at"]
    v._proj = np.array(view("vec.proj")) if projected else None
    v._xp = view("projected") if projected else None
    v._mean = np.array(view("vec.mean")) if projected else None
    v._codes = view("vec.codes") if projected else None
    v._lock = threading.Lock()
    return v


def _check_layout(index: SearchIndex, dim: int) -> None:
    """The loaded objects have the attributes this version's classes set: a snapshot written before a field
    was added (or after one was dropped) is rebuilt, instead of failing at its first query."""
    fresh = SearchIndex(dim)
    pairs = ((index, fresh), (index.lexical, fresh.lexical), (index.vectors, fresh.vectors))
    for loaded, new in pairs:
        if set(vars(loaded)) != set(vars(new)):
            missing, extra = set(vars(new)) - set(vars(loaded)), set(vars(loaded)) - set(vars(new))
            raise SnapshotError(f"{type(new).__name__} changed shape (missing {missing}, unknown {extra})")
