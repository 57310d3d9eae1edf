"""``.zvfs/v2/``: the whole hierarchy as an *uncompressed Zarr v2* store.

netCDF-C 4.9 and GDAL 3.6 read only plain v2; through this mirror they read
v3, compressed, sharded, zip and S3 data. Every array gets compressor null,
filters null, order C, separator '.', an explicit byte order, and one file of
decoded bytes per chunk (edge chunks padded with the fill value, as v2 wants).
"""

from __future__ import annotations

import json
from typing import Any

from zvfs.formats.meta import ArrayMeta, dtype_str, json_scalar
from zvfs.views.arrays import ChunkGridDir, DecodedArray
from zvfs.views.node import BytesFile, FileNode, Node


def _dumps(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode()


def zarray_doc(meta: ArrayMeta) -> dict[str, Any]:
    return {
        "zarr_format": 2,
        "shape": list(meta.shape),
        "chunks": list(meta.chunks),
        "dtype": dtype_str(meta.dtype),
        "compressor": None,
        "filters": None,
        "fill_value": json_scalar(meta.fill_value),
        "order": "C",
        "dimension_separator": ".",
    }


def zattrs_doc(meta: ArrayMeta) -> dict[str, Any]:
    attrs = dict(meta.attributes)
    names = meta.dimension_names
    if names and all(n for n in names):
        attrs["_ARRAY_DIMENSIONS"] = list(names)
    return attrs


class V2ChunkFile(FileNode):
    """One full decoded chunk (C order, padded at the edges), as v2 stores it uncompressed."""

    def __init__(self, array: DecodedArray, idx: tuple[int, ...]) -> None:
        self.array = array
        self.idx = idx
        self.mtime = array.ctx.mount_time

    @property
    def size(self) -> int:
        return self.array.meta.chunk_nbytes

    async def read(self, offset: int, length: int) -> bytes:
        chunk = await self.array.chunk(self.idx)
        return bytes(memoryview(chunk).cast("B")[offset : offset + length])


def mirror_array_dir(array: DecodedArray, extra: dict[str, Node] | None = None) -> ChunkGridDir:
    mtime = array.ctx.mount_time
    meta = array.meta
    entries: dict[str, Node] = {
        ".zarray": BytesFile(_dumps(zarray_doc(meta)), mtime),
        ".zattrs": BytesFile(_dumps(zattrs_doc(meta)), mtime),
    }
    entries.update(extra or {})
    return ChunkGridDir(array, V2ChunkFile, entries)


def mirror_group_files(attrs: dict[str, Any], mtime: float) -> dict[str, Node]:
    return {
        ".zgroup": BytesFile(_dumps({"zarr_format": 2}), mtime),
        ".zattrs": BytesFile(_dumps(attrs), mtime),
    }
