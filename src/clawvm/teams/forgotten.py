"""What a forgotten memory leaves in the team memories made from it, taken out so that ``forget`` keeps its
promise ("delete a memory for good"): a conflict note quotes each side's text, and a pitfall keeps each
error it was made from as a sample (and quotes the first in its extractive text). Both stayed readable
after the side or the error was forgotten, the pitfall in every guidance prompt.

The note and the pitfall's head are rewritten through the harness's update (the application's own write,
with its event). The pitfall's earlier revisions, obsolete, are frozen to every caller's change (their
chain has one head), so the write path takes their rewrite directly, with an update event each: what
they held stays but for the forgotten text, which a ``history`` read showed after the forget.
"""

from __future__ import annotations

from typing import Any

from clawvm.core.model import VISIBLE_STATUSES, Filters, Kind, Memory
from clawvm.store import Event
from clawvm.store.kinds import EventKind
from clawvm.teams.merge import CONFLICT_KINDS, ExtractiveSynthesizer
from clawvm.teams.shared import APPLICATION, CONFLICT_FIELD, CONFLICT_TAG, TeamHost, history, latest_if_kept
from clawvm.vm.context import short_id

#: What a forgotten memory's text is replaced with.
FORGOTTEN = "(forgotten)"


def unquote_forgotten(h: TeamHost, memory: Memory) -> list[Memory]:
    """Take ``memory``'s text (as it was before it was forgotten) out of the conflict notes naming it and
    of the pitfall made from it; returns the memories rewritten."""
    # only decisions and knowledge are sides of a conflict: the forget of any other memory reads no note
    notes = _notes_naming(h, memory) if memory.kind in CONFLICT_KINDS else []
    rewritten = [_unquoted_note(h, note, memory) for note in notes]
    pitfall = _pitfall_of(h, memory)
    if pitfall is not None:
        rewritten.append(_without_sample(h, pitfall, memory))
        rewritten += _earlier_revisions_without(h, pitfall, memory)
    return [m for m in rewritten if m is not None]


def _notes_naming(h: TeamHost, memory: Memory) -> list[Memory]:
    notes = Filters.of(tenant=h.tenant, kind=Kind.NOTE, tags=[CONFLICT_TAG], status=list(VISIBLE_STATUSES))
    return [
        note
        for note in h.store.iter_all(notes)
        if memory.id in (note.metadata.get(CONFLICT_FIELD) or {}).get("ids", [])
    ]


def _unquoted_note(h: TeamHost, note: Memory, memory: Memory) -> Memory | None:
    """``note`` with ``memory``'s excerpt replaced: the note reads "[short id] excerpt <> [short id]
    excerpt", one side for each of its conflict's ids, in order."""
    ids = list(note.metadata[CONFLICT_FIELD]["ids"])
    mark = f"[{short_id(memory.id)}] "
    start = note.content.find(mark)
    if start < 0:
        return None
    start += len(mark)
    later = [f" <> [{short_id(i)}] " for i in ids[ids.index(memory.id) + 1 :]]
    ends = [at for at in (note.content.find(m, start) for m in later) if at >= 0]
    end = min(ends, default=len(note.content))
    if note.content[start:end] == FORGOTTEN:
        return None
    text = note.content[:start] + FORGOTTEN + note.content[end:]
    # the review (who closed it, and why) is kept as it is: only the text changes
    return h.update(note.id, as_agent=APPLICATION, content=text, metadata=note.metadata)


def _pitfall_of(h: TeamHost, error: Memory) -> Memory | None:
    """The head of the pitfall ``error`` was folded into (its ``knowledge_id``), if any is kept."""
    made_into = error.metadata.get("knowledge_id") if error.kind is Kind.ERROR else None
    return latest_if_kept(h, made_into) if isinstance(made_into, str) else None


def _without_sample(h: TeamHost, pitfall: Memory, error: Memory) -> Memory | None:
    """``pitfall`` without ``error``'s text among its samples, nor in its text, unless another error of
    the team still stored says the same (samples are kept once each)."""
    unsaid = _unsaid(h, pitfall, error)
    if unsaid is None:
        return None
    content, metadata = unsaid
    return h.update(pitfall.id, as_agent=APPLICATION, content=content, metadata=metadata)


def _earlier_revisions_without(h: TeamHost, head: Memory, error: Memory) -> list[Memory]:
    """The obsolete revisions of ``head``'s chain that quote ``error``, rewritten without it (as
    :func:`_without_sample` rewrites the head), through the write path with an update event each."""
    earlier = [m for m in history(h, head.id) if m.id != head.id]
    changed = [(m, unsaid) for m in earlier if (unsaid := _unsaid(h, m, error)) is not None]
    if not changed:
        return []
    after = [
        m.model_copy(update={"content": content, "metadata": metadata, "version": m.version + 1})
        for m, (content, metadata) in changed
    ]
    at = h.now()
    events = [
        Event(
            kind=EventKind.UPDATE,
            memory_id=m.id,
            data={"fields": ["content", "metadata"], "version": m.version},
            tenant=m.tenant,
            at=at,
        )
        for m in after
    ]
    return h.writer.write(after, None, events)


def _unsaid(h: TeamHost, pitfall: Memory, error: Memory) -> tuple[str, dict[str, Any]] | None:
    """(content, metadata) of ``pitfall`` without ``error``'s text, or None when it has none to take out
    (or another stored error of the team says the same). An extractive pitfall's text is made again from
    the samples left (it quotes the first); an LLM's is left as written, but for a verbatim quote."""
    said = " ".join(error.content.split())
    samples = list(pitfall.metadata.get("samples", []))
    if (said not in samples and said not in pitfall.content) or _still_said(h, pitfall, error, said):
        return None
    kept = [s for s in samples if s != said]
    synthesized = pitfall.metadata.get("synthesized") or {}
    if synthesized.get("method") == ExtractiveSynthesizer.name:
        occurrences = int(synthesized.get("occurrences", len(samples)))
        content = ExtractiveSynthesizer().synthesize(kept or [FORGOTTEN], occurrences)
    else:
        content = pitfall.content.replace(said, FORGOTTEN)
    return content, {**pitfall.metadata, "samples": kept}


def _still_said(h: TeamHost, pitfall: Memory, error: Memory, said: str) -> bool:
    """Whether an error of ``pitfall``'s team other than ``error``, still stored, has the text ``said``."""
    errors = Filters.of(
        tenant=h.tenant, kind=Kind.ERROR, team_id=pitfall.team_id, status=list(VISIBLE_STATUSES)
    )
    return any(m.id != error.id and " ".join(m.content.split()) == said for m in h.store.iter_all(errors))
