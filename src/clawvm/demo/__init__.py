"""The demo workload: five weeks of an ops assistant's sessions, written for the project.

``run_demo`` ingests it into a store (as the agent would have recorded it, with its timestamps) and runs
the workload's questions, printing each answer's evidence. Where the LoCoMo dev data exists beside the
project it can be ingested too (``locomo=PATH``), but the default needs nothing outside the package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from clawvm.harness import Harness
from clawvm.observe.lens import record_output


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


#: The context budget of a LoCoMo question's build (tokens): a few turns' worth, as an agent would spend.
LOCOMO_BUDGET = 400
#: How a LoCoMo session's date reads (``session_<n>_date_time``), e.g. "1:56 pm on 8 May, 2023".
#: When a conversation whose first session has no readable date starts.
LOCOMO_START = datetime(2023, 1, 1, tzinfo=UTC)
_LOCOMO_DATE = "%I:%M %p on %d %B, %Y"
_DIA_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")  # tolerant: "D:11:26", "D 3:4", "D30:05"


@dataclass(frozen=True)
class LocomoIngest:
    """What :func:`ingest_locomo_conversation` recorded: the conversation is one session (its id the
    sample's), with a context build per question whose evidence turns are known."""

    session_id: str
    turns: int
    builds: int
    evidence_in_context: int  # builds whose context held at least one evidence turn (the ones it cited)


def load_locomo(path: Path) -> list[dict[str, Any]]:
    """The LoCoMo samples of ``path`` (evaluation data, never shipped: read from where it lies)."""
    samples: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return samples


def ingest_locomo(harness: Harness, path: Path, *, builds: bool = True) -> int:
    """Ingest every LoCoMo conversation of ``path`` (see :func:`ingest_locomo_conversation`); returns the
    number of turns recorded."""
    return sum(ingest_locomo_conversation(harness, s, builds=builds).turns for s in load_locomo(path))


def ingest_locomo_conversation(
    harness: Harness,
    sample: dict[str, Any],
    *,
    builds: bool = True,
    budget: int = LOCOMO_BUDGET,
    on_time: Callable[[datetime], None] | None = None,
) -> LocomoIngest:
    """Record one LoCoMo conversation as an agent would have: each turn a ``user_input`` of the session
    named by the sample id (``metadata.dia_id`` and ``metadata.locomo_session`` say where it was said), at
    its session's date; then, with ``builds``, each question with evidence as a context build of that
    session and an answer citing the evidence turns the build held, so a what-if replay
    (:mod:`clawvm.replay`) knows what each build needed. ``on_time`` is called with each step's time first
    (a replay clock follows the conversation with it)."""
    session_id = str(sample["sample_id"])
    conv = sample["conversation"]
    by_dia: dict[str, str] = {}
    at: datetime | None = None
    last: datetime | None = None  # the previous turn's time
    for key, turns in conv.items():
        if not key.startswith("session_") or not isinstance(turns, list):
            continue  # the session_<n>_date_time keys: read beside their session
        dated = _locomo_date(conv.get(f"{key}_date_time"), at or LOCOMO_START)
        at = dated if at is None else max(at, dated)
        idle = timedelta(hours=harness.pager.config.session_idle_hours)
        for n, turn in enumerate(turns):
            when = at + timedelta(minutes=n)
            if on_time is not None:
                on_time(when)
            if n == 0 and last is not None and when - last >= idle:
                harness.tick()  # the conversation paused for days: the periodic pass ran meanwhile
            last = when
            memory = harness.record(
                f"{turn['speaker']}: {turn['text']}",
                kind="user_input",
                session_id=session_id,
                created_at=when,
                metadata={"dia_id": turn["dia_id"], "locomo_session": key},
            )
            by_dia[_dia_id(str(turn["dia_id"]))] = memory.id
        at += timedelta(minutes=len(turns))
    at = at or LOCOMO_START
    n_builds = held = 0
    for qa in sample.get("qa", []) if builds else []:
        evidence = {by_dia[d] for d in _evidence_ids(qa.get("evidence", [])) if d in by_dia}
        if not evidence:
            continue  # nothing to judge a build by (adversarial items, evidence naming no turn)
        at += timedelta(minutes=1)
        if on_time is not None:
            on_time(at)
        ctx = harness.context(str(qa["question"]), budget_tokens=budget, session_id=session_id)
        cited = [e for e in ctx.manifest if e.id in evidence]
        refs = " ".join(f"[{e.short_id}]" for e in cited)
        answer = qa.get("answer", qa.get("adversarial_answer", ""))
        record_output(
            harness, ctx, f"{answer}. Sources: {refs}" if cited else f"{answer}.", success=bool(cited)
        )
        n_builds += 1
        held += bool(cited)
    return LocomoIngest(session_id, len(by_dia), n_builds, held)


def _locomo_date(text: object, fallback: datetime) -> datetime:
    try:
        return datetime.strptime(str(text), _LOCOMO_DATE).replace(tzinfo=UTC)
    except ValueError:  # a session without a (readable) date: it follows the previous one
        return fallback


def _dia_id(text: str) -> str:
    found = _DIA_ID.search(text)
    return f"D{int(found.group(1))}:{int(found.group(2))}" if found else text


def _evidence_ids(evidence: list[Any]) -> list[str]:
    """Evidence ids as LoCoMo writes them, one string sometimes holding several ("D8:6; D9:17")."""
    return [_dia_id(m.group(0)) for item in evidence for m in _DIA_ID.finditer(str(item))]


def run_demo(
    harness: Harness, echo: Callable[[str], None] = print, locomo: Path | None = None, k: int = 5
) -> dict[str, Any]:
    """Ingest the workload, wait for embeddings, answer its questions; returns a summary."""
    workload = load_workload()
    n = ingest_workload(harness, workload)
    echo(f"ingested {n} memories from {len(workload['sessions'])} sessions of '{workload['name']}'")
    if locomo is not None:
        echo(f"ingested {ingest_locomo(harness, locomo, builds=False)} LoCoMo turns from {locomo}")
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


__all__ = [
    "LocomoIngest",
    "ingest_locomo",
    "ingest_locomo_conversation",
    "ingest_workload",
    "load_locomo",
    "load_workload",
    "run_demo",
]
