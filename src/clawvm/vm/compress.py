"""Reversible compression: summaries that keep a pointer to the raw text, and the summarizers.

A compressed memory's content becomes a summary; its raw content moves to a separate archived memory
(``metadata["raw_of"]`` = the original id) that the compressed one links to (``derived_from``) and names
in ``metadata["compression"]``. Nothing is lost: ``Harness.decompress`` restores the raw text, and the
raw copy cannot be forgotten while a compressed memory points at it.

What is never compressed: JSON payloads (structured data), and inside text every line of code and every
sentence holding a number is kept verbatim, so exact values survive a summary.

The optional :class:`LLMSummarizer` fails safe: whenever its endpoint gives no usable summary it returns the
:class:`ExtractiveSummarizer`'s instead, and :func:`compress_memory` (and ``Harness.collapse_task``) log a
``summarizer_fallback`` event saying why (the reason, the endpoint's model and a detail such as ``HTTP 500``;
never any text). A placeholder ("None", "") is never stored.

| reason            | when                                                                          |
|-------------------|-------------------------------------------------------------------------------|
| `http_status`     | the endpoint answered with an error status                                    |
| `malformed_reply` | not HTTP, a body shorter than its Content-Length or over 64 MB, not JSON          |
| `empty_reply`     | the reply's content is null, empty or blank                                    |
| `timeout`         | no whole answer within ``timeout_s`` (or what was left of the pass's budget)   |
| `unreachable`     | the connection was refused or reset                                            |
| `budget_spent`    | the pager's pass had spent ``PagerConfig.endpoint_budget_s`` (default 10 s) on  |
|                   | the endpoint already: the rest of the pass summarizes extractively, uncalled    |
| `numbers_dropped` | the text had numbers and the summary kept none of them                         |
| `too_long`        | the summary is over 1.5x the length asked for                                  |
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from clawvm.core.embed import count_tokens
from clawvm.core.entities import entities as named_entities
from clawvm.core.errors import UpstreamError, ValidationError
from clawvm.core.lexical import CJK_CLASS, cjk_terms
from clawvm.core.model import JSON, Filters, Link, LinkType, Memory, Status, Tier, derived, revalidate
from clawvm.core.openai_http import ChatEndpoint, EndpointFailure, FailureReason
from clawvm.store import Event
from clawvm.store.base import Requirement, StoreReader
from clawvm.store.kinds import EventKind
from clawvm.vm.context import one_line
from clawvm.write.commit import Writer

# a sentence ends at . ! ? (and the Arabic question mark, the Devanagari and Urdu full stops) before a
# space and a letter or digit of any script, a quote or a bracket; or at the full-width marks of Chinese
# and Japanese, which no space follows. (An ASCII capital only: Russian, Greek, Arabic, Hindi, "Über..."
# and lower-case chat were one sentence, too long for any summary, and compress() kept them whole.)
_SENTENCE = re.compile(r"(?<=[.!?؟।۔])\s+(?=[^\W_]|[\"'(\[«„“¿¡])|(?<=[。！？])\s*")
_CJK_RUN = re.compile(f"[{CJK_CLASS}]+")
_NUMBER = re.compile(r"\d")
_NUMBER_TOKEN = re.compile(r"\d+(?:[.,:]\d+)*")
_CODE_LINE = re.compile(r"^\s{2,}\S|[{};]\s*$|^\s*(def|class|return|import|from|SELECT|UPDATE|INSERT)\b|`")
_ENTITY = re.compile(r"\b[A-Z][a-zA-Z0-9_-]+(?:\s+[A-Z][a-zA-Z0-9_-]+)*")
_WORD = re.compile(r"[^\W\d_]+")  # letters of any script
_IDENTIFIER = re.compile(r"[0-9_-]|[a-z][A-Z]")  # "ERR_42", "api-v2", "LeBron": never a sentence word


class SummarizerError(UpstreamError):
    """A summarizer failed; the memory is left as it was. (The LLM summarizer never raises it: it falls
    back to the extractive one. A summarizer of your own may.)"""


class Summarizer(Protocol):
    @property
    def name(self) -> str: ...

    def summarize(self, text: str, max_chars: int) -> str: ...


@dataclass(frozen=True)
class Fallback:
    """Why an LLM helper's reply was not used: what a fallback event says (never any text)."""

    reason: FailureReason
    model: str  # the endpoint's model name
    detail: str  # e.g. "HTTP 500", "IncompleteRead", "content is null"


@dataclass(frozen=True)
class Summary:
    """A summary and who wrote it: ``method`` is the summarizer's name, or the extractive one's when the
    LLM's reply was not used (``fallback`` says why)."""

    text: str
    method: str
    fallback: Fallback | None = None


@runtime_checkable
class ReportingSummarizer(Summarizer, Protocol):
    """A summarizer that can tell when it fell back (the LLM one)."""

    def summary(self, text: str, max_chars: int) -> Summary: ...


def summary_of(summarizer: Summarizer, text: str, max_chars: int) -> Summary:
    """``summarizer``'s summary of ``text`` with its method, and the fallback if it took one. Whatever a
    summarizer of one's own raises comes out as :class:`SummarizerError`: a pager pass that archives then
    leaves the memory uncompressed (a ``compress_error`` event) and goes on (it failed, and left its
    session due for ever). The built-in summarizers' own bugs are not hidden so."""
    if isinstance(summarizer, ReportingSummarizer):
        return summarizer.summary(text, max_chars)
    if isinstance(summarizer, ExtractiveSummarizer):
        return Summary(summarizer.summarize(text, max_chars), summarizer.name)
    try:
        summary = summarizer.summarize(text, max_chars)
    except SummarizerError:
        raise
    except Exception as exc:
        raise SummarizerError(f"summarizer {summarizer.name!r} failed: {exc!r}") from exc
    if not isinstance(summary, str):
        raise SummarizerError(f"summarizer {summarizer.name!r} returned a {type(summary).__name__}, not text")
    return Summary(summary, summarizer.name)


def numbers_in(text: str) -> set[str]:
    """The numbers written in ``text`` (digit runs, with their decimal or time separators)."""
    return set(_NUMBER_TOKEN.findall(text))


def drops_every_number(source: str, reply: str) -> bool:
    """``source`` has numbers and ``reply`` keeps none of them (an extractive summary keeps them all)."""
    wanted = numbers_in(source)
    return bool(wanted) and not (wanted & numbers_in(reply))


def fallback_event(
    kind: EventKind, fallback: Fallback, tenant: str, memory_id: str | None, at: datetime
) -> Event:
    """The event saying an LLM helper fell back to its extractive default, and why."""
    return Event(
        kind=kind,
        memory_id=memory_id,
        tenant=tenant,
        at=at,
        data={
            "reason": fallback.reason.value,
            "model": fallback.model,
            "detail": fallback.detail,
            "used": "extractive",
        },
    )


def entities(text: str, limit: int = 20) -> list[str]:
    """Capitalised spans and identifiers, as written, in order of first appearance (a cheap, offline NER
    stand-in). A span counts only where the entity graph's rules (:func:`clawvm.core.entities.entities`)
    see a name: a word capitalised because it starts a sentence ("The", "Most") is dropped from its span."""
    name_words = {w for name in named_entities(text) for w in name.split()}
    seen: dict[str, None] = {}
    for m in _ENTITY.finditer(text):
        words = m.group(0).split()
        while words and words[0].lower() not in name_words and not _IDENTIFIER.search(words[0]):
            words = words[1:]  # "The Acme" -> "Acme"; "Most" -> nothing
        span = " ".join(words)
        if len(span) > 2:
            seen.setdefault(span, None)
        if len(seen) >= limit:
            break
    return list(seen)


@dataclass(frozen=True)
class ExtractiveSummarizer:
    """Keeps the sentences that carry the most information, in their original order.

    Lines that look like code and sentences with digits are always kept verbatim (exact values survive),
    a sentence said again only once; the others are ranked by how many of the text's frequent content
    words they contain, and the best are added while the summary stays under ``max_chars``.
    """

    name: str = "extractive"

    def summarize(self, text: str, max_chars: int) -> str:
        units: list[str] = []
        said: set[str] = set()  # the sentences taken, as words: a sentence said again adds nothing
        for line in text.splitlines():
            if not line.strip():
                continue
            if _CODE_LINE.search(line):
                units.append(line)  # code as it is: a repeated line (a closing brace) is part of it
                continue
            for sentence in filter(None, _SENTENCE.split(line.strip())):
                words = one_line(sentence).lower()
                if words not in said:
                    said.add(words)
                    units.append(sentence)
        if sum(len(u) + 1 for u in units) <= max_chars:
            return "\n".join(units)
        freq = Counter(_content_words(text))
        must = {i for i, u in enumerate(units) if _NUMBER.search(u) or _CODE_LINE.search(u)}
        rank = sorted(
            (i for i in range(len(units)) if i not in must),
            key=lambda i: -sum(freq[w] for w in set(_content_words(units[i]))) / (1 + len(units[i]) / 80),
        )
        keep = set(must)
        size = sum(len(units[i]) + 1 for i in keep)
        for i in rank:
            if size + len(units[i]) + 1 > max_chars:
                continue
            keep.add(i)
            size += len(units[i]) + 1
        return "\n".join(units[i] for i in sorted(keep))


def _content_words(text: str) -> list[str]:
    """The words a sentence is ranked by: words of four letters or more, and the terms of its CJK runs
    (letters and pairs: they have no spaces to split words at)."""
    words = [w for w in _WORD.findall(text.lower()) if len(w) > 3 and not _CJK_RUN.match(w)]
    for run in _CJK_RUN.findall(text):
        words += cjk_terms(run)
    return words


@dataclass(frozen=True)
class LLMSummarizer(ChatEndpoint):
    """Summaries from any OpenAI-compatible ``/chat/completions`` endpoint (optional).

    Never raises and never returns a placeholder: when the endpoint gives no usable summary (see the
    module's table of reasons) the text is summarized by :class:`ExtractiveSummarizer` instead, and
    :meth:`summary` says why."""

    name: str = "llm"

    def summarize(self, text: str, max_chars: int) -> str:
        return self.summary(text, max_chars).text

    def summary(self, text: str, max_chars: int) -> Summary:
        prompt = (
            f"Summarize the following agent memory in at most {max_chars} characters. Keep every number, "
            "identifier, name and code fragment exactly as written. Reply with the summary only.\n\n" + text
        )
        try:
            reply = self.complete(prompt)
            if len(reply) > max_chars * 3 // 2:  # some overshoot is a model's way; a summary longer is not
                raise EndpointFailure(
                    FailureReason.TOO_LONG, f"{len(reply)} characters, asked for at most {max_chars}"
                )
            if drops_every_number(text, reply):
                found = len(numbers_in(text))
                raise EndpointFailure(FailureReason.NUMBERS_DROPPED, f"{found} numbers, none kept")
        except EndpointFailure as failure:
            extractive = ExtractiveSummarizer()
            return Summary(
                extractive.summarize(text, max_chars),
                extractive.name,
                Fallback(failure.reason, self.model, failure.detail),
            )
        return Summary(reply, self.name)


# ---- operations on stored memories (used by the harness and the pager) -----------------------------------
def is_compressible(memory: Memory) -> bool:
    return (
        memory.content_type != JSON
        and "compression" not in memory.metadata
        and "raw_of" not in memory.metadata
    )


def summarize_memory(summarizer: Summarizer, memory: Memory, ratio: float = 0.4) -> Summary:
    """The summary :func:`compress_memory` writes: ``ratio`` of the text's length, at least 80 characters."""
    return summary_of(summarizer, memory.content, max(80, int(len(memory.content) * ratio)))


def compress_memory(
    writer: Writer,
    memory: Memory,
    summarizer: Summarizer,
    now: datetime,
    ratio: float = 0.4,
    reason: str = "",
    summarized: Summary | None = None,
) -> Memory:
    """Replace ``memory``'s content by a summary; its raw text moves to an archived copy it points to.
    ``summarized``: :func:`summarize_memory`'s summary of this very content, made before (outside a lock
    that an LLM's wait should not hold); else it is made here.

    Returns the memory unchanged when there is nothing to gain (JSON payloads, already compressed, or a
    summary that is not shorter).
    """
    if not is_compressible(memory):
        return memory
    result = summarized if summarized is not None else summarize_memory(summarizer, memory, ratio)
    summary = result.text
    notes = (
        []
        if result.fallback is None
        else [fallback_event(EventKind.SUMMARIZER_FALLBACK, result.fallback, memory.tenant, memory.id, now)]
    )
    summary_tokens = count_tokens(summary)
    if (
        not summary.strip()
        or len(summary) >= len(memory.content)
        or summary_tokens >= count_tokens(memory.content)  # fewer characters, no fewer tokens: no gain
    ):
        if notes:
            writer.log(notes)
        return memory
    raw = derived(
        memory,
        {
            # an expired memory's original stays expired: archived, it answered status="archived" reads
            "status": Status.EXPIRED if memory.status is Status.EXPIRED else Status.ARCHIVED,
            "tier": Tier.ARCHIVE,
            "kind": memory.kind,
            "metadata": {"raw_of": memory.id},
        },
        exclude={"id", "links", "version", "value", "pinned", "usage", "metadata"},
    )
    info = {
        "raw_id": raw.id,
        "method": result.method,
        "entities": entities(memory.content),
        "raw_tokens": memory.token_count,
        "at": now.isoformat(),
    }
    compressed = revalidate(
        memory,
        {
            "content": summary,
            "token_count": summary_tokens,
            "version": memory.version + 1,
            "links": [*memory.links, Link(type=LinkType.DERIVED_FROM, target=raw.id)],
            "metadata": {**memory.metadata, "compression": info},
        },
    )
    event = Event(
        kind=EventKind.COMPRESS,
        memory_id=memory.id,
        tenant=memory.tenant,
        at=now,
        data={
            "raw_id": raw.id,
            "method": result.method,
            "tokens_before": memory.token_count,
            "tokens_after": compressed.token_count,
            "reason": reason,
        },
    )
    # one transaction: never a summary without its raw, nor either without the event
    return writer.write([raw, compressed], None, [event, *notes])[1]


def earlier_collapse(store: StoreReader, tenant: str, task_id: str, steps: Sequence[Memory]) -> Memory | None:
    """The summary an earlier collapse of ``steps`` recorded but could not archive them under (it failed
    between the two writes): an active summary of the task that ``summarizes`` every one of them. A
    collapse tried again archives them under it rather than record a second summary of the same steps."""
    wanted = {m.id for m in steps}
    f = Filters.of(tenant=tenant, task_id=task_id, kind="summary", status="active")
    for m in store.iter_all(f, newest_first=True):
        summarized = {link.target for link in m.links if link.type is LinkType.SUMMARIZES}
        if "collapsed" in m.metadata and wanted <= summarized:
            return m
    return None


def decompress_memory(
    store: StoreReader,
    writer: Writer,
    memory: Memory,
    now: datetime,
    requires: Sequence[Requirement] = (),
) -> Memory:
    """Bring back the raw text of a compressed memory (the archived raw copy is kept for history).
    ``requires``: the write's preconditions (a pinned memory's budget, which its raw text may not pass)."""
    if not memory.metadata.get("compression"):
        return memory
    restored, event = raw_text_back(store, memory, now)
    written = revalidate(restored, {"version": memory.version + 1})
    return writer.write([written], None, [event], requires=requires)[0]


def raw_text_back(store: StoreReader, memory: Memory, now: datetime) -> tuple[Memory, Event]:
    """Compressed ``memory`` with its raw text back, still at its version (the write that stores it
    numbers it), and the ``decompress`` event to write with it: what :func:`decompress_memory` writes,
    for a caller whose write changes more (a rollback's)."""
    info = memory.metadata["compression"]
    raw = store.get(info["raw_id"])
    if raw.metadata.get("raw_of") != memory.id:  # a pointer compress() did not write (an import's)
        raise ValidationError(
            "memory_id",
            f"points at {raw.id} as its raw text, which is not a raw copy of it",
            "nothing to decompress: update its content instead",
        )
    metadata = {k: v for k, v in memory.metadata.items() if k != "compression"}
    metadata["decompressed_from"] = info
    restored = revalidate(
        memory,
        {
            "content": raw.content,
            "token_count": raw.token_count,
            "metadata": metadata,
            "links": [link for link in memory.links if link.target != raw.id],
        },
    )
    event = Event(
        kind=EventKind.DECOMPRESS, memory_id=memory.id, tenant=memory.tenant, at=now, data={"raw_id": raw.id}
    )
    return restored, event


def raw_copies(store: StoreReader, memory: Memory, page: int = 500) -> list[Memory]:
    """The stored raw copies of ``memory``'s earlier texts: the one it points at now, the one it was last
    decompressed from, and those its compress events name (a memory compressed, decompressed and compressed
    again has several). Only copies that point back at it count: a pointer is never taken on its word."""
    named = {
        info["raw_id"]
        for key in ("compression", "decompressed_from")
        if isinstance(info := memory.metadata.get(key), dict) and isinstance(info.get("raw_id"), str)
    }
    after: int | None = 0
    while after is not None and (batch := store.read_events(after, page, memory.id)):
        named.update(
            str(e.data["raw_id"]) for e in batch if e.kind == EventKind.COMPRESS and "raw_id" in e.data
        )
        after = batch[-1].seq  # a read event always has its number
    found = store.get_many(sorted(named))
    return [raw for raw in found.values() if raw.metadata.get("raw_of") == memory.id]


def referenced_raw(store: StoreReader, memory: Memory) -> list[str]:
    """Ids of compressed memories that still point at ``memory`` as their raw content."""
    owner = memory.metadata.get("raw_of")
    if not owner:
        return []
    found = store.get_many([owner]).get(owner)
    if found is not None and found.metadata.get("compression", {}).get("raw_id") == memory.id:
        return [owner]
    return []
