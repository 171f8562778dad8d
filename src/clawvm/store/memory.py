"""The in-process reference engine: dicts plus the shared :class:`SearchIndex`. Nothing persists."""

from __future__ import annotations

import itertools
import json
from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np

from clawvm.core.errors import StoreError
from clawvm.core.model import STORED, Filters, Memory
from clawvm.core.vectors import normalize
from clawvm.store.base import (
    Claim,
    Credential,
    Edge,
    Event,
    GroupKey,
    PageKey,
    Query,
    QueryResult,
    Store,
    Unembedded,
    check_credential_version,
    check_import,
    check_stored,
    check_stored_vectors,
    check_versions,
    claimed,
    credential_json,
    credential_order,
)
from clawvm.store.index import SearchIndex, micros


class MemoryStore(Store):
    schemes = ("memory",)

    def __init__(self, dim: int = 384) -> None:
        super().__init__()
        self.dim = dim
        self._memories: dict[str, Memory] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._events: list[Event] = []
        self._events_dropped = 0  # events deleted from the head by retention; seq = index + this + 1
        # each tenant's events: (the log's seq, the event numbered in the tenant's own sequence), and the
        # last number each tenant has handed out (kept when retention drops its events: never reused)
        self._tenant_events: dict[str, list[tuple[int, Event]]] = {}
        self._tenant_last: dict[str, int] = {}
        self._index: SearchIndex | None = None
        self._credentials: dict[tuple[str, str, str], Credential] = {}  # by credential_order
        self._claim: Claim | None = None

    def setup(self) -> None:
        with self._lock:
            if self._index is None:
                self._index = SearchIndex(self.dim)

    def close(self) -> None:
        """Nothing to release; the data stays readable until the object is dropped."""

    @property
    def index(self) -> SearchIndex:
        if self._index is None:
            self.setup()
        assert self._index is not None
        return self._index

    def put_many(self, memories: Sequence[Memory], *, imported: Collection[str] = ()) -> None:
        with self._lock:
            stored = {m.id: self._memories[m.id].version for m in memories if m.id in self._memories}
            check_versions(memories, stored)
            check_stored(memories, stored, imported)
            for m in memories:
                old = self._memories.get(m.id)
                if old is not None and old.content != m.content:
                    self._vectors.pop(m.id, None)
                    self.index.drop_vector(m.id)
                # keep a private copy: Memory is mutable, and a caller changing the object it passed
                # (or got back) must not change what is stored behind the index's back
                self._memories[m.id] = private_copy(m)
                self.index.upsert(m)

    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        with self._lock:
            return {i: private_copy(self._memories[i]) for i in ids if i in self._memories}

    def tenants_of(self, ids: Sequence[str]) -> dict[str, str]:
        with self._lock:
            return self.index.tenants_of(ids)

    def delete_many(self, ids: Sequence[str]) -> int:
        with self._lock:
            n = 0
            for i in dict.fromkeys(ids):
                if self._memories.pop(i, None) is not None:
                    n += 1
                    self._vectors.pop(i, None)
                    self.index.remove(i)
            return n

    def count(self, filters: Filters | None = None) -> int:
        with self._lock:
            return self.index.count(filters or Filters())

    def group_counts(
        self, filters: Filters | None = None, expired_at: datetime | None = None
    ) -> dict[GroupKey, int]:
        with self._lock:
            return self.index.group_counts(filters or Filters(), expired_at)

    def query(self, query: Query) -> QueryResult:
        with self._lock:
            return self.index.query(query)

    def agents(self, filters: Filters) -> frozenset[str]:
        with self._lock:
            return self.index.agents(filters)

    def page(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> list[Memory]:
        key = None if after is None else (micros(after.created_at), after.id)
        with self._lock:
            ids = self.index.page(filters, key, limit, newest_first)
            return [private_copy(self._memories[i]) for i in ids]

    def session_ids(self, filters: Filters, after: str | None = None, limit: int = 500) -> list[str]:
        with self._lock:
            return self.index.session_ids(filters, after, limit)

    def tag_names(
        self, filters: Filters, prefix: str = "", after: str | None = None, limit: int = 500
    ) -> list[str]:
        with self._lock:
            return self.index.tag_names(filters, prefix, after, limit)

    def set_vectors(
        self, ids: Sequence[str], vectors: np.ndarray, contents: Sequence[str] | None = None
    ) -> None:
        vecs = check_stored_vectors(len(ids), vectors, self.dim)
        with self._lock:
            for n, (i, v) in enumerate(zip(ids, vecs, strict=True)):
                stored = self._memories.get(i)
                if stored is None:
                    continue
                if contents is None or (i not in self._vectors and stored.content == contents[n]):
                    self._vectors[i] = v
                    self.index.set_vector(i, v)

    def vectors_of(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        with self._lock:
            # kept as given (the index normalises its own copy): hand them out unit-normalised, as stored
            return {i: normalize(self._vectors[i]) for i in dict.fromkeys(ids) if i in self._vectors}

    def unembedded(self, limit: int) -> list[Unembedded]:
        with self._lock:
            out = [Unembedded(i, m.content) for i, m in self._memories.items() if i not in self._vectors]
            return out[:limit]

    def edges(self, ids: Sequence[str]) -> list[Edge]:
        wanted = set(ids)
        with self._lock:
            found = (
                Edge(m.id, link.type, link.target)
                for m in self._memories.values()
                for link in m.links
                if m.id in wanted or link.target in wanted
            )
            return list(dict.fromkeys(found))  # a memory may list the same link twice: one edge

    def append_events(self, events: Sequence[Event], *, tenant_numbers: bool = False) -> list[int]:
        with self._lock:
            seqs, numbers = [], []
            for e in events:
                seq = self._events_dropped + len(self._events) + 1
                self._events.append(replace(e, seq=seq))
                number = self._tenant_last[e.tenant] = self._tenant_last.get(e.tenant, 0) + 1
                self._tenant_events.setdefault(e.tenant, []).append((seq, replace(e, seq=number)))
                seqs.append(seq)
                numbers.append(number)
            return numbers if tenant_numbers else seqs

    def import_events(self, events: Sequence[Event], tenant_numbers: Sequence[int] | None = None) -> None:
        """Numbers are positions here: an empty log starts at the first imported number; a gap after that
        cannot be kept (StoreError, nothing written)."""
        with self._lock:
            newest = self._events_dropped + len(self._events)
            seqs = check_import(events, newest)
            if not self._events and seqs:
                self._events_dropped = newest = seqs[0] - 1
            if seqs != list(range(newest + 1, newest + 1 + len(seqs))):
                raise StoreError("memory:// numbers events without gaps: this log's numbering has gaps")
            self._events.extend(events)
            for n, e in enumerate(events):
                last = self._tenant_last.get(e.tenant, 0)
                number = tenant_numbers[n] if tenant_numbers is not None else last + 1
                self._tenant_last[e.tenant] = max(last, number)
                self._tenant_events.setdefault(e.tenant, []).append((seqs[n], replace(e, seq=number)))

    def read_events(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        memory_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Event]:
        with self._lock:
            if tenant is not None:
                own = self._tenant_events.get(tenant, [])
                # numbers are consecutive from the first one retention kept
                start = max(0, after_seq - (own[0][1].seq or 1) + 1) if own else 0
                mine = (e for _, e in own[start:] if memory_id is None or e.memory_id == memory_id)
                return list(itertools.islice(mine, max(0, limit)))
            start = max(0, after_seq - self._events_dropped)
            found = [e for e in self._events[start:] if memory_id is None or e.memory_id == memory_id]
            return found[:limit]

    def delete_events_upto(self, seq: int) -> int:
        with self._lock:
            n = max(0, min(len(self._events), seq - self._events_dropped))
            del self._events[:n]
            self._events_dropped += n
            for tenant, own in list(self._tenant_events.items()):
                del own[: bisect_right(own, seq, key=lambda pair: pair[0])]
                if not own:
                    del self._tenant_events[tenant]
            return n

    # ---- credentials: a dict apart from the event log, so retention never reaches them ----------------
    def put_credential(self, credential: Credential) -> None:
        data = json.loads(credential_json(credential))  # checked, and a private copy
        key = credential_order(credential)
        with self._lock:
            stored = self._credentials.get(key)
            check_credential_version(credential, None if stored is None else stored.version)
            self._credentials[key] = replace(credential, data=data)

    def find_credentials(self, kind: str, name: str) -> list[Credential]:
        with self._lock:
            found = [c for key, c in self._credentials.items() if key[1] == kind and key[2] == name]
        return [replace(c, data=_json_copy(c.data)) for c in sorted(found, key=credential_order)]

    def list_credentials(
        self,
        kind: str | None = None,
        tenant: str | None = None,
        after: Credential | None = None,
        limit: int = 1000,
    ) -> list[Credential]:
        start = None if after is None else credential_order(after)
        with self._lock:
            keys = sorted(
                key
                for key in self._credentials
                if (tenant is None or key[0] == tenant)
                and (kind is None or key[1] == kind)
                and (start is None or key > start)
            )
            page = [self._credentials[key] for key in keys[:limit]]
        return [replace(c, data=_json_copy(c.data)) for c in page]

    # ---- the claim: nothing persists here, so it only ever holds this object (there is nothing to reopen)
    def claim(self, claim: Claim) -> None:
        with self._lock:
            if self._claim is not None:
                raise claimed(self._claim, "this in-memory store", "drop it")
            self._claim = claim

    def held_claim(self) -> Claim | None:
        return self._claim

    def release(self, claim: Claim) -> None:
        with self._lock:
            if self._claim == claim:
                self._claim = None


def private_copy(m: Memory) -> Memory:
    """A copy sharing nothing mutable with ``m`` (4x cheaper than ``model_copy(deep=True)``: the other
    fields are immutable values, and ``links``/``cost`` hold frozen models)."""
    fresh = {"tags": list(m.tags), "links": list(m.links), "metadata": _json_copy(m.metadata)}
    return m.model_copy(update=fresh)


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars: what metadata holds): ~10x cheaper than
    ``copy.deepcopy``, which recall paid for every hit."""
    if isinstance(value, dict):
        return {k: _json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_copy(v) for v in value]
    return value


@lru_cache(maxsize=8192)
def _parse(body: str) -> Memory:
    """Stored JSON -> Memory, memoised on the exact text: hot rows (a session's working tier, recent hits)
    are read far more often than written, and validation costs ~25 µs a row (STORED: it was validated in
    full when written). Memory is immutable, so sharing one object between readers is safe."""
    return Memory.model_validate_json(body, context=STORED)


def from_stored(body: str) -> Memory:
    """The memory a database engine stored as ``body`` (its JSON), as a private copy: callers may mutate
    its lists, never the cached one."""
    return private_copy(_parse(body))
