"""Keeping the kernel's caches of the derived files true after a write through the mount.

The decoded views (``.zvfs/``) are made from what the store holds, so a write to the store
changes them. The kernel keeps their pages, attributes and directory entries for the TTL:
after a write they are dropped, so the writer's next read of a view meets the new bytes and
a new array is found at once.

The dropping is done in a thread (it waits on the kernel, which may wait on this daemon),
once per burst of writes: a write during a pass asks for one more pass, not one each. Every
write op replies only after the pass (``settle``), but at most MAX_SETTLING replies wait at
once: each holds one of pyfuse3's session tasks, and the kernel's invalidation may itself
wait for a read of a derived file (its pages are locked meanwhile) that only a free session
task takes from /dev/fuse. The replies past that go at once, counted as
``settle_skipped``; the invalidation follows soon.

What to drop is the fs layer's to say (``targets``): this class knows when, not which.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from zvfs.fs.fuse import pyfuse3
from zvfs.logonce import LogOnce
from zvfs.stats import Counters
from zvfs.workers import run_abandonable

log = logging.getLogger("zvfs")

#: replies that may wait in ``settle`` at once: well under pyfuse3's session tasks
#: (daemon.MAX_SESSION_TASKS, 256), so some are always free to take the reads that a
#: kernel invalidation may be waiting for
MAX_SETTLING = 64

#: inodes whose pages and attributes go, and (parent inode, name) entries that go with what
#: the kernel keeps below them
Targets = tuple[list[int], list[tuple[int, bytes]]]


def invalidate(inodes: list[int], entries: list[tuple[int, bytes]]) -> None:
    """Worker thread: the kernel forgets pages and attributes of ``inodes``, and the
    directory entries ``entries`` (with everything cached below them)."""
    for ino in inodes:
        try:
            pyfuse3.invalidate_inode(ino, attr_only=False)
        except OSError:
            pass  # the kernel forgot it already
    for parent, name in entries:
        try:  # waits for a lookup in that directory to be answered (by the trio thread)
            pyfuse3.invalidate_entry(parent, name)
        except OSError:
            pass  # the kernel forgot it already


class DerivedCaches:
    """When the kernel's caches of the derived files are dropped, and who waits for it.

    ``targets`` is called on the trio thread at the start of each pass, and says what to
    drop; ``drop`` runs in a thread of its own and drops it (``invalidate``; a test gives
    its own)."""

    def __init__(self, counters: Counters, log_once: LogOnce, targets: Callable[[], Targets],
                 drop: Callable[[list[int], list[tuple[int, bytes]]], None] = invalidate) -> None:
        self._counters = counters
        self._log_once = log_once
        self._targets = targets
        self._drop = drop
        self._again = False
        #: set when the kernel's caches of the derived files hold no write's old bytes (no
        #: pass under way)
        self._settled = trio.Event()
        self._settled.set()
        #: replies waiting in settle
        self.waiting = 0

    def changed(self) -> None:
        """The store changed through the mount: a pass soon, off the trio thread (one more
        after the one under way, if one is)."""
        if not self._settled.is_set():
            self._again = True
            return
        self._settled = trio.Event()
        trio.lowlevel.spawn_system_task(self._run)

    async def settle(self) -> None:
        """Return once no pass is under way (or at once, past MAX_SETTLING waiting)."""
        if self._settled.is_set():
            return
        if self.waiting >= MAX_SETTLING:
            self._counters.add("settle_skipped")
            return
        self.waiting += 1
        try:
            await self._settled.wait()
        finally:
            self.waiting -= 1

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                try:
                    await run_abandonable(self._drop, *self._targets())
                except Exception as exc:  # noqa: BLE001 - a system task's error ends the mount
                    # the views' caches are then kept for their TTL, as after a write
                    # behind the mount; counted each time, logged once a kind (one that
                    # fails every pass would say so at every write)
                    self._counters.add("fuse_errors_invalidate")
                    if self._log_once.first(f"invalidate {type(exc).__name__}"):
                        log.error("dropping the kernel's caches of the derived files: %s: %s (the "
                                  "views may show what they held before a write for the metadata "
                                  "TTL; the mount goes on)", type(exc).__name__, exc)
                if not self._again:
                    return
        finally:
            self._settled.set()
