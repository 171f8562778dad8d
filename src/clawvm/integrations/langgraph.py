"""LangGraph: a ``BaseStore`` backed by ClawVM, so graphs keep long-term memory in a ClawVM store.

``ClawVMStore(harness)`` implements ``batch``/``abatch`` (LangGraph's store methods — ``put``, ``get``,
``search``, ``delete``, ``list_namespaces`` and their ``a*`` forms — are built on them by ``BaseStore``).

Mapping:

- an item is one memory (kind ``knowledge`` by default): its value as JSON content, its namespace and key
  in ``metadata.langgraph`` (with ``updated_at``); an overwrite is ``Harness.update`` (the version grows),
  a delete is ``Harness.forget``;
- namespaces are scopes: every prefix of an item's namespace is an indexed tag (``lg-ns:<digest>``), so
  ``search(("users", "alice"))`` is filtered inside the engine like a session scope; ``get`` uses the
  item's own tag (``lg-item:<digest>``); the namespace itself is a tag too (``lg-path:`` and its labels'
  UTF-8 in hex, ``.`` between labels), whose code-point order is the namespaces' tuple order;
- ``search(query=...)`` ranks with ClawVM's hybrid recall (lexical + dense) within the namespace: the
  best ``offset + limit`` items (``SEARCH_WIDEN`` times that with a ``filter``), then the items the
  recall did not reach without a score (as LangGraph's in-memory store does), newest first; without a
  query, newest first. ``filter`` matches values exactly or with ``$eq $ne $gt $gte $lt $lte``, nested
  dicts included; ``limit``/``offset`` page the result. The namespace is read in keyset pages only as
  far as the page asked for needs (with a selective ``filter``, as far as it takes to fill it);
- ``list_namespaces`` supports prefix/suffix conditions with ``"*"`` wildcards and ``max_depth``: it walks
  the distinct namespace tags in order (``Store.tag_names``) and stops once ``offset + limit`` are found,
  so its cost follows the page, not the number of items.

Not supported: TTLs (``supports_ttl = False``: LangGraph refuses a ``ttl`` argument) and per-item index
fields (every item is indexed whole). Items written before namespace tags existed are listed by
``list_namespaces`` once :meth:`ClawVMStore.tag_namespaces` has run over the store (once).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from clawvm.core.errors import ValidationError
from clawvm.core.model import Filters, Kind, Memory
from clawvm.harness import Harness
from clawvm.store import PageKey

TAG = "langgraph"
PATH_TAG = "lg-path:"  # + the namespace, encoded by _path_tag
PAGE = 256  # memories (or namespace tags) read per keyset page
SEARCH_WIDEN = 4  # with a filter, how many times offset + limit the recall ranks
_MAX_TAG = 200  # the model's limit on a tag's length


class ClawVMStore(BaseStore):
    """LangGraph's store interface over a :class:`~clawvm.Harness` (see the module docstring)."""

    supports_ttl = False

    def __init__(
        self, harness: Harness, *, kind: Kind | str = Kind.KNOWLEDGE, agent_id: str | None = None
    ) -> None:
        self.harness = harness
        self.kind = Kind(kind)
        self.agent_id = agent_id

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order; each result at its operation's position."""
        results: list[Result] = []
        for op in ops:
            validate_op_namespace(op)
            results.append(self._run(op))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # ---- operations -------------------------------------------------------------------------------------
    def _run(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            found = self._find(op.namespace, op.key)
            return _item(found) if found is not None else None
        if isinstance(op, PutOp):
            self._put(op)
            return None
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._namespaces(op)
        raise ValidationError(
            "op", f"is a {type(op).__name__}", "pass GetOp, PutOp, SearchOp or ListNamespacesOp"
        )

    def _put(self, op: PutOp) -> None:
        existing = self._find(op.namespace, op.key)
        if op.value is None:
            if existing is not None:
                self.harness.forget(existing.id)
            return
        now = self.harness.now()
        info = {"namespace": list(op.namespace), "key": op.key, "updated_at": now.isoformat()}
        tags = [
            TAG,
            *(_ns_tag(op.namespace[:n]) for n in range(1, len(op.namespace) + 1)),
            _item_tag(op.namespace, op.key),
            _path_tag(op.namespace),
        ]
        if existing is None:
            self.harness.record(
                dict(op.value),
                kind=self.kind,
                agent_id=self.agent_id,
                tags=tags,
                metadata={TAG: info},
                created_at=now,
            )
        else:
            changes: dict[str, Any] = {
                "content": dict(op.value),
                "metadata": {**existing.metadata, TAG: info},
            }
            if _path_tag(op.namespace) not in existing.tags:  # written before namespace tags existed
                changes["tags"] = [*existing.tags, _path_tag(op.namespace)]
            self.harness.update(existing.id, **changes)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        scope = [_ns_tag(op.namespace_prefix)] if op.namespace_prefix else [TAG]
        need = op.offset + op.limit

        def wanted(m: Memory) -> bool:
            return not op.filter or matches(json.loads(m.content), op.filter)

        found: list[tuple[Memory, float | None]] = []
        if op.query and need > 0:
            k = need * SEARCH_WIDEN if op.filter else need
            hits = self.harness.recall(op.query, k=k, track=False, tags=scope)
            found = [(h.memory, h.score) for h in hits if wanted(h.memory)]
        reached = {m.id for m, _ in found}
        if len(found) < need:  # the rest of the namespace, newest first, only as far as the page needs
            for m in self._newest(self.harness.filters({"tags": scope}), need - len(found)):
                if m.id not in reached and wanted(m):
                    found.append((m, None))
                    if len(found) >= need:
                        break
        return [_search_item(m, s) for m, s in found[op.offset : need]]

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

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        need = op.offset + op.limit
        active = self.harness.filters({})
        prefix = _walk_prefix(conditions)
        out: list[tuple[str, ...]] = []
        after: str | None = None
        while len(out) < need:
            page = self.harness.store.tag_names(active, prefix, after, PAGE)
            for tag in page:
                ns = self._namespace_of(tag, active)
                if ns is None or not all(_ns_matches(c, ns) for c in conditions):
                    continue
                shown = ns[: op.max_depth] if op.max_depth is not None else ns
                if not out or out[-1] != shown:  # tags come in namespace order: duplicates are adjacent
                    out.append(shown)
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

    def _find(self, namespace: tuple[str, ...], key: str) -> Memory | None:
        found = self.harness.list(limit=1, tags=[_item_tag(namespace, key)])
        return found[0] if found else None

    def tag_namespaces(self) -> int:
        """Give the items written before namespace tags existed theirs (see the module docstring), page by
        page; returns how many were updated. Safe to run again: tagged items are left alone."""
        updated = 0
        for m in self.harness.store.iter_all(self.harness.filters({"tags": [TAG]}), batch=PAGE):
            tag = _path_tag(tuple(m.metadata[TAG]["namespace"]))
            if tag not in m.tags:
                self.harness.update(m.id, tags=[*m.tags, tag])
                updated += 1
        return updated


# ---- helpers --------------------------------------------------------------------------------------------
def _digest(parts: Iterable[str]) -> str:
    # labels cannot contain NUL (LangGraph validates them), so NUL joins them unambiguously
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _ns_tag(namespace: tuple[str, ...]) -> str:
    return f"lg-ns:{_digest(namespace)}"


def _item_tag(namespace: tuple[str, ...], key: str) -> str:
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


def _item(m: Memory) -> Item:
    info = m.metadata[TAG]
    return Item(
        value=json.loads(m.content),
        key=info["key"],
        namespace=tuple(info["namespace"]),
        created_at=m.created_at,
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
    """LangGraph's filter semantics: exact match, ``$`` operators, nested dicts matched field by field."""
    if isinstance(condition, Mapping):
        if any(str(k).startswith("$") for k in condition):
            return all(_apply(value, str(op), arg) for op, arg in condition.items())
        return isinstance(value, Mapping) and all(matches(value.get(k), c) for k, c in condition.items())
    return bool(value == condition)


def _apply(value: Any, op: str, arg: Any) -> bool:
    if op not in _OPS:
        raise ValidationError("filter", f"uses unknown operator {op!r}", f"use one of {sorted(_OPS)}")
    try:
        return _OPS[op](value, arg)
    except (TypeError, ValueError):  # a missing or non-numeric field does not match a comparison
        return False


def _num(v: Any) -> float:
    if isinstance(v, bool) or v is None:
        raise TypeError("not a number")
    return float(v)
