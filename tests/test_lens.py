"""MemLens: metrics from events, influence tracing and citations, the learning rule, event export and
retention. Storage-touching tests run on every engine (``engine_name``)."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawvm import ConflictError, Harness, Kind, Memory, NotFoundError, StoreError, Tier, ValidationError
from clawvm.core.model import Cost, Usage
from clawvm.demo.scenario import ReplayClock
from clawvm.observe.learning import (
    MAX_WEIGHT_STEP,
    NOTE_MAX_CHARS,
    features,
    intervene,
    learn,
    raw_value,
    restore_weights,
    stored_weights,
    weights_id,
    weights_of,
)
from clawvm.observe.lens import Lens, record_output
from clawvm.store import Event
from clawvm.store.eventlog import DUCKDB_QUERIES, Retention, export_jsonl, export_parquet, prune, run_query
from clawvm.vm.scoring import DEFAULT_SCORING
from engines import engine_of, harness_target
from refusals import events_refused

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ReplayClock:
    return ReplayClock(T0)


@pytest.fixture
def h(engine_name: str, tmp_path: Path, clock: ReplayClock) -> Iterator[Harness]:
    """A lexical-only harness on the engine, on a clock the test moves."""
    harness = Harness.open(harness_target(engine_name, tmp_path), embedder=None, clock=clock)
    try:
        yield harness
    finally:
        harness.close()


# ---- metrics ------------------------------------------------------------------------------------------
def test_working_hit_rate_latency_and_regret(h: Harness, clock: ReplayClock) -> None:
    hot = h.record("the payment gateway returned 502 bad gateway", session_id="s1")
    cold = h.record("the invoice archive job finished overnight", session_id="s1")
    h.pager.move(h.get(cold.id), Tier.LONG_TERM, "test", clock.now)
    gone = h.record("legacy cardinal webhook secret rotated", session_id="s1")
    h.pager.move(h.get(gone.id), Tier.ARCHIVE, "test", clock.now)
    h.record("unrelated lunch plans for friday", session_id="s1")
    assert [x.id for x in h.recall("payment gateway 502", k=1, preset="bm25")] == [hot.id]  # hit
    assert [x.id for x in h.recall("invoice archive job", k=1, preset="bm25")] == [cold.id]  # miss
    assert [x.id for x in h.recall("cardinal webhook secret", k=1, preset="bm25")] == [gone.id]  # regret
    h.recall("nothing matches zyxwv", k=3, preset="bm25")
    h.recall("payment gateway", k=1, preset="bm25", track=False)  # untracked: not counted
    h.page()  # the pass that writes the recalls' bookkeeping and events

    m = Lens(h).metrics()
    assert m["needs"] == 3 and m["working_hit_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert m["retrieval_ms"]["n"] == 4
    lat = m["retrieval_ms"]
    assert 0 <= lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
    assert m["evictions"] == 1 and m["eviction_regret"] == 1.0
    assert m["regretted"][0]["id"] == gone.id


def test_a_recall_before_an_eviction_is_no_regret_whenever_its_event_is_logged(
    h: Harness, clock: ReplayClock
) -> None:
    """A tracked recall's event is logged by the pager's next pass: here after the expiry that followed
    the recall (tick() runs it), so its number comes later, but its time says it came first."""
    m = h.record(
        "a temporary token for the staging deploy", session_id="s1", expires_at=T0 + timedelta(minutes=30)
    )
    h.recall("temporary token staging", k=1, preset="bm25")
    clock.now = T0 + timedelta(hours=1)
    h.tick()
    assert h.get(m.id).tier is Tier.ARCHIVE
    metrics = Lens(h).metrics()
    assert metrics["evictions"] == 1 and metrics["eviction_regret"] == 0.0
    h.recall("temporary token staging", k=1, preset="bm25", status="any")  # needed again after it
    h.flush()
    assert Lens(h).metrics()["eviction_regret"] == 1.0


def test_context_tokens_and_quality_rates(h: Harness, clock: ReplayClock) -> None:
    a = h.record("deploy window is friday 18:00 lisbon time", session_id="s1")
    h.record("Deploy window is Friday   18:00 Lisbon time", session_id="s1")  # duplicate (case, spaces)
    h.record("ok", session_id="s1")  # junk: fewer than three words
    h.record("the old escalation contact was Maria", session_id="s1", expires_at=T0 + timedelta(hours=1))
    h.record("the escalation contact is Tomás", session_id="s1", links=[{"type": "revises", "target": a.id}])
    c1 = h.context("deploy window", budget_tokens=300, session_id="s1")
    c2 = h.context("escalation contact", budget_tokens=60, session_id="s1")
    clock.now = T0 + timedelta(hours=2)  # the TTL memory is past expires_at (tick has not run)

    m = Lens(h).metrics()
    ct = m["context_tokens"]
    assert ct["builds"] == 2 and ct["mean"] == pytest.approx((c1.tokens + c2.tokens) / 2, abs=0.1)
    assert ct["max"] == max(c1.tokens, c2.tokens)
    assert [(s["tokens"], s["budget"]) for s in ct["series"]] == [(c1.tokens, 300), (c2.tokens, 60)]
    assert m["context_ms"]["n"] == 2
    assert m["active"] == 4 == h.count()  # past its TTL is expired, swept or not, as reads show it
    assert m["duplicate_rate"] == pytest.approx(1 / 4)
    assert m["junk_rate"] == pytest.approx(1 / 4)
    assert m["stale_rate"] == pytest.approx(1 / 4)  # revised (a)


def test_tool_reliability_comes_from_the_recorded_calls(h: Harness) -> None:
    @h.tool("flaky_api", timeout_errors=(TimeoutError,), session_id="s1")
    def flaky(n: int) -> int:
        raise TimeoutError(f"read timed out ({n})")

    for n in range(3):
        with pytest.raises(TimeoutError):
            flaky(n)
    tools = {t["tool"]: t for t in Lens(h).metrics()["tools"]}
    assert tools["flaky_api"]["errors"] == 3 and tools["flaky_api"]["timeouts"] == 3
    assert tools["flaky_api"]["unreliable"] is True


def test_lens_keeps_up_incrementally(h: Harness) -> None:
    lens = Lens(h)
    assert lens.metrics()["memories"] == 0
    m = h.record("first memory of the session", session_id="s1")
    h.pin(m.id)
    lens.refresh()
    assert lens.rows[m.id].pinned and lens.rows[m.id].tier == "working"
    h.forget(h.record("to be forgotten soon", session_id="s1").id)
    assert lens.metrics()["memories"] == 1


def test_the_lens_shows_a_memory_past_its_expiry_expired_as_reads_do(h: Harness, clock: ReplayClock) -> None:
    """The dashboard listed it active (under "active", not under "expired") until a tick swept it."""
    from clawvm.dashboard import views

    lens = Lens(h)
    due = h.record("one-time code 4471", session_id="s1", expires_at=T0 + timedelta(hours=1))
    h.record("the deploy runbook", session_id="s1")
    lens.refresh()
    assert lens.rows[due.id].status == "active"
    clock.advance(hours=2)
    lens.refresh()
    expired = views.memories(lens, views.RowFilter(status="expired"), "newest", 0, 50)
    assert [r["id"] for r in expired["items"]] == [due.id] and lens.metrics()["active"] == h.count() == 1


def test_team_grants_never_show_as_memories(h: Harness) -> None:
    h.grant("team-a", "planner", write=True)
    lens = Lens(h)  # grants stored before the lens loads
    m = h.record("the plan for the release", session_id="s1")
    h.grant("team-a", "writer")  # and one after: seen through the event log
    lens.refresh()
    assert list(lens.rows) == [m.id] and lens.metrics()["memories"] == 1


# ---- influence and citations -----------------------------------------------------------------------------
def test_influence_marks_cited_and_feeds_value(h: Harness) -> None:
    cited = h.record("the EU regional host works for tessera charges", session_id="s1")
    other = h.record("the tessera charges dashboard is slow today", session_id="s1")
    ctx = h.context("tessera charges host", budget_tokens=400, session_id="s1")
    assert {cited.id, other.id} <= set(ctx.ids) and ctx.event_seq is not None
    before = {e.id: e for e in ctx.manifest}
    short = before[cited.id].short_id

    out = record_output(h, ctx, f"Use the EU regional host [{short}].", success=True)
    assert out.cited == [cited.id] and other.id in out.uncited

    lens = Lens(h)
    trace = lens.influence(ctx.event_seq)
    lines = {x["id"]: x for x in trace["lines"]}
    assert lines[cited.id]["cited"] is True and lines[other.id]["cited"] is False
    for mid in (cited.id, other.id):  # tier and value as they were at the build
        assert (lines[mid]["tier"], lines[mid]["value"]) == (before[mid].tier, before[mid].value)
    assert trace["output"]["success"] is True and short in trace["output"]["text"]
    assert [c["seq"] for c in lens.contexts_of(cited.id)] == [ctx.event_seq]
    assert lens.contexts_of(cited.id)[0]["cited"] is True

    now = h.get(cited.id)
    assert (now.usage.cited, now.usage.successes, now.usage.injected) == (1, 1, 1)
    assert h.explain(cited.id).cited == pytest.approx(DEFAULT_SCORING.cite_weight)  # cited/injected = 1
    assert h.explain(other.id).cited == 0.0 and h.get(other.id).usage.cited == 0

    # a second model call from the same context: its citations add up, as the usage counts them (the
    # latest output alone used to replace the first, un-citing what it cited)
    second = f"And the dashboard is slow [{before[other.id].short_id}]."
    record_output(h, ctx, second, success=False)
    lines = {x["id"]: x for x in Lens(h).influence(ctx.event_seq)["lines"]}
    assert lines[cited.id]["cited"] is True and lines[other.id]["cited"] is True
    assert (h.get(cited.id).usage.cited, h.get(other.id).usage.cited) == (1, 1)


def test_an_output_whose_event_cannot_be_logged_credits_no_citation(tmp_path: Path) -> None:
    """The citations' credit and the ``output`` event are one write: a disk that refuses the event (a
    trigger stands in for it) leaves the cited memory's counts as they were. They were written apart,
    the credit first, so a failure between them fed the value a citation the log never had; the caller's
    retry then credited it twice."""
    with Harness.open(tmp_path / "h.db", embedder=None) as h:
        m = h.record("the EU regional host works for tessera charges", session_id="s1")
        ctx = h.context("tessera charges host", budget_tokens=400, session_id="s1")
        output = f"Use the EU regional host [{ctx.manifest[0].short_id}]."
        with events_refused(tmp_path / "h.db", "output"), pytest.raises(StoreError):
            record_output(h, ctx, output, success=True)
        assert (h.get(m.id).usage.cited, h.get(m.id).usage.successes) == (0, 0)
        out = record_output(h, ctx, output, success=True)  # the caller's retry counts once
        assert out.cited == [m.id] and (h.get(m.id).usage.cited, h.get(m.id).usage.successes) == (1, 1)
        assert h.events()[-1].seq == out.event_seq and h.events()[-1].kind == "output"


def test_record_output_rejects_what_is_not_a_context_build(h: Harness) -> None:
    m = h.record("a memory", session_id="s1")
    add_seq = h.events(memory_id=m.id)[0].seq or 0
    with pytest.raises(NotFoundError):
        record_output(h, add_seq, "text")
    with pytest.raises(NotFoundError):
        record_output(h, 10**9, "text")
    with pytest.raises(ValidationError):
        record_output(h, add_seq, b"not text")  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        Lens(h).influence(add_seq)


# ---- the learning rule ------------------------------------------------------------------------------------
_TEXTS = st.sampled_from(
    [
        "plain words only here",
        "TimeoutError: read timed out after 10 s",
        "final answer: the root cause was the cache",
        "```def f(x): return x```",
        "Priya Raman moved the cutover to Friday",
    ]
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    kind=st.sampled_from(list(Kind)),
    text=_TEXTS,
    hours=st.floats(0, 2000),
    usage=st.tuples(
        st.integers(0, 30), st.integers(0, 30), st.integers(0, 10), st.integers(0, 10), st.integers(-5, 5)
    ),
    access=st.integers(0, 50),
    seconds=st.floats(0, 100),
    target=st.floats(0, 1),
    rate=st.floats(0.01, 1),
)
def test_learning_step_moves_the_value_toward_the_target(
    kind: Kind,
    text: str,
    hours: float,
    usage: tuple[int, int, int, int, int],
    access: int,
    seconds: float,
    target: float,
    rate: float,
) -> None:
    injected, cited, ok, bad, votes = usage
    m = Memory(
        content=text,
        kind=kind,
        created_at=T0,
        access_count=access,
        cost=Cost(seconds=seconds),
        usage=Usage(
            injected=injected, cited=min(cited, injected), successes=ok, failures=bad, feedback=votes
        ),
    )
    now = T0 + timedelta(hours=hours)
    cfg = DEFAULT_SCORING
    before = raw_value(m, now, cfg)
    new, delta = learn(cfg, m, now, target, rate)
    after = raw_value(m, now, new)
    assert abs(after - target) <= abs(before - target) + 1e-9  # never away from the target
    assert set(delta) <= set(features(m, now, cfg))  # only weights this memory depends on move
    weights = weights_of(new)
    assert all(0.0 <= v <= 1.0 for v in weights["base"].values())
    assert all(0.0 <= v <= 1.0 for k, v in weights.items() if k != "base")
    clipped = any(v in (0.0, 1.0) for k, v in weights.items() if k != "base") or any(
        v in (0.0, 1.0) for v in weights["base"].values()
    )
    assert all(abs(v) <= MAX_WEIGHT_STEP + 1e-9 for v in delta.values())  # one action, a bounded step
    bounded = any(abs(v) >= MAX_WEIGHT_STEP - 1e-6 for v in delta.values())
    small = sum(x * x for x in features(m, now, cfg).values()) < 1.0
    # never past `rate` of the way (an old memory, a bound or a clip only make the step shorter)
    assert abs(after - before) <= rate * abs(target - before) + 1e-9
    if not clipped and not bounded and not small:  # the documented step: exactly `rate` of the way
        assert after == pytest.approx(before + rate * (target - before), abs=1e-9)


def test_pinning_one_very_old_memory_does_not_revalue_its_kind(h: Harness, clock: ReplayClock) -> None:
    ancient = h.record("a note from the first week of the project", kind="note", session_id="s1")
    clock.now = T0 + timedelta(days=3650)  # ten years on: its recency factor is the floor
    fresh = h.record("a note written today about the invoices", kind="note", session_id="s1")
    base_before = h.pager.config.scoring.base["note"]
    fresh_before = h.pager.value_now(h.get(fresh.id), clock.now)
    learned = intervene(h, "pin", ancient.id)["learned"]
    moved = h.pager.config.scoring.base["note"] - base_before
    assert 0.0 < moved <= MAX_WEIGHT_STEP and learned["base:note"] == pytest.approx(moved, abs=1e-6)
    assert 0.0 < h.pager.value_now(h.get(fresh.id), clock.now) - fresh_before <= MAX_WEIGHT_STEP + 1e-9


def test_a_near_zero_recency_factor_is_not_a_divisor() -> None:
    # no recency floor and an ancient memory: its base feature is ~1e-9; dividing by its square sent the
    # kind's base weight to the clip (every note worth 1.0) after one pin
    cfg = replace(DEFAULT_SCORING, recency_floor=0.0)
    old = Memory(content="an old note", kind=Kind.NOTE, created_at=T0)
    now = T0 + timedelta(days=200)
    assert 0.0 < features(old, now, cfg)["base:note"] < 1e-6
    new, delta = learn(cfg, old, now, target=1.0)
    assert abs(new.base["note"] - cfg.base["note"]) < 1e-6 and all(abs(v) < 1e-6 for v in delta.values())


def test_learn_rejects_a_bad_rate() -> None:
    with pytest.raises(ValidationError):
        learn(DEFAULT_SCORING, Memory(content="x"), T0, 1.0, rate=0.0)


def test_manual_actions_are_events_and_teach_the_scorer(h: Harness, clock: ReplayClock) -> None:
    note = h.record("User profile: prefers Lisbon time and EUR tables", kind="note", session_id="s1")
    thought = h.record("maybe check the logs later", kind="llm_thought", session_id="s1")
    other_note = h.record("a second note about reports", kind="note", session_id="s1")
    base_before = h.pager.config.scoring.base["note"]
    clock.now = T0 + timedelta(minutes=5)

    pinned = intervene(h, "pin", note.id, by="tester")
    assert pinned["after"]["pinned"] and pinned["after"]["tier"] == "working"
    assert pinned["learned"]["base:note"] > 0  # a pin says notes are worth more
    assert h.pager.config.scoring.base["note"] > base_before
    assert h.pager.value_now(h.get(other_note.id), clock.now) > other_note.value  # a similar memory rose

    before = h.get(thought.id).value
    low = intervene(h, "set_value", thought.id, value=0.0)
    assert low["learned"]["base:llm_thought"] < 0
    assert h.get(thought.id).value < before and h.get(thought.id).usage.feedback < 0

    notes_before = dict(h.get(note.id).metadata)
    ann = intervene(h, "annotate", note.id, note="confirmed on the call")
    assert ann["learned"] == {} and "annotations" not in notes_before
    assert h.get(note.id).metadata["annotations"][0]["text"] == "confirmed on the call"

    arch = intervene(h, "archive", note.id)
    assert arch["after"] == {**arch["after"], "tier": "archive", "pinned": False}
    assert intervene(h, "unpin", thought.id)["learned"] == {}

    manual = [e for e in h.events(limit=10**6) if e.kind == "manual"]
    assert [e.data["action"] for e in manual] == ["pin", "set_value", "annotate", "archive", "unpin"]
    assert manual[0].data["by"] == "tester" and manual[0].data["before"]["pinned"] is False
    weights = [e for e in h.events(limit=10**6) if e.kind == "scoring_weights"]
    assert [e.data["action"] for e in weights] == ["pin", "set_value", "archive"]
    assert weights[-1].data["weights"] == weights_of(h.pager.config.scoring)

    # a new harness over the same store gets the learned weights back when it opens, before anyone looks
    fresh = Harness(engine_of(h), None, clock=clock)
    assert weights_of(fresh.pager.config.scoring) == weights[-1].data["weights"]
    assert fresh.pager.config.scoring != DEFAULT_SCORING


def test_moving_a_pinned_memory_out_of_the_working_tier_ends_its_pin(h: Harness) -> None:
    """As update(tier=) does: kept, the moved memory stayed pinned in short-term, outside the pin budget
    (which counts the working tier's pins), so one more pin than the budget holds was accepted."""
    m = h.record("the deploy freeze starts friday", session_id="s1")
    h.pin(m.id)
    moved = intervene(h, "set_tier", m.id, tier="short_term")
    assert moved["after"]["tier"] == "short_term" and moved["after"]["pinned"] is False
    assert not h.get(m.id).pinned and "unpinned" in h.events(memory_id=m.id)[-2].data["reason"]
    assert intervene(h, "set_tier", m.id, tier="long_term")["after"]["pinned"] is False  # not pinned: moved


def test_a_manual_actions_events_come_in_time_order() -> None:
    """A pin reads the clock itself: the manual and scoring_weights events after it were logged at the
    instant read before it, so the memory's value series came out of order."""
    ticks = itertools.count()
    with Harness.open("memory://", embedder=None, clock=lambda: T0 + timedelta(seconds=next(ticks))) as h:
        m = h.record("the runbook for the payments outage", session_id="s1")
        intervene(h, "pin", m.id)
        logged = h.events()
        assert [e.kind for e in logged][-2:] == ["scoring_weights", "manual"]
        assert [e.at for e in logged] == sorted(e.at for e in logged)


def test_archive_never_raises_a_value(h: Harness, clock: ReplayClock) -> None:
    pinned = h.record("User profile: prefers Lisbon time", kind="note", session_id="s1")
    plain = h.record("another note about reports", kind="note", session_id="s1")
    liked = h.record("a note people voted up", kind="note", session_id="s1")
    disliked = h.record("a note people voted down", kind="note", session_id="s1")
    for m, votes, failures in ((liked, 6, 0), (disliked, -20, 5)):
        h.pager.mutate(
            h.get(m.id),
            lambda cur, v=votes, f=failures: {
                "usage": cur.usage.model_copy(update={"feedback": v, "failures": f})
            },
            clock.now,
        )
    for _ in range(4):  # the note weights rise: stored values of the other notes are now stale-low
        intervene(h, "pin", pinned.id)
        intervene(h, "unpin", pinned.id)
    clock.now = T0 + timedelta(days=90)  # old enough that `disliked` is worth less than nothing, raw
    assert raw_value(h.get(disliked.id), clock.now, h.pager.config.scoring) < 0
    everyone = [pinned, plain, liked, disliked]
    for target in (plain, disliked, pinned):
        values = {m.id: h.pager.value_now(h.get(m.id), clock.now) for m in everyone}
        done = intervene(h, "archive", target.id)
        assert done["after"]["tier"] == "archive"
        assert done["after"]["value"] <= done["before"]["value"]
        assert h.get(target.id).value <= values[target.id] + 1e-9
        assert all(v < 0 for v in done["learned"].values())  # an archive only lowers weights
        for m in everyone:  # no memory, archived or not, is worth more after an archive
            assert h.pager.value_now(h.get(m.id), clock.now) <= values[m.id] + 1e-9, (
                target.content,
                m.content,
            )


def test_manual_action_input_is_checked(h: Harness) -> None:
    m = h.record("something worth pinning", session_id="s1")
    with pytest.raises(ValidationError):
        intervene(h, "delete", m.id)
    with pytest.raises(ValidationError):
        intervene(h, "set_value", m.id, value=1.5)
    with pytest.raises(ValidationError, match="value"):
        intervene(h, "set_value", m.id, value=True)  # a bool is an int to Python, not a value to a person
    with pytest.raises(ValidationError):
        intervene(h, "annotate", m.id, note="  ")
    h.pin(m.id)
    with pytest.raises(ValidationError):
        intervene(h, "set_value", m.id, value=0.2)
    with pytest.raises(NotFoundError):
        intervene(h, "pin", "01a22883-0000-7000-8000-000000000000")
    assert not [e for e in h.events(limit=10**6) if e.kind in ("manual", "scoring_weights")]


def test_restore_weights_ignores_nothing_and_unknown_keys() -> None:
    h = Harness.open("memory://", embedder=None)
    try:
        restore_weights(h, None)
        assert h.pager.config.scoring == DEFAULT_SCORING
        learned = {"cite_weight": 0.3, "base": {"note": 0.7}, "unknown": 1}
        event = Event("scoring_weights", data={"weights": learned})
        restore_weights(h, event)
        cfg = h.pager.config.scoring
        assert (cfg.cite_weight, cfg.base["note"], cfg.base["decision"]) == (0.3, 0.7, 0.55)
        assert replace(cfg, cite_weight=0.15, base=DEFAULT_SCORING.base) == DEFAULT_SCORING
    finally:
        h.close()


# ---- export and retention ---------------------------------------------------------------------------------
def _activity(h: Harness, clock: ReplayClock) -> None:
    for i in range(6):
        clock.now = T0 + timedelta(days=i)
        m = h.record(f"day {i}: the charge api answered in {100 + i} ms", session_id=f"s{i % 2}")
        h.recall("charge api", k=2, preset="bm25")
        ctx = h.context("charge api latency", budget_tokens=200, session_id=f"s{i % 2}")
        record_output(h, ctx, f"answer citing [{ctx.manifest[0].short_id}]")
    intervene(h, "pin", m.id)


def test_export_jsonl_and_parquet_with_duckdb_queries(h: Harness, clock: ReplayClock, tmp_path: Path) -> None:
    _activity(h, clock)
    events = h.events(limit=10**6)
    kinds = Counter(e.kind for e in events)

    lines = tmp_path / "events.jsonl"
    with lines.open("w", encoding="utf-8") as fh:
        assert export_jsonl(h.store, fh) == len(events)
    parsed = [json.loads(x) for x in lines.read_text(encoding="utf-8").splitlines()]
    assert [p["seq"] for p in parsed] == [e.seq for e in events]
    assert parsed[0]["data"] == events[0].data and parsed[0]["at"] == events[0].at.isoformat()

    parquet = tmp_path / "events.parquet"
    assert export_parquet(h.store, parquet, batch=7) == len(events)  # several row groups
    assert dict(run_query(parquet, "events_by_kind")) == dict(kinds)
    builds, mean_tokens, max_tokens = run_query(parquet, "context_tokens")[0]
    contexts = [e for e in events if e.kind == "context"]
    assert builds == 6 and max_tokens == max(e.data["tokens"] for e in contexts)
    assert mean_tokens == pytest.approx(sum(e.data["tokens"] for e in contexts) / 6)
    recalls, p50, p95 = run_query(parquet, "retrieval_latency_ms")[0]
    assert recalls == kinds["retrieve"] and 0 <= p50 <= p95
    injected = Counter(line["id"] for e in contexts for line in e.data["manifest"])
    assert dict(run_query(parquet, "most_injected")) == dict(injected.most_common(20))
    assert [r[3] for r in run_query(parquet, "manual_actions")] == ["pin"]
    per_session = {r[0]: r[1] for r in run_query(parquet, "events_per_session")}
    assert set(per_session) == {"s0", "s1"}
    for name in DUCKDB_QUERIES:  # every documented query runs
        run_query(parquet, name)
    with pytest.raises(ValidationError):
        run_query(parquet, "nope")


def test_retention_drops_the_head_and_keeps_learned_weights(h: Harness, clock: ReplayClock) -> None:
    _activity(h, clock)
    total = len(h.events(limit=10**6))
    last_seq = h.events(limit=10**6)[-1].seq or 0
    weights = [e for e in h.events(limit=10**6) if e.kind == "scoring_weights"][-1]

    assert prune(engine_of(h), Retention(max_age_days=1000), clock.now) == 0
    dropped = prune(engine_of(h), Retention(max_age_days=2.5), clock.now)
    kept = h.events(limit=10**6)
    cutoff = clock.now - timedelta(days=2.5)
    assert dropped > 0 and all(e.at >= cutoff for e in kept[:1])
    # the weights event was newer than the cutoff: nothing carried; the log notes where it was cut
    assert len(kept) == total - dropped + 1
    assert kept[-1].kind == "events_pruned" and kept[-1].data == {"deleted": dropped}

    # the notes do not count against max_events: the newest other event stays
    assert prune(engine_of(h), Retention(max_events=1), clock.now) == len(kept) - 2
    kept = h.events(limit=10**6)
    # the newest event, the first prune's note, the carried weights, and this prune's note
    assert [e.kind for e in kept] == ["manual", "events_pruned", "scoring_weights", "events_pruned"]
    assert kept[2].data["weights"] == weights.data["weights"]
    assert kept[2].data["carried_from"] == weights.seq
    # run again, it deletes nothing: neither the notes nor the carried copy count against max_events
    assert prune(engine_of(h), Retention(max_events=1), clock.now) == 0
    assert weights_of(Harness(engine_of(h), None).pager.config.scoring) == weights.data["weights"]
    prune(engine_of(h), Retention(max_events=0), clock.now)  # not even the carried event is needed to learn
    assert weights_of(Harness(engine_of(h), None).pager.config.scoring) == weights.data["weights"]
    new_seq = engine_of(h).append_event(Event("note", data={"after": "prune"}))
    assert new_seq > last_seq  # sequence numbers are never reused
    with pytest.raises(ValidationError):
        Retention(max_events=-1)
    with pytest.raises(ValidationError):
        Retention(max_age_days=math.nan)


def test_each_tenant_that_lost_events_gets_its_own_prune_note(tmp_path: Path) -> None:
    """One note in the default tenant left the others' timelines without it; it also said a seq of the
    shared log, whose numbers a tenant is never shown, and a later prune counted old notes as events."""
    db = tmp_path / "shared.db"
    with Harness.open(db, embedder=None) as owner:
        for i in range(3):
            owner.record(f"owner {i}")
    with Harness.open(db, embedder=None, tenant="acme") as acme:
        for i in range(4):
            acme.record(f"acme {i}")
    with Harness.open(db, embedder=None) as owner:
        for i in range(2):
            owner.record(f"owner again {i}")
        assert prune(engine_of(owner), Retention(max_events=2), owner.now()) == 7
    with Harness.open(db, embedder=None, tenant="acme") as acme:
        (note,) = acme.events()
        assert (note.kind, note.data) == ("events_pruned", {"deleted": 4})
        assert note.seq == 5  # acme's own next number
    with Harness.open(db, embedder=None) as owner:
        notes = {e.tenant: e.data for e in owner.events() if e.kind == "events_pruned"}
        assert notes == {"default": {"deleted": 3}, "acme": {"deleted": 4}}  # the owner's view sees all
        assert prune(engine_of(owner), Retention(max_events=2), owner.now()) == 0  # the notes do not count
        owner.record("owner, later")
        assert prune(engine_of(owner), Retention(max_events=2), owner.now()) == 1  # one event, not a note
        latest = [e for e in owner.events() if e.kind == "events_pruned"][-1]
        assert (latest.tenant, latest.data) == ("default", {"deleted": 1})


def test_cli_exports_events_and_prunes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from clawvm.cli import main

    db = tmp_path / "cli.db"
    with Harness.open(db, embedder=None) as h:
        _activity(h, ReplayClock(T0))
        total = len(h.events(limit=10**6))

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    lines = run("export", "--events").splitlines()
    assert len(lines) == total and json.loads(lines[0])["kind"] == "add"
    parquet = tmp_path / "e.parquet"
    run("export", "--events", "--format", "parquet", "-o", str(parquet))
    assert sum(n for _, n in run_query(parquet, "events_by_kind")) == total
    bad = CliRunner().invoke(main, ["--db", str(db), "export", "--format", "parquet"])
    assert bad.exit_code == 2 and "--events" in bad.output
    # another tenant's log is its own: neither exported nor counted with --tenant default (it was both)
    with Harness.open(db, embedder=None, tenant="acme") as acme:
        acme.record("acme's own note")
    assert len(run("export", "--events").splitlines()) == total
    assert json.loads(run("stats"))["events"] == total
    assert len(run("--tenant", "acme", "export", "--events").splitlines()) == 1
    assert run("prune-events", "--max-events", "5") == f"deleted {total + 1 - 5} events\n"
    with Harness.open(db, embedder=None) as h:
        assert len(h.events(limit=10**6)) == 5 + 1  # and the prune's own note (acme's event was kept)


# ---- observers observe ----------------------------------------------------------------------------------
def _state(h: Harness) -> dict[str, tuple[int, str, float, bool]]:
    return {m.id: (m.version, m.tier.value, m.value, m.pinned) for m in h.store.iter_all()}


def test_a_lens_and_the_dashboard_change_no_scoring_or_tier_state(h: Harness, clock: ReplayClock) -> None:
    """Looking is not acting: building a Lens and serving every dashboard view leave the pager's config,
    every memory's version, tier, value and pin, and the event log as they were."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from clawvm.dashboard import create_router

    _activity(h, clock)
    viewer = Harness(engine_of(h), None, clock=clock)  # another process opening the same store
    config, state = viewer.pager.config, _state(viewer)
    last_seq = viewer.events(limit=1_000_000)[-1].seq

    Lens(viewer).metrics()
    app = FastAPI()
    app.include_router(create_router(lambda: viewer))
    client = TestClient(app)
    some = next(iter(state))
    for path in (
        "overview",
        "sessions",
        "memories",
        f"memories/{some}",
        "timeline",
        "heatmap",
        "graph",
        "contexts",
        "metrics",
        "weights",
        "manual",
        f"memories/{some}/contexts",
    ):
        assert client.get(f"/dashboard/api/{path}").status_code == 200, path

    assert viewer.pager.config == config
    assert _state(viewer) == state
    assert viewer.events(after_seq=last_seq or 0) == []


def test_learned_weights_load_when_the_harness_opens(h: Harness, clock: ReplayClock) -> None:
    note = h.record("User profile: prefers Lisbon time and EUR tables", kind="note", session_id="s1")
    taught = intervene(h, "pin", note.id)
    assert taught["learned"]
    reopened = Harness(engine_of(h), None, clock=clock)
    assert weights_of(reopened.pager.config.scoring) == weights_of(h.pager.config.scoring)
    assert reopened.pager.config.scoring.base["note"] > DEFAULT_SCORING.base["note"]
    # the weights memory is the harness's own bookkeeping: never listed, counted or recalled
    assert all(m.kind is not Kind.AGENT_STATE for m in reopened.list(limit=100, status="any"))
    assert reopened.count(status="any") == h.count(status="any")


def test_two_harnesses_on_one_store_never_lose_each_others_learned_step(
    h: Harness, clock: ReplayClock
) -> None:
    """Each teacher learns from the weights stored now: one that learned from its own (loaded at open)
    wrote over the other's step, and two archives of notes stored one step."""
    other = Harness(engine_of(h), None, clock=clock)
    a = h.record("Note: the staging deploy uses blue-green", kind="note", session_id="s1")
    b = h.record("Note: the billing job retries three times", kind="note", session_id="s2")
    first = intervene(h, "archive", a.id)["learned"]
    second = intervene(other, "archive", b.id)["learned"]
    assert first["base:note"] < 0 and second["base:note"] < 0
    stored = stored_weights(h.store, a.tenant)
    assert stored is not None
    both = DEFAULT_SCORING.base["note"] + first["base:note"] + second["base:note"]
    assert stored["base"]["note"] == pytest.approx(both, abs=1e-5)
    assert weights_of(other.pager.config.scoring) == stored  # the teacher's scorer takes what it stored


class _WeightsAlwaysRaced:
    """A harness whose every write of the learned weights loses to another teacher's."""

    def __init__(self, h: Harness) -> None:
        self._h = h
        self.writer = _RacedWriter(h)

    def __getattr__(self, name: str) -> object:
        return getattr(self._h, name)


class _RacedWriter:
    def __init__(self, h: Harness) -> None:
        self._h = h

    def __getattr__(self, name: str) -> object:
        return getattr(self._h.writer, name)

    def write(self, memories: list[Memory], *args: object, **kwargs: object) -> object:
        if any(m.id == weights_id(m.tenant) for m in memories):
            raise ConflictError(memories[0].id, None, None)
        return self._h.writer.write(memories, *args, **kwargs)  # type: ignore[arg-type]


def test_a_step_that_keeps_losing_to_other_teachers_is_refused_not_dropped(h: Harness) -> None:
    """After its tries the step was dropped without a word, and the action went on as if taught."""
    note = h.record("Note: the staging deploy uses blue-green", kind="note", session_id="s1")
    weights = weights_of(h.pager.config.scoring)
    with pytest.raises(ConflictError) as refused:
        intervene(_WeightsAlwaysRaced(h), "archive", note.id)  # type: ignore[arg-type]
    assert refused.value.field == "action" and "retry" in str(refused.value.fix)
    assert h.get(note.id).tier is note.tier and h.get(note.id).status is note.status  # not archived
    assert weights_of(h.pager.config.scoring) == weights and stored_weights(h.store, note.tenant) is None
    # a pin teaches once it took place: the pin stands, logged as taught nothing (it was left unlogged,
    # with an error that asked to retry an action already done)
    pinned = intervene(_WeightsAlwaysRaced(h), "pin", note.id)  # type: ignore[arg-type]
    assert pinned["learned"] == {} and h.get(note.id).pinned
    (manual,) = [e for e in h.events(memory_id=note.id, limit=100) if e.kind == "manual"]
    assert manual.data["action"] == "pin" and "changed under each" in manual.data["untaught"]
    assert weights_of(h.pager.config.scoring) == weights


def test_a_collapsed_task_moves_its_steps_to_the_archive_on_the_timeline(
    h: Harness, clock: ReplayClock
) -> None:
    from clawvm.dashboard import views

    steps = [
        h.record(f"step {n}: tried host eu-{n}", session_id="s1", task_id="t1", state="intermediate")
        for n in range(3)
    ]
    clock.advance(minutes=5)
    summary = h.collapse_task("t1")
    assert summary is not None
    lens = Lens(h)
    archived = {mv.memory_id for mv in lens.moves if mv.kind == "archive" and mv.to_tier == "archive"}
    assert archived == {m.id for m in steps}
    series = views.timeline(lens, "s1", buckets=4)["series"]
    assert series["archive"][-1] == 3 and series["working"][-1] + series["short_term"][-1] >= 1  # the summary


def test_a_rollback_puts_its_memories_back_in_their_tiers_on_the_timeline(
    h: Harness, clock: ReplayClock
) -> None:
    """The timeline replays the rollback: its restored memories leave the archive the dashboard sent them
    to (the last bucket matched the store's tiers only until then), and the ones made since are archived."""
    from clawvm.dashboard import views

    facts = [h.record(f"fact {n} about the orion deploy", session_id="s1") for n in range(3)]
    cp = h.checkpoint("s1", "before")
    clock.advance(minutes=1)
    later = h.record("a fact the rollback undoes", session_id="s1")
    for m in facts:
        intervene(h, "archive", m.id)
    h.rollback(cp)
    lens = Lens(h)
    last = {tier: counts[-1] for tier, counts in views.timeline(lens, "s1", buckets=4)["series"].items()}
    stored = Counter(m.tier.value for m in h.list(session_id="s1", status="any"))
    assert stored["working"] == 3 and h.get(later.id).tier is Tier.ARCHIVE
    assert all(last[tier] == stored[tier] for tier in last), (last, stored)
    assert {mv.memory_id for mv in lens.moves if mv.kind == "rollback"} == {m.id for m in [*facts, later]}


def test_the_lens_reads_again_what_an_event_changed_besides_its_own_memory(h: Harness) -> None:
    """A revision makes its predecessor obsolete, a merge its sources: the lens showed them active (the
    dashboard's active count, stale rate and pins) until its periodic full reload."""
    lens = Lens(h)
    old = h.record("the staging db is db-stage-3", session_id="s1")
    h.pin(old.id)
    lens.refresh()
    head = h.revise(old.id, content="the staging db is db-stage-4")
    assert h.get(old.id).status.value == "obsolete"
    lens.refresh()
    assert old.id not in lens.rows or lens.rows[old.id].status == "obsolete"
    assert lens.metrics()["active"] == h.count() == 1 and lens.rows[head.id].status == "active"


def test_a_row_read_as_stored_is_the_row_of_the_memory() -> None:
    """The lens builds its table from stored JSON (no validation per memory); every field must come out as
    it does from the memory itself, for a memory that sets them all."""
    from clawvm.core.model import Link, LinkType
    from clawvm.observe.lens import Row

    parent = Memory(content="the call")
    full = Memory(
        content="  TimeoutError:\n read timed out after 10 s  ",
        kind=Kind.TOOL_RESULT,
        state="error",
        session_id="s1",
        task_id="t1",
        agent_id="deploy-bot",
        tool_name="tessera_charge",
        tier=Tier.SHORT_TERM,
        value=0.37,
        pinned=True,
        created_at=T0,
        last_accessed_at=T0 + timedelta(hours=2),
        expires_at=T0 + timedelta(days=3),
        parent_id=parent.id,
        links=[Link(type=LinkType.REVISES, target=parent.id)],
        tags=["payments", "eu"],
        access_count=4,
        usage=Usage(injected=3, cited=2),
        cost=Cost(seconds=10.0, tokens=612, money=0.00092),
    )
    for m in (full, parent):
        stored = json.loads(m.model_dump_json())  # what an engine keeps
        assert Row.of_stored(stored) == Row.of(m)


def test_a_revision_appears_on_the_timeline_when_it_was_made(h: Harness, clock: ReplayClock) -> None:
    """A revision logs ``revise``, not ``add``: the timeline put it at the start of the log, one memory
    more in the first bucket than existed then."""
    from clawvm.dashboard import views

    first = h.record("deploys go through the EU host", session_id="s1")
    for n in range(5):
        clock.advance(minutes=1)
        h.record(f"later note {n}", session_id="s1")
    clock.advance(minutes=1)
    h.revise(first.id, content="deploys go through the US host")
    timeline = views.timeline(Lens(h), "s1", buckets=6)  # by event position: the default
    created = [m.created_at for m in h.list(session_id="s1", status="any", limit=100)]
    for i, edge_ms in enumerate(timeline["edges"]):  # memories per bucket end: those made by then
        made = sum(at <= datetime.fromtimestamp(edge_ms / 1000, UTC) for at in created)
        assert sum(col[i] for col in timeline["series"].values()) == made


def test_a_bad_learning_rate_or_target_writes_nothing(h: Harness) -> None:
    """intervene(pin, learn_rate=-1) pinned and logged the pin, then refused the rate; "x" raised
    TypeError after the pin; learn() took targets of NaN, 7 and -3 and moved weights the whole cap."""
    m = h.record("the refund job runs nightly", session_id="s1")
    events = len(h.events(limit=1000))
    for rate in (-1, "x", float("nan"), 0):
        with pytest.raises(ValidationError) as exc:
            intervene(h, "pin", m.id, learn_rate=rate)  # type: ignore[arg-type]
        assert exc.value.field == "rate"
    with pytest.raises(ValidationError) as exc:
        intervene(h, "pin", m.id, by=None)  # type: ignore[arg-type]
    assert exc.value.field == "by"
    assert not h.get(m.id).pinned and len(h.events(limit=1000)) == events
    for target in (float("nan"), 7.0, -3.0, "1"):
        with pytest.raises(ValidationError) as exc:
            learn(h.pager.config.scoring, m, h.now(), target)  # type: ignore[arg-type]
        assert exc.value.field == "target"


def test_a_note_past_the_limit_is_refused_not_cut(h: Harness) -> None:
    """The SDK cut a 300,000-character annotation to 2,000 without a word (the dashboard's API refused it)."""
    m = h.record("the refund job runs nightly", session_id="s1")
    events = len(h.events(limit=1000))
    for action, note in (("annotate", "a" * (NOTE_MAX_CHARS + 1)), ("pin", "b" * 300_000), ("pin", 7)):
        with pytest.raises(ValidationError) as exc:
            intervene(h, action, m.id, note=note)  # type: ignore[arg-type]
        assert exc.value.field == "note" and f"{NOTE_MAX_CHARS:,}" in str(exc.value.fix)
    assert h.get(m.id) == m and len(h.events(limit=1000)) == events
    kept = intervene(h, "annotate", m.id, note="c" * NOTE_MAX_CHARS)["memory"]
    assert kept.metadata["annotations"][0]["text"] == "c" * NOTE_MAX_CHARS


def test_an_export_refuses_a_path_it_cannot_or_should_not_write(h: Harness, tmp_path: Path) -> None:
    """A missing folder raised pyarrow's FileNotFoundError, batch=0 IndexError, and any existing file was
    overwritten silently; a query of a missing or foreign file raised DuckDB's own errors."""
    h.record("one memory", session_id="s1")
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    for path, batch in ((tmp_path / "nope" / "e.parquet", 100), (tmp_path, 100), (precious, 100)):
        with pytest.raises(ValidationError) as exc:
            export_parquet(h.store, path, batch=batch)
        assert exc.value.field == "path"
    with pytest.raises(ValidationError) as exc:
        export_parquet(h.store, tmp_path / "e.parquet", batch=0)
    assert exc.value.field == "batch"
    assert precious.read_text() == "keep me"
    again = tmp_path / "again.parquet"
    assert export_parquet(h.store, again) == export_parquet(h.store, again)  # an earlier export: rewritten
    for parquet in (tmp_path / "missing.parquet", precious):
        with pytest.raises(ValidationError) as exc:
            run_query(parquet, "events_by_kind")
        assert exc.value.field == "parquet"


def test_a_view_refuses_a_parameter_it_would_have_ignored(h: Harness) -> None:
    """The SDK's views took an unknown axis or group as the default, and cols=0 raised IndexError;
    record_output of a string raised TypeError."""
    from clawvm.dashboard import views

    h.record("one memory", session_id="s1")
    lens = Lens(h)
    for call, field in (
        (lambda: views.timeline(lens, axis="bogus"), "axis"),
        (lambda: views.timeline(lens, buckets=0), "buckets"),
        (lambda: views.heatmap(lens, group="bogus"), "group"),
        (lambda: views.heatmap(lens, cols=0), "cols"),
        (lambda: record_output(h, "4", "answer"), "context"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValidationError) as exc:
            call()
        assert exc.value.field == field


class _WriterBetween:
    """The harness, with another writer changing a memory's metadata right after each read of it: the
    read-then-write window of a dashboard action, made to happen every time."""

    def __init__(self, h: Harness) -> None:
        self._h = h

    def __getattr__(self, name: str) -> object:
        return getattr(self._h, name)

    def get(self, memory_id: str) -> Memory:
        seen = self._h.get(memory_id)
        self._h.update(memory_id, metadata={**self._h.store.get(memory_id).metadata, "ticket": "OPS-1"})
        return seen


def test_an_annotation_keeps_what_another_writer_changed_meanwhile() -> None:
    """The whole metadata as read was written back with no version: the other writer's change was lost."""
    with Harness.open("memory://", embedder=None) as h:
        m = h.record("the EU host is flaky", metadata={"owner": "ann"})
        intervene(_WriterBetween(h), "annotate", m.id, note="checked by ops")  # type: ignore[arg-type]
        stored = h.get(m.id).metadata
        assert stored["owner"] == "ann" and stored["ticket"] == "OPS-1"
        assert [n["text"] for n in stored["annotations"]] == ["checked by ops"]


def test_a_lens_of_no_harness_or_of_no_memory_is_refused_by_name() -> None:
    """Lens(None) raised AttributeError; contexts_of(None) answered [] as if the memory entered none."""
    with pytest.raises(ValidationError) as exc:
        Lens(None)  # type: ignore[arg-type]
    assert exc.value.field == "harness"
    with Harness.open("memory://", embedder=None) as h:
        for bad in (None, ""):
            with pytest.raises(ValidationError) as exc:
                Lens(h).contexts_of(bad)  # type: ignore[arg-type]
            assert exc.value.field == "memory_id"


def test_a_tier_set_by_update_is_a_move_the_lens_counts(h: Harness, clock: ReplayClock) -> None:
    """update(tier="archive") logged only its update: the eviction, its regret once the memory was
    recalled, and the tier timeline all missed it, while the same move by the pager or the dashboard
    counted."""
    m = h.record("alpha database migration checklist for the payments service", session_id="s1")
    h.update(m.id, tier="archive")
    [move] = [e for e in h.events(memory_id=m.id) if e.kind == "archive"]
    assert (move.data["from"], move.data["to"], move.data["reason"]) == ("working", "archive", "update")
    h.update(m.id, tags=["checked"])  # no tier change: no move
    assert [e.kind for e in h.events(memory_id=m.id)] == ["add", "update", "archive", "update"]
    clock.now = clock.now + timedelta(minutes=5)
    h.recall("alpha database migration checklist", k=1)
    h.flush()
    metrics = Lens(h).metrics()
    assert metrics["evictions"] == 1 and [r["id"] for r in metrics["regretted"]] == [m.id]
