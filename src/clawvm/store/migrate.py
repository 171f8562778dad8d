"""Copy one store into another, any engine to any engine, and prove the copy (``clawvm migrate``).

What is copied: every memory exactly as stored (all tenants and statuses, versions kept: a new id takes
the version it carries), its vector when it has one (in the same write as its memory), the event log in
order with its sequence numbers, the log's and each tenant's (:meth:`Store.import_events`: outputs and
context builds refer to events by number, so ``Lens.influence`` of a copied output still finds its
build) and every credential (API keys: :meth:`clawvm.store.Store.put_credential`, versions kept).
Links travel inside their memories; the search indexes are the target's own. A vector without a direction
(a zero vector, which stores refuse since, written by an older version) is left behind, and not counted
on either side: the target embeds that memory from its text.

The target must be empty: a copy into a store that already holds memories, events or credentials could not
be told apart from them afterwards. Before it looks, the migration claims the target (:meth:`Store.claim`,
atomic on every engine): of two migrations into one target at once, the second is refused
(:class:`ClaimedError`) instead of mixing its rows into the first's. The claim is released once the copy is
verified, and only then: a migration killed midway leaves it behind, so the part it copied is not taken for
the whole (engines refuse to open a claimed store, and a migration into it names it as interrupted; drop
the target and run again). Then the copy is verified: counts and order-independent checksums of
the memories (their exact JSON), of the events (kind, memory, tenant, time and data) and of the credentials
(key, version and data) computed on each side independently, and every vector compared with its source
(engines normalise on write, so the last bits may differ: equal within 1e-5).

Memory use is one batch at a time, so a million memories stream through; the source is read in keyset
pages (``iter_all``), so the copy is linear in its size. A target with a vector index that is cheaper to
build once than to maintain row by row (PostgreSQL's HNSW: :class:`BulkLoading`) has it dropped for the
load and rebuilt after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np

from clawvm.core.errors import ClaimedError, StoreError, ValidationError
from clawvm.core.model import Memory, counted, utcnow
from clawvm.core.vectors import directed_only
from clawvm.store.base import Claim, Credential, Event, Store
from clawvm.store.eventlog import event_pages

Progress = Callable[[str, int], None]  # (what: "memories" | "events", how many more were copied)
_MOD = 2**256
VECTOR_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Summary:
    """Counts and checksums of what a store holds (see the module docstring)."""

    memories: int
    memory_checksum: str
    vectors: int
    events: int
    event_checksum: str
    credentials: int = 0
    credential_checksum: str = ""


@dataclass(frozen=True)
class Report:
    """What ``migrate`` copied, and the verification (None when skipped)."""

    memories: int
    vectors: int
    events: int
    source: Summary | None = None
    target: Summary | None = None
    worst_vector_error: float = 0.0
    credentials: int = 0


@dataclass(frozen=True)
class Verified:
    """What :func:`check` compared: both stores' summaries (equal) and the largest vector difference."""

    source: Summary
    target: Summary
    worst_vector_error: float


@runtime_checkable
class BulkLoading(Protocol):
    """A store whose vector index is dropped before a bulk load and built once after it."""

    def drop_vector_index(self) -> None: ...

    def build_vector_index(self, memory_mb: int = 1024, workers: int = 2) -> float: ...


class _TenantNumbers:
    """Each tenant's own event numbers, in log order (a tenant's events are numbered in the order they
    are logged): read a page at a time from the source's per-tenant sequences."""

    def __init__(self, source: Store) -> None:
        self.source = source
        self.pending: dict[str, deque[int]] = {}
        self.after: dict[str, int] = {}

    def next(self, tenant: str) -> int:
        queue = self.pending.setdefault(tenant, deque())
        if not queue:
            page = self.source.read_events(self.after.get(tenant, 0), 1000, tenant=tenant)
            if not page or page[-1].seq is None:
                raise StoreError(f"tenant {tenant!r} has fewer numbered events than the log holds")
            queue.extend(int(e.seq or 0) for e in page)
            self.after[tenant] = page[-1].seq
        return queue.popleft()


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest(), "big")


def _event_text(e: Event) -> str:
    return json.dumps(
        [e.kind, e.memory_id, e.tenant, e.at.isoformat(), e.data],
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )


def _credential_text(c: Credential) -> str:
    return json.dumps([c.tenant, c.kind, c.name, c.version, c.data], sort_keys=True, ensure_ascii=False)


def _batches(store: Store, size: int) -> Iterator[list[Memory]]:
    batch: list[Memory] = []
    for m in store.iter_all(batch=size):
        batch.append(m)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def copied_vectors(store: Store, ids: list[str]) -> dict[str, np.ndarray]:
    """The vectors of ``ids`` that a copy carries: those with a direction. A zero vector stored by an older
    version would be refused by the target's write (:func:`clawvm.store.base.check_stored_vectors`) and
    halt the copy half done; left behind, its memory is embedded from its text in the target."""
    return directed_only(store.vectors_of(ids))


def summarize(store: Store, batch: int = 500) -> Summary:
    """Counts and checksums of ``store``'s memories, vectors and events."""
    n = vectors = 0
    total = 0
    for memories in _batches(store, batch):
        n += len(memories)
        total = (total + sum(_digest(m.to_json()) for m in memories)) % _MOD
        vectors += len(copied_vectors(store, [m.id for m in memories]))
    events = 0
    etotal = 0
    for page in event_pages(store, batch=1000):
        events += len(page)
        etotal = (etotal + sum(_digest(_event_text(e)) for e in page)) % _MOD
    credentials = 0
    ctotal = 0
    for c in store.iter_credentials():
        credentials += 1
        ctotal = (ctotal + _digest(_credential_text(c))) % _MOD
    return Summary(n, f"{total:064x}", vectors, events, f"{etotal:064x}", credentials, f"{ctotal:064x}")


def migrate(
    source: Store, target: Store, *, batch: int = 500, verify: bool = True, progress: Progress | None = None
) -> Report:
    """Copy ``source`` into the empty ``target`` (both set up), then verify unless ``verify=False``.

    Raises :class:`ClaimedError` when another migration holds the target (running, or killed midway),
    :class:`ValidationError` when the target is not empty and :class:`StoreError` when the verification
    finds a difference. The target stays claimed while it may hold a part only: until the copy is whole.
    Verifying reads both stores and writes nothing, so it runs on an unclaimed target: one that fails it
    (or whose verification was interrupted) can be opened, looked into and checked again
    (:func:`check`), where a claim left on it could only be dropped with the copy.
    """
    batch = counted("batch", batch)  # 0 failed halfway with an IndexError, the target set up and empty
    claim = _claim(target)
    try:  # asked once the claim is held: no other migration can begin to write after this look
        _refuse_unless_empty(target)
    except BaseException:
        target.release(claim)  # nothing was written: the target is as it was
        raise
    report = _copy(source, target, batch, progress)
    target.release(claim)  # the copy is whole: the target may be opened
    if verify:
        verified = _verified(source, target, batch)
        report = replace(
            report,
            source=verified.source,
            target=verified.target,
            worst_vector_error=verified.worst_vector_error,
        )
    return report


def _verified(source: Store, target: Store, batch: int) -> Verified:
    """:func:`check` of a finished copy; a difference says what the target now is and what to do."""
    try:
        return check(source, target, batch)
    except StoreError as exc:
        raise StoreError(
            f"{exc}. The target holds the whole copy as it was read; the usual cause is a write to the "
            "source during the copy: check it again with clawvm.store.migrate.check, or drop it and "
            "migrate again while nothing writes to the source"
        ) from exc


def _claim(target: Store) -> Claim:
    """Claim ``target`` for this migration, or :class:`ClaimedError` naming ``to`` (the CLI's option)."""
    claim = Claim("migration", f"process {os.getpid()} on {socket.gethostname()}", utcnow())
    try:
        target.claim(claim)
    except ClaimedError as exc:
        raise ClaimedError("to", exc.problem, exc.fix) from None
    except ValidationError as exc:  # a store that keeps no claim (a tenant's view)
        raise ValidationError("to", exc.problem, exc.fix) from None
    return claim


def _refuse_unless_empty(target: Store) -> None:
    """:class:`ValidationError` when ``target`` holds memories, events or credentials."""
    held, logged = target.count(), len(target.read_events(limit=1))
    keyed = len(target.list_credentials(limit=1))
    if held or logged or keyed:
        raise ValidationError(
            "to",
            f"already holds {held} memories, {'some' if logged else 'no'} events and "
            f"{'some' if keyed else 'no'} credentials",
            "migrate into an empty store (a new database schema or file)",
        )


def _copy(source: Store, target: Store, batch: int, progress: Progress | None) -> Report:
    """Copy memories with their vectors, then events, then credentials (see the module docstring)."""
    copied = vectors = events = 0
    bulk = target if isinstance(target, BulkLoading) else None
    if bulk is not None:
        bulk.drop_vector_index()
    try:
        for memories in _batches(source, batch):
            found = copied_vectors(source, [m.id for m in memories])
            # the embedded memories first: Store.write takes vectors for its leading memories
            ordered = sorted(memories, key=lambda m: m.id not in found)
            copies = {m.id for m in memories}  # new in the target at the versions they carry
            if found:
                target.write(ordered, np.stack([found[m.id] for m in ordered[: len(found)]]), imported=copies)
            else:
                target.put_many(ordered, imported=copies)
            copied += len(memories)
            vectors += len(found)
            if progress:
                progress("memories", len(memories))
    finally:
        if bulk is not None:
            bulk.build_vector_index()
    numbers = _TenantNumbers(source)
    for page in event_pages(source, batch=1000):
        target.import_events(page, [numbers.next(e.tenant) for e in page])
        events += len(page)
        if progress:
            progress("events", len(page))
    credentials = 0
    for credential in source.iter_credentials():
        target.put_credential(credential)  # new to the target: stored at its own version
        credentials += 1
    return Report(copied, vectors, events, credentials=credentials)


def check(source: Store, target: Store, batch: int = 500) -> Verified:
    """Verify that ``target`` holds what ``source`` holds: equal summaries and every vector within
    :data:`VECTOR_TOLERANCE`; :class:`StoreError` on any difference."""
    before, after = summarize(source, batch), summarize(target, batch)
    if before != after:
        raise StoreError(f"the copy differs from its source: source {before}, target {after}")
    worst = 0.0
    for memories in _batches(source, batch):
        ids = [m.id for m in memories]
        want, got = copied_vectors(source, ids), copied_vectors(target, ids)
        if want.keys() != got.keys():
            raise StoreError(f"vectors differ: {len(want)} in the source batch, {len(got)} in the target")
        for i, v in want.items():
            worst = max(worst, float(np.max(np.abs(v - got[i]))) if len(v) else 0.0)
    if worst > VECTOR_TOLERANCE:
        raise StoreError(f"a copied vector differs from its source by {worst:.2e} (> {VECTOR_TOLERANCE})")
    return Verified(before, after, worst)
