"""``AgentWithMemory``: give any agent with ``reply(messages) -> str`` the team's memory.

Framework-agnostic on purpose: anything with that one method works (a raw chat-completions client, a
LangChain runnable behind a two-line adapter, a scripted fake). Before each reply the wrapper asks the
harness for guidance on the last user message and puts it in front of the conversation as a system
message; after the reply it records the exchange (the user message as USER_INPUT, private to the agent;
the reply as ``record_as``, shared with the team when there is one; ``record_as=None`` leaves the reply to
the caller, e.g. when it parses decisions or issues out of it and records those instead).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawvm.core.errors import ClawVMError, ValidationError
from clawvm.core.model import Kind, Memory, Scope
from clawvm.teams.guidance import Guidance
from clawvm.teams.shared import TeamHost
from clawvm.teams.shared import record as record_team_memory


class GuidedHost(TeamHost, Protocol):
    """What the agent wrapper needs of a team host: guidance before a reply, adoption fed back."""

    def guidance(
        self,
        agent_id: str,
        task: str,
        budget_tokens: int = 600,
        *,
        task_id: str | None = None,
        task_type: str | None = None,
    ) -> Guidance: ...

    def feedback(self, memory_id: str, adopted: bool) -> Memory: ...


Message = dict[str, str]

log = logging.getLogger("clawvm.agents.agent")
GUIDANCE_INTRO = "Team memory (what earlier tasks taught us; cite an item's [id] when you use it):"


class ReplyAgent(Protocol):
    def reply(self, messages: list[Message]) -> str: ...


@dataclass
class AgentWithMemory:
    """Wraps ``agent``: guidance before each reply, the exchange recorded after.

    ``task_id``/``task_type`` describe the task in progress (change them with :meth:`start_task`); they
    scope guidance and tag what is recorded. ``last_guidance`` keeps the guidance of the last reply, so the
    caller can report what was adopted with :meth:`feedback`.
    """

    agent: ReplyAgent
    harness: GuidedHost
    agent_id: str
    team_id: str | None = None
    task_id: str | None = None
    task_type: str | None = None
    session_id: str | None = None
    budget_tokens: int = 600
    record_as: Kind | None = Kind.OBSERVATION  # None: the caller records what the reply means itself
    last_guidance: Guidance | None = field(default=None, init=False)
    last_reply: Memory | None = field(default=None, init=False)
    #: why the last exchange was not recorded (None: it was): the answer is returned all the same
    last_record_error: ClawVMError | None = field(default=None, init=False)

    def start_task(self, task_id: str | None, task_type: str | None = None) -> None:
        self.task_id, self.task_type = task_id, task_type

    def reply(self, messages: Sequence[Message]) -> str:
        messages = _checked_messages(messages)
        task = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
        guidance = self.harness.guidance(
            self.agent_id, task, self.budget_tokens, task_id=self.task_id, task_type=self.task_type
        )
        self.last_guidance = guidance
        prompt = messages
        if guidance.text:
            prompt = [{"role": "system", "content": f"{GUIDANCE_INTRO}\n{guidance.text}"}, *messages]
        answer = self.agent.reply(prompt)
        if not isinstance(answer, str):
            raise ValidationError("reply", f"the agent answered a {type(answer).__name__}", "return text")
        self.last_reply, self.last_record_error = None, None
        try:
            self._record(task, answer)
        except ClawVMError as exc:  # a read-only member, a store down: the model's answer is not lost
            log.warning("agent %s: the exchange was not recorded: %s", self.agent_id, exc)
            self.last_record_error = exc
        return answer

    def feedback(self, adopted: bool, ids: Sequence[str] | None = None) -> None:
        """Report whether the last guidance (or the items ``ids`` of it) was adopted."""
        if self.last_guidance is None:
            return
        for memory_id in ids if ids is not None else self.last_guidance.ids:
            self.harness.feedback(memory_id, adopted)

    def _record(self, task: str, answer: str) -> None:
        common: dict[str, Any] = {"task_id": self.task_id, "session_id": self.session_id}
        if task.strip():
            self.harness.record(
                task, kind=Kind.USER_INPUT, agent_id=self.agent_id, scope=Scope.PRIVATE, **common
            )
        if answer.strip() and self.record_as is not None:
            self.last_reply = record_team_memory(
                self.harness,
                answer,
                agent_id=self.agent_id,
                kind=self.record_as,
                team_id=self.team_id,
                task_type=self.task_type,
                **common,
            )


def _checked_messages(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as a list of chat messages (dicts with a role), or a ValidationError naming the one
    that is not (a plain string failed with Python's AttributeError)."""
    if isinstance(messages, str | bytes):
        raise ValidationError("messages", "is text", 'pass a list of {"role": ..., "content": ...} dicts')
    out = list(messages)
    for i, m in enumerate(out):
        if not isinstance(m, dict) or not isinstance(m.get("content", ""), str):
            raise ValidationError(f"messages.{i}", f"is {m!r}", 'pass {"role": ..., "content": "text"}')
    return out
