"""Parameters shared by the routes: bounded path ids, so a path cannot carry an unbounded id to the store, and
the check that a route takes every query parameter sent."""

from __future__ import annotations

from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Path, Query, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel

from clawvm.core.errors import ValidationError
from clawvm.core.model import MAX_COUNT, NON_BLANK

MemoryId = Annotated[str, Path(min_length=1, max_length=100, description="a memory id")]
# a session or task id, in routes as {session_id:path}: an id may hold "/" (record takes it), and a plain
# segment left such a session unreachable (its checkpoints a 404, even with the slash encoded)
# (not blank: the store refuses an id of only white space, so the spec says so and a fuzzer's "\x1e" is
# a schema error, not a schema-valid request refused)
ScopeId = Annotated[str, Path(min_length=1, max_length=256, pattern=NON_BLANK)]
#: The version a caller read, on a route that changes or deletes one memory: a newer one is a 409
ExpectedVersion = Annotated[
    int | None, Query(ge=1, le=MAX_COUNT, description="the version you read; a newer one is a 409")
]


async def known_query_only(request: Request) -> None:  # async: no worker thread for a dict lookup
    """Refuse a query parameter the route does not take (422 naming it, with the ones it takes): ignored,
    a misspelt filter (``?sesion_id=s1``) answered as if there were none, with every memory. Refuse one
    given twice that takes one value (``?limit=1&limit=3`` read the last and ignored the first).

    The names are the route's own parameters (aliases and the fields of query models included), read
    once per route. Called by the key check (:func:`clawvm.server.auth.caller_with`), once the caller is
    known: the routes that take no key (health, the dashboard's page and files) are not checked."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    declared: _Declared | None = getattr(route, _NAMES_ATTRIBUTE, None)
    if declared is None:
        declared = _query_names(route)
        setattr(route, _NAMES_ATTRIBUTE, declared)  # kept with the route (routes are not hashable)
    given = request.query_params
    unknown = sorted(set(given) - declared.names)
    if unknown:
        takes = ", ".join(sorted(declared.names)) or "none"
        raise ValidationError(unknown[0], "is not a query parameter of this route", f"use one of: {takes}")
    for name in sorted(set(given) - declared.lists):
        if len(values := given.getlist(name)) > 1:
            raise ValidationError(name, f"is given {len(values)} times", "give it once")
    if route.body_field is None and _has_body(request) and (await request.body()).strip() not in _NO_BODY:
        # ignored, a DELETE's {"expected_version": 3} deleted whatever the version
        fix = "send no body" + (
            f" (it takes query parameters: {', '.join(sorted(declared.names))})" if declared.names else ""
        )
        raise ValidationError("body", "is not taken by this route", fix)


#: What a route that takes no body accepts as none (clients send an empty object with every POST)
_NO_BODY = (b"", b"{}", b"null")


def _has_body(request: Request) -> bool:
    """Whether the request carries a body (a non-zero length, or a chunked one)."""
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "chunked" in request.headers.get("transfer-encoding", "").lower()


_NAMES_ATTRIBUTE = "_clawvm_query_names"


@dataclass(frozen=True)
class _Declared:
    """A route's query parameters: every name, and those that take a list (given once per value)."""

    names: frozenset[str]
    lists: frozenset[str]


def _query_names(route: APIRoute) -> _Declared:
    """Every query parameter name ``route`` and its dependencies declare."""
    names: set[str] = set()
    lists: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        pending.extend(dependant.dependencies)
        for param in dependant.query_params:
            model = param.field_info.annotation
            if isinstance(model, type) and issubclass(model, BaseModel):  # a query model: its fields
                for name, f in model.model_fields.items():
                    names.add(f.alias or name)
                    if _takes_many(f.annotation):
                        lists.add(f.alias or name)
            else:
                names.add(param.alias)
                if _takes_many(model):
                    lists.add(param.alias)
    return _Declared(frozenset(names), frozenset(lists))


def _takes_many(annotation: Any) -> bool:
    """Whether a parameter of this type takes a list (``list[str] | None``, annotated or not)."""
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset):
        return True
    if origin in (Union, UnionType, Annotated):
        return any(_takes_many(arg) for arg in get_args(annotation))
    return False
