"""What every view of one mount shares: the store, the caches, the options."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from zvfs.cache import Cache
from zvfs.stats import Counters, counters
from zvfs.stores.base import Store

log = logging.getLogger("zvfs")


@dataclass
class MountContext:
    """Built once by the CLI and handed to the view builders.

    ``metadata_ttl`` is seconds (None means indefinite: the data never changes).
    """

    store: Store
    metadata_ttl: float | None = 60.0
    cache_size: int = 512 << 20
    decoded: str = "hidden"  # hidden | visible | off
    mount_time: float = field(default_factory=time.time)
    #: what the user mounted and with which options (stats.json and zvfs status show them)
    source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    #: node path -> newest mtime of its metadata keys, from the scan at mount (formats.probe)
    metadata_mtimes: dict[str, float] = field(default_factory=dict)
    counters: Counters = counters
    listings: Cache = field(init=False)
    chunks: Cache = field(init=False)
    #: chunks whose bytes could not be decoded: (message, cause), for the metadata TTL
    failures: Cache = field(init=False)
    _logged: set[str] = field(default_factory=set, init=False)
    #: set by the daemon while serving; background prefetches run in it
    nursery: trio.Nursery | None = field(default=None, init=False)
    #: cache keys loaded ahead of any reader, to count prefetch hits
    prefetched: set[object] = field(default_factory=set, init=False)
    #: per raw directory (or '' for the whole tree): a reader's progress (views.raw.FileWalk)
    walks: dict[str, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._stable_time = max(self.metadata_mtimes.values(), default=self.mount_time)
        # listings are small; bound them by entry count via sizeof=1
        self.listings = Cache(max_bytes=100_000, ttl=self.metadata_ttl, sizeof=lambda _v: 1)
        # 256 bytes of bookkeeping per entry: a million 1-byte chunks must still count
        self.chunks = Cache(max_bytes=self.cache_size, overhead=256)
        self.failures = Cache(max_bytes=10_000, ttl=self.metadata_ttl, sizeof=lambda _v: 1)

    @property
    def stable_time(self) -> float:
        """The mtime of a directory or file derived from the store as a whole: the newest
        metadata mtime, so it survives a remount of unchanged data (the mount time otherwise)."""
        return self._stable_time

    def node_mtime(self, path: str) -> float:
        """The mtime of the views of the array or group at ``path``: its metadata's."""
        return self.metadata_mtimes.get(path.strip("/"), self.stable_time)

    @property
    def immutable(self) -> bool:
        """True when the store is declared immutable (``metadata_ttl=indefinite``)."""
        return self.metadata_ttl is None

    def background(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` in the background, swallowing its errors (a prefetch that fails
        is retried by the read that needs it, which then reports the error)."""
        if self.nursery is None:
            return

        async def quiet() -> None:
            try:
                await fn(*args)
            except Exception as exc:  # noqa: BLE001
                log.debug("prefetch failed: %s", exc)

        self.nursery.start_soon(quiet)

    def warn_once(self, tag: str, message: str) -> None:
        """Log ``message`` the first time ``tag`` is seen, so a bad key is one line, not one per lookup."""
        if tag not in self._logged:
            self._logged.add(tag)
            log.warning("%s", message)
