"""Replay of a recorded session under other settings (what-if)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from clawvm.cli.common import named, opened_harness, refuse_store_as_output
from clawvm.core.errors import ValidationError
from clawvm.harness import Harness
from clawvm.store import store_from_url


@click.command()
@click.argument("session_id", required=False, callback=named("session"))
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
    refuse_store_as_output(ctx.obj["db"], json_path, "--json")  # --json clawvm.db emptied the store
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
        with opened_harness(ctx, existing=True) as h:
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
