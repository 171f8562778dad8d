""":func:`create_app`, the factory: one :class:`Service` over the store, the :class:`Guard` middleware,
the error handlers, and the routers: health at the root, the API under ``/v1``, the dashboard at
``/dashboard``, and any more the caller passes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.routing import Route

from clawvm.core.embed import Embedder
from clawvm.core.version import __version__
from clawvm.server.auth import refusal_before_the_body
from clawvm.server.errors import ERROR_RESPONSES, install_error_handlers
from clawvm.server.middleware import REQUEST_ID_HEADER, Guard
from clawvm.server.routes import events, health, keys, memories, recall, sessions
from clawvm.server.routes.dashboard import dashboard_router
from clawvm.server.schemas.requests import state_embedding_dim
from clawvm.server.service import RequestGauge, Service, embedder_from
from clawvm.server.settings import ServerSettings
from clawvm.store import Store, store_from_url

#: The routers under ``/v1``, in the order the OpenAPI document lists their tags.
V1_ROUTERS: tuple[APIRouter, ...] = (
    keys.router,
    memories.router,
    recall.router,
    sessions.router,
    events.router,
)


class ClawVMApp(FastAPI):
    """The FastAPI app whose OpenAPI document declares ``X-Request-ID`` on every response of every
    operation: :class:`Guard` adds it to all of them, a place no route's ``responses`` reaches."""

    _declared_in: dict[str, Any] | None = None

    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        if schema is not self._declared_in:  # FastAPI builds it again when routes are added
            _declare_request_id(schema)
            self._declared_in = schema
        return schema


def _declare_request_id(schema: dict[str, Any]) -> None:
    """``X-Request-ID`` in each response of ``schema``'s operations, by reference to one definition."""
    schema.setdefault("components", {}).setdefault("headers", {})["X-Request-ID"] = REQUEST_ID_HEADER
    ref = {"$ref": "#/components/headers/X-Request-ID"}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict):  # a path item's summary or shared parameters
                continue
            for response in operation.get("responses", {}).values():
                response.setdefault("headers", {})["X-Request-ID"] = ref


def create_app(
    target: str | Path | Store = "clawvm.db",
    *,
    embedder: Embedder | str | None = "default",
    settings: ServerSettings | None = None,
    routers: Sequence[APIRouter] = (),
    harness_options: Mapping[str, Any] | None = None,
    mcp: bool = False,
    requests: RequestGauge | None = None,
) -> FastAPI:
    """The ClawVM REST app over ``target`` (a store URL or path, or an open-able Store).

    ``embedder``: ``"default"`` (offline MiniLM), ``None`` (lexical recall only) or an Embedder.
    ``routers``: more APIRouters to mount (they can depend on :data:`Reader`/:data:`Writer`/:data:`Admin`).
    ``harness_options``: more keyword arguments for every tenant's :class:`Harness` (``pager``,
    ``redaction`` — one policy or one per tenant —, ``data_keys``, ``summarizer`` ...).
    ``mcp``: also serve MCP (streamable HTTP) at ``/mcp``, behind the same keys (:mod:`clawvm.server.mcp`;
    needs the ``integrations`` extra).
    ``requests``: the gauge of requests in flight, shared by the worker processes of ``serve --workers``.
    A Store passed in is set up but left open at shutdown (its owner closes it); one opened from a URL is
    closed with the app.
    """
    settings = settings or ServerSettings()
    emb = embedder_from(embedder)
    owns = not isinstance(target, Store)
    store = target if isinstance(target, Store) else store_from_url(target, dim=emb.dim if emb else 384)
    service = Service(
        store, emb, settings, owns_store=owns, harness_options=harness_options, requests=requests
    )
    mcp_endpoint = None
    if mcp:
        from clawvm.server.mcp import McpEndpoint  # the mcp package is an optional extra

        mcp_endpoint = McpEndpoint(service)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        sessions: AbstractAsyncContextManager[None] = (
            mcp_endpoint.running() if mcp_endpoint else nullcontext()
        )
        try:
            async with sessions:
                yield
        finally:
            service.close()

    app = ClawVMApp(
        title="ClawVM",
        version=__version__,
        description="Harness-managed memory for LLM agents. Every error is "
        '`{"error": {"code", "message", "field", "fix"}}`.',
        lifespan=lifespan,
    )
    app.state.service = service
    app.add_middleware(Guard, max_body_bytes=settings.max_body_bytes, gauge=service.requests)
    install_error_handlers(app, key_check=refusal_before_the_body)
    app.include_router(health.router)
    v1 = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)
    for router in V1_ROUTERS:
        v1.include_router(router)
    app.include_router(v1)
    # mounted routers document the same error responses (the spec then lists every status they answer)
    app.include_router(dashboard_router(settings), responses=ERROR_RESPONSES)
    for router in routers:
        app.include_router(router, responses=ERROR_RESPONSES)
    if mcp_endpoint is not None:
        endpoint = Route(mcp_endpoint.path, mcp_endpoint, include_in_schema=False)  # an ASGI app
        app.router.routes.append(endpoint)
    state_embedding_dim(app, emb.dim if emb is not None else store.dim)
    return app
