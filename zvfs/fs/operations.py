"""pyfuse3 Operations over a tree of nodes.

This layer knows nodes (directories with lookup/children, files with size and
read), never formats or stores. Its concurrency rules, all on the trio thread:

- An inode number (the table: :mod:`zvfs.fs.inodes`) is assigned per (parent
  inode, name) the first time that name is looked up, and never changed while
  the name is bound, so ``stat`` twice gives one ``st_ino``. ``forget`` drops the node object when the
  kernel's lookup count reaches zero; a later lookup makes a fresh node
  under the same number. A number whose name was removed or replaced through
  the mount is dealt out again once the kernel has forgotten it (and no
  directory handle open since could list it), with its generation bumped: a
  writable mount's table stays the size of what lives in it, however many
  files come and go.
- A directory handle snapshots the sorted children at ``opendir``; readdir
  offsets index that snapshot, so they are stable for the handle's life. The
  names are numbered a slice at a time, other requests answered in between; a
  node is kept only for what the kernel holds (looked up, or sent by readdir).
- A file handle is a number of its own per open: it holds the node, and for an
  open with write flags the node's write handle (reads through it see what was
  written through it). The requests that write are :mod:`zvfs.fs.writing`'s,
  mixed in here; after each, the kernel's caches of the *derived* files (paths
  below ``derived``, the decoded views) are dropped (:mod:`zvfs.fs.derived`).
- The kernel's page cache of a file is kept across opens (``keep_cache``) when
  its data is immutable, or while the node's ``version()`` is the one the cached
  pages were read under and that was less than the metadata TTL ago; otherwise
  the open drops them and starts a new epoch.
- Every failure is one operation's: NodeError carries its errno; anything
  else is logged with the path and becomes EIO.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import itertools
import logging
import os
import time
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import trio

from zvfs.fs.derived import DerivedCaches, Targets, invalidate
from zvfs.fs.fuse import pyfuse3
from zvfs.fs.inodes import ROOT, InodeTable
from zvfs.fs.ownership import Ownership
from zvfs.fs.push import PUSH_MAX, PagePush
from zvfs.fs.writing import WritingOperations
from zvfs.views.context import MountContext
from zvfs.views.node import DirNode, FileHandle, FileNode, LazyEntries, Node, NodeError
from zvfs.workers import current_flow, run_abandonable

log = logging.getLogger("zvfs")
#: the page epoch of a file whose read failed EIO: equal to no node's version
_READ_FAILED = object()

STATFS_BLOCK = 4096
#: the longest name a path component may have (Linux's NAME_MAX, in bytes)
NAME_MAX = 255
#: errnos that answer what the application asked (logged at info), not a failure to serve it
_REFUSALS = frozenset({errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR, errno.EROFS,
                       errno.ENAMETOOLONG, errno.EXDEV, errno.ESTALE})
#: free space a writable store with no bound of its own (S3) reports to df and cp
_UNBOUNDED_FREE = 1 << 50


def _writes(flags: int) -> bool:
    """Whether an open with ``flags`` may write: write access, or O_TRUNC. O_APPEND alone
    (with O_RDONLY) writes nothing, as on a local file system: taken for a write, it was
    EROFS on a read-only mount, and on S3 it staged the whole object (EFBIG past
    --rewrite-max-size) for a reader. (The kernel leaves O_CREAT out of an open.)"""
    return flags & os.O_ACCMODE != os.O_RDONLY or bool(flags & os.O_TRUNC)


class _DirSnapshot(NamedTuple):
    """One open directory: '.' and '..', then its entries as read at opendir and their inodes
    (kept apart, not as a tuple per entry: this is held while a reader walks the directory)."""

    dots: tuple[tuple[str, int, Node], tuple[str, int, Node]]
    entries: Sequence[tuple[str, Node]]
    inos: array
    #: the mount's count of names unbound when the snapshot was taken
    unbinds: int = 0
    #: the mount's count of name changes (_names_changed) when the snapshot was taken
    names: int = 0


@dataclass(slots=True)
class _Open:
    """One open file: its inode, the node it reads, and its write handle if it writes."""

    ino: int
    node: FileNode
    handle: FileHandle | None = None


async def _named_in(parent: Node, name: str) -> Node | None:
    """What ``name`` names in ``parent`` now; None if nothing (or ``parent`` is no directory)."""
    if not isinstance(parent, DirNode):
        return None
    try:
        return await parent.lookup(name)
    except NodeError:
        return None


class ZvfsOperations(WritingOperations, pyfuse3.Operations):
    """The file system over ``root``, for the mount whose context is ``ctx``: its counters and
    log-once, and its metadata TTL (None: indefinite, the data is immutable)."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, root: DirNode, ctx: MountContext,
                 usage: Callable[[], Awaitable[tuple[int, int | None]]] | None = None,
                 derived: Sequence[str] = (), owner: Ownership | None = None) -> None:
        """``usage`` answers statfs (df): bytes the store holds, and bytes free where it lives
        (None: no bound of its own, as on S3).
        ``derived``: path prefixes ('/.zvfs/') whose kernel caches a write invalidates.
        ``owner``: who owns every node, with which modes (default: whoever runs the daemon)."""
        super().__init__()
        ttl = ctx.metadata_ttl
        self.ttl = 365 * 86400.0 if ttl is None else float(ttl)
        #: how long the kernel takes a name looked up and not found for absent. A writable
        #: mount's names are made through it, and a name made behind it was refused EEXIST
        #: by the store while the kernel still held it absent: `mkdir -p` then failed ENOENT
        #: from its own stat. The entry's drop can only follow the reply (the kernel holds
        #: the directory locked until then), so the stat could come first: a writable mount
        #: keeps no such entries, and the views' listing answers each lookup
        self._absent_ttl = 0.0 if root.writable else self.ttl
        self._counters = ctx.counters
        self._log_once = ctx.log_once
        self._usage = usage
        self._root = root
        #: every number the mount dealt out, its name, parent and node (zvfs.fs.inodes)
        self._inodes = InodeTable(root, derived, self._oldest_listing)
        #: inode -> its opens for writing, newest last: their size is the file's, whatever
        #: became of its name (renamed, unlinked or replaced while open, as in POSIX)
        self._writing: dict[int, list[FileHandle]] = {}
        #: inode -> a reader of the file its name held, opened just before a rename through
        #: the mount replaced it (see _keep_open), oldest first
        self._kept: OrderedDict[int, FileNode] = OrderedDict()
        #: directories whose listing is being numbered (see _remember_all): set once done,
        #: and the names bound one by one under them meanwhile
        self._numbering: dict[int, tuple[trio.Event, list[str]]] = {}
        #: open directories: their entries as read at opendir, and the inode of each
        self._dir_handles: dict[int, _DirSnapshot] = {}
        #: the directory handles read from already: a readdir from 0 again is a rewinddir
        self._dirs_read: set[int] = set()
        #: name changes made through the mount (create, mkdir, link, unlink, rmdir, rename),
        #: and the count at each directory's last one (at most DIRS_CHANGED directories: past
        #: that they are forgotten, and every directory is taken as changed at the floor)
        self._names = 0
        self._names_at: dict[int, int] = {}
        self._names_floor = 0
        self._next_fh = itertools.count(1)
        self._last_fh = 0
        #: numbers unbound through the mount that the kernel still knows: freed when it forgets
        self._detached: set[int] = set()
        #: (parent, name) -> set once the rename or removal of that name through the mount,
        #: begun in the store, is in the table too: a lookup or open of the name meanwhile
        #: waits for it (see _changing_names)
        self._changing: dict[tuple[int, str], trio.Event] = {}
        #: inode -> (node version, monotonic time) of the kernel's cached pages
        self._page_epochs: dict[int, tuple[object, float]] = {}
        self._files: dict[int, _Open] = {}
        #: inode -> its open handles, for reading or writing
        self._open_count: dict[int, int] = {}
        #: the kernel's page cache, stored into through the FUSE device (set once mounted)
        self.pages: PagePush | None = None
        #: derived inodes whose node is of the views before a write: looked up again from
        #: their parent at their next use (see _fresh)
        self._stale: set[int] = set()
        #: when the kernel's caches of the derived files are dropped after a write
        self._derived = DerivedCaches(ctx.counters, ctx.log_once, self._derived_targets)
        self._owner = owner or Ownership()
        ctx.counters.reading("inodes", self._inodes.in_use)

    # -- numbers, nodes and entries (the table itself: zvfs.fs.inodes) --------

    def _node(self, ino: int) -> Node:
        node = self._inodes.known(ino)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _parent(self, ino: int) -> int:
        i = ino - ROOT
        return self._inodes.parent_of[i] if 0 < i < len(self._inodes.parent_of) else ROOT

    def _remember(self, parent: int, name: str, node: Node, count: bool = True) -> int:
        """Inode for ``name`` under ``parent``: the same number every time, but for a name
        whose file became another (see _replaced)."""
        ino = self._inodes.find(parent, name)
        if ino is not None and self._replaced(parent, name, ino, node):
            ino = None
        if ino is None:
            ino = self._inodes.new(parent, name, node)
            self._inodes.bind(parent, name, ino)
            if self._numbering:
                self._bound_meanwhile(parent, name)
        else:
            self._inodes.node_at[ino - ROOT] = node
            if self._inodes.gone_held and ino in self._inodes.gone_held:
                self._inodes.unbound_now(parent, ino)  # back in the store: not unbound at forget
        if count:
            self._inodes.lookups[ino - ROOT] += 1
        return ino

    def _replaced(self, parent: int, name: str, ino: int, node: Node) -> bool:
        """Whether ``name``, bound to ``ino``, holds another file than the one the kernel's
        inode of ``ino`` stands for, changed behind the mount. Then the name is unbound, as
        a replace through the mount unbinds it, and gets a new number (a helper's audits):

        - a directory where the kernel was told of a file, or the other way round (an array
          rewritten with more dimensions makes its chunk key c/0 a directory): told of both
          kinds under one number, the kernel marked its inode bad, and every call on an
          open of the old file, close() too, failed with EIO;
        - a file where an open of ``ino`` reads one with no name left (renamed over): the
          new file's size, told under the number, cut the kernel's inode, and a cp of the
          old one ended at the new one's size with no error."""
        old = self._inodes.node_at[ino - ROOT]
        if old is None:
            return False
        if isinstance(old, DirNode) == isinstance(node, DirNode) and (
                isinstance(node, DirNode) or not self._open_count.get(ino) or ino in self._writing
                or not any(reader.unnamed() for reader in self._readers(ino))):
            return False
        self._unbind(parent, name)
        return True

    async def _remember_all(self, parent: int, entries: Sequence[tuple[str, Node]]) -> array | None:
        """Inodes for a directory's ``entries`` (sorted by name, as ``children()`` gives
        them): the names never met before are numbered as one run, in sorted order, or,
        when there are freed numbers enough for them (a writable mount's churn: a listing
        that meets a file before its create is answered), one by one from those. (An array,
        not a list of ints: a directory of 200,000 keys would hold 200,000 int objects while
        it is open.) None: the directory was removed meanwhile.

        The names are gone through a slice at a time, letting the mount's other requests
        in between (a million names took seconds, during which nothing else was answered);
        the numbers are dealt out at the end, at once. One directory is numbered by one
        listing at a time, and a name bound meanwhile by a lookup (or a create, a rename)
        keeps the number it was given. No node is kept here: readdir keeps those of the
        entries it tells the kernel of."""
        while (busy := self._numbering.get(parent)) is not None:
            await busy[0].wait()
        meanwhile: list[str] = []
        self._numbering[parent] = (done := trio.Event(), meanwhile)
        try:
            return await self._number(parent, entries, meanwhile)
        finally:
            del self._numbering[parent]
            done.set()

    async def _number(self, parent: int, entries: Sequence[tuple[str, Node]],
                      meanwhile: list[str]) -> array | None:
        names = _names_of(entries)
        n = len(names)
        generation = self._inodes.generation.get(parent, 0)
        found = array("q", bytes(8 * n))  # 0: not bound yet
        new: list[str] = []
        in_order = True  # strictly sorted: no name twice
        last: str | None = None
        quick = parent not in self._inodes.ino_of and parent not in self._inodes.runs  # nothing bound yet
        find = self._inodes.find
        each = iter(names)
        for lo in range(0, n, LISTING_SLICE):
            if lo:
                await trio.sleep(0)
            for k, name in zip(range(lo, min(n, lo + LISTING_SLICE)), each, strict=False):
                if last is not None and name <= last:
                    in_order = False
                last = name
                ino = None if quick else find(parent, name)
                if ino is None:
                    new.append(name)
                else:
                    found[k] = ino
        # from here to the numbers dealt out, no await: the table does not change meanwhile
        if parent != ROOT and (not self._inodes.name_at[parent - ROOT]
                               or self._inodes.generation.get(parent, 0) != generation):
            return None  # removed (and its number maybe dealt out again) meanwhile
        if not in_order:  # not as children() promises: each name looked up again, sorted
            found = array("q", (find(parent, name) or 0 for name in names))
            new = sorted({name for name, ino in zip(names, found, strict=True) if not ino})
        elif meanwhile:
            for name in meanwhile:  # bound by a lookup, a create or a rename into it
                ino = find(parent, name)
                k = bisect_left(names, name)
                if ino is None or k == n or names[k] != name or found[k]:
                    continue
                found[k] = ino
                j = bisect_left(new, name)
                del new[j]
        reused: dict[str, int] = {}
        first = 0
        self._inodes.release_quarantine()
        if new and len(new) <= len(self._inodes.free):
            for name in new:
                reused[name] = ino = self._inodes.new(parent, name, None)
                self._inodes.bind(parent, name, ino)
        elif new:
            first = self._inodes.new_run(parent, new)
        if not new:
            return found
        if not reused and in_order and len(new) == n:
            return array("q", range(first, first + n))  # every name new: the run itself
        # the numbers are bound now: the rest may let other requests in between again
        r = 0
        for lo in range(0, n, LISTING_SLICE):
            if lo:
                await trio.sleep(0)
            for k in range(lo, min(n, lo + LISTING_SLICE)):
                if not found[k]:
                    name = names[k]
                    if reused:
                        found[k] = reused[name]
                    else:  # new is in the names' order, unless they were not sorted
                        found[k] = first + (r if in_order else bisect_left(new, name))
                        r += 1
        return found

    async def _drop_gone(self, parent: int, node: DirNode, entries: Sequence[tuple[str, Node]]) -> int:
        """Free the numbers of the names bound under ``parent`` that its listing ``entries``
        (sorted, every name numbered) no longer has and that ``node`` no longer finds: the
        store lost them behind the mount (a bucket's old keys, an array zarr-python rewrote).
        Those the kernel has forgotten, and no open file holds, are unbound as a removal
        through the mount is, their numbers dealt out again; the others once it forgets them.
        A read-only mount of a store whose keys come and go kept a number, and its name,
        for every key it ever listed: about 180 bytes each, for the mount's life.

        Costs nothing while every bound name is listed (but those kept last time): the
        bound names are counted, not compared. Gone through a slice at a time. Returns how
        many names it unbound."""
        live = len(self._inodes.ino_of.get(parent, ())) - self._inodes.dead_in.get(parent, 0)
        live += sum(len(run) for _, run in self._inodes.runs.get(parent, ()))
        if live - len(entries) <= self._inodes.unlisted_kept.get(parent, 0):
            return 0
        names = _names_of(entries)
        n = len(names)
        bound = list(self._inodes.ino_of.get(parent, {}).items())
        for first, run in list(self._inodes.runs.get(parent, ())):
            for lo in range(0, len(run), LISTING_SLICE):
                if lo:
                    await trio.sleep(0)  # a run's names are never changed: a gone one is checked below
                bound.extend((name, ino) for ino, name in enumerate(run[lo:lo + LISTING_SLICE], first + lo)
                             if ino not in self._inodes.unbound)
        gone: list[tuple[str, int]] = []
        for lo in range(0, len(bound), LISTING_SLICE):
            if lo:
                await trio.sleep(0)
            for name, ino in bound[lo:lo + LISTING_SLICE]:
                k = bisect_left(names, name)
                if k == n or names[k] != name:
                    gone.append((name, ino))
        kept = dropped = 0
        for j, (name, ino) in enumerate(gone):
            if j and not j % LISTING_SLICE:
                # each is looked up and unbound: a store that lost 150,000 keys held the
                # mount for 0.7 s here (everything below is checked again after a pause)
                await trio.sleep(0)
            if ino in self._inodes.gone_held and self._inodes.lookups[ino - ROOT] > 0:
                kept += 1  # found gone by an earlier listing, and still held: no lookup again
                continue
            try:  # a name a listing leaves out (the root's '.zvfs') is not gone
                there = await node.lookup(name) is not None
            except NodeError:
                there = True  # not known to be gone
            if there or self._inodes.find(parent, name) != ino or (parent, name) in self._changing:
                kept += 1
            elif self._inodes.lookups[ino - ROOT] > 0 or ino in self._writing:
                self._inodes.gone_held.add(ino)  # unbound when the kernel forgets it (forget)
                kept += 1
            else:
                self._unbind(parent, name)
                dropped += 1
        if kept > 0:
            self._inodes.unlisted_kept[parent] = kept
        else:
            self._inodes.unlisted_kept.pop(parent, None)
        return dropped

    def _listed_again(self, parent: int, entries: Sequence[tuple[str, Node]], inos: array) -> None:
        """The names of ``_gone_held`` under ``parent`` that its listing ``entries`` (numbered
        ``inos``) has again: the store has them back (removed and made again behind the
        mount), so the kernel's forget must not unbind them. (It did: a listing opened
        meanwhile, whose snapshot had the name under its number, left the name out.)"""
        held = self._inodes.gone_held
        if len(held) < len(inos):
            names = _names_of(entries)
            n = len(names)
            for ino in [ino for ino in held if self._inodes.parent_of[ino - ROOT] == parent]:
                name = self._inodes.name_at[ino - ROOT]
                k = bisect_left(names, name)
                if k < n and names[k] == name and inos[k] == ino:
                    self._inodes.unbound_now(parent, ino)
        else:
            for ino in inos:
                if ino in held:
                    self._inodes.unbound_now(parent, ino)

    def _bound_meanwhile(self, parent: int, name: str) -> None:
        """``name`` was bound under ``parent`` one by one: a listing numbering ``parent``
        meanwhile must not number it again."""
        numbering = self._numbering.get(parent)
        if numbering is not None:
            numbering[1].append(name)

    def _detach(self, ino: int) -> None:
        """``ino``'s name was removed or replaced through the mount: its number is freed now,
        or once the kernel forgets it. (A number of a listing's run stays in ``_unbound``
        when it is dealt out again: its run's slot is dead for good.)"""
        if self._inodes.lookups[ino - ROOT] > 0 or ino in self._writing:
            self._detached.add(ino)
        else:
            self._free_number(ino)

    def _free_number(self, ino: int) -> None:
        """Free ``ino`` in the table, with what this layer keeps of it, and detach the names
        still bound below it (a removed directory held nothing in the store, whatever names
        hang from it here: removed outside the mount, or a listing's dead slots)."""
        self._page_epochs.pop(ino, None)
        self._stale.discard(ino)
        below = self._inodes.release(ino, self._last_fh if self._dir_handles else None)
        for child in below:
            if self._inodes.still_below(child, ino):
                self._detach(child)

    def _oldest_listing(self) -> int:
        """The oldest open directory handle (or the next to be dealt out): a number freed
        after it was opened is not dealt out again while it is open (see InodeTable)."""
        return min(self._dir_handles, default=self._last_fh + 1)

    def _attrs(self, ino: int, node: Node) -> pyfuse3.EntryAttributes:
        """A node's entry, made for a reply that pyfuse3 sends after the handler returns."""
        return self._fill(self._blank(), ino, node)

    def _read_now(self, ino: int) -> tuple[int, int] | None:
        """Size and mtime of what an open of ``ino`` for reading (or the file kept for a
        name renamed over it) reads now, where its reader can tell (a local file's
        descriptor); None else. Only for a file that is open (a scan of the opens)."""
        for node in self._readers(ino):
            if now := node.current_size_and_mtime_ns():
                return now
        kept = self._kept.get(ino)
        return None if kept is None else kept.current_size_and_mtime_ns()

    def _blank(self) -> pyfuse3.EntryAttributes:
        """An entry with what every node of the mount shares set. readdir fills one entry
        again for each name, as ``readdir_reply`` copies it into the reply at once: a walk
        of a million files sets these fields once a reply, not once a file."""
        a = pyfuse3.EntryAttributes()
        a.entry_timeout = self.ttl
        a.st_uid = self._owner.uid
        a.st_gid = self._owner.gid
        a.st_rdev = 0
        a.st_blksize = 1 << 20
        return a

    def _fill(self, a: pyfuse3.EntryAttributes, ino: int, node: Node) -> pyfuse3.EntryAttributes:
        """Set in ``a`` (from :meth:`_blank`) what is ``node``'s own."""
        a.st_ino = ino
        a.generation = self._inodes.generation.get(ino, 0) if self._inodes.generation else 0
        is_file = isinstance(node, FileNode)
        # a live file's size changes with its content: the kernel must ask every time
        a.attr_timeout = 0 if is_file and node.direct_io else self.ttl
        a.st_mode = self._owner.mode(not is_file, node.writable)
        if is_file:
            size, mtime_ns = node.size_and_mtime_ns()
            # a file whose name was removed through the mount (unlink, a rename over it) has no
            # link left, as fstat of an open unlinked file says on any disk (lsof +L1, log
            # followers); only a writable mount removes names
            unlinked = node.writable and not self._inodes.bound(ino)
            if self._writing and ino in self._writing:
                # open for writing: what the writes made it, and asked again each time (a
                # cached answer outlived the close, whose flush gives the listing the new
                # mtime: the kernel kept the old one for the TTL)
                handle = self._writing[ino][-1]
                size, mtime_ns = handle.size, handle.mtime_ns or mtime_ns
                a.attr_timeout = 0
            elif (unlinked or (self._open_count and self._open_count.get(ino))) \
                    and (now := self._read_now(ino)) is not None:
                # open: the file its opens read as it is now (a local file's descriptor), not
                # the key's last listing. With no name: a write through an open closed since,
                # as `a` unlinked, written, then read through an open made before: the kernel
                # took the size the listing had for the file's, 0, and the reader found
                # nothing. With its name: a file appended to, rewritten or cut behind the
                # mount kept its first listing's size and mtime for as long as it was open
                # and no path was looked up (tail -f read nothing new, and the kernel kept
                # its old pages; a helper's audit)
                size, mtime_ns = now
            a.st_nlink = 0 if unlinked else 1
            self._inodes.told[ino - ROOT] = size
        else:
            size, mtime_ns = 0, node.mtime_ns
            a.st_nlink = 2
        a.st_size = size
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime_ns
        return a

    async def _call(self, what: str | Callable[[], str], coro):  # type: ignore[no-untyped-def]
        """Await a node call; map its failure to one errno and one log line.

        ``what`` ('lookup /a/b') may be a function making it: paths are made only for errors."""
        try:
            return await coro
        except pyfuse3.FUSEError:
            self._counters.add(f"fuse_errors_{_op(what)}")
            raise
        except NodeError as exc:
            if exc.errno != errno.ENOENT:
                what = what() if callable(what) else what
                self._counters.add(f"fuse_errors_{_op(what)}")
                # what the application asked for cannot be (rmdir of a full directory, a
                # write to a read-only mount): its answer, not a failure of the mount, so
                # not the status's "last error" either (an rmdir's ENOTEMPTY showed there)
                refusal = exc.answer or (exc.errno in _REFUSALS and exc.key is None)
                if not refusal:
                    self._counters.note_error(f"{what}: {exc}")
                if exc.key is None or self._log_once.first(exc.key):
                    log.log(logging.INFO if refusal else logging.ERROR, "%s: %s", what, exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except Exception as exc:  # noqa: BLE001 - one bad file must not take the daemon down
            what = what() if callable(what) else what
            self._counters.add(f"fuse_errors_{_op(what)}")
            self._counters.note_error(f"{what}: {type(exc).__name__}: {exc}")
            log.error("%s: %s: %s", what, type(exc).__name__, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    # -- lookups -------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:  # type: ignore[override]
        self._counters.add("fuse_lookups")
        self._counters.add("fuse_ops_lookup")
        sname = os.fsdecode(name)
        if sname in (".", ".."):
            # the kernel asks these only to find a directory's parent for an NFS export
            # (fuse_get_parent), and counts the reply as a lookup reference it will forget
            ino = parent_inode if sname == "." else self._parent(parent_inode)
            await self._named_again(ino, keep=True)
            entry = await self.getattr(ino)
            self._inodes.lookups[ino - ROOT] += 1
            return entry
        parent = await self._live(parent_inode)
        if not isinstance(parent, DirNode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if self._changing:
            await self._changed(parent_inode, sname)
        before = self._inodes.find(parent_inode, sname)
        child = await self._call(lambda: f"lookup {self._inodes.child_path(parent_inode, sname)}",
                                 parent.lookup(sname))
        if child is None:
            if before is not None and self._inodes.find(parent_inode, sname) == before \
                    and self._inodes.lookups[before - ROOT] <= 0 and before not in self._writing:
                self._unbind(parent_inode, sname)  # gone from the store behind the mount
            neg = pyfuse3.EntryAttributes()
            neg.st_ino = 0
            neg.entry_timeout = self._absent_ttl
            return neg
        ino = self._remember(parent_inode, sname, child)
        return self._attrs(ino, child)

    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:  # type: ignore[override]
        self._counters.add("fuse_getattrs")
        self._counters.add("fuse_ops_getattr")
        try:
            return self._attrs(inode, await self._live(inode))
        except pyfuse3.FUSEError as exc:
            held = self._held(inode) if exc.errno == errno.ENOENT else None
            if held is None:
                raise
        # its name is gone from the views (a chunk file of an array made again with another
        # grid), but it is open: fstat answers, as of an open unlinked file, and the kernel's
        # check of the attributes before a read lets the read reach the open's node, which
        # says ESTALE ("open it again") as the README has it, not ENOENT
        a = self._attrs(inode, held)
        a.st_nlink = 0
        return a

    def _held(self, ino: int) -> FileNode | None:
        """The node an open of ``ino`` for reading reads, if there is one."""
        return next(self._readers(ino), None) if self._open_count.get(ino) else None

    def _readers(self, ino: int) -> Iterator[FileNode]:
        """The nodes the opens of ``ino`` for reading read (a scan of the opens: only for a
        file that is open)."""
        return (f.node for f in self._files.values() if f.ino == ino and f.handle is None)

    async def _live(self, ino: int) -> Node:
        """``ino``'s node as it is now: a derived file made from metadata the mount has read
        anew since is looked up again. The kernel keeps an entry of a view for the TTL, and
        a listing keeps the node the table has (it may be newer than the listing's): after
        a change behind the mount, `ls -l` then a new open was given the old node, which
        read ESTALE ("open it again", though it was opened after), and its mmap SIGBUS."""
        node = await self._fresh(ino) if self._stale else self._node(ino)
        if self._inodes.derived[ino - ROOT] and node.outdated():
            parent = ino
            while parent != ROOT and self._inodes.derived[parent - ROOT] and not self._view_top(parent):
                self._stale.add(parent)  # up to a top of the views: each resolves the current ones
                parent = self._parent(parent)
            node = await self._fresh(ino)
        return node

    async def _named_again(self, ino: int, keep: bool) -> Node:
        """``ino``'s node; one the kernel forgot, its number still bound to its name, looked
        up again by that name (its parents too, as far as they were forgotten). An NFS
        export's file handle names a number and its generation: once the server's kernel
        had dropped the inode, it asked LOOKUP(number, ".") and was told ENOENT, ESTALE to
        every client holding the handle (a helper's audit). ``keep``: the node stays in the
        table (the caller gives the kernel a reference, which it forgets in time)."""
        node = self._inodes.known(ino)
        if node is not None or ino == ROOT or not self._inodes.bound(ino):
            return self._node(ino)
        i = ino - ROOT
        found = await _named_in(await self._named_again(self._inodes.parent_of[i], keep=False),
                                self._inodes.name_at[i])
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if keep:
            self._inodes.node_at[i] = found
        return found

    def _view_top(self, ino: int) -> bool:
        """Whether ``ino`` is a top of the derived views (a directory right below a derived
        prefix): it resolves the current views itself, where the nodes below it are of the
        views it had when they were looked up."""
        return self._inodes.path(self._parent(ino)).rstrip("/") + "/" in self._inodes.derived_prefixes

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            i = ino - ROOT
            if not 0 <= i < len(self._inodes.node_at):
                continue
            left = self._inodes.lookups[i] - n
            if left > 0:
                self._inodes.lookups[i] = left
                continue
            self._inodes.lookups[i] = 0
            self._page_epochs.pop(ino, None)  # the kernel's inode, and its pages, are gone
            if self._kept:
                self._let_go(ino)
            self._stale.discard(ino)
            self._inodes.told[i] = -1
            if ino != ROOT:
                # the number stays bound to its name (_ino_of); only the node object goes
                self._inodes.node_at[i] = None
                if ino in self._detached:  # unbound through the mount: free its number
                    self._detached.discard(ino)
                    self._detach(ino)  # unless a write handle still holds it
                elif self._inodes.gone_held and ino in self._inodes.gone_held:
                    # its listing no longer had it: the store lost it behind the mount
                    parent, name = self._inodes.parent_of[i], self._inodes.name_at[i]
                    if self._inodes.find(parent, name) == ino and ino not in self._writing \
                            and (parent, name) not in self._changing:
                        self._unbind(parent, name)

    # -- directories ---------------------------------------------------------

    async def opendir(self, inode: int, ctx) -> int:  # type: ignore[override]
        self._counters.add("fuse_ops_opendir")
        snap = await self._snapshot(inode)
        fh = self._last_fh = next(self._next_fh)
        self._dir_handles[fh] = snap
        return fh

    async def _snapshot(self, inode: int) -> _DirSnapshot:
        """The listing an open of directory ``inode`` reads: at opendir, and again at a
        rewinddir (a readdir from offset 0 once it has been read)."""
        node = await self._live(inode)
        if not isinstance(node, DirNode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        unbinds = self._inodes.unbinds  # a name unbound from here on is checked at readdir
        names = self._names
        entries = await self._call(lambda: f"readdir {self._inodes.path(inode)}", node.children())
        inos = await self._remember_all(inode, entries)
        if inos is None:  # removed while it was listed
            entries, inos = (), array("q")
        else:
            if self._inodes.unlisted_kept.get(inode):
                self._listed_again(inode, entries, inos)
            before = self._inodes.unbinds
            dropped = await self._drop_gone(inode, node, entries)
            if before == unbinds and self._inodes.unbinds == before + dropped:
                unbinds = self._inodes.unbinds  # only names these entries do not have were unbound
        parent = self._parent(inode)
        # '.' and '..' come first, as on every POSIX file system; the kernel takes no
        # lookup reference for them (fuse_direntplus_link skips them), so neither do we
        above = self._inodes.known(parent)
        return _DirSnapshot(((".", inode, node), ("..", parent, node if above is None else above)),
                            entries, inos, unbinds, names)

    async def readdir(self, fh: int, start_id: int, token) -> None:  # type: ignore[override]
        self._counters.add("fuse_readdirs")
        self._counters.add("fuse_ops_readdir")
        snap = self._dir_handles.get(fh)
        if snap is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if start_id == 0 and (fh in self._dirs_read or self._names_changed_since(snap)):
            # rewinddir (an lseek to 0): POSIX has the stream show the directory as it is
            # now, as a new opendir would; the snapshot of the open showed a file made since
            # (a spool polled by rewinddir) never. So does a first read after a name changed
            # in it through the mount (a file made through the descriptor, then listed by
            # it, as on a local file system). Numbers freed meanwhile stay quarantined
            # for this handle, which is still open, as before.
            try:
                fresh: _DirSnapshot | None = await self._snapshot(snap.dots[0][1])
            except pyfuse3.FUSEError:
                fresh = None  # gone meanwhile: the listing it had
            if fresh is not None and fh in self._dir_handles:
                snap = self._dir_handles[fh] = fresh
        self._dirs_read.add(fh)
        a, fill, reply = self._blank(), self._fill, pyfuse3.readdir_reply
        for i in range(start_id, 2):
            name, ino, node = snap.dots[i]
            if not reply(token, os.fsencode(name), fill(a, ino, node), i + 1):
                return
        entries, inos = snap.entries, snap.inos
        # a name removed or renamed through the mount since the opendir is left out, and a
        # replaced one listed as what it holds now: the snapshot's number would tie the name
        # to the old file again, with the attributes of the new one (a reader of the
        # replaced file, still open, saw its size cut to the new file's), or to a number
        # dealt out to another file since
        changed = snap.unbinds != self._inodes.unbinds
        dir_ino = snap.dots[0][1]
        first = max(start_id - 2, 0)
        # the table's arrays grow in place, never replaced: held here for the loop
        lookups, node_at = self._inodes.lookups, self._inodes.node_at
        for i in range(first, len(entries)):
            if i > first and not (i - first) % READDIR_SLICE:
                # the kernel asks for up to a megabyte of entries at once (thousands of
                # names, tens of ms): the mount's other requests are let in between (the
                # entries told so far wait in this reply, and the table keeps their numbers)
                await trio.sleep(0)
                changed = snap.unbinds != self._inodes.unbinds
            name, node = entries[i]
            ino = inos[i]
            if changed and not self._inodes.still_named(ino, dir_ino, name):
                ino = self._inodes.find(dir_ino, name) or 0  # replaced: what the name holds now, if
                node = self._inodes.node_at[ino - ROOT] if ino else None  # its node is at hand
                if node is None:
                    continue
            elif node_at[ino - ROOT] is not None and self._replaced(dir_ino, name, ino, node):
                # (the guard inline: a first listing of a million names tells no number twice)
                ino = self._remember(dir_ino, name, node, count=False)
            try:
                raw = os.fsencode(name)
                if len(raw) > NAME_MAX:  # none could open it; past 4 KiB the kernel fails the reply
                    raise ValueError(f"a name of {len(raw)} bytes (a name has at most {NAME_MAX})")
                was = self._inodes.told[ino - ROOT]
                told = reply(token, raw, fill(a, ino, node), i + 3)
            except (NodeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
                # one entry the kernel cannot be told of (a name no file system can hold, a
                # size past 2**63 from hostile metadata): left out, the rest listed
                self._unlisted(name, exc)
                continue
            if not told:
                # not sent (the reply is full): the size the kernel holds is still the one
                # told before. Recorded as sent, an open after a listing that stopped here
                # kept the kernel's stale size, and a file grown behind the mount read short
                # until the TTL passed (a helper's audit)
                self._inodes.told[ino - ROOT] = was
                return
            # the kernel holds it now (readdirplus: a lookup reference, and a FORGET when it
            # lets go), so the node is kept: only the entries it was told of keep one. A node
            # the table has already stays: a lookup during the listing made it afresh (from
            # metadata newer than the listing's, whose node read ESTALE in every new open)
            lookups[ino - ROOT] += 1
            if node_at[ino - ROOT] is None:
                node_at[ino - ROOT] = node

    def _unlisted(self, name: str, exc: Exception) -> None:
        self._counters.add("fuse_errors_readdir")
        key = f"readdir {name!r}"
        if self._log_once.first(key):
            log.error("%s: left out of its directory's listing: %s: %s", key, type(exc).__name__, exc)

    def _names_changed(self, *dirs: int) -> None:
        """A name changed through the mount in each of ``dirs`` (directory inodes)."""
        self._names += 1
        if len(self._names_at) >= DIRS_CHANGED:
            self._names_at.clear()
            self._names_floor = self._names
        for d in dirs:
            self._names_at[d] = self._names

    def _names_changed_since(self, snap: _DirSnapshot) -> bool:
        """Whether a name of the snapshot's directory changed through the mount since."""
        return self._names_at.get(snap.dots[0][1], self._names_floor) > snap.names

    async def releasedir(self, fh: int) -> None:
        self._dir_handles.pop(fh, None)
        self._dirs_read.discard(fh)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """fsync() of a directory: its names durable where the store keeps them on a disk.
        pyfuse3's ENOSYS had the kernel answer 0 to every one from then on, and a rename
        made durable by write, fsync, rename, fsync of the directory was not (a helper's
        audit)."""
        self._counters.add("fuse_ops_fsyncdir")
        snap = self._dir_handles.get(fh)
        if snap is None:
            return
        inode = snap.dots[0][1]
        node = await self._live(inode)
        await self._call(lambda: f"fsyncdir {self._inodes.path(inode)}", node.sync())

    # -- files ---------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx) -> pyfuse3.FileInfo:  # type: ignore[override]
        self._counters.add("fuse_ops_open")
        node = await self._live(inode)
        if not isinstance(node, FileNode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if self._changing:
            await self._changed(self._inodes.parent_of[inode - ROOT], self._inodes.name_at[inode - ROOT])
        kept = None
        if not self._inodes.bound(inode):
            # its name was removed or replaced through the mount after the kernel looked it
            # up. A file renamed over was kept open, where that can be: every open reads
            # it, as on a local file system (each its own descriptor, what is kept staying
            # until the kernel forgets the inode: a second reader that found it, or an
            # O_PATH descriptor reopened). Else, and for writing, ESTALE makes the kernel
            # look the path up again and open what is there now
            kept = self._kept.get(inode)
            kept = kept.again() if kept is not None and not _writes(flags) else None
            if kept is None:
                raise pyfuse3.FUSEError(errno.ESTALE)
        handle = None
        if _writes(flags):
            if not node.writable:
                raise pyfuse3.FUSEError(errno.EROFS)
            truncate = bool(flags & os.O_TRUNC)
            handle = await self._call(lambda: f"open {self._inodes.path(inode)}", node.open_write(truncate))
            handle.appending = bool(flags & os.O_APPEND)
            keep = self._keep_pages(inode, node)
        else:
            named = node
            if kept is None:
                node.opened()
                node = await self._call(lambda: f"open {self._inodes.path(inode)}", node.reader())
            else:
                node = kept
            # after reader(): the pages kept are those of the content this open reads
            before = self._page_epochs.get(inode)
            keep = self._keep_pages(inode, node)
        fh = next(self._next_fh)
        self._opened(fh, inode, node, handle)
        # a reader whose bytes are not what the kernel knows of the inode (the key was
        # replaced since the kernel's lookup, or since an earlier open whose pages another
        # reader may still be filling) reads past the kernel's cache and size: uncut,
        # unpadded, unmixed. Not a decoded view of another version: its readers read each
        # chunk as it is when a read reaches it, one of older metadata is refused (ESTALE),
        # and this open drops the pages it finds (keep is False); direct_io failed its mmap
        # with ENODEV (np.memmap of data.raw beside a writer: 16 to 29 opens a second; the
        # first open after a change behind the mount)
        direct = node.direct_io or (handle is not None and handle.direct_io)
        if handle is None and not direct:
            direct = node.size != self._inodes.told[inode - ROOT] or (
                before is not None and not keep and before[0] != node.version()
                and not self._inodes.derived[inode - ROOT])
            if direct and kept is None and self._open_count[inode] == 1 and named.learn(node):
                # no other open of it, whose reads could fill pages with the old bytes after
                # this open drops them: the kernel drops its attributes (no page lock taken,
                # so safe before the reply) and asks the size again, and the pages go at this
                # open; reads go through the page cache, and mmap works
                with contextlib.suppress(OSError):  # the kernel forgot it already
                    pyfuse3.invalidate_inode(inode, attr_only=True)
                direct = keep = False
        keep = keep and not direct
        if keep:
            self._counters.add("fuse_opens_cached")
            if handle is None and before is None and self._open_count[inode] == 1:
                self._push(inode, node)  # the kernel has no pages of it yet
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep, direct_io=direct)

    def _keep_pages(self, inode: int, node: FileNode) -> bool:
        """keep_cache for this open; False makes the kernel drop the file's cached pages."""
        if node.direct_io:
            return False
        version, now = node.version(), time.monotonic()
        epoch = self._page_epochs.get(inode)
        if node.immutable:
            # its bytes never change, but the node under this number may be another's (a
            # view built again from metadata read anew): the pages are kept only for the same
            self._page_epochs[inode] = (version, now)
            return epoch is None or epoch[0] == version
        if version is None:
            return False
        if epoch is None and self._inodes.bound(inode) and not self._inodes.derived[inode - ROOT]:
            # the kernel has no pages of it: what it holds came through an open, and every
            # open sets an epoch, dropped only once the kernel forgets the inode or its name
            self._page_epochs[inode] = (version, now)
            return True
        if epoch is not None and epoch[0] == version:
            if node.validated:  # checked against the source at this open: current however old
                self._page_epochs[inode] = (version, now)
                return True
            if now - epoch[1] < self.ttl:
                return True
        self._page_epochs[inode] = (version, now)
        return False

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        self._counters.add("fuse_ops_read")
        f = self._files.get(fh)
        if f is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        source = f.handle if f.handle is not None else f.node
        # the worker threads this read takes count as its file's (current_flow): a file whose
        # reads the store stalls cannot hold them all while other files wait
        flow = current_flow.set(f.ino)
        try:
            data = await self._call(lambda: f"read {self._inodes.path(f.ino)}", source.read(off, size))
        except pyfuse3.FUSEError as exc:
            if exc.errno == errno.ESTALE:
                self._read_stale(f.ino)
            elif exc.errno == errno.EIO:
                self._drop_pages(f.ino)
            raise
        finally:
            current_flow.reset(flow)
        self._counters.add("fuse_read_requests")
        self._counters.add("fuse_read_bytes", data.nbytes if isinstance(data, memoryview) else len(data))
        return data  # any contiguous buffer: pyfuse3 replies from it without a copy

    def _push(self, inode: int, node: FileNode) -> None:
        """The whole of ``node`` into the kernel's pages of ``inode``, if the node has it in
        memory: this open's reads are then answered by the kernel (see zvfs.fs.push). Only
        for the one open of the file, with its pages kept: see there why."""
        if self.pages is None or node.size > PUSH_MAX:
            return
        data = node.resident()
        if data is not None and self.pages.push(inode, data):
            self._counters.add("fuse_opens_pushed")

    def _opened(self, fh: int, ino: int, node: FileNode, handle: FileHandle | None) -> None:
        """``fh`` is an open of ``ino`` reading ``node``, writing through ``handle`` if set."""
        self._files[fh] = f = _Open(ino, node, handle)
        self._open_count[f.ino] = self._open_count.get(f.ino, 0) + 1
        if f.handle is not None:
            self._writing.setdefault(f.ino, []).append(f.handle)

    async def release(self, fh: int) -> None:
        f = self._files.pop(fh, None)
        if f is None:
            return
        n = self._open_count.pop(f.ino, 1) - 1
        if n:
            self._open_count[f.ino] = n
        if f.handle is None:
            f.node.released()
        else:
            writing = self._writing.get(f.ino, [])
            if f.handle in writing:
                writing.remove(f.handle)
            if not writing:
                self._writing.pop(f.ino, None)
            try:
                await self._call(lambda: f"release {self._inodes.path(f.ino)}", f.handle.release())
            except pyfuse3.FUSEError:
                pass  # logged; release has no one to tell

    async def release_all(self) -> None:
        """At shutdown (a signal, with files still open): release every handle as the kernel
        would, so a write never closed gives up its upload and says where its bytes are kept.
        Cancelled (the store does not answer), the handles not yet released are abandoned:
        their bytes are kept and named at once."""
        handles = [f.handle for f in self._files.values() if f.handle is not None]
        try:
            for fh in list(self._files):
                try:
                    await self.release(fh)
                except pyfuse3.FUSEError:
                    pass  # logged; the next handle is released all the same
        except trio.Cancelled:
            for handle in handles:
                handle.abandon()
            raise

    async def access(self, inode: int, mode: int, ctx) -> bool:  # type: ignore[override]
        return not (mode & os.W_OK) or self._node(inode).writable

    async def statfs(self, ctx) -> pyfuse3.StatvfsData:  # type: ignore[override]
        """df: size = what the store holds + free space where it lives; used = the store."""
        self._counters.add("fuse_ops_statfs")
        used, free = await self._call("statfs /", self._usage()) if self._usage else (0, None)
        s = pyfuse3.StatvfsData()
        s.f_bsize = 1 << 20  # the preferred I/O size
        s.f_frsize = STATFS_BLOCK
        if free is None:  # S3: no bound but staging's, which ENOSPC reports
            free = _UNBOUNDED_FREE if self._root.writable else 0
        s.f_bfree = s.f_bavail = min(free // STATFS_BLOCK, _MAX_BLOCKS)
        # at least one block even when empty: df leaves out file systems of size 0; at most
        # what the reply holds (sizes a hostile zip declares may add up past it)
        s.f_blocks = min(max(1, -(-used // STATFS_BLOCK) + s.f_bfree), _MAX_BLOCKS)
        # inodes as blocks: total = in use (the table) + free, so df -i's IUsed is the table
        s.f_ffree = s.f_favail = (1 << 32) if self._root.writable else 0
        s.f_files = len(self._inodes.node_at) + s.f_ffree
        s.f_namemax = NAME_MAX
        return s

    # getxattr/listxattr are left to pyfuse3's ENOSYS on purpose: the kernel then stops
    # asking, where ENODATA would cost `ls -l` two daemon round trips per file

    # -- the names a write changes, and what the kernel keeps of them ---------

    def _read_stale(self, ino: int) -> None:
        """A read found what the file's node stands for changed behind the mount (an S3
        object replaced since the open): its line says to open it again, but the kernel's
        entry and this table's node kept the old version for the TTL, so every new open read
        ESTALE too. The node is looked up again (the view has let its listing go) and the
        kernel forgets what it keeps of the name."""
        i = ino - ROOT
        if 0 <= i < len(self._inodes.name_at) and self._inodes.name_at[i] and ino != ROOT:
            self._forget_in_kernel((self._inodes.parent_of[i], self._inodes.name_at[i]))

    def _drop_pages(self, ino: int) -> None:
        """A read of ``ino`` failed EIO: its next open has the kernel drop the pages it holds
        of it (no keep_cache: a page epoch no node's version equals), so no new open reads
        bytes served before the failure was found (a zip member's CRC is known only once
        all of it was read: `cat` failed, and `head` then read the corrupt bytes from the
        page cache). Not the pages at once, in a thread after the reply: under load that
        upset the reads around it (a test of batched zip member reads failed 5 runs in 8
        with it, none without; not explained further)."""
        self._page_epochs[ino] = (_READ_FAILED, time.monotonic())

    def _forget_in_kernel(self, *names: tuple[int, str]) -> None:
        """A rename that failed may have changed what its names hold all the same (S3
        copies, then deletes, key by key), and an O_EXCL create refused at close() names
        another client's object (see _storing): the kernel forgets the entries and attributes it
        keeps of them, and their numbers are looked up again (see _fresh), so the next stat
        shows what the store holds rather than the old size for the TTL. The attributes
        before the reply (that takes no lock the rename holds, and the application's next
        stat must see it); the entries, with what the kernel keeps below them, in the
        background: the kernel holds their directories locked until the reply."""
        for parent, name in names:
            ino = self._inodes.find(parent, name)
            if ino is not None and self._inodes.lookups[ino - ROOT] > 0:
                self._stale.add(ino)
                with contextlib.suppress(OSError):  # the kernel forgot it already
                    pyfuse3.invalidate_inode(ino, attr_only=True)
        entries = [(parent, os.fsencode(name)) for parent, name in names]

        async def drop_entries() -> None:
            try:
                await run_abandonable(invalidate, [], entries)
            except Exception as exc:  # noqa: BLE001 - a system task's error would end the mount
                log.debug("dropping the kernel's entries after a failed rename: %s", exc)

        trio.lowlevel.spawn_system_task(drop_entries)

    async def _fresh(self, ino: int) -> Node:
        """``ino``'s node; a derived one made before a write is looked up again from its
        (fresh) parent. The kernel keeps an entry of ``.zvfs/`` in use (a file open under it,
        a shell's cwd, an entry it revives) across the invalidation that follows a write, and
        its number kept the old views' node: stat showed the old shape for the TTL, a deleted
        array still read, and a changed dtype read its new chunks as the old one."""
        if ino not in self._stale:
            return self._node(ino)
        i = ino - ROOT
        node = await _named_in(await self._fresh(self._inodes.parent_of[i]), self._inodes.name_at[i])
        self._stale.discard(ino)
        if self._inodes.lookups[i] > 0:
            self._inodes.node_at[i] = node  # None: gone from the views, ENOENT from now on
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    async def _changed(self, parent: int, name: str) -> None:
        """Return once no rename or removal of ``name`` under ``parent`` is under way."""
        while (changing := self._changing.get((parent, name))) is not None:
            await changing.wait()

    def _unbind(self, parent: int, name: str) -> None:
        """The entry ``name`` is gone or replaced: a new one there gets a new inode number."""
        ino = self._inodes.pop(parent, name)
        if ino is not None:
            self._page_epochs.pop(ino, None)
            node = self._inodes.node_at[ino - ROOT]
            if node is not None:
                node.detach()
            self._detach(ino)

    # -- keeping the kernel's caches of derived files true (zvfs.fs.derived) --

    def changed(self) -> None:
        """A write through the mount changed the store: the kernel's caches of the derived
        files are dropped soon, once per burst of writes, if it holds any."""
        if 1 in self._inodes.derived:
            self._derived.changed()

    def _derived_targets(self) -> Targets:
        """What one pass drops: the pages and attributes of every derived inode the kernel
        holds, and the entries of the tops of the views. The tops resolve the current views
        themselves; the nodes below them are of the views before the write, and the kernel
        may keep using their numbers (an open file, a cwd, an entry it revives): each is
        looked up again (_fresh)."""
        derived, lookups = self._inodes.derived, self._inodes.lookups
        inodes = [i + ROOT for i in itertools.compress(range(len(derived)), derived) if lookups[i]]
        tops = [i for i in inodes if self._view_top(i)]
        below = set(inodes).difference(tops)
        self._stale.update(below)
        for ino in inodes:
            self._page_epochs.pop(ino, None)
        # and the entries of the open ones below the tops: dropping a top's entry does not
        # drop an entry in use, and the kernel takes the old top back (a directory has one
        # entry) with the open file's name under it, which then stat'ed as there after the
        # write had removed it (a chunk of an array made again with another grid)
        held = [i for i in below if i in self._open_count]
        return inodes, [(self._parent(i), os.fsencode(self._inodes.name_at[i - ROOT])) for i in tops + held]


#: names a listing goes through between two chances for the mount's other requests
LISTING_SLICE = 2048
#: entries one readdir reply fills between two such chances (each costs more than a name)
READDIR_SLICE = LISTING_SLICE // 4
#: directories whose last name change through the mount is remembered (a readdir from 0 of
#: a handle opened before it lists again); past that, every one counts as changed
DIRS_CHANGED = 1024


def _names_of(entries: Sequence[tuple[str, Node]]) -> Sequence[str]:
    """The names of a directory's ``entries``, read in place (bisect reads them)."""
    return entries.names if isinstance(entries, LazyEntries) else _Names(entries)


class _Names(Sequence[str]):
    """The names of a list of (name, node) entries, as a sequence (bisect reads it)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Sequence[tuple[str, Node]]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        return self._entries[i][0]


#: the most blocks statfs tells: their bytes fit in a signed 64-bit count (its fields are
#: unsigned, but programs multiply them by the block size in signed arithmetic)
_MAX_BLOCKS = ((1 << 63) - 1) // STATFS_BLOCK

def _op(what: str | Callable[[], str]) -> str:
    """The operation a ``what`` names ('lookup' of 'lookup /a/b')."""
    return (what() if callable(what) else what).split(" ", 1)[0]


def _guarded(fn: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    """``fn``, a request handler, letting out no exception but FUSEError: pyfuse3 ends its
    main loop on any other, and the mount with it. What the handlers do not map themselves
    (a bug, or hostile data reaching code that does not expect it) becomes EIO for that
    one request, logged once per handler and kind of error."""
    name = fn.__name__

    writes = name in _WRITE_OPS

    @functools.wraps(fn)
    async def guarded(self: ZvfsOperations, *args: object, **kwargs: object) -> object:
        flow = current_flow.set(WRITES_FLOW) if writes else None
        try:
            return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:  # noqa: BLE001 - see above
            self._counters.add(f"fuse_errors_{name}")
            self._counters.note_error(f"{name}: {type(exc).__name__}: {exc}")
            if self._log_once.first(f"{name} {type(exc).__name__}"):
                log.error("%s: %s: %s (this request fails with EIO; the mount goes on)",
                          name, type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            if name in _UNANSWERED:
                return None  # pyfuse3 awaits it bare: even a FUSEError would end its loop
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if flow is not None:
                current_flow.reset(flow)

    return guarded


#: requests the kernel expects no answer to: pyfuse3 awaits their handler with no
#: ``except FUSEError`` around it
_UNANSWERED = frozenset({"forget"})

#: requests whose store calls (uploads, parts, a rewrite's fetch) count as one flow of the
#: worker threads (see workers.current_flow): whatever the number of files written, they
#: leave threads for reads. Uploads the server stalled held all 16, and a read of another
#: file waited 117 s behind them
_WRITE_OPS = frozenset({"write", "flush", "fsync", "release", "create", "mknod", "setattr"})
WRITES_FLOW = "writes"


for _cls in (WritingOperations, ZvfsOperations):  # the handlers zvfs defines, wherever
    for _name, _fn in list(vars(_cls).items()):
        if hasattr(pyfuse3.Operations, _name) and inspect.iscoroutinefunction(_fn):
            setattr(ZvfsOperations, _name, _guarded(_fn))
