"""Commands that serve: the demo, the HTTP server (and dashboard), the MCP server."""

from __future__ import annotations

from pathlib import Path

import click

from clawvm.cli.common import named, opened_harness, opened_keyring, tenant_named
from clawvm.core.errors import ConfigError
from clawvm.core.model import DEFAULT_TENANT
from clawvm.store.keys import Keyring

#: a TCP port (0: any free one); click's plain int let 99999 through, which the socket took as 34463
_PORT = click.IntRange(0, 65535)
#: the demo prints its dashboard's URL once the port answers: port 0 (any free one) never did, and the URL
#: and its key were never printed
_NAMED_PORT = click.IntRange(1, 65535)


@click.command()
@click.option(
    "--locomo",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Also ingest LoCoMo conversations from this JSON file (evaluation data, not shipped).",
)
@click.option(
    "--reset/--keep",
    default=None,
    help="Start from an empty store file (deleting it), or keep it. Default: the printing demo starts over "
    "(on its own store only: one with other memories or API keys is refused); the dashboard demo keeps the "
    "store it finds (pins and edits made in the dashboard stay) and loads the demo only into an empty one.",
)
@click.option(
    "--dashboard",
    is_flag=True,
    help="Load the full MemLens demo (conversation, tool-using agent run, team run, manual actions) "
    "and serve the API and dashboard, printing the dashboard URL.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="With --dashboard: interface to use.")
@click.option(
    "--port", default=8080, show_default=True, type=_NAMED_PORT, help="With --dashboard: TCP port (1-65535)."
)
@click.pass_context
def demo(
    ctx: click.Context, locomo: Path | None, reset: bool | None, dashboard: bool, host: str, port: int
) -> None:
    """Ingest the bundled ops-assistant workload and show recalls with their evidence."""
    from clawvm.demo import run_demo
    from clawvm.demo.scenario import holds_only_a_demo, remove_store_file, serve_demo

    db = ctx.obj["db"]
    if dashboard:
        _require_server()
        embed = not ctx.obj["no_embed"]
        serve_demo(db, host, port, embed=embed, locomo=locomo, echo=click.echo, reset=bool(reset))
        return
    if reset is None and not holds_only_a_demo(db):  # it starts over: never over a store of the user's
        raise ConfigError(
            f"db: {db} holds memories or API keys of its own; the demo starts from an empty store: pass "
            "another --db (clawvm --db demo.db demo), or --reset to delete this one"
        )
    if reset is not False:
        remove_store_file(db, asked=reset is True)
    with opened_harness(ctx) as h:
        run_demo(h, echo=click.echo, locomo=locomo)
    click.echo(f"\nstore: {db}  (try: clawvm --db {db} search 'payment timeout')")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8080, show_default=True, type=_PORT, help="TCP port to listen on.")
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Server processes on the one store and port (about one per core; a file or PostgreSQL store).",
)
@click.option(
    "--rate-limit",
    default=50.0,
    show_default=True,
    type=float,
    help="Requests per second per API key, sustained (0: no limit).",
)
@click.option("--burst", default=100, show_default=True, type=int, help="Requests per key allowed at once.")
@click.option(
    "--max-body-bytes",
    default=2 * 1024 * 1024,
    show_default=True,
    type=int,
    help="Largest request body accepted (larger: 413).",
)
@click.option("--preset", default=None, help="Default recall preset (hybrid, bm25, dense, ...).")
@click.option(
    "--create-admin-key",
    "admin_tenant",
    default=None,
    metavar="TENANT",
    help="At start, create an admin key for TENANT and print it once (handy with memory://).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Level of the JSON log lines (stderr).",
)
@click.option(
    "--redact/--no-redact",
    default=True,
    show_default=True,
    help="Redact personal data and secrets (emails, cards, keys ...) in new content before it is stored "
    "(clawvm.core.redact's default policy, every tenant).",
)
@click.option(
    "--keep-originals",
    is_flag=True,
    help="With --redact: keep each original sealed with the data key (CLAWVM_DATA_KEY or "
    "CLAWVM_DATA_KEY_FILE); admin keys read it at GET /v1/memories/{id}/original.",
)
@click.option(
    "--mcp",
    is_flag=True,
    help="Also serve MCP (streamable HTTP) at /mcp, behind the same API keys and tenants "
    "(needs the 'integrations' extra).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    workers: int,
    rate_limit: float,
    burst: int,
    max_body_bytes: int,
    preset: str | None,
    admin_tenant: str | None,
    log_level: str,
    redact: bool,
    keep_originals: bool,
    mcp: bool,
) -> None:
    """Run the REST API over the store: API keys, tenants, limits; OpenAPI at /docs and /openapi.json."""
    _require_server()
    from clawvm.server import (
        ServerSettings,
        WorkerSpec,
        configure_logging,
        create_app,
        redaction_options,
        run_server,
        run_workers,
    )

    options = redaction_options(redact=redact, keep_originals=keep_originals)  # a missing key fails here
    from clawvm.demo.scenario import check_port_free

    check_port_free(host, port, again="clawvm serve --port {port}")  # not a traceback later
    configure_logging(log_level)
    settings = ServerSettings(
        max_body_bytes=max_body_bytes, rate_per_s=rate_limit, burst=burst, preset=preset
    )
    if workers > 1:
        if str(ctx.obj["db"]).startswith("memory:"):
            raise ConfigError("--workers > 1 needs a store the processes share: a file or a PostgreSQL URL")
        with opened_keyring(ctx) as keyring:  # migrated once here, before the workers open it
            _admin_key_note(keyring, admin_tenant)
        spec = WorkerSpec(
            str(ctx.obj["db"]),
            settings,
            embed=not ctx.obj["no_embed"],
            redact=redact,
            keep_originals=keep_originals,
            log_level=log_level,
            mcp=mcp,
        )
        if mcp:
            _require_mcp()
        run_workers(spec, workers, host, port)
        return
    embedder = None if ctx.obj["no_embed"] else "default"
    if mcp:
        _require_mcp()
    app = create_app(ctx.obj["db"], embedder=embedder, settings=settings, harness_options=options, mcp=mcp)
    _admin_key_note(app.state.service.keyring, admin_tenant)
    run_server(app, host, port)


def _admin_key_note(keyring: Keyring, admin_tenant: str | None) -> None:
    """``serve --create-admin-key``: create the key and print it once; else say when there is no key."""
    if admin_tenant:
        record, token = keyring.create(admin_tenant, "admin", "created by clawvm serve")
        click.echo(f"admin key {record.key_id} for tenant {admin_tenant} (shown once): {token}", err=True)
    elif not keyring.list():
        click.echo("no API keys yet: clawvm keys create --tenant NAME --role admin", err=True)


def _require_server() -> None:
    """The server's optional dependencies, or one line saying how to install them."""
    try:
        import clawvm.server  # noqa: F401
    except ImportError as exc:
        missing = f"the server needs the 'server' extra ({exc}): pip install 'clawvm[server]'"
        raise ConfigError(missing) from None


def _require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        missing = f"MCP needs the 'integrations' extra ({exc}): pip install 'clawvm[integrations]'"
        raise ConfigError(missing) from None


@click.command(name="mcp")
@click.option(
    "--session",
    "session_id",
    default=None,
    callback=named("session"),
    help="Default session of the tools (a call may pass its own).",
)
@click.option("--task", "task_id", default=None, callback=named("task"), help="Default task.")
@click.option("--agent", "agent_id", default=None, callback=named("agent"), help="Default agent.")
@click.option(
    "--tenant",
    default=None,
    callback=tenant_named,
    help="Tenant of the memories (default: clawvm's --tenant).",
)
@click.option("--http", is_flag=True, help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --http: the address to listen on.")
@click.option("--port", default=8765, show_default=True, type=_PORT, help="With --http: the port.")
@click.option(
    "--api-key",
    envvar="CLAWVM_MCP_API_KEY",
    default=None,
    help="With --http: the Bearer key every request must send (env CLAWVM_MCP_API_KEY). For API keys per "
    "tenant use clawvm serve --mcp.",
)
@click.option(
    "--redact/--no-redact", default=True, show_default=True, help="Redact new content, as serve does."
)
@click.option(
    "--keep-originals", is_flag=True, help="With --redact: keep each original sealed with the data key."
)
@click.pass_context
def mcp_command(
    ctx: click.Context,
    session_id: str | None,
    task_id: str | None,
    agent_id: str | None,
    tenant: str | None,
    http: bool,
    host: str,
    port: int,
    api_key: str | None,
    redact: bool,
    keep_originals: bool,
) -> None:
    """Serve the memory to MCP clients: tools, resources and instructions, over stdio (default) or HTTP."""
    _require_mcp()
    from clawvm.integrations.mcp_server import run

    if http:
        from clawvm.demo.scenario import check_port_free

        check_port_free(host, port, again="clawvm mcp --http --port {port}")
        where = f"http://{host}:{port}/mcp" if port else f"/mcp on the port uvicorn names below ({host})"
        auth = "with --api-key as the Bearer token" if api_key else "no API key"
        click.echo(f"MCP over HTTP at {where}, {auth}; Ctrl-C stops it", err=True)
    if http and host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        click.echo(
            f"warning: serving MCP on {host} without --api-key: anyone who reaches it may write", err=True
        )
    run(
        ctx.obj["db"],
        session_id=session_id,
        task_id=task_id,
        agent_id=agent_id,
        tenant=tenant or ctx.obj.get("tenant", DEFAULT_TENANT),
        embedder=None if ctx.obj["no_embed"] else "default",
        redact=redact,
        keep_originals=keep_originals,
        http=http,
        host=host,
        port=port,
        api_key=api_key,
    )
