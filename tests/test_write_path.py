"""Conformance of the one write path (:mod:`clawvm.write.commit`): every public write of every surface.

The promise: for every public write operation of the SDK (:class:`~clawvm.Harness` and the feature
functions that take one), the REST app, the MCP server and the LangGraph store -- each enumerated here
from the code, so that a new one cannot be forgotten -- a planted e-mail, card number and API token are
never stored in clear nor returned in clear to a non-admin, and exactly the expected events are logged.

Each surface has one table: its write operations (how to perform each with planted text, and the event
kinds it must log, exactly, as a multiset) and its reads (with the reason it writes nothing). A public
operation in neither table fails ``test_*_are_all_classified``. After each write, in a store of its own:

- no stored memory (every field; the sealed original excepted, it is ciphertext) and no event's data
  holds a planted secret, read through the store *and* in the raw bytes of the SQLite file and its WAL;
- the value returned to the caller, serialised, holds none (where a case says what of it is the caller's
  own input echoed back, that part is left out, and the case says so);
- the events logged since the write began are exactly the expected kinds.

What is planted: every free text a caller gives -- contents, tool-call arguments, results and errors,
queries, task descriptions, checkpoint names, review reasons, annotations, agent outputs. Not planted
here: caller-supplied tags, metadata and scope ids (tests/test_redact_fields.py plants those, field by
field), LangGraph namespaces and keys, API key names. Free text that the harness itself files under metadata
(a tool call's arguments, a review reason, an annotation, a checkpoint name) is planted: it is text the
caller gave, and the promise covers wherever it ends up.

Stores are SQLite files (the raw-bytes check needs one); the lexical embedder is off (``embedder=None``).
The REST app factory is imported from ``clawvm.server.app``: the ``clawvm.server`` package exposes nothing
yet (it is being split); move the import when it does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from langgraph.store.base import GetOp, PutOp
from mcp import Client
from pydantic import BaseModel

from clawvm import AccessDeniedError, AgentWithMemory, Harness, Kind, Memory, State, Tier
from clawvm.agents import toolcalls
from clawvm.agents.tools import AgentTools
from clawvm.core.model import build_memory
from clawvm.core.redact import RedactionPolicy, luhn_valid, redact
from clawvm.integrations.langgraph import ClawVMStore
from clawvm.integrations.mcp_server import build_server
from clawvm.observe import learning
from clawvm.observe.lens import record_output
from clawvm.server.app import ServerSettings, create_app
from clawvm.store import Event, SQLiteStore
from clawvm.store.crypto import REDACTION_FIELD, DataKey, DataKeys
from clawvm.teams import shared
from clawvm.teams.merge import merge_team
from clawvm.vm.context import short_id
from clawvm.vm.tiers import TierBudgets

# ---- what is planted, and what must never show ----------------------------------------------------------
EMAIL = "dana.whitfield@northwind-mail.com"
CARD = "4539 1488 0343 6467"  # a Visa test number: Luhn-valid
TOKEN = "ghp_R8x2Kq7ZpL4mN9vT1wYb3Cd5Fg6Hj0SaQeUo"  # a GitHub personal access token's shape
PLANTED = (
    f"Call notes: reach Dana at {EMAIL} about the refund. The card on file is {CARD}. "
    f"Deploy with token {TOKEN} before Friday. The staging cluster ran out of disk, so the nightly build "
    "failed twice and was retried after the cache was pruned."
)
SHORT_PLANTED = f"refund {EMAIL} {CARD} {TOKEN}"  # for fields of at most 200 characters
#: what must never show in clear: each secret whole, and the pieces that would betray a half-redacted one
TELLTALES = {
    "e-mail": EMAIL,
    "e-mail's user": EMAIL.split("@")[0],
    "card number": CARD,
    "card digits": CARD.replace(" ", ""),
    "token": TOKEN,
    "token's head": TOKEN[4:16],
    "token's tail": TOKEN[-12:],
}
KINDS = ("email", "card", "secret")

SESSION, TASK, AGENT, TEAM = "s1", "t1", "a1", "team1"


def straddling(limit: int, filler: str = "x") -> str:
    """Planted text whose token straddles character ``limit`` (where some writers cut text to log it)."""
    head = f"Context for {EMAIL}: "
    token_at = limit - 20  # a cut at ``limit`` keeps the token's prefix and its first 16 characters
    return head + filler * (token_at - len(head) - 1) + f" {TOKEN} and the card {CARD}."


def test_the_planted_secrets_are_what_the_detectors_catch() -> None:
    """Otherwise every test below would pass for the wrong reason."""
    assert luhn_valid(CARD.replace(" ", ""))
    policy = RedactionPolicy.of(KINDS)
    for text in (PLANTED, SHORT_PLANTED, straddling(500)):
        found = redact(text, policy)
        assert found.counts() == {"email": 1, "card": 1, "secret": 1}, (text, found)
        assert not telltales_in(found.text)
    assert len(SHORT_PLANTED) <= 200


# ---- the leak checks ------------------------------------------------------------------------------------
def telltales_in(text: str) -> list[str]:
    return [name for name, secret in TELLTALES.items() if secret in text]


def hits(value: Any, where: str) -> Iterator[str]:
    """Where in ``value`` (plain JSON-like data) a planted secret shows, as ``where.path holds the ...``."""
    if isinstance(value, str):
        if found := telltales_in(value):
            yield f"{where} holds the {', '.join(found)}"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from hits(str(key), f"{where} (a key)")
            yield from hits(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from hits(item, f"{where}[{i}]")


def plain(value: Any) -> Any:
    """``value`` as the caller could print or send it: models and dataclasses as dicts, else repr."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def events_after(store: SQLiteStore, seq: int) -> list[Event]:
    out: list[Event] = []
    while page := store.read_events(seq, 1000):
        out.extend(page)
        seq = page[-1].seq or seq
    return out


def last_seq(store: SQLiteStore) -> int:
    found = events_after(store, 0)
    return (found[-1].seq or 0) if found else 0


def stored_leaks(store: SQLiteStore, db: Path) -> list[str]:
    """Every place a planted secret is stored in clear: memories, events, and the raw file bytes."""
    found: list[str] = []
    for m in store.iter_all():
        shown = m.model_dump(mode="json")
        mark = shown["metadata"].get(REDACTION_FIELD)
        if isinstance(mark, dict) and "sealed" in mark:
            mark["sealed"] = "<ciphertext>"  # the sealed original: what keep_original is for
        found += hits(shown, f"memory {m.id} ({m.kind.value})")
    for e in events_after(store, 0):
        found += hits(e.data, f"event {e.seq} ({e.kind}) data")
    for path in (db, db.with_name(db.name + "-wal")):
        raw = path.read_bytes() if path.exists() else b""
        if in_file := [name for name, secret in TELLTALES.items() if secret.encode() in raw]:
            found.append(f"{path.name} bytes hold the {', '.join(in_file)}")
    return found


def assert_clean(store: SQLiteStore, db: Path, returned: Any, what: str) -> None:
    leaks = [*stored_leaks(store, db), *hits(plain(returned), "the returned value")]
    assert not leaks, f"{what} leaks a planted secret:\n  " + "\n  ".join(leaks)


def assert_events(store: SQLiteStore, since: int, expected: tuple[str, ...], what: str) -> None:
    """Exactly the ``expected`` events since ``since``; those still missing get a few seconds (a server's
    recall leaves its event to the background pager's next pass)."""
    deadline = time.monotonic() + 10.0
    logged = [e.kind for e in events_after(store, since)]
    while Counter(logged) < Counter(expected) and time.monotonic() < deadline:
        time.sleep(0.02)
        logged = [e.kind for e in events_after(store, since)]
    assert Counter(logged) == Counter(expected), f"{what} logged {logged}, expected {sorted(expected)}"


class Clock:
    """A clock the tests move (the pager's idle and value rules read it)."""

    def __init__(self) -> None:
        self.at = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        self.at += timedelta(**delta)


def policy(keep_original: bool) -> dict[str, Any]:
    """Harness options: redact the planted kinds; with ``keep_original``, seal originals with a fresh key."""
    if not keep_original:
        return {"redaction": RedactionPolicy.of(KINDS)}
    keys = DataKeys((DataKey.generate(),))
    return {"redaction": RedactionPolicy.of(KINDS, keep_original=True), "data_keys": keys}


# ---- the SDK --------------------------------------------------------------------------------------------
@dataclass
class World:
    """A harness over its own SQLite file, with one planted memory (``note``) in session s1 / task t1."""

    harness: Harness
    store: SQLiteStore
    db: Path
    clock: Clock
    note: Memory
    seen: int = 0  # the events up to this seq are the preparation's

    def mark(self) -> None:
        """The write under test starts here (what a case prepared before is not counted)."""
        self.seen = last_seq(self.store)


def open_world(tmp_path: Path, *, keep_original: bool = True) -> World:
    db = tmp_path / "clawvm.db"
    store = SQLiteStore(db)
    clock = Clock()
    harness = Harness.open(store, embedder=None, clock=clock, **policy(keep_original))
    note = harness.record(PLANTED, kind=Kind.KNOWLEDGE, session_id=SESSION, task_id=TASK, agent_id=AGENT)
    world = World(harness, store, db, clock, note)
    world.mark()
    return world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = open_world(tmp_path)
    yield w
    w.harness.close()


def _itself(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Case:
    """One write: ``run`` performs it (preparing first if it must, then ``world.mark()``) and returns what
    the caller gets; ``events``: the kinds it logs, exactly; ``shown``: what of the return value is the
    library's answer (the default: all of it)."""

    run: Callable[[World], Any]
    events: tuple[str, ...]
    label: str = ""
    shown: Callable[[Any], Any] = _itself


def _revise(w: World) -> Memory:
    return w.harness.revise(w.note.id, agent_id=AGENT, content=f"{PLANTED} (revised)")


def _import(w: World) -> int:
    text = build_memory({"content": PLANTED, "tenant": "default", "session_id": "s9"})
    payload = build_memory(
        {"content": json.dumps({"note": PLANTED}), "content_type": "application/json", "tenant": "default"}
    )
    return w.harness.import_memories([text, payload])


def _import_renamed(w: World) -> int:
    return w.harness.import_renamed([build_memory({"content": PLANTED, "tenant": "default"})]).imported


def _unpin(w: World) -> Memory:
    w.harness.pin(w.note.id)
    w.mark()
    return w.harness.unpin(w.note.id)


def _decompress(w: World) -> Memory:
    w.harness.compress(w.note.id)
    w.mark()
    return w.harness.decompress(w.note.id)


def _intermediate_steps(w: World, task_id: str, agent_id: str | None = None) -> None:
    for step in ("looked the customer up", "found the charge", "refunded it"):
        scope = {"task_id": task_id, "session_id": SESSION, "agent_id": agent_id}
        w.harness.record(f"{step}: {PLANTED}", state=State.INTERMEDIATE, **scope)


def _collapse(w: World) -> Memory | None:
    _intermediate_steps(w, "t9")
    w.mark()
    return w.harness.collapse_task("t9")


def _rollback(w: World) -> Any:
    checkpoint = w.harness.checkpoint(SESSION, "before")
    w.harness.record(f"later: {PLANTED}", session_id=SESSION)
    w.mark()
    return w.harness.rollback(checkpoint)


def _start_session(w: World) -> list[Memory]:
    w.harness.record(PLANTED, tier=Tier.LONG_TERM)  # outside the working tier: preloading promotes it
    w.mark()
    return w.harness.start_session("s2", PLANTED)


def _tick(w: World) -> dict[str, int]:
    w.clock.advance(days=3)  # values drift (refresh) and the idle session pages out (demote)
    return w.harness.tick()


def _over_working_budget(w: World) -> None:
    """Five memories in a working tier of four (no background pager): the session is due for a pass."""
    budgets = TierBudgets(working_items=4, working_tokens=None)
    w.harness.pager.config = replace(w.harness.pager.config, budgets=budgets, background=False)
    for i in range(4):
        w.harness.record(f"{PLANTED} ({i})", session_id=SESSION)
    assert w.harness.working.due()
    w.mark()


def _page(w: World) -> Any:
    _over_working_budget(w)
    return w.harness.page()  # 5 -> int(4 * 0.75): two demotions


def _flush(w: World) -> None:
    _over_working_budget(w)
    w.harness.flush()  # a lifecycle boundary: the same pass


def _decorated_tool(w: World) -> Any:
    @w.harness.tool("lookup_customer", session_id=SESSION)
    def lookup_customer(query: str, contact: str) -> dict[str, str]:
        return {"answer": f"found: {PLANTED}"}

    return lookup_customer(PLANTED, contact=EMAIL)


def _failing_tool(w: World) -> None:
    @w.harness.tool("charge_card", session_id=SESSION)
    def charge_card(card: str) -> None:
        raise RuntimeError(f"card {card} declined for {EMAIL}; token {TOKEN} rejected")

    with pytest.raises(RuntimeError):
        charge_card(CARD)


def _long_result_tool(w: World) -> Any:
    @w.harness.tool("fetch_log", session_id=SESSION)
    def fetch_log() -> str:
        # spaces: 8,000 characters of one unreadable word count ~2,600 tokens, over the session's working
        # budget, and the pager's demote of the result would join this write's events
        return straddling(toolcalls.MAX_RESULT_CHARS, filler=" ")

    return fetch_log()


def _tool_call(w: World) -> Any:
    with w.harness.tool_call("send_invoice", {"to": EMAIL, "body": PLANTED}, session_id=SESSION) as call:
        call.set_result({"sent": PLANTED})
    return call


def _restore_session(w: World) -> Any:
    # a PENDING call whose process is gone (no pid recorded): restore marks it interrupted
    w.harness.record(
        {"tool": "refund", "args": {"note": PLANTED}},
        kind=Kind.TOOL_CALL,
        state=State.PENDING,
        tool_name="refund",
        session_id=SESSION,
        metadata={"tool_call": {"status": "pending"}},
    )
    w.mark()
    return w.harness.restore_session(SESSION)


def _without_task(g: Any) -> Any:
    return dataclasses.replace(g, task="")  # the caller's own task, echoed back


#: The library's answer of a decorated tool is the tool's own return value, passed through unchanged.
def _nothing(_value: Any) -> None:
    return None


def open_conflict(h: Harness) -> tuple[str, str]:
    """Two team decisions on one subject, each with the planted secrets, merged into a flagged conflict:
    the conflict note's id and the side to keep."""
    h.grant(TEAM, AGENT, write=True)
    sides = [
        shared.record(
            h,
            f"{SHORT_PLANTED}: refunds within {days} days",
            agent_id=AGENT,
            kind="decision",
            team_id=TEAM,
            subject="refund window",
            task_id=f"t-{days}",
        )
        for days in (14, 30)
    ]
    (note,) = merge_team(h, team_id=TEAM).conflicts
    return note, sides[0].id


def _resolve_conflict(w: World) -> Memory:
    note, keep = open_conflict(w.harness)
    w.mark()
    return w.harness.resolve_conflict(note, keep=keep, by="reviewer")


SDK_WRITES: dict[str, tuple[Case, ...]] = {
    "record": (
        Case(lambda w: w.harness.record(PLANTED, session_id=SESSION, task_id=TASK), ("add",)),
        Case(lambda w: w.harness.record({"note": PLANTED, "steps": [PLANTED]}), ("add",), "json"),
    ),
    "update": (Case(lambda w: w.harness.update(w.note.id, content=f"{PLANTED} (corrected)"), ("update",)),),
    "revise": (Case(_revise, ("revise",)),),
    "import_memories": (Case(_import, ("import", "import")),),
    "import_renamed": (Case(_import_renamed, ("import",)),),
    "forget": (Case(lambda w: w.harness.forget(w.note.id), ("forget",)),),
    "pin": (Case(lambda w: w.harness.pin(w.note.id), ("pin",)),),
    "unpin": (Case(_unpin, ("unpin",)),),
    "rate": (Case(lambda w: w.harness.rate(w.note.id, 1), ("feedback",)),),
    "feedback": (Case(lambda w: w.harness.feedback(w.note.id, True), ("feedback",)),),
    "grant": (Case(lambda w: w.harness.grant(TEAM, AGENT, write=True), ("grant",)),),
    "approve": (Case(lambda w: w.harness.approve(w.note.id, by="reviewer"), ("update", "review.approved")),),
    "reject": (
        Case(
            lambda w: w.harness.reject(w.note.id, by="reviewer", reason=PLANTED),
            ("update", "review.rejected"),
        ),
    ),
    "resolve_conflict": (
        Case(
            _resolve_conflict,
            ("update", "review.rejected", "update", "review.resolved", "update", "review.approved"),
        ),
    ),
    "compress": (Case(lambda w: w.harness.compress(w.note.id), ("compress",)),),
    "decompress": (Case(_decompress, ("decompress",)),),
    "collapse_task": (Case(_collapse, ("add", "collapse")),),
    "checkpoint": (Case(lambda w: w.harness.checkpoint(SESSION, SHORT_PLANTED), ("checkpoint",)),),
    "rollback": (Case(_rollback, ("rollback",)),),
    "start_session": (Case(_start_session, ("promote", "preload")),),
    "tick": (Case(_tick, ("refresh", "demote")),),
    "page": (Case(_page, ("demote", "demote")),),
    "flush": (Case(_flush, ("demote", "demote")),),
    "context": (Case(lambda w: w.harness.context(PLANTED, session_id=SESSION), ("context",)),),
    # the recall's event is written by the next pager pass, here the flush's
    "recall": (Case(lambda w: (w.harness.recall(PLANTED), w.harness.flush())[0], ("retrieve",)),),
    "guidance": (
        Case(lambda w: w.harness.guidance(AGENT, PLANTED), ("guidance",), shown=_without_task),
        Case(
            lambda w: w.harness.guidance(AGENT, straddling(500)),
            ("guidance",),
            "task cut at 500 characters",
            _without_task,
        ),
    ),
    "tool": (
        Case(_decorated_tool, ("add", "add", "update"), "returns", _nothing),
        Case(_failing_tool, ("add", "add", "update"), "raises"),
        Case(_long_result_tool, ("add", "add", "update"), "result cut to its limit", _nothing),
    ),
    # the ToolCall's args are the caller's own; what the library answers is the call and result memories
    "tool_call": (Case(_tool_call, ("add", "add", "update"), shown=lambda c: [c.call, c.result]),),
    "restore_session": (Case(_restore_session, ("add", "update", "tool_interrupted")),),
}

SDK_READS: dict[str, str] = {
    "open": "opens a store (the constructor)",
    "close": "closes the store",
    "notify_embedder": "wakes the embedding worker",
    "now": "the harness's clock",
    "get": "one memory",
    "list": "memories by filters",
    "list_page": "memories by filters, a keyset page",
    "count": "a count by filters",
    "group_counts": "counts by kind, status and tier, from one read",
    "checkpoints": "a session's checkpoint memories, listed",
    "events": "the event log",
    "history": "a revision chain",
    "explain": "a value breakdown",
    "review_queue": "memories awaiting review",
    "tool_reliability": "statistics of past tool calls",
    "recall_with": "an untracked recall with a given vector (benchmarks)",
    "filters": "the callers' filters (tenant, status) as a Filters value",
    "check_record": "raises what record() would raise for its arguments, writing nothing",
    "iter_all": "memories by filters, in keyset pages",
    "share_embed_worker": "points the harness at a shared embedding worker (a server's)",
    "share_query_embeddings": "points the harness at a shared pool of query-embedding threads (a server's)",
}

#: Returns originals in clear, to admins only: its own test below.
SDK_ADMIN = {"reveal"}


def public_methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


def test_harness_methods_are_all_classified() -> None:
    public = public_methods(Harness)
    tables = {"SDK_WRITES": set(SDK_WRITES), "SDK_READS": set(SDK_READS), "SDK_ADMIN": SDK_ADMIN}
    unclassified = public - set().union(*tables.values())
    assert not unclassified, (
        f"Harness has public methods no table classifies: {sorted(unclassified)}; add each to SDK_WRITES "
        "(with a case planting secrets and the events it logs) or to SDK_READS (saying why it writes nothing)"
    )
    for name, table in tables.items():
        assert table <= public, f"{name} lists what Harness no longer has: {sorted(table - public)}"
    assert not set(SDK_WRITES) & set(SDK_READS), "a method is classified both ways"


def _cases(table: Mapping[str, tuple[Case, ...]]) -> list[Any]:
    return [
        pytest.param(case, id=f"{name}[{case.label}]" if case.label else name)
        for name, cases in table.items()
        for case in cases
    ]


@pytest.mark.parametrize("case", _cases(SDK_WRITES))
def test_sdk_write_stores_and_returns_no_secret(world: World, case: Case) -> None:
    returned = case.run(world)
    assert_clean(world.store, world.db, case.shown(returned), "this write")
    assert_events(world.store, world.seen, case.events, "this write")


def test_reveal_gives_admins_the_original_and_nobody_else(world: World) -> None:
    with pytest.raises(AccessDeniedError):
        world.harness.reveal(world.note.id)
    assert_events(world.store, world.seen, (), "a refused reveal")
    assert world.harness.reveal(world.note.id, admin=True) == PLANTED
    assert_events(world.store, world.seen, ("reveal",), "a reveal")
    assert_clean(world.store, world.db, world.harness.get(world.note.id), "a reveal")


# ---- feature functions that take a harness --------------------------------------------------------------
def _intervene(action: str, **options: Any) -> Callable[[World], Any]:
    def run(w: World) -> Any:
        if action == "unpin":
            w.harness.pin(w.note.id)
            w.mark()
        return learning.intervene(w.harness, action, w.note.id, **options)

    return run


#: learning.intervene, by manual action (the dashboard's buttons)
INTERVENE: dict[str, tuple[Case, ...]] = {
    "pin": (Case(_intervene("pin"), ("pin", "scoring_weights", "manual")),),
    "unpin": (Case(_intervene("unpin"), ("unpin", "manual")),),
    "set_value": (Case(_intervene("set_value", value=0.2), ("scoring_weights", "manual")),),
    "annotate": (
        Case(_intervene("annotate", note=PLANTED), ("update", "manual")),
        # the longest note taken (2,000 characters: a longer one is refused, not cut), secrets at its end
        Case(_intervene("annotate", note=straddling(1940)), ("update", "manual"), "note near the limit"),
    ),
    "archive": (Case(_intervene("archive"), ("archive", "scoring_weights", "manual")),),
    "set_tier": (Case(_intervene("set_tier", tier="archive"), ("archive", "manual")),),
}


def test_intervene_actions_are_all_classified() -> None:
    assert set(INTERVENE) == set(learning.ACTIONS), "classify every manual action in INTERVENE"


@pytest.mark.parametrize("case", _cases(INTERVENE))
def test_intervene_stores_and_returns_no_secret(world: World, case: Case) -> None:
    returned = case.run(world)
    assert_clean(world.store, world.db, case.shown(returned), "this manual action")
    assert_events(world.store, world.seen, case.events, "this manual action")


@pytest.mark.parametrize("cut", [None, 4000], ids=["output", "output cut at 4000"])
def test_record_output_stores_and_returns_no_secret(world: World, cut: int | None) -> None:
    ctx = world.harness.context("refund card", session_id=SESSION)
    world.mark()
    cites = f"As [{short_id(world.note.id)}] says: "
    output = cites + (PLANTED if cut is None else straddling(cut - len(cites)))
    returned = record_output(world.harness, ctx, output)
    assert_clean(world.store, world.db, returned, "record_output")
    assert_events(world.store, world.seen, ("output",), "record_output")


class ScriptedAgent:
    """An agent that answers with planted text."""

    def reply(self, messages: list[dict[str, str]]) -> str:
        return f"Refunded; I wrote to {EMAIL} and used {TOKEN}. {PLANTED}"


def _agent(w: World) -> AgentWithMemory:
    w.harness.grant(TEAM, AGENT, write=True)  # the reply is recorded for the team
    w.mark()
    return AgentWithMemory(ScriptedAgent(), w.harness, agent_id=AGENT, team_id=TEAM, session_id=SESSION)


def _agent_reply(w: World) -> Any:
    agent = _agent(w)
    agent.reply([{"role": "user", "content": PLANTED}])
    return agent.last_guidance, agent.last_reply  # the reply text itself is the agent's own answer


def _agent_feedback(w: World) -> Any:
    agent = _agent(w)
    agent.reply([{"role": "user", "content": PLANTED}])
    assert agent.last_guidance is not None and agent.last_guidance.ids, "guidance offered nothing to rate"
    w.mark()
    agent.feedback(True)
    return w.harness.get(agent.last_guidance.ids[0])


AGENT_WRITES: dict[str, Case] = {
    "reply": Case(_agent_reply, ("guidance", "add", "add"), shown=lambda r: (_without_task(r[0]), r[1])),
    "feedback": Case(_agent_feedback, ("feedback",)),
}
AGENT_READS = {"start_task": "sets the task in progress, in the wrapper only"}


def test_agent_with_memory_methods_are_all_classified() -> None:
    public = public_methods(AgentWithMemory)
    assert public == set(AGENT_WRITES) | set(AGENT_READS), (
        f"classify AgentWithMemory's {sorted(public - set(AGENT_WRITES) - set(AGENT_READS))} "
        f"(and drop {sorted(set(AGENT_WRITES) | set(AGENT_READS) - public)})"
    )


@pytest.mark.parametrize("method", sorted(AGENT_WRITES))
def test_agent_with_memory_stores_and_returns_no_secret(world: World, method: str) -> None:
    case = AGENT_WRITES[method]
    returned = case.run(world)
    assert_clean(world.store, world.db, case.shown(returned), f"AgentWithMemory.{method}")
    assert_events(world.store, world.seen, case.events, f"AgentWithMemory.{method}")


# ---- REST -----------------------------------------------------------------------------------------------
@dataclass
class RestWorld:
    """The REST app over its own SQLite file (originals sealed), with keys of tenant acme and one planted
    memory recorded by the agent key."""

    client: TestClient
    store: SQLiteStore
    db: Path
    clock: Clock
    keys: dict[str, str]
    note: dict[str, Any] = field(default_factory=dict)
    seen: int = 0

    def send(self, method: str, url: str, body: Any = None, who: str = "agent") -> Any:
        headers = {"Authorization": f"Bearer {self.keys[who]}"}
        r = self.client.request(method, url, json=body, headers=headers)
        assert r.is_success, f"{method} {url}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def mark(self) -> None:
        self.seen = last_seq(self.store)


@pytest.fixture
def rest(tmp_path: Path) -> Iterator[RestWorld]:
    db = tmp_path / "server.db"
    store = SQLiteStore(db)
    clock = Clock()
    app = create_app(
        store,
        embedder=None,
        settings=ServerSettings(rate_per_s=0),
        harness_options={**policy(keep_original=True), "clock": clock},
    )
    ring = app.state.service.keyring
    keys = {"admin": ring.create("acme", "admin", "ops")[1], "agent": ring.create("acme", "agent", "bot")[1]}
    with TestClient(app) as client:
        w = RestWorld(client, store, db, clock, keys)
        w.note = w.send("POST", "/v1/memories", {"content": PLANTED, "session_id": SESSION, "task_id": TASK})
        w.mark()
        yield w
    store.close()


@dataclass(frozen=True)
class RestCase:
    """One write route: ``request`` prepares what it must (then ``world.mark()``) and gives the URL and
    the JSON body; ``who``: the key's role; ``events``: the kinds the request logs, exactly."""

    request: Callable[[RestWorld], tuple[str, Any]]
    events: tuple[str, ...]
    who: str = "agent"


def _note_url(suffix: str = "") -> Callable[[RestWorld], tuple[str, Any]]:
    return lambda w: (f"/v1/memories/{w.note['id']}{suffix}", None)


def _dashboard(action: str, body: Any = None) -> Callable[[RestWorld], tuple[str, Any]]:
    def request(w: RestWorld) -> tuple[str, Any]:
        if action == "unpin":
            w.send("POST", f"/dashboard/api/memories/{w.note['id']}/pin")
            w.mark()
        return f"/dashboard/api/memories/{w.note['id']}/{action}", body

    return request


def _rest_unpin(w: RestWorld) -> tuple[str, Any]:
    w.send("POST", f"/v1/memories/{w.note['id']}/pin")
    w.mark()
    return f"/v1/memories/{w.note['id']}/unpin", None


def _rest_decompress(w: RestWorld) -> tuple[str, Any]:
    w.send("POST", f"/v1/memories/{w.note['id']}/compress")
    w.mark()
    return f"/v1/memories/{w.note['id']}/decompress", None


def _rest_rollback(w: RestWorld) -> tuple[str, Any]:
    checkpoint = w.send("POST", f"/v1/sessions/{SESSION}/checkpoints", {"name": "before"})
    w.send("POST", "/v1/memories", {"content": f"later: {PLANTED}", "session_id": SESSION})
    w.mark()
    return f"/v1/checkpoints/{checkpoint['id']}/rollback", None


def _rest_collapse(w: RestWorld) -> tuple[str, Any]:
    for step in ("looked the customer up", "found the charge", "refunded it"):
        body = {"content": f"{step}: {PLANTED}", "task_id": "t9", "state": "intermediate"}
        w.send("POST", "/v1/memories", body)
    w.mark()
    return "/v1/tasks/t9/collapse", None


def _rest_import(w: RestWorld) -> tuple[str, Any]:
    memory = build_memory({"content": PLANTED, "tenant": "acme", "created_at": w.clock()})  # the server's now
    return "/v1/memories/import", {"memories": [memory.model_dump(mode="json")]}


def _rest_tick(w: RestWorld) -> tuple[str, Any]:
    w.clock.advance(days=3)  # values drift (refresh) and the idle session pages out (demote)
    return "/v1/tick", None


def _rest_revoke(w: RestWorld) -> tuple[str, Any]:
    created = w.send("POST", "/v1/keys", {"role": "agent", "name": "temp"}, who="admin")
    w.mark()
    return f"/v1/keys/{created['key_id']}", None


def _rest_keep_side(w: RestWorld) -> tuple[str, Any]:
    note, keep = open_conflict(w.client.app.state.service.harness_for("acme"))  # type: ignore[attr-defined]
    w.mark()
    return f"/dashboard/api/conflicts/{note}/keep", {"keep": keep}


REST_WRITES: dict[str, RestCase] = {
    "POST /v1/memories": RestCase(lambda w: ("/v1/memories", {"content": PLANTED}), ("add",)),
    "POST /v1/memories/import": RestCase(_rest_import, ("import",), who="admin"),
    "PATCH /v1/memories/{memory_id}": RestCase(
        lambda w: (f"/v1/memories/{w.note['id']}", {"content": f"{PLANTED} (corrected)"}), ("update",)
    ),
    "DELETE /v1/memories/{memory_id}": RestCase(_note_url(), ("forget",)),
    "POST /v1/memories/{memory_id}/pin": RestCase(_note_url("/pin"), ("pin",)),
    "POST /v1/memories/{memory_id}/unpin": RestCase(_rest_unpin, ("unpin",)),
    "POST /v1/memories/{memory_id}/feedback": RestCase(
        lambda w: (f"/v1/memories/{w.note['id']}/feedback", {"delta": 1}), ("feedback",)
    ),
    "POST /v1/memories/{memory_id}/compress": RestCase(_note_url("/compress"), ("compress",)),
    "POST /v1/memories/{memory_id}/decompress": RestCase(_rest_decompress, ("decompress",)),
    "POST /v1/recall": RestCase(lambda w: ("/v1/recall", {"query": PLANTED}), ("retrieve",)),
    "POST /v1/context": RestCase(
        lambda w: ("/v1/context", {"query": PLANTED, "session_id": SESSION}), ("context",)
    ),
    "POST /v1/sessions/{session_id:path}/checkpoints": RestCase(
        lambda w: (f"/v1/sessions/{SESSION}/checkpoints", {"name": SHORT_PLANTED}), ("checkpoint",)
    ),
    "POST /v1/checkpoints/{checkpoint_id}/rollback": RestCase(_rest_rollback, ("rollback",)),
    "POST /v1/sessions/{session_id:path}/start": RestCase(
        lambda w: ("/v1/sessions/s2/start", {"task": PLANTED}), ("preload",)
    ),
    "POST /v1/tasks/{task_id:path}/collapse": RestCase(_rest_collapse, ("add", "collapse")),
    "POST /v1/tick": RestCase(_rest_tick, ("refresh", "demote")),
    "POST /v1/keys": RestCase(
        lambda w: ("/v1/keys", {"role": "agent", "name": "ci"}), ("api_key_created",), "admin"
    ),
    "DELETE /v1/keys/{key_id}": RestCase(_rest_revoke, ("api_key_revoked",), "admin"),
    "POST /dashboard/api/memories/{memory_id}/pin": RestCase(
        _dashboard("pin"), ("pin", "scoring_weights", "manual")
    ),
    "POST /dashboard/api/memories/{memory_id}/unpin": RestCase(_dashboard("unpin"), ("unpin", "manual")),
    "POST /dashboard/api/memories/{memory_id}/archive": RestCase(
        _dashboard("archive"), ("archive", "scoring_weights", "manual")
    ),
    "POST /dashboard/api/memories/{memory_id}/value": RestCase(
        _dashboard("value", {"value": 0.2}), ("scoring_weights", "manual")
    ),
    "POST /dashboard/api/memories/{memory_id}/annotate": RestCase(
        _dashboard("annotate", {"text": PLANTED}), ("update", "manual")
    ),
    "POST /dashboard/api/memories/{memory_id}/tier": RestCase(
        _dashboard("tier", {"tier": "archive"}), ("archive", "manual")
    ),
    "POST /dashboard/api/memories": RestCase(
        lambda w: ("/dashboard/api/memories", {"content": PLANTED}), ("add",)
    ),
    "POST /dashboard/api/memories/{memory_id}/revise": RestCase(
        _dashboard("revise", {"content": PLANTED}), ("revise",)
    ),
    "POST /dashboard/api/memories/{memory_id}/forget": RestCase(_dashboard("forget"), ("forget",)),
    "POST /dashboard/api/review/{memory_id}/approve": RestCase(
        lambda w: (f"/dashboard/api/review/{w.note['id']}/approve", {"reason": PLANTED}),
        ("update", "review.approved"),
    ),
    "POST /dashboard/api/conflicts/{conflict_id}/keep": RestCase(
        _rest_keep_side,
        ("update", "review.rejected", "update", "review.resolved", "update", "review.approved"),
        "admin",
    ),
    "POST /dashboard/api/review/{memory_id}/reject": RestCase(
        lambda w: (f"/dashboard/api/review/{w.note['id']}/reject", {"reason": PLANTED}),
        ("update", "review.rejected"),
    ),
}
#: POST/PUT/PATCH/DELETE routes that write nothing (none today)
REST_READS: dict[str, str] = {}
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def rest_routes(app: Any) -> set[str]:
    """``"METHOD /path"`` of every route of ``app`` that may change something."""
    return {
        f"{method} {route.path}"
        for route in iter_route_contexts(app.routes)
        for method in (route.methods or set()) & WRITE_METHODS
    }


def test_rest_routes_are_all_classified(rest: RestWorld) -> None:
    routes = rest_routes(rest.client.app)
    classified = set(REST_WRITES) | set(REST_READS)
    assert routes - classified == set(), (
        f"the REST app has write routes no table classifies: {sorted(routes - classified)}; add each to "
        "REST_WRITES (a request with planted text, and the events it logs) or to REST_READS"
    )
    assert classified - routes == set(), (
        f"the tables list routes the app lacks: {sorted(classified - routes)}"
    )


@pytest.mark.parametrize("route", sorted(REST_WRITES))
def test_rest_write_stores_and_returns_no_secret(rest: RestWorld, route: str) -> None:
    case = REST_WRITES[route]
    method = route.split(" ", 1)[0]
    url, body = case.request(rest)
    returned = rest.send(method, url, body, case.who)
    assert_clean(rest.store, rest.db, returned, route)
    assert_events(rest.store, rest.seen, case.events, route)


def test_rest_original_is_for_admins_only(rest: RestWorld) -> None:
    url = f"/v1/memories/{rest.note['id']}/original"
    refused = rest.client.get(url, headers={"Authorization": f"Bearer {rest.keys['agent']}"})
    assert refused.status_code == 403 and not telltales_in(refused.text)
    assert rest.send("GET", url, who="admin")["content"] == PLANTED
    assert_events(rest.store, rest.seen, ("reveal",), "GET original")


# ---- MCP ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class McpCase:
    """One MCP tool: ``arguments`` prepares what it must (then ``world.mark()``) and gives the call's
    arguments; ``events``: the kinds the call logs, exactly."""

    arguments: Callable[[World], dict[str, Any]]
    events: tuple[str, ...]


def _mcp_rollback(w: World) -> dict[str, Any]:
    checkpoint = w.harness.checkpoint(SESSION, "before")
    w.harness.record(f"later: {PLANTED}", session_id=SESSION, task_id=TASK, agent_id=AGENT)
    w.mark()
    return {"checkpoint_id": checkpoint}


def _mcp_summarize(w: World) -> dict[str, Any]:
    _intermediate_steps(w, TASK, AGENT)  # the bound agent's own steps: its tools summarize no one else's
    w.mark()
    return {}


MCP_WRITES: dict[str, McpCase] = {
    "record_memory": McpCase(lambda w: {"content": PLANTED, "kind": "knowledge"}, ("add",)),
    "recall_memory": McpCase(lambda w: {"query": PLANTED}, ("retrieve",)),
    "list_memories": McpCase(lambda w: {}, ()),
    "get_memory": McpCase(lambda w: {"memory_id": w.note.id}, ()),
    "update_memory": McpCase(lambda w: {"memory_id": w.note.id, "content": PLANTED}, ("update",)),
    "build_context": McpCase(lambda w: {"query": PLANTED}, ("context",)),
    "checkpoint": McpCase(lambda w: {"name": SHORT_PLANTED}, ("checkpoint",)),
    "rollback": McpCase(_mcp_rollback, ("rollback",)),
    "pin_memory": McpCase(lambda w: {"memory_id": w.note.id}, ("pin",)),
    "forget_memory": McpCase(lambda w: {"memory_id": w.note.id}, ("forget",)),
    "summarize_task": McpCase(_mcp_summarize, ("add", "collapse")),
}
MCP_READS: dict[str, str] = {}


@pytest.fixture
def mcp_world(tmp_path: Path) -> Iterator[World]:
    w = open_world(tmp_path, keep_original=False)  # the MCP server's harness: redaction without originals
    yield w
    w.harness.close()


def _tools(w: World) -> AgentTools:
    return AgentTools(w.harness, session_id=SESSION, task_id=TASK, agent_id=AGENT)


def test_mcp_tools_are_all_classified(mcp_world: World) -> None:
    async def listed() -> set[str]:
        async with Client(build_server(_tools(mcp_world))) as client:
            return {t.name for t in (await client.list_tools()).tools}

    tools = asyncio.run(listed())
    classified = set(MCP_WRITES) | set(MCP_READS)
    assert tools == classified, (
        f"classify the MCP tools {sorted(tools - classified)} in MCP_WRITES or MCP_READS "
        f"(and drop {sorted(classified - tools)})"
    )


@pytest.mark.parametrize("tool", sorted(MCP_WRITES))
def test_mcp_tool_stores_and_returns_no_secret(mcp_world: World, tool: str) -> None:
    case = MCP_WRITES[tool]
    arguments = case.arguments(mcp_world)

    async def call() -> Any:
        async with Client(build_server(_tools(mcp_world))) as client:
            return await client.call_tool(tool, arguments)

    result = asyncio.run(call())
    assert result.is_error is False, result
    assert_clean(mcp_world.store, mcp_world.db, result, f"MCP {tool}")
    assert_events(mcp_world.store, mcp_world.seen, case.events, f"MCP {tool}")


# ---- the LangGraph store --------------------------------------------------------------------------------
NAMESPACE = ("users", "dana")


def _lg(w: World) -> ClawVMStore:
    return ClawVMStore(w.harness)


def _lg_overwrite(w: World) -> Any:
    _lg(w).put(NAMESPACE, "refund", {"note": "first draft"})
    w.mark()
    return _lg(w).put(NAMESPACE, "refund", {"note": PLANTED, "card": CARD})


def _lg_delete(w: World) -> Any:
    _lg(w).put(NAMESPACE, "refund", {"note": PLANTED})
    w.mark()
    return _lg(w).delete(NAMESPACE, "refund")


def _lg_adelete(w: World) -> Any:
    _lg(w).put(NAMESPACE, "refund", {"note": PLANTED})
    w.mark()
    return asyncio.run(_lg(w).adelete(NAMESPACE, "refund"))


def _lg_sweep(w: World) -> Any:
    _lg(w).put(NAMESPACE, "refund", {"note": PLANTED}, ttl=0)  # due at once
    w.mark()
    return _lg(w).sweep_ttl()


def _lg_sweeper(w: World) -> Any:
    _lg(w).put(NAMESPACE, "refund", {"note": PLANTED}, ttl=0)
    w.mark()
    store = _lg(w)
    store.start_ttl_sweeper(sweep_interval_minutes=0.0005)  # every 30 ms
    deadline = time.monotonic() + 5
    while w.harness.count(tags=["langgraph"], status="any") and time.monotonic() < deadline:
        time.sleep(0.01)
    return store.stop_ttl_sweeper(timeout=5)


PUT_AND_GET = [PutOp(NAMESPACE, "refund", {"note": PLANTED, "contact": EMAIL}), GetOp(NAMESPACE, "refund")]

LANGGRAPH_WRITES: dict[str, tuple[Case, ...]] = {
    "put": (
        Case(lambda w: _lg(w).put(NAMESPACE, "refund", {"note": PLANTED, "contact": EMAIL}), ("add",), "new"),
        Case(_lg_overwrite, ("update",), "overwrite"),
    ),
    "aput": (Case(lambda w: asyncio.run(_lg(w).aput(NAMESPACE, "refund", {"note": PLANTED})), ("add",)),),
    "delete": (Case(_lg_delete, ("forget",)),),
    "adelete": (Case(_lg_adelete, ("forget",)),),
    "batch": (Case(lambda w: _lg(w).batch(PUT_AND_GET), ("add",), "put and get"),),
    "abatch": (Case(lambda w: asyncio.run(_lg(w).abatch(PUT_AND_GET)), ("add",), "put and get"),),
    "sweep_ttl": (Case(_lg_sweep, ("forget",), "an expired item"),),
    "start_ttl_sweeper": (Case(_lg_sweeper, ("forget",), "until it swept an expired item"),),
    "stop_ttl_sweeper": (Case(lambda w: _lg(w).stop_ttl_sweeper(), (), "none running"),),
    # updates only items written before namespace tags existed; a store written now has none
    "tag_namespaces": (Case(lambda w: _lg(w).tag_namespaces(), (), "nothing to tag"),),
}
LANGGRAPH_READS = {
    name: "reads items (a query recall is untracked); reading an item with a TTL refreshes its expiry"
    for name in ("get", "aget", "search", "asearch", "list_namespaces", "alist_namespaces")
}


def test_langgraph_store_methods_are_all_classified() -> None:
    public = public_methods(ClawVMStore)
    classified = set(LANGGRAPH_WRITES) | set(LANGGRAPH_READS)
    assert public == classified, (
        f"classify ClawVMStore's {sorted(public - classified)} in LANGGRAPH_WRITES or LANGGRAPH_READS "
        f"(and drop {sorted(classified - public)})"
    )


@pytest.mark.parametrize("case", _cases(LANGGRAPH_WRITES))
def test_langgraph_write_stores_and_returns_no_secret(world: World, case: Case) -> None:
    returned = case.run(world)
    assert_clean(world.store, world.db, case.shown(returned), "this LangGraph write")
    assert_events(world.store, world.seen, case.events, "this LangGraph write")
