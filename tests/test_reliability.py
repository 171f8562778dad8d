"""Tool reliability learned from recorded calls, and the warning the context carries."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import numpy as np
import pytest

from clawvm import Harness, ValidationError
from clawvm.agents.reliability import ReliabilityPolicy, stats
from clawvm.core.embed import count_tokens
from clawvm.vm.context import short_id


def flaky_api_session(h: Harness, session: str = "ops", failures: int = 4) -> None:
    """The seed case: an API that always times out, and a queue that did the job each time."""

    @h.tool(session_id=session, task_id="charge-42")
    def charge_api(order: str) -> str:
        raise TimeoutError(f"POST /charge {order}: read timed out after 10 s")

    @h.tool(session_id=session, task_id="charge-42")
    def queue_charge(order: str) -> str:
        return f"queued {order}"

    for i in range(failures):
        with contextlib.suppress(TimeoutError):
            charge_api(f"o-{i}")
        queue_charge(f"o-{i}")


def check_budget_invariants(ctx: object, budget: int) -> None:
    text, tokens = ctx.text, ctx.tokens  # type: ignore[attr-defined]
    assert tokens <= budget
    assert tokens == count_tokens(text) == sum(ctx.by_section.values())  # type: ignore[attr-defined]
    manifest = sum(e.tokens for e in ctx.manifest)  # type: ignore[attr-defined]
    assert manifest + ctx.by_section.get("warnings", 0) == tokens  # type: ignore[attr-defined]


def test_an_api_that_always_times_out_is_unreliable_with_its_fallback(harness: Harness) -> None:
    flaky_api_session(harness)
    s = stats(harness, "charge_api")
    assert (s.calls, s.successes, s.errors, s.timeouts, s.interrupted) == (4, 0, 4, 4, 0)
    assert s.error_rate == 1.0 and s.timeout_rate == 1.0 and s.unreliable
    assert s.last_error is not None and "read timed out" in s.last_error
    assert s.fallback is not None and (s.fallback.tool, s.fallback.successes) == ("queue_charge", 4)
    good = harness.tool_reliability("queue_charge")["queue_charge"]
    assert good.error_rate == 0.0 and not good.unreliable and good.fallback is None
    assert set(harness.tool_reliability()) == {"charge_api", "queue_charge"}


def test_context_warns_before_the_task_uses_the_unreliable_tool(harness: Harness) -> None:
    flaky_api_session(harness)
    last_error = stats(harness, "charge_api").last_error_id
    assert last_error is not None
    # inferred: the session has been calling charge_api
    ctx = harness.context("charge order o-9", session_id="ops", budget_tokens=2000)
    first = ctx.text.split("\n")[0]
    assert first.startswith(
        "warning: tool 'charge_api' is unreliable: 4 of its last 4 calls failed (4 timed out)"
    )
    assert f"[{short_id(last_error)}]" in first and "'queue_charge' (succeeded 4 times" in first
    assert "queue_charge" not in first.split("fallback")[0]  # the reliable tool gets no warning of its own
    check_budget_invariants(ctx, 2000)
    # explicit: a new task with no calls yet, about to use the flaky tool
    explicit = harness.context("charge order o-9", budget_tokens=2000, tools=["charge_api", "queue_charge"])
    assert explicit.text.startswith("warning: tool 'charge_api'") and explicit.text.count("warning:") == 1
    # off, and a fresh scope infers nothing
    assert "warning" not in harness.context("charge", session_id="ops", budget_tokens=2000, tools=[]).text
    assert "warning" not in harness.context("charge", session_id="elsewhere", budget_tokens=2000).text


def test_tight_budgets_get_the_short_warning_or_none(harness: Harness) -> None:
    flaky_api_session(harness)
    full = stats(harness, "charge_api")
    long_tokens, short_tokens = count_tokens(full.warning()), count_tokens(full.short_warning())
    assert short_tokens < long_tokens
    budget = int(long_tokens / ReliabilityPolicy().budget_share) - 4  # the long line no longer fits
    ctx = harness.context("charge", session_id="ops", budget_tokens=budget)
    assert ctx.text.split("\n")[0] == full.short_warning()
    check_budget_invariants(ctx, budget)
    tiny = harness.context("charge", session_id="ops", budget_tokens=short_tokens)  # not even that
    assert "warning" not in tiny.text
    check_budget_invariants(tiny, short_tokens)


def test_a_few_failures_or_a_recovered_tool_are_not_flagged(harness: Harness) -> None:
    flaky_api_session(harness, failures=2)  # below min_calls
    assert not stats(harness, "charge_api").unreliable
    policy = ReliabilityPolicy(window=5)

    @harness.tool(session_id="ops")
    def charge_api(order: str) -> str:  # fixed now
        return "charged"

    for i in range(5):
        charge_api(str(i))
    s = stats(harness, "charge_api", policy)
    assert s.errors == 0 and not s.unreliable  # the window only sees recent behaviour
    assert stats(harness, "charge_api", ReliabilityPolicy(window=7, min_calls=3)).errors == 2


def test_latency_percentiles_from_recorded_durations(harness: Harness) -> None:
    durations = [0.5, 1.0, 2.0, 3.0, 9.0]
    for i, seconds in enumerate(durations):
        call = harness.record(
            {"tool": "export", "args": {"i": i}}, kind="tool_call", state="success", tool_name="export"
        )
        harness.record(
            "ok",
            kind="tool_result",
            state="success",
            tool_name="export",
            parent_id=call.id,
            cost={"seconds": seconds},
        )
    s = stats(harness, "export")
    assert s.p50_s == pytest.approx(np.percentile(durations, 50))
    assert s.p95_s == pytest.approx(np.percentile(durations, 95)) and s.max_s == 9.0
    assert stats(harness, "never_called").p95_s is None


def test_declared_fallback_and_interrupted_calls_counted_apart(harness: Harness) -> None:
    @harness.tool(session_id="a")
    def primary() -> str:
        raise ConnectionError("refused")

    @harness.tool(session_id="b", fallback_for="primary")
    def mirror() -> str:
        return "from mirror"

    for _ in range(3):
        with contextlib.suppress(ConnectionError):
            primary()
    mirror()  # another session: only the declaration links it
    harness.record(
        {"tool": "primary"}, kind="tool_call", state="pending", tool_name="primary", session_id="a"
    )
    harness.restore_session("a")
    s = stats(harness, "primary")
    assert (s.errors, s.timeouts, s.interrupted, s.finished) == (3, 0, 1, 3)
    assert s.fallback is not None and s.fallback.tool == "mirror"


def test_a_declared_fallback_that_also_follows_the_failure_counts_once(harness: Harness) -> None:
    @harness.tool(session_id="ops", task_id="charge-42")
    def charge_api(order: str) -> str:
        raise TimeoutError(f"POST /charge {order}: read timed out")

    @harness.tool(session_id="ops", task_id="charge-42", fallback_for="charge_api")
    def queue_charge(order: str) -> str:
        return f"queued {order}"

    for i in range(3):
        with contextlib.suppress(TimeoutError):
            charge_api(f"o-{i}")
        queue_charge(f"o-{i}")  # declared *and* observed: the same three results
    s = stats(harness, "charge_api")
    assert s.fallback is not None and (s.fallback.tool, s.fallback.successes) == ("queue_charge", 3)
    assert "succeeded 3 times" in s.warning()
    assert stats(harness, "queue_charge").successes == 3


def test_observed_fallback_must_follow_in_the_same_task(harness: Harness) -> None:
    now = harness.now()
    for i, (tool, state, task) in enumerate(
        [("api", "error", "t1"), ("other_task_tool", "success", "t2"), ("cache", "success", "t1")]
    ):
        harness.record(
            f"{tool} {state}",
            kind="tool_result",
            state=state,
            tool_name=tool,
            session_id="s",
            task_id=task,
            created_at=now + timedelta(seconds=i),
        )
    fb = stats(harness, "api", ReliabilityPolicy(min_calls=1)).fallback
    assert fb is not None and fb.tool == "cache"


def test_bad_arguments() -> None:
    with Harness.open("memory://", embedder=None) as h:
        with pytest.raises(ValidationError):
            stats(h, "")
        with pytest.raises(ValidationError):
            h.context("q", budget_tokens=100, tools="charge_api")  # type: ignore[arg-type]
