"""Does a store hold any Zarr at all? A cheap, bounded look at key names only.

The CLI uses it to warn when a mount would show plain files and an empty
``.zvfs/``: a user who typed the wrong directory gets told at mount time,
not after wondering why ``arrays/`` is empty.
"""

from __future__ import annotations

from itertools import islice

from ..stores.base import Store
from .zarr_v1 import ZMETA
from .zarr_v2 import ZARRAY, ZGROUP, ZMETADATA
from .zarr_v3 import ZARR_JSON

#: the key names that make a prefix a Zarr node, whatever the version (NCZarr uses v2's)
METADATA_NAMES = frozenset({ZARR_JSON, ZARRAY, ZGROUP, ZMETADATA, ZMETA})


def has_zarr_metadata(store: Store, limit: int = 10_000) -> bool | None:
    """True when a metadata key is among the first ``limit`` keys, False when the whole
    store was seen without one, None when it is too big to tell within the bound."""
    seen = 0
    for key in islice(store.list_prefix(""), limit):
        seen += 1
        if key.rsplit("/", 1)[-1] in METADATA_NAMES:
            return True
    return False if seen < limit else None
