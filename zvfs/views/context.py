"""What every view of one mount shares: the store, the caches, the options."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from zvfs.cache import BufferPool, ByteBudget, Cache
from zvfs.cache.lru import default_size
from zvfs.formats.probe import DESCRIBING_NAMES
from zvfs.logonce import LogOnce
from zvfs.stats import Counters
from zvfs.stores.base import KeyInfo, Listing, Store
from zvfs.workers import Workers

if TYPE_CHECKING:
    from zvfs.decoders.pool import DecoderPool
    from zvfs.formats.known import Known
    from zvfs.formats.meta import ArrayMeta

log = logging.getLogger("zvfs")


#: the most memory the buffer pool keeps (see zvfs.cache.buffers)
BUFFER_POOL_MAX = 16 << 20


#: bytes the chunk cache counts for an entry on top of its data (see MountContext.chunks)
CHUNK_ENTRY_OVERHEAD = 640
#: and for each dimension of its chunk: numpy keeps an array's shape and strides (16 bytes
#: a dimension) and the key's chunk index takes 8. A 64-dimensional chunk entry took 1,964
#: bytes counted as 641: the cache held three times its size in tiny chunks
CHUNK_BYTES_PER_DIM = 24


def chunk_entry_size(value: object) -> int:
    """What the chunk cache counts for ``value`` (its overhead comes on top)."""
    return default_size(value) + CHUNK_BYTES_PER_DIM * getattr(value, "ndim", 0)
#: bytes of chunks being decoded at once, at least (half the cache if that is more): a
#: chunk bigger than that is decoded alone (see zvfs.cache.budget)
DECODING_MIN = 256 << 20


@dataclass
class MountContext:
    """Built once by the CLI and handed to the view builders.

    ``metadata_ttl`` is seconds (None means indefinite: the data never changes).
    """

    store: Store
    metadata_ttl: float | None = 60.0
    cache_size: int = 512 << 20
    decoded: str = "hidden"  # hidden | visible | off
    mount_time_ns: int = field(default_factory=time.time_ns)
    #: what the user mounted and with which options (stats.json and zvfs status show them)
    source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    #: node path -> newest mtime (ns) of its metadata keys, from the scan at mount (formats.probe)
    metadata_mtimes: dict[str, int] = field(default_factory=dict)
    #: the mount's shared services: its counters, its worker threads, its log-once
    counters: Counters = field(default_factory=Counters)
    workers: Workers = field(default_factory=Workers)
    log_once: LogOnce = field(default_factory=lambda: LogOnce(log), init=False)
    #: the decoder processes of a local store (None: every chunk is decoded in the workers)
    decoders: DecoderPool | None = None
    listings: Cache = field(init=False)
    chunks: Cache = field(init=False)
    #: the buffers of decoded chunks the cache dropped, lent to the next decodes
    buffers: BufferPool = field(init=False)
    #: chunks whose bytes could not be decoded: (message, cause), for the metadata TTL
    failures: Cache = field(init=False)
    #: set by the daemon while serving; background prefetches run in it
    nursery: trio.Nursery | None = field(default=None, init=False)
    #: cache keys loaded ahead of any reader, to count prefetch hits: the newest
    #: PREFETCHED_MAX (see prefetch_asked)
    prefetched: dict[object, None] = field(default_factory=dict, init=False)
    #: bytes of read-ahead in flight at most, over every reader of the mount (see prefetch())
    prefetch_budget: int = field(default=0, init=False)
    _prefetching: int = field(default=0, init=False)
    #: listings made ahead of a walk of the tree, in flight (see list_ahead())
    _listing_ahead: int = field(default=0, init=False)
    #: per raw directory (or '' for the whole tree): a reader's progress (views.file_walk.FileWalk)
    walks: dict[str, Any] = field(default_factory=dict, init=False)
    #: a reader's progress through a directory store's tree (views.tree_ahead.TreeAhead)
    tree_ahead: Any = field(default=None, init=False)
    #: the raw tree takes writes (--writable)
    writable: bool = False
    #: key -> the handles that have it open for writing (views.writing.WriteHandle)
    writers: dict[str, list[Any]] = field(default_factory=dict, init=False)
    #: key -> set once the open for writing under way (its store call in a worker) is made:
    #: an open that comes meanwhile waits for it, to share its staged copy (S3)
    writers_opening: dict[str, trio.Event] = field(default_factory=dict, init=False)
    #: directories made by mkdir on a store whose directories are implicit (S3):
    #: parent prefix -> names; they exist in the mount until removed
    made_dirs: dict[str, set[str]] = field(default_factory=dict, init=False)
    #: set by the daemon while the mount's metadata scan lists a flat store (S3): what the
    #: tree index's first load awaits, to go on with that listing (None after, or never)
    listing_under_way: Callable[[], Awaitable[Iterable[tuple[str, KeyInfo]] | None]] | None = \
        field(default=None, init=False)
    #: called after a write through the mount changed what derived views show
    on_change: list[Callable[[], None]] = field(default_factory=list, init=False)
    #: array path -> its layout digest (ArrayMeta.layout_digest) as the newest discovery read
    #: it; None before the first. A decoded file whose array differs reads ESTALE
    #: (views.arrays.DecodedArray.current): its metadata changed behind the mount
    array_layouts: dict[str, str] | None = field(default=None, init=False)
    #: the discovery array_layouts are from (its number), and when it began (monotonic)
    layouts_generation: int = field(default=-1, init=False)
    layouts_read: float = field(default=0.0, init=False)
    #: when a read of an open decoded file last had them read again (monotonic): at most one
    #: a TTL, whether it came back complete or not
    layouts_asked: float = field(default=0.0, init=False)
    #: the newest discovery's hierarchy came from consolidated metadata (one document): an
    #: open file's recheck then reads the hierarchy again, not its array's own metadata
    layouts_consolidated: bool = field(default=False, init=False)
    #: array path -> (when its read began, its layout digest, None: no array there): the
    #: array's own metadata read again by an open file's recheck (DecodedArray.current),
    #: newer than array_layouts' for that path when it began after layouts_read
    array_rechecks: dict[str, tuple[float, str | None]] = field(default_factory=dict, init=False)
    #: array path -> when an open file's recheck of it was last asked for (at most one a TTL)
    rechecks_asked: dict[str, float] = field(default_factory=dict, init=False)
    #: what the newest discovery read (formats.Known): the next reads again only what changed
    metadata_known: Known | None = field(default=None, init=False)
    #: the newest complete discovery: one that finds every node as it was, with no write
    #: through the mount since, is that one again (its views are not built again)
    #: (a views.decoded.Decoded: that module lies above this one, and alone reads it)
    decoded_last: Any = field(default=None, init=False)
    #: array path -> (its ArrayMeta, digest, layout digest) as the newest discovery made them
    array_digests: dict[str, tuple[ArrayMeta, str, str]] = field(default_factory=dict, init=False)
    #: path -> (serial of its last write, the key's info after it, when it was made); see
    #: epoch() and changed_at_ns()
    _epochs: OrderedDict[str, tuple[int, KeyInfo | None, int]] = field(default_factory=OrderedDict,
                                                                         init=False)
    _serial: int = field(default=0, init=False)
    _floor: int = field(default=0, init=False)
    _floor_time_ns: int = field(default=0, init=False)
    #: directory path -> (the mtime a utimens through the mount gave it, when); see dir_time()
    _dir_times: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict, init=False)
    #: chunk grid (array path, view) -> its cells, numbered by a listing; see may_list_cells()
    _listed_cells: dict[Hashable, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._stable_time_ns = max(self.metadata_mtimes.values(), default=self.mount_time_ns)
        # listings are small; bound them by entry count via sizeof=1
        self.listings = Cache(max_bytes=100_000, ttl=self.metadata_ttl, sizeof=lambda _v: 1)
        # memory kept outside the cache's bound for reuse: a streaming reader needs a few
        # chunks' worth (what it passed comes back as fast as read-ahead takes it)
        self.buffers = BufferPool(max_bytes=min(BUFFER_POOL_MAX, self.cache_size // 8))
        # what an entry costs besides its bytes, so a million 1-byte chunks still count: the
        # array object, its key's tuples and ints, the entry and the dict's slot, measured
        # at 557 bytes (200,000 chunks of 8 bytes); 256 let the daemon grow to 3x the
        # cache size with tiny chunks (a helper's audit: 392 MiB RSS for a 128 MiB cache)
        self.chunks = Cache(max_bytes=self.cache_size, overhead=CHUNK_ENTRY_OVERHEAD,
                            sizeof=chunk_entry_size, on_drop=self.buffers.give)
        self.failures = Cache(max_bytes=10_000, ttl=self.metadata_ttl, sizeof=lambda _v: 1)
        # half the cache: what is fetched ahead must still be there when its reader arrives
        self.prefetch_budget = max(4 << 20, self.cache_size // 2)
        # bytes of chunks being decoded at once: each worker thread decoded a chunk of a GiB
        # (4 MiB of gzip) at the same time, 3 GiB for two readers with a 64 MiB cache
        self.decoding = ByteBudget(max(DECODING_MIN, self.cache_size // 2))

    @property
    def stable_time_ns(self) -> int:
        """The mtime of a directory or file derived from the store as a whole: the newest
        metadata mtime, so it survives a remount of unchanged data (the mount time otherwise)."""
        return self._stable_time_ns

    def learn_mtimes(self, mtimes: dict[str, int]) -> int:
        """Take the metadata mtimes a scan found after the context was built (the daemon
        scans once the mount answers); returns the stable time before them, so the caller
        can move the nodes that were made with it."""
        before = self._stable_time_ns
        self.metadata_mtimes.update(mtimes)
        self._stable_time_ns = max(self.metadata_mtimes.values(), default=self.mount_time_ns)
        return before

    def learn_layouts(self, generation: int, began: float, layouts: dict[str, str], complete: bool) -> None:
        """Take the array layouts of discovery ``generation`` (begun at ``began``), unless a
        later one's are known already (a discovery that began before a write may end after
        the next one). An incomplete discovery (a store request failed) may have missed
        arrays that are there: it adds what it found, removes nothing, and the metadata
        counts as not read again."""
        if generation <= self.layouts_generation:
            return
        self.layouts_generation = generation
        if complete or self.array_layouts is None:
            self.array_layouts = layouts
            self.confirm_layouts(began)
            if complete:  # the grids of arrays gone let go of their numbers with them
                self._listed_cells = {g: n for g, n in self._listed_cells.items()
                                      if not isinstance(g, tuple) or g[0] in layouts}
        else:
            self.array_layouts = {**self.array_layouts, **layouts}

    def confirm_layouts(self, began: float) -> None:
        """A discovery begun at ``began`` found the layouts unchanged: what is known of them
        is that new (open files' rechecks wait a TTL from it)."""
        if began > self.layouts_read:
            self.layouts_read = began
            self.array_rechecks = {p: r for p, r in self.array_rechecks.items() if r[0] > began}
            self.rechecks_asked = {p: t for p, t in self.rechecks_asked.items() if t > began}

    def known_layout(self, path: str) -> str | None:
        """The layout digest the mount read last for the array at ``path``: an open file's
        recheck of it, or the newest discovery's (None: no array there)."""
        recheck = self.array_rechecks.get(path)
        if recheck is not None and recheck[0] > self.layouts_read:
            return recheck[1]
        return None if self.array_layouts is None else self.array_layouts.get(path)

    def node_mtime_ns(self, path: str) -> int:
        """The mtime of the views of the array or group at ``path``: its metadata's."""
        return self.metadata_mtimes.get(path.strip("/"), self.stable_time_ns)

    def data_mtime_ns(self, path: str) -> int:
        """The mtime of the views that hold the bytes of the chunks at or below ``path``
        (data.raw, data.npy, chunk files, a netCDF file): its metadata's, or the last write
        through the mount below it when later. A chunk rewritten through the mount left
        them their metadata's mtime, and copy tools that take an unchanged size and mtime for
        unchanged bytes (rsync -a, make) kept the old copy."""
        return max(self.node_mtime_ns(path), self.changed_at_ns(path.strip("/")))

    def changed_at_ns(self, path: str) -> int:
        """When a key at or below ``path`` was last changed through the mount (0: never).
        Bounded as epoch() is: a path forgotten answers the newest time forgotten (a
        spurious change, never a missed one)."""
        entry = self._epochs.get(path)
        return self._floor_time_ns if entry is None else entry[2]

    @property
    def immutable(self) -> bool:
        """True when the data can never change while mounted: declared so
        (``metadata_ttl=indefinite``) and not writable through the mount."""
        return self.metadata_ttl is None and not self.writable

    # -- writes through the mount ----------------------------------------------------------

    #: paths whose write serial is remembered; older ones share the floor (see epoch())
    EPOCH_ENTRIES = 100_000
    #: directories whose mtime set through the mount is remembered (see dir_time())
    DIR_TIMES = 100_000

    def set_dir_time(self, path: str, mtime_ns: int) -> None:
        """The directory ``path`` of a store that keeps directory times was given ``mtime_ns``
        through the mount (``rsync -a``, ``cp -a``, ``touch -d``): shown from now on."""
        self._dir_times[path] = (mtime_ns, time.time_ns())
        self._dir_times.move_to_end(path)
        while len(self._dir_times) > self.DIR_TIMES:
            self._dir_times.popitem(last=False)  # forgotten: the directory shows its derived time

    def dir_time(self, path: str) -> int | None:
        """The mtime set on directory ``path`` through the mount, unless something at or
        below it changed through the mount since (then its derived time is the newer); None
        when none is remembered. A remount forgets them all, as it forgets every change."""
        if not self._dir_times:
            return None
        told = self._dir_times.get(path)
        if told is None or self.changed_at_ns(path) > told[1]:
            return None
        return told[0]

    def epoch(self, path: str) -> int:
        """A number that changes whenever a key at or below ``path`` is written through the
        mount. Caches of things derived from the store (raw blocks, decoded chunks, shard
        indexes) put it in their keys, so a write makes the old entries unreachable at once.

        Bounded: past EPOCH_ENTRIES paths, the least recently written are forgotten and
        every unremembered path answers the highest serial forgotten, which differs from
        any serial a cache entry of a forgotten path was made under (a spurious miss, never
        a stale hit).
        """
        entry = self._epochs.get(path)
        return self._floor if entry is None else entry[0]

    @property
    def unwritten(self) -> bool:
        """True until the first write through the mount: every epoch is 0 until then, so a
        walk of a million files need not build their paths to ask."""
        return not self._epochs

    def written(self, key: str) -> KeyInfo | None:
        """The key's info after its last write through the mount, if remembered."""
        entry = self._epochs.get(key)
        return None if entry is None else entry[1]

    @property
    def write_serial(self) -> int:
        """How many writes the mount has made: a value read before and after a discovery
        says whether one came in between."""
        return self._serial

    def note_write(self, key: str, info: KeyInfo | None = None) -> None:
        """``key`` (or the directory ``key/``) was changed through the mount: bump the epochs of
        it and of every directory above it, forget the decoded hierarchy (rediscovered on
        next use) and tell the fs layer to drop the kernel's caches of derived files."""
        self._serial += 1
        now = time.time_ns()
        parts = key.strip("/").split("/")
        paths = ["", *("/".join(parts[: i + 1]) for i in range(len(parts)))]
        for path in paths:
            self._epochs[path] = (self._serial, info if path == key else None, now)
            self._epochs.move_to_end(path)
        while len(self._epochs) > self.EPOCH_ENTRIES:
            _, (serial, _, when) = self._epochs.popitem(last=False)
            self._floor = max(self._floor, serial)
            self._floor_time_ns = max(self._floor_time_ns, when)
        parent, _, name = key.strip("/").rpartition("/")
        if name in DESCRIBING_NAMES and self.metadata_known is not None:
            self.metadata_known.forget(parent)  # read again, whatever its info says
        if name in DESCRIBING_NAMES:  # the views of that node take its metadata's new mtime
            when = info.mtime_ns if info is not None else time.time_ns()
            self.learn_mtimes({parent: max(when, self.metadata_mtimes.get(parent, 0))})
        self.listings.invalidate(("decoded",))
        for hook in self.on_change:
            hook()

    def note_replaced(self, key: str) -> None:
        """``key`` holds another version than the one the mount knew (a read pinned to the
        old one was refused), or none: changed behind the mount. Its directory is listed
        again (the whole tree's index, on a store listed flat) and what was derived from it
        goes, as after a write through the mount, so the next open reads what is there."""
        parent = key.rpartition("/")[0]
        self.listings.invalidate(parent + "/" if parent else "")
        self.listings.invalidate(("tree",))
        # what the mount's own last write of it made is kept: the refused read is most often
        # one that was pinned before that write (S3 fetching ahead for a reader that opened
        # while the file was rewritten), and a node that meets this epoch without an info
        # kept the size before the write, so stat showed the old size for the TTL
        self.note_write(key, self.written(key))

    async def listing(self, prefix: str) -> Listing:
        """The store's listing of directory ``prefix`` ('' or ending in '/'), made once for
        every asker within the metadata TTL.

        The raw tree's lookups and readdirs ask here, and so does df's count of a store
        listed a directory at a time while its tree is being listed (``views.usage``):
        ``find`` calls statfs as it starts,
        and a count that walked the store on its own had every directory listed twice (a
        stat a file, each time) while find waited on the same disk. A store that lists
        from memory answers on the trio thread; any other in an urgent worker hop, since a
        listing is what an ``ls`` waits for, which also sorts it (a flat directory of a
        million files takes a second), so no reader sorts it on the trio thread. Failures
        are the store's (StoreError)."""
        store = self.store

        def listed() -> Listing:
            got = store.list_dir(prefix)
            got.keys.seal()
            return got

        async def load() -> Listing:
            if store.lists_in_memory:
                return store.list_dir(prefix)
            return await self.workers.run_urgent(listed)

        return await self.listings.get(prefix, load)

    def _cached_listings(self, prefix: str) -> list[Listing]:
        """The cached listings that show directory ``prefix`` ('' or ending in '/'), to patch
        for a change. A listing of it still being fetched is not kept: it may have been
        answered before the change (an S3 listing then cached the written key's old ETag, and
        the writer's next open read ESTALE: a helper's soak)."""
        self.listings.outdate_load(prefix)
        self.listings.outdate_load(("tree",))  # a store listed flat (S3): its whole index
        out = []
        tree = self.listings.peek(("tree",))
        if isinstance(tree, dict):
            found = tree.get(prefix)
            if found is None:
                found = tree[prefix] = Listing()
            out.append(found)
        one = self.listings.peek(prefix)
        if one is not None:
            out.append(one)
        return out

    def held_tree(self) -> dict[str, Listing] | None:
        """The whole store's listing index (views.raw's ``tree_index``) if one is held now,
        else None; never loaded here. A store listed flat (S3) holds one once its raw tree
        was listed, for the metadata TTL, kept up to date by the writes through the mount."""
        tree = self.listings.peek(("tree",), count=False)
        return tree if isinstance(tree, dict) else None

    def listing_put(self, key: str, info: KeyInfo | None) -> None:
        """Show ``key`` (a file with ``info``, or the directory ``key/`` when None) in the
        cached listings at once, with every directory above it: a created file is seen by
        lookup and readdir without listing the store again."""
        parts = key.strip("/").split("/")
        prefix = ""
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            for listing in self._cached_listings(prefix):
                if last and info is not None:
                    listing.keys[part] = info
                else:
                    listing.prefixes.add(part)
            prefix += part + "/"

    def listing_new_dir(self, key: str) -> None:
        """Show the directory ``key/``, just made, as empty: a listing cached under its name
        before (of a directory renamed or removed since) showed its old entries, so zarr's
        ``mkdir -p`` of ``c/0`` was EEXIST from a ghost and the chunk's create then ENOENT."""
        self.listing_put(key, None)
        prefix = key.strip("/") + "/"
        tree = self.listings.peek(("tree",))
        if isinstance(tree, dict):
            tree[prefix] = Listing()
        if self.listings.peek(prefix) is not None:
            self.listings.put(prefix, Listing())

    def listings_forget(self, prefix: str, below: bool = True) -> None:
        """Forget the cached listing of directory ``prefix`` ('a/b/') and, with ``below``,
        those of the directories below it: a directory renamed away, or replaced by one
        renamed there, left its subdirectories' listings to be found again under the same
        names (a scan of the cache, so for a rename of a directory only: an rmdir's
        directory is empty). The whole tree's index forgets them all either way."""
        if below:
            self.listings.invalidate_matching(lambda k: isinstance(k, str) and k.startswith(prefix))
        else:
            self.listings.invalidate(prefix)
        tree = self.listings.peek(("tree",))
        if isinstance(tree, dict):
            for p in [p for p in tree if p.startswith(prefix)]:
                del tree[p]

    def listing_unknown(self, key: str) -> None:
        """The store holds ``key`` (a file, or the directory ``key/``) where the cached listing
        of its directory says otherwise: made behind the mount within the TTL, and found when
        the store refused to make it again (EEXIST). That listing is forgotten, so the next
        lookup finds what the store holds; on a store listed flat, the whole tree's index
        (which holds a directory it lacks as empty), to be listed again at the next lookup."""
        parent = key.strip("/").rpartition("/")[0]
        self.listings.invalidate(parent + "/" if parent else "")
        self.listings.invalidate(("tree",))

    def listing_drop(self, key: str, directory: bool = False, below: bool = False) -> None:
        """Remove ``key`` (or the directory ``key/``, its listing forgotten, and with ``below``
        its subdirectories' too: see listings_forget) from the cached listings."""
        parent, _, name = key.strip("/").rpartition("/")
        prefix = parent + "/" if parent else ""
        for listing in self._cached_listings(prefix):
            if directory:
                listing.prefixes.discard(name)
            else:
                listing.keys.pop(name, None)
        if directory:
            self.listings_forget(key.strip("/") + "/", below)

    def background(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` in the background, swallowing its errors (a prefetch that fails
        is retried by the read that needs it, which then reports the error)."""
        if self.nursery is None:
            return

        async def quiet() -> None:
            try:
                await fn(*args)
            except Exception as exc:  # noqa: BLE001
                log.debug("prefetch failed: %s", exc)

        self.nursery.start_soon(quiet)

    def prefetch(self, nbytes: int, fn: Callable[..., Awaitable[object]], *args: object) -> bool:
        """Start ``fn(*args)``, a read-ahead of about ``nbytes``, in the background; False (and
        nothing started) when the mount's read-ahead already has its budget in flight. Every
        reader's window draws on the one budget, so ten streaming readers cannot hold ten
        windows of decoded chunks, and what they refuse is read on demand."""
        if self.nursery is None or self._prefetching and self._prefetching + nbytes > self.prefetch_budget:
            return False
        self._prefetching += nbytes

        async def ahead() -> None:
            try:
                await fn(*args)
            finally:
                self._prefetching -= nbytes

        self.background(ahead)
        return True

    def list_ahead(self, prefixes: Iterable[str]) -> None:
        """List ``prefixes`` (directories a walk of the tree comes to next) in the background,
        at most the store's ``list_ahead`` at once: those past it are left to the walk, or
        to the next call. A listing made so is the one the walk then finds cached; one that
        fails is not kept, and the walk's own listing reports the error."""
        limit = self.store.list_ahead
        if self.nursery is None:  # not serving: nothing runs in the background
            return
        for prefix in prefixes:
            if self._listing_ahead >= limit:
                return
            if self.listings.contains(prefix):
                continue
            self._listing_ahead += 1
            self.counters.add("listings_ahead")
            self.background(self._list_ahead_one, prefix)

    async def _list_ahead_one(self, prefix: str) -> None:
        try:
            await self.listing(prefix)
        finally:
            self._listing_ahead -= 1

    #: keys of chunks loaded ahead and not yet read that are remembered, at most
    PREFETCHED_MAX = 65_536

    def prefetch_asked(self, key: object) -> None:
        """Read-ahead loads ``key``: remembered until a reader asks for it. A key loaded
        ahead and never read (a reader that stopped, a file changed since) went never: a
        daemon's set of them grew for weeks. Past PREFETCHED_MAX the oldest are forgotten
        (a reader of one of them is then not counted as a hit)."""
        self.prefetched[key] = None
        self.counters.add("prefetch_requests")
        if len(self.prefetched) > self.PREFETCHED_MAX:
            del self.prefetched[next(iter(self.prefetched))]

    def prefetch_hit(self, key: object) -> None:
        """A reader asks for ``key``: count it once as a hit if read-ahead loaded (or is loading) it."""
        if self.prefetched.pop(key, 0) is None:
            self.counters.add("prefetch_hits")

    def may_list_cells(self, grid: Hashable, cells: int, most: int) -> bool:
        """Whether a listing may number the ``cells`` files of chunk grid ``grid`` (an array
        and its view): yes for one numbered already at that size or larger; else while the
        mount's listings number at most ``most`` in all. A listed name keeps its number while its array
        lasts, and a few kilobytes of metadata declaring huge grids of unwritten chunks
        grew the daemon by 185 MB a listing, without bound (a helper's audit: 1.16 GB
        after six ``ls -f``, nothing logged)."""
        before = self._listed_cells.get(grid, 0)
        if cells <= before:
            return True
        # a grid grown since it was counted (its metadata rewritten) counts anew: counted at
        # its old size, an array listed at 1 cell then grown to 600,000 listed them all
        total = sum(self._listed_cells.values()) - before
        if total + cells > most:
            self.warn_once(f"cells {grid!r}", f"{grid[0] if isinstance(grid, tuple) else grid}: "
                           f"its {cells:,} chunk files are not listed: the mount's listings have "
                           f"numbered {total:,} of at most {most:,} (raise --cache-size for more); "
                           "each still opens by its name")
            return False
        self._listed_cells[grid] = cells
        return True

    def warn_once(self, tag: str, message: str) -> None:
        """Log ``message`` the first time ``tag`` is seen, so a bad key is one line, not one per lookup."""
        self.log_once.warning(tag, "%s", message)

