"""LangChain: a callback handler that records tool calls and LLM outputs into ClawVM by itself.

``ClawVMCallbackHandler(harness, session_id=..., task_id=..., agent_id=...)`` passed in a runnable's
``callbacks`` (or ``config={"callbacks": [...]}``) records:

- ``on_tool_start``: a PENDING ``tool_call`` (the tool's name, its parsed inputs, or ``{"input": str}``);
- ``on_tool_end``: a SUCCESS ``tool_result`` linked to it (``parent_id``), with the duration as cost;
- ``on_tool_error``: an ERROR ``tool_result`` with the exception type, message, short traceback and
  timeout flag — the same trail as :mod:`clawvm.agents.toolcalls`, so reliability learning sees these calls
  too;
- ``on_llm_end``: an ``llm_thought`` (SUCCESS) with the generated text and any tool calls the model
  asked for, token usage as cost; ``on_llm_error``: an ``error`` memory.
"""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult

from clawvm.agents.toolcalls import ToolCall, ToolSpec, scope_fields
from clawvm.core.model import Cost, Kind, State
from clawvm.harness import Harness


class ClawVMCallbackHandler(BaseCallbackHandler):
    """Records LangChain tool runs and LLM outputs (see the module docstring)."""

    def __init__(
        self,
        harness: Harness,
        *,
        session_id: str | None = None,
        task_id: str | None = None,
        agent_id: str | None = None,
        record_llm: bool = True,
    ) -> None:
        self.harness = harness
        self.scope = scope_fields(session_id, task_id, agent_id)
        self.record_llm = record_llm
        self._calls: dict[UUID, ToolCall] = {}
        self._lock = threading.Lock()

    # ---- tools ----------------------------------------------------------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        args = dict(inputs) if inputs is not None else {"input": input_str}
        call = ToolCall(self.harness, ToolSpec(str(name)), args, **self.scope)
        call.start()
        with self._lock:
            self._calls[run_id] = call

    def on_tool_end(
        self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        call = self._pop(run_id)
        if call is not None:
            # a ToolMessage (tool invoked with a tool call) carries the result in .content
            call.succeed(getattr(output, "content", output))

    def on_tool_error(
        self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        call = self._pop(run_id)
        if call is not None:
            call.fail(error)

    # ---- LLM outputs ----------------------------------------------------------------------------------
    def on_llm_end(
        self,
        response: LLMResult,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.record_llm:
            return
        texts, tool_calls = [], []
        for candidates in response.generations:
            for gen in candidates[:1]:  # the chosen candidate of each prompt
                if gen.text:
                    texts.append(gen.text)
                message = getattr(gen, "message", None)
                for tc in getattr(message, "tool_calls", None) or []:
                    tool_calls.append({"name": tc.get("name"), "args": tc.get("args")})
        if not texts and not tool_calls:
            return
        content: Any = (
            "\n".join(texts) if not tool_calls else {"text": "\n".join(texts), "tool_calls": tool_calls}
        )
        self.harness.record(
            content,
            kind=Kind.LLM_THOUGHT,
            state=State.SUCCESS,
            cost=Cost(tokens=_total_tokens(response)),
            metadata={"langchain": {"run_id": str(run_id)}},
            **self.scope,
        )

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.record_llm:
            self.harness.record(
                f"LLM call failed: {type(error).__name__}: {error}",
                kind=Kind.ERROR,
                state=State.ERROR,
                metadata={"langchain": {"run_id": str(run_id)}, "error": {"type": type(error).__name__}},
                **self.scope,
            )

    def _pop(self, run_id: UUID) -> ToolCall | None:
        with self._lock:
            return self._calls.pop(run_id, None)


def _total_tokens(response: LLMResult) -> int:
    """Token usage as providers report it: ``llm_output.token_usage`` or the messages' usage metadata."""
    usage = (response.llm_output or {}).get("token_usage") or {}
    if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
        return int(usage["total_tokens"])
    total = 0
    for candidates in response.generations:
        for gen in candidates[:1]:
            meta = getattr(getattr(gen, "message", None), "usage_metadata", None) or {}
            total += int(meta.get("total_tokens", 0))
    return total
