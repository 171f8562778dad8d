"""The context builder's packing: what goes into the prompt, under a token budget, with provenance.

``pack`` is pure: given candidates (memory, section, relevance, reason) it returns the prompt text and
its manifest. Sections are packed in order — pinned, working tier, retrieved — each within its quota of
the budget (unused quota flows to the next section); retrieved memories go by priority = relevance ×
(0.5 + value), then the conversational neighbours of the packed hits (the question before, the answer
after) fill what is left. A memory whose kind and words a line already says (the same tool result
recorded again) adds no second line, when they are three words or more: a short answer said again ("yes")
answers another question. The text lists each section chronologically, one line per memory:
``[<short id> <date>] <kind>: <content>``. Token counts use the embedding model's tokenizer, and the
manifest's counts add up to exactly the text's count (lines are joined by newlines, which that tokenizer
treats as plain whitespace). Nothing ever goes over the budget.

**The prompt invariants**, enforced here and nowhere else (:func:`admissible`, applied by ``pack`` to every
candidate and every neighbour, whichever section asked for it): a context holds only memories that are
active and unexpired at build time. That excludes an obsolete revision, an archived raw copy beside its
summary, the archived steps of a collapsed task, a checkpoint snapshot, a rejected or merged-away memory
and the harness's internal records, whatever their tier or pin. A raw copy (``metadata["raw_of"]``) and a
checkpoint snapshot stay out even if someone made them active again: their text is already in the prompt
through the summary, or is bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from clawvm.core.model import Memory, Status, is_snapshot, within

SECTIONS = ("pinned", "working", "retrieved")
#: the fewest words a memory's text repeats for the repeat to add no line: a short answer said again
#: ("yes", "ok") answers another question
REPEAT_MIN_WORDS = 3


@dataclass(frozen=True)
class Quotas:
    """Fractions of the budget each section may use at most (unused budget flows to later sections).

    Pinned memories may use the whole budget: a pin means "in every context of the session" (pinning
    already refuses to pin more than the working tier's budget)."""

    pinned: float = 1.0
    working: float = 0.4
    retrieved: float = 1.0

    def __post_init__(self) -> None:
        for name in ("pinned", "working", "retrieved"):
            fix = "pass a share of the budget between 0 and 1 (0.4 = 40%)"
            within(f"quotas.{name}", getattr(self, name), 0.0, 1.0, fix)


@dataclass(frozen=True)
class Candidate:
    memory: Memory
    section: str
    relevance: float = 0.0
    reason: str = ""
    neighbours: tuple[Memory, ...] = ()


@dataclass(frozen=True)
class ManifestEntry:
    """One line of the context: which memory, from where, how much, and why."""

    id: str
    short_id: str
    section: str
    tier: str
    value: float
    score: float
    tokens: int
    reason: str
    created_at: str

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass
class Context:
    text: str
    manifest: list[ManifestEntry]
    budget: int
    tokens: int
    by_section: dict[str, int] = field(default_factory=dict)
    event_seq: int | None = None  # the seq of this build's "context" event (influence tracing, citations)

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.manifest]


def one_line(text: str) -> str:
    """``text`` on one line: its whitespace runs collapsed to single spaces, none at either end."""
    return " ".join(text.split())


def clip(text: str, limit: int) -> str:
    """``text`` on one line (:func:`one_line`), cut to ``limit`` characters with "…"."""
    flat = one_line(text)
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def short_id(memory_id: str) -> str:
    """The last 8 hex digits: UUIDv7's random tail, unique enough to cite inside one context."""
    return memory_id.replace("-", "")[-8:]


def label(memory: Memory) -> str:
    return f"[{short_id(memory.id)} {memory.created_at:%Y-%m-%d}] {memory.kind.value}:"


def render(memory: Memory) -> str:
    return f"{label(memory)} {one_line(memory.content)}"  # one line per memory


def line_tokens(memory: Memory, count_tokens: Callable[[str], int]) -> int:
    """Tokens of ``render(memory)`` without re-tokenizing the content: the tokenizer splits on
    whitespace first, so the label's count plus the stored ``token_count`` is exactly the line's count.

    That holds only when rendering leaves the content as it is: where ``str.split`` sees whitespace that
    the tokenizer does not (e.g. ``\\x1f``, which it drops), the line is counted as rendered."""
    if one_line(memory.content) != memory.content:
        return count_tokens(render(memory))
    return count_tokens(label(memory)) + memory.token_count


def admissible(memory: Memory, now: datetime) -> bool:
    """Whether ``memory`` may be in a prompt built at ``now`` (see the module docstring)."""
    if memory.status is not Status.ACTIVE:
        return False
    if memory.expires_at is not None and memory.expires_at <= now:
        return False
    if "raw_of" in memory.metadata:
        return False
    return not is_snapshot(memory)




@dataclass(frozen=True, slots=True)
class _Line:
    """A memory chosen for the context: in which section, with what score and reason, at what cost."""

    memory: Memory
    section: str
    score: float
    reason: str
    tokens: int


def pack(
    candidates: Sequence[Candidate],
    budget: int,
    count_tokens: Callable[[str], int],
    quotas: Quotas = Quotas(),
    *,
    now: datetime,
) -> Context:
    """The context of ``candidates`` under ``budget`` tokens, as of ``now`` (what is admissible then)."""
    chosen: dict[str, _Line] = {}
    said: set[tuple[str, str]] = set()  # (kind, words) of each line chosen
    used = 0
    by_section = dict.fromkeys(SECTIONS, 0)

    def take(m: Memory, section: str, score: float, reason: str, limit: int) -> bool:
        nonlocal used
        if m.id in chosen:
            return True
        if not admissible(m, now):
            return False
        said_as = (m.kind.value, one_line(m.content))
        if said_as in said and said_as[1].count(" ") + 1 >= REPEAT_MIN_WORDS:
            return True  # the same words again (a tool result recorded on each run): the first stands
        tokens = line_tokens(m, count_tokens)
        if by_section[section] + tokens > limit or used + tokens > budget:
            return False
        chosen[m.id] = _Line(m, section, score, reason, tokens)
        said.add(said_as)
        by_section[section] += tokens
        used += tokens
        return True

    for section in SECTIONS:
        limit = int(budget * getattr(quotas, section))
        group = [c for c in candidates if c.section == section]
        if section == "retrieved":
            group.sort(key=lambda c: -c.relevance * (0.5 + c.memory.value))
        for c in group:
            take(c.memory, section, c.relevance, c.reason, limit)
        for c in group:  # neighbours only fill what the hits themselves left over
            if c.memory.id in chosen:
                for n in c.neighbours:
                    take(n, section, 0.0, f"neighbour of {short_id(c.memory.id)}", limit)
    lines: list[str] = []
    manifest: list[ManifestEntry] = []
    for section in SECTIONS:
        rows = sorted(
            (line for line in chosen.values() if line.section == section),
            key=lambda line: (line.memory.created_at, line.memory.id),
        )
        for line in rows:
            m = line.memory
            lines.append(render(m))
            manifest.append(
                ManifestEntry(
                    m.id,
                    short_id(m.id),
                    line.section,
                    m.tier.value,
                    round(m.value, 4),
                    round(line.score, 4),
                    line.tokens,
                    line.reason,
                    m.created_at.isoformat(),
                )
            )
    return Context("\n".join(lines), manifest, budget, used, by_section)
