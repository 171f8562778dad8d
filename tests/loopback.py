"""Real servers on loopback for tests: LLM paths and the HTTP API are always exercised over a socket.

- :class:`ChatReplay`: an OpenAI-compatible ``/chat/completions`` endpoint (a real ``http.server`` on
  127.0.0.1, a free port, its own thread) that answers with scripted replies and records every request,
  or misbehaves on purpose (an error status, a :class:`Fault`); it can also serve a few plain pages for
  agents that fetch URLs.
- :func:`serve_app`: an ASGI app served by uvicorn on 127.0.0.1, a free port, its own thread.
- :class:`ServeProcess` (:meth:`ServeProcess.start`): ``clawvm serve`` as a real process on a free port.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import uvicorn

#: A scripted reply: text (an assistant message with that content) or a whole assistant message (tool calls).
Reply = str | dict[str, Any]
#: A page served on GET: its text, or a callable run in the request's thread returning the text (None: no
#: answer at all, as a server that hangs up would).
Page = str | Callable[[], str | None]


class Fault(Enum):
    """How :class:`ChatReplay` breaks HTTP itself on every POST while its ``fault`` is set."""

    GARBAGE_STATUS_LINE = "garbage_status_line"  # answers a line that is not an HTTP status line
    TRUNCATED_BODY = "truncated_body"  # a 200 whose Content-Length is far longer than the body sent
    HANG = "hang"  # answers nothing for ``hang_s`` seconds (past any client timeout), then hangs up
    TRICKLE = "trickle"  # a 200 whose body comes a byte every ``trickle_s``: each read quick, the whole slow
    TRICKLE_HEADERS = "trickle_headers"  # the status line, then one header a byte every ``trickle_s``
    # for ``hang_s``, then it hangs up (a client still waiting then reads a broken reply, not a timeout)


class ChatReplay:
    """An OpenAI-compatible chat-completions server on loopback replaying scripted replies.

    Every POST (any path) is recorded in ``requests`` as ``{"path", "headers", "json"}`` and answered with
    the chat completion of ``answer(body)`` — by default the next reply of ``script``, or a 500 once the
    script is used up. A reply is the assistant's text, or its whole message: ``{"role": "assistant",
    "content": None}`` answers content null. While ``status`` is not 200, every POST is answered with that
    error status instead; while ``fault`` is set, every POST is recorded and then answered that broken way.
    A GET is answered with ``pages[path]`` (text/plain), or 503 for any other path. ``stopping`` is set
    when the server stops, so a page that blocks can wait on it.

    Use it as a context manager; ``url`` is ``http://127.0.0.1:<port>`` and ``v1`` is ``url + "/v1"``
    (the base URL OpenAI-compatible clients take).
    """

    def __init__(
        self,
        script: list[Reply] | None = None,
        *,
        answer: Callable[[dict[str, Any]], Reply] | None = None,
        pages: dict[str, Page] | None = None,
    ) -> None:
        self.script: list[Reply] = list(script or [])
        self.answer = answer or self._next_in_script
        self.pages: dict[str, Page] = dict(pages or {})
        self.status = 200
        self.fault: Fault | None = None
        self.hang_s = 60.0  # how long a HANG lasts at most (it ends early when the server stops)
        self.trickle_s = 0.2  # a TRICKLE's wait between two bytes
        self.hung_up_on = threading.Event()  # a client closed the connection while a TRICKLE went on
        self.requests: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = _Server(("127.0.0.1", 0), _ChatHandler)
        self._server.replay = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.v1 = f"{self.url}/v1"

    def __enter__(self) -> ChatReplay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()  # first: a blocked page returns, so shutting down does not wait on it
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _next_in_script(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if not self.script:
                raise LookupError("script exhausted")
            return self.script.pop(0)

    def _answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Record one chat-completions request; the status and JSON body to answer it with."""
        with self._lock:
            self.requests.append(request)
            status = self.status
        if status != 200:
            return status, {"error": {"message": "scripted failure", "code": status}}
        body = request["json"]
        try:
            reply = self.answer(body)
        except LookupError as exc:
            return 500, {"error": {"message": str(exc), "code": 500}}
        message = {"role": "assistant", "content": reply} if isinstance(reply, str) else reply
        return 200, {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }


#: A reply without a single digit (for an input that has some, an LLM summary that dropped every number).
DIGITLESS_REPLY = "A short summary that keeps no figure at all."
#: A reply far longer than any summary or lesson asked for (with digits, so that is all that is wrong).
LONG_REPLY = "Step 1 ran and step 2 ran after it. " * 400


@dataclass(frozen=True)
class Misbehaviour:
    """One way a chat endpoint fails a call, and what a client that fails safe reports about it: the
    ``reason`` and ``detail`` of its fallback event (``detail`` as its start)."""

    name: str
    reason: str
    detail: str

    def apply(self, server: ChatReplay) -> None:
        """Set ``server`` up to fail every POST (every one after the script for the scripted ones) so."""
        if self.name == "http_500":
            server.status = 500
        elif self.name == "content_null":
            server.script = [{"role": "assistant", "content": None}] * 20
        elif self.name == "content_empty":
            server.script = [""] * 20
        elif self.name == "no_digits":
            server.script = [DIGITLESS_REPLY] * 20
        elif self.name == "too_long":
            server.script = [LONG_REPLY] * 20
        elif self.name == "trickle_headers":
            server.fault = Fault.TRICKLE_HEADERS
            server.hang_s = 10.0  # a client without a deadline on the whole call sees a broken reply then
        else:
            server.fault = Fault(self.name)


MISBEHAVIOURS = [
    Misbehaviour("http_500", "http_status", "HTTP 500"),
    Misbehaviour("garbage_status_line", "malformed_reply", "BadStatusLine"),
    Misbehaviour("truncated_body", "malformed_reply", "IncompleteRead"),
    Misbehaviour("content_null", "empty_reply", "content is null"),
    Misbehaviour("content_empty", "empty_reply", "content is empty"),
    Misbehaviour("no_digits", "numbers_dropped", ""),
    Misbehaviour("hang", "timeout", "read timed out"),
    Misbehaviour("trickle", "timeout", "read timed out"),  # each read quick, the whole reply never in time
    Misbehaviour("trickle_headers", "timeout", "read timed out"),  # the same before the body
    Misbehaviour("too_long", "too_long", ""),
]


class _Server(ThreadingHTTPServer):
    replay: ChatReplay


class _ChatHandler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        replay = self.server.replay
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        status, payload = replay._answer({"path": self.path, "headers": dict(self.headers), "json": body})
        fault = replay.fault
        if fault is Fault.GARBAGE_STATUS_LINE:
            self.wfile.write(b"SURPRISE 42 this is not http\r\n\r\n")
        elif fault is Fault.TRUNCATED_BODY:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) + 4096))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])  # then the connection closes: HTTP/1.0, no keep-alive
        elif fault is Fault.HANG:
            replay.stopping.wait(replay.hang_s)  # the client gives up first; answer nothing
        elif fault is Fault.TRICKLE_HEADERS:
            ends = time.monotonic() + replay.hang_s
            try:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while time.monotonic() < ends and not replay.stopping.wait(replay.trickle_s):
                    self.wfile.write(b"a")
                    self.wfile.flush()
            except OSError:  # the client gave up
                replay.hung_up_on.set()
                return
        elif fault is Fault.TRICKLE:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for i in range(len(data)):
                if replay.stopping.wait(replay.trickle_s):
                    return
                try:
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                except OSError:  # the client gave up: that is the point
                    replay.hung_up_on.set()
                    return
        else:
            self._send(status, json.dumps(payload), "application/json")

    def do_GET(self) -> None:
        page = self.server.replay.pages.get(self.path)
        if page is None:
            self._send(503, "upstream unavailable", "text/plain")
            return
        text = page() if callable(page) else page
        if text is not None:
            self._send(200, text, "text/plain")

    def _send(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass  # keep test output clean


class EmbeddingsReplay:
    """An OpenAI-compatible ``/embeddings`` endpoint on loopback: every POST is answered with
    ``vector_of(text)`` for each input text, or with ``status`` while it is not 200. ``v1`` is the base
    URL clients take. A context manager, as :class:`ChatReplay`."""

    def __init__(self, vector_of: Callable[[str], list[float]]) -> None:
        self.vector_of = vector_of
        self.status = 200
        self.calls = 0
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                replay.calls += 1
                if replay.status != 200:
                    data = json.dumps({"error": {"message": "scripted failure"}}).encode()
                else:
                    texts = enumerate(body["input"])
                    rows = [{"index": i, "embedding": replay.vector_of(t)} for i, t in texts]
                    data = json.dumps({"data": rows}).encode()  # NaN goes out as JSON's NaN: some servers do
                self.send_response(replay.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.v1 = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> EmbeddingsReplay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def serve_app(app: Any, start_timeout_s: float = 60) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on loopback (lifespan on) and yield its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass
class ServeProcess:
    """``clawvm serve`` in its own process on a loopback port, its output in ``log``."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, db: str, log: Path, *flags: str, env: Mapping[str, str] | None = None) -> ServeProcess:
        """Start it on ``db`` (no embedder, no rate limit) with more ``serve`` flags; not waited for: see
        :meth:`wait_ready`."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        args = ["--db", db, "--no-embed", "serve", "--port", str(port), "--rate-limit", "0", *flags]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from clawvm.cli import main; main()", *args],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            )
        return cls(f"http://127.0.0.1:{port}", proc, log)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> None:
        """Until it answers /readyz (readiness, not timing: it imports, connects, then binds)."""
        for _ in range(1200):
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"clawvm serve did not become ready:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
