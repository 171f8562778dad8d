"""The object agents and tools use: ``Harness.open(...)`` then record / recall / get / update / forget.

The harness owns one storage engine and (optionally) one embedder with its background worker. All logic
is written once and is synchronous; it is thread-safe because the engines are. Later layers (tiers,
pager, context builder, teams) build on these methods.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

import numpy as np

from clawvm.agents import reliability, toolcalls
from clawvm.core.embed import Embedder, EmbedWorker, MiniLMEmbedder, QueryEmbeddings, count_tokens
from clawvm.core.errors import (
    AccessDeniedError,
    ClawVMError,
    ConflictError,
    NotFoundError,
    StateConflictError,
    StoreError,
    ValidationError,
)
from clawvm.core.model import (
    DEFAULT_MAX_CONTENT_BYTES,
    DEFAULT_TENANT,
    SCOPE_IDS,
    STATUS_CHOICES,
    VISIBLE_STATUSES,
    Filters,
    Kind,
    LinkType,
    Memory,
    State,
    Status,
    Tier,
    as_utc,
    blank_scopes_as_none,
    build_memory,
    check_tenant_name,
    counted,
    flag,
    moved_on,
    normalize_content,
    refuse_internal,
    refuse_set_by_harness,
    revalidate,
    utcnow,
    within,
)
from clawvm.core.redact import RedactionPolicy
from clawvm.harness import assembly, importing
from clawvm.harness.fields import (
    AHEAD_OF_CLOCK_FIX,
    ahead_of_clock,
    keeping_harness_metadata,
    leaves_the_prompt,
    named_id,
    refuse_expiring_by_hand,
    refuse_harness_metadata,
    refuse_unpinnable,
    review_dropped,
)
from clawvm.harness.importing import Imported
from clawvm.harness.orphans import adopt_children_of_forgotten
from clawvm.harness.seen import as_seen, instant_of, seen_hits
from clawvm.observe.learning import stored_weights, with_weights
from clawvm.recall.retrieval import (
    PendingVector,
    RecallConfig,
    Recalled,
    dense_only,
    dense_text,
    preset,
    query_authors,
    run_recall,
)
from clawvm.store import Event, Store, store_from_url
from clawvm.store.base import (
    GroupKey,
    PageKey,
    PinBudget,
    ReadOnlyStore,
    StoreReader,
    check_stored_vectors,
    while_open,
)
from clawvm.store.crypto import DataKeys
from clawvm.store.kinds import EventKind
from clawvm.store.tenant import TenantStore
from clawvm.teams import shared as teams
from clawvm.teams.chain import mend_chain_of_forgotten
from clawvm.teams.forgotten import unquote_forgotten
from clawvm.teams.guidance import Guidance, build_guidance
from clawvm.vm import checkpoint as checkpoints
from clawvm.vm.checkpoint import CheckpointInfo, RollbackReport
from clawvm.vm.compress import (
    ExtractiveSummarizer,
    Summarizer,
    compress_memory,
    decompress_memory,
    earlier_collapse,
    fallback_event,
    is_compressible,
    raw_copies,
    referenced_raw,
    summarize_memory,
    summary_of,
)
from clawvm.vm.context import Context, Quotas
from clawvm.vm.scoring import ValueBreakdown
from clawvm.vm.scoring import explain as explain_value
from clawvm.vm.sweep import Sweep
from clawvm.vm.tiers import Pager, PagerConfig, Unchanged, one_pager_pass, unless_forgotten
from clawvm.vm.working import PagerThread, Turns, WorkingTiers
from clawvm.write.commit import CommitPath, closed_harness, past_bookkeeping
from clawvm.write.redaction import Redactor

_F = TypeVar("_F", bound=Callable[..., Any])
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _exclusive(method: Callable[Concatenate[Harness, _P], _R]) -> Callable[Concatenate[Harness, _P], _R]:
    """A harness method that reads a memory and writes its next version: it does not interleave with a
    background pager pass (which would move the memory between the read and the write, and the caller
    would see a ConflictError for a change it never asked for)."""

    @functools.wraps(method)
    def run(self: Harness, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._exclusive:
            return method(self, *args, **kwargs)

    return run


log = logging.getLogger("clawvm.harness")

#: Sessions whose start_session preload a harness remembers (the oldest is forgotten first).
PRELOADED_SESSIONS = 8192
#: Tries of a forget, compress or decompress whose memory keeps changing under it (each a pager pass or
#: another writer racing it).
RACE_RETRIES = 5


class _MovedOn(Exception):
    """A forget's ``expected_version`` is older than the memory (not a race to retry): its conflict."""

    def __init__(self, conflict: ConflictError) -> None:
        super().__init__(str(conflict))
        self.conflict = conflict


def _raced(
    conflict: ConflictError, memory_id: str, expected_version: int | None, call: str, versioned: bool = True
) -> ConflictError:
    """The caller's conflict for the store's ``conflict``, which another writer's change won between the
    call's own read and its write: said of the version the caller passed, or (it passed none) as a change
    made meanwhile, naming ``memory_id``, not an ``expected_version`` it never sent. Any other conflict (a
    memory forgotten since it was read) is as raised. A conflict on another memory the call writes with it
    (a forget's raw copy) is said of that one, whose version the caller never saw. ``versioned``: the call
    takes an ``expected_version`` (the fix may offer it)."""
    if conflict.field != "expected_version":
        return conflict
    if conflict.ident != memory_id:
        reason = (
            f"memory {conflict.ident!r}, which this {call} of {memory_id!r} writes too (its raw copy), "
            "changed while it was being written: nothing was written"
        )
    elif expected_version is not None:
        return ConflictError(memory_id, expected_version, conflict.actual)
    else:
        now = f" (it is at version {conflict.actual} now)" if conflict.actual is not None else ""
        reason = f"memory {memory_id!r} changed while this {call} was being written{now}: nothing was written"
    offer = f" (or pass the version you read as expected_version, to {call} that version only)"
    fix = f"retry the {call}: it applies to the memory as it is then" + (offer if versioned else "")
    return ConflictError(memory_id, None, conflict.actual, reason, fix=fix)


def _again_past_races(memory_id: str, call: str, attempt: Callable[[], Memory]) -> Memory:
    """``attempt()``, which reads the memory and writes it, tried again while another writer's change lands
    between its read and its write (a recall's bookkeeping, another process's update): the call takes no
    version, so the change applies to the memory as it is then. The last try's conflict is the caller's
    (:func:`_raced`)."""
    for _ in range(RACE_RETRIES - 1):
        try:
            return attempt()
        except ConflictError:
            continue
    try:
        return attempt()
    except ConflictError as exc:
        raise _raced(exc, memory_id, None, call, versioned=False) from None


_IMMUTABLE = frozenset({"id", "created_at", "version", "changed_version", "tenant"})


def _check_clock(clock: Any) -> None:
    """``clock`` is a callable giving a datetime (the harness's now; a naive one is taken as UTC), or
    :class:`ValidationError`."""
    now = clock() if callable(clock) else None
    if not isinstance(now, datetime):
        got = f"gives {now!r}" if callable(clock) else f"is {clock!r}"
        raise ValidationError(
            "clock", got, "pass a function returning a datetime (the default: clawvm's utcnow)"
        )


class Harness:
    """Harness-managed memory. Create with :meth:`open`; use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        *,
        tenant: str = DEFAULT_TENANT,
        preset_name: str | RecallConfig | None = None,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
        pager: PagerConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        summarizer: Summarizer | None = None,
        prefetch: bool = False,
        redaction: RedactionPolicy | Mapping[str, RedactionPolicy] | None = None,
        data_keys: DataKeys | None = None,
        parallel_query_embedding: bool = True,
    ) -> None:
        max_content_bytes = counted("max_content_bytes", max_content_bytes)
        _check_clock(clock)  # a bad setting is refused where it is made, not at the first record
        self._store = store
        self._reader = ReadOnlyStore(store, self._check_open)  # reads end with the harness
        self.redactor = Redactor(redaction, data_keys)  # write-time redaction (clawvm.core.redact)
        # every write of this harness and of the feature modules it serves goes through here
        self.writer = CommitPath(store, self.redactor, max_content_bytes=max_content_bytes)
        self.embedder = embedder
        self.tenant = tenant
        self._engine = store  # what close() closes besides the store (open() sets the engine of a view)
        self.config = preset(preset_name)
        self.max_content_bytes = max_content_bytes
        self.clock = clock
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer()
        self.pager = Pager(self._reader, self.writer, pager, compress=self._compress_on_archive)
        learned = stored_weights(store, tenant)  # what manual actions taught: loaded on open, not on a look
        if learned is not None:
            scoring = with_weights(self.pager.config.scoring, learned)
            self.pager.config = replace(self.pager.config, scoring=scoring)
        self.writer.rederive_with(
            lambda m: m.model_copy(update={"value": self.pager.value_now(m, self.now())})
        )
        self._worker: EmbedWorker | None = None
        self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="clawvm-prefetch") if prefetch else None
        self.working = WorkingTiers(self._reader, self.pager)  # the record path's view of each working tier
        self.writer.on_commit(self.working.forget)
        # the periodic pager: woken when a record puts a session past its high watermark; its passes and
        # the methods that rewrite a memory they read (``_exclusive``) take turns
        self._exclusive = Turns()
        self.working.foreground_waiting = lambda: self._exclusive.waiting > 0
        self._pager_thread = PagerThread(self._background_pass, self._pager_error)
        self.sweep = Sweep(self._reader, self.pager, tenant)  # tick()'s bounded pass and its cursors
        # session -> memories preloaded for it (from any session); the context builder adds them to its
        # working section. Kept in process: after a restart, start_session again.
        self._preloaded: dict[str, builtins.list[str]] = {}  # the newest PRELOADED_SESSIONS sessions
        self.parallel_query_embedding = parallel_query_embedding
        self._said_no_dense = False  # warned that a dense-only preset finds nothing without an embedder
        self._query_embeds = QueryEmbeddings(embedder) if embedder is not None else None
        self._owns_query_embeds = True

    @property
    def store(self) -> StoreReader:
        """The store, to read: every write goes through this harness (its commit path validates, redacts,
        versions and logs it), so the engine's write methods are not reachable from here."""
        return self._reader

    @classmethod
    def open(
        cls,
        target: str | Path | Store = "memory://",
        *,
        embedder: Embedder | str | None = "default",
        tenant: str = DEFAULT_TENANT,
        preset: str | RecallConfig | None = None,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
        pager: PagerConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        summarizer: Summarizer | None = None,
        prefetch: bool = False,
        redaction: RedactionPolicy | Mapping[str, RedactionPolicy] | None = None,
        data_keys: DataKeys | None = None,
        parallel_query_embedding: bool = True,
        embed_backlog: bool = True,
    ) -> Harness:
        """Open (creating or migrating) a store and start the embedding worker.

        ``target``: a path, ``sqlite:///path``, ``memory://``, or a Store instance.
        ``embedder``: ``"default"`` (offline MiniLM), ``None``/``"none"`` (lexical only), or an Embedder.
        ``pager``: tier budgets and policy; ``clock``: the harness's notion of now (replays pass their
        own); ``summarizer``: for compression (default extractive, or ``compress.LLMSummarizer``);
        ``prefetch``: after each record, warm related memories in a background thread.
        ``redaction``: redact new content at write time (one policy, or one per tenant; see
        :mod:`clawvm.core.redact`); ``data_keys``: seal originals the policy keeps (default: from the
        environment, :mod:`clawvm.store.crypto`).
        ``parallel_query_embedding``: a recall embeds its query in a thread of its own while the text
        channels run (default); ``False`` embeds it first, on the caller's thread (fewer threads on a
        machine whose cores are all busy).
        ``embed_backlog``: start the background worker that embeds what has no vector yet, the store's
        backlog included (default); ``False`` starts none: the embedder embeds queries only, and what this
        harness records waits for the next harness that has one (a look that only reads, which would
        otherwise embed and write a whole backlog, and wait for it on close).
        """
        config = _preset(preset)  # validate options before any I/O
        check_tenant_name(tenant)  # before any I/O: a name no API key could carry is refused everywhere
        if pager is not None and not isinstance(pager, PagerConfig):
            raise ValidationError("pager", f"is a {type(pager).__name__}", "pass clawvm.PagerConfig(...)")
        max_content_bytes = counted("max_content_bytes", max_content_bytes)
        _check_clock(clock)
        embed_backlog = flag("embed_backlog", embed_backlog)
        emb: Embedder | None
        if embedder == "default":
            emb = _default_embedder()
        elif embedder is None or embedder == "none":
            emb = None
        elif isinstance(embedder, str):
            raise ValidationError(
                "embedder", f"unknown embedder {embedder!r}", "use 'default', 'none' or an Embedder"
            )
        else:
            emb = embedder
        engine = target if isinstance(target, Store) else store_from_url(target, dim=emb.dim if emb else 384)
        engine.setup()
        store = engine
        if tenant != DEFAULT_TENANT and not isinstance(engine, TenantStore):
            # a tenant's harness sees the file as the server's tenants do: by id, another tenant's memory is
            # not found, and nothing it writes lands in another tenant (clawvm.store.tenant enforces it)
            store = TenantStore(engine, tenant)
        harness = cls(
            store,
            emb,
            tenant=tenant,
            preset_name=config,
            max_content_bytes=max_content_bytes,
            pager=pager,
            clock=clock,
            summarizer=summarizer,
            prefetch=prefetch,
            redaction=redaction,
            data_keys=data_keys,
            parallel_query_embedding=parallel_query_embedding,
        )
        harness._engine = engine  # closed with the harness (a tenant's view leaves its engine open)
        if emb is not None and embed_backlog:
            harness._worker = EmbedWorker(emb, store.unembedded, harness._set_vectors)
            harness._worker.start()  # picks up anything a previous process left un-embedded
        return harness

    def _set_vectors(
        self, ids: builtins.list[str], vectors: np.ndarray, contents: builtins.list[str]
    ) -> None:
        """The embedding worker's vectors (of ``contents``), stored; dropped once the harness is closed (a
        batch that outlived close's wait would reopen the store behind it): the next open embeds those."""
        if not self.writer.closed:
            self.writer.attach_vectors(ids, vectors, contents)

    # ---- writing ------------------------------------------------------------------------------------
    def record(
        self,
        content: Any,
        *,
        embedding: Sequence[float] | np.ndarray | None = None,
        as_agent: str | None = None,
        **fields: Any,
    ) -> Memory:
        """Store a new memory and return it. Lexically searchable at once; embedded in the background.

        ``embedding`` attaches a precomputed vector instead (it must match the embedder's dimension).
        ``as_agent``: the agent making the write, as for :meth:`update` (default: the memory's own agent),
        which must be allowed to write it (see :mod:`clawvm.teams.shared`).
        Raises :class:`ValidationError` naming the field; nothing is written then.

        A memory whose ``expires_at`` is already past is stored expired (status ``expired``, archive tier):
        the record is kept for analytics and export, but it is never active, so it never reaches a recall
        or a prompt (a late write of a one-hour secret stays out of them).
        """
        with self.working.recording():  # a background pager pass gives way meanwhile
            return self._record(content, embedding, fields, as_agent)

    def check_record(
        self,
        content: Any,
        *,
        embedding: Sequence[float] | np.ndarray | None = None,
        as_agent: str | None = None,
        **fields: Any,
    ) -> None:
        """Raise what :meth:`record` would raise for these arguments, writing nothing: a caller storing
        several memories one record at a time checks them all first, so that it stores all or none (the
        store's own failures aside)."""
        self._new_memory(content, embedding, dict(fields), as_agent)

    def _new_memory(
        self,
        content: Any,
        embedding: Sequence[float] | np.ndarray | None,
        fields: dict[str, Any],
        as_agent: str | None,
    ) -> tuple[Memory, np.ndarray | None, str]:
        """The memory :meth:`record` stores, checked (the write's own checks aside), its vector and its
        text as given."""
        if "version" in fields:
            raise ValidationError("version", "is set by the harness", "leave it out: a new memory is 1")
        # as update() refuses them (the value, access counts and usage would otherwise start inflated, or be
        # dropped without a word); pinned is the exception: record(pinned=True) pins, within the budget
        refuse_set_by_harness({name: v for name, v in fields.items() if name != "pinned"})
        refuse_expiring_by_hand(fields)
        fields = blank_scopes_as_none(fields)
        if isinstance(fields.get("metadata"), Mapping):
            refuse_harness_metadata(fields["metadata"])
        text, ctype = normalize_content(content, self.max_content_bytes)
        vector = self._check_vector(embedding) if embedding is not None else None
        fields.setdefault("tenant", self.tenant)
        fields.setdefault("tier", Tier.WORKING)  # new memories start next to the prompt; the pager moves them
        fields.setdefault("created_at", self.now())
        if fields.get("pinned"):
            refuse_unpinnable(fields, "leave it out")
        if fields.get("pinned") and fields.get("session_id") is not None:
            self.pager.check_pin(
                build_memory({**fields, "content": text, "token_count": count_tokens(text)}), self.now()
            )
        memory = build_memory(
            {
                **fields,
                "content": text,
                "content_type": ctype,
                "token_count": count_tokens(text),
                "version": 1,
            }
        )
        self._refuse_future(memory.created_at)
        teams.check_write(self, memory, as_agent)  # a team memory needs its writer's write grant
        self._check_parent(memory, ancestors=False)  # new: no stored memory descends from it
        if memory.expires_at is not None and memory.expires_at <= self.now():
            memory = memory.model_copy(
                update={"status": Status.EXPIRED, "tier": Tier.ARCHIVE, "pinned": False}
            )
        memory = memory.model_copy(update={"value": self.pager.value_now(memory, self.now())})
        return memory, vector, text

    def _record(
        self,
        content: Any,
        embedding: Sequence[float] | np.ndarray | None,
        fields: dict[str, Any],
        as_agent: str | None = None,
    ) -> Memory:
        memory, vector, text = self._new_memory(content, embedding, fields, as_agent)
        data: dict[str, Any] = {"kind": memory.kind.value, "tier": memory.tier.value}
        if memory.pinned:  # a replay pins it from the start, as it was (no pin event says so)
            data["pinned"] = True
        added = self._make_event(EventKind.ADD, memory, data)
        rows = None if vector is None else vector[None, :]
        try:
            memory = self.working.admit(memory, rows, added, self.now())
        except ConflictError as exc:  # a caller's id that a stored memory has: a create, not an update
            raise ConflictError(
                memory.id,
                None,
                exc.actual,
                f"id: memory {memory.id!r} exists already",
                field="id",
                fix="leave id out to record a new memory, or change that one with update()",
            ) from None
        self._wake_pager()  # record never demotes: the pager pages the session out, in a batch
        # no vector given, or the write path dropped the one given (it was of text redaction changed)
        if (vector is None or memory.content != text) and self._worker is not None:
            self._worker.notify()
        if self._prefetcher is not None:
            self._prefetcher.submit(self._prefetch, memory)
        return memory

    @_exclusive
    def update(
        self,
        /,
        memory_id: str,
        *,
        expected_version: int | None = None,
        as_agent: str | None = None,
        **changes: Any,
    ) -> Memory:
        """Change fields of a memory; its version grows by one (a call that changes nothing returns the
        memory as stored, same version, and logs nothing).

        With ``expected_version``, a memory that has moved on raises :class:`ConflictError`; in every case
        the write itself is compare-and-set, so two concurrent updates never silently overwrite each other:
        without it, another writer's change landing between this call's read and its write (not the
        harness's bookkeeping, which the update goes past) raises :class:`ConflictError` too, naming
        ``memory_id`` (a retry applies the changes to the memory as it is then).
        ``as_agent``: the agent making the change. It (by default: the memory's own agent, before and after
        the change) must be allowed to write the memory, as for ``record``; else :class:`AccessDeniedError`
        and nothing is written (see :mod:`clawvm.teams.shared`).
        """
        bad = _IMMUTABLE.intersection(changes)
        if bad:
            name = sorted(bad)[0]
            raise ValidationError(name, "cannot be changed", "record a new memory that revises this one")
        refuse_set_by_harness(changes)
        refuse_expiring_by_hand(changes)
        changes = blank_scopes_as_none(changes)
        current = self._store.get(memory_id)
        if expected_version is not None and moved_on(current, expected_version):
            raise ConflictError(memory_id, expected_version, current.version)
        try:
            updated = past_bookkeeping(
                current,
                lambda: self._store.get(memory_id),
                lambda read: self._write_update(read, changes, as_agent),
            )
        except ConflictError as exc:
            raise _raced(exc, memory_id, expected_version, "update") from None
        if "content" in changes and self._worker is not None:
            self._worker.notify()
        self._rebalance(updated)
        # as get() shows it: an expires_at set in the past expired it
        return as_seen([updated], self.now())[0]

    def _write_update(self, current: Memory, changes: dict[str, Any], as_agent: str | None) -> Memory:
        """Write ``changes`` to ``current`` as read: its next version (compare-and-set), with its event."""
        self._refuse_expired(current)
        self._refuse_frozen(current)
        changes = keeping_harness_metadata(current, changes, reviewing=as_agent == teams.APPLICATION)
        if current.pinned and leaves_the_prompt(changes):  # archiving or rejecting a pinned memory
            changes = {**changes, "pinned": False}  # unpins it in the same write, as intervene's archive does
        # the stored redaction mark stays with the stored text: a caller can neither drop nor forge it; new
        # text starts unmarked, and the commit path redacts it and seals its original
        mark = Redactor.unchanged(current)
        if "content" in changes:
            text, ctype = normalize_content(changes["content"], self.max_content_bytes)
            mark = Redactor.replaced()
            changes = {**changes, "content": text, "content_type": ctype, "token_count": count_tokens(text)}
            info = current.metadata.get("compression")
            if info:
                # new text supersedes the summary: drop the pointer so decompress cannot bring old text back
                # (the raw copy stays archived, and becomes forgettable)
                metadata = changes.get("metadata", current.metadata)
                changes["metadata"] = {k: v for k, v in metadata.items() if k != "compression"}
                if "links" not in changes:
                    changes["links"] = [link for link in current.links if link.target != info["raw_id"]]
            if text != current.content:
                changes = review_dropped(current, changes, reviewing=as_agent == teams.APPLICATION)
        if teams.review_state(current) == "rejected" and changes.get("status") == Status.ACTIVE.value:
            # a rejection undone by hand, not by approve(): the memory is reviewed again (kept, its author
            # brought it back active at full trust and out of the review queue)
            changes = review_dropped(current, changes, reviewing=as_agent == teams.APPLICATION)
        updated = mark(revalidate(current, {**changes, "version": current.version + 1}))
        teams.check_update(self, current, updated, as_agent)
        if updated.parent_id != current.parent_id:
            self._check_parent(updated, ancestors=True)
        if updated.model_copy(update={"version": current.version}) == current:
            return current  # nothing changes: no new version (that made holders of the old one conflict)
        moved = updated.session_id != current.session_id  # into another session's pinned budget
        requires: tuple[PinBudget, ...] = ()
        if updated.pinned and (moved or updated.token_count > current.token_count):
            self.pager.check_pin(updated, self.now())
            requires = self.pager.pin_budget(updated, self.now())  # checked again in the write, atomically
        updated = updated.model_copy(update={"value": self.pager.value_now(updated, self.now())})
        event = self._make_event(
            EventKind.UPDATE, updated, {"fields": sorted(changes), "version": updated.version}
        )
        tier_moved = self.pager.move_events(current, updated, "update", event.at)
        events = [event, *teams.review_events(current, updated, event.at), *tier_moved]
        return self.writer.write([updated], None, events, requires=requires)[0]

    @_exclusive
    def forget(self, memory_id: str, *, expected_version: int | None = None) -> None:
        """Delete a memory for good (its vector and outgoing links too). With ``expected_version`` (the
        version the caller read), a memory that has moved on since raises :class:`ConflictError` and is
        kept, as :meth:`update` does: a delete decided on an old version must not take a newer one."""
        if expected_version is not None:
            expected_version = counted("expected_version", expected_version)
        for _ in range(RACE_RETRIES - 1):
            try:
                return self._forget(memory_id, expected_version)
            except _MovedOn as stale:  # the caller's version is old: theirs to decide again
                raise stale.conflict from None
            except ConflictError:  # it changed since it was read (a pager pass, another process): again
                continue
        try:
            return self._forget(memory_id, expected_version)
        except _MovedOn as stale:
            raise stale.conflict from None
        except ConflictError as exc:  # it kept changing, each try
            raise _raced(exc, memory_id, expected_version, "forget") from None

    def _forget(self, memory_id: str, expected_version: int | None = None) -> None:
        """One try at :meth:`forget`, deleting the memory and its raw copies as read."""
        memory = self._callers(memory_id)
        if expected_version is not None and moved_on(memory, expected_version):
            raise _MovedOn(ConflictError(memory_id, expected_version, memory.version))
        owners = referenced_raw(self._store, memory)
        if owners:
            raise ValidationError(
                "memory_id",
                f"is the raw content of compressed memory {owners[0]}",
                "decompress or forget that memory first",
            )
        # its raw copies (compressed once, maybe decompressed since) hold its original text: they go too
        doomed = [memory, *raw_copies(self._store, memory)]
        events = [self._make_event(EventKind.FORGET, m, {"kind": m.kind.value}) for m in doomed]
        if not self.writer.delete(doomed, events):
            raise NotFoundError("memory", memory_id)
        try:
            adopt_children_of_forgotten(self, memory, frozenset(m.id for m in doomed))
        except ClawVMError as exc:  # the forget stands; a child still names it as its parent (logged)
            log.warning("a child of forgotten memory %s still names it as its parent: %s", memory.id, exc)
        try:  # before the conflicts: a side whose earlier revision is head again is still a side
            mend_chain_of_forgotten(self, memory)
        except ClawVMError as exc:  # the forget stands; the chain's earlier revisions stay obsolete
            log.warning("the chain of forgotten memory %s was left as it was: %s", memory.id, exc)
        try:
            teams.close_conflicts_of_forgotten(self, memory)
        except ClawVMError as exc:  # the forget stands (a retry would say "not found"); guidance skips it
            log.warning("a conflict of forgotten memory %s was left open: %s", memory.id, exc)
        try:
            unquote_forgotten(self, memory)
        except ClawVMError as exc:  # the forget stands; a note or pitfall still quotes it (logged)
            log.warning("a team memory still quotes forgotten memory %s: %s", memory.id, exc)

    def import_memories(self, memories: Sequence[Memory], *, restore: bool = False) -> int:
        """:meth:`import_renamed`, returning how many memories were written."""
        return self.import_renamed(memories, restore=restore).imported

    @_exclusive
    def import_renamed(self, memories: Sequence[Memory], *, restore: bool = False) -> Imported:
        """Store exported memories as they are (ids, versions, timestamps kept), in one atomic batch.

        Ids already present are skipped, so importing the same file twice is harmless. Returns how many
        were written, the ids that were stored under another id, and the skipped ids whose stored content
        differs from the file's (kept as stored: an import never overwrites). They are embedded in the
        background like new records.

        On a tenant's view of a shared store, an id that another tenant holds is neither refused nor
        shared: the memory is stored under an id of this tenant's own, derived from (tenant, id) — the same
        at every import — and its references (``parent_id``, link targets) follow
        (:meth:`clawvm.store.tenant.TenantStore.import_ids`); ``renamed`` lists them. A tenant's view also
        imports another tenant's export into its own tenant (the file's ``tenant`` field was refused).

        Each memory passes the checks of a write first (:func:`.importing.check`): no status ``internal`` (the
        harness's own records: a grant cannot be forged by importing one) and no sealed original that this
        store's data keys cannot open; else :class:`ValidationError` naming ``memories.<i>.<field>`` and
        nothing is written. ``restore``: an operator restoring this store's own backup (``clawvm import``,
        which holds the database anyway) skips those two checks, so a lossless backup comes back whole.
        """
        imported = importing.import_memories(self, self._store, memories, restore)
        # the sessions it filled are due for the pager (a hundred imported working memories stayed over
        # the budget through flush() and page(): no pass knew of them)
        for tenant, session_id in imported.sessions:
            self.working.mark_due(tenant, session_id)
        if imported.sessions:
            self._wake_pager()
        return imported

    # ---- reading ------------------------------------------------------------------------------------
    def get(self, memory_id: str) -> Memory:
        """The memory ``memory_id`` as reads show it (past its ``expires_at``: expired, swept or not; the
        stored object is ``h.store.get``); :class:`NotFoundError` when there is none
        (:class:`ValidationError` when it is not a string)."""
        return as_seen([self._store.get(memory_id)], self.now())[0]

    def reveal(self, memory_id: str, *, admin: bool = False) -> str:
        """The original content of a memory stored redacted, opened with the data key; admins only.

        ``admin`` is the caller's capability (the server passes it for the admin role): without it,
        :class:`AccessDeniedError`. Each reveal is logged as a ``reveal`` event. Raises
        :class:`NotFoundError` when the original was not kept, :class:`clawvm.WrongKeyError` or
        :class:`clawvm.TamperedError` when it cannot be opened.
        """
        if admin is not True:
            raise AccessDeniedError("role", "may not reveal redacted content", "ask an admin of the tenant")
        memory = self._callers(memory_id)
        if memory.tenant != self.tenant:  # as if it did not exist, like another tenant's id on the server
            raise NotFoundError("memory", memory_id)
        original = self.redactor.reveal(memory)
        self._event(EventKind.REVEAL, memory, {})
        return original

    def recall(
        self,
        query: str,
        k: int = 10,
        *,
        preset: str | RecallConfig | None = None,
        track: bool = True,
        **filters: Any,
    ) -> list[Recalled]:
        """The ``k`` best memories for ``query`` under ``filters`` (default: this tenant, status active).

        With ``track`` (default) the hits count as accessed: their access stats grow and the pager may
        promote them to the working tier. That bookkeeping (and the recall's event) is written by the next
        pager pass, in the background or at the next lifecycle boundary (``flush()``, ``context()``,
        ``close()``), not before the recall returns; ``PagerConfig(defer_access=False)`` writes it here.
        """
        if not isinstance(query, str):
            raise ValidationError("query", f"has type {type(query).__name__}", "pass a string")
        k = counted("k", k)
        cfg = self.config if preset is None else _preset(preset)
        f = self.filters(filters)
        started = time.perf_counter()
        vector: np.ndarray | PendingVector | None = None
        if self.embedder is None and dense_only(cfg) and not self._said_no_dense:
            self._said_no_dense = True  # once: it finds nothing, on every call (the CLI refuses it)
            log.warning(
                "recall preset %r searches by embedding only, and this harness has no embedder: it finds "
                "nothing; open the harness with an embedder, or use a preset with text channels "
                "(hybrid, bm25)",
                cfg.name,
            )
        named = query_authors(self._store, query, cfg, f)
        if cfg.uses("dense") and self.embedder is not None and query.strip():
            vector = self._query_embedding(dense_text(self._store, query, cfg, f, named))
        hits = run_recall(self._store, query, vector, k, cfg, f, named)
        if not track:
            return seen_hits(hits, self.now())
        # a tracked recall is a stored access: logged (MemLens latency, hit rate, regret) in the same write
        # as the hits' access stats and promotions; the event log keeps no protected text either
        logged = self.redactor.scrub(query, self.tenant)
        now = self.now()
        retrieved = _retrieve_event(self.tenant, now, logged, k, hits, started)
        if self.pager.config.defer_access:  # written by the next pager pass, with the other recalls'
            if self.working.accessed([h.memory for h in hits], now, [retrieved]):
                try:
                    self._write_recalls(now)  # too much waits (no pass for long): written here
                except StoreError as exc:  # the recall itself succeeded: a caller retrying it would count
                    # its accesses twice. What was not written waits for the next pass (unless half written)
                    log.warning("a recall's queued bookkeeping was not written: %s", exc)
                    self._pager_error(exc)
            self._wake_pager()
            return seen_hits(hits, now)
        if not hits:
            self.writer.log([retrieved])
            return hits
        warmed = {m.id: m for m in self.working.warm([h.memory for h in hits], now, [retrieved])}
        self._wake_pager()  # promotions that put a session past its high mark are paged out in a batch
        # as the caller sees them, after the bookkeeping wrote them as stored
        return seen_hits([Recalled(warmed.get(h.id, h.memory), h.score, h.explain) for h in hits], now)

    def _query_embedding(self, text: str) -> np.ndarray | PendingVector:
        """The query's vector, or its computation begun beside the caller so that the recall's text
        channels run while the model encodes (``parallel_query_embedding``, when it pays: see
        :class:`QueryEmbeddings`)."""
        assert self._query_embeds is not None  # there is an embedder
        return self._query_embeds.vector(text, overlap=self.parallel_query_embedding)

    @property
    def last_query_embed_ms(self) -> float:
        """How long the latest query embedding took, in ms (0.0 before the first)."""
        return self._query_embeds.last_ms if self._query_embeds is not None else 0.0

    def recall_with(
        self, query: str, vector: np.ndarray | None, k: int, cfg: RecallConfig, filters: Filters
    ) -> list[Recalled]:
        """Recall with a precomputed query vector (used by benchmarks to time embedding separately)."""
        return run_recall(self._store, query, vector, k, cfg, filters)

    def list(self, limit: int = 100, **filters: Any) -> builtins.list[Memory]:
        f = self.filters(filters)
        found = self._store.list(f, limit=counted("limit", limit, 0))
        return as_seen(found, instant_of(f) or self.now())  # the filter's instant: one reading of the clock

    def list_page(
        self, limit: int = 100, after: PageKey | None = None, **filters: Any
    ) -> builtins.list[Memory]:
        """The newest memories matching ``filters`` strictly after ``after`` (the :meth:`PageKey.of` the
        last memory of the page before): a keyset page, so memories written between pages neither repeat
        nor vanish, and memories created at one instant are neither (:meth:`list` orders those by row)."""
        if after is not None and not isinstance(after, PageKey):
            fix = "pass PageKey.of(the last memory of the page before)"
            raise ValidationError("after", f"is {after!r}", fix)
        f = self.filters(filters)
        found = self._store.page(f, after, counted("limit", limit, 0), newest_first=True)
        return as_seen(found, instant_of(f) or self.now())

    def count(self, **filters: Any) -> int:
        return self._store.count(self.filters(filters))

    def group_counts(self, **filters: Any) -> dict[GroupKey, int]:
        """How many memories matching ``filters`` (as for :meth:`count`) hold each (kind, status, tier), in
        one read: totals by kind, status and tier derived from it agree with each other while others write
        (separate counts each saw another moment). A memory past its expiry counts as expired, as reads
        show it."""
        return self._store.group_counts(self.filters(filters), self.now())

    def iter_all(self, *, newest_first: bool = False, batch: int = 500, **filters: Any) -> Iterator[Memory]:
        """Every memory matching ``filters`` (as for :meth:`list`), oldest first (newest first with
        ``newest_first``), read in keyset pages of ``batch``: what callers use instead of a "no limit"."""
        if not isinstance(newest_first, bool):
            raise ValidationError("newest_first", f"is {newest_first!r}", "pass True or False")
        f = self.filters(filters)
        pages = self._store.iter_all(f, counted("batch", batch), newest_first)
        now = instant_of(f) or self.now()
        seen = (as_seen([m], now)[0] for m in pages)
        return while_open(seen, self._check_open)  # no page is read once the harness closed

    def events(
        self, after_seq: int = 0, limit: int = 1000, memory_id: str | None = None
    ) -> builtins.list[Event]:
        after, most = counted("after_seq", after_seq, 0), counted("limit", limit, 0)
        return self._store.read_events(after, most, memory_id)

    # ---- virtual memory: value, tiers, paging ---------------------------------------------------------
    def now(self) -> datetime:
        """The harness's clock, in UTC: a clock of naive datetimes is taken as UTC, as stored datetimes
        are (comparing its naive times with the stored aware ones raised TypeError in every call)."""
        now = self.clock()
        return now if now.tzinfo is UTC else as_utc(now)  # the usual clock's time as it is: no copy per call

    def explain(self, memory_id: str) -> ValueBreakdown:
        """Every component of the memory's value score right now (see :mod:`clawvm.vm.scoring`)."""
        return explain_value(self._callers(memory_id), self.now(), self.pager.config.scoring)

    @_exclusive
    def pin(self, memory_id: str) -> Memory:
        """Keep a memory in the working tier (and in every context of its session) until unpinned."""
        memory = self._callers(memory_id)
        self._refuse_expired(memory)
        if memory.status is not Status.ACTIVE:
            raise StateConflictError(
                "memory_id", f"is {memory.status.value}", "only active memories can be pinned"
            )
        if memory.pinned and memory.tier is Tier.WORKING:
            return memory  # pinned already: no new version, no event
        now = self.now()
        before = self.pager.value_now(memory, now)

        def pin_event(read: Memory, pinned: Memory) -> Event:
            data = {
                "from": read.tier.value,
                "to": Tier.WORKING.value,
                "value_before": round(before, 4),
                "value_after": round(pinned.value, 4),
                "reason": "pinned by user",
            }
            return self._move_event(EventKind.PIN, pinned, data)

        # within the session's pinned budget, across processes; its event in the same write
        pinned = self.pager.pin(memory, now, event=pin_event)
        self._rebalance(pinned)
        return pinned

    @_exclusive
    def unpin(self, memory_id: str) -> Memory:
        memory = self._callers(memory_id)
        if not memory.pinned:
            return memory  # nothing to undo: no new version, no event

        def unpinning(current: Memory) -> dict[str, Any]:
            if not current.pinned:  # another caller's unpin landed first
                raise Unchanged
            return {"pinned": False}

        unpinned = self.pager.mutate(
            memory, unpinning, self.now(), event=lambda _read, m: self._move_event(EventKind.UNPIN, m, {})
        )
        self._rebalance(unpinned)
        return unpinned

    @_exclusive
    def rate(self, memory_id: str, delta: int) -> Memory:
        """User feedback: +1 (useful) or -1 (not useful); feeds the value score."""
        if isinstance(delta, bool) or delta not in (-1, 1):  # (True == 1: a flag passed for a vote)
            raise ValidationError("delta", f"is {delta!r}", "pass +1 or -1")
        memory = self._callers(memory_id)
        self._refuse_expired(memory)  # as pin and update do: its value no longer matters to any prompt
        teams.refuse_frozen(self, memory)  # a checkpoint's snapshot or a raw copy: only the harness writes it
        return self.pager.mutate(  # the feedback and its event in one write: a retry never counts twice
            memory,
            lambda m: {"usage": m.usage.model_copy(update={"feedback": m.usage.feedback + delta})},
            self.now(),
            event=lambda _read, m: self._make_event(
                EventKind.FEEDBACK, m, {"delta": delta, "value": m.value}
            ),
        )

    @one_pager_pass  # one budget of time on LLM endpoints for the whole pass
    def tick(self) -> dict[str, int]:
        """One pager pass whose work is bounded and grows with what is due, not with the tenant's size:
        expiry, idle sessions paged out, value drift refreshed a page at a time (see
        :mod:`clawvm.vm.sweep`; its limits are ``self.sweep``'s). Returns ``expired``, ``refreshed`` and
        ``moved`` (tier moves), the due sessions' pager pass included."""
        now = self.now()
        self._write_recalls(now)  # expiry and idleness read the access stats: the recalls' first
        report = self.sweep.run(now).as_dict()
        report["moved"] += len(self.page(now))
        return report

    def page(self, now: datetime | None = None) -> builtins.list[Memory]:
        """One pager pass now: every session past its working tier's high watermark is paged out to the low
        one, and a tier below that grew is brought back within its budget (see :mod:`clawvm.vm.working`).
        Returns the memories moved. Runs by itself in the background and at ``context()``, ``flush()``,
        ``tick()`` and ``close()``. ``now``: the instant the pass judges values at (naive: UTC), else the
        harness's clock."""
        if now is not None and not isinstance(now, datetime):
            raise ValidationError(
                "now", f"is {now!r}", "pass a datetime, or leave it out (the harness's clock)"
            )
        return self._page(None if now is None else as_utc(now), give_way_s=0.0)

    def _page(self, now: datetime | None, give_way_s: float) -> builtins.list[Memory]:
        with self._exclusive, self.pager.endpoint_pass():
            return self.working.run_pass(now or self.now(), give_way_s)

    def _background_pass(self) -> None:
        self._page(None, give_way_s=self.pager.config.give_way_ms / 1000.0)  # records in flight come first

    def _write_recalls(self, now: datetime) -> None:
        """Write the tracked recalls' pending bookkeeping now, in the harness's turn (as a pass would)."""
        with self._exclusive:
            self.working.harvest(now)

    def _wake_pager(self) -> None:
        """Wake the background pager when a session is due or recalls' bookkeeping waits (else the next
        lifecycle boundary does it)."""
        if self.pager.config.background and (self.working.any_due() or self.working.accesses_pending()):
            self._pager_thread.wake()

    def _pager_error(self, exc: Exception) -> None:
        """A background pager pass failed: leave a trace (the sessions stay due for the next pass)."""
        with contextlib.suppress(Exception):  # the store may be closing under it
            self.writer.log(
                [Event(kind=EventKind.PAGER_ERROR, tenant=self.tenant, data={"error": repr(exc)})]
            )

    @_exclusive
    def start_session(
        self, session_id: str, task: str | None = None, *, task_id: str | None = None, k: int = 8
    ) -> builtins.list[Memory]:
        """Preload the working tier with the memories most relevant to ``task`` (of this task, if given)."""
        # checked with or without a task: start_session("") and start_session(123) answered [] unrefused
        named = named_id("session_id", session_id, "name the session (a non-empty string)")
        if task is not None and not isinstance(task, str):
            raise ValidationError("task", f"has type {type(task).__name__}", "pass the task as a string")
        if not task:
            return []
        session_id, task_id = self._stored_id(named, "session_id"), self._stored_id(task_id, "task_id")
        scope = {"task_id": task_id} if task_id else {}
        hits = self.recall(task, k=k, track=False, **scope)
        now = self.now()
        loaded = []
        for h in hits:
            if h.memory.tier is not Tier.WORKING:
                # the harness's own paging, as a recall's promotion is (one forgotten meanwhile: skipped)
                step = functools.partial(
                    self.pager.moved,
                    h.memory,
                    Tier.WORKING,
                    f"preloaded for session {session_id}",
                    now,
                    bookkeeping=True,
                )
                # (left where it was when another caller changed it meanwhile: not preloaded)
                if (done := unless_forgotten(step)) is not None and done.moved:
                    loaded.append(done.memory)
        protect = frozenset(m.id for m in loaded)
        for sid in {m.session_id for m in loaded if m.session_id}:
            self.pager.enforce(self.tenant, sid, now, protect=protect)
        self._preloaded.pop(session_id, None)  # re-inserted as the newest
        self._preloaded[session_id] = [h.id for h in hits]
        while len(self._preloaded) > PRELOADED_SESSIONS:  # a long-lived server meets endless sessions
            del self._preloaded[next(iter(self._preloaded))]
        self.writer.log(
            [
                Event(
                    kind=EventKind.PRELOAD,
                    tenant=self.tenant,
                    at=now,
                    data={"session_id": session_id, "task": task, "ids": [m.id for m in loaded]},
                )
            ]
        )
        return loaded

    def _prefetch(self, memory: Memory) -> None:
        """Background: warm what the next step will likely need (memories related to the new one)."""
        try:
            hits = self.recall(memory.content[:500], k=4, track=False)
            related = [h.memory for h in hits if h.id != memory.id and h.memory.tier is not Tier.WORKING]
            if related:
                self.working.warm(related, self.now())
                self._wake_pager()
        except Exception as exc:  # a background helper must never take the caller down; leave a trace
            self.writer.log(
                [
                    Event(
                        kind=EventKind.PREFETCH_ERROR,
                        memory_id=memory.id,
                        tenant=memory.tenant,
                        data={"error": repr(exc)},
                    )
                ]
            )

    def _rebalance(self, memory: Memory) -> None:
        """After a change that may grow a tier (an update, a decompress, a pin or unpin): re-enforce the
        session's budgets."""
        if memory.session_id is not None:
            self.pager.enforce(memory.tenant, memory.session_id, self.now())

    def _move_event(self, kind: EventKind, memory: Memory, data: dict[str, Any]) -> Event:
        """A pin's or an unpin's event: ``data`` and where the move left the memory."""
        return self._make_event(kind, memory, {**data, "tier": memory.tier.value, "value": memory.value})

    # ---- compression ----------------------------------------------------------------------------------
    def compress(self, memory_id: str) -> Memory:
        """Summarize a memory reversibly (its raw text is kept and pointed to)."""
        memory = self._compressible(memory_id)
        # summarized before taking the turn of the calls that rewrite a memory: an LLM summarizer waits on
        # its endpoint (up to its timeout), and context() and every update would have waited with it
        summarized = summarize_memory(self.summarizer, memory) if is_compressible(memory) else None
        made_of = memory.content  # the text ``summarized`` summarizes: a retry summarizes only a new one

        def attempt() -> Memory:
            nonlocal summarized, made_of
            with self._exclusive:
                current = self._compressible(memory_id)
                if current.content != made_of:  # rewritten meanwhile: summarized again, in the turn
                    made_of, compressible = current.content, is_compressible(current)
                    summarized = summarize_memory(self.summarizer, current) if compressible else None
                return compress_memory(
                    self.writer, current, self.summarizer, self.now(), reason="manual", summarized=summarized
                )

        return _again_past_races(memory_id, "compress", attempt)

    def _compressible(self, memory_id: str) -> Memory:
        """The caller's memory, refused as update() refuses it: expired (its text is due to be forgotten,
        not reshaped), a checkpoint's snapshot or a raw copy (they stay as written)."""
        memory = self._callers(memory_id)
        self._refuse_expired(memory)
        teams.refuse_frozen(self, memory)
        return memory

    @_exclusive
    def decompress(self, memory_id: str) -> Memory:
        restored = _again_past_races(memory_id, "decompress", lambda: self._decompress(memory_id))
        self._rebalance(restored)
        return restored

    def _decompress(self, memory_id: str) -> Memory:
        """One try at :meth:`decompress`, on the memory as read now."""
        current = self._callers(memory_id)
        self._refuse_expired(current)  # decompressing would bring back the text its TTL promised to forget
        info = current.metadata.get("compression")
        requires: tuple[PinBudget, ...] = ()
        if current.pinned and info:  # a pinned memory cannot be demoted: refuse to grow it past the budget
            raw = self._store.get(info["raw_id"])
            self.pager.check_pin(current.model_copy(update={"token_count": raw.token_count}), self.now())
            requires = self.pager.pin_budget(current, self.now())  # checked again in the write, atomically
        return decompress_memory(self._store, self.writer, current, self.now(), requires)

    def _compress_on_archive(self, memory: Memory, reason: str) -> Memory:
        if memory.token_count <= self.pager.config.compress_over_tokens or not is_compressible(memory):
            return memory
        return compress_memory(self.writer, memory, self.summarizer, self.now(), reason=f"archived: {reason}")

    @_exclusive
    def collapse_task(self, task_id: str) -> Memory | None:
        """Compress a finished task's INTERMEDIATE memories into one SUCCESS summary linked to each of them.

        The intermediates are archived, not deleted; the summary ``summarizes`` every one of them.
        """
        # None asked for the steps of no task in particular: every task's were merged into one summary
        task_id = self._stored_id(
            named_id("task_id", task_id, "name the task (a non-empty string)"), "task_id"
        )
        # the task's own steps, read in keyset pages and already in (created_at, id) order
        intermediate = Filters.of(tenant=self.tenant, task_id=task_id, state="intermediate", status="active")
        steps = builtins.list(self._store.iter_all(intermediate))
        if not steps:
            return None
        summary = earlier_collapse(self._store, self.tenant, task_id, steps)
        fallback = None
        if summary is None:
            text = "\n".join(m.content for m in steps)
            summarized = summary_of(self.summarizer, text, max(200, len(text) // 3))
            fallback, first = summarized.fallback, steps[0]
            summary = self.record(
                f"Task {task_id} summary ({len(steps)} steps): {summarized.text}",
                kind=Kind.SUMMARY,
                state=State.SUCCESS,
                task_id=task_id,
                session_id=first.session_id,
                agent_id=first.agent_id,
                links=[{"type": LinkType.SUMMARIZES, "target": m.id} for m in steps],
                metadata={"collapsed": len(steps)},
            )
        now = self.now()
        collapsed = self._make_event(
            EventKind.COLLAPSE, summary, {"task_id": task_id, "steps": [m.id for m in steps]}
        )
        self.pager.archive_together(steps, now, collapsed)  # all of them or none, with the event
        if fallback is not None:  # the LLM gave no usable summary: say why it is extractive
            kind = EventKind.SUMMARIZER_FALLBACK
            self.writer.log([fallback_event(kind, fallback, summary.tenant, summary.id, now)])
        return summary

    # ---- tool calls (clawvm.agents.toolcalls, clawvm.agents.reliability) -----------------------------------
    def tool(self, name: str | None = None, **options: Any) -> Callable[[_F], _F]:
        """Decorator: record every call of a sync or async tool (PENDING call -> SUCCESS/ERROR result).

        Options: ``template``, ``call_template``, ``validator``, ``cost``, ``timeout_errors``, ``redact``,
        ``fallback_for`` and scope defaults (``session_id``, ``task_id``, ``agent_id``, ``tags``); see
        :func:`clawvm.agents.toolcalls.tool`.
        """
        return toolcalls.tool(self, name, **options)

    def tool_call(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        parent_id: str | None = None,
        **options: Any,
    ) -> toolcalls.ToolCall:
        """A context manager (sync or async) recording one call of ``name`` with ``args``.

        ``options``: scope fields and the :class:`clawvm.agents.toolcalls.ToolSpec` fields (template,
        validator...).
        """
        scope = {k: options.pop(k) for k in ("session_id", "task_id", "agent_id", "tags") if k in options}
        toolcalls.spec_options(options)
        spec = toolcalls.ToolSpec(name, **options)
        return toolcalls.ToolCall(self, spec, args, parent_id=parent_id, **scope)

    def restore_session(self, session_id: str) -> toolcalls.RestoreReport:
        """After a restart: mark the session's tool calls left PENDING by a dead process ``interrupted``."""
        return toolcalls.restore(self, session_id)

    def tool_reliability(
        self, tool: str | None = None, policy: reliability.ReliabilityPolicy | None = None
    ) -> dict[str, reliability.ToolStats]:
        """Error rate, timeout rate, latency and fallback per tool (one tool, or every recent one)."""
        if policy is not None and not isinstance(policy, reliability.ReliabilityPolicy):
            raise ValidationError(
                "policy",
                f"is a {type(policy).__name__}",
                "pass clawvm.agents.reliability.ReliabilityPolicy(...)",
            )
        if tool is not None:
            tool = named_id("tool", tool, "name the tool (a non-empty string), or pass None for every tool")
            return {tool: reliability.stats(self, tool, policy)}
        return reliability.all_stats(self, policy)

    # ---- teams (clawvm.teams.shared, clawvm.teams.guidance) ------------------------------------------------
    def grant(self, team_id: str, agent_id: str, *, read: bool = True, write: bool = False) -> teams.Grant:
        """Set an agent's read/write permission on a team's shared memories (see
        :mod:`clawvm.teams.shared`)."""
        return teams.grant(self, team_id, agent_id, read=read, write=write)

    def guidance(
        self,
        agent_id: str,
        task: str,
        budget_tokens: int = 600,
        *,
        task_id: str | None = None,
        task_type: str | None = None,
    ) -> Guidance:
        """Rules, pitfalls, experiences and open conflicts the team has for ``task``, with a manifest."""
        return build_guidance(self, agent_id, task, budget_tokens, task_id=task_id, task_type=task_type)

    @_exclusive
    def feedback(self, memory_id: str, adopted: bool) -> Memory:
        """Count whether guidance from ``memory_id`` was adopted; updates adoption stats and value."""
        return teams.feedback(self, memory_id, flag("adopted", adopted))

    @_exclusive
    def revise(
        self,
        /,
        memory_id: str,
        *,
        agent_id: str | None = None,
        expected_version: int | None = None,
        **changes: Any,
    ) -> Memory:
        """Append a revision of a memory (the old one becomes obsolete); ConflictError if it moved on."""
        return teams.revise(self, memory_id, agent_id=agent_id, expected_version=expected_version, **changes)

    def history(self, memory_id: str) -> builtins.list[Memory]:
        """Every revision of the memory's chain, oldest first."""
        return teams.history(self, memory_id)

    def review_queue(
        self, *, below: float = teams.REVIEW_BELOW, team_id: str | None = None, agent_id: str | None = None
    ) -> builtins.list[Memory]:
        """Memories awaiting review (low confidence, flagged, open conflicts); see teams.review_queue."""
        if isinstance(below, bool) or not isinstance(below, int | float) or not 0 <= below <= 1:
            raise ValidationError("below", f"is {below!r}", "pass a confidence between 0 and 1")
        for name, given in (("team_id", team_id), ("agent_id", agent_id)):
            if given is not None:
                named_id(
                    name, given, f"name the {name.removesuffix('_id')} (a non-empty string), or leave it out"
                )
        return teams.review_queue(self, below=below, team_id=team_id, agent_id=agent_id)

    @_exclusive
    def approve(self, memory_id: str, *, by: str | None = None, reason: str | None = None) -> Memory:
        return teams.approve(self, memory_id, by=by, reason=reason)

    @_exclusive
    def reject(self, memory_id: str, *, by: str | None = None, reason: str | None = None) -> Memory:
        return teams.reject(self, memory_id, by=by, reason=reason)

    @_exclusive
    def resolve_conflict(self, conflict_id: str, *, keep: str, by: str | None = None) -> Memory:
        """Keep one side of a flagged conflict (approved) and reject the others; returns the kept memory.
        ``keep``: the side's id, its newest revision's, or the 8-character short id the note shows."""
        return teams.resolve_conflict(self, conflict_id, keep=keep, by=by)

    def notify_embedder(self) -> None:
        """Tell the embedding worker that memories written outside ``record`` wait for vectors."""
        if self._worker is not None:
            self._worker.notify()

    # ---- checkpoints ----------------------------------------------------------------------------------
    @_exclusive
    def checkpoint(self, session_id: str, name: str) -> str:
        """Snapshot the session's tiers and value state; returns the checkpoint id."""
        name = checkpoints.checked_name(name)
        # None or a blank id snapshotted every memory of the tenant into a checkpoint rollback refused
        named = named_id("session_id", session_id, "name the session (a non-empty string)")
        session_id = self._stored_id(named, "session_id")
        self._write_recalls(self.now())  # the tiers and access stats as the recalls so far left them
        return checkpoints.take(self._store, self.writer, self.tenant, session_id, name, self.now()).id

    def checkpoints(self, session_id: str) -> builtins.list[CheckpointInfo]:
        """The session's checkpoints, newest first: id, name, when, and how many memories each holds."""
        named = named_id("session_id", session_id, "name the session (a non-empty string)")
        return checkpoints.listed(self._store, self.tenant, self._stored_id(named, "session_id"))

    @_exclusive
    def rollback(
        self, checkpoint_id: str, *, guard: Callable[[Sequence[Memory]], None] | None = None
    ) -> RollbackReport:
        """Restore a checkpoint; memories created after it become obsolete (kept for analytics). What is
        restored, exactly: :mod:`clawvm.vm.checkpoint`. ``guard`` sees the memories the rollback would
        obsolete or change beyond the harness's bookkeeping, just before it writes; raising there writes
        nothing (:func:`clawvm.vm.checkpoint.rollback`)."""
        if guard is not None and not callable(guard):
            raise ValidationError("guard", f"is {guard!r}", "pass a function of the memories, or None")
        self._write_recalls(self.now())  # recalls before it are written before it, not onto what it restores
        report = checkpoints.rollback(
            self._store, self.pager, checkpoint_id, self.now(), self.tenant, guard=guard
        )
        # what it restored may put the session's tiers over budget (a memory that grew since is back in
        # working): the next pass brings them within (no pass knew the session was due: it stayed over
        # budget until a context). Restored as it was checkpointed until then.
        session_id = self._store.get(report.checkpoint_id).session_id
        if session_id is not None:
            self.working.mark_due(self.tenant, session_id)
            self._wake_pager()
        return report

    # ---- context --------------------------------------------------------------------------------------
    def context(
        self,
        query: str,
        *,
        budget_tokens: int = 2000,
        session_id: str | None = None,
        task_id: str | None = None,
        agent_id: str | None = None,
        k: int | None = None,
        neighbours: int = 8,
        quotas: Quotas | None = None,
        record_usage: bool = True,
        vector: np.ndarray | None = None,
        tools: Sequence[str] | None = None,
        read_only: bool = False,
    ) -> Context:
        """A prompt-ready context for ``query`` under ``budget_tokens``, with the manifest of every line.

        Packs pinned memories of the scope, then its working tier, then retrieved memories (with the
        neighbours of the best ``neighbours`` hits), never over budget (see :mod:`clawvm.vm.context`; the
        build and what it records: :mod:`.assembly`).
        ``tools``: tools the task is about to use; a warning line (first in the text) for each unreliable
        one, inferred from the scope's recent calls when None (see :mod:`clawvm.agents.reliability`).
        ``read_only``: write nothing (a read-only caller's build): no pager pass over the session, no usage
        and no ``context`` event, so the context's ``event_seq`` stays None (MemLens cannot trace it).
        """
        if not isinstance(query, str):
            raise ValidationError("query", f"has type {type(query).__name__}", "pass a string")
        budget_tokens = counted("budget_tokens", budget_tokens)
        neighbours = counted("neighbours", neighbours, 0)
        if quotas is not None and not isinstance(quotas, Quotas):
            raise ValidationError(
                "quotas", f"is a {type(quotas).__name__}", "pass clawvm.Quotas(...), or leave it out"
            )
        # hits to fill most of the budget; neighbours fill the rest
        k = max(20, budget_tokens // 40) if k is None else counted("k", k)
        session_id, task_id = self._stored_id(session_id, "session_id"), self._stored_id(task_id, "task_id")
        agent_id = self._stored_id(agent_id, "agent_id")
        request = assembly.Request(
            query=query,
            budget_tokens=budget_tokens,
            scope=toolcalls.scope_fields(session_id, task_id, agent_id),
            k=k,
            neighbours=neighbours,
            quotas=quotas or Quotas(),
            record_usage=record_usage,
            read_only=read_only,
            vector=vector,
            tools=tools,
            preloaded=self._preloaded.get(session_id or "", []),
        )
        return assembly.build(self, request)

    # ---- lifecycle ----------------------------------------------------------------------------------
    def share_query_embeddings(self, shared: QueryEmbeddings) -> None:
        """Embed queries with ``shared`` (one pool of threads for the harnesses of a server's tenants), which
        its owner closes; this harness's own is closed now."""
        own, self._query_embeds, self._owns_query_embeds = self._query_embeds, shared, False
        if own is not None and own is not shared:
            own.close()

    def share_embed_worker(self, worker: EmbedWorker | None) -> None:
        """Notify ``worker`` of new content, one worker shared by many harnesses (a server has one for all
        its tenants, straight on the engine); whoever started it flushes and stops it."""
        self._worker = worker

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every recorded memory is embedded, and run a pager pass (a lifecycle boundary).
        Nothing to do once closed: close() ran the last pass, and what it left unembedded (``wait=False``)
        the next open embeds."""
        if timeout is not None:  # past TIMEOUT_MAX the wait itself raised OverflowError
            fix = "pass seconds (a number, 0 or more), or None to wait"
            within("timeout", timeout, 0.0, threading.TIMEOUT_MAX, fix)
        if self.writer.closed:
            return
        if self._worker is not None:
            self._worker.flush(timeout)
        self.page()

    def close(self, wait: bool = True) -> None:
        """Stop the worker (after draining the queue unless ``wait=False``), run the last pager pass and close
        the store. Every method but ``close``, ``flush``, ``now`` and ``filters`` refuses afterwards
        (:class:`StateConflictError`), reads through :attr:`store` too; closing again closes the store
        again (harmless)."""
        if self.writer.closed:
            self._close_store()
            return
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=True)
            self._prefetcher = None
        self._pager_thread.stop()
        if self._query_embeds is not None and self._owns_query_embeds:
            self._query_embeds.close()
        try:
            if self.working.any_due() or self.working.accesses_pending():
                self.page()
        finally:  # a last pass that failed still leaves the worker stopped and the store closed
            worker, self._worker = self._worker, None
            try:
                if worker is not None and wait:
                    worker.flush()  # raises what the embedder failed with: after the rest is closed
            finally:  # a failing embedder too: what it left unembedded, the next open embeds
                if worker is not None:
                    worker.stop()
                self.writer.close()  # a write after this would never be embedded or paged: refused
                self._close_store()

    def _check_parent(self, memory: Memory, *, ancestors: bool) -> None:
        """``memory``'s parent is a stored memory of this tenant, other than itself; with ``ancestors``
        (a parent changed by an update), not one of its own descendants either. A dangling or circular
        parent hid the memory and its children from a run's trace."""
        parent = memory.parent_id
        if parent is None:
            return
        fix = "name a stored memory (the step this one follows from), or leave parent_id out"
        if parent == memory.id:  # a cycle of one: refused as the longer ones below are (a 409 over HTTP)
            raise StateConflictError("parent_id", "is the memory's own id (a cycle)", fix)
        found = self._store.get_many([parent]).get(parent)
        # (the owner's view reads every tenant's memories: a parent is one of the memory's own tenant)
        if found is None or found.tenant != memory.tenant:  # well formed, but not what the store holds
            raise StateConflictError(
                "parent_id", f"names no stored memory of tenant {memory.tenant!r} ({parent})", fix
            )
        seen = {memory.id, parent}
        step = found.parent_id if ancestors else None
        while step is not None and step not in seen:  # up the parent's chain, to a root or a known id
            seen.add(step)
            above = self._store.get_many([step]).get(step)
            step = None if above is None else above.parent_id
        if step == memory.id:
            raise StateConflictError("parent_id", f"{parent} descends from this memory (a cycle)", fix)

    def _check_open(self) -> None:
        if self.writer.closed:
            raise closed_harness()

    def _close_store(self) -> None:
        self._store.close()
        if self._engine is not self._store:  # the engine under the tenant view open() made
            self._engine.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers ------------------------------------------------------------------------------------
    def filters(self, given: Mapping[str, Any]) -> Filters:
        """Callers' filters: this tenant and active memories unless they say otherwise; never INTERNAL
        (a status list that names it among others leaves it out; asking for it alone is refused).

        Expiry is a read-time filter: asking for active memories (the default) also leaves out those whose
        ``expires_at`` has passed, whether or not a ``tick()`` has marked them expired yet."""
        args = dict(given)
        args.setdefault("tenant", self.tenant)
        status = args.setdefault("status", "active")
        if (
            status is None
            or status == "any"
            or (isinstance(status, list | tuple | set | frozenset) and "any" in status)
        ):
            args["status"] = VISIBLE_STATUSES  # "any" among others too, as the API takes it
        try:
            f = Filters.of(**args)
        except ValidationError as exc:
            if exc.field != "status":
                raise
            shown = ", ".join(repr(x) for x in STATUS_CHOICES)
            raise ValidationError("status", exc.problem, f"use one of {shown}") from None
        asked = f.status or frozenset()
        active, expired = Status.ACTIVE.value in asked, Status.EXPIRED.value in asked
        if active and not expired:
            f = f if f.live_at is not None else f.with_(live_at=self.now())  # due is as good as expired
        elif expired and not active:
            # expired ones, swept or not: the active ones due by now too (a read writes nothing)
            due_by = f.active_due_by or self.now()
            f = f.with_(status=asked | {Status.ACTIVE.value}, active_due_by=due_by)
        if f.status is not None and Status.INTERNAL.value in f.status:  # the harness's own records (grants)
            if f.status == {Status.INTERNAL.value}:  # else it answered "none", which was never true
                raise ValidationError(
                    "status",
                    "is internal: those are the harness's own records (team grants, learned weights), "
                    "never listed or recalled",
                    "ask for a status callers see (active, archived, obsolete, expired), or 'any'",
                )
            f = f.with_(status=f.status - {Status.INTERNAL.value})
        return self._stored_ids(f)

    @overload
    def _stored_id(self, value: str, field: str) -> str: ...

    @overload
    def _stored_id(self, value: None, field: str) -> None: ...

    def _stored_id(self, value: str | None, field: str) -> str | None:
        """A scope id a caller names (``field``: None or a string), as the write path stored it
        (:meth:`CommitPath.identifier`)."""
        if value is None:
            return None
        if not isinstance(value, str):  # else an AttributeError from deep in the build
            raise ValidationError(field, f"is a {type(value).__name__} ({value!r})", "pass a string")
        return self.writer.identifier(value, self.tenant)

    def _stored_ids(self, f: Filters) -> Filters:
        """``f`` with its scope ids and tags as the write path stored them: a caller filtering by the
        secret-looking session id it recorded with finds that session's memories."""
        if self.redactor.policy_for(self.tenant) is None:
            return f
        changes: dict[str, frozenset[str]] = {}
        for name in (*SCOPE_IDS, "tags_all", "tags_any"):
            given: frozenset[str] | None = getattr(f, name)
            if given:
                stored = frozenset(self.writer.identifier(v, self.tenant) for v in given)
                if stored != given:
                    changes[name] = stored
        return f.with_(**changes) if changes else f

    def _callers(self, memory_id: str) -> Memory:
        """The stored memory ``memory_id`` that a caller's id-taking method acts on; a record of the
        harness's own (a team grant, the learned weights) is refused, naming ``memory_id``: reached by its
        id, it was rated, moved and explained like a caller's memory."""
        memory = self._store.get(memory_id)
        refuse_internal(memory)
        return memory

    def _check_vector(self, embedding: Sequence[float] | np.ndarray) -> np.ndarray:
        dim = self.embedder.dim if self.embedder else self._store.dim
        vector: np.ndarray = check_stored_vectors(1, embedding, dim, field="embedding")[0]
        return vector

    def _refuse_frozen(self, memory: Memory) -> None:
        """A memory that only the harness may change: a checkpoint's snapshot or a compressed memory's raw
        copy (:func:`clawvm.teams.shared.refuse_frozen`), or one a later revision or a merge replaced (a
        change, reviving it above all, would give its chain two heads). An obsolete memory that nothing
        replaced (rejected, rolled back, marked so by hand) may be changed back."""
        teams.refuse_frozen(self, memory)
        if (replaced_by := teams.successor(memory)) is not None:
            raise StateConflictError(
                "memory_id",
                f"{memory.id} was replaced by {replaced_by} (a revision or a merge)",
                "change the head of its chain (see history(id)), or revise it",
            )

    def _refuse_future(self, created_at: datetime) -> None:
        """A new memory made after the harness's clock (by more than :data:`CLOCK_SKEW`) is refused."""
        problem = ahead_of_clock(created_at, self.now())
        if problem is not None:
            raise ValidationError("created_at", problem, AHEAD_OF_CLOCK_FIX)

    def _refuse_expired(self, memory: Memory) -> None:
        """A memory whose TTL ran out stays out: a change would bring back text it promised to forget."""
        due = memory.expires_at is not None and memory.expires_at <= self.now()
        if memory.status is Status.EXPIRED or (due and memory.status is Status.ACTIVE):
            raise StateConflictError("memory_id", f"{memory.id} has expired", "record a new memory instead")

    def _event(self, kind: EventKind, memory: Memory, data: dict[str, Any]) -> None:
        self.writer.log([self._make_event(kind, memory, data)])

    def _make_event(self, kind: EventKind, memory: Memory, data: dict[str, Any]) -> Event:
        return Event(kind=kind, memory_id=memory.id, data=data, tenant=memory.tenant, at=self.now())


def _retrieve_event(
    tenant: str, now: datetime, query: str, k: int, hits: Sequence[Recalled], started: float
) -> Event:
    """What a tracked recall found, with each hit's score, tier and value before warming, and its latency."""
    return Event(
        kind=EventKind.RETRIEVE,
        tenant=tenant,
        at=now,
        data={
            "query": query[:500],
            "k": k,
            "ms": round((time.perf_counter() - started) * 1000, 3),
            "hits": [
                {"id": h.id, "score": round(h.score, 4), "tier": h.memory.tier.value, "value": h.memory.value}
                for h in hits
            ],
        },
    )


def _preset(p: str | RecallConfig | None) -> RecallConfig:
    return preset(p)


_DEFAULT: MiniLMEmbedder | None = None


def _default_embedder() -> MiniLMEmbedder:
    """One process-wide default model (loading it twice would only cost memory)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MiniLMEmbedder()
    return _DEFAULT


# ---- a closed harness ------------------------------------------------------------------------------------
#: What a closed harness still answers: closing again, and what touches no store. Every other public
#: method refuses, like a closed file: a read after close() used to answer, and to write its bookkeeping
#: (access counts, a context's event) to a store its owner had closed.
_ANSWERED_AFTER_CLOSE = frozenset({"close", "flush", "now", "filters"})


def _refused_once_closed(method: Callable[..., _R]) -> Callable[..., _R]:
    @functools.wraps(method)
    def run(self: Harness, /, *args: Any, **kwargs: Any) -> _R:
        self._check_open()
        return method(self, *args, **kwargs)

    return run


# enforced here and nowhere else: each public method of the class body, whatever layer it reaches into
for _name, _method in builtins.list(vars(Harness).items()):
    a_method = callable(_method) and not isinstance(_method, classmethod | staticmethod | property)
    if a_method and not _name.startswith("_") and _name not in _ANSWERED_AFTER_CLOSE:
        setattr(Harness, _name, _refused_once_closed(_method))
