"""The dashboard's views as data, computed from a :class:`clawvm.observe.lens.Lens`: paginated or aggregated
so
that a tenant with 10k+ memories answers in well under a second (every list has ``offset``/``limit``,
the timeline and heatmap are bucketed, the heatmap can aggregate by kind, the graph shows a bounded
neighbourhood).
"""

from __future__ import annotations

import bisect
import csv
import io
import json
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import accumulate, pairwise
from typing import Any, Literal

from clawvm.core.entities import entities
from clawvm.core.errors import NotFoundError, ValidationError
from clawvm.core.model import Tier, counted
from clawvm.observe.lens import ContextBuild, Lens, Move, Row, clip
from clawvm.store import Event
from clawvm.store.crypto import without_sealed
from clawvm.vm.context import short_id

TIERS = [t.value for t in Tier]
#: Events read per page when the inspector looks for a memory's newest ones.
EVENT_PAGE = 500
NO_SESSION = "(none)"


def _scope(lens: Lens, session: str | RowFilter | None) -> list[Row]:
    """The rows of a view: one session's (or all), or those a filter bar keeps."""
    if isinstance(session, RowFilter):
        return session.rows(lens)
    rows = list(lens.rows.values())
    if session is None or session == "":
        return rows
    if session == NO_SESSION:
        return [r for r in rows if r.session_id is None]
    stored = lens.stored_id(session)
    return [r for r in rows if r.session_id == stored]


def _page(items: Sequence[Any], offset: int, limit: int) -> dict[str, Any]:
    items = list(items)
    return {"total": len(items), "offset": offset, "limit": limit, "items": items[offset : offset + limit]}


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


# ---- sessions ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionFilter:
    """What the sessions list can be narrowed by: text of the session id, an agent that wrote in it, and a
    date range its activity overlaps."""

    q: str = ""
    agent: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def keep(self, sid: str, rows: list[Row]) -> bool:
        if self.q and self.q.lower() not in sid.lower():
            return False
        if self.agent and all(r.agent_id != self.agent for r in rows):
            return False
        if self.since and max(r.last_used for r in rows) < self.since:
            return False
        return not (self.until and min(r.created_at for r in rows) > self.until)


def sessions(
    lens: Lens, offset: int = 0, limit: int = 50, q: str = "", flt: SessionFilter | None = None
) -> dict[str, Any]:
    flt = flt or SessionFilter(q=q)
    lens.refresh()
    with lens.lock:
        groups: dict[str, list[Row]] = defaultdict(list)
        for r in lens.rows.values():
            groups[r.session_id or NO_SESSION].append(r)
        builds: Counter[str] = Counter(
            str(b.scope.get("session_id")) for b in lens.contexts.values() if b.scope.get("session_id")
        )
        out = []
        for sid, rows in groups.items():
            if not flt.keep(sid, rows):
                continue
            tiers = Counter(r.tier for r in rows if r.status == "active")
            out.append(
                {
                    "session_id": sid,
                    "memories": len(rows),
                    "active": sum(tiers.values()),
                    "tiers": {t: tiers.get(t, 0) for t in TIERS},
                    "pinned": sum(r.pinned for r in rows),
                    "agents": sorted({r.agent_id for r in rows if r.agent_id}),
                    "tasks": sorted({r.task_id for r in rows if r.task_id}),
                    "working_tokens": sum(
                        r.tokens for r in rows if r.tier == "working" and r.status == "active"
                    ),
                    "first": min(r.created_at for r in rows).isoformat(),
                    "last": max(r.last_used for r in rows).isoformat(),
                    "contexts": builds.get(sid, 0),
                    "mean_value": round(sum(r.value for r in rows) / len(rows), 4),
                }
            )
        out.sort(key=lambda s: str(s["last"]), reverse=True)
        return _page(out, offset, limit)


# ---- memories ---------------------------------------------------------------------------------------------
SortName = Literal["value", "newest", "oldest", "tokens", "used"]
SORTS: dict[str, Callable[[Any], float]] = {
    "value": lambda r: -r.value,
    "newest": lambda r: -r.created_at.timestamp(),
    "oldest": lambda r: r.created_at.timestamp(),
    "tokens": lambda r: -r.tokens,
    "used": lambda r: -(r.injected + r.access_count),
}


@dataclass(frozen=True)
class RowFilter:
    """What every list of memories can be narrowed by (the dashboard's filter bar; the export takes the
    same, so "export" gives exactly the selection on screen)."""

    session: str | None = None
    q: str = ""
    tier: str | None = None
    kind: str | None = None
    agent: str | None = None
    tool: str | None = None
    tag: str | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def keep(self, r: Row) -> bool:
        wanted = (
            (self.tier, r.tier),
            (self.kind, r.kind),
            (self.agent, r.agent_id),
            (self.tool, r.tool_name),
            (self.status, r.status),
        )
        if any(want and want != have for want, have in wanted):
            return False
        if self.tag and self.tag not in r.tags:
            return False
        if (self.since and r.created_at < self.since) or (self.until and r.created_at > self.until):
            return False
        needle = self.q.lower()
        return not needle or needle in r.preview.lower() or r.id.endswith(needle)

    def keeps_build(self, b: ContextBuild) -> bool:
        """Whether a context build passes the filters that apply to builds."""
        scope = b.scope
        if self.session == NO_SESSION:
            if scope.get("session_id"):
                return False
        elif self.session and scope.get("session_id") != self.session:
            return False
        if self.agent and scope.get("agent_id") != self.agent:
            return False
        if (self.since and b.at < self.since) or (self.until and b.at > self.until):
            return False
        return not self.q or self.q.lower() in b.query.lower()

    def rows(self, lens: Lens) -> list[Row]:
        """The matching rows (hold ``lens.lock``)."""
        return [r for r in _scope(lens, self.session) if self.keep(r)]


def memories(
    lens: Lens, flt: RowFilter | None = None, sort: str = "newest", offset: int = 0, limit: int = 50
) -> dict[str, Any]:
    lens.refresh()
    with lens.lock:
        rows = (flt or RowFilter()).rows(lens)
        rows.sort(key=SORTS.get(sort, SORTS["newest"]))
        page = _page(rows, offset, limit)
        page["items"] = [r.as_dict() for r in page["items"]]
        return page


EXPORT_COLUMNS = (
    "id", "created_at", "session_id", "task_id", "agent_id", "tool_name", "kind", "state", "status", "tier",
    "value", "pinned", "tokens", "tags", "preview",
)  # fmt: skip


def export(lens: Lens, flt: RowFilter, fmt: str) -> tuple[str, str]:
    """The selection as JSONL (whole memories, one per line) or CSV (the list's columns); newest first."""
    lens.refresh()
    with lens.lock:
        ids = [r.id for r in sorted(flt.rows(lens), key=SORTS["newest"])]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(EXPORT_COLUMNS)
        with lens.lock:
            for i in ids:
                row = lens.rows.get(i)
                if row is not None:
                    d = row.as_dict()
                    d["tags"] = " ".join(row.tags)
                    writer.writerow([csv_cell(d[c]) for c in EXPORT_COLUMNS])
        return out.getvalue(), "text/csv; charset=utf-8"
    lines = []
    for start in range(0, len(ids), EXPORT_PAGE):
        found = lens.harness.store.get_many(ids[start : start + EXPORT_PAGE])
        lines += [without_sealed(found[i]).to_json() for i in ids[start : start + EXPORT_PAGE] if i in found]
    return "".join(line + "\n" for line in lines), "application/x-ndjson"


EXPORT_PAGE = 500
#: What a spreadsheet reads as the start of a formula (OWASP's CSV injection list): a cell starting with one
#: of these is exported with a ``'`` before it, so ``=HYPERLINK(...)`` in a memory stays text when opened.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell that a spreadsheet shows as text: a string starting like a formula gets a
    leading single quote; numbers, booleans and ``None`` pass unchanged (a negative number is no formula)."""
    # spaces first too: a spreadsheet may trim them and read " =1+1" as a formula
    if isinstance(value, str) and value.lstrip(" ").startswith(FORMULA_STARTS):
        return "'" + value
    return value


CONTEXT_COLUMNS = (
    "seq", "at", "session_id", "task_id", "agent_id", "query", "tokens", "budget", "lines", "cited",
)  # fmt: skip


def export_contexts(lens: Lens, flt: RowFilter, fmt: str) -> tuple[str, str]:
    """The context builds the filter bar keeps, newest first: JSONL (each build with its manifest and
    output) or CSV (one row a build)."""
    lens.refresh()
    with lens.lock:
        builds = sorted((b for b in lens.contexts.values() if flt.keeps_build(b)), key=lambda b: -b.seq)
        if fmt == "csv":
            out = io.StringIO()
            writer = csv.writer(out)
            writer.writerow(CONTEXT_COLUMNS)
            for b in builds:
                d = {**b.summary(), **{k: b.scope.get(k) for k in ("session_id", "task_id", "agent_id")}}
                writer.writerow([csv_cell(d[c]) for c in CONTEXT_COLUMNS])
            return out.getvalue(), "text/csv; charset=utf-8"
        lines = [
            json.dumps(
                {
                    **b.summary(),
                    "manifest": b.manifest,
                    "output": None if b.output is None else {"text": b.output.text, "cited": b.output.cited},
                },
                default=str,
            )
            for b in builds
        ]
    return "".join(line + "\n" for line in lines), "application/x-ndjson"


def parse_weights(text: str) -> dict[str, float]:
    """``"cite_weight=0.3,recency_floor=0.5"`` as a dict (the what-if view's weights)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, number = part.partition("=")
        try:
            out[name.strip()] = float(number)
        except ValueError:
            raise ValidationError("weights", f"{part!r} is not NAME=NUMBER", "e.g. cite_weight=0.3") from None
    return out


def memory_detail(lens: Lens, memory_id: str) -> dict[str, Any]:
    """Everything about one memory: the stored object, its value breakdown, events and contexts."""
    row = lens.memory(memory_id)  # refreshes the lens: what follows reads it as is
    m = lens.harness.get(memory_id)
    breakdown = lens.harness.explain(memory_id).as_dict()
    floor = lens.harness.pager.config.scoring.recency_floor
    events = _latest_events(lens, memory_id, 100)
    with lens.lock:
        children = [r.id for r in lens.rows.values() if r.parent_id == memory_id][:50]
        values = list(lens.values.get(memory_id, [])[-200:])
    return {
        "memory": without_sealed(m).model_dump(mode="json"),  # a viewer never needs the ciphertext
        "row": row.as_dict(),
        "explain": breakdown,
        "formula": value_formula(breakdown, floor, m.pinned),
        "events": [
            {"seq": e.seq, "at": e.at.isoformat(), "kind": e.kind, "data": _brief(e.data)} for e in events
        ],
        "contexts": lens.contexts_of_as_is(memory_id)[-100:],
        "children": children,
        "values": [{"at": a.isoformat(), "value": v} for a, v in values],
    }


def _latest_events(lens: Lens, memory_id: str, most: int) -> list[Event]:
    """The newest ``most`` events of one memory, oldest first. The log is read forward only, so this pages
    through the memory's events (an indexed read of its own, whatever the log's size), keeping the last
    ones: a first page of 200 showed a memory's oldest events, never its latest pins and moves."""
    latest: deque[Event] = deque(maxlen=most)
    after = 0
    while page := lens.harness.events(after_seq=after, limit=EVENT_PAGE, memory_id=memory_id):
        latest.extend(page)
        after = page[-1].seq or after
        if len(page) < EVENT_PAGE:
            break
    return list(latest)


def value_formula(x: dict[str, Any], recency_floor: float, pinned: bool) -> dict[str, Any]:
    """How the breakdown's parts make the value shown (see :func:`clawvm.vm.scoring.value`):
    ``(base + signals + cost) × (floor + (1 − floor) × recency) + access + injected + cited + success +
    feedback``, clamped to [0, 1]; a pinned memory is worth 1."""
    signals = float(sum(x["signals"].values()))
    prior = float(x["base"]) + signals + float(x["cost"])
    factor = recency_floor + (1 - recency_floor) * float(x["recency"])
    added = {k: float(x[k]) for k in ("access", "injected", "cited", "success", "feedback")}
    raw = prior * factor + sum(added.values())
    return {
        "base": x["base"],
        "signals": signals,
        "cost": x["cost"],
        "prior": prior,
        "recency": x["recency"],
        "recency_floor": recency_floor,
        "multiplier": factor,
        "decayed": prior * factor,
        "added": added,
        "raw": raw,
        "value": 1.0 if pinned else min(1.0, max(0.0, raw)),
        "pinned": pinned,
    }


def _brief(data: dict[str, Any]) -> dict[str, Any]:
    """Event data without bulky lists (a context manifest is shown by the context viewer instead)."""
    return {k: (f"[{len(v)} items]" if isinstance(v, list) and len(v) > 8 else v) for k, v in data.items()}


# ---- tier timeline ---------------------------------------------------------------------------------------
def _steps(lens: Lens, rows: Iterable[Row]) -> dict[str, list[Move]]:
    wanted = {r.id for r in rows}
    out: dict[str, list[Move]] = defaultdict(list)
    for mv in lens.moves:
        if mv.memory_id in wanted:
            out[mv.memory_id].append(mv)
    return out


def _edges(start: datetime, end: datetime, buckets: int) -> list[datetime]:
    span = max((end - start).total_seconds(), 1.0)
    return [start + timedelta(seconds=span * (i + 1) / buckets) for i in range(buckets)]


#: What the timeline's buckets follow, and what the heatmap's rows are (the API's choices too).
TIMELINE_AXES = ("events", "time")
HEATMAP_GROUPS = ("memory", "kind")


def _first_seen(row: Row, moves: list[Move]) -> tuple[datetime, int, str]:
    """When a memory appeared (time, event seq) and in which tier: its add event, else its creation
    time and first known tier (seq 0: before the log we have)."""
    for mv in moves:
        if mv.kind == "add":
            return mv.at, mv.seq, mv.to_tier or row.tier
    first = next((mv.from_tier for mv in moves if mv.from_tier), None)
    return row.created_at, 0, first or row.tier


def timeline(
    lens: Lens,
    session: str | RowFilter | None = None,
    buckets: int = 60,
    limit: int = 50,
    axis: str = "events",
) -> dict[str, Any]:
    """Memories per tier (bucketed counts at the end of each bucket) and the latest tier moves.

    ``axis="events"`` buckets by position in the event log, so bursts of activity get the room they
    need (an agent works for minutes, then nothing for days); ``axis="time"`` by wall-clock time. Either
    way ``edges`` are the times of the bucket ends, for the labels."""
    if axis not in TIMELINE_AXES:
        raise ValidationError("axis", f"is {axis!r}", f"use one of {', '.join(TIMELINE_AXES)}")
    buckets = counted("buckets", buckets)
    lens.refresh()
    with lens.lock:
        rows = _scope(lens, session)
        if not rows:
            empty: dict[str, list[int]] = {t: [] for t in TIERS}
            return {"edges": [], "series": empty, "moves": [], "total_moves": 0, "axis": axis}
        steps = _steps(lens, rows)
        starts = {r.id: _first_seen(r, steps.get(r.id, [])) for r in rows}
        by_time = axis == "time"

        def pos(at: datetime, seq: int) -> float:
            return at.timestamp() if by_time else float(seq)

        points = [pos(mv.at, mv.seq) for ms in steps.values() for mv in ms]
        points += [pos(at, seq) for at, seq, _ in starts.values()]
        lo, hi = min(points), max(points)
        edges = [lo + (hi - lo) * (k + 1) / buckets for k in range(buckets)]
        diff = {t: [0] * (buckets + 1) for t in TIERS}
        for r in rows:
            at, seq, tier = starts[r.id]
            diff[tier][bisect.bisect_left(edges, pos(at, seq))] += 1
            for mv in steps.get(r.id, []):
                if mv.kind == "add" or not mv.to_tier or mv.to_tier == tier or mv.to_tier not in diff:
                    continue
                k = bisect.bisect_left(edges, pos(mv.at, mv.seq))
                diff[tier][k] -= 1
                diff[mv.to_tier][k] += 1
                tier = mv.to_tier
        series = {t: list(accumulate(diff[t][:buckets])) for t in TIERS}
        recent = [mv for ms in steps.values() for mv in ms if mv.kind != "add"]
        recent.sort(key=lambda mv: mv.seq, reverse=True)
        return {
            "edges": _edge_times(edges, steps, starts, by_time),
            "axis": axis,
            "series": series,
            "moves": [_move(lens, mv) for mv in recent[:limit]],
            "total_moves": len(recent),
        }


def _edge_times(
    edges: list[float],
    steps: dict[str, list[Move]],
    starts: dict[str, tuple[datetime, int, str]],
    by_time: bool,
) -> list[int]:
    """The time of each bucket end: itself on the time axis, else the time of the last event before it."""
    if by_time:
        return [int(e * 1000) for e in edges]
    known = sorted(
        [(float(mv.seq), mv.at) for ms in steps.values() for mv in ms]
        + [(float(seq), at) for at, seq, _ in starts.values()]
    )
    keys = [k for k, _ in known]
    return [_ms(known[max(0, bisect.bisect_right(keys, e) - 1)][1]) for e in edges]


def _move(lens: Lens, mv: Move) -> dict[str, Any]:
    row = lens.rows.get(mv.memory_id)
    return {
        "seq": mv.seq,
        "at": mv.at.isoformat(),
        "id": mv.memory_id,
        "short_id": short_id(mv.memory_id),
        "kind": mv.kind,
        "from": mv.from_tier,
        "to": mv.to_tier,
        "reason": mv.reason,
        "value": mv.value_after,
        "preview": clip(row.preview, 100) if row else "(forgotten)",
    }


# ---- value heatmap ---------------------------------------------------------------------------------------
def heatmap(
    lens: Lens,
    session: str | RowFilter | None = None,
    group: str = "memory",
    cols: int = 40,
    offset: int = 0,
    limit: int = 40,
) -> dict[str, Any]:
    """Value over time: one row per memory (highest value first, paginated) or per kind (the mean value of
    that kind's memories present at each time). A memory's value is known at its events (moves, pins,
    votes, recalls, context builds) and now; between two samples the earlier one holds, before the first
    the first is carried back to when it appeared."""
    if group not in HEATMAP_GROUPS:
        raise ValidationError("group", f"is {group!r}", f"use one of {', '.join(HEATMAP_GROUPS)}")
    cols = counted("cols", cols)
    lens.refresh()
    with lens.lock:
        rows = _scope(lens, session)
        if not rows:
            return {"edges": [], "rows": [], "total": 0, "group": group}
        steps = _steps(lens, rows)
        starts = {r.id: _first_seen(r, steps.get(r.id, []))[0] for r in rows}
        now = lens.last_at or max(starts.values())
        t0 = min(starts.values())
        edges = _edges(t0, max(now, *starts.values()), cols)

        points = {r.id: _value_points(lens, r, starts[r.id], edges[-1]) for r in rows}
        edges_ms = [_ms(e) for e in edges]
        if group == "kind":
            by_kind: dict[str, list[Row]] = defaultdict(list)
            for r in rows:
                by_kind[r.kind].append(r)
            out_rows = [
                {
                    "id": None,
                    "label": f"{kind} ({len(members)})",
                    "values": _mean_over_time([points[r.id] for r in members], edges),
                }
                for kind, members in sorted(by_kind.items())
            ]
            return {"edges": edges_ms, "rows": out_rows, "total": len(out_rows), "group": group}
        rows.sort(key=lambda r: (-r.value, r.id))
        page = rows[offset : offset + limit]
        return {
            "edges": edges_ms,
            "rows": [
                {
                    "id": r.id,
                    "label": f"{short_id(r.id)} {r.kind}: {clip(r.preview, 60)}",
                    "values": _sampled(points[r.id], edges),
                }
                for r in page
            ],
            "total": len(rows),
            "offset": offset,
            "group": group,
        }


def _value_points(lens: Lens, row: Row, start: datetime, last_edge: datetime) -> list[tuple[datetime, float]]:
    """A memory's value as a step function: (time, value from then on), from when it appeared to now.

    The value when it appeared is its last sample by then, else its first sample (carried back), else
    its current value; the last point is the current value at the last edge (or at the last sample)."""
    samples = sorted(lens.values.get(row.id, []))
    before = [v for a, v in samples if a <= start]
    first = before[-1] if before else (samples[0][1] if samples else row.value)
    points = [(start, first), *((a, v) for a, v in samples if a > start)]
    points.append((max(last_edge, points[-1][0]), row.value))
    return points


def _sampled(points: list[tuple[datetime, float]], edges: list[datetime]) -> list[float | None]:
    times = [a for a, _ in points]
    out: list[float | None] = []
    for e in edges:
        i = bisect.bisect_right(times, e) - 1
        out.append(None if i < 0 else round(points[i][1], 3))
    return out


def _mean_over_time(series: list[list[tuple[datetime, float]]], edges: list[datetime]) -> list[float | None]:
    """The mean of several step functions at each edge (of those that exist by then), in one sweep."""
    deltas: list[tuple[datetime, float, int]] = []
    for points in series:
        deltas.append((points[0][0], points[0][1], 1))
        deltas.extend((b[0], b[1] - a[1], 0) for a, b in pairwise(points))
    deltas.sort(key=lambda d: d[0])
    out: list[float | None] = []
    total, count, k = 0.0, 0, 0
    for e in edges:
        while k < len(deltas) and deltas[k][0] <= e:
            total, count, k = total + deltas[k][1], count + deltas[k][2], k + 1
        out.append(round(total / count, 3) if count else None)
    return out


# ---- memory graph ----------------------------------------------------------------------------------------
def graph(
    lens: Lens,
    session: str | RowFilter | None = None,
    focus: str | None = None,
    limit: int = 120,
    offset: int = 0,
) -> dict[str, Any]:
    """Nodes and edges: parent -> child, typed links, and shared entities (named by at most 12 nodes).

    With ``focus``, the memory and its neighbourhood within the scope (breadth-first over those edges,
    nearest first); else the scope's memories, newest first. Either way ``total`` counts them all and
    ``limit`` and ``offset`` page through them (the neighbourhood ignored both and the filter bar, while
    ``total`` counted the scope)."""
    lens.refresh()
    with lens.lock:
        rows = _scope(lens, session)
        if focus:
            listed = _neighbourhood(lens, focus, {r.id for r in rows})
        else:
            rows.sort(key=lambda r: r.created_at, reverse=True)
            listed = [r.id for r in rows]
        chosen = listed[offset : offset + limit]
        ids = set(chosen)
        contents = {}
        for start in range(0, len(chosen), 500):
            contents.update(lens.harness.store.get_many(chosen[start : start + 500]))
        edges = []
        for i in chosen:
            r = lens.rows.get(i)
            if r is None:
                continue
            if r.parent_id in ids:
                edges.append({"source": r.parent_id, "target": i, "type": "parent"})
            edges.extend({"source": i, "target": t, "type": k} for k, t in r.links if t in ids)
        named: dict[str, list[str]] = defaultdict(list)
        for i, m in contents.items():
            for key in entities(m.content[:4000]):
                named[key].append(i)
        for key, members in named.items():
            if 2 <= len(members) <= 12:
                edges.extend(
                    {"source": a, "target": b, "type": "entity", "label": key} for a, b in pairwise(members)
                )
        nodes = [lens.rows[i].as_dict() for i in chosen if i in lens.rows]
        return {"nodes": nodes, "edges": edges, "total": len(listed), "offset": offset, "focus": focus}


def _neighbourhood(lens: Lens, focus: str, scope: set[str]) -> list[str]:
    """``focus`` and the memories of ``scope`` it reaches, nearest first (one pass over the rows, as the
    edges take anyway). The focus itself is first even when the filter bar leaves it out."""
    try:
        lens.memory(focus)
    except NotFoundError:  # named as the request names it: the graph's focus, not a memory_id it never sent
        raise NotFoundError("memory", focus, field="focus") from None
    children: dict[str, list[str]] = defaultdict(list)
    for r in lens.rows.values():
        if r.parent_id:
            children[r.parent_id].append(r.id)
        for _, t in r.links:
            children[t].append(r.id)
    seen = [focus]  # a list for the order; `seen_set` for the membership tests
    seen_set = {focus}
    frontier = [focus]
    while frontier:
        nxt = []
        for i in frontier:
            node = lens.rows.get(i)
            near = [*children.get(i, [])]
            if node is not None:
                near += [x for x in (node.parent_id, *(t for _, t in node.links)) if x]
                if i == focus:  # the focus's conversational neighbours (a scan: once, not per node)
                    near += _same_session_neighbours(lens, node)
            for j in near:
                if j not in seen_set and j in scope:
                    seen.append(j)
                    seen_set.add(j)
                    nxt.append(j)
        frontier = nxt
    return seen


def _same_session_neighbours(lens: Lens, row: Row, k: int = 3) -> list[str]:
    if row.session_id is None:
        return []
    same = [r for r in lens.rows.values() if r.session_id == row.session_id]
    same.sort(key=lambda r: r.created_at)
    i = next(n for n, r in enumerate(same) if r.id == row.id)
    return [r.id for r in same[max(0, i - k) : i + k + 1] if r.id != row.id]


# ---- contexts --------------------------------------------------------------------------------------------
def contexts_of(lens: Lens, memory_id: str, offset: int = 0, limit: int = 100) -> dict[str, Any]:
    """Reverse influence: the context builds ``memory_id`` entered, newest first, a page at a time (a
    memory pinned through thousands of builds made one answer of hundreds of KB). An id this tenant has no
    memory of is :class:`NotFoundError`, as in the other views of one memory."""
    lens.harness.get(memory_id)
    entered = lens.contexts_of(memory_id)
    entered.reverse()
    return _page(entered, offset, limit)


def contexts(
    lens: Lens, session: str | RowFilter | None = None, offset: int = 0, limit: int = 50
) -> dict[str, Any]:
    """Context builds, newest first: one session's, or those a filter bar keeps (session, agent, date
    range, text of the query)."""
    flt = session if isinstance(session, RowFilter) else RowFilter(session=session)
    lens.refresh()
    with lens.lock:
        builds = sorted(lens.contexts.values(), key=lambda b: b.seq, reverse=True)
        builds = [b for b in builds if flt.keeps_build(b)]
        page = _page(builds, offset, limit)
        page["items"] = [b.summary() for b in page["items"]]
        return page
