"""The facade agents and tools use: ``Harness.open(...)`` then record / recall / get / update / forget.

The harness owns one storage engine and (optionally) one embedder with its background worker. All logic
is written once and is synchronous; it is thread-safe because the engines are. Later layers (tiers,
pager, context builder, teams) build on these methods.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .embed import Embedder, EmbedWorker, MiniLMEmbedder, count_tokens
from .errors import ConflictError, ValidationError
from .model import DEFAULT_MAX_CONTENT_BYTES, Filters, Memory, build_memory, normalize_content, revalidate
from .retrieval import RecallConfig, Recalled, preset, run_recall
from .store import Event, Store, store_from_url
from .store.base import check_vectors

_IMMUTABLE = frozenset({"id", "created_at", "version", "tenant"})


class Harness:
    """Harness-managed memory. Create with :meth:`open`; use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        *,
        tenant: str = "default",
        preset_name: str | RecallConfig | None = None,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.tenant = tenant
        self.config = preset(preset_name)
        self.max_content_bytes = max_content_bytes
        self._worker: EmbedWorker | None = None
        self.last_query_embed_ms = 0.0

    @classmethod
    def open(
        cls,
        target: str | Path | Store = "memory://",
        *,
        embedder: Embedder | str | None = "default",
        tenant: str = "default",
        preset: str | RecallConfig | None = None,
        max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
    ) -> Harness:
        """Open (creating or migrating) a store and start the embedding worker.

        ``target``: a path, ``sqlite:///path``, ``memory://``, or a Store instance.
        ``embedder``: ``"default"`` (offline MiniLM), ``None``/``"none"`` (lexical only), or an Embedder.
        """
        config = _preset(preset)  # validate options before any I/O
        emb: Embedder | None
        if embedder == "default":
            emb = _default_embedder()
        elif embedder is None or embedder == "none":
            emb = None
        elif isinstance(embedder, str):
            raise ValidationError(
                "embedder", f"unknown embedder {embedder!r}", "use 'default', 'none' or an Embedder"
            )
        else:
            emb = embedder
        store = target if isinstance(target, Store) else store_from_url(target, dim=emb.dim if emb else 384)
        store.setup()
        harness = cls(store, emb, tenant=tenant, preset_name=config, max_content_bytes=max_content_bytes)
        if emb is not None:
            harness._worker = EmbedWorker(emb, store.unembedded, store.set_vectors)
            harness._worker.start()  # picks up anything a previous process left un-embedded
        return harness

    # ---- writing ------------------------------------------------------------------------------------
    def record(
        self, content: Any, *, embedding: Sequence[float] | np.ndarray | None = None, **fields: Any
    ) -> Memory:
        """Store a new memory and return it. Lexically searchable at once; embedded in the background.

        ``embedding`` attaches a precomputed vector instead (it must match the embedder's dimension).
        Raises :class:`ValidationError` naming the field; nothing is written then.
        """
        for name in ("id", "version", "content_type", "token_count"):
            if name in fields and name != "id":
                raise ValidationError(name, "is set by the harness", f"do not pass {name}")
        text, ctype = normalize_content(content, self.max_content_bytes)
        vector = self._check_vector(embedding) if embedding is not None else None
        fields.setdefault("tenant", self.tenant)
        memory = build_memory(
            {
                **fields,
                "content": text,
                "content_type": ctype,
                "token_count": count_tokens(text),
                "version": 1,
            }
        )
        self.store.put(memory)
        if vector is not None:
            self.store.set_vectors([memory.id], vector[None, :])
        elif self._worker is not None:
            self._worker.notify()
        self._event("add", memory, {"kind": memory.kind.value, "tier": memory.tier.value})
        return memory

    def update(self, memory_id: str, *, expected_version: int | None = None, **changes: Any) -> Memory:
        """Change fields of a memory; its version grows by one.

        With ``expected_version``, a memory that has moved on raises :class:`ConflictError`; in every case
        the write itself is compare-and-set, so two concurrent updates never silently overwrite each other.
        """
        bad = _IMMUTABLE.intersection(changes)
        if bad:
            name = sorted(bad)[0]
            raise ValidationError(name, "cannot be changed", "record a new memory that revises this one")
        current = self.store.get(memory_id)
        if expected_version is not None and current.version != expected_version:
            raise ConflictError(memory_id, expected_version, current.version)
        if "content" in changes:
            text, ctype = normalize_content(changes["content"], self.max_content_bytes)
            changes = {**changes, "content": text, "content_type": ctype, "token_count": count_tokens(text)}
        updated = revalidate(current, {**changes, "version": current.version + 1})
        self.store.put(updated)
        if "content" in changes and self._worker is not None:
            self._worker.notify()
        self._event("update", updated, {"fields": sorted(changes), "version": updated.version})
        return updated

    def forget(self, memory_id: str) -> None:
        """Delete a memory for good (its vector and outgoing links too)."""
        memory = self.store.get(memory_id)
        self.store.delete(memory_id)
        self._event("forget", memory, {"kind": memory.kind.value})

    def import_memories(self, memories: Sequence[Memory]) -> int:
        """Store exported memories as they are (ids, versions, timestamps kept), in one atomic batch.

        Ids already present are skipped, so importing the same file twice is harmless. Returns how many
        were written. They are embedded in the background like new records.
        """
        existing = self.store.get_many([m.id for m in memories])
        fresh = [m for m in memories if m.id not in existing]
        if fresh:
            self.store.put_many(fresh)
            self.store.append_events([Event(kind="import", memory_id=m.id, tenant=m.tenant) for m in fresh])
            if self._worker is not None:
                self._worker.notify()
        return len(fresh)

    # ---- reading ------------------------------------------------------------------------------------
    def get(self, memory_id: str) -> Memory:
        return self.store.get(memory_id)

    def recall(
        self, query: str, k: int = 10, *, preset: str | RecallConfig | None = None, **filters: Any
    ) -> list[Recalled]:
        """The ``k`` best memories for ``query`` under ``filters`` (default: this tenant, status active)."""
        if not isinstance(query, str):
            raise ValidationError("query", f"has type {type(query).__name__}", "pass a string")
        if not isinstance(k, int) or k < 1:
            raise ValidationError("k", f"is {k!r}", "pass a positive integer")
        cfg = self.config if preset is None else _preset(preset)
        f = self._filters(filters)
        vector = None
        if cfg.uses("dense") and self.embedder is not None and query.strip():
            t0 = time.perf_counter()
            vector = self.embedder.embed_query(query)
            self.last_query_embed_ms = (time.perf_counter() - t0) * 1000
        return self.recall_with(query, vector, k, cfg, f)

    def recall_with(
        self, query: str, vector: np.ndarray | None, k: int, cfg: RecallConfig, filters: Filters
    ) -> list[Recalled]:
        """Recall with a precomputed query vector (used by benchmarks to time embedding separately)."""
        return run_recall(self.store, query, vector, k, cfg, filters)

    def list(self, limit: int = 100, **filters: Any) -> builtins.list[Memory]:
        return self.store.list(self._filters(filters), limit=limit)

    def count(self, **filters: Any) -> int:
        return self.store.count(self._filters(filters))

    def events(
        self, after_seq: int = 0, limit: int = 1000, memory_id: str | None = None
    ) -> builtins.list[Event]:
        return self.store.read_events(after_seq, limit, memory_id)

    # ---- lifecycle ----------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Wait until every recorded memory is embedded."""
        if self._worker is not None:
            self._worker.flush(timeout)

    def close(self, wait: bool = True) -> None:
        """Stop the worker (after draining the queue unless ``wait=False``) and close the store."""
        if self._worker is not None:
            if wait:
                self._worker.flush()
            self._worker.stop()
            self._worker = None
        self.store.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers ------------------------------------------------------------------------------------
    def _filters(self, given: Mapping[str, Any]) -> Filters:
        args = dict(given)
        args.setdefault("tenant", self.tenant)
        args.setdefault("status", "active")
        if args["status"] == "any":
            args["status"] = None
        return Filters.of(**args)

    def _check_vector(self, embedding: Sequence[float] | np.ndarray) -> np.ndarray:
        dim = self.embedder.dim if self.embedder else self.store.dim
        vector: np.ndarray = check_vectors(1, embedding, dim, field="embedding")[0]
        return vector

    def _event(self, kind: str, memory: Memory, data: dict[str, Any]) -> None:
        self.store.append_event(Event(kind=kind, memory_id=memory.id, data=data, tenant=memory.tenant))


def _preset(p: str | RecallConfig | None) -> RecallConfig:
    return preset(p)


_DEFAULT: MiniLMEmbedder | None = None


def _default_embedder() -> MiniLMEmbedder:
    """One process-wide default model (loading it twice would only cost memory)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MiniLMEmbedder()
    return _DEFAULT
