"""MCP: a server (official ``mcp`` SDK, 2.x) giving an MCP client ClawVM's memory: the agent tools of
:mod:`clawvm.agents.tools`, the memories and session contexts as resources, and instructions for the model.

Run it over stdio (a desktop assistant, an IDE) or streamable HTTP::

    clawvm --db agent.db mcp --session s1 [--task t1] [--agent a1]
    clawvm --db agent.db mcp --http [--host 127.0.0.1] [--port 8765] [--api-key SECRET] --session s1
    python -m clawvm.integrations.mcp_server --db agent.db --session s1      # the same, without click

``clawvm serve --mcp`` mounts it at ``/mcp`` of the REST server instead, behind the API keys and tenants
(:mod:`clawvm.server.mcp`).

Tools: ``tools/list`` publishes the agent tools' own JSON schemas (the low-level ``Server`` is used so the
schemas are ours), each with three more optional arguments, ``session_id``, ``task_id`` and ``agent_id``:
the scope of this one call, defaulting to the launch flags. Each tool has annotations (read-only,
destructive, idempotent: :class:`clawvm.agents.tools.Effect`) and an output schema, the reply
``{"ok": true, "result": ...}`` with the tool's result schema; ``tools/call`` runs the dispatcher in a worker
thread and answers with that reply as structured content and as JSON text. A tool error (invalid
arguments, an unknown id, a stale version, a write by a read-only key) is a result with ``isError: true``
and ``{"ok": false, "error": {...}}``, never a crash.

Resources: ``clawvm://memory/{memory_id}`` (one memory as JSON) and ``clawvm://session/{session_id}/context``
(the prompt-ready context of a session, as text; ``?query=...&budget_tokens=...`` optional);
``resources/list`` gives the launch session's context and its newest memories.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.to_thread
import mcp.types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from clawvm.agents.tool_schemas import CONTEXT_BUDGET
from clawvm.agents.toolcalls import bound_scope
from clawvm.agents.tools import AgentTools, ToolsHost, error_reply
from clawvm.core.errors import (
    AccessDeniedError,
    ClawVMError,
    NotFoundError,
    StateConflictError,
    ValidationError,
)
from clawvm.core.model import Status
from clawvm.core.version import __version__
from clawvm.harness import Harness
from clawvm.vm.context import short_id
from clawvm.write.commit import closed_harness
from clawvm.write.redaction import redaction_options

log = logging.getLogger("clawvm.integrations.mcp")

SCOPE_ARGUMENTS = ("session_id", "task_id", "agent_id")
MEMORY_TEMPLATE = "clawvm://memory/{memory_id}"
CONTEXT_TEMPLATE = "clawvm://session/{session_id}/context"
LISTED_MEMORIES = (
    50  # resources/list: the launch session's newest memories (recall or list_memories for more)
)
DEFAULT_CONTEXT_BUDGET = CONTEXT_BUDGET.default

INSTRUCTIONS = """\
ClawVM is your long-term memory. Before answering, call build_context (or recall_memory) with the question \
to see what is already known. Record what is worth keeping with record_memory: facts, decisions, tool \
outcomes, the user's preferences, one self-contained memory each. When something you remembered turns out \
wrong, read it (get_memory) and correct it with update_memory (pass expected_version) or delete it with \
forget_memory. Ids from a context ([a1b2c3d4 ...]) may be given as the 8-character short id. Every tool \
takes optional session_id, task_id and agent_id to work on another scope than the default one. Snapshot a \
session with checkpoint before risky steps; rollback returns to it."""


@dataclass(frozen=True)
class Access:
    """What one request may use: a harness (a tenant's), and whether it may change memory."""

    harness: ToolsHost
    may_write: bool = True


AccessOf = Callable[[ServerRequestContext[Any]], Access]


@dataclass(frozen=True)
class Defaults:
    """The launch scope: what a call gets for the scope arguments it leaves out."""

    session_id: str | None = None
    task_id: str | None = None
    agent_id: str | None = None


def build_server(
    target: AgentTools | ToolsHost | AccessOf,
    *,
    session_id: str | None = None,
    task_id: str | None = None,
    agent_id: str | None = None,
    name: str = "clawvm",
) -> Server[Any]:
    """An MCP server over ``target``: tools already bound to a harness and a scope (their scope is the
    default), a harness, or a function giving each request its :class:`Access` (the mounted HTTP server:
    the caller's tenant and role)."""
    if isinstance(target, AgentTools):
        bound = target
        defaults = Defaults(**{k: bound.scope.get(k) for k in SCOPE_ARGUMENTS})
        access_of: AccessOf = lambda _ctx: Access(bound.harness, bound.record_usage)  # noqa: E731
    else:
        defaults = Defaults(**bound_scope(session_id, task_id, agent_id))  # a blank one: refused here
        if isinstance(target, Harness) or hasattr(target, "record"):
            host: ToolsHost = target  # type: ignore[assignment]
            access_of = lambda _ctx: Access(host)  # noqa: E731
        else:
            access_of = target
    return _MemoryServer(access_of, defaults).server(name)


class _MemoryServer:
    """The handlers of one MCP server: tools, resources and templates over the access of each request."""

    def __init__(self, access_of: AccessOf, defaults: Defaults) -> None:
        self.access_of = access_of
        self.defaults = defaults
        self.catalog = AgentTools(_NoHarness())  # names, schemas and effects only: never dispatched

    def server(self, name: str) -> Server[Any]:
        return Server(
            name,
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_templates,
            on_read_resource=self.read_resource,
        )

    # ---- tools -----------------------------------------------------------------------------------------
    def tool(self, name: str) -> types.Tool:
        effect = self.catalog.effect(name)
        return types.Tool(
            name=name,
            description=self.catalog.description(name),
            input_schema=self.input_schema(name),
            output_schema=self.output_schema(name),
            annotations=types.ToolAnnotations(
                read_only_hint=effect.read_only,
                destructive_hint=effect.destructive,
                idempotent_hint=effect.idempotent,
                open_world_hint=False,
            ),
        )

    def input_schema(self, name: str) -> dict[str, Any]:
        """The tool's arguments plus the scope of the call (each defaulting to the launch scope)."""
        schema = self.catalog.parameters(name)
        properties = dict(schema.get("properties", {}))
        for arg in SCOPE_ARGUMENTS:
            if arg in properties:  # summarize_task's own task_id ("default: the current task")
                continue
            default = getattr(self.defaults, arg)
            what = arg.removesuffix("_id")
            properties[arg] = {
                "type": ["string", "null"],
                "minLength": 1,
                "description": f"The {what} of this call"
                + (f" (default: {default!r})." if default else " (default: none)."),
            }
        return {**schema, "properties": properties}

    def output_schema(self, name: str) -> dict[str, Any]:
        """A successful reply: ``{"ok": true, "result": <the tool's result>}`` (definitions at the root)."""
        result = self.catalog.result_schema(name)
        definitions = result.pop("$defs", None)
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {"ok": {"const": True}, "result": result},
            "required": ["ok", "result"],
            "additionalProperties": False,
        }
        if definitions:
            schema["$defs"] = definitions
        return schema

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[self.tool(n) for n in self.catalog.names])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        reply = self.refusal(ctx, params)
        if reply is None:
            access = self.access_of(ctx)
            arguments = dict(params.arguments or {})
            own = self.own_arguments(params.name)  # summarize_task's task_id is its own argument
            given = {k: None if k in own else arguments.pop(k, None) for k in SCOPE_ARGUMENTS}
            # a blank one from the model is none given: the default scope holds (the tools refuse a blank)
            scope = {k: _given(v) or getattr(self.defaults, k) for k, v in given.items()}
            tools = AgentTools(access.harness, record_usage=access.may_write, **scope)
            reply = await anyio.to_thread.run_sync(tools.dispatch, params.name, arguments)
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(reply))],
            structured_content=reply,
            is_error=not reply["ok"],
        )

    def own_arguments(self, name: str) -> set[str]:
        known = name in self.catalog.names
        return set(self.catalog.parameters(name).get("properties", {})) if known else set()

    def refusal(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> dict[str, Any] | None:
        """The error reply for a call that must not run: bad scope arguments, or a write by a reader."""
        for arg in SCOPE_ARGUMENTS:
            value = (params.arguments or {}).get(arg)
            # a blank one recorded memories with no scope that the same scope's reads then missed
            if value is not None and not (isinstance(value, str) and value.strip()):
                return error_reply(
                    "invalid_arguments",
                    f"{arg}: expected a string with text in it, or null",
                    field=arg,
                    fix=f"pass the {arg.replace('_', ' ')} (non-blank text), or leave it out",
                )
        writes = params.name in self.catalog.names and not self.catalog.effect(params.name).read_only
        if writes and not self.access_of(ctx).may_write:
            return error_reply(
                "forbidden",
                f"{params.name} changes memory and this API key may only read",
                fix="use a key with the agent or admin role",
            )
        return None

    # ---- resources -------------------------------------------------------------------------------------
    async def list_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name="memory",
                    uri_template=MEMORY_TEMPLATE,
                    description="One memory as JSON (id or 8-character short id): content, tags, version...",
                    mime_type="application/json",
                ),
                types.ResourceTemplate(
                    name="session-context",
                    uri_template=CONTEXT_TEMPLATE,
                    description="A session's prompt-ready context (pinned, working, relevant memories); "
                    f"add ?query=... to focus it and &budget_tokens=N (default {DEFAULT_CONTEXT_BUDGET})",
                    mime_type="text/plain",
                ),
            ]
        )

    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        session = self.defaults.session_id
        if not session:
            return types.ListResourcesResult(resources=[])
        host = self.access_of(ctx).harness
        scope = {k: getattr(self.defaults, k) for k in SCOPE_ARGUMENTS if getattr(self.defaults, k)}
        try:
            newest = await anyio.to_thread.run_sync(lambda: host.list(limit=LISTED_MEMORIES, **scope))
        except StateConflictError as exc:  # its harness closed: say so, not "internal error"
            raise MCPError(types.INTERNAL_ERROR, f"listing resources failed: {exc}") from None
        context = types.Resource(
            name=f"context of {session}",
            uri=CONTEXT_TEMPLATE.format(session_id=session),
            mime_type="text/plain",
            description="This session's prompt-ready context",
        )
        memories = [
            types.Resource(
                name=f"{m.kind.value} {short_id(m.id)}",
                uri=MEMORY_TEMPLATE.format(memory_id=m.id),
                mime_type="application/json",
                description=m.content[:120],
            )
            for m in newest
        ]
        return types.ListResourcesResult(resources=[context, *memories])

    async def read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        access = self.access_of(ctx)
        try:
            mime, text = await anyio.to_thread.run_sync(_read, access, uri)
        except (ValidationError, NotFoundError, AccessDeniedError) as exc:  # the caller's to fix
            raise MCPError(types.INVALID_PARAMS, f"{uri}: {exc}") from None
        except ClawVMError as exc:  # the service's: the message stays in the log, as a tool call's does
            log.error("reading %s failed", uri, exc_info=exc)
            raise MCPError(
                types.INTERNAL_ERROR,
                f"{uri}: {type(exc).__name__}: reading it failed; the log has the details",
            ) from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type=mime, text=text)]
        )


def _read(access: Access, uri: str) -> tuple[str, str]:
    """``(mime type, text)`` of a resource URI (NotFoundError / ValidationError otherwise)."""
    parts = urlsplit(uri)
    segments = [s for s in parts.path.split("/") if s]
    if parts.scheme != "clawvm":
        raise ValidationError("uri", f"is {uri!r}", "use a clawvm:// URI of resources/templates/list")
    if parts.netloc == "memory" and len(segments) == 1:
        # no scope: any memory of the tenant, by id or short id; the harness's own records stay hidden
        reply = AgentTools(access.harness).dispatch("get_memory", {"memory_id": segments[0]})
        if not reply["ok"] and reply["error"].get("field") == "harness":  # closed: not "not found"
            raise closed_harness()
        if not reply["ok"] or reply["result"]["status"] == Status.INTERNAL.value:
            raise NotFoundError("memory", segments[0])
        return "application/json", json.dumps(reply["result"])
    if parts.netloc == "session" and len(segments) == 2 and segments[1] == "context":
        query = parse_qs(parts.query)
        budget = query.get("budget_tokens", [str(DEFAULT_CONTEXT_BUDGET)])[0]
        ctx = access.harness.context(
            query.get("query", [""])[0],
            budget_tokens=CONTEXT_BUDGET.check("budget_tokens", budget),
            session_id=segments[0],
            read_only=not access.may_write,
        )
        return "text/plain", ctx.text
    raise NotFoundError("resource", uri, field="uri")


class _NoHarness:
    """Stands in for a harness where AgentTools is only asked for its catalog (names, schemas, effects)."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"the tool catalog has no harness ({name})")


# ---- transports --------------------------------------------------------------------------------------------
def _given(value: Any) -> Any:
    """A scope argument as given, or None for a blank one."""
    return None if isinstance(value, str) and not value.strip() else value


async def serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_app(server: Server[Any], *, host: str = "127.0.0.1", api_key: str | None = None) -> ASGIApp:
    """The streamable HTTP app of ``server`` (endpoint ``/mcp``); with ``api_key``, a request without
    ``Authorization: Bearer <api_key>`` (or ``X-API-Key``) is answered 401. On a loopback host the SDK's
    DNS-rebinding protection is on (Host and Origin must be local)."""
    app = server.streamable_http_app(host=host)
    return app if api_key is None else KeyCheck(app, api_key)


class KeyCheck:
    """ASGI middleware: one static key, compared in constant time (``clawvm mcp --http --api-key``)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValidationError("api_key", "is empty", "pass a secret, or no --api-key at all")
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            bearer = headers.get("authorization", "")
            given = bearer[7:] if bearer.lower().startswith("bearer ") else headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), self.api_key):
                error = {
                    "code": "unauthorized",
                    "message": "missing or wrong API key",
                    "fix": "send 'Authorization: Bearer <key>' with the key given to --api-key",
                }
                response = JSONResponse(
                    {"error": error}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def serve_http(server: Server[Any], host: str, port: int, api_key: str | None = None) -> None:
    """Serve until stopped. uvicorn's startup line says where it listens (the port it took, for port 0);
    the endpoint is ``/mcp`` there. No line per request."""
    app = http_app(server, host=host, api_key=api_key)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


def run(
    db: str,
    *,
    session_id: str | None = None,
    task_id: str | None = None,
    agent_id: str | None = None,
    tenant: str = "default",
    embedder: str | None = "default",
    redact: bool = True,
    keep_originals: bool = False,
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = 8765,
    api_key: str | None = None,
) -> None:
    """Open the store and serve until the client leaves (stdio) or the process is stopped (HTTP). A blank
    scope is refused before the store is opened (a path that did not exist was created first)."""
    bound_scope(session_id, task_id, agent_id)
    options = redaction_options(redact=redact, keep_originals=keep_originals)
    with Harness.open(db, embedder=embedder, tenant=tenant, **options) as harness:
        server = build_server(harness, session_id=session_id, task_id=task_id, agent_id=agent_id)
        if http:
            serve_http(server, host, port, api_key)
        else:
            anyio.run(serve_stdio, server)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ClawVM's memory as an MCP server (stdio or HTTP).")
    parser.add_argument("--db", default="clawvm.db", help="store: a path, sqlite:///path or memory://")
    parser.add_argument("--session", help="default session of the tools (a call may pass session_id)")
    parser.add_argument("--task", help="default task id")
    parser.add_argument("--agent", help="default agent id")
    parser.add_argument("--tenant", default="default")
    parser.add_argument("--embedder", default="default", choices=["default", "none"])
    parser.add_argument(
        "--no-redact",
        dest="redact",
        action="store_false",
        help="store personal data and secrets as written (default: redacted, like clawvm serve)",
    )
    parser.add_argument(
        "--keep-originals",
        action="store_true",
        help="keep each original sealed with the data key (CLAWVM_DATA_KEY or CLAWVM_DATA_KEY_FILE)",
    )
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--api-key", help="with --http: the Bearer key every request must send")
    args = parser.parse_args(argv)
    for what, value in (("session", args.session), ("task", args.task), ("agent", args.agent)):
        if value is not None and not value.strip():  # as clawvm mcp says it: one line, before any store
            flag = f"--{what}"
            fix = f"name the {what}, or leave {flag} out (is a variable unset?)"
            parser.exit(2, f"error: {ValidationError(flag, f'is blank ({value!r})', fix)}\n")
    run(
        args.db,
        session_id=args.session,
        task_id=args.task,
        agent_id=args.agent,
        tenant=args.tenant,
        embedder=None if args.embedder == "none" else "default",
        redact=args.redact,
        keep_originals=args.keep_originals,
        http=args.http,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
    )


if __name__ == "__main__":
    main()
