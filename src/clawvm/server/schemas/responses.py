"""The REST API's response bodies (pydantic v2: the edge): what each route answers, built from the
library's results with ``of``, and the one error shape (:class:`ErrorBody`) of every 4xx and 5xx."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from clawvm.core.model import Memory
from clawvm.recall.retrieval import Recalled
from clawvm.server.usage import Use
from clawvm.store import Event
from clawvm.store.crypto import without_sealed
from clawvm.store.keys import ApiKey, Permission, Principal, Role
from clawvm.vm.checkpoint import RollbackReport
from clawvm.vm.context import Context
from clawvm.vm.scoring import ValueBreakdown


def shown(principal: Principal, memory: Memory) -> Memory:
    """``memory`` as ``principal`` sees it in a response: as stored for an admin (who may read the original
    anyway), without the sealed original for every other role (:func:`without_sealed`: the envelope's
    length tells the original's)."""
    return memory if principal.can(Permission.ADMIN) else without_sealed(memory)


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable, e.g. validation_error, not_found, rate_limited")
    message: str
    field: str | None = Field(description="the offending field (dotted path), when one is to blame")
    fix: str | None = Field(description="what to do instead")


class ErrorBody(BaseModel):
    """The one error shape of every 4xx and 5xx response."""

    error: ErrorDetail


class ChannelOut(BaseModel):
    raw: float
    normalized: float
    weight: float
    rank: int


class RecallHit(BaseModel):
    id: str
    score: float
    explain: dict[str, ChannelOut]
    memory: Memory

    @classmethod
    def of(cls, hit: Recalled, principal: Principal) -> RecallHit:
        explain = {
            c: ChannelOut(raw=s.raw, normalized=s.normalized, weight=s.weight, rank=s.rank)
            for c, s in hit.explain.items()
        }
        return cls(id=hit.id, score=hit.score, explain=explain, memory=shown(principal, hit.memory))


class ManifestOut(BaseModel):
    id: str
    short_id: str
    section: str
    tier: str
    value: float
    score: float
    tokens: int
    reason: str
    created_at: str


class ContextOut(BaseModel):
    text: str
    tokens: int
    budget: int
    by_section: dict[str, int]
    manifest: list[ManifestOut]
    event_seq: int | None = Field(default=None, description="the seq of this build's context event")

    @classmethod
    def of(cls, ctx: Context) -> ContextOut:
        return cls(
            text=ctx.text,
            tokens=ctx.tokens,
            budget=ctx.budget,
            by_section=ctx.by_section,
            manifest=[ManifestOut.model_validate(e.as_dict()) for e in ctx.manifest],
            event_seq=ctx.event_seq,
        )


class EventOut(BaseModel):
    seq: int
    kind: str
    memory_id: str | None
    tenant: str
    at: datetime
    data: dict[str, Any]

    @classmethod
    def of(cls, e: Event) -> EventOut:
        return cls(seq=e.seq or 0, kind=e.kind, memory_id=e.memory_id, tenant=e.tenant, at=e.at, data=e.data)


class EventsPage(BaseModel):
    events: list[EventOut]
    next_after_seq: int = Field(description="pass as after_seq to read on")


class CheckpointOut(BaseModel):
    id: str


class CheckpointItem(BaseModel):
    """One of a session's checkpoints (``GET /v1/sessions/{id}/checkpoints``, newest first)."""

    id: str
    name: str
    taken_at: datetime
    memories: int  # how many of the session's memories its snapshot holds


class RollbackOut(BaseModel):
    checkpoint_id: str
    restored: list[str]
    obsoleted: list[str]

    @classmethod
    def of(cls, r: RollbackReport) -> RollbackOut:
        return cls(checkpoint_id=r.checkpoint_id, restored=r.restored, obsoleted=r.obsoleted)


class ValueOut(BaseModel):
    value: float
    base: float
    signals: dict[str, float]
    cost: float
    recency: float
    access: float
    injected: float
    cited: float
    success: float
    feedback: float
    pinned: bool

    @classmethod
    def of(cls, v: ValueBreakdown) -> ValueOut:
        return cls.model_validate(v.as_dict())


class TickOut(BaseModel):
    expired: int
    refreshed: int
    moved: int


class CollapseOut(BaseModel):
    summary: Memory | None


class ImportOut(BaseModel):
    imported: int
    skipped: int
    renamed: dict[str, str] = Field(
        default_factory=dict,
        description="imported ids another tenant holds -> the id of this tenant's own each is stored under "
        "(the same at every import; references between the imported memories follow)",
    )
    differing: list[str] = Field(
        default_factory=list,
        description="skipped ids whose stored content differs from the imported one's (kept as stored: an "
        "import never overwrites)",
    )


class StatsOut(BaseModel):
    memories: int
    by_status: dict[str, int]
    by_tier: dict[str, int]


class KeyOut(BaseModel):
    key_id: str
    tenant: str
    role: Role
    name: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = Field(default=None, description="null: the key does not expire")
    requests: int = Field(default=0, description="requests this server process saw with the key")
    last_used_at: datetime | None = Field(default=None, description="its last request to this process")

    @classmethod
    def of(cls, k: ApiKey, use: Use | None = None) -> KeyOut:
        return cls(
            key_id=k.key_id,
            tenant=k.tenant,
            role=k.role,
            name=k.name,
            created_at=k.created_at,
            revoked_at=k.revoked_at,
            expires_at=k.expires_at,
            requests=use.requests if use is not None else 0,
            last_used_at=use.last_used_at if use is not None else None,
        )


class KeyCreated(KeyOut):
    key: str = Field(description="the API key itself: shown this once, store it now")


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class OriginalOut(BaseModel):
    """A memory's original content, as recorded before redaction."""

    id: str
    content: str
    content_type: str
