"""LangChain, with langchain-core's own runnables, tools and fake models: handled tool errors, the links from
a tool call to the model turn that asked for it, opt-in prompts, a retriever over recall in a chain, and a
chat message history over a session under RunnableWithMessageHistory."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel, ParrotFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    HumanMessageChunk,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import StructuredTool, ToolException, tool

from clawvm import Harness, Kind, State, ValidationError
from clawvm.integrations.langchain import (
    HANDLED_ERROR,
    ClawVMCallbackHandler,
    ClawVMChatMessageHistory,
    ClawVMRetriever,
)
from clawvm.store.kinds import EventKind


def _declined_charge(amount: int) -> str:
    """Charge a card."""
    raise ToolException(f"card declined for {amount} EUR")


def _refund(amount: int) -> str:
    """Refund an amount."""
    return f"refunded {amount}"


# LangChain catches these tools' errors itself and returns them to the model as the tool's output
charge = StructuredTool.from_function(_declined_charge, name="charge", handle_tool_error=True)
refund = StructuredTool.from_function(
    _refund, name="refund", handle_validation_error="refund needs an integer amount"
)


@tool
def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def tool_call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def scripted(*replies: AIMessage) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter(replies))


@pytest.mark.engines("sqlite")
def test_errors_langchain_handles_are_recorded_as_errors(harness: Harness) -> None:
    handler = ClawVMCallbackHandler(harness, session_id="pay")
    config: Any = {"callbacks": [handler]}
    declined = charge.invoke(tool_call("charge", {"amount": 40}, "c1"), config=config)
    invalid = refund.invoke(tool_call("refund", {"amount": "lots"}, "c2"), config=config)
    assert isinstance(declined, ToolMessage) and declined.status == "error"  # LangChain's own verdict
    assert isinstance(invalid, ToolMessage) and invalid.status == "error"
    calls = sorted(harness.list(kind="tool_call", session_id="pay"), key=lambda m: m.id)
    results = [harness.list(parent_id=c.id, kind="tool_result")[0] for c in calls]
    assert [(r.tool_name, r.state, r.content) for r in results] == [
        ("charge", State.ERROR, f"{HANDLED_ERROR}: card declined for 40 EUR"),
        ("refund", State.ERROR, f"{HANDLED_ERROR}: refund needs an integer amount"),
    ]
    assert [c.state for c in calls] == [State.ERROR, State.ERROR]
    error = results[0].metadata["tool_result"]["error"]
    assert error["handled"] is True and error["timeout"] is False
    # reliability counts them: three handled failures in a row make the tool unreliable
    charge.invoke(tool_call("charge", {"amount": 41}, "c3"), config=config)
    charge.invoke(tool_call("charge", {"amount": 42}, "c4"), config=config)
    stats = harness.tool_reliability("charge")["charge"]
    assert (stats.successes, stats.errors, stats.unreliable) == (0, 3, True)
    # run asynchronously (as async agents run tools) the handled error is an error too
    asyncio.run(refund.ainvoke(tool_call("refund", {"amount": "x"}, "c6"), config=config))
    assert harness.tool_reliability("refund")["refund"].errors == 2
    # a call that works stays a success, and a ToolMessage's content is its result
    weather.invoke(tool_call("weather", {"city": "Oslo"}, "c5"), config=config)
    (ok,) = harness.list(kind="tool_result", tool_name="weather")
    assert (ok.state, ok.content) == (State.SUCCESS, "sunny in Oslo")


def test_a_tool_result_reaches_the_run_ids_through_its_call() -> None:
    """As documented: metadata.langchain is on the tool_call; its tool_result keeps metadata.tool_result
    (the docs said every record kept metadata.langchain) and names the call as parent and call_id."""
    with Harness.open("memory://", embedder=None) as h:
        weather.invoke(
            tool_call("weather", {"city": "Oslo"}, "w1"),
            config={"callbacks": [ClawVMCallbackHandler(h, session_id="s")]},
        )
        (call,) = h.list(kind="tool_call")
        (result,) = h.list(kind="tool_result")
        assert call.metadata["langchain"]["tool_call_id"] == "w1" and call.metadata["langchain"]["run_id"]
        assert result.parent_id == call.id and result.metadata["tool_result"]["call_id"] == call.id
        assert set(result.metadata) == {"tool_result"}


@pytest.mark.engines("sqlite")
def test_each_tool_call_links_to_the_model_turn_that_asked_for_it(harness: Harness) -> None:
    handler = ClawVMCallbackHandler(harness, session_id="agent")
    config: Any = {"callbacks": [handler]}
    tools = {"charge": charge, "weather": weather}
    model = scripted(
        AIMessage(content="", tool_calls=[tool_call("weather", {"city": "Oslo"}, "t1")]),
        AIMessage(
            content="Two more.",
            tool_calls=[
                tool_call("weather", {"city": "Rome"}, "t2"),
                tool_call("charge", {"amount": 5}, "t3"),
            ],
        ),
    )
    # an agent loop: each model turn's tool calls run with their ids, as agents run them
    messages: list[BaseMessage] = [HumanMessage("Weather in Oslo and Rome, then pay")]
    for _ in range(2):
        turn = model.invoke(messages, config=config)
        messages.append(turn)
        messages += [tools[tc["name"]].invoke(tc, config=config) for tc in turn.tool_calls]
    thoughts = sorted(harness.list(kind="llm_thought", session_id="agent"), key=lambda m: m.id)
    calls = {c.metadata["langchain"]["tool_call_id"]: c for c in harness.list(kind="tool_call")}
    assert {i: c.parent_id for i, c in calls.items()} == {
        "t1": thoughts[0].id,
        "t2": thoughts[1].id,
        "t3": thoughts[1].id,
    }
    asked_charge = {"name": "charge", "args": {"amount": 5}, "id": "t3"}
    assert thoughts[1].content_json()["tool_calls"][1] == asked_charge
    assert calls["t3"].state is State.ERROR  # the handled decline, on the call the model asked for

    # a chain that hands the model's arguments to the tool (no tool call id): linked through the parent run
    chain = (
        scripted(AIMessage(content="", tool_calls=[tool_call("weather", {"city": "Lima"}, "t9")]))
        | RunnableLambda(lambda turn: turn.tool_calls[0]["args"])
        | weather
    )
    assert chain.invoke("weather in Lima?", config=config) == "sunny in Lima"
    (lima,) = [c for c in harness.list(kind="tool_call") if c.content_json()["args"] == {"city": "Lima"}]
    (asked,) = [t for t in harness.list(kind="llm_thought") if "Lima" in t.content]
    assert lima.parent_id == asked.id and "tool_call_id" not in lima.metadata["langchain"]
    run = asked.metadata["langchain"]["parent_run_id"]
    assert run is not None and lima.metadata["langchain"]["parent_run_id"] == run


@pytest.mark.engines("sqlite")
def test_prompts_are_recorded_only_when_asked(harness: Harness) -> None:
    prompt = ChatPromptTemplate.from_messages([("system", "You are terse."), ("human", "{q}")])
    for session, opted_in in (("quiet", False), ("traced", True)):
        handler = ClawVMCallbackHandler(harness, session_id=session, record_prompts=opted_in)
        chain = prompt | scripted(AIMessage("Sunny."))
        chain.invoke({"q": "Weather in Oslo?"}, config={"callbacks": [handler]})
    (quiet,) = harness.list(kind="llm_thought", session_id="quiet")
    (traced,) = harness.list(kind="llm_thought", session_id="traced")
    assert "prompt" not in quiet.metadata["langchain"]
    assert traced.metadata["langchain"]["prompt"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "human", "content": "Weather in Oslo?"},
    ]
    assert harness.count(status="any") == 2  # a prompt is metadata of its turn, never a memory of its own


@pytest.mark.engines("sqlite")
def test_retriever_feeds_recall_into_a_chain(harness: Harness) -> None:
    eu = harness.record("The EU payments host answers in 80 ms", kind="observation", session_id="ops")
    harness.record("The US payments host timed out twice", kind="error", session_id="ops")
    harness.record("Priya prefers Lisbon local times", kind="note", session_id="other")
    retriever = ClawVMRetriever(harness=harness, k=2, filters={"session_id": "ops"})

    def cite(docs: list[Document]) -> str:
        return "\n".join(f"[{d.metadata['id'][-8:]}] {d.page_content}" for d in docs)

    chain = retriever | RunnableLambda(cite) | ParrotFakeChatModel()  # the fake model says its prompt back
    answer = chain.invoke("How fast does the EU host answer?")
    assert answer.content.splitlines()[0] == f"[{eu.id[-8:]}] The EU payments host answers in 80 ms"
    docs = retriever.invoke("How fast does the EU host answer?")
    assert [d.metadata["kind"] for d in docs] == ["observation", "error"]  # the session's two, best first
    assert docs[0].metadata["score"] > docs[1].metadata["score"] > 0
    assert {d.metadata["tier"] for d in docs} <= {"working", "short_term", "long_term", "archive"}
    assert docs[0].id == eu.id and docs[0].metadata["session_id"] == "ops"
    assert retriever.invoke("Lisbon")[0].metadata["kind"] != "note"  # another session stays out


# deprecated in favour of LangGraph's persistence, and still how LangChain chains use a message history
@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_chat_history_keeps_a_session_in_order_and_clear_forgets_it(harness: Harness) -> None:
    seen: list[list[BaseMessage]] = []  # what the model was given, turn by turn

    def given(prompt_value: Any) -> Any:
        seen.append(prompt_value.to_messages())
        return prompt_value

    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are an ops assistant."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    model = scripted(AIMessage("Use the EU host."), AIMessage("Still the EU host."), AIMessage("Hello."))
    chat = RunnableWithMessageHistory(
        prompt | RunnableLambda(given) | model,
        lambda session_id: ClawVMChatMessageHistory(harness, session_id),
        input_messages_key="question",
        history_messages_key="history",
    )
    ask = lambda q, s: chat.invoke({"question": q}, config={"configurable": {"session_id": s}})  # noqa: E731
    ask("Which payments host?", "chat-1")
    ask("Are you sure?", "chat-1")
    ask("Hi", "chat-2")
    # the second turn saw the first one, from the store
    assert [m.content for m in seen[1]] == [
        "You are an ops assistant.",
        "Which payments host?",
        "Use the EU host.",
        "Are you sure?",
    ]
    history = ClawVMChatMessageHistory(harness, "chat-1")
    assert [(m.type, m.content) for m in history.messages] == [
        ("human", "Which payments host?"),
        ("ai", "Use the EU host."),
        ("human", "Are you sure?"),
        ("ai", "Still the EU host."),
    ]
    stored = list(harness.iter_all(session_id="chat-1"))
    assert [m.kind for m in stored] == [Kind.USER_INPUT, Kind.LLM_THOUGHT] * 2  # memories like any other
    assert harness.recall("payments host", k=1, session_id="chat-1")[0].memory.session_id == "chat-1"
    # messages added directly keep their type and order too
    history.add_messages([SystemMessage("Be brief."), HumanMessage("Thanks")])
    assert [m.type for m in history.messages][-2:] == ["system", "human"]
    # clear forgets this session's messages through the harness, and nothing else
    note = harness.record("Runbook: restart the worker", kind="note", session_id="chat-1")
    history.clear()
    assert history.messages == [] and harness.count(session_id="chat-1", tags=["chat"], status="any") == 0
    assert [m.id for m in harness.iter_all(session_id="chat-1")] == [note.id]
    assert [m.content for m in ClawVMChatMessageHistory(harness, "chat-2").messages] == ["Hi", "Hello."]
    forgotten = [e for e in harness.events(limit=1000) if e.kind is EventKind.FORGET]
    assert len(forgotten) == 6


def test_a_streamed_reply_is_an_ai_turn_and_a_history_needs_its_session(harness: Harness) -> None:
    """RunnableWithMessageHistory.stream() stores the reply as an AIMessageChunk: it was stored as an
    observation. A history without a session stored its messages in none, read every session's back, and
    clear() forgot them all."""
    history = ClawVMChatMessageHistory(harness, "chat-3")
    history.add_messages([HumanMessageChunk(content="Which host?"), AIMessageChunk(content="The EU one.")])
    stored = list(harness.iter_all(session_id="chat-3"))
    assert [m.kind for m in stored] == [Kind.USER_INPUT, Kind.LLM_THOUGHT]
    assert [m.content for m in history.messages] == ["Which host?", "The EU one."]
    for missing in (None, "", "  "):
        with pytest.raises(ValidationError) as refused:
            ClawVMChatMessageHistory(harness, missing)  # type: ignore[arg-type]
        assert refused.value.field == "session_id"


def test_histories_of_one_session_for_two_agents_keep_apart() -> None:
    """agent_id and task_id were written but not read: each agent's history read the other's messages,
    and clear() forgot them for good."""
    with Harness.open("memory://", embedder=None) as h:
        a = ClawVMChatMessageHistory(h, "chat", agent_id="A")
        b = ClawVMChatMessageHistory(h, "chat", agent_id="B")
        a.add_message(HumanMessage("from A"))
        b.add_message(HumanMessage("from B"))
        assert [m.content for m in a.messages] == ["from A"]
        a.clear()
        assert [m.content for m in b.messages] == ["from B"] and a.messages == []


def test_a_history_stores_the_messages_of_one_call_all_or_none() -> None:
    """RunnableWithMessageHistory saves a question and its answer in one add_messages: an answer over the
    size limit was refused after the question had been stored, leaving it without its answer."""
    with Harness.open("memory://", embedder=None) as h:
        history = ClawVMChatMessageHistory(h, "chat-4")
        too_long = AIMessage("x" * (h.max_content_bytes + 1))
        with pytest.raises(ValidationError) as refused:
            history.add_messages([HumanMessage("question"), too_long])
        assert refused.value.field == "content"
        assert history.messages == [] and h.count(status="any") == 0
        with pytest.raises(ValidationError):  # the check itself writes nothing either
            h.check_record(too_long.content, session_id="chat-4")
        assert h.count(status="any") == 0
        history.add_messages([HumanMessage("question"), AIMessage("answer")])
        assert [m.content for m in history.messages] == ["question", "answer"]


def test_a_history_without_agent_or_task_is_the_whole_sessions() -> None:
    """As documented: the unscoped history reads and clears every agent's messages of its session."""
    with Harness.open("memory://", embedder=None) as h:
        ClawVMChatMessageHistory(h, "chat", agent_id="A").add_message(HumanMessage("from A"))
        ClawVMChatMessageHistory(h, "chat", task_id="t").add_message(HumanMessage("in t"))
        ClawVMChatMessageHistory(h, "other", agent_id="A").add_message(HumanMessage("elsewhere"))
        whole = ClawVMChatMessageHistory(h, "chat")
        assert sorted(m.content for m in whole.messages) == ["from A", "in t"]
        whole.clear()
        assert ClawVMChatMessageHistory(h, "chat", agent_id="A").messages == []
        assert [m.content for m in ClawVMChatMessageHistory(h, "other", agent_id="A").messages] == [
            "elsewhere"
        ]


@pytest.mark.parametrize(("field", "value"), [("agent_id", " "), ("agent_id", ""), ("task_id", "  ")])
def test_a_history_refuses_a_blank_agent_or_task_rather_than_reading_the_whole_session(
    field: str, value: str
) -> None:
    """agent_id=" " was read as no agent: the history read the whole session's chat, and clear() forgot
    the other agents' messages."""
    with Harness.open("memory://", embedder=None) as h:
        ClawVMChatMessageHistory(h, "c", agent_id="A").add_message(HumanMessage("from A"))
        with pytest.raises(ValidationError) as refused:
            ClawVMChatMessageHistory(h, "c", **{field: value})
        assert refused.value.field == field
        assert [m.content for m in ClawVMChatMessageHistory(h, "c", agent_id="A").messages] == ["from A"]


def test_a_callback_handler_refuses_no_harness_and_a_blank_scope() -> None:
    """ClawVMCallbackHandler(None) was taken and every callback then failed in a log line, the tools
    running unrecorded; session_id="" recorded every call under no session."""
    with pytest.raises(ValidationError) as exc:
        ClawVMCallbackHandler(None)  # type: ignore[arg-type]
    assert exc.value.field == "harness"
    with Harness.open("memory://", embedder=None) as h:
        for value in ("", 5):
            with pytest.raises(ValidationError) as exc:
                ClawVMCallbackHandler(h, session_id=value)  # type: ignore[arg-type]
            assert exc.value.field == "session_id"
