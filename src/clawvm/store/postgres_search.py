"""The query side of the PostgreSQL engine: filters compiled to SQL and the search channels.

Every channel returns what the in-process :class:`~clawvm.store.index.SearchIndex` returns for the same
data (see ``store/base.py`` :class:`Query`), computed from the tables instead of from memory:

- ``filtered``: the filters as a ``WHERE`` clause, newest first (ties: the later-inserted row first);
- ``lexical``: BM25 with the same analyzer, formula and parameters, from the ``postings`` table (tenant,
  term, row -> term frequency and document length, all in its primary key) and the sharded per-tenant
  document counters (``tenant_lexstats``); document frequencies are counted from the query terms'
  postings: the scores are the in-process ones up to float rounding. Rows are ranked from the postings
  alone and the filters checked best-first (:meth:`Searcher.lexical_sql`);
- ``context``: BM25 over neighbourhood documents, in the same statement, scored exactly (summed term
  frequencies and lengths of the ``window`` memories on each side in the session) for the rows near the
  best own-text rows, as in process. Two corpus statistics are estimated instead of maintained on every
  write: a term's neighbourhood document frequency (its document frequency spread over ``2 * window + 1``
  neighbourhoods for the share of memories that have a session) and the average neighbourhood length
  (the same spread of the average length). They shape the ranking inside one query, and where a term
  is in a large share of the neighbourhoods (a small store, a very common term) the estimate saturates and
  the order differs from the exact one in process (six memories in two sessions: another top 5);
- ``dense``: pgvector's HNSW index (inner product of unit vectors = cosine) with iterative scans, so
  filtered queries still fill their limit; an exact scan of the filtered rows when the index comes back
  short (few rows pass the filters, or the limit is beyond what HNSW serves). Equal scores: the later
  stored row (higher ``seq``) first, as in process (``TIE_MARGIN`` rows past the limit are read for it);
- ``info``/``around``: creation time, session and same-session neighbours from the session index;
- ``related``: the write-time entity graph (``entities`` table), weighted and ordered as in process.

Text columns that may hold NUL (which PostgreSQL's ``text`` cannot) are stored through :func:`esc`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from hashlib import blake2b
from typing import Any

import numpy as np
import psycopg

from clawvm.core.errors import StoreError
from clawvm.core.ids import is_valid_id
from clawvm.core.lexical import Analyzer, BM25Params
from clawvm.core.model import MAX_COUNT, Filters, Scope, Status, Visibility
from clawvm.store.base import CandidateInfo, Query, QueryResult, Related, check_vectors
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
    "active_due_by": lambda a, v: (f"({a}.status <> %s OR {a}.expires_at <= %s)", [Status.ACTIVE.value, v]),
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
        """The channels ``q`` asks for. The lexical statement (own text and neighbourhoods) and the dense
        one are sent together, in one round trip; the entity graph and the info of what they found
        follow."""
        if q.vector is not None:
            check_vectors(1, q.vector, self.dim, field="vector")
        where, wargs = compile_filters(q.filters)
        result = QueryResult()
        found: list[list[Hit]] = []
        # one round trip: BEGIN (the HNSW settings are local to a transaction), the text statement, the
        # settings, the dense search and COMMIT; the results are read once the pipeline has synced
        with conn.pipeline(), conn.transaction() if q.vector is not None else nullcontext():
            lexical = self._send_lexical(conn, q) if q.text and (q.lexical or q.context) else None
            dense = (
                self._send_dense(conn, q.vector, q.dense_k, where, wargs) if q.vector is not None else None
            )
        if lexical is not None:
            own, ctx = self._read_lexical(lexical, q)
            if q.lexical:
                found.append(own)
                result.lexical = [(h.id, h.score) for h in own]
            if q.context:
                found.append(ctx)
                result.context = [(h.id, h.score) for h in ctx]
        if q.vector is not None:
            hits = self._read_dense(conn, dense, q.vector, q.dense_k, where, wargs)
            result.dense = [(h.id, h.score) for h in hits]
            found.append(hits)
        if q.expand:
            links = self.related(conn, q.expand, q.expand_limit, q.expand_max_df, q.filters)
            result.related = [Related(s, t.id, t.score) for s, t in links]
            found.append([t for _, t in links])
        if q.info or q.around:
            ids = [h.id for hits in found for h in hits] if q.info else []
            result.info = self.info(conn, valid_ids([*ids, *q.around]), q.filters)
        if not q.text and q.vector is None and not q.expand and not q.around:
            rows = conn.execute(
                f"SELECT id FROM memories m WHERE {where} ORDER BY created_at DESC, seq DESC LIMIT %s",
                [*wargs, min(q.limit, MAX_COUNT)],
            ).fetchall()
            result.filtered = [str(r[0]) for r in rows]
        return result

    # ---- lexical and context ---------------------------------------------------------------------------
    def _send_lexical(self, conn: psycopg.Connection[Any], q: Query) -> psycopg.Cursor[Any] | None:
        """Send the statement of the lexical and context channels (see :meth:`lexical_sql`)."""
        assert q.text is not None
        terms = list(dict.fromkeys(term_key(t) for t in self.analyzer.terms(q.text)))
        if not terms or q.limit <= 0:
            return None
        limit = min(q.limit, 2**61)  # a bigint LIMIT, doubled below
        depth = 2 * limit if q.context else limit  # the context channel looks around the best 2 * limit
        sql, args = self.lexical_sql(terms, one_tenant(q.filters), q.filters, depth, limit, q.context)
        return conn.execute(sql, args)

    @staticmethod
    def _read_lexical(cur: psycopg.Cursor[Any], q: Query) -> tuple[list[Hit], list[Hit]]:
        own: list[Hit] = []
        ctx: list[Hit] = []
        for channel, seq, ident, score in cur.fetchall():
            (own if channel == "l" else ctx).append(Hit(int(seq), str(ident), float(score)))
        return own[: q.limit], ctx

    def lexical_sql(
        self, terms: list[str], tenant: str | None, filters: Filters, depth: int, limit: int, context: bool
    ) -> tuple[str, list[Any]]:
        """One statement for both text channels, rows ``('l' | 'c', seq, id, score)``, best first per
        channel.

        Own text (``'l'``): the query terms' postings read from the covering primary key (tenant, term ->
        tf, dl; no table access), document frequencies counted from them, BM25 summed per row in SQL;
        rows are then taken best first and the filters checked row by row until ``depth`` pass (ranked
        first, filtered after: a filter that passes most rows costs ``depth`` probes, not one per posting).

        Context (``'c'``, when asked): for each of those ``depth`` rows, the ``2 * window`` memories on each
        side in its session (two index range scans); the candidates are the passing rows within
        ``window`` of one, each scored by BM25 over its neighbourhood (itself and ``window`` memories on
        each side: summed term frequencies from the postings already read, summed lengths), with the
        neighbourhood statistics estimated as described in the module docstring."""
        w = self.window
        k1, b = float(self.params.k1), float(self.params.b)
        where, wargs = compile_filters(filters, "m")
        on_tenant, targs = ("p.tenant = %s AND ", [esc(tenant)]) if tenant is not None else ("", [])
        stats_of, sargs = ("WHERE s.tenant = %s", [esc(tenant)]) if tenant is not None else ("", [])
        sql = f"""WITH hits AS MATERIALIZED (
                SELECT p.tenant, p.term, p.seq, p.tf, p.dl FROM postings p
                WHERE {on_tenant}p.term = ANY(%s::text[])),
            st AS (
                SELECT n, total_len, sessioned, 1.0 + {2 * w}.0 * sessioned / n AS spread FROM (
                    SELECT coalesce(sum(docs), 0)::float8 AS n,
                           coalesce(sum(total_len), 0)::float8 AS total_len,
                           coalesce(sum(sessioned), 0)::float8 AS sessioned
                    FROM tenant_lexstats s {stats_of}) AS c
                WHERE n > 0),
            idf AS (
                SELECT d.term, ln(1.0 + (st.n - d.df + 0.5) / (d.df + 0.5)) AS idf,
                       ln(1.0 + (st.n - d.cdf + 0.5) / (d.cdf + 0.5)) AS idf_ctx
                FROM st CROSS JOIN LATERAL (
                    SELECT h.term, count(*)::float8 AS df, least(st.n, round(count(*) * st.spread)) AS cdf
                    FROM hits h GROUP BY h.term) AS d),
            k AS (
                SELECT %s::float8 * (1.0 - %s::float8) AS c0,
                       %s::float8 * %s::float8 / greatest(total_len / n, 1.0) AS c1,
                       greatest(greatest(total_len / n, 1.0) * spread, 1.0) AS avg_ctx
                FROM st),
            scored AS (
                -- terms summed in one order: equal documents score the same bits on every call and tie
                -- (then the newest, highest seq, first, as in process) instead of ranking by the order a
                -- plan happened to add them in
                SELECT h.tenant, h.seq,
                       sum(i.idf * h.tf / (h.tf + k.c0 + k.c1 * h.dl) ORDER BY h.term) * %s::float8 AS score
                FROM hits h JOIN idf i ON i.term = h.term CROSS JOIN k
                GROUP BY h.tenant, h.seq),
            best AS MATERIALIZED (
                SELECT row_number() OVER (ORDER BY t.score DESC, t.seq DESC) AS rank, t.* FROM (
                    SELECT m.*, s.score FROM (SELECT * FROM scored ORDER BY score DESC, seq DESC) AS s
                    CROSS JOIN LATERAL (
                        SELECT m.tenant, m.seq, m.id, m.session_id, m.created_at, m.doc_len FROM memories m
                        WHERE m.tenant = s.tenant AND m.seq = s.seq AND {where} OFFSET 0) AS m
                    WHERE s.score > 0
                    ORDER BY s.score DESC, s.seq DESC LIMIT %s) AS t)"""
        args: list[Any] = [
            *targs,
            terms,
            *sargs,
            k1,
            b,
            k1,
            b,
            k1 + 1.0,
            *wargs,
            depth,
        ]
        if not context:
            return sql + " SELECT 'l', seq, id, score FROM best ORDER BY rank", args
        side = f"""SELECT m.tenant, m.seq, m.id, m.doc_len, ({where}) AS ok,
                          row_number() OVER (ORDER BY m.created_at {{dir}}, m.seq {{dir}}) AS k
                   FROM (SELECT m.* FROM memories m
                         WHERE m.tenant = b.tenant AND m.session_id = b.session_id
                           AND (m.created_at, m.seq) {{op}} (b.created_at, b.seq)
                         ORDER BY m.created_at {{dir}}, m.seq {{dir}} LIMIT {2 * w}) AS m"""
        sql += f""",
            run AS (
                SELECT b.rank, b.seq AS centre, 0::bigint AS off, b.tenant, b.seq, b.id, b.doc_len, TRUE AS ok
                FROM best b
                UNION ALL
                SELECT b.rank, b.seq, -x.k, x.tenant, x.seq, x.id, x.doc_len, x.ok
                FROM best b CROSS JOIN LATERAL ({side.format(op="<", dir="DESC")}) AS x
                UNION ALL
                SELECT b.rank, b.seq, x.k, x.tenant, x.seq, x.id, x.doc_len, x.ok
                FROM best b CROSS JOIN LATERAL ({side.format(op=">", dir="ASC")}) AS x),
            cand AS (
                SELECT DISTINCT ON (r.seq) r.centre, r.off, r.seq, r.id FROM run r
                WHERE r.ok AND abs(r.off) <= {w} ORDER BY r.seq, r.rank),
            around AS (
                SELECT c.seq AS cand, c.id, r.tenant, r.seq, sum(r.doc_len) OVER (PARTITION BY c.seq) AS len
                FROM cand c JOIN run r ON r.centre = c.centre AND r.off BETWEEN c.off - {w} AND c.off + {w}),
            freq AS (
                SELECT a.cand, a.id, a.len::float8 AS len, h.term, sum(h.tf)::float8 AS f
                FROM around a JOIN hits h ON h.tenant = a.tenant AND h.seq = a.seq
                GROUP BY a.cand, a.id, a.len, h.term),
            ctx AS (
                SELECT f.cand AS seq, f.id,
                       sum(i.idf_ctx * f.f * %s::float8
                         / (f.f + %s::float8 * (1.0 - %s::float8 + %s::float8 * f.len / k.avg_ctx))
                         ORDER BY f.term) AS score
                FROM freq f JOIN idf i ON i.term = f.term CROSS JOIN k
                GROUP BY f.cand, f.id)
            SELECT * FROM (SELECT 'l', seq, id, score FROM best WHERE rank <= %s ORDER BY rank) AS own
            UNION ALL
            SELECT * FROM (SELECT 'c', seq, id, score FROM ctx WHERE score > 0
                           ORDER BY score DESC, seq DESC LIMIT %s) AS c"""
        args += [*wargs, *wargs, k1 + 1.0, k1, b, b, limit, limit]
        return sql, args

    # ---- dense -----------------------------------------------------------------------------------------
    @staticmethod
    def _unit(vector: np.ndarray) -> np.ndarray:
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else v

    def _send_dense(
        self, conn: psycopg.Connection[Any], vector: np.ndarray, limit: int, where: str, wargs: list[Any]
    ) -> psycopg.Cursor[Any] | None:
        """Send the HNSW search (None when the limit is beyond what HNSW serves: :meth:`_read_dense` then
        sorts exactly), inside the caller's transaction.

        Nearest unit vectors by inner product (= cosine), best first. HNSW with an iterative scan
        (pgvector 0.8, relaxed order, re-sorted here): when filters or archived/obsolete rows drop
        candidates, the index keeps walking the graph (up to ``max_scan_tuples``) instead of returning
        short, so neither a share of inactive rows nor a narrow filter (one agent, one session) turns into
        an exact scan. Exact only when the index is done and came back short while more rows pass the
        filters (a limit beyond ``ef_search``'s 1000, or a filter so narrow that the walk's budget ran out
        first)."""
        if limit <= 0 or limit > 1000:  # HNSW's candidate list (ef_search) tops out at 1000
            return None
        # a few rows past the limit: the index orders by distance alone, and rows tied at the cut are
        # kept by the tie rule (the later stored), sorted here (:meth:`_read_dense`)
        fetch = min(limit + TIE_MARGIN, 1000)
        sql, args = self.dense_sql(self._unit(vector), fetch, where, wargs, exact=False)
        set_dense_scan(conn, limit)
        return conn.execute(sql, args)

    def _read_dense(
        self,
        conn: psycopg.Connection[Any],
        cur: psycopg.Cursor[Any] | None,
        vector: np.ndarray,
        limit: int,
        where: str,
        wargs: list[Any],
    ) -> list[Hit]:
        if limit <= 0:
            return []
        if cur is not None:
            found = [Hit(int(s), str(i), -float(d)) for s, i, d in cur.fetchall()]
            # equal scores: the later stored (the higher seq) first, as every channel and engine ranks them
            hits = sorted(found, key=lambda h: (-h.score, -h.seq))[:limit]
            if len(hits) == limit or len(hits) == self._passing(conn, limit, where, wargs):
                return hits
        sql, args = self.dense_sql(self._unit(vector), limit, where, wargs, exact=True)
        return self._hits(conn, sql, args)

    @staticmethod
    def _hits(conn: psycopg.Connection[Any], sql: str, args: list[Any]) -> list[Hit]:
        return [Hit(int(s), str(i), -float(d)) for s, i, d in conn.execute(sql, args)]

    @staticmethod
    def _passing(conn: psycopg.Connection[Any], limit: int, where: str, wargs: list[Any]) -> int:
        """How many embedded rows pass the filters, counted up to ``limit`` (an index probe when narrow)."""
        row = conn.execute(
            f"""SELECT count(*) FROM (SELECT 1 FROM memories m WHERE m.embedded AND {where}
                LIMIT %s) AS c""",
            [*wargs, limit],
        ).fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def dense_sql(
        v: np.ndarray, limit: int, where: str, wargs: list[Any], exact: bool
    ) -> tuple[str, list[Any]]:
        """The dense statement: through the HNSW index, or (``exact``) a sort of every passing row."""
        # vectors sit in their own table (keyed like memories): the index walk feeds a probe of each
        # candidate's row by primary key, where the filters apply
        select = f"""SELECT m.seq, m.id, v.embedding <#> %b AS d
                     FROM vectors v JOIN memories m ON m.tenant = v.tenant AND m.seq = v.seq WHERE {where}"""
        if exact:  # a materialised set cannot be read through the index: an exact sort
            sql = f"WITH c AS MATERIALIZED ({select}) SELECT seq, id, d FROM c ORDER BY d, seq DESC LIMIT %s"
            return sql, [v, *wargs, min(limit, MAX_COUNT)]
        return f"{select} ORDER BY v.embedding <#> %b LIMIT %s", [v, *wargs, v, limit]

    # ---- info and the entity graph ---------------------------------------------------------------------
    def info(
        self, conn: psycopg.Connection[Any], ids: list[str], filters: Filters
    ) -> dict[str, CandidateInfo]:
        """CandidateInfo for the memories ``ids`` and for their neighbours that pass the filters."""
        out: dict[str, CandidateInfo] = {}
        around = runs(conn, ids, 2, filters)

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
        tenant = esc(one_tenant(filters))  # one tenant's query: its own memories' counts (see one_tenant)
        on_tenant, targs = ("x.tenant = %s AND ", [tenant]) if tenant is not None else ("", [])
        stats_of, sargs = ("WHERE tenant = %s", [tenant]) if tenant is not None else ("", [])
        # the seeds' entities, each with its document frequency (counted up to max_df + 1) and the memories
        seed_rows = conn.execute(
            f"""SELECT m.seq, m.id, e.entity,
                       (SELECT count(*) FROM (SELECT 1 FROM entities x WHERE {on_tenant}x.entity = e.entity
                                              LIMIT %s) AS c),
                       (SELECT coalesce(sum(docs), 0) FROM tenant_lexstats {stats_of})
                FROM memories m JOIN entities e ON e.tenant = m.tenant AND e.seq = m.seq
                WHERE m.id = ANY(%s::uuid[])""",
            [*targs, max_df + 1, *sargs, [s for s in dict.fromkeys(seeds) if is_valid_id(s)]],
        ).fetchall()
        if not seed_rows:
            return []
        dfs = {str(e): int(d) for _, _, e, d, _ in seed_rows}
        n = max(int(seed_rows[0][4]), 2)
        usable = sorted(e for e, d in dfs.items() if 2 <= d <= max_df)
        members: dict[str, list[tuple[int, str, bool]]] = {e: [] for e in usable}
        where, wargs = compile_filters(filters, "m")
        if usable:
            for e, s, i, ok in conn.execute(
                f"""SELECT x.entity, m.seq, m.id, ({where})
                    FROM entities x JOIN memories m ON m.tenant = x.tenant AND m.seq = x.seq
                    WHERE {on_tenant}x.entity = ANY(%s::text[]) ORDER BY m.seq""",
                [*wargs, *targs, usable],
            ):
                members[str(e)].append((int(s), str(i), bool(ok)))
        links = sorted(
            (
                (math.log(n / dfs[str(e)]) / math.log(n), int(s), str(i), str(e))
                for s, i, e, _, _ in seed_rows
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


#: Rows an iterative index scan may visit per query before it gives up (pgvector's default is 20,000):
#: enough for a filter that passes 1 row in 100 to fill a limit of 100 twice over.
MAX_SCAN_TUPLES = 20_000
#: Rows the HNSW statement reads past the dense limit, so that rows tied at the cut are ranked by the tie
#: rule (the index orders by distance alone); a run of equal scores longer than this across the cut is
#: ranked among the rows the index returned, as the rest of an approximate search is.
TIE_MARGIN = 8


def set_dense_scan(conn: psycopg.Connection[Any], limit: int) -> None:
    """The HNSW settings of one query, local to its transaction (safe behind a transaction pooler)."""
    conn.execute(
        "SELECT set_config('hnsw.ef_search', %s, true),"
        " set_config('hnsw.iterative_scan', 'relaxed_order', true),"
        " set_config('hnsw.max_scan_tuples', %s, true)",
        [str(max(100, limit)), str(max(MAX_SCAN_TUPLES, 200 * limit))],
    )


def one_tenant(filters: Filters) -> str | None:
    """The tenant ``filters`` confine a query to, when they name exactly one. BM25's corpus statistics
    (document count, average length, document and entity frequencies) are then that tenant's alone, so
    what another tenant holds shows in none of its scores or rankings; a query over several tenants (an
    operator's, on the engine itself) scores with the whole store's."""
    return next(iter(filters.tenant)) if filters.tenant is not None and len(filters.tenant) == 1 else None


def valid_ids(ids: Sequence[str]) -> list[str]:
    """``ids`` without repeats or malformed ids (those could never match a uuid column)."""
    return [i for i in dict.fromkeys(ids) if is_valid_id(i)]


def runs(conn: psycopg.Connection[Any], centres: list[str], width: int, filters: Filters) -> dict[int, Run]:
    """For each centre row (by id; the result is keyed by its seq), up to ``width`` memories on each side
    in its session by (created_at, seq), each with whether it passes the filters. One statement: the
    centres, then for each a backward and a forward scan of the session index."""
    if not centres:
        return {}
    where_c, cargs = compile_filters(filters, "c")
    where_x, xargs = compile_filters(filters, "x")
    near = f"x.seq, x.id, x.created_at, x.session_id, x.doc_len, ({where_x}), x.agent_id"
    rows = conn.execute(
        f"""SELECT c.seq, 0, c.seq, c.id, c.created_at, c.session_id, c.doc_len, ({where_c}), c.agent_id
            FROM memories c WHERE c.id = ANY(%s::uuid[])
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
            WHERE c.id = ANY(%s::uuid[]) AND c.session_id IS NOT NULL""",
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
