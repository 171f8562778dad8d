"""A worker's part in the race tests of pinning from several processes or threads at once (test_tiers.py).
Kept apart from the test modules so that a fork-server child starts without importing them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from clawvm import Harness, Memory, PagerConfig, TierBudgets
from clawvm.core.errors import ValidationError
from clawvm.store import Store

#: The pinned budget the racing workers share: fewer pins than workers.
PIN_ITEMS = 2


def pager_config() -> PagerConfig:
    return PagerConfig(budgets=TierBudgets(working_items=PIN_ITEMS, working_tokens=None), background=False)


def first_check_waits(check: Callable[..., None], start: Any) -> Callable[..., None]:
    """``check`` (a pager's ``check_pin``) whose first call waits at ``start`` once it has read the pins:
    every worker reads them before any of them writes its pin, the race at its widest, every time."""
    waited = False

    def checked(memory: Memory, now: datetime, *args: Any, **kwargs: Any) -> None:
        nonlocal waited
        try:
            check(memory, now, *args, **kwargs)
        finally:
            if not waited:
                waited = True
                start.wait(timeout=60)

    return checked


def pin_when_told(target: str | Path | Store, memory_id: str, start: Any, results: Any) -> None:
    """Open a harness on ``target`` and pin ``memory_id`` in the race; put ``("ok", id)``, or the refusal's
    ``("refused", id, field, problem)``, or any other error on ``results``."""
    _race(target, memory_id, start, results, lambda h: h.pin(memory_id).id)


def record_when_told(target: str | Path | Store, content: str, start: Any, results: Any) -> None:
    """As :func:`pin_when_told`, recording ``content`` pinned (``record(pinned=True)``) in session "p":
    ``("ok", content, id)`` when recorded."""
    _race(target, content, start, results, lambda h: h.record(content, session_id="p", pinned=True).id)


def _race(
    target: str | Path | Store, name: str, start: Any, results: Any, step: Callable[[Harness], str]
) -> None:
    try:
        h = Harness.open(target, embedder=None, pager=pager_config())
    except Exception as exc:  # reported to the test, which names it
        start.abort()
        results.put(("error", name, f"{type(exc).__name__}: {exc}"))
        return
    h.pager.check_pin = first_check_waits(h.pager.check_pin, start)  # type: ignore[method-assign]
    try:
        results.put(("ok", name, step(h)))
    except ValidationError as exc:
        results.put(("refused", name, exc.field, exc.problem))
    except Exception as exc:
        results.put(("error", name, f"{type(exc).__name__}: {exc}"))
    finally:
        h.close()  # a shared MemoryStore's close releases nothing: its memories stay for the test to read
