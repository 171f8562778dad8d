"""Automatic recording of tool calls: the harness writes the trail, the model does not have to.

Every call of a recorded tool (``@harness.tool(...)`` on any sync or async callable, or
``with harness.tool_call(...)`` around any code) leaves two linked memories:

1. before the tool runs, a ``tool_call`` memory in state PENDING whose content is the call in the tool's
   standard format (default: ``{"tool": name, "args": {...}}``, arguments bound to parameter names,
   defaults applied, ``redact``-ed names replaced by ``"***"``, an argument longer than a result may be
   (``MAX_RESULT_CHARS``) cut as a result is: ``… (truncated, N characters in all)``, so that one over the
   store's content limit still lets the tool run);
2. when it returns, a ``tool_result`` memory in state SUCCESS, ``parent_id`` = the call, content formatted
   by the tool's template (one standard format per tool), ``cost.seconds`` = the call's duration (plus
   tokens/money from the tool's ``cost`` function or :meth:`ToolCall.add_cost`). When it raises — or its
   validator rejects the result — the ``tool_result`` is in state ERROR with content
   ``"<ExceptionType>: <message>"`` and ``metadata.tool_result.error`` = type, message, the last frames
   of the traceback and whether it was a timeout. An invalid result raises
   :class:`~clawvm.core.errors.InvalidToolResultError` to the caller: it is never passed on silently. A
   call cut off from outside (its task cancelled, by a timeout around it or a shutdown; Ctrl-C) is
   recorded ``interrupted``, as :func:`restore` records a crashed one, not as the tool's error. A
   failing recording template or cost function is the record's problem, not the tool's: the result is
   recorded in the default format, returned, and the failure noted (``recording_errors``) and logged.

The call memory then takes the outcome's state (SUCCESS/ERROR) and points to its result
(``metadata.tool_call.result_id``), so only calls still running — or whose process died — are PENDING.
:func:`restore` (``Harness.restore_session``) finds the PENDING calls of a session whose process is gone
and marks each ``interrupted``: tag ``interrupted``, ``metadata.tool_call.status = "interrupted"``, an
ERROR ``tool_result`` saying so (so the next context shows the agent what happened) and a
``tool_interrupted`` event. The call takes its result's state, ERROR, as a finished call does: PENDING
means running, and an agent that picks up its PENDING calls must not run a crashed deploy again as if
it had never started (whether it took effect is unknown; the result says so).

Scope (session, task, agent, tags) comes from, in order: the call's own arguments, the innermost
:func:`scope` block, the decorator's defaults.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import functools
import inspect
import json
import logging
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

from clawvm.core.errors import ConflictError, InvalidToolResultError, StateConflictError, ValidationError
from clawvm.core.model import Cost, Kind, Memory, State, Status, canonical_json, capped_tags
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.write.commit import Recorder

log = logging.getLogger(__name__)


class ToolHost(Recorder, Protocol):
    """What recording tool calls needs of the harness: its own record/update/list/get (scope filters,
    grant checks and the pager apply to the trail like to any memory)."""

    def list(self, limit: int = 100, **filters: Any) -> builtins.list[Memory]: ...

    def iter_all(
        self, *, newest_first: bool = False, batch: int = 500, **filters: Any
    ) -> Iterator[Memory]: ...

    def get(self, memory_id: str) -> Memory: ...


F = TypeVar("F", bound=Callable[..., Any])

#: What a template may be: a ``str.format`` pattern over ``result``, ``args`` and ``tool``, or a callable
#: taking the result and returning text or a JSON-able dict/list.
Template = str | Callable[[Any], Any]
#: A validator returns None/True when the result is fine, or False / a reason string when it is not
#: (raising counts as "not fine", with the exception as the reason).
Validator = Callable[[Any], bool | str | None]

INTERRUPTED = "interrupted"
#: What cuts a call off from outside rather than failing it: recorded ``interrupted`` (see ToolCall.fail)
CUT_OFF: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
)
TIMEOUT = "timeout"
MAX_RESULT_CHARS = 8000
TRACEBACK_FRAMES = 3
_SCOPE_FIELDS = ("session_id", "task_id", "agent_id")

_current_scope: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "clawvm_tool_scope", default=None
)
_in_flight: set[str] = set()  # ids of calls running in this process (restore must not touch them)
_in_flight_lock = threading.Lock()


@dataclass(frozen=True)
class ToolSpec:
    """How one tool's calls are recorded. Built by the decorator or by ``Harness.tool_call``."""

    name: str
    template: Template | None = None
    call_template: Template | None = None
    validator: Validator | None = None
    cost: Callable[[Any], Mapping[str, Any]] | None = None
    timeout_errors: tuple[type[BaseException], ...] = ()
    redact: frozenset[str] = frozenset()
    fallback_for: str | None = None  # this tool is a known fallback for that one (see reliability)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # session_id/task_id/agent_id/tags

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValidationError("name", f"is {self.name!r}", "name the tool with a non-empty string")
        _check_scope_fields(self.defaults)
        for name in ("validator", "cost"):  # else the tool ran first and its result was blamed
            given = getattr(self, name)
            if given is not None and not callable(given):
                raise ValidationError(
                    name, f"is a {type(given).__name__} ({given!r})", "pass a function of the result, or None"
                )
        # callers pass lists; keep the frozen spec hashable and its lookups cheap
        object.__setattr__(self, "redact", frozenset(self.redact))
        object.__setattr__(self, "timeout_errors", tuple(self.timeout_errors))


def spec_options(options: Mapping[str, Any]) -> None:
    """Refuse what is not a :class:`ToolSpec` option (``Harness.tool_call``'s keyword arguments)."""
    known = [f.name for f in fields(ToolSpec) if f.name not in ("name", "defaults")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValidationError(
            unknown[0],
            "is not an option of a tool call",
            f"use {', '.join([*_SCOPE_FIELDS, 'tags', *known])}",
        )


def scope_fields(
    session_id: str | None = None, task_id: str | None = None, agent_id: str | None = None
) -> dict[str, Any]:
    """The scope fields that are set (None and blank ones left out, as a memory recorded with a blank one
    has none: kept, "   " scoped reads to a session that the same scope's records never had)."""
    given = {"session_id": session_id, "task_id": task_id, "agent_id": agent_id}
    return {name: value for name, value in given.items() if value and value.strip()}


def bound_scope(
    session_id: str | None = None, task_id: str | None = None, agent_id: str | None = None
) -> dict[str, Any]:
    """:func:`scope_fields` for a binding that confines what it reads and writes to its scope (agent tools,
    a callback handler): a blank or non-text id is refused. Left out as blank, ``session_id=""`` (an empty
    environment variable) unbound the agent tools, which then read and forgot every session's memories."""
    for name, value in (("session_id", session_id), ("task_id", task_id), ("agent_id", agent_id)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValidationError(name, f"is {value!r}", f"pass a non-empty {name}, or None for none")
    return scope_fields(session_id, task_id, agent_id)


@contextmanager
def scope(**fields: Any) -> Iterator[None]:
    """Record every tool call made inside this block (this thread/task) with these scope fields.

    Accepts ``session_id``, ``task_id``, ``agent_id``, ``tags``, and ``parent_id``: the memory of the LLM
    turn that asked for these calls (each call is recorded under it, so a run's trace shows which thought
    asked for which tool); nested blocks add to the outer one.
    """
    _check_scope_fields(fields)
    token = _current_scope.set({**(_current_scope.get() or {}), **fields})
    try:
        yield
    finally:
        _current_scope.reset(token)


class ToolCall:
    """One recorded call. Use as a (sync or async) context manager, or drive ``start``/``succeed``/``fail``.

    Inside a ``with`` block, :meth:`set_result` hands over the result (validated and formatted on exit);
    an exception leaving the block is recorded as ERROR and re-raised.
    """

    def __init__(
        self,
        harness: ToolHost,
        spec: ToolSpec,
        args: Mapping[str, Any] | None = None,
        *,
        parent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        **scope_fields: Any,
    ) -> None:
        self.harness = harness
        self.spec = spec
        if args is not None and not isinstance(args, Mapping):
            raise ValidationError(
                "args", f"is a {type(args).__name__}", "pass the call's arguments as a dict of name -> value"
            )
        given = {k: ("***" if k in spec.redact else _jsonable(v)) for k, v in (args or {}).items()}
        self.args: dict[str, Any] = {k: self._recorded_arg(v) for k, v in _well_formed(given).items()}
        resolved = _resolve_scope(spec, scope_fields)
        scoped_parent = resolved.pop("parent_id", None)
        # the LLM turn that asked, if known; one given that is no id is refused by the record's check
        self.parent_id = scoped_parent if parent_id is None else parent_id
        # the caller's own keys beside ``tool_call`` (a framework's run ids, say); ``tool_call`` stays ours
        self.metadata = {k: v for k, v in (metadata or {}).items() if k != "tool_call"}
        self.scope = resolved
        self.call: Memory | None = None
        self.result: Memory | None = None
        self._value: Any = None
        self._has_value = False
        self._extra_cost: dict[str, float] = {"tokens": 0, "money": 0.0}
        self._t0 = 0.0
        self._clock0: datetime | None = None

    # ---- driving a call -----------------------------------------------------------------------------
    def start(self) -> Memory:
        """Record the PENDING call (before the tool runs). A call template that fails leaves the call in
        the default format (noted in ``metadata.tool_call.recording_errors``, and logged): the tool runs."""
        content, failed = None, []
        if self.spec.call_template:
            try:
                content = self._format(self.spec.call_template, self.args)
            except Exception as exc:
                failed.append(f"the tool's call template raised {type(exc).__name__}: {exc}")
                log.warning(
                    "tool %s: %s; its call is recorded in the default format", self.spec.name, failed[0]
                )
        self.call = self.harness.record(
            content if content is not None else {"tool": self.spec.name, "args": self.args},
            kind=Kind.TOOL_CALL,
            state=State.PENDING,
            tool_name=self.spec.name,
            parent_id=self.parent_id,
            metadata={
                "tool_call": {
                    "status": State.PENDING.value,
                    "args": self.args,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    **({"recording_errors": failed} if failed else {}),
                },
                **self.metadata,
            },
            **self.scope,
        )
        with _in_flight_lock:
            _in_flight.add(self.call.id)
        self._t0, self._clock0 = time.perf_counter(), self.harness.now()
        return self.call

    @property
    def value(self) -> Any:
        """The result handed over with :meth:`set_result` (what the decorated tool returns)."""
        return self._value

    def set_result(self, value: Any) -> None:
        """The tool's result, for the ``with`` form (recorded when the block exits)."""
        self._value, self._has_value = value, True

    def add_cost(self, *, tokens: int = 0, money: float = 0.0) -> None:
        """Model tokens or money the call consumed (the duration is measured by itself)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValidationError("tokens", f"is {tokens!r}", "pass a whole number of tokens, 0 or more")
        if isinstance(money, bool) or not isinstance(money, int | float) or not 0 <= money < math.inf:
            raise ValidationError("money", f"is {money!r}", "pass a finite amount, 0 or more")
        self._extra_cost["tokens"] += tokens
        self._extra_cost["money"] += money

    def succeed(self, value: Any) -> Any:
        """Validate and record ``value``; returns it, or raises InvalidToolResultError when rejected.

        The tool's recording template and cost function only shape the record: one that fails leaves the
        result recorded in the default format (``metadata.tool_result.recording_errors`` says what
        failed, and a warning is logged), returned, and counted as the success it was."""
        duration = self._elapsed()
        try:
            problem = self._check(value)
        except Exception as exc:  # a failing validator: the result cannot be vouched for
            problem = f"the tool's validator raised {type(exc).__name__}: {exc}"
        if problem is not None:
            result = self._finish(
                State.ERROR,
                f"InvalidToolResult: {problem}",
                self._cost(None, duration),
                {"error": {"type": "InvalidToolResult", "message": problem, "timeout": False}},
            )
            raise InvalidToolResultError(self.spec.name, problem, self._call_id(), result.id)
        failed: list[str] = []
        try:
            content = self._result_content(value)
        except Exception as exc:
            failed.append(f"the tool's recording template raised {type(exc).__name__}: {exc}")
            content = self._plain_content(value)
        try:
            cost = self._cost(value, duration)
        except Exception as exc:
            failed.append(f"the tool's cost function raised {type(exc).__name__}: {exc}")
            cost = self._cost(None, duration)
        for what in failed:
            log.warning("tool %s: %s; its result is recorded in the default format", self.spec.name, what)
        info: dict[str, Any] = {"recording_errors": failed} if failed else {}
        try:
            self._finish(State.SUCCESS, content if content is not None else "(no result)", cost, info)
        except StateConflictError as exc:
            if exc.field != "parent_id":
                raise
            # the call was forgotten while the tool ran: nothing to hang the result on, but the tool ran
            # and its value is the caller's (a deploy's outcome must not turn into our error)
            log.warning("tool %s: call forgotten while it ran; its result is not recorded", self.spec.name)
        return value

    def fail(self, exc: BaseException) -> Memory:
        """Record ``exc`` as the call's ERROR outcome (``interrupted`` when the caller cut the call off)."""
        if isinstance(exc, CUT_OFF):
            return self._cut_off(exc)
        timeout = is_timeout(exc, self.spec.timeout_errors)
        error = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": short_traceback(exc),
            "timeout": timeout,
        }
        return self._finish(
            State.ERROR,
            f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
            self._cost(None, self._elapsed()),
            {"error": error},
            tags=[TIMEOUT] if timeout else [],
        )

    def _cut_off(self, exc: BaseException) -> Memory:
        """The call stopped from outside while the tool ran (a task cancelled, by a timeout around it or
        a shutdown; Ctrl-C; the process exiting): not the tool's failure, and whether it took effect is
        unknown, so it is recorded as :func:`restore` records a call its dead process left: ``interrupted``
        (left out of the tool's reliability rates), never as an error of the tool."""
        name = type(exc).__name__
        error = {"type": name, "message": str(exc), "traceback": "", "timeout": False}
        return self._finish(
            State.ERROR,
            f"{self.spec.name} call interrupted ({name}): it was stopped from outside before the tool "
            "returned, so its outcome is unknown",
            self._cost(None, self._elapsed()),
            {"interrupted": True, "error": error},
            tags=[INTERRUPTED],
            status=INTERRUPTED,
        )

    def fail_reported(self, message: str, error_type: str) -> Memory:
        """Record an ERROR outcome that the tool's framework caught and returned as the tool's output (a
        LangChain tool with ``handle_tool_error``, say): no exception reaches us, only its reported text.
        It counts as an error in tool reliability like a raised one; ``error.handled`` says it was caught."""
        text = self._cut(message) if message.strip() else error_type
        error = {"type": error_type, "message": text, "traceback": "", "timeout": False, "handled": True}
        return self._finish(
            State.ERROR, f"{error_type}: {text}", self._cost(None, self._elapsed()), {"error": error}
        )

    # ---- context manager ------------------------------------------------------------------------------
    def __enter__(self) -> ToolCall:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.succeed(self._value if self._has_value else None)
            return
        try:
            self.fail(exc)
        except Exception as record_error:  # never mask the tool's own exception with ours
            exc.add_note(f"clawvm could not record this failure: {record_error!r}")

    async def __aenter__(self) -> ToolCall:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # ---- internals ------------------------------------------------------------------------------------
    def _call_id(self) -> str:
        if self.call is None:
            raise ValidationError("call", "was not started", "call start() (or enter the with block) first")
        return self.call.id

    def _elapsed(self) -> float:
        """The call's duration: the wall time measured here or the time the harness's clock moved during
        the call, whichever is longer. On the real clock the two agree; on a replay clock (a demo or a
        test scripting a slow tool by moving the clock) the scripted latency is the call's duration, so
        ``cost.seconds`` agrees with the trail's own timestamps."""
        wall = max(0.0, time.perf_counter() - self._t0)
        if self._clock0 is None:
            return wall
        return max(wall, (self.harness.now() - self._clock0).total_seconds())

    def _check(self, value: Any) -> str | None:
        if self.spec.validator is None:
            return None
        verdict = self.spec.validator(value)
        if verdict is None or verdict is True:
            return None
        if verdict is False:
            return "rejected by the validator"
        return str(verdict)

    def _result_content(self, value: Any) -> Any:
        if self.spec.template is not None:
            return self._format(self.spec.template, value)
        return self._plain_content(value)

    def _plain_content(self, value: Any) -> Any:
        """``value`` in the default format: JSON for mappings and sequences, else its text."""
        if value is None:
            return None
        if isinstance(value, Mapping | list | tuple):
            return _truncate_json(_jsonable(value), self._cut)
        text = value if isinstance(value, str) else repr(value)
        return self._cut(text) if text.strip() else "(empty result)"

    def _format(self, template: Template, value: Any) -> Any:
        """``value`` (the result; the arguments for a call template) in the template's format."""
        if isinstance(template, str):
            return self._cut(template.format(result=value, args=self.args, tool=self.spec.name))
        out = template(value)
        return self._cut(out) if isinstance(out, str) else _truncate_json(_jsonable(out), self._cut)

    def _cut(self, text: str) -> str:
        """``text`` cut to the result limit, scrubbed first: a secret across the cut would no longer be
        recognisable by the write path's redaction (and made valid UTF-8 before: its escapes count)."""
        text = _well_formed(text)
        if len(text) > MAX_RESULT_CHARS:
            text = self.harness.writer.scrub(text, self.harness.tenant)
        return _truncate(text)

    def _recorded_arg(self, value: Any) -> Any:
        """One argument as the call records it: one over the result limit is cut as a result is (scrubbed,
        then cut, with the marker). Recording must not stop the tool: an argument over the store's content
        limit (an upload's body) failed the PENDING call's record, and the tool never ran."""
        if isinstance(value, str):
            return self._cut(value) if len(value) > MAX_RESULT_CHARS else value
        if isinstance(value, Mapping | list) and value:  # (an empty one is no "(empty result)")
            return _truncate_json(value, self._cut)
        return value

    def _cost(self, value: Any, duration: float) -> Cost:
        extra = dict(self._extra_cost)
        if self.spec.cost is not None and value is not None:
            for name, amount in self.spec.cost(value).items():
                extra[name] = extra.get(name, 0) + amount
        return Cost(
            seconds=duration, tokens=int(extra.get("tokens", 0)), money=float(extra.get("money", 0.0))
        )

    def _finish(
        self,
        state: State,
        content: Any,
        cost: Cost,
        info: dict[str, Any],
        tags: Sequence[str] = (),
        status: str | None = None,
    ) -> Memory:
        """Record the result and close the call; ``status`` is the call's (default: the state's), and the
        call takes the result's ``tags`` that mark outcomes (``interrupted``)."""
        call_id = self._call_id()
        content, info = _well_formed(content), _well_formed(info)
        try:
            marks = [*tags, *([fallback_tag(self.spec.fallback_for)] if self.spec.fallback_for else [])]
            result_tags = capped_tags(marks, self.scope.get("tags", []))
            self.result = self.harness.record(
                content,
                kind=Kind.TOOL_RESULT,
                state=state,
                tool_name=self.spec.name,
                parent_id=call_id,
                cost=cost,
                metadata={"tool_result": {"call_id": call_id, "duration_s": cost.seconds, **info}},
                **{**self.scope, "tags": result_tags},
            )
            marked = [t for t in tags if t == INTERRUPTED]
            _close_call(self.harness, call_id, state, self.result.id, cost.seconds, status, marked)
            return self.result
        finally:
            with _in_flight_lock:
                _in_flight.discard(call_id)


def fallback_tag(tool: str) -> str:
    return f"fallback-for:{tool}"


def _refuse_generator(fn: Callable[..., Any]) -> None:
    """A generator tool returns before its body runs: its result was recorded at once as SUCCESS, the
    generator's repr (with a memory address), and an error raised while it was iterated never reached the
    record (nor the tool's reliability)."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise ValidationError(
            "tool",
            f"{getattr(fn, '__name__', fn)!r} is a generator function (recorded before it ran)",
            "collect what it yields in the tool (return a list, or a joined string), and decorate that",
        )


def tool(
    harness: ToolHost,
    name: str | None = None,
    *,
    template: Template | None = None,
    call_template: Template | None = None,
    validator: Validator | None = None,
    cost: Callable[[Any], Mapping[str, Any]] | None = None,
    timeout_errors: Sequence[type[BaseException]] = (),
    redact: Sequence[str] = (),
    fallback_for: str | None = None,
    **defaults: Any,
) -> Callable[[F], F]:
    """Decorator: record every call of the decorated sync or async callable (see the module docstring).

    ``defaults`` are scope fields (session_id, task_id, agent_id, tags) used when no :func:`scope`
    block gives them.
    """
    _check_scope_fields(defaults)  # fail at the decorator line, not at the first call

    def decorate(fn: F) -> F:
        _refuse_generator(fn)
        spec = ToolSpec(
            fn.__name__ if name is None else name,  # a name given blank is refused, not replaced
            template=template,
            call_template=call_template,
            validator=validator,
            cost=cost,
            timeout_errors=tuple(timeout_errors),
            redact=frozenset(redact),
            fallback_for=fallback_for,
            defaults=defaults,
        )
        signature = _signature(fn)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with ToolCall(harness, spec, bind_arguments(signature, args, kwargs)) as call:
                    call.set_result(await fn(*args, **kwargs))
                return call.value

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with ToolCall(harness, spec, bind_arguments(signature, args, kwargs)) as call:
                call.set_result(fn(*args, **kwargs))
            return call.value

        return cast(F, run)

    return decorate


# ---- restore ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RestoreReport:
    """What :func:`restore` found: calls marked interrupted now, calls whose result had been written but
    not yet linked (closed now), and calls left alone because their process is still alive."""

    session_id: str
    interrupted: list[str]
    closed: list[str]
    running_elsewhere: list[str]


def restore(harness: ToolHost, session_id: str) -> RestoreReport:
    """Mark the session's orphaned PENDING tool calls ``interrupted`` (see the module docstring).

    Call it when an agent (re)starts a session, before it makes new calls.
    """
    if not isinstance(session_id, str) or not session_id:
        raise ValidationError("session_id", f"is {session_id!r}", "pass the session id to restore")
    # oldest first, in keyset pages: a page goes on after its last call even as calls leave PENDING
    pending = harness.iter_all(session_id=session_id, kind=Kind.TOOL_CALL, state=State.PENDING)
    interrupted, closed, elsewhere = [], [], []
    for call in pending:
        if INTERRUPTED in call.tags or _running_here(call.id):
            continue
        if _owner_alive(call):
            elsewhere.append(call.id)
            continue
        # a result a rollback undid (obsolete) is no outcome: the rollback made the call PENDING again
        found = harness.list(limit=10, parent_id=call.id, kind=Kind.TOOL_RESULT, status="any")
        results = [r for r in found if r.status is not Status.OBSOLETE]
        if results:  # the process died between writing the result and closing the call
            result = results[0]
            # an interrupted outcome (cut off, or a crash marked) is the call's too, as _finish makes it
            cut = INTERRUPTED in result.tags or bool(
                result.metadata.get("tool_result", {}).get("interrupted")
            )
            marks = [INTERRUPTED] if cut else []
            status = INTERRUPTED if cut else None
            _close_call(
                harness, call.id, result.state or State.ERROR, result.id, result.cost.seconds, status, marks
            )
            closed.append(call.id)
        else:
            _mark_interrupted(harness, call)
            interrupted.append(call.id)
    return RestoreReport(session_id, interrupted, closed, elsewhere)


def _mark_interrupted(harness: ToolHost, call: Memory) -> None:
    tool_name = call.tool_name or "tool"
    info = dict(call.metadata.get("tool_call", {}))
    result = harness.record(
        f"{tool_name} call interrupted: the process stopped before the tool returned, "
        f"so its outcome is unknown (call started {call.created_at:%Y-%m-%d %H:%M:%S} UTC)",
        kind=Kind.TOOL_RESULT,
        state=State.ERROR,
        tool_name=call.tool_name,
        parent_id=call.id,
        tags=[INTERRUPTED],
        session_id=call.session_id,
        task_id=call.task_id,
        agent_id=call.agent_id,
        metadata={
            "tool_result": {
                "call_id": call.id,
                "interrupted": True,
                "error": {
                    "type": "Interrupted",
                    "message": "process ended during the call",
                    "timeout": False,
                },
            }
        },
    )
    _update(
        harness,
        call.id,
        lambda m: {
            "state": State.ERROR,
            "tags": capped_tags([INTERRUPTED], m.tags),
            "metadata": {
                **m.metadata,
                "tool_call": {**info, "status": INTERRUPTED, "result_id": result.id},
            },
        },
    )
    harness.writer.log(
        [
            Event(
                kind=EventKind.TOOL_INTERRUPTED,
                memory_id=call.id,
                tenant=call.tenant,
                at=harness.now(),
                data={"tool": call.tool_name, "session_id": call.session_id, "result_id": result.id},
            )
        ]
    )


# ---- helpers --------------------------------------------------------------------------------------------
def _close_call(
    harness: ToolHost,
    call_id: str,
    state: State,
    result_id: str,
    seconds: float,
    status: str | None = None,
    tags: Sequence[str] = (),
) -> None:
    """The call takes its outcome's state (its ``status``: the state's unless given, and ``tags``) and
    points to its result."""

    def change(m: Memory) -> dict[str, Any]:
        info = {**m.metadata.get("tool_call", {}), "status": status or state.value, "result_id": result_id}
        closed = {"state": state, "metadata": {**m.metadata, "tool_call": {**info, "duration_s": seconds}}}
        return {**closed, "tags": capped_tags(list(tags), m.tags)} if tags else closed

    _update(harness, call_id, change)


def _update(harness: ToolHost, memory_id: str, change: Callable[[Memory], dict[str, Any]]) -> Memory:
    """Update with a fresh read, retrying when the pager moved the memory in between."""
    for _ in range(10):
        current = harness.get(memory_id)
        try:
            return harness.update(memory_id, expected_version=current.version, **change(current))
        except ConflictError:
            continue
    raise ConflictError(memory_id, None, None)


def _resolve_scope(spec: ToolSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    _check_scope_fields(given)
    merged: dict[str, Any] = {**spec.defaults, **(_current_scope.get() or {})}
    merged.update({k: v for k, v in given.items() if v is not None})
    merged["tags"] = list(merged.get("tags") or [])
    return {k: v for k, v in merged.items() if v is not None}


def _check_scope_fields(fields: Mapping[str, Any]) -> None:
    allowed = (*_SCOPE_FIELDS, "tags", "parent_id")
    unknown = set(fields) - set(allowed)
    if unknown:
        raise ValidationError(sorted(unknown)[0], "is not a scope field", f"use {', '.join(allowed)}")


def _running_here(call_id: str) -> bool:
    with _in_flight_lock:
        return call_id in _in_flight


def _owner_alive(call: Memory) -> bool:
    """Whether the process that started ``call`` still runs (another process on this host, alive)."""
    info = call.metadata.get("tool_call", {})
    pid, host = info.get("pid"), info.get("host")
    if not isinstance(pid, int) or host != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def is_timeout(exc: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
    """Timeouts: ``TimeoutError`` (socket and asyncio timeouts are that class), the tool's own
    ``timeout_errors``, and client-library classes named ``*Timeout*`` (httpx, requests)."""
    return isinstance(exc, (TimeoutError, *extra)) or any(
        "timeout" in cls.__name__.lower() for cls in type(exc).__mro__
    )


def short_traceback(exc: BaseException, frames: int = TRACEBACK_FRAMES) -> str:
    """The last ``frames`` frames of ``exc``'s traceback plus its message (enough to find the line)."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-frames, chain=False)
    return "".join(lines)[-2000:]


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none
        return None


def bind_arguments(
    signature: inspect.Signature | None, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Arguments by parameter name with defaults applied (``self``/``cls`` left out)."""
    if signature is not None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # the call itself will fail the same way, and be recorded as ERROR
            pass
        else:
            bound.apply_defaults()
            return {k: v for k, v in bound.arguments.items() if k not in ("self", "cls")}
    return {"args": list(args), **kwargs} if args else dict(kwargs)


def _well_formed(value: Any) -> Any:
    """``value`` with each string made valid UTF-8: a lone surrogate (bytes decoded with
    ``surrogateescape``, say) is stored as its escape. The store refuses such text, and the result, or
    the error the tool raised, went unrecorded with its call left pending."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, Mapping):
        return {_well_formed(k): _well_formed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_well_formed(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    """``value`` as JSON values (what cannot be encoded becomes its repr)."""
    try:
        return json.loads(json.dumps(value, default=repr, allow_nan=False))
    except (TypeError, ValueError):
        return repr(value)


def _truncate(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if not text.strip():
        return "(empty result)"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (truncated, {len(text)} characters in all)"


def _truncate_json(value: Any, cut: Callable[[str], str] = _truncate) -> Any:
    """JSON payloads stay JSON while small; a large one is stored as text shortened by ``cut``."""
    if not isinstance(value, Mapping | list):
        return cut(str(value))
    text = canonical_json(value)
    if len(text) > MAX_RESULT_CHARS:
        return cut(text)
    return value if value else "(empty result)"
