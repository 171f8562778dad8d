"""Guidance for one agent about to work on a task: what the team learned that applies, under a token budget.

``build_guidance`` gathers, among the memories the agent may read (enforced by the store query through
``Filters.visible_to``):

- **rules**: seed rule templates whose task type or keywords match the task (:mod:`clawvm.teams.seed`);
- **pitfalls**: ERROR memories and KNOWLEDGE tagged ``pitfall`` (what fusion synthesizes from recurring
  errors) that recall finds for the task text, plus those learned on earlier tasks of the same task type
  (their relevance gets +0.5: having failed on this kind of task is the strongest hint there is);
- **experiences**: DECISION, OBSERVATION and other KNOWLEDGE memories recall finds for the task, each with
  the tasks it came from and its adoption rate;
- **open conflicts**: conflict notes between DECISION/KNOWLEDGE memories the agent may read. Of two
  decisions in an open conflict only the newer is listed as an experience; the conflict line names both.

Items are ranked by relevance x trust (confidence, halved while awaiting review, 1 once approved) x
adoption (0.5 + (adopted + 1) / (adopted + ignored + 2)), packed section by section (rules, pitfalls,
conflicts, experiences) within quotas of the budget, then leftovers fill what is left. The text never goes
over ``budget_tokens`` (counted with the embedding model's tokenizer, like the context builder). Guidance
is read-only: it changes no memory; :func:`clawvm.teams.shared.feedback` records what was adopted.
"""

from __future__ import annotations

import builtins
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawvm.core.embed import count_tokens
from clawvm.core.errors import ValidationError
from clawvm.core.model import Kind, Memory, Status, Visibility
from clawvm.recall.retrieval import Recalled
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.teams.shared import (
    CONFLICT_TAG,
    PITFALL_TAG,
    RULE_TAG,
    TEAM_KINDS,
    TeamHost,
    adoption,
    adoption_rate,
    conflict_sides,
    latest_if_kept,
    lineage,
    open_conflicts,
    task_type_tag,
    trust,
    visibility,
)
from clawvm.vm.context import clip, short_id


class GuidanceHost(TeamHost, Protocol):
    """A team host that can list and recall (the scope filters of the harness apply)."""

    def list(self, limit: int = 100, **filters: Any) -> builtins.list[Memory]: ...

    def iter_all(
        self, *, newest_first: bool = False, batch: int = 500, **filters: Any
    ) -> Iterator[Memory]: ...

    def recall(
        self, query: str, k: int = 10, *, track: bool = True, **filters: Any
    ) -> builtins.list[Recalled]: ...


SECTIONS = ("rule", "pitfall", "conflict", "experience")
HEADERS = {
    "rule": "Team rules:",
    "pitfall": "Pitfalls seen before (avoid):",
    "conflict": "Open conflicts (unresolved, check before relying on either):",
    "experience": "Relevant experience:",
}
#: Share of the budget each section may take in the first pass (the rest flows on in the second).
QUOTAS = {"rule": 0.3, "pitfall": 0.5, "conflict": 0.2, "experience": 1.0}
MAX_LINE_CHARS = 320


@dataclass(frozen=True)
class GuidanceItem:
    """One line of guidance and where it came from (the manifest entry)."""

    id: str
    section: str
    kind: str
    line: str
    tokens: int
    score: float
    source_tasks: tuple[str, ...]
    adoption_rate: float | None
    confidence: float
    reason: str

    def as_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["source_tasks"] = list(self.source_tasks)
        return d


@dataclass
class Guidance:
    agent_id: str
    task: str
    text: str
    items: list[GuidanceItem]
    budget: int
    tokens: int
    by_section: dict[str, int] = field(default_factory=dict)

    def section(self, name: str) -> list[GuidanceItem]:
        return [i for i in self.items if i.section == name]

    @property
    def rules(self) -> list[GuidanceItem]:
        return self.section("rule")

    @property
    def pitfalls(self) -> list[GuidanceItem]:
        return self.section("pitfall")

    @property
    def experiences(self) -> list[GuidanceItem]:
        return self.section("experience")

    @property
    def conflicts(self) -> list[GuidanceItem]:
        return self.section("conflict")

    @property
    def ids(self) -> list[str]:
        return [i.id for i in self.items]

    @property
    def manifest(self) -> list[dict[str, Any]]:
        return [i.as_dict() for i in self.items]


@dataclass(frozen=True)
class _Candidate:
    memory: Memory
    section: str
    relevance: float
    reason: str
    line: str = ""

    @property
    def priority(self) -> float:
        adopted, ignored = adoption(self.memory)
        return self.relevance * trust(self.memory) * (0.5 + (adopted + 1) / (adopted + ignored + 2))


def source_tasks(m: Memory) -> tuple[str, ...]:
    """The tasks a memory was learned on (every source's, for fused and synthesized memories)."""
    tasks = [str(t) for t in m.metadata.get("source_tasks", [])]
    if m.task_id and m.task_id not in tasks:
        tasks.insert(0, m.task_id)
    return tuple(tasks)


def section_of(m: Memory) -> str:
    if RULE_TAG in m.tags:
        return "rule"
    if m.kind is Kind.NOTE and CONFLICT_TAG in m.tags:
        return "conflict"
    if m.kind is Kind.ERROR or (m.kind is Kind.KNOWLEDGE and PITFALL_TAG in m.tags):
        return "pitfall"
    return "experience"


def format_line(m: Memory) -> str:
    text = clip(m.content, MAX_LINE_CHARS)
    notes = []
    tasks = source_tasks(m)
    if tasks:
        shown = ", ".join(tasks[:4]) + (f" +{len(tasks) - 4}" if len(tasks) > 4 else "")
        notes.append(f"tasks {shown}")
    adopted, ignored = adoption(m)
    if adopted + ignored:
        notes.append(f"adopted {adopted}/{adopted + ignored}")
    if m.kind is not Kind.NOTE and (trust(m) < m.confidence or m.confidence < 1.0):
        notes.append(f"confidence {m.confidence:.2f}" + (", unreviewed" if trust(m) < m.confidence else ""))
    suffix = f" ({'; '.join(notes)})" if notes else ""
    label = "rule" if RULE_TAG in m.tags else m.kind.value
    return f"- [{short_id(m.id)}] {label}: {text}{suffix}"


def matching_rules(h: GuidanceHost, vis: Visibility, task: str, task_type: str | None) -> list[Memory]:
    """Active rule templates the agent may read whose task type or keywords match the task."""
    rules = h.iter_all(newest_first=True, kind=Kind.KNOWLEDGE, tags=[RULE_TAG], visible_to=vis)
    words = set(re.findall(r"\w+", task.lower()))
    out = []
    for m in rules:
        rule = m.metadata.get("rule", {})
        wanted_type = rule.get("task_type")
        keywords = [str(k).lower() for k in rule.get("keywords", [])]
        type_ok = task_type is not None and wanted_type == task_type.strip().lower()
        keyword_ok = any((k in words) if k.isalnum() else (k in task.lower()) for k in keywords)
        if type_ok or keyword_ok:
            out.append(m)
    return out


def build_guidance(
    h: GuidanceHost,
    agent_id: str,
    task: str,
    budget_tokens: int = 600,
    *,
    task_id: str | None = None,
    task_type: str | None = None,
    k: int = 30,
) -> Guidance:
    """Guidance for ``agent_id`` about to work on ``task`` (see the module docstring)."""
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 1:
        raise ValidationError("budget_tokens", f"is {budget_tokens!r}", "pass a positive integer")
    if not isinstance(task, str):
        raise ValidationError("task", f"has type {type(task).__name__}", "pass the task's text")
    if not isinstance(agent_id, str) or not agent_id.strip():  # None failed in Python; "" found nothing
        raise ValidationError("agent_id", f"is {agent_id!r}", "name the agent the guidance is for")
    for name, given in (("task_id", task_id), ("task_type", task_type)):
        if given is not None and (not isinstance(given, str) or not given.strip()):  # "" was ignored
            raise ValidationError(name, f"is {given!r}", "pass a non-empty string, or leave it out")
    vis = visibility(h, agent_id, [task_id] if task_id else [])
    found: dict[str, _Candidate] = {}

    def offer(m: Memory, relevance: float, reason: str) -> None:
        if m.status is not Status.ACTIVE or m.id in found:
            return
        found[m.id] = _Candidate(m, section_of(m), relevance, reason)

    for m in matching_rules(h, vis, task, task_type):
        offer(m, 1.0, "rule matches the task")
    if task.strip():
        hits = h.recall(task, k=k, track=False, visible_to=vis, kind=list(TEAM_KINDS))
        for rank, hit in enumerate(hits):
            if RULE_TAG in hit.memory.tags:  # a rule applies when its type or keywords match, above
                continue
            offer(hit.memory, max(hit.score, 1e-3), f"recall #{rank + 1} ({hit.score:.2f})")
    if task_type:
        same_type = h.list(
            limit=50, visible_to=vis, kind=[Kind.ERROR, Kind.KNOWLEDGE], tags=[task_type_tag(task_type)]
        )
        for m in same_type:  # learned on this kind of task: a strong hint, on top of any text match
            earlier = found.pop(m.id, None)
            boost = 0.5 + (earlier.relevance if earlier is not None else 0.0)
            also = f", {earlier.reason}" if earlier is not None else ""
            offer(m, boost, f"learned on an earlier {task_type} task{also}")
    conflicts = open_conflicts(h, visible_to=vis)
    _prefer_newest_decisions(h, vis, found, conflicts)
    disputed: dict[str, set[str]] = defaultdict(set)  # a side of an open conflict -> its conflict notes
    for note in conflicts:
        sides = conflict_sides(note)
        touched = [c.memory.id for c in found.values() if lineage(c.memory) & sides]
        for side in touched:
            disputed[side].add(note.id)
        offer(note, 1.0 if touched else 0.2, "conflict among these memories" if touched else "open conflict")
    picked = _pack(list(found.values()), budget_tokens, disputed)
    items = [
        GuidanceItem(
            id=c.memory.id,
            section=c.section,
            kind=c.memory.kind.value,
            line=c.line,
            tokens=count_tokens(c.line),
            score=round(c.priority, 4),
            source_tasks=source_tasks(c.memory),
            adoption_rate=adoption_rate(c.memory),
            confidence=c.memory.confidence,
            reason=c.reason,
        )
        for c in picked
    ]
    text = _render(picked)
    tokens = count_tokens(text) if text else 0
    by_section = {s: sum(i.tokens for i in items if i.section == s) for s in SECTIONS}
    h.writer.log(
        [
            Event(
                kind=EventKind.GUIDANCE,
                tenant=h.tenant,
                at=h.now(),
                data={
                    "agent_id": agent_id,
                    "task": h.writer.scrub(task, h.tenant)[:500],
                    "task_id": task_id,
                    "budget": budget_tokens,
                    "tokens": tokens,
                    "manifest": [i.as_dict() for i in items],
                },
            )
        ]
    )
    return Guidance(agent_id, task, text, items, budget_tokens, tokens, by_section)


def _prefer_newest_decisions(
    h: GuidanceHost, vis: Visibility, found: dict[str, _Candidate], conflicts: Iterable[Memory]
) -> None:
    """An older DECISION of an open conflict is replaced by the conflict's newest decision (the current
    revision of each side counts), so guidance never offers a decision that a later one contradicts."""
    for note in conflicts:
        ids = conflict_sides(note)
        older = [c for c in found.values() if c.memory.kind is Kind.DECISION and lineage(c.memory) & ids]
        if not older:
            continue
        heads = [latest_if_kept(h, i) for i in note.metadata.get("conflict", {}).get("ids", [])]
        decisions = [
            m
            for m in heads
            if m is not None and m.kind is Kind.DECISION and m.status is Status.ACTIVE and vis.allows(m)
        ]
        if not decisions:
            continue
        newest = max(decisions, key=lambda m: (m.created_at, m.id))
        best = max(older, key=lambda c: c.relevance)
        for c in older:
            if c.memory.id != newest.id:
                del found[c.memory.id]
        if newest.id not in found:
            reason = "the newest side of a conflict"
            found[newest.id] = _Candidate(newest, section_of(newest), best.relevance, reason)


def _pack(
    candidates: list[_Candidate], budget: int, disputed: Mapping[str, set[str]] | None = None
) -> list[_Candidate]:
    """Pick lines: per section in order, best first, within the section's quota; then leftovers. A side
    of an open conflict (``disputed``: its id -> the conflict notes) only after its conflict's line: at a
    small budget the conflict line did not fit while the side did, which read as the team's settled
    practice."""
    header_tokens = {s: count_tokens(HEADERS[s]) for s in SECTIONS}
    lines = {id(c): format_line(c.memory) for c in candidates}
    cost = {id(c): count_tokens(lines[id(c)]) for c in candidates}
    picked: list[_Candidate] = []
    used = 0
    opened: set[str] = set()

    def try_add(c: _Candidate, limit: int) -> bool:
        nonlocal used
        if not (disputed or {}).get(c.memory.id, set()) <= {p.memory.id for p in picked}:
            return False
        extra = cost[id(c)] + (0 if c.section in opened else header_tokens[c.section])
        if used + extra > limit:
            return False
        used += extra
        opened.add(c.section)
        picked.append(_Candidate(c.memory, c.section, c.relevance, c.reason, lines[id(c)]))
        return True

    ranked = {
        s: sorted((c for c in candidates if c.section == s), key=lambda c: -c.priority) for s in SECTIONS
    }
    left: list[_Candidate] = []
    for s in SECTIONS:
        section_start = used
        for c in ranked[s]:
            if not try_add(c, min(budget, section_start + int(QUOTAS[s] * budget))):
                left.append(c)
    for c in left:
        try_add(c, budget)
    return picked


def _render(picked: list[_Candidate]) -> str:
    out: list[str] = []
    for s in SECTIONS:
        lines = [c.line for c in picked if c.section == s]
        if lines:
            out += [HEADERS[s], *lines]
    return "\n".join(out)
