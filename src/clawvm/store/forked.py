"""Writing an index snapshot in a forked child, so that the write which makes one due does not wait for it.

A snapshot of a 100k-memory index takes ~2 s to serialise. Written under the engine's lock (the index must
not change while it is read), it stalled one write in every ``snapshot_every`` for that long. Here the
engine forks while it holds the lock: the child has a copy-on-write image of the index exactly as it stood,
writes it and exits; the parent lets go of the lock as soon as ``fork`` returns (a few milliseconds: the page
tables) and goes on writing. Redis's ``BGSAVE`` works the same way.

What makes it safe in a process with other threads (the embed worker, the checkpointer, ONNX Runtime's
pool, a server's): the child first turns the garbage collector off (no finaliser of the parent's objects,
an inherited connection or session, runs in it), closes every inherited descriptor but the standard three
(a server's sockets are not held open by it; the mapped snapshot stays mapped), restores the default signal
handlers and sets an alarm that ends it after :data:`CHILD_LIFETIME_S` whatever happens; then it runs
:func:`clawvm.store.snapshot.write`, which takes no lock another thread could have held at the fork, and
leaves with ``os._exit``, so nothing of the parent's runs at its exit. What it wrote is current to the rev
it was forked at; writes made since are replayed on the next open like any delta, so a child that dies
loses nothing. A child whose parent dies finishes its snapshot (the next open replays less); it used to
be killed with its parent (``PR_SET_PDEATHSIG``), which Linux sends when the *thread* that forked ends: a
snapshot made due by a request thread or the pager was killed half written, its temporary file left.

Only on Linux (:func:`available`): elsewhere a threaded process cannot fork safely (macOS) or at all
(Windows), and the engine writes under its lock.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable

log = logging.getLogger("clawvm.store.forked")

#: How long a child may live, whoever waits for it (its parent gives it up after
#: :data:`clawvm.store.sqlite_snapshots.SNAPSHOT_CHILD_TIMEOUT_S`): a child that hangs, or whose parent died,
#: never stays behind (``SIGALRM``'s default action ends it)
CHILD_LIFETIME_S = 900


def available() -> bool:
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def _fork() -> int:
    # Python 3.12+ warns on any fork of a process with threads (in the parent, after the fork: as an error
    # under -W error it would leave the child unreaped); this child is the case the warning cannot tell
    # apart from a risky one (see above)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _become_alone() -> None:
    """In the child, before its work: nothing of the parent's runs or stays open in it."""
    gc.disable()
    with contextlib.suppress(OSError):
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        signal.set_wakeup_fd(-1)
    signal.alarm(CHILD_LIFETIME_S)


class ForkedWrite:
    """A child writing one snapshot; a daemon thread waits for it (never taking the engine's lock), so
    :attr:`ok` says how it ended and :meth:`wait` blocks until it has. ``OSError`` from the fork itself
    (no memory for the page tables, a process limit) reaches the caller."""

    def __init__(self, write: Callable[[], object], label: str) -> None:
        self.label = label
        self.ok: bool | None = None  # None while the child runs
        self._done = threading.Event()
        pid = _fork()
        if pid == 0:  # the child: write, and leave without running anything of the parent's
            code = 1
            try:
                _become_alone()
                write()
                code = 0
            finally:
                os._exit(code)
        self.pid = pid
        threading.Thread(target=self._reap, name="clawvm-snapshot-reaper", daemon=True).start()

    def _reap(self) -> None:
        status: int | None = None
        try:
            _, status = os.waitpid(self.pid, 0)
            self.ok = os.waitstatus_to_exitcode(status) == 0
        except ChildProcessError:  # reaped by someone else (SIGCHLD ignored, a waitpid(-1) of the host's)
            self.ok = False
        finally:
            # the rows are the truth: a lost snapshot costs the next open a longer replay. Logged before the
            # waiters wake, so that one that finds the snapshot lost also finds why in the log
            if not self.ok:
                log.warning("index snapshot of %s not written: its writer ended with %s", self.label, status)
            self._done.set()

    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool | None:
        """Block until the child has ended (or ``timeout``); True when it wrote its snapshot."""
        self._done.wait(timeout)
        return self.ok

    def stop(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds, then kill the child if it still runs (a hung writer must not hold
        its engine's close forever); True when it wrote its snapshot."""
        if self._done.wait(timeout):
            return bool(self.ok)
        log.warning("index snapshot of %s: its writer ran past %.0f s and is killed", self.label, timeout)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        self._done.wait(10.0)
        return False


class BackgroundSnapshots:
    """One engine's periodic snapshot writers: one child at a time, and whether the last one's snapshot was
    lost (then the engine's close writes one itself)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.child: ForkedWrite | None = None  # the snapshot being written, if any
        self.lost = False  # the last child failed: its rev has no snapshot
        self._lock = threading.Lock()

    def busy(self) -> bool:
        return self.child is not None and self.child.running()

    def start(self, write: Callable[[], object]) -> None:
        """Fork a child running ``write``; ``OSError`` when the fork itself fails."""
        self.child = ForkedWrite(write, self.label)

    def wait(self, timeout: float | None = None) -> bool | None:
        """Wait for the child, if any: True when it wrote its snapshot, False when it failed, None when
        there was none or it is still running."""
        child = self.child
        return None if child is None else self._ended(child, child.wait(timeout))

    def finish(self, timeout: float) -> None:
        """Wait for the child, if any; one still running after ``timeout`` seconds is killed."""
        child = self.child
        if child is not None:
            self._ended(child, child.stop(timeout))

    def _ended(self, child: ForkedWrite, ok: bool | None) -> bool | None:
        with self._lock:  # a newer child may have been forked meanwhile: it stays
            if ok is not None and self.child is child:
                self.child = None
                self.lost = not ok
        return ok
