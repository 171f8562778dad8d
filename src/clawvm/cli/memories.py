"""Commands over the memories themselves: add, search, list, show, edit, pin, unpin, forget, export, import,
prune-events, stats."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import IO, Any

import click

from clawvm.cli.common import (
    REPEATED_KEY,
    named,
    opened_harness,
    opened_store,
    plural,
    refuse_store_as_output,
)
from clawvm.core.errors import ValidationError
from clawvm.core.jsonkeys import repeated_key
from clawvm.core.model import (
    DEFAULT_TENANT,
    DEPTH_FIX,
    MAX_JSON_DEPTH,
    STATUS_CHOICES,
    VISIBLE_STATUSES,
    Kind,
    Memory,
    Status,
    Tier,
    utcnow,
)
from clawvm.harness import Harness
from clawvm.recall.retrieval import PRESETS, dense_only
from clawvm.store.base import GroupKey, Query
from clawvm.store.eventlog import MAX_AGE_DAYS


@click.command()
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
@click.option("--session", "session_id", default=None, callback=named("session"), help="Session id.")
@click.option("--task", "task_id", default=None, callback=named("task"), help="Task id.")
@click.option("--agent", "agent_id", default=None, callback=named("agent"), help="Agent id.")
@click.option("--tool", "tool_name", default=None, callback=named("tool"), help="Tool name.")
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
    payload = _payload(_content(content, content_file), json_content)
    with opened_harness(ctx) as h:
        m = h.record(payload, tags=list(tags), **{k: v for k, v in fields.items() if v is not None})
        click.echo(m.id)


def _payload(text: str, json_content: bool) -> Any:
    """What to store for ``text``: itself, or with ``--json-content`` the JSON object or array it holds."""
    payload: Any = text
    if json_content:
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                "content", f"is not valid JSON ({exc.msg})", "drop --json-content or fix the JSON"
            ) from None
        except RecursionError:  # deeper than the decoder's stack: refused as a shallower too-deep value is
            raise ValidationError(
                "content",
                f"is nested deeper than {MAX_JSON_DEPTH} levels",
                f"{DEPTH_FIX}, or pass it as text",
            ) from None
        if (key := repeated_key(text)) is not None:  # {"a": 1, "a": 2} was stored as {"a": 2}
            raise ValidationError(f"content.{key}", *REPEATED_KEY)
        if not isinstance(payload, dict | list):  # a JSON string was stored as text, a number refused oddly
            kind = "string" if isinstance(payload, str) else type(payload).__name__
            raise ValidationError(
                "content",
                f"is a JSON {kind}, not an object or array",
                "drop --json-content to store it as text, or wrap it in an object or array",
            )
    return payload


def _content(content: str | None, content_file: Path | None) -> str:
    """The text to record: CONTENT, stdin for "-", or the file given with --file (exactly one of them)."""
    if (content is None) == (content_file is None):
        raise ValidationError(
            "content", "must come from exactly one place", 'give CONTENT, "-" for stdin, or --file PATH'
        )
    if content_file is not None:
        return _utf8_text(content_file.read_bytes(), "--file", str(content_file), "record a text file")
    if content == "-":  # read as bytes: decoded by the locale, bad bytes came out as "unpaired surrogates"
        return _utf8_text(sys.stdin.buffer.read(), "content", "stdin", "pipe UTF-8 text")
    return str(content)


def _utf8_text(data: bytes, field: str, source: str, fix: str) -> str:
    """``data`` as UTF-8 text, without an editor's byte-order mark or the break that ends its last line."""
    try:
        return _last_line_ended(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ValidationError(field, f"{source} is not UTF-8 text ({exc.reason})", fix) from None


def _last_line_ended(text: str) -> str:
    """``text`` without the line break that ends its last line (``echo``'s, an editor's): it ends the
    line, it is not part of the memory."""
    return text.removesuffix("\n").removesuffix("\r")


def _kind(value: str | None) -> Kind | None:
    """``--kind`` as a Kind, or the same one-line error (exit code 2) ``add`` gives for a wrong kind."""
    if value is None:
        return None
    try:
        return Kind(value)
    except ValueError:
        allowed = ", ".join(k.value for k in Kind)
        raise ValidationError("kind", f"is {value!r}", f"use one of {allowed}") from None


@click.command()
@click.argument("query")
@click.option("-k", default=5, show_default=True, help="How many memories to return.")
@click.option(
    "--preset",
    type=click.Choice(sorted(PRESETS)),
    default=None,
    help="Recall preset (default: hybrid; docs/recall.md compares them).",
)
@click.option("--session", "session_id", default=None, callback=named("session"), help="Only this session.")
@click.option("--kind", default=None, help="Only this kind.")
@click.option(
    "--tag", "tags", multiple=True, help="Only memories with this tag (repeatable: all must match)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON Lines with scores and per-channel breakdown."
)
@click.option(
    "--track",
    is_flag=True,
    help="Count the search as an access to what it returns, as an agent's recall is (it may promote "
    "them). Without it the store is left as it was.",
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
    track: bool,
    **filters: Any,
) -> None:
    """Hybrid recall: the K best memories for QUERY (a person's look: read-only unless --track)."""
    filters["kind"] = _kind(filters.get("kind"))
    given = {name: v for name, v in filters.items() if v is not None}
    if tags:
        given["tags"] = list(tags)
    if preset is not None and ctx.obj["no_embed"] and dense_only(PRESETS[preset]):
        raise click.UsageError(  # it found nothing, always, without a word
            f"--preset {preset} searches by embedding only, which --no-embed turns off: drop --no-embed, or "
            "use --preset hybrid or bm25"
        )
    with opened_harness(ctx, existing=True) as h:
        for r in h.recall(query, k=k, preset=preset, track=track, **given):
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


@click.command()
@click.argument("memory_id")
@click.pass_context
def show(ctx: click.Context, memory_id: str) -> None:
    """Print one memory as JSON."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        click.echo(json.dumps(json.loads(h.get(memory_id).to_json()), indent=2, ensure_ascii=False))


@click.command()
@click.argument("memory_id")
@click.option(
    "--expected-version",
    type=click.IntRange(min=1),
    default=None,
    help="The version you read (show): a memory changed since is kept, and the command fails.",
)
@click.pass_context
def forget(ctx: click.Context, memory_id: str, expected_version: int | None) -> None:
    """Delete one memory for good."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        h.forget(memory_id, expected_version=expected_version)
        click.echo(f"forgot {memory_id}")


#: The statuses an edit may set (expired only a TTL sets, internal only the harness)
_WRITABLE_STATUSES = (Status.ACTIVE.value, Status.ARCHIVED.value, Status.OBSOLETE.value)


@click.command()
@click.argument("memory_id", metavar="ID", callback=named("memory"))
@click.option("--content", default=None, help='The new content ("-" reads it from stdin).')
@click.option(
    "--file",
    "content_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the new content from this file (UTF-8) instead of --content.",
)
@click.option("--json-content", is_flag=True, help="Parse the new content as JSON (an object or array).")
@click.option("--kind", default=None, help="The new kind, e.g. decision, error, knowledge.")
@click.option("--state", default=None, help="The new state: pending, success, error or intermediate.")
@click.option(
    "--status", default=None, help="The new status: active, archived (put away, reversibly) or obsolete."
)
@click.option("--session", "session_id", default=None, callback=named("session"), help="The new session id.")
@click.option("--task", "task_id", default=None, callback=named("task"), help="The new task id.")
@click.option("--agent", "agent_id", default=None, callback=named("agent"), help="The new agent id.")
@click.option("--tool", "tool_name", default=None, callback=named("tool"), help="The new tool name.")
@click.option("--tag", "tags", multiple=True, help="Tag (repeatable): these replace the memory's tags.")
@click.option("--no-tags", is_flag=True, help="Remove every tag of the memory.")
@click.option(
    "--confidence", type=click.FloatRange(0.0, 1.0), default=None, help="The new confidence, 0 to 1."
)
@click.option(
    "--expected-version",
    type=click.IntRange(min=1),
    default=None,
    help="The version you read (show): a memory changed since is kept as it is, and the command fails.",
)
@click.pass_context
def edit(
    ctx: click.Context,
    /,
    memory_id: str,
    content: str | None,
    content_file: Path | None,
    json_content: bool,
    tags: tuple[str, ...],
    no_tags: bool,
    expected_version: int | None,
    **fields: Any,
) -> None:
    """Change fields of memory ID: only those given change, and its version grows by one."""
    changes = {name: v for name, v in fields.items() if v is not None}
    if "status" in changes and changes["status"] not in (*_WRITABLE_STATUSES, Status.EXPIRED.value):
        # (expired is the library's to refuse: it says what to do instead)
        raise ValidationError(
            "--status", f"is {changes['status']!r}", f"use one of {', '.join(_WRITABLE_STATUSES)}"
        )
    if tags and no_tags:
        raise ValidationError(
            "--tag", "is given with --no-tags", "give the new tags, or --no-tags to remove all"
        )
    if tags or no_tags:
        changes["tags"] = list(tags)
    if content is not None and content_file is not None:
        raise ValidationError("content", "must come from one place", "give --content or --file, not both")
    if content is not None or content_file is not None:
        changes["content"] = _payload(_content(content, content_file), json_content)
    elif json_content:
        raise ValidationError("--json-content", "is given without new content", "give --content or --file")
    if not changes:
        raise ValidationError(
            "edit",
            "changes nothing",
            "give what to change: --content, --kind, --status, --tag ...; `clawvm edit --help` lists them",
        )
    with opened_harness(ctx, embed="content" in changes, existing=True, backlog=True) as h:
        before = h.get(memory_id).version
        m = h.update(memory_id, expected_version=expected_version, **changes)
        if m.version == before:
            click.echo(f"{m.id} already held those values: nothing changed (version {m.version})")
        else:
            click.echo(f"updated {m.id} (version {m.version})")


@click.command()
@click.argument("memory_id", metavar="ID", callback=named("memory"))
@click.pass_context
def pin(ctx: click.Context, memory_id: str) -> None:
    """Keep memory ID in the working tier (and in every context of its session) until unpinned."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        before = h.get(memory_id).version
        m = h.pin(memory_id)
        click.echo(f"pinned {m.id}" if m.version != before else f"{m.id} was already pinned: nothing changed")


@click.command()
@click.argument("memory_id", metavar="ID", callback=named("memory"))
@click.pass_context
def unpin(ctx: click.Context, memory_id: str) -> None:
    """Let memory ID go: the pager moves it between tiers by its value again."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        before = h.get(memory_id).version
        m = h.unpin(memory_id)
        click.echo(f"unpinned {m.id}" if m.version != before else f"{m.id} was not pinned: nothing changed")


@click.command(name="list")
@click.option("--session", "session_id", default=None, callback=named("session"), help="Only this session.")
@click.option("--task", "task_id", default=None, callback=named("task"), help="Only this task.")
@click.option("--agent", "agent_id", default=None, callback=named("agent"), help="Only this agent.")
@click.option("--kind", default=None, help="Only this kind.")
@click.option(
    "--status",
    default="active",
    show_default=True,
    help=f"Only this status: {', '.join(STATUS_CHOICES)} (every status).",
)
@click.option(
    "--tag", "tags", multiple=True, help="Only memories with this tag (repeatable: all must match)."
)
@click.option("--pinned", is_flag=True, help="Only pinned memories.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many to print at most."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON Lines, one memory per line, as export does."
)
@click.pass_context
def list_(
    ctx: click.Context,
    /,
    limit: int,
    tags: tuple[str, ...],
    pinned: bool,
    as_json: bool,
    **filters: Any,
) -> None:
    """The newest memories, filtered (no query: search ranks by a query, export writes them all)."""
    filters["kind"] = _kind(filters.get("kind"))
    given = {name: v for name, v in filters.items() if v is not None}
    if tags:
        given["tags"] = list(tags)
    if pinned:
        given["pinned"] = True
    with opened_harness(ctx, embed=False, existing=True) as h:
        for m in h.list(limit=limit, **given):
            if as_json:
                click.echo(m.to_json())
                continue
            marks = [m.kind.value, *([m.status.value] if m.status is not Status.ACTIVE else [])]
            marks += ["pinned"] if m.pinned else []
            text = m.content.replace("\n", " ")
            click.echo(f"{m.id}  {m.created_at:%Y-%m-%d %H:%M}  [{', '.join(marks)}] {text[:120]}")


@click.command()
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to this file instead of standard output.",
)
@click.option("--session", "session_id", default=None, callback=named("session"), help="Only this session.")
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
    refuse_store_as_output(ctx.obj["db"], out, "--out")  # before the store opens: -o clawvm.db emptied it
    if events or fmt == "parquet":
        _export_events(ctx, out, session_id, events, fmt)
        return
    with opened_harness(ctx, embed=False, existing=True) as h:
        # a lossless backup: every status, the harness's internal records (team grants) included
        # (its memories past their expiry too, which reading "active" by default would leave out)
        filters = h.filters({"session_id": session_id}).with_(status=None, live_at=None)
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
            click.echo(f"exported {plural(n, 'memory', 'memories')} to {out}", err=True)


def _export_events(
    ctx: click.Context, out: Path | None, session_id: str | None, events: bool, fmt: str
) -> None:
    from clawvm.store.eventlog import export_jsonl, export_parquet

    if not events or session_id is not None or (fmt == "parquet" and out is None):
        raise ValidationError(
            "format", "parquet exports the event log to a file", "use --events --format parquet -o FILE"
        )
    with opened_harness(ctx, embed=False, existing=True) as h:
        # the tenant's own, as the memories export is (every tenant's events went out with --tenant acme)
        if fmt == "parquet" and out is not None:
            n = export_parquet(h.store, out, tenant=h.tenant)
        else:
            stream = out.open("w", encoding="utf-8") if out else sys.stdout
            try:
                n = export_jsonl(h.store, stream, tenant=h.tenant)
            finally:
                if out:
                    stream.close()
    if out:
        click.echo(f"exported {plural(n, 'event')} to {out}", err=True)


@click.command(name="prune-events")
@click.option(
    "--max-age-days",
    type=click.FloatRange(min=0, max=MAX_AGE_DAYS),
    default=None,
    help="Delete events older than this many days.",
)
@click.option(
    "--max-events",
    type=click.IntRange(min=0),
    default=None,
    help="Keep at most this many events (the newest), besides the prune notes and the carried weights.",
)
@click.pass_context
def prune_events(ctx: click.Context, max_age_days: float | None, max_events: int | None) -> None:
    """Event-log retention: delete the oldest events (learned scorer weights are kept); export first."""
    from clawvm.store.eventlog import Retention, prune

    if (tenant := ctx.obj.get("tenant", DEFAULT_TENANT)) != DEFAULT_TENANT:  # named both: it may be the env's
        raise click.UsageError(
            f"prune-events works on the whole log, every tenant's, and tenant {tenant!r} is set: run it "
            "without --tenant and without CLAWVM_TENANT"
        )
    try:
        retention = Retention(max_age_days, max_events)
    except ValidationError as exc:  # nan, which no range refuses: named as the option
        raise ValidationError(f"--{exc.field.replace('_', '-')}", exc.problem, exc.fix) from None
    with opened_store(ctx, existing=True) as store:  # retention works below the write path, on the log
        n = prune(store, retention, utcnow())
    click.echo(f"deleted {plural(n, 'event')}")


@click.command(name="import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path))
@click.pass_context
def import_(ctx: click.Context, path: Path) -> None:
    """Import a JSON Lines export (PATH "-" reads it from stdin, as `add -` does). Every line is validated
    first: a bad file imports nothing."""
    memories: list[Memory] = []
    line_of: dict[str, int] = {}  # id -> the line that holds it
    source: contextlib.AbstractContextManager[IO[bytes]]
    if str(path) == "-":  # left open: stdin is not this command's to close
        source, path = contextlib.nullcontext(sys.stdin.buffer), Path("<stdin>")
    else:
        source = path.open("rb")
    with source as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            if (key := repeated_key(raw)) is not None:  # the last value was imported, the others dropped
                raise ValidationError(f"{path}:{lineno}: {key}", *REPEATED_KEY)
            try:
                memory = Memory.from_json(raw)
            except ValidationError as exc:
                raise ValidationError(f"{path}:{lineno}: {exc.field}", exc.problem, exc.fix) from None
            if (first := line_of.setdefault(memory.id, lineno)) != lineno:
                raise ValidationError(
                    f"{path}:{lineno}: id", f"repeats the id of line {first}", "keep one line per memory"
                )
            memories.append(memory)
    with opened_harness(ctx) as h:
        # a backup of a store: grants and sealed originals too
        try:
            done = h.import_renamed(memories, restore=True)
        except ValidationError as exc:  # memories.<i>.<field>: say which line of the file
            raise _at_line(exc, path, [line_of[m.id] for m in memories]) from None
    n = done.imported
    click.echo(f"imported {plural(n, 'memory', 'memories')} ({len(memories) - n} already present)")
    others = Counter(m.tenant for m in memories if m.tenant != h.tenant)
    names = ", ".join(map(repr, sorted(others)))
    if others and h.tenant != DEFAULT_TENANT:  # a tenant's import takes them into its own tenant
        click.echo(f"note: those of tenant(s) {names} were imported into tenant {h.tenant!r}", err=True)
    elif others:  # stored as the file says, out of this tenant's sight: say where they went
        tenant, count = others.most_common(1)[0]
        click.echo(
            f"note: {sum(others.values())} of them belong to tenant(s) {names}, not {h.tenant!r}: "
            f"see them with `clawvm --tenant {tenant} ...` ({count} there)",
            err=True,
        )
    moved = [m.id for m in memories if m.id in done.renamed]
    if moved:  # another tenant holds those ids: the copies have ids of their own
        click.echo(
            f"note: {len(moved)} of them are stored under new ids, another tenant holding theirs "
            f"(e.g. {moved[0]} -> {done.renamed[moved[0]]})",
            err=True,
        )
    if done.differing:
        click.echo(
            f"warning: {len(done.differing)} of those differ from the file and were kept as stored (an "
            f"import never overwrites; e.g. {done.differing[0]}): forget them first, or import into a new "
            "store",
            err=True,
        )


def _at_line(exc: ValidationError, path: Path, lines: list[int]) -> ValidationError:
    """``exc`` naming the file's line instead of the batch's ``memories.<i>``."""
    head, _, rest = exc.field.partition(".")
    index, _, field = rest.partition(".")
    if head != "memories" or not index.isdigit() or int(index) >= len(lines):
        return exc
    return ValidationError(f"{path}:{lines[int(index)]}: {field or 'memory'}", exc.problem, exc.fix)


@click.command()
@click.pass_context
def stats(ctx: click.Context) -> None:
    """Counts by kind, status and tier, and how many memories still wait for an embedding."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        # one grouped count from the store's index, not a pass over every memory (~20 s at 100k memories),
        # and not one count per total: those each saw another moment of a file others write to, and disagreed
        groups = h.group_counts(status="any")
        result: dict[str, Any] = {
            "memories": sum(groups.values()),
            "by_kind": _counts(groups, "kind", [k.value for k in Kind]),
            # as reads show them (a memory past its expiry is expired, swept or not), as the server's stats
            "by_status": _counts(groups, "status", [s.value for s in Status if s in VISIBLE_STATUSES]),
            "by_tier": _counts(groups, "tier", [t.value for t in Tier]),
            "sessions": _count_sessions(h),
            "unembedded": _count_unembedded(h),
            "events": _count_events(h),
        }
        db = ctx.obj["db"]
        if "://" not in db and os.path.exists(db):
            result["file_bytes"] = os.path.getsize(db)
        click.echo(json.dumps(result, indent=2))


def _counts(groups: dict[GroupKey, int], field: str, values: list[str]) -> dict[str, int]:
    """How many of the counted memories hold each of ``values`` in ``field`` (in that order); none for 0."""
    counts = dict.fromkeys(values, 0)
    for key, n in groups.items():
        value = getattr(key, field)
        if value in counts:
            counts[value] += n
    return {v: n for v, n in counts.items() if n}


def _count_sessions(h: Harness) -> int:
    """Distinct sessions among the memories (an empty session id is none), their ids read in pages of 500."""
    filters, n, after = h.filters({"status": "any"}), 0, None
    while page := h.store.session_ids(filters, after, 500):
        n += sum(1 for session in page if session)
        if len(page) < 500:
            break
        after = page[-1]
    return n


def _count_unembedded(h: Harness) -> int:
    """Memories without a vector yet: their ids from the index, the vectors asked for 500 ids at a time."""
    filters = h.filters({"status": "any"})
    ids = h.store.query(Query(filters=filters, limit=h.store.count(filters))).filtered
    pages = (ids[start : start + 500] for start in range(0, len(ids), 500))
    return sum(len(page) - len(h.store.vectors_of(page)) for page in pages)


def _count_events(h: Harness) -> int:
    """How many of the log's events are the tenant's (the memories counted beside are), read in pages of a
    thousand."""
    n, after = 0, 0
    while page := h.events(after_seq=after, limit=1000):
        n += sum(1 for e in page if e.tenant == h.tenant)
        after = page[-1].seq or after
        if len(page) < 1000:
            break
    return n
