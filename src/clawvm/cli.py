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

from .errors import ClawVMError, ValidationError
from .harness import Harness
from .model import Memory

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
@click.version_option(package_name="clawvm")
@click.pass_context
def main(ctx: click.Context, db: str, no_embed: bool) -> None:
    """ClawVM: harness-managed memory for LLM agents."""
    ctx.obj = {"db": db, "no_embed": no_embed}


@main.command()
@click.argument("content")
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
    ctx: click.Context, /, content: str, json_content: bool, tags: tuple[str, ...], **fields: Any
) -> None:
    """Record CONTENT as a new memory and print its id."""
    payload: Any = content
    if json_content:
        try:
            payload = json.loads(content)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                "content", f"is not valid JSON ({exc.msg})", "drop --json-content or fix the JSON"
            ) from None
    with _opened(ctx) as h:
        m = h.record(payload, tags=list(tags), **{k: v for k, v in fields.items() if v is not None})
        click.echo(m.id)


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
@click.pass_context
def export(ctx: click.Context, out: Path | None, session_id: str | None) -> None:
    """Export memories as JSON Lines (one memory per line, lossless), oldest first."""
    with _opened(ctx, embed=False) as h:
        filters = h._filters({"status": "any", "session_id": session_id})
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
        n = h.import_memories(memories)
    click.echo(f"imported {n} memories ({len(memories) - n} already present)")


@main.command()
@click.pass_context
def stats(ctx: click.Context) -> None:
    """Counts by kind, status and tier, and how many memories still wait for an embedding."""
    with _opened(ctx, embed=False) as h:
        all_ = list(h.store.iter_all(h._filters({"status": "any"})))
        result = {
            "memories": len(all_),
            "by_kind": dict(Counter(m.kind.value for m in all_)),
            "by_status": dict(Counter(m.status.value for m in all_)),
            "by_tier": dict(Counter(m.tier.value for m in all_)),
            "sessions": len({m.session_id for m in all_ if m.session_id}),
            "unembedded": len(h.store.unembedded(10**9)),
            "events": len(h.events(limit=10**9)),
        }
        db = ctx.obj["db"]
        if "://" not in db and os.path.exists(db):
            result["file_bytes"] = os.path.getsize(db)
        click.echo(json.dumps(result, indent=2))


@main.command()
@click.option(
    "--locomo",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Also ingest LoCoMo conversations from this JSON file (evaluation data, not shipped).",
)
@click.option("--fresh/--keep", default=True, show_default=True, help="Start from an empty store file.")
@click.pass_context
def demo(ctx: click.Context, locomo: Path | None, fresh: bool) -> None:
    """Ingest the bundled ops-assistant workload and show recalls with their evidence."""
    from .demo import run_demo

    db = ctx.obj["db"]
    if fresh and "://" not in db:
        for suffix in ("", "-wal", "-shm"):
            Path(db + suffix).unlink(missing_ok=True)
    with _opened(ctx) as h:
        run_demo(h, echo=click.echo, locomo=locomo)
    click.echo(f"\nstore: {db}  (try: clawvm --db {db} search 'payment timeout')")


if __name__ == "__main__":  # pragma: no cover
    main()
