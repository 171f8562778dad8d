"""Value scoring: how much a memory is worth keeping close to the prompt. Pure functions, config as data.

The value of memory m at time t (every weight and default lives in :class:`ScoringConfig`):

    prior(m)      = base[kind] + sum of content signals present in m's text
                    (error/exception, conclusion/final answer, numbers, code, named entities)
                    + cost_weight * min(1, log1p(cost.seconds + cost.tokens/1000 + 100*cost.money) / 5)
    recency(m, t) = 0.5 ** (age_hours / half_life_hours[kind]), age counted from the later of
                    created_at and last_accessed_at
    use(m)        = access_weight * min(1, log1p(access_count) / log1p(10))
                    + inject_weight * min(1, log1p(injected) / log1p(10))
                    + cite_weight * cited_ratio, with cited_ratio = cited / max(1, injected)
                    + success_weight * (successes - failures) / max(1, successes + failures)
    feedback(m)   = feedback_weight * tanh(feedback / 2)      (feedback: sum of +1 / -1 votes)

    value = clamp01(prior * (recency_floor + (1 - recency_floor) * recency) + use + feedback)
    pinned memories are worth 1.0 whatever the rest says.

``explain`` returns every component so the dashboard (and ``harness.explain(id)``) can show why.

Defaults (``ScoringConfig()``; the tests check this table against the code):

    kind          base  half_life_hours
    user_input    0.55  336
    decision      0.55  720
    knowledge     0.55  2160
    tool_result   0.5   72
    error         0.5   336
    summary       0.45  336
    observation   0.4   168
    note          0.4   168
    tool_call     0.3   24
    agent_state   0.3   24
    llm_thought   0.15  6
    (a kind missing from the maps: base 0.4, half-life 168 h)

    signal_error = 0.12        signal_conclusion = 0.12    signal_numbers = 0.05
    signal_code = 0.05         signal_entities = 0.05      cost_weight = 0.1
    recency_floor = 0.35       access_weight = 0.1         inject_weight = 0.05
    cite_weight = 0.15         success_weight = 0.1        feedback_weight = 0.25

Signals are cheap regular expressions: error words or ``SomethingError``; conclusion phrases ("final
answer", "root cause", "decided", ...); any digit; code (fences, ``def f(``, ``class X:``, SQL, a line
ending in ``{ } ;``, ``=>``, a line starting with ``return``); a capitalised word not at a sentence start.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import NamedTuple

from clawvm.core.errors import ValidationError
from clawvm.core.model import Kind, Memory

_ERROR = re.compile(
    r"\b(error|exception|traceback|failed|failure|timeout|timed out)\b|\b(?-i:[A-Z]\w*Error)\b", re.I
)
_CONCLUSION = re.compile(r"\b(conclusion|final answer|in summary|decided|resolved|root cause|fixed)\b", re.I)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_CODE = re.compile(
    r"```|\bdef \w+\(|^\s*class \w+\s*[(:]|\bSELECT\b.+\bFROM\b|[{};]\s*$|=>|^\s*return\b", re.M
)
_ENTITY = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:\s[A-Z][a-z]+)*")


def _default_base() -> dict[str, float]:
    return {
        Kind.USER_INPUT.value: 0.55,
        Kind.TOOL_RESULT.value: 0.5,
        Kind.DECISION.value: 0.55,
        Kind.KNOWLEDGE.value: 0.55,
        Kind.ERROR.value: 0.5,
        Kind.OBSERVATION.value: 0.4,
        Kind.SUMMARY.value: 0.45,
        Kind.NOTE.value: 0.4,
        Kind.TOOL_CALL.value: 0.3,
        Kind.AGENT_STATE.value: 0.3,
        Kind.LLM_THOUGHT.value: 0.15,
    }


def _default_half_life() -> dict[str, float]:
    # hours; thoughts and raw tool calls go stale fast, decisions and knowledge stay useful for weeks
    return {
        Kind.LLM_THOUGHT.value: 6.0,
        Kind.TOOL_CALL.value: 24.0,
        Kind.AGENT_STATE.value: 24.0,
        Kind.TOOL_RESULT.value: 72.0,
        Kind.OBSERVATION.value: 168.0,
        Kind.NOTE.value: 168.0,
        Kind.USER_INPUT.value: 336.0,
        Kind.ERROR.value: 336.0,
        Kind.SUMMARY.value: 336.0,
        Kind.DECISION.value: 720.0,
        Kind.KNOWLEDGE.value: 2160.0,
    }


@dataclass(frozen=True)
class ScoringConfig:
    base: dict[str, float] = field(default_factory=_default_base)
    half_life_hours: dict[str, float] = field(default_factory=_default_half_life)
    signal_error: float = 0.12
    signal_conclusion: float = 0.12
    signal_numbers: float = 0.05
    signal_code: float = 0.05
    signal_entities: float = 0.05
    cost_weight: float = 0.1
    recency_floor: float = 0.35
    access_weight: float = 0.1
    inject_weight: float = 0.05
    cite_weight: float = 0.15
    success_weight: float = 0.1
    feedback_weight: float = 0.25

    def __post_init__(self) -> None:
        """Refused here, not at the first value computed: a half-life of 0 divided by zero in the middle
        of a record, a NaN weight made every value 0.0 without a word."""
        _check_per_kind("base", self.base, "a number from 0 to 1", lambda x: 0.0 <= x <= 1.0)
        _check_per_kind("half_life_hours", self.half_life_hours, "a number of hours above 0", lambda x: x > 0)
        for name in self.__dataclass_fields__:
            if name in ("base", "half_life_hours"):
                continue
            x = getattr(self, name)
            if not _finite(x) or not 0.0 <= x <= 1.0:
                raise ValidationError(name, f"is {x!r}", "pass a number from 0 to 1")


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _check_per_kind(name: str, table: object, wanted: str, within: Callable[[float], bool]) -> None:
    if not isinstance(table, dict):
        raise ValidationError(name, f"is a {type(table).__name__}", f"pass a dict of kind -> {wanted}")
    kinds = {k.value for k in Kind}
    for kind, x in table.items():
        if kind not in kinds:
            raise ValidationError(f"{name}.{kind}", "is no kind of memory", f"use one of {sorted(kinds)}")
        if not _finite(x) or not within(float(x)):
            raise ValidationError(f"{name}.{kind}", f"is {x!r}", f"pass {wanted}")


DEFAULT_SCORING = ScoringConfig()


class ValueBreakdown(NamedTuple):
    """Every term of the value formula for one memory at one instant (see the module docstring). A
    NamedTuple: the pager builds one for each member of a tier it scores, as cheaply as a tuple."""

    value: float
    base: float
    signals: dict[str, float]
    cost: float
    recency: float
    access: float
    injected: float
    cited: float
    success: float
    feedback: float
    pinned: bool

    def as_dict(self) -> dict[str, object]:
        return dict(self._asdict())


@lru_cache(maxsize=65536)
def _signals_present(text: str) -> tuple[str, ...]:
    """Which signals a text carries (cached: values are recomputed far more often than texts change)."""
    low = text.lower()
    found = []
    for name, pattern, clues, source in _CHECKS:
        haystack = low if source == "lower" else text
        # a pattern runs only where one of its clues (substrings every match contains) is present: the
        # keyword regexes cost ~15 us each on a chat turn, the substring tests well under one
        if (clues is None or any(c in haystack for c in clues)) and pattern.search(text):
            found.append(name)
    return tuple(found)


_CHECKS: tuple[tuple[str, re.Pattern[str], tuple[str, ...] | None, str], ...] = (
    ("error", _ERROR, ("error", "exception", "traceback", "fail", "timeout", "timed out"), "lower"),
    (
        "conclusion",
        _CONCLUSION,
        ("conclusion", "final answer", "in summary", "decided", "resolved", "root cause", "fixed"),
        "lower",
    ),
    ("numbers", _NUMBER, None, "text"),
    ("code", _CODE, ("```", "def ", "class", "SELECT", "{", "}", ";", "=>", "return"), "text"),
    ("entities", _ENTITY, None, "text"),
)


def content_signals(text: str, cfg: ScoringConfig = DEFAULT_SCORING) -> dict[str, float]:
    """The content signals present in ``text`` with their weights."""
    weights = {
        "error": cfg.signal_error,
        "conclusion": cfg.signal_conclusion,
        "numbers": cfg.signal_numbers,
        "code": cfg.signal_code,
        "entities": cfg.signal_entities,
    }
    return {name: weights[name] for name in _signals_present(text)}


def recency(memory: Memory, now: datetime, cfg: ScoringConfig = DEFAULT_SCORING) -> float:
    """0.5 ** (age / half-life of the memory's kind), age from the last access or creation."""
    last = max(memory.created_at, memory.last_accessed_at or memory.created_at)
    age_h = max(0.0, (now - last).total_seconds() / 3600.0)
    half = cfg.half_life_hours.get(memory.kind.value, 168.0)
    return float(0.5 ** (age_h / half))


def _sat(count: float, at: float = 10.0) -> float:
    return min(1.0, math.log1p(max(0.0, count)) / math.log1p(at))


def explain(memory: Memory, now: datetime, cfg: ScoringConfig = DEFAULT_SCORING) -> ValueBreakdown:
    """Every component of the value formula (see the module docstring) for ``memory`` at ``now``."""
    return _components(memory, now, cfg)


def value(memory: Memory, now: datetime, cfg: ScoringConfig = DEFAULT_SCORING) -> float:
    # the pager scores every member of a tier to pick demotions
    return _components(memory, now, cfg).value


def _components(memory: Memory, now: datetime, cfg: ScoringConfig) -> ValueBreakdown:
    """Every term of the formula, and the value they make."""
    u = memory.usage
    base = cfg.base.get(memory.kind.value, 0.4)
    signals = content_signals(memory.content, cfg)
    c = memory.cost
    cost = cfg.cost_weight * min(1.0, math.log1p(c.seconds + c.tokens / 1000 + 100 * c.money) / 5)
    rec = recency(memory, now, cfg)
    prior = base + sum(signals.values()) + cost
    access = cfg.access_weight * _sat(memory.access_count)
    injected = cfg.inject_weight * _sat(u.injected)
    cited = cfg.cite_weight * (u.cited / max(1, u.injected))
    trials = u.successes + u.failures
    success = cfg.success_weight * ((u.successes - u.failures) / trials if trials else 0.0)
    feedback = cfg.feedback_weight * math.tanh(u.feedback / 2)
    raw = (
        prior * (cfg.recency_floor + (1 - cfg.recency_floor) * rec)
        + access
        + injected
        + cited
        + success
        + feedback
    )
    value = 1.0 if memory.pinned else min(1.0, max(0.0, raw))
    return ValueBreakdown(
        value, base, signals, cost, rec, access, injected, cited, success, feedback, memory.pinned
    )
