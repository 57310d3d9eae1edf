"""A decoded chunk's values as the views serve them: cast to the dtype a view declares,
variable-length text made fixed-width, and laid out as C-order bytes.

Pure numpy on arrays in memory: no I/O, no mount state. The decoded arrays
(:mod:`zvfs.views.arrays`), the netCDF file and the v2 mirror share these, so a value reads
the same through every view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zvfs.formats.meta import ArrayMeta
from zvfs.views.layout import range_boxes

#: the variable-length kinds whose values are text, served fixed-width once measured. Not
#: vlen-bytes: binary values (Zarr Vectors' links) end in NUL bytes that fixed-width padding
#: cannot be told from
TEXT_VLEN_KINDS = frozenset({"vlen-utf8"})
#: what a chunk of text may take once fixed-width (Zarr's own chunk bound)
TEXT_CHUNK_LIMIT = 2**32


def is_text_vlen(meta: ArrayMeta) -> bool:
    """Whether ``meta``'s array holds variable-length text (served once its width is known)."""
    return meta.vlen in TEXT_VLEN_KINDS and meta.error is None


def convert_chunk(
    chunk: np.ndarray, dtype: np.dtype, into: Callable[[int], np.ndarray | None] | None = None
) -> np.ndarray:
    """``chunk`` as ``dtype``; a broadcast fill chunk (all strides 0) stays a broadcast, and
    integers of the same size and byte order (uint8 as netCDF's byte) are a view, not a copy.

    ``into(nbytes)`` may lend the result's memory (a uint8 buffer of exactly that size, or
    None): the buffer pool. A conversion is always a casting copy, never ``byteswap(inplace=
    True)``: numpy holds the GIL through a byteswap (the trio thread waited on 256 of them,
    about 46 ms, for a netCDF read of the 256 MiB array) and lets it go through a cast, which
    also runs twice as fast (37 against 67 µs a MiB here)."""
    src = chunk.dtype
    if src.kind == "O" or (src.kind == "U" and dtype.kind == "S"):  # text re-encoded
        return text_chunk(chunk, dtype)
    if src.kind in "iub" and dtype.kind in "iu" and src.itemsize == dtype.itemsize and (
            src.itemsize == 1 or src.str[0] == dtype.str[0]):
        return chunk.view(dtype)
    if chunk.ndim and not any(chunk.strides):
        return np.broadcast_to(chunk.reshape(-1)[:1].astype(dtype).reshape(()), chunk.shape)
    buf = into(chunk.size * dtype.itemsize) if into is not None else None
    if buf is None:
        return chunk.astype(dtype)
    out = buf.view(dtype).reshape(chunk.shape)
    np.copyto(out, chunk, casting="unsafe")  # astype's casting
    return out


def _values(chunk: np.ndarray) -> list[str | bytes]:
    """Each value of a text chunk (fixed-width Unicode, vlen-utf8's str, vlen-bytes' bytes)."""
    return [v if isinstance(v, str) else bytes(v) for v in chunk.reshape(-1).tolist()]


def _encoded(values: list[str | bytes]) -> list[bytes]:
    """Each value's bytes: text as UTF-8, bytes as they are."""
    return [v.encode("utf-8") if isinstance(v, str) else v for v in values]


@dataclass(frozen=True)
class TextWidth:
    """The longest value of a text array: in UTF-8 bytes (netCDF's char, ``S<n>``) and in
    characters (numpy's ``U<n>``); a value of bytes counts a character a byte."""

    utf8: int
    chars: int


def text_width(chunk: np.ndarray) -> TextWidth:
    """The longest value of ``chunk`` (see :class:`TextWidth`); a broadcast fill chunk's one
    value is measured once."""
    if chunk.size and chunk.ndim and not any(chunk.strides):
        chunk = chunk.reshape(-1)[:1]
    values = _values(chunk)
    return TextWidth(max(map(len, _encoded(values)), default=0), max(map(len, values), default=0))


class TooWide(ValueError):
    """A text value wider than the fixed width it is served in (see :func:`text_chunk`)."""


def text_chunk(chunk: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Text values (fixed-width Unicode, variable-length str) as ``dtype``: ``S<n>``, each
    value's UTF-8 bytes, NUL-padded; or ``U<n>``, its characters. numpy's own cast to S
    encodes ASCII and fails on any other character, and either cast cuts a longer value
    without a word: here a value longer than the width is :class:`TooWide` (the width was
    measured before the array changed)."""
    if chunk.size and chunk.ndim and not any(chunk.strides):  # a broadcast fill chunk: one value
        return np.broadcast_to(text_chunk(chunk.reshape(-1)[:1], dtype).reshape(()), chunk.shape)
    values = _values(chunk)
    if dtype.kind == "S":
        values, room, unit = _encoded(values), dtype.itemsize, "bytes"
    else:
        room, unit = dtype.itemsize // 4, "characters"
    longest = max(map(len, values), default=0)
    if longest > room:
        raise TooWide(f"a value of {longest} {unit}, wider than the {room} it is served in "
                      "(measured before the array changed)")
    return np.array(values, dtype=dtype).reshape(chunk.shape)


def byte_view(a: np.ndarray) -> memoryview:
    """The C-order bytes of ``a`` without a copy when it is contiguous.

    Through a uint8 view, not ``memoryview(a)``: datetime64/timedelta64 arrays
    have no buffer interface.
    """
    flat = np.ascontiguousarray(a).reshape(-1)  # 1-d, so 0-d arrays work too
    return memoryview(flat.view(np.uint8))


def region_bytes(a: np.ndarray, offset: int, length: int) -> bytes:
    """Bytes [offset, offset+length) of ``a`` in C order, copying only that range
    (a broadcast fill chunk of 1 GiB is never materialised for a 4 KiB read)."""
    item = a.dtype.itemsize
    total = a.size * item
    end = min(total, offset + length)
    if offset >= end:
        return b""
    if a.flags.c_contiguous:
        return bytes(byte_view(a)[offset:end])
    first, last = offset // item, -(-end // item)
    if a.ndim == 0:
        data = a.tobytes()
    else:
        data = b"".join(a[tuple(slice(x, y) for x, y in zip(lo, hi, strict=True))].tobytes()
                        for lo, hi in range_boxes(a.shape, first, last))
    skip = offset - first * item
    return data[skip : skip + (end - offset)]
