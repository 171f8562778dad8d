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
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from clawvm.core.model import NON_BLANK
from clawvm.dashboard import views
from clawvm.harness import Harness
from clawvm.observe.learning import intervene, weights_of
from clawvm.observe.lens import Lens

STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

_lenses: weakref.WeakKeyDictionary[Harness, Lens] = weakref.WeakKeyDictionary()
_lenses_lock = threading.Lock()


def lens_for(harness: Harness) -> Lens:
    """One :class:`Lens` per open harness, built on first use and then kept up to date incrementally."""
    with _lenses_lock:
        lens = _lenses.get(harness)
        if lens is None:
            lens = _lenses[harness] = Lens(harness)
        return lens


class ValueBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # a number, not "0.5" (as the spec says)
    value: float = Field(ge=0.0, le=1.0)


class NoteBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(min_length=1, max_length=2000, pattern=NON_BLANK)


def _static(name: str) -> Response:
    body = resources.files(__package__).joinpath(name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})


def create_router(
    read: Callable[..., Harness], write: Callable[..., Harness] | None = None, prefix: str = "/dashboard"
) -> APIRouter:
    """The dashboard router; ``read``/``write`` are dependencies giving the caller's harness."""
    router = APIRouter(prefix=prefix, tags=["dashboard"])
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
    def sessions(h: Reader, offset: Offset = 0, limit: Limit = 50, q: str = "") -> dict[str, Any]:
        return views.sessions(lens_for(h), offset, limit, q)

    @router.get("/api/memories")
    def memories(
        h: Reader,
        session: Session = None,
        q: str = "",
        tier: str | None = None,
        kind: str | None = None,
        sort: str = "newest",
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> dict[str, Any]:
        return views.memories(lens_for(h), session, q, tier, kind, sort, offset, limit)

    @router.get("/api/memories/{memory_id}")
    def memory(h: Reader, memory_id: str) -> dict[str, Any]:
        return views.memory_detail(lens_for(h), memory_id)

    @router.get("/api/timeline")
    def timeline(
        h: Reader,
        session: Session = None,
        buckets: Annotated[int, Query(ge=2, le=400)] = 60,
        limit: Limit = 50,
        axis: Annotated[str, Query(pattern="^(events|time)$")] = "events",
    ) -> dict[str, Any]:
        return views.timeline(lens_for(h), session, buckets, limit, axis)

    @router.get("/api/heatmap")
    def heatmap(
        h: Reader,
        session: Session = None,
        group: Annotated[str, Query(pattern="^(memory|kind)$")] = "memory",
        cols: Annotated[int, Query(ge=2, le=200)] = 40,
        offset: Offset = 0,
        limit: Limit = 40,
    ) -> dict[str, Any]:
        return views.heatmap(lens_for(h), session, group, cols, offset, limit)

    @router.get("/api/graph")
    def graph(
        h: Reader, session: Session = None, focus: str | None = None, limit: Limit = 120, offset: Offset = 0
    ) -> dict[str, Any]:
        return views.graph(lens_for(h), session, focus, limit, offset)

    @router.get("/api/contexts")
    def contexts(h: Reader, session: Session = None, offset: Offset = 0, limit: Limit = 50) -> dict[str, Any]:
        return views.contexts(lens_for(h), session, offset, limit)

    @router.get("/api/contexts/{seq}")
    def context(h: Reader, seq: int) -> dict[str, Any]:
        return lens_for(h).influence(seq)

    @router.get("/api/memories/{memory_id}/contexts")
    def contexts_of(h: Reader, memory_id: str) -> list[dict[str, Any]]:
        return lens_for(h).contexts_of(memory_id)

    @router.get("/api/metrics")
    def metrics(h: Reader) -> dict[str, Any]:
        return lens_for(h).metrics()

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

    return router
