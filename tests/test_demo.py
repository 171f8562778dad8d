"""The demo: its recorded tool calls carry the latencies its design states (not the microseconds it runs in),
and `make run` (``clawvm demo --dashboard``) keeps a person's changes, refuses a busy port and prints its
URL only once it listens."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from clawvm import Harness
from clawvm.agents.reliability import all_stats
from clawvm.cli import main
from clawvm.core.errors import ConfigError, NotFoundError
from clawvm.demo import load_workload
from clawvm.demo.scenario import LATENCY_S, ReplayClock, load_scenario, open_demo, remove_store_file


def stated_latencies() -> dict[str, list[float]]:
    """Per tool, the workload's own call-to-result times (seconds), read from its timestamps."""
    found: dict[str, list[float]] = {}
    for session in load_workload()["sessions"]:
        records = session["records"]
        for call, result in pairwise(records):
            if call["kind"] == "tool_call" and result["kind"] == "tool_result":
                took = datetime.fromisoformat(result["at"]) - datetime.fromisoformat(call["at"])
                found.setdefault(result["tool_name"], []).append(took.total_seconds())
    return found


def test_demo_tool_latencies_are_the_stated_ones() -> None:
    clock = ReplayClock()
    h = open_demo("memory://", clock, embed=False)
    try:
        load_scenario(h, clock, echo=lambda _line: None)
        stats = all_stats(h)
        # the workload's calls: each result's duration is the time its call took in the workload
        stated = stated_latencies()
        assert sum(map(len, stated.values())) > 20 and max(max(v) for v in stated.values()) > 300
        for tool, seconds in stated.items():
            results = h.list(limit=100, kind="tool_result", tool_name=tool, status="any")
            ingested = [m for m in results if m.session_id != "run-cutover" and "raw_of" not in m.metadata]
            assert sorted(m.cost.seconds for m in ingested) == sorted(seconds), tool
        # the scripted agent run: each tool takes its stated latency on the replay clock
        for tool, seconds in LATENCY_S.items():
            results = h.list(limit=100, kind="tool_result", tool_name=tool, session_id="run-cutover")
            assert results and all(m.cost.seconds == pytest.approx(seconds, abs=0.05) for m in results), tool
        assert stats["tessera_charge_eu"].p50_s == pytest.approx(LATENCY_S["tessera_charge_eu"], abs=0.05)
        # no tool shows the 0.00 s the dashboard used to print
        assert all(s.p50_s is not None and s.p50_s >= 0.1 for s in stats.values()), {
            t: s.p50_s for t, s in stats.items()
        }
        assert stats["tessera_charge"].unreliable and stats["tessera_charge"].p95_s == pytest.approx(
            10.0, abs=0.05
        )
    finally:
        h.close()


# ---- make run: `clawvm demo --dashboard` as a real process ------------------------------------------------
class DemoProcess:
    """``clawvm demo --dashboard`` on ``port``; its output read line by line as it comes."""

    def __init__(self, db: Path, port: int, *flags: str) -> None:
        argv = ["--no-embed", "--db", str(db), "demo", "--dashboard", "--port", str(port), *flags]
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from clawvm.cli import main; main()", *argv],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, prefix: str, timeout_s: float = 60) -> str:
        """The first line starting with ``prefix`` (the output before it kept in ``seen``)."""
        deadline = time.monotonic() + timeout_s
        while (line := self.lines.get(timeout=max(0.1, deadline - time.monotonic()))) is not None:
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"the demo ended before printing {prefix!r}:\n" + "\n".join(self.seen))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # Ctrl-C, as a person ends `make run`
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def served_url(demo: DemoProcess) -> tuple[str, str]:
    """Waits for the dashboard line; the port must accept a connection the moment it is printed."""
    line = demo.until("MemLens dashboard: ")
    with socket.create_connection(("127.0.0.1", demo.port), timeout=2):  # no retry: it listens already
        pass
    url = line.removeprefix("MemLens dashboard: ")
    return url.split("/dashboard/")[0], url.split("#key=")[1]


def pinned_ids(db: Path) -> set[str]:
    with Harness.open(str(db), embedder=None) as h:
        return {m.id for m in h.iter_all(pinned=True, status="any")}


def test_make_run_keeps_manual_changes_until_reset_and_refuses_a_busy_port(tmp_path: Path) -> None:
    db, port = tmp_path / "demo.db", free_port()
    first = DemoProcess(db, port)
    try:
        base, key = served_url(first)
        # a person pins a memory in the dashboard after the demo loaded
        with Harness.open(str(db), embedder=None) as h:
            target = next(m for m in h.iter_all(kind="observation", session_id="s1") if not m.pinned)
        answer = httpx.post(f"{base}/v1/memories/{target.id}/pin", headers={"X-API-Key": key}, timeout=10)
        assert answer.status_code == 200 and answer.json()["pinned"] is True
    finally:
        first.stop()
    scenario_pins = pinned_ids(db) - {target.id}
    assert scenario_pins and target.id in pinned_ids(db)

    # a busy port: refused before anything is loaded or deleted (even with --reset), naming port and PORT=
    with socket.create_server(("127.0.0.1", port)):
        busy = CliRunner().invoke(main, ["--no-embed", "--db", str(db), "demo", "--dashboard", "--reset",
                                         "--port", str(port)])  # fmt: skip
    assert busy.exit_code == 2, busy.output
    assert f"port: {port} on 127.0.0.1 is taken" in busy.output and f"PORT={port + 1}" in busy.output
    assert "MemLens dashboard" not in busy.output and target.id in pinned_ids(db)

    second = DemoProcess(db, port)  # a plain `make run` again: the store as it was left
    try:
        served_url(second)
        assert any(line.startswith(f"kept {db}") for line in second.seen), second.seen
        assert not any(line.startswith("conversation:") for line in second.seen)  # nothing loaded twice
    finally:
        second.stop()
    assert target.id in pinned_ids(db)

    third = DemoProcess(db, port, "--reset")  # `make run RESET=1`: the demo as shipped
    try:
        served_url(third)
        assert any(line.startswith("conversation:") for line in third.seen)
    finally:
        third.stop()
    with Harness.open(str(db), embedder=None) as h:
        assert h.count(status="any", pinned=True) == len(scenario_pins)
        with pytest.raises(NotFoundError):
            h.get(target.id)


def make_run_line(*assignments: str) -> list[str]:
    """The clawvm command line ``make run`` would run with these variables (``make -n``: nothing runs)."""
    root = Path(__file__).resolve().parents[1]
    shown = subprocess.run(["make", "-n", "run", *assignments], cwd=root, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.split()[:1] and ln.split()[0].endswith("/clawvm")]
    return line.split()[1:]


def test_make_run_passes_port_and_reset_to_the_demo(tmp_path: Path) -> None:
    plain, moved = make_run_line(), make_run_line("PORT=8181", "RESET=1")
    assert plain[plain.index("--port") + 1] == "8080" and "--reset" not in plain
    assert moved[moved.index("--port") + 1] == "8181" and "--reset" in moved
    # the line itself, on a busy port and a store of its own: refused with the port and the fix
    port = free_port()
    args = [*moved[: moved.index("--db") + 1], str(tmp_path / "demo.db"), *moved[moved.index("--db") + 2 :]]
    args[args.index("--port") + 1] = str(port)
    with socket.create_server(("127.0.0.1", port)):
        busy = CliRunner().invoke(main, ["--no-embed", *args])
    assert busy.exit_code == 2 and f"port: {port} on 127.0.0.1 is taken" in busy.output, busy.output
    assert not (tmp_path / "demo.db").exists()


def test_the_dashboard_demo_refuses_a_store_that_is_not_a_finished_demo(tmp_path: Path) -> None:
    db = tmp_path / "mine.db"
    with Harness.open(str(db), embedder=None) as h:
        h.record("my own memory, not the demo's")
    args = ["--no-embed", "--db", str(db), "demo", "--dashboard", "--port", str(free_port())]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "not a finished demo" in refused.output and "RESET=1" in refused.output
    with Harness.open(str(db), embedder=None) as h:
        assert [m.content for m in h.list()] == ["my own memory, not the demo's"]  # left as it was


def test_the_printing_demo_never_starts_over_on_a_store_of_the_users(tmp_path: Path) -> None:
    """`clawvm demo` deleted the store CLAWVM_DB named, the user's memories and API keys with it."""
    db = tmp_path / "agent.db"
    with Harness.open(str(db), embedder=None) as h:
        h.record("customer ACME contract renews on 1 May")
    refused = CliRunner().invoke(main, ["--no-embed", "--db", str(db), "demo"])
    assert refused.exit_code == 2 and "--reset" in refused.output
    with Harness.open(str(db), embedder=None) as h:
        assert [m.content for m in h.list()] == ["customer ACME contract renews on 1 May"]
    demo = tmp_path / "demo.db"
    for _ in range(2):  # its own store it starts over, as before
        assert CliRunner().invoke(main, ["--no-embed", "--db", str(demo), "demo"]).exit_code == 0
    reset = CliRunner().invoke(main, ["--no-embed", "--db", str(db), "demo", "--reset"])  # asked: deleted
    assert reset.exit_code == 0
    with Harness.open(str(db), embedder=None) as h:
        assert not any("ACME" in m.content for m in h.iter_all(status="any"))


def test_reset_deletes_a_sqlite_store_however_named_and_never_a_server_store(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    with Harness.open(str(db), embedder=None) as h:
        h.record("left from an earlier run")
    assert db.exists()
    remove_store_file(f"sqlite:///{db}")
    assert not db.exists() and not Path(f"{db}-wal").exists()
    with pytest.raises(ConfigError, match="--reset deletes a SQLite demo store"):
        remove_store_file("postgresql://localhost/agents")
    remove_store_file("postgresql://localhost/agents", asked=False)  # the printing demo's default: left be


def test_the_demo_has_a_flagged_conflict_adopted_guidance_and_costed_llm_steps() -> None:
    """What the teams face and the trace show of the demo: a conflict with both sides, a guidance build
    with sources whose lines were adopted, LLM steps with tokens and cost, each failure counted once."""
    from clawvm.dashboard import debug
    from clawvm.dashboard.routes import lens_for
    from clawvm.demo.scenario import LLM_COST

    clock = ReplayClock()
    h = open_demo("memory://", clock, embed=False)
    try:
        load_scenario(h, clock, echo=lambda _line: None)
        lens = lens_for(h)
        teams = debug.teams(lens, h)
        [conflict] = teams["conflicts"]
        # the sides a person can keep: the flagged heads only, not an older revision of one of them
        from clawvm.teams import shared

        assert [s["id"] for s in conflict["sides"]] == shared.conflict_choices(h.get(conflict["id"]))
        assert len(conflict["sides"]) == 2 and all(
            h.get(s["id"]).status.value == "active" for s in conflict["sides"]
        )
        sides = {s["preview"][:40] for s in conflict["sides"]}
        assert any("fresh idempotency key" in s for s in sides) and any(
            "keep the Cardinal key" in s for s in sides
        )
        [guide] = teams["guidance"]
        assert guide["agent_id"] == "reviewer" and guide["items"]
        assert all(item["source_tasks"] for item in guide["items"])  # each line names the tasks it came from
        assert {"t-refund-fix"} <= {t for item in guide["items"] for t in item["source_tasks"]}
        adopted = [m for m in teams["knowledge"] if m["adopted"]]
        assert adopted and all("idempotency" in m["preview"].lower() for m in adopted)
        assert any(m["adoption_rate"] == 0.0 for m in teams["knowledge"])  # offered and not adopted

        traced = debug.trace(lens, "run-cutover")
        totals = traced["totals"]

        def calls(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
            found = [s for s in steps if s.get("kind") == "tool_call"]
            return found + [c for s in steps for c in calls(s["children"])]

        steps = traced["steps"] + debug.trace(lens, "s5")["steps"]  # s5's calls are stored PENDING
        answered = [c for c in calls(steps) if any(
            k.get("kind") == "tool_result" for k in c["children"])]  # fmt: skip
        assert answered and all(c["state"] != "pending" for c in answered)  # shown with their outcome
        assert {c["state"] for c in answered} >= {"error", "success"}
        thoughts = h.list(limit=10, kind="llm_thought", session_id="run-cutover", status="any")
        assert len(thoughts) == 3 and all(m.cost.tokens == LLM_COST["thought"]["tokens"] for m in thoughts)
        assert totals["llm_tokens"] == 3 * LLM_COST["thought"]["tokens"] + LLM_COST["decision"]["tokens"]
        assert totals["money"] == pytest.approx(
            3 * LLM_COST["thought"]["money"] + LLM_COST["decision"]["money"]
        )
        # three timed-out charges: each an error call and its error result, three failures
        failed = h.list(limit=20, state="error", session_id="run-cutover", status="any")
        assert len(failed) == 6 and totals["errors"] == 3
        assert totals["tool_seconds"] == pytest.approx(
            sum(
                m.cost.seconds
                for m in h.list(limit=50, kind="tool_result", session_id="run-cutover", status="any")
            )
        )
    finally:
        h.close()


def test_a_trace_without_recorded_tool_durations_says_so_rather_than_0_ms() -> None:
    from clawvm.dashboard import debug
    from clawvm.dashboard.routes import lens_for

    h = Harness.open("memory://", embedder=None)
    try:
        call = h.record('{"args": {"host": "eu-1"}}', kind="tool_call", tool_name="ping", session_id="s1")
        h.record(
            "eu-1 answered in 40 ms", kind="tool_result", tool_name="ping", session_id="s1", parent_id=call.id
        )
        assert debug.trace(lens_for(h), "s1")["totals"]["tool_seconds"] is None
        h.record(
            "eu-2 answered in 250 ms",
            kind="tool_result",
            tool_name="ping",
            session_id="s1",
            cost={"seconds": 0.25},
        )
        totals = debug.trace(lens_for(h), "s1")["totals"]
        assert totals["tool_seconds"] == 0.25 and totals["tool_results_timed"] == 1
    finally:
        h.close()


def test_the_dashboard_demo_refuses_port_0_before_loading_anything(tmp_path: Path) -> None:
    """Port 0 (any free port) was taken, and the demo waited for port 0 to answer: the dashboard's URL and
    its key were never printed."""
    db = tmp_path / "demo.db"
    result = CliRunner().invoke(main, ["--no-embed", "--db", str(db), "demo", "--dashboard", "--port", "0"])
    assert result.exit_code == 2 and "--port" in result.output and "1<=x<=65535" in result.output
    assert not db.exists()
