"""The key names that make a store prefix a Zarr node, per format version.

Kept apart from the readers (which need numpy and the codecs) so that a look at
key names alone, the metadata scan at mount, imports nothing heavy.
"""

from __future__ import annotations

#: Zarr v3: one document per node
ZARR_JSON = "zarr.json"
#: Zarr v2 (and NCZarr, which uses v2's names)
ZARRAY, ZGROUP, ZATTRS, ZMETADATA = ".zarray", ".zgroup", ".zattrs", ".zmetadata"
#: Zarr v1
ZMETA, ZATTR, ZDATA = "__zmeta__", "__zattr__", "__zdata__"
