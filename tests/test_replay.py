"""What-if replay (clawvm.replay): a recorded session re-run offline under two policies, compared."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from clawvm import replay as whatif
from clawvm.cli import main
from clawvm.core.errors import ValidationError
from clawvm.harness import Harness
from clawvm.observe.lens import record_output
from clawvm.vm.context import short_id
from clawvm.vm.tiers import PagerConfig
from engines import engine_of

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

FACTS = [
    "The staging database lives on host db-stage-3 in the eu-west region.",
    "Deploys are frozen every Friday after 15:00 UTC by team agreement.",
    "The billing service retries a failed charge three times with backoff.",
    "Priya owns the on-call rota and wants reports as bullet points.",
    "The webhook secret rotates every 30 days; the last rotation was on 1 March.",
    "Invoices older than seven years are archived to cold storage.",
    "The cache warms from the hourly snapshot, not from the live table.",
    "Latency alerts fire when the p95 of checkout passes 800 ms for five minutes.",
]


class Clock:
    def __init__(self) -> None:
        self.at = START

    def __call__(self) -> datetime:
        return self.at

    def advance(self, minutes: float) -> None:
        self.at += timedelta(minutes=minutes)


def _session(h: Harness, clock: Clock, questions: list[tuple[str, int]]) -> list[str]:
    """Record FACTS (plus filler) into session s1, then build a context for each question and answer it
    citing the fact it asks about (when the context holds it). Returns the facts' ids."""
    ids = []
    for fact in FACTS:
        clock.advance(2)
        ids.append(h.record(fact, session_id="s1").id)
        for n in range(3):
            clock.advance(1)
            h.record(f"chatter {n} about the weather and lunch plans, nothing else", session_id="s1")
    for question, fact in questions:
        clock.advance(5)
        ctx = h.context(question, budget_tokens=400, session_id="s1")
        cited = ids[fact] if ids[fact] in ctx.ids else ctx.ids[0]
        record_output(h, ctx, f"answer from [{short_id(cited)}]", success=True)
    return ids


QUESTIONS = [
    ("Where does the staging database live?", 0),
    ("When are deploys frozen?", 1),
    ("Who owns the on-call rota?", 3),
    ("How often does the webhook secret rotate?", 4),
]


@pytest.fixture
def recorded() -> tuple[Harness, list[str]]:
    clock = Clock()
    # passes at lifecycle boundaries only, as the replay runs them: a background pass lands wherever the
    # thread scheduler puts it, so a live run with one is not reproducible to the line (CI saw 92%)
    h = Harness.open("memory://", embedder=None, clock=clock, pager=PagerConfig(background=False))
    ids = _session(h, clock, QUESTIONS)
    yield h, ids
    h.close()


def test_a_policy_that_keeps_fewer_tokens_drops_what_the_recorded_context_used(
    recorded: tuple[Harness, list[str]],
) -> None:
    h, ids = recorded
    live = whatif.Policy("live", h.pager.config)
    tight = whatif.Policy("tight", whatif.variant(h.pager.config, working_items=2), context_budget=30)
    report = whatif.replay(h, "s1", live, tight)

    assert len(report.builds) == len(QUESTIONS)
    # replayed under its own policy, the session reproduces what the live run put in its prompts
    assert report.a.recorded_kept == pytest.approx(1.0)
    assert report.a.evidence_kept == pytest.approx(1.0)
    # the tighter policy keeps fewer tokens and provably loses cited evidence, and the diff names it
    assert report.b.tokens < report.a.tokens
    assert report.b.evidence_kept is not None and report.b.evidence_kept < 1.0
    dropped = set().union(*(d.dropped_needed for d in report.builds))
    assert dropped and dropped <= {ids[fact] for _, fact in QUESTIONS}
    for d in report.builds:
        assert set(d.lines_out) >= d.dropped_needed
        assert d.tokens_b <= 30 < d.tokens_a
    text = whatif.format_report(report)
    assert "← dropped " + short_id(sorted(dropped)[0]) in text or short_id(sorted(dropped)[0]) in text
    assert "evidence kept" in text and "100.0%" in text


def test_eviction_regret_counts_memories_paged_out_then_needed(recorded: tuple[Harness, list[str]]) -> None:
    h, _ = recorded
    tiny = PagerConfig(budgets=whatif.variant(h.pager.config, working_items=1).budgets)
    report = whatif.replay(
        h, "s1", whatif.Policy("live", h.pager.config), whatif.Policy("tiny", tiny), reach="session"
    )
    # every regretted memory was paged out of working in that replay and missing from a build needing it
    for memory_id in report.b.regret:
        assert memory_id in report.b.evicted
        assert any(memory_id in b.needed and memory_id not in b.ids for b in report.b.builds)
    assert report.b.summary()["eviction_regret"] == len(report.b.regret)


def test_replay_never_writes_to_the_live_store(recorded: tuple[Harness, list[str]]) -> None:
    h, _ = recorded
    before_events = [(e.seq, e.kind) for e in h.events(limit=1000)]
    before = {m.id: (m.version, m.tier, m.usage, m.value) for m in h.iter_all(status="any")}
    whatif.replay(
        h, "s1", whatif.Policy("a", h.pager.config), whatif.Policy("b", h.pager.config, context_budget=50)
    )
    assert [(e.seq, e.kind) for e in h.events(limit=1000)] == before_events
    assert {m.id: (m.version, m.tier, m.usage, m.value) for m in h.iter_all(status="any")} == before


def test_weights_change_the_values_the_pager_sees(recorded: tuple[Harness, list[str]]) -> None:
    h, _ = recorded
    changed = whatif.variant(h.pager.config, weights={"cite_weight": 0.9, "recency_floor": 0.9})
    assert changed.scoring.cite_weight == 0.9 and changed.scoring.recency_floor == 0.9
    assert h.pager.config.scoring.cite_weight != 0.9  # the live config is untouched
    with pytest.raises(ValidationError) as err:
        whatif.variant(h.pager.config, weights={"bogus": 1.0})
    assert err.value.field == "weights.bogus" and "cite_weight" in str(err.value)


def test_a_session_without_builds_is_a_clear_error(recorded: tuple[Harness, list[str]]) -> None:
    h, _ = recorded
    with pytest.raises(ValidationError) as err:
        whatif.replay(h, "nope", whatif.Policy("a"), whatif.Policy("b"))
    assert err.value.field == "session_id"


def test_cli_replay_prints_the_comparison_and_writes_json(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    clock = Clock()
    h = Harness.open(db, embedder=None, clock=clock, pager=PagerConfig(background=False))  # as above
    _session(h, clock, QUESTIONS)
    h.close()
    out = tmp_path / "replay.json"
    runner = CliRunner()
    args = ["--db", str(db), "--no-embed", "replay", "s1", "--budget", "30", "--json", str(out)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "session s1: 4 context builds replayed" in result.output
    assert "evidence kept" in result.output and "eviction regret" in result.output
    saved = json.loads(out.read_text())
    assert saved["a"]["evidence_kept"] == 1.0 and saved["b"]["evidence_kept"] < 1.0
    bad = runner.invoke(main, ["--db", str(db), "--no-embed", "replay", "s1", "--weight", "cite_weight"])
    assert bad.exit_code == 2 and "NAME=NUMBER" in bad.output
    for budget in ("0", "-5"):  # 0 once read as "not given" and replayed A as B
        bad = runner.invoke(main, ["--db", str(db), "--no-embed", "replay", "s1", "--budget", budget])
        assert bad.exit_code == 2 and "budget" in bad.output and "positive" in bad.output, bad.output
    same = runner.invoke(main, ["--db", str(db), "--no-embed", "replay", "s1"])
    assert same.exit_code == 0 and "B is the current policy" in same.output


def test_a_zero_vector_an_older_version_stored_replays_lexical_only(tmp_path: Path) -> None:
    """An older version stored zero vectors; record and attach_vectors refuse them now, so replaying such a
    store (`clawvm replay`, the dashboard's what-if) failed with a ValidationError on ``embedding``. Those
    memories, recorded or imported, replay without a vector: lexical search still puts them in a build."""
    db = tmp_path / "old.db"
    rng = np.random.default_rng(0)
    clock = Clock()
    with Harness.open(db, embedder=None, clock=clock, pager=PagerConfig(background=False)) as h:
        for n in range(5):
            clock.advance(1)
            h.record(f"fact {n} about lunch plans", session_id="s1", embedding=rng.standard_normal(384))
        zero = h.record("the staging database host", session_id="s1", embedding=rng.standard_normal(384)).id
        # a backup from elsewhere, restored here (on the same clock: an import refuses a memory created
        # after the harness's clock, as record does)
        with Harness.open("memory://", embedder=None, clock=clock) as other:
            exported = other.record("the staging database region is eu-west", session_id="s1")
        h.import_memories([exported])
        clock.advance(5)
        h.context("where is the staging database?", budget_tokens=400, session_id="s1")
    with closing(sqlite3.connect(db)) as con, con:  # as the older version, which took zeros, stored them
        blank = np.zeros(384, dtype="<f4").tobytes()
        con.executemany(
            "UPDATE memories SET embedding = ? WHERE id = ?", [(blank, zero), (blank, exported.id)]
        )
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "replay", "s1", "--budget", "100"])
    assert result.exit_code == 0 and "session s1: 1 context builds replayed" in result.output, result.output
    with Harness.open(db, embedder=None, pager=PagerConfig(background=False)) as h:
        assert len(h.store.vectors_of([zero, exported.id])) == 2  # the live store is only read
        report = whatif.replay(
            h, "s1", whatif.Policy("a", h.pager.config), whatif.Policy("b", h.pager.config)
        )
    assert {zero, exported.id} <= set(report.a.builds[0].ids)


def test_cli_replays_the_demo(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--no-embed", "replay", "--demo", "--budget", "250"])
    assert result.exit_code == 0, result.output
    assert "session s5: 16 context builds replayed" in result.output
    assert "← dropped" in result.output


def _tiny_locomo(tmp_path: Path) -> Path:
    """Two conversations in LoCoMo's format (the turns of tests/tiny_locomo.py, written for the tests), each
    with two multi-hop questions of two evidence turns (one written as LoCoMo sometimes does, "D1:3; D2:4")
    and an adversarial one without evidence."""
    from tiny_locomo import conversation

    samples = []
    for n in (1, 2):
        sample = conversation(n)
        turns = [t for key in ("session_1", "session_2") for t in sample["conversation"][key]]
        sample["qa"] = [
            {
                "question": "What is the kitten called and where is the sister's wedding?",
                "answer": "Pepper; Lisbon",
                "evidence": [turns[0]["dia_id"], turns[1]["dia_id"]],
                "category": 1,
            },
            {
                "question": "How was the tap fixed and what grows on the balcony?",
                "answer": "a new washer; tomatoes, basil and chillies",
                "evidence": [f"{turns[2]['dia_id']}; {turns[9]['dia_id']}"],
                "category": 1,
            },
            {
                "question": "Is anything unanswerable?",
                "adversarial_answer": "no",
                "evidence": [],
                "category": 5,
            },
        ]
        samples.append(sample)
    path = tmp_path / "tiny_locomo.json"
    path.write_text(json.dumps(samples))
    return path


def test_a_locomo_conversation_is_recorded_with_a_build_per_question_and_replays(tmp_path: Path) -> None:
    from clawvm.demo import ingest_locomo_conversation, load_locomo

    [first, _] = load_locomo(_tiny_locomo(tmp_path))
    h = Harness.open("memory://", embedder=None, clock=Clock())
    try:
        done = ingest_locomo_conversation(h, first)
        # 12 turns, 2 questions with evidence (the adversarial one has none: no build)
        assert (done.session_id, done.turns, done.builds, done.evidence_in_context) == ("conv-1", 12, 2, 2)
        dia = {m.metadata["dia_id"]: m.id for m in h.iter_all(session_id="conv-1")}
        report = whatif.replay(
            h, "conv-1", whatif.Policy("live", h.pager.config), whatif.Policy("tight", context_budget=40)
        )
    finally:
        h.close()
    # what each build needed is its question's two evidence turns, both in the recorded context
    wanted = [{dia["D1:1"], dia["D1:2"]}, {dia["D1:3"], dia["D2:4"]}]
    assert [set(d.needed) for d in report.builds] == wanted
    assert report.a.evidence_kept == pytest.approx(1.0)
    # 40 tokens hold one line of each answer's two: the other is dropped, and the diff names it
    assert report.b.evidence_kept == pytest.approx(0.5)
    for d, needed in zip(report.builds, wanted, strict=True):
        assert (
            len(d.dropped_needed) == 1 and d.dropped_needed <= needed and d.dropped_needed <= set(d.lines_out)
        )


def test_cli_replays_a_locomo_conversation(tmp_path: Path) -> None:
    path = _tiny_locomo(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["--no-embed", "replay", "--locomo", str(path), "conv-2", "--budget", "40"])
    assert result.exit_code == 0, result.output
    assert "session conv-2: 2 context builds replayed" in result.output
    assert result.output.count("← dropped") == 2
    rows = {line[:22].strip(): line[22:].split() for line in result.output.splitlines()}
    assert rows["evidence kept"] == ["100.0%", "50.0%"]
    first = runner.invoke(main, ["--no-embed", "replay", "--locomo", str(path)])
    assert first.exit_code == 0 and "session conv-1:" in first.output
    bad = runner.invoke(main, ["--no-embed", "replay", "--locomo", str(path), "conv-9"])
    assert bad.exit_code != 0 and "conv-1, conv-2" in bad.output


def test_the_dashboard_what_if_replays_a_locomo_conversation(tmp_path: Path) -> None:
    """Ingested into a served store (as `clawvm demo --dashboard --locomo PATH` does), a conversation is a
    session the what-if view can pick: its builds replay, and a smaller budget shows the evidence dropped."""
    from fastapi.testclient import TestClient

    from clawvm.demo import ingest_locomo
    from clawvm.server import create_app

    h = Harness.open("memory://", embedder=None, clock=Clock())
    assert ingest_locomo(h, _tiny_locomo(tmp_path)) == 24
    app = create_app(engine_of(h), embedder=None)
    try:
        with TestClient(app) as client:
            _, key = app.state.service.keyring.create("default", "read-only", "test")
            auth = {"Authorization": f"Bearer {key}"}
            sessions = client.get("/dashboard/api/sessions", headers=auth).json()["items"]
            assert {s["session_id"]: s["contexts"] for s in sessions} == {"conv-1": 2, "conv-2": 2}
            r = client.get("/dashboard/api/whatif", params={"session": "conv-2", "budget": 40}, headers=auth)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["a"]["evidence_kept"] == 1.0 and body["b"]["evidence_kept"] == 0.5
            assert all(len(b["dropped_needed"]) == 1 for b in body["builds"])
    finally:
        h.close()


def test_shares_round_a_tie_up_as_the_dashboard_does() -> None:
    from clawvm.replay import _fmt

    assert [_fmt(9 / 16), _fmt(1 / 16), _fmt(0.3891), _fmt(1.0), _fmt(None)] == [
        "56.3%",
        "6.3%",
        "38.9%",
        "100.0%",
        "–",
    ]


def _open(clock: Clock) -> Harness:
    return Harness.open("memory://", embedder=None, clock=clock, pager=PagerConfig(background=False))


def test_memories_compressed_approved_or_rejected_replay(recorded: tuple[Harness, list[str]]) -> None:
    # their compression pointers and reviews are the harness's to set: a replayed record carrying them
    # was refused, and the whole replay failed
    h, _ = recorded
    long_text = " ".join(
        f"Sentence {n} says the staging database runs on db-stage-3 in the eu-west region."
        if n % 2
        else "The team discussed several matters regarding the roadmap and the hiring plans here."
        for n in range(20)
    )
    long = h.record(long_text, session_id="s1")
    low = [
        h.record(f"unsure note {n} about the staging database", session_id="s1", confidence=0.2) for n in "ab"
    ]
    h.compress(long.id)
    h.approve(low[0].id, by="alice")
    h.reject(low[1].id, by="alice")
    h.context("Where does the staging database live?", budget_tokens=400, session_id="s1")
    assert "compression" in h.get(long.id).metadata
    assert all("review" in h.get(m.id).metadata for m in low)

    report = whatif.replay(h, "s1", whatif.Policy("a"), whatif.Policy("b", context_budget=60))

    assert len(report.builds) == len(QUESTIONS) + 1
    assert report.a.recorded_kept is not None and report.a.recorded_kept > 0.9


def test_a_pin_made_at_record_time_and_a_ttl_replay() -> None:
    clock = Clock()
    h = _open(clock)
    pinned = h.record("deploy rule: always use blue-green", session_id="s", pinned=True)
    h.record("deploy checklist: deploy, verify the deploy, then announce the deploy", session_id="s")
    code = h.record("one-time deploy code 123456", session_id="s", expires_at=START + timedelta(minutes=10))
    clock.advance(30)
    live = h.context("deploy", session_id="s")
    assert [e.section for e in live.manifest if e.id == pinned.id] == ["pinned"] and code.id not in live.ids

    # a budget for one line: the pin takes it, as it did live
    report = whatif.replay(h, "s", whatif.Policy("a"), whatif.Policy("one line", context_budget=30))

    assert report.a.recorded_kept == pytest.approx(1.0)
    for build in (report.a.builds[0], report.b.builds[0]):
        assert pinned.id in build.ids and pinned.id in build.working_ids
        assert code.id not in build.ids  # its TTL ended before the build, live and replayed
    h.close()


def test_a_pin_made_by_record_and_dropped_since_without_an_unpin_still_replays_pinned() -> None:
    """Archiving unpins in the same write, with no unpin event: read from the pins alone, a memory
    recorded pinned and archived since looked never pinned, and its build replayed without it pinned.
    The add event says it was recorded pinned."""
    clock = Clock()
    h = _open(clock)
    rule = h.record("deploy rule: always use blue-green", session_id="s", pinned=True)
    assert h.events(memory_id=rule.id)[0].data["pinned"] is True
    clock.advance(1)
    assert [e.section for e in h.context("deploy", session_id="s").manifest] == ["pinned"]
    clock.advance(1)
    h.update(rule.id, status="archived")  # unpinned with it
    assert not h.get(rule.id).pinned and [e.kind for e in h.events(memory_id=rule.id)] == ["add", "update"]
    report = whatif.replay(h, "s", whatif.Policy("a"), whatif.Policy("b"))
    assert rule.id in report.a.builds[0].working_ids and report.a.recorded_kept == pytest.approx(1.0)
    h.close()


def test_a_tracked_recall_replays_its_hits_not_a_recall_without_its_filters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    h = _open(clock)
    other = h.record("apple pie recipe", session_id="s1")
    found = h.record("apple stock price", session_id="s2")
    clock.advance(1)
    assert [r.id for r in h.recall("apple", k=5, session_id="s2")] == [found.id]
    clock.advance(1)
    h.context("apple", session_id="s2")
    offline: list[Harness] = []

    class Offline(Harness):  # the replay's own harnesses, kept to read their access counts
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            offline.append(self)

    monkeypatch.setattr(whatif, "Harness", Offline)
    whatif.replay(h, "s2", whatif.Policy("a"), whatif.Policy("b"))

    assert len(offline) == 2
    for replayed in offline:
        held = replayed.store.get_many([other.id, found.id])
        # the live recall returned the s2 memory alone (the build accessed both): the replay counts the
        # same accesses, not those of a recall without the session filter
        assert held[found.id].access_count == h.store.get(found.id).access_count == 2
        assert held[other.id].access_count == h.store.get(other.id).access_count == 1
    h.close()


def test_an_import_days_after_the_event_before_it_replays_at_its_own_time() -> None:
    """The replay wrote an import at the previous event's time, and a memory made at the import's time
    (three days later) was refused as one from the future."""
    clock = Clock()
    h = _open(clock)
    h.record("we ship on fridays only", session_id="s1")
    clock.advance(72 * 60)
    with Harness.open("memory://", embedder=None, clock=clock) as other:
        exported = other.record("the staging database region is eu-west", session_id="s1")
    h.import_memories([exported])
    live = h.context("where is the staging database?", budget_tokens=400, session_id="s1")
    report = whatif.replay(h, "s1", whatif.Policy("a"), whatif.Policy("b"))
    assert exported.id in live.ids and exported.id in report.a.builds[0].ids
    h.close()
