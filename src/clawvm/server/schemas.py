"""The REST API's request and response bodies (pydantic v2: the edge), used by :mod:`clawvm.server.app`.

Requests forbid unknown fields, bound every list and string (so a request cannot ask the library for
unbounded work), type every enum (an unknown value is a 422 naming the field), reject strings that are
not valid UTF-8 (lone surrogates written as JSON escapes) and JSON nested deeper than 64 levels. The
other rules (content size, ids of links, JSON metadata) stay in the library, which reports them as
:class:`clawvm.ValidationError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)

from clawvm.core.model import MAX_JSON_DEPTH, Cost, Kind, Link, Memory, State, Status, Tier, as_utc
from clawvm.recall.retrieval import PRESETS, Recalled
from clawvm.store import Event
from clawvm.store.keys import ApiKey, Role
from clawvm.vm.checkpoint import RollbackReport
from clawvm.vm.context import Context
from clawvm.vm.scoring import ValueBreakdown

MAX_TAGS = 64
MAX_LINKS = 256
MAX_QUERY_CHARS = 10_000
MAX_IMPORT = 1000
MAX_EMBEDDING_DIM = 4096


def _storable_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as sent: a string that is not UTF-8, or JSON nested deeper than
    :data:`MAX_JSON_DEPTH` (deeper values pass the JSON parser but break serialization further on).
    Iterative: the value may be nested as deep as the parser allowed."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "contains unpaired surrogates (not valid UTF-8)"
        elif isinstance(v, Mapping | list | tuple | BaseModel):
            if depth >= MAX_JSON_DEPTH:
                return f"is nested deeper than {MAX_JSON_DEPTH} levels"
            if isinstance(v, Mapping):
                items: Iterable[Any] = [*v.keys(), *v.values()]
            elif isinstance(v, BaseModel):
                items = v.__dict__.values()
            else:
                items = v
            stack.extend((x, depth + 1) for x in items)
    return None


def _payload(v: Any) -> Any:
    if not isinstance(v, str | dict | list):
        raise ValueError(f"has type {type(v).__name__}: pass a string, a JSON object or a JSON array")
    return v


UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]
# one field, not a union: a bad value is reported as "content" (a union would name each of its branches)
Content = Annotated[
    Any,
    AfterValidator(_payload),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}]}),
]
Ident = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Query = Annotated[str, StringConstraints(max_length=MAX_QUERY_CHARS)]


class RequestBody(BaseModel):
    """Base of every request: unknown fields are errors; strings must be encodable as UTF-8."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, v: Any) -> Any:
        problem = _storable_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


class FilterSpec(RequestBody):
    """Which memories: every given field must match (lists mean "one of"; ``tags`` means "all of").

    ``status`` defaults to active memories only; list every status to see them all.
    """

    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    tool_name: Ident | None = None
    kind: list[Kind] | None = Field(default=None, min_length=1, max_length=len(Kind))
    state: list[State] | None = Field(default=None, min_length=1, max_length=len(State))
    status: list[Status] | None = Field(default=None, min_length=1, max_length=len(Status))
    tier: list[Tier] | None = Field(default=None, min_length=1, max_length=len(Tier))
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    tags_any: list[Tag] | None = Field(default=None, min_length=1, max_length=MAX_TAGS)
    parent_id: Ident | None = None
    pinned: bool | None = None
    created_after: UtcDatetime | None = None
    created_before: UtcDatetime | None = None

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword filters for :meth:`clawvm.Harness.recall` / ``list``."""
        given = self.model_fields_set
        return {
            name: getattr(self, name)
            for name in FilterSpec.model_fields
            if name in given and getattr(self, name) is not None
        }


class ListQuery(FilterSpec):
    limit: int = Field(default=100, ge=1, le=1000)


class RecordRequest(RequestBody):
    """A new memory. ``content``: text, or a JSON object/array (stored as canonical JSON)."""

    content: Content
    kind: Kind = Kind.NOTE
    state: State | None = None
    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    tool_name: Ident | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    parent_id: Ident | None = None
    links: list[Link] = Field(default_factory=list, max_length=MAX_LINKS)
    pinned: bool = False
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    expires_at: UtcDatetime | None = None
    cost: Cost | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    embedding: list[Annotated[float, Field(ge=-1e6, le=1e6)]] | None = Field(
        None, min_length=1, max_length=MAX_EMBEDDING_DIM, description="precomputed vector (else embedded)"
    )

    def fields(self) -> dict[str, Any]:
        """The memory fields the caller set, for :meth:`clawvm.Harness.record`."""
        return {name: getattr(self, name) for name in self.model_fields_set - {"content", "embedding"}}


class UpdateRequest(RequestBody):
    """Fields to change (only those sent). With ``expected_version``, a stale version is a 409."""

    expected_version: int | None = Field(default=None, ge=1, le=2**62)
    content: Content = None
    kind: Kind | None = None
    state: State | None = None
    status: Status | None = None
    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    tool_name: Ident | None = None
    tags: list[Tag] | None = Field(default=None, max_length=MAX_TAGS)
    parent_id: Ident | None = None
    links: list[Link] | None = Field(default=None, max_length=MAX_LINKS)
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    expires_at: UtcDatetime | None = None
    metadata: dict[str, Any] | None = None

    def changes(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.model_fields_set - {"expected_version"}}


def _known_preset(name: str | None) -> str | None:
    if name is not None and name not in PRESETS:
        raise ValueError(f"unknown recall preset {name!r}: use one of {sorted(PRESETS)}")
    return name


class RecallRequest(RequestBody):
    """Hybrid recall. ``track`` (default: true, but false for read-only keys) counts hits as accessed."""

    query: Query
    k: int = Field(default=10, ge=1, le=200)
    preset: Annotated[str | None, AfterValidator(_known_preset)] = None
    track: bool | None = None
    filters: FilterSpec = Field(default_factory=lambda: FilterSpec())


class ContextRequest(RequestBody):
    """A prompt-ready context under ``budget_tokens``. ``record_usage`` defaults like recall's ``track``."""

    query: Query = ""
    budget_tokens: int = Field(default=2000, ge=1, le=100_000)
    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    k: int | None = Field(default=None, ge=1, le=1000)
    neighbours: int = Field(default=8, ge=0, le=100)
    record_usage: bool | None = None


class FeedbackRequest(RequestBody):
    delta: Literal[1, -1] = Field(description="+1: useful, -1: not useful")


class CheckpointRequest(RequestBody):
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]


class StartSessionRequest(RequestBody):
    task: Query | None = None
    task_id: Ident | None = None
    k: int = Field(default=8, ge=1, le=100)


class ImportRequest(RequestBody):
    """Exported memories, stored as they are; a memory without ``tenant`` gets the caller's."""

    memories: list[Memory] = Field(max_length=MAX_IMPORT)


class KeyRequest(RequestBody):
    role: Role = Role.AGENT
    name: Annotated[str, StringConstraints(max_length=200)] = ""


# ---- responses ------------------------------------------------------------------------------------------
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
    def of(cls, hit: Recalled) -> RecallHit:
        explain = {
            c: ChannelOut(raw=s.raw, normalized=s.normalized, weight=s.weight, rank=s.rank)
            for c, s in hit.explain.items()
        }
        return cls(id=hit.id, score=hit.score, explain=explain, memory=hit.memory)


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

    @classmethod
    def of(cls, k: ApiKey) -> KeyOut:
        return cls(
            key_id=k.key_id,
            tenant=k.tenant,
            role=k.role,
            name=k.name,
            created_at=k.created_at,
            revoked_at=k.revoked_at,
        )


class KeyCreated(KeyOut):
    key: str = Field(description="the API key itself: shown this once, store it now")


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
