"""A reader's walk through the store's files in order: what a raw file's read-ahead of the
files after it follows.

Copy tools (cp -r, rsync, gsutil, find | xargs) start files in the order a sorted
depth-first walk meets them. A :class:`FileWalk` is that order for one scope (the whole
tree when its index is known, else one directory) with how far the readers have got in it:
a reader starting files in order grows the window of files fetched ahead of it
(:func:`zvfs.views.readahead.files_window`), one out of order ends it.
"""

from __future__ import annotations

from collections.abc import Mapping

from zvfs.stores.base import KeyInfo, Listing
from zvfs.views.context import MountContext
from zvfs.views.readahead import FILES_SPREAD, FILES_WINDOW, files_window


def _files_in_order(tree: Mapping[str, Listing], prefix: str = "") -> list[tuple[str, KeyInfo]]:
    """Every file key in the order a sorted depth-first walk (find, cp -r) meets it. A stack
    of the directories on the way, not a call each: one member a thousand directories deep
    was Python's RecursionError, and every raw read of the mount failed (a helper's audit)."""
    out: list[tuple[str, KeyInfo]] = []
    listing = tree.get(prefix)
    if listing is None:
        return out
    stack = [(prefix, listing, iter(listing.names()))]
    while stack:
        base, listing, names = stack[-1]
        for name in names:
            if name not in listing.prefixes:
                out.append((base + name, listing.keys[name]))
            elif (below := tree.get(base + name + "/")) is not None:
                stack.append((base + name + "/", below, iter(below.names())))
                break  # its files first; this directory's names go on after them
        else:
            stack.pop()
    return out


class _WalkBuilding:
    """Stands for the walk of ``source`` while a worker lists its files."""

    __slots__ = ("source",)

    def __init__(self, source: Mapping[str, Listing] | Listing) -> None:
        self.source = source


async def _build_walk(ctx: MountContext, source: Mapping[str, Listing] | Listing, scope: str) -> None:
    """The walk of a big tree, listed in a worker so that the trio thread does not stall
    (a 200,000-key tree takes about 0.7 s), then put in place if nothing replaced it."""
    try:
        walk = await ctx.workers.run(FileWalk, source, scope)
    except Exception:
        walk = None  # a listing changed under it (a write through the mount): the next read retries
    current = ctx.walks.get(scope)
    if isinstance(current, _WalkBuilding) and current.source is source:
        if walk is None:
            del ctx.walks[scope]
        else:
            ctx.walks[scope] = walk


class FileWalk:
    """How far a reader has got through an ordered list of files.

    Several readers sharing a file list (4 copy threads) start files a few
    places apart, so "in order" means at most ``SPREAD`` places after the last
    file started.
    """

    SPREAD = FILES_SPREAD
    MAX_WINDOW = FILES_WINDOW

    def __init__(self, source: Mapping[str, Listing] | Listing, scope: str) -> None:
        self.source = source
        if isinstance(source, Listing):
            base = scope + "/" if scope else ""
            names = sorted(n for n in source.keys if n not in source.prefixes)
            self.files = [(base + n, source.keys[n]) for n in names]
        else:
            self.files = _files_in_order(source)
        self.position = {key: i for i, (key, _) in enumerate(self.files)}
        self.last = -(self.SPREAD + 1)  # the first file read is no evidence of a walk
        self.window = 0
        self.ahead_to = 0
        self._held: list[str] = []  # hints held back (see hints)

    #: files listed on the caller's own thread at most (about 3 ms); more go to a worker
    CHEAP_FILES = 1_000

    @classmethod
    def cheap(cls, source: Mapping[str, Listing] | Listing) -> bool:
        """Whether listing ``source``'s files in order is quick enough for the trio thread."""
        if isinstance(source, Listing):
            return len(source.keys) <= cls.CHEAP_FILES
        if len(source) > cls.CHEAP_FILES:
            return False
        return sum(len(listing.keys) for listing in source.values()) <= cls.CHEAP_FILES

    def following(self, key: str, n: int) -> list[tuple[str, KeyInfo]]:
        """The ``n`` files after ``key`` in this walk's order."""
        i = self.position.get(key)
        return [] if i is None else self.files[i + 1 : i + 1 + n]

    #: hints for files this far ahead are held back until there are this many of them
    HINT_BATCH = FILES_WINDOW // 2

    def hints(self, keys: list[str]) -> list[str]:
        """The files to hint to the store now (``Store.will_need``): ``keys``, those the
        walk has just reached, with those held back before; held back while the walk runs
        at its full window and there are fewer than HINT_BATCH of them. Each hint costs a
        worker hop, and a hop per file took a quarter of four readers' speed through a zip
        (warm: 526-549 MiB/s, 654-705 without the hints); a file hinted HINT_BATCH files
        later is still that many files ahead of the reader."""
        self._held.extend(keys)
        if (len(self._held) < self.HINT_BATCH and self.window >= self.MAX_WINDOW
                and self.ahead_to < len(self.files)):
            return []
        out, self._held = self._held, []
        return out

    def advise(self, key: str) -> list[tuple[str, KeyInfo]]:
        """Record that ``key`` is being read from its start; return the files to fetch ahead."""
        i = self.position.get(key)
        if i is None:
            return []
        if 0 < i - self.last <= self.SPREAD:
            self.window = files_window(self.window)
        else:
            self.window = 0
            self.ahead_to = i + 1
        self.last = max(self.last, i) if self.window else i
        if not self.window:
            return []
        start = max(i + 1, self.ahead_to)
        stop = min(len(self.files), i + 1 + self.window)
        self.ahead_to = max(self.ahead_to, stop)
        return self.files[start:stop]


def current_walk(ctx: MountContext, prefix: str) -> FileWalk | None:
    """How far a reader that starts files in tree order (cp -r, rsync, gsutil,
    find | xargs) has got, for a file in directory ``prefix``; None where no listing gives
    the order (or the walk is still being listed).

    The order is the whole store's when its tree index is known, or the store holds
    every listing in memory (a zip): Zarr v3 keeps one chunk per directory, so the next
    chunk is rarely a sibling. Otherwise it is the directory's.
    """
    tree = ctx.listings.peek(("tree",)) or ctx.store.listings()
    if tree:
        scope, source = "", tree
    elif (listing := ctx.listings.peek(prefix)) is not None:
        scope, source = prefix.rstrip("/"), listing
    else:
        return None
    walk = ctx.walks.get(scope)
    if walk is None or walk.source is not source:
        if len(ctx.walks) > 1000:
            ctx.walks.clear()
        if FileWalk.cheap(source) or ctx.nursery is None:
            walk = FileWalk(source, scope)
        else:  # listing every file in order takes long: in a worker, with no walk meanwhile
            walk = _WalkBuilding(source)
            ctx.background(_build_walk, ctx, source, scope)
        ctx.walks[scope] = walk
    return walk if isinstance(walk, FileWalk) else None
