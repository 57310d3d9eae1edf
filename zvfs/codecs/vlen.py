"""Variable-length element codecs (vlen-utf8, vlen-bytes) shared by Zarr v2 and v3.

Layout: little-endian u32 item count, then for each item a u32 length and its bytes.
"""

from __future__ import annotations

import struct

import numpy as np

from .errors import CodecError

_U32 = struct.Struct("<I")


def decode_vlen(data: bytes | memoryview, count: int, utf8: bool) -> np.ndarray:
    """Decode ``count`` items into a 1-d object array of str (utf8) or bytes."""
    buf = memoryview(data)
    if len(buf) < 4:
        raise CodecError("vlen chunk shorter than its header")
    (n,) = _U32.unpack_from(buf, 0)
    if n != count:
        raise CodecError(f"vlen chunk holds {n} items, expected {count}")
    out = np.empty(count, dtype=object)
    pos = 4
    for i in range(count):
        if pos + 4 > len(buf):
            raise CodecError("vlen chunk truncated")
        (ln,) = _U32.unpack_from(buf, pos)
        pos += 4
        if pos + ln > len(buf):
            raise CodecError("vlen chunk truncated")
        raw = bytes(buf[pos : pos + ln])
        pos += ln
        if utf8:
            try:
                out[i] = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CodecError(f"vlen-utf8: {exc}") from exc
        else:
            out[i] = raw
    return out
