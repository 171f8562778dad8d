"""One exception tree for everything ClawVM raises.

Callers catch :class:`ClawVMError` for "anything from us", or one of the specific subclasses. Driver
errors (sqlite3, onnxruntime, ...) never escape raw: each engine translates them at its boundary into
:class:`StoreError` (or a more specific subclass) so the layers above stay engine-agnostic.
"""

from __future__ import annotations


class ClawVMError(Exception):
    """Base class of every error ClawVM raises on purpose."""


class NotFoundError(ClawVMError, LookupError):
    """A memory (or other object) with the given id does not exist. ``field`` names the argument that
    held the id (``memory_id`` for a memory, ``context_build_id`` for a context build, unless given)."""

    def __init__(self, what: str, ident: str, field: str | None = None) -> None:
        super().__init__(f"{what} {ident!r} not found")
        self.what = what
        self.ident = ident
        self.field = field or f"{what.replace(' ', '_')}_id"
        self.problem = f"no {what} {ident!r}"
        self.fix = "check the id: it may have been forgotten, or never existed"


class ConflictError(ClawVMError):
    """An optimistic-locking check failed: the stored version is not the one the writer expected.

    ``expected`` is the version the caller passed (``expected_version``), or None when it passed none and
    the memory changed between the call's own read and its write (another writer's change landed first):
    then ``field`` is ``memory_id`` and ``fix`` says to retry, as the caller named no version to re-read."""

    def __init__(
        self,
        ident: str,
        expected: int | None,
        actual: int | None,
        reason: str | None = None,
        *,
        field: str | None = None,
        fix: str | None = None,
    ) -> None:
        """``reason``: what moved on, when it is not a version the caller expected (a chain's head);
        ``field`` and ``fix``: what the caller sent that conflicts (an ``id`` a stored memory has)."""
        if reason is None and expected is not None and actual is not None:
            now = f"is at version {actual}, not {expected}"
            reason = f"memory {ident!r} {now}: re-read it and retry"  # (an update, a forget ...)
        elif reason is None:  # no version of the caller's: another change landed between its read and write
            now = f" (it is at version {actual} now)" if actual is not None else ""
            reason = f"memory {ident!r} changed while this change was being written{now}: nothing was written"
        if field is None:
            field = "expected_version" if expected is not None else "memory_id"
        if fix is None:
            fix = (
                "re-read the memory and retry with its current version"
                if expected is not None
                else "retry: the change applies to the memory as it is then"
            )
        super().__init__(reason)
        self.ident = ident
        self.expected = expected
        self.actual = actual
        self.field = field
        self.problem = reason
        self.fix = fix


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
    """The database schema is newer than this version of ClawVM understands, a migration failed, or the file
    is another application's (tables, but no ClawVM schema)."""


class DimensionError(SchemaError):
    """The store holds vectors of ``stored`` dimensions and was opened for ``dim`` (another embedder's):
    ``where`` names the store."""

    def __init__(self, where: str, stored: int, dim: int) -> None:
        super().__init__(
            f"{where} holds {stored}-dimensional vectors, not {dim}: open it with the embedder it was "
            "written with, or use another store"
        )
        self.where = where
        self.stored = stored
        self.dim = dim


class ClaimedError(StoreError):
    """The store is held by a job that has not finished (:class:`clawvm.store.base.Claim`: a migration into
    it still copying, or killed midway): what it holds may be a part only, so it is neither opened nor
    claimed again. ``field`` names the store (``to`` for ``clawvm migrate``'s target), like
    :class:`ValidationError`."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(f"{field}: {problem} ({fix})")
        self.field = field
        self.problem = problem
        self.fix = fix


class EmbedderError(ClawVMError):
    """The embedding model could not be loaded or failed to encode."""


class StateConflictError(ValidationError):
    """The request is well formed but the memory's state forbids it now (obsolete, expired, pinned): the
    server answers 409 ``invalid_state``, naming the field, as a :class:`ValidationError` would."""


class ConfigError(ClawVMError, ValueError):
    """An option, preset name or store URL is not valid. The message says what to use instead; ``field``
    names the option when one is to blame (``preset``, ``weights``, a store URL parameter), else None;
    ``problem`` is the message, and ``fix`` what to use instead where it is said apart from it (as
    :class:`ValidationError` has them, so that a caller reads one shape of any bad input)."""

    def __init__(self, message: str, field: str | None = None, *, fix: str | None = None) -> None:
        super().__init__(message if fix is None else f"{message} ({fix})")
        self.field = field
        self.problem = message
        self.fix = fix


class AuthenticationError(ClawVMError):
    """No API key was given, or the key is unknown or revoked (the server answers 401)."""


class KeyExpiredError(AuthenticationError):
    """The API key is past its ``expires_at`` (the server answers 401 with the code ``key_expired``)."""


class AccessDeniedError(ClawVMError, PermissionError):
    """The caller may not do this: its role lacks the permission, or the data belongs to another tenant.

    ``field`` names what was refused (``role``, ``tenant``, ``id`` ...), like :class:`ValidationError`.
    """

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(f"{field}: {problem} ({fix})")
        self.field = field
        self.problem = problem
        self.fix = fix


class RateLimitError(ClawVMError):
    """Too many requests; retry after ``retry_after_s`` seconds. ``limit`` names the limit that was hit
    (``API key``, ``tenant``, ``key minting``, ``unauthenticated requests``)."""

    def __init__(self, retry_after_s: float, limit: str = "API key") -> None:
        super().__init__(f"rate limit of the {limit} exceeded: retry after {retry_after_s:.2f} s")
        self.retry_after_s = retry_after_s
        self.limit = limit


class InvalidToolResultError(ClawVMError):
    """A recorded tool returned a result its validator (or template) rejected; it was recorded as ERROR.

    ``tool`` names the tool, ``reason`` says why, ``call_id``/``result_id`` are the recorded memories.
    """

    def __init__(self, tool: str, reason: str, call_id: str, result_id: str) -> None:
        super().__init__(f"tool {tool!r} returned an invalid result: {reason}")
        self.tool = tool
        self.reason = reason
        self.call_id = call_id
        self.result_id = result_id


class UpstreamError(ClawVMError):
    """A model the harness called on the caller's behalf (a summarizer, a synthesizer, a chat endpoint)
    failed or gave no usable answer; nothing was changed. The server answers 502 ``upstream_failed``."""


class CryptoError(ClawVMError):
    """A sealed original (encryption at rest, :mod:`clawvm.store.crypto`) could not be opened."""


class WrongKeyError(CryptoError):
    """The envelope was sealed with a data key that is not among the keys given (``kid`` names it)."""

    def __init__(self, kid: str, available: list[str]) -> None:
        super().__init__(
            f"sealed with data key {kid}, which is not among the keys given "
            f"({', '.join(available) or 'none'}): set CLAWVM_DATA_KEY or CLAWVM_DATA_KEY_FILE to include it"
        )
        self.kid = kid
        self.available = available


class TamperedError(CryptoError):
    """The envelope failed authentication (AES-GCM tag) or is malformed: it was altered or moved."""
