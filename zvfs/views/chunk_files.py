"""``chunks/``: an array's decoded chunks, one file each, named by their grid index
(``i.j.k``), as the v1 and v2 key layouts name chunks.

The grid is listed without a name or a node made per chunk until the kernel reads it (a
grid of a million chunks lists in the time of a few): :class:`GridNames` computes the k-th
sorted name, and :class:`ChunkGridDir` makes each file's node when its entry is told.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

from zvfs.stores.listing import SortedNames
from zvfs.views.arrays import DecodedArray
from zvfs.views.node import DirNode, FileNode, LazyEntries, Node
from zvfs.views.values import region_bytes


class ChunkFile(FileNode):
    """``chunks/<i.j.k>``: one decoded chunk, clipped at the array's edge."""

    # a listing makes one per chunk it tells the kernel of, and the mount keeps it while the
    # kernel holds the file: two slots, the chunk's index flat (one int, where a tuple and
    # its ints took 80 bytes more), its mtime and immutability asked of the array
    __slots__ = ("array", "_at")

    def __init__(self, array: DecodedArray, idx: tuple[int, ...]) -> None:
        self.array = array
        at = 0
        for i, n in zip(idx, array.meta.grid_shape, strict=True):
            at = at * n + i
        self._at = at

    @property
    def idx(self) -> tuple[int, ...]:
        """The chunk's index in the grid (C order)."""
        out = []
        rest = self._at
        for n in reversed(self.array.meta.grid_shape):
            rest, i = divmod(rest, n)
            out.append(i)
        return tuple(reversed(out))

    @property
    def mtime_ns(self) -> int:  # type: ignore[override]
        return self.array.ctx.data_mtime_ns(self.array.meta.path)

    @property
    def immutable(self) -> bool:  # type: ignore[override]
        return self.array.ctx.immutable

    def version(self) -> object:
        return self.array.content

    def outdated(self) -> bool:
        return self.array.stale()

    @property
    def size(self) -> int:
        meta = self.array.meta
        n = meta.dtype.itemsize
        for i, c, s in zip(self.idx, meta.chunks, meta.shape, strict=True):
            n *= max(0, min(c, s - i * c))  # meta.chunk_region_shape's, in one pass
        return n

    async def read(self, offset: int, length: int) -> bytes:
        await self.array.current()
        chunk = await self.array.chunk(self.idx)
        region = self.array.meta.chunk_region_shape(self.idx)
        # the Ellipsis keeps a 0-d chunk an array: chunk[()] is a numpy scalar, which is in
        # native byte order and drops an S or U value's trailing NULs (wrong bytes, unsaid)
        return region_bytes(chunk[(..., *(slice(0, s) for s in region))], offset, length)


def chunk_name(idx: tuple[int, ...]) -> str:
    return ".".join(str(i) for i in idx) if idx else "0"


def parse_chunk_name(name: str, ndim: int) -> tuple[int, ...] | None:
    if ndim == 0:
        return () if name == "0" else None
    parts = name.split(".")
    if len(parts) != ndim or not all(p.isdigit() and (p == "0" or not p.startswith("0")) for p in parts):
        return None
    return tuple(int(p) for p in parts)


#: past this many chunks a chunks/ directory still answers lookups but lists nothing
MAX_LISTED_CHUNKS = 1_000_000
#: what a chunk file's number costs while its array lasts (measured: 185 MB a 10^6-cell
#: listing); the mount's listings number at most --cache-size's worth of them in all (see
#: MountContext.may_list_cells): past it, a grid not listed yet lists nothing, as one past
#: MAX_LISTED_CHUNKS does
CELL_NUMBER_BYTES = 180
#: chunk files listed whatever the cache size (--cache-size 0 too)
MIN_LISTED_CELLS = 100_000


class ChunkGridDir(DirNode):
    """One file per chunk of the grid (plus ``extra`` entries); lookups parse the name."""

    def __init__(
        self,
        array: DecodedArray,
        make: Callable[[DecodedArray, tuple[int, ...]], FileNode],
        extra: dict[str, Node] | None = None,
    ) -> None:
        self.array = array
        self.make = make
        self.extra = dict(extra or {})
        self.mtime_ns = array.ctx.node_mtime_ns(array.meta.path)

    def outdated(self) -> bool:
        return self.array.stale()

    async def lookup(self, name: str) -> Node | None:
        if name in self.extra:
            return self.extra[name]
        meta = self.array.meta
        idx = parse_chunk_name(name, meta.ndim)
        if idx is None or any(i >= n for i, n in zip(idx, meta.grid_shape, strict=True)):
            return None
        return self.make(self.array, idx)

    async def children(self) -> Sequence[tuple[str, Node]]:
        """The grid's names are computed when read, and each chunk's node when asked: a
        grid of a million chunks lists with no million names and nodes made at once (their
        making held the mount's one trio thread for seconds, at every listing)."""
        meta = self.array.meta
        ctx = self.array.ctx
        listed = meta.nchunks <= MAX_LISTED_CHUNKS and ctx.may_list_cells(
            (meta.path, self.make.__name__), meta.nchunks,
            max(MIN_LISTED_CELLS, ctx.cache_size // CELL_NUMBER_BYTES))
        grid = meta.grid_shape if listed else None
        names = GridNames(grid, sorted(self.extra))
        array, make, extra = self.array, self.make, self.extra

        def entry(i: int) -> tuple[str, Node]:
            name, idx = names.entry(i)
            return name, extra[name] if idx is None else make(array, idx)

        return LazyEntries(names, entry)


class _Grid(Sequence[str]):
    """The sorted names of a chunk grid's files (``chunk_name`` of every index), each
    made when read.

    Sorted as strings, the names of the grid go dimension by dimension, each dimension's
    numbers in the order of their decimal strings ('.' sorts before every digit, so '1.5'
    comes before '10.2'): one short sorted list per dimension gives the k-th name."""

    __slots__ = ("_orders", "_texts", "_sizes", "_n", "_last", "_last_k")

    def __init__(self, grid: tuple[int, ...] | None) -> None:
        # grid None: too many chunks to list; () is a 0-d array's one chunk, named '0'
        self._orders = [sorted(range(n), key=str) for n in grid] if grid is not None else []
        self._texts = [[str(i) for i in order] for order in self._orders]
        self._sizes = [len(o) for o in self._orders][::-1]  # last dimension first
        self._n = 0 if grid is None else math.prod(grid)
        self._last: list[int] = []
        self._last_k = -2

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[str]:
        """In order, as a listing reads them: a name for each, without a search."""
        if self._orders:
            return map(".".join, itertools.product(*self._texts))
        return iter(["0"] * self._n)

    def _digits(self, k: int) -> list[int]:
        """The position of the k-th name in each dimension's order (a listing reads the
        names one after the other: then the last one's, moved on by one)."""
        last = self._last
        if k == self._last_k + 1 and last:
            self._last_k = k
            d = len(last) - 1
            while True:
                last[d] += 1
                if last[d] < self._sizes[len(last) - 1 - d] or d == 0:
                    return last
                last[d] = 0
                d -= 1
        digits = []
        rest = k
        for n in self._sizes:
            rest, d = divmod(rest, n)
            digits.append(d)
        digits.reverse()
        self._last, self._last_k = digits, k  # moved on in place by the next name's
        return digits

    def __getitem__(self, k):  # type: ignore[no-untyped-def,override]
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(self._n))]
        if not 0 <= k < self._n:
            raise IndexError(k)
        return self.entry(k)[0]

    def entry(self, k: int) -> tuple[str, tuple[int, ...]]:
        """The k-th name and its chunk index."""
        if not self._orders:
            return "0", ()
        digits = self._digits(k)
        return (".".join([t[d] for t, d in zip(self._texts, digits, strict=True)]),
                tuple([o[d] for o, d in zip(self._orders, digits, strict=True)]))


class GridNames(SortedNames):
    """A chunk grid's names (``grid`` None: too many to list, none) merged with a few
    sorted ``extra`` names, as a chunks/ directory or a v2 mirror's array lists them."""

    __slots__ = ()

    def __init__(self, grid: tuple[int, ...] | None, extra: list[str]) -> None:
        super().__init__(_Grid(grid), [], extra)

    def entry(self, i: int) -> tuple[str, tuple[int, ...] | None]:
        """The i-th name and its chunk index (None for an extra name)."""
        extra, k = self.locate(i)
        return (self._extra[k], None) if extra else self._base.entry(k)  # type: ignore[attr-defined]
