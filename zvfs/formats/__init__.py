"""Zarr v1/v2/v3/NCZarr metadata → ArrayMeta, and blocking per-chunk reads.

Public API (all blocking; run from a worker thread, one hop per chunk):

- ``open_array(store, path, meta=None) -> ZarrArray``
- ``ZarrArray.meta``, ``read_chunk(idx)``, ``chunk_key(idx)``, ``chunk_exists(idx)``
- ``discover(store, known=None) -> Hierarchy`` (groups and arrays, found from metadata only;
  with ``known``, an earlier discovery's ``h.known``, only what changed is read again)
- ``read_array_meta(store, path) -> ArrayMeta | None``

Formats import only :mod:`zvfs.stores` and :mod:`zvfs.codecs`.

The names are loaded from :mod:`zvfs.formats.api` on first use: the readers need
numpy and the codecs, and the mount must answer before those are imported (the
metadata scan at mount only needs :mod:`zvfs.formats.keys`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import (
        ArrayMeta,
        FormatError,
        GroupMeta,
        Hierarchy,
        Known,
        ZarrArray,
        discover,
        open_array,
        read_array_meta,
    )

__all__ = [
    "ArrayMeta",
    "FormatError",
    "GroupMeta",
    "Hierarchy",
    "Known",
    "ZarrArray",
    "discover",
    "open_array",
    "read_array_meta",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module(".api", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
