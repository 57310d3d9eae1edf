"""The requests that change the tree: create, write, flush, fsync, setattr, mkdir, unlink,
rmdir, rename, link, mknod (symlink is refused).

Mixed into :class:`zvfs.fs.operations.ZvfsOperations`, whose table, open files and helpers
they use (named below, for the reader and the type checker). The rules they keep:

- Writes go only to nodes that say ``writable``; every other node answers EROFS, as does
  the whole tree of a read-only mount.
- A write that could not be stored is the application's error: from close() (flush) or
  fsync(), never dropped.
- unlink, rmdir and a rename that replaces unbind the old name, so a new entry of that name
  gets another inode; a rename moves the number with the entry, and the names below it.
- A name being removed or renamed holds back a lookup or open of it (``_changing_names``)
  until the table follows the store: such an open is told ESTALE and looks again.
- Every reply comes after the kernel's caches of the derived files are dropped
  (zvfs.fs.derived): the writer's next read of a view meets the new bytes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from zvfs.fs.fuse import pyfuse3
from zvfs.fs.inodes import ROOT
from zvfs.views.node import DirNode, FileHandle, FileNode, Node, NodeError

if TYPE_CHECKING:
    from zvfs.fs.derived import DerivedCaches
    from zvfs.fs.inodes import InodeTable
    from zvfs.stats import Counters

_RENAME_NOREPLACE = 1  # renameat2(2); its other flags (EXCHANGE, WHITEOUT) are refused
#: files kept open for the kernel's opens of names renamed over (see _keep_open):
#: the kernel forgets such an inode as soon as nothing holds it, so few are kept at once
KEPT_OPEN = 64


class WritingOperations:
    """The FUSE requests that change the tree (see the module's docstring)."""

    if TYPE_CHECKING:  # what ZvfsOperations, the class this is mixed into, provides
        _counters: Counters
        _inodes: InodeTable
        _root: DirNode
        _derived: DerivedCaches
        _files: dict[int, Any]
        _writing: dict[int, list[FileHandle]]
        _kept: OrderedDict[int, FileNode]
        _changing: dict[tuple[int, str], trio.Event]
        _numbering: dict[int, tuple[trio.Event, list[str]]]
        _next_fh: Any

        async def _call(self, what: str | Callable[[], str], coro: Awaitable[Any]) -> Any: ...
        def _node(self, ino: int) -> Node: ...
        def _attrs(self, ino: int, node: Node) -> pyfuse3.EntryAttributes: ...
        def _remember(self, parent: int, name: str, node: Node, count: bool = True) -> int: ...
        def _unbind(self, parent: int, name: str) -> None: ...
        def _names_changed(self, *dirs: int) -> None: ...
        def _bound_meanwhile(self, parent: int, name: str) -> None: ...
        def _forget_in_kernel(self, *names: tuple[int, str]) -> None: ...
        async def _changed(self, parent: int, name: str) -> None: ...
        def _opened(self, fh: int, ino: int, node: FileNode, handle: FileHandle | None) -> None: ...

    def _handle(self, fh: int) -> FileHandle:
        f = self._files.get(fh)
        if f is None or f.handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return f.handle

    def _dir(self, inode: int) -> DirNode:
        node = self._node(inode)
        if not isinstance(node, DirNode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return node

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx):  # type: ignore[no-untyped-def,override]
        self._counters.add("fuse_ops_create")
        sname = os.fsdecode(name)
        parent = self._dir(parent_inode)
        node, handle = await self._call(lambda: f"create {self._inodes.child_path(parent_inode, sname)}",
                                        parent.create(sname, bool(flags & os.O_EXCL), bool(flags & os.O_TRUNC)))
        handle.appending = bool(flags & os.O_APPEND)
        self._names_changed(parent_inode)
        self._unbind(parent_inode, sname)
        ino = self._remember(parent_inode, sname, node)
        fh = next(self._next_fh)
        self._opened(fh, ino, node, handle)
        await self._derived.settle()
        return pyfuse3.FileInfo(fh=fh, direct_io=handle.direct_io), self._attrs(ino, node)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        self._counters.add("fuse_ops_write")
        f = self._files.get(fh)
        handle = self._handle(fh)
        return await self._call(lambda: f"write {self._inodes.path(f.ino) if f else fh}", handle.write(off, buf))

    async def flush(self, fh: int) -> None:
        """close(): a write that could not be stored is the application's error here.

        A read-only mount has nothing to flush: ENOSYS tells the kernel so, and it sends no
        flush again on this mount, which takes a round trip to the daemon off every close()."""
        self._counters.add("fuse_ops_flush")
        if not self._root.writable:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        f = self._files.get(fh)
        if f is None or f.handle is None:
            return
        await self._storing(f.ino, self._call(lambda: f"flush {self._inodes.path(f.ino)}", f.handle.flush()))
        self._inodes.told[f.ino - ROOT] = f.handle.size  # the kernel's size: what was written through it
        await self._derived.settle()

    async def fsync(self, fh: int, datasync: bool) -> None:
        self._counters.add("fuse_ops_fsync")
        f = self._files.get(fh)
        if f is None:
            return
        if f.handle is None:  # an open for reading: a local file reports its write-back errors
            await self._call(lambda: f"fsync {self._inodes.path(f.ino)}", f.node.sync())
            return
        await self._storing(f.ino, self._call(lambda: f"fsync {self._inodes.path(f.ino)}",
                                              f.handle.flush(durable=True)))
        await self._derived.settle()

    async def _storing(self, ino: int, call: Awaitable[None]) -> None:
        """Await the storing of a file open for writing. EEXIST: an O_EXCL create whose
        upload found the key made behind the mount (S3). The file the name shows is the
        store's from then on: its size and mtime are no more the writes' (taken at once, as
        the release comes after close() returns), and the kernel forgets what it holds."""
        try:
            await call
        except pyfuse3.FUSEError as exc:
            if exc.errno == errno.EEXIST:
                self._writing.pop(ino, None)
                i = ino - ROOT
                self._forget_in_kernel((self._inodes.parent_of[i], self._inodes.name_at[i]))
            raise

    async def setattr(self, inode: int, attr, fields, fh, ctx):  # type: ignore[no-untyped-def,override]
        self._counters.add("fuse_ops_setattr")
        node = self._node(inode)
        path = self._inodes.path(inode)
        if not node.writable:
            raise pyfuse3.FUSEError(errno.EROFS)
        if fields.update_size:
            if not isinstance(node, FileNode):
                raise pyfuse3.FUSEError(errno.EISDIR)
            f = self._files.get(fh) if fh is not None else None
            if f is not None and f.handle is not None:
                await self._call(f"truncate {path}", f.handle.truncate(attr.st_size))
            else:
                await self._call(f"truncate {path}", node.set_size(attr.st_size))
        if fields.update_mtime:
            await self._call(f"utimens {path}", node.set_mtime_ns(attr.st_mtime_ns))
        # mode, owner and atime are the mount's, not the store's: accepted and not kept
        await self._derived.settle()
        return self._attrs(inode, node)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx):  # type: ignore[no-untyped-def,override]
        self._counters.add("fuse_ops_mkdir")
        sname = os.fsdecode(name)
        parent = self._dir(parent_inode)
        node = await self._call(lambda: f"mkdir {self._inodes.child_path(parent_inode, sname)}", parent.mkdir(sname))
        self._names_changed(parent_inode)
        self._unbind(parent_inode, sname)
        await self._derived.settle()
        return self._attrs(self._remember(parent_inode, sname, node), node)

    async def unlink(self, parent_inode: int, name: bytes, ctx) -> None:  # type: ignore[override]
        await self._remove("unlink", parent_inode, os.fsdecode(name))

    async def rmdir(self, parent_inode: int, name: bytes, ctx) -> None:  # type: ignore[override]
        await self._remove("rmdir", parent_inode, os.fsdecode(name))

    async def _remove(self, op: str, parent_inode: int, name: str) -> None:
        self._counters.add(f"fuse_ops_{op}")
        parent = self._dir(parent_inode)
        remove = parent.unlink if op == "unlink" else parent.rmdir
        async with self._changing_names((parent_inode, name)):
            await self._call(lambda: f"{op} {self._inodes.child_path(parent_inode, name)}", remove(name))
            self._names_changed(parent_inode)
            self._unbind(parent_inode, name)
        await self._derived.settle()

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,  # type: ignore[override]
                     name_new: bytes, flags: int, ctx) -> None:
        self._counters.add("fuse_ops_rename")
        if flags & ~_RENAME_NOREPLACE:  # EXCHANGE, WHITEOUT (overlayfs'): no store has them
            raise pyfuse3.FUSEError(errno.EINVAL)
        old, new = os.fsdecode(name_old), os.fsdecode(name_new)
        src, dst = self._dir(parent_inode_old), self._dir(parent_inode_new)
        what = f"rename {self._inodes.child_path(parent_inode_old, old)} -> {self._inodes.child_path(parent_inode_new, new)}"
        async with self._changing_names((parent_inode_old, old), (parent_inode_new, new)):
            kept = None if flags & _RENAME_NOREPLACE else await self._keep_open(parent_inode_new, new)
            try:
                await self._call(what, src.rename(old, dst, new, not flags & _RENAME_NOREPLACE))
            except BaseException as exc:
                self._let_go(kept)
                if isinstance(exc, pyfuse3.FUSEError):
                    self._forget_in_kernel((parent_inode_old, old), (parent_inode_new, new))
                raise
            self._names_changed(parent_inode_old, parent_inode_new)
            self._unbind(parent_inode_new, new)
            ino = self._inodes.pop(parent_inode_old, old)
            if ino is not None:
                await self._move(ino, parent_inode_new, new, dst)
        await self._derived.settle()

    async def _keep_open(self, parent: int, name: str) -> int | None:
        """Open the file ``name`` names now, if the kernel knows it, before a rename over
        it: the kernel may have looked the name up just before, and send its open just
        after. On a local file system that open reads the file it found; here it was told
        ESTALE, and the kernel looked the name up once more, so a reader of a name renamed
        over again and again got ESTALE itself (1 read in 928, under load). Kept only where
        a reader outlives the name (a local file's descriptor), until the kernel forgets the
        inode (at most KEPT_OPEN). Returns the inode kept.

        Not for an unlink: there the open told ESTALE finds no name when the kernel looks
        again (ENOENT, as a moment later), and keeping the file open cost `rm -r` of 5,000
        files 15% (2.63 s against 2.28)."""
        ino = self._inodes.find(parent, name)
        if ino is None or self._inodes.lookups[ino - ROOT] <= 0 or ino in self._writing:
            return None
        node = self._inodes.node_at[ino - ROOT]
        if not isinstance(node, FileNode) or (kept := await node.lasting_reader()) is None:
            return None
        self._let_go(ino)
        self._kept[ino] = kept
        while len(self._kept) > KEPT_OPEN:
            self._kept.popitem(last=False)[1].released()
        return ino

    def _let_go(self, ino: int | None) -> None:
        """Close what _keep_open kept of ``ino`` (the kernel forgot it, or the rename
        failed)."""
        if ino is not None and (kept := self._kept.pop(ino, None)) is not None:
            kept.released()

    async def _move(self, ino: int, parent_inode_new: int, new: str, dst: DirNode) -> None:
        """The inode table after ``ino`` was renamed to ``new`` under ``parent_inode_new``."""
        # the number moves with the entry (the kernel moved its dentry), and so do the names
        # below it, which hang from it
        self._inodes.bind(parent_inode_new, new, ino)
        if self._numbering:
            self._bound_meanwhile(parent_inode_new, new)
        self._inodes.parent_of[ino - ROOT], self._inodes.name_at[ino - ROOT] = parent_inode_new, new
        moved = await dst.lookup(new)
        if moved is not None:
            self._inodes.node_at[ino - ROOT] = moved
        # a node below a moved directory names its old key: each one the kernel still knows
        # is made anew from its new parent (the kernel keeps their entries, and asks by them)
        below = [(ino, moved)]
        while below:
            parent, parent_node = below.pop()
            for i in self._inodes.bound_children(parent):
                if self._inodes.lookups[i - ROOT] <= 0:
                    self._inodes.node_at[i - ROOT] = None
                    continue
                node = None
                if isinstance(parent_node, DirNode):
                    try:
                        node = await parent_node.lookup(self._inodes.name_at[i - ROOT])
                    except NodeError:
                        node = None
                self._inodes.node_at[i - ROOT] = node
                below.append((i, node))

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx):  # type: ignore[no-untyped-def,override]
        self._counters.add("fuse_ops_link")
        sname = os.fsdecode(new_name)
        node = self._node(inode)
        parent = self._dir(new_parent_inode)
        if not isinstance(node, FileNode):
            raise pyfuse3.FUSEError(errno.EPERM)
        made = await self._call(lambda: f"link {self._inodes.child_path(new_parent_inode, sname)}", parent.link(node, sname))
        self._names_changed(new_parent_inode)
        self._unbind(new_parent_inode, sname)
        await self._derived.settle()
        return self._attrs(self._remember(new_parent_inode, sname, made), made)

    async def symlink(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EPERM if self._root.writable else errno.EROFS)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,  # type: ignore[override]
                    ctx) -> pyfuse3.EntryAttributes:
        """mknod of a regular file is a create closed at once, an empty file (GNU tar makes
        each file so before it opens it when the archive holds extended attributes,
        `tar --xattrs -x`, which failed on every file with EPERM). A FIFO, a socket or a
        device has no key to be: EPERM."""
        if not self._root.writable:
            raise pyfuse3.FUSEError(errno.EROFS)
        if not stat.S_ISREG(mode):
            raise pyfuse3.FUSEError(errno.EPERM)
        self._counters.add("fuse_ops_create")
        sname = os.fsdecode(name)
        parent = self._dir(parent_inode)
        what = functools.partial(self._inodes.child_path, parent_inode, sname)
        node, handle = await self._call(lambda: f"mknod {what()}", parent.create(sname, True))
        try:
            await self._call(lambda: f"mknod {what()}", handle.flush())
        finally:
            with contextlib.suppress(pyfuse3.FUSEError):  # logged; the file is made or not
                await self._call(lambda: f"release {what()}", handle.release())
            self._names_changed(parent_inode)
            self._unbind(parent_inode, sname)
        # numbered once stored: a failed mknod leaves the kernel no entry to forget
        ino = self._remember(parent_inode, sname, node)
        await self._derived.settle()
        return self._attrs(ino, node)

    @asynccontextmanager
    async def _changing_names(self, *names: tuple[int, str]) -> AsyncIterator[None]:
        """While the store changes what ``names`` name and the table follows it.

        The kernel locks a directory for a rename or removal in it, but not against an
        open of a file it has looked up, nor a lookup that revalidates a cached entry. An
        open during a rename over its name opened the new file under the old inode number,
        whose size the kernel had from the old one: its reads and its fstat disagreed
        (direct_io kept the bytes whole). Now such an open waits, is told ESTALE, and the
        kernel looks the name up again."""
        names = tuple(dict.fromkeys(names))  # a rename onto itself names one name twice
        for name in names:
            await self._changed(*name)
        done = trio.Event()
        for name in names:
            self._changing[name] = done
        try:
            yield
        finally:
            for name in names:
                del self._changing[name]
            done.set()

