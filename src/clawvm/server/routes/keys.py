"""The caller's own key (``/whoami``) and, for admin keys, the tenant's API keys: list, create (the
response shows the key this once; at most ``mint_burst`` at once per tenant, then ``mint_rate_per_s``),
revoke (it stops working at once on this server, within ``keys_refresh_s`` on the others)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from clawvm.server.auth import Admin, Reader
from clawvm.server.schemas.requests import KeyRequest
from clawvm.server.schemas.responses import KeyCreated, KeyOut
from clawvm.server.service import service_of

router = APIRouter(tags=["keys"])


@router.get("/whoami")
def whoami(caller: Reader) -> dict[str, str]:
    p = caller.principal
    return {"key_id": p.key_id, "tenant": p.tenant, "role": p.role.value}


@router.get("/keys", response_model=list[KeyOut])
def list_keys(
    request: Request, caller: Admin, include_revoked: Annotated[bool, Query()] = False
) -> list[KeyOut]:
    """The tenant's API keys (never the keys themselves), with each one's use seen by this server process
    (``requests``, ``last_used_at``: kept in memory, not in the store)."""
    service = service_of(request)
    keys = service.keyring.list(caller.principal.tenant, include_revoked=include_revoked)
    return [KeyOut.of(k, service.usage.of(k.key_id)) for k in keys]


@router.post("/keys", status_code=201, response_model=KeyCreated)
def create_key(request: Request, body: KeyRequest, caller: Admin) -> KeyCreated:
    """A new key of the caller's tenant; the response holds the key, shown this once. With ``expires_at``
    or ``ttl_s`` it stops working then (401 ``key_expired``); it may not outlive the caller's own key (409).
    Minting is rate limited per tenant (429)."""
    service = service_of(request)
    service.mint(caller.principal)  # here, once the body is valid
    key, token = service.keyring.create(
        caller.principal.tenant,
        body.role,
        body.name,
        expires_at=body.expires_at,
        ttl_s=body.ttl_s,
        minted_by=caller.principal.key_id,
    )
    return KeyCreated(**KeyOut.of(key).model_dump(), key=token)


@router.delete("/keys/{key_id}", response_model=KeyOut)
def revoke_key(
    request: Request, key_id: Annotated[str, Path(min_length=1, max_length=64)], caller: Admin
) -> KeyOut:
    """Revoke one of the tenant's keys (it stops working at once on this server, and its open event streams
    end within ``key_check_s``)."""
    service = service_of(request)
    return KeyOut.of(service.keyring.revoke(key_id, caller.principal.tenant), service.usage.of(key_id))
