"""The REST server: :func:`create_app` builds a FastAPI app over one store; ``clawvm serve`` runs it.

- One :class:`Service` per app: the shared engine, one embedding worker for it, the :class:`Keyring`,
  the rate limiter, and one :class:`Harness` per tenant over a :class:`TenantStore` view, so tenant
  isolation is enforced by the store layer whatever a route does.
- Routes live on APIRouters (``create_app(routers=...)`` mounts more, e.g. the dashboard's) and only
  call the library. A route declares what it needs with :data:`Reader`, :data:`Writer` or
  :data:`Admin`: the dependency authenticates the API key, applies the per-key rate limit, checks the
  role and hands over the caller's tenant harness.
- Every 4xx/5xx is ``{"error": {"code", "message", "field", "fix"}}``: library errors are mapped in
  :data:`ERRORS` (the one place), request-shape errors and HTTP errors next to it.
- :class:`Guard` (ASGI middleware) gives each request an id, bounds the body size, rejects bodies that
  are not UTF-8, turns any unexpected exception into a 500 of the same schema, and writes one JSON log
  line per request (never bodies or keys).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TextIO

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Security
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from clawvm.core.embed import Embedder, EmbedWorker, MiniLMEmbedder
from clawvm.core.errors import (
    AccessDeniedError,
    AuthenticationError,
    ClawVMError,
    ConfigError,
    ConflictError,
    CryptoError,
    EmbedderError,
    InvalidToolResultError,
    NotFoundError,
    RateLimitError,
    SchemaError,
    StoreError,
    ValidationError,
)
from clawvm.core.model import DEFAULT_MAX_CONTENT_BYTES, DEPTH_FIX, VISIBLE_STATUSES, Memory, Status, Tier
from clawvm.core.redact import RedactionPolicy
from clawvm.core.version import __version__
from clawvm.harness import Harness
from clawvm.server.schemas import (
    CheckpointOut,
    CheckpointRequest,
    CollapseOut,
    ContextOut,
    ContextRequest,
    ErrorBody,
    EventOut,
    EventsPage,
    FeedbackRequest,
    Health,
    ImportOut,
    ImportRequest,
    KeyCreated,
    KeyOut,
    KeyRequest,
    ListQuery,
    RecallHit,
    RecallRequest,
    RecordRequest,
    RollbackOut,
    StartSessionRequest,
    StatsOut,
    TickOut,
    UpdateRequest,
    ValueOut,
)
from clawvm.store import Store, store_from_url
from clawvm.store.crypto import KEY_ENV, KEY_FILE_ENV, DataKeys
from clawvm.store.eventlog import EventTail
from clawvm.store.keys import Keyring, Permission, Principal
from clawvm.store.tenant import TenantStore
from clawvm.write.redaction import Redactor

log = logging.getLogger("clawvm.server.app")

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[..., Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class ServerSettings:
    """Limits and options of one server. ``rate_per_s <= 0`` turns the rate limit off."""

    max_body_bytes: int = 2 * 1024 * 1024  # above the 1 MB content limit plus JSON escaping of most texts
    rate_per_s: float = 50.0  # per API key, sustained
    burst: int = 100  # per API key, requests allowed at once
    keys_refresh_s: float = 2.0  # how soon a key revoked by another process stops working
    heartbeat_s: float = 15.0  # an event stream sends a comment this often when quiet (and rechecks its key)
    events_poll_s: float = 0.5  # how often event streams read engines that do not push (EventFeed)
    preset: str | None = None
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES


# ---- errors: one schema, one mapping ----------------------------------------------------------------------
#: Library error -> (HTTP status, error code). The first matching class wins (subclasses first).
ERRORS: tuple[tuple[type[ClawVMError], int, str], ...] = (
    (ValidationError, 422, "validation_error"),
    (ConfigError, 422, "invalid_option"),
    (NotFoundError, 404, "not_found"),
    (ConflictError, 409, "conflict"),
    (AuthenticationError, 401, "unauthorized"),
    (AccessDeniedError, 403, "forbidden"),
    (RateLimitError, 429, "rate_limited"),
    (InvalidToolResultError, 422, "invalid_tool_result"),
    (CryptoError, 500, "crypto_error"),  # a sealed original that the server's data keys cannot open
    (SchemaError, 500, "schema_error"),
    (StoreError, 503, "store_unavailable"),
    (EmbedderError, 503, "embedder_unavailable"),
    (ClawVMError, 500, "internal_error"),
)

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
    "value_error": "see the message",
    "json_too_deep": DEPTH_FIX,  # the library's own check (clawvm.core.model), e.g. memories in an import
}

_MESSAGES_5XX = {
    "store_unavailable": "the storage engine failed; retry later",
    "embedder_unavailable": "the embedding model failed; retry later",
    "schema_error": "the database schema is not usable by this server version",
    "crypto_error": "protected content could not be decrypted with the server's data keys",
    "internal_error": "unexpected server error",
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "Malformed request: not JSON, or not UTF-8"),
        (401, "Missing, unknown or revoked API key"),
        (403, "The key's role may not do this, or the data is another tenant's"),
        (404, "Not found (ids of other tenants are not found either)"),
        (409, "Version conflict: re-read and retry"),
        (413, "Request body over the size limit"),
        (422, "Invalid input; `field` names it"),
        (429, "Rate limit of this API key exceeded; see Retry-After"),
        (500, "Unexpected server error"),
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
    elif isinstance(exc, NotFoundError):
        field, fix = f"{exc.what}_id", "check the id: it may have been forgotten, or never existed"
    elif isinstance(exc, ConflictError):
        field, fix = "expected_version", "re-read the memory and retry with its current version"
    elif isinstance(exc, AuthenticationError):
        field, fix = "Authorization", "send a valid key as 'Authorization: Bearer <key>' (clawvm keys create)"
    elif isinstance(exc, RateLimitError):
        fix = f"slow down; retry after {exc.retry_after_s:.2f} s"
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if status >= 500:
        message = _MESSAGES_5XX.get(code, "unexpected server error")
        fix = fix or "retry later; the server log has the details (search for the X-Request-ID)"
    return error_response(status, code, message, field, fix, headers or None)


def _request_error(exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    where = loc[0] if loc else "body"
    path = loc[1:] if where in ("body", "query", "path", "header", "cookie") else loc
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        reason = first.get("ctx", {}).get("error", "invalid JSON")
        return error_response(400, "invalid_json", f"is not valid JSON ({reason})", "body", "send JSON")
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    return error_response(
        422, "validation_error", message, ".".join(path) or where, _FIXES.get(kind, "correct the value")
    )


def _http_error(exc: StarletteHTTPException) -> JSONResponse:
    code, field, fix = {
        400: ("bad_request", "body", "send a JSON body"),
        404: ("not_found", None, "see /docs for the routes"),
        405: ("method_not_allowed", None, "see the Allow header"),
    }.get(exc.status_code, ("http_error", None, None))
    return error_response(exc.status_code, code, str(exc.detail), field, fix, dict(exc.headers or {}) or None)


def install_error_handlers(app: FastAPI) -> None:
    async def library(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClawVMError)
        response = response_for(exc)
        if response.status_code >= 500:  # the client gets a generic message; the log keeps the details
            log.error("library error", exc_info=exc)
        return response

    async def request_shape(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _request_error(exc)

    async def http(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _http_error(exc)

    app.add_exception_handler(ClawVMError, library)
    app.add_exception_handler(RequestValidationError, request_shape)
    app.add_exception_handler(StarletteHTTPException, http)


# ---- structured logs ---------------------------------------------------------------------------------------
class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the record's ``fields`` and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Route every logger (ours and uvicorn's) to one JSON-lines handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


# ---- middleware: request id, body limit, UTF-8, last-resort 500, access log --------------------------------
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class _Rejected(Exception):
    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


class Guard:
    """Pure ASGI middleware; see the module docstring. The body is read once here (bounded) and replayed."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

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
        given = Headers(scope=scope).get("x-request-id", "")
        request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        sent = {"status": 0}

        async def send_with_id(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                MutableHeaders(scope=message).append("X-Request-ID", request_id)
            await send(message)

        try:
            body = await self._body(scope, receive)
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
        principal = scope.get("state", {}).get("principal")
        fields: dict[str, Any] = {
            "request_id": request_id,
            "method": scope.get("method"),
            "path": scope.get("path"),
            "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        if isinstance(principal, Principal):
            fields.update(tenant=principal.tenant, key_id=principal.key_id, role=principal.role.value)
        log.log(logging.ERROR if status >= 500 else logging.INFO, "request", extra={"fields": fields})


def _replay(body: bytes, receive: Receive) -> Receive:
    done = False

    async def replay() -> MutableMapping[str, Any]:
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ---- the service behind the routes ---------------------------------------------------------------------
class RateLimiter:
    """Token bucket per key: ``rate_per_s`` sustained, ``burst`` at once. Off when ``rate_per_s <= 0``."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.burst = max(1, burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        if self.rate <= 0:
            return
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                raise RateLimitError((1.0 - tokens) / self.rate)
            self._buckets[key] = (tokens - 1.0, now)


class Service:
    """What the routes share: the engine, its embedding worker, the keyring, the limiter, tenant harnesses."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        settings: ServerSettings,
        *,
        owns_store: bool = True,
        harness_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.harness_options = dict(harness_options or {})
        if self.harness_options.get("redaction") is not None:
            # resolve the data keys once, now: a policy keeping originals without a key fails at start,
            # not at some tenant's first request
            redactor = Redactor(self.harness_options["redaction"], self.harness_options.get("data_keys"))
            self.harness_options["data_keys"] = redactor.keys
        store.setup()
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self.owns_store = owns_store
        self.keyring = Keyring(store, refresh_s=settings.keys_refresh_s)
        self.limiter = RateLimiter(settings.rate_per_s, settings.burst)
        # one worker embeds for every tenant, straight on the engine (a worker per tenant view would
        # scan the others' backlog)
        self.worker = EmbedWorker(embedder, store.unembedded, store.set_vectors) if embedder else None
        if self.worker is not None:
            self.worker.start()
        self._harnesses: dict[str, Harness] = {}
        self._lock = threading.Lock()
        self.live = EventTail(store, poll_s=settings.events_poll_s)  # what event streams wait on

    def harness_for(self, tenant: str) -> Harness:
        """The tenant's harness, over a view of the engine confined to that tenant (made once)."""
        with self._lock:
            harness = self._harnesses.get(tenant)
            if harness is None:
                harness = Harness(
                    TenantStore(self.store, tenant),
                    self.embedder,
                    tenant=tenant,
                    preset_name=self.settings.preset,
                    max_content_bytes=self.settings.max_content_bytes,
                    **self.harness_options,
                )
                harness._worker = self.worker  # records notify the shared worker
                self._harnesses[tenant] = harness
            return harness

    def readiness(self) -> dict[str, str]:
        """Raises if the store cannot be read; reports the embedder."""
        self.store.read_events(0, 1)
        return {"store": "ok", "embedder": "ok" if self.embedder is not None else "off (lexical recall only)"}

    def key_active(self, principal: Principal) -> bool:
        """Whether the caller's key still works (an open event stream ends once it is revoked)."""
        return self.keyring.active(principal.key_id)

    def close(self) -> None:
        self.live.stop()
        if self.worker is not None:
            try:
                self.worker.flush(timeout=30)
            except (TimeoutError, EmbedderError) as exc:
                log.warning("embedding queue not drained at shutdown", extra={"fields": {"error": str(exc)}})
            self.worker.stop()
            self.worker = None
        if self.owns_store:
            self.store.close()


def _embedder(spec: Embedder | str | None) -> Embedder | None:
    if spec == "default":
        return MiniLMEmbedder()
    if spec is None or spec == "none":
        return None
    if isinstance(spec, str):
        raise ValidationError("embedder", f"is {spec!r}", "use 'default', 'none' or an Embedder")
    return spec


# ---- authentication and roles as dependencies ---------------------------------------------------------
@dataclass(frozen=True)
class Caller:
    """The authenticated caller and the harness of its tenant."""

    principal: Principal
    harness: Harness


_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: <API key>")


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def authenticate(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
    header_key: Annotated[str | None, Security(_api_key_header)] = None,
) -> Principal:
    """The caller of this request (401 without a valid key; 429 over the key's rate limit)."""
    service = service_of(request)
    principal = service.keyring.authenticate(bearer.credentials if bearer is not None else header_key)
    request.state.principal = principal  # for the access log
    service.limiter.check(principal.key_id)
    return principal


def caller_with(permission: Permission) -> Callable[..., Caller]:
    """A dependency: the caller, if its role grants ``permission`` (else 403)."""

    def dependency(request: Request, principal: Annotated[Principal, Depends(authenticate)]) -> Caller:
        principal.require(permission)
        return Caller(principal, service_of(request).harness_for(principal.tenant))

    return dependency


Reader = Annotated[Caller, Depends(caller_with(Permission.READ))]
Writer = Annotated[Caller, Depends(caller_with(Permission.WRITE))]
Admin = Annotated[Caller, Depends(caller_with(Permission.ADMIN))]

MemoryId = Annotated[str, PathParam(min_length=1, max_length=100, description="a memory id")]
ScopeId = Annotated[str, PathParam(min_length=1, max_length=256)]


def _bookkeeping(requested: bool | None, caller: Caller) -> bool:
    """Whether a read also records usage: by default yes for writers; read-only keys may not."""
    if requested is None:
        return caller.principal.can(Permission.WRITE)
    if requested:
        caller.principal.require(Permission.WRITE)
    return requested


# ---- routes -------------------------------------------------------------------------------------------
health = APIRouter(tags=["health"], responses={503: ERROR_RESPONSES[503], 500: ERROR_RESPONSES[500]})
v1 = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


@health.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@health.get("/readyz", response_model=Health)
def readyz(request: Request) -> Health:
    """Readiness: the store answers a read."""
    return Health(status="ready", checks=service_of(request).readiness())


@v1.get("/whoami", tags=["keys"])
def whoami(caller: Reader) -> dict[str, str]:
    p = caller.principal
    return {"key_id": p.key_id, "tenant": p.tenant, "role": p.role.value}


@v1.post("/memories", status_code=201, response_model=Memory, tags=["memories"])
def record(body: RecordRequest, caller: Writer) -> Memory:
    """Record a new memory (lexically searchable at once, embedded in the background)."""
    return caller.harness.record(body.content, embedding=body.embedding, **body.fields())


@v1.get("/memories", response_model=list[Memory], tags=["memories"])
def list_memories(query: Annotated[ListQuery, Query()], caller: Reader) -> list[Memory]:
    """The newest memories matching the filters (active ones unless ``status`` says otherwise)."""
    return caller.harness.list(limit=query.limit, **query.as_kwargs())


@v1.post("/memories/import", response_model=ImportOut, tags=["memories"])
def import_memories(body: ImportRequest, caller: Admin) -> ImportOut:
    """Store exported memories as they are (ids already present are skipped)."""
    own = {"tenant": caller.principal.tenant}
    memories = [m if "tenant" in m.model_fields_set else m.model_copy(update=own) for m in body.memories]
    n = caller.harness.import_memories(memories)
    return ImportOut(imported=n, skipped=len(memories) - n)


@v1.get("/memories/{memory_id}", response_model=Memory, tags=["memories"])
def get_memory(memory_id: MemoryId, caller: Reader) -> Memory:
    return caller.harness.get(memory_id)


@v1.patch("/memories/{memory_id}", response_model=Memory, tags=["memories"])
def update_memory(memory_id: MemoryId, body: UpdateRequest, caller: Writer) -> Memory:
    """Change fields; the version grows by one. A stale ``expected_version`` is a 409."""
    changes = body.changes()
    if not changes:
        raise ValidationError("body", "changes nothing", "send at least one field to change")
    return caller.harness.update(memory_id, expected_version=body.expected_version, **changes)


@v1.delete("/memories/{memory_id}", status_code=204, tags=["memories"])
def forget_memory(memory_id: MemoryId, caller: Writer) -> Response:
    """Delete a memory for good."""
    caller.harness.forget(memory_id)
    return Response(status_code=204)


class OriginalOut(BaseModel):
    """A memory's original content, as recorded before redaction."""

    id: str
    content: str
    content_type: str


@v1.get("/memories/{memory_id}/original", response_model=OriginalOut, tags=["memories"])
def reveal_original(memory_id: MemoryId, caller: Admin) -> OriginalOut:
    """The original of a memory stored redacted, opened with the server's data key (admin keys only: others
    get 403). Each reveal is logged as a ``reveal`` event. 404 when no original was kept (the server does
    not run with ``--keep-originals``, or the memory was recorded before); a memory with nothing redacted
    answers its content."""
    original = caller.harness.reveal(memory_id, admin=True)
    content_type = caller.harness.get(memory_id).content_type
    return OriginalOut(id=memory_id, content=original, content_type=content_type)


@v1.post("/memories/{memory_id}/pin", response_model=Memory, tags=["memories"])
def pin(memory_id: MemoryId, caller: Writer) -> Memory:
    return caller.harness.pin(memory_id)


@v1.post("/memories/{memory_id}/unpin", response_model=Memory, tags=["memories"])
def unpin(memory_id: MemoryId, caller: Writer) -> Memory:
    return caller.harness.unpin(memory_id)


@v1.post("/memories/{memory_id}/feedback", response_model=Memory, tags=["memories"])
def feedback(memory_id: MemoryId, body: FeedbackRequest, caller: Writer) -> Memory:
    """User feedback (+1 useful / -1 not useful); feeds the value score."""
    return caller.harness.rate(memory_id, body.delta)


@v1.get("/memories/{memory_id}/value", response_model=ValueOut, tags=["memories"])
def value(memory_id: MemoryId, caller: Reader) -> ValueOut:
    """Every component of the memory's value score right now."""
    return ValueOut.of(caller.harness.explain(memory_id))


@v1.post("/memories/{memory_id}/compress", response_model=Memory, tags=["memories"])
def compress(memory_id: MemoryId, caller: Writer) -> Memory:
    return caller.harness.compress(memory_id)


@v1.post("/memories/{memory_id}/decompress", response_model=Memory, tags=["memories"])
def decompress(memory_id: MemoryId, caller: Writer) -> Memory:
    return caller.harness.decompress(memory_id)


@v1.get(
    "/export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "one memory per line"}},
    tags=["memories"],
)
def export(caller: Reader) -> StreamingResponse:
    """Every memory of the tenant as JSON Lines (lossless), oldest first."""
    lines: Iterator[str] = (m.to_json() + "\n" for m in caller.harness.store.iter_all())
    return StreamingResponse(lines, media_type="application/x-ndjson")


@v1.post("/recall", response_model=list[RecallHit], tags=["recall"])
def recall(body: RecallRequest, caller: Reader) -> list[RecallHit]:
    """The ``k`` best memories for ``query``, with each channel's part of the score."""
    hits = caller.harness.recall(
        body.query,
        k=body.k,
        preset=body.preset,
        track=_bookkeeping(body.track, caller),
        **body.filters.as_kwargs(),
    )
    return [RecallHit.of(h) for h in hits]


@v1.post("/context", response_model=ContextOut, tags=["recall"])
def context(body: ContextRequest, caller: Reader) -> ContextOut:
    """A prompt-ready context under a token budget, with the manifest of every line."""
    ctx = caller.harness.context(
        body.query,
        budget_tokens=body.budget_tokens,
        session_id=body.session_id,
        task_id=body.task_id,
        agent_id=body.agent_id,
        k=body.k,
        neighbours=body.neighbours,
        record_usage=_bookkeeping(body.record_usage, caller),
    )
    return ContextOut.of(ctx)


@v1.post(
    "/sessions/{session_id}/checkpoints", status_code=201, response_model=CheckpointOut, tags=["sessions"]
)
def checkpoint(session_id: ScopeId, body: CheckpointRequest, caller: Writer) -> CheckpointOut:
    """Snapshot the session's tiers and value state."""
    return CheckpointOut(id=caller.harness.checkpoint(session_id, body.name))


@v1.post("/checkpoints/{checkpoint_id}/rollback", response_model=RollbackOut, tags=["sessions"])
def rollback(checkpoint_id: MemoryId, caller: Writer) -> RollbackOut:
    """Restore a checkpoint; memories created after it become obsolete (not deleted)."""
    return RollbackOut.of(caller.harness.rollback(checkpoint_id))


@v1.post("/sessions/{session_id}/start", response_model=list[Memory], tags=["sessions"])
def start_session(session_id: ScopeId, body: StartSessionRequest, caller: Writer) -> list[Memory]:
    """Preload the working tier with the memories most relevant to ``task``."""
    return caller.harness.start_session(session_id, body.task, task_id=body.task_id, k=body.k)


@v1.post("/tasks/{task_id}/collapse", response_model=CollapseOut, tags=["sessions"])
def collapse(task_id: ScopeId, caller: Writer) -> CollapseOut:
    """Compress a finished task's intermediate steps into one summary linked to them."""
    return CollapseOut(summary=caller.harness.collapse_task(task_id))


@v1.post("/tick", response_model=TickOut, tags=["sessions"])
def tick(caller: Writer) -> TickOut:
    """Pager pass: expire TTLs, refresh values, page idle sessions out."""
    return TickOut.model_validate(caller.harness.tick())


@v1.get("/events", response_model=EventsPage, tags=["events"])
def events(
    caller: Reader,
    after_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    memory_id: Annotated[str | None, Query(min_length=1, max_length=100)] = None,
) -> EventsPage:
    """The tenant's event log (what happened to which memory, and why), oldest first."""
    found = caller.harness.events(after_seq=after_seq, limit=limit, memory_id=memory_id)
    last = found[-1].seq if found and found[-1].seq is not None else after_seq
    return EventsPage(events=[EventOut.of(e) for e in found], next_after_seq=last)


@v1.get(
    "/events/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
    tags=["events"],
)
async def event_stream(
    request: Request,
    caller: Reader,
    after_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
    max_s: Annotated[float | None, Query(gt=0, le=86400, description="end the stream after this")] = None,
    last_event_id: Annotated[str | None, Header(pattern=r"^[0-9]{1,18}$")] = None,
) -> StreamingResponse:
    """The tenant's events as they happen, as server-sent events: each event after ``after_seq`` (or after
    the ``Last-Event-ID`` a reconnecting client sends) is one ``id: <seq>`` + ``data: <event JSON>``
    message, as in ``/v1/events``; a comment line every ~15 s keeps a quiet stream open. Events written
    by any server process on the same database arrive (PostgreSQL pushes them; other engines are polled
    every 0.5 s). The stream ends after ``max_s`` seconds, when the key is revoked, or at shutdown."""
    service = service_of(request)
    start = int(last_event_id) if last_event_id is not None else after_seq
    return StreamingResponse(
        _sse(service, caller, start, max_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},  # no proxy buffering either
    )


async def _sse(service: Service, caller: Caller, after_seq: int, max_s: float | None) -> AsyncIterator[str]:
    """The wire format of :func:`event_stream` over :meth:`EventTail.follow`."""
    yield "retry: 2000\n: open\n\n"  # reconnect after 2 s; the comment flushes the headers at once
    follow = service.live.follow(
        caller.harness.events, after_seq, heartbeat_s=service.settings.heartbeat_s, max_s=max_s
    )
    async with aclosing(follow) as batches:
        async for batch in batches:
            if batch:
                yield "".join(f"id: {e.seq}\ndata: {EventOut.of(e).model_dump_json()}\n\n" for e in batch)
            elif await asyncio.to_thread(service.key_active, caller.principal):
                yield ": heartbeat\n\n"
            else:
                return


@v1.get("/stats", response_model=StatsOut, tags=["events"])
def stats(caller: Reader) -> StatsOut:
    h = caller.harness
    by_status = {s.value: h.count(status=s) for s in Status if s in VISIBLE_STATUSES}  # not INTERNAL
    by_tier = {t.value: h.count(status="any", tier=t) for t in Tier}
    return StatsOut(memories=sum(by_status.values()), by_status=by_status, by_tier=by_tier)


@v1.get("/keys", response_model=list[KeyOut], tags=["keys"])
def list_keys(
    request: Request, caller: Admin, include_revoked: Annotated[bool, Query()] = False
) -> list[KeyOut]:
    """The tenant's API keys (never the keys themselves)."""
    keys = service_of(request).keyring.list(caller.principal.tenant, include_revoked=include_revoked)
    return [KeyOut.of(k) for k in keys]


@v1.post("/keys", status_code=201, response_model=KeyCreated, tags=["keys"])
def create_key(request: Request, body: KeyRequest, caller: Admin) -> KeyCreated:
    """A new key of the caller's tenant; the response holds the key, shown this once."""
    record_, token = service_of(request).keyring.create(caller.principal.tenant, body.role, body.name)
    return KeyCreated(**KeyOut.of(record_).model_dump(), key=token)


@v1.delete("/keys/{key_id}", response_model=KeyOut, tags=["keys"])
def revoke_key(
    request: Request, key_id: Annotated[str, PathParam(min_length=1, max_length=64)], caller: Admin
) -> KeyOut:
    """Revoke one of the tenant's keys (it stops working at once on this server)."""
    return KeyOut.of(service_of(request).keyring.revoke(key_id, caller.principal.tenant))


# ---- the app --------------------------------------------------------------------------------------------
def redaction_options(
    *, redact: bool = True, keep_originals: bool = False, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``harness_options`` of a server that redacts new content (``clawvm serve``'s default).

    ``redact``: apply :mod:`clawvm.core.redact`'s default policy (every kind) to every tenant, so a shared
    service keeps no personal data or secrets in clear. ``keep_originals``: seal each original with the
    data key from ``CLAWVM_DATA_KEY`` or ``CLAWVM_DATA_KEY_FILE`` (read from ``environ``, default the
    process's), for admins to read at ``GET /v1/memories/{id}/original``. Raises :class:`ConfigError`
    when originals are to be kept without a key, or without redaction.
    """
    if not redact:
        if keep_originals:
            raise ConfigError("--keep-originals keeps what redaction removes: it needs --redact")
        return {}
    if not keep_originals:
        return {"redaction": RedactionPolicy()}
    keys = DataKeys.from_env(environ)
    if keys is None:
        raise ConfigError(
            f"--keep-originals seals originals with a data key, and none is set: set {KEY_ENV} (base64 of 32"
            f" random bytes) or {KEY_FILE_ENV} (a file of such keys); see clawvm.store.crypto"
        )
    return {"redaction": RedactionPolicy(keep_original=True), "data_keys": keys}


def create_app(
    target: str | Path | Store = "clawvm.db",
    *,
    embedder: Embedder | str | None = "default",
    settings: ServerSettings | None = None,
    routers: Sequence[APIRouter] = (),
    harness_options: Mapping[str, Any] | None = None,
) -> FastAPI:
    """The ClawVM REST app over ``target`` (a store URL or path, or an open-able Store).

    ``embedder``: ``"default"`` (offline MiniLM), ``None`` (lexical recall only) or an Embedder.
    ``routers``: more APIRouters to mount (they can depend on :data:`Reader`/:data:`Writer`/:data:`Admin`).
    ``harness_options``: more keyword arguments for every tenant's :class:`Harness` (``pager``,
    ``redaction`` — one policy or one per tenant —, ``data_keys``, ``summarizer`` ...).
    A Store passed in is set up but left open at shutdown (its owner closes it); one opened from a URL is
    closed with the app.
    """
    settings = settings or ServerSettings()
    emb = _embedder(embedder)
    owns = not isinstance(target, Store)
    store = target if isinstance(target, Store) else store_from_url(target, dim=emb.dim if emb else 384)
    service = Service(store, emb, settings, owns_store=owns, harness_options=harness_options)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            service.close()

    app = FastAPI(
        title="ClawVM",
        version=__version__,
        description="Harness-managed memory for LLM agents. Every error is "
        '`{"error": {"code", "message", "field", "fix"}}`.',
        lifespan=lifespan,
    )
    app.state.service = service
    app.add_middleware(Guard, max_body_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    app.include_router(health)
    app.include_router(v1)
    # mounted routers document the same error responses (the spec then lists every status they answer)
    app.include_router(_dashboard(), responses=ERROR_RESPONSES)
    for router in routers:
        app.include_router(router, responses=ERROR_RESPONSES)
    return app


class _Uvicorn(uvicorn.Server):
    """uvicorn that ends the app's event streams as soon as it is asked to exit (SIGINT, SIGTERM): it waits
    for open responses before it stops, and a live stream would never end by itself."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    async def main_loop(self) -> None:
        await super().main_loop()  # returns once an exit was asked for, before connections are drained
        self._on_exit()


def run_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve an app of :func:`create_app` with uvicorn until SIGINT/SIGTERM (``clawvm serve``). Open event
    streams end at once then; any other response still running after 10 s is cancelled."""
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=10
    )
    service: Service = app.state.service
    _Uvicorn(config, service.live.stop).run()


def _dashboard() -> APIRouter:
    """The MemLens dashboard (:mod:`clawvm.dashboard`) at /dashboard, behind the same keys and roles."""
    from clawvm.dashboard import create_router

    def read(caller: Reader) -> Harness:
        return caller.harness

    def write(caller: Writer) -> Harness:
        return caller.harness

    return create_router(read, write)
