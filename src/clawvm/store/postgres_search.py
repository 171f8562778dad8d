"""The query side of the PostgreSQL engine: filters compiled to SQL and the search channels.

Every channel returns what the in-process :class:`~clawvm.store.index.SearchIndex` returns for the same
data (see ``store/base.py`` :class:`Query`), computed from the tables instead of from memory:

- ``filtered``: the filters as a ``WHERE`` clause, newest first (ties: the later-inserted row first);
- ``lexical``: BM25 with the same analyzer, formula and parameters, from the ``postings`` table (term,
  row, term frequency), the sharded document counters (``lexstats``) and per-term document frequencies
  counted from the postings' primary key: the scores are the in-process ones up to float rounding;
- ``context``: BM25 over neighbourhood documents, scored exactly (summed term frequencies and lengths of
  the ``window`` memories on each side in the session) for the rows near the best own-text rows, as
  in process. Two corpus statistics are estimated instead of maintained on every write: a term's
  neighbourhood document frequency (its document frequency spread over ``2 * window + 1`` neighbourhoods
  for the share of memories that have a session) and the average neighbourhood length (the same
  spread of the average length). Ranking inside one query is what they shape, and it is insensitive to
  both;
- ``dense``: pgvector's HNSW index (inner product of unit vectors = cosine) with iterative scans, so
  filtered queries still fill their limit; an exact scan of the filtered rows when the index comes back
  short (few rows pass the filters, or the limit is beyond what HNSW serves);
- ``info``/``around``: creation time, session and same-session neighbours from the session index;
- ``related``: the write-time entity graph (``entities`` table), weighted and ordered as in process.

Text columns that may hold NUL (which PostgreSQL's ``text`` cannot) are stored through :func:`esc`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from hashlib import blake2b
from typing import Any

import numpy as np
import psycopg

from clawvm.core.errors import StoreError
from clawvm.core.ids import is_valid_id
from clawvm.core.lexical import Analyzer, BM25Params, LexicalIndex
from clawvm.core.model import Filters, Scope, Visibility
from clawvm.store.base import CandidateInfo, Query, QueryResult, check_vectors
from clawvm.store.index import CONTEXT_WINDOW

# ---- values ----------------------------------------------------------------------------------------------
_UNESC = re.compile(r"\\(.)", re.DOTALL)


def esc(value: str | None) -> str | None:
    """A text value as stored: unchanged unless it holds a backslash or NUL, which are escaped (``\\\\``,
    ``\\0``). Injective, so equality filters on stored values stay exact."""
    if value is None or ("\\" not in value and "\x00" not in value):
        return value
    return value.replace("\\", "\\\\").replace("\x00", "\\0")


def unesc(value: str | None) -> str | None:
    if value is None or "\\" not in value:
        return value
    return _UNESC.sub(lambda m: "\\" if m.group(1) == "\\" else "\x00", value)


def term_key(term: str) -> str:
    """A term or entity as stored: long ones become a hash (btree keys are limited to ~2.7 kB; analyzer
    terms and entity keys never contain ``#``, so the two forms cannot meet)."""
    if len(term) <= 100 and len(term.encode("utf-8")) <= 200:
        return term
    return "#" + blake2b(term.encode("utf-8"), digest_size=16).hexdigest()


# ---- filters ---------------------------------------------------------------------------------------------
Clause = tuple[str, list[Any]]

_SET_COLUMNS = frozenset(Filters.SET_FIELDS)


def _set_clause(column: str) -> Callable[[str, Any], Clause]:
    def clause(alias: str, values: frozenset[str]) -> Clause:
        return f"{alias}.{column} = ANY(%s::text[])", [sorted(esc(v) or "" for v in values)]

    return clause


def _parent(alias: str, value: str) -> Clause:
    if not is_valid_id(value):
        return "FALSE", []  # no stored memory can have a malformed parent id
    return f"{alias}.parent_id = %s::uuid", [value]


def _visible(alias: str, v: Visibility) -> Clause:
    """The rows agent ``v`` may read (the semantics of :meth:`Visibility.allows`)."""
    a = alias
    teams, tasks = sorted(esc(t) or "" for t in v.teams), sorted(esc(t) or "" for t in v.tasks)
    return (
        f"{a}.scope IS NULL"
        f" OR ({a}.scope = %s AND {a}.agent_id = %s)"
        f" OR ({a}.scope = %s AND {a}.team_id = ANY(%s::text[]))"
        f" OR ({a}.scope = %s AND {a}.task_id = ANY(%s::text[])"
        f" AND ({a}.team_id IS NULL OR {a}.team_id = ANY(%s::text[])))",
        [Scope.PRIVATE.value, esc(v.agent_id), Scope.TEAM.value, teams, Scope.TASK.value, tasks, teams],
    )


_FILTER_SQL: dict[str, Callable[[str, Any], Clause]] = {
    **{name: _set_clause(name) for name in _SET_COLUMNS},
    "tags_all": lambda a, v: (f"{a}.tags @> %s::text[]", [sorted(esc(t) or "" for t in v)]),
    "tags_any": lambda a, v: (f"{a}.tags && %s::text[]", [sorted(esc(t) or "" for t in v)]),
    "parent_id": _parent,
    "pinned": lambda a, v: (f"{a}.pinned = %s", [bool(v)]),
    "created_after": lambda a, v: (f"{a}.created_at >= %s", [v]),
    "created_before": lambda a, v: (f"{a}.created_at < %s", [v]),
    "visible_to": _visible,
    "expires_by": lambda a, v: (f"{a}.expires_at <= %s", [v]),
    "live_at": lambda a, v: (f"({a}.expires_at IS NULL OR {a}.expires_at > %s)", [v]),
}


def untranslated_filter_fields() -> set[str]:
    """Fields of :class:`Filters` this module cannot compile (a test keeps this empty)."""
    return {f.name for f in fields(Filters)} - set(_FILTER_SQL)


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def compile_filters(filters: Filters, alias: str = "m") -> Clause:
    """``filters`` as a SQL condition on the ``memories`` row ``alias`` plus its parameters.

    A field left at its default ("any") adds nothing. A field set to something else that this module
    does not know raises :class:`StoreError` instead of being ignored: an unknown filter silently dropped
    would widen what a caller may see (a tenant or team scope, say).
    """
    clauses: list[str] = []
    params: list[Any] = []
    for f in fields(filters):
        value = getattr(filters, f.name)
        if value == _default(f):
            continue
        compile_one = _FILTER_SQL.get(f.name)
        if compile_one is None:
            raise StoreError(
                f"the postgres engine cannot filter on {f.name!r}: add it to postgres_search._FILTER_SQL"
            )
        sql, args = compile_one(alias, value)
        clauses.append(sql)
        params.extend(args)
    return (" AND ".join(f"({c})" for c in clauses) or "TRUE"), params


# ---- the channels ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hit:
    seq: int
    id: str
    score: float


@dataclass(slots=True)
class Near:
    """One memory of a session run around a centre row (see :func:`runs`)."""

    seq: int
    id: str
    created_at: datetime
    session_id: str | None
    doc_len: int
    ok: bool  # passes the query's filters
    agent_id: str | None


@dataclass(slots=True)
class Run:
    """Consecutive memories of a session around ``centre``: ``rows[at]`` is the centre; a side shorter
    than asked for ends at the session's edge."""

    rows: list[Near]
    at: int

    def get(self, offset: int) -> Near | None:
        i = self.at + offset
        return self.rows[i] if 0 <= i < len(self.rows) else None


class Searcher:
    """Runs one :class:`Query` on a connection. Stateless apart from the shared analyzer."""

    def __init__(
        self, analyzer: Analyzer, params: BM25Params, dim: int, window: int = CONTEXT_WINDOW
    ) -> None:
        self.analyzer = analyzer
        self.params = params
        self.dim = dim
        self.window = window

    def run(self, conn: psycopg.Connection[Any], q: Query) -> QueryResult:
        if q.vector is not None:
            check_vectors(1, q.vector, self.dim, field="vector")
        where, wargs = compile_filters(q.filters)
        result = QueryResult()
        found: list[list[Hit]] = []
        if q.text and (q.lexical or q.context):
            self._lexical(conn, q, where, wargs, result, found)
        if q.vector is not None:
            dense = self.dense(conn, q.vector, q.dense_k, where, wargs)
            result.dense = [(h.id, h.score) for h in dense]
            found.append(dense)
        if q.expand:
            links = self.related(conn, q.expand, q.expand_limit, q.expand_max_df, q.filters)
            result.related = [(s, t.id, t.score) for s, t in links]
            found.append([t for _, t in links])
        if q.info or q.around:
            seqs = [h.seq for hits in found for h in hits] if q.info else []
            if q.around:
                seqs += seqs_of(conn, q.around)
            result.info = self.info(conn, seqs, q.filters)
        if not q.text and q.vector is None and not q.expand and not q.around:
            rows = conn.execute(
                f"SELECT id FROM memories m WHERE {where} ORDER BY created_at DESC, seq DESC LIMIT %s",
                [*wargs, min(q.limit, 2**62)],
            ).fetchall()
            result.filtered = [str(r[0]) for r in rows]
        return result

    # ---- lexical and context ---------------------------------------------------------------------------
    def _lexical(
        self,
        conn: psycopg.Connection[Any],
        q: Query,
        where: str,
        wargs: list[Any],
        result: QueryResult,
        found: list[list[Hit]],
    ) -> None:
        assert q.text is not None
        terms = [term_key(t) for t in self.analyzer.terms(q.text)]
        stats = self.term_stats(conn, list(dict.fromkeys(terms)), one_tenant(q.filters))
        if stats is None:
            return
        best = self.bm25(conn, stats, 2 * q.limit if q.context else q.limit, where, wargs)
        if q.lexical:
            found.append(best[: q.limit])
            result.lexical = [(h.id, h.score) for h in found[-1]]
        if q.context and best:
            ctx = self.context(conn, stats, best, q.limit, q.filters)
            found.append(ctx)
            result.context = [(h.id, h.score) for h in ctx]

    def term_stats(
        self, conn: psycopg.Connection[Any], terms: list[str], tenant: str | None = None
    ) -> TermStats | None:
        """Document frequencies of ``terms`` and the corpus counters (of ``tenant``'s memories alone, when
        given: see :func:`one_tenant`), or None when nothing can match."""
        if not terms:
            return None
        if tenant is None:
            rows = conn.execute(
                """SELECT t.term, (SELECT count(*) FROM postings p WHERE p.term = t.term), s.docs,
                          s.total_len, s.sessioned
                   FROM unnest(%s::text[]) AS t(term),
                        (SELECT coalesce(sum(docs), 0) AS docs, coalesce(sum(total_len), 0) AS total_len,
                                coalesce(sum(sessioned), 0) AS sessioned FROM lexstats) AS s""",
                [terms],
            ).fetchall()
        else:
            rows = conn.execute(
                """SELECT t.term, (SELECT count(*) FROM postings p JOIN memories m ON m.seq = p.seq
                                   WHERE p.term = t.term AND m.tenant = %s),
                          s.docs, s.total_len, s.sessioned
                   FROM unnest(%s::text[]) AS t(term),
                        (SELECT coalesce(sum(docs), 0) AS docs, coalesce(sum(total_len), 0) AS total_len,
                                coalesce(sum(sessioned), 0) AS sessioned
                         FROM tenant_lexstats WHERE tenant = %s) AS s""",
                [esc(tenant), terms, esc(tenant)],
            ).fetchall()
        n = int(rows[0][2]) if rows else 0
        if n <= 0:
            return None
        df = {str(t): int(d) for t, d, *_ in rows if d}
        if not df:
            return None
        return TermStats(df, n, float(rows[0][3]), float(rows[0][4]))

    def bm25(
        self, conn: psycopg.Connection[Any], st: TermStats, limit: int, where: str, wargs: list[Any]
    ) -> list[Hit]:
        """The ``limit`` best rows by BM25 of their own text (score > 0), best first."""
        if limit <= 0:
            return []
        terms = list(st.df)
        idfs = [LexicalIndex.idf(st.df[t], st.n) for t in terms]
        k1, b = self.params.k1, self.params.b
        avgdl = max(st.total_len / st.n, 1.0)
        # per posting: idf * tf * (k1 + 1) / (tf + k1 * (1 - b) + k1 * b / avgdl * dl), in float8; then the
        # filters, by primary key for each scored row (a plan that holds without fresh table statistics)
        c0, c1 = float(k1 * (1.0 - b)), float(k1 * b / avgdl)
        rows = conn.execute(
            f"""WITH s AS (
                    SELECT p.seq,
                           sum(w.idf * p.tf / (p.tf + %s::float8 + %s::float8 * p.dl)) * %s::float8 AS score
                    FROM unnest(%s::text[], %s::float8[]) AS w(term, idf)
                    JOIN postings p ON p.term = w.term
                    GROUP BY p.seq)
                SELECT m.seq, m.id, s.score FROM s CROSS JOIN LATERAL (
                    SELECT m.seq, m.id FROM memories m WHERE m.seq = s.seq AND {where} OFFSET 0) AS m
                ORDER BY s.score DESC, m.seq
                LIMIT %s""",
            [c0, c1, k1 + 1.0, terms, idfs, *wargs, limit],
        ).fetchall()
        return [Hit(int(s), str(i), float(score)) for s, i, score in rows if score > 0]

    def context(
        self, conn: psycopg.Connection[Any], st: TermStats, best: list[Hit], limit: int, filters: Filters
    ) -> list[Hit]:
        """BM25 over the neighbourhood documents of the rows within ``window`` of the best own-text rows."""
        w = self.window
        around = runs(conn, [h.seq for h in best], 2 * w, filters)
        members: dict[int, list[Near]] = {}  # candidate seq -> its neighbourhood
        cand: dict[int, Near] = {}
        for h in best:
            run = around.get(h.seq)
            if run is None:
                continue
            for off in range(-w, w + 1):
                c = run.get(off)
                if c is None or not c.ok or c.seq in members:
                    continue
                cand[c.seq] = c
                members[c.seq] = [x for o in range(off - w, off + w + 1) if (x := run.get(o)) is not None]
        if not cand or limit <= 0:
            return []
        seqs = sorted({x.seq for ms in members.values() for x in ms})
        terms = list(st.df)
        tf: dict[tuple[int, str], int] = {
            (int(s), str(t)): int(f)
            for s, t, f in conn.execute(
                "SELECT seq, term, tf FROM postings WHERE term = ANY(%s::text[]) AND seq = ANY(%s::bigint[])",
                [terms, seqs],
            )
        }
        k1, b = self.params.k1, self.params.b
        share = st.sessioned / st.n
        spread = 1.0 + 2 * w * share
        avg_ctx = max(max(st.total_len / st.n, 1.0) * spread, 1.0)
        idf_ctx = {t: LexicalIndex.idf(min(st.n, round(st.df[t] * spread)), st.n) for t in terms}
        scored: list[Hit] = []
        for seq, ms in members.items():
            ctx_len = float(sum(x.doc_len for x in ms))
            norm = k1 * (1.0 - b + b * ctx_len / avg_ctx)
            score = 0.0
            for t in terms:
                f = sum(tf.get((x.seq, t), 0) for x in ms)
                if f:
                    score += idf_ctx[t] * f * (k1 + 1.0) / (f + norm)
            if score > 0:
                scored.append(Hit(seq, cand[seq].id, score))
        scored.sort(key=lambda h: (-h.score, h.seq))
        return scored[:limit]

    # ---- dense -----------------------------------------------------------------------------------------
    def dense(
        self, conn: psycopg.Connection[Any], vector: np.ndarray, limit: int, where: str, wargs: list[Any]
    ) -> list[Hit]:
        """Nearest unit vectors by inner product (= cosine), best first."""
        if limit <= 0:
            return []
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(v))
        v = v / norm if norm > 0 else v
        hits: list[Hit] = []
        if limit <= 1000:  # HNSW's candidate list (ef_search) tops out at 1000
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(max(100, limit))])
            hits = self._nearest(conn, v, limit, where, wargs, exact=False)
        if len(hits) < limit:  # few rows pass the filters, or a huge limit: scan them exactly
            hits = self._nearest(conn, v, limit, where, wargs, exact=True)
        return hits

    def _nearest(
        self,
        conn: psycopg.Connection[Any],
        v: np.ndarray,
        limit: int,
        where: str,
        wargs: list[Any],
        exact: bool,
    ) -> list[Hit]:
        select = f"""SELECT m.seq, m.id, m.embedding <#> %b AS d FROM memories m
                     WHERE m.embedding IS NOT NULL AND {where}"""
        if exact:  # a materialised set cannot be read through the index: an exact sort
            sql = f"WITH c AS MATERIALIZED ({select}) SELECT seq, id, d FROM c ORDER BY d, seq LIMIT %s"
            args = [v, *wargs, min(limit, 2**62)]
        else:
            sql = f"{select} ORDER BY m.embedding <#> %b LIMIT %s"
            args = [v, *wargs, v, limit]
        return [Hit(int(s), str(i), -float(d)) for s, i, d in conn.execute(sql, args)]

    # ---- info and the entity graph ---------------------------------------------------------------------
    def info(
        self, conn: psycopg.Connection[Any], seqs: list[int], filters: Filters
    ) -> dict[str, CandidateInfo]:
        """CandidateInfo for ``seqs`` and for their neighbours that pass the filters."""
        out: dict[str, CandidateInfo] = {}
        around = runs(conn, list(dict.fromkeys(seqs)), 2, filters)

        def describe(run: Run, at: int) -> CandidateInfo:
            me, before, after = run.get(at), run.get(at - 1), run.get(at + 1)
            assert me is not None
            return CandidateInfo(
                me.created_at,
                me.session_id,
                before.id if before else None,
                after.id if after else None,
                me.agent_id,
                me.doc_len,
            )

        for run in around.values():
            centre = run.rows[run.at]
            out[centre.id] = describe(run, 0)
            for off in (-1, 1):
                near = run.get(off)
                if near is not None and near.ok and near.id not in out:
                    out[near.id] = describe(run, off)
        return out

    def related(
        self, conn: psycopg.Connection[Any], seeds: Sequence[str], limit: int, max_df: int, filters: Filters
    ) -> list[tuple[str, Hit]]:
        """Up to ``limit`` (seed id, linked hit) pairs: memories sharing an entity with a seed, rarest entity
        first, each entity weighing log(n / df) / log(n) (see ``SearchIndex.related``)."""
        if limit <= 0:
            return []
        seed_rows = conn.execute(
            "SELECT m.seq, m.id, e.entity FROM memories m JOIN entities e ON e.seq = m.seq"
            " WHERE m.id = ANY(%s::uuid[])",
            [[s for s in dict.fromkeys(seeds) if is_valid_id(s)]],
        ).fetchall()
        if not seed_rows:
            return []
        names = sorted({str(e) for _, _, e in seed_rows})
        tenant = esc(one_tenant(filters))  # one tenant's query: its own memories' counts (see one_tenant)
        dfs = {
            str(e): int(n)
            for e, n in conn.execute(
                """SELECT t.e,
                          (SELECT count(*) FROM (SELECT 1 FROM entities x JOIN memories m ON m.seq = x.seq
                                                 WHERE x.entity = t.e AND (%s::text IS NULL OR m.tenant = %s)
                                                 LIMIT %s) AS c)
                   FROM unnest(%s::text[]) AS t(e)""",
                [tenant, tenant, max_df + 1, names],
            )
        }
        usable = [e for e in names if 2 <= dfs.get(e, 0) <= max_df]
        if tenant is None:
            total = conn.execute("SELECT coalesce(sum(docs), 0) FROM lexstats").fetchone()
        else:
            total = conn.execute(
                "SELECT coalesce(sum(docs), 0) FROM tenant_lexstats WHERE tenant = %s", [tenant]
            ).fetchone()
        n = max(int(total[0]) if total else 0, 2)
        members: dict[str, list[tuple[int, str, bool]]] = {e: [] for e in usable}
        where, wargs = compile_filters(filters, "m")
        if usable:
            for e, s, i, ok in conn.execute(
                f"""SELECT x.entity, m.seq, m.id, ({where}) FROM entities x JOIN memories m ON m.seq = x.seq
                    WHERE x.entity = ANY(%s::text[]) ORDER BY m.seq""",
                [*wargs, usable],
            ):
                members[str(e)].append((int(s), str(i), bool(ok)))
        links = sorted(
            (
                (math.log(n / dfs[str(e)]) / math.log(n), int(s), str(i), str(e))
                for s, i, e in seed_rows
                if str(e) in members
            ),
            key=lambda x: (-x[0], x[1], x[3]),
        )
        out: list[tuple[str, Hit]] = []
        seen: set[tuple[int, int]] = set()
        for weight, s, sid, e in links:
            for r, rid, ok in members[e]:
                if r == s or (s, r) in seen or not ok:
                    continue
                seen.add((s, r))
                out.append((sid, Hit(r, rid, weight)))
                if len(out) >= limit:
                    return out
        return out


def one_tenant(filters: Filters) -> str | None:
    """The tenant ``filters`` confine a query to, when they name exactly one. BM25's corpus statistics
    (document count, average length, document and entity frequencies) are then that tenant's alone, so
    what another tenant holds shows in none of its scores or rankings; a query over several tenants (an
    operator's, on the engine itself) scores with the whole store's."""
    return next(iter(filters.tenant)) if filters.tenant is not None and len(filters.tenant) == 1 else None


@dataclass(frozen=True, slots=True)
class TermStats:
    df: dict[str, int]  # query terms that occur at all -> document frequency
    n: int  # memories
    total_len: float  # sum of document lengths
    sessioned: float  # memories that belong to a session


def valid_ids(ids: Sequence[str]) -> list[str]:
    """``ids`` without repeats or malformed ids (those could never match a uuid column)."""
    return [i for i in dict.fromkeys(ids) if is_valid_id(i)]


def seqs_of(conn: psycopg.Connection[Any], ids: Sequence[str]) -> list[int]:
    valid = valid_ids(ids)
    if not valid:
        return []
    rows = conn.execute("SELECT id, seq FROM memories WHERE id = ANY(%s::uuid[])", [valid]).fetchall()
    by_id = {str(i): int(s) for i, s in rows}
    return [by_id[i] for i in valid if i in by_id]


def runs(conn: psycopg.Connection[Any], centres: list[int], width: int, filters: Filters) -> dict[int, Run]:
    """For each centre row, up to ``width`` memories on each side in its session by (created_at, seq),
    each with whether it passes the filters. One statement: the centres, then for each a backward and a
    forward scan of the session index."""
    if not centres:
        return {}
    where_c, cargs = compile_filters(filters, "c")
    where_x, xargs = compile_filters(filters, "x")
    near = f"x.seq, x.id, x.created_at, x.session_id, x.doc_len, ({where_x}), x.agent_id"
    rows = conn.execute(
        f"""SELECT c.seq, 0, c.seq, c.id, c.created_at, c.session_id, c.doc_len, ({where_c}), c.agent_id
            FROM memories c WHERE c.seq = ANY(%s::bigint[])
            UNION ALL
            SELECT c.seq, y.* FROM memories c CROSS JOIN LATERAL (
                (SELECT -1 AS dir, {near} FROM memories x
                 WHERE x.tenant = c.tenant AND x.session_id = c.session_id
                   AND (x.created_at, x.seq) < (c.created_at, c.seq)
                 ORDER BY x.created_at DESC, x.seq DESC LIMIT %s)
                UNION ALL
                (SELECT 1 AS dir, {near} FROM memories x
                 WHERE x.tenant = c.tenant AND x.session_id = c.session_id
                   AND (x.created_at, x.seq) > (c.created_at, c.seq)
                 ORDER BY x.created_at, x.seq LIMIT %s)
            ) AS y
            WHERE c.seq = ANY(%s::bigint[]) AND c.session_id IS NOT NULL""",
        [*cargs, centres, *xargs, width, *xargs, width, centres],
    ).fetchall()
    sides: dict[int, tuple[list[Near], list[Near], list[Near]]] = {}
    for centre, direction, seq, ident, created, session, dl, ok, agent in rows:
        near_row = Near(int(seq), str(ident), created, unesc(session), int(dl), bool(ok), unesc(agent))
        sides.setdefault(int(centre), ([], [], []))[int(direction) + 1].append(near_row)
    out: dict[int, Run] = {}
    for centre, (before, me, after) in sides.items():
        before.sort(key=lambda r: (r.created_at, r.seq))
        after.sort(key=lambda r: (r.created_at, r.seq))
        out[centre] = Run([*before, *me], len(before))
        out[centre].rows.extend(after)
    return out
