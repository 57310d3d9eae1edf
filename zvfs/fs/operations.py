"""pyfuse3 Operations over a tree of nodes.

This layer knows nodes (directories with lookup/children, files with size and
read), never formats or stores. Its concurrency rules, all on the trio thread:

- An inode number is assigned per (parent inode, name) the first time that
  name is looked up, and never reused or changed while mounted, so ``stat``
  twice gives one ``st_ino``. ``forget`` drops the node object when the
  kernel's lookup count reaches zero; a later lookup makes a fresh node
  under the same number.
- A directory handle snapshots the sorted children at ``opendir``; readdir
  offsets index that snapshot, so they are stable for the handle's life.
- A file handle is the inode number (as in S3QL): the kernel keeps the inode
  referenced while a file is open.
- Every failure is one operation's: NodeError carries its errno; anything
  else is logged with the path and becomes EIO.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Sequence

import pyfuse3

from zvfs.stats import counters
from zvfs.views.node import DirNode, FileNode, Node, NodeError

log = logging.getLogger("zvfs")

ROOT = pyfuse3.ROOT_INODE
STATFS_BLOCK = 4096
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class ZvfsOperations(pyfuse3.Operations):
    """Read-only file system over ``root``; ``ttl`` is None for indefinite (immutable) data."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, root: DirNode, ttl: float | None = 60.0,
                 usage: Callable[[], Awaitable[tuple[int, int]]] | None = None) -> None:
        """``usage`` answers statfs (df): bytes the store holds, and bytes free where it lives."""
        super().__init__()
        self.ttl = 365 * 86400.0 if ttl is None else float(ttl)
        self._usage = usage
        self._nodes: dict[int, Node] = {ROOT: root}
        self._paths: dict[int, str] = {ROOT: "/"}
        self._parent: dict[int, int] = {ROOT: ROOT}
        self._ino_of: dict[tuple[int, str], int] = {}
        self._lookups: dict[int, int] = {}
        self._next_ino = itertools.count(ROOT + 1)
        self._dir_handles: dict[int, list[tuple[str, int, Node]]] = {}
        self._next_fh = itertools.count(1)
        self._reported: set[str] = set()
        self._uid = os.getuid()
        self._gid = os.getgid()

    # -- inode table ---------------------------------------------------------

    def _node(self, ino: int) -> Node:
        node = self._nodes.get(ino)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _remember(self, parent: int, name: str, node: Node, count: bool = True) -> int:
        """Inode for ``name`` under ``parent``: the same number every time."""
        key = (parent, name)
        ino = self._ino_of.get(key)
        if ino is None:
            ino = next(self._next_ino)
            self._ino_of[key] = ino
            self._parent[ino] = parent
            base = self._paths[parent]
            self._paths[ino] = base.rstrip("/") + "/" + name
        self._nodes[ino] = node
        if count:
            self._lookups[ino] = self._lookups.get(ino, 0) + 1
        return ino

    def _attrs(self, ino: int, node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.generation = 0
        a.entry_timeout = self.ttl
        # a live file's size changes with its content: the kernel must ask every time
        a.attr_timeout = 0 if isinstance(node, FileNode) and node.direct_io else self.ttl
        a.st_mode = node.mode
        a.st_uid = self._uid
        a.st_gid = self._gid
        a.st_rdev = 0
        if isinstance(node, FileNode):
            a.st_nlink = 1
            a.st_size = node.size
        else:
            a.st_nlink = 2
            a.st_size = 0
        a.st_blksize = 1 << 20
        a.st_blocks = (a.st_size + 511) // 512
        ns = int(node.mtime * 1e9)
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = ns
        return a

    async def _call(self, what: str, coro):  # type: ignore[no-untyped-def]
        """Await a node call; map its failure to one errno and one log line."""
        op = what.split(" ", 1)[0]
        try:
            return await coro
        except pyfuse3.FUSEError:
            counters.add(f"fuse_errors_{op}")
            raise
        except NodeError as exc:
            if exc.errno != errno.ENOENT:
                counters.add(f"fuse_errors_{op}")
                counters.note_error(f"{what}: {exc}")
                if self._first_report(exc.key):
                    log.error("%s: %s", what, exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except Exception as exc:  # noqa: BLE001 - one bad file must not take the daemon down
            counters.add(f"fuse_errors_{op}")
            counters.note_error(f"{what}: {type(exc).__name__}: {exc}")
            log.error("%s: %s: %s", what, type(exc).__name__, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    def _first_report(self, key: str | None) -> bool:
        """True unless an error about ``key`` was logged already (errors without a key always log)."""
        if key is None:
            return True
        if key in self._reported:
            return False
        self._reported.add(key)
        return True

    # -- lookups -------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:  # type: ignore[override]
        counters.add("fuse_lookups")
        counters.add("fuse_ops_lookup")
        sname = os.fsdecode(name)
        if sname == ".":
            return await self.getattr(parent_inode)
        if sname == "..":
            return await self.getattr(self._parent.get(parent_inode, ROOT))
        parent = self._node(parent_inode)
        if not isinstance(parent, DirNode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        path = self._paths[parent_inode].rstrip("/") + "/" + sname
        child = await self._call(f"lookup {path}", parent.lookup(sname))
        if child is None:
            neg = pyfuse3.EntryAttributes()
            neg.st_ino = 0
            neg.entry_timeout = self.ttl
            return neg
        ino = self._remember(parent_inode, sname, child)
        return self._attrs(ino, child)

    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:  # type: ignore[override]
        counters.add("fuse_getattrs")
        counters.add("fuse_ops_getattr")
        return self._attrs(inode, self._node(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            left = self._lookups.get(ino, 0) - n
            if left > 0:
                self._lookups[ino] = left
                continue
            self._lookups.pop(ino, None)
            if ino != ROOT:
                # the number stays bound to its path (_ino_of); only the node object goes
                self._nodes.pop(ino, None)

    # -- directories ---------------------------------------------------------

    async def opendir(self, inode: int, ctx) -> int:  # type: ignore[override]
        counters.add("fuse_ops_opendir")
        node = self._node(inode)
        if not isinstance(node, DirNode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        entries = await self._call(f"readdir {self._paths[inode]}", node.children())
        fh = next(self._next_fh)
        parent = self._parent.get(inode, ROOT)
        # '.' and '..' come first, as on every POSIX file system; the kernel takes no
        # lookup reference for them (fuse_direntplus_link skips them), so neither do we
        snapshot = [(".", inode, node), ("..", parent, self._nodes.get(parent, node))]
        for name, child in entries:
            ino = self._remember(inode, name, child, count=False)
            snapshot.append((name, ino, child))
        self._dir_handles[fh] = snapshot
        return fh

    async def readdir(self, fh: int, start_id: int, token) -> None:  # type: ignore[override]
        counters.add("fuse_readdirs")
        counters.add("fuse_ops_readdir")
        entries = self._dir_handles.get(fh)
        if entries is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for i in range(start_id, len(entries)):
            name, ino, node = entries[i]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(ino, node), i + 1):
                return
            if name in (".", ".."):
                continue
            self._lookups[ino] = self._lookups.get(ino, 0) + 1
            self._nodes.setdefault(ino, node)  # it may have been forgotten since opendir

    async def releasedir(self, fh: int) -> None:
        self._dir_handles.pop(fh, None)

    # -- files ---------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx) -> pyfuse3.FileInfo:  # type: ignore[override]
        counters.add("fuse_ops_open")
        node = self._node(inode)
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if not isinstance(node, FileNode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        node.opened()
        return pyfuse3.FileInfo(fh=inode, keep_cache=node.immutable, direct_io=node.direct_io)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        counters.add("fuse_ops_read")
        node = self._node(fh)
        assert isinstance(node, FileNode)
        data = await self._call(f"read {self._paths.get(fh, fh)}", node.read(off, size))
        counters.add("fuse_read_requests")
        counters.add("fuse_read_bytes", len(data))
        return bytes(data) if isinstance(data, memoryview) else data

    async def release(self, fh: int) -> None:
        return None

    async def access(self, inode: int, mode: int, ctx) -> bool:  # type: ignore[override]
        return not (mode & os.W_OK)

    async def statfs(self, ctx) -> pyfuse3.StatvfsData:  # type: ignore[override]
        """df: size = what the store holds + free space where it lives; used = the store."""
        counters.add("fuse_ops_statfs")
        used, free = await self._call("statfs /", self._usage()) if self._usage else (0, 0)
        s = pyfuse3.StatvfsData()
        s.f_bsize = 1 << 20  # the preferred I/O size
        s.f_frsize = STATFS_BLOCK
        s.f_bfree = s.f_bavail = free // STATFS_BLOCK
        # at least one block even when empty: df leaves out file systems of size 0
        s.f_blocks = max(1, -(-used // STATFS_BLOCK) + s.f_bfree)
        s.f_files = len(self._paths)
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # getxattr/listxattr are left to pyfuse3's ENOSYS on purpose: the kernel then stops
    # asking, where ENODATA would cost `ls -l` two daemon round trips per file

    # -- everything that writes ---------------------------------------------

    async def _erofs(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _erofs  # type: ignore[assignment]
    create = write = _erofs  # type: ignore[assignment]
