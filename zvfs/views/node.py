"""The node model the fs layer serves.

A view is a tree of nodes. The fs layer knows only this module: a directory
lists and looks up children, a file has a size and an async ``read``. A new
output format is a new :class:`FileNode` subclass in views; fs does not change.

Errors: raise :class:`NodeError` with an errno (ENOENT, EIO) to fail one
operation. Anything else escaping a node is logged by fs and turned into EIO.
"""

from __future__ import annotations

import errno
import stat
from abc import ABC, abstractmethod
from collections.abc import Sequence


class NodeError(Exception):
    """Fails one FUSE operation with ``errno``; ``message`` goes to the log (one line).

    ``key`` names what failed (a store key, or a message naming it): the fs layer
    logs one line per key per mount, however often and through however many
    files the same bad key is read (the kernel retries failed page reads too).
    """

    def __init__(self, errno_: int, message: str = "", key: str | None = None) -> None:
        super().__init__(message or errno.errorcode.get(errno_, str(errno_)))
        self.errno = errno_
        self.key = key


class Node(ABC):
    """Anything with a name in the tree."""

    mtime: float = 0.0
    #: shown by readdir; a hidden node still answers lookup (like ZFS's .zfs)
    hidden: bool = False

    @property
    @abstractmethod
    def mode(self) -> int: ...


class FileNode(Node):
    """A regular read-only file: a size known without reading, and ranged reads."""

    #: True when the bytes can never change while mounted, so the kernel page cache may keep them
    immutable: bool = True
    #: True when the size is only a hint (live files): the kernel then reads until EOF
    direct_io: bool = False

    @property
    def mode(self) -> int:
        return stat.S_IFREG | 0o444

    @property
    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    async def read(self, offset: int, length: int) -> bytes | memoryview:
        """Bytes ``[offset, offset+length)`` clipped to the size; b'' past the end."""

    def opened(self) -> None:  # noqa: B027 - optional hook
        """Called at each open: a live file snapshots its content here, so the size a
        ``stat`` reports is the size of the bytes the reader gets."""


class DirNode(Node):
    """A directory. Children are looked up by name and listed sorted by name."""

    @property
    def mode(self) -> int:
        return stat.S_IFDIR | 0o555

    @abstractmethod
    async def lookup(self, name: str) -> Node | None:
        """The child called ``name``, or None. Hidden children are found too."""

    @abstractmethod
    async def children(self) -> Sequence[tuple[str, Node]]:
        """Visible children as (name, node), sorted by name."""


class BytesFile(FileNode):
    """A small file whose content is computed once (metadata, headers, JSON)."""

    def __init__(self, data: bytes, mtime: float = 0.0) -> None:
        self._data = data
        self.mtime = mtime

    @property
    def size(self) -> int:
        return len(self._data)

    async def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length]


class StaticDir(DirNode):
    """A directory with a fixed set of children, built up front."""

    def __init__(self, entries: dict[str, Node] | None = None, mtime: float = 0.0) -> None:
        self.entries: dict[str, Node] = dict(entries or {})
        self.mtime = mtime

    async def lookup(self, name: str) -> Node | None:
        return self.entries.get(name)

    async def children(self) -> Sequence[tuple[str, Node]]:
        return [(n, c) for n, c in sorted(self.entries.items()) if not c.hidden]
