"""What a quick look at a store's key names tells before mounting it.

Two things, from one bounded listing: whether it holds any Zarr at all (the
CLI warns when a mount would show plain files and an empty ``.zvfs/``), and
when each node's metadata last changed (the decoded views take their mtimes
from it, so they stay the same across remounts of unchanged data).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice

from ..stores.base import KeyInfo, Store
from .keys import ZARR_JSON, ZARRAY, ZATTR, ZATTRS, ZGROUP, ZMETA, ZMETADATA

#: the key names that make a prefix a Zarr node, whatever the version (NCZarr uses v2's)
METADATA_NAMES = frozenset({ZARR_JSON, ZARRAY, ZGROUP, ZMETADATA, ZMETA})
#: what a node's decoded views are made from: its metadata and its attributes
DESCRIBING_NAMES = METADATA_NAMES | {ZATTRS, ZATTR}

#: keys looked at, at most (10 listing pages on S3)
SCAN_LIMIT = 10_000


@dataclass
class MetadataScan:
    """``found``: a metadata key was seen (None: the store is empty, or too big to say so within
    the bound).
    ``mtimes``: node path ('' for the root) -> newest mtime of its metadata and attribute keys."""

    found: bool | None = False
    mtimes: dict[str, float] = field(default_factory=dict)
    #: keys were seen under the ``reserved`` name asked about (the mount's control directory,
    #: which hides them)
    reserved_used: bool = False

    @property
    def newest(self) -> float | None:
        return max(self.mtimes.values(), default=None)


def scan_metadata(store: Store, limit: int = SCAN_LIMIT, reserved: str | None = None) -> MetadataScan:
    """The scan of the store's first ``limit`` keys."""
    return scan_keys(islice(store.list_tree(""), limit), limit, reserved)


def scan_flat(store: Store, limit: int = SCAN_LIMIT, reserved: str | None = None
              ) -> tuple[MetadataScan, Iterator[tuple[str, KeyInfo]]]:
    """For a store listed flat (S3): the scan, and the same listing resumed from its start
    (the keys the scan saw, then the rest as they come), for the raw tree's index. A
    bucket is then listed once at mount, not once for the scan and again for the tree:
    on S3 each page of 1,000 keys is a round trip, and the scan reads up to 10 of them."""
    listing = store.list_tree("")
    first = list(islice(listing, limit))
    return scan_keys(first, limit, reserved), chain(first, listing)


def scan_keys(keys: Iterable[tuple[str, KeyInfo]], limit: int = SCAN_LIMIT,
              reserved: str | None = None) -> MetadataScan:
    """The scan of these keys (at most ``limit`` of them are expected); ``reserved``: a
    top-level name whose use by the store to note (``reserved_used``)."""
    out = MetadataScan()
    seen = 0
    for key, info in keys:
        seen += 1
        if reserved is not None and key.partition("/")[0] == reserved:
            out.reserved_used = True
        parent, _, name = key.rpartition("/")
        if name in DESCRIBING_NAMES:
            out.found = out.found or name in METADATA_NAMES
            out.mtimes[parent] = max(out.mtimes.get(parent, info.mtime), info.mtime)
    if not out.found and (seen >= limit or seen == 0):
        out.found = None  # too big to say, or empty (nothing to warn about: writes may fill it)
    return out
