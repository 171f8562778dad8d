"""The demo's recorded tool calls carry the latencies its design states, not the microseconds it runs in."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise

import pytest

from clawvm.agents.reliability import all_stats
from clawvm.demo import load_workload
from clawvm.demo.scenario import LATENCY_S, ReplayClock, load_scenario, open_demo


def stated_latencies() -> dict[str, list[float]]:
    """Per tool, the workload's own call-to-result times (seconds), read from its timestamps."""
    found: dict[str, list[float]] = {}
    for session in load_workload()["sessions"]:
        records = session["records"]
        for call, result in pairwise(records):
            if call["kind"] == "tool_call" and result["kind"] == "tool_result":
                took = datetime.fromisoformat(result["at"]) - datetime.fromisoformat(call["at"])
                found.setdefault(result["tool_name"], []).append(took.total_seconds())
    return found


def test_demo_tool_latencies_are_the_stated_ones() -> None:
    clock = ReplayClock()
    h = open_demo("memory://", clock, embed=False)
    try:
        load_scenario(h, clock, echo=lambda _line: None)
        stats = all_stats(h)
        # the workload's calls: each result's duration is the time its call took in the workload
        stated = stated_latencies()
        assert sum(map(len, stated.values())) > 20 and max(max(v) for v in stated.values()) > 300
        for tool, seconds in stated.items():
            results = h.list(limit=100, kind="tool_result", tool_name=tool, status="any")
            ingested = [m for m in results if m.session_id != "run-cutover" and "raw_of" not in m.metadata]
            assert sorted(m.cost.seconds for m in ingested) == sorted(seconds), tool
        # the scripted agent run: each tool takes its stated latency on the replay clock
        for tool, seconds in LATENCY_S.items():
            results = h.list(limit=100, kind="tool_result", tool_name=tool, session_id="run-cutover")
            assert results and all(m.cost.seconds == pytest.approx(seconds, abs=0.05) for m in results), tool
        assert stats["tessera_charge_eu"].p50_s == pytest.approx(LATENCY_S["tessera_charge_eu"], abs=0.05)
        # no tool shows the 0.00 s the dashboard used to print
        assert all(s.p50_s is not None and s.p50_s >= 0.1 for s in stats.values()), {
            t: s.p50_s for t, s in stats.items()
        }
        assert stats["tessera_charge"].unreliable and stats["tessera_charge"].p95_s == pytest.approx(
            10.0, abs=0.05
        )
    finally:
        h.close()
