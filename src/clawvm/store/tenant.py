"""One tenant's view of a shared :class:`Store`: every read and write confined to that tenant.

A multi-tenant host (``clawvm serve``) opens one engine and gives each tenant's Harness a
``TenantStore`` over it, so isolation is a property of the storage layer, not of every route remembering
a filter. The rules, each enforced here and nowhere else:

- reads: ``get_many`` drops memories of other tenants (a ``get`` of another tenant's id is
  :class:`NotFoundError`, exactly as for an id that does not exist); ``query``/``count``/``page``
  (and ``session_ids``/``tag_names``) run with the tenant filter forced to this tenant, and
  ``around``/``expand`` seeds of other tenants are dropped (the index answers for seeds whatever the
  filters); ``edges`` lists only links whose source is ours;
  ``read_events`` and ``unembedded`` return only this tenant's;
- events are numbered per tenant: ``read_events`` and ``append_events`` speak the tenant's own sequence
  (1, 2, 3 ... over its events, read through the engine's (tenant, number) index), so neither what a
  tenant reads nor what it pays for a read depends on what other tenants log;
- writes: ``put_many``/``write`` refuse a memory of another tenant, or one whose id is another tenant's
  memory, and ``write`` a precondition (``requires``) on another tenant's memories
  (:class:`AccessDeniedError`, nothing written). Imports do not get there: ``import_ids`` gives
  an imported id that another tenant holds a fresh id of this tenant's own, derived from (tenant, id), so
  an import is neither refused (a 403 would tell that the id is in use) nor mixed with the other
  tenant's memory, and importing the same file again maps it the same way; ``delete_many`` and
  ``set_vectors`` ignore ids of other tenants; ``append_events`` refuses events of another tenant;
  event retention is refused (it spans tenants: an operator runs it on the engine itself);
- credentials: ``find_credentials``/``list_credentials`` return only this tenant's (asking for another
  tenant's lists nothing), ``put_credential`` refuses a credential of another tenant. Credentials are keyed
  by tenant, so a tenant writing a name another tenant uses writes its own, never theirs.

A check and the write it guards run under the engine's lock, so no write of this process slips between.
``close()`` leaves the shared engine open: whoever opened the engine closes it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import numpy as np

from clawvm.core.errors import AccessDeniedError
from clawvm.core.model import Filters, Memory, check_tenant_name
from clawvm.store.base import (
    Claim,
    Credential,
    Edge,
    Event,
    GroupKey,
    PageKey,
    Query,
    QueryResult,
    Requirement,
    Store,
    Unembedded,
    check_stored_vectors,
)

#: Namespace of the ids an import derives (uuid5 of the tenant and the imported id): fixed, so that a
#: derivation gives the same id on every host and at every import.
IMPORT_NAMESPACE = uuid.UUID("5b0f6c1e-3d4a-4c59-9a51-0c2f1f3e8a77")
#: How many derivations an import tries for one id before it gives up (each one taken by another tenant).
_MAX_DERIVATIONS = 8


class TenantStore(Store):
    """``inner`` as seen by ``tenant``. See the module docstring for what is confined and how."""

    def __init__(self, inner: Store, tenant: str) -> None:
        super().__init__()
        self.inner = inner
        self.tenant = check_tenant_name(tenant)
        self.dim = inner.dim
        self.schemes = inner.schemes

    @property
    def write_lock(self) -> threading.RLock:
        """The engine's: a caller that checks and then writes through this view (the LangGraph store's
        delete) holds the lock the engine's writes take, not one of the view's own that no write takes."""
        return self.inner.write_lock

    # ---- lifecycle ----------------------------------------------------------------------------------
    def setup(self) -> None:
        self.inner.setup()

    def close(self) -> None:
        """Nothing to release: the shared engine stays open for the other tenants."""

    def exists(self) -> bool:
        return self.inner.exists()

    def held_claim(self) -> Claim | None:
        """The engine's (a claim holds every tenant); taking or releasing one is not a tenant's to do."""
        return self.inner.held_claim()

    # ---- helpers ------------------------------------------------------------------------------------
    def _owned(self, ids: Iterable[str]) -> set[str]:
        """Those of ``ids`` that name a memory of this tenant."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return set()
        return {i for i, tenant in self.inner.tenants_of(wanted).items() if tenant == self.tenant}

    def _confined(self, filters: Filters) -> Filters | None:
        """``filters`` restricted to this tenant, or None when they ask only for other tenants."""
        if filters.tenant is not None and self.tenant not in filters.tenant:
            return None
        return filters.with_(tenant=frozenset([self.tenant]))

    def _check_tenants(self, memories: Sequence[Memory]) -> None:
        for m in memories:
            if m.tenant != self.tenant:
                raise AccessDeniedError(
                    "tenant", f"is {m.tenant!r}, not the caller's tenant", "write memories of your own tenant"
                )

    def _check_writable(self, memories: Sequence[Memory]) -> None:
        self._check_tenants(memories)
        stored = self.inner.tenants_of([m.id for m in memories])
        if any(tenant != self.tenant for tenant in stored.values()):
            raise AccessDeniedError("id", "is not available to this tenant", "let ClawVM choose the id")

    # ---- writes -------------------------------------------------------------------------------------
    def put_many(self, memories: Sequence[Memory], *, imported: Collection[str] = ()) -> None:
        with self.inner.write_lock:
            self._check_writable(memories)
            self.inner.put_many(memories, imported=imported)

    def write(
        self,
        memories: Sequence[Memory],
        vectors: np.ndarray | None = None,
        events: Sequence[Event] = (),
        *,
        imported: Collection[str] = (),
        requires: Sequence[Requirement] = (),
        tenant_numbers: bool = True,
    ) -> list[int]:
        self._check_tenants(memories)  # before the events: the memory's tenant is what the caller named
        self._check_events(events)
        self._check_requirements(requires)
        with self.inner.write_lock:
            self._check_writable(memories)
            # this tenant's own numbers, as its event reads give them (append_events)
            return self.inner.write(
                memories, vectors, events, imported=imported, requires=requires, tenant_numbers=True
            )

    def _check_requirements(self, requires: Sequence[Requirement]) -> None:
        """A precondition reads stored memories: only this tenant's may be asked about."""
        for budget in requires:
            if budget.tenant != self.tenant:
                raise AccessDeniedError(
                    "tenant",
                    f"is {budget.tenant!r} in a precondition, not the caller's tenant",
                    "name your own tenant's sessions",
                )

    def delete_many(self, ids: Sequence[str]) -> int:
        with self.inner.write_lock:
            return self.inner.delete_many(sorted(self._owned(ids)))

    def remove(self, memories: Sequence[Memory], events: Sequence[Event] = ()) -> int:
        self._check_tenants(memories)
        self._check_events(events)
        with self.inner.write_lock:  # an id another tenant holds is not this memory: left alone
            own = self._owned([m.id for m in memories])
            return self.inner.remove([m for m in memories if m.id in own], events)

    def set_vectors(
        self, ids: Sequence[str], vectors: np.ndarray, contents: Sequence[str] | None = None
    ) -> None:
        vecs = check_stored_vectors(len(ids), vectors, self.dim)
        own = self._owned(ids)
        keep = [n for n, i in enumerate(ids) if i in own]
        if keep:
            self.inner.set_vectors(
                [ids[n] for n in keep], vecs[keep], None if contents is None else [contents[n] for n in keep]
            )

    def _check_events(self, events: Sequence[Event]) -> None:
        for e in events:
            if e.tenant != self.tenant:
                raise AccessDeniedError(
                    "tenant", f"event of tenant {e.tenant!r}", "log events of your own tenant"
                )

    def append_events(self, events: Sequence[Event], *, tenant_numbers: bool = True) -> list[int]:
        self._check_events(events)
        return self.inner.append_events(events, tenant_numbers=True)

    def import_ids(self, ids: Sequence[str]) -> dict[str, str]:
        """Each of ``ids`` -> the id this tenant stores that imported memory under: the id itself when it
        is free or this tenant's; when another tenant holds it, ``uuid5(IMPORT_NAMESPACE, tenant + id)``
        (derived again from that while another tenant holds the derived one too). The same ids map the
        same way at every import, so references between imported memories, and a second import of the
        same file, stay consistent; the other tenant's memory is never touched."""
        out: dict[str, str] = {}
        wanted = list(dict.fromkeys(ids))
        owner = {i: m.tenant for i, m in self.inner.get_many(wanted).items()}
        for i in wanted:
            mapped = i
            for _ in range(_MAX_DERIVATIONS):
                if owner.get(mapped, self.tenant) == self.tenant:
                    break
                mapped = str(uuid.uuid5(IMPORT_NAMESPACE, f"{self.tenant}\n{mapped}"))
                taken = self.inner.get_many([mapped]).get(mapped)
                owner[mapped] = self.tenant if taken is None else taken.tenant
            else:
                raise AccessDeniedError(
                    "id", "could not be given an id of this tenant", "import it without an id"
                )
            out[i] = mapped
        return out

    def delete_events_upto(self, seq: int) -> int:
        raise AccessDeniedError(
            "tenant", "event retention spans every tenant", "run it on the store itself, as its operator"
        )

    # ---- reads --------------------------------------------------------------------------------------
    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        return {i: m for i, m in self.inner.get_many(ids).items() if m.tenant == self.tenant}

    def tenants_of(self, ids: Sequence[str]) -> dict[str, str]:
        return {i: t for i, t in self.inner.tenants_of(ids).items() if t == self.tenant}

    def query(self, query: Query) -> QueryResult:
        filters = self._confined(query.filters)
        if filters is None:
            return QueryResult()
        own = self._owned([*query.around, *query.expand])
        return self.inner.query(
            replace(
                query,
                filters=filters,
                around=tuple(i for i in query.around if i in own),
                expand=tuple(i for i in query.expand if i in own),
            )
        )

    def count(self, filters: Filters | None = None) -> int:
        confined = self._confined(filters or Filters())
        return 0 if confined is None else self.inner.count(confined)

    def group_counts(
        self, filters: Filters | None = None, expired_at: datetime | None = None
    ) -> dict[GroupKey, int]:
        confined = self._confined(filters or Filters())
        return {} if confined is None else self.inner.group_counts(confined, expired_at)

    def page(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> list[Memory]:
        confined = self._confined(filters)
        return [] if confined is None else self.inner.page(confined, after, limit, newest_first)

    def page_json(
        self, filters: Filters, after: PageKey | None = None, limit: int = 500, newest_first: bool = False
    ) -> list[dict[str, Any]]:
        confined = self._confined(filters)
        return [] if confined is None else self.inner.page_json(confined, after, limit, newest_first)

    def session_ids(self, filters: Filters, after: str | None = None, limit: int = 500) -> list[str]:
        confined = self._confined(filters)
        return [] if confined is None else self.inner.session_ids(confined, after, limit)

    def tag_names(
        self, filters: Filters, prefix: str = "", after: str | None = None, limit: int = 500
    ) -> list[str]:
        confined = self._confined(filters)
        return [] if confined is None else self.inner.tag_names(confined, prefix, after, limit)

    def agents(self, filters: Filters) -> frozenset[str]:
        confined = self._confined(filters)
        return frozenset() if confined is None else self.inner.agents(confined)

    def vectors_of(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self.inner.vectors_of(sorted(self._owned(ids)))

    def edges(self, ids: Sequence[str]) -> list[Edge]:
        own = self._owned(ids)
        found = self.inner.edges(sorted(own))
        sources = own | self._owned({e.source for e in found} - own)
        return [e for e in found if e.source in sources]

    def unembedded(self, limit: int) -> list[Unembedded]:
        # the contract has no tenant argument: read the oldest pending pairs, four times more each round
        # until ``limit`` of them are ours or none are left (the server runs one worker on the engine
        # itself; this is for a Harness opened directly on a view)
        asked = max(1, limit)
        while True:
            pending = self.inner.unembedded(asked)
            own = self._owned(p.id for p in pending)
            mine = [p for p in pending if p.id in own]
            if len(mine) >= limit or len(pending) < asked:
                return mine[:limit]
            asked *= 4

    def read_events(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        memory_id: str | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Event]:
        if tenant is not None and tenant != self.tenant:
            return []
        return self.inner.read_events(after_seq, limit, memory_id, tenant=self.tenant)

    # ---- credentials --------------------------------------------------------------------------------
    def put_credential(self, credential: Credential) -> None:
        if credential.tenant != self.tenant:
            problem = f"credential of tenant {credential.tenant!r}"
            raise AccessDeniedError("tenant", problem, "store credentials of your own tenant")
        self.inner.put_credential(credential)

    def find_credentials(self, kind: str, name: str) -> list[Credential]:
        return [c for c in self.inner.find_credentials(kind, name) if c.tenant == self.tenant]

    def list_credentials(
        self,
        kind: str | None = None,
        tenant: str | None = None,
        after: Credential | None = None,
        limit: int = 1000,
    ) -> list[Credential]:
        if tenant is not None and tenant != self.tenant:
            return []
        return self.inner.list_credentials(kind, self.tenant, after, limit)
