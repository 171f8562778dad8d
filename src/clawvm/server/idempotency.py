"""``Idempotency-Key`` for the routes that create (``POST /v1/memories``,
``POST /v1/sessions/{id}/checkpoints``): a client that retries a request with the same key and the same body
gets the first response again, and nothing more is written; the same key with another body is a 409
(``idempotency_key_reused``) naming the header: the request itself is valid, the key is taken.

:class:`IdempotencyKeys` keeps, per tenant, each key's request fingerprint and its first successful
response, in this server process's memory. It is bounded three ways (:class:`ServerSettings`): a key
expires ``idempotency_ttl_s`` after its first use (24 h), and a tenant holds at most
``idempotency_max_keys`` keys and ``idempotency_max_bytes`` of responses (its oldest go first). A response
that is an error is not kept (nothing was written: a retry runs again). Keys do not survive a restart and
are not shared between server processes. What is: a memory recorded with a key is stored under an id made
from the tenant, the key and the body (:func:`keyed_id`), so a retry that reaches another worker, or comes
after a restart or after the key expired here, finds that memory and answers it (as it is now, marked
``Idempotent-Replayed`` like every replay) instead of recording it twice. The same key with another body
is a 409 only in the process that saw the first body.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Header
from fastapi.responses import Response
from pydantic import BaseModel

from clawvm.core.model import describe_pattern
from clawvm.server.errors import error_response

HEADER = "Idempotency-Key"
#: The header's value: 1 to 255 visible ASCII characters (a UUID is the usual choice).
KEY_PATTERN = r"^[\x21-\x7e]+$"
describe_pattern(
    KEY_PATTERN,
    "holds a space or a character outside visible ASCII",
    "send 1 to 255 visible ASCII characters, e.g. a UUID",
)
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        min_length=1,
        max_length=255,
        pattern=KEY_PATTERN,
        description="retry safely: the same key and body within 24 h returns the first response, writing "
        "nothing more",
    ),
]
REPLAYED_HEADER = "Idempotent-Replayed"
#: The OpenAPI ``responses`` of a route that takes an Idempotency-Key: its success may be a replay.
REPLAYED_RESPONSES: dict[int | str, dict[str, Any]] = {
    201: {
        "headers": {
            REPLAYED_HEADER: {
                "description": "`true` when this answers an earlier request with the same key (nothing was "
                "written); absent on a first answer",
                "required": False,
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    }
}


@dataclass
class _Entry:
    fingerprint: str
    created_s: float
    status: int | None = None  # None while the first request runs
    body: bytes = b""


@dataclass
class _Tenant:
    entries: OrderedDict[str, _Entry] = field(default_factory=OrderedDict)  # oldest first
    nbytes: int = 0


class IdempotencyKeys:
    """The keys of every tenant (see the module docstring). Thread-safe: routes run in a thread pool."""

    def __init__(
        self,
        ttl_s: float,
        max_keys: int,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._lock = threading.Lock()

    def begin(self, tenant: str, key: str, fingerprint: str) -> Response | None:
        """The response to replay for ``key``, or None when the caller should run the request (the key
        is then reserved until :meth:`finish` or :meth:`abandon`). A key used with another fingerprint is a
        409 ``idempotency_key_reused``; a key whose first request still runs is a 409
        ``idempotency_in_progress`` (both name the header)."""
        with self._lock:
            keys = self._tenants.setdefault(tenant, _Tenant())
            self._expire(keys)
            entry = keys.entries.get(key)
            if entry is None:
                keys.entries[key] = _Entry(fingerprint, self._clock())
                self._evict(keys)
                return None
            status, body = entry.status, entry.body
        if entry.fingerprint != fingerprint:
            return error_response(
                409,
                "idempotency_key_reused",
                "was already used for a different request (another route or body)",
                HEADER,
                "use a new key for each new request; reuse a key only to retry the same request",
            )
        if status is None:
            return error_response(
                409,
                "idempotency_in_progress",
                "the first request with this key is still running",
                HEADER,
                "retry after it has finished",
            )
        return replayed(Response(body, status, media_type="application/json"))

    def finish(self, tenant: str, key: str, status: int, body: bytes) -> None:
        """Keep the first successful response of ``key``."""
        with self._lock:
            keys = self._tenants.get(tenant)
            entry = keys.entries.get(key) if keys is not None else None
            if keys is None or entry is None:  # evicted while it ran: nothing to keep
                return
            entry.status, entry.body = status, body
            keys.nbytes += len(body)
            self._evict(keys)

    def abandon(self, tenant: str, key: str) -> None:
        """Free ``key`` after its request failed (nothing was written: a retry runs again)."""
        with self._lock:
            keys = self._tenants.get(tenant)
            if keys is not None:
                entry = keys.entries.pop(key, None)
                if entry is not None:
                    keys.nbytes -= len(entry.body)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(t.entries) for t in self._tenants.values())

    def _expire(self, keys: _Tenant) -> None:
        deadline = self._clock() - self.ttl_s
        while keys.entries:
            oldest = next(iter(keys.entries.values()))
            if oldest.created_s > deadline:
                break
            keys.entries.popitem(last=False)
            keys.nbytes -= len(oldest.body)

    def _evict(self, keys: _Tenant) -> None:
        """Drop the oldest keys until the tenant is within its bounds (the newest always stays)."""
        while len(keys.entries) > 1 and (len(keys.entries) > self.max_keys or keys.nbytes > self.max_bytes):
            _key, oldest = keys.entries.popitem(last=False)
            keys.nbytes -= len(oldest.body)


def fingerprint(route: str, body: BaseModel) -> str:
    """What makes two requests the same: the route (method and path) and the body as parsed."""
    return hashlib.sha256(f"{route}\n{body.model_dump_json()}".encode()).hexdigest()


#: The namespace of :func:`keyed_id`'s ids (a fixed random UUID: the ids must not change between releases).
_KEYED_IDS = uuid.UUID("5b0f6d1e-8c57-4b7a-9d7e-2f61c0a4e913")


def keyed_id(tenant: str, key: str, route: str, body: BaseModel) -> str:
    """The id a request with ``key`` records its memory under: the same tenant, key and body give the same id
    in every server process and after a restart, so a retry that reaches another worker (or outlives this
    process's keys) finds the memory stored instead of writing it twice."""
    return str(uuid.uuid5(_KEYED_IDS, f"{tenant}\n{key}\n{fingerprint(route, body)}"))


@dataclass(frozen=True)
class Found:
    """What ``run()`` of :func:`once` returns when the store already holds what an earlier request with the
    same key made (another worker, or this process before a restart, ran it): the answer is a replay."""

    result: BaseModel


def replayed(response: Response) -> Response:
    """``response`` marked as the answer of an earlier request: every replay carries the header, whether
    this process kept the key's response or the store held what the key made."""
    response.headers[REPLAYED_HEADER] = "true"
    return response


def once(
    keys: IdempotencyKeys,
    tenant: str,
    key: str | None,
    route: str,
    body: BaseModel,
    status: int,
    run: Callable[[], BaseModel | Found],
) -> Response:
    """``run()`` once per ``key``, answered as JSON bytes with ``status``; with a key, a retry with the same
    body gets the same bytes again.

    Why bytes: the route's ``response_model`` then only documents the answer. FastAPI would validate the
    result against it again and encode it in one more trip to the thread pool (a third of the HTTP
    overhead of a record); ``run()`` already returns that model, and pydantic dumps it to JSON directly."""
    if key is None:
        return _answer(run(), status)
    replay = keys.begin(tenant, key, fingerprint(route, body))
    if replay is not None:
        return replay
    try:
        result = run()
    except BaseException:
        keys.abandon(tenant, key)
        raise
    response = _answer(result, status)
    keys.finish(tenant, key, status, bytes(response.body))
    return response


def _answer(result: BaseModel | Found, status: int) -> Response:
    if isinstance(result, Found):
        return replayed(json_response(result.result, status))
    return json_response(result, status)


def json_response(result: BaseModel, status: int = 200) -> Response:
    """``result`` as a JSON response, dumped by pydantic straight to bytes."""
    return Response(result.model_dump_json(), status, media_type="application/json")
