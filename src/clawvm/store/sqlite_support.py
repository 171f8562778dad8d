"""What the SQLite engine (:mod:`clawvm.store.sqlite`) runs beside its connection: the one translation of the
driver's errors into ClawVM's, and the thread that checkpoints the write-ahead log off the write path."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clawvm.core.errors import StoreError

log = logging.getLogger("clawvm.store.sqlite")


def is_locked(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says another connection holds the lock (SQLITE_BUSY or SQLITE_LOCKED, and their
    extended codes: the primary code is the low byte), read from the driver's code, not its message."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


@contextmanager
def translated(action: str, fix: str | None = None) -> Iterator[None]:
    """sqlite3 errors raised inside as :class:`StoreError` naming ``action`` (and what to do, ``fix``) (the
    one place that knows the driver's errors)."""
    try:
        yield
    except sqlite3.Error as exc:
        # a lock is another process's doing, not the file's: the fix for a wrong file would mislead
        fits = fix is not None and not is_locked(exc)
        raise StoreError(f"sqlite {action} failed: {exc}" + (f" ({fix})" if fits else "")) from exc


class Checkpointer:
    """Copies the write-ahead log back into the database file on its own thread and connection.

    SQLite's automatic checkpoint runs inside the commit that crosses 1000 WAL pages: at 100k memories
    that was one record in ~60 stalling for 5-10 ms (``bench/recall_scale.py`` record p99). Here commits
    only count (:meth:`committed`); every ``every`` commits, and once a second, a PASSIVE checkpoint (it
    never blocks writers or readers) runs off the write path, with the GIL released while SQLite works.
    A log only starts over once a checkpoint has caught up with it between two commits, which a busy
    writer never allows; so past ``max_wal_bytes`` a TRUNCATE checkpoint waits for the writer, copies the
    little the passive ones left, and empties the log (one short stall per that many bytes written).
    """

    def __init__(self, path: str, every: int = 64, max_wal_bytes: int = 64 * 2**20) -> None:
        self.path = path
        self.every = every
        self.max_wal_bytes = max_wal_bytes
        self._commits = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="clawvm-sqlite-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        self._commits += 1
        if self._commits >= self.every:
            self._commits = 0
            self._wake.set()

    def stop(self) -> None:
        """Stop and close its connection (before the store's own closes: the last connection to close
        checkpoints the whole log and removes it)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        wal = Path(self.path + "-wal")
        try:
            while not self._stopping:
                self._wake.wait(1.0)
                self._wake.clear()
                if self._stopping:
                    break
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    if wal.exists() and wal.stat().st_size > self.max_wal_bytes:
                        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except (sqlite3.Error, OSError) as exc:  # busy or gone: the next round retries
                    log.debug("checkpoint skipped: %s", exc)
        finally:
            conn.close()


def holds_no_table(path: Path) -> bool:
    """Whether the SQLite file at ``path`` is empty (no table at all), read without writing to it. A
    directory, or a file that is not SQLite, is not judged here (the store's own open says what it is)."""
    if path.is_dir() or path.stat().st_size == 0:
        return not path.is_dir()
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables: int = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            return tables == 0
    except sqlite3.DatabaseError:
        return False
