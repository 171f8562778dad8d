"""Hybrid recall configured as data: named presets, a pure fusion function, and the recall pipeline.

Channels (each asked of the store through :class:`~clawvm.store.Query`, each with a fusion weight):

- ``lexical``: BM25 over the memory's own text;
- ``context``: BM25 over the memory together with its same-session neighbours (``CONTEXT_WINDOW`` on each
  side, see ``store/index.py``): in a conversation the words of a question are often in the turn before
  or after the one holding the fact;
- ``dense``: cosine similarity of the embeddings;
- ``time``: how well the memory's creation date matches the time expressions of the query ("in May 2023",
  "on 13 October", "2022"), in [0, 1], see :func:`time_expressions` / :func:`time_match`;
- ``graph``: entity-graph expansion: memories sharing an entity (a name, place, title) with the first-stage
  best hits gain up to ``weight * link weight * seed score / best score``.

Fusion is a weighted sum of per-query, per-channel min-max normalised scores. Equal-weight reciprocal-rank
fusion of BM25 with MiniLM is *worse* than BM25 alone on LoCoMo (R@5 45.3 vs 49.9) because the small
dense model is much weaker there; weighting the channels by how much each can be trusted fixes that.
Then, for the best :func:`pool_size` fused candidates and their same-session neighbours (creation times
and neighbours from a second, small store query): ``time`` (already in [0, 1], taken as is) is added, and
``smoothing`` lets a memory inherit a share of its neighbours' scores, (s + a * (s_prev + s_next)) / (1 + 2a).
Scores stay within [0, sum of weights] until the priors, which multiply pool members' scores after
smoothing (see :class:`RecallConfig`): with the author levers (``strip_authors``, ``author_prior``), the
agents a query names are left out of the matched text and their own pool memories are multiplied by
1 + author_prior; with ``length_prior`` g, each pool memory by (its length / the pool's median length) ** g.

Every parameter was chosen on LoCoMo dev with ``bench/locomo.py`` (``--ablation`` reports each lever on
and off against the default); the numbers are in the preset comments.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from operator import itemgetter
from typing import Protocol, runtime_checkable

import numpy as np

from clawvm.core.errors import ConfigError
from clawvm.core.model import Filters, Kind, Memory, is_snapshot
from clawvm.store import CandidateInfo, Query, QueryResult
from clawvm.store.base import StoreReader

CHANNELS = ("lexical", "context", "dense", "time", "graph")
_RAW_CHANNELS = frozenset({"time"})  # already in [0, 1]: not min-max normalised


def pool_size(k: int) -> int:
    """How many of the best fused candidates (with their neighbours) get the time channel and smoothing.

    A memory further down can only climb into the top ``k`` through a neighbour, and the neighbours of
    the pool are in it. 50 (or 5k) gives the same LoCoMo dev recall as smoothing every candidate, with a
    fraction of the per-candidate work (bench/locomo.py).
    """
    return max(50, 5 * k)


@dataclass(frozen=True)
class RecallConfig:
    """How one recall runs.

    ``weights`` maps a channel name (see :data:`CHANNELS`) to its fusion weight; ``candidates`` is how many
    hits each store channel returns before fusion (``dense_candidates``, when given, for the dense
    channel); ``smoothing`` is the share of each same-session neighbour's fused score a memory inherits
    (0 = off); ``graph_seeds`` best first-stage hits seed the entity-graph expansion, which follows at most
    ``graph_links`` links.
    """

    name: str
    weights: dict[str, float] = field(default_factory=dict)
    candidates: int = 100  # per channel, before fusion
    # The dense channel's own count (None: ``candidates``). On LoCoMo the gain of deeper lists is all in
    # the dense one, and the lexical and context channels cost the most to deepen (the default's comment).
    dense_candidates: int | None = None
    smoothing: float = 0.0
    graph_seeds: int = 5
    graph_links: int = 50
    # Authors: the agents (``agent_id``, in a conversation the speaker) whose names a query uses (see
    # named_authors). Who is asked about is not what is asked about: with ``strip_authors`` their names
    # are left out of the text the lexical channels and the embedder see, so "What video games does Nate
    # play?" matches turns about games rather than every turn that says "Nate"; ``author_prior`` then
    # multiplies the fused score of their own memories by 1 + author_prior (pool candidates, after
    # smoothing: before it, the other speaker's replies inherit the boost, 2-4 multi-hop points worse).
    strip_authors: bool = False
    author_prior: float = 0.0
    # Length: a pool candidate's fused score is multiplied by (its length / the pool's median length) **
    # length_prior (after smoothing), length being the terms the lexical analyzer keeps. A longer memory
    # says more, so it is likelier to hold the fact asked about; short acknowledgements ("Thanks! Sounds
    # great") that match a topic word otherwise crowd the top of multi-part questions. 0 = off.
    length_prior: float = 0.0

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(CHANNELS)
        if unknown:
            raise ConfigError(
                f"unknown recall channel(s) {sorted(unknown)}", "weights", fix=f"use {list(CHANNELS)}"
            )
        numbers = {"smoothing": self.smoothing, "author_prior": self.author_prior}
        numbers.update(length_prior=self.length_prior, weights=min(self.weights.values(), default=0.0))
        for name, n in numbers.items():
            if n < 0:
                raise ConfigError(f"recall {name} is {n}: pass 0 or more (0 turns it off)", name)
        counts = (self.candidates, self.dense_candidates if self.dense_candidates is not None else 1)
        if any(n < 1 for n in counts):
            raise ConfigError("recall candidates and dense_candidates must be >= 1", "candidates")

    def uses(self, channel: str) -> bool:
        return self.weights.get(channel, 0.0) > 0.0

    def with_(self, name: str | None = None, **changes: object) -> RecallConfig:
        """A copy with ``changes``; ``weights`` given here are merged into the current ones (0 = off)."""
        weights = {**self.weights, **changes.pop("weights", {})}  # type: ignore[dict-item]
        weights = {c: w for c, w in weights.items() if w > 0}
        return replace(self, name=name or self.name, weights=weights, **changes)  # type: ignore[arg-type]


def dense_only(cfg: RecallConfig) -> bool:
    """Whether ``cfg`` finds candidates by embedding alone (no text channel): without an embedder, nothing."""
    return cfg.uses("dense") and not (cfg.uses("lexical") or cfg.uses("context"))


# The default before the length prior: hybrid-v2 with the authors a query names factored out
# (strip_authors, author_prior). LoCoMo dev, all five categories, R@5 / R@10 74.2 / 83.0, multi-hop R@10
# 49.8 (hybrid-v2: 71.1 / 80.1, 42.6). Dense 1.0: once names are gone the dense channel matches the topic
# (dense-only multi-hop R@10 26.7 -> 37.1) and earns lexical's weight (1.0-1.5 flat); prior 0.5
# mid-plateau (0.4-0.6 within 0.3 points overall; higher starts to cost the adversarial questions, which
# name the wrong person by design); candidates 50 as before (100: +2 multi-hop, twice the context
# channel's work at 100k memories).
_V3 = RecallConfig(
    "hybrid-v3",
    {"lexical": 0.7, "context": 0.5, "dense": 1.0, "time": 0.5},
    candidates=50,
    smoothing=0.3,
    strip_authors=True,
    author_prior=0.5,
)
# The default: hybrid-v3 plus the length prior, a deeper dense list, and the priors retuned around them.
# LoCoMo dev R@5 / R@10 74.5 / 83.1, multi-hop R@10 56.1 (hybrid-v3: 74.2 / 83.0 / 49.8); each lever off
# in bench/locomo.py --ablation and docs/recall.md. length_prior 0.3: off costs 3.4 multi-hop points, 0.2 /
# 0.45 cost 0.7 / 1.8. dense_candidates 100 while lexical and context stay at 50: all of the gain of 100
# candidates (+1.3 multi-hop) is the dense list's, and the context channel is the costly one at 100k
# memories. Smoothing 0.2: with the priors the other speaker's replies should inherit less (0.3 costs 1-2
# multi-hop points in every setting tried, 0.1 is within 0.4). author_prior 0.7 mid-plateau: 0.6-0.8 all
# reach multi-hop 55.4-57.0; 0.8 costs the adversarial questions, which name the wrong person by design,
# R@5 76.6 -> 73.6 (79.5 at 0.5, 84.2 without the prior).
_DEFAULT = _V3.with_("hybrid", dense_candidates=100, smoothing=0.2, author_prior=0.7, length_prior=0.3)
PRESETS: dict[str, RecallConfig] = {
    "hybrid": _DEFAULT,
    "hybrid-v3": _V3,
    # The default before the author levers. LoCoMo dev R@5 / R@10 71.1 / 80.1 (hybrid-v1: 59.0 / 67.9).
    # Each lever off (bench/locomo.py --ablation): context -3.6 / -2.5, time -1.1 / -1.4, dense
    # -1.0 / -1.5, smoothing -0.9 / -0.6 (-1.4 / -0.9 with 100 candidates, and the same sign in every
    # configuration of the grid; it is what lifts R@10 past 80); photo captions (how the bench records
    # turns) -1.6 / -1.1. lexical 0.7 / dense 0.3 as in hybrid-v1; context 0.5 and smoothing 0.3 sit in flat
    # optima (context 0.3-0.7 and smoothing 0.2-0.4 all within 0.7 points); time 0.5: a full date match
    # weighs less than the best lexical hit; candidates 50: the same recall as 100 with half the work.
    "hybrid-v2": RecallConfig(
        "hybrid-v2", {"lexical": 0.7, "context": 0.5, "dense": 0.3, "time": 0.5}, candidates=50, smoothing=0.3
    ),
    # The default plus entity-graph expansion: +0.1 / +0.1 on LoCoMo dev (multi-hop R@10 +0.4), noise, as
    # chat turns name few things; kept for corpora rich in names. One more store round trip.
    "graph": _DEFAULT.with_("graph", weights={"graph": 0.4}),
    # The default without the context channel, its costliest part at 100k memories (~2 ms per recall):
    # 70.5 / 79.5 on LoCoMo dev, multi-hop R@10 54.4. For deployments where recall p95 must stay well
    # under 10 ms at that scale.
    "hybrid-fast": _DEFAULT.with_("hybrid-fast", weights={"context": 0.0}),
    # The default before issue 3: lexical carries most of the signal, dense adds paraphrases.
    "hybrid-v1": RecallConfig("hybrid-v1", {"lexical": 0.7, "dense": 0.3}),
    "bm25": RecallConfig("bm25", {"lexical": 1.0}),
    "dense": RecallConfig("dense", {"dense": 1.0}),
}
DEFAULT_PRESET = "hybrid"


def preset(name: str | RecallConfig | None) -> RecallConfig:
    if isinstance(name, RecallConfig):
        return name
    key = name or DEFAULT_PRESET
    if key not in PRESETS:
        raise ConfigError(f"unknown recall preset {key!r}", "preset", fix=f"use one of {sorted(PRESETS)}")
    return PRESETS[key]


@dataclass(frozen=True, slots=True)
class ChannelScore:
    raw: float
    normalized: float
    rank: int  # 1-based rank inside the channel (0 for the derived "neighbours" and "graph" parts)
    weight: float


@dataclass(frozen=True, slots=True)
class Fused:
    id: str
    score: float
    channels: dict[str, ChannelScore]


def fuse(
    channels: dict[str, list[tuple[str, float]]],
    weights: dict[str, float],
    k: int | None = None,
    raw: frozenset[str] = frozenset(),
) -> list[Fused]:
    """Weighted sum of min-max normalised channel scores; the best ``k`` (all if None), best first.

    For each channel c with hits (id, s): n(s) = (s - min_c) / (max_c - min_c), or 1.0 when all its
    scores are equal; a channel named in ``raw`` is already a score in [0, 1] and is taken as is (clipped).
    score(id) = sum_c weight_c * n_c(id); a channel that missed id adds 0. Ties go to the larger id (ids
    sort by creation time, so the newer memory wins).
    """
    totals, parts = _fuse_scores(channels, weights, raw)
    best = _best_first(totals, k)
    explains = _explain(parts, [ident for ident, _ in best])
    return [Fused(ident, score, explains[ident]) for ident, score in best]


_FIRST, _SECOND = itemgetter(0), itemgetter(1)


@dataclass(frozen=True, slots=True)
class _Channel:
    """One fused channel's hits and how its scores were normalised (for ``explain``)."""

    hits: list[tuple[str, float]]
    weight: float
    lo: float
    span: float
    raw: bool

    def normalized(self, s: float) -> float:
        if self.raw:  # already a score in [0, 1]
            return min(max(s, 0.0), 1.0)
        return (s - self.lo) / self.span if self.span > 0 else 1.0


def _fuse_scores(
    channels: dict[str, list[tuple[str, float]]], weights: dict[str, float], raw: frozenset[str]
) -> tuple[dict[str, float], dict[str, _Channel]]:
    """The fused score of every candidate, and the channels for :func:`_explain`. Recall fuses ~150
    candidates and explains ~10: the breakdown is built for those only."""
    parts: dict[str, _Channel] = {}
    totals: dict[str, float] = {}
    get = totals.get
    for name, hits in channels.items():
        w = weights.get(name, 0.0)
        if w <= 0.0 or not hits:
            continue
        values = [s for _, s in hits]
        ch = parts[name] = _Channel(hits, w, min(values), max(values) - min(values), name in raw)
        normalized = ch.normalized
        for ident, s in hits:
            totals[ident] = get(ident, 0.0) + w * normalized(s)
    return totals, parts


def _explain(parts: dict[str, _Channel], idents: list[str]) -> dict[str, dict[str, ChannelScore]]:
    """Per id of ``idents``: its raw and normalised score, rank and weight in each channel that found it."""
    out: dict[str, dict[str, ChannelScore]] = {ident: {} for ident in idents}
    for name, ch in parts.items():
        position = dict(zip(map(_FIRST, ch.hits), range(len(ch.hits)), strict=True))
        for ident, explain in out.items():
            if (at := position.get(ident)) is not None:
                s = ch.hits[at][1]
                explain[name] = ChannelScore(s, ch.normalized(s), at + 1, ch.weight)
    return out


def _best_first(scores: dict[str, float], n: int | None = None) -> list[tuple[str, float]]:
    """(id, score) best first, the ``n`` best only when given; equal scores put the larger (newer) id
    first. One C-level sort on the score alone (~3x faster than a heap or a (score, id) key on the ~150
    candidates recall ranks three times), then runs of equal scores within the first ``n`` are put in id
    order."""
    ranked = sorted(scores.items(), key=_SECOND, reverse=True)
    end = len(ranked) if n is None else min(n, len(ranked))
    i = 0
    while i < end:
        j, score = i + 1, ranked[i][1]
        while j < len(ranked) and ranked[j][1] == score:
            j += 1
        if j - i > 1:  # a tie (rare): (id, score) tuples with one score sort by id
            ranked[i:j] = sorted(ranked[i:j], reverse=True)
        i = j
    return ranked[:end]


# ---- time expressions -------------------------------------------------------------------------------
_MONTH_NAMES = (
    "january february march april may june july august september october november december".split()  # noqa: SIM905
)
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_MONTHS.update({m[:3]: i + 1 for i, m in enumerate(_MONTH_NAMES)})
_MONTHS["sept"] = 9
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_TIME = re.compile(
    rf"\b(?:{_DAY}\s+(?:of\s+)?)?({'|'.join(sorted(_MONTHS, key=len, reverse=True))})\b\.?"
    rf"(?:\s+{_DAY}\b)?(?:,?\s+((?:19|20)\d\d)\b)?|\b((?:19|20)\d\d)\b",
    re.IGNORECASE,
)

TimeExpr = tuple[int | None, int | None, int | None]  # (year, month, day); None = not given


def time_expressions(text: str) -> list[TimeExpr]:
    """Absolute dates named in ``text``: "8 May 2023", "October 13, 2023", "in June", "2022".

    A month name counts only when capitalised or next to a day or year, so "may", "march" and "sat" as
    words are not dates. Relative expressions ("last week") are left alone: they need the date the
    question is asked, which recall does not know.
    """
    out: list[TimeExpr] = []
    for m in _TIME.finditer(text):
        day1, month, day2, year, lone_year = m.groups()
        if lone_year:
            out.append((int(lone_year), None, None))
            continue
        day = day1 or day2
        if not (day or year) and (not month[0].isupper() or month.lower() == "may"):
            continue  # "May I ...", "we march", "sat down": words, not months
        d = int(day) if day else None
        out.append((int(year) if year else None, _MONTHS[month.lower()], d if d and d <= 31 else None))
    return out


def time_match(exprs: list[TimeExpr], when: datetime) -> float:
    """Best share of an expression's given parts (year, month, day) that ``when`` matches, in [0, 1].

    A wrong year or month is no match at all (0); a right month with a wrong day keeps partial credit,
    as the event a question dates is usually mentioned within days of it.
    """
    best = 0.0
    for year, month, day in exprs:
        if (year is not None and year != when.year) or (month is not None and month != when.month):
            continue
        given = sum(x is not None for x in (year, month, day))
        hit = (year is not None) + (month is not None) + (day is not None and day == when.day)
        if given:
            best = max(best, hit / given)
    return best


# ---- authors named in a query -----------------------------------------------------------------------
_QWORD = re.compile(r"[^\W\d_][\w'’-]*")


def _possessive(word: str) -> str:
    w = word.lower().replace("’", "'")
    return w[:-2] if w.endswith("'s") else w.rstrip("'")


def named_authors(query: str, agents: frozenset[str]) -> set[str]:
    """The agents (lower-cased) whose names ``query`` uses: runs of one to three capitalised words equal
    to an ``agent_id`` (case aside; "Nate's" names "nate"). Capitalised only, so an agent called "Will"
    or "May" is not named by "will" or "may". O(query words) look-ups."""
    if not agents:
        return set()
    known, longest = _lowered(agents)
    raw = _QWORD.findall(query)
    words = [_possessive(w) for w in raw]
    out = set()
    for n in range(1, longest + 1):
        for i in range(len(words) - n + 1):
            key = " ".join(words[i : i + n]) if n > 1 else words[i]
            if key in known and all(w[0].isupper() for w in raw[i : i + n]):
                out.add(key)
    return out


@lru_cache(maxsize=256)
def _lowered(agents: frozenset[str]) -> tuple[frozenset[str], int]:
    """``agents`` lower-cased, and the most words a name of theirs has (at most 3), once per set: engines
    hand out the same frozenset until an agent is added, and a frozenset keeps its hash, so a recall pays
    a dictionary hit, not a pass over every agent."""
    lowered = frozenset(a.lower() for a in agents)
    return lowered, min(3, max((len(a.split()) for a in lowered), default=1))


def strip_authors(query: str, names: set[str]) -> str:
    """``query`` without the words of ``names`` (and their possessives); unchanged if nothing would be
    left."""
    return _stripped(query, frozenset(names)) if names else query


@lru_cache(maxsize=64)
def _stripped(query: str, names: frozenset[str]) -> str:
    """:func:`strip_authors`, cached: a recall strips its query twice (the text it embeds, the text it
    matches)."""
    drop = {w for n in names for w in n.split()}
    kept = _QWORD.sub(lambda m: "" if _possessive(m.group(0)) in drop else m.group(0), query)
    kept = re.sub(r"\s+", " ", kept).strip()
    return kept if _QWORD.search(kept) else query


def query_authors(store: StoreReader, query: str, cfg: RecallConfig, filters: Filters) -> set[str]:
    """The agents ``query`` names, when ``cfg`` uses them (else none, without asking the store)."""
    if not (cfg.strip_authors or cfg.author_prior > 0):
        return set()
    return named_authors(query, store.agents(filters))


def dense_text(
    store: StoreReader, query: str, cfg: RecallConfig, filters: Filters, named: set[str] | None = None
) -> str:
    """The text to embed for ``query`` under ``cfg``: the query, without the authors it names (``named``,
    when the caller already has them) when ``cfg.strip_authors``."""
    if not cfg.strip_authors:
        return query
    return strip_authors(query, query_authors(store, query, cfg, filters) if named is None else named)


# ---- the pipeline -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recalled:
    """One recall hit: the memory, its fused score, and the per-channel breakdown (``explain``)."""

    memory: Memory
    score: float
    explain: dict[str, ChannelScore]

    @property
    def id(self) -> str:
        return self.memory.id


def length_factors(info: dict[str, CandidateInfo], scored: dict[str, float], g: float) -> dict[str, float]:
    """The length prior's factor for each pool member in ``scored``: (length / median length) ** g, a
    length of 0 counting as 1, the ratio at most :data:`MAX_LENGTH_RATIO`. Relative to the pool's median,
    so a typical memory keeps its score whatever the corpus's usual length."""
    lengths = {i: x.length or 1 for i, x in info.items() if i in scored}
    if not lengths:
        return {}
    median = statistics.median(lengths.values())  # on the ~100-200 ints of a pool: a third of np.median
    return {i: min(n / median, MAX_LENGTH_RATIO) ** g for i, n in lengths.items()}


#: Where the length prior stops growing: a memory ten times the pool's median length says more than a
#: typical one, a 300 KB log does not say 2,000 times more (uncapped, its factor of 19 put it above exact
#: short matches). At the default prior (0.3) the factor is at most 2.0.
MAX_LENGTH_RATIO = 10.0


@runtime_checkable
class PendingVector(Protocol):
    """A query vector still being computed (a :class:`concurrent.futures.Future`): ``result()`` waits for
    it, or raises the embedder's error."""

    def result(self) -> np.ndarray: ...

    def cancel(self) -> bool: ...


def _channel_hits(
    store: StoreReader,
    text: str,
    vector: np.ndarray | PendingVector | None,
    k: int,
    cfg: RecallConfig,
    filters: Filters,
) -> QueryResult:
    """Every channel's candidates. A vector at hand goes into the same store query as the text (one round
    trip); a pending one is waited for after the text channels have run, then asked for alone."""
    base = Query(
        filters=filters,
        text=text if cfg.uses("lexical") or cfg.uses("context") else None,
        limit=max(cfg.candidates, k),
        dense_limit=None if cfg.dense_candidates is None else max(cfg.dense_candidates, k),
        lexical=cfg.uses("lexical"),
        context=cfg.uses("context"),
    )
    if not isinstance(vector, PendingVector):
        return store.query(replace(base, vector=vector if cfg.uses("dense") else None))
    try:
        # (a query with neither text nor vector lists the newest memories: not a channel)
        hits = store.query(base) if base.text is not None else QueryResult()
    except BaseException:
        vector.cancel()  # not started yet: never run; else its result is dropped
        raise
    ready = vector.result()
    if cfg.uses("dense"):
        hits.dense = store.query(replace(base, text=None, vector=ready)).dense
    return hits


@dataclass(frozen=True)
class _Fetched:
    id: str
    score: float
    memory: Memory


def _fetch_best(store: StoreReader, scores: dict[str, float], k: int, filters: Filters) -> list[_Fetched]:
    """The ``k`` best of ``scores`` that the filters still take once fetched, best first. Matched, then
    fetched: another caller's write in between (archived, moved out of the session, forgotten) leaves a
    memory the filters no longer take, which is not returned as a match; the next best takes its place,
    so such a race costs one more fetch, not a shorter answer."""
    kept: list[_Fetched] = []
    asked = 0  # the best ``asked`` ids have been fetched
    while len(kept) < k and asked < len(scores):
        ranked = _best_first(scores, asked + k - len(kept))
        batch = ranked[asked:]
        found = store.get_many([i for i, _ in batch])
        kept += [_Fetched(i, s, found[i]) for i, s in batch if i in found and _answers(found[i], filters)]
        asked = len(ranked)
    return kept


def _answers(memory: Memory, filters: Filters) -> bool:
    """Whether a fetched match may answer: the filters still take it, and it is no checkpoint's snapshot
    unless they ask for agent state by kind. A snapshot holds the JSON of a whole session, so the words
    of any of its memories matched it: recalls of archived (or any) status answered raw snapshot JSON."""
    if not filters.matches(memory):
        return False
    return not is_snapshot(memory) or (filters.kind is not None and Kind.AGENT_STATE.value in filters.kind)


def run_recall(
    store: StoreReader,
    query: str,
    vector: np.ndarray | PendingVector | None,
    k: int,
    cfg: RecallConfig,
    filters: Filters,
    named: set[str] | None = None,
) -> list[Recalled]:
    """The recall pipeline: per-channel candidates from the store, fusion, then, for the best
    ``pool(k)`` fused candidates and their same-session neighbours, the time channel and smoothing
    (their creation times and neighbours come from a second, small store query), graph expansion, and
    the memories. ``vector`` may still be computing (:class:`PendingVector`): the text channels run
    meanwhile."""
    named = query_authors(store, query, cfg, filters) if named is None else named
    text = strip_authors(query, named) if cfg.strip_authors else query
    # without the authors it names: an author called April or June read as a month, and the time channel
    # lifted every memory of that month
    times = time_expressions(strip_authors(query, named)) if cfg.uses("time") else []
    hits = _channel_hits(store, text, vector, k, cfg, filters)
    channels = {"lexical": hits.lexical, "context": hits.context, "dense": hits.dense}
    scores, parts = _fuse_scores(channels, cfg.weights, _RAW_CHANNELS)
    fused = scores  # what neighbours pass on: the fused scores, with the time channel's (added in place)
    info: dict[str, CandidateInfo] = {}
    timed: dict[str, float] = {}  # id -> its time match, for the pool members that have one
    boosted: set[str] = set()  # pool members by a named author

    prior = cfg.author_prior if named else 0.0
    lengths: dict[str, float] = {}  # pool member -> its length factor
    if (cfg.smoothing > 0 or times or prior or cfg.length_prior > 0) and scores:
        pool = [i for i, _ in _best_first(scores, pool_size(k))]
        info = store.query(Query(filters=filters, around=tuple(pool))).info
        if times:
            wt = cfg.weights["time"]
            for i, where in info.items():
                if (t := time_match(times, where.created_at)) > 0:
                    scores[i] = scores.get(i, 0.0) + wt * t
                    timed[i] = t
        if cfg.smoothing > 0:
            a, div = cfg.smoothing, 1 + 2 * cfg.smoothing
            get = scores.get
            # candidates outside the pool keep their own share; the pool inherits its neighbours'
            smoothed = {i: s / div for i, s in scores.items()}
            for i, where in info.items():
                near = get(where.previous or "", 0.0) + get(where.next or "", 0.0)
                if (s := (get(i, 0.0) + a * near) / div) > 0:
                    smoothed[i] = s
            scores = smoothed
        if cfg.length_prior > 0:  # after smoothing, as the author prior: a neighbour's length is not its own
            lengths = length_factors(info, scores, cfg.length_prior)
            for i, f in lengths.items():
                scores[i] *= f
        if prior:  # the named authors' own memories (after smoothing: their neighbours do not inherit it)
            for i, where in info.items():
                if where.agent_id is not None and i in scores and where.agent_id.lower() in named:
                    scores[i] *= 1.0 + prior
                    boosted.add(i)

    bonus: dict[str, float] = {}
    if cfg.uses("graph") and scores:
        seeds = _best_first(scores, cfg.graph_seeds)
        top = seeds[0][1]
        seed_score = dict(seeds)
        links = store.query(
            Query(filters=filters, expand=tuple(seed_score), expand_limit=cfg.graph_links)
        ).related
        for link in links:
            reached = link.weight * seed_score[link.seed] / top if top > 0 else 0.0
            bonus[link.id] = max(bonus.get(link.id, 0.0), reached)
        wg = cfg.weights["graph"]
        for i, b in bonus.items():
            scores[i] = scores.get(i, 0.0) + wg * b

    best = _fetch_best(store, scores, k, filters)
    explains = _explain(parts, [hit.id for hit in best])
    out = []
    for hit in best:
        i, s = hit.id, hit.score
        explain = explains[i]
        if cfg.smoothing > 0 and (spot := info.get(i)) is not None:
            near = fused.get(spot.previous or "", 0.0) + fused.get(spot.next or "", 0.0)
            if near > 0:
                explain["neighbours"] = ChannelScore(near, near / 2, 0, cfg.smoothing)
        if i in timed:
            explain["time"] = ChannelScore(timed[i], timed[i], 0, cfg.weights["time"])
        if i in lengths:
            explain["length"] = ChannelScore(lengths[i], lengths[i], 0, cfg.length_prior)
        if i in boosted:
            explain["author"] = ChannelScore(1.0, 1.0, 0, prior)
        if i in bonus:
            explain["graph"] = ChannelScore(bonus[i], bonus[i], 0, cfg.weights["graph"])
        out.append(Recalled(hit.memory, s, explain))
    return out
