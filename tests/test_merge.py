"""Fusion: near-duplicates merged with the provenance of every source (lexical and embedding similarity),
recurring errors synthesized into pitfalls (extractive, and through a real OpenAI-compatible server on
loopback), conflicting decisions flagged for review; never across readers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm import Harness, Kind, LinkType, Memory, NotFoundError, StateConflictError, Status, ValidationError
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.teams import merge
from clawvm.teams import shared as teams
from clawvm.teams.merge import (
    ExtractiveSynthesizer,
    LLMSynthesizer,
    MergeConfig,
    components,
    contradicts,
    failure_groups,
    merge_team,
)
from clawvm.vm.context import short_id
from engines import harness_target
from loopback import DIGITLESS_REPLY, MISBEHAVIOURS, ChatReplay, Misbehaviour


@pytest.fixture
def lexical(engine_name: str, tmp_path: Path) -> Iterator[Harness]:
    h = Harness.open(harness_target(engine_name, tmp_path, "lex.db"), embedder=None)
    try:
        yield h
    finally:
        h.close()


def crew(h: Harness) -> None:
    for agent in ("planner", "writer", "reviewer"):
        h.grant("pay", agent, write=True)
    h.grant("ops", "oncall", write=True)


# ---- near-duplicates --------------------------------------------------------------------------------------
def test_duplicates_merge_into_one_revision_keeping_every_source(engine_name: str, harness: Harness) -> None:
    h = harness
    crew(h)
    a = teams.record(
        h,
        "The billing API returns amounts in cents",
        agent_id="planner",
        team_id="pay",
        task_id="t1",
        kind="observation",
    )
    b = teams.record(
        h,
        "Amounts from the billing API are expressed in cents",
        agent_id="writer",
        team_id="pay",
        task_id="t2",
        kind="observation",
        confidence=0.9,
    )
    c = teams.record(
        h,
        "the billing api returns amounts in cents!",
        agent_id="reviewer",
        team_id="pay",
        task_id="t3",
        kind="observation",
    )
    other = teams.record(
        h,
        "The billing API paginates after 100 rows",
        agent_id="writer",
        team_id="pay",
        task_id="t2",
        kind="observation",
    )
    h.feedback(b.id, True)
    h.flush()
    report = merge_team(h, team_id="pay")
    assert len(report.merged) == 1
    merged_id, sources = report.merged[0]
    assert set(sources) == {a.id, b.id, c.id}
    merged = h.get(merged_id)
    assert merged.status is Status.ACTIVE and merged.content == c.content  # the newest of the most trusted
    prov = merged.metadata["provenance"]
    assert {p["id"] for p in prov} == {a.id, b.id, c.id}
    assert {p["agent_id"] for p in prov} == {"planner", "writer", "reviewer"}
    assert merged.metadata["source_tasks"] == ["t1", "t2", "t3"]
    assert teams.adoption(merged) == (1, 0)
    links = {(link.type, link.target) for link in merged.links}
    assert links == {(LinkType.REVISES, c.id), (LinkType.DERIVED_FROM, a.id), (LinkType.DERIVED_FROM, b.id)}
    for source in (a, b, c):
        assert h.get(source.id).status is Status.OBSOLETE  # kept for history, never recalled
        assert teams.latest(h, source.id).id == merged_id
        # each source's history is its own chain up to the merge (the source it revises is not another's)
        assert [m.id for m in h.history(source.id)] == [source.id, merged_id]
    assert [m.id for m in h.history(merged_id)] == [c.id, merged_id]  # the merge revises the kept text's
    assert h.get(other.id).status is Status.ACTIVE
    active = h.list(kind=Kind.OBSERVATION, team_id="pay")
    assert {m.id for m in active} == {merged_id, other.id}
    assert merge_team(h, team_id="pay").merged == []  # nothing left to merge


def test_forgetting_a_merge_brings_its_sources_back(engine_name: str, lexical: Harness) -> None:
    """The sources named the forgotten merge as what they went into: obsolete for good, never recalled."""
    h = lexical
    crew(h)
    shared = dict(team_id="pay", kind="observation")
    a = teams.record(h, "The billing API returns amounts in cents", agent_id="planner", **shared)
    b = teams.record(h, "the billing api returns amounts in cents!", agent_id="writer", **shared)
    ((merged_id, sources),) = merge_team(h, team_id="pay").merged
    assert set(sources) == {a.id, b.id}
    h.forget(merged_id)
    for source in (a, b):
        back = h.get(source.id)
        assert back.status is Status.ACTIVE and teams.successor(back) is None
        assert [m.id for m in h.history(source.id)] == [source.id]
    assert {m.id for m in h.list(kind=Kind.OBSERVATION, team_id="pay")} == {a.id, b.id}


def test_forgetting_a_revision_of_a_merge_keeps_the_chain_through_it(
    engine_name: str, lexical: Harness
) -> None:
    """The merge's source links came along as `revises`: history of the head skipped the merge."""
    h = lexical
    crew(h)
    shared = dict(team_id="pay", kind="observation")
    teams.record(h, "The billing API returns amounts in cents", agent_id="planner", **shared)
    teams.record(h, "the billing api returns amounts in cents!", agent_id="writer", **shared)
    ((merged_id, _sources),) = merge_team(h, team_id="pay").merged
    merged = h.get(merged_id)
    survivor = teams.previous(merged)
    second = h.revise(merged_id, content="The billing API returns amounts in integer cents")
    third = h.revise(second.id, content="The billing API returns integer cents")
    h.forget(second.id)
    head = h.get(third.id)
    assert teams.previous(head) == merged_id
    assert [m.id for m in h.history(third.id)] == [survivor, merged_id, third.id]
    assert teams.successor(h.get(merged_id)) == third.id


def test_dense_similarity_alone_finds_paraphrases(engine_name: str, harness: Harness) -> None:
    crew(harness)
    a = teams.record(
        harness,
        "The billing API returns amounts in cents",
        agent_id="planner",
        team_id="pay",
        kind="observation",
    )
    b = teams.record(
        harness,
        "Amounts from the billing API are expressed in cents",
        agent_id="writer",
        team_id="pay",
        kind="observation",
    )
    no_lexical = MergeConfig(duplicate_lexical=1.01)
    assert [set(s) for _, s in merge_team(harness, config=no_lexical).merged] == [{a.id, b.id}]


def test_fusion_never_merges_across_readers(engine_name: str, lexical: Harness) -> None:
    crew(lexical)
    text = "Rotate the API keys every ninety days"
    made = [
        teams.record(lexical, text, agent_id="planner", kind="knowledge"),  # private to planner
        teams.record(lexical, text, agent_id="writer", kind="knowledge"),  # private to writer
        teams.record(lexical, text, agent_id="planner", team_id="pay", kind="knowledge"),
        teams.record(lexical, text, agent_id="oncall", team_id="ops", kind="knowledge"),
        teams.record(lexical, text, agent_id="planner", team_id="pay", kind="decision"),  # another kind
    ]
    assert merge_team(lexical).merged == []
    assert all(lexical.get(m.id).status is Status.ACTIVE for m in made)
    twin = teams.record(lexical, text, agent_id="oncall", team_id="ops", kind="knowledge")
    assert [set(s) for _, s in merge_team(lexical).merged] == [{made[3].id, twin.id}]


# ---- recurring errors -> pitfalls -------------------------------------------------------------------------
ERRORS = [
    "Deploy failed: database migrations were not applied before the release",
    "Deploy failed because the database migrations were not applied before release",
    "The deploy failed again: migrations of the database not applied before the release",
]


def test_recurring_errors_become_one_pitfall(engine_name: str, harness: Harness) -> None:
    h = harness
    crew(h)
    errors = [
        teams.record(
            h, text, agent_id="reviewer", team_id="pay", kind="error", task_id=f"t{n}", task_type="deploy"
        )
        for n, text in enumerate(ERRORS[:2], start=1)
    ]
    lone = teams.record(
        h, "Lint failed on an unused import", agent_id="reviewer", team_id="pay", kind="error", task_id="t1"
    )
    report = merge_team(h, team_id="pay")
    assert len(report.knowledge) == 1
    pitfall = h.get(report.knowledge[0])
    assert pitfall.kind is Kind.KNOWLEDGE and teams.PITFALL_TAG in pitfall.tags
    assert teams.task_type_tag("deploy") in pitfall.tags
    assert pitfall.content.startswith("Recurring error (seen 2 times): ")
    assert pitfall.content.endswith(ERRORS[0]) or pitfall.content.endswith(ERRORS[1])  # extractive
    assert pitfall.metadata["source_tasks"] == ["t1", "t2"]
    derived = {link.target for link in pitfall.links if link.type is LinkType.DERIVED_FROM}
    assert derived == {e.id for e in errors}
    assert pitfall.scope is not None and pitfall.team_id == "pay"
    for e in errors:
        assert h.get(e.id).status is Status.ARCHIVED and h.get(e.id).metadata["knowledge_id"] == pitfall.id
    assert h.get(lone.id).status is Status.ACTIVE  # one occurrence is not a pattern
    # the same error on a third task joins the pitfall as a new revision of it
    third = teams.record(h, ERRORS[2], agent_id="reviewer", team_id="pay", kind="error", task_id="t3")
    again = merge_team(h, team_id="pay")
    head = teams.latest(h, pitfall.id)
    assert again.knowledge == [head.id] and head.id != pitfall.id
    assert head.content.startswith("Recurring error (seen 3 times): ")
    assert head.metadata["source_tasks"] == ["t1", "t2", "t3"]
    assert h.get(third.id).metadata["knowledge_id"] == head.id
    assert [m.id for m in h.history(head.id)] == [pitfall.id, head.id]
    g = h.guidance("writer", "Deploy the invoicing service", 300, task_type="deploy")
    assert g.pitfalls and g.pitfalls[0].id == head.id and g.pitfalls[0].source_tasks == ("t1", "t2", "t3")


def test_errors_of_one_task_are_not_a_recurring_pitfall(engine_name: str, lexical: Harness) -> None:
    crew(lexical)
    for text in ERRORS[:2]:
        teams.record(lexical, text, agent_id="reviewer", team_id="pay", kind="error", task_id="t1")
    assert merge_team(lexical).knowledge == []
    assert merge_team(lexical, config=MergeConfig(min_tasks=1)).knowledge


LESSON = "Run the database migrations before every release."


@pytest.fixture
def llm() -> Iterator[ChatReplay]:
    with ChatReplay() as server:
        yield server


@pytest.mark.engines("memory")
def test_llm_synthesizer_against_a_real_server(engine_name: str, lexical: Harness, llm: ChatReplay) -> None:
    llm.script = [LESSON]
    crew(lexical)
    for n, text in enumerate(ERRORS[:2], start=1):
        teams.record(lexical, text, agent_id="reviewer", team_id="pay", kind="error", task_id=f"t{n}")
    report = merge_team(lexical, synthesizer=LLMSynthesizer(llm.v1, "tiny", api_key="k"))
    pitfall = lexical.get(report.knowledge[0])
    assert pitfall.content == f"Lesson from a recurring error (seen 2 times): {LESSON}"
    assert pitfall.metadata["synthesized"]["method"] == "llm"
    (request,) = llm.requests
    assert request["path"] == "/v1/chat/completions" and request["json"]["model"] == "tiny"
    prompt = request["json"]["messages"][0]["content"]
    assert ERRORS[0] in prompt and ERRORS[1] in prompt


NUMBERED_ERRORS = [
    "Deploy 12 failed: migration 0042 was not applied before release 3.1",
    "Deploy 13 failed because migration 0042 was not applied before release 3.1",
    "Deploy 14 failed again: migration 0042 not applied before the release 3.1",
]


def synthesizer_fallbacks(h: Harness) -> list[Event]:
    return [e for e in h.events(limit=10_000) if e.kind == EventKind.SYNTHESIZER_FALLBACK]


@pytest.mark.engines("memory")
@pytest.mark.parametrize("how", MISBEHAVIOURS, ids=lambda m: m.name)
def test_a_misbehaving_llm_falls_back_to_the_extractive_pitfall(
    engine_name: str, lexical: Harness, llm: ChatReplay, how: Misbehaviour
) -> None:
    how.apply(llm)
    crew(lexical)
    errors = [
        teams.record(lexical, text, agent_id="reviewer", team_id="pay", kind="error", task_id=f"t{n}")
        for n, text in enumerate(NUMBERED_ERRORS[:2], start=1)
    ]
    report = merge_team(lexical, synthesizer=LLMSynthesizer(llm.v1, "tiny", timeout_s=1.0))
    (pitfall_id,) = report.knowledge
    pitfall = lexical.get(pitfall_id)
    samples = pitfall.metadata["samples"]
    assert pitfall.content == ExtractiveSynthesizer().synthesize(samples, 2)
    assert "None" not in pitfall.content and "0042" in pitfall.content
    assert pitfall.metadata["synthesized"]["method"] == "extractive"
    assert {lexical.get(e.id).status for e in errors} == {Status.ARCHIVED}
    (fallback,) = synthesizer_fallbacks(lexical)
    assert fallback.memory_id == pitfall.id
    assert fallback.data["reason"] == how.reason and fallback.data["model"] == "tiny"
    assert fallback.data["detail"].startswith(how.detail) and fallback.data["used"] == "extractive"
    assert DIGITLESS_REPLY not in json.dumps(fallback.data)
    (synthesized,) = [e for e in lexical.events(memory_id=pitfall.id) if e.kind == EventKind.SYNTHESIZE]
    assert synthesized.data["method"] == "extractive"
    assert len(llm.requests) == 1


@pytest.mark.engines("memory")
def test_a_pitfall_revised_while_the_llm_is_down_is_extractive(
    engine_name: str, lexical: Harness, llm: ChatReplay
) -> None:
    kept = "Apply migration 0042 before release 3.1."
    llm.script = [kept]
    crew(lexical)
    for n, text in enumerate(NUMBERED_ERRORS[:2], start=1):
        teams.record(lexical, text, agent_id="reviewer", team_id="pay", kind="error", task_id=f"t{n}")
    synth = LLMSynthesizer(llm.v1, "tiny")
    (first,) = merge_team(lexical, synthesizer=synth).knowledge
    assert lexical.get(first).content == f"Lesson from a recurring error (seen 2 times): {kept}"
    assert synthesizer_fallbacks(lexical) == []
    llm.status = 500
    teams.record(lexical, NUMBERED_ERRORS[2], agent_id="reviewer", team_id="pay", kind="error", task_id="t3")
    (head_id,) = merge_team(lexical, synthesizer=synth).knowledge
    head = lexical.get(head_id)
    assert head.content == ExtractiveSynthesizer().synthesize(head.metadata["samples"], 3)
    assert head.metadata["synthesized"] == {"method": "extractive", "occurrences": 3}
    (fallback,) = synthesizer_fallbacks(lexical)
    assert fallback.memory_id == head.id and fallback.data["detail"] == "HTTP 500"


# ---- conflicts --------------------------------------------------------------------------------------------
def decide(h: Harness, text: str, agent: str, subject: str = "session cache", **fields: Any) -> Memory:
    """A decision of team ``pay`` on ``subject``: two of them on one subject that disagree conflict."""
    return teams.record(h, text, agent_id=agent, team_id="pay", kind="decision", subject=subject, **fields)


def test_conflicting_decisions_are_flagged_once_and_resolvable(engine_name: str, lexical: Harness) -> None:
    h = lexical
    crew(h)
    redis = decide(h, "Use Redis for the session cache", "planner", task_id="t1")
    memcached = decide(h, "Use Memcached for the session cache", "writer", "Session  Cache", task_id="t2")
    unrelated = decide(h, "Use Postgres for the ledger", "planner", "ledger database")
    report = merge_team(h, team_id="pay")
    assert len(report.conflicts) == 1
    note = h.get(report.conflicts[0])
    assert note.kind is Kind.NOTE and teams.CONFLICT_TAG in note.tags and note.team_id == "pay"
    assert set(note.metadata["conflict"]["ids"]) == {redis.id, memcached.id}
    assert {link.target for link in note.links} == {redis.id, memcached.id}
    assert note.id in {m.id for m in h.review_queue()}  # flagged for review
    assert merge_team(h, team_id="pay").conflicts == []  # flagged once
    g = h.guidance("reviewer", "configure the session cache", 400)
    assert [i.id for i in g.conflicts] == [note.id]
    shown = {i.id for i in g.experiences}
    assert memcached.id in shown and redis.id not in shown  # of two conflicting decisions, the newer
    revised = h.revise(redis.id, content=redis.content + " (with a 5 minute TTL)")
    kept = teams.resolve_conflict(h, note.id, keep=revised.id, by="lead")  # a side's head names it too
    assert kept.id == revised.id and kept.metadata["review"]["status"] == "approved"
    assert h.get(memcached.id).status is Status.OBSOLETE
    assert h.get(note.id).status is Status.ARCHIVED
    assert teams.open_conflicts(h) == [] and h.get(unrelated.id).status is Status.ACTIVE
    assert merge_team(h, team_id="pay").conflicts == []  # a closed conflict is not flagged again
    # resolved again the other way, it left both sides obsolete and the team without a decision
    with pytest.raises(StateConflictError) as closed:
        teams.resolve_conflict(h, note.id, keep=memcached.id, by="lead")
    assert closed.value.field == "conflict_id"
    assert h.get(revised.id).status is Status.ACTIVE and h.get(memcached.id).status is Status.OBSOLETE


def test_a_revised_closed_conflict_stays_closed(engine_name: str, lexical: Harness) -> None:
    """Revising an archived memory made its new head active: a team writer reopened a conflict a lead had
    closed (and a revised error folded into a pitfall counted again)."""
    h = lexical
    crew(h)
    decide(h, "Use Redis for the session cache", "planner")
    decide(h, "Use Memcached for the session cache", "writer")
    (note_id,) = merge_team(h, team_id="pay").conflicts
    h.approve(note_id, by="lead")  # not a conflict: closed, archived
    head = h.revise(note_id, agent_id="writer", content="Conflict (reopened by a writer)")
    assert head.status is Status.ARCHIVED and teams.open_conflicts(h) == []


def test_runs_side_by_side_flag_each_conflict_once(
    engine_name: str, lexical: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run read the flagged pairs once, at its start: two runs at once flagged every pair twice (79
    notes for 40 pairs in a trial). A pair's note has one id, so the store keeps the first."""
    h = lexical
    crew(h)
    for n in range(4):
        decide(h, f"Use Redis for cache {n}", "planner", f"cache {n}")
        decide(h, f"Use Memcached for cache {n}", "writer", f"cache {n}")
    first = merge_team(h, team_id="pay").conflicts
    assert len(first) == 4
    # a second run that read the flagged pairs before the first wrote its notes
    monkeypatch.setattr(merge._KnownConflicts, "read", classmethod(lambda cls, host: cls()))
    assert merge_team(h, team_id="pay").conflicts == []
    assert sorted(n.id for n in teams.open_conflicts(h)) == sorted(first)
    monkeypatch.undo()
    threads = [threading.Thread(target=merge_team, args=(h,), kwargs={"team_id": "pay"}) for _ in range(3)]
    decide(h, "Use Redis for the queue", "planner", "queue")
    decide(h, "Use Kafka for the queue", "writer", "queue")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(teams.open_conflicts(h)) == 5


def test_fusion_flags_a_conflict_between_private_sides_of_an_agent_without_a_write_grant(
    lexical: Harness,
) -> None:
    """Fusion is the application's write: the note of a conflict between an agent's private memories
    that name a team was recorded as that agent, and refused once its grant was read-only."""
    h = lexical
    crew(h)
    decide(h, "Use Redis for the session cache", "planner", scope="private")
    decide(h, "Use Memcached for the session cache", "planner", scope="private")
    h.grant("pay", "planner", read=True, write=False)
    (note_id,) = merge_team(h, team_id="pay").conflicts
    note = h.get(note_id)
    assert note.scope is not None and note.scope.value == "private" and note.agent_id == "planner"


def test_a_merged_duplicate_of_one_side_keeps_its_conflict_closed(engine_name: str, lexical: Harness) -> None:
    """The merge of two duplicates kept the newer one's chain: its root was not the flagged side's, so a
    conflict the lead had closed was flagged again."""
    h = lexical
    crew(h)
    decide(h, "Retry failed refunds 3 times", "planner", "refund retries")
    decide(h, "Retry failed refunds 5 times", "writer", "refund retries")
    (note,) = merge_team(h, team_id="pay").conflicts
    h.approve(note, by="lead")  # not a conflict
    decide(h, "Retry failed refunds 3 times", "reviewer", "refund retries")  # a duplicate of one side
    report = merge_team(h, team_id="pay")
    assert len(report.merged) == 1 and report.conflicts == [] and teams.open_conflicts(h) == []


def test_guidance_shows_a_side_of_an_open_conflict_only_with_the_conflict(lexical: Harness) -> None:
    """At small budgets the conflict line did not fit its quota while one side did, so the disputed
    decision read as the team's practice."""
    h = lexical
    crew(h)
    h.grant("pay", "intern")
    sides = (("original card", "planner"), ("store credit", "writer"), ("bank transfer", "reviewer"))
    for text, agent in sides:
        decide(h, f"Refunds go to the {text}", agent, "refund method")
    notes = {n: teams.conflict_sides(h.get(n)) for n in merge_team(h, team_id="pay").conflicts}
    assert len(notes) == 3
    shown_sides = 0
    for budget in range(20, 400, 10):
        shown = {item.id for item in h.guidance("intern", "how do refunds go out", budget).items}
        for side in shown - set(notes):
            assert all(n in shown for n, sides in notes.items() if side in sides), (budget, side)
            shown_sides += 1
    assert shown_sides  # at larger budgets the newest side is shown, with its conflicts


def test_a_conflict_is_resolved_by_the_short_id_its_note_shows(lexical: Harness) -> None:
    """A reviewer reads ``[1a2b3c4d]`` in the conflict's text and passes that: it names its side."""
    h = lexical
    crew(h)
    sides = [
        decide(h, f"Use {db} for the session cache", who)
        for db, who in (("Redis", "planner"), ("Memcached", "writer"))
    ]
    (note_id,) = merge_team(h, team_id="pay").conflicts
    shown = f"[{short_id(sides[1].id)}]"
    assert shown in h.get(note_id).content
    for wrong_keep in ("[00000000]", None, 7):
        with pytest.raises(ValidationError) as wrong:
            teams.resolve_conflict(h, note_id, keep=wrong_keep, by="lead")  # type: ignore[arg-type]
        assert wrong.value.field == "keep" and h.get(note_id).status is Status.ACTIVE
    # a wrong note id is said of conflict_id (it named memory_id, which the caller never passed)
    for wrong_note, error in (("01900000-0000-7000-8000-000000000000", NotFoundError), (7, ValidationError)):
        with pytest.raises(error) as refused:
            h.resolve_conflict(wrong_note, keep=shown)  # type: ignore[arg-type]
        assert refused.value.field == "conflict_id"  # type: ignore[attr-defined]
    kept = teams.resolve_conflict(h, note_id, keep=shown, by="lead")
    assert kept.id == sides[1].id and h.get(sides[0].id).status is Status.OBSOLETE


def test_resolving_a_conflict_for_a_side_that_cannot_be_kept_writes_nothing(
    engine_name: str, tmp_path: Path
) -> None:
    """The other side was rejected and the note closed before the kept side's approval was refused: both
    sides were gone."""
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    target = harness_target(engine_name, tmp_path, "expiring.db")
    with Harness.open(target, embedder=None, clock=lambda: now[0]) as h:
        crew(h)
        redis = decide(h, "Use Redis for the session cache", "planner")
        memcached = decide(
            h, "Use Memcached for the session cache", "writer", expires_at=now[0] + timedelta(1)
        )
        (note,) = merge_team(h, team_id="pay").conflicts
        now[0] += timedelta(days=2)  # the side to keep has expired
        with pytest.raises(StateConflictError) as exc:
            teams.resolve_conflict(h, note, keep=memcached.id, by="lead")
        assert exc.value.field == "memory_id"
        assert h.get(redis.id).status is Status.ACTIVE and "review" not in h.get(redis.id).metadata
        assert h.get(note).status is Status.ACTIVE and teams.open_conflicts(h)[0].id == note
        kept = teams.resolve_conflict(h, note, keep=redis.id, by="lead")  # the expired side is out already
        assert kept.metadata["review"]["status"] == "approved" and teams.open_conflicts(h) == []


def test_conflicts_without_subjects_need_a_contradiction(engine_name: str, lexical: Harness) -> None:
    crew(lexical)
    rec = teams.record
    a = rec(
        lexical, "Retry failed refund calls three times", agent_id="planner", team_id="pay", kind="knowledge"
    )
    b = rec(lexical, "Never retry failed refund calls", agent_id="writer", team_id="pay", kind="knowledge")
    rec(
        lexical,
        "Refund calls are logged with their order id",
        agent_id="writer",
        team_id="pay",
        kind="knowledge",
    )
    report = merge_team(lexical, team_id="pay")
    (note,) = [lexical.get(i) for i in report.conflicts]
    assert set(note.metadata["conflict"]["ids"]) == {a.id, b.id}
    # approving the conflict note closes it: both sides stay
    lexical.approve(note.id)
    assert lexical.get(a.id).status is Status.ACTIVE and lexical.get(b.id).status is Status.ACTIVE
    assert teams.open_conflicts(lexical) == []


def test_rejecting_one_side_closes_its_conflicts(engine_name: str, lexical: Harness) -> None:
    crew(lexical)
    a = decide(lexical, "Ship on Fridays", "planner", "release day")
    decide(lexical, "Ship on Tuesdays", "writer", "release day")
    (conflict,) = merge_team(lexical).conflicts
    lexical.reject(a.id, reason="Fridays are frozen")
    assert lexical.get(conflict).status is Status.ARCHIVED
    assert lexical.get(conflict).metadata["review"]["status"] == "resolved"


def test_a_rejected_revision_of_a_side_closes_its_conflicts_and_a_forgotten_one_does_not(
    engine_name: str, lexical: Harness
) -> None:
    """Only the note's own ids and roots were compared: a side's later revision, rejected, left the
    conflict open, in the review queue and in guidance. Forgotten instead, the revision before it is the
    head again (the chain is mended), still a side: that conflict stays open."""
    crew(lexical)
    conflicts = []
    for end in ("reject", "forget"):
        a = decide(lexical, f"Ship on Fridays ({end})", "planner", f"release day {end}")
        decide(lexical, f"Ship on Tuesdays ({end})", "writer", f"release day {end}")
        (conflict,) = merge_team(lexical).conflicts
        head = lexical.revise(a.id, agent_id="planner", content=f"Ship on Friday mornings ({end})")
        lexical.reject(head.id) if end == "reject" else lexical.forget(head.id)
        conflicts.append(conflict)
    assert [lexical.get(c).status for c in conflicts] == [Status.ARCHIVED, Status.ACTIVE]
    assert [n.id for n in teams.open_conflicts(lexical)] == [conflicts[1]]
    with pytest.raises(ValidationError) as err:  # one id read as its characters matched nothing
        teams.open_conflicts(lexical, involving=conflicts[0])  # type: ignore[arg-type]
    assert err.value.field == "involving"


def test_merge_options_are_checked_by_name(lexical: Harness) -> None:
    """They failed mid-merge with TypeError/AttributeError, and a threshold of -1 merged everything."""
    for bad in (
        {"duplicate_lexical": "x"},
        {"duplicate_dense": -1},
        {"min_occurrences": "2"},
        {"min_tasks": 0},
    ):
        with pytest.raises(ValidationError) as err:
            MergeConfig(**bad)  # type: ignore[arg-type]
        assert err.value.field == next(iter(bad))
    with pytest.raises(ValidationError, match="config"):
        merge_team(lexical, config={"duplicate_lexical": 0.5})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="synthesizer"):
        merge_team(lexical, synthesizer="llm")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("Retry three times", "Never retry", True),
        ("Timeout is 30 s", "Timeout is 60 s", True),
        ("Use the blue button", "Use the blue button please", False),
        ("Do not cache tokens", "Tokens must not be cached", False),
        # each of these was taken for one statement, and merged into whichever was newest
        ("Never disable TLS verification", "Disable TLS verification", True),  # two negations, not one
        ("Refunds can't exceed 500 EUR", "Refunds can exceed 500 EUR", True),
        ("The payment API isn\u2019t idempotent", "The payment API is idempotent", True),
        ("Set the retry offset to -5 seconds", "Set the retry offset to 5 seconds", True),
        ("Refund limit 500 EUR and fee 20 EUR", "Refund limit 20 EUR and fee 500 EUR", True),
        ("Stop the worker before the migration", "Don't stop the worker before the migration", True),
        ("Enable TLS on the gateway", "Disable TLS on the gateway", True),
        # and the same statement said twice still is one
        ("Don't deploy on fridays", "Do not deploy on fridays", False),
        ("Released on 2026-01-05 after review", "Released 2026-01-05 after the review", False),
        ("Retry 3 times, wait 3 seconds", "Wait 3 seconds, retry 3 times", False),
        # other languages: each pair was taken for one statement, the newer kept and the other dropped
        ("允许周五部署", "不允许周五部署", True),
        ("金曜日のデプロイは許可する", "金曜日のデプロイは許可しない", True),
        ("يسمح بالنشر يوم الجمعة", "لا يسمح بالنشر يوم الجمعة", True),
        ("금요일 배포를 허용한다", "금요일 배포를 허용하지 않는다", True),
        ("Freitags deployen ist erlaubt", "Freitags deployen ist nicht erlaubt", True),
        # where the letter does not negate: "but", "very", "future"
        ("部署很顺利，不过有点慢", "部署很顺利，有点慢", False),
        ("非常重要的决定", "重要的决定", False),
        ("未来的部署计划", "部署计划", False),
    ],
)
def test_contradiction_signal(a: str, b: str, expected: bool) -> None:
    assert contradicts(a, b) is expected


def test_the_same_words_on_two_subjects_are_two_decisions(lexical: Harness) -> None:
    """Merged, the orders database's decision was gone (the survivor named the billing database), and a
    later decision against it on the orders database was never flagged."""
    h = lexical
    crew(h)
    orders = decide(h, "Use PostgreSQL 16 as the primary database", "planner", "orders database")
    billing = decide(h, "Use PostgreSQL 16 as the primary database", "writer", "billing database")
    same = decide(h, "Use PostgreSQL 16 as the primary database.", "reviewer", "orders database")
    report = merge_team(h, team_id="pay")
    assert len(report.merged) == 1  # the two on the orders database
    assert h.get(billing.id).status is Status.ACTIVE
    subjects = sorted(m.metadata["subject"] for m in h.list(kind="decision", team_id="pay"))
    assert subjects == ["billing database", "orders database"]
    decisions = h.list(kind="decision", team_id="pay")
    [merged] = [m for m in decisions if m.metadata["subject"] == "orders database"]
    assert {p["id"] for p in merged.metadata["provenance"]} == {orders.id, same.id}


def test_opposite_decisions_in_other_languages_are_a_conflict_not_a_duplicate(lexical: Harness) -> None:
    """The merge took "不允许周五部署" (Friday deploys not allowed) for a duplicate of "允许周五部署" and
    kept only the newer: the team's other decision was gone, with no conflict to review."""
    h = lexical
    crew(h)
    pairs = [("允许周五部署", "不允许周五部署"), ("يسمح بالنشر يوم الجمعة", "لا يسمح بالنشر يوم الجمعة")]
    for n, (yes, no) in enumerate(pairs):
        decide(h, yes, "planner", f"friday {n}")
        decide(h, no, "writer", f"friday {n}")
    report = merge_team(h, team_id="pay")
    assert report.merged == [] and len(report.conflicts) == 2
    kept = sorted(m.content for m in h.list(kind="decision", team_id="pay"))
    assert kept == sorted(text for pair in pairs for text in pair)


def test_near_duplicates_that_say_the_opposite_are_never_merged(lexical: Harness) -> None:
    """The newest member of a merge survives: "Disable TLS verification" became the team's memory in place
    of "Never disable TLS verification"."""
    lexical.grant("pay", "planner", write=True)
    said = [
        "Never disable TLS verification on the payment gateway",
        "Disable TLS verification on the payment gateway",
    ]
    made = [
        teams.record(lexical, text, agent_id="planner", team_id="pay", kind="knowledge") for text in said
    ]
    assert merge_team(lexical, team_id="pay").merged == []
    assert [lexical.get(m.id).content for m in made] == said


def test_an_error_alike_to_two_pitfalls_fuses_neither(lexical: Harness) -> None:
    """A payment timeout, alike to a ledger timeout and to a stripe failure, linked the two pitfalls and
    fused them: the ledger lesson left guidance, and its count went to the stripe failure. It joins the
    one it is most alike to; each pitfall keeps its own failure."""
    lexical.grant("pay", "planner", write=True)
    ledger = "Payment request to ledger service failed: connection timeout after 30 seconds"
    stripe = "Payment request to stripe service failed: webhook signature invalid"
    for n, text in enumerate([ledger, ledger, stripe, stripe]):
        teams.record(lexical, text, agent_id="planner", team_id="pay", kind="error", task_id=f"t{n}")
    assert len(merge_team(lexical, team_id="pay").knowledge) == 2
    bridge = "Payment request to stripe service failed: connection timeout"
    teams.record(lexical, bridge, agent_id="planner", team_id="pay", kind="error", task_id="t9")
    assert merge_team(lexical, team_id="pay").merged == []
    pitfalls = {m.metadata["samples"][0]: m for m in lexical.list(team_id="pay", kind="knowledge")}
    assert set(pitfalls) == {ledger, stripe}
    assert pitfalls[ledger].metadata["samples"] == [ledger, bridge]  # joined the timeout it is most like
    assert pitfalls[stripe].metadata["synthesized"]["occurrences"] == 2


def test_failure_groups_join_an_error_to_one_pitfall_group_only() -> None:
    # items: 0, 1 pitfalls (unrelated); 2 an error alike to both; 3 an error alike to 2; 4 a lone error
    is_error = [False, False, True, True, True]
    assert failure_groups(is_error, [(0, 2), (1, 2), (1, 3), (2, 3)]) == [[0], [1, 2, 3], [4]]
    assert failure_groups(is_error, [(0, 1), (0, 2)]) == [[0, 1, 2], [3], [4]]  # pitfalls alike: merged


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 30).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40)
        )
    )
)
def test_components_are_the_connected_groups(case: tuple[int, list[tuple[int, int]]]) -> None:
    n, pairs = case
    groups = components(n, pairs)
    where = {i: g for g in groups for i in g}
    for i, j in pairs:
        if i != j:
            assert where[i] is where[j]  # linked items share a group
    assert sum(len(g) for g in groups) == len(where)  # no item twice
    # and each group is connected: a walk from its first member reaches all of it
    for g in groups:
        seen, todo = {g[0]}, [g[0]]
        while todo:
            x = todo.pop()
            for i, j in pairs:
                for u, v in ((i, j), (j, i)):
                    if u == x and v not in seen:
                        seen.add(v)
                        todo.append(v)
        assert seen == set(g)
