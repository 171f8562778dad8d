"""The demo workload: five weeks of an ops assistant's sessions, written for the project.

``run_demo`` ingests it into a store (as the agent would have recorded it, with its timestamps) and runs
the workload's questions, printing each answer's evidence. Where the LoCoMo dev data exists beside the
project it can be ingested too (``locomo=PATH``), but the default needs nothing outside the package.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from clawvm.harness import Harness


def load_workload() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("workload.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def ingest_workload(
    harness: Harness, workload: dict[str, Any], on_time: Callable[[datetime], None] | None = None
) -> int:
    """Record every record of every session, chaining tool results to their calls. Returns the count.

    A tool result's duration (``cost.seconds``, what the reliability view's latencies are made of) is the
    workload's stated latency: the time from its call to it, as the agent would have measured it.
    ``on_time`` is called with each record's time first (a replay clock follows the workload with it)."""
    n = 0
    for session in workload["sessions"]:
        last_call: str | None = None
        call_at: datetime | None = None
        for rec in session["records"]:
            at = datetime.fromisoformat(rec["at"].replace("Z", "+00:00"))
            if on_time is not None:
                on_time(at)
            fields: dict[str, Any] = {
                "kind": rec["kind"],
                "session_id": session["session_id"],
                "task_id": session.get("task_id"),
                "agent_id": session.get("agent_id"),
                "created_at": at,
                "tags": rec.get("tags", []),
            }
            for key in ("state", "tool_name"):
                if key in rec:
                    fields[key] = rec[key]
            if rec["kind"] == "tool_result" and last_call is not None and call_at is not None:
                latency = max(0.0, (at - call_at).total_seconds())
                fields["parent_id"] = last_call
                fields["cost"] = {"seconds": latency}
                fields["metadata"] = {"tool_result": {"call_id": last_call, "duration_s": latency}}
            memory = harness.record(rec["content"], **fields)
            last_call, call_at = (memory.id, at) if rec["kind"] == "tool_call" else (None, None)
            n += 1
    return n


def ingest_locomo(harness: Harness, path: Path) -> int:
    """Ingest LoCoMo conversations (evaluation data, never shipped) as user_input turns."""
    n = 0
    for sample in json.loads(path.read_text(encoding="utf-8")):
        conv = sample["conversation"]
        for key, turns in conv.items():
            if not key.startswith("session_") or not isinstance(turns, list):
                continue
            for turn in turns:
                harness.record(
                    f"{turn['speaker']}: {turn['text']}",
                    kind="user_input",
                    session_id=f"{sample['sample_id']}/{key}",
                    task_id=sample["sample_id"],
                    metadata={"dia_id": turn["dia_id"]},
                )
                n += 1
    return n


def run_demo(
    harness: Harness, echo: Callable[[str], None] = print, locomo: Path | None = None, k: int = 5
) -> dict[str, Any]:
    """Ingest the workload, wait for embeddings, answer its questions; returns a summary."""
    workload = load_workload()
    n = ingest_workload(harness, workload)
    echo(f"ingested {n} memories from {len(workload['sessions'])} sessions of '{workload['name']}'")
    if locomo is not None:
        echo(f"ingested {ingest_locomo(harness, locomo)} LoCoMo turns from {locomo}")
    harness.flush()
    found = 0
    for q in workload["queries"]:
        hits = harness.recall(q["query"], k=k, agent_id="ops-assistant")
        texts = [h.memory.content for h in hits]
        ok = any(q["expect"] in t for t in texts)
        found += ok
        echo(f"\nQ: {q['query']}  [{'evidence found' if ok else 'evidence missed'} in top {k}]")
        for h in hits:
            m = h.memory
            channels = ", ".join(f"{c} {s.raw:.2f}" for c, s in h.explain.items())
            line = m.content if len(m.content) < 160 else m.content[:157] + "..."
            where = f"{m.kind.value} {m.session_id} {m.created_at:%Y-%m-%d} {m.id[-8:]}"
            echo(f"  {h.score:.2f} [{where}] ({channels}) {line}")
    echo(f"\n{found}/{len(workload['queries'])} questions had their evidence in the top {k}")
    return {"memories": n, "questions": len(workload["queries"]), f"evidence_in_top_{k}": found}


__all__ = ["ingest_locomo", "ingest_workload", "load_workload", "run_demo"]
