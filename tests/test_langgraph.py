"""The LangGraph store (``clawvm.integrations.langgraph``), against the real langgraph library.

LangGraph's own store behaviours (the cases its test suite runs on ``InMemoryStore``) are re-written here
and run against the adapter, beside what only a shared, persistent store must do: one item per key under
concurrent writers (threads, a compiled graph's parallel branches, processes on one SQLite file), atomic
batches, TTLs on ClawVM's ``expires_at`` and scores that mean the same for every query.
"""

from __future__ import annotations

import asyncio
import operator
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.embeddings import Embeddings
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    PutOp,
    SearchOp,
    get_text_at_path,
)
from langgraph.store.memory import InMemoryStore

import clawvm
from clawvm import Harness, Kind, ValidationError
from clawvm.integrations import langgraph as langgraph_adapter
from clawvm.integrations.langgraph import MAX_NAMESPACE_DEPTH, TAG, ClawVMStore, item_id
from engines import harness_target

SRC = Path(__file__).resolve().parents[1] / "src"


class Clock:
    """A harness clock the test moves by hand (TTLs without sleeping)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def mem_harness(embedder: clawvm.MiniLMEmbedder, clock: Clock) -> Iterator[Harness]:
    """An in-process harness with the shared model and a hand-moved clock."""
    with Harness.open("memory://", embedder=embedder, clock=clock) as h:
        yield h


def items_of(h: Harness, namespace: tuple[str, ...] | None = None) -> list[clawvm.Memory]:
    """Every LangGraph memory of the store (of one namespace), in any state: what uniqueness is about."""
    tags = [TAG] if namespace is None else [langgraph_adapter._ns_tag(namespace)]
    return list(h.iter_all(tags=tags, status="any"))


class WordEmbeddings(Embeddings):
    """A deterministic bag-of-words embedding model (LangChain's ``Embeddings``): each word's hash picks a
    dimension. Given as ``IndexConfig.embed`` to prove the store embeds with the configured model."""

    def __init__(self, dims: int = 384) -> None:
        self.dims = dims

    def _one(self, text: str) -> list[float]:
        v = np.zeros(self.dims, dtype=np.float32)
        for word in text.lower().replace('"', " ").replace(":", " ").replace("{", " ").split():
            v[sum(word.encode()) * 31 % self.dims] += 1.0
        return v.tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)


# ---- LangGraph's API over every engine ------------------------------------------------------------------
def test_langgraph_store_through_langgraphs_api(harness: Harness) -> None:
    store = ClawVMStore(harness)
    store.put(("users", "alice", "prefs"), "food", {"likes": "pizza", "spice": 3})
    store.put(("users", "alice", "prefs"), "drink", {"likes": "tea", "spice": 0})
    store.put(("users", "bob", "prefs"), "food", {"likes": "sushi", "spice": 5})
    store.put(("docs",), "runbook", {"text": "restart the payments worker when the queue backs up"})
    item = store.get(("users", "alice", "prefs"), "food")
    assert item is not None and item.value == {"likes": "pizza", "spice": 3} and item.key == "food"
    assert item.namespace == ("users", "alice", "prefs")
    assert store.get(("users", "alice"), "food") is None  # a namespace is exact for get
    # overwrite: same memory, new version, updated_at moves, created_at stays
    memory_id = item_id(harness.tenant, ("users", "alice", "prefs"), "food")
    store.put(("users", "alice", "prefs"), "food", {"likes": "pasta", "spice": 2})
    again = store.get(("users", "alice", "prefs"), "food")
    assert again is not None and again.value["likes"] == "pasta" and again.created_at == item.created_at
    assert again.updated_at >= item.updated_at and harness.count(tags=["langgraph"]) == 4
    assert harness.get(memory_id).kind is Kind.KNOWLEDGE and harness.get(memory_id).version == 2
    # search: namespace prefix as scope, filters, pagination, natural-language query
    keys = lambda items: sorted((i.namespace[1] if len(i.namespace) > 1 else "", i.key) for i in items)  # noqa: E731
    assert keys(store.search(("users",))) == [("alice", "drink"), ("alice", "food"), ("bob", "food")]
    assert keys(store.search(("users", "alice"))) == [("alice", "drink"), ("alice", "food")]
    assert keys(store.search(("users",), filter={"spice": {"$gte": 2}})) == [
        ("alice", "food"),
        ("bob", "food"),
    ]
    assert keys(store.search(("users",), filter={"likes": "tea"})) == [("alice", "drink")]
    assert keys(store.search(("users",), filter={"spice": {"$ne": 5, "$lt": 3}})) == [
        ("alice", "drink"),
        ("alice", "food"),
    ]
    assert len(store.search((), limit=2)) == 2 and len(store.search((), limit=10, offset=3)) == 1
    (hit, *_) = store.search((), query="payments queue backed up, what to restart?")
    assert hit.key == "runbook" and hit.score is not None and hit.score > 0.4
    # namespaces
    assert store.list_namespaces() == [("docs",), ("users", "alice", "prefs"), ("users", "bob", "prefs")]
    assert store.list_namespaces(prefix=("users",), max_depth=2) == [("users", "alice"), ("users", "bob")]
    assert store.list_namespaces(suffix=("*", "prefs")) == [
        ("users", "alice", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(prefix=("users", "*", "prefs"), limit=1, offset=1) == [
        ("users", "bob", "prefs")
    ]
    # delete
    store.delete(("users", "bob", "prefs"), "food")
    assert store.get(("users", "bob", "prefs"), "food") is None
    assert ("users", "bob", "prefs") not in store.list_namespaces()
    assert harness.count(tags=["langgraph"], status="any") == 3
    # LangGraph's own validation still applies
    with pytest.raises(InvalidNamespaceError):
        store.put(("users", "a.b"), "k", {"x": 1})


def test_langgraph_store_async_api(harness: Harness) -> None:
    store = ClawVMStore(harness)

    async def run() -> None:
        await store.aput(("notes",), "n1", {"text": "deploy froze at 14:02"})
        item = await store.aget(("notes",), "n1")
        assert item is not None and item.value["text"] == "deploy froze at 14:02"
        assert [i.key for i in await store.asearch(("notes",), query="deploy froze")] == ["n1"]
        assert await store.alist_namespaces() == [("notes",)]
        await store.adelete(("notes",), "n1")
        assert await store.aget(("notes",), "n1") is None

    asyncio.run(run())


# ---- one item per key, whoever writes it ----------------------------------------------------------------
class Branches(TypedDict):
    run: int
    wrote: Annotated[list[int], operator.add]


def parallel_writers(store: ClawVMStore, width: int = 6) -> Any:
    """A compiled graph whose ``width`` branches run in parallel (one superstep) and each put the same key."""

    def branch(n: int) -> Any:
        def write(state: Branches, runtime: Runtime[None]) -> dict[str, list[int]]:
            assert runtime.store is not None
            runtime.store.put(("shared",), "profile", {"run": state["run"], "branch": n})
            return {"wrote": [n]}

        return write

    graph = StateGraph(Branches)
    for n in range(width):
        graph.add_node(f"b{n}", branch(n))
        graph.add_edge(START, f"b{n}")
        graph.add_edge(f"b{n}", END)
    return graph.compile(store=store)


def test_parallel_graph_branches_writing_one_key_leave_one_item(harness: Harness) -> None:
    store = ClawVMStore(harness)
    app = parallel_writers(store)
    for run in range(10):
        out = app.invoke({"run": run, "wrote": []})
        assert sorted(out["wrote"]) == list(range(6))  # the six branches ran, none raised
        (memory,) = items_of(harness)  # one memory, however the writes interleaved
        item = store.get(("shared",), "profile")
        assert item is not None and item.value["run"] == run and item.value["branch"] in range(6)
        assert memory.version == 6 * run + 6  # each put wrote a version: none was lost or doubled
        assert [i.key for i in store.search(("shared",))] == ["profile"]
    store.delete(("shared",), "profile")
    assert store.get(("shared",), "profile") is None and items_of(harness) == []
    assert store.search(("shared",)) == [] and store.list_namespaces() == []


def test_threads_racing_puts_and_deletes_of_one_key_never_leak_a_conflict(harness: Harness) -> None:
    store = ClawVMStore(harness)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(n: int) -> None:
        try:
            start.wait()
            for i in range(15):
                if n == 3 and i % 3 == 2:
                    store.delete(("race",), "k")
                else:
                    store.put(("race",), "k", {"writer": n, "i": i})
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(items_of(harness)) <= 1 and len(store.search(("race",))) <= 1
    store.put(("race",), "k", {"writer": "last"})
    assert store.get(("race",), "k").value == {"writer": "last"}  # type: ignore[union-attr]
    store.delete(("race",), "k")
    assert store.get(("race",), "k") is None and items_of(harness) == []


PROCESS_WRITER = """
import os, sys, time
from clawvm import Harness
from clawvm.integrations.langgraph import ClawVMStore
path, name, go = sys.argv[1:4]
with Harness.open(path, embedder=None) as h:
    store = ClawVMStore(h)
    print("ready", flush=True)
    while not os.path.exists(go):  # every process starts writing at the same moment
        time.sleep(0.002)
    for i in range(12):
        store.put(("shared",), "k", {"by": name, "i": i})
        store.put(("shared", name), f"own{i % 3}", {"i": i})
        if i % 5 == 4:
            store.delete(("shared",), "k")
"""


def test_processes_sharing_one_sqlite_file_keep_one_item_per_key(tmp_path: Path) -> None:
    path, go = str(tmp_path / "shared.db"), tmp_path / "go"
    Harness.open(path, embedder=None).close()  # created and migrated before the race
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_WRITER, path, f"p{n}", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(3)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, [err[-2000:] for _, err in outputs]
    with Harness.open(path, embedder=None) as h:
        store = ClawVMStore(h)
        shared = [m for m in items_of(h, ("shared",)) if m.metadata[TAG]["key"] == "k"]
        assert len(shared) <= 1  # the last writer's put, or nothing if a delete came last
        for n in range(3):
            own = store.search(("shared", f"p{n}"), limit=10)
            assert sorted(i.key for i in own) == ["own0", "own1", "own2"]
            assert len(items_of(h, ("shared", f"p{n}"))) == 3
            assert {i.value["i"] for i in own} == {9, 10, 11}  # each key holds its last put
        store.put(("shared",), "k", {"by": "parent"})
        assert [i.value for i in store.search(("shared",), filter={"by": "parent"})] == [{"by": "parent"}]


# ---- batch: reads before writes, last put wins, atomic writes --------------------------------------------
def test_batch_reads_see_the_store_before_the_batchs_writes(harness: Harness) -> None:
    store = ClawVMStore(harness)
    store.put(("a",), "old", {"v": 1})
    ops = [
        PutOp(("a",), "old", {"v": 2}),
        PutOp(("b",), "new", {"v": 1}),
        GetOp(("a",), "old"),
        GetOp(("b",), "new"),
        SearchOp(("b",)),
        ListNamespacesOp(),
        PutOp(("a",), "gone", {"v": 9}),
        PutOp(("a",), "gone", None),  # the last put of a key wins: never stored
        PutOp(("b",), "new", {"v": 3}),
    ]
    got = store.batch(ops)
    reference = InMemoryStore()
    reference.put(("a",), "old", {"v": 1})
    theirs = reference.batch(ops)
    assert got[2] is not None and got[2].value == {"v": 1}  # as before the batch
    assert got[3] is None and got[4] == [] and got[5] == [("a",)]
    assert [r is None for r in got] == [r is None for r in theirs] and got[4] == theirs[4]
    # (InMemoryStore lists ("b",) too: its get of ("b", "new") made the namespace, an artefact of its dict)
    after = {(i.namespace, i.key): i.value for i in store.search((), limit=10)}
    assert after == {(i.namespace, i.key): i.value for i in reference.search((), limit=10)}
    assert after == {(("a",), "old"): {"v": 2}, (("b",), "new"): {"v": 3}}
    assert len(items_of(harness)) == 2


def test_batch_writes_are_atomic(harness: Harness) -> None:
    store = ClawVMStore(harness)
    store.put(("a",), "keep", {"v": 1})
    store.put(("a",), "drop", {"v": 1})
    too_big = {"text": "x" * (harness.max_content_bytes + 1)}
    with pytest.raises(ValidationError):
        store.batch(
            [PutOp(("a",), "keep", {"v": 2}), PutOp(("a",), "drop", None), PutOp(("a",), "k", too_big)]
        )
    # nothing of the failed batch was written
    assert store.get(("a",), "keep").value == {"v": 1}  # type: ignore[union-attr]
    assert store.get(("a",), "drop") is not None and store.get(("a",), "k") is None
    # a batch that puts and deletes: both land in one write, and the deleted item is then removed
    seen = harness.events()[-1].seq
    store.batch(
        [PutOp(("a",), "keep", {"v": 3}), PutOp(("a",), "drop", None), PutOp(("a",), "new", {"v": 1})]
    )
    assert {i.key: i.value for i in store.search(("a",))} == {"keep": {"v": 3}, "new": {"v": 1}}
    assert len(items_of(harness)) == 2
    kinds = [e.kind for e in harness.events(after_seq=seen)]
    assert sorted(kinds[:3]) == ["add", "update", "update"] and kinds[3:] == ["forget"]


# ---- TTL ------------------------------------------------------------------------------------------------
@pytest.mark.engines("memory", "sqlite", "postgres")
def test_ttl_expires_items_refreshes_on_read_and_sweeps(
    engine_name: str, tmp_path: Path, embedder: clawvm.MiniLMEmbedder, clock: Clock
) -> None:
    with Harness.open(harness_target(engine_name, tmp_path), embedder=embedder, clock=clock) as h:
        store = ClawVMStore(h)
        assert store.supports_ttl
        store.put(("s",), "short", {"v": 1}, ttl=1)  # minutes
        store.put(("s",), "forever", {"v": 2})
        memory = h.get(item_id(h.tenant, ("s",), "short"))
        assert memory.expires_at == clock.now + timedelta(minutes=1)
        clock.advance(seconds=50)
        assert store.get(("s",), "short") is not None  # a read refreshes the TTL ...
        clock.advance(seconds=50)
        assert store.get(("s",), "short", refresh_ttl=False) is not None  # ... from that read
        assert sorted(i.key for i in store.search(("s",), refresh_ttl=False)) == ["forever", "short"]
        clock.advance(seconds=15)  # 65 s after the last refreshing read
        assert store.get(("s",), "short") is None  # expired: never returned, even before a sweep
        assert [i.key for i in store.search(("s",))] == ["forever"]
        assert [i.key for i in store.search(("s",), query="v")] == ["forever"]
        store.put(("t",), "alone", {"v": 3}, ttl=0.5)
        clock.advance(minutes=1)
        assert store.list_namespaces() == [("s",)]
        assert len(items_of(h)) == 3  # still stored ...
        assert store.sweep_ttl() == 2 and len(items_of(h)) == 1  # ... until swept
        # a put over an expired key starts a new item
        store.put(("s",), "short", {"v": 4}, ttl=1)
        clock.advance(seconds=30)
        item = store.get(("s",), "short")
        assert (
            item is not None
            and item.value == {"v": 4}
            and item.created_at == clock.now - timedelta(seconds=30)
        )


@pytest.mark.parametrize("ttl", [-1, float("nan"), float("inf"), 1e20, "5"])
def test_a_ttl_that_is_no_number_of_minutes_ahead_is_refused(mem_harness: Harness, ttl: Any) -> None:
    """-1 stored an item that expired before it was put; NaN and 1e20 raised Python's own ValueError and
    OverflowError."""
    store = ClawVMStore(mem_harness)
    with pytest.raises(ValidationError) as exc:
        store.put(("s",), "k", {"v": 1}, ttl=ttl)
    assert exc.value.field == "ttl" and items_of(mem_harness) == []


def test_ttl_config_default_ttl_refresh_and_background_sweeper(mem_harness: Harness, clock: Clock) -> None:
    store = ClawVMStore(mem_harness, ttl={"default_ttl": 2, "refresh_on_read": False})
    store.put(("c",), "k", {"v": 1})  # the default TTL applies
    assert mem_harness.get(item_id(mem_harness.tenant, ("c",), "k")).expires_at == clock.now + timedelta(
        minutes=2
    )
    clock.advance(minutes=1)
    assert store.get(("c",), "k") is not None  # refresh_on_read False: the read does not move it
    clock.advance(minutes=1, seconds=1)
    assert store.get(("c",), "k") is None
    store.put(("c",), "n", {"v": 2}, ttl=None)  # an explicit None: no expiry
    clock.advance(days=300)
    assert store.get(("c",), "n") is not None
    sweeping = ClawVMStore(mem_harness, ttl={"sweep_interval_minutes": 0.001})  # every 60 ms
    try:
        deadline = time.monotonic() + 5
        while [m.metadata[TAG]["key"] for m in items_of(mem_harness, ("c",))] != ["n"]:
            assert time.monotonic() < deadline, "the sweeper did not remove the expired item"
            time.sleep(0.02)
    finally:
        assert sweeping.stop_ttl_sweeper(timeout=5)
    with pytest.raises(ValidationError):
        store.start_ttl_sweeper()  # no interval configured or given


def test_a_namespace_deeper_than_an_item_can_be_tagged_is_refused_by_name(mem_harness: Harness) -> None:
    """A put 63 labels deep failed with a message about tags, which the caller never gave."""
    store = ClawVMStore(mem_harness)
    deepest = tuple(f"l{i}" for i in range(MAX_NAMESPACE_DEPTH))
    store.put(deepest, "k", {"v": 1})
    assert store.get(deepest, "k") is not None
    with pytest.raises(InvalidNamespaceError, match=f"at most {MAX_NAMESPACE_DEPTH}"):
        store.put((*deepest, "one more"), "k", {"v": 2})
    store.delete((*deepest, "one more"), "k")  # a delete stores nothing: any depth may name what is gone


def test_the_ttl_sweeper_ends_when_its_harness_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It logged a failed sweep every interval, for good, once the harness had closed."""
    h = Harness.open(tmp_path / "lg.db", embedder=None)
    store = ClawVMStore(h, ttl={"sweep_interval_minutes": 0.001})  # every 60 ms
    h.close()
    deadline = time.monotonic() + 5
    while store._sweeper is not None and store._sweeper.is_alive():
        assert time.monotonic() < deadline, "the sweeper outlived its harness"
        time.sleep(0.02)
    assert "sweep failed" not in caplog.text


# ---- search: what the score means, order, index ------------------------------------------------------
def test_search_scores_are_cosine_similarities_a_threshold_can_cut(
    mem_harness: Harness, embedder: clawvm.MiniLMEmbedder
) -> None:
    store = ClawVMStore(mem_harness)
    docs = {
        "runbook": {"text": "restart the payments worker when the queue backs up"},
        "lunch": {"text": "the team lunch is on friday at the italian place"},
        "oncall": {"text": "the on-call engineer this week is dana"},
    }
    for key, value in docs.items():
        store.put(("docs",), key, value)
    hits = store.search(("docs",), query="the payment queue is stuck, what should I restart?")
    assert hits[0].key == "runbook"
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    # the score is the cosine similarity of the query's and the item's embeddings
    q = embedder.embed_query("the payment queue is stuck, what should I restart?")
    for hit in hits:
        text = get_text_at_path(docs[hit.key], "$")[0]
        assert hit.score == pytest.approx(float(np.dot(q, embedder.embed([text])[0])), abs=1e-4)
    assert hits[0].score > 0.5 and all(h.score < 0.3 for h in hits[1:])  # type: ignore[operator]
    # a nonsense query finds nothing above the threshold a real match clears
    for nonsense in ("zxqv blorp wug fnord", "qqqqqq", "asdf jkl; 12 34"):
        best = store.search(("docs",), query=nonsense)[0].score
        assert best is not None and best < 0.25 < hits[0].score  # type: ignore[operator]


def test_search_without_query_is_newest_update_first(mem_harness: Harness, clock: Clock) -> None:
    store = ClawVMStore(mem_harness)
    for key in ("a", "b", "c"):
        store.put(("n",), key, {"key": key})
        clock.advance(seconds=1)
    store.put(("n",), "a", {"key": "a", "again": True})
    found = store.search(("n",))
    assert [i.key for i in found] == ["a", "c", "b"]
    assert [i.updated_at for i in found] == sorted((i.updated_at for i in found), reverse=True)
    assert found[0].created_at < found[1].created_at  # an overwrite keeps the item's creation time
    assert [i.key for i in store.search(("n",), limit=1, offset=1)] == ["c"]


@pytest.mark.parametrize("value", [["ab", "cd"], [("x", 1)], "text"])
def test_a_value_that_is_no_dict_is_refused_not_stored_altered(value: object) -> None:
    """dict(value) read ["ab", "cd"] as {"a": "b", "c": "d"} and stored that; a string failed with a raw
    ValueError."""
    with Harness.open("memory://", embedder=None) as h:
        store = ClawVMStore(h)
        with pytest.raises(ValidationError) as exc:
            store.put(("notes",), "k", value)  # type: ignore[arg-type]
        assert exc.value.field == "value" and store.get(("notes",), "k") is None


def test_put_index_false_and_index_fields(mem_harness: Harness) -> None:
    store = ClawVMStore(mem_harness)
    store.put(("i",), "ranked", {"text": "quarterly revenue grew by twelve percent", "note": "zebra"})
    store.put(("i",), "hidden", {"text": "quarterly revenue grew by twelve percent"}, index=False)
    store.put(("i",), "titled", {"title": "zebra migration", "body": "quarterly revenue"}, index=["title"])
    hits = store.search(("i",), query="how much did revenue grow this quarter?")
    assert [h.key for h in hits][-1] == "hidden" and hits[-1].score is None  # unscored, after the ranked
    assert hits[0].key == "ranked"
    by_key = {h.key: h.score for h in hits}
    assert by_key["titled"] is not None and by_key["titled"] < 0.3  # ranked by its title alone
    zebra = store.search(("i",), query="zebra migration")
    assert zebra[0].key == "titled" and zebra[0].score == pytest.approx(1.0, abs=1e-4)
    assert store.search(("i",), query="revenue", limit=2)[-1].key != "hidden"


def test_index_config_chooses_the_embedder_and_the_fields(mem_harness: Harness) -> None:
    model = WordEmbeddings()
    store = ClawVMStore(mem_harness, index={"dims": 384, "embed": model, "fields": ["text"]})
    store.put(("d",), "apple", {"text": "red apple pie", "color": "red"})
    store.put(("d",), "car", {"text": "blue car wash", "color": "blue"})
    (best, other) = store.search(("d",), query="apple pie")
    q = np.asarray(model.embed_query("apple pie"))
    doc = np.asarray(model.embed_documents(["red apple pie"])[0])
    assert best.key == "apple"
    assert best.score == pytest.approx(float(q @ doc / np.linalg.norm(q) / np.linalg.norm(doc)), abs=1e-5)
    assert other.score == pytest.approx(0.0, abs=1e-6)  # no shared word: orthogonal in this model
    with pytest.raises(ValidationError) as caught:
        ClawVMStore(mem_harness, index={"dims": 1536, "embed": model})
    assert caught.value.field == "index.dims"


def test_a_text_the_model_gives_no_direction_is_stored_without_a_vector() -> None:
    """The bag-of-words model answers a blank text with zeros, which the store refuses: the whole put (and
    every other item of its batch) was lost. Such an item is stored lexical-only, as a zero query ranks
    lexically; the others of its batch keep their vectors, sync and async."""
    with Harness.open("memory://", embedder=None) as h:
        store = ClawVMStore(h, index={"dims": 384, "embed": WordEmbeddings(), "fields": ["text"]})
        store.put(("u",), "blank", {"text": ""})
        store.batch([PutOp(("u",), "cats", {"text": "cats purr"}), PutOp(("u",), "spaces", {"text": "   "})])
        asyncio.run(
            store.abatch([PutOp(("u",), "dogs", {"text": "dogs bark"}), PutOp(("u",), "tab", {"text": "\t"})])
        )
        ids = {key: item_id(h.tenant, ("u",), key) for key in ("blank", "cats", "spaces", "dogs", "tab")}
        assert sorted(store.get(("u",), key).key for key in ids) == sorted(ids)  # type: ignore[union-attr]
        assert set(h.store.vectors_of(list(ids.values()))) == {ids["cats"], ids["dogs"]}
        ranked = store.search(("u",), query="cats")
        assert ranked[0].key == "cats" and ranked[0].score == pytest.approx(1 / np.sqrt(2), abs=1e-5)
        assert {i.key for i in ranked if i.score is None} == {"blank", "spaces", "tab"}  # after the ranked


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e300], ids=["nan", "inf", "past-float32"])
def test_a_model_that_returns_non_finite_vectors_is_refused_by_name_and_nothing_stored(bad: float) -> None:
    """An embed returning NaN: put stored the item (a numpy RuntimeWarning aside) and search refused it
    naming an internal field ("vector"). Both refuse it naming index.embed, sync and async, as a vector
    of the wrong size is refused, and store nothing."""
    with Harness.open("memory://", embedder=None) as h:
        store = ClawVMStore(h, index={"dims": 384, "embed": lambda xs: [[bad] * 384 for _ in xs]})
        short = ClawVMStore(h, index={"dims": 384, "embed": lambda xs: [[1.0] * 3 for _ in xs]})
        for call in (
            lambda: store.put(("n",), "k", {"text": "hello"}),
            lambda: store.search(("n",), query="hello"),
            lambda: asyncio.run(store.aput(("n",), "k", {"text": "hello"})),
            lambda: asyncio.run(store.asearch(("n",), query="hello")),
            lambda: short.put(("n",), "k", {"text": "hello"}),
            lambda: short.search(("n",), query="hello"),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no numpy RuntimeWarning on the way
                with pytest.raises(ValidationError) as exc:
                    call()
            assert exc.value.field == "index.embed", exc.value
        assert h.count(status="any") == 0


def test_no_harness_an_unknown_kind_and_a_filter_that_is_no_dict_are_refused_by_name() -> None:
    """ClawVMStore(None) was taken (ClawVMCallbackHandler(None) is refused), kind="bogus" raised a bare
    ValueError, and search(filter=[1]) answered [] as though nothing matched."""
    with pytest.raises(ValidationError) as exc:
        ClawVMStore(None)  # type: ignore[arg-type]
    assert exc.value.field == "harness"
    with Harness.open("memory://", embedder=None) as h:
        with pytest.raises(ValidationError) as exc:
            ClawVMStore(h, kind="bogus")
        assert exc.value.field == "kind" and "knowledge" in exc.value.fix
        store = ClawVMStore(h)
        store.put(("f",), "k", {"n": 1})
        for bad in ([1], [], "n"):
            with pytest.raises(ValidationError) as exc:
                store.search(("f",), filter=bad)  # type: ignore[arg-type]
            assert exc.value.field == "filter"
            with pytest.raises(ValidationError):
                asyncio.run(store.asearch(("f",), filter=bad))  # type: ignore[arg-type]
        assert [i.key for i in store.search(("f",), filter={"n": 1})] == ["k"]


# ---- LangGraph's own store tests, re-written against the adapter -----------------------------------------
@pytest.fixture
def words(mem_harness: Harness) -> ClawVMStore:
    """The adapter with a bag-of-words model, as LangGraph's vector tests use a character model."""
    return ClawVMStore(mem_harness, index={"dims": 384, "embed": WordEmbeddings()})


def test_list_namespaces_with_prefix_suffix_depth_and_pages(mem_harness: Harness) -> None:
    store = ClawVMStore(mem_harness)
    assert store.list_namespaces() == []
    spaces = [("p", "q", "r"), ("p", "q", "s", "t"), ("p", "q", "s", "u"), ("p", "q", "v"), ("p", "w", "v")]
    spaces += [("x", "p", "v"), ("team", "1"), ("team", "2", "conf"), ("ops", "team", "9")]
    for n, ns in enumerate(spaces):
        store.put(ns, f"item{n}", {"n": n})
    assert store.list_namespaces(prefix=("p", "q")) == [
        ("p", "q", "r"),
        ("p", "q", "s", "t"),
        ("p", "q", "s", "u"),
        ("p", "q", "v"),
    ]
    assert store.list_namespaces(suffix=("v",)) == [("p", "q", "v"), ("p", "w", "v"), ("x", "p", "v")]
    assert store.list_namespaces(prefix=("p",), suffix=("v",)) == [("p", "q", "v"), ("p", "w", "v")]
    assert store.list_namespaces(prefix=("p", "q"), max_depth=3) == [
        ("p", "q", "r"),
        ("p", "q", "s"),
        ("p", "q", "v"),
    ]
    assert store.list_namespaces(prefix=("p", "q"), limit=2) == [("p", "q", "r"), ("p", "q", "s", "t")]
    assert store.list_namespaces(prefix=("p", "q"), offset=2) == [("p", "q", "s", "u"), ("p", "q", "v")]
    assert store.list_namespaces(prefix=("p", "*", "v")) == [("p", "q", "v"), ("p", "w", "v")]
    assert store.list_namespaces(suffix=("*", "conf")) == [("team", "2", "conf")]
    assert store.list_namespaces(prefix=("*", "team"), suffix=("*", "conf")) == []
    assert store.list_namespaces(prefix=("absent",)) == []
    assert store.list_namespaces(prefix=("team", "1")) == [("team", "1")]
    assert store.list_namespaces(max_depth=1) == [("ops",), ("p",), ("team",), ("x",)]
    for n in range(12):
        store.put(("paged", f"sub{n:02d}"), "k", {"n": n})
    for offset in (0, 5, 10):
        expected = [("paged", f"sub{n:02d}") for n in range(offset, min(offset + 5, 12))]
        assert store.list_namespaces(prefix=("paged",), limit=5, offset=offset) == expected


def test_namespace_rules_of_langgraph(mem_harness: Harness) -> None:
    store = ClawVMStore(mem_harness)
    for bad in [(), ("has", "a.dot"), ("trailing", "")]:
        with pytest.raises(InvalidNamespaceError):
            store.put(bad, "k", {"x": 1})
        with pytest.raises(InvalidNamespaceError):
            asyncio.run(store.aput(bad, "k", {"x": 1}))
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph", "x"), "k", {"x": 1})  # the root label is LangGraph's own ...
    store.batch([PutOp(("langgraph", "x"), "k", {"x": 1})])  # ... through its public API only
    assert store.get(("langgraph", "x"), "k").value == {"x": 1}  # type: ignore[union-attr]
    store.put(("a", "langgraph", "b"), "k", {"x": 2})
    assert store.search(("a", "langgraph", "b"))[0].value == {"x": 2}
    store.delete(("a", "langgraph", "b"), "k")
    assert store.get(("a", "langgraph", "b"), "k") is None


def test_vector_search_like_langgraphs_own_cases(words: ClawVMStore) -> None:
    docs = [
        ("d1", {"text": "small note"}),
        ("d2", {"text": "a longer note about text"}),
        ("d3", {"text": "the longest note about long text"}),
        ("d4", {"summary": "text kept in a summary"}),
    ]
    for key, value in docs:
        words.put(("t",), key, value)
    found = [r.key for r in words.search(("t",), query="long text")]
    assert found[0] == "d3" and set(found) == {"d1", "d2", "d3", "d4"}
    # an update re-embeds: the old text no longer matches, the new one does
    words.put(("u",), "a", {"text": "purple giraffe xylophone"})
    words.put(("u",), "b", {"text": "something about dogs"})
    first = words.search(("u",), query="purple xylophone")[0]
    assert first.key == "a"
    words.put(("u",), "a", {"text": "new words about dogs"})
    after = next(r.score for r in words.search(("u",), query="purple xylophone") if r.key == "a")
    assert after < first.score  # type: ignore[operator]
    assert next(r.score for r in words.search(("u",), query="new words about dogs") if r.key == "a") > after  # type: ignore[operator]
    words.put(("u",), "c", {"text": "new words about dogs"}, index=False)
    assert "c" not in [r.key for r in words.search(("u",), query="new words about dogs", limit=2)]


def test_vector_search_with_filters_pages_and_odd_queries(words: ClawVMStore) -> None:
    docs = [
        ("d1", {"text": "red apple", "color": "red", "rating": 4.5}),
        ("d2", {"text": "red car", "color": "red", "rating": 3.0}),
        ("d3", {"text": "green apple", "color": "green", "rating": 4.0}),
        ("d4", {"text": "blue car", "color": "blue", "rating": 3.5}),
    ]
    for key, value in docs:
        words.put(("f",), key, value)
    assert [r.key for r in words.search(("f",), query="apple", filter={"color": "red"})] == ["d1", "d2"]
    assert [r.key for r in words.search(("f",), query="car", filter={"color": "red"})] == ["d2", "d1"]
    assert {r.key for r in words.search(("f",), query="blue", filter={"rating": {"$gt": 3.2}})} == {
        "d1",
        "d3",
        "d4",
    }
    assert words.search(("f",), query="blue", filter={"rating": {"$gt": 3.2}})[0].key == "d4"
    assert [
        r.key for r in words.search(("f",), query="apple", filter={"rating": {"$gte": 4}, "color": "green"})
    ] == ["d3"]
    page1 = words.search(("f",), query="apple", limit=2)
    page2 = words.search(("f",), query="apple", limit=2, offset=2)
    assert len(page1) == len(page2) == 2 and {r.key for r in page1}.isdisjoint(r.key for r in page2)
    assert len(words.search(("f",), query="apple", limit=10)) == 4
    for odd in ("", None, "car " * 100, "car!@#$%^&*()"):
        assert len(words.search(("f",), query=odd)) == 4


# ---- graphs, and agreement with InMemoryStore ------------------------------------------------------------
def test_langgraph_namespaces_are_listed_page_by_page_in_langgraphs_order(
    mem_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(langgraph_adapter, "PAGE", 3)  # many keyset pages over a few namespaces
    ours, reference = ClawVMStore(mem_harness), InMemoryStore()
    # labels whose order as tuples differs from their order as joined strings ("a-b" < "a", "b" as text)
    names = [("a",), ("a", "b"), ("a-b",), ("a", "b", "c"), ("é",), ("z",), ("a", "zz"), ("b", "a")]
    long_label = ("long", "x" * 150)  # too long to spell out in a tag: read back from its item
    for i, ns in enumerate([*names, long_label]):
        for store in (ours, reference):
            store.put(ns, f"k{i}", {"n": i})
            store.put(ns, f"j{i}", {"n": i})
    assert ours.list_namespaces(limit=100) == reference.list_namespaces(limit=100)
    for offset in range(0, 10, 2):
        page = {"limit": 2, "offset": offset}
        assert ours.list_namespaces(**page) == reference.list_namespaces(**page)
    for depth in (1, 2):
        assert ours.list_namespaces(max_depth=depth) == reference.list_namespaces(max_depth=depth)
    assert ours.list_namespaces(prefix=("a",)) == reference.list_namespaces(prefix=("a",))
    assert ours.list_namespaces(prefix=("long",)) == [long_label]
    assert ours.list_namespaces(suffix=("b",)) == reference.list_namespaces(suffix=("b",))
    # search walks the namespace newest first in pages: an offset page is a slice of the whole
    everything = [i.key for i in ours.search(("a",), limit=100)]
    assert sorted(everything) == sorted(i.key for i in reference.search(("a",), limit=100))
    assert [i.key for i in ours.search(("a",), limit=3, offset=2)] == everything[2:5]


def test_items_of_an_earlier_adapter_are_read_and_moved_on_their_next_put(mem_harness: Harness) -> None:
    store = ClawVMStore(mem_harness)
    ns = ("old",)
    tags = [TAG, langgraph_adapter._ns_tag(ns), langgraph_adapter._item_tag(ns, "k")]  # no path tag yet
    info = {"namespace": ["old"], "key": "k", "updated_at": mem_harness.now().isoformat()}
    legacy = mem_harness.record({"x": 1}, kind=Kind.KNOWLEDGE, tags=tags, metadata={TAG: info})
    store.put(("new",), "k", {"x": 2})
    assert store.get(ns, "k").value == {"x": 1}  # type: ignore[union-attr]
    assert store.list_namespaces() == [("new",)]  # written as an earlier version would have
    assert store.tag_namespaces() == 1 and store.tag_namespaces() == 0
    assert store.list_namespaces() == [("new",), ("old",)]
    store.put(ns, "k", {"x": 3})  # moves to its derived id: still one item
    assert [m.id for m in items_of(mem_harness, ns)] == [item_id(mem_harness.tenant, ns, "k")]
    assert legacy.id != item_id(mem_harness.tenant, ns, "k") and store.get(ns, "k").value == {"x": 3}  # type: ignore[union-attr]


class Chat(TypedDict):
    user: str
    said: str
    remembered: str


def test_a_langgraph_graph_keeps_memory_across_runs_in_clawvm(harness: Harness) -> None:
    def remember(state: Chat, runtime: Runtime[None]) -> dict[str, str]:
        assert runtime.store is not None
        namespace = ("memories", state["user"])
        before = [i.value["fact"] for i in runtime.store.search(namespace)]
        if state["said"]:
            runtime.store.put(namespace, f"m{len(before)}", {"fact": state["said"]})
        return {"remembered": "; ".join(before)}

    graph = StateGraph(Chat)
    graph.add_node("remember", remember)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", END)
    app = graph.compile(store=ClawVMStore(harness))
    app.invoke({"user": "alice", "said": "I am allergic to peanuts", "remembered": ""})
    out = app.invoke({"user": "alice", "said": "", "remembered": ""})
    assert out["remembered"] == "I am allergic to peanuts"
    assert app.invoke({"user": "bob", "said": "", "remembered": ""})["remembered"] == ""
    (m,) = harness.list(tags=["langgraph"])
    assert m.content_json() == {"fact": "I am allergic to peanuts"}


labels = st.sampled_from(["a", "b", "c"])
namespaces = st.lists(labels, min_size=1, max_size=3).map(tuple)
values = st.fixed_dictionaries({"n": st.integers(0, 3), "tag": st.sampled_from(["x", "y"])})
ops = st.lists(
    st.tuples(st.sampled_from(["put", "put", "delete"]), namespaces, st.sampled_from(["k1", "k2"]), values),
    max_size=15,
)
filters = st.one_of(
    st.none(),
    st.fixed_dictionaries({"tag": st.sampled_from(["x", "y"])}),
    st.fixed_dictionaries({"n": st.fixed_dictionaries({"$gte": st.integers(0, 3)})}),
    st.fixed_dictionaries({"n": st.integers(0, 3), "tag": st.sampled_from(["x", "y"])}),
)


@settings(max_examples=30, deadline=None)
@given(ops, st.lists(labels, max_size=2).map(tuple), filters, st.one_of(st.none(), st.integers(1, 3)))
def test_langgraph_store_agrees_with_langgraphs_in_memory_store(
    plan: list[tuple[str, tuple[str, ...], str, dict[str, Any]]],
    prefix: tuple[str, ...],
    condition: dict[str, Any] | None,
    depth: int | None,
) -> None:
    reference = InMemoryStore()
    with Harness.open("memory://", embedder=None) as h:
        ours = ClawVMStore(h)
        for action, ns, key, value in plan:
            for store in (reference, ours):
                if action == "put":
                    store.put(ns, key, value)
                else:
                    store.delete(ns, key)
        for _, ns, key, _ in plan:
            mine, theirs = ours.get(ns, key), reference.get(ns, key)
            assert (mine and mine.value) == (theirs and theirs.value)
        found = lambda s: sorted((i.namespace, i.key) for i in s.search(prefix, filter=condition, limit=100))  # noqa: E731
        assert found(ours) == found(reference)
        # InMemoryStore also lists namespaces that only ever saw a get or a delete: compare with a fresh
        # one holding just the live items
        live = InMemoryStore()
        for i in reference.search((), limit=1000):
            live.put(i.namespace, i.key, i.value)
        assert ours.list_namespaces(max_depth=depth) == live.list_namespaces(max_depth=depth)
        if prefix:
            assert ours.list_namespaces(prefix=prefix) == live.list_namespaces(prefix=prefix)
            assert ours.list_namespaces(suffix=prefix) == live.list_namespaces(suffix=prefix)


def test_a_memory_tagged_like_an_item_but_no_item_is_left_out_of_reads(mem_harness: Harness) -> None:
    """Items are memories, so a tool may change one's text to prose, and a person may tag a note
    ``langgraph``: either made every get and search of the namespace raise (JSONDecodeError, KeyError)."""
    from clawvm.agents.tools import AgentTools

    store = ClawVMStore(mem_harness)
    store.put(("ops",), "eu", {"fact": "EU host healthy"})
    store.put(("ops",), "us", {"fact": "US host slow"})
    eu = mem_harness.get(item_id(mem_harness.tenant, ("ops",), "eu"))
    prose = {"memory_id": eu.id, "content": "EU host down"}
    assert AgentTools(mem_harness).dispatch("update_memory", prose)["ok"]
    mem_harness.record("a note about langgraph itself", tags=[TAG])
    assert store.get(("ops",), "eu") is None and [i.key for i in store.search(("ops",))] == ["us"]
    assert [i.key for i in store.search(())] == ["us"]
    assert [i.key for i in store.search(("ops",), query="host")] == ["us"]
    store.put(("ops",), "eu", {"fact": "EU host healthy again"})  # a put makes it an item again
    assert store.get(("ops",), "eu").value == {"fact": "EU host healthy again"}


def test_under_redaction_an_item_comes_back_with_an_address_that_finds_it() -> None:
    """Keys and namespace labels were redacted as plain text: two keys came back alike ("[EMAIL]"), and
    neither that nor the namespace shown could read or delete the item."""
    from clawvm.write.redaction import RedactionPolicy

    with Harness.open("memory://", embedder=None, redaction=RedactionPolicy()) as h:
        store = ClawVMStore(h)
        store.put(("users",), "bob@example.com", {"plan": "pro"})
        store.put(("users",), "carol@example.com", {"plan": "free"})
        keys = sorted(item.key for item in store.search(("users",)))
        assert len(set(keys)) == 2 and all("@" not in k and k.startswith("[EMAIL]~") for k in keys)
        assert store.get(("users",), "bob@example.com").key in keys  # the original finds it too
        store.put(("phones", "+1-555-123-4567"), "prefs", {"lang": "pt"})
        (listed,) = store.list_namespaces(prefix=("phones",))
        assert store.get(listed, "prefs").namespace == listed  # the namespace listed is the item's
        for item in store.search(("users",)):
            store.delete(item.namespace, item.key)
        assert store.search(("users",)) == []


def test_long_labels_cut_to_a_depth_are_listed_once(mem_harness: Harness) -> None:
    store = ClawVMStore(mem_harness)
    long = "x" * 100  # longer than a tag spells out: its tag is shortened
    for ns in [(long, "b"), (long + "y",), (long, "a"), (long, "c"), (long + "y", "z"), (long,)]:
        store.put(ns, "k", {"v": 1})
    assert sorted(store.list_namespaces(max_depth=1)) == [(long,), (long + "y",)]


def test_a_filtered_search_ranks_matches_beyond_the_first_window(mem_harness: Harness) -> None:
    """The filter was applied to the query's best 4 x limit candidates only; the matches past them came
    back after the ranked ones, unscored, newest first."""
    store = ClawVMStore(mem_harness)
    for i in range(40):
        store.put(("kb",), f"en{i}", {"text": f"weather in city {i}", "lang": "en"})
    store.put(("kb",), "fr", {"text": "the payments API answers 503", "lang": "fr"})
    for i in range(40, 60):
        store.put(("kb",), f"en{i}", {"text": f"weather in city {i}", "lang": "en"})
    (hit,) = store.search(("kb",), query="weather", filter={"lang": "fr"}, limit=1)
    assert hit.key == "fr" and hit.score is not None


def test_a_negative_limit_or_offset_and_mixed_keys_are_refused_by_name() -> None:
    """search(limit=-1) answered [] and offset=-1 the first item (slices from the end); a value with keys
    1 and "b" said only "'<' not supported between instances of 'str' and 'int'"."""
    with Harness.open("memory://", embedder=None) as h:
        store = ClawVMStore(h)
        for i in range(3):
            store.put(("p",), f"k{i}", {"i": i})
        for args, field in (({"limit": -1}, "limit"), ({"offset": -1}, "offset")):
            with pytest.raises(ValidationError) as exc:
                store.search(("p",), **args)
            assert exc.value.field == field
        with pytest.raises(ValidationError) as exc:
            store.list_namespaces(limit=-1)
        assert exc.value.field == "limit"
        with pytest.raises(ValidationError) as exc:
            store.put(("p",), "mixed", {1: "x", "b": 2})
        assert "keys of two types" in exc.value.problem
        assert len(store.search(("p",))) == 3


def test_under_redaction_no_secret_of_an_indexed_field_reaches_the_embedding_model() -> None:
    """Each indexed field was scrubbed as text alone: the value of a "password" field read as no secret,
    was embedded, and its vector stored beside the redacted value."""
    from clawvm.write.redaction import RedactionPolicy

    seen: list[str] = []

    def embed(texts: list[str]) -> list[list[float]]:
        seen.extend(texts)
        return [[1.0] * 384 for _ in texts]

    with Harness.open("memory://", embedder=None, redaction=RedactionPolicy()) as h:
        store = ClawVMStore(h, index={"embed": embed, "dims": 384, "fields": ["password", "card"]})
        store.put(("ns",), "k1", {"password": "hunter2Xy9", "card": 4111111111111111})
        assert store.get(("ns",), "k1").value == {"password": "[SECRET]", "card": "[CARD]"}
    assert seen == ["[SECRET]\n[CARD]"]


def test_a_filter_on_a_tuple_matches_the_value_put_with_that_tuple() -> None:
    """A value is stored as JSON (tuples come back as lists), while the filter kept its tuple: a filter
    naming the very tuple an item was put with never matched it."""
    with Harness.open("memory://", embedder=None) as h:
        store = ClawVMStore(h)
        store.put(("f",), "k", {"tags": ("x", "y"), "nested": {"pair": (1, (2, 3))}})
        store.put(("f",), "other", {"tags": ("x", "z")})
        for condition in (
            {"tags": ("x", "y")},
            {"tags": {"$eq": ("x", "y")}},
            {"nested": {"pair": (1, (2, 3))}},
            {"nested": {"$eq": {"pair": (1, (2, 3))}}},
        ):
            assert [i.key for i in store.search(("f",), filter=condition)] == ["k"], condition
        assert [i.key for i in store.search(("f",), filter={"tags": {"$ne": ("x", "y")}})] == ["other"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.get(("\ud800",), "k"), "namespace"),
        (lambda s: s.get(("ns",), "\ud800"), "key"),
        (lambda s: s.put(("ns", "\udfff"), "k", {"v": 1}), "namespace"),
        (lambda s: s.put(("ns",), "\ud800", {"v": 1}), "key"),
        (lambda s: s.delete(("ns",), "\ud800"), "key"),
        (lambda s: s.search(("\ud800",)), "namespace"),
        (lambda s: s.list_namespaces(prefix=("\ud800",)), "namespace"),
        (lambda s: s.batch([PutOp(("ns",), "ok", {"v": 1}), PutOp(("ns",), "\ud800", {"v": 2})]), "key"),
    ],
)
def test_an_unpaired_surrogate_in_a_namespace_or_key_is_refused_by_name(call: Any, field: str) -> None:
    """The item's id and tags are of its address's UTF-8: a lone surrogate raised a bare
    UnicodeEncodeError (a value holding one is refused by name)."""
    with Harness.open("memory://", embedder=None) as h:
        store = ClawVMStore(h)
        with pytest.raises(ValidationError) as exc:
            call(store)
        assert exc.value.field == field and "unpaired surrogates" in exc.value.problem
        assert h.count(status="any") == 0  # nothing stored, not even the batch's valid put


class AsyncOnlyEmbeddings(Embeddings):
    """A LangChain model that only embeds asynchronously (its sync methods raise, as some clients do)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError

    def embed_query(self, text: str) -> list[float]:
        raise NotImplementedError

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return WordEmbeddings().embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return WordEmbeddings().embed_query(text)


async def embed_words(texts: list[str]) -> list[list[float]]:
    return WordEmbeddings().embed_documents(texts)


@pytest.mark.parametrize("embed", [embed_words, AsyncOnlyEmbeddings()], ids=["function", "embeddings"])
def test_an_async_only_embedding_model_embeds_through_the_async_api(embed: Any) -> None:
    """aput/asearch ran the sync batch in a thread, so an async-only model failed with LangChain's
    "initialized with an async function but no sync function" (LangGraph's InMemoryStore uses it); the sync
    methods now refuse it by the setting's name, and store nothing."""
    with Harness.open("memory://", embedder=None) as h:
        store = ClawVMStore(h, index={"dims": 384, "embed": embed})

        async def run() -> list[Any]:
            await store.aput(("docs",), "weather", {"text": "rain and wind in the city"})
            await store.aput(("docs",), "deploy", {"text": "the payments deploy froze"})
            return await store.asearch(("docs",), query="payments deploy")

        first, second = asyncio.run(run())
        assert first.key == "deploy" and first.score is not None and first.score > 0.5
        assert second.key == "weather" and second.score is not None and second.score < first.score
        for call in (
            lambda: store.put(("docs",), "sync", {"text": "a sync put"}),
            lambda: store.search(("docs",), query="payments"),
        ):
            with pytest.raises(ValidationError) as exc:
                call()
            assert exc.value.field == "index.embed" and "aput/asearch" in exc.value.fix
        assert store.get(("docs",), "sync") is None
        assert len(store.search(("docs",))) == 2  # no query: nothing to embed, the sync read works
