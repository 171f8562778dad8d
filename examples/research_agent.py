"""A research/ops agent whose memory is managed by ClawVM, against any OpenAI-compatible chat endpoint.

    python examples/research_agent.py --base-url http://localhost:11434/v1 --model llama3.1 \\
        --db research.db --session ops-1 "Is the payments API healthy?" "What did we find earlier?"

For each question the agent builds a context from memory (pinned and working memories of the session,
retrieved ones, warnings about unreliable tools) into its system prompt, then lets the model call tools
until it answers:

- its own tools, ``fetch_url`` and ``calculate``, recorded automatically by ``@harness.tool``: a PENDING
  ``tool_call`` before each run, a SUCCESS or ERROR ``tool_result`` linked to it after — the model does
  not have to remember to write anything down;
- ClawVM's agent tools (``record_memory``, ``recall_memory``, ``build_context``, ``checkpoint``,
  ``rollback``, ``pin_memory``, ``forget_memory``, ``summarize_task``) through their dispatcher.

On start it restores the session: a call left PENDING by a run that was killed is marked interrupted,
so the next context tells the model what happened. The endpoint, model and key come from the options or
``OPENAI_BASE_URL`` / ``OPENAI_MODEL`` / ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from clawvm import Harness, Kind, State
from clawvm.agents.tools import AgentTools
from clawvm.core.openai_http import post_json

SYSTEM = (
    "You are a careful research and operations agent. Use tools to find facts; do not guess. "
    "Your memory of earlier work in this session follows; lines are [short id date] kind: content. "
    "Record important findings with record_memory. Answer briefly, citing short ids when you use a memory."
)

OWN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fetch_url",
            "description": "HTTP GET a URL and return its status and the start of its body.",
            "parameters": {
                "type": "object",
                "properties": {"url": {"type": "string", "description": "http(s) URL"}},
                "required": ["url"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression (+ - * / ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
]

Chat = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]


def openai_chat(base_url: str, model: str, api_key: str, timeout_s: float = 120.0) -> Chat:
    """One chat-completions round trip: messages + tools -> the assistant message."""

    def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        payload = {"model": model, "messages": messages, "tools": tools, "tool_choice": "auto"}
        reply = post_json(base_url, "/chat/completions", payload, api_key, timeout_s)
        message: dict[str, Any] = reply["choices"][0]["message"]
        return message

    return chat


def own_tools(
    harness: Harness, session_id: str, task_id: str | None, fetch_timeout_s: float
) -> dict[str, Any]:
    """The agent's own tools, each recorded by the harness on every call."""

    @harness.tool(
        template="GET {args[url]} -> {result[status]}: {result[body]}",
        validator=lambda r: None if r["body"].strip() else "empty body",
        session_id=session_id,
        task_id=task_id,
    )
    def fetch_url(url: str) -> dict[str, Any]:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"not an http(s) URL: {url!r}")
        with urllib.request.urlopen(url, timeout=fetch_timeout_s) as resp:
            return {"status": resp.status, "body": resp.read(2000).decode("utf-8", "replace")}

    @harness.tool(template="{args[expression]} = {result}", session_id=session_id, task_id=task_id)
    def calculate(expression: str) -> float:
        return _arithmetic(ast.parse(expression, mode="eval").body)

    return {"fetch_url": fetch_url, "calculate": calculate}


class ResearchAgent:
    """The loop: context -> model -> tools -> ... -> answer, everything recorded in ``harness``."""

    def __init__(
        self,
        harness: Harness,
        chat: Chat,
        *,
        session_id: str,
        task_id: str | None = None,
        budget_tokens: int = 1500,
        max_steps: int = 8,
        fetch_timeout_s: float = 15.0,
    ) -> None:
        self.harness, self.chat = harness, chat
        self.session_id, self.task_id = session_id, task_id
        self.budget_tokens, self.max_steps = budget_tokens, max_steps
        self.memory_tools = AgentTools(harness, session_id=session_id, task_id=task_id)
        self.tools = own_tools(harness, session_id, task_id, fetch_timeout_s)
        self.schemas = OWN_TOOLS + self.memory_tools.schemas()

    def restore(self) -> list[str]:
        """Mark calls a killed run left PENDING as interrupted; returns their ids."""
        return self.harness.restore_session(self.session_id).interrupted

    def ask(self, question: str) -> str:
        ctx = self.harness.context(
            question, budget_tokens=self.budget_tokens, session_id=self.session_id, task_id=self.task_id
        )
        asked = self.harness.record(
            question, kind=Kind.USER_INPUT, session_id=self.session_id, task_id=self.task_id
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"{SYSTEM}\n\nMemory:\n{ctx.text or '(empty)'}"},
            {"role": "user", "content": question},
        ]
        for _ in range(self.max_steps):
            message = self.chat(messages, self.schemas)
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                answer = str(message.get("content") or "").strip() or "(no answer)"
                self.harness.record(
                    answer,
                    kind=Kind.LLM_THOUGHT,
                    state=State.SUCCESS,
                    tags=["answer"],
                    parent_id=asked.id,
                    session_id=self.session_id,
                    task_id=self.task_id,
                )
                return answer
            messages.extend(self.run_tool(call) for call in calls)
        return f"(no answer after {self.max_steps} steps)"

    def run_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        """One tool call of the model -> the tool message. Own tools are recorded by their decorator."""
        fn = call.get("function") or {}
        name = str(fn.get("name"))
        if name not in self.tools:
            return self.memory_tools.tool_message(call)
        try:
            args = json.loads(fn.get("arguments") or "{}")
            reply: dict[str, Any] = {"ok": True, "result": self.tools[name](**args)}
        except Exception as exc:  # already recorded as ERROR by the decorator; the model sees it and adapts
            reply = {"ok": False, "error": {"type": type(exc).__name__, "message": str(exc)}}
        return {"role": "tool", "tool_call_id": call.get("id", ""), "content": json.dumps(reply, default=str)}


_OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arithmetic(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.operand))
    raise ValueError("only numbers and + - * / ** are allowed")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("questions", nargs="+")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://localhost:11434/v1"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "llama3.1"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument(
        "--db", default="research_agent.db", help="a path, sqlite:///path, or another store URL"
    )
    parser.add_argument("--session", default="research", help="reuse it to continue (or restore) a session")
    parser.add_argument("--task")
    parser.add_argument("--budget", type=int, default=1500, help="context token budget")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--fetch-timeout", type=float, default=15.0)
    parser.add_argument("--embedder", choices=["default", "none"], default="default")
    args = parser.parse_args(argv)
    with Harness.open(args.db, embedder=args.embedder) as harness:
        agent = ResearchAgent(
            harness,
            openai_chat(args.base_url, args.model, args.api_key),
            session_id=args.session,
            task_id=args.task,
            budget_tokens=args.budget,
            max_steps=args.max_steps,
            fetch_timeout_s=args.fetch_timeout,
        )
        interrupted = agent.restore()
        if interrupted:
            print(f"restored session {args.session}: {len(interrupted)} interrupted call(s)", flush=True)
        for question in args.questions:
            print(f"Q: {question}", flush=True)
            print(f"A: {agent.ask(question)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
