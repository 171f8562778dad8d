"""What-if replay: a recorded session's event log re-run, offline, under other pager or scoring settings.

A user tuning the policy asks "what would my agent have seen?". :func:`replay` answers from their own
traffic: it reads one session's log from a harness (never writing to it), and re-runs it through the real
pager and context builder of a fresh in-memory harness, once per :class:`Policy`, on the recorded clock:

- each ``add`` is recorded again at its recorded time (its content, scope and TTL as they are now, pinned
  when it was recorded pinned, its vector copied when the live store holds one, so no model runs for it):
  every memory of the tenant recorded up to the session's last build (a build recalls across sessions), or
  with ``reach="session"`` the session's own;
- ``pin`` / ``unpin`` / ``forget`` of those memories, a person's archive / set value / tier move (the
  scorer learns from them as it did live), and tracked recalls (``retrieve``: the recorded hits' access
  counts and promotions), are applied again; where the recorded clock jumps by the pager's idle time, a
  ``tick()`` runs;
- each ``context`` build of the session is built again (same query, scope and budget unless the policy sets
  another budget), and each ``output`` that cited a build credits the replayed build's lines it cites, so
  values learn from citations as they did live.

What a build *needed* is what its recorded output cited, or, for a build without an output, what the
recorded build held. From that, per policy (:class:`PolicyOutcome`):

- ``evidence_kept``: the share of needed memories the replayed build put in the prompt;
- ``eviction_regret``: memories the policy paged out of the working tier that a later build needed and left
  out (each memory counted once);
- ``working_hit_rate``: the share of needed memories found in the working section (pinned included) of the
  replayed build — what paging kept at hand, as opposed to what recall had to find again;
- tokens, and per build the lines in and out between the two policies (:class:`BuildDiff`).

Both policies are replayed under the same conditions (same embedder for queries, same vectors), so a
difference between them is the policy's. Reads of the live harness: its memories, vectors and events; it is
never written to. Not replayed: revisions (a memory is replayed with its current content), team grants and
shared-scope writes, compression by an LLM summarizer (the replay compresses extractively).
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

import numpy as np

from clawvm.core.embed import Embedder
from clawvm.core.errors import ValidationError
from clawvm.core.model import Memory, Status, Tier
from clawvm.core.vectors import directed_only
from clawvm.harness import Harness
from clawvm.harness.fields import HARNESS_METADATA
from clawvm.observe.learning import intervene
from clawvm.observe.lens import record_output
from clawvm.store import Event, PinBudgetError
from clawvm.store.crypto import REDACTION_FIELD
from clawvm.store.kinds import EventKind
from clawvm.store.memory import MemoryStore
from clawvm.vm.context import Context, clip, short_id
from clawvm.vm.tiers import PagerConfig

#: fields of a live memory that a replayed record keeps (the harness sets the rest: tier, value, version)
_RECORDED_FIELDS = (
    "kind",
    "state",
    "session_id",
    "task_id",
    "agent_id",
    "tool_name",
    "tags",
    "metadata",
    "expires_at",  # a one-time code expires in the replay as it did live, and leaves its prompts
)
#: metadata only the live harness sets (the redaction mark, compression pointers, a review): a record
#: carrying one is refused, and the offline harness sets its own (a compressed memory replays with its
#: compressed text; its raw copy, internal, is not replayed)
_HARNESS_ONLY = frozenset({REDACTION_FIELD, *HARNESS_METADATA})
_EVENT_PAGE = 1000
_WORKING_SECTIONS = frozenset({"pinned", "working"})
Reach = Literal["tenant", "session"]


@dataclass(frozen=True)
class Policy:
    """One way to run the pager and the context builder: ``pager`` (budgets, watermarks, scoring weights)
    and, optionally, another ``context_budget`` for every build (None: each build's recorded budget)."""

    name: str
    pager: PagerConfig = field(default_factory=PagerConfig)
    context_budget: int | None = None

    def __post_init__(self) -> None:
        # 0 would read as "not given" below and replay the recorded budgets: a silent no-op
        if self.context_budget is not None and (
            isinstance(self.context_budget, bool)
            or not isinstance(self.context_budget, int)
            or self.context_budget < 1
        ):
            raise ValidationError(
                "budget", f"is {self.context_budget!r}", "pass a positive number of tokens (or leave it out)"
            )


@dataclass(frozen=True)
class Build:
    """One replayed context build under one policy."""

    seq: int  # the recorded build's event seq
    replayed_seq: int  # the replayed build's event seq in the offline log (orders it among the evictions)
    query: str
    budget: int
    tokens: int
    ids: tuple[str, ...]  # the memories in the prompt, in order
    working_ids: frozenset[str]  # of those, the ones from the pinned and working sections
    needed: frozenset[str]  # what the recorded output cited (or the recorded build held)
    recorded: frozenset[str]  # what the recorded build held

    @property
    def kept(self) -> frozenset[str]:
        return self.needed & frozenset(self.ids)


@dataclass(frozen=True)
class PolicyOutcome:
    policy: str
    builds: tuple[Build, ...]
    evicted: frozenset[str]  # memories the pager moved out of the working tier during the replay
    regret: frozenset[str]  # evicted, then needed by a later build that left them out

    @property
    def tokens(self) -> int:
        return sum(b.tokens for b in self.builds)

    @property
    def needed(self) -> int:
        return sum(len(b.needed) for b in self.builds)

    @property
    def evidence_kept(self) -> float | None:
        return _share(sum(len(b.kept) for b in self.builds), self.needed)

    @property
    def working_hit_rate(self) -> float | None:
        return _share(sum(len(b.needed & b.working_ids) for b in self.builds), self.needed)

    @property
    def recorded_kept(self) -> float | None:
        """The share of the recorded builds' lines this replay's builds hold: how closely the replay
        reproduces the live run (near 1 for the live policy; lower where the live run had inputs a replay
        does not, e.g. memories revised since)."""
        return _share(sum(len(b.recorded & frozenset(b.ids)) for b in self.builds), self._recorded)

    @property
    def _recorded(self) -> int:
        return sum(len(b.recorded) for b in self.builds)

    @property
    def eviction_regret(self) -> int:
        return len(self.regret)

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "builds": len(self.builds),
            "tokens": self.tokens,
            "needed": self.needed,
            "evidence_kept": self.evidence_kept,
            "eviction_regret": self.eviction_regret,
            "working_hit_rate": self.working_hit_rate,
            "recorded_kept": self.recorded_kept,
            "evicted": len(self.evicted),
        }


@dataclass(frozen=True)
class BuildDiff:
    """One recorded build, replayed under policy A and policy B."""

    seq: int
    query: str
    tokens_a: int
    tokens_b: int
    lines_in: tuple[str, ...]  # in B's prompt, not in A's
    lines_out: tuple[str, ...]  # in A's prompt, not in B's
    needed: frozenset[str]
    kept_a: frozenset[str]
    kept_b: frozenset[str]

    @property
    def dropped_needed(self) -> frozenset[str]:
        """Needed memories A kept and B left out: what B's policy cost this build."""
        return self.kept_a - self.kept_b


@dataclass(frozen=True)
class ReplayReport:
    session_id: str
    a: PolicyOutcome
    b: PolicyOutcome
    builds: tuple[BuildDiff, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "a": self.a.summary(),
            "b": self.b.summary(),
            "builds": [
                {
                    "seq": d.seq,
                    "query": d.query,
                    "tokens_a": d.tokens_a,
                    "tokens_b": d.tokens_b,
                    "lines_in": list(d.lines_in),
                    "lines_out": list(d.lines_out),
                    "needed": sorted(d.needed),
                    "kept_a": sorted(d.kept_a),
                    "kept_b": sorted(d.kept_b),
                    "dropped_needed": sorted(d.dropped_needed),
                }
                for d in self.builds
            ],
        }


@dataclass(frozen=True)
class SessionLog:
    """What a replay reads of one session: its memories as they are now, their vectors, and the events to
    re-run, oldest first."""

    session_id: str
    memories: Mapping[str, Memory]
    vectors: Mapping[str, np.ndarray]
    events: tuple[Event, ...]
    needed: Mapping[int, frozenset[str]]  # context seq -> what that build needed
    recorded: Mapping[int, frozenset[str]]  # context seq -> what that build held
    pinned: frozenset[str] = frozenset()  # the memories recorded pinned (``record(pinned=True)``)


def read_session(
    live: Harness, session_id: str, reach: Reach = "tenant", max_memories: int | None = None
) -> SessionLog:
    """The session's log, read from ``live`` (nothing is written to it). ``session_id`` as recorded (a
    secret-looking one is stored redacted: the log names the stored form). ``max_memories``: refuse
    (:class:`ValidationError` on ``reach``) a log of more memories to replay, before reading them all."""
    session_id = live.writer.identifier(session_id, live.tenant)
    scope: dict[str, Any] = {"session_id": session_id} if reach == "session" else {}
    if max_memories is not None:  # counted, not read: a big tenant is refused before its memories are
        held = live.count(status="any", **scope)
        if held > max_memories:
            unlimited = "run `clawvm --db STORE replay SESSION`, which has no limit"
            raise ValidationError(
                "reach",
                f"replaying session {session_id!r} over the {reach} reads its {held} memories, more than "
                f"the limit here ({max_memories})",
                f"replay the session's own memories (reach=session), or {unlimited}"
                if reach == "tenant"
                else unlimited,
            )
    found = live.iter_all(status="any", **scope)
    memories = {m.id: m for m in found if m.status is not Status.INTERNAL and m.team_id is None}
    log = list(_all_events(live))  # read once: the builds, their outputs and the events to re-run
    session_builds = [e for e in log if _is_build_of(e, session_id)]
    if not session_builds:
        raise _no_build(session_id)
    recorded = {e.seq: _manifest_ids(e) for e in session_builds if e.seq is not None}
    # a build's output may come after the session's last build: read to the end for those
    outputs = [e for e in log if _answers(e, recorded)]
    needed = dict(recorded)
    for e in outputs:
        needed[int(e.data["context_seq"])] = frozenset(str(i) for i in e.data.get("cited", []))
    last = session_builds[-1].seq or 0
    events = tuple(
        e for e in log if e.seq is not None and e.seq <= last and _belongs(e, session_id, memories, recorded)
    )
    # the vectors the offline store takes: one without a direction (a zero vector an older version stored)
    # is refused by record and attach_vectors, failing the whole replay; its memory replays lexical-only,
    # as live search (which cosine never finds it by) treats it
    vectors = directed_only(live.store.vectors_of(list(memories)))
    return SessionLog(
        session_id, memories, vectors, events, needed, recorded, _recorded_pinned(log, memories)
    )


def _recorded_pinned(log: Sequence[Event], memories: Mapping[str, Memory]) -> frozenset[str]:
    """The memories recorded pinned (a pin made by ``record`` logs no pin event): their ``add`` says so.
    A log written before adds said it is read from the pins: one whose first pin or unpin is an unpin
    was pinned before it; one with neither is pinned now only if it was recorded so (not seen there: a
    pin made by record and dropped with no unpin event, the memory archived, expired or rolled back)."""
    said = {e.memory_id or "" for e in log if e.kind == EventKind.ADD and e.data.get("pinned") is True}
    first: dict[str, EventKind | str] = {}
    for e in log:
        if e.kind in (EventKind.PIN, EventKind.UNPIN) and e.memory_id is not None and e.memory_id in memories:
            first.setdefault(e.memory_id, e.kind)
    unpinned_first = {i for i, kind in first.items() if kind == EventKind.UNPIN}
    never_moved = {i for i, m in memories.items() if m.pinned and i not in first}
    return frozenset(i for i in said | unpinned_first | never_moved if i in memories)


def _no_build(session_id: str) -> ValidationError:
    return ValidationError(
        "session_id", f"{session_id!r} has no recorded context build", "pick a session that built contexts"
    )


def replay(
    live: Harness,
    session_id: str,
    a: Policy,
    b: Policy,
    *,
    embedder: Embedder | None = None,
    reach: Reach = "tenant",
    max_memories: int | None = None,
) -> ReplayReport:
    """Replay ``session_id`` of ``live`` under policies ``a`` and ``b`` and compare them build by build.

    ``embedder`` embeds the recorded queries (default: the live harness's; None there means lexical recall
    in both replays); ``max_memories``: the most memories to replay (see :func:`read_session`);
    ``reach``: which memories are replayed ("tenant": all recorded up to the session's
    last build; "session": its own). The live store is only read."""
    log = read_session(live, session_id, reach, max_memories)
    queries = _MemoEmbedder.wrap(embedder if embedder is not None else live.embedder)
    outcome_a = run_policy(log, a, queries, live)
    outcome_b = run_policy(log, b, queries, live)
    diffs = tuple(_diff(x, y) for x, y in zip(outcome_a.builds, outcome_b.builds, strict=True))
    return ReplayReport(session_id, outcome_a, outcome_b, diffs)


def run_policy(log: SessionLog, policy: Policy, embedder: Embedder | None, live: Harness) -> PolicyOutcome:
    """Re-run ``log`` through a fresh in-memory harness under ``policy``."""
    clock = _ReplayClock(log.events[0].at if log.events else live.now())
    store = MemoryStore(dim=live.store.dim)
    store.setup()
    # built directly, not opened: no embedding worker (replayed memories carry their live vectors; one
    # without stays lexical, as it was until the live worker reached it)
    # no background pager thread: passes run at the replayed lifecycle boundaries (context builds, ticks),
    # so a replay is the same every time and A and B differ by their policy alone
    pager = replace(policy.pager, background=False)
    offline = Harness(store, embedder, tenant=live.tenant, preset_name=live.config, pager=pager, clock=clock)
    contexts: dict[int, Context] = {}
    builds: list[Build] = []
    idle = timedelta(hours=policy.pager.session_idle_hours)
    imported: list[Memory] = []  # a run of import events, written as the live import wrote it: in one batch
    imported_at = clock.at
    for event in log.events:
        if event.kind == EventKind.IMPORT:
            found = log.memories.get(event.memory_id or "")
            if found is not None:
                imported.append(found)
                imported_at = event.at
            continue
        if imported:  # at the import's own time: a memory made after the event before it is no future one
            _advance(offline, clock, imported_at, idle)
            _import(offline, imported, log.vectors)
        _advance(offline, clock, event.at, idle)
        added = log.memories.get(event.memory_id or "") if event.kind == EventKind.ADD else None
        if added is not None:
            _record(offline, added, log.vectors.get(added.id), pinned=added.id in log.pinned)
        elif event.kind in (EventKind.PIN, EventKind.UNPIN, EventKind.FORGET):
            _apply_manual(offline, event)
        elif event.kind == EventKind.MANUAL and event.data.get("action") in _PERSON_ACTIONS:
            _apply_person(offline, event)
        elif event.kind == EventKind.RETRIEVE:
            _access(offline, event)
        elif event.kind == EventKind.CONTEXT and event.seq is not None:
            ctx = _build(offline, event, policy)
            contexts[event.seq] = ctx
            builds.append(_as_build(event, ctx, log))
        elif event.kind == EventKind.OUTPUT:
            _credit(offline, event, contexts)
    evicted = _evicted(offline)
    return PolicyOutcome(policy.name, tuple(builds), evicted, _regret(builds, offline))


def _all_events(live: Harness) -> Iterator[Event]:
    after = 0
    while True:
        page = live.events(after_seq=after, limit=_EVENT_PAGE)
        yield from (e for e in page if e.tenant == live.tenant)
        if len(page) < _EVENT_PAGE:
            return
        after = page[-1].seq or after


def _is_build_of(event: Event, session_id: str) -> bool:
    return event.kind == EventKind.CONTEXT and (event.data.get("scope") or {}).get("session_id") == session_id


def _answers(event: Event, builds: Mapping[int, object]) -> bool:
    return event.kind == EventKind.OUTPUT and int(event.data.get("context_seq", -1)) in builds


#: events that concern one memory, replayed when that memory is
_OF_A_MEMORY = frozenset(
    {EventKind.ADD, EventKind.IMPORT, EventKind.PIN, EventKind.UNPIN, EventKind.FORGET, EventKind.MANUAL}
)


def _belongs(
    event: Event, session_id: str, memories: Mapping[str, Memory], builds: Mapping[int, object]
) -> bool:
    if event.kind in _OF_A_MEMORY:
        return event.memory_id in memories
    if event.kind == EventKind.CONTEXT:
        return _is_build_of(event, session_id)
    if event.kind == EventKind.RETRIEVE:  # a tracked recall that found a replayed memory
        return any(str(hit.get("id")) in memories for hit in event.data.get("hits", []))
    return _answers(event, builds)


def _manifest_ids(event: Event) -> frozenset[str]:
    return frozenset(str(line["id"]) for line in event.data.get("manifest", []))


class _MemoEmbedder:
    """The live embedder, each query embedded once for both policies' replays."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self._queries: dict[str, np.ndarray] = {}

    @classmethod
    def wrap(cls, inner: Embedder | None) -> Embedder | None:
        return None if inner is None else cls(inner)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed(texts)

    def embed_query(self, text: str) -> np.ndarray:
        if text not in self._queries:
            self._queries[text] = self.inner.embed_query(text)
        return self._queries[text]


def _advance(offline: Harness, clock: _ReplayClock, at: datetime, idle: timedelta) -> None:
    """The replay's clock set to ``at``; where it crosses an idle gap, the periodic pass runs there."""
    if at - clock.at >= idle:
        clock.at = at
        offline.tick()
    clock.at = at


def _record(offline: Harness, memory: Memory, vector: np.ndarray | None, *, pinned: bool) -> None:
    fields = {name: getattr(memory, name) for name in _RECORDED_FIELDS}
    # the redaction mark is the live write path's: the replay records the redacted text as is
    fields["metadata"] = _recordable(memory.metadata)
    try:
        offline.record(memory.content, id=memory.id, embedding=vector, pinned=pinned, **fields)
    except PinBudgetError:  # the policy's working budget holds fewer pins: this one stays unpinned in it
        offline.record(memory.content, id=memory.id, embedding=vector, **fields)


def _recordable(metadata: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if k not in _HARNESS_ONLY}


def _import(offline: Harness, memories: builtins.list[Memory], vectors: Mapping[str, np.ndarray]) -> None:
    """Imported memories (a backup restored, a store migrated in) appear as they are now, in one batch
    with their live vectors; ``memories`` is emptied."""
    if not memories:
        return
    copies = [m.model_copy(update={"metadata": _recordable(m.metadata)}) for m in memories]
    offline.import_memories(copies, restore=True)  # the live store's own memories: a restore, not an upload
    with_vector = [m.id for m in memories if m.id in vectors]
    if with_vector:
        offline.writer.attach_vectors(with_vector, np.stack([vectors[i] for i in with_vector]))
    memories.clear()


def _apply_manual(offline: Harness, event: Event) -> None:
    memory_id = event.memory_id or ""
    if not offline.store.get_many([memory_id]):
        return  # a manual action on a memory recorded before the session's first event
    if event.kind == EventKind.PIN:
        with contextlib.suppress(PinBudgetError):  # the policy's working budget holds fewer pins
            offline.pin(memory_id)
    elif event.kind == EventKind.UNPIN:
        offline.unpin(memory_id)
    else:
        offline.forget(memory_id)


def _access(offline: Harness, event: Event) -> None:
    """A tracked recall, as the live harness took it: its recorded hits (those the offline harness holds
    active, as a recall finds them) accessed at its recorded time, promotions included, with its event.
    Its hits, not a new recall: the event keeps no filters nor preset, and a recall without them counted
    (and promoted) memories the live one never returned."""
    now = offline.now()
    ids = [str(hit.get("id")) for hit in event.data.get("hits", [])]
    held = offline.store.get_many(ids)
    hits = [held[i] for i in ids if i in held and _recallable(held[i], now)]
    retrieved = Event(kind=EventKind.RETRIEVE, tenant=offline.tenant, at=now, data=dict(event.data))
    offline.working.warm(hits, now, [retrieved])  # written now: the replay's passes run at its builds


def _recallable(memory: Memory, now: datetime) -> bool:
    return memory.status is Status.ACTIVE and (memory.expires_at is None or memory.expires_at > now)


#: a person's dashboard actions replayed as such (pins and unpins come as their own events)
_PERSON_ACTIONS = frozenset({"archive", "set_value", "set_tier"})


def _apply_person(offline: Harness, event: Event) -> None:
    """A person's archive, set value or tier move, as the live harness took it (the scorer learns too)."""
    memory_id = event.memory_id or ""
    if not offline.store.get_many([memory_id]):
        return
    data = event.data
    target = data.get("target")
    value = float(target) if data.get("action") == "set_value" and isinstance(target, int | float) else None
    tier = data.get("tier") if isinstance(data.get("tier"), str) else None
    by = str(data.get("by") or "").strip() or "user"  # a blank one was taken before intervene refused it
    intervene(offline, str(data["action"]), memory_id, value=value, tier=tier, by=by)


def _build(offline: Harness, event: Event, policy: Policy) -> Context:
    data = event.data
    scope = {k: v for k, v in (data.get("scope") or {}).items() if k in ("session_id", "task_id", "agent_id")}
    query = str(data.get("query", ""))
    budget = int(data.get("budget", 2000)) if policy.context_budget is None else policy.context_budget
    return offline.context(query, budget_tokens=budget, **scope)


def _as_build(event: Event, ctx: Context, log: SessionLog) -> Build:
    working = frozenset(e.id for e in ctx.manifest if e.section in _WORKING_SECTIONS)
    assert event.seq is not None and ctx.event_seq is not None
    return Build(
        seq=event.seq,
        replayed_seq=ctx.event_seq,
        query=str(event.data.get("query", "")),
        budget=ctx.budget,
        tokens=ctx.tokens,
        ids=tuple(ctx.ids),
        working_ids=working,
        needed=log.needed.get(event.seq, frozenset()),
        recorded=log.recorded.get(event.seq, frozenset()),
    )


def _credit(offline: Harness, event: Event, contexts: Mapping[int, Context]) -> None:
    ctx = contexts.get(int(event.data.get("context_seq", -1)))
    if ctx is None or ctx.event_seq is None:
        return
    cited = set(str(i) for i in event.data.get("cited", [])) & set(ctx.ids)
    success = event.data.get("success")
    text = " ".join(short_id(i) for i in sorted(cited))
    record_output(offline, ctx, text, success=success if isinstance(success, bool) else None)


def _evicted(offline: Harness) -> frozenset[str]:
    return frozenset(e.memory_id for e in _moves_out_of_working(offline) if e.memory_id)


def _moves_out_of_working(offline: Harness) -> builtins.list[Event]:
    moves = (EventKind.DEMOTE, EventKind.ARCHIVE)
    return [e for e in _all_events(offline) if e.kind in moves and e.data.get("from") == Tier.WORKING.value]


def _regret(builds: Sequence[Build], offline: Harness) -> frozenset[str]:
    """Memories paged out of working before a build that needed them and left them out."""
    first_eviction: dict[str, int] = {}
    for e in _moves_out_of_working(offline):
        if e.memory_id and e.seq is not None:
            first_eviction.setdefault(e.memory_id, e.seq)
    regret: set[str] = set()
    for build in builds:
        missed = build.needed - frozenset(build.ids)
        regret |= {m for m in missed if first_eviction.get(m, build.replayed_seq) < build.replayed_seq}
    return frozenset(regret)


def _diff(a: Build, b: Build) -> BuildDiff:
    ids_a, ids_b = frozenset(a.ids), frozenset(b.ids)
    return BuildDiff(
        seq=a.seq,
        query=a.query,
        tokens_a=a.tokens,
        tokens_b=b.tokens,
        lines_in=tuple(i for i in b.ids if i not in ids_a),
        lines_out=tuple(i for i in a.ids if i not in ids_b),
        needed=a.needed,
        kept_a=a.kept,
        kept_b=b.kept,
    )


def _share(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


class _ReplayClock:
    """The recorded clock: each event is re-run at the instant it was recorded."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def variant(
    base: PagerConfig,
    *,
    working_items: int | None = None,
    working_tokens: int | None = None,
    weights: Mapping[str, float] | None = None,
) -> PagerConfig:
    """``base`` with another working-tier budget and/or scoring weights (the knobs a user tunes).

    ``weights``: float fields of :class:`~clawvm.vm.scoring.ScoringConfig` (e.g. ``cite_weight``)."""
    budgets = base.budgets
    if working_items is not None:
        budgets = replace(budgets, working_items=_positive("working_items", working_items))
    if working_tokens is not None:
        budgets = replace(budgets, working_tokens=_positive("working_tokens", working_tokens))
    scoring = base.scoring
    for name, weight in (weights or {}).items():
        if not isinstance(getattr(scoring, name, None), float):
            known = sorted(f.name for f in fields(scoring) if isinstance(getattr(scoring, f.name), float))
            raise ValidationError(
                f"weights.{name}", "is not a scoring weight", f"use one of {', '.join(known)}"
            )
        changed: dict[str, Any] = {name: float(weight)}
        scoring = replace(scoring, **changed)
    return replace(base, budgets=budgets, scoring=scoring)


def format_report(report: ReplayReport, width: int = 48) -> str:
    """The comparison as two plain-text tables: per build, then the aggregate effect."""
    a, b = report.a.policy, report.b.policy
    lines = [
        f"session {report.session_id}: {len(report.builds)} context builds replayed"
        f" under {a} (A) and {b} (B)",
        "",
        f"{'build':>7}  {'query':<{width}}  {'tokens A→B':>12}  {'in':>3}  {'out':>3}"
        f"  {'kept A/B of needed':>18}",
    ]
    for d in report.builds:
        kept = f"{len(d.kept_a)}/{len(d.kept_b)} of {len(d.needed)}"
        flag = (
            "  ← dropped " + ", ".join(short_id(i) for i in sorted(d.dropped_needed))
            if d.dropped_needed
            else ""
        )
        lines.append(
            f"{d.seq:>7}  {clip(d.query, width):<{width}}  {f'{d.tokens_a}→{d.tokens_b}':>12}  "
            f"{len(d.lines_in):>3}  {len(d.lines_out):>3}  {kept:>18}{flag}"
        )
    lines += ["", f"{'':<22}{'A: ' + a:>18}  {'B: ' + b:>18}"]
    sa, sb = report.a.summary(), report.b.summary()
    for key, label in _SUMMARY_ROWS:
        lines.append(f"{label:<22}{_fmt(sa[key]):>18}  {_fmt(sb[key]):>18}")
    return "\n".join(lines)


_SUMMARY_ROWS = (
    ("tokens", "prompt tokens"),
    ("evidence_kept", "evidence kept"),
    ("eviction_regret", "eviction regret"),
    ("working_hit_rate", "working-tier hit rate"),
    ("evicted", "paged out of working"),
    ("recorded_kept", "recorded lines kept"),
)


def _fmt(x: object) -> str:
    if x is None:
        return "–"
    if not isinstance(x, float):
        return str(x)
    # a tie rounds up, as the dashboard's toFixed does (9/16 is 56.3% in both, not 56.2% here)
    return f"{(Decimal(str(x)) * 100).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)}%"


def _positive(name: str, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:  # "3" failed with Python's TypeError
        raise ValidationError(name, f"is {n!r}", "pass a positive integer")
    return n
