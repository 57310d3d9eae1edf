"""The node model the fs layer serves.

A view is a tree of nodes. The fs layer knows only this module: a directory
lists and looks up children, a file has a size and an async ``read``. A new
output format is a new :class:`FileNode` subclass in views; fs does not change.

Errors: raise :class:`NodeError` with an errno (ENOENT, EIO) to fail one
operation. Anything else escaping a node is logged by fs and turned into EIO.

Writing is optional: a node that can change says so with ``writable``, and
overrides the write methods, whose defaults fail with EROFS. Only the raw tree
of a writable mount does; the decoded views stay read-only.
"""

from __future__ import annotations

import errno
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence


class NodeError(Exception):
    """Fails one FUSE operation with ``errno``; ``message`` goes to the log (one line).

    ``key`` names what failed (a store key, or a message naming it): the fs layer
    logs one line per key per mount, however often and through however many
    files the same bad key is read (the kernel retries failed page reads too).
    ``answer``: the errno answers what the application asked (ESTALE for a file whose
    content changed since its open), logged at info like an unkeyed refusal, though once
    per ``key``.
    """

    def __init__(self, errno_: int, message: str = "", key: str | None = None,
                 answer: bool = False) -> None:
        super().__init__(message or errno.errorcode.get(errno_, str(errno_)))
        self.errno = errno_
        self.key = key
        self.answer = answer


def read_only() -> NodeError:
    return NodeError(errno.EROFS)


class FileHandle(ABC):
    """One open of a file for writing (fs keeps one per file handle). Reads through it
    see what was written through it, before it is stored."""

    #: True when the kernel must not cache this open's pages: the bytes are staged apart
    #: from the store, and other readers of the file must keep seeing the stored ones
    direct_io: bool = False
    #: opened with O_APPEND: each write goes to the end the file has then (the kernel
    #: leaves that to the file system when it does not cache writes)
    appending: bool = False

    @property
    @abstractmethod
    def size(self) -> int: ...

    @property
    def mtime_ns(self) -> int | None:
        """The mtime the writes gave the file, where it has one before it is stored (a local
        file's); None: the file's listed one."""
        return None

    @abstractmethod
    async def read(self, offset: int, length: int) -> bytes | memoryview: ...

    @abstractmethod
    async def write(self, offset: int, data: bytes) -> int: ...

    @abstractmethod
    async def truncate(self, size: int) -> None: ...

    @abstractmethod
    async def flush(self, durable: bool = False) -> None:
        """Store what was written (close and fsync): its failure is the application's error."""

    @abstractmethod
    async def release(self) -> None:
        """The last close: the handle is not used afterwards."""

    def abandon(self) -> None:  # noqa: B027 - optional
        """The daemon is stopping and :meth:`release` did not finish in time (its store does
        not answer): keep what was written and say where, waiting for nothing."""


class Node(ABC):  # noqa: B024 - abstract through FileNode and DirNode
    """Anything with a name in the tree: a file or a directory. Its owner and permission
    bits are the mount's (the fs layer sets them), less the write bits unless it is
    ``writable``."""

    __slots__ = ()  # a subclass may keep its nodes small (a store of millions of keys)

    mtime_ns: int = 0
    #: shown by readdir; a hidden node still answers lookup (like ZFS's .zfs)
    hidden: bool = False
    #: True when the write methods work (a writable mount's raw tree)
    writable: bool = False

    async def set_mtime_ns(self, mtime_ns: int) -> None:
        raise read_only()

    async def sync(self) -> None:  # noqa: B027 - optional hook
        """fsync(): of a file open for reading (``sync FILE`` opens it so), a local file's
        descriptor reports a write-back error of its file; of a directory, its names are made
        durable where the store keeps them on a disk."""

    def detach(self) -> None:  # noqa: B027 - optional hook
        """The name this node was found under now names something else (it was replaced or
        removed): the node keeps describing what it was, and stops following the name."""

    def outdated(self) -> bool:
        """True when this node was made from what its name no longer holds, as the mount
        now knows it (a decoded view of metadata read anew since): the fs layer looks the
        name up again rather than serve it (a file whose every read is ESTALE, a directory
        listing what the store no longer has)."""
        return False


class FileNode(Node):
    """A regular read-only file: a size known without reading, and ranged reads."""

    __slots__ = ()

    #: True when the bytes can never change while mounted, so the kernel page cache may keep them
    immutable: bool = True
    #: True when the size is only a hint (live files): the kernel then reads until EOF
    direct_io: bool = False
    #: True when ``version()`` was read from the source at this open (a local file's fstat),
    #: not from a cached listing: an unchanged version then proves the kernel's pages current
    validated: bool = False

    @property
    @abstractmethod
    def size(self) -> int: ...

    def size_and_mtime_ns(self) -> tuple[int, int]:
        """``(size, mtime)`` at once: a walk's replies ask both of every file, and a node
        that finds them in one place can look once."""
        return self.size, self.mtime_ns

    @abstractmethod
    async def read(self, offset: int, length: int) -> bytes | memoryview:
        """Bytes ``[offset, offset+length)`` clipped to the size; b'' past the end."""

    def version(self) -> object | None:
        """What the bytes are made of, as a value to compare (a key's size and mtime, an
        array's metadata digest), or None when unknown. The fs layer keeps the kernel's
        page cache across opens while this is unchanged and younger than the metadata
        TTL: the staleness the chunk cache allows already, and warm re-reads at memory speed."""
        return None

    def resident(self) -> bytes | memoryview | None:
        """The whole content when the daemon has it in memory, else None; what was kept
        only for this file's reader is let go from the daemon here. The fs layer stores it
        in the kernel's page cache with the first open, so the reader's read needs no READ
        request. (Not a local file the page cache holds: its READ is answered on the trio
        thread already, and reading it at the open cost more than the round trip saved.)"""
        return None

    def opened(self) -> None:  # noqa: B027 - optional hook
        """Called at each open: a live file snapshots its content here, so the size a
        ``stat`` reports is the size of the bytes the reader gets."""

    async def reader(self) -> FileNode:
        """What one open for reading reads: this node, or a copy pinned to the content it
        holds now (so a reader never gets a mix of two versions of a replaced file)."""
        return self

    def released(self) -> None:  # noqa: B027 - optional hook
        """The open that :meth:`reader` returned this node for was closed."""

    def learn(self, reader: FileNode) -> bool:
        """Take the size and mtime of what ``reader`` (from :meth:`reader`) reads as this
        node's own, where they differ from what it showed (the file changed behind the
        mount within the metadata TTL); False where it cannot (its stat would show the
        old size, so the fs layer reads that open past the kernel's cache instead)."""
        return False

    async def lasting_reader(self) -> FileNode | None:
        """What :meth:`reader` gives, opened now, if it goes on reading these bytes once
        the name is removed or replaced (a local file's descriptor); None where nothing
        does (an S3 object overwritten is gone)."""
        return None

    def again(self) -> FileNode | None:
        """Another open of what this reader (a :meth:`lasting_reader`) reads, released on
        its own; None where there is none."""
        return None

    def current_size_and_mtime_ns(self) -> tuple[int, int] | None:
        """For a reader (from :meth:`reader`): the size and mtime of what it reads as they
        are now, where that is known at once (a local file's descriptor); None elsewhere.
        What the fs layer tells of a file whose name was removed while it is open."""
        return None

    def unnamed(self) -> bool:
        """For a reader: True when what it reads has no name left in the store (see
        KeyReader.unnamed), so its name holds another file now."""
        return False

    async def open_write(self, truncate: bool) -> FileHandle:
        """Open for writing (the fs layer calls it for opens with write flags)."""
        raise read_only()

    async def set_size(self, size: int) -> None:
        """truncate(2) by path."""
        raise read_only()


class DirNode(Node):
    """A directory. Children are looked up by name and listed sorted by name."""

    __slots__ = ()

    @abstractmethod
    async def lookup(self, name: str) -> Node | None:
        """The child called ``name``, or None. Hidden children are found too."""

    @abstractmethod
    async def children(self) -> Sequence[tuple[str, Node]]:
        """Visible children as (name, node), sorted by name."""

    async def create(self, name: str, exclusive: bool, truncate: bool = True) -> tuple[FileNode, FileHandle]:
        """The file ``name``, open for writing: made if absent, emptied if ``truncate``.

        The kernel asks this of a name it believes absent, which it may no longer be (made in
        the store since its negative entry was cached): an open without O_TRUNC keeps the bytes."""
        raise read_only()

    async def mkdir(self, name: str) -> DirNode:
        raise read_only()

    async def unlink(self, name: str) -> None:
        raise read_only()

    async def rmdir(self, name: str) -> None:
        raise read_only()

    async def rename(self, name: str, target: DirNode, new_name: str, replace: bool) -> None:
        """Move child ``name`` to ``target/new_name`` (replacing what is there if ``replace``)."""
        raise read_only()

    async def link(self, node: FileNode, name: str) -> FileNode:
        """A new name ``name`` for ``node``'s content; EEXIST if taken."""
        raise read_only()


class LazyEntries(Sequence[tuple[str, Node]]):
    """A directory's children whose nodes are made only when asked: ``names`` (sorted) is
    read on its own, and ``entries[i]`` makes ``make(i)``. A directory of a million names
    (a chunk grid) lists without a million nodes, and the fs layer keeps a node only for
    what it tells the kernel. ``entry(i)`` is the i-th (name, node)."""

    __slots__ = ("names", "_entry")

    def __init__(self, names: Sequence[str], entry: Callable[[int], tuple[str, Node]]) -> None:
        self.names = names
        self._entry = entry

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return self._entry(i)


class BytesFile(FileNode):
    """A small file whose content is computed once (metadata, headers, JSON)."""

    def __init__(self, data: bytes, mtime_ns: int = 0) -> None:
        self._data = data
        self.mtime_ns = mtime_ns

    @property
    def size(self) -> int:
        return len(self._data)

    def version(self) -> object:
        """The bytes themselves (small): a view built again from metadata changed behind the
        mount is a new node under the same inode number, and where its size and mtime stay
        (an attribute's value changed) only this tells the kernel's pages are another's."""
        return self._data

    async def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length]

    def resident(self) -> bytes:
        return self._data  # held for good: nothing is let go


class StaticDir(DirNode):
    """A directory with a fixed set of children, built up front."""

    def __init__(self, entries: dict[str, Node] | None = None, mtime_ns: int = 0,
                 unknown: NodeError | None = None, superseded: Callable[[], bool] | None = None) -> None:
        self.entries: dict[str, Node] = dict(entries or {})
        self.mtime_ns = mtime_ns
        #: what a name not here is, when this directory may lack some (built from a store
        #: that failed): raised, not ENOENT, which says "no such file" and may be cached
        self.unknown = unknown
        #: whether what this directory was built from (a discovery) has a newer version
        self.superseded = superseded

    def outdated(self) -> bool:
        return self.superseded is not None and self.superseded()

    def place(self, path: str) -> StaticDir:
        """The directory at ``path`` ('a/b', '' for this one) below this one, made where
        missing (with this one's mtime, and built from what it was): how a view puts a node
        at a store path."""
        node = self
        for part in (p for p in path.split("/") if p):
            child = node.entries.get(part)
            if not isinstance(child, StaticDir):
                child = node.entries[part] = StaticDir(mtime_ns=self.mtime_ns, unknown=self.unknown,
                                                       superseded=self.superseded)
            node = child
        return node

    async def lookup(self, name: str) -> Node | None:
        node = self.entries.get(name)
        if node is None and (u := self.unknown) is not None:
            raise NodeError(u.errno, str(u), key=u.key)  # a new one: no traceback kept growing
        return node

    async def children(self) -> Sequence[tuple[str, Node]]:
        return [(n, c) for n, c in sorted(self.entries.items()) if not c.hidden]
