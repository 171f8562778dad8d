"""LangChain: a callback handler that records tool calls and LLM outputs, a retriever over recall, and a
chat message history over a session.

**Callbacks.** ``ClawVMCallbackHandler(harness, session_id=..., task_id=..., agent_id=...)`` passed in a
runnable's ``callbacks`` (or ``config={"callbacks": [...]}``) records:

- ``on_tool_start``: a PENDING ``tool_call`` (the tool's name, its parsed inputs, or ``{"input": str}``),
  linked (``parent_id``) to the ``llm_thought`` that asked for it: the thought whose tool calls hold the
  run's ``tool_call_id``, else the latest thought of the same parent run that asked for a tool of that
  name (a chain that feeds a model's arguments to a tool without the call id);
- ``on_tool_end``: a SUCCESS ``tool_result`` linked to the call, with the duration as cost — or an ERROR
  one when LangChain handled the tool's error itself (``handle_tool_error``, ``handle_validation_error``:
  the tool returns a ``ToolMessage`` with ``status="error"``), so reliability counts it as a failure.
  LangChain reports a handled error with a ``ToolMessage`` only when the tool was invoked with a tool
  call (as agents invoke tools); invoked with plain arguments the tool returns the handler's text and
  the callback cannot tell it from a result;
- ``on_tool_error``: an ERROR ``tool_result`` with the exception type, message, short traceback and
  timeout flag — the same trail as :mod:`clawvm.agents.toolcalls`;
- ``on_llm_end``: an ``llm_thought`` (SUCCESS) with the generated text and any tool calls the model
  asked for (name, arguments, id), token usage as cost; ``on_llm_error``: an ``error`` memory.

Every ``tool_call``, ``llm_thought`` and ``error`` record carries ``metadata.langchain``: the LangChain
``run_id``, ``parent_run_id`` and, for a tool call, ``tool_call_id``; a ``tool_result`` reaches them through
its call (its ``parent_id``, and ``metadata.tool_result.call_id``). Prompts are recorded only when asked
(``record_prompts=True``): the messages a chat model was given (``on_chat_model_start``) or a completion
model's prompts (``on_llm_start``) go into the thought's (or the error's) ``metadata.langchain.prompt``,
through the write path like any metadata (so redaction applies), never as memories of their own (a prompt
repeats the conversation it carries).

**Retriever.** ``ClawVMRetriever(harness=h, k=4, filters={...})`` is a ``BaseRetriever``: ``invoke(query)``
gives the ``k`` best memories of :meth:`Harness.recall` as ``Document`` objects, with ``id``, ``score``,
``kind``, ``tier`` (and the scope fields that are set) in ``metadata``.

**Chat message history.** ``ClawVMChatMessageHistory(h, session_id)`` is a ``BaseChatMessageHistory``: each
message is a memory of that session (human: ``user_input``, AI: ``llm_thought``, system: ``note``, any
other: ``observation``), tagged ``chat``, its text as content (so recall finds it) and the whole message
in ``metadata.langchain_message``; ``add_messages`` stores all it is given or none; ``messages`` reads them
back oldest first; ``clear()`` forgets them (the session's other memories stay). A history given an
``agent_id`` or ``task_id`` reads and clears only the messages written with them (a blank one is refused,
not read as none); one given neither is the whole session's: it reads and clears every agent's and
task's messages of that session.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langchain_core.outputs import LLMResult
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from clawvm.agents.toolcalls import ToolCall, ToolSpec, bound_scope
from clawvm.core.errors import ValidationError
from clawvm.core.model import Cost, Kind, Memory, State, Status
from clawvm.harness import Harness

#: How many recent LLM runs the handler remembers to link the tool calls they asked for: an agent runs a
#: model's tool calls right after it, so a bounded window is enough and the handler never grows.
RECENT_RUNS = 1024
#: How many model turns of one parent run are remembered for tools invoked without a tool call id.
TURNS_PER_RUN = 16
#: What a tool's ToolMessage says when LangChain caught the tool's error and returned it as the output.
HANDLED_ERROR = "HandledToolError"
CHAT_TAG = "chat"
_HISTORY_STATUSES = [Status.ACTIVE.value, Status.ARCHIVED.value]  # an archived message was still said


class _Recent(OrderedDict[Any, Any]):
    """A dict of the ``RECENT_RUNS`` latest entries (the oldest drops out)."""

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > RECENT_RUNS:
            self.popitem(last=False)


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
        record_prompts: bool = False,
    ) -> None:
        if not isinstance(harness, Harness):  # None was taken, and every callback then failed in a log line
            raise ValidationError("harness", f"is a {type(harness).__name__}", "pass an open clawvm.Harness")
        self.harness = harness
        self.scope = bound_scope(session_id, task_id, agent_id)
        self.record_llm = record_llm
        self.record_prompts = record_prompts
        self._calls: dict[UUID, ToolCall] = {}
        self._prompts = _Recent()  # llm run id -> the prompt it was given (only with record_prompts)
        self._thought_of_call = _Recent()  # tool_call_id -> id of the llm_thought that asked for it
        self._thoughts_of_run = _Recent()  # parent run id -> [(thought id, names of the tools asked for)]
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
        name = str((serialized or {}).get("name") or kwargs.get("name") or "tool")
        args = dict(inputs) if inputs is not None else {"input": input_str}
        tool_call_id = kwargs.get("tool_call_id")
        call = ToolCall(
            self.harness,
            ToolSpec(name),
            args,
            parent_id=self._requesting_thought(name, tool_call_id, parent_run_id),
            metadata={"langchain": _run_ids(run_id, parent_run_id, tool_call_id=tool_call_id)},
            **self.scope,
        )
        call.start()
        with self._lock:
            self._calls[run_id] = call

    def on_tool_end(
        self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        call = self._pop(run_id)
        if call is None:
            return
        # a ToolMessage (tool invoked with a tool call) carries the result in .content, and its status
        # says whether LangChain caught an error and returned it as the result
        content = getattr(output, "content", output)
        if getattr(output, "status", "success") == "error":
            call.fail_reported(_text(content), HANDLED_ERROR)
        else:
            call.succeed(content)

    def on_tool_error(
        self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        call = self._pop(run_id)
        if call is not None:
            call.fail(error)

    # ---- prompts (opt-in) -----------------------------------------------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if self.record_llm and self.record_prompts:
            prompt = [{"role": m.type, "content": m.content} for batch in messages for m in batch]
            with self._lock:
                self._prompts.put(run_id, prompt)

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if self.record_llm and self.record_prompts:
            with self._lock:
                self._prompts.put(run_id, list(prompts))

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
        prompt = self._pop_prompt(run_id)
        if not self.record_llm:
            return
        texts, tool_calls = [], []
        for candidates in response.generations:
            for gen in candidates[:1]:  # the chosen candidate of each prompt
                if gen.text:
                    texts.append(gen.text)
                message = getattr(gen, "message", None)
                for tc in getattr(message, "tool_calls", None) or []:
                    tool_calls.append({"name": tc.get("name"), "args": tc.get("args"), "id": tc.get("id")})
        if not texts and not tool_calls:
            return
        content: Any = (
            "\n".join(texts) if not tool_calls else {"text": "\n".join(texts), "tool_calls": tool_calls}
        )
        thought = self.harness.record(
            content,
            kind=Kind.LLM_THOUGHT,
            state=State.SUCCESS,
            cost=Cost(tokens=_total_tokens(response)),
            metadata={"langchain": _run_ids(run_id, parent_run_id, prompt=prompt)},
            **self.scope,
        )
        if tool_calls:
            self._remember_requests(thought, tool_calls, parent_run_id)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        prompt = self._pop_prompt(run_id)
        if self.record_llm:
            self.harness.record(
                f"LLM call failed: {type(error).__name__}: {error}",
                kind=Kind.ERROR,
                state=State.ERROR,
                metadata={
                    "langchain": _run_ids(run_id, parent_run_id, prompt=prompt),
                    "error": {"type": type(error).__name__},
                },
                **self.scope,
            )

    # ---- links ----------------------------------------------------------------------------------------
    def _remember_requests(
        self, thought: Memory, tool_calls: list[dict[str, Any]], parent_run_id: UUID | None
    ) -> None:
        with self._lock:
            for tc in tool_calls:
                if tc.get("id"):
                    self._thought_of_call.put(tc["id"], thought.id)
            if parent_run_id is not None:
                asked = self._thoughts_of_run.get(parent_run_id, [])
                names = {str(tc.get("name")) for tc in tool_calls}
                self._thoughts_of_run.put(parent_run_id, [*asked, (thought.id, names)][-TURNS_PER_RUN:])

    def _requesting_thought(
        self, tool: str, tool_call_id: str | None, parent_run_id: UUID | None
    ) -> str | None:
        """The id of the llm_thought that asked for this tool run (see the module docstring), or None."""
        with self._lock:
            if tool_call_id and tool_call_id in self._thought_of_call:
                return str(self._thought_of_call[tool_call_id])
            for thought_id, names in reversed(self._thoughts_of_run.get(parent_run_id, [])):
                if tool in names:
                    return str(thought_id)
        return None

    def _pop(self, run_id: UUID) -> ToolCall | None:
        with self._lock:
            return self._calls.pop(run_id, None)

    def _pop_prompt(self, run_id: UUID) -> Any:
        with self._lock:
            return self._prompts.pop(run_id, None)


def _run_ids(run_id: UUID, parent_run_id: UUID | None, **extra: Any) -> dict[str, Any]:
    """``metadata.langchain``: the run's ids, and what ``extra`` holds that is set."""
    ids = {"run_id": str(run_id), "parent_run_id": str(parent_run_id) if parent_run_id else None}
    return {**ids, **{k: v for k, v in extra.items() if v is not None}}


def _text(content: Any) -> str:
    """A message's content as text: a string as is, content blocks' text joined, anything else as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        blocks = [b for b in content if isinstance(b, str | dict)]
        parts = [b if isinstance(b, str) else str(b.get("text", "")) for b in blocks]
        if any(parts):
            return "\n".join(p for p in parts if p)
    return json.dumps(content, default=str)


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


# ---- retriever ----------------------------------------------------------------------------------------
class ClawVMRetriever(BaseRetriever):
    """Recall as a LangChain retriever (see the module docstring).

    ``filters`` are :meth:`Harness.recall`'s (``session_id``, ``kind``, ``tags``, ...); ``preset`` its
    recall preset; ``track`` whether the hits count as accessed (default yes, as for any recall).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    harness: Harness
    k: int = 4
    filters: dict[str, Any] = Field(default_factory=dict)
    preset: str | None = None
    track: bool = True

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        hits = self.harness.recall(query, k=self.k, preset=self.preset, track=self.track, **self.filters)
        return [_document(hit.memory, hit.score) for hit in hits]


def _document(memory: Memory, score: float) -> Document:
    scope = {
        name: getattr(memory, name)
        for name in ("session_id", "task_id", "agent_id", "tool_name")
        if getattr(memory, name)
    }
    meta = {"id": memory.id, "score": score, "kind": memory.kind.value, "tier": memory.tier.value, **scope}
    return Document(page_content=memory.content, metadata=meta, id=memory.id)


# ---- chat message history -----------------------------------------------------------------------------
_KIND_OF_MESSAGE = {"human": Kind.USER_INPUT, "ai": Kind.LLM_THOUGHT, "system": Kind.NOTE}
#: A streamed message's chunk type, as its whole message's: a streamed AI reply is an AI reply.
_KIND_OF_MESSAGE.update({"AIMessageChunk": Kind.LLM_THOUGHT, "HumanMessageChunk": Kind.USER_INPUT})
_KIND_OF_MESSAGE["SystemMessageChunk"] = Kind.NOTE


class ClawVMChatMessageHistory(BaseChatMessageHistory):
    """A session's chat messages as memories (see the module docstring); for ``RunnableWithMessageHistory``
    give it ``lambda session_id: ClawVMChatMessageHistory(h, session_id)``."""

    def __init__(
        self, harness: Harness, session_id: str, *, agent_id: str | None = None, task_id: str | None = None
    ) -> None:
        # the history is one session's: without one, messages were stored in none and read back from all,
        # and clear() forgot every session's chat
        if not isinstance(session_id, str) or not session_id.strip():
            raise ValidationError(
                "session_id", f"is {session_id!r}", "pass the chat's session id (a non-empty string)"
            )
        self.harness = harness
        self.session_id = session_id
        # a blank agent_id or task_id was read as none: the history read the whole session, and clear()
        # forgot every other agent's (or task's) messages
        self.scope = bound_scope(session_id, task_id, agent_id)

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # a property, as LangChain reads it
        return messages_from_dict([m.metadata["langchain_message"] for m in self._stored()])

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store ``messages``, all or none: each is checked as its record would be before any is stored
        (``RunnableWithMessageHistory`` saves a question and its answer in one call, and an answer over the
        size limit left the question stored alone)."""
        records = [
            (
                _message_text(message),
                {
                    "kind": _KIND_OF_MESSAGE.get(message.type, Kind.OBSERVATION),
                    "tags": [CHAT_TAG],
                    "metadata": {"langchain_message": message_to_dict(message)},
                    **self.scope,
                },
            )
            for message in messages
        ]
        for text, fields in records:
            self.harness.check_record(text, **fields)
        for text, fields in records:
            self.harness.record(text, **fields)

    def clear(self) -> None:
        """Forget this session's messages through the harness (its other memories stay)."""
        for memory_id in [m.id for m in self._stored()]:  # read first: forgetting while paging moves pages
            self.harness.forget(memory_id)

    def _stored(self) -> Iterator[Memory]:
        # the whole scope it writes with: two histories of one session for two agents (or tasks) read and
        # cleared each other's messages
        return self.harness.iter_all(**self.scope, tags=[CHAT_TAG], status=_HISTORY_STATUSES)


def _message_text(message: BaseMessage) -> str:
    """What recall sees of a message: its text, else its tool calls (an AI turn that only calls tools)."""
    text = str(message.text)  # a str subclass in langchain-core 1.x: text blocks joined
    if text.strip():
        return text
    calls = getattr(message, "tool_calls", None)
    return json.dumps(calls, default=str) if calls else f"({message.type} message without text)"
