"""A session's and a task's lifecycle: checkpoints and rollback, preloading the working tier, collapsing a
finished task, and the pager's pass (``/tick``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from clawvm.core.model import Memory
from clawvm.server.auth import Reader, Writer
from clawvm.server.idempotency import REPLAYED_RESPONSES, IdempotencyKey, once
from clawvm.server.routes.params import MemoryId, ScopeId
from clawvm.server.schemas.requests import CheckpointRequest, StartSessionRequest
from clawvm.server.schemas.responses import (
    CheckpointItem,
    CheckpointOut,
    CollapseOut,
    RollbackOut,
    TickOut,
    shown,
)
from clawvm.server.service import service_of

router = APIRouter(tags=["sessions"])


@router.post(
    "/sessions/{session_id:path}/checkpoints",
    status_code=201,
    response_model=CheckpointOut,
    responses=REPLAYED_RESPONSES,
)
def checkpoint(
    request: Request,
    session_id: ScopeId,
    body: CheckpointRequest,
    caller: Writer,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Snapshot the session's tiers and value state. With an ``Idempotency-Key``, a retry of the same request
    returns the first checkpoint and takes no other."""
    return once(
        service_of(request).idempotency,
        caller.principal.tenant,
        idempotency_key,
        f"POST /v1/sessions/{session_id}/checkpoints",
        body,
        201,
        lambda: CheckpointOut(id=caller.harness.checkpoint(session_id, body.name)),
    )


@router.get("/sessions/{session_id:path}/checkpoints", response_model=list[CheckpointItem])
def list_checkpoints(session_id: ScopeId, caller: Reader) -> list[CheckpointItem]:
    """The session's checkpoints, newest first: what ``POST /v1/checkpoints/{id}/rollback`` takes."""
    return [
        CheckpointItem(id=c.id, name=c.name, taken_at=c.taken_at, memories=c.memories)
        for c in caller.harness.checkpoints(session_id)
    ]


@router.post("/checkpoints/{checkpoint_id}/rollback", response_model=RollbackOut)
def rollback(checkpoint_id: MemoryId, caller: Writer) -> RollbackOut:
    """Restore a checkpoint; memories created after it become obsolete (not deleted)."""
    return RollbackOut.of(caller.harness.rollback(checkpoint_id))


@router.post("/sessions/{session_id:path}/start", response_model=list[Memory])
def start_session(session_id: ScopeId, body: StartSessionRequest, caller: Writer) -> list[Memory]:
    """Preload the working tier with the memories most relevant to ``task``."""
    loaded = caller.harness.start_session(session_id, body.task, task_id=body.task_id, k=body.k)
    return [shown(caller.principal, m) for m in loaded]


@router.post("/tasks/{task_id:path}/collapse", response_model=CollapseOut)
def collapse(task_id: ScopeId, caller: Writer) -> CollapseOut:
    """Compress a finished task's intermediate steps into one summary linked to them."""
    summary = caller.harness.collapse_task(task_id)
    return CollapseOut(summary=None if summary is None else shown(caller.principal, summary))


@router.post("/tick", response_model=TickOut)
def tick(caller: Writer) -> TickOut:
    """Pager pass: expire TTLs, refresh values, page idle sessions out."""
    return TickOut.model_validate(caller.harness.tick())
