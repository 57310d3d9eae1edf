"""A byte budget for work in flight: how many bytes of chunks are being decoded at once.

The chunk cache bounds what is *kept*; this bounds what is being *made*. Each decode
holds its chunk's size for as long as it runs. A chunk bigger than the whole budget
waits until nothing else holds any, then runs alone, so a store of chunks that decode to
a GiB each (a few MiB of gzip) costs about one such chunk at a time, not one per worker
thread. Waiters are served in order: small chunks do not starve a big one. Trio only
(the decodes are awaited on the trio thread; no lock is needed).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


class ByteBudget:
    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.used = 0
        self._waiters: deque[tuple[int, trio.Event]] = deque()

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        """Hold ``nbytes`` (at most the whole budget) while the body runs."""
        n = min(max(0, nbytes), self.total)
        if not self._waiters and self.used + n <= self.total:
            self.used += n
        else:
            entry = (n, trio.Event())
            self._waiters.append(entry)
            try:
                await entry[1].wait()
            except BaseException:
                if entry[1].is_set():  # granted as it was cancelled: give it back
                    self._release(n)
                else:
                    self._waiters.remove(entry)
                    self._grant()  # it may have been the head that held the others back
                raise
        try:
            yield
        finally:
            self._release(n)

    def _release(self, n: int) -> None:
        self.used -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.total:
            n, event = self._waiters.popleft()
            self.used += n
            event.set()
