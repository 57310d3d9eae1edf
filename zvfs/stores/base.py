"""The abstract key/value store of the Zarr file-system store spec.

A store knows keys and bytes, never Zarr. Every method is *blocking*: callers
on the trio thread must go through the mount's workers (:class:`zvfs.workers.Workers`),
which hop to a worker thread once per call.
"""

from __future__ import annotations

import errno
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from zvfs.stores.listing import KeyInfo, Listing


class StoreError(Exception):
    """A store operation failed for a reason other than a missing key (I/O, network, corruption)."""


#: :meth:`KeyWriter.commit`'s answer for a written file that no key names any more
GONE = KeyInfo(-1, 0)


class KeyNotFound(StoreError, KeyError):
    """The key does not exist in the store."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep messages readable
        return str(self.args[0]) if self.args else "key not found"


class SourceError(StoreError):
    """The source cannot be opened at all (missing path, missing bucket, refused credentials).

    Its message is shown to the user as is, so it says what is wrong and how to fix it.
    """


class TooLarge(StoreError):
    """``get_at_most``: the value holds more than the caller said it legitimately can, so it
    was not read (a problem of the data, not of the store)."""


class WriteRefused(StoreError):
    """A write the store will not do, for a reason an errno names (EEXIST, ENOTEMPTY, EFBIG,
    ENOSPC, EXDEV, EPERM, EROFS, ENOENT): the application sees that errno, not EIO."""

    def __init__(self, errno_: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno_


class SourceUnavailable(SourceError):
    """The source could not be reached now (endpoint down, server errors) but may come back:
    unlike a plain SourceError it is not a configuration mistake, so a service may retry."""


class Stale(StoreError):
    """The key no longer holds the version a read was pinned to (replaced while open)."""


def is_store_failure(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a store failure (I/O, network, throttling,
    refused credentials) rather than a missing key or bad bytes: such a failure may pass,
    so callers retry it later instead of remembering it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StoreError) and not isinstance(seen, KeyNotFound):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Reopen(NamedTuple):
    """How another process opens the same store on its own (the decoder processes): a
    local store only, named by its kind and path. ``fingerprint`` is what the store was
    opened at (a zip's size and mtime), which the other process checks before it reads."""

    kind: str  # "directory" | "zip"
    path: str
    fingerprint: tuple[int, ...] = ()


class KeyWriter(ABC):
    """One key open for writing (the store spec's *set*), blocking like the store.

    A local store writes in place; a remote one stages the bytes on local disk and
    uploads them at :meth:`commit`. Until then readers of the key through this writer
    see the new bytes; other clients of the store see them after the commit.
    """

    key: str
    #: True when the bytes live apart from the store until commit (S3): the store still
    #: holds the old content, which other readers keep seeing
    staged: bool = False
    #: the key holds a value in the store (it did at open, or a commit stored one); a local
    #: file is there from its open on
    stored: bool = True

    @property
    def closed(self) -> bool:
        """True once close() ran: what it staged can no longer be read through it."""
        return False

    @property
    @abstractmethod
    def size(self) -> int: ...

    @property
    def mtime_ns(self) -> int | None:
        """The mtime the writes have given the key so far, where the store keeps one as they
        land (a local file); None where it takes one when stored (S3)."""
        return None

    @abstractmethod
    def write(self, offset: int, data: bytes) -> int:
        """Write ``data`` at ``offset`` (a hole before it reads as zeros); returns len(data)."""

    @abstractmethod
    def read(self, offset: int, length: int) -> bytes:
        """What the key will hold, bytes ``[offset, offset+length)``."""

    def read_at_once(self, offset: int, length: int) -> bytes | memoryview | None:
        """:meth:`read` where that cannot block (a local file whose bytes are all in the
        page cache), so the caller's own thread may do it; else None, and the caller calls
        ``read`` in a worker."""
        return None

    def unfetched(self, offset: int, length: int) -> KeyInfo | None:
        """The stored version whose bytes ``[offset, offset+length)`` still are, none of them
        taken in by this writer yet (an object opened without O_TRUNC, not fetched): a read
        of them may come from any copy of that version, the mount's block cache included.
        None when :meth:`read` must serve them. Asking counts as reading that version: a
        fetch after it must find the same one (else ESTALE)."""
        return None

    @abstractmethod
    def truncate(self, size: int) -> None: ...

    @abstractmethod
    def commit(self, durable: bool = False) -> KeyInfo | None:
        """Make the bytes the key's value in the store (close and fsync call it).

        Returns the key's new info when it changed, None when there was nothing to do,
        :data:`GONE` when the key no longer names the written file (removed behind the
        store's back: the writes succeeded, as on a local file system, and are no key's).
        A failure raises StoreError; the bytes stay staged, so a retry can succeed.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the writer. Staged bytes that were never committed are kept on disk
        (and their path logged): nothing written is lost silently."""

    def discard(self) -> None:  # noqa: B027 - optional
        """Never store what was written (the key was unlinked while open)."""

    def abandon(self) -> None:  # noqa: B027 - optional
        """The daemon is stopping and :meth:`close` did not finish in time (the store does
        not answer): keep the staged bytes and log where, waiting for nothing. The process
        ends next, so nothing more is asked of the writer."""

    def undiscard(self) -> None:  # noqa: B027 - optional
        """The unlink that called :meth:`discard` failed: store what is written after all."""

    def append(self, data: bytes) -> int:
        """Write ``data`` at the end the file has now (O_APPEND)."""
        return self.write(self.size, data)

    def moved(self, key: str) -> None:
        """The key was renamed to ``key`` while open: store the bytes there from now on
        (a local file's descriptor follows it by itself)."""
        self.key = key

    def background_work(self) -> list[Callable[[], None]]:
        """Blocking jobs the writer would like run now, in the background (an S3 writer's
        finished parts, uploaded while the application is still writing). A job never
        raises: what failed is done again by :meth:`commit`."""
        return []


class KeyReader(ABC):
    """One key opened for reading, pinned to the content it had at open (a local file's
    descriptor): a reader keeps that content even if the key is replaced meanwhile."""

    size: int
    #: what the content is (a local file's device, inode, size and mtime), to compare
    version: object
    #: the content's mtime where the reader knows it (a local file's, at open)
    mtime_ns: int | None = None

    @abstractmethod
    def read(self, offset: int, length: int) -> bytes: ...

    def read_at_once(self, offset: int, length: int) -> bytes | memoryview | None:
        """``read(offset, length)`` where that cannot block (every byte in the page cache),
        so the caller's own thread may do it; else None, and the caller calls ``read`` in
        a worker."""
        return None

    def sync(self) -> None:  # noqa: B027 - optional
        """fsync() of the key through this reader (a local file's descriptor: its
        write-back errors); nothing for a store that keeps no local file."""

    def again(self) -> KeyReader | None:
        """Another reader of the same content, closed on its own (a local file's descriptor
        duplicated: it reads the file even once no name has it); None where there is none."""
        return None

    def current_size_and_mtime_ns(self) -> tuple[int, int] | None:
        """The size and mtime of what this reader reads, as they are now, where that is
        known at once (a local file's descriptor: its fstat, which sees writes made through
        other descriptors of the file, also once no name has it); None elsewhere."""
        return None

    def unnamed(self) -> bool:
        """True when the file this reader reads has no name left (a local file's descriptor
        whose file was renamed over or removed behind the mount: no link); False where it
        has one, or that is not known at once."""
        return False

    @abstractmethod
    def close(self) -> None: ...


def _read_only(what: str) -> WriteRefused:
    return WriteRefused(errno.EROFS, f"{what}: the store is read-only")


class Store(ABC):
    """Key/value store. Keys use '/' as separator and never start with '/'.

    Reads are the abstract methods below. The write half (set, delete and the native
    operations behind them) is optional: a store that can write sets ``can_write`` and
    overrides the write methods, whose defaults refuse with EROFS.
    """

    #: short human name of the source, used in fsname= and log lines
    description: str = ""
    #: preferred read unit in bytes for raw files: 0 reads exactly what is asked (local
    #: files); remote or compressed stores set a block size so one request serves many reads
    block_size: int = 0
    #: True when list_dir answers from memory, at once and without I/O (a zip's central
    #: directory, parsed at open): the raw view then lists on its own thread, not in a
    #: worker, as a thread hop costs more than the answer
    lists_in_memory: bool = False
    #: True when one flat listing of many keys is much cheaper than a listing per
    #: directory (S3: 1,000 keys per request whatever the nesting)
    flat_listing: bool = False
    #: True when the store implements the write methods
    can_write: bool = False
    #: True when directories exist only as prefixes of keys (S3): an empty directory
    #: made by mkdir lives in the mount only, until it gets children
    implicit_dirs: bool = False
    #: True when written bytes are staged apart and replace the key whole at commit (S3)
    stages_writes: bool = False
    #: True when open_reader gives handles (local files); else readers pin by version
    opens_readers: bool = False
    #: True when the bytes are on this machine (a directory, a zip): another process may
    #: open the store itself (``reopen``), which the decoder processes do
    local: bool = False
    #: listings of directories worth making at once, ahead of a reader walking the tree
    #: (0: none): a listing that stats every file in it (a directory store's) is then made
    #: while the walk is served, not while it waits
    list_ahead: int = 0

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Whole value of ``key``; raises KeyNotFound."""

    def get_at_most(self, key: str, limit: int) -> bytes:
        """Whole value of ``key`` if it holds at most ``limit`` bytes, else StoreError.

        For callers that know how big a value can legitimately be (a chunk): stores
        that know sizes cheaply (zip, directory) refuse before reading anything, so
        a zip member that inflates to gigabytes is never produced. The default reads
        and then checks.
        """
        data = self.get(key)
        if len(data) > limit:
            raise TooLarge(f"{key}: holds {len(data)} bytes, more than the {limit} it may")
        return data

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from ``start`` (fewer at the end); raises KeyNotFound."""

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes of ``key`` (all of it when it is shorter) and the key's
        size; raises KeyNotFound.

        For what sits at the end of a value (a shard index): stores that can read a tail
        without knowing the size first (S3's ``Range: bytes=-N``, an open file, a zip member)
        do it in one request; the default asks the size, then the range.
        """
        if length < 0:
            raise StoreError(f"{key}: bad suffix length {length}")
        size = self.info(key).size
        start = max(0, size - length)
        return (self.get_range(key, start, size - start) if size > start else b""), size

    def reopen(self) -> Reopen | None:
        """How another process may open this store itself; None when it cannot (a remote
        store, whose connections and credentials stay in this one)."""
        return None

    def open_reader(self, key: str) -> KeyReader | None:
        """``key`` opened for reading, pinned to its content now; None where the store has
        no such handle (then readers pin by ``version``). Raises KeyNotFound."""
        return None

    def open_reader_at_once(self, key: str) -> KeyReader | None:
        """``open_reader(key)`` where that cannot block (nothing to read from the disk to
        find the file), so the caller's own thread may do it; else None, and the caller
        calls ``open_reader`` in a worker, which decides every case (errors included)."""
        return None

    def get_range_at_once(self, key: str, start: int, length: int) -> bytes | memoryview | None:
        """``get_range(key, start, length)`` where that cannot block (bytes of a local file
        all in the page cache), so the caller's own thread may do it: no worker hop, whose
        two thread hand-offs cost more than copying a few hundred KiB. Else None, and the
        caller calls ``get_range`` in a worker, which decides every case (errors included)."""
        return None

    def listings(self) -> Mapping[str, Listing] | None:
        """Every directory's listing (prefix -> Listing, '' the root), where the store holds
        them all in memory (see ``lists_in_memory``), else None. Read only: it is the
        store's own. A reader's walk follows the whole tree's order with it."""
        return None

    def will_need(self, keys: Sequence[str]) -> None:  # noqa: B027 - optional
        """A hint that ``keys`` are about to be read, in this order: a store whose bytes sit
        in a local file has the kernel read them ahead (in the background), so a reader
        that goes from file to file does not wait on the disk for each. Never an error."""

    def get_version(self, key: str, start: int, length: int | None, version: str | None,
                    limit: int | None = None) -> bytes:
        """Bytes of ``key`` from ``start`` (``length`` of them, or to the end), only from
        the content ``version`` names (KeyInfo.version): Stale if the key was replaced
        since. Stores without versions read what is there.

        ``limit``, for a read to the end: at most that many bytes (what lies past them is
        left, as pread leaves it): a remote store then never reads more than the caller
        expects, whatever size the server announces."""
        if length is None:
            data = self.get(key)[start:]
            return data if limit is None else data[:limit]
        return self.get_range(key, start, length)

    @abstractmethod
    def info(self, key: str) -> KeyInfo:
        """Size and mtime of ``key``; raises KeyNotFound."""

    @abstractmethod
    def list_dir(self, prefix: str) -> Listing:
        """Children of ``prefix`` ('' for the root, else ending in '/')."""

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Every key that starts with ``prefix`` (recursive). Default walks list_dir."""
        listing = self.list_dir(prefix)
        for name in sorted(listing.keys):
            yield prefix + name
        for name in sorted(listing.prefixes):
            yield from self.list_prefix(prefix + name + "/")

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        """Every key below ``prefix`` with its info, unfiltered. Default walks list_dir."""
        listing = self.list_dir(prefix)
        for name in sorted(listing.keys):
            yield prefix + name, listing.keys[name]
        for name in sorted(listing.prefixes):
            yield from self.list_tree(prefix + name + "/")

    def exists(self, key: str) -> bool:
        try:
            self.info(key)
        except KeyNotFound:
            return False
        return True

    def absent(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` the store can tell are absent for little cost (a local stat,
        an index in memory): a get of each would raise KeyNotFound. A key it cannot tell
        about is left out, and so is any it finds trouble with (the get reports that). An
        array of a million tiny chunks, never written, cost a failed get each, a
        minute and more for one small read; never an error."""
        return set()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles; the store is not used afterwards."""

    def close_idle(self) -> None:  # noqa: B027 - optional hook
        """Release the handles unused for a while (the daemon calls this every few seconds):
        a descriptor kept open pins a file that was deleted outside the mount."""

    # -- writing (optional) -------------------------------------------------------------------

    def open_writer(self, key: str, *, truncate: bool, create: bool, exclusive: bool = False) -> KeyWriter:
        """A writer for ``key``. ``create`` makes a missing key (else KeyNotFound);
        ``exclusive`` refuses an existing one (EEXIST); ``truncate`` starts empty. A store
        keeps no modes: a new file gets its store's usual one (a directory's: 0644)."""
        raise _read_only(key)

    def delete(self, key: str) -> None:
        """Remove ``key``; KeyNotFound if it is not there."""
        raise _read_only(key)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        """Make ``dst`` hold what ``src`` held, replacing it (unless not ``replace``: then
        EEXIST if the store holds ``dst`` now, whatever a cached listing said), and remove
        ``src``."""
        raise _read_only(src)

    def link(self, src: str, dst: str) -> KeyInfo | None:
        """Make ``dst`` hold what ``src`` holds; EEXIST if ``dst`` exists (never replaced).
        Returns what ``dst`` holds, where the copy tells it: ``src`` as the store has it now,
        which may not be what the mount listed (changed behind it within the TTL)."""
        raise _read_only(dst)

    def make_dir(self, prefix: str) -> None:
        """Create the directory ``prefix`` (ending in '/'); a no-op for implicit directories."""
        raise _read_only(prefix)

    def remove_dir(self, prefix: str) -> None:
        """Remove the empty directory ``prefix``; ENOTEMPTY if keys remain below it."""
        raise _read_only(prefix)

    def rename_dir(self, src: str, dst: str, replace: bool = True) -> None:
        """Move every key below prefix ``src`` to prefix ``dst`` (both ending in '/'). ``dst``
        may be an empty directory unless not ``replace``; as the store has it now, not as a
        cached listing said: ENOTEMPTY (EEXIST) otherwise."""
        raise _read_only(src)

    def set_mtime_ns(self, key: str, mtime_ns: int) -> None:  # noqa: B027 - optional
        """Set the modification time where the store keeps one it lets us set (a no-op on S3)."""

    def sync_dir(self, prefix: str) -> None:  # noqa: B027 - optional
        """fsync() of directory ``prefix`` ('' or ending in '/'): its names made, renamed and
        removed are on disk when it returns. Nothing where a name is stored once its write
        returns (S3)."""

    def dir_mtime_ns(self, prefix: str) -> int | None:
        """The time the store records for directory ``prefix`` ('a/b/') and that never moves
        while mounted: a zip's directory entry. None where there is none, and the mount shows
        its own derived time (S3 has no directories; a directory store's times move with
        every write, through the mount or beside it). Asked on the mount's own thread, for
        every directory's attributes: it must never wait (see PendingStore)."""
        return None


class WrappedStore(Store):
    """A store layered over another (counting, disk cache): everything is passed on,
    so a wrapper overrides only what it adds to."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.description = inner.description
        self.flat_listing = inner.flat_listing
        self.can_write = inner.can_write
        self.implicit_dirs = inner.implicit_dirs
        self.stages_writes = inner.stages_writes
        self.opens_readers = inner.opens_readers
        self.local = inner.local
        self.list_ahead = inner.list_ahead

    @property  # type: ignore[override]
    def block_size(self) -> int:
        """Asked of the inner store each time: a store still opening (a zip) learns its own."""
        return self.inner.block_size

    @property  # type: ignore[override]
    def lists_in_memory(self) -> bool:
        """Asked of the inner store each time, as block_size is (a store still opening lists
        from nothing yet: its callers must wait for it in a worker)."""
        return self.inner.lists_in_memory

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_at_most(self, key: str, limit: int) -> bytes:
        return self.inner.get_at_most(key, limit)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(key, start, length)

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        return self.inner.get_suffix(key, length)

    def get_version(self, key: str, start: int, length: int | None, version: str | None,
                    limit: int | None = None) -> bytes:
        return self.inner.get_version(key, start, length, version, limit)

    def will_need(self, keys: Sequence[str]) -> None:
        self.inner.will_need(keys)

    def absent(self, keys: Iterable[str]) -> set[str]:
        return self.inner.absent(keys)

    def reopen(self) -> Reopen | None:
        return self.inner.reopen()

    def listings(self) -> Mapping[str, Listing] | None:
        return self.inner.listings() if self.lists_in_memory else None  # never waits

    def open_reader(self, key: str) -> KeyReader | None:
        return self.inner.open_reader(key)

    def open_reader_at_once(self, key: str) -> KeyReader | None:
        return self.inner.open_reader_at_once(key)

    def get_range_at_once(self, key: str, start: int, length: int) -> bytes | memoryview | None:
        return self.inner.get_range_at_once(key, start, length)

    def info(self, key: str) -> KeyInfo:
        return self.inner.info(key)

    def dir_mtime_ns(self, prefix: str) -> int | None:
        return self.inner.dir_mtime_ns(prefix)

    def list_dir(self, prefix: str) -> Listing:
        return self.inner.list_dir(prefix)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return self.inner.list_prefix(prefix)

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        return self.inner.list_tree(prefix)

    def close(self) -> None:
        self.inner.close()

    def close_idle(self) -> None:
        self.inner.close_idle()

    def open_writer(self, key: str, *, truncate: bool, create: bool, exclusive: bool = False) -> KeyWriter:
        return self.inner.open_writer(key, truncate=truncate, create=create,
                                      exclusive=exclusive)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        self.inner.rename(src, dst, replace)

    def link(self, src: str, dst: str) -> KeyInfo | None:
        return self.inner.link(src, dst)

    def make_dir(self, prefix: str) -> None:
        self.inner.make_dir(prefix)

    def remove_dir(self, prefix: str) -> None:
        self.inner.remove_dir(prefix)

    def rename_dir(self, src: str, dst: str, replace: bool = True) -> None:
        self.inner.rename_dir(src, dst, replace)

    def set_mtime_ns(self, key: str, mtime_ns: int) -> None:
        self.inner.set_mtime_ns(key, mtime_ns)

    def sync_dir(self, prefix: str) -> None:
        self.inner.sync_dir(prefix)

