"""One memory at a time (record, get, update, forget, pin, feedback, value, compress, its original) and
all of them (list with filters, import, export as JSON Lines)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from clawvm.core.errors import ConflictError, StateConflictError
from clawvm.core.model import Memory, moved_on
from clawvm.harness import Harness
from clawvm.server.auth import Admin, Reader, Writer
from clawvm.server.idempotency import REPLAYED_RESPONSES, Found, IdempotencyKey, keyed_id, once
from clawvm.server.routes.params import ExpectedVersion, MemoryId
from clawvm.server.schemas.requests import (
    CURSOR_PATTERN,
    ExportQuery,
    FeedbackRequest,
    ImportRequest,
    ListQuery,
    RecordRequest,
    UpdateRequest,
    cursor_of,
)
from clawvm.server.schemas.responses import ImportOut, OriginalOut, ValueOut, shown
from clawvm.server.service import service_of

router = APIRouter(tags=["memories"])


@router.post("/memories", status_code=201, response_model=Memory, responses=REPLAYED_RESPONSES)
def record(
    request: Request, body: RecordRequest, caller: Writer, idempotency_key: IdempotencyKey = None
) -> Response:
    """Record a new memory (lexically searchable at once, embedded in the background). With an
    ``Idempotency-Key``, a retry of the same body returns the first response and records nothing more."""
    route, tenant = "POST /v1/memories", caller.principal.tenant

    def run() -> Memory | Found:
        fields = body.fields()
        if idempotency_key is not None:
            fields["id"] = keyed_id(tenant, idempotency_key, route, body)
            refuse_recorded_and_forgotten(caller.harness, fields["id"])
        try:
            recorded = caller.harness.record(body.content, embedding=body.embedding, **fields)
        except ConflictError:
            if idempotency_key is None:
                raise
            # recorded already under this key and body, by another worker or before a restart: that one,
            # answered as the replay it is
            return Found(shown(caller.principal, caller.harness.get(fields["id"])))
        return shown(caller.principal, recorded)

    return once(service_of(request).idempotency, tenant, idempotency_key, route, body, 201, run)


def refuse_recorded_and_forgotten(harness: Harness, memory_id: str) -> None:
    """A retry whose key recorded a memory that was forgotten since (its events say it existed): recorded
    again, the retry brought back what a client deleted. (A key this process still holds replays the first
    answer before this is asked; this is a retry that reached another worker, or came after a restart.)"""
    if harness.store.get_many([memory_id]) or not harness.store.read_events(0, 1, memory_id=memory_id):
        return
    raise StateConflictError(
        "Idempotency-Key",
        f"recorded memory {memory_id}, which was forgotten since",
        "send a new Idempotency-Key to record it again",
    )


@router.get(
    "/memories",
    response_model=list[Memory],
    responses={
        200: {
            "headers": {
                "X-Next-Cursor": {
                    "description": "on a full page: pass it as after= for the next page",
                    "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                }
            }
        }
    },
)
def list_memories(query: Annotated[ListQuery, Query()], caller: Reader, response: Response) -> list[Memory]:
    """The newest memories matching the filters (active ones unless ``status`` says otherwise), a page of
    ``limit``; a full page answers ``X-Next-Cursor``, which ``after`` takes for the next page (a keyset
    position: memories written between pages neither repeat nor are skipped, and a memory forgotten since
    does not break the paging)."""
    found = caller.harness.list_page(limit=query.limit, after=query.position(), **query.as_kwargs())
    if len(found) == query.limit:
        response.headers["X-Next-Cursor"] = cursor_of(found[-1])
    return [shown(caller.principal, m) for m in found]


@router.post("/memories/import", response_model=ImportOut)
def import_memories(body: ImportRequest, caller: Admin) -> ImportOut:
    """Store exported memories as they are (ids already present are skipped). An id another tenant holds
    is stored under an id of the caller's tenant instead, the same at every import (``renamed``)."""
    own = {"tenant": caller.principal.tenant}
    memories = [m if "tenant" in m.model_fields_set else m.model_copy(update=own) for m in body.memories]
    done = caller.harness.import_renamed(memories)
    return ImportOut(
        imported=done.imported,
        skipped=len(memories) - done.imported,
        renamed=done.renamed,
        differing=done.differing,
    )


@router.get("/memories/{memory_id}", response_model=Memory)
def get_memory(memory_id: MemoryId, caller: Reader) -> Memory:
    return shown(caller.principal, caller.harness.get(memory_id))


@router.patch("/memories/{memory_id}", response_model=Memory)
def update_memory(memory_id: MemoryId, body: UpdateRequest, caller: Writer) -> Memory:
    """Change fields; the version grows by one. A stale ``expected_version`` is a 409. A body that changes
    nothing answers the memory as it is."""
    changes = body.changes()
    if not changes:
        current = caller.harness.get(memory_id)
        if body.expected_version is not None and moved_on(current, body.expected_version):
            raise ConflictError(memory_id, body.expected_version, current.version)
        return shown(caller.principal, current)
    updated = caller.harness.update(memory_id, expected_version=body.expected_version, **changes)
    return shown(caller.principal, updated)


@router.delete("/memories/{memory_id}", status_code=204)
def forget_memory(memory_id: MemoryId, caller: Writer, expected_version: ExpectedVersion = None) -> Response:
    """Delete a memory for good. With ``expected_version`` (the version you read), a memory that has moved
    on since is kept: 409, as for a PATCH."""
    caller.harness.forget(memory_id, expected_version=expected_version)
    return Response(status_code=204)


@router.get("/memories/{memory_id}/original", response_model=OriginalOut)
def reveal_original(memory_id: MemoryId, caller: Admin) -> OriginalOut:
    """The original of a memory stored redacted, opened with the server's data key (admin keys only: others
    get 403). Each reveal is logged as a ``reveal`` event. 404 when no original was kept (the server does
    not run with ``--keep-originals``, or the memory was recorded before); a memory with nothing redacted
    answers its content."""
    original = caller.harness.reveal(memory_id, admin=True)
    content_type = caller.harness.get(memory_id).content_type
    return OriginalOut(id=memory_id, content=original, content_type=content_type)


@router.post("/memories/{memory_id}/pin", response_model=Memory)
def pin(memory_id: MemoryId, caller: Writer) -> Memory:
    return shown(caller.principal, caller.harness.pin(memory_id))


@router.post("/memories/{memory_id}/unpin", response_model=Memory)
def unpin(memory_id: MemoryId, caller: Writer) -> Memory:
    return shown(caller.principal, caller.harness.unpin(memory_id))


@router.post("/memories/{memory_id}/feedback", response_model=Memory)
def feedback(memory_id: MemoryId, body: FeedbackRequest, caller: Writer) -> Memory:
    """User feedback (+1 useful / -1 not useful); feeds the value score."""
    return shown(caller.principal, caller.harness.rate(memory_id, body.delta))


@router.get("/memories/{memory_id}/value", response_model=ValueOut)
def value(memory_id: MemoryId, caller: Reader) -> ValueOut:
    """Every component of the memory's value score right now."""
    return ValueOut.of(caller.harness.explain(memory_id))


@router.post("/memories/{memory_id}/compress", response_model=Memory)
def compress(memory_id: MemoryId, caller: Writer) -> Memory:
    return shown(caller.principal, caller.harness.compress(memory_id))


@router.post("/memories/{memory_id}/decompress", response_model=Memory)
def decompress(memory_id: MemoryId, caller: Writer) -> Memory:
    return shown(caller.principal, caller.harness.decompress(memory_id))


@router.get(
    "/export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "one memory per line"}},
)
def export(query: Annotated[ExportQuery, Query()], caller: Reader) -> StreamingResponse:
    """Every memory of the tenant as JSON Lines, exactly as stored, oldest first (sealed originals only in an
    admin's export: the backup an import takes whole); the filters of ``GET /v1/memories`` narrow it
    (every status unless ``status`` says otherwise). The harness's internal records (team grants, learned
    weights) are left out: they are permissions and bookkeeping, not memories, and an import refuses them
    (grant again on the target)."""
    memories = caller.harness.iter_all(**{"status": "any", **query.as_kwargs()})
    lines: Iterator[str] = (shown(caller.principal, m).to_json() + "\n" for m in memories)
    return StreamingResponse(lines, media_type="application/x-ndjson")
