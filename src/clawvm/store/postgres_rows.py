"""A memory as PostgreSQL rows: what :meth:`PostgresStore.put_many <clawvm.store.postgres.PostgresStore>`
prepares of each memory (its columns, its postings and entities, its hashes), what it reads back of the
stored ones, and the statements that write them (``memories``, ``vectors``, ``postings``, ``entities``,
``agents``, ``tenant_lexstats``). The engine owns the connections and the transaction; this module only
shapes rows and statements.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

import numpy as np
import psycopg

from clawvm.core.model import Memory
from clawvm.store.index import index_text
from clawvm.store.postgres_search import esc

SLOTS = 16  # counter rows per tenant in tenant_lexstats (each connection adds to its own)


@dataclass(slots=True)
class MemoryRow:
    """A memory prepared for writing: what its columns and index tables need."""

    memory: Memory
    body: str
    text: str  # what the lexical index sees (index_text)
    text_hash: int
    content_hash: bytes
    doc_len: int = 0
    terms: Counter[str] | None = None  # filled only when its text is (re)indexed
    entities: list[str] | None = None
    vector: np.ndarray | None = None  # unit vector written with the row (Store.write), else none/kept


COLUMNS = (
    "id",
    "tenant",
    "session_id",
    "task_id",
    "agent_id",
    "tool_name",
    "scope",
    "team_id",
    "kind",
    "state",
    "status",
    "tier",
    "parent_id",
    "pinned",
    "tags",
    "created_at",
    "version",
    "doc_len",
    "text_hash",
    "content_hash",
    "metadata",
    "body",
    "expires_at",
)
# the row and its vector, when known, in one statement: one write per record
INSERT_ROW = f"""WITH m AS (INSERT INTO memories ({", ".join(COLUMNS)}, embedded)
        VALUES ({", ".join(["%s"] * len(COLUMNS))}, %s) RETURNING tenant, seq)
    INSERT INTO vectors SELECT m.tenant, m.seq, %b::vector FROM m WHERE %s"""
# the row only: its vector is another table's (see VectorChanges), so a bookkeeping update that changes
# no indexed column rewrites a row without it and stays HOT when the page has room
UPDATE_ROW = f"""UPDATE memories SET {", ".join(f"{c} = %s" for c in COLUMNS[1:])}, embedded = %s
              WHERE id = %s"""
# a memory's vector (Store.set_vectors): {only} narrows the rows, {conflict} says what a stored one gets
SET_VECTOR = """WITH m AS (UPDATE memories SET embedded = true WHERE id = %s{only} RETURNING tenant, seq)
    INSERT INTO vectors SELECT m.tenant, m.seq, %b::vector FROM m ON CONFLICT (tenant, seq) DO {conflict}"""
REPLACE_VECTOR = "UPDATE SET embedding = excluded.embedding"
# a given vector for a row the same write just stored (its ``embedded`` is set by the row's own statement)
PUT_VECTOR = (
    """INSERT INTO vectors SELECT m.tenant, m.seq, %b::vector FROM memories m WHERE m.id = %s
    ON CONFLICT (tenant, seq) DO """
    + REPLACE_VECTOR
)
# what put_many reads of the stored versions of a batch, and the lock it takes on them (in id order, so
# concurrent batches cannot deadlock)
STORED = """SELECT id, seq, version, text_hash, content_hash, doc_len, session_id IS NOT NULL, tenant,
    embedded, agent_id FROM memories"""
LOCKED = " ORDER BY id FOR UPDATE"
INSERT_POSTINGS = """INSERT INTO postings (tenant, term, seq, tf, dl)
    SELECT t.tenant, t.term, m.seq, t.tf, t.dl
    FROM unnest(%s::text[], %s::text[], %s::uuid[], %s::int[], %s::int[]) AS t(tenant, term, id, tf, dl)
    JOIN memories m ON m.tenant = t.tenant AND m.id = t.id"""
INSERT_ENTITIES = """INSERT INTO entities (tenant, entity, seq)
    SELECT t.tenant, t.entity, m.seq FROM unnest(%s::text[], %s::text[], %s::uuid[]) AS t(tenant, entity, id)
    JOIN memories m ON m.tenant = t.tenant AND m.id = t.id"""
# an agent's first memory in a tenant adds it; a known one is only read (writers of one agent do not queue
# on its row: an insert that conflicts would wait for the other writer's commit)
ADD_AGENTS = """INSERT INTO agents
    SELECT t.tenant, t.agent_id FROM unnest(%s::text[], %s::text[]) AS t(tenant, agent_id)
    WHERE NOT EXISTS (SELECT 1 FROM agents a WHERE a.tenant = t.tenant AND a.agent_id = t.agent_id)
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING"""
# each connection adds to its own counter rows, so writers do not queue on one hot row (rows in tenant
# order: two writers lock shared rows in one order, never a deadlock)
ADD_TENANT_STATS = f"""INSERT INTO tenant_lexstats AS s
    SELECT t.tenant, pg_backend_pid() %% {SLOTS}, t.docs, t.total_len, t.sessioned
    FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[]) AS t(tenant, docs, total_len, sessioned)
    ORDER BY t.tenant
    ON CONFLICT (tenant, slot) DO UPDATE SET docs = s.docs + excluded.docs,
        total_len = s.total_len + excluded.total_len, sessioned = s.sessioned + excluded.sessioned"""


@dataclass(frozen=True, slots=True)
class StoredRow:
    """What :meth:`PostgresStore._put` reads of a stored row before replacing it."""

    seq: int
    version: int
    text_hash: int
    content_hash: bytes
    doc_len: int
    sessioned: bool
    tenant: str
    embedded: bool
    agent: str | None


@dataclass(slots=True)
class VectorChanges:
    """What an update of stored rows does to their vectors: a given vector replaces the stored one; a
    changed text drops it (it was computed from the old text); a memory moved to another tenant takes its
    vector along; otherwise (bookkeeping) the vector is not touched at all."""

    embedded: dict[str, bool]  # memory id -> whether it has a vector after the write
    put: list[tuple[str, np.ndarray]]  # (memory id, unit vector)
    drop: list[tuple[str, int]]  # stored (tenant, seq)
    moved: list[tuple[str, str, int]]  # (new tenant, stored tenant, seq)

    @classmethod
    def of(cls, updated: list[MemoryRow], stored: dict[str, StoredRow]) -> VectorChanges:
        out = cls({}, [], [], [])
        for r in updated:
            old = stored[r.memory.id]
            tenant = esc(r.memory.tenant) or ""
            if r.vector is not None:
                if old.embedded and old.tenant != tenant:
                    out.drop.append((old.tenant, old.seq))
                out.put.append((r.memory.id, r.vector))
                out.embedded[r.memory.id] = True
            elif old.embedded and old.content_hash != r.content_hash:
                out.drop.append((old.tenant, old.seq))
                out.embedded[r.memory.id] = False
            else:
                if old.embedded and old.tenant != tenant:
                    out.moved.append((tenant, old.tenant, old.seq))
                out.embedded[r.memory.id] = old.embedded
        return out

    def send(self, cur: psycopg.Cursor[Any]) -> None:
        """The statements, on ``cur`` (in the caller's pipeline, after the rows' update)."""
        if self.drop:
            cur.execute(
                "DELETE FROM vectors WHERE (tenant, seq) IN (SELECT * FROM unnest(%s::text[], %s::bigint[]))",
                [list(col) for col in zip(*self.drop, strict=True)],
            )
        if self.moved:
            cur.executemany("UPDATE vectors SET tenant = %s WHERE tenant = %s AND seq = %s", self.moved)
        if self.put:
            cur.executemany(PUT_VECTOR, [(v, i) for i, v in self.put])


class TenantStats:
    """One write's changes to :data:`ADD_TENANT_STATS`'s counters, by stored tenant."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, list[int]] = {}

    def add(self, tenant: str, docs: int, total_len: int, sessioned: int) -> None:
        d = self.by_tenant.setdefault(tenant, [0, 0, 0])
        d[0] += docs
        d[1] += total_len
        d[2] += sessioned

    def changed(self) -> bool:
        return any(any(d) for d in self.by_tenant.values())

    def arrays(self) -> list[list[Any]]:
        tenants = sorted(t for t, d in self.by_tenant.items() if any(d))
        return [tenants, *([self.by_tenant[t][i] for t in tenants] for i in range(3))]


def content_hash(content: str) -> bytes:
    return blake2b(content.encode("utf-8"), digest_size=16).digest()


def prepare(m: Memory) -> MemoryRow:
    text = index_text(m)
    digest = blake2b(text.encode("utf-8"), digest_size=8).digest()
    text_hash = int.from_bytes(digest, "big", signed=True)
    return MemoryRow(m, m.model_dump_json(), text, text_hash, content_hash(m.content))


def postings_of(rows: list[MemoryRow]) -> list[list[Any]]:
    """The postings of ``rows`` as the five arrays :data:`INSERT_POSTINGS` takes."""
    tenants: list[str] = []
    terms: list[str] = []
    ids: list[str] = []
    tfs: list[int] = []
    lens: list[int] = []
    for r in rows:
        assert r.terms is not None
        for term, tf in r.terms.items():
            tenants.append(esc(r.memory.tenant) or "")
            terms.append(term)
            ids.append(r.memory.id)
            tfs.append(tf)
            lens.append(r.doc_len)
    return [tenants, terms, ids, tfs, lens]


def columns_of(r: MemoryRow) -> tuple[Any, ...]:
    """The row's values in :data:`COLUMNS` order."""
    m = r.memory
    meta = json.dumps(m.metadata, ensure_ascii=False)
    return (
        m.id,
        esc(m.tenant),
        esc(m.session_id),
        esc(m.task_id),
        esc(m.agent_id),
        esc(m.tool_name),
        m.scope.value if m.scope else None,
        esc(m.team_id),
        m.kind.value,
        m.state.value if m.state else None,
        m.status.value,
        m.tier.value,
        m.parent_id,
        m.pinned,
        [esc(t) for t in m.tags],
        m.created_at,
        m.version,
        r.doc_len,
        r.text_hash,
        r.content_hash,
        None if "\\u0000" in meta else meta,  # jsonb cannot hold NUL; the body keeps it
        r.body,
        m.expires_at,
    )
