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

import contextlib
import functools
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from clawvm.core.errors import UpstreamError, ValidationError
from clawvm.core.model import within

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


#: The largest reply :func:`post_json` reads (an embeddings batch of 256 vectors of 3072 dimensions is
#: ~16 MB of JSON); past it the reply counts as malformed, before it fills the process's memory.
MAX_REPLY_BYTES = 64 * 2**20
_READ_BYTES = 64 * 1024


def post_json(
    base_url: str,
    path: str,
    payload: dict[str, Any],
    api_key: str,
    timeout_s: float,
    max_bytes: int = MAX_REPLY_BYTES,
) -> Any:
    """POST ``payload`` as JSON to ``base_url`` + ``path`` and return the decoded JSON reply.

    ``timeout_s`` bounds the whole call, not only each wait on the socket: a server that trickles its
    status line, headers or body a byte at a time has its connection shut when the time is up, and the
    call raises TimeoutError. A reply of more than ``max_bytes`` raises ValueError."""
    req = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    with _Deadline(timeout_s) as deadline:
        token = _CALL_DEADLINE.set(deadline)
        try:
            with _opener().open(req, timeout=timeout_s) as resp:
                return json.loads(_body_of(resp, max_bytes))
        except FAILURES as exc:
            if deadline.fired:  # what the shut connection looked like: a reset, a short read
                raise TimeoutError("the reply did not arrive within the timeout") from exc
            raise
        finally:
            _CALL_DEADLINE.reset(token)


class _Deadline:
    """Shuts a call's connection down when its time is up. The socket's own timeout bounds each wait
    on it, not their sum: a server trickling a byte now and then held a call for as long as it liked."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                _shut(self._sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already
        sock.shutdown(socket.SHUT_RDWR)


#: The deadline of the call this thread is making (its connection registers its socket with it).
_CALL_DEADLINE: ContextVar[_Deadline | None] = ContextVar("clawvm_call_deadline", default=None)


class _WatchedHTTP(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        if (deadline := _CALL_DEADLINE.get()) is not None:
            deadline.watch(self.sock)


class _WatchedHTTPS(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        if (deadline := _CALL_DEADLINE.get()) is not None:
            deadline.watch(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class: Any, req: Any, **kw: Any) -> http.client.HTTPResponse:
        return super().do_open(_WatchedHTTP, req, **kw)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def do_open(self, http_class: Any, req: Any, **kw: Any) -> http.client.HTTPResponse:
        return super().do_open(_WatchedHTTPS, req, **kw)


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """urllib's opener (proxies from the environment, redirects) over connections a deadline watches."""
    return urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler())


def _body_of(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """``resp``'s whole body, read as it arrives (``read1``: what one read of the socket gives), or
    ValueError past ``max_bytes``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read1(_READ_BYTES)
        if not chunk:
            body = b"".join(chunks)
            if resp.length:  # the connection closed short of the Content-Length (read() raised this too)
                raise http.client.IncompleteRead(body, resp.length)
            return body
        size += len(chunk)
        if size > max_bytes:
            raise ValueError(f"the reply is over {max_bytes} bytes")
        chunks.append(chunk)


def check_endpoint_settings(base_url: Any, model: Any, api_key: Any, timeout_s: Any) -> None:
    """:class:`ValidationError` naming the first bad setting of an endpoint."""
    try:
        parts = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
    except ValueError:  # "http://[::1" and the like
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidationError(
            "base_url", f"is {base_url!r}", "pass the endpoint's URL, e.g. 'http://127.0.0.1:8000/v1'"
        )
    if not isinstance(model, str) or not model.strip():
        raise ValidationError("model", f"is {model!r}", "name the model the endpoint serves")
    if not isinstance(api_key, str):
        raise ValidationError("api_key", f"is a {type(api_key).__name__}", "pass the key as a string")
    fix = "pass seconds, more than 0 (at most 3600)"
    within("timeout_s", timeout_s, 0.0, 3600.0, fix, above_low=True)


class FailureReason(StrEnum):
    """Why an LLM helper did not use an endpoint's reply (the ``reason`` of a fallback event)."""

    HTTP_STATUS = "http_status"  # an error status (4xx, 5xx)
    MALFORMED_REPLY = "malformed_reply"  # not HTTP (bad status line), a truncated body, not the JSON shape
    EMPTY_REPLY = "empty_reply"  # content null, empty or blank
    TIMEOUT = "timeout"  # no answer within the timeout (or what was left of the pass's budget)
    UNREACHABLE = "unreachable"  # connection refused, reset, no route
    TOO_LONG = "too_long"  # a reply far longer than asked for (a summary no shorter, a lesson of pages)
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
    """An OpenAI-compatible ``/chat/completions`` endpoint asked one prompt at a time. Its settings are
    checked when it is made (a bad one failed every call later, reported as the endpoint's fault)."""

    base_url: str
    model: str
    api_key: str = field(default="", repr=False)  # a printed helper or a traceback's locals show no key
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_endpoint_settings(self.base_url, self.model, self.api_key, self.timeout_s)

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
