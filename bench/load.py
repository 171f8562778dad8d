"""Load on the REST server: N concurrent clients over loopback, bounded by time and by request count; and
the server's overhead and scaling, measured side by side in the same run.

Three measurements, in this order:

1. **HTTP beside in-process** (``--rounds`` x ``--block`` calls a side, one client, one keep-alive
   connection): each recall query and each record body, once through a :class:`Harness` opened in this
   process on the server's own store (a tenant view, the server's redaction and embedder: what one
   request runs) and once over HTTP, one right after the other (the side going first alternates), so
   the machine's other load falls on both alike. Reported: p50 of each and
   ``recall_http_over_inprocess_p50``, ``record_http_over_inprocess_p50``.
2. **Scaling**: recall only, 1 client and 4 clients, for ``--seconds`` each, in ``--slices`` windows that
   alternate (1, 4, 1, 4 ...) so the machine's other load falls on both alike; ``recall_rps_4_over_1`` is
   the 4-client throughput over the 1-client one (tracked recalls, the default of a writer's key);
   ``recall_untracked_rps_4_over_1`` the same for recalls that write nothing.
3. **Mixed load**: ``--clients`` clients cycling through an agent's loop with a fixed mix (``--mix``,
   default 2 records : 1 recall : 1 context), in sessions of 40 records. Reported per operation:
   requests, throughput (req/s over the measured window), p50/p95/p99 latency (ms, client side, including
   HTTP) and errors (any status >= 400, or a failed connection; goal 0).

Every client is a process of its own (so the client's GIL is not the bottleneck) speaking HTTP/1.1 with
keep-alive through ``http.client``. Without ``--url`` the script starts its own server (``clawvm serve
--workers W`` with the defaults a user gets, logging included, but the rate limit off) on a fresh SQLite
file in a temporary directory, with an admin key created beforehand, and preloads ``--preload`` memories
(not measured; their embedding is waited for) so recall and context have a corpus. With ``--url``, pass
``--key`` (an agent key) and ``--db`` (the server's store, for the in-process side; without it the first
measurement is skipped).

    python bench/load.py --clients 4 --seconds 10 --json bench/results/load.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

OPS = ("record", "recall", "context")
TOOLS = ["http_get", "sql_query", "shell", "search_docs", "send_email"]
SUBJECTS = [
    "payment API",
    "deploy of build 7",
    "invoice export",
    "disk on build-07",
    "refund job",
    "cache warmup",
]
OUTCOMES = [
    "timed out after {n} s",
    "returned 200 with {n} rows",
    "failed: disk full at {n}%",
    "succeeded after {n} retries",
    "raised KeyError on line {n}",
    "is waiting for approval #{n}",
]
QUESTIONS = [
    "which API timed out?",
    "why did the deploy fail?",
    "what happened to the invoice export?",
    "how many retries did the refund job need?",
    "what is blocking the cache warmup?",
]


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    samples: list[str] = field(default_factory=list)

    def add(self, op: str, ms: float, error: str | None) -> None:
        self.latencies[op].append(ms)
        if error is not None:
            self.errors[op] += 1
            if len(self.samples) < 5:
                self.samples.append(f"{op}: {error}")

    def merge(self, other: Tally) -> None:
        for op in OPS:
            self.latencies[op] += other.latencies[op]
            self.errors[op] += other.errors[op]
        self.samples += other.samples[: 5 - len(self.samples)]


def memory_text(rng: random.Random) -> str:
    subject, tool = rng.choice(SUBJECTS), rng.choice(TOOLS)
    return f"{tool} on the {subject} " + rng.choice(OUTCOMES).format(n=rng.randint(1, 500))


def record_body(rng: random.Random, session: str) -> dict[str, Any]:
    return {
        "content": memory_text(rng),
        "kind": "tool_result",
        "session_id": session,
        "tool_name": rng.choice(TOOLS),
        "tags": [rng.choice(["ops", "billing", "ci"])],
    }


def request_of(op: str, rng: random.Random, session: str, track: bool = True) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of one ``op`` (``track=False``: a recall that writes nothing)."""
    if op == "record":
        return "/v1/memories", record_body(rng, session)
    if op == "recall":
        return "/v1/recall", {"query": rng.choice(QUESTIONS), "k": 10, **({} if track else {"track": False})}
    return "/v1/context", {"query": rng.choice(QUESTIONS), "budget_tokens": 1000, "session_id": session}


class Connection:
    """One keep-alive HTTP/1.1 connection (``http.client``: the lightest client, so the figures are the
    server's), reopened after a failure."""

    def __init__(self, url: str, key: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        try:
            self.conn.request("POST", path, body=json.dumps(body).encode(), headers=self.headers)
            response = self.conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            raise

    def close(self) -> None:
        self.conn.close()


def client_process(
    url: str,
    key: str,
    n: int,
    mix: list[str],
    seconds: float,
    max_requests: int,
    ready: Any,
    go: EventType,
    out: Any,
    track: bool = True,
) -> None:
    """One client (its own process): says it is ready, waits for ``go``, then loops over ``mix`` for
    ``seconds``; puts its :class:`Tally` on ``out``."""
    rng = random.Random(n)
    tally = Tally()
    conn = Connection(url, key)
    ready.put(n)
    go.wait()
    deadline = time.perf_counter() + seconds
    step = 0
    while time.perf_counter() < deadline and step < max_requests:
        op = mix[step % len(mix)]
        path, body = request_of(op, rng, f"load-{n}-{step // (40 * len(mix))}", track)
        t0 = time.perf_counter()
        error: str | None = None
        try:
            status, data = conn.post(path, body)
            if status >= 400:
                error = f"{status} {data[:200]!r}"
        except (OSError, http.client.HTTPException) as exc:
            error = repr(exc)
        tally.add(op, (time.perf_counter() - t0) * 1000, error)
        step += 1
    conn.close()
    out.put(tally)


def run_load(
    url: str, key: str, clients: int, seconds: float, max_requests: int, mix: list[str], track: bool = True
) -> tuple[Tally, float]:
    """``clients`` client processes at once; their merged tally and the measured window's length."""
    context = multiprocessing.get_context("spawn")
    ready, go, out = context.Queue(), context.Event(), context.Queue()
    per_client = max(1, max_requests // clients)
    processes = [
        context.Process(
            target=client_process, args=(url, key, n, mix, seconds, per_client, ready, go, out, track)
        )
        for n in range(clients)
    ]
    for p in processes:
        p.start()
    for _ in processes:  # every client imported and connected before the window opens
        ready.get(timeout=120)
    start = time.perf_counter()
    go.set()
    tally = Tally()
    for _ in processes:
        tally.merge(out.get(timeout=seconds + 120))
    elapsed = time.perf_counter() - start
    for p in processes:
        p.join(30)
    return tally, elapsed


def summarize(tally: Tally, elapsed: float) -> dict[str, dict[str, float]]:
    def row(xs: list[float], errors: int) -> dict[str, float]:
        a = np.asarray(xs) if xs else np.zeros(1)
        return {
            "requests": len(xs),
            "throughput_rps": round(len(xs) / elapsed, 1),
            "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p95_ms": round(float(np.percentile(a, 95)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2),
            "errors": errors,
        }

    out = {op: row(tally.latencies[op], tally.errors[op]) for op in OPS}
    out["total"] = row([x for op in OPS for x in tally.latencies[op]], sum(tally.errors.values()))
    return out


def print_table(rows: dict[str, dict[str, float]]) -> None:
    print(f"{'op':<8} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for op, r in rows.items():
        print(
            f"{op:<8} {r['requests']:>8} {r['throughput_rps']:>8} {r['p50_ms']:>8} {r['p95_ms']:>8} "
            f"{r['p99_ms']:>8} {r['errors']:>7}"
        )


# ---- a server of our own ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def own_server(embed: bool, workers: int) -> Iterator[tuple[str, str, str]]:
    """Start ``clawvm serve --workers N`` on a temporary SQLite file; yields (url, admin key, store path)."""
    from clawvm.store import SQLiteStore
    from clawvm.store.keys import Keyring

    with tempfile.TemporaryDirectory(prefix="clawvm-load-") as tmp:
        db = Path(tmp) / "load.db"
        store = SQLiteStore(db)
        store.setup()
        _, key = Keyring(store).create("load", "admin", "bench/load.py")
        store.close()
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "clawvm.cli",
            "--db",
            str(db),
            *([] if embed else ["--no-embed"]),
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--rate-limit",
            "0",
        ]
        log = (Path(tmp) / "server.log").open("w")
        # a session of its own, as a server runs as a service: Linux's autogroup scheduling gives each
        # session an equal share of the cores, so in the bench's session the clients' CPU would come out
        # of the server's share
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc)
            yield url, key, str(db)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("server not ready in time")


def preload(url: str, key: str, n: int) -> None:
    rng = random.Random(12345)
    conn = Connection(url, key)
    for i in range(n):
        status, data = conn.post("/v1/memories", record_body(rng, f"preload-{i // 40}"))
        if status != 201:
            raise SystemExit(f"preload failed: {status} {data[:200]!r}")
    conn.close()


def wait_embedded(db: str, timeout: float = 600) -> None:
    """Until the server has embedded every memory (so the measured window does not carry that backlog)."""
    from clawvm.store import store_from_url

    store = store_from_url(db)
    store.setup()
    try:
        deadline = time.monotonic() + timeout
        while store.unembedded(1) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        store.close()


# ---- HTTP beside in-process ------------------------------------------------------------------------
def tenant_of(url: str, key: str) -> str:
    r = httpx.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    tenant: str = r.json()["tenant"]
    return tenant


def inprocess_harness(db: str, tenant: str, embed: bool, workers: int) -> Any:
    """What one server worker runs for a request of ``tenant``: a Harness over a tenant view of the same
    store, with the server's default redaction and an embedder with a worker's share of the cores. No
    background worker of its own: the server's embeds what this one records, as for the server's records."""
    from clawvm.core.embed import MiniLMEmbedder
    from clawvm.harness import Harness
    from clawvm.server.settings import redaction_options
    from clawvm.store import store_from_url
    from clawvm.store.tenant import TenantStore

    store = store_from_url(db)
    store.setup()
    embedder = MiniLMEmbedder(threads=max(1, (os.cpu_count() or 1) // workers)) if embed else None
    return Harness(TenantStore(store, tenant), embedder, tenant=tenant, **redaction_options())


def p50(xs: list[float]) -> float:
    return round(float(np.percentile(np.asarray(xs), 50)), 3) if xs else 0.0


def side_by_side(url: str, key: str, harness: Any, rounds: int, block: int) -> dict[str, Any]:
    """``rounds`` x ``block`` calls on each side, in pairs: each query or record body goes in-process and
    over HTTP one right after the other (which side goes first alternates), so a burst of the machine's
    other load falls on both sides alike; records of ``block`` consecutive pairs share a session. Recall
    first, then record. Latencies in ms."""
    conn = Connection(url, key)
    times: dict[str, list[float]] = {
        "recall_inprocess": [],
        "recall_http": [],
        "record_inprocess": [],
        "record_http": [],
    }

    def timed(into: str, call: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        call()
        times[into].append((time.perf_counter() - t0) * 1000)

    def over_http(path: str, body: dict[str, Any], expect: int) -> Callable[[], None]:
        def call() -> None:
            status, data = conn.post(path, body)
            if status != expect:
                raise SystemExit(f"{path}: {status} {data[:200]!r}")

        return call

    def pair(op: str, n: int, local: Callable[[], Any], remote: Callable[[], None]) -> None:
        sides = [(f"{op}_inprocess", local), (f"{op}_http", remote)]
        for into, call in sides if n % 2 == 0 else sides[::-1]:
            timed(into, call)

    for warm in range(3):  # warm both sides: model sessions, caches, the connection
        question = QUESTIONS[warm % len(QUESTIONS)]
        harness.recall(question, k=10)
        over_http("/v1/recall", {"query": question, "k": 10}, 200)()
    calls = rounds * block
    for n in range(calls):
        question = QUESTIONS[n % len(QUESTIONS)]
        pair(
            "recall",
            n,
            lambda q=question: harness.recall(q, k=10),
            over_http("/v1/recall", {"query": question, "k": 10}, 200),
        )
    rng = random.Random(7)
    for n in range(calls):
        body = record_body(rng, f"side-{n // block}")
        pair("record", n, lambda b=body: harness.record(**b), over_http("/v1/memories", body, 201))
    conn.close()
    out: dict[str, Any] = {f"{name}_p50_ms": p50(xs) for name, xs in times.items()}
    out["calls_each"] = calls
    out["recall_http_over_inprocess_p50"] = round(
        out["recall_http_p50_ms"] / out["recall_inprocess_p50_ms"], 2
    )
    out["record_http_over_inprocess_p50"] = round(
        out["record_http_p50_ms"] / out["record_inprocess_p50_ms"], 2
    )
    return out


def scaling(url: str, key: str, seconds: float, max_requests: int, slices: int) -> dict[str, Any]:
    """Recall alone with 1 client and with 4: throughput and p50 of each, and their ratio; tracked (the
    default for a writer's key: each recall also writes its hits' access stats), then untracked
    (``track: false``, which writes nothing), to tell the cost of those writes apart. Each side's
    ``seconds`` are cut into ``slices`` windows that alternate (1 client, 4 clients, 1, 4 ...), so a change
    in the machine's other load falls on both sides alike."""
    out: dict[str, Any] = {}
    for track, name in ((True, "recall"), (False, "recall_untracked")):
        latencies: dict[int, list[float]] = {1: [], 4: []}
        errors = dict.fromkeys(latencies, 0)
        elapsed = dict.fromkeys(latencies, 0.0)
        for _ in range(slices):
            for clients in latencies:
                tally, took = run_load(
                    url, key, clients, seconds / slices, max_requests // slices, ["recall"], track
                )
                latencies[clients] += tally.latencies["recall"]
                errors[clients] += tally.errors["recall"]
                elapsed[clients] += took
        for clients, xs in latencies.items():
            out[f"{name}_rps_{clients}"] = round(len(xs) / elapsed[clients], 1)
            out[f"{name}_p50_ms_{clients}"] = p50(xs)
            out[f"{name}_errors_{clients}"] = errors[clients]
        out[f"{name}_rps_4_over_1"] = round(out[f"{name}_rps_4"] / max(out[f"{name}_rps_1"], 1e-9), 2)
    return out


def parse_mix(text: str) -> list[str]:
    mix: list[str] = []
    for part in text.split(","):
        op, _, weight = part.partition(":")
        if op not in OPS or not weight.isdigit():
            raise SystemExit(f"--mix: {part!r} is not OP:WEIGHT with OP in {OPS}")
        mix += [op] * int(weight)
    return mix


GOALS = {
    "recall_http_over_inprocess_p50": ("<=", 1.5),
    "record_http_over_inprocess_p50": ("<=", 3.0),
    "recall_rps_4_over_1": (">=", 1.5),
}


def print_ratios(ratios: dict[str, Any]) -> None:
    print(f"{'ratio':<34} {'value':>7} {'goal':>7}  met")
    for name, (sense, goal) in GOALS.items():
        value = ratios.get(name)
        met = value is not None and (value <= goal if sense == "<=" else value >= goal)
        print(f"{name:<34} {value!s:>7} {sense + str(goal):>7}  {'yes' if met else 'no'}")


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """A SIGTERM (a timeout's, a CI job's cancel) ends the bench through its ``finally`` blocks: the server
    it started runs in a session of its own, which a signal to the bench's group does not reach, and it
    outlived the bench."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients (processes), mixed load")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured duration of each load phase")
    ap.add_argument("--max-requests", type=int, default=100_000, help="stop a phase after this many requests")
    ap.add_argument("--url", default=None, help="a running server (else one is started)")
    ap.add_argument("--key", default=None, help="API key for --url (agent or admin)")
    ap.add_argument("--db", default=None, help="with --url: the server's store, for the in-process side")
    ap.add_argument("--workers", type=int, default=2, help="own server: clawvm serve --workers N")
    ap.add_argument("--preload", type=int, default=500, help="memories recorded before measuring")
    ap.add_argument("--mix", default="record:2,recall:1,context:1", help="operation weights")
    ap.add_argument("--rounds", type=int, default=8, help="HTTP beside in-process: sessions of records")
    ap.add_argument("--block", type=int, default=25, help="HTTP beside in-process: records per session")
    ap.add_argument("--slices", type=int, default=5, help="scaling: alternating windows of 1 and 4 clients")
    ap.add_argument("--no-embed", action="store_true", help="own server without the embedding model")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    mix = parse_mix(args.mix)
    if args.url and not args.key:
        raise SystemExit("--url needs --key")
    embed = not args.no_embed

    def measure(url: str, key: str, db: str | None) -> dict[str, Any]:
        if args.preload:
            preload(url, key, args.preload)
        result: dict[str, Any] = {}
        if db is not None and args.rounds > 0:
            if embed:
                wait_embedded(db)
            harness = inprocess_harness(db, tenant_of(url, key), embed, args.workers)
            try:
                result.update(side_by_side(url, key, harness, args.rounds, args.block))
            finally:
                harness.close(wait=False)
        if db is not None and embed:
            wait_embedded(db)  # the backlog (preload, side-by-side records) is not the scaling phase's
        result.update(scaling(url, key, args.seconds, args.max_requests, args.slices))
        print("HTTP beside in-process (p50 ms):", {k: v for k, v in result.items() if k.endswith("_ms")})
        print("recall scaling:", {k: v for k, v in result.items() if "_rps_" in k or "_p50_ms_" in k})
        print_ratios(result)
        print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        tally, elapsed = run_load(url, key, args.clients, args.seconds, args.max_requests, mix)
        rows = summarize(tally, elapsed)
        print_table(rows)
        for sample in tally.samples:
            print("error sample:", sample)
        return {**result, "ops": rows, "elapsed_s": round(elapsed, 2), "error_samples": tally.samples}

    if args.url:
        result = measure(args.url, args.key, args.db)
    else:
        with own_server(embed, args.workers) as (url, key, db):
            result = measure(url, key, db)
    result["config"] = {
        "clients": args.clients,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "mix": args.mix,
        "preload": args.preload,
        "workers": args.workers if args.url is None else None,
        "rounds": args.rounds,
        "block": args.block,
        "slices": args.slices,
        "own_server": args.url is None,
        "embedder": embed,
        "store": "sqlite" if args.url is None else "external",
    }
    result["machine"] = {
        "cpus": os.cpu_count(),
        "load_average_1m_at_end": round(
            os.getloadavg()[0], 1
        ),  # others' work on the cores moves every figure
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
