"""Tool reliability learned from the recorded calls (:mod:`clawvm.agents.toolcalls`), and the context warning.

**Statistics.** Per tool, over its ``window`` most recent ``tool_result`` memories (this tenant, any
status): ``successes``; ``errors`` (state ERROR: exceptions, timeouts, rejected results); ``timeouts``
(errors flagged as timeouts); ``interrupted`` (calls cut off by a dead process: outcome unknown, so
counted apart and left out of the rates); ``error_rate = errors / finished`` and ``timeout_rate =
timeouts / finished`` where ``finished = successes + errors``; latency p50 / p95 / max of the finished
calls' durations (``cost.seconds``).

**The rule.** A tool is *unreliable* when it has at least ``min_calls`` finished calls in the window and
``error_rate >= max_error_rate`` (default 0.5) or ``timeout_rate >= max_timeout_rate`` (default 0.25).
The window makes the rule forgiving: a fixed API is reliable again after ``window`` good calls.

**Fallback that worked before.** Evidence that another tool did the job when this one failed:

- declared: successful results of a tool recorded with ``fallback_for=<this tool>``;
- observed: after a failed call of this tool, the next result of a *different* tool in the same session
  (and the same task, when the failure had one), within ``fallback_horizon`` results, succeeded.

The fallback named is the tool with the most such successes, each successful result counted once
(a declared fallback that also followed a failure is one success), over the last ``max_failures``
failures.

**Context warning.** ``Harness.context(query, tools=[...])`` adds one warning line per unreliable tool
among ``tools`` — what the task is about to use. With ``tools=None`` the tools are inferred: those of
the last ``infer_calls`` tool calls in the context's scope (session / task / agent), since a task that
has been calling a tool tends to call it again; without a scope nothing is inferred; ``tools=[]`` turns
warnings off. Warning lines come first in the text, use at most ``budget_share`` of the budget (lines
that do not fit are dropped), and are counted under ``by_section["warnings"]``.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from clawvm.agents.toolcalls import INTERRUPTED, TIMEOUT, fallback_tag
from clawvm.core.embed import count_tokens
from clawvm.core.errors import ValidationError
from clawvm.core.model import Kind, Memory, State
from clawvm.vm.context import Context, clip, short_id


class CallLister(Protocol):
    """Reliability reads the recorded calls through the harness's list (its scope filters apply)."""

    def list(self, limit: int = 100, **filters: Any) -> builtins.list[Memory]: ...

    def iter_all(
        self, *, newest_first: bool = False, batch: int = 500, **filters: Any
    ) -> Iterator[Memory]: ...


@dataclass(frozen=True)
class ReliabilityPolicy:
    """Thresholds of the rule in the module docstring."""

    window: int = 20
    min_calls: int = 3
    max_error_rate: float = 0.5
    max_timeout_rate: float = 0.25
    fallback_horizon: int = 3
    max_failures: int = 10
    infer_calls: int = 5
    budget_share: float = 0.25


@dataclass(frozen=True)
class Fallback:
    tool: str
    successes: int  # times it succeeded when the unreliable tool had failed (or was declared for it)
    example_id: str  # one of those successful results


@dataclass(frozen=True)
class ToolStats:
    tool: str
    calls: int  # results in the window, interrupted ones included
    successes: int
    errors: int
    timeouts: int
    interrupted: int
    error_rate: float
    timeout_rate: float
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    last_error_id: str | None
    last_error: str | None
    fallback: Fallback | None
    unreliable: bool

    @property
    def finished(self) -> int:
        return self.successes + self.errors

    def short_warning(self) -> str:
        """The warning in a dozen words, for tight budgets."""
        fb = f"; fallback {self.fallback.tool!r}" if self.fallback else ""
        return (
            f"warning: tool {self.tool!r} unreliable ({self.errors}/{self.finished} failed, "
            f"{self.timeouts} timeouts){fb}."
        )

    def warning(self) -> str:
        """One line: the evidence, the last error (with the id to cite) and the fallback, if any."""
        parts = [
            f"warning: tool {self.tool!r} is unreliable: {self.errors} of its last {self.finished} calls "
            f"failed ({self.timeouts} timed out)"
        ]
        if self.p95_s is not None:
            parts[0] += f", p95 latency {self.p95_s:.1f} s"
        if self.last_error_id is not None and self.last_error:
            parts.append(f"last error [{short_id(self.last_error_id)}]: {clip(self.last_error, 120)}")
        if self.fallback is not None:
            fb = self.fallback
            parts.append(
                f"fallback that worked before: {fb.tool!r} (succeeded {fb.successes} time"
                f"{'s' if fb.successes != 1 else ''} when {self.tool!r} failed, "
                f"e.g. [{short_id(fb.example_id)}])"
            )
        else:
            parts.append("no fallback has worked before")
        return "; ".join(parts) + "."


def stats(
    harness: CallLister,
    tool: str,
    policy: ReliabilityPolicy | None = None,
    *,
    only_if_unreliable: bool = False,
) -> ToolStats:
    """Statistics and verdict for one tool (see the module docstring). ``only_if_unreliable``: look for
    a fallback only when the verdict is unreliable (the context builder's warnings show no other)."""
    if not isinstance(tool, str) or not tool:
        raise ValidationError("tool", f"is {tool!r}", "pass a tool name")
    p = policy or ReliabilityPolicy()
    results = harness.list(limit=p.window, kind=Kind.TOOL_RESULT, tool_name=tool, status="any")
    interrupted = [m for m in results if _interrupted(m)]
    finished = [m for m in results if not _interrupted(m) and m.state in (State.SUCCESS, State.ERROR)]
    errors = [m for m in finished if m.state is State.ERROR]
    timeouts = [m for m in errors if _timed_out(m)]
    n = len(finished)
    error_rate = len(errors) / n if n else 0.0
    timeout_rate = len(timeouts) / n if n else 0.0
    durations = np.array([m.cost.seconds for m in finished], dtype=float)
    unreliable = n >= p.min_calls and (error_rate >= p.max_error_rate or timeout_rate >= p.max_timeout_rate)
    last = errors[0] if errors else None  # newest first
    return ToolStats(
        tool=tool,
        calls=len(results),
        successes=n - len(errors),
        errors=len(errors),
        timeouts=len(timeouts),
        interrupted=len(interrupted),
        error_rate=round(error_rate, 4),
        timeout_rate=round(timeout_rate, 4),
        p50_s=float(np.percentile(durations, 50)) if n else None,
        p95_s=float(np.percentile(durations, 95)) if n else None,
        max_s=float(durations.max()) if n else None,
        last_error_id=last.id if last else None,
        last_error=last.content if last else None,
        fallback=(
            fallback(harness, tool, errors[: p.max_failures], p)
            if errors and (unreliable or not only_if_unreliable)
            else None
        ),
        unreliable=unreliable,
    )


def all_stats(
    harness: CallLister, policy: ReliabilityPolicy | None = None, recent: int = 1000
) -> dict[str, ToolStats]:
    """Statistics for every tool seen among the ``recent`` latest tool calls."""
    calls = harness.list(limit=recent, kind=Kind.TOOL_CALL, status="any")
    names = sorted({m.tool_name for m in calls if m.tool_name})
    return {name: stats(harness, name, policy) for name in names}


def fallback(
    harness: CallLister, tool: str, failures: Sequence[Memory], policy: ReliabilityPolicy | None = None
) -> Fallback | None:
    """The tool that most often did the job when ``tool`` had failed (declared or observed)."""
    p = policy or ReliabilityPolicy()
    wins: Counter[str] = Counter()
    example: dict[str, str] = {}
    counted: set[str] = set()  # a declared fallback that also followed a failure is one success, not two
    declared = harness.list(
        limit=p.window, kind=Kind.TOOL_RESULT, state=State.SUCCESS, tags=[fallback_tag(tool)]
    )
    observed = (m for m in _followers(harness, failures, p.fallback_horizon) if m.state is State.SUCCESS)
    for m in (*declared, *observed):
        if m.tool_name and m.tool_name != tool and m.id not in counted:
            counted.add(m.id)
            wins[m.tool_name] += 1
            example.setdefault(m.tool_name, m.id)
    if not wins:
        return None
    best, count = max(wins.items(), key=lambda kv: (kv[1], kv[0]))
    return Fallback(best, count, example[best])


def _followers(harness: CallLister, failures: Sequence[Memory], horizon: int) -> Iterable[Memory]:
    """For each failure: the first result of another tool among the next ``horizon`` results of its
    session (and task)."""
    by_session: dict[str, list[Memory]] = {}
    for f in failures:
        if f.session_id is not None:
            by_session.setdefault(f.session_id, []).append(f)
    for session, fails in by_session.items():
        earliest = min(f.created_at for f in fails)
        # the session's results from its first failure on, in (created_at, id) order, read in pages
        timeline = list(
            harness.iter_all(session_id=session, kind=Kind.TOOL_RESULT, status="any", created_after=earliest)
        )
        position = {m.id: i for i, m in enumerate(timeline)}
        for f in fails:
            start = position.get(f.id)
            if start is None:
                continue
            same_task = [m for m in timeline[start + 1 :] if f.task_id is None or m.task_id == f.task_id]
            for m in same_task[:horizon]:
                if m.tool_name != f.tool_name:
                    yield m
                    break


def inferred_tools(
    harness: CallLister, scope: Mapping[str, Any], policy: ReliabilityPolicy | None = None
) -> list[str]:
    """Tools of the last ``infer_calls`` tool calls in ``scope`` (none without a scope)."""
    if not scope:
        return []
    p = policy or ReliabilityPolicy()
    calls = harness.list(limit=p.infer_calls, kind=Kind.TOOL_CALL, **scope)
    return list(dict.fromkeys(m.tool_name for m in calls if m.tool_name))


def unreliable(
    harness: CallLister,
    tools: Sequence[str] | None,
    scope: Mapping[str, Any],
    policy: ReliabilityPolicy | None = None,
) -> list[ToolStats]:
    """The unreliable tools among ``tools`` (inferred from ``scope`` when None), with their evidence."""
    if tools is not None and (isinstance(tools, str) or not all(isinstance(t, str) for t in tools)):
        raise ValidationError("tools", f"is {tools!r}", "pass a list of tool names")
    names = inferred_tools(harness, scope, policy) if tools is None else list(dict.fromkeys(tools))
    found = (stats(harness, name, policy, only_if_unreliable=True) for name in names)
    return [s for s in found if s.unreliable]


@dataclass(frozen=True)
class ContextWarnings:
    """The warning lines that fit a context's budget share, and their token count."""

    lines: tuple[str, ...] = ()
    tokens: int = 0

    def apply(self, ctx: Context, budget: int) -> None:
        """Put the lines first in ``ctx`` (packed under ``budget - tokens``) and account for them."""
        ctx.budget = budget
        if not self.lines:
            return
        ctx.text = "\n".join([*self.lines, ctx.text]) if ctx.text else "\n".join(self.lines)
        ctx.tokens += self.tokens  # newlines are plain whitespace to the tokenizer: counts add up
        ctx.by_section["warnings"] = self.tokens


def context_warnings(
    harness: CallLister,
    tools: Sequence[str] | None,
    scope: Mapping[str, Any],
    budget: int,
    policy: ReliabilityPolicy | None = None,
) -> ContextWarnings:
    """The warnings for a context of ``budget`` tokens: at most ``budget_share`` of it, in order."""
    p = policy or ReliabilityPolicy()
    limit, used, kept = int(budget * p.budget_share), 0, []
    for s in unreliable(harness, tools, scope, p):
        for line in (s.warning(), s.short_warning()):  # the full line if it fits, else the short one
            n = count_tokens(line)
            if used + n <= limit:
                kept.append(line)
                used += n
                break
    return ContextWarnings(tuple(kept), used)


def _interrupted(m: Memory) -> bool:
    return INTERRUPTED in m.tags or bool(m.metadata.get("tool_result", {}).get("interrupted"))


def _timed_out(m: Memory) -> bool:
    error = m.metadata.get("tool_result", {}).get("error") or {}
    return TIMEOUT in m.tags or bool(error.get("timeout"))
