"""Framework integrations, each against the real library: LangChain callbacks, a LangGraph store (MCP:
tests/test_mcp.py)."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import InvalidNamespaceError
from langgraph.store.memory import InMemoryStore

from clawvm import Harness, Kind, State
from clawvm.integrations import langgraph as langgraph_adapter
from clawvm.integrations.langchain import ClawVMCallbackHandler
from clawvm.integrations.langgraph import ClawVMStore


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


# ---- LangGraph ------------------------------------------------------------------------------------------
def test_langgraph_store_through_langgraphs_api(harness: Harness) -> None:
    store = ClawVMStore(harness)
    store.put(("users", "alice", "prefs"), "food", {"likes": "pizza", "spice": 3})
    store.put(("users", "alice", "prefs"), "drink", {"likes": "tea", "spice": 0})
    store.put(("users", "bob", "prefs"), "food", {"likes": "sushi", "spice": 5})
    store.put(("docs",), "runbook", {"text": "restart the payments worker when the queue backs up"})
    item = store.get(("users", "alice", "prefs"), "food")
    assert item is not None and item.value == {"likes": "pizza", "spice": 3} and item.key == "food"
    assert item.namespace == ("users", "alice", "prefs")
    assert store.get(("users", "alice"), "food") is None  # a namespace is exact for get
    # overwrite: same memory, new version, updated_at moves, created_at stays
    memory_id = harness.list(tags=["langgraph"], limit=10)[-1].id
    store.put(("users", "alice", "prefs"), "food", {"likes": "pasta", "spice": 2})
    again = store.get(("users", "alice", "prefs"), "food")
    assert again is not None and again.value["likes"] == "pasta" and again.created_at == item.created_at
    assert again.updated_at >= item.updated_at and harness.count(tags=["langgraph"]) == 4
    assert harness.get(memory_id).kind is Kind.KNOWLEDGE
    # search: namespace prefix as scope, filters, pagination, natural-language query
    keys = lambda items: sorted((i.namespace[1] if len(i.namespace) > 1 else "", i.key) for i in items)  # noqa: E731
    assert keys(store.search(("users",))) == [("alice", "drink"), ("alice", "food"), ("bob", "food")]
    assert keys(store.search(("users", "alice"))) == [("alice", "drink"), ("alice", "food")]
    assert keys(store.search(("users",), filter={"spice": {"$gte": 2}})) == [
        ("alice", "food"),
        ("bob", "food"),
    ]
    assert keys(store.search(("users",), filter={"likes": "tea"})) == [("alice", "drink")]
    assert keys(store.search(("users",), filter={"spice": {"$ne": 5, "$lt": 3}})) == [
        ("alice", "drink"),
        ("alice", "food"),
    ]
    assert len(store.search((), limit=2)) == 2 and len(store.search((), limit=10, offset=3)) == 1
    (hit, *_) = store.search((), query="payments queue backed up, what to restart?")
    assert hit.key == "runbook" and hit.score is not None
    # namespaces
    assert store.list_namespaces() == [("docs",), ("users", "alice", "prefs"), ("users", "bob", "prefs")]
    assert store.list_namespaces(prefix=("users",), max_depth=2) == [("users", "alice"), ("users", "bob")]
    assert store.list_namespaces(suffix=("*", "prefs")) == [
        ("users", "alice", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(prefix=("users", "*", "prefs"), limit=1, offset=1) == [
        ("users", "bob", "prefs")
    ]
    # delete
    store.delete(("users", "bob", "prefs"), "food")
    assert store.get(("users", "bob", "prefs"), "food") is None
    assert ("users", "bob", "prefs") not in store.list_namespaces()
    # LangGraph's own validation still applies
    with pytest.raises(InvalidNamespaceError):
        store.put(("users", "a.b"), "k", {"x": 1})
    with pytest.raises(NotImplementedError):
        store.put(("users",), "k", {"x": 1}, ttl=5)


def test_langgraph_store_async_api(harness: Harness) -> None:
    store = ClawVMStore(harness)

    async def run() -> None:
        await store.aput(("notes",), "n1", {"text": "deploy froze at 14:02"})
        item = await store.aget(("notes",), "n1")
        assert item is not None and item.value["text"] == "deploy froze at 14:02"
        assert [i.key for i in await store.asearch(("notes",), query="deploy froze")] == ["n1"]
        assert await store.alist_namespaces() == [("notes",)]
        await store.adelete(("notes",), "n1")
        assert await store.aget(("notes",), "n1") is None

    asyncio.run(run())


def test_langgraph_namespaces_are_listed_page_by_page_in_langgraphs_order(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(langgraph_adapter, "PAGE", 3)  # many keyset pages over a few namespaces
    ours, reference = ClawVMStore(harness), InMemoryStore()
    # labels whose order as tuples differs from their order as joined strings ("a-b" < "a", "b" as text)
    names = [("a",), ("a", "b"), ("a-b",), ("a", "b", "c"), ("é",), ("z",), ("a", "zz"), ("b", "a")]
    long_label = ("long", "x" * 150)  # too long to spell out in a tag: read back from its item
    for i, ns in enumerate([*names, long_label]):
        for store in (ours, reference):
            store.put(ns, f"k{i}", {"n": i})
            store.put(ns, f"j{i}", {"n": i})
    assert ours.list_namespaces(limit=100) == reference.list_namespaces(limit=100)
    for offset in range(0, 10, 2):
        page = {"limit": 2, "offset": offset}
        assert ours.list_namespaces(**page) == reference.list_namespaces(**page)
    for depth in (1, 2):
        assert ours.list_namespaces(max_depth=depth) == reference.list_namespaces(max_depth=depth)
    assert ours.list_namespaces(prefix=("a",)) == reference.list_namespaces(prefix=("a",))
    assert ours.list_namespaces(prefix=("long",)) == [long_label]
    assert ours.list_namespaces(suffix=("b",)) == reference.list_namespaces(suffix=("b",))
    # search walks the namespace newest first in pages: an offset page is a slice of the whole
    everything = [i.key for i in ours.search(("a",), limit=100)]
    assert sorted(everything) == sorted(i.key for i in reference.search(("a",), limit=100))
    assert [i.key for i in ours.search(("a",), limit=3, offset=2)] == everything[2:5]


def test_langgraph_items_from_before_namespace_tags_are_listed_once_tagged(harness: Harness) -> None:
    store = ClawVMStore(harness)
    store.put(("old",), "k", {"x": 1})
    store.put(("new",), "k", {"x": 2})
    (old,) = harness.list(tags=[langgraph_adapter._item_tag(("old",), "k")])
    harness.update(old.id, tags=[t for t in old.tags if not t.startswith(langgraph_adapter.PATH_TAG)])
    assert store.list_namespaces() == [("new",)]  # written as an earlier version would have
    assert store.tag_namespaces() == 1 and store.tag_namespaces() == 0
    assert store.list_namespaces() == [("new",), ("old",)]


class Chat(TypedDict):
    user: str
    said: str
    remembered: str


def test_a_langgraph_graph_keeps_memory_across_runs_in_clawvm(harness: Harness) -> None:
    def remember(state: Chat, runtime: Runtime[None]) -> dict[str, str]:
        assert runtime.store is not None
        namespace = ("memories", state["user"])
        before = [i.value["fact"] for i in runtime.store.search(namespace)]
        if state["said"]:
            runtime.store.put(namespace, f"m{len(before)}", {"fact": state["said"]})
        return {"remembered": "; ".join(before)}

    graph = StateGraph(Chat)
    graph.add_node("remember", remember)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", END)
    app = graph.compile(store=ClawVMStore(harness))
    app.invoke({"user": "alice", "said": "I am allergic to peanuts", "remembered": ""})
    out = app.invoke({"user": "alice", "said": "", "remembered": ""})
    assert out["remembered"] == "I am allergic to peanuts"
    assert app.invoke({"user": "bob", "said": "", "remembered": ""})["remembered"] == ""
    (m,) = harness.list(tags=["langgraph"])
    assert m.content_json() == {"fact": "I am allergic to peanuts"}


labels = st.sampled_from(["a", "b", "c"])
namespaces = st.lists(labels, min_size=1, max_size=3).map(tuple)
values = st.fixed_dictionaries({"n": st.integers(0, 3), "tag": st.sampled_from(["x", "y"])})
ops = st.lists(
    st.tuples(st.sampled_from(["put", "put", "delete"]), namespaces, st.sampled_from(["k1", "k2"]), values),
    max_size=15,
)
filters = st.one_of(
    st.none(),
    st.fixed_dictionaries({"tag": st.sampled_from(["x", "y"])}),
    st.fixed_dictionaries({"n": st.fixed_dictionaries({"$gte": st.integers(0, 3)})}),
    st.fixed_dictionaries({"n": st.integers(0, 3), "tag": st.sampled_from(["x", "y"])}),
)


@settings(max_examples=30, deadline=None)
@given(ops, st.lists(labels, max_size=2).map(tuple), filters, st.one_of(st.none(), st.integers(1, 3)))
def test_langgraph_store_agrees_with_langgraphs_in_memory_store(
    plan: list[tuple[str, tuple[str, ...], str, dict[str, Any]]],
    prefix: tuple[str, ...],
    condition: dict[str, Any] | None,
    depth: int | None,
) -> None:
    reference = InMemoryStore()
    with Harness.open("memory://", embedder=None) as h:
        ours = ClawVMStore(h)
        for action, ns, key, value in plan:
            for store in (reference, ours):
                if action == "put":
                    store.put(ns, key, value)
                else:
                    store.delete(ns, key)
        for _, ns, key, _ in plan:
            mine, theirs = ours.get(ns, key), reference.get(ns, key)
            assert (mine and mine.value) == (theirs and theirs.value)
        found = lambda s: sorted((i.namespace, i.key) for i in s.search(prefix, filter=condition, limit=100))  # noqa: E731
        assert found(ours) == found(reference)
        # InMemoryStore also lists namespaces that only ever saw a get or a delete: compare with a fresh
        # one holding just the live items
        live = InMemoryStore()
        for i in reference.search((), limit=1000):
            live.put(i.namespace, i.key, i.value)
        assert ours.list_namespaces(max_depth=depth) == live.list_namespaces(max_depth=depth)
        if prefix:
            assert ours.list_namespaces(prefix=prefix) == live.list_namespaces(prefix=prefix)
            assert ours.list_namespaces(suffix=prefix) == live.list_namespaces(suffix=prefix)
