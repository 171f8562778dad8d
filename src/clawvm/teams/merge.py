"""Fusion of a team's memories: near-duplicates merged, recurring errors turned into knowledge, conflicts
flagged. Run it after a task (or on a schedule): ``merge_team(harness, team_id=...)``.

Only memories with the same readers are ever fused together (same tenant, scope, team, task for TASK scope
and owner for PRIVATE scope: :func:`clawvm.teams.shared.partition_key`), so fusion never leaks a memory to an
agent who could not read it.

- **Near-duplicates** (same kind): lexical similarity (Jaccard of the analyzer's stemmed terms) at least
  ``duplicate_lexical``, or embedding cosine at least ``duplicate_dense`` when the harness has an embedder.
  Pairs with a contradiction signal (below) are never duplicates. Each connected group becomes one new
  revision of its most trusted (then newest) member, linked ``revises`` to it and
  ``derived_from`` every other member; ``metadata.provenance`` lists every source (id, agent, task, time),
  ``source_tasks`` their tasks, usage and adoption counts are summed. The sources become OBSOLETE
  (``merged_into``): kept for history, never recalled.
- **Recurring errors**: active ERROR memories cluster at the looser ``cluster_*`` thresholds; a cluster with
  ``min_occurrences`` errors from ``min_tasks`` tasks becomes a KNOWLEDGE memory tagged ``pitfall``
  (extractive by default: the cluster's most central error, with the count; or an LLM's lesson through any
  OpenAI-compatible endpoint, :class:`LLMSynthesizer`, which falls back to the extractive text, with a
  ``synthesizer_fallback`` event saying why, whenever the endpoint gives no usable lesson: the reasons of
  :mod:`clawvm.vm.compress`), ``derived_from`` every error, which are archived.
  Errors that recur later join the existing pitfall as a new revision of it.
- **Conflicts**: two active DECISION/KNOWLEDGE memories (of different revision chains) on the same subject —
  the same ``metadata.subject``, or without subjects a topic overlap of ``subject_lexical`` plus a
  contradiction signal (a negation in one only, or different numbers) — that are not duplicates get a
  conflict note (kind NOTE, tag ``conflict``, ``refers_to`` both). It waits in the review queue and shows in
  guidance until resolved (:func:`clawvm.teams.shared.resolve_conflict`, ``approve``, ``reject``).

Every write is compare-and-set: a group whose members changed meanwhile is skipped (``report.skipped``) and
picked up by the next run.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np

from clawvm.core.embed import Embedder, count_tokens
from clawvm.core.errors import ConflictError, UpstreamError, ValidationError
from clawvm.core.lexical import Analyzer
from clawvm.core.model import (
    Filters,
    Kind,
    Link,
    LinkType,
    Memory,
    Scope,
    Status,
    Tier,
    build_memory,
    capped_tags,
    counted,
    within,
)
from clawvm.core.openai_http import ChatEndpoint, EndpointFailure, FailureReason
from clawvm.core.vectors import normalize
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.teams.shared import (
    APPLICATION,
    CONFLICT_TAG,
    PITFALL_TAG,
    RULE_TAG,
    TEAM_KINDS,
    TeamHost,
    adoption,
    build_revision,
    lineage,
    partition_key,
    revision_pins,
    root_id,
    stored_id,
)
from clawvm.vm.compress import Fallback, drops_every_number, fallback_event, numbers_in
from clawvm.vm.context import short_id


class MergeHost(TeamHost, Protocol):
    """A team host whose embedder (if any) tells near-duplicates by their vectors."""

    @property
    def embedder(self) -> Embedder | None: ...


_ANALYZER = Analyzer()
#: Words that turn a statement around; what counts is their parity ("never disable X" turns twice). Beside
#: English, the negations of the languages a team writes in most: German, French, Spanish, Portuguese,
#: Italian and Arabic words, and the Chinese, Japanese and Korean negating letters and endings, which no
#: space sets apart ("不允许" is "允许" turned around; the words where the letter does not negate, such
#: as 不过 "but", 非常 "very", 未来 "future", are left out). Without them opposite decisions in those
#: languages read as duplicates, and the merge kept one and dropped the other.
_NEGATORS = re.compile(
    r"\b(?:not|no|never|none|nothing|nobody|neither|nor|cannot|dont|without"
    r"|nicht|kein\w*|nie|niemals|pas|jamais|nunca|não|nem|non|لا|لم|لن|ليس|ليست|غير)\b"
    r"|n['\u2019]t\b"
    r"|不(?![过過断斷仅僅但管论論久])|[没沒](?!落)|未(?![来來必])|[别別](?![人的])|勿|非(?!常)|[无無](?![论論])"
    r"|ない|ません|[않못없]",
    re.I,
)
#: Words that ask for one thing rather than its opposite: two texts with different ones of these ("enable
#: X" and "disable X", "avoid X" and "use X instead") say different things.
_STANCES = re.compile(
    r"\b(?:avoid\w*|instead|disabl\w*|enabl\w*|stop\w*|start\w*|forbid\w*|allow\w*|deny\w*)\b", re.I
)
#: A number with its sign (a minus that is no hyphen: "-5 seconds", not "2026-01-05").
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?|\d+(?:\.\d+)?")
#: The kinds whose memories fusion flags conflicts between.
CONFLICT_KINDS = (Kind.DECISION, Kind.KNOWLEDGE)
#: Namespace of the conflict notes' ids (see conflict_note_id).
_CONFLICT_NAMESPACE = uuid.UUID("9b7e1f3c-2a64-4d0b-8f51-6c3e2d1a7b90")


class SynthesisError(UpstreamError):
    """A synthesizer failed; the errors are left as they were. (The LLM synthesizer never raises it: it
    falls back to the extractive one. A synthesizer of your own may.)"""


@dataclass(frozen=True)
class MergeConfig:
    duplicate_lexical: float = 0.8
    duplicate_dense: float = 0.9
    cluster_lexical: float = 0.35
    cluster_dense: float = 0.75
    min_occurrences: int = 2
    min_tasks: int = 2
    subject_lexical: float = 0.4

    def __post_init__(self) -> None:
        # checked here: a threshold given as text raised TypeError mid-merge, and -1 merged everything
        for name in _SIMILARITIES:
            # above 1 is allowed: that measure alone then never suffices (a channel turned off)
            fix = "pass a similarity threshold of 0 or more (over 1: this measure never suffices)"
            within(name, getattr(self, name), 0.0, math.inf, fix)
        for name in ("min_occurrences", "min_tasks"):
            counted(name, getattr(self, name))


_SIMILARITIES = (
    "duplicate_lexical",
    "duplicate_dense",
    "cluster_lexical",
    "cluster_dense",
    "subject_lexical",
)


class Synthesizer(Protocol):
    @property
    def name(self) -> str: ...

    def synthesize(self, errors: Sequence[str], occurrences: int) -> str:
        """One KNOWLEDGE text from recurring error texts (the most central one first)."""
        ...


@dataclass(frozen=True)
class ExtractiveSynthesizer:
    """The most central error, verbatim, with how often it recurred: nothing invented."""

    name: str = "extractive"

    def synthesize(self, errors: Sequence[str], occurrences: int) -> str:
        return f"Recurring error (seen {occurrences} times): {' '.join(errors[0].split())}"


@dataclass(frozen=True)
class Synthesis:
    """A pitfall's text and who wrote it: ``method`` is the synthesizer's name, or the extractive one's
    when the LLM's reply was not used (``fallback`` says why)."""

    text: str
    method: str
    fallback: Fallback | None = None


#: The longest lesson :class:`LLMSynthesizer` takes (beyond the length of the errors it sums up).
LESSON_MAX_CHARS = 600


@dataclass(frozen=True)
class LLMSynthesizer(ChatEndpoint):
    """A lesson written by any OpenAI-compatible ``/chat/completions`` endpoint (optional).

    Never raises and never writes a placeholder: without a usable lesson (an error status, a malformed or
    empty reply, a timeout, a spent budget, a lesson keeping none of the errors' numbers when they had
    some, or one longer than both ``LESSON_MAX_CHARS`` and the errors) the lesson is
    :class:`ExtractiveSynthesizer`'s, and :meth:`synthesis` says why."""

    name: str = "llm"

    def synthesize(self, errors: Sequence[str], occurrences: int) -> str:
        return self.synthesis(errors, occurrences).text

    def synthesis(self, errors: Sequence[str], occurrences: int) -> Synthesis:
        shown = errors[:10]
        listed = "\n".join(f"- {e}" for e in shown)
        prompt = (
            f"These errors recurred {occurrences} times across tasks of an agent team:\n{listed}\n\n"
            "Write one short, actionable lesson (at most two sentences) that prevents them. Keep names, "
            "numbers and identifiers exactly as written. Reply with the lesson only."
        )
        try:
            lesson = self.complete(prompt)
            # two sentences were asked for; a reply longer than the errors it sums up is no lesson
            if len(lesson) > max(LESSON_MAX_CHARS, len(listed)):
                raise EndpointFailure(FailureReason.TOO_LONG, f"{len(lesson)} characters for two sentences")
            if drops_every_number(listed, lesson):
                found = len(numbers_in(listed))
                raise EndpointFailure(FailureReason.NUMBERS_DROPPED, f"{found} numbers, none kept")
        except EndpointFailure as failure:
            extractive = ExtractiveSynthesizer()
            return Synthesis(
                extractive.synthesize(errors, occurrences),
                extractive.name,
                Fallback(failure.reason, self.model, failure.detail),
            )
        return Synthesis(f"Lesson from a recurring error (seen {occurrences} times): {lesson}", self.name)


@runtime_checkable
class ReportingSynthesizer(Synthesizer, Protocol):
    """A synthesizer that can tell when it fell back (the LLM one)."""

    def synthesis(self, errors: Sequence[str], occurrences: int) -> Synthesis: ...


def synthesis_of(synth: Synthesizer, errors: Sequence[str], occurrences: int) -> Synthesis:
    """``synth``'s text for recurring ``errors``, with its method and the fallback if it took one."""
    if isinstance(synth, ReportingSynthesizer):
        return synth.synthesis(errors, occurrences)
    return Synthesis(synth.synthesize(errors, occurrences), synth.name)


def _fallback_events(result: Synthesis, tenant: str, memory_id: str, at: datetime) -> list[Event]:
    if result.fallback is None:
        return []
    return [fallback_event(EventKind.SYNTHESIZER_FALLBACK, result.fallback, tenant, memory_id, at)]


@dataclass
class MergeReport:
    merged: list[tuple[str, list[str]]] = field(default_factory=list)  # (new memory, its sources)
    knowledge: list[str] = field(default_factory=list)  # pitfalls created or revised
    conflicts: list[str] = field(default_factory=list)  # conflict notes created
    skipped: int = 0  # groups left for the next run because a member changed meanwhile

    def as_dict(self) -> dict[str, Any]:
        return {
            "merged": [{"id": i, "sources": s} for i, s in self.merged],
            "knowledge": self.knowledge,
            "conflicts": self.conflicts,
            "skipped": self.skipped,
        }


def merge_team(
    h: MergeHost,
    *,
    team_id: str | None = None,
    config: MergeConfig | None = None,
    synthesizer: Synthesizer | None = None,
) -> MergeReport:
    """Merge near-duplicates, synthesize recurring errors, flag conflicts (of one team, or all)."""
    if config is not None and not isinstance(config, MergeConfig):
        raise ValidationError("config", f"is {config!r}", "pass a MergeConfig(...), or None for the defaults")
    if synthesizer is not None and not callable(getattr(synthesizer, "synthesize", None)):
        fix = "pass an object with synthesize(errors, occurrences) (ExtractiveSynthesizer, LLMSynthesizer)"
        raise ValidationError("synthesizer", f"is {synthesizer!r}", fix)
    cfg = config or MergeConfig()
    report = MergeReport()
    synth = synthesizer or ExtractiveSynthesizer()
    # errors first: a recurring error should become a pitfall, not just one merged error
    synthesize_errors(h, cfg, synth, report, team_id)
    merge_duplicates(h, cfg, report, team_id, synth)
    flag_conflicts(h, cfg, report, team_id)
    return report


# ---- similarity -------------------------------------------------------------------------------------------
_VECTOR_CACHE: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
_VECTOR_CACHE_SIZE = 20_000


def _vectors(h: MergeHost, texts: list[str]) -> np.ndarray | None:
    """Unit vectors of ``texts`` from the harness's embedder (cached by text), or None without one."""
    if h.embedder is None or not texts:
        return None
    name = h.embedder.name
    missing = list(dict.fromkeys(t for t in texts if (name, t) not in _VECTOR_CACHE))
    if missing:
        for t, v in zip(missing, h.embedder.embed(missing), strict=True):
            _VECTOR_CACHE[(name, t)] = np.asarray(v, dtype=np.float32)
    out = np.stack([_VECTOR_CACHE[(name, t)] for t in texts])
    for t in texts:
        _VECTOR_CACHE.move_to_end((name, t))
    while len(_VECTOR_CACHE) > _VECTOR_CACHE_SIZE:
        _VECTOR_CACHE.popitem(last=False)
    return normalize(out)


class Similarity:
    """Pairwise lexical (Jaccard of stemmed terms) and dense (cosine) similarity within one group."""

    def __init__(self, h: MergeHost, texts: Sequence[str]) -> None:
        self.terms = [frozenset(_ANALYZER.terms(t)) for t in texts]
        self.vectors = _vectors(h, list(texts))

    def lexical(self, i: int, j: int) -> float:
        a, b = self.terms[i], self.terms[j]
        return len(a & b) / len(a | b) if a or b else 1.0

    def dense(self, i: int, j: int) -> float:
        return 0.0 if self.vectors is None else float(self.vectors[i] @ self.vectors[j])

    def pairs(self, lexical: float, dense: float) -> list[tuple[int, int]]:
        """Every pair (i < j) with lexical similarity >= ``lexical`` or cosine >= ``dense``."""
        found: set[tuple[int, int]] = set()
        postings: dict[str, list[int]] = defaultdict(list)
        for i, terms in enumerate(self.terms):
            for t in terms:
                postings[t].append(i)
        for i, terms in enumerate(self.terms):
            shared: dict[int, int] = defaultdict(int)
            for t in terms:
                for j in postings[t]:
                    if j > i:
                        shared[j] += 1
            for j, n in shared.items():
                if n / len(terms | self.terms[j]) >= lexical:
                    found.add((i, j))
        if self.vectors is not None:
            for start in range(0, len(self.vectors), 512):
                block = self.vectors[start : start + 512] @ self.vectors.T
                for bi, j in zip(*np.nonzero(block >= dense), strict=True):
                    i = start + int(bi)
                    if i < int(j):
                        found.add((i, int(j)))
        return sorted(found)


def components(n: int, pairs: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Connected groups of size >= 2 (union-find), each sorted, in order of their first member."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in pairs:
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        groups[root(i)].append(i)
    return [g for _, g in sorted(groups.items()) if len(g) > 1]


def _active(h: MergeHost, kinds: Sequence[Kind], team_id: str | None) -> dict[tuple[Any, ...], list[Memory]]:
    """Active memories of ``kinds`` grouped by who may read them (and by kind)."""
    team = None if team_id is None else stored_id(h, team_id)
    f = Filters.of(tenant=h.tenant, status=Status.ACTIVE, kind=list(kinds), team_id=team)
    groups: dict[tuple[Any, ...], list[Memory]] = defaultdict(list)
    for m in h.store.iter_all(f):
        if RULE_TAG in m.tags or CONFLICT_TAG in m.tags or m.pinned:
            continue
        groups[partition_key(m)].append(m)
    return groups


def _provenance(m: Memory) -> list[dict[str, Any]]:
    known = m.metadata.get("provenance")
    if known:
        return list(known)
    created = m.created_at.isoformat()
    return [
        {"id": m.id, "root": root_id(m), "agent_id": m.agent_id, "task_id": m.task_id, "created_at": created}
    ]


def _tasks(members: Iterable[Memory]) -> list[str]:
    tasks: dict[str, None] = {}
    for m in members:
        for t in [m.task_id, *m.metadata.get("source_tasks", [])]:
            if t:
                tasks.setdefault(str(t), None)
    return list(tasks)


# ---- near-duplicates --------------------------------------------------------------------------------------
def merge_duplicates(
    h: MergeHost,
    cfg: MergeConfig,
    report: MergeReport,
    team_id: str | None = None,
    synth: Synthesizer | None = None,
) -> None:
    for group in _active(h, TEAM_KINDS, team_id).values():
        # duplicates share a kind and a subject: "Use PostgreSQL 16" on the orders database and on the
        # billing database are two decisions (merged, one subject was gone and a later decision against it
        # was never flagged); a memory with no subject merges with those with none
        by_kind: dict[tuple[Kind, str | None], list[Memory]] = defaultdict(list)
        for m in group:
            by_kind[m.kind, _subject(m)].append(m)
        for members in by_kind.values():
            if len(members) < 2:
                continue
            sim = Similarity(h, [m.content for m in members])
            pairs = [
                (i, j)
                for i, j in sim.pairs(cfg.duplicate_lexical, cfg.duplicate_dense)
                if not contradicts(members[i].content, members[j].content)  # "not X" is no duplicate of "X"
            ]
            for comp in components(len(members), pairs):
                _merge(h, [members[i] for i in comp], report, synth)


def _merge(
    h: MergeHost, members: list[Memory], report: MergeReport, synth: Synthesizer | None = None
) -> Memory | None:
    """Merge ``members`` into a revision of the most trusted (then newest) one; None if one changed meanwhile.
    Synthesized pitfalls add up their occurrences and samples (re-synthesized with ``synth``)."""
    survivor = max(members, key=lambda m: (m.confidence, m.created_at, m.id))  # most trusted, then newest
    others = [m for m in members if m is not survivor]
    provenance = [p for m in [survivor, *others] for p in _provenance(m)]
    counts = [adoption(m) for m in members]
    u = [m.usage for m in members]
    usage = survivor.usage.model_copy(
        update={
            "injected": sum(x.injected for x in u),
            "cited": sum(x.cited for x in u),
            "successes": sum(x.successes for x in u),
            "failures": sum(x.failures for x in u),
            "feedback": sum(x.feedback for x in u),
        }
    )
    metadata = {
        **survivor.metadata,
        "provenance": provenance,
        "source_tasks": _tasks(members),
        "adoption": {"adopted": sum(a for a, _ in counts), "rejected": sum(r for _, r in counts)},
    }
    changes: dict[str, Any] = {
        "tags": capped_tags(t for m in members for t in m.tags),
        "confidence": max(m.confidence for m in members),
        "usage": usage,
        "metadata": metadata,
    }
    synthesized = [m for m in members if m.metadata.get("synthesized")]
    result: Synthesis | None = None
    if synthesized:
        occurrences = sum(int(m.metadata["synthesized"].get("occurrences", 1)) for m in synthesized)
        every = (s for m in [survivor, *others] for s in m.metadata.get("samples", []))
        samples = list(dict.fromkeys(every))[:8]
        method = synth.name if synth else survivor.metadata.get("synthesized", {}).get("method", "extractive")
        if synth is not None and samples:
            result = synthesis_of(synth, samples, occurrences)
            changes["content"], method = result.text, result.method
        metadata.update(samples=samples, synthesized={"method": method, "occurrences": occurrences})
    links = [Link(type=LinkType.DERIVED_FROM, target=m.id) for m in others]
    old, new = build_revision(h, survivor, changes, links)
    notes = [] if result is None else _fallback_events(result, new.tenant, new.id, h.now())
    gone = [
        m.model_copy(
            update={
                "status": Status.OBSOLETE,
                "version": m.version + 1,
                "metadata": {**m.metadata, "merged_into": new.id},
            }
        )
        for m in others
    ]
    event = Event(
        kind=EventKind.MERGE,
        memory_id=new.id,
        tenant=new.tenant,
        at=h.now(),
        data={"sources": [m.id for m in members]},
    )
    try:
        h.writer.write([old, new, *gone], None, [event, *notes], requires=revision_pins(h, old, new))
    except ConflictError:
        report.skipped += 1
        return None
    h.notify_embedder()
    report.merged.append((new.id, [m.id for m in members]))
    return new


# ---- recurring errors -> knowledge ------------------------------------------------------------------------
def synthesize_errors(
    h: MergeHost, cfg: MergeConfig, synth: Synthesizer, report: MergeReport, team_id: str | None = None
) -> None:
    for group in _active(h, (Kind.ERROR, Kind.KNOWLEDGE), team_id).values():
        items = [m for m in group if m.kind is Kind.ERROR or PITFALL_TAG in m.tags]
        if not any(m.kind is Kind.ERROR for m in items):
            continue
        # a pitfall is compared through the error texts it keeps as samples, not its summary: summaries share
        # their wording ("Recurring error (seen 2 times): ..."), which made two unrelated pitfalls alike
        views: list[str] = []
        owner: list[int] = []  # view -> item (views are in item order)
        first_view: dict[int, int] = {}  # item -> its own text's view
        for n, m in enumerate(items):
            own = [m.content] if m.kind is Kind.ERROR else (m.metadata.get("samples") or [m.content])
            first_view[n] = len(views)
            for text in dict.fromkeys(own):
                views.append(text)
                owner.append(n)
        sim = Similarity(h, views)
        linked = sim.pairs(cfg.cluster_lexical, cfg.cluster_dense)
        pairs = sorted({(owner[i], owner[j]) for i, j in linked if owner[i] != owner[j]})
        for comp in failure_groups([m.kind is Kind.ERROR for m in items], pairs):
            errors = [items[i] for i in comp if items[i].kind is Kind.ERROR]
            pitfalls = [items[i] for i in comp if items[i].kind is Kind.KNOWLEDGE]
            if len(pitfalls) > 1:  # one failure, worded apart until now: one pitfall from here on
                merged = _merge(h, pitfalls, report, synth)
                pitfalls = [] if merged is None else [merged]
                if merged is None:
                    continue
            if not errors:
                continue
            if pitfalls:
                _extend_pitfall(h, pitfalls[0], errors, synth, report)
            elif _occurrences(errors) >= cfg.min_occurrences and len(_tasks(errors)) >= cfg.min_tasks:
                central = owner[_central(sim, [first_view[i] for i in comp if items[i].kind is Kind.ERROR])]
                ordered = [items[central]] + [e for e in errors if e is not items[central]]
                _new_pitfall(h, ordered, synth, report)


def failure_groups(is_error: Sequence[bool], pairs: Sequence[tuple[int, int]]) -> list[list[int]]:
    """The groups of items (errors and pitfalls, by index) that each stand for one failure: pitfalls alike by
    their own texts (one failure worded apart, to be merged), with the errors alike to them; errors alike to
    no pitfall, among themselves. An error, with the errors alike to it, joins one pitfall group only, the
    one it has most links to: an error alike to two unrelated pitfalls (a payment timeout, like both a
    ledger timeout and a stripe failure) linked them, and the two lessons were fused into one."""
    alike = [(i, j) for i, j in pairs if is_error[i] == is_error[j]]
    group_of = {i: tuple(g) for g in components(len(is_error), alike) for i in g}
    for i in range(len(is_error)):
        group_of.setdefault(i, (i,))
    joined = {group_of[i]: list(group_of[i]) for i in range(len(is_error)) if not is_error[i]}
    apart: list[list[int]] = []
    for errors in sorted({group_of[i] for i in range(len(is_error)) if is_error[i]}):
        links: Counter[tuple[int, ...]] = Counter()
        for i, j in pairs:
            for e, p in ((i, j), (j, i)):
                if e in errors and not is_error[p]:
                    links[group_of[p]] += 1
        if links:
            best = max(links, key=lambda g: (links[g], -g[0]))
            joined[best] += errors
        else:
            apart.append(list(errors))
    return sorted([sorted(g) for g in joined.values()] + apart)


def _occurrences(errors: Iterable[Memory]) -> int:
    """How many errors these stand for (a merged error counts each of its sources)."""
    return sum(len(_provenance(e)) for e in errors)


def _central(sim: Similarity, members: list[int]) -> int:
    """The member most similar to the others (lexical, plus dense when available)."""

    def total(i: int) -> float:
        return sum(sim.lexical(i, j) + sim.dense(i, j) for j in members if j != i)

    return max(members, key=lambda i: (total(i), -i))


def _archived_errors(errors: list[Memory], knowledge_id: str) -> list[Memory]:
    return [
        e.model_copy(
            update={
                "status": Status.ARCHIVED,
                "tier": Tier.ARCHIVE,
                "version": e.version + 1,
                "metadata": {**e.metadata, "knowledge_id": knowledge_id},
            }
        )
        for e in errors
    ]


def _samples(errors: Sequence[Memory], earlier: Sequence[str] = ()) -> list[str]:
    return list(dict.fromkeys([*earlier, *(" ".join(e.content.split()) for e in errors)]))[:8]


def _new_pitfall(h: MergeHost, errors: list[Memory], synth: Synthesizer, report: MergeReport) -> None:
    first = errors[0]
    samples = _samples(errors)
    result = synthesis_of(synth, samples, _occurrences(errors))
    text = result.text
    tags = capped_tags([PITFALL_TAG], (t for e in errors for t in e.tags if t.startswith("task-type:")))
    fields = {
        "content": text,
        "kind": Kind.KNOWLEDGE,
        "tenant": first.tenant,
        "scope": first.scope,
        "team_id": first.team_id,
        "task_id": first.task_id if first.scope is Scope.TASK else None,
        "agent_id": first.agent_id if first.scope is Scope.PRIVATE else None,
        "tags": tags,
        "confidence": max(e.confidence for e in errors),
        "created_at": h.now(),
        "tier": Tier.LONG_TERM,
        "token_count": count_tokens(text),
        "links": [{"type": LinkType.DERIVED_FROM, "target": e.id} for e in errors],
        "metadata": {
            "synthesized": {"method": result.method, "occurrences": _occurrences(errors)},
            "source_tasks": _tasks(errors),
            "provenance": [p for e in errors for p in _provenance(e)],
            "samples": samples,
        },
    }
    knowledge = build_memory(fields)
    knowledge = knowledge.model_copy(update={"value": h.pager.value_now(knowledge, h.now())})
    event = Event(
        kind=EventKind.SYNTHESIZE,
        memory_id=knowledge.id,
        tenant=knowledge.tenant,
        at=h.now(),
        data={"errors": [e.id for e in errors], "method": result.method},
    )
    notes = _fallback_events(result, knowledge.tenant, knowledge.id, h.now())
    try:
        h.writer.write([knowledge, *_archived_errors(errors, knowledge.id)], None, [event, *notes])
    except ConflictError:
        report.skipped += 1
        return
    h.notify_embedder()
    report.knowledge.append(knowledge.id)


def _extend_pitfall(
    h: MergeHost, pitfall: Memory, errors: list[Memory], synth: Synthesizer, report: MergeReport
) -> None:
    info = pitfall.metadata.get("synthesized", {})
    occurrences = int(info.get("occurrences", 1)) + _occurrences(errors)
    samples = _samples(errors, pitfall.metadata.get("samples", []))
    result: Synthesis | None = None
    if pitfall.metadata.get("synthesized"):  # an LLM/extractive text we wrote: refresh its count
        result = synthesis_of(synth, samples, occurrences)
    method = synth.name if result is None else result.method
    metadata = {
        **pitfall.metadata,
        "synthesized": {"method": method, "occurrences": occurrences},
        "source_tasks": _tasks([pitfall, *errors]),
        "provenance": _provenance(pitfall) + [p for e in errors for p in _provenance(e)],
        "samples": samples,
    }
    learned_on = (t for e in errors for t in e.tags if t.startswith("task-type:"))
    tags = capped_tags(pitfall.tags, learned_on)
    changes: dict[str, Any] = {"metadata": metadata, "tags": tags}
    if result is not None:
        changes["content"] = result.text
    links = [Link(type=LinkType.DERIVED_FROM, target=e.id) for e in errors]
    old, new = build_revision(h, pitfall, changes, links)
    event = Event(
        kind=EventKind.SYNTHESIZE,
        memory_id=new.id,
        tenant=new.tenant,
        at=h.now(),
        data={"errors": [e.id for e in errors], "method": method, "revises": pitfall.id},
    )
    notes = [] if result is None else _fallback_events(result, new.tenant, new.id, h.now())
    try:
        archived = _archived_errors(errors, new.id)
        h.writer.write([old, new, *archived], None, [event, *notes], requires=revision_pins(h, old, new))
    except ConflictError:
        report.skipped += 1
        return
    h.notify_embedder()
    report.knowledge.append(new.id)


# ---- conflicts --------------------------------------------------------------------------------------------
def _subject(m: Memory) -> str | None:
    s = m.metadata.get("subject")
    return " ".join(str(s).lower().split()) if s else None


def contradicts(a: str, b: str) -> bool:
    """A cheap contradiction signal: one text negated and the other not (by the parity of their negations:
    "can't", "isn't" and "never disable" count), different stances ("enable" and "disable"), or different
    numbers in both, in order and with their signs ("-5" is not "5"; "limit 500, fee 20" is not "limit 20,
    fee 500")."""
    if len(_NEGATORS.findall(a)) % 2 != len(_NEGATORS.findall(b)) % 2:
        return True
    if _stances(a) != _stances(b):
        return True
    na, nb = _NUMBER.findall(a), _NUMBER.findall(b)
    return bool(na and nb and na != nb)


def _stances(text: str) -> set[str]:
    return {word.lower()[:5] for word in _STANCES.findall(text)}  # "disables", "disabled": one stance


def flag_conflicts(h: MergeHost, cfg: MergeConfig, report: MergeReport, team_id: str | None = None) -> None:
    known = _KnownConflicts.read(h)
    for group in _active(h, tuple(CONFLICT_KINDS), team_id).values():
        items = [m for m in group if PITFALL_TAG not in m.tags]
        if len(items) < 2:
            continue
        sim = Similarity(h, [m.content for m in items])
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                a, b = items[i], items[j]
                if root_id(a) == root_id(b) or known.between(a, b):
                    continue
                similar = sim.lexical(i, j) >= cfg.duplicate_lexical or sim.dense(i, j) >= cfg.duplicate_dense
                if similar and not contradicts(a.content, b.content):
                    continue  # the same statement twice: a duplicate, not a conflict
                sa, sb = _subject(a), _subject(b)
                if sa is not None and sb is not None:
                    same = sa == sb
                else:
                    same = sim.lexical(i, j) >= cfg.subject_lexical and contradicts(a.content, b.content)
                if same:
                    known.add(root_id(a), root_id(b))
                    note = _flag(h, a, b, sa or sb)
                    if note is not None:
                        report.conflicts.append(note.id)


@dataclass
class _KnownConflicts:
    """The pairs flagged before, open or closed (a closed one is not flagged again), by the roots of their
    sides' revision chains. A side known under another root is the same side too: a merge of duplicates
    keeps one source's chain and names the others in its provenance (a duplicate of one side, merged,
    flagged the conflict again, even one a lead had closed)."""

    partners: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def read(cls, h: MergeHost) -> _KnownConflicts:
        known = cls()
        f = Filters.of(tenant=h.tenant, kind=Kind.NOTE, tags=[CONFLICT_TAG])
        for note in h.store.iter_all(f):
            roots = [str(r) for r in note.metadata.get("conflict", {}).get("roots", [])]
            if len(roots) == 2:
                known.add(*roots)
        return known

    def add(self, a: str, b: str) -> None:
        self.partners[a].add(b)
        self.partners[b].add(a)

    def between(self, a: Memory, b: Memory) -> bool:
        theirs = lineage(b)
        return any(self.partners.get(r, set()) & theirs for r in lineage(a))


def conflict_note_id(tenant: str, a: Memory, b: Memory) -> str:
    """The id of the conflict note of the chains of ``a`` and ``b`` (either order): one per pair, so runs of
    merge_team at the same time (threads, processes) cannot flag a pair twice: the store refuses the
    second note's id (each run read the flagged pairs once, at its start, and both wrote one)."""
    roots = "\x00".join(sorted((root_id(a), root_id(b))))
    return str(uuid.uuid5(_CONFLICT_NAMESPACE, f"conflict\x00{tenant}\x00{roots}"))


def _flag(h: MergeHost, a: Memory, b: Memory, subject: str | None) -> Memory | None:
    """Record the conflict note of ``a`` and ``b``; None when a run beside this one recorded it first."""
    a, b = sorted((a, b), key=lambda m: (m.created_at, m.id))
    about = f"'{subject}'" if subject else "the same subject"
    text = (
        f"Conflict on {about}: [{short_id(a.id)}] {' '.join(a.content.split())[:160]} <> "
        f"[{short_id(b.id)}] {' '.join(b.content.split())[:160]}"
    )
    owner = a.agent_id if a.scope is Scope.PRIVATE else None
    try:
        return _record_note(h, a, b, subject, text, owner)
    except ConflictError:  # its id is stored: the pair was flagged by another run meanwhile
        return None


def _record_note(
    h: MergeHost, a: Memory, b: Memory, subject: str | None, text: str, owner: str | None
) -> Memory:
    return h.record(
        text,
        as_agent=APPLICATION,  # fusion is the application's own write, whoever owns a private side
        id=conflict_note_id(h.tenant, a, b),
        kind=Kind.NOTE,
        scope=a.scope,
        team_id=a.team_id,
        task_id=a.task_id,
        agent_id=owner,
        tags=[CONFLICT_TAG],
        tier=Tier.LONG_TERM,
        links=[{"type": LinkType.REFERS_TO, "target": a.id}, {"type": LinkType.REFERS_TO, "target": b.id}],
        metadata={"conflict": {"ids": [a.id, b.id], "roots": [root_id(a), root_id(b)], "subject": subject}},
    )
