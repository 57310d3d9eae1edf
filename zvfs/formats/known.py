"""What one discovery read, so that the next reads again only what changed.

A discovery once the metadata TTL had passed read every node's metadata again: on S3 a
GET a key (10,002 for a store of 10,000 arrays, every TTL the mount was used, 20 ms and
more each). A key's info says whether it changed without reading it, where the info is
cheap to have: a listing tells it (S3's ETag; the root listing every discovery makes), or
a stat does (a local store: a directory, a zip). A node whose metadata keys all kept their
info (absent ones still absent) is the node it was, and is not read again.

The info of a key is taken *before* the key is read, so a key rewritten meanwhile is read
again next time, never taken as unchanged. An info that names no version (a local file's
size and mtime) is trusted only for a key last modified a while before it was taken: a
rewrite of the same size within the file system's clock tick would keep both (git's
"racily clean" entries).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..stores.base import KeyInfo, KeyNotFound, Store, StoreError
from .probe import DESCRIBING_NAMES


class _Unknown:
    """What a key's info is when nothing cheap tells it (then the key is read, as before)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()
#: a key's info as a discovery saw it before reading the key; None: the key is absent
Print = KeyInfo | None | _Unknown

#: nanoseconds a key's size and mtime may stay the same across a rewrite: an info taken
#: within them of the key's mtime is not trusted (the key is read again at the next discovery)
RACY_NS = 2_000_000_000

#: keys a flat listing of a remote store may run to, per node the last discovery found, to
#: tell which metadata keys changed: a page of 1,000 keys costs what one GET does, so it
#: costs a quarter of the GETs it saves at most; past it the store is read as before
FLAT_KEYS_PER_NODE = 250
#: and at least (a first discovery knows no nodes yet): the 10 pages the mount's scan reads
FLAT_KEYS_MIN = 10_000
#: keys listed before their share of metadata keys is judged (S3's first page): a listing
#: that has met more than FLAT_KEYS_PER_NODE keys a metadata key by then (chunk grids) is
#: given up there, not at its limit (a root of 2,000 arrays of 1,000 chunks each would run
#: to 500 pages, one after the other, before the GETs it was to save)
FLAT_SAMPLE = 1_000


def trusted(info: Print, now_ns: int) -> bool:
    """Whether ``info``, taken at ``now_ns``, can tell the next discovery that its key did not
    change: a version (an ETag) can, an absence can, a size and mtime only of a key that was
    not modified just before (see RACY_NS)."""
    if info is None:
        return True
    if isinstance(info, _Unknown):
        return False
    return info.version is not None or info.mtime_ns < now_ns - RACY_NS


def same(old: Print, new: Print) -> bool:
    """Whether ``new`` says the key holds what it held at ``old``: the same version where
    both name one, else the same size and mtime (compared as values only)."""
    if isinstance(old, _Unknown) or isinstance(new, _Unknown):
        return False
    if old is None or new is None:
        return old is new
    if old.version is not None and new.version is not None:
        return old.version == new.version and old.size == new.size
    return old == new


@dataclass
class Known:
    """What a discovery read: ``nodes``, node path -> (the node, its metadata keys' names
    with their info as seen before they were read, in the order read); ``roots``, the
    root's consolidated metadata documents by name -> (info, what they gave: a hierarchy,
    consolidated or not).

    Read, never changed, by the discovery given it (several may run at once); each makes a
    Known of its own."""

    nodes: dict[str, tuple[Any, tuple[tuple[str, Print], ...]]] = field(default_factory=dict)
    #: (a hierarchy is formats.api.Hierarchy: that module lies above this one, as a node
    #: is of formats.api or formats.meta)
    roots: dict[str, tuple[Print, Any]] = field(default_factory=dict)
    #: a flat listing was given up (it does not pay for this store): not tried again
    flat_refused: bool = False

    def forget(self, path: str) -> None:
        """The node at ``path`` was written through the mount: read it again, whatever its
        keys' infos say (a copy that kept size and mtime: cp -p, rsync -a)."""
        self.nodes.pop(path, None)
        if not path:
            self.roots.clear()


class Prints:
    """Where one discovery takes its keys' infos: a flat listing of the store's metadata
    keys, or for a local store a stat of each (``info``); else nothing (UNKNOWN)."""

    def __init__(self, store: Store, listed: Mapping[str, KeyInfo] | None) -> None:
        self._store = store
        self._listed = listed

    def of(self, key: str) -> Print:
        if self._listed is not None:
            return self._listed.get(key)
        if not self._store.local:
            return UNKNOWN
        try:
            return self._store.info(key)
        except KeyNotFound:
            return None
        except Exception:  # noqa: BLE001 - the read that follows reports what is wrong
            return UNKNOWN


def flat_infos(store: Store, limit: int) -> tuple[dict[str, KeyInfo] | None, bool]:
    """The infos of every metadata key of ``store`` from one flat listing, or None: when the
    store has more than ``limit`` keys, or more than FLAT_KEYS_PER_NODE a metadata key among
    its first FLAT_SAMPLE (the listing is given up there: True), or the listing failed (the
    discovery then reads each key, and reports; False: it may be tried again)."""
    out: dict[str, KeyInfo] = {}
    seen = 0
    listing: Iterator[tuple[str, KeyInfo]] = iter(())
    try:
        listing = store.list_tree("")
        for key, info in listing:
            seen += 1
            if key.rpartition("/")[2] in DESCRIBING_NAMES:
                out[key] = info
            if seen > limit or seen >= FLAT_SAMPLE and seen > FLAT_KEYS_PER_NODE * (len(out) + 1):
                return None, True
    except StoreError:
        return None, False
    finally:
        close = getattr(listing, "close", None)
        if close is not None:
            close()
    return out, False


class Look:
    """One node's metadata keys' infos, each taken (once) before the key is read, and
    noted in the order asked: ``noted`` is what the next discovery compares."""

    __slots__ = ("_prints", "_listing", "_path", "_memo", "noted")

    def __init__(self, prints: Prints | None, path: str, listing: Mapping[str, KeyInfo] | None) -> None:
        self._prints = prints
        self._listing = listing
        self._path = path
        self._memo: dict[str, Print] = {}
        self.noted: list[tuple[str, Print]] = []

    def info(self, name: str) -> Print:
        """The info of the node's key ``name`` (None: absent; UNKNOWN: nothing tells)."""
        if name in self._memo:
            got = self._memo[name]
        else:
            if self._listing is not None:
                got = self._listing.get(name)
            elif self._prints is not None:
                got = self._prints.of(f"{self._path}/{name}" if self._path else name)
            else:
                got = UNKNOWN
            self._memo[name] = got
        self.noted.append((name, got if trusted(got, time.time_ns()) else UNKNOWN))
        return got

    def surprise(self, name: str) -> None:
        """The key ``name`` read otherwise than its info said (gone, or too big): not
        trusted next time."""
        self.noted = [(n, UNKNOWN if n == name else p) for n, p in self.noted]

    def unchanged(self, noted: tuple[tuple[str, Print], ...]) -> bool:
        """Whether every key of ``noted`` (a former discovery's) still has its info."""
        self.noted = []
        for name, old in noted:
            if not same(old, self.info(name)):
                return False
        return True
