"""The REST API's request bodies (pydantic v2: the edge), read by :mod:`clawvm.server.routes`.

Requests forbid unknown fields, bound every list and string (so a request cannot ask the library for
unbounded work), type every enum (an unknown value is a 422 naming the field), reject strings that are
not valid UTF-8 (lone surrogates written as JSON escapes) and JSON nested deeper than 64 levels. The
other rules (content size, ids of links, JSON metadata) stay in the library, which reports them as
:class:`clawvm.ValidationError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)

from clawvm.core.ids import ID_PATTERN
from clawvm.core.model import (
    MAX_COUNT,
    MAX_JSON_DEPTH,
    MAX_SCOPE_ID_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    NON_BLANK,
    STATUS_CHOICES,
    VISIBLE,
    Cost,
    Kind,
    Link,
    Memory,
    Scope,
    State,
    Status,
    Tier,
    as_utc,
    describe_pattern,
    iso_datetime,
)
from clawvm.recall.retrieval import PRESETS
from clawvm.store.base import PageKey
from clawvm.store.keys import MAX_KEY_TTL_S, Role
from clawvm.vm.checkpoint import CHECKPOINT_NAME_MAX, CHECKPOINT_NAME_PATTERN

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


def _json_integer(v: Any) -> Any:
    """An integer is a JSON number without a fraction (1 or 1.0, as JSON Schema has it), never text or a
    boolean."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"has type {type(v).__name__}: pass an integer")
    return v


# Bodies are strict (a bool is true/false, a number is a JSON number, as the spec says); the kinds a JSON
# body can only spell as text are read from their text: enums by value, datetimes in ISO 8601.
UtcDatetime = Annotated[datetime, Strict(False), BeforeValidator(iso_datetime), AfterValidator(as_utc)]
KindName = Annotated[Kind, Strict(False)]
StateName = Annotated[State, Strict(False)]
TierName = Annotated[Tier, Strict(False)]
RoleName = Annotated[Role, Strict(False)]
# internal is the harness's own records' status (team grants), expired the end of a TTL (a memory expires
# by its expires_at): no request may set either
_UNWRITABLE = (Status.INTERNAL, Status.EXPIRED)
WritableStatus = Annotated[
    Status, Strict(False), WithJsonSchema({"enum": [s.value for s in Status if s not in _UNWRITABLE]})
]
# what a filter may ask for: a status callers see, or "any" (all of those), as the SDK takes them
_STATUS_FILTERS = list(STATUS_CHOICES)


def _status_filter(v: str) -> str:
    if v not in _STATUS_FILTERS:
        raise ValueError(f"should be one of {', '.join(repr(x) for x in _STATUS_FILTERS)}")
    return v


StatusFilter = Annotated[str, AfterValidator(_status_filter), WithJsonSchema({"enum": _STATUS_FILTERS})]
_INTEGER = (Strict(False), BeforeValidator(_json_integer))
Integer = Annotated[int, *_INTEGER]
# one field, not a union: a bad value is reported as "content" (a union would name each of its branches)
Content = Annotated[
    Any,
    AfterValidator(_payload),
    WithJsonSchema(
        {"anyOf": [{"type": "string", "pattern": VISIBLE}, {"type": "object"}, {"type": "array"}]}
    ),
]
Ident = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_SCOPE_ID_CHARS, pattern=NON_BLANK),
]  # blank: no scope at all
Tag = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_TAG_CHARS, pattern=NON_BLANK),
]
MemoryRef = Annotated[str, StringConstraints(pattern=ID_PATTERN)]  # a memory id (parent_id)
Query = Annotated[str, StringConstraints(max_length=MAX_QUERY_CHARS)]


class RequestBody(BaseModel):
    """Base of every request: unknown fields are errors; types are strict (no "1" for 1, no 0 for false);
    strings must be encodable as UTF-8."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, v: Any) -> Any:
        problem = _storable_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


class FilterSpec(RequestBody):
    """Which memories: every given field must match (lists mean "one of"; ``tags`` means "all of").

    ``status`` defaults to active memories only; ``any`` (or every status listed) asks for them all.
    """

    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    tool_name: Ident | None = None
    kind: list[KindName] | None = Field(default=None, min_length=1, max_length=len(Kind))
    state: list[StateName] | None = Field(default=None, min_length=1, max_length=len(State))
    status: list[StatusFilter] | None = Field(default=None, min_length=1, max_length=len(_STATUS_FILTERS))
    tier: list[TierName] | None = Field(default=None, min_length=1, max_length=len(Tier))
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    tags_any: list[Tag] | None = Field(default=None, min_length=1, max_length=MAX_TAGS)
    parent_id: Ident | None = None
    pinned: bool | None = None
    created_after: UtcDatetime | None = None
    created_before: UtcDatetime | None = None

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword filters for :meth:`clawvm.Harness.recall` / ``list``."""
        given = self.model_fields_set
        out = {
            name: getattr(self, name)
            for name in FilterSpec.model_fields
            if name in given and getattr(self, name) is not None
        }
        if "any" in out.get("status", ()):
            out["status"] = "any"
        return out


class ExportQuery(FilterSpec):
    """The filters as query parameters: those come as text, so they are read laxly ("true", "10")."""

    model_config = ConfigDict(strict=False)


#: A list page's position: the microseconds since the epoch of its last memory's creation, "~", its id
#: (every string of this shape is a position: one of a memory forgotten since still pages on)
CURSOR_PATTERN = r"^-?[0-9]{1,17}~" + ID_PATTERN.removeprefix("^")
describe_pattern(
    CURSOR_PATTERN,
    "is not a page position",
    "pass the X-Next-Cursor header of the page before as it was, or leave after out for the first page",
)


class ListQuery(ExportQuery):
    limit: int = Field(default=100, ge=1, le=1000)
    after: Annotated[str, StringConstraints(pattern=CURSOR_PATTERN)] | None = Field(
        default=None, description="the X-Next-Cursor of the page before: the next page"
    )

    def position(self) -> PageKey | None:
        """The keyset position ``after`` names (:func:`cursor_of` made it)."""
        if self.after is None:
            return None
        micros, memory_id = self.after.split("~", 1)
        try:
            at = _EPOCH + timedelta(microseconds=int(micros))
        except OverflowError:  # past the calendar's years: before (after) every memory
            at = (datetime.min if micros.startswith("-") else datetime.max).replace(tzinfo=UTC)
        return PageKey(at, memory_id)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def cursor_of(memory: Memory) -> str:
    """The ``after`` of the page that follows the one ``memory`` ends."""
    return f"{(memory.created_at - _EPOCH) // timedelta(microseconds=1)}~{memory.id}"


class RecordRequest(RequestBody):
    """A new memory. ``content``: text, or a JSON object/array (stored as canonical JSON)."""

    content: Content
    kind: KindName = Kind.NOTE
    state: StateName | None = None
    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    tool_name: Ident | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    parent_id: MemoryRef | None = None
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
        sent = self.model_fields_set - {"content", "embedding"}
        return {name: getattr(self, name) for name in sent if name != "cost" or self.cost is not None}


_NULLABLE_MEMORY_FIELDS = frozenset(
    {"state", "session_id", "task_id", "agent_id", "tool_name", "parent_id", "expires_at"}
)


class UpdateRequest(RequestBody):
    """Fields to change (only those sent). With ``expected_version``, a stale version is a 409."""

    # MAX_COUNT (2**53 - 1): the highest version a memory may have, and exact as a float (a JSON Schema
    # validator may compare in floats)
    expected_version: Annotated[int, Field(ge=1, le=MAX_COUNT), *_INTEGER] | None = None
    content: Content | None = None  # null, as for kind: the content stays as it is
    kind: KindName | None = None
    state: StateName | None = None
    status: WritableStatus | None = None
    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    tool_name: Ident | None = None
    tags: list[Tag] | None = Field(default=None, max_length=MAX_TAGS)
    parent_id: MemoryRef | None = None
    links: list[Link] | None = Field(default=None, max_length=MAX_LINKS)
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    expires_at: UtcDatetime | None = None
    metadata: dict[str, Any] | None = None

    def changes(self) -> dict[str, Any]:
        """The fields sent, but a null where a memory cannot hold one (its content, kind, status, tags,
        links, confidence, metadata): that null leaves the field as it is."""
        sent = self.model_fields_set - {"expected_version"}
        return {
            name: getattr(self, name)
            for name in sent
            if getattr(self, name) is not None or name in _NULLABLE_MEMORY_FIELDS
        }


def _known_preset(name: str | None) -> str | None:
    if name is not None and name not in PRESETS:
        raise ValueError(f"unknown recall preset {name!r}: use one of {sorted(PRESETS)}")
    return name


class RecallRequest(RequestBody):
    """Hybrid recall. ``track`` (default: true, but false for read-only keys) counts hits as accessed."""

    query: Query
    k: Integer = Field(default=10, ge=1, le=200)
    preset: Annotated[
        str | None,
        AfterValidator(_known_preset),
        WithJsonSchema({"anyOf": [{"enum": sorted(PRESETS)}, {"type": "null"}]}),
    ] = None
    track: bool | None = None
    filters: FilterSpec = Field(default_factory=lambda: FilterSpec())


class ContextRequest(RequestBody):
    """A prompt-ready context under ``budget_tokens``. ``record_usage`` defaults like recall's ``track``."""

    query: Query = ""
    budget_tokens: Integer = Field(default=2000, ge=1, le=100_000)
    session_id: Ident | None = None
    task_id: Ident | None = None
    agent_id: Ident | None = None
    k: Annotated[int, Field(ge=1, le=1000), *_INTEGER] | None = None
    neighbours: Integer = Field(default=8, ge=0, le=100)
    record_usage: bool | None = None


class FeedbackRequest(RequestBody):
    delta: Literal[1, -1] = Field(description="+1: useful, -1: not useful")

    @field_validator("delta", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        if isinstance(v, bool):  # a Literal takes True for 1: the spec says a number
            raise ValueError("is a boolean: pass 1 or -1")
        return v


class CheckpointRequest(RequestBody):
    name: Annotated[
        str, StringConstraints(min_length=1, max_length=CHECKPOINT_NAME_MAX, pattern=CHECKPOINT_NAME_PATTERN)
    ]


class StartSessionRequest(RequestBody):
    task: Query | None = None
    task_id: Ident | None = None
    k: Integer = Field(default=8, ge=1, le=100)


def _import_rules(schema: dict[str, Any]) -> None:
    """What an import checks beyond the memory's fields, stated in its schema: no ``internal`` status
    (the harness's own records), a scoped memory names what its scope needs, and a pinned one is working
    and active."""
    schema["properties"]["status"] = {"enum": [s.value for s in Status if s is not Status.INTERNAL]}
    needs = {Scope.PRIVATE: "agent_id", Scope.TEAM: "team_id", Scope.TASK: "task_id"}
    schema["allOf"] = [
        {
            "if": {"properties": {"scope": {"const": scope.value}}, "required": ["scope"]},
            "then": {"properties": {field: {"type": "string"}}, "required": [field]},
        }
        for scope, field in needs.items()
    ]
    # a pinned memory is working and active (what pin() makes it); its session's budget is the store's
    # state, a 409 when full
    schema["allOf"].append(
        {
            "if": {"properties": {"pinned": {"const": True}}, "required": ["pinned"]},
            "then": {
                "properties": {
                    "tier": {"const": Tier.WORKING.value},
                    "status": {"const": Status.ACTIVE.value},
                },
                "required": ["tier"],
            },
        }
    )


_IMPORTED_NUMBERS = ("version", "changed_version", "access_count", "token_count", "value", "confidence")
_IMPORTED_DATETIMES = ("created_at", "expires_at", "last_accessed_at")


class ImportedMemory(Memory):
    """A memory as an import takes it: :class:`Memory`, with the import's own rules in its schema."""

    model_config = ConfigDict(json_schema_extra=_import_rules)

    # JSON types as the schema states them: the memory model, lax for Python callers, took true as 1, "5"
    # as 5, 0 as a date and 1 as pinned (every other request body is strict)
    @field_validator(*_IMPORTED_NUMBERS, mode="before")
    @classmethod
    def _json_numbers(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float | None):
            raise ValueError("is not a number: pass a JSON number")
        return v

    @field_validator("usage", "cost", mode="before")
    @classmethod
    def _json_counters(cls, v: Any) -> Any:
        if isinstance(v, Mapping) and any(
            isinstance(x, bool) or not isinstance(x, int | float) for x in v.values()
        ):
            raise ValueError("holds a value that is not a number: pass an object of JSON numbers")
        return v  # not an object at all: the model says so

    @field_validator(*_IMPORTED_DATETIMES, mode="before")
    @classmethod
    def _json_datetimes(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, str):
            raise ValueError("is not a date-time: pass an ISO 8601 string")
        return v

    @field_validator("pinned", mode="before")
    @classmethod
    def _json_boolean(cls, v: Any) -> Any:
        if not isinstance(v, bool):
            raise ValueError("is not a boolean: pass true or false")
        return v


class ImportRequest(RequestBody):
    """Exported memories, stored as they are; a memory without ``tenant`` gets the caller's."""

    memories: list[ImportedMemory] = Field(max_length=MAX_IMPORT)


class KeyRequest(RequestBody):
    """A new key. ``expires_at`` and/or ``ttl_s``: when it stops working (401 ``key_expired``), the earlier
    of the two; without either it does not expire."""

    role: RoleName = Role.AGENT
    name: Annotated[str, StringConstraints(max_length=200)] = ""
    expires_at: UtcDatetime | None = None
    ttl_s: float | None = Field(default=None, gt=0, le=MAX_KEY_TTL_S, description="seconds from now")


#: A precomputed ``embedding`` needs one value at least this far from 0: one whose square float32 holds
#: (from ~1e-19 down, all of them square to nothing), so that it has a direction (stores refuse a vector
#: without one: ``clawvm.store.base.check_stored_vectors``).
DIRECTED_VALUE = 1e-18


def state_embedding_dim(app: FastAPI, dim: int) -> None:
    """Make ``app``'s OpenAPI document say what a precomputed ``embedding`` must be: the store's dimension,
    which the request models cannot know (it is the server's), and a value away from 0 (a zero vector is
    refused: a client that reads the schema learns it there, not from a 422)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        schema = build()  # FastAPI builds the document once and keeps it
        if fresh:
            record = schema.get("components", {}).get("schemas", {}).get("RecordRequest", {})
            embedding = record.get("properties", {}).get("embedding", {})
            for branch in embedding.get("anyOf", [embedding]):
                if branch.get("type") == "array":
                    branch["minItems"] = branch["maxItems"] = dim
                    branch["contains"] = {
                        "anyOf": [{"minimum": DIRECTED_VALUE}, {"maximum": -DIRECTED_VALUE}]
                    }
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
