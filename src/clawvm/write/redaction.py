"""What the write path applies to new text: each tenant's redaction policy (detectors in
:mod:`clawvm.core.redact`), with originals sealed by the data keys (:mod:`clawvm.store.crypto`) when a policy
keeps them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clawvm.core.errors import ConfigError, CryptoError, ValidationError
from clawvm.core.model import Memory
from clawvm.core.redact import RedactionPolicy, redact, redact_content
from clawvm.store.crypto import (
    KEY_ENV,
    KEY_FILE_ENV,
    REDACTION_FIELD,
    DataKeys,
    reveal_original,
    seal_original,
    sealed_envelope,
)

Mark = Callable[[Memory], Memory]
"""Applied to the memory about to be stored: sets (or clears) its ``metadata["redaction"]``."""


def _unmarked(memory: Memory) -> Memory:
    if REDACTION_FIELD not in memory.metadata:
        return memory
    rest = {k: v for k, v in memory.metadata.items() if k != REDACTION_FIELD}
    return memory.model_copy(update={"metadata": rest})


class Redactor:
    """What ``Harness.record``/``update`` apply to new content: each tenant's policy, and the data keys
    that seal originals when a policy keeps them.

    ``policies``: one :class:`RedactionPolicy` for every tenant, or a mapping tenant -> policy (the key
    ``"*"`` for tenants not listed; a tenant with no policy is not redacted). ``keys``: the data keys; when
    a policy keeps originals and none are given they come from the environment
    (:meth:`clawvm.store.crypto.DataKeys.from_env`), and without any the harness refuses to open.
    """

    def __init__(
        self,
        policies: RedactionPolicy | Mapping[str, RedactionPolicy] | None = None,
        keys: DataKeys | None = None,
    ) -> None:
        if policies is None:
            policies = {}
        elif isinstance(policies, RedactionPolicy):
            policies = {"*": policies}
        for tenant, policy in policies.items():
            if not isinstance(policy, RedactionPolicy):
                raise ValidationError(
                    f"redaction.{tenant}", f"has type {type(policy).__name__}", "pass a RedactionPolicy"
                )
        self.policies = dict(policies)
        self.keys = keys
        if self.keys is None and any(p.keep_original for p in self.policies.values()):
            self.keys = DataKeys.from_env()
            if self.keys is None:
                raise ConfigError(
                    f"a redaction policy keeps originals, but there is no data key: set {KEY_ENV} or "
                    f"{KEY_FILE_ENV}, or pass data_keys="
                )

    def policy_for(self, tenant: str) -> RedactionPolicy | None:
        return self.policies.get(tenant, self.policies.get("*"))

    def on_write(self, text: str, is_json: bool, tenant: str) -> tuple[str, Mark]:
        """The content to store for ``text`` and the mark for the memory that will hold it.

        The mark records the kinds redacted and, when the policy keeps originals, the sealed original;
        new content without anything redacted clears an older mark (it would describe other text).
        """
        policy = self.policy_for(tenant)
        if policy is None:
            return text, _unmarked
        redacted, counts = redact_content(text, is_json, policy)
        if not counts:
            return text, _unmarked
        keys = self.keys if policy.keep_original else None

        def mark(memory: Memory) -> Memory:
            info: dict[str, Any] = {"v": 1, "kinds": counts}
            if keys is not None:
                info["sealed"] = seal_original(memory, text, keys)
            return memory.model_copy(update={"metadata": {**memory.metadata, REDACTION_FIELD: info}})

        return redacted, mark

    @staticmethod
    def unchanged(current: Memory) -> Mark:
        """For an update that keeps the content: the stored mark stays, whatever metadata the caller sent
        (a caller can neither drop nor forge it)."""
        kept = current.metadata.get(REDACTION_FIELD)
        if kept is None:
            return _unmarked
        return lambda m: m.model_copy(update={"metadata": {**m.metadata, REDACTION_FIELD: kept}})

    @staticmethod
    def replaced() -> Mark:
        """For an update that replaces the content: the stored mark described the old text, so it goes (the
        commit path marks the new text when it redacts something)."""
        return _unmarked

    def scrub(self, text: str, tenant: str) -> str:
        """``text`` as the tenant's policy would store it (for what the event log keeps, e.g. queries)."""
        policy = self.policy_for(tenant)
        return text if policy is None else redact(text, policy).text

    def check_sealed(self, memory: Memory) -> None:
        """Refuse ``memory`` when it carries a sealed original (``metadata["redaction"]["sealed"]``) that
        this store's data keys cannot open: an envelope sealed by another store, moved from another memory,
        or altered would be stored as if it were this store's, and fail only when an admin reveals it."""
        if sealed_envelope(memory) is None:
            return
        field = f"metadata.{REDACTION_FIELD}.sealed"
        fix = "import it into the store that sealed it (with its data key), or drop metadata.redaction"
        keys = self.keys or DataKeys.from_env()
        if keys is None:
            raise ValidationError(field, "is a sealed original, but this store has no data key", fix)
        try:
            reveal_original(memory, keys)
        except CryptoError as exc:
            raise ValidationError(
                field, f"cannot be opened with this store's data keys ({exc})", fix
            ) from None

    def reveal(self, memory: Memory) -> str:
        """The original content of ``memory`` (see :func:`clawvm.store.crypto.reveal_original`)."""
        return reveal_original(memory, self.keys or DataKeys.from_env())


def redaction_options(
    *, redact: bool = True, keep_originals: bool = False, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``Harness.open`` options of a harness that redacts new content (the default of ``clawvm serve``
    and of the MCP server).

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
