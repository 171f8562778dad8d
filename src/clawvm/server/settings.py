"""A server's options: its limits (:class:`ServerSettings`) and what its tenants' harnesses redact
(:func:`redaction_options`, which ``clawvm serve`` builds from its flags)."""

from __future__ import annotations

from dataclasses import dataclass

from clawvm.core.model import DEFAULT_MAX_CONTENT_BYTES
from clawvm.dashboard.debug import WHATIF_MAX_MEMORIES
from clawvm.write.redaction import redaction_options as redaction_options  # re-exported: serve's flags


@dataclass(frozen=True)
class ServerSettings:
    """Limits and options of one server. A rate (``*_per_s``) ``<= 0`` turns that limit off; the limits
    and their defaults are listed in docs/server.md (each over-limit request is a 429 with Retry-After)."""

    max_body_bytes: int = 2 * 1024 * 1024  # above the 1 MB content limit plus JSON escaping of most texts
    rate_per_s: float = 50.0  # per API key, sustained
    burst: int = 100  # per API key, requests allowed at once
    # per tenant, all its keys together: many keys cannot multiply one tenant's share of the server
    tenant_rate_per_s: float = 200.0
    tenant_burst: int = 400
    # keys minted over the API (POST /v1/keys), per tenant: ``mint_burst`` at once, then one every
    # ``1 / mint_rate_per_s`` seconds (the default: 20 at once, then 20 an hour)
    mint_rate_per_s: float = 20 / 3600
    mint_burst: int = 20
    # unauthenticated requests (no key, or a key that fails), per client address: once over, the address
    # gets 429 before any key lookup, so a flood of bad keys costs neither lookups nor hashing
    unauthenticated_rate_per_s: float = 5.0
    unauthenticated_burst: int = 100
    rate_buckets_max: int = 100_000  # buckets one limiter tracks (least recently used go first)
    usage_max_keys: int = 10_000  # API keys whose request count and last use this process keeps
    keys_refresh_s: float = 2.0  # how soon a key revoked by another process stops working
    heartbeat_s: float = 15.0  # an event stream sends a comment this often when quiet
    key_check_s: float = 1.0  # how often an open event stream rechecks its key (revoked or expired: it ends)
    events_poll_s: float = 0.5  # how often event streams read engines that do not push (EventFeed)
    # the background embedding of new memories: whether this process runs it (with --workers N only the
    # first does, so rows are not embedded twice), how often it looks for rows other processes recorded,
    # and its batch (small: a batch is what a request may wait behind; see EmbedWorker's busy deferral)
    embed_in_background: bool = True
    embed_poll_s: float | None = None
    embed_batch: int = 16
    # nice levels below the process at which the embedding thread runs (Linux): when the cores are short,
    # the scheduler gives them to requests first, and the backlog takes what is left
    embed_nice: int = 10
    preset: str | None = None
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
    # Idempotency-Key (clawvm.server.idempotency): how long a key holds, and how many keys and response
    # bytes one tenant keeps (its oldest go first)
    idempotency_ttl_s: float = 24 * 3600.0
    idempotency_max_keys: int = 10_000
    idempotency_max_bytes: int = 16 * 1024 * 1024
    # the most memories one dashboard what-if request replays
    whatif_max_memories: int = WHATIF_MAX_MEMORIES
