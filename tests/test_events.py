"""Following the event log live (:class:`clawvm.store.eventlog.EventTail`) on every engine: every new event
once and
in order, heartbeats while quiet, one tenant's view only, ``stop()`` and ``max_s``; on PostgreSQL a write
through another connection wakes a follower that never polls (LISTEN/NOTIFY)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

import pg_server
from clawvm.core.errors import StoreError, ValidationError
from clawvm.store import Event, MemoryStore, Store, store_from_url
from clawvm.store.eventlog import EventTail, event_pages, iter_events
from clawvm.store.tenant import TenantStore

T = TypeVar("T")
NEVER = 3600.0  # an interval that no test waits out: only events, notifications or stop() move things on


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; a bound on a broken wake-up, never a timing assertion (each test ends in ~1 s)."""
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_follower_gets_every_new_event_once_in_order_and_heartbeats_while_quiet(engine: Store) -> None:
    engine.append_events([Event("a"), Event("b"), Event("c")])
    tail = EventTail(engine, poll_s=0.02, batch=2)

    async def follow() -> tuple[list[Event], int]:
        got: list[Event] = []
        beats = 0
        async with aclosing(tail.follow(engine.read_events, 0, heartbeat_s=0.05)) as batches:
            async for batch in batches:
                assert len(batch) <= 2
                got.extend(batch)
                beats += not batch
                if not batch and len(got) == 3:  # the backlog is read; another writer appends two more
                    await asyncio.to_thread(engine.append_events, [Event("d"), Event("e")])
                if not batch and len(got) == 5:
                    break
        return got, beats

    got, beats = run(follow())
    assert [e.kind for e in got] == ["a", "b", "c", "d", "e"]
    seqs = [e.seq or 0 for e in got]
    assert seqs == sorted(set(seqs))
    assert beats >= 2 and tail.following == 0  # closed: unsubscribed and forgotten


def test_a_follower_starts_after_the_seq_it_is_given(engine: Store) -> None:
    first, *_ = engine.append_events([Event("old"), Event("older")])
    engine.append_event(Event("new"))
    tail = EventTail(engine, poll_s=0.02)

    async def follow() -> list[str]:
        async with aclosing(tail.follow(engine.read_events, first + 1, heartbeat_s=NEVER)) as batches:
            return [e.kind for e in await anext(batches)]

    assert run(follow()) == ["new"]


def test_a_follower_of_a_tenant_view_never_sees_another_tenants_events(engine: Store) -> None:
    engine.append_events([Event("theirs", tenant="globex"), Event("mine", tenant="acme")])
    engine.append_events([Event("theirs", tenant="globex"), Event("end", tenant="acme")])
    view = TenantStore(engine, "acme")
    tail = EventTail(engine, poll_s=0.02)

    async def follow() -> list[Event]:
        got: list[Event] = []
        async with aclosing(tail.follow(view.read_events, 0, heartbeat_s=NEVER)) as batches:
            async for batch in batches:
                got.extend(batch)
                if got and got[-1].kind == "end":
                    return got
        return got

    assert [(e.tenant, e.kind) for e in run(follow())] == [("acme", "mine"), ("acme", "end")]


def test_stop_ends_every_follower_at_once_and_any_started_later(engine: Store) -> None:
    tail = EventTail(engine, poll_s=NEVER, safety_poll_s=None)

    async def follow() -> list[list[Event]]:
        return [b async for b in tail.follow(engine.read_events, 0, heartbeat_s=NEVER)]

    async def scenario() -> None:
        followers = [asyncio.create_task(follow()) for _ in range(2)]
        while tail.following < 2:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(tail.stop)  # from another thread, as a server's shutdown does
        assert await asyncio.gather(*followers) == [[], []]
        assert await follow() == [] and tail.following == 0

    run(scenario())


def test_max_s_ends_a_quiet_follower(engine: Store) -> None:
    tail = EventTail(engine, poll_s=0.02)

    async def follow() -> list[list[Event]]:
        return [b async for b in tail.follow(engine.read_events, 0, heartbeat_s=NEVER, max_s=0.05)]

    assert run(follow()) == []


def test_bad_intervals_are_validation_errors(engine: Store) -> None:
    with pytest.raises(ValidationError):
        EventTail(engine, poll_s=0)
    with pytest.raises(ValidationError):
        EventTail(engine, safety_poll_s=-1)

    async def follow() -> None:
        async for _ in EventTail(engine).follow(engine.read_events, heartbeat_s=0):
            pass

    with pytest.raises(ValidationError):
        run(follow())


@pytest.mark.engines("postgres")
def test_a_write_through_another_connection_wakes_a_follower_that_never_polls(
    engine_name: str, tmp_path: Path
) -> None:
    url = pg_server.store_url(tmp_path, "feed")
    reader, writer = store_from_url(url), store_from_url(url)
    reader.setup()
    writer.setup()
    try:
        writer.append_event(Event("before"))
        tail = EventTail(reader, poll_s=NEVER, safety_poll_s=None)  # a notification is the only wake-up
        assert tail.pushed

        async def follow() -> list[str]:
            kinds: list[str] = []
            async with aclosing(tail.follow(reader.read_events, 0, heartbeat_s=NEVER)) as batches:
                async for batch in batches:  # the first batch comes after the subscription is in place
                    kinds.extend(e.kind for e in batch)
                    if kinds == ["before"]:
                        await asyncio.to_thread(writer.append_event, Event("pushed"))
                    if "pushed" in kinds:
                        return kinds
            return kinds

        assert run(follow()) == ["before", "pushed"]
    finally:
        writer.close()
        reader.close()


def test_event_pages_read_every_event_in_order_a_page_at_a_time(engine: Store) -> None:
    seqs = engine.append_events([Event("note", data={"n": n}) for n in range(7)])
    pages = list(event_pages(engine, batch=3))
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [e.seq for p in pages for e in p] == seqs
    assert [e.data["n"] for e in iter_events(engine, after_seq=seqs[3], batch=2)] == [4, 5, 6]
    assert list(event_pages(engine, after_seq=seqs[-1])) == []


class _SeqlessStore(MemoryStore):
    """An engine that loses the sequence numbers of the events it returns."""

    def read_events(self, after_seq: int = 0, limit: int = 1000, memory_id: str | None = None) -> list[Event]:
        return [replace(e, seq=None) for e in super().read_events(after_seq, limit, memory_id)]


def test_an_event_without_a_seq_is_a_store_error_not_an_endless_read() -> None:
    store = _SeqlessStore()
    store.setup()
    store.append_events([Event("note") for _ in range(4)])
    with pytest.raises(StoreError, match="without a sequence number"):
        list(iter_events(store, batch=2))
