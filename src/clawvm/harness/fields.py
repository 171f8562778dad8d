"""What a caller may set on a memory, checked by the facade before a change reaches the write path: the
marks only the harness sets (compression pointers, the review, the redaction mark), the review that new
text drops, a pin's tier and status, and the ids a caller must name."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from clawvm.core.errors import ValidationError
from clawvm.core.model import Memory, Status, Tier
from clawvm.store.crypto import REDACTION_FIELD
from clawvm.teams import shared as teams

#: Metadata that compress() keeps: the compressed memory's pointer to its raw copy, and the raw copy's back.
COMPRESSION_METADATA = ("compression", "raw_of")
#: Metadata only the harness sets, and what sets it: a caller's record or update may not.
HARNESS_METADATA = {
    **dict.fromkeys(COMPRESSION_METADATA, "compress()"),
    teams.REVIEW_FIELD: "approve() or reject()",
}
#: Metadata only the harness's own writes (as the application) set: a conflict's sides, flagged by
#: merge_team() through record(as_agent=APPLICATION), so record() refuses it in teams.check_write, which
#: knows the acting agent (refuse_harness_metadata does not).
APPLICATION_METADATA = {teams.CONFLICT_FIELD: "merge_team()"}


def keeping_harness_metadata(current: Memory, changes: dict[str, Any], *, reviewing: bool) -> dict[str, Any]:
    """``changes`` with new ``metadata`` keeping the marks of ``current`` that only the harness sets: the
    compression pointers (compress() and decompress(); dropped, they were the way back to the original
    text), the review (approve() and reject(), or the application acting as itself: ``reviewing``;
    forged by an agent, its low-confidence memory left the review queue) and a conflict's sides (the
    application's too: forged, a lead's resolution rejected another team's memory). Setting one to another
    value is a ValidationError."""
    given = changes.get("metadata")
    if not isinstance(given, Mapping):
        return changes  # no new metadata (or none valid: the validation that follows says so)
    guarded = {k: by for k, by in HARNESS_METADATA.items() if not (reviewing and k == teams.REVIEW_FIELD)}
    if not reviewing:
        guarded.update(APPLICATION_METADATA)
    for key, by in guarded.items():
        if key in given and given[key] != current.metadata.get(key):
            raise ValidationError(f"metadata.{key}", f"is set by {by}", "leave it out: the harness keeps it")
    kept = {k: current.metadata[k] for k in guarded if k in current.metadata}
    return {**changes, "metadata": {**given, **kept}} if kept else changes


def review_dropped(current: Memory, changes: dict[str, Any], *, reviewing: bool) -> dict[str, Any]:
    """``changes``, which give ``current`` new text, without its review: an approval was of the old text
    (kept, the new text of a low-confidence memory skipped the review queue with full trust), unless the
    application, reviewing, sets the review in the same update."""
    metadata = changes.get("metadata", current.metadata)
    given = changes.get("metadata")
    if teams.REVIEW_FIELD not in metadata or (
        reviewing and isinstance(given, Mapping) and teams.REVIEW_FIELD in given
    ):
        return changes
    return {**changes, "metadata": {k: v for k, v in metadata.items() if k != teams.REVIEW_FIELD}}


def refuse_expiring_by_hand(changes: Mapping[str, Any]) -> None:
    """A caller's ``status="expired"`` is refused: expired is the end of a TTL, which no change undoes (it
    would bring back text the TTL promised to forget), so one mistaken update hid a memory for good. A
    caller who means it sets ``expires_at``; one who wants it out of the way archives it (reversible)."""
    status = changes.get("status")
    if isinstance(status, str) and status.strip().lower() == Status.EXPIRED.value:  # (a Status is a str)
        raise ValidationError(
            "status",
            "cannot be set to expired: only a TTL ends that way, and an expired memory never comes back",
            "set expires_at to expire it for good, or status='archived' to put it away reversibly",
        )


#: how far after the harness's clock a new memory's ``created_at`` may be (another machine's clock)
CLOCK_SKEW = timedelta(days=1)
#: what to do about a ``created_at`` after the clock
AHEAD_OF_CLOCK_FIX = "pass when it happened, or leave it out for now (clocks a day apart are taken)"


def ahead_of_clock(created_at: datetime, now: datetime) -> str | None:
    """What is wrong with a new memory's ``created_at`` after ``now`` by more than :data:`CLOCK_SKEW`, else
    None: taken, 2999-01-01 (or 2062 typed for 2026) stayed the newest memory, at full recency, for good."""
    if created_at > now + CLOCK_SKEW:
        return f"is {created_at:%Y-%m-%d %H:%M} UTC, after the harness's clock ({now:%Y-%m-%d})"
    return None


def named_id(field: str, value: object, fix: str) -> str:
    """``value``, a caller's id that must name something: a non-blank string, else a ValidationError."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(field, f"is {value!r}", fix)
    return value


def refuse_harness_metadata(metadata: Mapping[str, Any]) -> None:
    """A new memory's metadata may not carry the marks the harness sets: a forged compression pointer let
    decompress() replace the memory's text with another memory's."""
    if REDACTION_FIELD in metadata:
        raise ValidationError(
            f"metadata.{REDACTION_FIELD}", "is set by the write path", "leave it out: redaction marks it"
        )
    for key, by in HARNESS_METADATA.items():
        if key in metadata:
            raise ValidationError(f"metadata.{key}", f"is set by {by}", f"leave it out: {by} sets it")


def refuse_unpinnable(fields: Mapping[str, Any], fix: str) -> None:
    """A pinned memory lives in the working tier, active (what pin() requires): another tier or status for
    one is a contradiction, refused (with ``fix``) rather than silently resolved."""
    for name, pinned_is in (("tier", Tier.WORKING), ("status", Status.ACTIVE)):
        given = fields.get(name)
        if given is not None and given != pinned_is:
            raise ValidationError(
                name, f"is {given!r} on a pinned memory", f"{fix}: a pinned memory is {pinned_is}"
            )


def leaves_the_prompt(changes: Mapping[str, Any]) -> bool:
    """Whether ``changes`` move a memory out of the working tier or out of ``active``, where a pinned one
    lives."""
    tier, status = changes.get("tier"), changes.get("status")
    return (tier is not None and tier != Tier.WORKING) or (status is not None and status != Status.ACTIVE)
