"""Decompression with a ceiling: a chunk never inflates past what its array can hold.

A few KiB of deflate, bz2, xz or zstd can stand for gigabytes of zeros. The
plain decoders (``zlib.decompress``, ``bz2.decompress``, numcodecs' zstd)
produce all of it before anyone can check the size, so one hostile chunk could
take the daemon's memory. Here deflate, gzip, bz2 and lzma are decompressed in
bounded calls, and the sizes that a zstd frame, an lz4 chunk or a blosc frame
declare are checked before decoding (a zstd frame without one, which
zarr-python never writes, cannot be bounded and is decoded as before).
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

from .errors import CodecError

ZLIB, GZIP = zlib.MAX_WBITS, 16 + zlib.MAX_WBITS
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def ceiling(nbytes: int) -> int:
    """Most bytes a compressor may yield for a chunk whose array bytes are ``nbytes``:
    room for filters that widen data (astype, packbits) and for checksums."""
    return nbytes * 8 + (1 << 20)


#: most bytes a chunk of variable-length items (strings, bytes) may be stored as or decode
#: to: no size is declared for it, and one of 8 items then 512 MiB of zeros, 3 KiB of bz2,
#: was inflated whole, and read (a helper's audit). Such a bomb now costs a worker about
#: this much as it is refused (see STEP), where a legitimate chunk is rarely a tenth of it
VLEN_CEILING = 128 << 20


def chunk_ceiling(dtype: Any, items: int) -> int:
    """The ceiling of a chunk of ``items`` elements of ``dtype``, stored or decoded: of its
    bytes (:func:`ceiling`), or VLEN_CEILING for variable-length elements (object dtype)."""
    return VLEN_CEILING if dtype.kind == "O" else ceiling(items * dtype.itemsize)


def inflate(data: bytes | memoryview, wbits: int, limit: int | None, name: str) -> bytes:
    """zlib (``ZLIB``) or gzip (``GZIP``, concatenated members too) data, at most ``limit`` bytes.

    Like ``zlib.decompress``/``gzip.decompress``: the stream's checksum is verified,
    and an unfinished stream is an error.
    """
    # zlib ignores trailing bytes; gzip allows zero padding after the last member
    return _streams(data, lambda: zlib.decompressobj(wbits), limit, name, errors=(zlib.error,),
                    more=lambda rest: wbits == GZIP and bool(rest.strip(b"\0")))


#: bytes a stream decoder yields a call: a bomb stops within one step past its limit, where
#: one call to the limit held twice the limit as it stopped (its growing buffer, then the
#: result)
STEP = 16 << 20


def _streams(data: bytes | memoryview, make: Callable[[], Any], limit: int | None, name: str, *,
             errors: tuple[type[Exception], ...] = (OSError, EOFError, ValueError),
             more: Callable[[bytes], bool] = bool) -> bytes:
    """Streams of one format, one after another while ``more(rest)``, at most ``limit``
    bytes in all, decompressed STEP bytes a call (zlib keeps the input it has not read in
    ``unconsumed_tail``; bz2 and lzma keep it themselves), so a bomb stops at the limit
    instead of filling memory. bz2 raises OSError, lzma LZMAError."""
    rest = bytes(data)
    parts: list[bytes] = []
    total = 0
    while True:
        d = make()
        pending = rest
        while True:
            want = STEP if limit is None else min(STEP, limit - total + 1)
            try:
                out = d.decompress(pending, want)
            except errors as exc:
                raise CodecError(f"{name}: {exc}") from exc
            total += len(out)
            if limit is not None and total > limit:
                raise CodecError(f"{name}: decompresses to more than {limit} bytes; not a chunk of this array")
            parts.append(out)
            if d.eof:
                break
            pending = getattr(d, "unconsumed_tail", b"")
            if not out and not pending:  # every byte read, and no end: more was to come
                raise CodecError(f"{name}: compressed stream is truncated")
        rest = d.unused_data
        if not more(rest):
            parts = [p for p in parts if p]
            return parts[0] if len(parts) == 1 else b"".join(parts)


def bunzip(data: bytes | memoryview, limit: int | None) -> bytes:
    """bz2 data, at most ``limit`` bytes (numcodecs' bz2 decodes with bz2.decompress)."""
    return _streams(data, bz2.BZ2Decompressor, limit, "bz2")


def unxz(data: bytes | memoryview, limit: int | None, format: int, filters: Any) -> bytes:
    """lzma data of numcodecs' ``format`` and ``filters``, at most ``limit`` bytes.
    Filters belong to the raw format alone: numcodecs fails any other given them, where
    zvfs read the chunk as if they were not there."""
    if filters is not None and format != lzma.FORMAT_RAW:
        raise CodecError(f"lzma: filters {filters!r} are for format {lzma.FORMAT_RAW} (raw) only, not {format!r}")
    if format == lzma.FORMAT_RAW:
        return _streams(data, lambda: lzma.LZMADecompressor(format, filters=filters), limit, "lzma")
    return _streams(data, lambda: lzma.LZMADecompressor(format), limit, "lzma")


def check_lz4(data: bytes | memoryview, limit: int | None) -> None:
    """Refuse a numcodecs lz4 chunk whose header (4 bytes, little-endian) declares more
    than ``limit`` bytes: the decoder allocates what the header says."""
    if limit is not None and len(data) >= 4:
        declared = int.from_bytes(bytes(data[:4]), "little")
        if declared > limit:
            raise CodecError(f"lz4: header declares {declared} bytes, more than {limit}; not a chunk of this array")


def zstd_content_size(data: bytes | memoryview) -> int | None:
    """The decompressed size the zstd frames of ``data`` declare together (RFC 8878): None
    if one declares none. Every frame counts, skippable ones skipped: numcodecs decodes them
    all, and a first frame of 64 bytes before one of 512 MiB passed a check of the first
    alone (a helper's audit). The walk stops at bytes that are no frame (the decoder fails
    there, after the frames before)."""
    buf = memoryview(data).cast("B")
    end, pos, total = len(buf), 0, 0
    while end - pos >= 8:
        magic = bytes(buf[pos:pos + 4])
        if magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50:  # skippable: its length, then that many
            pos += 8 + int.from_bytes(buf[pos + 4:pos + 8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            break
        fhd = buf[pos + 4]
        single = (fhd >> 5) & 1
        size = (single, 2, 4, 8)[fhd >> 6]
        if size == 0:
            return None
        at = pos + 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
        if end < at + size:
            break
        value = int.from_bytes(buf[at:at + size], "little")
        total += value + 256 if size == 2 else value
        pos = at + size
        while end - pos >= 3:  # the blocks: 3-byte headers, raw and compressed ones followed by their size
            head = int.from_bytes(buf[pos:pos + 3], "little")
            pos += 3 + (1 if (head >> 1) & 3 == 1 else head >> 3)
            if head & 1:
                break
        else:
            break
        pos += 4 if (fhd >> 2) & 1 else 0  # the content checksum
    return total


def check_zstd(data: bytes | memoryview, limit: int | None, name: str) -> None:
    """Refuse zstd frames that declare more than ``limit`` bytes together."""
    declared = zstd_content_size(data) if limit is not None else None
    if limit is not None and declared is not None and declared > limit:
        raise CodecError(f"{name}: frames declare {declared} bytes, more than {limit}; not a chunk of this array")
