"""``clawvm`` command line: a thin shell over :class:`clawvm.Harness` on the embedded default store.

The commands live by group (memories, checkpointing, serving, admin, replaying); this module is the entry
point that gathers them under one ``clawvm`` group.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from clawvm.cli import admin, checkpointing, memories, replaying, serving
from clawvm.cli.common import CliGroup
from clawvm.core.model import DEFAULT_TENANT, TENANT_FIX, is_tenant_name

DEFAULT_DB = "clawvm.db"


@click.group(cls=CliGroup)
@click.option(
    "--db",
    envvar="CLAWVM_DB",
    default=DEFAULT_DB,
    show_default=True,
    help="Store to use: a SQLite file path, sqlite:///ABS/PATH, memory:// or postgresql://... "
    "(env CLAWVM_DB).",
)
@click.option("--no-embed", is_flag=True, help="Do not load the embedding model (lexical recall only).")
@click.option(
    "--tenant",
    envvar="CLAWVM_TENANT",
    default=DEFAULT_TENANT,
    show_default=True,
    help="The tenant whose memories commands read and write (a server's tenants share one store).",
)
@click.option(
    "--redact/--no-redact",
    envvar="CLAWVM_REDACT",
    default=False,
    show_default=True,
    help="Redact personal data and secrets in what commands write, as serve and mcp do (env "
    "CLAWVM_REDACT=1): for a store a redacting server shares. Every write is redacted, so a command "
    "that writes a stored memory's bookkeeping (search --track, review) redacts it too.",
)
@click.option(
    "--pool-size", type=click.IntRange(min=1), default=None, help="PostgreSQL: connections per process."
)
@click.option(
    "--statement-timeout-ms", type=click.IntRange(min=1), default=None, help="PostgreSQL: statement timeout."
)
@click.version_option(package_name="clawvm")
@click.pass_context
def main(
    ctx: click.Context,
    db: str,
    no_embed: bool,
    tenant: str,
    redact: bool,
    pool_size: int | None,
    statement_timeout_ms: int | None,
) -> None:
    """ClawVM: harness-managed memory for LLM agents."""
    # the name of where the tenant came from: CLAWVM_TENANT's was blamed on a --tenant never given
    named = (
        "--tenant"
        if ctx.get_parameter_source("tenant") is not ParameterSource.ENVIRONMENT
        else "CLAWVM_TENANT"
    )
    if not tenant.strip():
        raise click.BadParameter(f"is blank: name a tenant, or leave {named} out", param_hint=named)
    if not is_tenant_name(tenant):  # the server's keys could never name it: refused before any store opens
        raise click.BadParameter(f"{tenant!r} is not a valid tenant name: {TENANT_FIX}", param_hint=named)
    given = {"pool_size": pool_size, "statement_timeout_ms": statement_timeout_ms}
    ctx.obj = {
        "db": _with_url_params(db, {k: v for k, v in given.items() if v is not None}),
        "no_embed": no_embed,
        "tenant": tenant,
        "redact": redact,
        # where the tenant came from: `keys create` mints for it when not told otherwise
        "tenant_source": ctx.get_parameter_source("tenant"),
    }


def _with_url_params(db: str, params: dict[str, int]) -> str:
    """``db`` with PostgreSQL store parameters added to its query string (options the CLI takes as flags)."""
    if not params:
        return db
    if not db.startswith(("postgresql://", "postgres://")):
        raise click.UsageError("--pool-size and --statement-timeout-ms apply to postgresql:// stores only")
    extra = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{db}{'&' if '?' in db else '?'}{extra}"


COMMANDS = (
    memories.add,
    memories.search,
    memories.list_,
    memories.show,
    memories.edit,
    memories.pin,
    memories.unpin,
    memories.forget,
    memories.export,
    memories.prune_events,
    memories.import_,
    memories.stats,
    checkpointing.checkpoint,
    checkpointing.checkpoints,
    checkpointing.rollback,
    serving.demo,
    serving.serve,
    serving.mcp_command,
    admin.keys,
    admin.review,
    admin.seed,
    admin.reindex,
    admin.migrate_command,
    replaying.replay,
)
for command in COMMANDS:
    main.add_command(command)
keys = admin.keys  # the key commands, as tests and scripts import them
