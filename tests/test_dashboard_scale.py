"""The dashboard on a 10k-memory store, in a real headless Chromium (Debian's ``chromium``, driven by
Playwright) against a real uvicorn server on loopback: every view's first paint from a cold server start
(printed, not asserted: CI machines vary), then the actions a person takes there (edit a memory, approve a
review item, run a what-if replay), asserting what the page then shows and what the store then holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from browser import chromium
from bulk_events import context_build, demotions
from clawvm import Harness, Memory
from clawvm.server import create_app
from clawvm.store import Event
from clawvm.teams import shared
from engines import engine_of
from loopback import serve_app

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
N_MEMORIES = 10_000
N_SESSIONS = 40
N_BUILDS = 300
BUILD_LINES = 20
BUILD_SESSIONS = 10
VIEWS = [
    "sessions",
    "timeline",
    "heatmap",
    "graph",
    "contexts",
    "influence",
    "metrics",
    "trace",
    "teams",
    "whatif",
]


def _memories() -> list[Memory]:
    """10k memories over 40 sessions in chains of five; every tool result records the latency its text
    states (so the trace's tool time and its steps agree)."""
    out: list[Memory] = []
    for i in range(N_MEMORIES):
        ms = i % 900
        result = i % 2 == 1
        out.append(
            Memory(
                content=f"step {i} of run {i % N_SESSIONS}: Tessera host eu-{i % 7} answered in {ms} ms",
                session_id=f"s{i % N_SESSIONS}",
                kind="tool_result" if result else "observation",
                tool_name="tessera_charge" if result else None,
                cost={"seconds": ms / 1000} if result else {},
                parent_id=out[i - 1].id if i % 5 else None,
                created_at=T0 + timedelta(minutes=i),
                tier="working",
            )
        )
    return out


def _events(memories: list[Memory]) -> list[Event]:
    """One demotion per memory, then 300 context builds over ten sessions (20 of the session's lines
    each): s1 holds 30 of them, what the what-if replay re-runs."""
    events = demotions(memories, T0)
    for b in range(N_BUILDS):
        session = f"s{b % BUILD_SESSIONS}"
        own = [m for m in memories[b % BUILD_SESSIONS :: N_SESSIONS] if m.session_id == session]
        lines = [own[(b * BUILD_LINES + n) % len(own)] for n in range(BUILD_LINES)]
        query = f"Tessera host eu-{b % 7} run 1"
        events.append(context_build(lines, query, session, T0 + timedelta(days=8, minutes=b)))
    return events


@dataclass
class Served:
    base: str
    harness: Harness
    keys: dict[str, str]
    doubtful: Memory  # a team memory waiting in the review queue
    edited: Memory  # the memory the test edits


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    started = time.monotonic()
    db = tmp_path_factory.mktemp("scale") / "scale.db"
    h = Harness.open(f"sqlite:///{db}", embedder=None)
    memories = _memories()
    h.import_memories(memories)
    events = _events(memories)
    for start in range(0, len(events), 2000):
        engine_of(h).append_events(events[start : start + 2000])
    h.grant("billing-team", "coder", read=True, write=True)
    doubtful = shared.record(
        h,
        "Refunds over EUR 500 may skip the idempotency key.",
        agent_id="coder",
        kind="decision",
        team_id="billing-team",
        confidence=0.3,
    )
    built = time.monotonic() - started
    app = create_app(engine_of(h), embedder=None)
    ring = app.state.service.keyring
    keys = {role: ring.create("default", role, f"test {role}")[1] for role in ("agent", "read-only")}
    print(f"\n10k store built in {built:.1f} s")
    try:
        with serve_app(app) as url:
            yield Served(url, h, keys, doubtful, memories[4321])
    finally:
        h.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _page(browser: Any) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    return page, problems


def _wait_view(page: Any, view: str, timeout_ms: int = 60_000) -> None:
    page.wait_for_selector(f'main[data-view="{view}"][data-ready="1"]', timeout=timeout_ms)


def _go(page: Any, fragment: str, view: str) -> None:
    page.evaluate("(f) => { location.hash = f; }", fragment)
    _wait_view(page, view)


def test_every_view_paints_from_a_cold_start_then_edits_approves_and_replays(
    served: Served, browser: Any
) -> None:
    h = served.harness
    page, problems = _page(browser)
    paint: dict[str, float] = {}
    started = time.monotonic()
    page.goto(f"{served.base}/dashboard/#key={served.keys['agent']}")  # the first request the server sees
    _wait_view(page, "sessions")
    paint["sessions"] = (time.monotonic() - started) * 1000
    assert page.locator("#sessions-table tr.session-row").count() >= 15  # a page of the 40 sessions
    for view in VIEWS[1:]:
        started = time.monotonic()
        _go(page, f"#view={view}&session=s1", view)
        paint[view] = (time.monotonic() - started) * 1000
    print("\ncold first paint on 10k memories (ms): " + ", ".join(f"{v} {t:.0f}" for v, t in paint.items()))

    # the trace's tool time is the sum of the durations its results recorded
    _go(page, "#view=trace&session=s1", "trace")
    s1_results = [m for m in h.iter_all(session_id="s1", kind="tool_result")]
    stated = sum(m.cost.seconds for m in s1_results)
    assert stated > 1 and f"tools {stated:.2f} s" in page.inner_text("main")

    # edit a memory like a block: a new revision through the SDK's write path, its diff in the inspector
    target = served.edited
    _go(page, f"#view=sessions&session={target.session_id}&memory={target.id}", "sessions")
    page.wait_for_selector('#inspector[data-ready="1"] #edit-box')
    page.click("#edit-box summary")
    page.fill("#edit-content", target.content.replace("answered in", "timed out after"))
    page.click("#revise-button")
    page.wait_for_function("(old) => MemLens.state.selected !== old", arg=target.id)
    page.wait_for_selector('#inspector[data-ready="1"] #revisions-table .diff-add')
    head = page.evaluate("MemLens.state.selected")
    assert [m.id for m in h.history(head)] == [target.id, head]
    assert "timed out after" in h.get(head).content and "timed out after" in page.inner_text(
        "#revisions-table"
    )

    # approve the review item: it leaves the queue, and the store says approved
    _go(page, "#view=teams", "teams")
    doubtful = served.doubtful.id
    assert page.locator(f'#review-table a[data-id="{doubtful}"]').count() == 1
    page.click(f'.approve-button[data-id="{doubtful}"]')
    page.wait_for_function(
        "(id) => !document.querySelector(`#review-table a[data-id='${id}']`)", arg=doubtful, timeout=30_000
    )
    assert h.get(doubtful).metadata["review"]["status"] == "approved"

    # a what-if replay of s1's 30 builds (over the 10k memories) with every build cut to 200 tokens
    before = h.count(status="any")
    _go(page, "#view=whatif&session=s1", "whatif")
    page.fill("#whatif-budget", "200")
    page.dispatch_event("#whatif-budget", "change")
    started = time.monotonic()
    page.click("#whatif-run")
    page.wait_for_selector("#whatif-summary", timeout=120_000)
    replay_ms = (time.monotonic() - started) * 1000
    print(f"what-if replay of {N_BUILDS // BUILD_SESSIONS} builds on 10k memories: {replay_ms:.0f} ms")
    cells = {
        tr.locator("td").nth(0).inner_text(): [tr.locator("td").nth(i).inner_text() for i in (1, 2)]
        for tr in page.locator("#whatif-summary tr").all()[1:]
    }
    assert int(cells["prompt tokens"][1]) < int(cells["prompt tokens"][0])
    shown = page.locator("#whatif-builds tr").count() - 1  # the header, then a row per build (a page of them)
    assert 0 < shown <= N_BUILDS // BUILD_SESSIONS
    assert h.count(status="any") == before  # the replay wrote nothing
    assert [p for p in problems if "status of 404" not in p] == []
    page.close()
