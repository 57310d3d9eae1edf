"""The key names that make a store prefix a Zarr node, per format version.

Kept apart from the readers (which need numpy and the codecs) so that a look at
key names alone, the metadata scan at mount, imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

#: Zarr v3: one document per node
ZARR_JSON = "zarr.json"
#: Zarr v2 (and NCZarr, which uses v2's names)
ZARRAY, ZGROUP, ZATTRS, ZMETADATA = ".zarray", ".zgroup", ".zattrs", ".zmetadata"
#: Zarr v1, the layout before the storage specification
ZMETA, ZATTR, ZDATA = "__zmeta__", "__zattr__", "__zdata__"
#: Zarr v1, the storage specification (zarr-python 1.x): one array, chunks at '0.0', ...
META, ATTRS = "meta", "attrs"
#: bytes a 'meta' key may hold to be read as v1 metadata: a real one is a few hundred
#: (a structured dtype, a few thousand); a bigger 'meta' is some other file, never fetched
META_MAX_BYTES = 1 << 20


def is_v1_meta(doc: Any) -> bool:
    """Whether a parsed 'meta' document is Zarr v1 metadata. The name alone says nothing
    (stores hold plain files called meta), so what counts is ``"zarr_format": 1``."""
    fmt = doc.get("zarr_format") if isinstance(doc, dict) else None
    return isinstance(fmt, int) and not isinstance(fmt, bool) and fmt == 1
