"""Framework integrations, each against the real library: LangChain callbacks and MCP (the LangGraph store
is in test_langgraph.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment

import clawvm
from clawvm import Harness, Kind, State
from clawvm.agents.tools import AgentTools
from clawvm.integrations.langchain import ClawVMCallbackHandler
from engines import harness_target


# ---- LangChain ------------------------------------------------------------------------------------------
@tool
def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


@tool
def flaky_quote(symbol: str) -> str:
    """A stock quote from an API that times out."""
    raise TimeoutError(f"quote API timed out for {symbol}")


def test_langchain_handler_records_tool_runs(harness: Harness) -> None:
    handler = ClawVMCallbackHandler(harness, session_id="lc", task_id="t1")
    config: Any = {"callbacks": [handler]}
    assert weather.invoke({"city": "Oslo"}, config=config) == "sunny in Oslo"
    with pytest.raises(TimeoutError):
        flaky_quote.invoke({"symbol": "ACME"}, config=config)
    # invoked with a model's tool call, the tool returns a ToolMessage: its content is the result
    weather.invoke(
        {"name": "weather", "args": {"city": "Rome"}, "id": "call_1", "type": "tool_call"}, config=config
    )
    calls = sorted(harness.list(kind="tool_call", session_id="lc"), key=lambda m: m.id)
    assert [(c.tool_name, c.content_json()["args"]) for c in calls] == [
        ("weather", {"city": "Oslo"}),
        ("flaky_quote", {"symbol": "ACME"}),
        ("weather", {"city": "Rome"}),
    ]
    results = [harness.list(parent_id=c.id, kind="tool_result")[0] for c in calls]
    assert [(r.state, r.content) for r in results] == [
        (State.SUCCESS, "sunny in Oslo"),
        (State.ERROR, "TimeoutError: quote API timed out for ACME"),
        (State.SUCCESS, "sunny in Rome"),
    ]
    assert [c.state for c in calls] == [State.SUCCESS, State.ERROR, State.SUCCESS]
    assert results[1].metadata["tool_result"]["error"]["timeout"] is True and results[1].task_id == "t1"
    assert harness.tool_reliability("flaky_quote")["flaky_quote"].timeouts == 1  # reliability sees them


def test_langchain_handler_records_llm_outputs(harness: Harness) -> None:
    handler = ClawVMCallbackHandler(harness, session_id="lc")
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    content="It is sunny.",
                    usage_metadata={"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
                ),
                AIMessage(content="", tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "c1"}]),
            ]
        )
    )
    model.invoke("weather?", config={"callbacks": [handler]})
    model.invoke("and now?", config={"callbacks": [handler]})
    with pytest.raises(StopIteration):  # the fake model's script has run out: an LLM error
        model.invoke("again?", config={"callbacks": [handler]})
    thoughts = sorted(harness.list(kind="llm_thought", session_id="lc"), key=lambda m: m.id)
    assert [t.content_json() for t in thoughts] == [
        "It is sunny.",
        {"text": "", "tool_calls": [{"name": "weather", "args": {"city": "Oslo"}}]},
    ]
    assert thoughts[0].cost.tokens == 8 and thoughts[0].state is State.SUCCESS
    (error,) = harness.list(kind="error", session_id="lc")
    assert error.state is State.ERROR and error.content.startswith("LLM call failed: StopIteration")


# ---- MCP ----------------------------------------------------------------------------------------------
@pytest.mark.engines("sqlite", "postgres")
def test_mcp_server_over_stdio_with_the_sdk_client(engine_name: str, tmp_path: Path) -> None:
    target = harness_target(engine_name, tmp_path, "mcp.db")
    with Harness.open(target, embedder=None):
        pass  # create the store first, as a deployment would
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "clawvm.integrations.mcp_server",
            "--db",
            target,
            "--session",
            "s-mcp",
            "--embedder",
            "none",
        ],
        cwd=str(tmp_path),
        # the server runs the clawvm under test (a worktree's), not whichever the interpreter finds first
        env={**get_default_environment(), "PYTHONPATH": str(Path(clawvm.__file__).parents[1])},
    )

    async def talk() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(server, read_timeout_seconds=60) as client:
            out["tools"] = await client.list_tools()
            out["record"] = await client.call_tool(
                "record_memory", {"content": "the staging DB password was rotated", "kind": "knowledge"}
            )
            out["recall"] = await client.call_tool("recall_memory", {"query": "staging password rotated"})
            out["bad"] = await client.call_tool("recall_memory", {"query": "x", "k": "many"})
            out["unknown"] = await client.call_tool("drop_tables", {})
        return out

    out = asyncio.run(talk())
    with Harness.open("memory://", embedder=None) as h:
        expected = AgentTools(h)
        listed = {t.name: t for t in out["tools"].tools}
        assert list(listed) == expected.names
        for name, t in listed.items():
            assert t.input_schema == expected.parameters(name) and t.description == expected.description(name)
    record = out["record"]
    assert record.is_error is False and record.structured_content["ok"] is True
    assert json.loads(record.content[0].text) == record.structured_content
    memory_id = record.structured_content["result"]["id"]
    hits = out["recall"].structured_content["result"]["memories"]
    assert hits[0]["id"] == memory_id
    assert (
        out["bad"].is_error is True and out["bad"].structured_content["error"]["type"] == "invalid_arguments"
    )
    assert (
        out["unknown"].is_error is True
        and out["unknown"].structured_content["error"]["type"] == "unknown_tool"
    )
    with Harness.open(target, embedder=None) as h:  # the server wrote into the store, in the bound session
        m = h.get(memory_id)
        assert (m.session_id, m.kind, m.content) == (
            "s-mcp",
            Kind.KNOWLEDGE,
            "the staging DB password was rotated",
        )
