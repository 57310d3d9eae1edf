"""``.zvfs/arrays/<array path>/``: the files one array is served as.

data.raw (:class:`~zvfs.views.arrays.RawDataFile`), data.npy (:mod:`zvfs.views.npy`), an
ENVI header (:mod:`zvfs.views.envi`), ``chunks/`` one file a chunk, and meta.json. Each
framing is its own module below this one; this one only puts them in a directory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from zvfs.views.arrays import DecodedArray, RawDataFile, served_text_width
from zvfs.views.chunk_files import ChunkFile, ChunkGridDir
from zvfs.views.envi import envi_header, envi_supported
from zvfs.views.node import BytesFile, Node, NodeError, StaticDir
from zvfs.views.npy import NpyFile
from zvfs.views.values import TEXT_CHUNK_LIMIT, is_text_vlen

log = logging.getLogger("zvfs")


class ArrayDir(StaticDir):
    """``arrays/<path>/``: its files (:func:`array_files`) made when the directory is first
    looked into, not when ``arrays/`` is built. meta.json is indented JSON, written by
    json's pure-Python encoder: made for every array at once, a store of 100,000 arrays
    spent most of its first ``ls .zvfs/arrays`` there, and held every array's files.

    A variable-length text array's data files come once its width is measured
    (:func:`text_files`): at the first listing, or lookup of one of them."""

    def __init__(self, array: DecodedArray, mtime_ns: int = 0,
                 unknown: NodeError | None = None, superseded: Callable[[], bool] | None = None) -> None:
        super().__init__(mtime_ns=mtime_ns, unknown=unknown, superseded=superseded)
        self._array: DecodedArray | None = array
        self._text: DecodedArray | None = array if is_text_vlen(array.meta) else None

    @property  # type: ignore[override]
    def entries(self) -> dict[str, Node]:
        if self._array is not None:
            array, self._array = self._array, None
            # names placed below it meanwhile (an array inside an array's path) stay
            self._entries = {**array_files(array), **self._entries}
        return self._entries

    @entries.setter
    def entries(self, value: dict[str, Node]) -> None:
        self._entries = value

    async def lookup(self, name: str) -> Node | None:
        if name in TEXT_FILES:
            await self._measured()
        return await super().lookup(name)

    async def children(self) -> Sequence[tuple[str, Node]]:
        await self._measured()
        return await super().children()

    async def _measured(self) -> None:
        """Add a text array's data files, its width measured (once; a store failure raises,
        and the next look tries again)."""
        if self._text is None:
            return
        files = await text_files(self._text)
        if self._text is not None:  # not added meanwhile, by another look
            self._text = None
            self.entries.update(files)


def array_files(array: DecodedArray) -> dict[str, Node]:
    """The files of ``arrays/<path>/`` for one array (a text array's data files are
    :func:`text_files`)."""
    mtime = array.ctx.node_mtime_ns(array.meta.path)
    files: dict[str, Node] = {"meta.json": BytesFile(array.meta.json_bytes(), mtime)}
    if not array.readable:
        return files
    files["data.raw"] = RawDataFile(array)
    files["data.npy"] = NpyFile(array)
    files["chunks"] = ChunkGridDir(array, ChunkFile)
    if envi_supported(array.meta):
        files["data.hdr"] = BytesFile(envi_header(array.meta), mtime)
    return files


#: the data files of a variable-length text array
TEXT_FILES = ("data.raw", "data.npy")


async def text_files(array: DecodedArray) -> dict[str, Node]:
    """data.raw and data.npy of a variable-length text array: fixed-width Unicode (``U<n>``,
    n the longest value's characters, at least 1), as numpy holds such text; none when its
    width is not served (:func:`served_text_width`, which logs why). No chunks/ (a chunk
    file's width would be the whole array's) and no ENVI header (no text type)."""
    got = await served_text_width(array)
    if isinstance(got, str):
        return {}
    dtype = np.dtype(f"<U{max(1, got.chars)}")
    if dtype.itemsize * math.prod(array.meta.chunks) > TEXT_CHUNK_LIMIT:
        if array.ctx.log_once.first(f"arrays view width {array.meta.path}"):
            log.warning("arrays view: %s: no data files: its longest value holds %d characters, "
                        "and a chunk of fixed-width text would pass %d bytes",
                        array.meta.path or "/", got.chars, TEXT_CHUNK_LIMIT)
        return {}
    return {"data.raw": RawDataFile(array, dtype=dtype), "data.npy": NpyFile(array, dtype=dtype)}
