"""A whole store's listing built from one flat pass.

On S3 a listing costs a round trip per 1,000 keys whatever the nesting, while
a listing per directory costs a round trip per directory. For stores of up to
``limit`` keys, one flat pass answers every directory (and every lookup and
negative lookup) of the raw tree; past the limit, callers fall back to
per-directory listings.
"""

from __future__ import annotations

from collections.abc import Iterable

from zvfs.stores.base import KeyInfo, Listing, Store


def build_tree_index(store: Store, limit: int,
                     keys: Iterable[tuple[str, KeyInfo]] | None = None) -> dict[str, Listing] | None:
    """prefix ('' or ending in '/') -> Listing for the whole store, or None if over ``limit`` keys.

    ``keys``: the store's flat listing, when one is already under way (the mount's scan
    began it); otherwise the store is listed here.

    Blocking: run it in a worker thread. Names are not filtered here; the raw
    view skips (and logs) those that cannot be paths, as it does for any listing.
    The index is held for the mount's life, so it is kept small: each listing's keys
    are a :class:`~zvfs.stores.listing.KeyTable` (arrays, not an object per key).
    """
    index: dict[str, Listing] = {"": Listing()}
    last_prefix, listing = "", index[""]
    for n, (key, info) in enumerate(store.list_tree("") if keys is None else keys):
        if n >= limit:
            return None
        prefix = key[: key.rfind("/") + 1]  # '' or 'a/b/'
        if prefix != last_prefix:  # keys come sorted: most share the last key's directory
            last_prefix, listing = prefix, index.get(prefix) or _add_dir(index, prefix)
        name = key[len(prefix):]
        if name or not prefix:  # 'a/b/' (a directory marker) is no key of its own
            listing.keys[name] = info
    return index


def _add_dir(index: dict[str, Listing], prefix: str) -> Listing:
    """The listing of ``prefix`` (ending in '/'), made with its parents as needed: a loop,
    not a recursion (a key a thousand levels deep took the whole tree down with
    RecursionError)."""
    listing = index[prefix] = Listing()
    while True:
        cut = prefix.rfind("/", 0, len(prefix) - 1) + 1
        parent_prefix, name = prefix[:cut], prefix[cut:-1]
        parent = index.get(parent_prefix)
        if parent is not None:
            parent.prefixes.add(name)
            return listing
        parent = index[parent_prefix] = Listing()
        parent.prefixes.add(name)
        prefix = parent_prefix


def unlisted(index: dict[str, Listing], keys: Iterable[str]) -> set[str]:
    """The ``keys`` the whole store's ``index`` shows absent: no file of that name in its
    directory, or no such directory. What a get of each would find missing, known without
    one (on S3 a never-written chunk cost a request that answered 404)."""
    out = set()
    for key in keys:
        cut = key.rfind("/") + 1
        listing = index.get(key[:cut])
        if listing is None or key[cut:] not in listing.keys:
            out.add(key)
    return out
