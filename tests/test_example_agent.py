"""The example research agent end to end, against a real OpenAI-compatible HTTP server on loopback that
replays scripted tool-calling responses; and session restore after the agent is killed mid-call."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawvm import Harness, Memory, State
from clawvm.agents.toolcalls import INTERRUPTED
from engines import harness_target
from loopback import ChatReplay

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "research_agent.py"
_spec = importlib.util.spec_from_file_location("research_agent", EXAMPLE)
assert _spec is not None and _spec.loader is not None
research_agent = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(research_agent)

PAGES = {"/status/payments": "payments: degraded, p95 2300 ms", "/status/ledger": "ledger: ok, lag 0 s"}


@pytest.fixture
def llm() -> Iterator[ChatReplay]:
    """Chat completions answered from ``llm.script`` in order; a few plain pages for the agent to fetch."""
    with ChatReplay(pages=dict(PAGES)) as server:
        yield server


def hang_until_stopped(server: ChatReplay, marker: Path) -> None:
    """``GET /hang`` writes ``marker`` and then does not answer until the test ends."""

    def hang() -> None:
        marker.write_text("the agent is waiting on /hang")
        server.stopping.wait(120)

    server.pages["/hang"] = hang


_ids = iter(range(10**6))


def calls(*pairs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{next(_ids)}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a)},
            }
            for n, a in pairs
        ],
    }


def final(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def trail(h: Harness, tool: str) -> list[tuple[Memory, Memory]]:
    pairs = []
    for call in sorted(h.list(limit=100, kind="tool_call", tool_name=tool), key=lambda m: m.id):
        (result,) = h.list(limit=10, kind="tool_result", parent_id=call.id)
        pairs.append((call, result))
    return pairs


def test_agent_records_its_trail_and_uses_it_for_the_next_question(
    harness: Harness, llm: ChatReplay
) -> None:
    base = llm.url
    llm.script = [
        calls(("fetch_url", {"url": f"{base}/status/payments"})),
        calls(
            ("fetch_url", {"url": f"{base}/status/missing"}),
            ("record_memory", {"content": "payments API degraded: p95 2300 ms", "kind": "observation"}),
        ),
        calls(("calculate", {"expression": "2300 / 1000"}), ("calculate", {"expression": "import os"})),
        final("The payments API is degraded (p95 2.3 s)."),
        final("Earlier we found the payments API degraded."),
    ]
    chat = research_agent.openai_chat(f"{base}/v1", "scripted-model", "sk-test")
    agent = research_agent.ResearchAgent(
        harness, chat, session_id="ops-1", task_id="payments", fetch_timeout_s=30
    )
    assert agent.ask("Is the payments API healthy?") == "The payments API is degraded (p95 2.3 s)."

    # the trail: every own-tool call PENDING first, then one SUCCESS/ERROR result linked to it
    (ok_call, ok), (bad_call, bad) = trail(harness, "fetch_url")
    assert ok_call.content_json() == {"tool": "fetch_url", "args": {"url": f"{base}/status/payments"}}
    assert (ok_call.state, ok.state) == (State.SUCCESS, State.SUCCESS)
    assert ok.content == f"GET {base}/status/payments -> 200: payments: degraded, p95 2300 ms"
    assert (bad_call.state, bad.state) == (State.ERROR, State.ERROR)
    assert bad.content.startswith("HTTPError: HTTP Error 503")
    for call, result in [(ok_call, ok), (bad_call, bad)]:
        assert result.parent_id == call.id and (call.session_id, call.task_id) == ("ops-1", "payments")
        kinds = [(e.kind, e.data.get("fields")) for e in harness.events(memory_id=call.id)]
        assert kinds[0][0] == "add" and ("update", ["metadata", "state"]) in kinds  # PENDING, then closed
    (_, ok_result), (_, bad_result) = trail(harness, "calculate")
    assert ok_result.content == "2300 / 1000 = 2.3" and bad_result.state is State.ERROR
    (observation,) = harness.list(kind="observation", session_id="ops-1")
    assert observation.content == "payments API degraded: p95 2300 ms"

    # what went over the wire: the tools offered, the tool replies the model saw
    first = llm.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["headers"]["Authorization"] == "Bearer sk-test"
    offered = [t["function"]["name"] for t in first["json"]["tools"]]
    assert offered[:2] == ["fetch_url", "calculate"] and "record_memory" in offered and "rollback" in offered
    replies = [m for m in llm.requests[2]["json"]["messages"] if m["role"] == "tool"]
    assert json.loads(replies[-2]["content"])["ok"] is False  # the 503, as a tool error, not a crash
    assert json.loads(replies[-1]["content"])["ok"] is True

    # the second question: the context in the system prompt holds what the first one found
    assert (
        agent.ask("What did we find about payments earlier?") == "Earlier we found the payments API degraded."
    )
    system = llm.requests[-1]["json"]["messages"][0]["content"]
    assert "payments: degraded, p95 2300 ms" in system  # a tool result
    assert "HTTPError: HTTP Error 503" in system  # a tool error
    assert "payments API degraded: p95 2300 ms" in system  # what the model recorded itself
    assert "The payments API is degraded (p95 2.3 s)." in system  # the earlier answer
    assert llm.requests[-1]["json"]["messages"][1] == {
        "role": "user",
        "content": "What did we find about payments earlier?",
    }


@pytest.mark.engines("sqlite", "postgres")
def test_session_restore_after_the_agent_is_killed_mid_call(
    engine_name: str, tmp_path: Path, llm: ChatReplay
) -> None:
    base = llm.url
    hanging = tmp_path / "hanging"
    hang_until_stopped(llm, hanging)
    llm.script = [
        calls(("fetch_url", {"url": f"{base}/status/ledger"})),
        calls(("fetch_url", {"url": f"{base}/hang"})),
        final("The ledger check was cut off; the last known status was ok."),  # after the restart
    ]
    target = harness_target(engine_name, tmp_path, "agent.db")
    command = [
        sys.executable,
        str(EXAMPLE),
        "--base-url",
        f"{base}/v1",
        "--model",
        "scripted",
        "--db",
        target,
        "--session",
        "s-kill",
        "--embedder",
        "none",
        "--fetch-timeout",
        "300",
    ]
    first = subprocess.Popen(
        [*command, "Check the ledger service"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not hanging.exists():  # the agent has recorded the call and is blocked in it
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the agent never reached the hanging call"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL

    second = subprocess.run(
        [*command, "What happened with the ledger check?"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr
    assert "restored session s-kill: 1 interrupted call(s)" in second.stdout
    assert "A: The ledger check was cut off; the last known status was ok." in second.stdout

    system = llm.requests[-1]["json"]["messages"][0]["content"]
    assert "ledger: ok, lag 0 s" in system  # the earlier tool result survived the kill
    assert f'"url":"{base}/hang"' in system  # the call that was cut off ...
    assert "fetch_url call interrupted" in system  # ... and what became of it

    with Harness.open(target, embedder=None) as h:
        (done, lost) = sorted(h.list(kind="tool_call", session_id="s-kill"), key=lambda m: m.id)
        assert done.state is State.SUCCESS
        assert lost.state is State.ERROR and INTERRUPTED in lost.tags
        assert lost.metadata["tool_call"]["status"] == INTERRUPTED
        (outcome,) = h.list(kind="tool_result", parent_id=lost.id)
        assert outcome.state is State.ERROR and outcome.metadata["tool_result"]["interrupted"] is True
        assert any(e.kind == "tool_interrupted" for e in h.events(memory_id=lost.id))
        assert h.restore_session("s-kill").interrupted == []  # nothing left to restore
