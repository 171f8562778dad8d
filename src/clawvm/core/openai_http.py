"""The one HTTP call ClawVM makes to an OpenAI-compatible endpoint (embeddings, chat completions).

Kept in one place so timeouts, auth and JSON handling are the same everywhere; callers map failures
(any exception listed in ``FAILURES``) to their own error class. :class:`ChatEndpoint` is the one
single-prompt chat call the optional LLM helpers (summarizer, synthesizer) share; it never lets a raw
``urllib``/``http.client`` exception out: every way a reply can be unusable is one :class:`EndpointFailure`
with a :class:`FailureReason`, so the helpers can fall back to their extractive defaults and say why.

Time spent waiting on chat endpoints can be bounded per pass: inside ``with endpoint_budget(seconds):``
every :meth:`ChatEndpoint.complete` call waits at most what is left of ``seconds`` (its timeout is cut to
it), and once nothing is left it fails at once with ``budget_spent`` instead of calling. The pager opens
one budget per pass (``PagerConfig.endpoint_budget_s``), so a hung endpoint costs a pass that budget, not a
timeout per memory.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from clawvm.core.errors import UpstreamError

#: Everything :func:`post_json` can raise on a failed call or a reply that is not JSON. ``http.client``
#: errors (a bad status line, a body shorter than its Content-Length) are neither OSError nor URLError.
FAILURES = (
    urllib.error.URLError,
    http.client.HTTPException,
    OSError,
    KeyError,
    IndexError,
    ValueError,
    TypeError,
)


def post_json(base_url: str, path: str, payload: dict[str, Any], api_key: str, timeout_s: float) -> Any:
    """POST ``payload`` as JSON to ``base_url`` + ``path`` and return the decoded JSON reply."""
    req = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


class FailureReason(StrEnum):
    """Why an LLM helper did not use an endpoint's reply (the ``reason`` of a fallback event)."""

    HTTP_STATUS = "http_status"  # an error status (4xx, 5xx)
    MALFORMED_REPLY = "malformed_reply"  # not HTTP (bad status line), a truncated body, not the JSON shape
    EMPTY_REPLY = "empty_reply"  # content null, empty or blank
    TIMEOUT = "timeout"  # no answer within the timeout (or what was left of the pass's budget)
    UNREACHABLE = "unreachable"  # connection refused, reset, no route
    BUDGET_SPENT = "budget_spent"  # the pass's endpoint budget was used up: not called at all
    NUMBERS_DROPPED = "numbers_dropped"  # the input had numbers, the reply kept none of them


class EndpointFailure(UpstreamError):
    """A chat endpoint gave no usable reply. ``detail`` names what happened (a status code, an exception
    class), never any text of the request or the reply."""

    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def classify(exc: BaseException) -> EndpointFailure:
    """The :class:`EndpointFailure` for an exception of :data:`FAILURES` (raised by :func:`post_json`)."""
    if isinstance(exc, urllib.error.HTTPError):  # before URLError: it is one
        return EndpointFailure(FailureReason.HTTP_STATUS, f"HTTP {exc.code}")
    if isinstance(exc, urllib.error.URLError):  # urllib wraps errors of the connect step
        inner = exc.reason
        if isinstance(inner, TimeoutError):
            return EndpointFailure(FailureReason.TIMEOUT, "connect timed out")
        return EndpointFailure(FailureReason.UNREACHABLE, type(inner).__name__)
    if isinstance(exc, TimeoutError):
        return EndpointFailure(FailureReason.TIMEOUT, "read timed out")
    if isinstance(exc, http.client.HTTPException):  # BadStatusLine, IncompleteRead, RemoteDisconnected
        return EndpointFailure(FailureReason.MALFORMED_REPLY, type(exc).__name__)
    if isinstance(exc, OSError):
        return EndpointFailure(FailureReason.UNREACHABLE, type(exc).__name__)
    # ValueError (not JSON), KeyError/IndexError/TypeError (JSON of another shape)
    return EndpointFailure(FailureReason.MALFORMED_REPLY, type(exc).__name__)


@dataclass
class EndpointBudget:
    """Seconds one pass may spend waiting on chat endpoints, all calls together."""

    seconds: float
    spent: float = 0.0
    calls: int = 0  # calls made (each one charged with its wall time)

    def remaining(self) -> float:
        return max(0.0, self.seconds - self.spent)


#: Less than this left of a budget counts as spent: no call could even connect in it.
_MIN_WAIT_S = 0.001

_BUDGET: ContextVar[EndpointBudget | None] = ContextVar("clawvm_endpoint_budget", default=None)


@contextmanager
def endpoint_budget(seconds: float) -> Iterator[EndpointBudget]:
    """Bound the time chat endpoint calls inside the block wait, in total, to ``seconds``.

    Nested blocks share the outermost budget (a pass that calls other passes is still one pass). The
    budget belongs to the current thread (a context variable), so concurrent passes do not share one."""
    outer = _BUDGET.get()
    if outer is not None:
        yield outer
        return
    budget = EndpointBudget(seconds)
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


@dataclass(frozen=True)
class ChatEndpoint:
    """An OpenAI-compatible ``/chat/completions`` endpoint asked one prompt at a time."""

    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = 30.0

    def complete(self, prompt: str) -> str:
        """The model's reply to ``prompt`` (one user message, temperature 0), stripped and never empty.

        Raises :class:`EndpointFailure` (only) when the endpoint fails, answers in another shape, answers
        with no text, or the current :func:`endpoint_budget` is spent."""
        budget = _BUDGET.get()
        timeout = self.timeout_s
        if budget is not None:
            left = budget.remaining()
            if left < _MIN_WAIT_S:
                raise EndpointFailure(FailureReason.BUDGET_SPENT, f"{budget.seconds:g} s budget spent")
            timeout = min(timeout, left)
        request = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}
        started = time.monotonic()
        try:
            payload = post_json(self.base_url, "/chat/completions", request, self.api_key, timeout)
        except FAILURES as exc:
            raise classify(exc) from exc
        finally:
            if budget is not None:
                budget.spent += time.monotonic() - started
                budget.calls += 1
        return _reply_text(payload)


def _reply_text(payload: Any) -> str:
    """The assistant's text in a chat-completions reply; :class:`EndpointFailure` when there is none."""
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise classify(exc) from exc
    if content is None:  # a refusal or a tool-call-only reply: no text, and "None" is not a summary
        raise EndpointFailure(FailureReason.EMPTY_REPLY, "content is null")
    if not isinstance(content, str):
        raise EndpointFailure(FailureReason.MALFORMED_REPLY, f"content is a {type(content).__name__}")
    text = content.strip()
    if not text:
        raise EndpointFailure(FailureReason.EMPTY_REPLY, "content is empty")
    return text
