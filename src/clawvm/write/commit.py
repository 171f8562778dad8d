"""The one write path: every change to stored memories and every event goes through :class:`CommitPath`.

Enforced here and nowhere else. A write of memories passes, in this order:

1. **validation**: each is a :class:`Memory` (built and validated by :func:`clawvm.core.model.build_memory`
   or :func:`~clawvm.core.model.revalidate`) with a tenant, a positive version, no id twice in a batch,
   content within ``max_content_bytes``; vectors of the store's dimension;
2. **redaction**: its content as the tenant's redaction policy stores it (token count recounted and the
   value re-derived when the text changed), and every string of its metadata (tool-call arguments, error
   messages, review reasons, checkpoint names, annotations ...) likewise, read with its key as context
   (an integer that is a card or a phone number too, as in JSON content), and the sealed original
   (``metadata["redaction"]``) is left as it is; its scope ids (session, task, agent, team, tool) and
   tags as identifiers
   (:func:`clawvm.core.redact.redact_identifier`: one stored form per original, so a secret-looking
   session id neither leaks nor splits its session; readers map the ids they filter by with
   :meth:`CommitPath.identifier`);
3. **encryption of originals**: when the policy keeps them, the original text sealed with the data key
   into ``metadata["redaction"]`` (:mod:`clawvm.store.crypto`);
4. **optimistic version check** and **store write**: the engine stores the batch only if every version is
   one more than the stored one, with its vectors and the **events** the caller passes in the same step
   (one transaction on engines that have them): never half a batch, and never a change without the events
   it was written with. Deletes are version-checked the same way, with their events in the same step.
   (Bookkeeping writes, such as access counts and value refreshes batched into one event, pass fewer
   events than memories, by design.);
5. **cache invalidation**: the listeners (:meth:`CommitPath.on_commit`) hear which memories changed.

Events are redacted too: every string in an event's ``data`` is scrubbed with the tenant's policy (the
values of scope-id keys, ``session_id`` ..., as identifiers, so they match the memories'), so the log holds
no text the memories could not. A caller that must shorten text (an event's excerpt, a tool's
result cut to its limit) scrubs it first with :meth:`CommitPath.scrub`: a secret cut in half is no longer
recognisable afterwards.

The embedding worker's vectors, computed after the memory was stored, are attached here too
(:meth:`CommitPath.attach_vectors`): derived from stored text, they need no redaction and log no event.

Feature modules (teams, the pager, tool calls, learning ...) get the narrow :class:`Writer` protocol and a
read-only store (:class:`clawvm.store.base.StoreReader`); so does a caller of ``Harness.store``
(:class:`clawvm.store.base.ReadOnlyStore`). Only this module writes to the store.
Store-level maintenance that must keep bytes exactly (``clawvm migrate``, data-key rotation) works below it.

Redaction runs on every memory of every write, not only on new text: a caller cannot skip it by changing
content in a bookkeeping write. What makes that cheap is :class:`_CleanTexts`, a bounded memo of texts
already found clean (stored contents are, by construction), so a pager move of a known memory costs a
dictionary lookup instead of the detectors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

import numpy as np

from clawvm.core.embed import count_tokens
from clawvm.core.errors import ConflictError, StateConflictError, ValidationError
from clawvm.core.model import DEFAULT_MAX_CONTENT_BYTES, JSON, MAX_COUNT, SCOPE_IDS, Memory, moved_on
from clawvm.core.redact import RedactionPolicy, redact_identifier, redact_json
from clawvm.store.base import Event, Requirement, Store, StoreReader
from clawvm.store.crypto import REDACTION_FIELD
from clawvm.write.redaction import Redactor

log = logging.getLogger("clawvm.write")

#: Called after a commit with the memories it wrote (as stored) and the ids it deleted.
Listener = Callable[[Sequence[Memory], Sequence[str]], None]
#: Re-derives fields that depend on the content (the value score) after redaction changed the content.
Rederive = Callable[[Memory], Memory]


# how a text was checked (see _CleanTexts)
_TEXT, _JSON, _METADATA, _IDENTIFIER = "text", "json", "metadata", "identifier"


@dataclass(frozen=True)
class Committed:
    """What one commit stored: the memories as stored, and the numbers of its events (in order, as the
    caller's store numbers them: its tenant's own sequence behind a tenant's view)."""

    memories: list[Memory]
    event_seqs: list[int]


class Writer(Protocol):
    """What a feature module may do to stored state: write memories (with their vectors and events),
    delete them, or log events that accompany no memory. Implemented by :class:`CommitPath`."""

    def write(
        self,
        memories: Sequence[Memory],
        vectors: np.ndarray | None = None,
        events: Sequence[Event] = (),
        *,
        bookkeeping: bool = False,
        scrubbed_vectors: bool = False,
        restored: Collection[str] = (),
        imported: Collection[str] = (),
        requires: Sequence[Requirement] = (),
    ) -> list[Memory]: ...

    def commit(
        self, memories: Sequence[Memory], events: Sequence[Event], *, bookkeeping: bool = False
    ) -> Committed: ...

    def delete(self, memories: Sequence[Memory], events: Sequence[Event] = ()) -> int: ...

    def attach_vectors(
        self, ids: Sequence[str], vectors: np.ndarray, contents: Sequence[str] | None = None
    ) -> None: ...

    def log(self, events: Sequence[Event]) -> list[int]: ...

    def scrub(self, text: str, tenant: str) -> str: ...

    def identifier(self, value: str, tenant: str) -> str: ...


def logged_with_counts(
    writer: Writer, counted: Callable[[], Sequence[Memory]], event: Event, tries: int
) -> int | None:
    """``event`` written with the harness's own counts it makes (``counted()``: the memories as read
    again, changed), in one commit, so that neither is stored without the other; returns the event's
    number. A memory that moved on meanwhile makes the counts be read and made again; after ``tries``
    such conflicts, None and nothing written (the caller logs the event alone, or refuses)."""
    for _ in range(tries):
        try:
            [seq] = writer.commit(counted(), [event], bookkeeping=True).event_seqs
            return seq
        except ConflictError:
            continue
    return None


def _versioned(memory: Memory, bookkeeping: bool, restored: bool = False) -> Memory:
    """``memory`` with the ``changed_version`` its write gives it (see :meth:`CommitPath.write`): a change
    clears it (None: this version), bookkeeping keeps the last change's (the version before this one, when
    that was the change), and a restored backup keeps what it was exported with."""
    if restored:
        return memory
    if bookkeeping:
        if memory.changed_version is not None or memory.version == 1:
            return memory
        return memory.model_copy(update={"changed_version": memory.version - 1})
    if memory.changed_version is None:
        return memory
    return memory.model_copy(update={"changed_version": None})


T = TypeVar("T")

#: how often :func:`past_bookkeeping` re-reads a memory that bookkeeping keeps moving under a write
BOOKKEEPING_RETRIES = 8


def past_bookkeeping(current: Memory, read: Callable[[], Memory], write: Callable[[Memory], T]) -> T:
    """``write(current)``, a caller's compare-and-set change of the memory it read as ``current``, redone on
    a fresh ``read()`` when it conflicts with the harness's bookkeeping alone: an access count, a citation,
    a promotion or a page-out written between the read and the write (by a recall or pager pass of this
    process or another) is no change the caller could have seen, so it must not fail the caller's write.
    A real change since ``current`` (another caller's update, a manual move) still raises
    :class:`ConflictError`, as does bookkeeping that keeps winning the race ``BOOKKEEPING_RETRIES`` times."""
    for _ in range(BOOKKEEPING_RETRIES):
        try:
            return write(current)
        except ConflictError:
            latest = read()
            if latest.version == current.version or moved_on(latest, current.version):
                raise  # nothing moved (the write refused itself), or a real change did
            current = latest
    return write(current)


class _CleanTexts:
    """A bounded memo of texts the tenant's policy leaves unchanged, keyed by (tenant, how the text was
    checked, digest): content as JSON, content as text, metadata (numbers not checked) and free text are
    checked differently, so one's verdict never answers for another."""

    def __init__(self, capacity: int) -> None:
        self._seen: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    @staticmethod
    def _key(tenant: str, mode: str, text: str) -> tuple[str, bytes]:
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, person=mode.encode())
        return tenant, digest.digest()

    def __contains__(self, item: tuple[str, str, str]) -> bool:
        key = self._key(*item)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return True
            return False

    def add(self, tenant: str, mode: str, text: str) -> None:
        key = self._key(tenant, mode, text)
        with self._lock:
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > self._capacity:
                self._seen.popitem(last=False)


def _past_counts(m: Memory) -> str | None:
    """The field of ``m`` that a change took past :data:`MAX_COUNT` (a memory imported at the limit, then
    changed), if any: stored, the memory could not be read back (the model bounds them)."""
    u = m.usage
    # every write's memories pass here: one max over plain attributes (~0.5 us), the names only past it
    if (
        max(m.version, m.access_count, u.injected, u.cited, u.successes, u.failures, abs(u.feedback))
        <= MAX_COUNT
    ):
        return None
    counts = {"version": m.version, "access_count": m.access_count, **dict(u)}
    for name, n in counts.items():
        if abs(n) > MAX_COUNT:
            return name if name in ("version", "access_count") else f"usage.{name}"
    return None


def _within_counts(m: Memory) -> None:
    if (name := _past_counts(m)) is not None:
        raise ValidationError(
            name,
            f"would pass {MAX_COUNT}, the largest a count may hold",
            "record a new memory in its place (this one cannot change again)",
        )


def closed_harness() -> StateConflictError:
    """The error of a call on a closed harness (its program sees it, and through tools a model too)."""
    fix = "the program that closed it opens a new one (Harness.open)"
    return StateConflictError("harness", "is closed", fix)


class CommitPath:
    """The one commit path over ``store`` (see the module docstring for what it applies, in order)."""

    def __init__(
        self,
        store: Store,
        redactor: Redactor,
        *,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
        memo_size: int = 65536,
    ) -> None:
        self._store = store
        self.redactor = redactor
        self.max_content_bytes = max_content_bytes
        self._listeners: list[Listener] = []
        self._rederive: Rederive | None = None
        self._clean = _CleanTexts(memo_size)
        self._closed = False

    def close(self) -> None:
        """Refuse every later change of a caller's (a write that is not bookkeeping, a delete, a vector):
        its harness closed, and no worker would embed nor pager page what it left. Bookkeeping and events
        still go through (a close's last pager pass writes them); the harness itself refuses every call
        once closed."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def _open(self) -> None:
        if self._closed:
            raise closed_harness()

    def on_commit(self, listener: Listener) -> None:
        """Call ``listener`` after every commit (caches that hold stored memories drop what changed)."""
        self._listeners.append(listener)

    def rederive_with(self, rederive: Rederive) -> None:
        """Use ``rederive`` on a memory whose content redaction changed (the pager's value formula: the
        value depends on the text, and the stored text is the redacted one)."""
        self._rederive = rederive

    # ---- the writes ---------------------------------------------------------------------------------
    def write(
        self,
        memories: Sequence[Memory],
        vectors: np.ndarray | None = None,
        events: Sequence[Event] = (),
        *,
        bookkeeping: bool = False,
        scrubbed_vectors: bool = False,
        restored: Collection[str] = (),
        imported: Collection[str] = (),
        requires: Sequence[Requirement] = (),
    ) -> list[Memory]:
        """Store ``memories`` (new ones at version 1, changed ones at stored version + 1), the vectors of
        the first ones (``vectors``: one row each, in order) and ``events``, atomically. Returns the
        memories as stored. :class:`clawvm.ConflictError` when a version moved on, or a memory past version
        1 is no longer stored (forgotten since it was read: written, it came back): nothing is written.

        ``bookkeeping``: the harness's own changes (access counts, promotions, paging, value refreshes),
        which keep each memory's ``changed_version`` (the version a caller's ``expected_version`` must not
        be older than); any other write is a change, and sets it to the new version.

        ``scrubbed_vectors``: the caller embedded text as the tenant's policy stores it (:meth:`scrub`),
        so its vectors are kept where redaction changed the content; otherwise those are dropped (a vector
        of the raw text encodes the secret) and the embedder embeds what is stored.

        ``restored``: ids of memories a backup of this store gives back as they were; each keeps the
        ``changed_version`` it was exported with (a caller's ``expected_version`` holds as it did).

        ``imported``: ids an import creates at the version it carries (new at any version).

        ``requires``: preconditions the engine checks atomically with the write (a :class:`PinBudget`: the
        pins of a session within its budget); one that fails raises its error, and nothing is written."""
        return self._commit(
            memories,
            vectors,
            events,
            bookkeeping=bookkeeping,
            scrubbed_vectors=scrubbed_vectors,
            restored=restored,
            imported=imported,
            requires=requires,
        ).memories

    def commit(
        self, memories: Sequence[Memory], events: Sequence[Event], *, bookkeeping: bool = False
    ) -> Committed:
        """:meth:`write` of ``memories`` and ``events`` (no vectors), returning the events' numbers too: for
        a writer that hands an event's number out (a context build, an agent's output) and writes the
        changes that go with it in the same step, so that neither is ever stored without the other."""
        return self._commit(memories, None, events, bookkeeping=bookkeeping)

    def _commit(
        self,
        memories: Sequence[Memory],
        vectors: np.ndarray | None,
        events: Sequence[Event],
        *,
        bookkeeping: bool,
        scrubbed_vectors: bool = False,
        restored: Collection[str] = (),
        imported: Collection[str] = (),
        requires: Sequence[Requirement] = (),
    ) -> Committed:
        if not bookkeeping:
            self._open()
        elif vectors is None and any(_past_counts(m) for m in memories):
            # the harness's own bookkeeping is best effort: a memory at the limit keeps its counts, and the
            # rest of the batch (a pager pass, a recall's accesses) is written, not failed with it for good
            kept = [m for m in memories if _past_counts(m) is None]
            log.warning("%d memories at the count limit kept as they were", len(memories) - len(kept))
            memories = kept
        self._validate(memories)
        stored = [self._redacted(_versioned(m, bookkeeping, m.id in restored)) for m in memories]
        rows = stored
        if not scrubbed_vectors:
            rows, vectors = _vectors_of_stored_text(memories, stored, vectors)
        scrubbed = [self._scrubbed(e) for e in events]
        required = self._as_stored(requires)
        seqs = self._store.write(rows, vectors, scrubbed, imported=imported, requires=required)
        self._notify(stored, ())
        return Committed(stored, seqs)

    def delete(self, memories: Sequence[Memory], events: Sequence[Event] = ()) -> int:
        """Delete ``memories`` for good (their vectors and links too) and log ``events``, atomically, if
        each is still at the version given (:class:`clawvm.ConflictError` otherwise: a change that landed
        since it was read is not deleted unseen, and nothing is written)."""
        self._open()
        deleted = self._store.remove(memories, [self._scrubbed(e) for e in events])
        self._notify((), [m.id for m in memories])
        return deleted

    def attach_vectors(
        self, ids: Sequence[str], vectors: np.ndarray, contents: Sequence[str] | None = None
    ) -> None:
        """Attach embeddings to stored memories (:meth:`clawvm.store.Store.set_vectors`: with ``contents``,
        only where a memory still holds exactly that text and no vector). A vector is derived from what the
        commit path already stored, so it logs no event and no cached memory changes."""
        self._open()
        self._store.set_vectors(ids, vectors, contents)

    def log(self, events: Sequence[Event]) -> list[int]:
        """Append events that accompany no memory write (a context build, a recall, a grant read ...)."""
        return self._store.append_events([self._scrubbed(e) for e in events])

    # ---- the steps ----------------------------------------------------------------------------------
    def _validate(self, memories: Sequence[Memory]) -> None:
        seen: set[str] = set()
        for m in memories:
            if not isinstance(m, Memory):
                raise ValidationError("memories", f"holds a {type(m).__name__}", "pass Memory objects")
            if m.id in seen:
                raise ValidationError("id", f"{m.id} appears twice in one write", "write each memory once")
            seen.add(m.id)
            if not m.tenant:
                raise ValidationError("tenant", "is empty", "name the tenant the memory belongs to")
            if m.version < 1:
                raise ValidationError("version", f"is {m.version}", "versions start at 1")
            _within_counts(m)
            size = len(m.content.encode("utf-8", "surrogatepass"))
            if size > self.max_content_bytes:
                raise ValidationError(
                    "content", f"has {size} bytes", f"keep it under {self.max_content_bytes} bytes"
                )

    def scrub(self, text: str, tenant: str) -> str:
        """``text`` as ``tenant``'s policy would store it: for callers that shorten text before writing it."""
        if self.redactor.policy_for(tenant) is None or (tenant, _TEXT, text) in self._clean:
            return text
        scrubbed = self.redactor.scrub(text, tenant)
        self._clean.add(tenant, _TEXT, scrubbed)
        return scrubbed

    def scrub_json(self, value: Any, tenant: str) -> Any:
        """A JSON ``value`` as ``tenant``'s policy would store it as a memory's JSON content (each string
        and number read with its key as context): for callers that index or embed parts of a value, which
        out of its keys' context would not be recognised as the secrets they are (``{"password": "x"}``)."""
        policy = self.redactor.policy_for(tenant)
        return value if policy is None else redact_json(value, policy)[0]

    def identifier(self, value: str, tenant: str) -> str:
        """``value`` (a scope id or a tag) as ``tenant``'s policy stores it: unchanged when nothing is found,
        else its redacted form with a digest of the original (:func:`redact_identifier`). Readers pass the
        ids they filter by through this too, so a caller finds its secret-looking session again."""
        policy = self.redactor.policy_for(tenant)
        if policy is None or (tenant, _IDENTIFIER, value) in self._clean:
            return value
        stored = redact_identifier(value, policy, salt=tenant)
        self._clean.add(tenant, _IDENTIFIER, stored)  # the stored form maps to itself
        return stored

    def _as_stored(self, requires: Sequence[Requirement]) -> list[Requirement]:
        """``requires`` naming sessions as their tenant's policy stores them, as the memories written do."""
        return [replace(r, session_id=self.identifier(r.session_id, r.tenant)) for r in requires]

    def _redacted(self, memory: Memory) -> Memory:
        """``memory`` as its tenant's policy stores it (unchanged when nothing is found)."""
        policy = self.redactor.policy_for(memory.tenant)
        if policy is None:
            return memory
        return self._ids_redacted(self._metadata_redacted(self._content_redacted(memory), policy))

    def _ids_redacted(self, memory: Memory) -> Memory:
        """Scope ids and tags as identifiers (the same input always gives the same stored id)."""
        tenant = memory.tenant
        changed: dict[str, Any] = {}
        for name in SCOPE_IDS:
            value = getattr(memory, name)
            if value is not None and (stored := self.identifier(value, tenant)) != value:
                changed[name] = stored
        tags = [self.identifier(tag, tenant) for tag in memory.tags]
        if tags != memory.tags:
            changed["tags"] = list(dict.fromkeys(tags))  # two originals never share a form; stay unique
        return memory.model_copy(update=changed) if changed else memory

    def _metadata_redacted(self, memory: Memory, policy: RedactionPolicy) -> Memory:
        shown = {k: v for k, v in memory.metadata.items() if k != REDACTION_FIELD}
        if not shown:
            return memory
        key = json.dumps(shown, sort_keys=True, default=str)
        if (memory.tenant, _METADATA, key) in self._clean:
            return memory
        redacted, counts = redact_json(shown, policy)
        if not counts:
            self._clean.add(memory.tenant, _METADATA, key)
            return memory
        kept = (
            {REDACTION_FIELD: memory.metadata[REDACTION_FIELD]} if REDACTION_FIELD in memory.metadata else {}
        )
        self._clean.add(memory.tenant, _METADATA, json.dumps(redacted, sort_keys=True, default=str))
        return memory.model_copy(update={"metadata": {**redacted, **kept}})

    def _content_redacted(self, memory: Memory) -> Memory:
        tenant = memory.tenant
        mode = _JSON if memory.content_type == JSON else _TEXT
        if (tenant, mode, memory.content) in self._clean:
            return memory
        text, mark = self.redactor.on_write(memory.content, memory.content_type == JSON, tenant)
        if text == memory.content:
            self._clean.add(tenant, mode, text)
            return memory
        redacted = mark(memory.model_copy(update={"content": text, "token_count": count_tokens(text)}))
        if self._rederive is not None:
            redacted = self._rederive(redacted)
        self._clean.add(tenant, mode, text)
        return redacted

    def _scrubbed(self, event: Event) -> Event:
        if self.redactor.policy_for(event.tenant) is None or not event.data:
            return event
        data = self._scrub_value(event.data, event.tenant)
        return (
            event if data is event.data else Event(event.kind, event.memory_id, data, event.tenant, event.at)
        )

    def _scrub_value(self, value: Any, tenant: str, key: str | None = None) -> Any:
        """``value`` with every string scrubbed (the value of a scope-id key as an identifier, as the
        memories store it); the same object when nothing changed (the common case)."""
        if isinstance(value, str):
            if len(value) < 6:  # nothing detectable fits in 5 characters
                return value
            return self.identifier(value, tenant) if key in SCOPE_IDS else self.scrub(value, tenant)
        if isinstance(value, dict):
            items = {k: self._scrub_value(v, tenant, k) for k, v in value.items()}
            return value if all(items[k] is value[k] for k in value) else items
        if isinstance(value, list):
            elements = [self._scrub_value(v, tenant) for v in value]
            return value if all(a is b for a, b in zip(elements, value, strict=True)) else elements
        return value

    def _notify(self, written: Sequence[Memory], deleted: Sequence[str]) -> None:
        for listener in self._listeners:
            listener(written, deleted)


class Host(Protocol):
    """What every feature module sees of the harness serving it: its tenant, its clock, the store to read
    and the one write path. Each module extends it with the few harness operations it needs."""

    @property
    def tenant(self) -> str: ...

    @property
    def store(self) -> StoreReader: ...

    @property
    def writer(self) -> Writer: ...

    def now(self) -> datetime: ...


class Recorder(Host, Protocol):
    """A host whose own record and update a feature module calls, so that what those apply beyond the
    write path (grant checks, the pager's budgets, the embedder) applies to the module's writes too."""

    def record(self, content: Any, **fields: Any) -> Memory: ...

    def update(
        self,
        memory_id: str,
        *,
        expected_version: int | None = None,
        as_agent: str | None = None,
        **changes: Any,
    ) -> Memory: ...


def _vectors_of_stored_text(
    given: Sequence[Memory], stored: list[Memory], vectors: np.ndarray | None
) -> tuple[list[Memory], np.ndarray | None]:
    """``stored`` in the order the engine takes them, and the vectors that describe what is stored: a
    caller's vector of a text that redaction then changed encodes the secret (a search for the secret finds
    it), so it is dropped and the memory waits for the embedder like one recorded without a vector. The
    engine reads ``vectors`` as those of the leading memories, so the ones keeping theirs go first."""
    if vectors is None:
        return stored, None
    leading = min(len(vectors), len(stored))
    kept = [i for i in range(leading) if given[i].content == stored[i].content]
    if len(kept) == leading:
        return stored, vectors
    kept_set = set(kept)
    order = [stored[i] for i in kept] + [m for i, m in enumerate(stored) if i not in kept_set]
    return order, (vectors[kept] if kept else None)
