"""A child process's part in the race test of opening one new store file from several processes at once.
Kept apart from the test modules so that a fork-server child starts without importing them."""

from __future__ import annotations

from typing import Any

from clawvm.store.sqlite import SQLiteStore


def open_when_told(path: str, start: Any, results: Any) -> None:
    """Wait at ``start``, open and set up the store at ``path``, put "ok" or the error on ``results``."""
    start.wait()
    try:
        store = SQLiteStore(path)
        store.setup()
        store.close()
        results.put("ok")
    except Exception as exc:  # reported to the test, which names it
        results.put(f"{type(exc).__name__}: {exc}")
