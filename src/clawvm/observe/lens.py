"""MemLens: what the agent remembered, what it forgot, why, and what each answer was built from.

:class:`Lens` keeps a light table of one tenant's memories and indexes of its event log (see
:mod:`clawvm.store.eventlog` for the kinds), brought up to date incrementally on every :meth:`Lens.refresh`:
the memories an event names are re-read, and everything is re-read now and then (a learning step moves
the values of many memories without an event naming each; ``tick()`` rewrites a drifted value with a
``refresh`` event, a page of memories at a time).

Metrics (:meth:`Lens.metrics`), each defined from events and memories:

- **working-tier hit rate**: a memory is *needed* when a tracked recall returns it or a context build
  retrieves it (the ``retrieved`` section); a need is a hit when the memory sat in the working tier at
  that moment (the tier the event recorded, before any warming). Like a cache hit rate.
- **retrieval latency**: p50/p90/p99 of the ``ms`` of tracked recalls (query embedding included); the
  same for context builds.
- **eviction regret**: of the memories archived or compressed, the share later needed (recalled,
  retrieved into a context, cited, or pinned by a person) — each eviction counts once.
- **context tokens per build**: mean, p50, p95, max, and the series of (build, tokens, budget).
- **duplicate rate**: active memories whose normalised text (case, whitespace) repeats an earlier
  active memory of the tenant, over all active memories. **Junk rate**: active memories with fewer than
  three words made of letters or digits ("ok", "{}", "..."), or never used (no access, injection or
  citation) with a value under 0.15 a day after they were recorded. **Stale rate**: active memories
  revised by a newer active memory (a ``revises`` link), or in the working tier untouched for over three
  half-lives of their kind (one past its ``expires_at`` is expired, swept or not, as reads show it).
- **per-tool reliability**: :meth:`clawvm.Harness.tool_reliability` (:mod:`clawvm.agents.reliability`: error
and
  timeout rates, latency, the unreliable verdict and the fallback that worked, over recent calls).

Influence tracing: :meth:`Lens.influence` gives, for one context build, every memory that fed it with
its section, tier and value *at that moment* (from the build's manifest) and whether the output
recorded after it cited it; :meth:`Lens.contexts_of` is the reverse. :func:`record_output` parses the
short ids (``[a1b2c3d4 ...]``, the context lines' labels) an output cites: cited memories get
``usage.cited + 1`` (and ``successes``/``failures`` + 1 when the outcome is given), which raises their
value through the scorer's ``cite_weight * cited / injected`` term; uncited ones were already counted as
injected, so their cited ratio falls.

Manual actions (:func:`clawvm.observe.learning.intervene`: pin, unpin, set_value, annotate, archive) are
each
one ``manual`` event, and the documented learning rule (:func:`clawvm.observe.learning.learn`) turns pin,
archive
and set_value into a change of the scorer's weights; the Lens gives the harness the latest learned
weights when it opens.
"""

from __future__ import annotations

import builtins
import math
import re
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from clawvm.agents.reliability import ReliabilityPolicy, ToolStats
from clawvm.core.errors import ClawVMError, ConflictError, NotFoundError, ValidationError
from clawvm.core.model import VISIBLE_STATUSES, Filters, Memory, Status, Tier, Usage
from clawvm.observe.learning import LearningHost
from clawvm.store import Event
from clawvm.store.eventlog import WEIGHTS_KIND, iter_events
from clawvm.store.kinds import EventKind
from clawvm.vm.context import Context, short_id
from clawvm.vm.scoring import ScoringConfig, ValueBreakdown
from clawvm.vm.tiers import WRITE_RETRIES
from clawvm.write.commit import logged_with_counts


class LensHost(LearningHost, Protocol):
    """What MemLens reads of the harness besides the store: the pager's config and tool reliability."""

    def tool_reliability(
        self, tool: str | None = None, policy: ReliabilityPolicy | None = None
    ) -> dict[str, ToolStats]: ...

    def explain(self, memory_id: str) -> ValueBreakdown: ...

    def events(
        self, after_seq: int = 0, limit: int = 1000, memory_id: str | None = None
    ) -> builtins.list[Event]: ...


_SHORT_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{8}(?![0-9a-f])")
_WORD = re.compile(r"[^\W_]{1,}", re.UNICODE)
JUNK_VALUE = 0.15
STALE_HALF_LIVES = 3.0
NEED_KINDS = ("retrieve", "context", "output", "manual")
GUIDANCE_KEPT = 20  # guidance builds the lens keeps (the dashboard's teams view lists them)


# ---- the memory table -----------------------------------------------------------------------------------
def clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: whole, or cut at a word boundary where one is near the
    end (else mid-word) and ended with "…", so a cut never reads as the whole text."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= (limit * 2) // 3:
        cut = cut[:space]
    return cut.rstrip() + "…"


def _may_expire(r: Row) -> bool:
    """An active row with an expiry: shown expired once it passes (see :meth:`Lens._show_expired`)."""
    return r.expires_at is not None and r.status == Status.ACTIVE.value


@dataclass
class Row:
    """What the dashboard and the metrics need of one memory (a few hundred bytes, not the whole text)."""

    id: str
    session_id: str | None
    task_id: str | None
    agent_id: str | None
    tool_name: str | None
    kind: str
    state: str | None
    status: str
    tier: str
    value: float
    pinned: bool
    tokens: int
    created_at: datetime
    last_used: datetime
    expires_at: datetime | None
    parent_id: str | None
    links: tuple[tuple[str, str], ...]
    tags: tuple[str, ...]
    access_count: int
    injected: int
    cited: int
    preview: str
    seconds: float  # what producing it cost (a tool call's latency, an LLM call's time)
    cost_tokens: int
    money: float
    norm: int  # hash of the normalised text (duplicates)
    words: int

    @classmethod
    def of(cls, m: Memory) -> Row:
        text = " ".join(m.content.split())
        return cls(
            id=m.id,
            session_id=m.session_id,
            task_id=m.task_id,
            agent_id=m.agent_id,
            tool_name=m.tool_name,
            kind=m.kind.value,
            state=m.state.value if m.state else None,
            status=m.status.value,
            tier=m.tier.value,
            value=m.value,
            pinned=m.pinned,
            tokens=m.token_count,
            created_at=m.created_at,
            last_used=max(m.created_at, m.last_accessed_at or m.created_at),
            expires_at=m.expires_at,
            parent_id=m.parent_id,
            links=tuple((link.type.value, link.target) for link in m.links),
            tags=tuple(m.tags),
            access_count=m.access_count,
            injected=m.usage.injected,
            cited=m.usage.cited,
            preview=clip(text, 160),
            seconds=m.cost.seconds,
            cost_tokens=m.cost.tokens,
            money=m.cost.money,
            norm=hash(text.lower()),
            words=len(_WORD.findall(m.content[:2000])),
        )

    @classmethod
    def of_stored(cls, d: dict[str, Any]) -> Row:
        """The row of a memory as the store keeps it (:meth:`clawvm.store.Store.page_json`): the same row
        as :meth:`of` gives, without validating the memory first (what a cold build of 10k rows spends)."""
        content = str(d["content"])
        text = " ".join(content.split())
        created = datetime.fromisoformat(d["created_at"])
        accessed = d.get("last_accessed_at")
        usage, cost = d.get("usage") or {}, d.get("cost") or {}
        return cls(
            id=d["id"],
            session_id=d.get("session_id"),
            task_id=d.get("task_id"),
            agent_id=d.get("agent_id"),
            tool_name=d.get("tool_name"),
            kind=d["kind"],
            state=d.get("state"),
            status=d["status"],
            tier=d["tier"],
            value=float(d["value"]),
            pinned=bool(d["pinned"]),
            tokens=int(d["token_count"]),
            created_at=created,
            last_used=max(created, datetime.fromisoformat(accessed)) if accessed else created,
            expires_at=datetime.fromisoformat(d["expires_at"]) if d.get("expires_at") else None,
            parent_id=d.get("parent_id"),
            links=tuple((str(x["type"]), str(x["target"])) for x in d.get("links") or ()),
            tags=tuple(d.get("tags") or ()),
            access_count=int(d.get("access_count", 0)),
            injected=int(usage.get("injected", 0)),
            cited=int(usage.get("cited", 0)),
            preview=clip(text, 160),
            seconds=float(cost.get("seconds", 0.0)),
            cost_tokens=int(cost.get("tokens", 0)),
            money=float(cost.get("money", 0.0)),
            norm=hash(text.lower()),
            words=len(_WORD.findall(content[:2000])),
        )

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("norm", "words")}
        out.update(
            short_id=short_id(self.id),
            created_at=self.created_at.isoformat(),
            last_used=self.last_used.isoformat(),
            expires_at=self.expires_at.isoformat() if self.expires_at else None,
            links=[{"type": t, "target": x} for t, x in self.links],
            tags=list(self.tags),
            value=round(self.value, 4),
        )
        return out


@dataclass
class Output:
    seq: int
    at: datetime
    cited: list[str]
    uncited: list[str]
    text: str
    success: bool | None


def _merged(earlier: Output, later: Output) -> Output:
    """A build's outputs add up (several model calls from one context): a memory any of them cited is
    cited, as each output counted in its ``usage.cited``; the text and outcome are the latest. (The
    latest alone used to replace the others, un-citing what they cited.)"""
    cited = list(dict.fromkeys([*earlier.cited, *later.cited]))
    either = set(cited)
    uncited = [i for i in dict.fromkeys([*earlier.uncited, *later.uncited]) if i not in either]
    return Output(later.seq, later.at, cited, uncited, later.text, later.success)


@dataclass
class ContextBuild:
    seq: int
    at: datetime
    query: str
    budget: int
    tokens: int
    ms: float | None
    scope: dict[str, str]
    manifest: list[dict[str, Any]]
    output: Output | None = None

    def by_section(self) -> dict[str, int]:
        """Tokens per section, as ``Context.by_section``: the manifest's lines, and the tool-reliability
        warning lines at the top of the prompt (no manifest line: the rest of the build's tokens)."""
        out = {"pinned": 0, "working": 0, "retrieved": 0}
        for e in self.manifest:
            out[str(e["section"])] = out.get(str(e["section"]), 0) + int(e["tokens"])
        warnings = self.tokens - sum(out.values())
        if warnings > 0:
            out["warnings"] = warnings
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "query": self.query,
            "budget": self.budget,
            "tokens": self.tokens,
            "ms": self.ms,
            "scope": self.scope,
            "lines": len(self.manifest),
            "by_section": self.by_section(),
            "has_output": self.output is not None,
            "cited": len(self.output.cited) if self.output else 0,
        }


@dataclass
class Move:
    seq: int
    at: datetime
    memory_id: str
    kind: str
    from_tier: str | None
    to_tier: str | None
    reason: str
    value_after: float | None


@dataclass
class _Needs:
    total: int = 0
    hits: int = 0
    # memory -> seq and time of its pending eviction
    evicted: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    evictions: int = 0
    regretted: list[tuple[str, int, int]] = field(default_factory=list)  # (memory, evicted seq, needed seq)
    # the same counts per memory ([needs, working hits, evictions, regrets]): what a session's metrics sum
    per_memory: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0, 0]))

    def of(self, ids: Iterable[str]) -> tuple[int, int, int, int]:
        """(needs, hits, evictions, regrets) of the memories ``ids``."""
        counts = [self.per_memory[i] for i in ids if i in self.per_memory]
        return (
            sum(c[0] for c in counts),
            sum(c[1] for c in counts),
            sum(c[2] for c in counts),
            sum(c[3] for c in counts),
        )


class Lens:
    """Incremental analytics over one harness's tenant. Thread-safe; call :meth:`refresh` before reading
    (every public reader does)."""

    def __init__(self, harness: LensHost, full_reload_s: float = 300.0) -> None:
        if not isinstance(getattr(harness, "tenant", None), str):
            raise ValidationError("harness", f"is {type(harness).__name__}", "pass the Harness to analyse")
        self.harness = harness
        self.tenant = harness.tenant
        self.full_reload_s = full_reload_s
        self._lock = threading.RLock()
        self.rows: dict[str, Row] = {}
        self.seq = 0
        self.events_seen = 0
        self.contexts: dict[int, ContextBuild] = {}
        self.contexts_by_memory: dict[str, list[int]] = defaultdict(list)
        self.moves: list[Move] = []
        self.values: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
        self.retrieve_ms: list[float] = []
        self.context_ms: list[float] = []
        self.manual: list[Event] = []
        self.weights_events: list[Event] = []
        self.guidance_events: deque[Event] = deque(maxlen=GUIDANCE_KEPT)  # the newest guidance builds
        self.kinds: Counter[str] = Counter()
        self.last_at: datetime | None = None
        self._needs = _Needs()
        self._loaded_at = 0.0
        self._load_cost = 0.0
        self._touched_while_reloading: set[str] | None = None  # set while a background reload runs
        self._expiring: set[str] = set()  # active rows with an expiry: shown expired once it passes
        with self._lock:
            self._read_events()
            self._swap_rows(self._load_rows())

    @property
    def lock(self) -> threading.RLock:
        """Hold it to read several of the lens's tables as one consistent view (the dashboard's views do)."""
        return self._lock

    # ---- keeping up ---------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Apply the events appended since the last refresh; re-read the memories they name.

        Now and then (every ``full_reload_s``, at least 50 times the cost of one) every row is re-read in
        a background thread, for the changes no event names (``tick()`` refreshing values)."""
        with self._lock:
            touched = self._read_events()
            if self._touched_while_reloading is not None:
                self._touched_while_reloading.update(touched)
            if touched:
                self._reread(touched)
            self._show_expired()
            pause = max(self.full_reload_s, 50 * self._load_cost)
            if self._touched_while_reloading is None and time.monotonic() - self._loaded_at > pause:
                self._touched_while_reloading = set()
                threading.Thread(target=self._reload_in_background, daemon=True, name="lens-reload").start()

    def _read_events(self) -> set[str]:
        touched: set[str] = set()
        for e in iter_events(self.harness.store, self.seq):
            self.seq = e.seq or self.seq
            if e.tenant == self.tenant:
                self._apply(e, touched)
        return touched

    def _load_rows(self) -> dict[str, Row]:
        started = time.monotonic()
        # internal records (team grants) are the harness's own bookkeeping, never shown
        shown = Filters.of(tenant=self.tenant, status=VISIBLE_STATUSES)
        # as stored, not validated into memories: the rows are a few fields of each (a cold build at 10k
        # memories took seconds, most of them validating)
        rows = {d["id"]: Row.of_stored(d) for d in self.harness.store.iter_json(shown, batch=2000)}
        self._load_cost = time.monotonic() - started
        return rows

    def _swap_rows(self, rows: dict[str, Row]) -> None:
        self.rows = rows
        self._loaded_at = time.monotonic()
        self._expiring = {i for i, r in rows.items() if _may_expire(r)}

    def _show_expired(self) -> None:
        """Rows past their ``expires_at`` show status expired, as the harness's reads do, swept or not (the
        dashboard listed them active, under "active" and not under "expired", until a tick)."""
        now = self.now()
        for i in list(self._expiring):
            row = self.rows.get(i)
            if row is None or not _may_expire(row):  # forgotten, or changed since
                self._expiring.discard(i)
            elif row.expires_at is not None and row.expires_at <= now:
                self.rows[i] = replace(row, status=Status.EXPIRED.value)
                self._expiring.discard(i)

    def _reload_in_background(self) -> None:
        try:
            rows = self._load_rows()  # without the lock: readers keep the old rows meanwhile
            with self._lock:
                touched = self._touched_while_reloading or set()
                self._swap_rows(rows)
                self._reread(touched)  # what changed while we read may be older in `rows`
        except ClawVMError:  # the store went away (closed): keep the rows we have
            pass
        finally:
            with self._lock:
                self._touched_while_reloading = None

    def _reread(self, ids: Iterable[str]) -> None:
        wanted = list(ids)
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            found = self.harness.store.get_many(chunk)
            for i in chunk:
                if i in found and found[i].status in VISIBLE_STATUSES:
                    self.rows[i] = row = Row.of(found[i])
                    if _may_expire(row):
                        self._expiring.add(i)
                else:
                    self.rows.pop(i, None)

    def _apply(self, e: Event, touched: set[str]) -> None:
        self.events_seen += 1
        self.kinds[e.kind] += 1
        self.last_at = e.at if self.last_at is None else max(self.last_at, e.at)
        seq, data = e.seq or 0, e.data
        if e.memory_id:
            touched.add(e.memory_id)
        for key in _CHANGED_ID_LISTS:
            if isinstance(data.get(key), list):
                touched.update(str(x) for x in data[key])
        for key in _CHANGED_IDS:
            if isinstance(data.get(key), str):
                touched.add(data[key])
        handler = _HANDLERS.get(e.kind)
        if handler is not None:
            handler(self, e, seq, data, touched)

    def _on_add(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        self.moves.append(Move(seq, e.at, e.memory_id or "", "add", None, data.get("tier"), "recorded", None))

    def _on_move(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        mid = e.memory_id or ""
        after = data.get("value_after", data.get("value"))
        self.moves.append(
            Move(seq, e.at, mid, e.kind, data.get("from"), data.get("to"), str(data.get("reason", "")), after)
        )
        if isinstance(after, int | float):
            self.values[mid].append((e.at, float(after)))
        if e.kind == "archive":
            self._evict(mid, seq, e.at)
        elif e.kind == "promote":
            self._need(mid, seq, None)

    def _on_collapse(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        """A task's intermediate steps folded into its summary: each step moved to the archive."""
        reason = f"collapsed into summary {short_id(e.memory_id or '')}"
        for step in data.get("steps", []):
            mid = str(step)
            self.moves.append(Move(seq, e.at, mid, "archive", None, Tier.ARCHIVE.value, reason, None))
            self._evict(mid, seq, e.at)

    def _on_rollback(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        """The restored memories are back in their checkpoint's tiers; the ones made since are archived."""
        reason = f"rolled back to checkpoint {data.get('name', '')!s}"
        tiers: dict[str, Any] = data["tiers"] if isinstance(data.get("tiers"), dict) else {}
        for mid in map(str, data.get("restored", [])):
            row = self.rows.get(mid)  # a rollback logged without its tiers: the tier it has now
            tier = tiers.get(mid, row.tier if row is not None else None)
            self.moves.append(Move(seq, e.at, mid, "rollback", None, tier, reason, None))
        for mid in map(str, data.get("obsoleted", [])):
            self.moves.append(Move(seq, e.at, mid, "rollback", None, Tier.ARCHIVE.value, reason, None))

    def _on_compress(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        reason = str(data.get("reason"))
        self.moves.append(Move(seq, e.at, e.memory_id or "", "compress", None, None, reason, None))
        self._evict(e.memory_id or "", seq, e.at)

    def _on_value(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        v = data.get("value", data.get("value_after"))
        if isinstance(v, int | float) and e.memory_id:
            self.values[e.memory_id].append((e.at, float(v)))

    def _on_retrieve(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        if isinstance(data.get("ms"), int | float):
            self.retrieve_ms.append(float(data["ms"]))
        for hit in data.get("hits", []):
            mid = str(hit["id"])
            touched.add(mid)
            # a tracked recall's event is logged by the pager's next pass, maybe after an eviction that
            # followed the recall: its time, not its number, says whether it came after the eviction
            self._need(mid, seq, hit.get("tier"), e.at)
            if isinstance(hit.get("value"), int | float):
                self.values[mid].append((e.at, float(hit["value"])))

    def _on_context(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        manifest = list(data.get("manifest", []))
        build = ContextBuild(
            seq,
            e.at,
            str(data.get("query", "")),
            int(data.get("budget", 0)),
            int(data.get("tokens", 0)),
            data.get("ms"),
            dict(data.get("scope", {})),
            manifest,
        )
        self.contexts[seq] = build
        if isinstance(build.ms, int | float):
            self.context_ms.append(float(build.ms))
        for line in manifest:
            mid = str(line["id"])
            touched.add(mid)
            self.contexts_by_memory[mid].append(seq)
            self.values[mid].append((e.at, float(line["value"])))
            if line.get("section") == "retrieved":
                self._need(mid, seq, str(line.get("tier")))

    def _on_output(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        build = self.contexts.get(int(data.get("context_seq", -1)))
        out = Output(
            seq,
            e.at,
            list(data.get("cited", [])),
            list(data.get("uncited", [])),
            str(data.get("text", "")),
            data.get("success"),
        )
        if build is not None:
            build.output = out if build.output is None else _merged(build.output, out)
        for mid in out.cited:
            touched.add(mid)
            self._need(mid, seq, None)
        touched.update(out.uncited)

    def _on_manual(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        self.manual.append(e)
        after = data.get("after", {})
        if isinstance(after, dict) and isinstance(after.get("value"), int | float) and e.memory_id:
            self.values[e.memory_id].append((e.at, float(after["value"])))
        if data.get("action") == "pin" and e.memory_id:
            self._need(e.memory_id, seq, None)

    def _on_weights(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        self.weights_events.append(e)

    def _on_guidance(self, e: Event, seq: int, data: dict[str, Any], touched: set[str]) -> None:
        self.guidance_events.append(e)

    def _need(self, mid: str, seq: int, tier: str | None, at: datetime | None = None) -> None:
        """A need of ``mid`` (event ``seq``, at ``at`` when its number may come later than its time)."""
        n = self._needs
        mine = n.per_memory[mid]
        if tier is not None:
            n.total += 1
            n.hits += tier == Tier.WORKING.value
            mine[0] += 1
            mine[1] += tier == Tier.WORKING.value
        evicted = n.evicted.get(mid)
        if evicted is not None and (at is None or at >= evicted[1]):
            del n.evicted[mid]
            n.regretted.append((mid, evicted[0], seq))
            mine[3] += 1

    def _evict(self, mid: str, seq: int, at: datetime) -> None:
        if mid and mid not in self._needs.evicted:
            self._needs.evicted[mid] = (seq, at)
            self._needs.evictions += 1
            self._needs.per_memory[mid][2] += 1

    # ---- reading -------------------------------------------------------------------------------------
    def now(self) -> datetime:
        return self.harness.now()

    def memory(self, memory_id: str) -> Row:
        self.refresh()
        row = self.rows.get(memory_id)
        if row is None:
            raise NotFoundError("memory", memory_id)
        return row

    def influence(self, context_seq: int) -> dict[str, Any]:
        """One context build: every memory that fed it, its section, tier and value then, cited or not."""
        self.refresh()
        with self._lock:
            build = self.contexts.get(context_seq)
            if build is None:
                raise NotFoundError("context build", str(context_seq))
            cited = set(build.output.cited) if build.output else set()
            lines = []
            for line in build.manifest:
                row = self.rows.get(str(line["id"]))
                lines.append(
                    {
                        **line,
                        "cited": line["id"] in cited if build.output else None,
                        "now": None if row is None else {"tier": row.tier, "value": round(row.value, 4)},
                        "kind": row.kind if row else None,
                        "preview": row.preview if row else "(forgotten)",
                    }
                )
            out = build.output
            return {
                **build.summary(),
                "lines": lines,
                "output": None
                if out is None
                else {
                    "seq": out.seq,
                    "at": out.at.isoformat(),
                    "text": out.text,
                    "success": out.success,
                    "cited": out.cited,
                    "uncited": out.uncited,
                },
            }

    def contexts_of(self, memory_id: str) -> list[dict[str, Any]]:
        """Reverse influence: every context build ``memory_id`` entered, with its tier and value then."""
        if not isinstance(memory_id, str) or not memory_id:
            raise ValidationError("memory_id", f"is {memory_id!r}", "pass the id of a memory")
        self.refresh()
        return self.contexts_of_as_is(memory_id)

    def contexts_of_as_is(self, memory_id: str) -> list[dict[str, Any]]:
        """:meth:`contexts_of` as of the last refresh (for a caller that has just refreshed)."""
        with self._lock:
            out = []
            for seq in self.contexts_by_memory.get(memory_id, []):
                build = self.contexts[seq]
                line = next(x for x in build.manifest if x["id"] == memory_id)
                cited = None if build.output is None else memory_id in build.output.cited
                out.append(
                    {
                        "seq": seq,
                        "at": build.at.isoformat(),
                        "query": build.query,
                        "section": line["section"],
                        "tier": line["tier"],
                        "value": line["value"],
                        "tokens": line["tokens"],
                        "cited": cited,
                    }
                )
            return out

    def stored_id(self, scope_id: str) -> str:
        """A session or task id as a caller names it, as the write path stored it (a secret-looking one is
        stored redacted): what the rows and builds hold."""
        return self.harness.writer.identifier(scope_id, self.tenant)

    def metrics(self, session: str | None = None) -> dict[str, Any]:
        """The tenant's metrics, or with ``session`` those of the session's memories and builds (events by
        kind, recall latencies and tool reliability stay tenant-wide: a tracked recall has no session, and a
        tool is as reliable as all of its calls say)."""
        session = self.stored_id(session) if session else None
        self.refresh()
        with self._lock:
            now = self.now()
            rows = [r for r in self.rows.values() if session is None or r.session_id == session]
            active = [r for r in rows if r.status == Status.ACTIVE.value]
            builds = sorted(
                (
                    b
                    for b in self.contexts.values()
                    if session is None or b.scope.get("session_id") == session
                ),
                key=lambda b: b.seq,
            )
            needs, hits, evictions, regrets = self._need_counts(session, rows)
            tokens = [b.tokens for b in builds]
            build_ms = [float(b.ms) for b in builds if isinstance(b.ms, int | float)]
            tools = (
                self.harness.tool_reliability()
            )  # a tool's reliability is the tenant's, as the pager sees it
            return {
                "session": session,
                "memories": len(rows),
                "active": len(active),
                "events": self.events_seen,
                "events_by_kind": dict(self.kinds.most_common()),
                "working_hit_rate": _rate(hits, needs),
                "needs": needs,
                "retrieval_ms": _percentiles(self.retrieve_ms),
                "context_ms": _percentiles(build_ms if session else self.context_ms),
                "eviction_regret": _rate(regrets, evictions),
                "evictions": evictions,
                "regretted": [
                    {"id": m, "evicted_seq": a, "needed_seq": b}
                    for m, a, b in self._needs.regretted[-50:]
                    if session is None or (m in self.rows and self.rows[m].session_id == session)
                ],
                "context_tokens": {
                    "builds": len(builds),
                    "mean": round(sum(tokens) / len(tokens), 1) if tokens else None,
                    **{k: v for k, v in _percentiles([float(t) for t in tokens]).items() if k != "n"},
                    "max": max(tokens) if tokens else None,
                    "series": [
                        {"seq": b.seq, "at": b.at.isoformat(), "tokens": b.tokens, "budget": b.budget}
                        for b in builds[-300:]
                    ],
                },
                **quality_rates(active, now, self.harness.pager.config.scoring),
                "tools": [asdict(t) for t in tools.values()],
                "latency_series": [round(x, 3) for x in self.retrieve_ms[-300:]],
            }

    def _need_counts(self, session: str | None, rows: Sequence[Row]) -> tuple[int, int, int, int]:
        n = self._needs
        if session is None:
            return n.total, n.hits, n.evictions, len(n.regretted)
        return n.of(r.id for r in rows)


#: Event data that names memories the event changed besides its own (their rows are read again): lists of
#: ids, and single ids (a revision's predecessor, made obsolete; a compressed memory's raw copy).
_CHANGED_ID_LISTS = ("ids", "steps", "restored", "obsoleted", "sources", "errors")
_CHANGED_IDS = ("raw_id", "revises")
_HANDLERS = {
    "add": Lens._on_add,
    "import": Lens._on_add,
    "revise": Lens._on_add,  # a revision is a new memory (the event names it), at its predecessor's tier
    "promote": Lens._on_move,
    "demote": Lens._on_move,
    "archive": Lens._on_move,
    "pin": Lens._on_move,
    "unpin": Lens._on_value,
    "feedback": Lens._on_value,
    "refresh": Lens._on_value,
    "compress": Lens._on_compress,
    "collapse": Lens._on_collapse,
    "rollback": Lens._on_rollback,
    "retrieve": Lens._on_retrieve,
    "context": Lens._on_context,
    "output": Lens._on_output,
    "manual": Lens._on_manual,
    WEIGHTS_KIND: Lens._on_weights,
    "guidance": Lens._on_guidance,
}


# ---- metrics over rows ----------------------------------------------------------------------------------
def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _percentiles(xs: Sequence[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "p95": None, "p99": None}
    s = sorted(xs)

    def at(q: float) -> float:
        pos = q * (len(s) - 1)  # linear interpolation, as numpy's default
        lo = math.floor(pos)
        hi = min(lo + 1, len(s) - 1)
        return round(s[lo] + (s[hi] - s[lo]) * (pos - lo), 3)

    return {"n": len(s), "p50": at(0.5), "p90": at(0.9), "p95": at(0.95), "p99": at(0.99)}


def quality_rates(active: Sequence[Row], now: datetime, cfg: ScoringConfig) -> dict[str, Any]:
    """Duplicate, junk and stale rates over active memories (definitions in the module docstring)."""
    seen: set[int] = set()
    duplicates: list[str] = []
    for r in sorted(active, key=lambda r: (r.created_at, r.id)):
        if r.norm in seen:
            duplicates.append(r.id)
        seen.add(r.norm)
    day = timedelta(days=1)
    junk = [
        r.id
        for r in active
        if r.words < 3
        or (
            not r.pinned
            and r.access_count == 0
            and r.injected == 0
            and r.cited == 0
            and r.value < JUNK_VALUE
            and now - r.created_at > day
        )
    ]
    active_ids = {r.id for r in active}
    revised = {t for r in active for kind, t in r.links if kind == "revises" and t in active_ids}
    stale = []
    for r in active:
        half = cfg.half_life_hours.get(r.kind, 168.0)
        idle_h = (now - r.last_used).total_seconds() / 3600
        if r.id in revised or (
            r.tier == Tier.WORKING.value and not r.pinned and idle_h > STALE_HALF_LIVES * half
        ):
            stale.append(r.id)
    n = len(active)
    return {
        "duplicate_rate": _rate(len(duplicates), n),
        "junk_rate": _rate(len(junk), n),
        "stale_rate": _rate(len(stale), n),
        "examples": {"duplicate": duplicates[:20], "junk": junk[:20], "stale": stale[:20]},
    }


# ---- outputs and citations ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Citation:
    context_seq: int
    cited: list[str]
    uncited: list[str]
    event_seq: int


def record_output(
    harness: LensHost, context: Context | int, output: str, *, success: bool | None = None
) -> Citation:
    """Record the agent output produced from a context build; mark which of its memories it cited.

    ``context``: the :class:`Context` (or its ``event_seq``). Cited memories get ``usage.cited + 1`` and,
    with ``success``, ``successes``/``failures`` + 1; all of it is one ``output`` event.
    """
    if not isinstance(output, str):
        raise ValidationError("output", f"has type {type(output).__name__}", "pass the output text")
    if success is not None and not isinstance(success, bool):
        raise ValidationError("success", f"is {success!r}", "pass True, False or None (unknown)")
    if not isinstance(context, Context) and (isinstance(context, bool) or not isinstance(context, int)):
        raise ValidationError(
            "context",
            f"has type {type(context).__name__}",
            "pass a Context from Harness.context, or its event_seq",
        )
    seq = context.event_seq if isinstance(context, Context) else context
    if seq is None:
        raise ValidationError("context", "has no event_seq", "pass a Context returned by Harness.context")
    found = harness.store.read_events(seq - 1, 1)
    if not found or found[0].seq != seq or found[0].kind != "context" or found[0].tenant != harness.tenant:
        raise NotFoundError("context build", str(seq))
    manifest = found[0].data.get("manifest", [])
    said = set(_SHORT_ID.findall(output.lower()))
    cited = [str(x["id"]) for x in manifest if x["short_id"] in said]
    uncited = [str(x["id"]) for x in manifest if x["short_id"] not in said]
    now = harness.now()
    event = Event(
        kind=EventKind.OUTPUT,
        tenant=harness.tenant,
        at=now,
        data={
            "context_seq": seq,
            "cited": cited,
            "uncited": uncited,
            "text": harness.writer.scrub(output, harness.tenant)[:4000],
            "success": success,
        },
    )
    event_seq = _logged_with_credit(harness, cited, success, now, event)
    return Citation(seq, cited, uncited, event_seq)


def _logged_with_credit(
    harness: LensHost, cited: list[str], success: bool | None, now: datetime, event: Event
) -> int:
    """The ``output`` event logged with the credit of its cited memories in one write (an output never
    counted without its event, or the reverse); returns the event's number. The harness's own usage
    stats, as access counts are (no change a reader of a memory must see): a memory that moved on
    meanwhile is read again, and after ``WRITE_RETRIES`` tries :class:`ConflictError`, nothing written."""

    def credited() -> list[Memory]:
        out = []
        for memory in harness.store.get_many(cited).values():
            # plain copies, no re-validation: the changed values are counters we built
            changed = memory.model_copy(
                update={"usage": _credited(memory.usage, success), "version": memory.version + 1}
            )
            out.append(changed.model_copy(update={"value": harness.pager.value_now(changed, now)}))
        return out

    event_seq = logged_with_counts(harness.writer, credited, event, WRITE_RETRIES)
    if event_seq is None:
        raise ConflictError(cited[0], None, None)  # (no cited memory: no write that can conflict)
    return event_seq


def _credited(u: Usage, success: bool | None) -> Usage:
    return u.model_copy(
        update={
            "cited": u.cited + 1,
            "successes": u.successes + (success is True),
            "failures": u.failures + (success is False),
        }
    )
