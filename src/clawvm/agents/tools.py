"""Memory operations as tools an LLM can call: OpenAI function-calling schemas plus a dispatcher.

``AgentTools(harness, session_id=..., task_id=..., agent_id=...)`` binds the tools to one scope (the
model cannot write into, roll back or forget from another session). ``schemas()`` gives the
``tools=[...]`` list of a chat-completions request; ``dispatch(name, arguments)`` runs one call and
returns a JSON-able reply, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type",
"message", ...}}`` — it never raises into the agent's loop. ``tool_message(tool_call)`` turns an
OpenAI ``tool_calls`` entry into the ``role: tool`` message to send back.

Each tool's arguments are a pydantic model (:mod:`clawvm.agents.tool_schemas`); its JSON schema *is* the
published schema, and arguments are validated against it strictly (no coercion: ``"5"`` is not an
integer, while ``5.0`` is, as in JSON Schema), unknown names rejected. An optional argument may be sent
as ``null``, meaning "not given".
``schemas(strict=True)`` is the variant for OpenAI's strict mode (``"strict": true``): every property is
listed in ``required`` (the optional ones are nullable instead) and the keywords strict mode does not
take (bounds, lengths, patterns, formats, defaults) are left out; the dispatcher still enforces them.
Memory ids may be given in full or as the 8-character short id shown in a built context.

Tools: record_memory, recall_memory, list_memories, get_memory, update_memory, build_context, checkpoint,
rollback, pin_memory, forget_memory, summarize_task. Each also has a result schema (``result_schema``:
what ``result`` holds on success) and an :class:`Effect` (reads only, destroys, idempotent), which the MCP
server publishes as tool annotations. ``update_memory`` goes through :meth:`Harness.update` (a new
revision, compare-and-set on the version), like every other change.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import pydantic

from clawvm.agents.tool_schemas import (
    ADDS,
    OVERWRITES,
    READS,
    RECALL_CLIP,
    SHORT_ID_LENGTH,
    BuildContextArgs,
    CheckpointArgs,
    CheckpointResult,
    ContextResult,
    Effect,
    ForgetMemoryArgs,
    ForgetResult,
    GetMemoryArgs,
    ListMemoriesArgs,
    ListResult,
    MemoryBrief,
    MemoryDetail,
    PinMemoryArgs,
    PinResult,
    RecallMemoryArgs,
    RecallResult,
    RecordMemoryArgs,
    RecordResult,
    RollbackArgs,
    RollbackResult,
    ScoredMemory,
    SummarizeResult,
    SummarizeTaskArgs,
    ToolArgs,
    ToolResult,
    UpdateMemoryArgs,
    UpdateResult,
    json_schema,
    tidy_schema,
)
from clawvm.agents.toolcalls import bound_scope
from clawvm.core.errors import (
    AccessDeniedError,
    ConflictError,
    NotFoundError,
    RateLimitError,
    StateConflictError,
    UpstreamError,
    ValidationError,
)
from clawvm.core.ids import is_valid_id
from clawvm.core.model import Memory, is_snapshot
from clawvm.recall.retrieval import Recalled
from clawvm.store.base import StoreReader
from clawvm.vm import checkpoint as checkpoints
from clawvm.vm.checkpoint import RollbackReport
from clawvm.vm.context import Context, short_id
from clawvm.vm.tiers import Pager

log = logging.getLogger("clawvm.agents.tools")


class ToolsHost(Protocol):
    """The harness operations the LLM-facing tools dispatch to."""

    tenant: str

    @property
    def store(self) -> StoreReader: ...

    def now(self) -> datetime: ...

    def record(self, content: Any, **fields: Any) -> Memory: ...

    def recall(
        self, query: str, k: int = 10, *, track: bool = True, **filters: Any
    ) -> builtins.list[Recalled]: ...

    def context(
        self,
        query: str,
        *,
        budget_tokens: int = 2000,
        session_id: str | None = None,
        task_id: str | None = None,
        agent_id: str | None = None,
        tools: Sequence[str] | None = None,
        read_only: bool = False,
    ) -> Context: ...

    def checkpoint(self, session_id: str, name: str) -> str: ...

    @property
    def pager(self) -> Pager: ...

    def update(self, memory_id: str, *, expected_version: int | None = None, **changes: Any) -> Memory: ...

    def count(self, **filters: Any) -> int: ...

    def rollback(
        self, checkpoint_id: str, *, guard: Callable[[Sequence[Memory]], None] | None = None
    ) -> RollbackReport: ...

    def get(self, memory_id: str) -> Memory: ...

    def pin(self, memory_id: str) -> Memory: ...

    def forget(self, memory_id: str, *, expected_version: int | None = None) -> None: ...

    def collapse_task(self, task_id: str) -> Memory | None: ...

    def list(self, limit: int = 100, **filters: Any) -> builtins.list[Memory]: ...

    def iter_all(
        self, *, newest_first: bool = False, batch: int = 500, **filters: Any
    ) -> Iterator[Memory]: ...


@dataclass(frozen=True)
class _Tool:
    args: type[ToolArgs]
    result: type[ToolResult]
    run: Callable[[Any], ToolResult]
    effect: Effect


class AgentTools:
    """The memory tools bound to one harness and one scope (see the module docstring)."""

    def __init__(
        self,
        harness: ToolsHost,
        *,
        session_id: str | None = None,
        task_id: str | None = None,
        agent_id: str | None = None,
        record_usage: bool = True,
    ) -> None:
        self.harness = harness
        self.scope = bound_scope(session_id, task_id, agent_id)
        self.record_usage = record_usage  # False: recall and context write nothing (a read-only caller)
        self._tools: dict[str, _Tool] = {
            "record_memory": _Tool(RecordMemoryArgs, RecordResult, self._record, ADDS),
            "recall_memory": _Tool(RecallMemoryArgs, RecallResult, self._recall, READS),
            "list_memories": _Tool(ListMemoriesArgs, ListResult, self._list, READS),
            "get_memory": _Tool(GetMemoryArgs, MemoryDetail, self._get, READS),
            "update_memory": _Tool(UpdateMemoryArgs, UpdateResult, self._update, OVERWRITES),
            "build_context": _Tool(BuildContextArgs, ContextResult, self._context, READS),
            "checkpoint": _Tool(CheckpointArgs, CheckpointResult, self._checkpoint, ADDS),
            "rollback": _Tool(RollbackArgs, RollbackResult, self._rollback, OVERWRITES),
            "pin_memory": _Tool(
                PinMemoryArgs, PinResult, self._pin, Effect(read_only=False, idempotent=True)
            ),
            "forget_memory": _Tool(
                ForgetMemoryArgs,
                ForgetResult,
                self._forget,
                Effect(read_only=False, destructive=True, idempotent=True),
            ),
            "summarize_task": _Tool(SummarizeTaskArgs, SummarizeResult, self._summarize, ADDS),
        }

    # ---- the published interface ---------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def parameters(self, name: str, *, strict: bool = False) -> dict[str, Any]:
        """The JSON schema of ``name``'s arguments (``strict``: OpenAI's strict-mode subset of it)."""
        return json_schema(self._tools[name].args, strict=strict)

    def result_schema(self, name: str) -> dict[str, Any]:
        """The JSON schema of ``name``'s ``result`` (a successful reply's payload)."""
        schema: dict[str, Any] = tidy_schema(self._tools[name].result.model_json_schema())
        return schema

    def effect(self, name: str) -> Effect:
        return self._tools[name].effect

    def description(self, name: str) -> str:
        return " ".join((self._tools[name].args.__doc__ or name).split())

    def schemas(self, *, strict: bool = False) -> list[dict[str, Any]]:
        """The ``tools`` list of an OpenAI chat-completions request (``strict``: for strict mode)."""
        tools: list[dict[str, Any]] = []
        for name in self._tools:
            function: dict[str, Any] = {
                "name": name,
                "description": self.description(name),
                "parameters": self.parameters(name, strict=strict),
            }
            if strict:
                function["strict"] = True
            tools.append({"type": "function", "function": function})
        return tools

    def dispatch(self, name: str, arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
        """Run one tool call; returns ``{"ok": true, "result": ...}`` or a structured error. Never raises."""
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return error_reply(
                "unknown_tool", f"no tool named {name!r}", field="name", fix=f"use one of {self.names}"
            )
        try:
            args = tool.args.model_validate(_parse(arguments))
            return {"ok": True, "result": tool.run(args).model_dump(mode="json")}
        except _BadJSON as exc:
            return error_reply("invalid_json", str(exc), field=exc.field, fix=exc.fix)
        except pydantic.ValidationError as exc:
            return _validation_error(exc)
        except _OutOfScope as exc:  # found, but not in scope: "use an id from the context" would mislead
            return error_reply("not_found", str(exc), field=exc.field, fix=exc.fix)
        except NotFoundError as exc:
            fix = "use an id from recall_memory or the context"
            return error_reply("not_found", str(exc), field=exc.field, fix=fix)
        except ConflictError as exc:
            return error_reply(
                "conflict", str(exc), fix="read the memory again (get_memory) and retry the call"
            )
        except StateConflictError as exc:  # a ValidationError of the memory's state, not of the call
            return error_reply("invalid_state", str(exc), field=exc.field, fix=exc.fix)
        except ValidationError as exc:
            return error_reply("invalid_request", str(exc), field=exc.field, fix=exc.fix)
        except AccessDeniedError as exc:
            return error_reply("forbidden", str(exc), field=exc.field, fix=exc.fix)
        except RateLimitError as exc:
            return error_reply("rate_limited", str(exc), fix=f"retry in {exc.retry_after_s:g} s")
        except UpstreamError as exc:  # a model the harness called (a summarizer): nothing was changed
            log.warning("tool %s: %s", name, exc)
            return error_reply(
                "upstream_failed",
                f"{type(exc).__name__}: a model {name} needs failed; nothing was changed",
                fix="retry later, or go on without it",
            )
        except Exception as exc:  # a failure must not crash the agent's loop: report it as a tool error
            return _internal_error(name, exc)

    def tool_message(self, tool_call: Any) -> dict[str, Any]:
        """An OpenAI ``tool_calls`` entry -> the ``{"role": "tool", ...}`` message with the reply. The entry
        as a dict or as the OpenAI SDK's object (``message.tool_calls[i]``: anything with ``model_dump``)."""
        if not isinstance(tool_call, Mapping) and callable(getattr(tool_call, "model_dump", None)):
            tool_call = tool_call.model_dump()
        fn = tool_call.get("function") if isinstance(tool_call, Mapping) else None
        call_id = tool_call.get("id") if isinstance(tool_call, Mapping) else None
        if not isinstance(fn, Mapping):  # (an id may be missing: some OpenAI-compatible servers leave it out)
            reply = error_reply(
                "invalid_request",
                "tool_call: is not an OpenAI tool call (a function with a name and arguments)",
                field="tool_call",
                fix="pass an entry of the assistant message's tool_calls",
            )
        else:
            reply = self.dispatch(str(fn.get("name")), fn.get("arguments"))
        answered = call_id if isinstance(call_id, str) else ""
        return {"role": "tool", "tool_call_id": answered, "content": json.dumps(reply)}

    # ---- the tools -----------------------------------------------------------------------------------------
    def _record(self, a: RecordMemoryArgs) -> RecordResult:
        parent = self._resolve(a.parent_id, field="parent_id").id if a.parent_id else None
        m = self.harness.record(
            a.content,
            kind=a.kind,
            state=a.state,
            tags=a.tags,
            parent_id=parent,
            pinned=a.pinned,
            metadata={"recorded_by": "agent"},
            **self.scope,
        )
        return RecordResult(id=m.id, short_id=short_id(m.id), kind=m.kind.value)

    def _recall(self, a: RecallMemoryArgs) -> RecallResult:
        if a.scope == "task":  # no task bound: the filter below left the task out and searched every session
            self._bound(
                "task_id", 'recall_memory\'s scope "task" searches a task', 'bind one, or use scope "session"'
            )
        scope = {
            "session": self.scope,
            "task": {k: v for k, v in self.scope.items() if k != "session_id"},
            "all": {k: v for k, v in self.scope.items() if k == "agent_id"},
        }[a.scope]
        filters: dict[str, Any] = {**scope, "kind": a.kind, "tags": a.tags or None}
        hits = self.harness.recall(a.query, k=a.k, track=self.record_usage, **filters)
        return RecallResult(
            memories=[ScoredMemory(**_brief(h.memory).model_dump(), score=round(h.score, 4)) for h in hits]
        )

    def _list(self, a: ListMemoriesArgs) -> ListResult:
        filters: dict[str, Any] = {**self.scope, "kind": a.kind, "tags": a.tags or None}
        found = self.harness.list(limit=a.limit, **filters)
        return ListResult(memories=[_brief(m) for m in found], total=self.harness.count(**filters))

    def _get(self, a: GetMemoryArgs) -> MemoryDetail:
        # what the tools can show it (recall_memory's scope "all", the context's recalled lines) it can open;
        # the writes (update, forget) stay within the bound scope
        return _detail(self._resolve(a.memory_id, self._readable))

    def _update(self, a: UpdateMemoryArgs) -> UpdateResult:
        changes = a.model_dump(include={"content", "tags", "state"}, exclude_none=True)
        if not changes:
            raise ValidationError("arguments", "change nothing", "pass content, tags or state")
        current = self._writable(a.memory_id)
        m = self.harness.update(current.id, expected_version=a.expected_version, **changes)
        return UpdateResult(id=m.id, short_id=short_id(m.id), version=m.version, fields=sorted(changes))

    def _context(self, a: BuildContextArgs) -> ContextResult:
        ctx = self.harness.context(
            a.query,
            budget_tokens=a.budget_tokens,
            tools=a.tools,
            session_id=self.scope.get("session_id"),
            task_id=self.scope.get("task_id"),
            agent_id=self.scope.get("agent_id"),
            read_only=not self.record_usage,
        )
        return ContextResult(text=ctx.text, tokens=ctx.tokens, budget=ctx.budget, ids=ctx.ids)

    def _checkpoint(self, a: CheckpointArgs) -> CheckpointResult:
        return CheckpointResult(checkpoint_id=self.harness.checkpoint(self._session("checkpoint"), a.name))

    def _rollback(self, a: RollbackArgs) -> RollbackResult:
        session = self._session("rollback")
        try:
            snap = self.harness.get(a.checkpoint_id) if is_valid_id(a.checkpoint_id) else None
        except NotFoundError:
            snap = None
        if snap is None or not is_snapshot(snap) or snap.session_id != session:
            raise ValidationError(
                "checkpoint_id", "is not a checkpoint of this session", "pass an id returned by checkpoint"
            )
        agent = self.scope.get("agent_id")

        def own_only(memories: Sequence[Memory]) -> None:
            if any(m.agent_id != agent for m in memories):
                raise ValidationError(
                    "checkpoint_id",
                    "would change memories of this session that are not this agent's own",
                    "roll it back from the harness (Harness.rollback), not from one agent's tools",
                )

        if agent is not None:  # a rollback changes the whole session's memories, whoever made them
            h = self.harness
            # what the harness keeps moving (tiers, values, usage: a context build counts its lines) is
            # no other agent's own change. Asked first (it writes nothing: a refused rollback decompresses
            # nothing either), and again by the rollback itself as it writes (guard): another agent's
            # memory made in between would have been obsoleted
            ignore = checkpoints.BOOKKEEPING
            # (with the pager: a pin of the checkpoint's that no longer fits is not restored, as the rollback
            # decides it)
            now = h.now()
            own_only(checkpoints.would_change(h.store, snap.id, now, h.tenant, ignore=ignore, pager=h.pager))
        report = self.harness.rollback(snap.id, guard=None if agent is None else own_only)
        return RollbackResult(
            checkpoint_id=report.checkpoint_id,
            restored=len(report.restored),
            obsoleted=len(report.obsoleted),
        )

    def _pin(self, a: PinMemoryArgs) -> PinResult:
        m = self.harness.pin(self._writable(a.memory_id).id)
        return PinResult(id=m.id, short_id=short_id(m.id), pinned=m.pinned)

    def _forget(self, a: ForgetMemoryArgs) -> ForgetResult:
        m = self._writable(a.memory_id)
        self.harness.forget(m.id, expected_version=a.expected_version)
        return ForgetResult(id=m.id, short_id=short_id(m.id), forgotten=True)

    def _summarize(self, a: SummarizeTaskArgs) -> SummarizeResult:
        task = a.task_id or self.scope.get("task_id")
        if not task:
            raise ValidationError("task_id", "is missing and no task is bound", "pass task_id")
        if self._others_in("task_id", task, state="intermediate", status="active"):
            # collapse_task archives every step of the task, whoever wrote it, and quotes them
            raise ValidationError(
                "task_id",
                "has steps outside this agent's scope (other agents or sessions) as well",
                "summarize a task of your own",
            )
        summary = self.harness.collapse_task(task)
        if summary is None:
            reason = f"task {task!r} has no intermediate steps to summarize"
            return SummarizeResult(summary_id=None, short_id=None, content=None, reason=reason)
        return SummarizeResult(
            summary_id=summary.id, short_id=short_id(summary.id), content=summary.content, reason=None
        )

    # ---- helpers -------------------------------------------------------------------------------------------
    def _others_in(self, field: str, value: str, **filters: Any) -> bool:
        """Whether the memories whose ``field`` is ``value`` (and ``filters``) reach outside the bound
        session and agent: a tool that changes all of them at once (a task's summary) would change
        memories this agent may not even read."""
        filters = {**filters, field: value}
        bound = {k: v for k, v in self.scope.items() if k in ("session_id", "agent_id") and k != field}
        return bool(bound) and self.harness.count(**filters) != self.harness.count(**filters, **bound)

    def _session(self, tool: str) -> str:
        return self._bound("session_id", f"{tool} works on a session")

    def _bound(self, field: str, needed: str, fix: str = "bind one") -> str:
        """The bound ``field`` (session_id, task_id), refused saying ``needed`` (why the call needs it)
        when none is bound."""
        value = self.scope.get(field)
        if not value:
            raise ValidationError(field, f"is not bound, and {needed}", fix)
        return str(value)

    @property
    def _readable(self) -> dict[str, Any]:
        """The scope a read may reach: the bound agent's memories (every session's, as recall_memory's
        scope "all" and the context's retrieved lines show them)."""
        return {k: v for k, v in self.scope.items() if k == "agent_id"}

    def _writable(self, memory_id: str) -> Memory:
        """A memory the writes may change: one of the bound scope. One the tools can show but not change
        (another session's, from a context's recalled lines or recall_memory's scope "all") is refused
        saying so: "not found, use an id from the context" sent the model back to the id it had used."""
        m = self._resolve(memory_id, self._readable)
        for name, bound in self.scope.items():
            if getattr(m, name) != bound:
                raise _OutOfScope(memory_id, name.removesuffix("_id"), getattr(m, name))
        return m

    def _resolve(
        self, memory_id: str, within: Mapping[str, Any] | None = None, field: str = "memory_id"
    ) -> Memory:
        """A memory of ``within`` (default: the bound scope) by full id or short id (NotFoundError
        otherwise); errors name ``field``, the argument that held the id."""
        within = self.scope if within is None else within
        if is_valid_id(memory_id):
            try:
                m = self.harness.get(memory_id)
            except NotFoundError:
                raise NotFoundError("memory", memory_id, field=field) from None
            if all(getattr(m, k) == v for k, v in within.items()):
                return m
            raise NotFoundError("memory", memory_id, field=field)
        wanted = memory_id.strip().lower().lstrip("[").rstrip("]")
        if len(wanted) != SHORT_ID_LENGTH:
            raise ValidationError(
                field, f"is {memory_id!r}", "pass a full id or the 8-character short id (its last 8)"
            )
        # the bound scope first: proving a short id unique over every session of the agent (or the tenant)
        # read all its memories, seconds at 60k, for the ids a model cites most, its session's own
        for scope in dict.fromkeys([tuple(self.scope.items()), tuple(within.items())]):
            found: list[Memory] = []  # newest first (recent ones are cited), paged; two are enough
            for m in self.harness.iter_all(newest_first=True, status="any", **dict(scope)):
                if short_id(m.id) == wanted:
                    found.append(m)
                    if len(found) > 1:
                        break
            if found:
                break
        if len(found) != 1:
            raise NotFoundError("memory", memory_id, field=field)
        return found[0]


class _OutOfScope(NotFoundError):
    """A memory the tools may read but not change: its session (or task) is not the bound one. The writes'
    ``not_found`` (no such memory in their scope), with the reason and a fix that fits it."""

    def __init__(self, memory_id: str, where: str, owner: str | None) -> None:
        super().__init__("memory", memory_id, field="memory_id")
        self.problem = (
            f"belongs to {'no' if owner is None else 'another'} {where} and cannot be changed from this one"
        )
        self.fix = (
            f"change only this {where}'s memories; to correct one here, record a memory (record_memory)"
        )

    def __str__(self) -> str:
        return f"memory {self.ident!r} {self.problem}"


class _BadJSON(Exception):
    """Arguments that are no JSON object (``field``: the key at fault, where one is)."""

    def __init__(
        self, message: str, field: str | None = None, fix: str = "send the arguments as a JSON object"
    ) -> None:
        super().__init__(message)
        self.field = field
        self.fix = fix


def _parse(arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if arguments is None or arguments == "":
        return {}
    parsed: Any = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments, parse_constant=_not_json, object_pairs_hook=_once_each)
        except json.JSONDecodeError as exc:
            raise _BadJSON(f"arguments are not valid JSON ({exc.msg} at {exc.pos})") from None
        except RecursionError:  # "[[[[..." deeper than the decoder's stack: no tool takes such arguments
            raise _BadJSON("arguments are nested too deeply to decode") from None
        except ValueError:  # an integer past Python's digit limit: it answered "internal, retry"
            raise _BadJSON("arguments hold a number with more digits than any argument takes") from None
    if not isinstance(parsed, Mapping):
        raise _BadJSON(f"arguments are {_json_type(parsed)}, not an object")
    return dict(parsed)


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A decoded JSON object whose keys are given once each. Python's decoder keeps a repeated key's last
    value without a word (``{"content": "x", "content": "y"}`` recorded "y"), and model-written JSON is
    where that happens; refused naming the key, as the REST API refuses such a body."""
    obj = dict(pairs)
    if len(obj) == len(pairs):  # the usual case: one dict, one length comparison
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _BadJSON(
                f"{key}: is given more than once in one JSON object",
                field=key,
                fix="give each key once (only one of the values would be read)",
            )
        seen.add(key)
    raise AssertionError("no key is repeated")  # called only when the dict came out shorter


def _not_json(name: str) -> Any:
    """NaN, Infinity and -Infinity: Python's decoder takes them, JSON has no such numbers."""
    raise _BadJSON(f"arguments are not valid JSON ({name} is not a JSON number)")


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, with its article ("an integer", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "an integer" if value.is_integer() else "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "a value JSON does not have"


# pydantic's type errors -> the JSON type they expected (their own messages name Python's types at times)
_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}


def _problem(e: Mapping[str, Any]) -> str:
    """One validation error in JSON's terms."""
    return _problem_and_fix(e)[0]


def _problem_and_fix(e: Mapping[str, Any]) -> tuple[str, str]:
    """One validation error in JSON's terms, and what the caller should send instead."""
    kind, got, ctx = e["type"], e.get("input"), e.get("ctx", {})
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_json_type(got)}", f"send {_EXPECTED[kind]}"
    if kind in ("literal_error", "enum"):
        allowed = ctx.get("expected", "the listed values")
        return f"expected one of {allowed}, got {_shown(got)}", f"use one of {allowed}"
    if kind == "missing":
        return "is required", "add it"
    if kind == "extra_forbidden":
        return "is not an argument of this tool", "leave it out (the tool's schema lists the arguments)"
    bound = _BOUNDS.get(kind)
    if bound is not None:
        word, limit_key = bound
        shown = json.dumps(got) if isinstance(got, (int, float)) else _shown(got)
        return (
            f"is {shown}; it must be {word} {ctx.get(limit_key)}",
            f"pass a value {word} {ctx.get(limit_key)}",
        )
    if kind in ("string_too_short", "too_short"):
        least = ctx.get("min_length")
        if least == 1:
            return "is empty", "pass a non-empty value"
        return f"is shorter than {least}", f"pass at least {least} (characters or items)"
    if kind in ("string_too_long", "too_long"):
        most = ctx.get("max_length")
        return f"is longer than {most}", f"pass at most {most} (characters or items)"
    return str(e["msg"]), "correct the arguments to match the tool's schema"


# pydantic's bound errors: (what the bound says, the ctx key holding it)
_BOUNDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("more than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}


def _shown(value: Any) -> str:
    """A wrong value as a short JSON text (containers only by type: they may be arbitrarily deep)."""
    if value is None or isinstance(value, (Mapping, list, tuple)):
        return _json_type(value)
    text = json.dumps(value[:60] if isinstance(value, str) else value)
    return f"{_json_type(value)} {text}"


def _internal_error(tool: str, exc: Exception) -> dict[str, Any]:
    """A failure inside the memory service (a store, the keys, a summarizer, a bug): the agent learns which
    kind and that a retry may help, the log keeps the message (as the REST API's 5xx replies: a store's
    message may name files and SQL, which a remote MCP client must not see)."""
    log.error("tool %s failed", tool, exc_info=exc)
    return error_reply(
        "internal",
        f"{type(exc).__name__}: {tool} failed inside the memory service; its log has the details",
        fix="retry the call; if it fails again, go on without it and tell whoever runs the memory service",
    )


def error_reply(
    kind: str, message: str, *, field: str | None = None, fix: str | None = None
) -> dict[str, Any]:
    """A tool's structured error reply: ``{"ok": false, "error": {type, message, field?, fix?}}``."""
    error: dict[str, Any] = {"type": kind, "message": message}
    if field is not None:
        error["field"] = field
    if fix is not None:
        error["fix"] = fix
    return {"ok": False, "error": error}


def _validation_error(exc: pydantic.ValidationError) -> dict[str, Any]:
    errors = exc.errors(include_url=False)
    problems = [
        {"field": ".".join(str(p) for p in e["loc"]) or "arguments", "problem": _problem(e)} for e in errors
    ]
    first = problems[0]
    reply = error_reply(
        "invalid_arguments",
        f"{first['field']}: {first['problem']}",
        field=first["field"],
        fix=f"{first['field']}: {_problem_and_fix(errors[0])[1]}",
    )
    reply["error"]["problems"] = problems
    return reply


def _brief(m: Memory) -> MemoryBrief:
    text = m.content if len(m.content) <= RECALL_CLIP else m.content[:RECALL_CLIP] + "…"
    return MemoryBrief(
        id=m.id,
        short_id=short_id(m.id),
        kind=m.kind.value,
        state=m.state.value if m.state else None,
        tool_name=m.tool_name,
        created_at=m.created_at.isoformat(),
        content=text,
    )


def _detail(m: Memory) -> MemoryDetail:
    return MemoryDetail(
        id=m.id,
        short_id=short_id(m.id),
        kind=m.kind.value,
        state=m.state.value if m.state else None,
        status=m.status.value,
        content=m.content,
        tags=m.tags,
        pinned=m.pinned,
        version=m.version,
        session_id=m.session_id,
        task_id=m.task_id,
        agent_id=m.agent_id,
        tool_name=m.tool_name,
        parent_id=m.parent_id,
        created_at=m.created_at.isoformat(),
    )


__all__ = ["AgentTools", "Effect", "json_schema"]
