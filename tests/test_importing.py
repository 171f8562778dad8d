"""Imports pass the checks of a write (:mod:`clawvm.harness.importing`): a ``created_at`` ahead of the
clock, a parent chain that loops, and a memory that expired before it was made are judged as record()
judges them, through the SDK, the REST API and ``clawvm import``; whatever is refused, nothing of the
batch is written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from clawvm import Harness, Memory, Status, Tier, ValidationError
from clawvm.cli import main
from clawvm.core.errors import StateConflictError
from clawvm.core.model import build_memory
from clawvm.server import ServerSettings, create_app
from clawvm.store import SQLiteStore

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
FAR_AHEAD = datetime(2099, 1, 1, tzinfo=UTC)


def open_harness() -> Harness:
    return Harness.open("memory://", embedder=None, clock=lambda: T0)


def memory(content: str, **fields: Any) -> Memory:
    return build_memory({"content": content, "created_at": T0 - timedelta(hours=1), **fields})


def looped(*memories: Memory) -> list[Memory]:
    """``memories``, each the parent of the one before it and the first the parent of the last."""
    ids = [m.id for m in memories]
    return [m.model_copy(update={"parent_id": ids[(i + 1) % len(ids)]}) for i, m in enumerate(memories)]


def stored_ids(h: Harness) -> set[str]:
    return {m.id for m in h.store.iter_all()}


# ---- the SDK --------------------------------------------------------------------------------------------
def test_an_import_refuses_a_created_at_record_refuses_and_writes_nothing() -> None:
    """2099-01-01 was imported, and topped every newest-first listing and the context for good."""
    with open_harness() as h:
        with pytest.raises(ValidationError) as by_record:
            h.record("from the future", created_at=FAR_AHEAD)
        batch = [memory("an honest note"), memory("from the future", created_at=FAR_AHEAD)]
        with pytest.raises(StateConflictError) as refused:  # the clock's state: taken once it has passed
            h.import_memories(batch)
        assert refused.value.field == "memories.1.created_at"
        assert (refused.value.problem, refused.value.fix) == (by_record.value.problem, by_record.value.fix)
        with pytest.raises(StateConflictError, match=r"memories\.0\.created_at"):
            h.import_memories([batch[1]], restore=True)  # `clawvm import` restores: refused all the same
        assert stored_ids(h) == set()
        # within the day of clock skew record() takes, as record() takes it
        assert h.import_memories([memory("a clock a few hours ahead", created_at=T0 + timedelta(hours=5))])


def test_an_import_dates_a_memory_given_no_created_at_by_the_harness_clock() -> None:
    """As record() dates a new memory: the model's default (the machine's clock) is not the harness's, and
    one behind it (a replay, a test's) refused the import as made in its future."""
    with open_harness() as h:
        undated = build_memory({"content": "when was i made?"})
        assert h.import_memories([undated]) == 1
        assert h.store.get_many([undated.id])[undated.id].created_at == T0


def test_an_import_refuses_a_memory_that_is_its_own_parent() -> None:
    """Stored, its run trace walked up from it for ever (record() refuses it; docs/memory.md: a 422)."""
    with open_harness() as h:
        own = memory("i follow from myself")
        own = own.model_copy(update={"parent_id": own.id})
        with pytest.raises(ValidationError) as refused:
            h.import_memories([memory("an honest note"), own])
        assert type(refused.value) is ValidationError  # the file's fault, not the store's state
        assert refused.value.field == "memories.1.parent_id" and "own id" in refused.value.problem
        assert "leave parent_id out" in refused.value.fix
        assert stored_ids(h) == set()


def test_an_import_refuses_a_parent_loop_within_the_batch() -> None:
    """``[A(parent=B), B(parent=A)]`` was stored: a loop no write can make."""
    with open_harness() as h:
        a, b, c = looped(memory("step a"), memory("step b"), memory("step c"))
        with pytest.raises(ValidationError) as refused:
            h.import_memories([memory("an honest note"), c, a, b])
        assert type(refused.value) is ValidationError
        assert refused.value.field == "memories.1.parent_id"  # the loop's first memory in the file
        assert f"{c.id} -> {a.id} -> {b.id} -> {c.id}" in refused.value.problem
        assert "leave parent_id out" in refused.value.fix
        assert stored_ids(h) == set()
        # a chain that ends at a root imports
        root = a.model_copy(update={"parent_id": None})
        after_root = b.model_copy(update={"parent_id": a.id})
        assert h.import_memories([root, after_root, c.model_copy(update={"parent_id": b.id})]) == 3


def test_an_import_refuses_a_parent_loop_through_stored_memories() -> None:
    """A restored memory whose parent is not stored yet (a partial backup), then that parent imported as
    its child: a loop of the import and the store (the store's state: a 409, as update() gives)."""
    with open_harness() as h:
        parent, child = looped(memory("the call"), memory("its result"))
        h.import_memories([parent], restore=True)  # names child as its parent: dangling, restored as it was
        with pytest.raises(StateConflictError) as refused:
            h.import_memories([memory("an honest note"), child])
        assert refused.value.field == "memories.1.parent_id"
        assert f"{child.id} -> {parent.id} -> {child.id}" in refused.value.problem
        assert stored_ids(h) == {parent.id}


def test_an_import_stores_a_memory_that_expired_before_it_was_made_as_record_does() -> None:
    """``expires_at`` before ``created_at`` (and past): record() stores such a memory expired, in the
    archive, unpinned; an import stored it active and pinned in the working tier, holding its session's
    pinned budget until a sweep."""
    fields: dict[str, Any] = {
        "created_at": T0 - timedelta(days=1),
        "expires_at": T0 - timedelta(days=2),
        "session_id": "s1",
        "tier": "working",
        "pinned": True,
    }
    with open_harness() as h:
        recorded = h.record("a one-hour token", **fields)
        imported = memory("a one-hour token", **fields)
        raw = memory("its text before compression", tier="archive", status="archived")
        raw = raw.model_copy(update={"metadata": {"raw_of": imported.id}})
        assert h.import_memories([imported, raw]) == 2
        stored = h.store.get_many([imported.id, raw.id])
        as_stored = stored[imported.id]
        assert (as_stored.status, as_stored.tier, as_stored.pinned) == (
            recorded.status,
            recorded.tier,
            recorded.pinned,
        )
        assert (as_stored.status, as_stored.tier, as_stored.pinned) == (Status.EXPIRED, Tier.ARCHIVE, False)
        assert stored[raw.id].status is Status.EXPIRED  # its earlier text expires with it, as tick() does


# ---- the REST API ---------------------------------------------------------------------------------------
@pytest.fixture
def rest(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    store = SQLiteStore(tmp_path / "server.db")
    app = create_app(store, embedder=None, settings=ServerSettings(rate_per_s=0))
    admin = {"Authorization": f"Bearer {app.state.service.keyring.create('acme', 'admin', 'ops')[1]}"}
    with TestClient(app) as client:
        yield client, admin
    store.close()


def test_a_rest_import_refuses_a_future_created_at_and_a_parent_loop(
    rest: tuple[TestClient, dict[str, str]],
) -> None:
    client, admin = rest
    honest = {"content": "an honest note", "created_at": "2026-01-01T00:00:00Z"}
    future = {"content": "from the future", "created_at": "2099-01-01T00:00:00Z"}
    a, b = (json.loads(m.to_json()) for m in looped(memory("step a"), memory("step b")))
    for batch, field, status in (
        # a date after the server's clock is its state (taken later), not a malformed body: 409
        ([honest, future], "memories.1.created_at", 409),
        ([honest, a, b], "memories.1.parent_id", 422),
    ):
        r = client.post("/v1/memories/import", json={"memories": batch}, headers=admin)
        assert r.status_code == status, r.text
        assert r.json()["error"]["field"] == field
    listed = client.get("/v1/memories", headers=admin)
    assert listed.status_code == 200 and listed.json() == []  # nothing of either batch written


# ---- clawvm import --------------------------------------------------------------------------------------
def test_clawvm_import_refuses_a_future_created_at_naming_its_line(tmp_path: Path) -> None:
    db, dump = tmp_path / "h.db", tmp_path / "dump.jsonl"
    lines = [memory("an honest note"), memory("from the future", created_at=FAR_AHEAD)]
    dump.write_text("".join(m.to_json() + "\n" for m in lines))
    result = CliRunner().invoke(main, ["--db", str(db), "--no-embed", "import", str(dump)])
    assert result.exit_code == 2, result.output
    assert f"{dump}:2: created_at" in result.output and "2099-01-01" in result.output
    with Harness.open(db, embedder=None) as h:
        assert stored_ids(h) == set()
