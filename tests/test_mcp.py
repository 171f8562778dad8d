"""The MCP server with the official ``mcp`` client: over stdio (``clawvm mcp`` as a subprocess), over
streamable HTTP mounted on the REST app (a real uvicorn on loopback, API keys and tenants), and over
``clawvm mcp --http --api-key`` (a real process). The client itself checks every successful result against
the tool's output schema."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import httpx2
import jsonschema
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import clawvm
from clawvm import Harness, Kind, Status, ValidationError
from clawvm.agents.tools import AgentTools
from clawvm.integrations.mcp_server import SCOPE_ARGUMENTS, build_server
from clawvm.server import ServerSettings, create_app
from clawvm.store import store_from_url
from clawvm.store.keys import Keyring
from engines import harness_target
from loopback import serve_app

T = TypeVar("T")
SRC = str(Path(clawvm.__file__).parents[1])  # the clawvm under test (a worktree's), for subprocesses


def run(talk: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(talk())


def ok(result: Any) -> dict[str, Any]:
    assert result.is_error is False, result
    assert json.loads(result.content[0].text) == result.structured_content  # text and structure agree
    return dict(result.structured_content["result"])


def failed(result: Any, kind: str) -> dict[str, Any]:
    assert result.is_error is True and result.structured_content["ok"] is False, result
    assert result.structured_content["error"]["type"] == kind, result.structured_content
    return dict(result.structured_content["error"])


# ---- stdio ---------------------------------------------------------------------------------------------
@pytest.mark.engines("sqlite", "postgres")
def test_stdio_tools_resources_and_per_call_scope(engine_name: str, tmp_path: Path) -> None:
    target = harness_target(engine_name, tmp_path, "mcp.db")
    with Harness.open(target, embedder=None):
        pass  # create the store first, as a deployment would
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-c",
            "from clawvm.cli import main; main()",
            "--db",
            target,
            "--no-embed",
            "mcp",
            "--session",
            "s1",
        ],
        cwd=str(tmp_path),
        env={**get_default_environment(), "PYTHONPATH": SRC},
    )

    async def talk() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(server, read_timeout_seconds=60) as client:
            out["instructions"] = client.instructions
            out["tools"] = {t.name: t for t in (await client.list_tools()).tools}
            call = client.call_tool
            fact = ok(await call("record_memory", {"content": "the staging DB password was rotated"}))
            other_text = "deploys freeze on Fridays"
            other = ok(await call("record_memory", {"content": other_text, "session_id": "s2"}))
            out["ids"] = fact["id"], other["id"]
            out["recall"] = ok(await call("recall_memory", {"query": "staging password rotated"}))
            out["list_s1"] = ok(await call("list_memories", {}))
            out["list_s2"] = ok(await call("list_memories", {"session_id": "s2", "limit": 5}))
            got = ok(await call("get_memory", {"memory_id": fact["short_id"]}))
            out["got"] = got
            out["update"] = ok(
                await call(
                    "update_memory",
                    {
                        "memory_id": fact["id"],
                        "content": "the staging DB password rotates weekly",
                        "expected_version": got["version"],
                    },
                )
            )
            out["stale"] = failed(
                await call(
                    "update_memory",
                    {"memory_id": fact["id"], "content": "x", "expected_version": got["version"]},
                ),
                "conflict",
            )
            # another session's memory: readable (as recall with scope "all" shows it), not writable
            assert ok(await call("get_memory", {"memory_id": other["id"]}))["content"] == other_text
            failed(await call("update_memory", {"memory_id": other["id"], "content": "x"}), "not_found")
            out["templates"] = (await client.list_resource_templates()).resource_templates
            out["resources"] = (await client.list_resources()).resources
            out["memory_resource"] = (await client.read_resource(f"clawvm://memory/{fact['id']}")).contents[0]
            out["context_resource"] = (
                await client.read_resource("clawvm://session/s2/context?query=deploys")
            ).contents[0]
            ok(await call("forget_memory", {"memory_id": other["id"], "session_id": "s2"}))
            out["forgotten"] = failed(
                await call("get_memory", {"memory_id": other["id"], "session_id": "s2"}), "not_found"
            )
            try:
                await client.read_resource(f"clawvm://memory/{other['id']}")
                out["forgotten_resource"] = None
            except MCPError as exc:
                out["forgotten_resource"] = exc.message
            out["bad_budgets"] = []
            for budget in (
                "\u00b2",
                "10" * 12,
                "49",
                "-5",
            ):  # a superscript passed isdigit() and failed int()
                try:
                    await client.read_resource(f"clawvm://session/s2/context?budget_tokens={budget}")
                    out["bad_budgets"].append(None)
                except MCPError as exc:
                    out["bad_budgets"].append(exc.message)
            out["bad"] = failed(await call("recall_memory", {"query": "x", "k": "many"}), "invalid_arguments")
            out["bad_scope"] = failed(await call("list_memories", {"session_id": 5}), "invalid_arguments")
            out["blank_scope"] = failed(
                await call("record_memory", {"content": "x", "session_id": "   "}), "invalid_arguments"
            )
            out["unknown"] = failed(await call("drop_tables", {}), "unknown_tool")
        return out

    out = run(talk)
    assert "build_context" in out["instructions"] and "update_memory" in out["instructions"]
    with Harness.open("memory://", embedder=None) as h:
        catalog = AgentTools(h)
    tools = out["tools"]
    assert list(tools) == catalog.names
    for name, tool in tools.items():
        assert tool.description == catalog.description(name)
        own = catalog.parameters(name)
        assert {k: v for k, v in tool.input_schema["properties"].items() if k in own["properties"]} == own[
            "properties"
        ]
        assert set(SCOPE_ARGUMENTS) <= set(tool.input_schema["properties"])
        assert tool.input_schema.get("required", []) == own.get("required", [])  # the scope is optional
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
        effect = catalog.effect(name)
        assert (tool.annotations.read_only_hint, tool.annotations.destructive_hint) == (
            effect.read_only,
            effect.destructive,
        )
        assert tool.annotations.idempotent_hint is effect.idempotent
    assert tools["get_memory"].annotations.read_only_hint is True
    assert tools["forget_memory"].annotations.destructive_hint is True
    assert tools["record_memory"].annotations.destructive_hint is False

    fact_id, other_id = out["ids"]
    assert [m["id"] for m in out["recall"]["memories"]] == [fact_id]  # s1 only: s2's memory is not recalled
    assert [m["id"] for m in out["list_s1"]["memories"]] == [fact_id] and out["list_s1"]["total"] == 1
    assert [m["id"] for m in out["list_s2"]["memories"]] == [other_id]
    assert out["got"]["content"] == "the staging DB password was rotated"
    version = out["got"]["version"] + 1  # the read's version (recall's tracking may have moved it) plus one
    assert out["update"] == {
        "id": fact_id,
        "short_id": fact_id[-8:],
        "version": version,
        "fields": ["content"],
    }
    assert "version" in out["stale"]["message"]
    assert {t.uri_template for t in out["templates"]} == {
        "clawvm://memory/{memory_id}",
        "clawvm://session/{session_id}/context",
    }
    uris = [r.uri for r in out["resources"]]
    assert uris == ["clawvm://session/s1/context", f"clawvm://memory/{fact_id}"]
    memory = json.loads(out["memory_resource"].text)
    assert out["memory_resource"].mime_type == "application/json"
    assert (memory["id"], memory["content"], memory["version"]) == (
        fact_id,
        "the staging DB password rotates weekly",
        version,
    )
    assert "deploys freeze on Fridays" in out["context_resource"].text
    assert out["forgotten_resource"] is not None and "not found" in out["forgotten_resource"]
    assert [m is not None and "budget_tokens" in m and "50 to 32000" in m for m in out["bad_budgets"]] == [
        True
    ] * 4
    assert out["bad_scope"]["field"] == "session_id" and out["blank_scope"]["field"] == "session_id"
    assert "session id" in out["bad_scope"]["fix"] and out["blank_scope"]["fix"]  # what to send instead

    with Harness.open(target, embedder=None) as h:  # what the server wrote, where it wrote it
        fact = h.get(fact_id)
        assert (fact.session_id, fact.kind, fact.version) == ("s1", Kind.NOTE, version)
        assert fact.content == "the staging DB password rotates weekly"
        assert [e.kind.value for e in h.events(memory_id=fact_id)].count("update") == 1
        assert h.list(session_id="s2") == []  # forgotten for good


def test_stdio_scope_per_call_and_the_session_lifecycle_tools(tmp_path: Path) -> None:
    """Task and agent per call over the launch defaults; pin, build_context, checkpoint and rollback through
    the official client: a pinned memory is in the context, a rollback obsoletes what came after."""
    target = str(tmp_path / "life.db")
    with Harness.open(target, embedder=None):
        pass
    launch = ["--db", target, "--no-embed", "mcp", "--session", "s1", "--task", "t0", "--agent", "a0"]
    server = StdioServerParameters(
        command=sys.executable,
        args=["-c", "from clawvm.cli import main; main()", *launch],
        cwd=str(tmp_path),
        env={**get_default_environment(), "PYTHONPATH": SRC},
    )

    async def talk() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(server, read_timeout_seconds=60) as client:
            call = client.call_tool
            out["default"] = ok(
                await call("record_memory", {"content": "the cutover window is Sunday 02:00"})
            )
            out["given"] = ok(
                await call(
                    "record_memory",
                    {"content": "billing owns the ledger migration", "task_id": "t9", "agent_id": "a9"},
                )
            )
            out["pin"] = ok(await call("pin_memory", {"memory_id": out["default"]["short_id"]}))
            out["checkpoint"] = ok(await call("checkpoint", {"name": "before the retry"}))
            out["later"] = ok(
                await call("record_memory", {"content": "retry the ledger export with batch 500"})
            )
            out["context"] = ok(
                await call("build_context", {"query": "when is the cutover", "budget_tokens": 200})
            )
            out["rollback"] = ok(
                await call("rollback", {"checkpoint_id": out["checkpoint"]["checkpoint_id"]})
            )
        return out

    out = run(talk)
    assert out["pin"]["pinned"] is True
    assert out["default"]["id"] in out["context"]["ids"] and "Sunday 02:00" in out["context"]["text"]
    assert out["context"]["tokens"] <= out["context"]["budget"] == 200
    assert out["rollback"]["obsoleted"] >= 1
    with Harness.open(target, embedder=None) as h:
        default, given, later = (h.get(out[k]["id"]) for k in ("default", "given", "later"))
        assert (default.task_id, default.agent_id, default.pinned) == ("t0", "a0", True)
        assert (given.session_id, given.task_id, given.agent_id) == ("s1", "t9", "a9")
        assert later.status == Status.OBSOLETE  # recorded after the checkpoint
        assert default.status == given.status == Status.ACTIVE


# ---- streamable HTTP on the REST app ----------------------------------------------------------------------
@dataclass(frozen=True)
class Mounted:
    url: str
    keys: dict[str, str]  # who -> API key: "a" and "b" (agents of tenants a and b), "a_reader" (read-only)
    app: Any

    def client(self, who: str | None) -> Client:
        headers = {"Authorization": f"Bearer {self.keys[who]}"} if who else {}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60))
        return Client(streamable_http_client(f"{self.url}/mcp", http_client=http), read_timeout_seconds=60)


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    db = str(tmp_path_factory.mktemp("mcp-http") / "mcp.db")
    store = store_from_url(db)
    store.setup()
    keyring = Keyring(store)
    keys = {
        "a": keyring.create("a", "agent", "agent of a")[1],
        "b": keyring.create("b", "agent", "agent of b")[1],
        "a_reader": keyring.create("a", "read-only", "reader of a")[1],
    }
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), mcp=True)
    try:
        with serve_app(app) as url:
            yield Mounted(url, keys, app)
    finally:
        store.close()


def test_http_refuses_a_missing_or_wrong_key(mounted: Mounted) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    for headers in ({}, {"Authorization": "Bearer cvm_nope_nope"}, {"X-API-Key": "wrong"}):
        r = httpx.post(f"{mounted.url}/mcp", json=hello, headers={**accept, **headers}, timeout=30)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "unauthorized"

    async def without_key() -> None:
        async with mounted.client(None) as client:
            await client.list_tools()

    with pytest.raises(Exception):  # noqa: B017 - the SDK's transport error for a 401, whatever its type
        run(without_key)


def test_http_requests_take_the_tenants_rate_limit_too(tmp_path: Path) -> None:
    """MCP charged only the key's bucket: a tenant over its limit on /v1 went on unlimited over /mcp."""
    store = store_from_url(str(tmp_path / "limited.db"))
    settings = ServerSettings(
        rate_per_s=0, tenant_rate_per_s=1 / 3600, tenant_burst=2, unauthenticated_rate_per_s=0
    )
    app = create_app(store, embedder=None, settings=settings, mcp=True)
    ring = app.state.service.keyring
    rest, agent = ring.create("a", "agent", "rest")[1], ring.create("a", "agent", "mcp")[1]
    try:
        with serve_app(app) as url:
            limited = Mounted(url, {"a": agent}, app)
            for _ in range(2):  # the tenant's two tokens, spent over REST by its other key
                assert httpx.get(f"{url}/v1/whoami", headers={"X-API-Key": rest}, timeout=30).is_success
            hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            accept = {"Accept": "application/json, text/event-stream", "X-API-Key": agent}
            r = httpx.post(f"{url}/mcp", json=hello, headers=accept, timeout=30)
            assert r.status_code == 429 and r.headers["retry-after"], r.text
            error = r.json()["error"]
            assert error["code"] == "rate_limited" and "tenant" in error["message"], error

            async def listing() -> None:
                async with limited.client("a") as client:
                    await client.list_tools()

            with pytest.raises(Exception):  # noqa: B017 - the SDK's transport error for a 429
                run(listing)
    finally:
        store.close()


def test_http_bad_keys_take_the_unauthenticated_limit(tmp_path: Path) -> None:
    """Over /mcp a bad key was a 401 without end, each one looked up: the client address's limit on failed
    keys (REST's) did not apply there."""
    store = store_from_url(str(tmp_path / "flood.db"))
    settings = ServerSettings(rate_per_s=0, unauthenticated_burst=2, unauthenticated_rate_per_s=1 / 3600)
    app = create_app(store, embedder=None, settings=settings, mcp=True)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream", "X-API-Key": "cvm_nope_nope"}
    try:
        with serve_app(app) as url:
            codes = [httpx.post(f"{url}/mcp", json=hello, headers=accept, timeout=30) for _ in range(3)]
            assert [r.status_code for r in codes] == [401, 401, 429], [r.text for r in codes]
            assert codes[2].json()["error"]["code"] == "rate_limited" and codes[2].headers["retry-after"]
    finally:
        store.close()


@contextmanager
def engine_held(store: Any, limit_s: float = 30.0) -> Iterator[threading.Event]:
    """The store engine's lock held by a thread of its own (a stand-in for a long store call: an import, a
    long recall) until the block ends, or ``limit_s`` at most; the event yielded is set as it lets go, so a
    reply seen while it is unset came while the lock was held."""
    held, release, released = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with store._lock:
            held.set()
            release.wait(limit_s)
            released.set()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    try:
        yield released
    finally:
        release.set()
        holder.join(30)


def test_http_an_unknown_key_is_looked_up_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MCP request's key, not cached, was read from the store on the event loop: while a long store call
    held the engine's lock, /healthz (and every other request of the server) waited for it too."""
    store = store_from_url(str(tmp_path / "busy.db"))
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), mcp=True)
    looking_up = threading.Event()
    find = store.find_credentials

    def noted_find(*args: Any, **kwargs: Any) -> Any:
        looking_up.set()
        return find(*args, **kwargs)

    monkeypatch.setattr(store, "find_credentials", noted_find)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    unknown = "cvm_0123456789ab_" + "x" * 32  # well-formed: looked up, never cached
    headers = {"Accept": "application/json, text/event-stream", "X-API-Key": unknown}
    answers: dict[str, httpx.Response] = {}
    try:
        with serve_app(app) as url:
            with engine_held(store) as released:
                asking = threading.Thread(
                    target=lambda: answers.update(mcp=httpx.post(f"{url}/mcp", json=hello, headers=headers)),
                    daemon=True,
                )
                asking.start()
                assert looking_up.wait(30)
                health = httpx.get(f"{url}/healthz", timeout=60)
                assert health.status_code == 200 and not released.is_set()  # answered while still held
            asking.join(30)
            assert answers["mcp"].status_code == 401, answers["mcp"].text
    finally:
        store.close()


def test_http_a_new_tenants_harness_is_made_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's first MCP call made its harness (which reads the store) on the event loop: while a long
    store call held the engine's lock, /healthz waited for it too."""
    store = store_from_url(str(tmp_path / "busy.db"))
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0), mcp=True)
    service = app.state.service
    agent = service.keyring.create("new", "agent", "first call")[1]  # cached: checked from memory
    making = threading.Event()
    make = service.harness_for

    def noted_make(tenant: str) -> Any:
        making.set()
        return make(tenant)

    monkeypatch.setattr(service, "harness_for", noted_make)
    listed: dict[str, Any] = {}
    try:
        with serve_app(app) as url:
            newcomer = Mounted(url, {"new": agent}, app)

            async def first_call() -> None:
                async with newcomer.client("new") as client:
                    listed.update(ok(await client.call_tool("list_memories", {})))

            with engine_held(store) as released:
                calling = threading.Thread(target=lambda: run(first_call), daemon=True)
                calling.start()
                assert making.wait(30)
                health = httpx.get(f"{url}/healthz", timeout=60)
                assert health.status_code == 200 and not released.is_set()  # answered while still held
            calling.join(60)
            assert listed == {"memories": [], "total": 0}
    finally:
        store.close()


def test_http_tenants_roles_and_per_call_session(mounted: Mounted) -> None:
    tenant_a = mounted.app.state.service.harness_for("a")

    async def talk() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with mounted.client("a") as a:
            out["tools"] = {t.name: t for t in (await a.list_tools()).tools}
            mine = ok(
                await a.call_tool("record_memory", {"content": "tenant a's secret plan", "session_id": "s9"})
            )
            out["mine"] = mine
            out["landed_in"] = tenant_a.get(mine["id"]).session_id  # the call's session, not a default
            out["a_list"] = ok(await a.call_tool("list_memories", {"session_id": "s9"}))
            out["a_updated"] = ok(
                await a.call_tool(
                    "update_memory", {"memory_id": mine["id"], "tags": ["plan"], "session_id": "s9"}
                )
            )
        async with mounted.client("b") as b:
            out["b_get"] = failed(
                await b.call_tool("get_memory", {"memory_id": mine["id"], "session_id": "s9"}), "not_found"
            )
            out["b_list"] = ok(await b.call_tool("list_memories", {"session_id": "s9"}))
            try:
                await b.read_resource(f"clawvm://memory/{mine['id']}")
                out["b_resource"] = None
            except MCPError as exc:
                out["b_resource"] = exc.message
        async with mounted.client("a_reader") as reader:
            out["reader_record"] = failed(
                await reader.call_tool("record_memory", {"content": "x"}), "forbidden"
            )
            out["reader_forget"] = failed(
                await reader.call_tool("forget_memory", {"memory_id": mine["id"], "session_id": "s9"}),
                "forbidden",
            )
            out["reader_recall"] = ok(
                await reader.call_tool("recall_memory", {"query": "secret plan", "session_id": "s9"})
            )
            out["reader_resource"] = (
                (await reader.read_resource(f"clawvm://memory/{mine['id']}")).contents[0].text
            )
        tenant_a.flush()  # a recall's access is written by the next pager pass: run it now, not by chance
        out["accesses_after_reader"] = tenant_a.get(mine["id"]).access_count
        async with mounted.client("a") as a:
            ok(await a.call_tool("recall_memory", {"query": "secret plan", "session_id": "s9"}))
            tenant_a.flush()
            out["accesses_after_agent"] = tenant_a.get(mine["id"]).access_count
            ok(await a.call_tool("forget_memory", {"memory_id": mine["id"], "session_id": "s9"}))
            out["a_gone"] = failed(
                await a.call_tool("get_memory", {"memory_id": mine["id"], "session_id": "s9"}), "not_found"
            )
        return out

    out = run(talk)
    assert out["tools"]["update_memory"].annotations.destructive_hint is True
    mine = out["mine"]
    assert out["landed_in"] == "s9"
    assert [m["id"] for m in out["a_list"]["memories"]] == [mine["id"]]
    assert out["a_updated"]["version"] == 2
    assert out["b_list"] == {"memories": [], "total": 0}  # tenant b sees none of tenant a's memories
    assert out["b_resource"] is not None and "not found" in out["b_resource"]
    assert [m["id"] for m in out["reader_recall"]["memories"]] == [mine["id"]]
    assert json.loads(out["reader_resource"])["tags"] == ["plan"]
    # a read-only key's recall records no usage; an agent's does
    assert (out["accesses_after_reader"], out["accesses_after_agent"]) == (0, 1)
    assert mounted.app.state.service.harness_for("b").count(session_id="s9") == 0
    with pytest.raises(clawvm.NotFoundError):  # forgotten through MCP, in tenant a's store
        tenant_a.get(mine["id"])


# ---- clawvm mcp --http --api-key ---------------------------------------------------------------------------
def test_cli_http_with_a_static_key(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "mcp.log"
    args = [
        "--db",
        str(tmp_path / "m.db"),
        "--no-embed",
        "mcp",
        "--http",
        "--port",
        str(port),
        "--session",
        "s1",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from clawvm.cli import main; main()", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": SRC, "CLAWVM_MCP_API_KEY": "s3cret-key"},
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(600):
            assert proc.poll() is None, log.read_text()
            try:
                refused = httpx.post(url, json={}, timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"

        async def talk() -> dict[str, Any]:
            http = httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret-key"}, timeout=30)
            async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=60) as c:
                recorded = ok(await c.call_tool("record_memory", {"content": "served over HTTP"}))
                return ok(await c.call_tool("get_memory", {"memory_id": recorded["id"]}))

        got = run(talk)
        assert (got["content"], got["session_id"]) == ("served over HTTP", "s1")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    said = log.read_text()  # where it serves, and how a client authenticates
    assert f"MCP over HTTP at {url}, with --api-key as the Bearer token" in said, said
    assert f"http://127.0.0.1:{port}" in said.split("MCP over HTTP", 1)[1] and "POST /mcp" not in said


def test_a_server_whose_harness_closed_says_so() -> None:
    """A memory resource answered "not found" and the resource list "Internal server error"."""
    h = Harness.open("memory://", embedder=None)
    m = h.record("hello", session_id="s1")
    server = build_server(h, session_id="s1")
    h.close()

    async def talk() -> list[str]:
        said = []
        async with Client(server, read_timeout_seconds=60) as client:
            for ask in (lambda: client.read_resource(f"clawvm://memory/{m.id}"), client.list_resources):
                with pytest.raises(MCPError) as refused:
                    await ask()
                said.append(str(refused.value))
        return said

    for message in run(talk):
        assert "harness: is closed" in message and "not found" not in message, message
        assert message.count("harness") == 1, message  # said once, not wrapped in itself


def test_recall_of_scope_task_with_no_task_is_refused_not_every_session() -> None:
    """``clawvm mcp --session s1`` (no ``--task``): recall_memory with scope "task" searched every
    session's memories. Refused naming task_id; a task given with the call is searched."""
    with Harness.open("memory://", embedder=None) as h:
        h.record("alpha s1", session_id="s1")
        h.record("alpha s2", session_id="s2")
        h.record("alpha t1", session_id="s2", task_id="t1")
        server = build_server(h, session_id="s1")

        async def talk() -> tuple[Any, Any]:
            async with Client(server, read_timeout_seconds=60) as client:
                ask = {"query": "alpha", "scope": "task", "k": 10}
                return (
                    await client.call_tool("recall_memory", ask),
                    await client.call_tool("recall_memory", {**ask, "task_id": "t1"}),
                )

        refused, given = run(talk)
    error = failed(refused, "invalid_request")
    assert error["field"] == "task_id" and "not bound" in error["message"]
    assert [m["content"] for m in ok(given)["memories"]] == ["alpha t1"]


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "clawvm.integrations.mcp_server", "--db", "x.db", "--session", ""],
        ["-m", "clawvm.integrations.mcp_server", "--db", "x.db", "--agent", "  "],
        ["-c", "from clawvm.cli import main; main()", "--db", "x.db", "mcp", "--session", "  "],
        ["-c", "from clawvm.cli import main; main()", "--db", "x.db", "mcp", "--task", ""],
    ],
)
def test_a_blank_launch_flag_is_one_line_of_error_and_no_store(command: list[str], tmp_path: Path) -> None:
    """``python -m clawvm.integrations.mcp_server --session ""`` printed a traceback, after creating the
    store; both launchers now say one line and open (create) nothing."""
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    said = done.stderr.strip()
    flag = command[-2]
    assert done.returncode == 2 and "Traceback" not in said and said.splitlines() == [said], said
    assert said.startswith(f"error: {flag}: is blank") and f"leave {flag} out" in said, said
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_a_blank_scope_before_it_opens_the_store(tmp_path: Path) -> None:
    from clawvm.integrations.mcp_server import run as serve

    with pytest.raises(ValidationError) as exc:
        serve(str(tmp_path / "new.db"), session_id="s1", task_id=" ")
    assert exc.value.field == "task_id" and list(tmp_path.iterdir()) == []


def test_a_blank_default_scope_is_refused_when_the_server_is_built() -> None:
    """``clawvm mcp --session ""`` (an empty variable) served tools bound to no session at all."""
    with Harness.open("memory://", embedder=None) as h:
        with pytest.raises(ValidationError) as exc:
            build_server(h, session_id="  ")
        assert exc.value.field == "session_id"
