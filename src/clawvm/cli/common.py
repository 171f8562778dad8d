"""What every command group of the command line shares: the store or harness a command opens, and the
group class that turns ClawVM errors into one line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from clawvm.core.errors import ClawVMError
from clawvm.harness import Harness
from clawvm.store import Store, store_from_url
from clawvm.store.keys import Keyring


@contextmanager
def opened_harness(ctx: click.Context, embed: bool = True) -> Iterator[Harness]:
    """A harness on ``--db``, with the embedding model unless ``--no-embed`` or ``embed=False``."""
    db: str = ctx.obj["db"]
    harness = Harness.open(db, embedder="default" if embed and not ctx.obj["no_embed"] else None)
    try:
        yield harness
    finally:
        harness.close()


class CliGroup(click.Group):
    """Turns ClawVM errors into one clear line and exit code 2, instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClawVMError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@contextmanager
def opened_store(ctx: click.Context, dim: int = 384) -> Iterator[Store]:
    """The engine of ``--db`` itself (no harness: key and data-key commands work below it)."""
    store = store_from_url(ctx.obj["db"], dim=dim)
    store.setup()
    try:
        yield store
    finally:
        store.close()


@contextmanager
def opened_keyring(ctx: click.Context) -> Iterator[Keyring]:
    with opened_store(ctx) as store:
        yield Keyring(store)
