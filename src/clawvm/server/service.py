""":class:`Service`, what the routes of one app share: the engine, one embedding worker for it, the
:class:`Keyring`, the rate limiters, the keys' usage, the idempotency keys, and one :class:`Harness` per
tenant over a :class:`TenantStore` view, so tenant isolation is enforced by the store layer whatever a
route does. ``create_app`` makes one and keeps it on ``app.state.service``; a route reaches it with
:func:`service_of`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, MutableSequence
from typing import Any

from fastapi import Request

from clawvm.core.embed import Embedder, EmbedWorker, MiniLMEmbedder, QueryEmbeddings
from clawvm.core.errors import RateLimitError, ValidationError
from clawvm.harness import Harness
from clawvm.server.idempotency import IdempotencyKeys
from clawvm.server.ratelimit import RateLimiter
from clawvm.server.settings import ServerSettings
from clawvm.server.usage import KeyUsage
from clawvm.store import Store
from clawvm.store.eventlog import EventTail
from clawvm.store.keys import Keyring, Principal
from clawvm.store.tenant import TenantStore
from clawvm.write.commit import CommitPath
from clawvm.write.redaction import Redactor

log = logging.getLogger(__name__)


class Service:
    """What the routes share: the engine, its embedding worker, the keyring, the limiter, tenant harnesses."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        settings: ServerSettings,
        *,
        owns_store: bool = True,
        harness_options: Mapping[str, Any] | None = None,
        requests: RequestGauge | None = None,
    ) -> None:
        self.harness_options = dict(harness_options or {})
        if self.harness_options.get("redaction") is not None:
            # resolve the data keys once, now: a policy keeping originals without a key fails at start,
            # not at some tenant's first request
            redactor = Redactor(self.harness_options["redaction"], self.harness_options.get("data_keys"))
            self.harness_options["data_keys"] = redactor.keys
        store.setup()
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self.owns_store = owns_store
        self.keyring = Keyring(store, refresh_s=settings.keys_refresh_s)
        most = settings.rate_buckets_max
        self.limiter = RateLimiter(settings.rate_per_s, settings.burst, max_buckets=most)  # per API key
        self.tenant_limiter = RateLimiter(
            settings.tenant_rate_per_s, settings.tenant_burst, limit="tenant", max_buckets=most
        )
        self.mint_limiter = RateLimiter(
            settings.mint_rate_per_s, settings.mint_burst, limit="key minting", max_buckets=most
        )
        # failed or missing keys per client address (charged after a failure, checked before a lookup)
        self.unauthenticated = RateLimiter(
            settings.unauthenticated_rate_per_s,
            settings.unauthenticated_burst,
            limit="unauthenticated requests",
            max_buckets=most,
        )
        self.usage = KeyUsage(settings.usage_max_keys)
        self.idempotency = IdempotencyKeys(
            settings.idempotency_ttl_s, settings.idempotency_max_keys, settings.idempotency_max_bytes
        )
        self.requests = requests or RequestGauge()
        # one worker embeds for every tenant, over the whole engine (a worker per tenant view would scan
        # the others' backlog), and attaches through the write path, which takes nothing once closed; it
        # embeds in the gaps between requests (busy), in small batches
        self._vectors = CommitPath(store, Redactor(None))
        self.worker: EmbedWorker | None = None
        if embedder is not None and settings.embed_in_background:
            self.worker = EmbedWorker(
                embedder,
                store.unembedded,
                self._vectors.attach_vectors,
                batch_size=settings.embed_batch,
                poll_s=settings.embed_poll_s,
                busy=self.requests.busy,
                nice=settings.embed_nice,
            )
            self.worker.start()
        # one pool of query-embedding threads for every tenant's harness (see Harness.recall)
        self.query_embeds = QueryEmbeddings(embedder) if embedder is not None else None
        self._harnesses: dict[str, Harness] = {}
        self._lock = threading.Lock()  # taken only to make a tenant's harness, never to use one
        self.live = EventTail(store, poll_s=settings.events_poll_s)  # what event streams wait on

    def admit(self, principal: Principal) -> None:
        """Charge one request of ``principal`` (REST, MCP): a token of its key's bucket and of its tenant's,
        both or neither (a 429 naming the first empty one), then note the key's use. One function for
        every caller: charged one limiter after the other, or only the key's (MCP did), a request one limit
        refused had spent the other's token, or escaped the tenant's limit."""
        RateLimiter.check_all((self.limiter, principal.key_id), (self.tenant_limiter, principal.tenant))
        self.usage.note(principal.key_id)

    def mint(self, principal: Principal) -> None:
        """Charge a key about to be minted: a token of the tenant's minting bucket, taken in the route, once
        the request is valid (a dependency runs before the body is validated, and malformed requests spent
        the tenant's minting allowance: 20 of them locked its admins out for an hour); refused, the request
        gets back the key's and the tenant's tokens :meth:`admit` took, so it spends nothing."""
        try:
            self.mint_limiter.check(principal.tenant)
        except RateLimitError:
            self.limiter.refund(principal.key_id)
            self.tenant_limiter.refund(principal.tenant)
            raise

    def harness_made(self, tenant: str) -> Harness | None:
        """The tenant's harness if it is made already (a dict read: no lock, no I/O), else None."""
        return self._harnesses.get(tenant)

    def harness_for(self, tenant: str) -> Harness:
        """The tenant's harness, over a view of the engine confined to that tenant (made once). Requests of
        a tenant whose harness exists take no lock here (a dict read is atomic)."""
        harness = self._harnesses.get(tenant)
        if harness is not None:
            return harness
        with self._lock:
            harness = self._harnesses.get(tenant)
            if harness is None:
                harness = Harness(
                    TenantStore(self.store, tenant),
                    self.embedder,
                    tenant=tenant,
                    preset_name=self.settings.preset,
                    max_content_bytes=self.settings.max_content_bytes,
                    **self.harness_options,
                )
                harness.share_embed_worker(self.worker)  # its records notify the shared worker
                if self.query_embeds is not None:
                    harness.share_query_embeddings(self.query_embeds)
                self._harnesses[tenant] = harness
            return harness

    def readiness(self) -> dict[str, str]:
        """Raises if the store cannot be read; reports the embedder."""
        self.store.read_events(0, 1)
        return {"store": "ok", "embedder": "ok" if self.embedder is not None else "off (lexical recall only)"}

    def key_active(self, principal: Principal) -> bool:
        """Whether the caller's key still works (an open event stream ends once it is revoked)."""
        return self.keyring.active(principal.key_id)

    def close(self) -> None:
        """At shutdown: end the event streams, the query embeddings in flight, stop the embedding worker
        once its batch in flight is written, close the store if the service opened it.

        The worker's backlog is not drained: what is left is embedded at the next open, and waiting for
        it (an import's thousands) kept a SIGTERM'd server alive past the grace period of ``docker stop``
        or Kubernetes, which then killed it."""
        self.live.stop()
        if self.query_embeds is not None:
            self.query_embeds.close()
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        self._vectors.close()
        if self.owns_store:
            self.store.close()


class RequestGauge:
    """How many requests are being answered now (event streams excepted: they wait, they do not work),
    so that the embedding worker embeds in the gaps between requests (:meth:`busy`).

    One slot per server process: :class:`~clawvm.server.middleware.Guard` counts in its own process's
    slot, on the event loop's thread only, so no count is ever lost to a race; :meth:`busy` reads them
    all. One process: a list of one. ``clawvm serve --workers N``: a shared array of N (the one embedding
    worker then also yields to the requests of the other workers, whose cores it would take)."""

    def __init__(self, slots: MutableSequence[int] | None = None, index: int = 0) -> None:
        self._slots: MutableSequence[int] = [0] if slots is None else slots
        self._index = index

    def enter(self) -> None:
        self._slots[self._index] += 1

    def leave(self) -> None:
        self._slots[self._index] -= 1

    @property
    def in_flight(self) -> int:
        """Requests in flight in every process sharing the slots."""
        return sum(self._slots)

    def busy(self) -> bool:
        return any(self._slots)


def service_of(request: Request) -> Service:
    """The service of the app serving ``request``."""
    service: Service = request.app.state.service
    return service


def embedder_from(spec: Embedder | str | None) -> Embedder | None:
    """``create_app``'s ``embedder``: ``"default"`` (offline MiniLM), ``None``/``"none"`` or an Embedder."""
    if spec == "default":
        return MiniLMEmbedder()
    if spec is None or spec == "none":
        return None
    if isinstance(spec, str):
        raise ValidationError("embedder", f"is {spec!r}", "use 'default', 'none' or an Embedder")
    return spec
