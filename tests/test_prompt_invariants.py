"""What a prompt may hold, checked on every context a random history builds (every engine).

A hypothesis state machine records, revises, compresses, collapses tasks, takes checkpoints and rolls back,
merges duplicates, forgets, moves the clock past TTLs (with and without ``tick()``), and builds contexts.
On every context it checks the invariants of :mod:`clawvm.vm.context`: every line is a memory that is
active and unexpired at build time; never an obsolete revision, an archived raw copy beside its summary, the
archived steps of a collapsed task, a checkpoint snapshot, or a rejected or merged-away memory; never over
budget.
"""

from __future__ import annotations

import contextlib
import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from clawvm import ClawVMError, Harness, Kind, Status
from clawvm.demo.scenario import ReplayClock
from clawvm.observe.learning import intervene
from clawvm.teams.merge import merge_team
from engines import harness_target

T0 = datetime(2026, 5, 4, 8, 0, tzinfo=UTC)
SESSIONS = ("s1", "s2")
TASKS = ("t1", "t2")
WORDS = ("deploy", "payment", "cache", "invoice", "password", "database", "retry", "lisbon")
_files = itertools.count()
STEPS = {"ran": 0, "contexts": 0}

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
LONG = (
    "The deploy of the payment service failed because the cache was cold. We retried the invoice job. "
    "Then the database migration ran for a long time, and the retry loop kept the lisbon team waiting. "
) * 3


def check_context(h: Harness, ctx_ids: list[str], tokens: int, budget: int, now: datetime) -> None:
    stored = h.store.get_many(ctx_ids)
    for i in ctx_ids:
        m = stored[i]
        assert m.status is Status.ACTIVE, f"{m.status.value} memory in the prompt: {m.content[:60]!r}"
        assert m.expires_at is None or m.expires_at > now, f"expired memory in the prompt: {m.content[:60]!r}"
        assert "raw_of" not in m.metadata, "an archived raw copy in the prompt"
        assert not (m.kind is Kind.AGENT_STATE and "checkpoint" in m.tags), (
            "a checkpoint snapshot in the prompt"
        )
    assert tokens <= budget


def make_machine(engine_name: str, directory: Path) -> type[RuleBasedStateMachine]:
    class Prompt(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ReplayClock(T0)
            target = harness_target(engine_name, directory, f"prompt{next(_files)}.db")
            self.h = Harness.open(target, embedder=None, clock=self.clock)
            self.ids: list[str] = []
            self.checkpoints: list[str] = []

        def teardown(self) -> None:
            self.h.close()

        def pick(self, n: int) -> str:
            return self.ids[n % len(self.ids)]

        def step(self) -> None:
            STEPS["ran"] += 1

        @rule(text=texts, session=st.sampled_from(SESSIONS), ttl=st.none() | st.integers(-2, 3))
        def record(self, text: str, session: str, ttl: int | None) -> None:
            self.step()
            expires = None if ttl is None else self.clock.now + timedelta(hours=ttl)
            m = self.h.record(text, session_id=session, expires_at=expires, kind=Kind.OBSERVATION)
            if ttl is not None and ttl <= 0:  # recorded already past its expiry: stored expired, never active
                assert m.status is Status.EXPIRED
            self.ids.append(m.id)

        @rule(session=st.sampled_from(SESSIONS), task=st.sampled_from(TASKS), text=texts)
        def record_step(self, session: str, task: str, text: str) -> None:
            self.step()
            m = self.h.record(f"step: {text}", session_id=session, task_id=task, state="intermediate")
            self.ids.append(m.id)

        @rule(session=st.sampled_from(SESSIONS))
        def record_long(self, session: str) -> None:
            self.step()
            self.ids.append(self.h.record(LONG, session_id=session).id)

        @precondition(lambda self: self.ids)
        @rule(n=st.integers(0, 50), text=texts)
        def revise(self, n: int, text: str) -> None:
            self.step()
            with contextlib.suppress(ClawVMError):  # not a head any more, or forgotten: nothing changed
                self.ids.append(self.h.revise(self.pick(n), content=f"revised: {text}").id)

        @precondition(lambda self: self.ids)
        @rule(n=st.integers(0, 50))
        def compress(self, n: int) -> None:
            self.step()
            with contextlib.suppress(ClawVMError):
                self.h.compress(self.pick(n))

        @rule(task=st.sampled_from(TASKS))
        def collapse(self, task: str) -> None:
            self.step()
            self.h.collapse_task(task)

        @rule(session=st.sampled_from(SESSIONS))
        def checkpoint(self, session: str) -> None:
            self.step()
            self.checkpoints.append(self.h.checkpoint(session, f"cp{len(self.checkpoints)}"))

        @precondition(lambda self: self.checkpoints)
        @rule(n=st.integers(0, 10))
        def rollback(self, n: int) -> None:
            self.step()
            self.h.rollback(self.checkpoints[n % len(self.checkpoints)])

        @rule()
        def merge(self) -> None:
            self.step()
            merge_team(self.h)

        @precondition(lambda self: self.ids)
        @rule(n=st.integers(0, 50))
        def forget(self, n: int) -> None:
            self.step()
            with contextlib.suppress(ClawVMError):
                self.h.forget(self.pick(n))

        @rule(hours=st.integers(1, 4), tick=st.booleans())
        def time_passes(self, hours: int, tick: bool) -> None:
            self.step()
            self.clock.advance(hours=hours)
            if tick:
                self.h.tick()

        @rule(
            query=texts, session=st.none() | st.sampled_from(SESSIONS), budget=st.sampled_from([60, 200, 800])
        )
        def context(self, query: str, session: str | None, budget: int) -> None:
            self.step()
            ctx = self.h.context(query, budget_tokens=budget, session_id=session)
            STEPS["contexts"] += 1
            check_context(self.h, ctx.ids, ctx.tokens, budget, self.clock.now)

        @invariant()
        def recall_and_list_hold_no_expired_memory(self) -> None:
            now = self.clock.now
            for m in self.h.list(limit=200):
                assert m.expires_at is None or m.expires_at > now
            for hit in self.h.recall(" ".join(WORDS), k=20, track=False):
                assert hit.memory.expires_at is None or hit.memory.expires_at > now

    return Prompt


def test_every_context_holds_only_what_a_prompt_may(engine_name: str, tmp_path: Path) -> None:
    STEPS.update(ran=0, contexts=0)
    run_state_machine_as_test(
        make_machine(engine_name, tmp_path),
        settings=settings(
            max_examples=25 if engine_name != "postgres" else 8,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    print(f"{engine_name}: {STEPS['ran']} state-machine steps, {STEPS['contexts']} contexts checked")


# ---- the defects, each in its minimal form --------------------------------------------------------------
def test_an_expired_neighbour_stays_out_of_the_prompt(engine_name: str, tmp_path: Path) -> None:
    """Record X, record Y that expires in an hour, move the clock 2 h, tick: Y is not in X's context."""
    clock = ReplayClock(T0)
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, clock=clock) as h:
        h.record("the deploy of the payment service is scheduled for friday", session_id="s1")
        secret = h.record(
            "temporary password hunter2, valid 1 hour", session_id="s1", expires_at=T0 + timedelta(hours=1)
        )
        clock.advance(hours=2)
        assert secret.id not in h.context("deploy payment service friday", session_id="s1").ids  # before tick
        h.tick()
        assert secret.id not in h.context("deploy payment service friday", session_id="s1").ids
        assert h.get(secret.id).status is Status.EXPIRED


def test_expiry_is_a_read_time_filter(engine_name: str, tmp_path: Path) -> None:
    clock = ReplayClock(T0)
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, clock=clock) as h:
        m = h.record("cache key rotation at noon", expires_at=T0 + timedelta(hours=1))
        assert [x.id for x in h.recall("cache key rotation")] == [m.id]
        clock.advance(hours=1)  # due now; no tick has run
        assert h.recall("cache key rotation") == [] and h.list() == [] and h.count() == 0
        assert [x.id for x in h.list(status="any")] == [m.id]  # still stored, for analytics and export
        assert h.store.get(m.id).status is Status.ACTIVE  # stored so until the sweep marks it
        assert h.get(m.id).status is Status.EXPIRED  # as reads show it
        assert h.tick()["expired"] == 1 and h.get(m.id).status is Status.EXPIRED


def test_a_read_of_expired_memories_finds_those_no_sweep_has_marked(engine_name: str, tmp_path: Path) -> None:
    """Due but not yet swept: left out of active reads, so a read of expired ones must find it (it missed
    it until a tick, and ``status="any"`` showed it active). Reads show it expired and write nothing."""
    clock = ReplayClock(T0)
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, clock=clock) as h:
        due = h.record("cache key rotation at noon", expires_at=T0 + timedelta(hours=1))
        kept = h.record("cache key rotation policy")
        logged = len(h.events())
        clock.advance(hours=1)  # no tick has run
        assert [x.id for x in h.list(status="expired")] == [due.id] and h.count(status="expired") == 1
        shown = {x.id: x.status for x in h.iter_all(status="any")}
        assert shown == {due.id: Status.EXPIRED, kept.id: Status.ACTIVE}
        hits = h.recall("cache key rotation", status="expired", track=False)
        assert [(x.id, x.memory.status) for x in hits] == [(due.id, Status.EXPIRED)]
        assert h.count(status=["archived", "expired"]) == 1 and h.count(status="archived") == 0
        assert len(h.events()) == logged and h.store.get(due.id).status is Status.ACTIVE  # stored as it was
        assert h.get(due.id).status is Status.EXPIRED
        assert h.tick()["expired"] == 1  # the sweep writes it


def test_reading_expired_memories_never_revives_them() -> None:
    """A tracked recall of expired memories promoted a due one back to the working tier (a valuable one,
    rated up); pinning, rating or moving one is refused, as for one the sweep marked."""
    clock = ReplayClock(T0)
    with Harness.open("memory://", embedder=None, clock=clock) as h:
        m = h.record("vpn token for the night shift", tier="short_term", expires_at=T0 + timedelta(hours=1))
        for _ in range(3):
            h.rate(m.id, +1)
        clock.advance(hours=2)
        assert [x.id for x in h.recall("vpn token night shift", status="expired")] == [m.id]
        h.flush()
        assert h.store.get(m.id).tier.value == "short_term"  # not promoted
        with pytest.raises(ClawVMError):
            h.rate(m.id, +1)
        with pytest.raises(ClawVMError):
            intervene(h, "set_tier", m.id, tier="working")
        assert h.store.get(m.id).tier.value == "short_term"


def test_a_record_already_past_its_expiry_is_stored_expired() -> None:
    clock = ReplayClock(T0)
    with Harness.open("memory://", embedder=None, clock=clock) as h:
        late = h.record("one-time code 4471", expires_at=T0 - timedelta(minutes=1), session_id="s1")
        assert late.status is Status.EXPIRED and late.tier.value == "archive"
        assert h.recall("one-time code") == [] and late.id not in h.context("code", session_id="s1").ids


def test_expiry_wins_over_a_pin_and_says_so() -> None:
    """A TTL is a promise to forget (a temporary credential): it ends the pin, and the event says it did."""
    clock = ReplayClock(T0)
    with Harness.open("memory://", embedder=None, clock=clock) as h:
        m = h.record("vpn token valid two hours", session_id="s1", expires_at=T0 + timedelta(hours=2))
        h.pin(m.id)
        clock.advance(hours=3)
        assert m.id not in h.context("vpn token", session_id="s1").ids  # pinned lines obey the same rules
        h.tick()
        gone = h.get(m.id)
        assert gone.status is Status.EXPIRED and not gone.pinned
        archived = [e for e in h.events(memory_id=m.id) if e.kind == "archive"]
        assert archived and "pin" in archived[-1].data["reason"]
