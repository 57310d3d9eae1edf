"""``.zvfs/v2/``: the whole hierarchy as an *uncompressed Zarr v2* store.

netCDF-C 4.9 and GDAL 3.6 read only plain v2; through this mirror they read
v3, compressed, sharded, zip and S3 data. Every array gets compressor null,
filters null, order C, separator '.', an explicit byte order, and one file of
decoded bytes per chunk (edge chunks padded with the fill value, as v2 wants).

Choices made for those readers:

- The byte order is always little-endian ('<'), whatever the source declares:
  netCDF-C 4.9.0's Zarr reader ignores '>' and returns byte-swapped numbers.
  (``arrays/<path>/data.raw`` keeps the declared order.)
- Every directory of the mirror is a group with ``.zgroup`` and ``.zattrs``,
  also where the source has none (Zarr v1 stores, bare prefixes), so a reader
  can open any level.
- ``_ARRAY_DIMENSIONS`` is written only when the source names every dimension.
  Otherwise it is left out and netCDF-C invents ``_zdim_<size>`` names itself;
  we do not synthesize names. When the same name is used with two sizes
  within a group and its subgroups (v3 does not forbid it, netCDF does), the
  conflicting uses get ``<name>_<size>`` so each dimension has one size.
- Complex arrays get fill_value null: GDAL 3.6 rejects the [re, im] form.
  Every chunk file of the mirror exists (unwritten ones hold the fill), so
  no value is lost.
- A 0-d array is written as netCDF-C writes a scalar in pure-Zarr mode: shape
  [1], chunks [1], ``_ARRAY_DIMENSIONS: []``. netCDF-C 4.9.0 crashes on shape [].
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from zvfs.formats.meta import ArrayMeta, dtype_str, json_scalar
from zvfs.views.arrays import ChunkFile, ChunkGridDir, DecodedArray, region_bytes
from zvfs.views.node import BytesFile, Node


def _dumps(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode()


def mirror_dtype(dt: np.dtype) -> np.dtype:
    """The dtype the mirror serves: the source's, made little-endian (see the module doc)."""
    if dt.fields is None and dt.byteorder in (">", "="):
        return dt.newbyteorder("<")
    return dt


def zarray_doc(meta: ArrayMeta) -> dict[str, Any]:
    return {
        "zarr_format": 2,
        "shape": list(meta.shape) or [1],  # 0-d: see the module doc
        "chunks": list(meta.chunks) or [1],
        "dtype": dtype_str(mirror_dtype(meta.dtype)),
        "compressor": None,
        "filters": None,
        "fill_value": None if meta.dtype.kind == "c" else json_scalar(meta.fill_value),
        "order": "C",
        "dimension_separator": ".",
    }


def zattrs_doc(meta: ArrayMeta, names: list[str] | None = None) -> dict[str, Any]:
    """User attributes plus ``_ARRAY_DIMENSIONS`` (``names``: as renamed by the caller)."""
    attrs = dict(meta.attributes)
    attrs.pop("_ARRAY_DIMENSIONS", None)
    if names is None:
        names = dimension_names(meta)
    if names is not None:
        attrs["_ARRAY_DIMENSIONS"] = names
    return attrs


def dimension_names(meta: ArrayMeta) -> list[str] | None:
    """The source's dimension names when it names every dimension, else None."""
    if meta.ndim == 0:
        return []  # netCDF-C's own spelling of a scalar (with shape [1])
    names = meta.dimension_names
    if names is None:
        dims = meta.attributes.get("_ARRAY_DIMENSIONS")
        if isinstance(dims, list) and all(isinstance(n, str) for n in dims):
            names = tuple(dims)
    if names and len(names) == meta.ndim and all(isinstance(n, str) and n for n in names):
        return list(names)
    return None


def consistent_dimensions(metas: dict[str, ArrayMeta]) -> dict[str, list[str] | None]:
    """path -> ``_ARRAY_DIMENSIONS`` with one size per name across the whole mirror.

    netCDF-C resolves a name in the variable's group and then its ancestors, so a
    name used with two sizes anywhere is ambiguous. The first size seen (by path)
    keeps the plain name; a use with another size is renamed ``<name>_<size>``.
    """
    sizes: dict[str, int] = {}
    out: dict[str, list[str] | None] = {}
    for path in sorted(metas):
        meta = metas[path]
        names = dimension_names(meta)
        if names is None:
            out[path] = None
            continue
        fixed = []
        for name, size in zip(names, meta.shape, strict=True):
            if sizes.setdefault(name, size) != size:
                name = f"{name}_{size}"
                sizes.setdefault(name, size)
            fixed.append(name)
        out[path] = fixed
    return out


class V2ChunkFile(ChunkFile):
    """One full decoded chunk (C order, padded at the edges), as v2 stores it uncompressed."""

    @property
    def size(self) -> int:
        return self.array.meta.chunk_nbytes

    async def read(self, offset: int, length: int) -> bytes:
        chunk = await self.array.chunk_as(self.idx, mirror_dtype(self.array.meta.dtype))
        return region_bytes(chunk, offset, length)


def mirror_array_dir(
    array: DecodedArray, extra: dict[str, Node] | None = None, dims: list[str] | None = None
) -> ChunkGridDir:
    mtime = array.ctx.node_mtime(array.meta.path)
    meta = array.meta
    entries: dict[str, Node] = {
        ".zarray": BytesFile(_dumps(zarray_doc(meta)), mtime),
        ".zattrs": BytesFile(_dumps(zattrs_doc(meta, dims)), mtime),
    }
    entries.update(extra or {})
    return ChunkGridDir(array, V2ChunkFile, entries)


def mirror_group_files(attrs: dict[str, Any], mtime: float) -> dict[str, Node]:
    return {
        ".zgroup": BytesFile(_dumps({"zarr_format": 2}), mtime),
        ".zattrs": BytesFile(_dumps(attrs), mtime),
    }
