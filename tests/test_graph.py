"""The write-time entity graph: extraction (pure), links kept by the search index on every engine,
bounded expansion through the storage contract, and clean-up on update and delete."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm import Memory
from clawvm.core.entities import entities
from clawvm.store import Query, Store
from clawvm.store.index import SearchIndex


def index_of(store: Store) -> SearchIndex:
    index: SearchIndex = store.index  # type: ignore[attr-defined]
    return index


def put(store: Store, content: str, **fields: Any) -> Memory:
    m = Memory(content=content, **fields)
    store.put(m)
    return m


# ---- extraction ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Caroline: Hey Mel! Good to see you!", {"mel"}),
        (
            "Melanie: Thanks, Caroline! I read Becoming Nicole by Amy Ellis Nutt.",
            {"caroline", "becoming nicole", "amy ellis nutt"},
        ),
        ("John: My old area, West County, was hit by a flood last Friday.", {"west county"}),
        ('Joanna: I just watched "Little Women" and it was amazing!', {"little women"}),
        ("Nate: Max is my dog. I love Max.", {"max"}),
        ("We met at the Bank of America with LeBron James.", {"bank of america", "lebron james"}),
        ("Yesterday I went to Sweden in May.", {"sweden"}),
        ("I'm in Paris", {"paris"}),
        ("Charlotte's Web is a book about the Charlotte's Web spider", {"web", "charlotte's web"}),
        ("the café in Zürich", {"zürich"}),
    ],
)
def test_entities_extracted_from_sample_texts(text: str, expected: set[str]) -> None:
    assert entities(text) == expected


def test_sentence_initial_words_speakers_stop_words_and_time_are_not_entities() -> None:
    assert entities("Thanks for that. Great idea! Honestly, it works.") == set()
    assert entities("Caroline: sounds fun") == set()  # the speaker of a transcript line
    assert entities("See you on Friday or in December, Tuesday at the latest") == set()
    assert entities("The And Of") == set()
    assert entities("") == set()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_entities_never_fail_and_are_normalised(text: str) -> None:
    found = entities(text)
    for e in found:
        assert e == e.lower() and e.strip() == e and len(e) > 1


# ---- links built at write time, on every engine ------------------------------------------------------
def test_links_are_created_at_write_time(engine: Store) -> None:
    a = put(engine, "Nate: I adopted a puppy and named him Max.")
    b = put(engine, "Joanna: Glad Max is bringing you joy!")
    c = put(engine, "Joanna: My screenplay got rejected by Paramount.")
    index = index_of(engine)
    assert index.entities_of(a.id) == ("max",)
    assert index.entities_of(c.id) == ("paramount",)
    assert index.linked("max") == {a.id, b.id}
    related = engine.query(Query(expand=(a.id,))).related
    assert [(s, t) for s, t, _ in related] == [(a.id, b.id)]
    assert all(0.0 <= w <= 1.0 for _, _, w in related)


def test_expansion_is_bounded_by_its_limit_and_skips_common_entities(engine: Store) -> None:
    seed = put(engine, "We visited Lisbon and then Porto.")
    for i in range(12):
        put(engine, f"A memory of Lisbon, number {i}")
    for i in range(3):
        put(engine, f"A memory of Porto, number {i}")
    q = Query(expand=(seed.id,), expand_limit=5)
    related = engine.query(q).related
    assert len(related) == 5
    # the rarer entity (Porto, 4 memories) links first and weighs more than Lisbon (13)
    porto = index_of(engine).linked("porto") - {seed.id}
    assert {t for _, t, _ in related[:3]} == porto
    assert related[0][2] > related[-1][2]
    # an entity named by more than expand_max_df memories is a topic, not a link
    only_porto = engine.query(Query(expand=(seed.id,), expand_limit=100, expand_max_df=10)).related
    assert {t for _, t, _ in only_porto} == porto
    assert engine.query(Query(expand=(seed.id,), expand_limit=0)).related == []


def test_expansion_respects_filters(engine: Store) -> None:
    seed = put(engine, "A trip to Kyoto", tenant="a")
    same = put(engine, "The temples of Kyoto", tenant="a")
    put(engine, "The Kyoto of tenant b", tenant="b")
    only_a = Query().filters.with_(tenant=frozenset({"a"}))
    got = engine.query(Query(filters=only_a, expand=(seed.id,))).related
    assert [t for _, t, _ in got] == [same.id]


def test_update_and_removal_clean_up_the_graph(engine: Store) -> None:
    a = put(engine, "Dinner with Gina at Luigi's")
    b = put(engine, "Then Gina opened her store")
    index = index_of(engine)
    assert index.linked("gina") == {a.id, b.id}
    assert index.linked("luigi") == {a.id}
    engine.put(a.model_copy(update={"content": "Dinner with Jon", "version": 2}))
    assert index.linked("gina") == {b.id}
    assert index.linked("jon") == {a.id}
    assert index.linked("luigi") == set()
    engine.delete(b.id)
    assert index.linked("gina") == set()
    assert "gina" not in index._entities
    assert engine.query(Query(expand=(a.id,))).related == []
    engine.delete(a.id)
    assert index._entities == {} and index._row_entities == {}


@pytest.mark.engines("sqlite")
def test_graph_is_rebuilt_on_open(engine: Store, tmp_path: Any) -> None:
    from clawvm.store import SQLiteStore

    a = put(engine, "Saw Oliver at the park")
    b = put(engine, "Then Oliver liked the park too")
    reopened = SQLiteStore(engine.path)  # type: ignore[attr-defined]
    reopened.setup()
    try:
        assert index_of(reopened).linked("oliver") == {a.id, b.id}
        assert [link.id for link in reopened.query(Query(expand=(a.id,))).related] == [b.id]
    finally:
        reopened.close()
