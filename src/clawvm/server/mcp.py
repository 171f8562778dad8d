"""MCP on the REST server (``clawvm serve --mcp``, ``create_app(mcp=True)``): the MCP server of
:mod:`clawvm.integrations.mcp_server` over streamable HTTP at ``/mcp``, behind the same API keys as ``/v1``.

Every HTTP request is authenticated as a REST request is (``Authorization: Bearer <key>`` or ``X-API-Key``:
401 without a valid key, 429 over its key's or its tenant's rate limit or from an address over the
unauthenticated one, in the one error shape), and each MCP request then works on the harness of the key's
tenant. A read-only key may call the read-only tools (their ``readOnlyHint``) and read resources, recording
no usage; a tool that changes memory answers it a ``forbidden`` tool error.
An MCP session opened with one key does not carry it over: each request is its own caller.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from clawvm.core.errors import AuthenticationError, ClawVMError
from clawvm.integrations.mcp_server import Access, build_server
from clawvm.server.auth import identify
from clawvm.server.errors import response_for
from clawvm.server.service import Service
from clawvm.store.keys import Permission, Principal

PATH = "/mcp"


class McpEndpoint:
    """The ASGI endpoint at ``/mcp``; :meth:`running` must wrap the app's lifespan (it owns the MCP
    sessions' task group)."""

    path = PATH

    def __init__(self, service: Service) -> None:
        self.service = service
        self.manager = StreamableHTTPSessionManager(app=build_server(self.access))
        self.app = StreamableHTTPASGIApp(self.manager)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                principal = self.authenticate(scope)
            except ClawVMError as exc:
                await response_for(exc)(scope, receive, send)
                return
            scope.setdefault("state", {})["principal"] = (
                principal  # the request's caller, and the access log's
            )
        await self.app(scope, receive, send)

    def authenticate(self, scope: Scope) -> Principal:
        """The caller, checked and charged as over REST: the unauthenticated limit of its address (bad keys
        over /mcp were looked up without end), then the key's and the tenant's limits."""
        headers = Headers(scope=scope)
        bearer = headers.get("authorization", "")
        scheme, _, token = bearer.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key")
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        principal = identify(self.service, address, given, bearer or None)
        self.service.admit(principal)
        return principal

    def access(self, ctx: ServerRequestContext[Any]) -> Access:
        """The harness of the calling key's tenant (set on the HTTP request by :meth:`__call__`)."""
        principal = getattr(getattr(ctx.request, "state", None), "principal", None)
        if not isinstance(principal, Principal):  # never: every request passed __call__
            raise AuthenticationError("no API key on this MCP request")
        harness = self.service.harness_for(principal.tenant)
        return Access(harness, may_write=principal.can(Permission.WRITE))
