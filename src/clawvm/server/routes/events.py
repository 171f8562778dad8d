"""What happened: the tenant's event log, paged (``/events``) or live as server-sent events
(``/events/stream``), and counts of its memories (``/stats``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from clawvm.core.model import MAX_COUNT, VISIBLE_STATUSES, Status, Tier
from clawvm.server.auth import Caller, Reader
from clawvm.server.schemas.responses import EventOut, EventsPage, StatsOut
from clawvm.server.service import Service, service_of

router = APIRouter(tags=["events"])


@router.get("/events", response_model=EventsPage)
def events(
    caller: Reader,
    after_seq: Annotated[int, Query(ge=0, le=MAX_COUNT)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    memory_id: Annotated[str | None, Query(min_length=1, max_length=100)] = None,
) -> EventsPage:
    """The tenant's event log (what happened to which memory, and why), oldest first."""
    found = caller.harness.events(after_seq=after_seq, limit=limit, memory_id=memory_id)
    last = found[-1].seq if found and found[-1].seq is not None else after_seq
    return EventsPage(events=[EventOut.of(e) for e in found], next_after_seq=last)


@router.get(
    "/events/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
)
async def event_stream(
    request: Request,
    caller: Reader,
    after_seq: Annotated[int, Query(ge=0, le=MAX_COUNT)] = 0,
    max_s: Annotated[float | None, Query(gt=0, le=86400, description="end the stream after this")] = None,
    last_event_id: Annotated[str | None, Header(pattern=r"^[0-9]{1,18}$")] = None,
) -> StreamingResponse:
    """The tenant's events as they happen, as server-sent events: each event after ``after_seq`` (or after
    the ``Last-Event-ID`` a reconnecting client sends) is one ``id: <seq>`` + ``data: <event JSON>``
    message, as in ``/v1/events``; a comment line every ~15 s keeps a quiet stream open. Events written
    by any server process on the same database arrive (PostgreSQL pushes them; other engines are polled
    every 0.5 s). The stream ends after ``max_s`` seconds, within ~1 s of the key's revocation or expiry, or
    at shutdown."""
    service = service_of(request)
    start = int(last_event_id) if last_event_id is not None else after_seq
    return StreamingResponse(
        _sse(service, caller, start, max_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},  # no proxy buffering either
    )


async def _sse(service: Service, caller: Caller, after_seq: int, max_s: float | None) -> AsyncIterator[str]:
    """The wire format of :func:`event_stream` over :meth:`EventTail.follow`. The key is rechecked every
    ``key_check_s``, whether events flow or not (a quiet stream wakes that often), so a revoked or expired
    key's stream ends within about that (plus ``keys_refresh_s`` when another process revoked it)."""
    yield "retry: 2000\n: open\n\n"  # reconnect after 2 s; the comment flushes the headers at once
    settings = service.settings
    follow = service.live.follow(
        caller.harness.events,
        after_seq,
        heartbeat_s=min(settings.heartbeat_s, settings.key_check_s),
        max_s=max_s,
    )
    loop = asyncio.get_running_loop()
    checked = beat = loop.time()
    async with aclosing(follow) as batches:
        async for batch in batches:
            now = loop.time()
            if now - checked >= settings.key_check_s:
                checked = now
                if not await asyncio.to_thread(service.key_active, caller.principal):
                    return
            if batch:
                beat = now
                yield "".join(f"id: {e.seq}\ndata: {EventOut.of(e).model_dump_json()}\n\n" for e in batch)
            elif now - beat >= settings.heartbeat_s:
                beat = now
                yield ": heartbeat\n\n"


@router.get("/stats", response_model=StatsOut)
def stats(caller: Reader) -> StatsOut:
    # one grouped count: counts read one by one each saw another moment while others wrote, and disagreed
    groups = caller.harness.group_counts(status="any")
    by_status = {s.value: 0 for s in Status if s in VISIBLE_STATUSES}  # not INTERNAL
    by_tier = {t.value: 0 for t in Tier}
    for key, n in groups.items():
        by_status[key.status] += n
        by_tier[key.tier] += n
    return StatsOut(memories=sum(groups.values()), by_status=by_status, by_tier=by_tier)
