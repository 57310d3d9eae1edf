"""What ``df`` shows for a mount: the bytes the store holds, and the free space where it lives."""

from __future__ import annotations

import math
import shutil
from collections.abc import Awaitable, Callable, Mapping
from itertools import islice

import trio

from zvfs.stores.base import Listing, Store
from zvfs.views.context import MountContext

#: keys summed at most for one answer (a bucket of millions of keys is reported from its first ones)
MAX_KEYS = 1_000_000
#: seconds a statfs waits for a count in progress; statfs must stay quick (df, `zvfs status`,
#: `zvfs mount`'s dead-mount check all call it), so a long count finishes in the background
WAIT = 1.0
#: directory levels a count descends at most: a store walked a listing at a time cannot loop
#: through a symlink (the directory store follows none to a directory), but a bind mount of
#: an ancestor inside the store would have it walk ever deeper
MAX_DEPTH = 256
#: a count is not repeated sooner than this many times its own duration, whatever the TTL:
#: counting a directory store of a million files takes 7 s warm and 28 s cold (a stat a
#: file), and with df polled by a monitor, or `find` (which calls statfs) run in a loop, a
#: 60 s TTL would keep a core walking the store. So the daemon spends at most 1% of its
#: time counting; a store that counts in under 0.6 s still follows the 60 s default TTL.
SPACING = 100


class StoreUsage:
    """Sums the key sizes once per metadata TTL, in the background; ``free_path`` is the
    directory whose disk's free space df shows (read at each call: one statvfs), or None
    for a store with no disk of its own (S3: free is None, no bound).

    The count shares what the raw tree lists, because ``find`` calls statfs (to choose how
    to walk) as it starts, so every ``find`` of a fresh mount also starts a count:
    - ``tree`` gives the raw tree's index of a store listed flat (S3), which already holds
      every key's size: summing it costs no request. Listing the bucket again for it did,
      so each ``find`` listed the whole bucket a second time.
    - a store listed a directory at a time (a directory store), while its tree is being
      listed through the mount (find opens the root, and so lists it, before its statfs),
      is summed from the mount's listings, in the order find and ``ls -R`` go
      (:meth:`_walk`): whichever of the count and the reader comes first to a directory
      lists it for both. Its own walk (a stat a file) had a million-file store walked
      twice, the count's stats competing with find's on the same disk.
    """

    def __init__(self, ctx: MountContext, free_path: str | None = None,
                 tree: Callable[[], Awaitable[dict[str, Listing] | None]] | None = None,
                 spacing: float = SPACING) -> None:
        self.ctx = ctx
        self.free_path = free_path
        self.tree = tree
        self.spacing = spacing
        self._value: int | None = None  # the bytes the store holds, as last counted
        self._when = -math.inf
        #: seconds the last count took (wall time, on the clock of _when: its stats wait on the disk)
        self._took = 0.0
        self._counting: trio.Event | None = None

    def _free(self, path: str) -> int:
        """Free bytes where the store lives (worker side); 0 when that cannot be read (its
        root removed): a full or missing disk must not show as room to write."""
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return 0

    async def _used(self, index: Mapping[str, Listing] | None) -> int:
        store = self.ctx.store
        if index is None and store.lists_in_memory:
            # a zip's listings, all made at open: their sizes are arrays, summed in place
            # (a walk made a KeyInfo per key: 18 s of a million-member mount's find)
            index = store.listings()
        used = await self.ctx.workers.run(_index_size, index) if index is not None else None
        if used is not None:
            return used
        if store.flat_listing or store.lists_in_memory or self.ctx.listings.peek("") is None:
            # one flat listing, or none at all; or no one is listing the tree through the
            # mount (a plain df, zvfs status): then a walk of the store that keeps nothing
            # and stops at MAX_KEYS, not listings held for the TTL, of which one flat
            # directory of ten million chunks would take a gigabyte
            return await self.ctx.workers.run(_listed_size, store)
        return await self._walk()

    async def _walk(self) -> int:
        """The bytes of a store listed a directory at a time, summed from ``ctx.listing``:
        depth first, in sorted order, as find and ``ls -R`` go."""
        used = keys = 0
        stack = [""]
        while stack and keys < MAX_KEYS:
            prefix = stack.pop()
            listing = await self.ctx.listing(prefix)
            used += listing.keys.total_size()
            keys += len(listing.keys)
            if prefix.count("/") < MAX_DEPTH:
                stack.extend(prefix + name + "/" for name in sorted(listing.prefixes, reverse=True))
        return used

    def _fresh(self) -> bool:
        ttl = self.ctx.metadata_ttl
        if self._value is None:
            return False
        return ttl is None or trio.current_time() - self._when < max(ttl, self.spacing * self._took)

    async def _count(self) -> None:
        try:
            index = await self.tree() if self.tree is not None else None
            began = trio.current_time()
            self._value = await self._used(index)
            self._when = trio.current_time()
            self._took = self._when - began
        finally:
            done, self._counting = self._counting, None
            if done is not None:
                done.set()

    async def __call__(self) -> tuple[int, int | None]:
        """(used, free) bytes: the last count, after waiting up to WAIT for a fresh one, and
        the free space now (None: no bound of the store's own)."""
        if not self._fresh():
            if self._counting is None:
                self._counting = trio.Event()
                self.ctx.background(self._count)
            counting = self._counting
            with trio.move_on_after(WAIT):
                await counting.wait()
        free = await self.ctx.workers.run(self._free, self.free_path) if self.free_path else None
        return self._value or 0, free


def _listed_size(store: Store) -> int:
    """The bytes of a store's first MAX_KEYS keys, from its own walk, streamed and kept
    nowhere (worker side)."""
    return sum(info.size for _key, info in islice(store.list_tree(""), MAX_KEYS))


def _index_size(index: Mapping[str, Listing]) -> int | None:
    """The bytes of every key in a tree index; None if a write through the mount changed
    the index while it was summed (the caller then lists the store)."""
    try:
        return sum(listing.keys.total_size() for listing in index.values())
    except RuntimeError:  # dictionary changed size during iteration
        return None
