"""The route templates a request path fits, read from the app's OpenAPI paths (built once and cached by
FastAPI): which path parameter a segment is (:func:`parameter_at`, for a 400 that names it) and which
methods the path answers (:func:`allowed_methods`, for ``Allow`` on a 405 and on an ``OPTIONS``)."""

from __future__ import annotations

from typing import Any

from starlette.routing import Match

_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def _templates(app: Any, path: str) -> list[tuple[list[str], dict[str, Any]]]:
    """The OpenAPI path templates ``path`` fits segment by segment (a ``{parameter}`` fits any one), each
    as its segments, with its operations."""
    openapi = getattr(app, "openapi", None)
    paths: dict[str, Any] = openapi().get("paths", {}) if callable(openapi) else {}
    segments = path.split("/")
    fitting = []
    for template, operations in paths.items():
        parts = str(template).split("/")
        if len(parts) == len(segments) and all(
            p == s or (p.startswith("{") and p.endswith("}")) for p, s in zip(parts, segments, strict=True)
        ):
            fitting.append((parts, operations))
    return fitting


def parameter_at(app: Any, path: str, index: int) -> str:
    """The name of the path parameter at segment ``index`` of a template ``path`` fits, or ``path``."""
    for parts, _operations in _templates(app, path):
        if parts[index].startswith("{"):
            return parts[index][1:-1].split(":", 1)[0]
    return "path"


def declared_methods(app: Any, path: str) -> set[str]:
    """Every method the OpenAPI document lists for the template ``path`` fits (the most literal one:
    ``/v1/memories/import`` over ``/v1/memories/{memory_id}``); none when no template fits. Several routes
    (GET and POST /v1/keys) may share a template, where Starlette's 405 names the first route's only."""
    fits: dict[int, set[str]] = {}  # by how many parameters the template has: the fewest is the route
    for parts, operations in _templates(app, path):
        params = sum(p.startswith("{") for p in parts)
        fits.setdefault(params, set()).update(m.upper() for m in operations if m in _METHODS)
    return fits[min(fits)] if fits else set()


def allowed_methods(app: Any, path: str) -> list[str]:
    """What ``Allow`` says for ``path``, sorted: its declared methods, ``OPTIONS`` (the Guard answers it on
    every route) and ``HEAD`` where a route outside the schema answers it (the health probes); none when
    no route template fits."""
    declared = declared_methods(app, path)
    if not declared:
        return []
    implicit = {"OPTIONS"} | ({"HEAD"} if _answers(app, path, "HEAD") else set())
    return sorted(declared | implicit)


def _answers(app: Any, path: str, method: str) -> bool:
    """Whether one of the app's routes takes ``method`` at ``path`` (Starlette's own matching)."""
    router = getattr(app, "router", None)
    scope = {"type": "http", "path": path, "method": method, "root_path": ""}
    return any(route.matches(scope)[0] is Match.FULL for route in getattr(router, "routes", ()))
