"""A server's options: its limits (:class:`ServerSettings`) and what its tenants' harnesses redact
(:func:`redaction_options`, which ``clawvm serve`` builds from its flags)."""

from __future__ import annotations

from dataclasses import dataclass

from clawvm.core.model import DEFAULT_MAX_CONTENT_BYTES
from clawvm.write.redaction import redaction_options as redaction_options  # re-exported: serve's flags


@dataclass(frozen=True)
class ServerSettings:
    """Limits and options of one server. ``rate_per_s <= 0`` turns the rate limit off."""

    max_body_bytes: int = 2 * 1024 * 1024  # above the 1 MB content limit plus JSON escaping of most texts
    rate_per_s: float = 50.0  # per API key, sustained
    burst: int = 100  # per API key, requests allowed at once
    keys_refresh_s: float = 2.0  # how soon a key revoked by another process stops working
    heartbeat_s: float = 15.0  # an event stream sends a comment this often when quiet (and rechecks its key)
    events_poll_s: float = 0.5  # how often event streams read engines that do not push (EventFeed)
    # the background embedding of new memories: whether this process runs it (with --workers N only the
    # first does, so rows are not embedded twice), how often it looks for rows other processes recorded,
    # and its batch (small: a batch is what a request may wait behind; see EmbedWorker's busy deferral)
    embed_in_background: bool = True
    embed_poll_s: float | None = None
    embed_batch: int = 16
    preset: str | None = None
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
    # Idempotency-Key (clawvm.server.idempotency): how long a key holds, and how many keys and response
    # bytes one tenant keeps (its oldest go first)
    idempotency_ttl_s: float = 24 * 3600.0
    idempotency_max_keys: int = 10_000
    idempotency_max_bytes: int = 16 * 1024 * 1024
