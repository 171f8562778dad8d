"""Entity extraction for the write-time entity graph (pure functions, no model).

An entity is a capitalised span that is not just the first word of a sentence: a name ("Caroline",
"Amy Ellis Nutt"), a place ("West County"), a title ("Little Women", "Charlotte's Web"). Memories that
share an entity are linked in the search index (``store/index.py``), and recall can expand its first-stage
hits along those links (the ``graph`` preset in ``retrieval.py``).

Rules, chosen to stay cheap (a regular expression, ~10 µs per memory) and language-agnostic enough:
- a span is a run of capitalised words, optionally joined by "of", "the", "de" ("Bank of America");
- a sentence's first word is dropped from its span (it is capitalised for grammar, not because it names
  something), so "Thanks Mel!" gives "mel" and a lone sentence-initial word gives nothing;
- a leading ``"Name:"`` (a transcript's speaker) is skipped: it would link every turn of that speaker;
- stop words at either end are trimmed ("Yesterday I" -> nothing), as are weekday and month names
  (time, not things: they would link every memory of a Friday) and a possessive "'s";
- keys are lower-cased, so "LeBron" and "Lebron" meet.
"""

from __future__ import annotations

import re

from clawvm.core.lexical import STOP_WORDS

_WORD = r"[A-ZÀ-ÖØ-Þ][\w'’-]*"  # a word with a Latin capital initial
_SPAN = re.compile(rf"(?<![\w'’])({_WORD}(?:\s+(?:(?:of|the|de)\s+)?{_WORD})*)")
# what precedes a sentence's first word
_SENTENCE_END = re.compile(r"(?:^|[.!?…:;]|\s-)[\s\"“”'‘(\[]*$")
_SPEAKER = re.compile(r"^\s*[^\W\d_][\w .'’-]{0,40}:\s")
_TIME_WORDS = frozenset(
    """monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs fri sat sun
    january february march april may june july august september october november december jan feb mar apr
    jun jul aug sep sept oct nov dec""".split()  # noqa: SIM905 - a word list reads better as text
)
_SKIP = STOP_WORDS | _TIME_WORDS | {"i", "im", "ive", "ok", "okay", "omg", "lol"}


def _clean(words: list[str]) -> str:
    keys = [w.lower().replace("’", "'").rstrip("'") for w in words]
    if keys and keys[-1].endswith("'s"):  # "Caroline's" -> "caroline"; "Charlotte's Web" stays
        keys[-1] = keys[-1][:-2]
    while keys and keys[0] in _SKIP:
        keys.pop(0)
    while keys and keys[-1] in _SKIP:
        keys.pop()
    return " ".join(keys)


def entities(text: str) -> set[str]:
    """The entity keys (lower-case) named in ``text``. See the module docstring for the rules."""
    out: set[str] = set()
    start = 0
    speaker = _SPEAKER.match(text)
    if speaker is not None:
        start = speaker.end()
    for m in _SPAN.finditer(text, start):
        words = m.group(1).split()
        # look back a few characters only: slicing to the start would be quadratic on long texts
        back = max(start, m.start() - 8)
        before = text[back : m.start()]
        if _SENTENCE_END.search(before) and (back == start or not _SENTENCE_END.fullmatch(before)):
            words = words[1:]  # capitalised because it starts a sentence
        if not words:
            continue
        # "I" (and "I'm" ...) inside a span splits it: "Mel I" is not a name
        part: list[str] = []
        for w in [*words, "I"]:
            if w.lower().replace("’", "'").split("'")[0] == "i":
                key = _clean(part)
                if key and len(key) > 1:
                    out.add(key)
                part = []
            else:
                part.append(w)
    return out
