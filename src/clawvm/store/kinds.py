"""The kinds of event the log holds, and the ``data`` each carries (typed payloads).

Every event written by ClawVM has one of the :class:`EventKind` kinds; :data:`PAYLOADS` gives the
:class:`typing.TypedDict` of its ``data`` (the keys a reader may rely on; optional keys are marked
``NotRequired``). :class:`clawvm.store.Event` turns a known kind's string into its member when it is built
or read back, so ``event.kind == EventKind.ADD`` and ``event.kind == "add"`` both hold; a kind this version
does not know (a newer writer's) stays a plain string rather than failing the read.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NotRequired, TypedDict


class EventKind(StrEnum):
    # a memory's life
    ADD = "add"
    UPDATE = "update"
    FORGET = "forget"
    IMPORT = "import"
    REVEAL = "reveal"
    # tiers and values (the pager)
    PROMOTE = "promote"
    DEMOTE = "demote"
    ARCHIVE = "archive"
    PIN = "pin"
    UNPIN = "unpin"
    FEEDBACK = "feedback"
    REFRESH = "refresh"
    RETENTION = "retention"
    PRELOAD = "preload"
    # compression, tasks, checkpoints
    COMPRESS = "compress"
    DECOMPRESS = "decompress"
    COMPRESS_ERROR = "compress_error"
    SUMMARIZER_FALLBACK = "summarizer_fallback"
    COLLAPSE = "collapse"
    CHECKPOINT = "checkpoint"
    ROLLBACK = "rollback"
    # reading
    RETRIEVE = "retrieve"
    CONTEXT = "context"
    OUTPUT = "output"
    PREFETCH_ERROR = "prefetch_error"
    PAGER_ERROR = "pager_error"  # a background pager pass failed
    # teams
    GRANT = "grant"
    REVISE = "revise"
    MERGE = "merge"
    SYNTHESIZE = "synthesize"
    SYNTHESIZER_FALLBACK = "synthesizer_fallback"
    GUIDANCE = "guidance"
    REVIEW_APPROVED = "review.approved"
    REVIEW_REJECTED = "review.rejected"
    REVIEW_RESOLVED = "review.resolved"
    # agents
    TOOL_INTERRUPTED = "tool_interrupted"
    # people and the learning rule
    MANUAL = "manual"
    SCORING_WEIGHTS = "scoring_weights"
    # operations
    API_KEY_CREATED = "api_key_created"  # an audit line: authentication never reads it
    API_KEY_REVOKED = "api_key_revoked"
    KEY_CREATED = "key_created"  # how stores before the credentials table held keys (read once, to migrate)
    KEY_REVOKED = "key_revoked"
    ROTATE_DATA_KEY = "rotate_data_key"
    EVENTS_PRUNED = "events_pruned"  # retention deleted a tenant's oldest events (how many)


#: The kinds of event that a memory's life starts with: each is logged by the write that creates the
#: memory it names (a record, an import, a checkpoint's snapshot, a revision, a merge or a synthesis).
CREATING_KINDS = frozenset(
    {
        EventKind.ADD,
        EventKind.IMPORT,
        EventKind.CHECKPOINT,
        EventKind.REVISE,
        EventKind.MERGE,
        EventKind.SYNTHESIZE,
    }
)


def kind_of(text: str) -> EventKind | str:
    """The member for a known kind; the string itself for one this version does not know."""
    try:
        return EventKind(text)
    except ValueError:
        return text


class AddData(TypedDict):
    kind: str
    tier: str
    pinned: NotRequired[bool]  # recorded pinned (a pin made by record logs no pin event); absent: not


class UpdateData(TypedDict):
    fields: list[str]
    version: int


class ForgetData(TypedDict):
    kind: str


#: promote, demote, archive (a functional TypedDict: ``from`` is a Python keyword)
MoveData = TypedDict(
    "MoveData", {"from": str, "to": str, "value_before": float, "value_after": float, "reason": str}
)


class PinData(TypedDict):
    tier: str
    value: float


class FeedbackData(TypedDict):
    pass


class RefreshData(TypedDict):
    value_before: float
    value_after: float


class CompressData(TypedDict):
    raw_id: str
    method: str
    tokens_before: int
    tokens_after: int
    reason: str


class DecompressData(TypedDict):
    raw_id: str


class ErrorData(TypedDict):
    error: str


class FallbackData(TypedDict):
    """An LLM helper did not use its endpoint's reply and used its extractive default instead."""

    reason: str  # clawvm.core.openai_http.FailureReason
    model: str  # the endpoint's model name
    detail: str  # a status code or an exception class, never any text
    used: str  # what wrote the text instead: "extractive"


class CollapseData(TypedDict):
    task_id: str
    steps: list[str]


class CheckpointData(TypedDict):
    name: str
    session_id: str
    memories: int


class RollbackData(TypedDict):
    name: str
    restored: list[str]
    obsoleted: list[str]
    tiers: NotRequired[dict[str, str]]  # restored id -> its tier now (rollbacks logged before it lack it)
    unpinned: NotRequired[list[str]]  # pinned at the checkpoint, restored unpinned (no room): when any


class RetrieveData(TypedDict):
    query: str
    k: int
    ms: float
    hits: list[dict[str, Any]]


class ContextData(TypedDict):
    query: str
    budget: int
    tokens: int
    scope: dict[str, Any]
    ms: float
    manifest: list[dict[str, Any]]
    text: NotRequired[str]  # the exact prompt (builds recorded before it was kept have none)


class OutputData(TypedDict):
    context_seq: int
    cited: list[str]
    uncited: list[str]
    text: str


class PreloadData(TypedDict):
    session_id: str
    ids: list[str]


class GrantData(TypedDict):
    team_id: str
    agent_id: str
    read: bool
    write: bool


class ReviseData(TypedDict):
    revises: str
    number: int
    agent_id: NotRequired[str | None]  # the reviser (written since revisions name their agent)


class MergeData(TypedDict):
    sources: list[str]


class SynthesizeData(TypedDict):
    errors: list[str]
    method: str


class ReviewData(TypedDict):
    status: str
    by: str | None


class ManualData(TypedDict):
    action: str
    by: str
    before: dict[str, Any]
    after: dict[str, Any]


class WeightsData(TypedDict):
    weights: dict[str, Any]
    delta: dict[str, float]
    action: str


class EventsPrunedData(TypedDict):
    deleted: int  # how many of the tenant's events retention deleted (this note is logged after them)


class NoData(TypedDict):
    """Kinds whose ``data`` promises nothing beyond the event's own fields."""


#: The payload type of each kind: the keys of ``data`` a reader may rely on.
PAYLOADS: dict[EventKind, type] = {
    EventKind.ADD: AddData,
    EventKind.UPDATE: UpdateData,
    EventKind.FORGET: ForgetData,
    EventKind.IMPORT: NoData,
    EventKind.REVEAL: NoData,
    EventKind.PROMOTE: MoveData,
    EventKind.DEMOTE: MoveData,
    EventKind.ARCHIVE: MoveData,
    EventKind.PIN: PinData,
    EventKind.UNPIN: PinData,
    EventKind.FEEDBACK: FeedbackData,
    EventKind.REFRESH: RefreshData,
    EventKind.RETENTION: NoData,
    EventKind.PRELOAD: PreloadData,
    EventKind.COMPRESS: CompressData,
    EventKind.DECOMPRESS: DecompressData,
    EventKind.COMPRESS_ERROR: ErrorData,
    EventKind.SUMMARIZER_FALLBACK: FallbackData,
    EventKind.COLLAPSE: CollapseData,
    EventKind.CHECKPOINT: CheckpointData,
    EventKind.ROLLBACK: RollbackData,
    EventKind.RETRIEVE: RetrieveData,
    EventKind.CONTEXT: ContextData,
    EventKind.OUTPUT: OutputData,
    EventKind.PREFETCH_ERROR: ErrorData,
    EventKind.PAGER_ERROR: ErrorData,
    EventKind.GRANT: GrantData,
    EventKind.REVISE: ReviseData,
    EventKind.MERGE: MergeData,
    EventKind.SYNTHESIZE: SynthesizeData,
    EventKind.SYNTHESIZER_FALLBACK: FallbackData,
    EventKind.GUIDANCE: NoData,
    EventKind.REVIEW_APPROVED: ReviewData,
    EventKind.REVIEW_REJECTED: ReviewData,
    EventKind.REVIEW_RESOLVED: ReviewData,
    EventKind.TOOL_INTERRUPTED: NoData,
    EventKind.MANUAL: ManualData,
    EventKind.SCORING_WEIGHTS: WeightsData,
    EventKind.API_KEY_CREATED: NoData,
    EventKind.API_KEY_REVOKED: NoData,
    EventKind.KEY_CREATED: NoData,
    EventKind.KEY_REVOKED: NoData,
    EventKind.ROTATE_DATA_KEY: NoData,
    EventKind.EVENTS_PRUNED: EventsPrunedData,
}


def missing_keys(kind: EventKind | str, data: dict[str, Any]) -> list[str]:
    """The required keys of ``kind``'s payload that ``data`` lacks (empty for an unknown kind)."""
    if not isinstance(kind, EventKind):
        return []
    return sorted(k for k in _required_keys(PAYLOADS[kind]) if k not in data)


def _required_keys(payload: Any) -> list[str]:
    """The keys of a payload not marked ``NotRequired``. Its ``__required_keys__`` cannot say: under
    ``from __future__ import annotations`` the marks are text, which Python 3.11's TypedDict does not
    read (every key counted as required)."""
    hints: dict[str, Any] = getattr(payload, "__annotations__", {})
    marked = ("NotRequired[", "typing.NotRequired[")  # as text (a forward reference), or evaluated
    return [
        k for k, hint in hints.items() if not getattr(hint, "__forward_arg__", str(hint)).startswith(marked)
    ]
