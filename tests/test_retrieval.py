"""Recall as data: fusion properties, time expressions, presets, and every channel exercised for real
through a Harness (and the storage contract) on every engine."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm import ConfigError, Filters, Harness, Kind, Memory, Status
from clawvm.core.lexical import Analyzer
from clawvm.recall.retrieval import (
    CHANNELS,
    DEFAULT_PRESET,
    MAX_LENGTH_RATIO,
    PRESETS,
    RecallConfig,
    _best_first,
    fuse,
    length_factors,
    named_authors,
    preset,
    run_recall,
    strip_authors,
    time_expressions,
    time_match,
)
from clawvm.store import CandidateInfo, Query, SQLiteStore, Store
from engines import harness_target

# ---- fuse -------------------------------------------------------------------------------------------
ids = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
hit_lists = st.lists(
    st.tuples(ids, st.floats(-1e6, 1e6, allow_nan=False)), max_size=12, unique_by=lambda h: h[0]
).map(lambda hs: sorted(hs, key=lambda h: -h[1]))
names = st.sampled_from(["lexical", "context", "dense", "time"])
channel_maps = st.dictionaries(names, hit_lists, max_size=4)
weight_maps = st.dictionaries(names, st.floats(0, 5), max_size=4)


@settings(max_examples=300, deadline=None)
@given(channel_maps, weight_maps, st.one_of(st.none(), st.integers(1, 20)), st.booleans())
def test_fuse_scores_lie_in_zero_to_sum_of_weights_best_first(
    channels: dict[str, list[tuple[str, float]]], weights: dict[str, float], k: int | None, raw_time: bool
) -> None:
    raw = frozenset({"time"}) if raw_time else frozenset()
    fused = fuse(channels, weights, k, raw)
    used = [c for c, hits in channels.items() if hits and weights.get(c, 0.0) > 0]
    bound = sum(weights[c] for c in used)
    every = {i for c in used for i, _ in channels[c]}
    assert {f.id for f in fused} <= every
    assert len(fused) == (len(every) if k is None else min(k, len(every)))
    for f in fused:
        assert -1e-9 <= f.score <= bound + 1e-9
        assert set(f.channels) <= set(used)
        assert abs(sum(s.weight * s.normalized for s in f.channels.values()) - f.score) < 1e-9
        for s in f.channels.values():
            assert 0.0 <= s.normalized <= 1.0 and s.rank >= 1
    for a, b in itertools.pairwise(fused):
        assert a.score > b.score or (a.score == b.score and a.id > b.id)  # ties: the newer (larger) id


int_hits = st.lists(st.tuples(ids, st.integers(-1000, 1000).map(float)), min_size=2, max_size=12,
                    unique_by=lambda h: h[0]).map(lambda hs: sorted(hs, key=lambda h: -h[1]))


@settings(max_examples=200, deadline=None)
@given(int_hits)
def test_fuse_single_channel_keeps_the_channel_order(hits: list[tuple[str, float]]) -> None:
    fused = fuse({"lexical": hits}, {"lexical": 1.0})
    assert fused[0].score == pytest.approx(1.0)
    scores = dict(hits)
    assert [scores[f.id] for f in fused] == sorted(scores.values(), reverse=True)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(ids, st.integers(0, 4).map(float), max_size=30), st.none() | st.integers(0, 12))
def test_best_first_equals_a_full_sort_by_score_then_id(scores: dict[str, float], n: int | None) -> None:
    # few distinct scores: most hits tie, also across the cut at n
    expected = sorted(scores.items(), key=lambda h: (h[1], h[0]), reverse=True)
    assert _best_first(scores, n) == (expected if n is None else expected[:n])


def test_fuse_weights_and_raw_channels() -> None:
    channels = {"lexical": [("a", 9.0), ("b", 1.0)], "dense": [("b", 0.9), ("a", 0.1)]}
    assert fuse(channels, {"lexical": 0.7, "dense": 0.3})[0].id == "a"
    assert fuse(channels, {"lexical": 0.3, "dense": 0.7})[0].id == "b"
    assert fuse(channels, {"lexical": 1.0, "dense": 0.0})[0].channels.keys() == {"lexical"}
    # a raw channel is taken as is (clipped to [0, 1]), not stretched to [0, 1]
    t = fuse({"time": [("x", 0.5), ("y", 0.25), ("z", 3.0)]}, {"time": 1.0}, raw=frozenset({"time"}))
    assert {f.id: f.score for f in t} == {"z": 1.0, "x": 0.5, "y": 0.25}
    assert fuse({}, {"lexical": 1.0}) == []


# ---- time expressions ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What did Maria do last weekend before April 10, 2023?", [(2023, 4, 10)]),
        ("When did Melanie go camping in June?", [(None, 6, None)]),
        ("What did Gina find on 1 February, 2023?", [(2023, 2, 1)]),
        ("What painting did she show on October 13, 2023?", [(2023, 10, 13)]),
        ("What happened on the 3rd of Sept 2022 and in 2021?", [(2022, 9, 3), (2021, None, None)]),
        ("How many times in 2023?", [(2023, None, None)]),
        ("May I ask what we may do? We march on, sat down.", []),
        ("Plans for May 2024", [(2024, 5, None)]),
        ("What did she say last week?", []),
    ],
)
def test_time_expressions(text: str, expected: list[tuple[int | None, int | None, int | None]]) -> None:
    assert time_expressions(text) == expected


def test_time_match() -> None:
    d = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert time_match([(2023, 5, 8)], d) == 1.0
    assert time_match([(2023, 5, 9)], d) == pytest.approx(2 / 3)  # right month, wrong day
    assert time_match([(None, 5, None)], d) == 1.0
    assert time_match([(2023, None, None)], d) == 1.0
    assert time_match([(2022, 5, 8)], d) == 0.0  # wrong year: no match at all
    assert time_match([(2023, 6, 8)], d) == 0.0
    assert time_match([(2022, None, None), (None, 5, 1)], d) == 0.5
    assert time_match([], d) == 0.0


# ---- presets and configs ------------------------------------------------------------------------------
def test_presets() -> None:
    assert DEFAULT_PRESET == "hybrid" and preset(None) is PRESETS["hybrid"]
    assert {"hybrid", "hybrid-v3", "hybrid-v2", "hybrid-v1", "hybrid-fast", "bm25", "dense", "graph"} <= set(
        PRESETS
    )
    assert PRESETS["hybrid-v1"].weights == {"lexical": 0.7, "dense": 0.3}  # the previous default
    default = PRESETS[DEFAULT_PRESET]
    assert PRESETS["hybrid-fast"] == default.with_("hybrid-fast", weights={"context": 0.0})
    assert default.uses("context") and default.uses("time") and default.smoothing > 0
    assert not default.uses("graph") and PRESETS["graph"].uses("graph")
    for name, cfg in PRESETS.items():
        assert cfg.name == name and set(cfg.weights) <= set(CHANNELS)
    with pytest.raises(ConfigError) as exc:
        preset("nope")
    assert exc.value.field == "preset" and "hybrid" in str(exc.value)
    # problem and fix apart, as a ValidationError has them (both were missing)
    assert exc.value.problem == "unknown recall preset 'nope'" and "hybrid" in str(exc.value.fix)
    with pytest.raises(ConfigError) as exc:
        RecallConfig("bad", {"lexicon": 1.0})
    assert exc.value.field == "weights" and "lexical" in str(exc.value.fix)
    with pytest.raises(ConfigError) as exc:
        RecallConfig("bad", {"lexical": -1.0})
    assert exc.value.field == "weights"
    with pytest.raises(ConfigError, match="length_prior") as exc:
        RecallConfig("bad", {"lexical": 1.0}, length_prior=-0.1)
    assert exc.value.field == "length_prior"
    with pytest.raises(ConfigError, match="dense_candidates"):
        RecallConfig("bad", {"dense": 1.0}, dense_candidates=0)
    # the previous default stays available; the new one adds the length prior and a deeper dense list
    v3 = PRESETS["hybrid-v3"]
    assert v3.length_prior == 0.0 and v3.dense_candidates is None
    assert default.length_prior > 0 and (default.dense_candidates or 0) > default.candidates
    off = default.with_("no-context", weights={"context": 0.0}, smoothing=0.0)
    assert off.name == "no-context" and not off.uses("context") and off.smoothing == 0.0
    assert off.weights["lexical"] == default.weights["lexical"]


# ---- channels for real, through a Harness on every engine ----------------------------------------------
T0 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
LEXICAL_ONLY = RecallConfig("lexical", {"lexical": 1.0})


@pytest.fixture
def lexical_harness(engine_name: str, tmp_path: Path) -> Iterator[Harness]:
    h = Harness.open(harness_target(engine_name, tmp_path, "r.db"), embedder=None)
    try:
        yield h
    finally:
        h.close()


def test_equal_scores_rank_the_newest_first_on_every_engine(lexical_harness: Harness) -> None:
    """Identical texts score alike: which of them a recall returns, and in what order, was the engine's
    accident (PostgreSQL the oldest, in process whatever the partition left). The newest come first."""
    h = lexical_harness
    ids = [h.record("deploy failed on host", session_id="s").id for _ in range(300)]
    hits = h.recall("deploy", k=5, track=False, preset="bm25")
    assert [ids.index(x.id) for x in hits] == [299, 298, 297, 296, 295]
    raw = h.store.query(Query(filters=h.filters({}), text="deploy", limit=40, lexical=True)).lexical
    assert [ids.index(i) for i, _ in raw] == list(range(299, 259, -1))
    # the context channel (the default preset's) keeps and orders its ties as the reference engine does
    with Harness.open("memory://", embedder=None) as reference:
        same = [reference.record("deploy failed on host", session_id="s").id for _ in range(300)]
        ask = Query(filters=Filters(), text="deploy", limit=40, lexical=False, context=True)
        theirs = [same.index(i) for i, _ in reference.store.query(ask).context]
        ours = [ids.index(i) for i, _ in h.store.query(replace(ask, filters=h.filters({}))).context]
        assert ours == theirs and theirs[0] > 250


def test_a_checkpoint_snapshot_answers_a_recall_only_when_agent_state_is_asked_for(
    lexical_harness: Harness,
) -> None:
    """A snapshot holds the JSON of a whole session: a recall of archived (or any) status matched it by
    the words of any memory in it, and answered raw snapshot JSON as a hit."""
    h = lexical_harness
    m = h.record("the apple orchard ships on mondays", session_id="s1")
    h.update(m.id, status="archived")
    h.checkpoint("s1", "before the harvest")
    for status in ("archived", "any"):
        hits = h.recall("apple orchard mondays", k=5, status=status, track=False)
        assert [hit.id for hit in hits] == [m.id], status
    hits = h.recall("memories", k=5, status="any", track=False)  # a word of its JSON
    assert [hit.memory.kind for hit in hits] in ([], [Kind.NOTE])  # (the note: the session's neighbour)
    [snapshot] = h.recall("memories", k=5, status="any", kind="agent_state", track=False)  # asked for
    assert snapshot.memory.content_type == "application/json"


def conversation(h: Harness) -> dict[str, Memory]:
    """Two sessions of a chat; the fact about the lake is in a reply that never names the lake."""
    t1, t2 = T0, T0 + timedelta(days=40)
    turns = [
        ("a1", "s1", t1, "Caroline: How was the trip to the lake with the kids?"),
        ("a2", "s1", t1, "Melanie: We rented a red canoe and paddled all afternoon."),
        ("a3", "s1", t1, "Caroline: Sounds lovely, glad you had fun."),
        ("a4", "s1", t1, "Melanie: Next I want to learn pottery."),
        ("b1", "s2", t2, "Caroline: I finally signed up for the pottery class."),
        ("b2", "s2", t2, "Melanie: Pottery is so relaxing, enjoy it!"),
        ("c1", "s3", t2 + timedelta(days=90), "Caroline: The pottery class ended with an exhibition."),
    ]
    out: dict[str, Memory] = {}
    for key, session, when, text in turns:
        out[key] = h.record(text, session_id=session, created_at=when)
    return out


def keys(hits: list[object], mems: dict[str, Memory]) -> list[str]:
    back = {m.id: k for k, m in mems.items()}
    return [back[h.id] for h in hits]  # type: ignore[attr-defined]


def test_lexical_channel(lexical_harness: Harness) -> None:
    mems = conversation(lexical_harness)
    hits = lexical_harness.recall("canoe", k=3, preset=LEXICAL_ONLY)
    assert keys(hits, mems) == ["a2"] and set(hits[0].explain) == {"lexical"}


def test_context_channel_finds_the_reply_next_to_the_question(lexical_harness: Harness) -> None:
    mems = conversation(lexical_harness)
    q = "what happened at the lake"
    assert "a2" not in keys(lexical_harness.recall(q, k=10, preset=LEXICAL_ONLY), mems)
    cfg = RecallConfig("context", {"context": 1.0})
    got = keys(lexical_harness.recall(q, k=4, preset=cfg), mems)
    assert "a2" in got and "a3" in got  # "lake" sits one turn before a2 and two before a3
    assert all(k.startswith("a") for k in got)  # other sessions never lend their words
    hit = lexical_harness.recall(q, k=4, preset=cfg)[0]
    assert set(hit.explain) == {"context"}


def test_neighbour_smoothing_lifts_the_adjacent_turns(lexical_harness: Harness) -> None:
    mems = conversation(lexical_harness)
    plain = keys(lexical_harness.recall("trip to the lake", k=10, preset=LEXICAL_ONLY), mems)
    assert plain == ["a1"]
    smooth = lexical_harness.recall("trip to the lake", k=10, preset=LEXICAL_ONLY.with_(smoothing=0.3))
    got = keys(smooth, mems)
    assert got[0] == "a1" and set(got) == {"a1", "a2"}  # a1's only neighbour in session s1
    assert "neighbours" in smooth[1].explain and "lexical" not in smooth[1].explain
    assert smooth[1].score == pytest.approx(0.3 * smooth[0].score)  # (0 + 0.3 * s) / 1.6 vs s / 1.6


def test_time_channel_prefers_memories_from_the_named_date(lexical_harness: Harness) -> None:
    mems = conversation(lexical_harness)
    cfg = RecallConfig("time", {"lexical": 0.7, "time": 0.5})
    when = T0 + timedelta(days=40)
    q = f"pottery class in {when:%B %Y}"
    got = lexical_harness.recall(q, k=3, preset=cfg)
    assert keys(got, mems)[0] == "b1"
    assert got[0].explain["time"].normalized == 1.0
    later = T0 + timedelta(days=130)
    assert keys(lexical_harness.recall(f"pottery class in {later:%B %Y}", k=3, preset=cfg), mems)[0] == "c1"
    # no time expression: the time channel stays silent
    assert all("time" not in h.explain for h in lexical_harness.recall("pottery class", k=3, preset=cfg))


def test_graph_channel_expands_along_shared_entities(lexical_harness: Harness) -> None:
    h = lexical_harness
    seed = h.record("We adopted a puppy and named him Max.", session_id="x")
    linked = h.record("Walking with Max in the rain this morning.", session_id="y")
    h.record("Walking to the office in the rain.", session_id="z")
    cfg = RecallConfig("graph", {"lexical": 1.0, "graph": 0.5}, graph_seeds=1)
    got = h.recall("adopted puppy", k=3, preset=cfg)
    assert [g.id for g in got[:2]] == [seed.id, linked.id]
    assert "graph" in got[1].explain and "lexical" not in got[1].explain


def test_dense_channel_and_default_preset(harness: Harness) -> None:
    mems = conversation(harness)
    harness.flush(timeout=120)
    got = harness.recall("boating on the water", k=3, preset="dense")
    assert "a2" in keys(got, mems) and set(got[0].explain) == {"dense"}
    default = harness.recall("what happened at the lake", k=3)  # the default preset
    assert "a2" in keys(default, mems)
    assert {"lexical", "context", "dense"} & set(default[0].explain)


# ---- the same channels at the storage contract -------------------------------------------------------
def test_query_context_info_and_filters(engine: Store) -> None:
    t = T0
    rows = [Memory(content=f"turn {i} of chat", session_id="s", created_at=t + timedelta(seconds=i))
            for i in range(5)]
    rows[2] = rows[2].model_copy(update={"content": "the zebra turn"})
    other = Memory(content="unrelated zebra", session_id="t", created_at=t)
    archived = rows[3].model_copy(update={"status": Status.ARCHIVED})
    engine.put_many([*rows[:3], archived, rows[4], other])
    res = engine.query(Query(text="zebra", context=True, info=True, limit=10))
    ctx = [i for i, _ in res.context]
    assert set(ctx) == {r.id for r in rows} | {other.id}  # ±2 of rows[2] covers the whole session
    assert ctx[0] in (rows[2].id, other.id)
    info = res.info[rows[2].id]
    assert (info.previous, info.next, info.session_id) == (rows[1].id, rows[3].id, "s")
    assert info.created_at == rows[2].created_at
    assert res.info[rows[0].id].previous is None and res.info[rows[4].id].next is None
    active = Query(filters=Query().filters.with_(status=frozenset({"active"})), text="zebra", context=True,
                   info=True)
    res = engine.query(active)
    assert archived.id not in {i for i, _ in res.context} and archived.id not in res.info
    assert res.info[rows[2].id].next == archived.id  # adjacency ignores filters; the info does not
    lexical_off = engine.query(Query(text="zebra", lexical=False, context=True))
    assert lexical_off.lexical == [] and lexical_off.context


def test_neighbourhoods_follow_updates_and_deletes(engine: Store) -> None:
    a, b, c = (Memory(content=w, session_id="s", created_at=T0 + timedelta(seconds=i))
               for i, w in enumerate(["alpha", "bravo", "charlie"]))
    engine.put_many([a, b, c])

    def ctx(word: str) -> set[str]:
        return {i for i, _ in engine.query(Query(text=word, lexical=False, context=True)).context}

    assert ctx("alpha") == {a.id, b.id, c.id}
    engine.put(b.model_copy(update={"session_id": "other", "version": 2}))  # b leaves session s
    assert ctx("bravo") == {b.id}
    assert ctx("alpha") == {a.id, c.id}
    info = engine.query(Query(text="alpha", info=True)).info
    assert info[a.id].next == c.id and info[c.id].previous == a.id
    engine.put(c.model_copy(update={"content": "delta", "version": 2}))  # new text reaches a's neighbourhood
    assert ctx("delta") == {a.id, c.id} and ctx("charlie") == set()
    engine.delete(c.id)
    assert ctx("delta") == set() and ctx("alpha") == {a.id}
    assert engine.query(Query(text="alpha", info=True)).info[a.id].next is None


@pytest.mark.engines("sqlite")
def test_neighbourhoods_are_rebuilt_on_open(engine: Store) -> None:
    ms = [Memory(content=w, session_id="s", created_at=T0 + timedelta(seconds=i))
          for i, w in enumerate(["question about the lake", "we paddled a canoe", "bye"])]
    engine.put_many(ms)
    before = engine.query(Query(text="lake", context=True, info=True))
    reopened = SQLiteStore(engine.path)  # type: ignore[attr-defined]
    reopened.setup()
    try:
        after = reopened.query(Query(text="lake", context=True, info=True))
        assert after.context == before.context and after.info == before.info
    finally:
        reopened.close()


def test_smoothing_and_time_bounded_scores(lexical_harness: Harness) -> None:
    """The default pipeline's scores stay within the sum of its weights (smoothing divides by 1 + 2a)."""
    conversation(lexical_harness)
    cfg = PRESETS["hybrid"].with_(weights={"dense": 0.0})
    bound = sum(cfg.weights.values())
    for q in ("pottery", "lake trip in May 2023", "canoe", "class exhibition 2023"):
        for hit in lexical_harness.recall(q, k=7, preset=cfg):
            assert 0.0 <= hit.score <= bound + 1e-9
    assert np.isfinite([h.score for h in lexical_harness.recall("pottery", k=7, preset=cfg)]).all()


# ---- incremental neighbourhoods equal a fresh build -------------------------------------------------
WORDS = ["lake", "canoe", "pottery", "class", "dog", "max", "paint", "sunset"]
ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "delete"]),
        st.integers(0, 7),  # which memory
        st.sampled_from([None, "s1", "s2"]),  # session
        st.integers(0, 5),  # created_at offset (ties are broken by row)
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
    ),
    max_size=25,
)


@settings(max_examples=120, deadline=None)
@given(ops, st.integers(1, 3))
def test_incremental_neighbourhoods_equal_a_fresh_build(
    steps: list[tuple[str, int, str | None, int, str]], window: int
) -> None:
    from clawvm.store.index import SearchIndex

    names = [f"01a22800-0000-7000-8000-00000000000{n}" for n in range(8)]
    index = SearchIndex(8, window=window)
    state: dict[str, Memory] = {}
    for op, n, session, offset, text in steps:
        ident = names[n]
        if op == "delete":
            index.remove(ident)
            state.pop(ident, None)
            continue
        m = Memory(id=ident, content=text, session_id=session, created_at=T0 + timedelta(seconds=offset))
        index.upsert(m)
        state[ident] = m
        index.query(Query(text=text, context=True))  # warm the impact caches that writes must keep right
    # a fresh index fed in the incremental one's row order reproduces its tie-breaking exactly
    fresh = SearchIndex(8, window=window)
    for ident in sorted(state, key=lambda i: index.row_of[i]):
        fresh.upsert(state[ident])
    for word in WORDS:
        got = dict(index.query(Query(text=word, lexical=False, context=True, info=True)).context)
        want = dict(fresh.query(Query(text=word, lexical=False, context=True, info=True)).context)
        assert got.keys() == want.keys()
        for i in got:
            assert got[i] == pytest.approx(want[i], rel=2e-2)  # cached impacts tolerate a 2% avgdl drift
    everything = Query(text=" ".join(WORDS), info=True, limit=100)
    assert index.query(everything).info == fresh.query(everything).info


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 500), st.integers(0, 2**32 - 1), st.sampled_from([1000, 70_000, 150_000]))
def test_top_indices_is_exactly_the_top_n(n: int, seed: int, size: int) -> None:
    from clawvm.core.vectors import top_indices

    rng = np.random.default_rng(seed)
    x = rng.integers(-50, 50, size).astype(np.float32)  # many ties
    x[rng.integers(0, size, size // 10)] = -np.inf
    got = top_indices(x, n)
    assert len(got) == len(set(got.tolist())) == n
    assert np.sort(x[got]).tolist() == np.sort(x)[-n:].tolist()


# ---- authors named in a query (strip_authors / author_prior) --------------------------------------------
def test_named_authors_are_capitalised_runs_of_known_agent_ids() -> None:
    agents = frozenset({"Nate", "Joanna", "Amy Ellis", "will"})
    assert named_authors("What video games does Nate play?", agents) == {"nate"}
    assert named_authors("What is Joanna's job? And Amy Ellis's?", agents) == {"joanna", "amy ellis"}
    assert named_authors("What games does Nate play?", frozenset()) == set()
    assert named_authors("what will nate do", agents) == set()  # lower case names no one
    assert named_authors("Will Amy come?", agents) == {"will"}  # a capitalised agent name is one


def test_strip_authors_keeps_what_is_asked() -> None:
    assert strip_authors("What is Joanna's job?", {"joanna"}) == "What is job?"
    assert strip_authors("When did Amy Ellis move?", {"amy ellis"}) == "When did move?"
    assert strip_authors("Joanna?", {"joanna"}) == "Joanna?"  # nothing would be left: unchanged
    assert strip_authors("What is Joanna's job?", set()) == "What is Joanna's job?"


def test_author_levers_rank_the_named_authors_own_memories_first(lexical_harness: Harness) -> None:
    h = lexical_harness
    other = h.record("Nate, I love video games too", session_id="s", agent_id="Joanna",
                     created_at=T0)
    own = h.record("video games are fun", session_id="s", agent_id="Nate",
                   created_at=T0 + timedelta(seconds=1))
    question = "What video games does Nate play?"
    plain = h.recall(question, k=2, preset=LEXICAL_ONLY.with_(smoothing=0.3), track=False)
    assert plain[0].id == other.id  # "Nate" is a query word only the other speaker's turn contains
    cfg = LEXICAL_ONLY.with_("authors", smoothing=0.3, strip_authors=True, author_prior=0.5)
    hits = h.recall(question, k=2, preset=cfg, track=False)
    assert [x.id for x in hits] == [own.id, other.id]
    assert "author" in hits[0].explain and "author" not in hits[1].explain
    prior_only = h.recall(question, k=2, preset=LEXICAL_ONLY.with_(author_prior=0.5), track=False)
    assert "author" in {c for x in prior_only for c in x.explain}  # the prior alone also needs the pool


def test_an_author_named_like_a_month_is_no_time_expression(lexical_harness: Harness) -> None:
    """"What did April say about the budget?" read "April" as the month too: every memory made in April
    got the time channel's boost."""
    h = lexical_harness
    said = h.record("the budget for the offsite is approved", agent_id="April", session_id="s1",
                    created_at=datetime(2026, 2, 10, 9, tzinfo=UTC))
    made_in_april = h.record("the budget review slipped again", agent_id="Joanna", session_id="s3",
                             created_at=datetime(2026, 4, 14, 9, tzinfo=UTC))
    cfg = LEXICAL_ONLY.with_(
        "authors", weights={"lexical": 1.0, "time": 0.5}, strip_authors=True, author_prior=0.5
    )
    hits = {x.id: x for x in h.recall("What did April say about the budget?", k=2, preset=cfg, track=False)}
    assert set(hits) == {said.id, made_in_april.id}
    assert "time" not in hits[made_in_april.id].explain and "author" in hits[said.id].explain
    in_february = {x.id: x for x in h.recall("the budget in February?", k=2, preset=cfg, track=False)}
    assert "time" in in_february[said.id].explain  # a month no author is called: the time channel


# ---- length prior -------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), min_size=1, max_size=40), st.floats(0.0, 2.0))
def test_length_factors_rise_with_length_around_the_pools_median(lengths: list[int], g: float) -> None:
    info = {f"m{i}": CandidateInfo(T0, "s", None, None, None, n) for i, n in enumerate(lengths)}
    scored = {i: 1.0 for i in list(info)[::2] or list(info)}  # only members with a score get a factor
    factors = length_factors(info, scored, g)
    assert set(factors) == set(scored)
    kept = sorted((max(info[i].length, 1), f) for i, f in factors.items())
    assert all(a[1] <= b[1] + 1e-12 for a, b in itertools.pairwise(kept))  # longer never loses to shorter
    median = float(np.median([n for n, _ in kept]))
    for n, f in kept:
        assert f == pytest.approx(min(n / median, MAX_LENGTH_RATIO) ** g)
    if g == 0.0:
        assert set(factors.values()) == {1.0}


def test_a_huge_memory_does_not_outrank_an_exact_short_match(lexical_harness: Harness) -> None:
    """The prior's ratio stops at ten times the pool's median: a 300 KB log's factor was 19, above
    the short memory that says exactly what was asked."""
    h = lexical_harness
    exact = h.record("deploy failed on ci-3: disk full", session_id="s1", created_at=T0)
    filler = " ".join(f"line {i} of the nightly build log, nothing happened" for i in range(6000))
    huge = h.record(f"{filler} deploy {filler} failed", session_id="s2", created_at=T0)
    for i in range(8):
        h.record(f"deploy note {i}: the rollout of service {i} went fine", session_id="s3", created_at=T0)
    hits = h.recall("deploy failed", k=3, preset=LEXICAL_ONLY.with_("length", length_prior=0.3), track=False)
    assert hits[0].id == exact.id
    by_id = {x.id: x for x in hits}
    if huge.id in by_id:
        assert by_id[huge.id].explain["length"].raw == pytest.approx(MAX_LENGTH_RATIO**0.3)


def test_length_prior_lifts_the_memory_that_says_more(lexical_harness: Harness) -> None:
    h = lexical_harness
    short = h.record("Pottery, nice!", session_id="s1", created_at=T0)
    long = h.record(
        "Caroline: I took a pottery class downtown and made a blue bowl, two mugs and a vase for my mum.",
        session_id="s2", created_at=T0 + timedelta(days=1),
    )
    h.record(  # the weakest match: min-max fusion scores it 0, so the other two keep a share
        "We talked for hours about the garden, the weather, the new bakery on the corner, the school "
        "concert, the neighbours' dog, the broken fence, holidays by the sea and, briefly, pottery.",
        session_id="s3", created_at=T0 + timedelta(days=2),
    )
    plain = {x.id: x for x in h.recall("pottery", k=3, preset=LEXICAL_ONLY, track=False)}
    assert list(plain)[:2] == [short.id, long.id]  # BM25 favours the short text
    hits = h.recall("pottery", k=3, preset=LEXICAL_ONLY.with_("length", length_prior=1.0), track=False)
    assert [x.id for x in hits[:2]] == [long.id, short.id]
    lengths = {x.id: len(Analyzer().terms(x.memory.content)) for x in hits}
    median = float(np.median(list(lengths.values())))
    for x in hits:
        assert x.explain["length"].raw == pytest.approx(lengths[x.id] / median)
        assert x.score == pytest.approx(plain[x.id].score * lengths[x.id] / median)


def test_store_knows_its_agents_per_tenant_and_candidates_carry_theirs(engine: Store) -> None:
    a = Memory(content="alpha one", session_id="s", agent_id="Nate", created_at=T0)
    b = Memory(content="alpha two", session_id="s", agent_id="Joanna", created_at=T0 + timedelta(seconds=1))
    c = Memory(content="alpha three", session_id="s", created_at=T0 + timedelta(seconds=2))
    elsewhere = Memory(content="alpha", tenant="other", agent_id="Mallory")
    engine.put_many([a, b, c, elsewhere])
    assert engine.agents(Query().filters.with_(tenant=frozenset({"default"}))) == {"Nate", "Joanna"}
    assert engine.agents(Query().filters.with_(tenant=frozenset({"other"}))) == {"Mallory"}
    assert engine.agents(Query().filters) == {"Nate", "Joanna", "Mallory"}
    engine.put(c.model_copy(update={"agent_id": "Amy", "version": 2}))  # a write shows at once
    assert engine.agents(Query().filters.with_(tenant=frozenset({"default"}))) == {"Nate", "Joanna", "Amy"}
    info = engine.query(Query(filters=Query().filters.with_(tenant=frozenset({"default"})),
                              around=(b.id,))).info
    assert {i: x.agent_id for i, x in info.items()} == {a.id: "Nate", b.id: "Joanna", c.id: "Amy"}
    terms = Analyzer().terms
    assert {i: x.length for i, x in info.items()} == {m.id: len(terms(m.content)) for m in (a, b, c)}


class _ArchivesBeforeFetch:
    """The store a recall reads, with another caller's write landing between the recall's match and its
    fetch of the memories: the first one it fetches is archived first."""

    def __init__(self, h: Harness) -> None:
        self._h, self.archived = h, ""

    def __getattr__(self, name: str) -> object:
        return getattr(self._h.store, name)

    def get_many(self, ids: Sequence[str]) -> dict[str, Memory]:
        if not self.archived:
            self.archived = ids[0]
            self._h.update(ids[0], status=Status.ARCHIVED)
        return self._h.store.get_many(ids)


def test_a_memory_that_left_the_filter_between_match_and_fetch_is_not_returned(
    lexical_harness: Harness,
) -> None:
    """A recall matches its candidates, then fetches them: a memory archived (moved out of the filter) in
    between was returned as it is now, an archived memory among the active results."""
    h = lexical_harness
    conversation(h)
    racing = _ArchivesBeforeFetch(h)
    hits = run_recall(racing, "pottery class", None, 3, LEXICAL_ONLY, h.filters({}))  # type: ignore[arg-type]
    assert racing.archived and racing.archived not in {x.id for x in hits}
    assert hits and all(x.memory.status is Status.ACTIVE for x in hits)


def test_a_memory_that_left_the_filter_between_match_and_fetch_gives_way_to_the_next_best(
    lexical_harness: Harness,
) -> None:
    """The archived memory's place goes to the next best match: the race costs a second fetch, not a
    shorter answer (asked for 3 with more than 3 matches, the recall returned 2)."""
    h = lexical_harness
    conversation(h)
    calm = run_recall(h.store, "pottery class", None, 4, LEXICAL_ONLY, h.filters({}))
    assert len(calm) == 4
    racing = _ArchivesBeforeFetch(h)
    hits = run_recall(racing, "pottery class", None, 3, LEXICAL_ONLY, h.filters({}))  # type: ignore[arg-type]
    assert racing.archived == calm[0].id
    assert [x.id for x in hits] == [x.id for x in calm[1:]]
