"""MCP on the REST server (``clawvm serve --mcp``, ``create_app(mcp=True)``): the MCP server of
:mod:`clawvm.integrations.mcp_server` over streamable HTTP at ``/mcp``, behind the same API keys as ``/v1``.

Every HTTP request is authenticated as a REST request is (``Authorization: Bearer <key>`` or ``X-API-Key``:
401 without a valid key, 429 over its key's or its tenant's rate limit or from an address over the
unauthenticated one, in the one error shape), and each MCP request then works on the harness of the key's
tenant. A read-only key may call the read-only tools (their ``readOnlyHint``) and read resources, recording
no usage; a tool that changes memory answers it a ``forbidden`` tool error.
An MCP session opened with one key does not carry it over: each request is its own caller.
As over REST, a key that must be read from the store is looked up, and a tenant's first harness made, in a
thread: no store call blocks the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from clawvm.core.errors import AuthenticationError, ClawVMError
from clawvm.harness import Harness
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
                principal = await self.authenticate(scope)
                harness = await self.harness_of(principal)
            except ClawVMError as exc:
                await response_for(exc)(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state["principal"] = principal  # the request's caller, and the access log's
            state["harness"] = harness  # what :meth:`access` hands the MCP handlers
        await self.app(scope, receive, send)

    async def authenticate(self, scope: Scope) -> Principal:
        """The caller, checked and charged as over REST (:func:`clawvm.server.auth.authenticate`): a key
        that must be read from the store is looked up in a thread, since that read waits for the engine's
        lock, which a long store call (an import, a recall) holds, and on the loop it froze every request."""
        headers = Headers(scope=scope)
        bearer = headers.get("authorization", "")
        scheme, _, token = bearer.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key")
        if self.service.keyring.needs_lookup(given):
            return await run_in_threadpool(self._authenticate, scope, given, bearer)
        return self._authenticate(scope, given, bearer)

    def _authenticate(self, scope: Scope, given: str | None, bearer: str) -> Principal:
        """The unauthenticated limit of the address (bad keys over /mcp were looked up without end), then
        the key's and the tenant's limits."""
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        principal = identify(self.service, address, given, bearer or None)
        self.service.admit(principal)
        return principal

    async def harness_of(self, principal: Principal) -> Harness:
        """The harness of the caller's tenant, made in a thread the first time: making it reads the store,
        and the MCP handlers that use it run on the event loop."""
        harness = self.service.harness_made(principal.tenant)
        if harness is None:
            harness = await run_in_threadpool(self.service.harness_for, principal.tenant)
        return harness

    def access(self, ctx: ServerRequestContext[Any]) -> Access:
        """The harness of the calling key's tenant (set on the HTTP request by :meth:`__call__`: called on
        the event loop, this reads no store)."""
        state = getattr(ctx.request, "state", None)
        principal = getattr(state, "principal", None)
        harness = getattr(state, "harness", None)
        if not isinstance(principal, Principal) or not isinstance(harness, Harness):  # never: see __call__
            raise AuthenticationError("no API key on this MCP request")
        return Access(harness, may_write=principal.can(Permission.WRITE))
