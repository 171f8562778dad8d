"""One exception tree for everything ClawVM raises.

Callers catch :class:`ClawVMError` for "anything from us", or one of the specific subclasses. Driver
errors (sqlite3, onnxruntime, ...) never escape raw: each engine translates them at its boundary into
:class:`StoreError` (or a more specific subclass) so the layers above stay engine-agnostic.
"""

from __future__ import annotations


class ClawVMError(Exception):
    """Base class of every error ClawVM raises on purpose."""


class NotFoundError(ClawVMError, LookupError):
    """A memory (or other object) with the given id does not exist."""

    def __init__(self, what: str, ident: str) -> None:
        super().__init__(f"{what} {ident!r} not found")
        self.what = what
        self.ident = ident


class ConflictError(ClawVMError):
    """An optimistic-locking check failed: the stored version is not the one the writer expected."""

    def __init__(self, ident: str, expected: int | None, actual: int | None) -> None:
        super().__init__(
            f"memory {ident!r} is at version {actual}, not {expected}: re-read it and retry the update"
        )
        self.ident = ident
        self.expected = expected
        self.actual = actual


class ValidationError(ClawVMError, ValueError):
    """Input was rejected before anything was written. ``field`` names the offending field."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(f"{field}: {problem} ({fix})")
        self.field = field
        self.problem = problem
        self.fix = fix


class StoreError(ClawVMError):
    """The storage engine failed (I/O, corruption, locked database, ...)."""


class SchemaError(StoreError):
    """The database schema is newer than this version of ClawVM understands, or a migration failed."""


class EmbedderError(ClawVMError):
    """The embedding model could not be loaded or failed to encode."""


class ConfigError(ClawVMError, ValueError):
    """An option, preset name or store URL is not valid."""
