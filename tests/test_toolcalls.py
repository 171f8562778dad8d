"""Automatic tool-call recording: the PENDING call -> SUCCESS/ERROR result trail, templates, validators,
scopes, and restore after a process died mid-call."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm import Harness, InvalidToolResultError, Kind, Memory, RedactionPolicy, State, ValidationError
from clawvm.agents.toolcalls import INTERRUPTED, is_timeout, scope
from clawvm.demo.scenario import ReplayClock
from engines import harness_target


def trail(h: Harness, tool: str) -> list[tuple[Memory, Memory]]:
    """(call, result) pairs of ``tool``, oldest first; every call must have exactly one result."""
    calls = sorted(h.list(limit=1000, kind="tool_call", tool_name=tool, status="any"), key=lambda m: m.id)
    pairs = []
    for call in calls:
        results = h.list(limit=10, kind="tool_result", parent_id=call.id, status="any")
        assert len(results) == 1, f"call {call.id} has {len(results)} results"
        pairs.append((call, results[0]))
    return pairs


def test_sync_tool_records_pending_call_before_it_runs_then_success(harness: Harness) -> None:
    seen_while_running: list[Memory] = []

    @harness.tool(session_id="s1", task_id="t1")
    def lookup(city: str, units: str = "metric") -> dict[str, Any]:
        seen_while_running.extend(harness.list(kind="tool_call", state="pending", tool_name="lookup"))
        return {"city": city, "temp": 21}

    assert lookup("Paris") == {"city": "Paris", "temp": 21}
    (running,) = seen_while_running
    ((call, result),) = trail(harness, "lookup")
    assert running.id == call.id and running.state is State.PENDING
    assert call.content_json() == {"tool": "lookup", "args": {"city": "Paris", "units": "metric"}}
    assert (call.session_id, call.task_id) == ("s1", "t1")
    assert call.state is State.SUCCESS and call.metadata["tool_call"]["result_id"] == result.id
    assert result.kind is Kind.TOOL_RESULT and result.state is State.SUCCESS
    assert result.parent_id == call.id and result.tool_name == "lookup"
    assert result.content_json() == {"city": "Paris", "temp": 21}
    assert result.cost.seconds >= 0 and result.metadata["tool_result"]["call_id"] == call.id
    # the event log shows the call added as PENDING, then updated to its outcome
    kinds = [e.kind for e in harness.events(memory_id=call.id)]
    assert kinds[0] == "add" and "update" in kinds


def test_duration_is_wall_time_or_the_time_a_replay_clock_moved() -> None:
    # a real clock: the measured wall time of a tool that really takes 50 ms
    with Harness.open("memory://", embedder=None) as real:

        @real.tool(session_id="s1")
        def slow() -> str:
            time.sleep(0.05)
            return "done"

        slow()
        ((_, result),) = trail(real, "slow")
        assert 0.05 <= result.cost.seconds < 1.0
    # a replay clock the tool moves (a scripted latency): that is the call's duration, and it agrees
    # with the trail's own timestamps; a timeout raised after the clock moved is timed the same way
    clock = ReplayClock()
    with Harness.open("memory://", embedder=None, clock=clock) as replay:

        @replay.tool(session_id="s1", timeout_errors=(TimeoutError,))
        def scripted(fail: bool) -> str:
            clock.advance(seconds=2.5)
            if fail:
                raise TimeoutError("read timed out after 2.5 s")
            return "done"

        scripted(False)
        with contextlib.suppress(TimeoutError):
            scripted(True)
        for call, result in trail(replay, "scripted"):
            assert result.cost.seconds == pytest.approx(2.5, abs=0.01)
            assert (result.created_at - call.created_at).total_seconds() == pytest.approx(2.5)
            assert call.metadata["tool_call"]["duration_s"] == result.cost.seconds


def test_exception_is_recorded_with_type_message_traceback_and_reraised(harness: Harness) -> None:
    @harness.tool(session_id="s1")
    def charge(amount: int) -> str:
        raise ValueError(f"card declined for {amount}")

    with pytest.raises(ValueError, match="card declined for 12"):
        charge(12)
    ((call, result),) = trail(harness, "charge")
    assert call.state is State.ERROR and result.state is State.ERROR
    assert result.content == "ValueError: card declined for 12"
    error = result.metadata["tool_result"]["error"]
    assert error["type"] == "ValueError" and error["message"] == "card declined for 12"
    assert "charge" in error["traceback"] and error["timeout"] is False
    assert "timeout" not in result.tags


class ReadTimeout(Exception):  # the name pattern of httpx/requests timeouts
    pass


class SlowError(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "declared", "expected"),
    [
        (TimeoutError("read timed out"), (), True),
        (asyncio.TimeoutError(), (), True),  # noqa: UP041 (the asyncio name on purpose)
        (ReadTimeout("x"), (), True),
        (SlowError("x"), (SlowError,), True),
        (SlowError("x"), (), False),
        (KeyError("x"), (), False),
    ],
)
def test_timeouts_are_recognised(
    exc: BaseException, declared: tuple[type[BaseException], ...], expected: bool
) -> None:
    assert is_timeout(exc, declared) is expected


def test_timeout_is_flagged_on_the_result(harness: Harness) -> None:
    @harness.tool(session_id="s1", timeout_errors=[SlowError])
    def slow() -> None:
        raise SlowError("no answer in 10 s")

    with pytest.raises(SlowError):
        slow()
    ((_, result),) = trail(harness, "slow")
    assert result.metadata["tool_result"]["error"]["timeout"] is True and "timeout" in result.tags


def test_async_tool_success_and_error(harness: Harness) -> None:
    @harness.tool(session_id="s2")
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        if "bad" in url:
            raise ConnectionError("refused")
        return f"200 OK from {url}"

    async def run() -> None:
        assert await fetch("https://ok") == "200 OK from https://ok"
        with pytest.raises(ConnectionError):
            await fetch("https://bad")

    asyncio.run(run())
    (ok_call, ok), (bad_call, bad) = trail(harness, "fetch")
    assert (ok_call.state, ok.state, ok.content) == (State.SUCCESS, State.SUCCESS, "200 OK from https://ok")
    assert (bad_call.state, bad.state, bad.content) == (State.ERROR, State.ERROR, "ConnectionError: refused")


def test_a_call_cut_off_from_outside_is_interrupted_not_the_tools_error(harness: Harness) -> None:
    """A task cancelled around the tool (asyncio.wait_for's timeout) or Ctrl-C stops the call before the
    tool returns: the exception goes on to the caller, and the trail says the call was interrupted (its
    outcome unknown), which the tool's reliability leaves out of its error rate."""

    @harness.tool(session_id="s9")
    async def deploy(app: str) -> str:
        await asyncio.sleep(30)
        return "deployed"

    async def run() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(deploy("web"), 0.05)

    asyncio.run(run())
    with pytest.raises(KeyboardInterrupt), harness.tool_call("deploy", {"app": "db"}, session_id="s9"):
        raise KeyboardInterrupt
    pairs = trail(harness, "deploy")
    errors = [r.metadata["tool_result"]["error"]["type"] for _, r in pairs]
    assert errors == ["CancelledError", "KeyboardInterrupt"]
    for call, result in pairs:
        assert (call.state, result.state) == (State.ERROR, State.ERROR)
        assert INTERRUPTED in result.tags and INTERRUPTED in call.tags
        assert result.metadata["tool_result"]["interrupted"] is True
        assert call.metadata["tool_call"]["status"] == INTERRUPTED
        assert "outcome is unknown" in result.content
    stats = harness.tool_reliability("deploy")["deploy"]
    assert (stats.interrupted, stats.errors, stats.error_rate) == (2, 0, 0.0)


def test_context_manager_sync_and_async(harness: Harness) -> None:
    with harness.tool_call("shell", {"cmd": "df -h"}, session_id="s3") as call:
        call.set_result("disk 91% full")
        call.add_cost(tokens=12, money=0.5)
    with pytest.raises(RuntimeError), harness.tool_call("shell", {"cmd": "reboot"}, session_id="s3"):
        raise RuntimeError("permission denied")

    async def run() -> None:
        async with harness.tool_call("shell", {"cmd": "uptime"}, session_id="s3") as acall:
            acall.set_result("up 3 days")

    asyncio.run(run())
    pairs = trail(harness, "shell")
    assert [(c.content_json()["args"]["cmd"], r.state, r.content) for c, r in pairs] == [
        ("df -h", State.SUCCESS, "disk 91% full"),
        ("reboot", State.ERROR, "RuntimeError: permission denied"),
        ("uptime", State.SUCCESS, "up 3 days"),
    ]
    assert (pairs[0][1].cost.tokens, pairs[0][1].cost.money) == (12, 0.5)


def test_tool_call_takes_the_same_options_as_the_decorator(harness: Harness) -> None:
    with harness.tool_call(
        "login",
        {"user": "ann", "password": "hunter2"},
        session_id="s4",
        redact=["password"],
        template="logged in as {args[user]}",
        timeout_errors=[SlowError],
    ) as c:
        c.set_result({"ok": True})
    ((call, result),) = trail(harness, "login")
    assert call.content_json()["args"] == {"user": "ann", "password": "***"}
    assert result.content == "logged in as ann"


def test_templates_give_one_format_per_tool_and_redact_hides_secrets(harness: Harness) -> None:
    @harness.tool(
        session_id="s4",
        template="GET {args[url]} -> {result[status]}",
        call_template=lambda args: f"GET {args['url']}",
        redact=["token"],
    )
    def http_get(url: str, token: str) -> dict[str, int]:
        return {"status": 204}

    @harness.tool(session_id="s4", template=lambda r: {"rows": len(r)}, cost=lambda r: {"tokens": len(r)})
    def query(sql: str) -> list[int]:
        return [1, 2, 3]

    http_get("https://api/x", token="sk-secret")
    query("select 1")
    ((call, result),) = trail(harness, "http_get")
    assert call.content == "GET https://api/x" and result.content == "GET https://api/x -> 204"
    assert call.metadata["tool_call"]["args"] == {"url": "https://api/x", "token": "***"}
    assert all("sk-secret" not in m.model_dump_json() for m in harness.list(limit=100, status="any"))
    ((_, qres),) = trail(harness, "query")
    assert qres.content_json() == {"rows": 3} and qres.cost.tokens == 3


@pytest.mark.parametrize(
    ("validator", "reason"),
    [
        (lambda r: None if r["rows"] else "no rows returned", "no rows returned"),
        (lambda r: bool(r["rows"]), "rejected by the validator"),
        (lambda r: r["missing"], "the tool's validator raised KeyError: 'missing'"),
    ],
)
def test_invalid_result_is_recorded_as_error_never_silently(
    harness: Harness, validator: Any, reason: str
) -> None:
    @harness.tool("report", session_id="s5", validator=validator)
    def report() -> dict[str, list[int]]:
        return {"rows": []}

    with pytest.raises(InvalidToolResultError) as info:
        report()
    ((call, result),) = trail(harness, "report")
    assert info.value.reason == reason and (info.value.call_id, info.value.result_id) == (call.id, result.id)
    assert call.state is State.ERROR and result.state is State.ERROR
    assert result.content == f"InvalidToolResult: {reason}"


def test_a_failing_template_or_cost_function_never_costs_the_tool_its_result(harness: Harness) -> None:
    """The tool worked, only its recording template or cost function failed: the caller lost the result to
    an InvalidToolResultError, and the call counted as the tool's error in its reliability."""

    @harness.tool("get", session_id="s5", template="GET {args[url]} -> {result[status]}")
    def get(url: str) -> dict[str, int]:
        return {"code": 200}

    assert get("http://x") == {"code": 200}
    ((call, result),) = trail(harness, "get")
    assert call.state is State.SUCCESS and result.state is State.SUCCESS
    assert json.loads(result.content) == {"code": 200}  # the default format
    assert result.metadata["tool_result"]["recording_errors"] == [
        "the tool's recording template raised KeyError: 'status'"
    ]

    @harness.tool("count", session_id="s5", cost=lambda r: {"tokens": r["tokens"]})
    def count() -> dict[str, int]:
        return {"rows": 3}

    assert count() == {"rows": 3}
    ((_, counted),) = trail(harness, "count")
    assert counted.state is State.SUCCESS and counted.cost.tokens == 0
    assert counted.metadata["tool_result"]["recording_errors"] == [
        "the tool's cost function raised KeyError: 'tokens'"
    ]
    assert harness.tool_reliability("get")["get"].error_rate == 0.0

    ran = []

    @harness.tool("head", session_id="s5", call_template="HEAD {args[nope]}")
    def head(url: str) -> str:
        ran.append(url)
        return "200"

    assert head("http://y") == "200" and ran == ["http://y"]  # the tool ran: a KeyError stopped it
    ((headed, _),) = trail(harness, "head")
    assert json.loads(headed.content)["args"] == {"url": "http://y"}
    assert headed.metadata["tool_call"]["recording_errors"] == [
        "the tool's call template raised KeyError: 'nope'"
    ]


@pytest.mark.parametrize(
    ("field", "amount"),
    [
        ("tokens", -5),
        ("tokens", "5"),
        ("tokens", 1.5),
        ("money", math.nan),
        ("money", -1.0),
        ("money", math.inf),
        ("tokens", True),
    ],
)
def test_a_bad_cost_is_refused_where_it_is_added(harness: Harness, field: str, amount: object) -> None:
    """add_cost(tokens=-5) failed only when the block exited, with pydantic's error, and left the call
    PENDING for good."""
    with harness.tool_call("fetch", {}, session_id="s6") as call:
        with pytest.raises(ValidationError) as exc:
            call.add_cost(**{field: amount})
        assert exc.value.field == field
        call.add_cost(tokens=3, money=0.5)
        call.set_result("ok")
    ((recorded, result),) = trail(harness, "fetch")
    assert recorded.state is State.SUCCESS and (result.cost.tokens, result.cost.money) == (3, 0.5)


def test_valid_result_passes_the_validator(harness: Harness) -> None:
    @harness.tool("report", session_id="s5", validator=lambda r: None if r else "empty")
    def report() -> list[int]:
        return [1]

    assert report() == [1]
    ((_, result),) = trail(harness, "report")
    assert result.state is State.SUCCESS


def test_scope_precedence_call_over_block_over_decorator(harness: Harness) -> None:
    @harness.tool(session_id="deco", agent_id="a0", tags=["ops"])
    def ping() -> str:
        return "pong"

    ping()
    with scope(session_id="block", task_id="t9"):
        ping()
        with harness.tool_call("ping", {}, session_id="call") as c:
            c.set_result("pong")
    pairs = trail(harness, "ping")
    got = [(c.session_id, c.task_id, c.agent_id, r.session_id) for c, r in pairs]
    assert got == [("deco", None, "a0", "deco"), ("block", "t9", "a0", "block"), ("call", "t9", None, "call")]
    assert pairs[0][0].tags == ["ops"] and pairs[0][1].tags == ["ops"]


def test_a_scope_links_its_calls_to_the_llm_turn_that_asked(harness: Harness) -> None:
    @harness.tool(session_id="s1")
    def lookup(q: str) -> str:
        return f"found {q}"

    turn = harness.record("I should look up the host", kind=Kind.LLM_THOUGHT, session_id="s1")
    with scope(parent_id=turn.id):
        lookup("eu host")
    lookup("unlinked")  # outside the block: no turn
    (linked, result), (alone, _) = trail(harness, "lookup")
    assert linked.parent_id == turn.id and result.parent_id == linked.id
    assert alone.parent_id is None


def test_bad_options_are_rejected() -> None:
    with Harness.open("memory://", embedder=None) as h:
        with pytest.raises(ValidationError) as info:
            h.tool(session="s1")
        assert info.value.field == "session"
        with pytest.raises(ValidationError):
            h.tool_call("", {})
        with pytest.raises(ValidationError), scope(tenant="x"):
            pass


def test_a_tool_call_option_or_validator_that_is_none_is_refused_before_the_tool_runs() -> None:
    """An unknown tool_call option raised TypeError from ToolSpec; a validator that is no function was
    taken, the tool ran, and its good result was recorded as an error."""
    with Harness.open("memory://", embedder=None) as h:
        with pytest.raises(ValidationError) as info:
            h.tool_call("shell", {"cmd": "ls"}, session_id="s", retries=3)
        assert info.value.field == "retries" and "validator" in (info.value.fix or "")
        ran: list[int] = []
        for name in ("validator", "cost"):
            with pytest.raises(ValidationError) as info:

                @h.tool(session_id="s", **{name: "status < 500"})
                def charge(amount: int) -> dict[str, int]:
                    ran.append(amount)
                    return {"status": 200}

            assert info.value.field == name
        with pytest.raises(ValidationError) as info:
            h.tool_reliability("charge", policy=5)  # type: ignore[arg-type]
        assert info.value.field == "policy"
        assert ran == [] and h.count(status="any") == 0


# ---- restore ------------------------------------------------------------------------------------------
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def orphan(h: Harness, session: str, tool: str, pid: int) -> Memory:
    """A PENDING call as a killed process leaves it."""
    return h.record(
        {"tool": tool, "args": {"url": "https://slow"}},
        kind="tool_call",
        state="pending",
        tool_name=tool,
        session_id=session,
        metadata={"tool_call": {"status": "pending", "pid": pid, "host": socket.gethostname()}},
    )


def test_restore_marks_orphaned_calls_interrupted_and_keeps_them_visible(harness: Harness) -> None:
    @harness.tool(session_id="s7")
    def fetch(url: str) -> str:
        return "ok"

    fetch("https://fast")
    lost = orphan(harness, "s7", "fetch", dead_pid())
    other_session = orphan(harness, "s8", "fetch", dead_pid())
    report = harness.restore_session("s7")
    assert report.interrupted == [lost.id] and report.closed == [] and report.running_elsewhere == []
    call = harness.get(lost.id)
    assert call.state is State.ERROR and INTERRUPTED in call.tags  # no longer PENDING: not running
    assert call.metadata["tool_call"]["status"] == INTERRUPTED
    (result,) = harness.list(parent_id=lost.id, kind="tool_result")
    assert result.state is State.ERROR and INTERRUPTED in result.tags
    assert result.metadata["tool_result"]["interrupted"] is True
    assert "fetch call interrupted" in result.content
    assert any(e.kind == "tool_interrupted" for e in harness.events(memory_id=lost.id))
    assert harness.list(session_id="s7", state="pending") == []  # an agent resuming its PENDING calls
    assert harness.get(other_session.id).tags == []  # another session is left alone
    ctx = harness.context("fetch", session_id="s7", budget_tokens=1000)
    assert {lost.id, result.id} <= set(ctx.ids) and "interrupted" in ctx.text
    assert harness.restore_session("s7").interrupted == []  # idempotent


def test_restore_leaves_running_calls_alone(harness: Harness) -> None:
    call = harness.tool_call("long_job", {"n": 1}, session_id="s9")
    call.start()  # still running in this process
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        elsewhere = orphan(harness, "s9", "long_job", sleeper.pid)
        report = harness.restore_session("s9")
        assert report.interrupted == [] and report.running_elsewhere == [elsewhere.id]
    finally:
        sleeper.kill()
        sleeper.wait()
    call.succeed("done")
    assert call.call is not None and harness.get(call.call.id).state is State.SUCCESS
    assert harness.restore_session("s9").interrupted == [elsewhere.id]


def test_restore_closes_a_call_whose_result_was_written(harness: Harness) -> None:
    lost = orphan(harness, "s10", "fetch", dead_pid())
    done = harness.record(
        "200 OK", kind="tool_result", state="success", tool_name="fetch", session_id="s10", parent_id=lost.id
    )
    report = harness.restore_session("s10")
    assert report.closed == [lost.id] and report.interrupted == []
    call = harness.get(lost.id)
    assert call.state is State.SUCCESS and call.metadata["tool_call"]["result_id"] == done.id


def test_restore_closes_a_call_whose_interrupted_result_was_written_as_interrupted(harness: Harness) -> None:
    """It closed it with status "error" and no tag: the call and its result disagreed."""
    lost = orphan(harness, "s12", "deploy", dead_pid())
    harness.record(
        "deploy call interrupted",
        kind="tool_result",
        state="error",
        tool_name="deploy",
        session_id="s12",
        parent_id=lost.id,
        tags=[INTERRUPTED],
    )
    assert harness.restore_session("s12").closed == [lost.id]
    call = harness.get(lost.id)
    assert call.metadata["tool_call"]["status"] == INTERRUPTED and INTERRUPTED in call.tags


def test_restore_leaves_a_result_a_rollback_undid_undone(harness: Harness) -> None:
    """It closed the call as a success pointing at the result the rollback had obsoleted."""
    lost = orphan(harness, "s11", "fetch", dead_pid())
    cp = harness.checkpoint("s11", "mid-call")
    harness.record(
        "200 OK", kind="tool_result", state="success", tool_name="fetch", session_id="s11", parent_id=lost.id
    )
    harness.rollback(cp)
    report = harness.restore_session("s11")
    assert report.closed == [] and report.interrupted == [lost.id]
    assert harness.get(lost.id).metadata["tool_call"]["status"] == INTERRUPTED


@pytest.mark.engines("sqlite", "postgres")
def test_restore_after_reopening_the_store(engine_name: str, tmp_path: Path) -> None:
    target = harness_target(engine_name, tmp_path)
    with Harness.open(target, embedder=None) as h:
        lost = orphan(h, "s11", "fetch", dead_pid())
    with Harness.open(target, embedder=None) as h:
        assert h.restore_session("s11").interrupted == [lost.id]
        assert INTERRUPTED in h.get(lost.id).tags
    with pytest.raises(ValidationError):
        Harness.open("memory://", embedder=None).restore_session("")


# ---- the trail as a property ---------------------------------------------------------------------------
outcomes = st.lists(st.sampled_from(["ok", "raise", "invalid", "timeout"]), min_size=1, max_size=12)


@settings(max_examples=25, deadline=None)
@given(outcomes)
def test_every_call_has_exactly_one_result_with_the_outcome_state(plan: list[str]) -> None:
    with Harness.open("memory://", embedder=None) as h:

        @h.tool(session_id="p", validator=lambda r: None if r != "invalid" else "bad value")
        def step(kind: str) -> str:
            if kind == "raise":
                raise ValueError("boom")
            if kind == "timeout":
                raise TimeoutError("slow")
            return kind

        for kind in plan:
            with contextlib.suppress(ValueError, TimeoutError, InvalidToolResultError):
                step(kind)
        pairs = trail(h, "step")
        assert [c.content_json()["args"]["kind"] for c, _ in pairs] == plan
        for (call, result), kind in zip(pairs, plan, strict=True):
            expected = State.SUCCESS if kind == "ok" else State.ERROR
            assert call.state is expected and result.state is expected
            assert result.parent_id == call.id and call.metadata["tool_call"]["result_id"] == result.id
            assert ("timeout" in result.tags) is (kind == "timeout")
        assert h.count(kind="tool_call", state="pending") == 0
        assert os.getpid() == pairs[0][0].metadata["tool_call"]["pid"]


def test_a_result_or_error_the_store_refuses_as_text_is_recorded_escaped(harness: Harness) -> None:
    """A lone surrogate (bytes decoded with surrogateescape) made the result's record fail: the caller got
    a ValidationError instead of the tool's value, and the call stayed pending (``interrupted`` on the
    next restore, though it had finished)."""
    odd = b"caf\xe9 menu".decode("utf-8", errors="surrogateescape")

    @harness.tool(session_id="s1")
    def menu() -> str:
        return odd

    @harness.tool(session_id="s1")
    def broken() -> str:
        raise RuntimeError(f"cannot parse {odd}")

    @harness.tool(session_id="s1")
    def lookup(name: str) -> str:  # an argument the store refuses as text: the tool never ran
        return "found"

    assert lookup(odd) == "found"
    assert menu() == odd  # the value as the tool returned it
    with pytest.raises(RuntimeError, match="cannot parse"):
        broken()
    for tool in ("menu", "broken"):
        ((call, result),) = trail(harness, tool)
        assert call.state is not State.PENDING and "\\udce9" in result.content
    ((call, _),) = trail(harness, "lookup")
    assert "\\udce9" in call.content_json()["args"]["name"]


def test_a_call_forgotten_while_it_runs_still_returns_the_tools_value(harness: Harness) -> None:
    """The model forgot the pending call while the tool ran: its result's record named a parent no longer
    stored, and the caller got StateConflictError instead of the deploy's outcome."""

    @harness.tool(session_id="s1")
    def deploy() -> str:
        (call,) = harness.list(kind="tool_call", state="pending", tool_name="deploy")
        harness.forget(call.id)
        return "deployed v2"

    assert deploy() == "deployed v2"


def test_a_call_with_arguments_over_the_content_limit_runs_and_records_them_cut() -> None:
    """An upload's 1.1 MB body made the PENDING call's record fail (content over the store's 1 MB limit):
    the tool never ran and nothing was recorded. The arguments are cut as a result is, scrubbed first."""
    body = "x" * 7990 + " ann@example.org " + "y" * 1_100_000  # an address across the cut
    pending: list[Memory] = []
    with Harness.open("memory://", embedder=None, redaction=RedactionPolicy()) as h:

        @h.tool(session_id="s1")
        def upload(name: str, data: str, parts: list[str]) -> int:
            pending.extend(h.list(kind="tool_call", state="pending", tool_name="upload"))
            return len(data)

        @h.tool(session_id="s1")
        async def upload_async(data: str) -> int:
            await asyncio.sleep(0)
            pending.extend(h.list(kind="tool_call", state="pending", tool_name="upload_async"))
            return len(data)

        assert upload("a.bin", body, [body]) == len(body)
        assert asyncio.run(upload_async(body)) == len(body)
        assert [m.tool_name for m in pending] == ["upload", "upload_async"]  # recorded before each ran
        for tool in ("upload", "upload_async"):
            ((call, result),) = trail(h, tool)
            assert (call.state, result.state, result.content) == (
                State.SUCCESS,
                State.SUCCESS,
                str(len(body)),
            )
            args = call.content_json()["args"]
            assert call.metadata["tool_call"]["args"] == args
            # (the count is the scrubbed text's, as for a result)
            assert args["data"].startswith("x" * 7990 + " [EMAIL] y") and len(args["data"]) < 8100
            assert args["data"].endswith(f"… (truncated, {len(body) - 8} characters in all)")
        ((call, _),) = trail(h, "upload")  # small arguments stay as they are; a large list is cut as a result
        args = call.content_json()["args"]
        assert args["name"] == "a.bin" and "(truncated, " in args["parts"] and "ann@" not in args["parts"]


def test_a_generator_tool_is_refused_at_its_decorator() -> None:
    """A generator returns before its body runs: its result was recorded as SUCCESS (the generator's repr)
    and an error raised while iterating it never reached the record or the tool's reliability."""
    with Harness.open("memory://", embedder=None) as h:

        def stream(n: int) -> Iterator[str]:
            yield "chunk"
            raise ConnectionError("stream dropped")

        async def astream(n: int) -> AsyncIterator[str]:
            yield "chunk"

        for fn in (stream, astream):
            with pytest.raises(ValidationError) as exc:
                h.tool(session_id="g")(fn)
            assert exc.value.field == "tool" and "generator" in exc.value.problem
        assert h.count() == 0
