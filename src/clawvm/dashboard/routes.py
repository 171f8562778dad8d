"""The MemLens dashboard as a FastAPI router: the static page (no build step) and its JSON API.

``clawvm serve`` mounts it (:func:`clawvm.server.app.create_app`): ``create_router(read, write)`` takes two
FastAPI dependencies returning the caller's :class:`~clawvm.Harness` (the server authenticates the API
key and checks its role in them; ``write`` serves the manual actions). Library errors propagate to the
app's handlers (:func:`clawvm.server.errors.install_error_handlers`), like every other route's. The page lives
at ``/dashboard/`` and needs no key; its scripts call ``/dashboard/api/...`` with the key the user typed
(kept in the browser's localStorage; a URL ending in ``#key=<key>`` sets it). The page stays live: it reads
the tenant's event stream (``/v1/events/stream``, with the same ``Authorization`` header, through
``fetch``: ``EventSource`` cannot send headers, and a key must not travel in a URL) and re-renders the
current view at most once a second while events arrive.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations at runtime, and
# the dependency aliases (Reader, Writer) are local to create_router, where string annotations can't see.
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import fields
from datetime import datetime
from enum import StrEnum
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import RedirectResponse, Response
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from clawvm.core.errors import NotFoundError, RateLimitError, ValidationError
from clawvm.core.model import (
    MAX_SCOPE_ID_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    NON_BLANK,
    STATUS_CHOICES,
    VISIBLE,
    Kind,
    Status,
    Tier,
    as_utc,
    counted,
    describe_pattern,
    iso_date_or_datetime,
)
from clawvm.dashboard import debug, views
from clawvm.harness import Harness
from clawvm.observe.learning import NOTE_MAX_CHARS, intervene, weights_of
from clawvm.observe.lens import Lens
from clawvm.store.crypto import without_sealed
from clawvm.vm.scoring import ScoringConfig

STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "debug.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

_lenses: weakref.WeakKeyDictionary[Harness, Lens] = weakref.WeakKeyDictionary()
#: a harness whose lens is being built -> the lock its builder holds (its other requests wait on it)
_builds: weakref.WeakKeyDictionary[Harness, threading.Lock] = weakref.WeakKeyDictionary()
_lenses_lock = threading.Lock()  # guards the two dicts, never a build


def lens_for(harness: Harness) -> Lens:
    """One :class:`Lens` per open harness, built on first use and then kept up to date incrementally.

    A build reads the tenant's whole event log and rows: it holds its harness's own lock (a tenant's
    lens is built once), not the module's, which every dashboard request of every tenant takes (held
    through a large tenant's first build, it stopped all the others' dashboards)."""
    with _lenses_lock:
        lens = _lenses.get(harness)
        if lens is not None:
            return lens
        build = _builds.setdefault(harness, threading.Lock())
    with build:
        return _built(harness)


def _built(harness: Harness) -> Lens:
    """The lens of ``harness``, built unless a request that held its build lock first built it."""
    with _lenses_lock:
        lens = _lenses.get(harness)
    if lens is None:
        lens = Lens(harness)
        with _lenses_lock:
            _lenses[harness] = lens
            _builds.pop(harness, None)  # later requests find the lens: the lock is no longer needed
    return lens


class ValueBody(BaseModel):
    # a number, not "0.5" (as the spec says); NaN said "should be less than or equal to 1"
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    value: float = Field(ge=0.0, le=1.0)


def _weight_names() -> list[str]:
    """The float weights of :class:`ScoringConfig`: what the what-if replay accepts."""
    scoring = ScoringConfig()
    return [f.name for f in fields(scoring) if isinstance(getattr(scoring, f.name), float)]


def _weights_pattern() -> str:
    """The what-if view's ``weights``, as its schema states them: ``NAME=NUMBER`` pairs joined by commas,
    each NAME a float weight of :class:`ScoringConfig` (what the replay accepts) and each NUMBER from 0 to
    1 (what the config accepts), or nothing."""
    names = "|".join(_weight_names())
    pair = f"({names})=(0(\\.[0-9]{{1,6}})?|1(\\.0{{1,6}})?)"
    return f"^({pair}(,{pair})*)?$"


WEIGHTS_PATTERN = _weights_pattern()
describe_pattern(
    WEIGHTS_PATTERN,
    "is not a list of NAME=VALUE weights",
    "join NAME=VALUE pairs with commas, each VALUE from 0 to 1 and each NAME one of: "
    + ", ".join(_weight_names()),
)


class NoteBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(min_length=1, max_length=NOTE_MAX_CHARS, pattern=NON_BLANK)


def _blank_is_none(v: Any) -> Any:
    """The filter bar sends an empty value for "any": no filter."""
    return None if v == "" else v


def _or_blank(names: Iterable[StrEnum]) -> dict[str, Any]:
    """The JSON Schema of a filter that takes one of ``names`` or an empty value (no filter)."""
    return {"anyOf": [{"type": "string", "enum": ["", *(n.value for n in names)]}, {"type": "null"}]}


_STATUS_CHOICES = [x for x in STATUS_CHOICES if x != "any"]


def _status_choice(v: Any) -> Any:
    """A status the lists show, or "any" / empty for all of them (as ``/v1`` and the SDK take "any");
    internal, the harness's own records, is no choice (it answered an empty list)."""
    if v in (None, "", "any"):
        return None
    if v not in _STATUS_CHOICES:
        raise ValueError(f"should be one of {', '.join(_STATUS_CHOICES)}, 'any' or empty")
    return v


class FilterQuery(BaseModel):
    """The filter bar of every list (query parameters): see :class:`clawvm.dashboard.views.RowFilter`.
    (Not ``extra="forbid"``: the route's other parameters share the query string.)"""

    session: str | None = Field(default=None, max_length=500)
    q: str = Field(default="", max_length=500)
    # one of the names, or empty (no filter): a misspelt one used to match nothing and show an empty list
    tier: Annotated[Tier | None, BeforeValidator(_blank_is_none), WithJsonSchema(_or_blank(Tier))] = None
    kind: Annotated[Kind | None, BeforeValidator(_blank_is_none), WithJsonSchema(_or_blank(Kind))] = None
    agent: str | None = Field(default=None, max_length=500)
    tool: str | None = Field(default=None, max_length=500)
    tag: str | None = Field(default=None, max_length=500)
    status: Annotated[
        Status | None,
        BeforeValidator(_status_choice),
        WithJsonSchema(
            {"anyOf": [{"type": "string", "enum": ["", "any", *_STATUS_CHOICES]}, {"type": "null"}]}
        ),
    ] = None
    # in UTC when read: a time that leaves the calendar once converted is a 422 naming it (converted in the
    # route, it was a 500 with a traceback in the log, from any key)
    since: Annotated[datetime, BeforeValidator(iso_date_or_datetime), AfterValidator(as_utc)] | None = None
    until: Annotated[datetime, BeforeValidator(iso_date_or_datetime), AfterValidator(as_utc)] | None = None

    def as_filter(self) -> views.RowFilter:
        given = {k: v for k, v in self.model_dump().items() if v not in (None, "")}
        return views.RowFilter(**{**given, "since": self.since, "until": self.until})


class TraceQuery(FilterQuery):
    """A trace's query: its session (required), the filter bar for its steps."""

    session: str = Field(min_length=1, max_length=500)  # required here


class TierBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tier: Literal["working", "short_term", "long_term", "archive"]


Tag = Annotated[str, Field(min_length=1, max_length=MAX_TAG_CHARS, pattern=NON_BLANK)]


class NewMemoryBody(BaseModel):
    """A memory written from the dashboard (through the harness, as the SDK's ``record``)."""

    model_config = ConfigDict(extra="forbid")
    content: str = Field(min_length=1, max_length=100_000, pattern=VISIBLE)
    kind: Kind = Kind.NOTE
    session_id: str | None = Field(default=None, max_length=MAX_SCOPE_ID_CHARS)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)


class ReviseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str = Field(min_length=1, max_length=100_000, pattern=VISIBLE)
    expected_version: int | None = Field(default=None, ge=1)


class ForgetBody(BaseModel):
    """What the inspector showed: a memory that has moved on since is kept (409)."""

    model_config = ConfigDict(extra="forbid")
    expected_version: int | None = Field(default=None, ge=1)


class KeepBody(BaseModel):
    """The side of a conflict to keep (the others are rejected)."""

    model_config = ConfigDict(extra="forbid")
    keep: str = Field(min_length=1, max_length=200)


class ReviewBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=2000)


def _static(name: str) -> Response:
    body = resources.files(__package__).joinpath(name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})


#: Seconds a what-if request refused while another runs is told to wait (a replay takes seconds).
WHATIF_RETRY_S = 5.0


def create_router(
    read: Callable[..., Harness],
    write: Callable[..., Harness] | None = None,
    prefix: str = "/dashboard",
    whatif_max_memories: int = debug.WHATIF_MAX_MEMORIES,
) -> APIRouter:
    """The dashboard router; ``read``/``write`` are dependencies giving the caller's harness.
    ``whatif_max_memories``: the most memories one what-if request replays (more is refused)."""
    whatif_max_memories = counted("whatif_max_memories", whatif_max_memories)
    router = APIRouter(prefix=prefix, tags=["dashboard"])
    # one what-if replay at a time in this process: each holds two in-process harnesses and cannot be
    # cancelled once started (a client that gave up left its replay running, and a few piled up GBs)
    replaying = threading.Lock()
    Reader = Annotated[Harness, Depends(read)]
    Writer = Annotated[Harness, Depends(write or read)]
    Offset = Annotated[int, Query(ge=0)]
    Limit = Annotated[int, Query(ge=1, le=500)]
    Session = Annotated[str | None, Query(max_length=500)]

    @router.get("", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(f"{prefix}/")

    @router.get("/", include_in_schema=False)
    def page() -> Response:
        return _static("index.html")

    @router.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC:
            raise HTTPException(404, "no such file")
        return _static(name)

    @router.get("/api/overview")
    def overview(h: Reader) -> dict[str, Any]:
        lens = lens_for(h)
        m = lens.metrics()
        keep = (
            "memories",
            "active",
            "events",
            "working_hit_rate",
            "eviction_regret",
            "duplicate_rate",
            "junk_rate",
            "stale_rate",
        )
        out = {"tenant": h.tenant, **{k: m[k] for k in keep}, "contexts": len(lens.contexts)}
        return {**out, "seq": lens.seq}  # the newest event seen: where the page's live event stream starts

    @router.get("/api/sessions")
    def sessions(
        h: Reader, flt: Annotated[FilterQuery, Query()], offset: Offset = 0, limit: Limit = 50
    ) -> dict[str, Any]:
        only = views.SessionFilter(q=flt.q, agent=flt.agent, since=flt.since, until=flt.until)
        return views.sessions(lens_for(h), offset, limit, flt=only)

    @router.get("/api/memories")
    def memories(
        h: Reader,
        flt: Annotated[FilterQuery, Query()],
        sort: views.SortName = "newest",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> dict[str, Any]:
        return views.memories(lens_for(h), flt.as_filter(), sort, offset, limit)

    @router.get("/api/memories/{memory_id}")
    def memory(h: Reader, memory_id: str) -> dict[str, Any]:
        return views.memory_detail(lens_for(h), memory_id)

    @router.get("/api/timeline")
    def timeline(
        h: Reader,
        flt: Annotated[FilterQuery, Query()],
        buckets: Annotated[int, Query(ge=2, le=400)] = 60,
        limit: Limit = 50,
        axis: Annotated[str, Query(pattern="^(events|time)$")] = "events",
    ) -> dict[str, Any]:
        return views.timeline(lens_for(h), flt.as_filter(), buckets, limit, axis)

    @router.get("/api/heatmap")
    def heatmap(
        h: Reader,
        flt: Annotated[FilterQuery, Query()],
        group: Annotated[str, Query(pattern="^(memory|kind)$")] = "memory",
        cols: Annotated[int, Query(ge=2, le=200)] = 40,
        offset: Offset = 0,
        limit: Limit = 40,
    ) -> dict[str, Any]:
        return views.heatmap(lens_for(h), flt.as_filter(), group, cols, offset, limit)

    @router.get("/api/graph")
    def graph(
        h: Reader,
        flt: Annotated[FilterQuery, Query()],
        focus: str | None = None,
        limit: Limit = 120,
        offset: Offset = 0,
    ) -> dict[str, Any]:
        return views.graph(lens_for(h), flt.as_filter(), focus, limit, offset)

    @router.get("/api/contexts")
    def contexts(
        h: Reader, flt: Annotated[FilterQuery, Query()], offset: Offset = 0, limit: Limit = 50
    ) -> dict[str, Any]:
        return views.contexts(lens_for(h), flt.as_filter(), offset, limit)

    @router.get(
        "/api/contexts/export",
        response_class=Response,
        responses={
            200: {
                "content": {"application/x-ndjson": {}, "text/csv": {}},
                "description": "the builds of the selection, one a line (jsonl) or a row (csv)",
            }
        },
    )
    def contexts_export(
        h: Reader,
        flt: Annotated[FilterQuery, Query()],
        fmt: Annotated[str, Query(alias="format", pattern="^(jsonl|csv)$")] = "jsonl",
    ) -> Response:
        body, media = views.export_contexts(lens_for(h), flt.as_filter(), fmt)
        headers = {"Content-Disposition": f'attachment; filename="memlens-contexts.{fmt}"'}
        return Response(body, media_type=media, headers=headers)

    @router.get("/api/contexts/diff")
    def context_diff(h: Reader, a: int, b: int) -> dict[str, Any]:
        return debug.context_diff(lens_for(h), a, b)

    @router.get("/api/contexts/{seq}")
    def context(h: Reader, seq: int) -> dict[str, Any]:
        return debug.context_detail(lens_for(h), seq)

    @router.get("/api/trace")
    def trace(
        h: Reader,
        flt: Annotated[TraceQuery, Query()],
        task: Session = None,
        offset: Offset = 0,
        limit: Limit = debug.TRACE_PAGE,
    ) -> dict[str, Any]:
        rows = flt.model_copy(update={"session": None}).as_filter()  # the trace's session, not a filter
        return debug.trace(lens_for(h), flt.session, task or None, offset, limit, rows)

    @router.get("/api/memories/{memory_id}/revisions")
    def revisions(h: Reader, memory_id: str) -> dict[str, Any]:
        return debug.revisions(h, memory_id)

    @router.get("/api/teams")
    def teams_view(h: Reader, flt: Annotated[FilterQuery, Query()]) -> dict[str, Any]:
        return debug.teams(lens_for(h), h, flt.as_filter())

    @router.get("/api/whatif")
    def what_if(
        h: Reader,
        session: Annotated[str, Query(min_length=1, max_length=500)],
        budget: Annotated[int | None, Query(ge=1, le=200_000)] = None,
        working_items: Annotated[int | None, Query(ge=1, le=100_000)] = None,
        working_tokens: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
        weights: Annotated[
            str, Query(max_length=500, pattern=WEIGHTS_PATTERN, description="NAME=VALUE,...")
        ] = "",
        reach: Annotated[
            Literal["tenant", "session"],
            Query(description="replay every memory recorded up to the session's last build, or its own"),
        ] = "tenant",
    ) -> dict[str, Any]:
        # a session that built no context is a 404 before any limit (the Lens indexes the builds)
        if not lens_for(h).metrics(session)["context_tokens"]["builds"]:
            raise NotFoundError("session", session, field="session")
        if not replaying.acquire(blocking=False):
            raise RateLimitError(WHATIF_RETRY_S, "what-if replays (one at a time per server process)")
        try:
            return debug.what_if(
                h,
                session,
                budget=budget,
                working_items=working_items,
                working_tokens=working_tokens,
                weights=views.parse_weights(weights),
                reach=reach,
                max_memories=whatif_max_memories,
            )
        except ValidationError as exc:
            if exc.field == "session_id":  # no recorded build: nothing to replay there, as for a bad id
                raise NotFoundError("session", session, field="session") from None
            raise
        finally:
            replaying.release()

    @router.get(
        "/api/export",
        response_class=Response,
        responses={
            200: {
                "content": {"application/x-ndjson": {}, "text/csv": {}},
                "description": "the selection, one memory a line (jsonl) or a row (csv)",
            }
        },
    )
    def export(
        h: Reader,
        flt: Annotated[FilterQuery, Query()],
        fmt: Annotated[str, Query(alias="format", pattern="^(jsonl|csv)$")] = "jsonl",
    ) -> Response:
        body, media = views.export(lens_for(h), flt.as_filter(), fmt)
        name = f"memlens-memories.{fmt}"
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        return Response(body, media_type=media, headers=headers)

    @router.get("/api/memories/{memory_id}/contexts")
    def contexts_of(h: Reader, memory_id: str, offset: Offset = 0, limit: Limit = 100) -> dict[str, Any]:
        return views.contexts_of(lens_for(h), memory_id, offset, limit)

    @router.get("/api/metrics")
    def metrics(h: Reader, session: Session = None) -> dict[str, Any]:
        got = lens_for(h).metrics(session or None)
        if session and not got["memories"] and not got["context_tokens"]["builds"]:  # as trace and what-if
            raise NotFoundError("session", session, field="session")
        return got

    @router.get("/api/weights")
    def weights(h: Reader) -> dict[str, Any]:
        lens = lens_for(h)
        lens.refresh()
        history = [
            {
                "seq": e.seq,
                "at": e.at.isoformat(),
                "memory_id": e.memory_id,
                "action": e.data.get("action"),
                "target": e.data.get("target"),
                "delta": e.data.get("delta"),
            }
            for e in lens.weights_events[-100:]
        ]
        return {"weights": weights_of(h.pager.config.scoring), "history": history}

    @router.get("/api/manual")
    def manual(h: Reader, offset: Offset = 0, limit: Limit = 50) -> dict[str, Any]:
        lens = lens_for(h)
        lens.refresh()
        items = [
            {"seq": e.seq, "at": e.at.isoformat(), "memory_id": e.memory_id, **e.data}
            for e in reversed(lens.manual)
        ]
        return {"total": len(items), "items": items[offset : offset + limit]}

    def act(h: Harness, action: str, memory_id: str, **kw: Any) -> dict[str, Any]:
        result = intervene(h, action, memory_id, by="dashboard", **kw)
        lens_for(h).refresh()
        return {
            "id": memory_id,
            "before": result["before"],
            "after": result["after"],
            "learned": result["learned"],
        }

    @router.post("/api/memories/{memory_id}/pin")
    def pin(h: Writer, memory_id: str) -> dict[str, Any]:
        return act(h, "pin", memory_id)

    @router.post("/api/memories/{memory_id}/unpin")
    def unpin(h: Writer, memory_id: str) -> dict[str, Any]:
        return act(h, "unpin", memory_id)

    @router.post("/api/memories/{memory_id}/archive")
    def archive(h: Writer, memory_id: str) -> dict[str, Any]:
        return act(h, "archive", memory_id)

    @router.post("/api/memories/{memory_id}/value")
    def set_value(h: Writer, memory_id: str, body: ValueBody) -> dict[str, Any]:
        return act(h, "set_value", memory_id, value=body.value)

    @router.post("/api/memories/{memory_id}/annotate")
    def annotate(h: Writer, memory_id: str, body: NoteBody) -> dict[str, Any]:
        return act(h, "annotate", memory_id, note=body.text)

    @router.post("/api/memories/{memory_id}/tier")
    def set_tier(h: Writer, memory_id: str, body: TierBody) -> dict[str, Any]:
        return act(h, "set_tier", memory_id, tier=body.tier)

    # editing, as the Letta ADE edits blocks: every write is the SDK's (the one commit path)
    @router.post("/api/memories", status_code=201)
    def create(h: Writer, body: NewMemoryBody) -> dict[str, Any]:
        m = h.record(body.content, kind=body.kind, session_id=body.session_id, tags=body.tags)
        lens_for(h).refresh()
        return {"id": m.id, "memory": without_sealed(m).model_dump(mode="json")}

    @router.post("/api/memories/{memory_id}/revise")
    def revise(h: Writer, memory_id: str, body: ReviseBody) -> dict[str, Any]:
        head = h.revise(memory_id, expected_version=body.expected_version, content=body.content)
        lens_for(h).refresh()
        return {"id": head.id, "revises": memory_id, "memory": without_sealed(head).model_dump(mode="json")}

    @router.post("/api/memories/{memory_id}/forget")
    def forget(h: Writer, memory_id: str, body: ForgetBody | None = None) -> dict[str, Any]:
        h.forget(memory_id, expected_version=None if body is None else body.expected_version)
        lens_for(h).refresh()
        return {"id": memory_id, "forgotten": True}

    @router.post("/api/review/{memory_id}/approve")
    def approve(h: Writer, memory_id: str, body: ReviewBody) -> dict[str, Any]:
        m = h.approve(memory_id, by="dashboard", reason=body.reason)
        return {"id": m.id, "review": m.metadata.get("review")}

    @router.post("/api/conflicts/{conflict_id}/keep")
    def keep_side(h: Writer, conflict_id: str, body: KeepBody) -> dict[str, Any]:
        kept = h.resolve_conflict(conflict_id, keep=body.keep, by="dashboard")
        return {"id": conflict_id, "kept": kept.id, "review": kept.metadata.get("review")}

    @router.post("/api/review/{memory_id}/reject")
    def reject(h: Writer, memory_id: str, body: ReviewBody) -> dict[str, Any]:
        m = h.reject(memory_id, by="dashboard", reason=body.reason)
        return {"id": m.id, "review": m.metadata.get("review")}

    return router
