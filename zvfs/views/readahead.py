"""Sequential-read detection with a growing window (as mountpoint-s3's prefetcher).

A file that is read where its last read ended is being streamed: the window
of bytes to fetch ahead doubles on every such read, up to a ceiling, and
falls back to nothing on a seek. Views turn the window into block or chunk
loads; the cache bounds the memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReadAhead:
    initial: int = 4 << 20
    ceiling: int = 64 << 20
    _next: int = -1
    _window: int = 0
    _ahead_to: int = 0
    #: where the current run of sequential reads began (the raw view releases what it passed)
    run_start: int = 0

    def advise(self, offset: int, end: int, size: int) -> tuple[int, int] | None:
        """Record a read of [offset, end); return a byte range to prefetch, or None."""
        sequential = offset == self._next
        self._next = end
        if not sequential:
            self.run_start = offset
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
