"""The context builder: ``Harness.context`` and the pure packing in ``clawvm.vm.context``."""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawvm import Harness, Kind, Memory, Status, StoreError, Tier, ValidationError
from clawvm.core.embed import count_tokens
from clawvm.core.model import build_memory
from clawvm.vm.context import (
    SECTIONS,
    Candidate,
    Context,
    Quotas,
    admissible,
    is_snapshot,
    pack,
    render,
    short_id,
)
from clawvm.vm.tiers import PagerConfig, TierBudgets
from refusals import events_refused

T0 = datetime(2030, 3, 1, 9, 0, tzinfo=UTC)
LINE = re.compile(r"^\[([0-9a-f]{8}) (\d{4}-\d{2}-\d{2})\] (\w+): ")

WORDS = [
    "payment",
    "api",
    "refund",
    "deploy",
    "disk",
    "lunch",
    "Alice",
    "Bob",
    "Paris",
    "invoice",
    "retry",
    "cache",
    "user",
    "asked",
    "about",
    "the",
    "failed",
    "timeout",
    "coffee",
    "meeting",
    "42",
    "7.5",
]
word_texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=40).map(" ".join)
# any text the harness accepts, including odd whitespace and control characters
odd_texts = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]),
    min_size=1,
    max_size=80,
).filter(lambda s: bool(s.strip()))
texts = st.one_of(word_texts, word_texts, odd_texts)


def open_harness(**kw: Any) -> tuple[Harness, list[datetime]]:
    now = [T0]
    kw.setdefault("preset", "bm25")
    kw.setdefault("pager", PagerConfig(budgets=TierBudgets(working_tokens=400, working_items=8)))
    return Harness.open("memory://", embedder=None, clock=lambda: now[0], **kw), now


def check_shape(ctx: Context, budget: int) -> None:
    """The properties every context has, whatever went into it."""
    assert ctx.tokens <= budget
    assert ctx.tokens == count_tokens(ctx.text) == sum(e.tokens for e in ctx.manifest)
    lines = ctx.text.split("\n") if ctx.text else []
    assert len(lines) == len(ctx.manifest)
    for line, entry in zip(lines, ctx.manifest, strict=True):
        m = LINE.match(line)
        assert m, line
        assert m.group(1) == entry.short_id == short_id(entry.id)
        assert m.group(2) == entry.created_at[:10]
        assert entry.tokens == count_tokens(line)
    ids = [e.id for e in ctx.manifest]
    assert len(ids) == len(set(ids))
    order = [SECTIONS.index(e.section) for e in ctx.manifest]
    assert order == sorted(order), "sections out of order: pinned, then working, then retrieved"
    assert sum(ctx.by_section.values()) == ctx.tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(texts, st.sampled_from(["s1", "s2"]), st.booleans()), min_size=0, max_size=14),
    st.integers(1, 1500),
    st.sampled_from([None, "s1", "s2"]),
    st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join),
)
def test_never_over_budget_and_exactly_counted(
    records: list[tuple[str, str, bool]], budget: int, session: str | None, query: str
) -> None:
    h, _ = open_harness()
    with h:
        for text, sid, pin in records:
            m = h.record(text, session_id=sid, created_at=T0)
            if pin:
                with contextlib.suppress(ValidationError):
                    h.pin(m.id)
        ctx = h.context(query, budget_tokens=budget, session_id=session)
        check_shape(ctx, budget)
        assert ctx.budget == budget
        pinned = {m.id: m for m in h.list(limit=100, pinned=True, session_id=session)} if session else {}
        included = set(ctx.ids)
        pinned_lines = sum(count_tokens(render(m)) for m in pinned.values())
        if pinned_lines <= budget:  # pinned memories are always in the context when they fit
            # (or a line of its kind and words, three or more: a repeat of a line adds no second one)
            said = {(h.get(i).kind, " ".join(h.get(i).content.split())) for i in included}
            for m in pinned.values():
                words = " ".join(m.content.split())
                assert m.id in included or (len(words.split()) >= 3 and (m.kind, words) in said)
        for e in ctx.manifest:
            if e.section == "pinned":
                assert e.id in pinned
            if e.section == "working":
                assert h.get(e.id).session_id == session


def test_budget_must_be_positive() -> None:
    h, _ = open_harness()
    with h:
        for bad in (0, -5, 1.5, "100"):
            with pytest.raises(ValidationError):
                h.context("q", budget_tokens=bad)  # type: ignore[arg-type]


def test_pinned_first_then_working_then_retrieved() -> None:
    h, _now = open_harness()
    with h:
        old = [
            h.record(f"the invoice for Paris was {i} euros", session_id="s0", created_at=T0) for i in range(5)
        ]
        pin = h.record("the user wants answers in French", session_id="s1", kind="user_input", created_at=T0)
        h.pin(pin.id)
        work = [
            h.record(
                f"step {i}: checking the deploy logs",
                session_id="s1",
                kind="llm_thought",
                created_at=T0 + timedelta(minutes=i),
            )
            for i in range(3)
        ]
        ctx = h.context("invoice Paris euros", budget_tokens=400, session_id="s1")
        check_shape(ctx, 400)
        sections = {e.id: e.section for e in ctx.manifest}
        assert sections[pin.id] == "pinned"
        assert all(sections[m.id] == "working" for m in work)
        assert {m.id for m in old} <= {i for i, s in sections.items() if s == "retrieved"}
        lines = ctx.text.split("\n")
        assert lines[0].startswith(f"[{short_id(pin.id)} ")
        assert [e.reason for e in ctx.manifest if e.section == "working"] == ["working tier"] * 3
        for e in ctx.manifest:
            assert e.tier == h.get(e.id).tier.value or e.section == "retrieved"
        # working memories are taken before retrieved ones (within the working quota), even when the
        # retrieved ones are the relevant ones and there are more of them than the budget holds
        more = [
            h.record(f"the invoice for Paris was {i} euros", session_id="s0", created_at=T0) for i in range(9)
        ]
        cost = {m.id: count_tokens(render(h.get(m.id))) for m in [pin, *work, *old, *more]}
        working_tokens = sum(cost[m.id] for m in work)
        budget = int(working_tokens / Quotas().working) + 1
        assert cost[pin.id] + working_tokens + sum(cost[m.id] for m in old + more) > budget
        small = h.context("invoice Paris euros", budget_tokens=budget, session_id="s1")
        check_shape(small, budget)
        got = {e.id: e.section for e in small.manifest}
        assert pin.id in got and all(got.get(m.id) == "working" for m in work)
        assert 0 < len([s for s in got.values() if s == "retrieved"]) < len(old + more)


def test_pinned_memories_are_included_whenever_they_fit() -> None:
    h, _ = open_harness()
    with h:
        pins = [
            h.record(f"rule {i}: always answer in French and keep it brief", session_id="s1", created_at=T0)
            for i in range(4)
        ]
        for p in pins:
            h.pin(p.id)
        need = sum(count_tokens(render(h.get(p.id))) for p in pins)
        for budget in (need, need + 10, need * 3):
            ctx = h.context("anything", budget_tokens=budget, session_id="s1")
            check_shape(ctx, budget)
            assert {p.id for p in pins} <= set(ctx.ids), budget
            assert all(e.section == "pinned" for e in ctx.manifest[:4])


def test_the_same_words_recorded_again_take_one_line() -> None:
    """A tool result recorded on each run of an agent filled the prompt with copies of itself, and pushed
    out what else was known."""
    h, _ = open_harness()
    with h:
        again = [
            h.record("payments API: US host timed out twice", session_id=s, kind="tool_result", created_at=T0)
            for s in ("s1", "s1", "s0", "s0", "s0")
        ]
        eu = h.record("payments API: EU host answers in 80 ms", session_id="s0", created_at=T0)
        h.pin(again[0].id)
        ctx = h.context("payments API host", budget_tokens=400, session_id="s1")
        check_shape(ctx, 400)
        assert ctx.text.count("US host timed out twice") == 1 and again[0].id in ctx.ids
        assert eu.id in ctx.ids and not {m.id for m in again[1:]} & set(ctx.ids)


def test_a_short_answer_said_again_answers_its_own_question() -> None:
    """Deduplicated on its words, the second "yes" was dropped, and its question looked unanswered."""
    h, _ = open_harness()
    with h:
        turns = [
            ("llm_thought", "Shall I rotate the payments API key now?"),
            ("user_input", "yes"),
            ("llm_thought", "Shall I delete the old payments API backups?"),
            ("user_input", "no"),
            ("llm_thought", "Shall I move the payments API to the EU host?"),
            ("user_input", "yes"),
        ]
        made = [
            h.record(text, kind=kind, session_id="s0", created_at=T0 + timedelta(minutes=i))
            for i, (kind, text) in enumerate(turns)
        ]
        ctx = h.context("payments API", budget_tokens=400, session_id="s1")
        assert {m.id for m in made} <= set(ctx.ids) and ctx.text.count(": yes") == 2


def test_neighbours_of_retrieved_turns_are_included() -> None:
    h, _ = open_harness()
    with h:
        turns = [
            "hi there, how was the weekend",
            "what is the name of the dog Caroline adopted last month",
            "she called him Oscar, a small brown terrier",
            "nice, we should meet for coffee soon",
        ]
        ms = [
            h.record(t, session_id="chat", kind="user_input", created_at=T0 + timedelta(minutes=i))
            for i, t in enumerate(turns)
        ]
        for i in range(12):  # another conversation, so "chat" is not in anyone's working tier for this query
            h.record(f"unrelated chatter number {i}", session_id="other", created_at=T0 + timedelta(hours=1))
        ctx = h.context("dog adopted name", budget_tokens=300, session_id="other")
        check_shape(ctx, 300)
        entries = {e.id: e for e in ctx.manifest}
        hit = entries[ms[1].id]
        assert hit.section == "retrieved" and hit.reason.startswith("recall #1")
        for n in (ms[0], ms[2]):  # the turn before and the answer after
            assert entries[n.id].reason == f"neighbour of {short_id(ms[1].id)}"
            assert entries[n.id].section == "retrieved"
        assert ms[3].id not in entries or entries[ms[3].id].reason != f"neighbour of {short_id(ms[1].id)}"
        # a tight budget keeps the hit and drops neighbours before hits
        tight = count_tokens(render(h.get(ms[1].id)))
        ctx2 = h.context("dog adopted name", budget_tokens=tight, k=1)
        assert ctx2.ids == [ms[1].id]


def test_context_event_and_usage_bookkeeping() -> None:
    h, now = open_harness()
    with h:
        a = h.record("the refund for the payment api failed", session_id="s1", created_at=T0)
        b = h.record("lunch is at noon", session_id="s2", created_at=T0)
        ctx = h.context("refund payment", budget_tokens=200)
        assert a.id in ctx.ids and b.id not in ctx.ids
        ev = [e for e in h.events(limit=10**6) if e.kind == "context"][-1]
        assert ev.data["manifest"] == [e.as_dict() for e in ctx.manifest]
        assert (ev.data["budget"], ev.data["tokens"], ev.data["query"]) == (200, ctx.tokens, "refund payment")
        assert set(ev.data["manifest"][0]) == {
            "id",
            "short_id",
            "section",
            "tier",
            "value",
            "score",
            "tokens",
            "reason",
            "created_at",
        }
        assert ev.at == now[0]
        assert h.get(a.id).usage.injected == 1 and h.get(b.id).usage.injected == 0
        assert h.get(a.id).access_count == 1  # it was retrieved
        h.context("refund payment", budget_tokens=200)
        assert h.get(a.id).usage.injected == 2 and h.get(b.id).usage.injected == 0
        h.context("refund payment", budget_tokens=200, record_usage=False)
        assert h.get(a.id).usage.injected == 2
        assert h.explain(a.id).injected > 0


def test_every_included_memory_counts_one_injection() -> None:
    h, _ = open_harness()
    with h:
        ms = [h.record(f"deploy note {i} about the disk", session_id="s1", created_at=T0) for i in range(6)]
        h.pin(ms[0].id)
        before = {m.id: h.get(m.id).usage.injected for m in ms}
        ctx = h.context("deploy disk", budget_tokens=60, session_id="s1")
        for m in ms:
            assert h.get(m.id).usage.injected == before[m.id] + (1 if m.id in ctx.ids else 0)


def test_manifest_reports_the_value_at_build_time() -> None:
    h, now = open_harness()
    with h:
        m = h.record("maybe the cache is cold", kind="llm_thought", session_id="s1", created_at=T0)
        now[0] = T0 + timedelta(hours=12)
        ctx = h.context("cache", budget_tokens=100, session_id="s1", record_usage=False)
        entry = next(e for e in ctx.manifest if e.id == m.id)
        assert entry.value == pytest.approx(h.explain(m.id).value, abs=1e-4)


def test_imported_memories_are_counted_exactly() -> None:
    h, _ = open_harness()
    with h:
        m = build_memory({"content": " ".join(["refund"] * 50), "session_id": "s1", "created_at": T0})
        assert m.token_count == 0
        h.import_memories([m])
        ctx = h.context("refund", budget_tokens=30)
        check_shape(ctx, 30)


# ---- pack() alone -------------------------------------------------------------------------------------
@st.composite
def candidates(draw: st.DrawFn) -> list[Candidate]:
    out = []
    pool: list[Memory] = []
    for _ in range(draw(st.integers(0, 12))):
        text = draw(texts)
        m = build_memory(
            {
                "content": text,
                "kind": draw(st.sampled_from(list(Kind))),
                "token_count": count_tokens(text),
                "created_at": T0 + timedelta(minutes=draw(st.integers(0, 10**5))),
                "value": draw(st.floats(0, 1)),
                "tier": draw(st.sampled_from(list(Tier))),
                # mostly active; now and then what a prompt may never hold (see vm/context.py)
                "status": draw(st.sampled_from([Status.ACTIVE] * 4 + list(Status))),
                "expires_at": draw(st.none() | st.integers(-3, 3).map(lambda h: T0 + timedelta(hours=h))),
                "tags": draw(st.sampled_from([[], ["checkpoint"]])),
                "metadata": draw(st.sampled_from([{}, {"raw_of": "0190a1b2-0000-7000-8000-000000000000"}])),
            }
        )
        if draw(st.integers(0, 5)) == 0:  # now and then a checkpoint's snapshot, as take() writes it
            m = m.model_copy(
                update={
                    "kind": Kind.AGENT_STATE,
                    "tags": ["checkpoint"],
                    "content": '{"memories": {}}',
                    "content_type": "application/json",
                    "metadata": {"checkpoint": "before", "memories": 0},
                }
            )
        near = tuple(draw(st.lists(st.sampled_from(pool), max_size=2))) if pool else ()
        pool.append(m)
        section = draw(st.sampled_from(SECTIONS))
        out.append(Candidate(m, section, draw(st.floats(0, 1)), f"because {section}", near))
    return out


quotas = st.builds(Quotas, st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)) | st.just(Quotas())


@settings(max_examples=120, deadline=None)
@given(candidates(), st.integers(1, 800), quotas)
def test_pack_is_pure_and_within_budget(cands: list[Candidate], budget: int, q: Quotas) -> None:
    frozen = [(c.memory.to_json(), c.section, c.relevance, c.reason, c.neighbours) for c in cands]
    first = pack(cands, budget, count_tokens, q, now=T0)
    second = pack(list(cands), budget, count_tokens, q, now=T0)
    assert first == second
    assert [(c.memory.to_json(), c.section, c.relevance, c.reason, c.neighbours) for c in cands] == frozen
    check_shape(first, budget)
    for section in SECTIONS:  # each section within its quota of the budget
        assert first.by_section[section] <= int(budget * getattr(q, section))
    by_id = {c.memory.id: c for c in cands}
    for e in first.manifest:
        assert e.id in by_id or e.reason.startswith("neighbour of ")
    # the prompt invariants: whatever was offered, every line is admissible at build time
    offered = {m.id: m for c in cands for m in (c.memory, *c.neighbours)}
    assert all(admissible(offered[e.id], T0) for e in first.manifest)
    for m in offered.values():
        if m.id in first.ids:
            assert m.status is Status.ACTIVE and (m.expires_at is None or m.expires_at > T0)
            assert "raw_of" not in m.metadata and not is_snapshot(m)


def test_pack_with_nothing() -> None:
    ctx = pack([], 100, count_tokens, now=T0)
    assert ctx.text == "" and ctx.manifest == [] and ctx.tokens == 0


def test_a_build_whose_event_cannot_be_logged_counts_no_injection(tmp_path: Path) -> None:
    """The usage counts and the build's event are one write: a disk that refuses the event (a trigger
    stands in for it) leaves the counts as they were. They were written apart, the counts first, so a
    failure between them counted injections of a build the log never had."""
    with Harness.open(tmp_path / "h.db", embedder=None) as h:
        m = h.record("the refund payment failed twice", session_id="s1")
        with events_refused(tmp_path / "h.db", "context"), pytest.raises(StoreError):
            h.context("refund payment", budget_tokens=200, session_id="s1")
        assert h.get(m.id).usage.injected == 0 and h.get(m.id).access_count == 0
        assert [e.kind for e in h.events()] == ["add"]
        ctx = h.context("refund payment", budget_tokens=200, session_id="s1")
        assert ctx.ids == [m.id] and h.get(m.id).usage.injected == 1
        assert h.events()[-1].seq == ctx.event_seq


def test_a_session_whose_contexts_are_built_is_not_paged_out_as_idle() -> None:
    """Its working lines are in every prompt: in use. Only a recall's hits counted as used, so a session
    whose context was built every half hour had its working tier paged out as idle after two hours."""
    now = [T0]
    with Harness.open(
        "memory://", embedder=None, clock=lambda: now[0], pager=PagerConfig(background=False)
    ) as h:
        ms = [h.record(f"the user prefers option {i} for deploys", session_id="s1") for i in range(3)]
        for _ in range(8):
            now[0] += timedelta(minutes=30)
            ctx = h.context("what next?", session_id="s1")
            assert set(ctx.ids) == {m.id for m in ms}
            assert h.tick()["moved"] == 0
        assert {h.get(m.id).tier for m in ms} == {Tier.WORKING}
        assert {h.get(m.id).access_count for m in ms} == {0}  # in the prompt, not recalled
        now[0] += timedelta(hours=3)  # then nobody builds one
        h.tick()
        assert {h.get(m.id).tier for m in ms} == {Tier.SHORT_TERM}


def test_a_memory_the_model_cannot_read_counts_its_characters_against_the_budget() -> None:
    """A hex dump and a run of emoji were one unknown token each to the counter: a context of budget 40
    held 19,000 characters."""
    h, _ = open_harness()
    with h:
        h.record("sha dump " + "deadbeef" * 2000, kind="tool_result", session_id="s")
        h.record("🚀" * 3000, session_id="s")
        h.record("sha dump is in the build log", session_id="s")
        ctx = h.context("sha dump", budget_tokens=40, session_id="s")
        check_shape(ctx, 40)
        assert "deadbeef" * 10 not in ctx.text and "🚀" * 10 not in ctx.text
        assert len(ctx.text) < 400
