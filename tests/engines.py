"""The storage engines every contract test runs on, and how to build each for a test.

To add an engine (e.g. PostgreSQL): append its name to ``ENGINES`` and teach :func:`make_store` and
:func:`harness_target` to build it (skipping with ``pytest.skip`` when its server is not reachable).
Every test using the ``engine``/``harness`` fixtures, or ``engine_name``, then runs on it too.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pg_server
from clawvm.harness import Harness
from clawvm.store import MemoryStore, SQLiteStore, Store, store_from_url

ENGINES: list[str] = ["memory", "sqlite", "postgres"]

_unique = itertools.count()


def make_store(name: str, directory: Path, filename: str | None = None) -> Store:
    """A new, not yet set-up engine called ``name`` whose files (if any) live in ``directory``."""
    if name == "memory":
        return MemoryStore()
    if name == "sqlite":
        return SQLiteStore(directory / (filename or f"t{next(_unique)}.db"))
    if name == "postgres":  # a schema of its own in the module's database (see pg_server.py)
        return store_from_url(pg_server.store_url(directory, filename))
    raise ValueError(f"unknown engine {name!r}")


def harness_target(name: str, directory: Path, filename: str = "h.db") -> str:
    """The ``Harness.open`` target (URL) for engine ``name``."""
    if name == "memory":
        return "memory://"
    if name == "sqlite":
        return f"sqlite:///{directory}/{filename}"
    if name == "postgres":
        return pg_server.store_url(directory, filename)
    raise ValueError(f"unknown engine {name!r}")


def engine_of(h: Harness) -> Store:
    """The engine behind ``h`` (``Harness.store`` only reads): for fixtures that write below the commit
    path, as an older version of ClawVM, another tool or store-level maintenance would have."""
    return h._store
