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
