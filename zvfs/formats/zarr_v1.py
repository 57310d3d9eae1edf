"""Zarr v1, in its two layouts. There are no groups; a missing chunk means fill_value.

- The storage specification (zarr-python 1.x, zarr's docs/spec/v1.rst): ``meta`` (JSON
  with ``"zarr_format": 1``: shape, chunks, dtype, compression, compression_opts,
  fill_value, order), ``attrs`` (JSON user attributes) and chunks at ``0.0``, ``1.0``,
  ... (``0`` for a 0-d array), each compressed by the numcodecs codec ``compression``
  names. Its chunks are v2's with no filters, so v2's reader reads them.
- The layout before it: ``__zmeta__`` (JSON: shape, chunks, dtype, fill_value, cname,
  clevel, shuffle, optionally order), ``__zattr__`` and ``__zdata__/<i>.<j>.blosc``,
  each chunk one blosc frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import UnknownCodecError, V2Pipeline, decode_blosc_chunk, v1_compressor
from ..codecs.bounded import ceiling
from ..stores.base import Store
from . import zarr_v2
from ._common import fetch_and_decode, fill_scalar, int_tuple, join
from .keys import META, ZDATA, ZMETA
from .meta import ArrayMeta, FormatError
from .zarr_v2 import parse_dtype

#: what the storage specification requires in ``meta`` (zarr's reader refuses a document
#: without any of them, so guessing one, the order say, could serve wrong bytes)
SPEC_FIELDS = ("shape", "chunks", "dtype", "compression", "compression_opts", "fill_value", "order")


def _fill_layout(meta: ArrayMeta, doc: Any, attrs: Any, key: str, required: tuple[str, ...]) -> None:
    """What both layouts' metadata say alike: attributes, shape, chunks, a fixed-size dtype
    and the order (C when the old layout leaves it out; the specification requires it)."""
    if not isinstance(doc, dict):
        raise FormatError(f"{key}: expected a JSON object")
    if isinstance(attrs, dict):
        meta.attributes = dict(attrs)
    missing = [f for f in required if f not in doc]
    if missing:
        raise FormatError(f"{key}: missing {', '.join(map(repr, missing))}")
    meta.shape = int_tuple(doc["shape"], "shape", key)
    meta.chunks = int_tuple(doc["chunks"], "chunks", key)
    meta.dtype = parse_dtype(doc["dtype"], key)
    if meta.dtype.kind == "O":
        raise FormatError(f"{key}: object dtype is not supported in Zarr v1")
    meta.order = doc.get("order", "C")
    if meta.order not in ("C", "F"):
        raise FormatError(f"{key}: order must be 'C' or 'F', got {meta.order!r}")


def parse_spec_array(path: str, doc: Any, attrs: Any, key: str | None = None,
                     attrs_error: str | None = None) -> ArrayMeta:
    """Map a storage-spec ``meta`` document (+ ``attrs``) onto ArrayMeta; problems land in
    ``error``. The compressor is built here, so an unknown one is found at discovery."""
    key = key or join(path, META)
    meta = ArrayMeta(path=path, format="zarr_v1", metadata_key=key, source={"meta": doc})
    try:
        if attrs_error is not None:
            raise FormatError(attrs_error)
        _fill_layout(meta, doc, attrs, key, SPEC_FIELDS)
        meta.chunk_key_encoding = {"name": "v1", "separator": "."}
        compressor = v1_compressor(doc["compression"], doc["compression_opts"])
        meta.codecs = [compressor] if compressor is not None else []
        meta.source["pipeline"] = V2Pipeline(compressor, None)
        meta.fill_value = fill_scalar(doc["fill_value"], meta.dtype, key, zarr_format=1)
    except (FormatError, UnknownCodecError) as exc:
        meta.error = str(exc) if str(exc).startswith(key) else f"{key}: {exc}"
    meta.validate()
    return meta


def parse_array(path: str, zmeta: Any, zattr: Any, key: str | None = None) -> ArrayMeta:
    """Map a __zmeta__ document (+ __zattr__) onto ArrayMeta; problems land in ``error``."""
    key = key or join(path, ZMETA)
    meta = ArrayMeta(path=path, format="zarr_v1", metadata_key=key, source={"zmeta": zmeta})
    try:
        _fill_layout(meta, zmeta, zattr, key, ("shape", "chunks", "dtype"))
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
        meta.fill_value = fill_scalar(zmeta.get("fill_value"), meta.dtype, key, zarr_format=1)
    except FormatError as exc:
        meta.error = str(exc)
    meta.validate()
    return meta


def chunk_key(meta: ArrayMeta, idx: tuple[int, ...]) -> str:
    """Store key of chunk ``idx`` in the layout before the specification."""
    name = ".".join(str(i) for i in idx) if idx else "0"
    return join(meta.path, f"{ZDATA}/{name}.blosc")


def make_reader(store: Store, meta: ArrayMeta) -> zarr_v2.Reader | Reader:
    """The reader of either layout: the specification's chunks are v2's (one compressor,
    '.'-separated keys, '0' for 0-d), read by v2's reader with the pipeline parsed here."""
    if "pipeline" in meta.source:
        return zarr_v2.Reader(store, meta, meta.source["pipeline"])
    return Reader(store, meta)


class Reader:
    """Fetch + decode chunks of the layout before the specification (stateless, thread-safe)."""

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
