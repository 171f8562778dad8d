"""Administration: API keys and data keys, the review queue, seeds, the PostgreSQL index, migration."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from click.core import ParameterSource

from clawvm.cli.common import CliGroup, named, opened_harness, opened_keyring, opened_store, tenant_named
from clawvm.core.errors import ClaimedError, ConfigError, DimensionError, ValidationError
from clawvm.core.model import DEFAULT_TENANT, utcnow
from clawvm.core.redact import redact
from clawvm.store import Store, store_from_url
from clawvm.store.crypto import KEY_ENV, KEY_FILE_ENV, DataKey, DataKeys, rotate_data_key
from clawvm.store.keys import Role


@click.group(cls=CliGroup)
def keys() -> None:
    """API keys of the server: hashed, one tenant and one role each (kept in the store's credentials
    table, which prune-events never touches)."""


@keys.command("create")
@click.option(
    "--tenant",
    default=None,
    callback=tenant_named,
    help="Tenant the key reads and writes (letters, digits, . _ -; default: --tenant of clawvm).",
)
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    default=Role.AGENT.value,
    show_default=True,
    help="admin: also manages keys; agent: reads and writes; read-only: reads.",
)
@click.option("--name", default="", help="A label to recognise the key by (who or what uses it).")
@click.option(
    "--ttl-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds the key works for; after that it gets 401 key_expired (default: it does not expire).",
)
@click.pass_context
def keys_create(ctx: click.Context, tenant: str | None, role: str, name: str, ttl_s: float | None) -> None:
    """Create a key and print it (once: only its hash is stored)."""
    tenant = _key_tenant(ctx, tenant)
    with opened_keyring(ctx) as ring:
        record, token = ring.create(tenant, role, name, ttl_s=ttl_s)
    click.echo(token)
    until = f", expires {record.expires_at.isoformat()}" if record.expires_at else ""
    click.echo(f"key {record.key_id} for tenant {tenant} ({role}{until}): shown once, store it now", err=True)


def _key_tenant(ctx: click.Context, given: str | None) -> str:
    """The tenant a new key is for: the command's --tenant, else clawvm's (from its command line or
    CLAWVM_TENANT: the command required its own and ignored both). Two different ones on the command line
    are refused; the environment's gives way to the command's (an operator minting for another tenant)."""
    source = ctx.obj.get("tenant_source")
    if given is not None:
        named = ctx.obj["tenant"] if source is ParameterSource.COMMANDLINE else given
        if named != given:
            raise click.UsageError(f"--tenant names both {named!r} and {given!r}: name the key's tenant once")
        return given
    if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
        return str(ctx.obj["tenant"])
    raise click.UsageError("name the key's tenant: keys create --tenant NAME (or set CLAWVM_TENANT)")


@keys.command("list")
@click.option(
    "--tenant",
    default=None,
    callback=tenant_named,
    help="Only this tenant's keys (default: clawvm's --tenant, if given).",
)
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked keys.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON Lines instead of a table.")
@click.pass_context
def keys_list(ctx: click.Context, tenant: str | None, include_revoked: bool, as_json: bool) -> None:
    """List keys (ids, tenants, roles; never the keys themselves)."""
    if tenant is None and ctx.obj.get("tenant", DEFAULT_TENANT) != DEFAULT_TENANT:
        tenant = ctx.obj["tenant"]  # clawvm --tenant acme keys list: acme's (it listed every tenant's)
    with opened_keyring(ctx, existing=True) as ring:
        found = ring.list(tenant, include_revoked=include_revoked)
    for k in found:
        row = {
            "key_id": k.key_id,
            "tenant": k.tenant,
            "role": k.role.value,
            "name": k.name,
            "created_at": k.created_at.isoformat(),
            "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
            "expires_at": k.expires_at.isoformat() if k.expires_at else None,
        }
        if as_json:
            click.echo(json.dumps(row))
        else:
            state = f"revoked {row['revoked_at']}" if k.revoked_at else "active"
            if k.expires_at and not k.revoked_at:
                ends = "expired" if k.expired(utcnow()) else "until"
                state = f"{ends} {row['expires_at']}"
            click.echo(f"{k.key_id}  {k.tenant:<20} {k.role.value:<9} {state:<8} {k.name}")


@keys.command("revoke")
@click.argument("key_id")
@click.pass_context
def keys_revoke(ctx: click.Context, key_id: str) -> None:
    """Revoke KEY_ID: running servers refuse it within a few seconds."""
    with opened_keyring(ctx, existing=True) as ring:
        # read first: revoking a revoked key changes nothing, and said "revoked" again as if it had
        was_active = any(k.active for k in ring.list(include_revoked=True) if k.key_id == key_id)
        record = ring.revoke(key_id)
    if was_active:
        click.echo(f"revoked {key_id}")
    else:
        at = f" at {record.revoked_at.isoformat()}" if record.revoked_at else ""
        click.echo(f"{key_id} was already revoked{at}: nothing changed")


@keys.command("rotate")
@click.argument("key_id")
@click.pass_context
def keys_rotate(ctx: click.Context, key_id: str) -> None:
    """Replace KEY_ID by a new key of the same tenant, role and name; print the new key (once) and revoke
    the old one."""
    with opened_keyring(ctx, existing=True) as ring:
        record, token = ring.rotate(key_id)
    click.echo(token)
    click.echo(f"key {record.key_id} replaces {key_id} (revoked): shown once, store it now", err=True)


@keys.command("rotate-data-key")
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=KEY_FILE_ENV,
    default=None,
    help=f"Data key file (base64 keys, one a line, the first seals; env {KEY_FILE_ENV}). Without "
    "--new-key-file a new key is generated and written first in it.",
)
@click.option(
    "--new-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Use the key in this file as the new key, or generate one into it when it does not exist.",
)
@click.option("--drop-old", is_flag=True, help="Afterwards keep only the new key in --key-file.")
@click.pass_context
def keys_rotate_data_key(
    ctx: click.Context, key_file: Path | None, new_key_file: Path | None, drop_old: bool
) -> None:
    """Re-encrypt every sealed original (redacted content kept for admins) under a new data key.

    The old keys, all needed to read, come from CLAWVM_DATA_KEY and/or the key file. Processes still
    running with only the old key must be restarted with the new one.
    """
    if drop_old and new_key_file is not None:  # it was ignored: the old keys stayed in --key-file
        raise click.UsageError(
            "--drop-old keeps only the new key in --key-file, and --new-key-file keeps the new key apart: "
            f"pass one of them (with --new-key-file, point {KEY_FILE_ENV} at it once the rotation is done)"
        )
    old = DataKeys.from_env({KEY_ENV: os.environ.get(KEY_ENV, ""), KEY_FILE_ENV: str(key_file or "")})
    if old is None:
        raise ConfigError(f"no data key to read the sealed originals: set {KEY_ENV} or pass --key-file")
    if new_key_file is not None:
        made = not new_key_file.exists()
        new = DataKey.generate() if made else DataKeys.load(new_key_file).current
    elif key_file is not None:
        new = DataKey.generate()
    else:
        raise ConfigError("nowhere to keep the new key: pass --new-key-file PATH, or --key-file PATH")
    old_keys: DataKeys = old  # not None: the closure below does not see the check above

    def keep_new_key() -> None:
        """Saved once the old keys are known to open the store, before anything is re-sealed: a run
        stopped halfway loses no key, and a refused one (keys of another store) leaves the files as they
        were (it rewrote --key-file with a new key first)."""
        if new_key_file is not None:
            if made:
                DataKeys((new,)).save(new_key_file)
        elif key_file is not None:
            old_keys.with_current(new).save(key_file)

    with opened_store(ctx, existing=True) as store:
        report = rotate_data_key(store, old, new, prepare=keep_new_key)
    if drop_old and key_file is not None:
        DataKeys((new,)).save(key_file)
    click.echo(
        f"re-encrypted {report.rekeyed} sealed originals under data key {report.kid} "
        f"({report.already} were under it already)"
    )
    if new_key_file is not None:
        click.echo(f"use the new key: {KEY_FILE_ENV}={new_key_file}", err=True)


@click.group(cls=CliGroup)
def review() -> None:
    """The review queue of team memories: low confidence, flagged, or open conflicts (clawvm.teams.shared)."""


@review.command("list")
@click.option(
    "--below", default=0.5, show_default=True, type=float, help="Confidence under which a memory waits."
)
@click.option("--team", "team_id", default=None, callback=named("team"), help="Only this team's memories.")
@click.option(
    "--agent", "agent_id", default=None, callback=named("agent"), help="Only what this agent may read."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON Lines (whole memories).")
@click.pass_context
def review_list(
    ctx: click.Context, below: float, team_id: str | None, agent_id: str | None, as_json: bool
) -> None:
    """List memories awaiting review, least trusted first."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        for m in h.review_queue(below=below, team_id=team_id, agent_id=agent_id):
            if as_json:
                click.echo(m.to_json())
            else:
                text = m.content.replace("\n", " ")
                click.echo(f"{m.id}  {m.confidence:.2f}  [{m.kind.value}] {text[:100]}")


@review.command("approve")
@click.argument("memory_id")
@click.option("--by", default=None, callback=named("reviewer"), help="Who approves (kept with the review).")
@click.option("--reason", default=None, help="Why (kept with the review).")
@click.pass_context
def review_approve(ctx: click.Context, memory_id: str, by: str | None, reason: str | None) -> None:
    """Approve MEMORY_ID (an open conflict: close it, keeping both sides)."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        h.approve(memory_id, by=by, reason=reason)
    click.echo(f"approved {memory_id}")


@review.command("reject")
@click.argument("memory_id")
@click.option("--by", default=None, callback=named("reviewer"), help="Who rejects (kept with the review).")
@click.option("--reason", default=None, help="Why (kept with the review).")
@click.pass_context
def review_reject(ctx: click.Context, memory_id: str, by: str | None, reason: str | None) -> None:
    """Reject MEMORY_ID: it becomes obsolete (kept for history) and its open conflicts close. A conflict
    note is closed as "not a conflict" (archived), both sides kept."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        h.reject(memory_id, by=by, reason=reason)
    click.echo(f"rejected {memory_id}")


@click.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def seed(ctx: click.Context, path: Path) -> None:
    """Import team seed knowledge and rule templates from a YAML or JSON file (see clawvm.teams.seed)."""
    from clawvm.teams.seed import import_seed

    with opened_harness(ctx) as h:
        report = import_seed(h, path)
    click.echo(f"imported {report.imported} ({report.memories} memories, {report.rules} rules in the file)")


@click.command()
@click.option(
    "--m", "m", type=click.IntRange(min=2), default=None, help="HNSW links per node (kept if not given)."
)
@click.option(
    "--ef-construction",
    type=click.IntRange(min=4),
    default=None,
    help="HNSW build candidates (kept if not given).",
)
@click.option(
    "--memory-mb", type=click.IntRange(min=64), default=1024, show_default=True, help="Build memory."
)
@click.option("--dim", default=384, show_default=True, help="Vector dimension of the store.")
@click.pass_context
def reindex(ctx: click.Context, m: int | None, ef_construction: int | None, memory_mb: int, dim: int) -> None:
    """Rebuild the PostgreSQL vector (HNSW) index, with new parameters if given."""
    if not str(ctx.obj["db"]).startswith(("postgresql://", "postgres://")):
        raise click.UsageError("reindex rebuilds PostgreSQL's HNSW index: pass --db postgresql://...")
    with opened_store(ctx, dim) as store:  # without the driver: one line naming the extra to install
        from clawvm.store.postgres import PostgresStore
        from clawvm.store.postgres_url import HnswParams

        assert isinstance(store, PostgresStore)
        current = store.vector_index_params() or HnswParams()
        store.hnsw = HnswParams(m=m or current.m, ef_construction=ef_construction or current.ef_construction)
        took = store.build_vector_index(memory_mb=memory_mb)
    params = store.hnsw
    click.echo(
        f"rebuilt the HNSW index (m={params.m}, ef_construction={params.ef_construction}) in {took:.1f} s"
    )


@contextmanager
def _dimension_named(option: str) -> Iterator[None]:
    """A store of other vectors than ``--dim`` says (a reshape's ValueError before), refused naming it."""
    try:
        yield
    except DimensionError as exc:
        raise ValidationError(
            "--dim",
            f"is {exc.dim}, but {option} {exc.where} holds {exc.stored}-dimensional vectors",
            f"pass --dim {exc.stored}",
        ) from None


@contextmanager
def _claim_named(option: str) -> Iterator[None]:
    """A store held by an unfinished job (a migration killed midway) refused as ``option``'s, not ``db``'s."""
    try:
        yield
    except ClaimedError as exc:
        raise ClaimedError(option, exc.problem, exc.fix) from None


def _empty(store: Store) -> bool:
    return store.count() == 0 and not store.read_events(0, 1) and not store.list_credentials(limit=1)


@click.command(name="migrate")
@click.option(
    "--from", "source", required=True, help="Store to copy: sqlite:///PATH, postgresql://... or a path."
)
@click.option("--to", "target", required=True, help="Empty store to copy into (any engine).")
@click.option(
    "--batch", type=click.IntRange(min=1), default=500, show_default=True, help="Memories per write."
)
@click.option(
    "--dim",
    type=click.IntRange(min=1),
    default=384,
    show_default=True,
    help="Vector dimension of both stores (that of the embedder that wrote them).",
)
@click.option("--no-verify", is_flag=True, help="Skip the verification (counts, checksums, vectors).")
def migrate_command(source: str, target: str, batch: int, dim: int, no_verify: bool) -> None:
    """Copy every memory, vector and event into an empty store, then verify the copy."""
    from clawvm.store.migrate import migrate

    src, dst = store_from_url(source, dim=dim), store_from_url(target, dim=dim)
    if not src.exists():  # opening it would make an empty one (a file, a PostgreSQL schema)
        raise click.UsageError(f"--from: there is no store at {redact(source).text}: check the URL or path")
    with _dimension_named("--from"), _claim_named("from"):
        src.setup()
    try:
        if _empty(src):  # a mistyped schema or file name: nothing to copy
            raise click.UsageError(f"--from: {source} holds no memories, events or keys: check the store URL")
        with _dimension_named("--to"), _claim_named("to"):
            dst.setup()
        try:
            if not sys.stderr.isatty():  # a bar drawn into a log or a pipe is noise
                report = migrate(src, dst, batch=batch, verify=not no_verify)
            else:
                with click.progressbar(length=src.count(), label="memories", file=sys.stderr) as bar:

                    def progress(what: str, n: int) -> None:
                        if what == "memories":
                            bar.update(n)

                    report = migrate(src, dst, batch=batch, verify=not no_verify, progress=progress)
        finally:
            dst.close()
    finally:
        src.close()
    click.echo(f"copied {report.memories} memories, {report.vectors} vectors, {report.events} events")
    if report.target is not None:
        click.echo(
            f"verified: counts and checksums match (memories {report.target.memory_checksum[:16]}, "
            f"events {report.target.event_checksum[:16]}); vectors within {report.worst_vector_error:.1e}"
        )
