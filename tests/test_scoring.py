"""Value scoring (``clawvm.vm.scoring``): properties of the pure functions, the signals, and explain()."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clawvm.vm.scoring
from clawvm import Harness, Kind, Memory, ValidationError
from clawvm.core.model import build_memory
from clawvm.vm.scoring import DEFAULT_SCORING, ScoringConfig, content_signals, explain, recency, value
from strategies import datetimes, memories

T0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)

WORDS = [
    "the",
    "build",
    "deploy",
    "notes",
    "about",
    "user",
    "asked",
    "for",
    "Paris",
    "Alice",
    "42",
    "3.5",
    "error",
    "final answer",
    "def f(x):",
    "return",
    "{",
    "}",
    "ok",
    "conclusion",
    "plan",
    "timeout",
]

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)


@st.composite
def scored(draw: st.DrawFn, /, **fixed: Any) -> Memory:
    """A memory over the fields that the value formula reads (realistic ranges)."""
    created = T0 + timedelta(minutes=draw(st.integers(-(10**6), 10**6)))
    last = draw(st.none() | st.integers(0, 10**6).map(lambda m: created + timedelta(minutes=m)))
    fields_: dict[str, Any] = {
        "content": draw(texts),
        "kind": draw(st.sampled_from(list(Kind))),
        "pinned": False,
        "created_at": created,
        "last_accessed_at": last,
        "access_count": draw(st.integers(0, 10**6)),
        "cost": {
            "seconds": draw(st.floats(0, 1e6)),
            "tokens": draw(st.integers(0, 10**7)),
            "money": draw(st.floats(0, 1e3)),
        },
        "usage": {
            "injected": draw(st.integers(0, 10**4)),
            "cited": draw(st.integers(0, 10**4)),
            "successes": draw(st.integers(0, 100)),
            "failures": draw(st.integers(0, 100)),
            "feedback": draw(st.integers(-50, 50)),
        },
    }
    fields_.update(fixed)
    return build_memory(fields_)


def with_usage(m: Memory, **changes: int) -> Memory:
    return m.model_copy(update={"usage": m.usage.model_copy(update=changes)})


# ---- properties of the formula -----------------------------------------------------------------------------
@settings(max_examples=120, deadline=None)
@given(memories(), datetimes)
def test_value_is_always_within_0_and_1(m: Memory, now: datetime) -> None:
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    v = value(m, now)
    assert 0.0 <= v <= 1.0 and math.isfinite(v)
    assert explain(m, now).value == v


@settings(max_examples=50, deadline=None)
@given(memories(pinned=True), datetimes)
def test_pinned_memories_are_worth_exactly_one(m: Memory, now: datetime) -> None:
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    assert value(m, now) == 1.0
    assert explain(m, now).pinned is True


@settings(max_examples=300, deadline=None)
@given(scored(), st.integers(0, 10**6), st.integers(0, 10**6))
def test_older_never_scores_higher(m: Memory, start_min: int, later_min: int) -> None:
    now = m.created_at + timedelta(minutes=start_min)
    later = now + timedelta(minutes=later_min)
    assert value(m, later) <= value(m, now) + 1e-12
    assert recency(m, later) <= recency(m, now)


@settings(max_examples=300, deadline=None)
@given(scored(), st.integers(1, 20), st.integers(0, 10**5))
def test_feedback_is_monotone(m: Memory, votes: int, age_min: int) -> None:
    now = m.created_at + timedelta(minutes=age_min)
    f = m.usage.feedback
    base = value(m, now)
    assert value(with_usage(m, feedback=f + votes), now) >= base - 1e-12
    assert value(with_usage(m, feedback=f - votes), now) <= base + 1e-12
    # and the feedback component itself moves strictly while tanh is not saturated (in floats)
    if abs(f) <= 5:
        assert explain(with_usage(m, feedback=f + votes), now).feedback > explain(m, now).feedback


@settings(max_examples=200, deadline=None)
@given(scored(), st.integers(1, 100), st.integers(0, 10**5))
def test_successes_and_accesses_never_lower_value(m: Memory, more: int, age_min: int) -> None:
    now = m.created_at + timedelta(minutes=age_min)
    base = value(m, now)
    assert value(with_usage(m, successes=m.usage.successes + more), now) >= base - 1e-12
    assert value(with_usage(m, failures=m.usage.failures + more), now) <= base + 1e-12
    assert value(m.model_copy(update={"access_count": m.access_count + more}), now) >= base - 1e-12


@settings(max_examples=100, deadline=None)
@given(scored(), st.integers(0, 10**5))
def test_value_is_the_documented_combination_of_its_components(m: Memory, age_min: int) -> None:
    now = m.created_at + timedelta(minutes=age_min)
    b = explain(m, now)
    cfg = DEFAULT_SCORING
    prior = b.base + sum(b.signals.values()) + b.cost
    raw = (
        prior * (cfg.recency_floor + (1 - cfg.recency_floor) * b.recency)
        + b.access
        + b.injected
        + b.cited
        + b.success
        + b.feedback
    )
    assert b.value == pytest.approx(min(1.0, max(0.0, raw)), abs=1e-12)
    assert b.base == cfg.base[m.kind.value]
    assert 0.0 <= b.recency <= 1.0


def test_config_is_data() -> None:
    heavy = ScoringConfig(feedback_weight=0.5)
    m = build_memory(
        {"content": "plain words here", "kind": "note", "created_at": T0, "usage": {"feedback": 3}}
    )
    assert explain(m, T0, heavy).feedback == pytest.approx(0.5 * math.tanh(1.5))
    assert explain(m, T0, heavy).feedback > explain(m, T0).feedback
    no_thoughts = ScoringConfig(base={**DEFAULT_SCORING.base, "note": 0.0})
    assert explain(m, T0, no_thoughts).base == 0.0


# ---- content signals --------------------------------------------------------------------------------------
SIGNAL_EXAMPLES = {
    "error": [
        "Traceback (most recent call last): the job failed",
        "raised ValueError while parsing",
        "the request timed out after a while",
        "connection exception in the worker",
    ],
    "conclusion": [
        "final answer: use the cached copy",
        "in summary we keep the old schema",
        "root cause was a stale lock",
        "we decided to ship on monday",
    ],
    "numbers": ["the invoice total is 1240", "version 3.5 is out", "room 7"],
    "code": [
        "```python\nprint('hi')\n```",
        "def handler(event):\n    return event",
        "SELECT name FROM users WHERE id = 1",
        "const f = (x) => x + 1",
    ],
    "entities": [
        "we flew with Caroline to the conference",
        "the report went to Melanie Smith yesterday",
        "tickets for Paris are cheap",
    ],
}

PLAIN = [
    "we talked about the weather and went for a walk",
    "she likes long walks in the park",
    "we will return to the office after lunch",
    "the movie was about terror and mirrors",
    "He said hello and left.",
]


@pytest.mark.parametrize(("signal", "text"), [(s, t) for s, ts in SIGNAL_EXAMPLES.items() for t in ts])
def test_each_signal_is_detected(signal: str, text: str) -> None:
    found = content_signals(text)
    assert signal in found
    assert found[signal] == getattr(DEFAULT_SCORING, f"signal_{signal}")


@pytest.mark.parametrize("text", PLAIN)
def test_plain_prose_has_no_signal(text: str) -> None:
    assert content_signals(text) == {}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "we",
                "walked",
                "home",
                "slowly",
                "and",
                "she",
                "smiled",
                "at",
                "the",
                "dog",
                "quiet",
                "evening",
                "returned",
                "mirror",
                "garden",
            ]
        ),
        min_size=1,
        max_size=15,
    ).map(" ".join)
)
def test_lowercase_prose_without_signal_words_has_no_signal(text: str) -> None:
    assert content_signals(text) == {}


def test_signals_raise_the_prior() -> None:
    plain = build_memory({"content": "we talked about the weather", "kind": "note", "created_at": T0})
    rich = build_memory(
        {
            "content": "final answer: Alice fixed the 503 error in def retry()",
            "kind": "note",
            "created_at": T0,
        }
    )
    assert set(explain(rich, T0).signals) == {"error", "conclusion", "numbers", "code", "entities"}
    assert value(rich, T0) > value(plain, T0)


# ---- base by kind and half-lives -------------------------------------------------------------------------
def test_base_by_kind_as_documented() -> None:
    def mk(kind: Kind) -> Memory:
        return build_memory({"content": "we talked about the weather", "kind": kind, "created_at": T0})

    b = {k: explain(mk(k), T0).base for k in Kind}
    assert b[Kind.USER_INPUT] > b[Kind.LLM_THOUGHT]
    assert b[Kind.TOOL_RESULT] > b[Kind.LLM_THOUGHT]
    assert min(b.values()) == b[Kind.LLM_THOUGHT]  # intermediate thoughts are the cheapest kind
    assert value(mk(Kind.USER_INPUT), T0) > value(mk(Kind.LLM_THOUGHT), T0)
    assert value(mk(Kind.TOOL_RESULT), T0) > value(mk(Kind.LLM_THOUGHT), T0)
    # thoughts also go stale faster than what the user said
    day = T0 + timedelta(days=1)
    assert recency(mk(Kind.LLM_THOUGHT), day) < recency(mk(Kind.USER_INPUT), day)
    assert recency(mk(Kind.LLM_THOUGHT), T0 + timedelta(hours=6)) == pytest.approx(0.5)


def test_last_access_resets_the_recency_clock() -> None:
    m = build_memory({"content": "we talked", "kind": "tool_result", "created_at": T0})
    later = T0 + timedelta(days=10)
    touched = m.model_copy(update={"last_accessed_at": later - timedelta(hours=1)})
    assert recency(touched, later) > recency(m, later)


# ---- the docstring and Harness.explain ---------------------------------------------------------------------
def test_module_docstring_documents_the_formula_and_defaults() -> None:
    doc = clawvm.vm.scoring.__doc__ or ""
    for term in (
        "prior",
        "recency",
        "half_life_hours",
        "use(m)",
        "feedback",
        "clamp01",
        "pinned",
        "base[kind]",
        "0.5 **",
        "tanh",
        "log1p",
    ):
        assert term in doc, term
    cfg = ScoringConfig()
    for f in fields(ScoringConfig):
        assert f.name in doc, f"{f.name} is not documented in clawvm.vm.scoring"
        default = getattr(cfg, f.name)
        if isinstance(default, float):  # "name = default", exactly as in the code
            assert re.search(rf"\b{f.name} = {default:g}(\s|$)", doc), f"default of {f.name} not documented"
    for kind in Kind:  # the per-kind table: "kind  base  half-life"
        row = rf"^\s*{kind.value}\s+{cfg.base[kind.value]:g}\s+{cfg.half_life_hours[kind.value]:g}\s*$"
        assert re.search(row, doc, re.M), f"defaults of {kind.value} not documented"


COMPONENTS = {
    "value",
    "base",
    "signals",
    "cost",
    "recency",
    "access",
    "injected",
    "cited",
    "success",
    "feedback",
    "pinned",
}


def test_harness_explain_returns_every_component() -> None:
    now = [T0]
    with Harness.open("memory://", embedder=None, clock=lambda: now[0]) as h:
        m = h.record(
            "final answer: Alice paid 42 EUR",
            kind="user_input",
            session_id="s",
            created_at=T0,
            cost={"seconds": 3.0, "tokens": 1200},
        )
        b = h.explain(m.id)
        assert set(b.as_dict()) == COMPONENTS
        assert b.base == DEFAULT_SCORING.base["user_input"]
        assert set(b.signals) >= {"conclusion", "numbers", "entities"}
        assert b.cost > 0 and b.recency == pytest.approx(1.0)
        assert b.value == value(h.get(m.id), T0)
        h.rate(m.id, +1)
        assert h.explain(m.id).feedback > 0
        assert h.explain(m.id).value > b.value
        now[0] = T0 + timedelta(days=30)
        assert h.explain(m.id).recency < 0.5
        assert h.pin(m.id).value == 1.0
        assert h.explain(m.id).pinned is True and h.explain(m.id).value == 1.0


def test_a_recorded_memory_stores_its_scored_value() -> None:
    with Harness.open("memory://", embedder=None, clock=lambda: T0) as h:
        m = h.record("we talked about the weather", kind="llm_thought", session_id="s", created_at=T0)
        assert m.value == pytest.approx(h.explain(m.id).value)
        assert h.get(m.id).value == pytest.approx(h.explain(m.id).value)


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ({"half_life_hours": {"note": 0.0}}, "half_life_hours.note"),  # divided by zero at the first record
        ({"half_life_hours": {"note": -5.0}}, "half_life_hours.note"),
        ({"access_weight": float("nan")}, "access_weight"),  # made every value 0.0
        ({"recency_floor": 5}, "recency_floor"),
        ({"base": {"note": float("inf")}}, "base.note"),
        ({"base": {"notes": 0.5}}, "base.notes"),
    ],
)
def test_a_bad_scoring_setting_is_refused_where_it_is_made(setting: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        ScoringConfig(**setting)
    assert exc.value.field == field and exc.value.fix
