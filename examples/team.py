"""A planner / writer / reviewer team sharing ClawVM memory (ConMem), against any OpenAI-compatible endpoint.

    python examples/team.py --base-url http://localhost:11434/v1 --model llama3.1 --db team.db \\
        --task-type release-note "Release note for billing v2" "Release note for invoicing v3"

Each agent is a plain chat client wrapped in :class:`clawvm.agents.agent.AgentWithMemory`: before every reply
it
receives the team's guidance for the task (rules, pitfalls from earlier reviews, current decisions, open
conflicts) as a system message, and its reply is recorded for the team. Replies follow two line
conventions any model can keep:

- the planner writes ``DECISION: <subject> :: <decision>``: the first decision on a subject is recorded
  as a DECISION; a later one on the same subject *revises* it (the old one becomes obsolete, so nobody is
  guided by it again);
- the reviewer writes ``ISSUE: <what is wrong>`` for each problem: recorded as an ERROR of the task type.

After each task the team's memory is fused: repeated issues become one pitfall (KNOWLEDGE) that guidance
shows to the writer on the next task of that type. The endpoint, model and key come from the options or
``OPENAI_BASE_URL`` / ``OPENAI_MODEL`` / ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clawvm import Harness, Kind
from clawvm.agents.agent import AgentWithMemory, Message
from clawvm.core.openai_http import post_json
from clawvm.teams import shared as teams
from clawvm.teams.merge import merge_team

TEAM = "docs"
ROLES = {
    "planner": (
        "You are the planner of a small writing team. Plan the task in a few bullet points. State each "
        "decision on its own line as 'DECISION: <subject> :: <decision>'."
    ),
    "writer": (
        "You are the writer of a small writing team. Write what the task asks, following the plan and the "
        "team memory you are given. Reply with the text only."
    ),
    "reviewer": (
        "You are the reviewer of a small writing team. Check the draft against the task. List each problem "
        "on its own line as 'ISSUE: <problem>'; reply 'OK' when there is none."
    ),
}
_DECISION = re.compile(r"^\s*DECISION:\s*(?P<subject>.+?)\s*::\s*(?P<text>.+?)\s*$", re.M)
_ISSUE = re.compile(r"^\s*ISSUE:\s*(?P<text>.+?)\s*$", re.M)


@dataclass
class ChatClient:
    """The smallest agent there is: one system prompt and an OpenAI-compatible chat endpoint."""

    base_url: str
    model: str
    system: str
    api_key: str = ""
    timeout_s: float = 60.0

    def reply(self, messages: list[Message]) -> str:
        system = {"role": "system", "content": self.system}
        payload = {"model": self.model, "temperature": 0, "messages": [system, *messages]}
        answer = post_json(self.base_url, "/chat/completions", payload, self.api_key, self.timeout_s)
        return str(answer["choices"][0]["message"]["content"])


@dataclass
class TaskResult:
    task_id: str
    plan: str
    draft: str
    review: str
    decisions: list[str] = field(default_factory=list)  # ids recorded or revised
    issues: list[str] = field(default_factory=list)  # ERROR ids
    guidance_tokens: dict[str, int] = field(default_factory=dict)  # per agent


def build_team(h: Harness, base_url: str, model: str, api_key: str = "") -> dict[str, AgentWithMemory]:
    """Three agents with read/write on the team, each wrapped with the team's memory."""
    team = {}
    for role, system in ROLES.items():
        h.grant(TEAM, role, read=True, write=True)
        client = ChatClient(base_url, model, system, api_key)
        # plans and reviews are recorded as the decisions and issues parsed out of them; drafts as they are
        record_as = Kind.OBSERVATION if role == "writer" else None
        team[role] = AgentWithMemory(client, h, role, team_id=TEAM, budget_tokens=400, record_as=record_as)
    return team


def record_decisions(h: Harness, task_id: str, task_type: str, plan: str) -> list[str]:
    """DECISION lines of the plan: a new subject is recorded, a known one revised (never duplicated)."""
    readable = teams.visibility(h, "planner")
    current = {
        str(m.metadata.get("subject", "")).lower(): m
        for m in h.list(limit=1000, kind=Kind.DECISION, team_id=TEAM, visible_to=readable)
    }
    ids = []
    for match in _DECISION.finditer(plan):
        subject, text = match["subject"].strip(), match["text"].strip()
        known = current.get(subject.lower())
        if known is None:
            m = teams.record(
                h, text, agent_id="planner", kind=Kind.DECISION, team_id=TEAM, task_id=task_id,
                task_type=task_type, subject=subject,
            )
        elif known.content != text:

            def change(head: Any, text: str = text) -> dict[str, Any]:
                return {"content": text, "task_id": task_id}

            m = teams.revise_with_retry(h, known.id, change, agent_id="planner")
        else:
            m = known
        current[subject.lower()] = m
        ids.append(m.id)
    return ids


def run_task(
    h: Harness, team: dict[str, AgentWithMemory], task_id: str, task_type: str, text: str
) -> TaskResult:
    for agent in team.values():
        agent.start_task(task_id, task_type)
    plan = team["planner"].reply([{"role": "user", "content": f"Task: {text}"}])
    decisions = record_decisions(h, task_id, task_type, plan)
    draft = team["writer"].reply([{"role": "user", "content": f"Task: {text}\n\nPlan:\n{plan}"}])
    review = team["reviewer"].reply([{"role": "user", "content": f"Task: {text}\n\nDraft:\n{draft}"}])
    issues = [
        teams.record(
            h, m["text"], agent_id="reviewer", kind=Kind.ERROR, team_id=TEAM, task_id=task_id,
            task_type=task_type,
        ).id
        for m in _ISSUE.finditer(review)
    ]
    tokens = {role: a.last_guidance.tokens if a.last_guidance else 0 for role, a in team.items()}
    merge_team(h, team_id=TEAM)
    return TaskResult(task_id, plan, draft, review, decisions, issues, tokens)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="+", help="Task descriptions, run in order.")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://localhost:11434/v1"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "llama3.1"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    parser.add_argument("--db", default="team.db", help="ClawVM store (path, sqlite:///PATH or memory://).")
    parser.add_argument("--task-type", default="writing", help="Type of every task (guidance matches on it).")
    parser.add_argument("--no-embed", action="store_true", help="Lexical recall only (no embedding model).")
    args = parser.parse_args(argv)
    with Harness.open(args.db, embedder=None if args.no_embed else "default") as h:
        team = build_team(h, args.base_url, args.model, args.api_key)
        for n, text in enumerate(args.tasks, start=1):
            result = run_task(h, team, f"task-{n}", args.task_type, text)
            print(f"== {result.task_id}: {text}")
            print(f"guidance tokens: {result.guidance_tokens}")
            print(f"decisions: {len(result.decisions)}  issues: {len(result.issues)}")
            print(result.draft)
    return 0


if __name__ == "__main__":
    sys.exit(main())
