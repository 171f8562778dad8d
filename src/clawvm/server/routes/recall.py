"""Reading by meaning: ``/recall`` (the best memories for a query, with each channel's part of the score)
and ``/context`` (a prompt-ready context under a token budget). Both record usage for writer keys; for a
read-only key they write nothing (a context build appends no ``context`` event: the access log line is its
only trace)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import TypeAdapter

from clawvm.server.auth import Reader, records_usage
from clawvm.server.schemas.requests import ContextRequest, RecallRequest
from clawvm.server.schemas.responses import ContextOut, RecallHit
from clawvm.store.keys import Permission

router = APIRouter(tags=["recall"])

# the hits are serialized straight to JSON bytes: FastAPI would validate the list against the response
# model again, turn it into Python objects, then encode those (a third of the HTTP overhead of a recall)
_HITS = TypeAdapter(list[RecallHit])


@router.post("/recall", response_model=list[RecallHit])
def recall(body: RecallRequest, caller: Reader) -> Response:
    """The ``k`` best memories for ``query``, with each channel's part of the score."""
    hits = caller.harness.recall(
        body.query,
        k=body.k,
        preset=body.preset,
        track=records_usage(body.track, caller),
        **body.filters.as_kwargs(),
    )
    return Response(
        _HITS.dump_json([RecallHit.of(h, caller.principal) for h in hits]), media_type="application/json"
    )


@router.post("/context", response_model=ContextOut)
def context(body: ContextRequest, caller: Reader) -> ContextOut:
    """A prompt-ready context under a token budget, with the manifest of every line."""
    ctx = caller.harness.context(
        body.query,
        budget_tokens=body.budget_tokens,
        session_id=body.session_id,
        task_id=body.task_id,
        agent_id=body.agent_id,
        k=body.k,
        neighbours=body.neighbours,
        record_usage=records_usage(body.record_usage, caller),
        read_only=not caller.principal.can(Permission.WRITE),
    )
    return ContextOut.of(ctx)
