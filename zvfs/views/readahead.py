"""Sequential-read detection with a growing window (as mountpoint-s3's prefetcher).

A file that is read where its last read ended is being streamed: the window
of bytes to fetch ahead doubles on every such read, up to a ceiling, and
falls back to nothing on a seek. Views turn the window into block or chunk
loads; the cache bounds the memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class ReadAhead:
    initial: int = 4 << 20
    ceiling: int = 64 << 20
    _next: int = -1
    _window: int = 0
    _ahead_to: int = 0
    #: where the current run of sequential reads began (the views release what it passed)
    run_start: int = 0
    #: the run's number: a seek starts another
    _run: int = 0
    #: reads of this open under way: id -> offset
    _reading: dict[int, int] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=itertools.count)
    #: the furthest end of the current run's reads that have been answered
    _answered_to: int = 0

    def advise(self, offset: int, end: int, size: int) -> tuple[int, int] | None:
        """Record a read of [offset, end); return a byte range to prefetch, or None."""
        sequential = offset == self._next
        self._next = end
        if not sequential:
            self.run_start = offset
            self._run += 1
            self._answered_to = offset
            self._window = 0
            self._ahead_to = end
            return None
        self._window = min(self.ceiling, max(self.initial, self._window * 2))
        start = max(end, self._ahead_to)
        stop = min(size, end + self._window)
        if stop <= start:
            return None
        self._ahead_to = stop
        return start, stop

    @contextmanager
    def reading(self, offset: int, end: int) -> Iterator[Callable[[], int]]:
        """A read of [offset, end) under way (entered after :meth:`advise`). Yields a
        function telling where its run has been answered to: what a view may let go of.

        The kernel sends several reads of one open at once, and they end in any order: a
        read that ended before an earlier one let go of a chunk the earlier one had yet to
        take, which was then decoded twice (CI: 141 chunks decoded, 129 expected). So the
        answered part of a run ends at the first read of this open still under way, or at
        the furthest end of the run's answered reads if none is."""
        rid, run = next(self._ids), self._run
        self._reading[rid] = offset

        def answered_to() -> int:
            to = max(end, self._answered_to) if run == self._run else end
            return min([to, *(o for r, o in self._reading.items() if r != rid)])

        try:
            yield answered_to
        finally:
            del self._reading[rid]
        # reached only when the read was answered (an exception left above)
        if run == self._run:
            self._answered_to = max(self._answered_to, end)


# -- a reader that starts files in tree order (cp -r, rsync, tar) ----------------------------

#: a file started at most this many places after the last one still counts as in order:
#: several readers sharing a file list (4 copy threads) start files a few places apart
FILES_SPREAD = 8
#: files read ahead at most: 16, as many as the worker threads, keeps every worker busy;
#: 32 held twice the bytes ready and waiting (the daemon's peak while reading every object
#: of a bucket went from about 92 to 100 MiB) for no gain in speed
FILES_WINDOW = 16


def files_window(window: int) -> int:
    """The next window of files read ahead of a reader going in order: 4, then doubling
    up to FILES_WINDOW."""
    return min(FILES_WINDOW, max(4, window * 2))
