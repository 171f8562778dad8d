"""API keys: who is calling, for which tenant, with which role.

A key is ``cvm_<key id>_<secret>``: the key id (12 hex digits) is public and names the key in listings
and logs; the secret is 256 random bits. Only the SHA-256 of the whole key is stored. A fast hash is
right here: with 256 bits of entropy no dictionary or brute force applies, so a slow KDF (scrypt) would
only put tens of milliseconds of CPU on every request. Checks compare digests in constant time.

Roles map to permissions (:data:`PERMISSIONS`): ``read-only`` reads (recall without access tracking,
context without usage bookkeeping); ``agent`` also writes; ``admin`` also manages its tenant's keys and
imports. A key never reaches another tenant: the tenant is enforced by the store layer
(:class:`clawvm.store.tenant.TenantStore`), the role by the server.

Where keys live: in the store's own event log, as ``key_created`` / ``key_revoked`` events of the
reserved tenant ``_auth`` on one reserved stream id (:data:`KEYS_STREAM`). Reasons: it is the one
persistence primitive every engine already implements (memory, SQLite, PostgreSQL) — no second file to
place, back up or share between server replicas; every process serving the same store sees the same
keys, and a revocation made by ``clawvm keys revoke`` reaches running servers within
``refresh_s`` seconds (they re-read the stream incrementally, an indexed read by memory id); the log is
append-only, so it is also the audit trail of who created and revoked what. Tenant views never show
these events (tenant names cannot start with ``_``), and ``export`` writes memories, not events. The
``memory://`` engine keeps keys for the life of the process only, like everything else in it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from clawvm.core.errors import AccessDeniedError, AuthenticationError, NotFoundError, ValidationError
from clawvm.core.model import utcnow
from clawvm.store import Event, Store
from clawvm.store.kinds import EventKind

AUTH_TENANT = "_auth"
#: The memory id the key events are logged under (no memory has it: ids ClawVM makes are UUIDv7).
KEYS_STREAM = "00000000-0000-0000-0000-0000000000a1"
KEY_PREFIX = "cvm"
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOKEN = re.compile(rf"{KEY_PREFIX}_([0-9a-f]{{12}})_[A-Za-z0-9_-]{{20,100}}")


class Role(StrEnum):
    ADMIN = "admin"
    AGENT = "agent"
    READ_ONLY = "read-only"


class Permission(StrEnum):
    READ = "read"  # get, list, recall, context, events, export
    WRITE = "write"  # record, update, forget, pin, feedback, checkpoints, rollback, tick
    ADMIN = "admin"  # the tenant's API keys; import


PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.READ_ONLY: frozenset({Permission.READ}),
    Role.AGENT: frozenset({Permission.READ, Permission.WRITE}),
    Role.ADMIN: frozenset(Permission),
}


def check_tenant_name(tenant: str) -> str:
    """``tenant`` if it is a valid tenant name (letters, digits, ``._-``; not starting with ``_``)."""
    if not isinstance(tenant, str) or not _TENANT_NAME.fullmatch(tenant):
        raise ValidationError(
            "tenant",
            f"{tenant!r} is not a valid tenant name",
            "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return tenant


def role_of(name: str) -> Role:
    try:
        return Role(name)
    except ValueError:
        raise ValidationError(
            "role", f"is {name!r}", f"use one of {', '.join(r.value for r in Role)}"
        ) from None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """A stored key: everything but the secret (of which only ``hash`` is kept)."""

    key_id: str
    tenant: str
    role: Role
    name: str
    created_at: datetime
    hash: str
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of one request."""

    key_id: str
    tenant: str
    role: Role

    def can(self, permission: Permission) -> bool:
        return permission in PERMISSIONS[self.role]

    def require(self, permission: Permission) -> None:
        if not self.can(permission):
            raise AccessDeniedError(
                "role",
                f"{self.role.value} keys may not {permission.value}",
                "use a key with a role that may (admin > agent > read-only)",
            )


class Keyring:
    """The API keys of one store: create, list, revoke, authenticate. Thread-safe."""

    def __init__(
        self, store: Store, *, refresh_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._clock = clock
        self._keys: dict[str, ApiKey] = {}
        self._seq = 0
        self._loaded_at = float("-inf")
        self._lock = threading.Lock()

    def create(self, tenant: str, role: Role | str, name: str = "") -> tuple[ApiKey, str]:
        """A new key for ``tenant``: returns its record and the key itself (shown this once, never stored)."""
        check_tenant_name(tenant)
        role = role if isinstance(role, Role) else role_of(role)
        if len(name) > 200:
            raise ValidationError("name", f"is {len(name)} characters long", "use at most 200")
        key_id = secrets.token_hex(6)
        token = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
        record = ApiKey(key_id, tenant, role, name, utcnow(), digest(token))
        self.store.append_event(
            Event(
                kind=EventKind.KEY_CREATED,
                memory_id=KEYS_STREAM,
                tenant=AUTH_TENANT,
                at=record.created_at,
                data={
                    "key_id": key_id,
                    "tenant": tenant,
                    "role": role.value,
                    "name": name,
                    "hash": record.hash,
                },
            )
        )
        self.refresh()
        return record, token

    def list(self, tenant: str | None = None, *, include_revoked: bool = False) -> list[ApiKey]:
        """Keys (of ``tenant``, if given), oldest first."""
        self.refresh()
        with self._lock:
            keys = list(self._keys.values())
        return [k for k in keys if (tenant is None or k.tenant == tenant) and (include_revoked or k.active)]

    def revoke(self, key_id: str, tenant: str | None = None) -> ApiKey:
        """Revoke a key (of ``tenant``, if given: a tenant admin cannot see other tenants' keys)."""
        self.refresh()
        with self._lock:
            key = self._keys.get(key_id)
        if key is None or (tenant is not None and key.tenant != tenant):
            raise NotFoundError("key", key_id)
        if not key.active:
            return key
        self.store.append_event(
            Event(
                kind=EventKind.KEY_REVOKED, memory_id=KEYS_STREAM, tenant=AUTH_TENANT, data={"key_id": key_id}
            )
        )
        self.refresh()
        with self._lock:
            return self._keys[key_id]

    def authenticate(self, token: str | None) -> Principal:
        """The caller behind ``token``; AuthenticationError if missing, malformed, unknown or revoked."""
        if not token:
            raise AuthenticationError("no API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
        match = _TOKEN.fullmatch(token)
        if match is None:
            raise AuthenticationError("malformed API key: keys look like cvm_<id>_<secret>")
        key_id = match.group(1)
        with self._lock:
            known = key_id in self._keys
        if not known:
            self.refresh()  # a key made by another process since the last read
        key = self._current(key_id)
        if key is None or not hmac.compare_digest(key.hash, digest(token)):
            raise AuthenticationError("unknown API key")
        if not key.active:
            raise AuthenticationError(f"API key {key_id} was revoked")
        return Principal(key.key_id, key.tenant, key.role)

    def active(self, key_id: str) -> bool:
        """Whether ``key_id`` is a key that works (an open event stream asks on every heartbeat); the log
        is re-read at most every ``refresh_s``, as for :meth:`authenticate`."""
        key = self._current(key_id)
        return key is not None and key.active

    def _current(self, key_id: str) -> ApiKey | None:
        """The key as known, after re-reading the log if the last read is older than ``refresh_s``:
        revocations by another process take effect here."""
        if self._clock() - self._loaded_at > self.refresh_s:
            self.refresh()
        with self._lock:
            return self._keys.get(key_id)

    def refresh(self) -> None:
        """Apply key events logged since the last refresh (by any process)."""
        with self._lock:
            while True:
                events = self.store.read_events(self._seq, 1000, KEYS_STREAM)
                for e in events:
                    if e.tenant == AUTH_TENANT:  # anyone could log under the stream id; only _auth counts
                        self._apply(e)
                    self._seq = max(self._seq, e.seq or 0)
                if len(events) < 1000:
                    break
            self._loaded_at = self._clock()

    def _apply(self, e: Event) -> None:
        d = e.data
        if e.kind == "key_created":
            self._keys[str(d["key_id"])] = ApiKey(
                str(d["key_id"]), str(d["tenant"]), Role(str(d["role"])), str(d["name"]), e.at, str(d["hash"])
            )
        elif e.kind == "key_revoked" and str(d["key_id"]) in self._keys:
            key = self._keys[str(d["key_id"])]
            if key.active:
                self._keys[key.key_id] = replace(key, revoked_at=e.at)
