"""The memory object and the small value types around it.

:class:`Memory` is a pydantic v2 model because it sits at every edge (SDK callers, JSON Lines export,
the server later). Everything that builds one from user input goes through :func:`build_memory`, which
turns pydantic's errors into :class:`clawvm.core.errors.ValidationError` naming the field and the fix.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeGuard

import pydantic
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from clawvm.core.errors import ValidationError
from clawvm.core.ids import ID_PATTERN, is_valid_id, new_id

DEFAULT_MAX_CONTENT_BYTES = 1_000_000
#: How deeply JSON metadata and content may nest (objects/arrays inside each other). Deeper values pass
#: Python's json module but not pydantic, which the stores read back with (measured: its JSON parser gave
#: up between 128 and 200 levels, its serializer at 255; a SQLite store then held a row it could not
#: read), so they are refused when a memory is built. The server refuses request bodies deeper than this
#: too (:mod:`clawvm.server.schemas`).
MAX_JSON_DEPTH = 64
#: The longest scope id (session, task, agent, tool, team) and the most tags (each at most
#: MAX_TAG_CHARS) a memory may have: one set of limits for every way in, so that a memory recorded
#: through the SDK can be named through the REST API, the dashboard and the tools.
MAX_SCOPE_ID_CHARS = 256
MAX_TAGS = 64
MAX_TAG_CHARS = 200
#: The most a memory's metadata may hold, as UTF-8 JSON: as much as its content by default. Metadata is
#: read with every memory (lists, recalls, the dashboard), so megabytes there slowed every read of it.
MAX_METADATA_BYTES = 1_000_000
#: What to do about a value nested deeper (the ``fix`` of the error; the server's too).
DEPTH_FIX = f"flatten it to at most {MAX_JSON_DEPTH} levels of objects and arrays"
TEXT = "text/plain"
JSON = "application/json"


def _not_whitespace() -> str:
    """A regex class of any character but Python's whitespace (``str.isspace``), each spelled out as
    ``\\uXXXX``: ``\\S`` means other characters to other regex engines (JSON Schema's, pydantic's)."""
    spaces = [c for c in map(chr, range(0x3001)) if c.isspace()]
    return "[^" + "".join(f"\\u{ord(c):04x}" for c in spaces) + "]"


#: JSON Schema pattern of a text with something besides whitespace (what ``strip()`` leaves non-empty).
NON_BLANK = _not_whitespace()

#: Characters that show nothing and are not whitespace to ``str.strip``: zero-width space, non-joiner and
#: joiner, word joiner, byte order mark. Content of only these (and spaces) is blank to a reader.
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"
_SHOWN = re.compile(f"[^\\s{INVISIBLE}]")  # \s is str.isspace's whitespace
#: JSON Schema pattern of content that shows something: a character neither whitespace nor invisible.
VISIBLE = NON_BLANK[:-1] + "".join(f"\\u{ord(c):04x}" for c in INVISIBLE) + "]"


def shows_nothing(text: str) -> bool:
    """Whether ``text`` is only whitespace and :data:`INVISIBLE` characters (nothing a prompt shows)."""
    return _SHOWN.search(text) is None  # stops at the first visible character


_SCOPE_ID_SCHEMA: dict[str, JsonValue] = {"maxLength": MAX_SCOPE_ID_CHARS}
_ID_SCHEMA: dict[str, JsonValue] = {"type": "string", "pattern": ID_PATTERN}


class Kind(StrEnum):
    USER_INPUT = "user_input"
    LLM_THOUGHT = "llm_thought"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    AGENT_STATE = "agent_state"
    OBSERVATION = "observation"
    DECISION = "decision"
    ERROR = "error"
    KNOWLEDGE = "knowledge"
    SUMMARY = "summary"
    NOTE = "note"


class State(StrEnum):
    PENDING = "pending"
    SUCCESS = "success"
    ERROR = "error"
    INTERMEDIATE = "intermediate"


#: The tenant of a memory, and of a harness, that names none.
DEFAULT_TENANT = "default"
#: What a tenant may be called: the same name must work as a harness's, a memory's, an API key's and a
#: CLI flag's, so one rule for all of them (``_``-prefixed names are kept for the store's own streams).
TENANT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
TENANT_FIX = "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
_TENANT_NAME = re.compile(TENANT_PATTERN)


def is_tenant_name(tenant: object) -> TypeGuard[str]:
    return isinstance(tenant, str) and _TENANT_NAME.fullmatch(tenant) is not None


def check_tenant_name(tenant: object) -> str:
    """``tenant`` if it is a valid tenant name (:data:`TENANT_PATTERN`), else a ValidationError."""
    if not is_tenant_name(tenant):
        raise ValidationError("tenant", f"{tenant!r} is not a valid tenant name", TENANT_FIX)
    return tenant


class Status(StrEnum):
    ACTIVE = "active"
    ARCHIVED = "archived"
    OBSOLETE = "obsolete"
    EXPIRED = "expired"
    #: the harness's own bookkeeping (team grants, :mod:`clawvm.teams.shared`): never recalled, listed
    #: or counted through the harness, and no caller may record or update a memory into it
    INTERNAL = "internal"


#: The statuses a caller may see: ``status="any"`` means these.
VISIBLE_STATUSES = frozenset(s for s in Status if s is not Status.INTERNAL)
#: What a caller's status filter may name (SDK, API, dashboard): a status it sees, or "any" for them all.
STATUS_CHOICES = (*sorted(s.value for s in VISIBLE_STATUSES), "any")


class Tier(StrEnum):
    WORKING = "working"
    SHORT_TERM = "short_term"
    LONG_TERM = "long_term"
    ARCHIVE = "archive"


class Scope(StrEnum):
    """Who may read a memory (teams, :mod:`clawvm.teams.shared`). A memory without a scope is tenant-wide."""

    PRIVATE = "private"  # only its agent_id
    TEAM = "team"  # agents with read permission on its team_id
    TASK = "task"  # agents working on its task_id (and, with a team_id, allowed to read that team)


class LinkType(StrEnum):
    CAUSED_BY = "caused_by"
    REVISES = "revises"
    SUMMARIZES = "summarizes"
    DERIVED_FROM = "derived_from"
    REFERS_TO = "refers_to"


def as_utc(v: datetime) -> datetime:
    """``v`` in UTC, the only zone we store: naive datetimes are taken as UTC; an aware one that leaves the
    calendar once converted is a ValueError (pydantic validators report it on the field)."""
    if v.tzinfo is None:
        return v.replace(tzinfo=UTC)
    try:
        return v.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC") from None


# the date-time of RFC 3339 (the OpenAPI "date-time" format), seconds and offset optional (no offset: UTC);
# not the other ISO 8601 forms Python reads, such as "10531120" (the basic form of 1053-11-20)
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:\d{2})?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def iso_datetime(v: Any) -> Any:
    """A datetime given over HTTP, as RFC 3339 text (pydantic's lax mode would also take a number of seconds,
    even as text: ``"0"``); a datetime passes as it is. For ``BeforeValidator`` at the edges."""
    return _parsed_datetime(v, _DATE_TIME)


def iso_date_or_datetime(v: Any) -> Any:
    """:func:`iso_datetime`, or a date alone (midnight UTC): a browser's date input."""
    return _parsed_datetime(v, _DATE if isinstance(v, str) and len(v) == 10 else _DATE_TIME)


def _parsed_datetime(v: Any, form: re.Pattern[str]) -> Any:
    if isinstance(v, datetime):
        return v
    if not isinstance(v, str):
        raise ValueError(f"has type {type(v).__name__}: pass an RFC 3339 date-time string")
    try:
        if form.fullmatch(v):
            return datetime.fromisoformat(v.upper())  # RFC 3339 allows "t" and "z", Python reads "T" and "Z"
    except ValueError:
        pass
    raise ValueError(f"is {v[:40]!r}: pass an RFC 3339 date-time such as 2026-01-31T12:00:00Z")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Link(BaseModel):
    """A typed, directed edge from the owning memory to ``target``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: LinkType
    target: str = Field(json_schema_extra={"pattern": ID_PATTERN})

    @field_validator("target")
    @classmethod
    def _target_is_id(cls, v: str) -> str:
        if not is_valid_id(v):
            raise ValueError("must be a memory id (a canonical UUID string)")
        return v


#: The largest integer a count or a version may hold: the largest every JSON client reads exactly
#: (JavaScript's Number.MAX_SAFE_INTEGER, so schema validators that compare in floating point agree with
#: this one), well inside what a SQLite INTEGER and a PostgreSQL bigint store (a version past 2^63,
#: imported or sent to the API, failed in the engine's insert instead of at validation).
MAX_COUNT = 2**53 - 1


class Cost(BaseModel):
    """What producing the memory cost: wall time, model tokens, money (any currency, caller's choice)."""

    # inf/NaN would be written to JSON as null and could not be read back
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    seconds: float = Field(default=0.0, ge=0)
    tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    money: float = Field(default=0.0, ge=0)


class Usage(BaseModel):
    """How a memory has been used since it was recorded; an input of the value score.

    ``injected``: times it went into a built context; ``cited``: times an output cited it;
    ``successes``/``failures``: tasks it contributed to that ended well/badly; ``feedback``: the sum of
    user votes (+1/-1).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    injected: int = Field(default=0, ge=0, le=MAX_COUNT)
    cited: int = Field(default=0, ge=0, le=MAX_COUNT)
    successes: int = Field(default=0, ge=0, le=MAX_COUNT)
    failures: int = Field(default=0, ge=0, le=MAX_COUNT)
    feedback: int = Field(default=0, ge=-MAX_COUNT, le=MAX_COUNT)


class Memory(BaseModel):
    """One structured memory object, immutable once validated (change it with ``Harness.update``).

    ``version`` starts at 1 and grows by one on every stored change.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, allow_inf_nan=False)

    # the schema states what the validators below check (the OpenAPI spec shows it to clients)
    id: str = Field(default_factory=new_id, json_schema_extra={"pattern": ID_PATTERN})
    content: str = Field(json_schema_extra={"pattern": NON_BLANK})
    content_type: str = Field(default=TEXT, json_schema_extra={"enum": [TEXT, JSON]})
    kind: Kind = Kind.NOTE
    state: State | None = None
    status: Status = Status.ACTIVE
    tenant: str = Field(
        default=DEFAULT_TENANT,
        json_schema_extra={"minLength": 1, "maxLength": 64, "pattern": f"^{TENANT_PATTERN}$"},
    )
    session_id: str | None = Field(default=None, json_schema_extra=_SCOPE_ID_SCHEMA)
    task_id: str | None = Field(default=None, json_schema_extra=_SCOPE_ID_SCHEMA)
    agent_id: str | None = Field(default=None, json_schema_extra=_SCOPE_ID_SCHEMA)
    tool_name: str | None = Field(default=None, json_schema_extra=_SCOPE_ID_SCHEMA)
    scope: Scope | None = None
    team_id: str | None = Field(default=None, json_schema_extra=_SCOPE_ID_SCHEMA)
    tags: list[str] = Field(
        default_factory=list,
        json_schema_extra={
            "maxItems": MAX_TAGS,
            "items": {"type": "string", "pattern": NON_BLANK, "maxLength": MAX_TAG_CHARS},
        },
    )
    parent_id: str | None = Field(default=None, json_schema_extra={"anyOf": [_ID_SCHEMA, {"type": "null"}]})
    links: list[Link] = Field(default_factory=list)
    value: float = Field(default=0.5, ge=0.0, le=1.0)
    # strict: pinned="no" pinned (a non-empty string is true) and confidence="0.3" or True passed unnoticed
    pinned: bool = Field(default=False, strict=True)
    access_count: int = Field(default=0, ge=0, le=MAX_COUNT)
    last_accessed_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime | None = None
    version: int = Field(default=1, ge=1, le=MAX_COUNT)
    # the version of the last change other than the harness's own bookkeeping (access counts, promotions,
    # paging, value refreshes); None: this version. A caller's expected_version from any version since
    # then is still current (moved_on): the harness's bookkeeping never makes an update conflict. Set by
    # the commit path on every write (what a caller passes is not kept).
    changed_version: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    tier: Tier = Tier.SHORT_TERM
    confidence: float = Field(default=1.0, ge=0.0, le=1.0, strict=True)
    cost: Cost = Field(default_factory=Cost)
    usage: Usage = Field(default_factory=Usage)
    token_count: int = Field(default=0, ge=0, le=MAX_COUNT)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id", "parent_id")
    @classmethod
    def _ids_are_uuids(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not _stored(info) and not is_valid_id(v):
            raise ValueError("must be a canonical UUID string such as one returned by record()")
        return v

    @field_validator("content", "tenant", "session_id", "task_id", "agent_id", "tool_name", "team_id")
    @classmethod
    def _encodable(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not _stored(info):
            _check_utf8(v)
        return v

    @field_validator("session_id", "task_id", "agent_id", "tool_name", "team_id")
    @classmethod
    def _short_scope_id(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not _as_stored(info) and len(v) > MAX_SCOPE_ID_CHARS:
            # every surface reads scopes this long (the REST API refused longer ones the SDK had stored)
            raise ValueError(f"is {len(v)} characters long: use at most {MAX_SCOPE_ID_CHARS}")
        return v

    @field_validator("tenant")
    @classmethod
    def _named_tenant(cls, v: str, info: ValidationInfo) -> str:
        if _as_stored(info) or is_tenant_name(v):  # a stored row keeps the name it was written with
            return v
        if not v.strip():
            raise ValueError("is blank: name the tenant, or leave it out for the default one")
        raise ValueError(f"{v!r} is not a valid tenant name: {TENANT_FIX}")

    @field_validator("content")
    @classmethod
    def _not_blank(cls, v: str, info: ValidationInfo) -> str:
        if not _as_stored(info) and shows_nothing(v):  # as its schema says: a blank line reached prompts
            raise ValueError("is blank: give the memory content")
        return v

    @field_validator("content_type")
    @classmethod
    def _known_content_type(cls, v: str) -> str:
        if v not in (TEXT, JSON):
            raise ValueError(f"must be {TEXT!r} or {JSON!r}")
        return v

    @field_validator("tags")
    @classmethod
    def _clean_tags(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if _as_stored(info):
            return v
        seen: dict[str, None] = {}
        for tag in v:
            tag = tag.strip()
            if not tag:
                raise ValueError("tags must be non-empty strings")
            if len(tag) > MAX_TAG_CHARS:
                raise ValueError(f"each tag must be at most {MAX_TAG_CHARS} characters")
            _check_utf8(tag)
            seen.setdefault(tag, None)
        if len(seen) > MAX_TAGS:
            raise ValueError(f"has {len(seen)} tags: use at most {MAX_TAGS}")
        return list(seen)

    @field_validator("changed_version")
    @classmethod
    def _changed_before(cls, v: int | None, info: ValidationInfo) -> int | None:
        # a copy made into a new memory (a compressed original, a revision, an import) is changed at its
        # own version, whatever its source said; the commit path sets the field on every write anyway
        return None if v is not None and v >= info.data.get("version", 1) else v

    @field_validator("created_at", "expires_at", "last_accessed_at")
    @classmethod
    def _aware_utc(cls, v: datetime | None) -> datetime | None:
        return None if v is None else as_utc(v)

    @field_validator("metadata")
    @classmethod
    def _json_metadata(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # read back from JSON, or kept as stored by a revalidate: it was checked and normalised as when
        # written (a memory stored before a limit still changes)
        if not v or _as_stored(info):
            return v
        too_deep_error = PydanticCustomError(
            "json_too_deep", f"is nested deeper than {MAX_JSON_DEPTH} levels"
        )
        try:
            text = json.dumps(v, allow_nan=False, ensure_ascii=False)
            size = len(text.encode("utf-8"))  # and an unpaired surrogate cannot be stored
        except RecursionError:
            raise too_deep_error from None
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
            raise ValueError(f"must be JSON-serialisable ({exc})") from None
        if size > MAX_METADATA_BYTES:
            raise PydanticCustomError(
                "json_too_large", f"is {size} bytes as JSON, over the {MAX_METADATA_BYTES}-byte limit"
            )
        # nesting needs as many brackets as levels: only a text with that many is walked level by level
        if text.count("{") + text.count("[") > MAX_JSON_DEPTH and too_deep(v):
            raise too_deep_error
        # Stored as JSON, so keep it as JSON reads back (tuples -> lists, non-str keys -> str): every
        # engine then returns exactly what was validated.
        normalized: dict[str, Any] = json.loads(text)
        return normalized

    def content_json(self) -> Any:
        """The payload as a Python object when ``content_type`` is JSON, else the text. JSON content that
        does not parse (an imported file's, say) is a :class:`ValidationError` naming ``content``."""
        if self.content_type != JSON:
            return self.content
        try:
            return json.loads(self.content)
        except ValueError as exc:
            raise ValidationError("content", f"is not valid JSON ({exc})", "read .content as text") from None

    def to_json(self) -> str:
        """Lossless JSON text of this memory (the JSON Lines export format)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Memory:
        try:
            return cls.model_validate_json(text)
        except pydantic.ValidationError as exc:
            raise _translate(exc) from None


#: Validation context for a memory an engine reads back (``model_validate_json(body, context=STORED)``):
#: it was validated when written, so the checks that only guard input (id syntax, UTF-8, tag cleaning,
#: metadata's JSON round trip) are skipped; types, enums and ranges are still checked. They were ~60% of
#: the ~57 µs a stored row took to read (recall reads ten).
STORED: dict[str, bool] = {"stored": True}


def _stored(info: ValidationInfo) -> bool:
    return info.context is STORED


#: The validation context key of the fields a :func:`revalidate` keeps as stored.
KEPT = "kept"


def _as_stored(info: ValidationInfo) -> bool:
    """Whether the field being validated is taken as stored: a stored row read back, or a field that a
    :func:`revalidate` leaves as it was (rules added since it was written do not apply to it)."""
    context = info.context
    return context is STORED or (isinstance(context, dict) and info.field_name in context.get(KEPT, ()))


def _check_utf8(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains unpaired surrogates (not valid UTF-8)") from None


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether objects/arrays in ``value`` nest deeper than ``limit`` (``value`` itself is level 0).

    Level by level and containers only (scalars are looked at once, never stacked), so a value nested as
    deep as Python allows is answered without a RecursionError, and a large flat payload quickly.
    """
    level = [value] if _is_container(value) else []
    depth = 0
    while level:
        if depth >= limit:
            return True
        level = [c for v in level for c in (v.values() if isinstance(v, Mapping) else v) if _is_container(c)]
        depth += 1
    return False


def _is_container(v: Any) -> bool:
    if isinstance(v, dict | list | tuple):
        return True
    return not isinstance(v, str | int | float) and v is not None and isinstance(v, Mapping)


def canonical_json(payload: Any) -> str:
    """Canonical JSON text: sorted keys, no insignificant whitespace, UTF-8 kept as is, no NaN."""
    try:
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        # sorting keys of two types (1 and "b") fails with a comparison error that names neither
        why = "a dict has keys of two types" if "not supported between" in str(exc) else str(exc)
        raise ValidationError(
            "content", f"is not JSON-serialisable ({why})", "pass text, or a dict/list of JSON values"
        ) from None


def normalize_content(content: Any, max_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> tuple[str, str]:
    """Return ``(text, content_type)`` for a record() payload, or raise ValidationError on ``content``."""
    if isinstance(content, bytes | bytearray | memoryview):
        try:
            content = bytes(content).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError(
                "content", f"is not valid UTF-8 (byte {exc.start})", "decode it with the right charset first"
            ) from None
    if isinstance(content, str):
        text, ctype = content, TEXT
    elif isinstance(content, Mapping | list | tuple):
        if too_deep(content):
            raise ValidationError(
                "content",
                f"is nested deeper than {MAX_JSON_DEPTH} levels",
                f"{DEPTH_FIX}, or pass it as text",
            )
        text, ctype = canonical_json(content), JSON
    else:
        raise ValidationError(
            "content", f"has type {type(content).__name__}", "pass a str, bytes (UTF-8), dict or list"
        )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(
            "content", "contains unpaired surrogates (not valid UTF-8)", "remove or replace them"
        ) from None
    if shows_nothing(text):
        raise ValidationError("content", "is empty", "record something non-blank")
    if size > max_bytes:
        raise ValidationError(
            "content",
            f"is {size} bytes, over the {max_bytes}-byte limit",
            "store large payloads elsewhere and record a reference (the limit is the harness's "
            "max_content_bytes)",
        )
    return text, ctype


_FIXES = {
    "enum": "use one of the listed values",
    "string_type": "pass a string",
    "int_type": "pass an integer",
    "int_parsing": "pass an integer",
    "float_type": "pass a number",
    "float_parsing": "pass a number",
    "bool_type": "pass true or false",
    "bool_parsing": "pass true or false",
    "list_type": "pass a list",
    "dict_type": "pass an object/dict",
    "datetime_type": "pass an ISO 8601 datetime",
    "datetime_parsing": "pass an ISO 8601 datetime",
    "datetime_from_date_parsing": "pass an ISO 8601 datetime",
    "extra_forbidden": "remove it; see clawvm.Memory for the known fields",
    "greater_than_equal": "pass a larger value",
    "less_than_equal": "pass a smaller value",
    "missing": "provide it",
    "value_error": "correct the value as the message says",
    "json_too_deep": DEPTH_FIX,
    "json_too_large": "keep a large payload in the content, or outside ClawVM with a reference here",
}

#: The fix for a field whose own check failed (a ``value_error``: the message says what is wrong, this what
#: to pass instead), by the field's top-level name.
FIELD_FIXES = {
    "parent_id": "pass the id of a stored memory, as record() returned it",
    "metadata": "pass a dict of JSON values: strings, numbers, booleans, null, lists and dicts",
    "tags": "pass a list of tags, each a non-empty string within the limit the message names",
    "content": "pass non-empty text, or a dict or list for JSON content",
    "links": "pass a list of {type, target}, with a stored memory's id as target",
}


def fix_for(error_type: str, field: str) -> str:
    """What to do about a pydantic error of ``error_type`` on ``field`` (its dotted path)."""
    if error_type == "value_error" and (own := FIELD_FIXES.get(field.split(".")[0])) is not None:
        return own
    return _FIXES.get(error_type, "correct the value")


def pattern_in_words(error: Mapping[str, Any]) -> tuple[str, str] | None:
    """(problem, fix) of a pydantic error for a text that does not match one of the model's patterns, in
    words: pydantic's message quotes the regex (a whitespace-only name was answered with forty escapes)."""
    if error.get("type") != "string_pattern_mismatch":
        return None
    return _PATTERN_WORDS.get(str(dict(error.get("ctx") or {}).get("pattern", "")))


_PATTERN_WORDS = {
    NON_BLANK: ("is blank", "give it some text besides spaces"),
    VISIBLE: ("is blank", "give it some text besides spaces and invisible characters"),
    ID_PATTERN: ("is not a memory id", "pass an id as record() returned it"),
    f"^{TENANT_PATTERN}$": ("is not a valid tenant name", TENANT_FIX),
}


def describe_pattern(pattern: str, problem: str, fix: str) -> None:
    """Say in words what text ``pattern`` wants (:func:`pattern_in_words`), for a pattern of an edge's own
    (the dashboard's what-if weights quoted a regex of several hundred characters)."""
    _PATTERN_WORDS[pattern] = (problem, fix)


def _translate(exc: pydantic.ValidationError) -> ValidationError:
    """First pydantic error -> our ValidationError with a dotted field path and a fix."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"]) or "memory"
    if (words := pattern_in_words(err)) is not None:
        return ValidationError(loc, *words)
    msg = str(err.get("msg", "is invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return ValidationError(loc, msg, fix_for(str(err["type"]), loc))


def build_memory(fields: Mapping[str, Any]) -> Memory:
    """Validate ``fields`` into a Memory, raising :class:`ValidationError` (never pydantic's)."""
    try:
        return Memory.model_validate(dict(fields))
    except pydantic.ValidationError as exc:
        raise _translate(exc) from None


#: The fields that name a memory's scope (a session, a task ...): an id, or None; the write path redacts
#: them as identifiers (and event data keys of these names).
SCOPE_IDS = ("session_id", "task_id", "agent_id", "tool_name", "team_id")

#: The metadata keys that name what replaced an obsolete memory: the next revision of its chain
#: (``superseded_by``) or the merge it went into (``merged_into``). Only an obsolete memory names one: a
#: memory made active again (a rollback undoing the revision) drops it.
REPLACED_BY = ("superseded_by", "merged_into")
#: The link types by which a memory names those it replaced: its previous revision (``revises``), a
#: merge's sources (``derived_from``)
CHAIN_LINKS = (LinkType.REVISES, LinkType.DERIVED_FROM)

#: Fields a caller's change (an update, a revision) may not set, each with what sets it instead (the
#: REST API does not take them either).
SET_BY_HARNESS = {
    "token_count": "it is counted from the content: change the content",
    "content_type": "it follows the content: pass the content as text, or as a dict or list for JSON",
    "value": "the scorer computes it: use rate(id, delta), or intervene(h, 'set_value', id, value=...)",
    "pinned": "use pin(id) or unpin(id), which keep the pinned budget and the working tier",
    "access_count": "recalls count accesses",
    "last_accessed_at": "recalls count accesses",
    "usage": "context builds and record_output count it",
}


def refuse_internal(memory: Memory) -> None:
    """:class:`ValidationError` naming ``memory_id`` for a record of the harness's own (a team grant, the
    learned weights): callers read them through what keeps them (``grants()``), and change them only so."""
    if memory.status is Status.INTERNAL:
        raise ValidationError(
            "memory_id",
            "is an internal record of the harness (a team grant, learned weights)",
            "leave it; change grants with harness.grant()",
        )


def refuse_set_by_harness(changes: Mapping[str, Any]) -> None:
    """:class:`ValidationError` for the first field of ``changes`` that :data:`SET_BY_HARNESS` names."""
    owned = sorted(set(SET_BY_HARNESS).intersection(changes))
    if owned:
        raise ValidationError(owned[0], "is set by the harness", SET_BY_HARNESS[owned[0]])


def blank_scopes_as_none(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with each scope id given as blank text (``session_id=""``) as None, which is how a memory
    has no session, task ...: stored blank, it made a session that no listing or count showed. (Memories
    stored blank before are copied back through here by replays and restores: they are not refused.)"""
    blank = [n for n in SCOPE_IDS if isinstance(fields.get(n), str) and not fields[n].strip()]
    return {**fields, **dict.fromkeys(blank)} if blank else fields


def moved_on(current: Memory, expected_version: int) -> bool:
    """Whether ``current`` changed since the caller read it at ``expected_version``: by a change other than
    the harness's own bookkeeping since then (access counts, promotions, paging, value refreshes: see
    ``Memory.changed_version``), or ``expected_version`` is one it never had. :class:`ValidationError` when
    ``expected_version`` is no version at all (not a positive integer)."""
    if isinstance(expected_version, bool) or not isinstance(expected_version, int) or expected_version < 1:
        raise ValidationError(
            "expected_version",
            f"is {expected_version!r}",
            "pass the version you read (a positive integer), or None to skip the check",
        )
    since = current.version if current.changed_version is None else current.changed_version
    return not since <= expected_version <= current.version


def revalidate(memory: Memory, changes: Mapping[str, Any]) -> Memory:
    """A copy of ``memory`` with ``changes`` applied and re-validated. The rules for new input (a
    tenant's name, the limits on scope ids and tags, non-blank content) judge the changed fields only:
    a memory stored before a rule existed can still be paged, pinned or archived."""
    return derived(memory, changes)


def derived(memory: Memory, changes: Mapping[str, Any], exclude: Iterable[str] = ()) -> Memory:
    """A memory made from ``memory``'s fields (but ``exclude``, left to their defaults) and ``changes``
    (a revision, a compressed memory's raw copy), validated as :func:`revalidate` validates."""
    data = memory.model_dump(exclude=set(exclude))
    data.update(changes)
    try:
        return Memory.model_validate(data, context={KEPT: frozenset(data) - frozenset(changes)})
    except pydantic.ValidationError as exc:
        raise _translate(exc) from None


def capped_tags(first: Iterable[str], then: Iterable[str] = ()) -> list[str]:
    """``first`` (the harness's own marks) then ``then``, each once, the first :data:`MAX_TAGS` of them:
    a union of several memories' tags (a merge, a tool result's scope tags and its marks) stays within
    the limit a caller's tags are held to."""
    return list(dict.fromkeys([*first, *then]))[:MAX_TAGS]


Scalar = str | Iterable[str] | None


def _as_set(v: Scalar) -> frozenset[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return frozenset([v])
    return frozenset(str(x) for x in v)


@dataclass(frozen=True)
class Visibility:
    """What one agent may read; a :class:`Filters` carrying it admits only those memories.

    A memory passes when it has no scope (tenant-wide), or is PRIVATE and ``agent_id`` is this agent, or
    is TEAM and its ``team_id`` is in ``teams``, or is TASK, its ``task_id`` is in ``tasks`` and its
    ``team_id`` is unset or in ``teams``. ``teams`` are the teams the agent has read permission on
    (resolved from grants by :mod:`clawvm.teams.shared`); ``tasks`` the tasks it works on.
    """

    agent_id: str
    teams: frozenset[str] = frozenset()
    tasks: frozenset[str] = frozenset()

    def allows(self, m: Memory) -> bool:
        if m.scope is None:
            return True
        if m.scope is Scope.PRIVATE:
            return m.agent_id == self.agent_id
        if m.scope is Scope.TEAM:
            return m.team_id in self.teams
        return m.task_id in self.tasks and (m.team_id is None or m.team_id in self.teams)


@dataclass(frozen=True)
class Filters:
    """Metadata filters for queries. ``None`` means "any"; a set means "one of"; tags are AND / OR.

    The same object is evaluated by :meth:`matches` (the reference semantics, used by the in-process
    engines) and compiled to SQL by the SQL engines; the contract tests check they agree.
    """

    tenant: frozenset[str] | None = None
    session_id: frozenset[str] | None = None
    task_id: frozenset[str] | None = None
    agent_id: frozenset[str] | None = None
    tool_name: frozenset[str] | None = None
    scope: frozenset[str] | None = None
    team_id: frozenset[str] | None = None
    kind: frozenset[str] | None = None
    state: frozenset[str] | None = None
    status: frozenset[str] | None = None
    tier: frozenset[str] | None = None
    tags_all: frozenset[str] = field(default_factory=frozenset)
    tags_any: frozenset[str] | None = None
    parent_id: str | None = None
    pinned: bool | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    visible_to: Visibility | None = None  # read permissions of one agent (see Visibility)
    expires_by: datetime | None = None  # ``expires_at`` is set and at or before this instant (due to expire)
    live_at: datetime | None = None  # ``expires_at`` is unset or after this instant (not expired by then)
    # an ``active`` memory must be due to expire by this instant (``expires_at`` at or before it); other
    # statuses are not concerned: with ``status`` {expired, active}, the memories expired by then, swept
    # or not (a read of expired memories missed the due ones no tick had marked yet)
    active_due_by: datetime | None = None

    SET_FIELDS = (
        "tenant",
        "session_id",
        "task_id",
        "agent_id",
        "tool_name",
        "scope",
        "team_id",
        "kind",
        "state",
        "status",
        "tier",
    )

    @classmethod
    def of(cls, **given: Any) -> Filters:
        """Build from keyword filters as callers write them (strings, lists, enums, datetimes)."""
        known = {f for f in cls.__dataclass_fields__}
        args: dict[str, Any] = {}
        for name, v in given.items():
            if name == "tags":
                name = "tags_all"
            if name not in known:
                raise ValidationError(name, "is not a known filter", f"use one of {sorted(known | {'tags'})}")
            if v is None:
                continue
            if name == "tags_any":
                args[name] = _checked_set(name, _tag_set(name, v))
            elif name in cls.SET_FIELDS:
                args[name] = _checked_set(name, _as_set(_texts(name, _enum_values(v))))
                if name in SCOPE_IDS and any(not x.strip() for x in args[name]):
                    # stored as none (record): filtered as text, it silently matched nothing
                    raise ValidationError(
                        name,
                        "holds a blank id",
                        "name one, or leave the filter out: a blank id is stored as none",
                    )
            elif name == "tags_all":
                args[name] = _tag_set("tags", v) or frozenset()
            elif name in ("created_after", "created_before", "expires_by", "live_at", "active_due_by"):
                args[name] = _instant(name, v)
            elif name == "pinned":
                args[name] = _flag(name, v)
            elif name == "visible_to":
                if not isinstance(v, Visibility):
                    raise ValidationError(
                        name, "must be a Visibility", "pass clawvm.core.model.Visibility(...)"
                    )
                args[name] = v
            else:
                args[name] = str(v)
        return cls(**args)

    def matches(self, m: Memory) -> bool:
        for name in self.SET_FIELDS:
            allowed: frozenset[str] | None = getattr(self, name)
            if allowed is None:
                continue
            actual = getattr(m, name)
            if actual is None or str(actual) not in allowed:
                return False
        if self.tags_all and not self.tags_all.issubset(m.tags):
            return False
        if self.tags_any is not None and not self.tags_any.intersection(m.tags):
            return False
        if self.parent_id is not None and m.parent_id != self.parent_id:
            return False
        if self.pinned is not None and m.pinned != self.pinned:
            return False
        if self.created_after is not None and not m.created_at >= self.created_after:
            return False
        if self.visible_to is not None and not self.visible_to.allows(m):
            return False
        if self.expires_by is not None and (m.expires_at is None or m.expires_at > self.expires_by):
            return False
        if self.live_at is not None and m.expires_at is not None and m.expires_at <= self.live_at:
            return False
        due_by = self.active_due_by
        live = m.expires_at is None or (due_by is not None and m.expires_at > due_by)
        if due_by is not None and m.status is Status.ACTIVE and live:
            return False
        return not (self.created_before is not None and not m.created_at < self.created_before)

    def with_(self, **changes: Any) -> Filters:
        from dataclasses import replace

        return replace(self, **changes)


#: The filters whose values are one of an enum's: a value outside it could match nothing, so it is a mistake
_ENUM_FILTERS: dict[str, type[StrEnum]] = {
    "kind": Kind,
    "state": State,
    "status": Status,
    "tier": Tier,
    "scope": Scope,
}


def _checked_set(name: str, values: frozenset[str] | None) -> frozenset[str] | None:
    enum = _ENUM_FILTERS.get(name)
    if enum is None or values is None:
        return values
    allowed = {e.value for e in enum}
    unknown = sorted(values - allowed)
    if unknown:
        raise ValidationError(name, f"has the unknown value {unknown[0]!r}", f"use one of {sorted(allowed)}")
    return values


def _texts(name: str, v: Any) -> Any:
    """``v`` (a string, or an iterable of them, read once into a list); anything else names the filter."""
    items = [v] if isinstance(v, str) or not isinstance(v, Iterable) else list(v)
    for x in items:
        if not isinstance(x, str):
            raise ValidationError(
                name, f"holds a {type(x).__name__} ({x!r})", "pass a string or a list of strings"
            )
    return v if isinstance(v, str) else items


def _tag_set(name: str, v: Any) -> frozenset[str] | None:
    """Tags to filter by, stripped as a memory's tags are when it is stored (``" urgent "`` finds the memory
    recorded with it); a blank one is refused: no memory has one."""
    tags = _as_set(_texts(name, _enum_values(v)))
    if tags is None:
        return None
    stripped = frozenset(tag.strip() for tag in tags)
    if "" in stripped:
        raise ValidationError(name, "holds a blank tag", "name each tag, or leave the filter out")
    return stripped


def _instant(name: str, v: object) -> datetime:
    """A filter's instant: a datetime, or ISO 8601 text as record() takes for ``expires_at`` (naive: UTC)."""
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v.strip())
        except ValueError:
            raise ValidationError(
                name, f"is {v!r}, not a date", "pass a datetime or ISO 8601 text, e.g. 2026-05-04T08:00:00Z"
            ) from None
    if not isinstance(v, datetime):
        raise ValidationError(name, "must be a datetime", "pass a datetime or ISO 8601 text (2026-05-04)")
    return v if v.tzinfo else v.replace(tzinfo=UTC)


def _flag(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise ValidationError(name, f"is {v!r}", "pass True or False")


def _enum_values(v: Any) -> Any:
    if isinstance(v, StrEnum):
        return v.value
    if isinstance(v, str):
        return v
    if isinstance(v, Iterable):
        return [x.value if isinstance(x, StrEnum) else x for x in v]
    return v


def finite(x: float) -> float:
    """Guard for scores coming out of numeric code: NaN/inf become 0."""
    return x if math.isfinite(x) else 0.0


def within(name: str, v: Any, low: float, high: float, fix: str, *, above_low: bool = False) -> float:
    """``v``, a number in [``low``, ``high``] (in (``low``, ``high``] with ``above_low``), as a float; else
    :class:`ValidationError` naming ``name`` with ``fix``: a bool, text or NaN is in no range (True read as
    1, and NaN fails every comparison silently)."""
    number = isinstance(v, int | float) and not isinstance(v, bool)
    if not number or not (low < v <= high if above_low else low <= v <= high):
        raise ValidationError(name, f"is {v!r}", fix)
    return float(v)


def counted(name: str, v: Any, least: int = 1) -> int:
    """``v`` as a whole count of at least ``least`` (a limit, a page size, k), or :class:`ValidationError`
    naming ``name``: a bool, a float or text is no count, and a negative limit sliced silently. Any integer
    type passes (``operator.index``: NumPy's too). One past :data:`MAX_COUNT` is taken as that many: no
    store holds more, and the engines' 64-bit integers overflowed on it (``events(after_seq=2**63)``)."""
    try:
        n = operator.index(v) if not isinstance(v, bool) else None
    except TypeError:
        n = None
    if n is None or n < least:
        raise ValidationError(name, f"is {v!r}", f"pass a whole number of at least {least}")
    return min(n, MAX_COUNT)


def flag(name: str, v: Any) -> bool:
    """``v`` when it is a bool, else :class:`ValidationError` naming ``name`` ("yes" or 1000 counted as
    adopted and added 1000 to the adoption counts)."""
    if not isinstance(v, bool):
        raise ValidationError(name, f"is {v!r}", "pass True or False")
    return v


#: The tag of checkpoint snapshots (:mod:`clawvm.vm.checkpoint`), which no prompt and no recall shows.
CHECKPOINT_TAG = "checkpoint"


def is_snapshot(memory: Memory) -> bool:
    """Whether ``memory`` is a checkpoint's snapshot (:mod:`clawvm.vm.checkpoint`): its kind and tag, and
    the JSON content and metadata that ``take`` writes. Kind and tag alone also matched an agent's own
    state tagged "checkpoint", which then refused every change and never reached a prompt."""
    return (
        memory.kind is Kind.AGENT_STATE
        and CHECKPOINT_TAG in memory.tags
        and memory.content_type == "application/json"
        and {"checkpoint", "memories"} <= memory.metadata.keys()
    )
