"""Redaction at write time: find personal data and secrets in text and replace them by typed placeholders.

``redact(text)`` returns a :class:`Redaction`: the redacted text (``[EMAIL]``, ``[CARD]`` ...) and the
spans found, as offsets into the *original* text. Detection is regular expressions plus validators, no
model: a candidate becomes a span only when its validator agrees, which is where precision comes from.

=============== ===============================================================================
kind            what counts, and what is checked
=============== ===============================================================================
``email``       local@domain.tld; not ``icon@2x.png`` (a file-extension TLD), not an scp-style git remote
                (``git@host:org/repo``), not ``pkg@1.2.3``
``phone``       ``+CC ...`` international (8-15 digits); national forms with separators: NANP
                ``(415) 555-0132`` / ``415-555-0132``, a trunk ``0`` (``020 7946 0958``, ``01 23 45 67
                89``, ``03-1234-5678``), a parenthesised area code; any 7-15 digits right after a phone
                word (tel, phone, call ...). Never right after an id word (order, invoice, ISBN ...)
``card``        13-19 digits, compact or grouped like a card (4-4-4-4, 4-6-5) by one kind of separator
                (space, no-break space U+00A0, narrow no-break space U+202F, ``-`` or ``.``; not dotted
                numbering: ``version 4111.1111.1111.1111``), Luhn-valid, with a known issuer prefix (Visa,
                Mastercard, Amex, Discover, Diners, JCB, UnionPay, Maestro)
``iban``        country code + check digits + the country's exact length, mod-97 checksum
``secret``      known token formats (``sk-``, ``ghp_``, ``xoxb-``, ``AKIA``, JWTs, PEM private keys,
                ``cvm_`` keys ...), ``Bearer``/``Basic`` credentials, the value of ``password=``/
                ``api_key:``/``token=`` assignments (an upper-case environment name ending in the word
                counts: ``PGPASSWORD=``, ``MYSQL_PWD=``; a quoted value is the secret whole, spaces and all,
                an unquoted one is one token), the password glued to ``-p`` in a ``mysql``/``mysqldump``/
                ``mariadb`` command, the whole value of a JSON key naming a password (``pass``, ``pw``,
                ``pwd``, ``passwd``, ``password``, ``passphrase``), and high-entropy strings (random-looking:
                short runs of one character class; hex-only strings -- git hashes, sha256, UUIDs -- are not
                secrets)
``credentials`` the ``user:password`` of a URL (``https://user:pass@host``)
``ip``          IPv4 and IPv6 addresses (checked with :mod:`ipaddress`); not versions, nor code (``a::b``)
=============== ===============================================================================

A value is found where it stands on its own, and only ASCII letters, digits and ``_`` count as inside a word
around it: a value glued to Chinese, Japanese, Arabic or accented letters (``卡号4111111111111111``) is
found, since those languages put no space between words; digits or a token inside a longer ASCII word are
not a value (``x4111111111111111``). Zero-width characters (U+200B, U+200C, U+200D, U+2060, U+FEFF) inside
a value do not hide it (``bob\u200b@example.com``): text holding any is also read without them, and the
spans found so are mapped back onto the original, the zero-width characters inside included.

When candidates overlap, the more specific detector wins (a JWT is a secret, not a high-entropy string).
``RedactionPolicy`` says which kinds are on (per tenant: the harness takes one policy per tenant) and
whether the original is kept, sealed with the data key (:mod:`clawvm.store.crypto`). JSON payloads are
redacted value by value (with the key as context: ``{"phone": "5550132"}``), so they stay valid JSON.

Every detector runs in time linear in the text, so a request cannot stall the server through redaction
(tests/test_redact_linear.py; the cost per MB is in docs/redaction.md).
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from clawvm.core.errors import ValidationError


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


class PiiKind(StrEnum):
    EMAIL = "email"
    PHONE = "phone"
    CARD = "card"
    IBAN = "iban"
    SECRET = "secret"
    CREDENTIALS = "credentials"
    IP = "ip"

    @property
    def placeholder(self) -> str:
        return f"[{self.value.upper()}]"


ALL_KINDS = frozenset(PiiKind)


@dataclass(frozen=True)
class Span:
    """What was found: ``text[start:end]`` of the original text is a ``kind``; ``rule`` names the detector."""

    kind: PiiKind
    start: int
    end: int
    rule: str = ""


@dataclass(frozen=True)
class Redaction:
    """The redacted text and the spans that were replaced (offsets into the original, in order)."""

    text: str
    spans: tuple[Span, ...] = ()

    def counts(self) -> dict[str, int]:
        """How many spans of each kind, e.g. ``{"email": 2}``."""
        return dict(Counter(s.kind.value for s in self.spans))


@dataclass(frozen=True)
class RedactionPolicy:
    """Which kinds one tenant redacts, and whether the original is kept encrypted for admins."""

    kinds: frozenset[PiiKind] = ALL_KINDS
    keep_original: bool = False

    @classmethod
    def of(cls, kinds: Iterable[str] | None = None, *, keep_original: bool = False) -> RedactionPolicy:
        """Build from kind names as callers write them (``["email", "card"]``); None means every kind."""
        if kinds is None:
            return cls(ALL_KINDS, keep_original)
        chosen = set()
        for name in kinds:
            try:
                chosen.add(PiiKind(name))
            except ValueError:
                raise ValidationError(
                    "kinds", f"has unknown kind {name!r}", f"use some of {sorted(k.value for k in PiiKind)}"
                ) from None
        return cls(frozenset(chosen), keep_original)


DEFAULT_POLICY = RedactionPolicy()


# ---- detectors --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Found:
    kind: PiiKind
    start: int
    end: int
    priority: int  # on overlap the higher wins (the more specific detector)
    rule: str


# -- word boundaries, shared by the detectors
# A value stands on its own when what is right before and after it is not "inside a word", and only ASCII
# letters, ASCII digits and "_" count as inside a word. Python's \b and \w count every Unicode letter, so a
# value glued to Chinese, Japanese, Arabic or accented text ("卡号4111111111111111", "密钥AKIA...",
# "メールはtaro@example.jpです") had no boundary and was not found: Chinese and Japanese put no space
# between words. On ASCII text the boundaries are those of \b and \w: a value still does not start or end
# inside a longer ASCII token ("x4111111111111111", "abcAKIA..."). Each detector adds the characters that
# also bind its values (the "." of "1.2.3.4.5", the "-" of a host name); none uses \b or \w for a boundary.
_WORD_CHARS = "A-Za-z0-9_"


def _not_after(extra: str = "") -> str:
    """A look-behind: what follows does not come right after a word character, nor after one of ``extra``
    (characters of a class, ``-`` last). Case-sensitive even in a ``(?i)`` pattern, where ``[A-Za-z]`` would
    also take four non-ASCII letters (the dotless i, the long s, the dotted I, the Kelvin sign)."""
    return f"(?-i:(?<![{_WORD_CHARS}{extra}]))"


def _not_before(extra: str = "") -> str:
    """A look-ahead: what precedes is not followed by a word character, nor by one of ``extra``."""
    return f"(?-i:(?![{_WORD_CHARS}{extra}]))"


# -- email
# a non-ASCII letter before the local part is not part of it: "éétaro@example.jp" redacts to "éé[EMAIL]"
_EMAIL = re.compile(
    _not_after(".%+'-") + r"[A-Za-z0-9][A-Za-z0-9._%+'-]{0,63}@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24})" + _not_before("-")
)
# file extensions that follow an "@" in asset names (icon@2x.png), never real top-level domains here
_FILE_TLDS = _words(
    "png jpg jpeg gif svg webp ico bmp tif tiff js mjs cjs ts tsx jsx css scss less map json yaml yml "
    "lock txt md html htm xml pdf zip gz tar whl so dll exe"
)


def _emails(text: str) -> Iterator[_Found]:
    for m in _EMAIL.finditer(text):
        if m.group(1).lower() in _FILE_TLDS or text[max(0, m.start() - 3) : m.start()] == "://":
            continue  # icon@2x.png; ssh://git@host is a URL's user, not an address
        after = text[m.end() : m.end() + 2]
        if after[:1] == ":" and after[1:2] not in ("", " ", "\n", "\t"):  # git@github.com:org/repo.git
            continue
        yield _Found(PiiKind.EMAIL, m.start(), m.end(), 80, "email")


# -- URL credentials
# the userinfo ends at the authority's last "@" (a raw "@" in a password is sent as is by many clients)
_URL_USERINFO = re.compile(
    _not_after() + r"[A-Za-z][A-Za-z0-9+.-]{1,20}://([^\s/:@?#]*:[^\s/?#]+)@(?=[\w\[])"
)


def _url_credentials(text: str) -> Iterator[_Found]:
    for m in _URL_USERINFO.finditer(text):
        yield _Found(PiiKind.CREDENTIALS, m.start(1), m.end(1), 95, "url-userinfo")


# -- secrets with a known shape
# Every detector here runs in time linear in the text (a request must not stall the server through
# redaction). A token pattern ``_START + PREFIX[class]{n,}`` is linear when a long scan always ends in a
# match (the match then consumes the run) or when no other start can sit inside the run it scans (its class
# has only word characters, after which _START cannot hold). Where neither holds, the rule names its start
# and its run, and _token_matches skips the starts that would rescan a run already known to fail.
_START = _not_after()  # a token starts after no ASCII word character: "密钥AKIA..." is a key
_TOKEN_END = _not_before("-")


@dataclass(frozen=True)
class _TokenRule:
    name: str
    hints: tuple[str, ...]  # literals one of which the text must contain: a cheap pre-check
    pattern: re.Pattern[str]
    start: re.Pattern[str] | None = None  # where the pattern can start (its prefix) ...
    run: re.Pattern[str] | None = None  # ... and the run of one class its body scans from there


def _rule(name: str, hints: tuple[str, ...], pattern: str, start: str = "", run: str = "") -> _TokenRule:
    return _TokenRule(
        name,
        hints,
        re.compile(pattern),
        re.compile(start) if start else None,
        re.compile(run) if run else None,
    )


_KNOWN_SECRETS: tuple[_TokenRule, ...] = (
    # "eyJ-eyJ-eyJ-...": every "eyJ" after a "-" may start a token, and each scanned the rest of the run
    _rule(
        "jwt",
        ("eyJ",),
        _START + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}" + _TOKEN_END,
        start=_START + r"eyJ",
        run=r"[A-Za-z0-9_-]*",
    ),
    _rule(
        "openai-anthropic",
        ("sk-",),
        _START + r"sk-(?:proj-|ant-(?:api\d\d-)?|svcacct-|admin-)?[A-Za-z0-9_-]{20,}" + _TOKEN_END,
    ),
    _rule("stripe", ("k_live_", "k_test_"), _START + r"[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}" + _TOKEN_END),
    _rule(
        "github",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        _START + r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})" + _TOKEN_END,
    ),
    _rule("gitlab", ("glpat-",), _START + r"glpat-[A-Za-z0-9_-]{20,}" + _TOKEN_END),
    # "xoxb-xoxb-...-x_": the run ends in "_", which fails the token from every start inside the run
    _rule(
        "slack",
        ("xox",),
        _START + r"xox[abposre]-[A-Za-z0-9-]{10,}" + _TOKEN_END,
        start=_START + r"xox[abposre]-",
        run=r"[A-Za-z0-9-]*",
    ),
    _rule("slack-webhook", ("hooks.slack.com",), r"https://hooks\.slack\.com/services/[A-Za-z0-9/]{20,}"),
    _rule(
        "aws-access-key",
        ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"),
        _START + r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}" + _not_before(),
    ),
    _rule("google-api-key", ("AIza",), _START + r"AIza[0-9A-Za-z_-]{35}" + _TOKEN_END),
    _rule("npm", ("npm_",), _START + r"npm_[A-Za-z0-9]{36}" + _TOKEN_END),
    _rule("huggingface", ("hf_",), _START + r"hf_[A-Za-z0-9]{30,}" + _TOKEN_END),
    _rule("sendgrid", ("SG.",), _START + r"SG\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{16,}" + _TOKEN_END),
    _rule("clawvm-key", ("cvm_",), _START + r"cvm_[0-9a-f]{12}_[A-Za-z0-9_-]{20,100}" + _TOKEN_END),
)
# any hint of any rule: one search instead of a test per hint, for the many short strings of a JSON payload
_ANY_HINT = re.compile("|".join(re.escape(hint) for rule in _KNOWN_SECRETS for hint in rule.hints))
_AUTH_HEADER = re.compile(
    r"(?i)(?:" + _not_after() + r"bearer\s+(?P<bearer>[A-Za-z0-9._~+/-]{16,}=*)|authorization\s*:\s*basic\s+"
    r"(?P<basic>[A-Za-z0-9+/]{12,}={0,2}))(?![A-Za-z0-9._~+/=-])"
)


def _token_matches(rule: _TokenRule, text: str) -> Iterator[re.Match[str]]:
    """What ``rule.pattern.finditer(text)`` yields, in time linear in the text.

    A rule with a ``start`` and a ``run`` has a body that begins with a maximal run of the run's class
    (its prefix is of that class too) and can only continue where that run ends: every start inside the
    run sees the same end, with less before it, so when the pattern fails at one start it fails at every
    later start in the run. Those are skipped instead of rescanning the run from each (which took time
    quadratic in the run's length).
    """
    start, run = rule.start, rule.run
    if start is None or run is None:
        yield from rule.pattern.finditer(text)
        return
    resume = 0
    for candidate in start.finditer(text):
        at = candidate.start()
        if at < resume:
            continue
        m = rule.pattern.match(text, at)
        if m is not None:
            yield m
            resume = m.end()
        else:
            scanned = run.match(text, at)
            resume = at + 1 if scanned is None else scanned.end()


# -- PEM private keys: "-----BEGIN ... PRIVATE KEY-----", at least 16 characters, then the first END marker.
# As one regular expression ([\s\S]{16,}? between the markers) every BEGIN without an END rescanned the
# rest of the text: quadratic (20 s for 300 KB of BEGIN lines). Instead both markers are found once, with
# str.find, and each BEGIN is paired with the first END far enough after it.
_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----")
_PEM_MIN_BODY = 16


def _markers(text: str, literal: str, marker: re.Pattern[str]) -> Iterator[re.Match[str]]:
    """Every match of ``marker`` (which starts with ``literal``), in order. A match reads only the words
    after its own literal (capitals, digits and spaces), and those of two literals never overlap: the text
    is read a bounded number of times."""
    at = text.find(literal)
    while at != -1:
        m = marker.match(text, at)
        if m is not None:
            yield m
        at = text.find(literal, at + 1)


def _pem_private_keys(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each PEM private key block, as the lazy regular expression (BEGIN, at least 16
    characters, END) finds them: leftmost first, each up to the first END far enough after its BEGIN, then
    on from there."""
    ends = list(_markers(text, "-----END ", _PEM_END))
    end_starts = [m.start() for m in ends]
    resume = 0
    for begin in _markers(text, "-----BEGIN ", _PEM_BEGIN):
        if begin.start() < resume:
            continue
        i = bisect.bisect_left(end_starts, begin.end() + _PEM_MIN_BODY)
        if i == len(ends):
            return  # no END after this BEGIN, nor after any later one
        resume = ends[i].end()
        yield begin.start(), resume


def _token_secrets(text: str) -> Iterator[_Found]:
    for rule in _KNOWN_SECRETS:
        if not any(h in text for h in rule.hints):
            continue
        for m in _token_matches(rule, text):
            if len(set(m.group(0))) >= 8:  # "sk-xxxxxxxxxxxxxxxxxxxx" is a placeholder in docs, not a key
                yield _Found(PiiKind.SECRET, m.start(), m.end(), 90, rule.name)


def _known_secrets(text: str) -> Iterator[_Found]:
    if "PRIVATE KEY-----" in text:
        for start, end in _pem_private_keys(text):
            yield _Found(PiiKind.SECRET, start, end, 100, "pem-private-key")  # never a placeholder
    if _ANY_HINT.search(text):
        yield from _token_secrets(text)
    for m in _AUTH_HEADER.finditer(text):
        group = "bearer" if m.group("bearer") else "basic"
        if len(set(m.group(group))) >= 8:
            yield _Found(PiiKind.SECRET, m.start(group), m.end(group), 88, f"auth-{group}")


# -- secrets assigned to a telling name: password=..., "api_key": "...", token: ...
# Chinese and Japanese text puts its full-width punctuation right after a value ("password=hunter22，谢谢"):
# it ends the value as "," and ";" do, and a full-width "：" or "＝" assigns as ":" and "=" do.
_CJK_PUNCTUATION = "，。、；：！？「」『』（）【】《》〈〉"
# An environment variable's name that ends in a secret word is a secret's name, even with the word glued to
# what comes before (PGPASSWORD, MYSQL_PWD, GITHUB_TOKEN): upper case, as environments write them. It starts
# after no word character and its runs are of word characters, so no other start lies inside the run one
# start scans (linear). A name that goes on past the word (PASSWORD_MIN_LENGTH) is a setting about secrets.
_ENV_SECRET_NAME = r"(?-i:(?<![A-Za-z0-9_])[A-Z][A-Z0-9_]*(?:PASSWORD|PASSWD|PWD|SECRET|TOKEN|API_?KEY))"
# A quoted value is the whole of what is between the quotes, spaces included ("my pass phrase"), up to 200
# characters on one line; an unquoted value is one token ("passphrase=open sesame now": "open"), and a
# quote that does not close on the line starts a one-token value as before.
_SECRET_NAME = re.compile(
    r"(?i)(?P<name>" + _ENV_SECRET_NAME + r"|(?<![A-Za-z0-9])(?:pass(?:word|wd|phrase)|(?<=[_-])pass|pwd|"
    r"secret(?:[_.-]?(?:access[_.-]?)?key)?|"
    r"api[_.-]?key|apikey|access[_.-]?key|auth[_.-]?token|access[_.-]?token|refresh[_.-]?token|token|"
    r"client[_.-]?secret|private[_.-]?key|credentials?))(?![A-Za-z0-9])"
    r"(?P<sep>[\"']?\s*(?:=>|[:=：＝])\s*|\s+(?:(?:is|was|to)\s+)?)"
    r"(?:\"(?P<dquoted>[^\"\r\n]{1,200})\"|'(?P<squoted>[^'\r\n]{1,200})'|(?P<quote>[\"']?)"
    r"(?P<value>[^\s\"'`,;<>" + _CJK_PUNCTUATION + r"]{4,200}))"
)
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_REFERENCE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_NEXT_PARAM = re.compile(r"&(?=[A-Za-z_][\w.-]*=)")
_PLACEHOLDER_VALUES = _words(
    "null none nil true false undefined required optional empty string hidden redacted masked secret "
    "password token your_token your-token xxxx example env"
)


def _assigned_secrets(text: str) -> Iterator[_Found]:
    for m in _SECRET_NAME.finditer(text):
        prose = not any(c in m.group("sep") for c in ":=：＝")
        name = m.group("name").lower()
        quoted = "dquoted" if m.group("dquoted") is not None else "squoted"
        if m.group(quoted) is not None:  # password: 'my pass phrase': all of it, spaces and all
            value = m.group(quoted)
            if value.strip() and _plausible_secret_value(value, name, prose):
                yield _Found(PiiKind.SECRET, m.start(quoted), m.end(quoted), 85, "assignment")
            continue
        value = m.group("value")
        next_param = _NEXT_PARAM.search(value)  # token=abc&user=x: the value ends at the next parameter
        if next_param:
            value = value[: next_param.start()]
        end = m.start("value") + len(value)
        # sentence punctuation, not "!"; in prose a ":" too ("password policy: at least 12 characters")
        trailing = ".,)]}:" if prose else ".,)]}"
        while value and value[-1] in trailing and not m.group("quote"):
            value, end = value[:-1], end - 1
        if not _plausible_secret_value(value, name, prose):
            continue
        yield _Found(PiiKind.SECRET, m.start("value"), end, 85, "assignment")


def _password_name(name: str) -> bool:
    """Whether a (lower-cased) secret name is a password's (any value of 4 characters or more is one), not
    an api key's or a token's (which must look like one): password, passwd, pass, pwd, PGPASSWORD ..."""
    return name.startswith(("pass", "pwd", "pw")) or name.endswith(("password", "passwd", "pwd"))


def _plausible_secret_value(value: str, name: str, prose: bool) -> bool:
    """Reject what a config shows instead of a secret: placeholders, references, counts, masks."""
    low = value.lower()
    if len(value) < 4 or low in _PLACEHOLDER_VALUES or low.startswith(("process.env", "os.environ")):
        return False
    if value[0] in "$<{%([*#" or any(c in value for c in "([{") or set(value) <= set("*x•.X-_"):
        return False
    if _ENV_NAME.fullmatch(value) or (_REFERENCE.fullmatch(value) and not any(c.isdigit() for c in value)):
        return False  # YOUR_API_KEY, settings.SECRET_KEY, config.db.password: a name, not the value
    has_digit = any(c.isdigit() for c in value)
    mixed = any(c.isupper() for c in value) and any(c.islower() for c in value)
    symbol = any(not c.isalnum() and not c.isspace() for c in value)  # a quoted value's spaces are none
    if prose:  # "the password is hunter2", "password P@55w0rd!"; not "the token is expired"
        return len(value) >= 6 and any(c.isalpha() for c in value) and (has_digit or symbol)
    if name.endswith("pwd") and value.startswith(("/", "~")):
        return False  # PWD=/home/ann, OLDPWD=~/src: the shell's working directory, not a password
    if _password_name(name):
        return True
    # api keys and tokens: long enough and not a plain word or a small number
    return len(value) >= 8 and (has_digit or mixed or symbol) and not value.isdigit()


# -- the password glued to the -p flag of the MySQL and MariaDB clients: mysql -u root -phunter2
# Only in a command of those clients (elsewhere "-pfoo" is any other tool's flag): from the command's name to
# the end of the command (a new line, ";", "|" or "&", at most 500 characters), every word "-p..." is the
# password ("-P3306" is the port; "-p" alone prompts for it). Each command's words are read once: a
# command's name inside the part already read does not start another (linear).
_MYSQL_COMMAND = re.compile(
    _not_after(".-") + r"(?:mysql(?:dump|admin|import|check|show|slap)?|mariadb(?:-dump|-admin)?)(?=[ \t])"
)
_COMMAND_END = re.compile(r"[\r\n;|&]")
_MYSQL_PASSWORD_FLAG = re.compile(r"(?<!\S)-p(?:'(?P<sq>[^'\n]+)'|\"(?P<dq>[^\"\n]+)\"|(?P<bare>[^\s'\"]+))")
_COMMAND_MAX = 500


def _mysql_passwords(text: str) -> Iterator[_Found]:
    if "mysql" not in text and "mariadb" not in text:
        return
    resume = 0
    for command in _MYSQL_COMMAND.finditer(text):
        if command.start() < resume:
            continue
        limit = min(len(text), command.end() + _COMMAND_MAX)
        end_mark = _COMMAND_END.search(text, command.end(), limit)
        resume = end_mark.start() if end_mark else limit
        for flag in _MYSQL_PASSWORD_FLAG.finditer(text, command.end(), resume):
            group = next(g for g in ("sq", "dq", "bare") if flag.group(g) is not None)
            if _plausible_secret_value(flag.group(group), "password", False):
                yield _Found(PiiKind.SECRET, flag.start(group), flag.end(group), 85, "mysql-password")


# -- high-entropy strings (tokens without a known prefix: AWS secret keys, random API keys)
_BLOB = re.compile(_not_after("+/=.-") + r"[A-Za-z0-9+/_=-]{20,}" + _not_before("+/=-"))
_RUN = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_HEXISH = re.compile(r"[0-9a-fA-F-]+")
_WORDISH = re.compile(r"[a-z]{4,}|[A-Z][a-z]{3,}")  # word-like runs, which random keys rarely have
_HASH_PREFIX = re.compile(r"(?i)(?:sha\d*|md5|blake\d*b?|xxh\d*)[-:_]")
_HASH_CONTEXT = re.compile(
    r"(?i)(?:sha\d*|md5|blake\d*|integrity|checksum|digest|hash|etag|commit|rev|base64)\W{0,3}$"
)


def _entropy(s: str) -> float:
    counts = Counter(s)
    return -sum(c / len(s) * math.log2(c / len(s)) for c in counts.values())


def looks_random(token: str) -> bool:
    """True when ``token`` reads like a random key, not a word, identifier, path, hash or UUID.

    Random strings switch character class every couple of characters (runs of ~2 chars) and use many
    distinct characters; identifiers (``getUserProfileById``), slugs and paths have runs of whole words.
    Hex-only strings (git hashes, sha256, UUIDs) are excluded on purpose: code is full of them.
    """
    core = token.rstrip("=")
    letters = [c for c in core if c.isalnum()]
    if len(letters) < 20 or _HEXISH.fullmatch(core):
        return False
    classes = sum(
        (any(c.isupper() for c in core), any(c.islower() for c in core), any(c.isdigit() for c in core))
    )
    mean_run = len(letters) / max(1, len(_RUN.findall(core)))
    wordy = sum(len(w) for w in _WORDISH.findall(core)) / len(letters)
    if classes == 3:
        return mean_run <= 2.8 and wordy <= 0.5 and _entropy(core) >= 3.7
    # two classes (lower-case + digits, say): a key only when long and very mixed
    return classes == 2 and len(letters) >= 32 and mean_run <= 3.0 and wordy <= 0.5 and _entropy(core) >= 3.9


def _random_blobs(text: str) -> Iterator[_Found]:
    for m in _BLOB.finditer(text):
        token = m.group(0)
        if _HASH_CONTEXT.search(text[max(0, m.start() - 20) : m.start()]) or _HASH_PREFIX.match(token):
            continue  # a digest in a lockfile or a log: "integrity": "sha512-...", md5=...
        if "/" in token and token.count("/") > 2:  # a path or URL part, even with a random segment
            continue
        if looks_random(token):
            yield _Found(PiiKind.SECRET, m.start(), m.end(), 40, "entropy")


# -- payment cards
# Groups are separated by one kind of separator throughout: a space, a no-break space (U+00A0, what word
# processors and some locales put between groups), a narrow no-break space (U+202F), "-" or ".".
_CARD_SEPARATORS = " \u00a0\u202f.-"
_CARD = re.compile(
    _not_after(".,+-")
    + rf"(?:\d{{4}}([{_CARD_SEPARATORS}])\d{{4}}\1\d{{4}}\1\d{{1,4}}(?:\1\d{{1,3}})?"
    + rf"|\d{{4}}([{_CARD_SEPARATORS}])\d{{6}}\2\d{{4,5}}|\d{{13,19}})"
    + _not_before()
    + r"(?![.,-]\d)"
)


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _issuer_known(d: str) -> bool:
    n = len(d)
    two, four = int(d[:2]), int(d[:4])
    return (
        (d[0] == "4" and n in (13, 16, 19))  # Visa
        or (51 <= two <= 55 and n == 16)
        or (2221 <= four <= 2720 and n == 16)  # Mastercard
        or (two in (34, 37) and n == 15)  # Amex
        or ((d.startswith("6011") or 644 <= int(d[:3]) <= 649 or two == 65) and 16 <= n <= 19)  # Discover
        or ((300 <= int(d[:3]) <= 305 or two in (36, 38, 39)) and 14 <= n <= 19)  # Diners
        or (3528 <= four <= 3589 and 16 <= n <= 19)  # JCB
        or (two == 62 and 16 <= n <= 19)  # UnionPay
        or (two in (50, 56, 57, 58, 63, 67) and 12 <= n <= 19)  # Maestro
    )


def _cards(text: str) -> Iterator[_Found]:
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group(0))
        if not (13 <= len(digits) <= 19 and _issuer_known(digits) and luhn_valid(digits)):
            continue
        if "." in m.group(0) and _numbering(text[max(0, m.start() - 16) : m.start()]):
            continue  # "version 4111.1111.1111.1111": dotted numbering, as for IP addresses
        yield _Found(PiiKind.CARD, m.start(), m.end(), 70, "card")


# -- IBANs
_IBAN_LENGTHS = {
    "AD": 24,
    "AE": 23,
    "AL": 28,
    "AT": 20,
    "AZ": 28,
    "BA": 20,
    "BE": 16,
    "BG": 22,
    "BH": 22,
    "BR": 29,
    "CH": 21,
    "CR": 22,
    "CY": 28,
    "CZ": 24,
    "DE": 22,
    "DK": 18,
    "DO": 28,
    "EE": 20,
    "EG": 29,
    "ES": 24,
    "FI": 18,
    "FO": 18,
    "FR": 27,
    "GB": 22,
    "GE": 22,
    "GI": 23,
    "GL": 18,
    "GR": 27,
    "GT": 28,
    "HR": 21,
    "HU": 28,
    "IE": 22,
    "IL": 23,
    "IS": 26,
    "IT": 27,
    "JO": 30,
    "KW": 30,
    "KZ": 20,
    "LB": 28,
    "LI": 21,
    "LT": 20,
    "LU": 20,
    "LV": 21,
    "MC": 27,
    "MD": 24,
    "ME": 22,
    "MK": 19,
    "MR": 27,
    "MT": 31,
    "MU": 30,
    "NL": 18,
    "NO": 15,
    "PK": 24,
    "PL": 28,
    "PS": 29,
    "PT": 25,
    "QA": 29,
    "RO": 24,
    "RS": 22,
    "SA": 24,
    "SE": 24,
    "SI": 19,
    "SK": 24,
    "SM": 27,
    "TN": 24,
    "TR": 26,
    "UA": 29,
    "VG": 24,
    "XK": 20,
}
_IBAN_START = re.compile(r"(?<![A-Za-z0-9])([A-Za-z]{2})(\d{2})")


def iban_valid(compact: str) -> bool:
    """The ISO 13616 check: country length and mod-97 of the rearranged number == 1."""
    compact = compact.upper()
    if _IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact.isalnum():
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _ibans(text: str) -> Iterator[_Found]:
    for m in _IBAN_START.finditer(text):
        want = _IBAN_LENGTHS.get(m.group(1).upper())
        if want is None:
            continue
        chars, i = [m.group(1), m.group(2)], m.end()
        got = 4
        while got < want and i < len(text):
            c = text[i]
            if c.isascii() and c.isalnum():
                chars.append(c)
                got += 1
            elif not (c == " " and i + 1 < len(text) and text[i + 1].isalnum() and text[i - 1].isalnum()):
                break
            i += 1
        glued = i < len(text) and text[i].isascii() and text[i].isalnum()
        if got == want and not glued and iban_valid("".join(chars)):
            yield _Found(PiiKind.IBAN, m.start(), i, 75, "iban")


# -- IP addresses
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(_not_after(".") + rf"(?:{_OCTET}\.){{3}}{_OCTET}" + _not_before() + r"(?!\.\d)")
_IPV6 = re.compile(
    _not_after(":.")
    + r"(?=[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:)[0-9A-Fa-f:]{2,39}(?:(?<=:)(?:\d{1,3}\.){3}\d{1,3})?"
    + _not_before(":")
    + r"(?!\.\d)"
)
# "version 1.2.3.4", "section 4.2.1.3", "pkg>=1.2.3.4": numbering, not an address
_NUMBERING_WORDS = _words(
    "v version ver release build firmware rev update upgrade section sec § chapter clause article "
    "figure fig table item step paragraph appendix"
)


# "version" in Chinese, Japanese and Korean, written right before the number (no space to split words on)
_CJK_VERSION_WORDS = ("版本", "版本号", "バージョン", "버전")


def _numbering(before: str) -> bool:
    if before.rstrip().endswith(("==", ">=", "<=", "~=")):
        return True
    words = before.lower().split()
    if before.rstrip(" :=：").endswith(_CJK_VERSION_WORDS):  # "版本1.2.3.4", "版本号：1.2.3.4": no space
        return True
    return bool(words) and words[-1].strip(":.#(=：") in _NUMBERING_WORDS  # "version=1.2.3.4" too


def _ips(text: str) -> Iterator[_Found]:
    for m in _IPV4.finditer(text):
        if _numbering(text[max(0, m.start() - 16) : m.start()]):
            continue
        yield _Found(PiiKind.IP, m.start(), m.end(), 60, "ipv4")
    for m in _IPV6.finditer(text):
        candidate = m.group(0)
        if not _address_like(candidate):
            continue
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        yield _Found(PiiKind.IP, m.start(), m.end(), 60, "ipv6")


def _address_like(candidate: str) -> bool:
    """Whether an IPv6-shaped word reads as an address rather than code: two groups or more, and a digit
    or a third group ("::" alone, "a::b", "dead::beef", "arr[1]::2" are scope operators and words)."""
    groups = [g for g in candidate.split(":") if g]
    return len(groups) >= 2 and (len(groups) >= 3 or any(c.isdigit() for c in candidate))


# -- phone numbers
_PHONE = re.compile(
    _not_after("+#/.:$€£¥,@=-")
    + r"(?P<plus>\+\s?)?(?:\(\d{1,5}\)|\d)[\d ().-]{4,24}\d"
    + _not_before("%/")
    + r"(?![.:,-]\d)"
)
_GROUP = re.compile(r"\(\d{1,5}\)|\d+")
# the words right before a number that say what it is (compared after lower-casing and stripping ":.#")
_PHONE_WORDS = _words(
    "tel tel. telephone phone ph mobile mob cell cellphone fax call dial sms text whatsapp reach "
    "contact tél téléphone portable telefon telefonnummer handy tlf teléfono telefono móvil movil "
    "cellulare"
)
_ID_WORDS = _words(
    "order invoice ticket ref reference tracking account acct sku id isbn issn serial case po part "
    "item batch lot build version ver release record row pid uid job run customer zip postcode"
)
_FILLER_WORDS = _words("no no. number nr nr. # at on me us is - + :")


def _number_context(before: str) -> str | None:
    """``"phone"``, ``"id"`` or None: what the last words before a number say it is."""
    for word in reversed(before.lower().split()[-4:]):
        word = word.strip(":#(-：")
        if word in _FILLER_WORDS or not word:
            continue
        if word.rstrip(".") in _PHONE_WORDS or word in _PHONE_WORDS:
            return "phone"
        return "id" if word.rstrip(".") in _ID_WORDS else None
    return None


_DATE_LIKE = re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}")


def _phone_groups(candidate: str) -> list[tuple[int, int]]:
    """The digit groups of a candidate as (start, end) offsets within it."""
    return [(g.start(), g.end()) for g in _GROUP.finditer(candidate)]


def _phone_shape_ok(groups: list[str], seps: list[str], plus: bool, phone_word: bool) -> bool:
    """Whether digit groups joined by separators read as a phone number (see the module docstring)."""
    digits = sum(len(g.strip("()")) for g in groups)
    sizes = [len(g.strip("()")) for g in groups]
    for sep, left, right in zip(seps, groups, groups[1:], strict=False):
        glued = sep == "" and (left.endswith(")") or right.startswith("("))
        if sep not in (" ", "-", ".") and not glued:
            return False
    if phone_word and 7 <= digits <= 15:
        return True
    if plus:
        compact = len(groups) == 1 and digits >= 10  # +14155550132
        return 8 <= digits <= 15 and (compact or (len(groups) > 1 and sizes[0] <= 4))
    if len(groups) < 2 or any(s < 2 for s in sizes[1:]) or max(sizes) > 8:
        return False
    first = groups[0]
    if first.startswith("("):
        return 8 <= digits <= 12
    if first.startswith("0") and not first.startswith("00"):
        return 9 <= digits <= 12
    nanp = sizes == [3, 3, 4] and first[0] in "23456789"
    nanp_one = sizes == [1, 3, 3, 4] and first == "1"
    return nanp or nanp_one


def _phones(text: str) -> Iterator[_Found]:
    for m in _PHONE.finditer(text):
        start = m.start()
        said = _number_context(text[max(0, start - 40) : start])
        if said == "id":
            continue
        plus = m.group("plus") is not None
        offset = start + len(m.group("plus") or "")
        yield from _numbers_in(text, offset, m.end(), plus, said == "phone")


def _numbers_in(text: str, begin: int, end: int, plus: bool, phone_word: bool) -> Iterator[_Found]:
    """The phone numbers of one candidate run. A run may hold several numbers ("415-555-0132 415-555-0199"):
    from its start, the longest valid sequence of digit groups is a number, and the next may follow."""
    body = text[begin:end]
    spans = _phone_groups(body)
    groups = [body[a:b] for a, b in spans]
    seps = [body[spans[k][1] : spans[k + 1][0]] for k in range(len(spans) - 1)]
    i = 0
    while i < len(spans):
        first = i == 0
        national = not (plus and first) and not (phone_word and first)
        last = len(spans)
        if national:  # after the first group, a national number has no 1-digit group: stop before one
            last = next((k for k in range(i + 1, len(spans)) if len(groups[k].strip("()")) < 2), last)
        for j in range(last, i, -1):
            if _DATE_LIKE.fullmatch(body[spans[i][0] : spans[j - 1][1]]):
                continue
            if _phone_shape_ok(groups[i:j], seps[i : j - 1], plus and first, phone_word and first):
                s = text.rfind("+", 0, begin) if plus and first else begin + spans[i][0]
                yield _Found(PiiKind.PHONE, s, begin + spans[j - 1][1], 50, "phone")
                i = j
                break
        else:  # a number starts only where the run starts or right after another number
            return


_DETECTORS: dict[PiiKind, tuple[Callable[[str], Iterator[_Found]], ...]] = {
    PiiKind.EMAIL: (_emails,),
    PiiKind.PHONE: (_phones,),
    PiiKind.CARD: (_cards,),
    PiiKind.IBAN: (_ibans,),
    PiiKind.SECRET: (_known_secrets, _assigned_secrets, _mysql_passwords, _random_blobs),
    PiiKind.CREDENTIALS: (_url_credentials,),
    PiiKind.IP: (_ips,),
}
_ALL_DETECTORS = tuple(detect for kind in PiiKind for detect in _DETECTORS[kind])


# Zero-width characters (zero-width space, non-joiner, joiner, word joiner, BOM) show as nothing: inside a
# value ("bob\u200b@example.com", "4111\u200b1111...") they hid it from every detector. Text that has any
# is read twice: as it is (a zero-width space may be all that separates two words, "card\u200b4111..."),
# and without them, each span of that reading mapped back onto the original (the zero-width characters
# inside a value are part of its span). Both readings' spans then compete as any others do.
_INVISIBLE_CHARS = frozenset("\u200b\u200c\u200d\u2060\ufeff")
_INVISIBLE = re.compile("[" + "".join(sorted(_INVISIBLE_CHARS)) + "]")


def _found_through_invisible(text: str) -> list[_Found]:
    """The spans of ``text`` read without its zero-width characters, as offsets into ``text``."""
    visible = [i for i, c in enumerate(text) if c not in _INVISIBLE_CHARS]
    clean = _INVISIBLE.sub("", text)
    return [
        _Found(f.kind, visible[f.start], visible[f.end - 1] + 1, f.priority, f.rule)
        for detect in _ALL_DETECTORS
        for f in detect(clean)
        if f.end > f.start
    ]


def find(text: str, kinds: Iterable[PiiKind] = ALL_KINDS) -> list[Span]:
    """Every span to redact in ``text``, in order, without overlaps (the more specific detector wins).

    Detectors of kinds that are off still run when they outrank an enabled one, so that, say, a card
    number inside a URL's password is not redacted as a phone number when only phones are on.
    """
    enabled = frozenset(kinds)
    found = [f for detect in _ALL_DETECTORS for f in detect(text)]
    if _INVISIBLE.search(text):
        found += _found_through_invisible(text)
    found.sort(key=lambda f: (-f.priority, -(f.end - f.start), f.start))
    # one byte per character: 1 where a kept span lies. Each detector's candidates are disjoint, so checking
    # and marking them costs at most the text's length per detector and pass (a sorted list with inserts in
    # the middle was quadratic in the number of spans).
    taken = bytearray(len(text))
    kept: list[_Found] = []
    for f in found:
        if taken.find(1, f.start, f.end) != -1:
            continue
        taken[f.start : f.end] = b"\x01" * (f.end - f.start)
        kept.append(f)
    kept.sort(key=lambda f: f.start)
    return [Span(f.kind, f.start, f.end, f.rule) for f in kept if f.kind in enabled]


def redact(text: str, policy: RedactionPolicy | None = None) -> Redaction:
    """``text`` with every detected span replaced by its kind's placeholder (``[EMAIL]``, ``[CARD]``...)."""
    spans = find(text, (policy or DEFAULT_POLICY).kinds)
    return Redaction(_replace(text, spans), tuple(spans))


def _replace(text: str, spans: Iterable[Span]) -> str:
    parts: list[str] = []
    at = 0
    for s in spans:
        parts.append(text[at : s.start])
        parts.append(s.kind.placeholder)
        at = s.end
    parts.append(text[at:])
    return "".join(parts)


# ---- identifiers ----------------------------------------------------------------------------------
#: how many hex digits of the original's digest follow a redacted identifier (48 bits: two different
#: secret-looking ids of one tenant practically never share a stored form)
IDENTIFIER_DIGEST_HEX = 12
_IDENTIFIER_PERSON = b"clawvm-ident-v1"


def redact_identifier(value: str, policy: RedactionPolicy | None = None, *, salt: str = "") -> str:
    """An identifier (a session, task, agent, team or tool id, a tag) as a policy stores it.

    An id in which nothing is found is kept as it is. Otherwise its redacted text is followed by ``~`` and
    a digest of the original (salted with ``salt``, the tenant): ``run-[SECRET]~3f9a0c1d2e4b``. Each
    input maps to one stored form, so every memory of a secret-looking session stays in one session, and
    two such sessions stay apart (a bare ``[SECRET]`` would merge them). The stored form redacts to
    itself, so mapping twice changes nothing: readers map the ids they filter by the same way.

    The digest is not keyed: it confirms a guess of the whole original (a 48-bit check), which matters only
    for guessable originals (an e-mail address); it never gives the original back.
    """
    kinds = (policy or DEFAULT_POLICY).kinds
    text = value
    for _ in range(3):  # a placeholder may join text into a new match; settle (bounded: ids are short)
        spans = find(text, kinds)
        if not spans:
            break
        text = _replace(text, spans)
    if text == value:
        return value
    digest = hashlib.blake2b(
        f"{salt}\0{value}".encode("utf-8", "surrogatepass"),
        digest_size=IDENTIFIER_DIGEST_HEX // 2,
        person=_IDENTIFIER_PERSON,
    )
    return f"{text}~{digest.hexdigest()}"


# ---- JSON payloads ---------------------------------------------------------------------------------
def redact_json(payload: Any, policy: RedactionPolicy | None = None) -> tuple[Any, dict[str, int]]:
    """A copy of a JSON value with its strings (and integers that are cards or phones) redacted.

    Each value is checked with its key as context (``"phone": "5550132"`` reads as ``phone: 5550132``),
    so that assignments and phone words work inside JSON too; an integer found to be a card or a phone
    becomes its placeholder (a string), any other stays the number it was. Returns the copy and the counts
    by kind.
    """
    tally: Counter[str] = Counter()
    return _walk(payload, None, policy or DEFAULT_POLICY, tally), dict(tally)


def _walk(value: Any, key: str | None, policy: RedactionPolicy, tally: Counter[str]) -> Any:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        repeats: dict[str, int] = {}
        for k, v in value.items():
            new_key = _unique_key(_redact_scalar(str(k), None, policy, tally), out, repeats)
            out[new_key] = _walk(v, str(k), policy, tally)
        return out
    if isinstance(value, list | tuple):
        return [_walk(v, key, policy, tally) for v in value]
    if isinstance(value, str):
        return _redact_scalar(value, key, policy, tally)
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
        redacted = _redact_scalar(text, key, policy, tally)
        return value if redacted == text else redacted
    return value


def _unique_key(key: str, out: Mapping[str, Any], repeats: dict[str, int]) -> str:
    """``key``, or when another key was redacted alike, ``key'``, then ``key'2``, ``key'3`` ...: both
    entries stay. Counting on from the last suffix given keeps this linear in the number of keys (adding one
    more ``'`` each time made the keys, and the time, grow quadratically)."""
    if key not in out:
        return key
    n = repeats.get(key, 0)
    while True:
        n += 1
        candidate = f"{key}'" if n == 1 else f"{key}'{n}"
        if candidate not in out:
            repeats[key] = n
            return candidate


# A key that names a password makes its whole string value the secret ({"password": "my pass phrase"}, as
# a quoted value in text), short forms included ({"pass": ...}, {"pw": ...}: too common as words to be
# names in free text). The key's last part counts (db_pass, smtp.pw) or a glued PASSWORD/PASSWD/PASSPHRASE.
_PASSWORD_KEYS = _words("pass pw pwd passwd password passphrase")
_KEY_PARTS = re.compile(r"[_.\s-]")


def _password_key(key: str) -> bool:
    low = key.lower()
    return _KEY_PARTS.split(low)[-1] in _PASSWORD_KEYS or low.endswith(("password", "passwd", "passphrase"))


def _redact_scalar(text: str, key: str | None, policy: RedactionPolicy, tally: Counter[str]) -> str:
    if (
        key
        and PiiKind.SECRET in policy.kinds
        and _password_key(key)
        and _plausible_secret_value(text.strip(), "password", False)
    ):
        tally[PiiKind.SECRET.value] += 1
        return PiiKind.SECRET.placeholder
    prefix = f"{key}: " if key else ""
    spans = [s for s in find(prefix + text, policy.kinds) if s.start >= len(prefix)]
    tally.update(s.kind.value for s in spans)
    shifted = [Span(s.kind, s.start - len(prefix), s.end - len(prefix), s.rule) for s in spans]
    return _replace(text, shifted)


def redact_content(
    text: str, is_json: bool, policy: RedactionPolicy | None = None
) -> tuple[str, dict[str, int]]:
    """What the write path stores: the redacted content (JSON stays canonical JSON) and counts by kind."""
    try:
        parsed = json.loads(text) if is_json else None
    except ValueError:  # labelled JSON that does not parse (an imported file's): its secrets are text too
        is_json = False
    if not is_json:
        r = redact(text, policy)
        return r.text, r.counts()
    payload, counts = redact_json(parsed, policy)
    if not counts:
        return text, counts
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False), counts
