"""Framework integrations, each against the real library: LangChain callbacks (MCP: tests/test_mcp.py, the
LangGraph store: tests/test_langgraph.py)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from clawvm import Harness, State
from clawvm.integrations.langchain import ClawVMCallbackHandler


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
        {"text": "", "tool_calls": [{"name": "weather", "args": {"city": "Oslo"}, "id": "c1"}]},
    ]
    assert thoughts[0].cost.tokens == 8 and thoughts[0].state is State.SUCCESS
    (error,) = harness.list(kind="error", session_id="lc")
    assert error.state is State.ERROR and error.content.startswith("LLM call failed: StopIteration")
