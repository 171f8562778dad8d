"""Lexical search: an analyzer (tokenize, drop stop words, stem) and an in-memory BM25 index.

Why in memory and not SQLite FTS5: measured on this 2-core machine, FTS5 ``bm25()`` top-10 over 100k
short documents took 7 ms median / 35 ms p95 (and 23 / 111 ms under load) — over the whole recall budget
of 10 ms p95 on its own. Scoring our own postings with numpy takes well under 2 ms at 100k (see
``bench/recall_scale.py``), and lets retrieval own the analyzer (stemming, stop words, field text), which
is where LoCoMo's measured gains are. The engine maps the index from a snapshot on open, or rebuilds it from
its rows.
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import Stemmer

from clawvm.core.vectors import top_indices

# English stop words (the common Lucene/Snowball set plus chat fillers). Removing them is worth about
# 6 points of R@5 on LoCoMo (shared/notes/retrieval-levers.md).
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been before being
    below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't
    down during each few for from further had hadn't has hasn't have haven't having he he'd he'll he's
    her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it
    it's its itself let's me more most mustn't my myself no nor not of off on once only or other ought
    our ours ourselves out over own same shan't she she'd she'll she's should shouldn't so some such
    than that that's the their theirs them themselves then there there's these they they'd they'll
    they're they've this those through to too under until up very was wasn't we we'd we'll we're we've
    were weren't what what's when when's where where's which while who who's whom why why's with won't
    would wouldn't you you'd you'll you're you've your yours yourself yourselves also just really yeah
    yes oh hey hi ok okay s t d ll m re ve will shall may might must
    """.split()  # noqa: SIM905 - a word list reads better as text
)

# Words are runs of letters/digits in any script ([^\W_]); an ASCII-only class would drop Cyrillic, Greek,
# ... text entirely and cut accented words apart ("café" -> "caf"). ASCII text is read with this alone.
_TOKEN = re.compile(r"[^\W_]+(?:'[^\W\d_]+)?")

# Chinese, Japanese and Korean write words without spaces between them, so a run of their letters is a
# phrase or a sentence, not a word: as one term, "苹果" would never match "我喜欢吃苹果". Such runs become
# their letters and overlapping pairs of letters instead (Lucene's CJK bigrams with unigrams, cjk_terms).
# Han ideographs, kana, Hangul syllables and jamo, and their compatibility and half-width forms:
CJK_RANGES = (
    (0x1100, 0x11FF),
    (0x3040, 0x30FF),
    (0x3130, 0x318F),
    (0x31F0, 0x31FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7AF),
    (0xF900, 0xFAFF),
    (0xFF66, 0xFFDC),
)
#: The CJK letters as the inside of a regular expression's [...] (Python's and PostgreSQL's alike)
CJK_CLASS = "".join(f"{chr(first)}-{chr(last)}" for first, last in CJK_RANGES)
_HAS_CJK = re.compile(f"[{CJK_CLASS}]")
# Pictographs (emoji, dingbats, the weather and arrows of U+2600..U+27BF): each one is a term of its own
_SYMBOLS = "\u2600-\u27bf\U0001f000-\U0001faff"

# Marks that writers add or leave out (Arabic short vowels and tatweel, Hebrew points), emoji variation
# selectors and skin tones: "مُحَمَّد" and "محمد" are one name.
_OPTIONAL_RANGES = (
    (0x0591, 0x05BD),  # Hebrew points and cantillation
    (0x05BF, 0x05BF),
    (0x05C1, 0x05C2),
    (0x05C4, 0x05C5),
    (0x05C7, 0x05C7),
    (0x0640, 0x0640),  # Arabic tatweel
    (0x064B, 0x065F),  # Arabic short vowels, shadda, sukun
    (0x0670, 0x0670),
    (0xFE00, 0xFE0F),  # variation selectors
    (0x1F3FB, 0x1F3FF),  # skin tones
)
_OPTIONAL = re.compile("[" + "".join(f"{chr(first)}-{chr(last)}" for first, last in _OPTIONAL_RANGES) + "]")


@lru_cache(maxsize=1)
def _combining_marks() -> str:
    """The combining marks (Unicode category M*) as the inside of a regular expression's [...]. Built on
    first use (a scan of the Basic Multilingual Plane, ~14 ms): ASCII text never needs it."""
    return "".join(f"{chr(a)}-{chr(b)}" for a, b in _ranges(lambda c: unicodedata.category(c)[0] == "M"))


@lru_cache(maxsize=1)
def _words_of_any_script() -> re.Pattern[str]:
    """A CJK run, a pictograph, or a word: a letter or digit then letters, digits and combining marks.
    ``\\w`` has no combining marks, so without them a Devanagari, Thai or marked Arabic word fell apart
    at each vowel sign ("सर्वर" -> "सर", "वर")."""
    marks = _combining_marks()
    letter = f"[^\\W_{CJK_CLASS}{_SYMBOLS}]"
    after_apostrophe = f"[^\\W\\d_{CJK_CLASS}{_SYMBOLS}]"  # letters only, as _TOKEN has it
    word = f"{letter}(?:{letter}|[{marks}])*(?:'{after_apostrophe}(?:{after_apostrophe}|[{marks}])*)?"
    return re.compile(f"[{CJK_CLASS}]+|[{_SYMBOLS}]|{word}")


@lru_cache(maxsize=1)
def _beyond_words() -> re.Pattern[str]:
    """What :data:`_TOKEN` reads wrongly: a CJK letter, a pictograph or a combining mark. Text with none
    of them (most Latin, Cyrillic, Greek text) is read with :data:`_TOKEN`, ~2x faster."""
    return re.compile(f"[{CJK_CLASS}{_SYMBOLS}{_combining_marks()}]")


def _ranges(keep: Callable[[str], bool]) -> list[tuple[int, int]]:
    """The runs of Basic Multilingual Plane code points that ``keep`` holds for (past ASCII)."""
    out: list[tuple[int, int]] = []
    for point in range(0x80, 0x10000):
        if keep(chr(point)):
            if out and out[-1][1] == point - 1:
                out[-1] = (out[-1][0], point)
            else:
                out.append((point, point))
    return out


#: What the analyzer's terms are; stored beside terms computed by it (a snapshot, PostgreSQL's postings),
#: so that terms of another version are recomputed rather than searched with this one's queries.
#: 2: CJK runs as letters and bigrams, combining marks inside words, NFKC (full-width forms) and case
#: folding, optional marks dropped, pictographs as terms (1: a CJK run was one term, a mark split its word,
#: "ＡＰＩ" was not "api").
ANALYZER_VERSION = 2


class Analyzer:
    """Lowercase, split on non-alphanumerics, drop stop words, Snowball-stem. Thread-safe."""

    def __init__(self, language: str = "english") -> None:
        self._language = language
        self._local = threading.local()  # PyStemmer objects are not thread-safe
        self._cache: dict[str, str] = {}

    def _stemmer(self) -> Stemmer.Stemmer:
        st = getattr(self._local, "stemmer", None)
        if st is None:
            st = self._local.stemmer = Stemmer.Stemmer(self._language)
        return st

    def terms(self, text: str) -> list[str]:
        if text.isascii():  # the common case
            return self._stemmed([w for w in _TOKEN.findall(text.lower()) if w not in STOP_WORDS])
        # full-width letters and digits, ligatures and the like as their plain forms ("ＡＰＩ" is "api"),
        # case folded ("Straße" is "strasse"), a dotted capital I as "i" (folded, it is "i" and a combining
        # dot), optional marks gone
        lowered = unicodedata.normalize("NFKC", text).casefold().replace("i\u0307", "i")
        if _OPTIONAL.search(lowered):
            lowered = _OPTIONAL.sub("", lowered)
        if not _beyond_words().search(lowered):
            return self._stemmed([w for w in _TOKEN.findall(lowered) if w not in STOP_WORDS])
        cjk: list[str] = []
        words: list[str] = []
        for token in _words_of_any_script().findall(lowered):
            if _HAS_CJK.match(token):
                cjk += cjk_terms(token)
            elif token not in STOP_WORDS:
                words.append(token)
        return self._stemmed(words) + cjk

    def _stemmed(self, words: list[str]) -> list[str]:
        cache = self._cache
        missing = [w for w in words if w not in cache]
        if missing:
            stems = self._stemmer().stemWords(missing)
            if len(cache) > 500_000:  # bound memory on adversarial vocabularies
                cache.clear()
            cache.update(zip(missing, stems, strict=True))
        return [cache[w].replace("'", "") for w in words]


def cjk_terms(run: str) -> list[str]:
    """The terms of a run of CJK letters: each letter, and each overlapping pair ("吃苹果" -> "吃", "苹",
    "果", "吃苹", "苹果"). The pairs rank a word of two or more letters (most Chinese words) above its
    letters found apart; the letters match a one-letter word (猫, 車) and a word next to other particles
    than the query's ("猫は" against "猫が": Japanese attaches them without a space), which pairs alone
    never matched."""
    if len(run) == 1:
        return [run]
    return [*run, *(run[i : i + 2] for i in range(len(run) - 1))]


@dataclass(frozen=True)
class BM25Params:
    """BM25 parameters. ``b`` is low because memories are short (LoCoMo: +1.5 to +2.3 R@5 at b≈0.3)."""

    k1: float = 1.2
    b: float = 0.4


class _Postings:
    """One term's postings, with a cached array form and cached BM25 impacts (of every row, and of each
    statistics group's rows: see :class:`LexicalIndex`).

    The impact of a posting, tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)), only changes when the
    postings change or the average document length drifts, so queries reuse it (at 100k documents this
    turns a query from ~8 ms of per-term arithmetic into a few gathers). Rows and tfs are kept in typed
    arrays (8 + 4 bytes a posting, not two Python ints) that become numpy arrays by one copy: the first
    query of a common term after a write rebuilds its cache from them in well under a millisecond.
    """

    __slots__ = ("by_row", "cache", "df", "group_cache", "rows", "tfs")

    def __init__(self) -> None:
        self.rows = array("q")
        self.tfs = array("f")
        self.cache: tuple[np.ndarray, np.ndarray, float, np.ndarray] | None = None
        self.by_row: tuple[np.ndarray, np.ndarray] | None = None  # (rows sorted, their tfs)
        self.df: dict[int, int] = {}  # statistics group -> how many of its rows hold the term
        # statistics group -> (its rows, their impacts, the average length they were computed with); dropped
        # whenever a posting of that group comes or goes, so one group's writes never touch another's
        self.group_cache: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}

    def group_impacts(
        self, group: int, groups: np.ndarray, doc_len: np.ndarray, avgdl: float, params: BM25Params
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """(rows of ``group``, their impacts, the average length used): :meth:`impacts` for one group, with
        the group's own average length (``groups``: each row's group)."""
        c = self.group_cache.get(group)
        if c is None or abs(c[2] - avgdl) > 0.02 * avgdl:
            rows = np.array(self.rows, dtype=np.int64)
            mine = groups[rows] == group
            rows = rows[mine]
            tfs = np.array(self.tfs, dtype=np.float32)[mine]
            k1, b = params.k1, params.b
            impact = tfs * (k1 + 1.0) / (tfs + k1 * (1.0 - b + b * doc_len[rows] / avgdl))
            c = self.group_cache[group] = (rows, impact.astype(np.float32), avgdl)
        return c

    def impacts(self, doc_len: np.ndarray, avgdl: float, params: BM25Params) -> tuple[np.ndarray, np.ndarray]:
        c = self._cached(doc_len, avgdl, params)
        return c[0], c[1]

    def arrays(self, doc_len: np.ndarray, avgdl: float, params: BM25Params) -> tuple[np.ndarray, np.ndarray]:
        """(rows, term frequencies) as arrays, from the same cache."""
        c = self._cached(doc_len, avgdl, params)
        return c[0], c[3]

    def tf_of(self, rows: np.ndarray) -> np.ndarray:
        """The term's frequency in each of ``rows`` (0 where absent; rows < 0 are absent)."""
        b = self.by_row
        if b is None or len(b[0]) != len(self.rows):
            c = self.cache  # the impacts' arrays, when current: no second copy of the postings
            if c is not None and len(c[0]) == len(self.rows):
                mine, tfs = c[0], c[3]
            else:
                mine, tfs = np.array(self.rows, dtype=np.int64), np.array(self.tfs, dtype=np.float32)
            # rows are appended in increasing order unless a document was re-indexed: sort only then
            if len(mine) > 1 and not (mine[1:] > mine[:-1]).all():
                order = np.argsort(mine, kind="stable")
                mine, tfs = mine[order], tfs[order]
            b = self.by_row = (mine, tfs)
        where = np.minimum(np.searchsorted(b[0], rows), len(b[0]) - 1)
        return np.where(b[0][where] == rows, b[1][where], np.float32(0.0))

    def _cached(
        self, doc_len: np.ndarray, avgdl: float, params: BM25Params
    ) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        c = self.cache
        if c is None or len(c[0]) != len(self.rows) or abs(c[2] - avgdl) > 0.02 * avgdl:
            rows = np.array(self.rows, dtype=np.int64)
            tfs = np.array(self.tfs, dtype=np.float32)
            k1, b = params.k1, params.b
            impact = tfs * (k1 + 1.0) / (tfs + k1 * (1.0 - b + b * doc_len[rows] / avgdl))
            c = self.cache = (rows, impact.astype(np.float32), avgdl, tfs)
        return c


class LexicalIndex:
    """BM25 over documents keyed by dense integer rows (the engine's row numbers).

    Appends are O(terms); a removed row is tombstoned (its postings stay, masked out at query time) and
    re-adding a row replaces it. Not internally locked: the owning engine serialises writers.

    Statistics groups: each row belongs to one group (the engines pass the tenant), and the corpus
    statistics BM25 needs (document count N, average length, each term's document frequency) are kept per
    group as well as for the whole index. ``scores(terms, group=g)`` scores with g's statistics alone, so
    what one group holds changes no score of another (a tenant cannot read another tenant's document
    frequencies from its scores); ``group=None`` scores with the whole index's.
    """

    def __init__(self, analyzer: Analyzer | None = None, params: BM25Params | None = None) -> None:
        self.analyzer = analyzer or Analyzer()
        self.params = params or BM25Params()
        self._postings: dict[str, _Postings] = {}
        self._doc_len = np.zeros(1024, dtype=np.float32)
        self._alive = np.zeros(1024, dtype=bool)
        self._doc_terms: dict[int, list[str]] = {}
        self._total_len = 0.0
        self._n_alive = 0
        self._n_postings = 0  # (term, row) pairs: what the postings hold, counted without visiting them
        self._group = np.zeros(1024, dtype=np.int32)  # each row's statistics group
        self._group_n: dict[int, int] = {}  # group -> live rows
        self._group_len: dict[int, float] = {}  # group -> their total length

    def __len__(self) -> int:
        return self._n_alive

    def _grow(self, row: int) -> None:
        if row >= len(self._alive):
            size = max(row + 1, 2 * len(self._alive))
            self._doc_len = np.resize(self._doc_len, size)
            self._doc_len[len(self._alive) :] = 0
            alive = np.zeros(size, dtype=bool)
            alive[: len(self._alive)] = self._alive
            self._alive = alive
            self._group = np.resize(self._group, size)

    def add(self, row: int, text: str, group: int = 0) -> None:
        """Index ``text`` as ``row`` of statistics ``group`` (replacing what the row held)."""
        if row < len(self._alive) and self._alive[row]:
            self.remove(row)
        terms = self.analyzer.terms(text)
        self._grow(row)
        self._group[row] = group
        counts: dict[str, int] = {}
        for t in terms:
            counts[t] = counts.get(t, 0) + 1
        for t, c in counts.items():
            p = self._postings.get(t)
            if p is None:
                p = self._postings[t] = _Postings()
            p.rows.append(row)
            p.tfs.append(c)
            p.df[group] = p.df.get(group, 0) + 1
            p.group_cache.pop(group, None)
        self._doc_terms[row] = list(counts)
        self._n_postings += len(counts)
        self._doc_len[row] = len(terms)
        self._alive[row] = True
        self._total_len += len(terms)
        self._n_alive += 1
        self._group_n[group] = self._group_n.get(group, 0) + 1
        self._group_len[group] = self._group_len.get(group, 0.0) + len(terms)

    def posting_count(self) -> int:
        """How many (term, row) postings the index holds."""
        return self._n_postings

    def group_of(self, row: int) -> int | None:
        """The statistics group of a live ``row`` (None when it is not indexed)."""
        return int(self._group[row]) if row < len(self._alive) and self._alive[row] else None

    def remove(self, row: int) -> None:
        if row >= len(self._alive) or not self._alive[row]:
            return
        self._alive[row] = False
        self._total_len -= float(self._doc_len[row])
        self._n_alive -= 1
        group = int(self._group[row])
        self._group_n[group] -= 1
        self._group_len[group] -= float(self._doc_len[row])
        if not self._group_n[group]:
            del self._group_n[group], self._group_len[group]
        for t in self._doc_terms.pop(row, []):
            p = self._postings[t]
            # Physically drop the posting so df stays exact. list.index scans in C: re-indexing an old row
            # (a neighbour's context document) was a Python loop over long postings, O(n) per record.
            try:
                i = p.rows.index(row)
            except ValueError:
                i = -1
            if i >= 0:
                del p.rows[i]
                del p.tfs[i]
                self._n_postings -= 1
                p.cache = p.by_row = None
                p.group_cache.pop(group, None)
                p.df[group] -= 1
                if not p.df[group]:
                    del p.df[group]
            if not p.rows:
                del self._postings[t]

    def search(
        self, query: str, limit: int, allowed: np.ndarray | None = None, group: int | None = None
    ) -> list[tuple[int, float]]:
        """Top ``limit`` (row, bm25) pairs for ``query``; ``allowed`` is an optional boolean row mask."""
        scores = self.scores(self.analyzer.terms(query), group)
        return [] if scores is None else top_rows(scores, limit, allowed)

    def corpus(self, group: int | None = None) -> tuple[int, float]:
        """(document count, total length) of ``group``'s rows, or of every row for None."""
        if group is None:
            return self._n_alive, self._total_len
        return self._group_n.get(group, 0), self._group_len.get(group, 0.0)

    def df(self, term: str, group: int | None = None) -> int:
        """How many rows (of ``group``, or of every group for None) hold ``term``."""
        p = self._postings.get(term)
        if p is None:
            return 0
        return len(p.rows) if group is None else p.df.get(group, 0)

    def scores(self, terms: list[str], group: int | None = None) -> np.ndarray | None:
        """BM25 of every row for the query ``terms`` (0 where nothing matches), or None if none can. With
        ``group``, only that group's rows score, with that group's statistics (see the class docstring)."""
        terms = list(dict.fromkeys(terms))
        n, total = self.corpus(group)
        if not terms or n == 0:
            return None
        avgdl = max(total / n, 1.0)
        scores = np.zeros(len(self._alive), dtype=np.float32)
        for t in terms:
            p = self._postings.get(t)
            if p is None:
                continue
            if group is None:
                rows, impact = p.impacts(self._doc_len, avgdl, self.params)
                df = len(rows)
            else:
                df = p.df.get(group, 0)
                if not df:
                    continue
                rows, impact, _ = p.group_impacts(group, self._group, self._doc_len, avgdl, self.params)
            scores[rows] += np.float32(self.idf(df, n)) * impact
        return scores

    def scores_of(self, terms: list[str], rows: np.ndarray, group: int | None = None) -> np.ndarray | None:
        """BM25 of ``rows`` only, aligned with them: equal to ``scores(terms, group)[rows]``, bit for bit (the
        same impacts, the same float32 sums in the same term order), at a cost that follows ``len(rows)``
        and not the index's size. Recall uses it when a filter leaves few rows (one LangGraph namespace, an
        agent). With ``group``, ``rows`` are that group's."""
        terms = list(dict.fromkeys(terms))
        n, total = self.corpus(group)
        if not terms or n == 0:
            return None
        avgdl = max(total / n, 1.0)
        k1, b = self.params.k1, self.params.b
        out = np.zeros(len(rows), dtype=np.float32)
        for t in terms:
            p = self._postings.get(t)
            if p is None:
                continue
            if group is None:
                posting_rows, _, cached_avgdl, _ = p._cached(self._doc_len, avgdl, self.params)
                df = len(posting_rows)
            else:
                df = p.df.get(group, 0)
                if not df:
                    continue
                cached_avgdl = p.group_impacts(group, self._group, self._doc_len, avgdl, self.params)[2]
            tfs = p.tf_of(rows)
            # the cached impacts' formula and average length, on these rows (0 where the term is absent)
            impact = tfs * (k1 + 1.0) / (tfs + k1 * (1.0 - b + b * self._doc_len[rows] / cached_avgdl))
            out += np.float32(self.idf(df, n)) * impact.astype(np.float32)
        return out

    @staticmethod
    def idf(df: int, n: int) -> float:
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, term frequencies) of ``term``'s postings as cached arrays, or None for an unknown term."""
        p = self._postings.get(term)
        if p is None or self._n_alive == 0:
            return None
        return p.arrays(self._doc_len, max(self._total_len / self._n_alive, 1.0), self.params)

    def tf(self, term: str, rows: np.ndarray) -> np.ndarray | None:
        """``term``'s frequency in each of ``rows`` (0 where absent, rows < 0 included), None if unknown.
        O(len(rows) * log(postings)) from a row-sorted copy of the postings, cached."""
        p = self._postings.get(term)
        return None if p is None else p.tf_of(rows)

    @property
    def doc_len(self) -> np.ndarray:
        """Document length (terms kept by the analyzer) per row; do not modify."""
        return self._doc_len


def top_rows(scores: np.ndarray, limit: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The ``limit`` best (row, score) pairs with a positive score, best first (``allowed``: row mask);
    of equal scores, the newest rows (the highest) are kept and come first."""
    rows, best = top_scores(scores, limit, allowed)
    return list(zip(rows.tolist(), best.tolist(), strict=True))


def top_scores(
    scores: np.ndarray, limit: int, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_rows` as two arrays (rows, their scores), for callers that map the rows further."""
    if limit <= 0:
        return np.zeros(0, dtype=np.int64), scores[:0]
    if allowed is not None:
        n = min(len(allowed), len(scores))
        scores = scores.copy()
        scores[:n] *= allowed[:n]
        scores[n:] = 0.0
    # every posting scores > 0 (idf > 0, tf > 0), so the non-zero rows are exactly the candidates
    cand = np.flatnonzero(scores > 0)
    cs = scores[cand]
    if len(cand) > limit:
        top = top_indices(cs, limit)
        # equal scores at the cut (identical texts): the newest rows, the highest, are the ones kept, as
        # every engine keeps them (PostgreSQL ranks by seq, its insert order, the same way)
        floor = cs[top].min()
        sure = top[cs[top] > floor]
        tied = np.flatnonzero(cs == floor)
        top = np.concatenate([sure, tied[len(tied) - (limit - len(sure)) :]])
        cand, cs = cand[top], cs[top]
    order = np.lexsort((-cand, -cs))  # best first; equal scores newest first
    return cand[order], cs[order]
