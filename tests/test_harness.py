"""The Harness facade on every engine, with the real offline embedding model."""

from __future__ import annotations

import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest

import clawvm
from clawvm import (
    PRESETS,
    ClawVMError,
    ConfigError,
    ConflictError,
    EmbedderError,
    Filters,
    Harness,
    NotFoundError,
    PagerConfig,
    RecallConfig,
    State,
    StateConflictError,
    Status,
    Tier,
    TierBudgets,
    ValidationError,
)
from clawvm.core.embed import count_tokens
from clawvm.core.errors import StoreError
from clawvm.core.model import Memory, build_memory, moved_on
from clawvm.core.redact import RedactionPolicy
from clawvm.harness.facade import _raced
from clawvm.observe.learning import intervene
from clawvm.observe.lens import record_output
from clawvm.store import MemoryStore, Query, QueryResult, SQLiteStore
from clawvm.teams import shared as teams
from clawvm.vm.compress import ExtractiveSummarizer
from clawvm.vm.working import ACCESS_BUFFER
from engines import engine_of, harness_target
from refusals import events_refused

CORPUS = [
    (
        "The deploy failed because the disk on build-07 was full",
        {"kind": "error", "session_id": "s1", "tags": ["ci", "disk"]},
    ),
    ("Lunch order: two pizzas and a salad for the team", {"kind": "note", "session_id": "s2"}),
    (
        "User prefers answers in French and short bullet lists",
        {"kind": "user_input", "session_id": "s1", "tags": ["prefs"]},
    ),
    (
        "Retry the payment API call with exponential backoff",
        {"kind": "decision", "session_id": "s2", "tags": ["api"]},
    ),
]


def fill(h: Harness) -> list[clawvm.Memory]:
    return [h.record(text, **fields) for text, fields in CORPUS]


def test_a_memory_made_in_the_future_is_refused(tmp_path: Path) -> None:
    """created_at="2999-01-01" was stored, the newest memory and at full recency for good."""
    now = datetime(2026, 5, 1, 12, tzinfo=UTC)
    with Harness.open("memory://", embedder=None, clock=lambda: now) as h:
        for when in ("2999-01-01", now + timedelta(days=1, minutes=1), "2062-05-01T00:00:00Z"):
            with pytest.raises(ValidationError) as refused:
                h.record("the deploy failed", created_at=when)
            assert refused.value.field == "created_at" and "2026-05-01" in refused.value.problem
        assert h.count() == 0
        skewed = h.record("another machine's clock runs ahead", created_at=now + timedelta(hours=3))
        assert skewed.created_at == now + timedelta(hours=3)
        assert h.record("from the past", created_at="2024-02-29").created_at.year == 2024


def test_record_is_lexically_recallable_at_once(harness: Harness) -> None:
    ms = fill(harness)
    hits = harness.recall("why did the deploy fail? disk full", k=3, preset="bm25")
    assert hits[0].id == ms[0].id
    assert set(hits[0].explain) == {"lexical"}
    hybrid = harness.recall("disk on build-07", k=2)  # default preset, whatever the worker has done
    assert hybrid[0].id == ms[0].id and "lexical" in hybrid[0].explain


def test_after_flush_the_dense_channel_is_present(harness: Harness) -> None:
    ms = fill(harness)
    harness.flush(timeout=60)
    assert harness.store.unembedded(10) == []
    hits = harness.recall("which build machine ran out of storage space?", k=4)
    top = hits[0]
    assert top.id == ms[0].id
    assert {"lexical", "dense"} <= set(top.explain)
    assert 0.0 < top.explain["dense"].raw <= 1.0 and top.explain["dense"].rank == 1
    # a paraphrase with no word in common is found by the dense channel alone
    para = harness.recall("meal for the staff", k=1, preset="dense")
    assert para[0].id == ms[1].id and set(para[0].explain) == {"dense"}


def test_recall_filters_and_default_status(harness: Harness) -> None:
    ms = fill(harness)
    other_tenant = harness.record("the deploy failed again in another tenant", tenant="acme")
    q = "deploy disk pizzas French payment"
    ids = lambda hits: {h.id for h in hits}  # noqa: E731
    assert ids(harness.recall(q, k=10, preset="bm25")) == {m.id for m in ms}
    assert ids(harness.recall(q, k=10, preset="bm25", session_id="s1")) == {ms[0].id, ms[2].id}
    assert ids(harness.recall(q, k=10, preset="bm25", kind=["note", "decision"])) == {ms[1].id, ms[3].id}
    assert ids(harness.recall(q, k=10, preset="bm25", tags=["ci"])) == {ms[0].id}
    assert ids(harness.recall(q, k=10, preset="bm25", tags_any=["api", "prefs"])) == {ms[2].id, ms[3].id}
    assert ids(harness.recall(q, k=10, preset="bm25", tenant="acme")) == {other_tenant.id}
    assert len(harness.recall(q, k=2, preset="bm25")) == 2

    harness.update(ms[0].id, status="archived")
    assert ms[0].id not in ids(harness.recall(q, k=10, preset="bm25"))
    assert ms[0].id in ids(harness.recall(q, k=10, preset="bm25", status="any"))
    assert ids(harness.recall(q, k=10, preset="bm25", status="archived")) == {ms[0].id}
    assert harness.count() == 3 and harness.count(status="any") == 4
    assert [m.id for m in harness.list(session_id="s2")] == [ms[3].id, ms[1].id]
    with pytest.raises(ValidationError) as exc:
        harness.recall(q, sesion_id="s1")
    assert exc.value.field == "sesion_id"


def test_recall_argument_validation(harness: Harness) -> None:
    with pytest.raises(ValidationError) as exc:
        harness.recall(b"bytes query", k=3)  # type: ignore[arg-type]
    assert exc.value.field == "query"
    with pytest.raises(ValidationError) as exc:
        harness.recall("x", k=0)
    assert exc.value.field == "k"
    assert harness.recall("nothing stored yet") == []


def test_counts_and_flags_are_checked_at_the_harness_boundary(harness: Harness) -> None:
    """A negative limit sliced results silently, a text or zero one raised raw TypeError / IndexError, and
    feedback(id, 1000) added 1000 to the adoption counts. Each names its field now, and nothing changes."""
    ms = [harness.record(f"note {i} about the payments host", session_id="s") for i in range(3)]
    calls = {
        "limit": [lambda v: harness.list(limit=v, session_id="s"), lambda v: harness.events(limit=v)],
        "batch": [lambda v: list(harness.iter_all(batch=v))],
        "k": [lambda v: harness.recall("payments", k=v)],
        "budget_tokens": [lambda v: harness.context("payments", budget_tokens=v)],
    }
    for field, tries in calls.items():
        for call in tries:
            for bad in (-1, True, "5", 2.0) if field == "limit" else (-1, 0, True, "5", 2.0):
                with pytest.raises(ValidationError) as exc:
                    call(bad)
                assert exc.value.field == field, (field, bad)
    assert harness.list(limit=0) == [] and harness.events(limit=0) == []  # none asked, none given
    assert len(harness.list(limit=np.int64(2), session_id="s")) == 2  # any integer type
    for bad_seq in (-1, "a", False):
        with pytest.raises(ValidationError) as exc:
            harness.events(after_seq=bad_seq)
        assert exc.value.field == "after_seq"
    with pytest.raises(ValidationError) as exc:
        harness.context(5)  # type: ignore[arg-type]
    assert exc.value.field == "query"
    for adopted in ("yes", 1000, 1, None):
        with pytest.raises(ValidationError) as exc:
            harness.feedback(ms[0].id, adopted)  # type: ignore[arg-type]
        assert exc.value.field == "adopted"
    with pytest.raises(ValidationError) as exc:
        harness.import_memories([{"content": "x"}])  # type: ignore[list-item]
    assert exc.value.field == "memories.0"
    assert harness.get(ms[0].id) == ms[0] and harness.count(session_id="s") == 3
    assert [m.id for m in harness.list(limit=2, session_id="s")] == [ms[2].id, ms[1].id]


def test_the_harness_bookkeeping_never_makes_an_update_conflict(harness: Harness) -> None:
    """An access (a tracked recall), a promotion or a page-out is the harness's own bookkeeping: it makes a
    new version, but an update expecting the version read before it still goes ahead. Any other write in
    between (a pin here) is a change the caller has not seen: a conflict."""
    m = harness.record("the cache hit rate dropped to ten percent", session_id="s1")
    assert [h.id for h in harness.recall("cache hit rate", preset="bm25")] == [m.id]
    harness.flush()  # the pager pass writes the access
    accessed = harness.get(m.id)
    assert accessed.access_count == 1 and accessed.version == 2 and accessed.changed_version == 1
    u = harness.update(m.id, expected_version=m.version, state="success")
    assert u.version == 3 and u.changed_version is None and u.state is State.SUCCESS
    with pytest.raises(ConflictError):  # the update is a change: version 1 is stale now
        harness.update(m.id, expected_version=m.version, state="error")
    harness.recall("cache hit rate", preset="bm25")
    harness.flush()
    assert harness.update(m.id, expected_version=u.version, content="the rate recovered").version == 5
    before_context = harness.get(m.id)
    harness.context("cache hit rate", budget_tokens=200, session_id="s1")  # injected: bookkeeping too
    assert harness.get(m.id).version > before_context.version
    assert harness.update(m.id, expected_version=before_context.version, state="success")
    pinned = harness.pin(m.id)
    with pytest.raises(ConflictError):
        harness.update(m.id, expected_version=pinned.version - 1, state="error")
    with pytest.raises(ValidationError) as exc:
        harness.update(m.id, changed_version=1)
    assert exc.value.field == "changed_version"
    for wrong in ("1", 0, -1, True, 1.0):
        with pytest.raises(ValidationError) as exc:
            harness.update(m.id, expected_version=wrong, state="error")
        assert exc.value.field == "expected_version"


def test_page_outs_and_promotions_never_make_an_update_conflict() -> None:
    pager = PagerConfig(budgets=TierBudgets(working_items=2), background=False)
    with Harness.open("memory://", embedder=None, preset="bm25", pager=pager) as h:
        first = h.record("the deploy of build 7 failed on the disk check", session_id="s1")
        for i in range(3):
            h.record(f"coffee chat {i}", session_id="s1")
        h.page()
        paged = h.get(first.id)
        assert paged.tier is not Tier.WORKING and paged.version > first.version
        h.recall("deploy build disk check", k=1)
        h.page()
        promoted = h.get(first.id)
        assert promoted.tier is Tier.WORKING and promoted.version > paged.version
        assert promoted.changed_version == first.version
        updated = h.update(first.id, expected_version=first.version, state="error")
        assert updated.version == promoted.version + 1


class _RacedAfterRead(SQLiteStore):
    """A SQLite store that runs ``race`` once, right after its next read once armed: what another process
    writes between a caller's read and its write."""

    race: Callable[[], object] | None = None

    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        found = super().get_many(ids)
        race, self.race = self.race, None
        if race is not None:
            race()
        return found


def _raced_pair(path: Path, **options: Any) -> tuple[Harness, _RacedAfterRead, Harness]:
    """A harness on a :class:`_RacedAfterRead` store, and another on the same file that races it."""
    store = _RacedAfterRead(path)
    pager = PagerConfig(background=False, **options)
    racer = Harness.open(path, embedder=None, preset="bm25", pager=PagerConfig(background=False))
    return Harness.open(store, embedder=None, preset="bm25", pager=pager), store, racer


@pytest.mark.parametrize("call", ["compress", "decompress"])
def test_a_compression_that_another_process_beat_to_the_memory_is_done_again(
    tmp_path: Path, call: str
) -> None:
    """Another process's write lands between compress()'s (or decompress()'s) read and its write: the
    caller got a ConflictError naming expected_version, which neither takes, and nothing was compressed.
    It is done again on the memory as it is now."""
    h, store, other = _raced_pair(tmp_path / "raced.db")
    with h, other:
        text = "Drain the node, migrate its shards, then verify the checksums of every copy. " * 6
        m = h.record(text, session_id="s1")
        if call == "decompress":
            h.compress(m.id)

        def their_write() -> None:
            other.update(m.id, tags=["theirs"])

        # armed at the call's first read, it writes after the second (compress reads before summarizing,
        # then in its turn): between the last read and the write either way
        store.race = lambda: setattr(store, "race", their_write)
        done = h.compress(m.id) if call == "compress" else h.decompress(m.id)
        assert done.tags == ["theirs"] and ("compression" in done.metadata) == (call == "compress")
        assert (done.content == text) == (call == "decompress")


def test_a_compression_that_keeps_losing_races_names_the_memory_and_offers_no_version(tmp_path: Path) -> None:
    """Past its tries, compress() fails naming the memory; its fix offered an expected_version, which
    compress does not take."""
    h, store, other = _raced_pair(tmp_path / "raced.db")
    with h, other:
        m = h.record("Drain the node, migrate its shards, then verify the checksums of every copy. " * 6)
        tries = iter(range(100))

        def race() -> None:
            other.update(m.id, tags=[f"theirs-{next(tries)}"])
            store.race = race  # after every read, again

        store.race = race
        with pytest.raises(ConflictError) as exc:
            h.compress(m.id)
        store.race = None
        assert exc.value.field == "memory_id" and "retry the compress" in exc.value.fix
        assert "expected_version" not in exc.value.fix and "compression" not in h.get(m.id).metadata


class _CountingSummarizer(ExtractiveSummarizer):
    """The extractive summarizer, counting the texts it is asked to summarize (an LLM's would each cost)."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def summarize(self, text: str, max_chars: int) -> str:
        self.texts.append(text)
        return super().summarize(text, max_chars)


def test_a_compression_tried_again_summarizes_a_text_once(tmp_path: Path) -> None:
    """compress() tried again after another writer's change summarized the text again on every try once
    its content had changed once, inside the harness's turn (an LLM summarizer's wait on each): a text is
    summarized once, however often the tries meet another writer's bookkeeping."""
    path = tmp_path / "raced.db"
    store, counting = _RacedAfterRead(path), _CountingSummarizer()
    pager = PagerConfig(background=False)
    with (
        Harness.open(store, embedder=None, pager=pager, summarizer=counting) as h,
        Harness.open(path, embedder=None, pager=pager) as other,
    ):
        first = "Drain the node, migrate its shards, then verify the checksums of every copy. " * 6
        m = h.record(first, session_id="s1")
        second = first.replace("Drain", "Cordon")
        races = iter(
            [lambda: other.update(m.id, content=second)]
            + [(lambda n=n: other.update(m.id, tags=[f"theirs-{n}"])) for n in range(3)]
        )

        def next_race() -> None:  # after each read: the content once, then the tags at each try
            race = next(races, None)
            if race is not None:
                race()
                store.race = next_race

        store.race = next_race
        done = h.compress(m.id)
        assert "compression" in done.metadata and done.tags == ["theirs-2"]
        assert counting.texts == [first, second]


def test_a_change_that_changes_nothing_writes_nothing(harness: Harness) -> None:
    """update() with no field, or with the stored values, and pin() of a pinned memory each made a new
    version: whoever held the memory's version got a ConflictError for nothing."""
    h = harness
    m = h.record("the deploy runs at noon", session_id="s1", tags=["ops"])
    logged = len(h.events(memory_id=m.id))
    for same in ({}, {"content": m.content}, {"tags": ["ops"]}, {"session_id": "s1", "state": m.state}):
        assert h.update(m.id, expected_version=m.version, **same).version == m.version, same
    assert h.unpin(m.id).version == m.version  # not pinned: nothing to undo
    pinned = h.pin(m.id)
    assert pinned.version == m.version + 1 and h.pin(m.id).version == pinned.version
    assert len(h.events(memory_id=m.id)) == logged + 1  # the one pin
    assert h.update(m.id, expected_version=pinned.version, content="at one").version == pinned.version + 1


@pytest.mark.parametrize("between", ["bookkeeping", "change"])
def test_an_update_goes_past_bookkeeping_written_between_its_read_and_its_write(
    tmp_path: Path, between: str
) -> None:
    """Another process's tracked recall lands between an update's read and its write: the update is redone
    on the memory as it is now (the access kept), whether or not the caller passed an expected version. A
    real change there (another caller's update) still fails it, and nothing of it is written."""
    h, store, other = _raced_pair(tmp_path / "raced.db")
    with h, other:
        m = h.record("the cache hit rate dropped to ten percent", session_id="s1")
        for expect in (False, True):
            before = h.get(m.id)
            expected = before.version if expect else None
            if between == "bookkeeping":
                store.race = lambda: (other.recall("cache hit rate"), other.flush())
                state = State.ERROR if expect else State.SUCCESS  # a change each time (no change: no write)
                u = h.update(m.id, expected_version=expected, state=state)
                assert u.version == before.version + 2 and u.state is state
                assert u.access_count == before.access_count + 1 and u.changed_version is None
            else:
                theirs = [f"theirs-{expect}"]  # a change each time
                store.race = lambda theirs=theirs: other.update(m.id, tags=theirs)
                with pytest.raises(ConflictError):
                    h.update(m.id, expected_version=expected, state="success")
                now = h.get(m.id)
                assert now.tags == theirs and now.state is not State.SUCCESS
                assert now.version == before.version + 1


def test_an_update_that_loses_a_race_says_what_happened_not_a_version_never_passed(tmp_path: Path) -> None:
    """Another writer's change landing between an update's read and its write failed it with "is at version
    2, not 1", naming expected_version, when the caller passed none: it names the memory and says to retry.
    With an expected version, the conflict is of the version the caller passed, not of the harness's read
    (the memory read at version 2 after bookkeeping, the caller's 1 was named 2)."""
    h, store, other = _raced_pair(tmp_path / "raced.db")
    with h, other:
        m = h.record("the cache hit rate dropped to ten percent", session_id="s1")
        store.race = lambda: other.update(m.id, tags=["theirs"])
        with pytest.raises(ConflictError) as exc:
            h.update(m.id, state="success")
        assert exc.value.field == "memory_id" and exc.value.expected is None and exc.value.actual == 2
        assert "changed while this update was being written" in exc.value.problem
        assert "version 2, not" not in exc.value.problem and "retry the update" in exc.value.fix
        assert h.get(m.id).state is not State.SUCCESS
        assert h.update(m.id, state="success").version == 3  # the retry the fix names
        h.recall("cache hit rate")
        h.flush()  # bookkeeping: version 4, and an update expecting 3 still goes ahead
        assert h.get(m.id).version == 4
        store.race = lambda: other.update(m.id, tags=["theirs again"])
        with pytest.raises(ConflictError) as exc:
            h.update(m.id, expected_version=3, state="error")
        assert exc.value.field == "expected_version" and (exc.value.expected, exc.value.actual) == (3, 5)
        assert "is at version 5, not 3" in exc.value.problem


def test_a_forget_that_keeps_losing_races_names_the_memory_when_no_version_was_passed(tmp_path: Path) -> None:
    """A forget without expected_version whose memory kept changing under each try failed naming
    expected_version (of the harness's own read)."""
    h, store, other = _raced_pair(tmp_path / "raced.db")
    with h, other:
        m = h.record("the runbook", session_id="s1")
        tries = iter(range(100))

        def race() -> None:
            other.update(m.id, tags=[f"theirs-{next(tries)}"])
            store.race = race  # each read, again

        store.race = race
        with pytest.raises(ConflictError) as exc:
            h.forget(m.id)
        store.race = None
        assert exc.value.field == "memory_id" and exc.value.expected is None
        assert "changed while this forget was being written" in exc.value.problem
        assert "retry the forget" in exc.value.fix and "expected_version" in exc.value.fix
        assert h.get(m.id).tags[0].startswith("theirs")


@pytest.mark.parametrize("expected_version", [None, 2])
def test_a_conflict_on_a_raw_copy_is_said_of_the_raw_copy(expected_version: int | None) -> None:
    """A forget deletes a memory with its raw copies: a conflict on a raw copy was reported as the memory's
    own, with the raw copy's version ("is at version 7, not 2")."""
    on_raw_copy = ConflictError("raw-1", 6, 7)  # as the store raises it: the version the forget read
    said = _raced(on_raw_copy, "memory-1", expected_version, "forget")
    assert said.field == "memory_id" and said.ident == "memory-1"
    assert "'raw-1'" in said.problem and "version 7" not in said.problem and "retry the forget" in said.fix


def test_retries_that_run_out_name_the_memory_not_a_version_never_passed() -> None:
    """A pin's or a revise_with_retry's tries, each lost to another writer, ran out with "memory ... is at
    version None, not 3", naming expected_version, which neither takes."""
    with Harness.open("memory://", embedder=None, pager=PagerConfig(background=False)) as h:
        m = h.record("the ledger uses mysql", session_id="s1")

        def theirs(head: Memory) -> dict[str, Any]:
            h.update(head.id, tags=[f"v{head.version}"])  # another writer, first
            return {"content": f"the ledger uses postgres {head.version}"}

        with pytest.raises(ConflictError) as exc:
            teams.revise_with_retry(h, m.id, theirs, attempts=1)
        assert exc.value.field == "memory_id" and "version None" not in exc.value.problem
        assert exc.value.actual == h.get(m.id).version

        def lost(cur: Memory) -> dict[str, Any]:
            theirs(cur)
            return {"state": "success"}

        with pytest.raises(ConflictError) as exc:
            h.pager.mutate(h.get(m.id), lost, h.now())
        assert exc.value.field == "memory_id" and exc.value.expected is None
        assert "version None" not in exc.value.problem and exc.value.fix.startswith("retry")


def test_a_revision_goes_past_bookkeeping_written_between_its_read_and_its_write(tmp_path: Path) -> None:
    h, store, other = _raced_pair(tmp_path / "raced.db")
    with h, other:
        m = h.record("the ledger uses mysql", session_id="s1")
        store.race = lambda: (other.recall("ledger mysql"), other.flush())
        head = h.revise(m.id, expected_version=m.version, content="the ledger uses postgres")
        assert head.content == "the ledger uses postgres" and h.get(m.id).access_count == 1


def test_a_recall_writing_its_own_bookkeeping_leaves_a_manual_move_made_since_its_read(
    tmp_path: Path,
) -> None:
    """With ``defer_access=False`` the recall writes its hits' accesses itself: a person's move of a hit
    (the dashboard's set tier) made after the recall read it is not undone by a promotion."""
    h, store, other = _raced_pair(tmp_path / "raced.db", defer_access=False, promote_value=0.0)
    with h, other:
        m = h.record("the cache hit rate dropped to ten percent", session_id="s1")
        h.pager.move(h.get(m.id), Tier.SHORT_TERM, "paged out", h.now(), bookkeeping=True)
        store.race = lambda: intervene(other, "set_tier", m.id, tier="long_term")
        [hit] = h.recall("cache hit rate", k=1)
        now = h.get(m.id)
        assert now.tier is Tier.LONG_TERM and now.access_count == 1
        assert hit.memory.tier is Tier.LONG_TERM
        h.recall("cache hit rate", k=1)  # a recall made after the move may promote it
        assert h.get(m.id).tier is Tier.WORKING


def test_citations_and_preloads_are_bookkeeping(harness: Harness) -> None:
    """A citation's credit (``record_output``) and a session's preload are the harness's own writes: an
    update expecting the version read before them goes ahead."""
    m = harness.record("the deploy failed because the disk was full", session_id="s1")
    ctx = harness.context("why did the deploy fail", budget_tokens=300, session_id="s1")
    with pytest.raises(ValidationError) as exc:
        record_output(harness, ctx, "It failed", success="yes")  # type: ignore[arg-type]
    assert exc.value.field == "success" and harness.get(m.id).usage.cited == 0
    record_output(harness, ctx, f"It failed: the disk was full [{ctx.manifest[0].short_id}]", success=True)
    credited = harness.get(m.id)
    assert credited.usage.cited == 1 and credited.version > m.version
    assert harness.update(m.id, expected_version=m.version, state="error").state is State.ERROR
    now = harness.now()
    paged = harness.pager.move(harness.get(m.id), Tier.LONG_TERM, "paged out", now, bookkeeping=True)
    harness.start_session("s2", "deploy disk full")
    assert harness.get(m.id).tier is Tier.WORKING
    assert harness.update(m.id, expected_version=paged.version, state="success").state is State.SUCCESS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_count", 5000),
        ("content_type", "application/json"),
        ("value", 0.9),
        ("pinned", True),
        ("access_count", 7),
        ("usage", {"cited": 3}),
    ],
)
def test_an_update_refuses_what_the_harness_sets(harness: Harness, field: str, value: Any) -> None:
    """A token count of 5000 kept a memory out of every prompt; a value or a pin set this way skipped the
    scorer and the pinned budget. Each is refused, naming what sets it, and nothing is written."""
    m = harness.record("alpha beta gamma delta", session_id="s")
    with pytest.raises(ValidationError) as exc:
        harness.update(m.id, **{field: value})
    assert exc.value.field == field and exc.value.problem == "is set by the harness" and exc.value.fix
    assert harness.get(m.id) == m


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_count", 5000),
        ("content_type", "application/json"),
        ("value", 0.99),
        ("access_count", 100),
        ("last_accessed_at", "2026-01-01T00:00:00Z"),
        ("usage", {"cited": 50, "successes": 50}),
        ("version", 3),
    ],
)
def test_a_record_refuses_what_the_harness_sets(harness: Harness, field: str, value: Any) -> None:
    """record(access_count=100, usage={...}) stored them (a value inflated from its first moment), and
    record(value=0.99) dropped the value without a word; as update() does, each is refused now."""
    before = harness.count(status="any")
    with pytest.raises(ValidationError) as exc:
        harness.record("plain note", **{field: value})
    assert exc.value.field == field and exc.value.problem == "is set by the harness" and exc.value.fix
    assert harness.count(status="any") == before
    assert harness.record("plain note", pinned=True, session_id="s").pinned  # pinning at record stays


@pytest.mark.parametrize("field", ["session_id", "task_id", "agent_id", "tool_name"])
def test_a_blank_scope_id_is_no_scope(harness: Harness, field: str) -> None:
    """session_id="" made a session that no listing or count showed: blank is stored as None (no
    session), at record and at update; a replay copying an older blank-scoped memory still records it."""
    m = harness.record("x", **{field: ""})
    assert getattr(harness.get(m.id), field) is None
    n = harness.record("y", session_id="s", task_id="t", agent_id="a", tool_name="grep")
    assert getattr(harness.update(n.id, **{field: "  "}), field) is None


def test_content_of_only_invisible_characters_is_refused_as_blank() -> None:
    """A zero-width space is not whitespace to str.strip: such a memory was stored, an empty line in
    prompts; the same characters inside visible text stay as written."""
    with Harness.open("memory://", embedder=None) as h:
        for blank in ["\u200b", " \ufeff\u200c ", "\u2060\n\u200d"]:
            with pytest.raises(ValidationError) as exc:
                h.record(blank)
            assert exc.value.field == "content"
        kept = h.record("zero\u200bwidth")
        assert h.get(kept.id).content == "zero\u200bwidth" and h.count() == 1


def test_imported_content_is_checked_as_recorded_content() -> None:
    """A blank memory was imported and reached prompts as an empty line; unparsable JSON content made every
    content_json() and, in a redacting store, the import itself raise a raw JSONDecodeError."""
    with pytest.raises(pydantic.ValidationError, match="content"):
        Memory(content="   ")
    with pytest.raises(pydantic.ValidationError, match="content"):
        Memory(content="\u200b\u2060 \u200d")  # invisible: nothing a prompt shows
    labelled = Memory(content="not json { mail alice@example.com", content_type="application/json")
    with Harness.open("memory://", embedder=None, redaction=RedactionPolicy()) as h:
        assert h.import_memories([labelled]) == 1
        stored = h.get(labelled.id)
        assert "alice@example.com" not in stored.content  # scrubbed as text
        with pytest.raises(ValidationError) as exc:
            stored.content_json()
        assert exc.value.field == "content"


def test_an_import_takes_any_iterable_of_memories() -> None:
    """A generator was used up by the checks: the import wrote nothing and said 0."""
    with Harness.open("memory://", embedder=None) as h:
        assert h.import_memories(Memory(content=f"memory {i}") for i in range(3)) == 3  # type: ignore[arg-type]
        assert h.count() == 3


def test_a_restored_backup_is_the_store_as_it_was(tmp_path: Path) -> None:
    """Every field comes back: the version of a memory's last change (a caller's ``expected_version``
    still holds after the restore) and the token counts of the harness's own records."""
    with Harness.open(tmp_path / "a.db", embedder=None, pager=PagerConfig(defer_access=False)) as h:
        h.grant("docs", "writer", write=True)
        a = h.record("alpha release notes", session_id="s")
        h.checkpoint("s", "before the release")
        h.recall("alpha", k=1)  # bookkeeping: a new version, not a change
        backup = [Memory.from_json(m.to_json()) for m in h.store.iter_all(Filters())]
        assert (h.get(a.id).version, h.get(a.id).changed_version) == (2, 1)
    with Harness.open(tmp_path / "b.db", embedder=None) as restored:
        assert restored.import_memories(backup, restore=True) == len(backup)
        assert list(restored.store.iter_all(Filters())) == backup
        restored.update(a.id, expected_version=1, content="alpha release notes, edited")
        uploaded = backup[-1].model_copy(update={"id": str(uuid.uuid4()), "token_count": 0})
        restored.import_memories([uploaded])  # not a restore: a write, counted as the harness counts
        assert restored.get(uploaded.id).token_count == count_tokens(uploaded.content) > 0


def test_an_import_refuses_a_parent_neither_in_it_nor_stored() -> None:
    """record() refuses a dangling parent_id; an import stored it, and the run trace lost its children."""
    with Harness.open("memory://", embedder=None) as h:
        parent = Memory(content="the failed deploy", session_id="s")
        child = Memory(content="the retry", session_id="s", parent_id=parent.id)
        orphan = Memory(content="a step of nothing", session_id="s", parent_id=Memory(content="x").id)
        assert h.import_memories([parent, child]) == 2  # its parent in the same import
        with pytest.raises(StateConflictError) as refused:
            h.import_memories([orphan])
        assert refused.value.field == "memories.0.parent_id" and h.count() == 2


def test_a_restore_from_an_edited_file_holds_to_the_budgets() -> None:
    """A restore trusted the file: a memory whose token count was edited down filled a context five times
    over its budget, and a pinned memory in the archive was stored so."""
    with Harness.open("memory://", embedder=None) as h:
        long = h.record("alpha " * 300, session_id="z")
        pinned = h.record("beta", session_id="z")
        h.pin(pinned.id)
        backup = [Memory.from_json(m.to_json()) for m in h.store.iter_all(Filters())]
    edited = [m.model_copy(update={"token_count": 1}) if m.id == long.id else m for m in backup]
    with Harness.open("memory://", embedder=None) as restored:
        restored.import_memories(edited, restore=True)
        assert restored.get(long.id).token_count == count_tokens(long.content)
        ctx = restored.context("alpha", session_id="z", budget_tokens=100)
        assert count_tokens(ctx.text) <= 100
    archived = [m.model_copy(update={"tier": Tier.ARCHIVE}) if m.id == pinned.id else m for m in backup]
    with Harness.open("memory://", embedder=None) as restored, pytest.raises(ValidationError) as refused:
        restored.import_memories(archived, restore=True)
    assert refused.value.field.endswith(".pinned")
    # a pin is checked at the harness's count of its text, not the file's
    grown = [
        m.model_copy(update={"content": "beta " * 300, "token_count": 1}) if m.id == pinned.id else m
        for m in backup
        if m.id != long.id
    ]
    small = PagerConfig(budgets=TierBudgets(working_tokens=100))
    for restore in (True, False):
        with Harness.open("memory://", embedder=None, pager=small) as restored, pytest.raises(ClawVMError):
            restored.import_memories(grown, restore=restore)


def test_an_import_into_a_redacting_store_twice_reports_nothing_differing() -> None:
    """The stored text is the scrubbed one: compared with the file's original, every redacted memory was
    reported as differing (and the CLI told the user to forget it)."""
    with Harness.open("memory://", embedder=None) as source:
        exported = source.get(source.record("mail alice@example.com about the refund", session_id="s").id)
    with Harness.open("memory://", embedder=None, redaction=RedactionPolicy()) as h:
        assert h.import_renamed([exported]).imported == 1
        assert "alice@example.com" not in h.get(exported.id).content
        assert h.import_renamed([exported]).differing == []
        edited = exported.model_copy(update={"content": "mail bob about the refund"})
        assert h.import_renamed([edited]).differing == [exported.id]


def test_a_memory_imported_at_the_count_limit_stays_readable_and_the_harness_works(tmp_path: Path) -> None:
    """Imported at version 2^53-1, a memory's next bookkeeping write stored 2^53, which no read could
    parse (the API's tick answered 500 from then on). A caller's change of it is refused now, and the
    harness's bookkeeping leaves it as it is while writing the rest of its batch."""
    from clawvm.core.model import MAX_COUNT

    h = Harness.open(tmp_path / "limit.db", embedder=None)
    other = h.record("the limit of versions", session_id="s")
    at_limit = h.get(other.id).model_copy(
        update={
            "id": "01a00000-0000-7000-8000-00000000abcd",
            "version": MAX_COUNT,
            "content": "versions at the limit",
        }
    )
    h.import_memories([at_limit])
    assert {r.memory.id for r in h.recall("versions limit", k=3)} == {other.id, at_limit.id}
    h.page()  # the recall's accesses: written for one, kept as they were for the other
    assert "versions at the limit" in h.context("versions limit", session_id="s").text
    h.tick()
    with pytest.raises(ValidationError) as exc:
        h.update(at_limit.id, state="success")
    assert exc.value.field == "version"
    assert h.get(other.id).access_count >= 1 and h.get(at_limit.id).version == MAX_COUNT
    h.close()
    with Harness.open(tmp_path / "limit.db", embedder=None) as again:
        assert again.get(at_limit.id).version == MAX_COUNT and again.count() == 2


def test_a_dense_only_recall_without_an_embedder_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Without an embedder, preset="dense" found nothing, always, without a word. It still finds nothing (a
    server's recall answers an empty list, as its schema allows) but says why, once."""
    with Harness.open("memory://", embedder=None) as h, caplog.at_level("WARNING", "clawvm.harness"):
        h.record("the deploy failed on build-07")
        assert h.recall("deploy", preset="dense") == [] and h.recall("deploy", preset="dense") == []
        said = [r.getMessage() for r in caplog.records if "embedding only" in r.getMessage()]
        assert len(said) == 1 and "no embedder" in said[0]
        found = h.recall("deploy", preset="bm25")
        assert [r.memory.content for r in found] == ["the deploy failed on build-07"]


def test_a_record_with_a_stored_id_says_the_id_exists(harness: Harness) -> None:
    """It said "is at version 1, not 0: re-read it and retry the update" of what was a create."""
    first = harness.record("alpha", session_id="s")
    with pytest.raises(ConflictError) as exc:
        harness.record("beta", id=first.id, session_id="s")
    assert str(exc.value).startswith("id: memory") and "exists already" in str(exc.value)
    assert exc.value.field == "id" and "leave id out" in exc.value.fix  # not expected_version: none was sent
    assert harness.get(first.id) == first and harness.count(status="any") == 1


def test_an_obsolete_revision_stays_as_it_was_replaced(harness: Harness) -> None:
    """Reviving or editing a revision that a later one replaced would give its chain two heads."""
    d = harness.record("refund limit 500 EUR", kind="decision", session_id="s")
    head = harness.revise(d.id, content="refund limit 800 EUR")
    old = harness.get(d.id)
    for change in ({"status": "active"}, {"content": "refund limit 900 EUR"}):
        with pytest.raises(StateConflictError) as exc:
            harness.update(d.id, **change)
        assert exc.value.field == "memory_id" and f"replaced by {head.id}" in exc.value.problem
    assert harness.get(d.id) == old
    assert [m.id for m in harness.history(head.id)] == [d.id, head.id]
    with pytest.raises(ConflictError, match=re.escape(f"the head is '{head.id}'")):
        harness.revise(d.id, content="refund limit 900 EUR")


@pytest.mark.parametrize(("field", "value"), [("tier", "archive"), ("status", "archived")])
def test_a_pinned_record_is_working_and_active(harness: Harness, field: str, value: str) -> None:
    with pytest.raises(ValidationError) as exc:
        harness.record("keep this in every prompt", session_id="s", pinned=True, **{field: value})
    assert exc.value.field == field and "pinned" in exc.value.problem
    assert harness.count(session_id="s", status="any") == 0
    pinned = harness.record("keep this in every prompt", session_id="s", pinned=True, tier="working")
    assert pinned.pinned and pinned.tier is Tier.WORKING


class _FailingWrites(SQLiteStore):
    """A SQLite store whose writes of memories fail while ``failing`` (a locked or full disk)."""

    failing = False

    def write(
        self, memories: Sequence[Memory], vectors: Any = None, events: Sequence[Any] = (), **options: Any
    ) -> None:
        if self.failing and memories:
            raise StoreError("disk I/O error")
        super().write(memories, vectors, events, **options)


def test_a_recall_whose_queued_bookkeeping_cannot_be_written_still_returns_its_hits(tmp_path: Path) -> None:
    """The recall that fills the bookkeeping queue writes it itself; when that write fails the recall has
    still succeeded: it returns its hits (a caller retrying it would count its accesses twice), the failure
    is logged, and the next pass writes every access once."""
    store = _FailingWrites(tmp_path / "failing.db")
    with Harness.open(store, embedder=None, preset="bm25", pager=PagerConfig(background=False)) as h:
        m = h.record("the cache hit rate dropped to ten percent", session_id="s1")
        for _ in range(ACCESS_BUFFER - 1):
            h.recall("cache hit rate", k=1)
        store.failing = True
        [hit] = h.recall("cache hit rate", k=1)  # the one that fills the queue
        assert hit.id == m.id
        assert [e.data["error"] for e in h.events(memory_id=None) if e.kind == "pager_error"]
        store.failing = False
        h.flush()
        assert h.get(m.id).access_count == ACCESS_BUFFER


def test_an_obsolete_memory_nothing_replaced_can_be_changed_back(harness: Harness) -> None:
    """Rejected, rolled back or marked obsolete by hand: no later revision holds its place, so it may be
    made active again (only a replaced revision may not, see above)."""
    m = harness.record("the build cache lives on ci-3", session_id="s")
    harness.update(m.id, status="obsolete")
    assert harness.update(m.id, status="active").status is Status.ACTIVE
    harness.reject(m.id, reason="wrong host")
    assert harness.reject(m.id, reason="twice").status is Status.OBSOLETE  # a double click
    with pytest.raises(ConflictError, match=re.escape("obsolete (rejected, or rolled back): make it active")):
        harness.revise(m.id, content="the build cache lives on ci-4")
    assert harness.update(m.id, status="active").status is Status.ACTIVE


def test_archiving_or_rejecting_a_pinned_memory_unpins_it(harness: Harness) -> None:
    """A pinned memory lives in working and active: a change that moves it out of either unpins it in the
    same write (it stayed pinned in the archive before, counted but never packed)."""
    for change in ({"tier": "archive"}, {"status": "archived"}):
        m = harness.pin(harness.record("keep this in every prompt", session_id="s").id)
        moved = harness.update(m.id, **change)
        assert not moved.pinned and moved.version == m.version + 1
    m = harness.pin(harness.record("keep this too", session_id="s").id)
    rejected = harness.reject(m.id, reason="wrong")
    assert rejected.status is Status.OBSOLETE and not rejected.pinned
    assert harness.count(session_id="s", pinned=True, status="any") == 0


def test_no_change_takes_a_session_past_its_pinned_budget(engine_name: str, tmp_path: Path) -> None:
    """Pins made outside a session and then moved into it, and a pinned memory revised to a longer text,
    went past the budget pin() holds to; a revised, collapsed or obsolete memory stayed pinned outside
    the working tier."""
    pager = PagerConfig(budgets=TierBudgets(working_items=2), background=False)
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, pager=pager) as h:
        inside = [h.pin(h.record(f"pinned {i}", session_id="s").id) for i in range(2)]
        outside = h.pin(h.record("pinned elsewhere", session_id="t").id)
        with pytest.raises(ValidationError) as exc:
            h.update(outside.id, session_id="s")
        assert exc.value.field == "pinned" and h.get(outside.id).session_id == "t"
        head = h.revise(inside[0].id, content="pinned 0, revised")  # the pin passes to the new revision
        assert head.pinned and not h.get(inside[0].id).pinned
        assert h.count(session_id="s", pinned=True, status="any") == 2
        with pytest.raises(ValidationError) as exc:  # past the working tier's tokens, as update() refuses
            h.revise(inside[1].id, content="word " * (pager.budgets.working_tokens + 10))
        assert exc.value.field == "pinned" and h.get(inside[1].id).status is Status.ACTIVE
        steps = [h.record(f"step {i}", task_id="job", state="intermediate", session_id="t") for i in range(2)]
        h.pin(steps[0].id)
        h.collapse_task("job")
        assert not h.get(steps[0].id).pinned


def test_an_import_holds_pinned_memories_to_what_pin_does(engine_name: str, tmp_path: Path) -> None:
    """A pinned memory in the archive was imported and packed as pinned; six pinned into a session with a
    budget of two were imported, and the pager left them all there."""
    pager = PagerConfig(budgets=TierBudgets(working_items=2), background=False)
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, pager=pager) as h:
        archived = Memory(content="old pin", pinned=True, tier="archive", session_id="s")
        with pytest.raises(ValidationError) as exc:
            h.import_memories([archived])
        assert exc.value.field == "memories.0.pinned"
        three = [Memory(content=f"pin {i}", pinned=True, tier="working", session_id="s") for i in range(3)]
        with pytest.raises(ValidationError) as exc:
            h.import_memories(three)
        assert exc.value.field == "memories.2.pinned" and h.count(status="any") == 0
        assert h.import_memories(three[:2]) == 2 and h.count(session_id="s", pinned=True) == 2


def test_an_import_whose_pin_another_process_outran_imports_nothing(tmp_path: Path) -> None:
    """Another harness on the file pins a memory of the session after the import checked that its pins fit,
    before it writes: the import checked before its write only and left three pins where two fit. Its write
    now carries the budget: refused, with the error of an import over it, and nothing imported."""
    pager = PagerConfig(budgets=TierBudgets(working_items=2), background=False)
    target = harness_target("sqlite", tmp_path)
    with (
        Harness.open(target, embedder=None, pager=pager) as h,
        Harness.open(target, embedder=None, pager=pager) as other,
    ):
        waiting = other.record("waiting to be pinned", session_id="s", tier="long_term")
        two = [Memory(content=f"pin {i}", pinned=True, tier="working", session_id="s") for i in range(2)]
        check = h.pager.check_pin

        def outran(memory: Any, now: Any, *args: Any, **kwargs: Any) -> None:
            check(memory, now, *args, **kwargs)
            if memory.id == two[-1].id:
                other.pin(waiting.id)  # between the import's check and its write

        h.pager.check_pin = outran  # type: ignore[method-assign]
        with pytest.raises(ValidationError) as exc:
            h.import_memories(two)
        assert exc.value.field == "memories.0.pinned" and "over the working-tier budget" in exc.value.problem
        assert h.store.get_many([m.id for m in two]) == {}
        assert [m.id for m in h.list(session_id="s", pinned=True)] == [waiting.id]


def test_an_import_makes_the_sessions_it_fills_due_for_the_pager(engine_name: str, tmp_path: Path) -> None:
    """No pass knew of them: a hundred imported working memories stayed over the budget through flush()
    and page()."""
    pager = PagerConfig(budgets=TierBudgets(working_items=4), background=False)
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, pager=pager) as h:
        h.import_memories([Memory(content=f"step {i}", tier="working", session_id="s") for i in range(20)])
        h.flush()
        assert h.count(session_id="s", tier="working") <= 4
        assert h.count(session_id="s") == 20


def test_a_forget_decided_on_an_old_version_keeps_the_memory(harness: Harness) -> None:
    """A delete always won: a runbook updated by one client was forgotten by another that read v1."""
    m = harness.record("runbook v1", session_id="s")
    harness.update(m.id, content="runbook v2 with the critical fix")
    with pytest.raises(ConflictError):
        harness.forget(m.id, expected_version=1)
    assert harness.get(m.id).content == "runbook v2 with the critical fix"
    with pytest.raises(ValidationError) as exc:
        harness.forget(m.id, expected_version="2")  # type: ignore[arg-type]
    assert exc.value.field == "expected_version"
    harness.recall("runbook critical fix")  # its access counted: bookkeeping, not a change
    harness.flush()
    assert harness.get(m.id).version > 2
    harness.forget(m.id, expected_version=2)
    with pytest.raises(NotFoundError):
        harness.get(m.id)


def test_a_revision_refuses_what_an_update_refuses(harness: Harness) -> None:
    m = harness.record("the ledger uses mysql", session_id="s")
    for field, value in (("pinned", True), ("access_count", 999), ("usage", {"cited": 50}), ("value", 1.0)):
        with pytest.raises(ValidationError) as exc:
            harness.revise(m.id, content="the ledger uses postgres", **{field: value})
        assert exc.value.field == field
    cp = harness.checkpoint("s", "before")
    with pytest.raises(StateConflictError):
        harness.revise(cp, content="{}")
    assert harness.history(m.id) == [harness.get(m.id)] and harness.rollback(cp)


def test_changed_version_is_below_the_version() -> None:
    # a copy into a new memory (a compressed original, a revision) is changed at its own version
    assert build_memory({"content": "x", "version": 2, "changed_version": 2}).changed_version is None
    m = build_memory({"content": "x", "version": 5, "changed_version": 3})
    assert [moved_on(m, v) for v in range(1, 7)] == [True, True, False, False, False, True]
    fresh = build_memory({"content": "x", "version": 5})
    assert [moved_on(fresh, v) for v in (4, 5, 6)] == [True, False, True]


def test_update_with_expected_version(harness: Harness) -> None:
    m = harness.record("the cache hit rate dropped to ten percent", tags=["cache"])
    u = harness.update(m.id, expected_version=1, content="the cache hit rate recovered", state="success")
    assert u.version == 2 and u.id == m.id and u.created_at == m.created_at
    assert u.token_count > 0 and u.content_type == "text/plain"
    assert harness.get(m.id) == u
    # track=False: a tracked recall counts as an access, which is a stored change (a new version)
    assert [h.id for h in harness.recall("recovered", preset="bm25", track=False)] == [m.id]
    assert harness.recall("dropped", preset="bm25", track=False) == []

    events_before = len(harness.events())
    with pytest.raises(ConflictError) as exc:
        harness.update(m.id, expected_version=1, content="stale writer")
    assert exc.value.expected == 1 and exc.value.actual == 2
    assert exc.value.field == "expected_version" and "version 2" in exc.value.problem and exc.value.fix
    assert harness.get(m.id) == u
    assert len(harness.events()) == events_before

    for field, value in (
        ("id", clawvm.Memory(content="x").id),
        ("created_at", u.created_at),
        ("version", 9),
        ("tenant", "other"),
    ):
        with pytest.raises(ValidationError) as vexc:
            harness.update(m.id, **{field: value})
        assert vexc.value.field == field
    with pytest.raises(ValidationError) as vexc:
        harness.update(m.id, kind="bogus")
    assert vexc.value.field == "kind"
    with pytest.raises(ValidationError) as vexc:
        harness.update(m.id, no_such_field=1)
    assert vexc.value.field == "no_such_field"
    with pytest.raises(ValidationError) as vexc:
        harness.update(m.id, content="")
    assert vexc.value.field == "content"
    assert harness.get(m.id) == u
    with pytest.raises(NotFoundError) as missing:
        harness.update(clawvm.Memory(content="x").id, tags=["x"])
    # as every error a caller handles: what was wrong where, and what to do (a handler read .field and failed)
    assert missing.value.field == "memory_id" and "no memory" in missing.value.problem and missing.value.fix


def test_updated_content_is_re_embedded(harness: Harness) -> None:
    m = harness.record("a note about gardening and tomatoes")
    harness.flush(timeout=60)
    harness.update(m.id, content="quarterly revenue grew by twelve percent")
    harness.flush(timeout=60)
    hit = harness.recall("how much did sales increase this quarter?", k=1, preset="dense")[0]
    assert hit.id == m.id and hit.explain["dense"].raw > 0.3


def test_forget(harness: Harness) -> None:
    m, keep = harness.record("secret token rotated on monday"), harness.record("token bucket rate limiter")
    harness.flush(timeout=60)
    harness.forget(m.id)
    with pytest.raises(NotFoundError):
        harness.get(m.id)
    with pytest.raises(NotFoundError):
        harness.forget(m.id)
    assert [h.id for h in harness.recall("secret token rotated monday", k=5)] == [keep.id]
    assert harness.count() == 1


def test_a_forgotten_memorys_children_take_its_parent_so_an_export_imports_again(
    harness: Harness, tmp_path: Path
) -> None:
    """parent_id names a stored memory: a child left naming a forgotten one made the tenant's export
    refused by an import (its parent named no memory), and the run trace lost a link."""
    turn = harness.record("user: deploy the payments service", session_id="s1")
    call = harness.record("deploy(payments)", kind="tool_call", session_id="s1", parent_id=turn.id)
    results = [
        harness.record(f"deploy step {i} ok", kind="tool_result", session_id="s1", parent_id=call.id)
        for i in range(3)
    ]
    root_child = harness.record("a note under the turn", session_id="s1", parent_id=turn.id)
    harness.forget(call.id)
    assert {harness.get(r.id).parent_id for r in results} == {turn.id}  # the call's parent adopts them
    assert all(harness.get(r.id).version == 2 for r in results)
    update = harness.events(memory_id=results[0].id)[-1]
    assert (update.kind, update.data) == ("update", {"fields": ["parent_id"], "version": 2})
    harness.forget(turn.id)  # a root: its children become roots
    assert harness.get(root_child.id).parent_id is None
    assert {harness.get(r.id).parent_id for r in results} == {None}
    exported = list(harness.iter_all())
    with Harness.open(str(tmp_path / "again.db"), embedder=None) as again:
        assert again.import_memories(exported) == len(exported) == 4


def test_events_are_recorded(harness: Harness) -> None:
    m = harness.record("event source", kind="observation")
    harness.update(m.id, tags=["x"])
    harness.forget(m.id)
    events = harness.events(memory_id=m.id)
    assert [e.kind for e in events] == ["add", "update", "forget"]
    assert events[0].data == {"kind": "observation", "tier": "working"}  # new memories enter working
    assert events[1].data == {"fields": ["tags"], "version": 2}
    assert all(e.memory_id == m.id and e.tenant == "default" for e in events)
    assert [e.seq for e in harness.events(after_seq=events[0].seq or 0)] == [events[1].seq, events[2].seq]


def test_precomputed_embedding_is_used(harness: Harness) -> None:
    harness.flush(timeout=60)
    rng = np.random.default_rng(7)
    v = rng.standard_normal(384).astype(np.float32)
    m = harness.record("text unrelated to the vector", embedding=v)
    other = harness.record("another memory")
    harness.flush(timeout=60)
    hits = harness.recall_with("", v, 2, PRESETS["dense"], Filters.of(tenant="default"))
    assert hits[0].id == m.id
    assert hits[0].explain["dense"].raw == pytest.approx(1.0, abs=1e-4)
    assert hits[1].id == other.id and hits[1].explain["dense"].raw < 0.5


@pytest.mark.engines("sqlite")
def test_memories_recorded_without_an_embedder_are_embedded_on_the_next_open(
    engine_name: str, tmp_path: Path, embedder: clawvm.MiniLMEmbedder
) -> None:
    target = harness_target(engine_name, tmp_path)
    with Harness.open(target, embedder=None) as h:
        a = h.record("the nightly backup job failed with a permission error")
        h.record("the team offsite is in march")
        assert h.recall("backup failed", k=1)[0].id == a.id
    with Harness.open(target, embedder=embedder) as h:
        h.flush(timeout=60)
        assert h.store.unembedded(10) == []
        hit = h.recall("why did the database dump not complete?", k=1, preset="dense")[0]
        assert hit.id == a.id and hit.explain["dense"].raw > 0.2


class GatedEmbedder:
    """MiniLM's vectors, each query embedding holding on until the store has been asked for the text
    channels (``wait_for_text``), so the order of the two shows in ``calls``; or failing (``fail``)."""

    name = "gated"
    dim = 384

    def __init__(self, model: clawvm.MiniLMEmbedder) -> None:
        self.model = model
        self.text_asked = threading.Event()
        self.calls: list[str] = []
        self.wait_for_text = False
        self.fail = False

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.embed(texts)

    def embed_query(self, text: str) -> np.ndarray:
        self.calls.append("embed started")
        time.sleep(0.002)  # a model's time at least, whatever the machine: worth embedding beside the caller
        if self.fail:
            raise EmbedderError("the model is gone")
        if self.wait_for_text and not self.text_asked.wait(timeout=10):
            self.calls.append("embed waited in vain")
        self.calls.append("embed done")
        return self.model.embed_query(text)


def _observe_text_queries(h: Harness, embedder: GatedEmbedder) -> None:
    engine = engine_of(h)  # the harness asks its engine
    ask = engine.query

    def query(q: Query) -> QueryResult:
        if q.text:
            embedder.calls.append("text channels")
            embedder.text_asked.set()
        return ask(q)

    engine.query = query  # type: ignore[method-assign]


def test_the_text_channels_run_while_the_query_is_embedded(
    engine_name: str, tmp_path: Path, embedder: clawvm.MiniLMEmbedder
) -> None:
    gated = GatedEmbedder(embedder)
    with Harness.open(harness_target(engine_name, tmp_path), embedder=gated) as h:
        fill(h)
        h.flush(timeout=60)
        h.recall("disk", k=1)  # the first query embedding runs in place: it measures the embedder
        _observe_text_queries(h, gated)
        gated.calls, gated.wait_for_text = [], True
        hits = h.recall("why did the deploy fail? disk full", k=2)
        # the embedding was still in flight when the store ran the text channels, and its vector was used
        # (which of the two threads logs its start first is the scheduler's choice)
        assert sorted(gated.calls[:2]) == ["embed started", "text channels"]
        assert gated.calls[2:] == ["embed done"]
        assert hits[0].memory.content.startswith("The deploy failed") and "dense" in hits[0].explain
        assert h.last_query_embed_ms > 0
        gated.wait_for_text, gated.calls = False, []
        h.parallel_query_embedding = False
        h.recall("why did the deploy fail? disk full", k=2)
        assert gated.calls == ["embed started", "embed done", "text channels"]


def test_recall_ranks_the_same_with_the_query_embedded_in_parallel_or_first(harness: Harness) -> None:
    fill(harness)
    harness.flush(timeout=60)
    for query in ("disk full on the build machine", "what does the user prefer?", "payment retries"):
        harness.parallel_query_embedding = True
        beside = [(h.id, h.score, h.explain) for h in harness.recall(query, k=4, track=False)]
        harness.parallel_query_embedding = False
        first = [(h.id, h.score, h.explain) for h in harness.recall(query, k=4, track=False)]
        assert beside == first and any("dense" in e for _, _, e in beside)


class LookupEmbedder(GatedEmbedder):
    """Vectors looked up, not computed (a cache, a table): each query embedding takes microseconds."""

    def __init__(self, model: clawvm.MiniLMEmbedder) -> None:
        super().__init__(model)
        self.cache: dict[str, np.ndarray] = {}

    def embed_query(self, text: str) -> np.ndarray:
        self.calls.append("looked up")
        return self.cache[text]


def test_an_embedder_that_answers_at_once_is_called_in_place(
    tmp_path: Path, embedder: clawvm.MiniLMEmbedder
) -> None:
    """Handing a lookup to another thread would cost more than it hides (and on PostgreSQL, a round trip
    of its own for the dense channel): the query is embedded first, on the caller's thread."""
    fast = LookupEmbedder(embedder)
    queries = ["disk full", "what does the user prefer?", "payment retries"]
    fast.cache = {q: embedder.embed_query(q) for q in queries}
    with Harness.open(tmp_path / "m.db", embedder=fast) as h:
        fill(h)
        _observe_text_queries(h, fast)
        for q in queries * 3:
            assert h.recall(q, k=2)
        assert fast.calls == ["looked up", "text channels"] * 9
        assert h.last_query_embed_ms > 0
        assert not any(t.name.startswith("clawvm-query-embed") for t in threading.enumerate())


def test_a_failing_query_embedding_fails_the_recall_and_ends_its_thread_on_close(
    tmp_path: Path, embedder: clawvm.MiniLMEmbedder
) -> None:
    gated = GatedEmbedder(embedder)
    h = Harness.open(tmp_path / "m.db", embedder=gated)
    fill(h)
    h.recall("disk", k=1)  # measures the embedder: slow enough to embed beside the caller from now on
    gated.fail = True
    with pytest.raises(EmbedderError, match="the model is gone"):
        h.recall("disk full", k=2)
    gated.fail = False
    assert h.recall("disk full", k=2)[0].memory.content.startswith("The deploy failed")
    assert any(t.name.startswith("clawvm-query-embed") for t in threading.enumerate())
    h.close()
    assert not any(t.name.startswith("clawvm-query-embed") for t in threading.enumerate())
    # a recall after close is refused, and starts no thread
    again = Harness(MemoryStore(), gated)
    fill(again)
    again.recall("disk", k=1)
    assert again.recall("disk full", k=2)[0].memory.content.startswith("The deploy failed")  # beside
    again.close()
    with pytest.raises(StateConflictError):
        again.recall("disk full", k=2)
    assert not any(t.name.startswith("clawvm-query-embed") for t in threading.enumerate())


def test_concurrent_records_and_recalls(harness: Harness) -> None:
    errors: list[BaseException] = []
    recorded: list[list[str]] = [[] for _ in range(8)]

    def work(t: int) -> None:
        try:
            for i in range(50):
                m = harness.record(f"worker{t} wrote entry{i} about topic{i % 5}", session_id=f"s{t}")
                recorded[t].append(m.id)
                if i % 10 == 9:
                    hits = harness.recall(f"worker{t} entry{i}", k=3, preset="bm25", session_id=f"s{t}")
                    assert hits and hits[0].id == m.id
                    harness.recall(f"topic{i % 5}", k=5)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    everything = [i for ids in recorded for i in ids]
    assert len(set(everything)) == 400
    assert harness.count() == 400
    assert set(harness.store.get_many(everything)) == set(everything)
    for t in range(8):
        assert {h.id for h in harness.recall(f"worker{t}", k=100, preset="bm25")} == set(recorded[t])
    assert len([e for e in harness.events(limit=10_000) if e.kind == "add"]) == 400


def test_concurrent_updates_lose_nothing(harness: Harness) -> None:
    m = harness.record("shared counter", metadata={"n": 0})
    per_thread, n_threads = 10, 8
    errors: list[BaseException] = []
    conflicts: list[int] = []

    def increment() -> None:
        try:
            for _ in range(per_thread):
                while True:
                    cur = harness.get(m.id)
                    time.sleep(0)  # let another thread in between the read and the write
                    try:
                        harness.update(
                            m.id, expected_version=cur.version, metadata={"n": cur.metadata["n"] + 1}
                        )
                        break
                    except ConflictError:
                        conflicts.append(1)  # list.append is atomic
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=increment) for _ in range(n_threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so read-modify-write cycles really interleave
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    assert conflicts, "the threads never raced; the test proves nothing"
    final = harness.get(m.id)
    assert final.metadata["n"] == per_thread * n_threads
    assert final.version == per_thread * n_threads + 1
    assert len([e for e in harness.events(memory_id=m.id) if e.kind == "update"]) == per_thread * n_threads


def test_presets(harness: Harness) -> None:
    ms = fill(harness)
    harness.flush(timeout=60)
    q = "deploy failed disk full"
    assert set(harness.recall(q, k=1, preset="bm25")[0].explain) == {"lexical"}
    assert set(harness.recall(q, k=1, preset="dense")[0].explain) == {"dense"}
    assert set(harness.recall(q, k=1, preset="hybrid-v1")[0].explain) == {"lexical", "dense"}
    assert {"lexical", "context", "dense"} <= set(harness.recall(q, k=1, preset="hybrid")[0].explain)
    custom = RecallConfig("custom", {"lexical": 0.5, "dense": 0.5}, candidates=3)
    assert harness.recall(q, k=1, preset=custom)[0].id == ms[0].id
    with pytest.raises(ConfigError):
        harness.recall(q, preset="nope")
    assert sorted(PRESETS) == [
        "bm25",
        "dense",
        "graph",
        "hybrid",
        "hybrid-fast",
        "hybrid-v1",
        "hybrid-v2",
        "hybrid-v3",
    ]


def test_unknown_preset_at_open_is_a_config_error(engine_name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Harness.open(harness_target(engine_name, tmp_path), embedder=None, preset="nope")


def test_open_rejects_unknown_targets(tmp_path: Path) -> None:
    for target in ("redis://localhost/0", "sqlite://"):
        with pytest.raises(ConfigError):
            Harness.open(target, embedder=None)
    with pytest.raises(ValidationError) as exc:
        Harness.open("memory://", embedder="no-such-model")
    assert exc.value.field == "embedder"


def test_open_with_a_path_or_a_store(tmp_path: Path) -> None:
    with Harness.open(tmp_path / "p.db", embedder=None) as h:
        m = h.record("via a Path")
    store = SQLiteStore(tmp_path / "p.db")
    with Harness.open(store, embedder=None) as h:
        assert h.get(m.id) == m
    with Harness.open(str(tmp_path / "p.db"), embedder=None) as h:
        assert h.count() == 1


def test_context_manager_flushes_and_closes(
    engine_name: str, tmp_path: Path, embedder: clawvm.MiniLMEmbedder
) -> None:
    target = harness_target(engine_name, tmp_path)
    with Harness.open(target, embedder=embedder) as h:
        for i in range(5):
            h.record(f"memory number {i} recorded right before close")
        worker = h._worker
        assert worker is not None
    assert h._worker is None
    assert worker._thread is None  # the embedding thread was stopped and joined
    if engine_name == "sqlite":
        assert isinstance(engine_of(h), SQLiteStore) and engine_of(h)._conn is None
        with Harness.open(target, embedder=None) as again:
            assert again.count() == 5
            assert again.store.unembedded(10) == []  # close() waited for the embedding queue


def test_odd_arguments_get_a_named_error_or_a_sensible_answer(harness: Harness) -> None:
    """Each raised a raw OverflowError, TypeError or AttributeError."""
    h = harness
    m = h.record("the deploy runs at noon", session_id="s")
    assert h.events(after_seq=2**63) == [] and len(h.events(limit=2**63)) >= 1  # as many as there are
    assert [r.id for r in h.recall("deploy noon", k=2**63, preset="bm25")] == [m.id]
    for call, field in (
        (lambda: h.context("deploy", neighbours="a"), "neighbours"),  # type: ignore[arg-type]
        (lambda: h.context("deploy", quotas={"pinned": 1}), "quotas"),  # type: ignore[arg-type]
        (lambda: h.review_queue(below="x"), "below"),
        (lambda: h.review_queue(below=None), "below"),
    ):
        with pytest.raises(ValidationError) as exc:
            call()
        assert exc.value.field == field


def test_a_clock_of_naive_datetimes_is_taken_as_utc() -> None:
    """Naive datetimes are UTC everywhere else; a naive clock made record, recall and context raise
    TypeError (naive compared with aware)."""
    with Harness.open("memory://", embedder=None, clock=lambda: datetime(2030, 1, 1, 12)) as h:
        m = h.record("the deploy runs at noon", session_id="s", expires_at=datetime(2030, 1, 2))
        assert m.created_at == datetime(2030, 1, 1, 12, tzinfo=UTC)
        assert [r.id for r in h.recall("deploy noon")] == [m.id]
        assert m.id in h.context("deploy", session_id="s").ids


def test_a_pass_at_a_naive_instant_takes_it_as_utc() -> None:
    """page(now=<naive>) raised TypeError (naive minus aware) once a session was due; page(now="x") and
    flush(timeout="x") raised TypeErrors too."""
    pager = PagerConfig(budgets=TierBudgets(working_items=2), background=False)
    with Harness.open("memory://", embedder=None, pager=pager) as h:
        for i in range(5):
            h.record(f"note {i}", session_id="s")
        assert h.page(now=datetime(2030, 3, 2, 12, 0))  # moved some
        assert h.count(session_id="s", tier="working") <= 2
        for call, field in ((lambda: h.page(now="x"), "now"), (lambda: h.flush(timeout="x"), "timeout")):
            with pytest.raises(ValidationError) as exc:
                call()
            assert exc.value.field == field


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda h: h.flush(timeout=-1), "timeout"),
        (lambda h: h.flush(timeout=float("nan")), "timeout"),
        (lambda h: h.flush(timeout=1e20), "timeout"),  # past what a wait takes: OverflowError with a worker
        (lambda h: list(h.iter_all(newest_first=None)), "newest_first"),  # TypeError from the index
        (lambda h: list(h.iter_all(newest_first=10**20)), "newest_first"),  # OverflowError
        (lambda h: h.context("x", k=0), "k"),  # 0 read as "the default"; -1 was refused
        (lambda h: h.start_session("s", []), "task"),  # an empty list read as "no task"
        (lambda h: h.context("x", quotas=clawvm.Quotas(working="a")), "quotas.working"),  # ValueError
        (lambda h: h.context("x", quotas=clawvm.Quotas(retrieved=None)), "quotas.retrieved"),  # TypeError
        (lambda h: h.context("x", quotas=clawvm.Quotas(working=float("nan"))), "quotas.working"),
        (lambda h: h.context("x", quotas=clawvm.Quotas(pinned=7)), "quotas.pinned"),  # taken silently
        (lambda h: h.context("x", quotas=clawvm.Quotas(working=-1.0)), "quotas.working"),
        (lambda h: h.tool(name="")(lambda: None), "name"),  # a blank name became the function's
        (lambda h: h.tool(name=[])(lambda: None), "name"),
    ],
)
def test_a_bad_argument_of_the_virtual_memory_face_is_refused_by_name(
    harness: Harness, call: Callable[[Harness], Any], field: str
) -> None:
    harness.record("deploy notes", session_id="s")
    with pytest.raises(ValidationError) as exc:
        call(harness)
    assert exc.value.field == field


def test_a_tool_call_with_a_parent_that_is_no_id_is_refused(harness: Harness) -> None:
    """parent_id=[] was taken as "no parent" (an empty value read as not given)."""
    with pytest.raises(ValidationError) as exc, harness.tool_call("probe", {}, parent_id=[]):  # type: ignore[arg-type]
        pass
    assert exc.value.field == "parent_id"
    assert harness.count(status="any") == 0


def test_scope_ids_of_a_context_are_strings(harness: Harness) -> None:
    """context(session_id=5) raised AttributeError from deep in the build (list and recall named the
    field)."""
    for field in ("session_id", "task_id", "agent_id"):
        with pytest.raises(ValidationError) as exc:
            harness.context("x", **{field: 5})
        assert exc.value.field == field
    with pytest.raises(ValidationError) as exc:
        harness.checkpoints(["s"])  # type: ignore[arg-type]
    assert exc.value.field == "session_id"


def test_an_update_that_sets_a_past_expiry_answers_as_get_does(harness: Harness) -> None:
    """The memory update() returned said active while get() said expired."""
    m = harness.record("short lived", session_id="s")
    updated = harness.update(m.id, expires_at=harness.now() - timedelta(seconds=1))
    assert updated.status is harness.get(m.id).status is Status.EXPIRED


def test_a_blank_scope_id_filter_is_refused_as_a_blank_tag_is(harness: Harness) -> None:
    """record(session_id="") stores no session, but recall, list and count filtered on the text "" and
    silently found nothing, not even that memory."""
    harness.record("the walrus ate the config file", session_id="")
    for read in (harness.count, harness.list, lambda **f: harness.recall("walrus", **f)):
        for field in ("session_id", "task_id", "agent_id"):
            with pytest.raises(ValidationError) as exc:
                read(**{field: " "})
            assert exc.value.field == field and "none" in (exc.value.fix or "")
    assert harness.count() == 1


def test_an_import_of_no_list_names_memories(harness: Harness) -> None:
    for given in (None, 5, {"id": "x"}):
        with pytest.raises(ValidationError) as exc:
            harness.import_memories(given)  # type: ignore[arg-type]
        assert exc.value.field == "memories"
    assert harness.count(status="any") == 0


def test_status_any_is_taken_in_a_list_and_the_fix_names_what_a_caller_may_ask(harness: Harness) -> None:
    """status=["any"] was refused though the API takes it, and a misspelt status listed 'internal' (refused)
    but not 'any' as the values to use."""
    m = harness.record("the deploy runs at noon")
    harness.update(m.id, status="archived")
    assert harness.count(status=["any"]) == harness.count(status=["active", "any"]) == 1
    with pytest.raises(ValidationError) as exc:
        harness.count(status="ANY")
    assert exc.value.field == "status" and "'any'" in (exc.value.fix or "")
    assert "internal" not in (exc.value.fix or "")


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ({"max_content_bytes": 0}, "max_content_bytes"),
        ({"max_content_bytes": -1}, "max_content_bytes"),
        ({"max_content_bytes": "abc"}, "max_content_bytes"),
        ({"max_content_bytes": True}, "max_content_bytes"),
        ({"clock": "now"}, "clock"),
        ({"clock": 5}, "clock"),
        ({"clock": lambda: "2026-01-01"}, "clock"),
    ],
)
def test_a_bad_setting_is_refused_when_the_harness_opens(
    tmp_path: Path, setting: dict[str, Any], field: str
) -> None:
    """Refused at open, naming the setting, before any file is made: not at the first record, as a raw
    TypeError or a limit no text could meet."""
    with pytest.raises(ValidationError) as refused:
        Harness.open(tmp_path / "h.db", embedder=None, **setting)
    assert refused.value.field == field and not (tmp_path / "h.db").exists()


_BY_ID: list[tuple[str, Callable[[Harness, Any], object], str]] = [
    ("get", lambda h, x: h.get(x), "memory_id"),
    ("forget", lambda h, x: h.forget(x), "memory_id"),
    ("update", lambda h, x: h.update(x, content="new"), "memory_id"),
    ("pin", lambda h, x: h.pin(x), "memory_id"),
    ("rate", lambda h, x: h.rate(x, 1), "memory_id"),
    ("explain", lambda h, x: h.explain(x), "memory_id"),
    ("compress", lambda h, x: h.compress(x), "memory_id"),
    ("revise", lambda h, x: h.revise(x, content="new"), "memory_id"),
    ("history", lambda h, x: h.history(x), "memory_id"),
    ("approve", lambda h, x: h.approve(x), "memory_id"),
    ("feedback", lambda h, x: h.feedback(x, True), "memory_id"),
    ("rollback", lambda h, x: h.rollback(x), "checkpoint_id"),
]


@pytest.mark.parametrize(("method", "call", "field"), _BY_ID, ids=[m for m, _, _ in _BY_ID])
@pytest.mark.parametrize("given", [None, 5])
def test_an_id_that_is_no_string_is_a_mistake_not_a_missing_memory(
    method: str, call: Callable[[Harness, Any], object], field: str, given: object
) -> None:
    """``forget(None)`` answered "memory None not found", as if the caller had the right kind of id."""
    with Harness.open("memory://", embedder=None) as h:
        with pytest.raises(ValidationError) as refused:
            call(h, given)
        assert refused.value.field == field


def test_a_closed_harness_answers_nothing_and_writes_nothing(tmp_path: Path) -> None:
    """Like a closed file: a read after close() used to answer, and a recall or a context wrote its
    bookkeeping (access counts, events) to the store its owner had closed."""
    h = Harness.open(tmp_path / "h.db", embedder=None)
    m = h.record("hello world", session_id="s1")
    h.record("and another", session_id="s1")
    view = h.store
    paging, viewed = h.iter_all(batch=1), view.iter_all(Filters(), batch=1)  # made before the close
    assert next(paging).id == next(viewed).id == m.id
    h.close()
    for pages in (paging, viewed):  # no page is read once the harness closed
        with pytest.raises(StateConflictError):
            next(pages)
    calls: list[Callable[[], object]] = [
        lambda: h.get(m.id),
        lambda: h.recall("hello"),
        lambda: h.context("hello", session_id="s1"),
        lambda: h.count(),
        lambda: h.events(),
        lambda: h.explain(m.id),
        lambda: h.tick(),
        lambda: h.page(),
        lambda: h.record("after"),
        lambda: view.count(Filters()),
        lambda: view.get(m.id),
    ]
    for call in calls:
        with pytest.raises(StateConflictError) as refused:
            call()
        assert refused.value.field == "harness"
    h.flush()  # what close() did already: nothing to do
    h.close()  # closing again is harmless
    with Harness.open(tmp_path / "h.db", embedder=None) as again:
        assert [e.kind for e in again.events()] == ["add", "add"] and again.get(m.id).access_count == 0


class _ImportLandingFirst:
    """The harness, with the same file imported by another caller just before this import's write: two
    imports of one file side by side, their reads done before either wrote."""

    def __init__(self, h: Harness, memories: list[Memory]) -> None:
        self._h, self._memories, self._raced = h, memories, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h, name)

    @property
    def writer(self) -> Any:
        outer = self

        class Racing:
            def __getattr__(self, name: str) -> Any:
                return getattr(outer._h.writer, name)

            def write(self, *args: Any, **kwargs: Any) -> Any:
                if not outer._raced:
                    outer._raced = True
                    outer._h.import_memories(outer._memories[:3])  # the other import lands first
                return outer._h.writer.write(*args, **kwargs)

        return Racing()


def test_two_imports_of_one_file_side_by_side_import_each_memory_once() -> None:
    """The second one failed with "memory ... is at version 2, not 1: re-read it and retry the update"."""
    from clawvm.harness import importing

    with Harness.open("memory://", embedder=None) as source:
        exported = [source.record(f"note {i}", session_id="s") for i in range(5)]
    with Harness.open("memory://", embedder=None) as h:
        done = importing.import_memories(_ImportLandingFirst(h, exported), h._store, exported, False)  # type: ignore[arg-type]
        assert done.imported == 2 and h.count(session_id="s") == 5
        assert len([e for e in h.events(limit=100) if e.kind == "import"]) == 5


def test_a_change_written_after_another_process_forgot_the_memory_never_brings_it_back(
    engine_name: str, tmp_path: Path
) -> None:
    """A version past 1 of a missing id was stored as new: a recall's bookkeeping, written just after
    another process forgot the memory, brought it back whole (3 of 60 on PostgreSQL)."""
    target = harness_target(engine_name, tmp_path)
    with Harness.open(target, embedder=None) as h:
        m = h.record("the card number is in the vault now", session_id="s")
        read = h.store.get(m.id)  # read by this process ...
        h.forget(m.id)  # ... forgotten by another meanwhile (one harness plays both: same store)
        with pytest.raises(NotFoundError):
            h.pager.mutate(
                read, lambda cur: {"access_count": cur.access_count + 1}, h.now(), bookkeeping=True
            )
        with pytest.raises(ConflictError):
            h.writer.write([read.model_copy(update={"version": read.version + 1})], bookkeeping=True)
        assert h.store.get_many([m.id]) == {}


def test_feedback_whose_event_cannot_be_logged_counts_nothing(tmp_path: Path) -> None:
    """The vote and its ``feedback`` event are one write. Written apart, a failure between them kept the
    vote without its event, and the caller's retry (a 503 from the server says retry) counted it twice."""
    with Harness.open(tmp_path / "h.db", embedder=None) as h:
        m = h.record("the deploy key lives in the vault", session_id="s1")
        with events_refused(tmp_path / "h.db", "feedback"), pytest.raises(StoreError):
            h.rate(m.id, 1)
        assert h.get(m.id).usage.feedback == 0 and h.get(m.id).version == m.version
        rated = h.rate(m.id, 1)  # the retry
        assert rated.usage.feedback == 1 and [e.kind for e in h.events()] == ["add", "feedback"]


@pytest.mark.parametrize("status", ["expired", " Expired", Status.EXPIRED])
def test_status_expired_is_refused_by_hand_since_nothing_undoes_it(status: object) -> None:
    """One mistaken ``update(status="expired")`` hid a memory for good: an expired memory may not be
    changed again (its TTL promised to forget it). Expiring is what ``expires_at`` is for."""
    with Harness.open("memory://", embedder=None) as h:
        m = h.record("the staging password rotates on fridays", session_id="s1")
        with pytest.raises(ValidationError) as exc:
            h.update(m.id, status=status)
        assert exc.value.field == "status" and "expires_at" in exc.value.fix
        assert h.get(m.id) == m
        with pytest.raises(ValidationError):
            h.record("a memory born expired", status=status)
        assert h.count(status="any") == 1
        assert h.update(m.id, status="archived").status is Status.ARCHIVED  # the reversible way
        assert h.update(m.id, status="active").status is Status.ACTIVE
