"""The storage contract every engine implements.

An engine implements the handful of abstract methods below; everything else (``get``, ``put``,
``delete``, ``count`` ...) is built once on top of them here. Engines translate their driver's errors
into :mod:`clawvm.core.errors` at this boundary, do no I/O in their constructor (``setup()`` opens and
migrates), and are safe to call from several threads.

Write semantics (optimistic locking): ``put_many`` stores a memory only if its ``version`` is exactly one
more than the stored version; an id not stored yet is new at version 1, or at any version when the caller
names it ``imported`` (imports and migrations keep theirs: a later version of a missing id is otherwise a
memory forgotten since its writer read it, not brought back). Otherwise nothing of the batch is written and
:class:`ConflictError` is raised. Callers bump the version; the
engine checks and writes atomically.

Credentials (what authentication reads: an API key's hash, tenant, role and state) live in a small keyed
table of their own, apart from the event log, so that event retention never reaches them:
``put_credential`` (compare-and-set on ``version``, the same rule as memories), ``find_credentials`` (by
kind and name across tenants: a key id is all a caller presents) and ``list_credentials`` (one page, in
(tenant, kind, name) order). A credential is keyed by (tenant, kind, name): the tenant is part of every key.

Claims (:class:`Claim`): one job at a time may hold the whole store while it leaves it incomplete
(``clawvm migrate`` its target): ``claim`` (atomic across processes; refused while one is held),
``held_claim`` and ``release``. A claim is stored with the data, so it outlives a killed job, and ``setup()``
refuses a store that still carries one (:class:`ClaimedError`).

Preconditions (``write(..., requires=...)``): conditions on what is stored that must hold, with the batch
written, for the write to happen, checked atomically with it (each engine in its own write transaction or
lock), so that two processes cannot both pass a check made before their writes. :class:`PinBudget`, the one
kind, keeps a session's pinned memories within their budget; a write it refuses writes nothing and raises
:class:`PinBudgetError` (a :class:`ValidationError`, the one a pin over the budget always gets).
"""

from __future__ import annotations

import builtins
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from clawvm.core.errors import ClaimedError, ConflictError, NotFoundError, StoreError, ValidationError
from clawvm.core.model import Filters, LinkType, Memory, Status, Tier, utcnow
from clawvm.core.vectors import undirected_rows
from clawvm.store.kinds import EventKind, kind_of


@dataclass(frozen=True)
class Query:
    """One search: metadata filters plus optional lexical text and/or dense vector.

    ``limit`` is per channel (``dense_limit``, when given, for the dense channel). With neither text, vector,
    ``around`` nor ``expand``, the newest memories matching the filters are returned in
    ``QueryResult.filtered``.

    Ties: of equal scores (the same text twice, identical vectors, an equal cosine) every scored channel
    (``lexical``, ``context``, ``dense``) ranks the later stored memory first and, where the limit cuts a
    run of equal scores, keeps the later stored ones: the engine's insertion order (the in-process
    index's row, PostgreSQL's ``seq``), newest first, as ``filtered`` orders memories created at the same
    instant. (Recall's fusion then breaks its own ties by id, newer first too.) An approximate dense
    search (PostgreSQL's HNSW) keeps the rule among the rows it returns, reading a few past the limit.

    Optional channels (all off by default; every engine implements them, see ``store/index.py``):

    - ``lexical``: with ``text``, BM25 over each memory's own text (``QueryResult.lexical``);
    - ``context``: with ``text``, BM25 over each memory's *neighbourhood* document: its own text plus that
      of the memories recorded just before and after it in the same session (tenant + session_id, by
      creation time), ``CONTEXT_WINDOW`` on each side (``QueryResult.context``). In a conversation the
      other speaker's reply often carries the words of the question;
    - ``info``: ``QueryResult.info`` for every candidate of the channels above and for their same-session
      neighbours that pass the filters (creation time, session, previous/next memory, author, length);
    - ``around``: ``QueryResult.info`` for these ids and their same-session neighbours that pass the
      filters (recall asks it for its best fused candidates only: cheaper than ``info`` for all);
    - ``expand``: seed ids for entity-graph expansion: ``QueryResult.related`` lists memories that share
      an entity with a seed (entities extracted at write time, :mod:`clawvm.core.entities`), at most
      ``expand_limit`` links, ignoring entities named by more than ``expand_max_df`` memories.
    """

    filters: Filters = field(default_factory=Filters)
    text: str | None = None
    vector: np.ndarray | None = None
    limit: int = 50
    dense_limit: int | None = None
    lexical: bool = True
    context: bool = False
    info: bool = False
    around: tuple[str, ...] = ()
    expand: tuple[str, ...] = ()
    expand_limit: int = 50
    expand_max_df: int = 20

    @property
    def dense_k(self) -> int:
        """How many hits the dense channel returns."""
        return self.limit if self.dense_limit is None else self.dense_limit


class CandidateInfo(NamedTuple):
    """Where a candidate sits: its creation time, session and same-session neighbours (by creation time).

    ``previous``/``next`` name the adjacent memories of the session whether or not they pass the query's
    filters; only those that pass appear in ``QueryResult.info`` themselves. (A NamedTuple: a query builds
    hundreds of these, and a frozen dataclass costs several times more to create.)
    """

    created_at: datetime
    session_id: str | None
    previous: str | None
    next: str | None
    agent_id: str | None = None  # who wrote it (recall's author prior, see clawvm.recall.retrieval)
    length: int = 0  # lexical document length, in analysed terms (recall's length prior)


class Related(NamedTuple):
    """A memory that shares a named entity with a seed (:attr:`Query.expand`), and how strongly: the
    rarer the entity, the nearer ``weight`` is to 1."""

    seed: str
    id: str
    weight: float


class Unembedded(NamedTuple):
    """A memory that still lacks a vector, with the text to embed (:meth:`Store.unembedded`)."""

    id: str
    content: str


@dataclass
class QueryResult:
    """Raw per-channel candidates (id, engine score), best first. Fusion happens in retrieval."""

    lexical: list[tuple[str, float]] = field(default_factory=list)
    dense: list[tuple[str, float]] = field(default_factory=list)
    filtered: list[str] = field(default_factory=list)
    context: list[tuple[str, float]] = field(default_factory=list)
    info: dict[str, CandidateInfo] = field(default_factory=dict)
    related: list[Related] = field(default_factory=list)


class GroupKey(NamedTuple):
    """One group of :meth:`Store.group_counts`: the memories of one kind, status and tier."""

    kind: str
    status: str
    tier: str


def group_of(memory: Memory, expired_at: datetime | None) -> GroupKey:
    """``memory``'s group in :meth:`Store.group_counts`: an active memory due to expire by ``expired_at``
    counts as expired, as reads show it before the expiry sweep marks it."""
    status = memory.status.value
    due = expired_at is not None and memory.expires_at is not None and memory.expires_at <= expired_at
    if status == Status.ACTIVE.value and due:
        status = Status.EXPIRED.value
    return GroupKey(memory.kind.value, status, memory.tier.value)


@dataclass(frozen=True)
class PageKey:
    """A keyset position: the creation time and id of the last memory of a page. :meth:`Store.page` goes on
    strictly after it, so a page costs one indexed read wherever it starts (no OFFSET to skip), and
    memories written or changed between pages neither repeat nor vanish (only their order key counts,
    and a memory's creation time and id never change)."""

    created_at: datetime
    id: str

    @classmethod
    def of(cls, memory: Memory) -> PageKey:
        return cls(memory.created_at, memory.id)


@dataclass(frozen=True)
class Edge:
    source: str
    type: LinkType
    target: str


@dataclass(frozen=True)
class Event:
    """One entry of the append-only event log (what happened to which memory, and why).

    ``kind``: an :class:`~clawvm.store.kinds.EventKind` (its ``data`` is typed in
    :data:`~clawvm.store.kinds.PAYLOADS`)."""

    kind: EventKind | str
    memory_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    tenant: str = "default"
    at: datetime = field(default_factory=utcnow)
    seq: int | None = None  # assigned by the store

    def __post_init__(self) -> None:
        # a known kind becomes its EventKind member (typed, and equal to its string); an unknown one (a newer
        # writer's) stays a string so that reading an old or newer log never fails
        if not isinstance(self.kind, EventKind):
            object.__setattr__(self, "kind", kind_of(self.kind))


@dataclass(frozen=True)
class PinBudget:
    """A write's precondition: with the batch written, the pinned memories of session ``session_id`` of
    ``tenant`` (pinned, active, in the working tier, and not expired by ``at``) number at most
    ``max_items`` and hold at most ``max_tokens`` tokens (None: that one is unbounded).

    The batch's memories count as the write leaves them, their stored versions not at all: a pin counts
    once, an unpin or a replaced revision frees its room, a memory moved out of the session leaves it. The
    engine evaluates it atomically with its write (see the module docstring); the pager builds it from its
    working-tier budget (:meth:`clawvm.vm.tiers.Pager.pin_budget`)."""

    tenant: str
    session_id: str
    at: datetime
    max_items: int | None
    max_tokens: int | None

    def members(self) -> Filters:
        """The stored memories that count: the filter an engine reads them with."""
        return Filters.of(
            tenant=self.tenant,
            session_id=self.session_id,
            tier=Tier.WORKING,
            status=Status.ACTIVE,
            pinned=True,
            live_at=self.at,
        )

    def counts(self, memory: Memory) -> bool:
        """Whether ``memory``, as a batch writes it, is one of the pins this budget holds."""
        return (
            memory.pinned
            and memory.tenant == self.tenant
            and memory.session_id == self.session_id
            and memory.tier is Tier.WORKING
            and memory.status is Status.ACTIVE
            and (memory.expires_at is None or memory.expires_at > self.at)
        )

    def check(self, stored: Mapping[str, int], batch: Sequence[Memory]) -> None:
        """Refuse (:class:`PinBudgetError`) the write of ``batch`` when ``stored`` (the token count of each
        stored member, read in the write's transaction) and the batch's own pins exceed the budget."""
        written = {m.id for m in batch}
        tokens = [n for i, n in stored.items() if i not in written]
        tokens += [m.token_count for m in batch if self.counts(m)]
        if self.exceeded(len(tokens), sum(tokens)):
            raise PinBudgetError(self)

    def exceeded(self, items: int, tokens: int) -> bool:
        """Whether ``items`` pins of ``tokens`` tokens in all are past this budget."""
        return (self.max_items is not None and items > self.max_items) or (
            self.max_tokens is not None and tokens > self.max_tokens
        )


class PinBudgetError(ValidationError):
    """A pin (or a write that leaves memories pinned) refused: the session's pinned memories would exceed
    the working-tier budget. The same error whether the pager's check before the write refused it or the
    engine's :class:`PinBudget` inside the write (``budget``: the one the engine found exceeded)."""

    def __init__(self, budget: PinBudget | None = None) -> None:
        self.budget = budget
        super().__init__(
            "pinned",
            "would put the pinned memories of this session over the working-tier budget",
            "unpin another memory first or raise TierBudgets.working_tokens / working_items",
        )


#: The preconditions a write may carry (see the module docstring); one kind so far.
Requirement = PinBudget


def check_requirements(
    requires: Sequence[Requirement],
    batch: Sequence[Memory],
    stored_pins: Callable[[PinBudget], Mapping[str, int]],
) -> None:
    """Evaluate ``requires`` against ``batch``: ``stored_pins(budget)`` reads, inside the engine's write
    transaction (or under its lock), the token count of each stored member of ``budget``."""
    for budget in requires:
        budget.check(stored_pins(budget), batch)


@dataclass(frozen=True)
class Credential:
    """One record of the credentials table: what authentication needs to know about a secret (e.g. an API
    key's hash, role and state), never the secret itself.

    Keyed by (``tenant``, ``kind``, ``name``): the same name may exist under two tenants; ``data`` is a JSON
    object whose fields the ``kind``'s owner defines (``api_key``: :mod:`clawvm.store.keys`); ``version``
    counts the writes (1 when created), for :meth:`Store.put_credential`'s compare-and-set.
    """

    tenant: str
    kind: str
    name: str
    data: dict[str, Any] = field(default_factory=dict)
    version: int = 1


class CredentialConflictError(ConflictError):
    """A credential write lost a race: its version is not the stored version + 1 (or it already exists)."""

    def __init__(self, credential: Credential, actual: int | None) -> None:
        ident = f"{credential.tenant}/{credential.kind}/{credential.name}"
        super().__init__(ident, credential.version - 1, actual)
        # ConflictError's message speaks of a memory: say what it is
        self.args = (f"credential {ident!r} is at version {actual}, not {credential.version - 1}: re-read",)


@dataclass(frozen=True)
class Claim:
    """A hold on a whole store by one job that leaves it incomplete until it finishes (``clawvm migrate``
    holds its target from before the first row it copies until the copy is verified): taken with
    :meth:`Store.claim`, it outlives the process, so a store whose job was killed midway still carries it,
    and engines refuse to open such a store (:func:`claimed`) rather than serve a part as the whole.

    ``job`` says what holds it ("migration"), ``holder`` who (a process on a host), ``since`` when."""

    job: str
    holder: str
    since: datetime

    def to_json(self) -> str:
        """The text engines store (equal claims give equal text: :meth:`Store.release` compares it)."""
        return json.dumps({"job": self.job, "holder": self.holder, "since": self.since.isoformat()})

    @classmethod
    def from_json(cls, text: str) -> Claim:
        found = json.loads(text)
        return cls(str(found["job"]), str(found["holder"]), datetime.fromisoformat(found["since"]))


def claimed(claim: Claim, store: str, drop: str, field: str = "db") -> ClaimedError:
    """The error of a store held by ``claim``: ``store`` names it in words (``SQLite file x.db``) and
    ``drop`` says how to drop it (what an interrupted job leaves is thrown away, then the job is run
    again: a part copied cannot be told apart from the whole)."""
    started = claim.since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return ClaimedError(
        field,
        f"{store} is held by a {claim.job} that has not finished (started {started} by {claim.holder}): "
        f"it is still running, or it was interrupted and the store holds part of the data",
        f"wait for the {claim.job} to end; if it was interrupted, {drop} and run the {claim.job} again",
    )


def _unclaimable(store: object) -> ValidationError:
    """The error of a store that keeps no claim (a view of an engine, or an engine of another package)."""
    return ValidationError(
        "store",
        f"is a {type(store).__name__}, which cannot be claimed",
        "claim the engine itself (a SQLite file, a PostgreSQL schema, the in-memory engine), not a view",
    )


def credential_json(credential: Credential) -> str:
    """``credential.data`` as the JSON text engines store, after checking the credential's key and version
    (:class:`ValidationError` when a part of its key is empty or holds NUL, its version is below 1 or its
    data is not a JSON object)."""
    for name in ("tenant", "kind", "name"):
        value = getattr(credential, name)
        if not isinstance(value, str) or not value or "\x00" in value:
            raise ValidationError(name, "is empty, not text or holds NUL", f"give the credential a {name}")
    if not isinstance(credential.version, int) or credential.version < 1:
        raise ValidationError("version", f"is {credential.version}", "versions start at 1")
    fix = "store the credential's fields as a JSON object (strings, numbers, lists, objects)"
    if not isinstance(credential.data, dict):
        raise ValidationError("data", "is not a JSON object", fix)
    try:
        return json.dumps(credential.data, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise ValidationError("data", "is not JSON", fix) from None


def check_credential_version(credential: Credential, stored_version: int | None) -> None:
    """The compare-and-set rule of :meth:`Store.put_credential`, shared by engines: a credential not stored
    yet may carry any version (a create writes 1; a copy keeps its own); a stored one must be exactly its
    stored version + 1. (SQL engines state the same rule in their upsert.)"""
    if stored_version is not None and credential.version != stored_version + 1:
        raise CredentialConflictError(credential, stored_version)


def credentials_page_sql(
    kind: str | None, tenant: str | None, after: Credential | None, limit: int, mark: str
) -> tuple[str, list[Any]]:
    """The SELECT of one :meth:`Store.list_credentials` page and its arguments, for SQL engines (``mark``:
    the driver's placeholder, ``?`` or ``%s``); rows are (tenant, kind, name, version, data)."""
    sql = "SELECT tenant, kind, name, version, data FROM credentials WHERE 1 = 1"
    args: list[Any] = []
    for column, value in (("kind", kind), ("tenant", tenant)):
        if value is not None:
            sql += f" AND {column} = {mark}"
            args.append(value)
    if after is not None:
        sql += f" AND (tenant, kind, name) > ({mark}, {mark}, {mark})"
        args += [after.tenant, after.kind, after.name]
    return f"{sql} ORDER BY tenant, kind, name LIMIT {mark}", [*args, limit]


def credential_order(credential: Credential) -> tuple[str, str, str]:
    """Where ``credential`` sorts in :meth:`Store.list_credentials` (tenant, kind, name; code points)."""
    return credential.tenant, credential.kind, credential.name


@runtime_checkable
class EventFeed(Protocol):
    """A capability of engines that push events across processes (PostgreSQL: LISTEN/NOTIFY).

    ``subscribe(callback)`` calls ``callback(seq)`` whenever any process appends events (``seq``: the
    newest); read them with ``read_events``. Returns a function that unsubscribes. Detect it with
    ``isinstance(store, EventFeed)``; for other engines, poll ``read_events``.
    """

    def subscribe(self, callback: Callable[[int], None]) -> Callable[[], None]: ...


class StoreReader(Protocol):
    """The read side of a :class:`Store`: what feature modules get. They write through the one commit path
    (:class:`clawvm.write.commit.Writer`), never to the store behind it."""

    @property
    def dim(self) -> int: ...

    def get(self, memory_id: str) -> Memory: ...

    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]: ...

    def list(self, filters: Filters | None = None, limit: int = 100) -> builtins.list[Memory]: ...

    def count(self, filters: Filters | None = None) -> int: ...

    def group_counts(
        self, filters: Filters | None = None, expired_at: datetime | None = None
    ) -> dict[GroupKey, int]: ...

    def iter_all(
        self, filters: Filters | None = None, batch: int = 500, newest_first: bool = False
    ) -> Iterator[Memory]: ...

    def iter_json(self, filters: Filters | None = None, batch: int = 500) -> Iterator[dict[str, Any]]: ...

    def page(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> builtins.list[Memory]: ...

    def session_ids(
        self, filters: Filters, after: str | None = None, limit: int = 500
    ) -> builtins.list[str]: ...

    def tag_names(
        self, filters: Filters, prefix: str = "", after: str | None = None, limit: int = 500
    ) -> builtins.list[str]: ...

    def query(self, query: Query) -> QueryResult: ...

    def edges(self, ids: Sequence[str]) -> builtins.list[Edge]: ...

    def read_events(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        memory_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> builtins.list[Event]: ...

    def agents(self, filters: Filters) -> frozenset[str]: ...

    def vectors_of(self, ids: Sequence[str]) -> dict[str, np.ndarray]: ...


def check_import(events: Sequence[Event], newest: int | None) -> list[int]:
    """The numbers of events to import (:meth:`Store.import_events`): set, increasing, above ``newest``."""
    seqs = [e.seq for e in events]
    if any(s is None for s in seqs):
        raise ValidationError("events", "holds an event without a sequence number", "import read events")
    numbers = [int(s) for s in seqs if s is not None]
    floor = newest or 0
    for n in numbers:
        if n <= floor:
            raise ValidationError(
                "events", f"numbers {n} after {floor}", "import into an empty log, in the source's order"
            )
        floor = n
    return numbers


def check_versions(batch: Sequence[Memory], stored: dict[str, int]) -> None:
    """The optimistic-locking rule, shared by engines: a memory whose id is stored must be exactly the
    stored version + 1 (a new id: :func:`check_stored`); one batch may not hold the same id twice."""
    if len({m.id for m in batch}) != len(batch):
        raise ValidationError("memories", "the same id appears twice in one batch", "write each id once")
    for m in batch:
        current = stored.get(m.id)
        if current is not None and m.version != current + 1:
            raise ConflictError(m.id, m.version - 1, current)


def check_stored(batch: Sequence[Memory], stored: Mapping[str, int], imported: Collection[str]) -> None:
    """A memory at a later version than 1 changes one that must still be stored: one forgotten since its
    writer read it would otherwise be stored again, whole (a recall's bookkeeping, written in one process
    just after another forgot the memory, brought it back). Only ``imported`` ids (an import or a
    migration, which create memories at the version they carry) may be new at a later version."""
    for m in batch:
        if m.version > 1 and m.id not in stored and m.id not in imported:
            gone = f"memory {m.id!r} is no longer stored: it was forgotten since it was read"
            raise ConflictError(
                m.id, m.version - 1, None, gone, field="memory_id", fix="it is gone: read again"
            )


def check_removable(batch: Sequence[Memory], stored: Mapping[str, int]) -> None:
    """The optimistic-locking rule of a delete: a memory still stored must be at the version the caller
    read (a change that landed since is not deleted unseen); one no longer stored was deleted already."""
    if len({m.id for m in batch}) != len(batch):
        raise ValidationError("memories", "the same id appears twice in one batch", "delete each id once")
    for m in batch:
        current = stored.get(m.id)
        if current is not None and current != m.version:
            raise ConflictError(m.id, m.version, current)


def check_vectors(
    n: int, vectors: np.ndarray | Sequence[Any], dim: int, field: str = "vectors"
) -> np.ndarray:
    """``vectors`` as an ``(n, dim)`` float32 array of finite values, or :class:`ValidationError`."""
    fix = f"pass {n} vector(s) of {dim} finite floats"
    try:
        v = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValidationError(field, "is not an array of numbers", fix) from None
    if v.shape != (n, dim) and not (n == 1 and v.shape == (dim,)):
        raise ValidationError(field, f"has shape {v.shape}, not ({n}, {dim})", fix)
    if not np.isfinite(v).all():
        raise ValidationError(field, "contains NaN or infinite values", fix)
    return v.reshape(n, dim)


def check_stored_vectors(
    n: int, vectors: np.ndarray | Sequence[Any], dim: int, field: str = "vectors"
) -> np.ndarray:
    """:func:`check_vectors` for vectors to store (:meth:`Store.set_vectors`, :meth:`Store.write`, an
    embedding given to ``record``): each row must also have a direction. A zero row (or one too small or
    large to normalise in float32) is never found by cosine and scores 0 against every query, so it is
    refused before anything is written (:class:`ValidationError`); a query vector is not held to this."""
    v = check_vectors(n, vectors, dim, field)
    bad = undirected_rows(v)
    if len(bad):
        which = "is a zero vector" if n == 1 else f"row {int(bad[0])} is a zero vector"
        raise ValidationError(
            field,
            f"{which} (or too small or large to normalise): cosine can never find it",
            "pass a vector with a nonzero value, or none: the memory then waits for the embedder",
        )
    return v


def leading_vectors(
    memories: Sequence[Memory], vectors: np.ndarray | Sequence[Any], dim: int
) -> tuple[list[str], np.ndarray]:
    """:meth:`Store.write`'s ``vectors``, checked: one row for each of the first memories (as many as
    there are rows; a record writes its new memory's vector and none for the memories it demotes)."""
    v = np.asarray(vectors, dtype=np.float32) if not isinstance(vectors, np.ndarray) else vectors
    rows = v.shape[0] if v.ndim == 2 else 1
    if rows > len(memories):
        raise ValidationError(
            "vectors", f"has {rows} rows for {len(memories)} memories", "pass at most one row per memory"
        )
    return [m.id for m in memories[:rows]], check_stored_vectors(rows, v, dim)


_SHORT_LIVED: ContextVar[bool] = ContextVar("clawvm_short_lived", default=False)


@contextmanager
def short_lived() -> Iterator[None]:
    """Stores set up inside serve a process that exits soon after a few calls (a command line call): an
    engine does at open the checks it would otherwise leave to a background pass after open, which such a
    process never lives to see (the SQLite engine checks its index snapshot's every checksum: ~0.14 s at
    100k memories, against milliseconds to map it unchecked)."""
    token = _SHORT_LIVED.set(True)
    try:
        yield
    finally:
        _SHORT_LIVED.reset(token)


def set_up_short_lived() -> bool:
    """Whether the store being set up serves a short-lived process (see :func:`short_lived`)."""
    return _SHORT_LIVED.get()


class Store(ABC):
    """Abstract storage engine. See the module docstring for the contract."""

    #: URL scheme(s) this engine serves, e.g. ``("sqlite",)``.
    schemes: tuple[str, ...] = ()
    #: Dimension of the vectors this store holds.
    dim: int = 384

    # ---- required -----------------------------------------------------------------------------------
    @abstractmethod
    def setup(self) -> None:
        """Open connections, apply pending migrations, load in-process indexes. Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Release resources. Idempotent."""

    def exists(self) -> bool:
        """Whether a store is set up at this engine's location (a SQLite file with its tables, a PostgreSQL
        schema with its own), asked without creating or changing anything: :meth:`setup` makes one where
        there is none, so a command that only reads (or a migration's source) asks first, and a mistyped
        file or schema name is told rather than made. Engines without a location (in memory) are there."""
        return True

    @abstractmethod
    def put_many(self, memories: Sequence[Memory], *, imported: Collection[str] = ()) -> None:
        """Insert or replace memories atomically, with the optimistic version check (:func:`check_versions`)
        and the check that a memory past version 1 is still stored (:func:`check_stored`; ``imported`` ids
        may be new at any version)."""

    @abstractmethod
    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        """The stored memories among ``ids`` (missing ids are simply absent)."""

    @abstractmethod
    def delete_many(self, ids: Sequence[str]) -> int:
        """Delete memories (their vectors and outgoing links); returns how many existed."""

    @abstractmethod
    def query(self, query: Query) -> QueryResult:
        """Filtered lexical and/or dense candidates, or filtered listing. See :class:`Query`."""

    @abstractmethod
    def page(
        self,
        filters: Filters,
        after: PageKey | None = None,
        limit: int = 500,
        newest_first: bool = False,
    ) -> list[Memory]:
        """Up to ``limit`` memories matching ``filters`` in (created_at, id) order (descending with
        ``newest_first``), strictly beyond ``after``: a keyset page. Pass the last memory's
        :meth:`PageKey.of` for the next page; a page shorter than ``limit`` is the last. A page is read from
        one state of the store: every memory on it matches ``filters`` as it is returned, whatever another
        process writes meanwhile (the pager counts a tier's members as they come)."""

    @abstractmethod
    def set_vectors(
        self, ids: Sequence[str], vectors: np.ndarray, contents: Sequence[str] | None = None
    ) -> None:
        """Attach embeddings (unit-normalised here) to stored memories; unknown ids are ignored. Every row
        is checked before anything is written (:func:`check_stored_vectors`: shape, finite values, a
        direction).

        With ``contents`` (what the background worker embedded), a vector is written only where the memory
        still has exactly that content and no vector yet: a caller-supplied vector, or an update of the
        text while the worker was busy, always wins over the worker's late result.
        """

    @abstractmethod
    def unembedded(self, limit: int) -> list[Unembedded]:
        """Up to ``limit`` memories that still lack a vector, oldest first."""

    @abstractmethod
    def edges(self, ids: Sequence[str]) -> list[Edge]:
        """Every link whose source or target is in ``ids``."""

    @abstractmethod
    def append_events(self, events: Sequence[Event], *, tenant_numbers: bool = False) -> list[int]:
        """Append events; returns their sequence numbers (increasing): the log's, or with ``tenant_numbers``
        each event's number in its tenant's own sequence (see :meth:`read_events`)."""

    @abstractmethod
    def read_events(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        memory_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Event]:
        """Events with ``seq > after_seq`` in order, optionally for one memory.

        With ``tenant``: that tenant's events alone, numbered in the tenant's own sequence (``seq`` and
        ``after_seq`` are then 1, 2, 3 ... over its events, never reused, whatever other tenants log, so
        its numbers tell nothing of their activity; where writers run concurrently, as on PostgreSQL, a
        number lost to a rolled-back write leaves a gap, and a reader never skips one still in flight),
        read through an index on (tenant, number): the cost follows the tenant's own events, not the log's
        size."""

    def import_events(self, events: Sequence[Event], tenant_numbers: Sequence[int] | None = None) -> None:
        """Append a copy of another log's events *keeping their sequence numbers* (``clawvm migrate``:
        outputs and builds refer to events by number). Each event's ``seq`` must be set, increasing and
        above every stored one; ``tenant_numbers``: each event's number in its tenant's own sequence
        (:meth:`read_events` with ``tenant``), kept too. This default appends and checks that the log's
        numbers came out the same (an engine that numbers gap-free from its newest event); engines
        override it to write the numbers."""
        check_import(events, None)
        got = self.append_events(events)
        want = [e.seq for e in events]
        if got != want:
            raise StoreError(
                f"imported events were numbered {got[:3]}..., not {want[:3]}... as in the source"
            )

    @abstractmethod
    def put_credential(self, credential: Credential) -> None:
        """Store ``credential`` (insert or replace by tenant, kind and name) if it passes the
        compare-and-set rule of :func:`check_credential_version`; otherwise write nothing and raise
        :class:`CredentialConflictError`. Event retention never touches credentials."""

    @abstractmethod
    def find_credentials(self, kind: str, name: str) -> list[Credential]:
        """Every stored credential of ``kind`` called ``name``, one per tenant that has one, by tenant
        (an indexed lookup: authentication asks it for the key id a caller presents)."""

    @abstractmethod
    def list_credentials(
        self,
        kind: str | None = None,
        tenant: str | None = None,
        after: Credential | None = None,
        limit: int = 1000,
    ) -> list[Credential]:
        """One page of the stored credentials (of ``kind`` and/or ``tenant``, when given) in
        :func:`credential_order`, those after ``after`` (the last of the previous page); at most ``limit``."""

    # ---- built on top -------------------------------------------------------------------------------
    def __init__(self) -> None:
        self._lock = threading.RLock()

    @property
    def write_lock(self) -> threading.RLock:
        """Held by this engine's own writes; a wrapper that checks before it writes (the tenant guard,
        :mod:`clawvm.store.tenant`) holds it across both so that no write slips in between."""
        return self._lock

    def get(self, memory_id: str) -> Memory:
        if not isinstance(memory_id, str):  # get(None) said "memory None not found": a caller's slip
            raise ValidationError("memory_id", f"is a {type(memory_id).__name__}", "pass a memory's id")
        found = self.get_many([memory_id]).get(memory_id)
        if found is None:
            raise NotFoundError("memory", memory_id)
        return found

    def tenants_of(self, ids: Sequence[str]) -> dict[str, str]:
        """The tenant of each stored memory among ``ids`` (missing ids are absent): what a tenant's view
        asks of every id it is handed. Engines answer it without reading the memories (the default reads
        them)."""
        return {i: m.tenant for i, m in self.get_many(ids).items()}

    def put(self, memory: Memory) -> None:
        self.put_many([memory])

    def write(
        self,
        memories: Sequence[Memory],
        vectors: np.ndarray | None = None,
        events: Sequence[Event] = (),
        *,
        imported: Collection[str] = (),
        requires: Sequence[Requirement] = (),
        tenant_numbers: bool = False,
    ) -> list[int]:
        """``put_many`` (``imported`` as there) + ``set_vectors`` (when given, one row for each of the first
        memories: see :func:`leading_vectors`) + ``append_events`` as one step, done only if every
        precondition of ``requires`` holds with the batch written (see the module docstring). Returns the
        events' numbers as :meth:`append_events` does (``tenant_numbers`` as there): a caller that hands
        out an event's number (a context build's) writes it with its memories and still knows it.

        The record path writes all three for every memory; engines with transactions override this to
        commit once (a third of the commits). This default is correct for any engine, one call after the
        other: the version check of ``put_many`` still guards the whole step. It holds :attr:`write_lock`
        across the preconditions and the write, which makes them atomic within this process only.
        """
        embedded = None if vectors is None else leading_vectors(memories, vectors, self.dim)
        with self.write_lock:
            check_requirements(requires, memories, self._stored_pins)
            self.put_many(memories, imported=imported)
            if embedded is not None:
                self.set_vectors(*embedded)
            return self.append_events(events, tenant_numbers=tenant_numbers) if events else []

    def _stored_pins(self, budget: PinBudget) -> dict[str, int]:
        """The token count of each stored member of ``budget`` (engines read them in their transaction)."""
        return {m.id: m.token_count for m in self.iter_all(budget.members())}

    def remove(self, memories: Sequence[Memory], events: Sequence[Event] = ()) -> int:
        """Delete ``memories`` (their vectors and outgoing links) where each is still stored at its
        ``version``, and append ``events``, as one step; returns how many were stored. One stored at
        another version: :class:`ConflictError`, nothing deleted or logged (see :func:`check_removable`).

        Engines with transactions override this to check, delete and log in one transaction (a crash
        between the delete and its event lost the event); this default holds :attr:`write_lock`, which
        makes the step atomic within this process only."""
        with self.write_lock:
            stored = self.get_many([m.id for m in memories])
            check_removable(memories, {i: m.version for i, m in stored.items()})
            deleted = self.delete_many([m.id for m in memories])
            if events:
                self.append_events(events)
            return deleted

    def delete(self, memory_id: str) -> None:
        if self.delete_many([memory_id]) == 0:
            raise NotFoundError("memory", memory_id)

    def list(self, filters: Filters | None = None, limit: int = 100) -> list[Memory]:
        """Newest memories matching ``filters``. Matched, then fetched: one that another caller's write
        took out of the filters in between is left out (an engine that reads both from one state of the
        store may say so by overriding this)."""
        f = filters or Filters()
        ids = self.query(Query(filters=f, limit=limit)).filtered
        found = self.get_many(ids)
        return [m for i in ids if (m := found.get(i)) is not None and f.matches(m)]

    def page_json(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> builtins.list[dict[str, Any]]:
        """:meth:`page`'s memories as their stored JSON (the shape of ``Memory.model_dump(mode="json")``), for
        a reader that needs a few fields of every memory (MemLens' table of the tenant): an engine that
        stores JSON hands it over parsed, not validated into a Memory (several times cheaper, as its index
        rebuild reads it). This default dumps :meth:`page`."""
        return [m.model_dump(mode="json") for m in self.page(filters, after, limit, newest_first)]

    def iter_json(self, filters: Filters | None = None, batch: int = 500) -> Iterator[dict[str, Any]]:
        """:meth:`iter_all` as stored JSON (:meth:`page_json`), oldest first, in keyset pages of ``batch``."""
        after: PageKey | None = None
        f = filters or Filters()
        while True:
            chunk = self.page_json(f, after, batch)
            yield from chunk
            if len(chunk) < batch:
                return
            last = chunk[-1]
            after = PageKey(datetime.fromisoformat(str(last["created_at"])), str(last["id"]))

    def count(self, filters: Filters | None = None) -> int:
        """How many memories match ``filters``; engines count in their indexes. This default pages."""
        return sum(1 for _ in self.iter_all(filters))

    def group_counts(
        self, filters: Filters | None = None, expired_at: datetime | None = None
    ) -> dict[GroupKey, int]:
        """How many memories matching ``filters`` hold each (kind, status, tier), from one read: every total
        derived from it (all, by kind, by status, by tier) agrees with the others while writers go on,
        which separate counts did not. With ``expired_at``, an active memory whose ``expires_at`` is at or
        before it counts as expired (:func:`group_of`). Engines count in one query or index pass; this
        default makes one pass of :meth:`iter_all`, which sees each memory once."""
        counts: dict[GroupKey, int] = {}
        for m in self.iter_all(filters):
            key = group_of(m, expired_at)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def iter_all(
        self, filters: Filters | None = None, batch: int = 500, newest_first: bool = False
    ) -> Iterator[Memory]:
        """Every memory matching ``filters``, oldest first (newest first with ``newest_first``), read in
        keyset pages of ``batch`` (:meth:`page`): at most one page is held at a time, and memories changed
        while the caller works through them are neither skipped nor repeated."""
        after: PageKey | None = None
        f = filters or Filters()
        while True:
            chunk = self.page(f, after, batch, newest_first)
            yield from chunk
            if len(chunk) < batch:
                return
            after = PageKey.of(chunk[-1])

    def session_ids(self, filters: Filters, after: str | None = None, limit: int = 500) -> builtins.list[str]:
        """Up to ``limit`` distinct session ids of the memories matching ``filters``, ascending, each
        greater than ``after`` (page with the last one). Engines answer from their indexes; this default
        pages through the memories and is only correct, not cheap."""
        found = {
            m.session_id
            for m in self.iter_all(filters)
            if m.session_id is not None and (after is None or m.session_id > after)
        }
        return sorted(found)[:limit]

    def tag_names(
        self, filters: Filters, prefix: str = "", after: str | None = None, limit: int = 500
    ) -> builtins.list[str]:
        """Up to ``limit`` distinct tags beginning with ``prefix`` of the memories matching ``filters``,
        ascending (by code point), each greater than ``after`` (page with the last one). Engines answer
        from their indexes; this default pages through the memories and is only correct, not cheap."""
        found = {
            t
            for m in self.iter_all(filters)
            for t in m.tags
            if t.startswith(prefix) and (after is None or t > after)
        }
        return sorted(found)[:limit]

    def append_event(self, event: Event) -> int:
        return self.append_events([event])[0]

    def get_credential(self, tenant: str, kind: str, name: str) -> Credential | None:
        """The credential of ``tenant`` of ``kind`` called ``name``, or None."""
        return next((c for c in self.find_credentials(kind, name) if c.tenant == tenant), None)

    def iter_credentials(
        self, kind: str | None = None, tenant: str | None = None, batch: int = 1000
    ) -> Iterator[Credential]:
        """Every stored credential (of ``kind`` and/or ``tenant``, when given) in :func:`credential_order`,
        read a page at a time."""
        after: Credential | None = None
        while True:
            page = self.list_credentials(kind, tenant, after, batch)
            yield from page
            if len(page) < batch:
                return
            after = page[-1]

    def delete_events_upto(self, seq: int) -> int:
        """Drop the head of the event log: every event with ``seq <= seq`` (retention, see
        :mod:`clawvm.store.eventlog`). Sequence numbers are never reused. Returns how many were deleted.

        Not abstract so that an engine can be written before it supports retention; such an engine
        refuses here instead of silently keeping everything."""
        raise StoreError(f"{type(self).__name__} does not support event retention")

    def import_ids(self, ids: Sequence[str]) -> dict[str, str]:
        """The id under which an imported memory (or a reference to one) is stored, for each of ``ids``: an
        engine keeps every id (an import then skips ids it already holds); a tenant's view
        (:meth:`clawvm.store.tenant.TenantStore.import_ids`) gives an id that another tenant holds a fresh
        one of its own."""
        return {i: i for i in ids}

    def agents(self, filters: Filters) -> frozenset[str]:
        """Every ``agent_id`` of the stored memories of the tenants ``filters`` allows (its other fields are
        ignored); names of agents whose memories are all gone may stay. Recall asks it to tell which words
        of a query name an author (:func:`clawvm.recall.retrieval.named_authors`); an engine that cannot
        answer
        cheaply returns an empty set, and recall then treats no word as a name."""
        return frozenset()

    def vectors_of(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored (unit) vectors of those of ``ids`` that have one (``clawvm migrate`` copies them).

        Not abstract, like ``delete_events_upto``: an engine that cannot export them refuses here."""
        raise StoreError(f"{type(self).__name__} cannot export vectors")

    # Not abstract, like delete_events_upto: an engine without a place for a claim refuses to be claimed
    # (a tenant's view among them: a claim holds the whole store, not one tenant of it).
    def claim(self, claim: Claim) -> None:
        """Hold the whole store for ``claim`` (:class:`Claim`), unless a claim is held already: then nothing
        is written and :class:`ClaimedError` (:func:`claimed`) is raised. Atomic across processes: of
        several claims at once exactly one is taken. Engines refuse to ``setup()`` while a claim is held;
        the claimant's own store, set up before, goes on working."""
        raise _unclaimable(self)

    def held_claim(self) -> Claim | None:
        """The claim that holds the store, or None."""
        return None

    def release(self, claim: Claim) -> None:
        """Drop ``claim`` if it is the one held (another's stays); releasing twice is a no-op."""
        raise _unclaimable(self)

    def __enter__(self) -> Store:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReadOnlyStore:
    """A store's read side and nothing else (:class:`StoreReader`, plus :meth:`unembedded`): what
    ``Harness.store`` hands out. Code that holds a harness reads through it; a write goes through the
    harness, whose commit path validates, redacts, versions and logs it. The engine's write methods are
    not here to call, so nothing can write around that path by accident. ``opened`` (when given) is asked
    before each read: it raises once the owner closed (a harness's reads end with it)."""

    # callers may key caches by it (weakly: it goes with its harness)
    __slots__ = ("__weakref__", "_opened", "_store")

    def __init__(self, store: Store, opened: Callable[[], None] | None = None) -> None:
        self._store = store
        self._opened = opened or _always_open

    @property
    def _open_store(self) -> Store:
        self._opened()
        return self._store

    def __repr__(self) -> str:
        return f"ReadOnlyStore({self._store!r})"

    @property
    def dim(self) -> int:
        return self._open_store.dim

    def get(self, memory_id: str) -> Memory:
        return self._open_store.get(memory_id)

    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        return self._open_store.get_many(ids)

    def list(self, filters: Filters | None = None, limit: int = 100) -> builtins.list[Memory]:
        return self._open_store.list(filters, limit)

    def count(self, filters: Filters | None = None) -> int:
        return self._open_store.count(filters)

    def group_counts(
        self, filters: Filters | None = None, expired_at: datetime | None = None
    ) -> dict[GroupKey, int]:
        return self._open_store.group_counts(filters, expired_at)

    def iter_all(
        self, filters: Filters | None = None, batch: int = 500, newest_first: bool = False
    ) -> Iterator[Memory]:
        return while_open(self._open_store.iter_all(filters, batch, newest_first), self._opened)

    def iter_json(self, filters: Filters | None = None, batch: int = 500) -> Iterator[dict[str, Any]]:
        return while_open(self._open_store.iter_json(filters, batch), self._opened)

    def page(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> builtins.list[Memory]:
        return self._open_store.page(filters, after, limit, newest_first)

    def session_ids(self, filters: Filters, after: str | None = None, limit: int = 500) -> builtins.list[str]:
        return self._open_store.session_ids(filters, after, limit)

    def tag_names(
        self, filters: Filters, prefix: str = "", after: str | None = None, limit: int = 500
    ) -> builtins.list[str]:
        return self._open_store.tag_names(filters, prefix, after, limit)

    def query(self, query: Query) -> QueryResult:
        return self._open_store.query(query)

    def edges(self, ids: Sequence[str]) -> builtins.list[Edge]:
        return self._open_store.edges(ids)

    def read_events(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        memory_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> builtins.list[Event]:
        return self._open_store.read_events(after_seq, limit, memory_id, tenant=tenant)

    def agents(self, filters: Filters) -> frozenset[str]:
        return self._open_store.agents(filters)

    def vectors_of(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self._open_store.vectors_of(ids)

    def unembedded(self, limit: int) -> builtins.list[Unembedded]:
        return self._open_store.unembedded(limit)


def _always_open() -> None:
    """A :class:`ReadOnlyStore` whose owner never closes it."""


T = TypeVar("T")


def while_open(items: Iterator[T], opened: Callable[[], None]) -> Iterator[T]:
    """``items`` read one by one, each only while ``opened()`` lets (it raises once the owner closed):
    a paging iterator made before a close reads no page after it."""
    while True:
        opened()
        try:
            item = next(items)
        except StopIteration:
            return
        yield item
