"""Serving an app of :func:`clawvm.server.app.create_app` with uvicorn (``clawvm serve``, the demo)."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from clawvm.server.service import Service


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
