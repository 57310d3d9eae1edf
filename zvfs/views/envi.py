"""``data.hdr``: an ENVI header next to data.raw, so GDAL, ENVI and IDL open the raw file.

GDAL's ENVI driver finds ``data.hdr`` for ``data.raw`` by replacing the extension.
"""

from __future__ import annotations

import numpy as np

from zvfs.formats.meta import ArrayMeta

#: numpy kind+itemsize -> ENVI "data type" code. No int8: ENVI has no signed byte, and
#: type 1 would show negative values as 128..255, so int8 arrays get no header.
ENVI_TYPES = {
    ("u", 1): 1, ("b", 1): 1, ("i", 2): 2, ("i", 4): 3, ("f", 4): 4, ("f", 8): 5,
    ("c", 8): 6, ("c", 16): 9, ("u", 2): 12, ("u", 4): 13, ("i", 8): 14, ("u", 8): 15,
}


#: bands named in a header at most: the names are made when .zvfs/arrays is listed, and
#: metadata may declare any number of bands (2**40 once stalled the daemon); hyperspectral
#: data has hundreds
MAX_BAND_NAMES = 10_000


#: bytes of band names a header holds at most: a dimension name is any JSON string, and
#: 10,000 names of a 100,000-character one made a header of 1 GB, built in the daemon's
#: memory as .zvfs/arrays was listed (a 100 KB metadata document; a few ended the daemon)
MAX_BAND_NAMES_BYTES = 1 << 20


#: GDAL (and ENVI) hold samples, lines and bands in a signed 32-bit int: a header past it
#: is one no reader opens ("Invalid dataset dimensions : 1073741824 x -2147483648")
MAX_DIM = 2**31 - 1


def envi_supported(meta: ArrayMeta) -> bool:
    """1-3 dimensions, a type ENVI has, and some data (GDAL opens no band of size 0), each
    dimension within MAX_DIM."""
    return (1 <= meta.ndim <= 3 and (meta.dtype.kind, meta.dtype.itemsize) in ENVI_TYPES
            and all(0 < n <= MAX_DIM for n in meta.shape))


#: what ends or splits a header value: ``}`` closes a braced value and a newline starts a
#: field (a dimension name holding "}\nbyte order = 1" set the byte order GDAL read the
#: data with), a comma splits a list of band names
_NOT_IN_VALUES = {ord(c): "_" for c in "{},;"} | {c: "_" for c in (*range(32), 127)}


def _value_text(text: str) -> str:
    """A name from the store, made safe to stand inside a header value."""
    return text.translate(_NOT_IN_VALUES)


def envi_header(meta: ArrayMeta) -> bytes:
    """Band-sequential header: (bands, lines, samples) is the C-order shape, padded with 1s."""
    dims = (1,) * (3 - meta.ndim) + tuple(meta.shape)
    bands, lines, samples = dims
    big = meta.dtype.byteorder == ">" or (meta.dtype.byteorder == "=" and np.little_endian is False)
    lines_out = [
        "ENVI",
        "description = {zvfs decoded array " + _value_text(meta.path or "/") + "}",
        f"samples = {samples}",
        f"lines = {lines}",
        f"bands = {bands}",
        "header offset = 0",
        "file type = ENVI Standard",
        f"data type = {ENVI_TYPES[(meta.dtype.kind, meta.dtype.itemsize)]}",
        "interleave = bsq",
        f"byte order = {1 if big else 0}",
    ]
    if meta.dimension_names and meta.ndim == 3 and meta.dimension_names[0] and bands <= MAX_BAND_NAMES:
        name = _value_text(meta.dimension_names[0])
        # "<name> <i>, " a band, at most: measured before a byte is built
        per_band = len(name.encode("utf-8", "backslashreplace")) + len(str(bands)) + 3
        if bands * per_band <= MAX_BAND_NAMES_BYTES:
            lines_out.append("band names = {" + ", ".join(f"{name} {i}" for i in range(bands)) + "}")
    # names from JSON may hold what UTF-8 cannot (lone surrogates): escaped, not an error
    return ("\n".join(lines_out) + "\n").encode("utf-8", "backslashreplace")
