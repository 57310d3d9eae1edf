"""The abstract key/value store of the Zarr file-system store spec.

A store knows keys and bytes, never Zarr. Every method is *blocking*: callers
on the trio thread must go through :func:`zvfs.workers.run_blocking`, which hops to a
worker thread once per call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field


class StoreError(Exception):
    """A store operation failed for a reason other than a missing key (I/O, network, corruption)."""


class KeyNotFound(StoreError, KeyError):
    """The key does not exist in the store."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep messages readable
        return str(self.args[0]) if self.args else "key not found"


class SourceError(StoreError):
    """The source cannot be opened at all (missing path, missing bucket, refused credentials).

    Its message is shown to the user as is, so it says what is wrong and how to fix it.
    """


class SourceUnavailable(SourceError):
    """The source could not be reached now (endpoint down, server errors) but may come back:
    unlike a plain SourceError it is not a configuration mistake, so a service may retry."""


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """Size and modification time of one key; mtime is seconds since the epoch."""

    size: int
    mtime: float


@dataclass(slots=True)
class Listing:
    """One level of the key hierarchy below a prefix.

    ``keys`` maps child names (no slash) that are keys to their info; ``prefixes``
    holds child names that have keys below them. A name may appear in both: the
    fs layer decides which wins.
    """

    keys: dict[str, KeyInfo] = field(default_factory=dict)
    prefixes: set[str] = field(default_factory=set)


class Store(ABC):
    """Read-only key/value store. Keys use '/' as separator and never start with '/'."""

    #: short human name of the source, used in fsname= and log lines
    description: str = ""
    #: preferred read unit in bytes for raw files: 0 reads exactly what is asked (local
    #: files); remote or compressed stores set a block size so one request serves many reads
    block_size: int = 0
    #: True when one flat listing of many keys is much cheaper than a listing per
    #: directory (S3: 1,000 keys per request whatever the nesting)
    flat_listing: bool = False

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Whole value of ``key``; raises KeyNotFound."""

    def get_at_most(self, key: str, limit: int) -> bytes:
        """Whole value of ``key`` if it holds at most ``limit`` bytes, else StoreError.

        For callers that know how big a value can legitimately be (a chunk): stores
        that know sizes cheaply (zip, directory) refuse before reading anything, so
        a zip member that inflates to gigabytes is never produced. The default reads
        and then checks.
        """
        data = self.get(key)
        if len(data) > limit:
            raise StoreError(f"{key}: holds {len(data)} bytes, more than the {limit} it may")
        return data

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from ``start`` (fewer at the end); raises KeyNotFound."""

    @abstractmethod
    def info(self, key: str) -> KeyInfo:
        """Size and mtime of ``key``; raises KeyNotFound."""

    @abstractmethod
    def list_dir(self, prefix: str) -> Listing:
        """Children of ``prefix`` ('' for the root, else ending in '/')."""

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Every key that starts with ``prefix`` (recursive). Default walks list_dir."""
        listing = self.list_dir(prefix)
        for name in sorted(listing.keys):
            yield prefix + name
        for name in sorted(listing.prefixes):
            yield from self.list_prefix(prefix + name + "/")

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        """Every key below ``prefix`` with its info, unfiltered. Default walks list_dir."""
        listing = self.list_dir(prefix)
        for name in sorted(listing.keys):
            yield prefix + name, listing.keys[name]
        for name in sorted(listing.prefixes):
            yield from self.list_tree(prefix + name + "/")

    def exists(self, key: str) -> bool:
        try:
            self.info(key)
        except KeyNotFound:
            return False
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles; the store is not used afterwards."""
