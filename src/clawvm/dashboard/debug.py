"""The dashboard's debugging views as data: one run's trace, the exact prompt of a build and the diff of two,
a memory's revisions, the teams face (grants, review queue, conflicts, guidance), and the what-if replay.

Like :mod:`clawvm.dashboard.views`, each function takes a :class:`~clawvm.observe.lens.Lens` (the tenant's
analytics, kept up to date incrementally) and returns JSON-ready dicts; every list is bounded.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clawvm.core.errors import NotFoundError
from clawvm.core.model import Filters, Kind, Memory, Status
from clawvm.dashboard.views import RowFilter
from clawvm.harness import Harness
from clawvm.observe.lens import ContextBuild, Lens, Row, clip
from clawvm.replay import Policy, Reach, replay, variant
from clawvm.store import Event
from clawvm.teams import shared
from clawvm.teams.guidance import source_tasks
from clawvm.vm.context import short_id

#: top-level steps of one trace page (a step's children come with it)
TRACE_PAGE = 200
_DIFF_CONTEXT_LINES = 1


# ---- exact prompts --------------------------------------------------------------------------------------
def context_detail(lens: Lens, seq: int, field: str = "seq") -> dict[str, Any]:
    """One build as the model got it: the exact prompt text, its manifest (why each line is in, tier and
    value then), and the output with its citations when one was recorded. ``field``: the parameter that
    named ``seq``, for the :class:`NotFoundError` of another tenant's build or none."""
    try:
        detail = lens.influence(seq)  # refreshes the lens
    except NotFoundError as exc:
        raise NotFoundError(exc.what, exc.ident, field) from None
    found = lens.harness.store.read_events(seq - 1, 1)
    text = found[0].data.get("text") if found and found[0].seq == seq else None
    return {**detail, "text": text if isinstance(text, str) else None}


def context_diff(lens: Lens, a: int, b: int) -> dict[str, Any]:
    """Two builds side by side: lines in and out (by memory), tokens, and a unified diff of the texts."""
    left, right = context_detail(lens, a, "a"), context_detail(lens, b, "b")
    ids_left = {line["id"] for line in left["lines"]}
    ids_right = {line["id"] for line in right["lines"]}
    text_diff = list(
        difflib.unified_diff(
            (left["text"] or "").splitlines(),
            (right["text"] or "").splitlines(),
            fromfile=f"build #{a}",
            tofile=f"build #{b}",
            lineterm="",
            n=_DIFF_CONTEXT_LINES,
        )
    )
    return {
        "a": _build_head(left),
        "b": _build_head(right),
        "lines_in": [_line_head(x) for x in right["lines"] if x["id"] not in ids_left],
        "lines_out": [_line_head(x) for x in left["lines"] if x["id"] not in ids_right],
        "kept": len(ids_left & ids_right),
        "text_diff": text_diff,
    }


def _build_head(detail: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("seq", "at", "query", "tokens", "budget", "scope")
    return {k: detail[k] for k in keep}


def _line_head(line: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("id", "short_id", "section", "tier", "value", "tokens", "preview")
    return {k: line.get(k) for k in keep}


# ---- run trace ------------------------------------------------------------------------------------------
@dataclass
class _Step:
    """One node of a run's trace: a memory (user input, LLM call, tool call, result...), a context build,
    or an output."""

    type: str  # "memory" | "context" | "output"
    at: datetime
    order: int  # tie-break: the memory's position / the event's seq
    data: dict[str, Any]
    children: list[_Step] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "at": self.at.isoformat(),
            **self.data,
            "children": [c.as_dict() for c in sorted(self.children, key=_step_order)],
        }


def _step_order(step: _Step) -> tuple[datetime, int]:
    return (step.at, step.order)


def trace(
    lens: Lens,
    session: str,
    task: str | None = None,
    offset: int = 0,
    limit: int = TRACE_PAGE,
    flt: RowFilter | None = None,
) -> dict[str, Any]:
    """What happened in ``session`` (and ``task``), in order, as a tree: a tool call under the LLM call
    that asked for it, its result under it, an output under the context build it answered. Each step has
    its latency, tokens and cost where recorded, and the memory ids.

    ``flt`` (the filter bar, its session ignored) keeps the memory steps it matches (a step whose parent
    is filtered out moves up to the top level) and the builds it matches; a filter only memories have
    (kind, tool, tag, tier, status) leaves the builds out."""
    flt = flt or RowFilter()
    memory_only = any((flt.kind, flt.tool, flt.tag, flt.tier, flt.status))
    named_session, named_task = session, task  # as the caller named them (the stored forms may be redacted)
    session, task = lens.stored_id(session), None if task is None else lens.stored_id(task)
    lens.refresh()
    with lens.lock:
        of_session = [r for r in lens.rows.values() if r.session_id == session]
        tasks = sorted({r.task_id for r in of_session if r.task_id})
        in_task = [r for r in of_session if task in (None, r.task_id)]
        of_task = [
            b
            for b in lens.contexts.values()
            if b.scope.get("session_id") == session and task in (None, b.scope.get("task_id"))
        ]
    if not in_task and not of_task:
        named = named_session if task is None else f"{named_session} / task {named_task}"
        raise NotFoundError("session", named, field="session" if task is None else "task")
    rows = [r for r in in_task if flt.keep(r)]
    builds = [] if memory_only else [b for b in of_task if flt.keeps_build(b)]
    roots = _tree(rows, builds)
    roots.sort(key=_step_order)
    return {
        "session": session,
        "task": task,
        "tasks": tasks,
        "unfiltered": len(in_task) + len(of_task),
        "total": len(roots),
        "offset": offset,
        "limit": limit,
        "totals": _totals(rows, builds),
        "steps": [s.as_dict() for s in roots[offset : offset + limit]],
    }


def _tree(rows: list[Row], builds: list[ContextBuild]) -> list[_Step]:
    rows = sorted(rows, key=lambda r: (r.created_at, r.id))
    steps = {r.id: _memory_step(r, n) for n, r in enumerate(rows)}
    order = {r.id: n for n, r in enumerate(rows)}
    roots: list[_Step] = []
    for r in rows:
        # under a parent recorded before it: a parent outside the view, a later one or itself (older
        # stores hold such links, and a cycle of them hid every step in it) leaves the step a root
        parent = steps.get(r.parent_id or "")
        if parent is not None and order[r.parent_id or ""] < order[r.id]:
            parent.children.append(steps[r.id])
        else:
            roots.append(steps[r.id])
    for step in steps.values():
        _settle_call(step)
    for b in builds:
        step = _Step("context", b.at, b.seq, _context_data(b))
        if b.output is not None:
            out = b.output
            data = {
                "seq": out.seq,
                "cited": out.cited,
                "success": out.success,
                "preview": clip(out.text, 160),
            }
            step.children.append(_Step("output", out.at, out.seq, data))
        roots.append(step)
    return roots


def _settle_call(step: _Step) -> None:
    """A tool call is stored PENDING when it starts and its outcome is a result memory under it: the trace
    shows the call with its result's state (the stored one stays in ``recorded_state``)."""
    if step.data.get("kind") != "tool_call" or step.data.get("state") != "pending":
        return
    results = [c for c in step.children if c.data.get("kind") == "tool_result" and c.data.get("state")]
    if results:
        step.data["recorded_state"] = step.data["state"]
        step.data["state"] = results[-1].data["state"]


def _memory_step(r: Row, order: int) -> _Step:
    data = {
        "id": r.id,
        "short_id": short_id(r.id),
        "kind": r.kind,
        "state": r.state,
        "tool": r.tool_name,
        "agent_id": r.agent_id,
        "task_id": r.task_id,
        "tier": r.tier,
        "latency_s": r.seconds or None,
        "tokens": r.cost_tokens or None,
        "money": r.money or None,
        "memory_tokens": r.tokens,
        "preview": r.preview,
    }
    return _Step("memory", r.created_at, order, data)


def _context_data(b: ContextBuild) -> dict[str, Any]:
    return {
        "seq": b.seq,
        "query": b.query,
        "latency_s": None if b.ms is None else round(float(b.ms) / 1000, 6),
        "tokens": b.tokens,
        "budget": b.budget,
        "lines": [str(x["id"]) for x in b.manifest],
        "cited": len(b.output.cited) if b.output else None,
    }


def _totals(rows: Iterable[Row], builds: Iterable[ContextBuild]) -> dict[str, Any]:
    rows, builds = list(rows), list(builds)
    by_kind: dict[str, int] = defaultdict(int)
    for r in rows:
        by_kind[r.kind] += 1
    timed = [r.seconds for r in rows if r.kind == Kind.TOOL_RESULT.value and r.seconds]
    return {
        "memories": len(rows),
        "by_kind": dict(by_kind),
        "errors": _failures(rows),
        # None when no tool result recorded its duration: unknown, which "0 ms" would misstate
        "tool_seconds": round(sum(timed), 6) if timed else None,
        "tool_results_timed": len(timed),
        "llm_tokens": sum(r.cost_tokens for r in rows),
        "money": round(sum(r.money for r in rows), 6),
        "contexts": len(builds),
        "context_tokens": sum(b.tokens for b in builds),
    }


def _failures(rows: list[Row]) -> int:
    """Failures, each counted once: a failed tool call is recorded as an error call and its error result
    (the result's parent), which are one failure; any other error memory is one too."""
    errors = {r.id: r for r in rows if r.state == "error"}
    return sum(1 for r in errors.values() if not (r.parent_id in errors and r.kind == Kind.TOOL_RESULT.value))


# ---- revisions ------------------------------------------------------------------------------------------
def revisions(h: Harness, memory_id: str) -> dict[str, Any]:
    """Every revision of the memory's chain, oldest first, each with the diff from the one before."""
    chain = h.history(memory_id)
    out = []
    before: Memory | None = None
    for m in chain:
        diff = (
            []
            if before is None
            else list(
                difflib.unified_diff(
                    before.content.splitlines(), m.content.splitlines(), "before", "after", lineterm="", n=2
                )
            )
        )
        out.append(
            {
                "id": m.id,
                "short_id": short_id(m.id),
                "status": m.status.value,
                "version": m.version,
                "created_at": m.created_at.isoformat(),
                "agent_id": m.agent_id,
                "content": m.content,
                "diff": diff,
            }
        )
        before = m
    return {"head": chain[-1].id, "revisions": out}


# ---- teams ----------------------------------------------------------------------------------------------
TEAM_LIST = 100


def teams(lens: Lens, h: Harness, flt: RowFilter | None = None) -> dict[str, Any]:
    """The teams face: grants per team, the review queue, open conflicts with both sides, and the team
    knowledge guidance draws on, with its sources and adoption rates (and the latest guidance builds).

    ``flt`` (the filter bar: text, kind, agent, tag, date range) narrows each list to what it applies to:
    a conflict stays when either side (or its note) matches, a guidance build by its agent, task text and
    date, a grant by its agent."""
    flt = flt or RowFilter()
    lens.refresh()
    queue = [m for m in shared.review_queue(h) if _keeps(flt, m)][:TEAM_LIST]
    conflicts = [c for c in (_conflict(h, note, flt) for note in shared.open_conflicts(h)) if c][:TEAM_LIST]
    knowledge = Filters.of(tenant=h.tenant, status=Status.ACTIVE, kind=list(shared.TEAM_KINDS))
    team_memories = [m for m in h.store.page(knowledge, None, TEAM_LIST, newest_first=True) if m.team_id]
    with lens.lock:
        guidance = list(lens.guidance_events)
    return {
        "grants": [g.__dict__ for g in shared.grants(h) if not flt.agent or g.agent_id == flt.agent],
        "review": [_team_memory(m) for m in queue],
        "conflicts": conflicts,
        "knowledge": [_team_memory(m) for m in team_memories if _keeps(flt, m)],
        "guidance": [_guidance_build(e) for e in reversed(guidance) if _keeps_guidance(flt, e)],
    }


def _keeps(flt: RowFilter, m: Memory) -> bool:
    """Whether a team memory passes the filter bar (what applies to one: text, kind, agent, tag, dates)."""
    wanted = ((flt.kind, m.kind.value), (flt.agent, m.agent_id), (flt.tier, m.tier.value))
    if any(want and want != have for want, have in wanted) or (flt.tag and flt.tag not in m.tags):
        return False
    if (flt.since and m.created_at < flt.since) or (flt.until and m.created_at > flt.until):
        return False
    return not flt.q or flt.q.lower() in m.content.lower() or m.id.endswith(flt.q.lower())


def _keeps_guidance(flt: RowFilter, e: Event) -> bool:
    if flt.agent and e.data.get("agent_id") != flt.agent:
        return False
    if (flt.since and e.at < flt.since) or (flt.until and e.at > flt.until):
        return False
    return not flt.q or flt.q.lower() in str(e.data.get("task", "")).lower()


def _guidance_build(e: Event) -> dict[str, Any]:
    head = {k: e.data.get(k) for k in ("agent_id", "task", "tokens", "budget")}
    return {"seq": e.seq, "at": e.at.isoformat(), **head, "items": e.data.get("manifest", [])}


def _team_memory(m: Memory) -> dict[str, Any]:
    return {
        "id": m.id,
        "short_id": short_id(m.id),
        "kind": m.kind.value,
        "team_id": m.team_id,
        "agent_id": m.agent_id,
        "confidence": m.confidence,
        "review": shared.review_state(m),
        "adoption_rate": shared.adoption_rate(m),
        "adopted": shared.adoption(m)[0],
        "rejected": shared.adoption(m)[1],
        "source_tasks": list(source_tasks(m)),
        "tags": m.tags,
        "preview": clip(" ".join(m.content.split()), 200),
    }


def _conflict(h: Harness, note: Memory, flt: RowFilter) -> dict[str, Any] | None:
    """The conflict with both sides, or None when neither side (nor the note) passes the filter bar."""
    choices = shared.conflict_choices(note)
    found = h.store.get_many(choices)
    sides = [found[i] for i in choices if i in found]
    if not any(_keeps(flt, m) for m in [note, *sides]):
        return None
    return {**_team_memory(note), "sides": [_team_memory(m) for m in sides]}


# ---- what-if replay -------------------------------------------------------------------------------------
#: The most memories one what-if request replays (each policy re-records them all: ~2 s for 3,000, ~14 s for
#: 10,000 on a loaded machine, so ~30 s here, and two in-process harnesses of memory); more is refused,
#: pointing at reach=session and at ``clawvm replay``, which has no limit.
WHATIF_MAX_MEMORIES = 20_000


def what_if(
    h: Harness,
    session: str,
    *,
    budget: int | None = None,
    working_items: int | None = None,
    working_tokens: int | None = None,
    weights: Mapping[str, float] | None = None,
    reach: Reach = "tenant",
    max_memories: int = WHATIF_MAX_MEMORIES,
) -> dict[str, Any]:
    """:func:`clawvm.replay.replay` of ``session`` under the live policy (A) and the changed one (B),
    refused (:class:`ValidationError` on ``reach``) when it would replay more than ``max_memories``."""
    current = h.pager.config
    changed = variant(current, working_items=working_items, working_tokens=working_tokens, weights=weights)
    a, b = Policy("current", current), Policy("changed", changed, context_budget=budget)
    return replay(h, session, a, b, reach=reach, max_memories=max_memories).as_dict()
