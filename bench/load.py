"""Load on the REST server: N concurrent clients over loopback, bounded by time and by request count.

Each client is a thread with its own HTTP connection and API key, cycling through an agent's loop with a
fixed mix (``--mix``, default 2 records : 1 recall : 1 context), in sessions of 40 records. Reported per
operation: requests, throughput (req/s over the measured window), p50/p95/p99 latency (ms, client side,
including HTTP) and errors (any status >= 400, or a failed connection; goal 0).

Without ``--url`` the script starts its own server (``clawvm serve``, rate limit off) on a fresh SQLite
file in a temporary directory, with an admin key created beforehand, and preloads ``--preload`` memories
(not measured) so recall and context have a corpus. With ``--url``, pass ``--key`` (an agent key).

    python bench/load.py --clients 4 --seconds 10 --json bench/results/load.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: str, ms: float, error: str | None) -> None:
        with self.lock:
            self.latencies[op].append(ms)
            if error is not None:
                self.errors[op] += 1
                if len(self.samples) < 5:
                    self.samples.append(f"{op}: {error}")


def memory_text(rng: random.Random) -> str:
    subject, tool = rng.choice(SUBJECTS), rng.choice(TOOLS)
    return f"{tool} on the {subject} " + rng.choice(OUTCOMES).format(n=rng.randint(1, 500))


def request(client: httpx.Client, op: str, rng: random.Random, session: str) -> httpx.Response:
    if op == "record":
        body = {
            "content": memory_text(rng),
            "kind": "tool_result",
            "session_id": session,
            "tool_name": rng.choice(TOOLS),
            "tags": [rng.choice(["ops", "billing", "ci"])],
        }
        return client.post("/v1/memories", json=body)
    if op == "recall":
        return client.post("/v1/recall", json={"query": rng.choice(QUESTIONS), "k": 10})
    return client.post(
        "/v1/context", json={"query": rng.choice(QUESTIONS), "budget_tokens": 1000, "session_id": session}
    )


def client_loop(
    url: str, key: str, n: int, mix: list[str], deadline: float, budget: Callable[[], bool], tally: Tally
) -> None:
    rng = random.Random(n)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        step = 0
        while time.perf_counter() < deadline and budget():
            op = mix[step % len(mix)]
            session = f"load-{n}-{step // (40 * len(mix))}"
            t0 = time.perf_counter()
            error: str | None = None
            try:
                r = request(client, op, rng, session)
                if r.status_code >= 400:
                    error = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                error = repr(exc)
            tally.add(op, (time.perf_counter() - t0) * 1000, error)
            step += 1


def run_load(
    url: str, key: str, clients: int, seconds: float, max_requests: int, mix: list[str]
) -> tuple[Tally, float]:
    tally = Tally()
    issued = [0]
    lock = threading.Lock()

    def budget() -> bool:
        with lock:
            issued[0] += 1
            return issued[0] <= max_requests

    start = time.perf_counter()
    deadline = start + seconds
    threads = [
        threading.Thread(target=client_loop, args=(url, key, n, mix, deadline, budget, tally))
        for n in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally, time.perf_counter() - start


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
def own_server(embed: bool) -> Iterator[tuple[str, str]]:
    """Start ``clawvm serve`` on a temporary SQLite file; yields (url, admin key)."""
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
            "--rate-limit",
            "0",
            "--log-level",
            "warning",
        ]
        log = (Path(tmp) / "server.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc)
            yield url, key
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
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        for i in range(n):
            request(client, "record", rng, f"preload-{i // 40}").raise_for_status()


def parse_mix(text: str) -> list[str]:
    mix: list[str] = []
    for part in text.split(","):
        op, _, weight = part.partition(":")
        if op not in OPS or not weight.isdigit():
            raise SystemExit(f"--mix: {part!r} is not OP:WEIGHT with OP in {OPS}")
        mix += [op] * int(weight)
    return mix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients (threads)")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured duration")
    ap.add_argument("--max-requests", type=int, default=100_000, help="stop after this many requests")
    ap.add_argument("--url", default=None, help="a running server (else one is started)")
    ap.add_argument("--key", default=None, help="API key for --url (agent or admin)")
    ap.add_argument("--preload", type=int, default=500, help="memories recorded before measuring")
    ap.add_argument("--mix", default="record:2,recall:1,context:1", help="operation weights")
    ap.add_argument("--no-embed", action="store_true", help="own server without the embedding model")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    mix = parse_mix(args.mix)
    if args.url and not args.key:
        raise SystemExit("--url needs --key")

    def measure(url: str, key: str) -> dict[str, Any]:
        if args.preload:
            preload(url, key, args.preload)
        tally, elapsed = run_load(url, key, args.clients, args.seconds, args.max_requests, mix)
        rows = summarize(tally, elapsed)
        print_table(rows)
        for sample in tally.samples:
            print("error sample:", sample)
        return {"ops": rows, "elapsed_s": round(elapsed, 2), "error_samples": tally.samples}

    if args.url:
        result = measure(args.url, args.key)
    else:
        with own_server(embed=not args.no_embed) as (url, key):
            result = measure(url, key)
    result["config"] = {
        "clients": args.clients,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "mix": args.mix,
        "preload": args.preload,
        "own_server": args.url is None,
        "embedder": not args.no_embed,
        "store": "sqlite" if args.url is None else "external",
    }
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
