"""Buffers the daemon is done with, lent to the next decode or reply of the same size.

A cold decoded read writes every chunk into fresh memory, and the kernel faults that in
a page at a time: in a cold `cat data.raw` of 256 MiB that was 65,536 page faults, about
half of the daemon's system time. A streaming reader's chunks are dropped from the cache
once it has passed them (the kernel's page cache holds those bytes), so their buffers
can take the next chunks instead, already mapped; and a read assembled from several
chunks goes out from a buffer an earlier such read went out from.

A buffer is lent only when nothing refers to it any more: no cache entry, no view being
replied from, no reader's copy. Every numpy view or memoryview of a buffer holds a
reference to it, so its reference count says so exactly; a buffer still in use stays in
the pool, unlent, until it is free or the pool's bound pushes it out.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported once the decoded views load, not before the mount answers
    import numpy as np

#: smaller buffers come back from malloc's free lists already mapped: not worth keeping
MIN_BYTES = 64 << 10


def refs(bufs: list[np.ndarray], i: int) -> int:
    """References to ``bufs[i]``: :func:`unused_refs` of them when nothing but the list holds it."""
    return sys.getrefcount(bufs[i])


def unused_refs() -> int:
    """The count `refs` sees for a buffer only the pool's list holds (measured, not
    assumed: it differs between Python versions)."""
    import numpy as np

    return refs([np.empty(1, np.uint8)], 0)


def _root(value: object) -> np.ndarray | None:
    """The array that owns the memory under ``value``, if it is a whole uint8 buffer."""
    # numpy may not be imported yet, or be half-way through its import in another thread
    # (the decoded views load in the background while raw blocks come and go): then no
    # value can be one of its arrays
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    if ndarray is None or not isinstance(value, ndarray):
        return None
    root = value
    while isinstance(root.base, ndarray):
        root = root.base
    if root.base is not None or root.dtype.str != "|u1" or root.ndim != 1:
        return None
    flags = root.flags
    if not (flags.owndata and flags.writeable and flags.c_contiguous):
        return None
    return root


class BufferPool:
    """At most ``max_bytes`` of buffers kept for reuse (the oldest are let go past it).

    ``give`` runs on the trio thread (the cache dropping an entry, a read's reply made),
    ``take`` there too (a reply) and in the worker threads (a decode); a lock keeps the
    list whole between them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._bufs: list[np.ndarray] = []
        self._bytes = 0
        self._lock = threading.Lock()
        self._unused: int | None = None
        #: buffers lent (a decode or reply that needed no fresh memory)
        self.lent = 0

    def __len__(self) -> int:
        return len(self._bufs)

    def give(self, value: object) -> None:
        """Keep the memory under ``value`` (a decoded chunk the cache dropped, a reply's
        buffer) for a later decode or reply, when it is a uint8 buffer of its own; anything
        else is left to be freed."""
        root = _root(value)
        if root is None or not MIN_BYTES <= root.nbytes <= self.max_bytes:
            return
        with self._lock:
            if any(b is root for b in self._bufs):
                return
            self._bufs.append(root)
            self._bytes += root.nbytes
            while self._bytes > self.max_bytes:
                self._bytes -= self._bufs.pop(0).nbytes

    def take(self, nbytes: int) -> np.ndarray | None:
        """A kept buffer of exactly ``nbytes`` that nothing else refers to, or None. Its old
        bytes are still there: the caller overwrites all of them."""
        if nbytes < MIN_BYTES or not self._bufs:
            return None
        if self._unused is None:
            self._unused = unused_refs()
        with self._lock:
            bufs = self._bufs
            for i in range(len(bufs)):
                if bufs[i].nbytes == nbytes and refs(bufs, i) <= self._unused:
                    buf = bufs.pop(i)
                    self._bytes -= nbytes
                    self.lent += 1
                    return buf
        return None
