"""API keys: who is calling, for which tenant, with which role.

A key is ``cvm_<key id>_<secret>``: the key id (12 hex digits) is public and names the key in listings
and logs; the secret is 256 random bits. Only the SHA-256 of the whole key is stored. A fast hash is
right here: with 256 bits of entropy no dictionary or brute force applies, so a slow KDF (scrypt) would
only put tens of milliseconds of CPU on every request. Checks compare digests in constant time.

Roles map to permissions (:data:`PERMISSIONS`): ``read-only`` reads (recall without access tracking,
context without usage bookkeeping); ``agent`` also writes; ``admin`` also manages its tenant's keys and
imports. A key never reaches another tenant: the tenant is enforced by the store layer
(:class:`clawvm.store.tenant.TenantStore`), the role by the server.

Where keys live: in the store's credentials table (:meth:`clawvm.store.Store.put_credential`), one
credential of kind :data:`API_KEY` per key, named by its key id, under the key's own tenant. Every engine
implements it (memory, SQLite, PostgreSQL), so there is no second file to place, back up or share between
server replicas: every process serving the same store sees the same keys, and a revocation made by
``clawvm keys revoke`` reaches running servers within ``refresh_s`` seconds (a server re-reads a key it
has cached once that old: one indexed lookup by key id). The table is not the event log: retention
(``clawvm prune-events``) never reaches a key, and authentication never reads an event. Writes are
compare-and-set on the credential's version, so two processes revoking at once both end with one
revocation.

The event log keeps an audit trail (:data:`AUDIT_CREATED`, :data:`AUDIT_REVOKED`: key id, tenant, role,
name, never the hash) under the reserved tenant ``_auth`` on the stream :data:`KEYS_STREAM`; tenant views
never show it (tenant names cannot start with ``_``) and ``export`` leaves it out. Stores made before the
credentials table kept the keys themselves as ``key_created`` / ``key_revoked`` events there: each engine
copies them into the table once, in the schema migration that creates it
(:func:`credentials_from_key_events`). The ``memory://`` engine keeps keys for the life of the process
only, like everything else in it.

A credential's ``data``: ``role``, ``name`` (the label), ``hash`` (SHA-256 of the key, hex),
``created_at``, ``revoked_at`` and ``expires_at`` (ISO 8601, UTC; ``revoked_at`` null while active,
``expires_at`` null or absent for a key that does not expire). A key past its ``expires_at`` fails
authentication with :class:`clawvm.core.errors.KeyExpiredError` (HTTP 401 ``key_expired``); it stays
listed, as a revoked key does.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from clawvm.core.errors import (
    AccessDeniedError,
    AuthenticationError,
    KeyExpiredError,
    NotFoundError,
    StateConflictError,
    ValidationError,
)
from clawvm.core.model import check_tenant_name, utcnow
from clawvm.core.redact import redact
from clawvm.store.base import Credential, CredentialConflictError, Event, Store
from clawvm.store.kinds import EventKind

log = logging.getLogger("clawvm.store.keys")

#: The credential kind of API keys (:meth:`clawvm.store.Store.put_credential`).
API_KEY = "api_key"
AUTH_TENANT = "_auth"
#: The memory id the key audit events are logged under (no memory has it: ids ClawVM makes are UUIDv7).
KEYS_STREAM = "00000000-0000-0000-0000-0000000000a1"
AUDIT_CREATED = EventKind.API_KEY_CREATED
AUDIT_REVOKED = EventKind.API_KEY_REVOKED
#: What stores made before the credentials table logged as the keys themselves (read once, to migrate).
LEGACY_CREATED = "key_created"
LEGACY_REVOKED = "key_revoked"
KEY_PREFIX = "cvm"
#: The longest lifetime a key may be given: past it, mint a key that does not expire.
MAX_KEY_TTL_S = 10 * 366 * 86400.0
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
    version: int = 1  # of its credential: the compare-and-set of a revocation names it
    expires_at: datetime | None = None

    @property
    def active(self) -> bool:
        """Not revoked (an expired key is still active in this sense: see :meth:`usable`)."""
        return self.revoked_at is None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def usable(self, now: datetime) -> bool:
        """Whether the key authenticates at ``now``: neither revoked nor expired."""
        return self.active and not self.expired(now)

    def credential(self) -> Credential:
        """This key as its stored credential."""
        data: dict[str, Any] = {
            "role": self.role.value,
            "name": self.name,
            "hash": self.hash,
            "created_at": self.created_at.isoformat(),
            "revoked_at": None if self.revoked_at is None else self.revoked_at.isoformat(),
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
        }
        return Credential(self.tenant, API_KEY, self.key_id, data, self.version)

    @classmethod
    def of(cls, credential: Credential) -> ApiKey:
        """The key a stored credential of kind :data:`API_KEY` describes."""
        d = credential.data
        revoked = d.get("revoked_at")
        expires = d.get("expires_at")
        return cls(
            key_id=credential.name,
            tenant=credential.tenant,
            role=Role(str(d["role"])),
            name=str(d.get("name", "")),
            created_at=datetime.fromisoformat(str(d["created_at"])),
            hash=str(d["hash"]),
            revoked_at=None if revoked is None else datetime.fromisoformat(str(revoked)),
            version=credential.version,
            expires_at=None if expires is None else datetime.fromisoformat(str(expires)),
        )


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


@dataclass(frozen=True)
class _Read:
    """The stored keys of one key id (one, unless two tenants drew the same id) and when they were read."""

    keys: tuple[ApiKey, ...]
    at: float


class Keyring:
    """The API keys of one store: create, list, revoke, rotate, authenticate. Thread-safe.

    Reads the credentials table only. A key once read is cached for ``refresh_s`` seconds (each request
    would otherwise cost a lookup); an unknown key id is looked up every time (a key made by another
    process a moment ago works at once), and nothing is cached for it.
    """

    def __init__(
        self,
        store: Store,
        *,
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._clock = clock
        self._now = now  # wall time, for expiry
        self._read: dict[str, _Read] = {}
        self._lock = threading.Lock()

    def create(
        self,
        tenant: str,
        role: Role | str,
        name: str = "",
        *,
        expires_at: datetime | None = None,
        ttl_s: float | None = None,
        minted_by: str | None = None,
    ) -> tuple[ApiKey, str]:
        """A new key for ``tenant``: returns its record and the key itself (shown this once, never stored).
        ``expires_at`` (aware datetime) and/or ``ttl_s`` (seconds from now): when it stops working (the
        earlier of the two; a time already past mints a key that is already expired). ``minted_by``: the
        id of the key asking (the API's caller), which the new key may not outlive: an admin key given an
        hour could otherwise mint admin keys that never expire, and keep the tenant for good."""
        check_tenant_name(tenant)
        role = role if isinstance(role, Role) else role_of(role)
        if len(name) > 200:
            raise ValidationError("name", f"is {len(name)} characters long", "use at most 200")
        ends = self._expiry(expires_at, ttl_s)
        self._refuse_outliving(minted_by, ends)
        return self._create(tenant, role, name, {}, ends)

    def _refuse_outliving(self, minted_by: str | None, ends: datetime | None) -> None:
        """:class:`StateConflictError` when a key ending at ``ends`` (None: never) would outlive the key
        ``minted_by`` (an expiring one)."""
        own = [k.expires_at for k in self._current(minted_by)] if minted_by else []
        limit = min((e for e in own if e is not None), default=None)
        if limit is None or (ends is not None and ends <= limit):
            return
        field = "ttl_s" if ends is not None else "expires_at"
        seconds = max(0, int((limit - self._now()).total_seconds()))
        raise StateConflictError(
            field,
            f"would make the key outlive the key that mints it (that one expires at {limit.isoformat()})",
            f"give an expiry at or before {limit.isoformat()} (expires_at, or ttl_s of at most {seconds} s), "
            "or mint it with a key that does not expire",
        )

    def _expiry(self, expires_at: datetime | None, ttl_s: float | None) -> datetime | None:
        """When a new key expires: the earlier of ``expires_at`` and ``ttl_s`` from now (None: never)."""
        ends: list[datetime] = []
        if ttl_s is not None:
            if not 0 < ttl_s <= MAX_KEY_TTL_S:  # NaN fails too; past the cap timedelta overflowed
                raise ValidationError(
                    "ttl_s",
                    f"is {ttl_s!r}",
                    f"pass more than 0 seconds, at most {MAX_KEY_TTL_S:.0f} (ten years); none: never expires",
                )
            ends.append(self._now() + timedelta(seconds=ttl_s))
        if expires_at is not None:
            if expires_at.tzinfo is None:
                raise ValidationError("expires_at", "has no time zone", "pass a time with its UTC offset")
            if expires_at <= self._now():  # a key that never works, and one of the tenant's mints used up
                raise StateConflictError(
                    "expires_at",
                    f"is {expires_at.isoformat()}, already past",
                    "pass a future time, or ttl_s (seconds from now)",
                )
            ends.append(expires_at)
        return min(ends, default=None)

    def _create(
        self, tenant: str, role: Role, name: str, audit: dict[str, Any], expires_at: datetime | None = None
    ) -> tuple[ApiKey, str]:
        while True:
            key_id = secrets.token_hex(6)
            if self.store.find_credentials(API_KEY, key_id):
                continue  # taken by some tenant: a key id names one key, whichever tenant asks
            token = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
            record = ApiKey(key_id, tenant, role, name, utcnow(), digest(token), expires_at=expires_at)
            try:
                self.store.put_credential(record.credential())
            except CredentialConflictError:
                continue  # this tenant drew the same id at the same moment: draw again
            break
        self._remember(key_id, (record,))
        self._audit(AUDIT_CREATED, record, audit)
        return record, token

    def list(self, tenant: str | None = None, *, include_revoked: bool = False) -> list[ApiKey]:
        """Keys (of ``tenant``, if given), oldest first."""
        keys = _readable(self.store.iter_credentials(API_KEY, tenant))
        keys.sort(key=lambda k: (k.created_at, k.key_id))
        return [k for k in keys if include_revoked or k.active]

    def revoke(self, key_id: str, tenant: str | None = None) -> ApiKey:
        """Revoke a key (of ``tenant``, if given: a tenant admin cannot see other tenants' keys).
        Revoking a revoked key changes nothing."""
        found = self._owned(key_id, tenant)
        revoked = tuple(self._revoke(key) for key in found)
        self._remember(key_id, revoked, merge=True)
        return revoked[0]

    def rotate(self, key_id: str, tenant: str | None = None) -> tuple[ApiKey, str]:
        """Replace a working key by a new one of the same tenant, role, name and expiry: returns the new
        record and key (shown this once). The new key is stored before the old one is revoked, so a failure
        in between leaves two working keys, never none."""
        now = self._now()
        active = [k for k in self._owned(key_id, tenant) if k.usable(now)]
        if not active:
            raise ValidationError(
                "key_id", f"{key_id} was revoked or has expired", "rotate a working key, or create one"
            )
        old = active[0]
        made = self._create(old.tenant, old.role, old.name, {"rotated_from": old.key_id}, old.expires_at)
        self.revoke(old.key_id, old.tenant)
        return made

    def authenticate(self, token: str | None) -> Principal:
        """The caller behind ``token``; AuthenticationError if missing, malformed, unknown or revoked,
        KeyExpiredError (one of them) once past its ``expires_at``."""
        if not token:
            raise AuthenticationError("no API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
        match = _TOKEN.fullmatch(token)
        if match is None:
            raise AuthenticationError("malformed API key: keys look like cvm_<id>_<secret>")
        key_id = match.group(1)
        hashed = digest(token)
        key = next((k for k in self._current(key_id) if hmac.compare_digest(k.hash, hashed)), None)
        if key is None:
            raise AuthenticationError("unknown API key")
        if not key.active:
            raise AuthenticationError(f"API key {key_id} was revoked")
        if key.expired(self._now()):
            assert key.expires_at is not None
            raise KeyExpiredError(f"API key {key_id} expired at {key.expires_at.isoformat()}")
        return Principal(key.key_id, key.tenant, key.role)

    def needs_lookup(self, token: str | None) -> bool:
        """Whether :meth:`authenticate` of ``token`` would read the store (its key id is not cached, or was
        cached more than ``refresh_s`` ago); False when it answers from memory alone (a cached key, or a
        token missing or malformed). A caller on an event loop authenticates inline when this is False,
        and in a thread otherwise."""
        match = _TOKEN.fullmatch(token) if token else None
        if match is None:
            return False
        with self._lock:
            cached = self._read.get(match.group(1))
        return cached is None or self._clock() - cached.at > self.refresh_s

    def active(self, key_id: str) -> bool:
        """Whether ``key_id`` is a key that works, neither revoked nor expired (an open event stream asks
        every second or so); a cached key is re-read once older than ``refresh_s``, as for
        :meth:`authenticate`."""
        now = self._now()
        return any(k.usable(now) for k in self._current(key_id))

    def _current(self, key_id: str) -> tuple[ApiKey, ...]:
        """The keys of ``key_id`` as cached, re-read when not cached or older than ``refresh_s``:
        revocations by another process take effect here."""
        with self._lock:
            cached = self._read.get(key_id)
        if cached is not None and self._clock() - cached.at <= self.refresh_s:
            return cached.keys
        return self._lookup(key_id)

    def _lookup(self, key_id: str) -> tuple[ApiKey, ...]:
        keys = tuple(_readable(self.store.find_credentials(API_KEY, key_id)))
        self._remember(key_id, keys)
        return keys

    def _remember(self, key_id: str, keys: tuple[ApiKey, ...], *, merge: bool = False) -> None:
        """Cache what was just read or written of ``key_id`` (with ``merge``, these keys replace their own
        tenant's, the others stay); nothing is cached for an unknown id."""
        with self._lock:
            if merge and key_id in self._read:
                fresh = {k.tenant: k for k in keys}
                keys = tuple(fresh.pop(k.tenant, k) for k in self._read[key_id].keys) + tuple(fresh.values())
            if keys:
                self._read[key_id] = _Read(keys, self._clock())
            else:
                self._read.pop(key_id, None)

    def _owned(self, key_id: str, tenant: str | None) -> tuple[ApiKey, ...]:
        """The stored keys of ``key_id`` (of ``tenant``, if given), read now; NotFoundError if none."""
        found = tuple(k for k in self._lookup(key_id) if tenant is None or k.tenant == tenant)
        if not found:
            raise NotFoundError("key", key_id)
        return found

    def _revoke(self, key: ApiKey) -> ApiKey:
        """``key`` revoked, by compare-and-set: a concurrent writer makes it re-read and decide again."""
        while key.active:
            revoked = replace(key, revoked_at=utcnow(), version=key.version + 1)
            try:
                self.store.put_credential(revoked.credential())
            except CredentialConflictError:
                stored = self.store.get_credential(key.tenant, API_KEY, key.key_id)
                if stored is None:  # engines never delete credentials; only a hand-edited table could
                    raise NotFoundError("key", key.key_id) from None
                key = ApiKey.of(stored)
                continue
            self._audit(AUDIT_REVOKED, revoked, {})
            return revoked
        return key

    def _audit(self, kind: str, key: ApiKey, extra: dict[str, Any]) -> None:
        """An audit line in the reserved tenant's log: who got which key, or lost it. Never the hash; nothing
        reads it back (authentication reads the credentials table), so retention may drop it. The key's
        name is scrubbed by every detector: the log is exported and streamed, and an operator's label
        ("ci for ann@example.org") is not meant to travel with it."""
        name = redact(key.name).text
        data = {"key_id": key.key_id, "tenant": key.tenant, "role": key.role.value, "name": name, **extra}
        at = key.created_at if kind == AUDIT_CREATED else (key.revoked_at or utcnow())
        self.store.append_event(Event(kind=kind, memory_id=KEYS_STREAM, tenant=AUTH_TENANT, at=at, data=data))


def _readable(credentials: Iterable[Credential]) -> list[ApiKey]:
    """The keys these credentials describe; one whose data is not a key's (written by hand, or by something
    else under the kind) is skipped with a warning rather than failing every request that meets it."""
    keys = []
    for c in credentials:
        try:
            keys.append(ApiKey.of(c))
        except (KeyError, TypeError, ValueError):
            where = {"tenant": c.tenant, "key_id": c.name}
            log.warning("skipping a malformed API key record", extra={"fields": where})
    return keys


def credentials_from_key_events(events: Iterable[Event]) -> list[Credential]:
    """The API keys a store made before the credentials table kept only as events (:data:`LEGACY_CREATED`
    / :data:`LEGACY_REVOKED` of the reserved tenant on :data:`KEYS_STREAM`, oldest first), as the
    credentials to store: what each engine's schema migration writes, once, when it creates the table.
    Replays them as the old keyring did: a later ``key_created`` of the same id replaces the key, a
    revocation keeps its first time; events of any other tenant or stream never counted and still do not."""
    keys: dict[str, ApiKey] = {}
    for e in events:
        if e.tenant != AUTH_TENANT or e.memory_id != KEYS_STREAM:
            continue
        d = e.data
        try:
            if e.kind == LEGACY_CREATED:
                tenant = check_tenant_name(str(d["tenant"]))
                role, name = Role(str(d["role"])), str(d.get("name", ""))
                keys[str(d["key_id"])] = ApiKey(str(d["key_id"]), tenant, role, name, e.at, str(d["hash"]))
            elif e.kind == LEGACY_REVOKED and str(d["key_id"]) in keys:
                key = keys[str(d["key_id"])]
                if key.active:
                    keys[key.key_id] = replace(key, revoked_at=e.at, version=2)
        except (KeyError, ValueError):  # malformed: the old keyring could not have used it either
            log.warning("skipping a malformed key event", extra={"fields": {"seq": e.seq, "kind": e.kind}})
    return [k.credential() for k in keys.values()]
