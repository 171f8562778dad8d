"""Analyzer and BM25 index."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm.core.lexical import STOP_WORDS, Analyzer, BM25Params, LexicalIndex


@pytest.fixture(scope="module")
def analyzer() -> Analyzer:
    return Analyzer()


def test_analyzer_lowercases_drops_stop_words_and_stems(analyzer: Analyzer) -> None:
    assert analyzer.terms("The Running DOGS") == ["run", "dog"]
    assert analyzer.terms("running") == analyzer.terms("runs") == analyzer.terms("RUN") == ["run"]
    assert analyzer.terms("connection connected connecting") == ["connect"] * 3
    assert analyzer.terms("the and of to is it was") == []
    assert analyzer.terms("") == []
    assert {"the", "and", "a"} <= STOP_WORDS


def test_analyzer_splits_on_punctuation_and_keeps_numbers(analyzer: Analyzer) -> None:
    assert analyzer.terms("Deploy-failed: build07, exit=137") == ["deploy", "fail", "build07", "exit", "137"]
    assert analyzer.terms("the agent's agents") == ["agent", "agent"]


def test_analyzer_keeps_non_ascii_words(analyzer: Analyzer) -> None:
    assert analyzer.terms("Москва") != []
    assert analyzer.terms("Москва") == analyzer.terms("москва")
    assert analyzer.terms("café") != analyzer.terms("cafe")  # "é" is part of the word, not a separator
    assert len(analyzer.terms("über größe")) == 2
    assert analyzer.terms("東京") != []


def test_cjk_runs_become_letters_and_pairs_so_a_word_inside_a_sentence_matches(analyzer: Analyzer) -> None:
    assert analyzer.terms("吃苹果") == ["吃", "苹", "果", "吃苹", "苹果"]
    assert analyzer.terms("猫") == ["猫"]  # a lone letter is its own term
    assert set(analyzer.terms("苹果")) <= set(analyzer.terms("我喜欢吃苹果"))
    assert set(analyzer.terms("タワー")) <= set(analyzer.terms("東京タワーに行きました"))
    assert set(analyzer.terms("사과")) <= set(analyzer.terms("나는 사과를 좋아한다"))
    # other scripts around them keep their words, stop words and stems
    assert analyzer.terms("I love running in 北京") == ["love", "run", "北", "京", "北京"]
    assert analyzer.terms("Python编程") == ["python", "编", "程", "编程"]
    index = LexicalIndex(analyzer)
    index.add(0, "我喜欢吃苹果")
    index.add(1, "我喜欢喝茶")
    index.add(2, "apples are red")
    index.add(3, "苹果派和果汁")  # both letters of 苹果, and the pair: the word itself
    index.add(4, "果汁很好喝")  # one letter of it only
    assert [row for row, _ in index.search("苹果", 5)][:2] in ([0, 3], [3, 0])  # the pair ranks first
    assert [row for row, _ in index.search("苹果", 5)][-1] == 4
    # a one-letter word, and a word next to another particle than the query's (Japanese: no spaces)
    index.add(5, "猫が好きです")
    index.add(6, "犬が好きです")
    assert [row for row, _ in index.search("猫", 3)] == [5]
    assert [row for row, _ in index.search("猫はどこ", 3)] == [5]


def test_words_keep_their_marks_and_read_the_same_however_they_are_typed(analyzer: Analyzer) -> None:
    # a vowel sign or virama is part of its word (\w has no combining marks: words fell apart at each one)
    assert analyzer.terms("सर्वर") == ["सर्वर"]
    assert analyzer.terms("मुंबई में भारी वर्षा") == ["मुंबई", "में", "भारी", "वर्षा"]
    assert len(analyzer.terms("เมื่อวาน")) == 1
    # marks that writers add or leave out: the unmarked spelling is the same term
    assert analyzer.terms("مُحَمَّد") == analyzer.terms("محمد") == ["محمد"]
    assert analyzer.terms("שָׁלוֹם") == analyzer.terms("שלום")
    # full-width forms (CJK keyboards), ligatures, a dotted capital I
    assert analyzer.terms("ＡＰＩ ｓｅｒｖｅｒ returned ５０３") == analyzer.terms("API server returned 503")
    assert analyzer.terms("ﬁnance") == analyzer.terms("finance")
    assert analyzer.terms("İstanbul") == analyzer.terms("istanbul") == ["istanbul"]
    assert analyzer.terms("Straße") == analyzer.terms("strasse")  # case folded, not only lowered
    assert analyzer.terms("ΣΟΦΟΣ") == analyzer.terms("σοφος")  # a final sigma is a sigma
    assert analyzer.terms("ℌello") == analyzer.terms("hello")  # folded after NFKC, not before
    # each pictograph is a term; variation selectors and skin tones are not
    assert analyzer.terms("deploy ✅ done 🚀🚀") == ["deploy", "✅", "done", "🚀", "🚀"]
    assert analyzer.terms("✔️ 👍🏽") == analyzer.terms("✔ 👍")
    assert analyzer.terms("café") != analyzer.terms("cafe")  # Latin accents still tell words apart


def test_analyzer_is_thread_safe(analyzer: Analyzer) -> None:
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"running jumps {i} connected swimmers number{i}" for i in range(400)]
    expected = [analyzer.terms(t) for t in texts]
    fresh = Analyzer()
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(fresh.terms, texts)) == expected


def _index(docs: dict[int, str]) -> LexicalIndex:
    idx = LexicalIndex()
    for row, text in docs.items():
        idx.add(row, text)
    return idx


def _bm25(docs: dict[int, str], query: str, analyzer: Analyzer, p: BM25Params) -> dict[int, float]:
    """Textbook BM25 (the formula LexicalIndex documents), written independently."""
    toks = {r: analyzer.terms(t) for r, t in docs.items()}
    n = len(docs)
    avgdl = max(sum(len(t) for t in toks.values()) / n, 1.0)
    out: dict[int, float] = {}
    for term in dict.fromkeys(analyzer.terms(query)):
        df = sum(term in t for t in toks.values())
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for r, t in toks.items():
            tf = t.count(term)
            if tf:
                out[r] = out.get(r, 0.0) + idf * tf * (p.k1 + 1) / (
                    tf + p.k1 * (1 - p.b + p.b * len(t) / avgdl)
                )
    return out


def test_scores_match_the_bm25_formula(analyzer: Analyzer) -> None:
    docs = {
        0: "disk full on build server",
        1: "the build passed",
        2: "disk disk disk quota exceeded",
        3: "lunch was pizza",
        4: "server restarted after the disk was replaced and the build resumed",
    }
    idx = _index(docs)
    hits = idx.search("disk build", 10)
    want = _bm25(docs, "disk build", analyzer, idx.params)
    assert {r for r, _ in hits} == set(want)
    for r, s in hits:
        assert s == pytest.approx(want[r], rel=1e-5)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)


def test_rarer_term_wins() -> None:
    idx = _index({0: "apple pie recipe", 1: "apple juice", 2: "apple tart", 3: "zebra crossing sign"})
    hits = idx.search("apple zebra", 10)
    assert hits[0][0] == 3
    assert {r for r, _ in hits} == {0, 1, 2, 3}
    idx2 = _index({0: "apple banana", 1: "apple cherry", 2: "apple date"})
    assert idx2.search("apple cherry", 10)[0][0] == 1


def test_remove_drops_the_row_and_adjusts_document_frequencies(analyzer: Analyzer) -> None:
    docs = {0: "zebra stripes", 1: "zebra crossing", 2: "horse stable", 3: "zebra horse hybrid"}
    idx = _index(docs)
    idx.remove(1)
    assert len(idx) == 3
    hits = dict(idx.search("zebra crossing horse", 10))
    assert 1 not in hits
    remaining = {r: t for r, t in docs.items() if r != 1}
    fresh = dict(_index(remaining).search("zebra crossing horse", 10))
    assert hits.keys() == fresh.keys()
    for r in hits:
        assert hits[r] == pytest.approx(fresh[r], rel=1e-5)
    assert idx.search("crossing", 10) == []  # its only document is gone
    idx.remove(1)  # removing twice is harmless
    idx.remove(99)
    assert len(idx) == 3


def test_re_adding_a_row_replaces_its_text() -> None:
    idx = _index({0: "old words here", 1: "other document words"})
    idx.add(0, "brand new text")
    assert len(idx) == 2
    assert idx.search("old", 10) == []
    assert [r for r, _ in idx.search("brand", 10)] == [0]
    fresh = dict(_index({0: "brand new text", 1: "other document words"}).search("words text", 10))
    assert dict(idx.search("words text", 10)) == pytest.approx(fresh)


def test_allowed_mask_and_limit() -> None:
    idx = _index({r: f"common word number{r}" for r in range(20)})
    allowed = np.zeros(20, dtype=bool)
    allowed[[3, 7, 11]] = True
    assert {r for r, _ in idx.search("common", 100, allowed)} == {3, 7, 11}
    short = np.ones(5, dtype=bool)  # rows beyond the mask are not allowed
    assert {r for r, _ in idx.search("common", 100, short)} == {0, 1, 2, 3, 4}
    assert idx.search("common", 100, np.zeros(20, dtype=bool)) == []
    assert len(idx.search("common", 4)) == 4
    assert idx.search("common", 0) == []
    top = idx.search("common number7", 1)
    assert top[0][0] == 7


def test_empty_index_and_unknown_terms() -> None:
    idx = LexicalIndex()
    assert idx.search("anything", 10) == []
    idx.add(5, "sparse rows are fine")
    assert idx.search("nothing matches", 10) == []
    assert idx.search("sparse", 10)[0][0] == 5
    idx.add(5000, "a row far beyond the initial capacity")
    assert idx.search("capacity", 10)[0][0] == 5000


WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "remove"]),
            st.integers(0, 7),
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),
        ),
        max_size=30,
    ),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
)
def test_incremental_index_equals_a_fresh_build(ops: list[tuple[str, int, str]], query: str) -> None:
    idx = LexicalIndex()
    state: dict[int, str] = {}
    for op, row, text in ops:
        if op == "add":
            idx.add(row, text)
            state[row] = text
        else:
            idx.remove(row)
            state.pop(row, None)
    assert len(idx) == len(state)
    got = dict(idx.search(query, 100))
    want = dict(_index(state).search(query, 100)) if state else {}
    assert got.keys() == want.keys()
    for r in got:
        assert got[r] == pytest.approx(want[r], rel=1e-5)


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "remove"]),
            st.integers(0, 40),
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join),
        ),
        max_size=80,
    ),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
    picked=st.sets(st.integers(0, 40), max_size=20),
)
def test_scoring_a_few_rows_equals_scoring_all_bit_for_bit(
    ops: list[tuple[str, int, str]], query: str, picked: set[int]
) -> None:
    """The path recall takes for a narrow filter gives exactly the scores of the full path."""
    idx = LexicalIndex()
    for op, row, text in ops:
        if op == "add":
            idx.add(row, text)
        else:
            idx.remove(row)
    terms = idx.analyzer.terms(query)
    full = idx.scores(terms)
    rows = np.array(sorted(r for r in picked if full is not None and r < len(full)), dtype=np.int64)
    few = idx.scores_of(terms, rows)
    if full is None:
        assert few is None
    else:
        assert few is not None and np.array_equal(few, full[rows])
