"""MCP: a server (official ``mcp`` SDK, 2.x) exposing ClawVM's agent tools (:mod:`clawvm.agents.tools`).

Run it over stdio for an MCP client (Claude Desktop, an IDE, ``mcp.Client``)::

    python -m clawvm.integrations.mcp_server --db agent.db --session s1 [--task t1] [--agent a1]

``tools/list`` publishes exactly the agent tools' JSON schemas (the low-level ``Server`` is used so the
schemas are ours, not re-derived from Python signatures); ``tools/call`` runs the dispatcher in a worker
thread and answers with the reply as JSON text and as structured content. A structured tool error
(invalid arguments, unknown id...) comes back as a result with ``isError: true``, never as a crash.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from clawvm.agents.tools import AgentTools
from clawvm.core.version import __version__
from clawvm.harness import Harness
from clawvm.write.redaction import redaction_options


def build_server(tools: AgentTools, name: str = "clawvm") -> Server[Any]:
    """An MCP server whose tools are ``tools`` (already bound to a harness and a scope)."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=n, description=tools.description(n), input_schema=tools.parameters(n))
                for n in tools.names
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        reply = await anyio.to_thread.run_sync(tools.dispatch, params.name, params.arguments or {})
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(reply))],
            structured_content=reply,
            is_error=not reply["ok"],
        )

    return Server(name, version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ClawVM agent tools as an MCP server over stdio.")
    parser.add_argument("--db", default="clawvm.db", help="store: a path, sqlite:///path or memory://")
    parser.add_argument("--session", help="session the tools work on (checkpoint/rollback need one)")
    parser.add_argument("--task", help="task id (summarize_task's default)")
    parser.add_argument("--agent", help="agent id")
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
    args = parser.parse_args(argv)
    options = redaction_options(redact=args.redact, keep_originals=args.keep_originals)
    with Harness.open(args.db, embedder=args.embedder, tenant=args.tenant, **options) as harness:
        tools = AgentTools(harness, session_id=args.session, task_id=args.task, agent_id=args.agent)
        anyio.run(serve_stdio, build_server(tools))


if __name__ == "__main__":
    main()
