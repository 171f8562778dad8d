"""Who calls, and what they may do: an API key (``Authorization: Bearer <key>`` or ``X-API-Key``) names a
:class:`Principal` (a tenant and a role); a route declares the permission it needs by taking a
:data:`Reader`, :data:`Writer` or :data:`Admin` argument. That dependency authenticates the key (401),
applies the rate limits of the key, of its tenant and of unauthenticated clients (429), checks the role
(403) and hands over the :class:`Caller`: the principal and the harness of its tenant. Minting a key takes
a token of its tenant's minting limit too, in the route once the body is valid (:meth:`Service.mint`).

==========  ==================  ==============================================================
argument    the key's role      routes
==========  ==================  ==============================================================
Reader      any                 get, list, export, value, recall, context, events, stats, whoami
Writer      agent or admin      record, update, forget, pin, feedback, compress, sessions, tick
Admin       admin               the tenant's keys, import, originals kept before redaction
==========  ==================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.dependencies.models import Dependant
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from clawvm.core.errors import AuthenticationError, ClawVMError
from clawvm.harness import Harness
from clawvm.server.routes.params import known_query_only
from clawvm.server.service import Service, service_of
from clawvm.store.keys import Permission, Principal


@dataclass(frozen=True)
class Caller:
    """The authenticated caller and the harness of its tenant."""

    principal: Principal
    harness: Harness


_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: <API key>")


async def authenticate(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
    header_key: Annotated[str | None, Security(_api_key_header)] = None,
) -> Principal:
    """The caller of this request: 401 without a valid key (``key_expired`` past its expiry); 429 over the
    key's or the tenant's rate limit, or from a client address whose unauthenticated requests are over
    theirs (refused before the key is even looked up).

    Why async: a sync dependency costs a hop to the thread pool and back on every request (FastAPI runs
    each one there), and a cached key is checked in microseconds from memory. Only a key that must be
    read from the store (not cached, or cached more than ``keys_refresh_s`` ago) goes to a thread, so the
    event loop never waits on the store."""
    service = service_of(request)
    token = bearer.credentials if bearer is not None else header_key
    if service.keyring.needs_lookup(token):
        return await run_in_threadpool(_authenticate, request, service, token)
    return _authenticate(request, service, token)


def _authenticate(request: Request, service: Service, token: str | None) -> Principal:
    client = request.client.host if request.client is not None else "unknown"
    principal = identify(service, client, token, request.headers.get("authorization"))
    request.state.principal = principal  # for the access log
    service.admit(principal)
    return principal


def identify(service: Service, client: str, token: str | None, authorization: str | None) -> Principal:
    """The principal of API key ``token`` (REST and MCP): 401 without a valid one (``authorization``, the
    header, says why when it held no ``Bearer <key>``); 429 for a ``client`` address whose failures are
    over the unauthenticated limit, refused before any key lookup (a failure spends one of its tokens)."""
    service.unauthenticated.peek(client)
    try:
        if token is None and authorization:
            _refuse_scheme(authorization)
        return service.keyring.authenticate(token)
    except AuthenticationError:
        service.unauthenticated.spend(client)
        raise


def _refuse_scheme(sent: str) -> None:
    """An Authorization header that is not ``Bearer <key>`` (a bare key, ``Token <key>``): said so, where
    "no API key" was true of nothing the caller could see. The header's value is not repeated (it may be
    the key)."""
    stripped = sent.strip()
    if stripped.lower() == "bearer":
        raise AuthenticationError(
            "the Authorization header has no key after 'Bearer': send 'Authorization: Bearer <key>'"
        )
    scheme = stripped.split(" ", 1)[0] if " " in stripped else None
    found = f"its scheme is {scheme!r}" if scheme else "it has no scheme"
    raise AuthenticationError(
        f"the Authorization header is not 'Bearer <key>' ({found}): "
        "send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
    )


#: each dependency :func:`caller_with` made -> the permission it checks
_PERMISSION_OF: dict[Callable[..., Awaitable[Caller]], Permission] = {}


def caller_with(permission: Permission) -> Callable[..., Awaitable[Caller]]:
    """A dependency: the caller, if its role grants ``permission`` (else 403). Async for the reason
    :func:`authenticate` is: only a tenant's first request, which makes its harness, goes to a thread."""

    async def dependency(request: Request, principal: Annotated[Principal, Depends(authenticate)]) -> Caller:
        return await _caller(request, principal, permission)

    _PERMISSION_OF[dependency] = permission
    return dependency


@dataclass(frozen=True)
class KeyCheck:
    """What a route asks of its caller's key: to be valid, and to grant ``permission`` when it names one."""

    permission: Permission | None


def key_check_of(dependant: Dependant) -> KeyCheck | None:
    """What the route of ``dependant`` asks of the caller's key (None: nothing, a public route)."""
    if dependant.call in _PERMISSION_OF:
        return KeyCheck(_PERMISSION_OF[dependant.call])
    if dependant.call is authenticate:
        return KeyCheck(None)
    return next(filter(None, map(key_check_of, dependant.dependencies)), None)


async def refusal_before_the_body(request: Request) -> ClawVMError | None:
    """The 401, 403 or 429 that a request whose body could not be read (not JSON, nested too deep) is due
    from its route's key check. FastAPI reads the body before the route's dependencies run, so such a
    request was answered 400 before its key was looked at: a caller without a key learnt how its body
    fared, and its failures spent none of the unauthenticated clients' limit. None when the key passes
    (charged, as for any request) or the route takes none."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    check = key_check_of(dependant) if isinstance(dependant, Dependant) else None
    if check is None or getattr(request.state, "principal", None) is not None:
        return None  # a public route, or the key was checked already
    try:
        principal = await authenticate(request, await _bearer(request), await _api_key_header(request))
        if check.permission is not None:
            principal.require(check.permission)
    except ClawVMError as refused:
        return refused
    return None


async def _caller(request: Request, principal: Principal, permission: Permission) -> Caller:
    principal.require(permission)
    await known_query_only(request)  # after the key: a caller without one learns no parameter names
    service = service_of(request)
    harness = service.harness_made(principal.tenant)
    if harness is None:
        harness = await run_in_threadpool(service.harness_for, principal.tenant)
    return Caller(principal, harness)


Reader = Annotated[Caller, Depends(caller_with(Permission.READ))]
Writer = Annotated[Caller, Depends(caller_with(Permission.WRITE))]
Admin = Annotated[Caller, Depends(caller_with(Permission.ADMIN))]


def records_usage(requested: bool | None, caller: Caller) -> bool:
    """Whether a read (recall, context) also records usage: by default yes for writers; read-only keys
    may not (asking is a 403)."""
    if requested is None:
        return caller.principal.can(Permission.WRITE)
    if requested:
        caller.principal.require(Permission.WRITE)
    return requested
