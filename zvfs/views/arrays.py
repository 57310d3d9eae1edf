"""``.zvfs/arrays/<array path>/``: each array decoded, as plain files.

One :class:`DecodedArray` per array holds what its files share: the metadata,
the lazily opened reader, and access to the mount's chunk cache. The files
themselves are small classes: raw bytes here, the NPY and ENVI framings in
their own modules.
"""

from __future__ import annotations

import errno
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import trio

from zvfs.formats.meta import ArrayMeta
from zvfs.views.context import MountContext
from zvfs.views.layout import chunks_in_box, range_boxes
from zvfs.views.node import BytesFile, DirNode, FileNode, Node, NodeError
from zvfs.views.readahead import ReadAhead
from zvfs.workers import gather, run_blocking

log = logging.getLogger("zvfs")


_serial = itertools.count()


class DecodedArray:
    """The shared reader of one array: decoded chunks through the cache, one worker hop each."""

    def __init__(self, ctx: MountContext, meta: ArrayMeta, opener: Callable[[], Any]) -> None:
        self.ctx = ctx
        self.serial = next(_serial)  # cache key part: never reused, unlike id()
        self.meta = meta
        self._opener = opener
        self._reader: Any = None
        self._open_lock = trio.Lock()
        self._ahead = ReadAhead(ceiling=max(meta.chunk_nbytes, min(64 << 20, ctx.cache_size // 4)))
        #: chunk index -> (message, cause, retry after this monotonic time) of chunks that failed
        self._failed: dict[tuple[int, ...], tuple[str, str, float]] = {}
        self._failure_ttl = ctx.metadata_ttl

    @property
    def readable(self) -> bool:
        """Data files exist when the metadata is usable, the element size fixed and the shape known.

        An array whose metadata cannot be used (malformed, unknown codec, absurd
        shape) shows meta.json only, with the error in it.
        """
        meta = self.meta
        return meta.error is None and meta.vlen is None and not getattr(meta, "shape_unknown", False)

    async def _open(self) -> Any:
        if self._reader is None:
            async with self._open_lock:
                if self._reader is None:
                    self._reader = await run_blocking(self._opener)
        return self._reader

    def _decode(self, reader: Any, idx: tuple[int, ...]) -> np.ndarray:
        """Worker-thread side: fetch and decode one chunk, as a C-contiguous array."""
        t0 = time.perf_counter()
        chunk = reader.read_chunk(idx)
        if not chunk.flags.c_contiguous:  # not np.ascontiguousarray: it turns 0-d into 1-d
            chunk = chunk.copy(order="C")
        self.ctx.counters.add("decode_seconds", time.perf_counter() - t0)
        self.ctx.counters.add("chunks_decoded")
        self.ctx.counters.add("bytes_decoded", chunk.nbytes)
        return chunk

    async def chunk(self, idx: tuple[int, ...]) -> np.ndarray:
        """Decoded chunk ``idx`` (full chunk shape); raises NodeError(EIO) naming the key.

        A chunk that failed stays failed for the metadata TTL: later reads fail at
        once without fetching again. The error's ``key`` names the bad store key,
        so the fs layer logs it once.
        """
        if self.meta.error is not None:
            raise self._failure(f"{self.meta.path or '/'}: {self.meta.error}", self.meta.error)
        failed = self._failed.get(idx)
        if failed is not None and (self._failure_ttl is None or time.monotonic() < failed[2]):
            raise self._failure(failed[0], failed[1])

        async def load() -> np.ndarray:
            try:
                reader = await self._open()
                return await run_blocking(self._decode, reader, idx)
            except NodeError:
                raise
            except Exception as exc:  # corrupt chunk, unknown codec, store error: this read only
                raise NodeError(errno.EIO, f"{self.meta.path or '/'} chunk {idx}: {exc}", key=str(exc)) from exc

        key = (self.serial, idx)
        if key in self.ctx.prefetched:
            self.ctx.prefetched.discard(key)
            self.ctx.counters.add("prefetch_hits")
        try:
            return await self.ctx.chunks.get(key, load)
        except NodeError as exc:
            if exc.errno != errno.EIO:
                raise
            cause = exc.key or str(exc)
            if idx not in self._failed:
                self._failed[idx] = (str(exc), cause, time.monotonic() + (self._failure_ttl or 0.0))
            raise self._failure(str(exc), cause) from None

    @staticmethod
    def _failure(message: str, cause: str) -> NodeError:
        return NodeError(errno.EIO, message, key=cause)

    async def chunk_as(self, idx: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Chunk ``idx`` converted to ``dtype`` (e.g. another byte order), cached as well."""
        if dtype == self.meta.dtype and dtype.byteorder == self.meta.dtype.byteorder:
            return await self.chunk(idx)

        async def convert() -> np.ndarray:
            return (await self.chunk(idx)).astype(dtype)

        return await self.ctx.chunks.get((self.serial, idx, dtype.str), convert)

    def _prefetch(self, start: int, stop: int) -> None:
        """Decode ahead the chunks under bytes [start, stop) of the C-order array."""
        item = self.meta.dtype.itemsize
        boxes = range_boxes(self.meta.shape, start // item, -(-stop // item))
        for idx in dict.fromkeys(i for b in boxes for i in chunks_in_box(b, self.meta.chunks)):
            key = (self.serial, idx)
            if not self.ctx.chunks.contains(key):
                self.ctx.prefetched.add(key)
                self.ctx.counters.add("prefetch_requests")
                self.ctx.background(self.chunk, idx)

    async def chunks(self, indices: list[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
        """Several chunks at once: fetched and decoded concurrently."""
        return await gather(indices, self.chunk)

    async def read_elements(self, start: int, stop: int) -> bytes:
        """C-order elements [start, stop) of the whole array, in the declared byte order."""
        meta = self.meta
        boxes = list(range_boxes(meta.shape, start, stop))
        needed = list(dict.fromkeys(i for b in boxes for i in chunks_in_box(b, meta.chunks)))
        decoded = await self.chunks(needed)
        parts = []
        for lo, hi in boxes:
            out = np.empty(tuple(h - lo_ for lo_, h in zip(lo, hi, strict=True)), dtype=meta.dtype)
            for idx in chunks_in_box((lo, hi), meta.chunks):
                origin = [i * c for i, c in zip(idx, meta.chunks, strict=True)]
                a = [max(lo_, o) for lo_, o in zip(lo, origin, strict=True)]
                b = [min(h, o + c) for h, o, c in zip(hi, origin, meta.chunks, strict=True)]
                src = tuple(slice(x - o, y - o) for x, y, o in zip(a, b, origin, strict=True))
                dst = tuple(slice(x - lo_, y - lo_) for x, y, lo_ in zip(a, b, lo, strict=True))
                out[dst] = decoded[idx][src]
            parts.append(out.tobytes())
        return b"".join(parts)

    async def read_bytes(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) of the C-order array, clipped to its size."""
        total = self.meta.nbytes
        if offset >= total or length <= 0:
            return b""
        end = min(total, offset + length)
        ahead = self._ahead.advise(offset, end, total)
        if ahead is not None:
            self._prefetch(*ahead)
        item = self.meta.dtype.itemsize
        first, last = offset // item, -(-end // item)
        data = await self.read_elements(first, last)
        skip = offset - first * item
        return data[skip : skip + (end - offset)]


class RawDataFile(FileNode):
    """``data.raw``: the whole array, C order, declared byte order, fill where never written."""

    def __init__(self, array: DecodedArray) -> None:
        self.array = array
        self.mtime = array.ctx.node_mtime(array.meta.path)

    @property
    def size(self) -> int:
        return self.array.meta.nbytes

    async def read(self, offset: int, length: int) -> bytes:
        return await self.array.read_bytes(offset, length)


class ChunkFile(FileNode):
    """``chunks/<i.j.k>``: one decoded chunk, clipped at the array's edge."""

    def __init__(self, array: DecodedArray, idx: tuple[int, ...]) -> None:
        self.array = array
        self.idx = idx
        self.mtime = array.ctx.node_mtime(array.meta.path)

    @property
    def size(self) -> int:
        meta = self.array.meta
        n = 1
        for s in meta.chunk_region_shape(self.idx):
            n *= s
        return n * meta.dtype.itemsize

    async def read(self, offset: int, length: int) -> bytes:
        chunk = await self.array.chunk(self.idx)
        region = self.array.meta.chunk_region_shape(self.idx)
        view = chunk[tuple(slice(0, s) for s in region)]
        return bytes(byte_view(view)[offset : offset + length])


def byte_view(a: np.ndarray) -> memoryview:
    """The C-order bytes of ``a`` without a copy when it is contiguous.

    Through a uint8 view, not ``memoryview(a)``: datetime64/timedelta64 arrays
    have no buffer interface.
    """
    flat = np.ascontiguousarray(a).reshape(-1)  # 1-d, so 0-d arrays work too
    return memoryview(flat.view(np.uint8))


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
        self.mtime = array.ctx.node_mtime(array.meta.path)

    async def lookup(self, name: str) -> Node | None:
        if name in self.extra:
            return self.extra[name]
        meta = self.array.meta
        idx = parse_chunk_name(name, meta.ndim)
        if idx is None or any(i >= n for i, n in zip(idx, meta.grid_shape, strict=True)):
            return None
        return self.make(self.array, idx)

    async def children(self) -> Sequence[tuple[str, Node]]:
        meta = self.array.meta
        entries: list[tuple[str, Node]] = list(self.extra.items())
        if meta.nchunks <= MAX_LISTED_CHUNKS:
            entries += [(chunk_name(i), self.make(self.array, i)) for i in meta.chunk_indices()]
        entries.sort(key=lambda e: e[0])
        return entries


def array_files(array: DecodedArray) -> dict[str, Node]:
    """The files of ``arrays/<path>/`` for one array."""
    from zvfs.views.envi import envi_header, envi_supported
    from zvfs.views.npy import NpyFile

    mtime = array.ctx.node_mtime(array.meta.path)
    files: dict[str, Node] = {"meta.json": BytesFile(array.meta.json_bytes(), mtime)}
    if not array.readable:
        return files
    files["data.raw"] = RawDataFile(array)
    files["data.npy"] = NpyFile(array)
    files["chunks"] = ChunkGridDir(array, ChunkFile)
    if envi_supported(array.meta):
        files["data.hdr"] = BytesFile(envi_header(array.meta), mtime)
    return files
