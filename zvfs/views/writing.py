"""Writes through the raw tree of a writable mount (the store spec's set and delete).

A :class:`WriteHandle` is one open of a key for writing: it wraps the store's
:class:`~zvfs.stores.base.KeyWriter` (a directory file written in place, or an
S3 object staged on local disk) and makes every blocking call one worker hop.
What a write changes is announced once it is stored (close, fsync, unlink,
rename...) through :meth:`MountContext.note_write`: the cached listings show it,
and every cache derived from the key (raw blocks, decoded chunks, the decoded
hierarchy, the kernel's pages of the decoded files) lets go of the old bytes.
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import trio

from zvfs.stores.base import GONE, KeyInfo, KeyNotFound, KeyWriter, StoreError, WriteRefused
from zvfs.views.context import MountContext
from zvfs.views.node import FileHandle, FileNode, NodeError

T = TypeVar("T")

#: makes the reader of a stored version of a key (its key, its info) that an open for
#: writing reads through while it has fetched none of that version's bytes
BaseReader = Callable[[str, KeyInfo], FileNode]


async def store_call(ctx: MountContext, what: str, fn: Callable[..., T], *args: object, **kw: object) -> T:
    """One blocking store call in one of the mount's workers; its failure as the errno the
    application sees."""
    try:
        return await ctx.workers.run(lambda: fn(*args, **kw))
    except WriteRefused as exc:
        # a store gone read-only under a writable mount is a failure to log, named by its
        # key, not a refusal of what the application asked (the mount's own EROFS)
        raise NodeError(exc.errno, str(exc), key=what if exc.errno == errno.EROFS else None) from exc
    except KeyNotFound as exc:
        raise NodeError(errno.ENOENT, f"{what}: {exc}") from exc
    except StoreError as exc:  # its message names the key; key=None: every failure is logged
        raise NodeError(errno.EIO, str(exc)) from exc


def unlink_writers(ctx: MountContext, key: str) -> list[WriteHandle]:
    """``key`` was unlinked or replaced: its open writers go on, on a file no name shows
    (POSIX), and are neither listed nor stored as ``key`` again. Returns them, for
    :func:`relink_writers` if the unlink then fails."""
    handles = ctx.writers.pop(key, [])
    for handle in handles:
        handle.unlinked()
    return handles


def relink_writers(ctx: MountContext, key: str, handles: list[WriteHandle]) -> None:
    """The unlink of ``key`` that its writers were told of failed: they are its writers
    again, and store what they write (else an fsync after a refused unlink stored
    nothing, and said so to no one). Not one closed meanwhile: its writer is closed, and
    put back, every stat of ``key`` asked its size of a closed descriptor (EIO, until
    another unlink; a helper's audit)."""
    handles = [h for h in handles if h in h.peers]
    if handles:
        ctx.writers[key] = handles + ctx.writers.get(key, [])
    for handle in handles:
        handle.relinked()


@contextlib.asynccontextmanager
async def names_changing(ctx: MountContext, *keys: str, below: bool = False) -> AsyncIterator[None]:
    """Hold every write of a file named by one of ``keys`` (and, with ``below``, of a file
    below one of them) from being stored while a rename or unlink of it goes on, after any
    store of one under way. A close() during an unlink that then failed returned 0 having
    stored nothing (its writer, told of the unlink, skipped the upload; put back after it,
    it was closed clean); an upload still under way when a rename copied the object landed
    under the old name after the copy, and the new bytes were deleted with it or left under
    a name the rename had removed (S3, a helper's audit)."""
    gates: dict[int, trio.Lock] = {}
    for key, handles in list(ctx.writers.items()):
        if key in keys or (below and any(key.startswith(k + "/") for k in keys)):
            for handle in handles:
                gates[id(handle.gate)] = handle.gate
    async with contextlib.AsyncExitStack() as stack:
        for _, gate in sorted(gates.items()):  # one order: two renames never wait on each other
            await stack.enter_async_context(gate)
        yield


async def move_writers(ctx: MountContext, src: str, dst: str, directory: bool = False) -> None:
    """``src`` (a file, or with ``directory`` every key below ``src/``) was renamed to
    ``dst`` while open for writing: its writers store and list it under the new name."""
    moving = [key for key in ctx.writers if key == src or (directory and key.startswith(src + "/"))]
    for key in moving:
        new = dst + key[len(src):]
        handles = ctx.writers.pop(key)
        ctx.writers.setdefault(new, []).extend(handles)
        for handle in handles:
            handle.key = new
        for writer in {id(h.writer): h.writer for h in handles}.values():
            await store_call(ctx, new, writer.moved, new)


class WriteHandle(FileHandle):
    """One open of ``key`` for writing, over the store's writer."""

    def __init__(self, ctx: MountContext, key: str, writer: KeyWriter,
                 peers: list[WriteHandle] | None = None, base_reader: BaseReader | None = None) -> None:
        self.ctx = ctx
        self.key = key
        self.writer = writer
        self._base_reader = base_reader
        #: the reader made by ``base_reader``, and the version and key it reads
        self._reading: tuple[KeyInfo, str, FileNode] | None = None
        #: the opens sharing ``writer`` (an S3 file opened again while written), this one too:
        #: the last of them to be released closes it
        self.peers = peers if peers is not None else []
        #: held while the writer stores its bytes, and while its name changes (names_changing)
        self.gate: trio.Lock = self.peers[0].gate if self.peers else trio.Lock()
        self.peers.append(self)
        self._unlinked = False
        #: an O_EXCL create whose upload found the key made behind the mount (S3 asks
        #: nothing before it): the store's object is the file the mount shows from then on
        self._refused = False
        ctx.writers.setdefault(key, []).append(self)

    @property  # type: ignore[override]
    def direct_io(self) -> bool:
        """Staged bytes are not the store's (other readers keep the stored ones); an appending
        open writes where the file ends now, not where the kernel's cached size says: no
        kernel page cache for either."""
        return self.writer.staged or self.appending

    def unlinked(self) -> None:
        """The key was unlinked while open: writes go on (POSIX), but are not stored."""
        self._unlinked = True
        self.writer.discard()

    def relinked(self) -> None:
        self._unlinked = False
        self.writer.undiscard()

    @property
    def size(self) -> int:
        return self.writer.size

    @property
    def mtime_ns(self) -> int | None:
        return self.writer.mtime_ns

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        data = self.writer.read_at_once(offset, length)
        if data is not None:
            return data
        make = self._base_reader
        base = self.writer.unfetched(offset, length) if make is not None else None
        if make is not None and base is not None:
            # the stored version's own bytes, none fetched: through the mount's block cache,
            # with read-ahead, as an open for reading reads them. Each read was a ranged GET
            # of just its bytes: SQLite, which opens its database read-write, dumped a 3 MiB
            # one in 1,953 GETs of a page each (9.4 s against moto, 0.06 s read-only)
            if self._reading is None or self._reading[0] is not base or self._reading[1] != self.key:
                self._reading = (base, self.key, make(self.key, base))
            data = await self._reading[2].read(offset, length)
            if self.writer.unfetched(offset, length) is base:
                return data  # still that version's bytes: no write took them in meanwhile
        return await store_call(self.ctx, self.key, self.writer.read, offset, length)

    async def write(self, offset: int, data: bytes) -> int:
        if self.appending:
            # the kernel leaves O_APPEND to a file system that does not cache writes: its offset
            # is its cached size, which a change outside the mount makes stale (and a write
            # there overwrote the file's middle); so at the end the file has now
            n = await store_call(self.ctx, self.key, self.writer.append, data)
        else:
            n = await store_call(self.ctx, self.key, self.writer.write, offset, data)
        self.ctx.counters.add("fuse_write_bytes", n)
        for job in self.writer.background_work():  # an S3 writer's finished parts
            self.ctx.background(self.ctx.workers.run, job)
        return n

    async def truncate(self, size: int) -> None:
        await store_call(self.ctx, self.key, self.writer.truncate, size)
        if not self.writer.staged:
            # a directory's file changed in place, its mtime too: the reply to this setattr
            # gives the kernel the attributes it keeps for the TTL, so they must be the new ones
            # (a staged file takes its mtime when it is stored)
            await self.flush()

    async def flush(self, durable: bool = False) -> None:
        async with self.gate:
            await self._flush(durable)

    async def _flush(self, durable: bool) -> None:
        if self._unlinked:
            return
        try:
            info = await store_call(self.ctx, self.key, self.writer.commit, durable)
        except NodeError as exc:
            if exc.errno == errno.EEXIST:
                self._refused = True
                self.ctx.listing_unknown(self.key)
                self.ctx.note_write(self.key)
            raise
        if info is GONE:  # removed behind the mount: listed no more (its size was put back)
            self.ctx.listing_drop(self.key)
            self.ctx.note_write(self.key)
        elif info is not None:
            self.ctx.listing_put(self.key, info)
            self.ctx.note_write(self.key, info)

    def abandon(self) -> None:
        self.writer.abandon()

    async def release(self) -> None:
        handles = self.ctx.writers.get(self.key, [])
        if self in handles:
            handles.remove(self)
        if not handles:
            self.ctx.writers.pop(self.key, None)
        self.peers.remove(self)
        if self.peers:
            return
        if not self.writer.stored and not self._unlinked and not self._refused \
                and self.key not in self.ctx.writers:
            # made through the mount and never stored (its upload failed): listed no more
            self.ctx.listing_drop(self.key)
            self.ctx.note_write(self.key)
        await store_call(self.ctx, self.key, self.writer.close)


async def store_pending(ctx: MountContext, key: str) -> None:
    """fsync() through an open for reading (``sync FILE``), of a file open for writing on a
    store that stages writes (S3): its bytes not yet stored are stored now, as an fsync()
    through a writer does (it returned at once, the bytes still staged)."""
    open_now = ctx.writers.get(key) if ctx.store.stages_writes else None
    if open_now:
        await open_now[-1].flush(durable=True)


class UnstoredReader(FileNode):
    """An open for reading of a file made through the mount and being written, never stored
    yet (S3): it reads what the writers have written so far. Readers of a stored object
    keep reading that object; this file has none, and ``ls`` shows it all the same."""

    immutable = False
    direct_io = True  # it grows while written

    def __init__(self, handle: WriteHandle) -> None:
        self.handle = handle
        self.key = handle.key
        self.mtime_ns = time.time_ns()

    @property
    def size(self) -> int:
        return self.handle.size

    async def sync(self) -> None:
        await store_pending(self.handle.ctx, self.key)

    async def read(self, offset: int, length: int) -> bytes:
        writer = self.handle.writer
        if not writer.closed:
            try:
                return await self.handle.read(offset, length)
            except (NodeError, OSError):  # OSError: its descriptor went as it was read
                if not writer.closed:
                    raise
        # its writers closed it since (a reader read EIO here: the staged copy was gone):
        # what they stored is the file now
        if not writer.stored:
            raise NodeError(errno.ENOENT, f"{self.key}: not stored (its upload failed)", key=self.key)
        store = self.handle.ctx.store
        return await store_call(self.handle.ctx, self.key, store.get_range, self.key, offset, length)
