"""What the memory tools publish: each tool's argument and result models (their JSON schemas are the
schemas a model sees), what each tool does to the memory (:class:`Effect`), and the JSON schema of a
model as function calling wants it (:func:`json_schema`, with OpenAI's strict-mode variant).

Arguments are validated against the same models strictly (no coercion: ``"5"`` is not an integer, while
``5.0`` is, as in JSON Schema), unknown names rejected; an optional argument sent as ``null`` means "not
given". :mod:`clawvm.agents.tools` dispatches the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from clawvm.core.errors import ValidationError

# spelled out for the type checker and the JSON Schema; tests/test_agent_tools.py holds them to the enums
KindName = Literal[
    "user_input",
    "llm_thought",
    "tool_call",
    "tool_result",
    "agent_state",
    "observation",
    "decision",
    "error",
    "knowledge",
    "summary",
    "note",
]
StateName = Literal["pending", "success", "error", "intermediate"]
SHORT_ID_LENGTH = 8
RECALL_CLIP = 600


def _integral(v: Any) -> Any:
    """JSON has one number type: 5.0 is the integer 5 to a JSON Schema validator, so to us too."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


JSONInt = Annotated[int, BeforeValidator(_integral)]


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_not_given(cls, data: Any) -> Any:
        """An explicit null for an optional argument is the argument left out (strict-mode callers must
        send every property, so they send null for the ones they do not mean to set)."""
        if not isinstance(data, Mapping):
            return data
        fields = cls.model_fields
        return {
            k: v for k, v in data.items() if not (v is None and k in fields and not fields[k].is_required())
        }


class RecordMemoryArgs(ToolArgs):
    """Remember something for later in this session (a fact, a decision, an observation)."""

    content: str = Field(min_length=1, max_length=20000, description="What to remember, self-contained.")
    kind: KindName = Field("note", description="What sort of memory this is.")
    state: StateName | None = Field(None, description="Outcome, for steps of a task.")
    tags: list[str] = Field(default_factory=list, max_length=20, description="Labels to filter by later.")
    parent_id: str | None = Field(None, description="Id (or short id) of the memory this one follows from.")
    pinned: bool = Field(False, description="Keep it in every context of this session.")


class RecallMemoryArgs(ToolArgs):
    """Search memory: the most relevant memories for a query, best first."""

    query: str = Field(min_length=1, max_length=2000, description="What you are looking for.")
    k: JSONInt = Field(5, ge=1, le=50, description="How many memories to return.")
    kind: KindName | None = Field(None, description="Only memories of this kind.")
    tags: list[str] = Field(default_factory=list, max_length=20, description="Only memories with all tags.")
    scope: Literal["session", "task", "all"] = Field(
        "session", description="Search this session, this task, or everything you may read."
    )


class ListMemoriesArgs(ToolArgs):
    """List this session's memories, newest first (to browse; use recall_memory to search)."""

    limit: JSONInt = Field(20, ge=1, le=100, description="How many memories to return.")
    kind: KindName | None = Field(None, description="Only memories of this kind.")
    tags: list[str] = Field(default_factory=list, max_length=20, description="Only memories with all tags.")


class GetMemoryArgs(ToolArgs):
    """One memory in full: content, tags, version, scope. Any memory the tools show you: this session's, or
    another session's from recall_memory (scope "all") or a context; those can be read, not changed."""

    memory_id: str = Field(min_length=1, description="Id or short id of the memory.")


class UpdateMemoryArgs(ToolArgs):
    """Correct a memory of this session (a new revision; its version grows by one)."""

    memory_id: str = Field(min_length=1, description="Id or short id of the memory.")
    content: str | None = Field(None, min_length=1, max_length=20000, description="The corrected text.")
    tags: list[str] | None = Field(None, max_length=20, description="The new labels (replace the old ones).")
    state: StateName | None = Field(None, description="The new outcome, for steps of a task.")
    # the bound goes on the integer before its validator: after a BeforeValidator (JSONInt), or on the
    # union, pydantic publishes a "ge" that no JSON Schema validator knows instead of "minimum"
    expected_version: Annotated[int, Field(ge=1), BeforeValidator(_integral)] | None = Field(
        None, description="The version you read (get_memory); if the memory moved on, nothing changes."
    )


@dataclass(frozen=True)
class Bounds:
    default: int
    least: int
    most: int

    def check(self, name: str, text: str) -> int:
        """``text`` (a query string's value) as a whole number within these bounds, or ValidationError."""
        n = int(text) if text.isascii() and text.isdigit() else None
        if n is None or not self.least <= n <= self.most:
            raise ValidationError(
                name, f"is {text!r}", f"pass a whole number from {self.least} to {self.most}"
            )
        return n


#: An agent's context budget in tokens, by the tool and by the MCP context resource alike.
CONTEXT_BUDGET = Bounds(default=1000, least=50, most=32000)


class BuildContextArgs(ToolArgs):
    """Build a prompt-ready context for a question: pinned, working and retrieved memories under a budget."""

    query: str = Field(min_length=1, max_length=2000, description="The question or task at hand.")
    budget_tokens: JSONInt = Field(
        CONTEXT_BUDGET.default,
        ge=CONTEXT_BUDGET.least,
        le=CONTEXT_BUDGET.most,
        description="Token budget of the context.",
    )
    tools: list[str] | None = Field(
        None, description="Tools you are about to use (adds reliability warnings for flaky ones)."
    )


class CheckpointArgs(ToolArgs):
    """Snapshot this session's memory state so it can be rolled back to later."""

    name: str = Field(min_length=1, max_length=200, description="A name for the checkpoint.")


class RollbackArgs(ToolArgs):
    """Return this session's memory to a checkpoint; later memories become obsolete (not deleted)."""

    checkpoint_id: str = Field(min_length=1, description="Id returned by checkpoint.")


class PinMemoryArgs(ToolArgs):
    """Keep one of this session's memories in every context of this session."""

    memory_id: str = Field(min_length=1, description="Id or short id of the memory.")


class ForgetMemoryArgs(ToolArgs):
    """Delete a memory of this session for good (use for wrong or sensitive information)."""

    memory_id: str = Field(min_length=1, description="Id or short id of the memory.")
    expected_version: Annotated[int, Field(ge=1), BeforeValidator(_integral)] | None = Field(
        None, description="The version you read (get_memory); if the memory moved on, it is kept."
    )


class SummarizeTaskArgs(ToolArgs):
    """Collapse a finished task's intermediate steps into one summary memory."""

    task_id: str | None = Field(None, description="The task to summarize (default: the current task).")


# ---- what each tool answers (``result`` of a successful reply) ---------------------------------------------
class ToolResult(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryBrief(ToolResult):
    id: str
    short_id: str
    kind: KindName
    state: StateName | None
    tool_name: str | None
    created_at: str = Field(description="ISO 8601")
    content: str = Field(description=f"The text, clipped to {RECALL_CLIP} characters.")


class ScoredMemory(MemoryBrief):
    score: float


class MemoryDetail(ToolResult):
    id: str
    short_id: str
    kind: KindName
    state: StateName | None
    status: str
    content: str
    tags: list[str]
    pinned: bool
    version: int
    session_id: str | None
    task_id: str | None
    agent_id: str | None
    tool_name: str | None
    parent_id: str | None
    created_at: str = Field(description="ISO 8601")


class RecordResult(ToolResult):
    id: str
    short_id: str
    kind: KindName


class RecallResult(ToolResult):
    memories: list[ScoredMemory]


class ListResult(ToolResult):
    memories: list[MemoryBrief]
    total: int = Field(description="How many memories match (more than listed when over the limit).")


class UpdateResult(ToolResult):
    id: str
    short_id: str
    version: int
    fields: list[str] = Field(description="The fields changed.")


class ContextResult(ToolResult):
    text: str
    tokens: int
    budget: int
    ids: list[str]


class CheckpointResult(ToolResult):
    checkpoint_id: str


class RollbackResult(ToolResult):
    checkpoint_id: str
    restored: int
    obsoleted: int


class PinResult(ToolResult):
    id: str
    short_id: str
    pinned: bool


class ForgetResult(ToolResult):
    id: str
    short_id: str
    forgotten: bool


class SummarizeResult(ToolResult):
    summary_id: str | None
    short_id: str | None = None
    content: str | None = None
    reason: str | None = Field(None, description="Why there is no summary, when summary_id is null.")


@dataclass(frozen=True)
class Effect:
    """What a tool does to the memory (the MCP tool annotations): ``read_only`` changes no memory (recall and
    context may still count usage, unless the tools are built with ``record_usage=False``); ``destructive``
    overwrites or removes; ``idempotent``: a second identical call changes nothing more."""

    read_only: bool
    destructive: bool = False
    idempotent: bool = False


READS = Effect(read_only=True, idempotent=True)
ADDS = Effect(read_only=False)
OVERWRITES = Effect(read_only=False, destructive=True)


# Keywords OpenAI's strict mode does not accept; the strict schema leaves them out and the dispatcher (which
# validates against the full model) still enforces them.
STRICT_UNSUPPORTED = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "default",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
    }
)
# Keywords whose value maps names to schemas (a property named "format" is not the keyword "format").
_NAMED_SCHEMAS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def json_schema(model: type[BaseModel], *, strict: bool = False) -> dict[str, Any]:
    """The model's JSON schema, tidied for function calling: no titles, optional arguments nullable.

    ``strict``: OpenAI's strict-mode subset (every property required, unsupported keywords left out,
    ``additionalProperties: false`` on every object).
    """
    schema: dict[str, Any] = tidy_schema(model.model_json_schema())
    schema.pop("description", None)  # the docstring: already the function's description
    schema = _optional_nullable(schema)
    return _strict(schema) if strict else schema


def _optional_nullable(node: Any) -> Any:
    """Every object's optional properties also accept null (the dispatcher reads null as "not given")."""
    if isinstance(node, list):
        return [_optional_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: (
            {n: _optional_nullable(s) for n, s in v.items()} if k in _NAMED_SCHEMAS else _optional_nullable(v)
        )
        for k, v in node.items()
    }
    if isinstance(out.get("properties"), dict):
        required = set(out.get("required", []))
        out["properties"] = {n: (s if n in required else _nullable(s)) for n, s in out["properties"].items()}
    return out


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    """``prop`` also accepting null: a type list where that is exact, else ``anyOf`` with null."""
    if _accepts_null(prop):
        return prop
    kind = prop.get("type")
    if isinstance(kind, str) and "enum" not in prop and "const" not in prop:
        return {**prop, "type": [kind, "null"]}
    annotations = {k: v for k, v in prop.items() if k in ("description", "default")}
    inner = {k: v for k, v in prop.items() if k not in annotations}
    return {"anyOf": [inner, {"type": "null"}], **annotations}


def _accepts_null(prop: dict[str, Any]) -> bool:
    kind = prop.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(isinstance(o, dict) and _accepts_null(o) for o in prop.get("anyOf", []))


def _strict(node: Any) -> Any:
    """OpenAI's strict-mode subset of an (already nullable-optional) schema."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: ({n: _strict(s) for n, s in v.items()} if k in _NAMED_SCHEMAS else _strict(v))
        for k, v in node.items()
        if k not in STRICT_UNSUPPORTED
    }
    if out.get("type") == "object" or "properties" in out:
        out["properties"] = out.get("properties", {})
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


def tidy_schema(node: Any) -> Any:
    """Drop pydantic's titles and ``default: null`` (noise to a model); the constraints stay as they are."""
    if isinstance(node, dict):
        kept = {k: v for k, v in node.items() if k != "title" and not (k == "default" and v is None)}
        return {k: tidy_schema(v) for k, v in kept.items()}
    if isinstance(node, list):
        return [tidy_schema(v) for v in node]
    return node
