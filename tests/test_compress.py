"""Reversible compression: the extractive summarizer, compress/decompress, collapse_task, and the optional
OpenAI-compatible LLM summarizer against a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawvm import (
    Filters,
    Harness,
    Kind,
    LinkType,
    Memory,
    NotFoundError,
    State,
    StateConflictError,
    Status,
    StoreError,
    Tier,
    ValidationError,
)
from clawvm.core.openai_http import FailureReason
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.vm.compress import (
    ExtractiveSummarizer,
    Fallback,
    LLMSummarizer,
    SummarizerError,
    Summary,
    referenced_raw,
)
from clawvm.vm.tiers import PagerConfig, TierBudgets
from engines import engine_of
from loopback import DIGITLESS_REPLY, MISBEHAVIOURS, ChatReplay, Fault, Misbehaviour
from refusals import events_refused

T0 = datetime(2030, 5, 1, 9, 0, tzinfo=UTC)

PROSE = [
    "We talked about the weather and the long queue at the coffee shop.",
    "Nobody remembered where the old dashboards were kept.",
    "It rained all afternoon so the team stayed inside and planned.",
    "Everyone agreed that the retry policy needs a maximum delay.",
    "The user prefers short answers with bullet lists and no jargon.",
    "Bob thinks the cache should be warmed before the meeting starts.",
    "Alice asked whether the invoice could be split across two months.",
    "The payment service kept retrying the refund before giving up.",
]
NUMERIC = [
    "The invoice total came to 1240 euros including taxes.",
    "Build 7 failed at step 3 with exit code 137.",
    "She moved to Lisbon on 12 May 2023.",
    "The p95 latency dropped from 48.5 ms to 21 ms.",
]
CODE = [
    "    return total * 1.2",
    "def refund(order_id):",
    "SELECT id FROM orders WHERE paid = 0",
    "if (retries > max) {",
    "import json",
    "call `make test` before pushing",
]


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, list[str], list[str]]:
    """A text of prose lines (several sentences each) and code lines; returns (text, numeric, code)."""
    lines: list[str] = []
    numeric: list[str] = []
    code: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 3)) == 0:
            c = draw(st.sampled_from(CODE))
            lines.append(c)
            code.append(c)
        else:
            sentences = draw(st.lists(st.sampled_from(PROSE + NUMERIC), min_size=1, max_size=6))
            numeric += [s for s in sentences if s in NUMERIC]
            lines.append(" ".join(sentences))
    return "\n".join(lines), numeric, code


def units(text: str) -> set[str]:
    """Every line and every sentence of ``text``."""
    out = set()
    for line in text.splitlines():
        out.add(line)
        out.update(s for s in PROSE + NUMERIC if s in line)
    return out


@settings(max_examples=150, deadline=None)
@given(documents(), st.floats(0.1, 1.0))
def test_extractive_keeps_numbers_and_code_verbatim(
    doc: tuple[str, list[str], list[str]], ratio: float
) -> None:
    text, numeric, code = doc
    max_chars = max(1, int(len(text) * ratio))
    summary = ExtractiveSummarizer().summarize(text, max_chars)
    out_lines = summary.splitlines()
    for c in code:
        assert c in out_lines, c  # a code line is kept whole, as its own line
    for s in numeric:
        assert s in out_lines, s  # a sentence with a digit is kept whole
    for line in out_lines:  # extractive: nothing invented
        assert line in units(text), line
    must = sum(len(u) + 1 for u in code + numeric)
    assert len(summary) <= max(max_chars, must)  # over the budget only by what must be kept


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(PROSE), min_size=4, max_size=20))
def test_extractive_shortens_plain_prose(sentences: list[str]) -> None:
    text = " ".join(sentences)
    budget = len(text) // 3
    summary = ExtractiveSummarizer().summarize(text, budget)
    assert len(summary) <= budget < len(text)
    assert all(line in PROSE for line in summary.splitlines())
    # a sentence said again is kept once (a plan that repeated one kept it three times in its summary)
    assert len(set(summary.splitlines())) == len(summary.splitlines())


def test_extractive_keeps_short_text_whole() -> None:
    text = "First point. Second point."
    assert ExtractiveSummarizer().summarize(text, 500).split("\n") == ["First point.", "Second point."]


# ---- compress / decompress through the harness ---------------------------------------------------------
def open_harness(**kw: Any) -> Harness:
    kw.setdefault("embedder", None)
    return Harness.open("memory://", clock=lambda: T0, **kw)


LONG = " ".join(PROSE + NUMERIC) + "\n" + "\n".join(CODE)

raw_texts = st.one_of(
    st.lists(st.sampled_from(PROSE + NUMERIC + CODE), min_size=1, max_size=25).map(" ".join),
    st.lists(st.sampled_from(PROSE + NUMERIC + CODE), min_size=1, max_size=25).map("\n".join),
    st.text(
        st.characters(codec="utf-8", exclude_categories=["Cs"]),
        min_size=1,
        max_size=400,
    ),
).filter(lambda s: bool(s.strip()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_texts)
def test_compress_then_decompress_restores_the_exact_original(text: str) -> None:
    with open_harness() as h:
        m = h.record(text, session_id="s1", kind="tool_result", tags=["x"], created_at=T0)
        c = h.compress(m.id)
        if "compression" in c.metadata:
            info = c.metadata["compression"]
            raw = h.get(info["raw_id"])
            assert raw.content == text and raw.metadata == {"raw_of": m.id}
            assert raw.status is Status.ARCHIVED and raw.tier is Tier.ARCHIVE
            assert len(c.content) < len(text) and c.token_count <= m.token_count
            assert any(link.type is LinkType.DERIVED_FROM and link.target == raw.id for link in c.links)
            assert info["raw_tokens"] == m.token_count and info["method"] == "extractive"
            assert isinstance(info["entities"], list)
            assert c.id == m.id and c.version == m.version + 1
        else:
            assert c == h.get(m.id) and c.content == text  # nothing to gain: left as it was
        d = h.decompress(m.id)
        assert d.content == text and h.get(m.id).content == text
        assert d.token_count == m.token_count
        assert "compression" not in d.metadata
        assert [link for link in d.links if link.type is LinkType.DERIVED_FROM] == []
        assert d.kind is m.kind and d.session_id == m.session_id and d.tags == m.tags


def test_compression_events_and_recompression() -> None:
    with open_harness() as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        c = h.compress(m.id)
        assert "compression" in c.metadata
        assert h.compress(m.id) == h.get(m.id)  # already compressed: unchanged
        ev = [e for e in h.events(memory_id=m.id) if e.kind == "compress"][-1]
        assert ev.data["raw_id"] == c.metadata["compression"]["raw_id"]
        assert ev.data["tokens_before"] == m.token_count and ev.data["tokens_after"] == c.token_count
        h.decompress(m.id)
        assert [e.kind for e in h.events(memory_id=m.id)][-1] == "decompress"
        again = h.compress(m.id)  # a decompressed memory can be compressed again
        assert "compression" in again.metadata and h.decompress(m.id).content == LONG
        # numbers survive the summary
        for s in NUMERIC:
            assert s in again.content


def test_the_way_back_to_the_original_survives_updates() -> None:
    """The raw copy refuses edits (decompress would return them as the original), and new metadata on the
    compressed memory keeps its pointer to the raw copy (dropping it lost the original for good)."""
    with open_harness() as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        raw_id = h.compress(m.id).metadata["compression"]["raw_id"]
        for change in ({"content": "overwritten raw"}, {"tags": ["x"]}, {"status": "active"}):
            with pytest.raises(StateConflictError) as exc:
                h.update(raw_id, **change)
            assert exc.value.field == "memory_id" and m.id in exc.value.problem
        with pytest.raises(StateConflictError):
            h.revise(raw_id, content="overwritten raw")
        kept = h.update(m.id, metadata={"reviewed": True})
        assert kept.metadata["reviewed"] is True and kept.metadata["compression"]["raw_id"] == raw_id
        with pytest.raises(ValidationError) as exc:
            h.update(m.id, metadata={"compression": {"raw_id": m.id}})
        assert exc.value.field == "metadata.compression"
        with pytest.raises(ValidationError):
            h.forget(raw_id)  # still the raw content of m
        assert h.decompress(m.id).content == LONG


def test_forgetting_a_compressed_memory_forgets_every_copy_of_its_original() -> None:
    """The archived raw copies outlived forget(): a recall with status "any" still found the full text."""
    with open_harness() as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        first = h.compress(m.id).metadata["compression"]["raw_id"]
        h.decompress(m.id)
        second = h.compress(m.id).metadata["compression"]["raw_id"]  # a second raw copy
        bystander = h.record("another memory of the session", session_id="s1")
        h.forget(m.id)
        for gone in (m.id, first, second):
            with pytest.raises(NotFoundError):
                h.get(gone)
        assert h.get(bystander.id) == bystander
        assert [e.memory_id for e in h.events() if e.kind == "forget"] == [m.id, first, second]


def test_an_expired_memorys_original_stays_expired_and_out_of_reach() -> None:
    """Its raw copy was stored archived: recall(status="archived") returned the full text its TTL promised
    to forget; compress() and decompress() went on changing it, though update() refused."""
    now = [T0]
    with Harness.open("memory://", embedder=None, clock=lambda: now[0]) as h:
        m = h.record(LONG, session_id="s1", expires_at=T0 + timedelta(hours=1))
        other = h.record(LONG, session_id="s2", expires_at=T0 + timedelta(hours=1))
        earliest_id = h.compress(other.id).metadata["compression"]["raw_id"]
        h.decompress(other.id)  # and compressed again: two copies of its text
        earlier_id = h.compress(other.id).metadata["compression"]["raw_id"]
        query = "retry policy maximum delay"
        assert earlier_id in {r.id for r in h.recall(query, k=20, status="archived")}  # reachable before
        now[0] = T0 + timedelta(hours=2)
        h.tick()
        compressed = h.get(m.id)
        assert compressed.status is Status.EXPIRED and "compression" in compressed.metadata
        raw = h.get(compressed.metadata["compression"]["raw_id"])
        earlier = h.get(earlier_id)  # compressed before it expired
        assert raw.status is Status.EXPIRED and earlier.status is Status.EXPIRED
        assert h.get(earliest_id).status is Status.EXPIRED
        reached = {r.id for r in h.recall(query, k=20, status="archived")}
        assert reached & {m.id, raw.id, other.id, earlier.id} == set()
        for change in (h.compress, h.decompress):
            for memory in (m, other):
                with pytest.raises(StateConflictError):
                    change(memory.id)


def test_a_compression_pointer_is_never_taken_on_its_word() -> None:
    """decompress() trusted metadata.compression: a record carrying one pointing at another memory had its
    text replaced by that memory's, for good."""
    with open_harness() as h:
        other = h.record("another memory's text")
        with pytest.raises(ValidationError) as exc:
            h.record("my important note", metadata={"compression": {"raw_id": other.id}})
        assert exc.value.field == "metadata.compression"
        with pytest.raises(ValidationError) as exc:
            h.record("my important note", metadata={"raw_of": other.id})
        assert exc.value.field == "metadata.raw_of"
        # an import keeps its metadata as it was; a pointer that does not lead back is refused at decompress
        forged = Memory(content="imported note", metadata={"compression": {"raw_id": other.id}})
        h.import_memories([forged])
        with pytest.raises(ValidationError) as exc:
            h.decompress(forged.id)
        assert exc.value.field == "memory_id" and other.id in exc.value.problem
        assert (
            h.get(forged.id).content == "imported note" and h.get(other.id).content == "another memory's text"
        )


@pytest.mark.parametrize(
    "payload",
    [
        {"rows": [{"id": i, "text": PROSE[i % len(PROSE)]} for i in range(30)]},
        [PROSE * 3],
        {"note": " ".join(PROSE * 4)},
    ],
)
def test_json_content_is_never_compressed(payload: Any) -> None:
    budgets = TierBudgets(working_tokens=50, working_items=1, short_term_items=1, long_term_items=1)
    with open_harness(pager=PagerConfig(budgets=budgets)) as h:
        m = h.record(payload, session_id="s1", created_at=T0)
        assert m.content_type == "application/json"
        assert h.compress(m.id).content == m.content
        for i in range(6):  # push it down to the archive
            h.record(f"filler {i}", session_id="s1", created_at=T0)
            h.flush()  # a pager pass: each pushes the older memories one tier down
        after = h.get(m.id)
        assert after.tier is Tier.ARCHIVE
        assert after.content == m.content and "compression" not in after.metadata
        assert h.count(status="any") == 7  # no raw copy was made


def test_long_text_is_compressed_on_its_way_to_the_archive() -> None:
    budgets = TierBudgets(working_tokens=400, working_items=1, short_term_items=1, long_term_items=1)
    with open_harness(pager=PagerConfig(budgets=budgets)) as h:
        m = h.record(LONG, session_id="s1", kind="note", created_at=T0)
        for i in range(4):
            h.record(f"filler {i}", session_id="s1", kind="user_input", created_at=T0)
            h.flush()  # a pager pass: each pushes the older memories one tier down
        after = h.get(m.id)
        assert after.tier is Tier.ARCHIVE and "compression" in after.metadata
        assert h.get(after.metadata["compression"]["raw_id"]).content == LONG
        ev = [e for e in h.events(memory_id=m.id) if e.kind == "compress"][-1]
        assert ev.data["reason"].startswith("archived")
        assert h.decompress(m.id).content == LONG


def test_raw_copy_cannot_be_forgotten_while_referenced() -> None:
    with open_harness() as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        raw_id = h.compress(m.id).metadata["compression"]["raw_id"]
        assert referenced_raw(h.store, h.get(raw_id)) == [m.id]
        with pytest.raises(ValidationError) as err:
            h.forget(raw_id)
        assert err.value.field == "memory_id"
        assert h.get(raw_id).content == LONG
        h.decompress(m.id)
        assert referenced_raw(h.store, h.get(raw_id)) == []
        h.forget(raw_id)
        assert h.count(status="any") == 1 and h.get(m.id).content == LONG


# ---- collapse a task -------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", [None, "", "  "])
def test_collapse_task_names_its_task(task: object) -> None:
    """collapse_task(None) merged the steps of every task (and of none) into one summary."""
    with open_harness() as h:
        for t in ("a", "b", None):
            h.record(f"step of {t}", task_id=t, state="intermediate")
        with pytest.raises(ValidationError) as exc:
            h.collapse_task(task)  # type: ignore[arg-type]
        assert exc.value.field == "task_id"
        assert h.count(state="intermediate") == 3  # nothing archived


def test_collapse_task_summarizes_intermediates_into_one_success() -> None:
    with open_harness() as h:
        steps = [
            h.record(
                text,
                task_id="t1",
                session_id="s1",
                state="intermediate",
                kind="llm_thought",
                created_at=T0 + timedelta(minutes=i),
            )
            for i, text in enumerate(
                [
                    "Looking at the failing build first.",
                    "Build 7 failed at step 3 with exit code 137.",
                    "Exit code 137 means the container ran out of memory.",
                    "Raising the memory limit to 4096 MB should fix it.",
                ]
            )
        ]
        done = h.record(
            "Raised the limit; build 8 passed.",
            task_id="t1",
            session_id="s1",
            state="success",
            created_at=T0 + timedelta(minutes=9),
        )
        other = h.record(
            "Unrelated thought.", task_id="t2", session_id="s1", state="intermediate", created_at=T0
        )
        summary = h.collapse_task("t1")
        assert summary is not None
        assert summary.kind is Kind.SUMMARY and summary.state is State.SUCCESS and summary.task_id == "t1"
        assert summary.status is Status.ACTIVE
        targets = [link.target for link in summary.links if link.type is LinkType.SUMMARIZES]
        assert targets == [m.id for m in steps]
        assert summary.metadata["collapsed"] == 4
        assert "137" in summary.content and "4096" in summary.content  # exact numbers survive
        for m in steps:
            after = h.get(m.id)  # archived, not deleted, content untouched
            assert after.status is Status.ARCHIVED and after.tier is Tier.ARCHIVE
            assert after.content == m.content
        assert h.get(done.id).status is Status.ACTIVE and h.get(other.id).status is Status.ACTIVE
        assert {m.id for m in h.list(task_id="t1")} == {summary.id, done.id}
        ev = [e for e in h.events(limit=10**6) if e.kind == "collapse"][-1]
        assert ev.memory_id == summary.id and ev.data["steps"] == [m.id for m in steps]
        assert h.collapse_task("t1") is None  # nothing left to collapse
        assert h.count(status="any", task_id="t1") == 6
        edges = h.store.edges([summary.id])
        assert {(e.source, e.type, e.target) for e in edges} >= {
            (summary.id, LinkType.SUMMARIZES, m.id) for m in steps
        }
        assert h.store.list(Filters.of(task_id="t1", state="intermediate", status="active")) == []


def test_a_collapse_that_fails_part_way_archives_no_step_and_its_retry_keeps_one_summary(
    tmp_path: Path,
) -> None:
    """The steps are archived together, with the ``collapse`` event: a failure leaves every step active
    (it left some archived, and a retry summarised only the rest). The summary stored before the failure
    is the one the retry archives them under: one summary of the task, not two."""
    with Harness.open(tmp_path / "h.db", embedder=None, clock=lambda: T0) as h:
        steps = [
            h.record(text, task_id="t1", session_id="s1", state="intermediate", created_at=T0)
            for text in ("Build 7 failed at step 3.", "Exit code 137: out of memory.", "Raise the limit.")
        ]
        with events_refused(tmp_path / "h.db", "collapse"), pytest.raises(StoreError):
            h.collapse_task("t1")
        assert {h.get(m.id).status for m in steps} == {Status.ACTIVE}
        [first] = h.list(task_id="t1", kind="summary")
        summary = h.collapse_task("t1")
        assert summary is not None and summary.id == first.id
        assert h.list(task_id="t1", kind="summary", status="any") == [summary]
        assert {h.get(m.id).status for m in steps} == {Status.ARCHIVED}
        [collapsed] = [e for e in h.events() if e.kind == "collapse"]
        assert collapsed.memory_id == summary.id and collapsed.data["steps"] == [m.id for m in steps]


# ---- the LLM summarizer against a real server -------------------------------------------------------------
SUMMARY = "Short summary: 1240 euros, build 7."


@pytest.fixture
def llm() -> Iterator[ChatReplay]:
    with ChatReplay() as server:
        yield server


def test_llm_summarizer_against_a_real_server(llm: ChatReplay) -> None:
    llm.script = [SUMMARY]
    summarizer = LLMSummarizer(base_url=llm.v1, model="tiny-model", api_key="sk-test", timeout_s=10)
    with open_harness(summarizer=summarizer) as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        c = h.compress(m.id)
        assert c.content == SUMMARY
        assert c.metadata["compression"]["method"] == "llm"
        (req,) = llm.requests
        assert req["path"] == "/v1/chat/completions"
        assert req["headers"]["Authorization"] == "Bearer sk-test"
        body = req["json"]
        assert body["model"] == "tiny-model"
        assert [msg["role"] for msg in body["messages"]] == ["user"]
        assert LONG in body["messages"][0]["content"]
        assert h.decompress(m.id).content == LONG


# ---- the LLM summarizer fails safe: every misbehaving endpoint falls back to the extractive summary -------
def summarizer_for(server: ChatReplay, timeout_s: float = 1.0) -> LLMSummarizer:
    return LLMSummarizer(base_url=server.v1, model="tiny-model", api_key="sk-test", timeout_s=timeout_s)


def fallbacks(h: Harness, memory_id: str | None = None) -> list[Event]:
    return [e for e in h.events(limit=10_000, memory_id=memory_id) if e.kind == EventKind.SUMMARIZER_FALLBACK]


def no_reply_text_logged(h: Harness) -> None:
    """Fallback events say why, never what: no text of the memory nor of the reply."""
    for e in fallbacks(h):
        logged = json.dumps(e.data)
        assert DIGITLESS_REPLY not in logged and "SURPRISE" not in logged and PROSE[0] not in logged
        assert set(e.data) == {"reason", "model", "detail", "used"}


@pytest.mark.parametrize("how", MISBEHAVIOURS, ids=lambda m: m.name)
def test_compress_falls_back_to_extractive_when_the_endpoint_misbehaves(
    llm: ChatReplay, how: Misbehaviour
) -> None:
    how.apply(llm)
    with open_harness(summarizer=summarizer_for(llm)) as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        c = h.compress(m.id)
        info = c.metadata["compression"]
        assert info["method"] == "extractive"
        assert c.content == ExtractiveSummarizer().summarize(LONG, int(len(LONG) * 0.4))
        assert c.content != "None" and all(s in c.content for s in NUMERIC)
        (compressed,) = [e for e in h.events(memory_id=m.id) if e.kind == EventKind.COMPRESS]
        assert compressed.data["method"] == "extractive"
        (fallback,) = fallbacks(h, m.id)
        assert fallback.data["reason"] == how.reason and fallback.data["model"] == "tiny-model"
        assert fallback.data["detail"].startswith(how.detail) and fallback.data["used"] == "extractive"
        no_reply_text_logged(h)
        assert len(llm.requests) == 1
        assert h.decompress(m.id).content == LONG


@pytest.mark.parametrize("how", [m for m in MISBEHAVIOURS if m.name != "hang"], ids=lambda m: m.name)
def test_collapse_task_falls_back_to_extractive_when_the_endpoint_misbehaves(
    llm: ChatReplay, how: Misbehaviour
) -> None:
    how.apply(llm)
    texts = [
        "Looking at the failing build first.",
        "Build 7 failed at step 3 with exit code 137.",
        "Exit code 137 means the container ran out of memory.",
        "Raising the memory limit to 4096 MB should fix it.",
    ]
    with open_harness(summarizer=summarizer_for(llm)) as h:
        for i, text in enumerate(texts):
            at = T0 + timedelta(minutes=i)
            h.record(text, task_id="t1", session_id="s1", state="intermediate", created_at=at)
        summary = h.collapse_task("t1")
        assert summary is not None
        joined = "\n".join(texts)
        extractive = ExtractiveSummarizer().summarize(joined, max(200, len(joined) // 3))
        assert summary.content == f"Task t1 summary (4 steps): {extractive}"
        assert "None" not in summary.content and "137" in summary.content and "4096" in summary.content
        (fallback,) = fallbacks(h)
        assert fallback.memory_id == summary.id and fallback.data["reason"] == how.reason
        assert fallback.data["model"] == "tiny-model"
        no_reply_text_logged(h)
        assert len(llm.requests) == 1


def record_expiring(h: Harness, n: int, tag: str, at: datetime) -> list[str]:
    """``n`` distinct memories long enough to be compressed on their way to the archive, expiring in an
    hour (no session: no tier budget moves them before that)."""
    texts = [f"Report {tag}-{i}. " + LONG for i in range(n)]
    return [h.record(t, expires_at=at + timedelta(hours=1), created_at=at).id for t in texts]


def test_tick_survives_a_malformed_endpoint_and_compresses_every_memory(llm: ChatReplay) -> None:
    llm.fault = Fault.GARBAGE_STATUS_LINE
    now = [T0]
    with Harness.open("memory://", embedder=None, clock=lambda: now[0], summarizer=summarizer_for(llm)) as h:
        ids = record_expiring(h, 3, "a", T0)
        now[0] = T0 + timedelta(hours=2)
        assert h.tick()["expired"] == 3  # the tick runs to its end: no raw http.client error escapes
        for memory_id in ids:
            after = h.get(memory_id)
            assert after.tier is Tier.ARCHIVE and after.status is Status.EXPIRED
            assert after.metadata["compression"]["method"] == "extractive"
            assert [e.data["reason"] for e in fallbacks(h, memory_id)] == ["malformed_reply"]
        assert len(llm.requests) == 3


def test_tick_bounds_its_wait_on_a_hung_endpoint(llm: ChatReplay) -> None:
    """Each call waits its 0.5 s timeout; the pass may wait 1 s on the endpoint in all, so the first two
    memories time out and the other three are summarized extractively without calling it; the next tick is
    a new pass with a fresh budget."""
    llm.fault = Fault.HANG
    now = [T0]
    with Harness.open(
        "memory://",
        embedder=None,
        clock=lambda: now[0],
        summarizer=summarizer_for(llm, timeout_s=0.5),
        pager=PagerConfig(endpoint_budget_s=1.0),
    ) as h:
        ids = record_expiring(h, 5, "a", T0)
        now[0] = T0 + timedelta(hours=2)
        assert h.tick()["expired"] == 5
        assert len(llm.requests) == 2  # not 5: the pass's budget was spent after two timeouts
        reasons = [e.data["reason"] for memory_id in ids for e in fallbacks(h, memory_id)]
        assert sorted(reasons) == ["budget_spent"] * 3 + ["timeout"] * 2
        for memory_id in ids:
            after = h.get(memory_id)
            assert after.tier is Tier.ARCHIVE and after.metadata["compression"]["method"] == "extractive"
        later = record_expiring(h, 3, "b", now[0])
        now[0] += timedelta(hours=2)
        assert h.tick()["expired"] == 3
        assert len(llm.requests) == 4  # a fresh budget: two more calls, then extractive again
        assert all("compression" in h.get(memory_id).metadata for memory_id in later)


def test_a_policy_move_outside_tick_is_one_pass_too(llm: ChatReplay) -> None:
    """One enforce that archives several long memories of a session shares one budget, like a tick."""
    llm.fault = Fault.HANG
    with open_harness(summarizer=summarizer_for(llm, timeout_s=0.5)) as h:
        ids = [h.record(f"Report c-{i}. " + LONG, session_id="s1", created_at=T0).id for i in range(4)]
        assert all(h.get(i).tier is Tier.WORKING for i in ids)
        tight = TierBudgets(working_tokens=None, working_items=1, short_term_items=1, long_term_items=1)
        h.pager.config = PagerConfig(budgets=tight, endpoint_budget_s=0.5)
        h.pager.enforce(h.tenant, "s1", T0)  # working -> short-term -> long-term -> archive: three of them
        archived = [i for i in ids if h.get(i).tier is Tier.ARCHIVE]
        assert len(archived) == 3
        assert len(llm.requests) == 1  # one timeout spends the pass's budget; the others are not called
        assert all(h.get(i).metadata["compression"]["method"] == "extractive" for i in archived)
        assert sorted(e.data["reason"] for i in archived for e in fallbacks(h, i)) == [
            "budget_spent",
            "budget_spent",
            "timeout",
        ]


def test_the_summary_is_kept_when_the_input_has_no_numbers(llm: ChatReplay) -> None:
    """The numbers check only rejects a summary that loses the numbers the input had."""
    llm.script = [DIGITLESS_REPLY, "Kept: 1240 euros."]
    summarizer = summarizer_for(llm)
    prose = " ".join(PROSE)
    assert summarizer.summary(prose, 100) == Summary(DIGITLESS_REPLY, "llm")
    assert summarizer.summary(LONG, 100) == Summary("Kept: 1240 euros.", "llm")  # one number is enough


def test_llm_summarizer_unreachable_or_blank(llm: ChatReplay) -> None:
    llm.script = ["   "]
    blank = summarizer_for(llm).summary(LONG, 100)
    assert blank.text == ExtractiveSummarizer().summarize(LONG, 100) and blank.method == "extractive"
    assert blank.fallback == Fallback(FailureReason.EMPTY_REPLY, "tiny-model", "content is empty")
    nobody = LLMSummarizer(base_url="http://127.0.0.1:9/v1", model="tiny", timeout_s=2)  # nothing on port 9
    assert nobody.summarize(LONG, 100) == ExtractiveSummarizer().summarize(LONG, 100)
    unreachable = nobody.summary(LONG, 100).fallback
    assert unreachable is not None and unreachable.reason is FailureReason.UNREACHABLE


def test_an_endpoint_error_does_not_fail_the_record_that_archives(llm: ChatReplay) -> None:
    llm.status = 500
    budgets = TierBudgets(working_tokens=400, working_items=1, short_term_items=1, long_term_items=1)
    with open_harness(summarizer=summarizer_for(llm), pager=PagerConfig(budgets=budgets)) as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        for i in range(4):  # each of these records pushes older memories down; LONG reaches the archive
            h.record(f"filler {i}", session_id="s1", kind="user_input", created_at=T0)
            h.flush()  # a pager pass: each pushes the older memories one tier down
        after = h.get(m.id)
        assert after.tier is Tier.ARCHIVE and after.metadata["compression"]["method"] == "extractive"
        assert h.decompress(m.id).content == LONG
        assert llm.requests, "the summarizer was asked"
        assert [e.data["detail"] for e in fallbacks(h, m.id)] == ["HTTP 500"]


@dataclass(frozen=True)
class BrokenSummarizer:
    """A summarizer of the user's own that fails: the pager leaves the memory uncompressed and says why."""

    error: Exception
    name: str = "broken"

    def summarize(self, text: str, max_chars: int) -> str:
        raise self.error


@pytest.mark.parametrize(
    "error",
    # anything but SummarizerError failed the pager's pass: four memories stayed over budget, due for ever
    [SummarizerError("the team's summarizer is down"), RuntimeError("the team's summarizer is down")],
    ids=["SummarizerError", "RuntimeError"],
)
def test_a_failing_summarizer_of_ones_own_leaves_the_memory_uncompressed(error: Exception) -> None:
    budgets = TierBudgets(working_tokens=400, working_items=1, short_term_items=1, long_term_items=1)
    with open_harness(summarizer=BrokenSummarizer(error), pager=PagerConfig(budgets=budgets)) as h:
        m = h.record(LONG, session_id="s1", created_at=T0)
        for i in range(4):
            h.record(f"filler {i}", session_id="s1", kind="user_input", created_at=T0)
            h.flush()  # a pager pass: each pushes the older memories one tier down
        after = h.get(m.id)
        assert after.tier is Tier.ARCHIVE and after.content == LONG and "compression" not in after.metadata
        errors = [e for e in h.events(memory_id=m.id) if e.kind == EventKind.COMPRESS_ERROR]
        assert errors and "down" in errors[-1].data["error"]
        assert not h.working.due()  # every pass finished: no session left over its budget
        with pytest.raises(SummarizerError):  # asked directly, the caller hears it as a ClawVM error
            h.compress(h.record(LONG + " again", session_id="s2").id)


def test_entities_of_a_summary_skip_words_capitalised_by_a_sentence_start() -> None:
    from clawvm.vm.compress import entities

    text = "The payment failed at Acme Corp. Most retries used ERR_42 and the Stripe API. Then Caroline left."
    assert entities(text) == ["Acme Corp", "ERR_42", "Stripe API", "Caroline"]
    assert "The" not in entities("The Bank of America said no.")


def test_a_memory_stored_before_the_limits_can_be_compressed_and_revised() -> None:
    """Its raw copy and its revision were built as new input: a memory with 70 tags, written before the
    limit, could not be archived (the compression failed after the archive move had committed)."""
    from clawvm.core.model import STORED, Memory

    prose = [
        "We talked about the weather and the long queue at the coffee shop.",
        "Nobody remembered where the old dashboards were kept.",
        "It rained all afternoon so the team stayed inside and planned.",
        "Everyone agreed that the retry policy needs a maximum delay.",
    ]
    text = " ".join(prose * 6)
    with Harness.open("memory://", embedder=None) as h:
        legacy = Memory.model_validate(
            {
                "content": text,
                "session_id": "s" * 300,
                "tags": [f"t{i}" for i in range(70)],
                "token_count": 120,
            },
            context=STORED,
        )
        engine_of(h).put(legacy)  # as an older version stored it
        small = h.compress(legacy.id)
        assert len(small.content) < len(text) and len(small.tags) == 70
        assert h.decompress(legacy.id).content == text
        assert h.revise(legacy.id, content="the rollout is done").tags == legacy.tags


def test_a_compress_waiting_on_its_endpoint_holds_up_no_other_rewrite(llm: ChatReplay) -> None:
    """compress() waited on the endpoint inside the turn every rewriting call takes: an update or a
    context() of another session waited with it, for as long as the endpoint took."""
    llm.fault = Fault.HANG
    with open_harness(summarizer=summarizer_for(llm, timeout_s=30)) as h:
        slow = h.record(LONG, session_id="s1")
        other = h.record("deploy notes", session_id="s2")
        compressing = threading.Thread(target=h.compress, args=(slow.id,))
        compressing.start()
        while not llm.requests:  # until the compress waits on the endpoint
            assert compressing.is_alive()
            time.sleep(0.01)
        assert h.update(other.id, tags=["ops"]).tags == ["ops"]
        assert "deploy notes" in h.context("deploy", session_id="s2").text
        assert compressing.is_alive()  # all of that while the compress still waits on its endpoint
        llm.stopping.set()  # the endpoint hangs up: the compress falls back to the extractive summary
        compressing.join(60)
        assert h.get(slow.id).metadata["compression"]["method"] == "extractive"


def test_an_llm_helper_hides_its_key_and_refuses_a_bad_setting_where_it_is_made() -> None:
    """repr() printed the api_key; a base_url without a scheme, a blank model or a timeout of 0 were taken
    and every call then failed as the endpoint's fault ("unreachable", "malformed_reply")."""
    summarizer = LLMSummarizer(base_url="http://127.0.0.1:9/v1", model="tiny", api_key="sk-secret-123")
    assert "sk-secret-123" not in repr(summarizer)
    good = {"base_url": "http://127.0.0.1:9/v1", "model": "tiny", "timeout_s": 5.0}
    for bad, field in (
        ({"base_url": "127.0.0.1:9/v1"}, "base_url"),
        ({"model": None}, "model"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": "5"}, "timeout_s"),
        ({"api_key": 5}, "api_key"),
    ):
        with pytest.raises(ValidationError) as exc:
            LLMSummarizer(**{**good, **bad})
        assert exc.value.field == field


@pytest.mark.parametrize("fault", [Fault.TRICKLE, Fault.TRICKLE_HEADERS], ids=lambda f: f.value)
def test_a_reply_trickled_past_the_timeout_is_hung_up_on(llm: ChatReplay, fault: Fault) -> None:
    """The timeout bounded each wait on the socket, not the call: a server sending its headers (or its
    body) a byte at a time kept the call open until it chose to stop (here 10 s), with timeout_s=1."""
    llm.fault, llm.hang_s = fault, 10.0
    summary = summarizer_for(llm, timeout_s=1.0).summary(LONG, 200)
    assert summary.fallback is not None and summary.fallback.reason == "timeout"
    assert llm.hung_up_on.wait(10)  # the client shut the connection while the server was still sending


def test_chinese_and_japanese_text_is_cut_at_its_own_sentence_marks() -> None:
    """。！？ end a sentence with no space after them: a Chinese or Japanese memory was one sentence to
    the summary, and compress() gave it back whole (the pager archived it at full size)."""
    zh = "".join(f"团队审查了{w}模块，没有发现异常情况。" for w in "甲乙丙丁戊己庚辛壬癸子丑")
    zh += "结论：可以发布！"
    ja = "".join(f"チームは{w}モジュールを確認しました。" for w in "ABCDEFGHIJ") + "結論：リリースできます？"
    for text in (zh, ja):
        summary = ExtractiveSummarizer().summarize(text, len(text) // 3)
        sentences = summary.split("\n")
        assert len(sentences) > 1 and len(summary) <= len(text) // 3
        assert all(s in text and s[-1] in "。！？" for s in sentences)  # whole sentences, as written
    with Harness.open("memory://", embedder=None) as h:
        m = h.record(zh)
        short = h.compress(m.id)
        assert short.token_count < m.token_count // 2
        assert h.decompress(m.id).content == zh


@pytest.mark.parametrize(
    "text",
    [
        "Сервер платежей отвечает быстро. Нужно перенести шарды до полуночи. " * 8,  # Cyrillic
        "Ölpläne sind fertig. " + "Überprüfen Sie die Knoten. Äpfel sind grün. " * 8,  # capitals past ASCII
        "ok so the plan is simple. " + "drain the node and migrate the shards. then verify. " * 8,  # chat
        "सर्वर धीमा है। हमें शार्ड्स को स्थानांतरित करना होगा। " * 8,  # the Devanagari full stop
    ],
)
def test_text_whose_sentences_do_not_start_with_an_ascii_capital_is_compressed(text: str) -> None:
    """A sentence ended only before an ASCII capital: such text was one sentence, longer than any summary,
    so the summary was empty and compress() (and the pager's archive moves) kept it whole."""
    summary = ExtractiveSummarizer().summarize(text, len(text) // 3)
    assert summary and all(line in text for line in summary.split("\n"))
    with Harness.open("memory://", embedder=None) as h:
        m = h.record(text)
        assert h.compress(m.id).token_count < m.token_count // 2
        assert h.decompress(m.id).content == text
