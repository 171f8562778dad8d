"""The MemLens dashboard (:mod:`clawvm.dashboard`) at ``/dashboard``, behind the same keys and roles as
the API: its pages read with a :data:`Reader`'s harness and intervene with a :data:`Writer`'s."""

from __future__ import annotations

from fastapi import APIRouter

from clawvm.dashboard import create_router
from clawvm.harness import Harness
from clawvm.server.auth import Reader, Writer
from clawvm.server.settings import ServerSettings


def dashboard_router(settings: ServerSettings) -> APIRouter:
    """The dashboard's router, its harnesses given by the API's own key dependencies."""

    def read(caller: Reader) -> Harness:
        return caller.harness

    def write(caller: Writer) -> Harness:
        return caller.harness

    return create_router(read, write, whatif_max_memories=settings.whatif_max_memories)
