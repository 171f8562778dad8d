"""Hypothesis strategies shared by the model and store tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from clawvm import Kind, LinkType, Memory, State, Status, Tier, ValidationError
from clawvm.core.model import JSON, TENANT_PATTERN, TEXT, build_memory

uuids = st.uuids().map(str)
texts = st.text(max_size=40)
opt_texts = st.none() | texts
#: names a tenant may have (the names it may not are tested where the rule is)
tenants = st.from_regex(TENANT_PATTERN, fullmatch=True)
tags = st.text(min_size=1, max_size=20).filter(lambda s: bool(s.strip()))
unit = st.floats(min_value=0.0, max_value=1.0)
timezones = st.just(UTC) | st.integers(min_value=-23 * 60, max_value=23 * 60).map(
    lambda m: timezone(timedelta(minutes=m))
)
# naive (taken as UTC) or aware in any fixed offset, over the whole datetime range
datetimes = st.datetimes() | st.datetimes(timezones=timezones)

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def memory_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Raw keyword fields for a Memory, drawn over every field (some combinations are invalid)."""
    return {
        "id": draw(uuids),
        "content": draw(st.text(max_size=200)),
        "content_type": draw(st.sampled_from([TEXT, JSON])),
        "kind": draw(st.sampled_from(list(Kind))),
        "state": draw(st.none() | st.sampled_from(list(State))),
        "status": draw(st.sampled_from(list(Status))),
        "tenant": draw(tenants),
        "session_id": draw(opt_texts),
        "task_id": draw(opt_texts),
        "agent_id": draw(opt_texts),
        "tool_name": draw(opt_texts),
        "tags": draw(st.lists(tags, max_size=5)),
        "parent_id": draw(st.none() | uuids),
        "links": draw(
            st.lists(
                st.fixed_dictionaries({"type": st.sampled_from(list(LinkType)), "target": uuids}), max_size=4
            )
        ),
        "value": draw(unit),
        "pinned": draw(st.booleans()),
        "access_count": draw(st.integers(min_value=0, max_value=2**70)),
        "last_accessed_at": draw(st.none() | datetimes),
        "created_at": draw(datetimes),
        "expires_at": draw(st.none() | datetimes),
        "version": draw(st.integers(min_value=1, max_value=2**40)),
        "tier": draw(st.sampled_from(list(Tier))),
        "confidence": draw(unit),
        "cost": {
            "seconds": draw(st.floats(min_value=0.0)),
            "tokens": draw(st.integers(min_value=0, max_value=2**40)),
            "money": draw(st.floats(min_value=0.0)),
        },
        "usage": {
            "injected": draw(st.integers(min_value=0, max_value=2**40)),
            "cited": draw(st.integers(min_value=0, max_value=2**40)),
            "successes": draw(st.integers(min_value=0, max_value=2**20)),
            "failures": draw(st.integers(min_value=0, max_value=2**20)),
            "feedback": draw(st.integers(min_value=-(2**20), max_value=2**20)),
        },
        "token_count": draw(st.integers(min_value=0, max_value=2**31)),
        "metadata": draw(st.dictionaries(texts, json_values, max_size=5)),
    }


@st.composite
def memories(draw: st.DrawFn, **fixed: Any) -> Memory:
    """Any Memory the model accepts (inputs it rejects with ValidationError are skipped)."""
    fields = draw(memory_fields())
    fields.update(fixed)
    try:
        return build_memory(fields)
    except ValidationError:
        assume(False)
        raise AssertionError("unreachable") from None


def at(year: int, *, us: int = 0) -> datetime:
    return datetime(year, 6, 1, 12, 0, tzinfo=UTC) + timedelta(microseconds=us)
