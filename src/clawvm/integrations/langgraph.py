"""LangGraph: a ``BaseStore`` backed by ClawVM, so graphs keep long-term memory in a ClawVM store.

``ClawVMStore(harness, index=..., ttl=...)`` implements ``batch``/``abatch``; LangGraph's ``put``, ``get``,
``search``, ``delete``, ``list_namespaces`` (and their ``a*`` forms) are built on them by ``BaseStore``.

Mapping:

- an item is one memory (kind ``knowledge`` by default) whose id is derived from (tenant, namespace, key)
  (a UUIDv5, :func:`item_id`): the engine's primary key makes the item unique, in every engine and across
  processes sharing one file or database, so two concurrent puts of one key can never make two items. A
  put reads the memory and writes it at the next version through the harness's one write path
  (redaction, events, the optimistic version check); a put that loses a race re-reads and writes again
  (last writer wins, as in LangGraph's own stores), so :class:`ConflictError` never reaches the graph;
- the value is the memory's JSON content; namespace, key, LangGraph's ``created_at``/``updated_at``, the
  TTL and whether the item is indexed are in ``metadata.langgraph``. The memory's own ``created_at`` is
  the time of the item's last put, so the engines' newest-first pages are LangGraph's ``updated_at``
  order;
- namespaces are scopes: every prefix of an item's namespace is an indexed tag (``lg-ns:<digest>``), so
  ``search(("users", "alice"))`` is filtered inside the engine like a session scope; the namespace itself
  is a tag too (``lg-path:`` and its labels' UTF-8 in hex, ``.`` between labels), whose code-point order
  is the namespaces' tuple order (``list_namespaces`` walks those tags, :meth:`Store.tag_names`, and stops
  once ``offset + limit`` are found);
- ``batch`` works as LangGraph's stores: every read (get, search, list_namespaces) sees the store as it
  was before the batch's writes; of several puts of one key the last wins; the writes of one batch are
  stored in one atomic write (a put and a delete in one batch: the deleted items expire in that same
  write and are removed right after it);
- semantic search: each item's indexed text (the whole value, or the ``fields`` of the
  :class:`IndexConfig` or of ``put(index=[...])``, joined by newlines) is embedded when it is put, with
  the ``IndexConfig``'s ``embed`` or else the harness's embedder (the async methods await the model's
  ``aembed_documents``/``aembed_query`` before the batch runs, so an async-only model works there; the
  sync ones refuse it by name; a vector that is not the store's size in finite numbers is refused naming
  ``index.embed``, before anything is written); ``put(index=False)`` leaves the item
  out of ranked results (as in LangGraph's stores it is still returned, without a score, after them).
  ``search(query=...)`` ranks the namespace's items by the engine's vector search, and **the score is the
  cosine similarity between the query's embedding and the item's, in [-1, 1]** (with the default MiniLM
  model, text that answers the query scored 0.3 to 0.65 in our tests, unrelated text and nonsense queries
  0.15 or less): a threshold on it means the same for every query. Items found without a score follow,
  newest first. Without any embedder, the query ranks with ClawVM's lexical recall and no score is given;
- without a query, items come newest ``updated_at`` first; ``filter`` matches values exactly or with
  ``$eq $ne $gt $gte $lt $lte``, nested dicts included; ``limit``/``offset`` page the result. The
  namespace is read in keyset pages only as far as the page asked for needs;
- TTL (``supports_ttl``): ``put(..., ttl=minutes)`` (or the :class:`TTLConfig`'s ``default_ttl``) sets
  the memory's ``expires_at``; a ``get``/``search`` with ``refresh_ttl`` (default: the config's
  ``refresh_on_read``, else True) moves it forward by the item's TTL again. An item whose ``expires_at``
  has passed is never returned or listed, even before it is swept; :meth:`ClawVMStore.sweep_ttl`
  deletes expired items, and with ``sweep_interval_minutes`` a background thread does so
  (:meth:`start_ttl_sweeper`, :meth:`stop_ttl_sweeper`). A sweep deletes an item only if it is still at
  the version it read, checked under the engine's write lock: within one process a put that brings the
  key back meanwhile is kept; from another process (or on PostgreSQL, whose writes do not take that
  lock) such a put landing between the check and the delete is lost with the expired item.

Items written by an earlier version of this adapter (under a random id) are still read, and the first put
of their key moves them to their derived id. Items written before namespace tags existed are listed by
``list_namespaces`` once :meth:`ClawVMStore.tag_namespaces` has run over the store (once).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)
from langgraph.store.base.embed import EmbeddingsLambda

from clawvm.core.embed import count_tokens
from clawvm.core.errors import ClawVMError, ConflictError, ValidationError
from clawvm.core.model import (
    MAX_TAGS,
    Filters,
    Kind,
    Memory,
    Tier,
    build_memory,
    capped_tags,
    counted,
    normalize_content,
    revalidate,
)
from clawvm.core.vectors import directed_only
from clawvm.harness import Harness
from clawvm.store import Event, PageKey, Query
from clawvm.store.kinds import EventKind
from clawvm.teams import shared as teams
from clawvm.write.redaction import Redactor

TAG = "langgraph"
PATH_TAG = "lg-path:"  # + the namespace, encoded by _path_tag
PAGE = 256  # memories (or namespace tags) read per keyset page
#: The deepest namespace a put may name: an item's tags are one per prefix, its path and the store's own
MAX_NAMESPACE_DEPTH = MAX_TAGS - 2
SEARCH_WIDEN = 4  # a query ranks this many times offset + limit candidates of the vector search
CONFLICT_RETRIES = 64  # a batch's write that lost a race is read and written again, at most this often
_MAX_TAG = 200  # the model's limit on a tag's length
_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "clawvm:langgraph-item")
_log = logging.getLogger(__name__)

#: A memory paired with its search score (None: found without one).
Scored = tuple[Memory, float | None]


@dataclass(frozen=True)
class _Plan:
    """A batch checked, before anything is embedded or read: its ops at their stored addresses, the puts
    it writes (the last of each key) with the text each is indexed by (None: not ranked), and the
    distinct queries its searches rank by."""

    ops: list[Op]
    puts: dict[tuple[tuple[str, ...], str], PutOp]
    texts: list[str | None]
    queries: list[str]


@dataclass(frozen=True)
class _Vectors:
    """A plan's embeddings: its indexed texts' by the put's position (none for a text the model gave no
    direction), its queries' (unit length; None for a zero vector) by query. Computed before the batch
    runs, so the sync and async paths share it."""

    documents: dict[int, np.ndarray]
    queries: dict[str, np.ndarray | None]

    @classmethod
    def of(cls, plan: _Plan, rows: Sequence[Any], asked: Sequence[Any], model: str, dim: int) -> _Vectors:
        """``rows`` (the indexed texts') and ``asked`` (the queries') as ``model`` (the field naming it:
        ``index.embed``, or the harness's ``embedder``) returned them, each checked to be ``dim`` finite
        floats: a NaN vector was stored (a put) or refused naming an internal field (a search)."""
        positions = [n for n, t in enumerate(plan.texts) if t is not None]
        if len(rows) != len(positions):
            raise ValidationError(
                model, f"returned {len(rows)} vectors for {len(positions)} texts", "return one per text"
            )
        documents = {n: _model_vector(rows[i], model, dim, "a text") for i, n in enumerate(positions)}
        queries = {
            q: _unit(_model_vector(v, model, dim, "a query"))
            for q, v in zip(plan.queries, asked, strict=True)
        }
        return cls(_directed(documents), queries)


def _model_vector(vector: Any, model: str, dim: int, what: str) -> np.ndarray:
    """One embedding as the model gave it, refused naming ``model`` unless it is ``dim`` finite floats."""
    fix = f"use an embedding model that returns {dim} finite numbers for each text"
    try:
        with np.errstate(over="ignore"):  # a float64 past float32's range: infinite, refused below
            v = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValidationError(model, f"returned no vector of numbers for {what}", fix) from None
    if v.shape != (dim,):
        raise ValidationError(model, f"returned a vector of shape {v.shape} for {what}, not ({dim},)", fix)
    if not np.isfinite(v).all():
        raise ValidationError(model, f"returned NaN or infinite values for {what}", fix)
    return v


def _directed(documents: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """``documents`` without the vectors that have no direction: a model may answer a text (a blank one,
    for a bag-of-words model) with zeros, which the store refuses with the whole batch. Such an item is
    stored without a vector, as a query's zero vector ranks lexically: searches return it after the
    ranked items. (Rows of the wrong shape were refused before, naming the model: :func:`_model_vector`.)"""
    shapes = {v.shape for v in documents.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        return documents
    return directed_only(documents)


def _unit(vector: Any) -> np.ndarray | None:
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else None


def _async_only() -> ValidationError:
    return ValidationError(
        "index.embed",
        "only embeds asynchronously",
        "use aput/asearch (the store's async methods), or pass a sync function",
    )


def item_id(tenant: str, namespace: tuple[str, ...], key: str) -> str:
    """The memory id of the item (``namespace``, ``key``) of ``tenant``: a UUIDv5 of the three, so every
    writer of the item names the same row and the engine's primary key keeps it unique. (Labels are never
    empty, LangGraph validates them, so the empty label between namespace and key is unambiguous.)"""
    return str(uuid.uuid5(_ID_NAMESPACE, "\x00".join((tenant, *namespace, "", key))))


class ClawVMStore(BaseStore):
    """LangGraph's store interface over a :class:`~clawvm.Harness` (see the module docstring).

    ``index``: LangGraph's :class:`IndexConfig` (``embed``: the embedding model, ``dims``: its
    dimension, which must be the store's; ``fields``: the JSON paths of a value that are embedded,
    default the whole value). Without ``embed`` the harness's embedder is used. ``ttl``: LangGraph's
    :class:`TTLConfig` (``default_ttl`` minutes, ``refresh_on_read``, ``sweep_interval_minutes``).
    """

    supports_ttl = True

    def __init__(
        self,
        harness: Harness,
        *,
        kind: Kind | str = Kind.KNOWLEDGE,
        agent_id: str | None = None,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        if not isinstance(harness, Harness):  # None was taken: the first put failed far from the cause
            raise ValidationError("harness", f"is a {type(harness).__name__}", "pass an open clawvm.Harness")
        self.harness = harness
        try:
            self.kind = Kind(kind)
        except ValueError:  # a bare ValueError, unlike every other bad argument
            kinds = [k.value for k in Kind]
            raise ValidationError("kind", f"is {kind!r}", f"use one of {kinds}") from None
        self.agent_id = agent_id
        self.index_config = index
        self.embeddings = ensure_embeddings(index["embed"]) if index and index.get("embed") else None
        dims = index.get("dims") if index else None
        if dims is not None and dims != harness.store.dim:
            raise ValidationError(
                "index.dims",
                f"is {dims}, the store holds vectors of {harness.store.dim}",
                f"use an embedding model of {harness.store.dim} dimensions, or a store opened for {dims}",
            )
        self.fields: tuple[str, ...] = tuple((index or {}).get("fields") or ["$"])
        self.ttl_config = ttl
        self._sweeper: threading.Thread | None = None
        self._stop_sweeping = threading.Event()
        if ttl and ttl.get("sweep_interval_minutes"):
            self.start_ttl_sweeper()

    # ---- LangGraph's interface --------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops``; each result at its operation's position. Reads see the store as it was before the
        batch's writes; of several puts of one key the last wins; the writes are stored atomically."""
        plan = self._plan(ops)
        return self._run(plan, self._vectors(plan))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch`, with the configured model's ``aembed_documents``/``aembed_query`` awaited first
        (an async-only embedding function works, as in LangGraph's stores); the rest runs in a thread."""
        if self.embeddings is None:  # the harness's embedder is synchronous: the whole batch in a thread
            return await asyncio.to_thread(self.batch, list(ops))
        plan = await asyncio.to_thread(self._plan, list(ops))
        vectors = await self._avectors(plan, self.embeddings, self.harness.store.dim)
        return await asyncio.to_thread(self._run, plan, vectors)

    def _plan(self, ops: Iterable[Op]) -> _Plan:
        """``ops`` checked (a put's value as the write path would: a value it would refuse costs no
        embedding) and resolved to their stored addresses, with what the batch has to embed."""
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
            _check_address(op)
            if isinstance(op, PutOp) and not op.namespace:
                raise InvalidNamespaceError("Namespace cannot be empty.")
            if isinstance(op, PutOp) and op.value is not None and len(op.namespace) > MAX_NAMESPACE_DEPTH:
                # each prefix is a tag of the item's memory, and a memory holds at most MAX_TAGS
                raise InvalidNamespaceError(
                    f"Namespace has {len(op.namespace)} labels: use at most {MAX_NAMESPACE_DEPTH}."
                )
            if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
                raise ValidationError(
                    "op", f"is a {type(op).__name__}", "pass GetOp, PutOp, SearchOp or ListNamespacesOp"
                )
            if isinstance(op, SearchOp) and op.filter is not None and not isinstance(op.filter, Mapping):
                # a list matched no value: search answered [] as if nothing were stored
                raise ValidationError(
                    "filter", f"is a {type(op.filter).__name__}", "pass a dict of field -> value or condition"
                )
            if isinstance(op, SearchOp | ListNamespacesOp):  # a negative one sliced from the end
                counted("limit", op.limit, 0)
                counted("offset", op.offset, 0)
        ops = [self._stored_address(op) for op in ops]
        puts = {(op.namespace, op.key): op for op in ops if isinstance(op, PutOp)}
        for op in puts.values():
            if op.value is not None:
                if not isinstance(op.value, Mapping):  # dict() read ["ab", "cd"] as {"a": "b", "c": "d"}
                    raise ValidationError(
                        "value", f"is a {type(op.value).__name__}", "pass a dict (an item's value is one)"
                    )
                normalize_content(dict(op.value), self.harness.max_content_bytes)
                _check_ttl(op.ttl)
        queries = [
            op.query for op in ops if isinstance(op, SearchOp) and op.query and op.offset + op.limit > 0
        ]
        return _Plan(ops, puts, self._indexed_texts(list(puts.values())), list(dict.fromkeys(queries)))

    def _run(self, plan: _Plan, vectors: _Vectors) -> list[Result]:
        """The reads and writes of a planned batch, with its texts and queries embedded (``vectors``)."""
        results: list[Result] = []
        read: dict[str, Memory] = {}  # what the reads returned whose TTL they refresh
        for op in plan.ops:
            if isinstance(op, PutOp):
                results.append(None)
            elif isinstance(op, GetOp):
                found = self._find(op.namespace, op.key)
                if found is not None and op.refresh_ttl:
                    read[found.id] = found
                results.append(None if found is None else _item(found))
            elif isinstance(op, SearchOp):
                hits = self._search(op, vectors.queries.get(op.query) if op.query else None)
                if op.refresh_ttl:
                    read.update((m.id, m) for m, _ in hits)
                results.append([_search_item(m, score) for m, score in hits])
            else:
                results.append(self._namespaces(op))
        if plan.puts:
            self._write(list(plan.puts.values()), plan.texts, vectors.documents)
        # an item the batch also wrote has a fresh TTL already
        stale = [m for m in read.values() if _ttl(m) is not None and _address(m) not in plan.puts]
        if stale:
            self._refresh(stale)
        return results

    # ---- TTL ------------------------------------------------------------------------------------------
    def sweep_ttl(self) -> int:
        """Delete this tenant's items whose TTL has run out; returns how many. (They are never returned
        anyway: sweeping frees their space.)"""
        h = self.harness
        due = h.filters({"tags": [TAG], "status": "any"}).with_(expires_by=h.now())
        removed, after = 0, None
        while True:
            page = h.store.page(due, after, PAGE)
            removed += self._remove(page)
            if len(page) < PAGE:
                return removed
            after = PageKey.of(page[-1])

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> None:
        """Sweep (:meth:`sweep_ttl`) every ``sweep_interval_minutes`` (default: the TTL config's) in a
        background thread until :meth:`stop_ttl_sweeper`. Starting it twice keeps the one running."""
        minutes = sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes")
        if not minutes or minutes <= 0:
            raise ValidationError(
                "sweep_interval_minutes", f"is {minutes!r}", "pass a positive number of minutes"
            )
        if self._sweeper is not None and self._sweeper.is_alive():
            return
        self._stop_sweeping.clear()
        self._sweeper = threading.Thread(
            target=self._sweep_every, args=(float(minutes) * 60,), name="clawvm-lg-ttl", daemon=True
        )
        self._sweeper.start()

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the background sweeper; True once it has stopped (or none was running)."""
        self._stop_sweeping.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout)
            if self._sweeper.is_alive():
                return False
            self._sweeper = None
        return True

    def _sweep_every(self, seconds: float) -> None:
        while not self._stop_sweeping.wait(seconds):
            if self.harness.writer.closed:  # the store's harness closed: nothing to sweep ever again
                return
            try:
                self.sweep_ttl()
            except ClawVMError as exc:  # a store that is briefly unreachable: the next sweep tries again
                _log.warning("LangGraph TTL sweep failed: %s", exc)

    # ---- reads ----------------------------------------------------------------------------------------
    def _find(self, namespace: tuple[str, ...], key: str) -> Memory | None:
        """The live item (``namespace``, ``key``), or None (missing, deleted or expired)."""
        mid = item_id(self.harness.tenant, namespace, key)
        found = self.harness.store.get_many([mid]).get(mid)
        if found is not None:
            return found if self.harness.filters({}).matches(found) and is_item(found) else None
        return self._legacy(namespace, key)

    def _legacy(self, namespace: tuple[str, ...], key: str) -> Memory | None:
        """The item as an earlier version of this adapter stored it: under a random id, found by its
        item tag."""
        found = self.harness.list(limit=1, tags=[_item_tag(namespace, key)])
        return found[0] if found and is_item(found[0]) else None

    def _search(self, op: SearchOp, vector: np.ndarray | None) -> list[Scored]:
        """The page of items ``op`` asks for; ``vector``: its query's embedding (None: lexical, or none)."""
        scope = [_ns_tag(op.namespace_prefix)] if op.namespace_prefix else [TAG]
        need = op.offset + op.limit
        filters = self.harness.filters({"tags": scope})

        def wanted(m: Memory) -> bool:
            value = _item_value(m)  # its text read once, for both questions
            return value is not None and (not op.filter or matches(value, op.filter))

        found: list[Scored] = []
        if op.query and need > 0:
            found = self._ranked(op.query, vector, scope, filters, need, bool(op.filter), wanted)
        reached = {m.id for m, _ in found}
        if len(found) < need:  # the rest of the namespace, newest first, only as far as the page needs
            for m in self._newest(filters, need - len(found)):
                if m.id not in reached and wanted(m):
                    found.append((m, None))
                    if len(found) >= need:
                        break
        return found[op.offset : need]

    def _ranked(
        self,
        query: str,
        vector: np.ndarray | None,
        scope: list[str],
        filters: Filters,
        need: int,
        filtered: bool,
        wanted: Callable[[Memory], bool],
    ) -> list[Scored]:
        """The indexed items the query finds, best first, scored by cosine similarity (see the module
        docstring): the vector search's best ``SEARCH_WIDEN * need`` (some may be filtered out or not
        indexed); without an embedder, lexical recall's best ``need`` (``SEARCH_WIDEN`` times that with a
        ``filter``), unscored. With a ``filter`` that leaves fewer than ``need`` of them, the search
        widens ``SEARCH_WIDEN``-fold until enough match or none is left: the matches past the first
        window came back after the ranked ones, unscored, newest first."""
        k = need * SEARCH_WIDEN if filtered or vector is not None else need
        while True:
            found, candidates = self._ranked_within(query, vector, scope, filters, k, wanted)
            if not filtered or len(found) >= need or candidates < k:
                return found
            k *= SEARCH_WIDEN

    def _ranked_within(
        self,
        query: str,
        vector: np.ndarray | None,
        scope: list[str],
        filters: Filters,
        k: int,
        wanted: Callable[[Memory], bool],
    ) -> tuple[list[Scored], int]:
        """The wanted indexed items among the query's best ``k`` candidates, best first, and how many
        candidates there were (fewer than ``k``: the namespace has no more)."""
        if vector is None:
            hits = self.harness.recall(query, k=k, track=False, tags=scope)
            return [(h.memory, None) for h in hits if _indexed(h.memory) and wanted(h.memory)], len(hits)
        store = self.harness.store
        ids = [i for i, _ in store.query(Query(filters=filters, vector=vector, lexical=False, limit=k)).dense]
        memories, vectors = store.get_many(ids), store.vectors_of(ids)
        scored: list[Scored] = []
        for i in ids:
            m, v = memories.get(i), vectors.get(i)
            if m is not None and v is not None and _indexed(m) and wanted(m):
                scored.append((m, _cosine(v, vector)))
        scored.sort(key=lambda pair: -(pair[1] or 0.0))
        return scored, len(ids)

    def _newest(self, filters: Filters, first: int) -> Iterator[Memory]:
        """The memories matching ``filters``, newest first, in keyset pages that start at ``first`` (what
        the caller still needs) and double up to ``PAGE``: a small search reads little."""
        after: PageKey | None = None
        size = max(1, min(first, PAGE))
        while True:
            page = self.harness.store.page(filters, after, size, newest_first=True)
            yield from page
            if len(page) < size:
                return
            after, size = PageKey.of(page[-1]), min(PAGE, 2 * size)

    def _stored_address(self, op: Op) -> Op:
        """``op`` with its namespace labels and key as the write path stores identifiers. Under a redaction
        policy a label or key that holds a secret is stored as ``[EMAIL]~<digest>``, and that form maps to
        itself, so the original and the form an item comes back with both address it (the key was
        redacted as plain metadata text, ``[EMAIL]``: two such keys came back alike and neither could be
        read or deleted by it). Without a policy, every op is as given."""
        h = self.harness
        if h.redactor.policy_for(h.tenant) is None:
            return op

        def stored(labels: Iterable[str]) -> tuple[str, ...]:
            return tuple(x if x == "*" else h.writer.identifier(x, h.tenant) for x in labels)

        if isinstance(op, GetOp | PutOp):
            return op._replace(namespace=stored(op.namespace), key=h.writer.identifier(op.key, h.tenant))
        if isinstance(op, SearchOp):
            return op._replace(namespace_prefix=stored(op.namespace_prefix))
        if isinstance(op, ListNamespacesOp) and op.match_conditions:
            conditions = tuple(c._replace(path=stored(c.path)) for c in op.match_conditions)
            return op._replace(match_conditions=conditions)
        return op

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        need = op.offset + op.limit
        active = self.harness.filters({})
        prefix = _walk_prefix(conditions)
        out: list[tuple[str, ...]] = []
        listed: set[tuple[str, ...]] = set()
        after: str | None = None
        while len(out) < need:
            page = self.harness.store.tag_names(active, prefix, after, PAGE)
            for tag in page:
                ns = self._namespace_of(tag, active)
                if ns is None or not all(_ns_matches(c, ns) for c in conditions):
                    continue
                shown = ns[: op.max_depth] if op.max_depth is not None else ns
                # tags come in namespace order, except the shortened tags of long labels: a set, not the
                # last one, says whether a namespace cut to max_depth was listed already
                if shown not in listed:
                    out.append(shown)
                    listed.add(shown)
                if len(out) >= need:
                    break
            if len(page) < PAGE:
                break
            after = page[-1]
        return out[op.offset : need]

    def _namespace_of(self, tag: str, active: Filters) -> tuple[str, ...] | None:
        """The namespace a path tag names: decoded, or, for one too long to spell out in a tag, read from an
        item that carries it."""
        decoded = _decode_path(tag)
        if decoded is not None:
            return decoded
        found = self.harness.store.page(active.with_(tags_all=frozenset([tag])), None, 1)
        return tuple(found[0].metadata[TAG]["namespace"]) if found else None

    # ---- writes ---------------------------------------------------------------------------------------
    def _write(
        self, puts: Sequence[PutOp], texts: Sequence[str | None], vectors: Mapping[int, np.ndarray]
    ) -> None:
        """Store ``puts`` (one per key; ``texts``: what each is indexed by, ``vectors``: their embeddings,
        by position) atomically; a write that lost a race to another writer of one of its items is read and
        made again (last writer wins), so no :class:`ConflictError` escapes."""
        indexed = [t is not None for t in texts]
        for attempt in range(CONFLICT_RETRIES):
            try:
                self._commit(puts, indexed, vectors)
                return
            except ConflictError:
                if attempt == CONFLICT_RETRIES - 1:
                    raise
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # let the winner finish

    def _commit(
        self, puts: Sequence[PutOp], indexed: Sequence[bool], vectors: Mapping[int, np.ndarray]
    ) -> None:
        """One try at :meth:`_write`: read the items, write them at their next versions (``indexed``,
        ``vectors``: per put, by position)."""
        h = self.harness
        now = h.now()
        ids = [item_id(h.tenant, op.namespace, op.key) for op in puts]
        stored = h.store.get_many(ids)
        written: list[tuple[Memory, np.ndarray | None]] = []  # each new memory and its vector
        gone: list[Memory] = []  # deleted items, and items moving off a random id (legacy)
        for n, (mid, op) in enumerate(zip(ids, puts, strict=True)):
            current = stored.get(mid)
            # the live item it replaces (a memory at its address that is no item any more is replaced)
            before = (
                current
                if current is not None and h.filters({}).matches(current) and is_item(current)
                else None
            )
            if current is None and (legacy := self._legacy(op.namespace, op.key)) is not None:
                gone.append(legacy)
                before = legacy
            if op.value is None:
                if current is not None:
                    gone.append(current)
                continue
            written.append((self._memory(mid, op, current, before, now, indexed[n]), vectors.get(n)))
        if not written:
            if gone:
                h.writer.delete(gone, [self._forgot(m, now) for m in gone])
            return
        # memories with a vector first (the write path takes one row for each of the first ones)
        written.sort(key=lambda pair: pair[1] is None)
        rows = [v for _, v in written if v is not None]
        memories = [m for m, _ in written]
        events = [self._event(m, now) for m in memories]
        # deleted items expire in the same write, so that every reader sees the batch whole; removed after
        expiring = [revalidate(m, {"expires_at": now, "version": m.version + 1}) for m in gone]
        events += [self._changed(m, ["expires_at"], now) for m in expiring]
        # the vectors are of scrubbed text (_write): kept where redaction changed the stored value
        stacked = np.stack(rows) if rows else None
        h.writer.write([*memories, *expiring], stacked, events, scrubbed_vectors=True)
        if expiring:
            self._remove(expiring)
        if len(rows) < len(memories):
            h.notify_embedder()  # the harness's worker embeds the rest (ClawVM's own recall finds them)

    def _memory(
        self, mid: str, op: PutOp, current: Memory | None, before: Memory | None, now: datetime, indexed: bool
    ) -> Memory:
        """The memory a put stores at ``mid`` (over ``current``, the stored row if any; ``before``: the
        live item it replaces, whose creation time it keeps; ``indexed``: whether searches rank it)."""
        h = self.harness
        assert op.value is not None
        text, ctype = normalize_content(dict(op.value), h.max_content_bytes)
        info = {
            "namespace": list(op.namespace),
            "key": op.key,
            "created_at": (now if before is None else _item(before).created_at).isoformat(),
            "updated_at": now.isoformat(),
            "ttl": op.ttl,
            "indexed": indexed,
        }
        memory = build_memory(
            {
                "id": mid,
                "content": text,
                "content_type": ctype,
                "token_count": count_tokens(text),
                "kind": self.kind,
                "agent_id": self.agent_id,
                "tenant": h.tenant,
                "tier": Tier.WORKING,
                "tags": _tags(op.namespace),
                "metadata": {TAG: info},
                # the time of the last put: the engines' newest-first order is then LangGraph's updated_at
                "created_at": now,
                "expires_at": None if op.ttl is None else now + timedelta(minutes=op.ttl),
                "version": 1 if current is None else current.version + 1,
            }
        )
        if current is None:
            teams.check_write(h, memory)
        else:
            if current.content == text:  # the stored text keeps the redaction mark that describes it
                memory = Redactor.unchanged(current)(memory)
            teams.check_update(h, current, memory)
        return memory.model_copy(update={"value": h.pager.value_now(memory, now)})

    def _indexed_texts(self, puts: Sequence[PutOp]) -> list[str | None]:
        """The text each put is ranked by (None: not indexed), as the tenant's redaction policy stores it:
        the value scrubbed as JSON (each field read with its key: the text of a "password" field alone
        reads as no secret), its indexed fields scrubbed again as the text they join into. A secret never
        reaches the embedding model."""
        writer, tenant = self.harness.writer, self.harness.tenant
        texts: list[str | None] = []
        for op in puts:
            field = None
            if op.value is not None:
                field = self._indexed_text(writer.scrub_json(dict(op.value), tenant), op.index)
            texts.append(None if field is None else writer.scrub(field, tenant))
        return texts

    def _indexed_text(self, value: dict[str, Any], index: Any) -> str | None:
        """The text of ``value`` a search ranks it by: its fields at the put's ``index`` paths (default:
        the store's), joined by newlines; None for ``index=False`` or when no path finds text."""
        if index is False:
            return None
        paths = self.fields if index is None else tuple(index)
        parts = [t for p in paths for t in get_text_at_path(value, p if p == "$" else tokenize_path(p))]
        return "\n".join(parts) if parts else None

    def _vectors(self, plan: _Plan) -> _Vectors:
        """The embeddings ``plan`` needs, from the configured model's sync methods or the harness's
        embedder (none: no vectors, queries rank lexically)."""
        texts = [t for t in plan.texts if t is not None]
        embedder = self.harness.embedder
        rows: Sequence[Any]
        asked: list[Any]
        if self.embeddings is not None:
            if not texts and not plan.queries:
                return _Vectors({}, {})
            embeddings = self.embeddings
            # an async function given as embed: LangChain's ValueError named neither it nor the way out
            if isinstance(embeddings, EmbeddingsLambda) and getattr(embeddings, "func", None) is None:
                raise _async_only()
            try:
                rows = embeddings.embed_documents(texts) if texts else []
                asked = [embeddings.embed_query(q) for q in plan.queries]
            except NotImplementedError:  # a LangChain model that implements only the async methods
                raise _async_only() from None
        elif embedder is not None:
            rows = list(embedder.embed(texts)) if texts else []
            asked = [embedder.embed_query(q) for q in plan.queries]
        else:
            return _Vectors({}, {})
        model = "index.embed" if self.embeddings is not None else "embedder"
        return _Vectors.of(plan, rows, asked, model, self.harness.store.dim)

    @staticmethod
    async def _avectors(plan: _Plan, embeddings: Embeddings, dim: int) -> _Vectors:
        """:meth:`_vectors` from the model's async methods."""
        texts = [t for t in plan.texts if t is not None]
        rows = await embeddings.aembed_documents(texts) if texts else []
        asked = [await embeddings.aembed_query(q) for q in plan.queries]
        return _Vectors.of(plan, rows, asked, "index.embed", dim)

    def _refresh(self, memories: Sequence[Memory]) -> None:
        """Move the expiry of items a read returned forward by their TTL (``refresh_ttl``). One that a
        writer changed meanwhile is left as that writer stored it (a put sets its own TTL)."""
        h = self.harness
        now = h.now()
        for m in memories:
            ttl = _ttl(m)
            assert ttl is not None
            fresh = revalidate(m, {"expires_at": now + timedelta(minutes=ttl), "version": m.version + 1})
            try:
                h.writer.write([fresh], None, [self._changed(fresh, ["expires_at"], now)])
            except ConflictError:
                continue

    def _remove(self, memories: Sequence[Memory]) -> int:
        """Delete those of ``memories`` still stored at the version given: an item a put brought back
        meanwhile, in this process or another, stays (the commit path checks each version in the delete's
        own transaction and refuses the batch; the item that moved on is left out and the rest tried
        again)."""
        h = self.harness
        doomed = list(memories)
        while doomed:
            try:
                return h.writer.delete(doomed, [self._forgot(m, h.now()) for m in doomed])
            except ConflictError as exc:
                left = [m for m in doomed if m.id != exc.ident]
                if len(left) == len(doomed):  # not one of ours: retrying would fail the same way forever
                    raise
                doomed = left
        return 0

    def _event(self, m: Memory, now: datetime) -> Event:
        if m.version == 1:
            data: dict[str, Any] = {"kind": m.kind.value, "tier": m.tier.value}
            return Event(kind=EventKind.ADD, memory_id=m.id, data=data, tenant=m.tenant, at=now)
        return self._changed(m, ["content", "expires_at", "metadata"], now)

    @staticmethod
    def _changed(m: Memory, fields: list[str], now: datetime) -> Event:
        data = {"fields": fields, "version": m.version}
        return Event(kind=EventKind.UPDATE, memory_id=m.id, data=data, tenant=m.tenant, at=now)

    @staticmethod
    def _forgot(m: Memory, now: datetime) -> Event:
        data = {"kind": m.kind.value}
        return Event(kind=EventKind.FORGET, memory_id=m.id, data=data, tenant=m.tenant, at=now)

    def tag_namespaces(self) -> int:
        """Give the items written before namespace tags existed theirs (see the module docstring), page by
        page; returns how many were updated. Safe to run again: tagged items are left alone."""
        updated = 0
        for m in self.harness.store.iter_all(self.harness.filters({"tags": [TAG]}), batch=PAGE):
            tag = _path_tag(tuple(m.metadata[TAG]["namespace"]))
            if tag not in m.tags:
                self.harness.update(m.id, tags=capped_tags([tag], m.tags))
                updated += 1
        return updated


# ---- helpers --------------------------------------------------------------------------------------------
def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b)) / norms if norms > 0 else 0.0


def _ttl(m: Memory) -> float | None:
    ttl = m.metadata.get(TAG, {}).get("ttl")
    return None if ttl is None else float(ttl)


def _indexed(m: Memory) -> bool:
    return bool(m.metadata.get(TAG, {}).get("indexed", True))  # earlier items were indexed whole


def _address(m: Memory) -> tuple[tuple[str, ...], str]:
    info = m.metadata[TAG]
    return tuple(info["namespace"]), info["key"]


def _tags(namespace: tuple[str, ...]) -> list[str]:
    return [TAG, *(_ns_tag(namespace[:n]) for n in range(1, len(namespace) + 1)), _path_tag(namespace)]


def _digest(parts: Iterable[str]) -> str:
    # labels cannot contain NUL (LangGraph validates them), so NUL joins them unambiguously
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _ns_tag(namespace: tuple[str, ...]) -> str:
    return f"lg-ns:{_digest(namespace)}"


def _item_tag(namespace: tuple[str, ...], key: str) -> str:
    """The tag an earlier version of this adapter gave an item (see :meth:`ClawVMStore._legacy`)."""
    return f"lg-item:{_digest((*namespace, '', key))}"


def _path_tag(namespace: tuple[str, ...]) -> str:
    """The namespace as one tag that sorts like the tuple: each label's UTF-8 in hex (byte order is code
    point order), ``.`` between labels (below every hex digit, so a namespace sorts before its children).
    One too long for a tag keeps the hex that fits, then ``~`` and a digest of the whole; it sorts by
    that prefix and is decoded by reading one of its items."""
    spelled = PATH_TAG + ".".join(label.encode().hex() for label in namespace)
    if len(spelled) <= _MAX_TAG:
        return spelled
    digest = _digest(namespace)
    return f"{spelled[: _MAX_TAG - len(digest) - 1]}~{digest}"


def _decode_path(tag: str) -> tuple[str, ...] | None:
    """The namespace a path tag spells out; None for a shortened one (see :func:`_path_tag`)."""
    body = tag[len(PATH_TAG) :]
    if "~" in body:
        return None
    return tuple(bytes.fromhex(label).decode() for label in body.split("."))


def _check_address(op: Op) -> None:
    """Refuse an op whose namespace labels or key hold unpaired surrogates, by name, as a value holding
    them is refused: the item's id and tags are of their UTF-8, which has none (a bare UnicodeEncodeError
    escaped)."""
    labels: tuple[str, ...] = ()
    if isinstance(op, GetOp | PutOp):
        labels = op.namespace
        _check_utf8("key", op.key)
    elif isinstance(op, SearchOp):
        labels = op.namespace_prefix
    elif isinstance(op, ListNamespacesOp):
        labels = tuple(label for c in op.match_conditions or () for label in c.path)
    for label in labels:
        _check_utf8("namespace", label)


def _check_utf8(field: str, text: str) -> None:
    if not isinstance(text, str):  # LangGraph validates the types; the encoding is what is checked here
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(
            field, "contains unpaired surrogates (not valid UTF-8)", "remove or replace them"
        ) from None


def _walk_prefix(conditions: Iterable[MatchCondition]) -> str:
    """The tag prefix every namespace listed must have: the labels a prefix condition fixes before its
    first wildcard (the conditions themselves are still checked on every namespace)."""
    for c in conditions:
        if c.match_type == "prefix":
            fixed = []
            for label in c.path:
                if label == "*":
                    break
                fixed.append(label)
            if fixed:  # no longer than what a shortened tag keeps of its namespace
                spelled = PATH_TAG + ".".join(label.encode().hex() for label in fixed)
                return spelled[: _MAX_TAG - len(_digest(())) - 1]
    return PATH_TAG


def is_item(m: Memory) -> bool:
    """Whether ``m`` reads as an item: the adapter's address in its metadata and a JSON object as its text.
    A memory tagged like an item but not one (a note tagged ``langgraph`` by hand, an item whose text a
    tool or the dashboard changed to prose) is left out of every read: one such memory made every
    ``get`` and ``search`` of its namespace raise."""
    return _item_value(m) is not None


def _item_value(m: Memory) -> dict[str, Any] | None:
    """The value of the item ``m`` holds; None when it is no item (see :func:`is_item`)."""
    info = m.metadata.get(TAG)
    if not isinstance(info, dict) or not {"key", "namespace", "updated_at"} <= info.keys():
        return None
    try:
        value = json.loads(m.content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _item(m: Memory) -> Item:
    info = m.metadata[TAG]
    return Item(
        value=json.loads(m.content),
        key=info["key"],
        namespace=tuple(info["namespace"]),
        # the memory's own creation time is the last put's; earlier items kept LangGraph's there
        created_at=datetime.fromisoformat(info["created_at"]) if "created_at" in info else m.created_at,
        updated_at=datetime.fromisoformat(info["updated_at"]),
    )


def _search_item(m: Memory, score: float | None) -> SearchItem:
    item = _item(m)
    return SearchItem(item.namespace, item.key, item.value, item.created_at, item.updated_at, score)


def _ns_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = (
        namespace[: len(path)]
        if condition.match_type == "prefix"
        else namespace[len(namespace) - len(path) :]
    )
    return all(p in ("*", n) for p, n in zip(path, part, strict=True))


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "$eq": lambda a, b: bool(a == b),
    "$ne": lambda a, b: bool(a != b),
    "$gt": lambda a, b: _num(a) > _num(b),
    "$gte": lambda a, b: _num(a) >= _num(b),
    "$lt": lambda a, b: _num(a) < _num(b),
    "$lte": lambda a, b: _num(a) <= _num(b),
}


def matches(value: Any, condition: Any) -> bool:
    """LangGraph's filter semantics: exact match, ``$`` operators, nested dicts matched field by field.
    The condition is compared as a value is stored (JSON: tuples as lists), else a filter on a tuple
    never matched the value it was put with."""
    if isinstance(condition, Mapping):
        if any(str(k).startswith("$") for k in condition):
            return all(_apply(value, str(op), arg) for op, arg in condition.items())
        return isinstance(value, Mapping) and all(matches(value.get(k), c) for k, c in condition.items())
    return bool(value == _as_stored(condition))


def _as_stored(condition: Any) -> Any:
    """A filter's operand as its value comes back from the store's JSON: tuples (nested too) as lists."""
    if isinstance(condition, list | tuple):
        return [_as_stored(c) for c in condition]
    if isinstance(condition, Mapping):
        return {k: _as_stored(c) for k, c in condition.items()}
    return condition


def _apply(value: Any, op: str, arg: Any) -> bool:
    if op not in _OPS:
        raise ValidationError("filter", f"uses unknown operator {op!r}", f"use one of {sorted(_OPS)}")
    try:
        return _OPS[op](value, _as_stored(arg))
    except (TypeError, ValueError):  # a missing or non-numeric field does not match a comparison
        return False


def _num(v: Any) -> float:
    if isinstance(v, bool) or v is None:
        raise TypeError("not a number")
    return float(v)


#: The longest TTL a put may ask for, in minutes (a hundred years): past it the expiry overflowed a datetime.
MAX_TTL_MINUTES = 100 * 366 * 24 * 60


def _check_ttl(ttl: float | None) -> None:
    """A put's TTL in minutes: None (never expires), 0 (due at once: the next sweep deletes it) or a finite
    number up to the cap. A negative one was taken as a time in the past; NaN and 1e20 failed with
    Python's own errors."""
    if ttl is None:
        return
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 <= ttl <= MAX_TTL_MINUTES:
        raise ValidationError(
            "ttl", f"is {ttl!r}", f"pass minutes from 0 to {MAX_TTL_MINUTES}, or None: it never expires"
        )
