"""AgentWithMemory: guidance before each reply, the exchange recorded after; and the planner / writer /
reviewer example team end to end against a real OpenAI-compatible HTTP server on loopback that replays
scripted replies."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawvm import Harness, Kind, Status, ValidationError
from clawvm.agents.agent import GUIDANCE_INTRO, AgentWithMemory
from clawvm.core.model import Scope
from clawvm.teams import shared as teams
from engines import harness_target
from loopback import ChatReplay

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "team.py"
_spec = importlib.util.spec_from_file_location("team_example", EXAMPLE)
assert _spec is not None and _spec.loader is not None
team_example = importlib.util.module_from_spec(_spec)
sys.modules["team_example"] = team_example  # its dataclasses look their module up while being built
_spec.loader.exec_module(team_example)


class EchoAgent:
    """Any agent with reply(messages) -> str: this one keeps what it was given and answers from a list."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.seen: list[list[dict[str, str]]] = []

    def reply(self, messages: list[dict[str, str]]) -> str:
        self.seen.append(messages)
        return self.answers.pop(0)


@pytest.fixture
def lexical(engine_name: str, tmp_path: Path) -> Iterator[Harness]:
    h = Harness.open(harness_target(engine_name, tmp_path, "agent.db"), embedder=None)
    try:
        yield h
    finally:
        h.close()


def test_guidance_goes_first_and_the_exchange_is_recorded(engine_name: str, lexical: Harness) -> None:
    h = lexical
    h.grant("docs", "writer", write=True)
    pitfall = teams.record(h, "Release notes must mention breaking API changes", agent_id="writer",
                           team_id="docs", kind="knowledge", tags=[teams.PITFALL_TAG])
    inner = EchoAgent(["Billing v3: the invoice API now paginates (breaking change)."])
    agent = AgentWithMemory(inner, h, "writer", team_id="docs", session_id="s1", budget_tokens=200)
    agent.start_task("t1", "release-note")
    user = {"role": "user", "content": "Write the release note about the billing API"}
    answer = agent.reply([user])
    assert answer.startswith("Billing v3")
    system, given = inner.seen[0]
    assert system["role"] == "system" and system["content"].startswith(GUIDANCE_INTRO)
    assert pitfall.content in system["content"] and given == user
    assert agent.last_guidance is not None and agent.last_guidance.ids == [pitfall.id]
    reply = agent.last_reply
    assert reply is not None and reply.content == answer
    assert (reply.kind, reply.scope, reply.team_id) == (Kind.OBSERVATION, Scope.TEAM, "docs")
    assert reply.task_id == "t1"
    assert teams.task_type_tag("release-note") in reply.tags
    (asked,) = h.list(kind=Kind.USER_INPUT)
    assert (asked.content, asked.scope, asked.agent_id, asked.session_id) == (
        user["content"], Scope.PRIVATE, "writer", "s1"
    )
    agent.feedback(adopted=True)
    assert teams.adoption(h.get(pitfall.id)) == (1, 0)
    # no guidance: the messages pass through untouched; an empty answer records no reply
    fresh = AgentWithMemory(EchoAgent(["fine", ""]), h, "stranger")
    assert fresh.reply([{"role": "user", "content": "hello there"}]) == "fine"
    assert fresh.agent.seen[-1] == [{"role": "user", "content": "hello there"}]  # type: ignore[attr-defined]
    before = h.count(agent_id="stranger", kind=Kind.OBSERVATION)
    assert fresh.reply([{"role": "user", "content": "and again"}]) == ""
    assert h.count(agent_id="stranger", kind=Kind.OBSERVATION) == before


# ---- the example team against a loopback OpenAI-compatible server ----------------------------------------
SCRIPT = {  # role -> replies, in order (three tasks)
    "planner": [
        "- outline the change\nDECISION: tone :: Use a formal tone",
        "- outline the change\nDECISION: tone :: Use a friendly tone",
        "- outline the change\nDECISION: tone :: Use a friendly tone",
    ],
    "writer": [
        "Billing v2 is out. Invoices are faster.",
        "Invoicing v3 is out. Exports are faster.",
        "Payments v4 is out. The refund API changed: amounts are now in cents.",
    ],
    "reviewer": [
        "ISSUE: The draft does not mention the breaking API change",
        "ISSUE: The draft does not mention the breaking API change of the export endpoint",
        "OK",
    ],
}


def role_of(body: dict[str, Any]) -> str:
    """Which member of the team sent a chat request (its system prompt says "You are the <role>")."""
    return next(r for r in SCRIPT if f"You are the {r}" in body["messages"][0]["content"])


@pytest.fixture
def llm() -> Iterator[ChatReplay]:
    replies = {role: list(texts) for role, texts in SCRIPT.items()}
    with ChatReplay(answer=lambda body: replies[role_of(body)].pop(0)) as server:
        yield server


def guidance_of(request: dict[str, Any]) -> str:
    """The team-memory system message the wrapper put in front of the conversation ('' if none)."""
    messages = request["json"]["messages"]
    return next((m["content"] for m in messages[1:] if m["role"] == "system"), "")


@pytest.mark.engines("sqlite", "postgres")  # the example's store is reopened afterwards: it must persist
def test_example_team_learns_across_tasks(
    engine_name: str, tmp_path: Path, llm: ChatReplay, capsys: pytest.CaptureFixture[str]
) -> None:
    db = harness_target(engine_name, tmp_path, "team.db")
    tasks = ["Release note for billing v2", "Release note for invoicing v3", "Release note for payments v4"]
    args = [
        "--base-url", llm.v1, "--model", "tiny", "--api-key", "k", "--db", db, "--task-type", "release-note"
    ]
    assert team_example.main([*args, "--no-embed", *tasks]) == 0
    out = capsys.readouterr().out
    assert "== task-3: Release note for payments v4" in out
    reqs = llm.requests
    assert [role_of(r["json"]) for r in reqs] == ["planner", "writer", "reviewer"] * 3
    assert all(r["path"] == "/v1/chat/completions" and r["json"]["model"] == "tiny" for r in reqs)
    first_writer, second_writer, third_writer = (r for r in reqs if role_of(r["json"]) == "writer")
    assert "breaking API change" not in guidance_of(first_writer)
    assert "breaking API change" in guidance_of(second_writer)  # the reviewer's issue on task 1
    third = guidance_of(third_writer)
    assert "Recurring error (seen 2 times)" in third  # fused into one pitfall after task 2
    assert "friendly tone" in third and "formal tone" not in third  # the decision was revised
    with Harness.open(db, embedder=None) as h:
        (tone,) = h.list(kind=Kind.DECISION)
        assert tone.content == "Use a friendly tone" and tone.metadata["revision"]["number"] == 2
        assert [m.status for m in h.history(tone.id)] == [Status.OBSOLETE, Status.ACTIVE]
        (pitfall,) = h.list(kind=Kind.KNOWLEDGE, tags=[teams.PITFALL_TAG])
        assert pitfall.metadata["source_tasks"] == ["task-1", "task-2"]
        assert h.count(kind=Kind.ERROR) == 0 and h.count(kind=Kind.ERROR, status="archived") == 2


def test_a_reply_the_agent_may_not_record_is_still_answered(engine_name: str, lexical: Harness) -> None:
    """A read-only member's reply raised AccessDeniedError after its input was saved: the answer was lost."""
    lexical.grant("pay", "writer")  # read only
    agent = AgentWithMemory(EchoAgent(["refunds go to the card"]), lexical, "writer", team_id="pay")
    assert agent.reply([{"role": "user", "content": "write about refunds"}]) == "refunds go to the card"
    assert agent.last_reply is None and agent.last_record_error is not None
    assert agent.last_record_error.field == "team_id"  # type: ignore[attr-defined]
    with pytest.raises(ValidationError) as exc:  # a plain string failed with AttributeError
        agent.reply("hello")  # type: ignore[arg-type]
    assert exc.value.field == "messages"
    silent = AgentWithMemory(EchoAgent([None]), lexical, "writer")  # type: ignore[list-item]
    with pytest.raises(ValidationError) as exc:
        silent.reply([{"role": "user", "content": "hi"}])
    assert exc.value.field == "reply"
