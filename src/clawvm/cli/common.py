"""What every command group of the command line shares: the store or harness a command opens, and the
group class that turns ClawVM errors into one line."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import select
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from clawvm.core.errors import ClawVMError, NotFoundError, ValidationError
from clawvm.core.model import DEFAULT_TENANT, TENANT_FIX, is_tenant_name
from clawvm.core.redact import redact
from clawvm.harness import Harness
from clawvm.store import SQLiteStore, Store, store_from_url
from clawvm.store.base import short_lived
from clawvm.store.keys import Keyring
from clawvm.store.snapshot import path_for as snapshot_path
from clawvm.write.redaction import redaction_options

#: What SQLite keeps beside a database file (its write-ahead log and shared memory, a rollback journal)
_SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


#: A click callback: (context, parameter, value) -> the value, or a ClawVM error naming the parameter
Check = Callable[[click.Context, click.Parameter, Any], Any]


def _option_name(param: click.Parameter) -> str:
    """How the command line names ``param``: ``--session``, or ``SESSION_ID`` for an argument."""
    if isinstance(param, click.Option):
        return param.opts[0]
    return param.human_readable_name


def named(what: str) -> Check:
    """A callback refusing a blank value of an id option (``--session ""``, or ``--session "$S"`` with S
    unset): the library takes a blank id for none, so the memory was filed under no session and the command
    said nothing, where the REST API refuses it (422). Refused before any store opens: nothing written."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and not value.strip():
            name = _option_name(param)
            out = "" if param.required else f", or leave {name} out"  # `checkpoint SESSION NAME` needs it
            raise ValidationError(
                name,
                f"is blank ({value!r})",
                f"name the {what}{out}; an unset shell variable expands to nothing",
            )
        return value

    return check


def tenant_named(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A callback refusing a blank or invalid tenant of a command's own ``--tenant`` (a blank one listed no
    key, or served clawvm's tenant instead), as clawvm's own ``--tenant`` is refused."""
    if value is None:
        return value
    name = _option_name(param)
    if not value.strip():
        raise ValidationError(name, f"is blank ({value!r})", f"name a tenant, or leave {name} out")
    if not is_tenant_name(value):
        raise ValidationError(name, f"{value!r} is not a valid tenant name", TENANT_FIX)
    return value


#: What a JSON object that gives a key twice is told, as the REST API tells it (its 422)
REPEATED_KEY = (
    "is given more than once in one JSON object",
    "give each key once: only one value would be read",
)


@contextmanager
def opened_harness(
    ctx: click.Context, embed: bool = True, existing: bool = False, backlog: bool | None = None
) -> Iterator[Harness]:
    """A harness on ``--db``, with the embedding model unless ``--no-embed`` or ``embed=False``.
    ``existing``: a command that only reads (or removes) refuses a SQLite file that is not there, rather
    than making an empty store of a mistyped path and answering from it; it embeds its queries only, not
    the store's backlog (`clawvm search` embedded and wrote 3,000 waiting memories, ~10 s, before exiting).
    A command that writes embeds what it wrote, and the backlog with it, before it exits; ``backlog=True``
    asks that of a command that changes what is there (`edit --content`)."""
    db: str = ctx.obj["db"]
    embed_backlog = not existing if backlog is None else backlog
    if existing:
        _require_store(db)
    embedder = "default" if embed and not ctx.obj["no_embed"] else None
    with _unless_left_empty(db):
        tenant = ctx.obj.get("tenant", DEFAULT_TENANT)
        with short_lived():  # the command exits before any check left for after open would run
            redaction = redaction_options(redact=ctx.obj.get("redact", False))
            harness = Harness.open(
                db, embedder=embedder, tenant=tenant, embed_backlog=embed_backlog, **redaction
            )
        try:
            yield harness
        finally:
            harness.close()


@contextmanager
def _unless_left_empty(db: str) -> Iterator[None]:
    """A command that fails on a SQLite file it made leaves no file behind when nothing was written to it:
    `clawvm --db agnet.db add ""` left an empty store at the misspelt path, which later commands then took
    for the store."""
    made = _new_sqlite_file(db)
    try:
        yield
    except BaseException:
        if made is not None and _holds_nothing(made):
            for path in (made, *(made.with_name(made.name + s) for s in ("-wal", "-shm", ".index"))):
                path.unlink(missing_ok=True)
        raise


def _new_sqlite_file(db: str) -> Path | None:
    """The file a SQLite ``db`` would make, when it is not there yet."""
    store = store_from_url(db)  # no connection yet: only the engine and its file name
    if not isinstance(store, SQLiteStore) or store.path == ":memory:":
        return None
    path = Path(store.path)
    return None if path.exists() else path


def _holds_nothing(path: Path) -> bool:
    """Whether the store file at ``path`` has no memory, event or key (read only)."""
    if not path.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            held = ("memories", "events", "credentials")
            return not any(db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() for t in held if t in tables)
    except sqlite3.DatabaseError:
        return False


def refuse_store_as_output(db: str, out: Path | None, option: str) -> None:
    """Refuse ``out`` when it is the SQLite store of ``db`` or a file kept beside it (log, shared memory,
    journal, index snapshot and its temporary files), however it is spelt (relative, through a symlink, a
    hard link): opening it for writing emptied the store before the command failed on it."""
    store = store_from_url(db)  # no connection yet: only the engine and its file name
    if out is None or not isinstance(store, SQLiteStore) or store.path == ":memory:":
        return
    if _keeps(Path(store.path), out):
        raise ValidationError(
            option,
            f"{out} is the store {store.path} or a file kept beside it: writing it would destroy the store",
            "write to another file",
        )


def _keeps(db: Path, out: Path) -> bool:
    """Whether ``out`` is the SQLite file ``db`` or one of its companions."""
    target = out.resolve()
    for base in {db.absolute(), db.resolve()}:  # the snapshot sits beside the name, SQLite's files the target
        index = snapshot_path(str(base))
        own = [base, index, *(base.with_name(base.name + s) for s in _SQLITE_COMPANIONS)]
        if target in {p.resolve() for p in own}:
            return True
        if target.exists() and any(p.exists() and target.samefile(p) for p in own):
            return True
        temporary = rf"{re.escape(index.name)}\.\d+\.\d+\.tmp"  # a snapshot being written
        if target.parent == index.parent.resolve() and re.fullmatch(temporary, target.name):
            return True
    return False


def _require_store(db: str) -> None:
    """A command that reads or changes stored memories refuses a store that is not there (a missing or
    empty SQLite file, a PostgreSQL schema without one): opening it would make an empty one, and the
    command would answer from it as if the store were empty."""
    store = store_from_url(db)  # no connection yet: only the engine and its location
    if not store.exists():
        where = redact(db).text  # a URL's password is not echoed
        raise click.UsageError(
            f"no ClawVM store at {where}: check --db (or CLAWVM_DB); `clawvm add` or `clawvm import` make one"
        )


class CliGroup(click.Group):
    """Turns ClawVM errors into one clear line and exit code 2, instead of a traceback; takes its own
    options (``--db``, ``--no-embed`` ...) after the command too (``clawvm search "q" --no-embed``), where
    people put them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_group_options(self, args))

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if cmd.epilog is None:  # a command's help lists its own options: say where the store ones are
            cmd.epilog = "clawvm's own options (--db, --no-embed ...) work here too: clawvm --help"
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            if ctx.parent is None:  # what is still buffered: its broken pipe is caught here, not at exit
                sys.stdout.flush()
            return result
        except BrokenPipeError:  # `clawvm export | head -1`: the reader had what it wanted (click: exit 1)
            if not _stdout_closed():  # another pipe (a socket, a child process): a failure, told as one
                raise
            _discard_stdout()
            sys.exit(0)
        except click.NoSuchOption as exc:  # a misspelt --no-embed after the command: suggest clawvm's own too
            own = [name for p in self.params if isinstance(p, click.Option) for name in p.opts]
            if exc.option_name in own:  # one of clawvm's, last on the line, with no value (not moved)
                raise click.UsageError(f"Option '{exc.option_name}' requires an argument.", exc.ctx) from None
            near = difflib.get_close_matches(exc.option_name, own, n=1)
            if near and not exc.possibilities:
                raise click.NoSuchOption(exc.option_name, possibilities=near, ctx=exc.ctx) from None
            raise
        except NotFoundError as exc:  # "memory 'x' not found" and nothing more: the REST API says what to do
            click.echo(f"error: {exc} ({not_found_fix(exc)})", err=True)
            sys.exit(2)
        except ClawVMError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:  # a file the command was pointed at: one line, not a traceback
            if exc.filename is None:
                raise
            click.echo(f"error: {exc.filename}: {exc.strerror or exc}", err=True)
            sys.exit(2)


def not_found_fix(exc: NotFoundError) -> str:
    """What to do about ``exc``, as the REST API says it: the library's fix, and the command that lists
    such ids (a key is never deleted, only revoked: a key id not found was mistyped)."""
    if exc.what == "key":
        return "check the key id: `clawvm keys list --all` lists every key, revoked ones too"
    if exc.what == "memory":
        return f"{exc.fix}; `clawvm list`, `clawvm export` or `clawvm search QUERY` show the ids"
    if exc.what == "checkpoint":
        return f"{exc.fix}; `clawvm checkpoints SESSION` lists a session's checkpoints"
    return exc.fix


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 memory``, ``2 memories``: ``n`` and ``word`` (``words`` for other counts, else ``word`` + s)."""
    return f"{n} {word if n == 1 else words or word + 's'}"


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (so that a broken pipe was stdout's)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # no file descriptor (a test's captured output): stdout is all there is
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def _discard_stdout() -> None:
    """Point standard output at the null device, as Python's documentation recommends after a broken pipe:
    the interpreter's own flush at exit would fail on it again and print "Exception ignored" lines."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's captured output): replace the stream
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - kept open until exit
    finally:
        os.close(devnull)


@contextmanager
def opened_store(ctx: click.Context, dim: int = 384, existing: bool = False) -> Iterator[Store]:
    """The engine of ``--db`` itself (no harness: key and data-key commands work below it); ``existing``
    as for :func:`opened_harness`."""
    if existing:
        _require_store(ctx.obj["db"])
    with _unless_left_empty(ctx.obj["db"]):
        store = store_from_url(ctx.obj["db"], dim=dim)
        with short_lived():
            store.setup()
        try:
            yield store
        finally:
            store.close()


@contextmanager
def opened_keyring(ctx: click.Context, existing: bool = False) -> Iterator[Keyring]:
    with opened_store(ctx, existing=existing) as store:
        yield Keyring(store)


def hoist_group_options(group: click.Group, args: list[str]) -> list[str]:
    """``args`` with the group's own options that follow the command name moved before it (a value with its
    option), so that click, which reads a group's options only before its command, takes them in either
    place. Nothing after ``--`` moves: that is the command's own text."""
    takes_value: dict[str, bool] = {}
    for param in group.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                takes_value[name] = not param.is_flag and not param.count
    command_at = _command_position(args, takes_value)
    if command_at is None:
        return args
    moved: list[str] = []
    rest: list[str] = []
    tail = args[command_at + 1 :]
    own = _command_options(group, args[command_at], tail)  # `keys create --tenant` is the command's
    i = 0
    while i < len(tail):
        arg = tail[i]
        if arg == "--":
            rest += tail[i:]
            break
        name = arg.split("=", 1)[0]
        if name in takes_value and name not in own:
            with_value = takes_value[name] and "=" not in arg
            if with_value and i + 1 == len(tail):  # moved bare, it would take the command's name as its value
                rest.append(arg)  # so it stays, and the command says it lacks one (see CliGroup.invoke)
                break
            moved += tail[i : i + 2] if with_value else [arg]
            i += 2 if with_value else 1
            continue
        rest.append(arg)
        i += 1
    return [*args[:command_at], *moved, args[command_at], *rest]


def _command_options(group: click.Group, name: str, tail: list[str]) -> set[str]:
    """The option names of command ``name`` and, for a group of commands, of the subcommands ``tail``
    names: an option of the group's name that the command has too is the command's where it follows it."""
    names: set[str] = set()
    command = group.commands.get(name)
    words = iter(w for w in tail if not w.startswith("-"))
    while command is not None:
        for param in command.params:
            if isinstance(param, click.Option):
                names.update(param.opts, param.secondary_opts)
        command = command.commands.get(next(words, "")) if isinstance(command, click.Group) else None
    return names


def _command_position(args: list[str], takes_value: dict[str, bool]) -> int | None:
    """Where the command name is in ``args`` (the first word that is neither a group option nor its value)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return i
        i += 2 if takes_value.get(arg, False) else 1
    return None
