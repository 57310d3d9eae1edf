"""Reading ahead through a directory store's tree, for a reader that goes from file to file
in tree order (cp -r, rsync, tar, find | xargs cat, a backup).

A zip or a bucket knows its whole tree, and a reader's walk (file_walk.FileWalk) follows it. A
directory store is listed one directory at a time, as the kernel looks them up, each in a
worker; and each file's bytes come from the disk when they are first read, which the
kernel's own read-ahead never does across files. Zarr v3 puts each chunk in a directory of
its own, so a reader going through an array's chunks waits for a listing and for the disk
at every file.

Here the order is found as the reader goes. Once it opens files in tree order, a worker
finds the next files after the last one known (listing the directories on the way), has
the kernel read them (``Store.will_need``), and hands back the listings it made, which go
into the mount's listing cache. The reader's next lookups are then answered from the
cache, its opens find the path in the kernel's cache (the hint opened each file), and its
reads find the bytes in the page cache: each on the trio thread, without a worker hop.

Only a read-only mount reads ahead this way: a listing made in a worker and put in the
cache after a write through the mount could hide that write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from zvfs.stores.base import Listing, Store
from zvfs.views.context import MountContext
from zvfs.views.readahead import FILES_SPREAD, FILES_WINDOW, files_window

log = logging.getLogger("zvfs")


class TreeAhead:
    """How far a reader of a directory store has got in tree order, and how far ahead of it
    the next files are being read."""

    SPREAD = FILES_SPREAD
    MAX_WINDOW = FILES_WINDOW
    #: bytes hinted by one extension at most
    MAX_BYTES = 64 << 20
    #: files remembered as hinted
    HINTED = 8192
    #: files of the walk kept behind the reader at most (then all but SPREAD are dropped)
    KEEP = 1024

    def __init__(self, ctx: MountContext) -> None:
        self.ctx = ctx
        self.order: list[str] = []  # files found ahead, in tree order, from the stream's start
        self.position: dict[str, int] = {}
        self.last = -1  # the furthest of them opened
        self.window = 0
        self.previous: str | None = None  # the last file opened, in order or not
        self.busy = False
        #: the last file of the tree, once a search after it found nothing (a reader going
        #: over the tree again must not start a search at every open)
        self.end: str | None = None
        #: a file the reader opened past the walk's last known one while a search was
        #: under way: placed in the walk when the search ends
        self.beyond: str | None = None
        #: the files hinted lately (a second pass over a tree finds them in the page cache:
        #: hinting them again would only cost a hop and an open each)
        self.hinted: dict[str, None] = {}

    def opened(self, key: str) -> None:
        """``key`` was opened for reading (trio thread): follow the reader, and read ahead
        of it if it goes in tree order."""
        i = self.position.get(key)
        if i is not None:
            if i > self.last:
                self._reached(i)
            # else: a file behind the furthest one (another copy thread): nothing learnt
        elif self.previous is not None and _next_in_tree(self.previous, key):
            if self.busy and self.order and _later_in_tree(self.order[-1], key):
                # past the files known, where the search under way is finding them (the
                # reader is as fast as the search): placed when it ends, not started over,
                # which would throw its files away and leave every search behind
                self.beyond = key
                self.previous = key
                return
            self._restart(key)
        else:
            self.previous = key
            return
        self.previous = key
        self._keep_ahead()

    def _reached(self, i: int) -> None:
        """The reader has got to the walk's ``i``-th file, past the furthest one before."""
        grow = i - self.last <= self.SPREAD  # else a jump forward: go on from there
        self.window = files_window(self.window) if grow else 4
        self.last = i
        self.ctx.counters.add("prefetch_hits")
        if self.last > self.KEEP:  # a long walk: forget the files it has passed
            self._forget(self.last - self.SPREAD)

    def _restart(self, key: str) -> None:
        """A walk starts at ``key`` (one file is no evidence), or goes on past the files its
        worker has found so far: from there, with the window it had."""
        self.window = files_window(self.window) if self.order else 4
        self.order, self.position, self.last = [key], {key: 0}, 0
        self.beyond = None

    def _keep_ahead(self) -> None:
        """Start finding the next files if fewer than half the window are known ahead of
        the reader and no search is under way."""
        known = len(self.order) - 1 - self.last
        if not self.busy and known < self.window // 2 + 1 and self.order[-1] != self.end \
                and self.ctx.nursery is not None:
            self.busy = True
            self.ctx.background(self._extend, self.order[-1], self.window - known)

    def _forget(self, cut: int) -> None:
        """Drop the first ``cut`` files of the walk (memory stays bounded over a million)."""
        self.order = self.order[cut:]
        self.position = {key: i for i, key in enumerate(self.order)}
        self.last -= cut

    async def _extend(self, start: str, count: int) -> None:
        """Find and hint the ``count`` files after ``start``: from the listings the mount has
        (on this thread: nothing to wait for), then, past the first directory it has not
        listed, in a worker, which lists the directories on the way; their listings go into
        the mount's cache."""
        ctx = self.ctx
        try:
            files, done = files_after(self._cached, start, count, self.MAX_BYTES)
            more: list[str] = []
            made: dict[str, Listing] = {}
            fresh = [k for k in files if k not in self.hinted]
            if not done:
                go_on = files[-1] if files else start
                known = {p: got for p in _ancestors(go_on) if (got := self._cached(p)) is not None}
                more, made = await ctx.workers.run(_list_and_hint, ctx.store, go_on, count - len(files),
                                                   self.MAX_BYTES, known, fresh)
            elif fresh:
                await ctx.workers.run(ctx.store.will_need, fresh)
        finally:
            self.busy = False
        for key in fresh + more:
            self.hinted[key] = None
        while len(self.hinted) > self.HINTED:
            del self.hinted[next(iter(self.hinted))]
        for prefix, listing in made.items():
            if not ctx.listings.contains(prefix):
                ctx.listings.put(prefix, listing)
        if done and not files:
            self.end = start
        if self.order and self.order[-1] == start:  # still the same walk
            for key in files + more:
                self.position.setdefault(key, len(self.order))
                self.order.append(key)
        ctx.counters.add("prefetch_requests", len(fresh) + len(more))
        beyond, self.beyond = self.beyond, None
        if beyond is not None:  # where the reader got while this search ran
            i = self.position.get(beyond)
            if i is None:  # not among the files found: its walk starts there
                self._restart(beyond)
            elif i > self.last:
                self._reached(i)
        # The reader may have gone on while this search ran, or started a walk of its own
        # further on: keep ahead of it now rather than at its next open, which may be long
        # after (a reader that stops to work on what it has)
        if self.order and self.order[-1] != start:
            self._keep_ahead()

    def _cached(self, prefix: str) -> Listing | None:
        return self.ctx.listings.peek(prefix, count=False)


class _Unknown(Exception):
    """A directory on the way whose listing is not at hand."""


def files_after(listing_of: Callable[[str], Listing | None], start: str, count: int,
                max_bytes: int) -> tuple[list[str], bool]:
    """The (at most) ``count`` files after key ``start`` in tree order (the sorted depth-first
    order of find and cp -r; a name that is a key and a directory both is the directory),
    of ``max_bytes`` at most past the first; and True, or False when it stopped short at a
    directory whose listing ``listing_of`` does not have (None).

    No more than ``count * 4`` directories are entered (a tree of empty directories)."""
    out: list[str] = []
    left = [max_bytes, count * 4]

    def listing(prefix: str) -> Listing:
        got = listing_of(prefix)
        if got is None:
            raise _Unknown(prefix)
        return got

    def take(prefix: str, names: Iterable[str], here: Listing) -> bool:
        """Add the files under ``names`` of ``here`` (the directory ``prefix``); False
        once enough are found."""
        for name in names:
            if name in here.prefixes:
                left[1] -= 1
                if left[1] < 0:
                    return False
                sub = prefix + name + "/"
                inner = listing(sub)
                if not take(sub, inner.names_after(""), inner):
                    return False
                continue
            size = here.keys[name].size
            if out and size > left[0]:
                return False
            left[0] -= size
            out.append(prefix + name)
            if len(out) >= count:
                return False
        return True

    parts = start.split("/")
    try:
        for depth, prefix in reversed(list(enumerate(_ancestors(start)))):
            here = listing(prefix)
            if not take(prefix, here.names_after(parts[depth]), here):
                break
    except _Unknown:
        return out, False
    return out, True


def _list_and_hint(store: Store, start: str, count: int, max_bytes: int, known: Mapping[str, Listing],
                   found: list[str]) -> tuple[list[str], dict[str, Listing]]:
    """Worker side: the files after ``start`` (listing what ``known`` lacks; a directory that
    cannot be listed is passed over, as this only guesses), and the listings made; then
    ``store.will_need`` of ``found`` and of them."""
    made: dict[str, Listing] = {}

    def listing_of(prefix: str) -> Listing:
        got = known.get(prefix) or made.get(prefix)
        if got is None:
            try:
                got = store.list_dir(prefix)
            except Exception as exc:  # noqa: BLE001 - a guess only; the reader's lookup reports it
                log.debug("reading ahead: cannot list %s: %s", prefix or "/", exc)
                got = Listing()
            made[prefix] = got
        return got

    files, _ = files_after(listing_of, start, count, max_bytes)
    if found or files:
        store.will_need(found + files)
    return files, made


def _ancestors(key: str) -> list[str]:
    """The prefixes of the directories holding ``key``, the root ('') first."""
    parts = key.split("/")[:-1]
    return [""] + ["/".join(parts[: i + 1]) + "/" for i in range(len(parts))]


def _later_in_tree(before: str, key: str) -> bool:
    """Whether ``key`` comes after ``before`` in tree order (path components compared)."""
    return key.split("/") > before.split("/")


def _next_in_tree(before: str, key: str) -> bool:
    """Whether ``key`` may come soon after ``before`` in tree order: later, and in the same
    directory or one under the same grandparent (the next chunk of a Zarr v3 array)."""
    if not _later_in_tree(before, key):
        return False
    a, b = before.split("/"), key.split("/")
    return a[:-1] == b[:-1] or (len(a) == len(b) >= 3 and a[:-2] == b[:-2])
