"""The inode table: every number the mount has dealt out, and the name it stands for.

The kernel names a file by its inode number; the mount gives one per (parent, name) the
first time the name is looked up or listed, and keeps it while the name is bound, so a
``stat`` twice gives one ``st_ino``. The table is compact, for stores of millions of keys:
per-number facts are arrays indexed by ``ino - ROOT`` (a parent, a name, the node the
kernel knows it by, its lookup count, the size last told), and a directory's listing is
numbered as one *run* of consecutive numbers over its sorted names (the listing's own list
of strings, searched by bisection). Names bound one at a time (a lookup, a create, a
rename) are kept in a dict per parent.

A number whose name was removed or replaced is freed once nothing holds it (that policy is
:class:`zvfs.fs.operations.ZvfsOperations`'s), then dealt out again with its generation
bumped, so that (number, generation) names one file for ever; a number freed while a
directory handle is open waits in quarantine until that handle is closed, as its snapshot
may still list the number. Which names lie below a *derived* prefix (the decoded views,
whose kernel caches a write drops) is kept here too, a byte a number.

Everything here runs on the trio thread, and nothing awaits.
"""

from __future__ import annotations

import itertools
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence

from zvfs.fs.fuse import pyfuse3
from zvfs.views.node import DirNode, Node

ROOT = pyfuse3.ROOT_INODE


class InodeTable:
    """The numbers of one mount. ``derived``: the path prefixes of the derived views
    ('/.zvfs/'); ``oldest_listing`` gives the oldest open directory handle (or the next one
    to be dealt out when none is open), for the quarantine of freed numbers."""

    def __init__(self, root: DirNode, derived: Sequence[str],
                 oldest_listing: Callable[[], int]) -> None:
        self._oldest_listing = oldest_listing
        #: the name each number was given under, and its parent: kept after an unbind, so an
        #: open of a removed name is told ESTALE
        self.parent_of = array("I", [0])  # 4 bytes: past 2**32 inodes the mount fails EIO
        self.name_at: list[str] = [""]
        #: the node the kernel knows the number by (None once it forgets it)
        self.node_at: list[Node | None] = [root]
        #: the kernel's lookup count
        self.lookups = array("q", [0])
        #: the size the kernel knows (our last answer, or what was written through it); -1: none
        self.told = array("q", [-1])
        # the live bindings (parent, name) -> inode. Most are made by an opendir, which
        # numbers the names it meets first in sorted order: one run per directory, a list of
        # names (8 bytes a name) searched by bisection; the others one by one in a dict
        #: parent inode -> runs (first inode, sorted names): names[i] is inode first + i ...
        self.runs: dict[int, list[tuple[int, list[str]]]] = {}
        #: ... unless removed or replaced since (through the mount, or behind it: see
        #: ZvfsOperations._drop_gone)
        self.unbound: set[int] = set()
        #: parent inode -> how many slots of its runs are in ``unbound``: past half, the runs
        #: are let go (see compact)
        self.dead_in: dict[int, int] = {}
        #: parent inode -> name -> inode: the bindings made one at a time
        self.ino_of: dict[int, dict[str, int]] = {}
        #: parent inode -> names bound under it that its last listing did not have and that
        #: kept their numbers (the kernel held them, or a lookup finds them: '.zvfs')
        self.unlisted_kept: dict[int, int] = {}
        #: numbers of names a listing no longer had while the kernel held them: unbound
        #: when it forgets them
        self.gone_held: set[int] = set()
        #: names unbound (removed, replaced or renamed) through the mount so far: a directory
        #: snapshot taken before the last one checks its entries against the table
        self.unbinds = 0
        #: numbers to deal out again: unbound through the mount, then forgotten by the kernel
        self.free: list[int] = []
        #: (last handle dealt out then, number) freed while directory handles were open: dealt
        #: out again once those handles are closed (their snapshots may still list the number)
        self.quarantine: deque[tuple[int, int]] = deque()
        #: number -> times it was dealt out again: its generation, so that (number,
        #: generation) names one file for ever, as NFS export asks
        self.generation: dict[int, int] = {}
        self.derived_prefixes = tuple(derived)
        #: a byte a number, 1 where it is of a derived file or directory (below a derived
        #: prefix): a set of them cost 74 bytes a chunk file a listing told the kernel of
        self.derived = bytearray(1)
        #: directories whose path leads to a derived prefix (the root, '/.zvfs')
        self.toward_derived: set[int] = {ROOT} if self.derived_prefixes else set()

    def in_use(self) -> int:
        """Numbers the table holds, less those freed to be dealt out again (stats.json's
        ``inodes``): read from any thread, as a len() is."""
        return len(self.node_at) - len(self.free) - len(self.quarantine)

    def known(self, ino: int) -> Node | None:
        """The node of ``ino`` while the kernel knows it, else None."""
        i = ino - ROOT
        return self.node_at[i] if 0 <= i < len(self.node_at) else None

    def find(self, parent: int, name: str) -> int | None:
        """The inode bound to ``name`` under ``parent``, or None."""
        names = self.ino_of.get(parent)
        if names:
            ino = names.get(name)
            if ino is not None:
                return ino
        for first, run in self.runs.get(parent, ()):
            i = bisect_left(run, name)
            if i < len(run) and run[i] == name and first + i not in self.unbound:
                return first + i
        return None

    def bind(self, parent: int, name: str, ino: int) -> None:
        """Bind ``name`` under ``parent`` to ``ino`` on its own, not in a run (a lookup, a
        create or a rename met it)."""
        self.ino_of.setdefault(parent, {})[name] = ino

    def pop(self, parent: int, name: str) -> int | None:
        """Unbind ``name`` under ``parent``: its inode, or None if it had none."""
        self.unbinds += 1
        names = self.ino_of.get(parent)
        ino = names.pop(name, None) if names else None
        if ino is None:
            ino = self.find(parent, name)
            if ino is None:
                return None
            self.unbound.add(ino)  # a slot of a run
            self.dead_in[parent] = dead = self.dead_in.get(parent, 0) + 1
            if dead * 2 >= sum(len(run) for _, run in self.runs[parent]):
                self.compact(parent)
        return self.unbound_now(parent, ino)

    def unbound_now(self, parent: int, ino: int) -> int:
        """``ino``, just unbound from under ``parent``: no longer one of its kept unlisted names."""
        if ino in self.gone_held:
            self.gone_held.discard(ino)
            kept = self.unlisted_kept.get(parent, 0) - 1
            if kept > 0:
                self.unlisted_kept[parent] = kept
            else:
                self.unlisted_kept.pop(parent, None)
        return ino

    def compact(self, parent: int) -> None:
        """Let go of ``parent``'s runs, at least half of whose slots are dead (their names
        removed or replaced): the names still bound in them are bound one by one instead.
        A store whose keys come and go behind the mount (a bucket with new keys daily and
        old ones deleted) gave each listing's new names a run, held for the mount's life."""
        bound = self.ino_of.setdefault(parent, {})
        for first, run in self.runs.pop(parent, ()):
            for ino, name in enumerate(run, first):
                if ino in self.unbound:
                    self.unbound.discard(ino)
                else:
                    bound[name] = ino
        self.dead_in.pop(parent, None)

    def bound_children(self, parent: int) -> list[int]:
        """The inodes bound under ``parent``."""
        inos = list(self.ino_of.get(parent, {}).values())
        for first, run in self.runs.get(parent, ()):
            inos.extend(i for i in range(first, first + len(run)) if i not in self.unbound)
        return inos

    def new(self, parent: int, name: str, node: Node | None, fresh: bool = False) -> int:
        """An inode number for ``name`` under ``parent`` (not bound here: the caller does):
        a freed one if there is one, unless ``fresh`` (a run's numbers follow each other)."""
        ino = 0 if fresh else self.reusable()
        if ino:
            i = ino - ROOT
            self.parent_of[i], self.name_at[i], self.node_at[i] = parent, name, node
            self.generation[ino] = self.generation.get(ino, 0) + 1
        else:
            ino = ROOT + len(self.node_at)
            self.parent_of.append(parent)
            self.name_at.append(name)
            self.node_at.append(node)
            self.lookups.append(0)
            self.told.append(-1)
            self.derived.append(0)
        if self.derived[parent - ROOT]:
            self.derived[ino - ROOT] = 1
        elif parent in self.toward_derived:
            self.mark_derived(parent, name, ino)
        return ino

    def mark_derived(self, parent: int, name: str, ino: int) -> None:
        """Mark ``ino`` (``name`` under ``parent``) derived, or on the way to a derived prefix."""
        path = self.child_path(parent, name)
        if path.startswith(self.derived_prefixes):
            self.derived[ino - ROOT] = 1
        elif any(p.startswith(path + "/") for p in self.derived_prefixes):
            self.toward_derived.add(ino)

    def new_run(self, parent: int, names: list[str]) -> int:
        """Numbers for ``names`` (sorted, none bound under ``parent``), one run: the first."""
        first = ROOT + len(self.node_at)
        n = len(names)
        self.parent_of.extend(array("I", [parent]) * n)
        self.name_at.extend(names)
        self.node_at.extend(itertools.repeat(None, n))
        self.lookups.extend(array("q", [0]) * n)
        self.told.extend(array("q", [-1]) * n)
        derived = self.derived[parent - ROOT]
        self.derived.extend(bytes([derived]) * n)
        if not derived and parent in self.toward_derived:
            for ino, name in enumerate(names, first):
                self.mark_derived(parent, name, ino)
        self.runs.setdefault(parent, []).append((first, names))
        return first

    def release(self, ino: int, quarantine_until: int | None) -> list[int]:
        """Free ``ino``: no name, no node, and dealt out again later, once no directory
        handle up to ``quarantine_until`` is open (None: none is open now, so at once). Its
        bindings go with it: the numbers that were bound below it are returned, for the
        caller to free those still named there (:meth:`still_below`)."""
        i = ino - ROOT
        below = list(self.ino_of.pop(ino, {}).values())
        self.dead_in.pop(ino, None)
        self.unlisted_kept.pop(ino, None)
        self.gone_held.discard(ino)
        for first, run in self.runs.pop(ino, ()):
            for child in range(first, first + len(run)):
                if child in self.unbound:
                    self.unbound.discard(child)  # no run names it now
                else:
                    below.append(child)
        self.node_at[i] = None
        self.name_at[i] = ""  # no name is empty: this marks it freed (and lets go of the name)
        self.told[i] = -1
        self.derived[i] = 0
        self.toward_derived.discard(ino)
        if quarantine_until is not None:
            self.quarantine.append((quarantine_until, ino))
        else:
            self.free.append(ino)
        return below

    def still_below(self, child: int, parent: int) -> bool:
        """Whether ``child`` still has a name under ``parent`` (it was not freed meanwhile)."""
        return self.parent_of[child - ROOT] == parent and bool(self.name_at[child - ROOT])

    def release_quarantine(self) -> None:
        """Free the quarantined numbers that no open directory handle can list any more."""
        if self.quarantine:
            oldest = self._oldest_listing()
            while self.quarantine and self.quarantine[0][0] < oldest:
                self.free.append(self.quarantine.popleft()[1])

    def reusable(self) -> int:
        """A freed number no open directory handle can list, or 0."""
        self.release_quarantine()
        return self.free.pop() if self.free else 0

    def still_named(self, ino: int, parent: int, name: str) -> bool:
        """``ino`` is still ``name`` under ``parent`` (not removed, replaced or renamed)."""
        i = ino - ROOT
        return self.parent_of[i] == parent and self.name_at[i] == name and self.bound(ino)

    def path(self, ino: int) -> str:
        """The path ``ino`` was last bound to (for log lines): walked up its parents."""
        parts = []
        while ino != ROOT and 0 < ino - ROOT < len(self.name_at):
            parts.append(self.name_at[ino - ROOT])
            ino = self.parent_of[ino - ROOT]
        return "/" + "/".join(reversed(parts))

    def bound(self, ino: int) -> bool:
        """True while ``ino``'s name still names it (not removed or replaced through the mount)."""
        i = ino - ROOT
        if not 0 < i < len(self.name_at):
            return False
        return self.find(self.parent_of[i], self.name_at[i]) == ino

    def child_path(self, parent: int, name: str) -> str:
        """The path ``name`` under ``parent`` has."""
        return self.path(parent).rstrip("/") + "/" + name
