"""The token counter (its ASCII path must count exactly what the model's tokenizer counts) and the
embedding worker's stop."""

from __future__ import annotations

import concurrent.futures.thread
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm import EmbedderError, Harness, StateConflictError, ValidationError
from clawvm.core.embed import (
    _LIVE_WORKERS,
    EmbedWorker,
    MiniLMEmbedder,
    OpenAIEmbedder,
    QueryEmbeddings,
    count_tokens,
    unreadable_tokens,
    wordpiece,
)
from loopback import EmbeddingsReplay


def tokenizer_count(text: str) -> int:
    """The model tokenizer's count, where a word it reads as one unknown token counts as prompt budgets
    count it: a token per three ASCII characters and one per other character."""
    encoding = wordpiece().encode(text, add_special_tokens=False)
    return sum(
        unreadable_tokens(text[a:b]) if token == "[UNK]" and text[a:b] != "[UNK]" else 1
        for token, (a, b) in zip(encoding.tokens, encoding.offsets, strict=True)
    )


ascii_text = st.text(alphabet=st.characters(max_codepoint=127), max_size=400)
wordy_text = st.lists(
    st.sampled_from(
        [
            "the", "Caroline", "LGBTQ", "unbelievably", "x2", "2023-05-08", "don't", "e-mail", "?!", "_id",
            "\t", "\n", "[MASK]", "[CLS]", "[", "]",
        ]
    ),
    max_size=60,
).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(ascii_text, wordy_text))
def test_ascii_text_is_counted_like_the_tokenizer(text: str) -> None:
    assert count_tokens(text) == tokenizer_count(text)


def test_edge_cases_of_the_ascii_path() -> None:
    for text in [
        "",
        "   ",
        "a\x00b\x0bc\x1fd\x7fe",  # control characters vanish (the words around them join)
        "tab\tnew\nline\rend",  # these three are spaces
        "w" * 101 + " ok",  # a word over WordPiece's 100 characters is one unknown token
        "Hello, WORLD... (really)? [yes] {no} ~_~ `code` #tag @me 50% $5 a+b=c",
        "special tokens are one token each: [CLS] x[MASK]y [SEP][PAD] [UNK], but not [cls] or [ MASK ]",
    ]:
        assert count_tokens(text) == tokenizer_count(text), repr(text)


def test_a_word_the_model_cannot_read_counts_by_its_characters_not_as_one_token() -> None:
    """A budget counted in the embedding model's tokens would take a hex dump, a run of emoji or a Thai
    sentence (one unknown token each to WordPiece) as one token: a 40-token context held 19,000
    characters."""
    assert count_tokens("deadbeef" * 2000) == 16_000 // 3 + 1
    assert count_tokens("🚀" * 300) == 300
    thai = "เมื่อวานเซิร์ฟเวอร์ล่ม"  # "yesterday the server went down", no spaces
    assert count_tokens(thai * 50) == len(thai) * 50
    assert count_tokens("🎉") == count_tokens("[UNK]") == 1
    assert count_tokens("ok " + "🚀" * 4 + " ok") == 2 + 4


def test_other_text_takes_the_tokenizer_path() -> None:
    for text in ["Café déjà vu", "東京で会いましょう", "smart “quotes” — and…", "emoji 🎉 party"]:
        assert count_tokens(text) == tokenizer_count(text)
    assert count_tokens("Café") == count_tokens("Cafe")  # accents are stripped, as the tokenizer does


def test_a_stopped_worker_wakes_nothing_and_flush_embeds_in_the_callers_thread(
    embedder: MiniLMEmbedder,
) -> None:
    """What the exit hook leaves behind: a harness whose worker is stopped still flushes (and closes)."""
    with Harness.open("memory://", embedder=None) as h:
        worker = EmbedWorker(embedder, h.store.unembedded, h.writer.attach_vectors)
        worker.start()
        assert worker in _LIVE_WORKERS  # what the exit hook stops
        worker.stop()
        worker.stop()  # idempotent
        assert worker not in _LIVE_WORKERS
        memory = h.record("recorded after the worker stopped")
        assert worker.notify() is False
        assert h.store.vectors_of([memory.id]) == {}
        worker.flush()
        assert set(h.store.vectors_of([memory.id])) == {memory.id}


class _FailsOnce:
    """A model whose first batch fails (the store it writes to was briefly down, say), then works."""

    name = "fails-once"
    dim = 384

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("connection reset")
        return np.ones((len(texts), self.dim), dtype=np.float32) / 2

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


def test_a_failure_the_worker_has_recovered_from_is_not_raised_by_flush() -> None:
    """flush() raised the first batch's failure though a later pass had embedded everything."""
    model = _FailsOnce()
    with Harness.open("memory://", embedder=None) as h:
        worker = EmbedWorker(model, h.store.unembedded, h.writer.attach_vectors, poll_s=0.05)
        worker.start()
        try:
            memory = h.record("recorded while the store was briefly down")
            worker.notify()
            deadline = time.monotonic() + 30
            while not h.store.vectors_of([memory.id]) and time.monotonic() < deadline:
                time.sleep(0.02)  # the worker retries on its own, polling
            time.sleep(0.2)  # its pass ends
            worker.flush(timeout=30)  # nothing to raise: the backlog is embedded
            assert model.calls >= 2 and set(h.store.vectors_of([memory.id])) == {memory.id}
        finally:
            worker.stop()


class SlowLookup:
    """Vectors after a model's time (2 ms): worth embedding beside the caller."""

    name = "slow-lookup"
    dim = 4

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.ones((len(texts), self.dim), dtype=np.float32) / 2

    def embed_query(self, text: str) -> np.ndarray:
        time.sleep(0.002)
        vector: np.ndarray = self.embed([text])[0]
        return vector


def test_query_embeddings_go_on_in_place_once_the_interpreter_is_exiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recall on a daemon thread while the script ends: the interpreter's exit shuts every thread pool
    (concurrent.futures sets this flag then), and a submit would raise RuntimeError into the recall."""
    queries = QueryEmbeddings(SlowLookup())
    try:
        queries.vector("measured in place")
        assert isinstance(queries.vector("beside the caller"), Future)
        monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)
        vector = queries.vector("while exiting")
        assert isinstance(vector, np.ndarray) and vector.shape == (4,)
        assert isinstance(queries.vector("and after"), np.ndarray)  # no new pool either
    finally:
        monkeypatch.undo()
        queries.close()


# ---- an OpenAI-compatible embeddings endpoint, over a real socket --------------------------------------
def test_an_endpoint_answering_nan_is_the_embedders_fault_not_the_callers() -> None:
    """NaN from the endpoint raised ValidationError(field="vector", "pass ... finite floats"): a 422 that
    blamed the caller for the endpoint's answer."""
    with EmbeddingsReplay(lambda text: [float("nan")] * 8) as server:
        embedder = OpenAIEmbedder(server.v1, "tiny", 8, api_key="sk-test", timeout_s=5)
        with pytest.raises(EmbedderError, match="NaN"):
            embedder.embed(["hello"])
        with Harness.open("memory://", embedder=embedder) as h:
            with pytest.raises(EmbedderError):
                h.recall("hello")
            h.close(wait=False)  # what it left unembedded, the next open embeds


def test_close_closes_the_harness_even_when_the_embedder_fails() -> None:
    """close() raised from the worker's last flush before stopping it or closing the store: the harness
    stayed open (later records were accepted) and the embedding thread ran on."""
    with EmbeddingsReplay(lambda text: [1.0] * 8) as server:
        server.status = 500
        h = Harness.open("memory://", embedder=OpenAIEmbedder(server.v1, "tiny", 8, timeout_s=5))
        h.record("a memory the endpoint cannot embed")
        with pytest.raises(EmbedderError):
            h.close()
        with pytest.raises(StateConflictError):
            h.record("after close")
        assert not [t for t in threading.enumerate() if t.name == "clawvm-embed" and t.is_alive()]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"base_url": "127.0.0.1:8000/v1"}, "base_url"),  # no scheme: every call failed as "unreachable"
        ({"base_url": ""}, "base_url"),
        ({"model": None}, "model"),
        ({"model": " "}, "model"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"timeout_s": "5"}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"dim": 0}, "dim"),
    ],
)
def test_an_embeddings_endpoints_bad_setting_is_refused_where_it_is_made(
    settings: dict[str, Any], field: str
) -> None:
    given = {"base_url": "http://127.0.0.1:9/v1", "model": "tiny", "dim": 8, "timeout_s": 5.0, **settings}
    with pytest.raises(ValidationError) as exc:
        OpenAIEmbedder(**given)
    assert exc.value.field == field


class _NoDirectionFor:
    """A model that answers one text with a zero vector (and another with NaN): stores refuse both."""

    name = "no-direction"
    dim = 384

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.seen += texts
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        out[:, 0] = 1.0
        for n, text in enumerate(texts):
            if text.startswith("nothing"):
                out[n] = 0.0
            elif text == "broken":
                out[n] = np.nan
        return out

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


def test_a_text_the_model_gives_no_direction_is_left_unembedded_and_the_backlog_goes_on() -> None:
    """A batch holding a zero (or NaN) vector was refused whole by set_vectors, read again as pending
    on every pass: the backlog stopped at that memory for good. It is left out, and embedded once."""
    model = _NoDirectionFor()
    with Harness.open("memory://", embedder=None) as h:
        ms = [h.record(text) for text in ("before", "nothing", "broken", "after")]
        worker = EmbedWorker(model, h.store.unembedded, h.writer.attach_vectors, batch_size=2)
        worker.start()
        try:
            worker.flush(timeout=30)
            worker.flush(timeout=30)  # a second pass embeds neither again
            assert set(h.store.vectors_of([m.id for m in ms])) == {ms[0].id, ms[3].id}
            assert {u.id for u in h.store.unembedded(10)} == {ms[1].id, ms[2].id}
            assert sorted(model.seen) == ["after", "before", "broken", "nothing"]
        finally:
            worker.stop()


def test_a_pass_goes_past_a_window_of_texts_without_a_direction(monkeypatch: pytest.MonkeyPatch) -> None:
    """A look-ahead window whose texts all came back without a direction ended the pass: flush returned
    with the memories behind it unembedded. Below the bound the pass goes on to them, and a later pass
    feeds the model none of those texts again."""
    monkeypatch.setattr("clawvm.core.embed.UNDIRECTED_KEPT", 16)
    model = _NoDirectionFor()
    with Harness.open("memory://", embedder=None) as h:
        for n in range(10):
            h.record(f"nothing {n}")
        good = [h.record(f"good {n}").id for n in range(3)]
        worker = EmbedWorker(model, h.store.unembedded, h.writer.attach_vectors, batch_size=2)
        worker.start()
        try:
            worker.flush(timeout=30)  # the first window (2 x LOOKAHEAD) holds only texts without one
            assert set(h.store.vectors_of(good)) == set(good) and len(model.seen) == 13
            worker.flush(timeout=30)
            assert len(model.seen) == 13 and len(h.store.unembedded(20)) == 10
        finally:
            worker.stop()


def test_a_model_that_gives_too_many_texts_no_direction_is_taken_for_broken(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the texts it remembers, the worker forgot some and embedded them again on every pass: they filled
    the look-ahead window, the model was fed them over and over and the memories behind were never reached.
    Now it concludes the model is broken: it embeds nothing more (a pass returns at once), every flush raises
    saying so and what to do, an error is logged once; the backlog stays, and lexical search finds it."""
    monkeypatch.setattr("clawvm.core.embed.UNDIRECTED_KEPT", 4)
    model = _NoDirectionFor()
    h = Harness.open("memory://", embedder=model)
    try:
        with caplog.at_level(logging.ERROR, logger="clawvm.core.embed"):
            for n in range(150):
                h.record(f"nothing {n}")
            # longer than every text before them: the worker, which embeds a window's texts shortest first,
            # reaches them last however far the records had got when its first pass began (as "good n",
            # the shortest, they were embedded first whenever that pass read them all at once)
            good = [h.record(f"good memory number {n}").id for n in range(3)]
            with pytest.raises(EmbedderError, match="looks broken") as exc:
                h.flush(timeout=30)
            assert "Fix the model or its endpoint and restart" in str(exc.value)
            fed = len(model.seen)
            assert fed <= 4 + 64  # the texts remembered and the batch (64) that found one more: not all 150
            for _ in range(3):  # no pass embeds again, and every flush says why
                h.record("nothing more")
                with pytest.raises(EmbedderError, match="looks broken"):
                    h.flush(timeout=30)
            assert len(model.seen) == fed
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [str(exc.value)]
        assert not h.store.vectors_of(good) and len(h.store.unembedded(200)) == 156
        assert h.recall("good memory number 2", k=1)[0].memory.id == good[2]  # lexically: none has a vector
    finally:
        with pytest.raises(EmbedderError, match="looks broken"):
            h.close()
