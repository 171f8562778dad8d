"""The in-process search index shared by the ``memory`` and ``sqlite`` engines.

It maps memory ids to dense row numbers and keeps, per row: the filterable metadata as interned integer
columns (so a filter becomes a few vectorised numpy comparisons, ~0.1 ms per column at 100k rows), a
BM25 lexical index and a dense vector index. Engines keep the memories themselves (a dict, or the SQLite
file) and feed every write through here; on open the SQLite engine maps it from a snapshot (its dicts and
lists become :mod:`clawvm.store.mapped` overlays over flat arrays) or rebuilds it from the file's rows.
Not internally locked: the owning engine holds its lock around every call.
"""

from __future__ import annotations

import json
import math
import sys
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar

import numpy as np

from clawvm.core.entities import entities
from clawvm.core.lexical import LexicalIndex, top_rows, top_scores
from clawvm.core.model import Filters, Memory, Scope, Status, Visibility
from clawvm.core.vectors import VectorIndex
from clawvm.store.base import CandidateInfo, GroupKey, Query, QueryResult, Related, check_vectors
from clawvm.store.mapped import get_many, key_of, take

# a column for each field a filter matches against a set of values (the masks read them by those names),
# and the parent a revision names
_COLUMNS = (*Filters.SET_FIELDS, "parent_id")


#: Memories on each side of a memory (same session, by creation time) in its neighbourhood document.
#: Chosen on LoCoMo dev (bench/locomo.py --ablation), R@5 / R@10 of the default preset: ±1 69.0 / 78.1,
#: ±2 71.1 / 80.0, ±3 71.1 / 80.5: ±2 takes the gain; ±3 adds noise-level R@10 for more work per query.
CONTEXT_WINDOW = 2

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NEVER = np.iinfo(np.int64).max  # the expiry of a memory without one
_EXPIRED = -2  # group_counts' status code of an active row due to expire (no stored value has it)
#: A filter that leaves at most this many rows is scored row by row instead of over every posting.
SPARSE_ROWS = 4096
_MICROSECOND = timedelta(microseconds=1)


def micros(t: datetime) -> int:
    """Exact microseconds since the epoch. A float ``timestamp()`` cannot tell microseconds apart after
    about the year 2240 (or before 1700), which would break ``created_before``/``created_after``. A naive
    time is UTC, as everywhere in ClawVM (PostgreSQL reads it so: a store caller's naive filter raised
    TypeError on the other engines)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
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
    scope: str | None = None
    team_id: str | None = None
    expires_at: datetime | None = None

    @classmethod
    def from_json(cls, body: str | bytes) -> IndexDoc:
        d = json.loads(body)
        return cls(
            d["id"],
            d["content"],
            d["tenant"],
            d["session_id"],
            d["task_id"],
            d["agent_id"],
            d["tool_name"],
            d["kind"],
            d["state"],
            d["status"],
            d["tier"],
            d["parent_id"],
            d["tags"],
            d["pinned"],
            datetime.fromisoformat(d["created_at"]),
            d.get("scope"),
            d.get("team_id"),
            datetime.fromisoformat(d["expires_at"]) if d.get("expires_at") else None,
        )


class _Column:
    """An interned string column: one int32 code per row, -1 for None."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []  # code -> value
        self.data = np.full(1024, -1, dtype=np.int32)

    def set(self, row: int, value: str | None) -> None:
        if row >= len(self.data):
            grown = np.full(max(row + 1, 2 * len(self.data)), -1, dtype=np.int32)
            grown[: len(self.data)] = self.data
            self.data = grown
        if value is None:
            self.data[row] = -1
            return
        code = self.codes.get(value)
        if code is None:
            code = self.codes[value] = len(self.values)
            self.values.append(value)
        self.data[row] = code

    def isin(self, values: frozenset[str], rows: Rows) -> np.ndarray:
        """Which of ``rows`` hold one of ``values``."""
        codes = [self.codes[v] for v in values if v in self.codes]
        col = self.data[rows]
        if not codes:
            return np.zeros(len(col), dtype=bool)
        if len(codes) == 1:
            one: np.ndarray = col == codes[0]
            return one
        return np.isin(col, np.asarray(codes, dtype=np.int32))


#: The rows a mask is computed over: every row (``slice(0, size)``) or a session's rows (an index array).
Rows = slice | np.ndarray


class SearchIndex:
    """Per-row columns, the lexical and dense indexes, session order and entities.

    Sessions: the rows of each (tenant, session_id), ordered by (created_at, row), give every memory its
    previous/next neighbours and its *neighbourhood*: itself and ``window`` rows on each side. The context
    channel is BM25 over neighbourhood documents (the concatenation of their texts) computed at query time
    from the lexical postings (see :meth:`context_search`); writes only keep the session order and each
    neighbourhood's length current, O(window). Entities (:func:`clawvm.core.entities.entities` of the indexed
    text) map to the rows naming them. All of it is derived from the memories: a snapshot persists it, the
    rows rebuild it.

    (A materialised second inverted index over neighbourhood documents was measured first: same recall,
    but 2x the memory, 5x the reopen time and ~0.7 ms more per write at 100k memories.)
    """

    def __init__(self, dim: int, window: int = CONTEXT_WINDOW) -> None:
        self.ids: list[str | None] = []
        self.row_of: dict[str, int] = {}
        self.lexical = LexicalIndex()
        self.window = window
        self.vectors = VectorIndex(dim)
        self._session_of: dict[int, tuple[str, str]] = {}  # row -> (tenant, session_id)
        # one shared key tuple per session (100k rows hold a few thousand sessions), registered on joining
        self._session_keys: dict[tuple[str, str], tuple[str, str]] = {}
        self._prev = np.full(1024, -1, dtype=np.int64)  # same-session neighbours by creation time, -1 = none
        self._next = np.full(1024, -1, dtype=np.int64)
        self._ctx_len = np.zeros(1024, dtype=np.float32)  # neighbourhood document length
        self._version = 0  # bumped by every write: keys the context df cache
        # (term, tenant or None) -> (version, neighbourhoods holding it)
        self._ctx_df: dict[tuple[str, int | None], tuple[int, int]] = {}
        self._ctx_sum = (-1, 0.0)  # (version, total neighbourhood length)
        self._ctx_group_sum: dict[int, tuple[int, float]] = {}  # tenant -> (its version, its total length)
        self._last_mask: tuple[int, Filters, np.ndarray | None] | None = None
        self._sessions: dict[tuple[str, str], list[int]] = {}  # rows by (created_at, row)
        self._entities: dict[str, set[int]] = {}
        self._row_entities: dict[int, tuple[str, ...]] = {}
        self._entity_df: dict[tuple[str, int], int] = {}  # (entity, tenant) -> that tenant's rows naming it
        self._entity_group: dict[int, int] = {}  # row -> the tenant its entities were counted for
        self._cols = {name: _Column() for name in _COLUMNS}
        self._alive = np.zeros(1024, dtype=bool)
        self._created = np.zeros(1024, dtype=np.int64)  # microseconds since the epoch
        # the same instants as the memories' own datetimes: recall reads ~100 a query (CandidateInfo), and
        # building them from the microseconds was half of that read's cost
        self._created_at: list[datetime | None] = []
        self._pinned = np.zeros(1024, dtype=bool)
        self._expires = np.full(1024, _NEVER, dtype=np.int64)  # microseconds since the epoch; _NEVER = no ttl
        self._tags: dict[str, set[int]] = {}
        self._tag_names: list[str] = []  # every key of _tags, sorted: prefix and keyset walks (tag_names)
        self._row_tags: dict[int, list[str]] = {}
        # to skip re-tokenising unchanged text: a stable hash (hash() differs per process), kept by snapshots
        self._text_hash: dict[int, int] = {}
        self._agents: dict[str, frozenset[str]] = {}  # tenant -> agent_ids seen (never shrinks)
        # per tenant (its code in the tenant column, the lexical index's statistics group): writes to it,
        # so a cache of one tenant's corpus statistics ages with that tenant's writes alone
        self._tenant_version: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.row_of)

    def _grow(self, row: int) -> None:
        # one spare slot at least: the last entry of _prev/_next stays -1, so indexing them with -1 ("no
        # neighbour") gives -1 again and a hop along the session order is one fancy index (see _step)
        if row + 1 >= len(self._alive):
            size = max(row + 2, 2 * len(self._alive))
            for name, fill in (
                ("_alive", 0),
                ("_created", 0),
                ("_pinned", 0),
                ("_prev", -1),
                ("_next", -1),
                ("_ctx_len", 0),
                ("_expires", _NEVER),
            ):
                old = getattr(self, name)
                new = np.full(size, fill, dtype=old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)

    def upsert(self, memory: Memory | IndexDoc) -> int:
        """Index (or re-index) a memory; returns its row."""
        row = self.row_of.get(memory.id)
        if row is None:
            row = len(self.ids)
            self.ids.append(memory.id)
            self._created_at.append(None)
            self.row_of[memory.id] = row
            self._grow(row)
        for name, col in self._cols.items():
            v = getattr(memory, name)
            col.set(row, None if v is None else str(v))
        if memory.agent_id is not None and memory.agent_id not in self._agents.get(memory.tenant, ()):
            self._agents[memory.tenant] = self._agents.get(memory.tenant, frozenset()) | {memory.agent_id}
        created = micros(memory.created_at)
        moved = not self._alive[row] or self._created[row] != created
        self._alive[row] = True
        self._pinned[row] = memory.pinned
        self._expires[row] = _NEVER if memory.expires_at is None else micros(memory.expires_at)
        for tag in self._row_tags.pop(row, []):
            self._tags[tag].discard(row)
        for tag in memory.tags:
            tagged = self._tags.get(tag)
            if tagged is None:
                tagged = self._tags[tag] = set()
                insort(self._tag_names, tag)
            tagged.add(row)
        self._row_tags[row] = list(memory.tags)
        text = index_text(memory)
        group = self._cols["tenant"].codes[memory.tenant]
        old_group = self.lexical.group_of(row)
        text_key = key_of(text)
        changed = self._text_hash.get(row) != text_key or old_group != group
        self._version += 1
        self._wrote(group, old_group)
        old_len = float(self.lexical.doc_len[row]) if row < len(self.lexical.doc_len) else 0.0
        if changed:
            self.lexical.add(row, text, group)
            self._text_hash[row] = text_key
            self._set_entities(row, entities(text))
        # session order: leave the old place, take the new one; the neighbourhood lengths around both
        # places change by one memory in, one out (O(window))
        session = None if memory.session_id is None else (memory.tenant, memory.session_id)
        old_session = self._session_of.get(row)
        relocate = old_session != session or moved
        if old_session is not None and (relocate or changed):
            self._leave_session(row, old_session, old_len)
        self._created[row] = created
        self._created_at[row] = memory.created_at
        if session is not None and (relocate or changed):
            self._join_session(row, session)
        elif changed or relocate:
            self._ctx_len[row] = self.lexical.doc_len[row]
        return row

    def _wrote(self, *groups: int | None) -> None:
        for g in groups:
            if g is not None:
                self._tenant_version[g] = self._tenant_version.get(g, 0) + 1

    def _group(self, f: Filters) -> int | None:
        """The statistics group of the one tenant ``f`` confines rows to (None: ``f`` spans tenants, or
        names one that has never held a row: it matches nothing then). BM25's corpus statistics (document
        count, average length, document frequencies) are then that tenant's alone: what another tenant
        holds shows neither in its scores nor in its ranking."""
        if f.tenant is None or len(f.tenant) != 1:
            return None
        return self._cols["tenant"].codes.get(next(iter(f.tenant)))

    # ---- sessions and neighbourhoods --------------------------------------------------------------------
    def _order(self, row: int) -> tuple[int, int]:
        return int(self._created[row]), row

    def _position(self, row: int) -> tuple[list[int], int] | None:
        session = self._session_of.get(row)
        if session is None:
            return None
        rows = self._sessions[session]
        return rows, bisect_left(rows, self._order(row), key=self._order)

    def _join_session(self, row: int, session: tuple[str, str]) -> None:
        """Put ``row`` in its session order; the neighbourhoods around it gain it (and lose the row it pushes
        out of their window)."""
        session = self._session_keys.setdefault(session, session)
        rows = self._sessions.setdefault(session, [])
        insort(rows, row, key=self._order)
        self._session_of[row] = session
        i = bisect_left(rows, self._order(row), key=self._order)
        before = rows[i - 1] if i > 0 else -1
        after = rows[i + 1] if i + 1 < len(rows) else -1
        self._prev[row], self._next[row] = before, after
        if before >= 0:
            self._next[before] = row
        if after >= 0:
            self._prev[after] = row
        dl, ctx, w = self.lexical.doc_len, self._ctx_len, self.window
        own = dl[row]
        for j in range(max(0, i - w), i):
            ctx[rows[j]] += own - (dl[rows[j + w + 1]] if j + w + 1 < len(rows) else 0.0)
        for j in range(i + 1, min(len(rows), i + w + 1)):
            ctx[rows[j]] += own - (dl[rows[j - w - 1]] if j - w - 1 >= 0 else 0.0)
        ctx[row] = dl[rows[max(0, i - w) : i + w + 1]].sum()

    def _leave_session(self, row: int, session: tuple[str, str], own: float | None = None) -> None:
        """Take ``row`` out of its session order; the neighbourhoods around it lose it and gain the next row
        out. ``own`` is the row's length as its neighbours counted it (default: the current one)."""
        rows = self._sessions[session]
        where = self._position(row)
        assert where is not None
        i = where[1]
        dl, ctx, w = self.lexical.doc_len, self._ctx_len, self.window
        own = float(dl[row]) if own is None else own
        for j in range(max(0, i - w), i):
            ctx[rows[j]] += (dl[rows[j + w + 1]] if j + w + 1 < len(rows) else 0.0) - own
        for j in range(i + 1, min(len(rows), i + w + 1)):
            ctx[rows[j]] += (dl[rows[j - w - 1]] if j - w - 1 >= 0 else 0.0) - own
        del rows[i]
        if not rows:
            del self._sessions[session]
            del self._session_keys[session]
        del self._session_of[row]
        before, after = int(self._prev[row]), int(self._next[row])
        if before >= 0:
            self._next[before] = after
        if after >= 0:
            self._prev[after] = before
        self._prev[row] = self._next[row] = -1
        ctx[row] = 0.0

    def neighbours(self, row: int) -> tuple[int | None, int | None]:
        """The rows just before and just after ``row`` in its session (by creation time)."""
        before, after = int(self._prev[row]), int(self._next[row])
        return (before if before >= 0 else None), (after if after >= 0 else None)

    # ---- entity graph -----------------------------------------------------------------------------------
    def _set_entities(self, row: int, found: set[str]) -> None:
        counted = self._entity_group.pop(row, None)
        for e in self._row_entities.pop(row, ()):
            linked = self._entities[e]
            linked.discard(row)
            if not linked:
                del self._entities[e]
            if counted is not None:
                self._entity_df[e, counted] -= 1
                if not self._entity_df[e, counted]:
                    del self._entity_df[e, counted]
        if found:
            found = {sys.intern(e) for e in found}  # one string per entity, not one per mention
            self._row_entities[row] = tuple(sorted(found))
            group = self.lexical.group_of(row)
            if group is not None:
                self._entity_group[row] = group
            for e in found:
                self._entities.setdefault(e, set()).add(row)
                if group is not None:
                    self._entity_df[e, group] = self._entity_df.get((e, group), 0) + 1

    def agents(self, filters: Filters) -> frozenset[str]:
        """The agent_ids seen in the tenants ``filters`` allows (see :meth:`Store.agents`)."""
        tenants = self._agents.keys() if filters.tenant is None else filters.tenant
        found = [self._agents[t] for t in tenants if t in self._agents]
        return found[0] if len(found) == 1 else frozenset().union(*found)

    def entities_of(self, memory_id: str) -> tuple[str, ...]:
        """The entities extracted from a memory at write time (sorted)."""
        row = self.row_of.get(memory_id)
        return () if row is None else self._row_entities.get(row, ())

    def linked(self, entity: str) -> set[str]:
        """Ids of the memories that name ``entity``."""
        return {self.ids[r] for r in self._entities.get(entity, ())}  # type: ignore[misc]

    def related(
        self, seeds: list[int], limit: int, max_df: int, allowed: np.ndarray | None, group: int | None = None
    ) -> list[tuple[int, int, float]]:
        """Up to ``limit`` (seed, row, weight) links: rows sharing an entity with a seed, rarest first.

        An entity named by ``df`` memories (2 <= df <= max_df) weighs log(n / df) / log(n) in [0, 1]; a row
        reached from one seed through several entities is listed once, with its best weight. With ``group``
        (one tenant), n and df count that tenant's memories alone.
        """
        if limit <= 0:
            return []
        n = max(len(self.row_of) if group is None else self.lexical.corpus(group)[0], 2)
        links: list[tuple[float, int, str]] = []
        for s in seeds:
            for e in self._row_entities.get(s, ()):
                df = len(self._entities[e]) if group is None else self._entity_df.get((e, group), 0)
                if 2 <= df <= max_df:
                    links.append((math.log(n / df) / math.log(n), s, e))
        links.sort(key=lambda x: (-x[0], x[1], x[2]))
        out: list[tuple[int, int, float]] = []
        seen: set[tuple[int, int]] = set()
        for w, s, e in links:
            for r in sorted(self._entities[e]):
                if r == s or (s, r) in seen or (allowed is not None and not allowed[r]):
                    continue
                seen.add((s, r))
                out.append((s, r, w))
                if len(out) >= limit:
                    return out
        return out

    def remove(self, memory_id: str) -> None:
        row = self.row_of.pop(memory_id, None)
        if row is None:
            return
        self.ids[row] = None
        self._created_at[row] = None
        self._alive[row] = False
        for tag in self._row_tags.pop(row, []):
            self._tags[tag].discard(row)
        self._text_hash.pop(row, None)
        session = self._session_of.get(row)
        if session is not None:
            self._leave_session(row, session)
        self._set_entities(row, set())
        self._wrote(self.lexical.group_of(row))
        self.lexical.remove(row)
        self.vectors.remove(row)
        self._ctx_len[row] = 0.0
        self._version += 1

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
        in_session = self._session_match(f)
        if in_session is not None:  # the pager counts a session's tiers on every shed: no full-size mask
            rows, sub = in_session
            return len(rows) if sub is None else int(sub.sum())
        m = self.mask(f)
        return len(self.row_of) if m is None else int(m.sum())

    def group_counts(self, f: Filters, expired_at: datetime | None) -> dict[GroupKey, int]:
        """How many rows matching ``f`` hold each (kind, status, tier), as :meth:`Store.group_counts` says:
        the three codes of every matching row counted together, in one pass."""
        rows = self._matching_rows(f)
        kind, status, tier = (self._cols[name] for name in ("kind", "status", "tier"))
        codes = np.stack([kind.data[rows], status.data[rows], tier.data[rows]])
        active = status.codes.get(Status.ACTIVE.value)
        if expired_at is not None and active is not None:  # due counts as expired, as reads show it
            due = (codes[1] == active) & (self._expires[rows] <= micros(expired_at))
            codes[1][due] = _EXPIRED
        groups, counts = np.unique(codes, axis=1, return_counts=True)

        def status_of(code: int) -> str:
            return Status.EXPIRED.value if code == _EXPIRED else status.values[code]

        return {
            GroupKey(kind.values[k], status_of(s), tier.values[t]): n
            for (k, s, t), n in zip(groups.T.tolist(), counts.tolist(), strict=True)
        }

    def _matching_rows(self, f: Filters) -> np.ndarray:
        """The live rows matching ``f``, ascending (only the session's rows are tested when ``f`` names one
        tenant and one session)."""
        in_session = self._session_match(f)
        if in_session is not None:
            rows, sub = in_session
            return np.sort(rows if sub is None else rows[sub])
        m = self.mask(f)
        return np.flatnonzero(self._alive[: len(self.ids)] if m is None else m)

    def page(self, f: Filters, after: tuple[int, str] | None, limit: int, newest_first: bool) -> list[str]:
        """Ids of up to ``limit`` rows matching ``f`` in (created, id) order (descending with
        ``newest_first``) strictly beyond ``after`` = (created microseconds, id): a keyset page (see
        :meth:`Store.page`). Vectorised over the matching rows; only the page's own rows (and rows tied
        with its last creation time) are ordered in Python."""
        if limit <= 0:
            return []
        rows = self._matching_rows(f)
        created = self._created[rows]
        sign = -1 if newest_first else 1
        if after is not None:
            at, after_id = after
            keep = sign * created > sign * at
            for i in np.flatnonzero(created == at).tolist():  # same instant: the id decides
                other = self.ids[int(rows[i])]
                keep[i] = other is not None and (other < after_id if newest_first else other > after_id)
            rows, created = rows[keep], created[keep]
        if len(rows) > limit:  # the page's rows: everything up to the limit-th smallest key (with its ties)
            key = sign * created
            cut = np.partition(key, limit - 1)[limit - 1]
            near = key <= cut
            rows, created = rows[near], created[near]
        ids = self.ids
        order = sorted(
            zip(created.tolist(), [ids[r] for r in rows.tolist()], strict=True), reverse=newest_first
        )
        return [i for _, i in order[:limit]]

    def session_ids(self, f: Filters, after: str | None, limit: int) -> list[str]:
        """Distinct session ids of the rows matching ``f``, ascending, greater than ``after``."""
        codes = self._cols["session_id"].data[self._matching_rows(f)]
        values = self._cols["session_id"].values
        found = sorted(values[c] for c in np.unique(codes[codes >= 0]).tolist())
        start = 0 if after is None else bisect_right(found, after)
        return found[start : start + max(0, limit)]

    def tag_names(self, f: Filters, prefix: str, after: str | None, limit: int) -> list[str]:
        """Distinct tags starting with ``prefix`` of the rows matching ``f``, ascending, greater than
        ``after``: a walk of the sorted tag names from the first candidate, stopping after ``limit``
        (tags no matching row carries any more are stepped over)."""
        names = self._tag_names
        start = bisect_left(names, prefix)
        if after is not None and after >= prefix:
            start = bisect_right(names, after)
        allowed = self.mask(f)
        out: list[str] = []
        for at in range(start, len(names)):
            name = names[at]
            if len(out) >= limit or not name.startswith(prefix):
                break
            rows = self._tags[name]  # live rows only (removal and re-tagging discard theirs)
            if rows and (allowed is None or any(allowed[r] for r in rows)):
                out.append(name)
        return out

    def drop_vector(self, memory_id: str) -> None:
        row = self.row_of.get(memory_id)
        if row is not None:
            self.vectors.remove(row)

    def mask(self, f: Filters) -> np.ndarray | None:
        """Boolean row mask for ``f`` (same semantics as ``Filters.matches``); None = every live row.

        The last mask is reused until the next write (a recall asks twice). Callers must not modify it.
        """
        cached = self._last_mask
        if cached is not None and cached[0] == self._version and cached[1] == f:
            return cached[2]
        m = self._mask(f)
        self._last_mask = (self._version, f, m)
        return m

    def _mask(self, f: Filters) -> np.ndarray | None:
        size = len(self.ids)
        in_session = self._session_match(f)
        if in_session is None:
            return self._mask_over(f, slice(0, size))
        rows, sub = in_session
        out = np.zeros(size, dtype=bool)
        out[rows if sub is None else rows[sub]] = True
        return out

    def _session_match(self, f: Filters) -> tuple[np.ndarray, np.ndarray | None] | None:
        """When ``f`` names one tenant and one session: that session's rows and which of them match
        (None: all). Only those rows (tens to thousands) are tested, not every row of the index: the
        pager's budget checks and session-scoped recalls ask this on every record and query."""
        session = self._one_session(f)
        if session is None:
            return None
        rows = np.asarray(self._sessions.get(session, ()), dtype=np.int64)
        return rows, self._mask_over(f, rows)

    @staticmethod
    def _one_session(f: Filters) -> tuple[str, str] | None:
        """The (tenant, session_id) ``f`` confines rows to, when it names exactly one of each."""
        if f.tenant is None or f.session_id is None or len(f.tenant) != 1 or len(f.session_id) != 1:
            return None
        return next(iter(f.tenant)), next(iter(f.session_id))

    def _mask_over(self, f: Filters, rows: Rows) -> np.ndarray | None:
        """Which of ``rows`` match ``f`` (a mask aligned with ``rows``); None = every live row."""
        m: np.ndarray | None = None

        def both(x: np.ndarray) -> None:
            nonlocal m
            m = x if m is None else (m & x)

        for name in Filters.SET_FIELDS:
            allowed = getattr(f, name)
            if allowed is not None:
                both(self._cols[name].isin(allowed, rows))
        if f.parent_id is not None:
            both(self._cols["parent_id"].isin(frozenset([f.parent_id]), rows))
        for tag in f.tags_all:
            both(self._rows_mask(self._tags.get(tag, set()))[rows])
        if f.tags_any is not None:
            tagged: set[int] = set()
            for tag in f.tags_any:
                tagged |= self._tags.get(tag, set())
            both(self._rows_mask(tagged)[rows])
        if f.pinned is not None:
            both(self._pinned[rows] == f.pinned)
        if f.created_after is not None:
            both(self._created[rows] >= micros(f.created_after))
        if f.created_before is not None:
            both(self._created[rows] < micros(f.created_before))
        if f.visible_to is not None:
            both(self._visible(f.visible_to, rows))
        if f.expires_by is not None:
            both(self._expires[rows] <= micros(f.expires_by))
        if f.live_at is not None:
            both(self._expires[rows] > micros(f.live_at))
        if f.active_due_by is not None:
            active = self._cols["status"].isin(frozenset([Status.ACTIVE.value]), rows)
            both(~active | (self._expires[rows] <= micros(f.active_due_by)))
        if m is None:
            return None
        return m & self._alive[rows]

    def _visible(self, v: Visibility, rows: Rows) -> np.ndarray:
        """Which of ``rows`` ``v`` may read (the semantics of :meth:`Visibility.allows`, vectorised)."""
        scope, team, task = self._cols["scope"], self._cols["team_id"], self._cols["task_id"]
        teams = team.isin(v.teams, rows)
        out: np.ndarray = scope.data[rows] == -1
        out |= scope.isin(frozenset([Scope.PRIVATE.value]), rows) & self._cols["agent_id"].isin(
            frozenset([v.agent_id]), rows
        )
        out |= scope.isin(frozenset([Scope.TEAM.value]), rows) & teams
        out |= (
            scope.isin(frozenset([Scope.TASK.value]), rows)
            & task.isin(v.tasks, rows)
            & ((team.data[rows] == -1) | teams)
        )
        return out

    def _rows_mask(self, marked: set[int]) -> np.ndarray:
        """A mask over every row, True at ``marked``."""
        out = np.zeros(len(self.ids), dtype=bool)
        if marked:
            out[np.fromiter(marked, dtype=np.int64, count=len(marked))] = True
        return out

    def query(self, q: Query) -> QueryResult:
        allowed = self.mask(q.filters)
        group = self._group(q.filters)
        result = QueryResult()
        ids = self.ids
        found: list[list[tuple[int, float]]] = []
        if q.text and (q.lexical or q.context):
            terms = self.lexical.analyzer.terms(q.text)
            # the best rows by their own text: the lexical channel, and where the context channel looks
            best = self._lexical_best(terms, 2 * q.limit if q.context else q.limit, allowed, group)
            if q.lexical:
                found.append(best[: q.limit])
                result.lexical = _named(ids, found[-1])
            if q.context and best:
                best_rows = np.asarray([r for r, _ in best])
                found.append(self.context_search(terms, best_rows, q.limit, allowed, group))
                result.context = _named(ids, found[-1])
        if q.vector is not None:
            check_vectors(1, q.vector, self.vectors.dim, field="vector")
            found.append(self.vectors.search(q.vector, q.dense_k, allowed))
            result.dense = _named(ids, found[-1])
        if q.expand:
            seeds = [self.row_of[i] for i in dict.fromkeys(q.expand) if i in self.row_of]
            links = self.related(seeds, q.expand_limit, q.expand_max_df, allowed, group)
            result.related = [Related(_live(ids, s), _live(ids, r), w) for s, r, w in links]
            found.append([(r, w) for _, r, w in links])
        if q.info or q.around:
            rows = [r for hits in found for r, _ in hits] if q.info else []
            rows += [r for r in get_many(self.row_of, list(q.around)) if r is not None]
            result.info = self._info(np.asarray(rows, dtype=np.int64), allowed)
        if not q.text and q.vector is None and not q.expand and not q.around:
            live = self._alive[: len(ids)] if allowed is None else allowed
            rows_ = np.flatnonzero(live)
            created = self._created[rows_]
            # newest first; ties (same timestamp) broken by row, newest row first
            order = np.lexsort((-rows_, -created))[: q.limit]
            result.filtered = [ids[r] for r in rows_[order]]  # type: ignore[misc,unused-ignore]
        return result

    def _lexical_best(
        self, terms: list[str], limit: int, allowed: np.ndarray | None, group: int | None = None
    ) -> list[tuple[int, float]]:
        """The ``limit`` best (row, BM25) pairs among ``allowed`` rows (all of tenant ``group``'s, with its
        statistics, when given). A filter that leaves few rows (one namespace, one agent's memories) scores
        those rows alone, so the cost follows them and not the store's size; the scores are the same either
        way (:meth:`LexicalIndex.scores_of`)."""
        if allowed is not None and int(np.count_nonzero(allowed)) <= SPARSE_ROWS:
            rows = np.flatnonzero(allowed)
            few = self.lexical.scores_of(terms, rows, group)
            if few is None:
                return []
            picked, scores = top_scores(few, limit)
            return list(zip(rows[picked].tolist(), scores.tolist(), strict=True))
        own = self.lexical.scores(terms, group)
        return [] if own is None else top_rows(own, limit, allowed)

    @staticmethod
    def _step(rows: np.ndarray, links: np.ndarray) -> np.ndarray:
        """``links[rows]``, -1 where ``rows`` is -1 (one hop along the session order): ``links[-1]`` is the
        spare slot :meth:`_grow` keeps at -1."""
        hop: np.ndarray = links[rows]
        return hop

    def _around(self, rows: np.ndarray) -> list[np.ndarray]:
        """Per hop (0, -1, +1, -2, +2 ...): the row that many places away in the session, -1 if none."""
        out, back, ahead = [rows], rows, rows
        for _ in range(self.window):
            back, ahead = self._step(back, self._prev), self._step(ahead, self._next)
            out += [back, ahead]
        return out

    def context_search(
        self,
        terms: list[str],
        best: np.ndarray,
        limit: int,
        allowed: np.ndarray | None,
        group: int | None = None,
    ) -> list[tuple[int, float]]:
        """BM25 over neighbourhood documents: a row's document is its text and that of ``window`` rows on
        each side in its session, concatenated. Exact BM25 of those documents (summed term frequencies and
        lengths, document frequency and average length over all neighbourhoods), scored for the rows near
        ``best``, the best rows by their own text (the query builds it from the ``2 * limit`` best): a
        neighbourhood with none of them in it could only win through words that none of them has. With
        ``group`` (one tenant), the statistics are that tenant's neighbourhoods' alone (sessions never
        span tenants, so neither does a neighbourhood).
        """
        n = len(self.row_of) if group is None else self.lexical.corpus(group)[0]
        if len(best) == 0 or n == 0 or limit <= 0:
            return []
        cand = np.unique(np.concatenate(self._around(best)))
        cand = cand[cand >= 0]
        if allowed is not None:
            cand = cand[allowed[cand]]
        if len(cand) == 0:
            return []
        members = np.stack(self._around(cand))  # (2 * window + 1, candidates); -1 = no such neighbour
        # look each distinct member up once, in sorted order (binary searches over sorted needles)
        uniq, inverse = np.unique(members, return_inverse=True)
        inverse = inverse.reshape(members.shape)
        ctx_len = self._ctx_len[cand]
        avgdl = max(self._context_total(group) / n, 1.0)
        k1, b = self.lexical.params.k1, self.lexical.params.b
        norm = k1 * (1.0 - b + b * ctx_len / avgdl)
        present: list[str] = []  # the query terms some candidate neighbourhood holds, and their tfs
        tfs: list[np.ndarray] = []
        for t in dict.fromkeys(terms):
            tf_uniq = self.lexical.tf(t, uniq)
            if tf_uniq is not None and tf_uniq.any():
                present.append(t)
                tfs.append(tf_uniq)
        if not present:
            return []
        # all terms at once: (terms, members, candidates) -> summed over members -> (terms, candidates)
        tf = np.stack(tfs)[:, inverse].sum(axis=1)
        idf = np.array([self.lexical.idf(self._context_df(t, group), n) for t in present], dtype=np.float32)
        scores = (idf[:, None] * tf * (k1 + 1.0) / np.maximum(tf + norm, 1e-9)).sum(axis=0)
        at, best = top_scores(scores, limit)
        return list(zip(cand[at].tolist(), best.tolist(), strict=True))

    def _context_total(self, group: int | None) -> float:
        """The total neighbourhood length of every row, or of tenant ``group``'s rows."""
        size = len(self.ids)
        if group is None:
            if self._ctx_sum[0] != self._version:
                self._ctx_sum = (self._version, float(self._ctx_len[:size].sum()))
            return self._ctx_sum[1]
        cached = self._ctx_group_sum.get(group)
        version = self._tenant_version.get(group, 0)
        if cached is None or cached[0] != version:
            mine = self._ctx_len[:size][self._cols["tenant"].data[:size] == group]
            cached = self._ctx_group_sum[group] = (version, float(mine.sum()))
        return cached[1]

    def _context_df(self, term: str, group: int | None = None) -> int:
        """How many neighbourhoods (of tenant ``group``'s rows, when given) hold ``term``: the rows within
        ``window`` of one of its postings."""
        key = (term, group)
        cached = self._ctx_df.get(key)
        if group is None:
            version, n = self._version, len(self.row_of)
        else:
            version, n = self._tenant_version.get(group, 0), self.lexical.corpus(group)[0]
        # a count at most n/200 writes old is kept (exact below 200 memories): idf is a log, so the few
        # neighbourhoods those writes could add change it by a fraction of a percent, while recounting
        # after every write cost a busy store ~0.5 ms per common query term (a pass over its postings)
        if cached is not None and version - cached[0] <= n // 200:
            return cached[1]
        post = self.lexical.postings(term)
        if post is None:
            return 0
        rows = post[0]
        if group is not None:
            rows = rows[self._cols["tenant"].data[rows] == group]
        mark = np.zeros(len(self.ids) + 1, dtype=bool)
        for hop in self._around(rows):
            mark[hop] = True
        df = int(mark[:-1].sum())
        if len(self._ctx_df) > 50_000:
            self._ctx_df.clear()
        self._ctx_df[key] = (version, df)
        return df

    def tenants_of(self, ids: Sequence[str]) -> dict[str, str]:
        """The tenant of each indexed memory among ``ids`` (a tenant's view asks it of the ids it is
        handed: read here, ~40 ids cost ~0.05 ms against ~0.7 ms by the rows of a big file)."""
        wanted = list(ids)
        found = [(i, r) for i, r in zip(wanted, get_many(self.row_of, wanted), strict=True) if r is not None]
        found = [(i, r) for i, r in found if self._alive[r]]
        if not found:
            return {}
        tenant = self._cols["tenant"]
        names = _lookup(tenant.values, tenant.data[np.fromiter((r for _, r in found), dtype=np.int64)])
        return {i: name for (i, _), name in zip(found, names, strict=True) if name is not None}

    def _info(self, rows: np.ndarray, allowed: np.ndarray | None) -> dict[str, CandidateInfo]:
        """CandidateInfo for ``rows`` and for their neighbours that ``allowed`` lets through."""
        near = np.concatenate([self._prev[rows], self._next[rows]])
        near = near[near >= 0]
        if allowed is not None:
            near = near[allowed[near]]
        rows = np.union1d(rows, near)
        at = rows.tolist()
        sessions = get_many(self._session_of, at)
        agents = self._cols["agent_id"]
        # each field in one batched read (this runs for ~100 rows per recall, and on a mapped index one
        # read per row cost ~12x as much); -1 (no such row) -> None
        fields = zip(
            take(self._created_at, at),
            [s[1] if s is not None else None for s in sessions],
            _lookup(self.ids, self._prev[rows]),
            _lookup(self.ids, self._next[rows]),
            _lookup(agents.values, agents.data[rows]),
            self.lexical.doc_len[rows].astype(np.int64).tolist(),
            strict=True,
        )
        return dict(zip(take(self.ids, at), map(_info_of, fields), strict=True))  # type: ignore[arg-type]


T = TypeVar("T")
_info_of = partial(tuple.__new__, CandidateInfo)  # CandidateInfo(*fields) without a Python-level frame


def _live(ids: Sequence[str | None], row: int) -> str:
    """The id of a live row (a removed row's id is None: no search reaches it)."""
    found = ids[row]
    assert found is not None, f"row {row} was removed"
    return found


def _named(ids: Sequence[str | None], hits: list[tuple[int, float]]) -> list[tuple[str, float]]:
    """(id, score) for (row, score) hits, the ids read in one batch."""
    names = take(ids, [r for r, _ in hits])
    if None in names:  # a search reaches live rows only: the index contradicts itself (a damaged snapshot)
        raise LookupError(f"a hit on row {hits[names.index(None)][0]}, which holds no memory")
    return list(zip(names, [s for _, s in hits], strict=True))  # type: ignore[arg-type]


def _lookup(items: Sequence[T], at: np.ndarray) -> list[T | None]:
    """``[items[i] for i in at]``, None where ``i`` is -1, in one C-level pass."""
    if not items:
        return [None] * len(at)
    out: list[T | None] = take(items, np.maximum(at, 0).tolist())
    for i in np.flatnonzero(at < 0).tolist():
        out[i] = None
    return out
