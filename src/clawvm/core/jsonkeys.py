""":func:`repeated_key`: the first key a JSON document gives twice in one object. Python's JSON reader (and
so FastAPI) keeps the last value of a repeated key and drops the others without a word:
``{"content": "a", "content": "b"}`` recorded "b". Every edge that reads JSON refuses such a document with
it, naming the key: the REST API's guard (once for every route), the CLI's import and ``--json-content``,
the agent tools' arguments."""

from __future__ import annotations

import json
from typing import Any


class _Repeated(dict[str, Any]):
    """A JSON object in which ``key`` was given more than once (the parsed object keeps its last value)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def repeated_key(body: str | bytes) -> str | None:
    """The path of the first repeated key of JSON ``body`` (``content``, ``metadata.a``,
    ``memories.3.content``, as a 422 names a field), or None: none is repeated, or the body is no JSON
    Python reads (the route's own parsing then says why)."""
    seen_one: list[bool] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) == len(pairs):  # the usual case: one dict, one length comparison
            return obj
        seen_one.append(True)
        return _Repeated(pairs, _first_repeated(pairs))

    try:
        document = json.loads(body, object_pairs_hook=pairs_hook)
    except (ValueError, RecursionError):  # not JSON, too deep, or too many digits: not ours to say
        return None
    return _path_of_repeated(document) if seen_one else None


def _first_repeated(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no key is repeated")  # called only when the dict came out shorter


def _path_of_repeated(document: Any) -> str | None:
    """The dotted path of the first repeated key, in document order. Walked with a stack, not recursion:
    the document may nest as deep as the JSON reader takes (close to the recursion limit)."""
    pending: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while pending:
        value, path = pending.pop()
        if isinstance(value, _Repeated):
            return ".".join((*path, value.key))
        children: list[tuple[str, Any]] = []
        if isinstance(value, dict):
            children = [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            children = [(str(i), v) for i, v in enumerate(value)]
        pending.extend((v, (*path, k)) for k, v in reversed(children))  # reversed: the first comes out first
    return None
