"""Writing an index snapshot in a forked child, so that the write which makes one due does not wait for it.

A snapshot of a 100k-memory index takes ~1.3 s to serialise. Written under the engine's lock (the index must
not change while it is read), it stalled one write in every ``snapshot_every`` for that long. Here the
engine forks while it holds the lock: the child has a copy-on-write image of the index exactly as it stood,
writes it and exits; the parent lets go of the lock as soon as ``fork`` returns (a few milliseconds: the page
tables) and goes on writing. Redis's ``BGSAVE`` works the same way.

What makes it safe in a process with other threads (the embed worker, the checkpointer, ONNX Runtime's
pool): the child runs :func:`clawvm.store.snapshot.write` alone, which touches no lock another thread could
have held at the fork (no SQLite, no model, no logging), and leaves with ``os._exit``, so no handler,
finaliser or connection of the parent's runs in it. What it wrote is current to the rev it was forked at;
writes made since are replayed on the next open like any delta, so a child that dies loses nothing.

Where ``os.fork`` is missing (Windows), :func:`available` is False and the engine writes under its lock.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable

log = logging.getLogger("clawvm.store.forked")

# Python 3.12+ warns on any fork of a process with threads; this child runs one self-contained function and
# leaves with os._exit (see above), which is the case the warning cannot tell apart from a risky one
warnings.filterwarnings(
    "ignore", message=r"This process .* is multi-threaded", category=DeprecationWarning, module=__name__
)


def available() -> bool:
    return hasattr(os, "fork")


class ForkedWrite:
    """A child writing one snapshot; a daemon thread waits for it (never taking the engine's lock), so
    :attr:`ok` says how it ended and :meth:`wait` blocks until it has."""

    def __init__(self, write: Callable[[], object], label: str) -> None:
        self.label = label
        self.ok: bool | None = None  # None while the child runs
        self._done = threading.Event()
        pid = os.fork()
        if pid == 0:  # the child: write, and leave without running anything of the parent's
            code = 1
            try:
                write()
                code = 0
            finally:
                os._exit(code)
        self.pid = pid
        threading.Thread(target=self._reap, name="clawvm-snapshot-reaper", daemon=True).start()

    def _reap(self) -> None:
        _, status = os.waitpid(self.pid, 0)
        self.ok = os.waitstatus_to_exitcode(status) == 0
        if not self.ok:  # the rows are the truth: a lost snapshot costs the next open a longer replay
            log.warning("index snapshot of %s not written: its writer ended with %s", self.label, status)
        self._done.set()

    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool | None:
        """Block until the child has ended (or ``timeout``); True when it wrote its snapshot."""
        self._done.wait(timeout)
        return self.ok
