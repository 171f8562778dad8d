"""Teams (ConMem): scopes and permissions enforced inside every engine's query, append-only revisions under
concurrency (threads on every engine, processes on SQLite), retention, the review queue (SDK and CLI),
adoption feedback and guidance."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawvm import ConflictError, Filters, Harness, Kind, Status, ValidationError
from clawvm.cli import main as cli
from clawvm.core.embed import count_tokens
from clawvm.core.errors import AccessDeniedError, StateConflictError, StoreError
from clawvm.core.model import Memory, Scope, Visibility
from clawvm.demo.scenario import ReplayClock
from clawvm.observe.learning import intervene
from clawvm.store import Query, Store
from clawvm.teams import shared as teams
from clawvm.vm.tiers import PagerConfig, TierBudgets
from engines import engine_of, harness_target, make_store
from refusals import events_refused

T0 = datetime(2030, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def lexical(engine_name: str, tmp_path: Path) -> Iterator[Harness]:
    """A harness without an embedder (fast, and its clock is ours), on every engine."""
    h = Harness.open(harness_target(engine_name, tmp_path, "lex.db"), embedder=None, clock=ReplayClock(T0))
    try:
        yield h
    finally:
        h.close()


def ids(memories: Any) -> set[str]:
    return {m.id for m in memories}


# ---- scopes and permissions -------------------------------------------------------------------------------
def populate(h: Harness) -> dict[str, Memory]:
    h.grant("pay", "planner", write=True)
    h.grant("pay", "writer")  # read only
    h.grant("ops", "oncall", write=True)
    rec = teams.record
    return {
        "planner_private": rec(h, "planner scratch: ledger migration plan", agent_id="planner"),
        "writer_private": rec(h, "writer scratch: ledger wording", agent_id="writer"),
        "pay_team": rec(h, "ledger uses postgres", agent_id="planner", team_id="pay", kind=Kind.DECISION),
        "ops_team": rec(h, "ledger pager rota", agent_id="oncall", team_id="ops"),
        "task_open": rec(h, "ledger task t1 notes", agent_id="writer", task_id="t1", scope=Scope.TASK),
        "task_ops": rec(
            h, "ledger task t1 ops notes", agent_id="oncall", team_id="ops", task_id="t1", scope=Scope.TASK
        ),
        "tenant_wide": h.record("ledger glossary for everyone", kind=Kind.KNOWLEDGE),
    }


READABLE = {  # agent, tasks -> the memories it may read
    ("planner", ()): {"planner_private", "pay_team", "tenant_wide"},
    ("writer", ()): {"writer_private", "pay_team", "tenant_wide"},
    ("writer", ("t1",)): {"writer_private", "pay_team", "tenant_wide", "task_open"},
    ("oncall", ("t1",)): {"ops_team", "tenant_wide", "task_open", "task_ops"},
    ("stranger", ("t1",)): {"tenant_wide", "task_open"},
    ("stranger", ()): {"tenant_wide"},
}


def test_every_engine_enforces_read_permissions_in_its_query(engine_name: str, harness: Harness) -> None:
    made = populate(harness)
    for (agent, tasks), names in READABLE.items():
        vis = teams.visibility(harness, agent, tasks)
        want = {made[n].id for n in names}
        assert ids(harness.list(visible_to=vis, limit=100)) == want, (agent, tasks)
        assert harness.count(visible_to=vis) == len(want)
        # every channel of a raw store query sees only what the agent may read
        q = Query(filters=Filters.of(visible_to=vis), text="ledger", limit=100, context=True, info=True)
        result = harness.store.query(q)
        assert {i for i, _ in result.lexical} == want
        assert {i for i, _ in result.context} <= want
        hits = harness.recall("ledger notes", k=20, track=False, visible_to=vis)
        assert ids(h.memory for h in hits) <= want
        assert ids(h.memory for h in hits)  # and recall does find some of them


def test_revoking_a_grant_hides_the_team_at_once(engine_name: str, lexical: Harness) -> None:
    made = populate(lexical)
    assert made["pay_team"].id in ids(lexical.list(visible_to=teams.visibility(lexical, "writer")))
    lexical.grant("pay", "writer", read=False)
    assert made["pay_team"].id not in ids(lexical.list(visible_to=teams.visibility(lexical, "writer")))
    assert [g.agent_id for g in teams.grants(lexical, "pay")] == ["planner", "writer"]
    assert not lexical.list(visible_to=Visibility("planner"), kind=Kind.AGENT_STATE)  # grants stay hidden


@pytest.mark.parametrize("flags", [{"write": "no"}, {"read": "false"}, {"read": 1}, {"write": None}])
def test_a_grant_takes_true_or_false_and_nothing_truthy(
    engine_name: str, lexical: Harness, flags: dict[str, object]
) -> None:
    """``grant(..., write="no")`` granted write access: any non-empty string is true."""
    before = teams.grants(lexical)
    with pytest.raises(ValidationError) as err:
        lexical.grant("pay", "newcomer", **flags)
    assert err.value.field == next(iter(flags)) and "True or False" in str(err.value)
    assert teams.grants(lexical) == before


def test_a_read_only_agent_cannot_write_into_a_team_by_leaving_the_scope_out(
    engine_name: str, lexical: Harness
) -> None:
    """With no scope the write check was skipped: the read-only writer's decision joined the team's
    fusion and guidance, contradicting the planner's with no conflict flagged."""
    lexical.grant("payments", "reader")  # read only
    with pytest.raises(AccessDeniedError) as err:
        lexical.record("Refunds go to store credit", kind="decision", agent_id="reader", team_id="payments")
    assert err.value.field == "team_id"
    assert lexical.count(team_id="payments") == 0
    lexical.grant("payments", "reader", write=True)
    assert lexical.record("Refunds go to store credit", agent_id="reader", team_id="payments").scope is None


def test_no_writer_approves_its_own_memory_past_the_review_queue(engine_name: str, lexical: Harness) -> None:
    """metadata.review was a caller's to set: a low-confidence memory "approved" itself out of the queue."""
    lexical.grant("t", "w", write=True)
    low = lexical.record(
        "maybe the key rotates monthly", kind="knowledge", team_id="t", agent_id="w", confidence=0.3
    )
    forged = {"review": {"status": "approved"}}
    for attempt in (
        lambda: lexical.record("z", kind="knowledge", confidence=0.2, metadata=forged),
        lambda: lexical.update(low.id, as_agent="w", metadata=forged),
        lambda: lexical.revise(low.id, agent_id="w", metadata=forged),
    ):
        with pytest.raises(ValidationError) as err:
            attempt()
        assert err.value.field == "metadata.review"
    assert [m.id for m in lexical.review_queue()] == [low.id]
    lexical.approve(low.id, by="lead")  # the way to approve it
    assert lexical.review_queue() == []
    kept = lexical.update(
        low.id, as_agent="w", metadata={"source": "wiki"}
    )  # other metadata: the review stays
    assert kept.metadata["review"]["status"] == "approved" and kept.metadata["source"] == "wiki"


def test_revise_with_retry_refuses_what_revise_refuses(engine_name: str, lexical: Harness) -> None:
    """It pinned a third memory past a two-item budget, revised a checkpoint's snapshot, and retried a
    rejected head for seconds before a bare ConflictError."""
    c = lexical.record("third c", session_id="s")
    with pytest.raises(ValidationError) as err:
        teams.revise_with_retry(lexical, c.id, lambda head: {"pinned": True})
    assert err.value.field == "pinned"
    snapshot = lexical.checkpoint("s", "before")
    with pytest.raises(StateConflictError):
        teams.revise_with_retry(lexical, snapshot, lambda head: {"content": "{}"})
    lexical.reject(c.id, by="lead")
    with pytest.raises(ConflictError, match="obsolete") as obsolete:
        teams.revise_with_retry(lexical, c.id, lambda head: {"content": "again"})
    assert obsolete.value.field == "memory_id" and "active first" in obsolete.value.fix


def test_a_revision_that_grows_a_pin_another_process_outran_is_refused(tmp_path: Path) -> None:
    """Another harness on the file pins a memory of the session after a revision checked that its grown pin
    fits, before it writes: the revision checked before its write only and left the pins over the budget.
    Its write now carries the budget: refused as a pin over it, and nothing revised."""
    grown, waiting = "the audit table holds every change for seven years", "never drop the audit table"
    budget = TierBudgets(working_tokens=count_tokens(grown) + count_tokens(waiting) - 1, working_items=None)
    pager = PagerConfig(budgets=budget, background=False)
    target = harness_target("sqlite", tmp_path)
    with (
        Harness.open(target, embedder=None, pager=pager) as h,
        Harness.open(target, embedder=None, pager=pager) as other,
    ):
        pin = h.record("audit", session_id="s", pinned=True)
        later = other.record(waiting, session_id="s", tier="long_term")
        check = h.pager.check_pin

        def outran(memory: Any, now: Any, *args: Any, **kwargs: Any) -> None:
            check(memory, now, *args, **kwargs)
            if memory.content == grown and not other.get(later.id).pinned:
                other.pin(later.id)  # between the revision's check and its write

        h.pager.check_pin = outran  # type: ignore[method-assign]
        with pytest.raises(ValidationError) as err:
            h.revise(pin.id, content=grown)
        assert err.value.field == "pinned"
        assert h.get(pin.id).status is Status.ACTIVE and h.get(pin.id).version == pin.version
        assert sorted(m.id for m in h.list(session_id="s", pinned=True)) == sorted([pin.id, later.id])


def test_a_revision_cannot_carry_a_pin_into_a_full_session_or_out_of_the_working_tier(
    engine_name: str, tmp_path: Path
) -> None:
    """Only a pin that grew was checked: revise(pinned, session_id=...) carried the pin into a session whose
    one pinned place was taken (two pins there), and revise(pinned, tier="long_term") stored a pinned memory
    outside the working tier. Both refused now, as update() refuses them, and nothing is revised."""
    pager = PagerConfig(budgets=TierBudgets(working_items=1, working_tokens=None), background=False)
    target = harness_target(engine_name, tmp_path, "pins.db")
    with Harness.open(target, embedder=None, pager=pager, clock=ReplayClock(T0)) as h:
        mine = h.record("keep the audit table", session_id="s1", pinned=True)
        h.record("the other session's one pin", session_id="s2", pinned=True)
        with pytest.raises(ValidationError) as moved:
            h.revise(mine.id, session_id="s2")
        assert moved.value.field == "pinned"
        with pytest.raises(ValidationError) as demoted:
            h.revise(mine.id, tier="long_term")
        assert demoted.value.field == "tier"
        assert h.get(mine.id).status is Status.ACTIVE and h.get(mine.id).version == mine.version
        assert len(h.list(session_id="s2", pinned=True)) == 1


def test_a_revision_is_checked_as_its_writer_would_write_it(engine_name: str, lexical: Harness) -> None:
    """Only the old head was checked: a change of agent_id planted a's text as b's private memory."""
    mine = lexical.record("a's note", agent_id="a", scope="private")
    with pytest.raises(AccessDeniedError):
        teams.revise_with_retry(
            lexical, mine.id, lambda m: {"agent_id": "b", "content": "planted"}, agent_id="a"
        )
    assert lexical.list(visible_to=teams.visibility(lexical, "b")) == []
    assert teams.latest(lexical, mine.id).content == "a's note"


def test_revise_with_retry_checks_its_change_by_name(engine_name: str, lexical: Harness) -> None:
    m = lexical.record("runbook v1")
    for change, attempts in ((lambda head: None, 5), ({"content": "x"}, 5), (lambda head: "x", 5), (None, 0)):
        with pytest.raises(ValidationError) as err:
            teams.revise_with_retry(
                lexical, m.id, change or (lambda head: {"content": "v2"}), attempts=attempts
            )  # type: ignore[arg-type]
        assert err.value.field == ("attempts" if attempts == 0 else "change")
    assert teams.latest(lexical, m.id).content == "runbook v1"
    # and with the right arguments also the retention kinds by name
    assert teams.RetentionPolicy(kinds=("decision",)).kinds == (Kind.DECISION,)


def test_visibility_takes_tasks_as_a_list_not_a_string(engine_name: str, lexical: Harness) -> None:
    """ "ab" was read as the tasks "a" and "b": an agent read every one-letter task's memories."""
    lexical.record("task-a secret", agent_id="x", scope="task", task_id="a")
    for agent, tasks, field in (("bob", "ab", "tasks"), ("bob", [1], "tasks"), (None, [], "agent_id")):
        with pytest.raises(ValidationError) as err:
            teams.visibility(lexical, agent, tasks)  # type: ignore[arg-type]
        assert err.value.field == field
    assert len(lexical.list(visible_to=teams.visibility(lexical, "bob", ["a"]))) == 1


def test_a_grant_to_a_name_holding_nul_is_refused(engine_name: str, lexical: Harness) -> None:
    """The grant's id joins team and agent with NUL: a write grant to agent "x\\0y" on team "t" had the id
    of agent "y" on team "t\\0x", which then could write."""
    with pytest.raises(ValidationError) as err:
        lexical.grant("t", "x\x00y", write=True)
    assert err.value.field == "agent_id"
    assert not teams.can_write(lexical, "y", "t\x00x")


def test_a_revision_that_changes_nothing_appends_nothing(engine_name: str, lexical: Harness) -> None:
    """revise() with no change (or the head's own values) appended an identical revision, kept for good;
    it answers the head as it is now, as a PATCH that changes nothing does."""
    d = lexical.record("refund limit 500 EUR", kind="decision", session_id="s")
    for same in ({}, {"content": "refund limit 500 EUR"}, {"kind": "decision", "session_id": "s"}):
        assert lexical.revise(d.id, **same) == lexical.get(d.id)
    assert lexical.history(d.id) == [lexical.get(d.id)]
    assert lexical.revise(d.id, content="refund limit 800 EUR").content == "refund limit 800 EUR"


def test_writes_need_a_write_grant_and_write_nothing_otherwise(engine_name: str, lexical: Harness) -> None:
    populate(lexical)
    before = lexical.count(status="any")
    with pytest.raises(AccessDeniedError) as err:
        teams.record(lexical, "writer tries to decide", agent_id="writer", team_id="pay")
    assert err.value.field == "team_id"
    with pytest.raises(AccessDeniedError):
        teams.record(lexical, "oncall into pay", agent_id="oncall", team_id="pay", task_id="t9", scope="task")
    with pytest.raises(ValidationError) as missing:
        teams.record(lexical, "a task memory without a task", agent_id="planner", scope="task")
    assert missing.value.field == "task_id"
    # a private memory that names a team takes the grant too: it went into the team's review queue
    with pytest.raises(AccessDeniedError) as private:
        teams.record(lexical, "my own note for pay", agent_id="writer", team_id="pay", scope="private")
    assert private.value.field == "team_id"
    assert lexical.count(status="any") == before


def test_revising_needs_write_permission(engine_name: str, lexical: Harness) -> None:
    made = populate(lexical)
    with pytest.raises(AccessDeniedError):
        lexical.revise(made["pay_team"].id, agent_id="writer", content="ledger uses mysql")
    with pytest.raises(AccessDeniedError):
        lexical.revise(made["planner_private"].id, agent_id="writer", content="not yours")
    assert lexical.revise(made["pay_team"].id, agent_id="planner", content="ledger uses postgres 17")


def test_updates_need_write_permission_like_records(engine_name: str, lexical: Harness) -> None:
    h = lexical
    made = populate(h)
    app_team = h.record("ledger budget for pay", scope="team", team_id="pay")  # the application's own
    h.grant("pay", "planner")  # planner keeps read, loses write

    def state() -> tuple[Any, ...]:
        return tuple(h.get(m.id) for m in [*made.values(), app_team]), len(h.events(limit=10**6))

    before = state()
    denied: list[tuple[str, dict[str, Any]]] = [
        ("pay_team", {"content": "ledger uses mysql"}),  # its own agent lost its write grant
        ("pay_team", {"content": "x", "as_agent": "writer"}),  # read-only on pay
        ("planner_private", {"scope": "team", "team_id": "ops"}),  # cannot move it into a team
        ("writer_private", {"content": "not yours", "as_agent": "oncall"}),
        ("ops_team", {"agent_id": "writer"}),  # handing it to an agent without a grant on ops
        ("app_team", {"tags": ["edited"], "as_agent": "writer"}),
        ("planner_private", {"agent_id": teams.APPLICATION, "scope": "team", "team_id": "pay"}),
    ]
    for name, change in denied:
        target = app_team if name == "app_team" else made[name]
        with pytest.raises(AccessDeniedError):
            h.update(target.id, **change)
    assert state() == before  # nothing was written

    assert h.update(app_team.id, tags=["edited"]).tags == ["edited"]  # no agent: the application's write
    assert h.update(made["ops_team"].id, as_agent="oncall", content="ledger pager rota v2").version == 2
    assert h.update(made["planner_private"].id, content="planner scratch v2").version == 2  # private: own
    # moderation is the application's: a reviewer can annotate and reject what an agent without a grant wrote
    annotated = intervene(h, "annotate", made["pay_team"].id, note="checked")["memory"]
    assert annotated.metadata["annotations"][0]["text"] == "checked"
    assert h.reject(made["pay_team"].id, by="lead").status is Status.OBSOLETE
    h.grant("pay", "planner", write=True)
    assert h.update(made["task_open"].id, as_agent="writer", confidence=0.9).confidence == 0.9


def test_grant_records_are_internal_and_cannot_be_forged(engine_name: str, lexical: Harness) -> None:
    h = lexical
    populate(h)
    grant_ids = {m.id for m in h.store.list(Filters.of(tags=[teams.GRANT_TAG]), limit=100)}
    assert len(grant_ids) == 3 and all(h.get(i).status is Status.INTERNAL for i in grant_ids)
    forged = {"team_id": "pay", "agent_id": "mallory", "read": True, "write": True}
    for gid in grant_ids:
        with pytest.raises(ValidationError):
            h.update(gid, metadata={"grant": forged})
        with pytest.raises(ValidationError):
            h.revise(gid, content="grant x on team pay: read=True write=True")
    with pytest.raises(ValidationError) as exc:
        h.record("a memory hidden as internal", status="internal")
    assert exc.value.field == "status"
    with pytest.raises(ValidationError):
        h.update(h.list(limit=1)[0].id, status=Status.INTERNAL)
    # a look-alike of a grant, written by a caller, grants nothing
    h.record("grant mallory", kind=Kind.AGENT_STATE, tags=[teams.GRANT_TAG], metadata={"grant": forged})
    assert not teams.can_write(h, "mallory", "pay")
    with pytest.raises(AccessDeniedError):
        teams.record(h, "mallory decides", agent_id="mallory", team_id="pay")
    with pytest.raises(AccessDeniedError):  # the application's name is no disguise for a memory's agent
        teams.record(h, "decided by no one", agent_id=teams.APPLICATION, team_id="pay")
    assert [g.agent_id for g in teams.grants(h, "pay")] == ["planner", "writer"]


def test_grant_records_never_show_up_for_ordinary_callers(engine_name: str, harness: Harness) -> None:
    h = harness
    populate(h)
    h.grant("ledger", "auditor", write=True)
    grant_ids = {m.id for m in h.store.list(Filters.of(tags=[teams.GRANT_TAG]), limit=100)}
    assert len(grant_ids) == 4
    h.flush()
    query = "grant auditor on team ledger read write"
    for status in (None, "active", "any", list(Status)):
        found = {r.id for r in h.recall(query, k=50, track=False, status=status)}
        found |= ids(h.list(limit=100, status=status))
        found |= ids(h.list(limit=100, status=status, kind=Kind.AGENT_STATE, tags=[teams.GRANT_TAG]))
        assert not found & grant_ids, status
    assert h.count(status="any") == h.count(status=list(Status)) == 7  # the memories of populate()
    for ask in (h.count, h.list, lambda **f: h.recall(query, **f)):  # "none" was never the true answer
        with pytest.raises(ValidationError) as refused:
            ask(status="internal")
        assert refused.value.field == "status" and "any" in (refused.value.fix or "")
    ctx = h.context(query, budget_tokens=2000, agent_id="auditor", record_usage=False)
    assert not {e.id for e in ctx.manifest} & grant_ids
    assert [g.agent_id for g in teams.grants(h, "ledger")] == ["auditor"]  # still what permissions read


scoped = st.fixed_dictionaries(
    {
        "scope": st.sampled_from([None, "private", "team", "task"]),
        "agent_id": st.sampled_from([None, "a", "b"]),
        "team_id": st.sampled_from([None, "x", "y"]),
        "task_id": st.sampled_from([None, "t1", "t2"]),
    }
)


@pytest.mark.engines("memory", "sqlite", "postgres")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(scoped, min_size=1, max_size=12),
    agent=st.sampled_from(["a", "b", "c"]),
    teams_=st.frozensets(st.sampled_from(["x", "y"])),
    tasks=st.frozensets(st.sampled_from(["t1", "t2"])),
)
def test_store_visibility_agrees_with_the_reference_semantics(
    engine_name: str,
    tmp_path: Path,
    rows: list[dict[str, Any]],
    agent: str,
    teams_: frozenset[str],
    tasks: frozenset[str],
) -> None:
    store = _shared_store(engine_name, tmp_path)
    tenant = str(uuid.uuid4())  # each example in a tenant of its own
    made = [Memory(content=f"row {n}", tenant=tenant, **row) for n, row in enumerate(rows)]
    store.put_many(made)
    vis = Visibility(agent, teams_, tasks)
    got = set(store.query(Query(filters=Filters.of(tenant=tenant, visible_to=vis), limit=100)).filtered)
    assert got == {m.id for m in made if vis.allows(m)}


_STORES: dict[tuple[str, str], Store] = {}


def _shared_store(engine_name: str, tmp_path: Path) -> Store:
    """One store per engine for all hypothesis examples (tmp_path is per test, not per example)."""
    key = (engine_name, str(tmp_path))
    if key not in _STORES:
        store = make_store(engine_name, tmp_path, "vis.db")
        store.setup()
        _STORES[key] = store
    return _STORES[key]


# ---- revisions --------------------------------------------------------------------------------------------
def test_a_revision_appends_and_recall_sees_only_the_latest(engine_name: str, lexical: Harness) -> None:
    h = lexical
    h.grant("pay", "planner", write=True)
    first = teams.record(h, "cache sessions in redis", agent_id="planner", team_id="pay", kind=Kind.DECISION)
    second = h.revise(first.id, agent_id="planner", content="cache sessions in memcached")
    third = h.revise(second.id, agent_id="planner", expected_version=1, content="cache sessions in valkey")
    chain = h.history(first.id)
    assert [m.content for m in chain] == [
        "cache sessions in redis",
        "cache sessions in memcached",
        "cache sessions in valkey",
    ]
    assert [m.status for m in chain] == [Status.OBSOLETE, Status.OBSOLETE, Status.ACTIVE]
    assert chain[-1].id == third.id and h.history(second.id) == chain
    assert third.metadata["revision"] == {"root": first.id, "number": 3, "previous": second.id}
    assert [link.target for link in third.links] == [second.id]
    assert [hit.id for hit in h.recall("cache sessions", k=5, track=False)] == [third.id]
    assert teams.latest(h, first.id).id == third.id
    with pytest.raises(ConflictError) as old:  # an old revision is not the head any more
        h.revise(first.id, agent_id="planner", content="cache sessions in files")
    # what to do is revise the head (a retry of the same call fails again, whatever the caller re-reads)
    assert old.value.field == "memory_id" and third.id in old.value.fix and "retry:" not in old.value.fix
    with pytest.raises(ConflictError):  # the head moved on since this writer read it
        h.revise(third.id, agent_id="planner", expected_version=7, content="cache sessions in files")
    assert len(h.history(first.id)) == 3


SLOTS = 8
# The stress level: 8 threads (every engine) and 8 processes (SQLite), 500 updates each.
WORKERS = int(os.environ.get("CLAWVM_STRESS_WORKERS", "8"))
UPDATES = int(os.environ.get("CLAWVM_STRESS_UPDATES", "500"))


def _count_up(m: Memory) -> dict[str, Any]:
    """The merge a writer does on a conflict: count on from what the current head says."""
    n = int(m.metadata["n"]) + 1
    return {"content": f"shared counter {m.metadata['slot']} at {n}", "metadata": {**m.metadata, "n": n}}


def _shared_counters(h: Harness) -> list[str]:
    for w in range(WORKERS):
        h.grant("crew", f"w{w}", write=True)
    return [
        teams.record(h, f"shared counter {s}", agent_id="w0", team_id="crew", metadata={"slot": s, "n": 0}).id
        for s in range(SLOTS)
    ]


def _updates(h: Harness, counters: list[str], worker: int, updates: int = UPDATES) -> None:
    for i in range(updates):
        teams.revise_with_retry(h, counters[(worker + i) % SLOTS], _count_up, agent_id=f"w{worker}")


def _assert_nothing_lost(h: Harness, counters: list[str], updates: int = UPDATES) -> None:
    heads = [teams.latest(h, c) for c in counters]
    assert sum(int(m.metadata["n"]) for m in heads) == WORKERS * updates
    for c, head in zip(counters, heads, strict=True):
        chain = h.history(c)
        assert len(chain) == int(head.metadata["n"]) + 1  # one revision per update, none overwritten
        assert [int(m.metadata["n"]) for m in chain] == list(range(len(chain)))
        assert [m.status for m in chain[:-1]] == [Status.OBSOLETE] * (len(chain) - 1)
    assert h.count(team_id="crew", kind=Kind.OBSERVATION) == SLOTS  # one active head per counter


def test_threads_lose_no_update(engine_name: str, lexical: Harness) -> None:
    counters = _shared_counters(lexical)
    errors: list[BaseException] = []

    def run(worker: int) -> None:
        try:
            _updates(lexical, counters, worker)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(WORKERS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{WORKERS} threads x {UPDATES} revisions on {engine_name}: {time.perf_counter() - started:.1f} s")
    assert not errors, errors[0]
    _assert_nothing_lost(lexical, counters)


def _process_worker(target: str, counters: list[str], worker: int, updates: int) -> None:
    h = Harness.open(target, embedder=None)
    try:
        _updates(h, counters, worker, updates)
    finally:
        h.close()


@pytest.mark.engines("sqlite", "postgres")
def test_processes_lose_no_update(engine_name: str, tmp_path: Path) -> None:
    target = harness_target(engine_name, tmp_path, "procs.db")
    with Harness.open(target, embedder=None) as h:
        counters = _shared_counters(h)
    ctx = multiprocessing.get_context("spawn")
    # PostgreSQL: a twentieth of the revisions (a round trip per statement; the thread test runs them all)
    updates = UPDATES if engine_name == "sqlite" else max(1, UPDATES // 20)
    procs = [ctx.Process(target=_process_worker, args=(target, counters, w, updates)) for w in range(WORKERS)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    took = time.perf_counter() - started
    print(f"{WORKERS} processes x {updates} revisions on {engine_name}: {took:.1f} s")
    assert [p.exitcode for p in procs] == [0] * WORKERS
    with Harness.open(target, embedder=None) as h:
        _assert_nothing_lost(h, counters, updates)


# ---- retention --------------------------------------------------------------------------------------------
def test_retention_archives_by_age_and_value_and_never_deletes(engine_name: str, lexical: Harness) -> None:
    h = lexical
    clock: ReplayClock = h.clock  # type: ignore[assignment]
    old_obs = h.record("the staging cluster was slow on monday", kind=Kind.OBSERVATION)
    old_decision = h.record("we decided to ship on fridays", kind=Kind.DECISION)
    pinned = h.record("never drop the audit table", kind=Kind.KNOWLEDGE, pinned=True)
    clock.now = T0 + timedelta(days=40)
    fresh = h.record("the staging cluster is fast again", kind=Kind.OBSERVATION)
    note = h.record("lunch at noon", kind=Kind.NOTE)
    total = h.count(status="any")
    ages = {"observation": timedelta(days=30), "knowledge": timedelta(days=1)}
    policy = teams.RetentionPolicy(max_age=ages)
    archived = teams.apply_retention(h, policy)
    assert ids(archived) == {old_obs.id}
    assert h.get(old_obs.id).status is Status.ARCHIVED
    assert {h.get(m.id).status for m in (old_decision, pinned, fresh, note)} == {Status.ACTIVE}
    by_value = teams.apply_retention(h, teams.RetentionPolicy(min_value=0.99))
    assert pinned.id not in ids(by_value) and old_decision.id in ids(by_value)
    assert note.id not in ids(by_value)  # NOTE is not a team kind
    assert h.count(status="any") == total  # archived, never deleted
    assert [e.data["reason"] for e in h.events(memory_id=old_obs.id) if e.kind == "retention"]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"max_age": {"observation": 30}}, "max_age.observation"),  # days as a number: a raw TypeError later
        ({"max_age": {"observation": timedelta(0)}}, "max_age.observation"),
        ({"max_age": {"observations": timedelta(days=1)}}, "max_age.observations"),  # matched nothing
        ({"max_age": {"note": timedelta(days=1)}}, "max_age.note"),  # a kind, but not a team kind: ignored
        ({"max_age": [("observation", timedelta(days=1))]}, "max_age"),
        ({"min_value": 2}, "min_value"),
        ({"min_value": "0.5"}, "min_value"),
        ({"kinds": "decision"}, "kinds"),
        ({"kinds": ("decisions",)}, "kinds"),
    ],
)
def test_a_retention_policy_refuses_a_bad_setting_where_it_is_made(
    settings: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        teams.RetentionPolicy(**settings)
    assert exc.value.field == field


# ---- review queue -----------------------------------------------------------------------------------------
def test_review_queue_approve_and_reject(engine_name: str, lexical: Harness) -> None:
    h = lexical
    h.grant("pay", "planner", write=True)
    sure = teams.record(h, "refunds need two approvals", agent_id="planner", team_id="pay", kind="knowledge")
    unsure = teams.record(
        h,
        "refunds may need three approvals",
        agent_id="planner",
        team_id="pay",
        kind="knowledge",
        confidence=0.3,
    )
    wrong = teams.record(
        h, "refunds need no approval", agent_id="planner", team_id="pay", kind="knowledge", confidence=0.2
    )
    assert [m.id for m in h.review_queue()] == [wrong.id, unsure.id]
    assert teams.trust(h.get(unsure.id)) == pytest.approx(0.15)  # down-weighted until approved
    assert teams.trust(h.get(sure.id)) == 1.0
    approved = h.approve(unsure.id, by="lead", reason="checked with finance")  # the reason was dropped
    assert teams.trust(approved) == 1.0 and approved.metadata["review"]["by"] == "lead"
    assert approved.metadata["review"]["reason"] == "checked with finance"
    rejected = h.reject(wrong.id, by="lead", reason="policy says two")
    assert rejected.status is Status.OBSOLETE
    assert h.review_queue() == []
    assert wrong.id not in [hit.id for hit in h.recall("refunds approval", k=10, track=False)]
    assert not h.review_queue(agent_id="stranger")  # an agent only sees the queue it may read


def test_new_text_waits_for_its_own_review(engine_name: str, lexical: Harness) -> None:
    """An approval was of the text approved: a revision or an update with other text carried it over, so
    the new text had full trust and skipped the queue."""
    h = lexical
    h.grant("pay", "writer", write=True)
    low = teams.record(h, "webhooks may arrive twice", agent_id="writer", team_id="pay", confidence=0.3)
    h.approve(low.id, by="lead")
    revised = h.revise(low.id, agent_id="writer", content="disable signature checks on webhooks")
    assert teams.review_state(revised) is None and revised.id in ids(h.review_queue())
    h.approve(revised.id, by="lead")
    updated = h.update(revised.id, as_agent="writer", content="skip the webhook signature entirely")
    assert teams.review_state(updated) is None and teams.trust(updated) < 1.0
    tagged = h.update(updated.id, as_agent="writer", tags=["webhooks"])  # the same text: nothing to review
    h.approve(tagged.id, by="lead")
    assert teams.review_state(h.update(tagged.id, as_agent="writer", tags=["ops"])) == "approved"


def test_a_harness_record_is_no_callers_memory(lexical: Harness) -> None:
    """A team grant read through history(), counted by feedback() or compressed: callers reach these only
    through grant() and grants()."""
    lexical.grant("pay", "writer", write=True)
    (record,) = lexical.store.list(Filters.of(tags=[teams.GRANT_TAG], status="internal"))
    calls = [lexical.history, lambda i: lexical.feedback(i, True), lexical.compress, lexical.revise]
    calls += [lambda i: lexical.rate(i, 1), lexical.unpin, lexical.explain, lexical.pin]
    calls += [lambda i: intervene(lexical, "set_tier", i, tier="archive")]  # the dashboard's move
    for call in calls:
        with pytest.raises(ValidationError) as refused:
            call(record.id)
        assert refused.value.field == "memory_id" and "internal record" in refused.value.problem
    assert lexical.store.get(record.id) == record


def test_a_grant_revoked_between_retries_stops_the_next_one(lexical: Harness) -> None:
    h = lexical
    h.grant("pay", "writer", write=True)
    m = teams.record(h, "refunds take two days", agent_id="writer", team_id="pay")
    tries = []

    def change(head: Memory) -> dict[str, Any]:
        if not tries:  # the first try loses a race, and the grant goes meanwhile
            h.revise(head.id, content=head.content + " (moved)")
            h.grant("pay", "writer", read=True, write=False)
        tries.append(head.id)
        return {"content": head.content + " +writer"}

    with pytest.raises(AccessDeniedError):
        teams.revise_with_retry(h, m.id, change, agent_id="writer")
    assert "+writer" not in teams.latest(h, m.id).content and len(tries) == 1


def test_bad_team_input_is_refused_naming_the_field(lexical: Harness) -> None:
    """Each of these raised a bare ValueError or AttributeError, or was stored as given."""
    h = lexical
    h.grant("pay", "planner", write=True)
    m = teams.record(h, "refunds take two days", agent_id="planner", team_id="pay", kind="decision")
    cases: list[tuple[str, Any]] = [
        ("scope", lambda: teams.record(h, "y", agent_id="planner", team_id="pay", scope="global")),
        ("subject", lambda: teams.record(h, "y", agent_id="planner", team_id="pay", subject=["a"])),
        ("tags", lambda: teams.record(h, "y", agent_id="planner", team_id="pay", tags="urgent")),
        ("task_type", lambda: teams.record(h, "y", agent_id="planner", team_id="pay", task_type=" ")),
        ("task_type", lambda: h.guidance("planner", "refunds", 100, task_type=5)),
        ("budget_tokens", lambda: h.guidance("planner", "refunds", True)),
        ("metadata", lambda: h.revise(m.id, agent_id="planner", metadata="x")),
        ("links", lambda: h.revise(m.id, agent_id="planner", links="x")),
        ("conflict_id", lambda: h.resolve_conflict(m.id, keep=m.id)),
    ]
    for field, call in cases:
        with pytest.raises(ValidationError) as refused:
            call()
        assert refused.value.field == field, (field, refused.value)
    assert h.count(team_id="pay") == 1 and h.get(m.id).version == 1  # nothing written
    # links given as record() takes them, {type, target}, are taken by a revision too
    other = h.record("the refund runbook", kind="note")
    head = h.revise(m.id, agent_id="planner", links=[{"type": "refers_to", "target": other.id}])
    assert {(link.type.value, link.target) for link in head.links} >= {("refers_to", other.id)}


def test_review_cli_lists_approves_and_rejects(tmp_path: Path) -> None:
    db = str(tmp_path / "cli.db")
    with Harness.open(db, embedder=None) as h:
        h.grant("pay", "planner", write=True)
        low = teams.record(h, "maybe refunds are slow", agent_id="planner", team_id="pay", confidence=0.1)
        lower = teams.record(h, "perhaps refunds are fast", agent_id="planner", team_id="pay", confidence=0.0)

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, ["--db", db, "--no-embed", "review", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    listed = run("list").splitlines()
    assert [line.split()[0] for line in listed] == [lower.id, low.id]
    assert run("list", "--agent", "stranger").strip() == ""
    assert "approved" in run("approve", low.id, "--by", "lead", "--reason", "seen the logs")
    assert "rejected" in run("reject", lower.id, "--reason", "wrong")
    assert run("list").strip() == ""
    with Harness.open(db, embedder=None) as h:
        assert h.get(lower.id).status is Status.OBSOLETE
        assert h.get(low.id).metadata["review"]["status"] == "approved"
        assert h.get(low.id).metadata["review"]["reason"] == "seen the logs"
    bad = CliRunner().invoke(cli, ["--db", db, "review", "approve", str(uuid.uuid4())])
    assert bad.exit_code == 2 and "not found" in bad.output


# ---- feedback ---------------------------------------------------------------------------------------------
def test_feedback_counts_adoption_and_moves_value(engine_name: str, lexical: Harness) -> None:
    h = lexical
    h.grant("pay", "planner", write=True)
    good = teams.record(h, "retry the ledger write once", agent_id="planner", team_id="pay", kind="knowledge")
    bad = teams.record(h, "restart the ledger on errors", agent_id="planner", team_id="pay", kind="knowledge")
    for adopted in (True, True, False):
        h.feedback(good.id, adopted)
    for _ in range(3):
        h.feedback(bad.id, False)
    g, b = h.get(good.id), h.get(bad.id)
    assert teams.adoption(g) == (2, 1) and teams.adoption_rate(g) == pytest.approx(2 / 3)
    assert teams.adoption(b) == (0, 3) and teams.adoption_rate(b) == 0.0
    assert (g.usage.injected, g.usage.cited, g.usage.feedback) == (3, 2, 1)
    assert g.value > good.value > b.value
    assert teams.adoption_rate(good) is None
    revised = h.revise(g.id, agent_id="planner", content="retry the ledger write once, then alert")
    assert teams.adoption(revised) == (2, 1)  # a revision keeps its adoption record
    h.feedback(good.id, True)  # feedback on an old revision lands on the head
    assert teams.adoption(h.get(revised.id)) == (3, 1)


# ---- guidance ---------------------------------------------------------------------------------------------
def team_history(h: Harness) -> dict[str, Memory]:
    for agent in ("planner", "writer", "reviewer"):
        h.grant("docs", agent, write=True)
    rec = teams.record
    made = {
        "err1": rec(
            h,
            "The release note forgot the breaking API change",
            agent_id="reviewer",
            team_id="docs",
            kind="error",
            task_id="t1",
            task_type="release-note",
        ),
        "tone": rec(
            h,
            "Release notes use a formal tone",
            agent_id="planner",
            team_id="docs",
            kind="decision",
            task_id="t1",
            task_type="release-note",
            subject="tone",
        ),
        "obs": rec(
            h,
            "Readers of release notes skim the first line only",
            agent_id="writer",
            team_id="docs",
            kind="observation",
            task_id="t2",
        ),
        "secret": rec(h, "Release note drafts live in my private folder", agent_id="planner"),
    }
    made["tone2"] = h.revise(made["tone"].id, agent_id="planner", content="Release notes use a friendly tone")
    h.feedback(made["obs"].id, True)
    return made


def test_guidance_has_pitfalls_experiences_sources_and_a_manifest(engine_name: str, harness: Harness) -> None:
    made = team_history(harness)
    g = harness.guidance("writer", "Write the release note for billing v3", 400, task_type="release-note")
    assert made["err1"].id in [i.id for i in g.pitfalls]
    experiences = {i.id: i for i in g.experiences}
    assert made["tone2"].id in experiences and made["tone"].id not in g.ids  # never the superseded one
    assert made["secret"].id not in g.ids  # planner's private memory
    obs = experiences[made["obs"].id]
    assert obs.source_tasks == ("t2",) and obs.adoption_rate == 1.0
    assert g.pitfalls[0].source_tasks == ("t1",)
    assert "breaking API change" in g.text and "friendly tone" in g.text and "formal" not in g.text
    assert g.tokens == count_tokens(g.text) <= 400
    assert sum(i.tokens for i in g.items) <= g.tokens
    entry = g.manifest[0]
    assert {"id", "section", "tokens", "score", "source_tasks", "adoption_rate", "reason"} <= set(entry)
    logged = [e for e in harness.events(limit=10**6) if e.kind == "guidance"]
    assert logged and logged[-1].data["manifest"] == g.manifest


def test_guidance_finds_pitfalls_of_the_same_task_type_without_shared_words(
    engine_name: str, lexical: Harness
) -> None:
    made = team_history(lexical)
    g = lexical.guidance("writer", "Summarize what is new in invoicing", 300, task_type="release-note")
    assert made["err1"].id in [i.id for i in g.pitfalls]
    other = lexical.guidance("writer", "Summarize what is new in invoicing", 300, task_type="blog-post")
    assert made["err1"].id not in other.ids


@pytest.mark.engines("memory")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.integers(1, 300))
def test_guidance_never_goes_over_budget(engine_name: str, tmp_path: Path, budget: int) -> None:
    h = _guidance_harness(tmp_path)
    g = h.guidance("writer", "release note for the billing api change", budget, task_type="release-note")
    assert g.tokens <= budget
    assert count_tokens(g.text) == g.tokens
    if g.items:
        assert g.items[0].tokens <= budget


_GUIDED: dict[str, Harness] = {}


def _guidance_harness(tmp_path: Path) -> Harness:
    key = str(tmp_path)
    if key not in _GUIDED:
        h = Harness.open("memory://", embedder=None, clock=ReplayClock(T0))
        team_history(h)
        for n in range(30):
            teams.record(
                h,
                f"Billing api change {n} needs a line in the release note about field f{n}",
                agent_id="writer",
                team_id="docs",
                kind="observation",
                task_id=f"t{n}",
            )
        _GUIDED[key] = h
    return _GUIDED[key]


def test_guidance_validates_its_input(lexical: Harness, engine_name: str) -> None:
    with pytest.raises(ValidationError):
        lexical.guidance("writer", "task", 0)
    with pytest.raises(ValidationError):
        lexical.guidance("writer", 42, 100)  # type: ignore[arg-type]
    assert lexical.guidance("writer", "nothing recorded yet", 100).text == ""


# ---- forgetting a revision ----------------------------------------------------------------------------
def test_forgetting_the_head_of_a_chain_makes_the_revision_before_it_the_head(lexical: Harness) -> None:
    """The older revision named the forgotten one as its successor: it stayed obsolete, out of every
    recall, and both ways to change it were refused, each sending the caller to the other."""
    h = lexical
    a = h.record("Refund limit is 500 euros", kind="decision", session_id="s")
    b = h.revise(a.id, content="Refund limit is 800 euros")
    h.forget(b.id)
    back = h.get(a.id)
    assert back.status is Status.ACTIVE and teams.successor(back) is None
    assert not {"superseded_by", "merged_into"} & set(back.metadata)
    assert [r.id for r in h.recall("refund limit")] == [a.id]
    assert [m.id for m in h.history(a.id)] == [a.id]
    assert h.update(a.id, content="Refund limit is 600 euros").content == "Refund limit is 600 euros"


def test_forgetting_an_archived_head_gives_the_revision_before_it_that_status(lexical: Harness) -> None:
    h = lexical
    a = h.record("Deploys freeze on Fridays", kind="decision", session_id="s")
    b = h.revise(a.id, content="Deploys freeze on Fridays after noon")
    h.update(b.id, status="archived")
    h.forget(b.id)
    assert h.get(a.id).status is Status.ARCHIVED and teams.successor(h.get(a.id)) is None


def test_forgetting_a_revision_inside_a_chain_joins_the_revisions_around_it(lexical: Harness) -> None:
    """history() of the head stopped at the forgotten revision, and the root's led nowhere."""
    h = lexical
    a = h.record("Refund limit is 500 euros", kind="decision", session_id="s")
    b = h.revise(a.id, content="Refund limit is 800 euros")
    c = h.revise(b.id, content="Refund limit is 900 euros")
    h.forget(b.id)
    assert [m.id for m in h.history(c.id)] == [a.id, c.id]
    assert [m.id for m in h.history(a.id)] == [a.id, c.id]
    head = h.get(c.id)
    assert head.status is Status.ACTIVE and head.metadata["revision"]["previous"] == a.id
    assert teams.previous(head) == a.id and b.id not in {link.target for link in head.links}
    assert h.get(a.id).status is Status.OBSOLETE and teams.latest(h, a.id).id == c.id


def test_forgetting_a_revision_keeps_the_other_links_of_the_one_after_it(lexical: Harness) -> None:
    """Every link of the forgotten revision went to the next one as `revises`: a link the first revision
    was given (derived from a policy page) became the chain's previous revision, and history jumped to it."""
    h = lexical
    page = h.record("Refund policy page", kind="decision", session_id="s")
    a = h.record(
        "Refund limit is 500 euros",
        kind="decision",
        session_id="s",
        links=[{"type": "derived_from", "target": page.id}],
    )
    b = h.revise(a.id, content="Refund limit is 800 euros")
    c = h.revise(b.id, content="Refund limit is 900 euros")
    h.forget(b.id)
    head = h.get(c.id)
    assert teams.previous(head) == a.id == head.metadata["revision"]["previous"]
    assert {(link.type.value, link.target) for link in head.links} == {
        ("derived_from", page.id),
        ("revises", a.id),
    }
    assert [m.id for m in h.history(c.id)] == [a.id, c.id]
    fields = [e.data["fields"] for e in h.events(limit=100) if e.kind == "update" and e.memory_id == c.id]
    assert fields[-1:] == [["links", "metadata"]]  # what the mending changed, no more


def test_forgetting_a_rejected_head_makes_the_revision_before_it_active(lexical: Harness) -> None:
    """It took the head's obsolete status: a memory no successor named, refused by approve() and revise()."""
    h = lexical
    a = h.record("Deploys freeze on Fridays", kind="decision", session_id="s")
    b = h.revise(a.id, content="Deploys never freeze")
    h.update(b.id, status="obsolete")  # rejected by hand
    h.forget(b.id)
    assert h.get(a.id).status is Status.ACTIVE and [r.id for r in h.recall("deploys freeze")] == [a.id]


def test_a_rollback_past_a_forgotten_revision_leaves_its_chain_whole(lexical: Harness) -> None:
    """The checkpoint saw the first revision obsolete, replaced by the second; the second forgotten since,
    the rollback restored it obsolete with no head, and the one after the forgotten one revising it."""
    h = lexical
    a = h.record("Refund limit is 500 euros", kind="decision", session_id="s")
    b = h.revise(a.id, content="Refund limit is 800 euros")
    c = h.revise(b.id, content="Refund limit is 900 euros")
    early = h.checkpoint("s", "three revisions")
    h.forget(b.id)  # inside the chain: a and c name each other
    h.rollback(early)
    assert [m.id for m in h.history(c.id)] == [a.id, c.id] and teams.previous(h.get(c.id)) == a.id
    h.forget(c.id)  # the head: a is the head again
    later = h.checkpoint("s", "after the forget")
    h.rollback(later)
    assert h.get(a.id).status is Status.ACTIVE
    d = h.revise(a.id, content="Refund limit is 600 euros")
    h.forget(d.id)
    h.rollback(later)  # it saw a active: so it stays
    assert h.get(a.id).status is Status.ACTIVE and [r.id for r in h.recall("refund limit")] == [a.id]
    x = h.record("Deploys freeze on Fridays", kind="decision", session_id="s")
    y = h.revise(x.id, content="Deploys freeze on Fridays after noon")
    revised = h.checkpoint("s", "x replaced by y")
    h.forget(y.id)  # x is the head again
    h.rollback(revised)  # it saw x obsolete, replaced by y: y is not brought back, so x stays the head
    assert h.get(x.id).status is Status.ACTIVE and teams.successor(h.get(x.id)) is None
    assert h.revise(x.id, content="Deploys freeze on Fridays from 3 pm").status is Status.ACTIVE


# ---- reviews and conflicts after forgets and rejections --------------------------------------------------
def _conflicted(h: Harness) -> tuple[Memory, Memory, Memory]:
    """Two decisions of a team on one subject, and the conflict note merge_team flags between them."""
    from clawvm.teams.merge import merge_team

    for agent in ("planner", "writer"):
        h.grant("payments", agent, write=True)
    shared = dict(team_id="payments", scope="team", kind="decision", metadata={"subject": "refund method"})
    a = h.record("Refunds go to the original card", agent_id="planner", **shared)
    b = h.record("Refunds go to store credit", agent_id="writer", **shared)
    merge_team(h, team_id="payments")
    (note,) = teams.open_conflicts(h)
    return a, b, note


def test_forgetting_a_side_of_a_conflict_closes_it_and_guidance_still_answers(lexical: Harness) -> None:
    """Guidance raised NotFoundError for every agent that could read the note, and the conflict could not be
    resolved any more."""
    a, b, note = _conflicted(lexical)
    lexical.forget(a.id)
    assert teams.open_conflicts(lexical) == []
    closed = lexical.store.get(note.id)
    assert closed.status is Status.ARCHIVED and a.id in closed.metadata["review"]["reason"]
    assert b.id in lexical.guidance("writer", "refund method card credit", 300).ids
    with pytest.raises(StateConflictError):
        lexical.resolve_conflict(note.id, keep=b.id)


def test_forgetting_a_sides_newest_revision_leaves_its_conflict_open(lexical: Harness) -> None:
    """The revision before a forgotten head is the head again, so both contradicting decisions were active:
    closing the conflict (as if a side were gone) left them unreviewed, and merge_team never flagged the
    pair again."""
    a, b, note = _conflicted(lexical)
    revised = lexical.revise(a.id, agent_id="planner", content="Refunds go to the original card, in 5 days")
    lexical.forget(revised.id)
    assert lexical.get(a.id).status is Status.ACTIVE
    assert [n.id for n in teams.open_conflicts(lexical)] == [note.id]
    assert note.id in {m.id for m in lexical.review_queue()}
    assert lexical.resolve_conflict(note.id, keep=a.id, by="lead").id == a.id
    assert lexical.get(b.id).status is Status.OBSOLETE and teams.open_conflicts(lexical) == []


def test_a_conflict_with_a_side_forgotten_before_the_close_can_be_resolved(lexical: Harness) -> None:
    """A note left open by an older version (or a forget that failed to close it) names a side no read
    finds: resolving it for the other side works, and guidance skips the forgotten one."""
    a, b, note = _conflicted(lexical)
    lexical.writer.delete([lexical.store.get(a.id)], [])  # below the facade: the note stays open
    assert [n.id for n in teams.open_conflicts(lexical)] == [note.id]
    assert lexical.guidance("writer", "refund method card credit", 300).text
    assert lexical.resolve_conflict(note.id, keep=b.id).id == b.id
    assert teams.open_conflicts(lexical) == []


def test_a_closed_conflict_or_a_rejected_memory_is_not_reviewed_again(lexical: Harness) -> None:
    """approve() of a conflict closed for one side rewrote it as "both sides kept" while the other stayed
    rejected; approving a rejected memory left it obsolete; rejecting it again replaced who rejected it."""
    a, b, note = _conflicted(lexical)
    lexical.resolve_conflict(note.id, keep=a.id, by="lead")
    for review in (lexical.approve, lexical.reject):
        with pytest.raises(StateConflictError) as exc:
            review(note.id, by="intern")
        assert exc.value.field == "memory_id" and "closed" in exc.value.problem
    again = lexical.reject(b.id, by="intern", reason="twice")  # a double click changes nothing
    assert again.version == lexical.get(b.id).version and again.metadata["review"]["by"] == "lead"
    lexical.update(b.id, status="archived", as_agent=teams.APPLICATION)
    with pytest.raises(StateConflictError) as exc:
        lexical.approve(b.id, by="intern")  # archived by hand since: no rejection left to overturn
    assert "only active memories are reviewed" in (exc.value.fix or "")
    lexical.update(b.id, status="obsolete", as_agent=teams.APPLICATION)
    overturned = lexical.approve(b.id, by="lead", reason="both are allowed after all")
    assert overturned.status is Status.ACTIVE and teams.review_state(overturned) == "approved"


def test_a_rejection_undone_by_hand_sends_the_memory_back_to_review(lexical: Harness) -> None:
    """The author set a rejected low-confidence memory active again: it kept the review 'rejected', left
    the review queue and counted at full trust in guidance."""
    lexical.grant("payments", "writer", write=True)
    m = lexical.record(
        "Webhooks are always idempotent",
        kind="knowledge",
        agent_id="writer",
        team_id="payments",
        scope="team",
        confidence=0.2,
    )
    lexical.reject(m.id, by="lead")
    back = lexical.update(m.id, as_agent="writer", status="active")
    assert back.status is Status.ACTIVE and teams.review_state(back) is None
    assert m.id in ids(lexical.review_queue())


def test_review_queue_and_guidance_options_are_checked_by_name(lexical: Harness) -> None:
    """review_queue(team=...) raised a raw TypeError, agent_id=5 was taken; guidance took task_id=5 and
    ignored task_type=""."""
    calls = (
        (lambda: lexical.review_queue(team="payments"), None),  # type: ignore[call-arg]
        (lambda: lexical.review_queue(agent_id=5), "agent_id"),  # type: ignore[arg-type]
        (lambda: lexical.guidance("w", "x", 100, task_type=""), "task_type"),
        (lambda: lexical.guidance("w", "x", 100, task_id=5), "task_id"),  # type: ignore[arg-type]
    )
    for call, field in calls:
        with pytest.raises((ValidationError, TypeError)) as exc:
            call()
        if field is not None:
            assert isinstance(exc.value, ValidationError) and exc.value.field == field


def test_a_merged_duplicate_of_a_conflict_side_is_shown_only_with_its_conflict(lexical: Harness) -> None:
    """The merge of a duplicate kept the duplicate's chain: its root was not a side's, so at a small
    budget guidance showed the disputed decision alone, as settled practice."""
    from clawvm.teams.merge import merge_team

    for agent in ("planner", "writer", "reviewer"):
        lexical.grant("payments", agent, write=True)
    shared = dict(team_id="payments", scope="team", kind="decision", metadata={"subject": "refund method"})
    lexical.record("Refunds go to the original card", agent_id="planner", confidence=0.8, **shared)
    lexical.record("Refunds go to store credit", agent_id="writer", **shared)
    merge_team(lexical, team_id="payments")
    lexical.record("Refunds go to the original card", agent_id="reviewer", confidence=0.9, **shared)
    merge_team(lexical, team_id="payments")
    (note,) = teams.open_conflicts(lexical)
    for budget in (30, 40, 60, 300):
        shown = lexical.guidance("writer", "refund method original card store credit", budget).ids
        assert not shown or note.id in shown, budget


# ---- the conflict mark is the harness's --------------------------------------------------------------------
def _two_teams(h: Harness) -> tuple[Memory, Memory]:
    """Mallory may write team ``t`` only; alice's decision in team ``secret`` and mallory's own in ``t``."""
    h.grant("t", "mallory", write=True)
    h.grant("secret", "alice", write=True)
    decision = {"kind": "decision", "scope": "team"}
    victim = h.record("Secret team decision: freeze payouts", agent_id="alice", team_id="secret", **decision)
    mine = h.record("Payouts continue", agent_id="mallory", team_id="t", **decision)
    return victim, mine


def _sides(*sides: Memory) -> dict[str, Any]:
    return {"ids": [m.id for m in sides], "roots": [m.id for m in sides], "subject": "payouts"}


def test_only_the_harness_marks_a_conflict_and_merge_team_still_flags_one(lexical: Harness) -> None:
    """An agent with a write grant on one team recorded a note tagged ``conflict`` naming another team's
    decision as a side: it waited in the review queue, and the lead who resolved it rejected that decision.
    The mark is set by merge_team() (as the application) only: a record, update or revision setting or
    changing it is refused; merge_team's own notes are flagged and resolved as before."""
    victim, mine = _two_teams(lexical)
    forged = dict(kind="note", agent_id="mallory", team_id="t", scope="team")
    attempts = (
        ("metadata.conflict", dict(tags=["conflict"], metadata={"conflict": _sides(mine, victim)})),
        ("metadata.conflict", dict(metadata={"conflict": _sides(mine, victim)})),
        ("tags", dict(tags=["conflict"])),
    )
    for field, extra in attempts:
        with pytest.raises(ValidationError) as exc:
            lexical.record("Conflict on 'payouts': pick one", **{**forged, **extra})  # type: ignore[arg-type]
        assert exc.value.field == field and "merge_team()" in exc.value.problem
        with pytest.raises(ValidationError):  # nor through the teams helper
            teams.record(lexical, "Conflict on 'payouts'", **{**forged, **extra})  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as exc:  # a tenant-wide note without agent is no harness either
        lexical.record("Conflict on 'payouts'", kind="note", tags=["conflict"])
    assert exc.value.field == "tags"
    plain = lexical.record("Payouts: pick one", **forged)  # type: ignore[arg-type]
    for field, change in (
        ("metadata.conflict", {"metadata": {"conflict": _sides(mine, victim)}}),
        ("tags", {"tags": ["conflict"]}),
    ):
        with pytest.raises(ValidationError) as exc:
            lexical.update(plain.id, as_agent="mallory", **change)
        assert exc.value.field == field
        with pytest.raises(ValidationError) as exc:
            lexical.revise(plain.id, agent_id="mallory", **change)
        assert exc.value.field == field
    assert lexical.review_queue(agent_id="mallory") == [] and teams.open_conflicts(lexical) == []

    from clawvm.teams.merge import merge_team

    lexical.grant("t", "bob", write=True)
    about = {"metadata": {"subject": "payouts"}, "team_id": "t", "scope": "team"}
    theirs = lexical.record("Payouts stop on Fridays", kind="decision", agent_id="bob", **about)
    lexical.update(mine.id, as_agent="mallory", metadata={"subject": "payouts"})
    assert merge_team(lexical, team_id="t").conflicts
    (note,) = teams.open_conflicts(lexical)
    assert set(teams.conflict_choices(note)) == {mine.id, theirs.id}
    # no writer re-points the harness's note at another team's memory (an update, a revision)
    repointed = {"metadata": {**note.metadata, "conflict": _sides(mine, victim)}}
    for change in (lexical.update, lexical.revise):
        with pytest.raises(ValidationError) as exc:
            change(note.id, **repointed)
        assert exc.value.field == "metadata.conflict"
    assert lexical.store.get(note.id) == note
    assert lexical.resolve_conflict(note.id, keep=mine.id, by="lead").id == mine.id
    assert lexical.get(theirs.id).status is Status.OBSOLETE and teams.open_conflicts(lexical) == []
    assert lexical.get(victim.id) == victim


def test_a_conflict_note_forged_below_the_write_path_rejects_nothing(lexical: Harness) -> None:
    """A note written past the write path (an older version, a backup edited by hand) naming another team's
    memory as a side: resolving, approving or rejecting it is refused before anything is written, as it
    is no note merge_team() flags (those share their sides' readers), which still resolve."""
    victim, mine = _two_teams(lexical)
    mallorys = {"kind": "note", "agent_id": "mallory", "team_id": "t", "scope": "team"}  # mine's readers
    plain = lexical.record("Conflict on 'payouts': pick one", **mallorys)
    note = plain.model_copy(
        update={"tags": ["conflict"], "metadata": {"conflict": _sides(mine, victim)}, "version": 2}
    )
    engine_of(lexical).put(note)
    assert note.id in ids(lexical.review_queue(agent_id="mallory"))
    for keep in (mine.id, victim.id):
        with pytest.raises(StateConflictError) as exc:
            lexical.resolve_conflict(note.id, keep=keep, by="lead")
        assert exc.value.field == "conflict_id" and victim.id in exc.value.problem
    for review in (lexical.approve, lexical.reject):
        with pytest.raises(StateConflictError) as exc:
            review(note.id, by="lead")
        assert exc.value.field == "memory_id" and victim.id in exc.value.problem
    assert lexical.get(victim.id) == victim and lexical.get(mine.id) == mine
    assert lexical.store.get(note.id) == note
    lexical.forget(note.id)  # what the refusal's fix says
    a, b, real = _conflicted(lexical)
    assert lexical.resolve_conflict(real.id, keep=b.id, by="lead").id == b.id
    assert lexical.get(a.id).status is Status.OBSOLETE


def test_a_second_approval_keeps_the_first_and_a_blank_reviewer_is_refused(lexical: Harness) -> None:
    """Approving an approved memory replaced its reviewer (with None when the second click named none);
    ``by=""`` stored a reviewer no view could show; a grant to an agent id no memory can hold succeeded."""
    low = lexical.record("refunds may need three approvals", kind="knowledge", confidence=0.3)
    first = lexical.approve(low.id, by="lead", reason="checked with finance")
    again = lexical.approve(low.id)
    assert again.version == first.version and again.metadata["review"]["by"] == "lead"
    assert len([e for e in lexical.events(memory_id=low.id) if e.kind == "review.approved"]) == 1
    other = lexical.record("refunds need no approval", kind="knowledge", confidence=0.2)
    for review in (lexical.approve, lexical.reject):
        for by in ("", "  ", "x" * 300, 7):
            with pytest.raises(ValidationError) as exc:
                review(other.id, by=by)  # type: ignore[arg-type]
            assert exc.value.field == "by"
    assert lexical.get(other.id) == other
    with pytest.raises(ValidationError) as exc:
        lexical.grant("pay", "a" * 300, write=True)
    assert exc.value.field == "agent_id" and teams.grants(lexical) == []


def test_a_review_whose_event_cannot_be_logged_is_not_stored(tmp_path: Path) -> None:
    """An approval and its ``review.approved`` event are one write: written apart, a failure between them
    stored the approval with no trace of who approved it in the log that MemLens reads."""
    with Harness.open(tmp_path / "h.db", embedder=None) as h:
        h.grant("pay", "planner", write=True)
        unsure = teams.record(
            h,
            "refunds may need three approvals",
            agent_id="planner",
            team_id="pay",
            kind="knowledge",
            confidence=0.3,
        )
        with events_refused(tmp_path / "h.db", "review.approved"), pytest.raises(StoreError):
            h.approve(unsure.id, by="lead")
        assert teams.review_state(h.get(unsure.id)) is None and h.get(unsure.id).version == unsure.version
        approved = h.approve(unsure.id, by="lead")
        [review] = [e for e in h.events(memory_id=unsure.id) if e.kind == "review.approved"]
        assert review.data == approved.metadata["review"] and review.data["by"] == "lead"


def test_retention_whose_event_cannot_be_logged_archives_nothing(tmp_path: Path) -> None:
    """A memory archived by retention and its ``retention`` event (the reason) are one write."""
    clock = ReplayClock(T0)
    with Harness.open(tmp_path / "h.db", embedder=None, clock=clock) as h:
        old = h.record("the staging cluster was slow on monday", kind=Kind.OBSERVATION)
        clock.now = T0 + timedelta(days=40)
        policy = teams.RetentionPolicy(max_age={"observation": timedelta(days=30)})
        with events_refused(tmp_path / "h.db", "retention"), pytest.raises(StoreError):
            teams.apply_retention(h, policy)
        assert h.get(old.id).status is Status.ACTIVE
        assert ids(teams.apply_retention(h, policy)) == {old.id}
        assert [e.kind for e in h.events(memory_id=old.id)] == ["add", "retention"]


def test_a_review_the_application_sets_in_another_state_is_stored_without_a_review_event(
    lexical: Harness,
) -> None:
    """Only approved, rejected and resolved have a review event: a "pending" review set by the
    application itself (or one with no status) failed the update with an unknown event kind."""
    m = lexical.record("the deploy key rotates weekly", session_id="s1")
    for review in ({"status": "pending", "by": "lead"}, {"by": "lead"}):
        updated = lexical.update(m.id, as_agent=teams.APPLICATION, metadata={"review": review})
        assert updated.metadata["review"] == review
    assert [e.kind for e in lexical.events(memory_id=m.id)] == ["add", "update", "update"]
