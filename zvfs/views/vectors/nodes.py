"""Generic nodes for the vectors view: lazily built directories and files.

Everything blocking runs through the mount's workers (``ctx.workers``, one worker
hop per directory build, per file build or per chunk); results land in the
mount's shared byte-bounded cache, so built files count against the same
memory budget as decoded chunks and are rebuilt if evicted.
"""

from __future__ import annotations

import bisect
import errno
import json
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from zvfs.formats.zv import ZVError
from zvfs.views.context import MountContext
from zvfs.views.node import BytesFile, DirNode, FileNode, Node, NodeError, StaticDir
from zvfs.workers import gather

T = TypeVar("T")


def fail(ctx: MountContext, what: str, exc: BaseException) -> NodeError:
    """The EIO to raise for ``what``: the fs layer logs it once per mount, by its key
    (with no key it logged every read: 7,514 lines from 8 readers in 15 s)."""
    return NodeError(errno.EIO, f"vectors: {what}: {described(exc)}", key=f"vectors: {what}")


def described(exc: BaseException) -> str:
    """An error as one line: a ZVError names its key; anything else (numpy's TypeError on
    a hostile dtype, a MemoryError) says what it is."""
    return str(exc) if isinstance(exc, ZVError) else f"{type(exc).__name__}: {exc}"


def detached(exc: BaseException) -> ZVError:
    """``exc`` to keep (in an ErrorFile, a build's errors): without its traceback, whose
    frames held what the failed build had made (gigabytes for a hostile count)."""
    return ZVError(getattr(exc, "key", "") or "vectors", described(exc)) if not isinstance(exc, ZVError) \
        else ZVError(exc.key, str(exc).removeprefix(f"{exc.key}: "))


async def blocking(ctx: MountContext, what: str, fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` in a worker; any decoder error becomes EIO naming the key (hostile
    data reaches numpy in ways no list of exception types foresees)."""
    try:
        return await ctx.workers.run(fn, *args)
    except NodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - see above
        raise fail(ctx, what, exc) from None


async def cached(ctx: MountContext, key: Hashable, what: str, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` built once in a worker and kept in the mount's chunk cache (rebuilt if evicted)."""
    return await ctx.chunks.get(key, lambda: blocking(ctx, what, fn, *args))


def _entries_size(entries: dict[str, Node]) -> int:
    return 256 * len(entries) + sum(n.size for n in entries.values() if isinstance(n, MemFile))


class _Entries(dict):
    """A built directory's entries; sized for the cache by the bytes its files hold."""

    @property
    def nbytes(self) -> int:
        return _entries_size(self)


class BuiltDir(DirNode):
    """A directory whose entries come from one blocking build, cached (rebuilt if evicted)."""

    def __init__(self, ctx: MountContext, key: Hashable, what: str, build: Callable[[], dict[str, Node]]) -> None:
        self.ctx = ctx
        self.key = key
        self.what = what
        self._build = build
        self.mtime_ns = ctx.stable_time_ns

    async def entries(self) -> dict[str, Node]:
        return await cached(self.ctx, self.key, self.what, lambda: _Entries(self._build()))

    async def lookup(self, name: str) -> Node | None:
        return _checked_entry((await self.entries()).get(name))

    async def children(self) -> Sequence[tuple[str, Node]]:
        return [(n, c) for n, c in sorted((await self.entries()).items()) if not c.hidden]


def _checked_entry(node: Node | None) -> Node | None:
    """A broken file fails its lookup with EIO (so open, stat and cat all report it)."""
    if isinstance(node, ErrorFile):
        raise fail(node.ctx, node.what, node.exc)
    return node


class VDir(StaticDir):
    """A fixed directory whose broken files fail their lookup with EIO."""

    async def lookup(self, name: str) -> Node | None:
        return _checked_entry(self.entries.get(name))


class ErrorDir(DirNode):
    """A directory that cannot be read at all (unknown zv_version, unreadable root).

    Listing it and looking anything up fail with EIO naming the key, except
    ``meta.json``, which opens by path and holds the error.
    """

    def __init__(self, ctx: MountContext, what: str, exc: BaseException) -> None:
        self.ctx = ctx
        self.what = what
        self.exc = exc
        self.mtime_ns = ctx.stable_time_ns

    async def lookup(self, name: str) -> Node | None:
        if name == "meta.json":  # opens by path and says why the rest fails
            doc = {"format": "zarr_vectors", "error": f"{self.what}: {self.exc}"}
            return MemFile((json.dumps(doc, indent=1) + "\n").encode(), self.ctx)
        raise fail(self.ctx, self.what, self.exc)

    async def children(self) -> Sequence[tuple[str, Node]]:
        raise fail(self.ctx, self.what, self.exc)


class MemFile(BytesFile):
    """Small content built together with its directory (held by the cached entries)."""

    def __init__(self, data: bytes, ctx: MountContext) -> None:
        super().__init__(data, ctx.stable_time_ns)
        self.immutable = ctx.immutable


class BuiltFile(FileNode):
    """A file whose size is known up front and whose bytes come from one blocking build."""

    def __init__(self, ctx: MountContext, key: Hashable, what: str, size: int, build: Callable[[], bytes]) -> None:
        self.ctx = ctx
        self.key = key
        self.what = what
        self._size = size
        self._build = build
        self.mtime_ns = ctx.stable_time_ns
        self.immutable = ctx.immutable

    @property
    def size(self) -> int:
        return self._size

    def _checked(self) -> bytes:
        data = self._build()
        if len(data) != self._size:
            raise ZVError(self.what, f"built {len(data)} bytes, expected {self._size}")
        return data

    async def read(self, offset: int, length: int) -> bytes:
        if offset >= self._size or length <= 0:
            return b""
        data = await cached(self.ctx, self.key, self.what, self._checked)
        return data[offset : offset + length]


class ErrorFile(FileNode):
    """Stands in for a file whose size could not be computed.

    It is left out of listings, and looking it up fails with EIO naming the key,
    so no tool ever sees it as an empty file; reads fail the same way.
    """

    hidden = True

    def __init__(self, ctx: MountContext, what: str, exc: BaseException) -> None:
        self.ctx = ctx
        self.what = what
        self.exc = exc
        self.mtime_ns = ctx.stable_time_ns

    @property
    def size(self) -> int:
        return 0

    async def read(self, offset: int, length: int) -> bytes:
        raise fail(self.ctx, self.what, self.exc)


class SegmentedFile(FileNode):
    """A file made of consecutive segments of known size, each built on its own.

    ``load(i)`` (blocking: one worker hop and one cache entry per segment) gives
    segment ``i``; a read builds only the segments its byte range touches, and
    builds them concurrently. ``literal`` segments (headers) need no hop.
    Large outputs (vertices.npy, level.ply, streamlines.trk) stream this way
    instead of being built whole.
    """

    def __init__(self, ctx: MountContext, key: Hashable, what: str, sizes: Sequence[int],
                 load: Callable[[int], bytes], literal: dict[int, bytes] | None = None) -> None:
        self.ctx = ctx
        self.key = key
        self.what = what
        self.starts = [0]
        for n in sizes:
            self.starts.append(self.starts[-1] + int(n))
        self._load = load
        self._literal = dict(literal or {})
        self.mtime_ns = ctx.stable_time_ns
        self.immutable = ctx.immutable

    @property
    def size(self) -> int:
        return self.starts[-1]

    def _checked(self, i: int) -> bytes:
        data = self._load(i)
        want = self.starts[i + 1] - self.starts[i]
        if len(data) != want:
            raise ZVError(self.what, f"part {i} built to {len(data)} bytes, expected {want}")
        return data

    async def _segment(self, i: int) -> bytes:
        lit = self._literal.get(i)
        if lit is not None:
            return lit
        return await cached(self.ctx, (self.key, i), self.what, self._checked, i)

    async def read(self, offset: int, length: int) -> bytes:
        lo, hi = offset, min(self.size, offset + length)
        if lo >= hi:
            return b""
        wanted = []
        i = bisect.bisect_right(self.starts, lo) - 1
        while i < len(self.starts) - 1 and self.starts[i] < hi:
            if self.starts[i + 1] > self.starts[i]:
                wanted.append(i)
            i += 1
        got = await gather(wanted, self._segment)
        out = []
        for i in wanted:
            s = self.starts[i]
            out.append(got[i][max(lo - s, 0) : hi - s])
        return b"".join(out)


def rows_file(ctx: MountContext, key: Hashable, what: str, header: bytes, counts: Sequence[int],
              row_bytes: int, load: Callable[[int], bytes]) -> SegmentedFile:
    """A header, then ``counts[i]`` rows of ``row_bytes`` from ``load(i)`` per chunk (npy files)."""
    return SegmentedFile(ctx, key, what, [len(header), *(int(c) * row_bytes for c in counts)],
                         lambda i: load(i - 1), literal={0: header})
