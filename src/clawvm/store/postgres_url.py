"""The PostgreSQL store URL taken apart: what goes to libpq, verbatim, and the engine's own parameters.

``postgresql://user@host/db?schema=NAME&pool_size=N&statement_timeout_ms=N&hnsw_m=N&hnsw_ef_construction=N
&replica=URL&read_your_writes=on&prepared=off``; every other parameter (``options=``, ``sslmode=`` ...) goes
to libpq as written, which percent-decodes it itself. Pure functions: nothing here connects.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from psycopg import pq

from clawvm.core.errors import ConfigError

DEFAULT_SCHEMA = "clawvm"
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")  # a plain name: checked once, then never quoted
DEFAULT_POOL_SIZE = 8
_OURS = (
    "schema",
    "pool_size",
    "statement_timeout_ms",
    "hnsw_m",
    "hnsw_ef_construction",
    "replica",
    "read_your_writes",
    "prepared",
)


@dataclass(frozen=True, slots=True)
class PgUrl:
    """A store URL taken apart: what goes to libpq (``conninfo``, every parameter we do not own, quoted
    as given) and our own parameters."""

    conninfo: str
    schema: str = DEFAULT_SCHEMA
    pool_size: int | None = None
    statement_timeout_ms: int | None = None
    hnsw_m: int | None = None
    hnsw_ef_construction: int | None = None
    libpq_options: str | None = None  # the URL's own ``options=`` (libpq's -c settings), decoded
    replica: str | None = None  # a hot standby's URL (percent-encoded in ours): searches go there
    read_your_writes: bool = False  # a search on the replica first waits for this process's last write
    prepared: bool = True  # server-side prepared statements (off behind a pooler that cannot keep them)


def _positive(name: str, value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError(f"{name}={value!r} in the store URL is not a positive whole number", name)
    return int(value)


_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def _flag(name: str, value: str) -> bool:
    if value.lower() in _ON:
        return True
    if value.lower() in _OFF:
        return False
    raise ConfigError(
        f"{name}={value!r} in the store URL is not on or off: pass {name}=on or {name}=off", name
    )


@functools.cache
def _libpq_parameters() -> frozenset[str]:
    """The parameters the libpq that will read the URL knows (its own list: versions add some)."""
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def _check_libpq_parameter(key: str) -> None:
    """A parameter neither ours nor libpq's is a typo: refused here with the nearest names, rather than by
    libpq at the first connection as an "invalid URI query parameter"."""
    known = _libpq_parameters()
    if key in known:
        return
    near = difflib.get_close_matches(key, [*_OURS, *sorted(known)], n=2)
    hint = f"did you mean {' or '.join(near)}?" if near else f"ClawVM's own are {', '.join(_OURS)}"
    raise ConfigError(f"{key!r} in the store URL is neither a libpq parameter nor ClawVM's: {hint}")


def parse_url(url: str) -> PgUrl:
    """Split a store URL into the libpq conninfo and our own parameters (see :class:`PgUrl`)."""
    parts = urlparse(url)
    ours: dict[str, str] = {}
    rest: list[str] = []
    libpq_options = None
    for raw in parts.query.split("&") if parts.query else []:
        key = unquote(raw.split("=", 1)[0])
        value = unquote(raw.split("=", 1)[1]) if "=" in raw else ""
        if key in _OURS:
            if key in ours:  # last-wins would pick a schema (a store) the caller may not have meant
                raise ConfigError(
                    f"{key} is given twice in the store URL ({ours[key]!r}, then {value!r})",
                    "db",
                    fix=f"give {key} once",
                )
            ours[key] = value
            continue
        _check_libpq_parameter(key)
        if key == "options":
            libpq_options = value
        rest.append(raw)  # verbatim: libpq percent-decodes it itself ("+" is no space to libpq)
    schema = ours.get("schema", DEFAULT_SCHEMA)
    if not SCHEMA_NAME.match(schema):
        raise ConfigError(
            f"schema {schema!r} in the store URL is not a plain lower-case SQL name: use letters, digits, _"
        )
    named = ("schema", "replica", "read_your_writes", "prepared")
    numbers = {k: _positive(k, v) for k, v in ours.items() if k not in named}
    replica = ours.get("replica") or None
    if replica is not None and not replica.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"replica={replica!r} in the store URL is not a postgresql:// URL (percent-encode it)"
        )
    read_your_writes = _flag("read_your_writes", ours.get("read_your_writes", "off"))
    if read_your_writes and replica is None:
        raise ConfigError(
            "read_your_writes=on in the store URL waits for a replica, and the URL names none:"
            " add replica=<percent-encoded postgresql:// URL> or leave read_your_writes out"
        )
    scheme = "postgresql" if parts.scheme in ("postgresql", "postgres") else parts.scheme
    return PgUrl(
        # not urlunparse: it drops an empty host's "//" (postgresql:///db, libpq's way to name a database
        # on the local socket or $PGHOST, became postgresql:/db, which libpq refuses)
        conninfo=f"{scheme}://{parts.netloc}{parts.path}"
        + (f";{parts.params}" if parts.params else "")
        + (f"?{'&'.join(rest)}" if rest else ""),
        schema=schema,
        pool_size=numbers.get("pool_size"),
        statement_timeout_ms=numbers.get("statement_timeout_ms"),
        hnsw_m=numbers.get("hnsw_m"),
        hnsw_ef_construction=numbers.get("hnsw_ef_construction"),
        libpq_options=libpq_options,
        replica=replica,
        read_your_writes=read_your_writes,
        prepared=_flag("prepared", ours.get("prepared", "on")),
    )


def split_url(url: str) -> tuple[str, str]:
    """``(libpq conninfo URL, schema)``: our own parameters taken out of ``url``."""
    parsed = parse_url(url)
    return parsed.conninfo, parsed.schema


@dataclass(frozen=True)
class HnswParams:
    """How the HNSW graph is built (pgvector's defaults): ``m`` links per node, ``ef_construction`` the
    candidate list while inserting. Larger: better recall at a given ``ef_search``, slower writes/builds."""

    m: int = 16
    ef_construction: int = 64

    def sql(self) -> str:
        return (
            "CREATE INDEX vectors_embedding ON vectors USING hnsw (embedding vector_ip_ops)"
            f" WITH (m = {int(self.m)}, ef_construction = {int(self.ef_construction)})"
        )
