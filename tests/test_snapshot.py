"""The index snapshot beside a SQLite file: open maps it and replays only what changed since; a crash
between snapshot and later writes loses nothing; a corrupt, torn, stale or foreign snapshot is detected and
rebuilt."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
import zlib
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import clawvm
from clawvm import ConflictError, Memory
from clawvm.cli import main
from clawvm.core import lexical
from clawvm.core.lexical import Analyzer
from clawvm.core.model import Filters
from clawvm.core.vectors import CODE_SHARE, RESCORE, VectorIndex
from clawvm.store import Query, SQLiteStore, mapped, sqlite_snapshots
from clawvm.store import snapshot as snap
from clawvm.store.base import short_lived
from clawvm.store.index import SearchIndex
from clawvm.store.mapped import Appended, Overlay, Strings
from clawvm.store.sqlite import INDEX_NEUTRAL_MIGRATIONS, INDEXED_SCHEMA, MIGRATIONS
from engines import engine_of

SRC = Path(__file__).resolve().parents[1] / "src"
WORDS = ["payment", "refund", "alice", "deploy", "disk", "invoice", "cache", "lisbon", "retry", "coffee"]


def memories(n: int, start: int = 0) -> list[Memory]:
    rng = np.random.default_rng(start)
    return [
        Memory(
            id=str(uuid.UUID(int=i + 1, version=4)),  # the same ids in every process
            content=" ".join(rng.choice(WORDS, 5)) + f" note {i}",
            session_id=f"s{i // 7}",
            agent_id=f"a{i % 3}",
            tenant="acme" if i % 5 == 0 else "default",  # two tenants: per-tenant BM25 statistics
            tags=["t1"] if i % 4 == 0 else [],
        )
        for i in range(start, start + n)
    ]


def vectors(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 384)).astype(np.float32)


def opened(path: Path, **kw: int) -> SQLiteStore:
    store = SQLiteStore(path, **kw)
    store.setup()
    return store


def answers(store: SQLiteStore) -> list[object]:
    """What the index answers: searches (three channels, filters), counts, pages, sessions, tags."""
    q = vectors(1, 99)[0]
    out: list[object] = []
    for text, filters in [
        ("payment refund", Filters()),
        ("alice lisbon", Filters.of(agent_id="a1")),
        ("deploy disk cache", Filters.of(session_id="s3")),
        ("coffee", Filters.of(tags=["t1"])),
        ("payment refund", Filters.of(tenant="acme")),  # scored with acme's own statistics
        ("deploy lisbon", Filters.of(tenant="default", agent_id="a2")),
    ]:
        result = store.query(Query(text=text, vector=q, limit=10, filters=filters, context=True, info=True))
        out.append((result.lexical, result.dense, result.context, result.info))
        out.append(store.count(filters))
    out.append([m.id for m in store.page(Filters(), None, 50)])
    out.append(store.session_ids(Filters(), None, 100))
    out.append(store.tag_names(Filters(), "", None, 10))
    return out


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A file with 200 memories (some updated, some deleted) and the snapshot its close left."""
    path = tmp_path / "s.db"
    store = opened(path)
    ms = memories(200)
    store.write(ms, vectors(200, 1), [])
    store.write([ms[5].model_copy(update={"content": "rewritten about lisbon", "version": 2})], None, [])
    store.delete_many([ms[7].id, ms[150].id])
    store.close()
    assert snap.path_for(str(path)).exists()
    return path


def test_open_from_the_snapshot_answers_as_a_rebuild_does(built: Path, tmp_path: Path) -> None:
    rebuilt_path = tmp_path / "copy.db"
    shutil.copy(built, rebuilt_path)  # the same rows, no snapshot beside them
    fast, slow = opened(built), opened(rebuilt_path)
    try:
        assert fast.index_source == "snapshot" and slow.index_source.startswith("rows")
        assert answers(fast) == answers(slow)
        # both keep indexing the same way after the open
        more = memories(20, start=500)
        old = fast.page(Filters(), None, 3)  # rows the snapshot holds: re-indexed, re-tagged, deleted
        changed = [
            m.model_copy(update={"content": "moved to lisbon", "tags": ["t2"], "version": m.version + 1})
            for m in old[:2]
        ]
        for store in (fast, slow):
            store.write(more, vectors(20, 2), [])
            store.write(changed, None, [])
            store.delete_many([old[2].id])
        assert answers(fast) == answers(slow)
    finally:
        fast.close()
        slow.close()
    snap.path_for(str(rebuilt_path)).unlink()
    again, rebuilt = opened(built), opened(rebuilt_path)  # a snapshot written from a loaded one reads back
    try:
        assert again.index_source == "snapshot" and rebuilt.index_source.startswith("rows")
        assert answers(again) == answers(rebuilt)
    finally:
        again.close()
        rebuilt.close()


def test_moved_and_revived_memories_read_back_as_in_a_rebuild(built: Path, tmp_path: Path) -> None:
    """Memories of the mapped base that leave their session for another (the session is deleted, then set
    again, in the overlay) and one deleted then written again read back (their rows, sessions and
    neighbours: what recall's batched reads ask for) as from an index rebuilt from the rows."""
    rebuilt_path = tmp_path / "copy.db"
    shutil.copy(built, rebuilt_path)
    fast, slow = opened(built), opened(rebuilt_path)
    try:
        assert fast.index_source == "snapshot"
        stored = fast.page(Filters(), None, 4)
        moved = [
            m.model_copy(
                update={"session_id": "elsewhere", "content": f"moved {i}", "version": m.version + 1}
            )
            for i, m in enumerate(stored[:2])
        ]
        gone = stored[2]
        for store in (fast, slow):
            store.write(moved, None, [])
            store.delete_many([gone.id])
            store.write([gone], None, [])  # the same id again: revived
        ids = tuple(m.id for m in stored)
        infos = [store.query(Query(filters=Filters(), around=ids)).info for store in (fast, slow)]
        assert infos[0] == infos[1] and set(ids) <= set(infos[0])
        assert {infos[0][m.id].session_id for m in moved} == {"elsewhere"}
    finally:
        fast.close()
        slow.close()


def test_an_empty_snapshot_takes_writes_as_a_rebuild_does(tmp_path: Path) -> None:
    """A snapshot of a file with no memory yet (a store opened to mint keys first): every mapped array is
    empty, and what the next process writes lives in the overlays alone."""
    path, plain = tmp_path / "empty.db", tmp_path / "plain.db"
    first = opened(path)
    first.write_snapshot()
    first.close()
    mapped_store, rebuilt = opened(path), opened(plain)
    try:
        assert mapped_store.index_source == "snapshot"
        same, vecs = memories(30), vectors(30, 3)
        for store in (mapped_store, rebuilt):
            store.write(same, vecs, [])
        assert answers(mapped_store) == answers(rebuilt)
    finally:
        mapped_store.close()
        rebuilt.close()


def test_a_migration_that_leaves_the_rows_alone_keeps_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file from before the ``meta`` table (a claim's place) is upgraded on open; its snapshot names the
    schema of the rows it was built from, which that migration leaves as they were, so it is still used
    (the upgrade made every file rebuild its index from the rows once, ~15 s at 100k)."""
    # every migration past the indexed schema says why the index does not depend on it (a new one that
    # changes the rows must raise INDEXED_SCHEMA instead, or old snapshots would be taken for current)
    assert sorted(INDEX_NEUTRAL_MIGRATIONS) == list(range(INDEXED_SCHEMA + 1, len(MIGRATIONS) + 1))
    path, same, vecs = tmp_path / "older.db", memories(40), vectors(40, 3)
    with monkeypatch.context() as older:  # the file and its snapshot as the version before wrote them
        older.setattr("clawvm.store.sqlite.MIGRATIONS", MIGRATIONS[:INDEXED_SCHEMA])
        first = opened(path)
        first.write(same, vecs, [])
        first.close()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == INDEXED_SCHEMA
    upgraded, rebuilt = opened(path), opened(tmp_path / "plain.db")
    try:
        assert upgraded.pragma("user_version") == len(MIGRATIONS)
        assert upgraded.index_source == "snapshot"
        rebuilt.write(same, vecs, [])
        assert answers(upgraded) == answers(rebuilt)
    finally:
        upgraded.close()
        rebuilt.close()


def test_a_snapshot_of_an_earlier_analyzer_is_rebuilt_with_this_ones_terms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot holds the terms its version's analyzer made; read with this version's queries, terms of
    another analyzer would miss (a CJK sentence stored as one term, a query asking for its bigrams). So a
    snapshot of another analyzer is not used: the index is rebuilt from the rows and written again."""
    path = tmp_path / "cjk.db"
    cjk = Memory(content="我喜欢吃苹果 and green tea", session_id="s1")

    def whole_runs(self: Analyzer, text: str) -> list[str]:  # version 1: a CJK run was one term
        return self._stemmed([w for w in lexical._TOKEN.findall(text.lower()) if w not in lexical.STOP_WORDS])

    with monkeypatch.context() as older:
        older.setattr(snap, "ANALYZER_VERSION", 1)
        older.setattr(Analyzer, "terms", whole_runs)
        first = opened(path)
        first.write([cjk, *memories(20)], vectors(21, 4), [])
        assert first.query(Query(text="苹果", limit=3)).lexical == []  # its terms missed the word
        first.close()
    reopened = opened(path)
    try:
        assert reopened.index_source.startswith("rows (terms of analyzer 1"), reopened.index_source
        hits = reopened.query(Query(text="苹果", limit=3)).lexical
        assert [hit[0] for hit in hits][:1] == [cjk.id]
    finally:
        reopened.close()
    again = opened(path)
    try:
        assert again.index_source == "snapshot"
        assert [hit[0] for hit in again.query(Query(text="苹果", limit=3)).lexical][:1] == [cjk.id]
    finally:
        again.close()


def test_writes_after_the_snapshot_are_replayed_on_open(built: Path) -> None:
    a = opened(built, snapshot_every=10**6)
    later = memories(30, start=300)
    a.write(later, vectors(30, 3), [])
    a.delete_many([later[0].id])
    b = opened(built)  # a has not closed: its writes are in the rows only
    try:
        assert b.index_source == "snapshot"
        assert b.count(Filters()) == a.count(Filters()) == 198 + 29
        assert answers(a) == answers(b)
        b.write(memories(5, start=900), None, [])  # and the processes still see each other's writes
        assert a.count(Filters()) == b.count(Filters())
    finally:
        a.close()
        b.close()


def test_close_leaves_a_small_delta_for_the_next_open_to_replay(built: Path, tmp_path: Path) -> None:
    """Below ``close_delta_share`` of the memories changed, close leaves the snapshot as it is and the next
    open replays the rows changed since; at the share, close writes a new one."""
    written_at = snap.read_header(snap.path_for(str(built)))["rev"]
    small = opened(built, close_delta_share=0.1)  # a new snapshot once a tenth of the memories changed
    small.write(memories(5, start=700), vectors(5, 4), [])
    small.delete_many([small.page(Filters(), None, 1)[0].id])
    expected = answers(small)
    small.close()
    assert snap.read_header(snap.path_for(str(built)))["rev"] == written_at  # 6 changes of 202: kept
    shutil.copy(built, tmp_path / "rows.db")  # the same rows, rebuilt
    again, rebuilt = opened(built, close_delta_share=0.1), opened(tmp_path / "rows.db")
    try:
        assert again.index_source == "snapshot" and rebuilt.index_source.startswith("rows")
        assert answers(again) == answers(rebuilt) == expected
        again.write(memories(25, start=800), vectors(25, 5), [])  # 6 + 25 changes of 227: written
    finally:
        again.close()
        rebuilt.close()
    assert snap.read_header(snap.path_for(str(built)))["rev"] > written_at
    gone = opened(built, close_delta_share=0.1)
    gone.write(memories(1, start=900), vectors(1, 6), [])
    snap.path_for(str(built)).unlink()  # removed while open: a change is enough to write one on close
    gone.close()
    assert snap.path_for(str(built)).exists()


def test_a_snapshot_whose_newest_memory_was_deleted_since_is_still_used(built: Path, tmp_path: Path) -> None:
    """The snapshot names its file by the id of the newest row it holds; that memory deleted after it (and
    the snapshot left as it was) does not make it another file's: the next open maps it and replays."""
    newest = snap.read_header(snap.path_for(str(built)))["last_id"]
    store = opened(built, close_delta_share=0.5)
    store.delete_many([newest])
    expected = answers(store)
    store.close()
    assert snap.read_header(snap.path_for(str(built)))["last_id"] == newest  # not rewritten
    shutil.copy(built, tmp_path / "rows.db")
    again, rebuilt = opened(built), opened(tmp_path / "rows.db")
    try:
        assert again.index_source == "snapshot", again.index_source
        assert answers(again) == answers(rebuilt) == expected
    finally:
        again.close()
        rebuilt.close()


CRASHING_WRITER = """
import os, signal, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from test_snapshot import memories, vectors
from clawvm.store import SQLiteStore
store = SQLiteStore(sys.argv[1], snapshot_every=10**6)
store.setup()
store.write(memories(100), vectors(100, 1), [])
store.write_snapshot()
store.write(memories(40, start=100), vectors(40, 2), [])  # the delta: in the rows, not in the snapshot
store.delete_many([memories(1)[0].id])
os.kill(os.getpid(), signal.SIGKILL)  # no close: no snapshot of the delta
"""


def test_a_writer_killed_between_snapshot_and_delta_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(path), str(Path(__file__).parent)], env=env, check=False
    )
    assert proc.returncode == -signal.SIGKILL
    header = snap.read_header(snap.path_for(str(path)))
    store = opened(path)
    try:
        assert store.index_source == "snapshot"
        assert store._rev > header["rev"]  # the delta was replayed over the snapshot
        assert store.count(Filters()) == 139
        found = store.query(Query(text=memories(1, start=139)[0].content, limit=1, filters=Filters()))
        assert found.lexical[0][0] == memories(1, start=139)[0].id  # a memory written after the snapshot
        assert memories(1)[0].id not in {i for i, _ in store.query(Query(text="note", limit=200)).lexical}
    finally:
        store.close()


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["state", "vectors", "truncated", "header"])
def test_a_corrupt_snapshot_is_detected_and_rebuilt(built: Path, tmp_path: Path, damage: str) -> None:
    shutil.copy(built, tmp_path / "clean.db")
    clean = opened(tmp_path / "clean.db")
    index = snap.path_for(str(built))
    parts = snap.read_header(index)["parts"]
    if damage == "truncated":
        index.write_bytes(index.read_bytes()[: parts["vectors"]["offset"] + 100])
    elif damage == "header":
        _flip(index, 3)
    else:
        _flip(index, parts[damage]["offset"] + parts[damage]["length"] // 2)
    store = opened(built)
    try:
        assert store.index_source.startswith("rows"), store.index_source
        assert answers(store) == answers(clean)
    finally:
        store.close()
        clean.close()
    assert opened(built).index_source == "snapshot"  # the close wrote a good one again


def test_another_files_snapshot_or_a_newer_one_is_not_used(built: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    store = opened(other)
    for m in memories(10, start=700):  # ten changes: its rev passes the snapshot's
        store.write([m], None, [])
    store.close()
    shutil.copy(snap.path_for(str(built)), snap.path_for(str(other)))  # 200 memories' index over 10 rows
    store = opened(other)
    try:
        assert store.index_source.startswith("rows (another file"), store.index_source
        assert store.count(Filters()) == 10
    finally:
        store.close()
    # a file restored from an older backup, beside the snapshot of its later state
    old = tmp_path / "old.db"
    backup = _ten_and_their_backup(old)
    later = opened(old)
    later.write(memories(10, start=10), None, [])
    later.close()
    _restore(old, backup)
    store = opened(old)
    try:
        assert store.index_source.startswith("rows (stale"), store.index_source
        assert store.count(Filters()) == 10
    finally:
        store.close()


def _ten_and_their_backup(path: Path) -> bytes:
    """A file of ten memories (and its snapshot), and its bytes as a backup would keep them."""
    early = opened(path)
    early.write(memories(10), None, [])
    early.close()
    return path.read_bytes()


def _restore(path: Path, backup: bytes) -> None:
    """Put a backup's bytes in place of the file (its log goes: the backup holds what was committed)."""
    path.write_bytes(backup)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def test_a_restored_file_never_takes_its_later_snapshot_again(tmp_path: Path) -> None:
    """Once the restored file's rev climbed past the snapshot's again (writes, then a crash before the next
    snapshot), the snapshot of the discarded history was mapped and the rows written in between were
    never replayed: they were missing from count and recall."""
    old = tmp_path / "old.db"
    backup = _ten_and_their_backup(old)
    later = opened(old)
    for m in memories(10):  # updates: the newest row (the snapshot's fingerprint) stays the backup's
        later.write([m.model_copy(update={"content": f"{m.content} changed", "version": 2})], None, [])
    later.close()  # its snapshot: current to a rev the backup never reached
    _restore(old, backup)
    first = opened(old)
    assert first.index_source.startswith("rows (stale"), first.index_source
    for m in memories(15, start=100):  # its rev passes the old snapshot's; no snapshot of its own yet
        first.write([m], None, [])
    second = opened(old)  # as the next process would after the first was killed
    try:
        assert second.index_source.startswith("rows"), second.index_source
        assert second.count(Filters()) == 25
        assert not second.query(Query(text="changed", limit=5, filters=Filters())).lexical
        text = memories(1, start=100)[0].content
        assert (
            second.query(Query(text=text, limit=1, filters=Filters())).lexical[0][0]
            == memories(1, start=100)[0].id
        )
    finally:
        second.close()
        first.close()
    reopened = opened(old)
    try:
        assert reopened.index_source == "snapshot" and reopened.count(Filters()) == 25
    finally:
        reopened.close()


def _two_copies(tmp_path: Path, n: int) -> tuple[Path, Path, list[str]]:
    """A file of ``n`` memories with its snapshot, and a copy of both: one file's two futures."""
    first = tmp_path / "x" / "s.db"
    with clawvm.Harness.open(first, embedder=None) as h:
        ids = [h.record(f"note {i} about the ledger").id for i in range(n)]
    second = tmp_path / "y" / "s.db"
    second.parent.mkdir()
    for suffix in ("", ".index"):
        shutil.copy(f"{first}{suffix}", f"{second}{suffix}")
    return first, second, ids


def test_the_snapshot_of_a_copy_that_went_on_apart_is_not_used(tmp_path: Path) -> None:
    """Two copies of one file share its id; changed by updates and deletes only, they keep its newest row
    too. The snapshot of one was mapped over the other once the other's rev had passed it: 10 memories
    missing from count, and the other's updates not found."""
    first, second, ids = _two_copies(tmp_path, 40)
    with clawvm.Harness.open(first, embedder=None) as h:
        for i in ids[:10]:
            h.forget(i)
    with clawvm.Harness.open(second, embedder=None) as h:
        for i in ids[:10]:
            h.update(i, content="qqxdiv rewritten in the second copy")
        for i in ids[10:20]:
            h.update(i, content="qqxdiv rewritten in the second copy too")
    shutil.copy(f"{first}.index", f"{second}.index")  # the first copy's snapshot beside the second
    store = opened(second)
    try:
        assert store.index_source.startswith("rows (another history"), store.index_source
        assert store.count(Filters()) == 40
        hits = store.query(Query(text="qqxdiv rewritten", limit=50, filters=Filters())).lexical
        assert len(hits) == 20
    finally:
        store.close()
    again = opened(first)  # each file's own snapshot still maps
    try:
        assert again.index_source == "snapshot" and again.count(Filters()) == 30
    finally:
        again.close()


def test_a_copy_that_changed_other_memories_and_then_the_named_ones_is_not_taken_for_this_file(
    tmp_path: Path,
) -> None:
    """The named changes alone let a copy pass that changed another memory at one of their revs and moved
    the named ones on later: its search still found the other memory's old text."""
    first, second, ids = _two_copies(tmp_path, 100)
    with clawvm.Harness.open(first, embedder=None) as h:
        h.update(ids[-1], content="the newest note, changed in the first copy")
    with clawvm.Harness.open(second, embedder=None) as h:
        h.update(ids[0], content="kiwi: the oldest note, changed in the second copy")  # the same rev
        h.update(ids[-1], content="the newest note, changed in the second copy")  # moves the named one on
    shutil.copy(f"{first}.index", f"{second}.index")
    store = opened(second)
    try:
        assert store.index_source.startswith("rows (another history"), store.index_source
        assert [i for i, _ in store.query(Query(text="kiwi", limit=5, filters=Filters())).lexical] == [ids[0]]
    finally:
        store.close()


def test_a_copy_that_changed_the_same_memory_at_the_same_rev_is_not_taken_for_this_file(
    tmp_path: Path,
) -> None:
    """Each copy updated one memory once: the same id at the same rev, other text. The check named ids and
    revs only, so the first copy's snapshot mapped over the second: its search found the other text."""
    first, second, ids = _two_copies(tmp_path, 50)
    with clawvm.Harness.open(first, embedder=None) as h:
        h.update(ids[10], content="zebratoken, written in the first copy")
    with clawvm.Harness.open(second, embedder=None) as h:
        h.update(ids[10], content="giraffetoken, written in the second copy")
    shutil.copy(f"{first}.index", f"{second}.index")
    store = opened(second)
    try:
        assert store.index_source.startswith("rows (another history"), store.index_source
        assert [
            i for i, _ in store.query(Query(text="giraffetoken", limit=5, filters=Filters())).lexical
        ] == [ids[10]]
        assert not store.query(Query(text="zebratoken", limit=5, filters=Filters())).lexical
    finally:
        store.close()
    again = opened(first)  # the same file's own snapshot, the row unchanged since: still mapped
    try:
        assert again.index_source == "snapshot"
    finally:
        again.close()


@pytest.mark.parametrize("damage", ["length", "missing rev", "rev as text", "offset as text", "no parts"])
def test_a_snapshot_header_of_the_wrong_shape_is_rebuilt(built: Path, tmp_path: Path, damage: str) -> None:
    """A damaged header length asked for exabytes (MemoryError), and valid JSON missing a field or of
    another type raised KeyError or TypeError out of every open, the CLI's too."""
    index = snap.path_for(str(built))
    data = bytearray(index.read_bytes())
    if damage == "length":
        data[len(snap.MAGIC) + 7] = 0x7F
    else:
        size = int.from_bytes(data[len(snap.MAGIC) : len(snap.MAGIC) + 8], "little")
        start = len(snap.MAGIC) + 8
        header = json.loads(data[start : start + size])
        if damage == "missing rev":
            del header["rev"]
        elif damage == "rev as text":
            header["rev"] = str(header["rev"])
        elif damage == "offset as text":
            header["parts"]["vectors"]["offset"] = str(header["parts"]["vectors"]["offset"])
        else:
            del header["parts"]
        head = json.dumps(header).encode()
        data[len(snap.MAGIC) : start] = len(head).to_bytes(8, "little")
        data[start : start + size] = head
    shutil.copy(built, tmp_path / "clean.db")
    index.write_bytes(bytes(data))
    clean, store = opened(tmp_path / "clean.db"), opened(built)
    try:
        assert store.index_source.startswith("rows (corrupt"), store.index_source
        assert answers(store) == answers(clean)
    finally:
        store.close()
        clean.close()


def test_the_temporary_file_of_a_dead_snapshot_writer_is_removed_on_open(built: Path) -> None:
    """A writer killed before its rename left a file as big as a snapshot, and nothing removed it."""
    index = snap.path_for(str(built))
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = index.with_name(f"{index.name}.{int(gone.stdout)}.1.tmp")
    mine = index.with_name(f"{index.name}.{os.getpid()}.1.tmp")  # a writer of this live process
    fresh = index.with_name(f"{index.name}.{int(gone.stdout)}.2.tmp")  # a writer another container runs
    for tmp in (dead, mine, fresh):
        tmp.write_bytes(b"part of a snapshot")
    long_ago = time.time() - snap.LEFTOVER_IDLE_S - 60
    for tmp in (dead, mine):
        os.utime(tmp, (long_ago, long_ago))
    opened(built).close()
    assert not dead.exists() and mine.exists() and fresh.exists()


def test_a_snapshot_child_outlives_the_thread_that_forked_it(tmp_path: Path) -> None:
    """Linux sends the parent-death signal when the forking *thread* ends: a snapshot made due by a thread
    that then ended (a request's, the pager's) was killed half written."""
    store = opened(tmp_path / "t.db", snapshot_every=20)
    try:
        for m in memories(19):
            store.write([m], None, [])

        def last() -> None:
            store.write(memories(1, start=19), None, [])  # makes the snapshot due: the child forks here

        thread = threading.Thread(target=last)
        thread.start()
        thread.join()
        assert store.snapshot_wait(60) is True
        assert snap.read_header(snap.path_for(str(tmp_path / "t.db")))["rev"] >= 20
    finally:
        store.close()


def test_a_snapshot_that_names_anything_but_index_parts_is_refused(built: Path, tmp_path: Path) -> None:
    """A pickle can call what it names: a planted snapshot must not run code when the file is opened."""
    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)

    index = snap.path_for(str(built))
    header = snap.read_header(index)
    payload = pickle.dumps(Planted())
    data = bytearray(index.read_bytes())
    state = header["parts"]["state"]
    data[state["offset"] : state["offset"] + len(payload)] = payload
    header["parts"]["state"] = {**state, "length": len(payload), "crc32": zlib.crc32(payload)}
    head = json.dumps(header).encode()
    data[: len(snap.MAGIC) + 8 + len(head)] = snap.MAGIC + len(head).to_bytes(8, "little") + head
    index.write_bytes(bytes(data))
    store = opened(built)
    try:
        assert "the state names posix.system" in store.index_source, store.index_source
        assert not marker.exists()
        assert store.count(Filters()) == 198
    finally:
        store.close()


def assert_reopens_from_its_snapshot(path: Path, memories_indexed: int) -> None:
    again = opened(path)
    try:
        assert again.index_source == "snapshot" and len(again.index) == memories_indexed
    finally:
        again.close()


def opened_in(path: Path, mode: str, **kw: int) -> SQLiteStore:
    store = SQLiteStore(path, snapshot_mode=mode, **kw)
    store.setup()
    return store


@pytest.mark.parametrize("mode", ["background", "inline"])
def test_a_snapshot_is_written_every_so_many_changes(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "p.db"
    store = opened_in(path, mode, snapshot_every=3)
    try:
        for i in range(2):
            store.write(memories(1, start=i), None, [])
        assert not snap.path_for(str(path)).exists()
        store.write(memories(1, start=2), None, [])
        assert store.snapshot_wait(timeout=60) is (True if mode == "background" else None)
        assert snap.read_header(snap.path_for(str(path)))["rev"] == store._rev
        assert not list(tmp_path.glob("*.tmp"))  # written to a temporary name, renamed into place
    finally:
        store.close()


def test_writes_go_on_while_a_background_snapshot_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write that makes a snapshot due returns once the child is forked; the child writes the index as
    it stood then, and a reopen from that snapshot replays the writes made meanwhile."""
    path, go = tmp_path / "w.db", tmp_path / "go"
    real_write = snap.write

    def write_when_told(*args: object) -> Path:
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:  # in the child: held until the test says
            time.sleep(0.01)
        return real_write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snap, "write", write_when_told)
    store = opened_in(path, "background", snapshot_every=3)
    listening = socket.create_server(("127.0.0.1", 0))  # as a server's: the child must not hold it open
    try:
        for i in range(3):  # one change each: the third makes the snapshot due
            store.write(memories(1, start=i), None, [])
        forked_at = store._rev
        child = store._snapshots.child
        assert child is not None and child.running() and not snap.path_for(str(path)).exists()
        for i in range(3, 10):  # not held up by the child, and past the next due point: no second child
            store.write(memories(1, start=i), None, [])
        assert store._snapshots.child is child and child.running()
        # the child keeps no descriptor of the parent's but the standard three (the socket, the database)
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{child.pid}/fd")) > 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(map(int, os.listdir(f"/proc/{child.pid}/fd"))) == [0, 1, 2]
        go.touch()
        assert store.snapshot_wait(timeout=60) is True
        older = snap.path_for(str(path)).read_bytes()
        assert snap.read_header(snap.path_for(str(path)))["rev"] == forked_at < store._rev
        expected = answers(store)
    finally:
        go.touch()
        listening.close()
        store.close()
    snap.path_for(str(path)).write_bytes(older)  # as if the process had died before closing
    again = opened(path)
    try:
        assert again.index_source == "snapshot" and answers(again) == expected
        assert len(again.index) == 10
    finally:
        again.close()


def test_close_kills_a_snapshot_writer_that_hangs_and_writes_the_snapshot_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, parent = tmp_path / "h.db", os.getpid()
    real_write = snap.write

    def hang_in_the_child(*args: object) -> Path:
        while os.getpid() != parent:
            time.sleep(0.05)
        return real_write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snap, "write", hang_in_the_child)
    monkeypatch.setattr(sqlite_snapshots, "SNAPSHOT_CHILD_TIMEOUT_S", 0.5)
    store = opened_in(path, "background", snapshot_every=2)
    store.write(memories(1), None, [])
    store.write(memories(1, start=1), None, [])
    child = store._snapshots.child
    assert child is not None and child.running()
    store.close()  # waits half a second, kills the writer, writes the snapshot here
    assert not child.running() and child.ok is False
    assert snap.read_header(snap.path_for(str(path)))["rev"] == 2


def test_a_background_snapshot_that_fails_is_written_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path, parent = tmp_path / "f.db", os.getpid()
    real_write = snap.write

    def fail_in_the_child(*args: object) -> Path:
        if os.getpid() != parent:
            raise OSError("disk full")
        return real_write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snap, "write", fail_in_the_child)
    store = opened_in(path, "background", snapshot_every=2)
    with caplog.at_level("WARNING", logger="clawvm.store.forked"):
        store.write(memories(1), None, [])
        store.write(memories(1, start=1), None, [])
        assert store.snapshot_wait(timeout=60) is False
    assert "not written" in caplog.text and not snap.path_for(str(path)).exists()
    store.close()  # the lost snapshot is written here, in this process
    assert snap.read_header(snap.path_for(str(path)))["rev"] == 2
    assert_reopens_from_its_snapshot(path, 2)


def test_a_reader_leaves_the_snapshot_to_the_writer_until_others_changed_a_larger_share(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's close rewrote the whole snapshot (~4 s, ~470 MB at 100k) once another process had changed
    1 in 1,000 memories: beside a busy writer, every CLI search paid it. Now a reader rewrites only past
    ``OTHERS_DELTA_SHARE``, and nobody rewrites what the snapshot on disk, another's, already holds."""
    monkeypatch.setattr(sqlite_snapshots, "OTHERS_DELTA_SHARE", 0.1)  # 20 of the ~200 memories
    header = snap.path_for(str(built))
    written_at = snap.read_header(header)["rev"]
    writer = opened(built)
    try:
        for m in memories(5, start=700):
            writer.write([m], None, [])
        reader = opened(built)
        assert reader.count(Filters()) == writer.count(Filters())
        reader.close()
        assert snap.read_header(header)["rev"] == written_at  # 5 changes, none its own: left to replay
        for m in memories(20, start=800):
            writer.write([m], None, [])
        late = opened(built)
        late.close()
        rewritten = snap.read_header(header)["rev"]
        assert rewritten > written_at  # 25 changes: past the share, whoever made them
        expected = writer.count(Filters())
    finally:
        writer.close()
    assert snap.read_header(header)["rev"] == rewritten  # the writer's close: the disk holds its changes
    again = opened(built)
    try:
        assert again.index_source == "snapshot" and again.count(Filters()) == expected
    finally:
        again.close()


def test_close_after_its_own_snapshot_leaves_a_small_delta(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    store = SQLiteStore(path, close_delta_share=0.5)
    store.setup()
    store.write(memories(40), None, [])
    store.write_snapshot()  # rev 1, by this engine
    store.write(memories(1, start=100), None, [])
    store.close()  # 1 change of 41: left for the next open
    assert snap.read_header(snap.path_for(str(path)))["rev"] == 1
    assert_reopens_from_its_snapshot(path, 41)


def test_a_snapshot_holds_the_projection_and_one_without_it_is_replaced_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written after bulk writes and no search, a snapshot still holds the fitted projection (else every
    open fits it again); one written without it (as an older version did) is rewritten by the next close,
    however small its delta."""
    path = tmp_path / "f.db"

    def write_unsearched(fit: bool) -> None:
        store = SQLiteStore(path, close_delta_share=1.0)
        store.setup()
        store.index.vectors.exact_below = 50  # kept in the snapshot: the projection is due from 50 rows
        store.write(memories(120), vectors(120, 8), [])
        if not fit:
            monkeypatch.setattr(VectorIndex, "prepare", lambda self: False)
        store.close()
        monkeypatch.undo()

    write_unsearched(fit=True)
    assert "projected" in snap.read_header(snap.path_for(str(path)))["parts"]
    again = opened(path, close_delta_share=1.0)
    assert again.index_source == "snapshot" and again.index.vectors._fitted_at == 120  # mapped, not refit
    again.close()

    path.unlink()
    snap.path_for(str(path)).unlink()
    write_unsearched(fit=False)
    written = snap.read_header(snap.path_for(str(path)))
    assert "projected" not in written["parts"]
    reopened = opened(path, close_delta_share=1.0)  # fits at open: the snapshot lacked it
    assert reopened.index_source == "snapshot" and reopened.index.vectors._fitted_at == 120
    reopened.close()  # nothing changed, but the fit is owed to the snapshot
    assert "projected" in snap.read_header(snap.path_for(str(path)))["parts"]

    path.unlink()  # owed once more, and paid by a periodic snapshot this time
    snap.path_for(str(path)).unlink()
    write_unsearched(fit=False)
    paying = opened_in(path, "background", snapshot_every=2)  # (close_delta_share: the default)
    paying.close_delta_share = 1.0
    paying.write(memories(2, start=600), vectors(2, 11), [])
    paying.write(memories(1, start=700), vectors(1, 12), [])  # the periodic snapshot: it pays the debt
    assert paying.snapshot_wait(timeout=60) is True
    paid = snap.path_for(str(path)).stat().st_ino  # a snapshot is written aside and renamed over
    paying.close()  # nothing owed any more, and nothing changed since: not written again
    assert snap.path_for(str(path)).stat().st_ino == paid


def test_a_forked_snapshot_gets_a_projection_fitted_before_the_fork(tmp_path: Path) -> None:
    """A projection due when the periodic snapshot forks is fitted in this process first: the child only
    writes (BLAS in a forked child of a process whose BLAS threads ran can hang)."""
    path = tmp_path / "f.db"
    store = opened_in(path, "background", snapshot_every=2)
    try:
        store.index.vectors.exact_below = 50
        store.write(memories(120), vectors(120, 9), [])
        assert store.index.vectors._proj is None  # no search yet: nothing fitted
        store.write(memories(1, start=500), vectors(1, 10), [])  # the second change: the snapshot forks
        assert store.index.vectors._proj is not None  # fitted here, before the fork
        assert store.snapshot_wait(timeout=60) is True
        assert "projected" in snap.read_header(snap.path_for(str(path)))["parts"]
    finally:
        store.close()


def test_an_inline_snapshot_that_fails_is_owed_by_close_whatever_the_delta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.db"
    store = SQLiteStore(path, snapshot_mode="inline", snapshot_every=3, close_delta_share=1.0)
    store.setup()
    store.write(memories(40), None, [])
    store.write_snapshot()  # rev 1
    real_write, failures = snap.write, []

    def fail_once(*args: object) -> Path:
        if not failures:
            failures.append(args)
            raise OSError("disk full")
        return real_write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snap, "write", fail_once)
    for i in range(3):  # the third change makes the periodic one due: it fails, the write stands
        store.write(memories(1, start=100 + i), None, [])
    assert failures and len(store.index) == 43
    store.close()  # 3 changes of 43 is under close_delta_share=1.0, but the failed snapshot is owed
    assert snap.read_header(snap.path_for(str(path)))["rev"] == 4


def test_a_new_file_at_the_same_path_does_not_take_the_old_files_snapshot(tmp_path: Path) -> None:
    path, other = tmp_path / "same.db", tmp_path / "made elsewhere.db"
    first = memories(3)
    for target, batch in ((path, first), (other, [m.model_copy(update={"content": "other"}) for m in first])):
        store = opened(target)
        store.write(batch, None, [])  # the same ids, rows and rev: only the files' own ids differ
        store.close()
    for suffix in ("-wal", "-shm"):
        assert not Path(f"{other}{suffix}").exists()
    other.replace(path)  # the old snapshot stays beside the new file
    store = opened(path)
    try:
        assert store.index_source.startswith("rows (another file"), store.index_source
        assert not store.query(Query(text=first[0].content, limit=5)).lexical
    finally:
        store.close()


def test_a_snapshot_of_an_index_of_another_shape_is_rebuilt(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version that adds a field to the index (per-tenant statistics, say) must not load an older
    snapshot without it."""
    from clawvm.store.index import SearchIndex

    original = SearchIndex.__init__

    def with_a_new_field(self: SearchIndex, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        self.per_tenant_stats = {}  # type: ignore[attr-defined]

    monkeypatch.setattr(SearchIndex, "__init__", with_a_new_field)
    store = opened(built)
    try:
        assert "changed shape" in store.index_source, store.index_source
        assert store.count(Filters()) == 198
    finally:
        store.close()


def _recalls(h: clawvm.Harness) -> list[object]:
    """Default-preset recall of a few queries (query vectors given): ids, fused scores and channels."""
    out: list[object] = []
    for n, text in enumerate(["payment refund", "alice lisbon deploy", "coffee cache retry", "invoice"]):
        q = vectors(1, 40 + n)[0]
        for filters in (h.filters({}), h.filters({"session_id": "s3"})):
            hits = h.recall_with(text, q, 10, h.config, filters)
            out.append([(r.id, round(r.score, 6), sorted(r.explain)) for r in hits])
    return out


def test_recall_on_a_mapped_snapshot_matches_a_rebuilt_index(tmp_path: Path) -> None:
    """Recall through the harness on 300 memories (sessions, tags, entities): the same hits and scores from
    an index opened from its snapshot as from one rebuilt from the rows, before and after more writes."""
    path = tmp_path / "h.db"
    h = clawvm.Harness.open(path, embedder=None)
    words = [*WORDS, "Alice", "Bob", "Lisbon"]
    vs = vectors(300, 7)
    for i in range(300):
        text = " ".join(words[(i * k) % len(words)] for k in (1, 3, 7, 11))
        h.record(text, embedding=vs[i], session_id=f"s{i % 12}", tags=[f"t{i % 5}"], kind="observation")
    h.close()
    shutil.copy(path, tmp_path / "copy.db")
    fast = clawvm.Harness.open(path, embedder=None)
    slow = clawvm.Harness.open(tmp_path / "copy.db", embedder=None)
    try:
        assert engine_of(fast).index_source == "snapshot", engine_of(fast).index_source  # type: ignore[attr-defined]
        assert engine_of(slow).index_source.startswith("rows")  # type: ignore[attr-defined]
        first = _recalls(fast)
        assert all(first[::2]), "every unfiltered query finds something"
        assert first == _recalls(slow)
        more = [m.model_copy(update={"session_id": "s3", "tenant": "default"}) for m in memories(20, 900)]
        some = fast.store.page(Filters(), None, 4)  # rows of the mapped base: re-indexed, deleted
        changed = [m.model_copy(update={"content": "refund for Bob", "version": m.version + 1}) for m in some]
        for h in (fast, slow):  # the same writes to both: on the mapped one they land in its overlays
            engine_of(h).write(more, vs[:20], [])
            engine_of(h).write(changed[:3], None, [])
            engine_of(h).delete_many([changed[3].id])
        assert _recalls(fast) == _recalls(slow)
    finally:
        fast.close()
        slow.close()


def test_damage_found_after_open_rebuilds_from_the_rows(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big snapshot's arrays are checked after open, in the background: damage found then makes the
    engine rebuild from the rows before its next operation."""
    monkeypatch.setattr(snap, "EAGER_VERIFY_BYTES", 0)
    monkeypatch.setattr(snap, "VERIFY_DELAY_S", 0.0)
    shutil.copy(built, tmp_path / "clean.db")
    clean = opened(tmp_path / "clean.db")
    index = snap.path_for(str(built))
    part = snap.read_header(index)["parts"]["post.rows"]
    _flip(index, part["offset"] + part["length"] // 2)
    store = opened(built)
    try:
        assert store.index_source == "snapshot"  # the header, the state and the sizes are sound
        assert (store.snapshot_check() or "").startswith("corrupt: post.rows"), store.snapshot_check()
        assert answers(store) == answers(clean)
        assert store.index_source.startswith("rows (corrupt"), store.index_source
    finally:
        store.close()
        clean.close()
    again = opened(built)  # the close wrote a sound snapshot
    try:
        assert again.index_source == "snapshot" and again.snapshot_check() is None
    finally:
        again.close()


def test_a_read_that_fails_on_damage_not_yet_found_is_answered_from_the_rows(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read before the background check (a CLI call exits sooner) raised numpy's IndexError out of every
    search, then a StoreError asking to run the call again; it checks the snapshot, rebuilds from the rows,
    answers as a rebuilt index does, and replaces the damaged file at once."""
    monkeypatch.setattr(snap, "EAGER_VERIFY_BYTES", 0)
    monkeypatch.setattr(snap, "VERIFY_DELAY_S", 3600.0)  # the background check would come too late
    shutil.copy(built, tmp_path / "clean.db")
    clean = opened(tmp_path / "clean.db")
    index = snap.path_for(str(built))
    part = snap.read_header(index)["parts"]["post.rows"]
    data = bytearray(index.read_bytes())
    data[part["offset"] : part["offset"] + 8 * 64] = np.full(64, 10**12, dtype=np.int64).tobytes()
    index.write_bytes(bytes(data))
    store = opened(built)
    try:
        assert store.index_source == "snapshot"
        for word in sorted({w for m in memories(200) for w in m.content.split()}):  # every term's postings
            q = Query(text=word, limit=5, filters=Filters())
            assert store.query(q).lexical == clean.query(q).lexical
        assert store.index_source.startswith("rows (corrupt: post.rows"), store.index_source
        assert answers(store) == answers(clean)
        assert store.snapshot_wait(60) is True  # the sound snapshot, written by a child at once
        assert snap.read_header(index)["rev"] == store._rev
    finally:
        store.close()
        clean.close()


def test_an_overlay_reads_through_to_its_base_and_keeps_its_own_writes() -> None:
    """The dict the mapped index holds: base answers, writes and deletes over it, the count, the pairs."""
    base = {1: "a", 2: "b", 3: "c"}
    counted: list[int] = []

    def count() -> int:
        counted.append(1)
        return len(base)

    m = Overlay(base.get, lambda: iter(base), count, lambda: iter(base.items()))
    assert m.get(2) == "b" and 9 not in m and not counted  # reads do not count the base
    m[2] = "B"  # replaces a base value: the count stays
    m[4] = "d"  # a new key
    del m[1]
    assert counted == [1] and len(m) == 3
    with pytest.raises(KeyError):
        del m[1]
    m[1] = "again"
    assert m.pop(3) == "c" and m.pop(3, None) is None
    assert dict(mapped.items(m)) == {1: "again", 2: "B", 4: "d"} == {k: m[k] for k in m}
    assert len(m) == 3 and base == {1: "a", 2: "b", 3: "c"}  # the base is never written


def test_an_overlay_asks_its_base_once_for_a_key_it_reads_then_sets() -> None:
    """The index reads a new key, then sets it (a new memory's id, a term first seen): one base lookup."""
    base = {1: "a"}
    asked: list[int] = []

    def lookup(key: int) -> str | None:
        asked.append(key)
        return base.get(key)

    m = Overlay(lookup, lambda: iter(base), len(base))
    assert m.get(5) is None and 5 not in m
    m[5] = "e"
    assert asked == [5] and m[5] == "e" and len(m) == 2
    del m[5]
    assert m.get(5) is None and len(m) == 1 and asked == [5]  # deleted: the base is not asked again
    assert m.get(1) == "a" and asked == [5, 1]


def test_an_appended_list_reads_its_base_and_keeps_its_own_writes() -> None:
    items = Appended(lambda i: f"row{i}", 3, lambda: [f"row{i}" for i in range(3)])
    items.append("new")
    items[1] = None
    assert len(items) == 4 and items[-1] == "new" and items[0] == "row0" and items[1] is None
    assert list(items) == ["row0", None, "row2", "new"]
    with pytest.raises(IndexError):
        items[4]
    table = Strings(*Strings.pack(["x", "yz", "é"]), *Strings.lookup(["x", "yz", "é"]))
    assert [table.find(s) for s in ("é", "yz", "x", "w")] == [2, 1, 0, -1] and list(table) == ["x", "yz", "é"]


def test_batched_reads_answer_as_one_read_per_item() -> None:
    """What recall reads a few hundred at a time (ids, creation times, sessions, rows of ids) comes from one
    batched read of the mapped base, with the overlay's writes, deletes and appended items over it."""
    words = ["x", "yz", "é", "", "long" * 30]
    table = Strings(*Strings.pack(words), *Strings.lookup(words))
    at = [4, 0, 2, 2, 3, 1]
    assert table.take(at) == [table[i] for i in at] == [words[i] for i in at]
    assert table.find_many(["é", "nope", "x", "long" * 30]) == [2, -1, 0, 4]
    # "yz" filed first under the hash of "x" (as a second string with that hash would be): the batched
    # search confirms its candidate, and on a mismatch walks the chain as find does
    h = mapped.key_of("x")
    clash = Strings(*Strings.pack(words), np.array([h, h]), np.array([1, 0]))
    assert clash.find_many(["x", "w"]) == [clash.find("x"), -1] == [0, -1]

    items = Appended(lambda i: f"row{i}", 4, None, lambda rows: [f"row{i}" for i in rows])
    items.append("new")
    items[1] = "set"
    rows = [4, 1, 0, 3, 4]
    assert items.take(rows) == [items[i] for i in rows] == ["new", "set", "row0", "row3", "new"]
    only_tail = Appended(lambda i: "never", 0, None, lambda rows: ["never" for _ in rows])
    only_tail.append("a")
    assert only_tail.take([0, 0]) == ["a", "a"]
    assert mapped.take(["p", "q"], [1, 0]) == ["q", "p"]  # a plain list (a rebuilt index) reads as it is

    base = {1: "a", 2: "b", 3: "c"}
    asked: list[list[int]] = []

    def many(keys: list[int]) -> list[str | None]:
        asked.append(keys)
        return [base.get(k) for k in keys]

    m = Overlay(base.get, lambda: iter(base), len(base), None, many)
    m[2] = "B"
    del m[3]
    m[7] = "new"
    del m[1]
    m[1] = "back"  # deleted, then set again (a memory that leaves its session and joins another)
    keys = [1, 2, 3, 7, 9]
    assert m.get_many(keys) == [m.get(k) for k in keys] == ["back", "B", None, "new", None]
    assert asked == [keys]  # one base read for the batch
    assert mapped.get_many({1: "z"}, [1, 2]) == ["z", None]


def test_a_snapshot_written_over_an_unchecked_one_checks_it_first(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background check waits a while after open; a snapshot written before then (a close after a
    write) runs it at once instead of waiting, and a damaged base is rebuilt, not copied."""
    monkeypatch.setattr(snap, "EAGER_VERIFY_BYTES", 0)
    monkeypatch.setattr(snap, "VERIFY_DELAY_S", 600.0)
    index = snap.path_for(str(built))
    part = snap.read_header(index)["parts"]["sess.rows"]
    _flip(index, part["offset"] + part["length"] // 2)
    store = opened(built)
    assert store.index_source == "snapshot"
    store.write(memories(1, start=800), None, [])
    store.close()  # no ten-minute wait: the check ran now, found the damage, and the rows were replayed
    assert store.index_source.startswith("rows (corrupt: sess.rows"), store.index_source
    again = opened(built)
    try:
        assert again.index_source == "snapshot"
        assert again.count(Filters()) == 199
        assert again.snapshot_check() is None  # the new snapshot is sound (checked now, delay or not)
    finally:
        again.close()


def test_a_projected_index_with_sign_codes_reads_back_and_grows_as_the_original(tmp_path: Path) -> None:
    """Above ``exact_below`` the snapshot holds the projection and the sign codes: searches on the mapped
    index answer as on the one written, and so do rows added after the open (into the spare rows the
    snapshot leaves, then past them)."""
    rng = np.random.default_rng(11)
    written = SearchIndex(384)
    written.vectors = VectorIndex(384, exact_below=50, rescore=20, code_share=0.1)
    x = rng.standard_normal((1500, 384)).astype(np.float32)
    written.vectors.add(np.arange(1500), x)
    written.vectors.prepare()
    mark = snap.Fingerprint(file_id=1, schema=1, last_seq=0, last_id=None)
    snap.write(str(tmp_path / "v.db"), written, 1, mark)
    read = snap.load(str(tmp_path / "v.db"), 384, lambda _seq, *_: mark, 1).index.vectors
    assert read._codes is not None and read.exact_below == 50
    # the search settings are the running code's, whatever the writer used: a mapped index searches as a
    # rebuilt one would
    assert (read.rescore, read.code_share) == (RESCORE, CODE_SHARE)
    read.rescore, read.code_share = written.vectors.rescore, written.vectors.code_share
    assert np.array_equal(read._codes[:, :1500], written.vectors._codes[:, :1500])

    def searches(v: VectorIndex) -> list[list[tuple[int, float]]]:
        return [v.search(q, 10) for q in np.random.default_rng(12).standard_normal((8, 384))]

    assert searches(read) == searches(written.vectors)
    for v in (read, written.vectors):
        v.add(np.arange(1500, 1600), x[:100] + 0.01)  # within the spare rows
        v.add([9000], x[7:8])  # past them: the matrices and the codes grow
    assert searches(read) == searches(written.vectors)
    assert read.search(x[7], 2)[0][0] in (7, 9000)


def test_a_fifo_where_the_snapshot_belongs_is_no_snapshot_and_open_does_not_wait_on_it(built: Path) -> None:
    """A FIFO at ``<db>.index`` made every open wait for a writer to the pipe, forever."""
    index = snap.path_for(str(built))
    index.unlink()
    os.mkfifo(index)
    opened_store: list[SQLiteStore] = []
    opener = threading.Thread(target=lambda: opened_store.append(opened(built)), daemon=True)
    opener.start()
    opener.join(20)
    assert opened_store, "open waited on the FIFO"
    store = opened_store[0]
    try:
        assert store.index_source == "rows (not a regular file)", store.index_source
        assert store.count(Filters()) == 198
    finally:
        store.close()  # replaces the FIFO with a snapshot (renamed over it)
    assert index.is_file() and opened(built).index_source == "snapshot"


def _fill(path: Path, part: str, byte: int = 0x7F) -> None:
    """Overwrite one part of a snapshot whole (as the trial did): its checksum fails, its values are huge."""
    info = snap.read_header(path)["parts"][part]
    with open(path, "r+b") as f:
        f.seek(info["offset"])
        f.write(bytes([byte]) * info["length"])


def _damaged_unchecked(built: Path, part: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``built``'s snapshot with ``part`` damaged, mapped as a big one is: checked only long after open."""
    monkeypatch.setattr(snap, "EAGER_VERIFY_BYTES", 0)
    monkeypatch.setattr(snap, "VERIFY_DELAY_S", 3600.0)
    index = snap.path_for(str(built))
    _fill(index, part)
    return index


def test_a_call_that_fails_on_its_own_after_damage_was_dropped_is_not_run_again(
    built: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The background check found the damage; the next call drops the index at its start, then fails on
    its own (a stale version): its ConflictError is raised as it is, the call run once, with no "run again"
    (the call ran a second time, and the log blamed the snapshot)."""
    _damaged_unchecked(built, "vectors", monkeypatch)
    store = opened(built)
    try:
        assert store.snapshot_check() is not None  # found, not yet acted on
        stale = memories(200)[3]  # as first written: version 1, stored already
        with caplog.at_level("WARNING"), pytest.raises(ConflictError):
            store.write([stale.model_copy(update={"content": "again"})], None, [])
        assert "run again" not in caplog.text and "found after open" in caplog.text
        assert store.get_many([stale.id])[stale.id].content == stale.content
    finally:
        store.close()


def test_the_rows_index_after_damage_is_built_outside_the_write_lock(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write after damage was found rebuilds the index from the rows first, in a read transaction: inside
    its write transaction every other process's writer waited out the rebuild (~20 s at 100k memories)."""
    _damaged_unchecked(built, "vectors", monkeypatch)
    store = opened(built)
    during: list[str] = []
    replay = SQLiteStore._replay

    def probing(self: SQLiteStore, db: sqlite3.Connection) -> None:
        if self._rev == 0 and not during:  # the rebuild from the rows begins: may another writer write?
            other = sqlite3.connect(built, timeout=0)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
                during.append("another writer wrote")
            except sqlite3.OperationalError as exc:
                during.append(str(exc))
            finally:
                other.close()
        replay(self, db)

    monkeypatch.setattr(SQLiteStore, "_replay", probing)
    try:
        assert store.snapshot_check() is not None
        store.write(memories(1, start=900), None, [])
        assert during == ["another writer wrote"]
        assert store.count(Filters()) == 199
    finally:
        store.close()


@pytest.mark.parametrize(
    ("part", "call"),
    [
        ("col.kind.v.s.at", "record"),  # IndexError out of index.upsert
        ("sess.s.off", "update"),  # KeyError ('', '')
        ("lex.group", "update"),  # KeyError out of the lexical index's per-tenant counts
        ("ids.null", "query"),  # AttributeError: a garbled id read as None
    ],
)
def test_a_call_that_fails_on_damage_not_yet_found_is_answered_from_the_rows(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: str, call: str
) -> None:
    """Writes and reads that reached a damaged array before the background check raised a bare IndexError,
    KeyError or AttributeError (every CLI call the same, the file never replaced), and ``index_source``
    still said ``snapshot``: the call checks the snapshot, rebuilds from the rows, runs once more and
    answers; the damaged file is replaced at once."""
    shutil.copy(built, tmp_path / "clean.db")
    clean = opened(tmp_path / "clean.db")
    index = _damaged_unchecked(built, part, monkeypatch)
    store = opened(built)
    ms = memories(200)
    try:
        assert store.index_source == "snapshot"
        if call == "record":
            new = memories(1, start=900)
            store.write(new, None, [])
            clean.write(new, None, [])
        elif call == "update":
            changed = [ms[3].model_copy(update={"content": "rewritten about a kiwi", "version": 2})]
            store.write(changed, None, [])
            clean.write(changed, None, [])
        elif call == "query":
            q = Query(text="payment refund", limit=10, filters=Filters())
            assert store.query(q).lexical == clean.query(q).lexical
        assert store.count(Filters.of(session_id="s3")) == 7
        assert store.index_source.startswith(f"rows (corrupt: {part} fails its checksum"), store.index_source
        assert answers(store) == answers(clean)
        assert store.snapshot_wait(60) is not False
        assert snap.read_header(index)["rev"] == store._rev  # a sound snapshot in the damaged one's place
    finally:
        store.close()
        clean.close()
    again = opened(built)
    try:
        assert again.index_source == "snapshot" and again.snapshot_check() is None
    finally:
        again.close()


def test_an_open_whose_delta_fails_on_damage_not_yet_found_rebuilds_from_the_rows(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows written since the snapshot are replayed into the mapped index at open: a damaged array
    failed that replay, and with it every open of the file."""
    writer = SQLiteStore(built, close_delta_share=1.0)  # its close leaves the delta in the rows
    writer.setup()
    writer.write(memories(3, start=900), None, [])
    writer.close()
    _damaged_unchecked(built, "col.kind.v.s.at", monkeypatch)
    store = opened(built)
    try:
        assert store.index_source.startswith("rows (corrupt: col.kind.v.s.at"), store.index_source
        assert store.count(Filters()) == 201
    finally:
        store.close()


def test_a_write_that_fails_half_way_says_the_index_was_rebuilt(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that failed after changing the index rebuilt it from the rows, and ``index_source`` went on
    saying ``snapshot``."""
    store = opened(built)
    try:
        assert store.index_source == "snapshot"

        upsert = SearchIndex.upsert

        def fail_once(self: SearchIndex, m: Memory) -> None:
            monkeypatch.setattr(SearchIndex, "upsert", upsert)
            raise RuntimeError("the index failed half way")

        monkeypatch.setattr(SearchIndex, "upsert", fail_once)
        with pytest.raises(RuntimeError, match="half way"):
            store.write(memories(1, start=900), None, [])
        assert store.index_source.startswith("rows (rebuilt: a write failed"), store.index_source
        assert store.count(Filters()) == 198
    finally:
        store.close()


def test_damage_the_background_check_finds_is_removed_and_replaced_at_once(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived process that found the damage rebuilt its own index but left the damaged file in place
    until its close: every other process mapped it again meanwhile. The check removes it at once, and the
    next call writes a sound one."""
    monkeypatch.setattr(snap, "EAGER_VERIFY_BYTES", 0)
    index = snap.path_for(str(built))
    _fill(index, "sess.rows")
    store = opened(built)
    try:
        assert (store.snapshot_check() or "").startswith("corrupt: sess.rows")
        assert not index.exists()  # no other process maps it again
        assert store.count(Filters.of(session_id="s3")) == 7
        assert store.index_source.startswith("rows (corrupt: sess.rows"), store.index_source
        assert store.snapshot_wait(60) is not False
        other = opened(built)
        try:
            assert other.index_source == "snapshot" and other.snapshot_check() is None
        finally:
            other.close()
    finally:
        store.close()


_CLI_ON_A_BIG_FILE = """
import sys
from clawvm.store import snapshot
snapshot.EAGER_VERIFY_BYTES, snapshot.VERIFY_DELAY_S = 0, 3600.0  # mapped as a big file is: unchecked
from clawvm.cli import main
main(sys.argv[1:])
"""


def test_a_cli_call_after_another_process_found_the_damage_succeeds(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived process found a big snapshot damaged and rebuilt its own index; CLI calls beside it
    mapped the damaged file and failed (IndexError) until that process closed."""
    monkeypatch.setattr(snap, "EAGER_VERIFY_BYTES", 0)
    _fill(snap.path_for(str(built)), "col.kind.v.s.at")
    server = opened(built)
    try:
        assert (server.snapshot_check() or "").startswith("corrupt: col.kind.v.s.at")
        env = {**os.environ, "PYTHONPATH": str(SRC)}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "-c", _CLI_ON_A_BIG_FILE, "--db", str(built), "--no-embed", *args]
            return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

        for n in range(2):
            added = cli("add", f"written beside the server {n}", "--session", "s3")
            assert added.returncode == 0, added.stderr[-500:]
        found = cli("search", "beside the server", "-k", "5", "--session", "s3")
        assert found.returncode == 0 and found.stdout.count("written beside the server") == 2, found
        assert server.count(Filters.of(session_id="s3")) == 9  # the server sees the CLI's writes
    finally:
        server.close()


def test_a_short_lived_process_checks_the_snapshot_before_it_answers(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI call exits before the background check: on a damaged big snapshot its searches with
    --session found nothing and count(session_id=) was 0, call after call, with no error. A process that
    says it is short-lived (the CLI does) checks every checksum at open."""
    index = _damaged_unchecked(built, "sess.s.off", monkeypatch)
    with short_lived():
        store = opened(built)
    try:
        assert store.index_source.startswith("rows (corrupt: sess.s.off"), store.index_source
        assert store.count(Filters.of(session_id="s3")) == 7
        assert store.snapshot_wait(60) is not False  # the damaged file replaced at once
        assert snap.read_header(index)["rev"] == store._rev
    finally:
        store.close()
    _fill(index, "sess.s.off")  # and the CLI says it is short-lived
    result = CliRunner().invoke(
        main, ["--db", str(built), "--no-embed", "search", "note 23", "--session", "s3"]
    )
    assert result.exit_code == 0 and "note 23" in result.output, result.output
