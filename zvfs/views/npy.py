"""``data.npy``: data.raw behind an NPY header, so ``np.load(p, mmap_mode="r")`` works."""

from __future__ import annotations

import struct

import numpy as np

from zvfs.views.arrays import DecodedArray, RawDataFile
from zvfs.views.readahead import ReadAhead

NPY_ALIGN = 64
#: the alignment of a file whose data are read from chunks: the header alone on the first
#: page. A read of that page with the first chunk's bytes fails when that chunk cannot be
#: read (corrupt, or its store failing); the kernel then reads the page alone again, so the
#: header, np.load(mmap_mode="r") and the other chunks' values stay readable
PAGE_ALIGN = 4096
#: numpy's default ``max_header_size``: np.load refuses a longer header unless asked
#: (allow_pickle or max_header_size), so no padding may take one past it
NPY_MAX_HEADER = 10000


def npy_header(dtype: np.dtype, shape: tuple[int, ...], align: int = NPY_ALIGN) -> bytes:
    """The one NPY header writer (data.npy, the vectors view): format 1.0 (2.0 when too long)
    for a C-order array, padded so data start ``align``-byte aligned (a multiple of numpy's
    64). A header that latin-1 cannot hold (a structured dtype's field named ``温度``) is
    format 3.0, UTF-8, as numpy writes it. A header that ``align`` would pad past numpy's
    ``NPY_MAX_HEADER`` (a structured dtype of a few hundred fields) is padded to 64 only,
    so plain ``np.load`` reads it whenever it reads numpy's own file of the array."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    # plain ints: numpy 2 would write np.int64(3) into the header text
    text = repr({"descr": descr, "fortran_order": False, "shape": tuple(int(n) for n in shape)})
    try:
        encoded, versions = text.encode("latin1"), (((1, 0), "<H"), ((2, 0), "<I"))
    except UnicodeEncodeError:
        encoded, versions = text.encode("utf-8"), (((3, 0), "<I"),)
    for version, fmt in versions:
        prefix = 6 + 2 + struct.calcsize(fmt)
        pad = -(prefix + len(encoded) + 1) % align
        if len(encoded) + pad + 1 > NPY_MAX_HEADER:
            pad = -(prefix + len(encoded) + 1) % NPY_ALIGN
        body = encoded + b" " * pad + b"\n"
        if len(body) < 1 << (8 * struct.calcsize(fmt)):
            return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(body)) + body
    raise ValueError("NPY header too long")


class NpyFile(RawDataFile):
    """``data.npy``: ``data.raw`` behind its header (per-open read-ahead as data.raw's)."""

    def __init__(self, array: DecodedArray, ahead: ReadAhead | None = None, dtype: np.dtype | None = None) -> None:
        super().__init__(array, ahead, dtype)
        self.header = npy_header(array.meta.dtype if dtype is None else dtype, array.meta.shape, PAGE_ALIGN)

    @property
    def size(self) -> int:
        return len(self.header) + super().size

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        hlen = len(self.header)
        if offset < hlen:  # the header is the open's array's too: not served once that is stale
            await self.array.current()
        if offset >= hlen:  # the data: data.raw's bytes, not copied
            return await super().read(offset - hlen, length)
        head = self.header[offset : offset + length]
        rest = length - len(head)
        return head + await super().read(0, rest) if rest > 0 else head
