"""Blosc frame decoding with a header check first.

The C decompressor trusts the frame header; a corrupt header could make it read
past the buffer or allocate gigabytes. Checking the 16-byte header in Python
first turns such input into a CodecError instead.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from numcodecs import blosc as _nc_blosc

from .errors import CodecError

HEADER = struct.Struct("<BBBBIII")

#: per thread: where decompress takes its output buffers (see buffers_from)
_lender = threading.local()


@contextmanager
def buffers_from(take: Callable[[int], np.ndarray | None]) -> Iterator[None]:
    """Within the block, in this thread, frames decompress into the buffer ``take(nbytes)``
    lends (a uint8 array of exactly that size, overwritten whole), or a fresh one when it
    lends none: the caller's recycled memory, already faulted in."""
    _lender.take = take
    try:
        yield
    finally:
        _lender.take = None


def frame_sizes(data: bytes | memoryview) -> tuple[int, int]:
    """(decompressed size, compressed size) from a blosc frame header; raises CodecError."""
    if len(data) < HEADER.size:
        raise CodecError(f"blosc frame too short ({len(data)} bytes)")
    version, _vlz, _flags, typesize, nbytes, blocksize, cbytes = HEADER.unpack_from(data)
    if version not in (1, 2) or typesize == 0:
        raise CodecError(f"not a blosc frame (version {version}, typesize {typesize})")
    if cbytes < HEADER.size or cbytes > len(data):
        raise CodecError(f"blosc frame claims {cbytes} bytes but has {len(data)}")
    if nbytes and blocksize == 0:
        raise CodecError("blosc frame has zero block size")
    return nbytes, cbytes


def decompress(data: bytes | memoryview, max_nbytes: int | None = None) -> np.ndarray:
    """Decompress one blosc (v1 format) frame, validating the header first.

    The result is a writable uint8 array that the caller owns (fresh, or lent: see
    buffers_from): the frame is decompressed straight into it (no intermediate bytes
    object), and once the chunk has been converted it can be lent again (the buffer pool)."""
    nbytes, cbytes = frame_sizes(data)
    if max_nbytes is not None and nbytes > max_nbytes:
        raise CodecError(f"blosc frame decompresses to {nbytes} bytes, expected <= {max_nbytes}")
    frame = data if cbytes == len(data) else memoryview(data)[:cbytes]
    take = getattr(_lender, "take", None)
    out = take(nbytes) if take is not None else None
    if out is None:
        out = np.empty(nbytes, dtype=np.uint8)
    try:
        _nc_blosc.decompress(frame, out)
    except Exception as exc:  # numcodecs raises RuntimeError on bad frames
        raise CodecError(f"blosc: {exc}") from exc
    return out
