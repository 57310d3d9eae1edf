"""``.zvfs/stats.json``: live counters, recomputed at every open."""

from __future__ import annotations

import json

from zvfs.views.context import MountContext
from zvfs.views.node import FileNode


class StatsFile(FileNode):
    """Its content changes, so it is not immutable and its size is that of a fresh snapshot."""

    immutable = False
    direct_io = True

    def __init__(self, ctx: MountContext) -> None:
        self.ctx = ctx
        self.mtime = ctx.mount_time
        self._snapshot = b""

    def render(self) -> bytes:
        snap = self.ctx.counters.snapshot()
        for name, cache in (("chunk_cache", self.ctx.chunks), ("listing_cache", self.ctx.listings)):
            s = cache.stats
            snap[name] = {
                "hits": s.hits,
                "misses": s.misses,
                "single_flight_waits": s.waits,
                "evictions": s.evictions,
                "entries": len(cache),
                "bytes": cache.current_bytes,
                "max_bytes": cache.max_bytes,
            }
        return (json.dumps(snap, indent=2) + "\n").encode()

    @property
    def size(self) -> int:
        return len(self.render())

    async def read(self, offset: int, length: int) -> bytes:
        # a read from the start takes a new snapshot; the rest of that pass reads the same
        # one, so a reader never gets the tail of a different rendering
        if offset == 0 or not self._snapshot:
            self._snapshot = self.render()
        return self._snapshot[offset : offset + length]
