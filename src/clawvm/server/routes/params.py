"""Parameters shared by the routes: bounded path ids, so a path cannot carry an unbounded id to the store, and
the check that a route takes every query parameter sent."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel

from clawvm.core.errors import ValidationError

MemoryId = Annotated[str, Path(min_length=1, max_length=100, description="a memory id")]
ScopeId = Annotated[str, Path(min_length=1, max_length=256)]  # a session or task id


async def known_query_only(request: Request) -> None:  # async: no worker thread for a dict lookup
    """Refuse a query parameter the route does not take (422 naming it, with the ones it takes): ignored,
    a misspelt filter (``?sesion_id=s1``) answered as if there were none, with every memory.

    The names are the route's own parameters (aliases and the fields of query models included), read
    once per route. Called by the key check (:func:`clawvm.server.auth.caller_with`), once the caller is
    known: the routes that take no key (health, the dashboard's page and files) are not checked."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    allowed: frozenset[str] | None = getattr(route, _NAMES_ATTRIBUTE, None)
    if allowed is None:
        allowed = _query_names(route)
        setattr(route, _NAMES_ATTRIBUTE, allowed)  # kept with the route (routes are not hashable)
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise ValidationError(unknown[0], "is not a query parameter of this route", f"use one of: {takes}")


_NAMES_ATTRIBUTE = "_clawvm_query_names"


def _query_names(route: APIRoute) -> frozenset[str]:
    """Every query parameter name ``route`` and its dependencies declare."""
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        pending.extend(dependant.dependencies)
        for param in dependant.query_params:
            model = param.field_info.annotation
            if isinstance(model, type) and issubclass(model, BaseModel):  # a query model: its fields
                names.update(f.alias or name for name, f in model.model_fields.items())
            else:
                names.add(param.alias)
    return frozenset(names)
