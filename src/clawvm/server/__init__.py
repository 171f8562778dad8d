"""The REST server: :func:`create_app` builds a FastAPI app over one store; ``clawvm serve`` runs it
(:func:`run_server`).

Where things are, in the order a request meets them:

=====================  ===================================================================================
:mod:`.settings`       :class:`ServerSettings` (limits) and :func:`redaction_options` (``serve``'s flags)
:mod:`.middleware`     :class:`Guard`: request id, body limit, UTF-8, JSON keys given twice, OPTIONS, 500, log
:mod:`.paths`          the route templates a path fits: the parameter a segment is, ``Allow``'s methods
:mod:`.auth`           API key -> principal; :data:`Reader` / :data:`Writer` / :data:`Admin` per route
:mod:`.ratelimit`      token buckets per key, tenant, client address (429), taken together or not at all
:mod:`.idempotency`    ``Idempotency-Key``: a retried create answers its first response, bounded per tenant
:mod:`.service`        :class:`Service`: the engine, the embedding worker, keys, one harness per tenant
:mod:`.routes`         one module per resource (memories, recall, sessions, events, keys, health, dashboard)
:mod:`.schemas`        request and response bodies (pydantic)
:mod:`.errors`         library error type -> HTTP status and code (:data:`ERRORS`), the one error shape
:mod:`.mcp`            MCP (streamable HTTP) at ``/mcp`` behind the same keys, with ``create_app(mcp=True)``
:mod:`.app`            :func:`create_app`, the factory wiring the above
:mod:`.serve`          :func:`run_server` (uvicorn), :func:`run_workers` (N processes); :mod:`.logs`: logging
=====================  ===================================================================================
"""

from clawvm.server.app import create_app
from clawvm.server.auth import Admin, Caller, Reader, Writer
from clawvm.server.errors import ERROR_RESPONSES, ERRORS
from clawvm.server.logs import JsonFormatter, configure_logging
from clawvm.server.ratelimit import RateLimiter
from clawvm.server.serve import WorkerSpec, run_server, run_workers
from clawvm.server.service import Service
from clawvm.server.settings import ServerSettings, redaction_options

__all__ = [
    "ERRORS",
    "ERROR_RESPONSES",
    "Admin",
    "Caller",
    "JsonFormatter",
    "RateLimiter",
    "Reader",
    "ServerSettings",
    "Service",
    "WorkerSpec",
    "Writer",
    "configure_logging",
    "create_app",
    "redaction_options",
    "run_server",
    "run_workers",
]
