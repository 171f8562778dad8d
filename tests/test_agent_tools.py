"""Agent tools: OpenAI function-calling schemas, a dispatcher validating against them, structured errors."""

from __future__ import annotations

import json
from typing import Any, get_args

import jsonschema
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm import Harness, Kind, PagerConfig, State, Status, TierBudgets, ValidationError
from clawvm.agents.tool_schemas import KindName, StateName
from clawvm.agents.tools import AgentTools
from clawvm.vm.compress import SummarizerError
from clawvm.vm.context import short_id
from loopback import ChatReplay

NAMES = [
    "record_memory",
    "recall_memory",
    "list_memories",
    "get_memory",
    "update_memory",
    "build_context",
    "checkpoint",
    "rollback",
    "pin_memory",
    "forget_memory",
    "summarize_task",
]


def ok(reply: dict[str, Any]) -> Any:
    assert reply["ok"] is True, reply
    return reply["result"]


def err(reply: dict[str, Any], kind: str) -> dict[str, Any]:
    assert reply["ok"] is False and reply["error"]["type"] == kind, reply
    assert reply["error"]["message"]
    json.dumps(reply)  # always JSON
    return dict(reply["error"])


def test_schemas_are_openai_functions_with_valid_json_schemas() -> None:
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1")
        schemas = tools.schemas()
    assert [s["function"]["name"] for s in schemas] == NAMES
    for s in schemas:
        assert s["type"] == "function" and s["function"]["description"]
        params = s["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert "title" not in json.dumps(params).replace('"title":', "")  # titles stripped
    json.dumps(schemas)


def test_the_tools_do_what_they_say(harness: Harness) -> None:
    tools = AgentTools(harness, session_id="s1", task_id="t1")
    fact = ok(
        tools.dispatch(
            "record_memory",
            json.dumps(
                {"content": "The invoice API rotates keys on Mondays", "kind": "knowledge", "tags": ["api"]}
            ),
        )
    )
    m = harness.get(fact["id"])
    assert (m.session_id, m.task_id, m.kind.value, m.tags) == ("s1", "t1", "knowledge", ["api"])
    hits = ok(tools.dispatch("recall_memory", {"query": "when do invoice keys rotate", "k": 3}))["memories"]
    assert hits[0]["id"] == fact["id"] and hits[0]["short_id"] == fact["short_id"]
    # short ids (as shown in a context) work everywhere an id is taken
    assert ok(tools.dispatch("pin_memory", {"memory_id": fact["short_id"]}))["pinned"] is True
    assert harness.get(fact["id"]).pinned
    ctx = ok(tools.dispatch("build_context", {"query": "invoice keys", "budget_tokens": 500}))
    assert fact["id"] in ctx["ids"] and ctx["tokens"] <= 500 and fact["short_id"] in ctx["text"]
    cp = ok(tools.dispatch("checkpoint", {"name": "before-guess"}))["checkpoint_id"]
    guess = ok(tools.dispatch("record_memory", {"content": "keys rotate on Fridays (a guess)"}))
    rolled = ok(tools.dispatch("rollback", {"checkpoint_id": cp}))
    assert rolled["obsoleted"] == 1 and harness.get(guess["id"]).status is Status.OBSOLETE
    child = ok(tools.dispatch("record_memory", {"content": "retry", "parent_id": fact["short_id"]}))
    assert harness.get(child["id"]).parent_id == fact["id"]
    assert ok(tools.dispatch("forget_memory", {"memory_id": child["id"]}))["forgotten"] is True
    for i in range(2):
        ok(
            tools.dispatch(
                "record_memory", {"content": f"step {i}: checked shard {i}", "state": "intermediate"}
            )
        )
    summary = ok(tools.dispatch("summarize_task", {}))
    assert harness.get(summary["summary_id"]).state is State.SUCCESS
    assert ok(tools.dispatch("summarize_task", {"task_id": "t1"}))["summary_id"] is None  # nothing left


def test_list_get_update_forget_and_every_result_matches_its_schema(harness: Harness) -> None:
    tools = AgentTools(harness, session_id="s1", task_id="t1")
    other = AgentTools(harness, session_id="s2")

    def call(tool: str, **args: Any) -> Any:
        result = ok(tools.dispatch(tool, args))
        jsonschema.Draft202012Validator(tools.result_schema(tool)).validate(result)
        return result

    for name in tools.names:
        jsonschema.Draft202012Validator.check_schema(tools.result_schema(name))
    first = call("record_memory", content="the EU host is healthy", tags=["hosts"])
    second = call("record_memory", content="route payments to the EU host", kind="decision")
    theirs = ok(other.dispatch("record_memory", {"content": "not in s1"}))
    listed = call("list_memories")
    assert [m["id"] for m in listed["memories"]] == [second["id"], first["id"]] and listed["total"] == 2
    assert [m["id"] for m in call("list_memories", limit=1)["memories"]] == [second["id"]]
    assert call("list_memories", kind="decision")["total"] == 1
    assert call("list_memories", tags=["hosts"])["memories"][0]["id"] == first["id"]
    got = call("get_memory", memory_id=first["short_id"])
    assert (got["id"], got["content"], got["tags"], got["session_id"]) == (
        first["id"],
        "the EU host is healthy",
        ["hosts"],
        "s1",
    )
    # an update is a new revision through the harness, compare-and-set on the version read
    updated = call(
        "update_memory",
        memory_id=first["id"],
        content="the EU host is degraded",
        expected_version=got["version"],
    )
    assert (updated["version"], updated["fields"]) == (got["version"] + 1, ["content"])
    stored = harness.get(first["id"])
    assert (stored.content, stored.version) == ("the EU host is degraded", got["version"] + 1)
    assert "update" in [e.kind.value for e in harness.events(memory_id=first["id"])]
    stale = err(
        tools.dispatch("update_memory", {"memory_id": first["id"], "content": "x", "expected_version": 1}),
        "conflict",
    )
    assert "get_memory" in stale["fix"] and harness.get(first["id"]).content == "the EU host is degraded"
    # a forget decided on an old version keeps the memory
    err(tools.dispatch("forget_memory", {"memory_id": first["id"], "expected_version": 1}), "conflict")
    assert harness.get(first["id"]).content == "the EU host is degraded"
    assert call("update_memory", memory_id=first["short_id"], state="success", tags=[])["fields"] == [
        "state",
        "tags",
    ]
    err(tools.dispatch("update_memory", {"memory_id": first["id"]}), "invalid_request")  # changes nothing
    err(tools.dispatch("update_memory", {"memory_id": theirs["id"], "content": "mine now"}), "not_found")
    # what recall_memory (scope "all") and a context's recalled lines show, get_memory opens: it told the
    # model that an id its context showed did not exist
    assert call("get_memory", memory_id=theirs["short_id"])["content"] == "not in s1"
    assert harness.get(theirs["id"]).content == "not in s1"
    # the other tools' results match their schemas too
    call("recall_memory", query="EU host")
    call("build_context", query="EU host", budget_tokens=300)
    cp = call("checkpoint", name="cp")["checkpoint_id"]
    call("rollback", checkpoint_id=cp)
    call("pin_memory", memory_id=second["id"])
    call("summarize_task")
    call("record_memory", content="step 1", state="intermediate")
    assert call("summarize_task")["summary_id"]
    assert call("forget_memory", memory_id=first["id"])["forgotten"] is True
    err(tools.dispatch("get_memory", {"memory_id": first["id"]}), "not_found")
    # what each tool does, as the MCP annotations publish it
    effects = {name: tools.effect(name) for name in tools.names}
    assert {n for n, e in effects.items() if e.read_only} == {
        "recall_memory",
        "list_memories",
        "get_memory",
        "build_context",
    }
    assert {n for n, e in effects.items() if e.destructive} == {"update_memory", "rollback", "forget_memory"}


def test_errors_are_structured_and_never_raised(harness: Harness) -> None:
    tools = AgentTools(harness, session_id="s1")
    other = AgentTools(harness, session_id="s2")
    e = err(tools.dispatch("recall_memory", {"query": "x", "k": "5"}), "invalid_arguments")
    assert e["field"] == "k" and e["problems"][0]["field"] == "k"
    assert (
        err(tools.dispatch("recall_memory", {"query": "x", "limit": 5}), "invalid_arguments")["field"]
        == "limit"
    )
    assert err(tools.dispatch("recall_memory", {}), "invalid_arguments")["field"] == "query"
    err(tools.dispatch("record_memory", {"content": "x", "kind": "gossip"}), "invalid_arguments")
    err(tools.dispatch("record_memory", '{"content": '), "invalid_json")
    err(tools.dispatch("record_memory", "[1, 2]"), "invalid_json")
    unknown = err(tools.dispatch("delete_everything", {}), "unknown_tool")
    assert "record_memory" in unknown["fix"] and unknown["field"] == "name"
    err(tools.dispatch("pin_memory", {"memory_id": "0123abcd"}), "not_found")
    err(tools.dispatch("pin_memory", {"memory_id": "not-an-id"}), "invalid_request")
    err(tools.dispatch("record_memory", {"content": "   "}), "invalid_request")
    # scope is enforced: another session's memories and checkpoints are out of reach
    theirs = ok(other.dispatch("record_memory", {"content": "secret of s2"}))
    err(tools.dispatch("forget_memory", {"memory_id": theirs["id"]}), "not_found")
    err(tools.dispatch("forget_memory", {"memory_id": theirs["short_id"]}), "not_found")
    their_cp = ok(other.dispatch("checkpoint", {"name": "x"}))["checkpoint_id"]
    err(tools.dispatch("rollback", {"checkpoint_id": their_cp}), "invalid_request")
    err(tools.dispatch("rollback", {"checkpoint_id": theirs["id"]}), "invalid_request")
    unbound = AgentTools(harness)
    assert err(unbound.dispatch("checkpoint", {"name": "x"}), "invalid_request")["field"] == "session_id"
    err(unbound.dispatch("summarize_task", {}), "invalid_request")
    assert harness.get(theirs["id"]).content == "secret of s2"


class BrokenSummarizer:
    name = "broken"

    def summarize(self, text: str, max_chars: int) -> str:
        raise RuntimeError("summarizer crashed")


def test_an_unexpected_failure_is_a_tool_error_too(caplog: pytest.LogCaptureFixture) -> None:
    """The reply names the kind of failure, the log keeps its message: a store's message may name files and
    SQL, which a remote MCP client must not see (the REST API's 5xx replies hide it too)."""
    with Harness.open("memory://", embedder=None, summarizer=BrokenSummarizer()) as h:
        tools = AgentTools(h, session_id="s1", task_id="t1")
        ok(tools.dispatch("record_memory", {"content": "step 1", "state": "intermediate"}))
        # a summarizer of one's own that raises anything is an upstream failure (SummarizerError)
        e = err(tools.dispatch("summarize_task", {}), "upstream_failed")
        assert e["message"].startswith("SummarizerError: a model summarize_task needs failed")
        assert "crashed" not in e["message"]
        assert e["fix"] and "summarizer crashed" in caplog.text


class DownSummarizer:
    name = "down"

    def summarize(self, text: str, max_chars: int) -> str:
        raise SummarizerError("the team's summarizer is down")


def test_a_failing_summarizer_of_ones_own_is_an_upstream_failure() -> None:
    with Harness.open("memory://", embedder=None, summarizer=DownSummarizer()) as h:
        tools = AgentTools(h, session_id="s1", task_id="t1")
        ok(tools.dispatch("record_memory", {"content": "step 1", "state": "intermediate"}))
        e = err(tools.dispatch("summarize_task", {}), "upstream_failed")
        assert e["fix"] and "down" not in e["message"]
        assert h.count(session_id="s1") == 1


def test_a_change_to_a_replaced_memory_is_an_invalid_state_with_its_fix() -> None:
    """A refusal by the memory's state, not the call's arguments (it was reported as invalid_request)."""
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1")
        old = ok(tools.dispatch("record_memory", {"content": "deploys on Friday"}))
        h.revise(old["id"], content="deploys on Thursday")
        e = err(tools.dispatch("update_memory", {"memory_id": old["id"], "content": "x"}), "invalid_state")
        assert e["field"] == "memory_id" and "revise" in e["fix"]


def test_tool_message_answers_an_openai_tool_call() -> None:
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1")
        call = {
            "id": "call_7",
            "type": "function",
            "function": {"name": "record_memory", "arguments": '{"content": "disk 91% full"}'},
        }
        msg = tools.tool_message(call)
        assert msg["role"] == "tool" and msg["tool_call_id"] == "call_7"
        assert json.loads(msg["content"])["ok"] is True
        bad = tools.tool_message({"id": "c8", "function": {"name": "nope"}})
        assert json.loads(bad["content"])["error"]["type"] == "unknown_tool"


# ---- the dispatcher accepts exactly what the published schema accepts ----------------------------------
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=40000),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=100),
    st.text(max_size=12),
    st.sampled_from(["session", "task", "all", "note", "knowledge", "success", "pending", "01234567"]),
)
json_values = st.one_of(json_scalars, st.lists(json_scalars, max_size=3))


@st.composite
def arguments(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from([*names, "extra"]), unique=True, max_size=len(names) + 1))
    return {k: draw(json_values) for k in keys}


TOOLS_UNDER_TEST = {
    "recall_memory": ["query", "k", "kind", "tags", "scope"],
    "record_memory": ["content", "kind", "state", "tags", "pinned", "parent_id"],
    "build_context": ["query", "budget_tokens", "tools"],
    "checkpoint": ["name"],
    "summarize_task": ["task_id"],
    "list_memories": ["limit", "kind", "tags"],
    "update_memory": ["memory_id", "content", "tags", "state", "expected_version"],
    "forget_memory": ["memory_id", "expected_version"],
}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_dispatcher_validation_agrees_with_the_json_schema(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(TOOLS_UNDER_TEST)))
    args = data.draw(arguments(TOOLS_UNDER_TEST[name]))
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1", task_id="t1")
        schema_ok = jsonschema.Draft202012Validator(tools.parameters(name)).is_valid(args)
        reply = tools.dispatch(name, args)
        # the same call as a strict-mode model sends it: every property present, null where not meant
        filled = {**{n: None for n in TOOLS_UNDER_TEST[name]}, **args}
        strict_ok = jsonschema.Draft202012Validator(tools.parameters(name, strict=True)).is_valid(filled)
        full_ok = jsonschema.Draft202012Validator(tools.parameters(name)).is_valid(filled)
        filled_reply = tools.dispatch(name, filled)
    rejected = not reply["ok"] and reply["error"]["type"] == "invalid_arguments"
    assert rejected is (not schema_ok), (name, args, reply)
    filled_rejected = not filled_reply["ok"] and filled_reply["error"]["type"] == "invalid_arguments"
    assert filled_rejected is (not full_ok), (name, filled, filled_reply)
    assert strict_ok or not full_ok, (name, filled)  # the strict schema only ever drops constraints


# ---- OpenAI strict mode ---------------------------------------------------------------------------------
STRICT_FORBIDDEN = {"minimum", "maximum", "minLength", "maxLength", "pattern", "format", "default"}


def schema_nodes(node: Any) -> list[dict[str, Any]]:
    """Every (sub)schema of a JSON schema; property names are not keywords."""
    if isinstance(node, list):
        return [n for v in node for n in schema_nodes(v)]
    if not isinstance(node, dict):
        return []
    found = [node]
    for key, value in node.items():
        children = list(value.values()) if key in ("properties", "$defs") else [value]
        found += [n for child in children for n in schema_nodes(child)]
    return found


def test_strict_schemas_are_openai_strict_mode_subset() -> None:
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1")
        strict, loose = tools.schemas(strict=True), tools.schemas()
    assert [s["function"]["name"] for s in strict] == NAMES
    for s, full in zip(strict, loose, strict=True):
        assert s["function"]["strict"] is True and "strict" not in full["function"]
        params = s["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        for node in schema_nodes(params):
            assert not STRICT_FORBIDDEN & set(node), (s["function"]["name"], node)
            if node.get("type") == "object" or "properties" in node:
                assert node["additionalProperties"] is False
                assert sorted(node["required"]) == sorted(node["properties"])
        optional = set(full["function"]["parameters"]["properties"]) - set(
            full["function"]["parameters"].get("required", [])
        )
        for prop, schema in params["properties"].items():  # optional means nullable in strict mode
            accepts_null = jsonschema.Draft202012Validator(schema).is_valid(None)
            assert accepts_null is (prop in optional), (s["function"]["name"], prop)
    assert any("maximum" in n for n in schema_nodes(loose))  # the full schema keeps its bounds


def json_schema_keywords() -> set[str]:
    """Every keyword of JSON Schema 2020-12, from the meta-schemas the jsonschema library ships."""
    from jsonschema_specifications import REGISTRY

    return {
        key
        for uri in REGISTRY
        if "2020-12/meta/" in uri
        for key in REGISTRY[uri].contents.get("properties", {})
    }


def test_every_published_keyword_is_json_schema() -> None:
    # a validator ignores a keyword it does not know, so a bound published under a wrong name ("ge") is a
    # bound no caller sees; check_schema cannot catch it
    known = json_schema_keywords()
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1")
        published = tools.schemas() + tools.schemas(strict=True)
    for s in published:
        for node in schema_nodes(s["function"]["parameters"]):
            assert set(node) <= known, (s["function"]["name"], set(node) - known)
    update = next(s for s in published if s["function"]["name"] == "update_memory")["function"]["parameters"]
    version = update["properties"]["expected_version"]
    assert any(o.get("minimum") == 1 for o in version.get("anyOf", [version]))


def test_strict_tools_round_trip_through_the_official_openai_client(harness: Harness) -> None:
    """The official ``openai`` client sends the strict tools to a chat endpoint on loopback; the tool call it
    parses from the answer (every argument present, nulls for the optional ones, as strict mode makes a
    model answer) dispatches; and the schemas agree with the SDK's own strict conversion of the same
    argument models."""
    import openai

    from clawvm.agents.tool_schemas import json_schema

    tools = AgentTools(harness, session_id="s1", task_id="t1")
    strict = tools.schemas(strict=True)
    params = {s["function"]["name"]: s["function"]["parameters"] for s in strict}
    arguments = {
        **dict.fromkeys(params["record_memory"]["properties"]),
        "content": "Deploys freeze on Fridays",
    }
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "record_memory", "arguments": json.dumps(arguments)},
    }
    with ChatReplay([{"role": "assistant", "content": None, "tool_calls": [call]}]) as server:
        client = openai.OpenAI(base_url=server.v1, api_key="test-key", max_retries=0)
        reply = client.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "remember the freeze"}],
            tools=strict,  # type: ignore[arg-type]
        )
        sent = server.requests[0]["json"]
    assert sent["tools"] == strict  # the client sends the schemas as they are
    (tool_call,) = reply.choices[0].message.tool_calls or []
    stored = ok(tools.dispatch(tool_call.function.name, tool_call.function.arguments))  # type: ignore[union-attr]
    assert harness.get(stored["id"]).content == "Deploys freeze on Fridays"
    for name, tool in tools._tools.items():
        theirs = openai.pydantic_function_tool(tool.args)["function"]["parameters"]
        ours = json_schema(tool.args, strict=True)
        assert sorted(ours["required"]) == sorted(theirs["required"]) == sorted(theirs["properties"]), name
        assert ours["additionalProperties"] is theirs["additionalProperties"] is False, name


def test_null_filled_strict_calls_dispatch(harness: Harness) -> None:
    tools = AgentTools(harness, session_id="s1", task_id="t1")
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in tools.schemas(strict=True)}

    def call(name: str, *, check: bool = True, **given: Any) -> Any:
        args = {**dict.fromkeys(schemas[name]["properties"], None), **given}
        if check:
            jsonschema.Draft202012Validator(schemas[name]).validate(args)  # what a strict-mode model may send
        return tools.dispatch(name, json.dumps(args))

    fact = ok(call("record_memory", content="The invoice API rotates keys on Mondays"))
    m = harness.get(fact["id"])
    assert (m.kind.value, m.tags, m.pinned, m.state) == ("note", [], False, None)  # nulls -> defaults
    hits = ok(call("recall_memory", query="invoice keys"))["memories"]
    assert [x["id"] for x in hits] == [fact["id"]]
    assert fact["id"] in ok(call("build_context", query="invoice keys"))["ids"]
    ok(call("record_memory", content="step 1", state="intermediate"))
    assert ok(call("summarize_task"))["summary_id"]
    # bounds left out of the strict schema are still the dispatcher's
    e = err(call("recall_memory", query="x", k=1000), "invalid_arguments")
    assert e["field"] == "k"
    # a required argument stays required: null is not "not given" for it
    assert err(call("record_memory", check=False, content=None), "invalid_arguments")["field"] == "content"


def test_deeply_nested_json_is_invalid_json_not_a_crash(harness: Harness) -> None:
    tools = AgentTools(harness, session_id="s1")
    for text in ("[" * 100000, '{"a":' * 100000, "[" * 100000 + "]" * 100000):
        e = err(tools.dispatch("record_memory", text), "invalid_json")
        assert "Recursion" not in e["message"]
    for constant in ("NaN", "Infinity", "-Infinity"):  # Python's decoder takes them; JSON has no such numbers
        e = err(tools.dispatch("recall_memory", f'{{"query": "x", "k": {constant}}}'), "invalid_json")
        assert constant in e["message"]


def test_errors_speak_json_types(harness: Harness) -> None:
    tools = AgentTools(harness, session_id="s1")
    cases = {
        json.dumps({"query": "x", "k": "5"}): "k: expected an integer, got a string",
        json.dumps({"query": "x", "k": 2.5}): "k: expected an integer, got a number",
        json.dumps({"query": "x", "k": True}): "k: expected an integer, got a boolean",
        json.dumps({"query": None}): "query: expected a string, got null",
        json.dumps({"query": "x", "tags": {"a": 1}}): "tags: expected an array, got an object",
        json.dumps({"query": "x", "tags": [3]}): "tags.0: expected a string, got an integer",
    }
    for arguments, message in cases.items():
        assert err(tools.dispatch("recall_memory", arguments), "invalid_arguments")["message"] == message
    for arguments, said in {"null": "null", "5": "an integer", '"s"': "a string", "[1]": "an array"}.items():
        message = err(tools.dispatch("recall_memory", arguments), "invalid_json")["message"]
        assert message == f"arguments are {said}, not an object"
    python_names = ("int", "str", "NoneType", "dict", "list", "float", "bool")
    for arguments in [*cases, "null", "5", '"s"', "[1]"]:
        words = json.dumps(tools.dispatch("recall_memory", arguments)).replace(",", " ").split()
        assert not set(python_names) & {w.strip("\"':.") for w in words}, arguments


@pytest.mark.parametrize("name", NAMES)
def test_every_tool_rejects_unknown_arguments(name: str) -> None:
    with Harness.open("memory://", embedder=None) as h:
        err(AgentTools(h, session_id="s").dispatch(name, {"surprise": 1}), "invalid_arguments")


def test_each_invalid_argument_gets_a_fix_of_its_own(harness: Harness) -> None:
    tools = AgentTools(harness, session_id="s1")
    fact = ok(tools.dispatch("record_memory", {"content": "the ledger export runs nightly"}))

    def fix_of(name: str, args: dict[str, Any]) -> tuple[str, str]:
        e = err(tools.dispatch(name, json.dumps(args)), "invalid_arguments")
        return e["message"], e["fix"]

    stale = {"memory_id": fact["id"], "content": "x", "expected_version": 0}
    assert fix_of("update_memory", stale) == (
        "expected_version: is 0; it must be at least 1",
        "expected_version: pass a value at least 1",
    )
    assert fix_of("recall_memory", {"query": "x", "k": 1000})[1] == "k: pass a value at most 50"
    assert fix_of("recall_memory", {"query": "x", "k": "5"})[1] == "k: send an integer"
    assert fix_of("recall_memory", {"query": ""}) == ("query: is empty", "query: pass a non-empty value")
    assert fix_of("record_memory", {})[1] == "content: add it"
    assert fix_of("record_memory", {"content": "x", "kind": "bogus"})[1].startswith(
        "kind: use one of 'user_input'"
    )
    assert "leave it out" in fix_of("record_memory", {"content": "x", "bogus": 1})[1]


def test_the_tools_kind_and_state_names_are_the_models() -> None:
    """Spelled out for the JSON Schema: a kind added to the model and not here would be refused by tools."""
    assert set(get_args(KindName)) == {k.value for k in Kind}
    assert set(get_args(StateName)) == {s.value for s in State}


def test_a_bound_agent_opens_its_own_memories_of_every_session_and_no_other_agents(harness: Harness) -> None:
    """get_memory reaches what build_context recalls (the agent's memories of every session), as
    recall_memory's scope "all" does, and not another agent's memories."""
    mine_elsewhere = harness.record("the locker code is 4471", session_id="s2", agent_id="ana")
    other_agents = harness.record("the locker code is 9902", session_id="s2", agent_id="bob")
    tools = AgentTools(harness, session_id="s1", agent_id="ana")
    ctx = ok(tools.dispatch("build_context", {"query": "locker code"}))
    assert mine_elsewhere.id in ctx["ids"]
    assert ok(tools.dispatch("get_memory", {"memory_id": mine_elsewhere.id}))["id"] == mine_elsewhere.id
    err(tools.dispatch("get_memory", {"memory_id": other_agents.id}), "not_found")
    err(tools.dispatch("forget_memory", {"memory_id": mine_elsewhere.id}), "not_found")  # writes stay in s1
    # a short id: the session's own memory first (a twin short id elsewhere does not make it ambiguous)
    here = harness.record("the session's own note", session_id="s1", agent_id="ana")
    shown = ok(tools.dispatch("get_memory", {"memory_id": short_id(here.id)}))
    assert shown["id"] == here.id
    assert (
        ok(tools.dispatch("get_memory", {"memory_id": short_id(mine_elsewhere.id)}))["id"]
        == mine_elsewhere.id
    )


def test_an_agents_tools_change_no_memory_of_another_agent_in_bulk() -> None:
    """summarize_task archived and quoted another agent's private steps (it collapsed the task whoever
    wrote it), and rollback in a shared session obsoleted another agent's memories: one the first agent
    could not even read."""
    with Harness.open("memory://", embedder=None) as h:
        mine = AgentTools(h, session_id="s1", agent_id="a1")
        theirs = AgentTools(h, session_id="s1", agent_id="a2")
        elsewhere = AgentTools(h, session_id="s2", agent_id="a2", task_id="t-b")
        for n in range(2):
            step = {"content": f"a2 secret step {n}", "kind": "observation", "state": "intermediate"}
            ok(elsewhere.dispatch("record_memory", step))
        refused = err(mine.dispatch("summarize_task", {"task_id": "t-b"}), "invalid_request")
        assert refused["field"] == "task_id" and "secret" not in json.dumps(refused)
        assert h.count(task_id="t-b", status="archived") == 0  # a2's steps untouched
        assert ok(elsewhere.dispatch("summarize_task", {"task_id": "t-b"}))["summary_id"]  # a2's own: fine

        cp = ok(mine.dispatch("checkpoint", {"name": "before"}))["checkpoint_id"]
        later = ok(theirs.dispatch("record_memory", {"content": "a2 works on", "kind": "observation"}))
        refused = err(mine.dispatch("rollback", {"checkpoint_id": cp}), "invalid_request")
        assert refused["field"] == "checkpoint_id"
        assert h.get(later["id"]).status is Status.ACTIVE  # it was obsoleted

        # a shared session: another agent's memory from before the checkpoint, unchanged since, is no
        # obstacle; once that agent changed it (a rollback would undo its pin), the rollback is refused
        a1, a2 = AgentTools(h, session_id="s4", agent_id="a1"), AgentTools(h, session_id="s4", agent_id="a2")
        before = ok(a2.dispatch("record_memory", {"content": "a2 before", "kind": "observation"}))
        cp = ok(a1.dispatch("checkpoint", {"name": "before"}))["checkpoint_id"]
        made = ok(a1.dispatch("record_memory", {"content": "a guess", "kind": "observation"}))
        assert ok(a1.dispatch("rollback", {"checkpoint_id": cp}))["obsoleted"] == 1
        assert h.get(made["id"]).status is Status.OBSOLETE
        ok(a2.dispatch("pin_memory", {"memory_id": before["id"]}))
        refused = err(a1.dispatch("rollback", {"checkpoint_id": cp}), "invalid_request")
        assert refused["field"] == "checkpoint_id"
        assert h.get(before["id"]).pinned


def test_a_parent_that_is_no_memory_of_the_scope_is_named_as_parent_id() -> None:
    """record_memory's bad parent_id was reported as memory_id, an argument it does not have."""
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1")
        bad = err(tools.dispatch("record_memory", {"content": "x", "parent_id": "abc"}), "invalid_request")
        assert bad["field"] == "parent_id"
        missing = "01a245e4-d74a-7000-bedf-fa43ab5adc14"
        gone = err(tools.dispatch("record_memory", {"content": "x", "parent_id": missing}), "not_found")
        assert gone["field"] == "parent_id"


class SdkToolCall(pydantic.BaseModel):
    """The shape of the OpenAI SDK's ``message.tool_calls[i]``: an object with ``model_dump``, no ``get``."""

    id: str
    type: str = "function"
    function: dict[str, str]


def test_tool_message_takes_the_sdks_object_and_refuses_what_is_no_tool_call() -> None:
    """The SDK's object raised AttributeError (no .get); a function given as a string did too."""
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="s1")
        call = SdkToolCall(id="call_9", function={"name": "record_memory", "arguments": '{"content": "hi"}'})
        msg = tools.tool_message(call)
        assert msg["tool_call_id"] == "call_9" and json.loads(msg["content"])["ok"] is True
        reply = json.loads(tools.tool_message({"id": "c1", "function": "list_memories"})["content"])
        assert reply["ok"] is False and reply["error"]["field"] == "tool_call"
        # no id (some OpenAI-compatible servers leave it out): still dispatched, answered with ""
        msg = tools.tool_message({"function": {"name": "record_memory", "arguments": {"content": "hey"}}})
        assert msg["tool_call_id"] == "" and json.loads(msg["content"])["ok"] is True


def test_an_agents_rollback_is_not_refused_for_the_pagers_own_moves() -> None:
    """The pager compressed another agent's memories on their way to the archive after the checkpoint;
    the rollback would decompress them, which no agent wrote: it was refused."""
    budgets = TierBudgets(working_items=1, short_term_items=1, long_term_items=1)
    with Harness.open("memory://", embedder=None, pager=PagerConfig(budgets=budgets, background=False)) as h:
        a1, a2 = AgentTools(h, session_id="s", agent_id="a1"), AgentTools(h, session_id="s", agent_id="a2")
        long = "The ledger export ran for hours and then stopped without a word. " * 12
        for n in range(3):
            ok(a2.dispatch("record_memory", {"content": f"{long} Attempt {n}.", "kind": "observation"}))
        cp = ok(a1.dispatch("checkpoint", {"name": "before"}))["checkpoint_id"]
        h.page()
        assert h.count(session_id="s", agent_id="a2", tier="archive") >= 1  # compressed on the way there
        assert ok(a1.dispatch("rollback", {"checkpoint_id": cp}))["restored"] >= 1


def test_an_agents_rollback_is_not_refused_for_a_pin_of_anothers_that_no_longer_fits() -> None:
    """Another agent's memory was pinned at the checkpoint, unpinned since, and grew past the pin budget: the
    rollback restores it unpinned (its pin no longer fits) and changes only the harness's bookkeeping of it
    (tier, value), yet the agent's rollback was refused as changing another agent's memory: the tools'
    check counted the pin as restored, and the rollback's guard was shown the memory."""
    budgets = TierBudgets(working_items=5, working_tokens=150)
    with Harness.open("memory://", embedder=None, pager=PagerConfig(budgets=budgets, background=False)) as h:
        a = AgentTools(h, session_id="s", agent_id="a")
        theirs = h.record("b's short note", session_id="s", agent_id="b", pinned=True)
        cp = ok(a.dispatch("checkpoint", {"name": "before"}))["checkpoint_id"]
        h.unpin(theirs.id)
        h.update(theirs.id, content="b's long note about the ledger export " * 40)  # past the pin budget
        ok(a.dispatch("rollback", {"checkpoint_id": cp}))
        back = h.get(theirs.id)
        assert not back.pinned and back.content.startswith("b's long note")
        rolled = [e for e in h.events(limit=100) if e.kind == "rollback"][-1]
        assert rolled.data["unpinned"] == [theirs.id]


class _AnotherAgentBetween:
    """The harness, with agent a2 recording into the session just as a1's rollback begins: the window
    between the tools' check of what the rollback would change and the rollback itself."""

    def __init__(self, h: Harness) -> None:
        self._h = h

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h, name)

    def rollback(self, checkpoint_id: str, **options: Any) -> Any:
        AgentTools(self._h, session_id="s", agent_id="a2").dispatch(
            "record_memory", {"content": "a2's late note"}
        )
        return self._h.rollback(checkpoint_id, **options)


def test_an_agents_rollback_never_obsoletes_what_another_agent_made_meanwhile() -> None:
    """The check and the rollback were two calls: a2's note made between them was obsoleted."""
    with Harness.open("memory://", embedder=None) as h:
        a1 = AgentTools(_AnotherAgentBetween(h), session_id="s", agent_id="a1")  # type: ignore[arg-type]
        ok(a1.dispatch("record_memory", {"content": "a1's first note"}))
        cp = ok(a1.dispatch("checkpoint", {"name": "before"}))["checkpoint_id"]
        ok(a1.dispatch("record_memory", {"content": "a1's second note"}))
        refused = err(a1.dispatch("rollback", {"checkpoint_id": cp}), "invalid_request")
        assert refused["field"] == "checkpoint_id"
        notes = [m for m in h.list(session_id="s", status="any") if "note" in m.content]
        assert len(notes) == 3 and {m.status for m in notes} == {Status.ACTIVE}
        assert not [e for e in h.events(limit=100) if e.kind == "rollback"]


def test_a_rollback_guard_sees_what_it_would_change_and_can_stop_it() -> None:
    with Harness.open("memory://", embedder=None) as h:
        kept = h.record("before", session_id="s", agent_id="a1")
        cp = h.checkpoint("s", "cp")
        later = h.record("after", session_id="s", agent_id="a2")
        h.update(kept.id, tier="long_term")  # a tier: the harness's bookkeeping, shown to no guard
        seen: list[str] = []

        def stop(memories: Any) -> None:
            seen.extend(m.id for m in memories)
            raise ValueError("not now")

        with pytest.raises(ValueError):
            h.rollback(cp, guard=stop)
        assert seen == [later.id] and h.get(later.id).status is Status.ACTIVE
        assert h.rollback(cp, guard=lambda memories: None).obsoleted == [later.id]


def test_a_rollback_guard_that_refuses_leaves_a_memory_compressed_since_compressed() -> None:
    """The raw text of memories compressed since came back before the guard was asked."""
    with Harness.open("memory://", embedder=None) as h:
        text = " ".join(f"We talked about the {w} and the long walk home." for w in ("queue", "train") * 12)
        m = h.record(text, session_id="s", agent_id="a1")
        cp = h.checkpoint("s", "cp")
        h.record("after", session_id="s", agent_id="a2")
        compressed = h.compress(m.id)

        def refuse(memories: Any) -> None:
            raise ValueError("not now")

        with pytest.raises(ValueError):
            h.rollback(cp, guard=refuse)
        assert h.get(m.id).version == compressed.version and "compression" in h.get(m.id).metadata


def test_a_key_given_twice_in_the_arguments_is_refused_naming_it() -> None:
    """``{"content": "x", "content": "y"}`` recorded "y" without a word (Python's decoder keeps the last
    value); the REST API refuses such a body with a 422 naming the key."""
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="ana")
        twice = err(tools.dispatch("record_memory", '{"content": "x", "content": "y"}'), "invalid_json")
        assert twice["field"] == "content" and "content" in twice["message"] and "once" in twice["fix"]
        assert h.count() == 0
        call = {
            "id": "c1",
            "function": {"name": "recall_memory", "arguments": '{"query": "a", "k": 1, "k": 9}'},
        }
        assert json.loads(tools.tool_message(call)["content"])["error"]["field"] == "k"
        assert ok(
            tools.dispatch("record_memory", '{"content": "x", "tags": ["a", "a"]}')
        )  # values may repeat


def test_a_write_to_another_sessions_memory_says_it_belongs_there() -> None:
    """get_memory opens another session's memory (as the context shows it), while its description said
    "of this session"; forget/update/pin on that id answered not_found with the fix "use an id from
    recall_memory or the context", though the id came from the context."""
    with Harness.open("memory://", embedder=None) as h:
        ana, bob = AgentTools(h, session_id="ana"), AgentTools(h, session_id="bob")
        assert "of this session" not in ana.description("get_memory")
        assert "another session" in ana.description("get_memory")
        theirs = ok(bob.dispatch("record_memory", {"content": "the vault code is 7731", "tags": ["vault"]}))
        ctx = ok(ana.dispatch("build_context", {"query": "vault code"}))
        assert theirs["id"] in ctx["ids"] and theirs["short_id"] in ctx["text"]
        assert ok(ana.dispatch("get_memory", {"memory_id": theirs["short_id"]}))["session_id"] == "bob"
        before = h.get(theirs["id"]).version  # (the context counted its use)
        writes = [
            ("forget_memory", {}),
            ("update_memory", {"content": "the vault code is 0000"}),
            ("pin_memory", {}),
        ]
        for tool, extra in writes:
            for given in (theirs["id"], theirs["short_id"]):
                refused = err(ana.dispatch(tool, {"memory_id": given, **extra}), "not_found")
                assert refused["field"] == "memory_id"
                assert "belongs to another session and cannot be changed from this one" in refused["message"]
                assert "context" not in refused["fix"] and "this session" in refused["fix"]
        kept = h.get(theirs["id"])
        assert (kept.content, kept.version, kept.pinned, kept.status) == (
            "the vault code is 7731",
            before,
            False,
            Status.ACTIVE,
        )
        # what the tools cannot show at all is still simply not found (another agent's: not even named)
        agents = AgentTools(h, session_id="ana", agent_id="a1")
        hidden = h.record("a2's note", session_id="bob", agent_id="a2")
        gone = err(agents.dispatch("forget_memory", {"memory_id": hidden.id}), "not_found")
        assert (
            "another" not in gone["message"] and gone["fix"] == "use an id from recall_memory or the context"
        )


@pytest.mark.parametrize(("field", "value"), [("session_id", ""), ("session_id", "  "), ("task_id", 5)])
def test_a_blank_or_non_text_scope_is_refused_not_left_out(field: str, value: object) -> None:
    """``AgentTools(h, session_id="")`` (an empty environment variable) left the session out: the tools
    were bound to no session, and read and forgot every session's memories."""
    with Harness.open("memory://", embedder=None) as h:
        other = h.record("a secret of session B", session_id="B")
        with pytest.raises(ValidationError) as exc:
            AgentTools(h, **{field: value})  # type: ignore[arg-type]
        assert exc.value.field == field and h.get(other.id) == other


def test_recall_of_scope_task_with_no_task_bound_is_refused_not_widened() -> None:
    """Scope "task" with no task bound left the task out of the filter: it searched every session, as
    scope "all" does. Refused as checkpoint is with no session bound; with a task bound it searches it."""
    with Harness.open("memory://", embedder=None) as h:
        h.record("alpha s1", session_id="s1")
        h.record("alpha s2", session_id="s2")
        h.record("alpha none")
        h.record("alpha task", session_id="s2", task_id="t1")
        refused = err(
            AgentTools(h, session_id="s1").dispatch("recall_memory", {"query": "alpha", "scope": "task"}),
            "invalid_request",
        )
        assert refused["field"] == "task_id" and "not bound" in refused["message"]
        assert 'scope "session"' in refused["fix"]
        bound = AgentTools(h, session_id="s1", task_id="t1")
        found = ok(bound.dispatch("recall_memory", {"query": "alpha", "scope": "task", "k": 10}))
        assert [m["content"] for m in found["memories"]] == ["alpha task"]


def test_an_integer_past_the_digit_limit_is_bad_json_not_an_internal_failure() -> None:
    """Python refuses to read an integer of over 4,300 digits: the tools answered "internal ... retry",
    which a model follows into a loop."""
    with Harness.open("memory://", embedder=None) as h:
        tools = AgentTools(h, session_id="ana")
        huge = '{"query": "x", "k": 1' + "0" * 5000 + "}"
        assert "digits" in err(tools.dispatch("recall_memory", huge), "invalid_json")["message"]
