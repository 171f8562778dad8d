"""``clawvm serve --workers N``: several processes on one SQLite file and one port. What one worker writes
the others read; a worker that dies is replaced while the others keep serving; SIGTERM ends them all.
And what keeps requests moving inside one worker: the background embedding waits for the gaps between
requests (bounded), looks for rows other processes recorded, and a tenant's request never waits on the
lock that makes another tenant's harness."""

from __future__ import annotations

import http.client
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from clawvm.core.embed import EmbedWorker
from clawvm.core.errors import StateConflictError
from clawvm.core.model import Filters, Memory
from clawvm.server.service import RequestGauge, Service
from clawvm.server.settings import ServerSettings
from clawvm.store import MemoryStore, SQLiteStore
from clawvm.store.keys import Keyring
from loopback import ServeProcess

WORKERS = 2
ROUNDS = 24


@dataclass
class Workers:
    server: ServeProcess
    auth: dict[str, str]


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _workers_of(server: ServeProcess) -> list[int]:
    """The worker processes (multiprocessing's resource tracker is a child too: it takes no requests)."""
    return [
        pid
        for pid in _children(server.proc.pid)
        if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    directory = tmp_path_factory.mktemp("workers")
    db = directory / "shared.db"
    store = SQLiteStore(db)
    store.setup()
    try:
        _, key = Keyring(store).create("acme", "agent", "bot")
    finally:
        store.close()
    server = ServeProcess.start(str(db), directory / "serve.log", "--workers", str(WORKERS))
    try:
        server.wait_ready()
        yield Workers(server, {"Authorization": f"Bearer {key}"})
    finally:
        server.stop()


def test_there_are_as_many_worker_processes_as_asked(workers: Workers) -> None:
    deadline = time.monotonic() + 30
    while len(_workers_of(workers.server)) != WORKERS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_workers_of(workers.server)) == WORKERS, workers.server.output()


def test_a_write_through_any_worker_is_read_through_every_other(workers: Workers) -> None:
    # a fresh connection each time: the parent hands each to the worker with the fewest open (ties in
    # turn), so over the rounds reads land on the worker that did not write
    for i in range(ROUNDS):
        made = httpx.post(
            f"{workers.server.url}/v1/memories",
            json={"content": f"the Tessera gateway rotated key number {i}"},
            headers=workers.auth,
            timeout=30,
        )
        assert made.status_code == 201, made.text
        for _ in range(2):
            got = httpx.get(
                f"{workers.server.url}/v1/memories/{made.json()['id']}", headers=workers.auth, timeout=30
            )
            assert got.status_code == 200 and got.json() == made.json()
        hits = httpx.post(
            f"{workers.server.url}/v1/recall",
            json={"query": f"rotated key number {i}", "k": 3},
            headers=workers.auth,
            timeout=30,
        ).json()
        assert made.json()["id"] in [h["id"] for h in hits]


def test_concurrent_clients_are_all_answered(workers: Workers) -> None:
    def client(n: int) -> list[int]:
        statuses = []
        with httpx.Client(base_url=workers.server.url, headers=workers.auth, timeout=30) as http:
            for i in range(10):
                statuses.append(
                    http.post("/v1/memories", json={"content": f"client {n} step {i}"}).status_code
                )
                statuses.append(http.post("/v1/recall", json={"query": f"client {n}"}).status_code)
        return statuses

    with ThreadPoolExecutor(4) as pool:
        statuses = [s for batch in pool.map(client, range(4)) for s in batch]
    assert statuses.count(201) == 40 and statuses.count(200) == 40


def _open_connections(pid: int, port: int) -> int:
    """How many established TCP connections on local ``port`` the process ``pid`` holds (from /proc)."""
    established: set[str] = set()  # socket inodes
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":  # 01: ESTABLISHED
                established.add(fields[9])
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        held += target.startswith("socket:[") and target[8:-1] in established
    return held


def test_keep_alive_connections_opened_together_are_spread_evenly_over_the_workers(workers: Workers) -> None:
    # with every worker accepting on one shared socket, the first to wake took most of a burst (3 and 1
    # of 4, five times in six): one process then did three clients' work while the other idled
    port = int(workers.server.url.rsplit(":", 1)[1])
    pids = _workers_of(workers.server)
    for _ in range(3):
        time.sleep(0.3)  # the workers report closed connections every 0.1 s
        before = [_open_connections(pid, port) for pid in pids]
        clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(4)]
        try:
            for client in clients:
                client.connect()
            for client in clients:
                client.request("GET", "/v1/whoami", headers=workers.auth)
                response = client.getresponse()
                assert response.status == 200, response.read()
                response.read()
            held = [_open_connections(pid, port) for pid in pids]
        finally:
            for client in clients:
                client.close()
        assert sum(held) - sum(before) == 4
        assert max(held) - min(held) <= 1, (before, held)


def test_a_worker_that_dies_is_replaced_and_the_other_serves_meanwhile(workers: Workers) -> None:
    before = _workers_of(workers.server)
    assert len(before) == WORKERS
    os.kill(before[0], signal.SIGKILL)
    for _ in range(10):  # answered all along by the survivor (new connections, one worker listening)
        r = httpx.get(f"{workers.server.url}/v1/whoami", headers=workers.auth, timeout=30)
        assert r.status_code == 200
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = _workers_of(workers.server)
        if len(now) == WORKERS and before[0] not in now:
            break
        time.sleep(0.2)
    now = _workers_of(workers.server)
    assert len(now) == WORKERS and before[0] not in now and before[1] in now
    workers.server.wait_ready()


def test_workers_need_a_store_they_can_share(tmp_path: Path) -> None:
    server = ServeProcess.start("memory://", tmp_path / "serve.log", "--workers", "2")
    assert server.proc.wait(60) != 0
    assert "--workers > 1 needs a store the processes share" in server.output()


def test_sigterm_ends_every_worker(workers: Workers) -> None:
    # last of the module's server: it ends here
    children = _workers_of(workers.server)
    assert len(children) == WORKERS
    workers.server.proc.send_signal(signal.SIGTERM)
    assert workers.server.proc.wait(30) == 0, workers.server.output()
    assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []  # each ended and reaped


# ---- inside one worker ------------------------------------------------------------------------------
class CountingEmbedder:
    """A deterministic embedder that records when each batch was embedded."""

    name = "counting"
    dim = 8

    def __init__(self) -> None:
        self.batches: list[tuple[float, int]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append((time.monotonic(), len(texts)))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        out[:, 0] = 1.0
        return out

    def embed_query(self, text: str) -> np.ndarray:
        vector: np.ndarray = self.embed([text])[0]
        return vector


def _unembedded_store(n: int) -> MemoryStore:
    store = MemoryStore(dim=8)
    store.setup()
    store.put_many([Memory(content=f"memory {i}") for i in range(n)])
    return store


def test_background_embedding_waits_for_a_gap_between_requests_but_not_forever() -> None:
    store = _unembedded_store(6)
    embedder = CountingEmbedder()
    busy = threading.Event()
    busy.set()  # requests in flight all along
    worker = EmbedWorker(
        embedder, store.unembedded, store.set_vectors, batch_size=2, busy=busy.is_set, max_defer_s=0.2
    )
    started = time.monotonic()
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while len(embedder.batches) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(embedder.batches) == 3  # the backlog still moves under steady load
        # each batch waited (about) its deferral first: the first batch not before 0.2 s
        assert embedder.batches[0][0] - started >= 0.19
        gaps = np.diff([started] + [at for at, _ in embedder.batches])
        assert all(gap >= 0.19 for gap in gaps), gaps
        assert store.unembedded(10) == []
        # requests gone: new rows are embedded at once
        busy.clear()
        store.put_many([Memory(content="quiet time")])
        quiet = time.monotonic()
        worker.notify()
        worker.flush(timeout=10)
        assert embedder.batches[-1][0] - quiet < 0.15
    finally:
        worker.stop()


def test_the_embedding_thread_runs_below_the_priority_of_the_requests_after_its_first_batch() -> None:
    # Linux: each thread has its own nice value (elsewhere the worker changes nothing)
    store = _unembedded_store(4)
    worker = EmbedWorker(CountingEmbedder(), store.unembedded, store.set_vectors, batch_size=2, nice=5)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    worker.start()
    try:
        worker.flush(timeout=10)
        thread = worker._thread
        assert thread is not None and thread.native_id is not None
        assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == min(19, base + 5)
        # the process itself, and so its request threads, keep their priority
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    finally:
        worker.stop()


def test_flush_is_not_deferred_by_busy_requests() -> None:
    store = _unembedded_store(4)
    embedder = CountingEmbedder()
    worker = EmbedWorker(
        embedder, store.unembedded, store.set_vectors, batch_size=1, busy=lambda: True, max_defer_s=5.0
    )
    worker.start()
    try:
        started = time.monotonic()
        worker.flush(timeout=30)
        assert time.monotonic() - started < 4.0  # four batches would have waited 20 s if deferred
        assert store.unembedded(10) == []
    finally:
        worker.stop()


def test_a_polling_worker_embeds_rows_nobody_told_it_about() -> None:
    store = _unembedded_store(0)
    embedder = CountingEmbedder()
    worker = EmbedWorker(embedder, store.unembedded, store.set_vectors, poll_s=0.1)
    worker.start()
    try:
        time.sleep(0.05)
        store.put_many([Memory(content="recorded by another process")])  # no notify()
        deadline = time.monotonic() + 5
        while store.unembedded(10) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.unembedded(10) == []
    finally:
        worker.stop()


def test_a_tenant_with_a_harness_does_not_wait_for_another_tenants_harness_to_be_made() -> None:
    service = Service(MemoryStore(), None, ServerSettings())
    try:
        acme = service.harness_for("acme")
        got: list[object] = []
        with service._lock:  # as while a new tenant's harness is being made
            reader = threading.Thread(target=lambda: got.append(service.harness_for("acme")))
            reader.start()
            reader.join(5)
        assert got == [acme]
    finally:
        service.close()


def test_the_embedding_worker_yields_to_the_requests_of_every_worker_process() -> None:
    slots = multiprocessing.get_context("spawn").RawArray("i", 2)  # what serve --workers 2 shares
    embedding, other = RequestGauge(slots, 0), RequestGauge(slots, 1)
    assert not embedding.busy()
    other.enter()  # a request in flight on the other worker
    assert embedding.busy() and embedding.in_flight == 1
    other.leave()
    assert not embedding.busy() and other.in_flight == 0


class SlowQueryEmbedder(CountingEmbedder):
    """Queries take a model's time (2 ms): worth embedding beside the text channels."""

    def embed_query(self, text: str) -> np.ndarray:
        time.sleep(0.002)
        return super().embed_query(text)


def _query_embed_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("clawvm-query-embed")]


def test_every_tenant_embeds_its_queries_in_one_pool_which_closes_with_the_service() -> None:
    """A harness per tenant: a pool of query-embedding threads per tenant would grow with the tenants and
    outlive the service."""
    service = Service(MemoryStore(dim=8), SlowQueryEmbedder(), ServerSettings(embed_in_background=False))
    try:
        tenants = [service.harness_for(f"t{i}") for i in range(6)]
        for h in tenants:
            h.record("the deploy failed on a full disk")
            for _ in range(3):
                assert h.recall("deploy disk", k=1)
        assert 0 < len(_query_embed_threads()) <= 4
        assert {id(h._query_embeds) for h in tenants} == {id(service.query_embeds)}
    finally:
        service.close()
    assert _query_embed_threads() == []


def test_the_services_embedding_worker_attaches_through_the_write_path() -> None:
    """It attached vectors on the engine itself, past the write path's checks: a batch that finished after
    the service closed was still written."""
    store = MemoryStore(dim=8)
    service = Service(store, CountingEmbedder(), ServerSettings(embed_batch=4))
    try:
        h = service.harness_for("acme")
        m = h.record("the deploy failed on a full disk")
        h.flush()
        assert m.id in store.vectors_of([m.id])
        assert service.worker is not None
        attach = service.worker._write  # what the worker calls with each batch it embedded
    finally:
        service.close()
    with pytest.raises(StateConflictError):  # a batch in flight at close is not written
        attach([m.id], np.ones((1, 8), dtype=np.float32), [m.content])


class SlowBatchEmbedder(CountingEmbedder):
    """A batch takes a model's time under load (0.3 s)."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(0.3)
        return super().embed(texts)


def test_closing_the_service_leaves_the_embedding_backlog_to_the_next_open() -> None:
    """Shutdown waited up to 30 s for the backlog (an import's thousands) that the next open embeds anyway:
    a SIGTERM'd server outlived the grace period of docker stop (10 s) and was killed."""
    store = MemoryStore(dim=8)
    store.setup()
    service = Service(store, SlowBatchEmbedder(), ServerSettings())
    h = service.harness_for("acme")
    for i in range(64):
        h.record(f"imported memory {i}")
    service.close()
    assert store.unembedded(100)  # at most the batch in flight was written; the rest waits for the next open
    assert store.count(Filters.of(tenant="acme")) == 64
