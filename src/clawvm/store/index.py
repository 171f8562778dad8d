"""The in-process search index shared by the ``memory`` and ``sqlite`` engines.

It maps memory ids to dense row numbers and keeps, per row: the filterable metadata as interned integer
columns (so a filter becomes a few vectorised numpy comparisons, ~0.1 ms per column at 100k rows), a
BM25 lexical index and a dense vector index. Engines keep the memories themselves (a dict, or the SQLite
file) and feed every write through here; on open the SQLite engine rebuilds it from the file's rows.
Not internally locked: the owning engine holds its lock around every call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from ..lexical import LexicalIndex
from ..model import Filters, Memory
from ..vectors import VectorIndex
from .base import Query, QueryResult, check_vectors

_COLUMNS = (
    "tenant", "session_id", "task_id", "agent_id", "tool_name", "kind", "state", "status", "tier", "parent_id"
)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(t: datetime) -> int:
    """Exact microseconds since the epoch. A float ``timestamp()`` cannot tell microseconds apart after
    about the year 2240 (or before 1700), which would break ``created_before``/``created_after``."""
    return (t - _EPOCH) // _MICROSECOND


def index_text(memory: Memory | IndexDoc) -> str:
    """The text the lexical index sees for a memory: its content, tags and tool name."""
    extra = " ".join([*memory.tags, memory.tool_name or ""])
    return f"{memory.content} {extra}" if extra.strip() else memory.content


@dataclass(slots=True)
class IndexDoc:
    """The fields the index reads, parsed straight from a stored memory's JSON.

    Rebuilding the index on open from these is ~5x cheaper than validating every row into a Memory
    (at 100k rows: seconds, not tens of seconds). ``SearchIndex.upsert`` takes either.
    """

    id: str
    content: str
    tenant: str
    session_id: str | None
    task_id: str | None
    agent_id: str | None
    tool_name: str | None
    kind: str
    state: str | None
    status: str
    tier: str
    parent_id: str | None
    tags: list[str]
    pinned: bool
    created_at: datetime

    @classmethod
    def from_json(cls, body: str | bytes) -> IndexDoc:
        d = json.loads(body)
        return cls(
            d["id"], d["content"], d["tenant"], d["session_id"], d["task_id"], d["agent_id"], d["tool_name"],
            d["kind"], d["state"], d["status"], d["tier"], d["parent_id"], d["tags"], d["pinned"],
            datetime.fromisoformat(d["created_at"]),
        )


class _Column:
    """An interned string column: one int32 code per row, -1 for None."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.data = np.full(1024, -1, dtype=np.int32)

    def set(self, row: int, value: str | None) -> None:
        if row >= len(self.data):
            grown = np.full(max(row + 1, 2 * len(self.data)), -1, dtype=np.int32)
            grown[: len(self.data)] = self.data
            self.data = grown
        if value is None:
            self.data[row] = -1
        else:
            self.data[row] = self.codes.setdefault(value, len(self.codes))

    def isin(self, values: frozenset[str], size: int) -> np.ndarray:
        codes = [self.codes[v] for v in values if v in self.codes]
        col = self.data[:size]
        if not codes:
            return np.zeros(size, dtype=bool)
        if len(codes) == 1:
            one: np.ndarray = col == codes[0]
            return one
        return np.isin(col, np.asarray(codes, dtype=np.int32))


class SearchIndex:
    def __init__(self, dim: int) -> None:
        self.ids: list[str | None] = []
        self.row_of: dict[str, int] = {}
        self.lexical = LexicalIndex()
        self.vectors = VectorIndex(dim)
        self._cols = {name: _Column() for name in _COLUMNS}
        self._alive = np.zeros(1024, dtype=bool)
        self._created = np.zeros(1024, dtype=np.int64)  # microseconds since the epoch
        self._pinned = np.zeros(1024, dtype=bool)
        self._tags: dict[str, set[int]] = {}
        self._row_tags: dict[int, list[str]] = {}
        self._text_hash: dict[int, int] = {}  # to skip re-tokenising unchanged text

    def __len__(self) -> int:
        return len(self.row_of)

    def _grow(self, row: int) -> None:
        if row >= len(self._alive):
            size = max(row + 1, 2 * len(self._alive))
            for name in ("_alive", "_created", "_pinned"):
                old = getattr(self, name)
                new = np.zeros(size, dtype=old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)

    def upsert(self, memory: Memory | IndexDoc) -> int:
        """Index (or re-index) a memory; returns its row."""
        row = self.row_of.get(memory.id)
        if row is None:
            row = len(self.ids)
            self.ids.append(memory.id)
            self.row_of[memory.id] = row
            self._grow(row)
        for name, col in self._cols.items():
            v = getattr(memory, name)
            col.set(row, None if v is None else str(v))
        self._alive[row] = True
        self._created[row] = micros(memory.created_at)
        self._pinned[row] = memory.pinned
        for tag in self._row_tags.pop(row, []):
            self._tags[tag].discard(row)
        for tag in memory.tags:
            self._tags.setdefault(tag, set()).add(row)
        self._row_tags[row] = list(memory.tags)
        text = index_text(memory)
        if self._text_hash.get(row) != hash(text):
            self.lexical.add(row, text)
            self._text_hash[row] = hash(text)
        return row

    def remove(self, memory_id: str) -> None:
        row = self.row_of.pop(memory_id, None)
        if row is None:
            return
        self.ids[row] = None
        self._alive[row] = False
        for tag in self._row_tags.pop(row, []):
            self._tags[tag].discard(row)
        self._text_hash.pop(row, None)
        self.lexical.remove(row)
        self.vectors.remove(row)

    def set_vector(self, memory_id: str, vector: np.ndarray) -> bool:
        row = self.row_of.get(memory_id)
        if row is None:
            return False
        self.vectors.add([row], vector.reshape(1, -1))
        return True

    def set_vectors(self, ids: list[str], vectors: np.ndarray) -> None:
        """Batched :meth:`set_vector` (unknown ids skipped)."""
        keep = [n for n, i in enumerate(ids) if i in self.row_of]
        if keep:
            self.vectors.add([self.row_of[ids[n]] for n in keep], vectors[keep])

    def count(self, f: Filters) -> int:
        m = self.mask(f)
        return len(self.row_of) if m is None else int(m.sum())

    def drop_vector(self, memory_id: str) -> None:
        row = self.row_of.get(memory_id)
        if row is not None:
            self.vectors.remove(row)

    def mask(self, f: Filters) -> np.ndarray | None:
        """Boolean row mask for ``f`` (same semantics as ``Filters.matches``); None = every live row."""
        size = len(self.ids)
        m: np.ndarray | None = None

        def both(x: np.ndarray) -> None:
            nonlocal m
            m = x if m is None else (m & x)

        for name in Filters.SET_FIELDS:
            allowed = getattr(f, name)
            if allowed is not None:
                both(self._cols[name].isin(allowed, size))
        if f.parent_id is not None:
            both(self._cols["parent_id"].isin(frozenset([f.parent_id]), size))
        for tag in f.tags_all:
            both(self._rows_mask(self._tags.get(tag, set()), size))
        if f.tags_any is not None:
            rows: set[int] = set()
            for tag in f.tags_any:
                rows |= self._tags.get(tag, set())
            both(self._rows_mask(rows, size))
        if f.pinned is not None:
            both(self._pinned[:size] == f.pinned)
        if f.created_after is not None:
            both(self._created[:size] >= micros(f.created_after))
        if f.created_before is not None:
            both(self._created[:size] < micros(f.created_before))
        if m is None:
            return None
        return m & self._alive[:size]

    @staticmethod
    def _rows_mask(rows: set[int], size: int) -> np.ndarray:
        out = np.zeros(size, dtype=bool)
        if rows:
            out[np.fromiter(rows, dtype=np.int64, count=len(rows))] = True
        return out

    def query(self, q: Query) -> QueryResult:
        allowed = self.mask(q.filters)
        result = QueryResult()
        ids = self.ids
        if q.text:
            result.lexical = [(ids[r], s) for r, s in self.lexical.search(q.text, q.limit, allowed)]  # type: ignore[misc]
        if q.vector is not None:
            check_vectors(1, q.vector, self.vectors.dim, field="vector")
            result.dense = [(ids[r], s) for r, s in self.vectors.search(q.vector, q.limit, allowed)]  # type: ignore[misc]
        if not q.text and q.vector is None:
            live = self._alive[: len(ids)] if allowed is None else allowed
            rows = np.flatnonzero(live)
            created = self._created[rows]
            # newest first; ties (same timestamp) broken by row, newest row first
            order = np.lexsort((-rows, -created))[: q.limit]
            result.filtered = [ids[r] for r in rows[order]]  # type: ignore[misc,unused-ignore]
        return result
