"""Liveness and readiness, for load balancers and orchestrators: no API key, no ``/v1`` prefix."""

from __future__ import annotations

from fastapi import APIRouter, Request

from clawvm.server.errors import ERROR_RESPONSES
from clawvm.server.schemas.responses import Health
from clawvm.server.service import service_of

router = APIRouter(tags=["health"], responses={503: ERROR_RESPONSES[503], 500: ERROR_RESPONSES[500]})


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process answers (on the event loop, never queued behind the routes' worker threads:
    while the store is down they all wait for it, and a liveness probe then restarted a healthy process)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health)
def readyz(request: Request) -> Health:
    """Readiness: the store answers a read."""
    return Health(status="ready", checks=service_of(request).readiness())


# HEAD too: load balancers often probe with it (a 405 read as down); left out of the schema, where it
# would repeat the GET operation's id
for _path, _probe in (("/healthz", healthz), ("/readyz", readyz)):
    router.add_api_route(_path, _probe, methods=["HEAD"], response_model=Health, include_in_schema=False)
