"""The learning rule: manual actions (pin, unpin, set value, annotate, archive) and how they teach the scorer.

Every action is one ``manual`` event (action, by, before, after, and the target it taught). Pin, archive
and set value say what a memory *should* be worth, and :func:`learn` moves the value formula's weights
(:mod:`clawvm.vm.scoring`) toward it; each such step is a ``scoring_weights`` event holding the full new
weights. The newest weights also live in one INTERNAL memory per tenant (:func:`stored_weights`), written
with that event, so that the harness loads them when it opens (an observer never changes scoring, and
event retention never forgets them). Unpin and annotate teach nothing: an unpin says "not always", not
"worth less", and a note is not a value.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal, Protocol

from clawvm.core.errors import ConflictError, StateConflictError, ValidationError
from clawvm.core.model import Kind, Memory, Status, Tier, build_memory, refuse_internal, within
from clawvm.store import Event
from clawvm.store.base import StoreReader
from clawvm.store.eventlog import WEIGHTS_KIND
from clawvm.store.kinds import EventKind
from clawvm.teams.shared import APPLICATION
from clawvm.vm.scoring import ScoringConfig, content_signals
from clawvm.vm.scoring import explain as explain_value
from clawvm.vm.tiers import Pager
from clawvm.write.commit import Recorder


class LearningHost(Recorder, Protocol):
    """Manual actions act through the harness (pin, unpin, update: the same checks as any caller's) and
    teach its pager's scorer."""

    @property
    def pager(self) -> Pager: ...

    def get(self, memory_id: str) -> Memory: ...

    def pin(self, memory_id: str) -> Memory: ...

    def unpin(self, memory_id: str) -> Memory: ...

    def decompress(self, memory_id: str) -> Memory: ...


LEARNING_RATE = 0.1
#: the longest note a manual action takes (an annotation, or the note logged with any action), in characters
NOTE_MAX_CHARS = 2000
# The most one action moves any one weight (a kind's base weight included): one person's click on one
# memory must not re-value every memory of its kind. A step of 0.05 on base:<kind> moves each memory of
# that kind by at most 0.05 (the base is multiplied by the recency factor, at most 1).
MAX_WEIGHT_STEP = 0.05
# Weights whose feature can be negative (net failures, down-votes): raising or lowering them moves some
# memories' values up and others' down, so a one-directional action (pin, archive) leaves them alone.
_SIGNED_WEIGHTS = frozenset({"success_weight", "feedback_weight"})
WEIGHTS_TAG = "clawvm:scoring-weights"
_WEIGHTS_NAMESPACE = uuid.UUID("8d1f3a9e-2b6c-4f0e-9c7d-5e4a3b2c1d0f")
TARGETS = {"pin": 1.0, "archive": 0.0}  # set_value's target is the value asked for
# a pin only ever says "worth more", an archive "worth less": their steps go one way (see learn)
DIRECTIONS: dict[str, Literal["up", "down"]] = {"pin": "up", "archive": "down"}
_UNIT_WEIGHTS = (
    "cost_weight",
    "access_weight",
    "inject_weight",
    "cite_weight",
    "success_weight",
    "feedback_weight",
)
_SCALAR_WEIGHTS = (
    "signal_error",
    "signal_conclusion",
    "signal_numbers",
    "signal_code",
    "signal_entities",
    "cost_weight",
    "access_weight",
    "inject_weight",
    "cite_weight",
    "success_weight",
    "feedback_weight",
)


def features(memory: Memory, now: datetime, cfg: ScoringConfig) -> dict[str, float]:
    """The partial derivative of the (unclamped, unpinned) value w.r.t. each learnable weight.

    The value formula (:mod:`clawvm.vm.scoring`) is linear in every weight but ``recency_floor`` and the
    half-lives: ``base:<kind>``, the signal weights and ``cost_weight`` multiply the recency factor
    ``R = floor + (1 - floor) * recency``; the usage weights multiply their saturated counters.
    """
    # with every usage weight (and cost_weight) at 1, each explained part is its own input
    unit = replace(cfg, **dict.fromkeys(_UNIT_WEIGHTS, 1.0))  # type: ignore[arg-type]
    b = explain_value(memory.model_copy(update={"pinned": False}), now, unit)
    r = cfg.recency_floor + (1 - cfg.recency_floor) * b.recency  # the half-lives are not unit-ised
    f: dict[str, float] = {f"base:{memory.kind.value}": r}
    for name in content_signals(memory.content, cfg):
        f[f"signal_{name}"] = r
    f["cost_weight"] = b.cost * r
    f.update(
        access_weight=b.access,
        inject_weight=b.injected,
        cite_weight=b.cited,
        success_weight=b.success,
        feedback_weight=b.feedback,
    )
    return {k: v for k, v in f.items() if v != 0.0}


def raw_value(memory: Memory, now: datetime, cfg: ScoringConfig) -> float:
    """The value before clamping to [0, 1] and ignoring a pin: the quantity the learning rule fits."""
    b = explain_value(memory.model_copy(update={"pinned": False}), now, cfg)
    r = cfg.recency_floor + (1 - cfg.recency_floor) * b.recency
    prior = b.base + sum(b.signals.values()) + b.cost
    return prior * r + b.access + b.injected + b.cited + b.success + b.feedback


def check_rate(rate: Any) -> None:
    """:class:`ValidationError` unless ``rate`` is a learning rate in (0, 1]."""
    within("rate", rate, 0.0, 1.0, "pass a learning rate in (0, 1]", above_low=True)


def learn(
    cfg: ScoringConfig,
    memory: Memory,
    now: datetime,
    target: float,
    rate: float = LEARNING_RATE,
    *,
    direction: Literal["up", "down"] | None = None,
) -> tuple[ScoringConfig, dict[str, float]]:
    """The learning rule: one bounded least-mean-squares step on the value formula.

    A manual action says what a memory *should* be worth: ``target`` = 1.0 for a pin, 0.0 for an
    archive, the value asked for by set_value (unpin and annotate teach nothing). With ``f`` the
    memory's :func:`features` and ``v`` its :func:`raw_value`, every learnable weight moves by

        w_k += rate * (target - v) * f_k / max(1, sum_j f_j ** 2)

    bounded to ``±MAX_WEIGHT_STEP`` and the weight clipped to [0, 1]. When the features are not small
    (``sum f_j ** 2 >= 1``, a recent memory) and no bound is hit, this memory's value moves exactly
    ``rate`` of the way to the target (``v' = v + rate * (target - v)``); a memory with small features
    (an old one: its kind's base counts only through the recency factor) teaches in proportion to them
    instead of being divided by them, so pinning one ancient memory cannot re-value its whole kind.
    Every memory moves in proportion to how much it shares the features (same kind, same content
    signals, similar usage).

    ``direction`` makes the step one-way, for an action that only ever says "worth more" (``"up"``,
    a pin) or "worth less" (``"down"``, an archive): only the weights whose features are never negative
    move, and only that way, so no memory's value moves the other way. Returns the new config and the
    change of each weight.
    """
    check_rate(rate)
    within("target", target, 0.0, 1.0, "pass the value the memory should have, 0 to 1")
    f = features(memory, now, cfg)
    norm = sum(x * x for x in f.values())
    err = target - raw_value(memory, now, cfg)
    if norm == 0.0 or abs(err) < 1e-12:
        return cfg, {}
    base = dict(cfg.base)
    scalars = {name: float(getattr(cfg, name)) for name in _SCALAR_WEIGHTS}
    delta: dict[str, float] = {}
    for name, x in f.items():
        step = max(-MAX_WEIGHT_STEP, min(MAX_WEIGHT_STEP, rate * err * x / max(1.0, norm)))
        if direction is not None and (
            name in _SIGNED_WEIGHTS or (step > 0) != (direction == "up") or step == 0.0
        ):
            continue
        if name.startswith("base:"):
            kind = name[5:]
            old = base.get(kind, 0.4)
            base[kind] = _clip(old + step)
            delta[name] = base[kind] - old
        else:
            old = scalars[name]
            scalars[name] = _clip(old + step)
            delta[name] = scalars[name] - old
    new: ScoringConfig = replace(cfg, base=base, **scalars)  # type: ignore[arg-type]
    return new, {k: round(v, 6) for k, v in delta.items() if v}


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def weights_of(cfg: ScoringConfig) -> dict[str, Any]:
    return {"base": dict(cfg.base), **{name: getattr(cfg, name) for name in _SCALAR_WEIGHTS}}


def with_weights(cfg: ScoringConfig, weights: Mapping[str, Any]) -> ScoringConfig:
    """``cfg`` with the learned ``weights`` (as :func:`weights_of` gives them; unknown keys ignored, and
    numbers brought into 0..1: they come from the event log, and a harness must open whatever it holds)."""
    scalars = {n: _clip(float(weights[n])) for n in _SCALAR_WEIGHTS if _finite(weights.get(n))}
    kinds = {k.value for k in Kind}
    learned = weights.get("base")
    learned = dict(learned) if isinstance(learned, Mapping) else {}
    base = {**cfg.base, **{k: _clip(float(v)) for k, v in learned.items() if k in kinds and _finite(v)}}
    scoring: ScoringConfig = replace(cfg, base=base, **scalars)  # type: ignore[arg-type]
    return scoring


def restore_weights(harness: LearningHost, event: Event | None) -> None:
    """Give the harness's scorer the weights of a ``scoring_weights`` event (the latest learned ones)."""
    if event is None:
        return
    scoring = with_weights(harness.pager.config.scoring, event.data.get("weights", {}))
    harness.pager.config = replace(harness.pager.config, scoring=scoring)


def weights_id(tenant: str) -> str:
    """The id of the memory that holds ``tenant``'s newest learned weights."""
    return str(uuid.uuid5(_WEIGHTS_NAMESPACE, f"weights\x00{tenant}"))


def stored_weights(store: StoreReader, tenant: str) -> dict[str, Any] | None:
    """The newest weights learned for ``tenant`` (None when nothing was learned yet): one read by id."""
    held = store.get_many([weights_id(tenant)]).get(weights_id(tenant))
    return None if held is None else dict(held.metadata.get("weights", {}))


def _weights_memory(tenant: str, weights: dict[str, Any], now: datetime, current: Memory | None) -> Memory:
    return build_memory(
        {
            "id": weights_id(tenant),
            "content": "learned scoring weights",
            "kind": Kind.AGENT_STATE,
            "status": Status.INTERNAL,
            "tier": Tier.ARCHIVE,
            "tenant": tenant,
            "tags": [WEIGHTS_TAG],
            "metadata": {"weights": weights},
            "created_at": now if current is None else current.created_at,
            "version": 1 if current is None else current.version + 1,
        }
    )


# ---- manual actions -------------------------------------------------------------------------------------
ACTIONS = ("pin", "unpin", "set_value", "annotate", "archive", "set_tier")


def intervene(
    harness: LearningHost,
    action: str,
    memory_id: str,
    *,
    value: float | None = None,
    note: str | None = None,
    tier: str | None = None,
    by: str = "user",
    learn_rate: float = LEARNING_RATE,
) -> dict[str, Any]:
    """One manual action on one memory, logged as a ``manual`` event; pin, archive and set_value also
    teach the scorer (:func:`learn`, logged as a ``scoring_weights`` event).

    ``set_value`` cannot write the value directly (the scorer recomputes it on every change), so it
    learns first and then sets the memory's feedback votes to the count whose value comes nearest the
    target; the event records the value reached. ``archive`` moves the memory to the archive tier
    (unpinning it). ``annotate`` appends ``{at, by, text}`` to ``metadata["annotations"]``. ``set_tier``
    moves the memory to ``tier`` (out of the archive: un-archive, decompressing it first); it teaches
    nothing (a tier is where the pager keeps a memory, not what it is worth).
    """
    if action not in ACTIONS:
        raise ValidationError("action", f"is {action!r}", f"use one of {', '.join(ACTIONS)}")
    check_rate(learn_rate)  # before any write: a pin took place, then the bad rate was refused
    if not isinstance(by, str) or not by.strip():  # (harness.fields.named_id is a layer above)
        raise ValidationError("by", f"is {by!r}", "name who acts (e.g. 'user' or a person's name)")
    memory = harness.get(memory_id)
    refuse_internal(memory)  # a grant or the learned weights: moved to the archive by the dashboard's tier
    if action != "annotate" and memory.status is not Status.ACTIVE:  # history: noted, not changed
        raise StateConflictError(
            "memory_id",
            f"is {memory.status.value} (only an active memory is pinned, valued or moved)",
            "annotate it, or forget it",
        )
    now = harness.now()
    target = TARGETS.get(action)
    if action == "set_value":
        target = within("value", value, 0.0, 1.0, "pass a number between 0 and 1")
    if action == "set_tier" and tier not in {t.value for t in Tier}:
        raise ValidationError("tier", f"is {tier!r}", f"use one of {', '.join(t.value for t in Tier)}")
    if action == "annotate" and (not isinstance(note, str) or not note.strip()):
        raise ValidationError("note", "is empty", "pass the annotation text")
    if note is not None and (not isinstance(note, str) or len(note) > NOTE_MAX_CHARS):
        # (cut to the limit without a word, where the dashboard's API refused it)
        got = f"{len(note):,} characters" if isinstance(note, str) else f"a {type(note).__name__}"
        raise ValidationError("note", f"is {got}", f"pass text of at most {NOTE_MAX_CHARS:,} characters")
    if action == "set_value" and memory.pinned:
        raise StateConflictError("memory_id", "is pinned (worth 1.0 while pinned)", "unpin it first")
    # the value the memory has now, under the current weights (the stored one dates from its last write,
    # and the weights may have moved since): what the action's "before" and "after" compare
    before = _state(memory, harness.pager.value_now(memory, now))
    delta: dict[str, float] = {}
    learn_first = action in ("set_value", "archive")
    # set_value: the votes are chosen under the new weights; archive: the move stores the value under
    # the lowered weights, so it never comes out above "before"
    if target is not None and learn_first:
        delta = _teach(harness, memory, now, target, action, learn_rate)
    after = _perform(harness, action, memory, now, target, note, by, tier)
    # what follows is logged after the action, which may have read the clock itself (pin does): at ``now``
    # its events came out of time order with the action's
    now = max(now, harness.now())
    untaught = None
    if target is not None and not learn_first:  # a pin teaches only once it took place
        try:
            delta = _teach(harness, memory, now, target, action, learn_rate)
        except ConflictError as lost:  # the action took place: logged, saying it taught nothing (not raised)
            untaught = lost.problem
    data: dict[str, Any] = {"action": action, "by": by, "before": before, "after": _state(after)}
    if untaught is not None:
        data["untaught"] = untaught
    if tier is not None:
        data["tier"] = tier
    if target is not None:
        data.update(target=target, learned=delta)
    if note:
        data["note"] = harness.writer.scrub(note, memory.tenant)
    harness.writer.log(
        [Event(kind=EventKind.MANUAL, memory_id=memory_id, tenant=memory.tenant, at=now, data=data)]
    )
    return {"memory": after, "before": before, "after": data["after"], "learned": delta}


#: tries of :func:`_teach`'s compare-and-set before it gives up with a ConflictError
TEACH_RETRIES = 20


def _teach(
    harness: LearningHost, memory: Memory, now: datetime, target: float, action: str, rate: float
) -> dict[str, float]:
    """Teach the scorer one step towards ``target`` for ``memory``, stored and then taken by this
    harness's scorer. A compare-and-set on the tenant's weights memory: each try learns from the weights
    stored now (the steps of other processes on the same store included) and writes under the version it
    read, so two teachers never lose a step. (Learning from this process's own weights overwrote another
    process's step: two archives of notes in two harnesses stored one step.) A step that keeps losing to
    other writers is refused, not dropped."""
    wid = weights_id(memory.tenant)
    for _ in range(TEACH_RETRIES):
        current = harness.store.get_many([wid]).get(wid)
        ours = harness.pager.config.scoring
        start = ours if current is None else with_weights(ours, current.metadata.get("weights", {}))
        cfg, delta = learn(start, memory, now, target, rate, direction=DIRECTIONS.get(action))
        if not delta:
            return delta
        weights = weights_of(cfg)
        event = Event(
            kind=WEIGHTS_KIND,
            memory_id=memory.id,
            tenant=memory.tenant,
            at=now,
            data={"weights": weights, "delta": delta, "action": action, "target": target},
        )
        try:
            harness.writer.write([_weights_memory(memory.tenant, weights, now, current)], None, [event])
        except ConflictError:
            continue  # another teacher's step landed first: learn again from it
        harness.pager.config = replace(harness.pager.config, scoring=cfg)
        return delta
    raise ConflictError(
        wid,
        None,
        None,
        f"the learned weights changed under each of {TEACH_RETRIES} tries: this {action} taught nothing",
        field="action",
        fix="retry the action",
    )


def _perform(
    harness: LearningHost,
    action: str,
    memory: Memory,
    now: datetime,
    target: float | None,
    note: str | None,
    by: str,
    tier: str | None = None,
) -> Memory:
    if action == "pin":
        return harness.pin(memory.id)
    if action == "unpin":
        return harness.unpin(memory.id)
    if action == "archive":
        return harness.pager.move(memory, Tier.ARCHIVE, f"archived by {by}", now, pinned=False)
    if action == "set_tier":
        to = Tier(str(tier))
        if to is not Tier.ARCHIVE and "compression" in memory.metadata:
            memory = harness.decompress(memory.id)  # un-archiving brings the full text back
        if to is memory.tier:
            return memory
        # a pin keeps a memory in the working tier: a move out of it ends the pin, as update(tier=) does
        # (kept, the moved memory stayed pinned outside every session's pin budget)
        if memory.pinned and to is not Tier.WORKING:
            return harness.pager.move(memory, to, f"moved to {to.value} by {by}, unpinned", now, pinned=False)
        return harness.pager.move(memory, to, f"moved to {to.value} by {by}", now)
    if action == "annotate":
        text = harness.writer.scrub(str(note), memory.tenant)
        return _annotated(harness, memory, {"at": now.isoformat(), "by": by, "text": text})
    assert target is not None  # set_value
    votes = _votes_for(harness, memory, now, target)
    return harness.pager.mutate(
        memory, lambda cur: {"usage": cur.usage.model_copy(update={"feedback": votes})}, now
    )


#: How often an annotation is written again over a memory that another writer changed meanwhile
ANNOTATE_RETRIES = 10


def _annotated(harness: LearningHost, memory: Memory, entry: dict[str, Any]) -> Memory:
    """``memory`` with ``entry`` added to its annotations, over the metadata as stored: the whole metadata
    is written back, so it is written at the version it was read at, and read again when another writer
    changed it meanwhile (their change was overwritten, silently)."""
    for _ in range(ANNOTATE_RETRIES):
        notes = [*memory.metadata.get("annotations", []), entry]
        try:
            # the dashboard user's note, not an agent's write (like pin/archive above)
            return harness.update(
                memory.id,
                as_agent=APPLICATION,
                expected_version=memory.version,
                metadata={**memory.metadata, "annotations": notes},
            )
        except ConflictError:
            memory = harness.store.get(memory.id)
    raise ConflictError(memory.id, memory.version, None, f"memory {memory.id} kept changing: annotate again")


def _votes_for(harness: LearningHost, memory: Memory, now: datetime, target: float) -> int:
    """The feedback vote total (-20..20) whose value comes nearest ``target`` under the current weights."""
    cfg = harness.pager.config.scoring

    def gap(votes: int) -> float:
        m = memory.model_copy(update={"usage": memory.usage.model_copy(update={"feedback": votes})})
        return abs(explain_value(m, now, cfg).value - target)

    return min(range(-20, 21), key=lambda v: (gap(v), abs(v - memory.usage.feedback)))


def _state(m: Memory, value: float | None = None) -> dict[str, Any]:
    worth = m.value if value is None else value
    return {"tier": m.tier.value, "value": round(worth, 4), "pinned": m.pinned, "status": m.status.value}
