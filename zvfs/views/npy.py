"""``data.npy``: data.raw behind an NPY header, so ``np.load(p, mmap_mode="r")`` works."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from zvfs.views.node import FileNode

if TYPE_CHECKING:  # the header writer must not pull in the decoded-array machinery
    from zvfs.views.arrays import DecodedArray

NPY_ALIGN = 64


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The one NPY header writer (data.npy, the vectors view): format 1.0 (2.0 when too long)
    for a C-order array, padded so data starts 64-byte aligned."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    # plain ints: numpy 2 would write np.int64(3) into the header text
    text = repr({"descr": descr, "fortran_order": False, "shape": tuple(int(n) for n in shape)})
    for version, fmt in (((1, 0), "<H"), ((2, 0), "<I")):
        prefix = 6 + 2 + struct.calcsize(fmt)
        pad = -(prefix + len(text) + 1) % NPY_ALIGN
        body = text + " " * pad + "\n"
        if len(body) < 1 << (8 * struct.calcsize(fmt)):
            return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(body)) + body.encode("latin1")
    raise ValueError("NPY header too long")


class NpyFile(FileNode):
    def __init__(self, array: DecodedArray) -> None:
        self.array = array
        self.header = npy_header(array.meta.dtype, array.meta.shape)
        self.mtime = array.ctx.node_mtime(array.meta.path)
        self.immutable = array.ctx.immutable

    @property
    def size(self) -> int:
        return len(self.header) + self.array.meta.nbytes

    def version(self) -> object:
        return self.array.content

    async def read(self, offset: int, length: int) -> bytes:
        hlen = len(self.header)
        out = b""
        if offset < hlen:
            out = self.header[offset : offset + length]
            length -= len(out)
            offset = hlen
        if length > 0:
            out += await self.array.read_bytes(offset - hlen, length)
        return out
