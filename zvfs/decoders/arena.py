"""Shared memory that decoder processes write chunks into and the daemon replies from.

One memfd, mapped by the daemon and by each process. The daemon hands out a slot per
request and the process decodes the chunk straight into it, so the decoded bytes cross
no pipe and are never copied on the daemon's side: the cache holds a numpy view of the
slot, and a read is answered from that memory.

Slots are bump-allocated and reused by exact size, as the buffer pool lends buffers
(:mod:`zvfs.cache.buffers`): a slot is free again once nothing refers to its view (no
cache entry, no reply, no request in flight), which its reference count says exactly.
A streaming reader's chunks leave the cache as it passes them, so their slots take the
next chunks, already mapped. Free slots at the top of the arena are given back to the
kernel (a hole punched in the memfd) when the arena runs out of room.
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import TYPE_CHECKING

from zvfs.cache.buffers import refs, unused_refs

if TYPE_CHECKING:  # made as the daemon mounts, before numpy is imported (at the first slot)
    import numpy as np


#: slots looked at for a free one, at most, before a new one is made: a take runs on the
#: trio thread, and a cache of 512 MiB in 64 KiB chunks is 8,192 slots
SCAN_SLOTS = 64


def _aligned(offset: int) -> int:
    """``offset`` rounded up to a page: each slot starts a page, so a slot's pages are its own."""
    return -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE


class Arena:
    """``nbytes`` of shared memory (reserved, not used: pages exist once written)."""

    def __init__(self, nbytes: int, fd: int | None = None) -> None:
        """Over memfd ``fd`` of ``nbytes`` (the arena owns it from here), or a new one."""
        self.nbytes = nbytes
        if fd is None:
            fd = os.memfd_create("zvfs-decoded", os.MFD_CLOEXEC)
        self.fd = fd
        try:
            os.ftruncate(fd, nbytes)
            self._map = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        #: the slots handed out, in the order of their offsets
        self._slots: list[np.ndarray] = []
        self._offsets: list[int] = []
        self._top = 0
        #: where the next search for a free slot starts (next fit: a streaming reader frees
        #: its slots in the order it took them)
        self._cursor = 0
        self._unused: int | None = None
        self._lock = threading.Lock()
        #: slots handed out again (memory already mapped)
        self.reused = 0

    @property
    def used(self) -> int:
        """Bytes from the arena's start to the end of its highest slot."""
        return self._top

    def take(self, nbytes: int) -> tuple[int, np.ndarray] | None:
        """A slot of exactly ``nbytes`` that nothing refers to: (its offset, its uint8 view);
        None when the arena has no room for one. The caller holds the view until the slot's
        bytes are written and no longer needed; its old bytes are still there."""
        if not 0 < nbytes <= self.nbytes:
            return None
        import numpy as np

        if self._unused is None:
            self._unused = unused_refs()
        with self._lock:
            slots = self._slots
            n = len(slots)
            for k in range(min(n, SCAN_SLOTS)):
                i = (self._cursor + k) % n
                if slots[i].nbytes == nbytes and refs(slots, i) <= self._unused:
                    self._cursor = i + 1
                    self.reused += 1
                    return self._offsets[i], slots[i]
            if _aligned(self._top) + nbytes > self.nbytes:
                self._trim()
                if _aligned(self._top) + nbytes > self.nbytes:
                    return None
            offset = _aligned(self._top)
            # an array of its own over the map, not a slice of another: numpy's views point
            # at the first array up their chain that is not itself a view of an array, so
            # every view of this slot refers to it, and its count says when it is free
            slot = np.frombuffer(self._map, np.uint8, nbytes, offset)
            slots.append(slot)
            self._offsets.append(offset)
            self._top = offset + nbytes
            return offset, slot

    def _trim(self) -> None:
        """Forget the free slots at the top and give their pages back (under the lock)."""
        slots = self._slots
        top = self._top
        while slots and refs(slots, len(slots) - 1) <= (self._unused or 0):
            slots.pop()
            top = self._offsets.pop()
        if top < self._top:
            start = _aligned(top)  # the page the slot below ends in is still its
            if start < self._top:
                self._map.madvise(mmap.MADV_REMOVE, start, self._top - start)
            self._top = top

    def close(self) -> None:
        """Unmap (once nothing refers to a slot: a view still held keeps the map) and close."""
        with self._lock:
            self._slots.clear()
            self._offsets.clear()
        try:
            self._map.close()
        except BufferError:  # a view is still out there: the map goes with it
            pass
        os.close(self.fd)
