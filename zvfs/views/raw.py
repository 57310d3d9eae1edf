"""The raw tree: store key ``a/b`` is the file ``MOUNTPOINT/a/b``.

Directories come from the store's one-level listings (cached with the
metadata TTL, single-flight). Names that cannot be POSIX path segments are
skipped with one log line; when a key and a prefix share a name, the
directory wins (also logged once), as in the Zarr file-system store.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import trio

from zvfs.cache.tree import build_tree_index
from zvfs.stores.base import (
    KeyInfo,
    KeyNotFound,
    KeyReader,
    KeyWriter,
    Listing,
    Stale,
    StoreError,
    WriteRefused,
)
from zvfs.stores.keys import bad_segment, skipped_key
from zvfs.stores.listing import KeyTable
from zvfs.views.context import MountContext
from zvfs.views.file_walk import FileWalk, current_walk
from zvfs.views.node import DirNode, FileHandle, FileNode, LazyEntries, Node, NodeError, read_only
from zvfs.views.readahead import ReadAhead
from zvfs.views.tree_ahead import TreeAhead
from zvfs.views.writing import (
    UnstoredReader,
    WriteHandle,
    move_writers,
    names_changing,
    relink_writers,
    store_call,
    store_pending,
    unlink_writers,
)
from zvfs.workers import Workers, gather

log = logging.getLogger("zvfs")
T = TypeVar("T")

#: stores (with cheap flat listings) of up to this many keys are listed in one pass and
#: held as one index (about 160 bytes a key); a bigger one is listed per directory. At
#: 200,000, a 200,000-chunk array with its two metadata keys went past it after the whole
#: bucket had been listed, and was then listed again, directory by directory.
TREE_INDEX_LIMIT = 1_000_000
#: a store without a block cache reads the next small files with the one a reader asks
#: for, in one worker hop: files of at most BATCH_MEMBER bytes, BATCH_BYTES in all
BATCH_MEMBER = 256 << 10
BATCH_BYTES = 4 << 20


class RawFile(FileNode):
    """One store key.

    On a local store a read is one ranged get of exactly what was asked. On a
    store with a ``block_size`` (S3, zip) reads go through fixed blocks in the
    shared cache, and a sequential reader gets the next blocks fetched ahead
    of it, so latency is paid once per window instead of once per read.
    """

    # one per file the kernel knows: a store of a million keys has a million of them, so
    # what only an open needs (read-ahead, direct_io) lives on the reader (RawReader), and
    # what only a write changes is one slot, None until then (see _marks)
    __slots__ = ("ctx", "prefix", "name", "_src", "_marks")
    _ahead: ReadAhead | None = None

    def __init__(self, ctx: MountContext, key: str, info: KeyInfo, *, pinned: bool = False) -> None:
        self.ctx = ctx
        # the key is kept as its directory's prefix (shared) and the listing's name (shared)
        prefix, _, name = key.rpartition("/")
        self.prefix = prefix + "/" if prefix else ""
        self.name = name
        self._src: KeyInfo | KeyTable = info
        epoch = ctx.epoch(key)
        self._set_marks(pinned, epoch, epoch)

    @classmethod
    def child(cls, ctx: MountContext, prefix: str, name: str, listing: Listing) -> RawFile:
        """The file ``name`` of ``listing``, the directory ``prefix``: its strings are shared."""
        node = cls.__new__(cls)
        node.ctx, node.prefix, node.name = ctx, prefix, name
        node._src = listing.keys.source(name)  # the listing's table: no KeyInfo per node
        epoch = 0 if ctx.unwritten else ctx.epoch(prefix + name)
        node._set_marks(False, epoch, epoch)
        return node

    # -- what writes through the mount change: (pinned, epoch, born), None for (False, 0, 0)

    def _set_marks(self, pinned: bool, epoch: int, born: int) -> None:
        self._marks = None if not pinned and epoch == 0 and born == 0 else (pinned, epoch, born)

    @property
    def _pinned(self) -> bool:
        """Reads stay with the version this node was made for (an open, or a removed key)."""
        return self._marks is not None and self._marks[0]

    @property
    def _epoch(self) -> int:
        """The key's write epoch this node's info is of."""
        return 0 if self._marks is None else self._marks[1]

    @property
    def _born(self) -> int:
        """The key's write epoch when the kernel met this node."""
        return 0 if self._marks is None else self._marks[2]

    @property
    def key(self) -> str:
        return self.prefix + self.name

    @property
    def _info(self) -> KeyInfo:
        """Size, mtime and version (S3's ETag: reads are pinned to it) of the entry this node
        was made from, or of the write through the mount it has seen since."""
        src = self._src
        return src if isinstance(src, KeyInfo) else src.made_from(self.name)

    @property  # type: ignore[override]
    def immutable(self) -> bool:
        return self.ctx.immutable

    @property  # type: ignore[override]
    def writable(self) -> bool:
        return self.ctx.writable

    def _read_ahead(self) -> ReadAhead:
        # a window as large as the cache evicts the blocks fetched ahead before they are
        # read, and they are fetched (for zip: decompressed) again; a quarter of it, as
        # for the decoded arrays
        return ReadAhead(ceiling=max(self.ctx.store.block_size, min(64 << 20, self.ctx.cache_size // 4)))

    def _refresh(self) -> None:
        """Pick up a write through the mount since this node was made (or last refreshed)."""
        if self._pinned or self.ctx.unwritten:
            return
        key = self.key
        epoch = self.ctx.epoch(key)
        if epoch != self._epoch:
            self._set_marks(self._pinned, epoch, self._born)
            info = self.ctx.written(key)
            if info is not None:
                self._src = info

    def detach(self) -> None:
        self._set_marks(True, self._epoch, self._born)

    def _staged(self) -> bool:
        """Writes through this mount are staged locally, then stored (S3)."""
        return self.ctx.writable and self.ctx.store.stages_writes

    def _reads_locally(self) -> bool:
        """An open reads through a descriptor of its own (a directory store's file), not
        staged bytes nor a pinned remote version."""
        return self.ctx.store.opens_readers and not self._staged()

    async def lasting_reader(self) -> FileNode | None:
        if not self._reads_locally():
            return None
        try:
            return await self.reader()
        except NodeError:  # gone already: nothing to keep
            return None

    async def reader(self) -> FileNode:
        """An open reads the version there is now, whatever happens to the key meanwhile.

        A local file is read through one descriptor opened now (as on the directory, a
        rename over the key does not change what an open reader reads). An S3 object is
        read only from the version it has now (If-Match on its ETag, blocks cached under
        its epoch): a file replaced while it is read gives the old bytes from the cache or
        ESTALE, never a mix. While the key is being rewritten through the mount, readers
        get the stored object, not the staged bytes.

        The kernel keeps one size per inode, and a writer's truncating open changes it for
        every reader: so on a writable S3 mount reads bypass the kernel's page cache (as
        mountpoint-s3's do without its cache) and end where the pinned version ends; so
        does a local reader whose file is not the size the kernel was told (the key was
        replaced between the kernel's lookup and this open; the fs layer checks that).
        """
        self._refresh()
        store = self.ctx.store
        staged = self._staged()
        local = None
        if self._reads_locally():
            # on this thread where that cannot block (a path the kernel has cached), as a
            # thread hop is most of what such an open costs; else in a worker
            local = store.open_reader_at_once(self.key) or \
                await store_call(self.ctx, self.key, store.open_reader, self.key)
        if local is not None:
            if not self.ctx.writable:
                self._tree_ahead().opened(self.key)
            node = LocalReader(self.key, local, self._info.mtime_ns, self.ctx.workers)
            # written through the mount since the kernel met this inode: the kernel's size
            # for it may be another version's, so the reader reads to its own end
            node.direct_io = self._epoch != self._born
            return node
        if staged and (writing := self.ctx.writers.get(self.key)) and not writing[-1].writer.stored:
            return UnstoredReader(writing[-1])  # nothing stored to read yet
        info = self._info
        if staged and info.version is None:
            # written through the mount, which does not learn the new object's ETag: pin this
            # open to the object there is now (size and ETag from one HEAD), so a later
            # overwrite can never mix into its reads
            info = await store_call(self.ctx, self.key, store.info, self.key)
        # zip: the same bytes, following writes as this node does; else pinned to this version
        mine = RawReader(self.ctx, self.key, info,
                         pinned=self._pinned or info.version is not None or staged)
        mine._set_marks(mine._pinned, self._epoch, self._born)
        mine.direct_io = staged
        return mine

    def learn(self, reader: FileNode) -> bool:
        """A local file opened at another size or mtime than its listing's (rewritten behind
        the mount, within the metadata TTL): the listing and this node take the file's, so
        the kernel, once told to ask again, gets the size the open reads (it read past a
        stale size with direct_io, which failed mmap with ENODEV, while stat and fstat
        showed the old size for the TTL). Not while the mount writes the key: its size is
        the writer's."""
        if not isinstance(reader, LocalReader) or self._pinned or self.ctx.writers.get(self.key):
            return False
        info = reader.stat_info()
        self._src = info
        self.ctx.listing_put(self.key, info)
        return True

    def _tree_ahead(self) -> TreeAhead:
        ahead = self.ctx.tree_ahead
        if ahead is None:
            ahead = self.ctx.tree_ahead = TreeAhead(self.ctx)
        return ahead

    def _entry(self) -> tuple[int, int]:
        """Size and mtime of the entry this node was made from, or of the write through the
        mount it has seen since: one lookup in the listing's table for both."""
        self._refresh()
        src = self._src
        return (src.size, src.mtime_ns) if isinstance(src, KeyInfo) else src.made_size_and_mtime_ns(self.name)

    def _writing_size(self) -> int | None:
        """The size of the newest open writer of this key, if any (what a stat must show)."""
        handles = self.ctx.writers.get(self.key) if self.ctx.writers else None
        return handles[-1].size if handles else None

    @property
    def size(self) -> int:
        writing = self._writing_size()
        return self._entry()[0] if writing is None else writing

    @property  # type: ignore[override]
    def mtime_ns(self) -> int:
        return self._entry()[1]

    def size_and_mtime_ns(self) -> tuple[int, int]:
        size, mtime = self._entry()
        writing = self._writing_size()
        return (size if writing is None else writing), mtime

    def version(self) -> object:
        self._refresh()
        return (self.key, self._info.size, self._info.mtime_ns, self._epoch)

    # -- writing ----------------------------------------------------------------------------

    async def open_write(self, truncate: bool) -> FileHandle:
        if not self.writable:
            raise NodeError(errno.EROFS)
        if not self.ctx.store.stages_writes:  # a local file: each open has its own descriptor
            return WriteHandle(self.ctx, self.key, await self._open_writer(truncate))
        # S3: every open of a file being written shares its staged copy, so the mount shows
        # one file whichever open writes it (as a directory does), and each close stores that
        # file whole. An open still under way (its HEAD) is waited for, to share the writer it makes
        while (opening := self.ctx.writers_opening.get(self.key)) is not None:
            await opening.wait()
        open_now = self.ctx.writers.get(self.key)
        if open_now:
            shared = open_now[-1]
            # a peer from now on, before the truncate's worker hop: the last other open's
            # release during it closed the writer, and this open wrote to a closed descriptor
            # (EBADF: a rewrite just after an append failed EIO, a helper's soak)
            handle = WriteHandle(self.ctx, self.key, shared.writer, peers=shared.peers,
                                 base_reader=self._base_reader)
            if truncate:
                try:
                    await store_call(self.ctx, self.key, shared.writer.truncate, 0)
                except BaseException:
                    with trio.CancelScope(shield=True):
                        await handle.release()
                    raise
            return handle
        opened = self.ctx.writers_opening[self.key] = trio.Event()
        try:
            return WriteHandle(self.ctx, self.key, await self._open_writer(truncate),
                               base_reader=self._base_reader)
        finally:
            del self.ctx.writers_opening[self.key]
            opened.set()

    def _base_reader(self, key: str, info: KeyInfo) -> RawReader:
        """A reader, pinned to ``info``'s version, for an open for writing that has fetched
        none of that version (see WriteHandle.read)."""
        return RawReader(self.ctx, key, info, pinned=True)

    async def _open_writer(self, truncate: bool) -> KeyWriter:
        store = self.ctx.store
        try:
            writer = await store_call(self.ctx, self.key, store.open_writer, self.key, truncate=truncate,
                                      create=False)
        except NodeError as exc:
            if exc.errno != errno.ENOENT or not truncate:
                raise
            # gone from the store since the kernel met it (a new file whose upload failed):
            # an open that replaces the bytes makes it again
            writer = await store_call(self.ctx, self.key, store.open_writer, self.key, truncate=True,
                                      create=True)
            info = KeyInfo(0, time.time_ns())
            self.ctx.listing_put(self.key, info)
            self.ctx.note_write(self.key, info)
        return writer

    async def sync(self) -> None:
        await store_pending(self.ctx, self.key)

    async def set_size(self, size: int) -> None:
        handle = await self.open_write(truncate=size == 0)
        try:
            await handle.truncate(size)
            await handle.flush()
        finally:
            await handle.release()

    async def set_mtime_ns(self, mtime_ns: int) -> None:
        if not self.writable:
            raise NodeError(errno.EROFS)
        await store_call(self.ctx, self.key, self.ctx.store.set_mtime_ns, self.key, mtime_ns)
        if not self.ctx.store.implicit_dirs:  # S3 keeps its own LastModified
            info = KeyInfo(self.size, mtime_ns)
            self.ctx.listing_put(self.key, info)
            self.ctx.note_write(self.key, info)

    async def _from_store(self, fn: Callable[[], T]) -> T:
        """``fn()``, this file's store calls, in one worker hop; a store failure as the
        errno the application sees."""
        try:
            return await self.ctx.workers.run(fn)
        except KeyNotFound as exc:
            self.ctx.note_replaced(self.key)
            if self.ctx.writable and self._info.version is not None:
                # on a writable mount an open is pinned to its version (README): that version
                # gone, the handle is stale, as when it is replaced. (A read-only mount keeps
                # ENOENT for a listed key that vanished.)
                raise NodeError(errno.ESTALE, f"{self.key}: removed from the store since it "
                                "was opened") from exc
            raise NodeError(errno.ENOENT, f"{self.key}: vanished from the store") from exc
        except Stale as exc:
            self.ctx.note_replaced(self.key)
            raise NodeError(errno.ESTALE, str(exc)) from exc
        except StoreError as exc:
            raise NodeError(errno.EIO, str(exc), key=self.key) from exc  # store errors name the key

    async def _get_range(self, start: int, length: int, ahead: Sequence[str] = ()) -> bytes:
        """``ahead``: keys to hint to the store as read next, in the same hop, after the read
        (before it, their reads would queue in front of this one)."""
        store = self.ctx.store
        # the whole object in one block: a plain get, which S3 checks against its CRC
        whole = bool(store.block_size) and start == 0 and length >= self._info.size

        def fetch() -> bytes:
            got = store.get_version(self.key, start, None if whole else length, self._info.version,
                                    length + 1 if whole else None)
            if ahead:
                store.will_need(ahead)
            return got

        data = await self._from_store(fetch)
        # a whole-object get of an object that grew since it was listed: what a range gives
        return data[:length] if len(data) > length else data

    async def _block(self, n: int, prefetch: bool = False) -> bytes:
        bs = self.ctx.store.block_size
        info = self._info
        key = self._block_key(n)
        if prefetch:
            if self.ctx.chunks.contains(key):
                return b""
            self.ctx.prefetch_asked(key)
        else:
            self.ctx.prefetch_hit(key)
        start = n * bs
        return await self.ctx.chunks.get(key, lambda: self._get_range(start, min(bs, info.size - start)))

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        self._refresh()
        size = self._info.size
        if offset >= size or length <= 0:
            return b""
        end = min(size, offset + length)
        bs = self.ctx.store.block_size
        if bs <= 0:
            return await self._read_unblocked(offset, end)
        if offset == 0:
            self._siblings_ahead()
        ahead = self._ahead.advise(offset, end, size) if self._ahead is not None else None
        if ahead is not None:
            for n in range(ahead[0] // bs, (ahead[1] - 1) // bs + 1):
                if not self.ctx.prefetch(bs, self._block, n, True):
                    break
        first, last = offset // bs, (end - 1) // bs
        if self._ahead is None:
            data = await self._blocks(first, last)
        else:
            with self._ahead.reading(offset, end) as answered_to:
                run_start = self._ahead.run_start
                data = await self._blocks(first, last)
                self._release(run_start, answered_to(), size)
        return data[offset - first * bs : end - first * bs]

    async def _blocks(self, first: int, last: int) -> memoryview:
        """Blocks ``first`` to ``last`` as one buffer: a view of the cached block when it is
        one (no copy)."""
        if first == last:
            return memoryview(await self._block(first))
        blocks = await gather(list(range(first, last + 1)), self._block)
        return memoryview(b"".join(blocks[n] for n in range(first, last + 1)))

    def _release(self, start: int, end: int, size: int) -> None:
        """Drop the blocks this open has now read to their end, in the sequential run of
        reads that began at ``start`` and has been answered up to ``end``
        (:meth:`ReadAhead.reading`: not past a read of this open still under way).

        A streamed file's bytes are in the kernel's page cache by then (or read once, with
        direct_io), so keeping them here too only doubled the daemon's memory: reading
        110 MiB of S3 objects left 195 MiB resident. Blocks read in part, fetched ahead and
        not read yet, or read by a seeking reader, stay under the cache's LRU bound."""
        bs = self.ctx.store.block_size
        stop = -(-end // bs) if end == size else end // bs  # the last block ends at the file's end
        for n in range(-(-start // bs), stop):
            self.ctx.chunks.invalidate(self._block_key(n))

    def _block_key(self, n: int) -> tuple[object, ...]:
        """Block ``n`` of this version of the file, in the mount's cache."""
        info = self._info
        return ("raw", self.key, info.size, info.mtime_ns, info.version, self._epoch, n)

    def _walk(self) -> FileWalk | None:
        """How far a reader that starts files in tree order has got (see current_walk)."""
        return current_walk(self.ctx, self.prefix)

    def _siblings_ahead(self) -> None:
        """The next files' first blocks, fetched ahead in the background, with a window that
        grows, for a reader that starts files in tree order."""
        walk = self._walk()
        for key, info in walk.advise(self.key) if walk else ():
            node = RawFile(self.ctx, key, info)
            if not self.ctx.prefetch(min(info.size, self.ctx.store.block_size), node._block, 0, True):
                break

    def _hint(self, keys: list[str]) -> None:
        """``Store.will_need(keys)`` in a worker hop of its own, in the background (for a
        read that needs no hop to carry it)."""
        if keys:
            self.ctx.background(self.ctx.workers.run, self.ctx.store.will_need, keys)

    def _walked(self, walk: FileWalk | None) -> tuple[bool, list[str]]:
        """Record in ``walk`` that this file is read from its start: whether the reader
        streams files in order, and the files it now reaches that no batch will read (too
        big: the kernel reads them ahead, see _read_unblocked)."""
        ahead = walk.advise(self.key) if walk is not None else []
        later = walk.hints([k for k, info in ahead if info.size > BATCH_MEMBER]) if walk else []
        return bool(ahead), later

    def resident(self) -> bytes | memoryview | None:
        """The whole file when it is in the cache already, let go from there: the kernel's
        pages hold it from this open on. A small zip member read with the one before it
        (see _read_unblocked) or found in the page cache (read here, at once), or a small
        object whose one block was fetched ahead (see _siblings_ahead). Counted as read from its start, so the reader's walk goes on as
        if its read had come: its hints, or the next files fetched ahead."""
        bs = self.ctx.store.block_size
        size = self._info.size
        if bs > 0 and size > bs:
            return None
        key = self._block_key(0)
        kept = self.ctx.chunks.peek(key)
        if kept is not None and len(kept) == size:
            self.ctx.chunks.invalidate(key)
        elif bs > 0 or not 0 < size <= BATCH_MEMBER:
            return None
        else:
            # a small member the page cache holds (the kernel's read-ahead of the archive
            # while the one before was read): read here, no read request to wait for
            kept = self.ctx.store.get_range_at_once(self.key, 0, size)
            if kept is None or len(kept) != size:
                return None
        if bs > 0:
            self.ctx.prefetch_hit(key)
            self._siblings_ahead()
        else:
            self._hint(self._walked(self._walk())[1])
        return kept

    async def _read_unblocked(self, offset: int, end: int) -> bytes | memoryview:
        """A read of a store without a block cache (a zip of stored members): a range of the
        member in one worker hop, or its bytes, read already with a file before it.

        A reader that starts bigger files in tree order has the store read the files ahead
        of it that its walk now reaches (``Store.will_need``: the kernel reads them in the
        background), so it does not wait on the disk for each file in turn.

        A reader that starts small files in tree order has the next ones read whole in the
        same hop as this one, and kept until it reads them: a member of a few hundred bytes
        costs a hop, and 20,000 of them cost 20,000 hops one by one. What is kept is let go
        once read to its end (the kernel's page cache has it then)."""
        walk = self._walk() if offset == 0 else None
        streaming, later = self._walked(walk)
        key = self._block_key(0)
        kept = self.ctx.chunks.peek(key)
        if kept is not None:
            if end >= len(kept):
                self.ctx.chunks.invalidate(key)
            self._hint(later)  # this file was read already
            return memoryview(kept)[offset:end]
        batch: list[RawFile] = [self]
        total = self._info.size
        if streaming and walk is not None and total <= BATCH_MEMBER:
            for k, info in walk.following(self.key, FileWalk.MAX_WINDOW):
                if info.size > BATCH_MEMBER or total + info.size > BATCH_BYTES:
                    break
                node = RawFile(self.ctx, k, info)
                if not self.ctx.chunks.contains(node._block_key(0)):
                    batch.append(node)
                    total += info.size
        store = self.ctx.store
        if len(batch) == 1:
            # bytes the kernel has read ahead already: on this thread, no hop to wait for
            data = store.get_range_at_once(self.key, offset, end - offset)
            if data is None:
                return await self._get_range(offset, end - offset, later)
            self._hint(later)
            return data

        def read_all() -> list[bytes | None]:
            out: list[bytes | None] = []
            for node in batch:
                try:
                    # limit: a server that announces more than was listed is not read past
                    # it (one byte more tells the file grew: not kept, below)
                    out.append(store.get_version(node.key, 0, None, node._info.version,
                                                 node._info.size + 1))
                except StoreError:
                    if node is self:
                        raise
                    out.append(None)  # read on its own when asked, and fails there
            if later:
                store.will_need(later)
            return out

        data = await self._from_store(read_all)
        for node, got in zip(batch[1:], data[1:], strict=True):
            if got is not None and len(got) == node._info.size:
                self.ctx.chunks.put(node._block_key(0), got)
        return memoryview(data[0] or b"")[offset:end]


class RawReader(RawFile):
    """One open of a RawFile: with its own read-ahead, and direct_io when its bytes are not
    what the kernel caches (staged writes on S3)."""

    __slots__ = ("_ahead", "direct_io")

    def __init__(self, ctx: MountContext, key: str, info: KeyInfo, *, pinned: bool = False) -> None:
        super().__init__(ctx, key, info, pinned=pinned)
        self._ahead = self._read_ahead()
        self.direct_io = False


class LocalReader(FileNode):
    """One open of a local file (directory store): reads go to the descriptor opened at open."""

    def __init__(self, key: str, reader: KeyReader, mtime_ns: int, workers: Workers) -> None:
        self.key = key
        self._reader = reader
        self._workers = workers
        self.mtime_ns = mtime_ns
        self.immutable = False
        self.validated = True  # the descriptor's fstat, taken at this open

    @property
    def size(self) -> int:
        return self._reader.size

    def version(self) -> object:
        return self._reader.version

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        # to the file's end now, not at open: a truncate or write through another open of
        # it (or outside the mount) is seen, as through a descriptor of the file itself
        if length <= 0:
            return b""
        # on this thread when the page cache holds the bytes (no hop); else in a worker
        data = self._reader.read_at_once(offset, length)
        if data is not None:
            return data
        try:
            return await self._workers.run(self._reader.read, offset, length)
        except Stale as exc:  # an open that holds no descriptor, its file replaced or removed
            raise NodeError(errno.ESTALE, str(exc)) from exc
        except StoreError as exc:
            raise NodeError(errno.EIO, str(exc), key=self.key) from exc

    async def sync(self) -> None:
        try:
            await self._workers.run(self._reader.sync)
        except WriteRefused as exc:
            raise NodeError(exc.errno, str(exc), key=self.key) from exc
        except StoreError as exc:
            raise NodeError(errno.EIO, str(exc), key=self.key) from exc

    def stat_info(self) -> KeyInfo:
        """Size and mtime of the file this open reads, as its descriptor found it at open."""
        return KeyInfo(self._reader.size, self._reader.mtime_ns or self.mtime_ns)

    def current_size_and_mtime_ns(self) -> tuple[int, int] | None:
        return self._reader.current_size_and_mtime_ns()

    def unnamed(self) -> bool:
        return self._reader.unnamed()

    def again(self) -> LocalReader | None:
        reader = self._reader.again()
        if reader is None:
            return None
        node = LocalReader(self.key, reader, self.mtime_ns, self._workers)
        node.direct_io = self.direct_io
        return node

    def released(self) -> None:
        self._reader.close()


class RawDir(DirNode):
    """The store prefix ``prefix`` ('' for the root, else ending in '/')."""

    __slots__ = ("ctx", "prefix", "writable")

    def __init__(self, ctx: MountContext, prefix: str = "") -> None:
        self.ctx = ctx
        self.prefix = prefix
        self.writable = ctx.writable

    @property
    def mtime_ns(self) -> int:  # type: ignore[override]
        """The store's newest metadata mtime as it is now, or the last change through the
        mount at or below this directory when later.

        As it is now, not as it was when this node was made: a directory's nodes are made
        again (a lookup, a listing of its parent) while the kernel holds an older one, and
        after a metadata write through the mount the two told two mtimes, so `tar c` found
        the directory changing as it read it. And moved by a name made, removed or renamed
        in it, as POSIX has it: tools cache a listing by a directory's mtime (Python's import
        system missed a module written after a first import from the same directory; git's
        untracked cache, new files). A write deeper down moves it too: a needless new
        listing for such a tool, never a stale one. Or the time a utimens through the mount
        set on a store that keeps it, since: rsync -a sets each directory's time after
        filling it, and found it changed again at every run. Or, before all of that, the
        time the store records for the directory (a zip's directory entry, which `rsync -a`
        from fuse-zip and ratarmount keeps)."""
        ctx = self.ctx
        path = self.prefix.rstrip("/")
        told = ctx.dir_time(path)
        if told is not None:
            return told
        own = ctx.store.dir_mtime_ns(self.prefix)
        base = ctx.stable_time_ns if own is None else own
        if ctx.unwritten:
            return base
        return max(base, ctx.changed_at_ns(path))

    async def _listing(self) -> Listing:
        """This directory's listing; on a store listed flat, from the whole tree's index."""
        tree = await self.tree_index()
        if tree is not None:
            return self._with_made_dirs(tree.get(self.prefix) or Listing())

        try:
            listing = await self.ctx.listing(self.prefix)
        except StoreError as exc:
            raise NodeError(errno.EIO, f"listing {self.prefix or '/'}: {exc}") from exc
        return self._with_made_dirs(listing)

    async def tree_index(self) -> dict[str, Listing] | None:
        """The whole store's listing index (prefix -> Listing), loaded once per metadata TTL
        and shared by every directory; None for a store listed per directory, or one with
        more keys than the index holds. The first load goes on with the listing the mount's
        scan began (``ctx.listing_under_way``), waiting for it, rather than list the store
        a second time alongside it."""
        ctx = self.ctx
        if not ctx.store.flat_listing:
            return None

        async def load_tree() -> dict[str, Listing] | bool:
            under_way, ctx.listing_under_way = ctx.listing_under_way, None
            keys = await under_way() if under_way is not None else None
            try:
                return await ctx.workers.run_urgent(build_tree_index, ctx.store, TREE_INDEX_LIMIT, keys) or False
            except StoreError as exc:
                raise NodeError(errno.EIO, f"listing /: {exc}") from exc

        tree = await ctx.listings.get(("tree",), load_tree)
        return None if tree is False else tree

    def _with_made_dirs(self, listing: Listing) -> Listing:
        """What the mount holds that the store does not list yet shows too: directories
        made by mkdir on S3 (until removed), and files open for writing (until stored)."""
        made = self.ctx.made_dirs.get(self.prefix) if self.ctx.made_dirs else None
        if made and not made <= listing.prefixes:
            listing.prefixes |= made
        for key in self.ctx.writers:
            parent, _, name = key.rpartition("/")
            if (parent + "/" if parent else "") == self.prefix and name not in listing.keys:
                listing.keys[name] = KeyInfo(0, time.time_ns())
        return listing

    def _usable(self, name: str, listing: Listing) -> bool:
        if bad_segment(name) is not None:
            self._skipping(name, listing)
            return False
        # the prefixes first: a set of a few, where the keys are searched (a million names)
        if name in listing.prefixes and name in listing.keys:
            self._clash(name)
        return True

    def _skipping(self, name: str, listing: Listing) -> None:
        # a prefix of the listing stands for the keys below it: 'x//y' is listed in x/ as the
        # prefix '', and "store key 'x/'" named a key the store does not hold
        key = self.prefix + name
        self.ctx.warn_once("bad:" + key, skipped_key(key, under=name in listing.prefixes))

    def _clash(self, name: str) -> None:
        self.ctx.warn_once(
            "clash:" + self.prefix + name,
            f"store key {self.prefix + name!r} is also a prefix; showing the directory",
        )

    def _child(self, name: str, listing: Listing) -> Node:
        if name in listing.prefixes:
            return RawDir(self.ctx, self.prefix + name + "/")
        try:
            return RawFile.child(self.ctx, self.prefix, name, listing)
        except KeyError:
            # listed, then removed through the mount before readdir came to it (the listing
            # makes its nodes when read): readdir leaves such a name out
            return RawFile(self.ctx, self.prefix + name, KeyInfo(0, self.mtime_ns), pinned=True)

    def _list_ahead(self, listing: Listing) -> None:
        """A walk of the tree (find, du, ls -R, rsync) opens this directory's subdirectories
        next, in sorted order, and then the siblings after it: have their listings made
        ahead, a few at once (the store's ``list_ahead``), while this one is read.

        Only on a read-only mount, as with TreeAhead: a listing made in the background and
        cached after a write through the mount could hide that write."""
        window = 2 * self.ctx.store.list_ahead
        ahead = [self.prefix + p + "/" for p in listing.prefixes_after(None, window)]
        if self.prefix:
            above, _, name = self.prefix[:-1].rpartition("/")
            above = above + "/" if above else ""
            parent = self.ctx.listings.peek(above, count=False)
            if isinstance(parent, Listing):
                ahead += [above + p + "/" for p in parent.prefixes_after(name, window)]
        self.ctx.list_ahead(ahead)

    async def warm(self) -> None:
        """Load this directory's listing (the whole tree index on S3) into the cache now."""
        await self._listing()

    async def lookup(self, name: str) -> Node | None:
        listing = await self._listing()
        if (name in listing.prefixes or name in listing.keys) and self._usable(name, listing):
            return self._child(name, listing)
        return None

    async def children(self) -> Sequence[tuple[str, Node]]:
        return await self.entries()

    async def entries(self, shown: Mapping[str, Node | None] | None = None) -> LazyEntries:
        """:meth:`children`, with each name of ``shown`` as its node there (None: left out).

        The names are the listing's own, read in place, and each node is made when its
        entry is read: a directory of 400,000 keys made its whole list of (name, node) here,
        and held the mount's one thread for half a second, at every listing."""
        listing = await self._listing()
        if self.ctx.store.list_ahead and not self.ctx.writable:
            self._list_ahead(listing)
        given = {name: node for name, node in (shown or {}).items() if node is not None}
        names, unsafe = listing.names_view(hide=shown or (), add=given)
        for name in unsafe:
            self._skipping(name, listing)
        for name in listing.prefixes:
            if name in listing.keys and name not in unsafe:
                self._clash(name)
        child = self._child

        def entry(i: int) -> tuple[str, Node]:
            name = names[i]
            node = given.get(name) if given else None
            return name, child(name, listing) if node is None else node

        return LazyEntries(names, entry)

    # -- writing ----------------------------------------------------------------------------

    def _key(self, name: str, new: bool = True) -> str:
        """The key of ``name`` here, to write; ``new=False`` for a name that must be there
        already (removed, or renamed away), which may be one the store listed that is not
        UTF-8 (a directory store's file): it can go, where no new one can be made."""
        if not self.writable:
            raise NodeError(errno.EROFS)
        try:
            size = len(name.encode())
        except UnicodeEncodeError:  # bytes that are not UTF-8 (os.fsdecode's surrogates)
            if new:
                raise NodeError(errno.EINVAL, f"{self.prefix}{name!r}: not UTF-8, as store keys are") from None
            size = len(os.fsencode(name))
        if bad_segment(name) is not None or size > 255:
            raise NodeError(errno.EINVAL if size <= 255 else errno.ENAMETOOLONG)
        return self.prefix + name

    async def create(self, name: str, exclusive: bool, truncate: bool = True) -> tuple[FileNode, FileHandle]:
        key = self._key(name)
        listing = await self._listing()
        if name in listing.prefixes:
            raise NodeError(errno.EISDIR)
        if name in listing.keys:
            if exclusive:
                raise NodeError(errno.EEXIST)
            # a file the kernel believed absent: opened as any open of it is (S3's opens of
            # one file share its staged copy)
            node = self._child(name, listing)
            if isinstance(node, RawFile):
                try:
                    return node, await node.open_write(truncate)
                except NodeError as exc:
                    if exc.errno != errno.ENOENT:
                        raise  # gone from the store since it was listed: made below
        # absent from the listing, not always from the store (written there since it was
        # listed): without O_TRUNC the store opens what it holds, and the bytes stay. Every
        # create emptied it, so `>>` or `touch` of such a file lost its bytes. An exclusive
        # create keeps none either way (cp's O_EXCL: S3 asks nothing before the upload, whose
        # If-None-Match refuses a key that exists)
        truncate = truncate or exclusive
        writer = await self._making(key, store_call(self.ctx, key, self.ctx.store.open_writer, key,
                                                     truncate=truncate, create=True, exclusive=exclusive))
        handle = WriteHandle(self.ctx, key, writer)
        info = KeyInfo(0, time.time_ns()) if truncate else KeyInfo(writer.size, writer.mtime_ns or time.time_ns())
        self.ctx.listing_put(key, info)
        self.ctx.note_write(key, info)
        return RawFile(self.ctx, key, info), handle

    async def _making(self, key: str, call: Awaitable[T]) -> T:
        """Await a store call that makes ``key``, which this directory's cached listing
        lacks: the store's EEXIST means it was made behind the mount (`mkdir -p` of such a
        directory was EEXIST, and then ENOENT from its own stat)."""
        try:
            return await call
        except NodeError as exc:
            if exc.errno == errno.EEXIST:
                self.ctx.listing_unknown(key)
            raise

    async def mkdir(self, name: str) -> DirNode:
        key = self._key(name)
        listing = await self._listing()
        if name in listing.prefixes or name in listing.keys:
            raise NodeError(errno.EEXIST)
        await self._making(key, store_call(self.ctx, key, self.ctx.store.make_dir, key + "/"))
        if self.ctx.store.implicit_dirs:
            self.ctx.made_dirs.setdefault(self.prefix, set()).add(name)
        self.ctx.listing_new_dir(key)
        self.ctx.note_write(key)
        return RawDir(self.ctx, key + "/")

    async def unlink(self, name: str) -> None:
        key = self._key(name, new=False)
        listing = await self._listing()
        if name in listing.prefixes:
            raise NodeError(errno.EISDIR)
        if name not in listing.keys:
            raise NodeError(errno.ENOENT)
        # a file unlinked while written is not stored after all: told before the delete,
        # so that no close() meanwhile stores it again (S3); one that stores it now ends first
        async with names_changing(self.ctx, key):
            writers = unlink_writers(self.ctx, key)
            try:
                await store_call(self.ctx, key, self.ctx.store.delete, key)
            except BaseException:
                relink_writers(self.ctx, key, writers)
                raise
        self.ctx.listing_drop(key)
        self.ctx.note_write(key)

    async def rmdir(self, name: str) -> None:
        key = self._key(name, new=False)
        listing = await self._listing()
        if name not in listing.prefixes:
            raise NodeError(errno.ENOTDIR if name in listing.keys else errno.ENOENT)
        inside = await RawDir(self.ctx, key + "/")._listing()
        if inside.keys or inside.prefixes:
            raise NodeError(errno.ENOTEMPTY)
        await store_call(self.ctx, key, self.ctx.store.remove_dir, key + "/")
        self.ctx.made_dirs.get(self.prefix, set()).discard(name)
        self.ctx.listing_drop(key, directory=True)
        self.ctx.note_write(key)

    async def rename(self, name: str, target: DirNode, new_name: str, replace: bool) -> None:
        if isinstance(target, RawDirHolder):
            # the root's own names, from whichever directory: `mv sub/d .zvfs` moved the
            # store's sub/d under the name the mount keeps, and the kernel, holding .zvfs
            # for the rename, never answered the invalidation of its entries (a helper's audit)
            target._plain(new_name)
            target = target.raw
        if not isinstance(target, RawDir):
            # into .zvfs/: read-only, as a rename or link out of it or within it is (EXDEV
            # here made mv copy the file, and then fail to create it)
            raise read_only()
        if target.ctx is not self.ctx:
            raise NodeError(errno.EXDEV)
        src, dst = self._key(name, new=False), target._key(new_name)
        if src == dst:
            return
        listing, dst_listing = await self._listing(), await target._listing()
        src_dir = name in listing.prefixes
        if not src_dir and name not in listing.keys:
            raise NodeError(errno.ENOENT)
        dst_dir = new_name in dst_listing.prefixes
        dst_file = new_name in dst_listing.keys and not dst_dir
        if (dst_dir or dst_file) and not replace:
            raise NodeError(errno.EEXIST)
        # after any upload of the files renamed or replaced that is under way, none meanwhile
        async with names_changing(self.ctx, src, dst, below=src_dir):
            store = self.ctx.store
            if src_dir:
                if dst_file:
                    raise NodeError(errno.ENOTDIR)
                if (dst + "/").startswith(src + "/"):
                    raise NodeError(errno.EINVAL)
                if dst_dir:
                    inside = await RawDir(self.ctx, dst + "/")._listing()
                    if inside.keys or inside.prefixes:
                        raise NodeError(errno.ENOTEMPTY)
                    if store.implicit_dirs:
                        target.ctx.made_dirs.get(target.prefix, set()).discard(new_name)
                try:
                    await store_call(self.ctx, src, store.rename_dir, src + "/", dst + "/", replace)
                except NodeError:
                    self._forget_both(target, src, dst)
                    raise
                await move_writers(self.ctx, src, dst, directory=True)
                if store.implicit_dirs and name in self.ctx.made_dirs.get(self.prefix, ()):
                    self.ctx.made_dirs[self.prefix].discard(name)
                    self.ctx.made_dirs.setdefault(target.prefix, set()).add(new_name)
                for made in [p for p in self.ctx.made_dirs if p.startswith(src + "/")]:
                    # empty directories made below it (S3) move with it
                    self.ctx.made_dirs[dst + made[len(src):]] = self.ctx.made_dirs.pop(made)
                self.ctx.listing_drop(src, directory=True, below=True)
                self.ctx.listing_put(dst, None)
                self.ctx.listings.invalidate(("tree",))  # the moved keys are listed again
                self.ctx.listings_forget(dst + "/")
            else:
                if dst_dir:
                    raise NodeError(errno.EISDIR)
                try:
                    await store_call(self.ctx, src, store.rename, src, dst, replace)
                except NodeError as exc:
                    # a file made through the mount and open, not stored yet (S3): nothing to
                    # copy, its bytes are all staged; the file the rename replaces goes now
                    if exc.errno != errno.ENOENT or not store.stages_writes or src not in self.ctx.writers:
                        await self._learn_both(target, src, dst)  # S3: copied, maybe, and not removed
                        raise
                    if dst_file:
                        await store_call(self.ctx, dst, store.delete, dst)
                unlink_writers(self.ctx, dst)  # a file replaced while open for writing
                await move_writers(self.ctx, src, dst)
                info = listing.keys[name]
                self.ctx.listing_drop(src)
                self.ctx.listing_put(dst, info)
                self.ctx.note_write(dst, info)
        self.ctx.note_write(src)

    def _forget_both(self, target: RawDir, src: str, dst: str) -> None:
        """A rename that failed part way (S3 copies, then deletes, key by key): ``dst`` may
        hold the bytes now, or some of a directory's keys, and ``src`` the rest or all. The
        cached listings of both, and of the directories holding them, are listed again from
        the store, so ``ls`` and ``stat`` show each key where it is and as it is, rather than
        as before the rename for the metadata TTL."""
        for prefix in (src + "/", dst + "/"):
            self.ctx.listings_forget(prefix)
        for parent in {self.prefix, target.prefix}:
            self.ctx.listings.invalidate(parent)
        self.ctx.listings.invalidate(("tree",))
        self.ctx.note_write(src)
        self.ctx.note_write(dst)

    async def _learn_both(self, target: RawDir, src: str, dst: str) -> None:
        """:meth:`_forget_both` for a file, whose nodes the kernel holds keep the size and
        version they knew unless told the new ones: each name as the store has it now."""
        self._forget_both(target, src, dst)
        for key in (src, dst):
            try:
                info = await store_call(self.ctx, key, self.ctx.store.info, key)
            except NodeError as exc:
                if exc.errno == errno.ENOENT:
                    self.ctx.listing_drop(key)
                    self.ctx.note_write(key)
                continue  # unknown (the store fails): listed again when next asked
            self.ctx.listing_put(key, info)
            self.ctx.note_write(key, info)

    async def link(self, node: FileNode, name: str) -> FileNode:
        if not isinstance(node, RawFile):
            raise read_only()  # a file of .zvfs/: see rename
        if node.ctx is not self.ctx:
            raise NodeError(errno.EXDEV)
        dst = self._key(name)
        listing = await self._listing()
        if name in listing.keys or name in listing.prefixes:
            raise NodeError(errno.EEXIST)
        # the link copies what the store holds: the file's bytes written and not yet stored
        # are stored first, as fsync() would (the copy held the old bytes under the new
        # size, and a file not yet stored once was ENOENT)
        await store_pending(self.ctx, node.key)
        # what the copy holds: the source as the store has it now, which another client may
        # have changed within the TTL (the new name was listed at the source's old size: a
        # helper's audit)
        info = await store_call(self.ctx, dst, self.ctx.store.link, node.key, dst) \
            or KeyInfo(node.size, node.mtime_ns)
        self.ctx.listing_put(dst, info)
        self.ctx.note_write(dst, info)
        return RawFile(self.ctx, dst, info)

    async def sync(self) -> None:
        await store_call(self.ctx, self.prefix or "/", self.ctx.store.sync_dir, self.prefix)

    async def set_mtime_ns(self, mtime_ns: int) -> None:
        if not self.writable:
            raise NodeError(errno.EROFS)
        if not self.ctx.store.implicit_dirs:  # S3 has no directory to keep a time
            await store_call(self.ctx, self.prefix, self.ctx.store.set_mtime_ns, self.prefix, mtime_ns)
            self.ctx.set_dir_time(self.prefix.rstrip("/"), mtime_ns)


class RawDirHolder(DirNode):
    """A directory that shows a raw directory (the mount root): writes go to ``raw``."""

    raw: RawDir

    def _plain(self, name: str) -> None:
        """Refuse a name the holder keeps for itself (NodeError); every other is the store's."""
