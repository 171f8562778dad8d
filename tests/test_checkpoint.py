"""Checkpoints and rollback, and exact session restore across processes."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clawvm
from clawvm import Filters, Harness, NotFoundError, StateConflictError, Status, Tier, ValidationError
from clawvm.core.model import utcnow
from clawvm.store.eventlog import Retention, prune
from clawvm.teams import shared as teams
from clawvm.teams.merge import merge_team
from clawvm.vm import checkpoint as checkpoints
from clawvm.vm.tiers import PagerConfig, TierBudgets
from engines import engine_of, harness_target

T0 = datetime(2030, 7, 1, 9, 0, tzinfo=UTC)
BUDGETS = TierBudgets(working_tokens=120, working_items=4, short_term_items=4, long_term_items=4)
# passes at lifecycle boundaries only: a background pass landing between the state a test reads and the
# checkpoint (or after the rollback) would change tiers behind the comparison, as the scheduler decides
CFG = PagerConfig(budgets=BUDGETS, background=False)
RESTORED = ("tier", "pinned", "status", "usage", "access_count", "last_accessed_at")


def state(h: Harness, ids: list[str]) -> dict[str, tuple[Any, ...]]:
    ms = h.store.get_many(ids)
    return {i: tuple(getattr(ms[i], f) for f in RESTORED) for i in ids}


def open_clocked(target: str = "memory://") -> tuple[Harness, list[datetime]]:
    now = [T0]
    return Harness.open(target, embedder=None, pager=CFG, preset="bm25", clock=lambda: now[0]), now


def test_rollback_restores_tiers_pins_status_and_usage() -> None:
    h, now = open_clocked()
    with h:
        old = [h.record(f"fact {i}: the invoice for Paris is {100 + i} euros", session_id="s1",
                        kind="user_input", created_at=now[0]) for i in range(4)]
        ttl = h.record("temporary session token", session_id="s1", created_at=now[0],
                       expires_at=T0 + timedelta(hours=5))
        other = h.record("another session", session_id="s2", created_at=now[0])
        ids = [m.id for m in [*old, ttl]]
        h.rate(old[1].id, +1)
        before = state(h, ids)
        cp = h.checkpoint("s1", "before the detour")
        assert h.get(cp).metadata == {"checkpoint": "before the detour", "memories": 5}

        now[0] += timedelta(hours=1)
        h.pin(old[0].id)
        h.rate(old[2].id, -1)
        h.recall("invoice Paris euros", k=2)
        h.context("invoice Paris", budget_tokens=200, session_id="s1")
        new = [h.record(f"detour step {i} with more words to push the budget", session_id="s1",
                        kind="user_input", created_at=now[0]) for i in range(6)]
        now[0] += timedelta(hours=6)
        h.tick()  # the ttl memory expires
        assert h.get(ttl.id).status is Status.EXPIRED
        changed = state(h, ids)
        assert changed != before
        assert any(changed[i][0] != before[i][0] for i in ids), "the detour should have moved tiers"

        other_before = h.get(other.id)
        report = h.rollback(cp)
        back = [i for i in ids if i != ttl.id]  # its TTL passed since: it stays expired (a promise to forget)
        assert state(h, back) == {i: before[i] for i in back}
        assert state(h, [ttl.id]) == {ttl.id: changed[ttl.id]}
        assert set(report.restored) == {i for i in back if changed[i] != before[i]}
        assert set(report.obsoleted) == {m.id for m in new}
        for m in new:
            after = h.get(m.id)  # still there, for analytics
            assert after.status is Status.OBSOLETE and not after.pinned and after.content == m.content
        assert h.get(other.id) == other_before  # another session is untouched
        ev = [e for e in h.events(limit=10**6) if e.kind == "rollback"][-1]
        assert ev.memory_id == cp and ev.data["name"] == "before the detour"
        assert set(ev.data["obsoleted"]) == {m.id for m in new}
        assert set(ev.data["restored"]) == set(report.restored)
        # the session is back within its budgets and the obsolete memories are out of recall
        assert len(h.list(session_id="s1", tier="working")) <= (BUDGETS.working_items or 0)
        assert not {m.id for m in new} & {r.id for r in h.recall("detour step", k=10)}
        # rolling back twice is harmless
        again = h.rollback(cp)
        assert again.restored == [] and again.obsoleted == []


def test_rollback_needs_a_checkpoint_id() -> None:
    h, _now = open_clocked()
    with h:
        m = h.record("plain memory", session_id="s1")
        with pytest.raises(ValidationError) as err:
            h.rollback(m.id)
        assert err.value.field == "checkpoint_id"
        with pytest.raises(NotFoundError):
            h.rollback("01900000-0000-7000-8000-000000000000")
        fake = h.record({"memories": {}}, kind="agent_state", tags=["not-a-checkpoint"], session_id="s1")
        with pytest.raises(ValidationError):
            h.rollback(fake.id)
        assert h.get(m.id).status is Status.ACTIVE


def test_a_checkpoint_has_a_name_and_its_snapshot_stays_as_taken() -> None:
    """An edit of the snapshot made the rollback fail ("is not a snapshot"); forgetting it drops the
    checkpoint, as intended."""
    h, _now = open_clocked()
    with h:
        m = h.record("plain memory", session_id="s1")
        # the REST API's rule: 5,000 characters, a NUL (PostgreSQL cannot store it) and a newline were taken
        for name in ("", "   ", None, "N" * 201, "bad\x00name", "two\nlines"):
            with pytest.raises(ValidationError) as err:
                h.checkpoint("s1", name)  # type: ignore[arg-type]
            assert err.value.field == "name"
        assert h.checkpoints("s1") == [] and h.checkpoint("s1", "N" * 200)
        h.forget(h.checkpoints("s1")[0].id)
        cp = h.checkpoint("s1", "before")
        for change in ({"content": "{}"}, {"tags": []}, {"kind": "note"}):
            with pytest.raises(StateConflictError) as conflict:
                h.update(cp, **change)
            assert "before" in conflict.value.problem
        taken = h.get(cp)
        for change_of in (lambda: h.rate(cp, 1), lambda: h.compress(cp)):  # rate bumped its version
            with pytest.raises(StateConflictError) as conflict:
                change_of()
            assert "before" in conflict.value.problem
        assert h.get(cp) == taken
        h.update(m.id, tier="archive")
        assert h.rollback(cp).restored and h.get(m.id).tier is Tier.WORKING
        h.forget(cp)
        with pytest.raises(NotFoundError):
            h.rollback(cp)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("pin"), st.integers(0, 20)),
        st.tuples(st.just("unpin"), st.integers(0, 20)),
        st.tuples(st.just("rate"), st.integers(0, 20)),
        st.tuples(st.just("recall"), st.sampled_from(["invoice", "deploy disk", "Paris euros", "step"])),
        st.tuples(st.just("context"), st.sampled_from(["invoice", "deploy disk", "Paris euros", "step"])),
        st.tuples(st.just("record"), st.sampled_from(["s1", "s2"])),
        st.tuples(st.just("tick"), st.sampled_from([1, 5, 48])),
    ),
    max_size=15,
)


def test_a_session_s_checkpoints_are_listed_newest_first() -> None:
    """There was no way to find a checkpoint's id again, save keeping the one checkpoint() returned."""
    h, now = open_clocked()
    with h:
        h.record("first step", session_id="s")
        h.record("elsewhere", session_id="other")
        before = h.checkpoint("s", "before")
        now[0] += timedelta(minutes=1)
        h.record("second step", session_id="s")
        again = h.checkpoint("s", "before")  # a name may repeat: the id tells them apart
        h.checkpoint("other", "theirs")
        listed = h.checkpoints("s")
        assert [(c.id, c.name, c.memories) for c in listed] == [(again, "before", 2), (before, "before", 1)]
        assert listed[0].taken_at == T0 + timedelta(minutes=1) and listed[0].session_id == "s"
        assert h.checkpoints("nobody") == []
        h.rollback(listed[-1].id)
        assert [c.id for c in h.checkpoints("s")] == [again, before]  # a rollback keeps them all
        with pytest.raises(ValidationError):
            h.checkpoints("")


def test_an_agents_own_state_tagged_checkpoint_is_an_ordinary_memory() -> None:
    """Kind and tag alone made it a snapshot: every change was refused, no prompt held it, and it was
    listed among the session's checkpoints."""
    h, _ = open_clocked()
    with h:
        state = h.record("planner at step 3 of 5", kind="agent_state", tags=["checkpoint"], session_id="s")
        real = h.checkpoint("s", "before")
        changed = h.update(state.id, content="planner at step 4 of 5")
        assert changed.version == state.version + 1
        assert [c.id for c in h.checkpoints("s")] == [real]
        ctx = h.context("planner step", session_id="s", record_usage=False)
        assert state.id in ctx.ids and real not in ctx.ids
        with pytest.raises(ValidationError):
            h.rollback(state.id)
        with pytest.raises(StateConflictError):  # the real snapshot still refuses changes
            h.update(real, content="edited")


@pytest.mark.parametrize("session", [None, "", "   ", 7])
def test_a_checkpoint_names_its_session(session: object) -> None:
    """checkpoint(None) snapshotted every memory of the tenant into a checkpoint rollback then refused."""
    h, _ = open_clocked()
    with h:
        h.record("a step", session_id="s")
        with pytest.raises(ValidationError) as exc:
            h.checkpoint(session, "before")  # type: ignore[arg-type]
        assert exc.value.field == "session_id"
        assert h.list(kind="agent_state", status="any") == []  # no snapshot written


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 10), ops)
def test_rollback_undoes_any_detour(n: int, detour: list[tuple[str, Any]]) -> None:
    h, now = open_clocked()
    with h:
        texts = ["the invoice for Paris is 120 euros", "deploy failed, the disk was full", "lunch at noon"]
        for i in range(n):
            h.record(f"{texts[i % 3]} ({i})", session_id="s1" if i % 3 else "s2", created_at=now[0],
                     expires_at=T0 + timedelta(hours=4) if i == 1 else None)
        s1 = [m.id for m in h.list(limit=100, status="any", session_id="s1")]
        before = state(h, s1)
        cp = h.checkpoint("s1", "cp")
        new: set[str] = set()
        for op, arg in detour:
            if op in ("pin", "unpin", "rate"):
                mid = sorted(s1)[arg % len(s1)] if s1 else None
                if mid is None:
                    continue
                with contextlib.suppress(ValidationError):
                    getattr(h, op)(mid, +1) if op == "rate" else getattr(h, op)(mid)
            elif op == "recall":
                h.recall(arg, k=3)
            elif op == "context":
                h.context(arg, budget_tokens=150, session_id="s1")
            elif op == "record":
                m = h.record(f"step {len(new)}", session_id=arg, created_at=now[0])
                if arg == "s1":
                    new.add(m.id)
            else:
                now[0] += timedelta(hours=arg)
                h.tick()
        h.page()  # the recalls' pending bookkeeping, which the rollback writes first
        planned = {m.id for m in checkpoints.would_change(h.store, cp, now[0], h.tenant)}
        report = h.rollback(cp)
        assert planned == set(report.restored) | set(report.obsoleted)  # told before, as it then did
        stored = h.store.get_many(s1)
        expired = {i for i in s1 if (at := stored[i].expires_at) is not None and at <= now[0]}
        back = [i for i in s1 if i not in expired]
        assert state(h, back) == {i: before[i] for i in back}
        assert all(stored[i].status is Status.EXPIRED for i in expired)  # a TTL passed since: it stays so
        assert set(report.obsoleted) == new
        assert all(h.get(i).status is Status.OBSOLETE for i in new)


# ---- exact restore in another process -------------------------------------------------------------------
def dump(h: Harness) -> str:
    """Everything observable about a store: memories, event log, pending embeddings, values, tiers."""
    ms = sorted(h.store.list(Filters(), limit=10**9), key=lambda m: m.id)
    events = h.events(limit=10**9)
    sessions = sorted({m.session_id for m in ms if m.session_id})
    return json.dumps(
        {
            "memories": [json.loads(m.to_json()) for m in ms],
            "events": [
                {"seq": e.seq, "kind": e.kind, "memory_id": e.memory_id, "tenant": e.tenant,
                 "at": e.at.isoformat(), "data": e.data}
                for e in events
            ],
            "unembedded": sorted(h.store.unembedded(10**6)),
            "explain": {m.id: h.explain(m.id).as_dict() for m in ms},
            "tiers": {
                s: {t.value: sorted(x.id for x in h.list(limit=10**6, session_id=s, tier=t)) for t in Tier}
                for s in sessions
            },
            "recall": [
                (r.id, round(r.score, 9)) for r in h.recall("invoice Paris deploy", k=10, track=False)
            ],
        },
        sort_keys=True,
        indent=1,
    )


RESTORE_SCRIPT = """
import sys
from datetime import datetime
sys.path.insert(0, sys.argv[1])
from clawvm import Harness
from test_checkpoint import CFG, dump
now = datetime.fromisoformat(sys.argv[3])
with Harness.open("sqlite:///" + sys.argv[2], embedder=None, pager=CFG, clock=lambda: now) as h:
    text = dump(h)
open(sys.argv[4], "w", encoding="utf-8").write(text)
"""


def test_restore_in_another_process_is_exact(tmp_path: Path, embedder: clawvm.MiniLMEmbedder) -> None:
    db = tmp_path / "state.db"
    now = [T0]
    long_text = " ".join(
        f"The {w} part of a long tool output keeps going about refunds and invoices."
        for w in ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "last")
    ) + " The total was 1240 euros."
    with Harness.open(f"sqlite:///{db}", embedder=embedder, pager=CFG, clock=lambda: now[0]) as h:
        for i in range(3):
            h.record(f"embedded fact {i}: the invoice for Paris is {100 + i} euros", session_id="s1",
                     kind="user_input", created_at=now[0])
        h.flush(timeout=60)
    with Harness.open(f"sqlite:///{db}", embedder=None, pager=CFG, clock=lambda: now[0]) as h:
        assert h.store.unembedded(10) == []
        ids = [h.record(f"s1 turn {i} about the deploy and the disk", session_id="s1", created_at=now[0]).id
               for i in range(8)]
        long_id = h.record(long_text, session_id="s2", kind="tool_result", created_at=now[0]).id
        for i in range(12):  # pushes the long tool output down to the archive, where it is compressed
            h.record(f"s2 turn {i} on lunch plans", session_id="s2", kind="note", created_at=now[0])
            h.flush()  # a pager pass: each moves the older memories one tier down
        h.pin(ids[0])
        h.rate(ids[1], +1)
        manual = h.record(long_text.replace("refunds", "payments"), session_id="s1", created_at=now[0])
        h.compress(manual.id)
        h.record("session token", session_id="s1", created_at=now[0], expires_at=T0 + timedelta(hours=1))
        for i in range(3):
            h.record(f"thinking step {i}: maybe 4096 MB", session_id="s1", task_id="t1", state="intermediate",
                     kind="llm_thought", created_at=now[0])
        h.collapse_task("t1")
        now[0] += timedelta(hours=3)
        h.tick()
        h.recall("invoice Paris", k=3)
        h.context("deploy disk", budget_tokens=300, session_id="s1")
        h.checkpoint("s1", "restore me")
        h.record("recorded last, not embedded yet", session_id="s1", created_at=now[0])
        h.page()  # the record may have made s1 due: settle that pass before the dump
        # the state has everything the restore must bring back
        everything = h.store.list(Filters(), limit=10**9)
        assert {m.tier for m in everything} == set(Tier)
        assert {m.status for m in everything} >= {Status.ACTIVE, Status.ARCHIVED, Status.EXPIRED}
        assert any(m.pinned for m in everything)
        assert "compression" in h.get(long_id).metadata and "compression" in h.get(manual.id).metadata
        assert 0 < len(h.store.unembedded(10**6)) < len(everything)
        live = dump(h)
    out = tmp_path / "restored.json"
    proc = subprocess.run(
        [sys.executable, "-c", RESTORE_SCRIPT, str(Path(__file__).parent), str(db), now[0].isoformat(),
         str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    restored = out.read_text(encoding="utf-8")
    assert restored == live
    # and the restored store carries on: a rollback of the restored checkpoint still works
    with Harness.open(f"sqlite:///{db}", embedder=None, pager=CFG, clock=lambda: now[0]) as h:
        cp = [e for e in h.events(limit=10**6) if e.kind == "checkpoint"][-1].memory_id
        assert cp is not None
        report = h.rollback(cp)
        assert len(report.obsoleted) == 1


# ---- what a rollback restores, exactly -----------------------------------------------------------------
def test_rollback_makes_a_call_pending_at_the_checkpoint_pending_again() -> None:
    h, now = open_clocked()
    with h:
        call = h.tool_call("lookup", {"q": "invoice 42"}, session_id="s1")
        call.__enter__()
        cp = h.checkpoint("s1", "while the call runs")
        now[0] = T0 + timedelta(minutes=1)
        call.__exit__(None, None, None)
        finished = h.get(call.call.id)
        assert finished.state is clawvm.State.SUCCESS and finished.metadata["tool_call"].get("result_id")
        report = h.rollback(cp)
        back = h.get(call.call.id)
        assert back.state is clawvm.State.PENDING
        assert "result_id" not in back.metadata["tool_call"]  # no pointer at the undone result
        result_id = finished.metadata["tool_call"]["result_id"]
        assert h.get(result_id).status is Status.OBSOLETE and result_id in report.obsoleted


def test_rollback_undoes_a_later_compression_and_restores_values_exactly() -> None:
    h, now = open_clocked()
    with h:
        topics = ("weather", "queue", "coffee", "train", "garden", "concert", "library", "market", "harbour")
        text = " ".join(f"We talked about the {w} and the long walk home afterwards." for w in topics * 3)
        m = h.record(text, session_id="s1")
        h.rate(m.id, 1)
        value_then = h.get(m.id).value
        cp = h.checkpoint("s1", "before")
        now[0] = T0 + timedelta(days=3)  # time passes: a recomputed value would differ
        h.rate(m.id, 1)
        compressed = h.compress(m.id)
        assert compressed.content != text
        h.rollback(cp)
        back = h.get(m.id)
        assert back.content == text and "compression" not in back.metadata
        assert back.value == value_then  # the checkpoint's number, not a recomputation at rollback time
        assert back.usage.feedback == 1


def test_a_rollback_whose_decompression_meets_another_write_plans_again() -> None:
    """Another caller changed a memory compressed since the checkpoint after the rollback planned, before
    it brought the raw text back: that write's conflict ended the rollback at once (naming an
    expected_version the caller never passed), where a conflict of the rollback's own write is planned
    again. The rollback now plans again there too, and finishes."""
    h, _ = open_clocked()
    with h:
        text = "Drain the node, migrate its shards, then verify the checksums of every copy. " * 6
        m = h.record(text, session_id="s1")
        cp = h.checkpoint("s1", "before")
        h.compress(m.id)
        raced: list[int] = []

        def another_writer(_touched: object) -> None:  # the guard runs after the plan, before any write
            if not raced:
                raced.append(h.update(m.id, tags=["theirs"]).version)

        h.rollback(cp, guard=another_writer)
        back = h.get(m.id)
        assert raced and back.content == text and "compression" not in back.metadata
        assert back.tags == ["theirs"]  # the other write is kept (tags are not what a rollback restores)


def tight(items: int, tokens: int) -> PagerConfig:
    return PagerConfig(budgets=TierBudgets(working_items=items, working_tokens=tokens), background=False)


def test_a_rollback_leaves_the_session_within_its_budgets() -> None:
    """A memory that grew since the checkpoint came back to the working tier over its budget, and no pass
    knew the session was due: it stayed over budget through flush, page and tick."""
    with Harness.open("memory://", embedder=None, pager=tight(4, 300)) as h:
        ids = [h.record(f"step {i}", session_id="s").id for i in range(4)]
        cp = h.checkpoint("s", "cp")
        h.update(ids[0], content="long text " * 200)  # ~400 tokens: paged out at once
        h.rollback(cp)
        assert h.get(ids[0]).tier is Tier.WORKING  # restored as checkpointed; the next pass pages it out
        h.flush()
        working = h.list(session_id="s", tier="working")
        assert sum(m.token_count for m in working) <= 300 and len(working) <= 4


def test_a_rollback_restores_a_pin_only_within_the_pin_budget() -> None:
    with Harness.open("memory://", embedder=None, pager=tight(3, 100)) as h:
        a = h.record("alpha", session_id="s", pinned=True)
        cp = h.checkpoint("s", "cp")
        h.unpin(a.id)
        h.update(a.id, content="word " * 150)  # grown past what the pinned may hold
        h.rollback(cp)
        assert not h.get(a.id).pinned  # pinned, no pass could page it out and every context began with it
        assert h.context("alpha", session_id="s", budget_tokens=1000).tokens <= 1000


def test_a_rollback_whose_pin_another_process_outran_stays_within_the_pin_budget(tmp_path: Path) -> None:
    """Another harness on the file pins a memory of the session after the rollback checked that its pin
    fits, before it writes: the rollback checked before its write only and left two pins where one fits.
    Its write now carries the budget: refused, the rollback plans again from what is stored."""
    target = harness_target("sqlite", tmp_path, "rollback.db")
    with (
        Harness.open(target, embedder=None, pager=tight(1, 100)) as h,
        Harness.open(target, embedder=None, pager=tight(1, 100)) as other,
    ):
        a = h.record("alpha", session_id="s", pinned=True)
        b = h.record("bravo", session_id="s")
        cp = h.checkpoint("s", "cp")
        h.unpin(a.id)
        check = h.pager.check_pin

        def outran(memory: Any, now: Any, *args: Any, **kwargs: Any) -> None:
            check(memory, now, *args, **kwargs)
            if memory.id == a.id and not other.get(b.id).pinned:
                other.pin(b.id)  # between the rollback's check and its write

        h.pager.check_pin = outran  # type: ignore[method-assign]
        h.rollback(cp)
        pinned = h.list(session_id="s", pinned=True, status="active")
        assert len(pinned) <= 1, [m.content for m in pinned]


def test_a_rollback_leaves_a_memory_older_than_the_checkpoint_that_moved_in() -> None:
    """Not in the snapshot is not "made since": a memory moved into the session after the checkpoint was
    made obsolete by the rollback."""
    with Harness.open("memory://", embedder=None) as h:
        older = h.record("the runbook for the ledger", session_id="t")
        h.record("a step of the session", session_id="s")
        cp = h.checkpoint("s", "cp")
        h.update(older.id, session_id="s")
        made_since = h.record("a step after the checkpoint", session_id="s")
        report = h.rollback(cp)
        assert report.obsoleted == [made_since.id] and h.get(older.id).status is Status.ACTIVE


def test_a_rollback_restores_pins_whatever_the_order_of_the_rows() -> None:
    """A re-pin was checked against pins the same rollback had yet to undo: of two memories, whether the
    checkpointed pin came back depended on which was older."""
    for pin_the_older in (True, False):
        with Harness.open("memory://", embedder=None, pager=tight(5, 100)) as h:
            a = h.record("alpha " * 60, session_id="s")  # 60 tokens each: one pin fits, not two
            b = h.record("bravo " * 60, session_id="s")
            kept, other = (a, b) if pin_the_older else (b, a)
            h.pin(kept.id)
            cp = h.checkpoint("s", "cp")
            h.unpin(kept.id)
            h.pin(other.id)
            report = h.rollback(cp)
            assert h.get(kept.id).pinned and not h.get(other.id).pinned, pin_the_older
            assert len(report.restored) == len(set(report.restored))


def test_a_memory_recorded_after_the_checkpoint_is_undone_whatever_its_created_at() -> None:
    """Made since is read from the event log: a created_at given by the caller (or a skewed clock) made a
    memory recorded after the checkpoint look older, and the rollback left it."""
    with Harness.open("memory://", embedder=None) as h:
        h.record("a step of the session", session_id="s")
        cp = h.checkpoint("s", "cp")
        earlier = datetime(2020, 1, 1, tzinfo=UTC)  # before the checkpoint, by any clock
        backdated = h.record("recorded later, dated earlier", session_id="s", created_at=earlier)
        assert h.rollback(cp).obsoleted == [backdated.id]


def test_a_rollback_leaves_a_memory_expired_since_expired() -> None:
    """A TTL is a promise to forget: restored, the expired memory went back to working active, and the next
    tick() expired it a second time."""
    h, now = open_clocked()
    with h:
        token = h.record("a one-hour token", session_id="s", expires_at=now[0] + timedelta(hours=1))
        cp = h.checkpoint("s", "cp")
        now[0] += timedelta(hours=2)
        assert h.tick()["expired"] == 1
        report = h.rollback(cp)
        stored = h.store.get(token.id)
        assert (stored.status, stored.tier) == (Status.EXPIRED, Tier.ARCHIVE)
        assert token.id not in report.restored
        assert h.tick()["expired"] == 0


KILLED_AT_FIRST_COMMIT = """
import os, signal, sys
from clawvm import Harness
h = Harness.open(sys.argv[1], embedder=None)
# the process dies right after the rollback's first commit
h.writer.on_commit(lambda written, deleted: os.kill(os.getpid(), signal.SIGKILL))
h.rollback(sys.argv[2])
"""


def test_a_rollback_killed_after_its_first_commit_is_whole(tmp_path: Path) -> None:
    """Each memory was written on its own and the rollback event last: a process killed part way left
    the session half rolled back, and the log said nothing of it."""
    db = tmp_path / "s.db"
    with Harness.open(db, embedder=None) as h:
        kept = [h.record(f"before {i}", session_id="s") for i in range(4)]
        cp = h.checkpoint("s", "cp")
        later = [h.record(f"after {i}", session_id="s") for i in range(6)]
        h.pin(kept[0].id)
        h.rate(kept[1].id, 1)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AT_FIRST_COMMIT, str(db), cp], capture_output=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with Harness.open(db, embedder=None) as h:
        assert {h.get(m.id).status for m in later} == {Status.OBSOLETE}
        assert not h.get(kept[0].id).pinned
        (event,) = [e for e in h.events(limit=1000) if e.kind == "rollback"]
        assert sorted(event.data["obsoleted"]) == sorted(m.id for m in later)


def test_a_memory_decompressed_since_the_checkpoint_stays_whole_and_points_at_no_raw_copy() -> None:
    """The rollback restored the compression's pointer to the raw copy on a memory that was whole again."""
    with Harness.open("memory://", embedder=None) as h:
        topics = ("weather", "queue", "coffee", "train", "garden", "concert", "library", "market", "harbour")
        text = " ".join(f"We talked about the {w} and the long walk home afterwards." for w in topics * 3)
        m = h.record(text, session_id="s1")
        raw_id = h.compress(m.id).metadata["compression"]["raw_id"]
        cp = h.checkpoint("s1", "compressed")
        h.decompress(m.id)
        h.rollback(cp)
        back = h.get(m.id)
        assert back.content == text and "compression" not in back.metadata
        assert raw_id not in [link.target for link in back.links]


@pytest.mark.parametrize("rolled_back", ["s1", "s2"])
def test_a_rollback_keeps_the_name_of_a_merge_output_that_stays_active(rolled_back: str) -> None:
    """A merge takes duplicates of two sessions into a revision of s2's. Rolling s1 back leaves that
    output active (it is s2's): s1's memory, active again, still names it (dropping the name lost where
    the memory went). Rolling s2 back obsoletes the output: s2's memory names no successor."""
    h, now = open_clocked()
    with h:
        dupes = {
            s: h.record(
                "the billing api returns amounts in cents",
                session_id=s,
                kind="observation",
                created_at=now[0],
            )
            for s in ("s1", "s2")
        }
        cp = h.checkpoint(rolled_back, "before")
        now[0] += timedelta(minutes=5)
        assert merge_team(h).merged
        output_id = h.get(dupes["s2"].id).metadata["superseded_by"]
        assert h.get(dupes["s1"].id).metadata["merged_into"] == output_id
        assert h.get(output_id).session_id == "s2"
        report = h.rollback(cp)
        after = h.get(dupes[rolled_back].id)
        assert after.status is Status.ACTIVE
        if rolled_back == "s1":
            assert output_id not in report.obsoleted and h.get(output_id).status is Status.ACTIVE
            assert after.metadata["merged_into"] == output_id
        else:
            assert output_id in report.obsoleted
            assert "superseded_by" not in after.metadata and "merged_into" not in after.metadata


def test_a_rollback_that_undoes_a_revision_and_a_merge_leaves_no_memory_claiming_a_successor(
    engine_name: str, tmp_path: Path
) -> None:
    """Revised and merged after the checkpoint, then rolled back: the old head and the merge's sources
    are active again, and none still names the revision or the merge (obsoleted by the rollback) as what
    replaced it; the chain's head is the old head again, and it can be revised."""
    h, now = open_clocked(harness_target(engine_name, tmp_path))
    with h:
        head = h.record("the ledger service uses mysql", session_id="s1", created_at=now[0])
        dupes = [h.record("the billing api returns amounts in cents", session_id="s1", kind="observation",
                          created_at=now[0]) for _ in range(2)]
        cp = h.checkpoint("s1", "before")
        now[0] += timedelta(minutes=5)
        revision = h.revise(head.id, content="the ledger service uses postgres")
        assert teams.latest(h, head.id).id == revision.id  # (a reader that walked the chain once)
        assert merge_team(h).merged
        sources = h.store.get_many([d.id for d in dupes]).values()
        assert {m.metadata.get("merged_into") for m in sources} - {None}  # one went into the other's revision
        report = h.rollback(cp)
        assert revision.id in report.obsoleted
        for m in h.store.get_many([head.id, *(d.id for d in dupes)]).values():
            assert m.status is Status.ACTIVE
            assert "superseded_by" not in m.metadata and "merged_into" not in m.metadata, m.metadata
        assert teams.latest(h, head.id).id == head.id
        assert [m.id for m in h.history(head.id)] == [head.id]
        again = h.revise(head.id, content="the ledger service uses sqlite")
        assert teams.latest(h, head.id).id == again.id
        assert h.get(head.id).metadata["superseded_by"] == again.id


# 108 tokens whole, 36 compressed (extractive)
WALKS = " ".join(
    f"We talked about the {w} and the long walk home afterwards."
    for w in ("weather", "queue", "coffee", "train", "garden", "concert", "library", "market", "harbour")
)


def pinned_tokens(h: Harness, session_id: str) -> int:
    return sum(m.token_count for m in h.list(session_id=session_id, pinned=True, tier="working", limit=100))


def test_a_rollback_brings_back_a_pinned_memorys_raw_text_only_within_the_pin_budget() -> None:
    """A pinned memory compressed since the checkpoint got its raw text back in a write that carried no
    pinned budget: with a pin taken meanwhile that the rollback keeps (a memory that moved into the session),
    the session's pins stayed over the working budget, where no pager pass can page them out. Its text comes
    back, its pin only if it fits."""
    with Harness.open("memory://", embedder=None, pager=tight(5, 150)) as h:
        m = h.record(WALKS, session_id="s", pinned=True)
        moved = h.record("the runbook for the ledger " * 10, session_id="t")  # 60 tokens
        cp = h.checkpoint("s", "cp")
        assert h.compress(m.id).token_count < 150 - 60 < m.token_count
        h.update(moved.id, session_id="s")
        h.pin(moved.id)  # fits beside the summary, not beside the raw text
        told = checkpoints.would_change(h.store, cp, h.now(), h.tenant, ignore=checkpoints.BOOKKEEPING)
        assert m.id not in {x.id for x in told}  # without the budget, its pin looks restored
        told = checkpoints.would_change(
            h.store, cp, h.now(), h.tenant, ignore=checkpoints.BOOKKEEPING, pager=h.pager
        )
        assert m.id in {x.id for x in told}  # decided as the rollback decides: its pin goes
        shown: list[str] = []
        report = h.rollback(cp, guard=lambda ms: shown.extend(x.id for x in ms))
        assert m.id in shown  # asked before anything is written
        back = h.get(m.id)
        assert back.content == WALKS and "compression" not in back.metadata
        assert not back.pinned and back.tier is Tier.WORKING and h.get(moved.id).pinned
        assert pinned_tokens(h, "s") <= 150
        assert m.id in report.restored
        (event,) = [e for e in h.events(limit=100) if e.kind == "rollback"]
        assert event.data["unpinned"] == [m.id]


@pytest.mark.parametrize("refused", [False, True])
def test_a_rollback_never_puts_the_pins_over_budget_on_its_way(refused: bool) -> None:
    """The raw text came back in a write of its own before the rollback undid a pin taken since: between the
    two writes (for good, when the rollback's guard refused after the first) the pins were over the budget.
    It now comes back in the rollback's write, which undoes that pin: the memory keeps its own."""
    with Harness.open("memory://", embedder=None, pager=tight(5, 150)) as h:
        m = h.record(WALKS, session_id="s", pinned=True)
        later = h.record("the runbook for the ledger " * 10, session_id="s")  # 60 tokens
        cp = h.checkpoint("s", "cp")
        h.compress(m.id)
        h.pin(later.id)
        seen: list[int] = []
        h.writer.on_commit(lambda _written, _deleted: seen.append(pinned_tokens(h, "s")))
        calls: list[int] = []

        def guard(_touched: Any) -> None:
            calls.append(1)
            if refused and len(calls) > 1:
                raise ValidationError("checkpoint_id", "is refused", "roll back from the harness")

        with contextlib.suppress(ValidationError):
            h.rollback(cp, guard=guard)
        assert max(seen, default=0) <= 150 and pinned_tokens(h, "s") <= 150, seen
        if not refused:
            back = h.get(m.id)
            assert back.content == WALKS and back.pinned and not h.get(later.id).pinned


def test_a_memory_older_than_the_checkpoint_whose_add_was_pruned_is_kept_by_the_rollback() -> None:
    """Retention pruned the memory's ``add``; its first event left is the later move into the session.
    That move dated it after the checkpoint, and the rollback obsoleted a memory it promises to keep."""
    with Harness.open("memory://", embedder=None) as h:
        old = h.record("a fact recorded long ago in session A", session_id="A")
        h.record("a fact of session B", session_id="B")
        prune(engine_of(h), Retention(None, 1), utcnow())  # the operator keeps the newest event only
        assert not h.events(memory_id=old.id)
        cp = h.checkpoint("B", "before the move")
        h.update(old.id, session_id="B")
        new = h.record("a fact recorded in B after the checkpoint", session_id="B")
        report = h.rollback(cp)
        assert report.obsoleted == [new.id]
        assert h.get(old.id).status is Status.ACTIVE
