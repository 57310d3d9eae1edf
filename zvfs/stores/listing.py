"""One level of a store's key hierarchy, kept small for stores of millions of keys.

A listing lives as long as the mount caches it, and every file the kernel knows
points into one; at a million keys a dict of small objects per key (a KeyInfo,
its float, the dict's own slot) came to more than the rest of the daemon. So a
:class:`KeyTable` keeps a directory's keys in sorted parallel arrays, about 24
bytes a key plus its name (16 more for an S3 ETag), and makes a KeyInfo only
when one is asked for.

The arrays are filled while the listing is built (the stores only add), sorted
once on the first read, and never changed after: a later set or delete (a write
through the mount) goes to a small overlay. So a file node can keep the table and
its own name instead of a KeyInfo of its own (see :meth:`KeyTable.source`), and
still reads the entry it was made from when the key is replaced or removed later,
as it would with its own copy.
"""

from __future__ import annotations

import heapq
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from zvfs.stores.keys import safe_name

#: the largest size a key can have here: st_size is a signed 64-bit number, and so is a
#: KeyTable's column of sizes (a store drops a key past it, with a line naming it)
MAX_FILE_SIZE = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """Size and modification time of one key; the mtime in whole nanoseconds since the
    epoch, as the kernel keeps it (seconds in a float lose the last digits: a copy through
    the mount would not carry the store's time). ``version`` names the content where the
    store has such a name (S3's ETag)."""

    size: int
    mtime_ns: int
    version: str | None = None


#: one table is sealed at a time (rarely more than one thread reads a fresh listing at once)
_SEAL_LOCK = threading.Lock()

#: an S3 ETag of a single-part upload: its MD5 in hex, quoted; kept as its 16 bytes
_ETAG_LEN = 34
_HEX = frozenset("0123456789abcdef")


def _compact_etag(version: str) -> bytes | None:
    if len(version) == _ETAG_LEN and version[0] == version[-1] == '"' and _HEX.issuperset(version[1:-1]):
        return bytes.fromhex(version[1:-1])
    return None


class KeyTable(MutableMapping[str, KeyInfo]):
    """name -> :class:`KeyInfo` for one directory level, as a dict would be, in arrays.

    Iteration is in sorted name order. Lookups bisect the sorted names.
    """

    __slots__ = ("_names", "_sizes", "_mtimes", "_versions", "_building", "_in_order", "_over", "_dead",
                 "_memo", "_unsafe")

    def __init__(self, items: Mapping[str, KeyInfo] | Iterable[tuple[str, KeyInfo]] = ()) -> None:
        self._names: list[str] = []
        self._sizes = array("q")
        self._mtimes = array("q")
        #: None while every version is None; bytes of 16-byte digests while every one is a
        #: plain ETag (None never mixed in); else one entry per key
        self._versions: bytearray | list[str | None] | None = None
        #: still being filled: sets append (the stores only add while they list)
        self._building = True
        self._in_order = True
        #: sets and deletes once built: name -> new info, and names of the arrays now gone
        #: (never both: a set takes a name out of _dead)
        self._over: dict[str, KeyInfo] = {}
        self._dead: set[str] = set()
        self._memo: tuple[str, int] | None = None
        #: the sorted indices of the arrays' names that cannot be a path segment, once sought
        self._unsafe: list[int] | None = None
        self.update(items)

    # -- building ------------------------------------------------------------------------

    def add(self, name: str, size: int, mtime_ns: int, version: str | None = None) -> None:
        """While the table is built: one key more, without a KeyInfo made for it (a zip of
        a million members adds a million)."""
        names = self._names
        if names and name <= names[-1]:  # out of order, or a name again: the seal sorts it out
            self._in_order = False
        names.append(name)
        self._sizes.append(size)
        self._mtimes.append(mtime_ns)
        self._add_version(version)

    def _add_version(self, version: str | None) -> None:
        """The version of the key just appended (the arrays' last)."""
        vs, held = self._versions, len(self._names) - 1
        digest = None if version is None else _compact_etag(version)
        if vs is None:
            if version is None:
                return
            if held == 0 and digest is not None:
                self._versions = bytearray(digest)
                return
            vs = self._versions = [None] * held
        elif isinstance(vs, bytearray):
            if digest is not None:
                vs += digest
                return
            vs = self._versions = [self._version_at(j) for j in range(held)]
        vs.append(version)

    def _version_at(self, i: int) -> str | None:
        vs = self._versions
        if vs is None:
            return None
        if isinstance(vs, bytearray):
            return '"' + vs[16 * i : 16 * i + 16].hex() + '"'
        return vs[i]

    def seal(self) -> None:
        """Sort now, where it costs nothing to wait (a zip store's open, in a worker),
        rather than at the first read, which may be on the trio thread."""
        self._seal()

    def _seal(self) -> None:
        """Built: sorted by name, the last of equal names winning (a zip's duplicate members).

        The first read seals, from whichever thread makes it (the raw tree's on the trio
        thread, df's count in a worker): one sorts, the others wait for it, and none sees
        the arrays before they are whole."""
        if not self._building:  # sealed long ago: no lock to take
            return
        with _SEAL_LOCK:
            if not self._building:
                return
            if not self._in_order:
                names, n = self._names, len(self._names)
                order = sorted(range(n), key=names.__getitem__)  # stable: equal names keep order
                keep = [i for k, i in enumerate(order) if k + 1 == n or names[order[k + 1]] != names[i]]
                self._names = [names[i] for i in keep]
                self._sizes = array("q", [self._sizes[i] for i in keep])
                self._mtimes = array("q", [self._mtimes[i] for i in keep])
                vs = self._versions
                if isinstance(vs, bytearray):
                    self._versions = bytearray(b"".join(vs[16 * i:16 * i + 16] for i in keep))
                elif vs is not None:
                    self._versions = [vs[i] for i in keep]
                self._in_order = True
            self._building = False

    def _index(self, name: str) -> int:
        """Where ``name`` is in the arrays, or -1 (the arrays' entry, dead or not).

        The last name found is remembered: the same name again (a getattr asks a node's
        size, then its mtime) or the one after it (a walk lists a directory in order, then
        answers for each of its files in order) is found without a search."""
        self._seal()
        names = self._names
        memo = self._memo
        if memo is not None:
            last, i = memo
            if last is name:
                return i
            i += 1
            if i < len(names) and names[i] == name:
                self._memo = (names[i], i)  # one tuple: a reader in another thread sees both or neither
                return i
        i = bisect_left(names, name)
        if i < len(names) and names[i] == name:
            self._memo = (names[i], i)
            return i
        return -1

    def position(self, name: str) -> int:
        """Where ``name`` is in the sealed arrays (-1 if it is not), for a store that keeps
        more of each key in arrays of its own, in this order (a zip's members)."""
        return self._index(name)

    def _at(self, i: int) -> KeyInfo:
        return KeyInfo(self._sizes[i], self._mtimes[i], self._version_at(i))

    def _made_index(self, name: str) -> int:
        """:meth:`_index` of a name that must be there."""
        i = self._index(name)
        if i < 0:
            raise KeyError(name)
        return i

    # -- for the nodes that point into it -------------------------------------------------

    def source(self, name: str) -> KeyTable | KeyInfo:
        """What a file node keeps for ``name`` instead of a KeyInfo of its own: this table
        (read back with :meth:`made_from`) when the entry is in the arrays, else the KeyInfo
        of the later set. Raises KeyError if there is no such key."""
        info = self._over.get(name)
        if info is not None:
            return info
        if name in self._dead or self._index(name) < 0:
            raise KeyError(name)
        return self

    def made_from(self, name: str) -> KeyInfo:
        """The entry of the arrays for ``name``, even when it was replaced or removed since."""
        return self._at(self._made_index(name))

    def made_size_and_mtime_ns(self, name: str) -> tuple[int, int]:
        """``made_from(name)``'s size and mtime, without making a KeyInfo."""
        i = self._made_index(name)  # first: it may sort the arrays
        return self._sizes[i], self._mtimes[i]

    def made_size(self, name: str) -> int:
        return self.made_size_and_mtime_ns(name)[0]

    def total_size(self) -> int:
        """The sum of every key's size (df's figure), without a KeyInfo per key."""
        self._seal()
        total = sum(self._sizes)
        for name in self._dead:
            total -= self._sizes[self._index(name)]
        for name, info in self._over.items():  # a new key, or one replaced (never one dead)
            i = self._index(name)
            total += info.size - (self._sizes[i] if i >= 0 else 0)
        return total

    def copy(self) -> KeyTable:
        """A table of its own for later sets and deletes; the sealed arrays, which never
        change, are shared (a zip's listing is handed out once per list_dir)."""
        self._seal()
        out = KeyTable()
        out._names, out._sizes, out._mtimes, out._versions = (
            self._names, self._sizes, self._mtimes, self._versions)
        out._building = False
        out._over, out._dead = dict(self._over), set(self._dead)
        out._unsafe = self._unsafe
        return out

    def parts(self) -> tuple[list[str], list[int], list[str]]:
        """The table as its sealed names (sorted, shared: never changed) and what changed
        since: the sorted indices of the names removed, and the names added that the arrays
        lack, sorted (a name set again keeps its place in the arrays)."""
        self._seal()
        index = self._index
        removed = sorted(index(name) for name in self._dead)
        added = sorted(name for name in self._over if index(name) < 0)
        return self._names, removed, added

    def unsafe(self) -> list[int]:
        """The sorted indices of the sealed names that cannot be a path segment ('', '.',
        '..', or one with a NUL or a slash): a store that filters none (a flat listing's
        tree index) may have some. Sought once, at C speed: '', '.' and '..' by bisection,
        the others by one search of the names joined (a test of each of a million names
        took 0.3 s)."""
        self._seal()
        found = self._unsafe
        if found is None:
            names = self._names
            joined = "".join(names)
            if "\x00" in joined or "/" in joined:
                found = [i for i, name in enumerate(names) if not safe_name(name)]
            else:
                found = [i for name in ("", ".", "..")
                         if (i := bisect_left(names, name)) < len(names) and names[i] == name]
            self._unsafe = found
        return found

    # -- the mapping ----------------------------------------------------------------------

    def __getitem__(self, name: str) -> KeyInfo:
        info = self._over.get(name)
        if info is not None:
            return info
        if name in self._dead:
            raise KeyError(name)
        i = self._index(name)
        if i < 0:
            raise KeyError(name)
        return self._at(i)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._over:
            return True
        return name not in self._dead and self._index(name) >= 0

    def __setitem__(self, name: str, info: KeyInfo) -> None:
        if self._building:
            self.add(name, info.size, info.mtime_ns, info.version)
            return
        self._dead.discard(name)
        self._over[name] = info

    def __delitem__(self, name: str) -> None:
        in_arrays = name not in self._dead and self._index(name) >= 0
        if self._over.pop(name, None) is None and not in_arrays:
            raise KeyError(name)
        if in_arrays:
            self._dead.add(name)

    def __iter__(self) -> Iterator[str]:
        self._seal()
        over, dead = self._over, self._dead
        if not over and not dead:
            return iter(self._names)
        base = (n for n in self._names if n not in dead and n not in over)
        return heapq.merge(base, sorted(over))

    def names_after(self, name: str) -> Iterator[str]:
        """The names that sort after ``name``, in order, found by bisection and given one by
        one: a walk that takes a few from a directory of 200,000 copies none of them."""
        self._seal()
        names = self._names
        if self._over or self._dead:
            return (n for n in self if n > name)
        return (names[i] for i in range(bisect_right(names, name), len(names)))

    def __len__(self) -> int:
        self._seal()
        added = sum(1 for n in self._over if self._index(n) < 0)
        return len(self._names) - len(self._dead) + added

    def __repr__(self) -> str:
        return f"KeyTable({dict(self.items())!r})"


@dataclass(slots=True)
class Listing:
    """One level of the key hierarchy below a prefix.

    ``keys`` maps child names (no slash) that are keys to their info; ``prefixes``
    holds child names that have keys below them. A name may appear in both: the
    fs layer decides which wins.
    """

    keys: KeyTable = field(default_factory=KeyTable)
    prefixes: set[str] = field(default_factory=set)
    #: ``prefixes`` sorted, made on the first :meth:`prefixes_after` (and again when their count changed)
    _sorted: list[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.keys, KeyTable):
            self.keys = KeyTable(self.keys)

    def prefixes_after(self, name: str | None, count: int) -> list[str]:
        """The first ``count`` prefixes in sorted order (after ``name``, when given).

        A hint for listing ahead: a walk of the tree takes directories in this order. The
        sorted copy is kept, as a walk asks once per directory of a level, and made again
        only when the number of prefixes changed (a mkdir or rmdir through the mount); a
        change that kept the count shows a stale order, which only misdirects the hint."""
        order = self._sorted
        if order is None or len(order) != len(self.prefixes):
            order = self._sorted = sorted(self.prefixes)
        start = 0 if name is None else bisect_right(order, name)
        return order[start : start + count]

    def names_after(self, name: str) -> Iterator[str]:
        """Like :meth:`names`, only those after ``name``, lazily (see KeyTable.names_after)."""
        after = self.keys.names_after(name)
        if not self.prefixes:
            return after
        return _unique(heapq.merge(after, sorted(p for p in self.prefixes if p > name)))

    def names(self) -> list[str]:
        """Every child name, keys and prefixes, sorted, each once (without a set of them all:
        a directory of 200,000 keys has a handful of prefixes at most)."""
        if not self.prefixes:
            return list(self.keys)
        return list(_unique(heapq.merge(self.keys, sorted(self.prefixes))))

    def names_view(self, hide: Collection[str] = (), add: Collection[str] = ()) -> tuple[Sequence[str], list[str]]:
        """Like :meth:`names`, less the names that cannot be a path segment and those of
        ``hide``, plus those of ``add``: a sequence that reads the sealed arrays in place
        (their own list when nothing is left out or added), so a directory of a million keys
        is handed over with no list of its names made; and the names left out as unsafe.
        What a later write changes in the listing does not change the sequence."""
        base, removed, added = self.keys.parts()
        unsafe_at = self.keys.unsafe()
        drop = set(removed)
        skipped = [base[i] for i in unsafe_at if i not in drop]
        drop.update(unsafe_at)
        hidden = set(hide).union(add)
        for name in hidden:
            i = bisect_left(base, name)
            if i < len(base) and base[i] == name:
                drop.add(i)
        extra = set(added)
        for name in self.prefixes:
            if name not in self.keys:
                extra.add(name)
        for name in [n for n in extra if not safe_name(n)]:
            extra.discard(name)
            skipped.append(name)
        extra.difference_update(hidden)
        extra.update(add)
        if not drop and not extra:
            return base, skipped
        return SortedNames(base, sorted(drop), sorted(extra)), sorted(set(skipped))


class SortedNames(Sequence[str]):
    """The sorted names ``base`` less those at the sorted indices ``drop``, merged with the
    sorted names ``extra`` (none of them kept in ``base``): a sequence that reads ``base``
    in place, by index (a bisection or two) or in order (no search at all)."""

    __slots__ = ("_base", "_drop", "_shift", "_extra", "_at", "_n")

    def __init__(self, base: Sequence[str], drop: list[int], extra: list[str]) -> None:
        self._base, self._drop, self._extra = base, drop, extra
        #: the kept names before each dropped one: kept name k is base[k + bisect_right(shift, k)]
        self._shift = [d - j for j, d in enumerate(drop)]
        self._n = len(base) - len(drop) + len(extra)
        #: the position of each extra name among all the names
        self._at = [self._kept_before(name) + j for j, name in enumerate(extra)]

    def _kept_before(self, name: str) -> int:
        """How many kept names of ``base`` sort before ``name``."""
        i = bisect_left(self._base, name)
        return i - bisect_left(self._drop, i)

    def __len__(self) -> int:
        return self._n

    def _kept(self) -> Iterator[str]:
        it = iter(self._base)
        start = 0
        for d in self._drop:
            yield from islice(it, d - start)
            next(it, None)
            start = d + 1
        yield from it

    def __iter__(self) -> Iterator[str]:
        kept = self._kept() if self._drop else iter(self._base)
        return heapq.merge(kept, self._extra) if self._extra else kept

    def locate(self, i: int) -> tuple[bool, int]:
        """Where the i-th name is: (True, j) for ``extra[j]``, else (False, its index in
        ``base``)."""
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        if self._at:
            j = bisect_left(self._at, i)
            if j < len(self._at) and self._at[j] == i:
                return True, j
            i -= j
        return False, i + bisect_right(self._shift, i) if self._shift else i

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        extra, k = self.locate(i)
        return self._extra[k] if extra else self._base[k]


def _unique(names: Iterator[str]) -> Iterator[str]:
    """Sorted ``names`` with repeats (a name both a key and a prefix) given once."""
    last = None
    for name in names:
        if name != last:
            yield name
            last = name
