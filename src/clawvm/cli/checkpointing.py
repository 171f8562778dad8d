"""Checkpoints of a session: take one, list them, roll back to one."""

from __future__ import annotations

import dataclasses
import json

import click

from clawvm.cli.common import named, opened_harness, plural
from clawvm.core.errors import ValidationError


@click.command()
@click.argument("session_id", metavar="SESSION", callback=named("session"))
@click.argument("name")
@click.pass_context
def checkpoint(ctx: click.Context, session_id: str, name: str) -> None:
    """Snapshot SESSION's tiers, pins and values under NAME, and print the checkpoint's id (rollback takes
    it)."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        checkpoint_id = h.checkpoint(session_id, name)
        click.echo(checkpoint_id)
        held = next(c.memories for c in h.checkpoints(session_id) if c.id == checkpoint_id)
        if held == 0:  # a mistyped session is a session too: say that the snapshot holds nothing
            click.echo(
                f"note: session {session_id!r} has no memories: the checkpoint holds none (check SESSION)",
                err=True,
            )


@click.command()
@click.argument("session_id", metavar="SESSION", callback=named("session"))
@click.option("--json", "as_json", is_flag=True, help="Print JSON Lines, one checkpoint per line.")
@click.pass_context
def checkpoints(ctx: click.Context, session_id: str, as_json: bool) -> None:
    """SESSION's checkpoints, newest first: id, when it was taken, how many memories it holds, its name."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        found = h.checkpoints(session_id)
    for c in found:
        if as_json:
            taken = c.taken_at.isoformat()
            line = {"id": c.id, "name": c.name, "session_id": c.session_id, "taken_at": taken}
            click.echo(json.dumps({**line, "memories": c.memories}, ensure_ascii=False))
        else:
            held = plural(c.memories, "memory", "memories")
            click.echo(f"{c.id}  {c.taken_at:%Y-%m-%d %H:%M:%S}  {held}  {c.name}")
    if not found:
        click.echo(f"note: session {session_id!r} has no checkpoints", err=True)


@click.command()
@click.argument("checkpoint_id", callback=named("checkpoint"))
@click.option(
    "--json", "as_json", is_flag=True, help="Print the restored and obsoleted ids as one JSON object."
)
@click.pass_context
def rollback(ctx: click.Context, checkpoint_id: str, as_json: bool) -> None:
    """Restore the session of CHECKPOINT_ID as the checkpoint holds it: its memories' tiers, pins, values and
    statuses come back, and memories recorded since become obsolete (kept, out of recall)."""
    with opened_harness(ctx, embed=False, existing=True) as h:
        try:
            report = h.rollback(checkpoint_id)
        except ValidationError as exc:  # the library's fix names its own checkpoint(): say which command
            if exc.field != "checkpoint_id":
                raise
            fix = "`clawvm checkpoints SESSION` lists a session's checkpoint ids"
            raise ValidationError("CHECKPOINT_ID", exc.problem, fix) from None
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(report)))
        return
    restored = plural(len(report.restored), "memory", "memories")
    click.echo(
        f"rolled back to {report.checkpoint_id}: restored {restored}, obsoleted {len(report.obsoleted)} "
        "recorded since"
    )
    for memory_id in report.restored:
        click.echo(f"restored {memory_id}")
    for memory_id in report.obsoleted:
        click.echo(f"obsoleted {memory_id}")
