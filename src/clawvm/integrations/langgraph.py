"""LangGraph: a ``BaseStore`` backed by ClawVM, so graphs keep long-term memory in a ClawVM store.

``ClawVMStore(harness)`` implements ``batch``/``abatch`` (LangGraph's store methods — ``put``, ``get``,
``search``, ``delete``, ``list_namespaces`` and their ``a*`` forms — are built on them by ``BaseStore``).

Mapping:

- an item is one memory (kind ``knowledge`` by default): its value as JSON content, its namespace and key
  in ``metadata.langgraph`` (with ``updated_at``); an overwrite is ``Harness.update`` (the version grows),
  a delete is ``Harness.forget``;
- namespaces are scopes: every prefix of an item's namespace is an indexed tag (``lg-ns:<digest>``), so
  ``search(("users", "alice"))`` is filtered inside the engine like a session scope; ``get`` uses the
  item's own tag (``lg-item:<digest>``);
- ``search(query=...)`` ranks with ClawVM's hybrid recall (lexical + dense) within the namespace, items the
  recall did not reach follow without a score (as LangGraph's in-memory store does); without a query,
  newest first. ``filter`` matches values exactly or with ``$eq $ne $gt $gte $lt $lte``, nested dicts
  included; ``limit``/``offset`` page the result;
- ``list_namespaces`` supports prefix/suffix conditions with ``"*"`` wildcards and ``max_depth``.

Not supported: TTLs (``supports_ttl = False``: LangGraph refuses a ``ttl`` argument) and per-item index
fields (every item is indexed whole).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
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
from clawvm.core.model import Kind, Memory
from clawvm.harness import Harness

TAG = "langgraph"
SCAN_LIMIT = 10**6


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
        if existing is None:
            self.harness.record(
                dict(op.value),
                kind=self.kind,
                agent_id=self.agent_id,
                tags=[
                    TAG,
                    *(_ns_tag(op.namespace[:n]) for n in range(1, len(op.namespace) + 1)),
                    _item_tag(op.namespace, op.key),
                ],
                metadata={TAG: info},
                created_at=now,
            )
        else:
            self.harness.update(
                existing.id, content=dict(op.value), metadata={**existing.metadata, TAG: info}
            )

    def _search(self, op: SearchOp) -> list[SearchItem]:
        scope = [_ns_tag(op.namespace_prefix)] if op.namespace_prefix else [TAG]
        scored: list[tuple[Memory, float | None]]
        if op.query:
            everything = self.harness.list(limit=SCAN_LIMIT, tags=scope)
            hits = self.harness.recall(op.query, k=max(1, len(everything)), track=False, tags=scope)
            reached = {h.id for h in hits}
            scored = [(h.memory, h.score) for h in hits]
            scored += [(m, None) for m in everything if m.id not in reached]
        else:
            scored = [(m, None) for m in self.harness.list(limit=SCAN_LIMIT, tags=scope)]
        wanted = [(m, s) for m, s in scored if not op.filter or matches(json.loads(m.content), op.filter)]
        page = wanted[op.offset : op.offset + op.limit]
        return [_search_item(m, s) for m, s in page]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found = {tuple(m.metadata[TAG]["namespace"]) for m in self.harness.list(limit=SCAN_LIMIT, tags=[TAG])}
        kept = [ns for ns in found if all(_ns_matches(c, ns) for c in op.match_conditions or ())]
        if op.max_depth is not None:
            kept = list({ns[: op.max_depth] for ns in kept})
        return sorted(kept)[op.offset : op.offset + op.limit]

    def _find(self, namespace: tuple[str, ...], key: str) -> Memory | None:
        found = self.harness.list(limit=1, tags=[_item_tag(namespace, key)])
        return found[0] if found else None


# ---- helpers --------------------------------------------------------------------------------------------
def _digest(parts: Iterable[str]) -> str:
    # labels cannot contain NUL (LangGraph validates them), so NUL joins them unambiguously
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _ns_tag(namespace: tuple[str, ...]) -> str:
    return f"lg-ns:{_digest(namespace)}"


def _item_tag(namespace: tuple[str, ...], key: str) -> str:
    return f"lg-item:{_digest((*namespace, '', key))}"


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
