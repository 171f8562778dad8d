"""``clawvm`` command line: a thin shell over :class:`clawvm.Harness` on the embedded default store."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from clawvm.core.errors import ClawVMError, ConfigError, ValidationError
from clawvm.core.model import Kind, Memory, utcnow
from clawvm.harness import Harness
from clawvm.store import Store, store_from_url
from clawvm.store.crypto import KEY_ENV, KEY_FILE_ENV, DataKey, DataKeys, rotate_data_key
from clawvm.store.keys import Keyring, Role

DEFAULT_DB = "clawvm.db"


@contextmanager
def _opened(ctx: click.Context, embed: bool = True) -> Iterator[Harness]:
    db: str = ctx.obj["db"]
    harness = Harness.open(db, embedder="default" if embed and not ctx.obj["no_embed"] else None)
    try:
        yield harness
    finally:
        harness.close()


class _Group(click.Group):
    """Turns ClawVM errors into one clear line and exit code 2, instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClawVMError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.option(
    "--db",
    envvar="CLAWVM_DB",
    default=DEFAULT_DB,
    show_default=True,
    help="Store to use: a SQLite file path, sqlite:///PATH or memory:// (env CLAWVM_DB).",
)
@click.option("--no-embed", is_flag=True, help="Do not load the embedding model (lexical recall only).")
@click.option(
    "--pool-size", type=click.IntRange(min=1), default=None, help="PostgreSQL: connections per process."
)
@click.option(
    "--statement-timeout-ms", type=click.IntRange(min=1), default=None, help="PostgreSQL: statement timeout."
)
@click.version_option(package_name="clawvm")
@click.pass_context
def main(
    ctx: click.Context, db: str, no_embed: bool, pool_size: int | None, statement_timeout_ms: int | None
) -> None:
    """ClawVM: harness-managed memory for LLM agents."""
    given = {"pool_size": pool_size, "statement_timeout_ms": statement_timeout_ms}
    ctx.obj = {
        "db": _with_url_params(db, {k: v for k, v in given.items() if v is not None}),
        "no_embed": no_embed,
    }


def _with_url_params(db: str, params: dict[str, int]) -> str:
    """``db`` with PostgreSQL store parameters added to its query string (options the CLI takes as flags)."""
    if not params:
        return db
    if not db.startswith(("postgresql://", "postgres://")):
        raise click.UsageError("--pool-size and --statement-timeout-ms apply to postgresql:// stores only")
    extra = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{db}{'&' if '?' in db else '?'}{extra}"


@main.command()
@click.argument("content", required=False)
@click.option(
    "--file",
    "content_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the content from this file (UTF-8) instead of CONTENT.",
)
@click.option(
    "--kind", default="note", show_default=True, help="Memory kind, e.g. user_input, tool_result, decision."
)
@click.option("--state", default=None, help="pending, success, error or intermediate.")
@click.option("--session", "session_id", default=None, help="Session id.")
@click.option("--task", "task_id", default=None, help="Task id.")
@click.option("--agent", "agent_id", default=None, help="Agent id.")
@click.option("--tool", "tool_name", default=None, help="Tool name.")
@click.option("--tag", "tags", multiple=True, help="Tag (repeatable).")
@click.option("--json-content", is_flag=True, help="Parse CONTENT as JSON and store it as canonical JSON.")
@click.pass_context
def add(
    ctx: click.Context,
    /,
    content: str | None,
    content_file: Path | None,
    json_content: bool,
    tags: tuple[str, ...],
    **fields: Any,
) -> None:
    """Record CONTENT as a new memory and print its id (CONTENT "-" reads it from stdin)."""
    text = _content(content, content_file)
    payload: Any = text
    if json_content:
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                "content", f"is not valid JSON ({exc.msg})", "drop --json-content or fix the JSON"
            ) from None
    with _opened(ctx) as h:
        m = h.record(payload, tags=list(tags), **{k: v for k, v in fields.items() if v is not None})
        click.echo(m.id)


def _content(content: str | None, content_file: Path | None) -> str:
    """The text to record: CONTENT, stdin for "-", or the file given with --file (exactly one of them)."""
    if (content is None) == (content_file is None):
        raise ValidationError(
            "content", "must come from exactly one place", 'give CONTENT, "-" for stdin, or --file PATH'
        )
    if content_file is not None:
        try:
            return content_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError(
                "--file", f"{content_file} is not UTF-8 text ({exc.reason})", "record a text file"
            ) from None
    if content == "-":
        return sys.stdin.read()
    return str(content)


def _kind(value: str | None) -> Kind | None:
    """``--kind`` as a Kind, or the same one-line error (exit code 2) ``add`` gives for a wrong kind."""
    if value is None:
        return None
    try:
        return Kind(value)
    except ValueError:
        allowed = ", ".join(k.value for k in Kind)
        raise ValidationError("kind", f"is {value!r}", f"use one of {allowed}") from None


@main.command()
@click.argument("query")
@click.option("-k", default=5, show_default=True, help="How many memories to return.")
@click.option("--preset", default=None, help="Recall preset: hybrid (default), bm25 or dense.")
@click.option("--session", "session_id", default=None, help="Only this session.")
@click.option("--kind", default=None, help="Only this kind.")
@click.option(
    "--tag", "tags", multiple=True, help="Only memories with this tag (repeatable: all must match)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON Lines with scores and per-channel breakdown."
)
@click.pass_context
def search(
    ctx: click.Context,
    /,
    query: str,
    k: int,
    preset: str | None,
    as_json: bool,
    tags: tuple[str, ...],
    **filters: Any,
) -> None:
    """Hybrid recall: the K best memories for QUERY."""
    filters["kind"] = _kind(filters.get("kind"))
    given = {name: v for name, v in filters.items() if v is not None}
    if tags:
        given["tags"] = list(tags)
    with _opened(ctx) as h:
        for r in h.recall(query, k=k, preset=preset, **given):
            if as_json:
                explain = {
                    c: {"raw": s.raw, "normalized": s.normalized, "weight": s.weight, "rank": s.rank}
                    for c, s in r.explain.items()
                }
                click.echo(
                    json.dumps(
                        {
                            "id": r.id,
                            "score": r.score,
                            "explain": explain,
                            "memory": json.loads(r.memory.to_json()),
                        }
                    )
                )
            else:
                text = r.memory.content.replace("\n", " ")
                click.echo(f"{r.score:.3f}  {r.id}  [{r.memory.kind.value}] {text[:120]}")


@main.command()
@click.argument("memory_id")
@click.pass_context
def show(ctx: click.Context, memory_id: str) -> None:
    """Print one memory as JSON."""
    with _opened(ctx, embed=False) as h:
        click.echo(json.dumps(json.loads(h.get(memory_id).to_json()), indent=2, ensure_ascii=False))


@main.command()
@click.argument("memory_id")
@click.pass_context
def forget(ctx: click.Context, memory_id: str) -> None:
    """Delete one memory for good."""
    with _opened(ctx, embed=False) as h:
        h.forget(memory_id)
        click.echo(f"forgot {memory_id}")


@main.command()
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to this file instead of standard output.",
)
@click.option("--session", "session_id", default=None, help="Only this session.")
@click.option("--events", is_flag=True, help="Export the event log instead of the memories (MemLens).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "parquet"]),
    default="jsonl",
    show_default=True,
    help="parquet: with --events and --out (analytics extra); DuckDB queries: see clawvm.store.eventlog.",
)
@click.pass_context
def export(ctx: click.Context, out: Path | None, session_id: str | None, events: bool, fmt: str) -> None:
    """Export memories as JSON Lines (one memory per line, lossless), oldest first; or the event log."""
    if events or fmt == "parquet":
        _export_events(ctx, out, session_id, events, fmt)
        return
    with _opened(ctx, embed=False) as h:
        # a lossless backup: every status, the harness's internal records (team grants) included
        filters = h.filters({"session_id": session_id}).with_(status=None)
        stream = out.open("w", encoding="utf-8") if out else sys.stdout
        try:
            n = 0
            for m in h.store.iter_all(filters):
                stream.write(m.to_json() + "\n")
                n += 1
        finally:
            if out:
                stream.close()
        if out:
            click.echo(f"exported {n} memories to {out}", err=True)


def _export_events(
    ctx: click.Context, out: Path | None, session_id: str | None, events: bool, fmt: str
) -> None:
    from clawvm.store.eventlog import export_jsonl, export_parquet

    if not events or session_id is not None or (fmt == "parquet" and out is None):
        raise ValidationError(
            "format", "parquet exports the event log to a file", "use --events --format parquet -o FILE"
        )
    with _opened(ctx, embed=False) as h:
        if fmt == "parquet" and out is not None:
            n = export_parquet(h.store, out)
        else:
            stream = out.open("w", encoding="utf-8") if out else sys.stdout
            try:
                n = export_jsonl(h.store, stream)
            finally:
                if out:
                    stream.close()
    if out:
        click.echo(f"exported {n} events to {out}", err=True)


@main.command(name="prune-events")
@click.option("--max-age-days", type=float, default=None, help="Delete events older than this many days.")
@click.option("--max-events", type=int, default=None, help="Keep at most this many events (the newest).")
@click.pass_context
def prune_events(ctx: click.Context, max_age_days: float | None, max_events: int | None) -> None:
    """Event-log retention: delete the oldest events (learned scorer weights are kept); export first."""
    from clawvm.store.eventlog import Retention, prune

    with _opened(ctx, embed=False) as h:
        n = prune(h.store, Retention(max_age_days, max_events), h.now())
    click.echo(f"deleted {n} events")


@main.command(name="import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def import_(ctx: click.Context, path: Path) -> None:
    """Import a JSON Lines export. Every line is validated first: a bad file imports nothing."""
    memories: list[Memory] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                memories.append(Memory.from_json(raw))
            except ValidationError as exc:
                raise ValidationError(f"{path}:{lineno}: {exc.field}", exc.problem, exc.fix) from None
    with _opened(ctx) as h:
        n = h.import_memories(memories, restore=True)  # a backup of a store: grants and sealed originals too
    click.echo(f"imported {n} memories ({len(memories) - n} already present)")


@main.command()
@click.pass_context
def stats(ctx: click.Context) -> None:
    """Counts by kind, status and tier, and how many memories still wait for an embedding."""
    with _opened(ctx, embed=False) as h:
        kinds: Counter[str] = Counter()
        statuses: Counter[str] = Counter()
        tiers: Counter[str] = Counter()
        sessions: set[str] = set()
        unembedded = 0
        page: list[str] = []
        # one pass over the memories in keyset pages; whether each page's memories have vectors yet is
        # asked page by page
        for m in h.iter_all(status="any"):
            kinds[m.kind.value] += 1
            statuses[m.status.value] += 1
            tiers[m.tier.value] += 1
            if m.session_id:
                sessions.add(m.session_id)
            page.append(m.id)
            if len(page) == 500:
                unembedded += len(page) - len(h.store.vectors_of(page))
                page = []
        unembedded += len(page) - len(h.store.vectors_of(page))
        result = {
            "memories": kinds.total(),
            "by_kind": dict(kinds),
            "by_status": dict(statuses),
            "by_tier": dict(tiers),
            "sessions": len(sessions),
            "unembedded": unembedded,
            "events": _count_events(h),
        }
        db = ctx.obj["db"]
        if "://" not in db and os.path.exists(db):
            result["file_bytes"] = os.path.getsize(db)
        click.echo(json.dumps(result, indent=2))


def _count_events(h: Harness) -> int:
    """The event log's length, read in pages of a thousand."""
    n, after = 0, 0
    while page := h.events(after_seq=after, limit=1000):
        n += len(page)
        after = page[-1].seq or after
        if len(page) < 1000:
            break
    return n


@main.command()
@click.option(
    "--locomo",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Also ingest LoCoMo conversations from this JSON file (evaluation data, not shipped).",
)
@click.option(
    "--reset/--keep",
    default=None,
    help="Start from an empty store file (deleting it), or keep it. Default: the printing demo starts over; "
    "the dashboard demo keeps the store it finds (pins and edits made in the dashboard stay) and loads the "
    "demo only into an empty one.",
)
@click.option(
    "--dashboard",
    is_flag=True,
    help="Load the full MemLens demo (conversation, tool-using agent run, team run, manual actions) "
    "and serve the API and dashboard, printing the dashboard URL.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="With --dashboard: interface to use.")
@click.option("--port", default=8080, show_default=True, type=int, help="With --dashboard: TCP port.")
@click.pass_context
def demo(
    ctx: click.Context, locomo: Path | None, reset: bool | None, dashboard: bool, host: str, port: int
) -> None:
    """Ingest the bundled ops-assistant workload and show recalls with their evidence."""
    from clawvm.demo import run_demo
    from clawvm.demo.scenario import remove_store_file, serve_demo

    db = ctx.obj["db"]
    if dashboard:
        embed = not ctx.obj["no_embed"]
        serve_demo(db, host, port, embed=embed, locomo=locomo, echo=click.echo, reset=bool(reset))
        return
    if reset is not False:
        remove_store_file(db, asked=reset is True)
    with _opened(ctx) as h:
        run_demo(h, echo=click.echo, locomo=locomo)
    click.echo(f"\nstore: {db}  (try: clawvm --db {db} search 'payment timeout')")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8080, show_default=True, type=int, help="TCP port to listen on.")
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
    try:
        from clawvm.server import (
            ServerSettings,
            WorkerSpec,
            configure_logging,
            create_app,
            redaction_options,
            run_server,
            run_workers,
        )
    except ImportError as exc:
        missing = f"the server needs the 'server' extra ({exc}): pip install 'clawvm[server]'"
        raise ConfigError(missing) from None
    options = redaction_options(redact=redact, keep_originals=keep_originals)  # a missing key fails here
    configure_logging(log_level)
    settings = ServerSettings(
        max_body_bytes=max_body_bytes, rate_per_s=rate_limit, burst=burst, preset=preset
    )
    if workers > 1:
        if str(ctx.obj["db"]).startswith("memory:"):
            raise ConfigError("--workers > 1 needs a store the processes share: a file or a PostgreSQL URL")
        with _keyring(ctx) as keyring:  # migrated once here, before the workers open it
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


def _require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        missing = f"MCP needs the 'integrations' extra ({exc}): pip install 'clawvm[integrations]'"
        raise ConfigError(missing) from None


@main.command(name="mcp")
@click.option(
    "--session", "session_id", default=None, help="Default session of the tools (a call may pass its own)."
)
@click.option("--task", "task_id", default=None, help="Default task.")
@click.option("--agent", "agent_id", default=None, help="Default agent.")
@click.option("--tenant", default="default", show_default=True, help="Tenant of the memories.")
@click.option("--http", is_flag=True, help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --http: the address to listen on.")
@click.option("--port", default=8765, show_default=True, type=int, help="With --http: the port.")
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
    tenant: str,
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

    if http and host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        click.echo(
            f"warning: serving MCP on {host} without --api-key: anyone who reaches it may write", err=True
        )
    run(
        ctx.obj["db"],
        session_id=session_id,
        task_id=task_id,
        agent_id=agent_id,
        tenant=tenant,
        embedder=None if ctx.obj["no_embed"] else "default",
        redact=redact,
        keep_originals=keep_originals,
        http=http,
        host=host,
        port=port,
        api_key=api_key,
    )


@contextmanager
def _store(ctx: click.Context, dim: int = 384) -> Iterator[Store]:
    """The engine of ``--db`` itself (no harness: key and data-key commands work below it)."""
    store = store_from_url(ctx.obj["db"], dim=dim)
    store.setup()
    try:
        yield store
    finally:
        store.close()


@contextmanager
def _keyring(ctx: click.Context) -> Iterator[Keyring]:
    with _store(ctx) as store:
        yield Keyring(store)


@main.group(cls=_Group)
def keys() -> None:
    """API keys of the server: hashed, one tenant and one role each (kept in the store's credentials
    table, which prune-events never touches)."""


@keys.command("create")
@click.option("--tenant", required=True, help="Tenant the key reads and writes (letters, digits, . _ -).")
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
def keys_create(ctx: click.Context, tenant: str, role: str, name: str, ttl_s: float | None) -> None:
    """Create a key and print it (once: only its hash is stored)."""
    with _keyring(ctx) as ring:
        record, token = ring.create(tenant, role, name, ttl_s=ttl_s)
    click.echo(token)
    until = f", expires {record.expires_at.isoformat()}" if record.expires_at else ""
    click.echo(f"key {record.key_id} for tenant {tenant} ({role}{until}): shown once, store it now", err=True)


@keys.command("list")
@click.option("--tenant", default=None, help="Only this tenant's keys.")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked keys.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON Lines instead of a table.")
@click.pass_context
def keys_list(ctx: click.Context, tenant: str | None, include_revoked: bool, as_json: bool) -> None:
    """List keys (ids, tenants, roles; never the keys themselves)."""
    with _keyring(ctx) as ring:
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
    with _keyring(ctx) as ring:
        ring.revoke(key_id)
    click.echo(f"revoked {key_id}")


@keys.command("rotate")
@click.argument("key_id")
@click.pass_context
def keys_rotate(ctx: click.Context, key_id: str) -> None:
    """Replace KEY_ID by a new key of the same tenant, role and name; print the new key (once) and revoke
    the old one."""
    with _keyring(ctx) as ring:
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
    old = DataKeys.from_env({KEY_ENV: os.environ.get(KEY_ENV, ""), KEY_FILE_ENV: str(key_file or "")})
    if old is None:
        raise ConfigError(f"no data key to read the sealed originals: set {KEY_ENV} or pass --key-file")
    if new_key_file is not None:
        if not new_key_file.exists():
            DataKeys((DataKey.generate(),)).save(new_key_file)
        new = DataKeys.load(new_key_file).current
    elif key_file is not None:
        new = DataKey.generate()
        old.with_current(new).save(key_file)  # first, so that a run stopped halfway loses no key
    else:
        raise ConfigError("nowhere to keep the new key: pass --new-key-file PATH, or --key-file PATH")
    with _store(ctx) as store:
        report = rotate_data_key(store, old, new)
    if drop_old and key_file is not None and new_key_file is None:
        DataKeys((new,)).save(key_file)
    click.echo(
        f"re-encrypted {report.rekeyed} sealed originals under data key {report.kid} "
        f"({report.already} were under it already)"
    )
    if new_key_file is not None:
        click.echo(f"use the new key: {KEY_FILE_ENV}={new_key_file}", err=True)


@main.group(cls=_Group)
def review() -> None:
    """The review queue of team memories: low confidence, flagged, or open conflicts (clawvm.teams.shared)."""


@review.command("list")
@click.option(
    "--below", default=0.5, show_default=True, type=float, help="Confidence under which a memory waits."
)
@click.option("--team", "team_id", default=None, help="Only this team's memories.")
@click.option("--agent", "agent_id", default=None, help="Only what this agent may read.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON Lines (whole memories).")
@click.pass_context
def review_list(
    ctx: click.Context, below: float, team_id: str | None, agent_id: str | None, as_json: bool
) -> None:
    """List memories awaiting review, least trusted first."""
    with _opened(ctx, embed=False) as h:
        for m in h.review_queue(below=below, team_id=team_id, agent_id=agent_id):
            if as_json:
                click.echo(m.to_json())
            else:
                text = m.content.replace("\n", " ")
                click.echo(f"{m.id}  {m.confidence:.2f}  [{m.kind.value}] {text[:100]}")


@review.command("approve")
@click.argument("memory_id")
@click.option("--by", default=None, help="Who approves (kept with the review).")
@click.pass_context
def review_approve(ctx: click.Context, memory_id: str, by: str | None) -> None:
    """Approve MEMORY_ID (an open conflict: close it, keeping both sides)."""
    with _opened(ctx, embed=False) as h:
        h.approve(memory_id, by=by)
    click.echo(f"approved {memory_id}")


@review.command("reject")
@click.argument("memory_id")
@click.option("--by", default=None, help="Who rejects (kept with the review).")
@click.option("--reason", default=None, help="Why (kept with the review).")
@click.pass_context
def review_reject(ctx: click.Context, memory_id: str, by: str | None, reason: str | None) -> None:
    """Reject MEMORY_ID: it becomes obsolete (kept for history) and its open conflicts close."""
    with _opened(ctx, embed=False) as h:
        h.reject(memory_id, by=by, reason=reason)
    click.echo(f"rejected {memory_id}")


@main.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def seed(ctx: click.Context, path: Path) -> None:
    """Import team seed knowledge and rule templates from a YAML or JSON file (see clawvm.teams.seed)."""
    from clawvm.teams.seed import import_seed

    with _opened(ctx) as h:
        report = import_seed(h, path)
    click.echo(f"imported {report.imported} ({report.memories} memories, {report.rules} rules in the file)")


@main.command()
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
    from clawvm.store.postgres import HnswParams, PostgresStore

    with _store(ctx, dim) as store:
        if not isinstance(store, PostgresStore):
            raise click.UsageError("reindex rebuilds PostgreSQL's HNSW index: pass --db postgresql://...")
        current = store.vector_index_params() or HnswParams()
        store.hnsw = HnswParams(m=m or current.m, ef_construction=ef_construction or current.ef_construction)
        took = store.build_vector_index(memory_mb=memory_mb)
    params = store.hnsw
    click.echo(
        f"rebuilt the HNSW index (m={params.m}, ef_construction={params.ef_construction}) in {took:.1f} s"
    )


@main.command(name="migrate")
@click.option(
    "--from", "source", required=True, help="Store to copy: sqlite:///PATH, postgresql://... or a path."
)
@click.option("--to", "target", required=True, help="Empty store to copy into (any engine).")
@click.option("--batch", default=500, show_default=True, help="Memories per write.")
@click.option("--dim", default=384, show_default=True, help="Vector dimension of both stores.")
@click.option("--no-verify", is_flag=True, help="Skip the verification (counts, checksums, vectors).")
def migrate_command(source: str, target: str, batch: int, dim: int, no_verify: bool) -> None:
    """Copy every memory, vector and event into an empty store, then verify the copy."""
    from clawvm.store.migrate import migrate

    src, dst = store_from_url(source, dim=dim), store_from_url(target, dim=dim)
    src.setup()
    try:
        dst.setup()
        try:
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


@main.command()
@click.argument("session_id", required=False)
@click.option("--demo", is_flag=True, help="Replay the demo workload (built in memory) instead of --db.")
@click.option(
    "--locomo",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Replay a LoCoMo conversation of this file (SESSION: its sample id, default the first), built in "
    "memory with a context build per question.",
)
@click.option("--budget", type=int, default=None, help="B: this context budget for every build.")
@click.option("--working-items", type=int, default=None, help="B: the working tier's item budget.")
@click.option("--working-tokens", type=int, default=None, help="B: the working tier's token budget.")
@click.option("--weight", "weights", multiple=True, help="B: a scoring weight NAME=VALUE (repeatable).")
@click.option(
    "--reach",
    type=click.Choice(["tenant", "session"]),
    default="tenant",
    show_default=True,
    help="Replay every memory recorded up to the session's last build, or the session's own.",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Also write JSON.")
@click.pass_context
def replay(
    ctx: click.Context,
    session_id: str | None,
    demo: bool,
    locomo: Path | None,
    budget: int | None,
    working_items: int | None,
    working_tokens: int | None,
    weights: tuple[str, ...],
    reach: str,
    json_path: Path | None,
) -> None:
    """What-if: replay SESSION's context builds under the current policy (A) and a changed one (B).

    Prints, per build, the lines B adds and drops and the needed memories each kept, then the totals:
    tokens, evidence kept, eviction regret, working-tier hit rate. Reads the store, never writes it."""
    import clawvm.replay as whatif

    changes = dict(_weight(w) for w in weights)
    with _replay_source(ctx, demo, locomo, session_id) as (h, default_session):
        session = session_id or default_session
        if session is None:
            raise ValidationError("session_id", "is missing", "name the session to replay (or pass --demo)")
        b = whatif.variant(
            h.pager.config, working_items=working_items, working_tokens=working_tokens, weights=changes
        )
        report = whatif.replay(
            h,
            session,
            whatif.Policy("current", h.pager.config),
            whatif.Policy("changed", b, context_budget=budget),
            reach="session" if reach == "session" else "tenant",
        )
    click.echo(whatif.format_report(report))
    if budget is None and working_items is None and working_tokens is None and not changes:
        click.echo(
            "(B is the current policy: pass --budget, --working-items, --working-tokens or --weight "
            "to compare)"
        )
    if json_path is not None:
        json_path.write_text(json.dumps(report.as_dict(), indent=2))


def _weight(text: str) -> tuple[str, float]:
    name, _, number = text.partition("=")
    try:
        return name.strip(), float(number)
    except ValueError:
        raise ValidationError(
            "weight", f"{text!r} is not NAME=NUMBER", "e.g. --weight cite_weight=0.3"
        ) from None


@contextmanager
def _replay_source(
    ctx: click.Context, demo: bool, locomo: Path | None = None, session_id: str | None = None
) -> Iterator[tuple[Harness, str | None]]:
    if locomo is not None:
        with _locomo_source(ctx, locomo, session_id) as found:
            yield found
        return
    if not demo:
        with _opened(ctx) as h:
            yield h, None
        return
    from clawvm.demo.scenario import ReplayClock, load_scenario, open_demo

    clock = ReplayClock()
    h = open_demo(store_from_url("memory://"), clock, not ctx.obj["no_embed"])
    try:
        load_scenario(h, clock, lambda line: None)
        yield h, "s5"
    finally:
        h.close()


@contextmanager
def _locomo_source(ctx: click.Context, path: Path, sample_id: str | None) -> Iterator[tuple[Harness, str]]:
    """One LoCoMo conversation recorded into a store in memory, on its own calendar, as the demo's pager
    would page it: its turns, then a context build per question answered citing the evidence it held."""
    from clawvm.demo import LOCOMO_START, ingest_locomo_conversation, load_locomo
    from clawvm.demo.scenario import ReplayClock, open_demo

    samples = load_locomo(path)
    chosen = next((s for s in samples if sample_id in (None, s["sample_id"])), None)
    if chosen is None:
        known = ", ".join(str(s["sample_id"]) for s in samples)
        raise ValidationError(
            "session_id", f"{sample_id!r} is no conversation of {path}", f"pick one of {known}"
        )
    clock = ReplayClock(LOCOMO_START)  # the conversation's calendar: its sessions lie weeks apart
    h = open_demo(store_from_url("memory://"), clock, not ctx.obj["no_embed"])
    try:
        done = ingest_locomo_conversation(h, chosen, on_time=clock.at)
        yield h, done.session_id
    finally:
        h.close()


if __name__ == "__main__":  # pragma: no cover
    main()
