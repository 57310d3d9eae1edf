"""What a quick look at a store's key names tells before mounting it.

Two things, from one bounded listing: whether it holds any Zarr at all (the
CLI warns when a mount would show plain files and an empty ``.zvfs/``), and
when each node's metadata last changed (the decoded views take their mtimes
from it, so they stay the same across remounts of unchanged data).

A Zarr v1 (storage spec) array's metadata key is just ``meta``, a name plain files
have too. Its mtime is taken from the name (and the size: a big ``meta`` is some other
file); it counts as Zarr only once read, and only when nothing else says so: the
warning then costs a store with no other metadata a few small reads, and no other
store any.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice

from ..stores.base import KeyInfo, Store, StoreError
from .keys import (
    ATTRS,
    META,
    META_MAX_BYTES,
    ZARR_JSON,
    ZARRAY,
    ZATTR,
    ZATTRS,
    ZGROUP,
    ZMETA,
    ZMETADATA,
    is_v1_meta,
)

#: the key names that make a prefix a Zarr node, whatever the version (NCZarr uses v2's)
METADATA_NAMES = frozenset({ZARR_JSON, ZARRAY, ZGROUP, ZMETADATA, ZMETA})
#: what a node's decoded views are made from: its metadata and its attributes (v1's
#: 'meta' and 'attrs' may be plain files, whose mtimes are then learnt for nothing)
DESCRIBING_NAMES = METADATA_NAMES | {ZATTRS, ZATTR, META, ATTRS}

#: keys looked at, at most (10 listing pages on S3)
SCAN_LIMIT = 10_000


@dataclass
class MetadataScan:
    """``found``: a metadata key was seen (None: the store is empty, or too big to say so within
    the bound).
    ``mtimes``: node path ('' for the root) -> newest mtime (ns) of its metadata and attribute keys.
    ``v1_candidates``: keys named 'meta', small enough to be Zarr v1 metadata, not yet read.
    ``reserved_used``: keys were seen under the ``reserved`` name asked about (the mount's
    control directory, which hides them).
    ``empty``: the store holds no key at all."""

    found: bool | None = False
    mtimes: dict[str, int] = field(default_factory=dict)
    v1_candidates: list[str] = field(default_factory=list)
    reserved_used: bool = False
    empty: bool = False

    @property
    def newest(self) -> int | None:
        return max(self.mtimes.values(), default=None)


#: 'meta' keys read, at most, to tell a store whose only metadata they may be from one
#: with none
V1_READS = 4


def scan_metadata(store: Store, limit: int = SCAN_LIMIT, reserved: str | None = None) -> MetadataScan:
    """The scan of the store's first ``limit`` keys."""
    return confirm_v1(store, scan_keys(islice(store.list_tree(""), limit), limit, reserved))


def scan_flat(store: Store, limit: int = SCAN_LIMIT, reserved: str | None = None
              ) -> tuple[MetadataScan, Iterator[tuple[str, KeyInfo]]]:
    """For a store listed flat (S3): the scan, and the same listing resumed from its start
    (the keys the scan saw, then the rest as they come), for the raw tree's index. A
    bucket is then listed once at mount, not once for the scan and again for the tree:
    on S3 each page of 1,000 keys is a round trip, and the scan reads up to 10 of them."""
    listing = store.list_tree("")
    first = list(islice(listing, limit))
    return confirm_v1(store, scan_keys(first, limit, reserved)), chain(first, listing)


def scan_keys(keys: Iterable[tuple[str, KeyInfo]], limit: int = SCAN_LIMIT,
              reserved: str | None = None) -> MetadataScan:
    """The scan of these keys (at most ``limit`` of them are expected); 'meta' keys are only
    candidates (see confirm_v1); ``reserved``: a top-level name whose use by the store to
    note."""
    out = MetadataScan()
    seen = 0
    v1_attrs: dict[str, int] = {}
    for key, info in keys:
        seen += 1
        if reserved is not None and key.partition("/")[0] == reserved:
            out.reserved_used = True
        parent, _, name = key.rpartition("/")
        if name == ATTRS:
            v1_attrs[parent] = max(v1_attrs.get(parent, info.mtime_ns), info.mtime_ns)
            continue
        if name == META:
            if info.size > META_MAX_BYTES:
                continue  # some other file
            out.v1_candidates.append(key)  # its mtime counts; whether it is Zarr, confirm_v1 says
        elif name in DESCRIBING_NAMES:
            out.found = out.found or name in METADATA_NAMES
        else:
            continue
        out.mtimes[parent] = max(out.mtimes.get(parent, info.mtime_ns), info.mtime_ns)
    for key in out.v1_candidates:  # an array's attrs count where its meta may be one
        parent = key.rpartition("/")[0]
        out.mtimes[parent] = max(out.mtimes[parent], v1_attrs.get(parent, 0))
    out.empty = seen == 0
    if not out.found and (seen >= limit or seen == 0):
        out.found = None  # too big to say, or empty (told apart: see ``empty``)
    return out


def confirm_v1(store: Store, scan: MetadataScan) -> MetadataScan:
    """``scan`` with ``found`` set when, nothing else having said so, one of the first
    V1_READS 'meta' candidates holds Zarr v1 metadata."""
    if scan.found:
        return scan
    for key in scan.v1_candidates[:V1_READS]:
        try:
            doc = json.loads(store.get_at_most(key, META_MAX_BYTES))
        except (StoreError, ValueError, RecursionError):  # ValueError: not JSON, not UTF-8
            continue
        if is_v1_meta(doc):
            scan.found = True
            break
    return scan
