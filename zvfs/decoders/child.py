"""One decoder process: reads chunks from the store and decodes them into the shared arena.

Forked by the zygote (:mod:`zvfs.decoders.zygote`) when the daemon asks, with its two
pipes, the arena's descriptor and how to open the store (:class:`zvfs.stores.base.Reopen`).
It opens the store itself (the same escape rules: this is the same DirectoryStore or
ZipStore code), tells the daemon it is ready, then answers requests one at a time, in
order, until its input ends (the daemon closed it, or died: then this process ends too).

Each request names the array by path and by the digest of its normalized metadata. The
process reads that metadata itself and serves the request only if its digest is the
same; otherwise it answers "stale" and the daemon decodes that chunk in its threads.
What the store counted (requests, bytes, latency) goes back with each answer, so the
mount's stats.json counts this process's reads too.
"""

from __future__ import annotations

import os
import select
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from zvfs.stats import Counters
from zvfs.stores.base import Store
from zvfs.stores.open_files import IDLE_SECONDS

if TYPE_CHECKING:  # imported by the zygote's preload (at nice 10), not by this module's import
    import numpy as np

    from zvfs.formats import ZarrArray

#: arrays kept open (their shard indexes cached), least recently used dropped
OPEN_ARRAYS = 64


class Tally(Counters):
    """What the store and the codecs counted since the last answer, for the daemon to add."""

    def __init__(self) -> None:
        super().__init__()
        self.adds: dict[str, float] = {}
        self.observed: list[tuple[str, float]] = []

    def add(self, name: str, amount: float = 1) -> None:
        self.adds[name] = self.adds.get(name, 0) + amount

    def observe(self, name: str, seconds: float) -> None:
        self.observed.append((name, seconds))

    def drain(self) -> tuple[dict[str, float], list[tuple[str, float]]]:
        out = (self.adds, self.observed)
        self.adds, self.observed = {}, []
        return out


def die_with_parent() -> None:
    """Linux: end when the daemon ends, even if it is killed before it closes our input."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def open_store(kind: str, path: str, fingerprint: tuple[int, ...], tally: Tally) -> Store:
    """The store the daemon has, opened here; raises SourceError when it is not the same."""
    from zvfs.stores.base import SourceError
    from zvfs.stores.counting import CountingStore

    store: Store
    if kind == "directory":
        from zvfs.stores.directory import DirectoryStore

        store = DirectoryStore(path)
    elif kind == "zip":
        from zvfs.stores.zip import ZipStore

        st = os.stat(path)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != tuple(fingerprint):
            raise SourceError(f"{path} changed since it was mounted")
        store = ZipStore(path, counters=tally)
    else:
        raise SourceError(f"no decoder process for a {kind} store")
    return CountingStore(store, tally)


class Decoder:
    """The request loop's state: the store, the arena, the arrays open."""

    def __init__(self, store: Store, arena: np.ndarray) -> None:
        self.store = store
        self.arena = arena
        self.arrays: OrderedDict[tuple[str, str, int], ZarrArray] = OrderedDict()

    def _array(self, path: str, digest: str, epoch: int) -> ZarrArray | None:
        """The array at ``path`` if its metadata is the daemon's; None when it is not."""
        from zvfs import formats

        key = (path, digest, epoch)
        arr = self.arrays.get(key)
        if arr is None:
            meta = formats.read_array_meta(self.store, path)
            if meta is None or meta.digest() != digest:
                return None
            arr = self.arrays[key] = formats.open_array(self.store, path, meta)
            while len(self.arrays) > OPEN_ARRAYS:
                self.arrays.popitem(last=False)
        self.arrays.move_to_end(key)
        return arr

    def decode(self, path: str, digest: str, epoch: int, idx: tuple[int, ...],
               offset: int, nbytes: int) -> tuple[str, str]:
        """(status, message): "ok" (the chunk is in the slot), "fill" (never written),
        "stale" (the metadata differs here), "data" (bad bytes) or "store" (a failure
        that may pass)."""
        import numpy as np

        from zvfs.codecs.blosc import buffers_from
        from zvfs.stores.base import is_store_failure

        try:
            arr = self._array(path, digest, epoch)
            if arr is None:
                return "stale", ""
            slot = self.arena[offset:offset + nbytes]
            lent = [slot]  # lent once: a second frame in the pipeline gets fresh memory

            def take(n: int) -> np.ndarray | None:
                return lent.pop() if lent and n == nbytes else None

            with buffers_from(take):
                chunk = arr.read_chunk(idx)
            if chunk is arr.fill_chunk():
                return "fill", ""
            if chunk.nbytes != nbytes:
                return "data", f"{arr.chunk_key(idx)}: decoded {chunk.nbytes} bytes, expected {nbytes}"
            if not (chunk.flags.c_contiguous and chunk.ctypes.data == slot.ctypes.data):
                np.copyto(slot.view(chunk.dtype).reshape(chunk.shape), chunk)
            return "ok", ""
        except Exception as exc:  # noqa: BLE001 - one chunk's failure, told to the daemon
            return ("store" if is_store_failure(exc) else "data"), str(exc) or type(exc).__name__


def serve(inp: int, out: int, arena_fd: int, nbytes: int,
          spec: tuple[str, str, tuple[int, ...]]) -> int:
    """Open the store ``spec`` names ((kind, path, fingerprint)), say so on ``out``, then
    answer the requests read from ``inp`` until it ends. Runs in a process the zygote
    forked (:mod:`zvfs.decoders.zygote`), which imported what this needs already."""
    die_with_parent()
    import mmap

    from zvfs.decoders.wire import pack, read_message, write_all

    tally = Tally()
    try:
        import numpy as np
        from numcodecs import blosc

        blosc.use_threads = False  # one thread: the daemon runs one process per core
        arena = np.frombuffer(mmap.mmap(arena_fd, nbytes), np.uint8)
        decoder = Decoder(open_store(*spec, tally), arena)
    except Exception as exc:  # noqa: BLE001 - told to the daemon, which decodes in threads
        write_all(out, pack(("failed", f"{type(exc).__name__}: {exc}")))
        return 1
    write_all(out, pack(("ready", os.getpid())))
    while True:
        if not select.select([inp], [], [], IDLE_SECONDS)[0]:
            decoder.store.close_idle()  # as the daemon does (zvfs.daemon.close_idle_handles)
        request = read_message(inp)
        if request is None:
            return 0
        rid, *args = request
        t0 = time.perf_counter()
        status, message = decoder.decode(*args)
        tally.add("decode_seconds", time.perf_counter() - t0)
        write_all(out, pack((rid, status, message, *tally.drain())))
