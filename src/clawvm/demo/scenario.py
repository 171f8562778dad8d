"""The dashboard demo: enough history that every MemLens view has something to show.

Three workloads on one replay clock (the harness's notion of now follows the scripted times, so the
timeline and heatmap span the five simulated weeks, not the seconds the script takes):

1. the multi-session conversation of :mod:`clawvm.demo` (an ops assistant, five sessions), each session
   followed by an idle ``tick()`` that pages its working tier out; then the workload's questions, each
   as a tracked recall plus a context build whose scripted answer cites the evidence it found
   (:func:`clawvm.observe.lens.record_output`);
2. a scripted tool-using agent run recorded by ``@harness.tool``: a payment API that keeps timing out,
   the EU fallback that works, ledger and rollout checks, contexts and outputs between the steps, the
   intermediate thoughts collapsed into a summary at the end;
3. a small team run (ConMem, :mod:`clawvm.teams.shared`): three agents with grants on one team recording
   observations and decisions, one decision revised by the reviewer;

then a few manual actions (pin, set value, annotate, archive) as a person would make them in the
dashboard, which also exercise the learning rule. Tier budgets are small so that memories reach every
tier, archive and compression included. LoCoMo conversations can be added where the data exists.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from clawvm.agents import toolcalls
from clawvm.core.errors import ConfigError
from clawvm.core.model import Filters, Kind, State
from clawvm.demo import ingest_locomo, ingest_workload, load_workload
from clawvm.harness import Harness
from clawvm.observe.learning import intervene
from clawvm.observe.lens import record_output
from clawvm.store import Store, store_from_url
from clawvm.store.keys import Keyring
from clawvm.store.snapshot import path_for as snapshot_path
from clawvm.teams import shared as teams
from clawvm.teams.merge import merge_team
from clawvm.vm.context import Context
from clawvm.vm.tiers import PagerConfig, TierBudgets

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
#: What each tool of the scripted agent run takes (seconds on the replay clock): the primary payment host
#: times out after its stated 10 s; the EU host answers, the ledger query and the rollout check take
#: what such calls take.
LATENCY_S = {"tessera_charge": 10.0, "tessera_charge_eu": 0.84, "sql_query": 0.12, "shell": 3.6}
#: What each LLM step of the scripted agent run cost, as the agent's client reported it: time, tokens
#: (prompt + completion) and money (USD at a typical small-model price).
LLM_COST = {
    "thought": {"seconds": 1.4, "tokens": 612, "money": 0.00092},
    "decision": {"seconds": 2.1, "tokens": 1034, "money": 0.00155},
}
#: The name of the API key the dashboard demo makes once its scenario is loaded (how a kept store is known).
DEMO_KEY_NAME = "MemLens demo"
#: How often the demo looks whether its server listens yet, to print the URL.
ANNOUNCE_POLL_S = 0.05
#: Budgets small enough that a 30-record session overflows working, short-term and long-term.
DEMO_PAGER = PagerConfig(
    budgets=TierBudgets(working_tokens=700, working_items=12, short_term_items=12, long_term_items=24),
    # the scripted clock drives the demo: pager passes at its lifecycle boundaries only, so every load of
    # the demo (and every replay of it) is the same
    background=False,
)


class ReplayClock:
    """A clock that only moves when told to (and never backwards): the harness's ``clock``."""

    def __init__(self, start: datetime = START) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def at(self, when: datetime) -> None:
        self.now = max(self.now, when)

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)

    def running(self) -> Callable[[], datetime]:
        """From here on, a clock that runs in real time: what the served demo's harnesses use, so values,
        recency and the timeline stay on the scenario's calendar while people act on it."""
        start, started = self.now, time.monotonic()
        return lambda: start + timedelta(seconds=time.monotonic() - started)


@dataclass
class ScenarioReport:
    memories: int
    contexts: int
    outputs: int
    evidence_cited: int
    questions: int
    manual_actions: int


def open_demo(target: str | Path | Store, clock: ReplayClock, embed: bool = True) -> Harness:
    return Harness.open(target, embedder="default" if embed else None, clock=clock, pager=DEMO_PAGER)


def serve_demo(
    db: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    embed: bool = True,
    locomo: Path | None = None,
    echo: Callable[[str], None] = print,
    reset: bool = False,
) -> None:
    """Serve the REST API and the dashboard over the demo store ``db`` until interrupted.

    The store is kept from one run to the next, so what a person changed in the dashboard (pins, values,
    notes) is still there: the scenario is loaded only into an empty store, or after ``reset`` deleted
    the store file. A store that holds memories but no finished demo (not the demo's, or a load cut off)
    is refused rather than loaded into twice. A port already in use is refused before anything is loaded
    or deleted. The dashboard URL, with a new API key (tenant ``default``, role agent) in its fragment, is
    printed once the server accepts connections, not before."""
    from clawvm.server import configure_logging, create_app, run_server

    check_port_free(host, port)
    if reset:
        remove_store_file(db)
    clock = ReplayClock()
    store = store_from_url(db)  # the harness's, closed with it; the app and its keyring share it
    h = open_demo(store, clock, embed)
    try:
        if demo_loaded(store):
            echo(f"kept {db} as it was left (pins and edits stay); start over: make run RESET=1")
            newest = next(h.iter_all(newest_first=True, status="any", batch=1), None)
            if newest is not None:  # the demo's calendar resumes where the store left it
                clock.at(newest.created_at)
        elif h.count(status="any"):
            raise ConfigError(
                f"db: {db} holds memories but not a finished demo (another store, or a load that was cut "
                "off); start the demo over with make run RESET=1 (clawvm demo --dashboard --reset), which "
                "deletes it, or pass another --db"
            )
        else:
            load_scenario(h, clock, echo, locomo)
        configure_logging("warning")
        # the store stays ours (closed with the harness); the app's harnesses keep the demo's pager and clock
        options = {"pager": h.pager.config, "clock": clock.running()}
        app = create_app(store, embedder=h.embedder, harness_options=options)
        _, key = app.state.service.keyring.create("default", "agent", DEMO_KEY_NAME)
        urls = [
            f"\nMemLens dashboard: http://{host}:{port}/dashboard/#key={key}",
            f"REST API: http://{host}:{port}/docs  (API key for tenant 'default', role agent: {key})",
        ]
        stop = threading.Event()
        announcer = announce_when_listening(host, port, urls, echo, stop)
        try:
            run_server(app, host, port)  # ends the dashboards' live event streams at Ctrl-C
        finally:
            stop.set()
            announcer.join()
    finally:
        h.close()


def demo_loaded(store: Store) -> bool:
    """Whether the store holds a finished demo: its API key is made only after the scenario loaded."""
    return any(k.name == DEMO_KEY_NAME for k in Keyring(store).list("default", include_revoked=True))


def holds_only_a_demo(db: str) -> bool:
    """Whether the SQLite store ``db`` is missing, empty or holds only what the printing demo records
    (the workload's sessions, no API keys): what ``clawvm demo`` may delete without being asked. Other
    engines are never deleted by it."""
    url = urlparse(db) if "://" in db else None
    if url is not None and url.scheme not in ("sqlite", "file"):
        return True
    path = Path(db if url is None else url.netloc + url.path)
    if not path.exists():
        return True
    sessions = [s["session_id"] for s in load_workload()["sessions"]]
    store = store_from_url(str(path))
    with Harness.open(store, embedder=None) as h:
        everything, ours = Filters(), Filters.of(session_id=sessions)  # every status, every tenant
        no_keys = not Keyring(store).list(include_revoked=True)
        return no_keys and h.store.count(everything) == h.store.count(ours)


def remove_store_file(db: str, *, asked: bool = True) -> None:
    """Delete a SQLite store (a path or ``sqlite://`` URL) with its WAL files; ``memory://`` starts empty
    anyway. A server's store (PostgreSQL) is not the demo's to drop: refused when the reset was ``asked``
    for, left alone when it is only the printing demo's default."""
    url = urlparse(db) if "://" in db else None
    if url is not None and url.scheme == "memory":
        return
    if url is not None and url.scheme not in ("sqlite", "file"):
        if not asked:
            return
        raise ConfigError(
            f"db: --reset deletes a SQLite demo store, not {url.scheme} ones; give the demo a file "
            "(--db .demo/clawvm.db) or empty that database yourself"
        )
    path = db if url is None else url.netloc + url.path
    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)
    snapshot_path(path).unlink(missing_ok=True)  # left, the next open read it and found it stale


def check_port_free(
    host: str, port: int, again: str = "make run PORT={port} (or clawvm demo --dashboard --port {port})"
) -> None:
    """Refuse a port another process listens on, naming it and how to choose another one (``again``, the
    command with ``{port}`` for a free-looking one; binding here the way the server binds, address reuse
    included, so a port the server could take passes)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn picks it
        with socket.create_server((host, port), family=family):
            pass
    except OSError as exc:
        other = port + 1 if 0 < port < 65535 else 8081
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):  # the port's fault: another one will do
            problem = "is taken by another process" if exc.errno == errno.EADDRINUSE else "needs privileges"
            raise ConfigError(
                f"port: {port} on {host} {problem}; choose another one: {again.format(port=other)}", "port"
            ) from None
        raise ConfigError(  # an unknown name, an address this machine does not have: another port won't do
            f"host: {host} cannot be listened on ({exc}); use 127.0.0.1, 0.0.0.0 or an address of this "
            "machine (--host)",
            "host",
        ) from None


def announce_when_listening(
    host: str, port: int, lines: list[str], echo: Callable[[str], None], stop: threading.Event
) -> threading.Thread:
    """Print ``lines`` once ``host:port`` accepts a connection (the server listens), in a thread that
    gives up when ``stop`` is set (the server ended without listening)."""
    target = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host

    def wait() -> None:
        while not stop.is_set():
            if _accepts(target, port):
                for line in lines:
                    echo(line)
                return
            stop.wait(ANNOUNCE_POLL_S)

    thread = threading.Thread(target=wait, name="clawvm-demo-url", daemon=True)
    thread.start()
    return thread


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def load_scenario(
    h: Harness, clock: ReplayClock, echo: Callable[[str], None] = print, locomo: Path | None = None
) -> ScenarioReport:
    workload = load_workload()
    outputs = cited = 0
    for session in workload["sessions"]:
        ingest_workload(h, {"sessions": [session]}, on_time=clock.at)
        clock.advance(hours=3)
        h.tick()  # the session went idle: its working tier is paged out
    h.flush()
    echo(f"conversation: {h.count(status='any')} memories from {len(workload['sessions'])} sessions")
    clock.advance(hours=1)
    for q in workload["queries"]:
        clock.advance(minutes=7)
        h.recall(q["query"], k=5, agent_id="ops-assistant")
        ctx = h.context(q["query"], budget_tokens=500, session_id="s5", agent_id="ops-assistant")
        found = _answer(h, ctx, q["expect"])
        outputs += 1
        cited += found
    echo(f"questions: {len(workload['queries'])} context builds, evidence cited in {cited}")
    outputs += _agent_run(h, clock)
    echo("agent run: tool calls recorded by @harness.tool (timeouts, fallback, checks)")
    outputs += _team_run(h, clock)
    echo("team run: three agents, grants, shared decisions and a revision")
    n_manual = _manual_actions(h, clock)
    echo(f"manual actions: {n_manual} (pin, set value, annotate, archive)")
    if locomo is not None:
        echo(f"LoCoMo: {ingest_locomo(h, locomo)} turns from {locomo}")
    clock.advance(hours=6)
    h.tick()
    h.flush()
    return ScenarioReport(
        memories=h.count(status="any"),
        contexts=outputs,
        outputs=outputs,
        evidence_cited=cited,
        questions=len(workload["queries"]),
        manual_actions=n_manual,
    )


def _answer(h: Harness, ctx: Context, expect: str, success: bool | None = None) -> bool:
    """A scripted agent answer: cite the context lines holding ``expect`` (else the first retrieved)."""
    lines = {e.id: e for e in ctx.manifest}
    found = h.store.get_many(list(lines))
    evidence = [i for i, m in found.items() if expect.lower() in m.content.lower()]
    cite = evidence or [e.id for e in ctx.manifest if e.section == "retrieved"][:1]
    refs = " ".join(f"[{lines[i].short_id}]" for i in cite)
    text = f"{expect[:1].upper()}{expect[1:]}. Sources: {refs}" if evidence else f"Not sure; closest: {refs}"
    record_output(h, ctx, text, success=bool(evidence) if success is None else success)
    return bool(evidence)


def _agent_run(h: Harness, clock: ReplayClock) -> int:
    scope: dict[str, Any] = {"session_id": "run-cutover", "task_id": "t-dry-run", "agent_id": "deploy-bot"}
    clock.at(datetime(2026, 4, 2, 15, 0, tzinfo=UTC))

    # each tool takes its stated latency on the replay clock (the scripted time the harness follows):
    # @harness.tool records that as the call's duration, so the reliability view shows real p50/p95
    def charge(host: str, amount_eur: float) -> dict[str, Any]:
        if host == "api.tessera.example":
            clock.advance(seconds=LATENCY_S["tessera_charge"])
            raise TimeoutError(f"read timed out after 10 s calling https://{host}/v2/charges")
        clock.advance(seconds=LATENCY_S["tessera_charge_eu"])
        return {"status": "captured", "host": host, "amount_eur": amount_eur, "charge_id": "ch_7Qx2"}

    tessera_charge = h.tool("tessera_charge", timeout_errors=(TimeoutError,), **scope)(charge)

    @h.tool("tessera_charge_eu", fallback_for="tessera_charge", **scope)
    def tessera_charge_eu(amount_eur: float) -> dict[str, Any]:
        return charge("eu.api.tessera.example", amount_eur)

    @h.tool("sql_query", **scope)
    def sql_query(sql: str) -> list[dict[str, Any]]:
        clock.advance(seconds=LATENCY_S["sql_query"])
        return [{"captured": 3, "failed": 0, "total_eur": "1274.50"}]

    @h.tool("shell", **scope)
    def shell(cmd: str) -> str:
        clock.advance(seconds=LATENCY_S["shell"])
        return 'deployment "billing-svc" successfully rolled out (3/3 replicas)'

    h.record(
        "Dry run of the Tessera cutover: charge 3 test invoices, check the ledger, roll out.",
        kind=Kind.USER_INPUT,
        **scope,
    )
    outputs = 0
    for attempt in range(3):
        clock.advance(seconds=40)
        thought = f"Attempt {attempt + 1}: charging invoice INV-{1040 + attempt} through the primary host."
        cost = LLM_COST["thought"]
        turn = h.record(thought, kind=Kind.LLM_THOUGHT, state=State.INTERMEDIATE, cost=cost, **scope)
        clock.advance(seconds=10)
        # recorded as an ERROR result by the tool wrapper, 10 s later, under the turn that asked for it
        with suppress(TimeoutError), toolcalls.scope(parent_id=turn.id):
            tessera_charge("api.tessera.example", 424.83)
        ctx = h.context("tessera charge timed out: what worked before?", budget_tokens=400, **scope)
        _answer(h, ctx, "timed out", success=False)
        outputs += 1
    clock.advance(minutes=2)
    h.record(
        "Decided: route charges through the EU regional host while the primary keeps timing out.",
        kind=Kind.DECISION,
        cost=LLM_COST["decision"],
        **scope,
    )
    for n in range(3):
        clock.advance(seconds=30)
        tessera_charge_eu(424.83 + n)
    clock.advance(minutes=1)
    sql_query("SELECT count(*) FILTER (WHERE captured), sum(amount) FROM charges WHERE run = 'dry-1'")
    clock.advance(minutes=1)
    shell("kubectl rollout status deploy/billing-svc -n billing")
    clock.advance(minutes=1)
    question = "did the dry run succeed and which host should production use?"
    ctx = h.context(question, budget_tokens=600, **scope)
    _answer(h, ctx, "captured", success=True)
    h.collapse_task("t-dry-run")
    return outputs + 1


def _team_run(h: Harness, clock: ReplayClock) -> int:
    team, task, session = "billing-team", "t-refund-fix", "team-refunds"
    clock.at(datetime(2026, 4, 3, 9, 0, tzinfo=UTC))
    for agent in ("planner", "coder", "reviewer"):
        h.grant(team, agent, read=True, write=True)
    common = {"team_id": team, "task_id": task, "session_id": session, "task_type": "refunds"}
    key = "refund idempotency key"  # what the two decisions are about: fusion flags them as a conflict
    script: list[tuple[str, Kind, str, str | None]] = [
        (
            "planner",
            Kind.OBSERVATION,
            "Refunds over EUR 500 fail on Tessera: error R-409 (duplicate key).",
            None,
        ),
        (
            "coder",
            Kind.OBSERVATION,
            "R-409 happens because billing-svc reuses the Cardinal idempotency key.",
            None,
        ),
        ("planner", Kind.DECISION, "Decided: generate a fresh idempotency key per refund attempt.", key),
        ("coder", Kind.KNOWLEDGE, "Tessera idempotency keys must be unique per request for 24 hours.", None),
        ("reviewer", Kind.OBSERVATION, "The fix passes the refund test suite: 48 passed, 0 failed.", None),
        (
            "coder",
            Kind.DECISION,
            "Decided: keep the Cardinal key and retry a refund on R-409 after 60 s.",
            key,
        ),
    ]
    made = []
    for agent, kind, text, subject in script:
        clock.advance(minutes=12)
        made.append(teams.record(h, text, agent_id=agent, kind=kind, subject=subject, **common))
    clock.advance(minutes=20)
    revised = "Decided: fresh idempotency key per refund attempt, derived from refund id + attempt number."
    h.revise(made[2].id, agent_id="reviewer", content=revised)
    # fusion after the task: the coder's decision contradicts the planner's on the same subject, so a
    # conflict note waits for review (both sides shown in the teams view)
    merge_team(h, team_id=team)
    clock.advance(minutes=30)
    # the next refunds task asks the team for guidance and adopts the lines it acted on
    guide = h.guidance(
        "reviewer", "retry failed refunds safely", task_id="t-refund-retry", task_type="refunds"
    )
    for item in guide.items:
        if item.section != "conflict":
            h.feedback(item.id, adopted="idempotency" in item.line.lower())
    outputs = 0
    for agent in ("coder", "reviewer"):
        clock.advance(minutes=5)
        ctx = h.context("why did refunds fail and what is the fix?", budget_tokens=500, session_id=session)
        _answer(h, ctx, "idempotency key", success=True)
        outputs += 1
        h.record(
            f"{agent} confirmed the refund fix against the context.",
            kind=Kind.NOTE,
            agent_id=agent,
            session_id=session,
            task_id=task,
        )
    return outputs


def _manual_actions(h: Harness, clock: ReplayClock) -> int:
    clock.advance(hours=2)
    profile = _find(h, "User profile: Priya Raman")
    thought = _find(h, "Priya wants Lisbon local times")
    fallback = _find(h, "route charges through the EU regional host")
    junk = h.record("ok", kind=Kind.NOTE, session_id="s5", agent_id="ops-assistant")
    done = 0
    for action, memory_id, extra in (
        ("pin", profile, {}),
        ("set_value", thought, {"value": 0.1}),
        ("annotate", fallback, {"note": "Confirmed by Priya on the cutover call."}),
        ("archive", junk.id, {}),
    ):
        if memory_id is not None:
            clock.advance(minutes=3)
            intervene(h, action, memory_id, by="demo", **extra)
            done += 1
    return done


def _find(h: Harness, text: str) -> str | None:
    hits = h.recall(text, k=5, preset="bm25", track=False, status="any")
    return next((x.id for x in hits if text in x.memory.content), None)
