"""A whole store's listing built from one flat pass.

On S3 a listing costs a round trip per 1,000 keys whatever the nesting, while
a listing per directory costs a round trip per directory. For stores of up to
``limit`` keys, one flat pass answers every directory (and every lookup and
negative lookup) of the raw tree; past the limit, callers fall back to
per-directory listings.
"""

from __future__ import annotations

from zvfs.stores.base import Listing, Store


def build_tree_index(store: Store, limit: int) -> dict[str, Listing] | None:
    """prefix ('' or ending in '/') -> Listing for the whole store, or None if over ``limit`` keys.

    Blocking: run it in a worker thread. Names are not filtered here; the raw
    view skips (and logs) those that cannot be paths, as it does for any listing.
    """
    index: dict[str, Listing] = {"": Listing()}
    for n, (key, info) in enumerate(store.list_tree("")):
        if n >= limit:
            return None
        parts = key.split("/")
        prefix = ""
        for part in parts[:-1]:
            index.setdefault(prefix, Listing()).prefixes.add(part)
            prefix += part + "/"
            index.setdefault(prefix, Listing())
        if parts[-1] or len(parts) == 1:
            index.setdefault(prefix, Listing()).keys[parts[-1]] = info
    return index
