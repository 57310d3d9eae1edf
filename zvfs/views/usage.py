"""What ``df`` shows for a mount: the bytes the store holds, and the free space where it lives."""

from __future__ import annotations

import shutil
from itertools import islice

from zvfs.views.context import MountContext
from zvfs.workers import run_blocking

#: keys summed at most for one answer (a bucket of millions of keys is reported from its first ones)
MAX_KEYS = 1_000_000


class StoreUsage:
    """Sums the key sizes once per metadata TTL (one flat listing on S3); ``free_path`` is the
    directory whose file system's free space a writable-looking df should show, or None."""

    def __init__(self, ctx: MountContext, free_path: str | None = None) -> None:
        self.ctx = ctx
        self.free_path = free_path

    def _measure(self) -> tuple[int, int]:
        used = sum(info.size for _key, info in islice(self.ctx.store.list_tree(""), MAX_KEYS))
        free = shutil.disk_usage(self.free_path).free if self.free_path else 0
        return used, free

    async def __call__(self) -> tuple[int, int]:
        return await self.ctx.listings.get(("usage",), lambda: run_blocking(self._measure))
