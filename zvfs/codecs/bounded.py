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


def inflate(data: bytes | memoryview, wbits: int, limit: int | None, name: str) -> bytes:
    """zlib (``ZLIB``) or gzip (``GZIP``, concatenated members too) data, at most ``limit`` bytes.

    Like ``zlib.decompress``/``gzip.decompress``: the stream's checksum is verified,
    and an unfinished stream is an error.
    """
    # zlib ignores trailing bytes; gzip allows zero padding after the last member
    return _streams(data, lambda: zlib.decompressobj(wbits), limit, name, unlimited=0,
                    errors=(zlib.error,), more=lambda rest: wbits == GZIP and bool(rest.strip(b"\0")))


def _streams(data: bytes | memoryview, make: Callable[[], Any], limit: int | None, name: str, *,
             unlimited: int = -1, errors: tuple[type[Exception], ...] = (OSError, EOFError, ValueError),
             more: Callable[[bytes], bool] = bool) -> bytes:
    """Streams of one format, one after another while ``more(rest)``, at most ``limit``
    bytes in all: each is decompressed with a ``max_length`` (``unlimited`` for none), so a
    bomb stops at the limit instead of filling memory. bz2 raises OSError, lzma LZMAError."""
    rest = bytes(data)
    parts: list[bytes] = []
    total = 0
    while True:
        d = make()
        try:
            out = d.decompress(rest, unlimited if limit is None else limit - total + 1)
        except errors as exc:
            raise CodecError(f"{name}: {exc}") from exc
        total += len(out)
        if limit is not None and total > limit:
            raise CodecError(f"{name}: decompresses to more than {limit} bytes; not a chunk of this array")
        if not d.eof:
            raise CodecError(f"{name}: compressed stream is truncated")
        parts.append(out)
        rest = d.unused_data
        if not more(rest):
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
    """The decompressed size a zstd frame header declares, or None if it declares none."""
    head = bytes(data[:18])
    if len(head) < 5 or head[:4] != _ZSTD_MAGIC:
        return None
    fhd = head[4]
    single = (fhd >> 5) & 1
    size = (single, 2, 4, 8)[fhd >> 6]
    if size == 0:
        return None
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if len(head) < pos + size:
        return None
    value = int.from_bytes(head[pos:pos + size], "little")
    return value + 256 if size == 2 else value


def check_zstd(data: bytes | memoryview, limit: int | None, name: str) -> None:
    """Refuse a zstd frame that declares more than ``limit`` bytes."""
    declared = zstd_content_size(data)
    if limit is not None and declared is not None and declared > limit:
        raise CodecError(f"{name}: frame declares {declared} bytes, more than {limit}; not a chunk of this array")
