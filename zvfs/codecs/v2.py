"""Zarr v2 (and v1) chunk decoding: one compressor plus a filter chain.

The ids are numcodecs ids, so the numcodecs registry is the decoder registry;
zvfs only adds a header check for blosc and a size check on the result.
"""

from __future__ import annotations

import math
from typing import Any

import numcodecs
import numpy as np

from . import blosc as _blosc
from . import bounded
from .errors import CodecError, UnknownCodecError
from .vlen import vlen_counted

#: object codecs: their presence makes a v2 array variable-length
VLEN_FILTER_IDS = {
    "vlen-utf8": "vlen-utf8",
    "vlen-bytes": "vlen-bytes",
    "vlen-array": "vlen-array",
    "json2": "json",
    "msgpack2": "msgpack",
    "pickle": "pickle",
}


#: codecs never run on a store's bytes: unpickling runs whatever code the bytes name, so a
#: chunk of a hostile store would run in the daemon (as root, for a system mount)
REFUSED_IDS = frozenset({"pickle"})


def get_codec(config: dict[str, Any]) -> Any:
    """numcodecs codec for a v2 compressor/filter config; UnknownCodecError if unknown or
    refused (REFUSED_IDS)."""
    if not isinstance(config, dict) or not isinstance(config.get("id"), str):
        raise UnknownCodecError(f"malformed codec configuration {config!r}")
    if config["id"] in REFUSED_IDS:
        raise UnknownCodecError(f"codec {config['id']!r} is refused: decoding it would run code "
                                "the store's bytes name")
    try:
        return numcodecs.get_codec(dict(config))
    except Exception as exc:  # ValueError for unknown ids, TypeError for bad options
        if isinstance(exc, ValueError) and "codec not available" in str(exc):
            # said in numcodecs' own words, the id came quoted twice (0.16: "''lz5''")
            raise UnknownCodecError(f"unsupported codec {config['id']!r}: numcodecs "
                                    f"{numcodecs.__version__} has no codec of that id") from exc
        raise UnknownCodecError(f"unsupported codec {config.get('id')!r}: {exc}") from exc


def v1_compressor(compression: Any, options: Any) -> dict[str, Any] | None:
    """The v2 compressor configuration of a Zarr v1 ``compression`` and ``compression_opts``
    (None: stored raw), made as zarr's migrate_1to2 makes it, the reference for v1 data:
    the numcodecs class of that id, given the options as keywords (an object) or as its
    one positional argument (anything else, a level for zlib, bz2 and lzma). So the v1
    array decodes through the v2 pipeline, with the same codec objects."""
    if compression is None or compression == "none":
        return None
    if not isinstance(compression, str) or compression in VLEN_FILTER_IDS:
        raise UnknownCodecError(f"unsupported compression {compression!r}")
    cls = numcodecs.registry.codec_registry.get(compression)
    if cls is None:
        raise UnknownCodecError(f"unsupported compression {compression!r}")
    try:
        codec = cls(**options) if isinstance(options, dict) else cls(options)
        return dict(codec.get_config())
    except Exception as exc:  # TypeError, ValueError: options the codec does not take
        raise UnknownCodecError(
            f"compression {compression!r} with compression_opts {options!r}: {exc}"
        ) from exc


#: numcodecs compressors that decode_bounded bounds (as a compressor or as a filter)
BOUNDED_IDS = frozenset({"zlib", "gzip", "bz2", "lzma", "zstd", "lz4", "blosc"})
#: the object codecs (of VLEN_FILTER_IDS) whose chunk begins with its item count, a u32:
#: checked against the chunk's before numcodecs makes an array of that many
VLEN_IDS = frozenset({"vlen-utf8", "vlen-bytes", "vlen-array"})


def decode_bounded(codec: Any, codec_id: str | None, data: Any, limit: int | None) -> Any:
    """A numcodecs compressor's decode, bounded to ``limit`` bytes for the ones that can
    expand past it (BOUNDED_IDS); see :mod:`zvfs.codecs.bounded`."""
    if codec_id == "zlib":
        return bounded.inflate(data, bounded.ZLIB, limit, "zlib")
    if codec_id == "gzip":
        return bounded.inflate(data, bounded.GZIP, limit, "gzip")
    if codec_id == "bz2":
        return bounded.bunzip(data, limit)
    if codec_id == "lzma":
        return bounded.unxz(data, limit, codec.format, codec.filters)
    if codec_id == "blosc":
        return _blosc.decompress(data, max_nbytes=limit)
    if codec_id == "zstd":
        bounded.check_zstd(data, limit, "zstd")
    elif codec_id == "lz4":
        bounded.check_lz4(data, limit)
    return codec.decode(bytes(data))


def _buffer(chunk: Any) -> Any:
    """What a previous step gave (bytes, or an array of any dtype) as bytes to decompress."""
    return chunk if isinstance(chunk, (bytes, memoryview)) else memoryview(np.ascontiguousarray(chunk)).cast("B")


class V2Pipeline:
    """Decoder for one v2 array: compressor first, then filters in reverse."""

    def __init__(self, compressor: dict[str, Any] | None, filters: list[dict[str, Any]] | None):
        self.compressor_config = compressor
        self.compressor = get_codec(compressor) if compressor is not None else None
        self.filters = [get_codec(f) for f in (filters or [])]
        self._filter_ids = [f.get("id") for f in (filters or [])]
        self._id = compressor.get("id") if compressor is not None else None
        self._blosc = self._id == "blosc"

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, order: str = "C"
    ) -> np.ndarray:
        """Encoded chunk bytes → C-ordered array of ``shape`` and ``dtype``."""
        expected = math.prod(shape)
        try:
            limit = bounded.chunk_ceiling(dtype, expected)
            if self.compressor is None:
                chunk: Any = data
            elif self._blosc:
                chunk = _blosc.decompress(data, max_nbytes=limit)
            else:
                chunk = decode_bounded(self.compressor, self._id, data, limit)
            for f, fid in zip(reversed(self.filters), reversed(self._filter_ids), strict=True):
                if fid in BOUNDED_IDS:  # a compressor among the filters, bounded like the compressor
                    chunk = decode_bounded(f, fid, _buffer(chunk), limit)
                elif fid in VLEN_IDS:  # the object codec: as many items as the chunk has
                    chunk = f.decode(vlen_counted(_buffer(chunk), expected))
                else:
                    chunk = f.decode(chunk)
        except CodecError:
            raise
        except Exception as exc:
            raise CodecError(f"decode failed: {exc}") from exc
        if dtype.kind == "O":
            arr = np.asarray(chunk, dtype=object).reshape(-1)
            if arr.size != expected:
                raise CodecError(f"decoded {arr.size} items, expected {expected}")
        else:
            arr = numcodecs.compat.ensure_ndarray(chunk).reshape(-1, order="A")
            if dtype.kind == "U" and dtype.itemsize == 4 and arr.nbytes == expected != 0:
                arr = _one_byte_chars(arr, dtype)
            if arr.dtype != dtype:
                if arr.nbytes != expected * dtype.itemsize:
                    raise CodecError(
                        f"decoded {arr.nbytes} bytes, expected {expected * dtype.itemsize}"
                    )
                arr = arr.view(dtype)
            elif arr.size != expected:
                raise CodecError(f"decoded {arr.size} items, expected {expected}")
        return np.require(arr.reshape(shape, order=order), requirements="C")


def _one_byte_chars(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A "<U1" chunk of one byte an element, as ``dtype``: netCDF-C 4.9 writes a char
    variable so in pure-Zarr mode (and reads it back so), where Zarr's "<U1" takes four
    bytes (zarr-python cannot read it). Such a chunk failed every read (EIO, "decoded 18
    bytes, expected 72"); each byte is its character now, as netCDF-C reads it. A chunk
    of any other size is still an error."""
    return arr.view(np.uint8).astype(np.dtype("u4").newbyteorder(dtype.byteorder)).view(dtype)


def decode_blosc_chunk(
    data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype, order: str = "C"
) -> np.ndarray:
    """A Zarr v1 chunk: one blosc frame of raw elements in ``order``."""
    expected = math.prod(shape) * dtype.itemsize
    raw = _blosc.decompress(data, max_nbytes=expected)
    if len(raw) != expected:
        raise CodecError(f"decoded {len(raw)} bytes, expected {expected}")
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape, order=order)
    return np.require(arr, requirements="C")
