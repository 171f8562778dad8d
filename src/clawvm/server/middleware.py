""":class:`Guard`, the ASGI middleware in front of every route: it gives each request an id (the client's
``X-Request-ID`` when well formed), bounds the body size (413), rejects bodies and path parameters that are
not UTF-8 (400, naming the parameter: the server would otherwise read them with U+FFFD in place) and JSON
bodies that give a key twice in one object (422, naming it: the last value was read, the others dropped),
answers ``OPTIONS`` of a route's path (204 with ``Allow``, ahead of the key check), turns any unexpected
exception into a 500 of the one error schema, and writes one JSON log line per request (never bodies or
keys)."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers, MutableHeaders

from clawvm.core.jsonkeys import repeated_key
from clawvm.core.redact import redact
from clawvm.server.errors import error_response
from clawvm.server.paths import answered_methods, parameter_at
from clawvm.server.service import RequestGauge
from clawvm.store.keys import Principal

log = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[..., Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

#: A JSON body up to this size is checked for repeated keys on the event loop (~0.1 ms); a larger one on a
#: worker thread, so that one big request never stalls the others.
JSON_INLINE_BYTES = 64 * 1024
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: The header on every response (:class:`Guard` adds it), as the OpenAPI document declares it.
REQUEST_ID_HEADER: dict[str, Any] = {
    "description": "the request's id, in its log line: the client's `X-Request-ID` when it is 1 to 64 "
    "letters, digits, `.`, `_` or `-`, else a new one",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{_REQUEST_ID.pattern}$"},
}


class _Rejected(Exception):
    """A request answered before the app sees it (body too large, or not UTF-8)."""

    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


class Guard:
    """Pure ASGI middleware; see the module docstring. The body is read once here (bounded) and replayed."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, gauge: RequestGauge | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.gauge = gauge  # counts the requests in flight (not event streams: they wait, not work)

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Receive,
        send: Send,
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        gauge = None if _event_stream(scope) else self.gauge
        if gauge is not None:
            gauge.enter()  # on the event loop's thread only: no lock needed
        given = Headers(scope=scope).get("x-request-id", "")
        request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        sent = {"status": 0}

        async def send_with_id(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                MutableHeaders(scope=message).append("X-Request-ID", request_id)
            await send(message)

        try:
            _check_path(scope)
            _check_query(scope)
            if scope["method"] == "OPTIONS" and (allow := _options_allow(scope)):
                await Response(status_code=204, headers={"Allow": allow})(scope, receive, send_with_id)
                return
            body = await self._body(scope, receive)
            await _check_json(scope, body)
            await self.app(scope, _replay(body, receive), send_with_id)
        except _Rejected as rejected:
            await rejected.response(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error", extra={"fields": {"request_id": request_id}})
            if not sent["status"]:
                await error_response(
                    500,
                    "internal_error",
                    "unexpected server error",
                    None,
                    f"retry; if it persists report request {request_id}",
                )(scope, receive, send_with_id)
        finally:
            if gauge is not None:
                gauge.leave()
            self._log(scope, request_id, sent["status"] or 500, started)

    async def _body(self, scope: MutableMapping[str, Any], receive: Receive) -> bytes:
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _Rejected(self._too_large())
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _Rejected(self._too_large())
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Rejected(
                error_response(
                    400,
                    "invalid_utf8",
                    f"is not valid UTF-8 (byte {exc.start})",
                    "body",
                    "encode the JSON body as UTF-8",
                )
            ) from None
        return body

    def _too_large(self) -> JSONResponse:
        return error_response(
            413,
            "payload_too_large",
            f"is over the {self.max_body_bytes}-byte limit",
            "body",
            "send less per request (store large payloads elsewhere and record a reference)",
        )

    @staticmethod
    def _log(scope: MutableMapping[str, Any], request_id: str, status: int, started: float) -> None:
        level = logging.ERROR if status >= 500 else logging.INFO
        if not log.isEnabledFor(level):
            return  # --log-level warning: no line to build
        principal = scope.get("state", {}).get("principal")
        fields: dict[str, Any] = {
            "request_id": request_id,
            "method": scope.get("method"),
            # ids in a path are scope ids a caller named (a session called after an email): stored redacted,
            # they were logged in clear
            "path": redact(str(scope.get("path", ""))).text,
            "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        if isinstance(principal, Principal):
            fields.update(tenant=principal.tenant, key_id=principal.key_id, role=principal.role.value)
        log.log(level, "request", extra={"fields": fields})


def _event_stream(scope: MutableMapping[str, Any]) -> bool:
    """Whether the request opens an event stream, which waits rather than works: ``/v1/events/stream``,
    or any GET that asks for ``text/event-stream`` (an MCP client's standing stream on ``/mcp``, held for
    its whole session, kept the embedding worker yielding to a request that never ends)."""
    if str(scope.get("path", "")).endswith("/stream"):
        return True
    return scope["method"] == "GET" and "text/event-stream" in Headers(scope=scope).get("accept", "")


def _options_allow(scope: MutableMapping[str, Any]) -> str:
    """``Allow`` for an ``OPTIONS`` of a path that routes answer but none for OPTIONS, or "" (the app then
    answers: 404 for no route, a redirect for a trailing slash, a mounted app its own OPTIONS). Answered
    here, ahead of the routes: it reveals only which methods the path takes, so it takes no key and spends
    no rate-limit token (as HEAD of a health probe). No CORS headers: the server has no CORS settings."""
    answered = answered_methods(scope)
    return ", ".join(sorted(answered | {"OPTIONS"})) if answered and "OPTIONS" not in answered else ""


async def _check_json(scope: MutableMapping[str, Any], body: bytes) -> None:
    """Reject a JSON body that gives a key twice in one object (422 naming it): read, the last value won
    and the others were dropped unseen. Here, once for every route, the dashboard's and mounted ones too.
    A large body is read on a worker thread: parsed on the event loop, a 10 MB import would hold every
    other request for ~50 ms."""
    if not body or not _read_as_json(Headers(scope=scope).get("content-type", "")):
        return
    if len(body) > JSON_INLINE_BYTES:
        key = await anyio.to_thread.run_sync(repeated_key, body)
    else:
        key = repeated_key(body)
    if key is not None:
        raise _Rejected(
            error_response(
                422,
                "validation_error",
                "is given more than once in one JSON object",
                key,
                "give each key once (only one of the values would be read)",
            )
        )


def _read_as_json(content_type: str) -> bool:
    """Whether FastAPI may read a body of this content type as JSON: ``application/json``, ``*+json``, or
    none at all (FastAPI before 0.132, which the project allows, reads a body without one as JSON; a body
    that is no JSON is then the route's to refuse)."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _check_path(scope: MutableMapping[str, Any]) -> None:
    """Reject a path whose percent-decoded bytes are not UTF-8 (``/v1/memories/%FF``), naming the path
    parameter they fall in (``path`` when no route takes one there)."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        return
    offset = 0  # where the segment starts in the decoded path (each bad byte is one U+FFFD there)
    for segment in raw.split(b"?", 1)[0].split(b"/"):
        decoded = unquote_to_bytes(segment)
        try:
            decoded.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Rejected(
                error_response(
                    400,
                    "invalid_utf8",
                    f"is not valid UTF-8 once percent-decoded (byte {exc.start})",
                    parameter_at(scope, offset),
                    "percent-encode the UTF-8 bytes of the text (e.g. %C3%A9 for é)",
                )
            ) from None
        offset += len(decoded.decode("utf-8")) + 1


def _check_query(scope: MutableMapping[str, Any]) -> None:
    """Reject a query parameter whose percent-decoded bytes are not UTF-8 (``?session_id=%FF``), naming it:
    decoded with replacement characters, it filtered for a text nobody recorded and answered 200 []."""
    raw = scope.get("query_string")
    if not isinstance(raw, bytes) or b"%" not in raw:
        return
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        for part in (name, value):
            try:
                _query_text(part)
            except UnicodeDecodeError as exc:
                try:
                    field = _query_text(name)
                except UnicodeDecodeError:
                    field = "query"  # the name itself is no text
                raise _Rejected(
                    error_response(
                        400,
                        "invalid_utf8",
                        f"is not valid UTF-8 once percent-decoded (byte {exc.start})",
                        field,
                        "percent-encode the UTF-8 bytes of the text (e.g. %C3%A9 for é)",
                    )
                ) from None


def _query_text(part: bytes) -> str:
    """One name or value of a query string as text (``+`` is a space there); UnicodeDecodeError if none."""
    return unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")


def _replay(body: bytes, receive: Receive) -> Receive:
    done = False

    async def replay() -> MutableMapping[str, Any]:
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
