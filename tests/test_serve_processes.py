"""Several ``clawvm serve`` processes on one PostgreSQL: what one process writes the others read, optimistic
locking holds between them (no lost update), and an event stream opened on one process receives the
writes made through another (LISTEN/NOTIFY). Every server is a real subprocess on a loopback port, killed
when the module ends; a last one shows that SIGTERM ends a server promptly even with a stream open."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import pg_server
from clawvm.store import store_from_url
from clawvm.store.keys import Keyring
from loopback import ServeProcess

SERVERS = 2
INCREMENTS = 15  # per process
DUELS = 5


@dataclass
class Cluster:
    db: str
    servers: list[ServeProcess]
    keys: dict[str, str]
    directory: Path

    def auth(self, who: str = "agent") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("serve")
    db = pg_server.store_url(directory, "shared")
    store = store_from_url(db)
    store.setup()  # migrated once here; the servers then find the schema in place
    try:
        ring = Keyring(store)
        keys = {
            "agent": ring.create("acme", "agent", "bot")[1],
            "reader": ring.create("acme", "read-only", "viewer")[1],
            "other": ring.create("globex", "agent", "their bot")[1],
        }
    finally:
        store.close()
    servers: list[ServeProcess] = []
    try:
        for i in range(SERVERS):
            servers.append(ServeProcess.start(db, directory / f"serve-{i}.log"))
        for server in servers:
            server.wait_ready()
        yield Cluster(db, servers, keys, directory)
    finally:
        for server in servers:
            server.stop()


def test_a_memory_recorded_through_one_process_is_read_and_recalled_through_the_other(
    cluster: Cluster,
) -> None:
    a, b = cluster.servers[0].url, cluster.servers[1].url
    made = httpx.post(
        f"{a}/v1/memories", json={"content": "the Tessera gateway rejects keys older than 90 days"},
        headers=cluster.auth(), timeout=30,
    )
    assert made.status_code == 201, made.text
    m = made.json()
    got = httpx.get(f"{b}/v1/memories/{m['id']}", headers=cluster.auth("reader"), timeout=30)
    assert got.status_code == 200 and got.json() == m
    hits = httpx.post(
        f"{b}/v1/recall", json={"query": "which gateway rejects old keys?"}, headers=cluster.auth("reader"),
        timeout=30,
    ).json()
    assert hits[0]["id"] == m["id"]
    theirs = httpx.get(f"{b}/v1/memories/{m['id']}", headers=cluster.auth("other"), timeout=30)
    assert theirs.status_code == 404  # tenants stay apart across processes too


def _patch(url: str, auth: dict[str, str], memory_id: str, version: int, content: str) -> httpx.Response:
    body = {"expected_version": version, "content": content}
    return httpx.patch(f"{url}/v1/memories/{memory_id}", json=body, headers=auth, timeout=30)


def test_updates_through_both_processes_at_once_win_once_per_version_and_lose_nothing(
    cluster: Cluster,
) -> None:
    urls = [s.url for s in cluster.servers]
    auth = cluster.auth()
    m = httpx.post(f"{urls[0]}/v1/memories", json={"content": "count 0"}, headers=auth, timeout=30).json()
    version = m["version"]

    # duels: every process sends the same expected version at the same moment; exactly one wins it
    with ThreadPoolExecutor(len(urls)) as pool:
        for duel in range(DUELS):
            start = threading.Barrier(len(urls))

            def send(
                url: str, duel: int = duel, version: int = version, start: threading.Barrier = start
            ) -> httpx.Response:
                start.wait()
                return _patch(url, auth, m["id"], version, f"duel {duel} won by {url}")

            replies = list(pool.map(send, urls))
            assert sorted(r.status_code for r in replies) == [200] + [409] * (len(urls) - 1), [
                r.text for r in replies
            ]
            assert {r.json()["error"]["code"] for r in replies if r.status_code == 409} == {"conflict"}
            winner = next(r.json() for r in replies if r.status_code == 200)
            assert winner["version"] == version + 1
            version += 1

    # increments: read, add one, write with the version read; on 409 read again and retry
    def increment(url: str) -> int:
        conflicts = 0
        for _ in range(INCREMENTS):
            while True:
                current = httpx.get(f"{url}/v1/memories/{m['id']}", headers=auth, timeout=30).json()
                count = int(current["content"].removeprefix("count ")) if current["content"].startswith(
                    "count "
                ) else 0
                r = _patch(url, auth, m["id"], current["version"], f"count {count + 1}")
                if r.status_code == 200:
                    break
                assert r.status_code == 409, r.text
                conflicts += 1
        return conflicts

    with ThreadPoolExecutor(len(urls)) as pool:
        conflicts = sum(pool.map(increment, urls))
    final_version = version + INCREMENTS * len(urls)
    for url in urls:
        final = httpx.get(f"{url}/v1/memories/{m['id']}", headers=auth, timeout=30).json()
        assert final["content"] == f"count {INCREMENTS * len(urls)}" and final["version"] == final_version
    events = httpx.get(
        f"{urls[1]}/v1/events", params={"memory_id": m["id"], "limit": 1000}, headers=auth, timeout=30
    ).json()["events"]
    versions = [e["data"]["version"] for e in events if e["kind"] == "update"]
    assert versions == list(range(2, final_version + 1))  # one update per version, none lost, none twice
    print(f"increments: {INCREMENTS * len(urls)}, conflicts retried: {conflicts}")  # the interleaving varies


def _head(url: str, auth: dict[str, str]) -> int:
    """The seq of the tenant's newest event (paging /v1/events)."""
    after = 0
    while True:
        page = httpx.get(f"{url}/v1/events", params={"after_seq": after, "limit": 1000}, headers=auth,
                         timeout=30).json()
        if not page["events"]:
            return after
        after = page["next_after_seq"]


def test_a_stream_on_one_process_receives_the_writes_made_through_another(cluster: Cluster) -> None:
    a, b = cluster.servers[0].url, cluster.servers[1].url
    reader = cluster.auth("reader")
    head = _head(b, reader)
    with httpx.Client(timeout=30) as http, http.stream(
        "GET", f"{b}/v1/events/stream", params={"after_seq": head}, headers=reader
    ) as stream:
        lines = stream.iter_lines()
        assert [next(lines), next(lines)] == ["retry: 2000", ": open"]
        theirs = http.post(f"{a}/v1/memories", json={"content": "globex only"}, headers=cluster.auth("other"))
        mine = http.post(f"{a}/v1/memories", json={"content": "acme's deploy is green"},
                         headers=cluster.auth())
        assert theirs.status_code == mine.status_code == 201
        received: list[dict[str, Any]] = []
        ids: list[int] = []
        for line in lines:
            if line.startswith("id: "):
                ids.append(int(line.removeprefix("id: ")))
            if line.startswith("data: "):
                received.append(json.loads(line.removeprefix("data: ")))
                if received[-1]["memory_id"] == mine.json()["id"]:
                    break
    assert received[-1]["kind"] == "add" and received[-1]["tenant"] == "acme"
    assert {e["tenant"] for e in received} == {"acme"}
    assert theirs.json()["id"] not in {e["memory_id"] for e in received}
    assert ids == [e["seq"] for e in received] and all(i > head for i in ids) and ids == sorted(ids)


def test_sigterm_ends_a_server_with_an_open_stream_promptly(cluster: Cluster) -> None:
    server = ServeProcess.start(cluster.db, cluster.directory / "serve-sigterm.log")
    try:
        server.wait_ready()
        with httpx.Client(timeout=30) as http, http.stream(
            "GET", f"{server.url}/v1/events/stream", headers=cluster.auth("reader")
        ) as stream:
            lines = stream.iter_lines()
            assert next(lines) == "retry: 2000"
            server.proc.send_signal(signal.SIGTERM)
            rest = list(lines)  # the server ends the stream: the body completes instead of hanging
        assert all(not line.startswith("data: ") or "acme" in line for line in rest)
        assert server.proc.wait(30) in (0, -signal.SIGTERM), server.output()
        log = server.output()
        assert "timeout graceful shutdown exceeded" not in log  # ended at once, not by uvicorn's backstop
        assert "Finished server process" in log
    finally:
        server.stop()
