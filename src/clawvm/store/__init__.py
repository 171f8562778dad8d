"""Storage engines behind one contract (:class:`Store`), chosen by URL.

``memory://`` is the in-process reference engine; ``sqlite:///path/to/file.db`` (or a plain path) is the
embedded default; ``postgresql://user@host/db[?schema=NAME]`` is the scale-out engine (the ``postgres``
extra). Opening by URL does no I/O: call ``setup()`` (the Harness does).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from clawvm.core.errors import ConfigError
from clawvm.store.base import (
    CandidateInfo,
    Claim,
    Credential,
    CredentialConflictError,
    Edge,
    Event,
    EventFeed,
    GroupKey,
    PageKey,
    PinBudget,
    PinBudgetError,
    Query,
    QueryResult,
    Related,
    Store,
    Unembedded,
)
from clawvm.store.memory import MemoryStore
from clawvm.store.sqlite import SQLiteStore

__all__ = [
    "CandidateInfo",
    "Claim",
    "Credential",
    "CredentialConflictError",
    "Edge",
    "Event",
    "EventFeed",
    "GroupKey",
    "MemoryStore",
    "PageKey",
    "PinBudget",
    "PinBudgetError",
    "Query",
    "QueryResult",
    "Related",
    "SQLiteStore",
    "Store",
    "Unembedded",
    "store_from_url",
]


def store_from_url(target: str | Path, dim: int = 384) -> Store:
    """An engine for ``target``: ``memory://``, ``sqlite:///abs/path``, ``sqlite://rel/path`` or a path.

    SQLite takes ``?durability=full`` (fsync every commit: power-loss safe) or ``normal`` (the default:
    crash-safe), see :data:`clawvm.store.sqlite.DURABILITY`; and ``?snapshot=inline`` to write the periodic
    index snapshot under the engine's lock instead of in a forked child (see ``SNAPSHOT_MODES`` there)."""
    if not isinstance(target, str | Path):
        raise ConfigError(
            f"store target is a {type(target).__name__}: pass a file path, sqlite:///PATH, memory:// or "
            "postgresql://...",
            "db",
        )
    if isinstance(target, Path):
        return SQLiteStore(target, dim=dim)
    if not target.strip():
        # SQLite takes an empty name for a temporary file deleted on close: every write would be lost
        raise ConfigError(
            "store target is empty: name a file (memories.db), or memory:// for a store that is meant to "
            "vanish on close",
            "db",
        )
    if "://" not in target:
        _refuse_mistyped_url(target)
        _refuse_options_in_a_path(target)
        return SQLiteStore(target, dim=dim)
    url = urlparse(target)
    if url.scheme == "memory":
        return MemoryStore(dim=dim)
    if url.scheme in ("sqlite", "file"):
        path = url.netloc + url.path
        if not path:
            raise ConfigError(f"store URL {target!r} names no file", "db", fix="write sqlite:///path/to/memories.db")
        options = parse_qs(url.query)
        unknown = sorted(set(options) - {"durability", "snapshot"})
        if unknown:
            raise ConfigError(
                f"unknown option {unknown[0]!r} in {target!r}",
                "db",
                fix="SQLite takes ?durability=full|normal and ?snapshot=background|inline",
            )
        return SQLiteStore(
            path,
            dim=dim,
            durability=options.get("durability", ["normal"])[-1],
            snapshot_mode=options.get("snapshot", ["background"])[-1],
        )
    if url.scheme in ("postgresql", "postgres"):
        try:  # imported here: psycopg is an optional extra
            from clawvm.store.postgres import PostgresStore
        except ImportError as exc:
            raise ConfigError(
                f"{target!r} needs the PostgreSQL driver ({exc.name} is missing): "
                "pip install 'clawvm[postgres]'"
            ) from None
        return PostgresStore(target, dim=dim)
    raise ConfigError(
        f"unknown store URL scheme {url.scheme!r} in {target!r}: use memory://, sqlite:///PATH or postgresql://..."
    )


#: A path that starts with one of these and a colon is a URL typed with too few slashes, not a file name.
_MISTYPED_URL = re.compile(r"(?i)^(memory|sqlite|file|postgres|postgresql):(?!//)")


def _refuse_mistyped_url(target: str) -> None:
    """``memory:/`` or ``sqlite:/x.db`` read as a path made a file called ``memory:`` (or ``sqlite:``) that
    outlived the process: the caller who meant a store that vanishes on close got one that persists."""
    match = _MISTYPED_URL.match(target)
    if match is None:
        return
    scheme, rest = match.group(1).lower(), target[match.end() :]
    if scheme == "memory":
        wanted = "memory://"
    elif scheme in ("sqlite", "file") and rest:
        wanted = f"sqlite://{rest}"  # sqlite:/abs/x.db -> sqlite:///abs/x.db; sqlite:x.db -> sqlite://x.db
    elif scheme in ("sqlite", "file"):
        wanted = "sqlite:///path/to/memories.db"
    else:
        wanted = "postgresql://USER@HOST/DATABASE"
    raise ConfigError(f"store target {target!r} reads as a file name, not a URL", "db", fix=f"write {wanted}")


def _refuse_options_in_a_path(target: str) -> None:
    """``agent.db?durability=full`` read as a path made a file of that name and applied nothing: options
    are a URL's (``sqlite:///agent.db?durability=full``)."""
    path, mark, query = target.partition("?")
    if mark and set(parse_qs(query)) & {"durability", "snapshot"}:
        raise ConfigError(
            f"store target {target!r} is a file name with options, which only a URL takes",
            "db",
            fix=f"write sqlite://{path}?{query}",  # sqlite:///abs/x.db, sqlite://rel/x.db
        )
