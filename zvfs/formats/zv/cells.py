"""Reading the Zarr v3 arrays that hold ZV cells, through the shared formats reader.

ZV needs little from Zarr: the zarr.json of a node, one decoded chunk of a small
array (vlen-bytes cells, uint8 blobs, int64/float tables) under whatever codecs
(zstd, blosc, sharding_indexed, ...). Chunk decoding is delegated to
:func:`zvfs.formats.open_array`; this module adapts it to cells addressed by
grid index and turns its errors into :class:`ZVError` naming the key.
Everything is blocking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zvfs.codecs.errors import CodecError
from zvfs.formats import ZarrArray
from zvfs.formats import open_array as _open_zarr
from zvfs.formats._common import get_metadata, join, parse_json
from zvfs.formats.meta import FormatError
from zvfs.stores.base import KeyNotFound, Store, StoreError

from .blobs import MAX_TABLE_BYTES
from .errors import ZVError


def load_node(store: Store, path: str) -> dict[str, Any] | None:
    """The zarr.json document at ``path`` ('' = root), or None if there is none."""
    key = join(path, "zarr.json")
    try:
        raw = get_metadata(store, key)
    except KeyNotFound:
        return None
    except (StoreError, FormatError) as exc:  # FormatError: too big to be metadata
        raise ZVError(key, str(exc).removeprefix(f"{key}: ")) from exc
    try:
        doc = parse_json(raw, key)  # the shared parser: also refuses absurd nesting
    except FormatError as exc:
        raise ZVError(key, str(exc).removeprefix(f"{key}: ")) from exc
    if not isinstance(doc, dict):
        raise ZVError(key, "expected a JSON object")
    return doc


@dataclass(slots=True)
class Array:
    """One array's shape, decoded chunk unit and attributes, plus its chunk reader."""

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype | None  # None for variable-length bytes
    attributes: dict[str, Any] = field(default_factory=dict)
    zarr: ZarrArray | None = None


def open_array(store: Store, path: str, doc: dict[str, Any] | None = None) -> Array:
    """The array at ``path``; ZVError naming its zarr.json if it is not a readable array."""
    key = join(path, "zarr.json")
    doc = doc if doc is not None else load_node(store, path)
    if doc is None:
        raise ZVError(key, "missing")
    if doc.get("node_type") != "array":
        raise ZVError(key, "is not an array")
    try:
        za = _open_zarr(store, path)
    except (FormatError, CodecError, StoreError) as exc:
        raise ZVError(key, str(exc)) from exc
    meta = za.meta
    if meta.error is not None:
        raise ZVError(key, meta.error)
    dtype = None if meta.vlen is not None else meta.dtype
    return Array(path, tuple(meta.shape), tuple(meta.chunks), dtype, dict(meta.attributes or {}), za)


def read_chunk(arr: Array, idx: tuple[int, ...]) -> np.ndarray | None:
    """One decoded chunk, or None if it was never written."""
    za = arr.zarr
    assert za is not None
    try:
        if not za.chunk_exists(idx):
            return None
        return za.read_chunk(idx)
    except (FormatError, CodecError, StoreError) as exc:
        raise ZVError(join(arr.path, "/".join(map(str, idx))), str(exc)) from exc




def read_all(store: Store, arr: Array) -> np.ndarray:
    """The whole array (small tables only): chunks assembled, fill where absent."""
    del store
    za = arr.zarr
    assert za is not None
    # a vlen table's nbytes is 0: count its cells as the 8-byte references it holds
    nbytes = za.meta.nbytes or math.prod(za.meta.shape) * max(8, za.meta.dtype.itemsize)
    if nbytes > MAX_TABLE_BYTES:
        raise ZVError(arr.path, f"declares {nbytes:,} bytes (shape {list(za.meta.shape)}); zvfs reads "
                                f"whole tables of at most {MAX_TABLE_BYTES >> 20} MiB")
    try:
        return za.read_all()
    except (FormatError, CodecError, StoreError) as exc:
        raise ZVError(arr.path, str(exc)) from exc


def read_blob(store: Store, path: str) -> bytes | None:
    """A 0.7-layout per-chunk child array (1-D uint8) as bytes; None if absent."""
    doc = load_node(store, path)
    if doc is None:
        return None
    arr = open_array(store, path, doc)
    if arr.dtype is None or arr.dtype.itemsize != 1 or len(arr.shape) != 1:
        raise ZVError(join(path, "zarr.json"), "expected a 1-D uint8 blob array")
    return read_all(store, arr).tobytes()


def read_cell(store: Store, arr: Array, coords: tuple[int, ...]) -> bytes | None:
    """The bytes of one vlen cell at grid index ``coords``; None if outside the grid or unwritten."""
    del store
    if len(coords) != len(arr.shape) or any(c < 0 or c >= s for c, s in zip(coords, arr.shape, strict=True)):
        return None
    chunk_idx = tuple(c // s for c, s in zip(coords, arr.chunks, strict=True))
    within = tuple(c % s for c, s in zip(coords, arr.chunks, strict=True))
    chunk = read_chunk(arr, chunk_idx)
    if chunk is None:
        return None
    item = chunk[within]
    if not item:
        return None
    return bytes(item) if not isinstance(item, str) else item.encode()
