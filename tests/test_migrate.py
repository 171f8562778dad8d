"""``clawvm migrate``: any engine into an empty one and back, verified by counts, checksums and vectors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner

import clawvm
import pg_server
from clawvm import ClaimedError, Harness, Link, LinkType, Memory, Status, StoreError, ValidationError
from clawvm.cli import main
from clawvm.observe.lens import Lens, record_output
from clawvm.store import Event, MemoryStore, Query, Store, store_from_url
from clawvm.store.migrate import Report, check, migrate, summarize
from clawvm.store.postgres_url import split_url
from engines import engine_of, harness_target, make_store

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def fill(store: Store) -> list[Memory]:
    """Memories of two tenants with links, tags, metadata and odd text; vectors on some; events."""
    first = Memory(
        content="the nightly backup failed: disk full", session_id="s1", tags=["ops"], created_at=T0
    )
    ms = [
        first,
        Memory(
            content="we freed space and the backup ran",
            session_id="s1",
            created_at=T0 + timedelta(1),
            links=[Link(type=LinkType.CAUSED_BY, target=first.id)],
            metadata={"n": [1, 2.5, None]},
        ),
        Memory(
            content="tenant b's own secret note",
            tenant="b",
            status=Status.ARCHIVED,
            version=4,
            created_at=T0 + timedelta(2),
        ),
        Memory(
            content="ünïcödé, tabs\tand\nnewlines, a NUL \x00 and a backslash \\",
            tags=["a\\b"],
            created_at=T0 + timedelta(3),
        ),
    ]
    ms += [
        Memory(content=f"filler memory number {i}", session_id="s2", created_at=T0 + timedelta(hours=i))
        for i in range(12)
    ]
    store.put_many(ms, imported={m.id for m in ms})  # new at the versions they carry
    vecs = np.random.default_rng(3).standard_normal((len(ms) - 2, 384)).astype(np.float32)
    store.set_vectors([m.id for m in ms[2:]], vecs)
    store.append_events(
        [
            Event(
                "add",
                m.id,
                {"i": i, "deep": {"x": [True, None]}},
                tenant=m.tenant,
                at=T0 + timedelta(minutes=i),
            )
            for i, m in enumerate(ms)
        ]
    )
    store.append_event(Event("note", None, {"msg": "ü"}))
    return ms


PAIRS = [("sqlite", "postgres"), ("postgres", "sqlite"), ("memory", "postgres")]


@pytest.mark.parametrize(("source_engine", "target_engine"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_migrate_copies_everything_and_verifies(
    source_engine: str, target_engine: str, tmp_path: Path
) -> None:
    source = make_store(source_engine, tmp_path, "src.db")
    target = make_store(target_engine, tmp_path, "dst.db")
    source.setup()
    target.setup()
    try:
        ms = fill(source)
        seen: dict[str, int] = {}
        report = migrate(
            source, target, batch=5, progress=lambda what, n: seen.update({what: seen.get(what, 0) + n})
        )
        assert (report.memories, report.vectors, report.events) == (len(ms), len(ms) - 2, len(ms) + 1)
        assert seen == {"memories": len(ms), "events": len(ms) + 1}
        assert report.source == report.target and report.worst_vector_error <= 1e-5
        assert target.get_many([m.id for m in ms]) == {m.id: m for m in ms}
        assert [(e.kind, e.memory_id, e.data, e.at) for e in target.read_events()] == [
            (e.kind, e.memory_id, e.data, e.at) for e in source.read_events()
        ]
        assert set(target.edges([ms[0].id])) == set(source.edges([ms[0].id]))
        q = Query(text="backup disk", limit=5)
        assert [i for i, _ in target.query(q).lexical] == [i for i, _ in source.query(q).lexical]
        v = source.vectors_of([ms[5].id])[ms[5].id]
        assert target.query(Query(vector=v, limit=1)).dense[0][0] == ms[5].id
    finally:
        source.close()
        target.close()


def test_a_copy_that_fails_its_verification_is_left_unclaimed_to_be_looked_into(tmp_path: Path) -> None:
    """A write to the source during the copy makes the verification fail. The target holds the whole copy
    as read: it is unclaimed (a claim left there could only be dropped with the copy), opens, and can be
    checked again; the error says so."""
    source, target = make_store("sqlite", tmp_path, "a.db"), make_store("sqlite", tmp_path, "b.db")
    source.setup()
    target.setup()
    try:
        fill(source)
        late = Memory(content="written while the copy ran", session_id="s9", created_at=T0)
        written: list[str] = []

        def meanwhile(what: str, n: int) -> None:
            if what == "events" and not written:  # the memories are copied: a late one is not
                source.put(late)
                written.append(late.id)

        with pytest.raises(StoreError, match="check it again") as exc:
            migrate(source, target, batch=5, progress=meanwhile)
        assert "differs" in str(exc.value) and written
        assert target.held_claim() is None
        with pytest.raises(StoreError, match="differs"):
            check(source, target)
        assert target.get_many([late.id]) == {}  # read after the memories were: not in the copy
    finally:
        source.close()
        target.close()
    with Harness.open(tmp_path / "b.db", embedder=None) as h:  # it opens, to be looked into
        assert h.count(status="any") > 0


def test_a_store_that_is_not_empty_is_refused_and_differences_are_found(tmp_path: Path) -> None:
    source, target = make_store("sqlite", tmp_path, "a.db"), make_store("postgres", tmp_path, "b")
    source.setup()
    target.setup()
    try:
        fill(source)
        migrate(source, target, verify=False)
        before = summarize(target)
        with pytest.raises(ValidationError) as exc:
            migrate(source, target)
        assert exc.value.field == "to" and summarize(target) == before  # nothing written
        assert target.held_claim() is None  # nor left claimed: it opens as it did
        verified = check(source, target)
        assert verified.source == verified.target == before and verified.worst_vector_error <= 1e-5
        m = target.list(limit=1)[0]
        target.put(m.model_copy(update={"version": m.version + 1, "tags": ["tampered"]}))
        with pytest.raises(StoreError, match="differs"):
            check(source, target)
    finally:
        source.close()
        target.close()


def test_cli_migrates_sqlite_to_postgres_and_back(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    pg = pg_server.store_url(tmp_path, "cli")
    store = store_from_url(f"sqlite:///{a}")
    store.setup()
    ms = fill(store)
    store.close()
    runner = CliRunner()
    there = runner.invoke(main, ["migrate", "--from", f"sqlite:///{a}", "--to", pg, "--batch", "7"])
    assert there.exit_code == 0, there.output
    assert f"copied {len(ms)} memories, {len(ms) - 2} vectors, {len(ms) + 1} events" in there.output
    assert "verified: counts and checksums match" in there.output
    assert "memories" not in there.output.splitlines()  # no progress bar drawn where no terminal shows it
    back = runner.invoke(main, ["migrate", "--from", pg, "--to", str(b)])
    assert back.exit_code == 0 and "verified" in back.output, back.output
    again = runner.invoke(main, ["migrate", "--from", str(a), "--to", pg])
    assert again.exit_code == 2 and "empty store" in again.output
    first, last = store_from_url(str(a)), store_from_url(str(b))
    first.setup()
    last.setup()
    try:
        assert summarize(first) == summarize(last)
    finally:
        first.close()
        last.close()


@pytest.mark.parametrize(("source_engine", "target_engine"), [("sqlite", "postgres"), ("postgres", "sqlite")])
def test_a_migrated_output_still_finds_its_context_build(
    source_engine: str, target_engine: str, tmp_path: Path
) -> None:
    """Outputs and builds name events by number: the copy keeps the numbers, gaps included (retention
    pruned the head of the source's log here, so renumbering from 1 would point elsewhere)."""
    source_url = harness_target(source_engine, tmp_path, "src.db")
    with Harness.open(source_url, embedder=None) as h:
        for i in range(3):
            h.record(f"warm-up note {i} about nothing in particular", session_id="s0")
        engine_of(h).delete_events_upto(h.events()[-1].seq or 0)  # the log now starts after a gap
        cited = h.record("the EU regional host works for tessera charges", session_id="s1")
        ctx = h.context("tessera charges host", budget_tokens=400, session_id="s1")
        assert ctx.event_seq is not None and ctx.event_seq > 4
        short = {e.id: e for e in ctx.manifest}[cited.id].short_id
        out = record_output(h, ctx, f"Use the EU regional host [{short}].", success=True)
        want = Lens(h).influence(ctx.event_seq)
    source, target = (
        make_store(source_engine, tmp_path, "src.db"),
        make_store(target_engine, tmp_path, "dst.db"),
    )
    source.setup()
    target.setup()
    try:
        migrate(source, target)
        assert [e.seq for e in target.read_events()] == [e.seq for e in source.read_events()]
    finally:
        source.close()
        target.close()
    with Harness.open(harness_target(target_engine, tmp_path, "dst.db"), embedder=None) as copy:
        got = Lens(copy).influence(ctx.event_seq)
        assert got["output"]["seq"] == want["output"]["seq"] and out.cited == [cited.id]
        assert [x["id"] for x in got["lines"]] == [x["id"] for x in want["lines"]]
        assert engine_of(copy).append_event(Event("later")) > want["output"]["seq"]  # numbering goes on after


def test_cli_refuses_a_source_that_does_not_exist_or_holds_nothing(tmp_path: Path) -> None:
    """A mistyped --from must not "succeed" with 0 memories copied (nor leave an empty store behind)."""
    target = tmp_path / "target.db"
    runner = CliRunner()
    missing = runner.invoke(main, ["migrate", "--from", str(tmp_path / "srcc.db"), "--to", str(target)])
    assert missing.exit_code == 2 and "there is no store at" in missing.output, missing.output
    assert not (tmp_path / "srcc.db").exists() and not target.exists()
    mistyped = pg_server.store_url(tmp_path, "nosuch")  # a schema no store was ever made in
    nothing = runner.invoke(main, ["migrate", "--from", mistyped, "--to", str(target)])
    assert nothing.exit_code == 2 and "there is no store at" in nothing.output, nothing.output
    assert not target.exists()
    with psycopg.connect(split_url(mistyped)[0]) as conn:  # asking made nothing: the schema is not there
        schema = split_url(mistyped)[1]
        assert conn.execute("SELECT to_regnamespace(%s)", [schema]).fetchone() == (None,)
    made = store_from_url(mistyped)
    made.setup()  # a store set up there and left empty: there, and holding nothing
    made.close()
    nothing = runner.invoke(main, ["migrate", "--from", mistyped, "--to", str(target)])
    assert nothing.exit_code == 2 and "holds no memories, events or keys" in nothing.output, nothing.output
    assert not target.exists()


def test_a_zero_vector_an_older_version_stored_is_left_behind_and_the_rest_copied(tmp_path: Path) -> None:
    """Stores refuse a vector without a direction now; one written before would halt a copy half done
    (the target refuses it): it stays behind, uncounted, and the target embeds that memory from its text."""
    source, target = make_store("memory", tmp_path), make_store("sqlite", tmp_path, "dst.db")
    source.setup()
    target.setup()
    try:
        ms = fill(source)
        zero = np.zeros(384, dtype=np.float32)
        source._vectors[ms[3].id] = zero  # type: ignore[attr-defined]  # as an older version stored it
        source.index.set_vector(ms[3].id, zero)  # type: ignore[attr-defined]
        report = migrate(source, target, batch=5)
        assert report.vectors == len(ms) - 3 and report.source == report.target
        assert ms[3].id not in target.vectors_of([ms[3].id])
        assert {u.id for u in target.unembedded(len(ms))} == {m.id for m in ms[:2]} | {ms[3].id}
    finally:
        source.close()
        target.close()


class BothLook:
    """Holds each migration in its look at whether the target is empty until the other has looked too, or
    has ended: without a claim both then find it empty, the race two runs of ``clawvm migrate`` lose."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.looked = 0
        self.ended = 0

    def count_of(self, target: Store) -> Callable[..., int]:
        count = target.count

        def waiting_count(*args: object, **kwargs: object) -> int:
            found = count(*args, **kwargs)  # type: ignore[arg-type]
            with self.changed:
                self.looked += 1
                self.changed.notify_all()
                self.changed.wait_for(lambda: self.looked >= 2 or self.ended > 0, timeout=60)
            return found

        return waiting_count

    def end(self) -> None:
        with self.changed:
            self.ended += 1
            self.changed.notify_all()


@pytest.mark.parametrize("target_engine", ["sqlite", "postgres"])
def test_two_migrations_into_one_target_at_once_one_is_refused(
    target_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stores migrated at once into one empty target (each with a connection of its own): one copies
    and verifies, the other is refused with ClaimedError before it writes anything, and the target holds
    exactly the first one's memories (their rows mixed, and neither copy verified)."""
    sources: list[Store] = [MemoryStore(), MemoryStore()]
    targets = [make_store(target_engine, tmp_path, "dst.db") for _ in sources]
    race = BothLook()
    outcomes: list[Report | clawvm.ClawVMError | None] = [None, None]
    for source, target in zip(sources, targets, strict=True):
        source.setup()
        fill(source)
        target.setup()
        monkeypatch.setattr(target, "count", race.count_of(target))

    def run(n: int) -> None:
        try:
            outcomes[n] = migrate(sources[n], targets[n], batch=5)
        except clawvm.ClawVMError as exc:
            outcomes[n] = exc
        finally:
            race.end()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        won = [n for n, o in enumerate(outcomes) if isinstance(o, Report)]
        refused = [o for o in outcomes if isinstance(o, ClaimedError)]
        assert len(won) == 1 and len(refused) == 1, outcomes
        assert refused[0].field == "to" and "held by a migration" in refused[0].problem
        assert summarize(targets[0]) == summarize(sources[won[0]])
        check(sources[won[0]], targets[1])
        assert targets[0].held_claim() is None  # released once verified
    finally:
        for store in [*sources, *targets]:
            store.close()


KILLED_MIGRATION = """
import sys, time
from clawvm.store import store_from_url
from clawvm.store.migrate import migrate
source, target = store_from_url(sys.argv[1]), store_from_url(sys.argv[2])
source.setup()
target.setup()
copied = 0
def progress(what, n):
    global copied
    copied += n
    if copied >= 6:
        print("copied", copied, flush=True)
        time.sleep(300)  # killed here, with a part of the memories copied
migrate(source, target, batch=2, progress=progress)
"""


@pytest.mark.parametrize("target_engine", ["sqlite", "postgres"])
def test_a_migration_killed_midway_leaves_a_target_known_as_interrupted(
    target_engine: str, tmp_path: Path
) -> None:
    """kill -9 after three batches: the target holds a part of the memories and must not pass for the
    copy. Opening it (engine or harness) is refused; migrating into it again says it was interrupted and
    how to recover, through the CLI and the library alike."""
    source_url = f"sqlite:///{tmp_path / 'src.db'}"
    target_url = harness_target(target_engine, tmp_path, "dst.db")
    source = store_from_url(source_url)
    source.setup()
    ms = fill(source)
    source.close()
    opened_before = store_from_url(target_url)  # as a caller of migrate() holds its target
    opened_before.setup()
    src = Path(clawvm.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_MIGRATION, source_url, target_url],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith("copied 6")
    finally:
        child.kill()  # SIGKILL: nothing of the migration runs after it
        child.wait(timeout=60)
    try:
        assert 0 < opened_before.count() < len(ms)  # a part, which opened as it is would pass for all
        with pytest.raises(ClaimedError) as refused:
            migrate(store_from_url(source_url), opened_before)
        assert refused.value.field == "to" and "interrupted" in refused.value.problem
        assert "run the migration again" in refused.value.fix
    finally:
        opened_before.close()
    with pytest.raises(ClaimedError, match="held by a migration that has not finished"):
        store_from_url(target_url).setup()
    with pytest.raises(ClaimedError, match="interrupted"):
        Harness.open(target_url, embedder=None)
    again = CliRunner().invoke(main, ["migrate", "--from", source_url, "--to", target_url])
    assert again.exit_code == 2, again.output
    assert "to: " in again.output and "interrupted" in again.output and "again" in again.output
