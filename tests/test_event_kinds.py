"""Event kinds are an enum with typed payloads: every event the demo workload writes (records, moves,
recalls, contexts, outputs, tool calls, team work, manual actions, ticks) has a known kind, and its ``data``
holds every key its payload type promises."""

from __future__ import annotations

from collections import Counter

import pytest

from clawvm.demo.scenario import ReplayClock, load_scenario, open_demo
from clawvm.store import Event
from clawvm.store.eventlog import iter_events
from clawvm.store.kinds import PAYLOADS, EventKind, kind_of, missing_keys


def test_every_kind_has_a_payload_type() -> None:
    assert set(PAYLOADS) == set(EventKind)


def test_a_known_kind_reads_back_as_its_member_and_an_unknown_one_as_text() -> None:
    assert Event("add").kind is EventKind.ADD and Event("add").kind == "add"
    assert kind_of("from-a-newer-writer") == "from-a-newer-writer"
    assert not isinstance(Event("from-a-newer-writer").kind, EventKind)
    assert missing_keys(EventKind.ADD, {"kind": "note"}) == ["tier"]
    assert missing_keys("from-a-newer-writer", {}) == []
    # NotRequired keys are optional (under postponed annotations Python 3.11 counted them as required)
    assert missing_keys(EventKind.ROLLBACK, {"name": "c", "restored": [], "obsoleted": []}) == []
    assert missing_keys(EventKind.ADD, {"kind": "note", "tier": "working"}) == []  # pinned: optional


@pytest.mark.timeout(600)
def test_the_demo_writes_only_known_kinds_with_their_payloads() -> None:
    clock = ReplayClock()
    h = open_demo("memory://", clock, embed=False)
    try:
        load_scenario(h, clock, echo=lambda _line: None)
        events = list(iter_events(h.store))
    finally:
        h.close()
    kinds = Counter(e.kind for e in events)
    unknown = sorted(str(k) for k in kinds if not isinstance(k, EventKind))
    assert not unknown, f"events of kinds outside EventKind: {unknown}"
    incomplete = {
        (str(e.kind), tuple(missing_keys(e.kind, e.data))) for e in events if missing_keys(e.kind, e.data)
    }
    assert not incomplete, f"payload keys missing: {sorted(incomplete)}"
    # the demo exercises the main kinds, so the check above is not vacuous
    assert {
        EventKind.ADD,
        EventKind.DEMOTE,
        EventKind.RETRIEVE,
        EventKind.CONTEXT,
        EventKind.OUTPUT,
        EventKind.GRANT,
        EventKind.REVISE,
        EventKind.MANUAL,
    } <= set(kinds)
