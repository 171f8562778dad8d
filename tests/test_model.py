"""The memory model: validation (through the Harness, on every engine), JSON content, ids, filters."""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings

import clawvm.core.ids
from clawvm import Filters, Harness, Kind, Memory, ValidationError
from clawvm.core.ids import is_valid_id, new_id
from clawvm.core.model import (
    JSON,
    MAX_JSON_DEPTH,
    MAX_METADATA_BYTES,
    MAX_SCOPE_ID_CHARS,
    MAX_TAGS,
    STORED,
    TEXT,
    build_memory,
    capped_tags,
    revalidate,
)
from engines import harness_target
from strategies import memories

VALID_ID = "0190abcd-ef00-7000-8000-00000000000a"


def nested(levels: int, leaf: Any = None, key: str | None = "k") -> Any:
    """``leaf`` inside ``levels`` objects (or arrays, with ``key=None``): ``levels=0`` is the leaf."""
    value = leaf
    for _ in range(levels):
        value = [value] if key is None else {key: value}
    return value


DEEP = MAX_JSON_DEPTH + 1  # objects/arrays inside one another, one level past the limit

BAD_INPUT: list[tuple[Any, dict[str, Any], str]] = [
    ("x", {"session_id": 5}, "session_id"),
    ("x", {"tags": "x"}, "tags"),
    ("x", {"tags": [1]}, "tags.0"),
    ("x", {"tags": ["ok", "   "]}, "tags"),
    ("x", {"value": "high"}, "value"),
    ("x", {"value": 1.5}, "value"),
    ("x", {"confidence": -0.1}, "confidence"),
    ("x", {"kind": "bogus"}, "kind"),
    ("x", {"state": "done"}, "state"),
    ("x", {"status": "deleted"}, "status"),
    ("x", {"tier": "l3"}, "tier"),
    ("x" * 1_000_001, {}, "content"),
    ("é" * 500_001, {}, "content"),  # 500,001 characters, 1,000,002 bytes
    (b"valid start \xff\xfe", {}, "content"),
    ("lone \ud800 surrogate", {}, "content"),
    ("", {}, "content"),
    (" \n\t ", {}, "content"),
    (12345, {}, "content"),
    ({"x": float("nan")}, {}, "content"),
    ("x", {"no_such_field": 1}, "no_such_field"),
    ("x", {"parent_id": "not-a-uuid"}, "parent_id"),
    ("x", {"parent_id": VALID_ID.upper()}, "parent_id"),
    ("x", {"links": [{"type": "refers_to", "target": "memory-7"}]}, "links.0.target"),
    ("x", {"links": [{"type": "inspired_by", "target": VALID_ID}]}, "links.0.type"),
    ("x", {"metadata": {"when": object()}}, "metadata"),
    ("x", {"metadata": {"f": float("nan")}}, "metadata"),
    ("x", {"metadata": "not a dict"}, "metadata"),
    ("x", {"session_id": "s\ud800"}, "session_id"),
    ("x", {"tags": ["ok", "\udfff"]}, "tags"),
    ("x", {"metadata": {"k": "\ud800"}}, "metadata"),
    ("x", {"metadata": nested(DEEP, {})}, "metadata"),  # the metadata object itself is level 0
    ("x", {"metadata": nested(DEEP - 1, [1], key="k")}, "metadata"),
    ("x", {"metadata": {"k": nested(300, key=None)}}, "metadata"),  # past pydantic's serializer limit
    ("x", {"metadata": nested(5000)}, "metadata"),  # past Python's recursion limit
    (nested(DEEP, "leaf"), {}, "content"),
    (nested(5000, key=None), {}, "content"),
    ("x", {"created_at": "yesterday"}, "created_at"),
    ("x", {"created_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))}, "created_at"),
    ("x", {"cost": {"seconds": float("inf")}}, "cost.seconds"),
    ("x", {"cost": {"tokens": -1}}, "cost.tokens"),
    ("x", {"access_count": -1}, "access_count"),
    ("x", {"version": 3}, "version"),
    ("x", {"content_type": "text/html"}, "content_type"),
    ("x", {"token_count": 7}, "token_count"),
]


@pytest.mark.parametrize(
    ("content", "fields", "field"), BAD_INPUT, ids=[c[2] + str(i) for i, c in enumerate(BAD_INPUT)]
)
def test_bad_input_names_the_field_and_writes_nothing(
    harness: Harness, content: Any, fields: dict[str, Any], field: str
) -> None:
    kept = harness.record("a memory recorded before the bad one", tags=["t"])
    before = (harness.store.count(), len(harness.events()), harness.get(kept.id))
    with pytest.raises(ValidationError) as exc:
        harness.record(content, **fields)
    assert exc.value.field == field, str(exc.value)
    assert exc.value.problem and exc.value.fix
    assert (harness.store.count(), len(harness.events()), harness.get(kept.id)) == before


def test_precomputed_embedding_of_the_wrong_size_is_rejected(harness: Harness) -> None:
    with pytest.raises(ValidationError) as exc:
        harness.record("x", embedding=[0.1, 0.2, 0.3])
    assert exc.value.field == "embedding"
    with pytest.raises(ValidationError):
        harness.record("x", embedding=[float("nan")] * 384)
    with pytest.raises(ValidationError) as exc:  # as set_vectors refuses it: cosine never finds it
        harness.record("x", embedding=[0.0] * 384)
    assert exc.value.field == "embedding" and "zero vector" in exc.value.problem
    assert harness.store.count() == 0


def test_custom_content_limit(engine_name: str, tmp_path: Path) -> None:
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None, max_content_bytes=10) as h:
        h.record("x" * 10)
        h.record("é" * 5)  # 10 bytes
        for too_big in ("x" * 11, "é" * 6, b"x" * 11, {"k": "long value"}):
            with pytest.raises(ValidationError) as exc:
                h.record(too_big)
            assert exc.value.field == "content"
            assert "10-byte limit" in exc.value.problem
        assert h.store.count() == 2


def test_content_exactly_at_the_default_limit_is_accepted(engine_name: str, tmp_path: Path) -> None:
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None) as h:
        m = h.record("é" * 500_000)  # exactly 1,000,000 bytes
        assert len(h.get(m.id).content.encode()) == 1_000_000


def test_json_content_is_stored_as_canonical_json(harness: Harness) -> None:
    payload = {"url": "https://api.example/charge", "b": [1, 2.5, None, True], "a": {"ü": "ß"}}
    m = harness.record(payload, kind="tool_call")
    assert m.content_type == JSON
    assert m.content == '{"a":{"ü":"ß"},"b":[1,2.5,null,true],"url":"https://api.example/charge"}'
    stored = harness.get(m.id)
    assert stored.content == m.content and stored.content_type == JSON
    assert stored.content_json() == payload
    lst = harness.record(["x", {"z": 1, "y": 2}])
    assert lst.content == '["x",{"y":2,"z":1}]' and harness.get(lst.id).content_json() == [
        "x",
        {"z": 1, "y": 2},
    ]
    text = harness.record('{"looks": "like json"}')
    assert text.content_type == TEXT and text.content_json() == '{"looks": "like json"}'
    raw = harness.record("caf\u00e9 bytes".encode())
    assert raw.content == "café bytes" and raw.content_type == TEXT


def test_metadata_is_kept_as_json_reads_it_back(engine_name: str, tmp_path: Path) -> None:
    m = build_memory({"content": "x", "metadata": {"pair": (1, 2), "by_number": {1: "one"}, "big": 2**80}})
    assert m.metadata == {"pair": [1, 2], "by_number": {"1": "one"}, "big": 2**80}
    with Harness.open(harness_target(engine_name, tmp_path), embedder=None) as h:
        r = h.record("x", metadata={"pair": (1, 2), "by_number": {1: "one"}})
        assert h.get(r.id).metadata == r.metadata == {"pair": [1, 2], "by_number": {"1": "one"}}


def test_naive_and_offset_datetimes_are_stored_as_utc() -> None:
    naive = datetime(2026, 3, 1, 12, 0)
    m = build_memory(
        {
            "content": "x",
            "created_at": naive,
            "expires_at": datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
        }
    )
    assert m.created_at == datetime(2026, 3, 1, 12, 0, tzinfo=UTC) and m.created_at.tzinfo is UTC
    assert (
        m.expires_at == m.created_at and m.expires_at is not None and m.expires_at.utcoffset() == timedelta(0)
    )


# ---- ids ----------------------------------------------------------------------------------------------
def _parts(ident: str) -> tuple[int, int, int]:
    u = uuid.UUID(ident)
    return u.int >> 80, u.version or 0, (u.int >> 64) & 0xFFF


def test_ids_are_uuid7_unique_and_strictly_increasing() -> None:
    t0 = datetime.now(UTC).timestamp() * 1000
    ids = [new_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(a < b for a, b in itertools.pairwise(ids))
    for ident in (ids[0], ids[-1]):
        u = uuid.UUID(ident)
        assert u.version == 7 and u.variant == uuid.RFC_4122
        assert str(u) == ident and is_valid_id(ident)
    assert abs(_parts(ids[0])[0] - t0) < 5_000  # the first 48 bits are the creation time in ms
    assert Memory(content="x").id > ids[-1]


def test_ids_are_unique_across_threads_and_increasing_within_each() -> None:
    per_thread: list[list[str]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def make(out: list[str]) -> None:
        barrier.wait()
        out.extend(new_id() for _ in range(3000))

    threads = [threading.Thread(target=make, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for out in per_thread for i in out]
    assert len(set(everything)) == 8 * 3000
    for out in per_thread:
        assert all(a < b for a, b in itertools.pairwise(out))


def test_ids_stay_increasing_when_the_counter_overflows_or_the_clock_goes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frozen = [1_900_000_000_000 * 1_000_000]  # ns; beyond any real clock today
    # only the ids module sees the fake clock; its state is restored afterwards, so later ids stay real
    monkeypatch.setattr(clawvm.core.ids, "time", SimpleNamespace(time_ns=lambda: frozen[0]))
    monkeypatch.setattr(clawvm.core.ids, "_last_ms", 0)
    monkeypatch.setattr(clawvm.core.ids, "_counter", 0)
    ids = [new_id() for _ in range(5000)]  # > 4096 in one millisecond
    frozen[0] -= 10_000 * 1_000_000  # the wall clock steps back 10 s
    ids += [new_id() for _ in range(10)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert all(uuid.UUID(i).version == 7 for i in ids)
    assert _parts(ids[0])[0] == 1_900_000_000_000
    assert _parts(ids[4096])[0] == 1_900_000_000_001  # borrowed the next millisecond


def test_is_valid_id_accepts_only_canonical_uuid_text() -> None:
    ident = new_id()
    assert is_valid_id(ident)
    assert is_valid_id(str(uuid.uuid4()))  # imported ids keep their version
    for bad in (ident.upper(), ident.replace("-", ""), "{" + ident + "}", ident[:-1], "", "memory-1"):
        assert not is_valid_id(bad)


# ---- JSON round trip ----------------------------------------------------------------------------------
def test_json_nested_up_to_the_limit_is_stored_and_reads_back(harness: Harness) -> None:
    deepest = nested(MAX_JSON_DEPTH - 1, {})  # MAX_JSON_DEPTH levels: the metadata object is level 0
    m = harness.record(nested(MAX_JSON_DEPTH, "leaf"), metadata=deepest)
    assert harness.get(m.id).metadata == deepest
    assert harness.get(m.id).content_json() == nested(MAX_JSON_DEPTH, "leaf")
    assert [x.id for x in harness.list()] == [m.id]


def test_too_deep_metadata_in_an_update_is_refused_and_nothing_changes(harness: Harness) -> None:
    m = harness.record("kept as it was", metadata={"n": 1})
    before = (harness.get(m.id), len(harness.events()))
    for bad in ({"metadata": nested(DEEP, {})}, {"content": nested(DEEP, 1)}):
        with pytest.raises(ValidationError) as exc:
            harness.update(m.id, **bad)
        assert exc.value.field == next(iter(bad)) and str(MAX_JSON_DEPTH) in exc.value.fix
    assert (harness.get(m.id), len(harness.events())) == before


def test_metadata_over_its_size_limit_is_refused_and_nothing_changes() -> None:
    """Content had a limit, metadata none: three megabytes were stored and read with every list."""
    with Harness.open("memory://", embedder=None) as h:
        m = h.record("a note", metadata={"n": 1})
        fits = "é" * ((MAX_METADATA_BYTES - 20) // 2)  # two bytes each in UTF-8
        assert h.record("at the limit", metadata={"a": fits}).metadata == {"a": fits}
        for call in (
            lambda: h.record("x", metadata={"a": fits + "é" * 20}),
            lambda: h.update(m.id, metadata={"a": "y" * MAX_METADATA_BYTES}),
        ):
            with pytest.raises(ValidationError) as refused:
                call()
            assert refused.value.field == "metadata" and "content" in refused.value.fix
        assert h.get(m.id).metadata == {"n": 1} and h.count() == 2


def test_too_deep_metadata_cannot_come_in_through_json() -> None:
    good = json.loads(Memory(content="x").to_json())
    with pytest.raises(ValidationError) as exc:
        Memory.from_json(json.dumps({**good, "metadata": nested(DEEP, {})}))
    assert exc.value.field == "metadata"


@settings(max_examples=150, deadline=None)
@given(m=memories())
def test_memory_json_round_trip(m: Memory) -> None:
    text = m.to_json()
    back = Memory.from_json(text)
    assert back == m
    assert back.to_json() == text
    assert Memory.from_json(text.encode()) == m
    assert json.loads(text)["id"] == m.id
    # engines read their rows back with the input-only checks skipped: the same memory either way
    assert Memory.model_validate_json(text, context=STORED) == m


def test_only_the_stored_context_skips_the_input_checks() -> None:
    bad = json.loads(Memory(content="x", tags=["a"]).to_json()) | {"id": "not-an-id", "tags": [" a ", "a"]}
    with pytest.raises(ValidationError) as exc:  # an import (from_json) is input: checked in full
        Memory.from_json(json.dumps(bad))
    assert exc.value.field == "id"
    with pytest.raises(pydantic.ValidationError):  # a look-alike context is not the engines' marker
        Memory.model_validate_json(json.dumps(bad), context={"stored": True})
    assert Memory.model_validate_json(json.dumps(bad), context=STORED).tags == [" a ", "a"]


def test_from_json_errors_are_ours_and_name_the_field() -> None:
    good = json.loads(Memory(content="x").to_json())
    with pytest.raises(ValidationError) as exc:
        Memory.from_json(json.dumps({**good, "kind": "bogus"}))
    assert exc.value.field == "kind"
    with pytest.raises(ValidationError) as exc:
        Memory.from_json("{not json")
    with pytest.raises(ValidationError) as exc:
        Memory.from_json(json.dumps({k: v for k, v in good.items() if k != "content"}))
    assert exc.value.field == "content"


# ---- filters ------------------------------------------------------------------------------------------
def test_filters_of_rejects_unknown_names() -> None:
    with pytest.raises(ValidationError) as exc:
        Filters.of(session_id="s1", sesion_id="typo")
    assert exc.value.field == "sesion_id"
    assert "session_id" in exc.value.fix


def test_filters_of_normalizes_what_callers_write() -> None:
    f = Filters.of(
        kind=Kind.TOOL_CALL,
        tags=["a", "b"],
        tags_any="c",
        session_id=["s1", "s2"],
        tenant=None,
        created_after=datetime(2026, 1, 1),
        pinned=1,
    )
    assert f.kind == frozenset({"tool_call"})
    assert f.tags_all == frozenset({"a", "b"}) and f.tags_any == frozenset({"c"})
    assert f.session_id == frozenset({"s1", "s2"}) and f.tenant is None
    assert f.created_after == datetime(2026, 1, 1, tzinfo=UTC)
    assert f.pinned is True
    # ISO 8601 text as record() takes it for expires_at (a date alone: midnight UTC); not any text
    assert Filters.of(created_before="2026-01-01").created_before == datetime(2026, 1, 1, tzinfo=UTC)
    later = Filters.of(created_after="2026-01-01T10:00:00+02:00").created_after
    assert later == datetime(2026, 1, 1, 8, tzinfo=UTC)
    for bad in ("yesterday", 20260101):
        with pytest.raises(ValidationError) as exc:
            Filters.of(created_before=bad)
        assert exc.value.field == "created_before" and "ISO 8601" in exc.value.fix


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"tier": "hot"}, "tier"),
        ({"kind": ["observation", "thought"]}, "kind"),
        ({"status": "gone"}, "status"),
        ({"state": "bad"}, "state"),
        ({"scope": "everyone"}, "scope"),
        ({"pinned": "false-ish"}, "pinned"),
        ({"pinned": 2}, "pinned"),
        ({"session_id": 5}, "session_id"),
        ({"tags": ["ok", 7]}, "tags"),
    ],
)
def test_a_filter_value_that_could_match_nothing_is_refused_naming_the_filter(
    given: dict[str, Any], field: str
) -> None:
    """A misspelt enum value used to count 0 quietly; ``pinned="false"`` counted the pinned memories."""
    with pytest.raises(ValidationError) as err:
        Filters.of(**given)
    assert err.value.field == field


def test_filters_take_enum_values_as_strings_or_enums_and_pinned_as_true_or_false() -> None:
    assert Filters.of(kind=[Kind.OBSERVATION, "decision"]).kind == frozenset({"observation", "decision"})
    assert Filters.of(pinned="false").pinned is False and Filters.of(pinned=True).pinned is True
    with Harness.open("memory://", embedder=None) as h:
        h.record("pinned note", session_id="s", pinned=True)
        h.record("plain note", session_id="s")
        assert (h.count(pinned="false"), h.count(pinned="true")) == (1, 1)
        with pytest.raises(ValidationError, match="tier"):
            h.count(tier="hot")
        assert h.count() == 2  # nothing was changed by the refusals


def test_request_datetimes_are_rfc3339_date_times() -> None:
    from clawvm.core.model import iso_date_or_datetime, iso_datetime

    # RFC 3339 allows a lower-case t and z
    assert iso_datetime("2026-01-31t12:00:00z") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert iso_datetime("2026-01-31T14:00+02:00") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    for wrong in ("10531120", "2026-01-31", "2026-01-31 12:00:00Z", "0", "2026-W05"):
        with pytest.raises(ValueError, match="RFC 3339"):
            iso_datetime(wrong)
    assert iso_date_or_datetime("2026-01-31") == datetime(2026, 1, 31)  # a browser's date input


@pytest.mark.parametrize(
    ("fields", "field", "fix"),
    [
        ({"parent_id": "nope"}, "parent_id", "the id of a stored memory"),
        ({"metadata": {"x": object()}}, "metadata", "a dict of JSON values"),
        ({"tags": [""]}, "tags", "each a non-empty string"),
    ],
)
def test_a_field_s_own_check_names_what_to_pass(fields: dict[str, object], field: str, fix: str) -> None:
    """These said only "see the message" as their fix."""
    with pytest.raises(ValidationError) as exc:
        build_memory({"content": "x", "tenant": "t", **fields})
    assert exc.value.field == field and fix in exc.value.fix


def test_one_set_of_scope_and_tag_limits_for_every_way_in() -> None:
    """The SDK stored a 10,000-character session and 100 tags, which the REST API then refused to name."""
    for fields, name in (
        ({"session_id": "s" * (MAX_SCOPE_ID_CHARS + 1)}, "session_id"),
        ({"agent_id": "a" * (MAX_SCOPE_ID_CHARS + 1)}, "agent_id"),
        ({"tags": [f"t{i}" for i in range(MAX_TAGS + 1)]}, "tags"),
    ):
        with pytest.raises(ValidationError) as exc:
            build_memory({"content": "x", **fields})
        assert exc.value.field == name
    fits = build_memory(
        {"content": "x", "session_id": "s" * MAX_SCOPE_ID_CHARS, "tags": [f"t{i}" for i in range(MAX_TAGS)]}
    )
    assert len(fits.tags) == MAX_TAGS
    long_ago = Memory.model_validate({"content": "x", "session_id": "s" * 300}, context=STORED)
    assert long_ago.session_id == "s" * 300  # a row stored before the limit still reads


def test_a_memory_stored_before_a_limit_can_still_change() -> None:
    """revalidate() judged every field by the new rules: a row with 70 tags, a 300-character session or
    an old-style tenant name could no longer be paged, pinned or archived."""
    legacy = Memory.model_validate(
        {
            "content": "x",
            "tenant": "acme corp",
            "session_id": "s" * 300,
            "tags": [f"t{i}" for i in range(70)],
            "metadata": {"blob": "y" * (MAX_METADATA_BYTES + 1)},
        },
        context=STORED,
    )
    archived = revalidate(legacy, {"tier": "archive", "version": 2})
    assert (archived.tier.value, len(archived.tags), archived.tenant) == ("archive", 70, "acme corp")
    assert archived.metadata == legacy.metadata
    with pytest.raises(ValidationError) as exc:  # a change is new input: the rules judge it
        revalidate(legacy, {"tags": [f"u{i}" for i in range(MAX_TAGS + 1)]})
    assert exc.value.field == "tags"


def test_a_union_of_tags_keeps_the_harness_marks_within_the_limit() -> None:
    union = capped_tags(["interrupted"], [f"t{i}" for i in range(MAX_TAGS)])
    assert len(union) == MAX_TAGS and union[0] == "interrupted"
    assert capped_tags(["a", "b"], ["b", "c"]) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"pinned": "no"}, "pinned"),  # a non-empty string is true: "no" pinned
        ({"pinned": "yes"}, "pinned"),
        ({"pinned": 1}, "pinned"),
        ({"confidence": True}, "confidence"),  # a flag for a number
        ({"confidence": "0.3"}, "confidence"),  # REST refuses "0.3" for a number: so does the library
    ],
)
def test_pinned_and_confidence_take_their_own_types_only(fields: dict[str, Any], field: str) -> None:
    with Harness.open("memory://", embedder=None) as h:
        with pytest.raises(ValidationError) as exc:
            h.record("the cache is warm", session_id="s1", **fields)
        assert exc.value.field == field and h.count(status="any") == 0
        m = h.record("the cache is warm", session_id="s1", confidence=1)  # an int is a number
        with pytest.raises(ValidationError) as exc:
            h.update(m.id, **fields)
        assert exc.value.field == field and h.get(m.id) == m
        with pytest.raises(ValidationError) as exc:
            h.rate(m.id, True)  # type: ignore[arg-type]
        assert exc.value.field == "delta"
