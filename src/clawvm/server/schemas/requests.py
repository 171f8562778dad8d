"""The REST API's request bodies (pydantic v2: the edge), read by :mod:`clawvm.server.routes`.

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
from clawvm.recall.retrieval import PRESETS
from clawvm.store.keys import Role

MAX_TAGS = 64
MAX_LINKS = 256
MAX_QUERY_CHARS = 10_000
MAX_IMPORT = 1000
MAX_EMBEDDING_DIM = 4096
MAX_KEY_TTL_S = 10 * 366 * 86400.0  # ten years: past it, mint a key that does not expire


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
    """A new key. ``expires_at`` or ``ttl_s`` (not both): when it stops working (401 ``key_expired``)."""

    role: Role = Role.AGENT
    name: Annotated[str, StringConstraints(max_length=200)] = ""
    expires_at: UtcDatetime | None = None
    ttl_s: float | None = Field(default=None, gt=0, le=MAX_KEY_TTL_S, description="seconds from now")
