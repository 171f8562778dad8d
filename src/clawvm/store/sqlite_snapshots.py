"""The SQLite engine's index snapshot lifecycle: when the snapshot beside the file is read, written, checked
and owed (:class:`IndexSnapshots`, a part of :class:`clawvm.store.sqlite.SQLiteStore`).

What a snapshot holds and how it is mapped is :mod:`clawvm.store.snapshot`; how a child process writes one
is :mod:`clawvm.store.forked`. Here: open maps the snapshot (or rebuilds from the rows when there is none
usable), the engine writes one every ``snapshot_every`` changes (in a forked child by default) and on
close past a small delta, a snapshot found damaged after open (by the background check, or by a call that
failed on it: :func:`heals`) is dropped for the rows, the call run again and a sound one written at once,
and one that failed or lacks what this engine fitted is owed to the next close.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from clawvm.core.errors import ClawVMError
from clawvm.store import forked, snapshot
from clawvm.store.base import set_up_short_lived
from clawvm.store.index import SearchIndex
from clawvm.store.sqlite_support import translated

log = logging.getLogger("clawvm.store.sqlite")

#: Changes (write transactions, ``rev``) between two snapshots of the index, besides the one on close: the
#: most a reopen replays after a crash. At 100k memories a snapshot takes ~4 s to write.
SNAPSHOT_EVERY = 10_000

#: The smallest delta, as a share of the memories indexed, that ``close()`` folds into a new snapshot: a
#: smaller one is left in the rows for the next open to replay. Rewriting the snapshot costs ~45 us per
#: memory (4.7 s at 100k), replaying a changed row ~0.5 ms (1,000 rows: 0.51 s), so at 1 change in 1,000
#: memories a reopen replays for ~1% of what the rewrite would have cost. A CLI search on a 100k file (its
#: access bookkeeping is a few changes) closed in 3.8 s, rewriting the whole snapshot; now it leaves a delta.
CLOSE_DELTA_SHARE = 0.001

#: How the periodic snapshot is written: ``background`` (the default) in a forked child, so the write that
#: makes it due waits for the fork (milliseconds) and not for the snapshot (:mod:`clawvm.store.forked`);
#: ``inline`` under the engine's lock, stalling that write (~4 s at 100k memories) but using no second
#: process (the only way off Linux, see :func:`clawvm.store.forked.available`). The snapshot on close is
#: always written inline.
SNAPSHOT_MODES = ("background", "inline")

#: How many of the file's newest changes a snapshot names (its check of the file's history at open: two
#: indexed reads)
RECENT_CHANGES = 32

#: The smallest delta, as a share of the memories indexed, that ``close()`` folds into a new snapshot when
#: this process made few of its changes (a reader beside a busy writer): a reader's close rewrote the whole
#: snapshot (~4 s and ~470 MB at 100k) after every 100 rows another process wrote, to save the next open a
#: replay of ~50 ms; 2% (2,000 rows, ~1 s of replay at 100k) leaves the rewrite to the writer or to a
#: rarer reader
OTHERS_DELTA_SHARE = 0.02

#: Own write transactions remembered as runs of consecutive revs, for counting a close's own changes; past
#: this many runs (writers taking turns rev by rev) every change since the snapshot counts as this one's
OWN_RUNS = 256

#: How long ``close()`` waits for a child still writing a snapshot before killing it (~30 s is expected
#: at 1M memories); the snapshot it was writing is then written by ``close()`` itself.
SNAPSHOT_CHILD_TIMEOUT_S = 600.0


def row_digest(body: str, embedding: bytes | None) -> str:
    """A digest of a memory's stored bytes (its body and vector), as a snapshot names its newest changes:
    two copies of a file that changed one memory at one rev tell apart by it, where id and rev match."""
    digest = hashlib.blake2b(body.encode(), digest_size=16)
    digest.update(b"\0" if embedding is None else b"\1" + embedding)
    return digest.hexdigest()


R = TypeVar("R")
P = ParamSpec("P")
Engine = TypeVar("Engine", bound="IndexSnapshots")


def heals(method: Callable[Concatenate[Engine, P], R]) -> Callable[Concatenate[Engine, P], R]:
    """An engine call that a damaged index snapshot does not fail (see :meth:`IndexSnapshots._run_healed`):
    the outermost call heals, under the engine's lock; a call made inside it runs in its state (its
    transaction, the index it read from) and leaves its failure to it."""

    @functools.wraps(method)
    def call(self: Engine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            if self._in_call:
                return method(self, *args, **kwargs)
            self._in_call = True
            try:
                return self._run_healed(lambda: method(self, *args, **kwargs))
            finally:
                self._in_call = False

    return call


class IndexSnapshots(ABC):
    """The snapshot half of :class:`clawvm.store.sqlite.SQLiteStore` (a base class of it): the engine's
    state that this reads (declared below) and the connection and catch-up the engine provides."""

    path: str
    dim: int
    snapshot_every: int  # changes (revs) between two snapshots of the index
    snapshot_mode: str  # one of SNAPSHOT_MODES
    close_delta_share: float  # see CLOSE_DELTA_SHARE
    index_source: str  # how open got its index: "snapshot", or "rows" and why (diagnostics)
    indexed_schema: int  # the last schema version that changed what the index is built from
    _lock: threading.RLock
    _index: SearchIndex | None
    _rev: int
    _data_version: int
    _snapshots: forked.BackgroundSnapshots  # the periodic snapshot's writers
    _snapshot_rev: int  # the rev the newest snapshot this engine wrote or loaded is current to
    _snapshot_owed: bool  # close writes one whatever the delta (one failed, or lacks a fit)
    _verifier: snapshot.Verifier | None  # the mapped snapshot's checksums, checked after open
    _in_call: bool  # a call of the engine is running (see heals): one inside it leaves healing to it
    _failed_on_damage: bool  # the running call failed on a damaged snapshot (see _run_healed)
    _replace_snapshot: bool  # a damaged snapshot was found: a sound one is written at the end of the call
    _own_runs: list[tuple[int, int]]  # the revs of this engine's own writes (see _note_own_write)

    @property
    @abstractmethod
    def _db(self) -> sqlite3.Connection: ...  # the engine's connection, opened on first use

    @property
    @abstractmethod
    def index(self) -> SearchIndex: ...

    @abstractmethod
    def _catch_up(self) -> None: ...  # replays into the index what other connections committed

    def _open_index(self) -> tuple[SearchIndex, int]:
        """The snapshot's index and the rev it is current to; an empty index and 0 when there is no usable
        snapshot (missing, torn, corrupt, stale, another file's): then every row is replayed."""
        if self.path == ":memory:":
            self.index_source = "rows (in-memory file)"
            return SearchIndex(self.dim), 0
        db = self._db
        self._name_file(db)
        for tmp in snapshot.remove_leftovers(self.path):
            log.warning("removed %s, left by a snapshot writer that died", tmp)
        try:
            current = self._file_rev(db)
            loaded = snapshot.load(
                self.path,
                self.dim,
                self._fingerprint_at,
                current,
                self._same_history,
                verify_now=set_up_short_lived(),
            )
        except FileNotFoundError:
            self.index_source = "rows (no snapshot)"
            return SearchIndex(self.dim), 0
        except snapshot.StaleSnapshotError as exc:
            self._rename_if_restored(db, exc.rev)
            log.warning("index snapshot of %s not used, rebuilding from the rows: %s", self.path, exc)
            self.index_source = f"rows ({exc})"
            return SearchIndex(self.dim), 0
        except (OSError, ValueError, snapshot.SnapshotError) as exc:
            log.warning("index snapshot of %s not used, rebuilding from the rows: %s", self.path, exc)
            self.index_source = f"rows ({exc})"
            # removed as damaged: written again once rebuilt, not at close (others would rebuild meanwhile)
            self._replace_snapshot = isinstance(exc, snapshot.DamagedSnapshotError)
            return SearchIndex(self.dim), 0
        self.index_source = "snapshot"
        self._verifier = loaded.verifier
        return loaded.index, loaded.rev

    def snapshot_check(self, timeout: float = 60.0) -> str | None:
        """Run the background check of the mapped snapshot's checksums now (see :mod:`.snapshot`) and wait for
        it; what it found wrong, None when nothing (or when the snapshot was checked at open, or not used)."""
        verifier = self._verifier
        if verifier is None:
            return None
        verifier.hurry()  # asked for: no need to wait out the delay after open
        return verifier.wait(timeout)

    def _run_healed(self, call: Callable[[], R]) -> R:
        """Run ``call`` (the caller holds the lock); when it fails on an index mapped from a damaged snapshot
        (the arrays are checked in the background after open, so a call can reach the damage first: numpy's
        IndexError, a KeyError, an AttributeError on a garbled string), drop that index for the rows and
        run it once more: the caller gets the answer the rows give, and the damaged file is replaced."""
        self._failed_on_damage = False
        try:
            result = call()
        except Exception as exc:
            # a failed write may have healed already (it rolls back and drops the index it half changed);
            # an index dropped at the call's start (the background check had found the damage) is no
            # reason to run a call again that then failed on its own (a version conflict, say)
            if not self._failed_on_damage and (isinstance(exc, ClawVMError) or not self._healed()):
                raise
            log.warning("%s: a call failed on the damaged index snapshot (%r): run again", self.path, exc)
            # the rows' index is built now, in a read transaction: inside the write the call runs again in,
            # every other process's writer would wait out the rebuild (~20 s at 100k memories)
            self._catch_up()
            result = call()
        self._replace_damaged_snapshot()
        return result

    def _healed(self) -> bool:
        """A call failed on the index: when it is mapped from a snapshot whose checksums are not known to
        hold yet, check them now. True when they fail, and the index is then dropped for the rows."""
        verifier = self._verifier
        if verifier is None:
            return False
        verifier.hurry()
        error = verifier.wait()
        if error is None:
            return False
        self._drop_index(f"rows ({error}, found when a call failed on it)", damaged=True)
        self._failed_on_damage = True
        return True

    def _snapshot_found_damaged_after_open(self) -> bool:
        """Whether the background check found the mapped snapshot damaged (the next catch-up rebuilds)."""
        return self._verifier is not None and self._verifier.error is not None

    def _drop_damaged_snapshot(self) -> None:
        """The background check found the mapped snapshot damaged: drop its index for the rows (before the
        next operation, which replays them)."""
        if self._snapshot_found_damaged_after_open():
            assert self._verifier is not None
            self._drop_index(f"rows ({self._verifier.error}, found after open)", damaged=True)

    def _drop_index(self, source: str, damaged: bool) -> None:
        """Replace the in-process index by an empty one that the next catch-up fills from the rows
        (``source``: why, for :attr:`index_source`); ``damaged``: the snapshot failed its checksums (the
        check removed the file): a sound one is written at the end of the call, so that other processes
        map it instead of rebuilding from the rows each (17 s at 100k memories)."""
        if damaged:
            log.warning("index snapshot of %s damaged, rebuilding from the rows: %s", self.path, source)
            self._replace_snapshot = True
            self._snapshot_rev = -1  # no snapshot holds this index's rows: due at close if not written now
        if self._verifier is not None:  # nothing left to check: the mapped index is gone
            self._verifier.stop()
            self._verifier = None
        self.index_source = source
        self._index = SearchIndex(self.dim)
        self._rev, self._data_version = 0, -1

    def _replace_damaged_snapshot(self) -> None:
        """Write the snapshot a damaged one left owed (the caller holds the lock, outside a transaction):
        in a forked child by default, as the periodic one; a failure leaves it to close."""
        if not self._replace_snapshot:
            return
        self._replace_snapshot = False
        try:
            self._periodic_snapshot()
        except Exception as exc:  # the call's answer stands; close tries again (_snapshot_rev is -1)
            log.warning("index snapshot of %s not written: %s", self.path, exc)

    def _fingerprint_at(
        self, seq: int | None = None, deleted: str | None = None, since_rev: int = 0
    ) -> snapshot.Fingerprint:
        """The file's schema and the id at ``seq`` (default: the newest row's seq and id). With no row at
        ``seq``: ``deleted`` when this file deleted a memory of that id after ``since_rev`` (a snapshot
        whose newest memory was deleted since is still this file's), else None."""
        db = self._db
        schema = min(int(db.execute("PRAGMA user_version").fetchone()[0]), self.indexed_schema)
        found = db.execute("SELECT value FROM counters WHERE name = 'file_id'").fetchone()
        file_id = int(found[0]) if found else 0
        if seq is None:
            newest = db.execute("SELECT seq, id FROM memories ORDER BY seq DESC LIMIT 1").fetchone()
            last_seq, last_id = newest or (0, None)
            return snapshot.Fingerprint(file_id, schema, last_seq, last_id, self._recent_changes(db))
        row = db.execute("SELECT id FROM memories WHERE seq = ?", (seq,)).fetchone()
        if row is None and deleted is not None:
            row = db.execute(  # the tombstones since the snapshot, through their rev index
                "SELECT id FROM tombstones WHERE rev > ? AND id = ? LIMIT 1", (since_rev, deleted)
            ).fetchone()
        return snapshot.Fingerprint(file_id, schema, seq, row[0] if row else None)

    @staticmethod
    def _file_rev(db: sqlite3.Connection) -> int:
        return int(db.execute("SELECT value FROM counters WHERE name = 'rev'").fetchone()[0])

    def _rename_if_restored(self, db: sqlite3.Connection, snapshot_rev: int) -> None:
        """The snapshot is current to a newer rev than the file: the file went back in time (a backup put in
        its place). Its history from there on is another than the snapshot's, so the file takes a new id,
        which no snapshot of the old history names: left in place, the old snapshot was taken for current
        once the file's rev had climbed past it again (after a crash before the next snapshot), and hid
        every memory recorded in between. Read again first: another process may have written a snapshot
        just after this one read the file's rev (a newer snapshot, not an older file)."""
        try:
            if snapshot_rev <= self._file_rev(db):
                return
            db.execute("UPDATE counters SET value = ? WHERE name = 'file_id'", (secrets.randbits(62) + 1,))
        except sqlite3.Error as exc:  # busy or read-only: this open rebuilds all the same
            log.warning(
                "%s: file id not renewed (%s): its old snapshot is refused only while stale", self.path, exc
            )
            return
        log.warning(
            "%s is older than its index snapshot (restored from a backup?): given a new file id", self.path
        )

    @staticmethod
    def _recent_changes(db: sqlite3.Connection) -> tuple[snapshot.Change, ...]:
        """The file's newest changes (:data:`RECENT_CHANGES` of them, writes and deletes), through the rev
        indexes: what a snapshot names so that a later open can tell this history from another."""
        written = [
            snapshot.Change(i, rev, True, row_digest(body, embedding))
            for i, rev, body, embedding in db.execute(
                "SELECT id, rev, body, embedding FROM memories ORDER BY rev DESC LIMIT ?", (RECENT_CHANGES,)
            )
        ]
        deleted = [
            snapshot.Change(i, rev, False)
            for i, rev in db.execute(
                "SELECT id, rev FROM tombstones ORDER BY rev DESC LIMIT ?", (RECENT_CHANGES,)
            )
        ]
        return tuple(sorted(written + deleted, key=lambda c: -c.rev)[:RECENT_CHANGES])

    def _same_history(self, recent: Sequence[snapshot.Change], rev: int) -> bool:
        """Whether the file holds each of a snapshot's newest changes (current to ``rev``), or moved it on
        after ``rev``: in the same file a row only ever changes again later, and a delete's tombstone
        stays. A copy that went on apart, or a restored backup written to since, made other changes at
        those revs (updates and deletes leave the newest row, the other check, as it was)."""
        db = self._db
        alive = [c for c in recent if c.alive]
        found = (
            db.execute(
                f"SELECT id, rev, body, embedding FROM memories WHERE id IN ({','.join('?' * len(alive))})",
                [c.memory_id for c in alive],
            ).fetchall()
            if alive
            else []
        )
        rows = {i: r for i, r, _, _ in found}
        digests = {i: (body, embedding) for i, _, body, embedding in found}
        for c in alive:
            now = rows.get(c.memory_id)
            if now == c.rev and c.digest is not None and row_digest(*digests[c.memory_id]) != c.digest:
                return False  # the same memory changed at the same rev, to other bytes: another copy's
            if now == c.rev or (now is not None and now > rev):
                continue
            deleted_since = db.execute(
                "SELECT 1 FROM tombstones WHERE rev > ? AND id = ? LIMIT 1", (rev, c.memory_id)
            ).fetchone()
            if now is not None or deleted_since is None:
                return False
        for c in recent:
            if (
                not c.alive
                and db.execute(
                    "SELECT 1 FROM tombstones WHERE rev = ? AND id = ?", (c.rev, c.memory_id)
                ).fetchone()
                is None
            ):
                return False
        return self._no_other_changes(db, recent, rev)

    @staticmethod
    def _no_other_changes(db: sqlite3.Connection, recent: Sequence[snapshot.Change], rev: int) -> bool:
        """Whether every change the file holds after the oldest rev ``recent`` names, up to ``rev``, is one
        of them: the same file holds those or moved them past ``rev``; a copy that went on apart changed
        other memories at those revs (and could have moved the named ones on since)."""
        oldest = min(c.rev for c in recent)  # its rev may have more changes than the list kept: left out
        named = {(c.memory_id, c.rev, c.alive) for c in recent}
        written = db.execute(
            "SELECT id, rev, 1 FROM memories WHERE rev > ? AND rev <= ?", (oldest, rev)
        ).fetchall()
        deleted = db.execute(
            "SELECT id, rev, 0 FROM tombstones WHERE rev > ? AND rev <= ?", (oldest, rev)
        ).fetchall()
        return all((i, r, bool(alive)) in named for i, r, alive in written + deleted)

    def _name_file(self, db: sqlite3.Connection) -> None:
        """Give the file a random id once (a counter row), which its index snapshots name: a new file made at
        the same path never takes an old file's snapshot for its own."""
        if db.execute("SELECT 1 FROM counters WHERE name = 'file_id'").fetchone() is None:
            db.execute(
                "INSERT OR IGNORE INTO counters (name, value) VALUES ('file_id', ?)",
                (secrets.randbits(62) + 1,),
            )

    def write_snapshot(self) -> Path | None:
        """Write the index's snapshot beside the file now (atomically: a temporary file renamed over the old
        one); None for an in-memory file. Done on close, and every ``snapshot_every`` changes where
        ``snapshot_mode`` is ``inline``."""
        with self._lock, translated("snapshot"):
            if self.path == ":memory:" or self._index is None:
                return None
            # a child still writing an older one must not rename it over this one
            self._snapshots.finish(SNAPSHOT_CHILD_TIMEOUT_S)
            return self._write_snapshot(self._snapshot_view())

    def _write_snapshot(self, fingerprint: snapshot.Fingerprint) -> Path:
        """Write the snapshot of the index as it is, under the lock (the caller holds it)."""
        assert self._index is not None
        written = snapshot.write(self.path, self._index, self._rev, fingerprint)
        self._snapshot_rev, self._snapshots.lost, self._snapshot_owed = self._rev, False, False
        self._replace_snapshot = False
        return written

    def _snapshot_view(self) -> snapshot.Fingerprint:
        """The index caught up with the file, and the fingerprint of that view (caller holds the lock)."""
        if self._verifier is not None:  # a damaged base must not be copied into a new snapshot
            self._verifier.hurry()
            self._verifier.wait()
        db = self._db
        db.execute("BEGIN")  # the fingerprint and the caught-up index: one view of the file
        try:
            self._catch_up()
            return self._fingerprint_at()
        finally:
            db.execute("COMMIT")

    def _periodic_snapshot(self) -> None:
        """The snapshot due every ``snapshot_every`` changes (caller holds the lock), in a forked child
        unless ``snapshot_mode`` is ``inline``; one child at a time (a write while one runs leaves it be,
        and the next write tries again)."""
        if self.path == ":memory:" or self._index is None:
            return
        if self.snapshot_mode == "inline":
            self.write_snapshot()
            return
        if self._snapshots.busy():
            return
        with translated("snapshot"):
            fingerprint, index, rev = self._snapshot_view(), self._index, self._rev
            # a projection due is fitted here, not by snapshot.write in the child: BLAS in a forked child of
            # a process whose BLAS threads have run can wait forever on a pool that did not come across
            index.vectors.prepare()
            try:
                self._snapshots.start(lambda: snapshot.write(self.path, index, rev, fingerprint))
            except OSError as exc:  # no memory or process for a child: write it here, as inline does
                log.warning("index snapshot of %s not forked (%s): written under the lock", self.path, exc)
                self._write_snapshot(fingerprint)
                return
        # the child's snapshot pays what was owed (it fails: then it is lost, which close honours too)
        self._snapshot_rev, self._snapshot_owed, self._replace_snapshot = rev, False, False

    def snapshot_wait(self, timeout: float | None = None) -> bool | None:
        """Wait for the periodic snapshot a child is writing, if any: True when written, False when the
        child failed (the next one tries again), None when there was none or it is still running."""
        return self._snapshots.wait(timeout)

    def _snapshot_due_on_close(self) -> bool:
        """Whether ``close()`` writes a snapshot (caller holds the lock): when one is owed (the periodic one
        failed; the mapped one lacked the projection this engine fitted), when no snapshot this engine knows
        of holds the file's rows, or when the rows changed since the newest snapshot (this engine's, or the
        one on disk) are at least ``close_delta_share`` of the memories by this engine's own writes, or
        :data:`OTHERS_DELTA_SHARE` (at least that) by anyone's (fewer are replayed on the next open)."""
        if self._snapshots.lost or self._snapshot_owed:
            return True
        if self._rev == self._snapshot_rev:
            return False
        if self._snapshot_rev <= 0 or not snapshot.path_for(self.path).exists():
            return True  # rebuilt from the rows, dropped as damaged, or removed: nothing to replay onto
        # the newest snapshot on disk may be another process's, newer than the one this engine loaded
        base = max(self._snapshot_rev, self._rev_on_disk())
        assert self._index is not None
        memories = len(self._index.row_of)
        changed = self._changes_between(base + 1, self._rev)
        if changed >= max(1, int(max(OTHERS_DELTA_SHARE, self.close_delta_share) * memories)):
            return True
        own = self._own_changes_since(base)
        return own >= max(1, int(self.close_delta_share * memories))

    def _rev_on_disk(self) -> int:
        """The rev of the snapshot beside the file, or 0 when it cannot be read."""
        try:
            rev = snapshot.read_header(snapshot.path_for(self.path)).get("rev", 0)
        except (OSError, snapshot.SnapshotError):
            return 0
        return rev if isinstance(rev, int) else 0

    def _changes_between(self, first: int, last: int) -> int:
        """Rows written and deleted at revs ``first`` to ``last``, through the rev indexes."""
        found = self._db.execute(
            "SELECT (SELECT count(*) FROM memories WHERE rev BETWEEN ?1 AND ?2) + (SELECT count(*) FROM "
            "tombstones WHERE rev BETWEEN ?1 AND ?2)",
            (first, last),
        ).fetchone()[0]
        return int(found)

    def _note_own_write(self, rev: int) -> None:
        """Remember that this engine committed the change ``rev`` (runs of consecutive revs)."""
        runs = self._own_runs
        if runs and runs[-1][1] == rev - 1:
            runs[-1] = (runs[-1][0], rev)
        elif len(runs) <= OWN_RUNS:
            runs.append((rev, rev))

    def _own_changes_since(self, base: int) -> int:
        """Rows this engine changed after ``base`` (all changes since it, once its runs overflowed)."""
        runs = self._own_runs
        if len(runs) > OWN_RUNS:
            return self._changes_between(base + 1, self._rev)
        return sum(self._changes_between(max(a, base + 1), b) for a, b in runs if b > base)

    def _close_snapshots(self, connected: bool) -> None:
        """On close (caller holds the lock): wait for a child still writing (killed past
        ``SNAPSHOT_CHILD_TIMEOUT_S``: close must end), write the snapshot when due (``connected``: the file
        is open), stop the check."""
        self._snapshots.finish(SNAPSHOT_CHILD_TIMEOUT_S)
        if connected and self._index is not None:
            try:
                if self._snapshot_due_on_close():
                    self.write_snapshot()
            except Exception as exc:  # the rows are the truth: a failed snapshot costs the next open time
                log.warning("index snapshot of %s not written: %s", self.path, exc)
        if self._verifier is not None:
            self._verifier.stop()
            self._verifier = None
