"""What the app's router makes of a request path, asked of the router itself (Starlette's own matching):
which methods the path answers (:func:`allowed_methods`, for ``Allow`` on a 405 and on an ``OPTIONS``)
and which path parameter a place in it is (:func:`parameter_at`, for a 400 that names it). Read from the
OpenAPI templates instead, they split ``{name:path}`` parameters on ``/``, ignored the mount prefix or
``root_path`` and named a redirected trailing-slash path as a route's."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import fastapi.routing
from starlette.routing import Match

#: The methods a route is asked about: a route that takes any (a mounted ASGI app) takes these.
_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE")


def _routes(app: Any) -> Iterable[Any]:
    return getattr(getattr(app, "router", None), "routes", ())


def answered_methods(scope: MutableMapping[str, Any]) -> set[str]:
    """The methods the app's routes take at the scope's path: each route's full match for that method, as
    the router dispatches (so a ``{name:path}`` parameter, a mount prefix and ``root_path`` read as they
    do there). Where routes overlap, the most literal ones only (the fewest path parameters:
    ``/v1/memories/import`` over ``/v1/memories/{memory_id}``), as OpenAPI matches a path to its template:
    ``Allow`` then lists what the document states for the path."""
    by_parameters: dict[int, set[str]] = {}
    for route in _leaf_routes(scope.get("app")):
        taken = {m for m in _METHODS if route.matches({**scope, "method": m})[0] is Match.FULL}
        if taken:
            parameters = len(getattr(route, "param_convertors", None) or {})
            by_parameters.setdefault(parameters, set()).update(taken)
    return by_parameters[min(by_parameters)] if by_parameters else set()


def allowed_methods(scope: MutableMapping[str, Any]) -> list[str]:
    """What ``Allow`` says for the scope's path, sorted: the methods its routes take and ``OPTIONS`` (the
    Guard answers it wherever a route is); none where no route takes the path."""
    answered = answered_methods(scope)
    return sorted(answered | {"OPTIONS"}) if answered else []


def parameter_at(scope: MutableMapping[str, Any], offset: int) -> str:
    """The name of the path parameter that the character at ``offset`` of the scope's (decoded) path falls
    in, in the first route whose pattern takes the path with a parameter there; ``path`` when none does."""
    path = str(scope.get("path", ""))
    route_path = _route_path(scope)
    at = offset - (len(path) - len(route_path))  # the prefix the router strips off
    for route in _leaf_routes(scope.get("app")):
        regex = getattr(route, "path_regex", None)
        found = regex.match(route_path) if regex is not None else None
        if found is None:
            continue
        for name in found.groupdict():
            start, end = found.span(name)
            if start <= at < end:
                return str(name)
    return "path"


def _leaf_routes(app: Any) -> Iterable[Any]:
    """The app's routes one by one: FastAPI from 0.16x nests an included router's routes in one entry
    (their patterns and parameters only there); earlier ones list them flat."""
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    routes = list(_routes(app))
    return contexts(routes) if callable(contexts) else routes


def _route_path(scope: MutableMapping[str, Any]) -> str:
    """The path the router matches: without the ``root_path`` it was mounted under (Starlette's rule)."""
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path
