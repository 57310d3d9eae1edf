"""Zarr v2: ``.zarray``/``.zgroup``/``.zattrs``/``.zmetadata`` → ArrayMeta, and chunk reads."""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

from ..codecs import VLEN_FILTER_IDS, UnknownCodecError, V2Pipeline
from ..codecs.bounded import chunk_ceiling
from ..stores.base import Store
from ._common import (
    fetch_and_decode,
    fill_scalar,
    int_tuple,
    join,
    split_dimension_names,
    vlen_fill,
)
from .keys import ZARRAY
from .meta import ArrayMeta, FormatError, checked_dtype

#: members a plain Zarr v2 .zarray must have
REQUIRED = ("zarr_format", "shape", "chunks", "dtype", "order", "fill_value")


def parse_dtype(value: Any, key: str) -> np.dtype:
    """A v2 dtype: typestr ('<f8') or structured descr list, whose fields are [name, type]
    or [name, type, shape] (a subarray field), type being a typestr or a nested list."""

    def to_descr(fields: list[Any]) -> list[tuple[Any, ...]]:
        out = []
        for f in fields:
            if not isinstance(f, list) or len(f) not in (2, 3) or not isinstance(f[0], str):
                raise TypeError(f"field {f!r} is not [name, type] or [name, type, shape]")
            kind = to_descr(f[1]) if isinstance(f[1], list) else f[1]
            if len(f) == 2:
                out.append((f[0], kind))
            else:
                out.append((f[0], kind, f[2] if isinstance(f[2], int) else tuple(f[2])))
        return out

    try:
        if isinstance(value, str):
            return checked_dtype(np.dtype(value), key)
        if isinstance(value, list):
            return checked_dtype(np.dtype(to_descr(value)), key)
    except (TypeError, ValueError) as exc:
        raise FormatError(f"{key}: unsupported dtype {value!r} ({exc})") from exc
    raise FormatError(f"{key}: unsupported dtype {value!r}")


def parse_array(
    path: str,
    zarray: Any,
    zattrs: Any,
    key: str | None = None,
    fmt: str = "zarr_v2",
) -> ArrayMeta:
    """Map a .zarray document (+ .zattrs) onto ArrayMeta; problems land in ``error``."""
    key = key or join(path, ZARRAY)
    zarray = _shuffle_of_the_type(zarray)
    meta = ArrayMeta(path=path, format=fmt, metadata_key=key, source={"zarray": zarray})
    try:
        _fill_meta(meta, zarray, zattrs, key)
    except (FormatError, UnknownCodecError) as exc:
        meta.error = str(exc) if str(exc).startswith(key) else f"{key}: {exc}"
    meta.validate()
    return meta


def _shuffle_of_the_type(zarray: Any) -> Any:
    """``zarray`` with netCDF-C's shuffle filter ``{"id": "shuffle", "elementsize": 0}`` given
    the element size it means: 0 is "the variable's type size" to netCDF-C, which shuffled
    the bytes so (in NCZarr and in pure Zarr alike), and numcodecs' shuffle of element size
    0 does nothing, so no numcodecs writer shuffles with it. Every variable netCDF4-python
    wrote with ``zlib=True`` (its shuffle is on by default) was served as its shuffled
    bytes: wrong numbers, with nothing said (zarr-python reads them so too)."""
    filters = zarray.get("filters") if isinstance(zarray, dict) else None
    if not isinstance(filters, list):
        return zarray
    try:
        size = parse_dtype(zarray.get("dtype"), ZARRAY).itemsize
    except FormatError:
        return zarray  # the v2 parse says what is wrong with it
    fixed = [
        {**f, "elementsize": size}
        if isinstance(f, dict) and f.get("id") == "shuffle" and f.get("elementsize") == 0 else f
        for f in filters
    ]
    return zarray if fixed == filters else {**zarray, "filters": fixed}


def _text_fill(fill: Any, dtype: np.dtype, text: bool = False) -> Any:
    """A bytes array's fill_value written as its text, in base64, as v2 keeps bytes.

    netCDF-C writes a char or string variable's fill_value as the text itself (">S1" with
    "#", "|S128" with "N/A") and reads it back so: each such variable was unusable ("bad
    fill_value '#' for |S1: Only base64 data is allowed"), and a text that happens to be
    base64 ("abcd") was served as other bytes. ``text``: the store says netCDF-C wrote it
    (NCZarr), so the string is text whatever it looks like; in pure Zarr nothing names the
    writer, and a string that is base64 keeps the v2 meaning (a char's one character never
    is: base64 comes in fours)."""
    if dtype.kind != "S" or not isinstance(fill, str):
        return fill
    if not text:
        try:
            base64.b64decode(fill.encode("ascii"), validate=True)
            return fill
        except (binascii.Error, UnicodeEncodeError, ValueError):
            pass
    raw = fill.encode("utf-8", "surrogateescape")
    return base64.b64encode(raw).decode("ascii") if len(raw) <= dtype.itemsize else fill


def _fill_meta(meta: ArrayMeta, zarray: Any, zattrs: Any, key: str) -> None:
    if not isinstance(zarray, dict):
        raise FormatError(f"{key}: expected a JSON object")
    if isinstance(zattrs, dict):
        meta.attributes = dict(zattrs)
    fmt = zarray.get("zarr_format", 2)
    if fmt != 2:
        raise FormatError(f"{key}: zarr_format {fmt!r} is not 2")
    # the v2 spec's required members that zarr-python 2.18 and 3 both refuse a .zarray
    # without: a default for any of them serves invented data (C order for an F-ordered
    # array, zeros where the writer's fill was meant). netCDF-C, the reference for NCZarr,
    # is not held to it here.
    required = ("shape", "chunks", "dtype") if meta.format == "nczarr" else REQUIRED
    for field in required:
        if field not in zarray:
            raise FormatError(f"{key}: missing {field!r}")
    meta.shape = int_tuple(zarray["shape"], "shape", key)
    meta.chunks = int_tuple(zarray["chunks"], "chunks", key)
    meta.dimension_names = split_dimension_names(meta.attributes, len(meta.shape))
    meta.dtype = parse_dtype(zarray["dtype"], key)
    order = zarray.get("order", "C")
    if order not in ("C", "F"):
        raise FormatError(f"{key}: order must be 'C' or 'F', got {order!r}")
    meta.order = order
    sep = zarray.get("dimension_separator")
    if sep is None:  # only null or absent: [] or "" (once read as ".") name no separator
        sep = "."
    if sep not in (".", "/"):
        raise FormatError(f"{key}: dimension_separator must be '.' or '/', got {sep!r}")
    meta.chunk_key_encoding = {"name": "v2", "separator": sep}
    compressor = zarray.get("compressor")
    filters = zarray.get("filters")
    if filters is None or filters in ("", {}):
        filters = []  # zarr-python (2 and 3) reads an empty text or object as none too
    elif not isinstance(filters, list):
        # 0 or false read as "none" (the old "or []") served the chunks without their
        # filters; zarr-python 3 refuses them
        raise FormatError(f"{key}: filters must be a list or null, got {filters!r}")
    meta.codecs = [*filters, *([compressor] if compressor is not None else [])]
    if meta.dtype.kind == "O":
        first = filters[0].get("id") if filters and isinstance(filters[0], dict) else None
        if first not in VLEN_FILTER_IDS:
            raise FormatError(f"{key}: object dtype without an object codec filter")
        meta.vlen = VLEN_FILTER_IDS[first]
    fill = _text_fill(zarray.get("fill_value"), meta.dtype, text=meta.format == "nczarr")
    if fill is None and meta.dtype.kind in "Mm":
        # null leaves unwritten elements undefined in the v2 spec; zarr-python 3, which
        # writes null by default, reads its dtype's default there: NaT for times (zero, as
        # zvfs serves for null, for every other dtype)
        fill = "NaT"
    meta.fill_value = (vlen_fill(fill, meta.vlen, key) if meta.vlen is not None
                       else fill_scalar(fill, meta.dtype, key, zarr_format=2))
    V2Pipeline(compressor, filters)  # fail now, not at the first chunk, on unknown codecs


def chunk_key(meta: ArrayMeta, idx: tuple[int, ...]) -> str:
    """Store key of chunk ``idx`` ('0' for a 0-d array)."""
    sep = meta.chunk_key_encoding.get("separator", ".")
    name = sep.join(str(i) for i in idx) if idx else "0"
    return join(meta.path, name)


class Reader:
    """Fetch + decode v2 chunks of one array (thread-safe: no mutable state). ``pipeline``
    is given for arrays whose chunks are v2's but whose metadata is not a .zarray (the
    Zarr v1 storage spec's)."""

    def __init__(self, store: Store, meta: ArrayMeta, pipeline: V2Pipeline | None = None):
        self.store = store
        self.meta = meta
        if pipeline is None:
            zarray = meta.source["zarray"]
            pipeline = V2Pipeline(zarray.get("compressor"), zarray.get("filters"))
        self.pipeline = pipeline

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        return chunk_key(self.meta, idx)

    def stored_index(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        return idx

    def exists(self, idx: tuple[int, ...]) -> bool:
        return self.store.exists(self.chunk_key(self.stored_index(idx)))

    def read(self, idx: tuple[int, ...]) -> np.ndarray | None:
        """Decoded chunk of the full stored chunk shape, or None if it was never written."""
        return fetch_and_decode(
            self.store,
            self.chunk_key(self.stored_index(idx)),
            lambda data: self.pipeline.decode(data, self.stored_chunks, self.meta.dtype, self.meta.order),
            chunk_ceiling(self.meta.dtype, math.prod(self.stored_chunks)),
        )

    @property
    def stored_chunks(self) -> tuple[int, ...]:
        return self.meta.chunks
