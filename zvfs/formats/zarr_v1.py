"""Zarr v1, the original persistence format.

An array is a directory with ``__zmeta__`` (JSON: shape, chunks, dtype,
fill_value, cname, clevel, shuffle, optionally order), ``__zattr__`` (JSON user
attributes) and ``__zdata__/<i>.<j>.blosc``, each chunk one blosc frame.
There are no groups. A missing chunk file means fill_value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import decode_blosc_chunk
from ..codecs.bounded import ceiling
from ..stores.base import Store
from ._common import fetch_and_decode, fill_scalar, int_tuple, join
from .keys import ZDATA, ZMETA
from .meta import ArrayMeta, FormatError
from .zarr_v2 import parse_dtype


def parse_array(path: str, zmeta: Any, zattr: Any, key: str | None = None) -> ArrayMeta:
    """Map a __zmeta__ document (+ __zattr__) onto ArrayMeta; problems land in ``error``."""
    key = key or join(path, ZMETA)
    meta = ArrayMeta(path=path, format="zarr_v1", metadata_key=key, source={"zmeta": zmeta})
    try:
        if not isinstance(zmeta, dict):
            raise FormatError(f"{key}: expected a JSON object")
        if isinstance(zattr, dict):
            meta.attributes = dict(zattr)
        for field in ("shape", "chunks", "dtype"):
            if field not in zmeta:
                raise FormatError(f"{key}: missing {field!r}")
        meta.shape = int_tuple(zmeta["shape"], "shape", key)
        meta.chunks = int_tuple(zmeta["chunks"], "chunks", key)
        meta.dtype = parse_dtype(zmeta["dtype"], key)
        if meta.dtype.kind == "O":
            raise FormatError(f"{key}: object dtype is not supported in Zarr v1")
        meta.order = zmeta.get("order", "C")
        if meta.order not in ("C", "F"):
            raise FormatError(f"{key}: order must be 'C' or 'F'")
        compression = zmeta.get("compression", "blosc")
        if compression != "blosc":
            raise FormatError(f"{key}: unsupported compression {compression!r}")
        opts = zmeta.get("compression_opts") or {}
        meta.codecs = [
            {
                "id": "blosc",
                "cname": zmeta.get("cname", opts.get("cname", "blosclz")),
                "clevel": zmeta.get("clevel", opts.get("clevel", 5)),
                "shuffle": zmeta.get("shuffle", opts.get("shuffle", 1)),
            }
        ]
        meta.chunk_key_encoding = {"name": "zarr_v1", "separator": ".", "suffix": ".blosc"}
        meta.fill_value = fill_scalar(zmeta.get("fill_value"), meta.dtype, key)
    except FormatError as exc:
        meta.error = str(exc)
    meta.validate()
    return meta


def chunk_key(meta: ArrayMeta, idx: tuple[int, ...]) -> str:
    name = ".".join(str(i) for i in idx) if idx else "0"
    return join(meta.path, f"{ZDATA}/{name}.blosc")


class Reader:
    """Fetch + decode v1 chunks (stateless, thread-safe)."""

    def __init__(self, store: Store, meta: ArrayMeta):
        self.store = store
        self.meta = meta

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        return chunk_key(self.meta, idx)

    def exists(self, idx: tuple[int, ...]) -> bool:
        return self.store.exists(self.chunk_key(idx))

    def read(self, idx: tuple[int, ...]) -> np.ndarray | None:
        return fetch_and_decode(
            self.store,
            self.chunk_key(idx),
            lambda data: decode_blosc_chunk(data, self.meta.chunks, self.meta.dtype, self.meta.order),
            ceiling(self.meta.chunk_nbytes),
        )
