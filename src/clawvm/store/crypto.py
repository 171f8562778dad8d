"""Encryption at rest of protected content: data keys, sealed envelopes, rotation.

When a tenant's redaction policy keeps originals (:class:`clawvm.core.redact.RedactionPolicy`), the write path
stores the redacted text as the memory's content and the original sealed with AES-256-GCM in the
memory's metadata, so every engine keeps it with no change to the storage contract::

    metadata["redaction"] = {"v": 1, "kinds": {"email": 1},
                             "sealed": {"v": 1, "alg": "AES-256-GCM", "kid": "3f9a...", "nonce": "...",
                                        "ct": "..."}}   # nonce and ciphertext+tag in base64

- ``kid`` names the data key (a hash of it, never the key), so a store can hold envelopes of several keys
  while a rotation runs, and a wrong key is told apart from tampering (:class:`WrongKeyError` vs
  :class:`TamperedError`);
- the associated data binds an envelope to its memory (tenant and id): moved to another memory it no
  longer opens;
- a fresh 96-bit random nonce per envelope (GCM's limit, 2^32 envelopes per key, is far away).

Data keys are 32 random bytes written in base64, one per line. :class:`DataKeys` reads them from
``CLAWVM_DATA_KEY`` (comma-separated) or from the file named by ``CLAWVM_DATA_KEY_FILE``; the first key
seals, every key opens. Make one with ``python -c "import base64, os;
print(base64.urlsafe_b64encode(os.urandom(32)).decode())"``. ``clawvm keys rotate-data-key`` re-seals
every original under a new key (:func:`rotate_data_key`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawvm.core.errors import ConfigError, ConflictError, NotFoundError, TamperedError, WrongKeyError
from clawvm.core.model import Filters, Memory
from clawvm.store.base import Event, Store
from clawvm.store.kinds import EventKind

KEY_ENV = "CLAWVM_DATA_KEY"
KEY_FILE_ENV = "CLAWVM_DATA_KEY_FILE"
REDACTION_FIELD = "redaction"  # the metadata entry the write path owns (see the module docstring)
ENVELOPE_VERSION = 1
ALGORITHM = "AES-256-GCM"
_KEY_BYTES = 32
_NONCE_BYTES = 12


@dataclass(frozen=True)
class DataKey:
    """One AES-256 key. ``kid`` identifies it in envelopes without revealing it."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) != _KEY_BYTES:
            raise ConfigError(f"a data key is {_KEY_BYTES} bytes, not {len(self.secret)}")

    @property
    def kid(self) -> str:
        return hashlib.sha256(b"clawvm data key id\0" + self.secret).hexdigest()[:16]

    @classmethod
    def generate(cls) -> DataKey:
        return cls(secrets.token_bytes(_KEY_BYTES))

    @classmethod
    def parse(cls, text: str) -> DataKey:
        """A key from its base64 text (standard or URL-safe alphabet, padding optional)."""
        raw = text.strip()
        try:
            secret = base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            secret = b""
        if len(secret) != _KEY_BYTES:
            raise ConfigError(
                f"a data key must be {_KEY_BYTES} random bytes in base64 (44 characters); "
                'make one with: python -c "import base64, os; '
                'print(base64.urlsafe_b64encode(os.urandom(32)).decode())"'
            )
        return cls(secret)

    def encode(self) -> str:
        return base64.urlsafe_b64encode(self.secret).decode()


@dataclass(frozen=True)
class DataKeys:
    """The data keys a process holds: the first seals, every one opens."""

    keys: tuple[DataKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("a data keyring needs at least one key")

    @property
    def current(self) -> DataKey:
        return self.keys[0]

    @property
    def kids(self) -> list[str]:
        return [k.kid for k in self.keys]

    def get(self, kid: str) -> DataKey:
        for key in self.keys:
            if key.kid == kid:
                return key
        raise WrongKeyError(kid, self.kids)

    def with_current(self, key: DataKey) -> DataKeys:
        """These keys with ``key`` first (sealing), the others kept for opening."""
        return DataKeys((key, *(k for k in self.keys if k.kid != key.kid)))

    @classmethod
    def parse(cls, lines: Sequence[str]) -> DataKeys:
        keys = [DataKey.parse(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not keys:
            raise ConfigError("no data key found (one base64 key per line; the first seals)")
        return cls(tuple(keys))

    @classmethod
    def load(cls, path: str | Path) -> DataKeys:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the data key file {path}: {exc.strerror}") from None
        return cls.parse(text.splitlines())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DataKeys | None:
        """Keys from ``CLAWVM_DATA_KEY`` (comma-separated) and/or the ``CLAWVM_DATA_KEY_FILE`` file; None
        when neither is set."""
        env = os.environ if environ is None else environ
        keys: list[DataKey] = []
        if env.get(KEY_ENV):
            keys.extend(cls.parse(env[KEY_ENV].split(",")).keys)
        if env.get(KEY_FILE_ENV):
            keys.extend(cls.load(env[KEY_FILE_ENV]).keys)
        return cls(tuple(keys)) if keys else None

    def save(self, path: str | Path) -> None:
        """Write the keys to ``path`` (readable by the owner only), replacing it atomically."""
        target = Path(path)
        body = "# ClawVM data keys: the first seals, every one opens. Keep this file secret.\n"
        body += "".join(k.encode() + "\n" for k in self.keys)
        fd, tmp = tempfile.mkstemp(dir=target.parent or Path("."), prefix=f".{target.name}.")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _aesgcm(key: DataKey) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ConfigError(
            "sealing originals needs the 'cryptography' package: pip install 'clawvm[server]'"
        ) from None
    return AESGCM(key.secret)


def seal(keys: DataKeys, plaintext: bytes, aad: bytes) -> dict[str, Any]:
    """An envelope of ``plaintext`` under the current key, bound to ``aad``."""
    nonce = secrets.token_bytes(_NONCE_BYTES)
    ciphertext = _aesgcm(keys.current).encrypt(nonce, plaintext, aad)
    return {
        "v": ENVELOPE_VERSION,
        "alg": ALGORITHM,
        "kid": keys.current.kid,
        "nonce": base64.b64encode(nonce).decode(),
        "ct": base64.b64encode(ciphertext).decode(),
    }


def unseal(keys: DataKeys, envelope: Any, aad: bytes) -> bytes:
    """The plaintext of ``envelope``; :class:`WrongKeyError` without its key, :class:`TamperedError` when
    it was altered (or moved to another memory)."""
    if not isinstance(envelope, Mapping) or envelope.get("v") != ENVELOPE_VERSION:
        raise TamperedError("the sealed envelope is malformed or of an unknown version")
    if envelope.get("alg") != ALGORITHM or not isinstance(envelope.get("kid"), str):
        raise TamperedError("the sealed envelope names no known algorithm or key")
    key = keys.get(envelope["kid"])
    try:
        nonce = base64.b64decode(envelope["nonce"], validate=True)
        ciphertext = base64.b64decode(envelope["ct"], validate=True)
    except (KeyError, TypeError, binascii.Error, ValueError):
        raise TamperedError("the sealed envelope's nonce or ciphertext is not valid base64") from None
    if len(nonce) != _NONCE_BYTES:
        raise TamperedError("the sealed envelope's nonce has the wrong length")
    cipher = _aesgcm(key)
    from cryptography.exceptions import InvalidTag  # present: _aesgcm checked the package

    try:
        plaintext: bytes = cipher.decrypt(nonce, ciphertext, aad)
    except InvalidTag:
        raise TamperedError(
            "the sealed original failed authentication: it was altered, or copied from another memory"
        ) from None
    return plaintext


# ---- sealed originals of memories -------------------------------------------------------------------
def _aad(tenant: str, memory_id: str) -> bytes:
    return b"clawvm original v1\0" + tenant.encode() + b"\0" + memory_id.encode()


def seal_original(memory: Memory, original: str, keys: DataKeys) -> dict[str, Any]:
    """The envelope of ``memory``'s original content (bound to its tenant and id)."""
    return seal(keys, original.encode("utf-8"), _aad(memory.tenant, memory.id))


def sealed_envelope(memory: Memory) -> Any:
    """The envelope stored with ``memory``, or None."""
    info = memory.metadata.get(REDACTION_FIELD)
    return info.get("sealed") if isinstance(info, Mapping) else None


def without_sealed(memory: Memory) -> Memory:
    """``memory`` as shown to a caller who may not read originals: its redaction mark (the kinds found)
    without the sealed envelope, whose ciphertext length tells the original's length. The same object when
    it has none."""
    if sealed_envelope(memory) is None:
        return memory
    mark = {k: v for k, v in memory.metadata[REDACTION_FIELD].items() if k != "sealed"}
    return memory.model_copy(update={"metadata": {**memory.metadata, REDACTION_FIELD: mark}})


def reveal_original(memory: Memory, keys: DataKeys | None) -> str:
    """The content ``memory`` had before redaction (its content when nothing was redacted).

    :class:`NotFoundError` when it was redacted without keeping the original; :class:`ConfigError`
    without data keys; :class:`WrongKeyError` / :class:`TamperedError` as :func:`unseal`.
    """
    info = memory.metadata.get(REDACTION_FIELD)
    if not info:
        return memory.content
    envelope = sealed_envelope(memory)
    if envelope is None:
        raise NotFoundError("sealed original of memory", memory.id, field="memory_id")
    if keys is None:
        raise ConfigError(f"no data key to open sealed originals: set {KEY_ENV} or {KEY_FILE_ENV}")
    return unseal(keys, envelope, _aad(memory.tenant, memory.id)).decode("utf-8")


@dataclass(frozen=True)
class RotationReport:
    kid: str  # the key every sealed original is now under
    rekeyed: int  # envelopes re-sealed by this run
    already: int  # envelopes that were under the new key already


def rotate_data_key(
    store: Store,
    keys: DataKeys,
    new_key: DataKey,
    batch: int = 200,
    prepare: Callable[[], None] | None = None,
) -> RotationReport:
    """Re-seal every sealed original in ``store`` (all tenants) under ``new_key``.

    ``keys`` must open every envelope (the old keys). Each re-sealed memory is written with the usual
    version check, so a concurrent writer is never overwritten (the batch is re-read and retried). If a
    run stops halfway, every envelope still names its key: run it again with both keys. ``prepare`` is
    called once the keys are known to name every envelope's, before anything is written: where a caller
    keeps the new key (a refused rotation then leaves its key file as it was).
    """
    target = keys.with_current(new_key)
    sealed = {m.id: env.get("kid") for m in store.iter_all(Filters()) if (env := sealed_envelope(m))}
    for kid in set(sealed.values()):
        target.get(str(kid))  # refuse before writing anything when an envelope's key is missing
    if prepare is not None:
        prepare()
    todo = [i for i, kid in sealed.items() if kid != new_key.kid]
    per_tenant: Counter[str] = Counter()
    for start in range(0, len(todo), batch):
        for tenant, n in _rekey_batch(store, target, todo[start : start + batch]).items():
            per_tenant[tenant] += n
    store.append_events(
        [
            Event(kind=EventKind.ROTATE_DATA_KEY, tenant=tenant, data={"kid": new_key.kid, "rekeyed": n})
            for tenant, n in sorted(per_tenant.items())
        ]
    )
    return RotationReport(new_key.kid, sum(per_tenant.values()), len(sealed) - len(todo))


def _rekey_batch(store: Store, keys: DataKeys, ids: Sequence[str], attempts: int = 10) -> Counter[str]:
    conflict: ConflictError | None = None
    for _ in range(attempts):
        changed: list[Memory] = []
        for m in store.get_many(ids).values():
            envelope = sealed_envelope(m)
            if envelope is None or envelope.get("kid") == keys.current.kid:
                continue
            aad = _aad(m.tenant, m.id)
            info = {**m.metadata[REDACTION_FIELD], "sealed": seal(keys, unseal(keys, envelope, aad), aad)}
            metadata = {**m.metadata, REDACTION_FIELD: info}
            changed.append(m.model_copy(update={"metadata": metadata, "version": m.version + 1}))
        try:
            store.put_many(changed)
        except ConflictError as exc:
            conflict = exc  # another writer moved one of them on: re-read the batch
            continue
        return Counter(m.tenant for m in changed)
    assert conflict is not None
    raise conflict
