"""A store that refuses one kind of event, as a full disk or a killed process would fail the write that
carries it: for tests that a change and its event are stored together or not at all."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def events_refused(db: Path, kind: str) -> Iterator[None]:
    """While inside, the SQLite file ``db`` refuses every transaction that logs an event of ``kind`` (a
    trigger aborts it, so nothing of that transaction is stored)."""
    trigger = "refuse_" + kind.replace(".", "_")  # (our own kinds: no quote to escape)
    with contextlib.closing(sqlite3.connect(db)) as side:
        side.execute(
            f"CREATE TRIGGER {trigger} BEFORE INSERT ON events WHEN NEW.kind = '{kind}'"
            " BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        )
        side.commit()
    try:
        yield
    finally:
        with contextlib.closing(sqlite3.connect(db)) as side:
            side.execute(f"DROP TRIGGER {trigger}")
            side.commit()
