"""``.zvfs/stats.json``: live counters, snapshotted at every open.

Its keys are stable (every known counter is there from the start, at 0), and
the size a ``stat`` reports is that of the snapshot the last open took, which
is the one its reader gets (the fs layer asks for the size afresh every time).
"""

from __future__ import annotations

import copy
import json
import os
import time

import zvfs
from zvfs.cache import Cache
from zvfs.views.context import MountContext
from zvfs.views.node import FileNode


def _cache_stats(cache: Cache) -> dict[str, int]:
    s = cache.stats
    return {"hits": s.hits, "misses": s.misses, "single_flight_waits": s.waits,
            "evictions": s.evictions, "entries": len(cache)}


class StatsFile(FileNode):
    """Its content changes, so it is neither immutable nor kept in the page cache."""

    immutable = False
    direct_io = True

    def __init__(self, ctx: MountContext) -> None:
        self.ctx = ctx
        self.mtime_ns = ctx.mount_time_ns
        self._snapshot = b""

    def document(self) -> dict[str, object]:
        """Everything stats.json holds, as one dict (also what ``zvfs status`` reads)."""
        snap: dict[str, object] = dict(self.ctx.counters.snapshot())
        last = self.ctx.counters.last_error
        snap.update(
            version=zvfs.__version__,
            source=self.ctx.source,
            options=self.ctx.options,
            pid=os.getpid(),
            ready=self.ctx.counters.ready,
            started=round(self.ctx.mount_time_ns / 1e9, 3),
            last_error={"time": round(last[0], 3), "message": last[1]} if last else None,
            time=round(time.time(), 3),
        )
        chunks, listings = self.ctx.chunks, self.ctx.listings
        pool = self.ctx.buffers
        snap["chunk_cache"] = {**_cache_stats(chunks), "bytes": chunks.current_bytes,
                               "max_bytes": chunks.max_bytes,
                               "buffers_kept": len(pool), "buffers_reused": pool.lent}
        # the listing cache is bounded by its number of entries, not bytes
        snap["listing_cache"] = {**_cache_stats(listings), "max_entries": listings.max_bytes}
        return dict(sorted(snap.items()))

    def render(self) -> bytes:
        return (json.dumps(self.document(), indent=2) + "\n").encode()

    def opened(self) -> None:
        self._snapshot = self.render()

    @property
    def size(self) -> int:
        if not self._snapshot:
            self._snapshot = self.render()
        return len(self._snapshot)

    async def reader(self) -> FileNode:
        """A copy holding the snapshot this open took: readers at once shared the node's
        one snapshot, each open replacing it under the others' reads (a head of one
        rendering and the tail of the next: invalid JSON)."""
        return copy.copy(self)

    async def read(self, offset: int, length: int) -> bytes:
        # one snapshot per open (see reader): a reader never gets the tail of a different rendering
        if not self._snapshot:
            self._snapshot = self.render()
        return self._snapshot[offset : offset + length]
