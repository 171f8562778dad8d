"""The caller's own key (``/whoami``) and, for admin keys, the tenant's API keys: list, create (the
response shows the key this once), revoke (it stops working at once on this server, within
``keys_refresh_s`` on the others)."""

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
    """The tenant's API keys (never the keys themselves)."""
    keys = service_of(request).keyring.list(caller.principal.tenant, include_revoked=include_revoked)
    return [KeyOut.of(k) for k in keys]


@router.post("/keys", status_code=201, response_model=KeyCreated)
def create_key(request: Request, body: KeyRequest, caller: Admin) -> KeyCreated:
    """A new key of the caller's tenant; the response holds the key, shown this once."""
    key, token = service_of(request).keyring.create(caller.principal.tenant, body.role, body.name)
    return KeyCreated(**KeyOut.of(key).model_dump(), key=token)


@router.delete("/keys/{key_id}", response_model=KeyOut)
def revoke_key(
    request: Request, key_id: Annotated[str, Path(min_length=1, max_length=64)], caller: Admin
) -> KeyOut:
    """Revoke one of the tenant's keys (it stops working at once on this server)."""
    return KeyOut.of(service_of(request).keyring.revoke(key_id, caller.principal.tenant))
