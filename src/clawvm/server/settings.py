"""A server's options: its limits (:class:`ServerSettings`) and what its tenants' harnesses redact
(:func:`redaction_options`, which ``clawvm serve`` builds from its flags)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clawvm.core.errors import ConfigError
from clawvm.core.model import DEFAULT_MAX_CONTENT_BYTES
from clawvm.core.redact import RedactionPolicy
from clawvm.store.crypto import KEY_ENV, KEY_FILE_ENV, DataKeys


@dataclass(frozen=True)
class ServerSettings:
    """Limits and options of one server. ``rate_per_s <= 0`` turns the rate limit off."""

    max_body_bytes: int = 2 * 1024 * 1024  # above the 1 MB content limit plus JSON escaping of most texts
    rate_per_s: float = 50.0  # per API key, sustained
    burst: int = 100  # per API key, requests allowed at once
    keys_refresh_s: float = 2.0  # how soon a key revoked by another process stops working
    heartbeat_s: float = 15.0  # an event stream sends a comment this often when quiet (and rechecks its key)
    events_poll_s: float = 0.5  # how often event streams read engines that do not push (EventFeed)
    preset: str | None = None
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES


def redaction_options(
    *, redact: bool = True, keep_originals: bool = False, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``harness_options`` of a server that redacts new content (``clawvm serve``'s default).

    ``redact``: apply :mod:`clawvm.core.redact`'s default policy (every kind) to every tenant, so a shared
    service keeps no personal data or secrets in clear. ``keep_originals``: seal each original with the
    data key from ``CLAWVM_DATA_KEY`` or ``CLAWVM_DATA_KEY_FILE`` (read from ``environ``, default the
    process's), for admins to read at ``GET /v1/memories/{id}/original``. Raises :class:`ConfigError`
    when originals are to be kept without a key, or without redaction.
    """
    if not redact:
        if keep_originals:
            raise ConfigError("--keep-originals keeps what redaction removes: it needs --redact")
        return {}
    if not keep_originals:
        return {"redaction": RedactionPolicy()}
    keys = DataKeys.from_env(environ)
    if keys is None:
        raise ConfigError(
            f"--keep-originals seals originals with a data key, and none is set: set {KEY_ENV} (base64 of 32"
            f" random bytes) or {KEY_FILE_ENV} (a file of such keys); see clawvm.store.crypto"
        )
    return {"redaction": RedactionPolicy(keep_original=True), "data_keys": keys}
