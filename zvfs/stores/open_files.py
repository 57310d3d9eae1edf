"""The read descriptors a directory store keeps open between reads, bounded and shared.

A read of a chunk file is open + fstat + pread + close; kept open, a repeated read (the
inner chunks of a shard, a file read in many pieces) is one pread. Worker threads share a
descriptor (pread needs no file position), so the pool lends them out and closes one only
when its last borrower gives it back: a number closed under a reader could name another
file by then. The pool is bounded (a share of the process's open-file limit) and closes
what sat unused for IDLE_SECONDS: a file deleted or replaced outside the mount keeps its
disk space for as long as a descriptor of it is open.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

#: files kept open for reading, at most (a small share of the usual 1024 descriptors; an
#: eighth of the process's limit where that is lower, see kept_files)
OPEN_FILES = 128
#: seconds a kept descriptor may go unused before it is closed: a file deleted or replaced
#: outside the mount keeps its disk space (and the file system under the store busy) for
#: as long as a descriptor of it is open
IDLE_SECONDS = 10.0


@dataclass(slots=True, eq=False)
class KeptOpen:
    """A descriptor kept for reading ``key``: closed once dropped and no reader uses it."""

    key: str
    fd: int
    ident: tuple[int, int]  # (st_dev, st_ino) of the file the descriptor reads
    used: float  # time.monotonic() of its last borrow
    users: int = 0
    dropped: bool = False


class OpenFiles:
    """A bounded LRU of read descriptors by key, shared by the worker threads.

    pread needs no file position, so threads share a descriptor; a reader borrows it
    and gives it back, and a descriptor evicted or dropped meanwhile is closed by its
    last reader (never under one: its number could name another file by then).
    A descriptor unused for ``idle`` seconds is closed too (at the next borrow, or by
    ``close_idle`` when nothing is borrowed).
    """

    def __init__(self, limit: int, idle: float = IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = max(1, limit)
        self._idle = idle
        self._clock = clock
        self._lock = threading.Lock()
        self._open: OrderedDict[str, KeptOpen] = OrderedDict()

    def borrow(self, key: str) -> KeptOpen | None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
                entry.users += 1
                entry.used = now
            return entry

    def keep(self, key: str, fd: int, ident: tuple[int, int]) -> KeptOpen:
        """Keep ``fd`` (just opened for ``key``), borrowed by the caller."""
        entry = KeptOpen(key, fd, ident, self._clock(), users=1)
        with self._lock:
            old = self._open.pop(key, None)
            if old is not None:  # another thread opened it at the same time
                self._retire(old)
            self._open[key] = entry
            while len(self._open) > self._limit:
                self._retire(self._open.popitem(last=False)[1])
        return entry

    def close_idle(self) -> int:
        """Close the descriptors unused for the idle time; how many are left open."""
        with self._lock:
            self._expire(self._clock())
            return len(self._open)

    def _expire(self, now: float) -> None:
        """Under the lock: retire the least recently borrowed while idle too long (the
        dict is in borrow order, so only its front is looked at)."""
        while self._open:
            oldest = next(iter(self._open.values()))
            if now - oldest.used < self._idle:
                return
            self._retire(self._open.popitem(last=False)[1])

    def give_back(self, entry: KeptOpen) -> None:
        with self._lock:
            entry.users -= 1
            if entry.dropped and entry.users == 0:
                os.close(entry.fd)

    def drop(self, key: str, entry: KeptOpen | None = None) -> None:
        """Let go of ``key``'s descriptor (only ``entry``'s, when given)."""
        with self._lock:
            current = self._open.get(key)
            if current is not None and (entry is None or current is entry):
                self._retire(self._open.pop(key))

    def drop_prefix(self, prefix: str) -> None:
        with self._lock:
            for key in [k for k in self._open if k.startswith(prefix)]:
                self._retire(self._open.pop(key))

    def close(self) -> None:
        with self._lock:
            for entry in self._open.values():
                self._retire(entry)
            self._open.clear()

    def shed(self) -> int:
        """Close every kept descriptor no reader is using (the process ran out of them: an
        open is worth more than a descriptor kept for a read that may never come); how
        many were closed."""
        with self._lock:
            idle = [key for key, entry in self._open.items() if entry.users == 0]
            for key in idle:
                self._retire(self._open.pop(key))
            return len(idle)

    def _retire(self, entry: KeptOpen) -> None:
        """Under the lock: close now, or when the last reader gives it back."""
        entry.dropped = True
        if entry.users == 0:
            os.close(entry.fd)


def kept_files() -> int:
    """How many read descriptors to keep: OPEN_FILES, but at most an eighth of the open-file
    limit (a daemon run with a hard limit of 64 kept 58 files of metadata open after its
    scan, and every open then failed with EIO)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return OPEN_FILES
    return max(1, min(OPEN_FILES, soft // 8))
