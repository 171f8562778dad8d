"""Every 4xx and 5xx is ``{"error": {"code", "message", "field", "fix"}}`` (:class:`ErrorBody`).

The library's errors (:mod:`clawvm.core.errors`) are mapped by their type in :data:`ERRORS`, the one
table; request-shape errors (pydantic) and HTTP errors (unknown route, wrong method) are translated next to
it. A 5xx never shows the library's message: the client gets a generic one and the log keeps the details.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from clawvm.core.errors import (
    AccessDeniedError,
    AuthenticationError,
    ClawVMError,
    ConfigError,
    ConflictError,
    CryptoError,
    EmbedderError,
    InvalidToolResultError,
    KeyExpiredError,
    NotFoundError,
    RateLimitError,
    SchemaError,
    StateConflictError,
    StoreError,
    UpstreamError,
    ValidationError,
)
from clawvm.core.model import DEPTH_FIX, fix_for, pattern_in_words
from clawvm.server.paths import allowed_methods
from clawvm.server.schemas.requests import MAX_IMPORT
from clawvm.server.schemas.responses import ErrorBody

log = logging.getLogger(__name__)

#: Library error -> (HTTP status, error code). The first matching class wins (subclasses first).
ERRORS: tuple[tuple[type[ClawVMError], int, str], ...] = (
    (StateConflictError, 409, "invalid_state"),  # a ValidationError: it must come first
    (ValidationError, 422, "validation_error"),
    (ConfigError, 422, "invalid_option"),
    (NotFoundError, 404, "not_found"),
    (ConflictError, 409, "conflict"),
    (KeyExpiredError, 401, "key_expired"),
    (AuthenticationError, 401, "unauthorized"),
    (AccessDeniedError, 403, "forbidden"),
    (RateLimitError, 429, "rate_limited"),
    (InvalidToolResultError, 422, "invalid_tool_result"),
    (CryptoError, 500, "crypto_error"),  # a sealed original that the server's data keys cannot open
    (SchemaError, 500, "schema_error"),
    (StoreError, 503, "store_unavailable"),
    (EmbedderError, 503, "embedder_unavailable"),
    (UpstreamError, 502, "upstream_failed"),  # a summarizer or synthesizer of the operator's own
    (ClawVMError, 500, "internal_error"),
)

#: pydantic error type of a malformed request -> what to do instead (the `fix` of its 422)
_FIXES = {
    "missing": "provide it",
    "extra_forbidden": "remove it; see /docs for the fields this endpoint takes",
    "enum": "use one of the listed values",
    "literal_error": "use one of the listed values",
    "too_long": "send fewer items or a shorter string",
    "too_short": "send more items or a longer string",
    "string_too_long": "send a shorter string",
    "string_too_short": "send a non-empty string",
    "string_type": "pass a string",
    "int_parsing": "pass an integer",
    "int_type": "pass an integer",
    "int_from_float": "pass an integer",
    "float_parsing": "pass a number",
    "float_type": "pass a number",
    "finite_number": "pass a finite number",
    "bool_parsing": "pass true or false",
    "bool_type": "pass true or false",
    "list_type": "pass a JSON array",
    "dict_type": "pass a JSON object",
    "model_type": "pass a JSON object",
    "model_attributes_type": "pass a JSON object",
    "datetime_parsing": "pass an ISO 8601 datetime",
    "datetime_from_date_parsing": "pass an ISO 8601 datetime",
    "datetime_type": "pass an ISO 8601 datetime",
    "greater_than_equal": "pass a larger value",
    "greater_than": "pass a larger value",
    "less_than_equal": "pass a smaller value",
    "less_than": "pass a smaller value",
    "value_error": "correct the value as the message says",
    "json_too_deep": DEPTH_FIX,  # the library's own check (clawvm.core.model), e.g. memories in an import
}

_MESSAGES_5XX = {
    "store_unavailable": "the storage engine failed; retry later",
    "embedder_unavailable": "the embedding model failed; retry later",
    "upstream_failed": "a model the server called for this request failed; nothing was changed",
    "schema_error": "the database schema is not usable by this server version",
    "crypto_error": "protected content could not be decrypted with the server's data keys",
    "internal_error": "unexpected server error",
}

#: The header of every 429 (:func:`response_for`), as the OpenAPI document declares it.
RETRY_AFTER_HEADER: dict[str, Any] = {
    "description": "whole seconds to wait before the limit takes this request",
    "required": True,
    "schema": {"type": "integer", "minimum": 1},
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    | ({"headers": {"Retry-After": RETRY_AFTER_HEADER}} if status == 429 else {})
    for status, description in (
        (400, "Malformed request: not JSON, or not UTF-8"),
        (401, "Missing, unknown, revoked (`unauthorized`) or expired (`key_expired`) API key"),
        (403, "The key's role may not do this, or the data is another tenant's"),
        (404, "Not found (ids of other tenants are not found either)"),
        (
            409,
            "Conflict: a stale version (`conflict`: re-read and retry), a memory whose state forbids it "
            "(`invalid_state`), or an Idempotency-Key in use",
        ),
        (413, "Request body over the size limit"),
        (422, "Invalid input; `field` names it"),
        (
            429,
            "A rate limit (of the API key, its tenant, key minting, or unauthenticated requests) "
            "exceeded; see Retry-After",
        ),
        (500, "Unexpected server error"),
        (502, "A model the server called (summarizer, synthesizer) failed; nothing was changed"),
        (503, "Storage engine or embedding model unavailable"),
    )
}


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    fix: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "field": field, "fix": fix}}
    return JSONResponse(body, status_code=status, headers=headers)


def response_for(exc: ClawVMError) -> JSONResponse:
    """The HTTP response for a library error (see :data:`ERRORS`)."""
    status, code = next((s, c) for cls, s, c in ERRORS if isinstance(exc, cls))
    field: str | None = None
    fix: str | None = None
    message = str(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, ValidationError | AccessDeniedError):
        field, message, fix = exc.field, exc.problem, exc.fix
    elif isinstance(exc, ConfigError):  # its message says what to use instead, or its fix does
        field, fix = exc.field, exc.fix
        message = message if fix is None else exc.problem
    elif isinstance(exc, NotFoundError | ConflictError):  # the message as it was, the field and fix named
        field, fix = exc.field, exc.fix
    elif isinstance(exc, KeyExpiredError):
        field, fix = "Authorization", "use another key (an admin mints one: POST /v1/keys)"
    elif isinstance(exc, AuthenticationError):
        field, fix = "Authorization", "send a valid key as 'Authorization: Bearer <key>' (clawvm keys create)"
    elif isinstance(exc, RateLimitError):
        # whole seconds, as the header must be: the message said "retry after 0.00 s" beside Retry-After: 1,
        # and a client that trusted it was refused again at once
        wait = max(1, math.ceil(exc.retry_after_s))
        message = f"rate limit of the {exc.limit} exceeded: retry after {wait} s"
        fix = f"slow down; retry after {wait} s (the Retry-After header)"
        headers["Retry-After"] = str(wait)
    if status >= 500:
        message = _MESSAGES_5XX.get(code, "unexpected server error")
        fix = fix or "retry later; the server log has the details (search for the X-Request-ID)"
    return error_response(status, code, message, field, fix, headers or None)


#: Fields a caller may not send because the harness sets them -> the route that changes them (the SDK's
#: refusal names its methods, clawvm.core.model.SET_BY_HARNESS; "remove it" alone left a client stuck)
_SET_BY_HARNESS = {
    "value": "the scorer computes it: send POST /v1/memories/{id}/feedback (or set it in the dashboard)",
    "pinned": "use POST /v1/memories/{id}/pin or /unpin, which keep the pinned budget and the working tier",
    "token_count": "it is counted from the content: change the content",
    "content_type": "it follows the content: send text, or a JSON object or list",
    "access_count": "recalls count accesses",
    "last_accessed_at": "recalls count accesses",
    "usage": "context builds and recorded outputs count it",
}

#: Validation error types that say the body as a whole is not a JSON object.
_NOT_AN_OBJECT = frozenset({"dict_type", "model_type", "model_attributes_type"})


#: The fix of a body that is not JSON, on a route whose body is easy to mistake for another's.
_JSON_FIX_BY_ROUTE = {
    # an export is JSON Lines: sent as it is, its second line was "Extra data"
    "/v1/memories/import": 'send one JSON object, {"memories": [...]}, with the lines of an export (GET '
    f"/v1/export) as the items of its list, at most {MAX_IMPORT} a request",
}


def _request_error(exc: RequestValidationError, route: str) -> JSONResponse:
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    where = loc[0] if loc else "body"
    path = loc[1:] if where in ("body", "query", "path", "header", "cookie") else loc
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        reason = first.get("ctx", {}).get("error", "invalid JSON")
        fix = _JSON_FIX_BY_ROUTE.get(route, "send JSON")
        return error_response(400, "invalid_json", f"is not valid JSON ({reason})", "body", fix)
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    field = ".".join(path) or where
    fix = fix_for(kind, field) if kind == "value_error" else _FIXES.get(kind, "correct the value")
    if kind == "extra_forbidden" and where == "body" and field in _SET_BY_HARNESS:
        message, fix = "is set by the harness", _SET_BY_HARNESS[field]
    if (words := pattern_in_words(first)) is not None:
        message, fix = words
    if where == "body" and not path and kind in _NOT_AN_OBJECT:
        # the usual cause: a JSON object sent without its content type (curl -d) reaches us as a string
        fix = "send a JSON object with the header 'Content-Type: application/json'"
    return error_response(422, "validation_error", message, field, fix)


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code, field, fix = {
        400: ("bad_request", "body", "send a JSON body"),
        404: ("not_found", None, "see /docs for the routes"),
        405: ("method_not_allowed", None, "see the Allow header"),
    }.get(exc.status_code, ("http_error", None, None))
    headers = dict(exc.headers or {})
    message = str(exc.detail)
    if exc.status_code == 400 and (why := _unparsed(exc.__cause__)) is not None:
        message, fix = why  # FastAPI's "There was an error parsing the body", of a body that is valid JSON
    if exc.status_code == 405:  # every method of the path (Starlette's names the first route's only)
        allowed = allowed_methods(request.scope)
        headers["Allow"] = ", ".join(allowed) or headers.get("Allow", "")
    return error_response(exc.status_code, code, message, field, fix, headers or None)


def _unparsed(cause: BaseException | None) -> tuple[str, str] | None:
    """Why Python's JSON reader refused a body that is valid JSON, in words, with the fix."""
    if isinstance(cause, RecursionError):
        return "nests arrays or objects deeper than the JSON reader takes", "nest less than 1,000 levels deep"
    # the one ValueError of json.loads that is neither about the text (JSONDecodeError) nor its bytes:
    # Python's cap on an integer's digits (sys.set_int_max_str_digits), known by its type, not its words
    if isinstance(cause, ValueError) and not isinstance(cause, json.JSONDecodeError | UnicodeDecodeError):
        return "holds an integer of more digits than the JSON reader takes", "send at most 4,300 digits"
    return None


def install_error_handlers(
    app: FastAPI, key_check: Callable[[Request], Awaitable[ClawVMError | None]] | None = None
) -> None:
    """Every error as one JSON shape. ``key_check``: the refusal, if any, that a request whose body could
    not be read is due from its route's key check (which had not run yet), answered in its place."""

    async def library(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClawVMError)
        response = response_for(exc)
        if response.status_code >= 500:  # the client gets a generic message; the log keeps the details
            log.error("library error", exc_info=exc)
        return response

    async def refused(request: Request) -> Response | None:
        refusal = None if key_check is None else await key_check(request)
        return None if refusal is None else response_for(refusal)

    async def request_shape(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return await refused(request) or _request_error(exc, request.url.path)

    async def http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400:  # a body FastAPI could not parse (too deep, too many digits)
            return await refused(request) or _http_error(request, exc)
        return _http_error(request, exc)

    app.add_exception_handler(ClawVMError, library)
    app.add_exception_handler(RequestValidationError, request_shape)
    app.add_exception_handler(StarletteHTTPException, http)
