"""``.zvfs/arrays/<array path>/``: each array decoded, as plain files.

One :class:`DecodedArray` per array holds what its files share: the metadata,
the lazily opened reader, and access to the mount's chunk cache. The files
themselves are small classes: data.raw here, the NPY and ENVI framings and the
per-chunk files (:mod:`zvfs.views.chunk_files`) in their own modules; a chunk's
values become the bytes served in :mod:`zvfs.views.values`.
"""

from __future__ import annotations

import errno
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Literal

import numpy as np
import trio

from zvfs.cache.tree import unlisted
from zvfs.codecs.blosc import buffers_from
from zvfs.decoders.pool import DecoderPool, NotServed
from zvfs.formats import ZarrArray, read_array_meta
from zvfs.formats.meta import ArrayMeta
from zvfs.stores.base import Listing, is_store_failure
from zvfs.views.context import CHUNK_ENTRY_OVERHEAD, MountContext
from zvfs.views.layout import Box, chunk_span, chunks_under, range_boxes
from zvfs.views.node import FileNode, NodeError
from zvfs.views.readahead import ReadAhead
from zvfs.views.values import TextWidth, TooWide, byte_view, convert_chunk, text_width
from zvfs.workers import gather, gather_batched

log = logging.getLogger("zvfs")


class DecodedArray:
    """The shared reader of one array: decoded chunks through the cache, one worker hop each.

    Decoded chunks are cached under what they *are* (array path, a digest of the
    normalized metadata, chunk index), not under this object: a rediscovery after
    the metadata TTL builds a new DecodedArray that finds the chunks decoded
    before, and changed metadata can never meet chunks decoded under the old one.
    Each entry lives for the metadata TTL, so a rewritten chunk shows within it.
    """

    def __init__(self, ctx: MountContext, meta: ArrayMeta, opener: Callable[[], ZarrArray],
                 rediscover: Callable[[], Awaitable[object]],
                 digests: tuple[str, str] | None = None) -> None:
        """``rediscover`` reads the mount's hierarchy again (the views' :func:`decoded`, which
        lies above this module): what an open file calls once the metadata TTL has passed."""
        self.ctx = ctx
        self.meta = meta
        #: what its bytes are read by (see MountContext.array_layouts): ``layout``; given
        #: when known (``meta`` itself had them taken by an earlier discovery)
        self.digest, self.layout = digests or meta.digests()
        self.identity = ("chunk", meta.path, self.digest)
        self._opener = opener
        self._rediscover = rediscover
        self._reader: ZarrArray | None = None
        self._reader_epoch = 0
        self._open_lock = trio.Lock()
        #: the write epoch of the metadata document this object was made from
        self._meta_epoch = ctx.epoch(meta.metadata_key)
        #: a later epoch of it whose document :meth:`_follow_rewrite` found of another layout
        self._refused_epoch = -1
        self._rewrite_lock = trio.Lock()
        self._content: tuple[object, ...] = (*self.identity, ctx.epoch(meta.path))

    @property
    def content(self) -> tuple[object, ...]:
        """What the array's bytes are now: its identity, and the epoch of writes through
        the mount below its path (a chunk written through the mount changes it). One tuple
        while the epoch stands: every chunk key and every open file's page epoch holds it
        (a tuple each took 72 bytes more a chunk file opened, and a key 48)."""
        epoch = self.ctx.epoch(self.meta.path)
        if self._content[-1] != epoch:
            self._content = (*self.identity, epoch)
        return self._content

    def cache_key(self, idx: tuple[int, ...], *extra: object) -> tuple[object, ...]:
        return (self.content, idx, *extra)

    @property
    def readable(self) -> bool:
        """Data files exist when the metadata is usable, the element size fixed and the shape known.

        An array whose metadata cannot be used (malformed, unknown codec, absurd
        shape) shows meta.json only, with the error in it.
        """
        meta = self.meta
        return meta.error is None and meta.vlen is None and not getattr(meta, "shape_unknown", False)

    async def _open(self) -> ZarrArray:
        """The reader, opened again after a write through the mount (it may hold shard indexes)."""
        epoch = self.ctx.epoch(self.meta.path)
        if self._reader is None or self._reader_epoch != epoch:
            async with self._open_lock:
                if self._reader is None or self._reader_epoch != epoch:
                    self._reader = await self.ctx.workers.run(self._opener)
                    self._reader_epoch = epoch
        return self._reader

    def _decode(self, reader: ZarrArray, idx: tuple[int, ...], dtype: np.dtype | None = None) -> np.ndarray:
        """Worker-thread side: fetch and decode one chunk, as a C-contiguous array (converted
        to ``dtype`` in the same hop, into a pooled buffer; the decoded one, this call's own,
        then goes back to the pool for the next decode)."""
        t0 = time.perf_counter()
        with buffers_from(self.ctx.buffers.take):  # into the memory of chunks read past
            chunk = reader.read_chunk(idx)
        if not chunk.flags.c_contiguous and any(chunk.strides):  # a broadcast fill stays one
            # not np.ascontiguousarray: it turns 0-d into 1-d
            chunk = chunk.copy(order="C")
        if dtype is not None:
            decoded = chunk
            chunk = convert_chunk(decoded, dtype, into=self.ctx.buffers.take)
            if not np.may_share_memory(chunk, decoded):
                self.ctx.buffers.give(decoded)  # it keeps only numpy's own uint8 buffers
        self.ctx.counters.add("decode_seconds", time.perf_counter() - t0)
        self.ctx.counters.add("chunks_decoded")
        # a never-written chunk is one fill element broadcast: nothing was decoded (its
        # nbytes, a whole chunk's, told of terabytes decoded over an array of fill)
        self.ctx.counters.add("bytes_decoded", 0 if chunk.ndim and not any(chunk.strides) else chunk.nbytes)
        return chunk

    def _current(self) -> None:
        """Refuse to serve a file opened before the array's metadata changed (see
        :meth:`_staleness`)."""
        stale = self._staleness()
        if stale is not None:
            raise stale

    def _staleness(self) -> NodeError | None:
        """ESTALE for a file opened before the array's metadata was rewritten through the
        mount (its new chunks read by the old metadata are neither version: int32 views of
        float32 bits, or EIO, in a helper's audit), or changed behind it (another process,
        another S3 client), as the mount's latest read of the metadata found it: the array
        gone, or read by other metadata. A new open reads the new array. None: current."""
        key = self.meta.metadata_key
        if key and not self.ctx.unwritten and self.ctx.epoch(key) != self._meta_epoch:
            return NodeError(errno.ESTALE, f"{self.meta.path or '/'}: its metadata ({key}) was "
                             "rewritten since this file was opened")
        if self.ctx.array_layouts is not None and self.ctx.known_layout(self.meta.path) != self.layout:
            path = self.meta.path or "/"
            return NodeError(errno.ESTALE, f"{path}: its metadata ({key or path}) changed in the "
                             "store since this file was opened; open it again",
                             key=f"stale {path} {self.layout}", answer=True)
        return None

    def stale(self) -> bool:
        """Whether :meth:`_current` refuses this array: made from metadata the mount has
        read anew since (through the mount or behind it)."""
        return self._staleness() is not None

    async def current(self) -> None:
        """:meth:`_current`, for a read of an open file: when the mount last read the
        metadata a metadata TTL ago or more, it reads it again first (one discovery for all
        readers, as a lookup would make), so a reader that keeps a file open past a change
        behind the mount is told ESTALE rather than served the new chunks by the old
        metadata (a dtype change read as wrong values, unsaid). Waited for: in the
        background, the reads meanwhile were served so (a review tried it). So a stream pays
        one discovery a TTL; within the TTL the old metadata serves, as it serves a new open
        then. At most one is asked for a TTL (at least RECHECK_MIN s), also while they come
        back incomplete (an S3 fault: each read began another). A discovery that fails
        leaves the check to what is known.

        A hierarchy found by walking the store (no consolidated metadata) is not read whole
        for that: only this array's own metadata is (:meth:`_recheck`). A reader of one array
        of a store of 100,000 waited 22-32 s every TTL for a discovery of them all."""
        ctx = self.ctx
        await self._follow_rewrite()
        ttl = ctx.metadata_ttl
        if ttl is None:
            self._current()
            return
        now = time.monotonic()
        wait = max(ttl, RECHECK_MIN)
        if ctx.array_layouts is not None and not ctx.layouts_consolidated:
            path = self.meta.path
            if now - max(ctx.layouts_read, ctx.rechecks_asked.get(path, 0.0)) >= wait:
                ctx.rechecks_asked[path] = now
                await self._recheck(now)
        elif now - max(ctx.layouts_read, ctx.layouts_asked) >= wait:
            ctx.layouts_asked = now
            try:
                await self._rediscover()
            except Exception as exc:  # noqa: BLE001 - the read reports its own failures
                log.debug("metadata not read again for %s: %s", self.meta.path or "/", exc)
        self._current()

    async def _follow_rewrite(self) -> None:
        """The metadata document rewritten through the mount since this file was opened:
        read it again (:meth:`_recheck`), and when what the bytes are read by is unchanged
        (:meth:`ArrayMeta.layout_digest`: an attribute set, dimension names, the same
        document written again) take the rewrite for this array's own, so the open goes on
        reading, as it does after such a change behind the mount. zarr-python rewrites a v3
        array's zarr.json for ``attrs[...] = ...``: every open data.raw read ESTALE after
        it, and an mmap of it died of SIGBUS. Another layout leaves it for :meth:`_current`
        to refuse. Each epoch is read at most once (a refused one is remembered)."""
        key = self.meta.metadata_key
        if not key or self.ctx.unwritten:
            return
        epoch = self.ctx.epoch(key)
        if epoch in (self._meta_epoch, self._refused_epoch):
            return
        async with self._rewrite_lock:
            if epoch in (self._meta_epoch, self._refused_epoch):
                return
            layout = await self._recheck(time.monotonic())
            # the epoch noted before the read: a write since moves it on, and is read again
            if layout == self.layout:
                self._meta_epoch = epoch
            elif layout is not False:  # not read: refused by _current, and asked again
                self._refused_epoch = epoch

    async def _recheck(self, began: float) -> str | None | Literal[False]:
        """Read this array's own metadata again (a get or a few, as discovery reads each
        node's) and note its layout for :meth:`_staleness`. Found changed (or gone), the
        mount's discovery is let go too, so the next lookup finds the array as it is now.
        Returns the layout read (None: no array there), False when it could not be read."""
        ctx = self.ctx
        path = self.meta.path
        try:
            meta = await ctx.workers.run_urgent(read_array_meta, ctx.store, path)
        except Exception as exc:  # noqa: BLE001 - the read reports its own failures
            log.debug("metadata not read again for %s: %s", path or "/", exc)
            return False
        layout = None if meta is None else meta.layout_digest()
        held = ctx.array_rechecks.get(path)
        if held is None or held[0] < began:
            ctx.array_rechecks[path] = (began, layout)
        if ctx.array_layouts is not None and layout != ctx.array_layouts.get(path):
            ctx.listings.invalidate(("decoded",))
        return layout

    async def chunk(self, idx: tuple[int, ...]) -> np.ndarray:
        """Decoded chunk ``idx`` (full chunk shape); raises NodeError(EIO) naming the key."""
        self._current()
        return await self._cached(idx, None)

    async def chunk_as(self, idx: tuple[int, ...], dtype: np.dtype | None) -> np.ndarray:
        """Chunk ``idx`` converted to ``dtype`` (another byte order, netCDF's types), cached
        under its own key. Decoded and converted in one worker hop, or converted from the
        decoded chunk when that is cached."""
        self._current()
        return await self._cached(idx, self._other(dtype))

    async def _ahead(self, indices: list[tuple[int, ...]]) -> None:
        """Chunks ``indices`` loaded ahead of their reader: one, or a batch of tiny ones
        (:meth:`_load_batch`). Not counted as prefetch hits (each chunk read ahead counted
        one, read or not)."""
        self._current()
        if len(indices) == 1:
            await self._cached(indices[0], None, ahead=True)
        else:
            await self._load_batch(indices, ahead=True)

    async def _cached(self, idx: tuple[int, ...], dt: np.dtype | None, ahead: bool = False) -> np.ndarray:
        """Chunk ``idx`` (as ``dt``, None for the declared dtype) through the cache.

        A chunk whose bytes are corrupt stays failed for the metadata TTL: later
        reads fail at once without fetching again. A store failure (timeout,
        throttling, refused credentials) is never remembered: the next read tries
        again. The error's ``key`` names the bad store key, so the fs layer logs it once.
        """
        if self.meta.error is not None:
            raise self._failure(f"{self.meta.path or '/'}: {self.meta.error}", self.meta.error)
        native = self.cache_key(idx)
        failed = self.ctx.failures.peek(native)
        if failed is not None:
            raise self._failure(*failed)

        async def load() -> np.ndarray:
            async with self.ctx.decoding.hold(self.meta.chunk_nbytes):
                return await decode()

        async def decode() -> np.ndarray:
            if dt is not None:
                decoded = self.ctx.chunks.peek(native)
                if decoded is not None:
                    return await self.ctx.workers.run(convert_chunk, decoded, dt)
            try:
                tree = self.ctx.held_tree()
                if tree is not None:
                    reader = await self._open()
                    if unlisted(tree, (reader.chunk_key(idx),)):
                        return await self._unwritten(reader, dt)
                if dt is None and self.ctx.decoders is not None:
                    try:
                        return await self._decode_elsewhere(self.ctx.decoders, idx)
                    except NotServed:
                        pass
                reader = await self._open()
                return await self.ctx.workers.run(self._decode, reader, idx, dt)
            except NodeError:
                raise
            except Exception as exc:  # corrupt chunk, unknown codec, store error: this read only
                err = self._chunk_failure(idx, exc)
                if isinstance(exc, TooWide):
                    # no fault of the chunk: it changed behind the mount since the width was
                    # measured. The views of it are made again (the width measured anew) by
                    # the next lookup, as after a change through the mount
                    self.ctx.note_replaced(self._store_key(idx))
                elif not is_store_failure(exc):
                    self.ctx.failures.put(native, (str(err), err.key))
                raise err from exc

        key = native if dt is None else self._key(idx, dt)
        if not ahead:
            self.ctx.prefetch_hit(key)
        return await self.ctx.chunks.get(key, load, ttl=self.ctx.metadata_ttl)

    async def _unwritten(self, reader: ZarrArray, dt: np.dtype | None) -> np.ndarray:
        """A chunk whose object the store's listing does not hold: its fill, with no get (on
        S3 each was a request answering 404), converted in a worker when ``dt`` asks."""
        self.ctx.counters.add("chunks_decoded")  # as a get that found nothing counts it
        fill = reader.fill_chunk()
        return fill if dt is None else await self.ctx.workers.run(convert_chunk, fill, dt)

    async def _decode_elsewhere(self, decoders: DecoderPool, idx: tuple[int, ...]) -> np.ndarray:
        """Chunk ``idx`` decoded by a decoder process, in shared memory; NotServed when the
        processes cannot (then a worker thread decodes it)."""
        meta = self.meta
        slot = await decoders.decode(meta.path, self.digest, self.ctx.epoch(meta.path), idx, meta.chunk_nbytes)
        if slot is None:
            return (await self._open()).fill_chunk()
        self.ctx.counters.add("chunks_decoded")
        self.ctx.counters.add("bytes_decoded", slot.nbytes)
        return slot.view(meta.dtype).reshape(meta.chunks)

    def _store_key(self, idx: tuple[int, ...]) -> str:
        """The store key chunk ``idx`` is read from, or the array and index when unknown."""
        try:
            if self._reader is not None:
                return self._reader.chunk_key(idx)
        except Exception:  # noqa: BLE001 - only a name for the log
            pass
        return f"{self.meta.path or '/'} chunk {idx}"

    def _chunk_failure(self, idx: tuple[int, ...], exc: Exception) -> NodeError:
        """EIO for chunk ``idx``, logged once per store key and kind of failure, not per
        message: a store failure's text changes from try to try (attempts, request ids)."""
        once = f"{self._store_key(idx)} {'store' if is_store_failure(exc) else 'data'}"
        return NodeError(errno.EIO, f"{self.meta.path or '/'} chunk {idx}: {exc}", key=once)

    async def text_width(self) -> TextWidth:
        """The longest value anywhere in the array, fill included: the width a fixed-width
        form of variable-length values needs (no metadata holds it). Every chunk is read (one
        worker hop each) and none is kept; a failure is :meth:`_chunk_failure`'s."""
        await self.current()
        reader = await self._open()

        async def width(idx: tuple[int, ...]) -> TextWidth:
            try:
                return await self.ctx.workers.run(lambda: text_width(reader.read_chunk(idx)))
            except Exception as exc:  # noqa: BLE001 - as a read of the chunk reports it
                raise self._chunk_failure(idx, exc) from exc

        widths = (await gather_batched(self.meta.chunk_indices(), width, CHUNK_BATCH)).values()
        return TextWidth(max((w.utf8 for w in widths), default=0), max((w.chars for w in widths), default=0))

    @staticmethod
    def _failure(message: str, cause: str) -> NodeError:
        return NodeError(errno.EIO, message, key=cause)

    def _other(self, dtype: np.dtype | None) -> np.dtype | None:
        """``dtype`` when it differs from the array's own (byte order included), else None."""
        return None if dtype is None or dtype == self.meta.dtype else np.dtype(dtype)

    def _key(self, idx: tuple[int, ...], dtype: np.dtype | None) -> tuple[object, ...]:
        return self.cache_key(idx) if dtype is None else self.cache_key(idx, dtype.str)

    def _peek(self, idx: tuple[int, ...]) -> np.ndarray | None:
        """Decoded chunk ``idx`` if it is ready already (a read then needs no task and no hop)."""
        key = self.cache_key(idx)
        chunk = self.ctx.chunks.peek(key)
        if chunk is not None:
            self.ctx.prefetch_hit(key)
        return chunk

    def _prefetch(self, start: int, stop: int, item: int) -> None:
        """Decode ahead the chunks under bytes [start, stop) of the C-order array served with
        ``item`` bytes an element (netCDF's may be wider than the stored ones), as far as the
        mount's prefetch budget allows (what it refuses, the reader decodes on demand).

        Chunks of at most BATCH_BYTES / CHUNK_BATCH go a batch to a task, decoded in one
        worker hop as a read decodes them, and each counts its cache entry's overhead in the
        budget: a task and a hop each, read-ahead over an array of 16-byte chunks held
        thousands of tasks at once (77 MiB of a daemon's 150 with a 16 MiB cache), and a
        read of 15 MB of it took 97 s."""
        boxes = list(range_boxes(self.meta.shape, start // item, -(-stop // item)))
        keys = {self.cache_key(idx): idx for idx in chunks_under(boxes, self.meta.chunks)}
        todo = [(key, idx) for key, idx in keys.items() if not self.ctx.chunks.contains(key)]
        nbytes = self.meta.chunk_nbytes
        step = CHUNK_BATCH if nbytes * CHUNK_BATCH <= BATCH_BYTES else 1
        for i in range(0, len(todo), step):
            group = todo[i : i + step]
            if not self.ctx.prefetch(len(group) * (nbytes + CHUNK_ENTRY_OVERHEAD), self._ahead,
                                     [idx for _, idx in group]):
                return
            for key, _ in group:
                self.ctx.prefetch_asked(key)

    def _ready(
        self, indices: list[tuple[int, ...]]
    ) -> tuple[dict[tuple[int, ...], np.ndarray], list[tuple[int, ...]]]:
        """The decoded chunks of ``indices`` that are ready, and those still to load."""
        out: dict[tuple[int, ...], np.ndarray] = {}
        missing = []
        for idx in indices:
            chunk = self._peek(idx)
            if chunk is None:
                missing.append(idx)
            else:
                out[idx] = chunk
        return out, missing

    async def chunks(self, indices: list[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
        """Several decoded chunks at once: the ready ones at once, the rest fetched and
        decoded concurrently (one worker hop each, so both cores decode)."""
        out, missing = self._ready(indices)
        if missing:
            out.update(await gather(missing, self.chunk))
        return out

    def read_ahead(self) -> ReadAhead:
        """A fresh sequential detector for one open of a file over this array. Its window
        starts at one stripe of the chunk grid (the bytes a row of chunks covers in C order),
        so a streaming reader has the next chunks decoding while it reads this one."""
        meta = self.meta
        # bounded in chunks too: 4 MiB ahead is 4 million 1-byte chunks
        ceiling = max(meta.chunk_nbytes, min(64 << 20, self.ctx.cache_size // 4,
                                             meta.chunk_nbytes * 4 * CHUNK_BATCH))
        if self.ctx.decoders is not None:
            narrow = self.ctx.decoders.read_ahead(meta.chunk_nbytes)
            if narrow is not None:
                ceiling = min(ceiling, narrow)
        stripe = meta.chunk_nbytes * (math.prod(meta.grid_shape[1:]) if meta.ndim else 1)
        return ReadAhead(initial=min(ceiling, max(4 << 20, stripe)), ceiling=ceiling)

    async def read_elements(
        self, start: int, stop: int, dtype: np.dtype | None = None,
        passed: Callable[[], tuple[int, int]] | None = None,
    ) -> memoryview:
        """C-order elements [start, stop) of the whole array as bytes: in the declared dtype and
        byte order, or converted to ``dtype`` as they are copied out of the decoded chunks.

        One copy at most: a range inside one decoded chunk whose bytes are contiguous there
        (an array chunked by whole rows, read in step) is that chunk's own memory; any other
        range, and any converted one, is assembled in one buffer, each chunk's part copied
        (and converted: another byte order for netCDF) straight into its place. So a netCDF
        read costs one pass over its bytes, and its chunks are the ones data.raw caches:
        converting them whole in the workers, cached apart, was a second pass, twice the
        memory, and a byteswap that held the GIL.

        However many chunks the range touches, at most ``CHUNK_BATCH`` of them are held
        by this read at a time, and tiny chunks are decoded a batch per worker hop: a
        1 MiB read of an array of 1-byte chunks costs bounded memory, not a million tasks.

        ``passed``: this read is part of a sequential run of reads; it tells the elements
        [from, to) the run has now been answered whole. The chunks in them leave the cache
        (see :meth:`_release`).
        """
        meta = self.meta
        dt = self._other(dtype)
        boxes = list(range_boxes(meta.shape, start, stop))
        needed = chunks_under(boxes, meta.chunks)  # made a group at a time, never all at once
        group = list(itertools.islice(needed, CHUNK_BATCH))
        # text re-encoded (U, or variable-length values, as fixed-width UTF-8) is no cast the
        # copy below can make: such chunks are converted whole in the workers (chunk_as), and
        # copied as they are
        recode = dt is not None and (meta.dtype.kind == "U" or meta.vlen is not None)
        if len(group) == 1 and dt is None:  # fewer than a group: that is all of them
            idx = group[0]
            chunk = self._peek(idx)
            if chunk is None:
                chunk = await self.chunk(idx)
            view = _contiguous_part(meta, idx, chunk, start, stop, boxes)
            if view is not None:
                if passed is not None:
                    self._release(group, *passed())
                return view
        buf: np.ndarray | None = None
        laid: np.ndarray | None = None  # the fill chunk the whole reply was set to, if any
        while group:
            if recode:
                decoded = await gather(group, lambda idx: self.chunk_as(idx, dt))
            else:
                decoded = await (self._batch(group) if len(group) == CHUNK_BATCH else self.chunks(group))
            if buf is None:  # taken once the first chunks are in: a read waiting for them holds none
                buf, out, views = self._reply_buffer(stop - start, dt or meta.dtype, boxes)
                laid = _lay_fill(out, decoded.values())
            for idx in group:
                chunk = decoded[idx]
                if chunk is not laid:
                    _copy_chunk(meta.chunks, idx, chunk, boxes, views)
            del decoded  # not held while the next group loads
            if passed is not None:
                self._release(group, *passed())
            group = list(itertools.islice(needed, CHUNK_BATCH))
        self.ctx.buffers.give(buf)  # lent again once the reply made from it is gone
        return byte_view(out)

    def _reply_buffer(
        self, count: int, dtype: np.dtype, boxes: list[Box]
    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """A reply of ``count`` elements of ``dtype``: its uint8 buffer, the buffer as
        ``dtype``, and the view of it that each box fills. The buffer is memory an earlier
        reply went out from, when the pool has one (a fresh MiB is 256 page faults, and
        unmapped again after the reply)."""
        nbytes = count * dtype.itemsize
        buf = self.ctx.buffers.take(nbytes)
        if buf is None:
            buf = np.empty(nbytes, np.uint8)
        out = buf.view(dtype)
        views, at = [], 0
        for lo, hi in boxes:
            shape = tuple(h - lo_ for lo_, h in zip(lo, hi, strict=True))
            n = math.prod(shape)
            views.append(out[at : at + n].reshape(shape))
            at += n
        return buf, out, views

    def _release(self, touched: list[tuple[int, ...]], start: int, stop: int) -> None:
        """Drop from the cache the chunks of ``touched`` whose every element lies in [start,
        stop), which a sequential run of reads has now read whole.

        A streamed file's bytes are in the kernel's page cache by then (or read once, with
        direct_io), so keeping the chunks too only doubled the daemon's memory, and their
        buffers now take the next chunks the run decodes (zvfs.cache.buffers) instead of
        fresh pages faulted in one by one. Chunks read in part, decoded ahead, or read by
        a seeking reader stay under the cache's LRU bound; so do small ones (their buffers
        are not worth it)."""
        meta = self.meta
        if meta.chunk_nbytes < RELEASE_MIN_BYTES:
            return
        for idx in touched:
            first, end = chunk_span(meta.shape, meta.chunks, idx)
            if start <= first and end <= stop:
                self.ctx.chunks.invalidate(self.cache_key(idx))

    async def _batch(self, indices: list[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
        """Many (small) chunks: the cached ones, and the rest decoded in one worker hop.

        Any failure falls back to one chunk at a time, so errors are reported and
        remembered exactly as for a single chunk."""
        out, missing = self._ready(indices)
        if missing and self.meta.chunk_nbytes * len(missing) <= BATCH_BYTES:
            try:
                out.update(await self._load_batch(missing))
                missing = []
            except Exception:  # noqa: BLE001 - retried one by one below, which reports it
                pass
        if missing:
            out.update(await self.chunks(missing))
        return out

    async def _load_batch(self, indices: list[tuple[int, ...]], ahead: bool = False) -> dict[tuple[int, ...], np.ndarray]:
        """Small chunks ``indices`` decoded a few worker hops for all (:meth:`_parts`), each
        single-flight with any other load of it (``Cache.get_many``): a reader arriving
        while read-ahead decodes its chunks waits for them rather than decode them again.
        A failure is raised as it comes (the caller retries one by one, which reports)."""
        # the keys of what is read now: a write through the mount during the hop makes
        # later keys, and must not find these old bytes under them
        keys = {self.cache_key(idx): idx for idx in indices}
        if not ahead:
            for key in keys:
                self.ctx.prefetch_hit(key)

        async def load(wanted: list[Hashable]) -> dict[Hashable, np.ndarray]:
            reader = await self._open()
            parts = self._parts([keys[k] for k in wanted])
            tree = self.ctx.held_tree()
            done = await gather(list(range(len(parts))),
                                lambda i: self.ctx.workers.run(self._decode_many, reader, parts[i], tree))
            return dict(zip(wanted, (chunk for i in range(len(parts)) for chunk in done[i]), strict=True))

        got = await self.ctx.chunks.get_many(list(keys), load, ttl=self.ctx.metadata_ttl)
        return {keys[k]: chunk for k, chunk in got.items()}

    def _parts(self, indices: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
        """A batch cut into the worker hops that load it: one from a local store, where a
        hop costs more than its reads; from a remote one, as many as the workers, each
        waiting on its own requests (256 gets of 1 KiB chunks one after another over S3
        at 20 ms took 5 s a batch, a 1 MiB read of an array of such chunks 23 s)."""
        n = 1 if self.ctx.store.local else min(len(indices), self.ctx.workers.limit)
        size = -(-len(indices) // n)
        return [indices[i : i + size] for i in range(0, len(indices), size)]

    def _decode_many(self, reader: ZarrArray, indices: list[tuple[int, ...]],
                     tree: dict[str, Listing] | None = None) -> list[np.ndarray]:
        """Worker-thread side of a batch: each chunk decoded, and the fill for those whose
        object the store tells is absent without a get (a stat, its index), or the store's
        listing index ``tree`` does not hold: an array of a million one-byte chunks never
        written cost a failed get and its bookkeeping each, over a minute for one small read
        of data.npy (the kernel reads the file ahead)."""
        keys = reader.chunk_keys(indices)
        absent = self.ctx.store.absent(keys)
        if tree is not None:
            absent = absent | unlisted(tree, keys)
        fill = reader.fill_chunk()
        out = [fill if key in absent else self._decode(reader, idx) for idx, key in zip(indices, keys, strict=True)]
        # counted as a get that found nothing counts them (_decode counted the others)
        self.ctx.counters.add("chunks_decoded", sum(key in absent for key in keys))
        return out

    async def read_bytes(
        self, offset: int, length: int, ahead: ReadAhead | None = None, dtype: np.dtype | None = None
    ) -> memoryview | bytes:
        """Bytes [offset, offset+length) of the C-order array (as ``dtype``, when given), clipped
        to its size. ``ahead`` is the reading open's own sequential detector (:meth:`read_ahead`)."""
        await self.current()
        dt = self._other(dtype)
        item = (dt or self.meta.dtype).itemsize
        total = self.meta.size * item
        if offset >= total or length <= 0:
            return b""
        end = min(total, offset + length)
        # variable-length values are read converted only (their native chunks, objects, are
        # never cached: the cache would count 8 bytes a value, whatever each holds)
        if ahead is not None and self.meta.vlen is None:
            window = ahead.advise(offset, end, total)
            if window is not None:
                self._prefetch(*window, item)
        first, last = offset // item, -(-end // item)
        if ahead is None:
            data = await self.read_elements(first, last, dt)
        else:
            with ahead.reading(offset, end) as answered_to:
                # what the run has read whole, in whole elements, from where it began
                run_from = -(-ahead.run_start // item)
                data = await self.read_elements(first, last, dt, lambda: (run_from, answered_to() // item))
                later = answered_to() // item
                if later > last and self.meta.chunk_nbytes >= RELEASE_MIN_BYTES:
                    # reads after this one were answered first, and kept what they passed
                    # for it: that goes now
                    beyond = chunks_under(list(range_boxes(self.meta.shape, last, later)), self.meta.chunks)
                    self._release(list(beyond), run_from, later)
        skip = offset - first * item
        return data[skip : skip + (end - offset)]


#: variable-length text arrays of at most this many values are served (read whole, when a
#: view of them is first listed, for the width of their longest value); larger ones are not
VLEN_MAX_VALUES = 1 << 20
#: ... and in at most this many chunks (each a request on S3, made while the listing waits)
VLEN_MAX_CHUNKS = 4096
async def served_text_width(array: DecodedArray) -> TextWidth | str:
    """The width of variable-length text ``array`` (:meth:`DecodedArray.text_width`), or why
    the views that need it (netCDF, data.npy) leave it out: too many values or chunks to read
    whole while a listing waits, or a corrupt chunk (its key logged once). Measured once for
    what the array's bytes are now (its content) within the metadata TTL, whichever view
    asks first; a corrupt chunk is remembered as long, as a read's is. A store failure is
    raised, never remembered: it is no property of the array, and the next listing tries
    again."""
    meta = array.meta
    why = None
    if meta.size > VLEN_MAX_VALUES:
        why = (f"{meta.size:,} variable-length values ({meta.vlen}): more than the "
               f"{VLEN_MAX_VALUES:,} read whole for their width when the directory is listed")
    elif math.prod(meta.grid_shape) > VLEN_MAX_CHUNKS:
        why = (f"variable-length values ({meta.vlen}) in {math.prod(meta.grid_shape):,} "
               f"chunks: more than the {VLEN_MAX_CHUNKS:,} read whole for their width when "
               "the directory is listed")
    if why is not None:
        if array.ctx.log_once.first(f"text width {meta.path}"):
            log.info("%s: no netCDF variable or data.npy: %s", meta.path or "/", why)
        return why

    async def measure() -> TextWidth | str:
        try:
            return await array.text_width()
        except NodeError as exc:
            if is_store_failure(exc.__cause__):
                raise
            if array.ctx.log_once.first(f"text width {exc.key or meta.path}"):
                log.warning("%s: no netCDF variable or data.npy: its width is unreadable: %s",
                            meta.path or "/", exc)
            return f"unreadable: {exc}"

    return await array.ctx.listings.get(("text width", *array.content), measure)


#: seconds at least between a read's rereadings of the metadata (see DecodedArray.current),
#: whatever the metadata TTL: with 0, each read of a stream would discover the store anew
RECHECK_MIN = 1.0


#: chunks one read holds at a time (bounds a read's memory whatever the chunk count)
CHUNK_BATCH = 256
#: chunks smaller than this stay cached after a streaming reader passed them (see _release)
RELEASE_MIN_BYTES = 64 << 10

#: decoded bytes one batch hop may produce; larger chunks go one hop each, in parallel
BATCH_BYTES = 4 << 20


def _chunk_part(chunks: tuple[int, ...], idx: tuple[int, ...], box: Box) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """(where in chunk ``idx``, where in ``box``) of the elements they share; None if none."""
    lo, hi = box
    src, dst = [], []
    for lo_, h, i, c in zip(lo, hi, idx, chunks, strict=True):
        o = i * c
        a, b = max(lo_, o), min(h, o + c)
        if a >= b:
            return None
        src.append(slice(a - o, b - o))
        dst.append(slice(a - lo_, b - lo_))
    return tuple(src), tuple(dst)


def _contiguous_part(
    meta: ArrayMeta, idx: tuple[int, ...], chunk: np.ndarray, start: int, stop: int, boxes: list[Box]
) -> memoryview | None:
    """Elements [start, stop) of the array, all inside chunk ``idx``, as a view of the chunk's
    memory when they lie there in one run; None when they must be gathered."""
    if not chunk.flags.c_contiguous:  # a broadcast fill chunk
        return None
    if meta.chunks[1:] == meta.shape[1:]:  # the chunk is a slab of whole rows: C order within it too
        base = idx[0] * meta.chunks[0] * math.prod(meta.shape[1:]) if meta.ndim else 0
        item = chunk.dtype.itemsize
        return byte_view(chunk)[(start - base) * item : (stop - base) * item]
    if len(boxes) == 1:
        where = _chunk_part(meta.chunks, idx, boxes[0])
        part = chunk[(*where[0], Ellipsis)] if where else chunk  # a view, 0-d included
        if part.flags.c_contiguous:
            return byte_view(part)
    return None


#: never-written chunks among a read's first ones past which the reply is set to fill at once
LAY_FILL_MIN = 16


def _lay_fill(out: np.ndarray, chunks: Iterable[np.ndarray]) -> np.ndarray | None:
    """Set all of ``out`` to the fill value when at least LAY_FILL_MIN of ``chunks`` are
    never-written ones (one broadcast object, the array's fill chunk), and return that
    chunk: its copies are then skipped. One pass over the reply, where a read over a sparse
    array of tiny chunks copied each chunk's one element apart."""
    counts: dict[int, int] = {}
    for chunk in chunks:
        if chunk.ndim and not any(chunk.strides):
            n = counts[id(chunk)] = counts.get(id(chunk), 0) + 1
            if n >= LAY_FILL_MIN:
                # cast as each chunk's copy casts (an array's, not a scalar's: a NaN put
                # into integers is not an error there)
                np.copyto(out, chunk[(slice(0, 1),) * chunk.ndim].reshape(()), casting="unsafe")
                return chunk
    return None


def _copy_chunk(
    chunks: tuple[int, ...], idx: tuple[int, ...], chunk: np.ndarray,
    boxes: list[Box], outs: list[np.ndarray],
) -> None:
    """Copy the part of chunk ``idx`` that falls in each box into that box's output."""
    for box, out in zip(boxes, outs, strict=True):
        part = _chunk_part(chunks, idx, box)
        if part is not None:
            out[part[1]] = chunk[part[0]]


class RawDataFile(FileNode):
    """``data.raw``: the whole array, C order, declared byte order, fill where never written;
    variable-length text as fixed-width Unicode (``dtype``, the width measured).

    The node in the tree reads without read-ahead; each open reads through its own copy
    (:meth:`reader`), whose sequential detector follows that open alone.
    """

    def __init__(self, array: DecodedArray, ahead: ReadAhead | None = None, dtype: np.dtype | None = None) -> None:
        self.array = array
        self.mtime_ns = array.ctx.data_mtime_ns(array.meta.path)
        self.immutable = array.ctx.immutable  # chunks may be rewritten unless declared immutable
        self._ahead = ahead
        #: the dtype served when not the declared one (variable-length text's U<n>)
        self.dtype = dtype

    @property
    def size(self) -> int:
        meta = self.array.meta
        return meta.nbytes if self.dtype is None else meta.size * self.dtype.itemsize

    def version(self) -> object:
        return self.array.content

    def outdated(self) -> bool:
        return self.array.stale()

    async def reader(self) -> FileNode:
        return type(self)(self.array, self.array.read_ahead(), self.dtype)

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        return await self.array.read_bytes(offset, length, self._ahead, self.dtype)
