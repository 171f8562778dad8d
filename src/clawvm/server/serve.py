"""Serving an app of :func:`clawvm.server.app.create_app` with uvicorn (``clawvm serve``, the demo), in
this process (:func:`run_server`) or in several worker processes on one listening socket
(:func:`run_workers`, ``clawvm serve --workers N``).

Why processes: one process answers one request's Python at a time (the GIL, and the engine's one
connection), so on N cores N processes answer N at once. Every engine allows several processes on one
store (SQLite's file locking, PostgreSQL), each worker opens its own store, service and harnesses, and
what one writes the others read. The parent binds the socket, starts the workers (spawned: a fresh
interpreter each, no threads or connections inherited), restarts one that dies, and passes SIGINT/SIGTERM
on to them.

Why the parent accepts: with every worker accepting on one shared socket, the worker that wakes first
takes every connection that arrived together (measured: 4 keep-alive clients landed 3 and 1 on two workers
in 5 of 6 tries, so one process did three clients' work while the other idled). The parent accepts each
connection instead and hands it (the descriptor, over a Unix socket pair) to the worker holding the
fewest open connections, as Node's cluster module does. Each connection costs this hand-off once; a
keep-alive connection's requests go straight to its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
from collections.abc import Callable, MutableSequence, Sequence
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
    for open responses before it stops, and a live stream would never end by itself. With a ``handoff``
    (a worker of :func:`run_workers`) it listens on no socket: its connections come from the parent."""

    def __init__(
        self, config: uvicorn.Config, on_exit: Callable[[], None], handoff: _Handoff | None = None
    ) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._handoff = handoff

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self._handoff is None:
            await super().startup(sockets)
            return
        await super().startup(sockets=[])  # the app's lifespan, and no listening socket of its own
        if self.started:
            self._handoff.start(asyncio.get_running_loop(), self._protocol, self._parent_gone)

    def _protocol(self) -> asyncio.Protocol:
        """A connection's HTTP protocol, as uvicorn makes it for the connections it accepts itself."""
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    def _parent_gone(self) -> None:
        self.should_exit = True  # no more connections can come: answer the open ones and end

    async def on_tick(self, counter: int) -> bool:
        if self._handoff is not None:
            self._handoff.note_open(len(self.server_state.connections))
        return await super().on_tick(counter)

    async def main_loop(self) -> None:
        await super().main_loop()  # returns once an exit was asked for, before connections are drained
        if self._handoff is not None:
            self._handoff.stop()
        self._on_exit()


class _Handoff:
    """A worker's end of the parent's hand-off: connections arrive as descriptors on ``channel``; each is
    served as if this worker had accepted it. This worker alone writes its slot of ``closed`` (how many
    connections it has closed: the parent, which counts what it handed over, knows how many each worker
    holds open) and of ``ready`` (1 once it serves: a worker still starting is handed connections only
    when no worker is ready)."""

    def __init__(
        self,
        channel: socket.socket,
        closed: MutableSequence[int],
        ready: MutableSequence[int],
        index: int,
    ) -> None:
        self.channel = channel
        self.closed = closed
        self.ready = ready
        self.index = index
        self.taken = 0  # connections taken over so far
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._protocol: Callable[[], asyncio.Protocol] = asyncio.Protocol
        self._parent_gone: Callable[[], None] = lambda: None

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol: Callable[[], asyncio.Protocol],
        parent_gone: Callable[[], None],
    ) -> None:
        self._loop, self._protocol, self._parent_gone = loop, protocol, parent_gone
        self.channel.setblocking(False)
        loop.add_reader(self.channel.fileno(), self._receive)
        self.ready[self.index] = 1

    def stop(self) -> None:
        self.ready[self.index] = 0
        if self._loop is not None:
            self._loop.remove_reader(self.channel.fileno())
            self._loop = None

    def note_open(self, open_now: int) -> None:
        """``open_now`` connections are open: the others taken so far were closed."""
        self.closed[self.index] = self.taken - open_now

    def _receive(self) -> None:
        loop = self._loop
        if loop is None:
            return
        while True:
            try:
                message, fds, _flags, _address = socket.recv_fds(self.channel, 64, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message, fds = b"", []
            if not message and not fds:  # end of file: the parent is gone
                self.stop()
                self._parent_gone()
                return
            for fd in fds:
                task = loop.create_task(self._serve(loop, socket.socket(fileno=fd)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _serve(self, loop: asyncio.AbstractEventLoop, connection: socket.socket) -> None:
        try:
            await loop.connect_accepted_socket(self._protocol, connection)
        except OSError:  # the client left before it was served
            connection.close()
            return
        self.taken += 1


class _Dispatcher:
    """The parent's side of the hand-off (a thread): accepts on ``listener`` and hands each connection to
    the ready worker holding the fewest open ones (``handed[i] - closed[i]``; ties go round), or to one still
    starting when none is ready (it serves the connection once it is)."""

    def __init__(
        self, listener: socket.socket, workers: int, closed: Sequence[int], ready: Sequence[int]
    ) -> None:
        self.listener = listener
        self.channels: list[socket.socket | None] = [None] * workers  # the parent's end of each worker's pair
        self.handed = [0] * workers
        self.closed = closed
        self.ready = ready
        self._next = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clawvm-accept", daemon=True)

    def connect(self, index: int) -> socket.socket:
        """A new channel to worker ``index`` (a new process in that slot): returns the worker's end."""
        parent_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent_end.settimeout(_HANDOFF_TIMEOUT_S)
        old, self.channels[index] = self.channels[index], parent_end
        self.handed[index] = 0
        if old is not None:
            old.close()
        return worker_end

    def start(self) -> None:
        self.listener.settimeout(_ACCEPT_POLL_S)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        for channel in self.channels:
            if channel is not None:
                channel.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _address = self.listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # out of descriptors, say: the connection waits in the backlog
                log.warning("accept failed", extra={"fields": {"error": str(exc)}})
                self._stopping.wait(_ACCEPT_POLL_S)
                continue
            with connection:
                self._hand(connection)

    def _hand(self, connection: socket.socket) -> None:
        count = len(self.channels)
        start, self._next = self._next, (self._next + 1) % count
        order = sorted(
            ((start + k) % count for k in range(count)),
            key=lambda i: (not self.ready[i], self.handed[i] - self.closed[i]),
        )
        for index in order:
            channel = self.channels[index]
            if channel is None:
                continue
            try:
                socket.send_fds(channel, [b"c"], [connection.fileno()])
            except OSError:  # that worker is gone (its replacement gets a new channel): the next one
                continue
            self.handed[index] += 1
            return
        log.error("no worker to take a connection: closing it")


#: How often the parent's accepting thread looks whether it should stop.
_ACCEPT_POLL_S = 0.5
#: How long the parent waits for a worker to take a connection before trying the next worker.
_HANDOFF_TIMEOUT_S = 2.0


def _config(app: FastAPI, host: str = "127.0.0.1", port: int = 8080) -> uvicorn.Config:
    """uvicorn's settings (``host``/``port`` unused by a worker of :func:`run_workers`: the parent binds)."""
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
    """Serve ``spec``'s app from ``workers`` processes on ``host:port``, until SIGINT/SIGTERM. The parent
    accepts the connections and hands each to the worker with the fewest open (see the module docstring).
    The first worker embeds in the background for all (it also looks for the others' new rows every
    :data:`WORKER_EMBED_POLL_S`); each worker's embedder gets its share of the cores."""
    listener = socket.create_server((host, port), backlog=2048)
    # accepted connections inherit this: without it, a response's header and body segments waited on the
    # client's delayed ACK (Nagle): ~45 ms a request, measured
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    context = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    # requests in flight, one slot per worker (see RequestGauge): the embedding worker yields to them all
    in_flight = context.RawArray("i", workers)
    # each worker alone writes its slot of these: connections it has closed, and whether it serves yet
    closed = context.RawArray("i", workers)
    ready = context.RawArray("i", workers)
    dispatcher = _Dispatcher(listener, workers, closed, ready)
    # the workers listen on no socket, so uvicorn's own "running on" line never comes: say it here
    bound_host, bound_port = listener.getsockname()[:2]
    log.info(
        f"serving on http://{bound_host}:{bound_port} with {workers} workers",
        extra={"fields": {"host": bound_host, "port": bound_port, "workers": workers}},
    )

    def start(index: int) -> BaseProcess:
        in_flight[index] = 0  # a dead worker's requests are gone with it
        closed[index] = 0
        ready[index] = 0
        channel = dispatcher.connect(index)
        process = context.Process(
            target=_worker_main,
            args=(spec, index, workers, channel, in_flight, closed, ready),
            name=f"clawvm-worker-{index}",
        )
        process.start()
        channel.close()  # the worker has its own copy now
        return process

    def ask_to_stop(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, ask_to_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    processes = [start(i) for i in range(workers)]
    dispatcher.start()
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
        dispatcher.stop()  # no new connections; the workers answer the ones they hold, then end
        listener.close()
        for process in processes:
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in processes:
            process.join(30)
            if process.exitcode is None:
                process.kill()
                process.join(5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _worker_main(
    spec: WorkerSpec,
    index: int,
    workers: int,
    channel: socket.socket,
    in_flight: MutableSequence[int],
    closed: MutableSequence[int],
    ready: MutableSequence[int],
) -> None:
    """One worker: its own app over its own connection to the store, serving the connections the parent
    hands it on ``channel``."""
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
    server = _Uvicorn(_config(app), service.live.stop, _Handoff(channel, closed, ready, index))
    # a terminal's Ctrl-C reaches every process of the group: uvicorn shuts down cleanly, then raises the
    # captured SIGINT again as KeyboardInterrupt, which a worker would print as a traceback on its way out
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
