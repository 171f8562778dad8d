"""Serving an app of :func:`clawvm.server.app.create_app` with uvicorn (``clawvm serve``, the demo), in
this process (:func:`run_server`) or in several worker processes on one listening socket
(:func:`run_workers`, ``clawvm serve --workers N``).

Why processes: one process answers one request's Python at a time (the GIL, and the engine's one
connection), so on N cores N processes answer N at once. Every engine allows several processes on one
store (SQLite's file locking, PostgreSQL), each worker opens its own store, service and harnesses, and
what one writes the others read. The parent binds the socket, starts the workers (spawned: a fresh
interpreter each, no threads or connections inherited), restarts one that dies, and passes SIGINT/SIGTERM
on to them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from types import FrameType

import uvicorn
from fastapi import FastAPI

from clawvm.server.service import RequestGauge, Service
from clawvm.server.settings import ServerSettings

log = logging.getLogger(__name__)

#: How often the workers' embedding process looks for rows recorded by the other workers.
WORKER_EMBED_POLL_S = 0.5


class _Uvicorn(uvicorn.Server):
    """uvicorn that ends the app's event streams as soon as it is asked to exit (SIGINT, SIGTERM): it waits
    for open responses before it stops, and a live stream would never end by itself."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    async def main_loop(self) -> None:
        await super().main_loop()  # returns once an exit was asked for, before connections are drained
        self._on_exit()


def _config(app: FastAPI, host: str = "127.0.0.1", port: int = 8080) -> uvicorn.Config:
    """uvicorn's settings (``host``/``port`` unused when it is handed a socket)."""
    return uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=10
    )


def run_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve an app of :func:`create_app` with uvicorn until SIGINT/SIGTERM (``clawvm serve``). Open event
    streams end at once then; any other response still running after 10 s is cancelled."""
    service: Service = app.state.service
    _Uvicorn(_config(app, host=host, port=port), service.live.stop).run()


@dataclass(frozen=True)
class WorkerSpec:
    """What each worker process builds its app from (sent to a spawned process: plain values only; the
    redaction options and data keys are built again in the worker, from its environment)."""

    db: str
    settings: ServerSettings
    embed: bool = True
    redact: bool = True
    keep_originals: bool = False
    log_level: str = "info"
    mcp: bool = False  # also serve MCP at /mcp (clawvm serve --mcp)


def run_workers(spec: WorkerSpec, workers: int, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve ``spec``'s app from ``workers`` processes sharing one listening socket on ``host:port``, until
    SIGINT/SIGTERM. The first worker embeds in the background for all (it also looks for the others' new
    rows every :data:`WORKER_EMBED_POLL_S`); each worker's embedder gets its share of the cores."""
    listener = socket.create_server((host, port), backlog=2048)
    # accepted connections inherit this: without it, on a socket handed to the workers, a response's
    # header and body segments waited on the client's delayed ACK (Nagle): ~45 ms a request, measured
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    context = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    # requests in flight, one slot per worker (see RequestGauge): the embedding worker yields to them all
    in_flight = context.RawArray("i", workers)

    def start(index: int) -> BaseProcess:
        in_flight[index] = 0  # a dead worker's requests are gone with it
        process = context.Process(
            target=_worker_main,
            args=(spec, index, workers, listener, in_flight),
            name=f"clawvm-worker-{index}",
        )
        process.start()
        return process

    def ask_to_stop(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, ask_to_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    processes = [start(i) for i in range(workers)]
    try:
        while not stopping.wait(0.5):
            for index, process in enumerate(processes):
                if process.exitcode is not None and not stopping.is_set():
                    log.error(
                        "worker exited: restarting it",
                        extra={"fields": {"worker": index, "exitcode": process.exitcode}},
                    )
                    processes[index] = start(index)
    finally:
        for process in processes:
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            process.join(30)
            if process.exitcode is None:
                process.kill()
                process.join(5)
        listener.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _worker_main(
    spec: WorkerSpec, index: int, workers: int, listener: socket.socket, in_flight: MutableSequence[int]
) -> None:
    """One worker: its own app over its own connection to the store, served on the shared socket."""
    from clawvm.core.embed import MiniLMEmbedder
    from clawvm.server.app import create_app
    from clawvm.server.logs import configure_logging
    from clawvm.server.settings import redaction_options

    configure_logging(spec.log_level)
    settings = replace(
        spec.settings,
        embed_in_background=spec.settings.embed_in_background and index == 0,
        embed_poll_s=WORKER_EMBED_POLL_S,
    )
    # ONNX Runtime's threads: the cores shared out between the workers, none oversubscribed
    embedder = MiniLMEmbedder(threads=max(1, (os.cpu_count() or 1) // workers)) if spec.embed else None
    options = redaction_options(redact=spec.redact, keep_originals=spec.keep_originals)
    app = create_app(
        spec.db,
        embedder=embedder,
        settings=settings,
        harness_options=options,
        requests=RequestGauge(in_flight, index),
        mcp=spec.mcp,
    )
    service: Service = app.state.service
    _Uvicorn(_config(app), service.live.stop).run(sockets=[listener])
